//! A collaboration run end to end by the real daemon (`room serve`), started and steered with
//! `room collab`: roles bound to Room's scripted agent (routed workers in owned jobs) write
//! their artifacts through the blackboard's fence, phases close only on Room's acceptance,
//! two independent phases run together, a gate runs the project's command, and an approval
//! waits for the person, bound to the digest of what it shows. A restart mid-goal resumes it.

use room_server::client::Client;
use room_server::wire::Request;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
    config_home: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let d = Dirs {
            state: root.join("state"),
            config_home: root.join("config"),
            root,
            _tmp: tmp,
        };
        assert!(d.room(&["init"]).status.success());
        d
    }

    fn room(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_room"))
            .args(args)
            .arg("--json")
            .arg("--state-dir")
            .arg(&self.state)
            .env("XDG_CONFIG_HOME", &self.config_home)
            .env("ROOM_LOG", "error")
            .env_remove("ROOM_TOKEN")
            .output()
            .unwrap()
    }

    /// `room ARGS` that must succeed: its JSON.
    #[track_caller]
    fn ok(&self, args: &[&str]) -> Value {
        let o = self.room(args);
        assert!(
            o.status.success(),
            "room {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// `room ARGS` that must be refused with `code`: the refusal.
    #[track_caller]
    fn refused(&self, args: &[&str], code: &str) -> Value {
        let o = self.room(args);
        assert_eq!(
            o.status.code(),
            Some(1),
            "room {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["refusal"]["code"], code, "{v}");
        v["refusal"].clone()
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(d: &Dirs) -> Daemon {
    // the daemon's warnings go to a file beside the state dir, shown when a wait runs out
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.root.join("daemon.log"))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_room"))
        .args(["serve", "--state-dir"])
        .arg(&d.state)
        .env("XDG_CONFIG_HOME", &d.config_home)
        .env(
            "ROOM_LOG",
            std::env::var("ROOM_TEST_DAEMON_LOG").unwrap_or("warn".into()),
        )
        .env("NO_COLOR", "1")
        .stderr(log)
        .spawn()
        .expect("room serve starts");
    for _ in 0..3_000 {
        if let Ok(mut c) = Client::connect(&d.state.join("room.sock"))
            && c.call(&Request::new("ping", json!({}))).is_ok()
        {
            return Daemon(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("daemon exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("daemon did not come up");
}

/// Poll `room collab status ID` until `pred` holds (the scheduler works on its own clock; the
/// bound is generous: a burst of fifty phases beside the other tests on two cores is slow).
#[track_caller]
fn until(d: &Dirs, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = d.ok(&["collab", "status", id]);
        if pred(&s) {
            return s;
        }
        if start.elapsed() >= Duration::from_secs(180) {
            let log = std::fs::read_to_string(d.root.join("daemon.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            let wakes = d.room(&["wakes", "list", id]);
            panic!(
                "{what} never came: {s:#}\nwakes: {}\nthe daemon's last warnings:\n{}",
                String::from_utf8_lossy(&wakes.stdout),
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pending approval request of `phase`, if any.
fn pending(s: &Value, phase: &str) -> Option<Value> {
    s["approvals"]
        .as_array()?
        .iter()
        .find(|a| a["state"] == "pending" && a["phase"] == phase)
        .cloned()
}

fn phase<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == name)
        .unwrap_or_else(|| panic!("no phase {name}: {s}"))
}

/// The pack of this test: spec → research ∥ architecture → gate → approval, each agent phase
/// on its own role, the roles scripted to write canned artifacts.
fn pack(d: &Dirs) -> PathBuf {
    d.write("pack/p.md", "Do your part of the goal.\n");
    d.write(
        "pack/pack.toml",
        r#"name = "t"

[[phases]]
name = "spec"
kind = "agent"
role = "reasoning"
writes = ["spec"]
prompt = "p.md"

[[phases]]
name = "research"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
prompt = "p.md"
approve = false

[[phases]]
name = "architecture"
kind = "agent"
role = "architecture"
reads = ["spec"]
writes = ["adr"]
prompt = "p.md"
approve = false

[[phases]]
name = "gate"
kind = "gate"
reads = ["research", "adr"]
commands = [{ program = "/bin/sh", args = ["-c", "test -f Makefile"], timeout_ms = 30000 }]

[[phases]]
name = "approval"
kind = "approval"
reads = ["adr", "research"]
after = ["gate"]
"#,
    )
}

/// A role that claims its task, writes `kind` from its canned file, and closes the task.
fn role(d: &Dirs, name: &str, kind: &str, content: Value) -> String {
    let file = d.write(&format!("canned/{kind}.json"), &content.to_string());
    format!(
        "{name}=script:read,claim,put:{kind}={},done",
        file.display()
    )
}

#[test]
fn a_pack_runs_from_spec_to_an_approval_bound_to_what_it_shows() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    std::fs::write(
        d.state.join("config.toml"),
        "[acceptance]\ncommands = [\"/bin/sh\"]\n",
    )
    .unwrap();
    let project = d.root.join("work/sample");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("Makefile"), "test:\n\ttrue\n").unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let pack = pack(&d);
    let roles = [
        role(
            &d,
            "reasoning",
            "spec",
            json!({"title": "a flag", "goal": "add --verbose", "requirements": ["prints each step"]}),
        ),
        role(
            &d,
            "search",
            "research",
            json!({"summary": "clap has it", "findings": [{"claim": "clap counts flags", "source": "docs.rs/clap"}]}),
        ),
        role(
            &d,
            "architecture",
            "adr",
            json!({"title": "use clap", "status": "accepted", "context": "a CLI flag", "decision": "clap's count action"}),
        ),
    ];
    let mut args = vec![
        "collab",
        "start",
        "--goal",
        "add a --verbose flag",
        "--project",
        &prj,
        "--pack",
        pack.to_str().unwrap(),
    ];
    for r in &roles {
        args.extend(["--role", r.as_str()]);
    }
    // refusals at start write nothing: an unbound role
    d.refused(&args[..8], "profile_invalid");
    let started = d.ok(&args);
    let id = started["collab"].as_str().unwrap().to_string();
    assert_eq!(started["room"], id);
    // each role's worker is confined by its policy: the searcher reads the project and
    // reaches the network, the architect only reads; where the machine cannot confine, the
    // start says those limits are advisory
    let routes = d.ok(&["route", "list"]);
    let search = &routes["routes"][format!("{id}-search")];
    let arch = &routes["routes"][format!("{id}-architecture")];
    if started["advisory"].as_array().unwrap().is_empty() {
        assert_eq!(search["project"], "read_only", "{routes:#}");
        assert_eq!(search["network"], "host");
        assert_eq!(arch["project"], "read_only");
        assert_eq!(arch["network"], "none");
    } else {
        assert!(
            std::env::var("ROOM_TEST_CONFINEMENT").as_deref() != Ok("required"),
            "this machine must confine: {started:#}"
        );
        assert!(search.get("project").is_none(), "{routes:#}");
    }
    // the spec's role writes the project (the default profile's implementer): its dispatch
    // waits for the person, showing the full delegation input
    let s = until(&d, &id, "the spec's dispatch approval", |s| {
        pending(s, "spec").is_some()
    });
    let ask = pending(&s, "spec").unwrap();
    assert_eq!(ask["input"]["backend"]["adapter"], "script", "{ask:#}");
    assert_eq!(ask["input"]["prompt"], "Do your part of the goal.\n");
    assert_eq!(ask["input"]["agent"], format!("{id}-reasoning"));
    assert_eq!(s["cost"]["usd"], 0.0, "nothing ran yet: nothing spent");
    let revised = d.write("revised.md", "Write the spec of the flag, nothing else.");
    d.ok(&[
        "collab",
        "revise",
        ask["approval"].as_str().unwrap(),
        "--digest",
        ask["digest"].as_str().unwrap(),
        "--prompt",
        revised.to_str().unwrap(),
    ]);
    // research and architecture both read only the spec: they run together
    let s = until(&d, &id, "research and architecture together", |s| {
        let (r, a) = (phase(s, "research"), phase(s, "architecture"));
        r["task"].is_string() && a["task"].is_string()
    });
    assert_eq!(phase(&s, "spec")["state"], "done", "{s:#}");
    // the revised prompt is what the spec's role was sent
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    assert!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"]["verb"] == "send"
                && e["event"]["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("Write the spec of the flag, nothing else."))),
        "{log:#}"
    );
    // the approval phase waits for the person, showing what the phases produced
    let s = until(&d, &id, "the approval request", |s| {
        pending(s, "approval").is_some()
    });
    assert_eq!(phase(&s, "gate")["state"], "done", "{s:#}");
    let pending = pending(&s, "approval").unwrap();
    let shown = pending["input"]["reads"].as_array().unwrap();
    assert_eq!(shown.len(), 2, "{pending:#}");
    assert!(
        shown
            .iter()
            .all(|r| r["sha256"].as_str().unwrap().len() == 64)
    );
    let approval = pending["approval"].as_str().unwrap();
    let digest = pending["digest"].as_str().unwrap();
    // a decision on anything but what is shown is stale, and decides nothing
    let r = d.refused(
        &["collab", "approve", approval, "--digest", &"0".repeat(64)],
        "approval_stale",
    );
    assert_eq!(r["detail"]["digest"], digest);
    assert_eq!(
        phase(&d.ok(&["collab", "status", &id]), "approval")["state"],
        "approval"
    );
    // the blackboard as the person reads it
    let artifacts = d.ok(&["collab", "artifacts", &id]);
    let kinds: Vec<&str> = artifacts["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["adr", "research", "spec"]);
    let adr = d.ok(&["collab", "show", &id, "adr"]);
    assert_eq!(adr["content"]["decision"], "clap's count action");
    assert_eq!(adr["producer"], format!("{id}-architecture"));
    d.ok(&["collab", "approve", approval, "--digest", digest]);
    let s = until(&d, &id, "the collaboration done", |s| s["state"] == "done");
    assert!(
        s["phases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "done"),
        "{s:#}"
    );
    // the two independent phases ran at the same time: each started before the other ended;
    // and no phase ran twice
    let run = |name: &str| {
        s["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["phase"] == name)
            .unwrap()
            .clone()
    };
    let (r, a) = (run("research"), run("architecture"));
    let ms = |v: &Value, k: &str| v[k].as_u64().unwrap();
    assert!(
        ms(&r, "started_ms") <= ms(&a, "ended_ms") && ms(&a, "started_ms") <= ms(&r, "ended_ms"),
        "{r} {a}"
    );
    assert_eq!(s["runs"].as_array().unwrap().len(), 5, "{s:#}");
    // three scripted launches kept no usage records: the money is unknown, never guessed
    assert_eq!(s["cost"]["launches_without_usage"], 3, "{:#}", s["cost"]);
    assert_eq!(s["cost"]["usd"], "unknown");
    // decided once; the finished collaboration's identities are revoked
    d.refused(
        &["collab", "approve", approval, "--digest", digest],
        "approval_stale",
    );
    let agents = d.ok(&["agent", "list"]);
    for a in agents["agents"].as_array().unwrap() {
        if a["name"].as_str().unwrap().starts_with(&id) {
            assert_eq!(a["revoked"], true, "{a}");
        }
    }
    assert!(d.room(&["verify"]).status.success());
}

#[test]
fn a_start_that_cannot_run_is_refused_and_leaves_nothing() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let before = d.ok(&["agent", "list"]);
    // the shipped pack's review panel seats two reviewers: one binding leaves a seat unbound
    let all = [
        "orchestrator=script:read",
        "search=script:read",
        "reasoning=script:read",
        "architecture=script:read",
        "review=script:read",
    ];
    let mut args = vec![
        "collab",
        "start",
        "--goal",
        "g",
        "--project",
        "prj_00000000",
    ];
    for r in &all {
        args.extend(["--role", r]);
    }
    let r = d.refused(&args, "profile_invalid");
    assert_eq!(r["detail"]["role"], "review-2", "{r}");
    // an API role is not wired into collaborations yet
    let pack = pack(&d);
    let api = [
        "--role",
        "reasoning=openai:gpt-x",
        "--role",
        "search=script:read",
        "--role",
        "architecture=script:read",
    ];
    let mut args = vec![
        "collab",
        "start",
        "--goal",
        "g",
        "--project",
        "prj_00000000",
        "--pack",
        pack.to_str().unwrap(),
    ];
    args.extend(api);
    let r = d.refused(&args, "profile_invalid");
    assert_eq!(r["detail"]["role"], "reasoning", "{r}");
    // the gate's program is not on the owner's allowlist
    args.truncate(8);
    args.extend([
        "--role",
        "reasoning=script:read",
        "--role",
        "search=script:read",
        "--role",
        "architecture=script:read",
    ]);
    d.refused(&args, "acceptance_command_not_allowed");
    assert_eq!(d.ok(&["agent", "list"]), before, "nothing was minted");
    assert_eq!(d.ok(&["collab", "list"])["collabs"], json!([]));
}

/// kill -9 of the daemon at four points: while a dispatch waits for approval, just after it is
/// approved (wherever its dispatch has got to), while the approval phase waits, and just after
/// that is approved. Each restart resumes the collaboration where it stood (the same request,
/// the same digest), and it finishes with every phase run once and each role sent its work
/// once.
#[test]
fn a_collaboration_resumes_after_the_daemon_is_killed() {
    let d = Dirs::new();
    let mut daemon = spawn(&d);
    std::fs::write(
        d.state.join("config.toml"),
        "[acceptance]\ncommands = [\"/bin/sh\"]\n",
    )
    .unwrap();
    let project = d.root.join("work/sample");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("Makefile"), "test:\n\ttrue\n").unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let pack = pack(&d);
    let roles = [
        role(
            &d,
            "reasoning",
            "spec",
            json!({"title": "t", "goal": "g", "requirements": ["r"]}),
        ),
        role(
            &d,
            "search",
            "research",
            json!({"summary": "s", "findings": []}),
        ),
        role(
            &d,
            "architecture",
            "adr",
            json!({"title": "t", "status": "proposed", "context": "c", "decision": "d"}),
        ),
    ];
    let mut args = vec![
        "collab",
        "start",
        "--goal",
        "g",
        "--project",
        &prj,
        "--pack",
        pack.to_str().unwrap(),
    ];
    for r in &roles {
        args.extend(["--role", r.as_str()]);
    }
    let id = d.ok(&args)["collab"].as_str().unwrap().to_string();
    // a person holds the orchestrator's enrolled credential: the scheduler's own credential is
    // another, held in its process only, so no restart rotates this one away
    let held = d.ok(&["agent", "rotate", &format!("{id}-orch")])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let whoami = |token: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_room"))
            .args(["whoami", "--json", "--state-dir"])
            .arg(&d.state)
            .env("XDG_CONFIG_HOME", &d.config_home)
            .env("ROOM_TOKEN", token)
            .env("ROOM_LOG", "error")
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&o.stdout).unwrap_or(Value::Null)
    };
    for waiting in ["spec", "approval"] {
        let s = until(&d, &id, "a pending request", |s| {
            pending(s, waiting).is_some()
        });
        let before = pending(&s, waiting).unwrap();
        drop(daemon);
        daemon = spawn(&d);
        let s = until(&d, &id, "the same request after the restart", |s| {
            pending(s, waiting).is_some()
        });
        let after = pending(&s, waiting).unwrap();
        let me = whoami(&held);
        assert_eq!(
            me["agent"],
            format!("{id}-orch"),
            "the restart left it as it was: {me}"
        );
        assert_eq!(after["approval"], before["approval"], "{s:#}");
        assert_eq!(after["digest"], before["digest"]);
        d.ok(&[
            "collab",
            "approve",
            after["approval"].as_str().unwrap(),
            "--digest",
            after["digest"].as_str().unwrap(),
        ]);
        // and at once again, wherever the dispatch that follows has got to
        drop(daemon);
        daemon = spawn(&d);
    }
    let s = until(&d, &id, "the collaboration done", |s| s["state"] == "done");
    assert_eq!(s["runs"].as_array().unwrap().len(), 5, "{s:#}");
    // once the goal closes it is revoked with the collaboration's tree
    let after = whoami(&held);
    assert_eq!(after["refusal"]["code"], "credential_revoked", "{after}");
    // each agent phase was sent to its role once: no stored phase is asked for twice
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    let sends = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["verb"] == "send")
        .count();
    assert_eq!(sends, 3, "{log:#}");
    assert!(d.room(&["verify"]).status.success());
    drop(daemon);
}

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Issue 41, item 1: an implementing role works in a clone of the project's HEAD that Room
/// made beneath the state directory, never in the person's checkout (confined, the checkout
/// is read-only to it); its diff is taken from that tree against the recorded base; the gate
/// measures the base with that diff applied (the person's checkout would fail the tests);
/// the trees go when the goal closes, and the person's uncommitted change stays theirs.
#[test]
fn an_implementer_works_in_its_own_tree_and_the_person_s_checkout_never_changes() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    std::fs::write(
        d.state.join("config.toml"),
        "[acceptance]\ncommands = [\"/bin/sh\"]\n",
    )
    .unwrap();
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    std::fs::write(
        project.join("test.sh"),
        "set -e\n[ \"$(sh greet.sh --verbose)\" = \"hello, verbosely\" ]\n",
    )
    .unwrap();
    std::fs::write(project.join("README"), "greeter\n").unwrap();
    git(&project, &["init", "-q"]);
    git(&project, &["add", "."]);
    git(&project, &["commit", "-qm", "greeter"]);
    let head = git(&project, &["rev-parse", "HEAD"]);
    // the person's own work in progress, not committed: not in the base, never touched
    std::fs::write(project.join("README"), "greeter\nlocal edit\n").unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let confined = std::env::var("ROOM_TEST_CONFINEMENT").as_deref() == Ok("required");
    // the implementer: tries the person's checkout (confined: read-only to it), then
    // changes its own tree (where it starts) and has Room take the diff
    let attempt = if confined {
        format!(
            "echo tampered >> {}/greet.sh 2>/dev/null && echo yes > wrote-checkout || true\n",
            project.display()
        )
    } else {
        String::new()
    };
    let program = d.write(
        "kit/implement.sh",
        &format!(
            "#!/bin/sh\nset -e\n{attempt}pwd > .where\nprintf '#!/bin/sh\\nif [ \"$1\" = \"--verbose\" ]; then echo \"hello, verbosely\"; exit 0; fi\\necho hello\\n' > greet.sh\necho news > NEWS\nexec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done\n"
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.write(
        "pack/p.md",
        "Implement it in your tree, then diff_from_tree.\n",
    );
    let pack = d.write(
        "pack/pack.toml",
        r#"name = "t"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
writes = ["diff"]
prompt = "p.md"
approve = false

[[phases]]
name = "gate"
kind = "gate"
reads = ["diff"]
commands = [{ program = "/bin/sh", args = ["test.sh"], timeout_ms = 30000 }]
"#,
    );
    let role = format!("reasoning=command:{}", program.display());
    let started = d.ok(&[
        "collab",
        "start",
        "--goal",
        "greet.sh --verbose",
        "--project",
        &prj,
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        &role,
    ]);
    let id = started["collab"].as_str().unwrap().to_string();
    let trees = &started["trees"];
    assert_eq!(trees["base"], head.as_str(), "{started}");
    assert_eq!(
        (trees["source"].clone(), trees["uncommitted"].clone()),
        (json!("git"), json!(true))
    );
    let tree = PathBuf::from(trees["trees"][format!("{id}-reasoning")].as_str().unwrap());
    assert!(
        tree.starts_with(d.state.join("trees").join(&id)),
        "{tree:?}"
    );
    let done = until(&d, &id, "the goal's end", |s| s["state"] != "running");
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(phase(&done, "gate")["state"], "done", "{done:#}");
    // the diff: against the recorded base, from the tree, without the person's edit
    let diff = d.ok(&["collab", "show", &id, "diff"]);
    let content = &diff["content"];
    assert_eq!(content["base"], head.as_str());
    let patch = content["patch"].as_str().unwrap();
    assert!(
        patch.contains("+++ b/NEWS") && patch.contains("hello, verbosely"),
        "{patch}"
    );
    assert!(
        patch.contains("+++ b/.where"),
        "the worker started in its tree: {patch}"
    );
    assert!(!patch.contains("local edit"), "{patch}");
    assert!(
        !patch.contains("wrote-checkout"),
        "the checkout was writable: {patch}"
    );
    assert_eq!(diff["producer"], format!("{id}-reasoning"));
    // the person's checkout: exactly as they left it, the gate's tests failing there still
    assert_eq!(
        std::fs::read_to_string(project.join("greet.sh")).unwrap(),
        "#!/bin/sh\necho hello\n"
    );
    assert_eq!(git(&project, &["status", "--porcelain"]), "M README");
    assert_eq!(git(&project, &["rev-parse", "HEAD"]), head);
    // the trees went with the goal
    assert!(!d.state.join("trees").join(&id).exists());
    // the person merges: the diff applies to their checkout, and the tests pass there now
    let mut apply = Command::new("git")
        .args(["apply", "-"])
        .current_dir(&project)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(patch.as_bytes())
        .unwrap();
    assert!(apply.wait().unwrap().success());
    let tests = Command::new("/bin/sh")
        .arg("test.sh")
        .current_dir(&project)
        .status()
        .unwrap();
    assert!(tests.success());
}

/// Issue 42, item 2: a panel fans the diff out to reviewers on distinct backends, each
/// writing its own findings; the barrier joins on every one (a reviewer that declines is
/// `failed`, one past the deadline `timed_out`, both shown, never dropped); the status puts
/// the findings side by side with the disagreement kept; the approval shows every seat.
/// Starts that cannot seat the panel are refused and leave nothing.
#[test]
fn a_panel_of_distinct_reviewers_joins_at_its_barrier_and_keeps_every_disagreement() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let program = d.write(
        "kit/implement.sh",
        "#!/bin/sh\nset -e\nprintf '#!/bin/sh\\necho hello, verbosely\\n' > greet.sh\nexec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.write("pack/p.md", "Your part.\n");
    let pack = d.write(
        "pack/pack.toml",
        r#"name = "panel"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
writes = ["diff"]
prompt = "p.md"
approve = false

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 4
reads = ["diff"]
writes = ["findings"]
prompt = "p.md"
timeout_ms = 3000
fix_loops_max = 0

[[phases]]
name = "approval"
kind = "approval"
reads = ["diff", "findings"]
"#,
    );
    let findings = |seat: &str, class: &str| {
        let f = d.write(
            &format!("canned/{seat}.json"),
            &json!({"blocking": [], "non_blocking": [], "suggestions": [],
                class: [{"title": "greeting changed", "file": "greet.sh", "line": 2}]})
            .to_string(),
        );
        format!(
            "review=script:read,claim,put:findings@{seat}={},done",
            f.display()
        )
    };
    let reasoning = format!("reasoning=command:{}", program.display());
    let (r1, r2) = (
        findings("review", "blocking"),
        findings("review-2", "non_blocking"),
    );
    let (declines, hangs) = (
        "review=script:read,claim,decline".to_string(),
        "review=script:read,hang".to_string(),
    );
    let args = |roles: &[&str]| {
        let mut a: Vec<String> = [
            "collab",
            "start",
            "--goal",
            "greet verbosely",
            "--project",
            &prj,
            "--pack",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.push(pack.display().to_string());
        for r in roles {
            a.extend(["--role".to_string(), r.to_string()]);
        }
        a
    };
    let run = |roles: &[&str], code: &str| {
        let a = args(roles);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        d.refused(&refs, code)
    };
    // a seat unbound, two seats on one backend, a role that is no panel's bound twice
    let e = run(&[&reasoning, &r1, &r2, &declines], "profile_invalid");
    assert_eq!(e["detail"]["role"], "review-4", "{e}");
    let e = run(
        &[&reasoning, &r1, &r1, &declines, &hangs],
        "panel_backends_not_distinct",
    );
    assert_eq!(e["detail"]["seats"], json!(["review", "review-2"]), "{e}");
    run(
        &[&reasoning, &reasoning, &r1, &r2, &declines, &hangs],
        "invalid_argument",
    );
    assert_eq!(d.ok(&["collab", "list"])["collabs"], json!([]));
    assert!(
        !d.state.join("trees").exists()
            || std::fs::read_dir(d.state.join("trees"))
                .unwrap()
                .next()
                .is_none()
    );

    let a = args(&[&reasoning, &r1, &r2, &declines, &hangs]);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let started = d.ok(&refs);
    let id = started["collab"].as_str().unwrap().to_string();
    let s = until(&d, &id, "the panel's approval", |s| {
        pending(s, "approval").is_some()
    });
    let review = phase(&s, "review");
    assert_eq!(review["state"], "done", "{s:#}");
    let seats: Vec<(String, String)> = review["panel"]["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["seat"].as_str().unwrap().to_string(),
                x["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        seats,
        [
            ("review", "done"),
            ("review-2", "done"),
            ("review-3", "failed"),
            ("review-4", "timed_out")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "{review:#}"
    );
    // each child's live state as its launches prove it: the timed-out reviewer's worker
    // was stopped with its task (dead), the others' ended as they should (idle)
    let state_of =
        |agent: String| {
            until(&d, &id, "the stopped reviewer's end", |s| {
                s["children"].as_array().unwrap().iter().any(|c| {
                    c["agent"] == agent && c["state"] != "alive" && c["state"] != "unknown"
                })
            })["children"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["agent"] == agent)
                .unwrap()["state"]
                .clone()
        };
    assert_eq!(state_of(format!("{id}-review-4")), "dead");
    assert_eq!(state_of(format!("{id}-review")), "idle");
    // side by side: one finding, classed differently by two reviewers, a disagreement kept
    let merged = &review["panel"]["merged"];
    assert_eq!(merged["findings"].as_array().unwrap().len(), 1, "{merged}");
    assert_eq!(
        merged["findings"][0]["classes"],
        json!({"review": "blocking", "review-2": "non_blocking"})
    );
    assert_eq!(merged["findings"][0]["disagreement"], true);
    // the approval shows every seat, the failed and the timed out among them
    let ask = pending(&s, "approval").unwrap();
    let shown = &ask["input"]["panels"][0]["seats"];
    assert_eq!(shown.as_array().unwrap().len(), 4, "{ask}");
    assert_eq!(shown[3], json!({"seat": "review-4", "state": "timed_out"}));
    // each reviewer's findings went to the orchestrator alone
    let log = d.ok(&["log", &id, "--limit", "200"]);
    let audiences: Vec<(Value, Value)> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["artifact"]["kind"] == "findings")
        .map(|e| (e["actor"].clone(), e["event"]["audience"].clone()))
        .collect();
    assert_eq!(audiences.len(), 2, "{log}");
    for (writer, audience) in audiences {
        assert_eq!(
            audience,
            json!([format!("{id}-orch"), writer]),
            "the writer and the orchestrator"
        );
    }
}

/// The pack of the fix-loop test: an implementer in its tree, the project's test as the gate,
/// a panel of two reviewers whose blocking findings go back to the implementer.
const FIX_PACK: &str = r#"name = "fix"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
writes = ["diff"]
prompt = "p.md"
approve = false

[[phases]]
name = "gate"
kind = "gate"
reads = ["diff"]
commands = [{ program = "/bin/sh", args = ["test.sh"], timeout_ms = 30000 }]

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 2
reads = ["diff"]
writes = ["findings"]
after = ["gate"]
prompt = "p.md"
fix_loops_max = LOOPS

[[phases]]
name = "approval"
kind = "approval"
reads = ["diff", "findings"]
"#;

/// Issue 42, item 3: review runs on a green gate; a blocking finding goes back to the same
/// implementer, in its same tree, as a fix run carrying the finding; the gate and the panel
/// run again on the new diff, and a clean panel leads to the person's approval (the
/// collaboration never merges). A reviewer that keeps blocking exhausts the pack's loop cap:
/// `fix_loop_exhausted`, shown, and nothing goes to approval.
#[test]
fn blocking_findings_loop_back_to_the_implementer_until_clean_or_the_cap() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    std::fs::write(
        d.state.join("config.toml"),
        "[acceptance]\ncommands = [\"/bin/sh\"]\n",
    )
    .unwrap();
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    std::fs::write(
        project.join("test.sh"),
        "set -e\nsh greet.sh | grep -q hello\n",
    )
    .unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let clean = json!({"blocking": [], "non_blocking": [], "suggestions": []});
    let blocking = json!({"blocking": [{"title": "the greeting lost its comma", "file": "greet.sh", "line": 2}],
        "non_blocking": [], "suggestions": []});
    use std::os::unix::fs::PermissionsExt;
    let run = |name: &str, loops: u32, second_round_fixes: bool| -> (String, Value) {
        let kit = d.root.join(format!("kit-{name}"));
        std::fs::create_dir_all(&kit).unwrap();
        let (f1, f2) = (kit.join("review.json"), kit.join("review-2.json"));
        std::fs::write(&f1, blocking.to_string()).unwrap();
        std::fs::write(&f2, clean.to_string()).unwrap();
        // the implementer: its first attempt drops the comma; on the fix run (its tree
        // still holds the first attempt) it restores it, and the canned reviewer, which
        // stands in for a model reading the diff, finds nothing left to block
        let fixes = if second_round_fixes {
            format!("cp {} {}", f2.display(), f1.display())
        } else {
            "true".into()
        };
        let program = kit.join("implement.sh");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\nset -e\nif [ -f greet.sh.first ]; then printf '#!/bin/sh\\necho hello, world\\n' > greet.sh; {fixes}; \
                 else printf '#!/bin/sh\\necho hello world\\n' > greet.sh; : > greet.sh.first; fi\n\
                 exec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        d.write(&format!("pack-{name}/p.md"), "Your part.\n");
        let pack = d.write(
            &format!("pack-{name}/pack.toml"),
            &FIX_PACK.replace("LOOPS", &loops.to_string()),
        );
        let roles = [
            format!("reasoning=command:{}", program.display()),
            format!(
                "review=script:read,claim,put:findings@review={},done",
                f1.display()
            ),
            format!(
                "review=script:read,claim,put:findings@review-2={},done",
                f2.display()
            ),
        ];
        let mut args = vec![
            "collab".to_string(),
            "start".into(),
            "--goal".into(),
            "greet the world".into(),
            "--project".into(),
            prj.clone(),
            "--pack".into(),
            pack.display().to_string(),
        ];
        for r in roles {
            args.extend(["--role".into(), r]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = d.ok(&refs);
        (started["collab"].as_str().unwrap().to_string(), started)
    };

    // converges: one fix round, then a clean panel and the person's approval
    let (id, _) = run("converges", 3, true);
    let s = until(&d, &id, "the approval after the fix", |s| {
        pending(s, "approval").is_some()
    });
    let states = |s: &Value, phase: &str| -> Vec<String> {
        s["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["phase"] == phase)
            .map(|r| r["state"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(states(&s, "review"), ["fixed", "done"], "{s:#}");
    assert_eq!(states(&s, "implementation"), ["done", "done"], "{s:#}");
    assert_eq!(states(&s, "gate"), ["done", "done"], "{s:#}");
    assert_eq!(
        phase(&s, "review")["panel"]["fix_loops"],
        0,
        "the loop ended clean"
    );
    // the fix run went to the same implementer with the finding, and its diff holds the fix
    let log = d.ok(&["log", &id, "--limit", "500"]);
    let sends: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["event"]["verb"] == "send" && e["event"]["to"] == json!([format!("{id}-reasoning")])
        })
        .map(|e| e["event"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(sends.len(), 2, "{log}");
    assert!(
        sends[1].contains("Fix round 1 of 3")
            && sends[1].contains("the greeting lost its comma (greet.sh:2)"),
        "{}",
        sends[1]
    );
    let diff = d.ok(&["collab", "show", &id, "diff"]);
    assert_eq!(diff["version"], 2);
    assert!(
        diff["content"]["patch"]
            .as_str()
            .unwrap()
            .contains("+echo hello, world"),
        "{diff}"
    );
    // the person's checkout is as it was: the collaboration never merges
    assert_eq!(
        std::fs::read_to_string(project.join("greet.sh")).unwrap(),
        "#!/bin/sh\necho hello\n"
    );

    // a reviewer that keeps blocking: the cap of one loop runs out, shown, no approval asked
    let (id, _) = run("exhausts", 1, false);
    let s = until(&d, &id, "the loop's end", |s| {
        phase(s, "review")["state"] == "fix_loop_exhausted"
    });
    assert_eq!(
        states(&s, "review"),
        ["fixed", "fix_loop_exhausted"],
        "{s:#}"
    );
    let review = phase(&s, "review");
    assert_eq!(
        review["refusal"]["code"], "fix_loop_exhausted",
        "{review:#}"
    );
    assert_eq!(review["refusal"]["detail"]["fixer"], "implementation");
    assert_eq!(s["state"], "running", "it waits for the person");
    assert!(pending(&s, "approval").is_none());
    assert_eq!(phase(&s, "approval")["state"], "waiting");
}

/// The in-flight runs of a collaboration, replayed from its journal: a send of the
/// orchestrator's opens its task's run, the task's end (done, declined, cancelled) closes it.
/// The most ever open at once.
fn most_in_flight(log: &Value, orch: &str) -> usize {
    let mut open = std::collections::BTreeSet::new();
    let mut most = 0;
    for e in log["events"].as_array().unwrap() {
        let ev = &e["event"];
        let task = ev["task"].as_str().unwrap_or_default().to_string();
        if ev["verb"] == "send" && e["actor"] == orch {
            open.insert(task);
        } else if ev["task_transition"]["to"]
            .as_str()
            .is_some_and(|t| t != "claimed")
            || (ev["kind"] == "task" && ev["action"] == "cancelled")
        {
            open.remove(&task);
        }
        most = most.max(open.len());
    }
    most
}

/// Issue 42, item 4: the guards. A burst of 50 ready phases never has more than the pack's
/// live_workers_max in flight (replayed from the journal); a money ceiling holds the next
/// dispatch once the cost cannot be proven under it (`budget_exhausted`); a child that fails
/// its role's failures_max times in a row is not dispatched again (`child_auto_blocked`).
/// Each hold is shown in status, and nothing held was sent.
#[test]
fn guards_hold_dispatch_at_the_cap_the_money_ceiling_and_a_failing_child() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let note = d.write("canned/note.json", r#"{"note": "done"}"#);
    d.write("pack/p.md", "Your part.\n");
    let start = |name: &str, text: String, roles: &[String], extra: &[&str]| -> String {
        let pack = d.write(&format!("pack/{name}.toml"), &text);
        let mut args: Vec<String> = ["collab", "start", "--goal", "guarded", "--pack"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(pack.display().to_string());
        for r in roles {
            args.extend(["--role".to_string(), r.clone()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        d.ok(&refs)["collab"].as_str().unwrap().to_string()
    };

    // a burst of 50 independent phases, 4 at most in flight
    let mut burst = String::from("name = \"burst\"\n\n[guards]\nlive_workers_max = 4\n");
    // three roles share them (a child holds at most 32 scopes: one write scope per phase)
    let roles = ["architecture", "search", "review"];
    for i in 1..=50 {
        burst.push_str(&format!(
            "\n[[phases]]\nname = \"p{i}\"\nkind = \"agent\"\nrole = \"{}\"\nwrites = [\"extra/p{i}\"]\nprompt = \"p.md\"\napprove = false\n",
            roles[i % 3]
        ));
    }
    let workers: Vec<String> = roles
        .iter()
        .map(|r| format!("{r}=script:read,claim,fulfil:{},done", note.display()))
        .collect();
    let id = start("burst", burst, &workers, &[]);
    let s = until(&d, &id, "the burst's end", |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    let sends = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["verb"] == "send")
        .count();
    assert_eq!(sends, 50, "every phase dispatched once");
    let most = most_in_flight(&log, &format!("{id}-orch"));
    assert!((1..=4).contains(&most), "{most} in flight at once");

    // a money ceiling: the first dispatch is under it (nothing spent yet); once a launch
    // without usage records has ended, the cost cannot be proven under it, and the next
    // dispatch (approved by the person) is held
    let two = r#"name = "money"

[[phases]]
name = "a"
kind = "agent"
role = "architecture"
writes = ["extra/a"]
prompt = "p.md"
approve = false

[[phases]]
name = "b"
kind = "agent"
role = "search"
reads = ["extra/a"]
writes = ["extra/b"]
prompt = "p.md"
approve = true
"#;
    let roles = [
        format!(
            "architecture=script:read,claim,fulfil:{},done",
            note.display()
        ),
        format!("search=script:read,claim,fulfil:{},done", note.display()),
    ];
    let id = start("money", two.to_string(), &roles, &["--usd-max", "1"]);
    let s = until(&d, &id, "the approval of b after a's launch ended", |s| {
        pending(s, "b").is_some() && s["cost"]["launches_without_usage"] == 1
    });
    let ask = pending(&s, "b").unwrap();
    d.ok(&[
        "collab",
        "approve",
        ask["approval"].as_str().unwrap(),
        "--digest",
        ask["digest"].as_str().unwrap(),
    ]);
    let s = until(&d, &id, "the hold", |s| {
        s["guards"]["holds"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
            && phase(s, "b")["state"] == "dispatching"
    });
    let holds = s["guards"]["holds"].as_array().unwrap();
    assert!(
        holds
            .iter()
            .all(|h| h["refusal"]["code"] == "budget_exhausted"),
        "{s:#}"
    );
    assert_eq!(s["guards"]["usd_max"], 1.0);
    std::thread::sleep(Duration::from_millis(500));
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    let to_search = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["event"]["verb"] == "send" && e["event"]["to"] == json!([format!("{id}-search")])
        })
        .count();
    assert_eq!(to_search, 0, "nothing new was dispatched");
    assert_eq!(d.ok(&["collab", "status", &id])["state"], "running");

    // a child that fails once, under failures_max = 1: a rerun is held, never sent
    let flaky = r#"name = "flaky"

[[roles]]
name = "flaky"
purposes = ["try"]
[roles.policy]
tier = "member"
tool_calls_max = 100
failures_max = 1
project = "read"

[[phases]]
name = "x"
kind = "agent"
role = "flaky"
writes = ["extra/x"]
prompt = "p.md"
approve = false
"#;
    let id = start(
        "flaky",
        flaky.to_string(),
        &["flaky=script:read,claim,decline".to_string()],
        &[],
    );
    until(&d, &id, "the failure", |s| {
        phase(s, "x")["state"] == "failed"
    });
    d.ok(&["collab", "rerun", &id, "--from", "x"]);
    let s = until(&d, &id, "the block", |s| {
        s["guards"]["holds"].as_array().is_some_and(|h| {
            h.iter()
                .any(|h| h["refusal"]["code"] == "child_auto_blocked")
        }) && phase(s, "x")["state"] == "dispatching"
    });
    let h = &s["guards"]["holds"][0];
    assert_eq!(
        (h["role"].clone(), h["hold"].clone()),
        (json!("flaky"), json!("blocked")),
        "{s:#}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    let sends = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["verb"] == "send")
        .count();
    assert_eq!(sends, 1, "the blocked child was not sent its rerun");
}

/// kill -9 through the fix loop, at each point the person is asked (the first
/// implementation, the fix run with the panel's blocking findings, the final approval) and
/// again just after each approval: the collaboration resumes each time and ends with one fix
/// round, each role sent each of its runs once.
#[test]
fn the_fix_loop_resumes_after_the_daemon_is_killed() {
    let d = Dirs::new();
    let mut daemon = spawn(&d);
    std::fs::write(
        d.state.join("config.toml"),
        "[acceptance]\ncommands = [\"/bin/sh\"]\n",
    )
    .unwrap();
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    std::fs::write(
        project.join("test.sh"),
        "set -e\nsh greet.sh | grep -q hello\n",
    )
    .unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let kit = d.root.join("kit");
    std::fs::create_dir_all(&kit).unwrap();
    let (f1, f2) = (kit.join("review.json"), kit.join("review-2.json"));
    let clean = json!({"blocking": [], "non_blocking": [], "suggestions": []});
    std::fs::write(
        &f1,
        json!({"blocking": [{"title": "the greeting lost its comma", "file": "greet.sh", "line": 2}],
            "non_blocking": [], "suggestions": []})
        .to_string(),
    )
    .unwrap();
    std::fs::write(&f2, clean.to_string()).unwrap();
    let program = kit.join("implement.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nset -e\nif [ -f {k}/first ]; then printf '#!/bin/sh\\necho hello, world\\n' > greet.sh; cp {c} {r}; \
             else printf '#!/bin/sh\\necho hello world\\n' > greet.sh; : > {k}/first; fi\n\
             exec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done\n",
            k = kit.display(),
            c = f2.display(),
            r = f1.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.write("pack/p.md", "Your part.\n");
    let text = FIX_PACK.replace("LOOPS", "3").replace(
        "prompt = \"p.md\"\napprove = false",
        "prompt = \"p.md\"\napprove = true",
    );
    let pack = d.write("pack/pack.toml", &text);
    let roles = [
        format!("reasoning=command:{}", program.display()),
        format!(
            "review=script:read,claim,put:findings@review={},done",
            f1.display()
        ),
        format!(
            "review=script:read,claim,put:findings@review-2={},done",
            f2.display()
        ),
    ];
    let mut args: Vec<String> = [
        "collab",
        "start",
        "--goal",
        "greet the world",
        "--project",
        &prj,
        "--pack",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(pack.display().to_string());
    for r in &roles {
        args.extend(["--role".to_string(), r.clone()]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = d.ok(&refs)["collab"].as_str().unwrap().to_string();
    let mut asked = Vec::new();
    for (phase, nth) in [
        ("implementation", 1),
        ("implementation", 2),
        ("approval", 1),
    ] {
        let s = until(&d, &id, "a pending request", |s| {
            pending(s, phase).is_some_and(|a| a["run"] == nth)
        });
        let before = pending(&s, phase).unwrap();
        drop(daemon);
        daemon = spawn(&d);
        let s = until(&d, &id, "the same request after the restart", |s| {
            pending(s, phase).is_some()
        });
        let after = pending(&s, phase).unwrap();
        assert_eq!(
            (after["approval"].clone(), after["digest"].clone()),
            (before["approval"].clone(), before["digest"].clone()),
            "{s:#}"
        );
        if nth == 2 {
            assert!(
                after["input"]["fix"]
                    .as_str()
                    .unwrap()
                    .contains("the greeting lost its comma"),
                "{after}"
            );
        }
        d.ok(&[
            "collab",
            "approve",
            after["approval"].as_str().unwrap(),
            "--digest",
            after["digest"].as_str().unwrap(),
        ]);
        asked.push(after["approval"].clone());
        drop(daemon);
        daemon = spawn(&d);
    }
    let s = until(&d, &id, "the collaboration done", |s| s["state"] == "done");
    let states = |phase: &str| -> Vec<String> {
        s["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["phase"] == phase)
            .map(|r| r["state"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(states("review"), ["fixed", "done"], "{s:#}");
    assert_eq!(states("implementation"), ["done", "done"], "{s:#}");
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    for (agent, n) in [("reasoning", 2), ("review", 2), ("review-2", 2)] {
        let sends = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["event"]["verb"] == "send" && e["event"]["to"] == json!([format!("{id}-{agent}")])
            })
            .count();
        assert_eq!(sends, n, "{agent}: each run sent once");
    }
    assert_eq!(asked.len(), 3);
}

/// Issue 42, item 6: a role asks the person a question mid-phase (`collab_ask`); it waits in
/// the approval queue with who asks and what; the person's answer (a revision's text) goes
/// back to the asker on its task, exactly once, and wakes it with the answer in its prompt.
#[test]
fn a_role_asks_the_person_and_the_answer_comes_back_on_its_task() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let kit = d.root.join("kit");
    std::fs::create_dir_all(&kit).unwrap();
    let note = d.write("kit/note.json", r#"{"note": "done"}"#);
    let program = kit.join("asker.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nset -e\nif [ -f {k}/asked ]; then exec \"$ROOM_BRIDGE\" agent-script --steps read,fulfil:{n},done; fi\n\
             : > {k}/asked\nexec \"$ROOM_BRIDGE\" agent-script --steps read,claim,ask\n",
            k = kit.display(),
            n = note.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.write("pack/p.md", "Your part.\n");
    let pack = d.write(
        "pack/pack.toml",
        "name = \"ask\"\n\n[[phases]]\nname = \"x\"\nkind = \"agent\"\nrole = \"architecture\"\nwrites = [\"extra/x\"]\nprompt = \"p.md\"\napprove = false\n",
    );
    let role = format!("architecture=command:{}", program.display());
    let id = d.ok(&[
        "collab",
        "start",
        "--goal",
        "ask first",
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        &role,
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let s = until(&d, &id, "the question", |s| {
        pending(s, "ask@architecture").is_some()
    });
    let ask = pending(&s, "ask@architecture").unwrap();
    let task = phase(&s, "x")["task"].as_str().unwrap().to_string();
    assert_eq!(ask["input"]["asker"], format!("{id}-architecture"));
    assert_eq!(
        ask["input"]["question"],
        format!("may I go on with {task}?")
    );
    assert_eq!(ask["input"]["task"], task.as_str());
    let answer = d.write("kit/answer.txt", "yes, and keep the greeting short");
    d.ok(&[
        "collab",
        "revise",
        ask["approval"].as_str().unwrap(),
        "--digest",
        ask["digest"].as_str().unwrap(),
        "--prompt",
        answer.to_str().unwrap(),
    ]);
    let s = until(&d, &id, "the goal's end", |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    let answers: Vec<&Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["event"]["verb"] == "send"
                && e["event"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("keep the greeting short"))
        })
        .collect();
    assert_eq!(answers.len(), 1, "{log}");
    assert_eq!(
        answers[0]["event"]["to"],
        json!([format!("{id}-architecture")])
    );
    assert_eq!(answers[0]["event"]["task"], task.as_str());
    // the answer woke the asker: its wake's prompt carries it
    let wakes = d.ok(&["wakes", "list", &id]);
    assert!(
        wakes["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["prompt"]
                .as_str()
                .is_some_and(|p| p.contains("keep the greeting short"))),
        "{wakes}"
    );
}

/// spec → research ∥ architecture, steered by an agent orchestrator (its prompt `o.md`).
fn steered_pack(d: &Dirs) -> PathBuf {
    d.write("pack/p.md", "Do your part of the goal.\n");
    d.write(
        "pack/o.md",
        "You orchestrate: dispatch what is ready, close when done.\n",
    );
    d.write(
        "pack/steered.toml",
        r#"name = "steered"

[orchestrator]
prompt = "o.md"

[[phases]]
name = "spec"
kind = "agent"
role = "reasoning"
writes = ["spec"]
prompt = "p.md"
approve = false

[[phases]]
name = "research"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
prompt = "p.md"
approve = false

[[phases]]
name = "architecture"
kind = "agent"
role = "architecture"
reads = ["spec"]
writes = ["adr"]
prompt = "p.md"
approve = false
"#,
    )
}

fn start_steered(d: &Dirs, orchestrator: &str) -> String {
    let pack = steered_pack(d);
    let roles = [
        format!("orchestrator=script:{orchestrator}"),
        role(
            d,
            "reasoning",
            "spec",
            json!({"title": "a flag", "goal": "add --verbose", "requirements": ["prints each step"]}),
        ),
        role(
            d,
            "search",
            "research",
            json!({"summary": "clap has it", "findings": [{"claim": "clap counts flags", "source": "docs.rs/clap"}]}),
        ),
        role(
            d,
            "architecture",
            "adr",
            json!({"title": "use clap", "status": "accepted", "context": "a CLI flag", "decision": "clap's count action"}),
        ),
    ];
    let mut args = vec![
        "collab",
        "start",
        "--goal",
        "add a --verbose flag",
        "--pack",
        pack.to_str().unwrap(),
    ];
    for r in &roles {
        args.extend(["--role", r.as_str()]);
    }
    d.ok(&args)["collab"].as_str().unwrap().to_string()
}

/// The orchestrator is an agent (Room's scripted agent bound to the orchestrator role): woken
/// by a sealed wake whenever something it was not told happened, it dispatches each ready
/// phase with `collab_dispatch` and closes with `collab_close`; the scheduler dispatches
/// nothing itself. Its wakes are the goal task's sends, each telling what is new.
#[test]
fn an_agent_orchestrator_dispatches_each_phase_when_woken_and_closes() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let id = start_steered(&d, "read,dispatch,close,reply:noted");
    let s = until(&d, &id, "the goal's end", |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    assert_eq!(
        s["orchestrated_by"]["agent"],
        format!("{id}-orchestrator"),
        "{s:#}"
    );
    for p in ["spec", "research", "architecture"] {
        assert_eq!(phase(&s, p)["state"], "done", "{s:#}");
    }
    assert_eq!(s["flags"], json!([]), "nothing announced was left undone");
    // each wake told what was new: spec ready first, then spec done with research and
    // architecture ready, then their ends and all done
    let told: Vec<&Value> = s["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["phase"] == "tell@orchestrator")
        .collect();
    assert!(told.len() >= 3, "{s:#}");
    assert_eq!(told[0]["reads"]["new"], json!(["ready:spec#1"]), "{s:#}");
    assert!(
        told.iter().all(|t| t["state"] == "told"),
        "every wake was sent: {s:#}"
    );
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    let sends: Vec<&Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["event"]["verb"] == "send"
                && e["event"]["to"] == json!([format!("{id}-orchestrator")])
        })
        .collect();
    assert_eq!(sends.len(), told.len(), "one send per wake told: {log:#}");
    assert!(
        sends[0]["event"]["text"]
            .as_str()
            .unwrap()
            .starts_with("You orchestrate: dispatch what is ready"),
        "the wake carries the pack's choreography: {:#}",
        sends[0]
    );
}

/// An orchestrator whose words announce a dispatch its turn did not make is flagged
/// `dispatch_announced_not_made`: journaled in the collaboration's room, shown in its status,
/// and nothing is dispatched for it.
#[test]
fn a_dispatch_announced_but_not_made_is_flagged() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let id = start_steered(&d, "read,reply:Dispatching spec to reasoning now");
    let s = until(&d, &id, "the flag", |s| {
        s["flags"].as_array().is_some_and(|f| !f.is_empty())
    });
    let flag = &s["flags"][0];
    assert_eq!(flag["code"], "dispatch_announced_not_made", "{s:#}");
    assert_eq!(flag["agent"], format!("{id}-orchestrator"));
    assert_eq!(flag["detail"]["announced"], json!(["spec"]));
    assert_eq!(flag["detail"]["dispatched"], json!([]));
    assert_eq!(phase(&s, "spec")["state"], "waiting", "{s:#}");
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    assert!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"]["kind"] == "collab_flag"
                && e["event"]["code"] == "dispatch_announced_not_made"),
        "{log:#}"
    );
}

/// A panel with a debate round and a judge: once both reviewers have settled, each is given
/// the other's findings once (a debate seat run of the same panel run) and writes its
/// findings again; then the judge is given them all and writes its synthesis (no vote, the
/// disagreements kept); then the barrier joins as usual.
#[test]
fn a_panel_s_debate_round_gives_each_reviewer_the_others_findings_once_then_a_judge_synthesizes() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let program = d.write(
        "kit/implement.sh",
        "#!/bin/sh\nset -e\nprintf '#!/bin/sh\\necho hello, verbosely\\n' > greet.sh\nexec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.write("pack/p.md", "Your part.\n");
    let pack = d.write(
        "pack/pack.toml",
        r#"name = "debate"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
writes = ["diff"]
prompt = "p.md"
approve = false

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 2
reads = ["diff"]
writes = ["findings"]
prompt = "p.md"
fix_loops_max = 0
debate = true
judge = "architecture"

[[phases]]
name = "approval"
kind = "approval"
reads = ["diff", "findings"]
"#,
    );
    let findings = |seat: &str, title: &str| {
        let f = d.write(
            &format!("canned/{seat}.json"),
            &json!({"blocking": [], "non_blocking": [{"title": title, "file": "greet.sh", "line": 2}],
                "suggestions": []})
            .to_string(),
        );
        format!(
            "review=script:read,claim,put:findings@{seat}={},done",
            f.display()
        )
    };
    let id = d.ok(&[
        "collab",
        "start",
        "--goal",
        "greet verbosely",
        "--project",
        &prj,
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        &format!("reasoning=command:{}", program.display()),
        "--role",
        &findings("review", "the greeting is longer"),
        "--role",
        &findings("review-2", "say why it is verbose"),
        "--role",
        &format!(
            "architecture=script:read,claim,fulfil:{},done",
            d.write(
                "canned/synthesis.json",
                r#"{"merged": ["the greeting is longer", "say why it is verbose"], "disagreements": [], "summary": "two non-blocking notes"}"#
            )
            .display()
        ),
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let s = until(&d, &id, "the approval after the debate", |s| {
        pending(s, "approval").is_some()
    });
    let review = phase(&s, "review");
    assert_eq!(review["state"], "done", "{s:#}");
    for seat in review["panel"]["seats"].as_array().unwrap() {
        assert_eq!(seat["state"], "done", "{seat}");
        assert_eq!(seat["debate"], "done", "{seat}");
        // the debate round wrote each reviewer's findings again
        assert_eq!(seat["findings_version"], 2, "{seat}");
    }
    // the judge synthesized after the debate, before the join, and status shows it
    let judge = &review["panel"]["judge"];
    assert_eq!(judge["state"], "done", "{judge:#}");
    assert_eq!(
        judge["synthesis"]["content"]["summary"],
        "two non-blocking notes"
    );
    let wakes_all = d.ok(&["wakes", "list", &id]);
    assert!(
        wakes_all["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["prompt"]
                .as_str()
                .is_some_and(|p| p.starts_with("Judge the review panel review")
                    && p.contains("the greeting is longer")
                    && p.contains("say why it is verbose"))),
        "{wakes_all:#}"
    );
    // each reviewer was given the other's findings in its debate wake, and not its own
    let wakes = d.ok(&["wakes", "list", &id]);
    let debate: Vec<&str> = wakes["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["prompt"].as_str())
        .filter(|p| p.starts_with("Debate round of the review panel review"))
        .collect();
    assert_eq!(debate.len(), 2, "{wakes:#}");
    assert!(
        debate
            .iter()
            .any(|p| p.contains("Reviewer review-2's findings")
                && p.contains("say why it is verbose")
                && !p.contains("the greeting is longer")),
        "{debate:#?}"
    );
}

/// Plan before writing: the implementer's child starts without the scopes its phase writes
/// with (a diff written before its plan is approved is refused `artifact_write_denied`,
/// changing nothing); it writes its plan on a task of its own, the person approves the plan,
/// bound to its digest; the engine then gives the child the held-back scopes (journaled,
/// `widened`), and the phase runs and writes its diff.
#[test]
fn a_plan_is_approved_before_its_child_gets_write_scopes() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let plan = d.write(
        "kit/plan.json",
        r#"{"steps": ["make the greeting verbose"], "files": ["greet.sh"]}"#,
    );
    // one program for both wakes: the plan's (its prompt says so), then the phase's
    let program = d.write(
        "kit/implement.sh",
        &format!(
            "#!/bin/sh\nset -e\nwake=$(head -n1)\ncase \"$wake\" in\n*'Plan before you write'*) (echo early > early.txt) 2>/dev/null || true; printf '%s\\n' \"$wake\" | exec \"$ROOM_BRIDGE\" agent-script --steps read,claim,fulfil:{},done ;;\n\
             *) printf '#!/bin/sh\\necho hello, verbosely\\n' > greet.sh; printf '%s\\n' \"$wake\" | exec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done ;;\nesac\n",
            plan.display()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.write("pack/p.md", "Your part.\n");
    let pack = d.write(
        "pack/pack.toml",
        "name = \"planned\"\n\n[[phases]]\nname = \"implementation\"\nkind = \"agent\"\nrole = \"reasoning\"\nwrites = [\"diff\"]\nprompt = \"p.md\"\napprove = false\nplan = true\n",
    );
    let id = d.ok(&[
        "collab",
        "start",
        "--goal",
        "greet verbosely",
        "--project",
        &prj,
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        &format!("reasoning=command:{}", program.display()),
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let child = format!("{id}-reasoning");
    let scopes = |d: &Dirs| {
        d.ok(&["agent", "list"])["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == child.as_str())
            .map(|a| a["scopes"].clone())
            .unwrap()
    };
    let held = scopes(&d);
    assert!(
        !held
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "artifact:write:diff" || s == "project:write"),
        "{held}"
    );
    let s = until(&d, &id, "the plan's approval", |s| {
        pending(s, "plan@implementation").is_some()
    });
    let ask = pending(&s, "plan@implementation").unwrap();
    assert_eq!(ask["input"]["kind"], "plan", "{ask:#}");
    assert_eq!(ask["input"]["plan"]["key"], "implementation");
    assert_eq!(
        ask["input"]["gives"],
        json!(["artifact:write:diff", "project:write", "tools:execute"]),
        "{ask:#}"
    );
    let shown = d.ok(&["collab", "show", &id, "extra/plan/implementation"]);
    assert_eq!(shown["content"]["files"], json!(["greet.sh"]), "{shown:#}");
    assert!(
        phase(&s, "implementation")["task"].is_null(),
        "nothing dispatched: {s:#}"
    );
    // before the approval the child cannot write its diff
    let token = d.ok(&["agent", "rotate", &child])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut c = Client::connect(&d.state.join("room.sock")).unwrap();
    let log_before = d.ok(&["log", &id, "--limit", "1000"])["events"]
        .as_array()
        .unwrap()
        .len();
    let put = c
        .call(
            &Request::new(
                "artifact_put",
                json!({"room": id, "kind": "diff", "expected_version": 0,
                    "content": {"base": "x", "patch": "", "summary": "early"}}),
            )
            .with_token(Some(&token)),
        )
        .unwrap();
    assert_eq!(
        put.refusal.as_ref().map(|r| r.code.as_str()),
        Some("artifact_write_denied"),
        "{put:?}"
    );
    assert_eq!(
        d.ok(&["log", &id, "--limit", "1000"])["events"]
            .as_array()
            .unwrap()
            .len(),
        log_before,
        "the refused write wrote nothing"
    );
    d.ok(&[
        "collab",
        "approve",
        ask["approval"].as_str().unwrap(),
        "--digest",
        ask["digest"].as_str().unwrap(),
    ]);
    let s = until(&d, &id, "the goal's end", |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    let diff = d.ok(&["collab", "show", &id, "diff"]);
    assert!(
        diff["content"]["patch"]
            .as_str()
            .unwrap()
            .contains("hello, verbosely"),
        "{diff:#}"
    );
    // before the approval the child held no project:write, so its working tree was
    // read-only to the plan's launch (confined): the diff holds only what the approved
    // launch wrote
    let patch = diff["content"]["patch"].as_str().unwrap();
    if std::env::var("ROOM_TEST_CONFINEMENT").as_deref() == Ok("required") {
        assert!(!patch.contains("early.txt"), "{patch}");
    }
    let log = d.ok(&["log", &id, "--limit", "1000"]);
    assert!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"]["kind"] == "identity"
                && e["event"]["action"] == "widened"
                && e["event"]["principal"] == child.as_str()),
        "{log:#}"
    );
}

/// The venv's Python (scripts/test makes it), with the ACP and MCP SDKs.
fn venv_python() -> PathBuf {
    let p = std::env::var_os("ROOM_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python")
        });
    // absolute, not canonical: a venv's python finds its packages only by its own path
    let dir = std::fs::canonicalize(p.parent().unwrap()).unwrap();
    dir.join(p.file_name().unwrap())
}

/// The suite's local model server (room-server's tests/workers/openai_server.py) in `mode`.
struct ModelServer {
    child: Child,
    port: u16,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn model_server(d: &Dirs, mode: &str) -> ModelServer {
    use std::io::BufRead;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../room-server/tests/workers/openai_server.py");
    let mut child = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(mode)
        .arg(d.root.join("model.jsonl"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    ModelServer {
        port: line.trim().parse().expect("the server prints its port"),
        child,
    }
}

/// The showcase's end to end on real SDKs: the orchestrator and a reviewer are models on the
/// `openai` adapter (the suite's local model server, its tool calls scripted), the implementer
/// is an ACP SDK agent working in its own tree. The orchestrator dispatches through its
/// tools; the implementer edits its tree and has Room take its diff; the reviewer's findings
/// point into that diff; the person approves; the checkout never changes.
#[test]
fn an_api_orchestrator_an_acp_implementer_and_an_api_reviewer_run_a_goal() {
    let d = Dirs::new();
    let server = model_server(&d, "steer");
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
    std::fs::write(
        d.state.join("config.toml"),
        format!(
            "[backends.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\ntimeout_ms = 60000\n\n[backends.acp]\ncommand = [{:?}, {:?}, \"implement\"]\ntimeout_ms = 120000\n",
            server.port,
            venv_python().display().to_string(),
            agent.display().to_string()
        ),
    )
    .unwrap();
    let _daemon = spawn(&d);
    let project = d.root.join("work/greeter");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("greet.sh"), "#!/bin/sh\necho hello\n").unwrap();
    git(&project, &["init", "-q"]);
    git(&project, &["add", "greet.sh"]);
    git(
        &project,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "greeter",
        ],
    );
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    d.write("pack/p.md", "Your part.\n");
    d.write("pack/o.md", "You orchestrate.\n");
    let pack = d.write(
        "pack/pack.toml",
        r#"name = "showcase"

[orchestrator]
prompt = "o.md"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
writes = ["diff"]
prompt = "p.md"
approve = false

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 1
reads = ["diff"]
writes = ["findings"]
prompt = "p.md"
fix_loops_max = 0

[[phases]]
name = "approval"
kind = "approval"
reads = ["diff", "findings"]
"#,
    );
    let id = d.ok(&[
        "collab",
        "start",
        "--goal",
        "greet verbosely",
        "--project",
        &prj,
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        "orchestrator=openai:test-model",
        "--role",
        "reasoning=acp:claude",
        "--role",
        "review=openai:test-model",
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let s = until(&d, &id, "the approval", |s| {
        pending(s, "approval").is_some()
    });
    assert_eq!(phase(&s, "implementation")["state"], "done", "{s:#}");
    assert_eq!(phase(&s, "review")["state"], "done", "{s:#}");
    assert_eq!(s["flags"], json!([]), "{s:#}");
    let diff = d.ok(&["collab", "show", &id, "diff"]);
    assert_eq!(diff["producer"], format!("{id}-reasoning"), "{diff:#}");
    assert!(
        diff["content"]["patch"]
            .as_str()
            .unwrap()
            .contains("+echo hello, verbosely"),
        "{diff:#}"
    );
    let findings = d.ok(&["collab", "show", &id, "findings/review"]);
    assert_eq!(findings["producer"], format!("{id}-review"), "{findings:#}");
    let ask = pending(&s, "approval").unwrap();
    d.ok(&[
        "collab",
        "approve",
        ask["approval"].as_str().unwrap(),
        "--digest",
        ask["digest"].as_str().unwrap(),
    ]);
    let s = until(&d, &id, "the goal's end", |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    // the orchestrator's and the reviewer's usage are in the cost, per agent
    let by: Vec<&str> = s["cost"]["by_agent_and_model"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["agent"].as_str())
        .collect();
    assert!(by.contains(&format!("{id}-orchestrator").as_str()), "{s:#}");
    assert!(by.contains(&format!("{id}-review").as_str()), "{s:#}");
    // the ACP implementer's own report of what its turn cost (usage_update, in US dollars)
    let reported = &s["cost"]["by_agent_reported"][0];
    assert_eq!(reported["agent"], format!("{id}-reasoning"), "{s:#}");
    assert!(
        (reported["usd"].as_f64().unwrap() - 0.0421).abs() < 1e-9,
        "{reported}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("greet.sh")).unwrap(),
        "#!/bin/sh\necho hello\n",
        "the person merges; the collaboration never does"
    );
}

/// A gate's commands run away from the scheduler's pass: while one collaboration's gate runs
/// a slow command, another collaboration is dispatched and finishes.
#[test]
fn a_slow_gate_holds_no_other_collaboration_back() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    std::fs::write(
        d.state.join("config.toml"),
        "[acceptance]\ncommands = [\"/bin/sh\"]\n",
    )
    .unwrap();
    let project = d.root.join("work/slow");
    std::fs::create_dir_all(&project).unwrap();
    let prj = d.ok(&["project", "open", project.to_str().unwrap()])["id"]
        .as_str()
        .unwrap()
        .to_string();
    d.write("pack/p.md", "Your part.\n");
    let role = role(
        &d,
        "architecture",
        "spec",
        json!({"title": "t", "goal": "g", "requirements": ["r"]}),
    );
    let slow = d.write(
        "pack/slow.toml",
        "name = \"slow\"\n\n[[phases]]\nname = \"spec\"\nkind = \"agent\"\nrole = \"architecture\"\nwrites = [\"spec\"]\nprompt = \"p.md\"\napprove = false\n\n[[phases]]\nname = \"gate\"\nkind = \"gate\"\nreads = [\"spec\"]\ncommands = [{ program = \"/bin/sh\", args = [\"-c\", \"sleep 20\"], timeout_ms = 60000 }]\n",
    );
    let a = d.ok(&[
        "collab",
        "start",
        "--goal",
        "wait",
        "--project",
        &prj,
        "--pack",
        slow.to_str().unwrap(),
        "--role",
        &role,
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    until(&d, &a, "the slow gate running", |s| {
        phase(s, "gate")["state"] == "running"
    });
    let quick = d.write(
        "pack/quick.toml",
        "name = \"quick\"\n\n[[phases]]\nname = \"spec\"\nkind = \"agent\"\nrole = \"architecture\"\nwrites = [\"spec\"]\nprompt = \"p.md\"\napprove = false\n",
    );
    let b = d.ok(&[
        "collab",
        "start",
        "--goal",
        "quick",
        "--pack",
        quick.to_str().unwrap(),
        "--role",
        &role,
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let s = until(&d, &b, "the quick collaboration's end", |s| {
        s["state"] != "running"
    });
    assert_eq!(s["state"], "done", "{s:#}");
    let slow_now = d.ok(&["collab", "status", &a]);
    assert_eq!(
        phase(&slow_now, "gate")["state"],
        "running",
        "the slow gate still runs while the other finished: {slow_now:#}"
    );
}

/// An orchestrator on the ACP adapter (the ACP SDK test agent) whose streamed words announce
/// a dispatch it never makes is flagged `dispatch_announced_not_made`, as an API model's are.
#[test]
fn an_acp_orchestrator_announcing_a_dispatch_it_did_not_make_is_flagged() {
    let d = Dirs::new();
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
    std::fs::write(
        d.state.join("config.toml"),
        format!(
            "[backends.acp]\ncommand = [{:?}, {:?}, \"announce\"]\ntimeout_ms = 120000\n",
            venv_python().display().to_string(),
            agent.display().to_string()
        ),
    )
    .unwrap();
    let _daemon = spawn(&d);
    let pack = steered_pack(&d);
    let spec = role(
        &d,
        "reasoning",
        "spec",
        json!({"title": "a flag", "goal": "add --verbose", "requirements": ["prints each step"]}),
    );
    let mut args = vec![
        "collab".to_string(),
        "start".into(),
        "--goal".into(),
        "add a --verbose flag".into(),
        "--pack".into(),
        pack.display().to_string(),
        "--role".into(),
        "orchestrator=acp:claude".into(),
        "--role".into(),
        spec,
    ];
    for r in ["search", "architecture"] {
        args.extend(["--role".into(), format!("{r}=script:read")]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = d.ok(&refs)["collab"].as_str().unwrap().to_string();
    let s = until(&d, &id, "the flag", |s| {
        s["flags"].as_array().is_some_and(|f| !f.is_empty())
    });
    let flag = &s["flags"][0];
    assert_eq!(flag["code"], "dispatch_announced_not_made", "{s:#}");
    assert_eq!(flag["detail"]["announced"], json!(["spec"]));
    assert!(
        flag["detail"]["said"]
            .as_str()
            .unwrap()
            .contains("Dispatching spec to reasoning now."),
        "the streamed chunks are read whole: {flag}"
    );
    assert_eq!(phase(&s, "spec")["state"], "waiting", "{s:#}");
}

/// A pack of three agent phases on model roles, none waiting for the person: spec → research
/// ∥ architecture.
fn model_pack(d: &Dirs) -> PathBuf {
    d.write("mpack/p.md", "Do your part of the goal.\n");
    d.write(
        "mpack/pack.toml",
        r#"name = "m"

[[phases]]
name = "spec"
kind = "agent"
role = "reasoning"
writes = ["spec"]
prompt = "p.md"
approve = false

[[phases]]
name = "research"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
prompt = "p.md"
approve = false

[[phases]]
name = "architecture"
kind = "agent"
role = "architecture"
reads = ["spec"]
writes = ["adr"]
prompt = "p.md"
approve = false
"#,
    )
}

/// The conversations the model server was asked to start, per task: a request whose messages
/// hold no assistant turn yet is the first of a launch's conversation.
fn conversations(d: &Dirs) -> std::collections::BTreeMap<String, usize> {
    let log = std::fs::read_to_string(d.root.join("model.jsonl")).unwrap_or_default();
    let mut per_task = std::collections::BTreeMap::new();
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let messages = v["body"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if messages.iter().any(|m| m["role"] == "assistant") {
            continue;
        }
        let user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let wake: Value = user
            .split_once("The wake, as JSON:\n")
            .and_then(|(_, w)| serde_json::from_str(w).ok())
            .unwrap_or(Value::Null);
        if let Some(task) = wake["task"].as_str() {
            *per_task.entry(task.to_string()).or_insert(0) += 1;
        }
    }
    per_task
}

/// kill -9 of the daemon at seeded points of a goal whose roles are models (the suite's local
/// model server, which logs every request): once spec is stored, once a later phase's model is
/// at work, once every phase is stored. Each restart resumes (a run whose launch the daemon
/// died under is `interrupted` and runs again), the goal finishes, and the model server was
/// never asked again about a phase whose output was stored: one conversation for each such
/// phase's task, across every restart.
#[test]
fn no_model_is_asked_again_for_a_stored_phase_after_kill_9() {
    let d = Dirs::new();
    let server = model_server(&d, "collab");
    std::fs::write(
        d.state.join("config.toml"),
        format!(
            "[backends.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\ntimeout_ms = 60000\n",
            server.port
        ),
    )
    .unwrap();
    let mut daemon = spawn(&d);
    let pack = model_pack(&d);
    let id = d.ok(&[
        "collab",
        "start",
        "--goal",
        "g",
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        "reasoning=openai:test-model",
        "--role",
        "search=openai:test-model",
        "--role",
        "architecture=openai:test-model",
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let done = |s: &Value, p: &str| phase(s, p)["state"] == "done";
    let mut kills = 0;
    let mut stored: Vec<(String, String)> = Vec::new();
    // seeded points: spec stored; a later phase's model at work (its first request logged,
    // its output not yet stored); every phase stored
    let s = until(&d, &id, "spec stored", |s| done(s, "spec"));
    stored.push((
        "spec".into(),
        phase(&s, "spec")["task"].as_str().unwrap().into(),
    ));
    drop(daemon);
    kills += 1;
    daemon = spawn(&d);
    let s = until(&d, &id, "a later phase at work", |s| {
        ["research", "architecture"]
            .iter()
            .any(|p| phase(s, p)["task"].is_string())
    });
    for p in ["research", "architecture"] {
        if done(&s, p) {
            stored.push((p.into(), phase(&s, p)["task"].as_str().unwrap().into()));
        }
    }
    drop(daemon);
    kills += 1;
    daemon = spawn(&d);
    let s = until(&d, &id, "every phase stored", |s| {
        ["spec", "research", "architecture"]
            .iter()
            .all(|p| done(s, p))
    });
    for p in ["research", "architecture"] {
        if !stored.iter().any(|(q, _)| q == p) {
            stored.push((p.into(), phase(&s, p)["task"].as_str().unwrap().into()));
        }
    }
    drop(daemon);
    kills += 1;
    let _daemon = spawn(&d);
    let s = until(&d, &id, "the goal done", |s| s["state"] == "done");
    assert!(kills >= 3);
    let asked = conversations(&d);
    for (p, task) in &stored {
        assert_eq!(
            asked.get(task),
            Some(&1),
            "phase {p} (task {task}) was stored before a kill: one conversation, never a second: {asked:?}"
        );
        assert_eq!(
            phase(&s, p)["task"],
            task.as_str(),
            "{p} never ran again once stored: {s}"
        );
    }
    // a phase whose model was at work when the daemon died ran again, its first run shown
    // `interrupted`, never counted a failure
    for r in s["runs"].as_array().unwrap() {
        if r["state"] == "interrupted" {
            let p = r["phase"].as_str().unwrap();
            assert_eq!(phase(&s, p)["state"], "done", "{p} ran again: {s}");
        }
    }
    assert!(
        s["cost"]["tokens_in"].as_u64().unwrap_or(0) > 0,
        "{}",
        s["cost"]
    );
}

/// A child whose work ends without closing its task (its process exits, or fails): where
/// what the phase writes was stored and passes, the run is done and its model is not asked
/// again; where nothing was stored, the run failed (counted as a failure); either way its task
/// is withdrawn.
#[test]
fn a_child_that_ends_without_closing_its_task_is_settled_by_what_it_stored() {
    let d = Dirs::new();
    let _daemon = spawn(&d);
    let pack = model_pack(&d);
    let spec = d.write(
        "canned/spec.json",
        &json!({"title": "t", "goal": "g", "requirements": ["r"]}).to_string(),
    );
    let id = d.ok(&[
        "collab",
        "start",
        "--goal",
        "g",
        "--pack",
        pack.to_str().unwrap(),
        "--role",
        &format!(
            "reasoning=script:read,claim,put:spec={},exit",
            spec.display()
        ),
        "--role",
        "search=script:read,claim,fail",
        "--role",
        "architecture=script:read,claim,exit",
    ])["collab"]
        .as_str()
        .unwrap()
        .to_string();
    let s = until(&d, &id, "every phase settled", |s| {
        phase(s, "spec")["state"] == "done"
            && ["research", "architecture"]
                .iter()
                .all(|p| phase(s, p)["state"] == "failed")
    });
    assert_eq!(phase(&s, "spec")["runs"], 1, "stored: not run again: {s}");
    for p in ["spec", "research", "architecture"] {
        let task = phase(&s, p)["task"].as_str().unwrap().to_string();
        let t = d.ok(&["task", "show", &task]);
        assert_eq!(t["task"]["status"], "cancelled", "{p}: withdrawn: {t}");
    }
}
