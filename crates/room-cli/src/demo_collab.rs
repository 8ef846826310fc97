//! `room demo collab`: a collaboration run end to end on a throw-away state dir. A small
//! sample project (a shell greeter and its tests) gets a `--verbose` flag: a spec, research
//! and an architecture decision in parallel, an implementation that applies a real diff, a
//! gate that runs the project's tests, a review panel of three reviewers on distinct backends
//! (their findings side by side, a disagreement shown) whose one blocking finding goes back to
//! the implementer (the fix loop: its fix, the gate and the panel again, now clean), and the
//! person's approvals (shown, then granted by the demo), then the person's merge and the cost
//! per role. Roles run on distinct simulated
//! backends: Room's scripted agent (`script` routes, each step list its own backend) and a
//! shell program (a `command` route) that changes its tree and reports through Room's bridge.
//! Everything is printed as the daemon's scheduler does it; the chains are
//! verified at the end.
//!
//! The implementer works in its own working tree Room made at the start (a copy of the
//! sample made a repository: the base), and Room takes its diff from there; the gate's tests
//! run in the base with that diff applied; the person's project changes only when they merge.

use room_server::client::Client;
use room_server::daemon::Background as Daemon;
use room_server::wire::Request;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the demo waits for the collaboration to finish.
const DEADLINE_MS: u64 = 120_000;

const GREET: &str = "#!/bin/sh\necho \"hello\"\n";
const TEST: &str = "#!/bin/sh\nset -e\n[ \"$(sh greet.sh)\" = \"hello\" ]\n[ \"$(sh greet.sh --verbose)\" = \"hello, verbosely\" ]\necho \"2 tests passed\"\n";
const PATCH: &str = "--- a/greet.sh\n+++ b/greet.sh\n@@ -1,2 +1,6 @@\n #!/bin/sh\n+if [ \"$1\" = \"--verbose\" ]; then\n+  echo \"hello, verbosely\"\n+  exit 0\n+fi\n echo \"hello\"\n";

const FIX: &str = "--- a/greet.sh\n+++ b/greet.sh\n@@ -1,2 +1,3 @@\n #!/bin/sh\n+# usage: greet.sh [--verbose]\n if [ \"$1\" = \"--verbose\" ]; then\n";

const PACK: &str = r#"name = "demo"
description = "The demo's pack: spec, research and an ADR, an implementation, the tests, the person's approval."

[[roles]]
name = "product"
purposes = ["specify"]
[roles.policy]
tier = "member"
tool_calls_max = 100
failures_max = 3
project = "read"

[[phases]]
name = "spec"
kind = "agent"
role = "product"
writes = ["spec"]
prompt = "prompt.md"

[[phases]]
name = "research"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
prompt = "prompt.md"
approve = false

[[phases]]
name = "architecture"
kind = "agent"
role = "architecture"
reads = ["spec"]
writes = ["adr"]
prompt = "prompt.md"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
reads = ["spec", "research", "adr"]
writes = ["diff"]
prompt = "prompt.md"

[[phases]]
name = "gate"
kind = "gate"
reads = ["diff"]
commands = [{ program = "/bin/sh", args = ["test.sh"], timeout_ms = 60000 }]

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 3
reads = ["diff", "spec"]
writes = ["findings"]
after = ["gate"]
prompt = "prompt.md"

[[phases]]
name = "approval"
kind = "approval"
reads = ["diff", "adr", "findings"]
"#;

/// A panel phase's findings side by side (the newest run's), each with how every reviewer
/// classed it; a disagreement is shown, never voted away.
fn show_findings(p: &Value) {
    for f in p["panel"]["merged"]["findings"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let classes: Vec<String> = f["classes"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(seat, class)| format!("{seat}: {}", class.as_str().unwrap_or("")))
            .collect();
        show(format!(
            "finding {:?} ({}){}",
            f["title"].as_str().unwrap_or(""),
            classes.join(", "),
            if f["disagreement"] == true {
                " - the reviewers differ: shown, not voted"
            } else {
                ""
            }
        ));
    }
}

fn show(line: impl AsRef<str>) {
    println!("    {}", line.as_ref());
}

pub fn run() -> i32 {
    match scene() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: demo failed: {e:#}");
            crate::cmd::EXIT_IO
        }
    }
}

fn call(c: &mut Client, op: &str, args: Value) -> anyhow::Result<Value> {
    c.request(&Request::new(op, args))
        .map_err(|e| anyhow::anyhow!("{op}: {e}"))
}

fn write(path: &Path, text: &str, exec: bool) -> anyhow::Result<()> {
    std::fs::write(path, text)?;
    if exec {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// The sample project, the canned artifacts, the implementer's program and the pack.
fn materials(root: &Path) -> anyhow::Result<BTreeMap<&'static str, String>> {
    let project = root.join("sample");
    std::fs::create_dir_all(&project)?;
    write(&project.join("greet.sh"), GREET, false)?;
    write(&project.join("test.sh"), TEST, false)?;
    let kit = root.join("kit");
    std::fs::create_dir_all(&kit)?;
    let artifacts = [
        (
            "spec",
            json!({"title": "a --verbose flag", "goal": "greet.sh --verbose says how it greets",
                "requirements": ["greet.sh --verbose prints 'hello, verbosely'", "plain greet.sh is unchanged"],
                "acceptance": ["sh test.sh passes"]}),
        ),
        (
            "research",
            json!({"question": "how do shell scripts take flags?",
                "summary": "for one flag, compare $1; getopts is for several",
                "findings": [{"claim": "POSIX sh sets $1 to the first argument", "source": "POSIX 2.5.1"}]}),
        ),
        (
            "adr",
            json!({"title": "compare $1 for --verbose", "status": "accepted",
                "context": "one flag, no dependencies", "decision": "test $1 before the greeting and exit early",
                "consequences": "a second flag would move to getopts"}),
        ),
    ];
    // three reviewers: two class the missing usage line differently (a disagreement, shown),
    // one also suggests getopts; the blocking one sends the diff back to the implementer,
    // whose fix adds the line (after which those two find nothing: the fix rewrites their
    // canned findings, standing in for a model that reads the new diff)
    let usage = json!({"title": "--verbose is in no usage line", "file": "greet.sh", "line": 2});
    let clean = json!({"blocking": [], "non_blocking": [], "suggestions": []});
    let findings = [
        (
            "findings-review",
            json!({"blocking": [], "suggestions": [], "non_blocking": [usage]}),
        ),
        (
            "findings-review-2",
            json!({"blocking": [], "non_blocking": [],
                "suggestions": [{"title": "move to getopts if a second flag comes"}]}),
        ),
        (
            "findings-review-3",
            json!({"blocking": [usage], "suggestions": [], "non_blocking": []}),
        ),
        ("findings-clean", clean),
    ];
    let mut out = BTreeMap::new();
    for (kind, content) in artifacts.into_iter().chain(findings) {
        let p = kit.join(format!("{kind}.json"));
        write(&p, &content.to_string(), false)?;
        out.insert(kind, p.display().to_string());
    }
    let patch = kit.join("change.diff");
    write(&patch, PATCH, false)?;
    // the implementer: a shell program (a `command` route) started in its own working tree
    // (Room made it: a copy of the sample, which is no git repository; the person's stays as
    // it is until they merge), which applies the change there and reports through Room's
    // bridge (its scripted agent): `diff` has Room take the tree's diff against the base
    // its fix run (the same tree, the first change still in it) adds the usage line
    let fix = kit.join("fix.diff");
    write(&fix, FIX, false)?;
    let implement = kit.join("implement.sh");
    write(
        &implement,
        &format!(
            "#!/bin/sh\nset -e\nif [ -f {kit}/first-round ]; then\n  git apply {fix}\n  cp {clean} {r1}; cp {clean} {r3}\nelse\n  git apply {patch}\n  : > {kit}/first-round\nfi\nexec \"$ROOM_BRIDGE\" agent-script --steps read,claim,diff,done\n",
            kit = kit.display(),
            fix = fix.display(),
            patch = patch.display(),
            clean = out["findings-clean"],
            r1 = out["findings-review"],
            r3 = out["findings-review-3"],
        ),
        true,
    )?;
    out.insert("implement", implement.display().to_string());
    out.insert("patch", patch.display().to_string());
    out.insert("project", project.display().to_string());
    let pack_dir = root.join("pack");
    std::fs::create_dir_all(&pack_dir)?;
    write(&pack_dir.join("pack.toml"), PACK, false)?;
    out.insert("pack", PACK.to_string());
    write(
        &pack_dir.join("prompt.md"),
        "Read what your phase reads from the blackboard (artifact_get), write what it writes (artifact_put, for your task), then done.\n",
        false,
    )?;
    Ok(out)
}

fn scene() -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("room-demo-collab-")
        .tempdir()?;
    let root = std::fs::canonicalize(tmp.path())?;
    let state = root.join("state");
    let bootstrap = root.join("config/room/bootstrap.toml");
    println!(
        "Room collaboration demo: a throw-away state dir at {}",
        state.display()
    );
    let s = room_store::statedir::init(&state, &bootstrap, "demo-collab")?;
    let daemon = Daemon::start_with(room_server::daemon::ServeConfig {
        state_dir: s.root.clone(),
        bootstrap: bootstrap.clone(),
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: std::env::current_exe().ok(),
        store: None,
    })?;
    let mut c = Client::connect(&daemon.socket)?;
    let m = materials(&root)?;
    std::fs::write(s.config(), "[acceptance]\ncommands = [\"/bin/sh\"]\n")?;

    println!(
        "\n1. The sample project: greet.sh and its tests, which fail until greet.sh learns --verbose."
    );
    let project = call(&mut c, "project_open", json!({"path": m["project"]}))?;
    let prj = project["id"].as_str().unwrap_or_default().to_string();
    show(format!("project {prj} at {}", m["project"]));

    println!(
        "\n2. The owner starts a collaboration: each role bound to a backend. Five run Room's scripted agent (two of them a review panel, each its own backend); the implementer is a shell program in its own working tree."
    );
    let script = |kind: &str| format!("script:read,claim,put:{kind}={},done", m[kind]);
    let reviewer = |seat: &str| {
        format!(
            "review=script:read,claim,put:findings@{seat}={},done",
            m[format!("findings-{seat}").as_str()]
        )
    };
    let roles = vec![
        format!("product={}", script("spec")),
        format!("search={}", script("research")),
        format!("architecture={}", script("adr")),
        format!("reasoning=command:{}", m["implement"]),
        reviewer("review"),
        reviewer("review-2"),
        reviewer("review-3"),
    ];
    let prompts = json!({"prompt.md": std::fs::read_to_string(root.join("pack/prompt.md"))?});
    let started = call(
        &mut c,
        "collab_start",
        json!({"goal": "greet.sh --verbose", "project": prj, "pack": m["pack"],
            "prompts": prompts, "roles": roles}),
    )?;
    let id = started["collab"].as_str().unwrap_or_default().to_string();
    show(format!(
        "collaboration {id}: room {id}, orchestrator {}",
        started["orchestrator"].as_str().unwrap_or("")
    ));
    for (role, agent) in started["agents"].as_object().into_iter().flatten() {
        show(format!(
            "role {role:<13} -> {}",
            agent.as_str().unwrap_or("")
        ));
    }
    let trees = &started["trees"];
    for (agent, tree) in trees["trees"].as_object().into_iter().flatten() {
        show(format!(
            "{} works in {} ({} of the sample at base {}…)",
            agent,
            tree.as_str().unwrap_or(""),
            trees["source"].as_str().unwrap_or(""),
            &trees["base"].as_str().unwrap_or("")
                [..12.min(trees["base"].as_str().unwrap_or("").len())]
        ));
    }

    println!(
        "\n3. The daemon's scheduler runs the phases as their inputs appear (research and architecture together); each closes only when Room's acceptance passes."
    );
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut decided: Vec<String> = Vec::new();
    let start = Instant::now();
    let done = loop {
        let st = call(&mut c, "collab_status", json!({"id": id}))?;
        for p in st["phases"].as_array().into_iter().flatten() {
            let name = p["phase"].as_str().unwrap_or("").to_string();
            let state = p["state"].as_str().unwrap_or("").to_string();
            if seen.get(&name) != Some(&state) {
                let ms = start.elapsed().as_millis();
                show(format!(
                    "{ms:>6} ms  {name:<15} {state}{}",
                    p["task"]
                        .as_str()
                        .map(|t| format!(" (task {t})"))
                        .unwrap_or_default()
                ));
                if state == "fixed" {
                    show(
                        "        the panel's blocking findings go back to the implementer, in its tree:",
                    );
                    show_findings(p);
                }
                seen.insert(name, state);
            }
        }
        for a in st["approvals"].as_array().into_iter().flatten() {
            let aid = a["approval"].as_str().unwrap_or("").to_string();
            if a["state"] != "pending" || decided.contains(&aid) {
                continue;
            }
            let input = &a["input"];
            println!(
                "\n   The person is asked to approve {} ({}):",
                a["phase"].as_str().unwrap_or(""),
                input["kind"].as_str().unwrap_or("")
            );
            if input["backend"].is_object() {
                show(format!(
                    "role {} on {} {}",
                    input["role"].as_str().unwrap_or(""),
                    input["backend"]["adapter"].as_str().unwrap_or(""),
                    input["backend"]["model"].as_str().unwrap_or("")
                ));
            }
            for r in input["reads"].as_array().into_iter().flatten() {
                show(format!(
                    "reads {} v{} by {} (sha256 {}…)",
                    r["kind"].as_str().unwrap_or(""),
                    r["version"],
                    r["producer"].as_str().unwrap_or(""),
                    &r["sha256"].as_str().unwrap_or("")[..12]
                ));
            }
            for panel in input["panels"].as_array().into_iter().flatten() {
                let seats: Vec<String> = panel["seats"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        format!(
                            "{} {}",
                            x["seat"].as_str().unwrap_or(""),
                            x["state"].as_str().unwrap_or("")
                        )
                    })
                    .collect();
                show(format!(
                    "panel {}: {}",
                    panel["panel"].as_str().unwrap_or(""),
                    seats.join(", ")
                ));
            }
            if let Some(fix) = input["fix"].as_str() {
                for line in fix.lines() {
                    show(format!("fix: {line}"));
                }
            }
            if input["panels"].as_array().is_some_and(|p| !p.is_empty()) {
                for p in st["phases"].as_array().into_iter().flatten() {
                    show_findings(p);
                }
            }
            let cost = &st["cost"];
            show(format!(
                "cost so far: {} tokens in, {} out, {} launches without usage records, USD {}",
                cost["tokens_in"], cost["tokens_out"], cost["launches_without_usage"], cost["usd"]
            ));
            show(format!(
                "digest {}; approved with it",
                a["digest"].as_str().unwrap_or("")
            ));
            call(
                &mut c,
                "collab_decide",
                json!({"approval": aid, "digest": a["digest"], "verdict": "approve"}),
            )?;
            decided.push(aid);
            println!();
        }
        if st["state"] != "running" {
            break st;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_millis(DEADLINE_MS),
            "the collaboration did not finish within {DEADLINE_MS} ms: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    anyhow::ensure!(
        done["state"] == "done",
        "the collaboration ended {}",
        done["state"]
    );

    println!(
        "\n4. The blackboard: each artifact versioned, content-addressed, stamped with its producer."
    );
    let index = call(&mut c, "collab_artifacts", json!({"room": id}))?;
    for a in index["artifacts"].as_array().into_iter().flatten() {
        show(format!(
            "{:<9} v{} {:>4} bytes by {:<22} sha256 {}…",
            a["kind"].as_str().unwrap_or(""),
            a["version"],
            a["bytes"],
            a["producer"].as_str().unwrap_or(""),
            &a["sha256"].as_str().unwrap_or("")[..16]
        ));
    }
    println!(
        "\n5. The person merges: the collaboration never touches their tree. The approved diff applies, and the project's tests pass."
    );
    let diff = call(
        &mut c,
        "collab_artifact",
        json!({"room": id, "kind": "diff"}),
    )?;
    let merged = std::process::Command::new("git")
        .args(["apply", "-"])
        .current_dir(&m["project"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            if let Some(mut w) = child.stdin.take() {
                w.write_all(diff["content"]["patch"].as_str().unwrap_or("").as_bytes())?;
            }
            child.wait()
        })?;
    anyhow::ensure!(merged.success(), "the approved diff did not apply");
    let out = std::process::Command::new("/bin/sh")
        .arg("test.sh")
        .current_dir(&m["project"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the project's tests failed after the merge"
    );
    show(format!(
        "git apply (diff v{} by {}); sh test.sh: {}",
        diff["version"],
        diff["producer"].as_str().unwrap_or(""),
        String::from_utf8_lossy(&out.stdout).trim()
    ));

    println!(
        "\n6. Done: the goal task closed and the collaboration's identities revoked. The cost per role: unknown in money, never guessed (scripted backends keep no usage records; an API role's tokens are rolled up, priced by config.toml [prices])."
    );
    let st = call(&mut c, "collab_status", json!({"id": id}))?;
    for a in st["cost"]["by_agent"].as_array().into_iter().flatten() {
        let agent = a["agent"].as_str().unwrap_or("");
        let role = agent.strip_prefix(&format!("{id}-")).unwrap_or(agent);
        show(format!(
            "role {role:<13} {} launches, {} without usage records: cost unknown",
            a["launches"], a["launches_without_usage"]
        ));
    }
    let agents = call(&mut c, "agent_list", json!({}))?;
    let revoked = agents["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["name"].as_str().is_some_and(|n| n.starts_with(&id)) && a["revoked"] == true)
        .count();
    show(format!("{revoked} identities revoked"));
    drop(c);
    daemon.stop()?;
    let report = crate::cmd::verify_dir(&s.root, None).map_err(anyhow::Error::msg)?;
    for r in &report {
        show(format!(
            "{} {}: {} records, tip {}",
            if r["ok"] == true { "ok" } else { "FAIL" },
            r["room"].as_str().unwrap_or("?"),
            r["records"],
            r["tip_hash"].as_str().unwrap_or("")
        ));
    }
    anyhow::ensure!(
        report.iter().all(|r| r["ok"] == true),
        "verification failed"
    );
    println!("\nEvery event above is on disk, hash-chained and verified.");
    Ok(())
}
