//! A minimal MCP streamable-HTTP client (protocol 2026-07-28) for the swarm load generator.
//!
//! Why not rmcp's client here: the swarm's clients share the machine's two cores with the
//! daemon they measure, and rmcp's client (a service task per connection, a typed model of every
//! message, the whole result parsed twice: text and structured content) took 150–190 µs of CPU a
//! call, about two fifths of the machine. The instrument should not eat what it measures. This
//! client sends byte for byte what rmcp's client sends (the same headers and `_meta`, checked
//! against a capture of rmcp 3.11's requests) and reads only the fields the swarm needs, so the
//! daemon does exactly the same work for it. `room bench swarm --client rmcp` runs the swarm on
//! rmcp's client instead, and the crash test and the Python SDK tests prove the real clients.

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The protocol spoken: the newest, which has no session and carries its metadata per request.
pub const PROTOCOL: &str = "2026-07-28";

/// Largest response body read, as a bound on a misbehaving server (a sync page is ≤ 24 KiB and
/// travels twice, as text and as structured content).
const RESPONSE_BYTES_MAX: usize = 1 << 20;

pub struct McpHttp {
    http: reqwest::Client,
    url: String,
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
    /// Connect and discover: the server must speak [`PROTOCOL`].
    pub async fn connect(http: reqwest::Client, url: &str, token: &str) -> anyhow::Result<Self> {
        let mut c = McpHttp {
            http,
            url: url.to_string(),
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
        let mut req = self
            .http
            .post(&self.url)
            .header(ACCEPT, "application/json, text/event-stream")
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-method", method);
        if let Some(n) = name {
            req = req.header("mcp-name", n);
        }
        let resp = req.body(body).send().await?;
        let status = resp.status();
        let sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = resp.bytes().await?;
        anyhow::ensure!(
            bytes.len() <= RESPONSE_BYTES_MAX,
            "{method}: a response of {} bytes",
            bytes.len()
        );
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
