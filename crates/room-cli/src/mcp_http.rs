//! A minimal MCP streamable-HTTP client (protocol 2026-07-28) for the swarm load generator.
//!
//! Why not rmcp's client here: the swarm's clients share the machine's two cores with the
//! daemon they measure, and rmcp's client (reqwest, a service task per connection, a typed
//! model of every message, the whole result parsed twice: text and structured content) took
//! 150–190 µs of CPU a call, about two fifths of the machine. The instrument should not eat what
//! it measures. This client holds one HTTP/1.1 connection (hyper, no pool), sends what rmcp's
//! client sends (the same headers and `_meta`, checked against a capture of rmcp 3.11's
//! requests) and reads only the fields the swarm needs, so the daemon does exactly the same work
//! for it. `room bench swarm --client rmcp` runs the swarm on rmcp's client instead, and the
//! crash test and the Python SDK tests prove the real clients.

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The protocol spoken: the newest, which has no session and carries its metadata per request.
pub const PROTOCOL: &str = "2026-07-28";

/// Largest response body read, as a bound on a misbehaving server (a sync page is ≤ 24 KiB and
/// travels twice, as text and as structured content).
const RESPONSE_BYTES_MAX: usize = 1 << 20;

pub struct McpHttp {
    conn: SendRequest<Full<Bytes>>,
    path: String,
    host: HeaderValue,
    auth: HeaderValue,
    next_id: u64,
}

#[derive(Deserialize)]
struct Envelope<T> {
    result: Option<T>,
    error: Option<RpcError>,
}

#[derive(Deserialize, Debug)]
struct RpcError {
    code: i64,
    message: String,
}

#[derive(Deserialize)]
struct Discovered {
    #[serde(rename = "supportedVersions")]
    supported_versions: Vec<String>,
}

#[derive(Deserialize)]
struct ToolResult<T> {
    #[serde(rename = "isError", default)]
    is_error: Option<bool>,
    #[serde(rename = "structuredContent")]
    structured: Option<T>,
}

impl McpHttp {
    /// Connect to `url` (`http://host:port/path`) and discover: the server must speak
    /// [`PROTOCOL`].
    pub async fn connect(url: &str, token: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("{url}: only http:// URLs"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let stream = tokio::net::TcpStream::connect(authority).await?;
        // without it a kept connection waits out a delayed ACK on every call
        stream.set_nodelay(true)?;
        let (conn, driver) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(driver);
        let mut c = McpHttp {
            conn,
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
            host: HeaderValue::from_str(authority)?,
            auth: HeaderValue::from_str(&format!("Bearer {token}"))?,
            next_id: 0,
        };
        let d: Discovered = c
            .request("server/discover", None, json!({}))
            .await?
            .ok_or_else(|| anyhow::anyhow!("server/discover: no result"))?;
        anyhow::ensure!(
            d.supported_versions.iter().any(|v| v == PROTOCOL),
            "the server does not speak {PROTOCOL}: {:?}",
            d.supported_versions
        );
        Ok(c)
    }

    /// Call a tool; answers whether the call succeeded and its structured content, read as `T`.
    pub async fn call_tool<T: DeserializeOwned + Default>(
        &mut self,
        name: &str,
        arguments: Value,
    ) -> anyhow::Result<(bool, T)> {
        let r: ToolResult<T> = self
            .request(
                "tools/call",
                Some(name),
                json!({"arguments": arguments, "name": name}),
            )
            .await?
            .ok_or_else(|| anyhow::anyhow!("tools/call {name}: no result"))?;
        Ok((r.is_error != Some(true), r.structured.unwrap_or_default()))
    }

    async fn request<T: DeserializeOwned>(
        &mut self,
        method: &str,
        name: Option<&str>,
        mut params: Value,
    ) -> anyhow::Result<Option<T>> {
        let id = self.next_id;
        self.next_id += 1;
        params["_meta"] = json!({
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "room-bench", "version": env!("CARGO_PKG_VERSION")},
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        });
        let body = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": id, "method": method, "params": params,
        }))?;
        let mut req = hyper::Request::post(self.path.as_str())
            .header(HOST, self.host.clone())
            .header(ACCEPT, "application/json, text/event-stream")
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-method", method);
        if let Some(n) = name {
            req = req.header("mcp-name", n);
        }
        self.conn.ready().await?;
        let resp = self
            .conn
            .send_request(req.body(Full::new(Bytes::from(body)))?)
            .await?;
        let status = resp.status();
        let sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = Limited::new(resp.into_body(), RESPONSE_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("{method}: reading the response: {e}"))?
            .to_bytes();
        anyhow::ensure!(
            status.is_success(),
            "{method}: HTTP {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let json = if sse { sse_data(&bytes)? } else { &bytes[..] };
        let env: Envelope<T> = serde_json::from_slice(json)?;
        if let Some(e) = env.error {
            anyhow::bail!("{method}: error {}: {}", e.code, e.message);
        }
        Ok(env.result)
    }
}

/// The data of the one event a request-scoped stream carries (a server may answer with an SSE
/// stream instead of plain JSON).
fn sse_data(bytes: &[u8]) -> anyhow::Result<&[u8]> {
    for line in bytes.split(|b| *b == b'\n') {
        if let Some(d) = line.strip_prefix(b"data:") {
            let d = d.strip_prefix(b" ").unwrap_or(d);
            let d = d.strip_suffix(b"\r").unwrap_or(d);
            if !d.is_empty() {
                return Ok(d);
            }
        }
    }
    anyhow::bail!("an event stream without data")
}
