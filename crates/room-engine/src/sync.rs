//! Sync, checkpoints and the Work Gate. An agent reads a room in pages of at most 24 KiB; each
//! page carries a receipt, and confirming the receipt advances the agent's checkpoint. A
//! checkpoint is keyed by the conversation (instance, actor, registration, native conversation,
//! room) and stamped with the view (admission, reset, project, participants, readers); a change
//! of either invalidates it. The gate lets a gated verb through only when the checkpoint covers
//! the room's frontier (the caller's own events excepted) and every named parent.

use crate::principal::Principal;
use crate::room::RoomHandle;
use crate::{Engine, Outcome, store_err};
use room_core::canon::{canonical_string, digest_of};
use room_core::event::visible_to;
use room_core::redact::Redactor;
use room_core::refusal::PageItems;
use room_core::{Code, Refusal, Tier, id};
use room_store::control::MemberStanding;
use room_store::index::{CheckpointRow, EventHead, EventRow, ReceiptRow};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::sync::Arc;

/// The digest a conversation's checkpoint is kept under: its agent's registration, the
/// conversation and the room, on this daemon instance. The canonical JSON of
/// `{"actor", "conversation", "instance", "registration", "room"}`, serialized from borrowed
/// fields (a `json!` map cost a tenth of a turn's own work) to the same bytes.
fn conversation_key(
    instance: &str,
    actor: &str,
    registration: &str,
    conversation: &str,
    room: &str,
) -> String {
    #[derive(serde::Serialize)]
    struct Key<'a> {
        actor: &'a str,
        conversation: &'a str,
        instance: &'a str,
        registration: &'a str,
        room: &'a str,
    }
    digest_of(&Key {
        actor,
        conversation,
        instance,
        registration,
        room,
    })
}

/// Bytes of each page kept for the envelope around the items.
const ENVELOPE_BYTES_RESERVE: usize = 2048;
/// Events fetched from the index per round while a page fills.
const FETCH_ROWS: usize = 64;
/// Events withheld from its reader one page passes over (it ends there, perhaps empty, and the
/// next page goes on): a page's cost stays bounded however much is withheld.
const PASSED_OVER_MAX: usize = 4096;

/// A read position: every event up to `seq` is confirmed, and `offset` bytes of event `seq+1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    pub seq: u64,
    pub offset: u64,
}

impl Pos {
    fn of_checkpoint(c: &CheckpointRow) -> Pos {
        match c.chunk_seq {
            Some(s) if s == c.confirmed_seq + 1 => Pos {
                seq: c.confirmed_seq,
                offset: c.chunk_offset,
            },
            _ => Pos {
                seq: c.confirmed_seq,
                offset: 0,
            },
        }
    }
}

/// The identity and view a checkpoint is bound to, for one caller in one room.
#[derive(Debug, Clone)]
pub struct SyncKey {
    pub actor: String,
    pub conversation: String,
    pub conversation_key: String,
    pub view_gen: String,
    /// This caller's page ceiling, envelope included (the engine's, or its transport's when
    /// lower).
    pub page_bytes: usize,
}

/// The smallest page ceiling a transport may ask for: room for the envelope and a few
/// fragments.
pub const PAGE_BYTES_MIN: usize = 4096;

/// Where a caller's reading stands.
#[derive(Debug, Clone)]
pub struct Standing {
    pub key: SyncKey,
    pub pos: Pos,
    /// A checkpoint existed but for another key or view.
    pub view_changed: bool,
}

/// One item of a page: a kept rendering of a whole event (shared, never copied until a caller
/// in process asks for a `Value`), or a fragment of one.
#[derive(Clone)]
pub(crate) enum PageItem {
    Whole(Arc<Rendered>),
    Fragment(Value),
}

impl PageItem {
    fn value(&self) -> Value {
        match self {
            PageItem::Whole(r) => r.item().clone(),
            PageItem::Fragment(v) => v.clone(),
        }
    }

    fn raw(&self) -> Arc<RawValue> {
        match self {
            PageItem::Whole(r) => r.raw(),
            PageItem::Fragment(v) => {
                Arc::from(serde_json::value::to_raw_value(v).expect("a fragment serializes"))
            }
        }
    }
}

/// One rendered page.
#[derive(Clone)]
pub(crate) struct Page {
    pub items: Vec<PageItem>,
    /// Digest of the canonical form of `items`, taken from the texts they were parsed from.
    pub items_sha256: String,
    pub start: Pos,
    pub end: Pos,
}

/// Who reads a room and who takes part in it: a reader is a member whose agent is neither
/// revoked nor denied `sync`; a participant is a reader whose owner-set tier allows writing
/// (member or above). Either set changing moves the room's view.
pub(crate) fn view_roster(members: &[MemberStanding<'_>]) -> (Vec<String>, Vec<String>) {
    let mut readers = Vec::new();
    let mut participants = Vec::new();
    for m in members {
        let Some(a) = m.agent else { continue };
        if a.revoked_ms.is_some() || m.denied.iter().any(|v| v == "sync") {
            continue;
        }
        readers.push(m.name.to_string());
        if Tier::parse(&a.max_tier).is_some_and(|t| t >= Tier::Member) {
            participants.push(m.name.to_string());
        }
    }
    (readers, participants)
}

impl Engine {
    pub(crate) fn sync_key(&self, p: &Principal, room: &str) -> Outcome<SyncKey> {
        // one guard for both: a break-glass between them would leave a view of the old epoch
        // cached as the new one's (the closure takes no guard of its own)
        let mut control = self.control();
        let epoch = control.control_epoch().map_err(store_err)?;
        let view_gen = control
            .view_gen(room, &|row, members| {
                let (readers, participants) = view_roster(members);
                let mut view = json!({
                    "admission": [row.admission_gen, row.admission_open], "reset": row.reset_gen,
                    "project": row.project_id, "participants": participants, "readers": readers,
                });
                // a cancel or resume moves the view too (absent before the first, so that
                // views of rooms never cancelled keep their digest across the upgrade)
                if row.cancel_gen > 0 {
                    view["cancel"] = json!([row.cancel_gen, row.cancelled]);
                }
                // a break-glass (engaged or released) moves every view: what was read under
                // another control epoch is read again (absent at the first epoch, as above)
                if epoch > 1 {
                    view["control_epoch"] = json!(epoch);
                }
                digest_of(&view)
            })
            .ok_or_else(|| Refusal::new(Code::RoomNotFound, "room vanished"));
        drop(control);
        let view_gen = view_gen?;
        let conversation_key = conversation_key(
            &self.state.instance_id,
            &p.name,
            &p.registration_sha256,
            &p.conversation,
            room,
        );
        let page_bytes = p.page_bytes_max.map_or(self.config.page_bytes_max, |b| {
            b.clamp(PAGE_BYTES_MIN, self.config.page_bytes_max)
        });
        Ok(SyncKey {
            actor: p.name.clone(),
            conversation: p.conversation.clone(),
            conversation_key,
            view_gen,
            page_bytes,
        })
    }

    pub(crate) fn standing(&self, h: &RoomHandle, key: SyncKey) -> Outcome<Standing> {
        let cp = h
            .index
            .checkpoint(&key.actor, &key.conversation)
            .map_err(store_err)?;
        Ok(match cp {
            Some(c) if c.conversation_key == key.conversation_key && c.view_gen == key.view_gen => {
                Standing {
                    pos: Pos::of_checkpoint(&c),
                    key,
                    view_changed: false,
                }
            }
            Some(_) => Standing {
                pos: Pos::default(),
                key,
                view_changed: true,
            },
            None => Standing {
                pos: Pos::default(),
                key,
                view_changed: false,
            },
        })
    }

    /// The item as an agent sees it: the event with blob text inlined, redacted. Every reader of
    /// a room gets the same rendering (and each page is rendered again at its confirmation), so
    /// recent renderings are kept per room, keyed by the record's hash and the policy's digest,
    /// both as text (what a page's digest covers) and parsed (what the page carries).
    pub(crate) fn render(
        &self,
        h: &RoomHandle,
        e: &EventRow,
        redactor: &Redactor,
    ) -> Outcome<Arc<Rendered>> {
        if let Some(r) = h
            .rendered
            .borrow()
            .get(e.seq, &e.hash, redactor.policy_sha256())
        {
            return Ok(r);
        }
        let r = Arc::new(Rendered {
            text: self.render_uncached(h, e, redactor)?,
            item: std::sync::OnceLock::new(),
            raw: std::sync::OnceLock::new(),
        });
        h.rendered
            .borrow_mut()
            .put(e.seq, &e.hash, redactor.policy_sha256(), r.clone());
        Ok(r)
    }

    /// [`Engine::render`] of the event `head` names, reading its row only when no rendering of
    /// it is kept. `rows` holds rows read ahead: a miss reads the rest of the batch at once (a
    /// reader far behind misses every event, and one query per event would cost it more).
    fn render_head(
        &self,
        h: &RoomHandle,
        head: &EventHead,
        rows: &mut std::collections::VecDeque<EventRow>,
        redactor: &Redactor,
    ) -> Outcome<Arc<Rendered>> {
        if let Some(r) = h
            .rendered
            .borrow()
            .get(head.seq, &head.hash, redactor.policy_sha256())
        {
            return Ok(r);
        }
        while rows.front().is_some_and(|r| r.seq < head.seq) {
            rows.pop_front();
        }
        if rows.front().is_none_or(|r| r.seq != head.seq) {
            *rows = h
                .index
                .events_from(head.seq, FETCH_ROWS)
                .map_err(store_err)?
                .into();
        }
        let e = rows
            .pop_front()
            .filter(|r| r.seq == head.seq && r.hash == head.hash)
            .ok_or_else(|| Refusal::storage(format!("event {} changed under a page", head.seq)))?;
        self.render(h, &e, redactor)
    }

    fn render_uncached(
        &self,
        h: &RoomHandle,
        e: &EventRow,
        redactor: &Redactor,
    ) -> Outcome<String> {
        let mut event: Value = serde_json::from_str(&e.body).map_err(Refusal::storage)?;
        if let Some(sha) = event
            .pointer("/text_blob/sha256")
            .and_then(Value::as_str)
            .map(String::from)
        {
            let bytes = h.blobs.get(&sha, "txt").map_err(Refusal::storage)?;
            event["text"] = Value::String(String::from_utf8_lossy(&bytes).into_owned());
            event
                .as_object_mut()
                .expect("events are objects")
                .remove("text_blob");
        }
        // A page carries what a reader acts on. The conversation and view a turn was written
        // under are the Fold Rule's bookkeeping (its replay reads them from the journal) and
        // the record's actor and kind are the item's own: left out, a busy room's pages hold
        // about a third more turns, so a reader catching up needs fewer of them.
        if let Some(m) = event.as_object_mut() {
            m.remove("conversation_key");
            m.remove("view_gen");
            if m.get("actor").and_then(Value::as_str) == Some(e.actor.as_str()) {
                m.remove("actor");
            }
            if m.get("kind").and_then(Value::as_str) == Some(e.kind.as_str()) {
                m.remove("kind");
            }
        }
        let mut item = json!({
            "seq": e.seq, "id": e.id, "actor": e.actor, "kind": e.kind,
            "hlc": format!("{}.{}", e.hlc_ms, e.hlc_c), "event": event,
        });
        redactor.redact_in_place(&mut item);
        Ok(canonical_string(&item))
    }

    /// Build `reader`'s page that starts at `start` within `page_bytes` (envelope included), or
    /// re-render exactly up to `until` (a confirmation, under the ceiling its page was served
    /// with: that decides which events arrived whole). An event withheld from `reader` is
    /// passed over: the page's end moves past it, no item stands for it.
    pub(crate) fn build_page(
        &self,
        h: &RoomHandle,
        reader: &str,
        start: Pos,
        until: Option<Pos>,
        page_bytes: usize,
        redactor: &Redactor,
    ) -> Outcome<Page> {
        assert!(
            page_bytes > ENVELOPE_BYTES_RESERVE,
            "a page ceiling leaves room for items"
        );
        let budget = page_bytes - ENVELOPE_BYTES_RESERVE;
        let chunk = self.config.chunk_bytes;
        let mut used = 0usize;
        let mut items = Vec::new();
        let mut digest = room_core::canon::ArrayDigest::default();
        let mut end = start;
        let mut next = start.seq + 1;
        let mut rows = std::collections::VecDeque::new();
        let mut passed = 0usize;
        'outer: loop {
            let heads = h
                .index
                .event_heads_from(next, FETCH_ROWS)
                .map_err(store_err)?;
            if heads.is_empty() {
                break;
            }
            for e in heads {
                if until.is_some_and(|u| end >= u) {
                    break 'outer;
                }
                next = e.seq + 1;
                if !visible_to(&e.audience, reader) && !crate::planted::bug("04-C03") {
                    // never one a reader is inside (it read fragments of it, so it reads it)
                    debug_assert!(end.offset == 0, "a withheld event is passed over whole");
                    if end.offset != 0 || passed == PASSED_OVER_MAX {
                        break 'outer;
                    }
                    passed += 1;
                    end = Pos {
                        seq: e.seq,
                        offset: 0,
                    };
                    continue;
                }
                let rendered = self.render_head(h, &e, &mut rows, redactor)?;
                let text = &rendered.text;
                let offset = if e.seq == start.seq + 1 {
                    start.offset as usize
                } else {
                    0
                };
                let whole = offset == 0 && text.len() < budget;
                if whole && until.is_none_or(|u| u.seq >= e.seq) {
                    if used + text.len() + 1 > budget {
                        break 'outer;
                    }
                    used += text.len() + 1;
                    items.push(PageItem::Whole(rendered.clone()));
                    digest.push(text);
                    end = Pos {
                        seq: e.seq,
                        offset: 0,
                    };
                    continue;
                }
                // Oversized (or resumed mid-way): fragments, each on a UTF-8 boundary.
                if !items.is_empty() && offset == 0 && until.is_none() {
                    break 'outer;
                }
                let stop_at = match until {
                    Some(u) if u.seq + 1 == e.seq => u.offset as usize,
                    _ => text.len(),
                };
                // Offsets recorded against an earlier rendering may not fit this one (the
                // redaction policy changed the text): that is a changed delivery, not a crash.
                if offset > stop_at
                    || stop_at > text.len()
                    || !text.is_char_boundary(offset)
                    || !text.is_char_boundary(stop_at)
                {
                    return Err(Refusal::new(
                        Code::RoomSyncDeliveryPolicyChanged,
                        "the delivered fragments no longer fit this event's current representation",
                    )
                    .hint("sync again and confirm the new receipt"));
                }
                for (o, piece) in room_core::chunk::split(&text[..stop_at], offset, chunk) {
                    let fin = o + piece.len() == text.len();
                    let frag = json!({
                        "seq": e.seq, "id": e.id,
                        "fragment": if fin { "item_complete" } else { "item_chunk" },
                        "offset": o, "total_bytes": text.len(), "data": piece,
                    });
                    let canon = canonical_string(&frag);
                    let size = canon.len() + 1;
                    if used + size > budget && until.is_none() {
                        break 'outer;
                    }
                    used += size;
                    items.push(PageItem::Fragment(frag));
                    digest.push(&canon);
                    end = if fin {
                        Pos {
                            seq: e.seq,
                            offset: 0,
                        }
                    } else {
                        Pos {
                            seq: e.seq - 1,
                            offset: (o + piece.len()) as u64,
                        }
                    };
                }
                if end.offset != 0 {
                    break 'outer;
                }
            }
        }
        Ok(Page {
            items,
            items_sha256: digest.finish(),
            start,
            end,
        })
    }

    /// Render a page from the caller's standing, store its receipt, return the wire view.
    /// `base` names the receipt this page continues (a delta page: the reader presented `base`
    /// and this page starts where it ended).
    pub(crate) fn serve_page(
        &self,
        h: &mut RoomHandle,
        st: &Standing,
        base: Option<&str>,
    ) -> Outcome<Value> {
        let (mut v, items, _) = self.serve_page_kept(h, st, base)?;
        v["items"] = items.iter().map(PageItem::value).collect();
        Ok(v)
    }

    /// [`Engine::serve_page`], its items kept apart: the page's other fields, its items, and
    /// the digest of the redaction policy they were rendered under.
    fn serve_page_kept(
        &self,
        h: &mut RoomHandle,
        st: &Standing,
        base: Option<&str>,
    ) -> Outcome<(Value, Vec<PageItem>, String)> {
        let policy = self.policy();
        let redactor = policy.redactor()?;
        let page = self.build_page(h, &st.key.actor, st.pos, None, st.key.page_bytes, redactor)?;
        let tip = h.tip();
        let receipt = ReceiptRow {
            id: id::receipt_id(self.env.entropy.as_ref()),
            actor: st.key.actor.clone(),
            conversation: st.key.conversation.clone(),
            conversation_key: st.key.conversation_key.clone(),
            view_gen: st.key.view_gen.clone(),
            from_seq: page.start.seq,
            from_offset: page.start.offset,
            to_seq: page.end.seq,
            chunk_seq: (page.end.offset > 0).then_some(page.end.seq + 1),
            chunk_offset: page.end.offset,
            tip_seq: tip.seq,
            tip_hash: tip.hash.clone(),
            delivered_sha256: page.items_sha256.clone(),
            created_ms: self.now_ms(),
            confirmed_ms: None,
            base: base.map(String::from),
            page_bytes: (st.key.page_bytes != self.config.page_bytes_max)
                .then_some(st.key.page_bytes as u64),
        };
        h.index.put_receipt(&receipt).map_err(store_err)?;
        h.rendered.borrow_mut().served(
            &receipt.id,
            redactor.policy_sha256(),
            &receipt.delivered_sha256,
        );
        let more = page.end.offset > 0 || page.end.seq < tip.seq;
        let mut v = json!({
            "room": h.name,
            "receipt": receipt.id,
            "confirmed_seq": st.pos.seq,
            "from_seq": page.start.seq + 1,
            "to_seq": page.end.seq,
            "tip_seq": tip.seq,
            "more": more,
            "view_changed": st.view_changed,
        });
        if let Some(b) = base {
            v["continues"] = json!(b);
        }
        Ok((v, page.items, redactor.policy_sha256().to_string()))
    }

    /// A receipt and the receipts it continues, oldest first, each checked as a confirmation
    /// checks it: this conversation's, for the current view, over a chain that still contains
    /// its tip, its delivered representation still what the redactor produces now, and each
    /// starting where the one before it ended. `field` names the argument it came from.
    fn receipt_chain(
        &self,
        h: &RoomHandle,
        st: &Standing,
        receipt_id: &str,
        field: &str,
    ) -> Outcome<Vec<ReceiptRow>> {
        if !id::is_receipt_id(receipt_id) {
            return Err(Refusal::invalid(
                field,
                "not a receipt id (rcpt_ and 32 hex)",
            ));
        }
        let unknown = || {
            Refusal::new(
                Code::ReceiptUnknown,
                format!("receipt {receipt_id} is not one of yours in this room"),
            )
            .hint("sync again without --confirm")
        };
        let mut chain: Vec<ReceiptRow> = Vec::new();
        let mut next = Some(receipt_id.to_string());
        while let Some(rid) = next {
            // Delta pages never chain deeper (`serve_page` starts over from the checkpoint),
            // so a longer chain is not one this engine wrote.
            if chain.len() == RECEIPT_CHAIN_MAX {
                return Err(unknown());
            }
            let r = h
                .index
                .receipt(&rid)
                .map_err(store_err)?
                .ok_or_else(unknown)?;
            if r.actor != st.key.actor || r.conversation != st.key.conversation {
                return Err(unknown());
            }
            next = r.base.clone();
            chain.push(r);
        }
        chain.reverse();
        let policy = self.policy();
        let redactor = policy.redactor()?;
        for (n, r) in chain.iter().enumerate() {
            self.check_receipt(h, st, r, redactor)?;
            if n > 0 {
                let prev = &chain[n - 1];
                let starts = (r.from_seq, r.from_offset);
                if starts != (prev.to_seq, prev.chunk_offset) {
                    return Err(unknown());
                }
            }
        }
        Ok(chain)
    }

    /// One receipt's own checks (see [`Engine::receipt_chain`]).
    fn check_receipt(
        &self,
        h: &RoomHandle,
        st: &Standing,
        r: &ReceiptRow,
        redactor: &Redactor,
    ) -> Outcome<()> {
        // A fork is the more specific diagnosis: check it before the view.
        let tip_ok = h
            .index
            .event_by_seq(r.tip_seq)
            .map_err(store_err)?
            .is_some_and(|e| e.hash == r.tip_hash);
        if r.tip_seq > 0 && !tip_ok {
            return Err(Refusal::new(
                Code::RoomSyncReceiptForked,
                "the receipt's tip is not in this room's chain any more",
            )
            .detail(json!({"tip_seq": r.tip_seq, "tip_hash": r.tip_hash}))
            .hint("sync again from your checkpoint"));
        }
        if (r.conversation_key != st.key.conversation_key || r.view_gen != st.key.view_gen)
            && !crate::planted::bug("04-C04")
        {
            return Err(Refusal::new(
                Code::RoomSyncViewChanged,
                "the receipt belongs to an earlier view of this room (credential, conversation, reset or participants changed)",
            )
            .hint("sync again without --confirm and confirm the new receipt"));
        }
        // A page this handle served under this policy needs no second rendering: its events
        // cannot change under it (the chain check above holds its tip), so neither can its digest.
        if h.rendered
            .borrow()
            .was_served(&r.id, redactor.policy_sha256(), &r.delivered_sha256)
        {
            return Ok(());
        }
        let start = Pos {
            seq: r.from_seq,
            offset: r.from_offset,
        };
        // under the ceiling it was served with (bounded by the engine's: the row is a store's)
        let page_bytes = r.page_bytes.map_or(self.config.page_bytes_max, |b| {
            (b as usize).clamp(PAGE_BYTES_MIN, self.config.page_bytes_max)
        });
        let page = self.build_page(
            h,
            &st.key.actor,
            start,
            Some(receipt_end(r)),
            page_bytes,
            redactor,
        )?;
        if page.items_sha256 != r.delivered_sha256 {
            return Err(Refusal::new(
                Code::RoomSyncDeliveryPolicyChanged,
                "what was delivered differs from what the current redaction policy would deliver",
            )
            .hint("sync again and confirm the new receipt"));
        }
        Ok(())
    }

    /// Where confirming `receipt_id` (and the receipts it continues) leaves the caller, without
    /// writing anything: the standing a `read_through` turn passes the gate with, and the
    /// length of the chain (a delta page continues it only while it is short).
    pub(crate) fn read_through(
        &self,
        h: &RoomHandle,
        st: &Standing,
        receipt_id: &str,
        field: &str,
    ) -> Outcome<(Standing, usize)> {
        let chain = self.receipt_chain(h, st, receipt_id, field)?;
        let first = chain.first().expect("a chain holds the receipt asked for");
        let last = chain.last().expect("a chain holds the receipt asked for");
        let start = Pos {
            seq: first.from_seq,
            offset: first.from_offset,
        };
        let end = receipt_end(last);
        // Already covered (the Fold Rule moved past it): the checkpoint stays where it is.
        let covered = end <= st.pos && !st.view_changed;
        // A confirmed receipt must start at (or before) what is already confirmed: no gaps.
        if !covered && start > st.pos {
            return Err(Refusal::new(
                Code::RoomSyncRequired,
                "the receipt starts after your checkpoint; earlier events are unread",
            )
            .hint("sync again without --confirm"));
        }
        let pos = if covered { st.pos } else { end };
        Ok((
            Standing {
                key: st.key.clone(),
                pos,
                view_changed: false,
            },
            chain.len(),
        ))
    }

    /// Confirm a receipt (and the receipts it continues) durably: the checkpoint it establishes
    /// is on disk before the caller is told. A covered receipt leaves the checkpoint where it
    /// is, but writes it durably now, since the Fold Rule's advances ride the open transaction
    /// and the reader is about to be told this confirmation holds.
    pub(crate) fn confirm_receipt(
        &self,
        h: &mut RoomHandle,
        st: &Standing,
        receipt_id: &str,
    ) -> Outcome<Standing> {
        let (to, _) = self.read_through(h, st, receipt_id, "confirm")?;
        let cp = CheckpointRow {
            actor: st.key.actor.clone(),
            conversation: st.key.conversation.clone(),
            conversation_key: st.key.conversation_key.clone(),
            view_gen: st.key.view_gen.clone(),
            confirmed_seq: to.pos.seq,
            chunk_seq: (to.pos.offset > 0).then_some(to.pos.seq + 1),
            chunk_offset: to.pos.offset,
            updated_ms: self.now_ms(),
        };
        h.index
            .confirm(receipt_id, self.now_ms(), &cp)
            .map_err(store_err)?;
        Ok(to)
    }

    /// The Work Gate. On refusal the detail carries the next page (with its receipt): after a
    /// `read_through` (`base`), a delta page that continues the presented receipt while its
    /// chain is short, else a page from the durable checkpoint (`durable`).
    pub(crate) fn gate(
        &self,
        h: &mut RoomHandle,
        st: &Standing,
        parents: &[String],
        retry: &GateRetry<'_>,
    ) -> Outcome<()> {
        let refuse = |engine: &Engine, h: &mut RoomHandle, code: Code, msg: String| -> Refusal {
            engine.sync_refusal(h, st, retry, code, msg)
        };
        if crate::planted::bug("04-C05") {
            return Ok(());
        }
        if st.view_changed {
            return Err(refuse(
                self,
                h,
                Code::RoomSyncViewChanged,
                "your checkpoint is for an earlier view of this room; sync again".into(),
            ));
        }
        if let Some(seq) = h
            .index
            .first_foreign_after(st.pos.seq, &st.key.actor)
            .map_err(store_err)?
        {
            return Err(refuse(
                self,
                h,
                Code::RoomSyncRequired,
                format!(
                    "unread events from seq {seq}; confirmed up to {}",
                    st.pos.seq
                ),
            ));
        }
        for p in parents {
            // one withheld from the caller is refused as one that does not exist: its
            // existence is not the caller's to learn
            let e = match h.index.event_by_id(p).map_err(store_err)? {
                Some(e) if !crate::visibility::reads(&e, &st.key.actor)? => None,
                e => e,
            };
            match e {
                Some(e) if e.seq <= st.pos.seq || e.actor == st.key.actor => {}
                Some(e) => {
                    return Err(refuse(
                        self,
                        h,
                        Code::RoomSyncRequired,
                        format!("causal parent {} (seq {}) is unconfirmed", e.id, e.seq),
                    ));
                }
                None => {
                    return Err(Refusal::invalid(
                        "parents",
                        format!("{p} is not an event of this room"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A refusal that sends the reader back to read, carrying what it has not read yet.
    pub(crate) fn sync_refusal(
        &self,
        h: &mut RoomHandle,
        st: &Standing,
        retry: &GateRetry<'_>,
        code: Code,
        msg: String,
    ) -> Refusal {
        // its items kept as text: the refusal writes them out where it is serialized, and a
        // caller in process reads them through `Refusal::materialize`
        let (page, items) = match retry.base {
            Some((base, chain)) if chain < RECEIPT_CHAIN_MAX => {
                self.serve_page_kept(h, st, Some(base))
            }
            _ => self.serve_page_kept(h, retry.durable, None),
        }
        .map(|(page, items, policy_sha256)| {
            let kept = PageItems {
                items: items.iter().map(PageItem::raw).collect(),
                policy_sha256,
            };
            (page, Some(Box::new(kept)))
        })
        .unwrap_or_else(|r| (json!({"error": r}), None));
        let hint = if page.get("continues").is_some() {
            "read detail.next_page, then call again with read_through: its receipt"
        } else {
            "read detail.next_page, then call again with read_through: its receipt (or sync with --confirm <receipt>)"
        };
        Refusal {
            page_items: items,
            ..Refusal::new(code, msg)
                .detail(Value::Object(serde_json::Map::from_iter([(
                    "next_page".to_string(),
                    page,
                )])))
                .hint(hint)
        }
    }
}

/// Receipts a delta page may continue: a longer run of refusals starts over from the durable
/// checkpoint, so that confirming one checks a bounded chain.
pub const RECEIPT_CHAIN_MAX: usize = 8;

/// What a refused turn's next page starts from.
pub(crate) struct GateRetry<'a> {
    /// The caller's durable standing (its checkpoint).
    pub durable: &'a Standing,
    /// The receipt the caller presented with `read_through`, and its chain's length.
    pub base: Option<(&'a str, usize)>,
}

fn receipt_end(r: &ReceiptRow) -> Pos {
    Pos {
        seq: r.to_seq,
        offset: r.chunk_offset,
    }
}

/// Recent renderings of one room's events, bounded in bytes. An entry is used only for the same
/// record (hash) under the same redaction policy (digest), so neither a rebuilt journal nor a
/// policy change can serve a stale rendering.
#[derive(Default)]
pub(crate) struct RenderCache {
    entries: std::collections::BTreeMap<u64, (String, String, Arc<Rendered>)>,
    bytes: usize,
    /// The newest pages served, as (receipt, policy digest, delivered digest).
    served: std::collections::VecDeque<(String, String, String)>,
}

/// Served pages remembered per room (a `read_through` chain checks each of its receipts).
const SERVED_KEPT_MAX: usize = 1024;

/// Rendered bytes kept per room (an entry counts `RENDERED_FOOTPRINT` times its text: the
/// parsed item is kept beside it); larger renderings are not kept at all.
const RENDER_CACHE_BYTES_MAX: usize = 512 * 1024;
const RENDER_CACHE_ENTRY_BYTES_MAX: usize = 16 * 1024;
const RENDERED_FOOTPRINT: usize = 3;

/// One event as a page carries it: its canonical text (what the page's digest covers) and that
/// text parsed (what goes on the wire) once a page carries it whole, so that a page of kept
/// renderings parses nothing (an event sent in fragments is never parsed).
pub(crate) struct Rendered {
    pub text: String,
    item: std::sync::OnceLock<Value>,
    /// The text as a refusal keeps it (see `room_core::refusal::PageItems`).
    raw: std::sync::OnceLock<Arc<RawValue>>,
}

impl Rendered {
    fn raw(&self) -> Arc<RawValue> {
        self.raw
            .get_or_init(|| {
                Arc::from(
                    RawValue::from_string(self.text.clone()).expect("rendered items are JSON"),
                )
            })
            .clone()
    }

    fn item(&self) -> &Value {
        self.item
            .get_or_init(|| serde_json::from_str(&self.text).expect("rendered items are JSON"))
    }
}

impl RenderCache {
    fn served(&mut self, receipt: &str, policy: &str, delivered: &str) {
        if self.served.len() == SERVED_KEPT_MAX {
            self.served.pop_front();
        }
        self.served
            .push_back((receipt.into(), policy.into(), delivered.into()));
    }

    fn was_served(&self, receipt: &str, policy: &str, delivered: &str) -> bool {
        self.served
            .iter()
            .rev()
            .any(|(r, p, d)| r == receipt && p == policy && d == delivered)
    }

    fn get(&self, seq: u64, hash: &str, policy: &str) -> Option<Arc<Rendered>> {
        self.entries
            .get(&seq)
            .filter(|(h, p, _)| h == hash && p == policy)
            .map(|(_, _, r)| r.clone())
    }

    fn put(&mut self, seq: u64, hash: &str, policy: &str, r: Arc<Rendered>) {
        let cost = |r: &Rendered| r.text.len() * RENDERED_FOOTPRINT;
        if r.text.len() > RENDER_CACHE_ENTRY_BYTES_MAX {
            return;
        }
        self.bytes += cost(&r);
        if let Some((_, _, old)) = self.entries.insert(seq, (hash.into(), policy.into(), r)) {
            self.bytes -= cost(&old);
        }
        // readers follow the tip: the oldest renderings go first
        while self.bytes > RENDER_CACHE_BYTES_MAX {
            match self.entries.pop_first() {
                Some((_, (_, _, old))) => self.bytes -= cost(&old),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoints already stored are kept under the digest of the `json!` map this replaced:
    /// the key must not move, whatever the fields hold.
    #[test]
    fn a_conversation_key_is_the_digest_it_always_was() {
        for (actor, conversation, room) in [
            ("ann", "c1", "lobby"),
            ("b\u{e9}\"x\\", "conv\n\t\u{1}", "r\u{1f600}"),
            ("", "", ""),
        ] {
            let old = digest_of(&json!({
                "instance": "inst_1", "actor": actor, "registration": "ab".repeat(32),
                "conversation": conversation, "room": room,
            }));
            let reg = "ab".repeat(32);
            assert_eq!(
                conversation_key("inst_1", actor, &reg, conversation, room),
                old
            );
        }
    }
}
