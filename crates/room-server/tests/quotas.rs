//! Quotas through the daemon: bytes written per minute and tasks open (per agent and room) on
//! the socket, MCP sessions open (per agent) over HTTP. Each limit comes from `config.toml`;
//! each refusal is `quota_exceeded` naming the limit, and the refused call writes nothing.

use room_server::client::Client;
use room_server::daemon::{Background, Limits, ServeConfig, engine_threads_default};
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

struct Fx {
    daemon: Background,
    http: SocketAddr,
    token: String,
    _tmp: tempfile::TempDir,
}

impl Fx {
    /// A daemon whose config.toml sets `quotas`; an agent `alpha` (coordinator) in room `r`.
    fn new(quotas: &str) -> Fx {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let bootstrap = root.join("config/room/bootstrap.toml");
        let s = room_store::statedir::init(&root.join("state"), &bootstrap, "test").unwrap();
        std::fs::write(s.config(), format!("[quotas]\n{quotas}\n")).unwrap();
        let daemon = Background::start_with(ServeConfig {
            state_dir: s.root.clone(),
            bootstrap,
            listen: Some("127.0.0.1:0".parse().unwrap()),
            engine_threads: engine_threads_default(),
            limits: Limits::default(),
            room_exe: None,
            store: None,
        })
        .unwrap();
        let http = std::fs::read_to_string(s.root.join("http.addr"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut fx = Fx {
            daemon,
            http,
            token: String::new(),
            _tmp: tmp,
        };
        fx.token = fx.ok(
            None,
            "agent_enroll",
            json!({"name": "alpha", "max_tier": "coordinator"}),
        )["token"]
            .as_str()
            .unwrap()
            .to_string();
        fx.ok(
            None,
            "room_create",
            json!({"name": "r", "members": ["alpha"]}),
        );
        let t = fx.token.clone();
        let page = fx.ok(Some(&t), "sync", json!({"room": "r"}));
        fx.ok(
            Some(&t),
            "sync",
            json!({"room": "r", "confirm": page["receipt"]}),
        );
        fx
    }

    fn call(&self, token: Option<&str>, op: &str, args: Value) -> Response {
        Client::connect(&self.daemon.socket)
            .unwrap()
            .call(&Request::new(op, args).with_token(token))
            .unwrap()
    }

    fn ok(&self, token: Option<&str>, op: &str, args: Value) -> Value {
        let r = self.call(token, op, args.clone());
        assert!(r.ok, "{op} {args}: {:?}", r.refusal);
        r.result.unwrap()
    }

    fn tip(&self) -> u64 {
        self.ok(None, "rooms", json!({}))["rooms"][0]["tip_seq"]
            .as_u64()
            .unwrap()
    }
}

#[track_caller]
fn quota_refusal(r: &Response, quota: &str) {
    let refusal = r.refusal.as_ref().expect("a refusal");
    assert_eq!(refusal.code.as_str(), "quota_exceeded", "{refusal}");
    assert_eq!(refusal.detail["quota"], quota, "{refusal}");
}

#[test]
fn bytes_written_per_minute_are_bounded_per_agent_and_room() {
    let fx = Fx::new("bytes_per_minute = 100");
    let t = fx.token.clone();
    fx.ok(
        Some(&t),
        "note",
        json!({"room": "r", "text": "x".repeat(60)}),
    );
    let before = fx.tip();
    for text in ["y".repeat(60), "z".repeat(41)] {
        let refused = fx.call(Some(&t), "note", json!({"room": "r", "text": text}));
        quota_refusal(&refused, "bytes_per_minute");
        let refusal = refused.refusal.unwrap();
        assert_eq!(refusal.detail["limit"], 100);
        assert_eq!(refusal.detail["used"], 60);
        assert_eq!(fx.tip(), before, "the refused turn wrote nothing");
    }
    // what is left of the minute's budget still goes through
    fx.ok(
        Some(&t),
        "note",
        json!({"room": "r", "text": "w".repeat(40)}),
    );
    let title = fx.call(
        Some(&t),
        "task_create",
        json!({"room": "r", "title": "one more byte"}),
    );
    quota_refusal(&title, "bytes_per_minute");
    assert_eq!(fx.tip(), before + 1);
}

#[test]
fn task_terms_and_evidence_count_against_the_bytes_per_minute() {
    let fx = Fx::new("bytes_per_minute = 200");
    let t = fx.token.clone();
    let before = fx.tip();
    let terms = fx.call(
        Some(&t),
        "task_create",
        json!({"room": "r", "title": "t", "requirements": ["r".repeat(180)],
            "accept": [{"kind": "evidence_origins", "req": "R1", "min": 1}]}),
    );
    quota_refusal(&terms, "bytes_per_minute");
    let evidence = fx.call(
        Some(&t),
        "evidence_register",
        json!({"room": "r", "origin": "url:https://example.org", "summary": "s".repeat(190)}),
    );
    quota_refusal(&evidence, "bytes_per_minute");
    assert_eq!(fx.tip(), before, "the refused calls wrote nothing");
    fx.ok(
        Some(&t),
        "evidence_register",
        json!({"room": "r", "origin": "url:https://example.org", "summary": "s".repeat(100)}),
    );
}

#[test]
fn open_tasks_are_bounded_per_agent_and_room() {
    let fx = Fx::new("tasks_open = 2");
    let t = fx.token.clone();
    for i in 0..2 {
        fx.ok(
            Some(&t),
            "task_create",
            json!({"room": "r", "title": format!("task {i}")}),
        );
    }
    let before = fx.tip();
    let refused = fx.call(
        Some(&t),
        "task_create",
        json!({"room": "r", "title": "a third"}),
    );
    quota_refusal(&refused, "tasks_open");
    assert_eq!(refused.refusal.unwrap().detail["used"], 2);
    assert_eq!(fx.tip(), before, "the refused creation wrote nothing");
}

/// One HTTP/1.1 exchange that closes the connection: status, headers (lower-case names), body.
fn exchange(addr: SocketAddr, head: &str, body: &str) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn mcp(fx: &Fx, method: &str, session: Option<&str>, body: &str) -> (u16, Option<String>, String) {
    let port = fx.http.port();
    let session = session.map_or(String::new(), |s| format!("Mcp-Session-Id: {s}\r\n"));
    let head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {}\r\n{session}\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        fx.token,
        body.len()
    );
    let (status, headers, body) = exchange(fx.http, &head, body);
    let sid = headers
        .into_iter()
        .find(|(k, _)| k == "mcp-session-id")
        .map(|(_, v)| v);
    (status, sid, body)
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"quota-test","version":"1"}}}"#;

#[test]
fn mcp_sessions_are_bounded_per_agent() {
    let fx = Fx::new("mcp_sessions = 2");
    let mut held = Vec::new();
    for _ in 0..2 {
        let (status, sid, body) = mcp(&fx, "POST", None, INITIALIZE);
        assert_eq!(status, 200, "{body}");
        held.push(sid.expect("a session id"));
    }
    let (status, sid, body) = mcp(&fx, "POST", None, INITIALIZE);
    assert_eq!(status, 429, "{body}");
    assert!(sid.is_none(), "no session was opened");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["id"], 7);
    assert_eq!(answer["error"]["data"]["refusal"]["code"], "quota_exceeded");
    assert_eq!(
        answer["error"]["data"]["refusal"]["detail"]["quota"],
        "mcp_sessions"
    );
    // a session closed makes room for a new one
    let (status, _, body) = mcp(&fx, "DELETE", Some(&held[0]), "");
    assert_eq!(status, 200, "{body}");
    let (status, sid, body) = mcp(&fx, "POST", None, INITIALIZE);
    assert_eq!(status, 200, "{body}");
    assert!(sid.is_some());
}
