//! The authority machine. Every decision of who may read, act and receive is made here, and
//! only here: the daemon decodes requests and encodes answers but decides nothing. The engine
//! takes its clock, entropy and file system as traits, never reads the wall clock or spawns a
//! thread, and knows nothing of HTTP, MCP or tokio, so it can run inside a seeded simulation.

pub mod acceptance;
pub mod audit;
pub mod authority;
pub mod blackboard;
pub mod collab;
pub mod completion;
pub mod compose;
pub mod console;
pub mod delegation;
pub mod dispatch;
pub mod event;
pub mod evidence;
pub mod fold;
pub mod invariants;
pub mod ledger;
pub mod lifecycle;
pub mod lineage;
pub mod planted;
pub mod policy;
pub mod principal;
pub mod proposal;
pub mod quota;
pub mod receipt;
pub mod room;
pub mod rooms;
pub mod routes;
pub mod search;
pub mod sessions;
pub mod source;
pub mod sync;
pub mod take;
pub mod territory;
pub mod turnstile;
pub mod verbs;
pub mod visibility;
pub mod wakes;

use authority::Authority;
use room::RoomHandle;
use room_core::{Clock, Code, Entropy, Fs, Refusal};
use room_store::statedir::StateDir;
use room_store::{Backend, ControlStore};
use rooms::Rooms;
use std::sync::{Arc, Mutex, MutexGuard};

pub use policy::Policy;

/// Proof that the caller of an owner operation is the owner. Only `Engine::owner` makes one, so
/// every owner operation's authority is decided here, not by whichever route reached it.
#[derive(Debug)]
pub struct Owner {
    _private: (),
}
pub use principal::{Caller, CredentialVia, Evidence, Principal};

/// No process has this uid (`(uid_t) -1`): the default owner uid, so that an engine whose
/// configuration names no owner grants no real Unix peer owner standing.
pub const NO_UID: u32 = u32::MAX;

/// Largest text of one contribution by default (`EngineConfig::text_bytes_max`).
pub const TEXT_BYTES_MAX: usize = 1 << 20;

/// Limits on what one call may carry. Units are in the names.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Largest text of one contribution.
    pub text_bytes_max: usize,
    /// Sync page ceiling, envelope included.
    pub page_bytes_max: usize,
    /// Size of one fragment of an oversized event.
    pub chunk_bytes: usize,
    /// Most recipients one send may address.
    pub recipients_max: usize,
    /// Most explicit causal parents or evidence handles one turn may name.
    pub parents_max: usize,
    /// The owner's uid: a Unix socket peer with this uid has owner standing. The daemon sets
    /// it to its own uid at start; the engine makes no OS call to learn it.
    pub owner_uid: u32,
    /// Most rooms open at once (each holds `rooms::DESCRIPTORS_PER_ROOM` descriptors); the
    /// daemon sets it from its descriptor limit (`rooms::open_max_for`).
    pub rooms_open_max: usize,
    /// Directories of the owner's Room configuration (the one holding `bootstrap.toml`): never
    /// project territory, neither inside nor around them. The daemon sets them; the engine
    /// reads no environment variable to learn them.
    pub owner_config_dirs: Vec<std::path::PathBuf>,
    /// Files that run Room (the `room` binary): no task scope may cover one. The daemon sets
    /// them; the engine asks no OS which executable it is.
    pub protected_paths: Vec<std::path::PathBuf>,
    /// A planted bug for the simulator's proof that its invariant oracle bites: the five
    /// runtime invariants are not checked. Never set outside `room-sim`.
    pub skip_invariants: bool,
    /// A planted bug for the simulator's authority oracle: `done` does not compare the
    /// authority keys its claim pinned. Never set outside `room-sim`.
    pub skip_authority_pins: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            text_bytes_max: TEXT_BYTES_MAX,
            page_bytes_max: 24 * 1024,
            chunk_bytes: 1024,
            recipients_max: 64,
            parents_max: 16,
            owner_uid: NO_UID,
            rooms_open_max: rooms::open_max_for(1024),
            owner_config_dirs: Vec::new(),
            protected_paths: Vec::new(),
            skip_invariants: false,
            skip_authority_pins: false,
        }
    }
}

/// What a simulated crash may still take (see `Engine::crash_for_simulation`).
#[derive(Debug, Default)]
pub struct CrashState {
    /// Each journal: path, durable length, current length.
    pub journals: Vec<(std::path::PathBuf, u64, u64)>,
}

/// The engine's windows on the world.
#[derive(Clone)]
pub struct Env {
    pub clock: Arc<dyn Clock>,
    pub entropy: Arc<dyn Entropy>,
    pub fs: Arc<dyn Fs>,
    /// Runs acceptance `command` checks; `room_core::env::NoRunner` where none may run.
    pub runner: Arc<dyn room_core::Runner>,
}

/// The facade over the engine's parts. Each part owns its state: `authority` (principals,
/// tiers, policy, grants, the control store), `rooms` (the storage backend, open room handles
/// and their locks). The gate (`sync`), the turns (`verbs`), the invariants and the wake
/// permits hold no state of their own: theirs lives in the room handles they lock. A later
/// floor (dispatch, cancellation, collaborations) arrives as a part beside these.
pub struct Engine {
    pub(crate) state: StateDir,
    pub(crate) env: Env,
    pub(crate) config: EngineConfig,
    pub(crate) authority: Authority,
    pub(crate) rooms: Rooms,
    /// Why each queued permit the last dispatch pass looked at waits (not persisted).
    pub(crate) deferrals: dispatch::Deferrals,
    /// Held by a session's take from its check that its agent is not busy to its launch: two
    /// sessions of one agent never hold two launches at once.
    pub(crate) takes: std::sync::Mutex<()>,
    /// The tasks whose acceptance is being evaluated now (one evaluation per task, and at
    /// most `acceptance::EVALUATIONS_MAX` in the daemon).
    pub(crate) evaluations: acceptance::Evaluations,
    /// Tickets of turns waiting in a room's turnstile, and their wake-ups.
    pub(crate) turn_waits: turnstile::TurnWaits,
    /// The next turnstile ticket: counts up from a random start drawn at construction, so
    /// that tickets are unique across the daemon's runs (`turnstile::first_ticket`).
    pub(crate) tickets: std::sync::atomic::AtomicU64,
    /// The owner's browser sessions (in memory only).
    pub(crate) consoles: console::Consoles,
    /// Journal appends this engine has made (see [`Engine::commits`]).
    pub(crate) commits: std::sync::atomic::AtomicU64,
}

pub type Outcome<T> = Result<T, Refusal>;

pub(crate) fn store_err(e: room_store::StoreError) -> Refusal {
    Refusal::storage(e)
}

impl Engine {
    /// Open the engine over a validated state dir and its storage: the control store, then
    /// every room (journal reconciliation, index catch-up, completion of an interrupted second
    /// flush).
    pub fn open(
        state: StateDir,
        env: Env,
        store: Arc<dyn Backend>,
        config: EngineConfig,
    ) -> Result<Engine, room_store::StoreError> {
        let control = store.open_control()?;
        let engine = Engine {
            authority: Authority::new(env.clone(), state.clone(), control),
            rooms: Rooms::new(store, config.rooms_open_max),
            deferrals: dispatch::Deferrals::default(),
            takes: std::sync::Mutex::new(()),
            evaluations: Default::default(),
            turn_waits: Default::default(),
            tickets: std::sync::atomic::AtomicU64::new(turnstile::first_ticket(&*env.entropy)),
            consoles: Default::default(),
            commits: Default::default(),
            state,
            env,
            config,
        };
        let rows = engine.control().rooms()?;
        let known = rows.iter().map(|r| r.graph_id.clone()).collect();
        for stray in engine.rooms.store.sweep_strays(&known, engine.now_ms())? {
            tracing::warn!("set aside {stray}: a room creation that never completed left it");
        }
        let requeue = engine.control().wakes_requeue_pending()?;
        let mut requeued_all = true;
        for row in rows.iter().filter(|r| r.archived_ms.is_none()) {
            // every room is opened once at start, so that a crash's leftovers (a turn's
            // flush 2, wake permits) are completed now, not at the room's next use
            match RoomHandle::open(&engine, row) {
                Ok(mut room) => {
                    if requeue && !room.requeue_at_start(&engine) {
                        requeued_all = false;
                    }
                    engine.keep_open(&row.name, room);
                }
                Err(e) => {
                    tracing::error!(room = %row.name, "room cannot be opened, the others go on: {e}");
                    engine.rooms.mark_unusable(&row.name, e.to_string());
                    requeued_all = false;
                }
            }
        }
        if requeue && requeued_all {
            engine.control().wakes_requeue_done()?;
        }
        Ok(engine)
    }

    pub fn state(&self) -> &StateDir {
        &self.state
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub(crate) fn control(&self) -> MutexGuard<'_, Box<dyn ControlStore>> {
        self.authority.control()
    }

    pub fn now_ms(&self) -> u64 {
        self.env.clock.now_ms()
    }

    /// Every open room, in name order.
    pub(crate) fn room_handles(&self) -> Vec<rooms::Handle> {
        self.rooms.handles()
    }

    /// The handle of `name`, opened (and caught up from its log) if it is not open now.
    pub(crate) fn room_handle(&self, name: &str) -> Outcome<rooms::Handle> {
        self.room_handle_bound(name).map(|(h, _)| h)
    }

    /// [`Engine::room_handle`], with the room's (immutable) binding.
    pub(crate) fn room_handle_bound(&self, name: &str) -> Outcome<(rooms::Handle, event::Binding)> {
        if let Some(hb) = self.rooms.cached_bound(name)
            && !moved_under(&hb.0)
        {
            return Ok(hb);
        }
        let mut tries = 0;
        let _one_opening = loop {
            let opening = self.rooms.opening_lock();
            let Some(hb) = self.rooms.cached_bound(name) else {
                break opening;
            };
            if !moved_under(&hb.0) {
                return Ok(hb);
            }
            drop(hb);
            // another writer moved it: read anew once nobody holds it (a flush holds every
            // room a moment), waiting a little outside the opening lock
            if let Some(h) = self.rooms.take_if_idle(name) {
                self.close_room_handle(&h);
                break opening;
            }
            drop(opening);
            tries += 1;
            if tries >= MOVED_WAIT_TRIES {
                return Err(Refusal::new(
                    Code::RoomSyncConcurrentArrival,
                    format!("room {name} is being read anew after another writer's append"),
                )
                .detail(serde_json::json!({"room": name, "moved_by": "another writer"}))
                .hint("sync the room and try again"));
            }
            // the engine never waits on the wall clock: it lets the holder run
            std::thread::yield_now();
        };
        if let Some(why) = self.rooms.unusable(name) {
            return Err(rooms::unusable_refusal(name, &why));
        }
        let row = self
            .control()
            .room(name)
            .map_err(store_err)?
            .ok_or_else(|| Rooms::not_found(name))?;
        // a failure here may pass (descriptors run out, a disk hiccups): the next use tries again
        let room = RoomHandle::open(self, &row)
            .map_err(|e| rooms::unusable_refusal(name, &e.to_string()))?;
        let binding = room.binding.clone();
        Ok((self.keep_open(name, room), binding))
    }

    /// Keep a room open, closing the least recently used beyond the bound.
    pub(crate) fn keep_open(&self, name: &str, room: RoomHandle) -> rooms::Handle {
        let (h, evicted) = self.rooms.insert(name, room);
        for e in evicted {
            self.close_room_handle(&e);
        }
        h
    }

    /// Close a room nobody holds: its permits sealed since the last flush go to the queue, its
    /// pending index rows commit (also as the index drops). Nothing is lost if this fails: the
    /// next open re-derives both from the log. No flush can see the handle any more (it left
    /// the map while nobody held it), so this needs no wake-flush lock.
    pub(crate) fn close_room_handle(&self, h: &rooms::Handle) {
        let mut room = lock_room(h);
        // counts of suppressed rejections live in the handle and go with it (as at a restart):
        // closing runs under the opening lock, where no commit may run
        if !room.violations_suppressed.is_empty() {
            tracing::warn!(room = %room.name, "closing: {} counts of suppressed rejections are dropped",
                room.violations_suppressed.len());
        }
        if room.read_only.is_none()
            && let Some((tip, rows)) = room.take_wakes_due()
        {
            let written = self
                .control()
                .insert_wakes(&rows)
                .and_then(|()| room.wakes_queued(tip));
            if let Err(e) = written {
                tracing::warn!(room = %room.name, "closing: wake permits left for the next open: {e}");
            }
        }
        match room.index.flush() {
            // closed as at a clean stop: its next open verifies only what follows
            Ok(()) => room.mark_closed_clean(),
            Err(e) => {
                tracing::warn!(room = %room.name, "closing: index rows left for the next open: {e}")
            }
        }
    }

    /// Owner standing for `caller`, decided from what its transport observed: a Unix socket
    /// peer running as the configured owner uid (`EngineConfig::owner_uid`) has it, a peer of
    /// any other uid does not; an agent does not, whatever its tier (its credential is still
    /// checked first, so a bad token is reported as such).
    pub fn owner(&self, caller: &Caller) -> Outcome<Owner> {
        let refused = || {
            Refusal::new(
                Code::OwnerRequired,
                "this operation is for the owner console only",
            )
        };
        match caller {
            Caller::Local(Evidence::UnixPeer { uid, .. }) => {
                if *uid == self.config.owner_uid {
                    Ok(Owner { _private: () })
                } else {
                    Err(refused())
                }
            }
            Caller::Local(Evidence::Worker { .. }) => Err(refused()),
            Caller::Agent(a) => {
                self.authenticate(&a.token)?;
                Err(refused())
            }
        }
    }

    /// Where a launch's one-launch credential is presented: it works only through its own
    /// launch's broker (a process of the launch's job running a pinned program; the broker
    /// checks both) or inside the daemon (an API worker's tool calls). Presented anywhere
    /// else while its launch runs (the owner's socket, HTTP), it is a credential that left
    /// its job: `launch_credential_outside_broker`, whoever holds it. A credential that no
    /// longer acts, and every other credential, is left to authentication.
    pub fn credential_admits(&self, token: &str, via: CredentialVia<'_>) -> Outcome<()> {
        match via {
            CredentialVia::Broker(launch) => self.broker_admits(launch, token),
            CredentialVia::Daemon => Ok(()),
            CredentialVia::Elsewhere => {
                // a credential that no longer acts (its launch ended, its task cancelled) gets
                // authentication's own refusal, which says why
                if !token.starts_with(dispatch::WORKER_TOKEN_PREFIX)
                    || self.authenticate(token).is_err()
                {
                    return Ok(());
                }
                let digest = room_core::sha256_hex(token.as_bytes());
                match self.control().launch_by_secret(&digest).map_err(store_err)? {
                    Some(l) if l.state != "ended" => Err(Refusal::new(
                        Code::LaunchCredentialOutsideBroker,
                        format!(
                            "the credential of launch {} works only through its own broker, from inside its job",
                            l.id
                        ),
                    )
                    .detail(serde_json::json!({"launch": l.id, "agent": l.agent}))
                    .hint("a worker reaches Room through the ROOM_SOCKET its launch gave it (room mcp, room api)")),
                    _ => Ok(()),
                }
            }
        }
    }

    /// A launch's broker admits its own launch's credential only, and only while the launch
    /// runs: a worker cannot act under any other identity it may have come by.
    pub fn broker_admits(&self, launch: &str, token: &str) -> Outcome<()> {
        let l = self.control().launch(launch).map_err(store_err)?;
        let own = l.is_some_and(|l| {
            l.state != "ended" && l.secret_sha256 == room_core::sha256_hex(token.as_bytes())
        });
        if own {
            return Ok(());
        }
        Err(Refusal::new(
            Code::CredentialInvalid,
            "this broker admits only its own launch's credential",
        ))
    }

    /// Commit every room's pending projection rows. The daemon calls this on a short timer and
    /// at shutdown; correctness does not depend on it (the journal is the commit point), only
    /// how much catching up the next start does.
    /// How many journal appends this engine has made since it opened: a change counter for
    /// callers that act on their own (the collaborations' scheduler), whose writes no request
    /// announces. It promises only to move whenever a room does.
    pub fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn flush_indexes(&self) {
        self.flush_wakes();
        for h in self.room_handles() {
            let mut room = lock_room(&h);
            if let Err(e) = room.index.flush() {
                room.halt(format!("index flush failed: {e}"));
            }
        }
    }

    /// Why this daemon may never write to its store again (another daemon took the shared
    /// database over), if so: the daemon stops.
    pub fn store_fenced(&self) -> Option<String> {
        self.rooms.store.fenced()
    }

    /// Close every halted room nobody holds, where the store says an open catches it up
    /// (`Backend::reopen_heals_halts`): its next use opens it again from the store, as a
    /// restart would, and a store still unreachable refuses that use and the next tries
    /// again. The daemon calls this on its timer. How many rooms were closed.
    pub fn heal_halted_rooms(&self) -> usize {
        if !self.rooms.store.reopen_heals_halts() {
            return 0;
        }
        let halted: Vec<String> = self
            .rooms
            .named()
            .into_iter()
            .filter(|(_, h)| {
                h.try_lock()
                    .is_ok_and(|r| r.halted || r.index.broken().is_some())
            })
            .map(|(name, _)| name)
            .collect();
        let _opening = self.rooms.opening_lock();
        let mut closed = 0;
        for name in halted {
            if let Some(h) = self.rooms.take_if_idle(&name) {
                tracing::warn!(room = %name, "closing a halted room: its next use opens it from the store");
                self.close_room_handle(&h);
                closed += 1;
            }
        }
        closed
    }

    /// Write every room's newly sealed wake permits to the queue in control.db, in one
    /// transaction, then move each room's wakes mark. Permits are derived from the journal, so
    /// until then a crash only means they are re-derived at the next start; a room whose
    /// permits could not be written refuses writes until that restart.
    pub fn flush_wakes(&self) {
        let _one_at_a_time = self.rooms.wakes_flush_lock();
        let mut due = Vec::new();
        let mut rows = Vec::new();
        for h in self.room_handles() {
            let mut room = lock_room(&h);
            // a halted room's permits are re-derived at the next start, never marked queued
            if room.read_only.is_none()
                && let Some((tip, mut pending)) = room.take_wakes_due()
            {
                rows.append(&mut pending);
                due.push((h.clone(), tip));
            }
        }
        if due.is_empty() {
            return;
        }
        let written = self.control().insert_wakes(&rows);
        for (h, tip) in due {
            let mut room = lock_room(&h);
            let queued = match &written {
                Ok(()) => room.wakes_queued(tip).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = queued {
                room.halt(format!(
                    "queueing wake permits failed: {e}; restart to re-derive them"
                ));
            }
        }
    }

    /// Stop as a crash would: pending index rows and wake permits not yet queued are discarded,
    /// nothing is flushed. Returns what a crash could still take, each journal's durable and
    /// current length, so a simulator can decide what survives.
    pub fn crash_for_simulation(self) -> CrashState {
        let handles = self.rooms.take_all();
        let mut out = CrashState::default();
        for h in handles {
            let mut room = lock_room(&h);
            room.index.discard_pending();
            if let Some(j) = &room.journal {
                out.journals
                    .push((j.location(), j.file_synced_len(), j.len_now()));
            }
        }
        // the commit log, and journals whose acknowledged bytes only it holds (closed rooms
        // among them): one entry per file, keeping the least synced and the most written
        let mut files = std::collections::BTreeMap::new();
        for (path, synced, len) in out
            .journals
            .drain(..)
            .chain(self.rooms.store.unsynced_files())
        {
            let e = files.entry(path).or_insert((synced, len));
            *e = (e.0.min(synced), e.1.max(len));
        }
        // a stable order, so that a simulator's draws replay exactly
        out.journals = files.into_iter().map(|(p, (s, l))| (p, s, l)).collect();
        out
    }

    /// The current policy (fleet ceiling, redactor), re-read from config.toml when it changed.
    pub fn policy(&self) -> Policy {
        self.authority.policy()
    }

    /// Open one call's scope on this thread (see [`policy::OneCall`]); the daemon wraps each
    /// request in one.
    pub fn one_call(&self) -> policy::OneCall {
        policy::OneCall::enter()
    }
}

/// The authority part's operations, as the daemon calls them.
impl Engine {
    pub fn enroll(
        &self,
        owner: &Owner,
        agent: &str,
        max_tier: room_core::Tier,
        host: &str,
    ) -> Outcome<principal::Enrolled> {
        self.authority.enroll(owner, agent, max_tier, host)
    }

    pub fn rotate(&self, owner: &Owner, agent: &str) -> Outcome<principal::Enrolled> {
        self.authority.rotate(owner, agent)
    }

    pub fn set_agent_policy(
        &self,
        owner: &Owner,
        agent: &str,
        deny: &[room_core::Verb],
        allow: &[room_core::Verb],
        max_tier: Option<room_core::Tier>,
    ) -> Outcome<serde_json::Value> {
        self.authority
            .set_agent_policy(owner, agent, deny, allow, max_tier)
    }

    pub fn agents_view(&self, owner: &Owner) -> Outcome<serde_json::Value> {
        self.authority.agents_view(owner)
    }

    pub fn authenticate(&self, token: &str) -> Outcome<room_store::control::AgentRow> {
        self.authority.authenticate(token)
    }

    pub fn try_authenticate(&self, token: &str) -> Option<Outcome<room_store::control::AgentRow>> {
        self.authority.try_authenticate(token)
    }

    pub fn authorize(
        &self,
        caller: &principal::AgentCaller,
        verb: room_core::Verb,
    ) -> Outcome<Principal> {
        let mut p = self.authority.authorize(caller, verb)?;
        // a worker acts in its launch's conversation (its replies correlate with the launch),
        // and only until the launch's deadline
        if let Some(l) = self.worker_launch(&caller.token)? {
            p.conversation = dispatch::worker_conversation(&l.id);
        }
        Ok(p)
    }

    pub fn check_actor(&self, p: &Principal, claimed: Option<&str>, field: &str) -> Outcome<()> {
        self.authority.check_actor(p, claimed, field)
    }

    pub fn project_open(
        &self,
        owner: &Owner,
        requested: &str,
        name: Option<&str>,
    ) -> Outcome<serde_json::Value> {
        self.authority
            .project_open(owner, requested, name, &self.config.owner_config_dirs)
    }

    pub fn revalidate_project(&self, project_id: &str) -> Outcome<room_store::control::ProjectRow> {
        self.authority.revalidate_project(project_id)
    }

    pub fn projects_view(&self, owner: &Owner) -> Outcome<serde_json::Value> {
        self.authority.projects_view(owner)
    }
}

pub(crate) fn lock_room(h: &Arc<Mutex<RoomHandle>>) -> MutexGuard<'_, RoomHandle> {
    h.lock()
        .expect("room lock is never poisoned: no panics while held")
}

/// How many times a call asks whether a room another writer moved is idle (yielding in
/// between, outside the opening lock) before it is told to try again: a flush holds every
/// room's handle for a moment. Only a shared database's conflicts reach this.
const MOVED_WAIT_TRIES: u32 = 20_000;

/// Whether another writer moved the room under this handle (its next use reads it anew). A
/// handle someone holds now is left to them: they see its refusal, the next use reopens it.
fn moved_under(h: &Arc<Mutex<RoomHandle>>) -> bool {
    h.try_lock().is_ok_and(|r| r.moved)
}
