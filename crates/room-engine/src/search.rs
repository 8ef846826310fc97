//! Search over what a room's events say (issue 46): SQLite FTS5 in the room's sync index, kept
//! in the same projection path as every other index row (so `index rebuild` rebuilds it). A
//! reader finds only the events it may read (the same audience rule as `sync`), each shown as a
//! redacted excerpt, ranked, in bounded pages; searching confirms nothing and moves no
//! checkpoint. The query is words, each matched as a term (no FTS5 syntax reaches the index: a
//! quote, an operator or a column filter in the input is just text).
//!
//! A semantic mode (embeddings) is not built: asking for it is refused, saying so.

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

/// What an event says, for its excerpt.
fn said(body: &Value) -> Option<&str> {
    body["text"]
        .as_str()
        .or_else(|| body["text_blob"]["preview"].as_str())
        .or_else(|| body["created"]["title"].as_str())
}

impl Engine {
    /// An agent searches a room it is a member of, seeing only what it may read.
    pub fn search(&self, caller: &AgentCaller, a: SearchArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::Sync)?;
        let (handle, _) = self.member_handle(&p, &a.room)?;
        self.search_in(&handle, Some(&p.name), &a)
    }

    /// The owner searches any room, every event.
    pub fn search_owner(&self, _owner: &crate::Owner, a: SearchArgs) -> Outcome<Value> {
        name::validate("room", &a.room)?;
        let handle = self.room_handle(&a.room)?;
        self.search_in(&handle, None, &a)
    }

    fn search_in(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        reader: Option<&str>,
        a: &SearchArgs,
    ) -> Outcome<Value> {
        match a.mode.as_deref() {
            None | Some("text") => {}
            Some("semantic") => {
                return Err(Refusal::invalid(
                    "mode",
                    "semantic search needs an embeddings endpoint, which Room does not have yet: only text search is built",
                ));
            }
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
                let excerpt: String = said(&body)
                    .unwrap_or("")
                    .chars()
                    .take(EXCERPT_CHARS)
                    .collect();
                hits.push(
                    json!({"seq": e.seq, "id": e.id, "actor": e.actor, "kind": e.kind,
                    "task": e.task, "rank": rank,
                    "excerpt": redactor.redact(&excerpt)}),
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
}
