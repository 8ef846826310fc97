//! The scheduler (DESIGN.md §7, issues 41 and 42): one pass over a running collaboration,
//! acting as its orchestrator (the delegated root holding `session:read` and
//! `session:dispatch`) with a credential the engine mints from the record, through the same
//! engine calls an agent makes. Deterministic and synchronous: the daemon's loop drives it
//! every tick, and the simulator drives it under its seed; authority is the engine's.
//!
//! A pass settles each run (a task done is a run done; cancelled or declined, failed; an
//! approval decided starts or ends its run), answers the roles' questions, moves plans on,
//! then asks `schedule::ready` which phases may run, from the blackboard's versions and the
//! recorded runs (both durable: a restart asks again and gets the same answer). An `agent`
//! phase is a task addressed to its role's child, whose acceptance is that its writes exist,
//! delivered by a `send` (a sealed wake to the child's route); a `gate` phase is a task the
//! orchestrator claims and closes, its commands run as `command` acceptance (in the gate's
//! working tree, which the host makes, measured away from the pass: `Host`); a `panel` fans out to one seat run per
//! reviewer and joins at a barrier (an optional debate round first), its blocking findings
//! going back to the implementer until the loop cap; an `approval` phase, and a phase the pack
//! marks `approve`, waits in the approval queue bound to the digest of what it shows. With
//! the pack's orchestrator role bound, the pass dispatches nothing and tells the agent what is
//! new instead (`steer`). When every phase is done, the goal task closes and the
//! collaboration finishes (its identities revoked).

use crate::pack::{Pack, PhaseKind};
use crate::profile::Profile;
use crate::schedule::{self, PhaseRun};
use crate::steer;
use crate::{ArtifactKind, Phase};
use room_core::{Code, Refusal, Verb};
use room_engine::Engine;
use room_engine::collab::WorkTrees;
use room_engine::principal::AgentCaller;
use room_engine::verbs::{TaskCreateArgs, TurnArgs};
use room_store::control::{ApprovalRow, CollabRow, CollabRunRow};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// The conversation the scheduler acts in as each orchestrator.
const CONVERSATION: &str = "collab-scheduler";
/// The conversation a gate's measurement acts in (beside the passes).
const GATE_CONVERSATION: &str = "collab-gate";
/// Pages the scheduler reads to catch up before it acts (a room it cannot catch up with in
/// this many is left for the next pass).
const CATCH_UP_PAGES_MAX: usize = 64;

/// A job the host runs away from the scheduler's pass (a gate's commands: long, and no pass
/// of any collaboration waits for them).
pub type Job = Box<dyn FnOnce(&Engine) + Send + 'static>;

/// What the scheduler needs of its host (the daemon's: `room_exec::tree` and a thread per
/// gate; the simulator's: no trees, jobs run inline): the gate's working tree made afresh
/// before a gate measures it, every tree removed when the collaboration finishes, and a job
/// run in the background.
pub trait Host: Send + Sync {
    /// The gate's tree of `c`: the base of `trees` with `patch` applied (empty: the base).
    fn gate_tree(
        &self,
        engine: &Engine,
        c: &CollabRow,
        trees: &WorkTrees,
        patch: &str,
    ) -> Result<(), String>;
    /// Every tree of collaboration `id` (it finished).
    fn remove(&self, engine: &Engine, id: &str);
    /// Run `job` away from the pass (on `engine`, or the host's own handle on it).
    fn spawn(&self, engine: &Engine, job: Job) {
        job(engine)
    }
    /// Whether this host measures gates (`spawn`); one that does not (a tool call's) leaves
    /// a gate it begins to the next pass.
    fn measures_gates(&self) -> bool {
        true
    }
    /// A send that wakes a child was committed: a host whose workers start when it is told
    /// of a change starts that child now, not once the whole pass has ended (a panel's first
    /// reviewer works while the others are dispatched).
    fn sent(&self) {}
}

/// A host without working trees that runs every job inline (a simulation's: deterministic).
pub struct InlineHost;

impl Host for InlineHost {
    fn gate_tree(&self, _: &Engine, _: &CollabRow, _: &WorkTrees, _: &str) -> Result<(), String> {
        Err("this host keeps no working trees".into())
    }
    fn remove(&self, _: &Engine, _: &str) {}
}

/// The collaborations with a gate being measured in the background: a pass leaves their
/// gates alone while the job runs (a restart forgets them, and measures again).
fn gates_measuring() -> &'static Mutex<std::collections::HashSet<String>> {
    static GATES: std::sync::LazyLock<Mutex<std::collections::HashSet<String>>> =
        std::sync::LazyLock::new(Default::default);
    &GATES
}

/// A collaboration's key in `gates_measuring`, given back when dropped: when its job ends,
/// panics, or never starts (a host that drops the job).
struct Measuring(String);

impl Drop for Measuring {
    fn drop(&mut self) {
        gates_measuring()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// What a collaboration runs, as its record keeps it.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Spec {
    pub pack: String,
    pub prompts: BTreeMap<String, String>,
    pub roles: Vec<String>,
    /// The child of each role.
    pub agents: BTreeMap<String, String>,
    pub goal_task: String,
    /// The start's money ceiling (over the pack's).
    #[serde(default)]
    pub usd_max: Option<f64>,
    /// Per child and planned phase, the write scopes held back until the person approves that
    /// phase's plan (`plan = true`); the engine reads them from the record when it is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_scopes: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

/// The pack with its roles bound (`Pack::bind_roles`: a panel's role once per reviewer).
pub fn load(pack_text: &str, roles: &[String]) -> Result<Pack, Refusal> {
    let mut pack = Pack::load(pack_text, &Profile::default())?;
    pack.bind_roles("roles", roles)?;
    pack.keep_used_roles();
    Ok(pack)
}

/// The kind a child's plan is written as (keyed by its phase's name).
pub const PLAN_KIND: &str = "extra/plan";

/// The kind a panel's judge writes its synthesis as (keyed by the panel's name).
pub const SYNTHESIS_KIND: &str = "extra/synthesis";

/// The scheduler's caller for `token`, in its own conversation.
pub fn caller(token: String) -> AgentCaller {
    AgentCaller {
        token,
        conversation: CONVERSATION.into(),
        declared_tier: None,
        page_bytes_max: None,
    }
}

/// A task title from `text`: its first line, cut to the title bound on a character boundary.
pub fn title(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let max = room_engine::verbs::TITLE_BYTES_MAX;
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max - 3;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &line[..end])
}

/// The guards as the person reads them: runs in flight against the cap, the money ceiling,
/// and what holds each role's next dispatch (`hold`), if anything.
pub fn guards_view(pack: &Pack, spec: &Spec, runs: &[CollabRunRow], cost: &Value) -> Value {
    let holds: Vec<Value> = pack
        .profile
        .roles
        .iter()
        .filter_map(|r| {
            let agent = spec.agents.get(&r.name).cloned().unwrap_or_default();
            let (kind, refusal) = match hold(pack, spec.usd_max, runs, cost, &r.name, &agent)? {
                Hold::Wait(x) => ("wait", x),
                Hold::Blocked(x) => ("blocked", x),
            };
            Some(json!({"role": r.name, "agent": agent, "hold": kind, "refusal": refusal}))
        })
        .collect();
    json!({"live_workers": live(pack, runs), "live_workers_max": pack.guards.live_workers_max,
        "usd_max": spec.usd_max.or(pack.guards.usd_max), "holds": holds})
}

/// A run as a person or an agent reads it.
pub fn run_view(r: &CollabRunRow) -> Value {
    json!({"phase": r.phase, "run": r.run, "task": r.task, "state": r.state,
        "reads": serde_json::from_str::<Value>(&r.reads).unwrap_or(Value::Null),
        "started_ms": r.started_ms, "ended_ms": r.ended_ms})
}

/// The scheduler's credentials, one per running collaboration it drives (minted afresh from
/// each collaboration's record the first time a daemon drives it; never written anywhere).
pub struct Scheduler {
    tokens: Mutex<HashMap<String, String>>,
    host: std::sync::Arc<dyn Host>,
}

impl Scheduler {
    /// A scheduler on `host`.
    pub fn new(host: std::sync::Arc<dyn Host>) -> Scheduler {
        Scheduler {
            tokens: Mutex::default(),
            host,
        }
    }

    /// One pass over every running collaboration. A collaboration whose pass fails is left
    /// for the next (logged); the others go on.
    pub fn tick(&self, engine: &Engine) {
        let running = match engine.collabs_running() {
            Ok(r) => r,
            Err(r) => {
                tracing::error!("collaborations unreadable: {r}");
                return;
            }
        };
        for c in running {
            if let Err(r) = self.pass(engine, &c) {
                tracing::warn!(collab = %c.id, "collaboration pass: {r}");
                // a credential the engine no longer takes is minted again next time
                if matches!(r.code, Code::CredentialInvalid | Code::CredentialRevoked) {
                    self.tokens.lock().expect("tokens lock").remove(&c.id);
                }
            }
        }
    }

    fn token(&self, engine: &Engine, id: &str) -> Result<String, Refusal> {
        let mut tokens = self.tokens.lock().expect("tokens lock");
        if let Some(t) = tokens.get(id) {
            return Ok(t.clone());
        }
        let t = engine.collab_orchestrator_token(id)?;
        tokens.insert(id.to_string(), t.clone());
        Ok(t)
    }

    /// One pass over one running collaboration (what `tick` does for each).
    pub fn pass(&self, engine: &Engine, c: &CollabRow) -> Result<(), Refusal> {
        let lock = steer::lock(&c.id);
        // the lock guards no data: a pass that panicked leaves nothing half-held
        let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
        let spec: Spec = serde_json::from_str(&c.spec)
            .map_err(|e| Refusal::storage(format!("collaboration {}: its spec: {e}", c.id)))?;
        let pack = load(&spec.pack, &spec.roles)?;
        let me = caller(self.token(engine, &c.id)?);
        let cx = Cx {
            engine,
            me: &me,
            c,
            spec: &spec,
            pack: &pack,
            host: &self.host,
        };
        let versions = cx.versions()?;
        let mut runs = engine.collab_runs(&me, &c.id)?;
        cx.settle(&mut runs, &versions)?;
        cx.answer_asks(&mut runs)?;
        cx.advance_plans(&runs)?;
        let mut runs = engine.collab_runs(&me, &c.id)?;
        let ready = cx.ready(&runs, &versions);
        // an agent orchestrates: it is told what changed, and it dispatches and closes
        if pack.agent_orchestrated() {
            return cx.tell(&ready, &runs);
        }
        for name in &ready {
            let phase = pack.phase(name).expect("ready names phases of the pack");
            let run = runs
                .iter()
                .filter(|r| r.phase == *name)
                .map(|r| r.run)
                .max()
                .unwrap_or(0)
                + 1;
            let row = cx.begin(phase, run, &versions)?;
            runs.push(row);
        }
        if all_done(&pack, &runs) {
            cx.finish()?;
        }
        Ok(())
    }
}

/// Whether every phase's newest run is done.
pub fn all_done(pack: &Pack, runs: &[CollabRunRow]) -> bool {
    pack.phases.iter().all(|p| {
        runs.iter()
            .filter(|r| r.phase == p.name)
            .max_by_key(|r| r.run)
            .is_some_and(|r| r.state == "done")
    })
}

/// Each phase's runs, as the schedule reads them: running while its newest run waits or runs,
/// completed while its newest run is done, and what its newest run read.
fn phase_runs(runs: &[CollabRunRow]) -> BTreeMap<String, PhaseRun> {
    let mut out: BTreeMap<String, PhaseRun> = BTreeMap::new();
    let mut newest: BTreeMap<&str, &CollabRunRow> = BTreeMap::new();
    for r in runs {
        out.entry(r.phase.clone()).or_default();
        if newest.get(r.phase.as_str()).is_none_or(|n| r.run > n.run) {
            newest.insert(&r.phase, r);
        }
    }
    for (phase, r) in newest {
        let e = out
            .get_mut(phase)
            .expect("every phase with runs has an entry");
        e.running = matches!(r.state.as_str(), "approval" | "dispatching" | "running");
        // a rerun or a failure leaves the phase to run again; a run done completes it
        e.completed = r.state == "done";
        e.read_versions = reads_of(r);
    }
    out
}

/// The versions a run read (its `reads` object's numbers; a fix run also carries its `fix`
/// text there).
fn reads_of(r: &CollabRunRow) -> BTreeMap<ArtifactKind, u64> {
    let v: BTreeMap<String, Value> = serde_json::from_str(&r.reads).unwrap_or_default();
    v.into_iter()
        .filter_map(|(k, n)| {
            let n = n.as_u64()?;
            ArtifactKind::parse("reads", &k).ok().map(|k| (k, n))
        })
        .collect()
}

/// A fix run's instructions: the blocking findings it was sent back with.
fn fix_text(r: &CollabRunRow) -> Option<String> {
    let v: Value = serde_json::from_str(&r.reads).ok()?;
    v["fix"].as_str().map(String::from)
}

/// One pass over one collaboration, acting as its orchestrator.
pub(crate) struct Cx<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) me: &'a AgentCaller,
    pub(crate) c: &'a CollabRow,
    pub(crate) spec: &'a Spec,
    pub(crate) pack: &'a Pack,
    pub(crate) host: &'a std::sync::Arc<dyn Host>,
}

impl Cx<'_> {
    /// The blackboard as the schedule reads it: per kind, the sum of the versions of its keys
    /// (it grows with every write of the kind).
    pub(crate) fn versions(&self) -> Result<BTreeMap<ArtifactKind, u64>, Refusal> {
        let mut out: BTreeMap<ArtifactKind, u64> = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.engine.artifact_index(
                self.me,
                &self.c.room,
                after.as_deref(),
                room_engine::blackboard::INDEX_PAGE_MAX,
            )?;
            for a in page["artifacts"].as_array().into_iter().flatten() {
                if let Some(k) = a["kind"]
                    .as_str()
                    .and_then(|k| ArtifactKind::parse("kind", k).ok())
                {
                    *out.entry(k).or_default() += a["version"].as_u64().unwrap_or(0);
                }
            }
            match page["next_after"].as_str() {
                Some(n) => after = Some(n.to_string()),
                None => return Ok(out),
            }
        }
    }

    pub(crate) fn reads_json(
        &self,
        phase: &Phase,
        versions: &BTreeMap<ArtifactKind, u64>,
    ) -> String {
        let m: BTreeMap<String, u64> = phase
            .reads
            .iter()
            .map(|k| (k.to_string(), versions.get(k).copied().unwrap_or(0)))
            .collect();
        serde_json::to_string(&m).expect("a map serializes")
    }

    /// A phase whose newest run failed on exactly the inputs there are now waits for new
    /// ones (part 2's fix loop brings them; until then the person reruns it).
    pub(crate) fn failed_on_these_inputs(
        &self,
        phase: &Phase,
        runs: &[CollabRunRow],
        versions: &BTreeMap<ArtifactKind, u64>,
    ) -> bool {
        runs.iter()
            .filter(|r| r.phase == phase.name)
            .max_by_key(|r| r.run)
            .is_some_and(|r| {
                matches!(
                    r.state.as_str(),
                    "failed" | "rejected" | "fixed" | "fix_loop_exhausted"
                ) && r.reads == self.reads_json(phase, versions)
            })
    }

    /// The phases ready for their next run now (`schedule::ready`), less those whose newest
    /// run failed on exactly these inputs.
    pub(crate) fn ready(
        &self,
        runs: &[CollabRunRow],
        versions: &BTreeMap<ArtifactKind, u64>,
    ) -> Vec<String> {
        let by_phase = phase_runs(runs);
        schedule::ready(self.pack, versions, &by_phase)
            .into_iter()
            .filter(|name| {
                let phase = self
                    .pack
                    .phase(name)
                    .expect("ready names phases of the pack");
                !self.failed_on_these_inputs(phase, runs, versions)
            })
            .map(String::from)
            .collect()
    }

    /// Start a run of `phase` in the approval queue, whatever the pack says of it.
    pub(crate) fn begin_approval(
        &self,
        phase: &Phase,
        run: u32,
        versions: &BTreeMap<ArtifactKind, u64>,
    ) -> Result<CollabRunRow, Refusal> {
        let row = CollabRunRow {
            collab: self.c.id.clone(),
            phase: phase.name.clone(),
            run,
            task: None,
            state: "approval".into(),
            reads: self.reads_json(phase, versions),
            started_ms: self.engine.now_ms(),
            ended_ms: None,
        };
        self.put(&row)?;
        self.engine
            .approval_request(self.me, &self.c.id, &phase.name, run, &self.input(phase)?)?;
        Ok(row)
    }

    pub(crate) fn put(&self, row: &CollabRunRow) -> Result<(), Refusal> {
        self.engine.collab_run_put(self.me, row.clone())
    }

    /// Start a run of `phase`: into the approval queue, or dispatched.
    pub(crate) fn begin(
        &self,
        phase: &Phase,
        run: u32,
        versions: &BTreeMap<ArtifactKind, u64>,
    ) -> Result<CollabRunRow, Refusal> {
        let mut row = CollabRunRow {
            collab: self.c.id.clone(),
            phase: phase.name.clone(),
            run,
            task: None,
            state: "approval".into(),
            reads: self.reads_json(phase, versions),
            started_ms: self.engine.now_ms(),
            ended_ms: None,
        };
        if phase.plan
            && let Some(plan) = self.plan(phase)?
        {
            return Ok(plan);
        }
        if phase.kind == PhaseKind::Approval || phase.approve {
            return self.begin_approval(phase, run, versions);
        }
        self.dispatch(phase, &mut row, None)?;
        Ok(row)
    }

    /// A phase with `plan = true`: its child first writes its plan (`extra/plan`, keyed by
    /// the phase) on a task of its own (the run `plan@PHASE`); the person approves it, bound
    /// to its digest like any approval; only then does the engine give the child the write
    /// scopes its record held back (`Engine::collab_plan_approved`). Each call moves the
    /// newest plan run on by one step. None: the plan is approved and the phase may run;
    /// else the plan's run, which the phase waits on. A rejected or failed plan waits for
    /// the person (a rerun of the phase starts a new plan).
    pub(crate) fn plan(&self, phase: &Phase) -> Result<Option<CollabRunRow>, Refusal> {
        let name = format!("plan@{}", phase.name);
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let newest = runs
            .iter()
            .filter(|r| r.phase == name)
            .max_by_key(|r| r.run)
            .cloned();
        let fresh = |run: u32| CollabRunRow {
            collab: self.c.id.clone(),
            phase: name.clone(),
            run,
            task: None,
            state: "dispatching".into(),
            reads: "{}".into(),
            started_ms: self.engine.now_ms(),
            ended_ms: None,
        };
        let mut row = match newest {
            Some(r) if r.state == "approved" => return Ok(None),
            Some(r) if matches!(r.state.as_str(), "failed" | "rejected") => {
                let rerun = runs.iter().any(|x| {
                    x.phase == phase.name
                        && x.state == "rerun"
                        && x.started_ms >= r.ended_ms.unwrap_or(u64::MAX)
                });
                if !rerun {
                    return Ok(Some(r));
                }
                fresh(r.run + 1)
            }
            Some(r) => r,
            None => fresh(1),
        };
        let role = phase
            .role
            .as_deref()
            .expect("an agent phase names its role (checked at load)");
        let agent = self.spec.agents.get(role).cloned().unwrap_or_default();
        match row.state.as_str() {
            // a plan is a run of its child like any other: the guards hold it back too
            "dispatching" if row.task.is_none() && self.held(role)?.is_some() => {
                self.put(&row)?;
            }
            "dispatching" => {
                let task = self.plan_task(phase, &agent, &mut row)?;
                let text = format!(
                    "Plan before you write: write your plan for phase {} as the artifact {PLAN_KIND} with key {} \
(artifact_put kind {PLAN_KIND}, key {}, task {task}; any JSON object: the steps, the files you will touch, the risks), then done. \
The person approves it before you may write {}; until then you cannot.\n\nGoal: {}",
                    phase.name,
                    phase.name,
                    phase.name,
                    kinds_list(&phase.writes),
                    self.c.goal
                );
                self.send_once(&row, &agent, &task, &text)?;
                row.state = "running".into();
                self.put(&row)?;
            }
            "running" => {
                let Some(task) = row.task.clone() else {
                    return Ok(Some(row));
                };
                match self.engine.task_show(self.me, &task)?["task"]["status"].as_str() {
                    Some("done") => {
                        row.state = "approval".into();
                        self.put(&row)?;
                        self.engine.approval_request(
                            self.me,
                            &self.c.id,
                            &name,
                            row.run,
                            &self.plan_input(phase, &agent)?,
                        )?;
                    }
                    Some("cancelled" | "declined" | "superseded") => {
                        row.state = "failed".into();
                        row.ended_ms = Some(self.engine.now_ms());
                        self.put(&row)?;
                    }
                    _ => {}
                }
            }
            "approval" => {
                let approvals = self.engine.collab_approvals(self.me, &self.c.id)?;
                let newest = approvals
                    .iter()
                    .filter(|a| a.phase == name && a.run == row.run)
                    .max_by_key(|a| a.created_ms);
                match newest.map(|a| a.state.as_str()) {
                    Some("approved") => {
                        self.engine.collab_plan_approved(
                            self.me,
                            &self.c.id,
                            &phase.name,
                            row.run,
                            &agent,
                        )?;
                        row.state = "approved".into();
                        row.ended_ms = Some(self.engine.now_ms());
                        self.put(&row)?;
                        return Ok(None);
                    }
                    Some("rejected") => {
                        row.state = "rejected".into();
                        row.ended_ms = Some(self.engine.now_ms());
                        self.put(&row)?;
                    }
                    // asked again with what it shows now: a plan written anew makes the
                    // pending request stale
                    _ => {
                        self.engine.approval_request(
                            self.me,
                            &self.c.id,
                            &name,
                            row.run,
                            &self.plan_input(phase, &agent)?,
                        )?;
                    }
                }
            }
            _ => {}
        }
        Ok(Some(row))
    }

    /// The plan run's task (made once: its idempotency key is the run's), its acceptance the
    /// plan artifact under the phase's key.
    pub(crate) fn plan_task(
        &self,
        phase: &Phase,
        agent: &str,
        row: &mut CollabRunRow,
    ) -> Result<String, Refusal> {
        let accept = json!({"kind": "artifact", "artifact": PLAN_KIND, "key": phase.name});
        let title = format!("plan of {}: {}", phase.name, self.c.goal);
        self.own_task(row, agent, &title, accept)
    }

    /// A run's own task for `agent` (made once: its idempotency key is the run's), its
    /// acceptance the one check given.
    pub(crate) fn own_task(
        &self,
        row: &mut CollabRunRow,
        agent: &str,
        what: &str,
        accept: Value,
    ) -> Result<String, Refusal> {
        if let Some(t) = &row.task {
            return Ok(t.clone());
        }
        self.put(row)?;
        let made = self.engine.task_create(
            self.me,
            TaskCreateArgs {
                room: self.c.room.clone(),
                title: title(what),
                to: Some(agent.to_string()),
                accept: vec![accept],
                idempotency_key: Some(format!(
                    "{}.{}.{}.task",
                    self.c.id,
                    row.phase.replace('@', ":"),
                    row.run
                )),
                ..TaskCreateArgs::default()
            },
        );
        let task = match made {
            Ok(t) => t["task"]["id"].as_str().map(String::from),
            Err(r) if is_repeat(&r) => r.detail["original_task"].as_str().map(String::from),
            Err(r) => return Err(r),
        }
        .ok_or_else(|| Refusal::storage(format!("{}: its task has no id", row.phase)))?;
        row.task = Some(task.clone());
        self.put(row)?;
        Ok(task)
    }

    /// A send to `agent` on `task`, once per run (its idempotency key is the run's).
    pub(crate) fn send_once(
        &self,
        row: &CollabRunRow,
        agent: &str,
        task: &str,
        text: &str,
    ) -> Result<(), Refusal> {
        let key = format!(
            "{}.{}.{}.send",
            self.c.id,
            row.phase.replace('@', ":"),
            row.run
        );
        let sent = self.act(|| {
            self.engine.turn(
                self.me,
                Verb::Send,
                TurnArgs {
                    room: self.c.room.clone(),
                    text: Some(text.to_string()),
                    to: vec![agent.to_string()],
                    task: Some(task.to_string()),
                    idempotency_key: Some(key.clone()),
                    ..TurnArgs::default()
                },
            )
        });
        match sent {
            Ok(_) => Ok(()),
            Err(r) if is_repeat(&r) => Ok(()),
            Err(r) => Err(r),
        }
    }

    /// What a plan's approval shows and binds: who plans which phase, the plan's version and
    /// digest (its content: `room collab show ID extra/plan/PHASE`), and the scopes
    /// an approval gives.
    pub(crate) fn plan_input(&self, phase: &Phase, agent: &str) -> Result<Value, Refusal> {
        let page = self.engine.artifact_index(
            self.me,
            &self.c.room,
            None,
            room_engine::blackboard::INDEX_PAGE_MAX,
        )?;
        let plan = page["artifacts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["kind"] == PLAN_KIND && a["key"] == phase.name.as_str())
            .map(|a| {
                json!({"kind": a["kind"], "key": a["key"], "version": a["version"],
                "sha256": a["sha256"], "producer": a["producer"]})
            });
        Ok(json!({
            "kind": "plan", "collab": self.c.id, "goal": self.c.goal, "phase": phase.name,
            "role": phase.role, "agent": agent, "plan": plan,
            "gives": self.spec.held_scopes.get(agent).and_then(|h| h.get(&phase.name)),
        }))
    }

    /// Every plan in progress moves on (a pass drives them whoever dispatched the phase).
    pub(crate) fn advance_plans(&self, runs: &[CollabRunRow]) -> Result<(), Refusal> {
        for phase in self.pack.phases.iter().filter(|p| p.plan) {
            let name = format!("plan@{}", phase.name);
            let moving = runs
                .iter()
                .filter(|r| r.phase == name)
                .max_by_key(|r| r.run)
                .is_some_and(|r| {
                    matches!(r.state.as_str(), "dispatching" | "running" | "approval")
                });
            if moving {
                self.plan(phase)?;
            }
        }
        Ok(())
    }

    /// What an approval shows and binds: the full delegation input (role, backend, model,
    /// prompt) and the digest of each artifact it reads, as the blackboard holds them now.
    /// The collaboration's cost is shown beside the queue (`status`), not bound: it moves
    /// whenever any launch ends, which is no change to what is approved.
    pub(crate) fn input(&self, phase: &Phase) -> Result<Value, Refusal> {
        let mut reads = Vec::new();
        let page = self.engine.artifact_index(
            self.me,
            &self.c.room,
            None,
            room_engine::blackboard::INDEX_PAGE_MAX,
        )?;
        for a in page["artifacts"].as_array().into_iter().flatten() {
            if phase
                .reads
                .iter()
                .any(|k| a["kind"].as_str() == Some(&k.to_string()))
            {
                reads.push(
                    json!({"kind": a["kind"], "key": a["key"], "version": a["version"],
                    "sha256": a["sha256"], "producer": a["producer"]}),
                );
            }
        }
        let role = phase
            .role
            .as_deref()
            .and_then(|r| self.pack.profile.role(r));
        // the panels whose findings it reads: each reviewer's state in their newest run
        // (one that failed or timed out is shown, never dropped)
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let panels: Vec<Value> = self
            .pack
            .phases
            .iter()
            .filter(|p| {
                p.kind == PhaseKind::Panel && p.writes.iter().any(|w| phase.reads.contains(w))
            })
            .map(|p| {
                let run = runs
                    .iter()
                    .filter(|r| r.phase == p.name)
                    .map(|r| r.run)
                    .max();
                let seats: Vec<Value> = p
                    .seats()
                    .iter()
                    .map(|seat| {
                        let state = runs
                            .iter()
                            .find(|r| Some(r.run) == run && r.phase == seat_run(&p.name, seat))
                            .map_or("waiting", |r| r.state.as_str());
                        json!({"seat": seat, "state": state})
                    })
                    .collect();
                // its judge's state and the synthesis the approval binds, if it has one
                let judge = p.judge.as_ref().map(|j| {
                    let state = runs
                        .iter()
                        .find(|r| Some(r.run) == run && r.phase == format!("judge@{}", p.name))
                        .map_or("waiting", |r| r.state.as_str());
                    let synthesis = page["artifacts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|a| a["kind"] == SYNTHESIS_KIND && a["key"] == p.name.as_str())
                        .map(|a| json!({"version": a["version"], "sha256": a["sha256"]}));
                    json!({"role": j, "state": state, "synthesis": synthesis})
                });
                json!({"panel": p.name, "run": run, "seats": seats, "judge": judge})
            })
            .collect();
        Ok(json!({
            "panels": panels,
            "collab": self.c.id, "goal": self.c.goal, "phase": phase.name,
            "kind": phase.kind.as_str(),
            "role": phase.role, "agent": phase.role.as_ref().and_then(|r| self.spec.agents.get(r)),
            "backend": role.map(|r| json!({"adapter": r.adapter, "preset": r.preset, "model": r.model})),
            "prompt": phase.prompt.as_ref().and_then(|p| self.spec.prompts.get(p)),
            "reads": reads,
            "writes": phase.writes.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        }))
    }

    /// The person's answers to the roles' questions (`collab_ask`), each sent back to its
    /// asker once: on its task (a `send`, which wakes it) or, without one, said to it. A
    /// revision's text is the answer; an approval says go on, a rejection no.
    pub(crate) fn answer_asks(&self, runs: &mut [CollabRunRow]) -> Result<(), Refusal> {
        if !runs
            .iter()
            .any(|r| r.phase.starts_with("ask@") && r.state == "asked")
        {
            return Ok(());
        }
        let approvals = self.engine.collab_approvals(self.me, &self.c.id)?;
        for r in runs
            .iter_mut()
            .filter(|r| r.phase.starts_with("ask@") && r.state == "asked")
        {
            let Some(a) = approvals
                .iter()
                .filter(|a| a.phase == r.phase && a.run == r.run)
                .max_by_key(|a| a.created_ms)
            else {
                continue;
            };
            let answer = match a.state.as_str() {
                "approved" => revised_prompt(a).unwrap_or_else(|| "yes: go on".into()),
                "rejected" => "no".into(),
                _ => continue,
            };
            let seat = r.phase.trim_start_matches("ask@").to_string();
            let agent = format!("{}-{seat}", self.c.id);
            let input: Value = serde_json::from_str(&a.input).unwrap_or(Value::Null);
            let text = format!(
                "The person answered your question ({}):\n{answer}",
                input["question"].as_str().unwrap_or("")
            );
            let key = format!("{}.ask:{seat}.{}.answer", self.c.id, r.run);
            let verb = if r.task.is_some() {
                Verb::Send
            } else {
                Verb::Say
            };
            let sent = self.act(|| {
                self.engine.turn(
                    self.me,
                    verb,
                    TurnArgs {
                        room: self.c.room.clone(),
                        text: Some(text.clone()),
                        to: vec![agent.clone()],
                        task: r.task.clone(),
                        idempotency_key: Some(key.clone()),
                        ..TurnArgs::default()
                    },
                )
            });
            match sent {
                Ok(_) => {}
                Err(e) if is_repeat(&e) => {}
                Err(e) => return Err(e),
            }
            r.state = "answered".into();
            r.ended_ms = Some(self.engine.now_ms());
            self.put(r)?;
        }
        Ok(())
    }

    /// What holds a new dispatch to `role`'s child back now (`hold`).
    pub(crate) fn held(&self, role: &str) -> Result<Option<Hold>, Refusal> {
        let agent = self.spec.agents.get(role).cloned().unwrap_or_default();
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let cost = self.engine.collab_cost(self.me, &self.c.id)?;
        Ok(hold(
            self.pack,
            self.spec.usd_max,
            &runs,
            &cost,
            role,
            &agent,
        ))
    }

    /// `input` of a run: a fix run shows the findings it is sent back with.
    pub(crate) fn input_for(&self, phase: &Phase, row: &CollabRunRow) -> Result<Value, Refusal> {
        let mut v = self.input(phase)?;
        if let Some(fix) = fix_text(row) {
            v["fix"] = json!(fix);
        }
        Ok(v)
    }

    /// Dispatch an agent phase (a task to its role's child and a send that wakes it) or run
    /// a gate (a task the orchestrator claims and closes on its commands).
    pub(crate) fn dispatch(
        &self,
        phase: &Phase,
        row: &mut CollabRunRow,
        revised_prompt: Option<String>,
    ) -> Result<(), Refusal> {
        match phase.kind {
            PhaseKind::Gate => self.gate(phase, row),
            PhaseKind::Agent => self.assign(phase, row, revised_prompt),
            PhaseKind::Panel => {
                row.state = "running".into();
                self.put(row)?;
                self.panel(phase, row, revised_prompt)
            }
            PhaseKind::Approval => unreachable!("approval phases are decided, never dispatched"),
        }
    }

    /// An agent phase's dispatch, exactly once across crashes: the run is recorded as
    /// `dispatching` first, and the task and the send each carry an idempotency key of the
    /// run, so a dispatch repeated after a crash finds the task its first attempt created
    /// (the `exactly_once` refusal names it) and never sends twice.
    pub(crate) fn assign(
        &self,
        phase: &Phase,
        row: &mut CollabRunRow,
        revised_prompt: Option<String>,
    ) -> Result<(), Refusal> {
        let role = phase
            .role
            .as_ref()
            .expect("an agent phase names its role (checked at load)");
        self.assign_to(phase, role, None, row, revised_prompt)
    }

    /// `assign` for `role`'s child; a panel's seat (`seat`: its role, which keys its
    /// findings) writes its findings under its own key.
    pub(crate) fn assign_to(
        &self,
        phase: &Phase,
        role: &str,
        seat: Option<&str>,
        row: &mut CollabRunRow,
        revised_prompt: Option<String>,
    ) -> Result<(), Refusal> {
        let agent = self.spec.agents.get(role).ok_or_else(|| {
            Refusal::storage(format!(
                "collaboration {}: no agent for role {role}",
                self.c.id
            ))
        })?;
        // a seat's run name holds `@`, which no idempotency key does (`:` is in no phase name)
        let key = |what: &str| {
            format!(
                "{}.{}.{}.{what}",
                self.c.id,
                row.phase.replace('@', ":"),
                row.run
            )
        };
        // a run not yet given its task waits while a guard holds it (each pass asks again);
        // one whose task exists was dispatched already and finishes its dispatch
        let held = row.task.is_none() && self.held(role)?.is_some();
        row.state = "dispatching".into();
        self.put(row)?;
        if held {
            return Ok(());
        }
        let task = match &row.task {
            Some(t) => t.clone(),
            None => {
                let accept: Vec<Value> = phase
                    .writes
                    .iter()
                    .map(|k| match seat {
                        Some(s) => json!({"kind": "artifact", "artifact": k.to_string(), "key": s}),
                        None => json!({"kind": "artifact", "artifact": k.to_string()}),
                    })
                    .collect();
                let made = self.engine.task_create(
                    self.me,
                    TaskCreateArgs {
                        room: self.c.room.clone(),
                        title: title(&format!("{}: {}", phase.name, self.c.goal)),
                        to: Some(agent.clone()),
                        accept,
                        idempotency_key: Some(key("task")),
                        ..TaskCreateArgs::default()
                    },
                );
                let task = match made {
                    Ok(t) => t["task"]["id"].as_str().map(String::from),
                    Err(r) if is_repeat(&r) => r.detail["original_task"].as_str().map(String::from),
                    Err(r) => return Err(r),
                };
                let task = task.ok_or_else(|| {
                    Refusal::storage(format!("phase {}: its task has no id", phase.name))
                })?;
                row.task = Some(task.clone());
                self.put(row)?;
                task
            }
        };
        let prompt = revised_prompt.unwrap_or_else(|| {
            let base = phase
                .prompt
                .as_ref()
                .and_then(|p| self.spec.prompts.get(p).cloned())
                .unwrap_or_default();
            match fix_text(row) {
                Some(fix) => format!("{base}\n\n{fix}"),
                None => base,
            }
        });
        let text = match seat {
            None => format!(
                "{prompt}\n\nGoal: {}\nPhase: {} (task {task})\nRead: {}\nWrite: {} (artifact_put with task {task}), then done.",
                self.c.goal,
                phase.name,
                kinds_list(&phase.reads),
                kinds_list(&phase.writes),
            ),
            Some(s) => format!(
                "{prompt}\n\nGoal: {}\nPanel: {} (task {task}), you are reviewer {s}\nRead: {}\nWrite: findings with key {s} (artifact_put kind findings, key {s}, task {task}), then done. \
Your findings reach the orchestrator and the person alone: no other reviewer reads them.",
                self.c.goal,
                phase.name,
                kinds_list(&phase.reads),
            ),
        };
        let sent = self.act(|| {
            self.engine.turn(
                self.me,
                Verb::Send,
                TurnArgs {
                    room: self.c.room.clone(),
                    text: Some(text.clone()),
                    to: vec![agent.clone()],
                    task: Some(task.clone()),
                    idempotency_key: Some(key("send")),
                    ..TurnArgs::default()
                },
            )
        });
        match sent {
            Ok(_) => self.host.sent(),
            Err(r) if is_repeat(&r) => {}
            Err(r) => return Err(r),
        }
        row.state = "running".into();
        self.put(row)
    }

    /// A panel's run: one seat run per reviewer (`<phase>@<seat>`, the same run number),
    /// each an assignment to the seat's child whose acceptance is its own findings; a seat
    /// that runs past the panel's deadline is `timed_out` (its task cancelled), one whose
    /// task is cancelled or declined `failed`. The barrier joins on every seat: the panel is
    /// done when each has settled and at least one wrote its findings (`failed` when none
    /// did); a seat that failed or timed out stays in the record, shown, never dropped.
    /// Resumable: missing seat runs are made, `dispatching` ones dispatched again (their
    /// tasks and sends carry idempotency keys of the seat's run).
    pub(crate) fn panel(
        &self,
        phase: &Phase,
        row: &mut CollabRunRow,
        revised_prompt: Option<String>,
    ) -> Result<(), Refusal> {
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let deadline_ms = phase
            .timeout_ms
            .unwrap_or(crate::pack::PANEL_TIMEOUT_MS_DEFAULT);
        let mut settled = Vec::new();
        for seat in phase.seats() {
            let name = seat_run(&phase.name, &seat);
            let mut s = runs
                .iter()
                .find(|r| r.phase == name && r.run == row.run)
                .cloned()
                .unwrap_or_else(|| CollabRunRow {
                    collab: self.c.id.clone(),
                    phase: name.clone(),
                    run: row.run,
                    task: None,
                    state: "dispatching".into(),
                    reads: row.reads.clone(),
                    started_ms: self.engine.now_ms(),
                    ended_ms: None,
                });
            if s.state == "dispatching" && s.task.is_none() {
                match self.held(&seat)? {
                    // a blocked seat is settled as such (shown, never dropped)
                    Some(Hold::Blocked(_)) => {
                        s.state = "blocked".into();
                        s.ended_ms = Some(self.engine.now_ms());
                        self.put(&s)?;
                    }
                    // past the live-worker cap: not dispatched (nor recorded) yet
                    Some(Hold::Wait(_)) => {
                        settled.push("waiting".into());
                        continue;
                    }
                    None => {}
                }
            }
            if s.state == "dispatching" {
                self.assign_to(phase, &seat, Some(&seat), &mut s, revised_prompt.clone())?;
            }
            if s.state == "running" {
                self.settle_seat(&mut s, deadline_ms)?;
            }
            settled.push(s.state.clone());
        }
        let open = settled
            .iter()
            .any(|s| matches!(s.as_str(), "dispatching" | "running" | "waiting"));
        if open {
            return Ok(());
        }
        if !settled.iter().any(|s| s == "done") {
            row.state = "failed".into();
            row.ended_ms = Some(self.engine.now_ms());
            return self.put(row);
        }
        if phase.debate {
            let seats = phase.seats();
            let done: Vec<&String> = seats
                .iter()
                .zip(&settled)
                .filter(|(_, st)| *st == "done")
                .map(|(seat, _)| seat)
                .collect();
            if !self.debate(phase, row, &done, deadline_ms)? {
                return Ok(());
            }
        }
        if let Some(judge) = &phase.judge
            && !self.judged(phase, row, judge, deadline_ms)?
        {
            return Ok(());
        }
        self.join(phase, row)
    }

    /// A panel's judge (`judge = "ROLE"`): once the reviewers (and their debate) have
    /// settled, its child is given every reviewer's findings and the mechanical merge, and
    /// writes its synthesis (`extra/synthesis`, keyed by the panel) on a task of its own (the
    /// run `judge@PHASE`, the panel's run number): merged and de-duplicated, every
    /// disagreement kept, no vote. Settled like a seat (failed, timed out, blocked shown); the
    /// join goes on whichever way it ends. Whether it has settled.
    pub(crate) fn judged(
        &self,
        phase: &Phase,
        row: &CollabRunRow,
        judge: &str,
        deadline_ms: u64,
    ) -> Result<bool, Refusal> {
        let name = format!("judge@{}", phase.name);
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let mut s = runs
            .iter()
            .find(|r| r.phase == name && r.run == row.run)
            .cloned()
            .unwrap_or_else(|| CollabRunRow {
                collab: self.c.id.clone(),
                phase: name.clone(),
                run: row.run,
                task: None,
                state: "dispatching".into(),
                reads: row.reads.clone(),
                started_ms: self.engine.now_ms(),
                ended_ms: None,
            });
        if s.state == "dispatching" && s.task.is_none() {
            match self.held(judge)? {
                Some(Hold::Blocked(_)) => {
                    s.state = "blocked".into();
                    s.ended_ms = Some(self.engine.now_ms());
                    self.put(&s)?;
                    return Ok(true);
                }
                Some(Hold::Wait(_)) => return Ok(false),
                None => {}
            }
        }
        if s.state == "dispatching" {
            let agent = self.spec.agents.get(judge).cloned().ok_or_else(|| {
                Refusal::storage(format!(
                    "collaboration {}: no agent for role {judge}",
                    self.c.id
                ))
            })?;
            let found = self.round_findings(phase, row.run)?;
            let by_seat: BTreeMap<String, Value> = found
                .iter()
                .map(|(k, v)| (k.clone(), v["content"].clone()))
                .collect();
            let merged = crate::panel::merge(&by_seat);
            let accept = json!({"kind": "artifact", "artifact": SYNTHESIS_KIND, "key": phase.name});
            let task = self.own_task(
                &mut s,
                &agent,
                &format!("judge {}: {}", phase.name, self.c.goal),
                accept,
            )?;
            let each: Vec<String> = by_seat
                .iter()
                .map(|(k, v)| format!("Reviewer {k}'s findings:\n{v}"))
                .collect();
            let text = format!(
                "Judge the review panel {} (task {task}). Its reviewers' findings follow, then their mechanical merge. \
Write your synthesis as the artifact {SYNTHESIS_KIND} with key {} (artifact_put kind {SYNTHESIS_KIND}, key {}, task {task}): \
{{\"merged\": [the findings, de-duplicated], \"disagreements\": [every point the reviewers differ on, each reviewer's view kept], \"summary\": \"...\"}}. \
Keep every disagreement visible and do not vote: the person decides. Then done.\n\nGoal: {}\n\n{}\n\nMerged: {merged}",
                phase.name,
                phase.name,
                phase.name,
                self.c.goal,
                each.join("\n\n")
            );
            self.send_once(&s, &agent, &task, &text)?;
            s.state = "running".into();
            self.put(&s)?;
        }
        if s.state == "running" {
            self.settle_seat(&mut s, deadline_ms)?;
        }
        Ok(!matches!(s.state.as_str(), "dispatching" | "running"))
    }

    /// A panel's debate round (`debate = true`): each seat that wrote findings is given the
    /// others' findings once (a seat run `<phase>@<seat>.debate`, the same run number), and
    /// writes its own again for the round (revised, or unchanged: its task's acceptance is a
    /// version written for it); settled like the first
    /// round (failed, timed out and blocked shown, never dropped). Whether it has settled.
    pub(crate) fn debate(
        &self,
        phase: &Phase,
        row: &CollabRunRow,
        seats: &[&String],
        deadline_ms: u64,
    ) -> Result<bool, Refusal> {
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let mut found: Option<Vec<(String, Value)>> = None;
        let mut open = false;
        for &seat in seats {
            let name = debate_run(&phase.name, seat);
            let mut s = runs
                .iter()
                .find(|r| r.phase == name && r.run == row.run)
                .cloned()
                .unwrap_or_else(|| CollabRunRow {
                    collab: self.c.id.clone(),
                    phase: name.clone(),
                    run: row.run,
                    task: None,
                    state: "dispatching".into(),
                    reads: row.reads.clone(),
                    started_ms: self.engine.now_ms(),
                    ended_ms: None,
                });
            if s.state == "dispatching" && s.task.is_none() {
                match self.held(seat)? {
                    Some(Hold::Blocked(_)) => {
                        s.state = "blocked".into();
                        s.ended_ms = Some(self.engine.now_ms());
                        self.put(&s)?;
                        continue;
                    }
                    Some(Hold::Wait(_)) => {
                        open = true;
                        continue;
                    }
                    None => {}
                }
            }
            if s.state == "dispatching" {
                let found = match &found {
                    Some(f) => f,
                    None => found.insert(self.round_findings(phase, row.run)?),
                };
                let others: Vec<String> = found
                    .iter()
                    .filter(|(k, _)| k != seat)
                    .map(|(k, v)| format!("Reviewer {k}'s findings:\n{}", v["content"]))
                    .collect();
                let text = format!(
                    "Debate round of the review panel {}: the other reviewers' findings follow, given to you once. \
Write your findings again for this round (artifact_put kind findings, key {seat}, expected_version the newest): revised where the others change your view, unchanged where they do not; then done.\n\n{}",
                    phase.name,
                    others.join("\n\n")
                );
                self.assign_to(phase, seat, Some(seat), &mut s, Some(text))?;
            }
            if s.state == "running" {
                self.settle_seat(&mut s, deadline_ms)?;
            }
            open |= matches!(s.state.as_str(), "dispatching" | "running");
        }
        Ok(!open)
    }

    /// The findings of this panel run: each seat whose run `row.run` ended `done` (a seat
    /// that failed or timed out this round gives none, whatever it wrote in an earlier one).
    pub(crate) fn round_findings(
        &self,
        phase: &Phase,
        run: u32,
    ) -> Result<Vec<(String, Value)>, Refusal> {
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let done: Vec<String> = phase
            .seats()
            .into_iter()
            .filter(|seat| {
                runs.iter().any(|r| {
                    r.phase == seat_run(&phase.name, seat) && r.run == run && r.state == "done"
                })
            })
            .collect();
        self.engine.collab_findings(self.me, &self.c.id, &done)
    }

    /// The barrier has joined: the blocking findings (any reviewer's) go back to the
    /// implementer as a fix run, until the panel's loop cap; none left, the panel is done.
    /// The collaboration never merges: a clean panel leads to the person's approval.
    pub(crate) fn join(&self, phase: &Phase, row: &mut CollabRunRow) -> Result<(), Refusal> {
        let found = self.round_findings(phase, row.run)?;
        let by_seat: BTreeMap<String, Value> = found
            .into_iter()
            .map(|(k, v)| (k, v["content"].clone()))
            .collect();
        let merged = crate::panel::merge(&by_seat);
        let blocking: Vec<&Value> = merged["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| {
                f["classes"]
                    .as_object()
                    .is_some_and(|c| c.values().any(|v| v == "blocking"))
            })
            .collect();
        let cap = phase.fix_loops_max.unwrap_or(0);
        let fixer = phase.fixer(self.pack);
        row.ended_ms = Some(self.engine.now_ms());
        let (Some(fixer), false) = (fixer, blocking.is_empty() || cap == 0) else {
            row.state = "done".into();
            return self.put(row);
        };
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let loops = fix_loops(&runs, &phase.name, row.run);
        if loops >= cap {
            row.state = "fix_loop_exhausted".into();
            return self.put(row);
        }
        let mut text = format!(
            "Fix round {} of {cap}: the review panel {} found these blocking findings in your diff. \
Fix them in your working tree, then write the diff again (diff_from_tree, expected_version the newest), then done.",
            loops + 1,
            phase.name
        );
        for f in &blocking {
            let at = match (f["file"].as_str(), f["line"].as_u64()) {
                (Some(file), Some(line)) => format!(" ({file}:{line})"),
                (Some(file), None) => format!(" ({file})"),
                _ => String::new(),
            };
            let by: Vec<&String> = f["classes"]
                .as_object()
                .map(|c| c.keys().collect())
                .unwrap_or_default();
            let detail = f["detail"]
                .as_str()
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            text.push_str(&format!(
                "\n- {}{at}{detail} [{}]",
                f["title"].as_str().unwrap_or(""),
                by.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        // the fix run is made (once: a pass after a crash finds it by the panel run it
        // fixes) before the panel's run is marked `fixed`, so no crash leaves a panel waiting
        // on a fix that was never made
        let of = format!("{}#{}", phase.name, row.run);
        let made = runs.iter().any(|r| {
            r.phase == fixer.name
                && serde_json::from_str::<Value>(&r.reads).is_ok_and(|v| v["fix_of"] == of.as_str())
        });
        if !made {
            let versions = self.versions()?;
            let mut reads: Value = serde_json::from_str(&self.reads_json(fixer, &versions))
                .expect("reads are a JSON object");
            reads["fix"] = json!(text);
            reads["fix_of"] = json!(of);
            let run = runs
                .iter()
                .filter(|r| r.phase == fixer.name)
                .map(|r| r.run)
                .max()
                .unwrap_or(0)
                + 1;
            let mut fix = CollabRunRow {
                collab: self.c.id.clone(),
                phase: fixer.name.clone(),
                run,
                task: None,
                state: "approval".into(),
                reads: reads.to_string(),
                started_ms: self.engine.now_ms(),
                ended_ms: None,
            };
            if fixer.approve {
                self.put(&fix)?;
                self.engine.approval_request(
                    self.me,
                    &self.c.id,
                    &fixer.name,
                    run,
                    &self.input_for(fixer, &fix)?,
                )?;
            } else {
                self.assign(fixer, &mut fix, None)?;
            }
        }
        row.state = "fixed".into();
        self.put(row)
    }

    /// A running seat: done or failed as its task says, or timed out past its deadline.
    pub(crate) fn settle_seat(
        &self,
        s: &mut CollabRunRow,
        deadline_ms: u64,
    ) -> Result<(), Refusal> {
        let Some(task) = s.task.clone() else {
            return Ok(());
        };
        let t = self.engine.task_show(self.me, &task)?;
        let to = match t["task"]["status"].as_str() {
            Some("done") => "done",
            Some("cancelled" | "declined" | "superseded") => "failed",
            _ if self.engine.now_ms().saturating_sub(s.started_ms) > deadline_ms => {
                // its worker is stopped with its task (the launch's authority is gone)
                match self
                    .engine
                    .task_cancel(self.me, &task, Some("the panel's deadline passed"))
                {
                    Ok(_) => {}
                    Err(r) if r.code == Code::TaskStateInvalid => {}
                    Err(r) => return Err(r),
                }
                "timed_out"
            }
            // a seat's launch that ended without closing its task settles now, not at the
            // panel's deadline; a seat is never run again alone, so an interrupted one is
            // shown failed
            _ => match self.ended_unclosed(&task)? {
                Some("interrupted") => "failed",
                Some(to) => to,
                None => return Ok(()),
            },
        };
        s.state = to.into();
        s.ended_ms = Some(self.engine.now_ms());
        self.put(s)
    }

    /// A gate: a task the orchestrator claims and closes, its commands run as `command`
    /// acceptance. Resumable like an assignment: the task carries the run's idempotency key,
    /// and a run found `dispatching` or `running` after a crash closes the task it has.
    pub(crate) fn gate(&self, phase: &Phase, row: &mut CollabRunRow) -> Result<(), Refusal> {
        let key = format!("{}.{}.{}.task", self.c.id, phase.name, row.run);
        if row.task.is_none() {
            row.state = "dispatching".into();
            self.put(row)?;
            let accept: Vec<Value> = phase
                .commands
                .iter()
                .map(|c| serde_json::to_value(c).expect("a check serializes"))
                .collect();
            let made = self.engine.task_create(
                self.me,
                TaskCreateArgs {
                    room: self.c.room.clone(),
                    title: title(&format!("{}: {}", phase.name, self.c.goal)),
                    to: Some(self.c.orchestrator.clone()),
                    accept,
                    idempotency_key: Some(key),
                    ..TaskCreateArgs::default()
                },
            );
            let task = match made {
                Ok(t) => t["task"]["id"].as_str().map(String::from),
                Err(r) if is_repeat(&r) => r.detail["original_task"].as_str().map(String::from),
                Err(r) => return Err(r),
            };
            row.task = task;
            row.state = "running".into();
            self.put(row)?;
        }
        let task = row
            .task
            .clone()
            .ok_or_else(|| Refusal::storage(format!("phase {}: its task has no id", phase.name)))?;
        let status = self.engine.task_show(self.me, &task)?["task"]["status"].clone();
        if status == "done" {
            row.state = "done".into();
            row.ended_ms = Some(self.engine.now_ms());
            return self.put(row);
        }
        if status == "open" {
            self.engine.task_claim(self.me, &task, None)?;
        }
        // measured away from the pass: a gate's commands may take minutes, and no pass of
        // any collaboration waits for them; the job records the run's end itself
        if !self.host.measures_gates() {
            return Ok(());
        }
        // one gate of a collaboration measured at a time: its gates share one tree
        let key = self.c.id.clone();
        if !gates_measuring()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            return Ok(());
        }
        let guard = Measuring(key);
        // read again now the key is held: a job that just ended may have settled the run
        // this pass read as running (measuring it twice would run its commands twice)
        let fresh = self
            .engine
            .collab_runs(self.me, &self.c.id)?
            .into_iter()
            .find(|r| r.phase == row.phase && r.run == row.run);
        match fresh {
            Some(f) if matches!(f.state.as_str(), "dispatching" | "running") => *row = f,
            Some(f) => {
                *row = f;
                return Ok(());
            }
            None => return Ok(()),
        }
        // its own conversation: it reads and writes beside the passes, never in their stead
        let me = AgentCaller {
            conversation: GATE_CONVERSATION.into(),
            ..self.me.clone()
        };
        let (c, spec, pack) = (self.c.clone(), self.spec.clone(), self.pack.clone());
        let (host, phase_name, mut row) = (self.host.clone(), phase.name.clone(), row.clone());
        self.host.spawn(
            self.engine,
            Box::new(move |engine: &Engine| {
                // the key goes with the job, however it ends (a panic included)
                let _guard = guard;
                let cx = Cx {
                    engine,
                    me: &me,
                    c: &c,
                    spec: &spec,
                    pack: &pack,
                    host: &host,
                };
                if let Err(r) = cx.measure_gate(&phase_name, &task, &mut row) {
                    tracing::warn!(collab = %c.id, "gate {phase_name}: {r}");
                }
            }),
        );
        Ok(())
    }

    /// A gate's measurement: its tree made afresh, then the orchestrator's `done` on its
    /// task, which runs its commands as acceptance; the run is `done` when they pass,
    /// `failed` when they do not (or the diff cannot be laid on the base). Anything else
    /// leaves it running for the next pass to measure again.
    pub(crate) fn measure_gate(
        &self,
        phase: &str,
        task: &str,
        row: &mut CollabRunRow,
    ) -> Result<(), Refusal> {
        let closed = if let Err(why) = self.gate_tree() {
            // the diff under review cannot be laid on the base: the gate fails, measured on
            // nothing (its task stays claimed; a rerun builds the tree again)
            tracing::warn!("collaboration {}: gate {phase}: {why}", self.c.id);
            Err(Refusal::new(Code::TaskAcceptanceFailed, why))
        } else {
            self.act(|| {
                self.engine.turn(
                    self.me,
                    Verb::Done,
                    TurnArgs {
                        room: self.c.room.clone(),
                        task: Some(task.to_string()),
                        ..TurnArgs::default()
                    },
                )
            })
        };
        row.state = match &closed {
            Ok(_) => "done".into(),
            Err(r) if r.code == Code::TaskAcceptanceFailed => "failed".into(),
            Err(r) => return Err(r.clone()),
        };
        row.ended_ms = Some(self.engine.now_ms());
        self.put(row)
    }

    /// Make the gate's tree afresh (the base with the newest diff applied, the base alone
    /// before any diff) where the
    /// collaboration's roles work in trees; nothing to make otherwise (checks then measure
    /// the project).
    pub(crate) fn gate_tree(&self) -> Result<(), String> {
        let Some(trees) = self
            .engine
            .collab_trees(&self.c.id)
            .map_err(|r| r.message.clone())?
        else {
            return Ok(());
        };
        let diff = self
            .engine
            .collab_gate_diff(self.me, &self.c.id)
            .map_err(|r| r.message.clone())?;
        // no diff yet: the gate measures the base as it is
        let patch = diff
            .as_ref()
            .and_then(|d| d["content"]["patch"].as_str())
            .unwrap_or_default();
        self.host.gate_tree(self.engine, self.c, &trees, patch)
    }

    /// Catch up with the room, then act; a gate refusal (something arrived meanwhile) is
    /// read through and tried once more.
    pub(crate) fn act(&self, f: impl Fn() -> Result<Value, Refusal>) -> Result<Value, Refusal> {
        self.catch_up()?;
        match f() {
            Err(r)
                if matches!(
                    r.code,
                    Code::RoomSyncRequired | Code::RoomSyncConcurrentArrival
                ) =>
            {
                self.catch_up()?;
                f()
            }
            other => other,
        }
    }

    pub(crate) fn catch_up(&self) -> Result<(), Refusal> {
        let mut confirm: Option<String> = None;
        for _ in 0..CATCH_UP_PAGES_MAX {
            let page = self
                .engine
                .sync(self.me, &self.c.room, confirm.as_deref())?;
            let empty = page["items"].as_array().is_none_or(|a| a.is_empty());
            if confirm.is_some() && empty && page["more"] != true {
                return Ok(());
            }
            confirm = page["receipt"].as_str().map(String::from);
        }
        Err(Refusal::invalid(
            "room",
            format!(
                "{} did not settle within {CATCH_UP_PAGES_MAX} pages",
                self.c.room
            ),
        ))
    }

    /// A run whose task is still open although its child's work ended (the wake that carried
    /// it failed or was dead-lettered, or its launch ended with no reply, and it asked the
    /// person nothing it waits on): `done` if what the phase writes was stored and passes
    /// the task's acceptance (measured now, so a phase whose output is stored never asks its
    /// model again), else `interrupted` where a daemon died under the launch (the phase runs
    /// again, no failure counted), else `failed`. The task is withdrawn (cancelled) either way,
    /// so that nothing acts on it late. None while the work may still go on.
    fn ended_unclosed(&self, task: &str) -> Result<Option<&'static str>, Refusal> {
        let Some(w) = self.engine.collab_task_wake(self.me, &self.c.id, task)? else {
            return Ok(None);
        };
        // failed or dead-lettered; or waiting for a reply that cannot come: its launch ended
        // (a routed child's credential ends with its launch)
        let ended = matches!(w.state.as_str(), "failed" | "dead")
            || (w.state == "pending_reply" && w.outcome.is_some());
        if !ended {
            return Ok(None);
        }
        let stored = self
            .engine
            .task_check(self.me, task)
            .is_ok_and(|v| v["acceptance_pass"] == true);
        let (to, why) = if stored {
            (
                "done",
                "its launch ended before it closed the task; what it wrote was stored and passes",
            )
        } else if w.outcome.as_deref() == Some("interrupted") {
            (
                "interrupted",
                "its launch was interrupted (the daemon stopped under it); the phase runs again",
            )
        } else {
            ("failed", "its launch ended without closing the task")
        };
        self.engine.task_cancel(self.me, task, Some(why))?;
        Ok(Some(to))
    }

    /// Move each waiting or running run on: a task done is a run done; a task cancelled or
    /// declined is a run failed; an approval decided starts or ends its run, and one still
    /// pending is asked again with what it shows now (a changed input makes the old one
    /// stale).
    pub(crate) fn settle(
        &self,
        runs: &mut [CollabRunRow],
        _versions: &BTreeMap<ArtifactKind, u64>,
    ) -> Result<(), Refusal> {
        let approvals = self.engine.collab_approvals(self.me, &self.c.id)?;
        // tasks whose child asked the person and waits for the answer (a new wake brings it)
        let asking: std::collections::BTreeSet<String> = runs
            .iter()
            .filter(|r| r.phase.starts_with("ask@") && r.state == "asked")
            .filter_map(|r| r.task.clone())
            .collect();
        for r in runs.iter_mut() {
            // a panel's seat runs are settled by its barrier's
            if r.phase.contains('@') {
                continue;
            }
            match r.state.as_str() {
                "dispatching" | "running"
                    if self
                        .pack
                        .phase(&r.phase)
                        .is_some_and(|p| p.kind == PhaseKind::Panel) =>
                {
                    let phase = self.pack.phase(&r.phase).expect("checked just above");
                    let revised = approvals
                        .iter()
                        .filter(|a| a.phase == r.phase && a.run == r.run && a.state == "approved")
                        .max_by_key(|a| a.created_ms)
                        .and_then(revised_prompt);
                    self.panel(phase, r, revised)?;
                }
                "dispatching" | "running"
                    if self
                        .pack
                        .phase(&r.phase)
                        .is_some_and(|p| p.kind == PhaseKind::Gate) =>
                {
                    let phase = self.pack.phase(&r.phase).expect("checked just above");
                    self.gate(phase, r)?;
                }
                "running" => {
                    let Some(task) = r.task.clone() else { continue };
                    let t = self.engine.task_show(self.me, &task)?;
                    let to = match t["task"]["status"].as_str() {
                        Some("done") => "done",
                        Some("cancelled" | "declined" | "superseded") => "failed",
                        _ if asking.contains(&task) => continue,
                        _ => match self.ended_unclosed(&task)? {
                            Some(to) => to,
                            None => continue,
                        },
                    };
                    r.state = to.into();
                    r.ended_ms = Some(self.engine.now_ms());
                    self.put(r)?;
                }
                "dispatching" => {
                    let phase = self.pack.phase(&r.phase).ok_or_else(|| {
                        Refusal::storage(format!("run of unknown phase {}", r.phase))
                    })?;
                    let revised = approvals
                        .iter()
                        .filter(|a| a.phase == r.phase && a.run == r.run && a.state == "approved")
                        .max_by_key(|a| a.created_ms)
                        .and_then(revised_prompt);
                    self.assign(phase, r, revised)?;
                }
                "approval" => {
                    let phase = self.pack.phase(&r.phase).ok_or_else(|| {
                        Refusal::storage(format!("run of unknown phase {}", r.phase))
                    })?;
                    let newest = approvals
                        .iter()
                        .filter(|a| a.phase == r.phase && a.run == r.run)
                        .max_by_key(|a| a.created_ms);
                    match newest.map(|a| (a.state.as_str(), a)) {
                        Some(("approved", a)) => {
                            if phase.kind == PhaseKind::Approval {
                                r.state = "done".into();
                                r.ended_ms = Some(self.engine.now_ms());
                                self.put(r)?;
                            } else {
                                let revised = revised_prompt(a);
                                self.dispatch(phase, r, revised)?;
                            }
                        }
                        Some(("rejected", _)) => {
                            r.state = "rejected".into();
                            r.ended_ms = Some(self.engine.now_ms());
                            self.put(r)?;
                        }
                        _ => {
                            self.engine.approval_request(
                                self.me,
                                &self.c.id,
                                &r.phase,
                                r.run,
                                &self.input_for(phase, r)?,
                            )?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every phase done: the goal task closes and the collaboration finishes.
    pub(crate) fn finish(&self) -> Result<(), Refusal> {
        let goal = &self.spec.goal_task;
        let t = self.engine.task_show(self.me, goal)?;
        if t["task"]["status"] != "done" {
            if t["task"]["status"] == "open" {
                self.engine.task_claim(self.me, goal, None)?;
            }
            self.act(|| {
                self.engine.turn(
                    self.me,
                    Verb::Done,
                    TurnArgs {
                        room: self.c.room.clone(),
                        task: Some(goal.clone()),
                        ..TurnArgs::default()
                    },
                )
            })?;
        }
        // the trees go before the record says done, so that whoever sees it done finds them
        // gone (a crash between the two finds the goal done and finishes again)
        self.host.remove(self.engine, &self.c.id);
        self.engine.collab_finish(self.me, &self.c.id, "done")?;
        Ok(())
    }
}

/// The fix loops a panel has taken before its run `run`: its runs just before it that
/// ended `fixed` (a person's rerun, or a loop that ran out, starts the count again).
pub fn fix_loops(runs: &[CollabRunRow], phase: &str, run: u32) -> u32 {
    let mut before: Vec<&CollabRunRow> = runs
        .iter()
        .filter(|r| r.phase == phase && r.run < run)
        .collect();
    before.sort_by_key(|r| std::cmp::Reverse(r.run));
    before.iter().take_while(|r| r.state == "fixed").count() as u32
}

/// The run name of a panel's seat: `<phase>@<seat>` (`@` is in no phase's name).
/// A panel seat's run.
pub fn seat_run(phase: &str, seat: &str) -> String {
    format!("{phase}@{seat}")
}

/// A seat's run in its panel's debate round.
pub fn debate_run(phase: &str, seat: &str) -> String {
    format!("{phase}@{seat}{DEBATE}")
}

/// The suffix of a debate round's seat runs.
const DEBATE: &str = ".debate";

/// What holds a dispatch back: a wait (the live-worker cap: it goes once a run ends) or a
/// block (`child_auto_blocked`, `budget_exhausted`: it stays until the person acts).
pub(crate) enum Hold {
    Wait(Refusal),
    Blocked(Refusal),
}

/// Runs in flight: dispatched to a worker (a task made) and not ended; agent runs and
/// panel seats (a gate runs no worker of the collaboration's).
fn live(pack: &Pack, runs: &[CollabRunRow]) -> usize {
    runs.iter()
        .filter(|r| {
            r.phase.contains('@')
                || pack
                    .phase(&r.phase)
                    .is_some_and(|p| p.kind == PhaseKind::Agent)
        })
        .filter(|r| r.state == "running" || (r.state == "dispatching" && r.task.is_some()))
        .count()
}

/// Whether `role` runs the run `r`: its agent phase's role, or the seat of its panel run.
fn run_by_role(pack: &Pack, r: &CollabRunRow, role: &str) -> bool {
    match r.phase.split_once('@') {
        Some(("plan", phase)) => pack
            .phase(phase)
            .is_some_and(|p| p.role.as_deref() == Some(role)),
        Some(("judge", phase)) => pack.phase(phase).is_some_and(|p| p.judged_by(role)),
        Some(("tell" | "flag", _)) => false,
        Some((_, seat)) => seat.trim_end_matches(DEBATE) == role,
        None => pack
            .phase(&r.phase)
            .is_some_and(|p| p.kind == PhaseKind::Agent && p.role.as_deref() == Some(role)),
    }
}

/// What holds a new dispatch to `role`'s child (`agent`) back now, if anything: the money
/// ceiling (a cost that cannot be known holds it too), the child's consecutive failures,
/// its token and tool-call budgets, then the live-worker cap. A pure function of the
/// recorded runs and the cost roll-up, so the scheduler and `status` say the same.
fn hold(
    pack: &Pack,
    usd_max: Option<f64>,
    runs: &[CollabRunRow],
    cost: &Value,
    role: &str,
    agent: &str,
) -> Option<Hold> {
    let exhausted = |m: String, d: Value| {
        Some(Hold::Blocked(
            Refusal::new(Code::BudgetExhausted, m)
                .detail(d)
                .hint("nothing new is dispatched; what runs finishes: cancel, or start again with a larger budget"),
        ))
    };
    if let Some(max) = usd_max.or(pack.guards.usd_max) {
        match cost["usd"].as_f64() {
            Some(spent) if spent >= max => {
                return exhausted(
                    format!("the collaboration has spent {spent:.4} of its {max} US dollars"),
                    json!({"usd": spent, "usd_max": max}),
                );
            }
            Some(_) => {}
            None => {
                return exhausted(
                    format!(
                        "the collaboration's cost is unknown (a launch without usage records, or a model without a price), so its ceiling of {max} US dollars cannot be proven"
                    ),
                    json!({"usd": "unknown", "usd_max": max}),
                );
            }
        }
    }
    let policy = &pack.profile.role(role)?.policy;
    let mut mine: Vec<&CollabRunRow> = runs.iter().filter(|r| run_by_role(pack, r, role)).collect();
    mine.sort_by_key(|r| std::cmp::Reverse((r.started_ms, r.run)));
    let failures = mine
        .iter()
        .filter(|r| matches!(r.state.as_str(), "failed" | "timed_out" | "done"))
        .take_while(|r| r.state != "done")
        .count() as u32;
    if policy.failures_max > 0 && failures >= policy.failures_max {
        return Some(Hold::Blocked(
            Refusal::new(
                Code::ChildAutoBlocked,
                format!("{agent} failed {failures} times in a row (its role's failures_max is {})", policy.failures_max),
            )
            .detail(json!({"role": role, "agent": agent, "failures": failures, "failures_max": policy.failures_max}))
            .hint("read its runs (room collab status), then cancel, or rerun once its backend is fixed"),
        ));
    }
    let (mut tokens, mut tools) = (0u64, 0u64);
    for row in cost["by_agent_and_model"].as_array().into_iter().flatten() {
        if row["agent"] == agent {
            tokens +=
                row["tokens_in"].as_u64().unwrap_or(0) + row["tokens_out"].as_u64().unwrap_or(0);
            tools += row["tool_calls"].as_u64().unwrap_or(0);
        }
    }
    if let Some(max) = policy.tokens_max.filter(|m| tokens >= *m) {
        return exhausted(
            format!("{agent} has used {tokens} tokens of its role's {max}"),
            json!({"role": role, "agent": agent, "tokens": tokens, "tokens_max": max}),
        );
    }
    if tools >= u64::from(policy.tool_calls_max) {
        return exhausted(
            format!(
                "{agent} has made {tools} tool calls of its role's {}",
                policy.tool_calls_max
            ),
            json!({"role": role, "agent": agent, "tool_calls": tools, "tool_calls_max": policy.tool_calls_max}),
        );
    }
    let n = live(pack, runs);
    let cap = pack.guards.live_workers_max as usize;
    if n >= cap {
        return Some(Hold::Wait(
            Refusal::new(
                Code::QuotaExceeded,
                format!("{n} runs are in flight, the collaboration's live_workers_max"),
            )
            .detail(json!({"live_workers": n, "live_workers_max": cap})),
        ));
    }
    None
}

/// The `exactly_once` refusal of a call whose key an earlier call already used.
pub(crate) fn is_repeat(r: &Refusal) -> bool {
    r.code == Code::InvariantViolation && r.detail["invariant"] == "exactly_once"
}

/// A revised approval carries the person's prompt (`{"prompt": …}`) in its note.
fn revised_prompt(a: &ApprovalRow) -> Option<String> {
    let note = a.note.as_deref()?.strip_prefix("revised: ")?;
    serde_json::from_str::<Value>(note).ok()?["prompt"]
        .as_str()
        .map(String::from)
}

fn kinds_list(kinds: &[ArtifactKind]) -> String {
    if kinds.is_empty() {
        return "nothing".into();
    }
    kinds
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
