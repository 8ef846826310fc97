//! The one refusal type. A refusal is a value with a stable snake_case code (API: tests and
//! clients match on it), a short lower-case message, an optional hint the user can act on, and
//! structured detail. Adding a code is fine; renaming one is a breaking change.

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;
use std::sync::Arc;

macro_rules! codes {
    ($($variant:ident => $text:literal,)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Code { $($variant,)* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $text,)* }
            }

            pub fn parse(s: &str) -> Option<Code> {
                match s { $($text => Some(Code::$variant),)* _ => None }
            }
        }
    };
}

codes! {
    // territory and state
    StateDirSplitBrain => "state_dir_split_brain",
    // `room migrate` fills only an empty database (or resumes its own unfinished run)
    StoreNotEmpty => "store_not_empty",
    // `room snapshot` / `room restore`: a symbolic or hard link in the tree copied
    SnapshotLinkRefused => "snapshot_link_refused",
    // a snapshot naming a path outside a state dir's store (absolute, `..`, an unknown top)
    SnapshotPathOutside => "snapshot_path_outside",
    // a snapshot that is not whole: its manifest, a file's digest, a chain's tip
    SnapshotInvalid => "snapshot_invalid",
    // a snapshot of another state dir than the one it would replace
    SnapshotOtherStateDir => "snapshot_other_state_dir",
    // an unfinished restore of another snapshot holds the state dir
    RestorePending => "restore_pending",
    ProjectRootRedirected => "project_root_redirected",
    ProjectTerritoryRefused => "project_territory_refused",
    // principals
    CredentialInvalid => "credential_invalid",
    CredentialRevoked => "credential_revoked",
    TierInsufficient => "tier_insufficient",
    VerbDenied => "verb_denied",
    ActorMismatch => "actor_mismatch",
    OwnerRequired => "owner_required",
    // a browser session's request to act came without its csrf token
    CsrfInvalid => "csrf_invalid",
    // rooms and shards
    GraphProjectRebindRefused => "graph_project_rebind_refused",
    RoomNotMember => "room_not_member",
    RoomNotFound => "room_not_found",
    RoomReadOnly => "room_read_only",
    RoomArchived => "room_archived",
    RoomArchiveRefused => "room_archive_refused",
    QuotaExceeded => "quota_exceeded",
    // the room's journal did not verify (a damaged record, or acknowledged records missing):
    // it is read-only and never extended until the owner restores it or accepts the loss
    RoomQuarantined => "room_quarantined",
    // `index rebuild` would write over acknowledged records the journal lost
    JournalLossUnaccepted => "journal_loss_unaccepted",
    // sync and the work gate
    RoomSyncJournalRotated => "room_sync_journal_rotated",
    RoomSyncViewChanged => "room_sync_view_changed",
    RoomSyncDeliveryPolicyChanged => "room_sync_delivery_policy_changed",
    RoomSyncReceiptForked => "room_sync_receipt_forked",
    RoomSyncRequired => "room_sync_required",
    RoomSyncConcurrentArrival => "room_sync_concurrent_arrival",
    RoomTurnQueueExceeded => "room_turn_queue_exceeded",
    ReceiptUnknown => "receipt_unknown",
    // verbs
    NoteMentionsRefused => "note_mentions_refused",
    ReplyTargetNotAddressed => "reply_target_not_addressed",
    SayTaskRefused => "say_task_refused",
    SayReplyTargetAmbiguous => "say_reply_target_ambiguous",
    SendTaskRequired => "send_task_required",
    CrossRoomEvidenceRefused => "cross_room_evidence_refused",
    TaskRequired => "task_required",
    TaskNotFound => "task_not_found",
    TaskStateInvalid => "task_state_invalid",
    TaskNotHeld => "task_not_held",
    ObligationNotFound => "obligation_not_found",
    // acceptance: completion is a measurement
    AcceptanceCommandNotAllowed => "acceptance_command_not_allowed",
    // an evaluation of the task is running already, or the daemon runs as many as it may
    AcceptanceEvaluationBusy => "acceptance_evaluation_busy",
    TaskAcceptanceFailed => "task_acceptance_failed",
    TaskAcceptanceRequired => "task_acceptance_required",
    TaskAcceptanceChangedBeforeCompletion => "task_acceptance_changed_before_completion",
    TaskAuthorityChanged => "task_authority_changed",
    TaskSuccessorUnverified => "task_successor_unverified",
    ContentMismatch => "content_mismatch",
    RoomAdmissionClosed => "room_admission_closed",
    // lifecycle control: cancel, reset, admission, break-glass
    ControlStandingRequired => "control_standing_required",
    // a launch's broker socket reached from outside its owned job
    BrokerPeerRefused => "broker_peer_refused",
    // a running launch's one-launch credential presented outside its broker
    LaunchCredentialOutsideBroker => "launch_credential_outside_broker",
    // a session factory operation the adapter or the agent does not offer
    SessionOpUnsupported => "session_op_unsupported",
    // a worker's proposal: a change to a staged projection that the daemon applies
    ProposalWithheld => "proposal_withheld",
    ProposalVersionConflict => "proposal_version_conflict",
    ProposalSourceRefused => "proposal_source_refused",
    // dispatch: a queued permit is a proposal, revalidated before any launch
    WakeJobBindingChanged => "wake_job_binding_changed",
    WakeRoomAuthorityChanged => "wake_room_authority_changed",
    WakeRecipientRegistrationChanged => "wake_recipient_registration_changed",
    WakeTaskAuthorityChanged => "wake_task_authority_changed",
    WakeAdmissionClosed => "wake_admission_closed",
    WakeJobExpired => "wake_job_expired",
    WakeJobChangedDuringValidation => "wake_job_changed_during_validation",
    WakeNotTakeable => "wake_not_takeable",
    // governing sources: read whole, measured at done
    SourceCoverageIncomplete => "source_coverage_incomplete",
    SourcePartUnreadable => "source_part_unreadable",
    // composition: intersection, never a partial union
    IncompleteSourceSet => "incomplete_source_set",
    // a read of several rooms composed without the owner's grant for that reader and rooms
    CompositionNotGranted => "composition_not_granted",
    GraphPageSnapshotChanged => "graph_page_snapshot_changed",
    // visibility: a turn reaches only its audience
    AudienceExcludesRecipient => "audience_excludes_recipient",
    // lineage: delegation cannot outlive or widen its ancestry
    TaskAncestryInvalid => "task_ancestry_invalid",
    TaskScopeWidened => "task_scope_widened",
    // runtime invariants (detail.invariant names which one)
    InvariantViolation => "invariant_violation",
    // `exclusive`'s reject: a claim met a live lease (detail.conflicts names each holder)
    LeaseConflict => "lease_conflict",
    // collaborative sessions: profiles, packs and the blackboard's artifacts
    ProfileInvalid => "profile_invalid",
    PackInvalid => "pack_invalid",
    PackWriteOverlap => "pack_write_overlap",
    PackCycle => "pack_cycle",
    PanelBackendsNotDistinct => "panel_backends_not_distinct",
    FixLoopExhausted => "fix_loop_exhausted",
    ChildAutoBlocked => "child_auto_blocked",
    BudgetExhausted => "budget_exhausted",
    // an agent orchestrator's dispatch names a ready phase; its close, a collaboration done
    PhaseNotReady => "phase_not_ready",
    CollabPhasesOpen => "collab_phases_open",
    ArtifactSchemaInvalid => "artifact_schema_invalid",
    // the blackboard's fence: scopes decide who reads and writes which kind
    ArtifactReadDenied => "artifact_read_denied",
    ArtifactWriteDenied => "artifact_write_denied",
    ArtifactVersionConflict => "artifact_version_conflict",
    ArtifactDiffDoesNotApply => "artifact_diff_does_not_apply",
    // a collaboration's approval queue: a decision binds the digest of what was shown
    ApprovalStale => "approval_stale",
    // the delegated identity tree: a child holds at most what its parent holds
    ScopeEscalationRefused => "scope_escalation_refused",
    DelegationTooDeep => "delegation_too_deep",
    // egress
    ToolResultWithheld => "tool_result_withheld",
    // semantic search: the owner's embeddings endpoint did not give the query a vector
    EmbeddingsUnavailable => "embeddings_unavailable",
    // generic
    InvalidArgument => "invalid_argument",
    PayloadTooLarge => "payload_too_large",
    NotFound => "not_found",
    AlreadyExists => "already_exists",
    StorageFailed => "storage_failed",
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The items of a refusal's `detail.next_page`, kept as the JSON texts the engine rendered
/// (shared with its render cache): a busy room hands each author about a hundred of them per
/// turn, and a copy of each as a `Value` tree cost more than the rest of the page. They are
/// written out verbatim where the refusal is serialized, as `detail.next_page.items`;
/// [`Refusal::materialize`] puts them into `detail` for a caller that reads it in process.
/// `policy_sha256` names the redaction policy they were rendered under: an edge that redacts
/// what leaves for an agent passes them as they are under that policy, and materializes and
/// redacts them under any other.
#[derive(Debug, Clone, Default)]
pub struct PageItems {
    pub items: Vec<Arc<RawValue>>,
    pub policy_sha256: String,
}

impl PartialEq for PageItems {
    fn eq(&self, other: &Self) -> bool {
        self.policy_sha256 == other.policy_sha256
            && self.items.len() == other.items.len()
            && self
                .items
                .iter()
                .zip(&other.items)
                .all(|(a, b)| a.get() == b.get())
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Refusal {
    pub code: Code,
    /// Boxed, as `hint` is, to keep a `Refusal` under clippy's large-error bound.
    pub message: Box<str>,
    /// Boxed to keep a `Refusal` under clippy's large-error bound: the ACP crate turns on
    /// serde_json's `preserve_order`, which makes every `Value` an `IndexMap`.
    #[serde(default)]
    pub hint: Option<Box<str>>,
    #[serde(default)]
    pub detail: Value,
    /// `detail.next_page`'s items, when they are kept as text (see [`PageItems`]); `detail`
    /// then holds the page without them. A deserialized refusal has them in `detail`.
    #[serde(skip)]
    pub page_items: Option<Box<PageItems>>,
}

/// Field order and omissions as they always were (`code`, `message`, then `hint` and `detail`
/// when present); kept page items go out as `detail.next_page.items`, after the page's other
/// fields, exactly where a page in `detail` carries them.
impl Serialize for Refusal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let len = 2 + usize::from(self.hint.is_some()) + usize::from(!self.detail.is_null());
        let mut m = s.serialize_struct("Refusal", len)?;
        m.serialize_field("code", &self.code)?;
        m.serialize_field("message", &self.message)?;
        if let Some(h) = &self.hint {
            m.serialize_field("hint", h)?;
        }
        if !self.detail.is_null() {
            m.serialize_field("detail", &self.detail_view())?;
        }
        m.end()
    }
}

/// `detail` with kept page items in their place (see [`Refusal::detail_view`]).
pub struct DetailView<'a> {
    detail: &'a Value,
    items: Option<&'a PageItems>,
}

impl Serialize for DetailView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (Some(items), Value::Object(d)) = (self.items, self.detail) else {
            return self.detail.serialize(s);
        };
        let mut m = s.serialize_map(Some(d.len()))?;
        for (k, v) in d {
            match v {
                Value::Object(page) if k == "next_page" => {
                    m.serialize_entry(k, &PageView { page, items })?
                }
                _ => m.serialize_entry(k, v)?,
            }
        }
        m.end()
    }
}

enum Either<'a> {
    Kept(PageView<'a>),
    InDetail(&'a Value),
}

impl Serialize for Either<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Either::Kept(p) => p.serialize(s),
            Either::InDetail(v) => v.serialize(s),
        }
    }
}

struct PageView<'a> {
    page: &'a serde_json::Map<String, Value>,
    items: &'a PageItems,
}

impl Serialize for PageView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.page.len() + 1))?;
        for (k, v) in self.page.iter().filter(|(k, _)| *k != "items") {
            m.serialize_entry(k, v)?;
        }
        m.serialize_entry("items", self.items)?;
        m.end()
    }
}

impl Serialize for PageItems {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.items.iter().map(|i| &**i))
    }
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into().into_boxed_str(),
            hint: None,
            detail: Value::Null,
            page_items: None,
        }
    }

    /// `detail` as it is serialized: with kept page items in `next_page.items`.
    pub fn detail_view(&self) -> DetailView<'_> {
        DetailView {
            detail: &self.detail,
            items: self.page_items.as_deref(),
        }
    }

    /// `detail.next_page` as it is serialized (kept items included), if the refusal has one.
    pub fn next_page_view(&self) -> Option<impl Serialize + '_> {
        let page = self.detail.get("next_page")?;
        Some(match (page, self.page_items.as_deref()) {
            (Value::Object(page), Some(items)) => Either::Kept(PageView { page, items }),
            _ => Either::InDetail(page),
        })
    }

    /// Put kept page items into `detail.next_page.items` (parsed), for a caller in process that
    /// reads `detail`; a refusal without kept items is left as it is.
    pub fn materialize(&mut self) {
        let Some(items) = self.page_items.take() else {
            return;
        };
        let parsed: Vec<Value> = items
            .items
            .iter()
            .map(|i| serde_json::from_str(i.get()).expect("kept page items are JSON"))
            .collect();
        if let Some(Value::Object(page)) = self.detail.get_mut("next_page") {
            page.insert("items".into(), Value::Array(parsed));
        }
    }

    /// [`Refusal::materialize`], by value.
    pub fn materialized(mut self) -> Self {
        self.materialize();
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into().into_boxed_str());
        self
    }

    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }

    /// A bad argument, naming the field.
    pub fn invalid(field: &str, why: impl std::fmt::Display) -> Self {
        Refusal::new(Code::InvalidArgument, format!("{field}: {why}"))
            .detail(serde_json::json!({ "field": field }))
    }

    pub fn storage(err: impl std::fmt::Display) -> Self {
        Refusal::new(Code::StorageFailed, format!("storage failed: {err}"))
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "error[{}]: {}", self.code, self.message)?;
        if let Some(h) = &self.hint {
            write!(f, "\nhint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(texts: &[&str]) -> Refusal {
        Refusal {
            page_items: Some(Box::new(PageItems {
                items: texts
                    .iter()
                    .map(|t| Arc::from(RawValue::from_string(t.to_string()).unwrap()))
                    .collect(),
                policy_sha256: "p".into(),
            })),
            ..Refusal::new(Code::RoomSyncRequired, "unread events")
                .hint("read detail.next_page")
                .detail(serde_json::json!({
                    "next_page": {"room": "r", "receipt": "rcpt_1", "more": false},
                    "waited_ms": 3,
                }))
        }
    }

    #[test]
    fn kept_page_items_serialize_exactly_as_items_in_the_detail_do() {
        let items = [
            r#"{"seq":4,"event":{"text":"é \" \u0001"}}"#,
            r#"{"seq":5}"#,
        ];
        let lean = kept(&items);
        let full = lean.clone().materialized();
        assert!(full.page_items.is_none());
        assert_eq!(full.detail["next_page"]["items"][0]["seq"], 4);
        let (a, b) = (
            serde_json::to_string(&lean).unwrap(),
            serde_json::to_string(&full).unwrap(),
        );
        let parsed = |t: &str| serde_json::from_str::<Value>(t).unwrap();
        assert_eq!(
            parsed(&a),
            parsed(&b),
            "the wire cannot tell a kept page from one in the detail"
        );
        // with `preserve_order` (on in every build of the daemon, through the ACP crate) a page's
        // items are its last key either way, so the bytes are the same too
        let ordered = serde_json::json!({"b": 1, "a": 2})
            .as_object()
            .unwrap()
            .keys()
            .next()
            == Some(&"b".to_string());
        if ordered {
            assert_eq!(a, b);
        }
        assert!(a.contains(r#","items":[{"seq":4,"event":{"#), "{a}");
        assert_eq!(
            serde_json::to_value(&lean).unwrap(),
            serde_json::to_value(&full).unwrap()
        );
        let back: Refusal = serde_json::from_str(&a).unwrap();
        assert_eq!(back, full, "read back, the items are in the detail");
        // nothing kept, nothing changes
        let plain = Refusal::new(Code::NotFound, "gone");
        assert_eq!(
            serde_json::to_string(&plain).unwrap(),
            r#"{"code":"not_found","message":"gone"}"#
        );
        assert_eq!(plain.clone().materialized(), plain);
        assert!(plain.next_page_view().is_none());
        let page = |r: &Refusal| serde_json::to_string(&r.next_page_view().unwrap()).unwrap();
        assert_eq!(parsed(&page(&lean)), parsed(&page(&full)));
        assert_eq!(parsed(&page(&lean)), full.detail["next_page"]);
    }

    #[test]
    fn codes_round_trip_through_text_and_serde() {
        for &c in Code::ALL {
            assert_eq!(Code::parse(c.as_str()), Some(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
    }
}
