//! The delegated identity tree through the daemon: owner → orchestrator → role child, each a
//! principal holding at most what its parent holds. A child minting a wider scope or tier is
//! refused `scope_escalation_refused`, a tree past its depth `delegation_too_deep`, both
//! writing nothing; revoking a node revokes its subtree at once, and every credential below it
//! is refused on its next call, naming the revoked ancestor.

mod common;
use common::*;
use serde_json::json;

/// The owner mints the orchestrator (a root holding `session:read` and `session:dispatch`
/// only) and, as its profile sanctions, a reviewer under it; the two tokens.
fn tree(fx: &mut Fx) -> (String, String) {
    let orch = fx.ok(
        None,
        "agent_delegate",
        json!({"name": "orch", "scopes": ["session:dispatch", "session:read"],
            "max_tier": "coordinator"}),
    );
    assert_eq!(orch["depth"], 0);
    assert_eq!(orch["parent"], serde_json::Value::Null);
    let reviewer = fx.ok(
        None,
        "agent_delegate",
        json!({"parent": "orch", "name": "reviewer", "max_tier": "member",
            "scopes": ["artifact:read:diff", "artifact:read:spec", "artifact:write:findings"]}),
    );
    assert_eq!(reviewer["depth"], 1);
    (
        orch["token"].as_str().unwrap().to_string(),
        reviewer["token"].as_str().unwrap().to_string(),
    )
}

#[test]
fn a_child_holds_at_most_what_its_parent_holds() {
    let mut fx = Fx::new();
    let (orch, _reviewer) = tree(&mut fx);
    // the orchestrator cannot give what it does not hold: a write scope, or a higher tier
    let r = fx.refuse(
        Some(&orch),
        "delegate",
        json!({"name": "writer", "scopes": ["project:write"]}),
        "scope_escalation_refused",
    );
    assert_eq!(r.detail["scope"], "project:write", "{r}");
    let r = fx.refuse(
        Some(&orch),
        "delegate",
        json!({"name": "boss", "scopes": ["session:read"], "max_tier": "operator"}),
        "scope_escalation_refused",
    );
    assert_eq!(r.detail["field"], "max_tier", "{r}");
    // what it holds, it may give
    let helper = fx.ok(
        Some(&orch),
        "delegate",
        json!({"name": "helper", "scopes": ["session:read"]}),
    );
    assert_eq!(helper["parent"], "orch");
    assert_eq!(helper["max_tier"], "coordinator");
    let listed = fx.ok(None, "agent_list", json!({}));
    let h = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "helper")
        .unwrap()
        .clone();
    assert_eq!(h["parent"], "orch");
    assert_eq!(h["scopes"], json!(["session:read"]));
    // not a scope of the vocabulary, and a parent named by an agent
    let r = fx.refuse(
        Some(&orch),
        "delegate",
        json!({"name": "odd", "scopes": ["session:everything"]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "scopes[0]");
    fx.refuse(
        Some(&orch),
        "delegate",
        json!({"parent": "reviewer", "name": "odd", "scopes": []}),
        "invalid_argument",
    );
}

#[test]
fn the_tree_is_bounded_in_depth() {
    let mut fx = Fx::new();
    let (orch, _) = tree(&mut fx);
    // an agent's child: recorded under it, its credential never shown to the parent
    let v = fx.ok(
        Some(&orch),
        "delegate",
        json!({"name": "level1", "scopes": ["session:read"]}),
    );
    assert_eq!(v["depth"], 1);
    assert!(v.get("token").is_none(), "{v}");
    let mut parent = "level1".to_string();
    let mut token = String::new();
    for depth in 2..=4 {
        let v = fx.ok(
            None,
            "agent_delegate",
            json!({"parent": parent, "name": format!("level{depth}"), "scopes": ["session:read"]}),
        );
        assert_eq!(v["depth"], depth);
        parent = format!("level{depth}");
        token = v["token"].as_str().unwrap().to_string();
    }
    let r = fx.refuse(
        Some(&token),
        "delegate",
        json!({"name": "level5", "scopes": ["session:read"]}),
        "delegation_too_deep",
    );
    assert_eq!(r.detail["depth_max"], 4);
    fx.refuse(
        None,
        "agent_delegate",
        json!({"parent": "level4", "name": "level5", "scopes": []}),
        "delegation_too_deep",
    );
}

#[test]
fn revoking_a_node_revokes_its_subtree_at_once() {
    let mut fx = Fx::new();
    let (orch, reviewer) = tree(&mut fx);
    fx.ok(
        Some(&orch),
        "delegate",
        json!({"name": "sub", "scopes": ["session:read"]}),
    );
    let grand = fx.ok(
        None,
        "agent_delegate",
        json!({"parent": "sub", "name": "grand", "scopes": ["session:read"]}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let beside = fx.enroll("beside", "member");
    fx.ok(Some(&reviewer), "whoami", json!({}));
    let v = fx.ok(None, "agent_revoke", json!({"name": "orch"}));
    let mut subtree: Vec<&str> = v["subtree"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    subtree.sort();
    assert_eq!(subtree, ["grand", "orch", "reviewer", "sub"]);
    for t in [&reviewer, &grand] {
        let r = fx.call(Some(t), "whoami", json!({}));
        let r = expect_code(r, "credential_revoked", "a child of a revoked node");
        assert_eq!(r.detail["revoked_by"], "orch", "{r}");
        assert!(r.message.contains("ancestor orch"), "{r}");
    }
    fx.ok(Some(&beside), "whoami", json!({}));
    // a node revoked with its ancestor comes back only after it
    fx.refuse(
        None,
        "agent_rotate",
        json!({"name": "reviewer"}),
        "invalid_argument",
    );
    fx.ok(None, "agent_rotate", json!({"name": "orch"}));
    let again = fx.ok(None, "agent_rotate", json!({"name": "reviewer"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    fx.ok(Some(&again), "whoami", json!({}));
    fx.ok(None, "agent_revoke", json!({"name": "orch"}));
    // nothing is delegated under a revoked node
    fx.refuse(
        None,
        "agent_delegate",
        json!({"parent": "orch", "name": "late", "scopes": []}),
        "invalid_argument",
    );
}
