//! The dashboard's security and its event stream, through the daemon's loopback listener as a
//! browser meets it: the one-time login, the session cookie, CSRF and Origin on every request
//! that acts, Host pinning, no agent credential in any answer, and `/api/events` resuming
//! with `Last-Event-ID` without a gap or a duplicate. (The page itself is driven in a real
//! browser by `tests/dashboard/test_dashboard.py`.)

use room_server::client::Client;
use room_server::daemon::{Background, Limits, ServeConfig, engine_threads_default};
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A bound on waiting for an answer or an event: liveness, not speed.
const WITHIN: Duration = Duration::from_secs(20);

struct Fx {
    daemon: Background,
    http: SocketAddr,
    _tmp: tempfile::TempDir,
}

/// A browser's session: its cookie and the page key.
struct Session {
    cookie: String,
    csrf: String,
}

impl Session {
    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![
            ("Cookie", self.cookie.clone()),
            ("X-Room-CSRF", self.csrf.clone()),
        ]
    }
}

struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    #[track_caller]
    fn refused(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["refusal"]["code"], code, "{v}");
        v["refusal"].clone()
    }
}

impl Fx {
    fn new() -> Fx {
        let tmp = tempfile::Builder::new()
            .prefix("room-dashboard-")
            .tempdir()
            .unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let bootstrap = root.join("config/room/bootstrap.toml");
        let s = room_store::statedir::init(&root.join("state"), &bootstrap, "test").unwrap();
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
        Fx {
            daemon,
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

    fn agent_call(&self, token: &str, op: &str, args: Value) -> Response {
        let mut req = Request::new(op, args);
        req.token = Some(token.into());
        Client::connect(&self.daemon.socket)
            .unwrap()
            .call(&req)
            .unwrap()
    }

    /// Agent `alpha` in room `coord`; its token.
    fn alpha(&self) -> String {
        let t = self.ok("agent_enroll", json!({"name": "alpha"}))["token"]
            .as_str()
            .unwrap()
            .to_string();
        self.ok(
            "room_create",
            json!({"name": "coord", "members": ["alpha"]}),
        );
        t
    }

    /// `alpha` says `text` in `coord`, after reading up to the tip (the Work Gate's loop).
    fn say(&self, token: &str, text: &str) {
        self.say_as(token, "say", json!({"text": text}));
    }

    /// A turn of `verb` in `coord` with `args`, after reading up to the tip.
    fn say_as(&self, token: &str, verb: &str, mut args: Value) {
        args["room"] = json!("coord");
        let ok = |r: Response| -> Value {
            assert!(r.ok, "{:?}", r.refusal);
            r.result.unwrap()
        };
        let mut page = ok(self.agent_call(token, "sync", json!({"room": "coord"})));
        for _ in 0..1000 {
            let next = ok(self.agent_call(
                token,
                "sync",
                json!({"room": "coord", "confirm": page["receipt"]}),
            ));
            let empty = next["items"].as_array().is_some_and(|a| a.is_empty());
            if next["more"] == false && empty {
                break;
            }
            page = next;
        }
        ok(self.agent_call(token, verb, args));
    }

    /// What a refused dashboard call could have changed.
    fn snapshot(&self) -> Value {
        let rooms = self.ok("rooms", json!({}));
        let mut logs = serde_json::Map::new();
        for r in rooms["rooms"].as_array().unwrap() {
            let name = r["room"].as_str().unwrap();
            logs.insert(
                name.into(),
                self.ok("room_log", json!({"room": name, "limit": 1000}))["events"].clone(),
            );
        }
        json!({"rooms": rooms, "logs": logs, "agents": self.ok("agent_list", json!({})),
            "collabs": self.ok("collab_list", json!({}))})
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.http.port())
    }

    fn origin(&self) -> String {
        format!("http://{}", self.host())
    }

    fn cookie_name(&self) -> String {
        format!("room_session_{}", self.http.port())
    }

    /// One exchange on a fresh connection (`Connection: close`).
    fn http(&self, method: &str, path: &str, headers: &[(&str, String)], body: &str) -> Answer {
        let mut s = TcpStream::connect(self.http).unwrap();
        s.set_read_timeout(Some(WITHIN)).unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.host()));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let text = String::from_utf8_lossy(&out).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        Answer {
            status,
            head: head.to_string(),
            body,
        }
    }

    /// A login as `room dashboard` gives one: the code, exchanged at `/login`.
    fn login(&self) -> Session {
        let code = self.ok("dashboard_login", json!({}))["code"]
            .as_str()
            .unwrap()
            .to_string();
        let a = self.http("GET", &format!("/login?code={code}"), &[], "");
        assert_eq!(a.status, 303, "{}", a.body);
        // the page key rides in the redirect's fragment, which no server ever receives
        let location = a
            .head
            .lines()
            .find_map(|l| {
                l.strip_prefix("location: ")
                    .or(l.strip_prefix("Location: "))
            })
            .expect("a redirect")
            .trim()
            .to_string();
        let key = location
            .strip_prefix("/#k=")
            .unwrap_or_else(|| panic!("{location}"))
            .to_string();
        let set = a
            .head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
            .expect("a session cookie")
            .to_string();
        assert!(set.contains("HttpOnly"), "{set}");
        assert!(set.contains("SameSite=Strict"), "{set}");
        let cookie = set["set-cookie:".len()..]
            .split(';')
            .next()
            .unwrap()
            .trim()
            .to_string();
        assert!(
            cookie.starts_with(&format!("{}=", self.cookie_name())),
            "{cookie}"
        );
        let s = Session { cookie, csrf: key };
        let a = self.http("GET", "/api/session", &s.headers(), "");
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(!a.body.contains(&s.csrf), "the key is never served again");
        s
    }

    fn call_with(&self, headers: &[(&str, String)], op: &str, args: Value) -> Answer {
        let mut h = vec![("Content-Type", "application/json".to_string())];
        h.extend(headers.iter().cloned());
        self.http(
            "POST",
            "/api/call",
            &h,
            &json!({"op": op, "args": args}).to_string(),
        )
    }

    fn call(&self, s: &Session, op: &str, args: Value) -> Answer {
        self.call_with(
            &[
                ("Cookie", s.cookie.clone()),
                ("X-Room-CSRF", s.csrf.clone()),
                ("Origin", self.origin()),
            ],
            op,
            args,
        )
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// An open `/api/events` stream.
struct Stream {
    r: BufReader<TcpStream>,
}

/// One server-sent event.
#[derive(Debug, Clone)]
struct Sse {
    id: Option<String>,
    event: String,
    data: Value,
}

impl Stream {
    fn open(fx: &Fx, s: &Session, last: Option<&str>) -> Stream {
        let mut t = TcpStream::connect(fx.http).unwrap();
        t.set_read_timeout(Some(WITHIN)).unwrap();
        let mut head = format!(
            "GET /api/events?k={} HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\nAccept: text/event-stream\r\n",
            s.csrf,
            fx.host(),
            s.cookie
        );
        if let Some(l) = last {
            head.push_str(&format!("Last-Event-ID: {l}\r\n"));
        }
        head.push_str("\r\n");
        t.write_all(head.as_bytes()).unwrap();
        let mut r = BufReader::new(t);
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.contains(" 200 "), "{status}");
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            if l == "\r\n" {
                break;
            }
        }
        Stream { r }
    }

    /// The next event (keep-alive comments and chunk framing skipped).
    fn next(&mut self) -> Sse {
        let deadline = Instant::now() + WITHIN;
        let (mut id, mut event, mut data) = (None, String::new(), String::new());
        loop {
            assert!(Instant::now() < deadline, "no event within {WITHIN:?}");
            let mut l = String::new();
            if self.r.read_line(&mut l).unwrap() == 0 {
                panic!("the stream ended");
            }
            let l = l.trim_end_matches(['\r', '\n']);
            if let Some(v) = l.strip_prefix("id:") {
                id = Some(v.trim().to_string());
            } else if let Some(v) = l.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = l.strip_prefix("data:") {
                data.push_str(v.trim_start());
            } else if l.is_empty() && !event.is_empty() {
                return Sse {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap_or(Value::Null),
                };
            }
            // anything else is chunk framing or a comment
        }
    }

    /// Events up to and including the `event` item whose text is `text`.
    fn until_text(&mut self, text: &str) -> Vec<Sse> {
        let mut seen = Vec::new();
        loop {
            let e = self.next();
            let done = e.event == "event" && e.data["text"] == text;
            seen.push(e);
            if done {
                return seen;
            }
        }
    }
}

fn texts(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event == "event" && e.data["kind"] == "turn")
        .map(|e| e.data["text"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn every_api_route_wants_a_session() {
    let fx = Fx::new();
    fx.alpha();
    let before = fx.snapshot();
    let bogus = ("Cookie", format!("{}=0000", fx.cookie_name()));
    for cookie in [None, Some(bogus)] {
        let h: Vec<(&str, String)> = cookie.into_iter().collect();
        let mut acting = h.clone();
        acting.push(("X-Room-CSRF", "x".into()));
        acting.push(("Content-Type", "application/json".into()));
        // without a session, a post that names no origin is refused for the session first
        fx.http(
            "POST",
            "/api/call",
            &acting,
            r#"{"op":"agent_revoke","args":{"name":"alpha"}}"#,
        )
        .refused(401, "credential_invalid");
        acting.push(("Origin", fx.origin()));
        fx.http("GET", "/api/nothing-here", &h, "")
            .refused(401, "credential_invalid");
        fx.http("GET", "/api/session", &h, "")
            .refused(401, "credential_invalid");
        fx.http("GET", "/api/events", &h, "")
            .refused(401, "credential_invalid");
        fx.http(
            "POST",
            "/api/call",
            &acting,
            r#"{"op":"agent_revoke","args":{"name":"alpha"}}"#,
        )
        .refused(401, "credential_invalid");
        fx.http("POST", "/api/logout", &acting, "{}")
            .refused(401, "credential_invalid");
    }
    assert_eq!(fx.snapshot(), before, "a refused call changed something");
    // the page itself is no secret: it asks for a session once loaded
    let page = fx.http("GET", "/", &[], "");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("/assets/app.js"), "{}", page.body);
    assert!(
        page.head.contains("content-security-policy"),
        "{}",
        page.head
    );
}

#[test]
fn a_login_code_works_once() {
    let fx = Fx::new();
    let code = fx.ok("dashboard_login", json!({}))["code"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        fx.http("GET", &format!("/login?code={code}"), &[], "")
            .status,
        303
    );
    let again = fx.http("GET", &format!("/login?code={code}"), &[], "");
    assert_eq!(again.status, 401);
    assert!(again.body.contains("already used"), "{}", again.body);
    assert!(!again.head.to_ascii_lowercase().contains("set-cookie"));
    let made_up = fx.http("GET", "/login?code=0123456789abcdef", &[], "");
    assert_eq!(made_up.status, 401);
    assert_eq!(fx.http("GET", "/login", &[], "").status, 401);
    // an agent cannot mint one: the login code is the owner console's
    let t = fx.alpha();
    let r = fx.agent_call(&t, "dashboard_login", json!({}));
    assert_eq!(r.refusal.unwrap().code.as_str(), "owner_required");
}

#[test]
fn cross_site_and_forged_requests_change_nothing() {
    let fx = Fx::new();
    let token = fx.alpha();
    let s = fx.login();
    let before = fx.snapshot();
    let revoke =
        |h: Vec<(&str, String)>| fx.call_with(&h, "agent_revoke", json!({"name": "alpha"}));
    // the cookie alone (what any other server on this host receives from the browser) reads
    // nothing and does nothing
    let only_cookie = vec![("Cookie", s.cookie.clone())];
    fx.http("GET", "/api/session", &only_cookie, "")
        .refused(403, "csrf_invalid");
    fx.http("GET", "/api/events", &only_cookie, "")
        .refused(403, "csrf_invalid");
    fx.http("GET", "/api/events?k=0000", &only_cookie, "")
        .refused(403, "csrf_invalid");
    let cookie = ("Cookie", s.cookie.clone());
    let csrf = ("X-Room-CSRF", s.csrf.clone());
    let origin = ("Origin", fx.origin());
    // a page on another site posting with the browser's cookie
    let r = revoke(vec![
        cookie.clone(),
        csrf.clone(),
        ("Origin", "http://evil.example".into()),
    ])
    .refused(403, "invalid_argument");
    assert_eq!(r["detail"]["field"], "origin", "{r}");
    // a request that names no origin, or lacks the token, or forges it
    revoke(vec![cookie.clone(), csrf.clone()]).refused(403, "csrf_invalid");
    revoke(vec![cookie.clone(), origin.clone()]).refused(403, "csrf_invalid");
    revoke(vec![
        cookie.clone(),
        origin.clone(),
        ("X-Room-CSRF", "0".repeat(64)),
    ])
    .refused(403, "csrf_invalid");
    // a simple form post (no JSON) with every header right
    let form = fx.http(
        "POST",
        "/api/call",
        &[
            cookie.clone(),
            csrf.clone(),
            origin.clone(),
            ("Content-Type", "text/plain".into()),
        ],
        r#"{"op":"agent_revoke","args":{"name":"alpha"}}"#,
    );
    form.refused(415, "invalid_argument");
    // a foreign Host (DNS rebinding), on the page and the API alike
    for path in ["/", "/api/session"] {
        let a = fx.http(
            "GET",
            path,
            &[("Host", "evil.example".into()), cookie.clone()],
            "",
        );
        let r = a.refused(403, "invalid_argument");
        assert_eq!(r["detail"]["field"], "host", "{r}");
    }
    // operations the page does not offer: credentials stay on the owner console
    for op in [
        "agent_enroll",
        "agent_rotate",
        "agent_delegate",
        "room_archive",
    ] {
        let r = fx
            .call(&s, op, json!({"name": "mallory"}))
            .refused(400, "invalid_argument");
        assert_eq!(r["detail"]["field"], "op", "{r}");
    }
    // malformed calls name what is wrong
    let bad = |body: &str| {
        fx.http(
            "POST",
            "/api/call",
            &[
                cookie.clone(),
                csrf.clone(),
                origin.clone(),
                ("Content-Type", "application/json".into()),
            ],
            body,
        )
    };
    bad("{not json").refused(400, "invalid_argument");
    let r = bad(r#"{"op":"rooms","args":{},"extra":1}"#).refused(400, "invalid_argument");
    assert_eq!(r["detail"]["field"], "extra", "{r}");
    let r = bad(r#"{"args":{}}"#).refused(400, "invalid_argument");
    assert_eq!(r["detail"]["field"], "op", "{r}");
    fx.http("GET", "/api/nothing-here", &s.headers(), "")
        .refused(404, "not_found");
    assert_eq!(fx.snapshot(), before, "a refused call changed something");
    let ok = fx.agent_call(&token, "whoami", json!({}));
    assert!(ok.ok, "alpha still stands: {:?}", ok.refusal);

    // the page's own request acts, and the agent's next call is refused
    let done = fx.call(&s, "agent_revoke", json!({"name": "alpha"}));
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(done.json()["ok"], true);
    let r = fx.agent_call(&token, "whoami", json!({}));
    assert_eq!(r.refusal.unwrap().code.as_str(), "credential_revoked");

    // a log-out ends the session
    let out = fx.http(
        "POST",
        "/api/logout",
        &[cookie.clone(), csrf.clone(), origin.clone()],
        "{}",
    );
    assert_eq!(out.status, 200, "{}", out.body);
    fx.http("GET", "/api/session", &s.headers(), "")
        .refused(401, "credential_invalid");
    drop(cookie);
}

#[test]
fn no_agent_credential_reaches_the_page() {
    let fx = Fx::new();
    let token = fx.alpha();
    // an agent that pastes its own credential into the room
    fx.say(&token, &format!("my token is {token}, keep it"));
    let s = fx.login();
    let mut bodies = Vec::new();
    for path in ["/", "/assets/app.js", "/assets/app.css", "/api/session"] {
        let a = fx.http("GET", path, &s.headers(), "");
        assert_eq!(a.status, 200, "{path}");
        bodies.push((path.to_string(), a.body));
    }
    let views = [
        ("ping", json!({})),
        ("rooms", json!({})),
        ("room_log", json!({"room": "coord"})),
        ("room_members", json!({"room": "coord"})),
        ("agent_list", json!({})),
        ("project_list", json!({})),
        ("wakes_list", json!({})),
        ("wakes_obligations", json!({"room": "coord"})),
        ("sessions_list", json!({})),
        ("adapters_list", json!({})),
        ("routes_list", json!({})),
        ("stops_list", json!({})),
        ("collab_list", json!({})),
        ("collab_profile", json!({})),
    ];
    for (op, args) in views {
        let a = fx.call(&s, op, args);
        assert_eq!(a.status, 200, "{op}: {}", a.body);
        assert_eq!(a.json()["ok"], true, "{op}: {}", a.body);
        bodies.push((op.to_string(), a.body));
    }
    let hex = &token["room_tok_".len()..];
    for (what, body) in &bodies {
        assert!(!body.contains(hex), "{what} carries the agent's token");
    }
    // the egress redactor takes it out of what the page reads, as out of any agent's page
    let log = &bodies.iter().find(|(w, _)| w == "room_log").unwrap().1;
    assert!(log.contains("my token is [redacted]"), "{log}");
}

#[test]
fn events_stream_resumes_without_gap_or_duplicate() {
    let fx = Fx::new();
    let token = fx.alpha();
    let s = fx.login();
    let mut st = Stream::open(&fx, &s, None);
    let hello = st.next();
    assert_eq!(hello.event, "hello", "{hello:?}");
    fx.say(&token, "one");
    st.until_text("one");

    // a secret that straddles the item's cut is redacted whole before the cut
    fx.say(&token, &format!("{} {token}", "x".repeat(270)));
    let long = loop {
        let e = st.next();
        if e.event == "event" {
            break e;
        }
    };
    let text = long.data["text"].as_str().unwrap_or_default().to_string();
    assert!(text.chars().count() <= 280, "{text}");
    assert!(!text.contains(&token["room_tok_".len()..][..8]), "{text}");
    let last = long.id.clone().expect("items carry ids");
    drop(st);

    // what commits while the browser is away
    fx.say(&token, "two");
    fx.say(&token, &format!("three {token}"));
    fx.say(&token, "four");
    for _ in 0..2 {
        // the same Last-Event-ID twice: the same items, in order, each once
        let mut st = Stream::open(&fx, &s, Some(&last));
        let got = st.until_text("four");
        assert_eq!(
            texts(&got),
            vec!["two", "three [redacted]", "four"],
            "{got:?}"
        );
        let ids: Vec<u64> = got
            .iter()
            .map(|e| {
                e.id.as_ref()
                    .unwrap()
                    .rsplit_once('-')
                    .unwrap()
                    .1
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        let first: u64 = last.rsplit_once('-').unwrap().1.parse().unwrap();
        assert_eq!(ids[0], first + 1, "nothing between");
    }

    // a send to another member seals a wake: its state changes are items too
    fx.ok("agent_enroll", json!({"name": "beta"}));
    fx.ok(
        "room_members_add",
        json!({"room": "coord", "agent": "beta"}),
    );
    let mut st = Stream::open(&fx, &s, None);
    assert_eq!(st.next().event, "hello");
    fx.say_as(
        &token,
        "send",
        json!({"text": "beta, look", "to": ["beta"]}),
    );
    loop {
        let e = st.next();
        if e.event == "wake" {
            assert_eq!(e.data["agent"], "beta", "{e:?}");
            assert_eq!(e.data["room"], "coord", "{e:?}");
            assert_eq!(e.data["state"], "queued", "{e:?}");
            assert!(
                e.data["wake"]
                    .as_str()
                    .unwrap()
                    .starts_with("wakes/coord/beta/")
            );
            break;
        }
    }
    drop(st);

    // an id from no epoch of this feed: told to reset, never skipped silently
    let mut st = Stream::open(&fx, &s, Some("feedfeedfeed-3"));
    assert_eq!(st.next().event, "reset");

    // a log-out ends the open stream
    let mut st = Stream::open(&fx, &s, None);
    assert_eq!(st.next().event, "hello");
    let out = fx.http(
        "POST",
        "/api/logout",
        &[
            ("Cookie", s.cookie.clone()),
            ("X-Room-CSRF", s.csrf.clone()),
            ("Origin", fx.origin()),
        ],
        "{}",
    );
    assert_eq!(out.status, 200);
    // the next item (or the session check) ends it
    fx.say(&token, "five");
    loop {
        let e = st.next();
        if e.event == "ended" {
            assert_eq!(e.data["code"], "credential_invalid", "{e:?}");
            break;
        }
    }
}
