//! Proposals: a worker never writes a project source; it asks, and the daemon applies. A
//! proposal names one row of a projected source (its key, the version the worker read) and
//! the projected columns it sets. Applying it reads the live source beneath the project root
//! exactly as staging does (no link followed, a regular file with one link, bounded), checks
//! that the row is still at the version the worker read, sets the columns and moves the
//! version by exactly one. JSON and JSONL sources are rewritten into a temporary file beside
//! them, fsynced and renamed over (a crash leaves the old or the new file, never a mix); a
//! SQLite source is changed in one immediate transaction whose UPDATE is itself conditioned
//! on the version.
//!
//! The daemon writes its intention to the outbox (`proposals/<id>.json`, fsynced) before it
//! applies anything, and removes it only once the outcome is journaled: a crash in between is
//! resolved at the next start by observing the live row (`observe`): at version + 1 with the
//! values set (applied), still at the version read (not applied), or anything else (in doubt).

use crate::staging::{self, StageError, err};
use room_core::stage::{Format, Projection, Proposal, STAGE_BYTES_MAX, Selection};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use serde_json::{Map, Value};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What an applied proposal changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub from_version: i64,
    pub to_version: i64,
    pub before_sha256: String,
    pub after_sha256: String,
}

/// Why a proposal was not applied; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalError {
    /// `proposal_version_conflict` or `proposal_source_refused`.
    pub code: &'static str,
    pub message: String,
}

impl std::fmt::Display for ProposalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

fn refused(m: impl Into<String>) -> ProposalError {
    ProposalError {
        code: "proposal_source_refused",
        message: m.into(),
    }
}

fn from_stage(e: StageError) -> ProposalError {
    refused(format!("{}: {} ({})", e.path, e.message, e.code))
}

fn projection(sel: &Selection) -> Result<&Projection, ProposalError> {
    sel.project
        .as_ref()
        .ok_or_else(|| refused(format!("{} is not projected", sel.path)))
}

/// The SHA-256 of the live source at `path` beneath `root`, read as staging reads it: what an
/// intention records as the digest before, so that a recovery can name it too.
pub fn digest(root: &Path, path: &str) -> Result<String, ProposalError> {
    let rootfd = staging::open_root(root).map_err(from_stage)?;
    let (bytes, _) = staging::read_beneath(&rootfd, path, STAGE_BYTES_MAX).map_err(from_stage)?;
    Ok(room_core::sha256_hex(&bytes))
}

/// Apply `p` to the live source of `sel` beneath `root` (see the module comment).
pub fn apply(root: &Path, sel: &Selection, p: &Proposal) -> Result<Applied, ProposalError> {
    apply_inner(root, sel, p, None)
}

/// `apply`, refused (`proposal_source_refused`) unless the source is still at digest `before`,
/// the one its intention recorded.
pub fn apply_at(
    root: &Path,
    sel: &Selection,
    p: &Proposal,
    before: &str,
) -> Result<Applied, ProposalError> {
    apply_inner(root, sel, p, Some(before))
}

fn apply_inner(
    root: &Path,
    sel: &Selection,
    p: &Proposal,
    expect_before: Option<&str>,
) -> Result<Applied, ProposalError> {
    let proj = projection(sel)?;
    let rootfd = staging::open_root(root).map_err(from_stage)?;
    let (bytes, st) =
        staging::read_beneath(&rootfd, &p.path, STAGE_BYTES_MAX).map_err(from_stage)?;
    let before_sha256 = room_core::sha256_hex(&bytes);
    if expect_before.is_some_and(|b| b != before_sha256) {
        return Err(refused(format!(
            "{} changed while its proposal was taken: nothing was applied",
            p.path
        )));
    }
    let (from_version, after) = match proj.format {
        Format::Json | Format::Jsonl => {
            let (out, from) = rewrite_text(proj, p, &bytes)?;
            replace_beneath(&rootfd, &p.path, &st, &out)?;
            (from, room_core::sha256_hex(&out))
        }
        Format::Sqlite => {
            let from = update_sqlite(root, &rootfd, proj, p, &st)?;
            let (now, _) =
                staging::read_beneath(&rootfd, &p.path, STAGE_BYTES_MAX).map_err(from_stage)?;
            (from, room_core::sha256_hex(&now))
        }
    };
    Ok(Applied {
        from_version,
        to_version: from_version + 1,
        before_sha256,
        after_sha256: after,
    })
}

/// The one row `p` names among `rows`, at the version `p` read.
fn find_row<'a>(
    rows: impl Iterator<Item = Option<&'a Map<String, Value>>>,
    proj: &Projection,
    p: &Proposal,
) -> Result<usize, ProposalError> {
    let mut found = None;
    for (i, r) in rows.enumerate() {
        let Some(r) = r else {
            return Err(refused(format!("{}: row {i} is not an object", p.path)));
        };
        if staging::key_text(r.get(&proj.key)).as_deref() != Some(p.key.as_str()) {
            continue;
        }
        if found.is_some() {
            return Err(refused(format!(
                "{}: more than one row has key {}",
                p.path, p.key
            )));
        }
        let Some(v) = r.get(&proj.version).and_then(Value::as_i64) else {
            return Err(refused(format!(
                "{}: row {} has no integer {} version",
                p.path, p.key, proj.version
            )));
        };
        check_version(p, v)?;
        found = Some(i);
    }
    found.ok_or_else(|| refused(format!("{}: no row has key {}", p.path, p.key)))
}

fn check_version(p: &Proposal, live: i64) -> Result<(), ProposalError> {
    if live == p.version {
        return Ok(());
    }
    Err(ProposalError {
        code: "proposal_version_conflict",
        message: format!(
            "{}: row {} is at version {live}, the proposal read version {}",
            p.path, p.key, p.version
        ),
    })
}

fn set_row(row: &mut Map<String, Value>, proj: &Projection, p: &Proposal) -> i64 {
    for (c, v) in &p.set {
        row.insert(c.clone(), v.clone());
    }
    let next = p.version + 1;
    row.insert(proj.version.clone(), Value::from(next));
    next
}

/// The new text of a JSON or JSONL source with the row changed, and the version it was at.
fn rewrite_text(
    proj: &Projection,
    p: &Proposal,
    bytes: &[u8],
) -> Result<(Vec<u8>, i64), ProposalError> {
    if p.version == i64::MAX {
        return Err(refused("the version cannot move past i64::MAX"));
    }
    if proj.format == Format::Json {
        let mut doc: Value = serde_json::from_slice(bytes)
            .map_err(|e| refused(format!("{}: not JSON: {e}", p.path)))?;
        let Some(rows) = doc.as_array_mut() else {
            return Err(refused(format!("{}: not an array of rows", p.path)));
        };
        let i = find_row(rows.iter().map(Value::as_object), proj, p)?;
        let row = rows[i].as_object_mut().expect("found rows are objects");
        set_row(row, proj, p);
        // the source's layout: pretty when it spans lines, compact otherwise
        let mut out = if bytes.contains(&b'\n') {
            serde_json::to_vec_pretty(&doc)
        } else {
            serde_json::to_vec(&doc)
        }
        .expect("JSON values serialize");
        if bytes.ends_with(b"\n") {
            out.push(b'\n');
        }
        return Ok((out, p.version));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| refused(format!("{}: not UTF-8", p.path)))?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut parsed = Vec::with_capacity(lines.len());
    let mut at = Vec::with_capacity(lines.len());
    for (n, l) in lines.iter().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(l)
            .map_err(|e| refused(format!("{}: line {}: {e}", p.path, n + 1)))?;
        parsed.push(v);
        at.push(n);
    }
    let i = find_row(parsed.iter().map(Value::as_object), proj, p)?;
    let row = parsed[i].as_object_mut().expect("found rows are objects");
    set_row(row, proj, p);
    let mut line = serde_json::to_string(&parsed[i]).expect("JSON values serialize");
    if lines[at[i]].ends_with('\n') {
        line.push('\n');
    }
    let mut out = String::with_capacity(text.len() + 64);
    for (n, l) in lines.iter().enumerate() {
        out.push_str(if n == at[i] { &line } else { l });
    }
    Ok((out.into_bytes(), p.version))
}

/// The directory holding `path` beneath the root, opened (no link followed) for writing in.
fn parent_dir<'a>(
    root: &rustix::fd::OwnedFd,
    path: &'a str,
) -> Result<(rustix::fd::OwnedFd, &'a str), ProposalError> {
    let (parent, name) = path.rsplit_once('/').unwrap_or((".", path));
    let dir = rustix::fs::openat2(
        root,
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| refused(format!("{path}: its directory: {e}")))?;
    Ok((dir, name))
}

/// The file at `name` in `dir` is still the one read (`st`): same inode, size and mtime.
fn unchanged(
    dir: &rustix::fd::OwnedFd,
    name: &str,
    path: &str,
    st: &rustix::fs::Stat,
) -> Result<(), ProposalError> {
    let now = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| refused(format!("{path}: {e}")))?;
    let same = (
        now.st_dev,
        now.st_ino,
        now.st_size,
        now.st_mtime,
        now.st_mtime_nsec,
    ) == (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime,
        st.st_mtime_nsec,
    );
    if same && now.st_nlink == 1 {
        return Ok(());
    }
    Err(refused(format!(
        "{path} changed while the proposal was applied; nothing was written"
    )))
}

/// Replace the file at `path` beneath the root with `bytes`: a temporary file beside it,
/// written, fsynced, renamed over, the directory fsynced. Its mode is kept.
fn replace_beneath(
    root: &rustix::fd::OwnedFd,
    path: &str,
    st: &rustix::fs::Stat,
    bytes: &[u8],
) -> Result<(), ProposalError> {
    let (dir, name) = parent_dir(root, path)?;
    let tmp = format!(".{name}.room-proposal");
    let io = |e: rustix::io::Errno| refused(format!("{path}: {e}"));
    // a temporary file a crash left behind is ours to remove
    match rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io(e)),
    }
    let fd = rustix::fs::openat(
        &dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(st.st_mode & 0o7777),
    )
    .map_err(io)?;
    let mut f = std::fs::File::from(fd);
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    drop(f);
    let placed = written
        .map_err(|e| refused(format!("{path}: {e}")))
        .and_then(|()| unchanged(&dir, name, path, st))
        .and_then(|()| rustix::fs::renameat(&dir, tmp.as_str(), &dir, name).map_err(io));
    if let Err(e) = placed {
        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    rustix::fs::fsync(&dir).map_err(io)
}

fn sql_value(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as S;
    match v {
        Value::Null => S::Null,
        Value::Bool(b) => S::Integer(i64::from(*b)),
        Value::Number(n) => n
            .as_i64()
            .map(S::Integer)
            .unwrap_or_else(|| S::Real(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(s) => S::Text(s.clone()),
        Value::Array(_) | Value::Object(_) => unreachable!("admitted proposals set scalars"),
    }
}

/// Change the row in the live SQLite database in one immediate transaction; the version it
/// was at comes back. The database is opened by its path only after the same file was opened
/// beneath the root, and is checked to be that file again before the transaction commits.
fn update_sqlite(
    root: &Path,
    rootfd: &rustix::fd::OwnedFd,
    proj: &Projection,
    p: &Proposal,
    st: &rustix::fs::Stat,
) -> Result<i64, ProposalError> {
    let table = proj
        .table
        .as_deref()
        .expect("validated: a SQLite projection names its table");
    let db = |e: rusqlite::Error| refused(format!("{}: {e}", p.path));
    let mut conn = rusqlite::Connection::open_with_flags(
        root.join(&p.path),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(db)?;
    conn.busy_timeout(std::time::Duration::from_secs(2))
        .map_err(db)?;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(db)?;
    let (k, v) = (&proj.key, &proj.version);
    let live: Vec<rusqlite::types::Value> = {
        let mut q = tx
            .prepare(&format!(
                "SELECT \"{v}\" FROM \"{table}\" WHERE CAST(\"{k}\" AS TEXT) = ?1 LIMIT 2"
            ))
            .map_err(db)?;
        q.query_map([&p.key], |r| r.get(0))
            .map_err(db)?
            .collect::<Result<_, _>>()
            .map_err(db)?
    };
    let version = match live.as_slice() {
        [] => return Err(refused(format!("{}: no row has key {}", p.path, p.key))),
        [rusqlite::types::Value::Integer(n)] => *n,
        [_] => {
            return Err(refused(format!(
                "{}: row {} has no integer {v} version",
                p.path, p.key
            )));
        }
        _ => {
            return Err(refused(format!(
                "{}: more than one row has key {}",
                p.path, p.key
            )));
        }
    };
    check_version(p, version)?;
    let sets: Vec<String> = p
        .set
        .keys()
        .enumerate()
        .map(|(i, c)| format!("\"{c}\" = ?{}", i + 3))
        .collect();
    let sql = format!(
        "UPDATE \"{table}\" SET {}, \"{v}\" = \"{v}\" + 1 WHERE CAST(\"{k}\" AS TEXT) = ?1 AND \"{v}\" = ?2",
        sets.join(", ")
    );
    let mut params: Vec<rusqlite::types::Value> = vec![
        rusqlite::types::Value::Text(p.key.clone()),
        rusqlite::types::Value::Integer(p.version),
    ];
    params.extend(p.set.values().map(sql_value));
    let n = tx
        .execute(&sql, rusqlite::params_from_iter(params))
        .map_err(db)?;
    if n != 1 {
        return Err(refused(format!("{}: {n} rows changed, not one", p.path)));
    }
    // the file the transaction changes is the one that was opened beneath the root
    let (_, again) = staging::open_beneath(rootfd, &p.path).map_err(from_stage)?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Err(refused(format!(
            "{} was replaced while the proposal was applied; nothing was written",
            p.path
        )));
    }
    tx.commit().map_err(db)?;
    Ok(version)
}

/// What the live source says about a proposal whose outcome a crash left unrecorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// The row is at the version after the proposal's and carries its values.
    Applied { version: i64, sha256: String },
    /// The row is still at the version the proposal read.
    NotApplied { version: i64 },
    /// Anything else: the source is gone, unreadable, or the row moved otherwise.
    InDoubt(String),
}

/// Observe the live row of `p` (for recovery); `scratch` takes a SQLite source's private copy.
pub fn observe(root: &Path, sel: &Selection, p: &Proposal, scratch: &Path) -> Observed {
    let Ok(proj) = projection(sel) else {
        return Observed::InDoubt("the selection is not projected".into());
    };
    let read = staging::open_root(root).and_then(|fd| {
        let (bytes, _) = staging::read_beneath(&fd, &p.path, STAGE_BYTES_MAX)?;
        let rows = staging::source_rows(&p.path, proj, &bytes, scratch)?;
        Ok((bytes, rows))
    });
    let (bytes, rows) = match read {
        Ok(r) => r,
        Err(e) => return Observed::InDoubt(e.to_string()),
    };
    let mine: Vec<&Map<String, Value>> = rows
        .iter()
        .filter(|r| staging::key_text(r.get(&proj.key)).as_deref() == Some(p.key.as_str()))
        .collect();
    let [row] = mine.as_slice() else {
        return Observed::InDoubt(format!("{} rows have key {}", mine.len(), p.key));
    };
    let Some(version) = row.get(&proj.version).and_then(Value::as_i64) else {
        return Observed::InDoubt("the row has no integer version".into());
    };
    let carries = p.set.iter().all(|(c, want)| {
        let got = row.get(c).unwrap_or(&Value::Null);
        got == want || sql_value(got) == sql_value(want)
    });
    match version {
        v if v == p.version => Observed::NotApplied { version: v },
        v if v == p.version + 1 && carries => Observed::Applied {
            version: v,
            sha256: room_core::sha256_hex(&bytes),
        },
        v => Observed::InDoubt(format!(
            "row {} is at version {v}, the proposal read {}",
            p.key, p.version
        )),
    }
}

/// The proposal outbox: one durable file per proposal being applied, removed once its outcome
/// is journaled.
#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
}

impl Outbox {
    pub fn new(dir: impl Into<PathBuf>) -> Outbox {
        Outbox { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> std::io::Result<PathBuf> {
        if !room_core::id::is_proposal_id(id) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{id:?} is not a proposal id"),
            ));
        }
        Ok(self.dir.join(format!("{id}.json")))
    }

    /// Write the intention durably (a temporary file, fsynced, renamed, the directory fsynced)
    /// before anything is applied. An existing one is never replaced.
    pub fn put(&self, id: &str, doc: &Value) -> std::io::Result<()> {
        let path = self.path(id)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        if path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is already written", path.display()),
            ));
        }
        let tmp = self.dir.join(format!(".{id}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(doc).expect("JSON values serialize"))?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// The outcome is journaled: the intention goes.
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        std::fs::remove_file(self.path(id)?)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// Every intention left, oldest name first; an unreadable one is an error (never skipped).
    pub fn pending(&self) -> std::io::Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in entries {
            let name = e?.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if !room_core::id::is_proposal_id(id) {
                continue;
            }
            let bytes = std::fs::read(self.dir.join(&name))?;
            let doc = serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{id}: {e}"))
            })?;
            out.push((id.to_string(), doc));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// The scratch directory a recovery observes SQLite copies in (made if absent).
pub fn scratch(dir: &Path) -> Result<PathBuf, StageError> {
    let s = dir.join(".scratch");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&s)
        .map_err(|e| err("stage_unreadable", "", e.to_string()))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(path: &str, format: Format, table: Option<&str>) -> Selection {
        Selection {
            path: path.into(),
            sha256: "0".repeat(64),
            project: Some(Projection {
                format,
                table: table.map(String::from),
                key: "id".into(),
                version: "v".into(),
                columns: vec!["name".into()],
                rows: None,
            }),
        }
    }

    fn prop(path: &str, key: &str, version: i64, name: &str) -> Proposal {
        let mut set = Map::new();
        set.insert("name".into(), json!(name));
        Proposal {
            path: path.into(),
            key: key.into(),
            version,
            set,
        }
    }

    #[test]
    fn a_json_row_moves_by_one_version_and_nothing_else_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("t.json");
        std::fs::write(
            &f,
            r#"[{"id":1,"v":3,"name":"a","secret":"s"},{"id":2,"v":1,"name":"b"}]"#,
        )
        .unwrap();
        let s = sel("t.json", Format::Json, None);
        let before = std::fs::read(&f).unwrap();
        let a = apply(tmp.path(), &s, &prop("t.json", "1", 3, "z")).unwrap();
        assert_eq!((a.from_version, a.to_version), (3, 4));
        assert_eq!(a.before_sha256, room_core::sha256_hex(&before));
        let doc: Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        assert_eq!(
            doc,
            json!([{"id":1,"v":4,"name":"z","secret":"s"},{"id":2,"v":1,"name":"b"}])
        );
        assert_eq!(
            a.after_sha256,
            room_core::sha256_hex(&std::fs::read(&f).unwrap())
        );
        // the same proposal again read version 3: the row is at 4 now
        let e = apply(tmp.path(), &s, &prop("t.json", "1", 3, "y")).unwrap_err();
        assert_eq!(e.code, "proposal_version_conflict", "{e}");
        assert_eq!(
            doc,
            serde_json::from_slice::<Value>(&std::fs::read(&f).unwrap()).unwrap()
        );
        assert_eq!(
            observe(tmp.path(), &s, &prop("t.json", "1", 3, "z"), tmp.path()),
            Observed::Applied {
                version: 4,
                sha256: a.after_sha256.clone()
            }
        );
        assert_eq!(
            observe(tmp.path(), &s, &prop("t.json", "2", 1, "q"), tmp.path()),
            Observed::NotApplied { version: 1 }
        );
        // no temporary file is left beside it
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_source_no_longer_at_the_intentions_digest_is_refused_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("t.json");
        std::fs::write(&f, r#"[{"id":1,"v":3,"name":"a"}]"#).unwrap();
        let s = sel("t.json", Format::Json, None);
        let before = digest(tmp.path(), "t.json").unwrap();
        assert_eq!(before, room_core::sha256_hex(&std::fs::read(&f).unwrap()));
        std::fs::write(&f, r#"[{"id":1,"v":3,"name":"other"}]"#).unwrap();
        let moved = std::fs::read(&f).unwrap();
        let e = apply_at(tmp.path(), &s, &prop("t.json", "1", 3, "z"), &before).unwrap_err();
        assert_eq!(e.code, "proposal_source_refused", "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), moved);
        let now = digest(tmp.path(), "t.json").unwrap();
        let a = apply_at(tmp.path(), &s, &prop("t.json", "1", 3, "z"), &now).unwrap();
        assert_eq!(a.before_sha256, now);
    }

    #[test]
    fn a_jsonl_source_keeps_every_other_line_byte_for_byte() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("t.jsonl");
        let text =
            "{\"id\":\"x\",  \"v\":1,\"name\":\"n\"}\n\n{\"id\":\"y\",\"v\":2,\"name\":\"m\"}\n";
        std::fs::write(&f, text).unwrap();
        let s = sel("t.jsonl", Format::Jsonl, None);
        apply(tmp.path(), &s, &prop("t.jsonl", "y", 2, "k")).unwrap();
        let now = std::fs::read_to_string(&f).unwrap();
        assert_eq!(
            now,
            "{\"id\":\"x\",  \"v\":1,\"name\":\"n\"}\n\n{\"id\":\"y\",\"v\":3,\"name\":\"k\"}\n"
        );
        let e = apply(tmp.path(), &s, &prop("t.jsonl", "nope", 1, "k")).unwrap_err();
        assert_eq!(e.code, "proposal_source_refused", "{e}");
    }

    #[test]
    fn a_sqlite_row_is_updated_in_one_conditioned_transaction() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("app.db");
        {
            let c = rusqlite::Connection::open(&db).unwrap();
            c.execute_batch(
                "CREATE TABLE users (id INTEGER PRIMARY KEY, v INTEGER, name TEXT, token TEXT);
                 INSERT INTO users VALUES (1, 1, 'ada', 'k1'), (2, 4, 'bob', 'k2');",
            )
            .unwrap();
        }
        let s = sel("app.db", Format::Sqlite, Some("users"));
        let a = apply(tmp.path(), &s, &prop("app.db", "2", 4, "eve")).unwrap();
        assert_eq!((a.from_version, a.to_version), (4, 5));
        assert_ne!(a.before_sha256, a.after_sha256);
        let c = rusqlite::Connection::open(&db).unwrap();
        let row: (i64, String, String) = c
            .query_row("SELECT v, name, token FROM users WHERE id = 2", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(row, (5, "eve".into(), "k2".into()));
        let e = apply(tmp.path(), &s, &prop("app.db", "2", 4, "mal")).unwrap_err();
        assert_eq!(e.code, "proposal_version_conflict", "{e}");
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        assert!(matches!(
            observe(tmp.path(), &s, &prop("app.db", "2", 4, "eve"), &scratch),
            Observed::Applied { version: 5, .. }
        ));
        assert_eq!(
            observe(tmp.path(), &s, &prop("app.db", "1", 1, "x"), &scratch),
            Observed::NotApplied { version: 1 }
        );
    }

    #[test]
    fn links_are_refused_and_the_target_is_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real.json");
        std::fs::write(&real, r#"[{"id":1,"v":1,"name":"a"}]"#).unwrap();
        std::os::unix::fs::symlink("real.json", tmp.path().join("link.json")).unwrap();
        std::fs::hard_link(&real, tmp.path().join("hard.json")).unwrap();
        for p in ["link.json", "hard.json"] {
            let e = apply(
                tmp.path(),
                &sel(p, Format::Json, None),
                &prop(p, "1", 1, "b"),
            )
            .unwrap_err();
            assert_eq!(e.code, "proposal_source_refused", "{p}: {e}");
        }
        assert_eq!(
            std::fs::read_to_string(&real).unwrap(),
            r#"[{"id":1,"v":1,"name":"a"}]"#
        );
    }

    #[test]
    fn the_outbox_keeps_an_intention_until_it_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let o = Outbox::new(tmp.path().join("proposals"));
        assert!(o.pending().unwrap().is_empty());
        let id = "prp_0123456789abcdef";
        o.put(id, &json!({"a": 1})).unwrap();
        assert!(o.put(id, &json!({"a": 2})).is_err(), "written once");
        assert_eq!(
            o.pending().unwrap(),
            vec![(id.to_string(), json!({"a": 1}))]
        );
        o.remove(id).unwrap();
        assert!(o.pending().unwrap().is_empty());
        assert!(o.put("../x", &json!({})).is_err());
    }
}
