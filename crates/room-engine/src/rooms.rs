//! Rooms: the storage backend and the open room handles, each behind its own lock, with the
//! locks that span rooms (project leases, the wake queue flush, creation). A handle (`room`)
//! owns one shard's log, index and blobs and the descriptors they hold; this component owns
//! which handles are open. It keeps at most `open_max` of them (the least recently used beyond
//! that are closed once nobody holds them), so that a state dir's rooms are not bounded by the
//! process's descriptor limit; a room is opened again, and caught up, on its next use.

use crate::event::Binding;
use crate::room::RoomHandle;
use room_core::{Code, Refusal};
use room_store::Backend;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

pub type Handle = Arc<Mutex<RoomHandle>>;

struct Open {
    handle: Handle,
    /// The room's binding, immutable: kept here so that a call learns it without waiting on
    /// the room's lock.
    binding: Binding,
    /// When it was last handed out, in `tick`s: the least recent is closed first.
    used: u64,
}

#[derive(Default)]
struct Map {
    open: BTreeMap<String, Open>,
    tick: u64,
    /// Rooms that could not be opened, and why: refused until a restart opens them.
    unusable: BTreeMap<String, String>,
}

pub struct Rooms {
    /// Where everything durable lives (`room_store::Backend`).
    pub(crate) store: Arc<dyn Backend>,
    /// Most handles kept open (each holds a few descriptors).
    open_max: usize,
    /// Open rooms by name, in name order: every walk over them (flushes, sweeps) is deterministic.
    map: Mutex<Map>,
    /// Held while a room is opened: two handles of one room must never exist at once.
    opening: Mutex<()>,
    /// Held from a scoped claim's `exclusive` check through its commit: leases span the rooms
    /// of a project, and each room lock covers only its own room. Taken before a room lock.
    /// It holds the newest lease generation this process issued (fencing numbers only grow).
    lease_lock: Mutex<u64>,
    /// Held for the whole of a `flush_wakes`, taken before any room lock. Two flushes at once
    /// could let the later one move a room's wakes mark past permits the earlier one took but
    /// has not yet written (and may fail to write).
    wakes_flush_lock: Mutex<()>,
    /// Held for the whole of a room's creation: its shard, its control row and its handle
    /// appear together, or none of them.
    creating: Mutex<()>,
}

impl Rooms {
    pub(crate) fn new(store: Arc<dyn Backend>, open_max: usize) -> Rooms {
        assert!(open_max >= 1, "at least one room can be open");
        Rooms {
            store,
            open_max,
            map: Mutex::new(Map::default()),
            opening: Mutex::new(()),
            lease_lock: Mutex::new(0),
            wakes_flush_lock: Mutex::new(()),
            creating: Mutex::new(()),
        }
    }

    fn map(&self) -> MutexGuard<'_, Map> {
        self.map
            .lock()
            .expect("rooms map lock is never poisoned: no panics while held")
    }

    /// The open handle of `name` and its binding, if it is open (and marked as just used).
    pub(crate) fn cached_bound(&self, name: &str) -> Option<(Handle, Binding)> {
        let mut m = self.map();
        m.tick += 1;
        let tick = m.tick;
        m.open.get_mut(name).map(|o| {
            o.used = tick;
            (o.handle.clone(), o.binding.clone())
        })
    }

    /// Why `name` could not be opened, if it could not.
    pub(crate) fn unusable(&self, name: &str) -> Option<String> {
        self.map().unusable.get(name).cloned()
    }

    pub(crate) fn mark_unusable(&self, name: &str, why: String) {
        self.map().unusable.insert(name.to_string(), why);
    }

    /// Every room that could not be opened, with why.
    pub(crate) fn unusable_all(&self) -> BTreeMap<String, String> {
        self.map().unusable.clone()
    }

    /// Keep a newly opened room; its handle, and the handles now over the bound that nobody
    /// holds (the caller closes them). A room already open under that name is a bug.
    pub(crate) fn insert(&self, name: &str, room: RoomHandle) -> (Handle, Vec<Handle>) {
        let binding = room.binding.clone();
        let h = Arc::new(Mutex::new(room));
        let mut m = self.map();
        m.tick += 1;
        let used = m.tick;
        let replaced = m.open.insert(
            name.to_string(),
            Open {
                handle: h.clone(),
                binding,
                used,
            },
        );
        assert!(replaced.is_none(), "room {name} was opened twice");
        let evicted = evict(&mut m.open, self.open_max);
        (h, evicted)
    }

    /// How many rooms are open now, and the most that may be.
    pub(crate) fn open_count(&self) -> (usize, usize) {
        (self.map().open.len(), self.open_max)
    }

    /// Every open room, in name order (a stable order: walks over rooms replay from a seed).
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.map().open.values().map(|o| o.handle.clone()).collect()
    }

    /// Every open room with its name, in name order.
    pub(crate) fn named(&self) -> Vec<(String, Handle)> {
        self.map()
            .open
            .iter()
            .map(|(k, o)| (k.clone(), o.handle.clone()))
            .collect()
    }

    /// Close `name` if nobody holds it (its handle, to close); `None` when it is held or not open.
    pub(crate) fn take_if_idle(&self, name: &str) -> Option<Handle> {
        let mut m = self.map();
        let idle = m
            .open
            .get(name)
            .is_some_and(|o| Arc::strong_count(&o.handle) == 1);
        if idle {
            m.open.remove(name).map(|o| o.handle)
        } else {
            None
        }
    }

    /// Close every room (a simulated crash): the handles, in name order.
    pub(crate) fn take_all(&self) -> Vec<Handle> {
        std::mem::take(&mut self.map().open)
            .into_values()
            .map(|o| o.handle)
            .collect()
    }

    pub(crate) fn not_found(name: &str) -> Refusal {
        Refusal::new(Code::RoomNotFound, format!("no room named {name:?}"))
            .hint("run `room list` to see rooms")
    }

    pub(crate) fn opening_lock(&self) -> MutexGuard<'_, ()> {
        self.opening
            .lock()
            .expect("rooms opening lock is never poisoned: no panics while held")
    }

    pub(crate) fn lease_lock(&self) -> MutexGuard<'_, u64> {
        self.lease_lock
            .lock()
            .expect("lease lock is never poisoned: no panics while held")
    }

    pub(crate) fn wakes_flush_lock(&self) -> MutexGuard<'_, ()> {
        self.wakes_flush_lock
            .lock()
            .expect("wakes flush lock is never poisoned: no panics while held")
    }

    pub(crate) fn creation_lock(&self) -> MutexGuard<'_, ()> {
        self.creating
            .lock()
            .expect("room creation lock is never poisoned: no panics while held")
    }
}

/// Take the least recently used handles beyond `max` that only the map holds: a handle
/// somebody holds stays open (closing it would let a second handle of that room open).
fn evict(open: &mut BTreeMap<String, Open>, max: usize) -> Vec<Handle> {
    if open.len() <= max {
        return Vec::new();
    }
    // a halted room stays open: its refusal holds until the restart that catches it up
    let mut idle: Vec<(u64, String)> = open
        .iter()
        .filter(|(_, o)| Arc::strong_count(&o.handle) == 1)
        .filter(|(_, o)| o.handle.try_lock().is_ok_and(|r| r.read_only.is_none()))
        .map(|(k, o)| (o.used, k.clone()))
        .collect();
    idle.sort();
    let over = open.len() - max;
    idle.into_iter()
        .take(over)
        .filter_map(|(_, k)| open.remove(&k).map(|o| o.handle))
        .collect()
}

/// What one open room costs in descriptors: its log, its index database with WAL and
/// shared-memory files, and one spare for a blob being written.
pub const DESCRIPTORS_PER_ROOM: u64 = 5;

/// Descriptors kept for everything that is not a room: listeners, connections, control.db.
pub const DESCRIPTORS_RESERVED: u64 = 256;

/// How many rooms can be open at once under a soft descriptor limit of `nofile` (at least 1):
/// half of what is left past the reserve (the daemon's listeners take the other half).
pub fn open_max_for(nofile: u64) -> usize {
    (nofile.saturating_sub(DESCRIPTORS_RESERVED) / 2 / DESCRIPTORS_PER_ROOM).max(1) as usize
}

/// Whether `room` was refused as unusable or not found, as a refusal.
pub(crate) fn unusable_refusal(name: &str, why: &str) -> Refusal {
    Refusal::storage(format!("room {name} could not be opened: {why}"))
        .hint("run `room verify` on the state dir; a restart tries the room again")
}
