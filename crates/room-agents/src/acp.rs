//! `acp`: Room as an Agent Client Protocol client (the `agent-client-protocol` crate, protocol
//! v1). One launch is one turn: `initialize`, an `authenticate` where the route's preset needs
//! one, `session/new` with Room's own MCP server in `mcpServers` (so the agent calls back
//! into Room under the launch's one-launch credential), or `session/load` of the session the
//! route is bound to (never a new one beside it: `spawn_policy = "never"`), `session/prompt`
//! with the wake, and at the deadline `session/cancel` with a short grace for the agent to end
//! its turn. Updates a loaded session replays before the prompt are counted apart: they prove
//! nothing about the wake.
//!
//! Outside a wake, [`list`] asks an agent for its own sessions (`session/list`, the session
//! factory's `list`), when its `initialize` offers it.
//!
//! What the agent proved is reported, never inferred: the session it bound, the updates that
//! came from that session and from any other (a wrong body), and how its turn ended. The
//! engine turns that into a rung of the proof ladder; a reply is proven only by Room's own
//! journal. Permission requests are answered by the route's policy.

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthenticateRequest, CancelNotification, ContentBlock, EnvVariable, InitializeRequest,
    ListSessionsRequest, LoadSessionRequest, McpServer, McpServerStdio, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionId, SessionNotification,
    SessionUpdate, TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// How long an agent has to end its turn after `session/cancel`.
pub const CANCEL_GRACE_MS: u64 = 2_000;
/// Sessions whose updates are counted one by one; beyond this they count as one "other".
const SESSIONS_SEEN_MAX: usize = 16;
/// Bytes of any text the agent chose (its name, an error, a session id) kept in a report.
const AGENT_TEXT_BYTES_MAX: usize = 512;

/// An MCP server the agent is to start over stdio (Room's own: `room mcp`).
#[derive(Debug, Clone)]
pub struct StdioServer {
    pub name: String,
    pub command: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How the agent's permission requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permissions {
    /// Pick the agent's own "reject" option (or cancel the request when it offers none).
    Reject,
    /// Pick "allow once" (never "allow always": a wake grants nothing beyond itself).
    AllowOnce,
}

/// What a known agent needs beyond its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// Environment names passed through when the daemon has them.
    pub env_pass: &'static [&'static str],
    /// Settings the agent must have to work unattended.
    pub env_set: &'static [(&'static str, &'static str)],
    /// An `authenticate` method to call before `session/new`.
    pub authenticate: Option<&'static str>,
}

/// The presets a route may name (checked facts: INTEROP.md, "ACP agents").
pub const PRESETS: [Preset; 3] = [
    Preset {
        name: "claude",
        env_pass: &[
            "PATH",
            "HOME",
            "ANTHROPIC_API_KEY",
            "CLAUDE_CODE_OAUTH_TOKEN",
        ],
        // as root, claude-agent-acp refuses `session/new` without it
        env_set: &[("IS_SANDBOX", "1")],
        authenticate: None,
    },
    Preset {
        name: "codex",
        env_pass: &["PATH", "HOME", "CODEX_API_KEY", "OPENAI_API_KEY"],
        env_set: &[],
        // codex-acp refuses `session/new` until authenticated
        authenticate: Some("codex-api-key"),
    },
    Preset {
        name: "gemini",
        env_pass: &["PATH", "HOME", "GEMINI_API_KEY"],
        // in a folder it does not trust, Gemini CLI silently starts no MCP server
        env_set: &[("GEMINI_CLI_TRUST_WORKSPACE", "true")],
        authenticate: None,
    },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// One turn to run.
#[derive(Debug, Clone)]
pub struct Turn {
    pub cwd: PathBuf,
    pub mcp_servers: Vec<StdioServer>,
    /// The prompt's text blocks, in order.
    pub prompt: Vec<String>,
    pub authenticate: Option<String>,
    /// The native session to load instead of opening a new one.
    pub resume: Option<String>,
    pub permissions: Permissions,
    /// The tool kinds (ACP's `ToolKind` names, [`TOOL_KINDS`]) an `AllowOnce` may allow: a
    /// request for a tool of another kind is rejected. None: any kind.
    pub tool_kinds: Option<Vec<String>>,
    /// The time the whole exchange may take before `session/cancel` is sent.
    pub turn_ms: u64,
    /// The time after `session/cancel` for the agent to end its turn.
    pub cancel_grace_ms: u64,
}

/// What the agent showed, as seen on the wire.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The agent's name from `initialize`.
    pub agent: Option<String>,
    /// Whether it offers `session/load` (a session that may be resumed later).
    pub load_session: bool,
    /// The session the turn ran in (`session/new`'s, or the one loaded).
    pub session: Option<String>,
    /// The session was loaded (`session/load`), not opened.
    pub loaded: bool,
    /// Updates before the prompt (a loaded session's history): no proof of anything.
    pub replayed_updates: u64,
    pub prompt_sent: bool,
    /// `session/update`s from the bound session.
    pub updates_bound: u64,
    /// `session/update`s from any other session: a wrong body, refused.
    pub updates_foreign: u64,
    pub permission_requests: u64,
    /// The requests rejected because the tool's kind was not allowed, by kind.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub permissions_denied: BTreeMap<String, u64>,
    /// How the turn ended (`end_turn`, `cancelled`, `refusal`, …); none when it never did.
    pub stop_reason: Option<String>,
    pub cancel_sent: bool,
    pub timed_out: bool,
    pub error: Option<String>,
    /// What the agent said in its own words in the bound session over the turn (its message
    /// chunks, cut at `api::SAID_BYTES_MAX`): what a caller compares with what the turn did.
    /// Not part of the recorded report.
    #[serde(skip)]
    pub said: String,
    /// What the turn cost, if the agent reported it (`usage_update`); none: not reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// What the report proves about delivery, in the ladder's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Proven {
    /// Nothing shows the bound session took the prompt.
    Nothing,
    /// The bound session took it (an update, or a cancelled turn) without finishing.
    Delivered,
    /// The bound session finished its turn on it.
    TurnEnded,
    /// Another session spoke: no credit for anyone.
    WrongBody,
}

impl Report {
    pub fn proven(&self) -> Proven {
        if self.updates_foreign > 0 {
            return Proven::WrongBody;
        }
        match self.stop_reason.as_deref() {
            Some("cancelled") => Proven::Delivered,
            Some(_) => Proven::TurnEnded,
            None if self.updates_bound > 0 => Proven::Delivered,
            None => Proven::Nothing,
        }
    }
}

/// What the handlers share: updates by session (the bound one is known only once
/// `session/new` answers, and updates may race that answer) and permission requests.
#[derive(Default)]
struct Seen {
    updates: BTreeMap<String, u64>,
    others: u64,
    permission_requests: u64,
    permissions_denied: BTreeMap<String, u64>,
    /// Set just before the prompt is sent: updates before it are replays.
    prompting: bool,
    replayed: u64,
    /// The session's cumulative cost the agent last reported (`usage_update`), per session:
    /// before the prompt (a loaded session's history) and since.
    cost_before: BTreeMap<String, (f64, String)>,
    cost_after: BTreeMap<String, (f64, String)>,
    /// The agent's own words in each session since the prompt (its message chunks' text),
    /// and the message id of the last chunk (a new message starts a new line).
    said: BTreeMap<String, (String, Option<String>)>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // a handler that panicked leaves counts that are still counts
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run one turn with the agent on the other end of `to_agent`/`from_agent`. Never longer
/// than `turn_ms + cancel_grace_ms`; the caller then ends the agent's processes.
pub async fn run<W, R>(to_agent: W, from_agent: R, turn: Turn) -> Report
where
    W: tokio::io::AsyncWrite + Send + 'static,
    R: tokio::io::AsyncRead + Send + 'static,
{
    let seen = Arc::new(Mutex::new(Seen::default()));
    let report = Arc::new(Mutex::new(Report::default()));
    let limit = Duration::from_millis(turn.turn_ms.saturating_add(turn.cancel_grace_ms));
    let transport = ByteStreams::new(to_agent.compat_write(), from_agent.compat());
    let out = tokio::time::timeout(
        limit,
        connect(transport, turn, seen.clone(), report.clone()),
    )
    .await;
    let mut r = locked(&report).clone();
    match out {
        Ok(Ok(())) => {}
        Ok(Err(e)) => r.error = Some(crate::api::clip(&e.to_string(), AGENT_TEXT_BYTES_MAX)),
        Err(_) => {
            r.timed_out = true;
            r.error
                .get_or_insert_with(|| "the agent did not answer in time".into());
        }
    }
    let seen = locked(&seen);
    r.permission_requests = seen.permission_requests;
    r.permissions_denied = seen.permissions_denied.clone();
    r.replayed_updates = seen.replayed;
    for (session, n) in &seen.updates {
        if r.session.as_deref() == Some(session.as_str()) {
            r.updates_bound += n;
        } else {
            r.updates_foreign += n;
        }
    }
    r.updates_foreign += seen.others;
    if let Some(session) = &r.session {
        r.said = seen
            .said
            .get(session)
            .map(|(t, _)| t.clone())
            .unwrap_or_default();
    }
    // this turn's cost: the bound session's cumulative cost after the prompt, less what it
    // stood at before (a new session starts at nothing; a loaded one that reported nothing
    // before leaves this turn's share unknown)
    if let Some(session) = r.session.clone()
        && let Some((after, currency)) = seen.cost_after.get(&session)
    {
        let before = match seen.cost_before.get(&session) {
            Some((b, c)) if c == currency => Some(*b),
            Some(_) => None,
            None if !r.loaded => Some(0.0),
            None => None,
        };
        if let Some(b) = before
            && *after >= b
            && after.is_finite()
        {
            r.cost = Some(Cost {
                amount: after - b,
                currency: crate::api::clip(currency, 16),
            });
        }
    }
    r
}

/// What a turn cost, as the agent reported it (`usage_update`'s cumulative cost, this turn's
/// share): an amount in its unit (an ISO 4217 currency, or another unit such as credits).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cost {
    pub amount: f64,
    pub currency: String,
}

async fn connect(
    transport: impl agent_client_protocol::ConnectTo<Client> + 'static,
    turn: Turn,
    seen: Arc<Mutex<Seen>>,
    report: Arc<Mutex<Report>>,
) -> agent_client_protocol::Result<()> {
    let (on_update, on_permission, prompting) = (seen.clone(), seen.clone(), seen);
    let permissions = turn.permissions;
    let kinds = turn.tool_kinds.clone();
    Client
        .v1()
        .name("room")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                let mut s = locked(&on_update);
                let key = n.session_id.0.to_string();
                if let SessionUpdate::UsageUpdate(u) = &n.update
                    && let Some(c) = &u.cost
                {
                    let to = if s.prompting {
                        &mut s.cost_after
                    } else {
                        &mut s.cost_before
                    };
                    if to.len() < SESSIONS_SEEN_MAX || to.contains_key(&key) {
                        to.insert(key.clone(), (c.amount, c.currency.clone()));
                    }
                }
                if !s.prompting {
                    s.replayed += 1;
                    return Ok(());
                }
                if let SessionUpdate::AgentMessageChunk(chunk) = &n.update
                    && let ContentBlock::Text(t) = &chunk.content
                    && (s.said.contains_key(&key) || s.said.len() < SESSIONS_SEEN_MAX)
                {
                    let (said, last) = s.said.entry(key.clone()).or_default();
                    let id = chunk.message_id.as_ref().map(|m| m.0.to_string());
                    // chunks of one message run on; another message is another line
                    if !said.is_empty() && *last != id {
                        said.push('\n');
                    }
                    *last = id;
                    if said.len() < crate::api::SAID_BYTES_MAX {
                        let room = crate::api::SAID_BYTES_MAX - said.len();
                        said.push_str(&crate::api::clip(&t.text, room));
                    }
                }
                if let Some(c) = s.updates.get_mut(&key) {
                    *c += 1;
                } else if s.updates.len() < SESSIONS_SEEN_MAX {
                    s.updates.insert(key, 1);
                } else {
                    s.others += 1;
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |req: RequestPermissionRequest, responder, _cx| {
                let kind = tool_kind(&req);
                let p = match &kinds {
                    Some(k) if !k.contains(&kind) => Permissions::Reject,
                    _ => permissions,
                };
                {
                    let mut seen = locked(&on_permission);
                    seen.permission_requests += 1;
                    if p != permissions {
                        *seen.permissions_denied.entry(kind).or_default() += 1;
                    }
                }
                responder.respond(answer(&req, p))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            drive(cx, turn, report, prompting).await
        })
        .await
}

/// The kinds of tool an agent may ask to run, as ACP names them (`ToolKind`).
pub const TOOL_KINDS: [&str; 10] = [
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
];

/// The kind of tool a permission request is for; `other` when the agent names none.
fn tool_kind(req: &RequestPermissionRequest) -> String {
    req.tool_call
        .fields
        .kind
        .as_ref()
        .and_then(|k| serde_json::to_value(k).ok())
        .and_then(|v| v.as_str().map(String::from))
        .filter(|k| TOOL_KINDS.contains(&k.as_str()))
        .unwrap_or_else(|| "other".into())
}

/// The route's answer to a permission request: the agent's own option of the wanted kind.
fn answer(req: &RequestPermissionRequest, p: Permissions) -> RequestPermissionResponse {
    let kinds: &[PermissionOptionKind] = match p {
        Permissions::Reject => &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ],
        Permissions::AllowOnce => &[PermissionOptionKind::AllowOnce],
    };
    let chosen = kinds.iter().find_map(|k| {
        req.options
            .iter()
            .find(|o| o.kind == *k)
            .map(|o| o.option_id.clone())
    });
    RequestPermissionResponse::new(match chosen {
        Some(id) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)),
        None => RequestPermissionOutcome::Cancelled,
    })
}

async fn drive(
    cx: ConnectionTo<Agent>,
    turn: Turn,
    report: Arc<Mutex<Report>>,
    seen: Arc<Mutex<Seen>>,
) -> agent_client_protocol::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(turn.turn_ms);
    let init = cx
        .send_request(InitializeRequest::new(ProtocolVersion::V1))
        .block_task()
        .await?;
    {
        let mut r = locked(&report);
        r.agent = init
            .agent_info
            .map(|i| crate::api::clip(&i.name, AGENT_TEXT_BYTES_MAX));
        r.load_session = init.agent_capabilities.load_session;
    }
    if let Some(m) = &turn.authenticate {
        cx.send_request(AuthenticateRequest::new(m.clone()))
            .block_task()
            .await?;
    }
    let servers: Vec<McpServer> = turn.mcp_servers.iter().map(stdio_server).collect();
    let session = match &turn.resume {
        Some(id) => {
            if !init.agent_capabilities.load_session {
                // a new session beside the bound one is what spawn_policy "never" forbids
                locked(&report).error = Some(format!(
                    "the agent offers no session/load, so its bound session {id} cannot be resumed"
                ));
                return Ok(());
            }
            let sid = SessionId::new(id.as_str());
            cx.send_request(LoadSessionRequest::new(sid.clone(), &turn.cwd).mcp_servers(servers))
                .block_task()
                .await?;
            locked(&report).loaded = true;
            sid
        }
        None => {
            cx.send_request(NewSessionRequest::new(&turn.cwd).mcp_servers(servers))
                .block_task()
                .await?
                .session_id
        }
    };
    locked(&report).session = Some(session.0.to_string());
    let blocks = turn
        .prompt
        .iter()
        .map(|t| ContentBlock::Text(TextContent::new(t.clone())))
        .collect();
    locked(&seen).prompting = true;
    let prompt = cx
        .send_request(PromptRequest::new(session.clone(), blocks))
        .block_task();
    locked(&report).prompt_sent = true;
    tokio::pin!(prompt);
    let answered = tokio::select! {
        r = &mut prompt => Some(r?),
        _ = tokio::time::sleep_until(deadline) => None,
    };
    let response = match answered {
        Some(r) => r,
        None => {
            cx.send_notification(CancelNotification::new(session))?;
            {
                let mut r = locked(&report);
                r.cancel_sent = true;
                r.timed_out = true;
            }
            let grace = Duration::from_millis(turn.cancel_grace_ms);
            match tokio::time::timeout(grace, prompt).await {
                Ok(r) => r?,
                Err(_) => return Ok(()),
            }
        }
    };
    let reason = serde_json::to_value(response.stop_reason)
        .ok()
        .and_then(|v| v.as_str().map(String::from));
    locked(&report).stop_reason = reason;
    Ok(())
}

fn stdio_server(s: &StdioServer) -> McpServer {
    let env = s
        .env
        .iter()
        .map(|(k, v)| EnvVariable::new(k.clone(), v.clone()))
        .collect();
    McpServer::Stdio(
        McpServerStdio::new(s.name.clone(), s.command.clone())
            .args(s.args.clone())
            .env(env),
    )
}

/// What `session/list` may bring back at most: pages followed, and sessions kept.
pub const LIST_PAGES_MAX: usize = 16;
pub const LIST_SESSIONS_MAX: usize = 1_000;

/// One `session/list` exchange: which sessions to ask for, and how long it may take.
#[derive(Debug, Clone)]
pub struct ListAsk {
    /// Only the sessions of this working directory (absolute), or all the agent lists.
    pub cwd: Option<PathBuf>,
    pub authenticate: Option<String>,
    pub deadline_ms: u64,
}

/// A session as the agent listed it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Listed {
    pub session: String,
    pub cwd: String,
    pub title: Option<String>,
    pub updated_at: Option<String>,
}

/// What the agent answered to `session/list`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Listing {
    /// The agent's name from `initialize`.
    pub agent: Option<String>,
    /// Whether `initialize` offered `session/list` (`sessionCapabilities.list`); without it
    /// nothing is asked.
    pub offered: bool,
    pub sessions: Vec<Listed>,
    /// The agent had more than [`LIST_SESSIONS_MAX`] sessions or [`LIST_PAGES_MAX`] pages:
    /// the rest was not read.
    pub truncated: bool,
    pub pages: usize,
    pub error: Option<String>,
}

/// Ask the agent on the other end for its own sessions (`initialize`, then `session/list`
/// page by page when it offers it). Never longer than `ask.deadline_ms`; the caller then
/// ends the agent's processes.
pub async fn list<W, R>(to_agent: W, from_agent: R, ask: ListAsk) -> Listing
where
    W: tokio::io::AsyncWrite + Send + 'static,
    R: tokio::io::AsyncRead + Send + 'static,
{
    let listing = Arc::new(Mutex::new(Listing::default()));
    let transport = ByteStreams::new(to_agent.compat_write(), from_agent.compat());
    let limit = Duration::from_millis(ask.deadline_ms);
    let out = {
        let listing = listing.clone();
        tokio::time::timeout(
            limit,
            Client
                .v1()
                .name("room")
                .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                    list_pages(cx, ask, listing).await
                }),
        )
        .await
    };
    let mut l = locked(&listing).clone();
    match out {
        Ok(Ok(())) => {}
        Ok(Err(e)) => l.error = Some(crate::api::clip(&e.to_string(), AGENT_TEXT_BYTES_MAX)),
        Err(_) => {
            l.error
                .get_or_insert_with(|| "the agent did not answer in time".into());
        }
    }
    l
}

async fn list_pages(
    cx: ConnectionTo<Agent>,
    ask: ListAsk,
    listing: Arc<Mutex<Listing>>,
) -> agent_client_protocol::Result<()> {
    let init = cx
        .send_request(InitializeRequest::new(ProtocolVersion::V1))
        .block_task()
        .await?;
    let offered = init.agent_capabilities.session_capabilities.list.is_some();
    {
        let mut l = locked(&listing);
        l.agent = init
            .agent_info
            .map(|i| crate::api::clip(&i.name, AGENT_TEXT_BYTES_MAX));
        l.offered = offered;
    }
    if !offered {
        return Ok(());
    }
    if let Some(m) = &ask.authenticate {
        cx.send_request(AuthenticateRequest::new(m.clone()))
            .block_task()
            .await?;
    }
    let mut cursor: Option<String> = None;
    for _ in 0..LIST_PAGES_MAX {
        let page = cx
            .send_request(
                ListSessionsRequest::new()
                    .cwd(ask.cwd.clone())
                    .cursor(cursor.clone()),
            )
            .block_task()
            .await?;
        let mut l = locked(&listing);
        l.pages += 1;
        for s in page.sessions {
            if l.sessions.len() == LIST_SESSIONS_MAX {
                l.truncated = true;
                return Ok(());
            }
            l.sessions.push(Listed {
                session: crate::api::clip(&s.session_id.0, AGENT_TEXT_BYTES_MAX),
                cwd: crate::api::clip(&s.cwd.display().to_string(), AGENT_TEXT_BYTES_MAX),
                title: s.title.map(|t| crate::api::clip(&t, AGENT_TEXT_BYTES_MAX)),
                updated_at: s.updated_at.map(|t| crate::api::clip(&t, 64)),
            });
        }
        // a cursor that does not move would loop; an absent one ends the listing
        match page.next_cursor {
            Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
            Some(_) => return Ok(()),
            None => return Ok(()),
        }
    }
    locked(&listing).truncated = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{
        PermissionOption, ToolCallUpdate, ToolCallUpdateFields,
    };

    fn request(kinds: &[(&str, PermissionOptionKind)]) -> RequestPermissionRequest {
        let options = kinds
            .iter()
            .map(|(id, k)| PermissionOption::new(id.to_string(), id.to_string(), *k))
            .collect();
        RequestPermissionRequest::new(
            "s1",
            ToolCallUpdate::new("t1", ToolCallUpdateFields::default()),
            options,
        )
    }

    fn chosen(r: RequestPermissionResponse) -> Option<String> {
        match r.outcome {
            RequestPermissionOutcome::Selected(s) => Some(s.option_id.0.to_string()),
            _ => None,
        }
    }

    #[test]
    fn permission_requests_get_the_route_s_answer_and_never_allow_always() {
        use PermissionOptionKind::*;
        let all = request(&[
            ("yes-always", AllowAlways),
            ("yes", AllowOnce),
            ("no", RejectOnce),
            ("never", RejectAlways),
        ]);
        assert_eq!(
            chosen(answer(&all, Permissions::Reject)).as_deref(),
            Some("no")
        );
        assert_eq!(
            chosen(answer(&all, Permissions::AllowOnce)).as_deref(),
            Some("yes")
        );
        assert_eq!(tool_kind(&all), "other", "a request naming no kind");
        let mut edit = all.clone();
        edit.tool_call.fields.kind = Some(agent_client_protocol::v1::schema::ToolKind::Edit);
        assert_eq!(tool_kind(&edit), "edit");
        // only "allow always" on offer: a wake grants nothing beyond itself, so cancel
        let always = request(&[("yes-always", AllowAlways)]);
        assert_eq!(chosen(answer(&always, Permissions::AllowOnce)), None);
        assert_eq!(chosen(answer(&always, Permissions::Reject)), None);
    }
}
