//! `room mcp`: the stdio MCP server for hosts that launch servers as subprocesses. It keeps
//! stdout for the protocol alone (logs go to stderr), starts a daemon for the state dir when none
//! answers (several bridges starting at once race safely: the daemon lock admits one), and
//! forwards every tool call to the daemon with `ROOM_TOKEN`.

use room_server::client::Client;
use room_server::mcp::{Bridge, RoomMcp, ToolsMode};
use room_server::wire::Request;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// How long a bridge waits for a daemon it started.
const DAEMON_START_MS: u64 = 10_000;

/// Whether a daemon answers on the socket (any well-formed answer counts, even a refusal).
fn ping(sock: &Path) -> bool {
    let req = Request::new("ping", serde_json::json!({}));
    Client::connect(sock).and_then(|mut c| c.call(&req)).is_ok()
}

/// Start `room serve` for `state` unless one answers, and wait for it.
pub fn ensure_daemon(state: &Path) -> anyhow::Result<()> {
    let sock = state.join("room.sock");
    if ping(&sock) {
        return Ok(());
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("daemon.log"))?;
    let exe = std::env::current_exe()?;
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(exe)
        .arg("serve")
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .process_group(0)
        .spawn()?;
    let deadline = std::time::Instant::now() + Duration::from_millis(DAEMON_START_MS);
    while std::time::Instant::now() < deadline {
        if ping(&sock) {
            // The daemon outlives this bridge; reap it only if it already exited.
            let _ = child.try_wait();
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Another bridge's daemon may have won the lock; keep waiting for the socket.
            if !status.success() && !ping(&sock) {
                std::thread::sleep(Duration::from_millis(100));
                if ping(&sock) {
                    return Ok(());
                }
                anyhow::bail!(
                    "the daemon did not start (exit {status}); see {}",
                    state.join("daemon.log").display()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!(
        "no daemon answered within {DAEMON_START_MS} ms; see {}",
        state.join("daemon.log").display()
    )
}

pub fn run(state: &Path, mode: ToolsMode) -> i32 {
    let Some(token) = std::env::var("ROOM_TOKEN").ok().filter(|t| !t.is_empty()) else {
        eprintln!(
            "error: room mcp needs ROOM_TOKEN (the agent's token)\nhint: `room connect HOST AGENT` prints a ready configuration"
        );
        return crate::cmd::EXIT_REFUSED;
    };
    if let Err(e) = ensure_daemon(state) {
        eprintln!("error: {e:#}");
        return crate::cmd::EXIT_IO;
    }
    let session = {
        use room_core::Entropy;
        room_server::daemon::OsEntropy.hex(16)
    };
    let handler = RoomMcp::new(
        Arc::new(Bridge {
            socket: state.join("room.sock"),
            token,
            tier: std::env::var("ROOM_TIER").ok().filter(|t| !t.is_empty()),
        }),
        mode,
        format!("mcp-stdio:{session}"),
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return crate::cmd::EXIT_IO;
        }
    };
    match rt.block_on(room_server::mcp::serve_stdio(handler)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: mcp: {e}");
            crate::cmd::exit_code(&e)
        }
    }
}
