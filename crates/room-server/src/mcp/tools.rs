//! The MCP tool surface: names, descriptions written for a model that has never seen Room, and
//! JSON Schemas for inputs and outputs. Each tool maps onto one daemon operation, so MCP, the CLI
//! and HTTP reach the same engine calls under the same authorization.

use serde_json::{Value, json};

/// Which tools a host sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolsMode {
    /// Every tool.
    Full,
    /// Only `room_sync` and the multiplexer `room`, for hosts that pay for every definition.
    Compact,
}

impl ToolsMode {
    pub fn parse(s: &str) -> Option<ToolsMode> {
        match s {
            "full" => Some(ToolsMode::Full),
            "compact" => Some(ToolsMode::Compact),
            _ => None,
        }
    }
}

pub struct ToolDef {
    pub name: &'static str,
    /// The daemon operation the tool calls.
    pub op: &'static str,
    pub description: &'static str,
    pub input: Value,
}

const REFUSALS: &str = "On refusal the result has isError true and structuredContent.refusal {code, message, hint, detail}. \
room_sync_required means unread events: read detail.next_page, then call room_sync with confirm set to its receipt, and retry.";

fn s_room() -> Value {
    json!({"type": "string", "description": "Room name (see room_list)."})
}

fn turn_schema(extra: &[(&str, Value)], required: &[&str]) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("room".into(), s_room());
    for (k, v) in extra {
        props.insert((*k).into(), v.clone());
    }
    props.insert(
        "actor".into(),
        json!({"type": "string", "description": "Optional self-identification; if given it must be your own agent name."}),
    );
    props.insert("idempotency_key".into(), idempotency_key());
    let mut req = vec![json!("room")];
    req.extend(required.iter().map(|r| json!(r)));
    json!({"type": "object", "properties": props, "required": req, "additionalProperties": false})
}

fn text(desc: &str) -> (&'static str, Value) {
    (
        "text",
        json!({"type": "string", "description": desc, "maxLength": 1_048_576}),
    )
}

fn to() -> (&'static str, Value) {
    (
        "to",
        json!({"type": "array", "items": {"type": "string"}, "description": "Agent names to address (members of the room)."}),
    )
}

fn task() -> (&'static str, Value) {
    (
        "task",
        json!({"type": "string", "description": "Task id (tsk_…)."}),
    )
}

fn evidence() -> (&'static str, Value) {
    (
        "evidence",
        json!({"type": "array", "items": {"type": "string"}, "description": "Event ids (evt_…) of this room that support the message."}),
    )
}

fn idempotency_key() -> Value {
    json!({"type": "string", "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]+$",
        "description": "Optional key that makes a retry safe: a repeat of a key you already used in this room is refused with invariant_violation (exactly_once) naming the event your first call wrote."})
}

fn reply_to() -> (&'static str, Value) {
    (
        "reply_to",
        json!({"type": "string", "description": "The event (evt_…), mention (mnt_…) or obligation (obl_…) you answer."}),
    )
}

/// Every tool, in listing order.
pub fn all() -> Vec<ToolDef> {
    let empty = json!({"type": "object", "properties": {}, "additionalProperties": false});
    vec![
        ToolDef {
            name: "room_whoami",
            op: "whoami",
            description: "Who you are in Room: agent name, effective tier, the conversation your reading position is bound to, and your rooms.",
            input: empty.clone(),
        },
        ToolDef {
            name: "room_list",
            op: "list",
            description: "List the rooms you are a member of, with their latest sequence number.",
            input: empty.clone(),
        },
        ToolDef {
            name: "room_sync",
            op: "sync",
            description: "Read a room. Returns a page of events after your confirmed position plus a receipt, and your open mentions and obligations. \
Call again with confirm set to the page's receipt to record that you read it; repeat while more is true. You must be caught up before any \
other room_* action in that room. Oversized events arrive in item_chunk fragments ending with item_complete.",
            input: json!({"type": "object", "properties": {"room": s_room(), "confirm": {"type": "string", "description": "Receipt (rcpt_…) of the page you read."}},
                "required": ["room"], "additionalProperties": false}),
        },
        ToolDef {
            name: "room_note",
            op: "note",
            description: "Post status telemetry (progress, what you are doing). Wakes no one; @mentions are refused. Use room_say or room_send to address someone. \
With a task addressed to you, claim it first (task_claim).",
            input: turn_schema(&[text("The status text."), task()], &["text"]),
        },
        ToolDef {
            name: "room_say",
            op: "say",
            description: "Say something in a room, optionally to named agents (wakes them in coordination rooms only). Without to or reply_to and with open items from \
one source it answers them; with open items from several sources it is refused (say_reply_target_ambiguous): name reply_to. Never carries a task.",
            input: turn_schema(&[text("What you say."), to(), reply_to()], &["text"]),
        },
        ToolDef {
            name: "room_reply",
            op: "reply",
            description: "Answer a mention or obligation addressed to you (see open_items in room_sync). Resolves it. Refused with reply_target_not_addressed if nothing there is yours.",
            input: turn_schema(&[text("Your answer."), reply_to()], &["text", "reply_to"]),
        },
        ToolDef {
            name: "room_send",
            op: "send",
            description: "Assign work: creates an obligation for each recipient and one sealed wake permit each. In a project room a task is required (send_task_required).",
            input: turn_schema(
                &[text("The assignment."), to(), task(), evidence()],
                &["text", "to"],
            ),
        },
        ToolDef {
            name: "room_handoff",
            op: "handoff",
            description: "Hand a task you hold to another member. No lease moves with it: the new recipient must claim it afresh.",
            input: turn_schema(
                &[task(), to(), text("Optional note for the new recipient.")],
                &["task", "to"],
            ),
        },
        ToolDef {
            name: "room_done",
            op: "done",
            description: "Finish a task you have claimed. Resolves your obligations for that task.",
            input: turn_schema(
                &[task(), text("Optional summary of what was done.")],
                &["task"],
            ),
        },
        ToolDef {
            name: "room_blocked",
            op: "blocked",
            description: "Mark a task you hold as blocked, with the reason. Its owner gets an obligation to answer.",
            input: turn_schema(&[task(), text("Why you are blocked.")], &["task", "text"]),
        },
        ToolDef {
            name: "room_decline",
            op: "decline",
            description: "Refuse a task addressed to you. Your obligations for it resolve as declined (never as done); its owner is told.",
            input: turn_schema(&[task(), text("Optional reason.")], &["task"]),
        },
        ToolDef {
            name: "room_circle",
            op: "circle",
            description: "Re-raise an obligation you created that is still unanswered; the addressee is woken again under the original deadline.",
            input: turn_schema(
                &[
                    (
                        "obligation",
                        json!({"type": "string", "description": "Obligation id (obl_…) you raised."}),
                    ),
                    text("Optional reminder text."),
                ],
                &["obligation"],
            ),
        },
        ToolDef {
            name: "task_create",
            op: "task_create",
            description: "Create a task in a room (coordinator tier), optionally for a recipient, under a parent task, and with typed scopes \
(namespace:resource, e.g. file:src/lib.rs or api:stripe) that a claim leases exclusively: file scopes conflict hierarchically, others by identity.",
            input: json!({"type": "object", "properties": {"room": s_room(), "title": {"type": "string", "maxLength": 256},
                "to": {"type": "string", "description": "Recipient agent."}, "parent": {"type": "string", "description": "Parent task id."},
                "scopes": {"type": "array", "items": {"type": "string"}, "maxItems": 16, "description": "Typed scopes the task's claim leases."},
                "idempotency_key": idempotency_key()},
                "required": ["room", "title"], "additionalProperties": false}),
        },
        ToolDef {
            name: "task_claim",
            op: "task_claim",
            description: "Claim an open task addressed to you (or to no one) before working on it. The claim leases the task's scopes \
(a conflicting live lease is refused with invariant_violation, exclusive); unresolved after ttl_ms (default 20 minutes) it is recorded in doubt.",
            input: json!({"type": "object", "properties": {"task": {"type": "string"},
                "ttl_ms": {"type": "integer", "minimum": 1000, "maximum": 604_800_000, "description": "How long the claim may stay unresolved."}},
                "required": ["task"], "additionalProperties": false}),
        },
        ToolDef {
            name: "task_show",
            op: "task_show",
            description: "Show a task: title, owner, recipient, status, parent.",
            input: json!({"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"], "additionalProperties": false}),
        },
        ToolDef {
            name: "room",
            op: "room",
            description: "Multiplexer for every Room action: set action to one of whoami, list, sync, note, say, reply, send, handoff, done, blocked, decline, circle, \
task_create, task_claim, task_show, and pass that action's arguments alongside (room, text, to, reply_to, task, evidence, parents, obligation, confirm, title, parent, \
scopes, ttl_ms, idempotency_key).",
            input: json!({"type": "object", "properties": {
                "action": {"type": "string", "enum": ["whoami", "list", "sync", "note", "say", "reply", "send", "handoff", "done", "blocked", "decline", "circle", "task_create", "task_claim", "task_show"]},
                "room": {"type": "string"}, "text": {"type": "string"}, "to": {}, "reply_to": {"type": "string"}, "task": {"type": "string"},
                "evidence": {"type": "array", "items": {"type": "string"}}, "parents": {"type": "array", "items": {"type": "string"}},
                "obligation": {"type": "string"}, "confirm": {"type": "string"}, "title": {"type": "string"}, "parent": {"type": "string"},
                "scopes": {"type": "array", "items": {"type": "string"}}, "ttl_ms": {"type": "integer"}, "idempotency_key": {"type": "string"},
                "actor": {"type": "string"}},
                "required": ["action"], "additionalProperties": false}),
        },
    ]
}

/// Output schema shared by every tool: an object (the result) or a refusal.
pub fn output_schema() -> Value {
    json!({"type": "object", "description": "The result object, or {refusal: {code, message, hint, detail}} when isError is true."})
}

/// The tools a host sees in `mode`. Built once: every call looks its tool up here.
pub fn listed(mode: ToolsMode) -> &'static [ToolDef] {
    static FULL: std::sync::LazyLock<Vec<ToolDef>> = std::sync::LazyLock::new(all);
    static COMPACT: std::sync::LazyLock<Vec<ToolDef>> = std::sync::LazyLock::new(|| {
        all()
            .into_iter()
            .filter(|t| matches!(t.name, "room_sync" | "room"))
            .collect()
    });
    match mode {
        ToolsMode::Full => &FULL,
        ToolsMode::Compact => &COMPACT,
    }
}

/// The refusal advice appended to every description.
pub fn description(t: &ToolDef) -> String {
    format!("{} {REFUSALS}", t.description)
}
