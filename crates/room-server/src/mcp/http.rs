//! Streamable HTTP: `/mcp` (every tool) and `/mcp-compact` on the daemon's loopback listener.
//! rmcp serves the protocol; the edge layer in front of it ([`edge`]) does what rmcp leaves to
//! the host application or does in a way some clients cannot take:
//!
//! - admits only a current agent credential (`Authorization: Bearer`, the scheme in any case);
//!   anything else is a bare 401;
//! - reads the whole body (at most [`REQUEST_BYTES_MAX`]) before any answer, so an early 401,
//!   406 or 415 leaves a kept-alive connection usable; a body over the limit is 413 with
//!   `Connection: close`;
//! - answers a body that is not JSON with a JSON-RPC parse error (-32700) and a batch or a JSON
//!   value that is no JSON-RPC message with an invalid request (-32600), both HTTP 400;
//! - drops the SSE priming event (an event with empty `data`) from streams of sessions that
//!   negotiated a version older than 2025-11-25, which had none: clients of those versions parse
//!   every event as JSON (Gemini CLI drops the server on it);
//! - answers a session DELETE 200 rather than 202, as the SDK clients expect;
//! - holds each agent to its `mcp_sessions` quota: an `initialize` past it is refused
//!   `quota_exceeded` (HTTP 429), and a session idle for [`SESSION_IDLE`] is closed here, so
//!   that abandoned sessions neither count nor keep their memory.

use super::{InProcess, RoomMcp, ToolsMode};
use crate::wire::REQUEST_BYTES_MAX;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use room_engine::Engine;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A session no request has used for this long is closed (rmcp's own idle timeout ends its
/// worker but keeps its handle until a DELETE).
pub const SESSION_IDLE: Duration = Duration::from_secs(300);

/// One agent's sessions: session id → (which manager, last used).
type HeldSessions = HashMap<String, (usize, Instant)>;

/// The sessions each agent holds, for the `mcp_sessions` quota.
pub struct Sessions {
    /// `/mcp`'s and `/mcp-compact`'s session managers.
    managers: [Arc<LocalSessionManager>; 2],
    /// Per agent: session id → (which manager, last used).
    held: Mutex<HashMap<String, HeldSessions>>,
}

impl Sessions {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, HeldSessions>> {
        self.held
            .lock()
            .expect("sessions lock is never poisoned: no panics while held")
    }

    fn touch(&self, agent: &str, session: &str) {
        if let Some(s) = self.held().get_mut(agent).and_then(|m| m.get_mut(session)) {
            s.1 = Instant::now();
        }
    }

    fn record(&self, agent: &str, session: String, manager: usize) {
        self.held()
            .entry(agent.to_string())
            .or_default()
            .insert(session, (manager, Instant::now()));
    }

    /// How many sessions `agent` holds now, after dropping those its manager no longer has and
    /// closing those idle past [`SESSION_IDLE`].
    async fn count(&self, agent: &str) -> usize {
        let mine: Vec<(String, usize, Instant)> = self
            .held()
            .get(agent)
            .map(|m| m.iter().map(|(k, (i, t))| (k.clone(), *i, *t)).collect())
            .unwrap_or_default();
        let mut gone = Vec::new();
        for (sid, i, last) in mine {
            let manager = &self.managers[i];
            let present = manager.sessions.read().await.contains_key(sid.as_str());
            if !present {
                gone.push(sid);
            } else if last.elapsed() >= SESSION_IDLE {
                use rmcp::transport::streamable_http_server::SessionManager;
                if let Err(e) = manager.close_session(&sid.as_str().into()).await {
                    tracing::debug!("closing idle MCP session {sid}: {e}");
                }
                gone.push(sid);
            }
        }
        let mut held = self.held();
        let Some(m) = held.get_mut(agent) else {
            return 0;
        };
        for sid in gone {
            m.remove(&sid);
        }
        m.len()
    }
}

/// The first protocol version whose SSE streams open with a priming event.
pub const PRIMING_SINCE: &str = "2025-11-25";

/// The protocol versions this server negotiates in `initialize` that predate priming (a
/// client asking for any other version is answered with a version that has it).
const UNPRIMED_VERSIONS: [&str; 3] = ["2024-11-05", "2025-03-26", "2025-06-18"];

/// The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 9110 §11.1).
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

/// The MCP routes of the daemon's HTTP listener on `port`.
pub fn routes(engine: Arc<Engine>, port: u16) -> Router {
    let managers = [
        Arc::new(LocalSessionManager::default()),
        Arc::new(LocalSessionManager::default()),
    ];
    let mcp = |mode: ToolsMode, manager: Arc<LocalSessionManager>| {
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts([format!("localhost:{port}"), format!("127.0.0.1:{port}")])
            .with_allowed_origins([
                format!("http://localhost:{port}"),
                format!("http://127.0.0.1:{port}"),
            ])
            .enforce_origin_validation()
            // a tool call has one result and Room sends no progress in between: answer it
            // as plain JSON rather than as an SSE stream (rmcp falls back to SSE on its own
            // if a handler ever emits something first)
            .with_json_response(true)
            .with_max_request_body_bytes(REQUEST_BYTES_MAX);
        let engine = engine.clone();
        StreamableHttpService::new(
            move || {
                Ok(RoomMcp::new(
                    Arc::new(InProcess(engine.clone())),
                    mode,
                    "mcp".into(),
                ))
            },
            manager,
            config,
        )
    };
    let state = Edge {
        engine: engine.clone(),
        sessions: Arc::new(Sessions {
            managers: managers.clone(),
            held: Mutex::new(HashMap::new()),
        }),
    };
    let [full, compact] = managers;
    Router::new()
        .nest_service("/mcp", mcp(ToolsMode::Full, full))
        .nest_service("/mcp-compact", mcp(ToolsMode::Compact, compact))
        .layer(axum::middleware::from_fn_with_state(state, edge))
}

/// What the edge layer holds.
#[derive(Clone)]
pub struct Edge {
    engine: Arc<Engine>,
    sessions: Arc<Sessions>,
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
    )
        .into_response()
}

/// A JSON-RPC error answered with HTTP 400 (`id` null: the request's id is unknown or absent).
fn jsonrpc_error(code: i64, message: &str, id: Value) -> Response {
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            .to_string(),
    )
        .into_response()
}

/// An `initialize` past the agent's `mcp_sessions` quota: HTTP 429 with a JSON-RPC error that
/// carries the refusal, as every other refusal names its code.
fn session_quota_refused(agent: &str, held: u64, limit: u64, message: Option<&Value>) -> Response {
    let refusal = room_core::Refusal::new(
        room_core::Code::QuotaExceeded,
        format!("quota mcp_sessions reached: {agent} holds {held} of {limit} MCP sessions"),
    )
    .detail(json!({"quota": "mcp_sessions", "limit": limit, "used": held, "requested": 1}))
    .hint("close a session (HTTP DELETE with its Mcp-Session-Id), or ask the owner to raise [quotas] in config.toml");
    let id = message
        .and_then(|m| m.get("id"))
        .filter(|id| id.is_string() || id.is_number())
        .cloned()
        .unwrap_or(Value::Null);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": refusal.message, "data": {"refusal": refusal}}})
            .to_string(),
    )
        .into_response()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .is_some_and(|v| v.eq_ignore_ascii_case("application/json"))
}

/// Whether the streams of this request may open with a priming event: the protocol version it
/// was negotiated under (an `initialize`'s requested version as the server answers it, else the
/// `MCP-Protocol-Version` header, whose absence means 2025-03-26) is 2025-11-25 or later.
fn primes(headers: &HeaderMap, body: Option<&Value>) -> bool {
    if let Some(b) = body
        && b.get("method").and_then(Value::as_str) == Some("initialize")
    {
        let asked = b.pointer("/params/protocolVersion").and_then(Value::as_str);
        return !asked.is_some_and(|v| UNPRIMED_VERSIONS.contains(&v));
    }
    headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() >= PRIMING_SINCE)
}

/// An SSE frame that is a whole event whose data is empty: rmcp's priming event.
fn is_priming_event(frame: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(frame) else {
        return false;
    };
    let Some(body) = text.strip_suffix("\n\n") else {
        return false;
    };
    let mut data_lines = 0;
    for line in body.split('\n') {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        match field {
            "data" => {
                if !value.trim_start_matches(' ').is_empty() {
                    return false;
                }
                data_lines += 1;
            }
            "id" | "retry" | "event" => {}
            _ => return false,
        }
    }
    data_lines > 0
}

fn strip_priming(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let body = body.map_frame(|frame| {
        frame.map_data(|data| {
            if is_priming_event(&data) {
                Bytes::new()
            } else {
                data
            }
        })
    });
    Response::from_parts(parts, Body::new(body))
}

/// The layer in front of rmcp (see the module's documentation).
pub async fn edge(
    State(edge): State<Edge>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Edge { engine, sessions } = edge;
    let (parts, body) = req.into_parts();
    // the whole body first, so that no answer leaves unread bytes on a kept connection
    let bytes = match axum::body::to_bytes(body, REQUEST_BYTES_MAX).await {
        Ok(b) => b,
        Err(_) => {
            let mut r = (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over {REQUEST_BYTES_MAX} bytes"),
            )
                .into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
    let Some(token) = bearer_token(&parts.headers) else {
        return unauthorized();
    };
    let token_held = token.clone();
    // inline when control.db is free (a cache lookup); on a thread when a commit holds it
    let agent = match engine.try_authenticate(&token) {
        Some(r) => r.ok().map(|a| a.name),
        None => {
            let engine = engine.clone();
            tokio::task::spawn_blocking(move || engine.authenticate(&token).ok().map(|a| a.name))
                .await
                .unwrap_or(None)
        }
    };
    let Some(agent) = agent else {
        return unauthorized();
    };
    // a running launch's credential works only through its own broker: no session here
    if token_held.starts_with(room_engine::dispatch::WORKER_TOKEN_PREFIX) {
        let engine = engine.clone();
        let admitted = tokio::task::spawn_blocking(move || {
            engine.credential_admits(&token_held, room_engine::CredentialVia::Elsewhere)
        })
        .await;
        if let Ok(Err(r)) = admitted {
            return (
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, "application/json")],
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001,
                    "message": r.message, "data": {"code": r.code.as_str(), "detail": r.detail}}})
                .to_string(),
            )
                .into_response();
        }
    }
    let post_json = parts.method == Method::POST && is_json(&parts.headers);
    let mut message = None;
    if post_json {
        match serde_json::from_slice::<Value>(&bytes) {
            Err(_) => {
                return jsonrpc_error(-32700, "Parse error: the body is not JSON", Value::Null);
            }
            Ok(Value::Array(_)) => {
                return jsonrpc_error(
                    -32600,
                    "Invalid Request: JSON-RPC batches are not supported; send one message per request",
                    Value::Null,
                );
            }
            Ok(v) => message = Some(v),
        }
    }
    let primed = primes(&parts.headers, message.as_ref());
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    let method = message
        .as_ref()
        .and_then(|m| m.get("method"))
        .and_then(Value::as_str)
        .unwrap_or("-");
    tracing::debug!(
        http = %parts.method,
        method,
        version = header("mcp-protocol-version"),
        session = header("mcp-session-id"),
        primed,
        "mcp request"
    );
    let manager = usize::from(parts.uri.path().starts_with("/mcp-compact"));
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let opens = method == "initialize" && session.is_none();
    match &session {
        Some(sid) => sessions.touch(&agent, sid),
        None if opens => {
            let limit = engine.policy().quotas.mcp_sessions;
            let held = sessions.count(&agent).await as u64;
            if held >= limit {
                return session_quota_refused(&agent, held, limit, message.as_ref());
            }
        }
        None => {}
    }
    let is_delete = parts.method == Method::DELETE;
    let resp = next
        .run(axum::extract::Request::from_parts(parts, Body::from(bytes)))
        .await;
    if post_json && resp.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        // JSON, but not a JSON-RPC message rmcp could read
        let id = message
            .as_ref()
            .and_then(|m| m.get("id"))
            .filter(|id| id.is_string() || id.is_number())
            .cloned()
            .unwrap_or(Value::Null);
        return jsonrpc_error(
            -32600,
            "Invalid Request: not a JSON-RPC request, notification or response",
            id,
        );
    }
    if opens
        && let Some(sid) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        sessions.record(&agent, sid.to_string(), manager);
    }
    if is_delete && resp.status() == StatusCode::ACCEPTED {
        let (mut parts, _) = resp.into_parts();
        parts.status = StatusCode::OK;
        return Response::from_parts(parts, Body::empty());
    }
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if sse && !primed {
        return strip_priming(resp);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            bearer_token(&m)
        };
        for v in [
            "Bearer t",
            "bearer t",
            "BEARER t",
            "bEaReR   t ",
            "Bearer\tt",
        ] {
            assert_eq!(h(v).as_deref(), Some("t"), "{v}");
        }
        for v in ["Basic t", "Bearer", "Bearer   ", "Bearert", "t"] {
            assert_eq!(h(v), None, "{v}");
        }
    }

    #[test]
    fn priming_is_an_event_with_empty_data() {
        assert!(is_priming_event(b"data: \nid: 0\nretry: 3000\n\n"));
        assert!(is_priming_event(b"data:\nid: 0/1\n\n"));
        assert!(!is_priming_event(b"data: {}\nid: 0\n\n"));
        assert!(!is_priming_event(b"retry: 3000\n\n"));
        assert!(!is_priming_event(b": keep-alive\n\n"));
        assert!(!is_priming_event(b"data: \n"));
    }

    #[test]
    fn versions_before_2025_11_25_are_not_primed() {
        let init = |v: &str| json!({"method": "initialize", "params": {"protocolVersion": v}});
        let none = HeaderMap::new();
        for v in UNPRIMED_VERSIONS {
            assert!(!primes(&none, Some(&init(v))), "{v}");
        }
        for v in ["2025-11-25", "2026-07-28", "1999-01-01"] {
            assert!(primes(&none, Some(&init(v))), "{v}");
        }
        assert!(!primes(&none, None), "no header: 2025-03-26");
        let mut h = HeaderMap::new();
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-06-18"),
        );
        assert!(!primes(&h, None));
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-11-25"),
        );
        assert!(primes(&h, None));
    }
}
