//! Authority: who may act, and with what standing. It owns the control store (principals and
//! their credential digests, verb policy, project grants, rosters, tasks, the wake queue) and
//! the owner policy read from `config.toml`. Credentials (`principal`) and territory
//! (`territory`) are its methods; every other part asks it, never the store directly for a
//! decision of standing.

use crate::Env;
use crate::policy::{self, Policy};
use room_store::ControlStore;
use room_store::statedir::StateDir;
use std::sync::{Mutex, MutexGuard};

pub struct Authority {
    pub(crate) env: Env,
    pub(crate) state: StateDir,
    pub(crate) control: Mutex<Box<dyn ControlStore>>,
    pub(crate) policy: policy::PolicyCache,
    /// Credentials this process minted for its collaborations' scheduler, each acting as a
    /// collaboration's orchestrator (digest → agent, and `agent:NAME` → its one credential): kept in memory only (never stored, gone
    /// with the process), so the orchestrator's enrolled credential is never rotated by a
    /// daemon's start and whoever holds it keeps it.
    pub(crate) scheduler: Mutex<std::collections::HashMap<String, String>>,
}

impl Authority {
    pub(crate) fn new(env: Env, state: StateDir, control: Box<dyn ControlStore>) -> Authority {
        let policy = policy::PolicyCache::new(state.config(), env.fs.clone());
        Authority {
            env,
            state,
            control: Mutex::new(control),
            policy,
            scheduler: Mutex::new(Default::default()),
        }
    }

    pub(crate) fn control(&self) -> MutexGuard<'_, Box<dyn ControlStore>> {
        let mut c = self
            .control
            .lock()
            .expect("control lock is never poisoned: no panics while held");
        c.refresh_if_stale();
        c
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.env.clock.now_ms()
    }

    /// The current policy (fleet ceiling, redactor), re-read from config.toml when it changed.
    pub fn policy(&self) -> Policy {
        self.policy.for_check(self.env.clock.now_ms())
    }
}
