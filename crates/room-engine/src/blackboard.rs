//! The blackboard (DESIGN.md §7): a collaboration's typed, versioned artifacts, and the fence
//! that decides who reads and writes which kind. An artifact version is a `note` turn in the
//! collaboration's room carrying its index entry (`Turn::artifact`), with its content (the
//! canonical JSON) in the blob its SHA-256 names: so the journal, its hash chain, the Work Gate,
//! audiences, crash recovery and `index rebuild` cover the blackboard without a second store.
//!
//! The fence is the caller's scopes (`delegation`): writing kind K takes `artifact:write:K`,
//! reading its content `artifact:read:K`, listing the index `session:read` or any artifact
//! scope. A root the owner enrolled holds no scope list and is bounded by its tier alone, as
//! every agent was before the identity tree. A version's turn carries an audience like any
//! other: a reader outside it is told the version does not exist (a reviewer's findings are
//! addressed to the orchestrator and the owner until the barrier opens).
//!
//! A `diff` written in a project room must apply to the project's tree as it stands (`git
//! apply --check`, run confined as a check is): `artifact_diff_does_not_apply`.
//!
//! A write names the version it expects to follow (0: the key is new). The check runs when
//! the turn is prepared and again under the room's writer lock, where it counts: two writers
//! that expected the same version never both land (`artifact_version_conflict`).

use crate::principal::{AgentCaller, Principal};
use crate::room::RoomHandle;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::artifact::{self, ArtifactKind};
use room_core::event::ArtifactVersion;
use room_core::{Code, Refusal, Verb, name};
use room_store::index::ArtifactRow;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// Artifacts one index page lists at most.
pub const INDEX_PAGE_MAX: usize = 256;
/// How long checking that a diff applies may take.
pub const DIFF_CHECK_MS: u64 = 30_000;

/// A blackboard write, as the caller asked for it (decoded from the wire, not yet checked).
#[derive(Debug, Clone)]
pub struct ArtifactDraft {
    pub kind: String,
    /// `main` unless named.
    pub key: Option<String>,
    pub content: Value,
    /// The version this write follows (0: the key is new).
    pub expected_version: u32,
}

/// A write that passed the fence, the schema and the size: its index entry (versioned under
/// the room's lock) and its bytes.
pub(crate) struct PendingArtifact {
    pub version: ArtifactVersion,
    pub expected_version: u32,
    pub bytes: Vec<u8>,
}

/// Whether a caller holding `scopes` holds `scope` (a root without a list holds every one).
fn holds(scopes: &Option<Vec<String>>, scope: &str) -> bool {
    scopes.as_ref().is_none_or(|s| s.iter().any(|h| h == scope))
}

fn may_list(scopes: &Option<Vec<String>>) -> bool {
    scopes.as_ref().is_none_or(|s| {
        s.iter()
            .any(|h| h == "session:read" || h.starts_with("artifact:"))
    })
}

fn denied(code: Code, who: &str, scope: &str) -> Refusal {
    let verb = if code == Code::ArtifactReadDenied {
        "read"
    } else {
        "write"
    };
    Refusal::new(
        code,
        format!("{who} may not {verb} this artifact: it does not hold {scope}"),
    )
    .detail(json!({"scope": scope}))
    .hint("the owner grants artifact scopes per role (the pack's reads and writes)")
}

fn conflict(kind: &str, key: &str, expected: u32, current: u32) -> Refusal {
    Refusal::new(
        Code::ArtifactVersionConflict,
        format!("{kind}/{key} is at version {current}, not {expected}; nothing was written"),
    )
    .detail(
        json!({"kind": kind, "key": key, "expected_version": expected, "current_version": current}),
    )
    .hint("read the artifact's newest version, then write with expected_version set to it")
}

/// An index entry as callers see it (never the content).
fn entry_view(a: &ArtifactRow) -> Value {
    json!({"kind": a.kind, "key": a.key, "version": a.version, "sha256": a.sha256,
        "bytes": a.bytes, "producer": a.producer, "parents": a.parents, "event": a.event,
        "seq": a.seq, "hlc_ms": a.hlc_ms, "audience": a.audience})
}

fn reads(a: &ArtifactRow, reader: Option<&str>) -> bool {
    reader.is_none_or(|r| a.audience.is_empty() || a.audience.iter().any(|m| m == r))
}

/// A finding whose evidence is not in the diff under review.
fn evidence(field: &str, why: String) -> Refusal {
    Refusal::new(Code::ArtifactSchemaInvalid, format!("{field}: {why}"))
        .detail(json!({"field": field}))
        .hint("point file and line into the diff under review (artifact_get kind diff), or leave them out")
}

/// Each file a unified diff changes (its new path) with its hunks' new-side ranges (start,
/// length), from the `+++ ` and `@@ -a,b +c,d @@` lines.
fn hunks_of(patch: &str) -> std::collections::BTreeMap<String, Vec<(u64, u64)>> {
    let mut out: std::collections::BTreeMap<String, Vec<(u64, u64)>> = Default::default();
    let mut file: Option<String> = None;
    for line in patch.lines() {
        if let Some(path) = line.strip_prefix("+++ ") {
            let path = path.split('\t').next().unwrap_or(path);
            file =
                (path != "/dev/null").then(|| path.strip_prefix("b/").unwrap_or(path).to_string());
            if let Some(f) = &file {
                out.entry(f.clone()).or_default();
            }
        } else if let (Some(f), Some(rest)) = (&file, line.strip_prefix("@@ ")) {
            let new = rest.split_whitespace().find_map(|w| w.strip_prefix('+'));
            if let Some(new) = new {
                let (start, len) = new.split_once(',').unwrap_or((new, "1"));
                if let (Ok(s), Ok(l)) = (start.parse::<u64>(), len.parse::<u64>()) {
                    out.entry(f.clone()).or_default().push((s, l));
                }
            }
        }
    }
    out
}

fn parse_address(kind: &str, key: Option<&str>) -> Outcome<(ArtifactKind, String)> {
    let kind = ArtifactKind::parse("kind", kind)?;
    let key = key.unwrap_or(artifact::DEFAULT_KEY);
    artifact::check_key("key", key)?;
    Ok((kind, key.to_string()))
}

impl Engine {
    /// Check a write before anything is written: the fence, the address, the size and the
    /// schema. The content's bytes are its canonical JSON.
    pub(crate) fn draft_artifact(
        &self,
        p: &Principal,
        room: &str,
        binding: &room_core::event::Binding,
        d: &ArtifactDraft,
    ) -> Outcome<PendingArtifact> {
        let (kind, key) = parse_address(&d.kind, d.key.as_deref())?;
        let kind = kind.as_str().into_owned();
        let scope = format!("artifact:write:{kind}");
        if !holds(&p.scopes, &scope) {
            return Err(denied(Code::ArtifactWriteDenied, &p.name, &scope));
        }
        // in a collaboration, findings are keyed by their reviewer: each writes its own key
        // only (its seat: its name past the collaboration's prefix), so no reviewer writes
        // over another's
        if kind == "findings" && self.collab_orchestrator_of(room)?.is_some() {
            let own = p.name.strip_prefix(&format!("{room}-")).unwrap_or(&p.name);
            if key != own {
                return Err(Refusal::new(
                    Code::ArtifactWriteDenied,
                    format!(
                        "{} writes findings under its own key {own}, not {key}",
                        p.name
                    ),
                )
                .detail(json!({"field": "key", "key": key, "own": own}))
                .hint(format!("write with key {own}")));
            }
        }
        let limits = self.policy().blackboard;
        let bytes = room_core::canonical_bytes(&d.content);
        if bytes.len() > limits.artifact_bytes_max {
            return Err(Refusal::new(
                Code::PayloadTooLarge,
                format!(
                    "content: {} bytes is over the {}-byte limit",
                    bytes.len(),
                    limits.artifact_bytes_max
                ),
            )
            .detail(json!({"field": "content", "limit_bytes": limits.artifact_bytes_max})));
        }
        let parsed = ArtifactKind::parse("kind", &kind)?;
        artifact::validate(&parsed, &d.content)?;
        if parsed == ArtifactKind::Findings {
            self.check_evidence(room, &d.content)?;
        }
        if parsed == ArtifactKind::Diff
            && let Some(project) = binding.project()
        {
            let patch = d.content["patch"].as_str().unwrap_or_default();
            match self.collab_trees(room)? {
                // a collaboration with working trees: at its recorded base, in the checkout
                // of the base no worker writes
                Some(t) => {
                    let base = d.content["base"].as_str().unwrap_or_default();
                    if base != t.base {
                        return Err(Refusal::new(
                            Code::ArtifactDiffDoesNotApply,
                            format!(
                                "the diff names base {base:?}; the collaboration's trees start at {}",
                                t.base
                            ),
                        )
                        .detail(json!({"field": "base", "base": t.base}))
                        .hint("take the diff from your working tree (diff_from_tree)"));
                    }
                    let tree = std::path::PathBuf::from(&t.base_tree);
                    self.check_applies_in(
                        &format!("the collaboration's base {}", t.base),
                        tree,
                        patch,
                    )?;
                }
                None => self.check_applies(project, patch)?,
            }
        }
        Ok(PendingArtifact {
            version: ArtifactVersion {
                kind,
                key,
                version: 0,
                sha256: room_core::sha256_hex(&bytes),
                bytes: bytes.len() as u64,
            },
            expected_version: d.expected_version,
            bytes,
        })
    }

    /// Under the room's lock, once a retry has had its answer: the version this write makes
    /// (the expected one, the room's limits), or the refusal.
    pub(crate) fn version_artifact(
        &self,
        h: &RoomHandle,
        a: &PendingArtifact,
    ) -> Outcome<ArtifactVersion> {
        let limits = self.policy().blackboard;
        let (kind, key) = (&a.version.kind, &a.version.key);
        let version = self.next_version(h, kind, key, a.expected_version)?;
        if version == 1 {
            let keys = h.index.artifact_keys().map_err(store_err)?;
            if keys >= u64::from(limits.keys_per_collaboration_max) {
                return Err(Refusal::new(
                    Code::QuotaExceeded,
                    format!(
                        "room {} holds {keys} artifacts, its limit (blackboard.keys_per_collaboration_max)",
                        h.name
                    ),
                )
                .detail(json!({"field": "key", "limit": limits.keys_per_collaboration_max})));
            }
        }
        if version > limits.versions_per_key_max {
            return Err(Refusal::new(
                Code::QuotaExceeded,
                format!(
                    "{kind}/{key} holds {} versions, its limit (blackboard.versions_per_key_max)",
                    version - 1
                ),
            )
            .detail(json!({"field": "expected_version", "limit": limits.versions_per_key_max})));
        }
        Ok(ArtifactVersion {
            version,
            ..a.version.clone()
        })
    }

    /// A `diff` in a project room applies cleanly to the project's tree as it stands:
    /// `git apply --check` run as a check is (an owned job, confined, the project read-only),
    /// the patch on its standard input. A patch that does not apply, or one that could not be
    /// checked, is refused `artifact_diff_does_not_apply` (never accepted unchecked).
    fn check_applies(&self, project: &str, patch: &str) -> Outcome<()> {
        let root = std::path::PathBuf::from(self.revalidate_project(project)?.canonical_root);
        self.check_applies_in(&format!("project {project}"), root, patch)
    }

    /// `git apply --check` of `patch` in `root` (read-only), as `check_applies` says.
    fn check_applies_in(&self, what: &str, root: std::path::PathBuf, patch: &str) -> Outcome<()> {
        let req = room_core::RunRequest {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "exec git apply --check --whitespace=nowarn -".into(),
            ],
            cwd: root.clone(),
            timeout_ms: DIFF_CHECK_MS,
            project: Some(root),
            project_write: false,
            network: false,
            stdin: patch.as_bytes().to_vec(),
            stdout_bytes_max: 0,
        };
        let refused = |why: String, detail: Value| {
            Refusal::new(
                Code::ArtifactDiffDoesNotApply,
                format!("the diff does not apply to {what}: {why}"),
            )
            .detail(detail)
            .hint("rebase the patch on the project as it stands, then write it again")
        };
        match self.env.runner.run(&req) {
            Ok(out) if out.exit_code == Some(0) && out.job_empty => Ok(()),
            Ok(out) if out.timed_out || !out.job_empty => Err(refused(
                "it could not be checked".into(),
                json!({"field": "patch", "observation": "unconfirmed", "timed_out": out.timed_out}),
            )),
            Ok(out) => {
                let stderr: String = out.stderr_tail.chars().take(1024).collect();
                Err(refused(
                    stderr
                        .lines()
                        .next()
                        .unwrap_or("git apply --check failed")
                        .into(),
                    json!({"field": "patch", "exit_code": out.exit_code, "stderr": stderr}),
                ))
            }
            Err(e) => Err(refused(
                format!("it could not be checked ({e})"),
                json!({"field": "patch", "observation": "unconfirmed"}),
            )),
        }
    }

    /// A finding's `file` and `line` point into the diff under review (the room's newest
    /// `diff`): the file is one it changes, the line within one of its hunks there (new side).
    /// No diff in the room: nothing to check against.
    fn check_evidence(&self, room: &str, content: &Value) -> Outcome<()> {
        let handle = self.room_handle(room)?;
        let diff = match self.read_artifact(&handle, None, "diff", artifact::DEFAULT_KEY, None) {
            Ok(d) => d,
            Err(r) if r.code == Code::NotFound => return Ok(()),
            Err(r) => return Err(r),
        };
        let hunks = hunks_of(diff["content"]["patch"].as_str().unwrap_or_default());
        for list in ["blocking", "non_blocking", "suggestions"] {
            for (i, f) in content[list].as_array().into_iter().flatten().enumerate() {
                let Some(file) = f["file"].as_str() else {
                    continue;
                };
                let field = format!("{list}[{i}]");
                let Some(ranges) = hunks.get(file) else {
                    return Err(evidence(
                        &format!("{field}.file"),
                        format!(
                            "{file} is not changed by the diff under review (version {})",
                            diff["version"]
                        ),
                    ));
                };
                if let Some(line) = f["line"].as_u64()
                    && !ranges
                        .iter()
                        .any(|(start, len)| line >= *start && line < start + len.max(&1))
                {
                    return Err(evidence(
                        &format!("{field}.line"),
                        format!(
                            "{file}:{line} is outside every hunk of the diff under review (version {})",
                            diff["version"]
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The version a write expecting `expected` makes, or `artifact_version_conflict`.
    fn next_version(&self, h: &RoomHandle, kind: &str, key: &str, expected: u32) -> Outcome<u32> {
        let current = h
            .index
            .artifact(kind, key, None)
            .map_err(store_err)?
            .map_or(0, |a| a.version);
        if current != expected {
            return Err(conflict(kind, key, expected, current));
        }
        expected
            .checked_add(1)
            .ok_or_else(|| Refusal::invalid("expected_version", "no version follows it"))
    }

    /// An `artifact` acceptance check, observed now: the newest version of `kind`/`key` written
    /// for the task, by its holder, whose blob still matches its digest and whose content still
    /// meets its kind's schema. Anything missing or unreadable fails, naming why.
    pub(crate) fn observe_artifact(
        &self,
        t: &room_store::control::TaskRow,
        kind: &str,
        key: Option<&str>,
        h: &RoomHandle,
    ) -> Outcome<room_core::acceptance::CheckResult> {
        let key = key.unwrap_or(artifact::DEFAULT_KEY);
        let result = |pass: bool, detail: Value| room_core::acceptance::CheckResult {
            kind: "artifact".into(),
            pass,
            detail,
        };
        let Some(row) = h
            .index
            .artifact_of_task(&t.id, kind, key)
            .map_err(store_err)?
        else {
            return Ok(result(
                false,
                json!({"artifact": kind, "key": key, "why": "no version was written for this task"}),
            ));
        };
        let mut detail = json!({"artifact": kind, "key": key, "version": row.version,
            "sha256": row.sha256, "producer": row.producer, "event": row.event});
        if t.recipient.as_deref() != Some(row.producer.as_str()) {
            detail["why"] =
                json!("the version was written by someone other than the task's holder");
            return Ok(result(false, detail));
        }
        let content = h
            .blobs
            .get(&row.sha256, "json")
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                if room_core::sha256_hex(&bytes) == row.sha256 {
                    serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
                } else {
                    Err("its blob does not match its digest".into())
                }
            });
        let checked = content.and_then(|c| {
            let k = ArtifactKind::parse("artifact", kind).map_err(|r| r.message.to_string())?;
            artifact::validate(&k, &c).map_err(|r| r.message.to_string())
        });
        match checked {
            Ok(()) => Ok(result(true, detail)),
            Err(why) => {
                detail["why"] = json!(why);
                Ok(result(false, detail))
            }
        }
    }

    /// Under the room's writer lock, just before the version's turn is appended.
    pub(crate) fn recheck_artifact(&self, h: &RoomHandle, a: &ArtifactVersion) -> Outcome<()> {
        self.next_version(h, &a.kind, &a.key, a.version - 1)
            .map(|_| ())
    }

    /// Put a checked write's content in the room's blobs (synced before the turn names it).
    pub(crate) fn store_artifact(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        a: &PendingArtifact,
    ) -> Outcome<()> {
        let blobs = lock_room(handle).blobs.clone();
        let sha = blobs.put(&a.bytes, "json").map_err(Refusal::storage)?;
        assert_eq!(
            sha, a.version.sha256,
            "a blob is named by the SHA-256 of its bytes"
        );
        Ok(())
    }

    /// One artifact version with its content: the caller must hold `artifact:read:<kind>` and
    /// be in the version's audience. Reading confirms nothing.
    pub fn artifact_get(
        &self,
        caller: &AgentCaller,
        room: &str,
        kind: &str,
        key: Option<&str>,
        version: Option<u32>,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::Sync)?;
        let (handle, _) = self.member_handle(&p, room)?;
        let (k, key) = parse_address(kind, key)?;
        let scope = format!("artifact:read:{k}");
        if !holds(&p.scopes, &scope) {
            return Err(denied(Code::ArtifactReadDenied, &p.name, &scope));
        }
        self.read_artifact(&handle, Some(&p.name), &k.as_str(), &key, version)
    }

    /// The owner reads any version.
    pub fn artifact_get_owner(
        &self,
        _owner: &crate::Owner,
        room: &str,
        kind: &str,
        key: Option<&str>,
        version: Option<u32>,
    ) -> Outcome<Value> {
        name::validate("room", room)?;
        let handle = self.room_handle(room)?;
        let (k, key) = parse_address(kind, key)?;
        self.read_artifact(&handle, None, &k.as_str(), &key, version)
    }

    /// The newest `diff` of collaboration `id`, for its orchestrator to build the gate's
    /// tree from (the daemon's scheduler does; the diff's content is handed to `git apply`,
    /// never shown): the record grants its orchestrator its own gate, nothing more. None: no
    /// diff yet.
    pub fn collab_gate_diff(&self, caller: &AgentCaller, id: &str) -> Outcome<Option<Value>> {
        let c = self.orchestrating(caller, id)?;
        let handle = self.room_handle(&c.room)?;
        match self.read_artifact(&handle, None, "diff", artifact::DEFAULT_KEY, None) {
            Ok(v) => Ok(Some(v)),
            Err(r) if r.code == Code::NotFound => Ok(None),
            Err(r) => Err(r),
        }
    }

    /// The newest findings of each of `keys` in collaboration `id`, for its orchestrator to
    /// route the blocking ones back to the implementer (the fix loop, run by the daemon's
    /// scheduler as the orchestrator): the findings are addressed to it, and the record
    /// grants its own loop, nothing more. A key with no findings is left out.
    pub fn collab_findings(
        &self,
        caller: &AgentCaller,
        id: &str,
        keys: &[String],
    ) -> Outcome<Vec<(String, Value)>> {
        let c = self.orchestrating(caller, id)?;
        let handle = self.room_handle(&c.room)?;
        let mut out = Vec::new();
        for k in keys {
            artifact::check_key("key", k)?;
            match self.read_artifact(&handle, None, "findings", k, None) {
                Ok(v) => out.push((k.clone(), v)),
                Err(r) if r.code == Code::NotFound => {}
                Err(r) => return Err(r),
            }
        }
        Ok(out)
    }

    fn read_artifact(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        reader: Option<&str>,
        kind: &str,
        key: &str,
        version: Option<u32>,
    ) -> Outcome<Value> {
        let (row, blobs) = {
            let h = lock_room(handle);
            let row = h.index.artifact(kind, key, version).map_err(store_err)?;
            (row, h.blobs.clone())
        };
        // withheld from this reader: as if it did not exist
        let Some(row) = row.filter(|a| reads(a, reader)) else {
            let at = version.map(|v| format!(" version {v}")).unwrap_or_default();
            return Err(Refusal::new(
                Code::NotFound,
                format!("no artifact {kind}/{key}{at} in this room"),
            )
            .detail(json!({"field": "kind", "kind": kind, "key": key})));
        };
        let bytes = blobs.get(&row.sha256, "json").map_err(Refusal::storage)?;
        // the blob is checked against its index entry on every read: a corrupted one is
        // reported, never served
        if room_core::sha256_hex(&bytes) != row.sha256 || bytes.len() as u64 != row.bytes {
            return Err(Refusal::storage(format!(
                "artifact {kind}/{key} version {}: its blob does not match its digest",
                row.version
            )));
        }
        let content: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Refusal::storage(format!("artifact {kind}/{key}: its blob is not JSON: {e}"))
        })?;
        let mut v = entry_view(&row);
        v["content"] = content;
        Ok(v)
    }

    /// The newest version of each artifact the caller may see, without contents: what an
    /// orchestrator holds instead of the artifacts. Paged by `after` (`kind/key`).
    pub fn artifact_index(
        &self,
        caller: &AgentCaller,
        room: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::Sync)?;
        let (handle, _) = self.member_handle(&p, room)?;
        if !may_list(&p.scopes) {
            return Err(denied(
                Code::ArtifactReadDenied,
                &p.name,
                "session:read or an artifact scope",
            ));
        }
        self.list_artifacts(&handle, Some(&p.name), after, limit)
    }

    /// The owner lists every artifact.
    pub fn artifact_index_owner(
        &self,
        _owner: &crate::Owner,
        room: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Outcome<Value> {
        name::validate("room", room)?;
        let handle = self.room_handle(room)?;
        self.list_artifacts(&handle, None, after, limit)
    }

    fn list_artifacts(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        reader: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Outcome<Value> {
        let after = match after {
            None => None,
            Some(a) => {
                let (kind, key) = a.rsplit_once('/').ok_or_else(|| {
                    Refusal::invalid("after", "an artifact as kind/key (spec/main)")
                })?;
                let (kind, key) = parse_address(kind, Some(key))?;
                Some((kind.as_str().into_owned(), key))
            }
        };
        let limit = limit.clamp(1, INDEX_PAGE_MAX);
        let h = lock_room(handle);
        // a page holds what this reader may see: withheld entries are passed over, in pages
        // of the same bound, so a page is never short while more remain
        let mut out: Vec<Value> = Vec::new();
        let mut cursor = after;
        let mut more = false;
        'pages: loop {
            let rows = h
                .index
                .artifact_heads(
                    cursor.as_ref().map(|(k, key)| (k.as_str(), key.as_str())),
                    limit,
                )
                .map_err(store_err)?;
            let last = rows.len() < limit;
            for a in &rows {
                cursor = Some((a.kind.clone(), a.key.clone()));
                if !reads(a, reader) {
                    continue;
                }
                if out.len() == limit {
                    more = true;
                    break 'pages;
                }
                out.push(entry_view(a));
            }
            if last {
                break;
            }
        }
        let next = more.then(|| {
            let last = out.last().expect("a full page has a last entry");
            format!(
                "{}/{}",
                last["kind"].as_str().unwrap_or_default(),
                last["key"].as_str().unwrap_or_default()
            )
        });
        Ok(json!({"room": h.name, "artifacts": out, "next_after": next}))
    }
}
