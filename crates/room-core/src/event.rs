//! The journal's event schema: the domain events a room's journal carries, as the journal
//! stores them (canonical JSON). Every reader of journals (the engine's projection, the
//! simulator's oracle, a dashboard) shares these types without depending on the engine. The
//! serde attributes are the on-disk format: journals are hash-chained, so a change to any of
//! them must keep every written event's canonical JSON byte-identical.

use crate::Verb;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum Binding {
    Coordination,
    Project { id: String },
}

impl Binding {
    pub fn project(&self) -> Option<&str> {
        match self {
            Binding::Coordination => None,
            Binding::Project { id } => Some(id),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventBody {
    RoomCreated {
        actor: String,
        room: String,
        binding: Binding,
        members: Vec<String>,
    },
    MemberAdded {
        actor: String,
        agent: String,
    },
    RoomReset {
        actor: String,
    },
    /// The owner opened or closed the room's admission: while closed, no agent writes to it.
    /// A change moves the room's view (every reader reads again).
    Admission {
        actor: String,
        open: bool,
    },
    /// A control actor (the owner console or an operator agent) cancelled the room: its
    /// dispatcher stops, queued permits are dead-lettered (never retried), running workers
    /// are stopped, and `held` lists what may already have reached a destination and stays
    /// held until an operator reconciles it. `by` is what the caller said it acted for:
    /// recorded, it confers nothing.
    RoomCancelled {
        actor: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        held: Vec<Held>,
    },
    /// A control actor let a cancelled room dispatch again.
    RoomResumed {
        actor: String,
    },
    /// An operator resolved a held item with evidence: what the destination shows, never a
    /// rewrite of what the worker recorded.
    Reconciled {
        actor: String,
        hold: String,
        outcome: String,
        evidence: String,
    },
    /// The two-phase stop outbox: phase 1 (`termination_confirmed: false`) is committed before
    /// a worker's job is killed, phase 2 (`termination_confirmed: true`, naming phase 1 as its
    /// predecessor) only once zero processes were observed in the job.
    WorkerStop(Box<WorkerStop>),
    /// The owner accepted that acknowledged records `missing_from..=missing_to` are gone from
    /// the journal (`room index rebuild --accept-loss`); the witnesses that showed they had been
    /// acknowledged. Resets the room's view like `room_reset`: every reader reads again.
    JournalLoss {
        actor: String,
        missing_from: u64,
        missing_to: u64,
        witnesses: Vec<SeqWitness>,
    },
    Turn(Box<Turn>),
    /// Flush 2 of a turn: the mention and obligation records its flush 1 implies.
    Items(Items),
    Task(Box<TaskEvent>),
    /// The destination ledger: one phase of an external operation.
    Op(Box<OpEvent>),
    /// A piece of evidence registered with its first-hand origin or its lineage.
    Evidence(Box<EvidenceEvent>),
    /// A runtime invariant's verdict (see `invariants`): a rejected act (its envelope never
    /// committed), a flag beside a committed one, or an in-doubt lapse.
    InvariantViolation(Violation),
    /// A change of a collaboration's delegated identity tree, journaled in its room so an
    /// audit can replay the tree: an identity minted under its parent with its scopes, or a
    /// node revoked with its whole subtree.
    Identity(Box<IdentityChange>),
    /// Something a collaboration's scheduler saw in an agent's turn that the person must see
    /// (`dispatch_announced_not_made`: an orchestrator's words announced a dispatch the same
    /// turn did not make). Recorded, it changes nothing.
    CollabFlag(Box<CollabFlag>),
}

/// See `EventBody::CollabFlag`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollabFlag {
    pub actor: String,
    pub collab: String,
    /// A stable snake_case code.
    pub code: String,
    /// The agent whose turn it concerns.
    pub agent: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

/// See `EventBody::Identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityChange {
    pub actor: String,
    /// `minted`, `revoked`, or `widened` (a plan approved: the scopes its collaboration held
    /// back given to it; `scopes` is what it holds now).
    pub action: String,
    pub principal: String,
    /// Its parent in the tree (minted; none: a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The scopes it holds (minted; none: a root bounded by its tier only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tier: Option<String>,
    /// Every identity the revocation ended (revoked: the node and its subtree).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtree: Vec<String>,
}

/// Something a cancel found unresolved that a destination may already have accepted: held
/// until an operator reconciles it (`hold` is its id, `kind` one of `destination_operation`,
/// `model_request`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub hold: String,
    pub kind: String,
    /// The operation id or launch id it holds.
    pub item: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// One phase of a stop in the outbox (see `EventBody::WorkerStop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerStop {
    pub actor: String,
    /// `stp_<32hex>`: the outbox directory of this stop.
    pub stop: String,
    /// 1 or 2.
    pub phase: u8,
    pub launch: String,
    pub agent: String,
    /// Why the worker's authority tripped (`room_cancelled`, `admission_closed`, …).
    pub reason: String,
    pub termination_confirmed: bool,
    /// Phase 1's bounded pending reason; none in phase 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// Phase 2 names the exact phase-1 record it follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predecessor: Option<StopPredecessor>,
    /// What the kernel object showed (phase 2): its kind, processes seen, how long it took.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub observed: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopPredecessor {
    pub event_id: String,
    /// SHA-256 of phase 1's envelope (the canonical JSON of its event body).
    pub envelope_sha256: String,
}

/// A durable witness of an acknowledged seq: where it was read (`index_tip`, `receipts`,
/// `checkpoints`, `wakes_mark`, `wake_queue`, `room_reset`) and the highest seq it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqWitness {
    pub source: String,
    pub seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Invariant {
    ExactlyOnce,
    WellFormed,
    Exclusive,
    Causal,
    Resolution,
    /// Not one of the five: a task closed while subtasks of it are unsettled (flagged).
    /// Journals before this variant recorded it as `causal`.
    ChildrenOpen,
}

impl Invariant {
    pub fn as_str(self) -> &'static str {
        match self {
            Invariant::ExactlyOnce => "exactly_once",
            Invariant::WellFormed => "well_formed",
            Invariant::Exclusive => "exclusive",
            Invariant::Causal => "causal",
            Invariant::Resolution => "resolution",
            Invariant::ChildrenOpen => "children_open",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The act was refused and its envelope not committed.
    Reject,
    /// The act was committed; the condition is surfaced beside it.
    Flag,
    /// An intention outlived its TTL unresolved: neither success nor failure.
    InDoubt,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// The agent whose act or intention it concerns.
    pub actor: String,
    pub invariant: Invariant,
    pub severity: Severity,
    /// The act: a verb or task operation name.
    pub act: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The committed event a flag stands beside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
    /// The audience of the turn a flag stands beside (empty: every reader).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
}

/// Text that spilled into a blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    pub sha256: String,
    pub bytes: u64,
    pub preview: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    pub id: String,
    pub item: ItemKind,
    /// The item's new status (`resolved`, `declined`).
    pub status: String,
}

/// The two kinds of item a turn's flush 2 creates for its recipients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    Mention,
    Obligation,
}

impl ItemKind {
    pub const ALL: [ItemKind; 2] = [ItemKind::Mention, ItemKind::Obligation];

    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Mention => "mention",
            ItemKind::Obligation => "obligation",
        }
    }

    /// The prefix of this kind's item ids (see `item_id`).
    pub fn prefix(self) -> &'static str {
        match self {
            ItemKind::Mention => MENTION_PREFIX,
            ItemKind::Obligation => OBLIGATION_PREFIX,
        }
    }
}

impl std::fmt::Display for ItemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task's status, stored as its snake_case name (in task transitions and control.db rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Created or handed off: waiting for its recipient (or anyone, when it has none) to claim it.
    Open,
    /// Held by its recipient, who began a lifecycle on it.
    Claimed,
    /// Its recipient cannot go on; a claim resumes it.
    Blocked,
    Done,
    /// Its recipient refused the assignment.
    Declined,
    /// Replaced by a verified successor, which carries its obligations to completion.
    Superseded,
    /// Withdrawn by its owner: its lease is released and its open items resolve as cancelled.
    Cancelled,
}

impl TaskStatus {
    pub const ALL: [TaskStatus; 7] = [
        TaskStatus::Open,
        TaskStatus::Claimed,
        TaskStatus::Blocked,
        TaskStatus::Done,
        TaskStatus::Declined,
        TaskStatus::Superseded,
        TaskStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Open => "open",
            TaskStatus::Claimed => "claimed",
            TaskStatus::Blocked => "blocked",
            TaskStatus::Done => "done",
            TaskStatus::Declined => "declined",
            TaskStatus::Superseded => "superseded",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<TaskStatus> {
        TaskStatus::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Done, declined, superseded or cancelled: no verb moves the task any more.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            TaskStatus::Done
                | TaskStatus::Declined
                | TaskStatus::Superseded
                | TaskStatus::Cancelled
        )
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a turn's flush 2 must create, fixed in flush 1 so completion after a crash is exact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ItemPlan {
    /// Recipients that get a mention.
    pub mention: Vec<String>,
    /// Recipients that get an obligation.
    pub oblige: Vec<String>,
    /// Recipients that get a sealed wake permit.
    pub wake: Vec<String>,
    /// Milliseconds since epoch after which the obligations and wakes lapse.
    pub not_after_ms: u64,
    pub deadline_ms: u64,
}

/// What each recipient of a turn gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deliver {
    pub mention: bool,
    pub oblige: bool,
    pub wake: bool,
}

impl Deliver {
    /// An assignment: a mention, an obligation to answer, and a wake.
    pub const ASSIGN: Deliver = Deliver {
        mention: true,
        oblige: true,
        wake: true,
    };
    /// A notice that wakes but asks for nothing.
    pub const NOTIFY: Deliver = Deliver {
        mention: true,
        oblige: false,
        wake: true,
    };
    /// An inbox entry only.
    pub const INBOX: Deliver = Deliver {
        mention: true,
        oblige: false,
        wake: false,
    };
}

impl ItemPlan {
    /// The same delivery for every recipient, lapsing `deadline_ms` after `now_ms`.
    pub fn to(recipients: &[String], what: Deliver, now_ms: u64, deadline_ms: u64) -> ItemPlan {
        let pick = |on: bool| if on { recipients.to_vec() } else { vec![] };
        ItemPlan {
            mention: pick(what.mention),
            oblige: pick(what.oblige),
            wake: pick(what.wake),
            not_after_ms: now_ms + deadline_ms,
            deadline_ms,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.mention.is_empty() && self.oblige.is_empty() && self.wake.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub actor: String,
    pub verb: Verb,
    /// Digest of the author's conversation key (for audits; never the raw conversation).
    pub conversation_key: String,
    /// The view (a digest) the author's gate passed under: with `conversation_key`, it lets
    /// the Fold Rule be re-derived from the journal (`index::FoldAdvance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_gen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_blob: Option<BlobRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolves: Vec<Resolution>,
    #[serde(default, skip_serializing_if = "ItemPlan::is_empty")]
    pub plan: ItemPlan,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_transition: Option<TaskTransition>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
    /// The caller's key for `exactly_once`: a repeat of a registered key is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Invariant flags raised by this turn. Each is also written as its own
    /// `invariant_violation` record right after the turn, in the same append; if a crash cuts
    /// them off, the next start writes them from here (as it completes a flush 2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<Violation>,
    /// The members who read this turn (its author always among them), or empty for every
    /// reader of the room: what was asked, narrowed by the audience of every causal parent
    /// (the withholding closure, `room_engine::visibility`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
    /// A blackboard write: the turn is this artifact version's index entry (its content is in
    /// the blob `sha256` names; its parents are the turn's `parents`; its producer the actor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactVersion>,
}

/// One version of a blackboard artifact, as its turn records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactVersion {
    /// `spec`, `research`, `adr`, `task-list`, `diff`, `findings` or `extra/<key>`.
    pub kind: String,
    /// The artifact within its kind (`main` unless named).
    pub key: String,
    /// 1 for the first version, one more for each after.
    pub version: u32,
    /// Of the content's canonical JSON, which the blob of that name holds.
    pub sha256: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemSpec {
    pub id: String,
    pub agent: String,
    pub from: String,
    #[serde(default)]
    pub task: Option<String>,
    pub not_after_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Items {
    pub actor: String,
    pub source: String,
    pub mentions: Vec<ItemSpec>,
    pub obligations: Vec<ItemSpec>,
    pub wakes: Vec<String>,
    /// Its turn's audience: a derived record is withheld wherever its source is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
}

/// A compare-and-set on a task row: applied only if the task is still in `from`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskTransition {
    pub task: String,
    pub from: TaskStatus,
    pub to: TaskStatus,
    pub recipient: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TaskEvent {
    pub actor: String,
    pub action: String,
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<TaskCreated>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<TaskTransition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// A claim's TTL: unresolved past it, the claim is recorded in doubt (`resolution`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// A scoped claim's lease: its fencing generation (higher than every one before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_gen: Option<u64>,
    /// A claim: the task's authority keys as they stood at the claim; done requires them
    /// unchanged (key name to value or digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<std::collections::BTreeMap<String, String>>,
    /// An amendment by the owner: the task's new terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms: Option<TaskTerms>,
    /// An operator's acceptance override: why a requirement-bound task may close without checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A supersession: the verified successor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor: Option<String>,
    /// A worker's proposal and what the daemon did with it (`proposal_applied`,
    /// `proposal_not_applied`, `proposal_in_doubt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<Box<ProposalRecord>>,
    /// A cancellation: the owner's reason, and the task's open items it resolves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolves: Vec<Resolution>,
}

/// A proposal as the daemon journals its outcome: the change asked for and, when applied, the
/// version move and the source's digests before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalRecord {
    pub id: String,
    pub change: crate::stage::Proposal,
    /// `applied`, `not_applied` (with `code`) or `in_doubt`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_sha256: Option<String>,
    /// Resolved at a start from the live source, after a crash left it unrecorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recovered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The agent that proposed it. A recovered record is the daemon's statement (its event's
    /// actor is `room`), so its worker is named here; records before this field name the
    /// worker only as their actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The proposing session's conversation key in the room: a return is "original" only from
    /// this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_key: Option<String>,
}

impl ProposalRecord {
    /// What the daemon did, without what was asked or by whom: the part a successor
    /// acknowledgment pins as `outcome_sha256`.
    pub fn outcome_view(&self) -> serde_json::Value {
        serde_json::json!({"outcome": self.outcome, "code": self.code,
            "to_version": self.to_version, "before_sha256": self.before_sha256,
            "after_sha256": self.after_sha256, "recovered": self.recovered,
            "detail": self.detail})
    }

    /// The three digests a `worker_receipt` successor check pins: of the change asked for, of
    /// the whole record and of its outcome (canonical JSON, SHA-256).
    pub fn digests(&self) -> (String, String, String) {
        (
            crate::canon::digest_of(&self.change),
            crate::canon::digest_of(self),
            crate::canon::digest_of(&self.outcome_view()),
        )
    }

    /// A terminal outcome: the change is known made or known not made.
    pub fn is_terminal(&self) -> bool {
        self.outcome == "applied" || self.outcome == "not_applied"
    }
}

/// A task's terms as its owner amends them: the requirements and the checks that measure them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TaskTerms {
    /// The task's revision these terms make (one more than the one they replace), so that a
    /// replayed amendment is applied once.
    pub revision: u64,
    pub requirements: Vec<String>,
    pub acceptance: Vec<crate::acceptance::Check>,
}

/// A phase of an external operation: Begin (the intention, before the effect), Effect (the
/// agent reports the effect done) and Resolve (its outcome). Per (agent, operation) in that
/// order; a Begin unresolved past its TTL is recorded in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpPhase {
    Begin,
    Effect,
    Resolve,
}

/// A read-only observation that the operation's effect is present at its destination: a
/// program on the owner's allowlist, exit 0 meaning present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub program: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    pub timeout_ms: u64,
    /// The probe may reach the network (a remote destination); otherwise it runs without one.
    #[serde(default, skip_serializing_if = "crate::acceptance::is_false")]
    pub network: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpEvent {
    pub actor: String,
    pub op: String,
    pub phase: OpPhase,
    pub task: String,
    /// Begin: where the effect lands, as a typed scope (`api:stripe`, `file:dist`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Begin: the operation this one depends on (`causal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// Resolve: `succeeded` or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// Evidence: first-hand (an `origin`, no lineage) or derived from other evidence of the same
/// room (a `lineage`, no origin of its own), optionally for a task's requirement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceEvent {
    pub actor: String,
    pub evidence: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The requirement it supports (`R1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub req: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// A `file:` origin's SHA-256 as Room measured it at registration (absent when it could
    /// not be read): a later mismatch quarantines the evidence (`content_mismatch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Who reads it (its registrant always among them), narrowed by its lineage's; empty for
    /// every reader. A turn citing it is narrowed to it in turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCreated {
    pub title: String,
    pub owner: String,
    pub recipient: Option<String>,
    pub parent: Option<String>,
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// What the work must achieve, in words; a task with requirements cannot close without
    /// acceptance checks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// The checks `done` measures before the task may close.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acceptance: Vec<crate::acceptance::Check>,
    /// A task that only coordinates: it leases nothing and its subtasks may not either.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coordination_only: bool,
    /// Governed by its project's governing source: done requires checks and the closer's
    /// complete reading of the source's current text (`complete_text_v1`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub governed: bool,
    /// The parent's revision at delegation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_revision: Option<u64>,
    /// The sources its worker is staged with (`stage`): each pinned by digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage: Vec<crate::stage::Selection>,
}

/// Whether a record with `audience` is for `reader` (an empty audience is every reader's).
pub fn visible_to(audience: &[String], reader: &str) -> bool {
    audience.is_empty() || audience.iter().any(|a| a == reader)
}

impl EventBody {
    pub fn actor(&self) -> &str {
        match self {
            EventBody::RoomCreated { actor, .. }
            | EventBody::MemberAdded { actor, .. }
            | EventBody::RoomReset { actor }
            | EventBody::Admission { actor, .. }
            | EventBody::JournalLoss { actor, .. }
            | EventBody::RoomCancelled { actor, .. }
            | EventBody::RoomResumed { actor }
            | EventBody::Reconciled { actor, .. } => actor,
            EventBody::WorkerStop(s) => &s.actor,
            EventBody::Identity(i) => &i.actor,
            EventBody::CollabFlag(f) => &f.actor,
            EventBody::Turn(t) => &t.actor,
            EventBody::Items(i) => &i.actor,
            EventBody::Task(t) => &t.actor,
            EventBody::Op(o) => &o.actor,
            EventBody::Evidence(e) => &e.actor,
            EventBody::InvariantViolation(v) => &v.actor,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::RoomCreated { .. } => "room_created",
            EventBody::MemberAdded { .. } => "member_added",
            EventBody::RoomReset { .. } => "room_reset",
            EventBody::Admission { .. } => "admission",
            EventBody::JournalLoss { .. } => "journal_loss",
            EventBody::RoomCancelled { .. } => "room_cancelled",
            EventBody::RoomResumed { .. } => "room_resumed",
            EventBody::Reconciled { .. } => "reconciled",
            EventBody::WorkerStop(_) => "worker_stop",
            EventBody::Identity(_) => "identity",
            EventBody::CollabFlag(_) => "collab_flag",
            EventBody::Turn(_) => "turn",
            EventBody::Items(_) => "items",
            EventBody::Task(_) => "task",
            EventBody::Op(_) => "op",
            EventBody::Evidence(_) => "evidence",
            EventBody::InvariantViolation(_) => "invariant_violation",
        }
    }

    pub fn task(&self) -> Option<&str> {
        match self {
            EventBody::Turn(t) => t.task.as_deref(),
            EventBody::Task(t) => Some(&t.task),
            EventBody::Op(o) => Some(&o.task),
            EventBody::Evidence(e) => e.task.as_deref(),
            EventBody::InvariantViolation(v) => v.task.as_deref(),
            _ => None,
        }
    }
}

impl EventBody {
    /// Who reads this record: empty for every reader of the room.
    pub fn audience(&self) -> &[String] {
        match self {
            EventBody::Turn(t) => &t.audience,
            EventBody::Items(i) => &i.audience,
            EventBody::InvariantViolation(v) => &v.audience,
            EventBody::Evidence(e) => &e.audience,
            _ => &[],
        }
    }

    /// The idempotency key a record registers, if any.
    pub fn idempotency_key(&self) -> Option<&str> {
        match self {
            EventBody::Turn(t) => t.idempotency_key.as_deref(),
            EventBody::Task(t) => t.idempotency_key.as_deref(),
            EventBody::Op(o) => o.idempotency_key.as_deref(),
            _ => None,
        }
    }
}

/// Id prefixes of mentions and obligations.
pub const MENTION_PREFIX: &str = "mnt";
pub const OBLIGATION_PREFIX: &str = "obl";

/// Deterministic item ids: completion after a crash re-derives the same ids.
pub fn item_id(prefix: &str, source: &str, agent: &str) -> String {
    let d = crate::sha256_hex(format!("{prefix}:{source}:{agent}").as_bytes());
    format!("{prefix}_{}", &d[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_and_kinds_are_stored_by_name() {
        for s in TaskStatus::ALL {
            assert_eq!(TaskStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(TaskStatus::parse("lapsed"), None);
        for k in ItemKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), json!(k.as_str()));
        }
    }

    /// The journal's bytes: a turn and a task event as they were written before these types
    /// moved here (journals are hash-chained, so their canonical JSON must never change).
    #[test]
    fn events_keep_their_canonical_json() {
        let turn = EventBody::Turn(Box::new(Turn {
            actor: "a".into(),
            verb: Verb::Done,
            conversation_key: "k".into(),
            view_gen: None,
            text: None,
            text_blob: None,
            to: vec![],
            reply_to: None,
            parents: vec![],
            task: Some("tsk_1".into()),
            evidence: vec![],
            resolves: vec![Resolution {
                id: "obl_1".into(),
                item: ItemKind::Obligation,
                status: "resolved".into(),
            }],
            plan: ItemPlan::default(),
            task_transition: Some(TaskTransition {
                task: "tsk_1".into(),
                from: TaskStatus::Claimed,
                to: TaskStatus::Done,
                recipient: Some("a".into()),
            }),
            detail: serde_json::Value::Null,
            idempotency_key: None,
            flags: vec![],
            audience: vec![],
            artifact: None,
        }));
        assert_eq!(
            crate::canon::canonical_string(&serde_json::to_value(&turn).unwrap()),
            r#"{"actor":"a","conversation_key":"k","kind":"turn","resolves":[{"id":"obl_1","item":"obligation","status":"resolved"}],"task":"tsk_1","task_transition":{"from":"claimed","recipient":"a","task":"tsk_1","to":"done"},"verb":"done"}"#
        );
        let claim = EventBody::Task(Box::new(TaskEvent {
            actor: "a".into(),
            action: "claimed".into(),
            task: "tsk_1".into(),
            created: None,
            transition: Some(TaskTransition {
                task: "tsk_1".into(),
                from: TaskStatus::Blocked,
                to: TaskStatus::Claimed,
                recipient: None,
            }),
            idempotency_key: None,
            ttl_ms: Some(5),
            ..TaskEvent::default()
        }));
        assert_eq!(
            crate::canon::canonical_string(&serde_json::to_value(&claim).unwrap()),
            r#"{"action":"claimed","actor":"a","kind":"task","task":"tsk_1","transition":{"from":"blocked","recipient":null,"task":"tsk_1","to":"claimed"},"ttl_ms":5}"#
        );
        let back: EventBody =
            serde_json::from_value(serde_json::to_value(&claim).unwrap()).unwrap();
        assert_eq!(back, claim);
    }
}
