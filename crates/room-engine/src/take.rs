//! Session launches: an agent without a route takes a queued permit of its own in its own MCP
//! session (`wake_take`). Nothing is started: the launch is a row with the taker's conversation
//! and no process, and the permit is revalidated exactly as dispatch revalidates it before it
//! is handed over. The launch answers to that conversation only: it ends `replied` when that
//! session's own turns resolve what the permit asked for, `timed_out` at the permit's deadline
//! (queue time counted), and `stopped` when its authority trips as a worker's would; then the
//! agent may take its next permit. One launch per recipient, whichever kind.

use crate::dispatch::{Delivery, Exit, SessionSeen, WORKER_TOKEN_PREFIX, end, judge};
use crate::principal::AgentCaller;
use crate::{Engine, Outcome, store_err};
use room_core::wake::{WakePermit, wake_path};
use room_core::{Code, Refusal, Verb};
use room_store::control::{LaunchRow, WakeRow};
use serde_json::{Value, json};

/// What a session's take names: nothing (its oldest permit that still stands), a room (its
/// oldest there), or one permit by its room and source event.
#[derive(Debug, Clone, Default)]
pub struct TakeArgs {
    pub room: Option<String>,
    pub source_event: Option<String>,
}

/// What a take's result tells the session to do.
const TAKE_ANSWER: &str =
    "room_reply to each obligation_ids entry (or mention) from this session before not_after_ms";

/// Fit a take's result within `budget` bytes: served passages that do not fit, the last
/// first, are withheld from this delivery (`page_budget`, in the order they were cited), so
/// the delivery receipt records only what the session was handed inline; then, if it is still
/// over, the prompt is cut at a character boundary (`prompt_cut: true`; the whole text is the
/// source event's, in the room).
fn fit_evidence(taken: &mut Value, budget: usize) {
    let base = taken["evidence"]["withheld"].as_array().map_or(0, Vec::len);
    while taken.to_string().len() > budget {
        let Some(ev) = taken["evidence"]["served"]
            .as_array_mut()
            .and_then(|s| s.pop())
        else {
            break;
        };
        let withheld = json!({"evidence": ev["evidence"], "reason": "page_budget"});
        // each before the ones moved after it: in the order they were cited
        if let Some(w) = taken["evidence"]["withheld"].as_array_mut() {
            w.insert(base, withheld);
        }
    }
    let over = taken.to_string().len().saturating_sub(budget);
    if over == 0 {
        return;
    }
    let Some(prompt) = taken["prompt"].as_str().map(String::from) else {
        return;
    };
    // the longest start of the prompt whose escaped form is `over` bytes shorter (and the
    // flag's own bytes) than the whole prompt's
    let escaped = |t: &str| Value::String(t.to_string()).to_string().len() - 2;
    let target = escaped(&prompt).saturating_sub(over + r#","prompt_cut":true"#.len());
    let (mut keep, mut used) = (0, 0);
    for c in prompt.chars() {
        let cost = escaped(c.encode_utf8(&mut [0u8; 4]));
        if used + cost > target {
            break;
        }
        used += cost;
        keep += c.len_utf8();
    }
    taken["prompt"] = json!(prompt[..keep]);
    taken["prompt_cut"] = json!(true);
}

/// The proof a take records: the bound session itself asked for the permit and was handed it.
const TAKEN_PROOF: &str = "delivered_to_body";

fn not_takeable(why: String) -> Refusal {
    Refusal::new(Code::WakeNotTakeable, why)
}

impl Engine {
    /// Hand the caller's session one of its queued permits, revalidated now, and open a
    /// session launch for it. `taken: null` when no permit is queued (or none still stands:
    /// `skipped` names each with the code dispatch will dead-letter it with).
    pub fn wake_take(&self, caller: &AgentCaller, a: TakeArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::WakeTake)?;
        if caller.token.starts_with(WORKER_TOKEN_PREFIX) {
            return Err(
                not_takeable("a worker's launch delivers its own wake".into())
                    .hint("room_whoami shows it under wakes.this_launch"),
            );
        }
        if a.source_event.is_some() && a.room.is_none() {
            return Err(Refusal::invalid("room", "source_event needs its room"));
        }
        if let Some(r) = &a.room {
            room_core::name::validate("room", r)?;
            self.member_handle(&p, r)?;
        }
        if self.policy().routes.contains_key(&p.name) {
            return Err(not_takeable(format!(
                "{} has a route: the dispatcher delivers its permits to its worker",
                p.name
            ))
            .hint("the owner's room route remove AGENT leaves its permits to its own session"));
        }
        let _one = self.takes.lock().unwrap_or_else(|e| e.into_inner());
        self.settle_sessions(Some(&p.name))?;
        let live = self.control().launches_of(&p.name, 1).map_err(store_err)?;
        if let Some(l) = live.first().filter(|l| l.state != "ended") {
            return Err(not_takeable(format!(
                "launch {} of {} is live: one launch per recipient",
                l.id, p.name
            ))
            .hint("answer its wake with room_reply from the session that took it, or wait for its deadline"));
        }
        self.flush_wakes();
        let now = self.now_ms();
        let (w, permit, skipped) = match self.take_candidate(&p.name, &a, now)? {
            Pick::One(one, skipped) => (one.0, one.1, skipped),
            Pick::None(skipped) => return Ok(json!({"taken": null, "skipped": skipped})),
        };
        // the take's result is a page the session reads: within the transport's ceiling
        let page_bytes = p.page_bytes_max.map_or(self.config.page_bytes_max, |b| {
            b.clamp(crate::sync::PAGE_BYTES_MIN, self.config.page_bytes_max)
        });
        let around = json!({"taken": null, "skipped": skipped, "answer": TAKE_ANSWER});
        let budget = page_bytes.saturating_sub(around.to_string().len());
        let taken = self.open_session_launch(&w, &permit, &p.conversation, now, budget)?;
        Ok(json!({"taken": taken, "skipped": skipped, "answer": TAKE_ANSWER}))
    }

    /// The permit a take hands over: the named one (refused with its revalidation code when it
    /// no longer stands), or the oldest queued one that stands.
    fn take_candidate(&self, agent: &str, a: &TakeArgs, now: u64) -> Outcome<Pick> {
        if let (Some(room), Some(ev)) = (&a.room, &a.source_event) {
            let w = self.control().wake(room, agent, ev).map_err(store_err)?;
            let w = w.ok_or_else(|| {
                Refusal::new(
                    Code::NotFound,
                    format!("no wake of {agent} for {ev} in room {room}"),
                )
                .hint("room_whoami lists your queued wakes")
            })?;
            if w.state != room_store::control::WAKE_QUEUED {
                return Err(not_takeable(format!(
                    "the wake for {ev} is {}, not queued",
                    w.state
                )));
            }
            let permit = self.revalidate(&w, now)?;
            return Ok(Pick::One(Box::new((w, permit)), vec![]));
        }
        let queued = self
            .control()
            .wakes_queued_of(&[agent.to_string()], crate::wakes::WAKES_OF_AGENT_MAX)
            .map_err(store_err)?;
        let mut skipped = Vec::new();
        for w in queued {
            if a.room.as_ref().is_some_and(|r| *r != w.room) {
                continue;
            }
            match self.revalidate(&w, now) {
                Ok(permit) => return Ok(Pick::One(Box::new((w, permit)), skipped)),
                Err(r) => skipped.push(json!({
                    "path": wake_path(&w.room, &w.agent, &w.source_event),
                    "code": r.code.as_str(), "reason": r.message})),
            }
        }
        Ok(Pick::None(skipped))
    }

    /// The launch row of a take, and what the session is handed: the prompt a worker would
    /// read, with its evidence served now under a fresh receipt.
    fn open_session_launch(
        &self,
        w: &WakeRow,
        permit: &WakePermit,
        conversation: &str,
        now: u64,
        budget: usize,
    ) -> Outcome<Value> {
        let id = format!("lch_{}", self.env.entropy.hex(8));
        let cancel_gen = self
            .control()
            .room(&w.room)
            .map_err(store_err)?
            .map_or(0, |r| r.cancel_gen);
        let b = &permit.binding;
        let not_after = w.created_ms.saturating_add(b.deadline_ms);
        let mut taken = json!({"launch": id, "room": b.room, "from": b.from, "task": b.task,
            "source_event": b.source_event, "prompt": b.prompt, "mention_ids": b.mention_ids,
            "obligation_ids": b.obligation_ids, "not_after_ms": not_after,
            "binding_sha256": permit.binding_sha256, "proof": TAKEN_PROOF});
        if let Some(e) = self.wake_evidence(b, &id, now)? {
            taken["evidence"] = e;
        }
        fit_evidence(&mut taken, budget);
        let evidence = taken.get("evidence").cloned();
        // no credential is issued: the session acts with its agent's own; the column is unique
        let secret = format!("session:{id}:{}", self.env.entropy.hex(16));
        let row = LaunchRow {
            id: id.clone(),
            room: w.room.clone(),
            agent: w.agent.clone(),
            source_event: w.source_event.clone(),
            secret_sha256: room_core::sha256_hex(secret.as_bytes()),
            permit_sha256: permit.binding_sha256.clone(),
            state: "running".into(),
            pid: None,
            created_ms: now,
            not_after_ms: not_after,
            ended_ms: None,
            outcome: None,
            proof: Some(TAKEN_PROOF.into()),
            detail: None,
            delivery: evidence.as_ref().map(Value::to_string),
            started_ms: Some(now),
            control_epoch: b.control_epoch,
            cancel_gen,
            conversation: Some(conversation.to_string()),
            severed: None,
        };
        if !self.control().insert_launch(&row).map_err(store_err)? {
            return Err(not_takeable(format!(
                "the wake for {} was dispatched or dead-lettered meanwhile",
                w.source_event
            )));
        }
        tracing::info!(launch = %id, agent = %w.agent, source = %w.source_event, "a session took its wake");
        Ok(taken)
    }

    /// End the live session launches (of one agent, or all) that are settled: `replied` when
    /// their session's turns answered the permit, `stopped` (the permit dead, never retried)
    /// when their authority tripped, `timed_out` past the permit's deadline. Returns what
    /// ended. The observer calls it on every pass; a take calls it for its agent first.
    pub fn settle_sessions(&self, agent: Option<&str>) -> Outcome<Vec<Value>> {
        let live = self.control().launches_live().map_err(store_err)?;
        let sessions: Vec<LaunchRow> = live
            .into_iter()
            .filter(|l| l.conversation.is_some() && agent.is_none_or(|a| l.agent == a))
            .collect();
        if sessions.is_empty() {
            return Ok(vec![]);
        }
        let trips = self.launch_trips()?;
        let now = self.now_ms();
        let mut out = Vec::new();
        // one launch that cannot be settled (its room unusable, say) holds up no other
        for l in sessions {
            match self.settle_session(&l, &trips, now) {
                Ok(Some(v)) => out.push(v),
                Ok(None) => {}
                Err(r) => tracing::error!(launch = %l.id, "a session launch was not settled: {r}"),
            }
        }
        Ok(out)
    }
}

impl Engine {
    /// End one session launch if it is settled; what ended.
    fn settle_session(
        &self,
        l: &LaunchRow,
        trips: &[crate::lifecycle::Trip],
        now: u64,
    ) -> Outcome<Option<Value>> {
        // a reply that cannot be read is no reply: the trips and the deadline still bite
        let replied = self.replied_by_launch(l).unwrap_or_else(|r| {
            tracing::warn!(launch = %l.id, "the reply of a session launch could not be read: {r}");
            false
        });
        let (outcome, proof, wake_state, detail) = if replied {
            ("replied", "replied", "replied", None)
        } else if let Some(t) = trips.iter().find(|t| t.launch == l.id) {
            let d = json!({"stopped": {"reason": t.reason, "detail": t.detail,
                "stop": "session_released"}, "job": {"kind": "session", "processes": null}});
            ("stopped", TAKEN_PROOF, "dead", Some(d.to_string()))
        } else if now > l.not_after_ms {
            let exit = Exit {
                delivery: Delivery::DeliveredToBody,
                ..Exit::process(None, true)
            };
            let (o, p, w) = judge(false, &exit);
            (o, p, w, None)
        } else {
            return Ok(None);
        };
        let mut e = end(now, outcome, proof, detail, wake_state);
        e.session = l.conversation.as_ref().map(|c| {
            let seen = SessionSeen {
                host: "mcp".into(),
                native: c.clone(),
                cwd: String::new(),
                transport: "mcp".into(),
                loadable: false,
            };
            let mut row = self.session_row(l, &seen, proof, now);
            // one id per agent and conversation: agent names never hold a newline, so the
            // pair hashes unambiguously (conversations of two agents may share a name)
            row.id = crate::dispatch::session_id("mcp", &format!("{}\n{c}", l.agent));
            row
        });
        let ended = self.control().launch_ended(&l.id, &e).map_err(store_err)?;
        Ok(ended.then(|| json!({"launch": l.id, "agent": l.agent, "outcome": outcome})))
    }
}

enum Pick {
    One(Box<(WakeRow, WakePermit)>, Vec<Value>),
    None(Vec<Value>),
}
