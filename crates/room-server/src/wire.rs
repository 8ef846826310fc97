//! Wire types of the daemon API: one JSON object per line on the Unix socket, the same object
//! as the body of `POST /v1/call` over HTTP. Unknown fields are refused so a typo is an error,
//! not a silently ignored argument.

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptRoomArgs {
    #[serde(default)]
    pub room: Option<String>,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncArgs {
    pub room: String,
    #[serde(default)]
    pub confirm: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskCreateArgs {
    pub room: String,
    pub title: String,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskArgs {
    pub task: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskClaimArgs {
    pub task: String,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// Arguments of the nine contribution verbs. `action` is only for the multiplexer `room` op.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TurnWire {
    #[serde(default)]
    pub action: Option<String>,
    pub room: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub to: Vec<String>,
    #[serde(default)]
    pub reply_to: Option<String>,
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub evidence: Vec<String>,
    #[serde(default)]
    pub parents: Vec<String>,
    #[serde(default)]
    pub obligation: Option<String>,
    /// Self-identifying argument: if present it must name the caller.
    #[serde(default)]
    pub actor: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditArgs {
    pub room: String,
    pub event: String,
}
