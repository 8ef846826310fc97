//! `room bench search`: what full-text search costs as history grows. A room's sync index is
//! filled with 100,000 and then 1,000,000 events (up to `--history`), each a sentence of 8 to 16
//! words from a 2,000-word vocabulary, through the same projection path turns take; then one-
//! and two-word queries ask for a first page of 50. Reported: query p50 and p99 as ratios to one
//! raw SQLite commit on the same disk, and the search index's size per 100,000 events (its
//! shadow tables, by `dbstat`). Then semantic search's side: a 768-dimension vector for each
//! of the first 100,000 events, their size, and one query ranked against all of them.

use crate::bench::{BenchArgs, pct};
use room_store::backend::RoomIndex;
use room_store::index::{Batch, EventRow, Index};
use std::time::{Duration, Instant};

const VOCABULARY: usize = 2_000;
const QUERIES: usize = 400;
const BATCH: u64 = 10_000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn word(i: usize) -> String {
    // pronounceable, distinct: two syllables per index
    const S: [&str; 16] = [
        "ka", "lo", "mi", "ne", "pu", "ra", "si", "to", "ve", "zu", "ba", "de", "fo", "gi", "ha",
        "ju",
    ];
    format!("{}{}{}", S[i % 16], S[(i / 16) % 16], S[(i / 256) % 16])
}

fn event(seq: u64, rng: &mut Rng) -> EventRow {
    let n = 8 + rng.below(9);
    let text: Vec<String> = (0..n).map(|_| word(rng.below(VOCABULARY))).collect();
    EventRow {
        seq,
        id: format!("evt_{seq:016x}_00000000"),
        kind: "turn".into(),
        actor: "bench".into(),
        hlc_ms: seq,
        hlc_c: 0,
        hash: format!("{seq:064x}"),
        task: None,
        body: serde_json::json!({"kind": "turn", "actor": "bench", "verb": "note",
            "text": text.join(" ")})
        .to_string(),
    }
}

fn fts_bytes(path: &std::path::Path) -> anyhow::Result<u64> {
    let conn = rusqlite::Connection::open(path)?;
    let n: i64 = conn.query_row(
        "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name LIKE 'events_fts%'",
        [],
        |r| r.get(0),
    )?;
    Ok(n as u64)
}

fn raw_commit_us(dir: &std::path::Path) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir_in(dir)?;
    let conn = rusqlite::Connection::open(tmp.path().join("raw.db"))?;
    room_store::index::configure(&conn)?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
    let body = vec![7u8; 256];
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        let t = Instant::now();
        conn.execute("INSERT INTO t (body) VALUES (?1)", [&body])?;
        lat.push(t.elapsed());
    }
    pct(&mut lat, 0.5).ok_or_else(|| anyhow::anyhow!("no commits measured"))
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    eprintln!("measuring search in {} …", dir.display());
    let raw = raw_commit_us(&dir)?;
    let tmp = tempfile::tempdir_in(&dir)?;
    let path = tmp.path().join("sync_index.db");
    let mut idx = Index::open(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    println!(
        "{:<40} {:>10} {:>10} {:>16}  ratio p50 / p99 to one raw SQLite commit ({raw:.0} us)",
        "events in the room", "p50 us", "p99 us", "index / 100k"
    );
    let mut filled = 0u64;
    for size in [100_000u64, 1_000_000] {
        if size > a.history.max(100_000) {
            break;
        }
        while filled < size {
            let events = (filled + 1..=filled + BATCH)
                .map(|s| event(s, &mut rng))
                .collect();
            idx.apply(&Batch {
                events,
                ..Batch::default()
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            idx.flush().map_err(|e| anyhow::anyhow!("{e}"))?;
            filled += BATCH;
        }
        let mut lat = Vec::with_capacity(QUERIES);
        for q in 0..QUERIES {
            let query = if q % 2 == 0 {
                format!("\"{}\"", word(rng.below(VOCABULARY)))
            } else {
                format!(
                    "\"{}\" \"{}\"",
                    word(rng.below(VOCABULARY)),
                    word(rng.below(VOCABULARY))
                )
            };
            let t = Instant::now();
            let hits = idx
                .search(&query, 0, 50)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            lat.push(t.elapsed());
            std::hint::black_box(hits);
        }
        let (p50, p99) = (
            pct(&mut lat, 0.5).unwrap_or(0.0),
            pct(&mut lat, 0.99).unwrap_or(0.0),
        );
        // the index holds its database exclusively: measured between two opens
        drop(idx);
        let per_100k = fts_bytes(&path)? as f64 / (filled as f64 / 100_000.0);
        idx = Index::open(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
        println!(
            "{:<40} {p50:>10.0} {p99:>10.0} {:>12.1} MiB  {:.1}x / {:.1}x",
            format!("{filled} (first page of 50, 1-2 words)"),
            per_100k / (1 << 20) as f64,
            p50 / raw,
            p99 / raw
        );
    }
    semantic(idx, &path, filled.min(100_000), raw, &mut rng)?;
    Ok(())
}

/// Dimensions of the vectors the semantic rows use (a common embedding model's).
const DIMS: usize = 768;
const SEMANTIC_QUERIES: usize = 20;

/// Semantic search's side: a vector for each of `n` events, their size per 100,000 events
/// (the `embeddings` table, by `dbstat`), and one query ranked against all of them as the
/// engine does (read by pages, cosine of each, sorted).
fn semantic(
    mut idx: Index,
    path: &std::path::Path,
    n: u64,
    raw: f64,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let vector = |rng: &mut Rng| -> Vec<i8> {
        let v: Vec<f32> = (0..DIMS).map(|_| rng.below(2001) as f32 - 1000.0).collect();
        room_engine::search::quantize(&v).expect("a random vector has a length")
    };
    let mut seq = 0;
    while seq < n {
        // each vector for the record the index holds (the bench's events' hashes)
        let rows: Vec<(u64, String, Vec<i8>)> = (seq + 1..=(seq + BATCH).min(n))
            .map(|s| (s, format!("{s:064x}"), vector(rng)))
            .collect();
        idx.put_embeddings("bench", &rows)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        seq += rows.len() as u64;
    }
    let mut lat = Vec::with_capacity(SEMANTIC_QUERIES);
    for _ in 0..SEMANTIC_QUERIES {
        let q = vector(rng);
        let t = Instant::now();
        let mut ranked = Vec::with_capacity(n as usize);
        let mut before = u64::MAX;
        loop {
            let page = idx
                .embeddings("bench", before, 4_096)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let Some(last) = page.last() else { break };
            before = last.0;
            ranked.extend(
                page.iter()
                    .map(|(s, v)| (room_engine::search::cosine(&q, v), *s)),
            );
        }
        ranked.sort_by(|x, y| y.0.total_cmp(&x.0));
        lat.push(t.elapsed());
        std::hint::black_box(ranked);
    }
    let (p50, p99) = (
        pct(&mut lat, 0.5).unwrap_or(0.0),
        pct(&mut lat, 0.99).unwrap_or(0.0),
    );
    // the index holds its database exclusively: measured once it is closed
    drop(idx);
    let conn = rusqlite::Connection::open(path)?;
    let bytes: i64 = conn.query_row(
        "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = 'embeddings'",
        [],
        |r| r.get(0),
    )?;
    let per_100k = bytes as f64 / (n as f64 / 100_000.0);
    println!(
        "{:<40} {p50:>10.0} {p99:>10.0} {:>12.1} MiB  {:.1}x / {:.1}x",
        format!("{n} vectors of {DIMS} (one semantic query)"),
        per_100k / (1 << 20) as f64,
        p50 / raw,
        p99 / raw
    );
    Ok(())
}
