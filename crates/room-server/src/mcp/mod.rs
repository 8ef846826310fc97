//! MCP for agent hosts: one handler, two transports. Over streamable HTTP it runs inside the
//! daemon and calls the engine directly with the bearer credential of each request; over stdio
//! (`room mcp`) it runs in a bridge process and forwards each call to the daemon's socket with
//! `ROOM_TOKEN`. Either way a tool call is one daemon operation under the same authorization,
//! and the native conversation comes from request metadata, never from tool arguments.

pub mod features;
pub mod http;
pub mod tools;

use crate::dispatch::{self, Transport};
use crate::wire::{Request, Response};
use features::SessionState;
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    CompletionInfo, ContentBlock, GetPromptRequestParams, GetPromptResponse, Implementation,
    JsonObject, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Reference, ResourceUpdatedNotificationParam, ServerCapabilities,
    ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use room_core::Refusal;
use room_engine::Engine;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
pub use tools::ToolsMode;

/// Where tool calls go.
pub trait Backend: Send + Sync + 'static {
    /// Run one daemon operation (blocking).
    fn call(&self, req: Request, bearer: Option<String>) -> Response;
    /// A signal that fires when a room may have moved; `None` where there is none (a bridge,
    /// whose subscribed sessions then look every `BRIDGE_POLL_MS`).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// The engine itself, where calls can wait in a busy room without holding a thread.
    fn engine(&self) -> Option<Arc<Engine>> {
        None
    }
}

/// Inside the daemon: straight to the engine.
pub struct InProcess(pub Arc<Engine>);

impl Backend for InProcess {
    fn call(&self, req: Request, bearer: Option<String>) -> Response {
        dispatch::handle(&self.0, Transport::Http, req, bearer)
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(dispatch::changes().subscribe())
    }

    fn engine(&self) -> Option<Arc<Engine>> {
        Some(self.0.clone())
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
    /// Subscriptions, log level and the peer to notify (one per MCP session).
    session: Arc<SessionState>,
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
/// figure docs/guide.md gives.
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

/// The blackboard's tool definitions (built once), listed per caller.
fn blackboard_tools() -> &'static [Tool] {
    static TOOLS: std::sync::LazyLock<Vec<Tool>> = std::sync::LazyLock::new(|| {
        tools::blackboard()
            .iter()
            .map(|t| {
                Tool::new(t.name, tools::description(t), object(t.input.clone()))
                    .with_raw_output_schema(object(tools::output_schema()))
            })
            .collect()
    });
    &TOOLS
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

/// The page ceiling of an MCP call. A tool result carries its page twice (hosts such as Claude
/// Code read only the text, and a tool with an output schema must fill `structuredContent`), and
/// the text escapes every quote: 10 KiB pages keep the whole result, JSON-RPC envelope included,
/// within 24 KiB.
pub const MCP_PAGE_BYTES_MAX: u32 = 10 * 1024;

/// A short text rendering beside the structured content, for hosts that show only text.
pub(crate) fn render(resp: &Response) -> String {
    match (&resp.result, &resp.refusal) {
        (_, Some(r)) => {
            let mut s = format!("error[{}]: {}", r.code, r.message);
            if let Some(h) = &r.hint {
                s.push_str(&format!("\nhint: {h}"));
            }
            if !r.detail.is_null() {
                let detail =
                    serde_json::to_string(&r.detail_view()).expect("a refusal's detail serializes");
                s.push_str(&format!("\ndetail: {detail}"));
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
            session: Arc::new(SessionState::default()),
        }
    }

    /// A daemon request for `op` as this session's caller: the bearer of the HTTP request,
    /// the conversation of the MCP session (or the host's `_meta`).
    fn request(
        &self,
        op: &str,
        args: Value,
        context: &RequestContext<RoleServer>,
    ) -> (Request, Option<String>) {
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
            op: op.to_string(),
            token: None,
            conversation: Some(session.unwrap_or_else(|| self.fallback_conversation.clone())),
            tier: None,
            args,
            meta: if meta.is_empty() {
                None
            } else {
                Some(Value::Object(meta))
            },
            page_bytes_max: Some(MCP_PAGE_BYTES_MAX),
        };
        (req, bearer)
    }

    /// Run one daemon operation off the async runtime.
    async fn run(&self, req: Request, bearer: Option<String>) -> Result<Response, McpError> {
        if let Some(engine) = self.backend.engine() {
            return Ok(dispatch::handle_async(engine, Transport::Http, req, bearer).await);
        }
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || backend.call(req, bearer))
            .await
            .map_err(|e| McpError::internal_error(format!("daemon call failed: {e}"), None))
    }

    /// A daemon answer for a request that is not a tool call: its result, or its refusal as a
    /// JSON-RPC error carrying the refusal (logged to the session like a tool's).
    async fn answer(&self, what: &str, resp: Response) -> Result<Value, McpError> {
        match (resp.result, resp.refusal) {
            (_, Some(r)) => {
                let level = features::refusal_level(r.code.as_str());
                features::log(&self.session, level, features::refusal_record(what, &r)).await;
                Err(McpError::invalid_request(
                    format!("error[{}]: {}", r.code, r.message),
                    Some(json!({"refusal": r})),
                ))
            }
            (v, None) => Ok(v.unwrap_or_else(|| json!({}))),
        }
    }

    /// The caller's rooms with their tips (the daemon's `list`).
    async fn listing(&self, req: Request, bearer: Option<String>) -> Result<Value, McpError> {
        let resp = self.run(req, bearer).await?;
        self.answer("resources/list", resp).await
    }

    /// Watch the subscribed rooms and notify the client when one moves, until the session
    /// ends or nothing is subscribed any more.
    fn start_watcher(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut changes = this.backend.changes();
            let poll = std::time::Duration::from_millis(if changes.is_some() {
                features::SAFETY_POLL_MS
            } else {
                features::BRIDGE_POLL_MS
            });
            loop {
                match &mut changes {
                    Some(rx) => {
                        let _ = tokio::time::timeout(poll, rx.changed()).await;
                    }
                    None => tokio::time::sleep(poll).await,
                }
                let Some((peer, bearer, conversation)) = this.watched() else {
                    return;
                };
                let mut req = Request::new("list", json!({}));
                req.conversation = conversation;
                let Ok(listing) = this.listing(req, bearer).await else {
                    continue;
                };
                for uri in this.moved(&listing) {
                    let _ = peer
                        .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                        .await;
                }
                if this.rooms_moved(&listing) {
                    let _ = peer.notify_resource_list_changed().await;
                }
            }
        });
    }

    /// What the watcher calls with, or `None` (and the watcher stops) once the session closed
    /// or holds no subscription.
    fn watched(&self) -> Option<(rmcp::Peer<RoleServer>, Option<String>, Option<String>)> {
        let mut g = self.session.lock();
        match &g.peer {
            Some(p) if (!g.subs.is_empty() || g.lists.is_some()) && !p.is_transport_closed() => {
                Some((p.clone(), g.bearer.clone(), g.conversation.clone()))
            }
            _ => {
                g.watching = false;
                None
            }
        }
    }

    /// Whether the caller's rooms (its resources) changed since last seen (and now seen).
    fn rooms_moved(&self, me: &Value) -> bool {
        let mut g = self.session.lock();
        let Some(seen) = g.lists.as_mut() else {
            return false;
        };
        let now = features::Lists::of(me);
        let moved = now != *seen;
        *seen = now;
        moved
    }

    /// The subscribed rooms whose tip moved since last seen (and now seen).
    fn moved(&self, listing: &Value) -> Vec<String> {
        let mut g = self.session.lock();
        let mut moved = Vec::new();
        for r in listing["rooms"].as_array().into_iter().flatten() {
            let (Some(room), Some(seq)) = (r["room"].as_str(), r["tip_seq"].as_u64()) else {
                continue;
            };
            let uri = features::uri_of(room);
            if let Some(seen) = g.subs.get_mut(&uri)
                && *seen != seq
            {
                *seen = seq;
                moved.push(uri);
            }
        }
        moved
    }
}

impl ServerHandler for RoomMcp {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_logging()
            .enable_completions()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("room", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Room coordinates agents. Read a room with room_sync and confirm each page's receipt before acting in it; \
                 refusals carry a stable code and, for room_sync_required, the next page to read.",
            )
    }

    /// A session that can carry notifications (stdio, or a streamable HTTP session) is told
    /// when its resource list (its rooms) changes. (Its tool list changes only when its scopes
    /// do, which no session of a running agent sees happen: no `tools` `listChanged`.)
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let parts = context.extensions.get::<::http::request::Parts>();
        let bearer = parts.and_then(|p| http::bearer_token(&p.headers));
        let session = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(|s| format!("mcp-session:{s}"));
        // over HTTP without a session there is no stream to notify on
        if parts.is_some() && session.is_none() {
            return;
        }
        let conversation = Some(session.unwrap_or_else(|| self.fallback_conversation.clone()));
        let mut req = Request::new("list", json!({}));
        req.conversation = conversation.clone();
        let Ok(me) = self.listing(req, bearer.clone()).await else {
            return;
        };
        let start = {
            let mut g = self.session.lock();
            g.lists = Some(features::Lists::of(&me));
            if g.peer.is_none() {
                g.peer = Some(context.peer.clone());
                g.bearer = bearer;
                g.conversation = conversation;
            }
            !std::mem::replace(&mut g.watching, true)
        };
        if start {
            self.start_watcher();
        }
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = tool_list(self.mode);
        // the blackboard's tools go to the principals whose scopes allow them: who the caller
        // is, the daemon says (a caller it cannot identify is listed the rest, and its calls
        // are refused there)
        let (req, bearer) = self.request("whoami", json!({}), &context);
        if let Ok(resp) = self.run(req, bearer).await
            && let Some(me) = resp.result
            && let Some(scopes) = me["scopes"].as_array()
        {
            let scopes: Vec<String> = scopes
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect();
            tools.extend(
                blackboard_tools()
                    .iter()
                    .filter(|t| tools::blackboard_allowed(&t.name, Some(&scopes)))
                    .cloned(),
            );
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(features::prompts()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        Ok(features::prompt(&request.name, request.arguments.as_ref())?.into())
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            features::room_template(),
        ]))
    }

    /// Completions for the prompts' arguments and the room template's `room`: room names
    /// the caller is a member of; task ids its queued wakes name. What the caller may not
    /// see is never offered (the daemon answers as the caller).
    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let what = match (&request.r#ref, request.argument.name.as_str()) {
            (Reference::Prompt(p), arg) if features::prompt_argument(&p.name) == Some(arg) => {
                arg.to_string()
            }
            (Reference::Resource(r), "room") if r.uri == features::ROOM_TEMPLATE => "room".into(),
            _ => return Ok(CompleteResult::new(CompletionInfo::default())),
        };
        let prefix = request.argument.value.as_str();
        // past the daemon's bound on task ids the total is not known, only that there are more
        let mut more = false;
        let mut values: Vec<String> = if what == "task" {
            // the tasks of the caller's rooms, by the prefix typed so far
            let (req, bearer) = self.request("task_ids", json!({"prefix": prefix}), &context);
            let ids = self.run(req, bearer).await?.result.unwrap_or(Value::Null);
            more = ids["more"] == true;
            ids["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        } else {
            let (req, bearer) = self.request("list", json!({}), &context);
            let listing = self.listing(req, bearer).await?;
            listing["rooms"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["room"].as_str().map(String::from))
                .collect()
        };
        values.retain(|v| v.starts_with(prefix));
        values.sort();
        values.dedup();
        let total = values.len();
        values.truncate(CompletionInfo::MAX_VALUES);
        let info = CompletionInfo::with_pagination(
            values,
            (!more).then(|| u32::try_from(total).unwrap_or(u32::MAX)),
            more || total > CompletionInfo::MAX_VALUES,
        )
        .map_err(|e| McpError::internal_error(e, None))?;
        Ok(CompleteResult::new(info))
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let (req, bearer) = self.request("list", json!({}), &context);
        let listing = self.listing(req, bearer).await?;
        let resources = listing["rooms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(features::resource)
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let room = features::room_of(&request.uri)?;
        let (req, bearer) = self.request("sync", json!({"room": room}), &context);
        let resp = self.run(req, bearer).await?;
        let page = self.answer("resources/read", resp).await?;
        Ok(ReadResourceResult::new(vec![features::contents(&request.uri, &page)]).into())
    }

    /// 2026-07-28's `subscriptions/listen`: room resources (at most `SUBSCRIPTIONS_MAX`, each
    /// a well-formed `room://` URI; membership is checked when the stream starts) and the
    /// resource list. Tools and prompts never change for a session (see `on_initialized`).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.resources_list_changed = requested.resources_list_changed;
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|u| features::room_of(u).is_ok())
                .take(features::SUBSCRIPTIONS_MAX)
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    /// One `subscriptions/listen` stream: a subscribed room that moves is announced, and so is
    /// a change of the caller's rooms, until the client cancels. A subscribed room the caller
    /// is not a member of ends the stream with an error naming it.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let (req, bearer) = self.request("list", json!({}), context.request_context());
        let conversation = req.conversation.clone();
        let listing = self.listing(req, bearer.clone()).await?;
        let tip_of = |listing: &Value, room: &str| {
            listing["rooms"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["room"] == room)
                .and_then(|r| r["tip_seq"].as_u64())
        };
        let mut tips = BTreeMap::new();
        for uri in context.accepted().resource_subscriptions.iter().flatten() {
            let room = features::room_of(uri)?;
            let tip = tip_of(&listing, room).ok_or_else(|| {
                McpError::resource_not_found(format!("{uri}: not a room you are a member of"), None)
            })?;
            tips.insert(uri.clone(), tip);
        }
        let lists = context.accepted().resources_list_changed == Some(true);
        let mut rooms = features::Lists::of(&listing);
        let mut changes = self.backend.changes();
        let poll = std::time::Duration::from_millis(if changes.is_some() {
            features::SAFETY_POLL_MS
        } else {
            features::BRIDGE_POLL_MS
        });
        loop {
            let moved = async {
                match &mut changes {
                    Some(rx) => {
                        let _ = tokio::time::timeout(poll, rx.changed()).await;
                    }
                    None => tokio::time::sleep(poll).await,
                }
            };
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                _ = moved => {}
            }
            let mut req = Request::new("list", json!({}));
            req.conversation = conversation.clone();
            let Ok(listing) = self.listing(req, bearer.clone()).await else {
                continue;
            };
            for (uri, seen) in tips.iter_mut() {
                let now = features::room_of(uri)
                    .ok()
                    .and_then(|room| tip_of(&listing, room));
                if let Some(now) = now
                    && now != *seen
                {
                    *seen = now;
                    if context
                        .sink()
                        .notify_resource_updated(uri.clone())
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                }
            }
            let now = features::Lists::of(&listing);
            if lists && now != rooms {
                rooms = now;
                if context.sink().notify_resource_list_changed().await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let room = features::room_of(&request.uri)?.to_string();
        let (req, bearer) = self.request("list", json!({}), &context);
        let conversation = req.conversation.clone();
        let listing = self.listing(req, bearer.clone()).await?;
        let seq = listing["rooms"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["room"] == room.as_str())
            .map(|r| r["tip_seq"].as_u64().unwrap_or(0))
            .ok_or_else(|| {
                McpError::resource_not_found(
                    format!("{}: not a room you are a member of", request.uri),
                    None,
                )
            })?;
        let start = {
            let mut g = self.session.lock();
            if !g.subs.contains_key(&request.uri) && g.subs.len() >= features::SUBSCRIPTIONS_MAX {
                return Err(McpError::invalid_params(
                    format!(
                        "at most {} subscriptions per session",
                        features::SUBSCRIPTIONS_MAX
                    ),
                    None,
                ));
            }
            g.subs.insert(request.uri.clone(), seq);
            g.peer = Some(context.peer.clone());
            g.bearer = bearer;
            g.conversation = conversation;
            !std::mem::replace(&mut g.watching, true)
        };
        if start {
            self.start_watcher();
        }
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        features::room_of(&request.uri)?;
        self.session.lock().subs.remove(&request.uri);
        Ok(())
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let mut g = self.session.lock();
        g.log_level = Some(request.level);
        g.peer = Some(context.peer.clone());
        Ok(())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools_of(self.mode)
            .iter()
            .chain(blackboard_tools())
            .find(|t| t.name == name)
            .cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        static BLACKBOARD: std::sync::LazyLock<Vec<tools::ToolDef>> =
            std::sync::LazyLock::new(tools::blackboard);
        let Some(def) = tools::listed(self.mode)
            .iter()
            .chain(BLACKBOARD.iter())
            .find(|t| t.name == request.name.as_ref())
        else {
            return Err(McpError::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            ));
        };
        let args = Value::Object(match def.name {
            "room" => tools::multiplexer_args(request.arguments.unwrap_or_default()),
            _ => request.arguments.unwrap_or_default(),
        });
        let (req, bearer) = self.request(def.op, args.clone(), &context);
        // task_delegate is task_create under a parent: without one it would make a top-level
        // task the caller did not ask for
        let resp =
            if def.name == "task_delegate" && !args.get("parent").is_some_and(Value::is_string) {
                Response::refused(Refusal::invalid(
                    "parent",
                    "task_delegate names the task it delegates from (or use task_create)",
                ))
            } else {
                self.run(req, bearer).await?
            };
        if let Some(r) = &resp.refusal {
            self.session
                .lock()
                .peer
                .get_or_insert_with(|| context.peer.clone());
            let level = features::refusal_level(r.code.as_str());
            let record = features::refusal_record(def.name, r);
            // 2026-07-28: a request opts in to its own log with `_meta`'s log level
            if let Some(min) = context.meta.log_level() {
                features::log_to(&context.peer, min, level, record.clone()).await;
            }
            features::log(&self.session, level, record).await;
        }
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
