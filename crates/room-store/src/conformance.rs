//! The storage conformance suite: what every [`Backend`] promises the engine, written once
//! against the traits. A backend's tests run every case here through a [`Harness`] that makes
//! a fresh store and reopens it (see `backend::tests` for SQLite; the `cases!` list keeps a new
//! case from being forgotten by a backend). Each case covers the operations, the errors they
//! map to, and the durability promises a test can reach: a write that returned is there after
//! reopening, and a failed write leaves no partial row.

use crate::backend::{Backend, ShardCreated};
use crate::control::{
    AgentRow, ApprovalRow, CollabRow, CollabRunRow, CompositionRow, ProjectRow, RoomRow, TaskRow,
    WakeRow,
};
use crate::index::{
    ArtifactRow, Batch, CheckpointRow, EventRow, FoldAdvance, ItemKind, ItemRow, LifecycleChange,
    LogTrust, ReceiptRow,
};
use crate::journal::ChainPos;
use room_core::chain::ChainTip;
use room_core::event::SeqWitness;
use room_core::{Hlc, Record, Sealed, TaskStatus};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Makes and reopens one store under test.
pub trait Harness {
    /// A new, empty store.
    fn fresh(&mut self) -> Arc<dyn Backend>;
    /// The same store, opened again; the caller has dropped every handle of the last one.
    fn reopen(&mut self) -> Arc<dyn Backend>;
}

/// One case of the suite.
pub type Case = fn(&mut dyn Harness);

/// Every case, by name, for a backend's test module: `for (name, case) in CASES`.
pub const CASES: &[(&str, Case)] = &[
    ("control_agents", control_agents),
    ("control_identity_tree", control_identity_tree),
    ("control_rooms_and_members", control_rooms_and_members),
    (
        "control_failed_write_leaves_nothing",
        control_failed_write_leaves_nothing,
    ),
    ("control_tasks", control_tasks),
    ("control_task_leases_by_scope", control_task_leases_by_scope),
    ("control_task_terms", control_task_terms),
    ("control_stage_pin_moves", control_stage_pin_moves),
    ("index_source_reads", index_source_reads),
    (
        "control_task_specs_and_checks",
        control_task_specs_and_checks,
    ),
    ("control_wakes", control_wakes),
    ("control_launches", control_launches),
    ("control_cancel_and_holds", control_cancel_and_holds),
    ("control_collaborations", control_collaborations),
    ("control_compositions", control_compositions),
    ("control_change_stamp", control_change_stamp),
    (
        "shard_creation_is_whole_or_nothing",
        shard_creation_is_whole_or_nothing,
    ),
    ("control_room_lifecycle", control_room_lifecycle),
    ("log_append_scan_and_reopen", log_append_scan_and_reopen),
    ("log_refuses_a_broken_chain", log_refuses_a_broken_chain),
    (
        "log_verifies_ranges_and_cuts_keeping_the_rest",
        log_verifies_ranges_and_cuts_keeping_the_rest,
    ),
    (
        "index_trust_and_witnesses_survive_reopen",
        index_trust_and_witnesses_survive_reopen,
    ),
    ("control_room_witnesses", control_room_witnesses),
    ("index_projection", index_projection),
    ("index_audience", index_audience),
    ("index_artifacts", index_artifacts),
    ("index_search", index_search),
    ("index_embeddings", index_embeddings),
    ("index_idempotency_fifo", index_idempotency_fifo),
    (
        "index_sync_state_survives_reopen_and_rebuild",
        index_sync_state_survives_reopen_and_rebuild,
    ),
    ("index_invariant_state", index_invariant_state),
    (
        "index_task_records_citations_and_readers",
        index_task_records_citations_and_readers,
    ),
    (
        "index_folds_and_receipt_chains",
        index_folds_and_receipt_chains,
    ),
    ("blobs", blobs),
    (
        "writer_guard_serializes_one_room",
        writer_guard_serializes_one_room,
    ),
];

fn agent(name: &str, secret: &str) -> AgentRow {
    AgentRow {
        name: name.into(),
        secret_sha256: secret.into(),
        registration_sha256: format!("reg-{secret}"),
        generation: 1,
        max_tier: "member".into(),
        host_kind: "generic".into(),
        created_ms: 10,
        revoked_ms: None,
        parent: None,
        scopes: None,
        revoked_by: None,
    }
}

fn room(name: &str, project: Option<&str>) -> RoomRow {
    RoomRow {
        name: name.into(),
        graph_id: format!("g_{name}"),
        project_id: project.map(String::from),
        created_ms: 20,
        revision: 0,
        reset_gen: 0,
        reset_ms: None,
        admission_gen: 0,
        admission_open: true,
        archived_ms: None,
        cancel_gen: 0,
        cancelled: false,
    }
}

fn project(id: &str, root: &str) -> ProjectRow {
    ProjectRow {
        id: id.into(),
        name: id.into(),
        requested_root: root.into(),
        canonical_root: root.into(),
        dev: 1,
        ino: 2,
        mnt_id: 3,
        opened_ms: 5,
    }
}

fn task(id: &str, room: &str, project: Option<&str>, scopes: &[&str]) -> TaskRow {
    TaskRow {
        id: id.into(),
        room: room.into(),
        project_id: project.map(String::from),
        title: format!("title {id}"),
        owner: "alpha".into(),
        recipient: Some("beta".into()),
        parent: None,
        status: TaskStatus::Open,
        created_ms: 30,
        updated_ms: 30,
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        requirements: Vec::new(),
        acceptance: Vec::new(),
        coordination_only: false,
        lease_gen: None,
        lease_held: false,
        revision: 0,
        claim_pin: None,
        override_reason: None,
        successor: None,
        governed: false,
        parent_revision: None,
        stage: Vec::new(),
    }
}

/// Agents: insert, look up by name and secret, rotate, revoke, policy; all after a reopen.
pub fn control_agents(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_agent(&agent("beta", "s-b")).unwrap();
        c.insert_agent(&agent("alpha", "s-a")).unwrap();
        assert!(
            c.insert_agent(&agent("alpha", "s-x")).is_err(),
            "names are unique"
        );
        assert!(
            c.insert_agent(&agent("gamma", "s-a")).is_err(),
            "secrets are unique"
        );
        assert_eq!(c.agent_by_secret("s-x").unwrap(), None);
        let names: Vec<String> = c.agents().unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(
            names,
            ["alpha", "beta"],
            "in name order, nothing of the refused"
        );
        let a = c.agent("alpha").unwrap().unwrap();
        c.replace_secret(&a, "s-a2", "reg-2", 40).unwrap();
        assert_eq!(c.agent_by_secret("s-a").unwrap(), None);
        assert_eq!(c.agent_by_secret("s-a2").unwrap().unwrap().generation, 2);
        assert_eq!(
            c.retired_secret("s-a").unwrap(),
            Some(("alpha".into(), "rotated".into()))
        );
        let b = c.agent("beta").unwrap().unwrap();
        c.revoke(&b, 50).unwrap();
        c.set_max_tier("alpha", "operator").unwrap();
        c.set_verb_denied("alpha", "send", true).unwrap();
        c.set_verb_denied("alpha", "note", true).unwrap();
        c.set_verb_denied("alpha", "note", false).unwrap();
        assert_eq!(c.agent("nobody").unwrap(), None);
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let a = c.agent("alpha").unwrap().unwrap();
    assert_eq!(
        (a.secret_sha256.as_str(), a.max_tier.as_str()),
        ("s-a2", "operator")
    );
    assert_eq!(c.denied_verbs("alpha").unwrap(), ["send"]);
    assert_eq!(c.agent("beta").unwrap().unwrap().revoked_ms, Some(50));
    assert_eq!(
        c.retired_secret("s-b").unwrap(),
        Some(("beta".into(), "revoked".into()))
    );
    assert_eq!(c.control_epoch().unwrap(), 1);
}

/// The delegated identity tree: a node's parent and scopes come back as written; revoking a
/// node revokes its whole subtree at once (and nothing beside it), each naming the node that
/// revoked it, and an already revoked node keeps its own record; all after a reopen.
pub fn control_identity_tree(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_agent(&agent("owner-root", "s-r")).unwrap();
        let child = |name: &str, parent: &str, secret: &str| AgentRow {
            parent: Some(parent.into()),
            scopes: Some(vec!["session:read".into()]),
            ..agent(name, secret)
        };
        c.insert_agent(&child("orch", "owner-root", "s-o")).unwrap();
        c.insert_agent(&child("role-a", "orch", "s-a")).unwrap();
        c.insert_agent(&child("role-b", "orch", "s-b")).unwrap();
        c.insert_agent(&child("sub-a", "role-a", "s-sa")).unwrap();
        c.insert_agent(&child("beside", "owner-root", "s-x"))
            .unwrap();
        // scopes widened in place (a plan approved), read back through the cache and the
        // credential alike
        let wider = vec![
            "session:read".to_string(),
            "artifact:write:diff".to_string(),
        ];
        c.set_scopes("beside", &wider).unwrap();
        assert_eq!(
            c.agent("beside").unwrap().unwrap().scopes,
            Some(wider.clone())
        );
        assert_eq!(
            c.agent_by_secret("s-x").unwrap().unwrap().scopes,
            Some(wider)
        );
        let b = c.agent("role-b").unwrap().unwrap();
        c.revoke(&b, 20).unwrap();
        let mut revoked = c.revoke_subtree("orch", 30, 4).unwrap();
        revoked.sort();
        assert_eq!(
            revoked,
            ["orch", "role-a", "sub-a"],
            "role-b was revoked before"
        );
        assert_eq!(
            c.agent_by_secret("s-sa").unwrap().unwrap().revoked_ms,
            Some(30)
        );
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let a = c.agent("sub-a").unwrap().unwrap();
    assert_eq!(a.parent.as_deref(), Some("role-a"));
    assert_eq!(a.scopes, Some(vec!["session:read".to_string()]));
    assert_eq!(
        (a.revoked_ms, a.revoked_by.as_deref()),
        (Some(30), Some("orch"))
    );
    let b = c.agent("role-b").unwrap().unwrap();
    assert_eq!(
        (b.revoked_ms, b.revoked_by.as_deref()),
        (Some(20), Some("role-b"))
    );
    assert_eq!(
        c.agent("beside").unwrap().unwrap().scopes,
        Some(vec![
            "session:read".to_string(),
            "artifact:write:diff".to_string()
        ])
    );
    assert_eq!(c.agent("beside").unwrap().unwrap().revoked_ms, None);
    assert_eq!(c.agent("owner-root").unwrap().unwrap().revoked_ms, None);
    assert_eq!(c.agent("owner-root").unwrap().unwrap().scopes, None);
    assert_eq!(
        c.retired_secret("s-a").unwrap(),
        Some(("role-a".into(), "revoked".into()))
    );
}

/// Projects, rooms and rosters: membership bumps the revision, a reset replays as a no-op,
/// the view generation is recomputed only after a change.
pub fn control_rooms_and_members(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        for n in ["alpha", "beta", "gamma"] {
            c.insert_agent(&agent(n, &format!("s-{n}"))).unwrap();
        }
        c.insert_project(&project("prj_1", "/p/one")).unwrap();
        assert!(
            c.insert_project(&project("prj_2", "/p/one")).is_err(),
            "one grant per canonical root"
        );
        c.insert_room(
            &room("build", Some("prj_1")),
            &["alpha".into(), "beta".into()],
        )
        .unwrap();
        c.insert_room(&room("chat", None), &[]).unwrap();
        assert!(
            c.insert_room(&room("chat", None), &[]).is_err(),
            "room names are unique"
        );
        assert!(c.is_member("build", "alpha").unwrap());
        assert!(!c.is_member("build", "gamma").unwrap());
        let calls = std::cell::Cell::new(0);
        let digest = |r: &RoomRow, m: &[crate::control::MemberStanding<'_>]| {
            calls.set(calls.get() + 1);
            let names: Vec<String> = m
                .iter()
                .map(|s| {
                    let revoked = s.agent.is_some_and(|a| a.revoked_ms.is_some());
                    format!("{}{}", s.name, if revoked { "!" } else { "" })
                })
                .collect();
            format!(
                "{}:{}:{}:{}",
                r.revision,
                r.reset_gen,
                r.admission_gen,
                names.join(",")
            )
        };
        assert_eq!(c.view_gen("build", &digest).unwrap(), "0:0:0:alpha,beta");
        assert_eq!(c.view_gen("build", &digest).unwrap(), "0:0:0:alpha,beta");
        assert_eq!(calls.get(), 1, "cached until the room changes");
        assert!(c.add_member("build", "gamma").unwrap());
        assert!(!c.add_member("build", "gamma").unwrap(), "already a member");
        assert_eq!(
            c.view_gen("build", &digest).unwrap(),
            "1:0:0:alpha,beta,gamma"
        );
        // a member's standing is part of the view: a revocation moves it
        let beta = c.agent("beta").unwrap().unwrap();
        c.revoke(&beta, 60).unwrap();
        assert_eq!(
            c.view_gen("build", &digest).unwrap(),
            "1:0:0:alpha,beta!,gamma"
        );
        c.reset_room_at("build", 7, 70).unwrap();
        c.reset_room_at("build", 5, 50).unwrap();
        // admission closes and opens by generation; a replay of an older one is a no-op
        c.set_admission("build", 9, false).unwrap();
        c.set_admission("build", 8, true).unwrap();
        assert_eq!(
            c.view_gen("build", &digest).unwrap(),
            "3:7:9:alpha,beta!,gamma"
        );
        assert_eq!(c.view_gen("nowhere", &digest), None);
        // the control epoch is part of every view (the engine's digest reads it): moving it
        // computes each view again, never serving one cached under the old epoch
        for engaged in [true, false] {
            let before = calls.get();
            c.set_break_glass(engaged).unwrap();
            c.view_gen("build", &digest).unwrap();
            assert_eq!(
                calls.get(),
                before + 1,
                "an epoch move computes the view again"
            );
            c.view_gen("build", &digest).unwrap();
            assert_eq!(calls.get(), before + 1, "and caches it under the new epoch");
        }
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let r = c.room("build").unwrap().unwrap();
    assert_eq!((r.revision, r.reset_gen, r.reset_ms), (3, 7, Some(70)));
    assert_eq!((r.admission_gen, r.admission_open), (9, false));
    assert_eq!(c.members("build").unwrap(), ["alpha", "beta", "gamma"]);
    let names: Vec<String> = c.rooms().unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["build", "chat"]);
    assert_eq!(
        c.project("prj_1").unwrap().unwrap().canonical_root,
        "/p/one"
    );
    assert_eq!(c.projects().unwrap().len(), 1);
    assert_eq!(c.room("nowhere").unwrap(), None);
}

/// A write that fails (a roster naming an unknown agent, a room of an unknown project) leaves
/// no row behind, in the handle that failed and after a reopen.
pub fn control_failed_write_leaves_nothing(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_agent(&agent("alpha", "s-a")).unwrap();
        let before = c.change_stamp().unwrap();
        assert!(
            c.insert_room(&room("r", None), &["alpha".into(), "ghost".into()])
                .is_err()
        );
        assert!(c.insert_room(&room("p", Some("prj_missing")), &[]).is_err());
        assert_eq!(c.room("r").unwrap(), None);
        assert_eq!(c.room("p").unwrap(), None);
        assert!(c.members("r").unwrap().is_empty());
        assert!(
            c.insert_task(&task("tsk_1", "nowhere", None, &[])).is_err(),
            "a task of an unknown room"
        );
        assert_eq!(c.task("tsk_1").unwrap(), None);
        assert!(!c.is_stale(), "the cache reloaded after the failures");
        assert_ne!(
            before,
            c.change_stamp().unwrap(),
            "attempts count as writes"
        );
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    assert!(c.rooms().unwrap().is_empty());
    assert_eq!(c.task("tsk_1").unwrap(), None);
}

/// A room whose creation failed is removed with its roster (never once a task names it);
/// archiving is once; the rooms holding claims are listed.
pub fn control_room_lifecycle(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_agent(&agent("alpha", "s-a")).unwrap();
        c.insert_room(&room("gone", None), &["alpha".into()])
            .unwrap();
        c.insert_room(&room("kept", None), &[]).unwrap();
        c.insert_room(&room("idle", None), &[]).unwrap();
        assert!(c.remove_room("gone").unwrap());
        assert!(!c.remove_room("gone").unwrap(), "nothing left to remove");
        assert_eq!(c.room("gone").unwrap(), None);
        assert!(c.members("gone").unwrap().is_empty());
        c.insert_task(&task("tsk_1", "kept", None, &[])).unwrap();
        assert!(c.remove_room("kept").is_err(), "a task names it");
        assert!(c.room("kept").unwrap().is_some(), "and it is still whole");
        assert!(c.rooms_with_claims().unwrap().is_empty());
        assert_eq!(c.tasks_open_count("kept", "alpha").unwrap(), 1);
        assert_eq!(c.tasks_open_count("kept", "beta").unwrap(), 0);
        assert_eq!(c.tasks_open_count("idle", "alpha").unwrap(), 0);
        assert!(
            c.update_task(
                "tsk_1",
                TaskStatus::Open.as_str(),
                TaskStatus::Claimed.as_str(),
                None,
                5,
                None
            )
            .unwrap()
        );
        assert_eq!(c.rooms_with_claims().unwrap(), ["kept"]);
        assert_eq!(
            c.tasks_open_count("kept", "alpha").unwrap(),
            1,
            "claimed is open"
        );
        c.insert_task(&task("tsk_2", "kept", None, &[])).unwrap();
        assert!(
            c.update_task(
                "tsk_2",
                TaskStatus::Open.as_str(),
                TaskStatus::Done.as_str(),
                None,
                6,
                None
            )
            .unwrap()
        );
        assert_eq!(
            c.tasks_open_count("kept", "alpha").unwrap(),
            1,
            "done is settled"
        );
        assert!(c.archive_room("idle", 9).unwrap());
        assert!(!c.archive_room("idle", 10).unwrap(), "archived once");
        assert!(!c.archive_room("nowhere", 10).unwrap());
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    assert_eq!(c.room("idle").unwrap().unwrap().archived_ms, Some(9));
    assert_eq!(c.room("kept").unwrap().unwrap().archived_ms, None);
    let names: Vec<String> = c.rooms().unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["idle", "kept"]);
}

/// A task's requirements and acceptance checks come back as written, and its newest
/// acceptance evaluation replaces the one before; all after a reopen.
pub fn control_task_specs_and_checks(h: &mut dyn Harness) {
    use crate::control::TaskCheckRow;
    use room_core::acceptance::Check;
    let checks = vec![
        Check::FileExists {
            path: "out.txt".into(),
        },
        Check::Command {
            program: "/usr/bin/test".into(),
            args: vec!["-f".into(), "out.txt".into()],
            timeout_ms: 5_000,
            exit_code: 0,
            project_write: false,
            network: false,
        },
    ];
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_room(&room("chat", None), &[]).unwrap();
        c.insert_task(&TaskRow {
            requirements: vec!["write out.txt".into()],
            acceptance: checks.clone(),
            ..task("tsk_a", "chat", None, &[])
        })
        .unwrap();
        assert_eq!(c.task_check("tsk_a").unwrap(), None);
        for (at_ms, pass) in [(50, false), (60, true)] {
            c.record_task_check(&TaskCheckRow {
                task: "tsk_a".into(),
                at_ms,
                pass,
                evaluation: format!("{{\"at\":{at_ms}}}"),
            })
            .unwrap();
        }
        assert!(
            c.record_task_check(&TaskCheckRow {
                task: "tsk_unknown".into(),
                at_ms: 1,
                pass: true,
                evaluation: "{}".into(),
            })
            .is_err(),
            "an evaluation belongs to a task that exists"
        );
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let t = c.task("tsk_a").unwrap().unwrap();
    assert_eq!(t.requirements, ["write out.txt"]);
    assert_eq!(t.acceptance, checks);
    let last = c.task_check("tsk_a").unwrap().unwrap();
    assert_eq!((last.at_ms, last.pass), (60, true));
    assert_eq!(last.evaluation, "{\"at\":60}");
    drop(c);
    // a rebuild forgets the room's tasks and their evaluations, and only that room's
    let mut c = store.open_control().unwrap();
    c.insert_room(&room("other", None), &[]).unwrap();
    c.insert_task(&task("tsk_o", "other", None, &[])).unwrap();
    assert_eq!(c.clear_room_tasks("chat").unwrap(), 1);
    assert_eq!(c.task("tsk_a").unwrap(), None);
    assert_eq!(c.task_check("tsk_a").unwrap(), None);
    assert!(c.task("tsk_o").unwrap().is_some());
}

/// Tasks: lookup, children, compare-and-set transitions, and the live leases of a project
/// (or, outside projects, of one room).
pub fn control_tasks(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_project(&project("prj_1", "/p/one")).unwrap();
        c.insert_room(&room("build", Some("prj_1")), &[]).unwrap();
        c.insert_room(&room("test", Some("prj_1")), &[]).unwrap();
        c.insert_room(&room("chat", None), &[]).unwrap();
        c.insert_task(&task("tsk_a", "build", Some("prj_1"), &["file:src/"]))
            .unwrap();
        c.insert_task(&task("tsk_b", "test", Some("prj_1"), &["file:tests/"]))
            .unwrap();
        c.insert_task(&task("tsk_c", "chat", None, &["topic:x"]))
            .unwrap();
        c.insert_task(&TaskRow {
            parent: Some("tsk_a".into()),
            ..task("tsk_d", "build", Some("prj_1"), &[])
        })
        .unwrap();
        assert!(
            c.insert_task(&task("tsk_a", "build", None, &[])).is_err(),
            "task ids are unique"
        );
        // the scoped ones take leases of generations 1, 2 and 3; tsk_d leases nothing
        for (t, lease) in [
            ("tsk_a", Some(1)),
            ("tsk_b", Some(2)),
            ("tsk_c", Some(3)),
            ("tsk_d", None),
        ] {
            assert!(
                c.update_task(t, "open", "claimed", Some("beta"), 40, lease)
                    .unwrap()
            );
        }
        assert_eq!(c.lease_gen_max().unwrap(), 3);
        assert!(
            !c.update_task("tsk_a", "open", "done", None, 41, None)
                .unwrap(),
            "a stale compare-and-set changes nothing"
        );
        assert!(
            c.update_task("tsk_b", "claimed", "done", None, 42, None)
                .unwrap()
        );
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let a = c.task("tsk_a").unwrap().unwrap();
    assert_eq!((a.status.as_str(), a.updated_ms), ("claimed", 40));
    assert_eq!(a.scopes, ["file:src/"]);
    assert_eq!(c.task("tsk_b").unwrap().unwrap().status, TaskStatus::Done);
    // task ids by room and prefix, for completions
    let rooms = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        c.task_ids_in(&rooms(&["build", "chat"]), "tsk_", 10)
            .unwrap(),
        ["tsk_a", "tsk_c", "tsk_d"]
    );
    assert_eq!(
        c.task_ids_in(&rooms(&["build"]), "tsk_d", 10).unwrap(),
        ["tsk_d"]
    );
    assert_eq!(
        c.task_ids_in(&rooms(&["build", "test"]), "", 2).unwrap(),
        ["tsk_a", "tsk_b"],
        "bounded"
    );
    assert!(
        c.task_ids_in(&rooms(&["test"]), "tsk%", 10)
            .unwrap()
            .is_empty(),
        "a prefix is no pattern"
    );
    assert!(c.task_ids_in(&[], "", 10).unwrap().is_empty());
    let kids: Vec<String> = c
        .children("tsk_a")
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(kids, ["tsk_d"]);
    let leased = |p: Option<&str>, r: &str| -> Vec<String> {
        c.leased(p, r).unwrap().into_iter().map(|t| t.id).collect()
    };
    // claimed and scoped: tsk_d names no scope, tsk_b is done
    assert_eq!(leased(Some("prj_1"), "build"), ["tsk_a"]);
    assert_eq!(leased(None, "chat"), ["tsk_c"]);
    assert!(
        leased(None, "build").is_empty(),
        "a project's leases are not a room's"
    );
    let a = c.task("tsk_a").unwrap().unwrap();
    assert_eq!((a.lease_gen, a.lease_held), (Some(1), true));
    drop(c);
    // a lapsed lease is released by generation: a stale generation releases nothing
    let mut c = store.open_control().unwrap();
    assert!(!c.release_lease("tsk_a", 0).unwrap());
    assert!(c.release_lease("tsk_a", 1).unwrap());
    assert!(!c.release_lease("tsk_a", 1).unwrap(), "once");
    let a = c.task("tsk_a").unwrap().unwrap();
    assert_eq!(
        (a.status, a.lease_gen, a.lease_held),
        (TaskStatus::Claimed, Some(1), false)
    );
    assert!(c.leased(Some("prj_1"), "build").unwrap().is_empty());
    // a claim again takes a new generation; the highest ever issued stays the bound
    assert!(
        c.update_task("tsk_a", "claimed", "claimed", Some("beta"), 50, Some(4))
            .unwrap()
    );
    assert_eq!(
        c.leased(Some("prj_1"), "build").unwrap()[0].lease_gen,
        Some(4)
    );
    assert!(
        c.update_task("tsk_a", "claimed", "done", None, 51, None)
            .unwrap()
    );
    assert!(
        c.leased(Some("prj_1"), "build").unwrap().is_empty(),
        "done releases"
    );
    assert_eq!(c.lease_gen_max().unwrap(), 4);
    // a rebuild forgets the room's tasks, never the generations issued to them: fencing
    // numbers only go up, across a reopen too
    assert!(c.clear_room_tasks("build").unwrap() > 0);
    assert_eq!(c.lease_gen_max().unwrap(), 4);
    assert_eq!(c.clear_room_tasks("build").unwrap(), 0);
    assert_eq!(
        c.lease_gen_max().unwrap(),
        4,
        "an empty rebuild keeps the floor"
    );
    drop(c);
    let c = h.reopen().open_control().unwrap();
    assert_eq!(c.lease_gen_max().unwrap(), 4);
}

/// A claim finds the leases that could conflict by index: the same scope, a directory above
/// a file scope, anything under one; never a neighbour that only shares a prefix.
pub fn control_task_leases_by_scope(h: &mut dyn Harness) {
    use room_core::scope::Scope;
    let store = h.fresh();
    let mut c = store.open_control().unwrap();
    c.insert_project(&project("prj_1", "/p")).unwrap();
    c.insert_room(&room("build", Some("prj_1")), &[]).unwrap();
    let specs: [(&str, &[&str]); 6] = [
        ("tsk_dir", &["file:src"]),
        ("tsk_file", &["file:src/a/b.rs"]),
        ("tsk_near", &["file:src-old/x.rs", "file:srcx"]),
        ("tsk_api", &["api:stripe"]),
        ("tsk_free", &["file:docs/x.md"]),
        ("tsk_open", &["file:src/a"]),
    ];
    for (i, (id, scopes)) in specs.iter().enumerate() {
        c.insert_task(&task(id, "build", Some("prj_1"), scopes))
            .unwrap();
        if *id != "tsk_open" {
            assert!(
                c.update_task(id, "open", "claimed", Some("beta"), 40, Some(i as u64 + 1))
                    .unwrap()
            );
        }
    }
    drop(c);
    let c = store.open_control().unwrap();
    let over = |scopes: &[&str]| -> Vec<String> {
        let s: Vec<Scope> = scopes
            .iter()
            .map(|s| Scope::parse("s", s).unwrap())
            .collect();
        let mut ids: Vec<String> = c
            .leased_over(Some("prj_1"), "build", &s)
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(over(&["file:src/a/b.rs"]), ["tsk_dir", "tsk_file"]);
    assert_eq!(
        over(&["file:src/a"]),
        ["tsk_dir", "tsk_file"],
        "tsk_open holds no lease"
    );
    assert_eq!(over(&["file:src"]), ["tsk_dir", "tsk_file"]);
    assert_eq!(over(&["file:src/c.rs"]), ["tsk_dir"]);
    assert_eq!(over(&["api:stripe", "file:docs"]), ["tsk_api", "tsk_free"]);
    assert!(over(&["api:stripe-2", "file:sr", "file:src0"]).is_empty());
    assert!(
        c.leased_over(None, "build", &[Scope::parse("s", "file:src").unwrap()])
            .unwrap()
            .is_empty(),
        "a project's leases are not a room's"
    );
}

/// A staging pin moves only from the digest it holds, once, and survives a reopen; other
/// selections are untouched.
pub fn control_stage_pin_moves(h: &mut dyn Harness) {
    use room_core::stage::Selection;
    let store = h.fresh();
    let mut c = store.open_control().unwrap();
    c.insert_room(&room("chat", None), &[]).unwrap();
    let mut t = task("tsk_a", "chat", None, &[]);
    let sel = |path: &str, sha: &str| Selection {
        path: path.into(),
        sha256: sha.into(),
        project: None,
    };
    t.stage = vec![sel("a.json", "aa"), sel("b.json", "bb")];
    c.insert_task(&t).unwrap();
    assert!(c.move_stage_pin("tsk_a", "a.json", "aa", "a2").unwrap());
    assert!(
        !c.move_stage_pin("tsk_a", "a.json", "aa", "a2").unwrap(),
        "a replay moves nothing"
    );
    assert!(
        !c.move_stage_pin("tsk_a", "b.json", "zz", "b2").unwrap(),
        "a pin not at the digest replaced stays"
    );
    assert!(!c.move_stage_pin("tsk_nope", "a.json", "aa", "a2").unwrap());
    drop(c);
    let c = store.open_control().unwrap();
    assert_eq!(
        c.task("tsk_a").unwrap().unwrap().stage,
        [sel("a.json", "a2"), sel("b.json", "bb")]
    );
}

/// Terms, claim pins, overrides and successors: an amendment applies once per revision and
/// never to a settled task; all of it survives a reopen.
pub fn control_task_terms(h: &mut dyn Harness) {
    use room_core::event::TaskTerms;
    let store = h.fresh();
    let mut c = store.open_control().unwrap();
    c.insert_room(&room("chat", None), &[]).unwrap();
    c.insert_task(&task("tsk_a", "chat", None, &[])).unwrap();
    c.insert_task(&task("tsk_b", "chat", None, &[])).unwrap();
    let terms = TaskTerms {
        revision: 1,
        requirements: vec!["R1 it works".into()],
        acceptance: Vec::new(),
    };
    assert!(c.amend_task("tsk_a", &terms).unwrap());
    assert!(
        !c.amend_task("tsk_a", &terms).unwrap(),
        "a replay applies nothing"
    );
    c.set_override("tsk_a", "shipped by hand").unwrap();
    let pin = std::collections::BTreeMap::from([("owner".to_string(), "alpha".to_string())]);
    c.pin_claim("tsk_a", &pin).unwrap();
    assert!(
        c.update_task("tsk_b", "open", "superseded", Some("beta"), 41, None)
            .unwrap()
    );
    c.set_successor("tsk_b", "tsk_a").unwrap();
    drop(c);
    let mut c = store.open_control().unwrap();
    let a = c.task("tsk_a").unwrap().unwrap();
    assert_eq!(a.revision, 1);
    assert_eq!(a.requirements, ["R1 it works"]);
    assert_eq!(a.override_reason.as_deref(), Some("shipped by hand"));
    assert_eq!(a.claim_pin, Some(pin));
    let next = TaskTerms {
        revision: 2,
        ..terms
    };
    assert!(c.amend_task("tsk_a", &next).unwrap());
    assert_eq!(
        c.task("tsk_a").unwrap().unwrap().override_reason,
        None,
        "an amendment drops the override"
    );
    let b: Vec<String> = c
        .superseded_by("tsk_a")
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(b, ["tsk_b"]);
    assert_eq!(
        c.task("tsk_b").unwrap().unwrap().status,
        TaskStatus::Superseded
    );
    let third = TaskTerms {
        revision: 1,
        ..next
    };
    assert!(
        !c.amend_task(
            "tsk_b",
            &TaskTerms {
                revision: 9,
                ..third
            }
        )
        .unwrap(),
        "settled"
    );
}

/// Governing-source receipts: kept per reader, conversation, part and digest, bounded per
/// reader and part, kept across a reopen once flushed; a project's source set and cleared.
pub fn index_source_reads(h: &mut dyn Harness) {
    use crate::index::{SOURCE_READS_PER_PART_MAX, SourceReadRow};
    let store = h.fresh();
    let read = |conversation: &str, sha: &str, from: u64, to: u64, at: u64| SourceReadRow {
        agent: "beta".into(),
        conversation: conversation.into(),
        task: "tsk_1".into(),
        path: "spec.md".into(),
        sha256: sha.into(),
        from_byte: from,
        to_byte: to,
        at_ms: at,
    };
    {
        store.create_shard("g_src", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_src").unwrap();
        idx.put_source_read(&read("c1", "s1", 0, 10, 100)).unwrap();
        idx.put_source_read(&read("c1", "s1", 10, 20, 200)).unwrap();
        idx.put_source_read(&read("c2", "s1", 20, 30, 200)).unwrap();
        idx.put_source_read(&read("c1", "s2", 20, 30, 200)).unwrap();
        idx.flush().unwrap();
    }
    drop(store);
    let store = h.reopen();
    let mut idx = store.open_index("g_src").unwrap();
    let got = |idx: &dyn crate::RoomIndex, since: u64| {
        idx.source_reads("beta", "c1", "tsk_1", "spec.md", "s1", since)
            .unwrap()
    };
    assert_eq!(got(idx.as_ref(), 0), [(0, 10), (10, 20)]);
    assert_eq!(got(idx.as_ref(), 150), [(10, 20)], "only since the claim");
    assert!(
        idx.source_reads("gamma", "c1", "tsk_1", "spec.md", "s1", 0)
            .unwrap()
            .is_empty()
    );
    for i in 0..SOURCE_READS_PER_PART_MAX as u64 {
        idx.put_source_read(&read("c1", "s1", 100 + i, 101 + i, 300))
            .unwrap();
    }
    let kept = got(idx.as_ref(), 0);
    assert_eq!(kept.len(), SOURCE_READS_PER_PART_MAX);
    assert_eq!(kept[0], (100, 101), "the oldest went first");
    drop(idx);
    let mut c = store.open_control().unwrap();
    c.insert_project(&project("prj_1", "/p")).unwrap();
    assert_eq!(c.project_source("prj_1").unwrap(), None);
    let parts = vec!["spec.md".to_string(), "annex/a.md".to_string()];
    c.set_project_source("prj_1", Some(&parts)).unwrap();
    assert_eq!(c.project_source("prj_1").unwrap(), Some(parts));
    c.set_project_source("prj_1", None).unwrap();
    assert_eq!(c.project_source("prj_1").unwrap(), None);
}

/// The wake queue: a permit once queued stays as sealed, reads are oldest first, per room or
/// all; the one-time re-queue request.
pub fn control_wakes(h: &mut dyn Harness) {
    let store = h.fresh();
    let w = |room: &str, agent: &str, src: &str, at: u64, permit: &str| WakeRow {
        room: room.into(),
        agent: agent.into(),
        source_event: src.into(),
        created_ms: at,
        permit: permit.into(),
        state: crate::control::WAKE_QUEUED.into(),
        reason: None,
        detail: None,
    };
    {
        let mut c = store.open_control().unwrap();
        c.insert_room(&room("a", None), &[]).unwrap();
        c.insert_room(&room("b", None), &[]).unwrap();
        assert!(
            c.wakes_requeue_pending().unwrap(),
            "a new store asks for one re-queue"
        );
        c.wakes_requeue_done().unwrap();
        c.insert_wakes(&[w("b", "x", "e2", 20, "p1"), w("a", "y", "e1", 10, "p2")])
            .unwrap();
        c.insert_wakes(&[
            w("b", "x", "e2", 99, "changed"),
            w("a", "z", "e3", 30, "p3"),
        ])
        .unwrap();
        c.insert_wakes(&[]).unwrap();
        assert!(
            c.insert_wakes(&[w("a", "q", "e4", 40, "p4"), w("ghost", "q", "e4", 40, "p5")])
                .is_err(),
            "a permit of an unknown room"
        );
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    assert!(!c.wakes_requeue_pending().unwrap());
    let all: Vec<(String, String)> = c
        .wakes(None)
        .unwrap()
        .into_iter()
        .map(|w| (w.room, w.permit))
        .collect();
    let want = [("a", "p2"), ("b", "p1"), ("a", "p3")].map(|(r, p)| (r.into(), p.into()));
    assert_eq!(
        all, want,
        "oldest first; the re-seal and the failed batch changed nothing"
    );
    let a: Vec<String> = c
        .wakes(Some("a"))
        .unwrap()
        .into_iter()
        .map(|w| w.agent)
        .collect();
    assert_eq!(a, ["y", "z"]);
    drop(c);
    // dispatch revalidates the least recently checked first, and a dead letter stays dead
    let mut c = store.open_control().unwrap();
    let order = |c: &dyn crate::ControlStore| -> Vec<String> {
        c.wakes_to_check(10)
            .unwrap()
            .into_iter()
            .map(|w| w.permit)
            .collect()
    };
    assert_eq!(order(c.as_ref()), ["p2", "p1", "p3"]);
    use crate::control::WakeVerdict;
    let verdict = |w: WakeRow, dead: Option<(&str, &str)>| WakeVerdict {
        wake: w,
        dead: dead.map(|(a, b)| (a.to_string(), b.to_string())),
    };
    let first = c.wakes_to_check(1).unwrap().remove(0);
    assert_eq!(
        c.wakes_checked(&[verdict(first, None)], 500).unwrap(),
        [true]
    );
    assert_eq!(order(c.as_ref()), ["p1", "p3", "p2"], "checked goes last");
    let p1 = c.wakes_to_check(1).unwrap().remove(0);
    let dead = verdict(p1.clone(), Some(("wake_job_expired", "past not_after")));
    assert_eq!(c.wakes_checked(&[dead], 600).unwrap(), [true]);
    assert_eq!(
        c.wakes_checked(&[verdict(p1, None)], 700).unwrap(),
        [false],
        "a dead letter is no longer queued"
    );
    assert_eq!(order(c.as_ref()), ["p3", "p2"]);
    let of: Vec<String> = c
        .wakes_queued_of(&["z".into(), "y".into()], 10)
        .unwrap()
        .into_iter()
        .map(|w| w.permit)
        .collect();
    assert_eq!(
        of,
        ["p2", "p3"],
        "queued permits of these agents, oldest first"
    );
    drop(c);
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let dead: Vec<(String, Option<String>)> = c
        .wakes(None)
        .unwrap()
        .into_iter()
        .filter(|w| w.state == crate::control::WAKE_DEAD)
        .map(|w| (w.permit, w.reason))
        .collect();
    assert_eq!(
        dead,
        [("p1".to_string(), Some("wake_job_expired".to_string()))]
    );
}

/// A launch moves its queued permit to `dispatched` in the same transaction, and a second
/// launch of that permit writes nothing (false); a session launch keeps its conversation; a
/// severed response is recorded once; the end moves the permit; all of it survives reopening.
pub fn control_launches(h: &mut dyn Harness) {
    let store = h.fresh();
    let launch = |id: &str, conversation: Option<&str>| crate::control::LaunchRow {
        id: id.into(),
        room: "a".into(),
        agent: "x".into(),
        source_event: "e1".into(),
        secret_sha256: format!("secret-of-{id}"),
        permit_sha256: "p".into(),
        state: "running".into(),
        pid: None,
        created_ms: 10,
        not_after_ms: 1_000,
        ended_ms: None,
        outcome: None,
        proof: Some("delivered_to_body".into()),
        detail: None,
        delivery: None,
        started_ms: Some(10),
        control_epoch: 1,
        cancel_gen: 0,
        conversation: conversation.map(String::from),
        severed: None,
    };
    {
        let mut c = store.open_control().unwrap();
        c.insert_room(&room("a", None), &[]).unwrap();
        c.insert_wakes(&[WakeRow {
            room: "a".into(),
            agent: "x".into(),
            source_event: "e1".into(),
            created_ms: 5,
            permit: "permit".into(),
            state: crate::control::WAKE_QUEUED.into(),
            reason: None,
            detail: None,
        }])
        .unwrap();
        assert!(c.insert_launch(&launch("l1", Some("s1"))).unwrap());
        assert!(
            !c.insert_launch(&launch("l2", None)).unwrap(),
            "a permit no longer queued gets no second launch"
        );
        assert!(c.launch("l2").unwrap().is_none(), "and nothing was written");
        let cut = r#"{"code":"severed_mid_response","bytes_sent":4096}"#;
        assert!(c.launch_severed("l1", cut).unwrap());
        assert!(!c.launch_severed("l1", "{}").unwrap(), "the first is kept");
    }
    drop(store);
    let store = h.reopen();
    let mut c = store.open_control().unwrap();
    assert_eq!(c.wake("a", "x", "e1").unwrap().unwrap().state, "dispatched");
    let l = c.launch("l1").unwrap().unwrap();
    assert_eq!(l.conversation.as_deref(), Some("s1"));
    assert!(l.severed.as_deref().unwrap().contains("4096"));
    assert_eq!(c.launches_live().unwrap().len(), 1);
    let end = crate::control::LaunchEnd {
        at_ms: 20,
        outcome: "replied".into(),
        proof: "replied".into(),
        detail: None,
        wake_state: "replied".into(),
        session: None,
    };
    assert!(c.launch_ended("l1", &end).unwrap());
    assert!(!c.launch_ended("l1", &end).unwrap(), "ended once");
    assert_eq!(c.wake("a", "x", "e1").unwrap().unwrap().state, "replied");
    assert!(c.launches_live().unwrap().is_empty());
    // a cancel dead-letters a permit whose launch is still starting (unclaimed), and that
    // launch's end keeps the dead letter's reason; a claimed one is the observer's to stop
    let permit = |src: &str| WakeRow {
        room: "a".into(),
        agent: "x".into(),
        source_event: src.into(),
        created_ms: 30,
        permit: format!("permit-{src}"),
        state: crate::control::WAKE_QUEUED.into(),
        reason: None,
        detail: None,
    };
    c.insert_wakes(&[permit("e2"), permit("e3")]).unwrap();
    let of = |id: &str, src: &str, state: &str| crate::control::LaunchRow {
        source_event: src.into(),
        state: state.into(),
        ..launch(id, None)
    };
    assert!(c.insert_launch(&of("l3", "e2", "starting")).unwrap());
    assert!(c.insert_launch(&of("l4", "e3", "running")).unwrap());
    let e = crate::backend::CancelEffect {
        at_ms: 40,
        why: "cancelled",
        held: &[],
    };
    c.set_cancelled("a", 9, Some(&e)).unwrap();
    let w2 = c.wake("a", "x", "e2").unwrap().unwrap();
    assert_eq!(
        (w2.state.as_str(), w2.reason.as_deref()),
        ("dead", Some("room_cancelled"))
    );
    assert_eq!(c.wake("a", "x", "e3").unwrap().unwrap().state, "dispatched");
    let refused = crate::control::LaunchEnd {
        outcome: "wake_job_changed_during_validation".into(),
        wake_state: "dead".into(),
        ..end
    };
    assert!(c.launch_ended("l3", &refused).unwrap());
    let w2 = c.wake("a", "x", "e2").unwrap().unwrap();
    assert_eq!(
        w2.reason.as_deref(),
        Some("room_cancelled"),
        "its reason is kept"
    );
}

/// A read leaves the change stamp as it was; a write moves it.
/// A cancel dead-letters the room's queued permits (not another room's), keeps its holds and
/// moves the cancel generation; a replay is a no-op; a resume clears the flag only. A hold is
/// resolved once. Break-glass moves the control epoch both ways. All of it survives reopening.
pub fn control_cancel_and_holds(h: &mut dyn Harness) {
    use crate::backend::CancelEffect;
    use crate::control::HoldResolution;
    let store = h.fresh();
    let held = [room_core::event::Held {
        hold: "hld_1".into(),
        kind: "destination_operation".into(),
        item: "op_1".into(),
        agent: Some("x".into()),
        task: None,
    }];
    let w = |room: &str, src: &str| WakeRow {
        room: room.into(),
        agent: "x".into(),
        source_event: src.into(),
        created_ms: 10,
        permit: "p".into(),
        state: crate::control::WAKE_QUEUED.into(),
        reason: None,
        detail: None,
    };
    {
        let mut c = store.open_control().unwrap();
        c.insert_room(&room("a", None), &[]).unwrap();
        c.insert_room(&room("b", None), &[]).unwrap();
        c.insert_wakes(&[w("a", "e1"), w("b", "e2")]).unwrap();
        let e = CancelEffect {
            at_ms: 50,
            why: "cancelled",
            held: &held,
        };
        c.set_cancelled("a", 5, Some(&e)).unwrap();
        // a replay of the same record, or an older one, changes nothing
        c.set_cancelled("a", 5, Some(&e)).unwrap();
        c.set_cancelled("a", 4, None).unwrap();
        let r = c.room("a").unwrap().unwrap();
        assert_eq!((r.cancel_gen, r.cancelled), (5, true));
        assert_eq!(c.wakes_dead_count("a", "room_cancelled").unwrap(), 1);
        assert_eq!(c.wakes_dead_count("b", "room_cancelled").unwrap(), 0);
        assert_eq!(c.holds("a", 10).unwrap().len(), 1);
        let epoch = c.control_epoch().unwrap();
        assert!(!c.break_glass().unwrap());
        assert_eq!(c.set_break_glass(true).unwrap(), epoch + 1);
        assert!(c.break_glass().unwrap());
        assert_eq!(c.set_break_glass(false).unwrap(), epoch + 2);
        let res = HoldResolution {
            seq: 6,
            at_ms: 60,
            by: "owner",
            outcome: "accepted",
            evidence: "seen",
        };
        assert!(c.resolve_hold("hld_1", &res).unwrap());
        assert!(!c.resolve_hold("hld_1", &res).unwrap(), "once");
        assert!(!c.resolve_hold("hld_unknown", &res).unwrap());
    }
    drop(store);
    let store = h.reopen();
    let mut c = store.open_control().unwrap();
    let state = |c: &dyn crate::backend::ControlStore, room: &str, src: &str| {
        let w = c.wake(room, "x", src).unwrap().unwrap();
        (w.state, w.reason)
    };
    assert_eq!(
        state(c.as_ref(), "a", "e1"),
        ("dead".into(), Some("room_cancelled".into()))
    );
    assert_eq!(state(c.as_ref(), "b", "e2"), ("queued".into(), None));
    let hold = c.hold("hld_1").unwrap().unwrap();
    assert_eq!(
        (hold.resolved_seq, hold.outcome.as_deref(), hold.cancel_seq),
        (Some(6), Some("accepted"), 5)
    );
    assert!(!c.break_glass().unwrap());
    c.set_cancelled("a", 7, None).unwrap();
    let r = c.room("a").unwrap().unwrap();
    assert_eq!((r.cancel_gen, r.cancelled), (7, false));
    assert_eq!(
        state(c.as_ref(), "a", "e1").0,
        "dead",
        "dead letters stay dead"
    );
}

/// Collaborations: the record (an id once), its state moved only from the state asked, its
/// runs replaced as they move on, and approvals decided once and only on the digest shown;
/// all after a reopen.
pub fn control_compositions(h: &mut dyn Harness) {
    let grant = |id: &str, agent: &str| CompositionRow {
        id: id.into(),
        agent: agent.into(),
        rooms: vec!["a".into(), "b".into()],
        project: Some("prj_1".into()),
        created_ms: 5,
        revoked_ms: None,
    };
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_agent(&agent("alpha", "s-a")).unwrap();
        c.insert_agent(&agent("beta", "s-b")).unwrap();
        c.insert_composition(&grant("cmp_2", "alpha")).unwrap();
        c.insert_composition(&grant("cmp_1", "beta")).unwrap();
        assert!(
            c.insert_composition(&grant("cmp_1", "alpha")).is_err(),
            "ids are unique"
        );
        assert!(
            c.insert_composition(&grant("cmp_3", "nobody")).is_err(),
            "a grant names an agent"
        );
        assert!(c.revoke_composition("cmp_2", 9).unwrap());
        assert!(!c.revoke_composition("cmp_2", 10).unwrap(), "once");
        assert!(!c.revoke_composition("cmp_none", 10).unwrap());
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let all = c.compositions(None, 10).unwrap();
    assert_eq!(
        all.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["cmp_1", "cmp_2"],
        "by id, revoked ones too"
    );
    let alpha = c.compositions(Some("alpha"), 10).unwrap();
    assert_eq!(
        alpha,
        [CompositionRow {
            revoked_ms: Some(9),
            ..grant("cmp_2", "alpha")
        }]
    );
    assert_eq!(c.compositions(None, 1).unwrap().len(), 1, "the limit holds");
    assert_eq!(
        c.composition("cmp_1").unwrap(),
        Some(grant("cmp_1", "beta"))
    );
    assert_eq!(c.composition("cmp_none").unwrap(), None);
    assert_eq!(
        c.active_compositions("beta").unwrap(),
        [grant("cmp_1", "beta")],
        "unrevoked only"
    );
    assert!(c.active_compositions("alpha").unwrap().is_empty());
}

pub fn control_collaborations(h: &mut dyn Harness) {
    let collab = |id: &str| CollabRow {
        id: id.into(),
        room: format!("room-{id}"),
        project: None,
        goal: "add a flag".into(),
        orchestrator: format!("{id}-orch"),
        spec: "{}".into(),
        state: "running".into(),
        created_ms: 1,
        updated_ms: 1,
    };
    let run = |phase: &str, n: u32, state: &str| CollabRunRow {
        collab: "col_a".into(),
        phase: phase.into(),
        run: n,
        task: Some(format!("tsk_{phase}{n}")),
        state: state.into(),
        reads: r#"{"spec":1}"#.into(),
        started_ms: 2,
        ended_ms: None,
    };
    let approval = |id: &str, digest: &str| ApprovalRow {
        id: id.into(),
        collab: "col_a".into(),
        phase: "approval".into(),
        run: 1,
        digest: digest.into(),
        input: "{}".into(),
        state: "pending".into(),
        created_ms: 3,
        decided_ms: None,
        note: None,
    };
    {
        let store = h.fresh();
        let mut c = store.open_control().unwrap();
        c.insert_collab(&collab("col_a")).unwrap();
        c.insert_collab(&collab("col_b")).unwrap();
        assert!(
            c.insert_collab(&collab("col_a")).is_err(),
            "an id is taken once"
        );
        assert!(
            c.set_collab_state("col_b", "running", "cancelled", 5)
                .unwrap()
        );
        assert!(
            !c.set_collab_state("col_b", "running", "done", 6).unwrap(),
            "only from the state asked"
        );
        c.put_collab_run(&run("spec", 1, "running")).unwrap();
        c.put_collab_run(&run("research", 1, "running")).unwrap();
        let mut done = run("spec", 1, "done");
        done.ended_ms = Some(9);
        c.put_collab_run(&done).unwrap();
        c.insert_approval(&approval("apr_1", "d1")).unwrap();
        c.insert_approval(&approval("apr_2", "d2")).unwrap();
        assert!(
            !c.decide_approval("apr_1", "other", "approved", 7, None)
                .unwrap(),
            "decided only on the digest shown"
        );
        assert!(
            c.decide_approval("apr_1", "d1", "approved", 7, Some("ok"))
                .unwrap()
        );
        assert!(
            !c.decide_approval("apr_1", "d1", "rejected", 8, None)
                .unwrap(),
            "decided once"
        );
    }
    let store = h.reopen();
    let c = store.open_control().unwrap();
    assert_eq!(c.collab("col_a").unwrap(), Some(collab("col_a")));
    assert_eq!(c.collab("col_z").unwrap(), None);
    let b = c.collab("col_b").unwrap().unwrap();
    assert_eq!((b.state.as_str(), b.updated_ms), ("cancelled", 5));
    let running: Vec<String> = c
        .collabs(Some("running"), 10)
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(running, ["col_a"]);
    assert_eq!(c.collabs(None, 10).unwrap().len(), 2);
    assert_eq!(c.collabs(None, 1).unwrap().len(), 1, "bounded");
    let runs = c.collab_runs("col_a", 10).unwrap();
    let mut done = run("spec", 1, "done");
    done.ended_ms = Some(9);
    assert_eq!(runs, [run("research", 1, "running"), done]);
    assert_eq!(c.collab_runs("col_b", 10).unwrap(), []);
    let a = c.approval("apr_1").unwrap().unwrap();
    assert_eq!(
        (a.state.as_str(), a.decided_ms, a.note.as_deref()),
        ("approved", Some(7), Some("ok"))
    );
    let all: Vec<(String, String)> = c
        .approvals("col_a", 10)
        .unwrap()
        .into_iter()
        .map(|a| (a.id, a.state))
        .collect();
    assert_eq!(
        all,
        [
            ("apr_1".to_string(), "approved".to_string()),
            ("apr_2".to_string(), "pending".to_string())
        ]
    );
}

pub fn control_change_stamp(h: &mut dyn Harness) {
    let store = h.fresh();
    let mut c = store.open_control().unwrap();
    let s0 = c.change_stamp().unwrap();
    c.agents().unwrap();
    c.room("none").unwrap();
    assert_eq!(c.change_stamp().unwrap(), s0);
    c.insert_agent(&agent("alpha", "s-a")).unwrap();
    let s1 = c.change_stamp().unwrap();
    assert_ne!(s1, s0);
    c.set_max_tier("alpha", "observer").unwrap();
    assert_ne!(c.change_stamp().unwrap(), s1);
}

/// A shard is created whole (binding, manifest, a log holding the first records) or not at
/// all; an existing one is never touched; one set aside is gone from the room space, and a
/// sweep sets aside everything no room owns.
pub fn shard_creation_is_whole_or_nothing(h: &mut dyn Harness) {
    let store = h.fresh();
    let b1 = br#"{"kind":"coordination"}"#;
    let b2 = br#"{"id":"prj_1","kind":"project"}"#;
    let first = chain("g_1", &ChainTip::genesis("g_1"), 1);
    assert_eq!(
        store.create_shard("g_1", b1, b"{}", &first).unwrap(),
        ShardCreated::Ready
    );
    assert_eq!(
        store.create_shard("g_1", b2, b"{}", &first).unwrap(),
        ShardCreated::Exists,
        "an existing shard is never touched"
    );
    drop(store);
    let store = h.reopen();
    assert_eq!(store.read_binding("g_1").unwrap(), b1);
    let mut seen = Vec::new();
    drop(
        store
            .open_log("g_1", None, &mut |s| {
                seen.push(s.record.id.clone());
                Ok(())
            })
            .unwrap(),
    );
    assert_eq!(
        seen,
        [first[0].record().id.clone()],
        "the first record came with the shard"
    );
    store.set_aside("g_1", 7).unwrap();
    assert!(store.read_binding("g_1").is_err(), "set aside");
    assert_eq!(
        store.create_shard("g_1", b2, b"{}", &[]).unwrap(),
        ShardCreated::Ready
    );
    assert_eq!(store.read_binding("g_1").unwrap(), b2);
    store.create_shard("g_2", b1, b"{}", &[]).unwrap();
    store.create_shard("g_3", b1, b"{}", &[]).unwrap();
    let known = ["g_2".to_string()].into_iter().collect();
    assert_eq!(store.sweep_strays(&known, 8).unwrap().len(), 2);
    assert!(store.read_binding("g_1").is_err() && store.read_binding("g_3").is_err());
    assert_eq!(store.read_binding("g_2").unwrap(), b1, "a known room stays");
    assert!(store.sweep_strays(&known, 9).unwrap().is_empty());
    assert!(store.read_binding("g_none").is_err());
}

fn chain(graph: &str, from: &ChainTip, n: u64) -> Vec<Sealed> {
    let mut tip = from.clone();
    let mut out = Vec::new();
    for i in 0..n {
        let hlc = Hlc {
            ms: 1_000 + tip.seq + 1,
            c: 0,
        };
        let s = Sealed::seal(
            &tip,
            format!("evt_{graph}_{}_{i}", tip.seq + 1),
            hlc,
            json!({"kind": "note", "n": tip.seq + 1}),
        );
        tip = s
            .check_after(&tip)
            .expect("a sealed record follows its tip");
        out.push(s);
    }
    out
}

/// `records` as they stand after `tamper`, made canonical again (the log must judge them).
fn tampered(records: Vec<Sealed>, tamper: impl FnOnce(&mut [Record])) -> Vec<Sealed> {
    let mut plain: Vec<Record> = records.into_iter().map(Sealed::into_record).collect();
    tamper(&mut plain);
    plain.into_iter().map(Sealed::of).collect()
}

/// Appends are durable and chained; a reopen scans every record after the known mark (all of
/// them without one) and lands on the same tip; offline verification agrees.
pub fn log_append_scan_and_reopen(h: &mut dyn Harness) {
    let store = h.fresh();
    store.create_shard("g_log", b"{}", b"{}", &[]).unwrap();
    let mark = {
        let mut log = store.open_log("g_log", None, &mut |_| Ok(())).unwrap();
        assert_eq!(log.tip().seq, 0);
        let first = chain("g_log", &log.tip(), 3);
        assert_eq!(log.append(&first).unwrap().len(), 3);
        let more = chain("g_log", &log.tip(), 2);
        log.append(&more).unwrap();
        assert_eq!(log.tip().seq, 5);
        assert!(log.synced_len() > 0 && log.poisoned().is_none());
        assert_eq!(log.mark().tip_seq, 5);
        log.mark().clone()
    };
    drop(store);
    let store = h.reopen();
    let mut seen = Vec::new();
    let log = store
        .open_log("g_log", None, &mut |s| {
            seen.push(s.record.seq);
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, [1, 2, 3, 4, 5]);
    assert_eq!(log.tip(), mark.tip());
    drop(log);
    let mut after_mark = 0;
    let log = store
        .open_log("g_log", Some(&mark), &mut |_| {
            after_mark += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!(after_mark, 0, "nothing past the mark the index knew");
    drop(log);
    let report = store.verify_log("g_log").unwrap();
    assert_eq!((report.records, report.tip_hash), (5, mark.tip_hash));
}

/// A record that does not chain onto the tip is refused and nothing of its batch lands.
pub fn log_refuses_a_broken_chain(h: &mut dyn Harness) {
    let store = h.fresh();
    store.create_shard("g_bad", b"{}", b"{}", &[]).unwrap();
    {
        let mut log = store.open_log("g_bad", None, &mut |_| Ok(())).unwrap();
        log.append(&chain("g_bad", &log.tip(), 2)).unwrap();
        let batch = tampered(chain("g_bad", &log.tip(), 2), |b| {
            b[1].prev = "0".repeat(64)
        });
        assert!(log.append(&batch).is_err());
        assert_eq!(
            log.tip().seq,
            2,
            "the valid first record of the batch did not land"
        );
        let changed = tampered(chain("g_bad", &log.tip(), 2), |b| {
            b[1].event = json!({"kind": "note", "n": "changed after sealing"})
        });
        assert!(
            log.append(&changed).is_err(),
            "an event its hash does not cover"
        );
        let unsealed = tampered(chain("g_bad", &log.tip(), 1), |b| {
            b[0].hash = "0".repeat(64)
        });
        assert!(
            log.append(&unsealed).is_err(),
            "a hash of nothing in the record"
        );
        assert_eq!(log.tip().seq, 2);
        let stale = chain("g_bad", &ChainTip::genesis("g_bad"), 1);
        assert!(log.append(&stale).is_err(), "a record for an old tip");
        log.append(&chain("g_bad", &log.tip(), 1)).unwrap();
    }
    drop(store);
    let store = h.reopen();
    assert_eq!(store.verify_log("g_bad").unwrap().records, 3);
}

/// A ranged verification reads the records after a position up to a stop, reports where the
/// last whole record ends and the tip there, continues from it, and reports damage with the
/// good records before it; a cut keeps what it removes and leaves a log that reopens.
pub fn log_verifies_ranges_and_cuts_keeping_the_rest(h: &mut dyn Harness) {
    let store = h.fresh();
    store.create_shard("g_rng", b"{}", b"{}", &[]).unwrap();
    let (three, five) = {
        let mut log = store.open_log("g_rng", None, &mut |_| Ok(())).unwrap();
        log.append(&chain("g_rng", &log.tip(), 3)).unwrap();
        let three = ChainPos::of_mark(log.mark());
        log.append(&chain("g_rng", &log.tip(), 2)).unwrap();
        (three, log.mark().clone())
    };
    drop(store);
    let store = h.reopen();
    let all = store.verify_log_from("g_rng", None, None).unwrap();
    assert_eq!((all.records, all.bytes, all.damage), (5, five.len, None));
    assert_eq!(all.tip_hash, five.tip_hash);
    // a stop inside record 4: the three records before it, and its bytes counted as torn
    let part = store
        .verify_log_from("g_rng", None, Some(three.len + 5))
        .unwrap();
    assert_eq!((part.records, part.bytes), (3, three.len));
    assert_eq!(part.pos(), three);
    let rest = store
        .verify_log_from("g_rng", Some(&part.pos()), Some(five.len))
        .unwrap();
    assert_eq!((rest.records, rest.bytes), (5, five.len));
    // a position whose tip is not the chain's: damage at record 4, the three before it good
    let wrong = ChainPos {
        tip_hash: "0".repeat(64),
        ..three.clone()
    };
    let bad = store.verify_log_from("g_rng", Some(&wrong), None).unwrap();
    assert!(
        bad.damage
            .as_deref()
            .is_some_and(|d| d.contains("record 4")),
        "{bad:?}"
    );
    assert_eq!(bad.bytes, three.len);
    assert!(store.verify_log_from("g_none", None, None).is_err());
    // cut back to record 3: the cut records are kept, the log reopens at 3 and appends
    let kept = store.cut_log("g_rng", three.len).unwrap();
    assert!(!kept.is_empty());
    assert_eq!(store.verify_log("g_rng").unwrap().records, 3);
    drop(store);
    let store = h.reopen();
    let mut log = store.open_log("g_rng", None, &mut |_| Ok(())).unwrap();
    assert_eq!(log.tip().seq, 3);
    log.append(&chain("g_rng", &log.tip(), 1)).unwrap();
    assert_eq!(log.tip().seq, 4);
}

/// The log trust (verified position, clean close) is durable when `set_trust` returns; the
/// witnesses name the highest seq of the mark, events, receipts, checkpoints and wakes mark,
/// and the losses `journal_loss` events at or below the seq asked about accept.
pub fn index_trust_and_witnesses_survive_reopen(h: &mut dyn Harness) {
    let store = h.fresh();
    let trust = LogTrust {
        verified: Some(ChainPos {
            len: 120,
            tip_seq: 2,
            tip_hash: "h2".into(),
            tip_hlc: Hlc { ms: 2, c: 0 },
        }),
        closed_clean: true,
    };
    {
        store.create_shard("g_tr", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_tr").unwrap();
        assert_eq!(idx.trust().unwrap(), LogTrust::default());
        let w = idx.witnesses(0).unwrap();
        assert!(w.seqs.is_empty() && w.accepted.is_empty());
        let mut loss = event(3, "owner", "journal_loss");
        loss.body = r#"{"kind":"journal_loss","missing_from":3,"missing_to":6}"#.into();
        idx.apply(&Batch {
            events: vec![event(1, "alpha", "turn"), event(2, "alpha", "turn"), loss],
            ..Batch::default()
        })
        .unwrap();
        idx.put_checkpoint(&checkpoint(2)).unwrap();
        idx.set_wakes_mark(1).unwrap();
        idx.set_trust(&trust).unwrap();
    }
    drop(store);
    let store = h.reopen();
    let mut idx = store.open_index("g_tr").unwrap();
    assert_eq!(idx.trust().unwrap(), trust);
    let w = idx.witnesses(3).unwrap();
    let seq_of = |src: &str| w.seqs.iter().find(|s| s.source == src).map(|s| s.seq);
    assert_eq!(seq_of("events"), Some(3));
    assert_eq!(seq_of("checkpoints"), Some(2));
    assert_eq!(seq_of("wakes_mark"), Some(1));
    assert_eq!(seq_of("receipts"), None);
    assert_eq!(w.accepted, [(3, 6)]);
    assert_eq!(
        idx.witnesses(2).unwrap().accepted,
        [],
        "a loss event past the journal's tip accepts nothing"
    );
    // a witness past the tip that no accepted loss covers is missing; one inside is not
    let past = SeqWitness {
        source: "receipts".into(),
        seq: 5,
    };
    assert_eq!(w.missing_after(3, std::slice::from_ref(&past)), None);
    let later = SeqWitness {
        source: "receipts".into(),
        seq: 8,
    };
    assert_eq!(w.missing_after(3, &[later]), Some((4, 8)));
    assert_eq!(
        idx.witnesses(1).unwrap().missing_after(1, &[]),
        Some((2, 3))
    );
    idx.set_trust(&LogTrust::default()).unwrap();
    drop(idx);
    drop(store);
    let store = h.reopen();
    assert_eq!(
        store.open_index("g_tr").unwrap().trust().unwrap(),
        LogTrust::default()
    );
}

/// control.db's witnesses of a room: the seq of its last reset and the sources of its newest
/// queued wake permits.
pub fn control_room_witnesses(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        let mut c = store.open_control().unwrap();
        c.insert_room(&room("a", None), &[]).unwrap();
        c.insert_room(&room("b", None), &[]).unwrap();
        let none = c.room_witnesses("a").unwrap();
        assert_eq!((none.reset_seq, none.wake_sources.len()), (0, 0));
        c.reset_room_at("a", 7, 70).unwrap();
        let w = |room: &str, src: &str, at: u64| WakeRow {
            room: room.into(),
            agent: "x".into(),
            source_event: src.into(),
            created_ms: at,
            permit: "p".into(),
            state: crate::control::WAKE_QUEUED.into(),
            reason: None,
            detail: None,
        };
        c.insert_wakes(&[w("a", "e1", 10), w("a", "e2", 20), w("b", "e9", 30)])
            .unwrap();
    }
    drop(store);
    let store = h.reopen();
    let c = store.open_control().unwrap();
    let a = c.room_witnesses("a").unwrap();
    assert_eq!(a.reset_seq, 7);
    assert_eq!(a.wake_sources, ["e2", "e1"], "newest first, this room only");
    assert_eq!(c.room_witnesses("nope").unwrap().reset_seq, 0);
}

fn event(seq: u64, actor: &str, kind: &str) -> EventRow {
    EventRow {
        seq,
        id: format!("evt_{seq}"),
        kind: kind.into(),
        actor: actor.into(),
        hlc_ms: seq,
        hlc_c: 0,
        hash: format!("h{seq}"),
        task: None,
        body: "{}".into(),
    }
}

fn item(kind: ItemKind, id: &str, source_seq: u64, agent: &str) -> ItemRow {
    ItemRow {
        kind,
        id: id.into(),
        source: format!("evt_{source_seq}"),
        source_seq,
        agent: agent.into(),
        from_agent: "alpha".into(),
        task: None,
        status: "open".into(),
        resolved_by: None,
        not_after_ms: Some(1_000),
    }
}

/// `exactly_once`'s registry keeps the newest `IDEMPOTENCY_KEYS_MAX` keys of a room: one more
/// evicts the oldest (a repeat of it is no longer recognised), never a newer one, across batches
/// and a reopen.
pub fn index_idempotency_fifo(h: &mut dyn Harness) {
    use crate::index::IDEMPOTENCY_KEYS_MAX;
    let store = h.fresh();
    let key = |n: u64| format!("k{n}");
    {
        store.create_shard("g_fifo", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_fifo").unwrap();
        // in batches, as turns arrive: the last batch takes the registry one past its bound
        let total = IDEMPOTENCY_KEYS_MAX + 1;
        let mut n = 1;
        while n <= total {
            let end = (n + 999).min(total);
            let batch = Batch {
                idempotency: (n..=end)
                    .map(|i| ("alpha".to_string(), key(i), format!("evt_{i}"), i, None))
                    .collect(),
                ..Batch::default()
            };
            idx.apply(&batch).unwrap();
            n = end + 1;
        }
        idx.flush().unwrap();
    }
    drop(store);
    let store = h.reopen();
    let idx = store.open_index("g_fifo").unwrap();
    assert_eq!(idx.idempotency_keys().unwrap(), IDEMPOTENCY_KEYS_MAX);
    assert_eq!(
        idx.idempotent("alpha", &key(1)).unwrap(),
        None,
        "the oldest went first"
    );
    assert_eq!(
        idx.idempotent("alpha", &key(2))
            .unwrap()
            .map(|(e, s, _)| (e, s)),
        Some(("evt_2".to_string(), 2))
    );
    let newest = IDEMPOTENCY_KEYS_MAX + 1;
    assert!(idx.idempotent("alpha", &key(newest)).unwrap().is_some());
    assert_eq!(
        idx.idempotent("beta", &key(newest)).unwrap(),
        None,
        "keys are per actor"
    );
}

/// Records with an audience: heads carry it, and the gate's foreign-event query passes over
/// a record withheld from its reader (never over one it reads), after a reopen too.
pub fn index_audience(h: &mut dyn Harness) {
    let store = h.fresh();
    let with = |seq: u64, actor: &str, audience: &[&str]| {
        let mut e = event(seq, actor, "turn");
        e.body =
            serde_json::json!({"kind": "turn", "actor": actor, "audience": audience}).to_string();
        e
    };
    {
        store.create_shard("g_au", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_au").unwrap();
        idx.apply(&Batch {
            events: vec![
                event(1, "alpha", "turn"),
                with(2, "beta", &["beta", "gamma"]),
                with(3, "gamma", &["alpha", "gamma"]),
                with(4, "beta", &[]),
            ],
            ..Batch::default()
        })
        .unwrap();
        idx.flush().unwrap();
    }
    drop(store);
    let store = h.reopen();
    let idx = store.open_index("g_au").unwrap();
    let heads: Vec<(u64, Vec<String>)> = idx
        .event_heads_from(1, 8)
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.audience))
        .collect();
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        heads,
        [
            (1, vec![]),
            (2, names(&["beta", "gamma"])),
            (3, names(&["alpha", "gamma"])),
            (4, vec![]),
        ]
    );
    assert_eq!(
        idx.first_foreign_after(1, "alpha").unwrap(),
        Some(3),
        "2 is withheld from alpha: never owed"
    );
    assert_eq!(idx.first_foreign_after(1, "gamma").unwrap(), Some(2));
    assert_eq!(
        idx.first_foreign_after(1, "delta").unwrap(),
        Some(4),
        "an empty audience is every reader's"
    );
    assert_eq!(idx.first_foreign_after(3, "alpha").unwrap(), Some(4));
}

/// Full-text search over what events say (a turn's text, a spilled text's preview, a task's
/// title): matches by seq, best first, paged; a replayed event is not indexed twice; the
/// index is gone after the projection is cleared and back after a rebuild re-projects.
pub fn index_search(h: &mut dyn Harness) {
    let said = |seq: u64, body: serde_json::Value| {
        let mut e = event(seq, "alpha", "turn");
        e.body = body.to_string();
        e
    };
    let events = vec![
        said(
            1,
            json!({"kind": "turn", "text": "the parser drops unicode escapes"}),
        ),
        said(2, json!({"kind": "turn", "text": "lunch at noon"})),
        said(
            3,
            json!({"kind": "task", "created": {"title": "fix the parser"}}),
        ),
        said(
            4,
            json!({"kind": "turn", "text_blob": {"preview": "a long parser report"}}),
        ),
        said(5, json!({"kind": "room_created"})),
    ];
    {
        let store = h.fresh();
        store.create_shard("g_se", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_se").unwrap();
        idx.apply(&Batch {
            events: events.clone(),
            ..Batch::default()
        })
        .unwrap();
        // a replay of the same events (a catch-up after a crash) indexes nothing twice
        idx.apply(&Batch {
            events: events.clone(),
            ..Batch::default()
        })
        .unwrap();
        idx.flush().unwrap();
    }
    let store = h.reopen();
    let mut idx = store.open_index("g_se").unwrap();
    let seqs = |hits: Vec<(u64, f64)>| -> Vec<u64> {
        let mut s: Vec<u64> = hits.into_iter().map(|(s, _)| s).collect();
        s.sort();
        s
    };
    assert_eq!(seqs(idx.search("\"parser\"", 0, 10).unwrap()), [1, 3, 4]);
    assert_eq!(seqs(idx.search("\"lunch\"", 0, 10).unwrap()), [2]);
    assert_eq!(
        seqs(idx.search("\"nothing\"", 0, 10).unwrap()),
        Vec::<u64>::new()
    );
    let first = idx.search("\"parser\"", 0, 2).unwrap();
    let rest = idx.search("\"parser\"", 2, 2).unwrap();
    assert_eq!((first.len(), rest.len()), (2, 1), "paged");
    assert!(first.iter().all(|(s, _)| !rest.iter().any(|(r, _)| r == s)));
    idx.clear_projection().unwrap();
    assert_eq!(idx.search("\"parser\"", 0, 10).unwrap(), vec![]);
    idx.apply(&Batch {
        events,
        ..Batch::default()
    })
    .unwrap();
    assert_eq!(seqs(idx.search("\"parser\"", 0, 10).unwrap()), [1, 3, 4]);
}

/// Semantic search's vectors: the events that say something and lack one for a model, kept
/// per model (another model's vectors are another set), replaced when kept again, paged newest
/// first, counted; kept across a reopen and a rebuild (they are derived from the journal's
/// immutable text), and counted only for the record they were made from (a seq a cut journal
/// gives again is another record, embedded again).
pub fn index_embeddings(h: &mut dyn Harness) {
    let said = |seq: u64, body: serde_json::Value| {
        let mut e = event(seq, "alpha", "turn");
        e.body = body.to_string();
        e
    };
    let events = vec![
        said(1, json!({"kind": "turn", "text": "the parser has a bug"})),
        said(2, json!({"kind": "room_created"})),
        said(3, json!({"kind": "task", "created": {"title": "fix it"}})),
        said(4, json!({"kind": "turn", "text_blob": {"preview": "long"}})),
    ];
    let todo = |idx: &dyn crate::backend::RoomIndex, model: &str, after: u64, n: usize| {
        idx.embedding_todo(model, after, n)
            .unwrap()
            .into_iter()
            .map(|(seq, hash, text)| {
                assert_eq!(hash, format!("h{seq}"), "the record's hash comes with it");
                (seq, text)
            })
            .collect::<Vec<_>>()
    };
    {
        let store = h.fresh();
        store.create_shard("g_em", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_em").unwrap();
        idx.apply(&Batch {
            events: events.clone(),
            ..Batch::default()
        })
        .unwrap();
        assert_eq!(
            todo(idx.as_ref(), "m1", 0, 10),
            [
                (1, "the parser has a bug".to_string()),
                (3, "fix it".to_string()),
                (4, "long".to_string())
            ]
        );
        assert_eq!(todo(idx.as_ref(), "m1", 1, 1), [(3, "fix it".into())]);
        idx.put_embeddings(
            "m1",
            &[
                (1, "h1".into(), vec![1, -2, 3]),
                (3, "h3".into(), vec![0, 0, 127]),
            ],
        )
        .unwrap();
        assert_eq!(todo(idx.as_ref(), "m1", 0, 10), [(4, "long".into())]);
        // another model has none of them
        assert_eq!(todo(idx.as_ref(), "m2", 0, 10).len(), 3);
        assert_eq!(idx.embedding_counts("m1").unwrap(), (2, 3));
        assert_eq!(idx.embedding_counts("m2").unwrap(), (0, 3));
        idx.put_embeddings("m1", &[(1, "h1".into(), vec![-128, 127, 0])])
            .unwrap();
    }
    let store = h.reopen();
    let mut idx = store.open_index("g_em").unwrap();
    assert_eq!(
        idx.embeddings("m1", u64::MAX, 10).unwrap(),
        [(3, vec![0, 0, 127]), (1, vec![-128, 127, 0])],
        "newest first"
    );
    assert_eq!(
        idx.embeddings("m1", 3, 10).unwrap(),
        [(1, vec![-128, 127, 0])]
    );
    assert_eq!(idx.embeddings("m1", u64::MAX, 1).unwrap().len(), 1);
    assert_eq!(idx.embeddings("m2", u64::MAX, 10).unwrap(), vec![]);
    idx.clear_projection().unwrap();
    // the rebuilt index holds another record at seq 3 (a journal cut and written again)
    let mut again = events;
    again[2].hash = "h3-again".into();
    idx.apply(&Batch {
        events: again,
        ..Batch::default()
    })
    .unwrap();
    assert_eq!(idx.embedding_counts("m1").unwrap(), (1, 3));
    assert_eq!(
        idx.embeddings("m1", u64::MAX, 10).unwrap(),
        [(1, vec![-128, 127, 0])],
        "no vector of another record"
    );
    let left: Vec<u64> = idx
        .embedding_todo("m1", 0, 10)
        .unwrap()
        .into_iter()
        .map(|(seq, _, _)| seq)
        .collect();
    assert_eq!(left, [3, 4]);
}

/// The blackboard's index: each version by kind, key and number (the newest when none is
/// named), the newest of each key in order and paged, the count of keys; a replay of a version
/// keeps the first; all after a reopen, and gone after the projection is cleared (a rebuild
/// refills it from the journal).
pub fn index_artifacts(h: &mut dyn Harness) {
    let version = |seq: u64, kind: &str, key: &str, v: u32, audience: &[&str]| ArtifactRow {
        kind: kind.into(),
        key: key.into(),
        version: v,
        sha256: format!("{seq:064x}"),
        bytes: 10 * seq,
        producer: "writer".into(),
        parents: if v > 1 {
            vec![format!("evt_{}", seq - 1)]
        } else {
            vec![]
        },
        event: format!("evt_{seq}"),
        seq,
        hlc_ms: seq,
        audience: audience.iter().map(|a| a.to_string()).collect(),
        task: (kind == "spec").then(|| "tsk_spec".to_string()),
    };
    let rows = vec![
        version(1, "spec", "main", 1, &[]),
        version(2, "spec", "main", 2, &[]),
        version(3, "findings", "rev-a", 1, &["orch", "rev-a"]),
        version(4, "extra/notes", "main", 1, &[]),
        version(5, "findings", "rev-b", 1, &[]),
    ];
    {
        let store = h.fresh();
        store.create_shard("g_ar", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_ar").unwrap();
        assert_eq!(idx.artifact("spec", "main", None).unwrap(), None);
        assert_eq!(idx.artifact_keys().unwrap(), 0);
        idx.apply(&Batch {
            events: (1..=5).map(|s| event(s, "writer", "turn")).collect(),
            artifacts: rows.clone(),
            ..Batch::default()
        })
        .unwrap();
        // a replay of version 2 with other bytes: the first stays
        let mut replay = rows[1].clone();
        replay.bytes = 999;
        idx.apply(&Batch {
            artifacts: vec![replay],
            ..Batch::default()
        })
        .unwrap();
        idx.flush().unwrap();
    }
    let store = h.reopen();
    let mut idx = store.open_index("g_ar").unwrap();
    assert_eq!(
        idx.artifact("spec", "main", None).unwrap(),
        Some(rows[1].clone())
    );
    assert_eq!(
        idx.artifact("spec", "main", Some(1)).unwrap(),
        Some(rows[0].clone())
    );
    assert_eq!(idx.artifact("spec", "main", Some(3)).unwrap(), None);
    assert_eq!(idx.artifact("spec", "other", None).unwrap(), None);
    assert_eq!(
        idx.artifact("findings", "rev-a", None)
            .unwrap()
            .unwrap()
            .audience,
        ["orch", "rev-a"]
    );
    assert_eq!(idx.artifact_keys().unwrap(), 4);
    assert_eq!(
        idx.artifact_of_task("tsk_spec", "spec", "main").unwrap(),
        Some(rows[1].clone()),
        "the newest written for the task"
    );
    assert_eq!(
        idx.artifact_of_task("tsk_spec", "spec", "other").unwrap(),
        None
    );
    assert_eq!(
        idx.artifact_of_task("tsk_other", "spec", "main").unwrap(),
        None
    );
    let keys = |page: &[ArtifactRow]| -> Vec<(String, String, u32)> {
        page.iter()
            .map(|a| (a.kind.clone(), a.key.clone(), a.version))
            .collect()
    };
    let all = idx.artifact_heads(None, 10).unwrap();
    let owned = |k: &str, key: &str, v: u32| (k.to_string(), key.to_string(), v);
    assert_eq!(
        keys(&all),
        [
            owned("extra/notes", "main", 1),
            owned("findings", "rev-a", 1),
            owned("findings", "rev-b", 1),
            owned("spec", "main", 2),
        ]
    );
    let first = idx.artifact_heads(None, 2).unwrap();
    assert_eq!(keys(&first), keys(&all[..2]));
    let rest = idx.artifact_heads(Some(("findings", "rev-a")), 10).unwrap();
    assert_eq!(keys(&rest), keys(&all[2..]));
    idx.clear_projection().unwrap();
    assert_eq!(idx.artifact_keys().unwrap(), 0);
    assert_eq!(idx.artifact("spec", "main", None).unwrap(), None);
}

/// The projection: events by seq and id, the gate's foreign-event query, items and their
/// resolution, the open-item page and total, causal ancestors; all after a reopen.
pub fn index_projection(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        store.create_shard("g_ix", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_ix").unwrap();
        assert_eq!(idx.mark().unwrap(), None);
        idx.apply(&Batch {
            events: vec![
                event(1, "alpha", "turn"),
                event(2, "beta", "invariant_violation"),
                event(3, "alpha", "turn"),
                event(4, "beta", "turn"),
            ],
            edges: vec![
                ("evt_3".into(), "evt_1".into()),
                ("evt_4".into(), "evt_3".into()),
            ],
            items: vec![
                item(ItemKind::Mention, "mnt_1", 1, "beta"),
                item(ItemKind::Obligation, "obl_1", 1, "beta"),
                item(ItemKind::Mention, "mnt_3", 3, "beta"),
            ],
            ..Batch::default()
        })
        .unwrap();
        idx.apply_deferred(&Batch {
            resolutions: vec![(
                ItemKind::Mention,
                "mnt_1".into(),
                "answered".into(),
                "evt_4".into(),
            )],
            ..Batch::default()
        })
        .unwrap();
        idx.flush().unwrap();
    }
    drop(store);
    let store = h.reopen();
    let idx = store.open_index("g_ix").unwrap();
    assert!(idx.broken().is_none());
    assert_eq!(idx.event_count().unwrap(), 4);
    assert_eq!(idx.event_by_seq(3).unwrap().unwrap().id, "evt_3");
    assert_eq!(idx.event_by_id("evt_4").unwrap().unwrap().seq, 4);
    assert_eq!(idx.event_by_id("evt_9").unwrap(), None);
    let seqs: Vec<u64> = idx
        .events_from(2, 2)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [2, 3]);
    let heads: Vec<(u64, String, String)> = idx
        .event_heads_from(2, 3)
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.id, e.hash))
        .collect();
    let full: Vec<(u64, String, String)> = idx
        .events_from(2, 3)
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.id, e.hash))
        .collect();
    assert_eq!(heads, full, "heads name the same events as the rows");
    assert_eq!(heads.len(), 3);
    assert!(idx.event_heads_from(5, 8).unwrap().is_empty());
    assert_eq!(
        idx.first_foreign_after(1, "alpha").unwrap(),
        Some(4),
        "invariant records hold no one at the gate"
    );
    assert_eq!(idx.first_foreign_after(4, "alpha").unwrap(), None);
    let (page, total) = idx.open_items_page("beta", 1).unwrap();
    assert_eq!((page.len(), total), (1, 2), "mnt_1 is resolved");
    let m = idx.item(ItemKind::Mention, "mnt_1").unwrap().unwrap();
    assert_eq!(
        (m.status.as_str(), m.resolved_by.as_deref()),
        ("answered", Some("evt_4"))
    );
    assert_eq!(idx.items(ItemKind::Obligation).unwrap().len(), 1);
    assert_eq!(idx.open_sources("beta", 8).unwrap(), ["evt_1", "evt_3"]);
    let obligations: Vec<String> = idx
        .open_obligations(8)
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(obligations, ["obl_1"]);
    let mut anc = idx.ancestors("evt_4", 16).unwrap();
    anc.sort();
    assert_eq!(anc, ["evt_1", "evt_3"]);
    assert_eq!(
        idx.ancestors("evt_4", 1).unwrap(),
        ["evt_3"],
        "bounded by depth"
    );
}

/// What a worker receipt reads: a task's lifecycle records, the events that cite one, and
/// how far each of a reader's conversations confirmed; all survive a reopen.
pub fn index_task_records_citations_and_readers(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        store.create_shard("g_wr", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_wr").unwrap();
        let with_task = |seq: u64, kind: &str, task: &str| EventRow {
            task: Some(task.into()),
            ..event(seq, "beta", kind)
        };
        idx.apply(&Batch {
            events: vec![
                with_task(1, "task", "tsk_a"),
                with_task(2, "turn", "tsk_a"),
                with_task(3, "task", "tsk_b"),
                with_task(4, "task", "tsk_a"),
                event(5, "beta", "turn"),
                event(6, "gamma", "turn"),
            ],
            edges: vec![
                ("evt_5".into(), "evt_4".into()),
                ("evt_6".into(), "evt_4".into()),
                ("evt_6".into(), "evt_1".into()),
            ],
            ..Batch::default()
        })
        .unwrap();
        for (conversation, seq) in [("c1", 2), ("c2", 5)] {
            idx.put_checkpoint(&CheckpointRow {
                conversation: conversation.into(),
                ..checkpoint(seq)
            })
            .unwrap();
        }
    }
    drop(store);
    let store = h.reopen();
    let idx = store.open_index("g_wr").unwrap();
    let seqs = |rows: Vec<EventRow>| rows.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(idx.task_events("tsk_a", 0, 8).unwrap()), [1, 4]);
    assert_eq!(seqs(idx.task_events("tsk_a", 1, 8).unwrap()), [4]);
    assert_eq!(
        seqs(idx.task_events("tsk_a", 0, 1).unwrap()),
        [1],
        "bounded"
    );
    assert_eq!(seqs(idx.task_records("tsk_a", 0, 8).unwrap()), [1, 2, 4]);
    assert_eq!(seqs(idx.task_records("tsk_a", 1, 8).unwrap()), [2, 4]);
    assert_eq!(
        seqs(idx.task_records("tsk_a", 0, 2).unwrap()),
        [1, 2],
        "bounded"
    );
    assert_eq!(seqs(idx.citing("evt_4", 8).unwrap()), [5, 6]);
    assert_eq!(seqs(idx.citing("evt_4", 1).unwrap()), [5], "bounded");
    assert_eq!(seqs(idx.citing("evt_2", 8).unwrap()), Vec::<u64>::new());
    let cps: Vec<(String, u64)> = idx
        .checkpoints_of("beta", 8)
        .unwrap()
        .into_iter()
        .map(|c| (c.conversation, c.confirmed_seq))
        .collect();
    assert_eq!(cps, [("c2".to_string(), 5), ("c1".to_string(), 2)]);
    assert!(idx.checkpoints_of("gamma", 8).unwrap().is_empty());
}

fn checkpoint(seq: u64) -> CheckpointRow {
    CheckpointRow {
        actor: "beta".into(),
        conversation: "c".into(),
        conversation_key: "k".into(),
        view_gen: "v".into(),
        confirmed_seq: seq,
        chunk_seq: None,
        chunk_offset: 0,
        updated_ms: seq,
    }
}

/// Receipts and checkpoints: a confirmation is durable when it returns, and both survive a
/// reopen and a cleared projection.
pub fn index_sync_state_survives_reopen_and_rebuild(h: &mut dyn Harness) {
    let store = h.fresh();
    let receipt = ReceiptRow {
        id: "rcpt_1".into(),
        actor: "beta".into(),
        conversation: "c".into(),
        conversation_key: "k".into(),
        view_gen: "v".into(),
        from_seq: 0,
        from_offset: 0,
        to_seq: 2,
        chunk_seq: None,
        chunk_offset: 0,
        tip_seq: 2,
        tip_hash: "h2".into(),
        delivered_sha256: "d".into(),
        created_ms: 5,
        confirmed_ms: None,
        base: None,
        page_bytes: None,
    };
    {
        store.create_shard("g_sync", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_sync").unwrap();
        idx.apply(&Batch {
            events: vec![event(1, "alpha", "turn"), event(2, "alpha", "turn")],
            ..Batch::default()
        })
        .unwrap();
        idx.put_receipt(&receipt).unwrap();
        assert_eq!(idx.receipt("rcpt_1").unwrap().unwrap().to_seq, 2);
        idx.confirm("rcpt_1", 9, &checkpoint(2)).unwrap();
        idx.put_checkpoint(&CheckpointRow {
            actor: "gamma".into(),
            ..checkpoint(1)
        })
        .unwrap();
        idx.set_wakes_mark(2).unwrap();
    }
    drop(store);
    let store = h.reopen();
    let mut idx = store.open_index("g_sync").unwrap();
    assert_eq!(
        idx.receipt("rcpt_1").unwrap().unwrap().confirmed_ms,
        Some(9)
    );
    assert_eq!(
        idx.checkpoint("beta", "c").unwrap().unwrap().confirmed_seq,
        2
    );
    assert_eq!(
        idx.checkpoint("gamma", "c").unwrap().unwrap().confirmed_seq,
        1
    );
    assert_eq!(idx.checkpoint("delta", "c").unwrap(), None);
    assert_eq!(idx.wakes_mark().unwrap(), 2);
    idx.clear_projection().unwrap();
    assert_eq!(idx.event_count().unwrap(), 0);
    assert!(
        idx.receipt("rcpt_1").unwrap().is_some(),
        "receipts survive a rebuild"
    );
    assert!(
        idx.checkpoint("beta", "c").unwrap().is_some(),
        "checkpoints too"
    );
}

/// A fold advance moves an existing checkpoint of the same conversation key and view forward,
/// never back, never creates one; a receipt keeps the receipt it continues.
pub fn index_folds_and_receipt_chains(h: &mut dyn Harness) {
    let store = h.fresh();
    store.create_shard("g_fold", b"{}", b"{}", &[]).unwrap();
    let mut idx = store.open_index("g_fold").unwrap();
    idx.put_checkpoint(&checkpoint(2)).unwrap();
    let fold = |actor: &str, key: &str, view: &str, seq: u64| FoldAdvance {
        actor: actor.into(),
        conversation_key: key.into(),
        view_gen: view.into(),
        seq,
    };
    idx.apply(&Batch {
        events: vec![event(1, "alpha", "turn"), event(2, "alpha", "turn")],
        folds: vec![
            fold("beta", "k", "v", 5),
            fold("beta", "k", "v", 4),
            fold("beta", "k", "v_old", 9),
            fold("beta", "other", "v", 9),
            fold("gamma", "k", "v", 7),
        ],
        ..Batch::default()
    })
    .unwrap();
    assert_eq!(
        idx.checkpoint("beta", "c").unwrap().unwrap().confirmed_seq,
        5,
        "forward only, same key and view only"
    );
    assert_eq!(idx.checkpoint("gamma", "c").unwrap(), None, "never created");
    let receipt = |id: &str, base: Option<&str>| ReceiptRow {
        id: id.into(),
        actor: "beta".into(),
        conversation: "c".into(),
        conversation_key: "k".into(),
        view_gen: "v".into(),
        from_seq: 0,
        from_offset: 0,
        to_seq: 2,
        chunk_seq: None,
        chunk_offset: 0,
        tip_seq: 2,
        tip_hash: "h2".into(),
        delivered_sha256: "d".into(),
        created_ms: 5,
        confirmed_ms: None,
        base: base.map(String::from),
        page_bytes: base.map(|_| 10_240),
    };
    idx.put_receipt(&receipt("rcpt_a", None)).unwrap();
    idx.put_receipt(&receipt("rcpt_b", Some("rcpt_a"))).unwrap();
    idx.flush().unwrap();
    drop(idx);
    drop(store);
    let store = h.reopen();
    let idx = store.open_index("g_fold").unwrap();
    assert_eq!(idx.receipt("rcpt_a").unwrap().unwrap().base, None);
    let b = idx.receipt("rcpt_b").unwrap().unwrap();
    assert_eq!(b.base.as_deref(), Some("rcpt_a"));
    assert_eq!(b.page_bytes, Some(10_240));
}

/// `exactly_once` keys and (agent, task) lifecycles: begun, lapsed past the TTL, resolved.
pub fn index_invariant_state(h: &mut dyn Harness) {
    let store = h.fresh();
    {
        store.create_shard("g_inv", b"{}", b"{}", &[]).unwrap();
        let mut idx = store.open_index("g_inv").unwrap();
        idx.apply(&Batch {
            events: vec![event(1, "alpha", "task"), event(2, "beta", "task")],
            idempotency: vec![("alpha".into(), "k1".into(), "evt_1".into(), 1, None)],
            lifecycles: vec![
                LifecycleChange::Begin {
                    agent: "alpha".into(),
                    task: "tsk_1".into(),
                    seq: 1,
                    at_ms: 100,
                    ttl_ms: 50,
                },
                LifecycleChange::Begin {
                    agent: "beta".into(),
                    task: "tsk_2".into(),
                    seq: 2,
                    at_ms: 100,
                    ttl_ms: 10_000,
                },
            ],
            ..Batch::default()
        })
        .unwrap();
    }
    drop(store);
    let store = h.reopen();
    let mut idx = store.open_index("g_inv").unwrap();
    assert_eq!(
        idx.idempotent("alpha", "k1").unwrap(),
        Some(("evt_1".into(), 1, None))
    );
    assert_eq!(
        idx.idempotent("beta", "k1").unwrap(),
        None,
        "keys are per actor"
    );
    assert_eq!(idx.idempotency_keys().unwrap(), 1);
    let lapsed: Vec<String> = idx
        .lapsed_begins(200, 10)
        .unwrap()
        .into_iter()
        .map(|l| l.task)
        .collect();
    assert_eq!(lapsed, ["tsk_1"]);
    idx.apply(&Batch {
        lifecycles: vec![LifecycleChange::Lapsed {
            agent: "alpha".into(),
            task: "tsk_1".into(),
        }],
        ..Batch::default()
    })
    .unwrap();
    assert!(idx.lifecycle("alpha", "tsk_1").unwrap().unwrap().lapsed);
    assert!(
        idx.lapsed_begins(200, 10).unwrap().is_empty(),
        "recorded once"
    );
    idx.apply(&Batch {
        lifecycles: vec![LifecycleChange::Resolve {
            task: "tsk_2".into(),
        }],
        ..Batch::default()
    })
    .unwrap();
    assert_eq!(
        idx.lifecycle("beta", "tsk_2").unwrap().unwrap().state,
        "resolved"
    );
    assert_eq!(idx.lifecycle("beta", "tsk_9").unwrap(), None);
}

/// Blobs round-trip by digest, are idempotent, and refuse a malformed or unknown digest.
pub fn blobs(h: &mut dyn Harness) {
    let store = h.fresh();
    store.create_shard("g_blob", b"{}", b"{}", &[]).unwrap();
    let sha = {
        let blobs = store.open_blobs("g_blob").unwrap();
        let sha = blobs.put(b"payload", "txt").unwrap();
        assert_eq!(blobs.put(b"payload", "txt").unwrap(), sha);
        assert_eq!(sha, room_core::sha256_hex(b"payload"));
        assert!(
            blobs.get("../../etc/passwd", "txt").is_err(),
            "not a digest"
        );
        assert!(blobs.get(&"0".repeat(64), "txt").is_err(), "unknown");
        assert_eq!(blobs.sweep_temps().unwrap(), 0);
        sha
    };
    drop(store);
    let store = h.reopen();
    assert_eq!(
        store
            .open_blobs("g_blob")
            .unwrap()
            .get(&sha, "txt")
            .unwrap(),
        b"payload"
    );
}

/// One writer per room at a time; writers of different rooms do not wait for each other.
pub fn writer_guard_serializes_one_room(h: &mut dyn Harness) {
    let store = h.fresh();
    let first = store.room_writer("g_w").unwrap();
    let other_room = store.room_writer("g_v").unwrap();
    drop(other_room);
    let second_held = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let (store, held) = (store.clone(), second_held.clone());
        std::thread::spawn(move || {
            tx.send(()).unwrap();
            let _g = store.room_writer("g_w").unwrap();
            held.store(true, Ordering::SeqCst);
        })
    };
    rx.recv().unwrap();
    // give the waiter time to reach the guard; whatever it has done, it cannot hold it
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(
        !second_held.load(Ordering::SeqCst),
        "two writers of one room"
    );
    drop(first);
    waiter.join().unwrap();
    assert!(second_held.load(Ordering::SeqCst));
}
