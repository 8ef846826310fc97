//! The turnstile: a busy room's fair order of turns. The Work Gate lets a turn land only when
//! its author has read every foreign event before it, so in a room where many agents write,
//! each landing turn sends everyone else back to read; left to retries, the room spends its
//! commit slots refusing and the slowest readers never get through. The turnstile does not
//! weaken the gate: it decides only *who goes next*. A turn that arrives while another author
//! holds the room's slot waits (bounded, in order of arrival) instead of racing; the author at
//! the head goes, and if the gate sends it back to read, the slot stays its own for
//! `turn_slot_ms` so that its retry (with `read_through`) lands. The engine knows no threads:
//! a waiting turn is an answer (`TurnStep::Wait` with a ticket), and the caller waits for the
//! ticket to be woken (`TurnWaits`) or for the slot's deadline, then calls again. A turn that
//! passed every check passes its slot on as its write begins (`pass_on`), so that the next
//! turn's call overlaps the write's sync; the gate still runs under the room's lock, after
//! the write.

use crate::policy::GateLimits;
use room_core::env::Entropy;
use room_core::{Code, Refusal};
use serde_json::json;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

/// How long past its wait deadline a waiter may take to call again before it loses its place
/// (a caller that went away must not hold the queue).
const WAITER_GRACE_MS: u64 = 1_000;
/// Retry slots one author may hold in a row (see `Hold::retries`): as many as the delta pages
/// a receipt chain may hold.
pub const RETRY_SLOTS_MAX: u32 = crate::sync::RECEIPT_CHAIN_MAX as u32;
/// Woken tickets remembered for callers that have not looked yet.
const WOKEN_KEPT_MAX: usize = 4096;

/// Where an engine's tickets start counting: a random point below 2^62, drawn from its
/// entropy once, when it is built. The turnstile is in memory, so a restart starts with an
/// empty queue; a counter that started again at 1 would hand the last run's numbers out
/// again, and a caller that kept one across the restart could pass for the waiter that now
/// holds it (a place in the queue it never had). Drawn from entropy rather than the clock: the
/// clock may step back (the simulator steps it back by minutes) and two runs may start in the
/// same millisecond (a crash loop), so starts derived from it can meet; two random starts
/// meet only if one falls within the tickets the other run drew, about n / 2^62 for a run
/// of n tickets. Below 2^62, the counter never wraps. The simulator's entropy is seeded, so
/// its runs still replay exactly.
pub(crate) fn first_ticket(entropy: &dyn Entropy) -> u64 {
    let mut b = [0u8; 8];
    entropy.fill(&mut b);
    u64::from_le_bytes(b) >> 2
}

/// What a turn call comes to: done (landed or refused), or waiting for its turn.
#[derive(Debug)]
pub enum TurnStep<T> {
    Done(T),
    Wait { ticket: u64, until_ms: u64 },
}

/// Where a turn may go now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Run the turn; it waited this long in the queue.
    Go {
        waited_ms: u64,
    },
    Wait {
        ticket: u64,
        until_ms: u64,
    },
}

#[derive(Debug)]
struct Hold {
    key: String,
    until_ms: u64,
    /// Times the slot was kept for a retry in a row. An author far behind needs a delta page
    /// per refusal, so the slot stays its own while it reads forward (each retry presents a
    /// receipt), at most `RETRY_SLOTS_MAX` times; a retry without one releases it (an author
    /// that retries without reading must not keep the room).
    retries: u32,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    key: String,
    since_ms: u64,
    lease_ms: u64,
}

/// One room's slot and queue (kept in its handle, under the room's lock).
#[derive(Debug, Default)]
pub(crate) struct Turnstile {
    holder: Option<Hold>,
    queue: VecDeque<Waiter>,
}

impl Turnstile {
    /// Whether the author `key` (a conversation key) may run its turn now. `ticket` is the
    /// one an earlier `Wait` gave it; `next_ticket` draws a fresh one.
    pub(crate) fn admit(
        &mut self,
        key: &str,
        ticket: Option<u64>,
        now_ms: u64,
        limits: &GateLimits,
        next_ticket: impl FnOnce() -> u64,
    ) -> Result<Admit, Refusal> {
        self.prune(now_ms);
        let mine = ticket.and_then(|t| {
            self.queue
                .iter()
                .position(|w| w.ticket == t && w.key == key)
        });
        let free = match &self.holder {
            Some(h) => h.key == key,
            None => self.queue.is_empty() || mine == Some(0),
        };
        if free {
            let waited_ms = mine
                .and_then(|i| self.queue.remove(i))
                .map_or(0, |w| now_ms.saturating_sub(w.since_ms));
            let retries = self.holder.as_ref().map_or(0, |h| h.retries);
            self.holder = Some(Hold {
                key: key.into(),
                until_ms: now_ms + limits.turn_slot_ms,
                retries,
            });
            return Ok(Admit::Go { waited_ms });
        }
        let slot_ends_ms = self
            .holder
            .as_ref()
            .map_or(now_ms + limits.turn_slot_ms, |h| h.until_ms);
        // a waiter calls again when the slot ends or its own wait runs out, whichever is first
        let until = |since_ms: u64| slot_ends_ms.min(since_ms + limits.turn_wait_ms_max + 1);
        if let Some(i) = mine {
            let until_ms = until(self.queue[i].since_ms);
            let w = &mut self.queue[i];
            let waited = now_ms.saturating_sub(w.since_ms);
            if waited > limits.turn_wait_ms_max {
                let ahead = i;
                self.queue.remove(i);
                return Err(exceeded("waited", waited, ahead, limits));
            }
            w.lease_ms = until_ms + WAITER_GRACE_MS;
            return Ok(Admit::Wait {
                ticket: w.ticket,
                until_ms,
            });
        }
        if self.queue.len() as u64 >= limits.turn_queue_max {
            return Err(exceeded("queue_full", 0, self.queue.len(), limits));
        }
        let ticket = next_ticket();
        let until_ms = until(now_ms);
        self.queue.push_back(Waiter {
            ticket,
            key: key.into(),
            since_ms: now_ms,
            lease_ms: until_ms + WAITER_GRACE_MS,
        });
        Ok(Admit::Wait { ticket, until_ms })
    }

    /// The turn of `key` ended. `sent_back`: the gate sent it back to read, so the slot stays
    /// its own for one more `turn_slot_ms`: after a first refusal, and after each further one
    /// of a turn that read forward (`read_forward`: it presented a receipt), up to
    /// `RETRY_SLOTS_MAX` in a row. Returns the ticket to wake, if the room is free.
    pub(crate) fn finish(
        &mut self,
        key: &str,
        sent_back: bool,
        read_forward: bool,
        now_ms: u64,
        limits: &GateLimits,
    ) -> Option<u64> {
        if let Some(h) = self.holder.take_if(|h| h.key == key) {
            let keep = sent_back && (h.retries == 0 || read_forward) && h.retries < RETRY_SLOTS_MAX;
            self.holder = keep.then(|| Hold {
                key: key.into(),
                until_ms: now_ms + limits.turn_slot_ms,
                retries: h.retries + 1,
            });
        }
        self.prune(now_ms);
        match self.holder {
            Some(_) => None,
            None => self.queue.front().map(|w| w.ticket),
        }
    }

    /// The turn of `key` is being written and nothing can send it back: its slot is free, so
    /// that the next waiting turn starts while this one is made durable. Returns the ticket to
    /// wake, if one waits. `finish` after this keeps nothing for `key` (it may wake the same
    /// head again: a waiter that already went only looks once more).
    pub(crate) fn pass_on(&mut self, key: &str) -> Option<u64> {
        self.holder.take_if(|h| h.key == key)?;
        self.queue.front().map(|w| w.ticket)
    }

    /// Drop an expired slot and waiters that stopped calling.
    fn prune(&mut self, now_ms: u64) {
        if self.holder.as_ref().is_some_and(|h| h.until_ms <= now_ms) {
            self.holder = None;
        }
        self.queue.retain(|w| w.lease_ms > now_ms);
    }

    /// Turns waiting (tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.queue.len()
    }
}

fn exceeded(reason: &str, waited_ms: u64, ahead: usize, limits: &GateLimits) -> Refusal {
    Refusal::new(
        Code::RoomTurnQueueExceeded,
        match reason {
            "queue_full" => format!(
                "{} turns already wait in this room; nothing was written",
                limits.turn_queue_max
            ),
            _ => format!("your turn waited {waited_ms} ms for the room; nothing was written"),
        },
    )
    .detail(json!({
        "reason": reason, "waited_ms": waited_ms, "ahead": ahead,
        "turn_queue_max": limits.turn_queue_max, "turn_wait_ms_max": limits.turn_wait_ms_max,
    }))
    .hint("the room is busy: try again shortly")
}

/// Woken tickets, for the callers that wait on them: a blocking caller parks on its own
/// ticket's slot (so a wake-up wakes that one thread, not every waiter), an async one is told
/// through the hook (which must not block) and then looks.
#[derive(Default)]
pub struct TurnWaits {
    woken: Mutex<Woken>,
    hook: RwLock<Option<Arc<dyn Fn() + Send + Sync>>>,
}

#[derive(Default)]
struct Woken {
    tickets: HashSet<u64>,
    order: VecDeque<u64>,
    /// Blocking waiters, by ticket.
    parked: std::collections::HashMap<u64, Arc<Parked>>,
}

#[derive(Default)]
struct Parked {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl TurnWaits {
    /// Set the hook called after every wake (the daemon's notifier), unless one is set.
    pub fn hook_once(&self, hook: impl FnOnce() -> Arc<dyn Fn() + Send + Sync>) {
        if self.hook.read().expect("turn wait hook lock").is_some() {
            return;
        }
        let mut h = self.hook.write().expect("turn wait hook lock");
        if h.is_none() {
            *h = Some(hook());
        }
    }

    pub(crate) fn wake(&self, ticket: u64) {
        let parked = {
            let mut w = self.woken.lock().expect("woken tickets lock");
            if w.tickets.insert(ticket) {
                w.order.push_back(ticket);
            }
            while w.order.len() > WOKEN_KEPT_MAX {
                if let Some(old) = w.order.pop_front() {
                    w.tickets.remove(&old);
                }
            }
            w.parked.get(&ticket).cloned()
        };
        if let Some(p) = parked {
            *p.woken.lock().expect("parked waiter lock") = true;
            p.cv.notify_one();
        }
        if let Some(h) = self.hook.read().expect("turn wait hook lock").as_ref() {
            h();
        }
    }

    /// Whether `ticket` was woken (and forget it).
    pub fn take(&self, ticket: u64) -> bool {
        let mut w = self.woken.lock().expect("woken tickets lock");
        let was = w.tickets.remove(&ticket);
        if was {
            w.order.retain(|t| *t != ticket);
        }
        was
    }

    /// Block until `ticket` is woken or `timeout` passes (or spuriously earlier: the caller
    /// asks the turnstile again either way).
    pub fn wait_blocking(&self, ticket: u64, timeout: Duration) {
        let parked = {
            let mut w = self.woken.lock().expect("woken tickets lock");
            if w.tickets.remove(&ticket) {
                w.order.retain(|t| *t != ticket);
                return;
            }
            let p = Arc::new(Parked::default());
            w.parked.insert(ticket, p.clone());
            p
        };
        let woken = parked.woken.lock().expect("parked waiter lock");
        if !*woken {
            drop(
                parked
                    .cv
                    .wait_timeout(woken, timeout)
                    .expect("parked waiter lock"),
            );
        }
        let mut w = self.woken.lock().expect("woken tickets lock");
        w.parked.remove(&ticket);
        if w.tickets.remove(&ticket) {
            w.order.retain(|t| *t != ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> GateLimits {
        GateLimits {
            turn_slot_ms: 100,
            turn_queue_max: 2,
            turn_wait_ms_max: 1_000,
        }
    }

    #[test]
    fn turns_go_in_order_and_a_refused_author_keeps_its_slot() {
        let l = limits();
        let mut t = Turnstile::default();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        assert_eq!(
            t.admit("a", None, 0, &l, &mut next),
            Ok(Admit::Go { waited_ms: 0 })
        );
        let Ok(Admit::Wait {
            ticket: tb,
            until_ms,
        }) = t.admit("b", None, 1, &l, &mut next)
        else {
            panic!("b waits while a holds the room")
        };
        assert_eq!(until_ms, 100);
        let Ok(Admit::Wait { ticket: tc, .. }) = t.admit("c", None, 2, &l, &mut next) else {
            panic!("c waits too")
        };
        assert!(
            t.admit("d", None, 3, &l, &mut next)
                .is_err_and(|r| r.code == Code::RoomTurnQueueExceeded),
            "the queue is full"
        );
        // a is refused by the gate: its slot is kept, nobody is woken
        assert_eq!(t.finish("a", true, false, 10, &l), None);
        assert_eq!(
            t.admit("a", None, 20, &l, &mut next),
            Ok(Admit::Go { waited_ms: 0 })
        );
        // a landed: b is woken, c still waits behind it
        assert_eq!(t.finish("a", false, false, 30, &l), Some(tb));
        assert!(matches!(
            t.admit("c", Some(tc), 31, &l, &mut next),
            Ok(Admit::Wait { .. })
        ));
        assert_eq!(
            t.admit("b", Some(tb), 32, &l, &mut next),
            Ok(Admit::Go { waited_ms: 31 })
        );
        assert_eq!(t.finish("b", false, false, 40, &l), Some(tc));
        assert_eq!(
            t.admit("c", Some(tc), 41, &l, &mut next),
            Ok(Admit::Go { waited_ms: 39 })
        );
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn a_turn_past_its_checks_passes_the_slot_on_before_it_finishes() {
        let l = limits();
        let mut t = Turnstile::default();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        assert_eq!(
            t.admit("a", None, 0, &l, &mut next),
            Ok(Admit::Go { waited_ms: 0 })
        );
        let Ok(Admit::Wait { ticket: tb, .. }) = t.admit("b", None, 1, &l, &mut next) else {
            panic!("b waits while a holds the room")
        };
        assert_eq!(t.pass_on("b"), None, "only the holder passes its slot on");
        assert_eq!(t.pass_on("a"), Some(tb), "a is being written: b is woken");
        // a newcomer still goes behind the head, which goes while a is still being written
        let Ok(Admit::Wait { ticket: tc, .. }) = t.admit("c", None, 2, &l, &mut next) else {
            panic!("c waits behind the head")
        };
        assert_eq!(
            t.admit("b", Some(tb), 3, &l, &mut next),
            Ok(Admit::Go { waited_ms: 2 })
        );
        // a finishes after b went: b keeps the slot, nobody else is woken
        assert_eq!(t.finish("a", false, false, 4, &l), None);
        assert!(matches!(
            t.admit("c", Some(tc), 5, &l, &mut next),
            Ok(Admit::Wait { .. })
        ));
        assert_eq!(t.pass_on("a"), None, "a holds nothing any more");
        assert_eq!(t.finish("b", false, false, 6, &l), Some(tc));
    }

    #[test]
    fn an_unused_slot_expires_and_a_silent_waiter_loses_its_place() {
        let l = limits();
        let mut t = Turnstile::default();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        assert!(matches!(
            t.admit("a", None, 0, &l, &mut next),
            Ok(Admit::Go { .. })
        ));
        assert_eq!(t.finish("a", true, false, 0, &l), None);
        assert!(matches!(
            t.admit("b", None, 1, &l, &mut next),
            Ok(Admit::Wait { .. })
        ));
        // b never calls again: past the slot and its grace, c goes straight through
        let late = 100 + WAITER_GRACE_MS + 1;
        assert_eq!(
            t.admit("c", None, late, &l, &mut next),
            Ok(Admit::Go { waited_ms: 0 })
        );
    }

    #[test]
    fn a_ticket_the_turnstile_does_not_know_is_a_fresh_arrival() {
        // a restart's turnstile: empty, its tickets counting from a new start
        let l = limits();
        let mut t = Turnstile::default();
        let mut n = 1_000;
        let mut next = || {
            n += 1;
            n
        };
        assert!(matches!(
            t.admit("a", None, 0, &l, &mut next),
            Ok(Admit::Go { .. })
        ));
        let Ok(Admit::Wait { ticket: tc, .. }) = t.admit("c", None, 1, &l, &mut next) else {
            panic!("c waits")
        };
        // b comes back with the ticket an earlier run gave it: no place, a new ticket behind
        // c, and its wait starts now
        let Ok(Admit::Wait { ticket: tb, .. }) = t.admit("b", Some(7), 2, &l, &mut next) else {
            panic!("b waits behind c")
        };
        assert_ne!(
            tb, 7,
            "a ticket the queue does not hold is never handed back"
        );
        assert_eq!(
            t.finish("a", false, false, 10, &l),
            Some(tc),
            "c is the head"
        );
        assert!(matches!(
            t.admit("b", Some(tb), 11, &l, &mut next),
            Ok(Admit::Wait { .. })
        ));
        assert_eq!(
            t.admit("c", Some(tc), 12, &l, &mut next),
            Ok(Admit::Go { waited_ms: 11 })
        );
        assert_eq!(t.finish("c", false, false, 20, &l), Some(tb));
        assert_eq!(
            t.admit("b", Some(tb), 21, &l, &mut next),
            Ok(Admit::Go { waited_ms: 19 }),
            "the wait is measured from b's arrival in this run"
        );
    }

    /// An engine built again over the same state (a restart) hands out no ticket an earlier
    /// run handed out, and a ticket kept across the restart holds no place in the new queue.
    #[test]
    #[allow(clippy::disallowed_methods)] // a real state dir
    fn turnstile_tickets_are_unique_across_engine_runs() {
        use crate::principal::AgentCaller;
        use crate::verbs::TurnArgs;
        use crate::{Engine, EngineConfig, Env};
        use room_core::Verb;
        use room_core::env::{ManualClock, SeededEntropy};
        use room_store::{SqliteBackend, SqliteBackendConfig, statedir};

        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let (state, boot) = (root.join("state"), root.join("boot.toml"));
        statedir::init(&state, &boot, "inst").unwrap();
        let clock = Arc::new(ManualClock::new(1_790_000_000_000));
        // one source across runs, as the OS's random source is
        let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(3));
        let open = || {
            let s = statedir::validate(&state, &boot).unwrap();
            let env = Env {
                clock: clock.clone(),
                entropy: entropy.clone(),
                fs: Arc::new(room_store::fs::RealFs),
                runner: Arc::new(room_core::env::NoRunner),
            };
            let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
            Engine::open(s, env, store, EngineConfig::default()).unwrap()
        };
        let owner = |e: &Engine| {
            e.owner(&crate::Caller::Local(crate::Evidence::UnixPeer {
                uid: e.config().owner_uid,
                pid: std::process::id(),
            }))
            .unwrap()
        };
        let say = |text: &str| TurnArgs {
            room: "r".into(),
            text: Some(text.into()),
            ..Default::default()
        };
        let wait = |e: &Engine, who: &AgentCaller, ticket: Option<u64>| match e.turn_step(
            who,
            Verb::Say,
            say("waits"),
            ticket,
        ) {
            Ok(TurnStep::Wait { ticket, .. }) => ticket,
            other => panic!("the turn waits: {other:?}"),
        };
        // alpha has not read beta's turn: sent back, it holds the room's slot
        let hold = |e: &Engine, a: &AgentCaller| {
            let r = e.turn_step(a, Verb::Say, say("a"), None).unwrap_err();
            assert_eq!(r.code, Code::RoomSyncRequired);
        };

        let e = open();
        let [a, b, c] = ["alpha", "beta", "gamma"].map(|n| AgentCaller {
            token: e
                .enroll(&owner(&e), n, room_core::Tier::Member, "generic")
                .unwrap()
                .token,
            conversation: "c1".into(),
            declared_tier: None,
            page_bytes_max: None,
        });
        let names = ["alpha", "beta", "gamma"].map(String::from);
        e.room_create(&owner(&e), "r", None, &names).unwrap();
        let page = e.sync(&b, "r", None).unwrap();
        let read = TurnArgs {
            read_through: page["receipt"].as_str().map(String::from),
            ..say("b first")
        };
        e.turn(&b, Verb::Say, read).unwrap();
        hold(&e, &a);
        let first_run = [wait(&e, &b, None), wait(&e, &c, None)];
        let tb = first_run[0];
        drop(e);

        clock.advance(5);
        let e = open();
        hold(&e, &a);
        let tc = wait(&e, &c, None);
        // beta calls again with its ticket from before the restart: a fresh arrival behind
        // gamma, with a new ticket
        let tb2 = wait(&e, &b, Some(tb));
        for t in [tc, tb2] {
            assert!(
                !first_run.contains(&t),
                "ticket {t} was handed out before the restart"
            );
        }
        // alpha, sent back again without reading forward, lets the room go: gamma is the head
        hold(&e, &a);
        assert!(e.turn_waits().take(tc) && !e.turn_waits().take(tb2));
    }

    #[test]
    fn a_waiter_past_its_bound_is_refused() {
        let l = limits();
        let mut t = Turnstile::default();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        assert!(matches!(
            t.admit("a", None, 0, &l, &mut next),
            Ok(Admit::Go { .. })
        ));
        let Ok(Admit::Wait { ticket, .. }) = t.admit("b", None, 0, &l, &mut next) else {
            panic!("b waits")
        };
        // a is refused and keeps a retry slot; refused in it again, it releases the room
        assert_eq!(t.finish("a", true, false, 10, &l), None);
        assert!(matches!(
            t.admit("a", None, 20, &l, &mut next),
            Ok(Admit::Go { .. })
        ));
        assert_eq!(
            t.finish("a", true, false, 30, &l),
            Some(ticket),
            "b is woken"
        );
        // a comes back before b does: b is at the head, a waits behind it
        assert!(matches!(
            t.admit("a", None, 31, &l, &mut next),
            Ok(Admit::Wait { .. })
        ));
        assert!(matches!(
            t.admit("b", Some(ticket), 32, &l, &mut next),
            Ok(Admit::Go { .. })
        ));
        // b's turn runs long and keeps the room: c waits until its bound, then is refused
        let Ok(Admit::Wait { ticket: tc, .. }) = t.admit("c", None, 33, &l, &mut next) else {
            panic!("c waits")
        };
        let mut now = 33;
        let refused = loop {
            now += 50;
            assert!(matches!(
                t.admit("b", None, now, &l, &mut next),
                Ok(Admit::Go { .. })
            ));
            match t.admit("c", Some(tc), now, &l, &mut next) {
                Ok(Admit::Wait { .. }) => continue,
                Ok(Admit::Go { .. }) => panic!("c cannot go while b holds the room"),
                Err(r) => break r,
            }
        };
        assert_eq!(refused.code, Code::RoomTurnQueueExceeded);
        assert!(now - 33 > l.turn_wait_ms_max);
    }
}
