//! Wire types of the daemon API: one JSON object per line on the Unix socket, the same object
//! as the body of `POST /v1/call` over HTTP. Unknown fields are refused so a typo is an error,
//! not a silently ignored argument.

use room_core::acceptance::{CHECKS_PER_TASK_MAX, REQUIREMENTS_PER_TASK_MAX};
use room_core::scope::SCOPES_PER_TASK_MAX;
use room_engine::TEXT_BYTES_MAX;
use room_engine::compose::{COMPOSE_ITEMS_MAX, COMPOSE_ROOMS_MAX};
use room_engine::invariants::{
    CLAIM_TTL_MS_MAX, CLAIM_TTL_MS_MIN, IDEMPOTENCY_KEY_BYTES_MAX, IDEMPOTENCY_KEY_PATTERN,
};
use room_engine::source::SOURCE_CHUNK_BYTES_MAX;
use room_engine::verbs::TITLE_BYTES_MAX;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest request accepted, in bytes (one line on the socket, one body over HTTP).
pub const REQUEST_BYTES_MAX: usize = 2 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub op: String,
    /// The agent credential; absent for the owner console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The native conversation (transport metadata, never a model-authored argument).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// The tier this connection declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default)]
    pub args: Value,
    /// Request metadata from the host (MCP `_meta`), outside the model-authored arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
    /// The transport's ceiling for one page (transport metadata: the MCP layer sets it, since
    /// an MCP result carries its page twice, as text and as structured content). It can only
    /// lower the engine's own ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_bytes_max: Option<u32>,
}

impl Request {
    /// A request with only an operation and its arguments (the owner console's form); set
    /// `token` and the rest for an agent.
    pub fn new(op: &str, args: Value) -> Request {
        Request {
            op: op.into(),
            token: None,
            conversation: None,
            tier: None,
            args,
            meta: None,
            page_bytes_max: None,
        }
    }

    /// The same request made with an agent's token.
    pub fn with_token(mut self, token: Option<&str>) -> Request {
        self.token = token.map(String::from);
        self
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<room_core::Refusal>,
}

impl Response {
    pub fn ok(v: Value) -> Self {
        Response {
            ok: true,
            result: Some(v),
            refusal: None,
        }
    }
    pub fn refused(r: room_core::Refusal) -> Self {
        Response {
            ok: false,
            result: None,
            refusal: Some(r),
        }
    }

    /// The result, or the refusal as `ServerError::Refused`.
    pub fn into_result(self) -> Result<Value, crate::ServerError> {
        match (self.ok, self.result, self.refusal) {
            (_, _, Some(r)) => Err(crate::ServerError::Refused(r)),
            (true, v, None) => Ok(v.unwrap_or(Value::Null)),
            (false, _, None) => Err(crate::ServerError::Protocol(
                "a failed response without a refusal".into(),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameArgs {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollArgs {
    pub name: String,
    #[serde(default)]
    pub max_tier: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
}

/// `agent_delegate` (the owner: a child under `parent`) and `delegate` (an agent: a child under
/// itself, `parent` absent).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegateArgs {
    #[serde(default)]
    pub parent: Option<String>,
    pub name: String,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub max_tier: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyArgs {
    pub name: String,
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub max_tier: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectOpenArgs {
    pub path: String,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomCreateArgs {
    pub name: String,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub members: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomAgentArgs {
    pub room: String,
    pub agent: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomArgs {
    pub room: String,
}

/// `index_rebuild`: `accept_loss` lets a rebuild write over acknowledged records the journal
/// lost, recording the loss in the journal (`journal_loss`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexRebuildArgs {
    pub room: String,
    #[serde(default)]
    pub accept_loss: bool,
}

/// Arguments of an operation that takes none.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// `room_cancel`: stop a room's work (control standing: the owner console or an operator).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    /// The room to cancel.
    pub room: String,
    /// Who you act for: recorded, grants nothing.
    #[serde(default)]
    #[schemars(length(min = 1, max = 128))]
    pub by: Option<String>,
}

/// `room_reconcile`: list a room's held items, or resolve one (`hold`, `outcome`, `evidence`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileArgs {
    pub room: String,
    #[serde(default)]
    pub hold: Option<String>,
    #[serde(default)]
    pub outcome: Option<String>,
    #[serde(default)]
    pub evidence: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakGlassArgs {
    pub engage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionArgs {
    pub room: String,
    pub open: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptRoomArgs {
    #[serde(default)]
    pub room: Option<String>,
}

/// `compose_grant`: the agent and the rooms it may read composed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComposeGrantArgs {
    pub agent: String,
    pub rooms: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptAgentArgs {
    #[serde(default)]
    pub agent: Option<String>,
}

/// `route_set`: an agent's route, as the `[routes.<agent>]` table of config.toml in JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSetArgs {
    pub agent: String,
    pub route: Value,
}

/// `wakes_show`: a permit by the path `wakes_list` prints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeShowArgs {
    pub wake: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdArgs {
    pub id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogArgs {
    pub room: String,
    #[serde(default)]
    pub from: Option<u64>,
    #[serde(default)]
    pub limit: Option<usize>,
}

// The arguments of the agent verbs below are the one definition of each: they decode the
// wire, the MCP tools' input schemas are generated from them (`mcp::tools`), doc comments
// becoming descriptions (written for a model that has never seen Room) and every limit the
// engine's own constant, and the CLI parses them (`clap::Args`; the doc comments are its help).

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct SyncArgs {
    /// Room name (see room_list).
    pub room: String,
    /// Receipt (rcpt_…) of the page you read.
    #[serde(default)]
    #[arg(long)]
    pub confirm: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct WakeTakeArgs {
    /// Only from this room.
    #[serde(default)]
    pub room: Option<String>,
    /// One wake, by its source_event (needs room).
    #[serde(default)]
    #[arg(long = "event")]
    pub source_event: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskCreateArgs {
    /// Room name (see room_list).
    pub room: String,
    #[schemars(length(max = TITLE_BYTES_MAX))]
    pub title: String,
    /// Recipient agent.
    #[serde(default)]
    #[arg(long)]
    pub to: Option<String>,
    /// Parent task id.
    #[serde(default)]
    #[arg(long)]
    pub parent: Option<String>,
    /// Typed scopes the task's claim leases.
    #[serde(default)]
    #[arg(long = "scope")]
    #[schemars(length(max = SCOPES_PER_TASK_MAX))]
    pub scopes: Vec<String>,
    /// Optional key that makes a retry safe: a repeat of a key you already used in this room is
    /// refused with invariant_violation (exactly_once) naming the event your first call wrote.
    #[serde(default)]
    #[arg(long)]
    #[schemars(length(max = IDEMPOTENCY_KEY_BYTES_MAX), pattern(IDEMPOTENCY_KEY_PATTERN))]
    pub idempotency_key: Option<String>,
    /// What the work must achieve; a task with requirements needs acceptance checks to close.
    #[serde(default)]
    #[arg(long = "requirement")]
    #[schemars(length(max = REQUIREMENTS_PER_TASK_MAX))]
    pub requirements: Vec<String>,
    /// Checks done measures: sha256{path,expected} file_exists{path} file_absent{path}
    /// command{program,args,timeout_ms,exit_code} destination{destination} evidence_origins{req,min}
    /// worker_receipt{profile,...}; paths relative to the project root.
    #[serde(default)]
    #[arg(long = "accept", value_parser = json_object)]
    #[schemars(schema_with = "accept_schema")]
    pub accept: Vec<Value>,
    /// Leases nothing, nor may its subtasks.
    #[serde(default)]
    #[arg(long)]
    pub coordination_only: bool,
    /// Bound to the project's governing source: done needs checks and a whole reading of it.
    #[serde(default)]
    #[arg(long)]
    pub governed: bool,
    /// Project files its worker is staged with: {path, sha256, project?: {format: json|jsonl|sqlite,
    /// table?, key, version, columns, rows?}}.
    #[serde(default)]
    #[arg(long = "stage", value_parser = json_object)]
    #[schemars(schema_with = "stage_schema")]
    pub stage: Vec<Value>,
}

fn stage_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": room_core::stage::SELECTIONS_MAX,
        "items": {"type": "object", "required": ["path", "sha256"]}
    })
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct SourceReadArgs {
    /// A governed task.
    pub task: String,
    /// The part's index (0 first).
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub part: usize,
    /// Byte offset (the previous read's next_offset).
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    #[schemars(range(min = 1, max = SOURCE_CHUNK_BYTES_MAX))]
    pub length: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ProjectSourceArgs {
    pub project: String,
    /// A part of the source: a text file, relative to the project root (repeat, in order;
    /// none clears the source).
    #[serde(default)]
    #[arg(long = "part")]
    pub parts: Vec<String>,
}

/// A composition cursor: an object the previous page gave, passed back verbatim.
fn cursor_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": true,
        "description": "The previous page's next, verbatim."
    })
}

/// A `--accept` value: one check as a JSON object.
fn json_object(s: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("a check is a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// The checks' schema: typed by kind, briefly (each tool definition costs a model's context).
fn accept_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": CHECKS_PER_TASK_MAX,
        "items": {
            "type": "object",
            "properties": {"kind": {"type": "string", "enum": room_core::acceptance::KINDS}},
            "required": ["kind"]
        }
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArgs {
    pub task: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskAmendArgs {
    pub task: String,
    /// Replaces the task's requirements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long = "requirement")]
    #[schemars(length(max = REQUIREMENTS_PER_TASK_MAX))]
    pub requirements: Option<Vec<String>>,
    /// Replaces the task's checks (as task_create's accept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long = "accept", value_parser = json_object)]
    #[schemars(schema_with = "accept_schema")]
    pub accept: Option<Vec<Value>>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ComposeArgs {
    /// Rooms to read together (1 to 8, one project or only coordination rooms).
    #[arg(required = true)]
    #[schemars(length(min = 1, max = COMPOSE_ROOMS_MAX))]
    pub rooms: Vec<String>,
    /// The previous page's next, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_parser = json_object)]
    #[schemars(schema_with = "cursor_schema")]
    pub cursor: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    #[schemars(range(min = 1, max = COMPOSE_ITEMS_MAX))]
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskSupersedeArgs {
    pub task: String,
    /// The replacing task: same owner, project and requirements, with checks, no wider scope.
    #[arg(long)]
    pub successor: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskCancelArgs {
    pub task: String,
    /// Why it is withdrawn.
    #[serde(default)]
    #[arg(long)]
    #[schemars(length(max = room_engine::completion::REASON_BYTES_MAX))]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskProposeArgs {
    /// A task you hold whose stage projects the source.
    pub task: String,
    /// The projected source (its selection's path).
    #[arg(long)]
    pub path: String,
    /// The row's key, as the projection shows it.
    #[arg(long)]
    pub key: String,
    /// The row's version as you read it.
    #[arg(long)]
    pub version: i64,
    /// The projected columns to set: {column: value}, scalars only.
    #[arg(long, value_parser = json_map)]
    #[schemars(schema_with = "set_schema")]
    pub set: serde_json::Map<String, Value>,
}

fn json_map(s: &str) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("set is a JSON object of columns".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

fn set_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": room_core::stage::PROPOSAL_COLUMNS_MAX
    })
}

#[derive(Debug, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskOverrideArgs {
    pub task: String,
    /// Why the task may close without acceptance checks (recorded in its room's journal).
    #[arg(long)]
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TaskClaimArgs {
    pub task: String,
    /// How long the claim may stay unresolved.
    #[serde(default)]
    #[arg(long)]
    #[schemars(range(min = CLAIM_TTL_MS_MIN, max = CLAIM_TTL_MS_MAX))]
    pub ttl_ms: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct OpBeginArgs {
    /// Room name (see room_list).
    pub room: String,
    #[arg(long)]
    pub task: String,
    /// namespace:resource, inside the task's scopes.
    #[arg(long)]
    pub destination: String,
    /// Operation this one depends on.
    #[serde(default)]
    #[arg(long)]
    pub parent: Option<String>,
    #[serde(default)]
    #[arg(long)]
    #[schemars(range(min = CLAIM_TTL_MS_MIN, max = CLAIM_TTL_MS_MAX))]
    pub ttl_ms: Option<u64>,
    /// Observes the effect (allowlisted program; exit 0 = present).
    #[serde(default)]
    #[arg(long, value_parser = json_object)]
    #[schemars(schema_with = "probe_schema")]
    pub probe: Option<Value>,
    #[serde(default)]
    #[arg(long)]
    pub note: Option<String>,
    #[serde(default)]
    #[arg(long)]
    #[schemars(length(max = IDEMPOTENCY_KEY_BYTES_MAX), pattern(IDEMPOTENCY_KEY_PATTERN))]
    pub idempotency_key: Option<String>,
}

fn probe_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": {
            "program": {"type": "string"},
            "args": {"type": "array", "items": {"type": "string"}},
            "timeout_ms": {"type": "integer"}
        },
        "required": ["program"]
    })
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct EvidenceArgs {
    pub room: String,
    #[serde(default)]
    #[arg(long)]
    pub task: Option<String>,
    /// The requirement it supports (R1).
    #[serde(default)]
    #[arg(long)]
    pub req: Option<String>,
    /// First-hand: namespace:resource (url:https://…).
    #[serde(default)]
    #[arg(long)]
    pub origin: Option<String>,
    /// Or the ev_ handles it derives from.
    #[serde(default)]
    #[arg(long)]
    pub lineage: Vec<String>,
    #[serde(default)]
    #[arg(long)]
    pub summary: Option<String>,
    /// Only these members (and you) read it, and what cites it.
    #[serde(default)]
    #[arg(long)]
    #[schemars(length(max = room_engine::visibility::AUDIENCE_MAX))]
    pub audience: Vec<String>,
}

/// `op_effect` and `op_resolve`.
#[derive(Debug, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct OpArgs {
    pub room: String,
    /// From op_begin.
    pub op: String,
    /// op_resolve only.
    #[serde(default)]
    #[arg(long)]
    #[schemars(schema_with = "outcome_schema")]
    pub outcome: Option<String>,
    #[serde(default)]
    #[arg(long)]
    pub note: Option<String>,
}

fn outcome_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": ["succeeded", "failed"]})
}

/// Arguments of the nine contribution verbs. `action` is only for the multiplexer `room` op.
/// Each verb's tool takes the fields it uses (`mcp::tools`), with its own words for `text`.
#[derive(Debug, Serialize, Deserialize, Default, JsonSchema, clap::Args, Clone)]
#[serde(deny_unknown_fields)]
pub struct TurnWire {
    #[serde(default)]
    #[arg(skip)]
    pub action: Option<String>,
    /// Room name (see room_list).
    pub room: String,
    #[serde(default)]
    #[schemars(length(max = TEXT_BYTES_MAX))]
    pub text: Option<String>,
    /// Agent names to address (members of the room).
    #[serde(default)]
    #[arg(long)]
    pub to: Vec<String>,
    /// The event (evt_…), mention (mnt_…) or obligation (obl_…) you answer.
    #[serde(default)]
    #[arg(long)]
    pub reply_to: Option<String>,
    /// Task id (tsk_…).
    #[serde(default)]
    #[arg(long)]
    pub task: Option<String>,
    /// Event ids (evt_…) of this room that support the message.
    #[serde(default)]
    #[arg(long)]
    pub evidence: Vec<String>,
    /// Explicit causal parents (event ids of this room).
    #[serde(default)]
    #[arg(long = "parent", value_name = "PARENT")]
    pub parents: Vec<String>,
    /// Obligation id (obl_…) you raised.
    #[serde(default)]
    #[arg(skip)]
    pub obligation: Option<String>,
    /// Optional self-identification; if given it must be your own agent name.
    #[serde(default)]
    #[arg(long = "as")]
    pub actor: Option<String>,
    /// Optional key that makes a retry safe: a repeat of a key you already used in this room is
    /// refused with invariant_violation (exactly_once) naming the event your first call wrote.
    #[serde(default)]
    #[arg(long)]
    #[schemars(length(max = IDEMPOTENCY_KEY_BYTES_MAX), pattern(IDEMPOTENCY_KEY_PATTERN))]
    pub idempotency_key: Option<String>,
    /// Receipt of the page you just read: confirm it and act in one call.
    #[serde(default)]
    #[arg(long)]
    pub read_through: Option<String>,
    /// Only these members (and you) read it, and what answers it.
    #[serde(default)]
    #[arg(long)]
    #[schemars(length(max = room_engine::visibility::AUDIENCE_MAX))]
    pub audience: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditArgs {
    pub room: String,
    pub event: String,
}

/// Parse one JSON text as `serde_json` does, except that an object naming a key twice, at any
/// depth, is an error rather than its last value silently winning.
pub fn parse_strict(text: &str) -> Result<Value, serde_json::Error> {
    use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};

    struct Strict;

    impl<'de> DeserializeSeed<'de> for Strict {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Strict {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
            Ok(Value::Bool(b))
        }
        fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
            Ok(n.into())
        }
        fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
            Ok(n.into())
        }
        fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, s: &str) -> Result<Value, E> {
            Ok(Value::String(s.into()))
        }
        fn visit_string<E>(self, s: String) -> Result<Value, E> {
            Ok(Value::String(s))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut out = Vec::new();
            while let Some(v) = seq.next_element_seed(Strict)? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(k) = map.next_key::<String>()? {
                if out.contains_key(&k) {
                    return Err(A::Error::custom(format!("duplicate key {k:?}")));
                }
                let v = map.next_value_seed(Strict)?;
                out.insert(k, v);
            }
            Ok(Value::Object(out))
        }
    }

    let mut de = serde_json::Deserializer::from_str(text);
    let v = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parse_refuses_duplicate_keys_at_any_depth() {
        assert!(parse_strict(r#"{"a":1,"b":{"c":[1,2.5,"x",null,true]}}"#).is_ok());
        assert_eq!(
            parse_strict(r#"{"a":1,"b":{"c":[{"d":1}]}}"#).unwrap(),
            serde_json::json!({"a":1,"b":{"c":[{"d":1}]}})
        );
        for bad in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":{"b":1,"b":1}}"#,
            r#"[{"x":1,"x":1}]"#,
            r#"{"a":1} {}"#,
        ] {
            assert!(parse_strict(bad).is_err(), "{bad}");
        }
    }
}

/// `artifact_put`: write a version of a blackboard artifact (a note carrying it).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactPutArgs {
    /// The collaboration's room.
    pub room: String,
    /// spec, research, adr, task-list, diff, findings or extra/<key>.
    pub kind: String,
    /// The artifact within its kind: main unless named (a reviewer keys its findings by its own name).
    #[serde(default)]
    pub key: Option<String>,
    /// The content: a JSON object in the kind's schema (see the pack's prompt).
    pub content: Value,
    /// The version this write follows: 0 for a new artifact, else the newest version you read.
    pub expected_version: u32,
    /// A line for the room's timeline (default: kind/key and the version).
    #[serde(default)]
    #[schemars(length(max = TEXT_BYTES_MAX))]
    pub text: Option<String>,
    /// Task id (tsk_…) of the phase this writes for.
    #[serde(default)]
    pub task: Option<String>,
    /// Event ids of what it was made from (the artifact versions you read).
    #[serde(default)]
    pub parents: Vec<String>,
    /// Only these members (and you) read it.
    #[serde(default)]
    #[schemars(length(max = room_engine::visibility::AUDIENCE_MAX))]
    pub audience: Vec<String>,
    /// Receipt of the page you just read: confirm it and write in one call.
    #[serde(default)]
    pub read_through: Option<String>,
    #[serde(default)]
    #[schemars(length(max = IDEMPOTENCY_KEY_BYTES_MAX), pattern(IDEMPOTENCY_KEY_PATTERN))]
    pub idempotency_key: Option<String>,
}

/// `diff_from_tree`: write the `diff` artifact from the caller's own working tree (an
/// implementing role of a collaboration): Room takes every change there against the
/// collaboration's base.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffFromTreeArgs {
    /// The collaboration's room.
    pub room: String,
    /// The diff within its kind: main unless named.
    #[serde(default)]
    pub key: Option<String>,
    /// The version this write follows: 0 for the first diff, else the newest version you read.
    pub expected_version: u32,
    /// What the change does, in a line or two.
    #[serde(default)]
    #[schemars(length(max = TEXT_BYTES_MAX))]
    pub summary: Option<String>,
    /// A line for the room's timeline (default: kind/key and the version).
    #[serde(default)]
    #[schemars(length(max = TEXT_BYTES_MAX))]
    pub text: Option<String>,
    /// Task id (tsk_…) of the phase this writes for.
    #[serde(default)]
    pub task: Option<String>,
    /// Event ids of what it was made from (the artifact versions you read).
    #[serde(default)]
    pub parents: Vec<String>,
    /// Receipt of the page you just read: confirm it and write in one call.
    #[serde(default)]
    pub read_through: Option<String>,
    #[serde(default)]
    #[schemars(length(max = IDEMPOTENCY_KEY_BYTES_MAX), pattern(IDEMPOTENCY_KEY_PATTERN))]
    pub idempotency_key: Option<String>,
}

/// `collab_ask`: a role asks the person a question mid-phase; the answer comes back to it as
/// a message (on its task, when it names one).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CollabAskArgs {
    /// The collaboration's room.
    pub room: String,
    /// What you ask the person, in a few lines.
    #[schemars(length(max = room_engine::collab::ASK_BYTES_MAX))]
    pub question: String,
    /// Task id (tsk_…) of the phase you work on: the answer comes on it.
    #[serde(default)]
    pub task: Option<String>,
}

/// `collab_status` and `collab_close` for an agent orchestrator.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CollabSteerArgs {
    /// The collaboration's id (its room's name), as the wake says it.
    pub id: String,
}

/// `collab_dispatch` and `collab_request_approval`: one ready phase, by name or purpose.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CollabDispatchArgs {
    /// The collaboration's id (its room's name), as the wake says it.
    pub id: String,
    /// The phase to run (one collab_status lists as ready).
    #[serde(default)]
    pub phase: Option<String>,
    /// Instead of a phase: a purpose tag (implement, review, explore, …), which selects the
    /// role serving it and so its one ready phase.
    #[serde(default)]
    pub purpose: Option<String>,
}

/// `artifact_get`: one artifact version with its content.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactGetArgs {
    pub room: String,
    /// spec, research, adr, task-list, diff, findings or extra/<key>.
    pub kind: String,
    /// main unless named.
    #[serde(default)]
    pub key: Option<String>,
    /// The newest unless named.
    #[serde(default)]
    pub version: Option<u32>,
}

/// `artifact_index`: the newest version of each artifact, without contents.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactIndexArgs {
    pub room: String,
    /// Continue after this artifact (kind/key: a page's next_after).
    #[serde(default)]
    pub after: Option<String>,
    /// Entries per page.
    #[serde(default)]
    #[schemars(range(min = 1, max = room_engine::blackboard::INDEX_PAGE_MAX))]
    pub limit: Option<usize>,
}

/// `task_ids`: the caller's tasks whose ids start with `prefix` (completions).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskIdsArgs {
    #[serde(default)]
    pub prefix: String,
}

/// `collab_decide`: the person's decision on one approval request, bound to the digest of
/// what it was shown.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideArgs {
    pub approval: String,
    pub digest: String,
    /// approve, revise or reject.
    pub verdict: String,
    /// A revision's prompt (what the person approves instead of what was shown).
    #[serde(default)]
    pub prompt: Option<String>,
}

/// `collab_rerun`: run a phase of a collaboration again.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerunArgs {
    pub id: String,
    pub phase: String,
}

/// `search`: full-text search over what a room's events say.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Room name (see room_list).
    pub room: String,
    /// Words to find (each must appear); no operators.
    #[schemars(length(max = room_engine::search::QUERY_BYTES_MAX))]
    pub query: String,
    /// Where the last page ended (its next).
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Results per page.
    #[serde(default)]
    #[schemars(range(min = 1, max = room_engine::search::PAGE_MAX))]
    pub limit: Option<usize>,
    /// text (the default) or semantic (by meaning).
    #[serde(default)]
    pub mode: Option<String>,
}

impl SearchArgs {
    pub fn engine(self) -> room_engine::search::SearchArgs {
        room_engine::search::SearchArgs {
            room: self.room,
            query: self.query,
            cursor: self.cursor,
            limit: self.limit,
            mode: self.mode,
        }
    }
}
