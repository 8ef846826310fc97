//! Recording a collaboration (what `collab_start` does once everything is checked): mint the
//! orchestrator (a delegated root holding `session:read` and `session:dispatch`) and one child
//! per role the pack uses (each holding what its phases read and write; an agent
//! orchestrator's child `session:read` and `session:dispatch`; a child that plans first
//! without the write scopes its plan's approval gives, held back in the record), route each
//! child, create the collaboration's room with all of them as members, open the goal task and
//! record the collaboration with its spec. The daemon (after its checks and working trees) and
//! the simulator both record through here. A failure after the first identity is minted
//! revokes what was minted.

use crate::pack::Pack;
use crate::scheduler::{PLAN_KIND, Spec, caller, title};
use crate::{Phase, Role};
use room_core::{Refusal, Tier};
use room_engine::collab::{CollabStart, WorkTrees};
use room_engine::verbs::TaskCreateArgs;
use room_engine::{Engine, Owner};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// What is recorded: the checked pack with its text and prompts, each role's route.
pub struct Record<'a> {
    pub id: String,
    pub goal: String,
    pub project: Option<String>,
    pub pack: &'a Pack,
    pub pack_text: String,
    pub prompts: BTreeMap<String, String>,
    /// Each role's route, by role name.
    pub routes: BTreeMap<String, Value>,
    /// The bindings as given (`NAME=ADAPTER:MODEL`), kept to load the pack again.
    pub roles: Vec<String>,
    pub usd_max: Option<f64>,
    pub trees: Option<WorkTrees>,
}

/// What a recording made: the view (the collaboration's id, room, orchestrator, agents by
/// role and goal task, with the pack as data) and each child's credential as minted (a
/// daemon drops them: the children's routes get one-launch credentials; a simulator acts
/// with them).
pub struct Recorded {
    pub view: Value,
    pub tokens: BTreeMap<String, String>,
}

/// Record `r`: its identities, routes, room, goal task and record.
pub fn record(engine: &Engine, owner: &Owner, r: Record<'_>) -> Result<Recorded, Refusal> {
    let id = r.id.clone();
    let orch = format!("{id}-orch");
    let minted = engine.delegate_as_owner(
        owner,
        None,
        &orch,
        &["session:read".into(), "session:dispatch".into()],
        Some(Tier::Coordinator),
    )?;
    let token = minted["token"].as_str().unwrap_or_default().to_string();
    let out = mint_and_record(engine, owner, &orch, &token, r);
    if out.is_err() {
        let _ = engine.revoke(owner, &orch);
    }
    out
}

fn mint_and_record(
    engine: &Engine,
    owner: &Owner,
    orch: &str,
    token: &str,
    r: Record<'_>,
) -> Result<Recorded, Refusal> {
    let id = r.id;
    let mut agents = BTreeMap::new();
    let mut held_scopes = BTreeMap::new();
    let mut tokens = BTreeMap::new();
    for role in &r.pack.profile.roles {
        let name = format!("{id}-{}", role.name);
        let tier = Tier::parse(&role.policy.tier).unwrap_or(Tier::Member);
        let (scopes, held) = scopes_split(r.pack, role);
        let minted = engine.delegate_as_owner(
            owner,
            Some(orch),
            &name,
            &scopes,
            Some(tier.min(Tier::Member)),
        )?;
        tokens.insert(
            name.clone(),
            minted["token"].as_str().unwrap_or_default().to_string(),
        );
        if !held.is_empty() {
            held_scopes.insert(name.clone(), held);
        }
        let route = r.routes.get(&role.name).ok_or_else(|| {
            Refusal::invalid("routes", format!("no route for role {}", role.name))
        })?;
        engine.route_set(owner, &name, route)?;
        agents.insert(role.name.clone(), name);
    }
    let mut members: Vec<String> = vec![orch.to_string()];
    members.extend(agents.values().cloned());
    engine.room_create(owner, &id, r.project.as_deref(), &members)?;
    let me = caller(token.to_string());
    let task = engine.task_create(
        &me,
        TaskCreateArgs {
            room: id.clone(),
            title: title(&format!("goal: {}", r.goal)),
            to: Some(orch.to_string()),
            coordination_only: true,
            ..TaskCreateArgs::default()
        },
    )?;
    let goal_task = task["task"]["id"].as_str().unwrap_or_default().to_string();
    let spec = Spec {
        pack: r.pack_text,
        prompts: r.prompts,
        roles: r.roles,
        agents: agents.clone(),
        goal_task: goal_task.clone(),
        usd_max: r.usd_max,
        held_scopes,
    };
    engine.collab_record(
        owner,
        CollabStart {
            id: id.clone(),
            room: id.clone(),
            project: r.project.clone(),
            goal: r.goal.clone(),
            orchestrator: orch.to_string(),
            spec: serde_json::to_value(&spec).expect("a spec serializes"),
            trees: r.trees,
        },
    )?;
    Ok(Recorded {
        view: json!({"collab": id, "room": id, "orchestrator": orch, "agents": agents,
            "goal_task": goal_task, "pack": r.pack.view()}),
        tokens,
    })
}

/// The scopes a role's child holds: what its phases read and write, and the project access
/// its policy gives.
pub fn scopes_of(pack: &Pack, role: &Role) -> Vec<String> {
    // an agent orchestrator reads the collaboration's state and dispatches, nothing more
    if role.name == crate::pack::ORCHESTRATOR {
        return vec!["session:dispatch".into(), "session:read".into()];
    }
    let mut out = Vec::new();
    if pack.phases.iter().any(|p| p.judged_by(&role.name)) {
        out.push(format!(
            "artifact:write:{}",
            crate::scheduler::SYNTHESIS_KIND
        ));
    }
    for p in pack.phases.iter().filter(|p| p.run_by(&role.name)) {
        out.extend(p.reads.iter().map(|k| format!("artifact:read:{k}")));
        out.extend(p.writes.iter().map(|k| format!("artifact:write:{k}")));
    }
    match role.policy.project {
        crate::profile::ProjectAccess::None => {}
        crate::profile::ProjectAccess::Read => out.push("project:read".into()),
        crate::profile::ProjectAccess::Write => {
            out.extend(["project:read".into(), "project:write".into()])
        }
    }
    if executes(role) {
        out.push("tools:execute".into());
    }
    out.sort();
    out.dedup();
    out
}

/// Whether a role's agent may run programs with its backend's own tools (`tools:execute`):
/// its policy names `execute`, or names no kinds and the role writes the project.
pub fn executes(role: &Role) -> bool {
    if role.policy.tools.is_empty() {
        role.policy.project == crate::profile::ProjectAccess::Write
    } else {
        role.policy.tools.iter().any(|t| t == "execute")
    }
}

/// What a role's child holds at start, and what is held back, per planned phase, until that
/// phase's plan is approved: a role running a phase with `plan = true` may write its plan
/// and nothing that phase writes (but what its phases that plan nothing write), nor the
/// project while every phase it runs plans first.
pub fn scopes_split(pack: &Pack, role: &Role) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let full = scopes_of(pack, role);
    let runs = |p: &&Phase| p.run_by(&role.name);
    let planned: Vec<&Phase> = pack.phases.iter().filter(runs).filter(|p| p.plan).collect();
    if planned.is_empty() {
        return (full, BTreeMap::new());
    }
    // what the role's phases that plan nothing write, it holds from the start
    let unplanned: Vec<&Phase> = pack
        .phases
        .iter()
        .filter(runs)
        .filter(|p| !p.plan)
        .collect();
    let needed = |scope: &str| {
        unplanned.iter().any(|p| {
            p.writes
                .iter()
                .any(|k| scope == format!("artifact:write:{k}"))
        })
    };
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &planned {
        let mut mine: Vec<String> = p
            .writes
            .iter()
            .map(|k| format!("artifact:write:{k}"))
            .filter(|s| full.contains(s) && !needed(s))
            .collect();
        // the project is written by the role's phases: held while every one of them plans
        if unplanned.is_empty() {
            for s in ["project:write", "tools:execute"] {
                if full.iter().any(|h| h == s) {
                    mine.push(s.into());
                }
            }
        }
        mine.sort();
        held.insert(p.name.clone(), mine);
    }
    let all_held: Vec<&String> = held.values().flatten().collect();
    let mut now: Vec<String> = full
        .iter()
        .filter(|s| !all_held.contains(s))
        .cloned()
        .collect();
    now.push(format!("artifact:write:{PLAN_KIND}"));
    now.sort();
    now.dedup();
    (now, held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn pack(text: &str) -> Pack {
        let mut p = Pack::load(text, &Profile::default()).unwrap();
        p.bind_roles("roles", &["reasoning=script:a".into()])
            .unwrap();
        p.keep_used_roles();
        p
    }

    const TWO_PLANNED: &str = "name = \"x\"\n\n[[phases]]\nname = \"a\"\nkind = \"agent\"\nrole = \"reasoning\"\nwrites = [\"spec\"]\nplan = true\n\n[[phases]]\nname = \"b\"\nkind = \"agent\"\nrole = \"reasoning\"\nreads = [\"spec\"]\nwrites = [\"diff\"]\nplan = true\n";

    #[test]
    fn each_planned_phase_holds_back_its_own_writes() {
        let p = pack(TWO_PLANNED);
        let role = p.profile.role("reasoning").unwrap();
        let (now, held) = scopes_split(&p, role);
        assert_eq!(
            held["a"],
            ["artifact:write:spec", "project:write", "tools:execute"]
        );
        assert_eq!(
            held["b"],
            ["artifact:write:diff", "project:write", "tools:execute"]
        );
        assert!(now.contains(&"artifact:write:extra/plan".to_string()));
        assert!(
            !now.iter()
                .any(|s| s == "artifact:write:diff" || s == "project:write")
        );
        // a phase that plans nothing keeps what it writes, and the project, from the start
        let one = TWO_PLANNED.replacen("plan = true\n", "", 1);
        let p = pack(&one);
        let (now, held) = scopes_split(&p, p.profile.role("reasoning").unwrap());
        assert_eq!(held["b"], ["artifact:write:diff"]);
        assert!(now.contains(&"project:write".to_string()), "{now:?}");
        assert!(now.contains(&"tools:execute".to_string()), "{now:?}");
        assert!(now.contains(&"artifact:write:spec".to_string()), "{now:?}");
    }
}
