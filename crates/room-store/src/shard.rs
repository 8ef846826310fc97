//! One room's shard on disk (`<state>/rooms/<graph_id>/`): its directory and the name of every
//! file in it. This is the one place that spells them; the engine's backend, the simulator and
//! the CLI's offline `verify` ask this type.

use crate::backend::ShardCreated;
use crate::fs::{create_new_durable, sync_dir};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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

    /// Create the shard durably: directories (fsynced, with their parent), then the binding
    /// (never overwritten: a different stored one is returned), then the manifest.
    pub fn create(&self, binding: &[u8], manifest: &[u8]) -> std::io::Result<ShardCreated> {
        std::fs::create_dir_all(self.blobs())?;
        // the new directories must be durable before anything in them is acknowledged
        sync_dir(&self.dir)?;
        if let Some(rooms) = self.dir.parent() {
            sync_dir(rooms)?;
        }
        if !create_new_durable(&self.binding(), binding)? {
            let existing = std::fs::read(self.binding())?;
            if existing != binding {
                return Ok(ShardCreated::BoundElsewhere(existing));
            }
        }
        create_new_durable(&self.manifest(), manifest)?;
        Ok(ShardCreated::Ready)
    }

    /// The manifest, when it is there and parses.
    pub fn read_manifest(&self) -> Option<Manifest> {
        std::fs::read(self.manifest())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// Every shard under `rooms` that has a readable manifest, in directory-name order.
pub fn on_disk(rooms: &Path) -> std::io::Result<Vec<(Shard, Manifest)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(rooms)? {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        let shard = Shard::at(rooms, &name);
        if let Some(m) = shard.read_manifest() {
            out.push((shard, m));
        }
    }
    out.sort_by(|a, b| a.0.dir.cmp(&b.0.dir));
    Ok(out)
}
