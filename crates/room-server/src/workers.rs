//! The dispatcher loop: woken by every call that may have queued a wake permit (and once a
//! second), it asks the engine for launches (`Engine::dispatch_take`: revalidation, routes,
//! busy recipients, the cooldown) and runs each one's worker process. The engine decides;
//! this module only starts processes, reports their pids (the split-lock claim) and exits,
//! and stops their process groups.
//!
//! A worker runs in an owned job (`room_exec::job`: a cgroup v2 leaf of its own where the
//! daemon can make one, else its process group) with an empty environment except the names its
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
use room_exec::job::{Job, Jobs};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// How long a stopped group may take to be seen empty.
pub(crate) const STOP_WAIT_MS: u64 = 5_000;
/// Stops tried again, a second apart, for a job not seen empty.
const STOP_RETRIES: u32 = 60;

/// Where the dispatcher finds what it launches.
#[derive(Debug, Clone)]
pub struct WorkerEnv {
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// The `room` binary, which the `script` adapter runs as `room agent-script`.
    pub room_exe: Option<PathBuf>,
    /// Where workers' owned jobs are made.
    pub jobs: Jobs,
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
        let engine = engine.clone();
        match tokio::task::spawn_blocking(move || engine.recover_launches()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::warn!("{n} launches of a previous daemon ended as interrupted"),
            Ok(Err(r)) => tracing::error!("launch recovery failed: {r}"),
            Err(e) => tracing::error!("launch recovery panicked: {e}"),
        }
    }
    let mut full = false;
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
        let launches = match tokio::task::spawn_blocking(move || engine2.dispatch_take()).await {
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
            tokio::spawn(run_launch(engine.clone(), env.clone(), l));
        }
    }
}

/// The program and arguments a launch runs.
fn program(l: &Launch, env: &WorkerEnv) -> Result<(PathBuf, Vec<String>), String> {
    match l.route.adapter.as_str() {
        "command" | "acp" => {
            if l.route.adapter == "acp" && env.room_exe.is_none() {
                return Err("the acp adapter gives the agent Room's MCP server, the room binary, which this daemon does not know".into());
            }
            let (p, args) = l.route.command.split_first().ok_or("an empty command")?;
            Ok((PathBuf::from(p), args.to_vec()))
        }
        "script" => {
            let exe = env.room_exe.clone().ok_or(
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

async fn run_launch(engine: Arc<Engine>, env: WorkerEnv, l: Launch) {
    let (ran, job) = if matches!(l.route.adapter.as_str(), "openai" | "anthropic") {
        (crate::api_worker::run(&engine, &l).await, None)
    } else {
        start_and_wait(&engine, &env, &l).await
    };
    let mut exit = ran.unwrap_or_else(|why| {
        tracing::warn!(launch = %l.id, "worker did not run: {why}");
        Exit::process(None, false)
    });
    // whatever the worker did, and on every path, nothing of its job outlives the launch
    if let Some(job) = job {
        match stop_until_confirmed(&engine, &l, job).await {
            Some(observed) => exit.job = observed,
            // not seen empty: the launch stays live (busy, counted), never taken for ended
            None => return,
        }
    }
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
    let err = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
    let mut cmd = tokio::process::Command::new(&prog);
    cmd.args(&args)
        .env_clear()
        .current_dir(cwd)
        .stdin(std::process::Stdio::piped())
        .stderr(err)
        .kill_on_drop(false);
    if l.route.adapter == "acp" {
        cmd.stdout(std::process::Stdio::piped());
    } else {
        let out = std::fs::File::create(dir.join("stdout.log")).map_err(|e| e.to_string())?;
        cmd.stdout(out);
    }
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
    cmd.env("ROOM_TOKEN", &l.token)
        .env("ROOM_STATE_DIR", &env.state_dir)
        .env("ROOM_SOCKET", &env.socket)
        .env("ROOM_LAUNCH", &l.id);
    Ok(cmd)
}

/// Start the worker in a job of its own, claim the launch with its pid and run its adapter.
/// The job comes back on every path where one was made, for the caller to stop.
async fn start_and_wait(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
) -> (Result<Exit, String>, Option<Job>) {
    let dir = match worker_dir(&env.state_dir, &l.id) {
        Ok(d) => d,
        Err(e) => return (Err(e.to_string()), None),
    };
    let cwd = l
        .route
        .cwd
        .as_deref()
        .map(PathBuf::from)
        .unwrap_or(dir.clone());
    let mut cmd = match command(env, l, &dir, &cwd) {
        Ok(c) => c,
        Err(e) => return (Err(e), None),
    };
    let mut job = match env.jobs.create(&l.id) {
        Ok(j) => j,
        Err(e) => return (Err(format!("the launch's job: {e}")), None),
    };
    job.prepare(cmd.as_std_mut());
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
    let Some(pid) = child.id() else {
        return (
            Err("the worker exited before its pid was read".into()),
            Some(job),
        );
    };
    job.started(pid);
    let ran = claim_and_run(engine, env, l, &mut child, pid, cwd).await;
    (ran, Some(job))
}

/// The split-lock claim (the permit is read again before the worker's credential works), then
/// the adapter.
async fn claim_and_run(
    engine: &Arc<Engine>,
    env: &WorkerEnv,
    l: &Launch,
    child: &mut tokio::process::Child,
    pid: u32,
    cwd: PathBuf,
) -> Result<Exit, String> {
    let claimed = {
        let engine = engine.clone();
        let id = l.id.clone();
        tokio::task::spawn_blocking(move || engine.launch_started(&id, Some(pid)))
            .await
            .map_err(|e| e.to_string())?
    };
    claimed.map_err(|r| r.to_string())?;
    if l.route.adapter == "acp" {
        Ok(acp_turn(env, l, child, cwd).await)
    } else {
        one_shot(l, child).await
    }
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
        .room_exe
        .clone()
        .expect("program() refuses the acp adapter without the room binary");
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
        turn_ms: left - grace,
        cancel_grace_ms: grace,
    };
    let report = acp::run(stdin, stdout, turn).await;
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
