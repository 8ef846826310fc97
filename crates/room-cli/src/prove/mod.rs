//! `room prove [CLAIM…]`: the seed's twelve bounded claims (04-C01 … 04-C12) exercised on this
//! machine, as anyone can run them (issue 45). It builds a scratch state dir (never the
//! user's), starts a real daemon on it and, for each claim, walks its positive path and the
//! refusal paths it names through the daemon API and the `room` binary, checking each outcome
//! by its stable code and, for a refused turn, that the room's journal did not move. Every
//! chain is verified at the end. The card names what was exercised, the evidence, the claim's
//! stated ceiling and what was not exercised here; the exit status is the verdict.
//!
//! Each card must be able to fail: `scripts/prove-planted` runs it against a build whose
//! mechanism for that claim is broken on purpose (room-engine's `planted-bugs`).

mod cards;
mod crash;
mod tasks;
mod views;
mod wakes;

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
    run: fn(&mut Prover, &Cast) -> Vec<&'static str>,
}

const CLAIMS: &[Claim] = &[
    Claim {
        id: "04-C01",
        title: "split-brain state trees are refused, and project grants revalidate their path and kernel identity",
        ceiling: "local Linux file systems; not a remote-share or host-admin guarantee",
        run: cards::c01,
    },
    Claim {
        id: "04-C02",
        title: "enrollment, tier clamping and verb policy bind every call to a principal",
        ceiling: "declared MCP and CLI paths; a host's own contract is its to keep",
        run: cards::c02,
    },
    Claim {
        id: "04-C03",
        title: "room shards carry immutable scope bindings and parent-withholding closure",
        ceiling: "graph queries, compositions and exports; hash artifacts do not prove non-deletion",
        run: views::c03,
    },
    Claim {
        id: "04-C04",
        title: "the sync index reconciles handle-pinned journals and binds checkpoints to conversation and view",
        ceiling: "rotation, fork and delivery-policy refusal paths",
        run: views::c04,
    },
    Claim {
        id: "04-C05",
        title: "the Work Gate requires the live frontier before every participant verb",
        ceiling: "blind writes receive a sync page, not authority",
        run: cards::c05,
    },
    Claim {
        id: "04-C06",
        title: "contribution verbs separate status, response, assignment, transfer and completion",
        ceiling: "ambiguity, cross-room evidence, successor and no-wake paths",
        run: cards::c06,
    },
    Claim {
        id: "04-C07",
        title: "every wake is a sealed permit revalidated at dispatch",
        ceiling: "binding, roster, registration, task, epoch, path, pid and original-deadline changes",
        run: cards::c07,
    },
    Claim {
        id: "04-C08",
        title: "wake-time evidence is recipient-specific and governing-source coverage is continuous",
        ceiling: "wake_delivery receipts and bounded time windows",
        run: wakes::c08,
    },
    Claim {
        id: "04-C09",
        title: "native delivery and reply are distinct proof states; process exit alone resolves nothing",
        ceiling: "declared adapters; not a universal UI or remote-session attestation",
        run: wakes::c09,
    },
    Claim {
        id: "04-C10",
        title: "cancellation holds in-flight work and confirms a stop only at zero processes",
        ceiling: "the two-phase durable stop outbox; accepted destination effects remain for reconciliation",
        run: wakes::c10,
    },
    Claim {
        id: "04-C11",
        title: "delegation and completion use bounded ancestry, acceptance kinds and final authority revalidation",
        ceiling: "acceptance is bounded by configured predicates and protected observation paths",
        run: tasks::c11,
    },
    Claim {
        id: "04-C12",
        title: "runtime invariants constrain event law and emit violation evidence",
        ceiling: "exactly-once event handling does not prove an exactly-once external effect",
        run: tasks::c12,
    },
];

/// One outcome checked: what was exercised, whether it held, and what shows it.
struct Step {
    what: String,
    pass: bool,
    evidence: String,
}

/// The scratch world every claim runs in.
pub(super) struct Prover {
    /// The connection to the daemon (none only while it restarts).
    client: Option<Client>,
    /// The daemon and how it was started, for a card that restarts it.
    daemon: Option<Daemon>,
    serve: room_server::daemon::ServeConfig,
    pub(super) root: PathBuf,
    pub(super) state: room_store::statedir::StateDir,
    pub(super) project: PathBuf,
    steps: Vec<Step>,
}

/// The agents and rooms the claims share.
pub(super) struct Cast {
    /// A coordinator no card rotates or revokes.
    pub(super) alpha: String,
}

impl Prover {
    pub(super) fn call(&mut self, token: Option<&str>, op: &str, args: Value) -> Response {
        self.call_in(token, None, op, args)
    }

    /// A call made in the native conversation `conversation` (the default one when none).
    pub(super) fn call_in(
        &mut self,
        token: Option<&str>,
        conversation: Option<&str>,
        op: &str,
        args: Value,
    ) -> Response {
        let mut req = Request::new(op, args).with_token(token);
        if let Some(c) = conversation {
            req.conversation = Some(c.to_string());
        }
        let answered = match self.client.as_mut() {
            Some(c) => c.call(&req).map_err(|e| e.to_string()),
            None => Err("no connection".into()),
        };
        answered.unwrap_or_else(|e| Response {
            ok: false,
            result: None,
            refusal: Some(room_core::Refusal::storage(format!(
                "the daemon did not answer: {e}"
            ))),
        })
    }

    pub(super) fn record(
        &mut self,
        what: impl Into<String>,
        pass: bool,
        evidence: impl Into<String>,
    ) {
        self.steps.push(Step {
            what: what.into(),
            pass,
            evidence: evidence.into(),
        });
    }

    /// A call that must succeed; its result (recorded as a failed step when refused).
    pub(super) fn ok(
        &mut self,
        what: &str,
        token: Option<&str>,
        op: &str,
        args: Value,
    ) -> Option<Value> {
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
    pub(super) fn refused(
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

    /// Stop the daemon cleanly, run `between` on the stopped state dir, and start it again
    /// (what a card does to files only a stopped daemon may have changed under it).
    pub(super) fn restart(
        &mut self,
        between: impl FnOnce() -> std::io::Result<()>,
    ) -> anyhow::Result<()> {
        self.client = None;
        if let Some(d) = self.daemon.take() {
            d.stop()?;
        }
        let changed = between();
        let d = Daemon::start_with(self.serve.clone())?;
        self.client = Some(Client::connect(&d.socket)?);
        self.daemon = Some(d);
        Ok(changed?)
    }

    /// A room's tip seq, as the owner reads it.
    pub(super) fn tip(&mut self, room: &str) -> u64 {
        let r = self.call(
            None,
            "room_log",
            json!({"room": room, "from": 1, "limit": 1}),
        );
        r.result.and_then(|v| v["tip_seq"].as_u64()).unwrap_or(0)
    }

    /// Read a room to its end as `token`, confirming each page (the Work Gate's loop): done
    /// once a page after a confirmation holds nothing more.
    pub(super) fn catch_up(&mut self, token: &str, room: &str) {
        let mut confirm: Option<String> = None;
        for _ in 0..1_000 {
            let r = self.call(
                Some(token),
                "sync",
                json!({"room": room, "confirm": confirm}),
            );
            let Some(page) = r.result else { return };
            let empty = page["items"].as_array().is_none_or(Vec::is_empty);
            if confirm.is_some() && page["more"] != true && empty {
                return;
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
    }

    /// Enroll a member of its own for a card (so cards run in any order) and add it to both
    /// rooms; its token.
    pub(super) fn recruit(&mut self, name: &str, tier: &str) -> String {
        let token = self
            .ok(
                &format!("the owner enrolls {name}"),
                None,
                "agent_enroll",
                json!({"name": name, "max_tier": tier}),
            )
            .and_then(|v| v["token"].as_str().map(String::from))
            .unwrap_or_default();
        for room in ["build", "lobby"] {
            self.call(
                None,
                "room_members_add",
                json!({"room": room, "agent": name}),
            );
        }
        self.steps.pop();
        token
    }

    /// A call that an invariant must reject with `code`, recording exactly one
    /// `invariant_violation` record named by the refusal (the evidence), and nothing else.
    pub(super) fn violated(
        &mut self,
        what: &str,
        token: Option<&str>,
        op: &str,
        args: Value,
        (room, invariant, code): (&str, &str, &str),
    ) {
        let before = self.tip(room);
        let resp = self.call(token, op, args);
        let after = self.tip(room);
        let Some(r) = resp.refusal else {
            self.record(what, false, format!("accepted (expected {code})"));
            return;
        };
        let evidence = self
            .call(
                None,
                "room_log",
                json!({"room": room, "from": after, "limit": 1}),
            )
            .result
            .and_then(|v| v["events"].get(0).cloned())
            .unwrap_or_default();
        let pass = r.code.as_str() == code
            && r.detail["invariant"] == invariant
            && after == before + 1
            && evidence["kind"] == "invariant_violation"
            && evidence["id"] == r.detail["violation_event"]
            && evidence["event"]["invariant"] == invariant;
        self.record(
            what,
            pass,
            format!(
                "{} ({invariant}), evidence {} at seq {after}",
                r.code,
                evidence["id"].as_str().unwrap_or("missing")
            ),
        );
    }

    /// The permit of `source` once dispatch has settled it (at most 30 s), run the owner's
    /// revalidation pass meanwhile.
    pub(super) fn wake_settled(&mut self, source: &str) -> Value {
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
    pub(super) fn room_bin(&self, args: &[&str], state: &Path) -> std::process::Output {
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

    pub(super) fn set_config(&mut self, text: &str) {
        if let Err(e) = std::fs::write(self.state.config(), text) {
            self.record("write config.toml", false, e.to_string());
        }
    }
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
    let serve = room_server::daemon::ServeConfig {
        state_dir: state.root.clone(),
        bootstrap,
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: std::env::current_exe().ok(),
        store: None,
    };
    let daemon = Daemon::start_with(serve.clone())?;
    let mut p = Prover {
        client: Some(Client::connect(&daemon.socket)?),
        daemon: Some(daemon),
        serve,
        root: root.clone(),
        state,
        project,
        steps: Vec::new(),
    };
    let cast = setup(&mut p)?;
    let mut claims = Vec::new();
    for c in wanted {
        p.steps.clear();
        let not_exercised = (c.run)(&mut p, &cast);
        let steps: Vec<Value> = p
            .steps
            .iter()
            .map(|s| json!({"what": s.what, "pass": s.pass, "evidence": s.evidence}))
            .collect();
        let pass = !p.steps.is_empty() && p.steps.iter().all(|s| s.pass);
        claims.push(json!({"id": c.id, "title": c.title, "ceiling": c.ceiling,
            "status": if pass { "pass" } else { "fail" }, "steps": steps,
            "not_exercised": not_exercised}));
    }
    let state_root = p.state.root.clone();
    p.client = None;
    if let Some(d) = p.daemon.take() {
        d.stop()?;
    }
    let chains = crate::cmd::verify_dir(&state_root, None).map_err(anyhow::Error::msg)?;
    let chains_ok = !chains.is_empty() && chains.iter().all(|r| r["ok"] == true);
    let verdict = if !chains_ok || claims.iter().any(|c| c["status"] == "fail") {
        "fail"
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
            "members": ["alpha"]}),
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
