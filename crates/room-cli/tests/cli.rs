//! The `room` binary as a user meets it: init, serve, owner and agent commands, refusal output
//! and exit codes, the split-brain and single-daemon refusals at start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
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

    fn cmd(&self, state: &Path, args: &[&str], token: Option<&str>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_room"));
        c.args(args)
            .arg("--state-dir")
            .arg(state)
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("ROOM_LOG", "error");
        c.env_remove("ROOM_TOKEN")
            .env_remove("ROOM_CONVERSATION")
            .env_remove("ROOM_TIER");
        if let Some(t) = token {
            c.env("ROOM_TOKEN", t);
        }
        c
    }

    fn run(&self, args: &[&str], token: Option<&str>) -> Output {
        self.cmd(&self.state, args, token).output().unwrap()
    }

    /// Read `room` as `tok` to its tip, confirming each page; the last page.
    fn caught_up(&self, tok: &str, room: &str) -> serde_json::Value {
        let mut confirm: Option<String> = None;
        for _ in 0..100 {
            let mut args = vec!["sync", room, "--json"];
            if let Some(c) = &confirm {
                args.extend(["--confirm", c.as_str()]);
            }
            let page = json(&self.run(&args, Some(tok)));
            if page["more"] != true && confirm.is_some() {
                return page;
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
        panic!("never caught up");
    }

    fn serve(&self, state: &Path) -> Child {
        let mut child = self.cmd(state, &["serve"], None).spawn().unwrap();
        for _ in 0..500 {
            if state.join("room.sock").exists() && self.run(&["list"], None).status.success() {
                return child;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return child;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("daemon did not come up");
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn a_session_from_init_to_refusal_and_the_start_refusals() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let mut daemon = env.serve(&env.state);

    // an engine thread count out of range is a usage error naming the flag
    let bad = env
        .cmd(&env.state, &["serve", "--engine-threads", "0"], None)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("--engine-threads"),
        "{}",
        stderr(&bad)
    );

    // a second daemon on the same state dir names the first one's pid
    let second = env.cmd(&env.state, &["serve"], None).output().unwrap();
    assert_eq!(second.status.code(), Some(4), "{}", stderr(&second));
    assert!(
        stderr(&second).contains(&format!("pid {}", daemon.id())),
        "{}",
        stderr(&second)
    );

    let enrolled = env.run(&["agent", "enroll", "alpha", "--json"], None);
    assert!(enrolled.status.success(), "{}", stderr(&enrolled));
    let token = json(&enrolled)["token"].as_str().unwrap().to_string();
    assert!(
        env.run(&["create", "lobby", "--member", "alpha"], None)
            .status
            .success()
    );

    // a blind write: exit 1, error[CODE] on stderr, --json puts the refusal on stdout
    let blind = env.run(&["say", "lobby", "hello", "--json"], Some(&token));
    assert_eq!(blind.status.code(), Some(1));
    assert!(
        stderr(&blind).starts_with("error[room_sync_required]:"),
        "{}",
        stderr(&blind)
    );
    assert_eq!(json(&blind)["refusal"]["code"], "room_sync_required");
    let receipt = json(&blind)["refusal"]["detail"]["next_page"]["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        env.run(&["sync", "lobby", "--confirm", &receipt], Some(&token))
            .status
            .success()
    );
    let said = env.run(&["say", "lobby", "hello", "--json"], Some(&token));
    assert!(said.status.success(), "{}", stderr(&said));

    // room connect enrolls, then rotates an existing agent, and prints the host's configuration
    let c = env.run(&["connect", "claude-code", "carol", "--json"], None);
    assert!(c.status.success(), "{}", stderr(&c));
    let first = json(&c);
    assert_eq!(first["rotated"], false);
    let token1 = first["token"].as_str().unwrap().to_string();
    assert!(
        first["config"]["stdio"]
            .as_str()
            .unwrap()
            .contains(&format!("ROOM_TOKEN={token1}"))
    );
    assert!(first["config"]["stdio"].as_str().unwrap().contains(" mcp"));
    let again = json(&env.run(&["connect", "codex", "carol", "--json"], None));
    assert_eq!(again["rotated"], true);
    let token2 = again["token"].as_str().unwrap();
    assert_ne!(token1, token2);
    assert!(
        again["config"]["stdio"]
            .as_str()
            .unwrap()
            .contains("[mcp_servers.room]")
    );
    // Gemini: HTTP as `type: http` (httpUrl is deprecated), and how to trust the folder
    let gemini = json(&env.run(&["connect", "gemini", "dave", "--json"], None));
    let http: serde_json::Value =
        serde_json::from_str(gemini["config"]["http"].as_str().unwrap()).unwrap();
    assert_eq!(http["mcpServers"]["room"]["type"], "http");
    assert!(
        gemini["config"]["note"]
            .as_str()
            .unwrap()
            .contains("GEMINI_CLI_TRUST_WORKSPACE=true")
    );
    let old = env.run(&["whoami"], Some(&token1));
    assert!(
        stderr(&old).starts_with("error[credential_revoked]"),
        "{}",
        stderr(&old)
    );
    assert!(env.run(&["whoami"], Some(token2)).status.success());

    // the audit path answers for any event
    let event = json(&said)["event"].as_str().unwrap().to_string();
    let audit = env.run(&["audit", "lobby", &event, "--json"], None);
    assert!(audit.status.success(), "{}", stderr(&audit));
    assert_eq!(json(&audit)["event"]["id"], event.as_str());

    // a bad name: a clear error naming the field, nothing stored
    let bad = env.run(&["create", "../escape"], None);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("error[invalid_argument]: room:"),
        "{}",
        stderr(&bad)
    );

    // a non-UTF-8 path is refused at the edge, nothing stored
    {
        use std::os::unix::ffi::OsStrExt;
        let raw = std::ffi::OsStr::from_bytes(b"/tmp/\xff\xfe-project");
        let out = env
            .cmd(&env.state, &["project", "open"], None)
            .arg(raw)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr(&out).contains("error[invalid_argument]: path: not UTF-8"),
            "{}",
            stderr(&out)
        );
        let list = env.run(&["project", "list", "--json"], None);
        assert_eq!(json(&list)["projects"].as_array().unwrap().len(), 0);
    }

    // offline verify passes while the daemon runs
    let v = env.run(&["verify", "--json"], None);
    assert!(v.status.success());
    assert_eq!(json(&v)["rooms"][0]["records"], 2);
    // asked for (or on a terminal), it says each room on stderr as it goes; stdout is the same
    let p = env.run(&["verify", "--json", "--progress"], None);
    assert!(p.status.success());
    assert_eq!(json(&p), json(&v));
    let rooms = json(&v)["rooms"].as_array().unwrap().len();
    assert_eq!(
        stderr(&p)
            .lines()
            .filter(|l| l.starts_with("verifying "))
            .count(),
        rooms,
        "{}",
        stderr(&p)
    );
    assert!(
        stderr(&v).is_empty(),
        "no progress unless asked: {}",
        stderr(&v)
    );

    daemon.kill().unwrap();
    daemon.wait().unwrap();

    // a copied tree is a split brain: its marker names the original path
    let copy = env.root.join("copy");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&env.state)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let _ = std::fs::remove_file(copy.join("room.sock"));
    let out = env.cmd(&copy, &["serve"], None).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(
        stderr(&out).contains("state_dir_split_brain"),
        "{}",
        stderr(&out)
    );

    // reached through a symlink
    let link = env.root.join("link");
    std::os::unix::fs::symlink(&env.state, &link).unwrap();
    let out = env.cmd(&link, &["serve"], None).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(
        stderr(&out).contains("state_dir_split_brain"),
        "{}",
        stderr(&out)
    );

    // without the daemon, agent commands say how to start it
    let down = env.run(&["list"], None);
    assert_eq!(down.status.code(), Some(3));
    assert!(stderr(&down).contains("room serve"));
}

/// Acceptance on the command line: `task create --accept JSON` (one check per flag),
/// `task check`, `task show --json`, and a `done` refused until the artifact exists.
#[test]
fn task_acceptance_from_the_command_line() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let mut daemon = env.serve(&env.state);
    let token = |name: &str, tier: &str| {
        let o = env.run(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        );
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["token"].as_str().unwrap().to_string()
    };
    let (a, b) = (token("alpha", "coordinator"), token("beta", "member"));
    let dir = env.root.join("project");
    std::fs::create_dir_all(&dir).unwrap();
    let p = json(&env.run(&["project", "open", dir.to_str().unwrap(), "--json"], None));
    let pid = p["id"].as_str().unwrap();
    let made = env.run(
        &[
            "create",
            "build",
            "--project",
            pid,
            "--member",
            "alpha",
            "--member",
            "beta",
        ],
        None,
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let sync_all = |tok: &str| {
        let mut confirm: Option<String> = None;
        for _ in 0..100 {
            let mut args = vec!["sync", "build", "--json"];
            if let Some(c) = &confirm {
                args.extend(["--confirm", c.as_str()]);
            }
            let page = json(&env.run(&args, Some(tok)));
            if page["more"] != true && confirm.is_some() {
                return;
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
        panic!("never caught up");
    };
    // a malformed check is refused naming its flag's field; nothing is created
    let bad = env.run(
        &[
            "task",
            "create",
            "build",
            "t",
            "--accept",
            r#"{"kind":"file_exists","path":"/etc"}"#,
        ],
        Some(&a),
    );
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("accept[0].path"), "{}", stderr(&bad));
    let not_json = env.run(
        &["task", "create", "build", "t", "--accept", "{nope"],
        Some(&a),
    );
    assert_eq!(not_json.status.code(), Some(2), "{}", stderr(&not_json));
    assert!(
        stderr(&not_json).contains("--accept"),
        "{}",
        stderr(&not_json)
    );

    let created = env.run(
        &[
            "task",
            "create",
            "build",
            "write the report",
            "--to",
            "beta",
            "--requirement",
            "a report exists",
            "--accept",
            r#"{"kind":"file_exists","path":"report.md"}"#,
            "--accept",
            r#"{"kind":"file_absent","path":"report.draft"}"#,
            "--json",
        ],
        Some(&a),
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let t = json(&created)["task"]["id"].as_str().unwrap().to_string();
    assert!(env.run(&["task", "claim", &t], Some(&b)).status.success());
    sync_all(&b);

    let check = env.run(&["task", "check", &t, "--json"], Some(&b));
    assert!(check.status.success(), "{}", stderr(&check));
    let check = json(&check);
    assert_eq!(check["acceptance_pass"], false);
    assert_eq!(
        check["acceptance_results"][0]["detail"]["observation"],
        "absent"
    );
    assert_eq!(check["acceptance_results"][1]["pass"], true);

    let done = env.run(&["done", "build", "--task", &t], Some(&b));
    assert_eq!(done.status.code(), Some(1));
    assert!(
        stderr(&done).starts_with("error[task_acceptance_failed]"),
        "{}",
        stderr(&done)
    );
    std::fs::write(dir.join("report.md"), "# report\n").unwrap();
    let done = env.run(&["done", "build", "--task", &t, "--json"], Some(&b));
    assert!(done.status.success(), "{}", stderr(&done));

    let shown = json(&env.run(&["task", "show", &t, "--json"], None));
    assert_eq!(shown["task"]["status"], "done");
    assert_eq!(shown["task"]["requirements"][0], "a report exists");
    assert_eq!(shown["last_acceptance"]["acceptance_pass"], true);
    assert_eq!(
        shown["last_acceptance"]["acceptance_results"][0]["detail"]["path"],
        "project:/report.md"
    );
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// `room bench swarm` end to end at its smallest size, on both of its MCP clients: every call is
/// answered, agents claim the tasks created for them and finish them, and nothing is refused but
/// by the Work Gate.
#[test]
fn the_wakes_bench_reaches_every_worker_and_stops_every_tree() {
    let env = Env::new();
    let root = env.root.to_str().unwrap();
    let out = env.run(&["bench", "wakes", "--dir", root], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    for row in [
        "send -> worker claim, 1 recipient(s)",
        "send -> worker claim, 16 recipient(s)",
        "send -> worker claim, 64 recipient(s)",
        "stop -> zero processes, 50-process tree",
    ] {
        assert!(stdout.contains(row), "no row {row:?}: {stdout}");
    }
}

/// `room bench` (the core rows) at its shortest, on one shared-room row: the raw baseline and
/// the one-writer row run, and the shared row lands turns, compares them with one writer
/// measured right before it and reports refusals, re-read bytes and the spread per agent.
#[test]
fn the_core_bench_runs_a_shared_room_row_against_one_writer() {
    let env = Env::new();
    let root = env.root.to_str().unwrap();
    let out = env.run(
        &[
            "bench",
            "--seconds",
            "1",
            "--only",
            "10 agents in one room, read_through",
            "--dir",
            root,
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    for row in [
        "raw SQLite single-row commits",
        "gated turns, 1 writer(s) each in its own room",
    ] {
        assert!(stdout.contains(row), "no row {row:?}: {stdout}");
    }
    let shared = stdout
        .lines()
        .find(|l| l.starts_with("10 agents in one room, read_through"))
        .unwrap_or_else(|| panic!("no shared-room row: {stdout}"));
    assert!(
        shared.contains("x one writer (") && shared.contains("/s, measured right before)"),
        "{shared}"
    );
    assert!(shared.contains("B re-read per turn") && shared.contains("per agent min"));
    let per_s: f64 = shared
        .trim_start_matches("10 agents in one room, read_through")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no rate: {shared}"));
    assert!(per_s > 0.0, "the shared room landed turns: {shared}");
    assert!(
        !stdout.contains("100 agents"),
        "--only keeps the other rows out: {stdout}"
    );
}

#[test]
fn the_swarm_bench_runs_on_both_clients() {
    let env = Env::new();
    for client in ["lean", "rmcp"] {
        let root = env.root.to_str().unwrap();
        let out = env.run(
            &[
                "bench",
                "swarm",
                "--seconds",
                "5",
                "--agents",
                "10",
                "--by-tool",
                "--client",
                client,
                "--dir",
                root,
            ],
            None,
        );
        let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(out.status.success(), "{client}: {err}");
        let row: Vec<&str> = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some("10"))
            .unwrap_or_else(|| panic!("{client}: no row for 10 agents: {stdout}"))
            .split_whitespace()
            .collect();
        let (accepted, calls): (f64, f64) = (row[2].parse().unwrap(), row[3].parse().unwrap());
        assert!(accepted > 0.0 && calls > accepted, "{client}: {stdout}");
        for tool in [
            "room_sync",
            "task_create",
            "task_claim",
            "room_done",
            "room_reply",
        ] {
            assert!(
                err.lines().any(|l| l.trim_start().starts_with(tool)),
                "{client}: no {tool} calls: {err}"
            );
        }
        assert!(
            !err.contains("refused for other reasons"),
            "{client}: {err}"
        );
    }
}

#[test]
fn a_send_wakes_the_scripted_agent_which_replies() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let mut daemon = env.serve(&env.state);
    let token = |name: &str, tier: &str| {
        let o = env.run(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        );
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["token"].as_str().unwrap().to_string()
    };
    let (a, b) = (token("alpha", "coordinator"), token("beta", "member"));
    // the route: beta's wakes go to Room's own scripted agent, which reads and replies
    let set = env.run(
        &[
            "route",
            "set",
            "beta",
            "--adapter",
            "script",
            "--steps",
            "read,reply",
            "--tag",
            "reviewer",
        ],
        None,
    );
    assert!(set.status.success(), "{}", stderr(&set));
    let listed = json(&env.run(&["route", "list", "--json"], None));
    assert_eq!(
        listed["routes"]["beta"],
        serde_json::json!({"adapter": "script", "steps": ["read", "reply"], "tags": ["reviewer"]}),
        "{listed}"
    );
    let bad = env.run(
        &[
            "route",
            "set",
            "beta",
            "--adapter",
            "script",
            "--steps",
            "dance",
        ],
        None,
    );
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("invalid_argument"),
        "{}",
        stderr(&bad)
    );
    assert!(
        env.run(
            &["create", "chat", "--member", "alpha", "--member", "beta"],
            None
        )
        .status
        .success()
    );
    let caught_up = |tok: &str| env.caught_up(tok, "chat");
    caught_up(&a);
    let sent = env.run(
        &["send", "chat", "review the plan", "--to", "beta"],
        Some(&a),
    );
    assert!(sent.status.success(), "{}", stderr(&sent));
    let mut state = String::new();
    for _ in 0..300 {
        let w = json(&env.run(&["wakes", "list", "--json"], None));
        state = w["wakes"][0]["state"].as_str().unwrap_or("").to_string();
        if !matches!(state.as_str(), "queued" | "dispatched" | "") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(state, "replied");
    let page = caught_up(&b);
    assert_eq!(
        page["open_items"].as_array().unwrap().len(),
        1,
        "the mention stays: {page}"
    );
    assert!(
        page["open_items"][0]["kind"] == "mention",
        "the obligation was answered by the woken worker"
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
}

#[test]
fn a_worker_reaches_room_through_room_api_and_bad_lines_are_refused_one_by_one() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    // a shell worker: the shell may not speak to its broker itself, Room's binary may
    let script = r#"read prompt; printf '{"bridge":"%s","sha256":"%s"}\n' "$ROOM_BRIDGE" "$(sha256sum < "$ROOM_BRIDGE" | cut -d' ' -f1)"; printf '{"op":"whoami","token":"%s","args":{}}\nnot json\n\n{"op":"whoami","token":"%s","args":{}}\n' "$ROOM_TOKEN" "$ROOM_TOKEN" | "$ROOM_BRIDGE" api"#;
    std::fs::write(
        env.state.join("config.toml"),
        format!(
            "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\ntimeout_ms = 30000\n"
        ),
    )
    .unwrap();
    let mut daemon = env.serve(&env.state);
    let token = |name: &str, tier: &str| {
        let o = env.run(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        );
        json(&o)["token"].as_str().unwrap().to_string()
    };
    let (a, _b) = (token("alpha", "coordinator"), token("beta", "member"));
    env.run(
        &["create", "chat", "--member", "alpha", "--member", "beta"],
        None,
    );
    // the owner's own lines, through the state dir's socket
    let mut owner = env.cmd(&env.state, &["api"], None);
    owner
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = owner.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"{\"op\":\"agent_list\",\"args\":{}}\n[1]\n")
            .unwrap();
        stdin.write_all(&vec![b' '; (2 << 20) + 10]).unwrap();
        stdin
            .write_all(b"\n{\"op\":\"ping\",\"args\":{}}\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0]["ok"], true, "{lines:?}");
    assert_eq!(lines[1]["refusal"]["code"], "invalid_argument");
    assert_eq!(lines[1]["refusal"]["detail"]["field"], "request");
    assert_eq!(lines[2]["refusal"]["code"], "payload_too_large");
    assert_eq!(
        lines[3]["ok"], true,
        "the bridge goes on after a refused line"
    );
    // the worker's: a wake of beta runs the shell, which asks who it is through `room api`
    env.caught_up(&a, "chat");
    let sent = env.run(&["send", "chat", "who are you", "--to", "beta"], Some(&a));
    assert!(sent.status.success(), "{}", stderr(&sent));
    let mut launch = String::new();
    for _ in 0..600 {
        let w = json(&env.run(&["wakes", "list", "--json"], None));
        let state = w["wakes"][0]["state"].as_str().unwrap_or("").to_string();
        if !matches!(state.as_str(), "queued" | "dispatched" | "") {
            launch = w["wakes"][0]["launches"][0]["launch"]
                .as_str()
                .unwrap()
                .to_string();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!launch.is_empty(), "the worker never ended");
    let log = std::fs::read_to_string(env.state.join("workers").join(&launch).join("stdout.log"))
        .unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{log}");
    // the bridge it ran is Room's binary staged by its digest, not the daemon's own path
    let digest = Command::new("sha256sum")
        .arg(env!("CARGO_BIN_EXE_room"))
        .output()
        .unwrap();
    let digest = String::from_utf8(digest.stdout).unwrap();
    let digest = digest.split(' ').next().unwrap();
    assert_eq!(lines[0]["sha256"], digest, "{log}");
    assert_eq!(
        lines[0]["bridge"],
        env.state
            .join("bridge")
            .join(format!("room-{digest}"))
            .to_str()
            .unwrap(),
        "{log}"
    );
    assert_eq!(lines[1]["result"]["agent"], "beta", "{log}");
    assert_eq!(lines[2]["refusal"]["code"], "invalid_argument", "{log}");
    assert_eq!(lines[3]["result"]["agent"], "beta", "{log}");
    let _ = daemon.kill();
    let _ = daemon.wait();
}

#[test]
fn cancel_reconcile_and_break_glass_from_the_command_line() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let mut daemon = env.serve(&env.state);
    let enroll = |name: &str, tier: &str| {
        let o = env.run(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        );
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["token"].as_str().unwrap().to_string()
    };
    let (b, ops) = (enroll("beta", "member"), enroll("ops", "operator"));
    let made = env.run(
        &["create", "coord", "--member", "beta", "--member", "ops"],
        None,
    );
    assert!(made.status.success(), "{}", stderr(&made));
    // a member's cancel is refused with its code, whatever --by says
    let o = env.run(&["cancel", "coord", "--by", "operator", "--json"], Some(&b));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("control_standing_required"),
        "{}",
        stderr(&o)
    );
    let o = env.run(
        &["cancel", "coord", "--by", "on call", "--json"],
        Some(&ops),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o)["actor"], "ops");
    let o = env.run(&["reconcile", "coord", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o)["unresolved"], 0);
    // --hold needs --outcome and --evidence
    let o = env.run(
        &["reconcile", "coord", "--hold", "hld_0000000000000000"],
        None,
    );
    assert!(!o.status.success());
    let o = env.run(&["resume", "coord", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = env.run(&["break-glass", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o)["break_glass"], true);
    let o = env.run(&["break-glass", "--release", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = env.run(&["stops", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o)["stops"], serde_json::json!([]));
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// `room serve --store` takes a PostgreSQL url (the daemon on PostgreSQL is tested in
/// room-server's `postgres` suite): a url of another kind is refused before anything starts,
/// as is one in config.toml's `[store] url`, and a server that does not answer is an error
/// that starts nothing.
#[test]
fn serve_store_urls_are_checked_before_anything_starts() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let o = env.run(&["serve", "--store", "mysql://x"], None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("error[invalid_argument]: store: the url is not a postgres:// url")
            && err.contains("hint: run room serve without --store"),
        "{err}"
    );
    let config = env.state.join("config.toml");
    let kept = std::fs::read_to_string(&config).unwrap_or_default();
    std::fs::write(&config, format!("{kept}\n[store]\nurl = \"sqlite:///x\"\n")).unwrap();
    let o = env.run(&["serve"], None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("error[invalid_argument]: store: config.toml: store.url"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&config, kept).unwrap();
    // nothing listens on port 1: the engine does not open, and no socket appears
    let o = env.run(
        &["serve", "--store", "postgres://room@127.0.0.1:1/room"],
        None,
    );
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot open the engine") && stderr(&o).contains("postgres"),
        "{}",
        stderr(&o)
    );
    assert!(!env.state.join("room.sock").exists(), "no daemon started");
    // a migration's target is checked the same way, before the state dir is opened
    let o = env.run(&["migrate", "--to", "sqlite:///x"], None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("error[invalid_argument]: to: the url is not a postgres:// url"),
        "{}",
        stderr(&o)
    );
    // a server that does not answer leaves the state dir as it was
    let o = env.run(
        &["migrate", "--to", "postgres://room@127.0.0.1:1/room"],
        None,
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(!env.state.join("store_migrated.json").exists());
}

/// `room audit TASK`: a task finished honestly is `proven`; once its artifact is changed after
/// acceptance the audit measures it again and says `failed`, naming the check; neither audit
/// writes anything (the room's tip and the task's recorded evaluation stay). `--html` writes
/// one self-contained page; a malformed target is refused before the daemon is asked.
#[test]
fn task_audit_proves_an_honest_task_and_flags_a_changed_artifact() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let mut daemon = env.serve(&env.state);
    let token = |name: &str, tier: &str| {
        let o = env.run(
            &["agent", "enroll", name, "--max-tier", tier, "--json"],
            None,
        );
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["token"].as_str().unwrap().to_string()
    };
    let (a, b) = (token("alpha", "coordinator"), token("beta", "member"));
    let dir = env.root.join("project");
    std::fs::create_dir_all(&dir).unwrap();
    let p = json(&env.run(&["project", "open", dir.to_str().unwrap(), "--json"], None));
    let pid = p["id"].as_str().unwrap();
    let made = env.run(
        &[
            "create",
            "build",
            "--project",
            pid,
            "--member",
            "alpha",
            "--member",
            "beta",
        ],
        None,
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let report = "# report\n";
    let digest = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(report.as_bytes()))
    };
    let check = format!(r#"{{"kind":"sha256","path":"report.md","expected":"{digest}"}}"#);
    let created = env.run(
        &[
            "task",
            "create",
            "build",
            "write the report",
            "--to",
            "beta",
            "--accept",
            &check,
            "--json",
        ],
        Some(&a),
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let t = json(&created)["task"]["id"].as_str().unwrap().to_string();
    // an assignment that seals a wake permit for beta
    env.caught_up(&a, "build");
    let sent = env.run(
        &[
            "send",
            "build",
            "@beta the report, please",
            "--task",
            &t,
            "--to",
            "beta",
        ],
        Some(&a),
    );
    assert!(sent.status.success(), "{}", stderr(&sent));
    env.caught_up(&b, "build");
    assert!(env.run(&["task", "claim", &t], Some(&b)).status.success());
    std::fs::write(dir.join("report.md"), report).unwrap();
    env.caught_up(&b, "build");
    let done = env.run(&["done", "build", "--task", &t], Some(&b));
    assert!(done.status.success(), "{}", stderr(&done));

    let tip = |env: &Env| json(&env.run(&["log", "build", "--json"], None))["tip_seq"].clone();
    let recorded = |env: &Env| {
        json(&env.run(&["task", "show", &t, "--json"], None))["last_acceptance"].clone()
    };
    let (tip_before, recorded_before) = (tip(&env), recorded(&env));
    let page = env.root.join("audit.html");
    let audit = env.run(
        &["audit", &t, "--html", page.to_str().unwrap(), "--json"],
        None,
    );
    assert!(audit.status.success(), "{}", stderr(&audit));
    let honest = json(&audit);
    assert_eq!(honest["verdict"], "proven", "{honest:#}");
    assert_eq!(honest["task"]["status"], "done");
    assert_eq!(honest["acceptance"]["now"]["acceptance_pass"], true);
    assert_eq!(honest["acceptance"]["changed"], serde_json::json!([]));
    // the permit sealed for the task is replayed through dispatch's revalidation now
    let wakes = honest["wakes"].as_array().unwrap();
    assert_eq!(wakes.len(), 1, "{honest:#}");
    assert_eq!(wakes[0]["agent"], "beta");
    // a permit for a task already done would not dispatch today
    assert_eq!(wakes[0]["replay"]["passes"], false, "{honest:#}");
    assert_eq!(wakes[0]["replay"]["code"], "wake_task_authority_changed");
    // the readiness map names every ancestor and who confirmed it
    let ready = honest["readiness"].as_array().unwrap();
    assert!(!ready.is_empty(), "{honest:#}");
    assert!(
        ready.iter().all(|r| r["unconfirmed_by"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x != "beta")),
        "{honest:#}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("proven") && !html.to_lowercase().contains("<script"));
    // the same state audits the same, but for when the audit ran
    let mut again = json(&env.run(&["audit", &t, "--json"], None));
    let mut first = honest.clone();
    first["audited_ms"] = serde_json::Value::Null;
    again["audited_ms"] = serde_json::Value::Null;
    assert_eq!(
        first, again,
        "an audit is deterministic given the same state"
    );

    // the artifact changes after acceptance: the audit measures it again and says so
    std::fs::write(dir.join("report.md"), "# report, edited later\n").unwrap();
    let failed_page = env.root.join("audit-failed.html");
    let changed = json(&env.run(
        &[
            "audit",
            &t,
            "--html",
            failed_page.to_str().unwrap(),
            "--json",
        ],
        None,
    ));
    // scripts/test opens both pages in Chromium (tests/audit/test_audit_html.py)
    if let Some(out) = std::env::var_os("ROOM_AUDIT_HTML_OUT") {
        let out = PathBuf::from(out);
        std::fs::create_dir_all(&out).unwrap();
        std::fs::copy(&page, out.join("audit-proven.html")).unwrap();
        std::fs::copy(&failed_page, out.join("audit-failed.html")).unwrap();
    }
    assert_eq!(changed["verdict"], "failed", "{changed:#}");
    assert_eq!(changed["acceptance"]["changed"], serde_json::json!([0]));
    assert_eq!(changed["acceptance"]["now"]["acceptance_pass"], false);
    let reasons = changed["reasons"].to_string();
    assert!(reasons.contains("sha256 (accept[0])"), "{reasons}");
    // neither audit wrote anything
    assert_eq!(tip(&env), tip_before);
    assert_eq!(recorded(&env), recorded_before);

    // refusals: a target that is no task id, an unknown task, an agent asking
    let bad = env.run(&["audit", "nonsense"], None);
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(
        stderr(&bad).starts_with("error[invalid_argument]: target"),
        "{}",
        stderr(&bad)
    );
    let unknown = env.run(&["audit", "tsk_0000000000000000"], None);
    assert_eq!(unknown.status.code(), Some(1), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).starts_with("error[task_not_found]"),
        "{}",
        stderr(&unknown)
    );
    let agent = env.run(&["audit", &t], Some(&b));
    assert_eq!(agent.status.code(), Some(1), "{}", stderr(&agent));
    assert!(
        stderr(&agent).starts_with("error[owner_required]"),
        "{}",
        stderr(&agent)
    );
    assert_eq!(tip(&env), tip_before);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// `room prove`: all twelve claims pass on a scratch world with a real daemon and real worker
/// processes, each step checked by its code and every chain verified; an unknown claim is
/// refused; the user's state dir is never made. (That each card can fail is
/// `scripts/prove-planted`'s to show: it needs a build with planted bugs.)
#[test]
fn room_prove_runs_every_claim_on_a_scratch_world() {
    let env = Env::new();
    let o = env.run(&["prove", "--json"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let card = json(&o);
    assert_eq!(card["verdict"], "pass", "{card:#}");
    assert_eq!(card["chains_ok"], true);
    let claims = card["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 12);
    for c in claims {
        assert_eq!(c["status"], "pass", "{c:#}");
        let steps = c["steps"].as_array().unwrap();
        assert!(steps.len() >= 5, "{c:#}");
        assert!(steps.iter().all(|s| s["pass"] == true), "{c:#}");
        assert!(c["ceiling"].as_str().is_some_and(|s| !s.is_empty()));
    }
    // the Work Gate's card reaches all nine participant verbs blind
    let gate = claims.iter().find(|c| c["id"] == "04-C05").unwrap();
    let blind = gate["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["evidence"]
                .as_str()
                .unwrap()
                .starts_with("room_sync_required")
        })
        .count();
    assert_eq!(blind, 9, "{gate:#}");
    // one claim alone, by its short name
    let o = env.run(&["prove", "7", "--json"], None);
    assert!(o.status.success());
    assert_eq!(json(&o)["claims"][0]["id"], "04-C07");

    let o = env.run(&["prove", "C13"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("error[invalid_argument]: claim"),
        "{}",
        stderr(&o)
    );
    assert!(!env.state.exists(), "the user's state dir is never made");
}

/// Every file under `dir` (relative path → bytes): what a refused snapshot or restore must
/// leave as it was.
fn tree_of(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(top: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(top).unwrap().to_str().unwrap().to_string();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                walk(top, &p, out);
            } else if meta.is_file() && !rel.ends_with("room.lock") {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = Default::default();
    walk(dir, dir, &mut out);
    out
}

fn same_tree(
    a: &std::collections::BTreeMap<String, Vec<u8>>,
    b: &std::collections::BTreeMap<String, Vec<u8>>,
    what: &str,
) {
    let differ: Vec<_> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .collect();
    assert!(
        differ.is_empty(),
        "{what} changed the state dir: {differ:?}"
    );
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// `room snapshot` and `room restore`: the state as it was at the snapshot comes back (the
/// agent's token, its room, its place in the chain, the index accepted as it stood), the
/// replaced tree is kept, and every refusal leaves the state dir byte for byte as it was:
/// a running daemon, links in the live tree or in a snapshot, a changed file, an entry outside
/// a store, a manifest naming a path outside, another state dir, another restore unfinished.
/// A restore cut short at either step blocks the daemon and `room verify` until it is run
/// again, and then finishes.
#[test]
fn snapshot_and_restore_bring_the_state_back_and_refuse_links_and_strangers() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let mut daemon = env.serve(&env.state);
    let o = env.run(
        &[
            "agent",
            "enroll",
            "alpha",
            "--max-tier",
            "coordinator",
            "--json",
        ],
        None,
    );
    let a = json(&o)["token"].as_str().unwrap().to_string();
    assert!(
        env.run(&["create", "lobby", "--member", "alpha"], None)
            .status
            .success()
    );
    env.caught_up(&a, "lobby");
    let said = env.run(&["say", "lobby", "before the snapshot"], Some(&a));
    assert!(said.status.success(), "{}", stderr(&said));
    let snap = env.root.join("snap");
    // the daemon holds the state dir: no snapshot, and nothing made
    let held = env.run(&["snapshot", "--out", snap.to_str().unwrap()], None);
    assert_eq!(held.status.code(), Some(4), "{}", stderr(&held));
    assert!(
        stderr(&held).contains("daemon already running"),
        "{}",
        stderr(&held)
    );
    assert!(!snap.exists());
    // killed, not stopped: the snapshot replays what the commit log holds first
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let taken = env.run(
        &["snapshot", "--out", snap.to_str().unwrap(), "--json"],
        None,
    );
    assert!(taken.status.success(), "{}", stderr(&taken));
    let taken = json(&taken);
    assert_eq!(taken["rooms"].as_array().unwrap().len(), 1);
    let records_then = taken["rooms"][0]["records"].as_u64().unwrap();
    let graph = taken["rooms"][0]["graph_id"].as_str().unwrap().to_string();
    assert!(records_then >= 2, "{taken}");

    // snapshot refusals, each leaving the state dir as it was
    let before = tree_of(&env.state);
    let refused = |args: &[&str], code: &str| {
        let o = env.run(args, None);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).starts_with(&format!("error[{code}]")),
            "{args:?}: {}",
            stderr(&o)
        );
        stderr(&o)
    };
    refused(
        &["snapshot", "--out", snap.to_str().unwrap()],
        "invalid_argument",
    );
    let inside = env.state.join("rooms").join("snap");
    refused(
        &["snapshot", "--out", inside.to_str().unwrap()],
        "invalid_argument",
    );
    std::fs::remove_dir(&inside).unwrap();
    let room_dir = env.state.join("rooms").join(&graph);
    std::os::unix::fs::symlink("/etc/passwd", room_dir.join("evil")).unwrap();
    let why = refused(
        &["snapshot", "--out", env.root.join("s2").to_str().unwrap()],
        "snapshot_link_refused",
    );
    assert!(why.contains("is a symbolic link"), "{why}");
    std::fs::remove_file(room_dir.join("evil")).unwrap();
    std::fs::hard_link(env.state.join("config.toml"), env.state.join("stops/extra")).unwrap();
    let why = refused(
        &["snapshot", "--out", env.root.join("s3").to_str().unwrap()],
        "snapshot_link_refused",
    );
    assert!(why.contains("is a hard link"), "{why}");
    std::fs::remove_file(env.state.join("stops/extra")).unwrap();
    same_tree(&tree_of(&env.state), &before, "a refused snapshot");

    // life goes on after the snapshot
    let mut daemon = env.serve(&env.state);
    env.caught_up(&a, "lobby");
    let said = env.run(&["say", "lobby", "after the snapshot"], Some(&a));
    assert!(said.status.success(), "{}", stderr(&said));
    assert!(env.run(&["create", "second"], None).status.success());
    // a restore while the daemon runs
    let o = env.run(&["restore", snap.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let now = tree_of(&env.state);

    // restore refusals: damaged, linked or foreign snapshots change nothing
    let variant = |name: &str, change: &dyn Fn(&Path)| {
        let v = env.root.join(name);
        copy_tree(&snap, &v);
        change(&v);
        v
    };
    let journal = format!("tree/rooms/{graph}/EVENTS.jsonl");
    let changed = variant("changed", &|v| {
        let p = v.join(&journal);
        let mut bytes = std::fs::read(&p).unwrap();
        let i = bytes.iter().position(|b| *b == b'{').unwrap();
        bytes[i + 2] ^= 1;
        std::fs::write(&p, bytes).unwrap();
    });
    let symlinked = variant("symlinked", &|v| {
        std::os::unix::fs::symlink("/etc", v.join("tree/rooms/etc")).unwrap();
    });
    let outside_secret = env.root.join("secret");
    std::fs::write(&outside_secret, "secret").unwrap();
    let hard = variant("hard", &|v| {
        std::fs::remove_file(v.join("tree/config.toml")).unwrap();
        std::fs::hard_link(&outside_secret, v.join("tree/config.toml")).unwrap();
    });
    let stray = variant("stray", &|v| {
        std::fs::write(v.join("tree/stray.txt"), "x").unwrap();
    });
    let escaping = variant("escaping", &|v| {
        let p = v.join("snapshot.json");
        let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        m["files"].as_array_mut().unwrap().insert(
            0,
            serde_json::json!({"path": "../../outside", "bytes": 6,
                "sha256": "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"}),
        );
        m["fingerprint"] = "".into();
        m["fingerprint"] = room_core::canon::digest_of(&m).into();
        std::fs::write(&p, serde_json::to_vec(&m).unwrap()).unwrap();
    });
    for (v, code, says) in [
        (
            &changed,
            "snapshot_invalid",
            "is not the file the manifest names",
        ),
        (&symlinked, "snapshot_link_refused", "is a symbolic link"),
        (&hard, "snapshot_link_refused", "is a hard link"),
        (
            &stray,
            "snapshot_path_outside",
            "not part of a state dir's store",
        ),
        (&escaping, "snapshot_path_outside", "is not a path inside"),
    ] {
        let why = refused(&["restore", v.to_str().unwrap()], code);
        assert!(why.contains(says), "{why}");
        same_tree(&tree_of(&env.state), &now, code);
    }
    let other = env.root.join("other-state");
    let o = env
        .cmd(&other, &["restore", snap.to_str().unwrap()], None)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("error[snapshot_other_state_dir]"),
        "{}",
        stderr(&o)
    );
    assert!(!other.exists());

    // a restore cut short after staging, then after moving the live tree aside: the daemon
    // and `room verify` refuse the state dir, another snapshot is refused, the same one
    // finishes the restore
    for fault in ["restore_after_staged", "restore_after_moved_aside"] {
        let o = env
            .cmd(&env.state, &["restore", snap.to_str().unwrap()], None)
            .env("ROOM_FAULT", fault)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{fault}");
        assert!(env.state.join("restore_pending.json").exists(), "{fault}");
        let serve = env.cmd(&env.state, &["serve"], None).output().unwrap();
        assert_eq!(serve.status.code(), Some(4), "{fault}: {}", stderr(&serve));
        assert!(
            stderr(&serve).contains("restore pending"),
            "{}",
            stderr(&serve)
        );
        let verify = env.run(&["verify"], None);
        assert!(!verify.status.success(), "{fault}");
        let foreign = variant(&format!("foreign-{fault}"), &|v| {
            let p = v.join("snapshot.json");
            let mut m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            m["taken_ms"] = (m["taken_ms"].as_u64().unwrap() + 1).into();
            m["fingerprint"] = "".into();
            m["fingerprint"] = room_core::canon::digest_of(&m).into();
            std::fs::write(&p, serde_json::to_vec(&m).unwrap()).unwrap();
        });
        refused(&["restore", foreign.to_str().unwrap()], "restore_pending");
        if fault == "restore_after_staged" {
            // resumed by the next fault's run, which stages again
            continue;
        }
        let done = env.run(&["restore", snap.to_str().unwrap(), "--json"], None);
        assert!(done.status.success(), "{}", stderr(&done));
        let done = json(&done);
        assert_eq!(done["resumed"], true, "{done}");
        assert_eq!(done["unpinned"], serde_json::json!([]), "{done}");
        let previous = PathBuf::from(done["previous"].as_str().unwrap());
        assert!(previous.join("control.db").exists(), "{done}");
    }
    assert!(!env.state.join("restore_pending.json").exists());

    // the state as it was: one room, its chain where the snapshot left it, the agent at work
    let verify = env.run(&["verify", "--json"], None);
    assert!(verify.status.success(), "{}", stderr(&verify));
    assert_eq!(
        json(&verify)["rooms"][0]["records"].as_u64(),
        Some(records_then)
    );
    let mut daemon = env.serve(&env.state);
    let list = json(&env.run(&["list"], None));
    let rooms: Vec<_> = list["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["room"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(rooms, ["lobby"]);
    // the index took the restored journal as the one it knew (not a rotation)
    assert!(list["rooms"][0]["quarantined"].is_null(), "{list}");
    assert!(list["rooms"][0]["read_only"].is_null(), "{list}");
    assert_eq!(list["rooms"][0]["tip_seq"].as_u64(), Some(records_then));
    env.caught_up(&a, "lobby");
    let said = env.run(&["say", "lobby", "after the restore"], Some(&a));
    assert!(said.status.success(), "{}", stderr(&said));
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}
