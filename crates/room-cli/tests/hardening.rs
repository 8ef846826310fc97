//! The `room` binary against a hostile tester: the stdio bridge answers every request (an
//! oversized line, a line naming a key twice) with a JSON-RPC error carrying the request's id,
//! starts no daemon for a token that does not authenticate, and says so when it starts one;
//! and everything the state dir (and the owner's config dir) holds is the owner's alone.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        Env {
            state: root.join("state"),
            root,
            _tmp: tmp,
        }
    }

    fn cmd(&self, args: &[&str], token: Option<&str>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_room"));
        c.args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("ROOM_LOG", "error")
            .env_remove("ROOM_TOKEN")
            .env_remove("ROOM_CONVERSATION")
            .env_remove("ROOM_TIER")
            .env_remove("ROOM_SOCKET");
        if let Some(t) = token {
            c.env("ROOM_TOKEN", t);
        }
        c
    }

    fn ok(&self, args: &[&str], token: Option<&str>) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let o = self.cmd(&a, token).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    }

    fn serve(&self) -> Child {
        let child = self.cmd(&["serve"], None).spawn().unwrap();
        for _ in 0..500 {
            if self.cmd(&["list"], None).output().unwrap().status.success() {
                return child;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        stop(child);
        panic!("daemon did not come up");
    }

    /// Whether some process holds the state dir's daemon lock.
    fn daemon_runs(&self) -> bool {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.state.join("room.lock"));
        match f {
            Err(_) => false,
            Ok(f) => match f.try_lock() {
                Ok(()) => false,
                Err(std::fs::TryLockError::WouldBlock) => true,
                Err(e) => panic!("{e:?}"),
            },
        }
    }

    fn daemon_pid(&self) -> Option<String> {
        std::fs::read_to_string(self.state.join("room.lock"))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

struct Bridge {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Bridge {
    fn start(env: &Env, token: &str) -> Bridge {
        let mut child = env
            .cmd(&["mcp"], Some(token))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut b = Bridge {
            child,
            stdin,
            stdout,
        };
        b.send(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "hardening", "version": "0"}}}),
        );
        let init = b.answer();
        assert_eq!(init["id"], 0, "{init}");
        assert!(init["result"].is_object(), "{init}");
        b.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        b
    }

    fn send(&mut self, v: &Value) {
        self.raw(format!("{v}\n").as_bytes());
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next answer (the bridge is expected to answer; a hang fails the test's time limit).
    fn answer(&mut self) -> Value {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).unwrap();
        assert!(n > 0, "the bridge closed stdout without answering");
        serde_json::from_str(&line).unwrap()
    }

    fn call(&mut self, id: Value, tool: &str, args: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}));
        let a = self.answer();
        assert_eq!(a["id"], id, "{a}");
        a
    }

    /// Close stdin and wait for the bridge; its stderr.
    fn finish(self) -> String {
        drop(self.stdin);
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success(), "bridge exit {:?}", out.status);
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

#[test]
fn the_bridge_starts_no_daemon_for_a_token_that_does_not_authenticate() {
    let env = Env::new();
    env.ok(&["init"], None);
    // a token that was once valid and one that never was
    let daemon = env.serve();
    let t = env.ok(&["agent", "enroll", "alpha"], None)["token"]
        .as_str()
        .unwrap()
        .to_string();
    env.ok(&["agent", "revoke", "alpha"], None);
    stop(daemon);
    assert!(!env.daemon_runs());
    let bogus = "room_tok_0000000000000000000000000000000000000000000000000000000000000000";
    for (token, code) in [
        (bogus, "credential_invalid"),
        (t.as_str(), "credential_revoked"),
    ] {
        let mut b = Bridge::start(&env, token);
        // every request is answered, with the refusal
        let a = b.call(json!(1), "room_whoami", json!({}));
        assert_eq!(a["result"]["isError"], true, "{a}");
        assert_eq!(
            a["result"]["structuredContent"]["refusal"]["code"], code,
            "{a}"
        );
        let a = b.call(json!(2), "room_list", json!({}));
        assert_eq!(a["result"]["structuredContent"]["refusal"]["code"], code);
        assert!(!env.daemon_runs(), "a daemon was started for {code}");
        let stderr = b.finish();
        assert!(stderr.contains(code), "{stderr}");
        assert!(!env.daemon_runs());
        // (the socket file may be the killed daemon's leftover; nothing answers on it)
        assert!(std::os::unix::net::UnixStream::connect(env.state.join("room.sock")).is_err());
    }
}

/// A bridge told its broker (`ROOM_SOCKET`, as a launch gives a worker's MCP server) uses
/// that socket alone: where nothing answers there it says so and starts no daemon, even for
/// a token that authenticates.
#[test]
fn the_bridge_given_a_broker_socket_that_does_not_answer_starts_nothing() {
    let env = Env::new();
    env.ok(&["init"], None);
    let daemon = env.serve();
    let t = env.ok(&["agent", "enroll", "alpha"], None)["token"]
        .as_str()
        .unwrap()
        .to_string();
    stop(daemon);
    assert!(!env.daemon_runs());
    let gone = env.root.join("workers-gone/broker.sock");
    let o = env
        .cmd(&["mcp"], Some(&t))
        .env("ROOM_SOCKET", &gone)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("does not answer"), "{err}");
    assert!(err.contains("broker.sock"), "{err}");
    assert!(!env.daemon_runs(), "no daemon was started");
}

#[test]
fn the_bridge_answers_every_request_and_says_when_it_starts_a_daemon() {
    let env = Env::new();
    env.ok(&["init"], None);
    let daemon = env.serve();
    let token = env.ok(&["agent", "enroll", "alpha"], None)["token"]
        .as_str()
        .unwrap()
        .to_string();
    env.ok(&["create", "coord", "--member", "alpha"], None);
    stop(daemon);

    let mut b = Bridge::start(&env, &token);
    assert!(
        env.daemon_runs(),
        "the bridge started a daemon for a valid token"
    );
    let pid = env.daemon_pid().unwrap();
    let log = std::fs::read_to_string(env.state.join("daemon.log")).unwrap();
    assert!(
        log.contains(&format!("started a daemon (pid {pid})")),
        "the daemon log names the daemon the bridge started: {log}"
    );
    let limit = room_server::wire::REQUEST_BYTES_MAX;

    // between the request limit and rmcp's 16 MiB line limit
    let text = "a".repeat(3 << 20);
    b.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "room_note", "arguments": {"room": "coord", "text": text}}}));
    let a = b.answer();
    assert_eq!(a["id"], 2, "{a}");
    assert_eq!(
        a["error"]["data"]["refusal"]["code"], "payload_too_large",
        "{a}"
    );
    assert_eq!(
        a["error"]["data"]["refusal"]["detail"]["limit_bytes"],
        limit
    );

    // past 16 MiB, with the id after the padding
    let mut line = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"room_note","arguments":{"room":"coord","text":""#.to_vec();
    line.resize(line.len() + (17 << 20), b'b');
    line.extend_from_slice(br#""}},"id":"big"}"#);
    line.push(b'\n');
    b.raw(&line);
    let a = b.answer();
    assert_eq!(a["id"], "big", "{a}");
    assert_eq!(
        a["error"]["data"]["refusal"]["code"], "payload_too_large",
        "{a}"
    );

    // a key named twice
    b.raw(
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"room_note","arguments":{"room":"coord","text":"x","text":"y"}}}"#,
    );
    b.raw(b"\n");
    let a = b.answer();
    assert_eq!(a["id"], 3, "{a}");
    assert_eq!(
        a["error"]["data"]["refusal"]["code"], "invalid_argument",
        "{a}"
    );

    // nothing of those reached the room, and the bridge still serves
    let a = b.call(json!(4), "room_whoami", json!({}));
    assert_eq!(a["result"]["isError"], false, "{a}");
    let stderr = b.finish();
    assert!(stderr.contains("started a daemon"), "{stderr}");
    let log = env.ok(&["log", "coord"], None);
    assert!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] != "turn"),
        "a refused request wrote: {log}"
    );
    // the daemon outlives the bridge, as its log said; stop it
    assert!(env.daemon_runs());
    let _ = Command::new("kill").arg(&pid).status();
    for _ in 0..500 {
        if !env.daemon_runs() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!env.daemon_runs());
}

/// Every entry under `dir` whose mode lets anyone but the owner in.
fn shared_entries(dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        let mode = md.permissions().mode() & 0o7777;
        if !md.file_type().is_symlink() && mode & 0o077 != 0 {
            out.push(format!("{} {:o}", e.path().display(), mode));
        }
        if md.is_dir() {
            shared_entries(&e.path(), out);
        }
    }
}

#[test]
fn everything_in_the_state_and_config_dirs_is_the_owners_alone() {
    let env = Env::new();
    env.ok(&["init"], None);
    let mut daemon = env.serve();
    let token = env.ok(
        &["agent", "enroll", "alpha", "--max-tier", "coordinator"],
        None,
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let work = env.root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let project = env.ok(&["project", "open", work.to_str().unwrap()], None)["id"]
        .as_str()
        .unwrap()
        .to_string();
    env.ok(&["create", "coord", "--member", "alpha"], None);
    env.ok(
        &[
            "create",
            "build",
            "--project",
            &project,
            "--member",
            "alpha",
        ],
        None,
    );
    // a turn, and one large enough to spill into a blob
    env.ok(&["sync", "coord"], Some(&token));
    let page = env.ok(&["sync", "coord"], Some(&token));
    let receipt = page["receipt"].as_str().unwrap().to_string();
    env.ok(&["sync", "coord", "--confirm", &receipt], Some(&token));
    env.ok(&["note", "coord", "hello"], Some(&token));
    env.ok(&["note", "coord", &"x".repeat(9 << 10)], Some(&token));
    let mut shared = Vec::new();
    for d in [env.state.clone(), env.root.join("config")] {
        let md = std::fs::metadata(&d).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o700, "{}", d.display());
        shared_entries(&d, &mut shared);
    }
    assert!(
        std::fs::read_dir(env.state.join("rooms")).unwrap().count() >= 2,
        "the rooms' shards exist"
    );
    assert!(shared.is_empty(), "readable by others: {shared:#?}");
    let _ = daemon.kill();
    let _ = daemon.wait();
}
