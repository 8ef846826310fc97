//! Room's scripted ACP agent (`room agent-acp --mode MODE`): the agent side of the Agent
//! Client Protocol (the `agent-client-protocol` crate, protocol v1), acting one fixed way on
//! every prompt, so that what the `acp` adapter proves can be shown on any machine with no
//! model and nothing installed (`room prove` 04-C09). The modes are the proof ladder's rungs:
//!
//! - `reply`: an update in its session, then the wake's work (the caller's `on_wake`: Room's
//!   scripted agent reading and replying through the launch's broker), then `end_turn`;
//! - `silent`: an update, then `end_turn` without a reply (the body saw it, nobody answered);
//! - `wrong_body`: an update under another session's id, then `end_turn` (a wrong body);
//! - `hang`: an update, then nothing until `session/cancel`, answered `cancelled`.
//!
//! A `session/cancel` ends the prompt in flight in its session (`reply` too: its work is
//! left to the job's stop), answered `cancelled`.
//!
//! It offers no `session/load` and keeps nothing: each launch is a new session.

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Implementation,
    InitializeRequest, InitializeResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, SessionId, SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// How the scripted agent answers a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Reply,
    Silent,
    WrongBody,
    Hang,
}

impl Mode {
    pub const NAMES: [&'static str; 4] = ["reply", "silent", "wrong_body", "hang"];

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "reply" => Some(Mode::Reply),
            "silent" => Some(Mode::Silent),
            "wrong_body" => Some(Mode::WrongBody),
            "hang" => Some(Mode::Hang),
            _ => None,
        }
    }
}

/// The wake's work, given the wake (the JSON block of the prompt Room sends): run on a
/// blocking thread.
pub type OnWake = Arc<dyn Fn(Value) -> Result<(), String> + Send + Sync>;

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // a handler that panicked leaves a map that is still a map
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn chunk(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
        text,
    ))))
}

/// The wake a prompt carries: its last text block that parses as a JSON object.
fn wake_of(prompt: &[ContentBlock]) -> Value {
    prompt
        .iter()
        .rev()
        .filter_map(|b| match b {
            ContentBlock::Text(t) => serde_json::from_str::<Value>(&t.text).ok(),
            _ => None,
        })
        .find(Value::is_object)
        .unwrap_or(Value::Null)
}

/// Serve one client on `from_client`/`to_client` until it closes.
pub async fn serve<R, W>(
    from_client: R,
    to_client: W,
    mode: Mode,
    on_wake: OnWake,
) -> agent_client_protocol::Result<()>
where
    R: tokio::io::AsyncRead + Send + 'static,
    W: tokio::io::AsyncWrite + Send + 'static,
{
    let transport = ByteStreams::new(to_client.compat_write(), from_client.compat());
    // each prompt in flight, by session: its cancel is that session's alone, and one that
    // arrives with no prompt in flight cancels nothing later
    let in_flight: Arc<Mutex<BTreeMap<String, watch::Sender<bool>>>> = Arc::default();
    let on_cancel = in_flight.clone();
    let sessions = Arc::new(AtomicU64::new(0));
    Agent
        .v1()
        .name("room-agent-acp")
        .on_receive_request(
            async move |req: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(req.protocol_version)
                        .agent_capabilities(AgentCapabilities::new())
                        .agent_info(Implementation::new(
                            "room-agent-acp",
                            env!("CARGO_PKG_VERSION"),
                        )),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_req: NewSessionRequest, responder, _cx| {
                let n = sessions.fetch_add(1, Ordering::Relaxed) + 1;
                let id = format!("room-script-{}-{n}", std::process::id());
                responder.respond(NewSessionResponse::new(SessionId::new(id)))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |n: CancelNotification, _cx| {
                if let Some(tx) = locked(&on_cancel).get(n.session_id.0.as_ref()) {
                    let _ = tx.send(true);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |req: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let session = req.session_id.clone();
                if mode == Mode::WrongBody {
                    let other = SessionId::new(format!("{}-elsewhere", session.0));
                    cx.send_notification(SessionNotification::new(other, chunk("not me")))?;
                    return responder.respond(PromptResponse::new(StopReason::EndTurn));
                }
                let key = session.0.to_string();
                cx.send_notification(SessionNotification::new(session, chunk("reading")))?;
                let (tx, mut cancel) = watch::channel(false);
                locked(&in_flight).insert(key.clone(), tx);
                let (in_flight, on_wake) = (in_flight.clone(), on_wake.clone());
                let wake = wake_of(&req.prompt);
                cx.spawn(async move {
                    let cancelled = cancel.wait_for(|c| *c);
                    let reason = match mode {
                        Mode::Hang => {
                            let _ = cancelled.await;
                            StopReason::Cancelled
                        }
                        Mode::Reply => {
                            let work = tokio::task::spawn_blocking(move || on_wake(wake));
                            tokio::select! {
                                done = work => match done {
                                    Ok(Ok(())) => StopReason::EndTurn,
                                    Ok(Err(e)) => {
                                        eprintln!("room-agent-acp: the wake's work: {e}");
                                        StopReason::Refusal
                                    }
                                    Err(e) => {
                                        eprintln!("room-agent-acp: the wake's work panicked: {e}");
                                        StopReason::Refusal
                                    }
                                },
                                _ = cancelled => StopReason::Cancelled,
                            }
                        }
                        Mode::Silent | Mode::WrongBody => StopReason::EndTurn,
                    };
                    locked(&in_flight).remove(&key);
                    responder.respond(PromptResponse::new(reason))
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(transport)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wake_is_the_prompt_s_json_block() {
        let blocks = vec![
            ContentBlock::Text(TextContent::new("Room woke you.")),
            ContentBlock::Text(TextContent::new(r#"{"room":"r","obligation_ids":["o"]}"#)),
        ];
        assert_eq!(wake_of(&blocks)["room"], "r");
        assert_eq!(wake_of(&blocks[..1]), Value::Null);
        for name in Mode::NAMES {
            assert!(Mode::parse(name).is_some(), "{name}");
        }
        assert_eq!(Mode::parse("nope"), None);
    }
}
