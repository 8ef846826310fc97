//! The journal reader on arbitrary bytes: it must return records or a named error, never panic,
//! and whatever it accepts must re-verify as a chain.
#![no_main]
use libfuzzer_sys::fuzz_target;
use room_core::chain::ChainTip;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir();
    let mut f = tempfile::tempfile_in(dir).expect("temp file");
    f.write_all(data).expect("write");
    // Start from whatever genesis the first line claims, so real journals in the corpus are
    // read deep instead of failing at their first record.
    let genesis = data
        .split(|b| *b == b'\n')
        .next()
        .and_then(|l| serde_json::from_slice::<room_core::Record>(l).ok())
        .map(|r| ChainTip { seq: 0, hash: r.prev, hlc: room_core::Hlc::ZERO })
        .unwrap_or_else(|| ChainTip::genesis("fuzz"));
    let mut seen = Vec::new();
    if let Ok(end) = room_store::journal::scan(&f, 0, genesis.clone(), |s| {
        seen.push(s.record);
        Ok(())
    }) {
        let mut tip = genesis;
        for r in &seen {
            tip = r.verify_after(&tip).expect("accepted records form a chain");
        }
        assert_eq!(tip.seq, end.tip.seq);
        assert!(end.end + end.torn_bytes + end.free_bytes == data.len() as u64);
    }
});
