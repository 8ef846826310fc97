//! The `acp` adapter against a real third-party ACP agent: `tests/acp/agent.py`, built on the
//! official ACP Python SDK, which reaches Room only through the MCP server it is given in
//! `session/new` (the official MCP Python SDK over `room mcp`). Each rung of the proof ladder
//! the adapter can reach is reached through real processes: a correlated reply, a turn that
//! ends without one, a cancel the agent honours, a cancel it ignores (its whole group is
//! still ended, down to a grandchild), and a session that speaks under another's id.
//!
//! Needs a Python with `agent-client-protocol` and `mcp` (scripts/test makes `.venv`), or
//! `ROOM_TEST_PYTHON` naming one.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

fn python() -> PathBuf {
    let p = std::env::var_os("ROOM_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    let ok = Command::new(&p)
        .args(["-c", "import acp, mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} cannot import acp and mcp\nhint: run scripts/test once (it makes .venv), or set ROOM_TEST_PYTHON",
        p.display()
    );
    // absolute, but not canonical: a venv's python is a symlink that finds its packages only
    // when started by its own path
    let dir = std::fs::canonicalize(p.parent().unwrap()).unwrap();
    dir.join(p.file_name().unwrap())
}

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
            .env_remove("ROOM_CONVERSATION");
        if let Some(t) = token {
            c.env("ROOM_TOKEN", t);
        }
        c
    }

    fn run(&self, args: &[&str], token: Option<&str>) -> Output {
        self.cmd(args, token).output().unwrap()
    }

    fn ok(&self, args: &[&str], token: Option<&str>) -> Value {
        let o = self.run(args, token);
        assert!(
            o.status.success(),
            "room {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    }

    fn serve(&self) -> Daemon {
        let child = Daemon(self.cmd(&["serve"], None).spawn().unwrap());
        for _ in 0..500 {
            if self.state.join("room.sock").exists() && self.run(&["list"], None).status.success() {
                return child;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("daemon did not come up");
    }

    fn caught_up(&self, tok: &str, room: &str) {
        let mut confirm: Option<String> = None;
        for _ in 0..100 {
            let mut args = vec!["sync", room, "--json"];
            if let Some(c) = &confirm {
                args.extend(["--confirm", c.as_str()]);
            }
            let page = self.ok(&args, Some(tok));
            if page["more"] != true && confirm.is_some() {
                return;
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
        panic!("never caught up");
    }
}

/// The daemon, ended with the test whether it passes or not.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const MODES: [&str; 5] = ["reply", "silent", "hang", "ignore_cancel", "wrong_body"];

/// Every wake, once none is queued or dispatched any more, by recipient.
fn settled(env: &Env) -> std::collections::BTreeMap<String, Value> {
    // a bound well past the longest route deadline (60 s) and its kill grace, counted in time, not
    // in polls (a poll is a CLI call, slower on a loaded machine)
    let until = std::time::Instant::now() + Duration::from_secs(180);
    while std::time::Instant::now() < until {
        let w = env.ok(&["wakes", "list", "--json"], None);
        let wakes = w["wakes"].as_array().unwrap().clone();
        let busy = wakes
            .iter()
            .any(|w| matches!(w["state"].as_str(), Some("queued" | "dispatched")));
        if wakes.len() == MODES.len() && !busy {
            return wakes
                .into_iter()
                .map(|w| (w["agent"].as_str().unwrap().to_string(), w))
                .collect();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "the wakes never settled: {}",
        env.ok(&["wakes", "list", "--json"], None)
    );
}

/// The machine's pids of the live processes whose command line holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    // a zombie is dead: only its exit status is left for a parent to collect
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

#[test]
fn a_wake_reaches_a_real_acp_agent_and_each_proof_is_what_was_seen() {
    let py = python();
    let agent_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
    let env = Env::new();
    env.ok(&["init"], None);
    let mut config = String::new();
    for m in MODES {
        // hang and ignore_cancel meet their deadline: a short one, yet long enough for five Python
        // agents starting at once on two cores, beside the other tests of this binary, to reach
        // their prompt (10 s was not, once, on a loaded CI run: the hang agent was still importing
        // its SDKs and the honest proof was `dispatched`)
        let timeout_ms = if m.contains("hang") || m.contains("cancel") {
            30_000
        } else {
            60_000
        };
        config.push_str(&format!(
            "[routes.{a}]\nadapter = \"acp\"\ncommand = [{py:?}, {agent:?}, {m:?}]\ntimeout_ms = {timeout_ms}\n\n",
            a = m.replace('_', "-"),
            py = py.display().to_string(),
            agent = agent_py.display().to_string(),
        ));
    }
    std::fs::write(env.state.join("config.toml"), config).unwrap();
    let daemon = env.serve();
    let token = |name: &str, tier: &str| {
        env.ok(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        )["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let boss = token("boss", "coordinator");
    let mut create = vec!["create", "chat", "--member", "boss"];
    let names: Vec<String> = MODES.iter().map(|m| m.replace('_', "-")).collect();
    for n in &names {
        token(n, "member");
        create.extend(["--member", n.as_str()]);
    }
    env.ok(&create, None);
    for n in &names {
        env.caught_up(&boss, "chat");
        env.ok(
            &["send", "chat", &format!("check the build, {n}"), "--to", n],
            Some(&boss),
        );
    }
    let wakes = settled(&env);
    let launch = |agent: &str| -> Value {
        let w = &wakes[agent];
        let l = w["launches"].as_array().expect("launches listed");
        assert_eq!(l.len(), 1, "one launch per permit: {w}");
        l[0].clone()
    };

    // a reply from the bound session, correlated by the launch's conversation
    let l = launch("reply");
    assert_eq!(wakes["reply"]["state"], "replied", "{l}");
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&"replied".into(), &"replied".into())
    );
    assert_eq!(l["adapter"]["stop_reason"], "end_turn");
    assert!(
        l["adapter"]["session"].is_string() && l["adapter"]["updates_bound"].as_u64() >= Some(2)
    );

    // the turn ended without a reply: seen, still owed
    let l = launch("silent");
    assert_eq!(wakes["silent"]["state"], "pending_reply", "{l}");
    assert_eq!(l["outcome"], "body_visible_pending_reply");
    assert_eq!(l["proof"], "body_visible_pending_reply");

    // the deadline cancels the prompt; the agent honours it
    let l = launch("hang");
    assert_eq!(wakes["hang"]["state"], "failed", "{l}");
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&"timed_out".into(), &"delivered_to_body".into())
    );
    assert_eq!(l["adapter"]["cancel_sent"], true);
    assert_eq!(l["adapter"]["stop_reason"], "cancelled");

    // an agent that ignores the cancel is ended with its whole group, grandchild included
    let l = launch("ignore-cancel");
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&"timed_out".into(), &"delivered_to_body".into()),
        "{l}"
    );
    assert_eq!(l["adapter"]["cancel_sent"], true);
    assert!(l["adapter"]["stop_reason"].is_null(), "{l}");
    let log = std::fs::read_to_string(
        env.state
            .join("workers")
            .join(l["launch"].as_str().unwrap())
            .join("stderr.log"),
    )
    .unwrap();
    let child: Value = log
        .lines()
        .filter_map(|x| serde_json::from_str::<Value>(x).ok())
        .find(|x| x["step"] == "child")
        .unwrap_or_else(|| panic!("the agent logged its child: {log}"));
    let marker = child["marker"].as_str().unwrap();
    assert_eq!(
        marked(marker),
        Vec::<u32>::new(),
        "the agent's grandchild {marker} outlived its launch"
    );
    assert_eq!(
        l["job"]["confirmed_empty"], true,
        "zero processes observed: {l}"
    );
    assert!(!alive(l["pid"].as_u64().unwrap() as u32));

    // updates under another session's id: refused, no credit
    let l = launch("wrong-body");
    assert_eq!(wakes["wrong-body"]["state"], "failed", "{l}");
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&"wrong_body_rejected".into(), &"wrong_body_rejected".into())
    );
    assert!(l["adapter"]["updates_foreign"].as_u64() >= Some(1));

    drop(daemon);
}

/// Every wake once none is queued or dispatched, when there are `n`.
/// A permission request is allowed only for the tool kinds its route names and its
/// principal's scopes give: a route's `tool_kinds`, and a delegated principal's
/// `project:write` (edits) and `tools:execute` (programs), read at each launch.
#[test]
fn an_agent_is_allowed_only_the_tool_kinds_its_route_and_its_scopes_give() {
    let py = python();
    let agent_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
    let env = Env::new();
    env.ok(&["init"], None);
    // (agent, its route's tool_kinds, the scopes it is delegated: none for a root)
    let cases: [(&str, &str, Option<&[&str]>); 4] = [
        ("free", "", None),
        ("reader", "tool_kinds = [\"read\", \"execute\"]\n", None),
        ("scoped", "", Some(&["project:read"])),
        ("writer", "", Some(&["project:read", "project:write"])),
    ];
    let mut config = String::new();
    for (name, kinds, _) in &cases {
        config.push_str(&format!(
            "[routes.{name}]\nadapter = \"acp\"\ncommand = [{py:?}, {agent:?}, \"obey\"]\npermissions = \"allow_once\"\n{kinds}timeout_ms = 60000\n\n",
            py = py.display().to_string(),
            agent = agent_py.display().to_string(),
        ));
    }
    std::fs::write(env.state.join("config.toml"), &config).unwrap();
    let daemon = env.serve();
    let boss = env.ok(
        &[
            "agent",
            "enroll",
            "boss",
            "--max-tier",
            "coordinator",
            "--json",
        ],
        None,
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut create = vec!["create", "chat", "--member", "boss"];
    for (name, _, scopes) in &cases {
        let mut args = vec!["agent"];
        match scopes {
            None => args.extend(["enroll", name, "--max-tier", "member", "--json"]),
            Some(list) => {
                args.extend(["delegate", name, "--max-tier", "member", "--json"]);
                for s in *list {
                    args.extend(["--scope", s]);
                }
            }
        }
        env.ok(&args, None);
        create.extend(["--member", name]);
    }
    env.ok(&create, None);
    for (name, _, _) in &cases {
        env.caught_up(&boss, "chat");
        env.ok(
            &[
                "send",
                "chat",
                &format!("make the probe, {name}"),
                "--to",
                name,
            ],
            Some(&boss),
        );
    }
    let wakes: std::collections::BTreeMap<String, Value> = settled_n(&env, cases.len())
        .into_iter()
        .map(|w| (w["agent"].as_str().unwrap().to_string(), w))
        .collect();
    // a tool the agent names no kind for is `other`: never allowed without every scope
    for (name, denied, wrote) in [
        ("free", json!(null), true),
        ("reader", json!({"edit": 1, "other": 1}), false),
        (
            "scoped",
            json!({"edit": 1, "execute": 1, "other": 1}),
            false,
        ),
        ("writer", json!({"execute": 1, "other": 1}), true),
    ] {
        let l = &wakes[name]["launches"][0];
        assert_eq!(l["adapter"]["permission_requests"], 3, "{name}: {l}");
        assert_eq!(l["adapter"]["permissions_denied"], denied, "{name}: {l}");
        let probe = env
            .state
            .join("workers")
            .join(l["launch"].as_str().unwrap())
            .join("room-probe.txt");
        assert_eq!(probe.exists(), wrote, "{name}: {l}");
    }
    drop(daemon);
}

fn settled_n(env: &Env, n: usize) -> Vec<Value> {
    for _ in 0..900 {
        let w = env.ok(&["wakes", "list", "--json"], None);
        let wakes = w["wakes"].as_array().unwrap().clone();
        let busy = wakes
            .iter()
            .any(|w| matches!(w["state"].as_str(), Some("queued" | "dispatched")));
        if wakes.len() == n && !busy {
            return wakes;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "the wakes never settled: {}",
        env.ok(&["wakes", "list", "--json"], None)
    );
}

#[test]
fn with_spawn_policy_never_a_wake_is_delivered_into_the_bound_session_or_not_at_all() {
    let py = python();
    let agent_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
    let env = Env::new();
    env.ok(&["init"], None);
    let sessions_file = env.root.join("keeper-sessions.json");
    let config = format!(
        "[routes.keeper]\nadapter = \"acp\"\ncommand = [{py:?}, {agent:?}, \"reply\", {file:?}]\nspawn_policy = \"never\"\ntags = [\"team:parser\", \"keeper\"]\n\n\
         [routes.noload]\nadapter = \"acp\"\ncommand = [{py:?}, {agent:?}, \"reply\"]\nspawn_policy = \"never\"\n\n\
         [routes.scripted]\nadapter = \"script\"\nsteps = [\"read\"]\n",
        py = py.display().to_string(),
        agent = agent_py.display().to_string(),
        file = sessions_file.display().to_string(),
    );
    std::fs::write(env.state.join("config.toml"), config).unwrap();
    let _daemon = env.serve();
    let token = |name: &str, tier: &str| {
        env.ok(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        )["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let boss = token("boss", "coordinator");
    token("keeper", "member");
    token("noload", "member");
    env.ok(
        &[
            "create", "chat", "--member", "boss", "--member", "keeper", "--member", "noload",
        ],
        None,
    );
    let send = |n: usize, to: &str| {
        env.caught_up(&boss, "chat");
        env.ok(
            &["send", "chat", &format!("task {n} for {to}"), "--to", to],
            Some(&boss),
        );
    };
    send(1, "keeper");
    send(1, "noload");
    settled_n(&env, 2);
    send(2, "keeper");
    send(2, "noload");
    let wakes = settled_n(&env, 4);
    let launches = |agent: &str| -> Vec<Value> {
        let mut l: Vec<Value> = wakes
            .iter()
            .filter(|w| w["agent"] == agent)
            .flat_map(|w| w["launches"].as_array().unwrap().clone())
            .collect();
        l.sort_by_key(|l| l["created_ms"].as_u64());
        l
    };

    // the first wake opens the session and binds it; the second loads it and replies in it
    let k = launches("keeper");
    assert_eq!(k.len(), 2, "{k:?}");
    assert!(k.iter().all(|l| l["proof"] == "replied"), "{k:?}");
    assert_eq!(k[0]["adapter"]["loaded"], false);
    assert_eq!(k[1]["adapter"]["loaded"], true, "{}", k[1]);
    assert_eq!(k[1]["adapter"]["session"], k[0]["adapter"]["session"]);
    assert!(
        k[1]["adapter"]["replayed_updates"].as_u64() >= Some(1),
        "a replay is no proof"
    );
    let listed = env.ok(&["sessions", "list", "--agent", "keeper", "--json"], None);
    let s = &listed["sessions"][0];
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");
    let native = k[0]["adapter"]["session"].as_str().unwrap();
    assert_eq!(s["id"], format!("sf_acp_{native}"));
    assert_eq!(
        (s["bound"].as_bool(), s["loadable"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(
        (s["launches"].as_u64(), s["proof"].as_str()),
        (Some(2), Some("replied"))
    );
    assert_eq!(s["lease"]["launch"], k[1]["launch"]);
    assert_eq!(s["transport"], "acp_stdio");
    // the profile Room ran it under and the route's tags; no fork, so no parent
    assert_eq!(
        s["model_profile"],
        json!({"adapter": "acp", "preset": null, "model": null}),
        "{s}"
    );
    assert_eq!(s["tags"], json!(["team:parser", "keeper"]));
    assert_eq!(s["parent"], Value::Null);
    let shown = env.ok(
        &["sessions", "show", s["id"].as_str().unwrap(), "--json"],
        None,
    );
    assert_eq!(shown["id"], s["id"]);

    // an agent that cannot load its bound session gets no sibling: the wake fails unprompted
    let n = launches("noload");
    assert_eq!(n[0]["proof"], "replied", "{}", n[0]);
    assert_eq!(
        (&n[1]["outcome"], &n[1]["proof"]),
        (&json!("failed"), &json!("dispatched")),
        "{}",
        n[1]
    );
    assert_eq!(n[1]["adapter"]["prompt_sent"], false);
    assert!(
        n[1]["adapter"]["error"]
            .as_str()
            .unwrap()
            .contains("offers no session/load")
    );
    let listed = env.ok(&["sessions", "list", "--agent", "noload", "--json"], None);
    assert_eq!(listed["sessions"][0]["launches"], 1, "{listed}");

    // an unknown session is not found, and the adapters say what they cover
    let o = env.run(&["sessions", "show", "sf_acp_nothing", "--json"], None);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not_found"));
    let adapters = env.ok(&["adapters", "list", "--json"], None);
    let acp = adapters["adapters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["adapter"] == "acp")
        .unwrap()
        .clone();
    assert!(
        acp["operations"]
            .as_array()
            .unwrap()
            .contains(&json!(["resume", "conditional"])),
        "{acp}"
    );

    // the session factory's list, asked of the agent itself: it lists its one session a page
    // (the command follows nextCursor), each beside Room's record of it
    let records = env.ok(&["sessions", "list", "--json"], None);
    let native_listed = env.ok(&["sessions", "native", "keeper", "--json"], None);
    let listed = native_listed["sessions"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{native_listed}");
    assert_eq!(listed[0]["session"], native, "{native_listed}");
    assert_eq!(listed[0]["title"], "session 1");
    assert_eq!(
        (&listed[0]["room"]["id"], &listed[0]["room"]["bound"]),
        (&json!(format!("sf_acp_{native}")), &json!(true)),
        "{native_listed}"
    );
    assert_eq!(native_listed["room_not_listed"], json!([]));
    assert_eq!(
        native_listed["job"]["confirmed_empty"], true,
        "{native_listed}"
    );
    // a session the agent keeps that Room never opened is shown as such, and the pages are
    // followed to the end
    let mut kept: Value = serde_json::from_slice(&std::fs::read(&sessions_file).unwrap()).unwrap();
    kept.as_array_mut()
        .unwrap()
        .push(json!({"id": "elsewhere-1", "cwd": "/tmp", "title": "opened by hand"}));
    std::fs::write(&sessions_file, kept.to_string()).unwrap();
    let both = env.ok(&["sessions", "native", "keeper", "--json"], None);
    assert_eq!(both["pages"], 2, "{both}");
    assert_eq!(both["sessions"][1]["session"], "elsewhere-1");
    assert_eq!(both["sessions"][1]["room"], Value::Null, "{both}");
    // an agent that offers no session/list, an adapter without native sessions and an agent
    // without a route are refused, and nothing Room keeps changed
    for (agent, code) in [
        ("noload", "session_op_unsupported"),
        ("scripted", "session_op_unsupported"),
        ("nobody", "not_found"),
    ] {
        let o = env.run(&["sessions", "native", agent, "--json"], None);
        assert_eq!(o.status.code(), Some(1), "{agent}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("error[{code}]")), "{agent}: {err}");
    }
    assert_eq!(env.ok(&["sessions", "list", "--json"], None), records);
}

/// The published ACP bridges, installed by scripts/test into tests/mcp/npm/node_modules.
fn bridges() -> PathBuf {
    let nm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/npm/node_modules");
    let nm = std::fs::canonicalize(&nm).unwrap_or(nm);
    for need in [
        "@zed-industries/claude-agent-acp/dist/index.js",
        "@zed-industries/codex-acp-linux-x64/bin/codex-acp",
        "@google/gemini-cli/bundle/gemini.js",
    ] {
        assert!(
            nm.join(need).exists(),
            "{} is missing\nhint: run scripts/test once (it installs tests/mcp/npm)",
            nm.join(need).display()
        );
    }
    nm
}

#[test]
fn the_published_acp_bridges_take_room_as_their_mcp_server_and_fail_cleanly_offline() {
    // as root, unshare needs no more; elsewhere the test says so rather than pass
    assert!(
        std::process::Command::new("/usr/bin/unshare")
            .args(["--net", "--", "/bin/true"])
            .status()
            .is_ok_and(|s| s.success()),
        "unshare --net is not available here"
    );
    let nm = bridges();
    let env = Env::new();
    env.ok(&["init"], None);
    let home = env.root.join("home");
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    // no telemetry and no update check: the bridges talk to loopback only
    std::fs::write(
        home.join(".gemini/settings.json"),
        r#"{"privacy":{"usageStatisticsEnabled":false},"telemetry":{"enabled":false},
            "general":{"enableAutoUpdate":false,"enableAutoUpdateNotification":false}}"#,
    )
    .unwrap();
    let work = env.root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let node = "/usr/bin/node";
    // each bridge runs in a network namespace of its own with no interface: a prompt that
    // tries to reach its vendor's API fails on this machine, and no traffic leaves it (Room's
    // MCP server is reached over its Unix socket, which the namespace does not touch)
    let offline = |argv: Vec<String>| -> Vec<String> {
        ["/usr/bin/unshare", "--net", "--"]
            .into_iter()
            .map(String::from)
            .chain(argv)
            .collect()
    };
    let routes = [
        (
            "claude",
            vec![
                node.to_string(),
                nm.join("@zed-industries/claude-agent-acp/dist/index.js")
                    .display()
                    .to_string(),
            ],
        ),
        (
            "codex",
            vec![
                nm.join("@zed-industries/codex-acp-linux-x64/bin/codex-acp")
                    .display()
                    .to_string(),
            ],
        ),
        (
            "gemini",
            vec![
                node.to_string(),
                nm.join("@google/gemini-cli/bundle/gemini.js")
                    .display()
                    .to_string(),
                "--acp".into(),
            ],
        ),
    ];
    let mut config = String::new();
    for (name, command) in &routes {
        let command = offline(command.clone());
        config.push_str(&format!(
            "[routes.{name}]\nadapter = \"acp\"\npreset = \"{name}\"\ncommand = {command:?}\ncwd = {cwd:?}\ntimeout_ms = 30000\n\n",
            cwd = work.display().to_string(),
        ));
    }
    std::fs::write(env.state.join("config.toml"), config).unwrap();
    // the keys the presets pass through: dummies (nothing can reach a model from here)
    let child = env
        .cmd(&["serve"], None)
        .env("HOME", &home)
        .env("CODEX_API_KEY", "dummy-key-for-tests")
        .env("GEMINI_API_KEY", "dummy-key-for-tests")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1")
        .spawn()
        .unwrap();
    let _daemon = Daemon(child);
    for _ in 0..500 {
        if env.run(&["list"], None).status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let boss = env.ok(
        &[
            "agent",
            "enroll",
            "boss",
            "--max-tier",
            "coordinator",
            "--json",
        ],
        None,
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut create = vec!["create", "chat", "--member", "boss"];
    for (name, _) in &routes {
        env.ok(&["agent", "enroll", name, "--json"], None);
        create.extend(["--member", name]);
    }
    env.ok(&create, None);
    for (name, _) in &routes {
        env.caught_up(&boss, "chat");
        env.ok(&["send", "chat", "say hello", "--to", name], Some(&boss));
    }
    let wakes = settled_n(&env, routes.len());
    for (name, _) in &routes {
        let w = wakes.iter().find(|w| w["agent"] == *name).unwrap();
        let l = &w["launches"][0];
        let a = &l["adapter"];
        // the handshake: the agent answered initialize and opened a session given Room's MCP server
        assert!(a["session"].is_string(), "{name}: no session: {l}");
        assert_eq!(a["prompt_sent"], true, "{name}: {l}");
        // offline, nothing can answer: a clean failure, never a reply
        assert_ne!(w["state"], "replied", "{name}: {w}");
        assert_ne!(l["proof"], "replied", "{name}: {l}");
        assert_eq!(
            l["job"]["confirmed_empty"], true,
            "{name}: zero processes: {l}"
        );
        eprintln!("{name}: {} / {} ({})", l["outcome"], l["proof"], a["error"]);
    }
}
