//! Composition: one read across a bounded set of rooms, in causal (HLC) order. Its authority is
//! the intersection of its constituents': every room must exist, be readable, have its
//! admission open, count the caller among its readers, and share one project binding; one that
//! fails makes the whole request `incomplete_source_set` (never a partial composition that
//! drops a restriction). Pages are bound to the request and to a snapshot of every source (tip
//! and view): a source that moved between pages is `graph_page_snapshot_changed`, so an export
//! never mixes generations. A composition reads only: it confirms nothing, moves no checkpoint
//! and passes no Work Gate.

use crate::principal::{AgentCaller, Principal};
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::canon::digest_of;
use room_core::{Code, Refusal, Verb, name};
use room_store::index::EventRow;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Rooms one composition may name.
pub const COMPOSE_ROOMS_MAX: usize = 8;
/// Items one page may carry (and the default).
pub const COMPOSE_ITEMS_MAX: usize = 200;
const COMPOSE_ITEMS_DEFAULT: usize = 50;
/// A rendered event over this is carried as a stub naming it (read it with sync).
const COMPOSE_ITEM_BYTES_MAX: usize = 8 * 1024;
/// Bytes of items on one page.
const COMPOSE_PAGE_BYTES_MAX: usize = 64 * 1024;
/// What a page's envelope (cursor, snapshot, sources) may take beside its items.
const COMPOSE_ENVELOPE_BYTES: usize = 2048;

#[derive(Debug, Clone, Default)]
pub struct ComposeArgs {
    pub rooms: Vec<String>,
    pub cursor: Option<Value>,
    pub limit: Option<usize>,
}

/// One source as the snapshot pins it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Source {
    room: String,
    tip_seq: u64,
    tip_hash: String,
    view_gen: String,
}

/// Where the next page starts: the request and snapshot it belongs to, and per room the last
/// seq already served.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cursor {
    request_sha256: String,
    snapshot: Vec<Source>,
    after: BTreeMap<String, u64>,
}

impl Engine {
    pub fn room_compose(&self, caller: &AgentCaller, a: ComposeArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::RoomCompose)?;
        // a composition reads: whoever may not read a room may not read it composed either
        self.authorize(caller, Verb::Sync)?;
        let rooms = compose_rooms(&a.rooms)?;
        let limit = a.limit.unwrap_or(COMPOSE_ITEMS_DEFAULT);
        if !(1..=COMPOSE_ITEMS_MAX).contains(&limit) {
            return Err(Refusal::invalid(
                "limit",
                format!("must be 1..={COMPOSE_ITEMS_MAX}"),
            ));
        }
        let snapshot = self.admit_sources(&p, &rooms)?;
        let request_sha256 = digest_of(&json!({"v": 1, "rooms": rooms, "reader": p.name,
            "conversation": p.conversation, "limit": limit}));
        let after = match a.cursor {
            None => rooms.iter().map(|r| (r.clone(), 0)).collect(),
            Some(c) => resume(c, &request_sha256, &snapshot)?,
        };
        // a transport's lower page ceiling (MCP's) bounds the items too, less the envelope's share
        let page_bytes = p.page_bytes_max.map_or(COMPOSE_PAGE_BYTES_MAX, |b| {
            b.saturating_sub(COMPOSE_ENVELOPE_BYTES)
                .clamp(COMPOSE_ITEM_BYTES_MAX, COMPOSE_PAGE_BYTES_MAX)
        });
        let (items, after) = self.compose_page(&p.name, &snapshot, after, limit, page_bytes)?;
        let more = snapshot
            .iter()
            .any(|s| after.get(&s.room).copied().unwrap_or(0) < s.tip_seq);
        let next = more.then(|| {
            serde_json::to_value(Cursor {
                request_sha256: request_sha256.clone(),
                snapshot: snapshot.clone(),
                after,
            })
            .expect("cursors serialize")
        });
        Ok(json!({"rooms": rooms, "request_sha256": request_sha256,
            "snapshot_sha256": digest_of(&json!(snapshot)), "items": items, "more": more,
            "next": next, "read_only": true, "confers_execution": false}))
    }

    /// Every constituent admitted for the reader, or `incomplete_source_set` naming each that
    /// failed and why; the snapshot of those that stand.
    fn admit_sources(&self, p: &Principal, rooms: &[String]) -> Outcome<Vec<Source>> {
        let mut failed = Vec::new();
        let mut snapshot = Vec::new();
        let mut projects = BTreeMap::new();
        for room in rooms {
            match self.constituent(p, room) {
                Ok((src, project)) => {
                    projects.insert(room.clone(), project);
                    snapshot.push(src);
                }
                Err(r) => failed.push(json!({"room": room, "code": r.code, "reason": r.message})),
            }
        }
        let distinct: std::collections::BTreeSet<&Option<String>> = projects.values().collect();
        if distinct.len() > 1 {
            for (room, project) in &projects {
                failed.push(json!({"room": room, "code": "project", "project": project,
                    "reason": "the constituents are bound to different projects: their intersection is empty"}));
            }
        }
        if failed.is_empty() {
            return Ok(snapshot);
        }
        Err(Refusal::new(
            Code::IncompleteSourceSet,
            format!(
                "{} of {} rooms cannot be composed for {}",
                failed.len().min(rooms.len()),
                rooms.len(),
                p.name
            ),
        )
        .detail(json!({"failed": failed}))
        .hint("compose only rooms of one project (or only coordination rooms) that you read and whose admission is open"))
    }

    /// One room as a source: the caller reads it now, its admission is open, it is readable.
    fn constituent(&self, p: &Principal, room: &str) -> Outcome<(Source, Option<String>)> {
        let (handle, binding) = self.member_handle(p, room)?;
        self.admitted(room)?;
        let key = self.sync_key(p, room)?;
        let h = lock_room(&handle);
        h.readable()?;
        let tip = h.tip();
        Ok((
            Source {
                room: room.into(),
                tip_seq: tip.seq,
                tip_hash: tip.hash,
                view_gen: key.view_gen,
            },
            binding.project().map(String::from),
        ))
    }

    /// The next `limit` events across the sources in HLC order, each at most up to its
    /// snapshot's tip, as the reader would see them (redacted, and without those withheld from
    /// it, which only move its position on), and the new positions.
    fn compose_page(
        &self,
        reader: &str,
        snapshot: &[Source],
        mut after: BTreeMap<String, u64>,
        limit: usize,
        page_bytes: usize,
    ) -> Outcome<(Vec<Value>, BTreeMap<String, u64>)> {
        let policy = self.policy();
        let redactor = policy.redactor()?;
        // (hlc, room, seq, rendering; none when withheld from the reader)
        let mut candidates: Vec<(u64, u64, String, u64, Option<String>)> = Vec::new();
        for s in snapshot {
            let from = after.get(&s.room).copied().unwrap_or(0);
            if from >= s.tip_seq {
                continue;
            }
            let handle = self.room_handle(&s.room)?;
            let h = lock_room(&handle);
            h.readable()?;
            let rows: Vec<EventRow> = h
                .index
                .events_from(from + 1, limit)
                .map_err(store_err)?
                .into_iter()
                .filter(|e| e.seq <= s.tip_seq)
                .collect();
            for e in rows {
                let text = if crate::visibility::reads(&e, reader)? {
                    Some(self.render(&h, &e, redactor)?.text.clone())
                } else {
                    None
                };
                candidates.push((e.hlc_ms, e.hlc_c.into(), s.room.clone(), e.seq, text));
            }
        }
        candidates.sort();
        let mut items = Vec::new();
        let mut used = 0usize;
        // a withheld event counts toward the limit as a served one does: each room fetched
        // `limit` rows, and going past them could serve a later event before an earlier one
        for (_, _, room, seq, text) in candidates.into_iter().take(limit) {
            let Some(text) = text else {
                after.insert(room, seq);
                continue;
            };
            let mut item: Value = serde_json::from_str(&text).map_err(Refusal::storage)?;
            if text.len() > COMPOSE_ITEM_BYTES_MAX {
                item = json!({"seq": seq, "id": item["id"], "kind": item["kind"],
                    "actor": item["actor"], "hlc": item["hlc"], "oversize_bytes": text.len(),
                    "hint": "read it whole with room_sync in its room"});
            }
            let bytes = item.to_string().len();
            if !items.is_empty() && used + bytes > page_bytes {
                break;
            }
            used += bytes;
            item["room"] = json!(room);
            after.insert(room, seq);
            items.push(item);
        }
        Ok((items, after))
    }
}

/// The constituents: 1..=8 distinct valid room names, in name order.
fn compose_rooms(list: &[String]) -> Outcome<Vec<String>> {
    if list.is_empty() || list.len() > COMPOSE_ROOMS_MAX {
        return Err(Refusal::invalid(
            "rooms",
            format!("name 1..={COMPOSE_ROOMS_MAX} rooms"),
        ));
    }
    let mut rooms = Vec::with_capacity(list.len());
    for r in list {
        name::validate("rooms", r)?;
        rooms.push(r.clone());
    }
    rooms.sort();
    if rooms.windows(2).any(|w| w[0] == w[1]) {
        return Err(Refusal::invalid("rooms", "a room is named twice"));
    }
    Ok(rooms)
}

/// The positions a cursor resumes from, after checking it belongs to this request and that
/// no source moved since its first page.
fn resume(c: Value, request_sha256: &str, now: &[Source]) -> Outcome<BTreeMap<String, u64>> {
    let c: Cursor = serde_json::from_value(c)
        .map_err(|e| Refusal::invalid("cursor", format!("not a composition cursor: {e}")))?;
    if c.request_sha256 != request_sha256 {
        return Err(Refusal::invalid(
            "cursor",
            "it belongs to another request (rooms, reader or limit differ)",
        ));
    }
    let changed: Vec<&str> = now
        .iter()
        .filter(|s| !c.snapshot.contains(s))
        .map(|s| s.room.as_str())
        .collect();
    if !changed.is_empty() || c.snapshot.len() != now.len() {
        return Err(Refusal::new(
            Code::GraphPageSnapshotChanged,
            format!(
                "sources changed since the first page: {}",
                changed.join(", ")
            ),
        )
        .detail(json!({"changed": changed}))
        .hint("start again without a cursor: a composition never mixes generations"));
    }
    for (room, seq) in &c.after {
        let tip = now.iter().find(|s| &s.room == room).map(|s| s.tip_seq);
        if tip.is_none_or(|t| *seq > t) {
            return Err(Refusal::invalid(
                "cursor",
                format!("position {seq} in room {room} is outside the snapshot"),
            ));
        }
    }
    Ok(c.after)
}
