//! Snapshot recovery (`room_snapshot.v1`): `room snapshot` copies a stopped daemon's state dir
//! into a snapshot directory, and `room restore` puts one back as the state dir it was taken of.
//!
//! A snapshot is a manifest (`snapshot.json`: every directory, every file's size and SHA-256,
//! every room's chain tip, and a fingerprint over all of it) beside a copy of the tree
//! (`tree/`). Both directions walk the tree through directory descriptors, never through a
//! path that could be swapped under them: a symbolic link or a file with a second name (a
//! hard link, which could be changed through the other name) is refused, as is anything but
//! a regular file or a directory, and every path must lie inside one of the store's entries
//! (`INCLUDED`). What belongs to running processes (the daemon's lock and socket, worker
//! staging roots, job markers, collaboration working trees) is not part of a snapshot.
//!
//! A restore stages the snapshot inside the state dir (so that promotion is renames on one
//! file system), checks the staged copy against the manifest file by file and chain by chain,
//! and only then promotes it: the current entries move aside into `.restore/<op>/previous`
//! (kept; a restore never deletes the tree it replaces) and the staged ones take their place.
//! From its first step to its last a restore is recorded in `restore_pending.json`, which
//! every start refuses (`StoreError::RestorePending`): a tree that is part old and part
//! restored is never served. Running the same restore again resumes it, each step being one
//! that can be repeated; a restore of another snapshot is refused meanwhile.

use crate::StoreError;
use crate::journal::JournalMark;
use crate::statedir::{self, MARKER, Marker, StateDir};
use room_core::refusal::Code;
use rusqlite::OptionalExtension;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "room_snapshot.v1";
/// The manifest, at the snapshot's top.
pub const MANIFEST: &str = "snapshot.json";
/// The copied tree, beside the manifest.
pub const TREE: &str = "tree";
/// In a state dir: the restore under way.
pub const PENDING: &str = "restore_pending.json";
/// In a state dir: each restore's staged copy and the tree it replaced.
pub const WORK: &str = ".restore";
/// The state dir's entries a snapshot holds: the store, and what the daemon keeps beside it
/// that a restart needs (project pins, staged proposals, the stop outbox, wake permits).
pub const INCLUDED: &[&str] = &[
    MARKER,
    "config.toml",
    "control.db",
    "integrity.jsonl",
    "rooms",
    "projects",
    "proposals",
    "stops",
    "wakes",
    "commit",
    "debris",
];
/// SQLite's files beside a database: folded into it before a snapshot, moved with it at a
/// restore, never copied on their own.
const SIDECARS: &[&str] = &["-wal", "-shm", "-journal"];
pub const FILES_MAX: usize = 1_000_000;
pub const DEPTH_MAX: usize = 16;
pub const MANIFEST_BYTES_MAX: u64 = 512 << 20;
const COPY_BUF_BYTES: usize = 1 << 20;

/// Why a snapshot or a restore stopped. Each case but `Store` is a refusal with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Link(String),
    #[error("{0}")]
    Outside(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    OtherStateDir(String),
    #[error("{0}")]
    Pending(String),
    /// A directory the person named that cannot take a snapshot.
    #[error("{0}")]
    Argument(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SnapshotError {
    pub fn code(&self) -> Option<Code> {
        match self {
            SnapshotError::Link(_) => Some(Code::SnapshotLinkRefused),
            SnapshotError::Outside(_) => Some(Code::SnapshotPathOutside),
            SnapshotError::Invalid(_) => Some(Code::SnapshotInvalid),
            SnapshotError::OtherStateDir(_) => Some(Code::SnapshotOtherStateDir),
            SnapshotError::Pending(_) => Some(Code::RestorePending),
            SnapshotError::Argument(_) => Some(Code::InvalidArgument),
            SnapshotError::Store(_) => None,
        }
    }
}

impl From<std::io::Error> for SnapshotError {
    fn from(e: std::io::Error) -> Self {
        SnapshotError::Store(StoreError::Io(e))
    }
}

impl From<rustix::io::Errno> for SnapshotError {
    fn from(e: rustix::io::Errno) -> Self {
        SnapshotError::Store(StoreError::Io(e.into()))
    }
}

impl From<rusqlite::Error> for SnapshotError {
    fn from(e: rusqlite::Error) -> Self {
        SnapshotError::Store(StoreError::Sql(e))
    }
}

pub type Result<T> = std::result::Result<T, SnapshotError>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chain {
    pub graph_id: String,
    pub records: u64,
    pub tip_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub instance_id: String,
    pub canonical_path: String,
    pub taken_ms: u64,
    /// Every directory, parents before children.
    pub dirs: Vec<String>,
    /// Every file, sorted by path.
    pub files: Vec<FileEntry>,
    pub chains: Vec<Chain>,
    /// SHA-256 of the canonical JSON of everything above.
    pub fingerprint: String,
}

impl Manifest {
    fn fingerprint_now(&self) -> String {
        let mut body = self.clone();
        body.fingerprint = String::new();
        room_core::canon::digest_of(&body)
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// What is left of a restore while it runs (`PENDING`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pending {
    op: String,
    fingerprint: String,
    snapshot: String,
    started_ms: u64,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// Copying the snapshot into the work dir: the live tree is untouched.
    Staging,
    /// Moving the live entries aside and the staged ones in.
    Promoting,
    /// Re-pinning each index's journal mark to the restored files.
    Pinning,
}

/// Why `root` may not be read or served: a restore under way there (`None` when there is none).
pub fn pending_restore(root: &Path) -> Option<String> {
    let text = std::fs::read(root.join(PENDING)).ok()?;
    Some(match serde_json::from_slice::<Pending>(&text) {
        Ok(p) => format!(
            "the restore of snapshot {} ({}) started at {} ms has not finished",
            p.snapshot, p.fingerprint, p.started_ms
        ),
        Err(e) => format!("{PENDING} is unreadable ({e}); a restore was under way"),
    })
}

// ---------------------------------------------------------------------------------------------
// walking a tree through descriptors

/// What a walk does with what it meets; the walk itself refuses links and special files.
trait Visitor {
    /// A directory, before anything in it.
    fn dir(&mut self, rel: &str) -> Result<()>;
    /// A regular file with one name, opened without following links.
    fn file(&mut self, rel: &str, file: std::fs::File, bytes: u64) -> Result<()>;
    /// Whether the walk passes over this file without opening it.
    fn skip(&self, _rel: &str, _bytes: u64) -> Result<bool> {
        Ok(false)
    }
}

fn open_at(dir: impl AsFd, name: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        flags | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

fn is_sidecar(name: &str) -> bool {
    SIDECARS
        .iter()
        .any(|s| name.strip_suffix(s).is_some_and(|db| db.ends_with(".db")))
}

fn swapped(path: &str) -> impl Fn(rustix::io::Errno) -> SnapshotError + '_ {
    move |e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
            SnapshotError::Link(format!("{path} changed into a link while read"))
        }
        e => e.into(),
    }
}

/// Counts what a walk met, against the limits.
#[derive(Default)]
struct Walk {
    files: usize,
}

impl Walk {
    /// `name` in the directory `dir` (whose path is `rel`). An absent entry at the top is
    /// passed over (a state dir need not have every entry).
    fn entry(
        &mut self,
        dir: &OwnedFd,
        rel: &str,
        name: &str,
        depth: usize,
        v: &mut dyn Visitor,
    ) -> Result<()> {
        let path = join(rel, name);
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) if rel.is_empty() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => Err(SnapshotError::Link(format!(
                "{path} is a symbolic link: a snapshot copies no link"
            ))),
            FileType::Directory => {
                if depth >= DEPTH_MAX {
                    return Err(SnapshotError::Invalid(format!(
                        "{path} is deeper than {DEPTH_MAX} directories"
                    )));
                }
                let fd = open_at(dir, name, OFlags::DIRECTORY).map_err(swapped(&path))?;
                v.dir(&path)?;
                self.dir(&fd, &path, depth + 1, v)
            }
            FileType::RegularFile => {
                if st.st_nlink > 1 {
                    return Err(SnapshotError::Link(format!(
                        "{path} is a hard link ({} names): a snapshot copies no link",
                        st.st_nlink
                    )));
                }
                if v.skip(&path, st.st_size as u64)? {
                    return Ok(());
                }
                self.files += 1;
                if self.files > FILES_MAX {
                    return Err(SnapshotError::Invalid(format!(
                        "more than {FILES_MAX} files"
                    )));
                }
                let fd = open_at(dir, name, OFlags::empty()).map_err(swapped(&path))?;
                let now = rustix::fs::fstat(&fd)?;
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) || now.st_nlink > 1 {
                    return Err(SnapshotError::Link(format!(
                        "{path} was replaced or given another name while read"
                    )));
                }
                v.file(&path, std::fs::File::from(fd), now.st_size as u64)
            }
            _ => Err(SnapshotError::Invalid(format!(
                "{path} is neither a regular file nor a directory"
            ))),
        }
    }

    /// Every entry of the directory `fd`, in name order.
    fn dir(&mut self, fd: &OwnedFd, rel: &str, depth: usize, v: &mut dyn Visitor) -> Result<()> {
        let mut names = Vec::new();
        for entry in Dir::read_from(fd)? {
            let entry = entry?;
            let raw = entry.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            let name = std::str::from_utf8(raw).map_err(|_| {
                SnapshotError::Invalid(format!(
                    "a name under {} is not UTF-8",
                    if rel.is_empty() { "the top" } else { rel }
                ))
            })?;
            names.push(name.to_string());
        }
        names.sort();
        for name in names {
            self.entry(fd, rel, &name, depth, v)?;
        }
        Ok(())
    }
}

/// A directory opened without following a link at its last component.
fn open_top(path: &Path) -> Result<OwnedFd> {
    rustix::fs::openat(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => SnapshotError::Link(format!(
            "{} is not a directory (a symbolic link?)",
            path.display()
        )),
        e => e.into(),
    })
}

/// Copy `from` into a new file `to` (mode 0600, synced): its size and SHA-256.
fn copy_hashing(from: &mut std::fs::File, to: &Path) -> Result<(u64, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(to)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; COPY_BUF_BYTES];
    let mut bytes = 0u64;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        bytes += n as u64;
    }
    out.sync_all()?;
    Ok((bytes, hex::encode(h.finalize())))
}

fn mkdir_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

// ---------------------------------------------------------------------------------------------
// taking a snapshot

/// What `take` made.
#[derive(Debug)]
pub struct Taken {
    pub manifest: Manifest,
    pub out: PathBuf,
}

/// Only looks: the walk's own refusals are what it is for.
struct Look;

impl Visitor for Look {
    fn dir(&mut self, _rel: &str) -> Result<()> {
        Ok(())
    }
    fn file(&mut self, _rel: &str, _file: std::fs::File, _bytes: u64) -> Result<()> {
        Ok(())
    }
    fn skip(&self, rel: &str, _bytes: u64) -> Result<bool> {
        Ok(is_sidecar(rel.rsplit('/').next().unwrap_or(rel)))
    }
}

/// Copies the live tree into the snapshot's, recording each file.
struct Copier {
    to: PathBuf,
    dirs: Vec<String>,
    files: Vec<FileEntry>,
}

impl Visitor for Copier {
    fn dir(&mut self, rel: &str) -> Result<()> {
        mkdir_private(&self.to.join(rel))?;
        self.dirs.push(rel.to_string());
        Ok(())
    }

    fn file(&mut self, rel: &str, mut file: std::fs::File, bytes: u64) -> Result<()> {
        let (copied, sha256) = copy_hashing(&mut file, &self.to.join(rel))?;
        if copied != bytes {
            return Err(SnapshotError::Invalid(format!(
                "{rel} changed size while copied ({bytes} then {copied} bytes)"
            )));
        }
        self.files.push(FileEntry {
            path: rel.to_string(),
            bytes,
            sha256,
        });
        Ok(())
    }

    fn skip(&self, rel: &str, bytes: u64) -> Result<bool> {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        if !is_sidecar(name) {
            return Ok(false);
        }
        if bytes > 0 && !name.ends_with("-shm") {
            return Err(SnapshotError::Invalid(format!(
                "{rel} still holds {bytes} bytes after its database was checkpointed"
            )));
        }
        Ok(true)
    }
}

/// Snapshot `state` (validated, its lock held by the caller) into `out`: a new directory, or
/// an empty one, outside the state dir. The commit log is replayed and emptied and each
/// database's write-ahead log folded in first, so the copy is the store as a restart would
/// find it. Every chain is verified before anything is copied and again in the copy.
pub fn take(state: &StateDir, out: &Path, now_ms: u64) -> Result<Taken> {
    let top = open_top(&state.root)?;
    // links and special files are refused before anything is touched, even the settling
    let mut looked = Walk::default();
    for name in INCLUDED {
        looked.entry(&top, "", name, 0, &mut Look)?;
    }
    let out = prepare_out(state, out)?;
    let chains = settle(state)?;
    let tree = out.join(TREE);
    mkdir_private(&tree)?;
    let mut copier = Copier {
        to: tree.clone(),
        dirs: Vec::new(),
        files: Vec::new(),
    };
    let mut walk = Walk::default();
    for name in INCLUDED {
        walk.entry(&top, "", name, 0, &mut copier)?;
    }
    for c in &chains {
        let copied = crate::journal::verify(&tree.join(journal_rel(&c.graph_id)), &c.graph_id)?;
        if (copied.records, &copied.tip_hash) != (c.records, &c.tip_hash) {
            return Err(SnapshotError::Invalid(format!(
                "room {}'s copied chain ends at {} records, not {}",
                c.graph_id, copied.records, c.records
            )));
        }
    }
    for d in copier.dirs.iter().rev() {
        crate::fs::sync_dir(&tree.join(d))?;
    }
    crate::fs::sync_dir(&tree)?;
    copier.files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut manifest = Manifest {
        format: FORMAT.into(),
        instance_id: state.instance_id.clone(),
        canonical_path: canonical_str(&state.root)?,
        taken_ms: now_ms,
        dirs: copier.dirs,
        files: copier.files,
        chains,
        fingerprint: String::new(),
    };
    manifest.fingerprint = manifest.fingerprint_now();
    check_manifest(&manifest)?;
    let text = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
    crate::fs::write_atomic(&out.join(MANIFEST), &text)?;
    Ok(Taken { manifest, out })
}

fn journal_rel(graph_id: &str) -> String {
    format!("rooms/{graph_id}/EVENTS.jsonl")
}

fn canonical_str(p: &Path) -> Result<String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| SnapshotError::Invalid(format!("{} is not UTF-8", p.display())))
}

/// The snapshot's directory: new (its parents made) or empty, and not inside the state dir.
fn prepare_out(state: &StateDir, out: &Path) -> Result<PathBuf> {
    let abs = statedir::lexical_absolute(out)?;
    match std::fs::symlink_metadata(&abs) {
        Ok(m) if m.is_dir() => {
            if std::fs::read_dir(&abs)?.next().is_some() {
                return Err(SnapshotError::Argument(format!(
                    "{} is not empty: a snapshot goes into a new or empty directory",
                    abs.display()
                )));
            }
        }
        Ok(_) => {
            return Err(SnapshotError::Argument(format!(
                "{} exists and is not a directory",
                abs.display()
            )));
        }
        Err(_) => {
            if let Some(parent) = abs.parent() {
                std::fs::create_dir_all(parent)?;
            }
            mkdir_private(&abs)?;
        }
    }
    let canonical = std::fs::canonicalize(&abs)?;
    if canonical.starts_with(&state.root) {
        return Err(SnapshotError::Argument(format!(
            "{} lies inside the state dir it would copy",
            canonical.display()
        )));
    }
    Ok(canonical)
}

/// Replay and empty the commit log, verify every room's chain, and fold each database's
/// write-ahead log into it: the store as a restart would find it, ready to copy file by file.
fn settle(state: &StateDir) -> Result<Vec<Chain>> {
    use crate::backend::Backend;
    let backend = crate::SqliteBackend::new(state, Default::default());
    let mut chains = Vec::new();
    let mut dbs = vec![state.control_db()];
    let mut rooms: Vec<String> = match std::fs::read_dir(state.rooms()) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    rooms.sort();
    for g in rooms {
        let shard = state.shard(&g);
        if !shard.journal().exists() {
            continue;
        }
        let report = backend.verify_log(&g)?;
        if let Some(damage) = &report.damage {
            return Err(SnapshotError::Invalid(format!(
                "room {g}'s chain does not verify: {damage}"
            )));
        }
        chains.push(Chain {
            graph_id: g.clone(),
            records: report.records,
            tip_hash: report.tip_hash,
        });
        dbs.push(shard.index());
    }
    backend.close_clean()?;
    for db in dbs.into_iter().filter(|d| d.exists()) {
        let conn = rusqlite::Connection::open(&db)?;
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
        if busy != 0 {
            return Err(SnapshotError::Invalid(format!(
                "{} is in use: its write-ahead log could not be folded in",
                db.display()
            )));
        }
    }
    Ok(chains)
}

// ---------------------------------------------------------------------------------------------
// reading and checking a snapshot

/// A path a manifest may name: relative, plain components only, under one of `INCLUDED`.
fn check_rel(rel: &str) -> Result<()> {
    let p = Path::new(rel);
    let outside =
        || SnapshotError::Outside(format!("{rel:?} is not a path inside a state dir's store"));
    if rel.is_empty() || p.is_absolute() || rel.contains('\0') {
        return Err(outside());
    }
    // by segment: `Path::components` would drop a `.` in the middle unseen
    let mut depth = 0;
    for seg in rel.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(outside());
        }
        depth += 1;
    }
    let top = rel.split('/').next().unwrap_or(rel);
    if !INCLUDED.contains(&top) || depth > DEPTH_MAX + 1 || rel.ends_with('/') {
        return Err(outside());
    }
    Ok(())
}

fn parent_of(rel: &str) -> Option<&str> {
    rel.rsplit_once('/').map(|(p, _)| p)
}

/// Everything a manifest must be before any of its files is read.
fn check_manifest(m: &Manifest) -> Result<()> {
    if m.format != FORMAT {
        return Err(SnapshotError::Invalid(format!(
            "format {:?} is not {FORMAT}",
            m.format
        )));
    }
    if m.fingerprint != m.fingerprint_now() {
        return Err(SnapshotError::Invalid(
            "the manifest's fingerprint is not that of its contents".into(),
        ));
    }
    let mut dirs = std::collections::BTreeSet::new();
    for d in &m.dirs {
        check_rel(d)?;
        if parent_of(d).is_some_and(|p| !dirs.contains(p)) || !dirs.insert(d.as_str()) {
            return Err(SnapshotError::Invalid(format!(
                "directory {d} is listed twice or before its parent"
            )));
        }
    }
    for w in m.files.windows(2) {
        if w[0].path >= w[1].path {
            return Err(SnapshotError::Invalid(format!(
                "files are not listed once each in order ({} then {})",
                w[0].path, w[1].path
            )));
        }
    }
    for f in &m.files {
        check_rel(&f.path)?;
        if parent_of(&f.path).is_some_and(|p| !dirs.contains(p)) || dirs.contains(f.path.as_str()) {
            return Err(SnapshotError::Invalid(format!(
                "file {} has no directory listed, or is one",
                f.path
            )));
        }
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SnapshotError::Invalid(format!(
                "file {}'s digest is not a SHA-256",
                f.path
            )));
        }
    }
    let listed = |rel: &str| {
        m.files
            .binary_search_by(|f| f.path.as_str().cmp(rel))
            .is_ok()
    };
    if !listed(MARKER) {
        return Err(SnapshotError::Invalid(format!(
            "the snapshot has no {MARKER}"
        )));
    }
    for c in &m.chains {
        if c.graph_id.is_empty()
            || !c
                .graph_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            || !listed(&journal_rel(&c.graph_id))
        {
            return Err(SnapshotError::Invalid(format!(
                "chain {:?} names no journal the snapshot holds",
                c.graph_id
            )));
        }
    }
    Ok(())
}

/// The snapshot's manifest, read without following links, bounded and checked.
pub fn read_manifest(snapshot: &Path) -> Result<Manifest> {
    let top = open_top(snapshot)?;
    let fd = match open_at(&top, MANIFEST, OFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => {
            return Err(SnapshotError::Invalid(format!(
                "{} holds no {MANIFEST}: not a snapshot, or one whose taking did not finish",
                snapshot.display()
            )));
        }
        Err(rustix::io::Errno::LOOP) => {
            return Err(SnapshotError::Link(format!(
                "{MANIFEST} is a symbolic link"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let mut text = Vec::new();
    std::fs::File::from(fd)
        .take(MANIFEST_BYTES_MAX + 1)
        .read_to_end(&mut text)?;
    if text.len() as u64 > MANIFEST_BYTES_MAX {
        return Err(SnapshotError::Invalid(format!(
            "{MANIFEST} is over {MANIFEST_BYTES_MAX} bytes"
        )));
    }
    let m: Manifest = serde_json::from_slice(&text)
        .map_err(|e| SnapshotError::Invalid(format!("{MANIFEST}: {e}")))?;
    check_manifest(&m)?;
    Ok(m)
}

// ---------------------------------------------------------------------------------------------
// restoring

/// What a restore is asked to do.
pub struct RestoreConfig<'a> {
    /// The state dir to restore (it need not exist; its path must be the snapshot's).
    pub state_dir: &'a Path,
    pub bootstrap: &'a Path,
    pub snapshot: &'a Path,
    pub now_ms: u64,
    /// A fresh name for this restore's work dir (a resumed restore keeps its own).
    pub op: String,
    /// Stop as a crash would, at a step (tests of the resumption).
    pub stop_after: Option<StopAfter>,
}

/// Where a restore stops early when told to (`RestoreConfig::stop_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAfter {
    /// The snapshot staged and checked; nothing live moved yet.
    Staged,
    /// The live entries moved aside; none of the staged ones in yet.
    MovedAside,
}

fn stopped(at: &str) -> SnapshotError {
    SnapshotError::Store(StoreError::Io(std::io::Error::other(format!(
        "the restore was stopped after {at}, as asked"
    ))))
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    pub manifest: Manifest,
    pub root: PathBuf,
    /// Where the tree it replaced is kept.
    pub previous: PathBuf,
    /// It finished a restore an earlier run began.
    pub resumed: bool,
    /// Rooms whose index mark did not fit its restored journal (left as they were: the
    /// daemon refuses them as it did before).
    pub unpinned: Vec<String>,
}

/// Put the snapshot at `cfg.snapshot` back as the state dir it was taken of.
pub fn restore(cfg: &RestoreConfig<'_>) -> Result<Restored> {
    let snapshot = std::fs::canonicalize(cfg.snapshot)?;
    let m = read_manifest(&snapshot)?;
    let root = target_root(cfg.state_dir, &m)?;
    let state = StateDir {
        root: root.clone(),
        instance_id: m.instance_id.clone(),
    };
    let _lock = statedir::lock(&state)?;
    let (mut pending, resumed) = match read_pending(&root)? {
        Some(p) if p.fingerprint == m.fingerprint => (p, true),
        Some(p) => {
            return Err(SnapshotError::Pending(format!(
                "the restore of snapshot {} ({}) is unfinished here",
                p.snapshot, p.fingerprint
            )));
        }
        None => {
            check_current(&root, cfg.bootstrap, &m)?;
            let p = Pending {
                op: cfg.op.clone(),
                fingerprint: m.fingerprint.clone(),
                snapshot: canonical_str(&snapshot)?,
                started_ms: cfg.now_ms,
                phase: Phase::Staging,
            };
            write_pending(&root, &p)?;
            (p, false)
        }
    };
    let work = root.join(WORK).join(&pending.op);
    let staged = work.join("staged");
    let previous = work.join("previous");
    if pending.phase == Phase::Staging {
        if let Err(e) = stage(&snapshot, &m, &work, &staged) {
            if e.code().is_some() {
                // the snapshot's fault, found before anything live moved: the restore ends
                // here and the state dir is as it was
                let _ = std::fs::remove_dir_all(&work);
                std::fs::remove_file(root.join(PENDING))?;
                crate::fs::sync_dir(&root)?;
            }
            return Err(e);
        }
        pending.phase = Phase::Promoting;
        write_pending(&root, &pending)?;
        if cfg.stop_after == Some(StopAfter::Staged) {
            return Err(stopped("staging"));
        }
    }
    if pending.phase == Phase::Promoting {
        promote(&root, &m, &staged, &previous, cfg.stop_after)?;
        pending.phase = Phase::Pinning;
        write_pending(&root, &pending)?;
    }
    let unpinned = repin_all(&root, &m)?;
    statedir::register(cfg.bootstrap, &root, &m.instance_id)?;
    std::fs::remove_file(root.join(PENDING))?;
    crate::fs::sync_dir(&root)?;
    let _ = std::fs::remove_dir_all(&staged);
    Ok(Restored {
        manifest: m,
        root,
        previous,
        resumed,
        unpinned,
    })
}

/// The state dir's path, made when absent: the one the snapshot was taken of.
fn target_root(dir: &Path, m: &Manifest) -> Result<PathBuf> {
    let lexical = statedir::lexical_absolute(dir)?;
    let other = |at: &Path| {
        SnapshotError::OtherStateDir(format!(
            "the snapshot is of the state dir {}, not {}",
            m.canonical_path,
            at.display()
        ))
    };
    if lexical.to_str() != Some(m.canonical_path.as_str()) {
        return Err(other(&lexical));
    }
    match std::fs::symlink_metadata(&lexical) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(SnapshotError::Link(format!(
                "{} is not a directory (a symbolic link?)",
                lexical.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = lexical.parent() {
                std::fs::create_dir_all(parent)?;
            }
            mkdir_private(&lexical)?;
        }
        Err(e) => return Err(e.into()),
    }
    let canonical = std::fs::canonicalize(&lexical)?;
    if canonical != lexical {
        return Err(SnapshotError::Link(format!(
            "{} is reached through a symbolic link (canonical {})",
            lexical.display(),
            canonical.display()
        )));
    }
    Ok(canonical)
}

fn read_pending(root: &Path) -> Result<Option<Pending>> {
    match std::fs::read(root.join(PENDING)) {
        Ok(text) => serde_json::from_slice(&text).map(Some).map_err(|e| {
            SnapshotError::Pending(format!(
                "{PENDING} is unreadable ({e}): a restore was under way"
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn write_pending(root: &Path, p: &Pending) -> Result<()> {
    let text = serde_json::to_vec_pretty(p).map_err(std::io::Error::other)?;
    crate::fs::write_atomic(&root.join(PENDING), &text)?;
    Ok(())
}

/// The live state dir, before a restore begins: its marker and the bootstrap name the
/// snapshot's instance (or nothing, for a state dir that was lost).
fn check_current(root: &Path, bootstrap: &Path, m: &Manifest) -> Result<()> {
    match std::fs::read(root.join(MARKER)) {
        Ok(text) => {
            let live: Marker = serde_json::from_slice(&text).map_err(|e| {
                SnapshotError::Store(StoreError::SplitBrain(format!(
                    "marker {MARKER} is malformed: {e}"
                )))
            })?;
            if live.id != m.instance_id {
                return Err(SnapshotError::OtherStateDir(format!(
                    "the snapshot is of instance {}, this state dir is instance {}",
                    m.instance_id, live.id
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    match statedir::registered_id(bootstrap, root)? {
        Some(id) if id != m.instance_id => Err(SnapshotError::OtherStateDir(format!(
            "the machine bootstrap maps {} to instance {id}, the snapshot is of instance {}",
            root.display(),
            m.instance_id
        ))),
        _ => Ok(()),
    }
}

/// Copies the snapshot's tree into the staging dir, checking each entry against the manifest.
struct Stager<'a> {
    m: &'a Manifest,
    to: PathBuf,
    dirs: std::collections::BTreeSet<String>,
    files: usize,
}

impl Stager<'_> {
    fn listed_top(rel: &str) -> Result<()> {
        let top = rel.split('/').next().unwrap_or(rel);
        if INCLUDED.contains(&top) {
            Ok(())
        } else {
            Err(SnapshotError::Outside(format!(
                "the snapshot holds {rel}, which is not part of a state dir's store"
            )))
        }
    }
}

impl Visitor for Stager<'_> {
    fn dir(&mut self, rel: &str) -> Result<()> {
        Self::listed_top(rel)?;
        if !self.m.dirs.iter().any(|d| d == rel) {
            return Err(SnapshotError::Invalid(format!(
                "the snapshot holds the directory {rel}, which its manifest does not list"
            )));
        }
        mkdir_private(&self.to.join(rel))?;
        self.dirs.insert(rel.to_string());
        Ok(())
    }

    fn file(&mut self, rel: &str, mut file: std::fs::File, _bytes: u64) -> Result<()> {
        Self::listed_top(rel)?;
        let Ok(i) = self.m.files.binary_search_by(|f| f.path.as_str().cmp(rel)) else {
            return Err(SnapshotError::Invalid(format!(
                "the snapshot holds {rel}, which its manifest does not list"
            )));
        };
        let want = &self.m.files[i];
        let (bytes, sha256) = copy_hashing(&mut file, &self.to.join(rel))?;
        if (bytes, &sha256) != (want.bytes, &want.sha256) {
            return Err(SnapshotError::Invalid(format!(
                "{rel} is not the file the manifest names ({bytes} bytes, sha256 {sha256}; the manifest: {} bytes, {})",
                want.bytes, want.sha256
            )));
        }
        self.files += 1;
        Ok(())
    }
}

/// Copy the snapshot into `staged` and check the copy: every file and directory the manifest
/// lists, nothing else, each file's digest, each chain's tip, the marker.
fn stage(snapshot: &Path, m: &Manifest, work: &Path, staged: &Path) -> Result<()> {
    let restore_dir = work
        .parent()
        .expect("a restore's work dir is under .restore");
    match mkdir_private(restore_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        _ => {}
    }
    if exists(staged) {
        std::fs::remove_dir_all(staged)?;
    }
    match mkdir_private(work) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        _ => {}
    }
    mkdir_private(staged)?;
    let tree = open_top(&snapshot.join(TREE))?;
    let mut stager = Stager {
        m,
        to: staged.to_path_buf(),
        dirs: Default::default(),
        files: 0,
    };
    Walk::default().dir(&tree, "", 0, &mut stager)?;
    if let Some(d) = m.dirs.iter().find(|d| !stager.dirs.contains(*d)) {
        return Err(SnapshotError::Invalid(format!(
            "the snapshot lacks the directory {d} its manifest lists"
        )));
    }
    if stager.files != m.files.len() {
        return Err(SnapshotError::Invalid(format!(
            "the snapshot holds {} of the {} files its manifest lists",
            stager.files,
            m.files.len()
        )));
    }
    for c in &m.chains {
        let got = crate::journal::verify(&staged.join(journal_rel(&c.graph_id)), &c.graph_id)
            .map_err(|e| {
                SnapshotError::Invalid(format!("room {}'s chain does not verify: {e}", c.graph_id))
            })?;
        if (got.records, &got.tip_hash) != (c.records, &c.tip_hash) {
            return Err(SnapshotError::Invalid(format!(
                "room {}'s chain ends at {} records ({}), the manifest says {} ({})",
                c.graph_id, got.records, got.tip_hash, c.records, c.tip_hash
            )));
        }
    }
    let marker: Marker = serde_json::from_slice(&std::fs::read(staged.join(MARKER))?)
        .map_err(|e| SnapshotError::Invalid(format!("{MARKER}: {e}")))?;
    if (marker.id.as_str(), marker.canonical_path.as_str())
        != (m.instance_id.as_str(), m.canonical_path.as_str())
    {
        return Err(SnapshotError::Invalid(format!(
            "the snapshot's {MARKER} names another state dir than its manifest"
        )));
    }
    for d in m.dirs.iter().rev() {
        crate::fs::sync_dir(&staged.join(d))?;
    }
    crate::fs::sync_dir(staged)?;
    Ok(())
}

/// The live entries (and SQLite's sidecars beside the control database) move aside, then the
/// staged ones move in. Each rename is taken only when its source is still there, so a run
/// cut short anywhere is finished by the next.
fn promote(
    root: &Path,
    m: &Manifest,
    staged: &Path,
    previous: &Path,
    stop_after: Option<StopAfter>,
) -> Result<()> {
    match mkdir_private(previous) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        _ => {}
    }
    let in_snapshot =
        |name: &str| m.dirs.iter().any(|d| d == name) || m.files.iter().any(|f| f.path == name);
    let sidecars = SIDECARS.iter().map(|s| format!("control.db{s}"));
    let names: Vec<String> = INCLUDED
        .iter()
        .map(|s| s.to_string())
        .chain(sidecars)
        .collect();
    for name in &names {
        let (live, aside, new) = (root.join(name), previous.join(name), staged.join(name));
        // an entry the staged tree replaces (or one the snapshot lacks) moves aside once; an
        // entry already promoted is left where it is
        if exists(&live) && !exists(&aside) && (exists(&new) || !in_snapshot(name)) {
            std::fs::rename(&live, &aside)?;
        }
    }
    crate::fs::sync_dir(previous)?;
    crate::fs::sync_dir(root)?;
    if stop_after == Some(StopAfter::MovedAside) {
        return Err(stopped("moving the live tree aside"));
    }
    for name in INCLUDED {
        let new = staged.join(name);
        if exists(&new) {
            std::fs::rename(&new, root.join(name))?;
        }
    }
    crate::fs::sync_dir(root)?;
    for f in &m.files {
        let meta = std::fs::symlink_metadata(root.join(&f.path))?;
        if !meta.is_file() || meta.len() != f.bytes {
            return Err(SnapshotError::Invalid(format!(
                "{} is not the promoted file ({} bytes, the manifest: {})",
                f.path,
                meta.len(),
                f.bytes
            )));
        }
    }
    Ok(())
}

/// Each room's index recorded its journal's (device, inode), which a restored file does not
/// have: the mark moves to the restored file when its bytes are those the mark anchors.
fn repin_all(root: &Path, m: &Manifest) -> Result<Vec<String>> {
    let mut unpinned = Vec::new();
    for c in &m.chains {
        let index = root.join("rooms").join(&c.graph_id).join("sync_index.db");
        if !index.exists() {
            continue;
        }
        let conn = rusqlite::Connection::open(&index)?;
        let stored: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'journal_mark'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        let Some(stored) = stored else { continue };
        let mark: JournalMark = serde_json::from_str(&stored)
            .map_err(|e| StoreError::Corrupt(format!("journal mark of {}: {e}", c.graph_id)))?;
        let journal = root.join(journal_rel(&c.graph_id));
        match crate::journal::repin(&journal, &mark) {
            Ok(new) if new == mark => {}
            Ok(new) => {
                let value = serde_json::to_string(&new).expect("a journal mark serializes");
                conn.execute(
                    "UPDATE meta SET value = ?1 WHERE key = 'journal_mark'",
                    [value],
                )?;
            }
            Err(StoreError::Rotated(why)) => {
                tracing::warn!(room = %c.graph_id, %why, "restored index mark left as it was");
                unpinned.push(c.graph_id.clone());
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(unpinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_names_only_paths_inside_a_store() {
        for ok in [
            "rooms",
            "rooms/g_1/EVENTS.jsonl",
            MARKER,
            "stops/s1/phase-1.json",
        ] {
            assert!(check_rel(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../outside",
            "rooms/../../outside",
            "rooms/./x",
            "workers/launch/x",
            "room.lock",
            ".restore/op/previous",
            "rooms/x/",
            "rooms/a\0b",
        ] {
            assert!(
                matches!(check_rel(bad), Err(SnapshotError::Outside(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sidecars_are_named_by_their_database() {
        assert!(is_sidecar("control.db-wal"));
        assert!(is_sidecar("sync_index.db-shm"));
        assert!(is_sidecar("x.db-journal"));
        assert!(!is_sidecar("notes-wal"));
        assert!(!is_sidecar("control.db"));
    }
}
