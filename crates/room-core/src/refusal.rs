//! The one refusal type. A refusal is a value with a stable snake_case code (API: tests and
//! clients match on it), a short lower-case message, an optional hint the user can act on, and
//! structured detail. Adding a code is fine; renaming one is a breaking change.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    ProjectRootRedirected => "project_root_redirected",
    ProjectTerritoryRefused => "project_territory_refused",
    // principals
    CredentialInvalid => "credential_invalid",
    CredentialRevoked => "credential_revoked",
    TierInsufficient => "tier_insufficient",
    VerbDenied => "verb_denied",
    ActorMismatch => "actor_mismatch",
    OwnerRequired => "owner_required",
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
    // egress
    ToolResultWithheld => "tool_result_withheld",
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
    /// Boxed to keep a `Refusal` under clippy's large-error bound: the ACP crate turns on
    /// serde_json's `preserve_order`, which makes every `Value` an `IndexMap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<Box<str>>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub detail: Value,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
            hint: None,
            detail: Value::Null,
        }
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

    #[test]
    fn codes_round_trip_through_text_and_serde() {
        for &c in Code::ALL {
            assert_eq!(Code::parse(c.as_str()), Some(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
    }
}
