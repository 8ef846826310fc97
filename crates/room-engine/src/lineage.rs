//! Task lineage: delegation cannot outlive or widen its ancestry. A child task is created, and
//! later claimed and closed, only while every ancestor (at most `ANCESTRY_DEPTH_MAX` links up,
//! no cycle) is still open or claimed, unamended since its child was delegated, and its owner
//! and recipient are still members of the room and not revoked; and a child's scopes must stay
//! inside its parent's. A `coordination_only` parent has no mutating child. The walk runs again at every stage, so a
//! parent that closes or loses its people invalidates its descendants from then on.
//!
//! Scopes may also never reach what runs Room: a file scope that covers one of the engine's
//! `protected_paths` (the `room` binary, set by the daemon) is refused. The state directory,
//! worker roots and journals cannot be inside a project at all (territory refuses that).

use crate::{Engine, Outcome, store_err};
use room_core::scope::Scope;
use room_core::{Code, Refusal, TaskStatus};
use room_store::control::TaskRow;
use serde_json::json;
use std::collections::BTreeSet;

/// Parent links a lineage walk follows (the seed's delegation bound).
pub const ANCESTRY_DEPTH_MAX: usize = 16;

fn invalid(task: &str, why: String, at: &str) -> Refusal {
    Refusal::new(Code::TaskAncestryInvalid, format!("task {task}: {why}"))
        .detail(json!({"task": task, "ancestor": at}))
        .hint("delegate under a live parent, or ask the parent's owner to re-create the chain")
}

impl Engine {
    /// The ancestors of a task whose parent is `parent`, nearest first, each checked.
    pub(crate) fn valid_ancestry(&self, task: &str, parent: Option<&str>) -> Outcome<Vec<TaskRow>> {
        let mut out: Vec<TaskRow> = Vec::new();
        let mut seen = BTreeSet::from([task.to_string()]);
        let mut next = parent.map(String::from);
        // the revision of each parent its child was delegated under ("(new)" is being now)
        let mut delegated_at = match self.control().task(task).map_err(store_err)? {
            Some(t) => t.parent_revision,
            None => None,
        };
        while let Some(id) = next {
            if !seen.insert(id.clone()) {
                return Err(invalid(
                    task,
                    format!("its ancestry has a cycle through {id}"),
                    &id,
                ));
            }
            if out.len() >= ANCESTRY_DEPTH_MAX {
                return Err(invalid(
                    task,
                    format!("its ancestry is deeper than {ANCESTRY_DEPTH_MAX} links"),
                    &id,
                ));
            }
            let a = self
                .control()
                .task(&id)
                .map_err(store_err)?
                .ok_or_else(|| invalid(task, format!("ancestor {id} does not exist"), &id))?;
            if !matches!(a.status, TaskStatus::Open | TaskStatus::Claimed) {
                return Err(invalid(
                    task,
                    format!("ancestor {} is {}, not open or claimed", a.id, a.status),
                    &a.id,
                ));
            }
            for who in std::iter::once(&a.owner).chain(a.recipient.as_ref()) {
                self.eligible(task, &a, who)?;
            }
            if let Some(r) = delegated_at
                && r != a.revision
            {
                return Err(invalid(
                    task,
                    format!(
                        "ancestor {} was amended (revision {r} to {}) since its child was delegated",
                        a.id, a.revision
                    ),
                    &a.id,
                ));
            }
            delegated_at = a.parent_revision;
            next = a.parent.clone();
            out.push(a);
        }
        Ok(out)
    }

    /// An ancestor's owner or recipient must still be a member of its room, not revoked.
    fn eligible(&self, task: &str, a: &TaskRow, who: &str) -> Outcome<()> {
        let c = self.control();
        let member = c.is_member(&a.room, who).map_err(store_err)?;
        let live = c
            .agent(who)
            .map_err(store_err)?
            .is_some_and(|r| r.revoked_ms.is_none());
        if member && live {
            return Ok(());
        }
        Err(invalid(
            task,
            format!(
                "{who} of ancestor {} is no longer an eligible member of room {}",
                a.id, a.room
            ),
            &a.id,
        ))
    }

    /// A new child's scopes stay inside its parent's, and a coordination-only parent has no
    /// mutating child (one with scopes, or not itself coordination-only).
    pub(crate) fn check_delegation(
        &self,
        parent: &TaskRow,
        scopes: &[String],
        coordination_only: bool,
    ) -> Outcome<()> {
        let widened = |why: String| {
            Refusal::new(Code::TaskScopeWidened, why)
                .detail(
                    json!({"parent": parent.id, "parent_scopes": parent.scopes, "scopes": scopes}),
                )
                .hint("a subtask may only narrow its parent's scopes")
        };
        if parent.coordination_only && (!coordination_only || !scopes.is_empty()) {
            return Err(widened(format!(
                "parent {} is coordination-only: its subtasks are coordination-only too, without scopes",
                parent.id
            )));
        }
        if parent.scopes.is_empty() {
            return Ok(());
        }
        let theirs: Vec<Scope> = parent.scopes.iter().filter_map(|s| parse(s)).collect();
        for s in scopes {
            let mine = parse(s).expect("scopes were parsed at the edge");
            if !theirs.iter().any(|t| t.contains(&mine)) {
                return Err(widened(format!(
                    "scope {s} is not inside the scopes of parent {}",
                    parent.id
                )));
            }
        }
        Ok(())
    }

    /// No file scope may cover a protected path (the running `room` binary).
    pub(crate) fn check_protected(
        &self,
        project_root: &std::path::Path,
        scopes: &[String],
    ) -> Outcome<()> {
        for (i, s) in scopes.iter().enumerate() {
            let Some(sc) = parse(s).filter(|x| x.namespace == "file") else {
                continue;
            };
            let covered = project_root.join(&sc.resource);
            if let Some(p) = self
                .config
                .protected_paths
                .iter()
                .find(|p| p.starts_with(&covered))
            {
                return Err(Refusal::invalid(
                    &format!("scopes[{i}]"),
                    format!(
                        "{s} covers {}, which runs Room; a task may never lease it",
                        p.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Engine {
    /// A task's `file:` scopes as leased: each resolved within the project (through every
    /// symlink on its existing part), so that two names of one file (`srclink/a.rs` and
    /// `src/a.rs`) are one scope and conflict as one. A scope whose resolution leaves the
    /// project, or is the project root itself, is refused; one that cannot be resolved (an
    /// I/O error) too.
    pub(crate) fn resolve_file_scopes(
        &self,
        project_root: &std::path::Path,
        scopes: Vec<String>,
    ) -> Outcome<Vec<String>> {
        let mut out = Vec::with_capacity(scopes.len());
        for (i, s) in scopes.into_iter().enumerate() {
            let Some(sc) = parse(&s).filter(|x| x.namespace == "file") else {
                out.push(s);
                continue;
            };
            let field = format!("scopes[{i}]");
            let bad = |why: String| Refusal::invalid(&field, format!("{s}: {why}"));
            let resolved = self
                .resolve_within(project_root, &sc.resource)
                .map_err(|e| bad(format!("cannot be resolved in the project: {e}")))?;
            let rel = match resolved.strip_prefix(project_root) {
                Ok(r) if !r.as_os_str().is_empty() => r,
                Ok(_) => return Err(bad("resolves to the project root itself".into())),
                Err(_) => {
                    return Err(bad(format!(
                        "resolves to {}, outside the project",
                        resolved.display()
                    )));
                }
            };
            let rel = rel
                .to_str()
                .ok_or_else(|| bad("resolves to a path that is not UTF-8".into()))?;
            let leased = format!("file:{rel}");
            Scope::parse(&field, &leased)?;
            out.push(leased);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// `rel` beneath `root` with every symlink of its existing part resolved: the nearest
    /// existing ancestor (or the path itself), canonical, with the rest of the path after it.
    fn resolve_within(
        &self,
        root: &std::path::Path,
        rel: &str,
    ) -> std::io::Result<std::path::PathBuf> {
        let full = root.join(rel);
        let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
        let mut at = full.as_path();
        loop {
            if self.env.fs.try_exists(at)? {
                let mut p = self.env.fs.canonicalize(at)?;
                p.extend(rest.iter().rev());
                return Ok(p);
            }
            match (at.file_name(), at.parent()) {
                (Some(name), Some(up)) => {
                    rest.push(name);
                    at = up;
                }
                _ => return Ok(full),
            }
        }
    }
}

fn parse(s: &str) -> Option<Scope> {
    Scope::parse("scopes", s).ok()
}
