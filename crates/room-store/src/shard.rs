//! One room's shard on disk (`<state>/rooms/<graph_id>/`): its directory and the name of every
//! file in it. This is the one place that spells them; the engine's backend, the simulator and
//! the CLI's offline `verify` ask this type.

use crate::StoreError;
use crate::backend::{RoomLog, ShardCreated};
use crate::fs::{create_new_durable, sync_dir};
use crate::journal::{Faults, Journal};
use room_core::Sealed;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A shard being created is staged under this prefix beside its final name.
pub const STAGING_PREFIX: &str = ".new-";

/// The manifest's schema tag.
pub const SHARD_SCHEMA: &str = "room-shard-v1";

/// A shard's own description, written once at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: String,
    pub room: String,
    pub graph_id: String,
    pub instance: String,
    pub created_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    dir: PathBuf,
}

impl Shard {
    /// The shard of `graph_id` under the state dir's `rooms/`.
    pub fn at(rooms: &Path, graph_id: &str) -> Shard {
        Shard {
            dir: rooms.join(graph_id),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The authoritative hash-chained journal.
    pub fn journal(&self) -> PathBuf {
        self.dir.join("EVENTS.jsonl")
    }

    /// What reconciliation repaired (torn tails, cut debris), one JSON object a line.
    pub fn errors(&self) -> PathBuf {
        self.dir.join("errors.jsonl")
    }

    /// The sync index database.
    pub fn index(&self) -> PathBuf {
        self.dir.join("sync_index.db")
    }

    /// The index database and its WAL and shared-memory files.
    pub fn index_files(&self) -> [PathBuf; 3] {
        let db = self.index();
        let side = |suffix: &str| {
            let mut p = db.clone().into_os_string();
            p.push(suffix);
            PathBuf::from(p)
        };
        [side("-wal"), side("-shm"), db]
    }

    pub fn blobs(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    /// The room's scope binding: immutable once written.
    pub fn binding(&self) -> PathBuf {
        self.dir.join("binding.json")
    }

    pub fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    /// Create the shard whole or not at all: binding, manifest and a journal holding `first`
    /// are written and synced in a staging directory beside it, which is then renamed into
    /// place (and the parent synced). A crash at any point leaves either no shard or the whole
    /// one; a staging directory it leaves is never read as a room (`on_disk` skips it) and is
    /// set aside at the next start. `Exists` when a shard is already there: the caller decides.
    pub fn create(
        &self,
        graph_id: &str,
        binding: &[u8],
        manifest: &[u8],
        first: &[Sealed],
        faults: Option<Arc<dyn Faults>>,
    ) -> crate::Result<ShardCreated> {
        if std::fs::symlink_metadata(&self.dir).is_ok() {
            return Ok(ShardCreated::Exists);
        }
        let rooms = self.dir.parent().ok_or_else(|| {
            StoreError::Corrupt(format!("{}: a shard has a parent", self.dir.display()))
        })?;
        let staging = Shard {
            dir: rooms.join(format!("{STAGING_PREFIX}{graph_id}")),
        };
        if std::fs::symlink_metadata(&staging.dir).is_ok() {
            // an earlier attempt that never finished: nothing in it was acknowledged
            std::fs::remove_dir_all(&staging.dir)?;
        }
        let staged = staging.stage(graph_id, binding, manifest, first, faults);
        if let Err(e) = staged {
            // nothing of a creation that failed stays in the room space
            if let Err(cleanup) = std::fs::remove_dir_all(&staging.dir) {
                tracing::warn!("{}: {cleanup}", staging.dir.display());
            }
            return Err(e);
        }
        std::fs::rename(&staging.dir, &self.dir)?;
        sync_dir(rooms)?;
        Ok(ShardCreated::Ready)
    }

    /// Write and sync everything of a new shard in this (staging) directory.
    fn stage(
        &self,
        graph_id: &str,
        binding: &[u8],
        manifest: &[u8],
        first: &[Sealed],
        faults: Option<Arc<dyn Faults>>,
    ) -> crate::Result<()> {
        std::fs::create_dir_all(self.blobs())?;
        create_new_durable(&self.binding(), binding)?;
        create_new_durable(&self.manifest(), manifest)?;
        {
            let mut journal =
                Journal::open(&self.journal(), graph_id, None, &self.errors(), |_| Ok(()))?
                    .with_faults(faults);
            journal.append(first)?;
        }
        sync_dir(&self.blobs())?;
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// Move the shard out of `rooms/` into `debris` (kept, never read as a room), durably.
    /// Only for a shard no room owns: one a failed or interrupted creation left.
    pub fn set_aside(&self, debris: &Path, now_ms: u64) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(debris)?;
        let name = self
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("shard")
            .trim_start_matches('.');
        let to = debris.join(format!("{name}.{now_ms}"));
        std::fs::rename(&self.dir, &to)?;
        sync_dir(debris)?;
        if let Some(rooms) = self.dir.parent() {
            sync_dir(rooms)?;
        }
        Ok(to)
    }

    /// The manifest, when it is there and parses.
    pub fn read_manifest(&self) -> Option<Manifest> {
        std::fs::read(self.manifest())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// Every shard under `rooms` that has a readable manifest, in directory-name order (staging
/// directories of creations in progress or interrupted are not shards).
pub fn on_disk(rooms: &Path) -> std::io::Result<Vec<(Shard, Manifest)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(rooms)? {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        if name.starts_with('.') {
            // a staging directory: not (yet) a room
            continue;
        }
        let shard = Shard::at(rooms, &name);
        if let Some(m) = shard.read_manifest() {
            out.push((shard, m));
        }
    }
    out.sort_by(|a, b| a.0.dir.cmp(&b.0.dir));
    Ok(out)
}

/// Every entry under `rooms` that is not the shard of one of `known` graph ids: staging
/// directories and shards whose creation was never acknowledged.
pub fn strays(
    rooms: &Path,
    known: &std::collections::BTreeSet<String>,
) -> std::io::Result<Vec<Shard>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(rooms)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) {
            out.push(Shard {
                dir: rooms.join(name),
            });
        }
    }
    out.sort_by(|a, b| a.dir.cmp(&b.dir));
    Ok(out)
}
