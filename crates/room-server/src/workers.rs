//! The dispatcher loop: woken by every call that may have queued a wake permit (and once a
//! second), it asks the engine for launches (`Engine::dispatch_take`: revalidation, routes,
//! busy recipients, the cooldown) and runs each one's worker process. The engine decides;
//! this module only starts processes, reports their pids (the split-lock claim) and exits,
//! and stops their jobs.
//!
//! A worker runs in an owned job (`room_exec::job`: a cgroup v2 leaf of its own where the
//! daemon can make one, else the tree below a subreaper shim) with an empty environment except the names its
//! route lists and `ROOM_TOKEN` (its one-launch credential), `ROOM_STATE_DIR`, `ROOM_SOCKET`
//! and `ROOM_LAUNCH`; the wake prompt (JSON) is its stdin; its stdout and stderr go to
//! `<state>/workers/<launch>/`. When its leader exits, and at its deadline, the whole job is
//! killed, and the launch records whether zero processes were then observed.
//!
//! The `acp` adapter speaks the Agent Client Protocol on the worker's stdin and stdout
//! (`room_agents::acp`): the wake is a prompt in a new session that is given Room's own MCP
//! server (`room mcp` with the launch's credential); its stderr goes to the log.

use room_agents::acp;
use room_engine::Engine;
use room_engine::dispatch::{Delivery, Exit, Launch, SessionSeen};
use room_engine::lifecycle::{StopEnvelope, Trip};
use room_exec::job::{Job, Jobs};
use room_exec::stop::Outbox;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

/// A broker connection's send buffer (the kernel doubles it): a few chunks of a response.
const BROKER_SNDBUF_BYTES: usize = 2 * crate::daemon::BROKER_CHUNK_BYTES;

/// How often the observer looks at every running launch's authority (and at once on any
/// change a call announces).
const OBSERVE_MS: u64 = 1_000;

/// The launches this daemon runs, each with the sender that trips it.
#[derive(Clone, Default)]
struct Running(Arc<Mutex<HashMap<String, oneshot::Sender<Trip>>>>);

impl Running {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Trip>>> {
        // a panic while holding it leaves a map that is still a map
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running launch's job as the owner's view shows it (`workers_list`).
struct LiveJob {
    kind: room_exec::job::JobKind,
    membership: room_exec::job::Membership,
    room: String,
    agent: String,
    adapter: String,
    since_ms: u64,
}

/// The jobs of this daemon's launches, from their start until they were seen empty (a job
/// whose stop is unconfirmed stays listed: its processes may still be there).
fn live_jobs() -> std::sync::MutexGuard<'static, BTreeMap<String, LiveJob>> {
    static LIVE: std::sync::LazyLock<Mutex<BTreeMap<String, LiveJob>>> =
        std::sync::LazyLock::new(Default::default);
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Live processes listed per worker at most.
const WORKER_PIDS_SHOWN_MAX: usize = 16;

/// `workers_list`: each running worker, its owned job and the processes in it now.
pub(crate) fn workers_view() -> Value {
    let rows: Vec<Value> = live_jobs()
        .iter()
        .map(|(launch, j)| {
            let pids = j.membership.members();
            json!({"launch": launch, "room": j.room, "agent": j.agent, "adapter": j.adapter,
                "job": j.kind.as_str(), "processes": pids.len(),
                "pids": pids.iter().take(WORKER_PIDS_SHOWN_MAX).collect::<Vec<_>>(),
                "since_ms": j.since_ms})
        })
        .collect();
    json!({"workers": rows})
}

/// A crash injected for the stop outbox's tests (`ROOM_FAULT`): the daemon aborts at the
/// named point, as a kill -9 would stop it there.
pub(crate) fn fault(point: &str) {
    if std::env::var("ROOM_FAULT").is_ok_and(|f| f == point) {
        tracing::error!("ROOM_FAULT={point}: aborting here");
        std::process::abort();
    }
}

/// How long a stopped group may take to be seen empty.
pub(crate) const STOP_WAIT_MS: u64 = 5_000;
/// Stops tried again, a second apart, for a job not seen empty.
const STOP_RETRIES: u32 = 60;

/// Where the dispatcher finds what it launches.
#[derive(Debug, Clone)]
pub struct WorkerEnv {
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// Room's binary staged for workers by its digest (`room_exec::bridge`): what the `script`
    /// adapter runs as `room agent-script`, an ACP agent as `room mcp`, a script as
    /// `$ROOM_BRIDGE api` (none: those are refused at launch).
    pub bridge: Option<Arc<room_exec::bridge::Bridge>>,
    /// The bridge as staged for one launch (set on the launch's own copy of this env, so
    /// every step of one launch names the same staged file).
    pub staged: Option<room_exec::bridge::Staged>,
    /// Where workers' owned jobs are made.
    pub jobs: Jobs,
    /// The limits of the daemon's listeners, which each launch's broker keeps too.
    pub limits: crate::daemon::Limits,
    /// Workers run confined (`room_exec::confine`) when the daemon's probe found it
    /// possible, with what it found.
    pub confine: Option<room_exec::confine::Support>,
    /// What a confined worker must not see besides the state directory: other daemons'
    /// state directories and the bootstraps that name them.
    pub hidden: room_exec::check::HiddenDirs,
    /// The broker of each running launch.
    pub brokers: Brokers,
}

impl WorkerEnv {
    /// The staged bridge's path, as staged for this launch (`stage_bridge` runs before its
    /// process starts).
    fn bridge_path(&self) -> Option<PathBuf> {
        self.staged.as_ref().map(|s| s.path.clone())
    }
}

/// Stage the bridge for a launch (once per daemon, again if its copy changed): reading Room's
/// binary is file work, off the runtime.
async fn stage_bridge(env: &WorkerEnv) -> Result<Option<room_exec::bridge::Staged>, String> {
    let Some(b) = env.bridge.clone() else {
        return Ok(None);
    };
    match tokio::task::spawn_blocking(move || b.staged()).await {
        Ok(r) => r.map(Some),
        Err(e) => Err(format!("staging the bridge panicked: {e}")),
    }
}

/// Each running launch's broker task, ended with its launch.
#[derive(Clone, Default, Debug)]
pub struct Brokers(Arc<Mutex<HashMap<String, tokio::task::JoinHandle<()>>>>);

impl Brokers {
    fn end(&self, launch: &str) {
        let h = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(launch);
        if let Some(h) = h {
            h.abort();
        }
    }
}

/// Run the dispatcher until the task is aborted.
pub async fn run(engine: Arc<Engine>, env: WorkerEnv) {
    let mut changes = crate::dispatch::changes().subscribe();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    {
        let jobs = env.jobs.clone();
        match tokio::task::spawn_blocking(move || jobs.reap_stale(STOP_WAIT_MS)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::warn!("ended the processes of {n} jobs a previous daemon left"),
            Ok(Err(e)) => tracing::error!("the jobs of a previous daemon were not looked at: {e}"),
            Err(e) => tracing::error!("reaping old jobs panicked: {e}"),
        }
        // what a crash left between the phases of a stop is committed before anything else
        replay_stops(&engine, &env).await;
        // and a proposal a crash left between its intention and its record is resolved
        let e = engine.clone();
        match tokio::task::spawn_blocking(move || crate::proposals::recover(&e)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::warn!("{n} proposals a previous daemon left are resolved"),
            Ok(Err(e)) => tracing::error!("proposal recovery failed: {e}"),
            Err(e) => tracing::error!("proposal recovery panicked: {e}"),
        }
        let engine = engine.clone();
        let unconfirmed = env.jobs.unconfirmed_stale();
        if !unconfirmed.is_empty() {
            tracing::error!(
                launches = ?unconfirmed,
                "jobs a previous daemon left were not seen empty: their launches end interrupted, recorded as unconfirmed"
            );
        }
        match tokio::task::spawn_blocking(move || engine.recover_launches_with(&unconfirmed)).await
        {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::warn!("{n} launches of a previous daemon ended as interrupted"),
            Ok(Err(r)) => tracing::error!("launch recovery failed: {r}"),
            Err(e) => tracing::error!("launch recovery panicked: {e}"),
        }
    }
    let running = Running::default();
    tokio::spawn(observe(engine.clone(), running.clone()));
    let mut full = false;
    let mut space = SpaceGuard::default();
    loop {
        // a pass that started as many launches as one may takes the next at once: the rest
        // of a wide send must not wait for the next tick
        if !full {
            tokio::select! {
                _ = tick.tick() => {}
                r = changes.changed() => if r.is_err() { return },
            }
        }
        full = false;
        let engine2 = engine.clone();
        let hold = space.hold(&env.state_dir, &engine.policy()).await;
        let launches =
            match tokio::task::spawn_blocking(move || engine2.dispatch_take_unless(hold)).await {
                Ok(Ok(l)) => l,
                Ok(Err(r)) => {
                    tracing::error!("dispatch failed: {r}");
                    continue;
                }
                Err(e) => {
                    tracing::error!("dispatch panicked: {e}");
                    continue;
                }
            };
        full = launches.len() >= room_engine::dispatch::LAUNCHES_PER_PASS_MAX;
        for l in launches {
            let (tx, rx) = oneshot::channel();
            running.map().insert(l.id.clone(), tx);
            tokio::spawn(run_launch(
                engine.clone(),
                env.clone(),
                l,
                rx,
                running.clone(),
            ));
        }
    }
}

/// How often the workers' share of the state directory is measured again (a walk of
/// `workers/`), and the entries one walk looks at (past it, what the walk counted is a lower
/// bound: over the quota it holds launches; under it, the free-space floor still guards the
/// disk, and the log says the share was not measured whole).
const SPACE_MEASURE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
const SPACE_WALK_ENTRIES_MAX: usize = 1_000_000;

/// Whether workers may start as far as the disk goes: the state directory's file system keeps
/// its free-space floor (what is left is the journals'), and the workers' share of the state
/// directory is within its quota. Free space is read each pass (one `statvfs`); the share is
/// walked at most every `SPACE_MEASURE_EVERY`.
#[derive(Default)]
struct SpaceGuard {
    /// When the share was measured, what it was, and the quota then (a quota the owner has
    /// just changed is measured against at once).
    share: Option<(std::time::Instant, u64, u64)>,
}

impl SpaceGuard {
    async fn hold(
        &mut self,
        state: &Path,
        policy: &room_engine::policy::Policy,
    ) -> Option<&'static str> {
        let free = rustix::fs::statvfs(state)
            .ok()
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize));
        if free.is_some_and(|f| f < policy.state_dir_free_bytes_min) {
            crate::daemon::limited_warn(
                "state_dir_space_low",
                &format!(
                    "{} bytes free on the state directory's file system, under the floor of {}: no worker starts",
                    free.unwrap_or(0),
                    policy.state_dir_free_bytes_min
                ),
            );
            return Some("state_dir_space_low");
        }
        let stale = self.share.is_none_or(|(at, _, quota)| {
            at.elapsed() >= SPACE_MEASURE_EVERY || quota != policy.workers_bytes_max
        });
        if stale {
            let dir = state.join("workers");
            let (bytes, whole) = blocking(move || Ok(tree_bytes(&dir, SPACE_WALK_ENTRIES_MAX)))
                .await
                .unwrap_or((0, false));
            if !whole {
                crate::daemon::limited_warn(
                    "worker_space_unmeasured",
                    &format!(
                        "the workers' share of the state directory has more than {SPACE_WALK_ENTRIES_MAX} entries: counted {bytes} bytes before stopping (remove old workers/<launch> directories)"
                    ),
                );
            }
            self.share = Some((std::time::Instant::now(), bytes, policy.workers_bytes_max));
        }
        let share = self.share.map_or(0, |(_, b, _)| b);
        if share > policy.workers_bytes_max {
            crate::daemon::limited_warn(
                "worker_space_quota",
                &format!(
                    "the workers' share of the state directory holds {share} bytes, over its quota of {}: no worker starts",
                    policy.workers_bytes_max
                ),
            );
            return Some("worker_space_quota");
        }
        None
    }
}

/// The bytes of the regular files below `dir` (not following symlinks), and whether the walk
/// saw them all (false: it stopped after `entries_max` entries, and the count is a lower
/// bound).
fn tree_bytes(dir: &Path, entries_max: usize) -> (u64, bool) {
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > entries_max {
                return (total, false);
            }
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                todo.push(e.path());
            } else if m.is_file() {
                total = total.saturating_add(m.len());
            }
        }
    }
    (total, true)
}

/// Bytes of each output stream of a worker kept on disk: its first `WORKER_LOG_HEAD_BYTES`
/// as they come, and its last `WORKER_LOG_TAIL_BYTES` once it ends, with a line that says how
/// much was cut between them. A worker that floods its output fills no disk.
pub const WORKER_LOG_HEAD_BYTES: usize = 1 << 20;
pub const WORKER_LOG_TAIL_BYTES: usize = 1 << 20;

/// Copy a worker's output stream into `file`, bounded (see `WORKER_LOG_HEAD_BYTES`).
async fn pump_bounded(mut src: impl tokio::io::AsyncRead + Unpin, file: std::fs::File) {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::from_std(file);
    let mut head = 0usize;
    let mut tail: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut cut = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &buf[..n];
        if head < WORKER_LOG_HEAD_BYTES {
            let take = chunk.len().min(WORKER_LOG_HEAD_BYTES - head);
            if file.write_all(&chunk[..take]).await.is_err() {
                return;
            }
            head += take;
            chunk = &chunk[take..];
        }
        tail.extend(chunk);
        if tail.len() > WORKER_LOG_TAIL_BYTES {
            let excess = tail.len() - WORKER_LOG_TAIL_BYTES;
            tail.drain(..excess);
            cut += excess as u64;
        }
    }
    if cut > 0 {
        let mark = format!("\n[room: {cut} bytes of this output were cut here]\n");
        let _ = file.write_all(mark.as_bytes()).await;
    }
    let (a, b) = tail.as_slices();
    let _ = file.write_all(a).await;
    let _ = file.write_all(b).await;
    let _ = file.flush().await;
}

/// The program and arguments a launch runs.
fn program(l: &Launch, env: &WorkerEnv) -> Result<(PathBuf, Vec<String>), String> {
    match l.route.adapter.as_str() {
        "command" | "acp" => {
            if l.route.adapter == "acp" && env.bridge_path().is_none() {
                return Err("the acp adapter gives the agent Room's MCP server, the room binary, which this daemon does not know".into());
            }
            let (p, args) = l.route.command.split_first().ok_or("an empty command")?;
            Ok((PathBuf::from(p), args.to_vec()))
        }
        "script" => {
            let exe = env.bridge_path().ok_or(
                "the script adapter needs the room binary, which this daemon does not know",
            )?;
            Ok((
                exe,
                vec![
                    "agent-script".into(),
                    "--steps".into(),
                    l.route.steps.join(","),
                ],
            ))
        }
        other => Err(format!("adapter {other} is not offered")),
    }
}

/// The observer: once a second, and at once after any call that may have moved authority,
/// it asks the engine which running launches lost theirs and trips each one's stop.
async fn observe(engine: Arc<Engine>, running: Running) {
    let mut changes = crate::dispatch::changes().subscribe();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(OBSERVE_MS));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = changes.changed() => if r.is_err() { return },
        }
        let processes = !running.map().is_empty();
        let e = engine.clone();
        // session launches (permits taken in an agent's own session) have no process: the
        // engine ends them itself, replied, tripped or past their deadline
        let pass = move || {
            // a settle that fails must not keep any worker from being stopped
            if let Err(r) = e.settle_sessions(None) {
                tracing::error!("the observer could not settle session launches: {r}");
            }
            if processes {
                e.launch_trips()
            } else {
                Ok(Vec::new())
            }
        };
        let trips = match tokio::task::spawn_blocking(pass).await {
            Ok(Ok(t)) => t,
            Ok(Err(r)) => {
                tracing::error!("the observer could not read launches: {r}");
                continue;
            }
            Err(e) => {
                tracing::error!("the observer panicked: {e}");
                continue;
            }
        };
        for t in trips {
            if let Some(tx) = running.map().remove(&t.launch) {
                tracing::warn!(launch = %t.launch, reason = t.reason, "stopping a worker: {}", t.detail);
                let _ = tx.send(t);
            }
        }
    }
}

async fn run_launch(
    engine: Arc<Engine>,
    env: WorkerEnv,
    l: Launch,
    trip: oneshot::Receiver<Trip>,
    running: Running,
) {
    // an orchestrator's launch is one turn: what it says and dispatches is kept until it ends
    let (e, launch) = (engine.clone(), l.clone());
    let _ =
        tokio::task::spawn_blocking(move || crate::collab::steer::turn_begin(&e, &launch)).await;
    run_launch_inner(&engine, &env, &l, trip, running).await;
    let (e, launch) = (engine.clone(), l.clone());
    let _ = tokio::task::spawn_blocking(move || crate::collab::steer::turn_end(&e, &launch)).await;
    // whatever became of it, its broker ends with it
    env.brokers.end(&l.id);
    let _ = std::fs::remove_file(
        env.state_dir
            .join("workers")
            .join(&l.id)
            .join("broker.sock"),
    );
}

async fn run_launch_inner(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
    mut trip: oneshot::Receiver<Trip>,
    running: Running,
) {
    let (engine, mut env, mut l) = (engine.clone(), env.clone(), l.clone());
    let api = matches!(l.route.adapter.as_str(), "openai" | "anthropic");
    let staged = match l.stage.clone() {
        Some(st) if !api => stage_launch(&env, &l, st).await.map(Some),
        _ => Ok(None),
    };
    let ran = match staged {
        Ok(manifest) => {
            if let Some(m) = manifest {
                l.prompt["staged"] = m;
            }
            None
        }
        // nothing of the worker starts on sources that are not exactly the pinned ones
        Err(why) => Some((Err(why), None, None)),
    };
    let (ran, job, tripped) = match ran {
        Some(r) => r,
        None if api => tokio::select! {
            r = crate::api_worker::run(&engine, &l) => (r, None, None),
            Ok(t) = &mut trip => (Err("stopped".into()), None, Some(t)),
        },
        None => match stage_bridge(&env).await {
            Ok(staged) => {
                env.staged = staged;
                start_and_wait(&engine, &env, &l, &mut trip).await
            }
            // a command runs its own program: it goes on without Room's binary to call
            Err(why) if l.route.adapter == "command" => {
                tracing::warn!(launch = %l.id, "the worker gets no bridge: {why}");
                start_and_wait(&engine, &env, &l, &mut trip).await
            }
            // the script and ACP adapters run Room's binary: none that was not staged
            Err(why) => (Err(why), None, None),
        },
    };
    running.map().remove(&l.id);
    if let Some(t) = tripped {
        stop_with_outbox(&engine, &env, &l, job, t).await;
        live_jobs().remove(&l.id);
        return;
    }
    let mut exit = ran.unwrap_or_else(|why| {
        tracing::warn!(launch = %l.id, "worker did not run: {why}");
        let mut e = Exit::process(None, false);
        e.detail = json!({"not_run": why});
        e
    });
    // whatever the worker did, and on every path, nothing of its job outlives the launch
    if let Some(job) = job {
        match stop_until_confirmed(&engine, &l, job).await {
            Some(observed) => exit.job = observed,
            // not seen empty: the launch stays live (busy, counted), never taken for ended
            None => return,
        }
    }
    live_jobs().remove(&l.id);
    let id = l.id.clone();
    match tokio::task::spawn_blocking(move || engine.launch_ended(&id, exit)).await {
        Ok(Ok(v)) => tracing::info!(launch = %l.id, agent = %l.agent, "launch ended: {v}"),
        Ok(Err(r)) => tracing::error!(launch = %l.id, "launch end not recorded: {r}"),
        Err(e) => tracing::error!(launch = %l.id, "launch end panicked: {e}"),
    }
}

/// Stop the job; while it is not seen empty, mark the launch `unconfirmed` (its credential
/// stops working, it still counts as running) and try again every second, at most
/// `STOP_RETRIES` times. What the stop observed, or none when zero processes were never seen.
async fn stop_until_confirmed(
    engine: &Arc<Engine>,
    l: &Launch,
    mut job: Job,
) -> Option<serde_json::Value> {
    let mut marked = false;
    for attempt in 0..=STOP_RETRIES {
        let (back, observed) = stop(job).await;
        if observed["confirmed_empty"] == true {
            let mut observed = observed;
            observed["attempts"] = serde_json::json!(attempt + 1);
            return Some(observed);
        }
        if !marked {
            marked = true;
            let (engine, id) = (engine.clone(), l.id.clone());
            match tokio::task::spawn_blocking(move || engine.launch_unconfirmed(&id, observed))
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(r)) => tracing::error!(launch = %l.id, "unconfirmed stop not recorded: {r}"),
                Err(e) => {
                    tracing::error!(launch = %l.id, "recording an unconfirmed stop panicked: {e}")
                }
            }
        }
        job = back?;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    tracing::error!(
        launch = %l.id,
        "a worker's job was never seen empty; the launch stays unconfirmed until the next start"
    );
    None
}

/// What is left of a launch's time now: its `not_after` is fixed at dispatch, and spawning and
/// claiming took some of it.
pub(crate) fn time_left_ms(l: &Launch) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    l.prompt["not_after_ms"]
        .as_u64()
        .map_or(l.deadline_ms, |t| t.saturating_sub(now))
        .min(l.deadline_ms)
}

fn worker_dir(state: &Path, launch: &str) -> std::io::Result<PathBuf> {
    let dir = state.join("workers").join(launch);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    Ok(dir)
}

/// The worker's command: program, arguments, working directory, its stdio and the only
/// environment it gets.
fn command(
    env: &WorkerEnv,
    l: &Launch,
    dir: &Path,
    cwd: &Path,
) -> Result<tokio::process::Command, String> {
    let (prog, args) = program(l, env)?;
    // both streams go through the daemon (`pump_bounded`): a worker that floods its output
    // fills no disk
    let mut cmd = tokio::process::Command::new(&prog);
    cmd.args(&args)
        .env_clear()
        .current_dir(cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(false);
    let preset = l.route.preset.as_deref().and_then(acp::preset);
    let passed = preset.map_or(&[][..], |p| p.env_pass);
    for name in l
        .route
        .env
        .iter()
        .map(String::as_str)
        .chain(passed.iter().copied())
    {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    for (k, v) in preset.map_or(&[][..], |p| p.env_set) {
        cmd.env(k, v);
    }
    let socket = worker_socket(env, dir);
    cmd.env("ROOM_TOKEN", &l.token)
        .env("ROOM_STATE_DIR", &env.state_dir)
        .env("ROOM_SOCKET", &socket)
        .env("ROOM_LAUNCH", &l.id);
    // the bridge a worker's script reaches Room through (`$ROOM_BRIDGE api`)
    if let Some(exe) = env.bridge_path() {
        cmd.env("ROOM_BRIDGE", exe);
    }
    Ok(cmd)
}

/// Where a launch's worker reaches its broker: confined, at the daemon's socket path (its
/// view binds the broker there); otherwise at the broker's own path. Never the owner's
/// socket, where the launch's credential is refused (`launch_credential_outside_broker`).
fn worker_socket(env: &WorkerEnv, dir: &Path) -> PathBuf {
    if env.confine.is_some() {
        env.socket.clone()
    } else {
        dir.join("broker.sock")
    }
}

/// Start the worker in a job of its own, claim the launch with its pid and run its adapter.
/// The job comes back on every path where one was made, for the caller to stop.
async fn start_and_wait(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
    trip: &mut oneshot::Receiver<Trip>,
) -> (Result<Exit, String>, Option<Job>, Option<Trip>) {
    let (ran, job) = start_inner(engine, env, l, trip).await;
    match ran {
        Ran::Done(r) => (r, job, None),
        Ran::Tripped(t) => (Err("stopped".into()), job, Some(t)),
    }
}

enum Ran {
    Done(Result<Exit, String>),
    Tripped(Trip),
}

async fn start_inner(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
    trip: &mut oneshot::Receiver<Trip>,
) -> (Ran, Option<Job>) {
    let (r, job) = start_job(env, l);
    let (mut child, pid, mut job, broker) = match r {
        Ok(started) => started,
        Err(e) => return (Ran::Done(Err(e)), job),
    };
    job.started(pid);
    live_jobs().insert(
        l.id.clone(),
        LiveJob {
            kind: job.kind(),
            membership: job.membership(),
            room: l.room.clone(),
            agent: l.agent.clone(),
            adapter: l.route.adapter.clone(),
            since_ms: engine.now_ms(),
        },
    );
    let cwd = launch_cwd(env, l);
    match broker {
        Some((listener, pinned)) => {
            let h = tokio::spawn(serve_broker(
                engine.clone(),
                listener,
                l.id.clone(),
                (job.membership(), pinned),
                env.limits,
            ));
            env.brokers
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(l.id.clone(), h);
        }
        None => return (Ran::Done(Err("the broker was not bound".into())), Some(job)),
    }
    tokio::select! {
        ran = claim_and_run(engine, env, l, &mut child, pid, cwd) => match ran {
            Ok(ran) => (Ran::Done(ran), Some(job)),
            // a claim refused because the launch's authority tripped first (a cancel that
            // dead-lettered its permit before the observer saw the launch) is a stop like
            // the observer's, through the stop outbox
            Err(Unclaimed(why)) => match tripped(engine, &l.id).await {
                Some(t) => (Ran::Tripped(t), Some(job)),
                None => (Ran::Done(Err(why)), Some(job)),
            },
        },
        Ok(t) = trip => (Ran::Tripped(t), Some(job)),
    }
}

/// The launch's trip, if its authority no longer stands (`Engine::launch_trip`).
async fn tripped(engine: &Arc<Engine>, id: &str) -> Option<Trip> {
    let (engine, id) = (engine.clone(), id.to_string());
    match tokio::task::spawn_blocking(move || engine.launch_trip(&id)).await {
        Ok(Ok(t)) => t,
        Ok(Err(r)) => {
            tracing::error!("a refused claim's trip could not be read: {r}");
            None
        }
        Err(e) => {
            tracing::error!("a refused claim's trip panicked: {e}");
            None
        }
    }
}

/// The launch's claim was refused (or could not be made): its worker never ran.
struct Unclaimed(String);

fn launch_cwd(env: &WorkerEnv, l: &Launch) -> PathBuf {
    l.route
        .tree
        .as_deref()
        .or(l.route.cwd.as_deref())
        .map(PathBuf::from)
        .unwrap_or_else(|| env.state_dir.join("workers").join(&l.id))
}

/// The launch's working tree, if its route names one: a directory beneath the state
/// directory's `trees/` (Room made it; nothing else of the state directory is a tree).
fn launch_tree(env: &WorkerEnv, l: &Launch) -> Result<Option<PathBuf>, String> {
    let Some(t) = l.route.tree.as_deref() else {
        return Ok(None);
    };
    let t = PathBuf::from(t);
    let trees = env.state_dir.join("trees");
    let is_dir = std::fs::symlink_metadata(&t).is_ok_and(|m| m.is_dir());
    if !t.starts_with(&trees) || t == trees || !is_dir {
        return Err(format!(
            "tree {}: not a working tree beneath {}",
            t.display(),
            trees.display()
        ));
    }
    Ok(Some(t))
}

/// Narrow the worker's view as the machine allows and its route asks: the state directory
/// hidden, and where the route says so no network and the project read-only. A route that
/// asks for what this machine cannot give does not start its worker.
fn confine(env: &WorkerEnv, l: &Launch, cmd: &mut tokio::process::Command) -> Result<(), String> {
    let no_network = l.route.network.as_deref() == Some("none");
    let read_only = match (l.route.project.as_deref(), &l.project_root) {
        (Some("read_only"), Some(Ok(root))) => Some(root.as_str()),
        (Some("read_only"), Some(Err(why))) => {
            return Err(format!("project = \"read_only\": the project root: {why}"));
        }
        _ => None,
    };
    let tree = launch_tree(env, l)?;
    let Some(support) = &env.confine else {
        return match (no_network, read_only) {
            (false, None) => Ok(()),
            (true, _) => {
                Err("network = \"none\" needs namespaces this machine does not allow".into())
            }
            (_, Some(_)) => {
                Err("project = \"read_only\" needs namespaces this machine does not allow".into())
            }
        };
    };
    let mut c = room_exec::confine::Confinement::new(&env.state_dir, &l.id, &env.socket)
        .map_err(|e| format!("the launch's confinement: {e}"))?;
    if support.no_pid_namespace.is_some() {
        c = c.without_pid_namespace();
    }
    c = c
        .cwd(&launch_cwd(env, l))
        .map_err(|e| format!("the launch's confinement: its cwd: {e}"))?;
    if let Some(bridge) = &env.staged {
        c = c
            .bridge(&bridge.path, bridge.identity())
            .map_err(|e| format!("the launch's confinement: the bridge: {e}"))?;
    }
    if no_network {
        c = c.without_network();
    }
    if let Some(root) = read_only {
        c = c
            .read_only(Path::new(root))
            .map_err(|e| format!("the launch's confinement: the project root: {e}"))?;
    }
    if let Some(t) = &tree {
        // a delegated worker writes its tree only while its principal holds project:write
        c = if l.access.project_write {
            c.writable_within(t)
        } else {
            c.read_only(t)
        }
        .map_err(|e| format!("the launch's confinement: its working tree: {e}"))?;
    }
    c = c
        .hiding(&env.hidden.list())
        .map_err(|e| format!("the launch's confinement: hidden directories: {e}"))?;
    c.prepare(cmd.as_std_mut());
    Ok(())
}

type Started = (
    tokio::process::Child,
    u32,
    Job,
    Option<(tokio::net::UnixListener, room_exec::bridge::Pinned)>,
);

/// The programs the launch's broker admits: the route's program, the staged bridge (Room's
/// binary, which `room mcp` and `room api` run) and the route's `broker_programs`.
fn broker_programs(env: &WorkerEnv, l: &Launch) -> Result<room_exec::bridge::Pinned, String> {
    let mut paths = vec![program(l, env)?.0];
    paths.extend(l.route.broker_programs.iter().map(PathBuf::from));
    let pinned = room_exec::bridge::Pinned::pin(&paths)?;
    match &env.staged {
        Some(staged) => pinned.with_bridge(staged),
        None => Ok(pinned),
    }
}

/// Make the launch's directory and job and spawn its worker inside the job. The job comes
/// back on every path where one was made, for the caller to stop.
fn start_job(env: &WorkerEnv, l: &Launch) -> (Result<Started, String>, Option<Job>) {
    let dir = match worker_dir(&env.state_dir, &l.id) {
        Ok(d) => d,
        Err(e) => return (Err(e.to_string()), None),
    };
    let cwd = launch_cwd(env, l);
    let pinned = match broker_programs(env, l) {
        Ok(p) => p,
        Err(e) => return (Err(e), None),
    };
    let broker = match bind_broker(&dir) {
        Ok(b) => (b, pinned),
        Err(e) => return (Err(e), None),
    };
    let mut cmd = match command(env, l, &dir, &cwd) {
        Ok(c) => c,
        Err(e) => return (Err(e), None),
    };
    let job = match env.jobs.create(&l.id) {
        Ok(j) => j,
        Err(e) => return (Err(format!("the launch's job: {e}")), None),
    };
    job.prepare(cmd.as_std_mut());
    if let Err(e) = confine(env, l, &mut cmd) {
        return (Err(e), Some(job));
    }
    let spawned = cmd.spawn();
    // the command holds the leaf's cgroup.procs open for the child; no longer needed
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let prog = l.route.command.first().map_or("room", |p| p.as_str());
            return (Err(format!("{prog}: {e}")), Some(job));
        }
    };
    if let Err(e) = pump_outputs(&mut child, &dir, l.route.adapter != "acp") {
        return (Err(format!("the worker's output files: {e}")), Some(job));
    }
    let Some(pid) = child.id() else {
        return (
            Err("the worker exited before its pid was read".into()),
            Some(job),
        );
    };
    (Ok((child, pid, job, Some(broker))), None)
}

/// Start copying the worker's stderr (and, unless its adapter speaks on it, its stdout) into
/// `stderr.log` and `stdout.log` of its directory, bounded.
fn pump_outputs(
    child: &mut tokio::process::Child,
    dir: &Path,
    stdout_too: bool,
) -> std::io::Result<()> {
    let err = std::fs::File::create(dir.join("stderr.log"))?;
    if let Some(src) = child.stderr.take() {
        tokio::spawn(pump_bounded(src, err));
    }
    if stdout_too {
        let out = std::fs::File::create(dir.join("stdout.log"))?;
        if let Some(src) = child.stdout.take() {
            tokio::spawn(pump_bounded(src, out));
        }
    }
    Ok(())
}

/// Stage the task's selections into `workers/<launch>/stage/` before the worker exists; the
/// manifest rides in its wake prompt (`staged`).
async fn stage_launch(
    env: &WorkerEnv,
    l: &Launch,
    st: room_engine::dispatch::Staging,
) -> Result<Value, String> {
    if let Some(why) = st.refused {
        return Err(format!("staging: the project root: {why}"));
    }
    let dir = worker_dir(&env.state_dir, &l.id).map_err(|e| e.to_string())?;
    blocking(move || {
        room_exec::staging::stage(Path::new(&st.root), &dir.join("stage"), &st.selections)
            .map_err(|e| format!("staging: {e}"))
    })
    .await
}

/// The launch's broker socket, `workers/<launch>/broker.sock` (mode 0600), bound before its
/// worker starts: the worker's only road to Room (confined, it is the `room.sock` it sees).
fn bind_broker(dir: &Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("broker.sock");
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path).map_err(|e| format!("the broker: {e}"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("the broker: {e}"))?;
    Ok(l)
}

/// Serve a launch's broker: a connection is admitted only from a process inside the launch's
/// job (`SO_PEERCRED`, then the job's own kernel object) that runs a program pinned for the
/// launch (`room_exec::bridge`); anything else is answered `broker_peer_refused` and closed.
/// The same check runs again before each request of an admitted connection.
/// An admitted one is served as the daemon's socket is, as a worker (never the owner), and
/// only under the launch's own credential.
async fn serve_broker(
    engine: Arc<Engine>,
    listener: tokio::net::UnixListener,
    launch: String,
    (member, pinned): (room_exec::job::Membership, room_exec::bridge::Pinned),
    limits: crate::daemon::Limits,
) {
    let conns = crate::daemon::Conns::new("broker", &limits, None);
    let draining = Arc::new(tokio::sync::Semaphore::new(REFUSED_DRAINING_MAX));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let pid = stream
            .peer_cred()
            .ok()
            .and_then(|c| c.pid())
            .map_or(0, |p| p.cast_unsigned());
        // a response leaves only as fast as the worker takes it, so that a revocation while it
        // is partly written still cuts it (`daemon::write_severable`)
        if let Err(e) =
            rustix::net::sockopt::set_socket_send_buffer_size(&stream, BROKER_SNDBUF_BYTES)
        {
            tracing::warn!(launch = %launch, "broker: the send buffer keeps its size: {e}");
        }
        let check = peer_check(&launch, pid, &member, &pinned);
        let checked = {
            let check = check.clone();
            tokio::task::spawn_blocking(move || check()).await
        };
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(r)) => {
                // a refused peer's read side stays open a moment, for a few at a time: past
                // them, one refusal closes at once (no peer holds descriptors by connecting)
                let drain = draining.clone().try_acquire_owned().ok();
                tokio::spawn(refuse_peer(stream, *r, drain));
                continue;
            }
            Err(e) => {
                tracing::error!(launch = %launch, "broker: the peer check panicked: {e}");
                continue;
            }
        }
        let Some(ticket) = conns.admit(format!("pid {pid}")) else {
            continue;
        };
        let evidence = room_engine::Evidence::Worker {
            launch: Some(launch.clone()),
            pid,
        };
        let engine = engine.clone();
        tokio::spawn(async move {
            let _ =
                crate::daemon::connection(stream, engine, evidence, ticket, limits, Some(check))
                    .await;
        });
    }
}

/// The check a broker peer passes at connect and again before each request: a process of
/// the launch's job (`Membership`) that runs a program pinned for the launch.
fn peer_check(
    launch: &str,
    pid: u32,
    member: &room_exec::job::Membership,
    pinned: &room_exec::bridge::Pinned,
) -> crate::daemon::PeerCheck {
    let (launch, m, p) = (launch.to_string(), member.clone(), pinned.clone());
    std::sync::Arc::new(move || {
        let (reason, why) = if !m.contains(pid) {
            (
                "outside_job",
                "it is not a process of the launch's job".to_string(),
            )
        } else {
            match p.admits(pid) {
                Ok(()) => return Ok(()),
                Err(why) => ("program", why),
            }
        };
        tracing::warn!(launch = %launch, pid, reason, "broker: a peer was refused: {why}");
        Err(Box::new(crate::wire::Response::refused(
            room_core::Refusal::new(
                room_core::Code::BrokerPeerRefused,
                format!("pid {pid} may not reach launch {launch}'s broker: {why}"),
            )
            .detail(json!({"launch": launch, "pid": pid, "reason": reason}))
            .hint("reach Room through the room binary (room mcp, room api) or name the program in the route's broker_programs"),
        )))
    })
}

/// Answer a refused peer and close. The refusal comes at connect, before the peer has sent
/// anything, so the read side stays open a moment (at most `REFUSED_DRAIN_BYTES`, one
/// second in all) for the request it sends meanwhile: a peer that writes first then reads
/// its refusal instead of dying of a broken pipe.
async fn refuse_peer(
    mut stream: tokio::net::UnixStream,
    r: crate::wire::Response,
    drain: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    use tokio::io::AsyncReadExt;
    let mut bytes = serde_json::to_vec(&r).expect("responses serialize");
    bytes.push(b'\n');
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        stream.write_all(&bytes).await?;
        if drain.is_none() {
            return Ok(());
        }
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0usize;
        while drained < REFUSED_DRAIN_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// What a refused broker peer may still send before its connection closes.
const REFUSED_DRAIN_BYTES: usize = 64 * 1024;
/// Refused peers of one broker whose connections are kept readable at once.
const REFUSED_DRAINING_MAX: usize = 8;

/// The split-lock claim (the permit is read again before the worker's credential works), then
/// the adapter.
async fn claim_and_run(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
    child: &mut tokio::process::Child,
    pid: u32,
    cwd: PathBuf,
) -> Result<Result<Exit, String>, Unclaimed> {
    let claimed = {
        let engine = engine.clone();
        let id = l.id.clone();
        tokio::task::spawn_blocking(move || engine.launch_started(&id, Some(pid)))
            .await
            .map_err(|e| Unclaimed(e.to_string()))?
    };
    claimed.map_err(|r| Unclaimed(r.to_string()))?;
    Ok(if l.route.adapter == "acp" {
        Ok(acp_turn(env, l, child, cwd).await)
    } else {
        one_shot(l, child).await
    })
}

/// A one-shot worker: the wake on stdin, then its exit or its deadline.
async fn one_shot(l: &Launch, child: &mut tokio::process::Child) -> Result<Exit, String> {
    if let Some(mut stdin) = child.stdin.take() {
        let mut prompt = serde_json::to_vec(&l.prompt).expect("prompts serialize");
        prompt.push(b'\n');
        // a worker that does not read its prompt is still a worker; its exit decides
        let _ = stdin.write_all(&prompt).await;
    }
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(time_left_ms(l)),
        child.wait(),
    )
    .await;
    match waited {
        Ok(Ok(status)) => Ok(Exit::process(status.code(), false)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Ok(Exit::process(None, true)),
    }
}

/// One ACP turn with the started agent, then its whole group is stopped: an ACP agent does
/// not exit by itself (nor when its stdin closes).
async fn acp_turn(
    env: &WorkerEnv,
    l: &Launch,
    child: &mut tokio::process::Child,
    cwd: PathBuf,
) -> Exit {
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Exit::process(None, false);
    };
    let room_exe = env
        .bridge_path()
        .expect("program() refuses the acp adapter without the staged bridge");
    let preset = l.route.preset.as_deref().and_then(acp::preset);
    let left = time_left_ms(l);
    let grace = acp::CANCEL_GRACE_MS.min(left / 2);
    let turn = acp::Turn {
        cwd: cwd.clone(),
        mcp_servers: vec![acp::StdioServer {
            name: "room".into(),
            command: room_exe,
            args: vec!["mcp".into()],
            env: vec![
                ("ROOM_TOKEN".into(), l.token.clone()),
                ("ROOM_STATE_DIR".into(), env.state_dir.display().to_string()),
                (
                    "ROOM_SOCKET".into(),
                    worker_socket(env, &env.state_dir.join("workers").join(&l.id))
                        .display()
                        .to_string(),
                ),
                ("ROOM_LAUNCH".into(), l.id.clone()),
            ],
        }],
        prompt: prompt_blocks(&l.prompt),
        authenticate: preset.and_then(|p| p.authenticate).map(String::from),
        resume: l.resume.clone(),
        permissions: match l.route.permissions.as_deref() {
            Some("allow_once") => acp::Permissions::AllowOnce,
            _ => acp::Permissions::Reject,
        },
        tool_kinds: l.access.tool_kinds(&l.route),
        turn_ms: left - grace,
        cancel_grace_ms: grace,
    };
    let report = acp::run(stdin, stdout, turn).await;
    // the agent's own words, for an orchestrator's turn to be checked against its dispatches
    crate::collab::steer::turn_said(&l.token, &report.said);
    let code = child.try_wait().ok().flatten().and_then(|s| s.code());
    if let Some(e) = &report.error {
        tracing::warn!(launch = %l.id, "acp turn: {e}");
    }
    Exit {
        code,
        timed_out: report.timed_out,
        delivery: match report.proven() {
            acp::Proven::Nothing => Delivery::Dispatched,
            acp::Proven::Delivered => Delivery::DeliveredToBody,
            acp::Proven::TurnEnded => Delivery::BodyVisible,
            acp::Proven::WrongBody => Delivery::WrongBody,
        },
        session: report.session.clone().map(|native| SessionSeen {
            host: l.route.preset.clone().unwrap_or_else(|| "acp".into()),
            native,
            cwd: cwd.display().to_string(),
            transport: "acp_stdio".into(),
            loadable: report.load_session,
        }),
        detail: serde_json::to_value(&report).expect("reports serialize"),
        job: serde_json::Value::Null,
    }
}

/// The wake as an agent reads it: what is asked, how to answer, and the wake itself as JSON.
fn prompt_blocks(wake: &serde_json::Value) -> Vec<String> {
    let said = format!(
        "Room woke you. {from} asks in room {room}: {prompt}\n\nCatch up with the room_sync \
         tool of the `room` MCP server, then answer each obligation below with room_reply \
         (reply_to: the obligation id). The wake follows as JSON.",
        from = wake["from"].as_str().unwrap_or("someone"),
        room = wake["room"].as_str().unwrap_or("?"),
        prompt = wake["prompt"].as_str().unwrap_or(""),
    );
    vec![said, wake.to_string()]
}

/// Stop the job and say what was observed: its kind, and whether zero processes were seen.
/// The job comes back when it was not seen empty.
async fn stop(mut job: Job) -> (Option<Job>, serde_json::Value) {
    let s = tokio::task::spawn_blocking(move || {
        let s = job.stop(STOP_WAIT_MS);
        (job, s)
    })
    .await;
    let Ok((job, s)) = s else {
        tracing::error!("stopping a worker's job panicked");
        return (None, serde_json::json!({"confirmed_empty": false}));
    };
    if !s.confirmed_empty {
        tracing::error!(
            remaining = ?s.remaining,
            "a worker's job still holds processes after SIGKILL"
        );
    }
    let observed = serde_json::json!({"kind": s.kind.as_str(), "confirmed_empty": s.confirmed_empty,
        "remaining": s.remaining, "waited_ms": s.waited_ms});
    ((!s.confirmed_empty).then_some(job), observed)
}

/// The outbox of this daemon's stops.
fn outbox(env: &WorkerEnv) -> Outbox {
    Outbox::new(env.state_dir.join("stops"))
}

/// A phase file: what the record says, readable on its own, with the envelope to commit.
fn phase_doc(e: &StopEnvelope, job: &Value) -> Result<Value, String> {
    let rec = e.record().map_err(|r| r.to_string())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(json!({
        "schema": room_exec::stop::STOP_SCHEMA, "stop": e.stop, "phase": rec.phase,
        "room": e.room, "launch": rec.launch, "agent": rec.agent, "reason": rec.reason,
        "termination_confirmed": rec.termination_confirmed, "pending": rec.pending,
        "predecessor": rec.predecessor, "observed": rec.observed, "job": job,
        "written_ms": now, "event_id": e.event_id, "envelope_sha256": e.envelope_sha256,
        "envelope": e,
    }))
}

/// Run `f` on the blocking pool; a panic is an error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("panicked: {e}"))?
}

/// Commit one phase's record and mark it committed.
async fn commit_phase(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    e: &StopEnvelope,
) -> Result<(), String> {
    let (engine, ob, e) = (engine.clone(), outbox(env), e.clone());
    blocking(move || {
        engine.stop_commit(&e).map_err(|r| r.to_string())?;
        let phase = e.record().map_err(|r| r.to_string())?.phase;
        ob.mark_committed(&e.stop, phase, &e.event_id)
            .map_err(|x| x.to_string())
    })
    .await
}

/// Stop a launch whose authority tripped, through the two-phase outbox: phase 1 on disk and
/// committed before the kill, phase 2 only once zero processes were observed in its job.
/// A job never seen empty keeps its launch unconfirmed and its stop at phase 1.
async fn stop_with_outbox(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
    job: Option<Job>,
    t: Trip,
) {
    let job_doc = json!({"kind": job.as_ref().map_or("none", |j| j.kind().as_str()),
        "pid": job.as_ref().and_then(Job::leader)});
    let p1 = engine.stop_phase1(&t);
    let written = match phase_doc(&p1, &job_doc) {
        Ok(doc) => {
            let (ob, stop) = (outbox(env), p1.stop.clone());
            blocking(move || ob.write_phase1(&stop, &doc).map_err(|e| e.to_string())).await
        }
        Err(e) => Err(e),
    };
    // an outbox that cannot be written still stops the worker; it only cannot prove it later
    let recorded = match written {
        Ok(()) => {
            fault("stop_after_phase1");
            match commit_phase(engine, env, &p1).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(launch = %l.id, stop = %p1.stop, "phase 1 not committed (the next start commits it): {e}");
                    true
                }
            }
        }
        Err(e) => {
            tracing::error!(launch = %l.id, "the stop outbox could not be written: {e}");
            false
        }
    };
    let observed = match job {
        Some(job) => match stop_until_confirmed(engine, l, job).await {
            Some(o) => o,
            // not seen empty: the launch stays unconfirmed, the stop at phase 1
            None => return,
        },
        None => json!({"kind": "none", "confirmed_empty": true, "remaining": [],
            "why": "an api launch runs no process: its request was dropped"}),
    };
    let mut stop = Value::Null;
    if recorded {
        match finish_stop(engine, env, &p1, observed.clone(), &job_doc).await {
            Ok(()) => stop = json!(p1.stop),
            Err(e) => tracing::error!(launch = %l.id, stop = %p1.stop, "phase 2: {e}"),
        }
    }
    let (engine, id, reason) = (engine.clone(), l.id.clone(), t.reason);
    let stop_id = stop.as_str().unwrap_or("").to_string();
    match tokio::task::spawn_blocking(move || {
        engine.launch_stopped(&id, reason, &stop_id, observed)
    })
    .await
    {
        Ok(Ok(v)) => tracing::info!(launch = %l.id, "launch stopped: {v}"),
        Ok(Err(r)) => tracing::error!(launch = %l.id, "launch stop not recorded: {r}"),
        Err(e) => tracing::error!(launch = %l.id, "launch stop panicked: {e}"),
    }
}

/// Phase 2 of a stop whose zero processes were observed: written, then committed.
async fn finish_stop(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    p1: &StopEnvelope,
    observed: Value,
    job_doc: &Value,
) -> Result<(), String> {
    let p2 = engine
        .stop_phase2(p1, observed)
        .map_err(|r| r.to_string())?;
    let doc = phase_doc(&p2, job_doc)?;
    let (ob, stop) = (outbox(env), p2.stop.clone());
    blocking(move || ob.write_phase2(&stop, &doc).map_err(|e| e.to_string())).await?;
    fault("stop_after_phase2");
    commit_phase(engine, env, &p2).await
}

/// At start: commit, in causal order, every stop record a crash left written but not
/// committed, and finish each stop left at phase 1 whose job is seen empty now (after the
/// previous daemon's jobs were reaped). Phase 2 is never committed before its phase 1.
async fn replay_stops(engine: &Arc<Engine>, env: &WorkerEnv) {
    let ob = outbox(env);
    let pending = match blocking(move || ob.pending().map_err(|e| e.to_string())).await {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("the stop outbox could not be read: {e}");
            return;
        }
    };
    for s in pending {
        if let Err(e) = replay_stop(engine, env, &s).await {
            tracing::error!(stop = %s.stop, "stop not replayed: {e}");
        }
    }
}

async fn replay_stop(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    s: &room_exec::stop::StopFiles,
) -> Result<(), String> {
    let envelope = |doc: &Option<Value>| -> Result<Option<StopEnvelope>, String> {
        doc.as_ref()
            .map(|d| serde_json::from_value(d["envelope"].clone()).map_err(|e| e.to_string()))
            .transpose()
    };
    let p1 = envelope(&s.phase1)?.ok_or("phase 2 without its phase 1")?;
    if !s.committed[0] {
        commit_phase(engine, env, &p1).await?;
        tracing::warn!(stop = %s.stop, "replayed phase 1");
    }
    if let Some(p2) = envelope(&s.phase2)? {
        if !s.committed[1] {
            commit_phase(engine, env, &p2).await?;
            tracing::warn!(stop = %s.stop, "replayed phase 2");
        }
        return Ok(());
    }
    let doc1 = s.phase1.as_ref().expect("p1 came from it");
    let rec = p1.record().map_err(|r| r.to_string())?;
    let (jobs, launch) = (env.jobs.clone(), rec.launch.clone());
    let pid = doc1["job"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok());
    let kind = doc1["job"]["kind"].as_str().unwrap_or("none").to_string();
    let seen = blocking(move || Ok(jobs.observe_empty(&launch, &kind, pid))).await?;
    match seen {
        Some(o) if o.confirmed_empty => {
            let observed = json!({"kind": o.kind.as_str(), "confirmed_empty": true,
                "remaining": o.remaining, "waited_ms": o.waited_ms, "at": "restart"});
            finish_stop(engine, env, &p1, observed, &doc1["job"]).await?;
            tracing::warn!(stop = %s.stop, "a stop left at phase 1 saw its job empty at this start");
            Ok(())
        }
        _ => Err("its job is not seen empty: termination stays unconfirmed".into()),
    }
}

/// The owner's view of the outbox: every stop, newest first, with its phases.
pub(crate) fn stops_view(engine: &Engine) -> Result<Value, room_core::Refusal> {
    let ob = Outbox::new(engine.state().root.join("stops"));
    let stops = ob.list(256).map_err(room_core::Refusal::storage)?;
    let rows: Vec<Value> = stops
        .iter()
        .map(|s| {
            let p = |d: &Option<Value>| {
                d.as_ref().map(|d| {
                    json!({"event_id": d["event_id"], "termination_confirmed": d["termination_confirmed"],
                    "pending": d["pending"], "predecessor": d["predecessor"], "observed": d["observed"]})
                })
            };
            let d1 = s.phase1.as_ref();
            json!({"stop": s.stop, "launch": d1.map(|d| &d["launch"]), "room": d1.map(|d| &d["room"]),
                "agent": d1.map(|d| &d["agent"]), "reason": d1.map(|d| &d["reason"]),
                "phase_1": p(&s.phase1), "phase_2": p(&s.phase2),
                "committed": {"phase_1": s.committed[0], "phase_2": s.committed[1]},
                "termination_confirmed": s.phase2.is_some()})
        })
        .collect();
    Ok(json!({"stops": rows}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_share_is_counted_whole_or_said_to_be_a_lower_bound() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            let d = dir.path().join(format!("lch_{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stdout.log"), vec![0u8; 100]).unwrap();
        }
        assert_eq!(tree_bytes(dir.path(), 100), (500, true));
        let (bytes, whole) = tree_bytes(dir.path(), 4);
        assert!(!whole);
        assert!(bytes < 500);
    }
}
