//! `room doctor`: what Room needs of this machine and of the state directory, checked before
//! it bites, each with what to do about it. A check is `ok`, `warn` (Room works, with less:
//! subreaper jobs instead of cgroup leaves, workers unconfined) or `fail` (something required
//! is missing or wrong); the exit status is 1 when any check fails. `--json` prints the list.
//! It changes nothing: probes run in a scratch directory it removes.

use crate::cmd::Cli;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The rooms a daemon should be able to keep open at once for the descriptor limit to count
/// as enough.
const ROOMS_OPEN_WANTED: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    fix: Option<String>,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        fix: None,
    }
}

impl Check {
    fn fix(mut self, f: impl Into<String>) -> Check {
        self.fix = Some(f.into());
        self
    }
}

pub fn run(cli: &Cli) -> i32 {
    let state = crate::cmd::state_dir(cli);
    let mut checks = vec![state_dir(&state)];
    if state.is_dir() {
        checks.push(modes(&state));
        checks.push(free_space(&state));
        let answers = daemon(&state);
        checks.push(http(&state, answers.status == Status::Ok));
        checks.push(answers);
        checks.push(routes(&state));
        checks.push(restores(&state));
    }
    checks.push(jobs());
    checks.push(confinement());
    checks.push(descriptors());
    checks.push(git());
    let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    if cli.json {
        let list: Vec<Value> = checks
            .iter()
            .map(|c| {
                json!({"check": c.name, "status": c.status.as_str(), "detail": c.detail,
                    "fix": c.fix})
            })
            .collect();
        println!(
            "{}",
            json!({"state_dir": state, "status": worst.as_str(), "checks": list})
        );
    } else {
        for c in &checks {
            println!("{:<5} {:<12} {}", c.status.as_str(), c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("{:<5} {:<12} fix: {f}", "", "");
            }
        }
    }
    if worst == Status::Fail { 1 } else { 0 }
}

/// The state directory validates against its marker and the machine's bootstrap.
fn state_dir(state: &Path) -> Check {
    if !state.exists() {
        return check(
            "state_dir",
            Status::Fail,
            format!("{} does not exist", state.display()),
        )
        .fix("room init");
    }
    match room_store::statedir::validate(state, &room_store::statedir::default_bootstrap_path()) {
        Ok(s) => check(
            "state_dir",
            Status::Ok,
            format!(
                "{} (instance {}), registered in {}",
                s.root.display(),
                s.instance_id,
                room_store::statedir::default_bootstrap_path().display()
            ),
        ),
        Err(e @ room_store::StoreError::RestorePending(_)) => {
            check("state_dir", Status::Fail, e.to_string()).fix(
                "run the same `room restore SNAPSHOT` again: it resumes where it stopped",
            )
        }
        Err(e) => check("state_dir", Status::Fail, e.to_string()).fix(
            "a state dir copied or moved is refused on purpose; run `room init` on a fresh directory, or restore the bootstrap that registered this one",
        ),
    }
}

/// Trees earlier restores replaced, kept in `.restore/OP/previous` until the owner removes
/// them: worth knowing about, since each can be as large as the state.
fn restores(state: &Path) -> Check {
    let work = state.join(room_store::snapshot::WORK);
    let kept: Vec<PathBuf> = std::fs::read_dir(&work)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path().join("previous"))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    if kept.is_empty() {
        return check("restores", Status::Ok, "no replaced tree kept");
    }
    let names: Vec<String> = kept.iter().map(|p| p.display().to_string()).collect();
    check(
        "restores",
        Status::Warn,
        format!(
            "{} tree(s) replaced by a restore are kept: {}",
            kept.len(),
            names.join(", ")
        ),
    )
    .fix(format!(
        "once the restored state serves, remove them: rm -r {}",
        names.join(" ")
    ))
}

/// The state directory is its owner's alone (journals hold what agents wrote, control.db their
/// credentials' digests).
fn modes(state: &Path) -> Check {
    match std::fs::metadata(state) {
        Ok(m) if m.permissions().mode() & 0o077 == 0 => check(
            "modes",
            Status::Ok,
            "the state dir is the owner's alone (0700)",
        ),
        Ok(m) => check(
            "modes",
            Status::Fail,
            format!(
                "the state dir is mode {:o}: others can read what agents wrote",
                m.permissions().mode() & 0o777
            ),
        )
        .fix(format!("chmod 700 {}", state.display())),
        Err(e) => check("modes", Status::Fail, e.to_string()),
    }
}

/// Free space against the floor below which no worker starts (`[dispatch]
/// state_dir_free_bytes_min`).
fn free_space(state: &Path) -> Check {
    let floor = std::fs::read(state.join("config.toml"))
        .ok()
        .and_then(|b| room_engine::policy::policy_of(&b).ok())
        .map_or(room_engine::policy::STATE_DIR_FREE_BYTES_MIN_DEFAULT, |p| {
            p.state_dir_free_bytes_min
        });
    match rustix::fs::statvfs(state) {
        Ok(s) => {
            let free = s.f_bavail.saturating_mul(s.f_frsize);
            if free < floor {
                check(
                    "free_space",
                    Status::Fail,
                    format!("{free} bytes free, under the floor of {floor}: no worker starts"),
                )
                .fix("free space on the state dir's file system, or lower [dispatch] state_dir_free_bytes_min")
            } else {
                check(
                    "free_space",
                    Status::Ok,
                    format!("{free} bytes free (floor {floor})"),
                )
            }
        }
        Err(e) => check("free_space", Status::Fail, e.to_string()),
    }
}

/// Whether a daemon answers on the state dir's socket (not required: offline commands work).
fn daemon(state: &Path) -> Check {
    let sock = state.join("room.sock");
    let req = room_server::wire::Request {
        op: "ping".into(),
        token: None,
        conversation: None,
        tier: None,
        args: json!({}),
        meta: None,
        page_bytes_max: None,
    };
    match room_server::client::Client::connect(&sock).and_then(|mut c| c.request(&req)) {
        Ok(v) => check("daemon", Status::Ok, format!("answers (pid {})", v["pid"])),
        Err(_) => check("daemon", Status::Warn, "no daemon answers on the socket")
            .fix("room serve (agents and wakes need it; verify and doctor do not)"),
    }
}

/// The port `room serve --listen` suggests when none is given.
const HTTP_PORT_DEFAULT: u16 = 7878;

/// The HTTP listener (MCP over HTTP at `/mcp`, the dashboard at `/`): the one `http.addr`
/// names answers, or, with none, whether the usual port is free to listen on.
fn http(state: &Path, daemon_answers: bool) -> Check {
    use std::io::{Read, Write};
    let recorded = std::fs::read_to_string(state.join("http.addr"))
        .ok()
        .and_then(|a| a.trim().parse::<std::net::SocketAddr>().ok());
    if let Some(addr) = recorded {
        let answered =
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
                .and_then(|mut t| {
                    t.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
                    write!(
                        t,
                        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                    )?;
                    let mut out = String::new();
                    t.read_to_string(&mut out)?;
                    Ok(out)
                });
        return match answered {
            Ok(out) if out.starts_with("HTTP/1.1 200") => check(
                "http",
                Status::Ok,
                format!("listening on {addr}: MCP at http://{addr}/mcp, the dashboard at http://{addr}/ (room dashboard)"),
            ),
            Ok(_) | Err(_) => check(
                "http",
                Status::Warn,
                format!("http.addr names {addr} but Room does not answer there (a daemon that stopped left it, or another program holds the port)"),
            )
            .fix(format!("room serve --listen {addr}")),
        };
    }
    let free = std::net::TcpListener::bind(("127.0.0.1", HTTP_PORT_DEFAULT)).is_ok();
    let (status, detail) = match (daemon_answers, free) {
        (true, _) => (
            Status::Warn,
            "the daemon has no HTTP listener: MCP over HTTP and the dashboard need one".to_string(),
        ),
        (false, true) => (
            Status::Ok,
            format!("no HTTP listener yet; 127.0.0.1:{HTTP_PORT_DEFAULT} is free for one"),
        ),
        (false, false) => (
            Status::Warn,
            format!("127.0.0.1:{HTTP_PORT_DEFAULT} is taken by another program"),
        ),
    };
    let c = check("http", status, detail);
    match (status, free) {
        (Status::Ok, _) => c,
        (_, true) => c.fix(format!("room serve --listen 127.0.0.1:{HTTP_PORT_DEFAULT}")),
        (_, false) => c.fix(
            "room serve --listen 127.0.0.1:PORT with a free PORT (ss -ltn lists the taken ones)",
        ),
    }
}

/// The routes of config.toml: each command's program is there and executable, each API
/// route's key variable is set in this environment (the one `room serve` is started from).
fn routes(state: &Path) -> Check {
    let bytes = match std::fs::read(state.join("config.toml")) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return check("routes", Status::Ok, "no config.toml: no routes");
        }
        Err(e) => return check("routes", Status::Fail, format!("config.toml: {e}")),
    };
    let policy = match room_engine::policy::policy_of(&bytes) {
        Ok(p) => p,
        Err(why) => {
            return check("routes", Status::Fail, why)
                .fix("fix config.toml: the daemon refuses to act under a policy it cannot load");
        }
    };
    let mut problems = Vec::new();
    for (agent, r) in policy.routes.iter() {
        if let Some(program) = r.command.first() {
            let p = Path::new(program);
            let runnable = std::fs::metadata(p)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if p.is_absolute() && !runnable {
                problems.push(format!(
                    "routes.{agent}: {program} is not an executable file"
                ));
            }
        }
        if let Some(var) = &r.api_key_env
            && std::env::var_os(var).is_none()
        {
            problems.push(format!("routes.{agent}: {var} is not set here"));
        }
    }
    // what collaborations' roles on an adapter take: an ACP bridge's program, an API key
    for (adapter, b) in policy.backends.iter() {
        if let Some(program) = b["command"][0].as_str() {
            let p = Path::new(program);
            let runnable = std::fs::metadata(p)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if !runnable {
                problems.push(format!(
                    "backends.{adapter}: {program} is not an executable file"
                ));
            }
        }
        if let Some(var) = b["api_key_env"].as_str()
            && std::env::var_os(var).is_none()
        {
            problems.push(format!("backends.{adapter}: {var} is not set here"));
        }
    }
    // semantic search's endpoint and its key
    if let Some(e) = &policy.embeddings
        && let Some(var) = &e.api_key_env
        && std::env::var_os(var).is_none()
    {
        problems.push(format!("search.embeddings: {var} is not set here"));
    }
    if problems.is_empty() {
        check(
            "routes",
            Status::Ok,
            format!(
                "{} routes and {} collaboration backends, each runnable from here",
                policy.routes.len(),
                policy.backends.len()
            ),
        )
    } else {
        check("routes", Status::Warn, problems.join("; ")).fix(
            "install the program or fix its path in config.toml; export each API key variable before `room serve`",
        )
    }
}

/// Owned jobs: a cgroup v2 leaf per worker where the daemon can make one, else subreaper
/// shims (`ROOM_JOB_KIND=subreaper` chooses them).
fn jobs() -> Check {
    let forced = std::env::var("ROOM_JOB_KIND").is_ok_and(|k| k == "subreaper");
    let jobs = if forced {
        room_exec::job::Jobs::subreapers("ROOM_JOB_KIND=subreaper")
    } else {
        room_exec::job::Jobs::detect(&format!("doctor-{}", std::process::id()))
    };
    let out = match jobs.why_not_cgroup() {
        None => check(
            "jobs",
            Status::Ok,
            "workers run in cgroup v2 leaves (a stop is cgroup.kill, confirmed by populated 0)",
        ),
        Some(why) => check(
            "jobs",
            Status::Warn,
            format!("workers run below subreaper shims: {why}"),
        )
        .fix("delegate a cgroup v2 subtree to Room's user (systemd: Delegate=yes on its service) for cgroup jobs"),
    };
    let _ = jobs.close(1_000);
    out
}

/// git: a collaboration's diffs are checked with `git apply --check`, and its implementing
/// roles work in clones (or copies made repositories); without it those are refused.
fn git() -> Check {
    let found = std::process::Command::new("git")
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output();
    match found {
        Ok(o) if o.status.success() => check(
            "git",
            Status::Ok,
            format!(
                "{} (diffs are checked with it; implementing roles work in clones made with it)",
                String::from_utf8_lossy(&o.stdout).trim()
            ),
        ),
        _ => check(
            "git",
            Status::Warn,
            "git is not on PATH: a collaboration's diffs cannot be checked and its implementing roles get no working tree",
        )
        .fix("install git (Debian: apt install git)"),
    }
}

/// Confinement: user, mount and PID namespaces for a worker's view.
fn confinement() -> Check {
    let scratch = std::env::temp_dir().join(format!("room-doctor-{}", std::process::id()));
    let found = room_exec::confine::Confinement::probe(&scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    match found {
        Ok(s) if s.no_pid_namespace.is_none() => check(
            "confinement",
            Status::Ok,
            "workers and checks run confined (state dir hidden, own PID namespace)",
        ),
        Ok(s) => check(
            "confinement",
            Status::Warn,
            format!(
                "confined without a PID namespace: {}",
                s.no_pid_namespace.unwrap_or_default()
            ),
        )
        .fix("allow PID namespaces with their own /proc for Room's user"),
        Err(why) => check(
            "confinement",
            Status::Warn,
            format!("workers are not confined (they can see the state dir): {why}"),
        )
        .fix("allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1), or run the daemon as root"),
    }
}

/// The descriptor limit a daemon raises itself to, against the rooms it can then keep open.
fn descriptors() -> Check {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let hard = lim.maximum.unwrap_or(u64::MAX);
    let rooms = room_engine::rooms::open_max_for(hard);
    if rooms < ROOMS_OPEN_WANTED {
        check(
            "descriptors",
            Status::Warn,
            format!("hard descriptor limit {hard}: a daemon keeps {rooms} rooms open at once (others reopen on use)"),
        )
        .fix("raise the hard limit (ulimit -Hn, or LimitNOFILE= on its service)")
    } else {
        check(
            "descriptors",
            Status::Ok,
            format!("hard descriptor limit {hard}: up to {rooms} rooms open at once"),
        )
    }
}
