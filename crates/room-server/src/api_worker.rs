//! The `openai` and `anthropic` adapters' worker: an API model has no process, so its launch
//! runs in the daemon as a task. Its tools are Room's MCP tools (`mcp::tools`, the full set), each run
//! through `dispatch::handle` with the launch's one-launch credential, so the model reads and
//! replies as the recipient, in the launch's conversation, under the same gate, tier and
//! redaction as any MCP host; a refusal goes back to the model as the tool's result.

use crate::dispatch::{self, Transport};
use crate::mcp::tools::{self, ToolsMode};
use crate::wire::Request;
use room_agents::api::{self, Dialect, ToolHost, ToolOutcome, ToolSpec};
use room_engine::Engine;
use room_engine::dispatch::{Delivery, Exit, Launch};
use serde_json::{Value, json};
use std::sync::Arc;

/// What the model is told before the wake.
const SYSTEM: &str = "You are an agent in Room, a coordination plane shared with other agents. \
You were woken because work is addressed to you. Use the tools: catch up with room_sync (confirm \
each page's receipt), then answer each obligation of the wake with room_reply (reply_to: its id). \
A refusal comes back as the tool's result with its code and a hint; act on it. End your turn \
with a short summary and no tool call.";

/// Room's tools, run as the launch's recipient.
struct LaunchTools {
    engine: Arc<Engine>,
    token: String,
    /// The blackboard's tools the recipient's scopes allow (none for a root).
    blackboard: Vec<tools::ToolDef>,
}

impl LaunchTools {
    fn defs(&self) -> impl Iterator<Item = &tools::ToolDef> {
        tools::listed(ToolsMode::Full)
            .iter()
            .chain(self.blackboard.iter())
    }
}

/// The blackboard's tools `token`'s holder is listed, by its scopes (as an MCP session is).
fn blackboard_for(engine: &Arc<Engine>, token: &str) -> Vec<tools::ToolDef> {
    let req = Request {
        op: "whoami".into(),
        token: Some(token.into()),
        conversation: None,
        tier: None,
        args: json!({}),
        meta: None,
        page_bytes_max: None,
    };
    let me = dispatch::handle(engine, Transport::Daemon, req, None).result;
    let scopes: Option<Vec<String>> = me
        .and_then(|v| serde_json::from_value(v["scopes"].clone()).ok())
        .flatten();
    tools::blackboard()
        .into_iter()
        .filter(|t| tools::blackboard_allowed(t.name, scopes.as_deref()))
        .collect()
}

impl ToolHost for LaunchTools {
    fn tools(&self) -> Vec<ToolSpec> {
        self.defs()
            .map(|d| ToolSpec {
                name: d.name.to_string(),
                description: d.description.to_string(),
                parameters: d.input.clone(),
            })
            .collect()
    }

    async fn call(&self, name: &str, args: Value) -> ToolOutcome {
        let Some(def) = self.defs().find(|d| d.name == name) else {
            return ToolOutcome {
                text: format!("unknown tool {name:?}"),
                is_error: true,
            };
        };
        let args = match (def.name, args) {
            ("room", Value::Object(m)) => Value::Object(tools::multiplexer_args(m)),
            (_, a) => a,
        };
        let req = Request {
            op: def.op.to_string(),
            token: Some(self.token.clone()),
            conversation: None,
            tier: None,
            args,
            meta: None,
            page_bytes_max: None,
        };
        let engine = self.engine.clone();
        match tokio::task::spawn_blocking(move || {
            dispatch::handle(&engine, Transport::Daemon, req, None)
        })
        .await
        {
            Ok(resp) => ToolOutcome {
                text: crate::mcp::render(&resp),
                is_error: resp.refusal.is_some(),
            },
            Err(e) => ToolOutcome {
                text: format!("the tool call failed: {e}"),
                is_error: true,
            },
        }
    }
}

/// One launch of an `openai` or `anthropic` route, claimed with no pid: it runs in the
/// daemon, and no stop by pid may ever aim at the daemon itself.
pub(crate) async fn run(engine: &Arc<Engine>, l: &Launch) -> Result<Exit, String> {
    let claimed = {
        let engine = engine.clone();
        let id = l.id.clone();
        tokio::task::spawn_blocking(move || engine.launch_started(&id, None))
            .await
            .map_err(|e| e.to_string())?
    };
    claimed.map_err(|r| r.to_string())?;
    let r = &l.route;
    let dialect = match r.adapter.as_str() {
        "anthropic" => Dialect::Anthropic,
        _ => Dialect::OpenAi,
    };
    let default_url = match dialect {
        Dialect::Anthropic => api::ANTHROPIC_BASE_URL,
        Dialect::OpenAi => "",
    };
    let turn = api::Turn {
        dialect,
        base_url: r.base_url.clone().unwrap_or_else(|| default_url.into()),
        model: r.model.clone().unwrap_or_default(),
        api_key: r.api_key_env.as_deref().and_then(|k| std::env::var(k).ok()),
        system: SYSTEM.into(),
        prompt: format!(
            "{}\n\nThe wake, as JSON:\n{}",
            l.prompt["prompt"].as_str().unwrap_or(""),
            l.prompt
        ),
        rounds_max: r.rounds_max.unwrap_or(api::ROUNDS_DEFAULT),
        max_tokens: r.max_tokens,
        deadline_ms: crate::workers::time_left_ms(l),
    };
    let http = api::client()?;
    let host = LaunchTools {
        engine: engine.clone(),
        token: l.token.clone(),
        blackboard: {
            let (engine, token) = (engine.clone(), l.token.clone());
            tokio::task::spawn_blocking(move || blackboard_for(&engine, &token))
                .await
                .unwrap_or_default()
        },
    };
    let report = api::run(&http, &host, turn).await;
    // the model's own words, for an orchestrator's turn to be checked against its dispatches
    crate::collab::steer::turn_said(&l.token, &report.said);
    if let Some(e) = &report.error {
        tracing::warn!(launch = %l.id, adapter = %r.adapter, "api turn: {e}");
    }
    Ok(Exit {
        code: None,
        timed_out: report.timed_out,
        delivery: match report.proven() {
            api::Proven::Nothing => Delivery::Dispatched,
            api::Proven::Delivered => Delivery::DeliveredToBody,
            api::Proven::TurnEnded => Delivery::BodyVisible,
        },
        detail: serde_json::to_value(&report).expect("reports serialize"),
        // no process: nothing to stop
        job: json!({"kind": "in_daemon", "confirmed_empty": true}),
        // an API conversation lives only as long as its launch: no native session to keep
        session: None,
    })
}
