//! The wake obligation fold: unfinished work stays visible instead of disappearing behind a
//! process status. Every open obligation of a room is shown with its fold state: `pending`
//! while its wake deadline (plus `[dispatch] obligation_fold_ms`) is ahead, `dead_obligation`
//! once it has passed unproven, that is, with no reply that resolved it. A dead obligation is
//! still open: a late reply still resolves it; the fold only says that nobody is being woken
//! for it any more.
//!
//! Circular waits: an open obligation from A to B means A waits on B. A cycle of such waits
//! (A on B, B on A, or longer) blocks everyone in it. From each agent a breadth-first walk of
//! at most `WAIT_LINKS_MAX` links finds the shortest cycle through it, surfaced with the
//! obligations that close it; so every agent caught in a cycle is named, though a longer cycle
//! whose every member also sits on a shorter one is not listed apart.
//!
//! The fold is computed when read, from the room index and the clock: it writes nothing, so
//! it can never disagree with the journal.

use crate::{Engine, Outcome, lock_room, store_err};
use room_store::index::ItemRow;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Open obligations one view lists (oldest first); more are counted, not listed.
pub const FOLD_PAGE_MAX: usize = 256;
/// Links a circular-wait walk follows at most.
pub const WAIT_LINKS_MAX: usize = 20;
/// Cycles one view reports at most.
pub const CYCLES_MAX: usize = 16;

/// An obligation's fold state at `now_ms`.
pub fn fold_state(not_after_ms: Option<u64>, fold_ms: u64, now_ms: u64) -> &'static str {
    match not_after_ms {
        Some(t) if now_ms > t.saturating_add(fold_ms) => "dead_obligation",
        _ => "pending",
    }
}

impl Engine {
    /// The owner's view of a room's open obligations: each with its fold state, and the
    /// circular waits among them.
    pub fn obligations_view(&self, _owner: &crate::Owner, room: &str) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        let rows = {
            let h = lock_room(&handle);
            h.readable()?;
            h.index
                .open_obligations(FOLD_PAGE_MAX + 1)
                .map_err(store_err)?
        };
        let truncated = rows.len() > FOLD_PAGE_MAX;
        let rows = &rows[..rows.len().min(FOLD_PAGE_MAX)];
        let now = self.now_ms();
        let fold_ms = self.policy().obligation_fold_ms;
        let list: Vec<Value> = rows
            .iter()
            .map(|o| {
                json!({"id": o.id, "from": o.from_agent, "to": o.agent, "task": o.task,
                    "source": o.source, "not_after_ms": o.not_after_ms,
                    "fold": fold_state(o.not_after_ms, fold_ms, now)})
            })
            .collect();
        let dead = list
            .iter()
            .filter(|o| o["fold"] == "dead_obligation")
            .count();
        Ok(json!({"room": room, "obligations": list, "dead": dead,
            "circular_waits": circular_waits(rows), "truncated": truncated,
            "fold_ms": fold_ms}))
    }
}

/// The cycles of waits among `open` obligations (from waits on to), each once: its agents
/// in walk order from the least, and the obligations along it.
pub fn circular_waits(open: &[ItemRow]) -> Vec<Value> {
    // the first obligation of each (from, to) pair stands for the pair
    let mut edges: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
    for o in open {
        edges
            .entry(o.from_agent.as_str())
            .or_default()
            .entry(o.agent.as_str())
            .or_insert(o.id.as_str());
    }
    let mut seen: BTreeSet<Vec<&str>> = BTreeSet::new();
    let mut out = Vec::new();
    for &start in edges.keys() {
        let Some(path) = shortest_cycle(&edges, start) else {
            continue;
        };
        // one cycle, found from each of its agents: keep the rotation that starts at the least
        let least = (0..path.len())
            .min_by_key(|&i| path[i])
            .expect("a cycle has an agent");
        let mut agents: Vec<&str> = path[least..].to_vec();
        agents.extend_from_slice(&path[..least]);
        if !seen.insert(agents.clone()) {
            continue;
        }
        let obligations: Vec<&str> = (0..agents.len())
            .map(|i| edges[agents[i]][agents[(i + 1) % agents.len()]])
            .collect();
        out.push(json!({"agents": agents, "obligations": obligations}));
        if out.len() >= CYCLES_MAX {
            break;
        }
    }
    out
}

/// The shortest walk from `start` back to it, at most `WAIT_LINKS_MAX` links: its agents,
/// `start` first.
fn shortest_cycle<'a>(
    edges: &BTreeMap<&'a str, BTreeMap<&'a str, &'a str>>,
    start: &'a str,
) -> Option<Vec<&'a str>> {
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue: VecDeque<(&str, usize)> = VecDeque::from([(start, 0)]);
    while let Some((at, depth)) = queue.pop_front() {
        if depth >= WAIT_LINKS_MAX {
            continue;
        }
        for &next in edges.get(at).map(|m| m.keys()).into_iter().flatten() {
            if next == start {
                let mut path = vec![at];
                let mut cur = at;
                while cur != start {
                    cur = parent[cur];
                    path.push(cur);
                }
                path.reverse();
                return Some(path);
            }
            if next != start && !parent.contains_key(next) {
                parent.insert(next, at);
                queue.push_back((next, depth + 1));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use room_store::index::ItemKind;

    fn ob(id: &str, from: &str, to: &str) -> ItemRow {
        ItemRow {
            kind: ItemKind::Obligation,
            id: id.into(),
            source: "evt".into(),
            source_seq: 1,
            agent: to.into(),
            from_agent: from.into(),
            task: None,
            status: "open".into(),
            resolved_by: None,
            not_after_ms: Some(10),
        }
    }

    #[test]
    fn a_cycle_is_found_once_from_the_least_agent_with_its_obligations() {
        let open = [
            ob("o1", "b", "c"),
            ob("o2", "c", "a"),
            ob("o3", "a", "b"),
            ob("o4", "a", "d"),
        ];
        let c = circular_waits(&open);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0]["agents"], json!(["a", "b", "c"]));
        assert_eq!(c[0]["obligations"], json!(["o3", "o1", "o2"]));
        assert!(circular_waits(&[ob("o1", "a", "b"), ob("o2", "b", "c")]).is_empty());
    }

    #[test]
    fn a_cycle_longer_than_the_walk_is_not_claimed() {
        let n = WAIT_LINKS_MAX + 2;
        let open: Vec<ItemRow> = (0..n)
            .map(|i| {
                ob(
                    &format!("o{i}"),
                    &format!("a{i:02}"),
                    &format!("a{:02}", (i + 1) % n),
                )
            })
            .collect();
        assert!(circular_waits(&open).is_empty());
        let open: Vec<ItemRow> = (0..WAIT_LINKS_MAX)
            .map(|i| {
                ob(
                    &format!("o{i}"),
                    &format!("a{i:02}"),
                    &format!("a{:02}", (i + 1) % WAIT_LINKS_MAX),
                )
            })
            .collect();
        assert_eq!(circular_waits(&open).len(), 1);
    }

    #[test]
    fn an_obligation_is_dead_only_past_its_deadline_and_the_fold_age() {
        assert_eq!(fold_state(Some(100), 50, 150), "pending");
        assert_eq!(fold_state(Some(100), 50, 151), "dead_obligation");
        assert_eq!(fold_state(None, 0, u64::MAX), "pending");
    }
}
