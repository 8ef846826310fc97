//! Dispatch revalidation. A queued permit is not authority: it is a proposal to deliver work
//! later under conditions that may have changed. Every queued permit is checked again, least
//! recently checked first, against the seed's five centres, in order:
//!
//! 1. integrity: schema, `binding_sha256` over the 18 fields, the queue key it is filed under
//!    (`wake_job_binding_changed`);
//! 2. room and recipient: the room exists and is not archived, recipient and sender are still
//!    members, the owner grant and the session are the sealed ones, no reset since
//!    (`wake_room_authority_changed`); the recipient is not revoked and its registration is the
//!    sealed one (`wake_recipient_registration_changed`);
//! 3. task: open or claimed, in this room and its project, valid ancestry, still owned by the
//!    sealed sender or delegated through it (`wake_task_authority_changed`);
//! 4. admission and control epoch (`wake_admission_closed`);
//! 5. the deadline: `created + deadline_ms` still ahead; queue time counts (`wake_job_expired`).
//!
//! A refused permit is dead-lettered with its code and message, never retried, and its
//! obligations stay open (a dead wake is not an answer). A permit that passes stays queued for a
//! launch (routes and adapters come later) or for its agent's own MCP session.

use crate::{Engine, Outcome, store_err};
use room_core::wake::{WAKE_SCHEMA, WakePermit, wake_path};
use room_core::{Code, Refusal, TaskStatus};
use room_store::control::{LaunchEnd, RoomRow, WakeRow};
use serde_json::{Value, json};

/// Permits one sweep revalidates.
pub const DISPATCH_BATCH_MAX: usize = 64;

fn refuse(code: Code, why: String) -> Refusal {
    Refusal::new(code, why)
}

impl Engine {
    /// The owner grant a permit of `room` seals: the project grant with its root identity, or
    /// the coordination room's own graph.
    pub(crate) fn room_grant(&self, room: &RoomRow) -> Outcome<String> {
        match &room.project_id {
            Some(pid) => {
                let p = self
                    .control()
                    .project(pid)
                    .map_err(store_err)?
                    .ok_or_else(|| refuse(Code::NotFound, format!("no project {pid}")))?;
                Ok(format!("project:{pid}@{}:{}:{}", p.dev, p.ino, p.mnt_id))
            }
            None => Ok(format!("coordination:{}", room.graph_id)),
        }
    }

    /// Revalidate up to `DISPATCH_BATCH_MAX` queued permits; dead-letter each that fails.
    /// Returns how many were checked and which died, with their codes.
    pub fn dispatch_sweep(&self) -> Outcome<Value> {
        self.flush_wakes();
        let rows = self
            .control()
            .wakes_to_check(DISPATCH_BATCH_MAX)
            .map_err(store_err)?;
        let now = self.now_ms();
        let verdicts: Vec<room_store::control::WakeVerdict> = rows
            .into_iter()
            .map(|w| {
                let dead = self
                    .revalidate(&w, now)
                    .err()
                    .map(|r| (r.code.as_str().to_string(), r.message.into()));
                room_store::control::WakeVerdict { wake: w, dead }
            })
            .collect();
        // one transaction for the whole pass: one fsync, not one per permit
        let moved = self
            .control()
            .wakes_checked(&verdicts, now)
            .map_err(store_err)?;
        let mut dead = Vec::new();
        for (v, moved) in verdicts.iter().zip(moved) {
            let (Some((code, reason)), true) = (&v.dead, moved) else {
                continue;
            };
            let w = &v.wake;
            tracing::info!(
                room = %w.room, agent = %w.agent, source = %w.source_event,
                "wake dead-lettered: {code}: {reason}"
            );
            dead.push(
                json!({"path": wake_path(&w.room, &w.agent, &w.source_event),
                "code": code, "reason": reason}),
            );
        }
        Ok(json!({"checked": verdicts.len(), "dead": dead}))
    }

    /// The five checks, in order; the permit when every one holds.
    pub fn revalidate(&self, w: &WakeRow, now_ms: u64) -> Result<WakePermit, Refusal> {
        let p = self.integrity(w)?;
        let room = self.room_authority(&p)?;
        self.task_authority(&p, &room)?;
        let epoch = self.control().control_epoch().map_err(store_err)?;
        if room.cancelled || self.control().break_glass().map_err(store_err)? {
            let why = if room.cancelled {
                format!("room {} is cancelled: it dispatches nothing", room.name)
            } else {
                "break-glass is engaged: nothing is dispatched".to_string()
            };
            return Err(refuse(Code::WakeAdmissionClosed, why));
        }
        if !room.admission_open || epoch != p.binding.control_epoch {
            return Err(refuse(
                Code::WakeAdmissionClosed,
                format!(
                    "room {} admission is {}; control epoch {} (sealed {})",
                    room.name,
                    if room.admission_open {
                        "open"
                    } else {
                        "closed"
                    },
                    epoch,
                    p.binding.control_epoch
                ),
            ));
        }
        // the room's authority revision moves with its roster, reset, admission and cancel
        // (those with a code of their own are refused above): a permit sealed under another
        // revision speaks for a room that is no longer there
        let sealed = p.binding.room_authority.revision;
        if sealed != room.revision {
            return Err(refuse(
                Code::WakeRoomAuthorityChanged,
                format!(
                    "room {}'s authority moved to revision {} since the permit was sealed at {sealed}",
                    room.name, room.revision
                ),
            ));
        }
        let due = w.created_ms.saturating_add(p.binding.deadline_ms);
        if now_ms > due {
            return Err(refuse(
                Code::WakeJobExpired,
                format!(
                    "its deadline of {} ms from creation passed {} ms ago (queue time counts)",
                    p.binding.deadline_ms,
                    now_ms - due
                ),
            ));
        }
        Ok(p)
    }

    fn integrity(&self, w: &WakeRow) -> Result<WakePermit, Refusal> {
        let changed = |why: &str| refuse(Code::WakeJobBindingChanged, why.to_string());
        let p: WakePermit =
            serde_json::from_str(&w.permit).map_err(|_| changed("the permit is unreadable"))?;
        if p.binding.schema != WAKE_SCHEMA {
            return Err(changed("the permit's schema is not room-wake-job-v3"));
        }
        if !p.intact() {
            return Err(changed("binding_sha256 does not match the sealed fields"));
        }
        let b = &p.binding;
        if (b.room.as_str(), b.agent.as_str(), b.source_event.as_str())
            != (w.room.as_str(), w.agent.as_str(), w.source_event.as_str())
            || b.path != wake_path(&w.room, &w.agent, &w.source_event)
        {
            return Err(changed("the permit is filed under another key"));
        }
        Ok(p)
    }

    fn room_authority(&self, p: &WakePermit) -> Result<RoomRow, Refusal> {
        let b = &p.binding;
        let changed = |why: String| refuse(Code::WakeRoomAuthorityChanged, why);
        let room = self
            .control()
            .room(&b.room)
            .map_err(store_err)?
            .filter(|r| r.archived_ms.is_none())
            .ok_or_else(|| changed(format!("room {} is gone or archived", b.room)))?;
        for who in [&b.agent, &b.from] {
            if !self.control().is_member(&b.room, who).map_err(store_err)? {
                return Err(changed(format!(
                    "{who} is no longer a member of {}",
                    b.room
                )));
            }
        }
        let grant = self.room_grant(&room)?;
        let a = &b.room_authority;
        if a.owner_grant != grant
            || a.session != self.state.instance_id
            || a.reset_at != room.reset_ms.map(room_core::wake::rfc3339_ms)
        {
            return Err(changed(format!(
                "the room's grant, session or reset is not the sealed one (now {grant})"
            )));
        }
        let agent = self.control().agent(&b.agent).map_err(store_err)?;
        match agent {
            Some(r)
                if r.revoked_ms.is_none()
                    && (r.registration_sha256 == b.registration_sha256
                        || crate::planted::bug("04-C07")) =>
            {
                Ok(room)
            }
            _ => Err(refuse(
                Code::WakeRecipientRegistrationChanged,
                format!(
                    "{} was revoked or re-registered since the permit was sealed",
                    b.agent
                ),
            )),
        }
    }

    fn task_authority(&self, p: &WakePermit, room: &RoomRow) -> Result<(), Refusal> {
        let b = &p.binding;
        let Some(task) = &b.task else {
            return Ok(());
        };
        let changed = |why: String| refuse(Code::WakeTaskAuthorityChanged, why);
        let t = self
            .control()
            .task(task)
            .map_err(store_err)?
            .ok_or_else(|| changed(format!("task {task} is gone")))?;
        if !matches!(t.status, TaskStatus::Open | TaskStatus::Claimed) {
            return Err(changed(format!("task {task} is {}", t.status)));
        }
        if t.room != room.name || t.project_id != room.project_id {
            return Err(changed(format!(
                "task {task} is not a task of room {} and its project",
                room.name
            )));
        }
        let ancestors = self
            .valid_ancestry(&t.id, t.parent.as_deref())
            .map_err(|r| changed(format!("its ancestry is invalid: {}", r.message)))?;
        let delegated = t.owner == b.from
            || t.recipient.as_deref() == Some(b.from.as_str())
            || ancestors.iter().any(|a| a.owner == b.from);
        if !delegated {
            return Err(changed(format!(
                "task {task} is no longer owned by {} nor delegated through it",
                b.from
            )));
        }
        self.pin_task_source(&t)
    }

    /// A governed task must still have its governing source, and a claimed one the very
    /// source its claim pinned (the same parts at the same digests): a worker woken for a
    /// claim whose source moved would act on a reading `done` no longer counts.
    fn pin_task_source(&self, t: &room_store::control::TaskRow) -> Result<(), Refusal> {
        if !t.governed {
            return Ok(());
        }
        let changed = |why: String| refuse(Code::WakeTaskAuthorityChanged, why);
        let now = self.source_key(t).map_err(|r| {
            changed(format!(
                "its governing source cannot be read: {}",
                r.message
            ))
        })?;
        if now == "missing" {
            return Err(changed(format!(
                "task {}'s governing source is gone: its project has none now",
                t.id
            )));
        }
        let pinned = t.claim_pin.as_ref().and_then(|p| p.get("source"));
        if pinned.is_some_and(|p| *p != now) {
            return Err(changed(format!(
                "task {}'s governing source changed since its claim",
                t.id
            )));
        }
        Ok(())
    }
}

/// A worker's one-launch credential: valid only while its launch runs.
pub const WORKER_TOKEN_PREFIX: &str = "room_wrk_";
/// After a recipient's launch ends, its next one waits this long (the damper).
pub const COOLDOWN_MS: u64 = 2_000;
/// Routed agents a config may name: a dispatch pass looks at the oldest permit of each.
pub const ROUTED_AGENTS_PER_PASS_MAX: usize = 1_024;
/// Launches one dispatch pass may start.
pub const LAUNCHES_PER_PASS_MAX: usize = 16;
/// A launch's state while its process is running.
const RUNNING: &str = "running";

/// Why queued permits wait, as the last dispatch pass found them: `recipient_busy` (another
/// launch of the recipient runs, or its cooldown has not passed) or `worker_route_capacity`
/// (the daemon runs `[dispatch] workers_max` workers already, or the permit's route draws on
/// a model route whose `[dispatch.model_routes]` bound is reached: then it is named). A
/// deferral never drops a permit; it is kept in memory only, for the wakes view.
#[derive(Debug, Default)]
pub(crate) struct Deferrals(std::sync::Mutex<std::collections::BTreeMap<String, Deferral>>);

/// One permit's deferral: its code and, for a model route's bound, the route's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deferral {
    pub code: &'static str,
    pub model_route: Option<String>,
}

impl Deferrals {
    fn replace(&self, next: std::collections::BTreeMap<String, Deferral>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = next;
    }

    pub(crate) fn of(&self, path: &str) -> Option<Deferral> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()
    }
}

/// A launch the dispatcher is to start: the route, what the worker reads on stdin, and the
/// credential it acts with (shown here once; only its digest is stored).
#[derive(Debug, Clone)]
pub struct Launch {
    pub id: String,
    pub token: String,
    pub room: String,
    pub agent: String,
    pub route: crate::policy::Route,
    pub prompt: Value,
    /// The longest the process may run: the route's bound and what is left of the permit's.
    pub deadline_ms: u64,
    /// The native session to deliver into (the agent's bound one, `spawn_policy = "never"`);
    /// none: the adapter opens a new one.
    pub resume: Option<String>,
    /// What its worker is staged with: its task's selections and the project root they are
    /// read from (as the grant pins it, revalidated at this launch).
    pub stage: Option<Staging>,
    /// The room's project root, revalidated at this launch (none: not a project room; an
    /// error: the root no longer validates), for a route that shows it read-only.
    pub project_root: Option<Result<String, String>>,
    /// What the launching principal's scopes let its worker do, read at this launch.
    pub access: LaunchAccess,
}

/// Tool kinds that say nothing of what the tool does: allowed only with every scope.
const UNKNOWABLE_TOOL_KINDS: [&str; 2] = ["other", "switch_mode"];

/// What a worker may do beyond reading, decided from its principal's scopes when it
/// launches: a root the owner enrolled (no scope list) is bounded by its route alone; a
/// delegated node (a collaboration's role child) writes its working tree and lets its agent
/// edit only while it holds `project:write`, and lets its agent run programs only while it
/// holds `tools:execute`. A scope given later (a plan approved) reaches the next launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchAccess {
    pub project_write: bool,
    pub tools_execute: bool,
}

impl LaunchAccess {
    pub const NOTHING: LaunchAccess = LaunchAccess {
        project_write: false,
        tools_execute: false,
    };

    /// The access of a principal holding `scopes` (none: a root).
    pub fn of(scopes: Option<&[String]>) -> LaunchAccess {
        let holds = |want: &str| scopes.is_none_or(|s| s.iter().any(|h| h == want));
        LaunchAccess {
            project_write: holds("project:write"),
            tools_execute: holds("tools:execute"),
        }
    }

    /// The tool kinds an ACP agent of `route` may be allowed at this launch: the route's
    /// own (none: every kind), less what the scopes do not give. None: any kind.
    ///
    /// The kind is the agent's own label, and an agent labels a tool it has no kind for
    /// `other` (a shell of an MCP server, a multi-file edit): a principal that does not hold
    /// both `project:write` and `tools:execute` is never allowed `other`, nor `switch_mode`
    /// (a mode may be one that asks no more).
    pub fn tool_kinds(&self, route: &crate::policy::Route) -> Option<Vec<String>> {
        use crate::policy::{ACP_TOOL_KINDS, EXECUTE_TOOL_KINDS, WRITE_TOOL_KINDS};
        let full = self.project_write && self.tools_execute;
        if full && route.tool_kinds.is_empty() {
            return None;
        }
        let base: Vec<String> = if route.tool_kinds.is_empty() {
            ACP_TOOL_KINDS.iter().map(|k| k.to_string()).collect()
        } else {
            route.tool_kinds.clone()
        };
        let kept = base.into_iter().filter(|k| {
            (self.project_write || !WRITE_TOOL_KINDS.contains(&k.as_str()))
                && (self.tools_execute || !EXECUTE_TOOL_KINDS.contains(&k.as_str()))
                && (full || !UNKNOWABLE_TOOL_KINDS.contains(&k.as_str()))
        });
        Some(kept.collect())
    }
}

/// A launch's staging: the task's selections, read beneath `root`.
#[derive(Debug, Clone)]
pub struct Staging {
    pub root: String,
    pub selections: Vec<room_core::stage::Selection>,
    /// Why the project's root cannot be staged from now (the launch then fails unstarted).
    pub refused: Option<String>,
}

/// A native session an adapter ran the launch in, as it reported it.
#[derive(Debug, Clone)]
pub struct SessionSeen {
    /// The adapter family (`acp`, or its preset).
    pub host: String,
    pub native: String,
    pub cwd: String,
    pub transport: String,
    /// The agent offered to load it again.
    pub loadable: bool,
}

/// A session's global id: `sf_<host>_<native>`, the native id kept as it is when it is plain
/// (letters, digits, `.`, `_`, `-`, at most 128 bytes) and by its digest otherwise.
pub fn session_id(host: &str, native: &str) -> String {
    let plain = !native.is_empty()
        && native.len() <= 128
        && native
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if plain {
        format!("sf_{host}_{native}")
    } else {
        format!(
            "sf_{host}_h{}",
            &room_core::sha256_hex(native.as_bytes())[..32]
        )
    }
}

/// How a worker process ended, as the dispatcher observed it.
#[derive(Debug, Clone)]
pub struct Exit {
    pub code: Option<i32>,
    pub timed_out: bool,
    /// What the adapter proved about delivery into the agent's own session (a one-shot
    /// process proves nothing beyond its start: `Dispatched`).
    pub delivery: Delivery,
    /// What the adapter reported (an ACP session's id, its stop reason, a cancel), kept with
    /// the launch.
    pub detail: Value,
    /// What stopping the worker's owned job observed (its kind, whether zero processes were
    /// seen), kept with the launch.
    pub job: Value,
    /// The native session the launch ran in, where the adapter has sessions.
    pub session: Option<SessionSeen>,
}

impl Exit {
    /// A process that ran (or not) with nothing proven about its session.
    pub fn process(code: Option<i32>, timed_out: bool) -> Exit {
        Exit {
            code,
            timed_out,
            delivery: Delivery::Dispatched,
            detail: Value::Null,
            job: Value::Null,
            session: None,
        }
    }
}

/// The rungs of the proof ladder below `replied`, as an adapter observed them. Only what
/// the adapter saw is claimed: a one-shot process stays `Dispatched` whatever it printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// An attempt exists; nothing shows the prompt reached the agent (`delivery_unproven`).
    Dispatched,
    /// The bound session took the prompt (it streamed an update for it, or was cancelled
    /// in it) but did not finish its turn.
    DeliveredToBody,
    /// The bound session finished its turn on the prompt: it has seen the work; a reply is
    /// still owed.
    BodyVisible,
    /// A session other than the bound one spoke for the prompt: refused, no credit.
    WrongBody,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Dispatched => "dispatched",
            Delivery::DeliveredToBody => "delivered_to_body",
            Delivery::BodyVisible => "body_visible_pending_reply",
            Delivery::WrongBody => "wrong_body_rejected",
        }
    }
}

/// The outcome, the proof rung and the permit's next state of an ended launch.
pub(crate) fn judge(replied: bool, exit: &Exit) -> (&'static str, &'static str, &'static str) {
    if replied || (crate::planted::bug("04-C09") && exit.code == Some(0)) {
        return ("replied", "replied", "replied");
    }
    let proof = exit.delivery.as_str();
    match exit {
        // a session that was not the bound one gets no credit, whatever it did
        Exit {
            delivery: Delivery::WrongBody,
            ..
        } => ("wrong_body_rejected", proof, "failed"),
        Exit {
            timed_out: true, ..
        } => ("timed_out", proof, "failed"),
        Exit {
            delivery: Delivery::BodyVisible,
            ..
        } => ("body_visible_pending_reply", proof, "pending_reply"),
        Exit { code: Some(0), .. } => ("process_exit_only", proof, "pending_reply"),
        _ => ("failed", proof, "failed"),
    }
}

pub(crate) fn end(
    at_ms: u64,
    outcome: &str,
    proof: &str,
    detail: Option<String>,
    wake_state: &str,
) -> LaunchEnd {
    LaunchEnd {
        at_ms,
        outcome: outcome.into(),
        proof: proof.into(),
        detail,
        wake_state: wake_state.into(),
        session: None,
    }
}

/// Workers live now: in all, and per model route (by the route their agent has now).
#[derive(Debug, Default)]
struct RouteLoad {
    total: usize,
    per_model_route: std::collections::BTreeMap<String, usize>,
}

impl RouteLoad {
    fn add(&mut self, route: Option<&crate::policy::Route>) {
        self.total += 1;
        if let Some(m) = route.and_then(|r| r.model_route.as_ref()) {
            *self.per_model_route.entry(m.clone()).or_default() += 1;
        }
    }

    /// The model route `route` draws on, when its bound is reached.
    fn full<'r>(
        &self,
        route: &'r crate::policy::Route,
        bounds: &std::collections::BTreeMap<String, usize>,
    ) -> Option<&'r str> {
        let m = route.model_route.as_deref()?;
        // the loader refuses a route naming no declared model route
        let bound = bounds.get(m).copied().unwrap_or(0);
        (self.per_model_route.get(m).copied().unwrap_or(0) >= bound).then_some(m)
    }
}

impl Engine {
    /// One dispatch pass over the permits of routed agents, oldest first: start a launch for each
    /// that revalidates, whose recipient is not busy with another launch and is past its
    /// cooldown (`recipient_busy` defers, never drops), while fewer than `[dispatch]
    /// workers_max` workers run and fewer than its model route's bound run on that model route
    /// (`worker_route_capacity` defers). One that fails revalidation is left to the sweep,
    /// which dead-letters it with its reason.
    pub fn dispatch_take(&self) -> Outcome<Vec<Launch>> {
        self.dispatch_take_unless(None)
    }

    /// `dispatch_take`, unless the daemon holds every launch for `hold` (a code such as
    /// `state_dir_space_low`, found by what the engine cannot see: the disk): then every
    /// permit that would start is deferred with that code, never dropped.
    pub fn dispatch_take_unless(&self, hold: Option<&'static str>) -> Outcome<Vec<Launch>> {
        // without routes nothing launches: a call that queued a permit costs nothing more
        let policy = self.policy();
        let routes = policy.routes.clone();
        if routes.is_empty() {
            self.deferrals.replace(Default::default());
            return Ok(Vec::new());
        }
        self.flush_wakes();
        let now = self.now_ms();
        // the oldest permit of each routed agent (one launch per recipient per pass): a
        // busy agent's backlog never hides a free agent's permit behind it
        let mut rows = Vec::new();
        for agent in routes.keys() {
            rows.extend(
                self.control()
                    .wakes_queued_of(std::slice::from_ref(agent), 1)
                    .map_err(store_err)?,
            );
        }
        rows.sort_by(|a, b| (a.created_ms, &a.agent).cmp(&(b.created_ms, &b.agent)));
        // one dispatch pass and one session's take at a time: one launch per recipient
        let _one = self.takes.lock().unwrap_or_else(|e| e.into_inner());
        // workers (processes and API loops): a session launch runs none and takes no
        // worker's place
        let live = self.control().launches_live().map_err(store_err)?;
        let mut load = RouteLoad::default();
        for l in live.iter().filter(|l| l.conversation.is_none()) {
            load.add(routes.get(&l.agent));
        }
        let mut out: Vec<Launch> = Vec::new();
        let mut deferred = std::collections::BTreeMap::new();
        for w in rows {
            let Some(route) = routes.get(&w.agent) else {
                continue;
            };
            let why = if let Some(code) = hold {
                Some(Deferral {
                    code,
                    model_route: None,
                })
            } else if out.iter().any(|l| l.agent == w.agent)
                || self.recipient_busy(&w.agent, now)?
            {
                Some(Deferral {
                    code: "recipient_busy",
                    model_route: None,
                })
            } else if load.total >= policy.workers_max || out.len() >= LAUNCHES_PER_PASS_MAX {
                Some(Deferral {
                    code: "worker_route_capacity",
                    model_route: None,
                })
            } else {
                load.full(route, &policy.model_routes).map(|m| Deferral {
                    code: "worker_route_capacity",
                    model_route: Some(m.to_string()),
                })
            };
            if let Some(why) = why {
                deferred.insert(wake_path(&w.room, &w.agent, &w.source_event), why);
                continue;
            }
            let permit = match self.revalidate(&w, now) {
                Ok(p) => p,
                // the next sweep dead-letters it with its reason
                Err(_) => continue,
            };
            let started = self.start_launch(&w, permit, route, now)?;
            if started.is_some() {
                load.add(Some(route));
            }
            out.extend(started);
        }
        self.deferrals.replace(deferred);
        Ok(out)
    }

    /// Another launch of the agent runs, or its last ended less than `COOLDOWN_MS` ago.
    fn recipient_busy(&self, agent: &str, now: u64) -> Outcome<bool> {
        let recent = self.control().launches_of(agent, 1).map_err(store_err)?;
        Ok(recent.first().is_some_and(|l| {
            l.state != "ended"
                || l.ended_ms
                    .is_some_and(|e| now < e.saturating_add(COOLDOWN_MS))
        }))
    }

    fn start_launch(
        &self,
        w: &WakeRow,
        permit: WakePermit,
        route: &crate::policy::Route,
        now: u64,
    ) -> Outcome<Option<Launch>> {
        let id = format!("lch_{}", self.env.entropy.hex(8));
        // the room's cancel generation it starts under: a cancel after this stops it
        let room_gen = self
            .control()
            .room(&w.room)
            .map_err(store_err)?
            .map_or(0, |r| r.cancel_gen);
        let token = format!("{WORKER_TOKEN_PREFIX}{}", self.env.entropy.hex(32));
        let due = w.created_ms.saturating_add(permit.binding.deadline_ms);
        let not_after = due.min(now.saturating_add(route.timeout_ms));
        let b = &permit.binding;
        let evidence = self.wake_evidence(b, &id, now)?;
        let stage = self.launch_staging(b.task.as_deref())?;
        // the control guard must be gone before revalidation takes it again
        let project = self
            .control()
            .room(&w.room)
            .map_err(store_err)?
            .and_then(|r| r.project_id);
        let project_root = project.map(|pid| {
            self.revalidate_project(&pid)
                .map(|p| p.canonical_root)
                .map_err(|r| r.to_string())
        });
        // an agent whose row is gone gets nothing beyond reading (revalidation refuses it
        // before this; fail closed all the same)
        let access = self
            .control()
            .agent(&w.agent)
            .map_err(store_err)?
            .map_or(LaunchAccess::NOTHING, |a| {
                LaunchAccess::of(a.scopes.as_deref())
            });
        let resume = match route.spawn_policy.as_deref() {
            Some("never") => self
                .control()
                .session_bound(&w.agent)
                .map_err(store_err)?
                .map(|s| s.native),
            _ => None,
        };
        let row = room_store::control::LaunchRow {
            id: id.clone(),
            room: w.room.clone(),
            agent: w.agent.clone(),
            source_event: w.source_event.clone(),
            secret_sha256: room_core::sha256_hex(token.as_bytes()),
            permit_sha256: permit.binding_sha256.clone(),
            state: "starting".into(),
            pid: None,
            created_ms: now,
            not_after_ms: not_after,
            ended_ms: None,
            outcome: None,
            proof: None,
            detail: None,
            delivery: evidence.as_ref().map(Value::to_string),
            started_ms: None,
            control_epoch: b.control_epoch,
            cancel_gen: room_gen,
            conversation: None,
            severed: None,
        };
        if !self.control().insert_launch(&row).map_err(store_err)? {
            // taken in its agent's own session or dead-lettered since it was revalidated
            return Ok(None);
        }
        let mut prompt = json!({"launch": id, "room": b.room, "agent": b.agent, "from": b.from,
            "task": b.task, "source_event": b.source_event, "prompt": b.prompt,
            "mention_ids": b.mention_ids, "obligation_ids": b.obligation_ids,
            "not_after_ms": not_after, "binding_sha256": permit.binding_sha256});
        if let Some(e) = evidence {
            prompt["evidence"] = e;
        }
        Ok(Some(Launch {
            id,
            token,
            room: w.room.clone(),
            agent: w.agent.clone(),
            route: route.clone(),
            prompt,
            deadline_ms: not_after.saturating_sub(now),
            resume,
            stage,
            project_root,
            access,
        }))
    }

    /// The evidence a wake cites, served to its recipient at wake time with a fresh
    /// `wake_delivery` receipt: admitted passages inline, withheld ones named as withheld.
    pub(crate) fn wake_evidence(
        &self,
        b: &room_core::wake::WakeBinding,
        launch: &str,
        now: u64,
    ) -> Outcome<Option<Value>> {
        let Some(refs) = b.evidence_refs.as_deref().filter(|r| !r.is_empty()) else {
            return Ok(None);
        };
        let (served, withheld) = self.deliver_evidence(&b.room, refs)?;
        Ok(Some(
            json!({"schema": "room.evidence.receipt/1", "tool": "wake_delivery",
            "id": format!("srv_{}", self.env.entropy.hex(16)), "launch": launch,
            "recipient": b.agent, "at_ms": now, "served": served,
            "withheld": withheld}),
        ))
    }

    /// The staging of a tasked launch whose task selects sources: the project root is
    /// revalidated now (a redirected root is refused here, not staged from).
    fn launch_staging(&self, task: Option<&str>) -> Outcome<Option<Staging>> {
        let Some(t) = task else { return Ok(None) };
        let Some(t) = self.control().task(t).map_err(store_err)? else {
            return Ok(None);
        };
        let (Some(pid), false) = (t.project_id.as_deref(), t.stage.is_empty()) else {
            return Ok(None);
        };
        let (root, refused) = match self.revalidate_project(pid) {
            Ok(p) => (p.canonical_root, None),
            Err(r) => (String::new(), Some(r.to_string())),
        };
        Ok(Some(Staging {
            root,
            selections: t.stage,
            refused,
        }))
    }

    /// The session a launch ran in, as the factory keeps it. The route as it stands at the
    /// launch's end decides the binding (an edit bites on the next end).
    pub(crate) fn session_row(
        &self,
        l: &room_store::control::LaunchRow,
        s: &SessionSeen,
        proof: &str,
        now: u64,
    ) -> room_store::control::SessionRow {
        let policy = self.policy();
        let route = policy.routes.get(&l.agent);
        let never = route.and_then(|r| r.spawn_policy.as_deref()) == Some("never");
        // the profile Room ran it under: what the route asked for, never what a model claimed
        let model = route.map(|r| {
            json!({"adapter": r.adapter, "preset": r.preset, "model": r.model}).to_string()
        });
        room_store::control::SessionRow {
            id: session_id(&s.host, &s.native),
            agent: l.agent.clone(),
            host: s.host.clone(),
            native: s.native.clone(),
            cwd: s.cwd.clone(),
            transport: s.transport.clone(),
            model: if l.conversation.is_some() {
                None
            } else {
                model
            },
            proof: proof.into(),
            parent: None,
            launch: l.id.clone(),
            launches: 1,
            loadable: s.loadable,
            bound: never,
            created_ms: now,
            updated_ms: now,
            tags: route.map(|r| r.tags.clone()).unwrap_or_default(),
        }
    }

    /// The split-lock claim of a started process: the permit is read again and must still be
    /// the sealed one and valid, with time left; only then does the launch run (and its
    /// credential work). Otherwise the launch ends `wake_job_changed_during_validation` and
    /// the dispatcher stops the process.
    pub fn launch_started(&self, id: &str, pid: Option<u32>) -> Outcome<()> {
        let now = self.now_ms();
        let l = self
            .control()
            .launch(id)
            .map_err(store_err)?
            .ok_or_else(|| refuse(Code::NotFound, format!("no launch {id}")))?;
        let w = self
            .control()
            .wake(&l.room, &l.agent, &l.source_event)
            .map_err(store_err)?;
        let still = w.and_then(|w| {
            let mut queued = w.clone();
            queued.state = room_store::control::WAKE_QUEUED.into();
            self.revalidate(&queued, now).ok()
        });
        match still {
            Some(p) if p.binding_sha256 == l.permit_sha256 && now < l.not_after_ms => {
                if self
                    .control()
                    .launch_running(id, pid, now)
                    .map_err(store_err)?
                {
                    return Ok(());
                }
                Err(refuse(
                    Code::WakeJobChangedDuringValidation,
                    format!("launch {id} was not starting any more"),
                ))
            }
            _ => {
                let e = end(
                    now,
                    "wake_job_changed_during_validation",
                    "dispatched",
                    None,
                    "dead",
                );
                self.control().launch_ended(id, &e).map_err(store_err)?;
                Err(refuse(
                    Code::WakeJobChangedDuringValidation,
                    format!("the permit of launch {id} changed or lapsed while it started"),
                ))
            }
        }
    }

    /// A launch's process ended: what was proven. `replied` when every obligation of the
    /// permit (or, without any, every mention) was resolved by the worker's own turns (its
    /// launch's conversation); otherwise the adapter's rung: `wrong_body_rejected` (another
    /// session spoke; no credit), `timed_out`, `body_visible_pending_reply` (the bound
    /// session finished its turn without a reply), `process_exit_only` for an exit 0, or
    /// `failed`. The permit stays `pending_reply` where a reply may still come. The
    /// credential stops working either way.
    pub fn launch_ended(&self, id: &str, exit: Exit) -> Outcome<Value> {
        let now = self.now_ms();
        let l = self
            .control()
            .launch(id)
            .map_err(store_err)?
            .ok_or_else(|| refuse(Code::NotFound, format!("no launch {id}")))?;
        let replied = self.replied_by_launch(&l)?;
        let (outcome, proof, wake_state) = judge(replied, &exit);
        let detail = (!exit.detail.is_null() || !exit.job.is_null())
            .then(|| json!({"adapter": exit.detail, "job": exit.job}).to_string());
        let mut e = end(now, outcome, proof, detail, wake_state);
        e.session = exit
            .session
            .as_ref()
            .map(|s| self.session_row(&l, s, proof, now));
        self.control().launch_ended(id, &e).map_err(store_err)?;
        Ok(
            json!({"launch": id, "outcome": outcome, "proof": proof, "exit_code": exit.code,
            "timed_out": exit.timed_out, "adapter": exit.detail, "job": exit.job}),
        )
    }

    /// A launch the observer stopped because its authority tripped (`reason`), recorded with
    /// the stop and what the job showed: `stopped` unless its own turns replied before, and
    /// its permit dead (never retried); its obligations stay open.
    pub fn launch_stopped(&self, id: &str, reason: &str, stop: &str, job: Value) -> Outcome<Value> {
        let now = self.now_ms();
        let l = self
            .control()
            .launch(id)
            .map_err(store_err)?
            .ok_or_else(|| refuse(Code::NotFound, format!("no launch {id}")))?;
        let replied = self.replied_by_launch(&l)?;
        let (outcome, wake_state) = if replied {
            ("replied", "replied")
        } else {
            ("stopped", "dead")
        };
        let proof = if replied { "replied" } else { "dispatched" };
        let detail = json!({"stopped": {"reason": reason, "stop": stop}, "job": job});
        let e = end(now, outcome, proof, Some(detail.to_string()), wake_state);
        // a launch its refused claim ended keeps that end; its stop is in the outbox and the
        // journal (`worker_stop`), not on the row
        let recorded = self.control().launch_ended(id, &e).map_err(store_err)?;
        Ok(
            json!({"launch": id, "outcome": outcome, "reason": reason, "stop": stop, "job": job,
            "recorded_on_launch": recorded}),
        )
    }

    /// Whether what the launch's permit asked for is resolved by turns of the launch's own
    /// conversation (a reply from the bound worker, not from someone else).
    pub(crate) fn replied_by_launch(&self, l: &room_store::control::LaunchRow) -> Outcome<bool> {
        let Some(w) = self
            .control()
            .wake(&l.room, &l.agent, &l.source_event)
            .map_err(store_err)?
        else {
            return Ok(false);
        };
        let Ok(p) = serde_json::from_str::<WakePermit>(&w.permit) else {
            return Ok(false);
        };
        let agent = self.control().agent(&l.agent).map_err(store_err)?;
        let Some(agent) = agent else { return Ok(false) };
        let key = room_core::canon::digest_of(&json!({
            "instance": self.state.instance_id, "actor": l.agent,
            "registration": agent.registration_sha256, "conversation": launch_conversation(l),
            "room": l.room,
        }));
        let handle = self.room_handle(&l.room)?;
        let h = crate::lock_room(&handle);
        // what the wake asked for: its obligations, or, for a wake without any, its mentions
        let b = &p.binding;
        let items: Vec<(room_store::index::ItemKind, &String)> = if b.obligation_ids.is_empty() {
            b.mention_ids
                .iter()
                .map(|m| (room_store::index::ItemKind::Mention, m))
                .collect()
        } else {
            b.obligation_ids
                .iter()
                .map(|o| (room_store::index::ItemKind::Obligation, o))
                .collect()
        };
        let mut any = false;
        for (kind, item) in items {
            any = true;
            let Some(row) = h.index.item(kind, item).map_err(store_err)? else {
                return Ok(false);
            };
            let Some(by) = row.resolved_by.filter(|_| row.status != "open") else {
                return Ok(false);
            };
            let Some(ev) = h.index.event_by_id(&by).map_err(store_err)? else {
                return Ok(false);
            };
            let body: Value = serde_json::from_str(&ev.body).map_err(Refusal::storage)?;
            if ev.actor != l.agent || body["conversation_key"] != key.as_str() {
                return Ok(false);
            }
        }
        Ok(any)
    }

    /// The running launch a worker token belongs to, if it is one: `None` for any other
    /// token; refused when the launch is not running or its time is up.
    pub(crate) fn worker_launch(
        &self,
        token: &str,
    ) -> Outcome<Option<room_store::control::LaunchRow>> {
        if !token.starts_with(WORKER_TOKEN_PREFIX) {
            return Ok(None);
        }
        let digest = room_core::sha256_hex(token.as_bytes());
        let l = self
            .control()
            .launch_by_secret(&digest)
            .map_err(store_err)?
            .ok_or_else(|| refuse(Code::CredentialInvalid, "credential is not known".into()))?;
        if l.state != RUNNING || self.now_ms() > l.not_after_ms {
            return Err(refuse(
                Code::CredentialRevoked,
                format!("the credential of launch {} ended with its launch", l.id),
            ));
        }
        Ok(Some(l))
    }

    /// Whether launch `id` still acts for its agent: running, the agent not revoked, the permit
    /// it was claimed with still the queue's. Its broker asks between the chunks of a response.
    pub fn launch_stands(&self, id: &str) -> Outcome<()> {
        let c = self.control();
        let l = c
            .launch(id)
            .map_err(store_err)?
            .ok_or_else(|| refuse(Code::NotFound, format!("no launch {id}")))?;
        let revoked = |why: String| refuse(Code::CredentialRevoked, why);
        if l.state != RUNNING || self.now_ms() > l.not_after_ms {
            return Err(revoked(format!("launch {id} is {}", l.state)));
        }
        if !permit_stands(&**c, &l)? {
            return Err(revoked(format!(
                "the permit launch {id} was claimed with changed"
            )));
        }
        if let Some(t) = launch_task_cancelled(&**c, &l)? {
            return Err(revoked(format!(
                "launch {id} worked on task {t}, which was cancelled"
            )));
        }
        match c.agent(&l.agent).map_err(store_err)? {
            Some(a) if a.revoked_ms.is_none() => Ok(()),
            _ => Err(revoked(format!("{} is revoked", l.agent))),
        }
    }

    /// A broker response cut off mid-write because launch `id` stopped standing: recorded on
    /// the launch (the first one), never followed by another frame.
    pub fn launch_severed(&self, id: &str, detail: Value) -> Outcome<bool> {
        let mut detail = detail;
        detail["code"] = json!("severed_mid_response");
        detail["at_ms"] = json!(self.now_ms());
        self.control()
            .launch_severed(id, &detail.to_string())
            .map_err(store_err)
    }

    /// A launch whose job was stopped but not seen empty: `unconfirmed`. Its credential stops
    /// working at once; it stays live (its recipient busy, a worker counted against the
    /// capacity) until a later stop sees zero processes and `launch_ended` ends it. A kill
    /// request is never taken for quiescence.
    pub fn launch_unconfirmed(&self, id: &str, job: Value) -> Outcome<bool> {
        let detail = json!({"job": job}).to_string();
        self.control()
            .launch_unconfirmed(id, &detail)
            .map_err(store_err)
    }

    /// Launches a previous daemon left starting, running or unconfirmed: their processes are
    /// not ours any more (the daemon has ended what its jobs still held), so they end
    /// `interrupted` and their credentials stop working.
    pub fn recover_launches(&self) -> Outcome<usize> {
        self.recover_launches_with(&Default::default())
    }

    /// `recover_launches`, where the daemon could not see the jobs of `unconfirmed` (launch
    /// ids) emptied: those end `interrupted` too (their credentials stop working), and their
    /// record says that processes of them may still run, never that they stopped.
    pub fn recover_launches_with(
        &self,
        unconfirmed: &std::collections::BTreeSet<String>,
    ) -> Outcome<usize> {
        let live = self.control().launches_live().map_err(store_err)?;
        let now = self.now_ms();
        for l in &live {
            let detail = unconfirmed.contains(&l.id).then(|| {
                json!({"termination": "unconfirmed",
                    "why": "the job a previous daemon left could not be seen empty at this start: processes of it may still run"})
                .to_string()
            });
            let e = end(now, "interrupted", "dispatched", detail, "failed");
            self.control().launch_ended(&l.id, &e).map_err(store_err)?;
        }
        Ok(live.len())
    }
}

/// Whether the permit a launch was claimed with still stands in the queue: present, not dead,
/// intact (its digest matches its sealed fields) and the very one the launch pinned.
pub(crate) fn permit_stands(
    c: &dyn room_store::ControlStore,
    l: &room_store::control::LaunchRow,
) -> Outcome<bool> {
    let w = c
        .wake(&l.room, &l.agent, &l.source_event)
        .map_err(store_err)?;
    Ok(w.is_some_and(|w| {
        w.state != "dead"
            && serde_json::from_str::<WakePermit>(&w.permit)
                .is_ok_and(|p| p.intact() && p.binding_sha256 == l.permit_sha256)
    }))
}

/// The task a launch works on, or an ancestor of it, that its owner cancelled: the launch's
/// work is withdrawn, so its worker is stopped (a trip) and its calls are refused. None when
/// its permit names no task or the chain holds no cancelled task.
pub(crate) fn launch_task_cancelled(
    c: &dyn room_store::ControlStore,
    l: &room_store::control::LaunchRow,
) -> Outcome<Option<String>> {
    let Some(w) = c
        .wake(&l.room, &l.agent, &l.source_event)
        .map_err(store_err)?
    else {
        return Ok(None);
    };
    let Some(mut next) = serde_json::from_str::<WakePermit>(&w.permit)
        .ok()
        .and_then(|p| p.binding.task)
    else {
        return Ok(None);
    };
    for _ in 0..=crate::lineage::ANCESTRY_DEPTH_MAX {
        let Some(t) = c.task(&next).map_err(store_err)? else {
            return Ok(None);
        };
        if t.status == TaskStatus::Cancelled {
            return Ok(Some(t.id));
        }
        match t.parent {
            Some(p) => next = p,
            None => return Ok(None),
        }
    }
    Ok(None)
}

/// The native conversation a launch's worker acts in: its correlation key.
pub fn worker_conversation(launch: &str) -> String {
    format!("wake:{launch}")
}

/// The conversation whose turns answer a launch: the agent's own session for a session launch,
/// the worker's `wake:<launch>` otherwise.
pub(crate) fn launch_conversation(l: &room_store::control::LaunchRow) -> String {
    l.conversation
        .clone()
        .unwrap_or_else(|| worker_conversation(&l.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>, timed_out: bool, delivery: Delivery) -> Exit {
        Exit {
            delivery,
            ..Exit::process(code, timed_out)
        }
    }

    #[test]
    fn the_journal_s_reply_outranks_every_rung_and_a_wrong_body_outranks_the_rest() {
        use Delivery::*;
        let cases = [
            (
                true,
                exit(None, true, WrongBody),
                ("replied", "replied", "replied"),
            ),
            (
                false,
                exit(Some(0), true, WrongBody),
                ("wrong_body_rejected", "wrong_body_rejected", "failed"),
            ),
            (
                false,
                exit(Some(0), true, BodyVisible),
                ("timed_out", "body_visible_pending_reply", "failed"),
            ),
            (
                false,
                exit(Some(0), false, BodyVisible),
                (
                    "body_visible_pending_reply",
                    "body_visible_pending_reply",
                    "pending_reply",
                ),
            ),
            (
                false,
                exit(Some(0), false, Dispatched),
                ("process_exit_only", "dispatched", "pending_reply"),
            ),
            (
                false,
                exit(Some(1), false, DeliveredToBody),
                ("failed", "delivered_to_body", "failed"),
            ),
            (
                false,
                exit(None, false, Dispatched),
                ("failed", "dispatched", "failed"),
            ),
        ];
        for (replied, e, want) in cases {
            assert_eq!(judge(replied, &e), want, "{e:?}");
        }
    }
}
