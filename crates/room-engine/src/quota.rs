//! Quotas: per agent and room, the bytes written within a minute and the tasks open; per agent,
//! the MCP sessions open (counted at the edge, which holds them). Limits come from
//! `config.toml`'s `[quotas]` (`policy::Quotas`), with defaults a real team does not reach; a
//! call over one is refused `quota_exceeded`, naming the limit, before anything is written.

use crate::room::RoomHandle;
use room_core::{Code, Refusal};
use serde_json::json;
use std::collections::{HashMap, VecDeque};

/// The window `bytes_per_minute` counts over.
pub const WINDOW_MS: u64 = 60_000;
/// Writes remembered per agent and room within the window (older ones are summed away).
const WRITES_KEPT_MAX: usize = 1_024;

/// What one room's agents wrote within the window: (at_ms, bytes), oldest first.
#[derive(Debug, Default)]
pub struct Written {
    by_agent: HashMap<String, VecDeque<(u64, u64)>>,
}

impl Written {
    fn used(&mut self, agent: &str, now_ms: u64) -> u64 {
        let Some(w) = self.by_agent.get_mut(agent) else {
            return 0;
        };
        while w
            .front()
            .is_some_and(|(at, _)| at.saturating_add(WINDOW_MS) <= now_ms)
        {
            w.pop_front();
        }
        w.iter().map(|(_, b)| b).sum()
    }

    fn record(&mut self, agent: &str, bytes: u64, now_ms: u64) {
        let w = self.by_agent.entry(agent.to_string()).or_default();
        if w.len() >= WRITES_KEPT_MAX {
            // merge the two oldest: the sum stays, the window only grows more careful
            let (_, b0) = w.pop_front().expect("a full window has a front");
            if let Some(front) = w.front_mut() {
                front.1 += b0;
            }
        }
        w.push_back((now_ms, bytes));
    }
}

pub(crate) fn exceeded(
    quota: &str,
    limit: u64,
    used: u64,
    requested: u64,
    what: String,
) -> Refusal {
    Refusal::new(
        Code::QuotaExceeded,
        format!("quota {quota} reached: {what}"),
    )
    .detail(json!({"quota": quota, "limit": limit, "used": used, "requested": requested}))
    .hint("wait, or ask the owner to raise [quotas] in config.toml")
}

impl RoomHandle {
    /// Refuse `bytes` more from `agent` when they would pass `limit` within the window.
    pub(crate) fn check_bytes(
        &mut self,
        agent: &str,
        bytes: u64,
        limit: u64,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let used = self.written.used(agent, now_ms);
        if used.saturating_add(bytes) > limit {
            return Err(exceeded(
                "bytes_per_minute",
                limit,
                used,
                bytes,
                format!(
                    "{agent} wrote {used} of {limit} bytes in room {} within the last minute",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    /// Count `bytes` written by `agent` (after its records are durable).
    pub(crate) fn record_bytes(&mut self, agent: &str, bytes: u64, now_ms: u64) {
        if bytes > 0 {
            self.written.record(agent, bytes, now_ms);
        }
    }
}
