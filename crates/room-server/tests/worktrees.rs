//! A collaboration's working trees through the daemon (issue 41, item 1): an implementing
//! role gets a tree of its own beneath the state directory, made at the start from the
//! project (here a plain directory: a copy made a repository, the base); `diff_from_tree`
//! writes the `diff` artifact from that tree against the base; a diff written any other way
//! must name that base and apply there. Every refusal leaves the journal, the tasks and the
//! wakes as they were; the trees go when the collaboration is cancelled.

mod common;
use common::*;
use serde_json::{Value, json};

/// Three roles, each phase waiting for the person's approval (so no worker runs): reasoning
/// implements (a tree), architecture may write a diff too (no tree: it reads the project),
/// search writes research only.
const PACK: &str = r#"name = "trees"

[[phases]]
name = "implementation"
kind = "agent"
role = "reasoning"
writes = ["diff"]
prompt = "p.md"
approve = true

[[phases]]
name = "alternative"
kind = "agent"
role = "architecture"
writes = ["diff"]
after = ["implementation"]
prompt = "p.md"
approve = true

[[phases]]
name = "research"
kind = "agent"
role = "search"
writes = ["research"]
prompt = "p.md"
approve = true
"#;

fn start(fx: &mut Fx) -> (String, Value) {
    let (dir, prj) = fx.open_project("greeter");
    std::fs::write(dir.join("greet.txt"), "hello\n").unwrap();
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "greet verbosely", "project": prj, "pack": PACK,
            "prompts": {"p.md": "do it"},
            "roles": ["reasoning=script:read", "architecture=script:read", "search=script:read"]}),
    );
    (v["collab"].as_str().unwrap().to_string(), v)
}

fn token(fx: &mut Fx, agent: &str) -> String {
    fx.ok(None, "agent_rotate", json!({"name": agent}))["token"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_diff_comes_from_the_implementer_s_tree_against_the_base_and_every_refusal_changes_nothing() {
    let mut fx = Fx::new();
    let (id, started) = start(&mut fx);
    let trees = started["trees"].clone();
    assert_eq!(trees["source"], "copy", "{started}");
    let base = trees["base"].as_str().unwrap().to_string();
    let tree =
        std::path::PathBuf::from(trees["trees"][format!("{id}-reasoning")].as_str().unwrap());
    assert_eq!(tree, fx.state.join("trees").join(&id).join("reasoning"));
    assert_eq!(
        trees["trees"].as_object().unwrap().len(),
        1,
        "only the role that writes the project works in a tree: {trees}"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("greet.txt")).unwrap(),
        "hello\n"
    );
    let (r, a, s) = (
        token(&mut fx, &format!("{id}-reasoning")),
        token(&mut fx, &format!("{id}-architecture")),
        token(&mut fx, &format!("{id}-search")),
    );
    for t in [&r, &a, &s] {
        fx.sync_all(t, &id);
    }
    let take = |room: &str| json!({"room": room, "expected_version": 0});
    let patch = |file: &str| {
        format!("--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-hello\n+hello, verbosely\n")
    };
    let before = fx.snapshot();
    // a clean tree has nothing to take
    let e = fx.refuse(Some(&r), "diff_from_tree", take(&id), "invalid_argument");
    assert_eq!(e.detail["field"], "tree", "{e}");
    // a role without a tree, and one without the diff's write scope
    let e = fx.refuse(Some(&a), "diff_from_tree", take(&id), "invalid_argument");
    assert_eq!(e.detail["field"], "room", "{e}");
    fx.refuse(
        Some(&s),
        "diff_from_tree",
        take(&id),
        "artifact_write_denied",
    );
    fx.refuse(
        Some(&r),
        "diff_from_tree",
        take("elsewhere"),
        "room_not_found",
    );
    let e = fx.refuse(
        Some(&r),
        "diff_from_tree",
        json!({"room": id, "expected_version": 0, "content": {}}),
        "invalid_argument",
    );
    assert!(e.to_string().contains("content"), "{e}");
    // a diff written directly names the collaboration's base and applies there
    let put = |base: &str, patch: String| {
        json!({"room": id, "kind": "diff", "expected_version": 0,
            "content": {"base": base, "patch": patch}})
    };
    let e = fx.refuse(
        Some(&r),
        "artifact_put",
        put(&"0".repeat(40), patch("greet.txt")),
        "artifact_diff_does_not_apply",
    );
    assert_eq!(e.detail["field"], "base", "{e}");
    fx.refuse(
        Some(&a),
        "artifact_put",
        put(&base, patch("absent.txt")),
        "artifact_diff_does_not_apply",
    );
    assert_eq!(fx.snapshot(), before);

    // the implementer changes its tree: Room takes the diff, new files included
    std::fs::write(tree.join("greet.txt"), "hello, verbosely\n").unwrap();
    std::fs::write(tree.join("NEWS"), "a flag\n").unwrap();
    let v = fx.ok(
        Some(&r),
        "diff_from_tree",
        json!({"room": id, "expected_version": 0, "summary": "verbose"}),
    );
    assert_eq!(v["verb"], "note", "{v}");
    let got = fx.ok(None, "collab_artifact", json!({"room": id, "kind": "diff"}));
    assert_eq!(got["version"], 1, "{got}");
    assert_eq!(got["content"]["base"], base.as_str());
    assert_eq!(got["content"]["summary"], "verbose");
    let text = got["content"]["patch"].as_str().unwrap();
    assert!(
        text.contains("+hello, verbosely") && text.contains("+++ b/NEWS"),
        "{text}"
    );
    assert_eq!(got["producer"], format!("{id}-reasoning"));
    // a second take names the version it follows
    fx.sync_all(&r, &id);
    let before = fx.snapshot();
    fx.refuse(
        Some(&r),
        "diff_from_tree",
        take(&id),
        "artifact_version_conflict",
    );
    // the direct write at the right base applies too (another role's alternative)
    fx.sync_all(&a, &id);
    assert_eq!(fx.snapshot(), before);
    let mut alt = put(&base, patch("greet.txt"));
    alt["expected_version"] = json!(1);
    fx.ok(Some(&a), "artifact_put", alt);
    // the person's project never changed
    let dir = fx.root.join("work/greeter");
    assert_eq!(
        std::fs::read_to_string(dir.join("greet.txt")).unwrap(),
        "hello\n"
    );
    assert!(!dir.join("NEWS").exists());

    // cancelled: the trees go, and the implementer's credential with them
    fx.ok(None, "collab_cancel", json!({"id": id}));
    assert!(!fx.state.join("trees").join(&id).exists());
    fx.refuse(Some(&r), "diff_from_tree", take(&id), "credential_revoked");
}
