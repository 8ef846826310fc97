//! `room adapters probe`: each adapter's declared capability matrix checked against a real
//! process or server. The ACP probe runs the suite's ACP SDK agent (`tests/acp/agent.py`):
//! one that honours a rejected permission request holds a declared hard deny; one that
//! writes without asking is drift against it (exit 1); the API adapters run against the
//! probe's own scripted model on loopback. Needs the venv scripts/test makes.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    let p = std::env::var_os("ROOM_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    // absolute, not canonical: a venv's python finds its packages only by its own path
    let dir = std::fs::canonicalize(p.parent().unwrap()).unwrap();
    dir.join(p.file_name().unwrap())
}

fn probe(args: &[&str], agent_mode: Option<&str>) -> (i32, Value, String) {
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_room"));
    cmd.args(["adapters", "probe"])
        .args(args)
        .args(["--json", "--state-dir"])
        .arg(state.path());
    if let Some(mode) = agent_mode {
        let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
        cmd.arg("--").arg(python()).arg(agent).arg(mode);
    }
    let o = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v, stderr)
}

fn capability<'a>(v: &'a Value, adapter: &str, cap: &str) -> &'a Value {
    v["adapters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["adapter"] == adapter)
        .and_then(|a| {
            a["capabilities"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["capability"] == cap)
        })
        .unwrap_or_else(|| panic!("no {adapter} {cap}: {v:#}"))
}

#[test]
fn an_agent_declared_hard_that_writes_without_asking_is_drift() {
    let (code, v, err) = probe(&["acp", "--declare", "tool_deny=hard"], Some("ignore_deny"));
    assert_eq!(code, 1, "{v:#} {err}");
    assert_eq!(v["drift"], true);
    let deny = capability(&v, "acp", "tool_deny");
    assert_eq!(deny["verdict"], "drift", "{deny}");
    assert_eq!(deny["observed"], "advisory");
    // Room's own declaration for ACP is advisory: the same agent is no drift against it
    let (code, v, err) = probe(&["acp"], Some("ignore_deny"));
    assert_eq!(code, 0, "{v:#} {err}");
    assert_eq!(capability(&v, "acp", "tool_deny")["verdict"], "ok");
}

#[test]
fn an_agent_that_honours_a_rejected_request_holds_a_declared_hard_deny() {
    let (code, v, err) = probe(&["acp", "--declare", "tool_deny=hard"], Some("obey"));
    assert_eq!(code, 0, "{v:#} {err}");
    let deny = capability(&v, "acp", "tool_deny");
    assert_eq!(
        (&deny["observed"], &deny["verdict"]),
        (&"hard".into(), &"ok".into()),
        "{deny}"
    );
    let approval = capability(&v, "acp", "approval");
    assert_eq!(approval["observed"], "permission_requests", "{approval}");
    assert_eq!(capability(&v, "acp", "warm_resume")["observed"], "none");
    // asked to wait, it ends its turn on session/cancel; its job then empties
    for (cap, seen) in [
        ("interrupt", "session_cancel"),
        ("cancel", "zero_processes"),
    ] {
        let c = capability(&v, "acp", cap);
        assert_eq!(
            (&c["observed"], &c["verdict"]),
            (&seen.into(), &"ok".into()),
            "{c}"
        );
    }
}

#[test]
fn an_agent_that_ignores_session_cancel_is_drift_yet_its_job_still_empties() {
    let (code, v, err) = probe(&["acp"], Some("obey_ignore_cancel"));
    assert_eq!(code, 1, "{v:#} {err}");
    let interrupt = capability(&v, "acp", "interrupt");
    assert_eq!(
        (&interrupt["observed"], &interrupt["verdict"]),
        (&"job_stop".into(), &"drift".into()),
        "{interrupt}"
    );
    // its grandchild (a sleep it started) went with its job
    let cancel = capability(&v, "acp", "cancel");
    assert_eq!(
        (&cancel["observed"], &cancel["verdict"]),
        (&"zero_processes".into(), &"ok".into()),
        "{cancel}"
    );
    assert_eq!(
        marked_children(),
        Vec::<u32>::new(),
        "the agent's child outlived the probe"
    );
}

/// Live processes whose command line carries the test agent's child marker (only this
/// test's agent starts them in this binary).
fn marked_children() -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmd).contains("room-test-child-") {
            out.push(pid);
        }
    }
    out
}

#[test]
fn the_api_adapters_refuse_an_unlisted_tool_report_usage_and_drop_a_hung_request() {
    for adapter in ["openai", "anthropic"] {
        let (code, v, err) = probe(&[adapter], None);
        assert_eq!(code, 0, "{v:#} {err}");
        for (cap, seen) in [
            ("tool_deny", "hard"),
            ("cost", "usage_records"),
            ("interrupt", "request_dropped"),
        ] {
            let c = capability(&v, adapter, cap);
            assert_eq!(
                (&c["observed"], &c["verdict"]),
                (&seen.into(), &"ok".into()),
                "{c}"
            );
        }
        // what it cannot observe offline it says so
        assert_eq!(capability(&v, adapter, "cancel")["verdict"], "not_probed");
    }
}

#[test]
fn a_probe_refuses_what_it_cannot_check() {
    let (code, v, err) = probe(&["acp", "--declare", "speed=fast"], None);
    assert_eq!((code, v), (1, Value::Null));
    assert!(err.contains("error[invalid_argument]: declare"), "{err}");
    let (code, _, err) = probe(&["telepathy"], None);
    assert_eq!(code, 1);
    assert!(err.contains("error[invalid_argument]: adapter"), "{err}");
    // no agent configured nor given: said, not guessed
    let (code, v, _) = probe(&["acp"], None);
    assert_eq!(code, 0, "{v:#}");
    assert!(
        v["adapters"][0]["note"]
            .as_str()
            .unwrap()
            .starts_with("no agent to probe"),
        "{v:#}"
    );
    assert_eq!(capability(&v, "acp", "tool_deny")["verdict"], "not_probed");
}

/// The published ACP bridges (installed by scripts/test into tests/mcp/npm), each probed in a
/// network namespace with no interface: the handshake is observed (warm resume), what an
/// offline agent cannot show is said, never guessed, and wherever a turn ran its job is
/// stopped with zero processes observed; the probe ends within its bounds.
#[test]
fn the_published_bridges_are_probed_offline_and_their_jobs_empty() {
    assert!(
        Command::new("/usr/bin/unshare")
            .args(["--net", "--", "/bin/true"])
            .status()
            .is_ok_and(|s| s.success()),
        "unshare --net is not available here"
    );
    let nm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/npm/node_modules");
    let nm = std::fs::canonicalize(&nm).unwrap_or(nm);
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
    std::fs::write(
        home.path().join(".gemini/settings.json"),
        r#"{"privacy":{"usageStatisticsEnabled":false},"telemetry":{"enabled":false},
            "general":{"enableAutoUpdate":false,"enableAutoUpdateNotification":false}}"#,
    )
    .unwrap();
    let node = "/usr/bin/node".to_string();
    let bridges: [(&str, Vec<String>); 3] = [
        (
            "claude",
            vec![
                node.clone(),
                nm.join("@zed-industries/claude-agent-acp/dist/index.js")
                    .display()
                    .to_string(),
            ],
        ),
        (
            "codex",
            vec![
                nm.join("@zed-industries/codex-acp-linux-x64/bin/codex-acp")
                    .display()
                    .to_string(),
            ],
        ),
        (
            "gemini",
            vec![
                node,
                nm.join("@google/gemini-cli/bundle/gemini.js")
                    .display()
                    .to_string(),
                "--acp".into(),
            ],
        ),
    ];
    for (name, argv) in bridges {
        assert!(
            Path::new(argv.last().unwrap()).exists() || Path::new(&argv[1]).exists(),
            "{name}: {argv:?} is missing\nhint: run scripts/test once (it installs tests/mcp/npm)"
        );
        let state = tempfile::tempdir().unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_room"))
            .args(["adapters", "probe", "acp", "--json", "--state-dir"])
            .arg(state.path())
            .args(["--", "/usr/bin/unshare", "--net", "--"])
            .args(&argv)
            .env("HOME", home.path())
            .env("CODEX_API_KEY", "dummy-key-for-tests")
            .env("GEMINI_API_KEY", "dummy-key-for-tests")
            .env_remove("ANTHROPIC_API_KEY")
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{name}: {v:#} {err}"
        );
        // the handshake answered: initialize's loadSession was seen
        let warm = capability(&v, "acp", "warm_resume");
        assert_eq!(warm["verdict"], "ok", "{name}: {warm}");
        // nothing offline is taken for a hard deny or a proven cost
        for cap in ["tool_deny", "cost"] {
            let c = capability(&v, "acp", cap);
            assert!(
                matches!(c["verdict"].as_str(), Some("unproven" | "not_probed")),
                "{name}: {c}"
            );
        }
        // wherever the interrupt turn ran, its job emptied
        let cancel = capability(&v, "acp", "cancel");
        if cancel["verdict"] != "not_probed" {
            assert_eq!(cancel["observed"], "zero_processes", "{name}: {cancel}");
        }
        eprintln!("{name}: {}", v["adapters"][0]);
    }
}
