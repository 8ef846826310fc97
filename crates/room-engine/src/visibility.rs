//! Visibility inside a room: the withholding closure. A turn may name its audience (the members
//! who read it, its author always among them) instead of being read by every reader of the
//! room. The audience closes over descendants: a turn's audience is what it asked, narrowed by
//! the audience of every causal parent (a reply, a citation or an evaluation of a withheld event
//! is withheld from the same readers), and the records derived from a turn (its items, its
//! flags) carry its audience. So a hidden parent cannot leak through a visible child.
//!
//! The audience is computed once, under the room's lock, when the turn is written, and stored
//! in it: what a reader may see of a record never changes afterwards, so a page and its
//! confirmation render the same items, and the closure is monotonic (a descendant is never
//! wider than an ancestor). A record withheld from a reader is passed over on its pages (its
//! position still advances), never holds it at the Work Gate, and cannot be named by it as a
//! parent (it is refused exactly as an id that does not exist, so its existence does not
//! leak); nor can it be addressed to anyone outside its audience
//! (`audience_excludes_recipient`). What stays visible to every reader is the room's shape:
//! sequence numbers, and that the tip moved.

use crate::Outcome;
use crate::room::RoomHandle;
use crate::store_err;
use room_core::event::{ItemPlan, Turn, visible_to};
use room_core::{Code, Refusal, id, name};
use room_store::index::{EventRow, ItemKind};
use serde_json::json;
use std::collections::BTreeSet;

/// Names one turn's audience may list.
pub const AUDIENCE_MAX: usize = 64;

/// The audience a turn asks for, checked: members of the room, at most [`AUDIENCE_MAX`], the
/// author added. `None` when none is asked (every reader).
pub(crate) fn asked(
    audience: &[String],
    author: &str,
    members: &[String],
    room: &str,
) -> Outcome<Option<BTreeSet<String>>> {
    if audience.is_empty() {
        return Ok(None);
    }
    if audience.len() > AUDIENCE_MAX {
        return Err(Refusal::invalid(
            "audience",
            format!("at most {AUDIENCE_MAX} names"),
        ));
    }
    let mut set = BTreeSet::new();
    for a in audience {
        name::validate("audience", a)?;
        if !members.contains(a) {
            return Err(Refusal::invalid(
                "audience",
                format!("{a} is not a member of room {room}"),
            ));
        }
        set.insert(a.clone());
    }
    set.insert(author.to_string());
    Ok(Some(set))
}

/// A stored record's audience (empty: every reader).
pub(crate) fn audience_of(e: &EventRow) -> Outcome<Vec<String>> {
    // most records name none: skip the parse
    if !e.body.contains("\"audience\"") {
        return Ok(Vec::new());
    }
    let v: serde_json::Value = serde_json::from_str(&e.body).map_err(Refusal::storage)?;
    match v.get("audience") {
        None => Ok(Vec::new()),
        Some(a) => serde_json::from_value(a.clone()).map_err(|err| {
            Refusal::storage(format!(
                "event {}: audience is not a list of names: {err}",
                e.seq
            ))
        }),
    }
}

/// Whether `reader` reads the stored record `e`.
pub(crate) fn reads(e: &EventRow, reader: &str) -> Outcome<bool> {
    if crate::planted::bug("04-C03") {
        return Ok(true);
    }
    Ok(visible_to(&audience_of(e)?, reader))
}

/// The audience a turn is written with: `asked` narrowed by the audience of each causal parent
/// (`parents`: event ids the gate has found visible to `author`), of what it answers (its
/// `reply_to`, an event or the source of a mention or obligation) and of the source of every
/// item it resolves. Empty when nothing narrows it (every reader).
pub(crate) fn close(
    h: &RoomHandle,
    author: &str,
    asked: Option<BTreeSet<String>>,
    parents: &[String],
    turn: &Turn,
) -> Outcome<Vec<String>> {
    let mut sources: Vec<String> = parents.to_vec();
    // a turn that moves a task belongs to the task, whose state every reader sees: what it
    // resolves along the way does not narrow it (what it cites does, and is refused)
    let mut items: Vec<(ItemKind, &str)> = if turn.task_transition.is_some() {
        Vec::new()
    } else {
        turn.resolves
            .iter()
            .map(|r| (r.item, r.id.as_str()))
            .collect()
    };
    match turn.reply_to.as_deref() {
        Some(r) if id::is_event_id(r) => sources.push(r.to_string()),
        Some(r) if id::is_mention_id(r) => items.push((ItemKind::Mention, r)),
        Some(r) if id::is_obligation_id(r) => items.push((ItemKind::Obligation, r)),
        _ => {}
    }
    for (kind, item) in items {
        if let Some(row) = h.index.item(kind, item).map_err(store_err)? {
            sources.push(row.source);
        }
    }
    close_over(h, author, asked, &sources)
}

/// `asked` narrowed by the audience of each of the events `sources` (ids the caller has been
/// found to read; one missing narrows nothing: the caller's checks refused it already).
pub(crate) fn close_over(
    h: &RoomHandle,
    author: &str,
    asked: Option<BTreeSet<String>>,
    sources: &[String],
) -> Outcome<Vec<String>> {
    let mut audience = asked;
    for p in sources {
        let Some(e) = h.index.event_by_id(p).map_err(store_err)? else {
            continue;
        };
        let of = audience_of(&e)?;
        if of.is_empty() {
            continue;
        }
        let of: BTreeSet<String> = of.into_iter().collect();
        audience = Some(match audience {
            None => of,
            Some(a) => a.intersection(&of).cloned().collect(),
        });
    }
    let audience: Vec<String> = audience
        .map(|a| a.into_iter().collect())
        .unwrap_or_default();
    // The callers' checks admit only parents and items the author reads, so this holds; were
    // one to slip through, the turn is refused rather than written unreadable to its author.
    if !visible_to(&audience, author) {
        return Err(Refusal::invalid(
            "reply_to",
            "this turn answers or cites something you do not read",
        ));
    }
    Ok(audience)
}

/// A turn that moves a task (done, blocked, decline, handoff) is read by every reader of the
/// room, as the task's state is: it may neither name an audience nor cite what some of them do
/// not read.
pub(crate) fn check_task_turn(turn: &Turn) -> Outcome<()> {
    if turn.task_transition.is_none() || turn.audience.is_empty() {
        return Ok(());
    }
    Err(Refusal::invalid(
        "audience",
        "a turn that moves a task is read by every reader of its room, as the task is: name no audience and cite nothing withheld from any of them",
    ))
}

/// Refuse a turn that would address someone outside its audience: a mention, obligation or
/// wake would point them at a record they cannot read.
pub(crate) fn check_recipients(audience: &[String], to: &[String], plan: &ItemPlan) -> Outcome<()> {
    if audience.is_empty() {
        return Ok(());
    }
    let outside: BTreeSet<&String> = to
        .iter()
        .chain(&plan.mention)
        .chain(&plan.oblige)
        .chain(&plan.wake)
        .filter(|r| !audience.contains(r))
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = outside.iter().map(|s| s.as_str()).collect();
    Err(Refusal::new(
        Code::AudienceExcludesRecipient,
        format!(
            "{} outside this turn's audience; nothing was written",
            if names.len() == 1 {
                format!("{} is", names[0])
            } else {
                format!("{} are", names.join(", "))
            }
        ),
    )
    .detail(json!({"outside": names, "audience": audience}))
    .hint("a turn is read only by its audience, narrowed by every parent's: address only those who read it"))
}
