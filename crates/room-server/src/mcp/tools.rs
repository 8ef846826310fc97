//! The MCP tool surface: names, descriptions written for a model that has never seen Room, and
//! JSON Schemas for inputs and outputs. Each tool maps onto one daemon operation, so MCP, the CLI
//! and HTTP reach the same engine calls under the same authorization.

use crate::wire::{
    ArtifactGetArgs, ArtifactIndexArgs, ArtifactPutArgs, CancelArgs, CollabAskArgs,
    CollabDispatchArgs, CollabSteerArgs, ComposeArgs, DiffFromTreeArgs, EvidenceArgs, OpArgs,
    OpBeginArgs, SearchArgs, SourceReadArgs, SyncArgs, TaskAmendArgs, TaskArgs, TaskCancelArgs,
    TaskClaimArgs, TaskCreateArgs, TaskProposeArgs, TaskSupersedeArgs, TurnWire, WakeTakeArgs,
};
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

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

/// The refusal loop, in full on `room_sync` and the multiplexer `room` (the tools every mode lists).
const REFUSALS: &str = "A refusal has isError true and structuredContent.refusal {code, message, hint, detail}. \
room_sync_required means unread events: read detail.next_page, then retry with read_through set to its receipt (one call).";

/// The same loop in brief, on every other tool (the refusal's shape is in room_sync's).
const REFUSALS_BRIEF: &str =
    "Refused with room_sync_required: read detail.next_page, retry with read_through: its receipt.";

/// The input schema of a tool whose arguments are `T`, generated from `T` itself: its doc
/// comments are the descriptions and its `schemars` attributes the limits (the engine's
/// constants). Shaped for a model's context: no `$schema`, title or definitions, an optional
/// field is just its type (absent and `null` decode the same), no defaults or formats.
pub fn input_schema<T: JsonSchema>() -> Map<String, Value> {
    let schema = SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator()
        .into_root_schema_for::<T>();
    let Value::Object(mut m) = schema.to_value() else {
        unreachable!("a struct's schema is an object")
    };
    for k in ["$schema", "title", "description", "$defs"] {
        m.remove(k);
    }
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        props.values_mut().for_each(tidy);
    }
    m
}

fn tidy(v: &mut Value) {
    let Value::Object(m) = v else { return };
    for k in ["default", "format", "title"] {
        m.remove(k);
    }
    if let Some(Value::Array(types)) = m.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let t = types.remove(0);
            m.insert("type".into(), t);
        }
    }
    if let Some(Value::String(d)) = m.get_mut("description") {
        *d = d.replace('\n', " ");
    }
    if let Some(items) = m.get_mut("items") {
        tidy(items);
    }
}

/// A contribution verb's schema: the fields of [`TurnWire`] it takes (`room`, `actor` and
/// `idempotency_key` always), `text` described in the verb's own words, and what it requires.
fn turn_schema(text: Option<&str>, fields: &[&str], required: &[&str]) -> Value {
    let mut schema = input_schema::<TurnWire>();
    let Some(Value::Object(props)) = schema.get_mut("properties") else {
        unreachable!("TurnWire has properties")
    };
    props.retain(|k, _| {
        matches!(
            k.as_str(),
            "room" | "actor" | "idempotency_key" | "read_through"
        ) || fields.contains(&k.as_str())
    });
    if let (Some(desc), Some(Value::Object(t))) = (text, props.get_mut("text")) {
        t.insert("description".into(), json!(desc));
    }
    let mut req = vec![json!("room")];
    req.extend(required.iter().map(|r| json!(r)));
    schema.insert("required".into(), Value::Array(req));
    Value::Object(schema)
}

/// `task_delegate`'s schema: task_create's fields a subtask needs, `parent` required.
fn delegate_schema() -> Value {
    let mut schema = input_schema::<TaskCreateArgs>();
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.retain(|k, _| {
            matches!(
                k.as_str(),
                "room"
                    | "parent"
                    | "title"
                    | "to"
                    | "scopes"
                    | "requirements"
                    | "accept"
                    | "coordination_only"
                    | "idempotency_key"
            )
        });
        // task_create's tool describes them; a host pays for these bytes in every session
        for (k, v) in props.iter_mut() {
            if let (false, Value::Object(m)) = (k == "parent", v) {
                m.remove("description");
            }
        }
    }
    schema.insert("required".into(), json!(["room", "title", "parent"]));
    Value::Object(schema)
}

/// The multiplexer's schema: every verb's fields in one object, typed but without their
/// descriptions and limits (the verb tools carry those, and the multiplexer is what a host that
/// counts every byte lists); a field two verbs type differently takes either type.
fn multiplexer_schema(actions: &[&str]) -> Value {
    let mut props = Map::new();
    for schema in [
        input_schema::<TurnWire>(),
        input_schema::<SyncArgs>(),
        input_schema::<TaskCreateArgs>(),
        input_schema::<TaskClaimArgs>(),
        input_schema::<TaskArgs>(),
        input_schema::<TaskSupersedeArgs>(),
        input_schema::<TaskCancelArgs>(),
        input_schema::<OpBeginArgs>(),
        input_schema::<OpArgs>(),
        input_schema::<EvidenceArgs>(),
        input_schema::<WakeTakeArgs>(),
    ] {
        let Some(Value::Object(p)) = schema.get("properties") else {
            continue;
        };
        for (k, v) in p {
            let mut v = v.clone();
            if let Value::Object(m) = &mut v {
                m.retain(|k, _| k == "type" || k == "items");
                if let Some(Value::Object(items)) = m.get_mut("items") {
                    items.retain(|k, _| k == "type");
                }
            }
            match props.get_mut(k) {
                None => {
                    props.insert(k.clone(), v);
                }
                Some(Value::Object(have)) => merge_types(have, v),
                Some(_) => {}
            }
        }
    }
    // one type per field, for hosts that map schemas onto a single-type dialect (Gemini's
    // function declarations; the Inspector's --strict warns): `to` is a list of agents, and
    // task_create's one recipient arrives as a list of one (see `multiplexer_args`)
    props.insert(
        "to".into(),
        json!({"type": "array", "items": {"type": "string"}}),
    );
    props.insert("action".into(), json!({"type": "string", "enum": actions}));
    json!({"type": "object", "properties": props, "required": ["action"], "additionalProperties": false})
}

fn merge_types(have: &mut Map<String, Value>, other: Value) {
    let Value::Object(other) = other else { return };
    let types = |v: Option<&Value>| -> Vec<Value> {
        match v {
            Some(Value::Array(a)) => a.clone(),
            Some(t) => vec![t.clone()],
            None => vec![],
        }
    };
    let mut all = types(have.get("type"));
    for t in types(other.get("type")) {
        if !all.contains(&t) {
            all.push(t);
        }
    }
    for (k, v) in other {
        have.entry(k).or_insert(v);
    }
    have.insert(
        "type".into(),
        if all.len() == 1 {
            all.remove(0)
        } else {
            Value::Array(all)
        },
    );
}

/// The multiplexer's arguments as the daemon takes them: task_create's `to` names one agent,
/// which the multiplexer's schema types as a list (of one).
pub fn multiplexer_args(mut args: Map<String, Value>) -> Map<String, Value> {
    if args.get("action").and_then(Value::as_str) == Some("task_create")
        && let Some(Value::Array(to)) = args.get("to")
        && to.len() == 1
    {
        let one = to[0].clone();
        args.insert("to".into(), one);
    }
    args
}

/// Every tool, in listing order.
pub fn all() -> Vec<ToolDef> {
    let empty = json!({"type": "object", "properties": {}, "additionalProperties": false});
    let object = |m: Map<String, Value>| Value::Object(m);
    let mut tools = vec![
        ToolDef {
            name: "room_whoami",
            op: "whoami",
            description: "Who you are: agent name, effective tier, the conversation your reading position is bound to, your rooms and wakes.",
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
            input: object(input_schema::<SyncArgs>()),
        },
        ToolDef {
            name: "room_search",
            op: "search",
            description: "Find events of a room by the words they say, best first; only what you may read. Confirms nothing. Page with cursor set to next.",
            input: object(input_schema::<SearchArgs>()),
        },
        ToolDef {
            name: "room_note",
            op: "note",
            description: "Post status telemetry (progress, what you are doing). Wakes no one; @mentions are refused. Use room_say or room_send to address someone. \
With a task addressed to you, claim it first (task_claim).",
            input: turn_schema(
                Some("The status text."),
                &["text", "task", "audience"],
                &["text"],
            ),
        },
        ToolDef {
            name: "room_say",
            op: "say",
            description: "Say something in a room, optionally to named agents (wakes them in coordination rooms only). Without to or reply_to and with open items from \
one source it answers them; with open items from several sources it is refused (say_reply_target_ambiguous): name reply_to. Never carries a task.",
            input: turn_schema(
                Some("What you say."),
                &["text", "to", "reply_to", "audience"],
                &["text"],
            ),
        },
        ToolDef {
            name: "room_reply",
            op: "reply",
            description: "Answer a mention or obligation addressed to you (see open_items in room_sync). Resolves it; refused with reply_target_not_addressed if it is not yours.",
            input: turn_schema(
                Some("Your answer."),
                &["text", "reply_to"],
                &["text", "reply_to"],
            ),
        },
        ToolDef {
            name: "room_send",
            op: "send",
            description: "Assign work: one obligation and one sealed wake permit per recipient. In a project room a task is required (send_task_required).",
            input: turn_schema(
                Some("The assignment."),
                &["text", "to", "task", "evidence", "audience"],
                &["text", "to"],
            ),
        },
        ToolDef {
            name: "room_handoff",
            op: "handoff",
            description: "Hand a task you hold to another member. No lease moves with it: the recipient must claim it afresh.",
            input: turn_schema(
                Some("Optional note for the new recipient."),
                &["task", "to", "text"],
                &["task", "to"],
            ),
        },
        ToolDef {
            name: "room_done",
            op: "done",
            description: "Finish a task you have claimed. Room first measures the task's acceptance checks itself; if one fails it refuses \
(task_acceptance_failed, with each result). Only passing checks resolve your obligations for the task.",
            input: turn_schema(
                Some("Optional summary of what was done."),
                &["task", "text"],
                &["task"],
            ),
        },
        ToolDef {
            name: "room_blocked",
            op: "blocked",
            description: "Mark a task you hold as blocked, with the reason. Its owner gets an obligation to answer.",
            input: turn_schema(
                Some("Why you are blocked."),
                &["task", "text"],
                &["task", "text"],
            ),
        },
        ToolDef {
            name: "room_decline",
            op: "decline",
            description: "Refuse a task addressed to you. Your obligations for it resolve as declined (never as done); its owner is told.",
            input: turn_schema(Some("Optional reason."), &["task", "text"], &["task"]),
        },
        ToolDef {
            name: "room_circle",
            op: "circle",
            description: "Re-raise an unanswered obligation you created; its addressee is woken again under the original deadline.",
            input: turn_schema(
                Some("Optional reminder text."),
                &["obligation", "text"],
                &["obligation"],
            ),
        },
        ToolDef {
            name: "room_wake_take",
            op: "wake_take",
            description: "Take your oldest queued wake (work sent to you) when no worker is routed to you. \
Answer its obligation_ids with room_reply from this session before not_after_ms: that is the proof.",
            input: object(input_schema::<WakeTakeArgs>()),
        },
        ToolDef {
            name: "room_compose",
            op: "room_compose",
            description: "Read several rooms together in causal order (read only: confirms nothing, passes no gate). \
All must be rooms you read, of one project. Pass next back as cursor for more; if a room changed meanwhile, start again.",
            input: object(input_schema::<ComposeArgs>()),
        },
        ToolDef {
            name: "task_create",
            op: "task_create",
            description: "Create a task in a room (coordinator tier), optionally for a recipient, under a parent task, and with typed scopes \
(namespace:resource, e.g. file:src/lib.rs or api:stripe) that a claim leases exclusively: file scopes conflict hierarchically, others by identity; \
and with acceptance checks that done measures.",
            input: object(input_schema::<TaskCreateArgs>()),
        },
        ToolDef {
            name: "task_delegate",
            op: "task_create",
            description: "Delegate part of a task: a subtask under parent (task_create with parent). Refused if an ancestor is settled, changed or a cycle (task_ancestry_invalid), or if its scopes are wider than the parent's (task_scope_widened).",
            input: delegate_schema(),
        },
        ToolDef {
            name: "task_claim",
            op: "task_claim",
            description: "Claim an open task addressed to you (or to no one) before working on it. The claim leases the task's scopes \
(a conflicting live lease is refused with lease_conflict, naming its holder); unresolved after ttl_ms (default 20 minutes) it is recorded in doubt.",
            input: object(input_schema::<TaskClaimArgs>()),
        },
        ToolDef {
            name: "task_show",
            op: "task_show",
            description: "Show a task: title, owner, recipient, status, scopes, acceptance checks, lineage, lease and the last acceptance results.",
            input: object(input_schema::<TaskArgs>()),
        },
        ToolDef {
            name: "task_accept_check",
            op: "task_check",
            description: "Evaluate a task's acceptance checks now without closing it (its owner or recipient): each check's result, as done would see it.",
            input: object(input_schema::<TaskArgs>()),
        },
        ToolDef {
            name: "task_amend",
            op: "task_amend",
            description: "Replace the requirements or checks of a task you own. A claim taken before cannot close it until its holder claims again.",
            input: object(input_schema::<TaskAmendArgs>()),
        },
        ToolDef {
            name: "task_supersede",
            op: "task_supersede",
            description: "Replace a task you own with a verified successor (same owner, project and requirements, with checks, no wider scope); \
the successor's done resolves the old task's obligations.",
            input: object(input_schema::<TaskSupersedeArgs>()),
        },
        ToolDef {
            name: "task_cancel",
            op: "task_cancel",
            description: "Withdraw a live task you own: it settles as cancelled, its lease is released, its open obligations resolve as cancelled and its subtasks can no longer close.",
            input: object(input_schema::<TaskCancelArgs>()),
        },
        ToolDef {
            name: "task_propose",
            op: "task_propose",
            description: "Change one row of a source your claimed task projected (stage): its key, the version you read, the columns to set. Room applies it (version + 1) or refuses.",
            input: object(input_schema::<TaskProposeArgs>()),
        },
        ToolDef {
            name: "source_read",
            op: "source_read",
            description: "Read a governed task's governing source, one chunk at a time from next_offset. done on a governed task needs every part read whole, by you, since your claim.",
            input: object(input_schema::<SourceReadArgs>()),
        },
        ToolDef {
            name: "evidence_register",
            op: "evidence_register",
            description: "Register evidence (for a task's requirement): a first-hand origin, or the ev_ handles it derives from. \
Returns an ev_ handle to cite in room_send's evidence.",
            input: object(input_schema::<EvidenceArgs>()),
        },
        ToolDef {
            name: "op_begin",
            op: "op_begin",
            description: "Before an external effect (deploy, API call) for a task you claimed, record it; then op_effect, then op_resolve. \
Unresolved past ttl_ms it is recorded in doubt.",
            input: object(input_schema::<OpBeginArgs>()),
        },
        ToolDef {
            name: "op_effect",
            op: "op_effect",
            description: "Record that your operation's effect was performed.",
            input: object(input_schema::<OpArgs>()),
        },
        ToolDef {
            name: "room_cancel",
            op: "room_cancel",
            description: "Operator tier only: cancel a room. Queued wakes die, running workers stop (zero processes confirmed), \
obligations stay open, unresolved operations are held for reconciliation.",
            input: object(input_schema::<CancelArgs>()),
        },
        ToolDef {
            name: "op_resolve",
            op: "op_resolve",
            description: "Record your operation's outcome.",
            input: object(input_schema::<OpArgs>()),
        },
    ];
    // lifecycle control is not a verb: it has its own tool and standing, never the multiplexer;
    // nor is search (a read of its own)
    // each operation once (task_delegate is task_create under its own name)
    let mut actions: Vec<&str> = Vec::new();
    for op in tools.iter().map(|t| t.op) {
        if !matches!(op, "room_cancel" | "search") && !actions.contains(&op) {
            actions.push(op);
        }
    }
    tools.push(ToolDef {
        name: "room",
        op: "room",
        description: "Multiplexer for every Room action: set action to one of whoami, list, sync, room_compose, note, say, reply, send, handoff, done, blocked, decline, circle, wake_take, \
task_create, task_claim, task_show, task_check, task_amend, task_supersede, task_cancel, task_propose, source_read, evidence_register, op_begin, op_effect, op_resolve, and pass that action's arguments (as its own tool takes them) alongside.",
        input: multiplexer_schema(&actions),
    });
    tools
}

/// The blackboard's tools, listed only to a delegated principal whose scopes allow each (see
/// [`blackboard_allowed`]): an agent outside a collaboration pays nothing for them.
pub fn blackboard() -> Vec<ToolDef> {
    let object = |m: Map<String, Value>| Value::Object(m);
    vec![
        ToolDef {
            name: "artifact_index",
            op: "artifact_index",
            description: "List the collaboration's artifacts: the newest version of each (kind, key, version, producer, sha256, bytes), never their contents. \
Page with after set to next_after.",
            input: object(input_schema::<ArtifactIndexArgs>()),
        },
        ToolDef {
            name: "artifact_get",
            op: "artifact_get",
            description: "Read one artifact version with its content (the newest unless version is set). Needs the read scope for its kind.",
            input: object(input_schema::<ArtifactGetArgs>()),
        },
        ToolDef {
            name: "artifact_put",
            op: "artifact_put",
            description: "Write a new version of an artifact in its kind's schema. Set expected_version to the newest version you read (0: a new artifact); \
a stale one is refused artifact_version_conflict. parents: the event ids of the artifact versions you made it from. Needs the write scope for its kind.",
            input: object(input_schema::<ArtifactPutArgs>()),
        },
        ToolDef {
            name: "diff_from_tree",
            op: "diff_from_tree",
            description: "Write the diff artifact from your working tree (you start in it): Room takes every change there, new files included, \
against the collaboration's base and writes it as the next version of diff. Edit files there, then call this; the person's checkout is never touched.",
            input: object(input_schema::<DiffFromTreeArgs>()),
        },
        ToolDef {
            name: "collab_ask",
            op: "collab_ask",
            description: "Ask the person a question mid-phase (a collaboration's role): it waits in their approval queue, and their answer comes back to you as a message \
on your task. Ask rarely, and go on with what does not depend on the answer.",
            input: object(input_schema::<CollabAskArgs>()),
        },
        ToolDef {
            name: "collab_status",
            op: "collab_status",
            description: "The collaboration you orchestrate: each phase's state (waiting, ready, approval, running, done, failed) with its role and purposes, \
the ready list, runs, the blackboard's index (never contents), pending approvals, guards, each child's live state and flags. Needs session:read.",
            input: object(input_schema::<CollabSteerArgs>()),
        },
        ToolDef {
            name: "collab_dispatch",
            op: "collab_dispatch",
            description: "Dispatch one ready phase to its role's child (a task and a wake; a pack's approve phases wait for the person first), \
named by phase or selected by purpose. Refused phase_not_ready (with the ready list) when it is not ready. Needs session:dispatch.",
            input: object(input_schema::<CollabDispatchArgs>()),
        },
        ToolDef {
            name: "collab_request_approval",
            op: "collab_request_approval",
            description: "Put one ready phase in the person's approval queue instead of dispatching it: they see the full delegation input \
(role, backend, model, prompt, the digests of what it reads) and approve, revise or reject; approved, it is dispatched. Needs session:dispatch.",
            input: object(input_schema::<CollabDispatchArgs>()),
        },
        ToolDef {
            name: "collab_close",
            op: "collab_close",
            description: "Finish the collaboration once every phase is done (its goal task closes, its identities are revoked; the person merges). \
Refused collab_phases_open naming each phase not done. Needs session:dispatch.",
            input: object(input_schema::<CollabSteerArgs>()),
        },
    ]
}

/// Whether a principal holding `scopes` is listed the blackboard tool `name`: a write scope
/// for `artifact_put`, a read scope for `artifact_get`, `session:read` or any artifact scope
/// for `artifact_index`, `session:read` for `collab_status`, `session:dispatch` for the
/// orchestrator's other tools. A root (no scope list) is listed none (it may still call them).
pub fn blackboard_allowed(name: &str, scopes: Option<&[String]>) -> bool {
    let Some(scopes) = scopes else { return false };
    let any = |prefix: &str| scopes.iter().any(|s| s.starts_with(prefix));
    match name {
        "artifact_put" => any("artifact:write:"),
        "diff_from_tree" => {
            scopes.iter().any(|s| s == "artifact:write:diff")
                && scopes.iter().any(|s| s == "project:write")
        }
        "artifact_get" => any("artifact:read:"),
        "artifact_index" => any("artifact:") || any("session:read"),
        "collab_ask" => any("artifact:"),
        "collab_status" => any("session:read"),
        "collab_dispatch" | "collab_request_approval" | "collab_close" => any("session:dispatch"),
        _ => false,
    }
}

/// Output schema shared by every tool: an object (the result, or `{refusal: …}` when isError
/// is true, as every tool's description says).
pub fn output_schema() -> Value {
    json!({"type": "object"})
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

/// A tool's description with the refusal advice: the whole loop on `room_sync` and `room`, a
/// brief pointer on the others (every byte here is paid for each tool in every host's context).
pub fn description(t: &ToolDef) -> String {
    let advice = match t.name {
        "room_sync" | "room" => REFUSALS,
        _ => REFUSALS_BRIEF,
    };
    format!("{} {advice}", t.description)
}
