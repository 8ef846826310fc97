//! Search over what a room's events say (issue 46): SQLite FTS5 in the room's sync index, kept
//! in the same projection path as every other index row (so `index rebuild` rebuilds it). A
//! reader finds only the events it may read (the same audience rule as `sync`), each shown as a
//! redacted excerpt, ranked, in bounded pages; searching confirms nothing and moves no
//! checkpoint. The query is words, each matched as a term (no FTS5 syntax reaches the index: a
//! quote, an operator or a column filter in the input is just text).
//!
//! The semantic mode ranks events by how close their meaning is to the query's: each event's
//! redacted text gets a vector from the owner's embeddings endpoint (`[search.embeddings]`),
//! fetched by the daemon's indexer away from any write (`embedding_work`, `embeddings_put`),
//! kept in the sync index per model; the daemon asks the endpoint for the query's vector and
//! the engine ranks the room's vectors by cosine similarity, then filters by audience as the
//! text mode does. Without an endpoint it is refused, saying so; a room not yet wholly
//! embedded says how much is (`coverage`).

use crate::principal::AgentCaller;
use crate::room::RoomHandle;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::{Refusal, Verb, name};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// The longest query, and the most words in one.
pub const QUERY_BYTES_MAX: usize = 256;
pub const QUERY_TERMS_MAX: usize = 16;
/// Results one page holds at most.
pub const PAGE_MAX: usize = 50;
/// Matches one call examines at most (withheld ones included), so a reader outside most
/// audiences still gets a bounded call: the page ends early with a cursor.
pub const SCAN_MAX: usize = 2_000;
/// The longest excerpt, in characters.
pub const EXCERPT_CHARS: usize = 240;

/// A search as the caller asked for it.
#[derive(Debug, Clone, Default)]
pub struct SearchArgs {
    pub room: String,
    pub query: String,
    /// Where the last page ended (its `next`).
    pub cursor: Option<u64>,
    pub limit: Option<usize>,
    /// `text` (the default) or `semantic`.
    pub mode: Option<String>,
}

/// One event for the indexer to embed: its seq and record hash (a vector is kept for that
/// record only: a seq a cut journal gives again is another record) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingWork {
    pub seq: u64,
    pub hash: String,
    pub text: String,
}

/// What gives a semantic query its vector: the daemon, asking the owner's endpoint (the
/// engine makes no request of its own). Called only once the caller may search the room.
pub trait QueryEmbedder: Send + Sync {
    /// The embedding model and the query's vector from it.
    fn embed(&self, query: &str) -> Outcome<(String, Vec<f32>)>;
}

/// The most dimensions a vector may have.
pub const EMBED_DIMS_MAX: usize = 8_192;
/// The longest text sent to be embedded, in characters (the rest of a long turn is cut).
pub const EMBED_TEXT_CHARS: usize = 2_000;
/// Vectors one semantic query ranks at most, the newest events' (older ones are not reached:
/// the owner's answer says so).
pub const SEMANTIC_SCAN_MAX: usize = 100_000;
const VECTORS_PAGE: usize = 4_096;

/// A vector as it is kept: unit length, each component scaled to an i8; none when it has no
/// length or a component is not a finite number.
pub fn quantize(v: &[f32]) -> Option<Vec<i8>> {
    if v.is_empty() || v.len() > EMBED_DIMS_MAX || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return None;
    }
    Some(
        v.iter()
            .map(|x| (f64::from(*x) / norm * 127.0).round().clamp(-127.0, 127.0) as i8)
            .collect(),
    )
}

/// Cosine similarity of two kept vectors (0 for vectors of different lengths).
pub fn cosine(a: &[i8], b: &[i8]) -> f64 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0i64, 0i64, 0i64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (i64::from(*x), i64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0 || nb == 0 {
        return 0.0;
    }
    dot as f64 / ((na as f64).sqrt() * (nb as f64).sqrt())
}

/// The words of `q` as an FTS5 query: each a quoted term, all required.
fn fts_query(q: &str) -> Outcome<String> {
    if q.len() > QUERY_BYTES_MAX || q.contains('\0') {
        return Err(Refusal::invalid(
            "query",
            format!("1..={QUERY_BYTES_MAX} bytes of text"),
        ));
    }
    let words: Vec<String> = q
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .map(|w| format!("\"{w}\""))
        .collect();
    if words.is_empty() {
        return Err(Refusal::invalid("query", "names no word to search for"));
    }
    if words.len() > QUERY_TERMS_MAX {
        return Err(Refusal::invalid(
            "query",
            format!("at most {QUERY_TERMS_MAX} words"),
        ));
    }
    Ok(words.join(" "))
}

/// An event's excerpt: its text redacted whole, then cut (a secret across the cut is never
/// left half-matched).
fn excerpt(body: &Value, redactor: &room_core::redact::Redactor) -> String {
    let text = said(body).unwrap_or("");
    redactor.redact(text).chars().take(EXCERPT_CHARS).collect()
}

/// What an event says, for its excerpt.
fn said(body: &Value) -> Option<&str> {
    body["text"]
        .as_str()
        .or_else(|| body["text_blob"]["preview"].as_str())
        .or_else(|| body["created"]["title"].as_str())
}

impl Engine {
    /// An agent searches a room it is a member of, seeing only what it may read.
    pub fn search(
        &self,
        caller: &AgentCaller,
        a: SearchArgs,
        embedder: Option<&dyn QueryEmbedder>,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::Sync)?;
        let (handle, _) = self.member_handle(&p, &a.room)?;
        self.search_in(&handle, Some(&p.name), &a, embedder)
    }

    /// The owner searches any room, every event.
    pub fn search_owner(
        &self,
        _owner: &crate::Owner,
        a: SearchArgs,
        embedder: Option<&dyn QueryEmbedder>,
    ) -> Outcome<Value> {
        name::validate("room", &a.room)?;
        let handle = self.room_handle(&a.room)?;
        self.search_in(&handle, None, &a, embedder)
    }

    fn search_in(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        reader: Option<&str>,
        a: &SearchArgs,
        embedder: Option<&dyn QueryEmbedder>,
    ) -> Outcome<Value> {
        match a.mode.as_deref() {
            None | Some("text") => {}
            Some("semantic") => return self.search_semantic(handle, reader, a, embedder),
            Some(m) => {
                return Err(Refusal::invalid(
                    "mode",
                    format!("{m:?} is not text or semantic"),
                ));
            }
        }
        let query = fts_query(&a.query)?;
        let limit = a.limit.unwrap_or(20).clamp(1, PAGE_MAX);
        let policy = self.policy();
        let redactor = policy.redactor()?;
        let h = lock_room(handle);
        let mut at = a.cursor.unwrap_or(0) as usize;
        let start = at;
        let mut hits = Vec::new();
        let mut exhausted = false;
        while hits.len() < limit && at - start < SCAN_MAX {
            let batch = h
                .index
                .search(&query, at, (limit * 2).min(SCAN_MAX - (at - start)))
                .map_err(store_err)?;
            if batch.is_empty() {
                exhausted = true;
                break;
            }
            for (seq, rank) in batch {
                at += 1;
                let Some(e) = h.index.event_by_seq(seq).map_err(store_err)? else {
                    continue;
                };
                if let Some(r) = reader
                    && !crate::visibility::reads(&e, r)?
                {
                    continue;
                }
                let body: Value = serde_json::from_str(&e.body).unwrap_or(Value::Null);
                hits.push(
                    json!({"seq": e.seq, "id": e.id, "actor": e.actor, "kind": e.kind,
                    "task": e.task, "rank": rank, "excerpt": excerpt(&body, redactor)}),
                );
                if hits.len() == limit {
                    break;
                }
            }
        }
        Ok(json!({
            "room": h.name, "query": a.query, "results": hits,
            "next": (!exhausted).then_some(at as u64),
            "confirms": "nothing: searching moves no reading position",
        }))
    }
}

impl Engine {
    /// Rank the room's events by their vectors' closeness to the query's, best first, and
    /// page through those the reader may read.
    fn search_semantic(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        reader: Option<&str>,
        a: &SearchArgs,
        embedder: Option<&dyn QueryEmbedder>,
    ) -> Outcome<Value> {
        if a.query.trim().is_empty() || a.query.len() > QUERY_BYTES_MAX || a.query.contains('\0') {
            return Err(Refusal::invalid(
                "query",
                format!("1..={QUERY_BYTES_MAX} bytes of text"),
            ));
        }
        let Some(embedder) = embedder else {
            return Err(Refusal::invalid(
                "mode",
                "semantic search needs an embeddings endpoint, and none is configured",
            )
            .hint("set [search.embeddings] base_url and model in config.toml (an OpenAI-compatible /embeddings API), or search as text"));
        };
        let (model, vector) = embedder.embed(&a.query)?;
        let model = &model;
        let query = quantize(&vector).ok_or_else(|| {
            Refusal::invalid("query", "the endpoint gave the query no usable vector")
        })?;
        let limit = a.limit.unwrap_or(20).clamp(1, PAGE_MAX);
        let redactor = self.policy().redactor()?.clone();
        let h = lock_room(handle);
        // the newest `SEMANTIC_SCAN_MAX` vectors (the answer says when there were more)
        let mut ranked: Vec<(f64, u64)> = Vec::new();
        let mut before = u64::MAX;
        let mut cut = false;
        loop {
            let page = h
                .index
                .embeddings(model, before, VECTORS_PAGE)
                .map_err(store_err)?;
            let Some(last) = page.last() else { break };
            before = last.0;
            ranked.extend(page.iter().map(|(seq, v)| (cosine(&query, v), *seq)));
            if ranked.len() >= SEMANTIC_SCAN_MAX {
                cut = true;
                break;
            }
        }
        ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(y.1.cmp(&x.1)));
        // the cursor counts results this reader was given, never what it may not read (a
        // position among every event would tell how many hidden ones rank above); pages go
        // as deep as the first `SCAN_MAX` ranked events
        let skip = a.cursor.unwrap_or(0) as usize;
        let (mut seen, mut hits, mut examined) = (0usize, Vec::new(), 0usize);
        let mut more = false;
        for &(score, seq) in &ranked {
            if examined == SCAN_MAX {
                break;
            }
            examined += 1;
            let Some(e) = h.index.event_by_seq(seq).map_err(store_err)? else {
                continue;
            };
            if let Some(r) = reader
                && !crate::visibility::reads(&e, r)?
            {
                continue;
            }
            seen += 1;
            if seen <= skip {
                continue;
            }
            if hits.len() == limit {
                more = true;
                break;
            }
            let body: Value = serde_json::from_str(&e.body).unwrap_or(Value::Null);
            hits.push(
                json!({"seq": e.seq, "id": e.id, "actor": e.actor, "kind": e.kind,
                "task": e.task, "score": (score * 1e4).round() / 1e4,
                "excerpt": excerpt(&body, &redactor)}),
            );
        }
        // how much of the room has vectors: counts for the owner, only whether it is all for
        // an agent (counts would include what it may not read)
        let (embedded, with_text) = h.index.embedding_counts(model).map_err(store_err)?;
        let coverage = match reader {
            None => {
                let mut c = json!({"embedded": embedded, "events_with_text": with_text});
                if cut {
                    c["ranked"] = json!(SEMANTIC_SCAN_MAX);
                }
                c
            }
            Some(_) => json!({"complete": embedded >= with_text && !cut}),
        };
        Ok(json!({
            "room": h.name, "query": a.query, "mode": "semantic", "model": model,
            "results": hits,
            "next": more.then_some((skip + limit) as u64),
            "coverage": coverage,
            "confirms": "nothing: searching moves no reading position",
        }))
    }

    /// The daemon's indexer: rooms whose events it embeds (every room not archived).
    pub fn embedding_rooms(&self) -> Outcome<Vec<String>> {
        Ok(self
            .control()
            .rooms()
            .map_err(store_err)?
            .into_iter()
            .filter(|r| r.archived_ms.is_none())
            .map(|r| r.name)
            .collect())
    }

    /// The daemon's indexer: events of `room` after `after` with no vector for `model` yet,
    /// each with its text as every egress shows it (redacted, cut at `EMBED_TEXT_CHARS`).
    pub fn embedding_work(
        &self,
        room: &str,
        model: &str,
        after: u64,
        limit: usize,
    ) -> Outcome<Vec<EmbeddingWork>> {
        let redactor = self.policy().redactor()?.clone();
        let handle = self.room_handle(room)?;
        let h = lock_room(&handle);
        let todo = h
            .index
            .embedding_todo(model, after, limit)
            .map_err(store_err)?;
        Ok(todo
            .into_iter()
            .map(|(seq, hash, text)| EmbeddingWork {
                seq,
                hash,
                // redacted whole, then cut: no secret across the cut goes out half-matched
                text: redactor
                    .redact(&text)
                    .chars()
                    .take(EMBED_TEXT_CHARS)
                    .collect(),
            })
            .collect())
    }

    /// The daemon's indexer keeps the vectors the endpoint gave; the events whose vector is
    /// no vector (empty, too long, not finite, of no length) are skipped and named.
    pub fn embeddings_put(
        &self,
        room: &str,
        model: &str,
        rows: Vec<(EmbeddingWork, Vec<f32>)>,
    ) -> Outcome<Vec<u64>> {
        let mut kept = Vec::with_capacity(rows.len());
        let mut skipped = Vec::new();
        for (w, v) in rows {
            match quantize(&v) {
                Some(q) => kept.push((w.seq, w.hash, q)),
                None => skipped.push(w.seq),
            }
        }
        let handle = self.room_handle(room)?;
        let mut h = lock_room(&handle);
        h.index.put_embeddings(model, &kept).map_err(store_err)?;
        Ok(skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_words_never_syntax() {
        assert_eq!(fts_query("parser bug").unwrap(), "\"parser\" \"bug\"");
        assert_eq!(
            fts_query("title:x OR \"y\" NEAR(z)").unwrap(),
            "\"title\" \"x\" \"OR\" \"y\" \"NEAR\" \"z\""
        );
        assert!(fts_query("  ***  ").is_err());
        assert!(fts_query(&"a ".repeat(17)).is_err());
        assert!(fts_query(&"a".repeat(300)).is_err());
    }

    #[test]
    fn vectors_are_kept_at_unit_length_and_compared_by_angle() {
        let a = quantize(&[3.0, 4.0]).unwrap();
        assert_eq!(a, [76, 102]);
        let b = quantize(&[6.0, 8.0]).unwrap();
        assert!((cosine(&a, &b) - 1.0).abs() < 1e-9);
        let c = quantize(&[-4.0, 3.0]).unwrap();
        assert!(cosine(&a, &c).abs() < 0.01);
        assert!(quantize(&[]).is_none());
        assert!(quantize(&[0.0, 0.0]).is_none());
        assert!(quantize(&[f32::NAN]).is_none());
        assert_eq!(cosine(&a, &[1, 2, 3]), 0.0);
    }
}
