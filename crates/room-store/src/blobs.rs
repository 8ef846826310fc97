//! Content-addressed blobs: payloads too large to sit in a journal line. A blob is written and
//! synced before the record that names it, so a durable record never points at a missing blob.

use crate::backend::BlobStore;
use crate::journal::{Fault, Faults};
use room_core::sha256_hex;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Payloads above this many bytes leave the journal line for a blob.
pub const INLINE_BYTES_MAX: usize = 8 * 1024;

#[derive(Debug, Clone)]
pub struct Blobs {
    dir: PathBuf,
    faults: Option<Arc<dyn Faults>>,
}

impl Blobs {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Blobs {
            dir: dir.into(),
            faults: None,
        }
    }

    /// Inject faults into blob writes (the simulator only).
    pub fn with_faults(mut self, faults: Option<Arc<dyn Faults>>) -> Self {
        self.faults = faults;
        self
    }

    /// An injected fault: what lands on disk before the write fails (never the final name).
    fn injected(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let Some(f) = self
            .faults
            .as_ref()
            .and_then(|f| f.on_blob_write(path, bytes.len()))
        else {
            return Ok(());
        };
        let tmp = self.dir.join(format!(".fault.{}.tmp", bytes.len()));
        let partial = |n: usize| -> std::io::Result<()> {
            std::fs::File::create(&tmp)?.write_all(&bytes[..n.min(bytes.len())])
        };
        match f {
            Fault::WriteError(kind) => {
                Err(std::io::Error::new(kind, "injected blob write failure"))
            }
            Fault::ShortWrite(n) => {
                partial(n)?;
                Err(std::io::Error::other("injected short blob write"))
            }
            Fault::SyncError => {
                partial(bytes.len())?;
                Err(std::io::Error::other("injected blob fsync failure"))
            }
            Fault::CrashAfterWrite => {
                partial(bytes.len())?;
                Err(std::io::Error::other(
                    "injected crash before the blob's rename",
                ))
            }
            Fault::SkipSync => Ok(()),
        }
    }

    fn path(&self, sha: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{sha}.{ext}"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl BlobStore for Blobs {
    /// Remove temp files a crash left behind: no record ever names one.
    fn sweep_temps(&self) -> std::io::Result<usize> {
        let mut n = 0;
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        for e in dir {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                std::fs::remove_file(e.path())?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Store `bytes`; returns their SHA-256. Idempotent.
    fn put(&self, bytes: &[u8], ext: &str) -> std::io::Result<String> {
        let sha = sha256_hex(bytes);
        let path = self.path(&sha, ext);
        if !path.exists() {
            self.injected(&path, bytes)?;
            crate::fs::write_atomic(&path, bytes)?;
        }
        Ok(sha)
    }

    /// Read a blob back and verify its digest; a mismatch is corruption, reported as an error.
    fn get(&self, sha: &str, ext: &str) -> std::io::Result<Vec<u8>> {
        if !room_core::canon::is_sha256_hex(sha) {
            return Err(std::io::Error::other(format!("bad blob digest {sha:?}")));
        }
        let bytes = std::fs::read(self.path(sha, ext))?;
        if sha256_hex(&bytes) != sha {
            return Err(std::io::Error::other(format!(
                "blob {sha} does not match its digest"
            )));
        }
        Ok(bytes)
    }
}
