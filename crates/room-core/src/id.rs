//! Id formats. Ids are opaque to users but have fixed shapes so a malformed one is refused at the
//! edge instead of travelling into a query.

use crate::env::Entropy;
use crate::hlc::Hlc;

/// `evt_<16hex>_<8hex>`: the HLC (milliseconds and the low 16 bits of the counter) then entropy.
pub fn event_id(hlc: Hlc, entropy: &dyn Entropy) -> String {
    let stamp = (hlc.ms << 16) | u64::from(hlc.c & 0xffff);
    format!("evt_{stamp:016x}_{}", entropy.hex(4))
}

pub fn receipt_id(entropy: &dyn Entropy) -> String {
    format!("rcpt_{}", entropy.hex(16))
}

pub fn task_id(entropy: &dyn Entropy) -> String {
    format!("tsk_{}", entropy.hex(8))
}

/// An evidence handle: 128 random bits, so a handle names one registration anywhere.
pub fn evidence_id(entropy: &dyn Entropy) -> String {
    format!("ev_{}", entropy.hex(16))
}

pub fn is_evidence_id(s: &str) -> bool {
    prefixed(s, "ev_", 32)
}

/// An external operation recorded in the destination ledger.
pub fn op_id(entropy: &dyn Entropy) -> String {
    format!("op_{}", entropy.hex(8))
}

pub fn is_op_id(s: &str) -> bool {
    prefixed(s, "op_", 16)
}

/// A request in a collaboration's approval queue.
pub fn approval_id(entropy: &dyn Entropy) -> String {
    format!("apr_{}", entropy.hex(8))
}

/// A collaboration: also its room's name and its agents' prefix (`c<8hex>-<role>`).
pub fn collab_id(entropy: &dyn Entropy) -> String {
    format!("c{}", entropy.hex(4))
}

pub fn project_id(entropy: &dyn Entropy) -> String {
    format!("prj_{}", entropy.hex(8))
}

fn hex_run(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn prefixed(s: &str, prefix: &str, len: usize) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|rest| hex_run(rest, len))
}

pub fn is_event_id(s: &str) -> bool {
    s.strip_prefix("evt_")
        .and_then(|rest| rest.split_once('_'))
        .is_some_and(|(a, b)| hex_run(a, 16) && hex_run(b, 8))
}

pub fn is_receipt_id(s: &str) -> bool {
    prefixed(s, "rcpt_", 32)
}

pub fn is_task_id(s: &str) -> bool {
    prefixed(s, "tsk_", 16)
}

pub fn is_mention_id(s: &str) -> bool {
    prefixed(s, "mnt_", 16)
}

pub fn is_obligation_id(s: &str) -> bool {
    prefixed(s, "obl_", 16)
}

pub fn is_project_id(s: &str) -> bool {
    prefixed(s, "prj_", 16)
}

/// A worker's proposal, as the daemon names it when it admits one.
pub fn is_proposal_id(s: &str) -> bool {
    prefixed(s, "prp_", 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::SeededEntropy;

    #[test]
    fn shapes_are_recognised() {
        let e = SeededEntropy::new(9);
        let id = event_id(
            Hlc {
                ms: 1_700_000_000_000,
                c: 3,
            },
            &e,
        );
        assert!(is_event_id(&id), "{id}");
        assert!(is_receipt_id(&receipt_id(&e)));
        assert!(is_task_id(&task_id(&e)));
        assert!(!is_event_id("evt_../../etc_00000000"));
        assert!(!is_task_id("tsk_ABCDEF0123456789"));
    }
}
