//! The commit log alone: batches, failures, checkpoints and replay.

use super::*;

struct Dirs {
    _t: tempfile::TempDir,
    commit: PathBuf,
    rooms: PathBuf,
}

fn dirs() -> Dirs {
    let t = tempfile::tempdir().unwrap();
    let commit = t.path().join("commit");
    let rooms = t.path().join("rooms");
    std::fs::create_dir_all(rooms.join("a")).unwrap();
    std::fs::create_dir_all(rooms.join("b")).unwrap();
    Dirs {
        _t: t,
        commit,
        rooms,
    }
}

fn open(
    d: &Dirs,
    cfg: PipelineConfig,
    faults: Option<Arc<dyn Faults>>,
) -> Result<(CommitLog, Replayed)> {
    CommitLog::open(&d.commit, &d.rooms, cfg, faults)
}

fn journal(d: &Dirs, log: &CommitLog, name: &str) -> Arc<FileSync> {
    let path = d.rooms.join(name).join("EVENTS.jsonl");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .unwrap();
    drop(f);
    log.register(&path, 0).unwrap()
}

/// Write `bytes` at `offset` of the journal, as a journal append does, then commit them.
fn append(log: &CommitLog, j: &Arc<FileSync>, offset: u64, bytes: &[u8]) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(log.rooms.join(&j.rel))
        .unwrap();
    f.write_all_at(bytes, offset).unwrap();
    j.wrote_to(offset + bytes.len() as u64);
    log.commit(j, offset, bytes.to_vec())
}

fn read(d: &Dirs, name: &str) -> Vec<u8> {
    std::fs::read(d.rooms.join(name).join("EVENTS.jsonl")).unwrap()
}

#[test]
fn a_replay_puts_acknowledged_bytes_back_and_removes_the_segments() {
    let d = dirs();
    let (log, r) = open(&d, PipelineConfig::default(), None).unwrap();
    assert_eq!(r, Replayed::default());
    let a = journal(&d, &log, "a");
    let b = journal(&d, &log, "b");
    append(&log, &a, 0, b"one\n").unwrap();
    append(&log, &b, 0, b"uno\n").unwrap();
    append(&log, &a, 4, b"two\n").unwrap();
    assert_eq!(log.stats().entries, 3);
    // a power cut that kept none of the journals' unsynced bytes
    for (path, synced, _) in log.unsynced() {
        if path.starts_with(&d.rooms) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(synced)
                .unwrap();
        }
    }
    assert!(read(&d, "a").is_empty());
    drop((a, b, log));
    let (log, r) = open(&d, PipelineConfig::default(), None).unwrap();
    assert_eq!((r.segments, r.entries, r.journals, r.skipped), (1, 3, 2, 0));
    assert_eq!((r.restored, r.overwritten), (3, 0));
    assert_eq!(read(&d, "a"), b"one\ntwo\n");
    assert_eq!(read(&d, "b"), b"uno\n");
    assert_eq!(
        segments(&d.commit).unwrap().len(),
        1,
        "only the fresh segment"
    );
    drop(log);
    // replaying an empty log changes nothing
    let (_, r) = open(&d, PipelineConfig::default(), None).unwrap();
    assert_eq!(r.entries, 0);
    assert_eq!(read(&d, "a"), b"one\ntwo\n");
}

#[test]
fn a_replay_writes_only_what_differs_and_counts_changed_bytes() {
    let d = dirs();
    let (log, _) = open(&d, PipelineConfig::default(), None).unwrap();
    let a = journal(&d, &log, "a");
    append(&log, &a, 0, b"one\n").unwrap();
    append(&log, &a, 4, b"two\n").unwrap();
    drop((a, log));
    // the first entry intact, the second changed after its acknowledgement
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.rooms.join("a/EVENTS.jsonl"))
        .unwrap();
    f.write_all_at(b"X", 5).unwrap();
    let (_, r) = open(&d, PipelineConfig::default(), None).unwrap();
    assert_eq!((r.entries, r.restored, r.overwritten), (2, 1, 1));
    assert_eq!(read(&d, "a"), b"one\ntwo\n");
}

#[test]
fn an_entry_for_a_journal_that_is_gone_is_skipped() {
    let d = dirs();
    let (log, _) = open(&d, PipelineConfig::default(), None).unwrap();
    let a = journal(&d, &log, "a");
    append(&log, &a, 0, b"one\n").unwrap();
    drop((a, log));
    std::fs::remove_dir_all(d.rooms.join("a")).unwrap();
    let (_, r) = open(&d, PipelineConfig::default(), None).unwrap();
    assert_eq!((r.entries, r.skipped, r.journals), (1, 1, 0));
    assert!(!d.rooms.join("a").exists(), "nothing is created for it");
}

#[test]
fn a_second_log_of_the_same_directory_is_refused() {
    let d = dirs();
    let (_log, _) = open(&d, PipelineConfig::default(), None).unwrap();
    let second = open(&d, PipelineConfig::default(), None);
    assert!(matches!(second, Err(StoreError::Locked { .. })));
}

#[test]
fn a_torn_last_frame_is_not_replayed_and_the_frames_before_it_are() {
    let d = dirs();
    let (log, _) = open(&d, PipelineConfig::default(), None).unwrap();
    let a = journal(&d, &log, "a");
    append(&log, &a, 0, b"one\n").unwrap();
    let (seg, _, end1) = log.unsynced()[0].clone();
    append(&log, &a, 4, b"two\n").unwrap();
    let end2 = log.unsynced()[0].2;
    assert!(end1 < end2);
    drop((a, log));
    // the second frame loses its last byte; the journal lost everything
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0], end2 - 1).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.rooms.join("a/EVENTS.jsonl"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let (_, r) = open(&d, PipelineConfig::default(), None).unwrap();
    assert_eq!((r.frames, r.entries), (1, 1));
    assert_eq!(read(&d, "a"), b"one\n");
}

#[test]
fn a_path_that_leaves_the_rooms_directory_is_refused_at_register_and_at_replay() {
    let d = dirs();
    let (log, _) = open(&d, PipelineConfig::default(), None).unwrap();
    let outside = d.commit.join("x");
    File::create(&outside).unwrap();
    assert!(log.register(&outside, 0).is_err());
    assert!(log.register(&d.rooms.join("../x"), 0).is_err());
    let (seg, _, _) = log.unsynced()[0].clone();
    drop(log);
    // a frame naming ../x, checksummed as if it were real
    let bad = Queued {
        ticket: 1,
        sync: Arc::new(FileSync::new("../x".into(), 0)),
        offset: 0,
        bytes: b"evil".to_vec(),
        slot: Arc::new(Slot {
            state: AtomicU8::new(WAITING),
            thread: std::thread::current(),
        }),
    };
    let epoch = segments(&d.commit).unwrap()[0].0;
    std::fs::write(&seg, encode_frame(epoch, &[bad])).unwrap();
    let err = open(&d, PipelineConfig::default(), None).unwrap_err();
    assert!(
        err.to_string().contains("leaves the rooms directory"),
        "{err}"
    );
    assert!(
        std::fs::read(&outside).unwrap().is_empty(),
        "nothing written outside"
    );
    assert!(seg.exists(), "a log that cannot be replayed is kept");
}

#[test]
fn a_full_segment_is_checkpointed_its_journals_synced_and_removed() {
    let d = dirs();
    let cfg = PipelineConfig {
        segment_bytes_max: 256,
    };
    let (log, _) = open(&d, cfg, None).unwrap();
    let a = journal(&d, &log, "a");
    let line = vec![b'x'; 99];
    let mut at = 0;
    for _ in 0..5 {
        append(&log, &a, at, &line).unwrap();
        at += line.len() as u64;
    }
    let segs = segments(&d.commit).unwrap();
    assert_eq!(segs.len(), 1, "retired segments are removed: {segs:?}");
    assert!(segs[0].0 > 1, "the log moved on to a later segment");
    assert!(
        a.file_synced() >= 2 * 99,
        "the checkpoint synced the journal"
    );
    log.checkpoint_now().unwrap();
    assert_eq!(a.file_synced(), 5 * 99);
    assert_eq!(
        log.unsynced().len(),
        1,
        "no journal holds bytes only the log has"
    );
}

/// Holds the first batch inside its write until `queued` more entries wait behind it, then
/// fails the batch after it.
#[derive(Debug)]
struct HoldThenFail {
    log: Mutex<Option<Arc<CommitLog>>>,
    queued: usize,
    writes: AtomicU64,
}

impl Faults for HoldThenFail {
    fn on_append(&self, _: &Path, _: usize) -> Option<Fault> {
        None
    }
    fn on_log_write(&self, _: &Path, _: usize) -> Option<Fault> {
        match self.writes.fetch_add(1, Ordering::SeqCst) {
            0 => {
                let log = self.log.lock().unwrap().clone().unwrap();
                while log.stats().queued < self.queued {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                None
            }
            1 => Some(Fault::SyncError),
            _ => None,
        }
    }
}

#[test]
fn a_batch_whose_sync_failed_acknowledges_none_of_its_entries_nor_any_later_one() {
    let d = dirs();
    let faults = Arc::new(HoldThenFail {
        log: Mutex::new(None),
        queued: 3,
        writes: AtomicU64::new(0),
    });
    let (log, _) = open(&d, PipelineConfig::default(), Some(faults.clone())).unwrap();
    let log = Arc::new(log);
    *faults.log.lock().unwrap() = Some(log.clone());
    let a = journal(&d, &log, "a");
    let first = {
        let (log, a) = (log.clone(), a.clone());
        std::thread::spawn(move || append(&log, &a, 0, b"first\n"))
    };
    // the first append is being written: the others queue behind it, one batch
    while faults.writes.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let b = journal(&d, &log, "b");
    let others: Vec<_> = (0..3u64)
        .map(|i| {
            let (log, b) = (log.clone(), b.clone());
            std::thread::spawn(move || append(&log, &b, i * 8, b"queued.\n"))
        })
        .collect();
    assert!(first.join().unwrap().is_ok(), "the held batch was synced");
    for t in others {
        let out = t.join().unwrap();
        assert!(
            matches!(out, Err(StoreError::InDoubt(_))),
            "an entry of the failed batch is in doubt, never acknowledged: {out:?}"
        );
    }
    assert_eq!(
        faults.writes.load(Ordering::SeqCst),
        2,
        "the three shared one batch"
    );
    assert_eq!(log.stats().batches, 1, "one batch acknowledged, one failed");
    let later = append(&log, &a, 6, b"later\n");
    assert!(matches!(later, Err(StoreError::InDoubt(_))), "{later:?}");
}

#[test]
fn a_journal_waiting_for_a_checkpoint_holds_no_descriptor() {
    let d = dirs();
    let (log, _) = open(&d, PipelineConfig::default(), None).unwrap();
    let a = journal(&d, &log, "a");
    append(&log, &a, 0, b"one\n").unwrap();
    let path = std::fs::canonicalize(d.rooms.join("a/EVENTS.jsonl")).unwrap();
    let held = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .filter(|l| *l == path)
        .count();
    assert_eq!(held, 0, "the pipeline keeps no descriptor of a journal");
    assert_eq!(
        log.unsynced().len(),
        2,
        "yet it knows the journal is unsynced"
    );
    log.checkpoint_now().unwrap();
    assert_eq!(a.file_synced(), 4);
}

/// Fails the first batch's write (after `landed` bytes of it), then lets every batch through.
#[derive(Debug)]
struct FailFirstWrite {
    landed: Option<usize>,
    writes: AtomicU64,
}

impl Faults for FailFirstWrite {
    fn on_append(&self, _: &Path, _: usize) -> Option<Fault> {
        None
    }
    fn on_log_write(&self, _: &Path, _: usize) -> Option<Fault> {
        let fault = match self.landed {
            Some(n) => Fault::ShortWrite(n),
            None => Fault::WriteError(std::io::ErrorKind::StorageFull),
        };
        (self.writes.fetch_add(1, Ordering::SeqCst) == 0).then_some(fault)
    }
}

#[test]
fn a_batch_whose_write_failed_is_not_written_and_the_log_goes_on() {
    for landed in [None, Some(30)] {
        let d = dirs();
        let faults = Arc::new(FailFirstWrite {
            landed,
            writes: AtomicU64::new(0),
        });
        let (log, _) = open(&d, PipelineConfig::default(), Some(faults)).unwrap();
        let a = journal(&d, &log, "a");
        let refused = append(&log, &a, 0, b"lost\n");
        assert!(
            matches!(refused, Err(StoreError::Io(_))),
            "nothing written, not in doubt: {refused:?}"
        );
        // the journal cuts itself back; the next append goes where the failed one would have
        std::fs::OpenOptions::new()
            .write(true)
            .open(d.rooms.join("a/EVENTS.jsonl"))
            .unwrap()
            .set_len(0)
            .unwrap();
        a.cut_back(0);
        append(&log, &a, 0, b"kept\n").unwrap();
        drop((a, log));
        std::fs::OpenOptions::new()
            .write(true)
            .open(d.rooms.join("a/EVENTS.jsonl"))
            .unwrap()
            .set_len(0)
            .unwrap();
        let (_, r) = open(&d, PipelineConfig::default(), None).unwrap();
        assert_eq!((r.frames, r.entries), (1, 1), "{landed:?}");
        assert_eq!(read(&d, "a"), b"kept\n");
    }
}
