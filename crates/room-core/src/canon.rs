//! Canonical JSON (RFC 8785, JCS) and SHA-256 digests. Every digest Room stores or compares is
//! taken over canonical bytes, so two encoders that agree on the value agree on the digest.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Canonical bytes of any serializable value.
///
/// Panics only if the value cannot be represented as JSON (a non-finite float or a map with
/// non-string keys), which no Room type produces.
pub fn canonical_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).expect("room values are always representable as JSON")
}

/// Canonical JSON text of a value.
pub fn canonical_string<T: Serialize>(value: &T) -> String {
    String::from_utf8(canonical_bytes(value)).expect("canonical JSON is UTF-8")
}

/// Lower-case hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Lower-case hex SHA-256 of the canonical form of a value.
pub fn digest_of<T: Serialize>(value: &T) -> String {
    sha256_hex(&canonical_bytes(value))
}

/// The digest of the canonical form of an array, built from its elements' canonical texts
/// without serializing them again: a canonical array is its elements' canonical texts joined
/// by commas in brackets.
pub struct ArrayDigest {
    hasher: Sha256,
    empty: bool,
}

impl Default for ArrayDigest {
    fn default() -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"[");
        ArrayDigest {
            hasher,
            empty: true,
        }
    }
}

impl ArrayDigest {
    /// Add the next element, given as its canonical text.
    pub fn push(&mut self, canonical_element: &str) {
        if !self.empty {
            self.hasher.update(b",");
        }
        self.empty = false;
        self.hasher.update(canonical_element.as_bytes());
    }

    pub fn finish(mut self) -> String {
        self.hasher.update(b"]");
        hex::encode(self.hasher.finalize())
    }
}

/// True when `s` is 64 lower-case hex characters.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_array_digest_from_element_texts_is_the_digest_of_the_array() {
        let items = [
            serde_json::json!({"b": 1, "a": "x\u{e9}"}),
            serde_json::json!([1, 2.5, null]),
            serde_json::json!("s"),
        ];
        for n in 0..=items.len() {
            let mut d = ArrayDigest::default();
            for v in &items[..n] {
                d.push(&canonical_string(v));
            }
            assert_eq!(d.finish(), digest_of(&items[..n].to_vec()), "{n} elements");
        }
    }
    use serde_json::{Value, json};

    #[test]
    fn keys_are_sorted_and_whitespace_removed() {
        let v = json!({"b": 1, "a": [true, null, "x"], "c": {"z": 1.5, "y": -0.0}});
        assert_eq!(
            canonical_string(&v),
            r#"{"a":[true,null,"x"],"b":1,"c":{"y":0,"z":1.5}}"#
        );
    }

    #[test]
    fn rfc8785_number_and_string_forms() {
        let v: Value = serde_json::from_str(r#"{"n":1E2,"s":"\u00e9\n","big":1e21}"#).unwrap();
        assert_eq!(
            canonical_string(&v),
            "{\"big\":1e+21,\"n\":100,\"s\":\"\u{e9}\\n\"}"
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn canonical_form_is_a_fixed_point(v in arb_json()) {
            let once = canonical_bytes(&v);
            let reparsed: Value = serde_json::from_slice(&once).unwrap();
            prop_assert_eq!(&reparsed, &v);
            prop_assert_eq!(canonical_bytes(&reparsed), once);
        }

        #[test]
        fn digest_is_independent_of_key_order(pairs in prop::collection::btree_map("[a-z]{1,5}", any::<i64>(), 0..8)) {
            let forward: serde_json::Map<String, Value> = pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            let mut reverse = serde_json::Map::new();
            for (k, v) in pairs.iter().rev() { reverse.insert(k.clone(), json!(v)); }
            prop_assert_eq!(digest_of(&forward), digest_of(&reverse));
        }
    }
}
