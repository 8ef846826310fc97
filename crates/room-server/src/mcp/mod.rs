//! MCP for agent hosts: one handler, two transports. Over streamable HTTP it runs inside the
//! daemon and calls the engine directly with the bearer credential of each request; over stdio
//! (`room mcp`) it runs in a bridge process and forwards each call to the daemon's socket with
//! `ROOM_TOKEN`. Either way a tool call is one daemon operation under the same authorization,
//! and the native conversation comes from request metadata, never from tool arguments.

pub mod http;
pub mod tools;

use crate::dispatch::{self, Transport};
use crate::wire::{Request, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use room_engine::Engine;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
pub use tools::ToolsMode;

/// Where tool calls go.
pub trait Backend: Send + Sync + 'static {
    /// Run one daemon operation (blocking).
    fn call(&self, req: Request, bearer: Option<String>) -> Response;
}

/// Inside the daemon: straight to the engine.
pub struct InProcess(pub Arc<Engine>);

impl Backend for InProcess {
    fn call(&self, req: Request, bearer: Option<String>) -> Response {
        dispatch::handle(&self.0, Transport::Http, req, bearer)
    }
}

/// In `room mcp`: over the daemon's socket, with the process's token.
pub struct Bridge {
    pub socket: PathBuf,
    pub token: String,
    /// The tier this connection declares (`ROOM_TIER`), if any.
    pub tier: Option<String>,
}

impl Backend for Bridge {
    fn call(&self, mut req: Request, _bearer: Option<String>) -> Response {
        req.token = Some(self.token.clone());
        req.tier = self.tier.clone();
        match crate::client::Client::connect(&self.socket).and_then(|mut c| c.call(&req)) {
            Ok(r) => r,
            Err(e) => Response::refused(room_core::Refusal::storage(format!(
                "daemon unreachable: {e}"
            ))),
        }
    }
}

#[derive(Clone)]
pub struct RoomMcp {
    backend: Arc<dyn Backend>,
    mode: ToolsMode,
    /// The conversation when neither `_meta` nor an MCP session names one.
    fallback_conversation: String,
}

fn object(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("tool schemas are objects"),
    }
}

/// The tool definitions a host sees in `mode` (built once).
pub fn tool_list(mode: ToolsMode) -> Vec<Tool> {
    tools_of(mode).to_vec()
}

/// The bytes a host pays for the tool definitions of `mode`: the `tools/list` entries measured
/// as the official Python SDK client's `json.dumps([tool.model_dump(exclude_none=True,
/// by_alias=True) …])` writes them (`", "` and `": "` separators, non-ASCII as `\uXXXX`), the
/// figure the README gives.
pub fn definitions_bytes(mode: ToolsMode) -> usize {
    fn len(v: &Value) -> usize {
        match v {
            Value::Null => 4,
            Value::Bool(b) => {
                if *b {
                    4
                } else {
                    5
                }
            }
            Value::Number(n) => n.to_string().len(),
            Value::String(s) => str_len(s),
            Value::Array(a) => 2 + a.iter().map(len).sum::<usize>() + 2 * a.len().saturating_sub(1),
            Value::Object(m) => {
                2 + m
                    .iter()
                    .map(|(k, v)| str_len(k) + 2 + len(v))
                    .sum::<usize>()
                    + 2 * m.len().saturating_sub(1)
            }
        }
    }
    fn str_len(s: &str) -> usize {
        2 + s
            .chars()
            .map(|c| match c {
                '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
                c if (c as u32) < 0x20 => 6,
                c if c.is_ascii() => 1,
                c if (c as u32) < 0x1_0000 => 6,
                _ => 12,
            })
            .sum::<usize>()
    }
    let tools = serde_json::to_value(tools_of(mode)).expect("tool definitions serialize");
    len(&tools)
}

fn tools_of(mode: ToolsMode) -> &'static [Tool] {
    fn build(mode: ToolsMode) -> Vec<Tool> {
        tools::listed(mode)
            .iter()
            .map(|t| {
                Tool::new(t.name, tools::description(t), object(t.input.clone()))
                    .with_raw_output_schema(object(tools::output_schema()))
            })
            .collect()
    }
    static FULL: std::sync::LazyLock<Vec<Tool>> =
        std::sync::LazyLock::new(|| build(ToolsMode::Full));
    static COMPACT: std::sync::LazyLock<Vec<Tool>> =
        std::sync::LazyLock::new(|| build(ToolsMode::Compact));
    match mode {
        ToolsMode::Full => &FULL,
        ToolsMode::Compact => &COMPACT,
    }
}

/// A short text rendering beside the structured content, for hosts that show only text.
fn render(resp: &Response) -> String {
    match (&resp.result, &resp.refusal) {
        (_, Some(r)) => {
            let mut s = format!("error[{}]: {}", r.code, r.message);
            if let Some(h) = &r.hint {
                s.push_str(&format!("\nhint: {h}"));
            }
            if !r.detail.is_null() {
                s.push_str(&format!("\ndetail: {}", r.detail));
            }
            s
        }
        (Some(v), None) => v.to_string(),
        (None, None) => "{}".into(),
    }
}

impl RoomMcp {
    pub fn new(backend: Arc<dyn Backend>, mode: ToolsMode, fallback_conversation: String) -> Self {
        RoomMcp {
            backend,
            mode,
            fallback_conversation,
        }
    }
}

impl ServerHandler for RoomMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("room", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Room coordinates agents. Read a room with room_sync and confirm each page's receipt before acting in it; \
                 refusals carry a stable code and, for room_sync_required, the next page to read.",
            )
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tool_list(self.mode)))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools_of(self.mode).iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(def) = tools::listed(self.mode)
            .iter()
            .find(|t| t.name == request.name.as_ref())
        else {
            return Err(McpError::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            ));
        };
        let parts = context.extensions.get::<::http::request::Parts>();
        let bearer = parts.and_then(|p| http::bearer_token(&p.headers));
        let session = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(|s| format!("mcp-session:{s}"));
        let meta: serde_json::Map<String, Value> = context
            .meta
            .iter()
            .filter(|(k, _)| !k.starts_with("io.modelcontextprotocol/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let req = Request {
            op: def.op.to_string(),
            token: None,
            conversation: Some(session.unwrap_or_else(|| self.fallback_conversation.clone())),
            tier: None,
            args: Value::Object(match def.name {
                "room" => tools::multiplexer_args(request.arguments.unwrap_or_default()),
                _ => request.arguments.unwrap_or_default(),
            }),
            meta: if meta.is_empty() {
                None
            } else {
                Some(Value::Object(meta))
            },
        };
        let backend = self.backend.clone();
        let resp = tokio::task::spawn_blocking(move || backend.call(req, bearer))
            .await
            .map_err(|e| McpError::internal_error(format!("tool call failed: {e}"), None))?;
        let text = render(&resp);
        let result = match (resp.result, resp.refusal) {
            (_, Some(r)) => {
                let mut out = CallToolResult::error(vec![ContentBlock::text(text)]);
                out.structured_content = Some(json!({"refusal": r}));
                out
            }
            (v, None) => {
                let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
                out.structured_content = Some(v.unwrap_or_else(|| json!({})));
                out
            }
        };
        Ok(result.into())
    }
}

/// Serve `handler` on this process's stdin/stdout until the host closes them.
pub async fn serve_stdio(handler: RoomMcp) -> Result<(), crate::ServerError> {
    use rmcp::ServiceExt;
    let mcp = |e: &dyn std::fmt::Display| crate::ServerError::Mcp(e.to_string());
    handler
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| mcp(&e))?
        .waiting()
        .await
        .map_err(|e| mcp(&e))?;
    Ok(())
}
