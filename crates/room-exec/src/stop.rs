//! The two-phase stop outbox (`room-owned-stop-v1`): the files that make a stop of a worker's
//! owned job survive a crash in the right order.
//!
//! Before anything about a stop is committed to a journal, `stops/<id>/phase-1.json`
//! (`termination_confirmed: false` and a bounded pending reason) is written and made durable.
//! Only after zero processes were observed in the job is `phase-2.json` written
//! (`termination_confirmed: true`, naming phase 1's exact event id and envelope digest). Each
//! phase's record is committed after its file, and `phase-N.committed.json` says it was. At
//! start, [`Outbox::pending`] lists what a crash left between those steps, in causal order,
//! for the daemon to commit. Phase 2 cannot be written without its phase 1 on disk, and this
//! module never writes one on its own: it takes the zero-process observation from the caller,
//! who has the kernel's word for it.

use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const STOP_SCHEMA: &str = "room-owned-stop-v1";
/// Largest phase file read back.
pub const PHASE_BYTES_MAX: u64 = 64 * 1024;
/// Stops one start replays at most (the rest wait for the next).
pub const STOPS_REPLAY_MAX: usize = 4_096;

/// The outbox under a state directory's `stops/`.
#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
}

/// What one stop's directory holds.
#[derive(Debug, Clone, PartialEq)]
pub struct StopFiles {
    pub stop: String,
    pub phase1: Option<Value>,
    pub phase2: Option<Value>,
    /// Whether phase 1 and phase 2 carry their committed markers.
    pub committed: [bool; 2],
}

impl StopFiles {
    /// Both phases written and committed: nothing is left to do.
    pub fn settled(&self) -> bool {
        self.committed == [true, true]
    }
}

/// `stp_` and 32 lower-case hex digits: the only names the outbox makes or reads.
pub fn is_stop_id(s: &str) -> bool {
    s.strip_prefix("stp_")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn invalid(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Outbox {
    pub fn new(dir: impl Into<PathBuf>) -> Outbox {
        Outbox { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn stop_dir(&self, stop: &str) -> std::io::Result<PathBuf> {
        if !is_stop_id(stop) {
            return Err(invalid(format!("{stop:?} is not a stop id")));
        }
        Ok(self.dir.join(stop))
    }

    /// Write `name` in the stop's directory durably: a temporary file, fsynced, renamed over,
    /// and the directory fsynced. An existing file is never replaced (a phase is written once).
    fn put(&self, stop: &str, name: &str, doc: &Value) -> std::io::Result<()> {
        let dir = self.stop_dir(stop)?;
        let fresh = !dir.exists();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        if fresh {
            fsync_dir(&self.dir)?;
        }
        let path = dir.join(name);
        if path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is already written", path.display()),
            ));
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut bytes = serde_json::to_vec_pretty(doc).map_err(|e| invalid(e.to_string()))?;
        bytes.push(b'\n');
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        fsync_dir(&dir)
    }

    /// Phase 1: written and durable before anything about the stop is committed.
    pub fn write_phase1(&self, stop: &str, doc: &Value) -> std::io::Result<()> {
        assert_eq!(
            doc["termination_confirmed"], false,
            "phase 1 never confirms termination"
        );
        self.put(stop, "phase-1.json", doc)
    }

    /// Phase 2: only after phase 1 is on disk, and only with a zero-process observation.
    pub fn write_phase2(&self, stop: &str, doc: &Value) -> std::io::Result<()> {
        assert_eq!(
            doc["termination_confirmed"], true,
            "phase 2 is the zero-process observation"
        );
        if !self.stop_dir(stop)?.join("phase-1.json").exists() {
            return Err(invalid(format!("stop {stop}: phase 2 without its phase 1")));
        }
        self.put(stop, "phase-2.json", doc)
    }

    /// The record of `phase` is committed (under `event_id`).
    pub fn mark_committed(&self, stop: &str, phase: u8, event_id: &str) -> std::io::Result<()> {
        assert!(phase == 1 || phase == 2, "a stop has two phases");
        let doc = serde_json::json!({"schema": STOP_SCHEMA, "stop": stop, "phase": phase,
            "event_id": event_id, "committed": true});
        match self.put(stop, &format!("phase-{phase}.committed.json"), &doc) {
            // a replay that finds its marker written has nothing to add
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }

    fn read(path: &Path) -> std::io::Result<Option<Value>> {
        let f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if f.metadata()?.len() > PHASE_BYTES_MAX {
            return Err(invalid(format!("{} is too large", path.display())));
        }
        let v = serde_json::from_reader(std::io::BufReader::new(f))
            .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
        Ok(Some(v))
    }

    /// One stop's files.
    pub fn stop(&self, stop: &str) -> std::io::Result<StopFiles> {
        let dir = self.stop_dir(stop)?;
        Ok(StopFiles {
            stop: stop.into(),
            phase1: Self::read(&dir.join("phase-1.json"))?,
            phase2: Self::read(&dir.join("phase-2.json"))?,
            committed: [
                dir.join("phase-1.committed.json").exists(),
                dir.join("phase-2.committed.json").exists(),
            ],
        })
    }

    /// Every stop not settled, in causal order (phase 1's `written_ms`, then id), at most
    /// `STOPS_REPLAY_MAX`. A directory that is not a stop's is left alone.
    pub fn pending(&self) -> std::io::Result<Vec<StopFiles>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for e in entries {
            let name = e?.file_name();
            let Some(name) = name.to_str().filter(|n| is_stop_id(n)) else {
                continue;
            };
            let s = self.stop(name)?;
            if !s.settled() {
                out.push(s);
            }
        }
        out.sort_by_key(|s| {
            let at = s.phase1.as_ref().and_then(|p| p["written_ms"].as_u64());
            (at.unwrap_or(u64::MAX), s.stop.clone())
        });
        out.truncate(STOPS_REPLAY_MAX);
        Ok(out)
    }

    /// Every stop, settled or not, newest phase 1 first, at most `limit`.
    pub fn list(&self, limit: usize) -> std::io::Result<Vec<StopFiles>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for e in entries {
            let name = e?.file_name();
            if let Some(name) = name.to_str().filter(|n| is_stop_id(n)) {
                out.push(self.stop(name)?);
            }
        }
        out.sort_by_key(|s| {
            let at = s.phase1.as_ref().and_then(|p| p["written_ms"].as_u64());
            (std::cmp::Reverse(at.unwrap_or(0)), s.stop.clone())
        });
        out.truncate(limit);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "stp_0123456789abcdef0123456789abcdef";

    #[test]
    fn phase_2_needs_phase_1_and_each_is_written_once() {
        let tmp = tempfile::tempdir().unwrap();
        let o = Outbox::new(tmp.path().join("stops"));
        let p2 = json!({"termination_confirmed": true});
        assert!(
            o.write_phase2(ID, &p2).is_err(),
            "no phase 2 before phase 1"
        );
        assert!(o.pending().unwrap().is_empty());
        o.write_phase1(
            ID,
            &json!({"termination_confirmed": false, "written_ms": 5}),
        )
        .unwrap();
        assert!(
            o.write_phase1(ID, &json!({"termination_confirmed": false}))
                .is_err()
        );
        let s = &o.pending().unwrap()[0];
        assert_eq!((s.phase2.is_none(), s.committed), (true, [false, false]));
        o.mark_committed(ID, 1, "evt_x").unwrap();
        o.mark_committed(ID, 1, "evt_x").unwrap();
        o.write_phase2(ID, &p2).unwrap();
        o.mark_committed(ID, 2, "evt_y").unwrap();
        assert!(o.pending().unwrap().is_empty(), "settled");
        assert_eq!(o.list(10).unwrap().len(), 1);
    }

    #[test]
    fn names_that_are_not_stop_ids_are_refused_and_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let o = Outbox::new(tmp.path().join("stops"));
        for bad in ["../x", "stp_", "stp_0123456789ABCDEF0123456789abcdef", ""] {
            assert!(
                o.write_phase1(bad, &json!({"termination_confirmed": false}))
                    .is_err()
            );
        }
        std::fs::create_dir_all(tmp.path().join("stops/not-a-stop")).unwrap();
        assert!(o.pending().unwrap().is_empty());
    }
}
