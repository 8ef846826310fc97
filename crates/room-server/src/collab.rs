//! Collaborations in the daemon (DESIGN.md §7, issue 41): `start` sets one up from a pack and
//! its role bindings, and `tick` is the scheduler's pass over every running one. Authority is
//! the engine's throughout: the owner's standing starts and decides, and the scheduler acts as
//! the collaboration's orchestrator (a delegated root holding `session:read` and
//! `session:dispatch`), through the same calls an agent makes.
//!
//! A start mints the orchestrator and one child per role the pack's phases use (each holding
//! `artifact:read:K` for what its phases read and `artifact:write:K` for what they write),
//! gives each child a route from its binding, creates the collaboration's room (bound to the
//! project) with all of them as members, opens the goal task and records the collaboration.
//!
//! A tick asks `room_collab::schedule::ready` which phases may run, from the blackboard's
//! versions and the recorded runs (both durable: a restart asks again and gets the same
//! answer), then for each: an `agent` phase is a task addressed to its role's child, whose
//! acceptance is that its writes exist (an `artifact` check each), delivered by a `send` (a
//! sealed wake to the child's route); a `gate` phase is a task the orchestrator claims and
//! closes, its commands run as `command` acceptance; an `approval` phase, and a phase the pack
//! marks `approve`, waits in the approval queue bound to the digest of what it shows. A run
//! is done when Room's acceptance passed, never on an agent's word. When every phase is done,
//! the goal task closes and the collaboration finishes (its identities revoked).
//!
//! With the pack's orchestrator role bound, an agent orchestrates instead (`steer`): the pass
//! settles runs and tells it what is new; it dispatches and closes through its tools.

#[path = "collab_steer.rs"]
pub mod steer;

use room_collab::pack::{DEFAULT_PACK, DEFAULT_PROMPTS, Pack, PhaseKind};
use room_collab::profile::{Backends, Profile};
use room_collab::schedule::{self, PhaseRun};
use room_collab::{ArtifactKind, Phase};
use room_core::{Code, Refusal, Tier, Verb};
use room_engine::collab::CollabStart;
use room_engine::principal::AgentCaller;
use room_engine::verbs::{TaskCreateArgs, TurnArgs};
use room_engine::{Engine, Owner};
use room_store::control::{ApprovalRow, CollabRow, CollabRunRow};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// How often the scheduler passes over the running collaborations when nothing announces a
/// change sooner (every call that may move a room does).
pub const TICK_MS: u64 = 200;
/// The longest goal.
pub const GOAL_BYTES_MAX: usize = 4096;
/// Role bindings one start names at most.
pub const BINDINGS_MAX: usize = 32;
/// The conversation the scheduler acts in as each orchestrator.
const CONVERSATION: &str = "collab-scheduler";
/// Pages the scheduler reads to catch up before it acts (a room it cannot catch up with in
/// this many is left for the next tick).
const CATCH_UP_PAGES_MAX: usize = 64;

/// `collab_start`'s arguments: the pack's text and its prompt files' texts are the CLI's to
/// read (the daemon reads no file a caller names).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {
    pub goal: String,
    #[serde(default)]
    pub project: Option<String>,
    /// The pack's TOML (default: the shipped one).
    #[serde(default)]
    pub pack: Option<String>,
    /// Each prompt file the pack names, by the name it gives.
    #[serde(default)]
    pub prompts: BTreeMap<String, String>,
    /// `NAME=ADAPTER:MODEL`.
    #[serde(default)]
    pub roles: Vec<String>,
    /// A money ceiling in US dollars (over the pack's `[guards] usd_max`).
    #[serde(default)]
    pub usd_max: Option<f64>,
}

/// What a start sets up, checked.
struct Plan {
    goal: String,
    project: Option<String>,
    pack: Pack,
    pack_text: String,
    prompts: BTreeMap<String, String>,
    routes: BTreeMap<String, Value>,
    roles: Vec<String>,
    usd_max: Option<f64>,
}

/// What a collaboration runs, as its record keeps it.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
struct Spec {
    pack: String,
    prompts: BTreeMap<String, String>,
    roles: Vec<String>,
    /// The child of each role.
    agents: BTreeMap<String, String>,
    goal_task: String,
    /// The start's money ceiling (over the pack's).
    #[serde(default)]
    usd_max: Option<f64>,
    /// Per child, the write scopes held back until the person approves its plan (a phase
    /// with `plan = true`); the engine reads them from the record when a plan is approved.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    held_scopes: BTreeMap<String, Vec<String>>,
}

/// The pack with its roles bound (`Pack::bind_roles`: a panel's role once per reviewer).
fn load(pack_text: &str, roles: &[String]) -> Result<Pack, Refusal> {
    let mut pack = Pack::load(pack_text, &Profile::default())?;
    pack.bind_roles("roles", roles)?;
    pack.keep_used_roles();
    Ok(pack)
}

fn profile_invalid(role: &str, field: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(Code::ProfileInvalid, format!("role {role}: {field}: {why}"))
        .detail(json!({"role": role, "field": field}))
}

/// The route a role's child gets from its binding: a `script` role's model is its step
/// list, a `command` role's its program; an API or ACP role takes the owner's
/// `[backends.<adapter>]` fields (endpoint, key variable, command) with its model or preset.
/// A process's project and network access follow the role's policy.
fn route_of(
    role: &room_collab::Role,
    backends: &BTreeMap<String, Value>,
) -> Result<Value, Refusal> {
    let model = role.model.clone().unwrap_or_default();
    let route = match role.adapter.as_str() {
        "script" => json!({"adapter": "script", "steps": model.split(',').collect::<Vec<_>>()}),
        "command" => json!({"adapter": "command", "command": [model]}),
        adapter => {
            let mut r = backends.get(adapter).cloned().unwrap_or_else(|| json!({}));
            r["adapter"] = json!(adapter);
            match adapter {
                "acp" => r["preset"] = json!(role.preset),
                _ => r["model"] = json!(model),
            }
            if let Some(m) = &role.model_route {
                r["model_route"] = json!(m);
            }
            r
        }
    };
    // a worker that runs as a process is confined by its role's policy: the project
    // read-only unless the role writes it, no network unless the role reaches it (the
    // worker machinery enforces both, whatever the backend's own tools would do). A machine
    // that cannot confine leaves them advisory, which the start says (`advisory`).
    let mut route = route;
    if machine_confines() && matches!(role.adapter.as_str(), "script" | "command" | "acp") {
        let writes = role.policy.project == room_collab::profile::ProjectAccess::Write;
        route["project"] = json!(if writes { "writable" } else { "read_only" });
        route["network"] = json!(if role.policy.network { "host" } else { "none" });
    }
    room_engine::policy::check_route_value(&role.name, &route).map_err(|why| {
        profile_invalid(&role.name, "adapter", why).hint(format!(
            "a {} role takes its endpoint from config.toml [backends.{}]",
            role.adapter, role.adapter
        ))
    })?;
    Ok(route)
}

static CONFINES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the daemon's confinement probe found: whether this machine can confine workers (a
/// property of the machine, so one flag serves every daemon of the process).
pub fn set_machine_confines(yes: bool) {
    CONFINES.store(yes, std::sync::atomic::Ordering::Relaxed);
}

fn machine_confines() -> bool {
    CONFINES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The limits a role's policy sets that this machine leaves advisory.
fn advisory(pack: &Pack) -> Vec<String> {
    // a backend whose own tools Room cannot hard-deny (`room adapters probe` checks it)
    let tools = pack.profile.roles.iter().filter_map(|r| {
        let caps = room_agents::coverage::capabilities(&r.adapter)?;
        (caps.tool_deny == "advisory").then(|| {
            format!(
                "role {}: the {} backend's own tools are denied only by its asking (tool deny advisory); its project and network access are held by the worker's confinement where this machine confines",
                r.name, r.adapter
            )
        })
    });
    let tools: Vec<String> = tools.collect();
    if machine_confines() {
        return tools;
    }
    let unconfined = pack
        .profile
        .roles
        .iter()
        .filter(|r| matches!(r.adapter.as_str(), "script" | "command" | "acp"))
        .filter(|r| {
            r.policy.project != room_collab::profile::ProjectAccess::Write || !r.policy.network
        })
        .map(|r| {
            format!(
                "role {}: its read-only project and no-network limits are advisory (this machine cannot confine workers: see room doctor)",
                r.name
            )
        });
    tools.into_iter().chain(unconfined).collect()
}

/// The scopes a role's child holds: what its phases read and write, and the project access
/// its policy gives.
fn scopes_of(pack: &Pack, role: &room_collab::Role) -> Vec<String> {
    // an agent orchestrator reads the collaboration's state and dispatches, nothing more
    if role.name == room_collab::pack::ORCHESTRATOR {
        return vec!["session:dispatch".into(), "session:read".into()];
    }
    let mut out = Vec::new();
    for p in pack.phases.iter().filter(|p| p.run_by(&role.name)) {
        out.extend(p.reads.iter().map(|k| format!("artifact:read:{k}")));
        out.extend(p.writes.iter().map(|k| format!("artifact:write:{k}")));
    }
    match role.policy.project {
        room_collab::profile::ProjectAccess::None => {}
        room_collab::profile::ProjectAccess::Read => out.push("project:read".into()),
        room_collab::profile::ProjectAccess::Write => {
            out.extend(["project:read".into(), "project:write".into()])
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The kind a child's plan is written as (keyed by its phase's name).
const PLAN_KIND: &str = "extra/plan";

/// What a role's child holds at start, and what is held back until its plan is approved:
/// a role running a phase with `plan = true` may write its plan and nothing that phase
/// writes, nor the project, until then.
fn scopes_split(pack: &Pack, role: &room_collab::Role) -> (Vec<String>, Vec<String>) {
    let full = scopes_of(pack, role);
    let planned: Vec<&Phase> = pack
        .phases
        .iter()
        .filter(|p| p.plan && p.run_by(&role.name))
        .collect();
    if planned.is_empty() {
        return (full, Vec::new());
    }
    let held: Vec<String> = full
        .iter()
        .filter(|s| {
            s.as_str() == "project:write"
                || planned.iter().any(|p| {
                    p.writes
                        .iter()
                        .any(|k| **s == format!("artifact:write:{k}"))
                })
        })
        .cloned()
        .collect();
    let mut now: Vec<String> = full.into_iter().filter(|s| !held.contains(s)).collect();
    now.push(format!("artifact:write:{PLAN_KIND}"));
    now.sort();
    now.dedup();
    (now, held)
}

fn caller(token: String) -> AgentCaller {
    AgentCaller {
        token,
        conversation: CONVERSATION.into(),
        declared_tier: None,
        page_bytes_max: None,
    }
}

/// `collab_start`: check everything, then set the collaboration up.
pub fn start(engine: &Engine, owner: &Owner, a: StartArgs) -> Result<Value, Refusal> {
    let goal = a.goal.trim();
    if goal.is_empty() || goal.len() > GOAL_BYTES_MAX || goal.contains('\0') {
        return Err(Refusal::invalid(
            "goal",
            format!("1..={GOAL_BYTES_MAX} bytes of text"),
        ));
    }
    if a.roles.len() > BINDINGS_MAX {
        return Err(Refusal::invalid(
            "roles",
            format!("at most {BINDINGS_MAX} bindings"),
        ));
    }
    let (pack_text, prompts) = match a.pack {
        Some(t) => (t, a.prompts),
        None => (
            DEFAULT_PACK.to_string(),
            DEFAULT_PROMPTS
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect(),
        ),
    };
    let pack = load(&pack_text, &a.roles)?;
    pack.check_orchestrator()?;
    pack.check_prompts(|f| {
        prompts
            .get(f)
            .cloned()
            .ok_or_else(|| "not given".to_string())
    })?;
    let policy = engine.policy();
    let presets: Vec<&str> = room_agents::acp::PRESETS.iter().map(|p| p.name).collect();
    let model_routes: Vec<String> = policy.model_routes.keys().cloned().collect();
    pack.profile
        .validate(&Backends::room(&presets, &model_routes))?;
    let mut routes = BTreeMap::new();
    for r in &pack.profile.roles {
        routes.insert(r.name.clone(), route_of(r, &policy.backends)?);
    }
    room_collab::panel::check(&pack)?;
    for (i, p) in pack.phases.iter().enumerate() {
        for c in &p.commands {
            if let room_core::acceptance::Check::Command { program, .. } = c
                && !policy.acceptance_commands.iter().any(|a| a == program)
            {
                return Err(Refusal::new(
                    Code::AcceptanceCommandNotAllowed,
                    format!("phases[{i}]: {program} is not on the owner's command allowlist"),
                )
                .detail(json!({"field": format!("phases[{i}].commands"), "program": program}))
                .hint(format!(
                    "allow it in config.toml: [acceptance] commands = [\"{program}\"]"
                )));
            }
        }
    }
    if pack.phases.iter().any(|p| !p.commands.is_empty()) && a.project.is_none() {
        return Err(Refusal::invalid(
            "project",
            "a pack with a gate runs its commands in a project: name one (--project)",
        ));
    }
    let usd_max = a
        .usd_max
        .map(|u| room_collab::pack::check_usd("usd_max", u))
        .transpose()?;
    let plan = Plan {
        goal: goal.to_string(),
        project: a.project,
        pack,
        pack_text,
        prompts,
        routes,
        roles: a.roles,
        usd_max,
    };
    set_up(engine, owner, plan)
}

/// Mint, route, create the room, open the goal task, record. A failure after the first
/// identity is minted revokes what was minted (the room, if made, stays empty).
fn set_up(engine: &Engine, owner: &Owner, mut plan: Plan) -> Result<Value, Refusal> {
    let id = engine.collab_new_id();
    let trees = match &plan.project {
        Some(p) => make_trees(engine, &id, p, &plan.pack, &mut plan.routes)?,
        None => None,
    };
    let out = set_up_with(engine, owner, &id, plan, trees);
    if out.is_err() {
        remove_trees(engine, &id);
    }
    out
}

/// Whether a role works in a tree of its own: it writes the project and runs as a process
/// (an API role's only tools are Room's: it writes its diff as an artifact).
fn works_in_tree(role: &room_collab::Role) -> bool {
    role.policy.project == room_collab::profile::ProjectAccess::Write
        && matches!(role.adapter.as_str(), "script" | "command" | "acp")
}

fn trees_dir(engine: &Engine, id: &str) -> std::path::PathBuf {
    engine.state().root.join("trees").join(id)
}

/// The collaboration's working trees, removed (its goal is over, or it never started).
pub fn remove_trees(engine: &Engine, id: &str) {
    let dir = trees_dir(engine, id);
    if let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(
            "collaboration {id}: its working trees at {}: {e}",
            dir.display()
        );
    }
}

/// Make the base and one tree per implementing role (`room_exec::tree`), and point each such
/// role's route at its tree, the project itself read-only for it. None: no role needs one.
fn make_trees(
    engine: &Engine,
    id: &str,
    project: &str,
    pack: &Pack,
    routes: &mut BTreeMap<String, Value>,
) -> Result<Option<room_engine::collab::WorkTrees>, Refusal> {
    let roles: Vec<&room_collab::Role> = pack
        .profile
        .roles
        .iter()
        .filter(|r| works_in_tree(r))
        .filter(|r| pack.phases.iter().any(|p| p.run_by(&r.name)))
        .collect();
    if roles.is_empty() {
        return Ok(None);
    }
    let root = std::path::PathBuf::from(engine.revalidate_project(project)?.canonical_root);
    let dir = trees_dir(engine, id);
    let failed = |why: String| {
        Refusal::invalid("project", format!("its working trees could not be made: {why}"))
            .hint("an implementing role works in a clone of the project's HEAD (git) or a copy of it: see room doctor for git")
    };
    let parent = dir
        .parent()
        .expect("a collaboration's trees live in trees/");
    std::fs::DirBuilder::new()
        .recursive(true)
        .create(parent)
        .map_err(|e| failed(format!("{}: {e}", parent.display())))?;
    let base = room_exec::tree::make_base(&root, &dir).map_err(failed)?;
    let mut trees = BTreeMap::new();
    for r in roles {
        let tree = room_exec::tree::make_role_tree(&root, &dir, &r.name, &base).map_err(failed)?;
        let route = routes.get_mut(&r.name).expect("every role has a route");
        route["tree"] = json!(tree.display().to_string());
        if route.get("project").is_some() {
            route["project"] = json!("read_only");
        }
        room_engine::policy::check_route_value(&r.name, route)
            .map_err(|why| profile_invalid(&r.name, "adapter", why))?;
        trees.insert(format!("{id}-{}", r.name), tree.display().to_string());
    }
    Ok(Some(room_engine::collab::WorkTrees {
        base: base.commit,
        source: base.source.into(),
        base_tree: base.tree.display().to_string(),
        uncommitted: base.uncommitted,
        trees,
    }))
}

fn set_up_with(
    engine: &Engine,
    owner: &Owner,
    id: &str,
    plan: Plan,
    trees: Option<room_engine::collab::WorkTrees>,
) -> Result<Value, Refusal> {
    let Plan {
        goal,
        project,
        pack,
        pack_text,
        prompts,
        routes,
        roles,
        usd_max,
    } = plan;
    let goal = goal.as_str();
    let id = id.to_string();
    let orch = format!("{id}-orch");
    let minted = engine.delegate_as_owner(
        owner,
        None,
        &orch,
        &["session:read".into(), "session:dispatch".into()],
        Some(Tier::Coordinator),
    )?;
    let token = minted["token"].as_str().unwrap_or_default().to_string();
    let out = (|| {
        let mut agents = BTreeMap::new();
        let mut held_scopes = BTreeMap::new();
        for r in &pack.profile.roles {
            let name = format!("{id}-{}", r.name);
            let tier = Tier::parse(&r.policy.tier).unwrap_or(Tier::Member);
            let (scopes, held) = scopes_split(&pack, r);
            engine.delegate_as_owner(
                owner,
                Some(&orch),
                &name,
                &scopes,
                Some(tier.min(Tier::Member)),
            )?;
            if !held.is_empty() {
                held_scopes.insert(name.clone(), held);
            }
            engine.route_set(owner, &name, &routes[&r.name])?;
            agents.insert(r.name.clone(), name);
        }
        let mut members: Vec<String> = vec![orch.clone()];
        members.extend(agents.values().cloned());
        engine.room_create(owner, &id, project.as_deref(), &members)?;
        let me = caller(token.clone());
        let task = engine.task_create(
            &me,
            TaskCreateArgs {
                room: id.clone(),
                title: title(&format!("goal: {goal}")),
                to: Some(orch.clone()),
                coordination_only: true,
                ..TaskCreateArgs::default()
            },
        )?;
        let goal_task = task["task"]["id"].as_str().unwrap_or_default().to_string();
        let spec = Spec {
            pack: pack_text,
            prompts,
            roles,
            agents: agents.clone(),
            goal_task: goal_task.clone(),
            usd_max,
            held_scopes,
        };
        engine.collab_record(
            owner,
            CollabStart {
                id: id.clone(),
                room: id.clone(),
                project: project.clone(),
                goal: goal.to_string(),
                orchestrator: orch.clone(),
                spec: serde_json::to_value(&spec).expect("a spec serializes"),
                trees: trees.clone(),
            },
        )?;
        Ok(
            json!({"collab": id, "room": id, "orchestrator": orch, "agents": agents,
            "goal_task": goal_task, "pack": pack.view(), "advisory": advisory(&pack),
            "capabilities": pack.profile.roles.iter().map(|r| json!({"role": r.name,
                "adapter": r.adapter,
                "capabilities": room_agents::coverage::capabilities(&r.adapter)}))
                .collect::<Vec<_>>(),
            "trees": trees_view(trees.as_ref())}),
        )
    })();
    if out.is_err() {
        let _ = engine.revoke(owner, &orch);
    }
    out
}

/// What a start and a status say of the working trees.
fn trees_view(t: Option<&room_engine::collab::WorkTrees>) -> Value {
    match t {
        None => Value::Null,
        Some(t) => json!({
            "base": t.base, "source": t.source, "trees": t.trees,
            "uncommitted": t.uncommitted,
            "note": if t.uncommitted {
                "the project had uncommitted changes: the trees start at its HEAD commit, without them"
            } else { "" },
        }),
    }
}

/// A task title from `text`: its first line, cut to the title bound on a character boundary.
fn title(text: &str) -> String {
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

/// The owner's view of one collaboration: its record, pack, runs and approval queue.
pub fn status(engine: &Engine, owner: &Owner, id: &str) -> Result<Value, Refusal> {
    let (c, runs, approvals) = engine.collab_show(owner, id)?;
    let spec: Option<Spec> = serde_json::from_str(&c.spec).ok();
    let phases: Vec<Value> = spec
        .as_ref()
        .and_then(|s| load(&s.pack, &s.roles).ok())
        .map(|p| {
            p.phases
                .iter()
                .map(|ph| {
                    let mine: Vec<&CollabRunRow> =
                        runs.iter().filter(|r| r.phase == ph.name).collect();
                    let state = mine.last().map_or("waiting", |r| r.state.as_str());
                    let mut v = json!({"phase": ph.name, "kind": ph.kind.as_str(), "role": ph.role,
                        "state": state, "runs": mine.len(),
                        "task": mine.last().and_then(|r| r.task.clone())});
                    if ph.kind == PhaseKind::Panel {
                        let run = mine.last().map_or(0, |r| r.run);
                        v["panel"] =
                            panel_view(engine, owner, &c.room, &p, ph, &runs, run, spec.as_ref());
                        v["panel"]["fix_loops"] = json!(fix_loops(&runs, &ph.name, run + 1));
                        v["panel"]["fix_loops_max"] = json!(ph.fix_loops_max);
                    }
                    if state == "fix_loop_exhausted" {
                        let fixer = ph.fixer(&p).map(|f| f.name.clone()).unwrap_or_default();
                        v["refusal"] = serde_json::to_value(
                            Refusal::new(
                                Code::FixLoopExhausted,
                                format!(
                                    "phase {}: blocking findings remain after {} fix loops",
                                    ph.name,
                                    ph.fix_loops_max.unwrap_or(0)
                                ),
                            )
                            .detail(json!({"phase": ph.name, "fixer": fixer}))
                            .hint(format!(
                                "read the findings (room collab status), then rerun --from {fixer} or cancel; the diff is yours to take as it is"
                            )),
                        )
                        .expect("a refusal serializes");
                    }
                    v
                })
                .collect()
        })
        .unwrap_or_default();
    let cost = engine.collab_cost_owner(owner, id)?;
    let guards = spec
        .as_ref()
        .and_then(|s| load(&s.pack, &s.roles).ok().map(|p| (s, p)))
        .map(|(s, p)| guards_view(&p, s, &runs, &cost));
    Ok(json!({
        "guards": guards,
        "children": engine.collab_children_owner(owner, id)?,
        "collab": c.id, "room": c.room, "project": c.project, "goal": c.goal, "state": c.state,
        "orchestrator": c.orchestrator, "agents": spec.as_ref().map(|s| &s.agents),
        "goal_task": spec.as_ref().map(|s| &s.goal_task),
        "trees": trees_view(engine.collab_trees(&c.id)?.as_ref()),
        "phases": phases,
        "runs": runs.iter().map(run_view).collect::<Vec<_>>(),
        "flags": steer::flags(&runs),
        "orchestrated_by": spec.as_ref().map(|s| match s.agents.get(room_collab::pack::ORCHESTRATOR) {
            Some(a) => json!({"agent": a}),
            None => json!("scheduler"),
        }),
        "approvals": approvals.iter().map(approval_view).collect::<Vec<_>>(),
        "cost": cost,
        "created_ms": c.created_ms, "updated_ms": c.updated_ms,
    }))
}

/// A panel's newest run as the person reads it: each seat with its agent, backend and state
/// (`failed` and `timed_out` shown, never dropped) and its findings' version, then every
/// seat's findings side by side (`room_collab::panel::merge`: grouped, disagreements kept,
/// no vote). The owner reads every reviewer's findings.
#[allow(clippy::too_many_arguments)]
fn panel_view(
    engine: &Engine,
    owner: &Owner,
    room: &str,
    pack: &Pack,
    ph: &Phase,
    runs: &[CollabRunRow],
    run: u32,
    spec: Option<&Spec>,
) -> Value {
    let mut seats = Vec::new();
    let mut by_seat = BTreeMap::new();
    for seat in ph.seats() {
        let r = runs
            .iter()
            .find(|r| r.phase == seat_run(&ph.name, &seat) && r.run == run);
        let findings = engine
            .artifact_get_owner(owner, room, "findings", Some(&seat), None)
            .ok();
        let state = r.map_or("waiting", |r| r.state.as_str());
        if state == "done"
            && let Some(f) = &findings
        {
            by_seat.insert(seat.clone(), f["content"].clone());
        }
        let debate = runs
            .iter()
            .find(|r| r.phase == debate_run(&ph.name, &seat) && r.run == run)
            .map(|r| r.state.clone());
        let role = pack.profile.role(&seat);
        seats.push(json!({
            "seat": seat, "agent": spec.and_then(|s| s.agents.get(&seat)),
            "backend": role.map(room_collab::panel::backend),
            "family": role.map(room_collab::panel::family),
            "state": state, "task": r.and_then(|r| r.task.clone()), "debate": debate,
            "findings_version": findings.as_ref().map(|f| f["version"].clone()),
        }));
    }
    json!({"run": run, "distinct": ph.distinct.as_str(), "seats": seats,
        "merged": room_collab::panel::merge(&by_seat)})
}

/// The guards as the person reads them: runs in flight against the cap, the money ceiling,
/// and what holds each role's next dispatch (`hold`), if anything.
fn guards_view(pack: &Pack, spec: &Spec, runs: &[CollabRunRow], cost: &Value) -> Value {
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

fn run_view(r: &CollabRunRow) -> Value {
    json!({"phase": r.phase, "run": r.run, "task": r.task, "state": r.state,
        "reads": serde_json::from_str::<Value>(&r.reads).unwrap_or(Value::Null),
        "started_ms": r.started_ms, "ended_ms": r.ended_ms})
}

pub fn approval_view(a: &ApprovalRow) -> Value {
    json!({"approval": a.id, "phase": a.phase, "run": a.run, "digest": a.digest,
        "state": a.state, "input": serde_json::from_str::<Value>(&a.input).unwrap_or(Value::Null),
        "created_ms": a.created_ms, "decided_ms": a.decided_ms, "note": a.note})
}

/// `collab_rerun`: the phase (one of the pack's) runs again; the phases after it follow
/// once it has written new versions.
pub fn rerun(engine: &Engine, owner: &Owner, id: &str, phase: &str) -> Result<Value, Refusal> {
    let (c, _, _) = engine.collab_show(owner, id)?;
    let spec: Spec = serde_json::from_str(&c.spec)
        .map_err(|e| Refusal::storage(format!("collaboration {id}: its spec: {e}")))?;
    let pack = load(&spec.pack, &spec.roles)?;
    if pack.phase(phase).is_none() {
        return Err(Refusal::invalid(
            "phase",
            format!(
                "{phase:?} is not a phase of the pack ({})",
                pack.phases
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let row = engine.collab_rerun(owner, id, phase)?;
    Ok(json!({"collab": id, "phase": phase, "run": row.run, "state": row.state}))
}

pub fn list(engine: &Engine, owner: &Owner) -> Result<Value, Refusal> {
    let all = engine.collabs_list(owner)?;
    Ok(
        json!({"collabs": all.iter().map(|c| json!({"collab": c.id, "room": c.room,
        "goal": c.goal, "state": c.state, "created_ms": c.created_ms})).collect::<Vec<_>>()}),
    )
}

/// The scheduler's credentials, one per running collaboration it drives (minted afresh from
/// each collaboration's record the first time a daemon drives it; never written anywhere).
#[derive(Default)]
pub struct Scheduler {
    tokens: Mutex<HashMap<String, String>>,
}

impl Scheduler {
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

    fn pass(&self, engine: &Engine, c: &CollabRow) -> Result<(), Refusal> {
        let lock = steer::lock(&c.id);
        let _held = lock.lock().expect("collaboration lock");
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
fn all_done(pack: &Pack, runs: &[CollabRunRow]) -> bool {
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
struct Cx<'a> {
    engine: &'a Engine,
    me: &'a AgentCaller,
    c: &'a CollabRow,
    spec: &'a Spec,
    pack: &'a Pack,
}

impl Cx<'_> {
    /// The blackboard as the schedule reads it: per kind, the sum of the versions of its keys
    /// (it grows with every write of the kind).
    fn versions(&self) -> Result<BTreeMap<ArtifactKind, u64>, Refusal> {
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

    fn reads_json(&self, phase: &Phase, versions: &BTreeMap<ArtifactKind, u64>) -> String {
        let m: BTreeMap<String, u64> = phase
            .reads
            .iter()
            .map(|k| (k.to_string(), versions.get(k).copied().unwrap_or(0)))
            .collect();
        serde_json::to_string(&m).expect("a map serializes")
    }

    /// A phase whose newest run failed on exactly the inputs there are now waits for new
    /// ones (part 2's fix loop brings them; until then the person reruns it).
    fn failed_on_these_inputs(
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
    fn ready(&self, runs: &[CollabRunRow], versions: &BTreeMap<ArtifactKind, u64>) -> Vec<String> {
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
    fn begin_approval(
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

    fn put(&self, row: &CollabRunRow) -> Result<(), Refusal> {
        self.engine.collab_run_put(self.me, row.clone())
    }

    /// Start a run of `phase`: into the approval queue, or dispatched.
    fn begin(
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
    fn plan(&self, phase: &Phase) -> Result<Option<CollabRunRow>, Refusal> {
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
    fn plan_task(
        &self,
        phase: &Phase,
        agent: &str,
        row: &mut CollabRunRow,
    ) -> Result<String, Refusal> {
        if let Some(t) = &row.task {
            return Ok(t.clone());
        }
        self.put(row)?;
        let made = self.engine.task_create(
            self.me,
            TaskCreateArgs {
                room: self.c.room.clone(),
                title: title(&format!("plan of {}: {}", phase.name, self.c.goal)),
                to: Some(agent.to_string()),
                accept: vec![json!({"kind": "artifact", "artifact": PLAN_KIND, "key": phase.name})],
                idempotency_key: Some(format!(
                    "{}.plan:{}.{}.task",
                    self.c.id, phase.name, row.run
                )),
                ..TaskCreateArgs::default()
            },
        );
        let task = match made {
            Ok(t) => t["task"]["id"].as_str().map(String::from),
            Err(r) if is_repeat(&r) => r.detail["original_task"].as_str().map(String::from),
            Err(r) => return Err(r),
        }
        .ok_or_else(|| {
            Refusal::storage(format!("the plan of {}: its task has no id", phase.name))
        })?;
        row.task = Some(task.clone());
        self.put(row)?;
        Ok(task)
    }

    /// A send to `agent` on `task`, once per run (its idempotency key is the run's).
    fn send_once(
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
    fn plan_input(&self, phase: &Phase, agent: &str) -> Result<Value, Refusal> {
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
            "gives": self.spec.held_scopes.get(agent),
        }))
    }

    /// Every plan in progress moves on (a pass drives them whoever dispatched the phase).
    fn advance_plans(&self, runs: &[CollabRunRow]) -> Result<(), Refusal> {
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
    fn input(&self, phase: &Phase) -> Result<Value, Refusal> {
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
                json!({"panel": p.name, "run": run, "seats": seats})
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
    fn answer_asks(&self, runs: &mut [CollabRunRow]) -> Result<(), Refusal> {
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
    fn held(&self, role: &str) -> Result<Option<Hold>, Refusal> {
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
    fn input_for(&self, phase: &Phase, row: &CollabRunRow) -> Result<Value, Refusal> {
        let mut v = self.input(phase)?;
        if let Some(fix) = fix_text(row) {
            v["fix"] = json!(fix);
        }
        Ok(v)
    }

    /// Dispatch an agent phase (a task to its role's child and a send that wakes it) or run
    /// a gate (a task the orchestrator claims and closes on its commands).
    fn dispatch(
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
    fn assign(
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
    fn assign_to(
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
            Ok(_) => {}
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
    fn panel(
        &self,
        phase: &Phase,
        row: &mut CollabRunRow,
        revised_prompt: Option<String>,
    ) -> Result<(), Refusal> {
        let runs = self.engine.collab_runs(self.me, &self.c.id)?;
        let deadline_ms = phase
            .timeout_ms
            .unwrap_or(room_collab::pack::PANEL_TIMEOUT_MS_DEFAULT);
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
        self.join(phase, row)
    }

    /// A panel's debate round (`debate = true`): each seat that wrote findings is given the
    /// others' findings once (a seat run `<phase>@<seat>.debate`, the same run number), to
    /// revise its own (a new version under its key) or keep them; settled like the first
    /// round (failed, timed out and blocked shown, never dropped). Whether it has settled.
    fn debate(
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
                    None => found.insert(self.engine.collab_findings(
                        self.me,
                        &self.c.id,
                        &phase.seats(),
                    )?),
                };
                let others: Vec<String> = found
                    .iter()
                    .filter(|(k, _)| k != seat)
                    .map(|(k, v)| format!("Reviewer {k}'s findings:\n{}", v["content"]))
                    .collect();
                let text = format!(
                    "Debate round of the review panel {}: the other reviewers' findings follow, given to you once. \
Revise your own findings if they change your view (artifact_put kind findings, key {seat}, expected_version the newest), or keep them as they are; then done.\n\n{}",
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

    /// The barrier has joined: the blocking findings (any reviewer's) go back to the
    /// implementer as a fix run, until the panel's loop cap; none left, the panel is done.
    /// The collaboration never merges: a clean panel leads to the person's approval.
    fn join(&self, phase: &Phase, row: &mut CollabRunRow) -> Result<(), Refusal> {
        let found = self
            .engine
            .collab_findings(self.me, &self.c.id, &phase.seats())?;
        let by_seat: BTreeMap<String, Value> = found
            .into_iter()
            .map(|(k, v)| (k, v["content"].clone()))
            .collect();
        let merged = room_collab::panel::merge(&by_seat);
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
    fn settle_seat(&self, s: &mut CollabRunRow, deadline_ms: u64) -> Result<(), Refusal> {
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
            _ => return Ok(()),
        };
        s.state = to.into();
        s.ended_ms = Some(self.engine.now_ms());
        self.put(s)
    }

    /// A gate: a task the orchestrator claims and closes, its commands run as `command`
    /// acceptance. Resumable like an assignment: the task carries the run's idempotency key,
    /// and a run found `dispatching` or `running` after a crash closes the task it has.
    fn gate(&self, phase: &Phase, row: &mut CollabRunRow) -> Result<(), Refusal> {
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
        if status == "open" {
            self.engine.task_claim(self.me, &task, None)?;
        }
        let closed = if status == "done" {
            Ok(Value::Null)
        } else if let Err(why) = self.gate_tree() {
            // the diff under review cannot be laid on the base: the gate fails, measured on
            // nothing (its task stays claimed; a rerun builds the tree again)
            tracing::warn!("collaboration {}: gate {}: {why}", self.c.id, phase.name);
            Err(Refusal::new(Code::TaskAcceptanceFailed, why))
        } else {
            self.act(|| {
                self.engine.turn(
                    self.me,
                    Verb::Done,
                    TurnArgs {
                        room: self.c.room.clone(),
                        task: Some(task.clone()),
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
    fn gate_tree(&self) -> Result<(), String> {
        let Some(trees) = self
            .engine
            .collab_trees(&self.c.id)
            .map_err(|r| r.message.clone())?
        else {
            return Ok(());
        };
        let project = self
            .c
            .project
            .as_deref()
            .ok_or("a collaboration with trees has a project")?;
        let root = self
            .engine
            .revalidate_project(project)
            .map_err(|r| r.message.clone())?
            .canonical_root;
        let diff = self
            .engine
            .collab_gate_diff(self.me, &self.c.id)
            .map_err(|r| r.message.clone())?;
        // no diff yet: the gate measures the base as it is
        let patch = diff
            .as_ref()
            .and_then(|d| d["content"]["patch"].as_str())
            .unwrap_or_default();
        let base = room_exec::tree::Base {
            commit: trees.base.clone(),
            source: if trees.source == "git" { "git" } else { "copy" },
            tree: std::path::PathBuf::from(&trees.base_tree),
            uncommitted: trees.uncommitted,
        };
        let dir = trees_dir(self.engine, &self.c.id);
        room_exec::tree::make_gate_tree(std::path::Path::new(&root), &dir, &base, patch)?;
        Ok(())
    }

    /// Catch up with the room, then act; a gate refusal (something arrived meanwhile) is
    /// read through and tried once more.
    fn act(&self, f: impl Fn() -> Result<Value, Refusal>) -> Result<Value, Refusal> {
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

    fn catch_up(&self) -> Result<(), Refusal> {
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

    /// Move each waiting or running run on: a task done is a run done; a task cancelled or
    /// declined is a run failed; an approval decided starts or ends its run, and one still
    /// pending is asked again with what it shows now (a changed input makes the old one
    /// stale).
    fn settle(
        &self,
        runs: &mut [CollabRunRow],
        _versions: &BTreeMap<ArtifactKind, u64>,
    ) -> Result<(), Refusal> {
        let approvals = self.engine.collab_approvals(self.me, &self.c.id)?;
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
                        _ => continue,
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
    fn finish(&self) -> Result<(), Refusal> {
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
        self.engine.collab_finish(self.me, &self.c.id, "done")?;
        remove_trees(self.engine, &self.c.id);
        Ok(())
    }
}

/// The fix loops a panel has taken before its run `run`: its runs just before it that
/// ended `fixed` (a person's rerun, or a loop that ran out, starts the count again).
fn fix_loops(runs: &[CollabRunRow], phase: &str, run: u32) -> u32 {
    let mut before: Vec<&CollabRunRow> = runs
        .iter()
        .filter(|r| r.phase == phase && r.run < run)
        .collect();
    before.sort_by_key(|r| std::cmp::Reverse(r.run));
    before.iter().take_while(|r| r.state == "fixed").count() as u32
}

/// The run name of a panel's seat: `<phase>@<seat>` (`@` is in no phase's name).
fn seat_run(phase: &str, seat: &str) -> String {
    format!("{phase}@{seat}")
}

/// A seat's run in its panel's debate round.
fn debate_run(phase: &str, seat: &str) -> String {
    format!("{phase}@{seat}{DEBATE}")
}

/// The suffix of a debate round's seat runs.
const DEBATE: &str = ".debate";

/// What holds a dispatch back: a wait (the live-worker cap: it goes once a run ends) or a
/// block (`child_auto_blocked`, `budget_exhausted`: it stays until the person acts).
enum Hold {
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
fn is_repeat(r: &Refusal) -> bool {
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
