//! The hash-chained journal record. Each line of a room's `EVENTS.jsonl` is the canonical JSON of
//! one `Record`; `hash` covers every other field, `prev` is the previous record's hash, and the
//! first record's `prev` is derived from the room's graph id, so a record moved between rooms or
//! reordered inside one fails verification.

use crate::canon::{canonical_bytes, sha256_hex};
use crate::hlc::Hlc;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub seq: u64,
    pub id: String,
    pub hlc: Hlc,
    pub prev: String,
    pub hash: String,
    pub event: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("record {seq}: sequence gap (expected {expected})")]
    SeqGap { seq: u64, expected: u64 },
    #[error("record {seq}: prev does not match the previous record's hash")]
    PrevMismatch { seq: u64 },
    #[error("record {seq}: hash does not match its content")]
    HashMismatch { seq: u64 },
    #[error("record {seq}: hlc {hlc} is not after {prev_hlc}")]
    HlcNotMonotonic { seq: u64, hlc: Hlc, prev_hlc: Hlc },
}

impl ChainError {
    pub fn seq(&self) -> u64 {
        match self {
            ChainError::SeqGap { seq, .. }
            | ChainError::PrevMismatch { seq }
            | ChainError::HashMismatch { seq }
            | ChainError::HlcNotMonotonic { seq, .. } => *seq,
        }
    }
}

/// The `prev` of a room's first record.
pub fn genesis_prev(graph_id: &str) -> String {
    sha256_hex(format!("room-genesis:{graph_id}").as_bytes())
}

/// Where the chain stands after a record: what the next record must follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainTip {
    pub seq: u64,
    pub hash: String,
    pub hlc: Hlc,
}

impl ChainTip {
    pub fn genesis(graph_id: &str) -> Self {
        ChainTip {
            seq: 0,
            hash: genesis_prev(graph_id),
            hlc: Hlc::ZERO,
        }
    }
}

impl Record {
    /// Seal a new record after `tip`.
    pub fn seal(tip: &ChainTip, id: String, hlc: Hlc, event: Value) -> Record {
        Sealed::seal(tip, id, hlc, event).into_record()
    }

    /// SHA-256 over the canonical record with `hash` left out.
    pub fn compute_hash(&self) -> String {
        #[derive(Serialize)]
        struct Unsealed<'a> {
            seq: u64,
            id: &'a str,
            hlc: Hlc,
            prev: &'a str,
            event: &'a Value,
        }
        sha256_hex(&canonical_bytes(&Unsealed {
            seq: self.seq,
            id: &self.id,
            hlc: self.hlc,
            prev: &self.prev,
            event: &self.event,
        }))
    }

    /// One journal line, without the trailing newline.
    pub fn to_line(&self) -> Vec<u8> {
        canonical_bytes(self)
    }

    /// Where the event ends in the record's canonical `line`, and the canonical text of the
    /// members after `hash`; `None` if the line does not end as a record's must.
    fn unsealed_split(&self, line: &[u8]) -> Option<(usize, Vec<u8>)> {
        let rest = members_after_hash(self.hlc, &self.id, &self.prev, self.seq);
        let hash_member = hash_member(&self.hash);
        let event_end = line.len().checked_sub(hash_member.len() + rest.len())?;
        let (member, tail) = line[event_end..].split_at(hash_member.len());
        (member == hash_member && tail == rest).then_some((event_end, rest))
    }

    /// Check this record against the tip it claims to follow; return the new tip.
    pub fn verify_after(&self, tip: &ChainTip) -> Result<ChainTip, ChainError> {
        if self.seq != tip.seq + 1 {
            return Err(ChainError::SeqGap {
                seq: self.seq,
                expected: tip.seq + 1,
            });
        }
        if self.prev != tip.hash {
            return Err(ChainError::PrevMismatch { seq: self.seq });
        }
        if self.hash != self.compute_hash() {
            return Err(ChainError::HashMismatch { seq: self.seq });
        }
        if self.seq > 1 && self.hlc <= tip.hlc {
            return Err(ChainError::HlcNotMonotonic {
                seq: self.seq,
                hlc: self.hlc,
                prev_hlc: tip.hlc,
            });
        }
        Ok(ChainTip {
            seq: self.seq,
            hash: self.hash.clone(),
            hlc: self.hlc,
        })
    }
}

/// The canonical text of the members a record's line has after `hash` (JCS sorts them `hlc`,
/// `id`, `prev`, `seq`), with the closing brace: the same for the line and for the text its
/// hash covers.
fn members_after_hash(hlc: Hlc, id: &str, prev: &str, seq: u64) -> Vec<u8> {
    let mut rest = Vec::with_capacity(64 + id.len() + prev.len());
    rest.extend_from_slice(b",\"hlc\":");
    rest.extend_from_slice(&canonical_bytes(&hlc));
    rest.extend_from_slice(b",\"id\":");
    rest.extend_from_slice(&canonical_bytes(&id));
    rest.extend_from_slice(b",\"prev\":");
    rest.extend_from_slice(&canonical_bytes(&prev));
    rest.extend_from_slice(b",\"seq\":");
    rest.extend_from_slice(seq.to_string().as_bytes());
    rest.push(b'}');
    rest
}

/// `,"hash":"…"` as it stands in a record's line.
fn hash_member(hash: &str) -> Vec<u8> {
    let mut member = b",\"hash\":".to_vec();
    member.extend_from_slice(&canonical_bytes(&hash));
    member
}

/// How every record's line begins: JCS puts `event` first.
const EVENT_OPEN: &[u8] = b"{\"event\":";

/// A record together with its journal line, made canonical once. A line is the record's
/// canonical JSON, and with its `hash` member taken out it is exactly the text the hash covers
/// (`event` < `hash` < `hlc` < `id` < `prev` < `seq`): sealing canonicalizes the event once
/// and splices the line around it, where checking a `Record` costs two serializations. The
/// fields are private so that a line always belongs to its record.
#[derive(Debug, Clone)]
pub struct Sealed {
    record: Record,
    /// The journal line, without the trailing newline.
    line: Vec<u8>,
    /// Where the event's text ends in `line` and where the `hash` member after it ends; `None`
    /// for a record whose line does not split as a record's must (it is checked in full).
    split: Option<(usize, usize)>,
}

impl Sealed {
    /// Seal a new record after `tip`.
    pub fn seal(tip: &ChainTip, id: String, hlc: Hlc, event: Value) -> Sealed {
        let seq = tip.seq + 1;
        let rest = members_after_hash(hlc, &id, &tip.hash, seq);
        let mut line = Vec::with_capacity(256 + rest.len());
        line.extend_from_slice(EVENT_OPEN);
        serde_json_canonicalizer::to_writer(&event, &mut line)
            .expect("room values are always representable as JSON");
        let event_end = line.len();
        let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
        sha2::Digest::update(&mut hasher, &line);
        sha2::Digest::update(&mut hasher, &rest);
        let hash = hex::encode(sha2::Digest::finalize(hasher));
        line.extend_from_slice(&hash_member(&hash));
        let hash_end = line.len();
        line.extend_from_slice(&rest);
        let record = Record {
            seq,
            id,
            hlc,
            prev: tip.hash.clone(),
            hash,
            event,
        };
        debug_assert!(
            line == record.to_line(),
            "a spliced line is the record's line"
        );
        Sealed {
            record,
            line,
            split: Some((event_end, hash_end)),
        }
    }

    /// A record as it stands (sealed or not, tampered or not), made canonical: `check_after`
    /// judges it as `Record::verify_after` would.
    pub fn of(record: Record) -> Sealed {
        let line = record.to_line();
        let split = record
            .unsealed_split(&line)
            .map(|(event_end, _)| (event_end, event_end + hash_member(&record.hash).len()));
        Sealed {
            record,
            line,
            split,
        }
    }

    pub fn record(&self) -> &Record {
        &self.record
    }

    pub fn into_record(self) -> Record {
        self.record
    }

    /// The journal line, without the trailing newline.
    pub fn line(&self) -> &[u8] {
        &self.line
    }

    /// The canonical JSON of the record's event (a slice of its line).
    pub fn event_text(&self) -> Option<&str> {
        let (event_end, _) = self.split?;
        Some(
            std::str::from_utf8(&self.line[EVENT_OPEN.len()..event_end])
                .expect("canonical JSON is UTF-8"),
        )
    }

    /// Check this record against the tip it claims to follow, as `Record::verify_after` does,
    /// hashing its line instead of serializing it again; return the new tip.
    pub fn check_after(&self, tip: &ChainTip) -> Result<ChainTip, ChainError> {
        let r = &self.record;
        let Some((event_end, hash_end)) = self.split else {
            return r.verify_after(tip);
        };
        if r.seq != tip.seq + 1 {
            return Err(ChainError::SeqGap {
                seq: r.seq,
                expected: tip.seq + 1,
            });
        }
        if r.prev != tip.hash {
            return Err(ChainError::PrevMismatch { seq: r.seq });
        }
        let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
        sha2::Digest::update(&mut hasher, &self.line[..event_end]);
        sha2::Digest::update(&mut hasher, &self.line[hash_end..]);
        if hex::encode(sha2::Digest::finalize(hasher)) != r.hash {
            return Err(ChainError::HashMismatch { seq: r.seq });
        }
        if r.seq > 1 && r.hlc <= tip.hlc {
            return Err(ChainError::HlcNotMonotonic {
                seq: r.seq,
                hlc: r.hlc,
                prev_hlc: tip.hlc,
            });
        }
        Ok(ChainTip {
            seq: r.seq,
            hash: r.hash.clone(),
            hlc: r.hlc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Any JSON an event may hold: nested objects with keys that sort anywhere, strings with
    /// escapes and look-alikes of the record's own members.
    fn any_event() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[ -~\\\\\"\\u{e9}\\u{1f600}\\n]{0,12}".prop_map(Value::from),
            Just(Value::from(",\"hash\":\"x\",\"hlc\":")),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("hash".to_string()),
                        Just("seq".to_string()),
                        "[a-z\\u{e9}]{0,4}".prop_map(String::from)
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The one-serialization check agrees with the full one on every record, sealed or
        /// tampered, and its line is the record's line.
        #[test]
        fn sealed_check_agrees_with_verify_after(event in any_event(), id in "[ -~\\u{e9}]{0,10}", tamper in 0u8..4, ms in 0u64..u64::MAX / 2) {
            let tip = ChainTip::genesis("g1");
            let mut r = Record::seal(&tip, id, tip.hlc.tick(ms), event);
            match tamper {
                1 => r.hash = "0".repeat(64),
                2 => r.event = json!({"changed": true}),
                3 => r.id.push('x'),
                _ => {}
            }
            prop_assert!(r.unsealed_split(&r.to_line()).is_some(), "every record splits");
            let full = r.verify_after(&tip);
            let sealed = Sealed::of(r.clone());
            prop_assert_eq!(sealed.line(), &r.to_line()[..]);
            prop_assert_eq!(full, sealed.check_after(&tip));
            prop_assert_eq!(
                sealed.event_text().map(String::from),
                Some(crate::canon::canonical_string(&r.event))
            );
        }

        /// A sealed line is the record's canonical JSON, and its event text the event's.
        #[test]
        fn sealing_splices_the_canonical_line(event in any_event(), id in "[ -~\\u{e9}]{0,10}", ms in 0u64..u64::MAX / 2) {
            let tip = ChainTip::genesis("g1");
            let s = Sealed::seal(&tip, id, tip.hlc.tick(ms), event);
            prop_assert_eq!(s.line(), &s.record().to_line()[..]);
            prop_assert_eq!(&s.record().hash, &s.record().compute_hash());
            prop_assert_eq!(s.event_text().map(String::from), Some(crate::canon::canonical_string(&s.record().event)));
            prop_assert!(s.check_after(&tip).is_ok());
        }
    }

    fn build(n: usize) -> Vec<Record> {
        let mut tip = ChainTip::genesis("g1");
        let mut out = Vec::new();
        for i in 0..n {
            let r = Record::seal(
                &tip,
                format!("evt_{i}"),
                tip.hlc.tick(i as u64),
                json!({"i": i}),
            );
            tip = r.verify_after(&tip).unwrap();
            out.push(r);
        }
        out
    }

    fn verify_all(graph: &str, recs: &[Record]) -> Result<(), ChainError> {
        let mut tip = ChainTip::genesis(graph);
        for r in recs {
            tip = r.verify_after(&tip)?;
        }
        Ok(())
    }

    #[test]
    fn a_chain_from_another_room_fails_at_its_first_record() {
        let recs = build(3);
        assert_eq!(
            verify_all("g2", &recs),
            Err(ChainError::PrevMismatch { seq: 1 })
        );
    }

    #[test]
    fn line_round_trips() {
        let recs = build(2);
        let back: Record = serde_json::from_slice(&recs[1].to_line()).unwrap();
        assert_eq!(back, recs[1]);
    }

    proptest! {
        #[test]
        fn any_single_edit_is_detected(n in 1usize..12, pick in any::<prop::sample::Index>(), field in 0u8..4) {
            let mut recs = build(n);
            let i = pick.index(n);
            match field {
                0 => recs[i].event = json!({"i": "edited"}),
                1 => recs[i].id.push('x'),
                2 => recs[i].hlc.c += 7,
                _ => recs[i].prev = genesis_prev("elsewhere"),
            }
            let err = verify_all("g1", &recs).unwrap_err();
            prop_assert_eq!(err.seq(), (i + 1) as u64);
        }

        #[test]
        fn reordering_is_detected(n in 2usize..10, a in any::<prop::sample::Index>(), b in any::<prop::sample::Index>()) {
            let mut recs = build(n);
            let (a, b) = (a.index(n), b.index(n));
            prop_assume!(a != b);
            recs.swap(a, b);
            prop_assert!(verify_all("g1", &recs).is_err());
        }
    }
}
