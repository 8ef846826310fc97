//! `room demo`: a short scene on a throw-away state dir. It starts a real daemon, enrolls three
//! agents, opens a temporary project and shows the Work Gate refusing a blind write, a sync and
//! confirm, a send with obligations and a sealed wake, a reply resolving it, a delegated task
//! refused completion until its artifact exists, a revoked
//! credential refused on its next call, and the chains verifying at the end.

use room_server::client::Client;
use room_server::daemon::Background as Daemon;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};

struct Scene {
    client: Client,
    step: usize,
}

impl Scene {
    fn call(&mut self, token: Option<&str>, op: &str, args: Value) -> Response {
        let req = Request::new(op, args).with_token(token);
        self.client.call(&req).expect("the demo daemon answers")
    }

    fn ok(&mut self, token: Option<&str>, op: &str, args: Value) -> Value {
        let r = self.call(token, op, args);
        match (r.ok, r.result, r.refusal) {
            (true, Some(v), _) => v,
            (_, _, Some(refusal)) => panic!("demo step {op} was refused: {refusal}"),
            _ => panic!("demo step {op}: empty response"),
        }
    }

    fn refused(&mut self, token: Option<&str>, op: &str, args: Value) -> room_core::Refusal {
        let r = self.call(token, op, args);
        r.refusal
            .unwrap_or_else(|| panic!("demo step {op} should have been refused"))
    }

    /// Read a room to its end, confirming each page (the Work Gate's loop).
    fn catch_up(&mut self, token: &str, room: &str) {
        let mut confirm: Option<String> = None;
        loop {
            let page = self.ok(
                Some(token),
                "sync",
                json!({"room": room, "confirm": confirm}),
            );
            if page["more"] != true && confirm.is_some() {
                break;
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
    }

    /// The permit of `source` once dispatch has settled it (at most 30 s).
    fn wake_settled(&mut self, source: &str) -> anyhow::Result<Value> {
        for _ in 0..600 {
            let all = self.ok(None, "wakes_list", json!({}));
            let w = all["wakes"]
                .as_array()
                .and_then(|ws| ws.iter().find(|w| w["source_event"] == source))
                .cloned()
                .unwrap_or(Value::Null);
            if !matches!(w["state"].as_str(), Some("queued" | "dispatched") | None) {
                return Ok(w);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        anyhow::bail!("the wake of {source} was not settled within 30 s")
    }

    /// `from` catches up in `build` and sends `text` to beta under `task`; the send's event.
    fn ask(&mut self, from: &str, task: &str, text: &str) -> String {
        self.catch_up(from, "build");
        let asked = self.ok(
            Some(from),
            "send",
            json!({"room": "build", "to": ["beta"], "task": task, "text": text}),
        );
        asked["event"].as_str().unwrap_or_default().to_string()
    }

    fn say(&mut self, text: &str) {
        self.step += 1;
        println!("\n{:>2}. {text}", self.step);
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

fn scene() -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new().prefix("room-demo-").tempdir()?;
    let root = std::fs::canonicalize(tmp.path())?;
    let state = root.join("state");
    let bootstrap = root.join("config/room/bootstrap.toml");
    let project_dir = root.join("project");
    std::fs::create_dir_all(&project_dir)?;
    println!("Room demo: a throw-away state dir at {}", state.display());
    let s = room_store::statedir::init(&state, &bootstrap, "demo-instance")?;
    // the daemon knows this binary, so a route can run Room's own scripted agent
    let daemon = Daemon::start_with(room_server::daemon::ServeConfig {
        state_dir: s.root.clone(),
        bootstrap: bootstrap.clone(),
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: std::env::current_exe().ok(),
        store: None,
    })?;
    let mut sc = Scene {
        client: Client::connect(&daemon.socket)?,
        step: 0,
    };

    sc.say("The owner enrolls three agents. Each token is shown once; only its SHA-256 is stored.");
    let alpha = sc.ok(
        None,
        "agent_enroll",
        json!({"name": "alpha", "max_tier": "coordinator", "host": "claude-code"}),
    );
    let beta = sc.ok(
        None,
        "agent_enroll",
        json!({"name": "beta", "host": "codex"}),
    );
    let gamma = sc.ok(
        None,
        "agent_enroll",
        json!({"name": "gamma", "host": "gemini"}),
    );
    let (a, b, g) = (
        alpha["token"].as_str().unwrap_or_default().to_string(),
        beta["token"].as_str().unwrap_or_default().to_string(),
        gamma["token"].as_str().unwrap_or_default().to_string(),
    );
    show("alpha (coordinator), beta (member), gamma (member)");

    sc.say("The owner opens a project and creates a project room with all three.");
    let p = sc.ok(
        None,
        "project_open",
        json!({"path": project_dir.to_str(), "name": "demo-project"}),
    );
    let pid = p["id"].as_str().unwrap_or_default().to_string();
    show(format!(
        "project {pid} pinned to dev {} inode {}",
        p["root_object_id"]["dev"], p["root_object_id"]["ino"]
    ));
    sc.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta", "gamma"]}),
    );
    show("room build, bound to the project for good");

    sc.say(
        "alpha writes without reading first. The Work Gate refuses and hands over the unread page.",
    );
    let r = sc.refused(
        Some(&a),
        "say",
        json!({"room": "build", "text": "Starting on the parser."}),
    );
    show(format!("error[{}]: {}", r.code, r.message));
    let receipt = r.detail["next_page"]["receipt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    show(format!(
        "the refusal carries page seq {}..{} with receipt {receipt}",
        r.detail["next_page"]["from_seq"], r.detail["next_page"]["to_seq"]
    ));

    sc.say("alpha confirms the receipt (sync --confirm) and its checkpoint covers the frontier.");
    let page = sc.ok(
        Some(&a),
        "sync",
        json!({"room": "build", "confirm": receipt}),
    );
    show(format!(
        "confirmed up to seq {}",
        page["confirmed"]["confirmed_seq"]
    ));

    sc.say("alpha creates a task for beta and sends it: one message, then obligations and a sealed wake.");
    let t = sc.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "Review the parser change", "to": "beta"}),
    );
    let task = t["task"]["id"].as_str().unwrap_or_default().to_string();
    let sent = sc.ok(Some(&a), "send", json!({"room": "build", "task": task, "to": ["beta"], "text": "@beta please review the parser change"}));
    show(format!(
        "send {} -> obligation {} for beta",
        sent["event"].as_str().unwrap_or(""),
        sent["obligations"][0]["id"].as_str().unwrap_or("")
    ));
    let wakes = sc.ok(None, "wakes_list", json!({"room": "build"}));
    let w = &wakes["wakes"][0];
    show(format!(
        "wake permit queued as {} for {} (task {}), not_after {}",
        w["path"].as_str().unwrap_or(""),
        w["agent"].as_str().unwrap_or(""),
        w["task"].as_str().unwrap_or(""),
        w["not_after"].as_str().unwrap_or("")
    ));
    show(format!(
        "binding_sha256 {} (intact: {})",
        w["binding_sha256"].as_str().unwrap_or(""),
        w["intact"]
    ));

    sc.say("beta tries to reply blind, is refused, reads, confirms and replies; the obligation resolves.");
    let source = sent["event"].as_str().unwrap_or_default().to_string();
    let r = sc.refused(
        Some(&b),
        "reply",
        json!({"room": "build", "reply_to": source, "text": "Looks good."}),
    );
    show(format!("error[{}]: {}", r.code, r.message));
    let mut confirm = r.detail["next_page"]["receipt"].as_str().map(String::from);
    loop {
        let page = sc.ok(
            Some(&b),
            "sync",
            json!({"room": "build", "confirm": confirm}),
        );
        if page["more"] != true {
            break;
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
    let reply = json!({"room": "build", "reply_to": source, "text": "Looks good, two nits inline.",
        "idempotency_key": "review-parser-1"});
    let replied = sc.ok(Some(&b), "reply", reply.clone());
    show(format!(
        "reply {} resolved {}",
        replied["event"].as_str().unwrap_or(""),
        replied["resolved"][0]["id"].as_str().unwrap_or("")
    ));

    sc.say("beta's host lost that answer and retries with the same idempotency key: exactly_once refuses the repeat.");
    let r = sc.refused(Some(&b), "reply", reply);
    show(format!(
        "error[{}]: {} (invariant {}, original event {})",
        r.code,
        r.message,
        r.detail["invariant"].as_str().unwrap_or(""),
        r.detail["original_event"].as_str().unwrap_or("")
    ));

    sc.say("alpha delegates a subtask to gamma whose acceptance Room measures itself: notes/parser.md must exist.");
    let sub = sc.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "Write the parser notes", "to": "gamma", "parent": task,
            "accept": [{"kind": "file_exists", "path": "notes/parser.md"}]}),
    );
    let sub = sub["task"]["id"].as_str().unwrap_or_default().to_string();
    sc.ok(Some(&g), "task_claim", json!({"task": sub}));
    sc.catch_up(&g, "build");
    show(format!("task {sub} (parent {task}) claimed by gamma"));

    sc.say("gamma says done before writing anything. Room checks the project and refuses.");
    let r = sc.refused(Some(&g), "done", json!({"room": "build", "task": sub}));
    show(format!("error[{}]: {}", r.code, r.message));
    let first = &r.detail["acceptance_results"][0];
    show(format!(
        "{} {}: pass {}, observation {}",
        first["kind"].as_str().unwrap_or(""),
        first["detail"]["path"].as_str().unwrap_or(""),
        first["pass"],
        first["detail"]["observation"].as_str().unwrap_or("")
    ));

    sc.say("gamma writes the notes; done now passes the measurement and closes the task.");
    std::fs::create_dir_all(project_dir.join("notes"))?;
    std::fs::write(
        project_dir.join("notes/parser.md"),
        "# Parser notes\n\nTwo nits, both fixed.\n",
    )?;
    let done = sc.ok(Some(&g), "done", json!({"room": "build", "task": sub}));
    let shown = sc.ok(None, "owner_task_show", json!({"task": sub}));
    show(format!(
        "done {} -> task {}, last acceptance pass {}",
        done["event"].as_str().unwrap_or(""),
        shown["task"]["status"].as_str().unwrap_or(""),
        shown["last_acceptance"]["acceptance_pass"]
    ));

    sc.say("The owner routes beta's wakes to Room's scripted agent. alpha asks beta a question: the dispatcher revalidates the sealed permit, starts a worker in its own process group with a one-launch credential, and the worker reads the room and replies.");
    std::fs::write(
        s.config(),
        "[routes.beta]\nadapter = \"script\"\nsteps = [\"read\", \"reply\"]\n",
    )?;
    let question = sc.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "answer alpha's questions", "to": "beta"}),
    );
    let question = question["task"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let source = sc.ask(
        &a,
        &question,
        "Which parser file should gamma start with next?",
    );
    let woken = sc.wake_settled(&source)?;
    show(format!(
        "wake {} -> {} (the worker's own reply resolved {})",
        woken["path"].as_str().unwrap_or(""),
        woken["state"].as_str().unwrap_or(""),
        woken["obligation_ids"][0].as_str().unwrap_or("")
    ));

    sc.say("Without a route, a permit waits for beta's own session. The owner rotates beta's credential; the permit sealed before is refused at dispatch (the seed's Exhibit 2), and its obligation stays open.");
    std::fs::write(s.config(), "")?;
    let source = sc.ask(&a, &question, "And the lexer?");
    let rotated = sc.ok(None, "agent_rotate", json!({"name": "beta"}));
    let b = rotated["token"].as_str().unwrap_or_default().to_string();
    // the daemon revalidates every second; the owner need not wait for it
    sc.ok(None, "wakes_check", json!({}));
    let letter = sc.wake_settled(&source)?["dead_letter"].clone();
    show(format!(
        "dead letter: {} ({})",
        letter["code"].as_str().unwrap_or("?"),
        letter["reason"].as_str().unwrap_or("")
    ));

    sc.say("beta's own session, with its new credential, takes its next wake (room_wake_take) and answers it from that same session: the reply is the proof.");
    let source = sc.ask(&a, &question, "And the parser's tests?");
    let taken = sc.ok(Some(&b), "wake_take", json!({}));
    let obligation = taken["taken"]["obligation_ids"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    show(format!(
        "taken: {:?} (proof {})",
        taken["taken"]["prompt"].as_str().unwrap_or(""),
        taken["taken"]["proof"].as_str().unwrap_or("")
    ));
    sc.catch_up(&b, "build");
    sc.ok(
        Some(&b),
        "reply",
        json!({"room": "build", "reply_to": obligation, "text": "tests/parser.rs"}),
    );
    let woken = sc.wake_settled(&source)?;
    show(format!(
        "wake {} -> {}",
        woken["path"].as_str().unwrap_or(""),
        woken["state"].as_str().unwrap_or("")
    ));

    sc.say("The owner shortens task-bound wake deadlines to 1.5 s ([dispatch] tasked_deadline_ms). A permit that waits in the queue past its sealed deadline cannot buy fresh time from a worker that comes late (the seed's Exhibit 3).");
    std::fs::write(s.config(), "[dispatch]\ntasked_deadline_ms = 1500\n")?;
    let source = sc.ask(&a, &question, "Still there?");
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    sc.ok(None, "wakes_check", json!({}));
    let letter = sc.wake_settled(&source)?["dead_letter"].clone();
    show(format!(
        "dead letter: {} ({})",
        letter["code"].as_str().unwrap_or("?"),
        letter["reason"].as_str().unwrap_or("")
    ));
    std::fs::write(s.config(), "")?;

    sc.say("The owner revokes gamma. Its very next call is refused.");
    sc.ok(None, "agent_revoke", json!({"name": "gamma"}));
    let r = sc.refused(Some(&g), "sync", json!({"room": "build"}));
    show(format!("error[{}]: {}", r.code, r.message));

    sc.say("The daemon stops; `room verify` checks every hash chain offline.");
    drop(sc);
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
    println!("\nDone. Every event above is on disk, hash-chained and verified.");
    Ok(())
}
