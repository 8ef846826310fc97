//! `room connect HOST AGENT`: enroll the agent (or rotate it, when it exists: tokens are never
//! stored, so reuse means a new token) and print the exact configuration for that host, for stdio
//! (`room mcp`) and for streamable HTTP on the daemon's loopback listener.

use serde_json::{Value, json};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Host {
    ClaudeCode,
    Codex,
    Gemini,
    Generic,
}

impl Host {
    pub fn kind(self) -> &'static str {
        match self {
            Host::ClaudeCode => "claude-code",
            Host::Codex => "codex",
            Host::Gemini => "gemini",
            Host::Generic => "generic",
        }
    }
}

/// The snippets for one host. `http` is the daemon's HTTP address when it listens on one.
pub fn snippets(
    host: Host,
    token: &str,
    state: &Path,
    room_bin: &str,
    http: Option<&str>,
) -> Value {
    let state = state.display().to_string();
    let url = http
        .map(|a| format!("http://{a}/mcp"))
        .unwrap_or_else(|| "http://127.0.0.1:PORT/mcp".into());
    let env = json!({"ROOM_TOKEN": token, "ROOM_STATE_DIR": state});
    let (stdio, http_cfg, file) = match host {
        Host::ClaudeCode => (
            format!(
                "claude mcp add room --scope user -e ROOM_TOKEN={token} -e ROOM_STATE_DIR={state} -- {room_bin} mcp\n\
                 # or in .mcp.json:\n{}",
                serde_json::to_string_pretty(&json!({"mcpServers": {"room": {"command": room_bin, "args": ["mcp"], "env": env}}})).expect("json")
            ),
            serde_json::to_string_pretty(&json!({"mcpServers": {"room": {"type": "http", "url": url, "headers": {"Authorization": format!("Bearer {token}")}}}})).expect("json"),
            ".mcp.json (project) or `claude mcp add`",
        ),
        Host::Codex => (
            format!("[mcp_servers.room]\ncommand = \"{room_bin}\"\nargs = [\"mcp\"]\nenv = {{ ROOM_TOKEN = \"{token}\", ROOM_STATE_DIR = \"{state}\" }}\n"),
            format!("[mcp_servers.room]\nurl = \"{url}\"\nbearer_token_env_var = \"ROOM_TOKEN\"\n# and export ROOM_TOKEN={token} where codex runs\n"),
            "~/.codex/config.toml",
        ),
        Host::Gemini => (
            serde_json::to_string_pretty(&json!({"mcpServers": {"room": {"command": room_bin, "args": ["mcp"], "env": env}}})).expect("json"),
            serde_json::to_string_pretty(&json!({"mcpServers": {"room": {"type": "http", "url": url, "headers": {"Authorization": format!("Bearer {token}")}}}})).expect("json"),
            "~/.gemini/settings.json",
        ),
        Host::Generic => (
            serde_json::to_string_pretty(&json!({"command": room_bin, "args": ["mcp"], "env": env})).expect("json"),
            serde_json::to_string_pretty(&json!({"url": url, "headers": {"Authorization": format!("Bearer {token}")}})).expect("json"),
            "your host's MCP server configuration",
        ),
    };
    // Gemini CLI starts no MCP server at all in a folder it does not trust, and says nothing
    let note = match host {
        Host::Gemini => json!(
            "Gemini CLI starts MCP servers only in a trusted folder and says nothing otherwise: trust the \
             folder when Gemini asks (or with /permissions, which writes ~/.gemini/trustedFolders.json); \
             headless and ACP runs (gemini --acp) take GEMINI_CLI_TRUST_WORKSPACE=true"
        ),
        _ => Value::Null,
    };
    json!({"host": host.kind(), "file": file, "stdio": stdio, "http": http_cfg, "note": note,
        "http_note": if http.is_some() { Value::Null } else { json!("start the daemon with `room serve --listen 127.0.0.1:PORT` for HTTP") }})
}
