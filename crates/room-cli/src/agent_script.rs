//! `room agent-script --steps read,reply`: Room's own scripted agent, which the dispatcher's
//! `script` adapter launches for a wake. It reads the wake prompt (JSON) on stdin and acts
//! through the daemon socket (`ROOM_SOCKET`) with its one-launch credential (`ROOM_TOKEN`),
//! step by step:
//!
//! - `read`: the room up to its tip, confirming every page;
//! - `reply`: answer each obligation of the wake (a gate refusal is read through and tried
//!   once more);
//! - `write:PATH`: the wake's prompt text to PATH beneath the working directory (a
//!   deterministic artifact for acceptance checks to measure);
//! - `claim`, `done`, `decline`: the wake's task;
//! - `ask`: ask the person whether to go on (`collab_ask`, on the wake's task); the answer
//!   comes as a later wake;
//! - `put:KIND[@KEY]=PATH`: the JSON file at PATH as the next version of the blackboard
//!   artifact KIND (key KEY, else main), for the wake's task (a collaboration's role);
//! - `fulfil:PATH`: every artifact the wake's task's acceptance names (kind and key), each
//!   with the JSON file at PATH; where PATH is a directory, each from its file there:
//!   `KIND@KEY.json` if there is one, else `KIND.json` (`/` in a kind spelled `_`), so one
//!   script serves a role that runs several phases;
//! - `diff`: the `diff` artifact from the working tree it was started in (`diff_from_tree`),
//!   for the wake's task;
//! - `reply:TEXT`: answer each obligation of the wake with TEXT;
//! - `dispatch`: as a collaboration's orchestrator, dispatch every phase `collab_status` lists
//!   as ready (`collab_dispatch`; the collaboration is the wake's room);
//! - `close`: as its orchestrator, close the collaboration when `collab_status` says every
//!   phase is done (`collab_close`);
//! - `exit` (stop without a word), `fail` (exit 1), `hang` (never end: the launch's deadline
//!   stops it);
//! - hostile steps for `room prove`: `stubborn` (itself and a grandchild ignoring SIGTERM),
//!   `leak` (its one-launch credential written to `leaked-credential` in its working
//!   directory, for a process outside its job to try).

use room_server::client::Client;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::io::BufRead;

/// Where the `leak` step writes the worker's credential, beneath its working directory.
pub const LEAKED: &str = "leaked-credential";

/// Pages one `read` step follows before it gives up on reaching the tip.
const READ_PAGES_MAX: usize = 10_000;

/// What `fulfil:PATH` puts as artifact `kind` (key `key`): PATH itself, or from a directory.
fn fulfil_content(path: &std::path::Path, kind: &str, key: &str) -> Result<Value, String> {
    let file = if path.is_dir() {
        let kind = kind.replace('/', "_");
        let keyed = path.join(format!("{kind}@{key}.json"));
        if keyed.is_file() {
            keyed
        } else {
            path.join(format!("{kind}.json"))
        }
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))
}

pub fn run(steps: &str) -> i32 {
    match script(steps) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// `room agent-acp --mode MODE`: Room's scripted ACP agent on stdin and stdout
/// (`room_agents::acp_script`); in `reply` mode the wake its prompt carries gets the
/// scripted agent's `read` and `reply` steps.
pub fn run_acp(mode: &str) -> i32 {
    let Some(mode) = room_agents::acp_script::Mode::parse(mode) else {
        eprintln!(
            "error[invalid_argument]: mode: {mode:?} is not one of {:?}",
            room_agents::acp_script::Mode::NAMES
        );
        return crate::cmd::EXIT_REFUSED;
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
    let on_wake: room_agents::acp_script::OnWake =
        std::sync::Arc::new(|wake| steps_on("read,reply", &wake).map(|_| ()));
    let served = rt.block_on(room_agents::acp_script::serve(
        tokio::io::stdin(),
        tokio::io::stdout(),
        mode,
        on_wake,
    ));
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn script(steps: &str) -> Result<i32, String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    let prompt: Value = serde_json::from_str(&line).map_err(|e| format!("the wake prompt: {e}"))?;
    steps_on(steps, &prompt)
}

/// Run `steps` for the wake `prompt` (its JSON), through `ROOM_SOCKET` with `ROOM_TOKEN`: what
/// `room agent-script` does once it read its prompt, and what `room agent-acp` does with the
/// wake its prompt carries.
pub fn steps_on(steps: &str, prompt: &Value) -> Result<i32, String> {
    let prompt = prompt.clone();
    let token = std::env::var("ROOM_TOKEN").map_err(|_| "ROOM_TOKEN is not set")?;
    let socket = std::env::var_os("ROOM_SOCKET").ok_or("ROOM_SOCKET is not set")?;
    let mut c = Client::connect(std::path::Path::new(&socket)).map_err(|e| e.to_string())?;
    let room = prompt["room"]
        .as_str()
        .ok_or("the prompt names no room")?
        .to_string();
    let mut call = |op: &str, args: Value| -> Result<Response, String> {
        c.call(&Request::new(op, args).with_token(Some(&token)))
            .map_err(|e| e.to_string())
    };
    for step in steps.split(',').filter(|s| !s.is_empty()) {
        match step {
            "read" => read(&mut call, &room)?,
            "reply" => {
                for ob in prompt["obligation_ids"].as_array().into_iter().flatten() {
                    let args = json!({"room": room, "reply_to": ob,
                        "text": format!("done: {}", prompt["prompt"].as_str().unwrap_or(""))});
                    let r = gated(&mut call, &room, "reply", args)?;
                    if !r.ok {
                        return Err(format!("reply to {ob} refused: {:?}", r.refusal));
                    }
                }
            }
            r if room_engine::policy::is_reply_text_step(r) => {
                let text = &r["reply:".len()..];
                for ob in prompt["obligation_ids"].as_array().into_iter().flatten() {
                    let args = json!({"room": room, "reply_to": ob, "text": text});
                    let r = gated(&mut call, &room, "reply", args)?;
                    if !r.ok {
                        return Err(format!("reply to {ob} refused: {:?}", r.refusal));
                    }
                }
            }
            "dispatch" => {
                let status = call("collab_status", json!({"id": room}))?;
                let status = status
                    .result
                    .ok_or_else(|| format!("collab_status refused: {:?}", status.refusal))?;
                for phase in status["ready"].as_array().into_iter().flatten() {
                    let r = call("collab_dispatch", json!({"id": room, "phase": phase}))?;
                    if !r.ok {
                        return Err(format!("dispatch of {phase} refused: {:?}", r.refusal));
                    }
                }
            }
            "close" => {
                let status = call("collab_status", json!({"id": room}))?;
                let status = status
                    .result
                    .ok_or_else(|| format!("collab_status refused: {:?}", status.refusal))?;
                if status["all_done"] == true {
                    let r = call("collab_close", json!({"id": room}))?;
                    if !r.ok {
                        return Err(format!("close refused: {:?}", r.refusal));
                    }
                }
            }
            "claim" => {
                let task = wake_task(&prompt)?;
                let r = call("task_claim", json!({"task": task}))?;
                if !r.ok {
                    return Err(format!("claim of {task} refused: {:?}", r.refusal));
                }
            }
            "done" => {
                let task = wake_task(&prompt)?;
                let args = json!({"room": room, "task": task});
                let r = gated(&mut call, &room, "done", args)?;
                if !r.ok {
                    return Err(format!("done on {task} refused: {:?}", r.refusal));
                }
            }
            put if room_engine::policy::is_put_step(put) => {
                let (address, path) = put["put:".len()..]
                    .split_once('=')
                    .expect("a put step names KIND[@KEY]=PATH");
                let (kind, key) = address.split_once('@').unwrap_or((address, "main"));
                let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
                let content: Value =
                    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
                let task = wake_task(&prompt)?;
                put_artifact(&mut call, &room, task, (kind, key), content)?;
            }
            "diff" => diff_from_tree(&mut call, &room, wake_task(&prompt)?)?,
            "ask" => {
                let task = wake_task(&prompt)?;
                let args = json!({"room": room, "task": task,
                    "question": format!("may I go on with {task}?")});
                let r = call("collab_ask", args)?;
                if !r.ok {
                    return Err(format!("the question was refused: {:?}", r.refusal));
                }
            }
            "decline" => {
                let task = wake_task(&prompt)?;
                let args = json!({"room": room, "task": task, "text": "declined by its script"});
                let r = gated(&mut call, &room, "decline", args)?;
                if !r.ok {
                    return Err(format!("decline of {task} refused: {:?}", r.refusal));
                }
            }
            f if room_engine::policy::is_fulfil_step(f) => {
                let path = std::path::Path::new(&f["fulfil:".len()..]);
                let task = wake_task(&prompt)?;
                let shown = call("task_show", json!({"task": task}))?;
                let shown = shown
                    .result
                    .ok_or_else(|| format!("task_show refused: {:?}", shown.refusal))?;
                for check in shown["task"]["acceptance"].as_array().into_iter().flatten() {
                    if check["kind"] != "artifact" {
                        continue;
                    }
                    let kind = check["artifact"].as_str().unwrap_or_default();
                    let key = check["key"].as_str().unwrap_or("main");
                    let content = fulfil_content(path, kind, key)?;
                    put_artifact(&mut call, &room, task, (kind, key), content)?;
                }
            }
            "exit" => return Ok(0),
            "fail" => return Ok(1),
            "hang" => loop {
                std::thread::sleep(std::time::Duration::from_secs(60));
            },
            "stubborn" => return Err(stubborn()),
            "leak" => {
                // a hostile worker: its one-launch credential, where a process outside its
                // job can read it (`room prove` 04-C07 shows it works nowhere but here)
                let token = std::env::var("ROOM_TOKEN").map_err(|_| "no ROOM_TOKEN")?;
                // whole or not at all: a reader never sees half a credential
                let part = format!("{LEAKED}.part");
                std::fs::write(&part, token).map_err(|e| format!("{part}: {e}"))?;
                std::fs::rename(&part, LEAKED).map_err(|e| format!("{LEAKED}: {e}"))?;
            }
            w if room_engine::policy::is_write_step(w) => {
                let rel = &w["write:".len()..];
                let path = std::path::Path::new(rel);
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{rel}: {e}"))?;
                }
                let mut text = prompt["prompt"].as_str().unwrap_or("").to_string();
                text.push('\n');
                std::fs::write(path, text).map_err(|e| format!("{rel}: {e}"))?;
            }
            other => return Err(format!("unknown step {other:?}")),
        }
    }
    Ok(0)
}

/// Attempts of a gated call a busy room may refuse (`room_sync_required`: something arrived
/// since the last read), each after reading through.
const GATED_ATTEMPTS_MAX: usize = 64;

/// `op` through the Work Gate: while the room has moved on since the last read, read
/// through and call again (bounded); the last answer otherwise.
fn gated(
    call: &mut impl FnMut(&str, Value) -> Result<Response, String>,
    room: &str,
    op: &str,
    args: Value,
) -> Result<Response, String> {
    let mut r = call(op, args.clone())?;
    for attempt in 1..GATED_ATTEMPTS_MAX {
        let behind = r
            .refusal
            .as_ref()
            .is_some_and(|x| x.code == room_core::Code::RoomSyncRequired);
        if transient(&r) {
            pause(attempt);
        } else if r.ok || !behind {
            break;
        } else {
            read(call, room)?;
        }
        r = call(op, args.clone())?;
    }
    Ok(r)
}

/// A refusal that says "not now" (a busy room's turn queue, an acceptance evaluation already
/// running, a concurrent arrival): the same call again after a pause, as an agent would.
fn transient(r: &Response) -> bool {
    r.refusal.as_ref().is_some_and(|x| {
        matches!(
            x.code,
            room_core::Code::RoomTurnQueueExceeded
                | room_core::Code::AcceptanceEvaluationBusy
                | room_core::Code::RoomSyncConcurrentArrival
        )
    })
}

/// The pause before the `attempt`th try of a transient refusal (25 ms more each time, at
/// most half a second).
fn pause(attempt: usize) {
    let ms = (25 * attempt as u64).min(500);
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// The task a wake is for (a collaboration's phase run).
fn wake_task(prompt: &Value) -> Result<&str, String> {
    prompt["task"]
        .as_str()
        .ok_or_else(|| "the wake names no task".to_string())
}

/// Write `content` as the next version of `kind` for `task`: the newest version read from the
/// index (0 when there is none), a gate refusal read through and tried once more.
/// The newest version of `kind`/main in the room's index (0: none yet).
fn current_version(
    call: &mut impl FnMut(&str, Value) -> Result<Response, String>,
    room: &str,
    (kind, key): (&str, &str),
) -> Result<u64, String> {
    let index = call("artifact_index", json!({"room": room}))?;
    let index = index
        .result
        .ok_or_else(|| format!("artifact_index refused: {:?}", index.refusal))?;
    Ok(index["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["kind"] == kind && a["key"] == key)
        .and_then(|a| a["version"].as_u64())
        .unwrap_or(0))
}

/// Write the working tree's diff as the next version of `diff` for `task`, a gate refusal
/// read through and tried once more.
fn diff_from_tree(
    call: &mut impl FnMut(&str, Value) -> Result<Response, String>,
    room: &str,
    task: &str,
) -> Result<(), String> {
    let mut last = None;
    for attempt in 1..=GATED_ATTEMPTS_MAX {
        let current = current_version(call, room, ("diff", "main"))?;
        let r = call(
            "diff_from_tree",
            json!({"room": room, "task": task, "expected_version": current,
                "summary": "the working tree's changes"}),
        )?;
        if r.ok {
            return Ok(());
        }
        if transient(&r) {
            pause(attempt);
            continue;
        }
        if !retryable(&r) {
            return Err(format!("diff: the write was refused: {:?}", r.refusal));
        }
        last = r.refusal;
        read(call, room)?;
    }
    Err(format!(
        "diff: the write was refused {GATED_ATTEMPTS_MAX} times: {last:?}"
    ))
}

fn put_artifact(
    call: &mut impl FnMut(&str, Value) -> Result<Response, String>,
    room: &str,
    task: &str,
    (kind, key): (&str, &str),
    content: Value,
) -> Result<(), String> {
    for attempt in 1..=GATED_ATTEMPTS_MAX {
        let current = current_version(call, room, (kind, key))?;
        let r = call(
            "artifact_put",
            json!({"room": room, "kind": kind, "key": key, "content": content, "task": task,
                "expected_version": current}),
        )?;
        if r.ok {
            return Ok(());
        }
        if transient(&r) {
            pause(attempt);
            continue;
        }
        if !retryable(&r) {
            return Err(format!("{kind}: the write was refused: {:?}", r.refusal));
        }
        read(call, room)?;
    }
    Err(format!(
        "{kind}: the write was refused {GATED_ATTEMPTS_MAX} times"
    ))
}

/// A write refused because the room or the artifact moved on meanwhile: read and try again.
fn retryable(r: &Response) -> bool {
    r.refusal.as_ref().is_some_and(|x| {
        matches!(
            x.code,
            room_core::Code::RoomSyncRequired | room_core::Code::ArtifactVersionConflict
        )
    })
}

fn read(
    call: &mut impl FnMut(&str, Value) -> Result<Response, String>,
    room: &str,
) -> Result<(), String> {
    for attempt in 1..=READ_PAGES_MAX {
        let r = call("sync", json!({"room": room}))?;
        if transient(&r) {
            pause(attempt);
            continue;
        }
        let page = r
            .result
            .ok_or_else(|| format!("sync refused: {:?}", r.refusal))?;
        let receipt = page["receipt"].clone();
        let c = call("sync", json!({"room": room, "confirm": receipt}))?;
        if transient(&c) {
            pause(attempt);
            continue;
        }
        if !c.ok {
            return Err(format!("confirm refused: {:?}", c.refusal));
        }
        if page["more"] != true {
            return Ok(());
        }
    }
    Err("the room did not end within the page bound".into())
}

/// A hostile worker tree, for the stop's tests and `room prove`: a grandchild in a session of
/// its own, and this process replaced by a shell, both ignoring SIGTERM and waiting. Each
/// names `room-stubborn-LAUNCH` in its command line, so that a check outside the job can look
/// for what is left of it. Returns only when it could not start (the reason).
fn stubborn() -> String {
    use std::os::unix::process::CommandExt;
    let launch = std::env::var("ROOM_LAUNCH").unwrap_or_else(|_| "unknown".into());
    let marker = format!("room-stubborn-{launch}");
    let wait = "trap '' TERM; while :; do sleep 60; done";
    let child = std::process::Command::new("/usr/bin/setsid")
        .args(["/bin/sh", "-c", wait, &marker])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = child {
        return format!("stubborn: setsid: {e}");
    }
    let e = std::process::Command::new("/bin/sh")
        .args(["-c", wait, &marker])
        .exec();
    format!("stubborn: /bin/sh: {e}")
}
