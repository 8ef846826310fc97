//! The collaboration floor under simulation (issues 41 and 42): the real scheduler
//! (`room_collab::scheduler`) and the real engine and store, a collaboration recorded as the
//! daemon records one (`room_collab::start`), its roles played by the simulator with their own
//! credentials, and the person deciding its approvals, all drawn from one seed. Between passes
//! the roles finish, decline or abandon their tasks, try writes and reads their scopes do not
//! allow, the clock jumps past panels' deadlines, and the daemon restarts (the engine and the
//! scheduler dropped and opened again on the same state). After every step an oracle that
//! keeps its own account checks what the floor promises:
//!
//! - the fence: a role's artifact write lands only if the scopes the oracle expects it to hold
//!   allow its kind (from the pack at start, widened only by a plan the person approved), and a
//!   write they allow is never refused `artifact_write_denied`; a reviewer never reads another
//!   reviewer's findings;
//! - the barrier: a panel's run is never joined or ended (`done`, `fixed`,
//!   `fix_loop_exhausted`, `failed`) while one of its seats is still dispatching or running, and every seat it fanned out to stays
//!   in the record (`failed`, `timed_out`, `blocked` shown, never dropped);
//! - the fix loop: a panel never runs more fix loops in a row than its `fix_loops_max`;
//! - exactly once: no two runs share a task, and every task the orchestrator made is one run's
//!   (a dispatch repeated after a restart finds the task its first attempt made);
//! - approvals: a decision naming a digest other than the pending one is `approval_stale`
//!   and changes nothing;
//! - the identity tree: once the collaboration has ended, every child's credential is refused;
//! - with an agent orchestrator (the simulator plays its child, steering with
//!   `room_collab::steer`): the scheduler begins no run itself (only the pack's fix loop and
//!   the person's reruns begin runs beside the agent's dispatches), and a dispatch refused
//!   `phase_not_ready` changes nothing;
//! - at the end, every chain verifies.

use crate::{Failure, SIM_CHECK, SimRunner, scratch_dir};
use room_collab::pack::{Pack, PhaseKind};
use room_collab::scheduler::{InlineHost, Scheduler, load};
use room_core::env::{ManualClock, SeededEntropy};
use room_core::{Code, Refusal, Verb};
use room_engine::collab::Verdict;
use room_engine::principal::AgentCaller;
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig, Env, Owner};
use room_store::control::CollabRunRow;
use room_store::fs::RealFs;
use room_store::journal::{Fault, Faults};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// One collaboration's simulation.
#[derive(Debug, Clone)]
pub struct CollabConfig {
    pub seed: u64,
    pub steps: u64,
}

/// What a passing run did.
#[derive(Debug, Clone, Default)]
pub struct CollabReport {
    pub passes: u64,
    pub restarts: u64,
    /// Passes cut by a crash between their writes.
    pub crashes_in_pass: u64,
    pub tasks_done: u64,
    pub declined: u64,
    pub decisions: u64,
    pub stale_decisions: u64,
    pub fenced: u64,
    pub fixes: u64,
    pub panels_joined: u64,
    pub timed_out: u64,
    /// Judges' runs that wrote their synthesis.
    pub judged: u64,
    /// The collaboration's state at the end.
    pub state: String,
    pub refusals: BTreeMap<String, u64>,
    /// An agent (the simulator) orchestrated: its dispatches and the wakes it was told.
    pub agent_orchestrated: bool,
    pub steered_dispatches: u64,
    pub wakes_told: u64,
    /// Of them, reminders of what waited (`steer::RETELL_MS`).
    pub retells: u64,
}

/// The simulation's host: no working trees, every job (a gate's measurement) inline.
fn inline() -> Arc<dyn room_collab::scheduler::Host> {
    Arc::new(InlineHost)
}

/// A crash armed inside a scheduler's pass: the journal append this many appends on lands
/// and the process dies before its fsync (`Fault::CrashAfterWrite`); the simulator then
/// restarts, so a pass is cut anywhere between its writes.
#[derive(Debug, Default)]
struct CrashInPass {
    armed: Mutex<Option<u32>>,
    fired: AtomicBool,
}

impl Faults for CrashInPass {
    fn on_append(&self, _path: &std::path::Path, _bytes: usize) -> Option<Fault> {
        let mut armed = self.armed.lock().expect("crash lock");
        match *armed {
            Some(0) => {
                *armed = None;
                self.fired.store(true, Ordering::SeqCst);
                Some(Fault::CrashAfterWrite)
            }
            Some(n) => {
                *armed = Some(n - 1);
                None
            }
            None => None,
        }
    }
}

/// A role's child as the simulator plays it.
struct Child {
    role: String,
    agent: String,
    token: String,
    /// What the oracle expects it to hold.
    scopes: BTreeSet<String>,
    /// Held back until each phase's plan is approved, by phase.
    held: BTreeMap<String, Vec<String>>,
}

struct CollabSim {
    cfg: CollabConfig,
    rng: crate::Rng,
    _tmp: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
    clock: Arc<ManualClock>,
    entropy: Arc<SeededEntropy>,
    runner: Arc<SimRunner>,
    crash: Arc<CrashInPass>,
    engine: Option<Engine>,
    scheduler: Scheduler,
    pack: Option<Pack>,
    id: String,
    children: Vec<Child>,
    step: u64,
    recent: Vec<String>,
    report: CollabReport,
    /// Plans the person approved (their phases).
    planned: BTreeSet<String>,
    /// The runs the orchestrator's child began (agent orchestration): the scheduler begins
    /// none itself.
    steered: BTreeSet<(String, u32)>,
}

/// Run one seed.
pub fn run(cfg: CollabConfig) -> Result<CollabReport, Failure> {
    let mut s = CollabSim::new(cfg);
    s.setup().map_err(|e| s.fail(e))?;
    while s.step < s.cfg.steps {
        s.step += 1;
        s.one_step()?;
        s.check()?;
        if s.ended() {
            break;
        }
    }
    s.finish()?;
    Ok(s.report)
}

/// The pack a seed runs: spec → research ∥ architecture → implementation → gate → review
/// panel → approval, its choices (approvals, a plan, the panel's breadth, debate and loop
/// cap, the live-worker cap) drawn from the seed.
fn pack_text(rng: &mut crate::Rng, agent_orchestrated: bool) -> (String, usize) {
    let reviewers = 2 + rng.below(2) as usize;
    let orchestrator = if agent_orchestrated {
        "\n[orchestrator]\nprompt = \"o.md\"\n"
    } else {
        ""
    };
    let text = format!(
        r#"name = "sim"
{orchestrator}
[guards]
live_workers_max = {cap}

[[phases]]
name = "spec"
kind = "agent"
role = "architecture"
writes = ["spec"]
prompt = "p.md"
approve = {spec_approve}

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
name = "implementation"
kind = "agent"
role = "reasoning"
reads = ["spec", "research", "adr"]
writes = ["diff"]
prompt = "p.md"
approve = false
plan = {plan}

[[phases]]
name = "gate"
kind = "gate"
reads = ["diff"]
commands = [{{ program = "{SIM_CHECK}", timeout_ms = 1000 }}]

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = {reviewers}
reads = ["diff", "spec"]
writes = ["findings"]
after = ["gate"]
prompt = "p.md"
timeout_ms = 60000
fix_loops_max = {loops}
debate = {debate}
{judge}
[[phases]]
name = "approval"
kind = "approval"
reads = ["diff", "findings"]
"#,
        cap = 1 + rng.below(4),
        spec_approve = rng.chance(30),
        plan = rng.chance(40),
        loops = rng.below(3),
        debate = rng.chance(40),
        judge = if rng.chance(40) {
            "judge = \"architecture\"\n"
        } else {
            ""
        },
    );
    (text, reviewers)
}

/// A diff of the one file the simulated project has, and findings pointing into it.
const PATCH: &str = "--- a/greet.sh\n+++ b/greet.sh\n@@ -1,2 +1,2 @@\n #!/bin/sh\n-echo hello\n+echo hello, verbosely\n";

fn content(kind: &str, rng: &mut crate::Rng) -> Value {
    match kind {
        "spec" => json!({"title": "t", "goal": "g", "requirements": ["r"]}),
        "research" => json!({"summary": "s", "findings": [{"claim": "c", "source": "s"}]}),
        "adr" => json!({"title": "t", "status": "accepted", "context": "c", "decision": "d"}),
        "diff" => json!({"base": "sim", "patch": PATCH, "summary": "verbose"}),
        "findings" => {
            let f = json!([{"title": "longer greeting", "file": "greet.sh", "line": 2}]);
            if rng.chance(35) {
                json!({"blocking": f, "non_blocking": [], "suggestions": []})
            } else {
                json!({"blocking": [], "non_blocking": f, "suggestions": []})
            }
        }
        "extra/synthesis" => json!({"merged": [], "disagreements": [], "summary": "agreed"}),
        _ => json!({"steps": ["do it"]}),
    }
}

impl CollabSim {
    fn new(cfg: CollabConfig) -> CollabSim {
        let tmp = tempfile::tempdir_in(scratch_dir()).expect("a scratch dir");
        let root = std::fs::canonicalize(tmp.path()).expect("canonical scratch dir");
        let state = root.join("state");
        let boot = root.join("boot.toml");
        room_store::statedir::init(&state, &boot, &format!("collab-sim-{}", cfg.seed))
            .expect("state dir");
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(state.join("config.toml"))
                .expect("config.toml");
            writeln!(f, "\n[acceptance]\ncommands = [\"{SIM_CHECK}\"]").expect("config.toml");
        }
        CollabSim {
            rng: crate::Rng(cfg.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1),
            clock: Arc::new(ManualClock::new(1_790_000_000_000)),
            entropy: Arc::new(SeededEntropy::new(cfg.seed ^ 0xc011ab)),
            runner: Arc::new(SimRunner::new(cfg.seed)),
            crash: Arc::new(CrashInPass::default()),
            cfg,
            _tmp: tmp,
            state,
            boot,
            engine: None,
            scheduler: Scheduler::new(inline()),
            pack: None,
            id: String::new(),
            children: Vec::new(),
            step: 0,
            recent: Vec::new(),
            report: CollabReport::default(),
            planned: BTreeSet::new(),
            steered: BTreeSet::new(),
        }
    }

    fn open(&mut self) -> Result<(), String> {
        let s =
            room_store::statedir::validate(&self.state, &self.boot).map_err(|e| e.to_string())?;
        let env = Env {
            clock: self.clock.clone(),
            entropy: self.entropy.clone(),
            fs: Arc::new(RealFs),
            runner: self.runner.clone(),
        };
        let faults: Arc<dyn Faults> = self.crash.clone();
        let store = Arc::new(room_store::SqliteBackend::new(
            &s,
            room_store::SqliteBackendConfig {
                faults: Some(faults),
                ..Default::default()
            },
        ));
        self.engine = Some(
            Engine::open(s, env, store, EngineConfig::default())
                .map_err(|e| format!("engine failed to open: {e}"))?,
        );
        // the scheduler's credentials live in a daemon's memory: a new process mints anew
        self.scheduler = Scheduler::new(inline());
        Ok(())
    }

    fn e(&self) -> &Engine {
        self.engine
            .as_ref()
            .expect("the engine is open between steps")
    }

    fn owner(&self) -> Owner {
        crate::sim_owner(self.e())
    }

    fn pack(&self) -> &Pack {
        self.pack.as_ref().expect("the pack is loaded at setup")
    }

    fn note(&mut self, line: String) {
        self.recent.push(line);
        if self.recent.len() > 30 {
            self.recent.remove(0);
        }
    }

    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure {
            seed: self.cfg.seed,
            step: self.step,
            what: what.into(),
            recent: self.recent.clone(),
        }
    }

    fn refused(&mut self, r: &Refusal) {
        *self
            .report
            .refusals
            .entry(r.code.as_str().to_string())
            .or_default() += 1;
    }

    fn setup(&mut self) -> Result<(), String> {
        self.open()?;
        let steered = self.rng.chance(35);
        self.report.agent_orchestrated = steered;
        let (text, reviewers) = pack_text(&mut self.rng, steered);
        let mut roles = vec![
            "architecture=script:a".to_string(),
            "search=script:b".to_string(),
            "reasoning=script:c".to_string(),
        ];
        if steered {
            roles.push("orchestrator=script:o".to_string());
        }
        for n in 0..reviewers {
            roles.push(format!("review=script:r{n}"));
        }
        let pack = load(&text, &roles).map_err(|r| r.to_string())?;
        let routes: BTreeMap<String, Value> = pack
            .profile
            .roles
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    json!({"adapter": "script", "steps": ["read"]}),
                )
            })
            .collect();
        let owner = self.owner();
        let id = self.e().collab_new_id();
        let prompts = BTreeMap::from([
            ("p.md".to_string(), "do your part".to_string()),
            ("o.md".to_string(), "orchestrate".to_string()),
        ]);
        let recorded = room_collab::start::record(
            self.e(),
            &owner,
            room_collab::start::Record {
                id: id.clone(),
                goal: "greet verbosely".into(),
                project: None,
                pack: &pack,
                pack_text: text,
                prompts,
                routes,
                roles,
                usd_max: None,
                trees: None,
            },
        )
        .map_err(|r| r.to_string())?;
        for role in &pack.profile.roles {
            let agent = format!("{id}-{}", role.name);
            let (scopes, held) = room_collab::start::scopes_split(&pack, role);
            self.children.push(Child {
                role: role.name.clone(),
                token: recorded.tokens.get(&agent).cloned().unwrap_or_default(),
                agent,
                scopes: scopes.into_iter().collect(),
                held,
            });
        }
        self.note(format!(
            "recorded {id}: {} children, phases {:?}",
            self.children.len(),
            pack.phases
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        ));
        self.id = id;
        self.pack = Some(pack);
        Ok(())
    }

    fn caller(&self, i: usize) -> AgentCaller {
        AgentCaller {
            token: self.children[i].token.clone(),
            conversation: "sim-role".into(),
            declared_tier: None,
            page_bytes_max: None,
        }
    }

    fn runs(&self) -> Result<Vec<CollabRunRow>, Failure> {
        self.e()
            .collab_show(&self.owner(), &self.id)
            .map(|(_, runs, _)| runs)
            .map_err(|r| self.fail(format!("collab_show: {r}")))
    }

    fn ended(&self) -> bool {
        self.e()
            .collab_show(&self.owner(), &self.id)
            .is_ok_and(|(c, _, _)| c.state != "running")
    }

    fn one_step(&mut self) -> Result<(), Failure> {
        match self.rng.below(100) {
            0..=29 if self.report.agent_orchestrated && self.rng.chance(50) => self.orchestrate(),
            0..=29 => self.pass(),
            30..=64 => self.role_acts(),
            65..=74 => self.fence(),
            75..=86 => self.decide(),
            87..=93 => {
                let ms = 1_000 + self.rng.below(90_000);
                self.clock.advance(ms);
                self.note(format!("clock +{ms} ms"));
                Ok(())
            }
            _ => self.restart(),
        }
    }

    fn pass(&mut self) -> Result<(), Failure> {
        self.report.passes += 1;
        let c = match self.e().collab_show(&self.owner(), &self.id) {
            Ok((c, _, _)) if c.state == "running" => c,
            _ => return Ok(()),
        };
        if self.rng.chance(20) {
            *self.crash.armed.lock().expect("crash lock") = Some(self.rng.below(8) as u32);
        }
        let out = self.scheduler.pass(self.e(), &c);
        *self.crash.armed.lock().expect("crash lock") = None;
        if self.crash.fired.swap(false, Ordering::SeqCst) {
            self.report.crashes_in_pass += 1;
            self.note(format!("a crash cut the pass ({out:?})"));
            return self.restart();
        }
        match out {
            Ok(()) => self.note("pass".into()),
            // a pass that meets a busy room or a lapsed wait tries again next time, as the
            // daemon's does; anything else is a broken floor
            Err(r)
                if matches!(
                    r.code,
                    Code::RoomSyncRequired | Code::RoomSyncConcurrentArrival
                ) =>
            {
                self.note(format!("pass: {r}"));
            }
            Err(r) => return Err(self.fail(format!("the scheduler's pass failed: {r}"))),
        }
        Ok(())
    }

    /// The orchestrator's child (played by the simulator) steers with its tools: it reads the
    /// collaboration's status and dispatches one ready phase (by name, or by its role's
    /// purpose), or closes once every phase is done. Nothing is dispatched but by it.
    fn orchestrate(&mut self) -> Result<(), Failure> {
        let Some(i) = self.children.iter().position(|c| c.role == "orchestrator") else {
            return Ok(());
        };
        let me = self.caller(i);
        let status = match room_collab::steer::status(self.e(), &me, &self.id) {
            Ok(v) => v,
            Err(r) => {
                self.refused(&r);
                return Ok(());
            }
        };
        if status["all_done"] == true {
            match room_collab::steer::close(self.e(), &me, &self.id, &inline()) {
                Ok(_) => self.note("the orchestrator closes".into()),
                Err(r) => self.refused(&r),
            }
            return Ok(());
        }
        let ready: Vec<String> = status["ready"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str().map(String::from))
            .collect();
        let Some(phase) = ready.first().cloned() else {
            // a phase not ready is refused phase_not_ready, changing nothing
            let before = self.journal_len()?;
            let name = self.pack().phases[0].name.clone();
            let runs = self.runs()?.len();
            if let Err(r) = room_collab::steer::dispatch(
                self.e(),
                &me,
                &self.id,
                Some(&name),
                None,
                false,
                &inline(),
            ) {
                self.refused(&r);
                if r.code == Code::PhaseNotReady
                    && (self.journal_len()? != before || self.runs()?.len() != runs)
                {
                    return Err(self.fail(format!(
                        "a dispatch refused phase_not_ready changed something: {r}"
                    )));
                }
            }
            return Ok(());
        };
        match room_collab::steer::dispatch(
            self.e(),
            &me,
            &self.id,
            Some(&phase),
            None,
            false,
            &inline(),
        ) {
            Ok(v) => {
                self.report.steered_dispatches += 1;
                if let Some(run) = v["run"].as_u64() {
                    self.steered.insert((phase.clone(), run as u32));
                }
                self.note(format!(
                    "the orchestrator dispatches {phase}: {}",
                    v["state"]
                ));
            }
            Err(r) => self.refused(&r),
        }
        Ok(())
    }

    /// Read the room through, confirming every page, as `i`.
    fn catch_up(&self, i: usize) -> Result<(), Refusal> {
        let me = self.caller(i);
        let mut confirm: Option<String> = None;
        for _ in 0..64 {
            let page = self.e().sync(&me, &self.id, confirm.as_deref())?;
            let empty = page["items"].as_array().is_none_or(|a| a.is_empty());
            if confirm.is_some() && empty && page["more"] != true {
                return Ok(());
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
        Ok(())
    }

    /// `f` as `i`, read through once when the room moved on.
    fn gated(
        &self,
        i: usize,
        f: impl Fn(&AgentCaller) -> Result<Value, Refusal>,
    ) -> Result<Value, Refusal> {
        self.catch_up(i)?;
        let me = self.caller(i);
        match f(&me) {
            Err(r) if r.code == Code::RoomSyncRequired => {
                self.catch_up(i)?;
                f(&me)
            }
            other => other,
        }
    }

    /// The child that runs `run`: its phase's role, its seat, or the planner of its phase.
    fn child_of(&self, run: &CollabRunRow) -> Option<usize> {
        let role = match run.phase.split_once('@') {
            Some(("plan", phase)) => self.pack().phase(phase)?.role.clone()?,
            Some(("judge", phase)) => self.pack().phase(phase)?.judge.clone()?,
            Some((_, seat)) => seat.trim_end_matches(".debate").to_string(),
            None => {
                let p = self.pack().phase(&run.phase)?;
                (p.kind == PhaseKind::Agent).then(|| p.role.clone())??
            }
        };
        self.children.iter().position(|c| c.role == role)
    }

    /// A role acts on one of its running tasks: does it (claims, writes what its acceptance
    /// names, closes it), declines it, or leaves it.
    fn role_acts(&mut self) -> Result<(), Failure> {
        let runs = self.runs()?;
        let open: Vec<(usize, String)> = runs
            .iter()
            .filter(|r| r.state == "running")
            .filter_map(|r| Some((self.child_of(r)?, r.task.clone()?)))
            .collect();
        if open.is_empty() {
            return Ok(());
        }
        let (i, task) = open[self.rng.below(open.len() as u64) as usize].clone();
        let roll = self.rng.below(100);
        if roll >= 90 {
            self.note(format!("{} leaves {task}", self.children[i].agent));
            return Ok(());
        }
        let shown = match self.e().task_show(&self.caller(i), &task) {
            Ok(t) => t,
            Err(r) => {
                self.refused(&r);
                return Ok(());
            }
        };
        let status = shown["task"]["status"].as_str().unwrap_or("").to_string();
        if !matches!(status.as_str(), "open" | "claimed") {
            return Ok(());
        }
        if roll >= 80 {
            let out = self.gated(i, |me| {
                self.e().turn(
                    me,
                    Verb::Decline,
                    TurnArgs {
                        room: self.id.clone(),
                        task: Some(task.clone()),
                        text: Some("declined by the simulation".into()),
                        ..TurnArgs::default()
                    },
                )
            });
            match out {
                Ok(_) => {
                    self.report.declined += 1;
                    self.note(format!("{} declines {task}", self.children[i].agent));
                }
                Err(r) => self.refused(&r),
            }
            return Ok(());
        }
        if status == "open"
            && let Err(r) = self.e().task_claim(&self.caller(i), &task, None)
        {
            self.refused(&r);
            return Ok(());
        }
        for check in shown["task"]["acceptance"].as_array().into_iter().flatten() {
            if check["kind"] != "artifact" {
                continue;
            }
            let kind = check["artifact"].as_str().unwrap_or_default().to_string();
            let key = check["key"].as_str().map(String::from);
            self.write(i, &kind, key.as_deref(), Some(&task))?;
        }
        let out = self.gated(i, |me| {
            self.e().turn(
                me,
                Verb::Done,
                TurnArgs {
                    room: self.id.clone(),
                    task: Some(task.clone()),
                    ..TurnArgs::default()
                },
            )
        });
        match out {
            Ok(_) => {
                self.report.tasks_done += 1;
                self.note(format!("{} closes {task}", self.children[i].agent));
            }
            Err(r) => self.refused(&r),
        }
        Ok(())
    }

    /// `i` writes the next version of `kind` (under `key`), checked against the fence the
    /// oracle expects.
    fn write(
        &mut self,
        i: usize,
        kind: &str,
        key: Option<&str>,
        task: Option<&str>,
    ) -> Result<bool, Failure> {
        let allowed = self.children[i]
            .scopes
            .contains(&format!("artifact:write:{kind}"));
        let newest = self
            .e()
            .artifact_index_owner(&self.owner(), &self.id, None, 256)
            .ok()
            .and_then(|v| {
                v["artifacts"].as_array().and_then(|a| {
                    a.iter()
                        .find(|x| x["kind"] == kind && x["key"] == key.unwrap_or("main"))
                        .and_then(|x| x["version"].as_u64())
                })
            })
            .unwrap_or(0);
        let body = content(kind, &mut self.rng);
        let before = self.journal_len()?;
        let out = self.gated(i, |me| {
            self.e().turn(
                me,
                Verb::Note,
                TurnArgs {
                    room: self.id.clone(),
                    task: task.map(String::from),
                    artifact: Some(room_engine::blackboard::ArtifactDraft {
                        kind: kind.to_string(),
                        key: key.map(String::from),
                        content: body.clone(),
                        expected_version: newest as u32,
                    }),
                    ..TurnArgs::default()
                },
            )
        });
        let agent = self.children[i].agent.clone();
        match out {
            Ok(_) if !allowed => Err(self.fail(format!(
                "{agent} wrote {kind} although its scopes do not allow it"
            ))),
            Ok(_) => {
                self.note(format!("{agent} writes {kind}@{}", key.unwrap_or("main")));
                Ok(true)
            }
            Err(r) if r.code == Code::ArtifactWriteDenied && allowed && key.is_none() => Err(self
                .fail(format!(
                    "{agent}'s write of {kind} was refused although its scopes allow it: {r}"
                ))),
            Err(r) => {
                self.refused(&r);
                // a refusal changes nothing; a read-through before it may have confirmed
                // pages, which is no event
                if r.code == Code::ArtifactWriteDenied && self.journal_len()? != before {
                    return Err(self.fail(format!("the refused write of {kind} by {agent} wrote")));
                }
                Ok(false)
            }
        }
    }

    fn journal_len(&self) -> Result<u64, Failure> {
        self.e()
            .room_log(&self.owner(), &self.id, 1, 1)
            .map(|v| v["tip_seq"].as_u64().unwrap_or(0))
            .map_err(|r| self.fail(format!("room_log: {r}")))
    }

    /// A role tries what its scopes do not allow: a kind it may not write, or another
    /// reviewer's findings.
    fn fence(&mut self) -> Result<(), Failure> {
        if self.ended() {
            return Ok(());
        }
        let i = self.rng.below(self.children.len() as u64) as usize;
        let kinds = ["spec", "research", "adr", "diff", "findings"];
        let forbidden: Vec<&str> = kinds
            .iter()
            .copied()
            .filter(|k| {
                !self.children[i]
                    .scopes
                    .contains(&format!("artifact:write:{k}"))
            })
            .collect();
        if !forbidden.is_empty() && self.rng.chance(70) {
            let k = forbidden[self.rng.below(forbidden.len() as u64) as usize];
            self.report.fenced += 1;
            self.write(i, k, None, None)?;
            return Ok(());
        }
        // a reviewer reads another seat's findings: they do not exist for it
        let seats: Vec<usize> = (0..self.children.len())
            .filter(|&j| self.children[j].role.starts_with("review"))
            .collect();
        if seats.len() < 2 {
            return Ok(());
        }
        let a = seats[self.rng.below(seats.len() as u64) as usize];
        let b = seats[(seats.iter().position(|&s| s == a).unwrap_or(0) + 1) % seats.len()];
        let other = self.children[b].role.clone();
        let got = self
            .e()
            .artifact_get(&self.caller(a), &self.id, "findings", Some(&other), None);
        match got {
            Ok(v) => Err(self.fail(format!(
                "{} read {other}'s findings: {}",
                self.children[a].agent, v["version"]
            ))),
            Err(r) => {
                self.report.fenced += 1;
                self.refused(&r);
                Ok(())
            }
        }
    }

    /// The person decides a pending request: approves, rejects, or names a stale digest.
    fn decide(&mut self) -> Result<(), Failure> {
        let Ok((_, _, approvals)) = self.e().collab_show(&self.owner(), &self.id) else {
            return Ok(());
        };
        let pending: Vec<_> = approvals.iter().filter(|a| a.state == "pending").collect();
        if pending.is_empty() {
            return self.rerun();
        }
        let a = pending[self.rng.below(pending.len() as u64) as usize].clone();
        let roll = self.rng.below(100);
        if roll < 15 {
            let before = self.journal_len()?;
            match self.e().approval_decide(
                &self.owner(),
                &a.id,
                "0".repeat(64).as_str(),
                Verdict::Approve,
            ) {
                Err(r) if r.code == Code::ApprovalStale => {
                    self.report.stale_decisions += 1;
                    let still = self
                        .e()
                        .collab_show(&self.owner(), &self.id)
                        .map(|(_, _, q)| q.iter().any(|x| x.id == a.id && x.state == "pending"))
                        .unwrap_or(false);
                    if !still || self.journal_len()? != before {
                        return Err(
                            self.fail(format!("a stale decision on {} changed something", a.id))
                        );
                    }
                    return Ok(());
                }
                other => {
                    return Err(self.fail(format!(
                        "a decision naming another digest was not refused approval_stale: {other:?}"
                    )));
                }
            }
        }
        let verdict = if roll < 85 {
            Verdict::Approve
        } else {
            Verdict::Reject
        };
        let approve = matches!(verdict, Verdict::Approve);
        match self
            .e()
            .approval_decide(&self.owner(), &a.id, &a.digest, verdict)
        {
            Ok(_) => {
                self.report.decisions += 1;
                self.note(format!(
                    "the person {} {} ({})",
                    if approve { "approves" } else { "rejects" },
                    a.id,
                    a.phase
                ));
                if approve && let Some(phase) = a.phase.strip_prefix("plan@") {
                    self.planned.insert(phase.to_string());
                }
            }
            Err(r) => self.refused(&r),
        }
        Ok(())
    }

    /// With nothing to decide, the person sometimes reruns a phase that failed or was
    /// rejected (the phase's newest run).
    fn rerun(&mut self) -> Result<(), Failure> {
        if !self.rng.chance(40) {
            return Ok(());
        }
        let runs = self.runs()?;
        let stuck: Vec<String> = self
            .pack()
            .phases
            .iter()
            .filter(|p| {
                runs.iter()
                    .filter(|r| r.phase == p.name)
                    .max_by_key(|r| r.run)
                    .is_some_and(|r| {
                        matches!(
                            r.state.as_str(),
                            "failed" | "rejected" | "fix_loop_exhausted"
                        )
                    })
            })
            .map(|p| p.name.clone())
            .collect();
        if stuck.is_empty() {
            return Ok(());
        }
        let phase = stuck[self.rng.below(stuck.len() as u64) as usize].clone();
        match self.e().collab_rerun(&self.owner(), &self.id, &phase) {
            Ok(_) => self.note(format!("the person reruns {phase}")),
            Err(r) => self.refused(&r),
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<(), Failure> {
        self.engine = None;
        self.open()
            .map_err(|e| self.fail(format!("restart: {e}")))?;
        self.report.restarts += 1;
        self.note("restart".into());
        Ok(())
    }

    /// The oracle's account after a step.
    fn check(&mut self) -> Result<(), Failure> {
        // a plan the person approved widens its child once the next pass has seen it: the
        // oracle's account follows what the person decided, not what the engine says
        let runs = self.runs()?;
        for phase in self.planned.clone() {
            let widened = runs
                .iter()
                .any(|r| r.phase == format!("plan@{phase}") && r.state == "approved");
            if widened
                && let Some(role) = self.pack().phase(&phase).and_then(|p| p.role.clone())
                && let Some(c) = self.children.iter_mut().find(|c| c.role == role)
            {
                let held = c.held.get(&phase).cloned().unwrap_or_default();
                c.scopes.extend(held);
            }
        }
        if self.report.agent_orchestrated {
            for r in &runs {
                let begun_by_pack = r.state == "rerun"
                    || serde_json::from_str::<Value>(&r.reads)
                        .is_ok_and(|v| v["fix_of"].is_string());
                if self.pack().phase(&r.phase).is_some()
                    && !begun_by_pack
                    && !self.steered.contains(&(r.phase.clone(), r.run))
                {
                    return Err(self.fail(format!(
                        "the scheduler began {}#{} itself, though an agent orchestrates",
                        r.phase, r.run
                    )));
                }
            }
        }
        let mut tasks: BTreeMap<&str, &CollabRunRow> = BTreeMap::new();
        for r in &runs {
            if let Some(t) = &r.task
                && !r.phase.starts_with("tell@")
                && let Some(other) = tasks.insert(t, r)
            {
                return Err(self.fail(format!(
                    "task {t} belongs to two runs: {}#{} and {}#{}",
                    other.phase, other.run, r.phase, r.run
                )));
            }
        }
        for p in self
            .pack()
            .phases
            .iter()
            .filter(|p| p.kind == PhaseKind::Panel)
        {
            for r in runs.iter().filter(|r| r.phase == p.name) {
                let joined = matches!(
                    r.state.as_str(),
                    "done" | "fixed" | "fix_loop_exhausted" | "failed"
                );
                if !joined {
                    continue;
                }
                if p.judge.is_some()
                    && r.state != "failed"
                    && runs.iter().any(|x| {
                        x.phase == format!("judge@{}", p.name)
                            && x.run == r.run
                            && matches!(x.state.as_str(), "dispatching" | "running")
                    })
                {
                    return Err(self.fail(format!(
                        "panel {}#{} is {} while its judge still runs",
                        p.name, r.run, r.state
                    )));
                }
                for seat in p.seats() {
                    let s = runs
                        .iter()
                        .find(|x| x.phase == format!("{}@{seat}", p.name) && x.run == r.run);
                    match s.map(|s| s.state.as_str()) {
                        Some("dispatching" | "running") => {
                            return Err(self.fail(format!(
                                "panel {}#{} is {} while seat {seat} still runs",
                                p.name, r.run, r.state
                            )));
                        }
                        None if !matches!(r.state.as_str(), "fix_loop_exhausted" | "failed") => {
                            return Err(self.fail(format!(
                                "panel {}#{} joined without seat {seat} in its record",
                                p.name, r.run
                            )));
                        }
                        _ => {}
                    }
                }
            }
            let mut newest_first: Vec<&CollabRunRow> =
                runs.iter().filter(|r| r.phase == p.name).collect();
            newest_first.sort_by_key(|r| std::cmp::Reverse(r.run));
            let in_a_row = newest_first
                .iter()
                .skip_while(|r| r.state != "fixed")
                .take_while(|r| r.state == "fixed")
                .count() as u32;
            if in_a_row > p.fix_loops_max.unwrap_or(0) {
                return Err(self.fail(format!(
                    "panel {} looped {in_a_row} times, past its fix_loops_max of {}",
                    p.name,
                    p.fix_loops_max.unwrap_or(0)
                )));
            }
        }
        Ok(())
    }

    /// The end: counts, every orchestrator task one run's, a finished collaboration's
    /// credentials refused, every chain verified.
    fn finish(&mut self) -> Result<(), Failure> {
        let (c, runs, _) = self
            .e()
            .collab_show(&self.owner(), &self.id)
            .map_err(|r| self.fail(r.to_string()))?;
        self.report.state = c.state.clone();
        self.report.wakes_told = runs
            .iter()
            .filter(|r| r.phase == room_collab::steer::TELL)
            .count() as u64;
        self.report.retells = runs
            .iter()
            .filter(|r| {
                r.phase == room_collab::steer::TELL
                    && serde_json::from_str::<Value>(&r.reads)
                        .is_ok_and(|v| v["retell"].as_u64().is_some_and(|n| n > 0))
            })
            .count() as u64;
        self.report.fixes = runs.iter().filter(|r| r.state == "fixed").count() as u64;
        self.report.timed_out = runs.iter().filter(|r| r.state == "timed_out").count() as u64;
        self.report.judged = runs
            .iter()
            .filter(|r| r.phase.starts_with("judge@") && r.state == "done")
            .count() as u64;
        self.report.panels_joined = runs
            .iter()
            .filter(|r| {
                self.pack()
                    .phase(&r.phase)
                    .is_some_and(|p| p.kind == PhaseKind::Panel)
                    && matches!(r.state.as_str(), "done" | "fixed" | "fix_loop_exhausted")
            })
            .count() as u64;
        let owned: BTreeSet<String> = runs.iter().filter_map(|r| r.task.clone()).collect();
        let spec: Value = serde_json::from_str(&c.spec).unwrap_or(Value::Null);
        let goal = spec["goal_task"].as_str().unwrap_or_default().to_string();
        let mut from = 1;
        loop {
            let log = self
                .e()
                .room_log(&self.owner(), &self.id, from, 1000)
                .map_err(|r| self.fail(r.to_string()))?;
            let events = log["events"].as_array().cloned().unwrap_or_default();
            for e in &events {
                let ev = &e["event"];
                if e["kind"] == "task"
                    && ev["action"] == "created"
                    && ev["actor"] == c.orchestrator.as_str()
                    && let Some(t) = ev["task"].as_str()
                    && t != goal
                    && !owned.contains(t)
                {
                    return Err(self.fail(format!(
                        "the orchestrator made task {t}, which no run holds (a repeated dispatch?)"
                    )));
                }
            }
            if events.len() < 1000 {
                break;
            }
            from += 1000;
        }
        if c.state != "running" {
            for i in 0..self.children.len() {
                match self.e().sync(&self.caller(i), &self.id, None) {
                    Err(r) if matches!(r.code, Code::CredentialRevoked) => {}
                    other => {
                        return Err(self.fail(format!(
                            "{} still acts after its collaboration ended: {other:?}",
                            self.children[i].agent
                        )));
                    }
                }
            }
        }
        let rooms = self.state.join("rooms");
        let shards = room_store::shard::on_disk(&rooms).map_err(|e| self.fail(e.to_string()))?;
        for (shard, m) in shards {
            if let Err(e) = room_store::journal::verify(&shard.journal(), &m.graph_id) {
                return Err(self.fail(format!("chain of {} does not verify: {e}", m.room)));
            }
        }
        Ok(())
    }
}
