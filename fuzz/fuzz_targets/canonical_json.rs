//! Canonical JSON on arbitrary input: whatever parses canonicalizes to a fixed point that parses
//! back to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    // JCS needs finite numbers; serde_json never yields NaN, but very large floats round.
    let Ok(once) = std::panic::catch_unwind(|| room_core::canonical_bytes(&v)) else { return };
    let back: serde_json::Value = serde_json::from_slice(&once).expect("canonical output parses");
    assert_eq!(room_core::canonical_bytes(&back), once, "canonical form is a fixed point");
});
