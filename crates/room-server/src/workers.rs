//! The dispatcher loop: woken by every call that may have queued a wake permit (and once a
//! second), it asks the engine for launches (`Engine::dispatch_take`: revalidation, routes,
//! busy recipients, the cooldown) and runs each one's worker process. The engine decides;
//! this module only starts processes, reports their pids (the split-lock claim) and exits,
//! and stops their process groups.
//!
//! A worker runs in its own process group with an empty environment except the names its
//! route lists and `ROOM_TOKEN` (its one-launch credential), `ROOM_STATE_DIR`, `ROOM_SOCKET`
//! and `ROOM_LAUNCH`; the wake prompt (JSON) is its stdin; its stdout and stderr go to
//! `<state>/workers/<launch>/`. At its deadline the whole group is killed, and a launch ends
//! only once no process of the group is left.

use room_engine::Engine;
use room_engine::dispatch::{Exit, Launch};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// How long a stopped group may take to be seen empty.
const STOP_WAIT_MS: u64 = 5_000;

/// Where the dispatcher finds what it launches.
#[derive(Debug, Clone)]
pub struct WorkerEnv {
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// The `room` binary, which the `script` adapter runs as `room agent-script`.
    pub room_exe: Option<PathBuf>,
}

/// Run the dispatcher until the task is aborted.
pub async fn run(engine: Arc<Engine>, env: WorkerEnv) {
    let mut changes = crate::dispatch::changes().subscribe();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    {
        let engine = engine.clone();
        match tokio::task::spawn_blocking(move || engine.recover_launches()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::warn!("{n} launches of a previous daemon ended as interrupted"),
            Ok(Err(r)) => tracing::error!("launch recovery failed: {r}"),
            Err(e) => tracing::error!("launch recovery panicked: {e}"),
        }
    }
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = changes.changed() => if r.is_err() { return },
        }
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
        for l in launches {
            tokio::spawn(run_launch(engine.clone(), env.clone(), l));
        }
    }
}

/// The program and arguments a launch runs.
fn program(l: &Launch, env: &WorkerEnv) -> Result<(PathBuf, Vec<String>), String> {
    match l.route.adapter.as_str() {
        "command" => {
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
    let exit = match start_and_wait(&engine, &env, &l).await {
        Ok(exit) => exit,
        Err(why) => {
            tracing::warn!(launch = %l.id, "worker did not run: {why}");
            Exit {
                code: None,
                timed_out: false,
            }
        }
    };
    let id = l.id.clone();
    match tokio::task::spawn_blocking(move || engine.launch_ended(&id, exit)).await {
        Ok(Ok(v)) => tracing::info!(launch = %l.id, agent = %l.agent, "launch ended: {v}"),
        Ok(Err(r)) => tracing::error!(launch = %l.id, "launch end not recorded: {r}"),
        Err(e) => tracing::error!(launch = %l.id, "launch end panicked: {e}"),
    }
}

fn worker_dir(state: &Path, launch: &str) -> std::io::Result<PathBuf> {
    let dir = state.join("workers").join(launch);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    Ok(dir)
}

async fn start_and_wait(engine: &Arc<Engine>, env: &WorkerEnv, l: &Launch) -> Result<Exit, String> {
    let (prog, args) = program(l, env)?;
    let dir = worker_dir(&env.state_dir, &l.id).map_err(|e| e.to_string())?;
    let out = std::fs::File::create(dir.join("stdout.log")).map_err(|e| e.to_string())?;
    let err = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
    let mut cmd = tokio::process::Command::new(&prog);
    cmd.args(&args)
        .env_clear()
        .current_dir(l.route.cwd.as_deref().map(Path::new).unwrap_or(&dir))
        .stdin(std::process::Stdio::piped())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(false);
    for name in &l.route.env {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    cmd.env("ROOM_TOKEN", &l.token)
        .env("ROOM_STATE_DIR", &env.state_dir)
        .env("ROOM_SOCKET", &env.socket)
        .env("ROOM_LAUNCH", &l.id);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", prog.display()))?;
    let pid = child
        .id()
        .ok_or("the worker exited before its pid was read")?;
    // the split-lock claim: the permit is read again before the worker's credential works
    let claimed = {
        let engine = engine.clone();
        let id = l.id.clone();
        tokio::task::spawn_blocking(move || engine.launch_started(&id, pid))
            .await
            .map_err(|e| e.to_string())?
    };
    if let Err(r) = claimed {
        stop(pid).await;
        let _ = child.wait().await;
        return Err(r.to_string());
    }
    if let Some(mut stdin) = child.stdin.take() {
        let mut prompt = serde_json::to_vec(&l.prompt).expect("prompts serialize");
        prompt.push(b'\n');
        // a worker that does not read its prompt is still a worker; its exit decides
        let _ = stdin.write_all(&prompt).await;
    }
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(l.deadline_ms),
        child.wait(),
    )
    .await;
    let exit = match waited {
        Ok(Ok(status)) => Exit {
            code: status.code(),
            timed_out: false,
        },
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => Exit {
            code: None,
            timed_out: true,
        },
    };
    // whatever the leader did, nothing of its group outlives the launch
    stop(pid).await;
    let _ = child.wait().await;
    Ok(exit)
}

async fn stop(pgid: u32) {
    let empty = tokio::task::spawn_blocking(move || room_exec::stop_group(pgid, STOP_WAIT_MS))
        .await
        .unwrap_or(false);
    if !empty {
        tracing::error!(
            pgid,
            "a worker's process group is still not empty after SIGKILL"
        );
    }
}
