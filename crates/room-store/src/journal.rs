//! A room's authoritative journal, `EVENTS.jsonl`: one canonical JSON record per line, hash
//! chained. An append is acknowledged only once durable: after the commit pipeline synced it
//! in the daemon's commit log (`pipeline`), or after this file's own `fdatasync`. At open the
//! journal is reconciled with the mark the index recorded: same (device, inode), at least as
//! long, and the same trailing anchor (the last ≤ 4,096 bytes and their SHA-256). A replaced or rotated file is
//! refused rather than silently re-read. A torn final line (a crash mid-append, never
//! acknowledged) is cut back to the last whole record and logged.

use crate::backend::RoomLog;
use crate::pipeline::{CommitLog, FileSync};
use crate::{Result, StoreError};
use room_core::chain::ChainTip;
use room_core::{Hlc, Record, Sealed, sha256_hex};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const BATCH_BYTES: usize = 1 << 20;
pub const RECORD_BYTES_MAX: usize = 8 << 20;
/// One append's bytes (its records, each a line): the most a crash can leave unsynced.
pub const APPEND_BYTES_MAX: usize = 2 * RECORD_BYTES_MAX;
pub const ANCHOR_BYTES_MAX: u64 = 4096;
/// The unit a disk writes whole: a crash keeps or loses each sector of an unsynced write.
const SECTOR_BYTES: u64 = 512;
/// The journal grows in zero-filled steps of this size, so that an append overwrites bytes that
/// are already allocated and written: its fdatasync then changes no file size or extent map,
/// which costs markedly less than growing the file at every append.
pub const GROWTH_BYTES: u64 = 256 * 1024;

/// Where the journal stood when the index last caught up with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalMark {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub anchor_sha256: Anchor,
    pub tip_seq: u64,
    pub tip_hash: String,
    pub tip_hlc: Hlc,
}

impl JournalMark {
    pub fn tip(&self) -> ChainTip {
        ChainTip {
            seq: self.tip_seq,
            hash: self.tip_hash.clone(),
            hlc: self.tip_hlc,
        }
    }
}

/// The SHA-256 of a journal's last `ANCHOR_BYTES_MAX` bytes before a mark: what tells a
/// rewritten journal from the one the index knew. Every append moves the mark but the index
/// writes it once per commit, so the digest is taken when first read, from the bytes kept at
/// the append (clones share it). Serialized as the hex digest.
#[derive(Clone)]
pub struct Anchor(Arc<AnchorOf>);

struct AnchorOf {
    tail: Box<[u8]>,
    sha256: std::sync::OnceLock<String>,
}

impl Anchor {
    pub fn of_digest(sha256: String) -> Anchor {
        Anchor(Arc::new(AnchorOf {
            tail: Box::default(),
            sha256: sha256.into(),
        }))
    }

    /// The anchor of a journal ending with `tail` (at most `ANCHOR_BYTES_MAX` bytes).
    pub fn of_tail(tail: &[u8]) -> Anchor {
        assert!(
            tail.len() as u64 <= ANCHOR_BYTES_MAX,
            "an anchor covers at most {ANCHOR_BYTES_MAX} bytes"
        );
        Anchor(Arc::new(AnchorOf {
            tail: tail.into(),
            sha256: std::sync::OnceLock::new(),
        }))
    }

    pub fn sha256(&self) -> &str {
        self.0.sha256.get_or_init(|| sha256_hex(&self.0.tail))
    }
}

impl PartialEq for Anchor {
    fn eq(&self, other: &Anchor) -> bool {
        self.sha256() == other.sha256()
    }
}

impl Eq for Anchor {}

impl std::fmt::Debug for Anchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.sha256())
    }
}

impl Serialize for Anchor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.sha256())
    }
}

impl<'de> Deserialize<'de> for Anchor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Anchor, D::Error> {
        String::deserialize(d).map(Anchor::of_digest)
    }
}

/// A record boundary of a journal and the chain tip there: where a verification starts or
/// stopped. `len` 0 with the genesis tip is the journal's start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainPos {
    pub len: u64,
    pub tip_seq: u64,
    pub tip_hash: String,
    pub tip_hlc: Hlc,
}

impl ChainPos {
    pub fn tip(&self) -> ChainTip {
        ChainTip {
            seq: self.tip_seq,
            hash: self.tip_hash.clone(),
            hlc: self.tip_hlc,
        }
    }

    pub fn of_mark(m: &JournalMark) -> ChainPos {
        ChainPos {
            len: m.len,
            tip_seq: m.tip_seq,
            tip_hash: m.tip_hash.clone(),
            tip_hlc: m.tip_hlc,
        }
    }
}

/// One record as read from the file, with its byte range.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub record: Record,
    pub offset: u64,
    pub len: u64,
}

/// How a scan ended.
#[derive(Debug, Clone)]
pub struct ScanEnd {
    pub tip: ChainTip,
    /// End of the last whole record.
    pub end: u64,
    /// Bytes after the last whole record that are not free space: a torn append, or sectors of
    /// unsynced appends that a crash persisted out of order (`scattered`).
    pub torn_bytes: u64,
    /// Preallocated zero bytes after the last record (and any torn bytes).
    pub free_bytes: u64,
    /// The torn bytes lie on both sides of zeros: sectors written out of order.
    pub scattered: bool,
}

/// Read records from `start`, verifying chain and HLC order from `tip`, in 1 MiB batches.
pub fn scan(
    file: &File,
    start: u64,
    tip: ChainTip,
    each: impl FnMut(Scanned) -> Result<()>,
) -> Result<ScanEnd> {
    scan_to(file, start, tip, None, each)
}

/// `scan`, reading no byte at or past `stop` (when given): the records wholly before it.
pub fn scan_to(
    file: &File,
    start: u64,
    tip: ChainTip,
    stop: Option<u64>,
    mut each: impl FnMut(Scanned) -> Result<()>,
) -> Result<ScanEnd> {
    let file_len = file.metadata()?.len();
    let file_len = stop.map_or(file_len, |s| s.min(file_len));
    let mut tip = tip;
    let mut pos = start; // start of the unconsumed bytes in `pending`
    let mut pending: Vec<u8> = Vec::new();
    let mut read_at = start;
    let mut chunk = vec![0u8; BATCH_BYTES];
    while read_at < file_len {
        let want = ((file_len - read_at) as usize).min(BATCH_BYTES);
        let n = file.read_at(&mut chunk[..want], read_at)?;
        if n == 0 {
            break;
        }
        read_at += n as u64;
        pending.extend_from_slice(&chunk[..n]);
        let mut consumed = 0usize;
        while let Some(nl) = pending[consumed..].iter().position(|&b| b == b'\n') {
            let line = &pending[consumed..consumed + nl];
            if line.contains(&0) {
                break; // the free space begins in this line: see below
            }
            let offset = pos + consumed as u64;
            let record: Record = serde_json::from_slice(line).map_err(|e| {
                StoreError::Corrupt(format!(
                    "record {} at byte {offset}: not a record: {e}",
                    tip.seq + 1
                ))
            })?;
            tip = record
                .verify_after(&tip)
                .map_err(|e| StoreError::Corrupt(format!("at byte {offset}: {e}")))?;
            each(Scanned {
                record,
                offset,
                len: nl as u64 + 1,
            })?;
            consumed += nl + 1;
        }
        pending.drain(..consumed);
        pos += consumed as u64;
        // A NUL byte never occurs in a record (canonical JSON escapes it): from the first one on
        // is the preallocated free space, after whatever torn bytes precede it.
        if let Some(z) = pending.iter().position(|&b| b == 0) {
            let free_start = pos + z as u64;
            let in_pending = pending[z..]
                .iter()
                .rposition(|&b| b != 0)
                .map(|i| free_start + i as u64);
            let last_nonzero =
                last_nonzero_from(file, read_at, file_len, &mut chunk)?.or(in_pending);
            let Some(last) = last_nonzero else {
                return Ok(ScanEnd {
                    tip,
                    end: pos,
                    torn_bytes: z as u64,
                    free_bytes: file_len - pos - z as u64,
                    scattered: false,
                });
            };
            // Written bytes after a run of zeros. Appends are contiguous and acknowledged only
            // once synced, so no acknowledged record lies past a zero: if they look like what a
            // crash leaves of unsynced appends, they are cut with the torn tail.
            if !crash_debris(file, file_len, pos, free_start, last, &mut chunk)? {
                return Err(StoreError::Corrupt(format!(
                    "non-zero byte at {last} in the journal's free space (which starts at {free_start}), not as a crash leaves unsynced sectors"
                )));
            }
            return Ok(ScanEnd {
                tip,
                end: pos,
                torn_bytes: last + 1 - pos,
                free_bytes: file_len - last - 1,
                scattered: true,
            });
        }
        if pending.len() > RECORD_BYTES_MAX {
            return Err(StoreError::Corrupt(format!(
                "record {} at byte {pos} exceeds the {RECORD_BYTES_MAX}-byte ceiling",
                tip.seq + 1
            )));
        }
    }
    Ok(ScanEnd {
        free_bytes: 0,
        tip,
        end: pos,
        torn_bytes: pending.len() as u64,
        scattered: false,
    })
}

/// Whether `[free_start, last]` (`free_start` the first zero after the last whole record `end`,
/// `last` the last non-zero byte) is what a crash leaves of one unsynced append. Appends run one
/// at a time and each is synced before the next, so at most one is unsynced: the debris fits in
/// `APPEND_BYTES_MAX`, or it is not debris (a hole in synced data must not cost what follows it).
/// The disk writes each sector whole or not at all, in no particular order, and a sector never
/// written reads as the preallocated zeros. So:
/// - if torn bytes precede `free_start` inside its sector, that sector was written and the append
///   ended in it: nothing may follow;
/// - otherwise the rest of `free_start`'s sector is zeros (it holds the synced end and was not
///   rewritten), and every later sector is all zeros or record bytes from its first byte on
///   (records hold no NUL);
/// - a sector whose bytes stop early holds the append's end, which is a newline, and no sector
///   after it holds anything.
fn crash_debris(
    file: &File,
    file_len: u64,
    end: u64,
    free_start: u64,
    last: u64,
    chunk: &mut [u8],
) -> Result<bool> {
    if last + 1 - end > APPEND_BYTES_MAX as u64 {
        return Ok(false);
    }
    if free_start > end && !free_start.is_multiple_of(SECTOR_BYTES) {
        return Ok(false);
    }
    // whole sectors, up to the one that holds `last`, clipped to the file
    let stop = ((last / SECTOR_BYTES + 1) * SECTOR_BYTES).min(file_len);
    let mut ended = false;
    let mut at = free_start;
    while at < stop {
        // each read ends on a sector boundary, so no sector straddles two reads
        let room = chunk.len() - (at % SECTOR_BYTES) as usize;
        let want = ((stop - at) as usize).min(room);
        file.read_exact_at(&mut chunk[..want], at)?;
        let mut off = 0usize;
        while off < want {
            let s_start = at + off as u64;
            let s_end = ((s_start / SECTOR_BYTES + 1) * SECTOR_BYTES).min(stop);
            let len = (s_end - s_start) as usize;
            let sector = &chunk[off..off + len];
            let data = sector.iter().position(|&b| b == 0).unwrap_or(len);
            if sector[data..].iter().any(|&b| b != 0) {
                return Ok(false); // zeros inside a sector's data
            }
            if data > 0 {
                let whole_from_start = s_start.is_multiple_of(SECTOR_BYTES);
                if !whole_from_start || ended {
                    return Ok(false);
                }
                if data < len {
                    if sector[data - 1] != b'\n' {
                        return Ok(false); // an append ends with its newline
                    }
                    ended = true;
                }
            }
            off += len;
        }
        at += want as u64;
    }
    Ok(true)
}

/// The offset of the last non-zero byte in `[from, file_len)`, if any.
fn last_nonzero_from(
    file: &File,
    from: u64,
    file_len: u64,
    chunk: &mut [u8],
) -> Result<Option<u64>> {
    let mut last = None;
    let mut at = from;
    while at < file_len {
        let want = ((file_len - at) as usize).min(chunk.len());
        let n = file.read_at(&mut chunk[..want], at)?;
        if n == 0 {
            break;
        }
        if let Some(i) = chunk[..n].iter().rposition(|&b| b != 0) {
            last = Some(at + i as u64);
        }
        at += n as u64;
    }
    Ok(last)
}

fn anchor_of(file: &File, len: u64) -> Result<String> {
    let a = len.min(ANCHOR_BYTES_MAX);
    let mut buf = vec![0u8; a as usize];
    file.read_exact_at(&mut buf, len - a)?;
    Ok(sha256_hex(&buf))
}

pub struct Journal {
    file: Arc<File>,
    path: PathBuf,
    mark: JournalMark,
    /// Set when a failed write or sync leaves the file's state unknown; no further appends.
    poisoned: Option<String>,
    /// Bytes known to be on stable storage (the length at the last successful sync).
    synced_len: u64,
    /// The last ≤ 4,096 bytes, so the anchor after an append needs no read that could fail.
    tail: Vec<u8>,
    /// The file's physical size: the records, then zero-filled free space.
    allocated: u64,
    faults: Option<Arc<dyn Faults>>,
    /// With a commit pipeline, appends are made durable by its log, not by this file's sync.
    pipeline: Option<(Arc<CommitLog>, Arc<FileSync>)>,
}

/// A fault the simulator injects into one append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write fails before any byte lands (EIO or ENOSPC).
    WriteError(std::io::ErrorKind),
    /// Only this many bytes land, then the write fails.
    ShortWrite(usize),
    /// Every byte lands, then fsync fails.
    SyncError,
    /// Every byte lands and the process dies before fsync: nothing more happens.
    CrashAfterWrite,
    /// A deliberately broken store: acknowledge without fsync (for proving the simulator).
    SkipSync,
}

/// Decides faults at the store's own write points: journal appends and blob writes. (SQLite's
/// writes are faulted under it, by the simulator's VFS.) Only the simulator installs one.
pub trait Faults: Send + Sync + std::fmt::Debug {
    fn on_append(&self, path: &Path, bytes: usize) -> Option<Fault>;
    /// A blob write (temp file, fsync, rename, directory fsync).
    fn on_blob_write(&self, _path: &Path, _bytes: usize) -> Option<Fault> {
        None
    }
    /// A commit log batch: its frame's write and sync (`pipeline`).
    fn on_log_write(&self, _path: &Path, _bytes: usize) -> Option<Fault> {
        None
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("mark", &self.mark)
            .finish()
    }
}

impl Journal {
    /// Open (creating if absent), reconcile with `known`, cut a torn tail, and feed every record
    /// after the known mark (all records when `known` is `None`) to `each`.
    pub fn open(
        path: &Path,
        graph_id: &str,
        known: Option<&JournalMark>,
        errors_log: &Path,
        each: impl FnMut(Scanned) -> Result<()>,
    ) -> Result<Journal> {
        // Not O_APPEND: appends overwrite the preallocated zeros at the logical end.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let meta = file.metadata()?;
        let (dev, ino, len) = (meta.dev(), meta.ino(), meta.len());
        let (start, tip) = match known {
            None => (0, ChainTip::genesis(graph_id)),
            Some(k) => {
                if (k.dev, k.ino) != (dev, ino) {
                    return Err(StoreError::Rotated(format!(
                        "{} is a different file (device {dev} inode {ino}, index recorded device {} inode {})",
                        path.display(),
                        k.dev,
                        k.ino
                    )));
                }
                if len < k.len {
                    return Err(StoreError::Rotated(format!(
                        "{} is shorter ({len} bytes) than the {} bytes already indexed",
                        path.display(),
                        k.len
                    )));
                }
                if k.len > 0 && anchor_of(&file, k.len)? != k.anchor_sha256.sha256() {
                    return Err(StoreError::Rotated(format!(
                        "{}: the trailing anchor before byte {} changed",
                        path.display(),
                        k.len
                    )));
                }
                (k.len, k.tip())
            }
        };
        let end = scan(&file, start, tip, each)?;
        if end.torn_bytes > 0 {
            tracing::warn!(path = %path.display(), bytes = end.torn_bytes, scattered = end.scattered, "cutting a torn tail");
            // Bytes past a hole are cut only in the shape a crash leaves, but they are kept
            // beside the journal all the same: a cut must never be the only copy of anything.
            let kept_in = if end.scattered {
                let mut cut = vec![0u8; end.torn_bytes as usize];
                file.read_exact_at(&mut cut, end.end)?;
                let side = path.with_extension(format!("jsonl.cut-{}", end.end));
                crate::fs::write_atomic(&side, &cut)?;
                Some(side.display().to_string())
            } else {
                None
            };
            file.set_len(end.end)?;
            file.sync_all()?;
            crate::fs::append_jsonl(
                errors_log,
                &serde_json::json!({
                    "kind": "torn_tail_cut",
                    "journal": path.display().to_string(),
                    "offset": end.end,
                    "bytes": end.torn_bytes,
                    "scattered": end.scattered,
                    "kept_in": kept_in,
                    "after_seq": end.tip.seq,
                }),
            )?;
        }
        let anchor_sha256 = Anchor::of_digest(anchor_of(&file, end.end)?);
        let mark = JournalMark {
            dev,
            ino,
            len: end.end,
            anchor_sha256,
            tip_seq: end.tip.seq,
            tip_hash: end.tip.hash,
            tip_hlc: end.tip.hlc,
        };
        let synced_len = mark.len;
        let allocated = file.metadata()?.len();
        let a = mark.len.min(ANCHOR_BYTES_MAX);
        let mut tail = vec![0u8; a as usize];
        file.read_exact_at(&mut tail, mark.len - a)?;
        if mark.len == 0
            && let Some(dir) = path.parent()
        {
            // a new journal's directory entry must be durable before its first record is
            crate::fs::sync_dir(dir)?;
        }
        Ok(Journal {
            file: Arc::new(file),
            path: path.to_path_buf(),
            mark,
            poisoned: None,
            synced_len,
            tail,
            allocated,
            faults: None,
            pipeline: None,
        })
    }

    /// Make sure zero-filled space reaches at least `end`, growing by `GROWTH_BYTES` steps. The
    /// zeros are synced with the next record's fdatasync; a crash before it leaves zeros or a
    /// shorter file, both of which a scan reads as free space.
    fn grow_to(&mut self, end: u64) -> std::io::Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let target = end.div_ceil(GROWTH_BYTES) * GROWTH_BYTES;
        let zeros = vec![0u8; 64 * 1024];
        let mut at = self.allocated.max(self.mark.len);
        while at < target {
            let n = ((target - at) as usize).min(zeros.len());
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        self.allocated = target;
        Ok(())
    }

    /// Install a fault injector (simulation only).
    pub fn with_faults(mut self, faults: Option<Arc<dyn Faults>>) -> Self {
        self.faults = faults;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Make appends durable through `log` (shared by every room) instead of this file's own
    /// fdatasync.
    pub fn with_pipeline(mut self, log: &Arc<CommitLog>) -> Result<Self> {
        let sync = log.register(&self.path, self.synced_len)?;
        self.pipeline = Some((log.clone(), sync));
        Ok(self)
    }
}

impl RoomLog for Journal {
    fn len_now(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(self.mark.len, |m| m.len())
    }

    fn location(&self) -> PathBuf {
        self.path.clone()
    }

    /// Bytes known to be durable; anything past it would not survive a power cut.
    fn synced_len(&self) -> u64 {
        self.synced_len
    }

    fn file_synced_len(&self) -> u64 {
        match &self.pipeline {
            Some((_, sync)) => sync.file_synced(),
            None => self.synced_len,
        }
    }

    fn mark(&self) -> &JournalMark {
        &self.mark
    }

    fn tip(&self) -> ChainTip {
        self.mark.tip()
    }

    fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Append sealed records and make them durable. Returns each record's (offset, len).
    /// On failure the journal is cut back to its previous length; if even that fails it is
    /// poisoned and refuses further appends until reopened.
    fn append(&mut self, records: &[Sealed]) -> Result<Vec<(u64, u64)>> {
        if let Some(why) = &self.poisoned {
            return Err(StoreError::Corrupt(format!("journal is poisoned: {why}")));
        }
        let mut tip = self.tip();
        let mut buf = Vec::new();
        let mut ranges = Vec::with_capacity(records.len());
        for s in records {
            tip = s
                .check_after(&tip)
                .map_err(|e| StoreError::Corrupt(format!("refusing to append: {e}")))?;
            let start = self.mark.len + buf.len() as u64;
            buf.extend_from_slice(s.line());
            buf.push(b'\n');
            let len = self.mark.len + buf.len() as u64 - start;
            if len as usize > RECORD_BYTES_MAX {
                return Err(StoreError::Corrupt(format!(
                    "record {} exceeds {RECORD_BYTES_MAX} bytes",
                    s.record().seq
                )));
            }
            ranges.push((start, len));
        }
        if buf.len() > APPEND_BYTES_MAX {
            return Err(StoreError::Corrupt(format!(
                "an append of {} bytes exceeds {APPEND_BYTES_MAX}",
                buf.len()
            )));
        }
        let old_len = self.mark.len;
        let fault = self
            .faults
            .as_ref()
            .and_then(|f| f.on_append(&self.path, buf.len()));
        let mut sync = true;
        let end = old_len + buf.len() as u64;
        let written = match fault {
            None => self
                .grow_to(end)
                .and_then(|()| self.file.write_all_at(&buf, old_len)),
            Some(Fault::WriteError(kind)) => {
                Err(std::io::Error::new(kind, "injected write failure"))
            }
            Some(Fault::ShortWrite(n)) => self
                .grow_to(end)
                .and_then(|()| self.file.write_all_at(&buf[..n.min(buf.len())], old_len))
                .and_then(|()| Err(std::io::Error::other("injected short write"))),
            Some(Fault::SyncError) => self
                .grow_to(end)
                .and_then(|()| self.file.write_all_at(&buf, old_len)),
            Some(Fault::CrashAfterWrite) => {
                self.grow_to(end)?;
                self.file.write_all_at(&buf, old_len)?;
                self.poisoned = Some("crashed after write, before fsync".into());
                return Err(StoreError::InDoubt(
                    "injected crash after write, before fsync".into(),
                ));
            }
            Some(Fault::SkipSync) => {
                sync = false;
                self.grow_to(end)
                    .and_then(|()| self.file.write_all_at(&buf, old_len))
            }
        };
        if let Err(e) = written {
            // Nothing was synced: cut back to the last whole record. If that works the file is
            // in a known state and the journal stays usable.
            self.allocated = old_len;
            if let Err(e2) = self
                .file
                .set_len(old_len)
                .and_then(|()| self.file.sync_all())
            {
                self.poisoned = Some(format!("append failed ({e}) and cut-back failed ({e2})"));
            }
            return Err(e.into());
        }
        let synced = if !sync {
            Ok(())
        } else if fault == Some(Fault::SyncError) {
            Err(std::io::Error::other("injected fsync failure"))
        } else if let Some((log, s)) = &self.pipeline {
            s.wrote_to(end);
            match log.commit(s, old_len, buf.clone()) {
                Ok(()) => Ok(()),
                Err(StoreError::InDoubt(why)) => {
                    // the bytes may be in the log's last frame: a restart's replay decides,
                    // so the file is left as it is
                    self.poisoned = Some(why.clone());
                    return Err(StoreError::InDoubt(why));
                }
                Err(e) => {
                    // nothing of the batch reached the log: cut back as a failed write is
                    s.cut_back(old_len);
                    self.allocated = old_len;
                    if let Err(e2) = self
                        .file
                        .set_len(old_len)
                        .and_then(|()| self.file.sync_all())
                    {
                        self.poisoned =
                            Some(format!("commit failed ({e}) and cut-back failed ({e2})"));
                    }
                    return Err(e);
                }
            }
        } else {
            self.file.sync_data()
        };
        if let Err(e) = synced {
            // After a failed fsync the page cache may or may not reach the disk: nothing about
            // this file can be trusted until it is reopened and reconciled, and the caller must
            // not say "nothing was written".
            let _ = self
                .file
                .set_len(old_len)
                .and_then(|()| self.file.sync_all());
            self.poisoned = Some(format!("fsync failed: {e}"));
            return Err(StoreError::InDoubt(format!("fsync failed: {e}")));
        }
        if sync {
            self.synced_len = old_len + buf.len() as u64;
        }
        self.mark.len = old_len + buf.len() as u64;
        self.tail.extend_from_slice(&buf);
        let excess = self.tail.len().saturating_sub(ANCHOR_BYTES_MAX as usize);
        self.tail.drain(..excess);
        self.mark.anchor_sha256 = Anchor::of_tail(&self.tail);
        self.mark.tip_seq = tip.seq;
        self.mark.tip_hash = tip.hash;
        self.mark.tip_hlc = tip.hlc;
        Ok(ranges)
    }
}

/// The result of verifying a journal (or a range of it) read-only.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub records: u64,
    pub tip_hash: String,
    pub tip_hlc: Hlc,
    /// End of the last whole record verified.
    pub bytes: u64,
    /// Bytes after the last whole record that the next daemon start will cut: a torn final
    /// line, or sectors of an unsynced append a crash persisted out of order.
    pub torn_bytes: u64,
    /// What stopped a ranged verification (`verify_range`) early: a record that does not
    /// verify (named by seq and byte), or bytes past the records unlike a crash's. The rest of
    /// the report then describes the good records before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damage: Option<String>,
    /// With `damage`: the lines from the damaged record up to the free space (or `stop`), each
    /// a record as written: how many records the damage costs.
    pub damaged_records: u64,
}

/// Newline-terminated lines in `[from, stop)` before the first NUL (the free space).
fn lines_from(file: &File, from: u64, stop: Option<u64>) -> Result<u64> {
    let file_len = file.metadata()?.len();
    let end = stop.map_or(file_len, |s| s.min(file_len));
    let mut chunk = vec![0u8; BATCH_BYTES];
    let (mut at, mut lines) = (from, 0u64);
    while at < end {
        let want = ((end - at) as usize).min(chunk.len());
        let n = file.read_at(&mut chunk[..want], at)?;
        if n == 0 {
            break;
        }
        let data = &chunk[..n];
        let z = data.iter().position(|&b| b == 0);
        lines += data[..z.unwrap_or(n)]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        if z.is_some() {
            break;
        }
        at += n as u64;
    }
    Ok(lines)
}

impl VerifyReport {
    /// Where the verification stopped, to continue from.
    pub fn pos(&self) -> ChainPos {
        ChainPos {
            len: self.bytes,
            tip_seq: self.records,
            tip_hash: self.tip_hash.clone(),
            tip_hlc: self.tip_hlc,
        }
    }
}

/// The mark of a journal restored from a snapshot (`crate::snapshot`): the same bytes in a new
/// file. The file must be at least as long as the mark and end, before the mark's length, with
/// the mark's anchor; the mark is then the same one, on the restored file's (device, inode).
/// Anything else is `Rotated`, as at an open.
pub fn repin(path: &Path, mark: &JournalMark) -> Result<JournalMark> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if meta.len() < mark.len {
        return Err(StoreError::Rotated(format!(
            "{} is shorter ({} bytes) than the {} bytes its index recorded",
            path.display(),
            meta.len(),
            mark.len
        )));
    }
    if mark.len > 0 && anchor_of(&file, mark.len)? != mark.anchor_sha256.sha256() {
        return Err(StoreError::Rotated(format!(
            "{}: the trailing anchor before byte {} is not the one its index recorded",
            path.display(),
            mark.len
        )));
    }
    let mut out = mark.clone();
    out.dev = meta.dev();
    out.ino = meta.ino();
    Ok(out)
}

/// Verify a journal from its first record without modifying it.
pub fn verify(path: &Path, graph_id: &str) -> Result<VerifyReport> {
    verify_with(path, graph_id, |_| Ok(()))
}

/// `verify`, feeding each record to `each` (a reader that looks for certain events).
pub fn verify_with(
    path: &Path,
    graph_id: &str,
    each: impl FnMut(Scanned) -> Result<()>,
) -> Result<VerifyReport> {
    let file = File::open(path)?;
    let end = scan(&file, 0, ChainTip::genesis(graph_id), each)?;
    Ok(report(end))
}

/// Verify the records after `from` (the journal's start when `None`) that end before `stop`
/// (the file's end when `None`) without modifying anything; the report says where the last
/// whole record ends (bytes of a record that `stop` cuts count as torn). Damage is reported
/// in the report (`damage`, with the good records before it), not as an error.
pub fn verify_range(
    path: &Path,
    graph_id: &str,
    from: Option<&ChainPos>,
    stop: Option<u64>,
) -> Result<VerifyReport> {
    let file = File::open(path)?;
    let (start, tip) = match from {
        Some(p) => (p.len, p.tip()),
        None => (0, ChainTip::genesis(graph_id)),
    };
    let mut good = (start, tip.clone());
    let scanned = scan_to(&file, start, tip, stop, |s| {
        good = (
            s.offset + s.len,
            ChainTip {
                seq: s.record.seq,
                hash: s.record.hash.clone(),
                hlc: s.record.hlc,
            },
        );
        Ok(())
    });
    match scanned {
        Ok(end) => Ok(report(end)),
        Err(StoreError::Corrupt(why)) => Ok(VerifyReport {
            damaged_records: lines_from(&file, good.0, stop)?,
            records: good.1.seq,
            tip_hash: good.1.hash,
            tip_hlc: good.1.hlc,
            bytes: good.0,
            torn_bytes: 0,
            damage: Some(why),
        }),
        Err(e) => Err(e),
    }
}

fn report(end: ScanEnd) -> VerifyReport {
    VerifyReport {
        records: end.tip.seq,
        tip_hash: end.tip.hash,
        tip_hlc: end.tip.hlc,
        bytes: end.end,
        torn_bytes: end.torn_bytes,
        damage: None,
        damaged_records: 0,
    }
}

/// Cut a journal back to `len` (a record boundary the caller verified), keeping every byte
/// after it beside the journal (`EVENTS.jsonl.cut-<len>`) first: a cut is never the only copy
/// of anything. Returns where the bytes were kept.
pub fn cut_at(path: &Path, len: u64, errors_log: &Path) -> Result<PathBuf> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let file_len = file.metadata()?.len();
    let mut rest = vec![0u8; file_len.saturating_sub(len) as usize];
    file.read_exact_at(&mut rest, len)?;
    // the zero-filled free space is not worth keeping
    let written = rest.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    rest.truncate(written);
    let side = path.with_extension(format!("jsonl.cut-{len}"));
    crate::fs::write_atomic(&side, &rest)?;
    file.set_len(len)?;
    file.sync_all()?;
    crate::fs::append_jsonl(
        errors_log,
        &serde_json::json!({
            "kind": "journal_cut",
            "journal": path.display().to_string(),
            "offset": len,
            "bytes": rest.len(),
            "kept_in": side.display().to_string(),
        }),
    )?;
    Ok(side)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A journal in a fresh directory holding three records, and where they end.
    fn three_records() -> (tempfile::TempDir, PathBuf, Journal, u64) {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("EVENTS.jsonl");
        let (mut j, _) = open(t.path(), None).unwrap();
        j.append(&records(&j.tip(), 3)).unwrap();
        let end = j.mark().len;
        (t, p, j, end)
    }

    fn records(tip: &ChainTip, n: usize) -> Vec<Sealed> {
        let mut t = tip.clone();
        let mut out = vec![];
        for i in 0..n {
            let r = Sealed::seal(
                &t,
                format!("evt_{i}"),
                t.hlc.tick(1_000 + i as u64),
                json!({"n": i}),
            );
            t = r.check_after(&t).unwrap();
            out.push(r);
        }
        out
    }

    fn open(dir: &Path, known: Option<&JournalMark>) -> Result<(Journal, Vec<u64>)> {
        let mut seen = vec![];
        let j = Journal::open(
            &dir.join("EVENTS.jsonl"),
            "g",
            known,
            &dir.join("errors.jsonl"),
            |s| {
                seen.push(s.record.seq);
                Ok(())
            },
        )?;
        Ok((j, seen))
    }

    #[test]
    fn append_reopen_and_catch_up_from_mark() {
        let t = tempfile::tempdir().unwrap();
        let (mut j, _) = open(t.path(), None).unwrap();
        j.append(&records(&j.tip(), 3)).unwrap();
        let mark = j.mark().clone();
        j.append(&records(&j.tip(), 2)).unwrap();
        drop(j);
        let (j, seen) = open(t.path(), Some(&mark)).unwrap();
        assert_eq!(seen, vec![4, 5]);
        assert_eq!(j.tip().seq, 5);
        assert_eq!(
            verify(&t.path().join("EVENTS.jsonl"), "g").unwrap().records,
            5
        );
    }

    #[test]
    fn torn_tail_is_cut_and_logged() {
        let t = tempfile::tempdir().unwrap();
        let (mut j, _) = open(t.path(), None).unwrap();
        j.append(&records(&j.tip(), 2)).unwrap();
        let good = j.mark().len;
        drop(j);
        // a crash mid-append: part of a record over the preallocated zeros at the logical end
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(t.path().join("EVENTS.jsonl"))
            .unwrap();
        assert!(
            f.metadata().unwrap().len() > good,
            "the journal is preallocated"
        );
        f.write_all_at(b"{\"seq\":3,\"id\":\"ev", good).unwrap();
        let (j, seen) = open(t.path(), None).unwrap();
        assert_eq!(seen, vec![1, 2]);
        assert_eq!(j.mark().len, good);
        let log = std::fs::read_to_string(t.path().join("errors.jsonl")).unwrap();
        assert!(log.contains("torn_tail_cut"));
    }

    #[test]
    fn replaced_or_rewritten_journal_is_rotated() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("EVENTS.jsonl");
        let (mut j, _) = open(t.path(), None).unwrap();
        j.append(&records(&j.tip(), 2)).unwrap();
        let mark = j.mark().clone();
        drop(j);
        // same bytes, new inode (renamed over the old one while both exist)
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(t.path().join("new"), &bytes).unwrap();
        std::fs::rename(t.path().join("new"), &p).unwrap();
        assert!(matches!(
            open(t.path(), Some(&mark)),
            Err(StoreError::Rotated(_))
        ));
        // same inode, rewritten tail
        let (_, _) = open(t.path(), None).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        let mut mark2 = mark.clone();
        mark2.ino = meta.ino();
        mark2.dev = meta.dev();
        let mut b = bytes.clone();
        let n = mark.len as usize; // the last record's end, not the preallocated space after it
        b[n - 3] = b'x';
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(
            open(t.path(), Some(&mark2)),
            Err(StoreError::Rotated(_))
        ));
    }

    #[test]
    fn preallocated_space_is_free_and_stray_bytes_in_it_are_corruption() {
        let (t, p, j, end) = three_records();
        drop(j);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), GROWTH_BYTES);
        let r = verify(&p, "g").unwrap();
        assert_eq!((r.records, r.bytes, r.torn_bytes), (3, end, 0));
        // reopening and appending continues at the logical end, not after the zeros
        let (mut j, seen) = open(t.path(), None).unwrap();
        assert_eq!(seen, vec![1, 2, 3]);
        j.append(&records(&j.tip(), 1)).unwrap();
        drop(j);
        assert_eq!(verify(&p, "g").unwrap().records, 4);
        // a non-zero byte in the free space is not a torn append: it is corruption
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"x", GROWTH_BYTES - 10).unwrap();
        assert!(matches!(verify(&p, "g"), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn unsynced_sectors_a_crash_persisted_out_of_order_are_cut_with_the_torn_tail() {
        let (t, p, j, end) = three_records();
        // one unsynced append of 40 records at [end, written)
        let unsynced: Vec<u8> = records(&j.tip(), 40)
            .iter()
            .flat_map(|r| {
                let mut l = r.line().to_vec();
                l.push(b'\n');
                l
            })
            .collect();
        let written = end + unsynced.len() as u64;
        drop(j);
        // the crash lost its first sectors, kept a later one and the one holding its end
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let sector_at =
            |at: u64| (at - end) as usize..((at + SECTOR_BYTES).min(written) - end) as usize;
        let s1 = (end / SECTOR_BYTES + 2) * SECTOR_BYTES;
        let s_last = (written - 1) / SECTOR_BYTES * SECTOR_BYTES;
        assert!(
            s1 + SECTOR_BYTES < s_last,
            "the append spans enough sectors"
        );
        f.write_all_at(&unsynced[sector_at(s1)], s1).unwrap();
        f.write_all_at(&unsynced[sector_at(s_last)], s_last)
            .unwrap();
        drop(f);
        let r = verify(&p, "g").unwrap();
        assert_eq!((r.records, r.bytes, r.torn_bytes), (3, end, written - end));
        let errors = t.path().join("errors.jsonl");
        let (mut j, seen) = open(t.path(), None).unwrap();
        assert_eq!(seen, vec![1, 2, 3]);
        let log = std::fs::read_to_string(&errors).unwrap();
        assert!(
            log.contains("torn_tail_cut") && log.contains("\"scattered\":true"),
            "{log}"
        );
        // what was cut is kept beside the journal
        let side = t.path().join(format!("EVENTS.jsonl.cut-{end}"));
        let kept = std::fs::read(&side).unwrap();
        assert_eq!(kept.len() as u64, written - end);
        assert_eq!(
            &kept[(s1 - end) as usize..][..SECTOR_BYTES as usize],
            &unsynced[sector_at(s1)]
        );
        j.append(&records(&j.tip(), 1)).unwrap();
        drop(j);
        assert_eq!(verify(&p, "g").unwrap().records, 4);
    }

    #[test]
    fn bytes_past_a_hole_unlike_a_crash_are_corruption() {
        let (_t, p, j, end) = three_records();
        drop(j);
        let hole_end = (end / SECTOR_BYTES + 1) * SECTOR_BYTES;
        let write = |bytes: &[u8], at: u64| {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.write_all_at(bytes, at).unwrap();
        };
        let corrupt = || matches!(verify(&p, "g"), Err(StoreError::Corrupt(_)));
        // data that starts inside a sector
        write(b"{\"x\":1}\n", hole_end + SECTOR_BYTES + 7);
        assert!(corrupt());
        write(&[0u8; 16], hole_end + SECTOR_BYTES + 7);
        // a sector whose data stops early without the newline an append ends with
        write(b"{\"x\":1}", hole_end + SECTOR_BYTES);
        assert!(corrupt());
        write(b"\n", hole_end + SECTOR_BYTES + 7);
        assert!(!corrupt(), "a whole sector ending in a newline is debris");
        // torn bytes before the zeros in the same sector: that append ended there
        assert_ne!((end + 8) % SECTOR_BYTES, 0);
        write(b"{\"seq\":4", end);
        assert!(corrupt());
        write(&[0u8; 8], end);
        // more than one append can leave unsynced: a hole in synced data, not debris
        let mut big = vec![b'a'; APPEND_BYTES_MAX + SECTOR_BYTES as usize];
        *big.last_mut().unwrap() = b'\n';
        write(&big, hole_end);
        assert!(corrupt());
    }

    /// The scrub's rate, stated in ARCHITECTURE.md: `cargo test -p room-store --release --
    /// --ignored scrub_rate --nocapture`.
    #[test]
    #[ignore]
    fn scrub_rate() {
        let t = tempfile::tempdir().unwrap();
        let (mut j, _) = open(t.path(), None).unwrap();
        let text = "x".repeat(900);
        let mut tip = j.tip();
        for _ in 0..64 {
            let mut batch = Vec::new();
            for i in 0..1024u64 {
                let r = Sealed::seal(
                    &tip,
                    format!("evt_{}", tip.seq + 1),
                    tip.hlc.tick(1_000 + i),
                    json!({"kind": "turn", "text": text}),
                );
                tip = r.check_after(&tip).unwrap();
                batch.push(r);
            }
            j.append(&batch).unwrap();
        }
        let len = j.mark().len;
        drop(j);
        let p = t.path().join("EVENTS.jsonl");
        let started = std::time::Instant::now();
        let mut from: Option<ChainPos> = None;
        while from.as_ref().map_or(0, |f| f.len) < len {
            let stop = from.as_ref().map_or(0, |f| f.len) + (16 << 20);
            let r = verify_range(&p, "g", from.as_ref(), Some(stop)).unwrap();
            assert!(r.damage.is_none());
            from = Some(r.pos());
        }
        let secs = started.elapsed().as_secs_f64();
        let mib = len as f64 / (1 << 20) as f64;
        eprintln!(
            "scrub: {mib:.0} MiB in {secs:.2} s = {:.0} MiB/s, {:.1} s per GiB of CPU",
            mib / secs,
            secs / mib * 1024.0
        );
    }

    #[test]
    fn corrupt_middle_record_names_its_seq() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("EVENTS.jsonl");
        let (mut j, _) = open(t.path(), None).unwrap();
        j.append(&records(&j.tip(), 3)).unwrap();
        drop(j);
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replacen("\"n\":1", "\"n\":9", 1);
        std::fs::write(&p, text).unwrap();
        let err = verify(&p, "g").unwrap_err().to_string();
        assert!(err.contains("record 2"), "{err}");
    }
}
