//! `room sessions native AGENT`: the session factory's `list`, answered by the agent itself.
//! `room sessions list` shows the sessions Room opened or loaded for launches (its ledger);
//! this asks the agent a route names which sessions it keeps (ACP `session/list`, offered in
//! `initialize`'s `sessionCapabilities.list`), and sets each beside Room's record of it:
//! the sessions Room knows and the agent lists, those the agent lists that Room never
//! opened, and those Room recorded that the agent no longer lists.
//!
//! The agent runs as `room adapters probe` runs it: the route's program in an owned job of
//! this process, with only the route's environment, in the route's working directory (or a
//! scratch one), stopped at zero processes once it answered. It is asked nothing else: no
//! prompt, no MCP server, so it acts for no one. Where the adapter has no native sessions
//! (`script`, `command`, the API adapters) or the agent does not offer `session/list`, the
//! answer is `session_op_unsupported`, never an empty list.

use crate::cmd::Cli;
use room_agents::acp;
use serde_json::{Value, json};
use std::path::PathBuf;

/// How long the agent has to start and answer every page.
const LIST_DEADLINE_MS: u64 = 30_000;
/// How long its job's stop may wait to see it empty.
const JOB_STOP_MS: u64 = 5_000;

pub fn run(cli: &Cli, agent: &str) -> i32 {
    let route = match route_of(cli, agent) {
        Ok(r) => r,
        Err((code, why)) => {
            eprintln!("error[{code}]: {why}");
            return crate::cmd::EXIT_REFUSED;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return crate::cmd::EXIT_IO;
        }
    };
    let (listing, job) = match rt.block_on(ask(&route)) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return crate::cmd::EXIT_IO;
        }
    };
    let name = listing
        .agent
        .clone()
        .unwrap_or_else(|| route.command[0].clone());
    // an agent that never answered (it crashed, timed out, closed its output) is an error
    // of its own, not an agent without session/list
    if let Some(e) = &listing.error {
        eprintln!("error: {name}: {e}");
        return crate::cmd::EXIT_IO;
    }
    if !listing.offered {
        eprintln!(
            "error[session_op_unsupported]: {name} does not offer session/list (initialize's sessionCapabilities.list)\nhint: room sessions list shows the sessions Room opened for {agent}"
        );
        return crate::cmd::EXIT_REFUSED;
    }
    let recorded = room_records(cli, agent);
    let out = compare(agent, &name, &listing, recorded, job);
    if cli.json {
        println!("{out}");
    } else {
        print(&out);
    }
    0
}

/// The agent's route from config.toml, if it is one whose agent has native sessions.
fn route_of(cli: &Cli, agent: &str) -> Result<room_engine::policy::Route, (&'static str, String)> {
    let path = crate::cmd::state_dir(cli).join("config.toml");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(("storage_failed", format!("{}: {e}", path.display()))),
    };
    let policy = room_engine::policy::policy_of(&bytes)
        .map_err(|e| ("invalid_argument", format!("config.toml: {e}")))?;
    let route = policy.routes.get(agent).cloned().ok_or((
        "not_found",
        format!("agent {agent:?} has no route in config.toml"),
    ))?;
    if route.adapter != "acp" {
        return Err((
            "session_op_unsupported",
            format!(
                "list: the {} adapter has no native sessions to list (room adapters list)",
                route.adapter
            ),
        ));
    }
    if route.command.is_empty() {
        return Err((
            "invalid_argument",
            format!("routes.{agent}.command is empty"),
        ));
    }
    Ok(route)
}

/// Start the route's agent in an owned job, ask it, stop the job: what it listed and what
/// the stop observed.
async fn ask(route: &room_engine::policy::Route) -> Result<(acp::Listing, Value), String> {
    let scratch = tempfile::Builder::new()
        .prefix("room-sessions-")
        .tempdir()
        .map_err(|e| format!("a scratch directory: {e}"))?;
    let cwd = route
        .cwd
        .as_deref()
        .map_or_else(|| scratch.path().to_path_buf(), PathBuf::from);
    let jobs = room_exec::job::Jobs::detect(&format!("sessions-{}", std::process::id()));
    let out = ask_in(&jobs, route, &cwd).await;
    // the jobs' base goes whatever happened in it
    let _ = jobs.close(JOB_STOP_MS);
    out
}

async fn ask_in(
    jobs: &room_exec::job::Jobs,
    route: &room_engine::policy::Route,
    cwd: &std::path::Path,
) -> Result<(acp::Listing, Value), String> {
    let mut job = jobs
        .create(&format!("list-{}", std::process::id()))
        .map_err(|e| format!("a job for the agent: {e}"))?;
    let preset = route.preset.as_deref().and_then(acp::preset);
    let mut cmd = tokio::process::Command::new(&route.command[0]);
    cmd.args(&route.command[1..])
        .env_clear()
        .current_dir(cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let passed = preset.map_or(&[][..], |p| p.env_pass);
    for name in route
        .env
        .iter()
        .map(String::as_str)
        .chain(passed.iter().copied())
    {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    for (k, v) in preset.map_or(&[][..], |p| p.env_set) {
        cmd.env(k, v);
    }
    job.prepare(cmd.as_std_mut());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            job.stop(JOB_STOP_MS);
            return Err(format!("{}: {e}", route.command[0]));
        }
    };
    if let Some(pid) = child.id() {
        job.started(pid);
    }
    let (stdin, stdout) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
    );
    let listing = acp::list(
        stdin,
        stdout,
        acp::ListAsk {
            cwd: route.cwd.as_deref().map(PathBuf::from),
            authenticate: preset.and_then(|p| p.authenticate).map(String::from),
            deadline_ms: LIST_DEADLINE_MS,
        },
    )
    .await;
    let stopped = tokio::task::spawn_blocking(move || {
        let s = job.stop(JOB_STOP_MS);
        drop(child);
        s
    })
    .await
    .map_err(|e| format!("stopping the agent's job: {e}"))?;
    let observed = json!({"kind": stopped.kind.as_str(), "confirmed_empty": stopped.confirmed_empty,
        "remaining": stopped.remaining.len()});
    Ok((listing, observed))
}

/// Room's own records of the agent's sessions, from the daemon (none when it does not run).
fn room_records(cli: &Cli, agent: &str) -> Result<Vec<Value>, String> {
    let sock = crate::cmd::state_dir(cli).join("room.sock");
    let mut c =
        room_server::client::Client::connect(&sock).map_err(|e| format!("not compared ({e})"))?;
    let r = c
        .call(&room_server::wire::Request::new(
            "sessions_list",
            json!({"agent": agent}),
        ))
        .map_err(|e| e.to_string())?;
    match (r.result, r.refusal) {
        (Some(v), _) if v["truncated"] == true => Err(format!(
            "not compared (Room keeps more of {agent}'s sessions than one page shows)"
        )),
        (Some(v), _) => Ok(v["sessions"].as_array().cloned().unwrap_or_default()),
        (None, Some(refusal)) => Err(refusal.to_string()),
        _ => Err("an empty answer".into()),
    }
}

/// The agent's listing beside Room's records: each listed session with the record of it (by
/// native id), and the records the agent did not list.
fn compare(
    agent: &str,
    name: &str,
    listing: &acp::Listing,
    recorded: Result<Vec<Value>, String>,
    job: Value,
) -> Value {
    let records = recorded.as_ref().ok();
    let record_of = |native: &str| -> Value {
        records
            .and_then(|rs| rs.iter().find(|r| r["native"] == native))
            .map_or(Value::Null, |r| {
                json!({"id": r["id"], "bound": r["bound"], "launches": r["launches"],
                    "proof": r["proof"]})
            })
    };
    let sessions: Vec<Value> = listing
        .sessions
        .iter()
        .map(|s| {
            json!({"session": s.session, "cwd": s.cwd, "title": s.title,
                "updated_at": s.updated_at, "room": record_of(&s.session)})
        })
        .collect();
    // a record the agent did not list is only "not listed" when the listing was whole
    let not_listed: Value = match records {
        Some(rs) if !listing.truncated => rs
            .iter()
            .filter(|r| {
                !listing
                    .sessions
                    .iter()
                    .any(|s| r["native"] == s.session.as_str())
            })
            .map(|r| r["id"].clone())
            .collect(),
        _ => Value::Null,
    };
    json!({
        "agent": agent, "native_agent": name, "operation": "list",
        "sessions": sessions, "pages": listing.pages, "truncated": listing.truncated,
        "room_not_listed": not_listed,
        "room_records": recorded.as_ref().map_or_else(|e| json!({"unknown": e}), |r| json!(r.len())),
        "job": job,
    })
}

fn print(out: &Value) {
    let empty = Vec::new();
    let sessions = out["sessions"].as_array().unwrap_or(&empty);
    println!(
        "{} ({}) lists {} sessions{}",
        out["agent"].as_str().unwrap_or("?"),
        out["native_agent"].as_str().unwrap_or("?"),
        sessions.len(),
        if out["truncated"] == true {
            " (more not read)"
        } else {
            ""
        }
    );
    for s in sessions {
        let room = match s["room"]["id"].as_str() {
            Some(id) if s["room"]["bound"] == true => format!("{id} (bound)"),
            Some(id) => id.to_string(),
            None => "not opened by Room".into(),
        };
        println!(
            "  {}  {}  {}  {}",
            s["session"].as_str().unwrap_or("?"),
            s["cwd"].as_str().unwrap_or("?"),
            s["title"].as_str().unwrap_or("-"),
            room
        );
    }
    if out["job"]["confirmed_empty"] != true {
        println!(
            "  its job was not seen empty after its stop: {} processes remain",
            out["job"]["remaining"]
        );
    }
    match &out["room_not_listed"] {
        Value::Array(ids) if !ids.is_empty() => {
            for id in ids {
                println!(
                    "  Room recorded {} but the agent no longer lists it",
                    id.as_str().unwrap_or("?")
                );
            }
        }
        Value::Null => println!(
            "  Room's records: {}",
            out["room_records"]["unknown"]
                .as_str()
                .unwrap_or("not compared (the listing was cut)")
        ),
        _ => {}
    }
}
