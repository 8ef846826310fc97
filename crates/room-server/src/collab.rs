//! Collaborations in the daemon (DESIGN.md §7, issue 41): `start` sets one up from a pack and
//! its role bindings; the owner's views (`status`, `list`) and `rerun`; the daemon's working
//! trees (`DaemonHost`, `room_exec::tree`) for the scheduler, which is the collaboration
//! floor's (`room_collab::scheduler`: the pass, acting as each collaboration's orchestrator
//! through the engine; `room_collab::steer`: an agent orchestrator's tools). Authority is the
//! engine's throughout: the owner's standing starts and decides.
//!
//! A start mints the orchestrator and one child per role the pack's phases use (each holding
//! `artifact:read:K` for what its phases read and `artifact:write:K` for what they write;
//! an agent orchestrator's child `session:read` and `session:dispatch`; a child that plans
//! first, without the write scopes its plan's approval gives), gives each child a route from
//! its binding (an implementing process a working tree of its own), creates the
//! collaboration's room (bound to the project) with all of them as members, opens the goal
//! task and records the collaboration. `steer` keeps an agent orchestrator's turns (what it
//! said and dispatched in one launch) and flags a dispatch announced but not made.

#[path = "collab_steer.rs"]
pub mod steer;

use room_collab::Phase;
use room_collab::pack::{DEFAULT_PACK, DEFAULT_PROMPTS, Pack, PhaseKind};
use room_collab::profile::Backends;
use room_collab::scheduler::{
    Host, Spec, debate_run, fix_loops, guards_view, load, run_view, seat_run,
};
use room_core::{Code, Refusal};
use room_engine::{Engine, Owner};
use room_store::control::{ApprovalRow, CollabRow, CollabRunRow};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// How often the scheduler passes over the running collaborations when nothing announces a
/// change sooner (every call that may move a room does).
pub const TICK_MS: u64 = 200;
/// The longest goal.
pub const GOAL_BYTES_MAX: usize = 4096;
/// Role bindings one start names at most.
pub const BINDINGS_MAX: usize = 32;

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
                "acp" => {
                    r["preset"] = json!(role.preset);
                    acp_permissions(role, &mut r);
                }
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

/// An ACP role's agent is allowed, when it asks, the tool kinds its policy names (none named:
/// every kind but `fetch` for a role that reaches no network), unless the owner's backend
/// says otherwise; each launch narrows that by its child's scopes (edits need
/// `project:write`, programs `tools:execute`: `LaunchAccess`).
fn acp_permissions(role: &room_collab::Role, route: &mut Value) {
    if route.get("permissions").is_none() {
        route["permissions"] = json!("allow_once");
    }
    if route.get("tool_kinds").is_some() {
        return;
    }
    let kinds: Vec<&str> = if role.policy.tools.is_empty() {
        room_engine::policy::ACP_TOOL_KINDS
            .into_iter()
            .filter(|k| role.policy.network || *k != "fetch")
            .collect()
    } else {
        role.policy.tools.iter().map(String::as_str).collect()
    };
    route["tool_kinds"] = json!(kinds);
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

/// The daemon as the scheduler's host: the working trees (`room_exec::tree`, beneath
/// `<state>/trees/<collab>/`) and a thread per gate measured (with the engine's handle; a
/// tool call's host has none, and leaves a gate it begins to the next pass).
pub struct DaemonHost {
    engine: Option<std::sync::Arc<Engine>>,
}

impl DaemonHost {
    /// The host of a steering tool call: trees, no gate measured.
    pub fn for_tools() -> std::sync::Arc<dyn Host> {
        std::sync::Arc::new(DaemonHost { engine: None })
    }
}

impl Host for DaemonHost {
    fn gate_tree(
        &self,
        engine: &Engine,
        c: &CollabRow,
        trees: &room_engine::collab::WorkTrees,
        patch: &str,
    ) -> Result<(), String> {
        let project = c
            .project
            .as_deref()
            .ok_or("a collaboration with trees has a project")?;
        let root = engine
            .revalidate_project(project)
            .map_err(|r| r.message.clone())?
            .canonical_root;
        let base = room_exec::tree::Base {
            commit: trees.base.clone(),
            source: if trees.source == "git" { "git" } else { "copy" },
            tree: std::path::PathBuf::from(&trees.base_tree),
            uncommitted: trees.uncommitted,
        };
        let dir = trees_dir(engine, &c.id);
        room_exec::tree::make_gate_tree(std::path::Path::new(&root), &dir, &base, patch)?;
        Ok(())
    }

    fn remove(&self, engine: &Engine, id: &str) {
        remove_trees(engine, id);
    }

    fn spawn(&self, engine: &Engine, job: room_collab::scheduler::Job) {
        let Some(mine) = self.engine.clone() else {
            return job(engine);
        };
        // a thread per gate measured: bounded by the collaborations' gates in flight (one
        // per gate phase's run), each ending with its commands' timeouts
        let started = std::thread::Builder::new()
            .name("room-gate".into())
            .spawn(move || job(&mine));
        if let Err(e) = started {
            tracing::error!("a gate's thread did not start: {e}");
        }
    }

    fn measures_gates(&self) -> bool {
        self.engine.is_some()
    }

    fn sent(&self) {
        crate::dispatch::changes().send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The daemon's scheduler: `room_collab::scheduler` on the daemon as its host.
pub fn scheduler(engine: std::sync::Arc<Engine>) -> room_collab::scheduler::Scheduler {
    room_collab::scheduler::Scheduler::new(std::sync::Arc::new(DaemonHost {
        engine: Some(engine),
    }))
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
    let recorded = room_collab::start::record(
        engine,
        owner,
        room_collab::start::Record {
            id: id.to_string(),
            goal,
            project,
            pack: &pack,
            pack_text,
            prompts,
            routes,
            roles,
            usd_max,
            trees: trees.clone(),
        },
    )?;
    let mut out = recorded.view;
    out["advisory"] = json!(advisory(&pack));
    out["capabilities"] = json!(
        pack.profile
            .roles
            .iter()
            .map(|r| json!({"role": r.name, "adapter": r.adapter,
            "capabilities": room_agents::coverage::capabilities(&r.adapter)}))
            .collect::<Vec<_>>()
    );
    out["trees"] = trees_view(trees.as_ref());
    Ok(out)
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
                        "state": state, "runs": mine.len(), "after": ph.after,
                        "reads": ph.reads.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                        "writes": ph.writes.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
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
        "flags": room_collab::steer::flags(&runs),
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
    let judge = ph.judge.as_ref().map(|j| {
        let r = runs
            .iter()
            .find(|r| r.phase == format!("judge@{}", ph.name) && r.run == run);
        let synthesis = engine
            .artifact_get_owner(
                owner,
                room,
                room_collab::scheduler::SYNTHESIS_KIND,
                Some(&ph.name),
                None,
            )
            .ok();
        json!({"role": j, "agent": spec.and_then(|s| s.agents.get(j)),
            "state": r.map_or("waiting", |r| r.state.as_str()),
            "task": r.and_then(|r| r.task.clone()),
            "synthesis": synthesis.map(|v| json!({"version": v["version"], "content": v["content"]}))})
    });
    json!({"run": run, "distinct": ph.distinct.as_str(), "seats": seats, "judge": judge,
        "merged": room_collab::panel::merge(&by_seat)})
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

/// `collab_profile`: what a create dialog offers: the default pack's seats (each role an agent
/// phase runs, each panel seat) with the phases each serves, the orchestrator seat, the
/// adapters with their capability matrix, the ACP presets and the owner's model routes.
pub fn profile(engine: &Engine, _owner: &Owner) -> Result<Value, Refusal> {
    let pack = Pack::default_pack();
    let mut seats: Vec<(String, Vec<String>)> = Vec::new();
    let mut add = |seat: String, phase: &str| match seats.iter_mut().find(|(s, _)| *s == seat) {
        Some((_, phases)) => phases.push(phase.to_string()),
        None => seats.push((seat, vec![phase.to_string()])),
    };
    for ph in &pack.phases {
        match ph.kind {
            PhaseKind::Panel => ph.seats().into_iter().for_each(|s| add(s, &ph.name)),
            _ => {
                if let Some(r) = &ph.role {
                    add(r.clone(), &ph.name);
                }
            }
        }
        if let Some(j) = &ph.judge {
            add(j.clone(), &format!("judge@{}", ph.name));
        }
    }
    let policy = engine.policy();
    Ok(json!({
        "pack": pack.name,
        "seats": seats.iter().map(|(s, p)| json!({"seat": s, "phases": p})).collect::<Vec<_>>(),
        "orchestrator": room_collab::pack::ORCHESTRATOR,
        "adapters": room_agents::coverage::all(),
        "presets": room_agents::acp::PRESETS.iter().map(|p| p.name).collect::<Vec<_>>(),
        "model_routes": policy.model_routes.keys().collect::<Vec<_>>(),
    }))
}
