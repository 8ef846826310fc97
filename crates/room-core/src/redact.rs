//! The egress redactor. Every string that leaves toward an agent passes through it: Room's own
//! tokens, common API-key and private-key shapes, and owner-configured patterns. The same
//! redactor renders sync pages at delivery and again at confirmation, so a policy change between
//! the two is detected rather than silently papered over.

use regex::{Regex, RegexSet};
use serde_json::Value;
use std::borrow::Cow;

pub const REDACTED: &str = "[redacted]";

/// Patterns that are always on. Room tokens first: leaking one hands over an identity.
const BUILTIN: &[&str] = &[
    r"room_tok_[0-9a-f]{64}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"sk-ant-[A-Za-z0-9_\-]{20,}",
    r"sk-(?:proj-)?[A-Za-z0-9_\-]{20,}",
    r"AKIA[0-9A-Z]{16}",
    r"gh[pousr]_[A-Za-z0-9]{36,}",
    r"github_pat_[A-Za-z0-9_]{40,}",
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
    r"AIza[0-9A-Za-z_\-]{35}",
];

#[derive(Debug, Clone)]
pub struct Redactor {
    /// Every pattern in one automaton: most strings match none, and are passed in one scan.
    /// `None` when the combined automaton exceeds the regex size limit although each pattern
    /// fits: then every pattern is tried on every string, as before the prefilter.
    any: Option<RegexSet>,
    set: Vec<Regex>,
    /// Digest of the pattern list: two redactors with the same policy have the same digest.
    policy_sha256: String,
}

impl Redactor {
    /// The built-in patterns plus the owner's. An invalid owner pattern is an error: the caller
    /// must then withhold results rather than run without the owner's policy.
    pub fn new(owner_patterns: &[String]) -> Result<Redactor, String> {
        let mut set = Vec::new();
        let mut all: Vec<&str> = BUILTIN.to_vec();
        all.extend(owner_patterns.iter().map(String::as_str));
        for p in &all {
            set.push(Regex::new(p).map_err(|e| format!("redaction pattern {p:?}: {e}"))?);
        }
        let any = RegexSet::new(&all).ok();
        let policy_sha256 = crate::canon::digest_of(&all);
        Ok(Redactor {
            any,
            set,
            policy_sha256,
        })
    }

    pub fn builtin() -> Redactor {
        Redactor::new(&[]).expect("built-in redaction patterns compile")
    }

    pub fn policy_sha256(&self) -> &str {
        &self.policy_sha256
    }

    pub fn redact<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(s);
        if !self.may_match(s) {
            return out;
        }
        for re in &self.set {
            if re.is_match(&out) {
                out = Cow::Owned(re.replace_all(&out, REDACTED).into_owned());
            }
        }
        out
    }

    fn may_match(&self, s: &str) -> bool {
        self.any.as_ref().is_none_or(|set| set.is_match(s))
    }

    /// Redact every string (and every object key) inside a JSON value.
    pub fn redact_value(&self, v: &Value) -> Value {
        let mut out = v.clone();
        self.redact_in_place(&mut out);
        out
    }

    /// Redact every string (and every object key) inside a JSON value, touching only what
    /// matches.
    pub fn redact_in_place(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_in_place(x)),
            Value::Object(m) if m.keys().any(|k| self.may_match(k)) => {
                *m = std::mem::take(m)
                    .into_iter()
                    .map(|(k, mut x)| {
                        self.redact_in_place(&mut x);
                        (self.redact(&k).into_owned(), x)
                    })
                    .collect();
            }
            Value::Object(m) => m.values_mut().for_each(|x| self.redact_in_place(x)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_shapes_are_removed_everywhere_in_a_value() {
        let r = Redactor::builtin();
        let tok = format!("room_tok_{}", "ab".repeat(32));
        let v = json!({"text": format!("use {tok} now"), "list": ["AKIAABCDEFGHIJKLMNOP"], "n": 3});
        let out = r.redact_value(&v);
        assert_eq!(out["text"], "use [redacted] now");
        assert_eq!(out["list"][0], "[redacted]");
        assert_eq!(out["n"], 3);
    }

    #[test]
    fn owner_patterns_apply_and_bad_ones_fail_closed() {
        let r = Redactor::new(&["secret-[0-9]+".into()]).unwrap();
        assert_eq!(r.redact("a secret-42 b"), "a [redacted] b");
        assert!(Redactor::new(&["(".into()]).is_err());
        assert_ne!(r.policy_sha256(), Redactor::builtin().policy_sha256());
    }

    #[test]
    fn private_key_blocks_are_removed() {
        let r = Redactor::builtin();
        let text = "x -----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY----- y";
        assert_eq!(r.redact(text), "x [redacted] y");
    }
}
