//! The sealed wake permit (`room-wake-job-v3`): the 18 fields of the seed's Exhibit 1 and the
//! `binding_sha256` over their canonical JSON. `task` is serialized as an explicit null when the
//! wake is untasked, so adding or stripping a task changes the digest.

use serde::{Deserialize, Serialize};

pub const WAKE_SCHEMA: &str = "room-wake-job-v3";
/// Budget of an untasked wake, counted from creation: queue time consumes it.
pub const UNTASKED_DEADLINE_MS: u64 = 60_000;
/// Budget of a task-bound wake.
pub const TASKED_DEADLINE_MS: u64 = 20 * 60_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomAuthority {
    pub owner_grant: String,
    pub revision: u64,
    pub reset_at: Option<String>,
    pub session: String,
}

/// The 18 sealed fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeBinding {
    pub schema: String,
    pub room: String,
    pub agent: String,
    pub from: String,
    pub source_event: String,
    pub path: String,
    pub prompt: String,
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_refs: Option<Vec<String>>,
    pub mention_ids: Vec<String>,
    pub obligation_ids: Vec<String>,
    pub pulse_message: String,
    pub deadline_ms: u64,
    pub created_at: String,
    pub not_after: String,
    pub control_epoch: u64,
    pub room_authority: RoomAuthority,
    pub registration_sha256: String,
}

/// A permit as stored in the queue: the binding plus its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakePermit {
    #[serde(flatten)]
    pub binding: WakeBinding,
    pub binding_sha256: String,
}

impl WakeBinding {
    pub fn digest(&self) -> String {
        crate::canon::digest_of(self)
    }

    pub fn seal(self) -> WakePermit {
        let binding_sha256 = self.digest();
        WakePermit {
            binding: self,
            binding_sha256,
        }
    }
}

impl WakePermit {
    /// True when the stored digest still matches the sealed fields.
    pub fn intact(&self) -> bool {
        self.binding.digest() == self.binding_sha256
    }
}

/// RFC 3339 UTC text for a millisecond timestamp (deterministic: no clock is read).
/// The canonical path of the permit waking `agent` for `source_event` in `room`: its key in the
/// queue and where dispatch will hand it to the worker's claim.
pub fn wake_path(room: &str, agent: &str, source_event: &str) -> String {
    format!("wakes/{room}/{agent}/{source_event}.json")
}

pub fn rfc3339_ms(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

/// Howard Hinnant's days-to-civil conversion.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(task: Option<&str>) -> WakeBinding {
        WakeBinding {
            schema: WAKE_SCHEMA.into(),
            room: "architecture-demo".into(),
            agent: "reviewer-beta".into(),
            from: "coordinator-alpha".into(),
            source_event: "evt_0123456789abcdef_a1b2c3d4".into(),
            path: "wakes/architecture-demo/reviewer-beta/evt_0123456789abcdef_a1b2c3d4.json".into(),
            prompt: "Review".into(),
            task: task.map(String::from),
            evidence_refs: None,
            mention_ids: vec!["mnt_01".into()],
            obligation_ids: vec!["obl_01".into()],
            pulse_message: "Review".into(),
            deadline_ms: TASKED_DEADLINE_MS,
            created_at: rfc3339_ms(0),
            not_after: rfc3339_ms(TASKED_DEADLINE_MS),
            control_epoch: 7,
            room_authority: RoomAuthority {
                owner_grant: "g".into(),
                revision: 12,
                reset_at: None,
                session: "s".into(),
            },
            registration_sha256: "0".repeat(64),
        }
    }

    #[test]
    fn explicit_null_task_is_part_of_the_digest() {
        let untasked = sample(None);
        let json = serde_json::to_value(&untasked).unwrap();
        assert!(json.as_object().unwrap().contains_key("task"));
        assert_eq!(
            json.as_object().unwrap().len(),
            17,
            "evidence_refs absent, 17 of 18 present"
        );
        assert_ne!(
            untasked.digest(),
            sample(Some("tsk_0123456789abcdef")).digest()
        );
    }

    #[test]
    fn tampering_is_detected() {
        let mut p = sample(None).seal();
        assert!(p.intact());
        p.binding.agent = "someone-else".into();
        assert!(!p.intact());
    }

    #[test]
    fn rfc3339_known_values() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_793_462_400_123), "2026-10-31T16:00:00.123Z");
    }
}
