//! `room doctor` on a state dir with each problem planted: every one is reported with what to
//! do about it, a required one fails the exit status, and doctor changes nothing.

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

    fn state(&self) -> PathBuf {
        self.root.join("state")
    }

    /// `room ARGS` through `sh -c` so that `prefix` (a `ulimit`, say) applies to it.
    fn run(&self, prefix: &str, args: &str, envs: &[(&str, &str)]) -> Output {
        let mut c = std::process::Command::new("/bin/sh");
        c.arg("-c")
            .arg(format!(
                "{prefix} exec \"$ROOM\" {args} --json --state-dir \"$STATE\""
            ))
            .env("ROOM", env!("CARGO_BIN_EXE_room"))
            .env("STATE", self.state())
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("ROOM_LOG", "error");
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    fn doctor(&self, prefix: &str, envs: &[(&str, &str)]) -> (i32, serde_json::Value) {
        let o = self.run(prefix, "doctor", envs);
        let v = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
        (o.status.code().unwrap(), v)
    }
}

/// The check named `name`.
fn named<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {v}"))
}

#[test]
fn a_missing_state_dir_fails_with_its_fix() {
    let env = Env::new();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 1);
    let c = named(&v, "state_dir");
    assert_eq!(c["status"], "fail");
    assert_eq!(c["fix"], "room init");
    assert!(!env.state().exists(), "doctor creates nothing");
}

#[test]
fn each_planted_problem_is_reported_with_its_fix() {
    let env = Env::new();
    assert!(env.run("", "init", &[]).status.success());
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(named(&v, "modes")["status"], "ok");
    assert_eq!(named(&v, "daemon")["status"], "warn", "no daemon runs");
    // modes: others can read the state dir
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.state(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 1);
    let c = named(&v, "modes");
    assert_eq!(c["status"], "fail");
    assert!(c["fix"].as_str().unwrap().starts_with("chmod 700"), "{c}");
    std::fs::set_permissions(env.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // an HTTP listener a stopped daemon left recorded: nothing answers there
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    std::fs::write(env.state().join("http.addr"), addr.to_string()).unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 0, "a warning: {v}");
    let c = named(&v, "http");
    assert_eq!(c["status"], "warn", "{c}");
    assert_eq!(c["fix"], format!("room serve --listen {addr}"), "{c}");
    std::fs::remove_file(env.state().join("http.addr")).unwrap();
    let (_, v) = env.doctor("", &[]);
    assert_ne!(
        named(&v, "http")["fix"],
        format!("room serve --listen {addr}")
    );
    // no cgroup delegation, as ROOM_JOB_KIND says
    let (code, v) = env.doctor("", &[("ROOM_JOB_KIND", "subreaper")]);
    assert_eq!(code, 0, "subreaper jobs work: a warning");
    assert_eq!(named(&v, "jobs")["status"], "warn");
    // git, which diffs and working trees need, present here and missing from an empty PATH
    assert_eq!(named(&v, "git")["status"], "ok", "{v}");
    let (code, v) = env.doctor("", &[("PATH", "/nonexistent")]);
    assert_eq!(code, 0, "a warning");
    let c = named(&v, "git");
    assert_eq!(c["status"], "warn", "{c}");
    assert!(c["fix"].as_str().unwrap().contains("install git"), "{c}");
    // a descriptor limit below what a daemon wants
    let (_, v) = env.doctor("ulimit -n 128 &&", &[]);
    let c = named(&v, "descriptors");
    assert_eq!(c["status"], "warn", "{c}");
    assert!(c["fix"].as_str().unwrap().contains("LimitNOFILE"), "{c}");
    // a route whose program is not there, and one whose API key is not set
    std::fs::write(
        env.state().join("config.toml"),
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/nonexistent/agent\"]\n\n[routes.gamma]\nadapter = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"ROOM_DOCTOR_TEST_KEY_UNSET\"\n\n[backends.acp]\ncommand = [\"/nonexistent/acp-bridge\"]\n\n[backends.anthropic]\napi_key_env = \"ROOM_DOCTOR_TEST_BACKEND_KEY_UNSET\"\n\n[search.embeddings]\nbase_url = \"https://embed.example/v1\"\nmodel = \"e\"\napi_key_env = \"ROOM_DOCTOR_TEST_EMBED_KEY_UNSET\"\n",
    )
    .unwrap();
    let (_, v) = env.doctor("", &[]);
    let c = named(&v, "routes");
    assert_eq!(c["status"], "warn", "{c}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("/nonexistent/agent") && d.contains("ROOM_DOCTOR_TEST_KEY_UNSET"),
        "{c}"
    );
    // and the collaboration backends' ACP bridge and API key
    assert!(
        d.contains("/nonexistent/acp-bridge") && d.contains("ROOM_DOCTOR_TEST_BACKEND_KEY_UNSET"),
        "{c}"
    );
    // and semantic search's endpoint key
    assert!(d.contains("ROOM_DOCTOR_TEST_EMBED_KEY_UNSET"), "{c}");
    // a config the daemon cannot load
    std::fs::write(
        env.state().join("config.toml"),
        "[dispatch]\nworkers_max = 0\n",
    )
    .unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 1);
    assert_eq!(named(&v, "routes")["status"], "fail");
    // a free-space floor above what the disk has
    std::fs::write(
        env.state().join("config.toml"),
        "[dispatch]\nstate_dir_free_bytes_min = 9223372036854775807\n",
    )
    .unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 1);
    assert_eq!(named(&v, "free_space")["status"], "fail");
    std::fs::remove_file(env.state().join("config.toml")).unwrap();
    // a tree an earlier restore replaced, kept; then a restore left unfinished
    assert_eq!(named(&v, "restores")["status"], "ok");
    let kept = env.state().join(".restore/123-1/previous");
    std::fs::create_dir_all(&kept).unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 0, "a warning: {v}");
    let c = named(&v, "restores");
    assert_eq!(c["status"], "warn", "{c}");
    assert!(c["fix"].as_str().unwrap().contains("rm -r"), "{c}");
    std::fs::write(
        env.state().join("restore_pending.json"),
        r#"{"op":"123-1","fingerprint":"f","snapshot":"/backup/s","started_ms":1,"phase":"promoting"}"#,
    )
    .unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 1);
    let c = named(&v, "state_dir");
    assert!(
        c["detail"].as_str().unwrap().contains("restore pending"),
        "{c}"
    );
    assert!(c["fix"].as_str().unwrap().contains("room restore"), "{c}");
    std::fs::remove_file(env.state().join("restore_pending.json")).unwrap();
    std::fs::remove_dir_all(env.state().join(".restore")).unwrap();
    // the bootstrap that registered the state dir is gone: a split brain, refused at start
    std::fs::remove_file(env.root.join("config/room/bootstrap.toml")).unwrap();
    let (code, v) = env.doctor("", &[]);
    assert_eq!(code, 1);
    let c = named(&v, "state_dir");
    assert_eq!(c["status"], "fail");
    assert!(c["detail"].as_str().unwrap().contains("bootstrap"), "{c}");
}
