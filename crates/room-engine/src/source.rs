//! Governing sources. The owner may give a project a governing source (1 to 16 text files of
//! the project, its parts, in order); a task created `governed` is bound to it. Its worker reads
//! the source through Room (`source_read`), which serves UTF-8 text in bounded chunks and keeps a
//! reading receipt of every range it served; `done` on a governed task then requires, besides
//! acceptance checks, that the closer's receipts (same agent, same native conversation, since
//! its claim) cover `[0, length)` of every part of the source's current text, each at its
//! current digest (`complete_text_v1`). Registration, summaries or a few chunks do not count.

use crate::principal::{AgentCaller, Principal};
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::canon::digest_of;
use room_core::scope::Scope;
use room_core::{Code, Refusal, Verb, sha256_hex};
use room_store::control::TaskRow;
use room_store::index::SourceReadRow;
use serde_json::{Value, json};
use std::path::Path;

/// Parts one governing source may have.
pub const SOURCE_PARTS_MAX: usize = 16;
/// The largest part, in bytes.
pub const SOURCE_PART_BYTES_MAX: u64 = 4 << 20;
/// The most one `source_read` serves, in bytes (and the default).
pub const SOURCE_CHUNK_BYTES_MAX: u64 = 16 * 1024;
/// Missing ranges a coverage refusal names per part.
const MISSING_RANGES_SHOWN_MAX: usize = 16;

/// One part of a source as it stands now.
#[derive(Debug, Clone)]
pub struct Part {
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
}

/// Arguments of `source_read`.
#[derive(Debug, Clone, Default)]
pub struct SourceReadArgs {
    pub task: String,
    pub part: usize,
    pub offset: u64,
    pub length: Option<u64>,
}

impl Engine {
    /// Set (or with an empty list clear) a project's governing source (the owner console).
    /// Each part must be a readable UTF-8 file of the project now.
    pub fn project_source(
        &self,
        _owner: &crate::Owner,
        project: &str,
        parts: &[String],
    ) -> Outcome<Value> {
        let p = self.revalidate_project(project)?;
        if parts.len() > SOURCE_PARTS_MAX {
            return Err(Refusal::invalid(
                "parts",
                format!("at most {SOURCE_PARTS_MAX} parts"),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut view = Vec::new();
        for path in parts {
            Scope::parse("parts", &format!("file:{path}"))?;
            if !seen.insert(path) {
                return Err(Refusal::invalid("parts", format!("{path} is named twice")));
            }
            let (_, part) = self.read_part(&p.canonical_root, path)?;
            view.push(json!({"path": part.path, "sha256": part.sha256, "bytes": part.bytes}));
        }
        let stored = (!parts.is_empty()).then_some(parts);
        self.control()
            .set_project_source(project, stored)
            .map_err(store_err)?;
        Ok(json!({"project": project, "parts": view, "policy": "complete_text_v1"}))
    }

    /// A project's governing source as it stands now: its parts (each measured) and the
    /// digest of the whole view. `None`: the project has none.
    pub(crate) fn source_view(&self, project: &str) -> Outcome<Option<(Vec<Part>, String)>> {
        let Some(paths) = self.control().project_source(project).map_err(store_err)? else {
            return Ok(None);
        };
        let root = self.revalidate_project(project)?.canonical_root;
        let mut parts = Vec::with_capacity(paths.len());
        for path in &paths {
            parts.push(self.read_part(&root, path)?.1);
        }
        let digest = digest_of(&json!(
            parts
                .iter()
                .map(|p| json!([p.path, p.sha256, p.bytes]))
                .collect::<Vec<_>>()
        ));
        Ok(Some((parts, digest)))
    }

    /// A part's text, read beneath the project root; anything but a readable UTF-8 regular
    /// file within the size bound is `source_part_unreadable`.
    fn read_part(&self, root: &str, path: &str) -> Outcome<(String, Part)> {
        let unreadable = |why: String| {
            Refusal::new(
                Code::SourcePartUnreadable,
                format!("source part {path}: {why}"),
            )
            .detail(json!({"path": path}))
            .hint("the owner points the project's source at readable UTF-8 text files")
        };
        let bytes = self
            .env
            .fs
            .read_beneath(Path::new(root), Path::new(path), SOURCE_PART_BYTES_MAX)
            .map_err(|e| unreadable(e.to_string()))?;
        let sha256 = sha256_hex(&bytes);
        let n = bytes.len() as u64;
        let text = String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8 text".into()))?;
        Ok((
            text,
            Part {
                path: path.into(),
                sha256,
                bytes: n,
            },
        ))
    }

    /// `source_read`: serve a chunk of a governed task's source part and keep its receipt.
    pub fn source_read(&self, caller: &AgentCaller, a: SourceReadArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::SourceRead)?;
        let t = self.task_row(&a.task)?;
        let (handle, _) = self.member_handle(&p, &t.room)?;
        let (project, paths) = governed_source(self, &t)?;
        let path = paths.get(a.part).ok_or_else(|| {
            Refusal::invalid(
                "part",
                format!("the source has {} parts (0..{})", paths.len(), paths.len()),
            )
        })?;
        let length = a.length.unwrap_or(SOURCE_CHUNK_BYTES_MAX);
        if !(1..=SOURCE_CHUNK_BYTES_MAX).contains(&length) {
            return Err(Refusal::invalid(
                "length",
                format!("must be 1..={SOURCE_CHUNK_BYTES_MAX}"),
            ));
        }
        let root = self.revalidate_project(&project)?.canonical_root;
        let (text, part) = self.read_part(&root, path)?;
        if a.offset > part.bytes {
            return Err(Refusal::invalid(
                "offset",
                format!("part {} has {} bytes", a.part, part.bytes),
            ));
        }
        let (from, to) = char_range(&text, a.offset, length);
        let row = SourceReadRow {
            agent: p.name.clone(),
            conversation: p.conversation.clone(),
            task: t.id.clone(),
            path: part.path.clone(),
            sha256: part.sha256.clone(),
            from_byte: from as u64,
            to_byte: to as u64,
            at_ms: self.now_ms(),
        };
        lock_room(&handle)
            .index
            .put_source_read(&row)
            .map_err(store_err)?;
        Ok(
            json!({"task": t.id, "part": a.part, "parts_total": paths.len(), "path": part.path,
            "sha256": part.sha256, "bytes": part.bytes, "from": from, "to": to,
            "text": &text[from..to], "next_offset": (to < text.len()).then_some(to)}),
        )
    }

    /// `complete_text_v1`: the closer's receipts since `since_ms` cover every part of the
    /// source's current text, or `source_coverage_incomplete` naming what is missing.
    pub(crate) fn require_coverage(
        &self,
        h: &crate::room::RoomHandle,
        p: &Principal,
        t: &TaskRow,
        since_ms: u64,
    ) -> Outcome<Value> {
        let (project, _) = governed_source(self, t)?;
        let Some((parts, view)) = self.source_view(&project)? else {
            return Err(no_source(t));
        };
        let mut missing = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let reads = h
                .index
                .source_reads(
                    &p.name,
                    &p.conversation,
                    &t.id,
                    &part.path,
                    &part.sha256,
                    since_ms,
                )
                .map_err(store_err)?;
            let gaps = gaps(part.bytes, reads);
            if !gaps.is_empty() {
                let shown: Vec<Value> = gaps
                    .iter()
                    .take(MISSING_RANGES_SHOWN_MAX)
                    .map(|(a, b)| json!([a, b]))
                    .collect();
                missing.push(json!({"part": i, "path": part.path, "bytes": part.bytes,
                    "missing": shown, "missing_ranges": gaps.len()}));
            }
        }
        if missing.is_empty() || crate::planted::bug("04-C08") {
            return Ok(json!({"policy": "complete_text_v1", "view_sha256": view,
                "parts": parts.len(), "covered": true}));
        }
        Err(Refusal::new(
            Code::SourceCoverageIncomplete,
            format!(
                "task {}: {} of {} source parts are not read whole since the claim",
                t.id,
                missing.len(),
                parts.len()
            ),
        )
        .detail(
            json!({"task": t.id, "policy": "complete_text_v1", "view_sha256": view,
            "missing": missing}),
        )
        .hint("read the missing ranges with source_read (in this conversation), then done"))
    }
}

/// The project and part paths of a governed task's source.
fn governed_source(e: &Engine, t: &TaskRow) -> Outcome<(String, Vec<String>)> {
    let project = match (&t.project_id, t.governed) {
        (Some(p), true) => p.clone(),
        _ => {
            return Err(Refusal::invalid(
                "task",
                format!("task {} is not governed by a source", t.id),
            ));
        }
    };
    match e.control().project_source(&project).map_err(store_err)? {
        Some(paths) => Ok((project, paths)),
        None => Err(no_source(t)),
    }
}

fn no_source(t: &TaskRow) -> Refusal {
    Refusal::new(
        Code::SourcePartUnreadable,
        format!(
            "task {} is governed, and its project has no governing source now",
            t.id
        ),
    )
    .detail(json!({"task": t.id}))
    .hint("the owner sets the project's source again (room project source)")
}

/// `[offset, offset+length)` moved onto UTF-8 character boundaries: the start back, the end
/// back (but never below the start's next character, so every read makes progress).
fn char_range(text: &str, offset: u64, length: u64) -> (usize, usize) {
    let mut from = (offset as usize).min(text.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = from.saturating_add(length as usize).min(text.len());
    while !text.is_char_boundary(to) {
        to -= 1;
    }
    if to == from && from < text.len() {
        to = from + 1;
        while !text.is_char_boundary(to) {
            to += 1;
        }
    }
    (from, to)
}

/// What of `[0, len)` the ranges leave uncovered.
fn gaps(len: u64, mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0u64;
    for (a, b) in ranges {
        if a > at {
            out.push((at, a.min(len)));
        }
        at = at.max(b);
        if at >= len {
            break;
        }
    }
    if at < len {
        out.push((at, len));
    }
    out.retain(|(a, b)| a < b);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn gaps_are_what_the_ranges_leave() {
        assert_eq!(gaps(10, vec![]), [(0, 10)]);
        assert_eq!(gaps(10, vec![(0, 10)]), []);
        assert_eq!(gaps(10, vec![(5, 10), (0, 4)]), [(4, 5)]);
        assert_eq!(gaps(10, vec![(2, 3), (2, 6), (8, 12)]), [(0, 2), (6, 8)]);
        assert_eq!(gaps(0, vec![]), []);
    }

    #[test]
    fn chunks_keep_to_character_boundaries() {
        let t = "aé€😀b";
        assert_eq!(char_range(t, 0, 2), (0, 1));
        assert_eq!(char_range(t, 2, 1), (1, 3), "a start inside é moves back");
        assert_eq!(char_range(t, 6, 1), (6, 10), "one whole character at least");
        assert_eq!(char_range(t, 10, 5), (10, 11));
        assert_eq!(char_range(t, 11, 5), (11, 11), "at the end: nothing");
    }

    proptest! {
        /// Reading chunk after chunk from next_offset covers the text, whatever the sizes.
        #[test]
        fn chunked_reading_covers_everything(s in "\\PC{0,40}", step in 1u64..8) {
            let mut at = 0usize;
            let mut ranges = Vec::new();
            while at < s.len() {
                let (a, b) = char_range(&s, at as u64, step);
                prop_assert!(a <= at && b > at);
                prop_assert!(s.is_char_boundary(a) && s.is_char_boundary(b));
                ranges.push((a as u64, b as u64));
                at = b;
            }
            prop_assert!(gaps(s.len() as u64, ranges).is_empty());
        }
    }
}
