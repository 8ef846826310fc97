//! `room collab check` and `room collab artifact` as a user meets them: every refusal code of
//! profiles, packs and artifacts reached through the command line, with its field, and a valid
//! pack printed in its order. These commands read files and write nothing.

use std::path::PathBuf;
use std::process::Output;

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        Env { root, _tmp: tmp }
    }

    fn run(&self, args: &[&str]) -> Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_room"))
            .args(args)
            .arg("--json")
            .arg("--state-dir")
            .arg(self.root.join("state"))
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("ROOM_LOG", "error")
            .output()
            .unwrap()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.root.join(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} / {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The refusal of `o`, which must have exited 1 with `code`.
#[track_caller]
fn refused(o: &Output, code: &str) -> serde_json::Value {
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = json(o)["refusal"].clone();
    assert_eq!(r["code"], code, "{r}");
    r
}

const BOUND: [&str; 12] = [
    "--role",
    "orchestrator=anthropic:claude-sonnet",
    "--role",
    "search=openai:gpt-4.1",
    "--role",
    "reasoning=acp:codex",
    "--role",
    "architecture=openai:o3",
    "--role",
    "review=acp:gemini",
    "--role",
    "review=anthropic:claude-opus",
];

fn check(env: &Env, extra: &[&str]) -> Output {
    let mut args = vec!["collab", "check"];
    args.extend_from_slice(extra);
    env.run(&args)
}

#[test]
fn the_shipped_pack_checks_once_every_role_is_bound() {
    let env = Env::new();
    // the orchestrator may stay unbound (Room's scheduler orchestrates): the first role the
    // phases use is the first refused
    let r = refused(&check(&env, &[]), "profile_invalid");
    assert_eq!(r["detail"]["role"], "search");
    assert_eq!(r["detail"]["field"], "adapter");
    let o = check(&env, &BOUND[2..]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = check(&env, &BOUND);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&o);
    assert_eq!(v["pack"], "default");
    let phases: Vec<&str> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "spec",
            "research",
            "architecture",
            "implementation",
            "gate",
            "review",
            "approval"
        ]
    );
    // research and architecture come after spec only: they run in parallel
    assert_eq!(v["phases"][1]["after"], serde_json::json!(["spec"]));
    assert_eq!(v["phases"][2]["after"], serde_json::json!(["spec"]));
    // the shipped review panel seats two reviewers, each on its own backend
    let r = refused(&check(&env, &BOUND[..10]), "profile_invalid");
    assert_eq!(r["detail"]["role"], "review-2", "{r}");
    let mut same = BOUND.to_vec();
    same[11] = "review=acp:gemini";
    let r = refused(&check(&env, &same), "panel_backends_not_distinct");
    assert_eq!(
        r["detail"]["seats"],
        serde_json::json!(["review", "review-2"]),
        "{r}"
    );
    // a role added by configuration: bound, it is a role of the profile; no phase of the
    // shipped pack runs it, which the check says
    let mut more = BOUND.to_vec();
    more.extend(["--role", "security-reviewer=anthropic:claude-opus"]);
    let v = json(&check(&env, &more));
    assert_eq!(
        v["unused_bindings"],
        serde_json::json!(["security-reviewer"]),
        "{v:#}"
    );
    // the role picker's matrix: each bound role's capabilities, advisory tool deny flagged
    let caps = v["capabilities"].as_array().unwrap();
    let arch = caps.iter().find(|c| c["role"] == "architecture").unwrap();
    assert_eq!(arch["capabilities"]["tool_deny"], "hard", "{arch}");
    let reasoning = caps.iter().find(|c| c["role"] == "reasoning").unwrap();
    assert_eq!(
        reasoning["capabilities"]["tool_deny"], "advisory",
        "{reasoning}"
    );
    assert!(
        reasoning["flag"]
            .as_str()
            .unwrap()
            .contains("room adapters probe acp")
    );
}

#[test]
fn bindings_are_refused_by_role_and_field() {
    let env = Env::new();
    let mut args = BOUND.to_vec();
    args[9] = "review=acp:cursor";
    let r = refused(&check(&env, &args), "profile_invalid");
    assert_eq!(
        (r["detail"]["role"].as_str(), r["detail"]["field"].as_str()),
        (Some("review"), Some("preset"))
    );
    let mut args = BOUND.to_vec();
    args[1] = "orchestrator=telepathy:x";
    let r = refused(&check(&env, &args), "profile_invalid");
    assert_eq!(r["detail"]["field"], "adapter");
    let r = refused(
        &check(&env, &["--role", "orchestrator"]),
        "invalid_argument",
    );
    assert_eq!(r["detail"]["field"], "role");
}

const TWO: &str = r#"
name = "t"
[[phases]]
name = "a"
kind = "agent"
role = "architecture"
writes = ["spec"]
prompt = "prompts/a.md"
[[phases]]
name = "b"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
"#;

#[test]
fn packs_are_refused_with_their_codes() {
    let env = Env::new();
    env.write("prompts/a.md", "write the spec");
    let ok = env.write("two.toml", TWO);
    // a bound orchestrator needs the pack's [orchestrator] prompt
    let args = [&["--pack", ok.to_str().unwrap()][..], &BOUND[..10]].concat();
    let r = refused(&check(&env, &args), "pack_invalid");
    assert_eq!(r["detail"]["field"], "orchestrator.prompt", "{r}");
    let o = check(
        &env,
        &[&["--pack", ok.to_str().unwrap()][..], &BOUND[2..10]].concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cases = [
        (
            TWO.replace(
                "kind = \"agent\"\nrole = \"search\"",
                "kind = \"dance\"\nrole = \"search\"",
            ),
            "pack_invalid",
            "phases[1].kind",
        ),
        (
            TWO.replace("role = \"search\"", "role = \"oracle\""),
            "pack_invalid",
            "phases[1].role",
        ),
        (
            TWO.replace("reads = [\"spec\"]", "reads = [\"adr\"]"),
            "pack_invalid",
            "phases[1].reads[0]",
        ),
        (
            TWO.replace("prompts/a.md", "prompts/missing.md"),
            "pack_invalid",
            "phases[0].prompt",
        ),
        (
            TWO.replace(
                "role = \"architecture\"\nwrites",
                "role = \"architecture\"\nreads = [\"research\"]\nwrites",
            ),
            "pack_cycle",
            "",
        ),
        (
            format!(
                "{TWO}\n[[phases]]\nname = \"c\"\nkind = \"agent\"\nrole = \"architecture\"\nreads = [\"spec\"]\nwrites = [\"research\"]\n"
            ),
            "pack_write_overlap",
            "",
        ),
    ];
    for (i, (text, code, field)) in cases.iter().enumerate() {
        let p = env.write(&format!("case{i}.toml"), text);
        let r = refused(
            &check(
                &env,
                &[&["--pack", p.to_str().unwrap()][..], &BOUND[..10]].concat(),
            ),
            code,
        );
        if !field.is_empty() {
            assert_eq!(r["detail"]["field"], *field, "case {i}: {r}");
        }
        if *code == "pack_cycle" {
            assert_eq!(r["detail"]["cycle"].as_array().unwrap().len(), 3, "{r}");
        }
    }
    // a pack file that is not there is an I/O error, not a refusal
    let o = check(&env, &["--pack", "/nonexistent/pack.toml"]);
    assert_eq!(o.status.code(), Some(3));
}

#[test]
fn artifacts_are_checked_against_their_kind() {
    let env = Env::new();
    let diff = env.write(
        "diff.json",
        r#"{"base": "abc123", "patch": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"}"#,
    );
    let o = env.run(&["collab", "artifact", "diff", diff.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json(&o)["valid"], true);
    let bad = env.write(
        "bad.json",
        r#"{"title": "t", "goal": "g", "requirements": [3]}"#,
    );
    let r = refused(
        &env.run(&["collab", "artifact", "spec", bad.to_str().unwrap()]),
        "artifact_schema_invalid",
    );
    assert_eq!(r["detail"]["field"], "requirements[0]");
    let text = env.write("notes.txt", "plain words, not JSON");
    let r = refused(
        &env.run(&["collab", "artifact", "spec", text.to_str().unwrap()]),
        "artifact_schema_invalid",
    );
    assert_eq!(r["detail"]["field"], "(content)");
    let r = refused(
        &env.run(&["collab", "artifact", "memo", diff.to_str().unwrap()]),
        "invalid_argument",
    );
    assert_eq!(r["detail"]["field"], "kind");
}

/// Completions and the manual page come from the same grammar as `--help`, so they name every
/// command there is (`collab` among them).
#[test]
fn completions_and_the_manual_page_are_generated_from_the_grammar() {
    let env = Env::new();
    for shell in ["bash", "zsh", "fish"] {
        let o = env.run(&["completions", shell]);
        assert!(
            o.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("collab") && text.contains("verify"),
            "{shell}"
        );
    }
    let o = env.run(&["man"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.starts_with(".ie") || text.starts_with(".TH"),
        "{}",
        &text[..80.min(text.len())]
    );
    assert!(text.contains("collab"));
    let o = env.run(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2), "clap refuses an unknown shell");
}
