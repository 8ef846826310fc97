//! Composition: one read across a bounded set of rooms, in causal (HLC) order. Its authority is
//! the intersection of its constituents': every room must exist, be readable, have its
//! admission open, count the caller among its readers, and share one project binding; one that
//! fails makes the whole request `incomplete_source_set` (never a partial composition that
//! drops a restriction). Pages are bound to the request and to a snapshot of every source (tip
//! and view): a source that moved between pages is `graph_page_snapshot_changed`, so an export
//! never mixes generations. A composition reads only: it confirms nothing, moves no checkpoint
//! and passes no Work Gate.
//!
//! Reading several rooms at once is the owner's to grant (`compose_grant`): a grant names one
//! agent and the rooms (of one project) it may read composed, and is re-read on every page, so
//! a revoked grant ends the export at its next page (`composition_not_granted`). The grant
//! widens nothing: the reader must still read each room itself, and the effective scope is the
//! intersection of the grant, each room's roster and admission, and the project.

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
/// Grants one agent may hold unrevoked.
pub const COMPOSE_GRANTS_PER_AGENT_MAX: usize = 64;
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
        // each constituent first (which fails names each), then the grant over all of them
        let snapshot = self.admit_sources(&p, &rooms)?;
        let grant = self.composition_granted(&p.name, &rooms)?;
        let request_sha256 = digest_of(&json!({"v": 1, "rooms": rooms, "reader": p.name,
            "conversation": p.conversation, "limit": limit, "grant": grant}));
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
        Ok(
            json!({"rooms": rooms, "grant": grant, "request_sha256": request_sha256,
            "snapshot_sha256": digest_of(&json!(snapshot)), "items": items, "more": more,
            "next": next, "read_only": true, "confers_execution": false}),
        )
    }

    /// The owner's grant under which `reader` reads `rooms` composed: none is needed for one
    /// room (a read it could make with sync); for several, an unrevoked grant to the reader
    /// naming every one of them, or `composition_not_granted`.
    fn composition_granted(&self, reader: &str, rooms: &[String]) -> Outcome<Option<String>> {
        if rooms.len() < 2 {
            return Ok(None);
        }
        let grants = self
            .control()
            .active_compositions(reader)
            .map_err(store_err)?;
        grants
            .into_iter()
            .find(|g| rooms.iter().all(|r| g.rooms.contains(r)))
            .map(|g| Some(g.id))
            .ok_or_else(|| {
                Refusal::new(
                    Code::CompositionNotGranted,
                    format!(
                        "{reader} holds no grant to read {} composed",
                        rooms.join(", ")
                    ),
                )
                .detail(json!({"rooms": rooms}))
                .hint(format!(
                    "the owner grants it: room composition grant {reader} {}",
                    rooms.join(" ")
                ))
            })
    }

    /// The owner grants `agent` reading `rooms` composed: 2..=`COMPOSE_ROOMS_MAX` rooms that
    /// exist and share one project binding.
    pub fn compose_grant(
        &self,
        _owner: &crate::Owner,
        agent: &str,
        rooms: &[String],
    ) -> Outcome<Value> {
        name::validate("agent", agent)?;
        let rooms = compose_rooms(rooms)?;
        if rooms.len() < 2 {
            return Err(Refusal::invalid(
                "rooms",
                format!("a grant names 2..={COMPOSE_ROOMS_MAX} rooms (one room is read with sync)"),
            ));
        }
        let mut c = self.control();
        if c.agent(agent).map_err(store_err)?.is_none() {
            return Err(
                Refusal::new(Code::NotFound, format!("no agent named {agent:?}"))
                    .hint("run `room agent list`"),
            );
        }
        let mut projects = std::collections::BTreeSet::new();
        for r in &rooms {
            let row = c
                .room(r)
                .map_err(store_err)?
                .ok_or_else(|| crate::rooms::Rooms::not_found(r))?;
            projects.insert(row.project_id);
        }
        if projects.len() > 1 {
            return Err(Refusal::invalid(
                "rooms",
                "they are bound to different projects: a composition of them would be empty",
            ));
        }
        let held = c.active_compositions(agent).map_err(store_err)?.len();
        if held >= COMPOSE_GRANTS_PER_AGENT_MAX {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!("{agent} holds {held} composition grants already"),
            )
            .detail(json!({"quota": "compose_grants", "max": COMPOSE_GRANTS_PER_AGENT_MAX}))
            .hint("revoke one first: room composition revoke ID"));
        }
        let row = room_store::control::CompositionRow {
            id: format!("cmp_{}", self.env.entropy.hex(8)),
            agent: agent.to_string(),
            rooms,
            project: projects.into_iter().next().flatten(),
            created_ms: self.now_ms(),
            revoked_ms: None,
        };
        c.insert_composition(&row).map_err(store_err)?;
        Ok(grant_view(&row))
    }

    /// The owner revokes a grant: a composition under it is refused from its next page.
    pub fn compose_revoke(&self, _owner: &crate::Owner, id: &str) -> Outcome<Value> {
        let mut c = self.control();
        let Some(g) = c.composition(id).map_err(store_err)? else {
            return Err(
                Refusal::new(Code::NotFound, format!("no composition grant {id:?}"))
                    .hint("run `room composition list`"),
            );
        };
        let revoked = c.revoke_composition(id, self.now_ms()).map_err(store_err)?;
        Ok(json!({"id": id, "agent": g.agent, "revoked": true, "changed": revoked}))
    }

    /// The grants (of `agent`, or all), revoked ones too.
    pub fn compose_grants(&self, _owner: &crate::Owner, agent: Option<&str>) -> Outcome<Value> {
        let grants = self
            .control()
            .compositions(agent, COMPOSITIONS_LISTED_MAX)
            .map_err(store_err)?;
        Ok(json!({"grants": grants.iter().map(grant_view).collect::<Vec<_>>()}))
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

/// Grants read at once (the store's page ceiling).
const COMPOSITIONS_LISTED_MAX: usize = room_store::control::COMPOSITIONS_PAGE_MAX;

fn grant_view(g: &room_store::control::CompositionRow) -> Value {
    json!({"id": g.id, "agent": g.agent, "rooms": g.rooms, "project": g.project,
        "created_ms": g.created_ms, "revoked_ms": g.revoked_ms, "active": g.revoked_ms.is_none()})
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
