//! Sync fragments: splitting any text and reassembling it is the identity; arbitrary fragment
//! streams are refused with an error, never a panic, and never yield an item that skipped bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use room_core::chunk::{Fragment, Reassembler, split};

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let max = 4 + (data[0] as usize % 60);
    let text = String::from_utf8_lossy(&data[1..]).into_owned();
    let pieces = split(&text, 0, max);
    let mut r = Reassembler::new(1 << 20);
    let mut out = None;
    for (i, (o, p)) in pieces.iter().enumerate() {
        assert!(!p.is_empty() && p.len() <= max);
        let f = Fragment {
            seq: 1,
            offset: *o as u64,
            total_bytes: text.len() as u64,
            fragment: if i + 1 == pieces.len() { "item_complete" } else { "item_chunk" }.into(),
            data: (*p).to_string(),
        };
        out = r.push(&f).expect("well-formed fragments reassemble");
    }
    if !text.is_empty() {
        assert_eq!(out.as_deref(), Some(text.as_str()));
    }
    // Arbitrary fragment streams decoded from JSON lines: only errors, never panics.
    let mut r = Reassembler::new(4096);
    for line in text.lines() {
        if let Ok(f) = serde_json::from_str::<Fragment>(line)
            && let Ok(Some(item)) = r.push(&f)
        {
            assert!(item.len() as u64 <= 4096);
        }
    }
});
