//! What a hostile local tester tried, through the daemon's public interface: freezing it with
//! idle and slow connections, `/v1/call` from a foreign Host or Origin, requests that name a
//! key twice, and system or configuration directories (also through symlinks) as project
//! territory. Every refusal is checked for its code and for having changed nothing.

use room_server::client::Client;
use room_server::daemon::{Background, Limits, ServeConfig, engine_threads_default};
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A bound on waiting for an answer: liveness, not speed.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

struct Fx {
    daemon: Background,
    root: PathBuf,
    bootstrap: PathBuf,
    http: SocketAddr,
    _tmp: tempfile::TempDir,
}

impl Fx {
    fn new(limits: Limits) -> Fx {
        let tmp = tempfile::Builder::new()
            .prefix("room-hardening-")
            .tempdir()
            .unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let bootstrap = root.join("config/room/bootstrap.toml");
        let s = room_store::statedir::init(&root.join("state"), &bootstrap, "test").unwrap();
        let daemon = Background::start_with(ServeConfig {
            state_dir: s.root.clone(),
            bootstrap: bootstrap.clone(),
            listen: Some("127.0.0.1:0".parse().unwrap()),
            engine_threads: engine_threads_default(),
            limits,
            room_exe: None,
            store: None,
        })
        .unwrap();
        let http = std::fs::read_to_string(s.root.join("http.addr"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Fx {
            daemon,
            root,
            bootstrap,
            http,
            _tmp: tmp,
        }
    }

    fn owner(&self, op: &str, args: Value) -> Response {
        Client::connect(&self.daemon.socket)
            .unwrap()
            .call(&Request::new(op, args))
            .unwrap()
    }

    fn ok(&self, op: &str, args: Value) -> Value {
        let r = self.owner(op, args.clone());
        assert!(r.ok, "{op} {args}: {:?}", r.refusal);
        r.result.unwrap()
    }

    /// What a refused call could have changed.
    fn snapshot(&self) -> Value {
        let rooms = self.ok("rooms", json!({}));
        let mut logs = serde_json::Map::new();
        for r in rooms["rooms"].as_array().unwrap() {
            let name = r["room"].as_str().unwrap();
            logs.insert(
                name.into(),
                self.ok("room_log", json!({"room": name, "limit": 1000})),
            );
        }
        json!({
            "rooms": rooms, "logs": logs,
            "projects": self.ok("project_list", json!({})),
            "agents": self.ok("agent_list", json!({})),
        })
    }

    /// An agent `alpha` in a coordination room `coord`; its token.
    fn agent(&self) -> String {
        let t = self.ok(
            "agent_enroll",
            json!({"name": "alpha", "max_tier": "coordinator"}),
        )["token"]
            .as_str()
            .unwrap()
            .to_string();
        self.ok(
            "room_create",
            json!({"name": "coord", "members": ["alpha"]}),
        );
        t
    }
}

#[track_caller]
fn expect_code(r: &Response, code: &str) -> Value {
    assert!(!r.ok, "expected {code}, got {:?}", r.result);
    let refusal = r.refusal.as_ref().expect("a refusal");
    assert_eq!(refusal.code.as_str(), code, "{refusal}");
    serde_json::to_value(refusal).unwrap()
}

/// One HTTP/1.1 exchange on a fresh connection; the status and the body.
fn http(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    // the answers here are small and close the exchange with a known length
    loop {
        let n = s.read(&mut buf).expect("the daemon answers");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if let Some(end) = find(&out, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse::<usize>().unwrap());
            if let Some(len) = len
                && out.len() >= end + 4 + len
            {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let end = find(&out, b"\r\n\r\n").unwrap();
    (status, out[end + 4..].to_vec())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn post_call(
    addr: SocketAddr,
    host: &str,
    origin: Option<&str>,
    token: &str,
    body: &str,
) -> (u16, Vec<u8>) {
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    let head = format!(
        "POST /v1/call HTTP/1.1\r\nHost: {host}\r\n{origin}Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    http(addr, &head, body.as_bytes())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn idle_and_slow_connections_cannot_freeze_the_daemon() {
    const IDLE: usize = 2_000;
    const SLOW: usize = 200;
    const PER_LISTENER: usize = 256;
    // room for the test's own 2,200 sockets, whatever the soft limit was
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
    let limits = Limits {
        header_read: Duration::from_millis(800),
        body_read: Duration::from_millis(800),
        idle: Duration::from_secs(300),
        conns_per_listener: PER_LISTENER,
        conns_per_peer: PER_LISTENER,
    };
    let fx = Fx::new(limits);
    let fds_before = open_fds();
    // half the idle connections on the owner socket, half on HTTP
    let mut idle_unix = Vec::new();
    let mut idle_tcp = Vec::new();
    for i in 0..IDLE {
        if i % 2 == 0 {
            idle_unix.push(std::os::unix::net::UnixStream::connect(&fx.daemon.socket).unwrap());
        } else {
            idle_tcp.push(TcpStream::connect(fx.http).unwrap());
        }
    }
    // slow ones: a head that never ends, a body that declared 100 bytes and sent one, a
    // socket line that never ends
    let mut slow = Vec::new();
    for i in 0..SLOW {
        let mut s = TcpStream::connect(fx.http).unwrap();
        match i % 2 {
            0 => s
                .write_all(b"POST /v1/call HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .unwrap(),
            _ => s
                .write_all(
                    format!(
                        "POST /v1/call HTTP/1.1\r\nHost: {}\r\nContent-Length: 100\r\n\r\n{{",
                        fx.http
                    )
                    .as_bytes(),
                )
                .unwrap(),
        }
        slow.push(s);
    }
    let mut slow_line = std::os::unix::net::UnixStream::connect(&fx.daemon.socket).unwrap();
    slow_line.write_all(br#"{"op":"ping""#).unwrap();

    // While all of them are held, the owner console and /healthz answer.
    let t = Instant::now();
    let mut c = Client::connect(&fx.daemon.socket).unwrap();
    let r = c.call(&Request::new("ping", json!({}))).unwrap();
    let ping = t.elapsed();
    assert!(r.ok, "{:?}", r.refusal);
    let t = Instant::now();
    let (status, body) = http(
        fx.http,
        &format!(
            "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            fx.http
        ),
        b"",
    );
    let healthz = t.elapsed();
    assert_eq!((status, &body[..]), (200, &b"ok"[..]));
    eprintln!(
        "under {IDLE} idle and {SLOW} slow connections: owner ping {ping:?}, /healthz {healthz:?}"
    );
    assert!(
        ping < ANSWER_WITHIN && healthz < ANSWER_WITHIN,
        "answers within the liveness bound"
    );

    // The daemon holds a bounded number of them: at most its bound per listener, not one
    // descriptor per connection the test opened.
    let held_by_test = IDLE + SLOW + 2;
    let daemon_side = open_fds().saturating_sub(fds_before + held_by_test);
    assert!(
        daemon_side <= 2 * PER_LISTENER + 64,
        "the daemon holds {daemon_side} descriptors for {held_by_test} connections"
    );

    // Slow requests are closed within bounded time: each slow HTTP connection gets a 408 or
    // is closed, and the unfinished socket line is closed.
    let deadline = Instant::now() + Duration::from_secs(30);
    for mut s in slow {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut out = Vec::new();
        match s.read_to_end(&mut out) {
            Ok(_) => {
                let text = String::from_utf8_lossy(&out);
                assert!(
                    out.is_empty() || text.starts_with("HTTP/1.1 408"),
                    "a slow connection got {text:?}"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("a slow connection was still open: {e}"),
        }
    }
    slow_line
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut out = Vec::new();
    slow_line
        .read_to_end(&mut out)
        .expect("the unfinished socket line is closed");
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));

    // and the daemon still serves, with nothing changed
    assert!(c.call(&Request::new("ping", json!({}))).unwrap().ok);
    assert_eq!(fx.ok("rooms", json!({}))["rooms"], json!([]));
    drop((idle_unix, idle_tcp));
}

#[test]
fn v1_call_checks_host_and_origin_as_mcp_does() {
    let fx = Fx::new(Limits::default());
    let token = fx.agent();
    let port = fx.http.port();
    let good_host = format!("127.0.0.1:{port}");
    let note = json!({"op": "note", "args": {"room": "coord", "text": "hello"}}).to_string();
    let before = fx.snapshot();
    for (host, origin, field) in [
        ("evil.example".to_string(), None, "host"),
        (format!("evil.example:{port}"), None, "host"),
        (format!("127.0.0.1:{}", port.wrapping_add(1)), None, "host"),
        (
            good_host.clone(),
            Some("http://evil.example".to_string()),
            "origin",
        ),
        (
            good_host.clone(),
            Some(format!("http://evil.example:{port}")),
            "origin",
        ),
        (good_host.clone(), Some("null".to_string()), "origin"),
    ] {
        let (status, body) = post_call(fx.http, &host, origin.as_deref(), &token, &note);
        assert_eq!(status, 403, "{host} {origin:?}");
        let r: Response = serde_json::from_slice(&body).unwrap();
        let refusal = expect_code(&r, "invalid_argument");
        assert_eq!(refusal["detail"]["field"], field);
        assert_eq!(fx.snapshot(), before, "a refused call changed state");
    }
    // the listener's own names are served
    for (host, origin) in [
        (good_host.clone(), None),
        (
            format!("localhost:{port}"),
            Some(format!("http://localhost:{port}")),
        ),
        (good_host.clone(), Some(format!("http://127.0.0.1:{port}"))),
    ] {
        let body = json!({"op": "whoami", "args": {}}).to_string();
        let (status, body) = post_call(fx.http, &host, origin.as_deref(), &token, &body);
        assert_eq!(
            status,
            200,
            "{host} {origin:?}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[test]
fn duplicate_keys_are_refused_on_the_socket_and_over_http() {
    let fx = Fx::new(Limits::default());
    let token = fx.agent();
    let before = fx.snapshot();
    let lines = [
        r#"{"op":"room_create","args":{"name":"a","name":"b"}}"#.to_string(),
        r#"{"op":"rooms","op":"room_create","args":{"name":"c"}}"#.to_string(),
        r#"{"op":"room_create","args":{"name":"d","members":["alpha"]},"args":{"name":"e"}}"#
            .to_string(),
    ];
    let mut c = Client::connect(&fx.daemon.socket).unwrap();
    for l in &lines {
        let r = c.raw(format!("{l}\n").as_bytes()).unwrap();
        let refusal = expect_code(&r, "invalid_argument");
        assert!(
            refusal["message"]
                .as_str()
                .unwrap()
                .contains("duplicate key"),
            "{refusal}"
        );
        assert_eq!(fx.snapshot(), before, "{l} changed state");
    }
    let agent_lines = [
        json!({"op": "note", "args": {"room": "coord", "text": "x"}})
            .to_string()
            .replace(r#""text":"x""#, r#""text":"x","text":"y""#),
        r#"{"op":"note","op":"say","args":{"room":"coord","text":"z"}}"#.to_string(),
    ];
    for l in &agent_lines {
        assert!(l.matches("\"text\"").count() == 2 || l.matches("\"op\"").count() == 2);
        let (status, body) = post_call(
            fx.http,
            &format!("127.0.0.1:{}", fx.http.port()),
            None,
            &token,
            l,
        );
        assert_eq!(status, 200);
        let r: Response = serde_json::from_slice(&body).unwrap();
        expect_code(&r, "invalid_argument");
        assert_eq!(fx.snapshot(), before, "{l} changed state");
    }
    // the same requests without the repeat are served
    assert!(c.raw(b"{\"op\":\"rooms\",\"args\":{}}\n").unwrap().ok);
}

#[test]
fn system_and_configuration_directories_are_refused_as_territory() {
    let fx = Fx::new(Limits::default());
    let links = fx.root.join("links");
    std::fs::create_dir_all(&links).unwrap();
    let link = |name: &str, to: &Path| {
        let l = links.join(name);
        std::os::unix::fs::symlink(to, &l).unwrap();
        l
    };
    let config_dir = fx.bootstrap.parent().unwrap().to_path_buf();
    let config_sub = config_dir.join("sub");
    std::fs::create_dir_all(&config_sub).unwrap();
    let mut cases: Vec<(PathBuf, &str)> = vec![];
    for sys in [
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/etc",
        "/dev/shm",
        "/proc/self",
        "/etc/ssl",
    ] {
        if Path::new(sys).is_dir() {
            cases.push((PathBuf::from(sys), "a system directory"));
        }
    }
    cases.extend([
        (link("proc", Path::new("/proc")), "a system directory"),
        (link("shm", Path::new("/dev/shm")), "a system directory"),
        (link("etc", Path::new("/etc")), "a system directory"),
        (
            config_dir.clone(),
            "overlaps the owner's configuration directory",
        ),
        (
            config_sub.clone(),
            "overlaps the owner's configuration directory",
        ),
        (
            config_dir.parent().unwrap().to_path_buf(),
            "overlaps the owner's configuration directory",
        ),
        (
            link("config", &config_dir),
            "overlaps the owner's configuration directory",
        ),
    ]);
    let before = fx.snapshot();
    for (path, reason) in cases {
        if !path.exists() {
            continue; // a system directory this machine does not have
        }
        let r = fx.owner("project_open", json!({"path": path.to_str().unwrap()}));
        let refusal = expect_code(&r, "project_territory_refused");
        assert_eq!(refusal["detail"]["reason"], reason, "{}", path.display());
        assert_eq!(fx.snapshot(), before, "{} changed state", path.display());
    }
    // an ordinary directory beside them is still territory
    let work = fx.root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    fx.ok("project_open", json!({"path": work.to_str().unwrap()}));
}

/// A running launch's one-launch credential carried out of its job (a worker that leaks it)
/// is refused over HTTP as on the owner's socket: `launch_credential_outside_broker`, with
/// nothing changed; it works only through its own launch's broker.
#[test]
fn a_launch_credential_is_refused_over_http_while_its_launch_runs() {
    let fx = Fx::new(Limits::default());
    let alpha = fx.agent();
    fx.ok(
        "agent_enroll",
        json!({"name": "beta", "max_tier": "member"}),
    );
    fx.ok(
        "room_members_add",
        json!({"room": "coord", "agent": "beta"}),
    );
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    std::fs::write(
        fx.root.join("state/config.toml"),
        format!(
            "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"hang\"]\ntimeout_ms = 30000\n",
            agent.to_str().unwrap()
        ),
    )
    .unwrap();
    let mut c = Client::connect(&fx.daemon.socket).unwrap();
    let call = |c: &mut Client, op: &str, args: Value| {
        let r = c
            .call(&Request::new(op, args).with_token(Some(&alpha)))
            .unwrap();
        assert!(r.ok, "{op}: {:?}", r.refusal);
        r.result.unwrap()
    };
    let page = call(&mut c, "sync", json!({"room": "coord"}));
    call(
        &mut c,
        "sync",
        json!({"room": "coord", "confirm": page["receipt"]}),
    );
    call(
        &mut c,
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "@beta keep running"}),
    );
    // the worker prints its credential first (tests/workers/agent.py)
    let start = Instant::now();
    let token = loop {
        let found = std::fs::read_dir(fx.root.join("state/workers"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|d| std::fs::read_to_string(d.path().join("stdout.log")).ok())
            .find_map(|s| {
                let first: Value = serde_json::from_str(s.lines().next()?).ok()?;
                first["token"].as_str().map(String::from)
            });
        if let Some(t) = found {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no worker ran");
        std::thread::sleep(Duration::from_millis(50));
    };
    let before = fx.snapshot();
    let host = format!("127.0.0.1:{}", fx.http.port());
    for body in [
        json!({"op": "whoami", "args": {}}),
        json!({"op": "note", "args": {"room": "coord", "text": "from outside the job"}}),
    ] {
        let (status, out) = post_call(fx.http, &host, None, &token, &body.to_string());
        assert_eq!(status, 200);
        let r: Response = serde_json::from_slice(&out).unwrap();
        let refusal = expect_code(&r, "launch_credential_outside_broker");
        assert_eq!(refusal["detail"]["agent"], "beta", "{refusal}");
        assert_eq!(fx.snapshot(), before, "{body} changed state");
    }
    // nor does it open an MCP session
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "leak", "version": "0"}}})
    .to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        init.len()
    );
    let (status, out) = http(fx.http, &head, init.as_bytes());
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&out));
    let err: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        err["error"]["data"]["code"], "launch_credential_outside_broker",
        "{err}"
    );
    assert_eq!(fx.snapshot(), before, "the refused session changed state");
    fx.ok("room_cancel", json!({"room": "coord"}));
}
