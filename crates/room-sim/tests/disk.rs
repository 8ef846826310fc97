//! The simulated disk under SQLite keeps what was synced and only that: a commit SQLite
//! fsynced survives every crash, a commit it did not fsync can vanish, and a failed fsync loses
//! its writes at the next crash although SQLite read them back until then.

use room_sim::disk::{DiskFaults, Mount, VFS_NAME};
use room_store::RoomIndex;
use room_store::index::{CheckpointRow, Index, SqliteConfig};
use room_store::journal::Fault;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct OneFault(Mutex<Option<Fault>>);

impl DiskFaults for OneFault {
    fn on_write(&self, _path: &Path) -> Option<Fault> {
        None
    }
    fn on_sync(&self, _path: &Path) -> Option<Fault> {
        self.0.lock().unwrap().take()
    }
}

fn open(path: &Path, synchronous: &str) -> Connection {
    let c = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), VFS_NAME).unwrap();
    let _: String = c
        .pragma_update_and_check(None, "locking_mode", "EXCLUSIVE", |r| r.get(0))
        .unwrap();
    let _: String = c
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .unwrap();
    c.pragma_update(None, "synchronous", synchronous).unwrap();
    c
}

fn rows(path: &Path) -> i64 {
    let c = open(path, "FULL");
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap()
}

/// Write `n` committed rows, crash, restart with `pick` as the crash's dice.
fn commit_then_crash(synchronous: &str, fault: Option<Fault>, pick: u64) -> (i64, bool) {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(OneFault::default());
    let mount = Mount::new(tmp.path(), faults.clone(), false);
    let db = tmp.path().join("t.db");
    {
        let c = open(&db, "FULL");
        c.execute_batch("CREATE TABLE t (v INTEGER)").unwrap();
    }
    let c = open(&db, synchronous);
    *faults.0.lock().unwrap() = fault;
    let mut failed = false;
    for v in 0..10 {
        if c.execute("INSERT INTO t VALUES (?1)", [v]).is_err() {
            failed = true;
        }
    }
    mount.crash();
    drop(c);
    mount.restart(&mut |n| pick % n.max(1)).unwrap();
    (rows(&db), failed)
}

#[test]
fn fsynced_commits_survive_every_crash() {
    for pick in 0..8 {
        assert_eq!(
            commit_then_crash("FULL", None, pick),
            (10, false),
            "dice {pick}"
        );
    }
}

#[test]
fn unsynced_commits_can_vanish_at_a_crash() {
    // dice 0: the crash loses every unsynced write
    let (n, failed) = commit_then_crash("OFF", None, 0);
    assert!(!failed);
    assert_eq!(n, 0, "commits SQLite never fsynced are gone");
}

#[test]
fn a_failed_fsync_loses_its_writes_at_the_next_crash() {
    let (n, failed) = commit_then_crash("FULL", Some(Fault::SyncError), 1);
    assert!(failed, "SQLite reports the failed fsync");
    // the first commit's fsync failed; the nine after it were fsynced and survive
    assert_eq!(n, 9);
}

/// A sync index on a simulated disk, and the crash that loses every unsynced write.
struct IndexOnDisk {
    _tmp: tempfile::TempDir,
    mount: Mount,
    db: std::path::PathBuf,
    cfg: SqliteConfig,
}

impl IndexOnDisk {
    fn new() -> IndexOnDisk {
        let tmp = tempfile::tempdir().unwrap();
        let mount = Mount::new(tmp.path(), Arc::new(OneFault::default()), false);
        IndexOnDisk {
            db: tmp.path().join("sync_index.db"),
            cfg: SqliteConfig {
                vfs: Some(VFS_NAME.to_string()),
                ..SqliteConfig::default()
            },
            _tmp: tmp,
            mount,
        }
    }

    fn open(&self) -> Index {
        Index::open_with(&self.db, &self.cfg).unwrap()
    }

    fn crash_and_reopen(&self, idx: Index) -> Index {
        self.mount.crash();
        drop(idx);
        self.mount.restart(&mut |_| 0).unwrap();
        self.open()
    }
}

fn checkpoint_at(confirmed_seq: u64) -> CheckpointRow {
    CheckpointRow {
        actor: "a".into(),
        conversation: "c".into(),
        conversation_key: "k".into(),
        view_gen: "v".into(),
        confirmed_seq,
        chunk_seq: None,
        chunk_offset: 0,
        updated_ms: 1,
    }
}

/// The sync index fsyncs only what the journal cannot re-create: a confirmation's checkpoint
/// survives a crash that loses every unsynced write, a projection-only commit after it does not
/// (and one before it rides its fsync).
#[test]
fn the_index_fsyncs_confirmations_and_lets_projection_commits_trail() {
    let disk = IndexOnDisk::new();
    let mut idx = disk.open();
    idx.set_wakes_mark(5).unwrap();
    idx.put_checkpoint(&checkpoint_at(7)).unwrap();
    idx.set_wakes_mark(9).unwrap();
    assert_eq!(idx.wakes_mark().unwrap(), 9);
    let idx = disk.crash_and_reopen(idx);
    assert_eq!(
        idx.checkpoint("a", "c").unwrap().map(|c| c.confirmed_seq),
        Some(7)
    );
    assert_eq!(idx.wakes_mark().unwrap(), 5);
}

/// A durable commit whose rows are unchanged still fsyncs (SQLite would write nothing for it),
/// so what was committed before it is covered.
#[test]
fn a_durable_commit_of_unchanged_rows_still_syncs_what_came_before() {
    let disk = IndexOnDisk::new();
    let mut idx = disk.open();
    idx.put_checkpoint(&checkpoint_at(7)).unwrap();
    idx.set_wakes_mark(9).unwrap();
    idx.put_checkpoint(&checkpoint_at(7)).unwrap();
    let idx = disk.crash_and_reopen(idx);
    assert_eq!(idx.wakes_mark().unwrap(), 9);
}
