//! `room serve`: take the state dir's lock, open the engine, listen on the Unix socket (mode
//! 0600, peer uid from SO_PEERCRED) and, when asked, on a loopback TCP port. Engine calls are
//! blocking (they fsync), so each runs on tokio's blocking pool.
//!
//! Nothing outside can freeze it: every listener admits a bounded number of connections, in
//! all and per peer, and when full makes room by closing its oldest connection that is not
//! running a request (a new caller, `/healthz` or the owner console, always gets in); a
//! request's head and body must arrive within bounded times; a failing `accept` backs off;
//! and every repeated log line is rate-limited, carrying the count of what it suppressed.

use crate::dispatch::{self, Transport};
use crate::error::ServerError;
use crate::wire::{REQUEST_BYTES_MAX, Request, Response};
use room_core::{Clock, Code, Entropy, Refusal};
use room_engine::{Engine, EngineConfig, Env, Evidence};
use room_store::fs::RealFs;
use room_store::statedir::{self, StateDir};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How often pending index rows are committed when traffic is light.
const INDEX_FLUSH_MS: u64 = 100;
/// How often the `resolution` sweep looks for claims past their TTL (the engine decides).
const INVARIANT_SWEEP_MS: u64 = 1_000;

/// Engine threads per core by default (see [`engine_threads_default`]).
pub const ENGINE_THREADS_PER_CORE: usize = 4;
/// Most engine threads `room serve --engine-threads` accepts.
pub const ENGINE_THREADS_MAX: usize = 512;

/// Threads that run engine calls (tokio's blocking pool); calls past this many wait for a
/// thread. Engine calls are CPU work plus short fsyncs, so a few threads per core keep the
/// cores and the disk busy; more only add context switches and allocator traffic. Under
/// `room bench swarm` on two cores, 8 threads served about a fifth more calls per second than
/// 64 (and 2 or 4 fewer than 8). A disk with slow fsyncs wants more (`--engine-threads`).
pub fn engine_threads_default() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) * ENGINE_THREADS_PER_CORE
}

/// The daemon's runtime: its threads are named `room-daemon` (the bench reads their CPU time)
/// and at most `engine_threads` of them run engine calls.
pub fn runtime(engine_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name("room-daemon")
        .max_blocking_threads(engine_threads.clamp(1, ENGINE_THREADS_MAX))
        .enable_all()
        .build()
}

/// The system clock, for the daemon only; the engine sees it through `Clock`.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// The OS CSPRNG.
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn fill(&self, buf: &mut [u8]) {
        getrandom::fill(buf).expect("the OS random source is available");
    }
}

/// The real clock, entropy and file system, with an unconfined process runner: for tools and
/// benchmarks that run no daemon. The daemon runs its checks confined (`daemon_env`).
pub fn real_env() -> Env {
    Env {
        clock: Arc::new(SystemClock),
        entropy: Arc::new(OsEntropy),
        fs: Arc::new(RealFs),
        runner: Arc::new(room_exec::ProcessRunner),
    }
}

/// The daemon's environment: acceptance checks and probes run in owned jobs of the daemon's
/// own `jobs`, confined as workers are (`room_exec::check`).
pub fn daemon_env(check: room_exec::check::CheckEnv) -> Env {
    Env {
        runner: Arc::new(room_exec::check::ConfinedRunner::new(check)),
        ..real_env()
    }
}

/// How the daemon's workers and checks run: its owned jobs and what the confinement probe
/// found (none: no namespaces here).
#[derive(Debug, Clone)]
pub struct Workers {
    pub jobs: room_exec::job::Jobs,
    pub confine: Option<room_exec::confine::Support>,
}

/// Make the daemon's jobs (ending what a crashed predecessor left in them) and probe the
/// confinement, before the engine opens: its checks run in both.
fn prepare_workers(state: &StateDir) -> Workers {
    let jobs = worker_jobs(state);
    let scratch = state
        .root
        .join(format!(".confine-probe-{}", std::process::id()));
    // `ROOM_CONFINEMENT=none`: no namespaces even where the machine has them (what a machine
    // without them gets: a route asking for confinement does not start; the test script runs
    // the worker and ACP suites so)
    let probed = match std::env::var("ROOM_CONFINEMENT").as_deref() {
        Ok("none") => Err("ROOM_CONFINEMENT=none".to_string()),
        _ => room_exec::confine::Confinement::probe(&scratch),
    };
    let confine = match probed {
        Ok(support) => {
            match &support.no_pid_namespace {
                None => tracing::info!(
                    "workers and checks run confined: the state directory is hidden from \
                     them, and each sees only its own processes"
                ),
                Some(why) => tracing::warn!(
                    "workers and checks run confined without a PID namespace: through /proc \
                     they see the machine's processes and what those see, and a root \
                     daemon's workers keep the capabilities to undo the hiding: {why}"
                ),
            }
            Some(support)
        }
        Err(why) => {
            tracing::warn!(
                "workers and checks are not confined (they can see the state directory): {why}"
            );
            None
        }
    };
    crate::collab::set_machine_confines(confine.is_some());
    Workers { jobs, confine }
}

/// What no confined process may see besides its daemon's own state directory: the
/// bootstraps' directories (which name every state directory of the machine's owner) and
/// every state directory they register.
pub fn hidden_from_workers(bootstraps: Vec<PathBuf>, own: PathBuf) -> room_exec::check::HiddenDirs {
    room_exec::check::HiddenDirs::new(move || {
        let mut out = Vec::new();
        for b in &bootstraps {
            if let Some(dir) = b.parent() {
                out.push(dir.to_path_buf());
            }
            out.extend(
                statedir::registered_roots(b)
                    .into_iter()
                    .filter(|r| *r != own),
            );
        }
        out.sort();
        out.dedup();
        out
    })
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub state_dir: PathBuf,
    pub bootstrap: PathBuf,
    pub listen: Option<SocketAddr>,
    /// Threads that run engine calls (see [`engine_threads_default`]).
    pub engine_threads: usize,
    /// Connection and time limits of the listeners.
    pub limits: Limits,
    /// The `room` binary, for workers routed to the `script` adapter (none: that adapter is
    /// refused at launch).
    pub room_exe: Option<PathBuf>,
    /// A PostgreSQL url (`postgres://…`): the store lives there (the state dir keeps the
    /// daemon's own files: its socket, lock, workers and trees). None: the embedded store.
    pub store: Option<String>,
}

/// What one connection may hold and for how long. The same limits apply to the Unix socket
/// (a request line's head is its first byte, its body the rest of the line) and to HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From the first byte of a request (or, over HTTP, from when the connection waits for
    /// one) until its head is complete.
    pub header_read: Duration,
    /// Until the body (the rest of a socket line) is complete, and for writing an answer.
    pub body_read: Duration,
    /// How long a Unix socket connection may wait for its next request.
    pub idle: Duration,
    /// Connections one listener holds at most (also capped by the descriptor limit).
    pub conns_per_listener: usize,
    /// Connections one peer (a socket peer's pid, an HTTP peer's address) holds at most.
    pub conns_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            idle: Duration::from_secs(300),
            conns_per_listener: 2048,
            conns_per_peer: 1024,
        }
    }
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now in force
/// (`None`: unlimited).
pub fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let want = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, want) {
            tracing::warn!("could not raise the descriptor limit to the hard limit: {e}");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// Every file and directory the daemon (and the CLI) creates is its owner's alone: journals
/// hold what agents wrote, control.db their credentials' digests.
pub fn private_umask() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

/// A log line that may repeat (an accept error, a refused connection) is written at most once
/// per [`LOG_EVERY`] per key, with the number of lines suppressed since the last one.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

struct LogLimiter {
    seen: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

static LOG_LIMITER: std::sync::LazyLock<LogLimiter> = std::sync::LazyLock::new(|| LogLimiter {
    seen: Mutex::new(HashMap::new()),
});

/// `Some(suppressed)` when a line under `key` may be written now.
fn log_allowed(key: &'static str) -> Option<u64> {
    let mut seen = LOG_LIMITER.seen.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    match seen.get_mut(key) {
        Some((last, suppressed)) if now.duration_since(*last) < LOG_EVERY => {
            *suppressed += 1;
            None
        }
        Some((last, suppressed)) => {
            let n = *suppressed;
            *last = now;
            *suppressed = 0;
            Some(n)
        }
        None => {
            seen.insert(key, (now, 0));
            Some(0)
        }
    }
}

/// A rate-limited warning (`limited!` for callers outside this module).
pub(crate) fn limited_warn(key: &'static str, message: &str) {
    if let Some(suppressed) = log_allowed(key) {
        tracing::warn!(suppressed, "{message}");
    }
}

/// A rate-limited `tracing` line: `limited!(warn, "key", "message {}", x)`.
macro_rules! limited {
    ($level:ident, $key:literal, $($arg:tt)+) => {
        if let Some(suppressed) = log_allowed($key) {
            tracing::$level!(suppressed, $($arg)+);
        }
    };
}

/// Wait before the next `accept` after a failure (descriptors exhausted, for instance): from
/// 5 ms doubling to 1 s, reset by a success.
struct Backoff(Duration);

impl Backoff {
    const MIN: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);

    fn new() -> Backoff {
        Backoff(Duration::ZERO)
    }

    fn reset(&mut self) {
        self.0 = Duration::ZERO;
    }

    async fn failed(&mut self, listener: &'static str, e: &std::io::Error) {
        self.0 = (self.0 * 2).clamp(Self::MIN, Self::MAX);
        limited!(
            warn,
            "accept",
            listener,
            backoff_ms = self.0.as_millis() as u64,
            "accept failed: {e}"
        );
        tokio::time::sleep(self.0).await;
    }
}

/// The connections of one listener: at most `max` in all and `per_peer` per peer. A new
/// connection past either bound closes the oldest connection (of that peer, or of anyone)
/// that is not running a request; if every one is, the new one is refused.
pub(crate) struct Conns {
    listener: &'static str,
    max: usize,
    per_peer: usize,
    table: Mutex<ConnTable>,
}

#[derive(Default)]
struct ConnTable {
    next: u64,
    open: BTreeMap<u64, ConnEntry>,
    peers: HashMap<String, usize>,
}

struct ConnEntry {
    peer: String,
    busy: Arc<AtomicUsize>,
    evict: Arc<tokio::sync::Notify>,
}

/// One admitted connection; dropping it releases its place.
pub(crate) struct Ticket {
    conns: Arc<Conns>,
    id: u64,
    busy: Arc<AtomicUsize>,
    evict: Arc<tokio::sync::Notify>,
}

/// Marks a connection as running a request (not to be closed to make room).
pub(crate) struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ticket {
    pub(crate) fn busy(&self) -> Busy {
        Busy::start(&self.busy)
    }

    /// Resolves when the listener closes this connection to make room.
    pub(crate) async fn evicted(&self) {
        self.evict.notified().await
    }
}

impl Busy {
    fn start(b: &Arc<AtomicUsize>) -> Busy {
        b.fetch_add(1, Ordering::AcqRel);
        Busy(b.clone())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut t = self.conns.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = t.open.remove(&self.id) {
            t.release(&e.peer);
        }
    }
}

impl ConnTable {
    fn release(&mut self, peer: &str) {
        if let Some(n) = self.peers.get_mut(peer) {
            *n -= 1;
            if *n == 0 {
                self.peers.remove(peer);
            }
        }
    }

    /// Close the oldest idle connection (of `peer`, if given); false if there is none.
    fn evict_oldest(&mut self, peer: Option<&str>) -> bool {
        let victim = self
            .open
            .iter()
            .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0 && peer.is_none_or(|p| e.peer == p))
            .map(|(id, _)| *id);
        match victim.and_then(|id| self.open.remove(&id)) {
            Some(e) => {
                e.evict.notify_one();
                self.release(&e.peer);
                true
            }
            None => false,
        }
    }
}

impl Conns {
    pub(crate) fn new(listener: &'static str, limits: &Limits, nofile: Option<u64>) -> Arc<Conns> {
        // half the descriptors past the reserve for the two listeners, half for open rooms
        // (`room_engine::rooms::open_max_for`)
        let fd_cap = nofile.map_or(usize::MAX, |n| {
            (n.saturating_sub(room_engine::rooms::DESCRIPTORS_RESERVED) / 4) as usize
        });
        let max = limits.conns_per_listener.min(fd_cap).max(1);
        Arc::new(Conns {
            listener,
            max,
            per_peer: limits.conns_per_peer.clamp(1, max),
            table: Mutex::new(ConnTable::default()),
        })
    }

    /// Admit a connection from `peer`, making room if needed; `None` refuses it.
    pub(crate) fn admit(self: &Arc<Self>, peer: String) -> Option<Ticket> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.peers.get(&peer).copied().unwrap_or(0) >= self.per_peer && !t.evict_oldest(Some(&peer))
        {
            limited!(warn, "conn_refused_peer", listener = self.listener, %peer, "connection refused: every connection of this peer is running a request");
            return None;
        }
        if t.open.len() >= self.max && !t.evict_oldest(None) {
            limited!(
                warn,
                "conn_refused",
                listener = self.listener,
                "connection refused: every connection is running a request"
            );
            return None;
        }
        if t.open.len() + 1 >= self.max {
            limited!(
                info,
                "conn_full",
                listener = self.listener,
                max = self.max,
                "listener at its connection bound: the oldest idle connections are closed to make room"
            );
        }
        let id = t.next;
        t.next += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = Arc::new(tokio::sync::Notify::new());
        *t.peers.entry(peer.clone()).or_insert(0) += 1;
        t.open.insert(
            id,
            ConnEntry {
                peer,
                busy: busy.clone(),
                evict: evict.clone(),
            },
        );
        Some(Ticket {
            conns: self.clone(),
            id,
            busy,
            evict,
        })
    }
}

/// The embedded default storage: SQLite and journal files under the state dir.
pub fn embedded_store(state: &StateDir) -> Arc<dyn room_store::Backend> {
    Arc::new(room_store::SqliteBackend::new(state, Default::default()))
}

/// Validate, lock, open. Split-brain and a held lock are errors here, before anything listens.
pub fn open_engine(
    cfg: &ServeConfig,
) -> Result<(StateDir, statedir::DaemonLock, Engine, Workers), ServerError> {
    let state = statedir::validate(&cfg.state_dir, &cfg.bootstrap).map_err(ServerError::State)?;
    let lock = statedir::lock(&state).map_err(ServerError::State)?;
    let workers = prepare_workers(&state);
    let check = room_exec::check::CheckEnv {
        state_dir: state.root.clone(),
        jobs: workers.jobs.clone(),
        support: workers.confine.clone(),
        hidden: hidden_from_workers(bootstraps(cfg), state.root.clone()),
    };
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::from(u32::MAX));
    let rooms_open_max = room_engine::rooms::open_max_for(nofile);
    tracing::info!(
        "descriptor limit {nofile}: up to {rooms_open_max} rooms open at once (others open on use)"
    );
    let config = EngineConfig {
        // the owner is whoever runs the daemon: a socket peer of this uid is the owner console
        owner_uid: rustix::process::getuid().as_raw(),
        rooms_open_max,
        // the owner's Room configuration is never project territory: the directory of the
        // bootstrap in use and of the default one
        owner_config_dirs: [cfg.bootstrap.clone(), statedir::default_bootstrap_path()]
            .iter()
            .filter_map(|b| b.parent().map(Path::to_path_buf))
            .collect(),
        // what runs Room is never a task's to lease
        protected_paths: std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .into_iter()
            .collect(),
        ..EngineConfig::default()
    };
    let store: Arc<dyn room_store::Backend> = match &cfg.store {
        None => {
            if let Ok(marker) = std::fs::read(state.store_migrated()) {
                let to = serde_json::from_slice::<serde_json::Value>(&marker)
                    .ok()
                    .and_then(|m| m["to"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "a database".into());
                return Err(ServerError::State(room_store::StoreError::Migrated(
                    format!(
                        "this state dir's store was copied to {to}: serving its embedded copy would split the state in two"
                    ),
                )));
            }
            embedded_store(&state)
        }
        Some(url) => {
            let pg = room_store_pg::PgBackend::connect(url).map_err(ServerError::EngineOpen)?;
            pg.serve_alone().map_err(ServerError::EngineOpen)?;
            // the database's permits and read positions are keyed by the instance that
            // wrote them: a state dir of another instance is refused before it reads any
            pg.bind_instance(&state.instance_id, SystemClock.now_ms())
                .map_err(ServerError::State)?;
            pg.start_serving().map_err(ServerError::EngineOpen)?;
            Arc::new(pg)
        }
    };
    let engine = Engine::open(state.clone(), daemon_env(check), store, config)
        .map_err(ServerError::EngineOpen)?;
    Ok((state, lock, engine, workers))
}

/// The bootstrap in use and the default one.
fn bootstraps(cfg: &ServeConfig) -> Vec<PathBuf> {
    let mut b = vec![cfg.bootstrap.clone(), statedir::default_bootstrap_path()];
    b.dedup();
    b
}

/// Run until `shutdown` resolves.
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    // before the engine opens anything: its files are private, and the rooms it may keep
    // open follow from the raised limit
    private_umask();
    let nofile = raise_nofile_limit();
    match nofile {
        Some(n) => tracing::info!(nofile = n, "descriptor limit raised to the hard limit"),
        None => tracing::info!("descriptor limit: unlimited"),
    }
    let (state, _lock, engine, Workers { jobs, confine }) = tokio::task::spawn_blocking({
        let cfg = cfg.clone();
        move || open_engine(&cfg)
    })
    .await
    .map_err(|e| ServerError::Daemon(e.to_string()))??;
    let engine = Arc::new(engine);
    // the state dir is the owner's alone, whatever an older version left behind
    if let Err(e) = std::fs::set_permissions(&state.root, std::fs::Permissions::from_mode(0o700)) {
        tracing::warn!("could not make {} private: {e}", state.root.display());
    }
    let limits = cfg.limits;
    let sock = state.socket();
    // We hold the lock, so any socket or address file is a leftover of a dead daemon.
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(state.root.join("http.addr"));
    let listener = UnixListener::bind(&sock).map_err(|source| ServerError::Bind {
        what: sock.display().to_string(),
        source,
    })?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(socket = %sock.display(), instance = %state.instance_id, "room daemon listening");
    let http = match cfg.listen {
        Some(addr) => {
            if !addr.ip().is_loopback() {
                return Err(ServerError::ListenNotLoopback(addr));
            }
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind {
                    what: addr.to_string(),
                    source,
                })?;
            let bound = tcp.local_addr()?;
            tracing::info!(%bound, "http listening");
            std::fs::write(state.root.join("http.addr"), bound.to_string())?;
            Some(tokio::spawn(crate::daemon::http::run(
                tcp,
                engine.clone(),
                limits,
                nofile,
            )))
        }
        None => None,
    };
    let flusher = tokio::spawn({
        let engine = engine.clone();
        async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(INDEX_FLUSH_MS));
            loop {
                tick.tick().await;
                let engine = engine.clone();
                let _ = tokio::task::spawn_blocking(move || engine.flush_indexes()).await;
            }
        }
    });
    let dispatcher = tokio::spawn(crate::workers::run(
        engine.clone(),
        crate::workers::WorkerEnv {
            state_dir: state.root.clone(),
            socket: sock.clone(),
            bridge: cfg.room_exe.clone().map(|exe| {
                // the daemon's own binary is staged from the file it runs, which a rebuild
                // or an upgrade of its path does not replace
                let running = std::env::current_exe().is_ok_and(|me| me == exe);
                let source = if running {
                    PathBuf::from("/proc/self/exe")
                } else {
                    exe
                };
                Arc::new(room_exec::bridge::Bridge::new(
                    source,
                    state.root.join("bridge"),
                ))
            }),
            staged: None,
            jobs: jobs.clone(),
            limits,
            confine,
            hidden: hidden_from_workers(bootstraps(&cfg), state.root.clone()),
            brokers: Default::default(),
        },
    ));
    let sweeper = tokio::spawn({
        let engine = engine.clone();
        async move {
            let mut tick =
                tokio::time::interval(std::time::Duration::from_millis(INVARIANT_SWEEP_MS));
            loop {
                tick.tick().await;
                let engine = engine.clone();
                // then one slice of the journal scrub (ARCHITECTURE.md states its rate)
                match tokio::task::spawn_blocking(move || {
                    // a room halted by a lost database connection opens anew at its next use
                    engine.heal_halted_rooms();
                    // queued wake permits are revalidated too: a refused one is dead-lettered
                    if let Err(r) = engine.dispatch_sweep() {
                        tracing::error!("dispatch revalidation failed: {r}");
                    }
                    (
                        engine.sweep_invariants(),
                        engine.scrub_step(room_engine::room::SCRUB_SLICE_BYTES),
                    )
                })
                .await
                {
                    Ok((Ok(0), _)) => {}
                    Ok((Ok(n), _)) => tracing::warn!("{n} claims past their TTL recorded in doubt"),
                    Ok((Err(r), _)) => tracing::error!("invariant sweep failed: {r}"),
                    Err(e) => tracing::error!("invariant sweep panicked: {e}"),
                }
            }
        }
    });
    // the collaborations' scheduler: one pass at a time, each in a blocking thread (a gate's
    // commands run inside it)
    let collabs = tokio::spawn({
        let engine = engine.clone();
        let scheduler = Arc::new(crate::collab::scheduler(engine.clone()));
        async move {
            // a pass follows every call that may have moved a room (an agent's done, an
            // artifact, a decision), and at least every TICK_MS
            let mut changes = crate::dispatch::changes().subscribe();
            loop {
                let _ = tokio::time::timeout(
                    std::time::Duration::from_millis(crate::collab::TICK_MS),
                    changes.changed(),
                )
                .await;
                let e = engine.clone();
                let scheduler = scheduler.clone();
                let before = engine.commits();
                if let Err(e) = tokio::task::spawn_blocking(move || scheduler.tick(&e)).await {
                    tracing::error!("the collaborations' scheduler panicked: {e}");
                }
                // what a pass wrote (a task, a send whose wake a worker waits on) reaches the
                // dispatcher and the subscribers now, not at their next tick; the pass's own
                // announcement does not wake it again (one that arrived meanwhile does)
                if engine.commits() != before {
                    let others = changes.has_changed().unwrap_or(false);
                    crate::dispatch::changes().send_modify(|n| *n = n.wrapping_add(1));
                    if !others {
                        changes.borrow_and_update();
                    }
                }
            }
        }
    });
    // semantic search's vectors, away from every write (idle while no endpoint is configured)
    let indexer = tokio::spawn(crate::embeddings::indexer(engine.clone()));
    let conns = Conns::new("socket", &limits, nofile);
    let accept = async {
        let mut backoff = Backoff::new();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.reset();
                    stream
                }
                Err(e) => {
                    backoff.failed("socket", &e).await;
                    continue;
                }
            };
            // what the kernel says about the peer; the engine decides what standing it gives
            let Ok(peer) = stream.peer_cred() else {
                continue;
            };
            let (uid, pid) = (peer.uid(), peer.pid().map_or(0, |p| p.cast_unsigned()));
            // a process of a worker's job is a worker here too, whatever its uid; so is a
            // process of any job of any daemon (a worker of another state directory, a
            // check): owner standing takes more than the peer's uid
            let evidence = if jobs.holds(pid) {
                Evidence::Worker { launch: None, pid }
            } else if let Some(why) = room_exec::job::foreign_job(pid) {
                limited!(
                    info,
                    "foreign_job_peer",
                    "a socket peer is no owner console: {why}"
                );
                Evidence::Worker { launch: None, pid }
            } else {
                Evidence::UnixPeer { uid, pid }
            };
            let Some(ticket) = conns.admit(format!("pid {pid}")) else {
                continue;
            };
            let engine = engine.clone();
            tokio::spawn(async move {
                if let Err(e) = connection(stream, engine, evidence, ticket, limits, None).await {
                    limited!(debug, "socket_conn_ended", "connection ended: {e}");
                }
            });
        }
    };
    // a daemon another took its database from stops: it may not write, and its workers'
    // obligations are the new daemon's to reconcile
    let fence = async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(FENCE_CHECK_MS));
        loop {
            tick.tick().await;
            if let Some(why) = engine.store_fenced() {
                return why;
            }
        }
    };
    let mut fenced = None;
    tokio::select! {
        _ = accept => {}
        _ = shutdown => tracing::info!("shutting down"),
        why = fence => {
            tracing::error!("stopping: {why}");
            fenced = Some(why);
        }
    }
    if let Some(h) = http {
        h.abort();
    }
    flusher.abort();
    indexer.abort();
    collabs.abort();
    sweeper.abort();
    dispatcher.abort();
    // running workers end with their daemon (their launches end as interrupted at the next start)
    match tokio::task::spawn_blocking(move || jobs.close(crate::workers::STOP_WAIT_MS)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::warn!("stopped {n} running workers at shutdown"),
        Ok(Err(e)) => tracing::error!("workers' jobs not stopped at shutdown: {e}"),
        Err(e) => tracing::error!("stopping workers at shutdown panicked: {e}"),
    }
    // a fenced daemon writes nothing more, not even that it closed cleanly
    if fenced.is_none() {
        let e = engine.clone();
        let _ = tokio::task::spawn_blocking(move || e.close_clean()).await;
    }
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(state.root.join("http.addr"));
    match fenced {
        Some(why) => Err(ServerError::State(room_store::StoreError::Fenced(why))),
        None => Ok(()),
    }
}

/// How often the daemon asks whether its store fenced it.
const FENCE_CHECK_MS: u64 = 250;

/// A broker connection's peer, checked again before each of its requests: still a process of
/// the launch's job running a pinned program (a process admitted at connect that then `exec`s
/// another program, or hands the socket to one and exits, is refused from then on). `Err` is
/// the refusal it is answered with before the connection closes.
pub(crate) type PeerCheck = Arc<dyn Fn() -> Result<(), Box<Response>> + Send + Sync>;

pub(crate) async fn connection(
    stream: UnixStream,
    engine: Arc<Engine>,
    evidence: Evidence,
    ticket: Ticket,
    limits: Limits,
    peer: Option<PeerCheck>,
) -> std::io::Result<()> {
    let transport = Transport::UnixSocket(evidence);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        // wait for the next request, at most `idle`, unless the listener needs the room
        let first = async {
            tokio::time::timeout(limits.idle, async {
                Ok::<_, std::io::Error>(reader.fill_buf().await?.len())
            })
            .await
        };
        let available = tokio::select! {
            r = first => match r {
                Ok(r) => r?,
                Err(_) => return Ok(()), // idle too long
            },
            _ = ticket.evicted() => return Ok(()),
        };
        if available == 0 {
            return Ok(());
        }
        // from its first byte, the whole line within the head and body times
        let mut bounded = (&mut reader).take(REQUEST_BYTES_MAX as u64 + 1);
        let read = tokio::time::timeout(
            limits.header_read + limits.body_read,
            bounded.read_until(b'\n', &mut line),
        );
        let n = tokio::select! {
            r = read => match r {
                Ok(r) => r?,
                Err(_) => {
                    limited!(info, "socket_slow", "closed a socket connection whose request did not arrive in time");
                    return Ok(());
                }
            },
            _ = ticket.evicted() => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        let _busy = ticket.busy();
        if let Some(check) = &peer {
            let check = check.clone();
            let held = tokio::task::spawn_blocking(move || check()).await;
            let refused = match held {
                Ok(Ok(())) => None,
                Ok(Err(r)) => Some(*r),
                Err(e) => Some(Response::refused(Refusal::storage(e))),
            };
            if let Some(r) = refused {
                let _ =
                    tokio::time::timeout(limits.body_read, write_response(&mut write, &r)).await;
                return Ok(());
            }
        }
        let resp = if line.len() > REQUEST_BYTES_MAX {
            let r = Response::refused(
                Refusal::new(
                    Code::PayloadTooLarge,
                    format!("request over {REQUEST_BYTES_MAX} bytes"),
                )
                .detail(serde_json::json!({"limit_bytes": REQUEST_BYTES_MAX})),
            );
            let _ = tokio::time::timeout(limits.body_read, write_response(&mut write, &r)).await;
            return Ok(()); // the rest of the oversized line cannot be trusted as a frame
        } else {
            decode_and_handle(&engine, transport.clone(), &line, None).await
        };
        if let (
            Some(_),
            Transport::UnixSocket(Evidence::Worker {
                launch: Some(l), ..
            }),
        ) = (&peer, &transport)
        {
            if !write_severable(&mut write, &resp, &engine, l, &limits).await? {
                return Ok(());
            }
            continue;
        }
        // a peer that does not read its answers does not hold the connection either
        match tokio::time::timeout(limits.body_read, write_response(&mut write, &resp)).await {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        }
    }
}

/// A broker response leaves in chunks of this size, the launch's authority checked again
/// before each one after the first.
pub(crate) const BROKER_CHUNK_BYTES: usize = 4096;
/// How often a chunk the worker is slow to take waits before the launch's authority is
/// checked again.
const BROKER_RECHECK_MS: u64 = 200;

/// Write a broker response while launch `launch` stands: a revocation while it is partly
/// written cuts it there (`severed_mid_response`, recorded on the launch) and closes the
/// connection, never a second frame that would contradict the first part. False when the
/// connection is to close.
async fn write_severable(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    r: &Response,
    engine: &Arc<Engine>,
    launch: &str,
    limits: &Limits,
) -> std::io::Result<bool> {
    let mut bytes = serde_json::to_vec(r)?;
    bytes.push(b'\n');
    let total = bytes.len();
    let started = std::time::Instant::now();
    let mut sent = 0;
    // the request was authorized just now: only its very first write goes unchecked
    let mut checked_before = true;
    for chunk in bytes.chunks(BROKER_CHUNK_BYTES) {
        let mut write = std::pin::pin!(w.write_all(chunk));
        loop {
            let stands = if checked_before {
                checked_before = false;
                Ok(())
            } else {
                launch_stands(engine, launch).await
            };
            let cut = match stands {
                Err(why) => Some(why),
                Ok(()) => tokio::select! {
                    done = &mut write => match done {
                        Ok(()) => break,
                        // the peer went away: a cut only if the launch's authority went with it
                        Err(e) => match launch_stands(engine, launch).await {
                            Err(why) if sent > 0 => Some(format!("{why} (the worker went away)")),
                            _ => return Err(e),
                        },
                    },
                    _ = tokio::time::sleep(std::time::Duration::from_millis(BROKER_RECHECK_MS)) => {
                        if started.elapsed() > limits.body_read {
                            return Ok(false); // a peer that does not read its answers
                        }
                        None
                    }
                },
            };
            if let Some(how) = cut {
                severed(engine, launch, sent, total, &how).await;
                return Ok(false);
            }
        }
        sent += chunk.len();
    }
    Ok(true)
}

/// Whether the launch still stands, and why not when it does not.
async fn launch_stands(engine: &Arc<Engine>, launch: &str) -> Result<(), String> {
    let (e, id) = (engine.clone(), launch.to_string());
    tokio::task::spawn_blocking(move || e.launch_stands(&id).map_err(|r| r.message.into()))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

async fn severed(engine: &Arc<Engine>, launch: &str, sent: usize, total: usize, how: &str) {
    tracing::warn!(launch, sent, total, "a broker response was severed: {how}");
    let (e, id) = (engine.clone(), launch.to_string());
    // whole chunks written: at least this much reached the worker
    let detail = serde_json::json!({"bytes_sent": sent, "bytes_total": total, "why": how});
    match tokio::task::spawn_blocking(move || e.launch_severed(&id, detail)).await {
        Ok(Ok(_)) => {}
        Ok(Err(r)) => tracing::error!(launch, "a severed response was not recorded: {r}"),
        Err(e) => tracing::error!(launch, "recording a severed response panicked: {e}"),
    }
}

async fn write_response(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    r: &Response,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(r)?;
    bytes.push(b'\n');
    w.write_all(&bytes).await?;
    Ok(())
}

pub(crate) async fn decode_and_handle(
    engine: &Arc<Engine>,
    transport: Transport,
    bytes: &[u8],
    bearer: Option<String>,
) -> Response {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t.trim_end(),
        Err(_) => return Response::refused(Refusal::invalid("request", "not UTF-8")),
    };
    // One JSON object: serde would also take the struct's fields as an array, which the wire
    // contract does not allow.
    // duplicate keys are refused, not resolved (last wins) behind the caller's back
    let value: serde_json::Value = match crate::wire::parse_strict(text) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return Response::refused(Refusal::invalid("request", "must be one JSON object")),
        Err(e) => {
            return Response::refused(Refusal::invalid(
                "request",
                format!("malformed request: {e}"),
            ));
        }
    };
    let req: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            return Response::refused(Refusal::invalid(
                "request",
                format!("malformed request: {e}"),
            ));
        }
    };
    dispatch::handle_async(engine.clone(), transport, req, bearer).await
}

/// A daemon on its own runtime thread, for the demo, the bench and tests.
pub struct Background {
    pub socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl Background {
    /// Start a daemon on its own runtime thread and wait until its socket answers.
    pub fn start(state_dir: &Path, bootstrap: &Path) -> Result<Background, ServerError> {
        Self::start_with(ServeConfig {
            state_dir: state_dir.to_path_buf(),
            bootstrap: bootstrap.to_path_buf(),
            listen: None,
            engine_threads: engine_threads_default(),
            limits: Limits::default(),
            room_exe: None,
            store: None,
        })
    }

    /// Start with a full configuration (for example with an HTTP listener).
    pub fn start_with(cfg: ServeConfig) -> Result<Background, ServerError> {
        let state_dir = cfg.state_dir.clone();
        let wants_http = cfg.listen.is_some();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = runtime(cfg.engine_threads)?;
            rt.block_on(serve(cfg, async {
                let _ = rx.await;
            }))
        });
        let socket = state_dir.join("room.sock");
        for _ in 0..500 {
            if wants_http && !state_dir.join("http.addr").exists() {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            if let Ok(mut c) = crate::client::Client::connect(&socket)
                && c.call(&Request::new("ping", serde_json::json!({}))).is_ok()
            {
                return Ok(Background {
                    socket,
                    stop: Some(tx),
                    thread: Some(thread),
                });
            }
            if thread.is_finished() {
                return match thread.join() {
                    Ok(Err(e)) => Err(e),
                    _ => Err(ServerError::Daemon("daemon thread ended".into())),
                };
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(ServerError::Daemon("daemon did not come up".into()))
    }

    pub fn stop(mut self) -> Result<(), ServerError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| ServerError::Daemon("daemon thread panicked".into()))??;
        }
        Ok(())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

pub mod http {
    //! `POST /v1/call` on the loopback listener: the same request object, with the credential
    //! in `Authorization: Bearer`. A missing credential is 401 and nothing else.

    use super::*;
    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::{DefaultBodyLimit, State};
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::{IntoResponse, Response as HttpResponse};
    use axum::routing::{get, post};

    /// What `/v1/call` checks before it decodes: the same Host and Origin allow-lists as `/mcp`.
    #[derive(Clone)]
    pub(crate) struct CallState {
        engine: Arc<Engine>,
        hosts: Arc<[String]>,
        origins: Arc<[String]>,
    }

    /// `Host` values a loopback listener on `port` answers (DNS rebinding defence).
    pub(crate) fn allowed_hosts(port: u16) -> Vec<String> {
        vec![
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ]
    }

    /// `Origin` values a browser page may send (a request without one is not from a page).
    pub(crate) fn allowed_origins(port: u16) -> Vec<String> {
        allowed_hosts(port)
            .into_iter()
            .map(|h| format!("http://{h}"))
            .collect()
    }

    pub async fn run(
        tcp: tokio::net::TcpListener,
        engine: Arc<Engine>,
        limits: Limits,
        nofile: Option<u64>,
    ) {
        let port = match tcp.local_addr() {
            Ok(a) => a.port(),
            Err(e) => {
                tracing::error!("http listener has no address: {e}");
                return;
            }
        };
        let mcp_routes = crate::mcp::http::routes(engine.clone(), port);
        let dashboard = crate::dashboard::routes(engine.clone(), port);
        let state = CallState {
            engine,
            hosts: allowed_hosts(port).into(),
            origins: allowed_origins(port).into(),
        };
        let app = Router::new()
            .route("/v1/call", post(call))
            .route("/healthz", get(|| async { "ok" }))
            .layer(DefaultBodyLimit::max(REQUEST_BYTES_MAX))
            .with_state(state)
            .merge(mcp_routes)
            .merge(dashboard);
        let conns = Conns::new("http", &limits, nofile);
        let mut backoff = Backoff::new();
        loop {
            let (stream, peer) = match tcp.accept().await {
                Ok(x) => {
                    backoff.reset();
                    x
                }
                Err(e) => {
                    backoff.failed("http", &e).await;
                    continue;
                }
            };
            let Some(ticket) = conns.admit(peer.ip().to_string()) else {
                continue;
            };
            // Without TCP_NODELAY a client that reuses its connection waits out delayed ACKs
            // (about 40 ms a call on Linux) behind each small response.
            if let Err(e) = stream.set_nodelay(true) {
                limited!(debug, "nodelay", "TCP_NODELAY not set: {e}");
            }
            tokio::spawn(connection(stream, app.clone(), ticket, limits));
        }
    }

    /// One HTTP/1.1 connection: the head within `header_read` (hyper's timer, also while a
    /// kept-alive connection waits for its next request), the body within `body_read` (read
    /// whole, at most `REQUEST_BYTES_MAX`, before any handler runs), and closed at once when
    /// the listener needs its place.
    async fn connection(
        stream: tokio::net::TcpStream,
        app: Router,
        ticket: Ticket,
        limits: Limits,
    ) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let ticket = Arc::new(ticket);
        let t = ticket.clone();
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                let ticket = t.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let limited = http_body_util::Limited::new(body, REQUEST_BYTES_MAX);
                    let bytes =
                        match tokio::time::timeout(limits.body_read, limited.collect()).await {
                            Ok(Ok(c)) => c.to_bytes(),
                            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                                return Ok::<_, std::convert::Infallible>(closing(
                                    StatusCode::PAYLOAD_TOO_LARGE,
                                    Refusal::new(
                                        Code::PayloadTooLarge,
                                        format!("request over {REQUEST_BYTES_MAX} bytes"),
                                    )
                                    .detail(serde_json::json!({"limit_bytes": REQUEST_BYTES_MAX})),
                                ));
                            }
                            Ok(Err(e)) => {
                                limited!(debug, "http_body", "request body failed: {e}");
                                return Ok(closing(
                                    StatusCode::BAD_REQUEST,
                                    Refusal::invalid("body", "the request body could not be read"),
                                ));
                            }
                            Err(_) => {
                                limited!(
                                    info,
                                    "http_slow_body",
                                    "closed an HTTP connection whose body did not arrive in time"
                                );
                                return Ok(closing(
                                    StatusCode::REQUEST_TIMEOUT,
                                    Refusal::invalid(
                                        "body",
                                        format!(
                                            "the body did not arrive within {} ms",
                                            limits.body_read.as_millis()
                                        ),
                                    ),
                                ));
                            }
                        };
                    let _busy = ticket.busy();
                    let req =
                        axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
                    Ok(app.oneshot(req).await.unwrap_or_else(|e| match e {}))
                }
            });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read);
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::select! {
            r = conn => if let Err(e) = r {
                limited!(debug, "http_conn_ended", "http connection ended: {e}");
            },
            _ = ticket.evicted() => {}
        }
    }

    /// An answer after which the connection closes (its remaining input is not a request).
    fn closing(status: StatusCode, r: Refusal) -> HttpResponse {
        (
            status,
            [(header::CONNECTION, "close")],
            axum::Json(Response::refused(r)),
        )
            .into_response()
    }

    /// A Host and an Origin (if any) that the listener answers, as `/mcp` checks them.
    fn check_origin(state: &CallState, headers: &HeaderMap) -> Result<(), Refusal> {
        check_host_origin(&state.hosts, &state.origins, headers)
    }

    /// A Host in `hosts` and an Origin (if any) in `origins`: the listener's DNS rebinding and
    /// cross-site defence, the same for `/v1/call` and the dashboard.
    pub(crate) fn check_host_origin(
        hosts: &[String],
        origins: &[String],
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        if !host.as_ref().is_some_and(|h| hosts.contains(h)) {
            return Err(Refusal::invalid(
                "host",
                format!("Host {host:?} is not this loopback listener"),
            )
            .hint("connect to 127.0.0.1 or localhost at the daemon's port"));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().map(str::to_ascii_lowercase).ok();
            if !origin.as_ref().is_some_and(|o| origins.contains(o)) {
                return Err(Refusal::invalid(
                    "origin",
                    format!("Origin {origin:?} is not this loopback listener"),
                ));
            }
        }
        Ok(())
    }

    async fn call(State(state): State<CallState>, headers: HeaderMap, body: Bytes) -> HttpResponse {
        if let Err(r) = check_origin(&state, &headers) {
            return (StatusCode::FORBIDDEN, axum::Json(Response::refused(r))).into_response();
        }
        let engine = state.engine;
        // the scheme in any case, as on /mcp
        let Some(bearer) = crate::mcp::http::bearer_token(&headers) else {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
            )
                .into_response();
        };
        let resp = decode_and_handle(&engine, Transport::Http, &body, Some(bearer)).await;
        let status = match &resp.refusal {
            Some(r) if matches!(r.code, Code::CredentialInvalid | Code::CredentialRevoked) => {
                StatusCode::UNAUTHORIZED
            }
            _ => StatusCode::OK,
        };
        (status, axum::Json(resp)).into_response()
    }
}

/// Where this daemon makes its workers' owned jobs: a cgroup v2 base named for the state
/// directory, its instance and its path (so that the next daemon of it finds what a crash
/// left, and no other daemon's start mistakes this one's jobs for leftovers), else process
/// groups.
fn worker_jobs(state: &room_store::statedir::StateDir) -> room_exec::job::Jobs {
    let key = format!("{}\0{}", state.instance_id, state.root.display());
    let name = &room_core::sha256_hex(key.as_bytes())[..32];
    // `ROOM_JOB_KIND=subreaper`: shims even where a cgroup could be made (what a machine
    // without cgroup delegation gets; the test script runs the worker suites so)
    let jobs = match std::env::var("ROOM_JOB_KIND").as_deref() {
        Ok("subreaper") => room_exec::job::Jobs::subreapers("ROOM_JOB_KIND=subreaper"),
        Ok("auto") | Err(_) => room_exec::job::Jobs::detect(name),
        Ok(other) => {
            tracing::warn!(
                "ROOM_JOB_KIND={other:?} is neither auto nor subreaper; jobs are chosen as for auto"
            );
            room_exec::job::Jobs::detect(name)
        }
    };
    // a subreaper job's shim is recorded while it runs, so that the next start after a crash
    // finds it and ends its tree (the shims outlive their daemon)
    let jobs = jobs.with_markers(state.root.join("jobs"));
    reap_recorded_base(&state.root, jobs.base());
    match jobs.why_not_cgroup() {
        None => tracing::info!(
            base = %jobs.base().map(|b| b.display().to_string()).unwrap_or_default(),
            "workers run in cgroup v2 jobs"
        ),
        Some(why) => tracing::warn!(
            "workers run below subreaper shims (a worker that kills its shim leaves its stop unconfirmed): {why}"
        ),
    }
    jobs
}

/// A daemon started from another cgroup than the one before it makes its jobs elsewhere: the
/// previous base is recorded in `<state>/jobs.base`, and what is left in it is ended here.
fn reap_recorded_base(root: &std::path::Path, now: Option<&std::path::Path>) {
    let record = root.join("jobs.base");
    if let Ok(old) = std::fs::read_to_string(&record) {
        let old = std::path::PathBuf::from(old.trim());
        if Some(old.as_path()) != now
            && let Some(jobs) = room_exec::job::Jobs::existing(&old)
        {
            match jobs.close(crate::workers::STOP_WAIT_MS) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::warn!(base = %old.display(), "ended {n} jobs a previous daemon left")
                }
                Err(e) => tracing::error!(base = %old.display(), "a previous daemon's jobs: {e}"),
            }
        }
    }
    let wrote = match now {
        Some(base) => std::fs::write(&record, base.display().to_string()),
        None => match std::fs::remove_file(&record) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
    };
    if let Err(e) = wrote {
        tracing::error!("{}: {e}", record.display());
    }
}
