//! The MCP features beside tools that hosts use: prompts (the sync, confirm and act loop as
//! commands a person can pick), resources (each room the agent is a member of, read as its next
//! page and open items, with `resources/subscribe` and `notifications/resources/updated` when
//! the room moves) and logging (the session's tool refusals and warnings at the level the client
//! sets). Everything a resource or log carries went through the same daemon operation, and so
//! the same authorization and egress redaction, as a tool call.
//!
//! MCP logging is deprecated from protocol 2026-07-28 on (SEP-2577) and rmcp marks its types
//! so; hosts on the earlier versions Room serves still set a level and show the messages.
#![allow(deprecated)]

use rmcp::model::{
    GetPromptResult, LoggingLevel, Prompt, PromptArgument, PromptMessage, Resource,
    ResourceContents, Role,
};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use room_core::name;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A room's resource URI.
pub const URI_PREFIX: &str = "room://";
/// Rooms one session may subscribe to.
pub const SUBSCRIPTIONS_MAX: usize = 256;
/// How often a bridge (which has no change signal from the daemon) looks at its rooms' tips.
pub const BRIDGE_POLL_MS: u64 = 1_000;
/// How often an in-process session looks anyway, in case a change signal was missed.
pub const SAFETY_POLL_MS: u64 = 5_000;

/// The room a resource URI names.
pub fn room_of(uri: &str) -> Result<&str, McpError> {
    let room = uri.strip_prefix(URI_PREFIX).ok_or_else(|| {
        McpError::resource_not_found(format!("{uri}: not a Room resource (room://ROOM)"), None)
    })?;
    name::validate("room", room)
        .map_err(|r| McpError::resource_not_found(format!("{uri}: {}", r.message), None))?;
    Ok(room)
}

pub fn uri_of(room: &str) -> String {
    format!("{URI_PREFIX}{room}")
}

/// One room of a `list` answer as a resource.
pub fn resource(entry: &Value) -> Option<Resource> {
    let room = entry["room"].as_str()?;
    let seq = entry["tip_seq"].as_u64().unwrap_or(0);
    Some(
        Resource::new(uri_of(room), room)
            .with_title(format!("Room {room}"))
            .with_description(format!(
                "Your next unread page of room {room} (latest seq {seq}) and your open items; confirm its receipt with room_sync"
            ))
            .with_mime_type("application/json"),
    )
}

pub fn contents(uri: &str, page: &Value) -> ResourceContents {
    ResourceContents::text(page.to_string(), uri).with_mime_type("application/json")
}

// ---------- prompts ----------

struct PromptDef {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    /// The one argument (name, description) the text is filled with.
    arg: (&'static str, &'static str),
    text: &'static str,
}

const PROMPTS: &[PromptDef] = &[
    PromptDef {
        name: "catch_up",
        title: "Catch up on a room",
        description: "Read a room to its end and summarize what changed and what is yours.",
        arg: ("room", "Room name (see room_list)"),
        text: "Catch up on room {room}. Call room_sync with room {room}, read the page, then call room_sync again with confirm set to its receipt; \
repeat while more is true. Then summarize what changed and list your open_items (mentions and obligations addressed to you).",
    },
    PromptDef {
        name: "answer_addressed",
        title: "Answer what is addressed to me",
        description: "Work through the mentions and obligations addressed to you in a room.",
        arg: ("room", "Room name (see room_list)"),
        text: "Answer what is addressed to you in room {room}. First catch up: room_sync, then room_sync with confirm set to the receipt, while more is true. \
For each open item: answer it with room_reply (reply_to = its id), or for a task claim it (task_claim), do the work and finish it with room_done. \
If an action is refused with room_sync_required, read detail.next_page and act again with read_through set to its receipt.",
    },
    PromptDef {
        name: "finish_task",
        title: "Finish a task",
        description: "Do a claimed task until Room's own acceptance checks pass, then close it.",
        arg: ("task", "Task id (tsk_…)"),
        text: "Finish task {task}. Read it with task_show: its acceptance checks are what Room will measure, not your word. Do the work, \
then run task_accept_check to see each check's result; fix what fails. When every check passes, catch up on the task's room (room_sync and confirm) \
and call room_done with the task.",
    },
];

/// The one argument prompt `name` takes, if it is one of Room's.
pub fn prompt_argument(name: &str) -> Option<&'static str> {
    PROMPTS.iter().find(|p| p.name == name).map(|p| p.arg.0)
}

/// The template every room resource follows (its `room` completes to the caller's rooms).
pub const ROOM_TEMPLATE: &str = "room://{room}";

/// `resources/templates/list`: one template, a room.
pub fn room_template() -> rmcp::model::ResourceTemplate {
    rmcp::model::ResourceTemplate::new(ROOM_TEMPLATE, "room")
        .with_title("A room")
        .with_description("A room you are a member of: its next page of events after your confirmed position (reading confirms nothing).")
        .with_mime_type("application/json")
}

pub fn prompts() -> Vec<Prompt> {
    PROMPTS
        .iter()
        .map(|p| {
            let arg = PromptArgument::new(p.arg.0)
                .with_description(p.arg.1)
                .with_required(true);
            Prompt::new(p.name, Some(p.description), Some(vec![arg])).with_title(p.title)
        })
        .collect()
}

pub fn prompt(
    name: &str,
    args: Option<&serde_json::Map<String, Value>>,
) -> Result<GetPromptResult, McpError> {
    let p = PROMPTS
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| McpError::invalid_params(format!("unknown prompt {name:?}"), None))?;
    let key = p.arg.0;
    let value = args
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            McpError::invalid_params(format!("prompt {name} needs the argument {key}"), None)
        })?;
    // the value is written into the text a model reads: only a well-formed name or id
    let valid = match key {
        "room" => name::validate("room", value).is_ok(),
        _ => room_core::id::is_task_id(value),
    };
    if !valid {
        return Err(McpError::invalid_params(
            format!("{key}: {value:?} is not a valid {key}"),
            None,
        ));
    }
    let text = p.text.replace(&format!("{{{key}}}"), value);
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description(p.description),
    )
}

// ---------- logging ----------

#[allow(deprecated)]
fn rank(l: LoggingLevel) -> u8 {
    match l {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// The level a refusal is logged at: the Work Gate's loop is routine, a broken store is not.
#[allow(deprecated)]
pub fn refusal_level(code: &str) -> LoggingLevel {
    match code {
        "room_sync_required" | "room_sync_concurrent_arrival" => LoggingLevel::Info,
        "storage_failed" | "tool_result_withheld" | "room_quarantined" => LoggingLevel::Error,
        _ => LoggingLevel::Warning,
    }
}

// ---------- per-session state ----------

/// What one MCP session asked for beyond tools.
#[derive(Default)]
pub struct SessionState {
    pub inner: Mutex<Inner>,
}

#[derive(Default)]
pub struct Inner {
    /// Subscribed room URIs and the tip each was last seen at.
    pub subs: BTreeMap<String, u64>,
    /// The level set with `logging/setLevel`; nothing is logged before one is set.
    pub log_level: Option<LoggingLevel>,
    pub peer: Option<Peer<RoleServer>>,
    /// The credential and conversation the session's watcher calls with.
    pub bearer: Option<String>,
    pub conversation: Option<String>,
    pub watching: bool,
    /// What the session's resource list holds now, for `list_changed` (set once it is
    /// initialized on a transport that can carry notifications).
    pub lists: Option<Lists>,
}

/// The caller's resources: its rooms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lists {
    pub rooms: std::collections::BTreeSet<String>,
}

impl Lists {
    /// From a `list` answer.
    pub fn of(me: &Value) -> Lists {
        Lists {
            rooms: me["rooms"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["room"].as_str().map(String::from))
                .collect(),
        }
    }
}

impl SessionState {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("mcp session state lock")
    }

    /// Whether a message at `level` goes out.
    pub fn logs(&self, level: LoggingLevel) -> Option<Peer<RoleServer>> {
        let g = self.lock();
        match g.log_level {
            Some(min) if rank(level) >= rank(min) => g.peer.clone(),
            _ => None,
        }
    }
}

/// Send one log message to the session's client, if its level lets it through.
#[allow(deprecated)]
pub async fn log(state: &SessionState, level: LoggingLevel, data: Value) {
    if let Some(peer) = state.logs(level) {
        let msg =
            rmcp::model::LoggingMessageNotificationParam::new(level, data).with_logger("room");
        let _ = peer.notify_logging_message(msg).await;
    }
}

/// Send one log message to `peer` (the request's own stream) if `level` is at or above
/// `min`, the level the request opted in to (2026-07-28's `_meta` form).
#[allow(deprecated)]
pub async fn log_to(peer: &Peer<RoleServer>, min: LoggingLevel, level: LoggingLevel, data: Value) {
    if rank(level) >= rank(min) {
        let msg =
            rmcp::model::LoggingMessageNotificationParam::new(level, data).with_logger("room");
        let _ = peer.notify_logging_message(msg).await;
    }
}

/// A refusal as a log record.
pub fn refusal_record(tool: &str, r: &room_core::Refusal) -> Value {
    json!({"tool": tool, "code": r.code, "message": r.message, "hint": r.hint})
}
