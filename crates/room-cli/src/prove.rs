//! `room prove [CLAIM…]`: the seed's twelve bounded claims (04-C01 … 04-C12) exercised on this
//! machine, as anyone can run them (issue 45). It builds a scratch state dir (never the
//! user's), starts a real daemon on it and, for each claim, walks its positive path and the
//! refusal paths it names through the daemon API and the `room` binary, checking each outcome
//! by its stable code and, for a refused turn, that the room's journal did not move. Every
//! chain is verified at the end. The card names what was exercised, the evidence, the claim's
//! stated ceiling and what was not exercised here; the exit status is the verdict.
//!
//! A claim this build cannot exercise yet is on the card as `not_built`: never counted as
//! proven, so a card that asks for it is `unproven` (exit 1).

use room_server::client::Client;
use room_server::daemon::Background as Daemon;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One claim of the seed's Section 04, as the card shows it.
struct Claim {
    id: &'static str,
    title: &'static str,
    /// The seed's own bound on what the claim covers.
    ceiling: &'static str,
    run: Option<fn(&mut Prover, &Cast) -> Vec<&'static str>>,
}

const CLAIMS: &[Claim] = &[
    Claim {
        id: "04-C01",
        title: "split-brain state trees are refused, and project grants revalidate their path and kernel identity",
        ceiling: "local Linux file systems; not a remote-share or host-admin guarantee",
        run: Some(c01),
    },
    Claim {
        id: "04-C02",
        title: "enrollment, tier clamping and verb policy bind every call to a principal",
        ceiling: "declared MCP and CLI paths; a host's own contract is its to keep",
        run: Some(c02),
    },
    Claim {
        id: "04-C03",
        title: "room shards carry immutable scope bindings and parent-withholding closure",
        ceiling: "graph queries, compositions and exports; hash artifacts do not prove non-deletion",
        run: None,
    },
    Claim {
        id: "04-C04",
        title: "the sync index reconciles handle-pinned journals and binds checkpoints to conversation and view",
        ceiling: "rotation, fork and delivery-policy refusal paths",
        run: None,
    },
    Claim {
        id: "04-C05",
        title: "the Work Gate requires the live frontier before every participant verb",
        ceiling: "blind writes receive a sync page, not authority",
        run: Some(c05),
    },
    Claim {
        id: "04-C06",
        title: "contribution verbs separate status, response, assignment, transfer and completion",
        ceiling: "ambiguity, cross-room evidence, successor and no-wake paths",
        run: Some(c06),
    },
    Claim {
        id: "04-C07",
        title: "every wake is a sealed permit revalidated at dispatch",
        ceiling: "binding, roster, registration, task, epoch, path, pid and original-deadline changes",
        run: Some(c07),
    },
    Claim {
        id: "04-C08",
        title: "wake-time evidence is recipient-specific and governing-source coverage is continuous",
        ceiling: "wake_delivery receipts and bounded time windows",
        run: None,
    },
    Claim {
        id: "04-C09",
        title: "native delivery and reply are distinct proof states; process exit alone resolves nothing",
        ceiling: "declared adapters; not a universal UI or remote-session attestation",
        run: None,
    },
    Claim {
        id: "04-C10",
        title: "cancellation holds in-flight work and confirms a stop only at zero processes",
        ceiling: "the two-phase durable stop outbox; accepted destination effects remain for reconciliation",
        run: None,
    },
    Claim {
        id: "04-C11",
        title: "delegation and completion use bounded ancestry, acceptance kinds and final authority revalidation",
        ceiling: "acceptance is bounded by configured predicates and protected observation paths",
        run: None,
    },
    Claim {
        id: "04-C12",
        title: "runtime invariants constrain event law and emit violation evidence",
        ceiling: "exactly-once event handling does not prove an exactly-once external effect",
        run: None,
    },
];

/// One outcome checked: what was exercised, whether it held, and what shows it.
struct Step {
    what: String,
    pass: bool,
    evidence: String,
}

/// The scratch world every claim runs in.
struct Prover {
    client: Client,
    root: PathBuf,
    state: room_store::statedir::StateDir,
    project: PathBuf,
    steps: Vec<Step>,
}

/// The agents and rooms the claims share.
struct Cast {
    alpha: String,
    beta: String,
    gamma: String,
}

impl Prover {
    fn call(&mut self, token: Option<&str>, op: &str, args: Value) -> Response {
        let req = Request::new(op, args).with_token(token);
        self.client.call(&req).unwrap_or_else(|e| Response {
            ok: false,
            result: None,
            refusal: Some(room_core::Refusal::storage(format!(
                "the daemon did not answer: {e}"
            ))),
        })
    }

    fn record(&mut self, what: impl Into<String>, pass: bool, evidence: impl Into<String>) {
        self.steps.push(Step {
            what: what.into(),
            pass,
            evidence: evidence.into(),
        });
    }

    /// A call that must succeed; its result (recorded as a failed step when refused).
    fn ok(&mut self, what: &str, token: Option<&str>, op: &str, args: Value) -> Option<Value> {
        let r = self.call(token, op, args);
        match (r.ok, r.result, r.refusal) {
            (true, Some(v), _) => {
                let evidence = v["event"]
                    .as_str()
                    .map_or_else(|| "ok".to_string(), |e| format!("event {e}"));
                self.record(what, true, evidence);
                Some(v)
            }
            (_, _, Some(refusal)) => {
                self.record(
                    what,
                    false,
                    format!("refused {}: {}", refusal.code, refusal.message),
                );
                None
            }
            _ => {
                self.record(what, false, "an empty response");
                None
            }
        }
    }

    /// A call that must be refused with `code`, leaving `room`'s journal where it was.
    fn refused(
        &mut self,
        what: &str,
        token: Option<&str>,
        op: &str,
        args: Value,
        code: &str,
        room: Option<&str>,
    ) -> Option<room_core::Refusal> {
        let before = room.map(|r| self.tip(r));
        let resp = self.call(token, op, args);
        let after = room.map(|r| self.tip(r));
        match resp.refusal {
            Some(r) if r.code.as_str() == code && before == after => {
                let kept = before.map_or(String::new(), |t| format!(", journal still at seq {t}"));
                self.record(what, true, format!("{code}{kept}"));
                Some(r)
            }
            Some(r) if r.code.as_str() == code => {
                self.record(
                    what,
                    false,
                    format!("{code}, but the journal moved: {before:?} to {after:?}"),
                );
                None
            }
            Some(r) => {
                self.record(
                    what,
                    false,
                    format!("refused {} (expected {code}): {}", r.code, r.message),
                );
                None
            }
            None => {
                self.record(what, false, format!("accepted (expected {code})"));
                None
            }
        }
    }

    /// A room's tip seq, as the owner reads it.
    fn tip(&mut self, room: &str) -> u64 {
        let r = self.call(
            None,
            "room_log",
            json!({"room": room, "from": 1, "limit": 1}),
        );
        r.result.and_then(|v| v["tip_seq"].as_u64()).unwrap_or(0)
    }

    /// Read a room to its end as `token`, confirming each page (the Work Gate's loop).
    fn catch_up(&mut self, token: &str, room: &str) {
        let mut confirm: Option<String> = None;
        for _ in 0..100 {
            let r = self.call(
                Some(token),
                "sync",
                json!({"room": room, "confirm": confirm}),
            );
            let Some(page) = r.result else { return };
            if page["more"] != true && confirm.is_some() {
                return;
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
    }

    /// The permit of `source` once dispatch has settled it (at most 30 s), run the owner's
    /// revalidation pass meanwhile.
    fn wake_settled(&mut self, source: &str) -> Value {
        for _ in 0..600 {
            self.call(None, "wakes_check", json!({}));
            let all = self
                .call(None, "wakes_list", json!({}))
                .result
                .unwrap_or_default();
            let w = all["wakes"]
                .as_array()
                .and_then(|ws| ws.iter().find(|w| w["source_event"] == source))
                .cloned()
                .unwrap_or(Value::Null);
            if !matches!(w["state"].as_str(), Some("queued" | "dispatched") | None) {
                return w;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Value::Null
    }

    /// `room` run as a person would, on the scratch world's machine configuration.
    fn room_bin(&self, args: &[&str], state: &Path) -> std::process::Output {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("room"));
        std::process::Command::new(exe)
            .args(args)
            .arg("--state-dir")
            .arg(state)
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("ROOM_LOG", "error")
            .env_remove("ROOM_TOKEN")
            .output()
            .unwrap_or_else(|e| panic!("running room: {e}"))
    }

    fn set_config(&mut self, text: &str) {
        if let Err(e) = std::fs::write(self.state.config(), text) {
            self.record("write config.toml", false, e.to_string());
        }
    }
}

/// 04-C01: a copied state dir is refused at start; a project root replaced or redirected is
/// refused on the next project-scoped call, and the original restored works again.
fn c01(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let copy = p.root.join("copied-state");
    let copied = std::fs::create_dir_all(&copy)
        .and_then(|()| {
            std::fs::copy(
                p.state.root.join("state_dir_id.json"),
                copy.join("state_dir_id.json"),
            )
        })
        .is_ok();
    let out = p.room_bin(&["serve"], &copy);
    let err = String::from_utf8_lossy(&out.stderr);
    p.record(
        "a state dir copied elsewhere is refused at start",
        copied && out.status.code() == Some(4) && err.contains("state_dir_split_brain"),
        format!(
            "exit {}: {}",
            out.status.code().map_or("none".into(), |c| c.to_string()),
            err.lines().next().unwrap_or("")
        ),
    );
    let a = cast.alpha.clone();
    p.catch_up(&a, "build");
    p.ok(
        "a call in the granted project works",
        Some(&a),
        "say",
        json!({"room": "build", "text": "in the project"}),
    );
    let aside = p.root.join("project-aside");
    let moved = std::fs::rename(&p.project, &aside).and_then(|()| std::fs::create_dir(&p.project));
    if moved.is_ok() {
        p.refused(
            "a project root replaced by another directory is refused",
            Some(&a),
            "say",
            json!({"room": "build", "text": "after the swap"}),
            "project_root_redirected",
            Some("build"),
        );
        let back = std::fs::remove_dir(&p.project)
            .and_then(|()| std::os::unix::fs::symlink(&aside, &p.project));
        if back.is_ok() {
            p.refused(
                "a project root made a symbolic link to the original is refused",
                Some(&a),
                "say",
                json!({"room": "build", "text": "through a link"}),
                "project_root_redirected",
                Some("build"),
            );
        }
        let restored =
            std::fs::remove_file(&p.project).and_then(|()| std::fs::rename(&aside, &p.project));
        p.record(
            "the original root restored",
            restored.is_ok(),
            "renamed back",
        );
        p.catch_up(&a, "build");
        p.ok(
            "the restored original works again",
            Some(&a),
            "say",
            json!({"room": "build", "text": "restored"}),
        );
    } else {
        p.record("move the project root aside", false, format!("{moved:?}"));
    }
    vec!["remote shares and a host administrator's changes below the file system"]
}

/// 04-C02: a call is its principal's: a tier below the verb's, a denied verb, a rotated or
/// revoked credential are refused on the very next call.
fn c02(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let (b, g) = (cast.beta.clone(), cast.gamma.clone());
    p.ok(
        "an enrolled agent's call is its own",
        Some(&b),
        "whoami",
        json!({}),
    );
    p.refused(
        "a member creating a task (a coordinator's verb) is refused",
        Some(&b),
        "task_create",
        json!({"room": "lobby", "title": "not mine to create"}),
        "tier_insufficient",
        Some("lobby"),
    );
    p.ok(
        "the owner denies gamma the verb say",
        None,
        "agent_policy",
        json!({"name": "gamma", "deny": ["say"]}),
    );
    p.catch_up(&g, "lobby");
    p.refused(
        "a denied verb is refused",
        Some(&g),
        "say",
        json!({"room": "lobby", "text": "denied"}),
        "verb_denied",
        Some("lobby"),
    );
    p.ok(
        "the owner allows it again",
        None,
        "agent_policy",
        json!({"name": "gamma", "allow": ["say"]}),
    );
    let rotated = p.ok(
        "the owner rotates gamma's credential",
        None,
        "agent_rotate",
        json!({"name": "gamma"}),
    );
    p.refused(
        "the old credential is refused on its next call",
        Some(&g),
        "whoami",
        json!({}),
        "credential_revoked",
        None,
    );
    if let Some(new) = rotated.and_then(|r| r["token"].as_str().map(String::from)) {
        p.ok("the new credential works", Some(&new), "whoami", json!({}));
        p.ok(
            "the owner revokes gamma",
            None,
            "agent_revoke",
            json!({"name": "gamma"}),
        );
        p.refused(
            "a revoked credential is refused on its next call",
            Some(&new),
            "whoami",
            json!({}),
            "credential_revoked",
            None,
        );
    }
    p.refused(
        "no credential is no principal",
        None,
        "say",
        json!({"room": "lobby", "text": "who?"}),
        "credential_invalid",
        Some("lobby"),
    );
    vec!["native conversation binding inside each MCP host (tests/mcp proves Room's side)"]
}

/// 04-C05: each of the nine participant verbs, called blind, is refused with the unread
/// page and writes nothing; read and confirmed, the same call goes through.
fn c05(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let (a, b) = (cast.alpha.clone(), cast.beta.clone());
    // a task for beta and an obligation on it, then news beta has not read
    p.catch_up(&a, "build");
    let task = p
        .ok(
            "alpha creates a task for beta",
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "the gate's task", "to": "beta"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&a, "build");
    let sent = p
        .ok(
            "alpha sends it to beta",
            Some(&a),
            "send",
            json!({"room": "build", "to": ["beta"], "task": task, "text": "@beta the gate's task"}),
        )
        .unwrap_or_default();
    let source = sent["event"].as_str().unwrap_or_default().to_string();
    let obligation = sent["obligations"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let blind: [(&str, Value); 9] = [
        ("say", json!({"room": "build", "text": "blind"})),
        ("note", json!({"room": "build", "text": "blind"})),
        (
            "reply",
            json!({"room": "build", "reply_to": source, "text": "blind"}),
        ),
        (
            "send",
            json!({"room": "build", "to": ["alpha"], "task": task, "text": "@alpha blind"}),
        ),
        (
            "handoff",
            json!({"room": "build", "task": task, "to": ["gamma"]}),
        ),
        ("done", json!({"room": "build", "task": task})),
        (
            "blocked",
            json!({"room": "build", "task": task, "text": "blind"}),
        ),
        (
            "decline",
            json!({"room": "build", "task": task, "text": "blind"}),
        ),
        ("circle", json!({"room": "build", "obligation": obligation})),
    ];
    for (verb, args) in blind {
        let r = p.refused(
            &format!("{verb}, called blind, is refused with the unread page"),
            Some(&b),
            verb,
            args,
            "room_sync_required",
            Some("build"),
        );
        if let Some(r) = r
            && r.detail["next_page"]["receipt"].as_str().is_none()
        {
            p.record(
                format!("{verb}'s refusal carries the page to read"),
                false,
                "no next_page",
            );
        }
    }
    p.catch_up(&b, "build");
    p.ok(
        "read and confirmed, the reply goes through",
        Some(&b),
        "reply",
        json!({"room": "build", "reply_to": source, "text": "read it, on it"}),
    );
    vec!["recursive causal-parent confirmation of each cited parent across rooms"]
}

/// 04-C06: each verb does one thing; a call that would blur two is refused naming which.
fn c06(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let (a, b) = (cast.alpha.clone(), cast.beta.clone());
    p.catch_up(&a, "build");
    let task = p
        .ok(
            "a task to speak about",
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "the verbs' task", "to": "beta"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&a, "build");
    p.refused(
        "a note (status) may not mention anyone",
        Some(&a),
        "note",
        json!({"room": "build", "text": "@beta look"}),
        "note_mentions_refused",
        Some("build"),
    );
    p.refused(
        "a say (conversation) does not carry a task",
        Some(&a),
        "say",
        json!({"room": "build", "text": "about it", "task": task}),
        "say_task_refused",
        Some("build"),
    );
    p.refused(
        "a send (assignment) in a project room names its task",
        Some(&a),
        "send",
        json!({"room": "build", "to": ["beta"], "text": "@beta do something"}),
        "send_task_required",
        Some("build"),
    );
    let said = p
        .ok(
            "alpha says something to nobody in particular",
            Some(&a),
            "say",
            json!({"room": "build", "text": "a plain remark"}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&b, "build");
    p.refused(
        "a reply (response) answers only what was addressed to its author",
        Some(&b),
        "reply",
        json!({"room": "build", "reply_to": said, "text": "not asked"}),
        "reply_target_not_addressed",
        Some("build"),
    );
    p.ok(
        "a note (status) writes without waking anyone",
        Some(&a),
        "note",
        json!({"room": "build", "text": "status: fine"}),
    );
    vec![
        "successor tasks and their acknowledgments",
        "cross-room evidence (`cross_room_evidence_refused`)",
    ]
}

/// 04-C07: a permit sealed at send is checked again at dispatch: a routed worker is woken and
/// replies; a rotated recipient, a passed deadline, a closed admission and a finished task
/// are each refused at dispatch with their code, and the obligation stays open.
fn c07(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    p.catch_up(&a, "lobby");
    let task = p
        .ok(
            "a task for beta in the coordination room",
            Some(&a),
            "task_create",
            json!({"room": "lobby", "title": "answer alpha", "to": "beta"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    let ask = |p: &mut Prover, text: &str| -> String {
        p.catch_up(&a, "lobby");
        p.ok(
            "alpha asks beta (a sealed permit)",
            Some(&a),
            "send",
            json!({"room": "lobby", "to": ["beta"], "task": task, "text": format!("@beta {text}")}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default()
    };
    p.set_config("[routes.beta]\nadapter = \"script\"\nsteps = [\"read\", \"reply\"]\n");
    let source = ask(p, "which file first?");
    let w = p.wake_settled(&source);
    p.record(
        "a routed worker process is woken, revalidated, and replies",
        w["state"] == "replied",
        format!(
            "wake {} -> {}",
            w["path"].as_str().unwrap_or("?"),
            w["state"]
        ),
    );
    p.set_config("");
    let dead = |p: &mut Prover, what: &str, code: &str, source: &str| {
        let w = p.wake_settled(source);
        let got = w["dead_letter"]["code"]
            .as_str()
            .unwrap_or("none")
            .to_string();
        p.record(
            what,
            got == code,
            format!(
                "dead letter {got}: {}",
                w["dead_letter"]["reason"].as_str().unwrap_or("")
            ),
        );
    };
    let source = ask(p, "and the lexer?");
    p.ok(
        "the owner rotates beta",
        None,
        "agent_rotate",
        json!({"name": "beta"}),
    );
    dead(
        p,
        "a permit sealed before the recipient's rotation is refused at dispatch",
        "wake_recipient_registration_changed",
        &source,
    );
    p.set_config("[dispatch]\ntasked_deadline_ms = 1500\n");
    let source = ask(p, "still there?");
    std::thread::sleep(Duration::from_millis(1_600));
    dead(
        p,
        "a permit past its original deadline is refused (queue time counts)",
        "wake_job_expired",
        &source,
    );
    p.set_config("");
    let source = ask(p, "one more?");
    p.ok(
        "the owner closes the room's admission",
        None,
        "room_admission",
        json!({"room": "lobby", "open": false}),
    );
    dead(
        p,
        "a permit in a room whose admission closed is refused",
        "wake_admission_closed",
        &source,
    );
    p.ok(
        "the owner opens it again",
        None,
        "room_admission",
        json!({"room": "lobby", "open": true}),
    );
    vec![
        "the worker-claim revalidation (the one-launch credential's split lock) and its pid and path changes",
        "a roster change (a member removed)",
    ]
}

pub fn run(claims: &[String], as_json: bool) -> i32 {
    let wanted = match select(claims) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error[invalid_argument]: claim: {e}");
            return crate::cmd::EXIT_REFUSED;
        }
    };
    match card(&wanted) {
        Ok(card) => report(&card, as_json),
        Err(e) => {
            eprintln!("error: room prove could not set up its scratch world: {e:#}");
            crate::cmd::EXIT_IO
        }
    }
}

/// The claims asked for (all when none): `04-C07`, `C07` and `c7` name the same one.
fn select(claims: &[String]) -> Result<Vec<&'static Claim>, String> {
    if claims.is_empty() {
        return Ok(CLAIMS.iter().collect());
    }
    claims
        .iter()
        .map(|c| {
            let n = c
                .to_ascii_uppercase()
                .trim_start_matches("04-")
                .trim_start_matches('C')
                .parse::<usize>()
                .ok();
            n.and_then(|n| CLAIMS.get(n.wrapping_sub(1)))
                .ok_or_else(|| format!("{c:?} is none of 04-C01 … 04-C12"))
        })
        .collect()
}

fn card(wanted: &[&'static Claim]) -> anyhow::Result<Value> {
    let tmp = tempfile::Builder::new().prefix("room-prove-").tempdir()?;
    let root = std::fs::canonicalize(tmp.path())?;
    let bootstrap = root.join("config/room/bootstrap.toml");
    let project = root.join("project");
    std::fs::create_dir_all(&project)?;
    let state = room_store::statedir::init(&root.join("state"), &bootstrap, "prove-instance")?;
    let daemon = Daemon::start_with(room_server::daemon::ServeConfig {
        state_dir: state.root.clone(),
        bootstrap,
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: std::env::current_exe().ok(),
        store: None,
    })?;
    let mut p = Prover {
        client: Client::connect(&daemon.socket)?,
        root: root.clone(),
        state,
        project,
        steps: Vec::new(),
    };
    let cast = setup(&mut p)?;
    let mut claims = Vec::new();
    for c in wanted {
        claims.push(match c.run {
            None => json!({"id": c.id, "title": c.title, "ceiling": c.ceiling, "status": "not_built",
                "steps": [], "not_exercised": ["the whole claim: this build has no card for it yet"]}),
            Some(run) => {
                p.steps.clear();
                let not_exercised = run(&mut p, &cast);
                let steps: Vec<Value> = p
                    .steps
                    .iter()
                    .map(|s| json!({"what": s.what, "pass": s.pass, "evidence": s.evidence}))
                    .collect();
                let pass = !p.steps.is_empty() && p.steps.iter().all(|s| s.pass);
                json!({"id": c.id, "title": c.title, "ceiling": c.ceiling,
                    "status": if pass { "pass" } else { "fail" }, "steps": steps,
                    "not_exercised": not_exercised})
            }
        });
    }
    let state_root = p.state.root.clone();
    drop(p);
    daemon.stop()?;
    let chains = crate::cmd::verify_dir(&state_root, None).map_err(anyhow::Error::msg)?;
    let chains_ok = !chains.is_empty() && chains.iter().all(|r| r["ok"] == true);
    let verdict = if !chains_ok || claims.iter().any(|c| c["status"] == "fail") {
        "fail"
    } else if claims.iter().any(|c| c["status"] == "not_built") {
        "unproven"
    } else {
        "pass"
    };
    Ok(
        json!({"verdict": verdict, "claims": claims, "chains": chains, "chains_ok": chains_ok,
        "machine": machine()}),
    )
}

/// The agents, the project and the rooms every claim uses.
fn setup(p: &mut Prover) -> anyhow::Result<Cast> {
    let enroll = |p: &mut Prover, name: &str, tier: &str| -> anyhow::Result<String> {
        p.call(
            None,
            "agent_enroll",
            json!({"name": name, "max_tier": tier}),
        )
        .result
        .and_then(|v| v["token"].as_str().map(String::from))
        .ok_or_else(|| anyhow::anyhow!("enrolling {name} failed"))
    };
    let cast = Cast {
        alpha: enroll(p, "alpha", "coordinator")?,
        beta: enroll(p, "beta", "member")?,
        gamma: enroll(p, "gamma", "member")?,
    };
    let project = p.project.to_string_lossy().to_string();
    let opened = p.call(
        None,
        "project_open",
        json!({"path": project, "name": "prove"}),
    );
    let pid = opened
        .result
        .and_then(|v| v["id"].as_str().map(String::from))
        .ok_or_else(|| anyhow::anyhow!("opening the scratch project failed"))?;
    for (room, project) in [("build", Some(pid)), ("lobby", None)] {
        let r = p.call(
            None,
            "room_create",
            json!({"name": room, "project": project,
            "members": ["alpha", "beta", "gamma"]}),
        );
        anyhow::ensure!(r.ok, "creating room {room} failed: {:?}", r.refusal);
    }
    Ok(cast)
}

/// What this machine offers the claims (what a card exercised depends on it).
fn machine() -> Value {
    json!({"cgroup_v2": Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).ok()})
}

fn report(card: &Value, as_json: bool) -> i32 {
    let code = match card["verdict"].as_str() {
        Some("pass") => 0,
        _ => crate::cmd::EXIT_REFUSED,
    };
    if as_json {
        println!("{card}");
        return code;
    }
    for c in card["claims"].as_array().into_iter().flatten() {
        println!(
            "{} {}: {}",
            c["id"].as_str().unwrap_or("?"),
            c["status"].as_str().unwrap_or("?").to_uppercase(),
            c["title"].as_str().unwrap_or("")
        );
        for s in c["steps"].as_array().into_iter().flatten() {
            let mark = if s["pass"] == true { "ok  " } else { "FAIL" };
            println!(
                "    {mark} {} ({})",
                s["what"].as_str().unwrap_or(""),
                s["evidence"].as_str().unwrap_or("")
            );
        }
        println!("    ceiling: {}", c["ceiling"].as_str().unwrap_or(""));
        for n in c["not_exercised"].as_array().into_iter().flatten() {
            println!("    not exercised here: {}", n.as_str().unwrap_or(""));
        }
    }
    let chains = card["chains"].as_array().map_or(0, Vec::len);
    println!(
        "chains: {chains} rooms {}",
        if card["chains_ok"] == true {
            "verified"
        } else {
            "NOT verified"
        }
    );
    println!("verdict: {}", card["verdict"].as_str().unwrap_or("?"));
    code
}
