//! `room mcp`: the stdio MCP server for hosts that launch servers as subprocesses. It keeps
//! stdout for the protocol alone (logs go to stderr) and forwards every tool call to the daemon
//! with `ROOM_TOKEN`.
//!
//! When no daemon answers it starts one, but only for a token that authenticates: it takes the
//! daemon lock, checks the token against control.db as the engine would, and only then starts
//! `room serve`, saying so on stderr and in the daemon's log (the daemon outlives the bridge).
//! A token that does not authenticate starts nothing: the bridge still answers, every tool call
//! with that refusal.
//!
//! Every request line gets an answer: a line over `REQUEST_BYTES_MAX` never reaches the MCP
//! layer or the daemon; it is read to its end without being kept and answered with a JSON-RPC
//! error carrying its id and the `payload_too_large` refusal. A line naming a key twice is
//! answered `invalid_argument` the same way.

use room_core::{Code, Refusal};
use room_server::client::Client;
use room_server::mcp::{Backend, Bridge, RoomMcp, ToolsMode};
use room_server::wire::{REQUEST_BYTES_MAX, Request, Response};
use room_store::statedir;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How long a bridge waits for a daemon it started.
const DAEMON_START_MS: u64 = 10_000;

/// JSON-RPC's "Invalid Request".
const JSONRPC_INVALID_REQUEST: i64 = -32600;

/// Whether a daemon answers on the socket (any well-formed answer counts, even a refusal).
fn ping(sock: &Path) -> bool {
    let req = Request::new("ping", serde_json::json!({}));
    Client::connect(sock).and_then(|mut c| c.call(&req)).is_ok()
}

/// What the bridge found before serving.
pub enum Daemon {
    /// A daemon answers (it was running, or this bridge started it).
    Up,
    /// None runs and the token does not authenticate: nothing was started.
    Refused(Refusal),
}

/// Check `token` against the state dir's control store while holding the daemon lock, so that
/// no daemon runs meanwhile. `Ok(None)`: it authenticates; `Ok(Some(r))`: it does not; `Err`:
/// the lock is held (a daemon is starting) or the state dir is unusable.
fn token_refusal(state: &Path, token: &str) -> anyhow::Result<Option<Refusal>> {
    let sd = statedir::validate(state, &statedir::default_bootstrap_path())?;
    let _lock = statedir::lock(&sd)?;
    let store = room_server::daemon::embedded_store(&sd);
    let control = store.open_control()?;
    Ok(room_engine::principal::authenticate_offline(control.as_ref(), token).err())
}

/// The socket to reach Room on: `ROOM_SOCKET` when set (a worker's broker: a launch's
/// credential works nowhere else), else the state dir's.
fn socket(state: &Path) -> std::path::PathBuf {
    std::env::var_os("ROOM_SOCKET")
        .filter(|s| !s.is_empty())
        .map_or_else(|| state.join("room.sock"), std::path::PathBuf::from)
}

/// Start `room serve` for `state` unless one answers, and wait for it; never for a token that
/// does not authenticate.
pub fn ensure_daemon(state: &Path, token: &str) -> anyhow::Result<Daemon> {
    let sock = socket(state);
    if ping(&sock) {
        return Ok(Daemon::Up);
    }
    if sock != state.join("room.sock") {
        // a worker's broker is the launch's own: nothing to start when it does not answer
        anyhow::bail!("ROOM_SOCKET {} does not answer", sock.display());
    }
    match token_refusal(state, token) {
        Ok(Some(r)) => return Ok(Daemon::Refused(r)),
        Ok(None) => {}
        // another bridge's daemon holds the lock: wait for its socket below
        Err(e)
            if e.downcast_ref::<room_store::StoreError>()
                .is_some_and(|e| matches!(e, room_store::StoreError::Locked { .. })) =>
        {
            return wait_for(&sock, state, None);
        }
        Err(e) => return Err(e),
    }
    let log_path = state.join("daemon.log");
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let exe = std::env::current_exe()?;
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let child = Command::new(exe)
        .arg("serve")
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log.try_clone()?))
        .process_group(0)
        .spawn()?;
    let started = format!(
        "room mcp (pid {}) started a daemon (pid {}) for {}: it keeps serving after the bridge exits; stop it with `kill {}`",
        std::process::id(),
        child.id(),
        state.display(),
        child.id()
    );
    let _ = writeln!(log, "{started}");
    tracing::warn!("{started}; its log is {}", log_path.display());
    eprintln!("room mcp: {started}; its log is {}", log_path.display());
    wait_for(&sock, state, Some(child))
}

fn wait_for(
    sock: &Path,
    state: &Path,
    mut child: Option<std::process::Child>,
) -> anyhow::Result<Daemon> {
    let deadline = std::time::Instant::now() + Duration::from_millis(DAEMON_START_MS);
    while std::time::Instant::now() < deadline {
        if ping(sock) {
            // The daemon outlives this bridge; reap it only if it already exited.
            if let Some(c) = child.as_mut() {
                let _ = c.try_wait();
            }
            return Ok(Daemon::Up);
        }
        if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
            // Another bridge's daemon may have won the lock; keep waiting for the socket.
            if !status.success() && !ping(sock) {
                std::thread::sleep(Duration::from_millis(100));
                if ping(sock) {
                    return Ok(Daemon::Up);
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

/// Every call answered with one refusal (the token did not authenticate; nothing runs).
struct Refusing(Refusal);

impl Backend for Refusing {
    fn call(&self, _req: Request, _bearer: Option<String>) -> Response {
        Response::refused(self.0.clone())
    }
}

pub fn run(state: &Path, mode: ToolsMode) -> i32 {
    let Some(token) = std::env::var("ROOM_TOKEN").ok().filter(|t| !t.is_empty()) else {
        eprintln!(
            "error: room mcp needs ROOM_TOKEN (the agent's token)\nhint: `room connect HOST AGENT` prints a ready configuration"
        );
        return crate::cmd::EXIT_REFUSED;
    };
    let backend: Arc<dyn Backend> = match ensure_daemon(state, &token) {
        Ok(Daemon::Up) => Arc::new(Bridge {
            socket: socket(state),
            token,
            tier: std::env::var("ROOM_TIER").ok().filter(|t| !t.is_empty()),
        }),
        Ok(Daemon::Refused(r)) => {
            eprintln!("room mcp: {r}\nno daemon runs and none was started for this token");
            Arc::new(Refusing(r))
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return crate::cmd::EXIT_IO;
        }
    };
    let session = {
        use room_core::Entropy;
        room_server::daemon::OsEntropy.hex(16)
    };
    let handler = RoomMcp::new(backend, mode, format!("mcp-stdio:{session}"));
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
    match rt.block_on(serve_framed(handler)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: mcp: {e}");
            crate::cmd::exit_code(&e)
        }
    }
}

/// Serve `handler` on stdin/stdout with Room's own framing in front of rmcp's: lines the daemon
/// would refuse are answered here, so every request gets an answer.
async fn serve_framed(handler: RoomMcp) -> Result<(), room_server::ServerError> {
    use rmcp::ServiceExt;
    let mcp = |e: &dyn std::fmt::Display| room_server::ServerError::Mcp(e.to_string());
    let (mut to_rmcp, rmcp_in) = tokio::io::duplex(64 << 10);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(64 << 10);
    // whole lines only reach stdout: rmcp's answers and this layer's
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if out.write_all(&line).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
    });
    tokio::spawn({
        let tx = tx.clone();
        async move {
            let mut r = BufReader::new(from_rmcp);
            loop {
                let mut line = Vec::new();
                match r.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    });
    let reader = tokio::spawn(async move {
        let mut stdin = BufReader::with_capacity(64 << 10, tokio::io::stdin());
        loop {
            match read_line_bounded(&mut stdin, REQUEST_BYTES_MAX).await {
                Ok(Line::Eof) | Err(_) => break,
                Ok(Line::Whole(line)) => match refusal_of(&line) {
                    Some((id, r)) => {
                        if tx.send(jsonrpc_error(id, &r)).await.is_err() {
                            break;
                        }
                    }
                    None => {
                        if to_rmcp.write_all(&line).await.is_err() {
                            break;
                        }
                    }
                },
                Ok(Line::Oversized { id, bytes }) => {
                    let r = Refusal::new(
                        Code::PayloadTooLarge,
                        format!("request of {bytes} bytes is over {REQUEST_BYTES_MAX} bytes"),
                    )
                    .detail(json!({"limit_bytes": REQUEST_BYTES_MAX}));
                    if tx.send(jsonrpc_error(id, &r)).await.is_err() {
                        break;
                    }
                }
            }
        }
        // closing rmcp's input ends the service once it has answered what it holds
        let _ = to_rmcp.shutdown().await;
    });
    let served = handler
        .serve((rmcp_in, rmcp_out))
        .await
        .map_err(|e| mcp(&e))?
        .waiting()
        .await
        .map_err(|e| mcp(&e));
    reader.abort();
    let _ = writer.await;
    served?;
    Ok(())
}

/// A refusal for a line that fits but names a key twice (anything else goes to rmcp, which
/// answers malformed JSON itself).
fn refusal_of(line: &[u8]) -> Option<(Value, Refusal)> {
    let text = std::str::from_utf8(line).ok()?;
    match room_server::wire::parse_strict(text.trim_end()) {
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            let mut scan = IdScan::default();
            scan.feed(line);
            Some((
                scan.id(),
                Refusal::invalid("request", format!("malformed request: {e}")),
            ))
        }
        _ => None,
    }
}

fn jsonrpc_error(id: Value, r: &Refusal) -> Vec<u8> {
    let mut out = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": JSONRPC_INVALID_REQUEST, "message": r.to_string(), "data": {"refusal": r}},
    }))
    .expect("a JSON-RPC error serializes");
    out.push(b'\n');
    out
}

enum Line {
    Eof,
    Whole(Vec<u8>),
    /// Over the limit: read to its end, not kept; its id if one was found.
    Oversized {
        id: Value,
        bytes: usize,
    },
}

/// One line of at most `max` bytes (its newline excluded); a longer one is consumed to its end
/// with only its top-level `id` kept.
async fn read_line_bounded<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut scan = IdScan::default();
    let mut total = 0usize;
    let mut over = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            break;
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        scan.feed(chunk);
        total += chunk.len();
        if !over {
            let body = total - usize::from(done);
            if body > max {
                over = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let n = chunk.len();
        r.consume(n);
        if done {
            break;
        }
    }
    Ok(match (total, over) {
        (0, _) => Line::Eof,
        (_, false) => Line::Whole(line),
        (bytes, true) => Line::Oversized {
            id: scan.id(),
            bytes,
        },
    })
}

/// Finds the top-level `"id"` member of a JSON object streamed through it, in constant memory.
#[derive(Default)]
struct IdScan {
    depth: u32,
    in_str: bool,
    esc: bool,
    /// The string being read at depth 1 is a member name.
    str_is_key: bool,
    /// At depth 1, the next string is a member name.
    expect_key: bool,
    key: Vec<u8>,
    key_is_id: bool,
    /// The value of `id` comes next.
    id_pending: bool,
    capturing: bool,
    cap: Vec<u8>,
    id: Option<Vec<u8>>,
}

impl IdScan {
    const KEY_MAX: usize = 8;
    const ID_MAX: usize = 1024;

    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn finish_capture(&mut self) {
        if self.capturing {
            self.capturing = false;
            if self.id.is_none() {
                self.id = Some(std::mem::take(&mut self.cap));
            }
        }
    }

    fn push_cap(&mut self, b: u8) {
        if self.cap.len() < Self::ID_MAX {
            self.cap.push(b);
        } else {
            self.capturing = false; // too long to be an id worth echoing
            self.cap.clear();
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_str {
            if self.capturing {
                self.push_cap(b);
            }
            if self.str_is_key && self.key.len() <= Self::KEY_MAX {
                self.key.push(b);
            }
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.in_str = false;
                if self.str_is_key {
                    self.key_is_id = self.key == b"id\"";
                    self.str_is_key = false;
                }
                self.finish_capture();
            }
            return;
        }
        match b {
            b'"' => {
                self.in_str = true;
                if self.depth == 1 && self.expect_key {
                    self.str_is_key = true;
                    self.key.clear();
                } else if self.depth == 1 && self.id_pending {
                    self.id_pending = false;
                    self.capturing = true;
                    self.cap = vec![b'"'];
                }
            }
            b'{' | b'[' => {
                self.id_pending = false;
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = b == b'{';
                }
            }
            b'}' | b']' => {
                self.finish_capture();
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 => {
                self.expect_key = false;
                self.id_pending = self.key_is_id;
                self.key_is_id = false;
            }
            b',' if self.depth == 1 => {
                self.finish_capture();
                self.expect_key = true;
                self.id_pending = false;
            }
            b' ' | b'\t' | b'\r' | b'\n' => self.finish_capture(),
            _ if self.depth == 1 && self.id_pending => {
                self.id_pending = false;
                self.capturing = true;
                self.cap = vec![b];
            }
            _ if self.capturing => self.push_cap(b),
            _ => {}
        }
    }

    /// The id as JSON-RPC allows it (a string or a number), else null.
    fn id(&self) -> Value {
        self.id
            .as_ref()
            .and_then(|raw| serde_json::from_slice::<Value>(raw).ok())
            .filter(|v| v.is_string() || v.is_number())
            .unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_of(s: &str) -> Value {
        let mut scan = IdScan::default();
        for chunk in s.as_bytes().chunks(3) {
            scan.feed(chunk);
        }
        scan.id()
    }

    #[test]
    fn the_top_level_id_is_found_whatever_surrounds_it() {
        assert_eq!(id_of(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#), json!(7));
        assert_eq!(id_of(r#"{"id" : "a\"b" , "x":1}"#), json!("a\"b"));
        assert_eq!(
            id_of(r#"{"params":{"id":1,"s":"\"id\":2"},"x":[{"id":3}],"id":-4.5}"#),
            json!(-4.5)
        );
        assert_eq!(id_of(r#"{"method":"notify"}"#), Value::Null);
        assert_eq!(id_of(r#"{"id":{"no":1}}"#), Value::Null);
        assert_eq!(id_of(r#"{"idx":1,"id":null}"#), Value::Null);
        assert_eq!(id_of(r#"{"idx":1,"id":9}"#), json!(9));
    }

    #[tokio::test]
    async fn an_oversized_line_is_consumed_and_the_next_one_read() {
        let mut input = br#"{"id":5,"pad":""#.to_vec();
        input.extend(std::iter::repeat_n(b'a', 100));
        input.extend_from_slice(b"\"}\n{\"id\":6}\n");
        let mut r = BufReader::with_capacity(16, &input[..]);
        match read_line_bounded(&mut r, 50).await.unwrap() {
            Line::Oversized { id, bytes } => {
                assert_eq!(id, json!(5));
                assert_eq!(bytes, 118);
            }
            _ => panic!("oversized"),
        }
        match read_line_bounded(&mut r, 50).await.unwrap() {
            Line::Whole(l) => assert_eq!(l, b"{\"id\":6}\n"),
            _ => panic!("whole"),
        }
        assert!(matches!(
            read_line_bounded(&mut r, 50).await.unwrap(),
            Line::Eof
        ));
    }
}
