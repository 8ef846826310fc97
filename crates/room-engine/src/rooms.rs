//! Rooms: the storage backend and the open room handles, each behind its own lock, with the
//! locks that span rooms (project leases, the wake queue flush). A handle (`room`) owns one
//! shard's log, index and blobs; this component owns which handles exist.

use crate::Outcome;
use crate::room::RoomHandle;
use room_core::{Code, Refusal};
use room_store::Backend;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

pub type Handle = Arc<Mutex<RoomHandle>>;

pub struct Rooms {
    /// Where everything durable lives (`room_store::Backend`).
    pub(crate) store: Arc<dyn Backend>,
    /// Open rooms by name, in name order: every walk over them (flushes, sweeps) is deterministic.
    open: Mutex<BTreeMap<String, Handle>>,
    /// Held from a scoped claim's `exclusive` check through its commit: leases span the rooms
    /// of a project, and each room lock covers only its own room. Taken before a room lock.
    lease_lock: Mutex<()>,
    /// Held for the whole of a `flush_wakes`, taken before any room lock. Two flushes at once
    /// could let the later one move a room's wakes mark past permits the earlier one took but
    /// has not yet written (and may fail to write).
    wakes_flush_lock: Mutex<()>,
}

impl Rooms {
    pub(crate) fn new(store: Arc<dyn Backend>) -> Rooms {
        Rooms {
            store,
            open: Mutex::new(BTreeMap::new()),
            lease_lock: Mutex::new(()),
            wakes_flush_lock: Mutex::new(()),
        }
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<String, Handle>> {
        self.open
            .lock()
            .expect("rooms map lock is never poisoned: no panics while held")
    }

    /// Keep an opened room; its handle.
    pub(crate) fn insert(&self, name: &str, room: RoomHandle) -> Handle {
        let h = Arc::new(Mutex::new(room));
        self.map().insert(name.to_string(), h.clone());
        h
    }

    /// Every open room, in name order (a stable order: walks over rooms replay from a seed).
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.map().values().cloned().collect()
    }

    /// Every open room with its name, in name order.
    pub(crate) fn named(&self) -> Vec<(String, Handle)> {
        self.map()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub(crate) fn handle(&self, name: &str) -> Outcome<Handle> {
        self.map().get(name).cloned().ok_or_else(|| {
            Refusal::new(Code::RoomNotFound, format!("no room named {name:?}"))
                .hint("run `room list` to see rooms")
        })
    }

    /// Close every room (a simulated crash): the handles, in name order.
    pub(crate) fn take_all(&self) -> Vec<Handle> {
        std::mem::take(&mut *self.map()).into_values().collect()
    }

    pub(crate) fn lease_lock(&self) -> MutexGuard<'_, ()> {
        self.lease_lock
            .lock()
            .expect("lease lock is never poisoned: no panics while held")
    }

    pub(crate) fn wakes_flush_lock(&self) -> MutexGuard<'_, ()> {
        self.wakes_flush_lock
            .lock()
            .expect("wakes flush lock is never poisoned: no panics while held")
    }
}
