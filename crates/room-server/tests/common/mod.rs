//! The daemon fixture the refusal and acceptance suites share: a real daemon on a throw-away
//! state dir, driven over its Unix socket, and a snapshot of everything a call could change.
#![allow(dead_code)]

use room_core::Refusal;
use room_server::client::Client;
use room_server::daemon::Background;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub const UNKNOWN_TOKEN: &str =
    "room_tok_0000000000000000000000000000000000000000000000000000000000000000";
pub const UNKNOWN_TASK: &str = "tsk_00000000deadbeef";
pub const UNKNOWN_OBLIGATION: &str = "obl_00000000deadbeef";
pub const UNKNOWN_RECEIPT: &str = "rcpt_000000000000000000000000deadbeef";

// ---------- fixture ----------

pub struct Fx {
    // Field order is drop order: the connection closes before the daemon stops, and the
    // temporary directory goes last.
    pub client: Client,
    pub daemon: Background,
    pub root: PathBuf,
    pub state: PathBuf,
    pub tasks: Vec<String>,
    pub _tmp: tempfile::TempDir,
}

pub fn request(token: Option<&str>, op: &str, args: Value) -> Request {
    Request {
        op: op.into(),
        token: token.map(String::from),
        conversation: None,
        tier: None,
        args,
        meta: None,
        page_bytes_max: None,
    }
}

/// The response must be a refusal with exactly `code`.
#[track_caller]
pub fn expect_code(r: Response, code: &str, what: &str) -> Refusal {
    assert!(
        !r.ok,
        "{what}: expected refusal {code}, got ok: {:?}",
        r.result
    );
    let refusal = r
        .refusal
        .unwrap_or_else(|| panic!("{what}: a refused response carries a refusal"));
    assert_eq!(
        refusal.code.as_str(),
        code,
        "{what}: wrong code ({refusal})"
    );
    refusal
}

impl Fx {
    pub fn new() -> Fx {
        let tmp = tempfile::Builder::new()
            .prefix("room-refusals-")
            .tempdir()
            .unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let state = root.join("state");
        let bootstrap = root.join("config/room/bootstrap.toml");
        let s = room_store::statedir::init(&state, &bootstrap, "test-instance").unwrap();
        let daemon = Background::start(&s.root, &bootstrap).unwrap();
        let client = Client::connect(&daemon.socket).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        Fx {
            client,
            daemon,
            root,
            state: s.root,
            tasks: Vec::new(),
            _tmp: tmp,
        }
    }

    pub fn send(&mut self, req: &Request) -> Response {
        self.client.call(req).expect("the daemon answers")
    }

    pub fn call(&mut self, token: Option<&str>, op: &str, args: Value) -> Response {
        self.send(&request(token, op, args))
    }

    #[track_caller]
    pub fn ok(&mut self, token: Option<&str>, op: &str, args: Value) -> Value {
        let r = self.call(token, op, args.clone());
        match r {
            Response {
                ok: true,
                result: Some(v),
                ..
            } => v,
            Response { refusal, .. } => {
                panic!(
                    "{op} {args} was refused: {}",
                    refusal.map(|r| r.to_string()).unwrap_or_default()
                )
            }
        }
    }

    /// Send `req`, expect `code`, and check the refused call changed nothing.
    #[track_caller]
    pub fn refuse_req(&mut self, req: &Request, code: &str) -> Refusal {
        let before = self.snapshot();
        let r = self.send(req);
        let what = format!("{} {} (tier {:?})", req.op, req.args, req.tier);
        let refusal = expect_code(r, code, &what);
        let after = self.snapshot();
        assert_eq!(before, after, "refused call {what} changed state");
        refusal
    }

    /// Expect `invariant_violation` (`lease_conflict` for `exclusive`) for `invariant`: the act's
    /// envelope was not committed and the only change anywhere is its one `invariant_violation`
    /// record in `room`.
    #[track_caller]
    pub fn refuse_violation(
        &mut self,
        token: &str,
        op: &str,
        args: Value,
        room: &str,
        invariant: &str,
    ) -> Refusal {
        let before = self.snapshot();
        let r = self.call(Some(token), op, args.clone());
        let what = format!("{op} {args}");
        // `exclusive`'s reject answers with the code a caller acts on
        let code = if invariant == "exclusive" {
            "lease_conflict"
        } else {
            "invariant_violation"
        };
        let refusal = expect_code(r, code, &what);
        assert_eq!(refusal.detail["invariant"], invariant, "{what}: {refusal}");
        assert_eq!(refusal.detail["severity"], "reject");
        let mut after = self.snapshot();
        let events = after["logs"][room]["events"].as_array_mut().unwrap();
        let v = events.pop().expect("the violation record");
        assert_eq!(v["kind"], "invariant_violation", "{what}: {v}");
        assert_eq!(v["event"]["invariant"], invariant);
        assert_eq!(v["event"]["severity"], "reject");
        assert_eq!(v["id"], refusal.detail["violation_event"]);
        let strip = |s: &mut Value| {
            s["logs"][room]["tip_seq"] = Value::Null;
            for r in s["rooms"]["rooms"].as_array_mut().unwrap() {
                r["tip_seq"] = Value::Null;
            }
            let lines: usize = s["journals"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap() as usize)
                .sum();
            s["journals"] = json!(lines);
        };
        let mut b = before.clone();
        strip(&mut b);
        let lines_before = b["journals"].as_u64().unwrap();
        strip(&mut after);
        assert_eq!(
            after["journals"].as_u64().unwrap(),
            lines_before + 1,
            "{what}: one record"
        );
        after["journals"] = b["journals"].clone();
        assert_eq!(b, after, "{what} changed more than its violation record");
        refusal
    }

    #[track_caller]
    pub fn refuse(&mut self, token: Option<&str>, op: &str, args: Value, code: &str) -> Refusal {
        self.refuse_req(&request(token, op, args), code)
    }

    /// Everything the owner can see that a call could change.
    pub fn snapshot(&mut self) -> Value {
        let rooms = self.ok(None, "rooms", json!({}));
        let mut logs = BTreeMap::new();
        for r in rooms["rooms"].as_array().unwrap() {
            let name = r["room"].as_str().unwrap().to_string();
            let log = self.ok(None, "room_log", json!({"room": name, "limit": 1000}));
            logs.insert(name, log);
        }
        let wakes = self.ok(None, "wakes_list", json!({}));
        let projects = self.ok(None, "project_list", json!({}));
        let agents = self.ok(None, "agent_list", json!({}));
        let grants = self.ok(None, "compose_grants", json!({}));
        let mut tasks = BTreeMap::new();
        for t in self.tasks.clone() {
            tasks.insert(
                t.clone(),
                self.ok(None, "owner_task_show", json!({"task": t})),
            );
        }
        json!({
            "rooms": rooms, "logs": logs, "journals": self.journal_lines(), "wakes": wakes,
            "projects": projects, "agents": agents, "tasks": tasks, "grants": grants,
        })
    }

    /// Line count of every room's EVENTS.jsonl, by shard directory.
    pub fn journal_lines(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for d in std::fs::read_dir(self.state.join("rooms")).unwrap() {
            let d = d.unwrap();
            let j = d.path().join("EVENTS.jsonl");
            if let Ok(bytes) = std::fs::read(&j) {
                out.insert(
                    d.file_name().to_string_lossy().into_owned(),
                    bytecount(&bytes),
                );
            }
        }
        out
    }

    pub fn tip(&mut self, room: &str) -> u64 {
        self.ok(None, "room_log", json!({"room": room}))["tip_seq"]
            .as_u64()
            .unwrap()
    }

    pub fn enroll(&mut self, name: &str, tier: &str) -> String {
        let v = self.ok(
            None,
            "agent_enroll",
            json!({"name": name, "max_tier": tier, "host": "test"}),
        );
        v["token"].as_str().unwrap().to_string()
    }

    /// alpha (coordinator), beta and gamma (members), all in the coordination room `room`.
    pub fn team(&mut self, room: &str) -> (String, String, String) {
        let a = self.enroll("alpha", "coordinator");
        let b = self.enroll("beta", "member");
        let g = self.enroll("gamma", "member");
        self.ok(
            None,
            "room_create",
            json!({"name": room, "members": ["alpha", "beta", "gamma"]}),
        );
        (a, b, g)
    }

    pub fn open_project(&mut self, dir: &str) -> (PathBuf, String) {
        let d = self.root.join("work").join(dir);
        std::fs::create_dir_all(&d).unwrap();
        let p = self.ok(None, "project_open", json!({"path": d.to_str().unwrap()}));
        (d, p["id"].as_str().unwrap().to_string())
    }

    pub fn task(&mut self, token: &str, room: &str, to: Option<&str>) -> String {
        let t = self.ok(
            Some(token),
            "task_create",
            json!({"room": room, "title": "a task", "to": to}),
        );
        let id = t["task"]["id"].as_str().unwrap().to_string();
        self.tasks.push(id.clone());
        id
    }

    pub fn task_status(&mut self, task: &str) -> String {
        self.ok(None, "owner_task_show", json!({"task": task}))["task"]["status"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The Work Gate's loop: sync, then confirm each receipt until nothing is left unread.
    pub fn sync_all(&mut self, token: &str, room: &str) {
        let mut page = self.ok(Some(token), "sync", json!({"room": room}));
        for _ in 0..10_000 {
            let next = self.ok(
                Some(token),
                "sync",
                json!({"room": room, "confirm": page["receipt"]}),
            );
            let empty = next["items"].as_array().is_some_and(|a| a.is_empty());
            if next["more"] == false && empty {
                return;
            }
            page = next;
        }
        panic!("sync of {room} never caught up");
    }

    /// Replace config.toml at once (written aside, then renamed): a daemon reading it between
    /// a truncation and the write would run on the defaults meanwhile.
    pub fn write_config(&self, text: &str) {
        let aside = self.state.join("config.toml.new");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, self.state.join("config.toml")).unwrap();
    }

    pub fn event_ids(&mut self, room: &str) -> Vec<(String, String)> {
        let log = self.ok(None, "room_log", json!({"room": room, "limit": 1000}));
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["id"].as_str().unwrap().to_string(),
                    e["actor"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

pub fn bytecount(b: &[u8]) -> usize {
    b.iter().filter(|&&c| c == b'\n').count()
}

/// The machine's pids of the live processes whose command line holds `marker` (a confined
/// worker runs in a PID namespace of its own, so the pids it reports are not the machine's;
/// the test workers mark what they leave behind, in its command line and its environment).
pub fn marked(marker: &str) -> Vec<u32> {
    assert!(
        marker.len() > 16,
        "a marker that names its launch: {marker:?}"
    );
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let env = format!("ROOM_TEST_MARK={marker}");
            let holds = |file: &str, word: &[u8]| {
                std::fs::read(format!("/proc/{pid}/{file}"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == word))
            };
            holds("cmdline", marker.as_bytes()) || holds("environ", env.as_bytes())
        })
        .collect()
}
