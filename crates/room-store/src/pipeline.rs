//! The commit pipeline: journal appends of all rooms made durable together. A room's append
//! writes its bytes into its journal (the page cache) and hands the same bytes, with their
//! place, to this daemon-wide commit log; one leader writes every queued entry as one
//! checksummed frame and makes it durable with one `fdatasync`, and only then are the
//! entries' appends acknowledged. Sixty-four rooms appending at once cost one device flush
//! instead of sixty-four, and the journals stay the per-room record that index marks,
//! verification and repair read.
//!
//! A failed write or sync fails every entry of its batch and of every later batch: the log is
//! poisoned and each room's append is in doubt until a restart reconciles. Journals are synced
//! at checkpoints, when a segment fills (and before a journal is cut or set aside), and the
//! checkpointed segment is removed. A start replays every segment into the journals (each
//! entry's bytes at their offset: replaying twice changes nothing), syncs them, and removes
//! the segments, before any journal is opened.

use crate::journal::{Fault, Faults};
use crate::{Result, StoreError};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A segment is checkpointed and replaced once it holds this many bytes.
pub const SEGMENT_BYTES_MAX: u64 = 32 << 20;
/// A batch stops taking entries at this many payload bytes (a single larger entry, up to
/// `journal::APPEND_BYTES_MAX`, still goes alone).
pub const BATCH_BYTES_MAX: usize = 4 << 20;
/// Submitters wait while this many bytes are queued and not yet written.
pub const QUEUED_BYTES_MAX: usize = 64 << 20;
/// The largest frame payload replay accepts: one whole append plus a batch.
const FRAME_PAYLOAD_MAX: usize = crate::journal::APPEND_BYTES_MAX + BATCH_BYTES_MAX;
const MAGIC: &[u8; 4] = b"RCL1";
/// magic, epoch (u64), payload length (u32), SHA-256 of epoch, length and payload.
const HEADER_BYTES: usize = 4 + 8 + 4 + 32;
/// Segments grow in zero-filled steps, so that a frame's fdatasync changes no file size.
const GROWTH_BYTES: u64 = 1 << 20;
const SEGMENT_PREFIX: &str = "segment-";
const SEGMENT_SUFFIX: &str = ".log";

/// How a commit log is opened.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub segment_bytes_max: u64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            segment_bytes_max: SEGMENT_BYTES_MAX,
        }
    }
}

/// What a journal shares with the pipeline: where it is, so that a checkpoint can sync it, and
/// how far its bytes reached the file (`written`) and the disk (`synced`). It holds no
/// descriptor: a closed room's journal waiting for a checkpoint must not keep one open (the
/// daemon bounds its open rooms by its descriptors).
#[derive(Debug)]
pub struct FileSync {
    /// The journal's path relative to the rooms directory, as frames name it.
    rel: String,
    written: AtomicU64,
    synced: AtomicU64,
}

impl FileSync {
    pub(crate) fn new(rel: String, synced: u64) -> FileSync {
        FileSync {
            rel,
            written: AtomicU64::new(synced),
            synced: AtomicU64::new(synced),
        }
    }

    /// Bytes of the file written so far (acknowledged or not).
    pub(crate) fn wrote_to(&self, end: u64) {
        self.written.fetch_max(end, Ordering::SeqCst);
    }

    /// The journal was cut back to `len` (its append failed with nothing written).
    pub(crate) fn cut_back(&self, len: u64) {
        self.written.fetch_min(len, Ordering::SeqCst);
    }

    /// Bytes of the file itself on stable storage (a checkpoint's sync); acknowledged bytes
    /// past it are durable in the commit log.
    pub fn file_synced(&self) -> u64 {
        self.synced.load(Ordering::SeqCst)
    }
}

struct Queued {
    ticket: u64,
    sync: Arc<FileSync>,
    offset: u64,
    bytes: Vec<u8>,
    slot: Arc<Slot>,
}

const WAITING: u8 = 0;
const DURABLE: u8 = 1;
const FAILED: u8 = 2;
/// The batch failed before any of it could be on the disk; the log goes on.
const NOT_WRITTEN: u8 = 4;
/// The oldest waiting entry's submitter writes the next batch.
const LEAD: u8 = 3;

/// Where a submitter waits: woken alone, with its outcome or the lead, so that a batch wakes
/// its own submitters and no others.
#[derive(Debug)]
struct Slot {
    state: AtomicU8,
    thread: std::thread::Thread,
}

impl Slot {
    fn wake(&self, state: u8) {
        self.state.store(state, Ordering::Release);
        self.thread.unpark();
    }
}

struct Shared {
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    /// The last ticket handed out.
    issued: u64,
    /// Every ticket up to this one is durable.
    durable: u64,
    /// A submitter is writing a batch, or has been told to write the next one: whenever
    /// entries wait.
    leading: bool,
    /// Submitters waiting for queued bytes to drain.
    held_back: u32,
    failed: Option<String>,
    /// The latest batch that failed cleanly, why.
    not_written: Option<String>,
    batches: u64,
    entries: u64,
    /// Time leaders spent writing and syncing frames, in microseconds.
    busy_us: u64,
}

/// The segment being written: the leader's alone.
struct Segment {
    file: Arc<File>,
    path: PathBuf,
    epoch: u64,
    len: u64,
    synced: u64,
    allocated: u64,
    /// Journals with entries in this segment: what its checkpoint syncs.
    dirty: HashMap<usize, Arc<FileSync>>,
}

/// Why a batch failed, and whether anything of it can be on the disk.
struct BatchError {
    why: String,
    /// Nothing of the batch landed (or what did was zeroed again): its appends fail with
    /// nothing written and the log goes on.
    clean: bool,
}

impl BatchError {
    fn clean(why: String) -> BatchError {
        BatchError { why, clean: true }
    }
    fn in_doubt(why: String) -> BatchError {
        BatchError { why, clean: false }
    }
}

/// A segment taken out of service: sync its journals, then remove it.
struct Retired {
    path: PathBuf,
    dirty: Vec<Arc<FileSync>>,
}

/// What a start found in the commit log and put back into the journals.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub segments: u64,
    pub frames: u64,
    pub entries: u64,
    /// Journals written and synced.
    pub journals: u64,
    /// Entries naming a journal that is gone (its shard was set aside).
    pub skipped: u64,
    /// Entries whose bytes were not in their journal (a crash took them) and were written.
    pub restored: u64,
    /// Of those, entries whose place held other bytes than zeros (logged).
    pub overwritten: u64,
}

/// Counters for benchmarks and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PipelineStats {
    pub batches: u64,
    pub entries: u64,
    /// Time leaders spent writing and syncing frames (the log's busy time), in microseconds.
    pub busy_us: u64,
    pub queued: usize,
}

/// The daemon-wide commit log (see the module comment).
pub struct CommitLog {
    dir: PathBuf,
    rooms: PathBuf,
    config: PipelineConfig,
    faults: Option<Arc<dyn Faults>>,
    shared: Mutex<Shared>,
    /// Signalled when queued bytes drain, for submitters held back.
    moved: Condvar,
    segment: Mutex<Segment>,
    /// Held while a retired segment is checkpointed: one at a time.
    checkpoint: Mutex<()>,
    /// The journals shared with the pipeline, by relative path: a room closed and reopened
    /// keeps its sync state while a segment still holds its entries.
    files: Mutex<HashMap<String, std::sync::Weak<FileSync>>>,
    _lock: File,
}

impl std::fmt::Debug for CommitLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitLog").field("dir", &self.dir).finish()
    }
}

fn segment_path(dir: &Path, epoch: u64) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}{epoch:016}{SEGMENT_SUFFIX}"))
}

fn poisoned<T>(r: std::sync::LockResult<T>) -> T {
    r.expect("the commit log's locks are never held across a panic")
}

impl CommitLog {
    /// Lock `dir`, replay whatever segments it holds into the journals under `rooms`, and
    /// start a fresh segment.
    pub fn open(
        dir: &Path,
        rooms: &Path,
        config: PipelineConfig,
        faults: Option<Arc<dyn Faults>>,
    ) -> Result<(CommitLog, Replayed)> {
        assert!(config.segment_bytes_max > 0, "a segment holds some bytes");
        std::fs::create_dir_all(dir)?;
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("LOCK"))?;
        if lock.try_lock().is_err() {
            return Err(StoreError::Locked {
                pid: "another commit log of this state dir".into(),
            });
        }
        let (replayed, last_epoch) = replay(dir, rooms)?;
        let segment = Segment::create(dir, last_epoch + 1)?;
        let log = CommitLog {
            dir: dir.to_path_buf(),
            rooms: rooms.to_path_buf(),
            config,
            faults,
            shared: Mutex::new(Shared {
                queue: VecDeque::new(),
                queued_bytes: 0,
                issued: 0,
                durable: 0,
                leading: false,
                held_back: 0,
                failed: None,
                not_written: None,
                batches: 0,
                busy_us: 0,
                entries: 0,
            }),
            moved: Condvar::new(),
            segment: Mutex::new(segment),
            checkpoint: Mutex::new(()),
            files: Mutex::new(HashMap::new()),
            _lock: lock,
        };
        Ok((log, replayed))
    }

    /// Share the journal at `path` (under the rooms directory, durable up to `synced`) with the
    /// pipeline. A journal reopened while a segment still holds its entries gets the same
    /// sync state back.
    pub fn register(&self, path: &Path, synced: u64) -> Result<Arc<FileSync>> {
        let rel = path
            .strip_prefix(&self.rooms)
            .ok()
            .and_then(|p| p.to_str())
            .filter(|p| safe_rel(p))
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "{} is not a journal under {}",
                    path.display(),
                    self.rooms.display()
                ))
            })?;
        let mut files = poisoned(self.files.lock());
        files.retain(|_, w| w.strong_count() > 0);
        if let Some(known) = files.get(rel).and_then(std::sync::Weak::upgrade) {
            return Ok(known);
        }
        let fresh = Arc::new(FileSync::new(rel.to_string(), synced));
        files.insert(rel.to_string(), Arc::downgrade(&fresh));
        Ok(fresh)
    }

    pub fn stats(&self) -> PipelineStats {
        let s = poisoned(self.shared.lock());
        PipelineStats {
            batches: s.batches,
            entries: s.entries,
            busy_us: s.busy_us,
            queued: s.queue.len(),
        }
    }

    /// The segments with bytes that a power cut may still take: (path, synced, written).
    /// The segment and every journal with acknowledged bytes only in the log.
    pub fn unsynced(&self) -> Vec<(PathBuf, u64, u64)> {
        let mut out = {
            let seg = poisoned(self.segment.lock());
            vec![(seg.path.clone(), seg.synced, seg.len)]
        };
        let files = poisoned(self.files.lock());
        for f in files.values().filter_map(std::sync::Weak::upgrade) {
            let (synced, written) = (f.file_synced(), f.written.load(Ordering::SeqCst));
            if written > synced {
                out.push((self.rooms.join(&f.rel), synced, written));
            }
        }
        out.sort();
        out
    }

    /// Make `bytes`, already written at `offset` of `sync`'s journal, durable; returns once
    /// they are (or once their batch failed: `InDoubt`, since its bytes may or may not be on
    /// the disk).
    pub fn commit(&self, sync: &Arc<FileSync>, offset: u64, bytes: Vec<u8>) -> Result<()> {
        let mut s = poisoned(self.shared.lock());
        while s.failed.is_none() && s.queued_bytes > QUEUED_BYTES_MAX {
            s.held_back += 1;
            s = poisoned(self.moved.wait(s));
            s.held_back -= 1;
        }
        if let Some(why) = &s.failed {
            return Err(failed_earlier(why));
        }
        s.issued += 1;
        let slot = Arc::new(Slot {
            state: AtomicU8::new(WAITING),
            thread: std::thread::current(),
        });
        s.queued_bytes += bytes.len();
        let ticket = s.issued;
        s.queue.push_back(Queued {
            ticket,
            sync: sync.clone(),
            offset,
            bytes,
            slot: slot.clone(),
        });
        // No leader means an empty queue (a leader hands over while entries wait): this entry
        // is the only one, and its submitter leads.
        let lead = !s.leading;
        s.leading = true;
        drop(s);
        if !lead {
            // woken with an outcome, or told to lead the next batch (which starts with this
            // entry: the oldest waiting)
            loop {
                match slot.state.load(Ordering::Acquire) {
                    WAITING => std::thread::park(),
                    DURABLE => return Ok(()),
                    FAILED => return Err(self.failure()),
                    NOT_WRITTEN => return Err(self.not_written()),
                    _ => break,
                }
            }
        }
        self.lead(&slot)
    }

    /// Why an entry's batch was not written (the latest such failure; nothing of it landed).
    fn not_written(&self) -> StoreError {
        let s = poisoned(self.shared.lock());
        StoreError::Io(std::io::Error::other(format!(
            "the commit log's batch was not written: {}",
            s.not_written.as_deref().unwrap_or("unknown")
        )))
    }

    /// Why an entry failed: the log's failure.
    fn failure(&self) -> StoreError {
        let s = poisoned(self.shared.lock());
        StoreError::InDoubt(format!(
            "the commit log's batch failed: {}",
            s.failed.as_deref().unwrap_or("unknown")
        ))
    }

    /// Write one batch as the leader (it holds the submitter's own entry, the oldest waiting),
    /// wake its entries, and hand over to the oldest entry still waiting.
    fn lead(&self, own: &Arc<Slot>) -> Result<()> {
        let mut s = poisoned(self.shared.lock());
        assert!(s.leading, "a leader holds the lead");
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(q) = s.queue.front() {
            if !batch.is_empty() && bytes + q.bytes.len() > BATCH_BYTES_MAX {
                break;
            }
            let q = s.queue.pop_front().expect("the front entry is there");
            bytes += q.bytes.len();
            batch.push(q);
        }
        s.queued_bytes -= bytes;
        assert!(
            batch.first().is_some_and(|q| Arc::ptr_eq(&q.slot, own)),
            "a leader's batch starts with its own entry"
        );
        if s.held_back > 0 {
            self.moved.notify_all();
        }
        drop(s);
        let started = std::time::Instant::now();
        let written = self.write_batch(&batch);
        let mut s = poisoned(self.shared.lock());
        s.busy_us += started.elapsed().as_micros() as u64;
        let (retired, outcome) = match written {
            Ok(retired) => {
                let last = batch
                    .last()
                    .expect("a batch holds its leader's entry")
                    .ticket;
                assert!(last > s.durable, "batches are durable in ticket order");
                s.durable = last;
                s.batches += 1;
                s.entries += batch.len() as u64;
                (retired, DURABLE)
            }
            Err(e) if e.clean => {
                tracing::warn!(
                    "a commit log batch failed, nothing of it was written: {}",
                    e.why
                );
                s.not_written = Some(e.why);
                (None, NOT_WRITTEN)
            }
            Err(e) => {
                tracing::error!(
                    "commit log failed, every append from here is in doubt: {}",
                    e.why
                );
                s.failed.get_or_insert(e.why);
                (None, FAILED)
            }
        };
        if s.failed.is_some() {
            // nothing after a failed batch is acknowledged
            for q in s.queue.drain(..) {
                q.slot.wake(FAILED);
            }
            s.queued_bytes = 0;
        }
        // The next leader first: woken after this batch's entries it would wait in the run
        // queue behind all of them, the log idle while they work, and then the CPU idle while
        // it syncs what they queued meanwhile.
        match s.queue.front() {
            Some(next) => next.slot.wake(LEAD),
            None => s.leading = false,
        }
        if s.held_back > 0 {
            self.moved.notify_all();
        }
        drop(s);
        // each entry's outcome is its own slot's: no lock needed to tell it
        for q in &batch[1..] {
            q.slot.wake(outcome);
        }
        if let Some(r) = retired
            && let Err(e) = self.checkpoint_retired(r)
        {
            tracing::error!("commit log checkpoint failed, the log stops: {e}");
            let mut s = poisoned(self.shared.lock());
            s.failed.get_or_insert(e);
        }
        match outcome {
            DURABLE => Ok(()),
            NOT_WRITTEN => Err(self.not_written()),
            _ => Err(self.failure()),
        }
    }

    /// Write `batch` as one frame at the segment's end and sync it; retire the segment when it
    /// is full and no checkpoint runs.
    fn write_batch(&self, batch: &[Queued]) -> std::result::Result<Option<Retired>, BatchError> {
        let mut seg = poisoned(self.segment.lock());
        let frame = encode_frame(seg.epoch, batch);
        let fault = self
            .faults
            .as_ref()
            .and_then(|f| f.on_log_write(&seg.path, frame.len()));
        let at = seg.len;
        // nothing of the frame is written yet: a failure here fails the batch cleanly
        seg.grow_to(at + frame.len() as u64)
            .map_err(|e| BatchError::clean(format!("growing {}: {e}", seg.path.display())))?;
        let written = match fault {
            Some(Fault::WriteError(kind)) => {
                Err(std::io::Error::new(kind, "injected write failure"))
            }
            Some(Fault::ShortWrite(n)) => seg
                .file
                .write_all_at(&frame[..n.min(frame.len())], at)
                .and_then(|()| Err(std::io::Error::other("injected short write"))),
            _ => seg.file.write_all_at(&frame, at),
        };
        if let Err(e) = written {
            // nothing of this batch was synced: zeros over whatever landed make the place free
            // space again, and the log goes on; if even that fails its state is unknown
            let why = format!("writing {}: {e}", seg.path.display());
            if seg.file.write_all_at(&vec![0u8; frame.len()], at).is_ok() {
                return Err(BatchError::clean(why));
            }
            seg.len = at + frame.len() as u64;
            return Err(BatchError::in_doubt(why));
        }
        // from here the bytes may be anywhere between absent and whole: the length covers
        // them all, so a crash model sees them as unsynced
        seg.len = at + frame.len() as u64;
        let synced = match fault {
            Some(Fault::SyncError) => Err(std::io::Error::other("injected fsync failure")),
            Some(Fault::CrashAfterWrite) => {
                Err(std::io::Error::other("injected crash before fsync"))
            }
            Some(Fault::SkipSync) => Ok(()),
            _ => seg.file.sync_data(),
        };
        synced
            .map_err(|e| BatchError::in_doubt(format!("fdatasync {}: {e}", seg.path.display())))?;
        if fault != Some(Fault::SkipSync) {
            seg.synced = seg.len;
        }
        for q in batch {
            seg.dirty
                .entry(Arc::as_ptr(&q.sync) as usize)
                .or_insert_with(|| q.sync.clone());
        }
        if seg.len < self.config.segment_bytes_max {
            return Ok(None);
        }
        // a checkpoint still running: this segment grows on and retires after it
        let Ok(_running) = self.checkpoint.try_lock() else {
            return Ok(None);
        };
        self.retire(&mut seg)
            .map(Some)
            .map_err(BatchError::in_doubt)
    }

    /// Replace the segment with a fresh one; the old one is the caller's to checkpoint.
    fn retire(&self, seg: &mut Segment) -> std::result::Result<Retired, String> {
        let fresh = Segment::create(&self.dir, seg.epoch + 1)
            .map_err(|e| format!("starting segment {}: {e}", seg.epoch + 1))?;
        let old = std::mem::replace(seg, fresh);
        Ok(Retired {
            path: old.path,
            dirty: old.dirty.into_values().collect(),
        })
    }

    /// Sync every journal with entries in `r`, then remove it.
    fn checkpoint_retired(&self, r: Retired) -> std::result::Result<(), String> {
        let _one = poisoned(self.checkpoint.lock());
        for j in &r.dirty {
            let reached = j.written.load(Ordering::SeqCst);
            // any descriptor of the file syncs its data (Linux syncs the inode's pages)
            match File::open(self.rooms.join(&j.rel)) {
                Ok(f) => f
                    .sync_data()
                    .map_err(|e| format!("checkpoint fdatasync of {}: {e}", j.rel))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    tracing::warn!(
                        journal = j.rel,
                        "a journal with entries in the commit log is gone"
                    );
                }
                Err(e) => return Err(format!("checkpoint open of {}: {e}", j.rel)),
            }
            j.synced.fetch_max(reached, Ordering::SeqCst);
        }
        std::fs::remove_file(&r.path)
            .and_then(|()| crate::fs::sync_dir(&self.dir))
            .map_err(|e| format!("removing {}: {e}", r.path.display()))
    }

    /// Checkpoint everything written so far: every journal is synced and no segment holds an
    /// entry from before this call. Before a journal is cut or set aside, so that no replay
    /// writes into it what the cut removed.
    pub fn checkpoint_now(&self) -> Result<()> {
        let retired = {
            let _running = poisoned(self.checkpoint.lock());
            let mut seg = poisoned(self.segment.lock());
            self.retire(&mut seg).map_err(StoreError::Corrupt)?
        };
        // earlier retired segments are gone: their checkpoint held the lock until done
        self.checkpoint_retired(retired).map_err(|e| {
            let mut s = poisoned(self.shared.lock());
            s.failed.get_or_insert(e.clone());
            self.moved.notify_all();
            StoreError::Corrupt(e)
        })
    }
}

fn failed_earlier(why: &str) -> StoreError {
    StoreError::InDoubt(format!(
        "the commit log failed earlier ({why}); restart the daemon to reconcile"
    ))
}

impl Segment {
    fn create(dir: &Path, epoch: u64) -> Result<Segment> {
        let path = segment_path(dir, epoch);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        crate::fs::sync_dir(dir)?;
        Ok(Segment {
            file: Arc::new(file),
            path,
            epoch,
            len: 0,
            synced: 0,
            allocated: 0,
            dirty: HashMap::new(),
        })
    }

    fn grow_to(&mut self, end: u64) -> std::io::Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let target = end.div_ceil(GROWTH_BYTES) * GROWTH_BYTES;
        let zeros = vec![0u8; 64 * 1024];
        let mut at = self.allocated.max(self.len);
        while at < target {
            let n = ((target - at) as usize).min(zeros.len());
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        self.allocated = target;
        Ok(())
    }
}

/// A journal path relative to the rooms directory: plain names only.
fn safe_rel(rel: &str) -> bool {
    !rel.is_empty()
        && Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn frame_hash(epoch: u64, payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(epoch.to_le_bytes());
    h.update((payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize().into()
}

/// Each entry: path length (u16), path, offset (u64), byte count (u32), bytes.
fn encode_frame(epoch: u64, batch: &[Queued]) -> Vec<u8> {
    let payload_len: usize = batch
        .iter()
        .map(|q| 2 + q.sync.rel.len() + 8 + 4 + q.bytes.len())
        .sum();
    let mut payload = Vec::with_capacity(payload_len);
    for q in batch {
        let rel = q.sync.rel.as_bytes();
        payload.extend_from_slice(
            &u16::try_from(rel.len())
                .expect("a journal's relative path is short")
                .to_le_bytes(),
        );
        payload.extend_from_slice(rel);
        payload.extend_from_slice(&q.offset.to_le_bytes());
        payload.extend_from_slice(
            &u32::try_from(q.bytes.len())
                .expect("an append is at most APPEND_BYTES_MAX")
                .to_le_bytes(),
        );
        payload.extend_from_slice(&q.bytes);
    }
    assert!(payload.len() <= FRAME_PAYLOAD_MAX, "a batch fits a frame");
    let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&epoch.to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&frame_hash(epoch, &payload));
    frame.extend_from_slice(&payload);
    frame
}

/// One entry of a frame: a journal, an offset and the bytes that belong there.
struct Entry<'a> {
    rel: &'a str,
    offset: u64,
    bytes: &'a [u8],
}

fn decode_payload(payload: &[u8]) -> std::result::Result<Vec<Entry<'_>>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> std::result::Result<&[u8], String> {
        let end = at
            .checked_add(n)
            .filter(|e| *e <= payload.len())
            .ok_or_else(|| format!("entry overruns the frame at byte {at}"))?;
        let s = &payload[*at..end];
        *at = end;
        Ok(s)
    };
    while at < payload.len() {
        let n = u16::from_le_bytes(take(&mut at, 2)?.try_into().expect("2 bytes")) as usize;
        let rel = std::str::from_utf8(take(&mut at, n)?)
            .map_err(|_| "a journal path is not UTF-8".to_string())?;
        if !safe_rel(rel) {
            return Err(format!("journal path {rel:?} leaves the rooms directory"));
        }
        let offset = u64::from_le_bytes(take(&mut at, 8)?.try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(take(&mut at, 4)?.try_into().expect("4 bytes")) as usize;
        let bytes = take(&mut at, len)?;
        out.push(Entry { rel, offset, bytes });
    }
    Ok(out)
}

/// Whether `dir` holds a segment with a frame in it (a log an unclean stop left, or a running
/// daemon's); a clean stop leaves only an empty one.
pub fn holds_segments(dir: &Path) -> bool {
    let first_byte = |p: &PathBuf| -> Option<u8> {
        let mut b = [0u8; 1];
        let f = File::open(p).ok()?;
        (f.read_at(&mut b, 0).ok()? == 1).then_some(b[0])
    };
    segments(dir).is_ok_and(|s| s.iter().any(|(_, p)| first_byte(p).is_some_and(|b| b != 0)))
}

/// The segments in `dir`, oldest first.
fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(epoch) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SEGMENT_PREFIX))
            .and_then(|n| n.strip_suffix(SEGMENT_SUFFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((epoch, e.path()));
    }
    out.sort();
    Ok(out)
}

/// Replay every segment into the journals, sync them, remove the segments; the last epoch
/// seen (0 when none).
fn replay(dir: &Path, rooms: &Path) -> Result<(Replayed, u64)> {
    let segs = segments(dir)?;
    let mut report = Replayed::default();
    let mut files: HashMap<String, Option<File>> = HashMap::new();
    let mut last_epoch = 0;
    for (epoch, path) in &segs {
        last_epoch = *epoch;
        report.segments += 1;
        let bytes = std::fs::read(path)?;
        let mut at = 0usize;
        while let Some((payload, next)) = frame_at(&bytes, at, *epoch, path) {
            let entries = decode_payload(payload).map_err(|e| {
                StoreError::Corrupt(format!("{} frame at byte {at}: {e}", path.display()))
            })?;
            for e in entries {
                report.entries += 1;
                let file = match files.get(e.rel) {
                    Some(f) => f,
                    None => {
                        let f = open_journal(&rooms.join(e.rel))?;
                        files.entry(e.rel.to_string()).or_insert(f)
                    }
                };
                match file {
                    Some(f) => restore(f, &e, &mut report)?,
                    None => report.skipped += 1,
                }
            }
            report.frames += 1;
            at = next;
        }
    }
    for f in files.values().flatten() {
        f.sync_data()?;
        report.journals += 1;
    }
    for (_, path) in &segs {
        std::fs::remove_file(path)?;
    }
    if !segs.is_empty() {
        crate::fs::sync_dir(dir)?;
        tracing::info!(?report, "commit log replayed into the journals");
    }
    Ok((report, last_epoch))
}

/// Put an entry's bytes back where they belong, if they are not there: a crash lost them
/// (zeros, or a file cut short), or something changed them after they were acknowledged
/// (logged: the log's checksummed copy wins).
fn restore(f: &File, e: &Entry<'_>, report: &mut Replayed) -> Result<()> {
    let mut there = vec![0u8; e.bytes.len()];
    let mut got = 0;
    while got < there.len() {
        match f.read_at(&mut there[got..], e.offset + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    if got == there.len() && there == e.bytes {
        return Ok(());
    }
    if there[..got].iter().any(|b| *b != 0) {
        report.overwritten += 1;
        tracing::warn!(
            journal = e.rel,
            offset = e.offset,
            "acknowledged journal bytes differed from the commit log's copy; restored them"
        );
    }
    f.write_all_at(e.bytes, e.offset)?;
    report.restored += 1;
    Ok(())
}

/// A journal to replay into, or `None` when it is gone.
fn open_journal(path: &Path) -> Result<Option<File>> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(path = %path.display(), "the commit log names a journal that is gone; its entries are skipped");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// The payload of the whole frame at `at` and where the next one starts; `None` at free space
/// or at a frame a crash tore (never acknowledged: every frame before it was synced first).
fn frame_at<'a>(bytes: &'a [u8], at: usize, epoch: u64, path: &Path) -> Option<(&'a [u8], usize)> {
    let header = bytes.get(at..at + HEADER_BYTES)?;
    if header.iter().all(|b| *b == 0) {
        return None;
    }
    let torn = |why: &str| {
        tracing::warn!(path = %path.display(), offset = at, "commit log ends in a torn frame: {why}");
        None
    };
    if &header[..4] != MAGIC {
        return torn("no frame magic");
    }
    let e = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
    let n = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as usize;
    if e != epoch || n > FRAME_PAYLOAD_MAX {
        return torn("a header of another segment or an impossible length");
    }
    let Some(payload) = bytes.get(at + HEADER_BYTES..at + HEADER_BYTES + n) else {
        return torn("the payload is cut short");
    };
    if frame_hash(epoch, payload)[..] != header[16..48] {
        return torn("the checksum does not match");
    }
    Some((payload, at + HEADER_BYTES + n))
}

#[cfg(test)]
mod tests;

impl Drop for CommitLog {
    fn drop(&mut self) {
        let s = self.stats();
        tracing::debug!(
            batches = s.batches,
            entries = s.entries,
            "commit log closed"
        );
    }
}
