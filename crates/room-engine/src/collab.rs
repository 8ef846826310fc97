//! Collaborations' records and the authority over them (DESIGN.md §7). What a collaboration
//! runs (its profile, pack and prompts) is the collaboration floor's (`room-collab`): here it
//! is an opaque JSON spec the owner recorded. The engine decides who may act on it:
//!
//! - the owner starts, lists, shows and cancels one;
//! - its orchestrator (the delegated root recorded with it, holding `session:dispatch`) records
//!   phase runs, asks for approvals and finishes it; the daemon's scheduler acts as it with a
//!   credential minted from the record of a running collaboration and held in the process's
//!   memory only (never stored; the orchestrator's enrolled credential is left as it is);
//! - an approval binds the digest of what the person was shown: a decision naming another
//!   digest, or one made after the request moved on, is `approval_stale` and changes nothing.
//!
//! Finishing or cancelling revokes the orchestrator's subtree in one step: role children
//! live for one goal.

use crate::principal::AgentCaller;
use crate::{Engine, Outcome, Owner, store_err};
use room_core::{Code, Refusal, name};
use room_store::control::{ApprovalRow, CollabRow, CollabRunRow};
use serde_json::{Value, json};

/// Collaborations one listing shows at most.
pub const COLLABS_LIST_MAX: usize = 256;
/// Runs one collaboration keeps (every phase's, every loop's).
pub const RUNS_PER_COLLAB_MAX: usize = 4096;
/// Approval requests one collaboration keeps.
pub const APPROVALS_PER_COLLAB_MAX: usize = 1024;
/// Launches of one agent a cost roll-up reads.
pub const LAUNCHES_PER_AGENT_MAX: usize = 4096;
/// The longest question a role may ask the person (`collab_ask`).
pub const ASK_BYTES_MAX: usize = 4096;
/// The largest spec and approval input, in bytes of JSON.
pub const SPEC_BYTES_MAX: usize = 1 << 20;

/// What the owner starts: the record of a collaboration whose room and identities exist.
#[derive(Debug, Clone)]
pub struct CollabStart {
    pub id: String,
    pub room: String,
    pub project: Option<String>,
    pub goal: String,
    pub orchestrator: String,
    pub spec: Value,
    /// The working trees made for its implementing roles, if any.
    pub trees: Option<WorkTrees>,
}

/// A collaboration's working trees (`room_exec::tree` makes them beneath the state
/// directory's `trees/`): the base every tree starts at, the checkout of it no worker
/// writes (where a diff is checked to apply), and each implementing agent's own tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkTrees {
    /// The base commit.
    pub base: String,
    /// `git` (a clone of the project's repository) or `copy` (a staged copy).
    pub source: String,
    pub base_tree: String,
    /// The project had changes not committed at its HEAD (not in the base).
    pub uncommitted: bool,
    /// Agent name → its tree.
    pub trees: std::collections::BTreeMap<String, String>,
}

impl WorkTrees {
    /// Where a gate's checks run: the base with the diff under review applied, made afresh
    /// by the scheduler before each gate (`<trees>/<collab>/gate`, beside the base).
    pub fn gate_tree(&self) -> std::path::PathBuf {
        let base = std::path::Path::new(&self.base_tree);
        base.parent().unwrap_or(base).join("gate")
    }
}

/// The key of the spec that holds the working trees (the engine's, beside the floor's).
const TREES_KEY: &str = "worktrees";
/// How long taking a diff from a working tree may run.
pub const TREE_DIFF_MS: u64 = 60_000;

/// An approval decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    /// Approve with the input edited (what the person changed replaces what was shown).
    Revise(Value),
    Reject,
}

fn not_found(what: &str, id: &str) -> Refusal {
    Refusal::new(Code::NotFound, format!("no {what} {id:?}")).detail(json!({"field": "id"}))
}

fn stale(a: &ApprovalRow, digest: &str) -> Refusal {
    Refusal::new(
        Code::ApprovalStale,
        format!(
            "approval {} shows something else now (or was decided): nothing was decided",
            a.id
        ),
    )
    .detail(json!({"approval": a.id, "state": a.state, "digest": a.digest, "presented": digest}))
    .hint("show the queue again (room collab status) and decide on what it shows now")
}

/// The owner's standing the engine lends itself for what a collaboration's record grants (a
/// fresh credential for its orchestrator, the revocation of its subtree when it closes): the
/// record is the owner's act, and no caller reaches these paths with its own arguments.
pub(crate) fn daemon() -> Owner {
    Owner { _private: () }
}

/// How a wake that carried a task stands (`Engine::collab_task_wake`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskWake {
    pub state: String,
    /// The outcome of its newest launch, if one ended.
    pub outcome: Option<String>,
}

impl Engine {
    /// A new collaboration id (its room's name, its agents' prefix).
    pub fn collab_new_id(&self) -> String {
        room_core::id::collab_id(self.env.entropy.as_ref())
    }

    /// The owner records a collaboration it has set up (room, orchestrator, role children).
    pub fn collab_record(&self, _owner: &Owner, c: CollabStart) -> Outcome<()> {
        name::validate("id", &c.id)?;
        let mut spec = c.spec;
        if let Some(t) = &c.trees {
            if !spec.is_object() {
                return Err(Refusal::invalid(
                    "spec",
                    "an object, to hold the working trees",
                ));
            }
            spec[TREES_KEY] = serde_json::to_value(t).expect("working trees serialize");
        }
        let spec = spec.to_string();
        if spec.len() > SPEC_BYTES_MAX {
            return Err(Refusal::new(
                Code::PayloadTooLarge,
                format!("the collaboration's spec is over {SPEC_BYTES_MAX} bytes"),
            )
            .detail(json!({"field": "spec", "limit_bytes": SPEC_BYTES_MAX})));
        }
        let now = self.now_ms();
        let row = CollabRow {
            id: c.id,
            room: c.room,
            project: c.project,
            goal: c.goal,
            orchestrator: c.orchestrator,
            spec,
            state: "running".into(),
            created_ms: now,
            updated_ms: now,
        };
        {
            let mut ctl = self.control();
            if ctl.collab(&row.id).map_err(store_err)?.is_some() {
                return Err(Refusal::new(
                    Code::AlreadyExists,
                    format!("collaboration {} exists", row.id),
                ));
            }
            ctl.insert_collab(&row).map_err(store_err)?;
        }
        self.journal_tree(&row)
    }

    /// Journal the collaboration's identity tree in its room as it stands at the start: the
    /// orchestrator, then each identity beneath it, parent before child, each with its
    /// scopes and tier (`identity` records, `minted`).
    fn journal_tree(&self, c: &CollabRow) -> Outcome<()> {
        let agents = self.control().agents().map_err(store_err)?;
        let mut order: Vec<&room_store::control::AgentRow> = Vec::new();
        let mut frontier = vec![c.orchestrator.clone()];
        for _ in 0..=crate::delegation::DELEGATION_DEPTH_MAX {
            let level: Vec<&room_store::control::AgentRow> = agents
                .iter()
                .filter(|a| frontier.contains(&a.name) && a.revoked_ms.is_none())
                .collect();
            if level.is_empty() {
                break;
            }
            frontier = agents
                .iter()
                .filter(|a| {
                    a.parent
                        .as_ref()
                        .is_some_and(|p| level.iter().any(|l| &l.name == p))
                })
                .map(|a| a.name.clone())
                .collect();
            order.extend(level);
        }
        let records = order
            .into_iter()
            .map(|a| {
                room_core::event::EventBody::Identity(Box::new(room_core::event::IdentityChange {
                    actor: "owner".into(),
                    action: "minted".into(),
                    principal: a.name.clone(),
                    parent: a.parent.clone(),
                    scopes: a.scopes.clone(),
                    max_tier: Some(a.max_tier.clone()),
                    subtree: Vec::new(),
                }))
            })
            .collect();
        self.journal_records(&c.room, records)
    }

    /// The running collaboration whose identity tree holds `agent` (its orchestrator, or a
    /// node below it), if any.
    fn collab_of_tree(&self, agent: &str) -> Outcome<Option<CollabRow>> {
        let mut chain = vec![agent.to_string()];
        let mut next = self
            .control()
            .agent(agent)
            .map_err(store_err)?
            .and_then(|a| a.parent);
        while let Some(p) = next {
            if chain.len() > crate::delegation::DELEGATION_DEPTH_MAX {
                break;
            }
            next = self
                .control()
                .agent(&p)
                .map_err(store_err)?
                .and_then(|a| a.parent);
            chain.push(p);
        }
        // a collaboration's orchestrator is named `<id>-orch`: looked up by id, whatever
        // the number of collaborations running
        for name in &chain {
            let Some(id) = name.strip_suffix("-orch") else {
                continue;
            };
            if let Some(c) = self.control().collab(id).map_err(store_err)?
                && c.orchestrator == *name
                && c.state == "running"
            {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// Journal a change of `agent`'s node in the room of the collaboration whose tree holds
    /// it; a node of no collaboration's tree has no room to be journaled in.
    pub(crate) fn journal_tree_change(
        &self,
        agent: &str,
        change: room_core::event::IdentityChange,
    ) -> Outcome<()> {
        match self.collab_of_tree(agent)? {
            Some(c) => self.journal_records(
                &c.room,
                vec![room_core::event::EventBody::Identity(Box::new(change))],
            ),
            None => Ok(()),
        }
    }

    fn journal_records(
        &self,
        room: &str,
        records: Vec<room_core::event::EventBody>,
    ) -> Outcome<()> {
        if records.is_empty() {
            return Ok(());
        }
        let handle = self.room_handle(room)?;
        let mut h = crate::lock_room(&handle);
        h.commit(self, records, None)?;
        Ok(())
    }

    fn collab_row(&self, id: &str) -> Outcome<CollabRow> {
        self.control()
            .collab(id)
            .map_err(store_err)?
            .ok_or_else(|| not_found("collaboration", id))
    }

    /// The owner's view of one collaboration: its record, runs and approval queue.
    pub fn collab_show(
        &self,
        _owner: &Owner,
        id: &str,
    ) -> Outcome<(CollabRow, Vec<CollabRunRow>, Vec<ApprovalRow>)> {
        let c = self.collab_row(id)?;
        let ctl = self.control();
        let runs = ctl
            .collab_runs(id, RUNS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        let approvals = ctl
            .approvals(id, APPROVALS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        Ok((c, runs, approvals))
    }

    /// The owner lists collaborations (newest ids last).
    pub fn collabs_list(&self, _owner: &Owner) -> Outcome<Vec<CollabRow>> {
        self.control()
            .collabs(None, COLLABS_LIST_MAX)
            .map_err(store_err)
    }

    /// The daemon's loop: the collaborations it drives.
    pub fn collabs_running(&self) -> Outcome<Vec<CollabRow>> {
        self.control()
            .collabs(Some("running"), COLLABS_LIST_MAX)
            .map_err(store_err)
    }

    /// The daemon's loop gets a credential acting as a running collaboration's orchestrator
    /// (the record the owner made is what grants it): held in this process's memory only,
    /// never stored, and never a rotation of the orchestrator's enrolled credential, which
    /// whoever holds it keeps across restarts.
    pub fn collab_orchestrator_token(&self, id: &str) -> Outcome<String> {
        let c = self.collab_row(id)?;
        if c.state != "running" {
            return Err(Refusal::invalid(
                "id",
                format!("collaboration {id} is {}", c.state),
            ));
        }
        Ok(self.authority.scheduler_token(&c.orchestrator))
    }

    /// `caller` is the orchestrator of `id`, holding `session:dispatch`, and it runs.
    pub(crate) fn orchestrating(&self, caller: &AgentCaller, id: &str) -> Outcome<CollabRow> {
        let me = self.authenticate(&caller.token)?;
        let c = self.collab_row(id)?;
        let holds = me
            .scopes
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == "session:dispatch"));
        if me.name != c.orchestrator || !holds {
            return Err(Refusal::new(
                Code::TierInsufficient,
                format!("{} does not orchestrate collaboration {id}", me.name),
            )
            .detail(json!({"needed": "session:dispatch", "orchestrator": c.orchestrator})));
        }
        if c.state != "running" {
            return Err(Refusal::invalid(
                "id",
                format!("collaboration {id} is {}", c.state),
            ));
        }
        Ok(c)
    }

    /// An agent orchestrator steers collaboration `id`: the caller is its orchestrator (the
    /// delegated root the daemon's scheduler acts as) or a child of it holding `scope`
    /// (`session:read` to read the collaboration's state; `session:dispatch` to dispatch, ask
    /// for approvals and close), while it runs. Anyone else is refused `tier_insufficient`
    /// naming the scope needed.
    pub fn collab_steer(&self, caller: &AgentCaller, id: &str, scope: &str) -> Outcome<CollabRow> {
        let me = self.authenticate(&caller.token)?;
        let c = self.collab_row(id)?;
        let steers = me.name == c.orchestrator || {
            let parent = self
                .control()
                .agent(&me.name)
                .map_err(store_err)?
                .and_then(|a| a.parent);
            let holds = me
                .scopes
                .as_ref()
                .is_some_and(|s| s.iter().any(|x| x == scope));
            parent.as_deref() == Some(c.orchestrator.as_str()) && holds
        };
        if !steers {
            return Err(Refusal::new(
                Code::TierInsufficient,
                format!("{} does not hold {scope} in collaboration {id}", me.name),
            )
            .detail(json!({"needed": scope, "orchestrator": c.orchestrator})));
        }
        if c.state != "running" {
            return Err(Refusal::invalid(
                "id",
                format!("collaboration {id} is {}", c.state),
            ));
        }
        Ok(c)
    }

    /// The running collaboration `agent` steers as its orchestrator's child holding
    /// `session:dispatch`, if any: what the daemon keeps an orchestrator's turn for. A
    /// lookup; it grants nothing.
    pub fn collab_steered_by(&self, agent: &str) -> Outcome<Option<String>> {
        let Some(a) = self.control().agent(agent).map_err(store_err)? else {
            return Ok(None);
        };
        let steers = a
            .scopes
            .as_ref()
            .is_some_and(|s| s.iter().any(|x| x == "session:dispatch"));
        let Some(parent) = a.parent.filter(|_| steers) else {
            return Ok(None);
        };
        Ok(self
            .collabs_running()?
            .into_iter()
            .find(|c| c.orchestrator == parent)
            .map(|c| c.id))
    }

    /// A plan the person approved gives its child the scopes the collaboration's record held
    /// back from it for that phase (the spec's `held_scopes`, which the owner recorded at
    /// start): only once
    /// the newest approval of the run `plan@PHASE`#`run` is `approved`, only to a child of
    /// this collaboration's orchestrator, and journaled (`identity`, action `widened`).
    /// Idempotent: a child that holds them already is left as it is. The scopes it now holds.
    pub fn collab_plan_approved(
        &self,
        caller: &AgentCaller,
        id: &str,
        phase: &str,
        run: u32,
        agent: &str,
    ) -> Outcome<Vec<String>> {
        let c = self.orchestrating(caller, id)?;
        let plan = format!("plan@{phase}");
        let approved = self
            .control()
            .approvals(id, APPROVALS_PER_COLLAB_MAX)
            .map_err(store_err)?
            .into_iter()
            .filter(|a| a.phase == plan && a.run == run)
            .max_by_key(|a| a.created_ms)
            .is_some_and(|a| a.state == "approved");
        if !approved {
            return Err(Refusal::new(
                Code::ApprovalStale,
                format!("the plan of {phase} (run {run}) is not approved"),
            )
            .detail(json!({"phase": plan, "run": run})));
        }
        let spec: Value = serde_json::from_str(&c.spec)
            .map_err(|e| Refusal::storage(format!("collaboration {id}: its spec: {e}")))?;
        // per phase (a list for the whole child in records made before)
        let by_agent = &spec["held_scopes"][agent];
        let held: Vec<String> = match by_agent {
            Value::Array(_) => serde_json::from_value(by_agent.clone()).unwrap_or_default(),
            _ => serde_json::from_value(by_agent[phase].clone()).unwrap_or_default(),
        };
        let row = self
            .control()
            .agent(agent)
            .map_err(store_err)?
            .filter(|a| a.parent.as_deref() == Some(c.orchestrator.as_str()))
            .ok_or_else(|| {
                Refusal::new(
                    Code::TierInsufficient,
                    format!("{agent} is no role of collaboration {id}"),
                )
            })?;
        let mut scopes = row.scopes.clone().unwrap_or_default();
        if held.iter().all(|s| scopes.contains(s)) {
            return Ok(scopes);
        }
        scopes.extend(
            held.iter()
                .filter(|s| !row.scopes.iter().flatten().any(|x| x == *s))
                .cloned(),
        );
        scopes.sort();
        scopes.dedup();
        if scopes.len() > crate::delegation::SCOPES_PER_NODE_MAX
            || !scopes.iter().all(|s| crate::delegation::valid_scope(s))
        {
            return Err(Refusal::storage(format!(
                "collaboration {id}: the scopes held back from {agent} are not a node's scopes"
            )));
        }
        // journaled first: a widening is never made without its record (a retry after a
        // failed write records it again)
        self.journal_records(
            &c.room,
            vec![room_core::event::EventBody::Identity(Box::new(
                room_core::event::IdentityChange {
                    actor: c.orchestrator.clone(),
                    action: "widened".into(),
                    principal: agent.into(),
                    parent: row.parent.clone(),
                    scopes: Some(scopes.clone()),
                    max_tier: None,
                    subtree: Vec::new(),
                },
            ))],
        )?;
        self.control()
            .set_scopes(agent, &scopes)
            .map_err(store_err)?;
        Ok(scopes)
    }

    /// The orchestrator records a flag on its collaboration (`EventBody::CollabFlag`):
    /// journaled in its room first, then kept with its runs (phase `flag@CODE`, state
    /// `flagged`) for its status to show. It changes nothing else.
    pub fn collab_flag(
        &self,
        caller: &AgentCaller,
        id: &str,
        code: &str,
        agent: &str,
        detail: Value,
    ) -> Outcome<()> {
        let c = self.orchestrating(caller, id)?;
        if code.is_empty()
            || code.len() > 64
            || !code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        {
            return Err(Refusal::invalid("code", "a snake_case code"));
        }
        let body =
            room_core::event::EventBody::CollabFlag(Box::new(room_core::event::CollabFlag {
                actor: c.orchestrator.clone(),
                collab: c.id.clone(),
                code: code.into(),
                agent: agent.into(),
                detail: detail.clone(),
            }));
        let phase = format!("flag@{code}");
        let runs = self
            .control()
            .collab_runs(id, RUNS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        if runs.len() >= RUNS_PER_COLLAB_MAX {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!("collaboration {id} holds {RUNS_PER_COLLAB_MAX} runs"),
            ));
        }
        self.journal_records(&c.room, vec![body])?;
        let now = self.now_ms();
        let run = runs.iter().filter(|r| r.phase == phase).count() as u32 + 1;
        self.control()
            .put_collab_run(&CollabRunRow {
                collab: id.into(),
                phase,
                run,
                task: None,
                state: "flagged".into(),
                reads: json!({"agent": agent, "detail": detail}).to_string(),
                started_ms: now,
                ended_ms: Some(now),
            })
            .map_err(store_err)
    }

    /// The orchestrator's runs of its collaboration.
    pub fn collab_runs(&self, caller: &AgentCaller, id: &str) -> Outcome<Vec<CollabRunRow>> {
        self.orchestrating(caller, id)?;
        self.control()
            .collab_runs(id, RUNS_PER_COLLAB_MAX)
            .map_err(store_err)
    }

    /// The collaboration's cost so far, for the owner.
    pub fn collab_cost_owner(&self, _owner: &Owner, id: &str) -> Outcome<Value> {
        let c = self.collab_row(id)?;
        self.cost_of(&c)
    }

    /// The collaboration's cost so far, for its orchestrator (shown with every approval).
    pub fn collab_cost(&self, caller: &AgentCaller, id: &str) -> Outcome<Value> {
        let c = self.orchestrating(caller, id)?;
        self.cost_of(&c)
    }

    /// Rolled up from the adapters' usage records of every launch of the collaboration's
    /// agents (tokens in and out per call, per model), per agent and model; money only from
    /// `[prices]`, or from what an ACP agent reported its turn cost in US dollars
    /// (`by_agent_reported`), and `unknown` wherever a launch reported neither or a model has
    /// no price.
    /// Each child's live state as its launches prove it (the owner's view; the orchestrator's
    /// through `collab_children`): `alive` (a launch claimed with its pid runs now, in its
    /// job), `idle` (nothing runs for it: never launched, or its last launch ended as it
    /// should), `dead` (its last launch failed, timed out or was stopped), `unknown` (a launch
    /// made but not yet claimed: nothing proves a process).
    pub fn collab_children_owner(&self, _owner: &Owner, id: &str) -> Outcome<Value> {
        let c = self.collab_row(id)?;
        self.children_of(&c)
    }

    /// `collab_children_owner` for the collaboration's orchestrator.
    pub fn collab_children(&self, caller: &AgentCaller, id: &str) -> Outcome<Value> {
        let c = self.orchestrating(caller, id)?;
        self.children_of(&c)
    }

    /// How the newest wake that carried `task` to a child of the collaboration stands: its
    /// state (`queued`, `dispatched`, `replied`, `failed`, `dead`) and the outcome of its
    /// newest launch (`interrupted` where a daemon died under it). For the orchestrator, which
    /// settles a run whose child's work ended without closing its task.
    pub fn collab_task_wake(
        &self,
        caller: &AgentCaller,
        id: &str,
        task: &str,
    ) -> Outcome<Option<TaskWake>> {
        let c = self.orchestrating(caller, id)?;
        self.flush_wakes();
        let wakes = self.control().wakes(Some(&c.room)).map_err(store_err)?;
        let newest = wakes
            .into_iter()
            .filter(|w| w.agent != c.orchestrator && w.permit.contains(task))
            .filter(|w| {
                serde_json::from_str::<room_core::wake::WakePermit>(&w.permit)
                    .is_ok_and(|p| p.binding.task.as_deref() == Some(task))
            })
            .max_by_key(|w| w.created_ms);
        let Some(w) = newest else {
            return Ok(None);
        };
        let outcome = self
            .control()
            .launches_of_wake(&w.room, &w.agent, &w.source_event)
            .map_err(store_err)?
            .into_iter()
            .max_by_key(|l| l.created_ms)
            .and_then(|l| l.outcome);
        Ok(Some(TaskWake {
            state: w.state,
            outcome,
        }))
    }

    fn children_of(&self, c: &CollabRow) -> Outcome<Value> {
        let members = self.control().members(&c.room).map_err(store_err)?;
        let mut out = Vec::new();
        for agent in members.iter().filter(|m| **m != c.orchestrator) {
            let last = self
                .control()
                .launches_of(agent, 1)
                .map_err(store_err)?
                .into_iter()
                .next();
            let (state, why) = match &last {
                None => ("idle", "never launched".to_string()),
                Some(l) if l.state == "running" => {
                    ("alive", format!("launch {} runs (pid {:?})", l.id, l.pid))
                }
                Some(l) if l.state == "starting" => (
                    "unknown",
                    format!("launch {} is not yet claimed: no process proven", l.id),
                ),
                Some(l) => match l.outcome.as_deref() {
                    Some("failed" | "timed_out" | "stopped" | "wrong_body_rejected") => (
                        "dead",
                        format!(
                            "launch {} ended {}",
                            l.id,
                            l.outcome.as_deref().unwrap_or("")
                        ),
                    ),
                    other => (
                        "idle",
                        format!(
                            "launch {} ended {}",
                            l.id,
                            other.unwrap_or("without an outcome")
                        ),
                    ),
                },
            };
            out.push(json!({"agent": agent, "state": state, "why": why,
                "launch": last.as_ref().map(|l| l.id.clone()),
                "proof": last.as_ref().and_then(|l| l.proof.clone())}));
        }
        Ok(Value::Array(out))
    }

    fn cost_of(&self, c: &CollabRow) -> Outcome<Value> {
        let policy = self.policy();
        let members = self.control().members(&c.room).map_err(store_err)?;
        // (agent, model) -> (calls, tokens in, tokens out, tool calls)
        let mut rows: std::collections::BTreeMap<(String, String), (u64, u64, u64, u64)> =
            Default::default();
        let mut unreported = 0u64;
        // (agent, the agent's name for itself) -> (launches, US dollars it reported)
        let mut reported: std::collections::BTreeMap<(String, String), (u64, f64)> =
            Default::default();
        // agent -> (launches ended, of them without usage records)
        let mut launches_by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for agent in &members {
            let launches = self
                .control()
                .launches_of(agent, LAUNCHES_PER_AGENT_MAX)
                .map_err(store_err)?;
            for l in launches.iter().filter(|l| l.ended_ms.is_some()) {
                let detail: Value = l
                    .detail
                    .as_deref()
                    .and_then(|d| serde_json::from_str(d).ok())
                    .unwrap_or(Value::Null);
                let report = &detail["adapter"];
                let counts = launches_by.entry(agent.clone()).or_default();
                counts.0 += 1;
                // an ACP agent's own report of what its turn cost (`usage_update`), in US
                // dollars only: another unit is never converted
                let agent_usd = report["cost"]["amount"]
                    .as_f64()
                    .filter(|a| a.is_finite() && *a >= 0.0)
                    .filter(|_| report["cost"]["currency"] == "USD");
                match (
                    report["model"].as_str(),
                    report["usage"].as_array(),
                    agent_usd,
                ) {
                    (Some(model), Some(usage), _) => {
                        let e = rows.entry((agent.clone(), model.to_string())).or_default();
                        e.0 += usage.len() as u64;
                        e.1 += report["prompt_tokens"].as_u64().unwrap_or(0);
                        e.2 += report["completion_tokens"].as_u64().unwrap_or(0);
                        e.3 += report["tool_calls"].as_u64().unwrap_or(0);
                    }
                    (_, _, Some(usd)) => {
                        let name = report["agent"].as_str().unwrap_or("acp").to_string();
                        let e = reported.entry((agent.clone(), name)).or_default();
                        e.0 += 1;
                        e.1 += usd;
                    }
                    _ => {
                        counts.1 += 1;
                        unreported += 1;
                    }
                }
            }
        }
        let mut money_known = unreported == 0;
        let mut total_usd = 0.0;
        let (mut tin, mut tout) = (0u64, 0u64);
        let by: Vec<Value> = rows
            .iter()
            .map(|((agent, model), (calls, i, o, tools))| {
                tin += i;
                tout += o;
                let usd = policy.prices.get(model).map(|p| {
                    (*i as f64 * p.usd_per_million_input_tokens
                        + *o as f64 * p.usd_per_million_output_tokens)
                        / 1e6
                });
                match usd {
                    Some(u) => total_usd += u,
                    None => money_known = false,
                }
                json!({"agent": agent, "model": model, "calls": calls, "tokens_in": i,
                    "tokens_out": o, "tool_calls": tools,
                    "usd": usd.map_or(json!("unknown"), |u| json!(u))})
            })
            .collect();
        let by_agent_reported: Vec<Value> = reported
            .iter()
            .map(|((agent, name), (launches, usd))| {
                total_usd += usd;
                json!({"agent": agent, "reported_by": name, "launches": launches, "usd": usd})
            })
            .collect();
        let by_agent: Vec<Value> = launches_by
            .iter()
            .map(|(agent, (n, without))| {
                json!({"agent": agent, "launches": n, "launches_without_usage": without})
            })
            .collect();
        Ok(json!({
            "by_agent_and_model": by,
            "by_agent_reported": by_agent_reported,
            "by_agent": by_agent,
            "tokens_in": tin, "tokens_out": tout,
            "launches_without_usage": unreported,
            "usd": if money_known { json!(total_usd) } else { json!("unknown") },
        }))
    }

    /// The orchestrator's view of its approval queue.
    pub fn collab_approvals(&self, caller: &AgentCaller, id: &str) -> Outcome<Vec<ApprovalRow>> {
        self.orchestrating(caller, id)?;
        self.control()
            .approvals(id, APPROVALS_PER_COLLAB_MAX)
            .map_err(store_err)
    }

    /// The orchestrator records a run (a new one, or one whose state moved on).
    pub fn collab_run_put(&self, caller: &AgentCaller, run: CollabRunRow) -> Outcome<()> {
        self.orchestrating(caller, &run.collab)?;
        let mut ctl = self.control();
        let runs = ctl
            .collab_runs(&run.collab, RUNS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        let known = runs
            .iter()
            .any(|r| r.phase == run.phase && r.run == run.run);
        if !known && runs.len() >= RUNS_PER_COLLAB_MAX {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!(
                    "collaboration {} holds {RUNS_PER_COLLAB_MAX} runs",
                    run.collab
                ),
            ));
        }
        ctl.put_collab_run(&run).map_err(store_err)
    }

    /// The orchestrator asks the person to approve `input` for a phase's run. A run already
    /// decided keeps its decision (returned as it is); the request pending for that run with
    /// the same digest is returned as it is; one showing something else is marked `stale` (a
    /// decision on it is refused) and a new one made.
    pub fn approval_request(
        &self,
        caller: &AgentCaller,
        collab: &str,
        phase: &str,
        run: u32,
        input: &Value,
    ) -> Outcome<ApprovalRow> {
        self.orchestrating(caller, collab)?;
        self.request_approval(collab, phase, run, input)
    }

    /// A role asks the person a question mid-phase: it waits in the approval queue (`ask@SEAT`,
    /// one run per question) beside the dispatches, showing who asks, the question and the
    /// task; the person answers with `revise` (the answer's text), `approve` or `reject`, and
    /// the scheduler sends the answer back to the asker (a wake to its worker, into its bound
    /// session where its route keeps one). Only a child of the collaboration's orchestrator
    /// asks, in its room, while the collaboration runs.
    pub fn collab_ask(
        &self,
        caller: &AgentCaller,
        room: &str,
        question: &str,
        task: Option<&str>,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, room_core::Verb::Note)?;
        let _ = self.member_handle(&p, room)?;
        let c = self.collab_row(room)?;
        if c.state != "running" {
            return Err(Refusal::invalid(
                "room",
                format!("collaboration {room} is {}", c.state),
            ));
        }
        let parent = self
            .control()
            .agent(&p.name)
            .map_err(store_err)?
            .and_then(|a| a.parent);
        if parent.as_deref() != Some(c.orchestrator.as_str()) {
            return Err(Refusal::new(
                Code::TierInsufficient,
                format!("{} is no role of collaboration {room}", p.name),
            )
            .detail(json!({"orchestrator": c.orchestrator})));
        }
        let question = question.trim();
        if question.is_empty() || question.len() > ASK_BYTES_MAX || question.contains('\0') {
            return Err(Refusal::invalid(
                "question",
                format!("1..={ASK_BYTES_MAX} bytes of text"),
            ));
        }
        let seat = p.name.strip_prefix(&format!("{room}-")).unwrap_or(&p.name);
        let phase = format!("ask@{seat}");
        let runs = self
            .control()
            .collab_runs(room, RUNS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        if runs.len() >= RUNS_PER_COLLAB_MAX {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!("collaboration {room} holds {RUNS_PER_COLLAB_MAX} runs"),
            ));
        }
        let run = runs.iter().filter(|r| r.phase == phase).count() as u32 + 1;
        let input = json!({"kind": "ask", "asker": p.name, "seat": seat,
            "question": question, "task": task});
        let approval = self.request_approval(room, &phase, run, &input)?;
        let now = self.now_ms();
        self.control()
            .put_collab_run(&CollabRunRow {
                collab: room.into(),
                phase: phase.clone(),
                run,
                task: task.map(String::from),
                state: "asked".into(),
                reads: "{}".into(),
                started_ms: now,
                ended_ms: None,
            })
            .map_err(store_err)?;
        Ok(
            json!({"approval": approval.id, "phase": phase, "run": run, "state": "pending",
            "note": "the person answers in the approval queue; the answer comes to you as a message"}),
        )
    }

    fn request_approval(
        &self,
        collab: &str,
        phase: &str,
        run: u32,
        input: &Value,
    ) -> Outcome<ApprovalRow> {
        let bytes = room_core::canonical_bytes(input);
        if bytes.len() > SPEC_BYTES_MAX {
            return Err(Refusal::new(
                Code::PayloadTooLarge,
                format!("an approval's input is over {SPEC_BYTES_MAX} bytes"),
            )
            .detail(json!({"field": "input", "limit_bytes": SPEC_BYTES_MAX})));
        }
        let digest = room_core::sha256_hex(&bytes);
        let now = self.now_ms();
        let mut ctl = self.control();
        let all = ctl
            .approvals(collab, APPROVALS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        // decided already (a pass that read the queue before the person decided asks again):
        // the decision stands, and no new request is made for the run
        if let Some(d) = all.iter().find(|a| {
            a.phase == phase && a.run == run && matches!(a.state.as_str(), "approved" | "rejected")
        }) {
            return Ok(d.clone());
        }
        for a in all
            .iter()
            .filter(|a| a.phase == phase && a.run == run && a.state == "pending")
        {
            if a.digest == digest {
                return Ok(a.clone());
            }
            ctl.decide_approval(&a.id, &a.digest, "stale", now, Some("its input changed"))
                .map_err(store_err)?;
        }
        if all.len() >= APPROVALS_PER_COLLAB_MAX {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!(
                    "collaboration {collab} holds {APPROVALS_PER_COLLAB_MAX} approval requests"
                ),
            ));
        }
        let row = ApprovalRow {
            id: room_core::id::approval_id(self.env.entropy.as_ref()),
            collab: collab.into(),
            phase: phase.into(),
            run,
            digest,
            input: String::from_utf8(bytes).expect("canonical JSON is UTF-8"),
            state: "pending".into(),
            created_ms: now,
            decided_ms: None,
            note: None,
        };
        ctl.insert_approval(&row).map_err(store_err)?;
        Ok(row)
    }

    /// The person decides a request, naming the digest of what it was shown.
    pub fn approval_decide(
        &self,
        _owner: &Owner,
        id: &str,
        digest: &str,
        verdict: Verdict,
    ) -> Outcome<ApprovalRow> {
        let mut ctl = self.control();
        let a = ctl
            .approval(id)
            .map_err(store_err)?
            .ok_or_else(|| not_found("approval", id))?;
        if a.state != "pending" || a.digest != digest {
            return Err(stale(&a, digest));
        }
        let (to, note) = match &verdict {
            Verdict::Approve => ("approved", None),
            Verdict::Revise(v) => ("approved", Some(format!("revised: {v}"))),
            Verdict::Reject => ("rejected", None),
        };
        if note.as_ref().is_some_and(|n| n.len() > SPEC_BYTES_MAX) {
            return Err(Refusal::new(
                Code::PayloadTooLarge,
                format!("a revision is over {SPEC_BYTES_MAX} bytes"),
            )
            .detail(json!({"field": "revision", "limit_bytes": SPEC_BYTES_MAX})));
        }
        if !ctl
            .decide_approval(id, digest, to, self.now_ms(), note.as_deref())
            .map_err(store_err)?
        {
            return Err(stale(&a, digest));
        }
        ctl.approval(id)
            .map_err(store_err)?
            .ok_or_else(|| Refusal::storage(format!("approval {id} vanished")))
    }

    /// The orchestrator ends its collaboration (`done` or `failed`): the subtree below it is
    /// revoked, itself with it.
    pub fn collab_finish(&self, caller: &AgentCaller, id: &str, to: &str) -> Outcome<Value> {
        if !matches!(to, "done" | "failed") {
            return Err(Refusal::invalid("state", "done or failed"));
        }
        let c = self.orchestrating(caller, id)?;
        self.close_collab(&c, to)
    }

    /// The owner asks for `phase` to run again (its newest run failed or was rejected, or
    /// the person wants another take): a `rerun` marker becomes the phase's newest run, which
    /// the scheduler reads as not yet done. Only a running collaboration reruns, and not a
    /// phase that is running now.
    pub fn collab_rerun(&self, _owner: &Owner, id: &str, phase: &str) -> Outcome<CollabRunRow> {
        let c = self.collab_row(id)?;
        if c.state != "running" {
            return Err(Refusal::invalid(
                "id",
                format!("collaboration {id} is {}: nothing reruns", c.state),
            ));
        }
        let mut ctl = self.control();
        let runs = ctl
            .collab_runs(id, RUNS_PER_COLLAB_MAX)
            .map_err(store_err)?;
        let newest = runs
            .iter()
            .filter(|r| r.phase == phase)
            .max_by_key(|r| r.run);
        if let Some(r) = newest
            && matches!(r.state.as_str(), "approval" | "dispatching" | "running")
        {
            return Err(Refusal::new(
                Code::TaskStateInvalid,
                format!(
                    "phase {phase} is {} now: it reruns once it has ended",
                    r.state
                ),
            )
            .detail(json!({"field": "phase", "state": r.state, "run": r.run})));
        }
        if runs.len() >= RUNS_PER_COLLAB_MAX {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!("collaboration {id} holds {RUNS_PER_COLLAB_MAX} runs"),
            ));
        }
        let now = self.now_ms();
        let row = CollabRunRow {
            collab: id.into(),
            phase: phase.into(),
            run: newest.map_or(1, |r| r.run + 1),
            task: None,
            state: "rerun".into(),
            reads: "{}".into(),
            started_ms: now,
            ended_ms: Some(now),
        };
        ctl.put_collab_run(&row).map_err(store_err)?;
        Ok(row)
    }

    /// The orchestrator of the collaboration whose room is `room` (none: a room of no
    /// collaboration).
    pub(crate) fn collab_orchestrator_of(&self, room: &str) -> Outcome<Option<String>> {
        Ok(self
            .control()
            .collab(room)
            .map_err(store_err)?
            .map(|c| c.orchestrator))
    }

    /// The working trees of the collaboration whose room is `room`, if it has any (a room of
    /// no collaboration has none).
    pub fn collab_trees(&self, room: &str) -> Outcome<Option<WorkTrees>> {
        let Some(c) = self.control().collab(room).map_err(store_err)? else {
            return Ok(None);
        };
        let spec: Value = serde_json::from_str(&c.spec)
            .map_err(|e| Refusal::storage(format!("collaboration {room}: its spec: {e}")))?;
        match spec.get(TREES_KEY) {
            None => Ok(None),
            Some(t) => serde_json::from_value(t.clone()).map(Some).map_err(|e| {
                Refusal::storage(format!("collaboration {room}: its working trees: {e}"))
            }),
        }
    }

    /// An implementing agent's diff, taken from its own working tree against the
    /// collaboration's base: `git add --all` then `git diff --cached --binary BASE`, run as a
    /// check is (an owned job, confined, seeing that tree and not the state directory), the
    /// output kept whole up to the blackboard's artifact bound. The content is a `diff`
    /// artifact's (`{base, patch, summary?}`), for the caller to write as any other: the
    /// write is fenced, checked and versioned there.
    pub fn diff_from_tree(
        &self,
        caller: &AgentCaller,
        room: &str,
        summary: Option<String>,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, room_core::Verb::Note)?;
        let _ = self.member_handle(&p, room)?;
        let scope = "artifact:write:diff";
        if !p
            .scopes
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == scope))
        {
            return Err(Refusal::new(
                Code::ArtifactWriteDenied,
                format!("{} does not hold {scope}", p.name),
            )
            .detail(json!({"scope": scope})));
        }
        let trees = self.collab_trees(room)?;
        let Some((t, tree)) = trees.and_then(|t| {
            let tree = t.trees.get(&p.name).cloned()?;
            Some((t, tree))
        }) else {
            return Err(Refusal::invalid(
                "room",
                format!("{} has no working tree in {room}", p.name),
            )
            .hint("only a collaboration's implementing roles work in a tree; write the diff with artifact_put"));
        };
        let script = diff_script(&t.base)?;
        let limit = self.policy().blackboard.artifact_bytes_max;
        let tree = std::path::PathBuf::from(tree);
        let req = room_core::RunRequest {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script],
            cwd: tree.clone(),
            timeout_ms: TREE_DIFF_MS,
            project: Some(tree),
            project_write: true,
            network: false,
            stdin: Vec::new(),
            stdout_bytes_max: limit,
        };
        let unconfirmed = |why: String| {
            Refusal::invalid("tree", format!("its diff could not be taken: {why}"))
                .detail(json!({"field": "tree", "observation": "unconfirmed"}))
                .hint("your working tree must stay a git repository at its base; git's own words are above")
        };
        let out = self
            .env
            .runner
            .run(&req)
            .map_err(|e| unconfirmed(e.to_string()))?;
        if out.timed_out || !out.job_empty || out.exit_code != Some(0) {
            let err: String = out.stderr_tail.chars().take(512).collect();
            return Err(unconfirmed(format!(
                "git ended {:?} (timed out: {}){}",
                out.exit_code,
                out.timed_out,
                err.lines()
                    .next()
                    .map(|l| format!(": {l}"))
                    .unwrap_or_default()
            )));
        }
        if out.stdout.len() > limit {
            return Err(Refusal::new(
                Code::PayloadTooLarge,
                format!("the tree's diff is over the {limit}-byte artifact limit"),
            )
            .detail(json!({"field": "tree", "limit_bytes": limit})));
        }
        let patch = String::from_utf8(out.stdout)
            .map_err(|_| Refusal::invalid("tree", "the tree's diff is not UTF-8"))?;
        if patch.is_empty() {
            return Err(Refusal::invalid(
                "tree",
                format!(
                    "your working tree has no change against the base {}",
                    t.base
                ),
            ));
        }
        let mut content = json!({"base": t.base, "patch": patch});
        if let Some(s) = summary {
            content["summary"] = json!(s);
        }
        Ok(content)
    }

    /// The owner cancels a collaboration: its room is cancelled (workers stopped, queued
    /// wakes dead), and its identities revoked.
    pub fn collab_cancel(&self, owner: &Owner, id: &str) -> Outcome<Value> {
        let c = self.collab_row(id)?;
        if c.state != "running" {
            return Err(Refusal::invalid(
                "id",
                format!("collaboration {id} is {}", c.state),
            ));
        }
        self.room_cancel(&owner.control(), &c.room, Some("collab_cancel"))?;
        self.close_collab(&c, "cancelled")
    }

    fn close_collab(&self, c: &CollabRow, to: &str) -> Outcome<Value> {
        if !self
            .control()
            .set_collab_state(&c.id, "running", to, self.now_ms())
            .map_err(store_err)?
        {
            return Err(Refusal::invalid(
                "id",
                format!("collaboration {} is no longer running", c.id),
            ));
        }
        let revoked = self.authority.revoke(&daemon(), &c.orchestrator)?;
        let subtree: Vec<String> =
            serde_json::from_value(revoked["subtree"].clone()).unwrap_or_default();
        self.journal_records(
            &c.room,
            vec![room_core::event::EventBody::Identity(Box::new(
                room_core::event::IdentityChange {
                    actor: "owner".into(),
                    action: "revoked".into(),
                    principal: c.orchestrator.clone(),
                    parent: None,
                    scopes: None,
                    max_tier: None,
                    subtree: subtree.clone(),
                },
            ))],
        )?;
        Ok(json!({"collab": c.id, "state": to, "revoked": subtree}))
    }
}

/// The shell line, run confined in an agent's tree, that prints its diff against `base`:
/// every change, added files included (staged in the tree's own index first), binary ones as
/// git's binary patches, no external diff program, no text conversion, no hook.
fn diff_script(base: &str) -> Outcome<String> {
    if !matches!(base.len(), 40 | 64) || !base.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Refusal::storage(format!("{base:?} is not a commit id")));
    }
    Ok(format!(
        "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*' add --all . >&2 && \
         exec git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*' diff --cached --binary \
         --no-ext-diff --no-textconv --no-color --full-index {base}"
    ))
}
