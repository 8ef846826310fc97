//! Content-addressed blobs: payloads too large to sit in a journal line. A blob is written and
//! synced before the record that names it, so a durable record never points at a missing blob.

use room_core::sha256_hex;
use std::path::{Path, PathBuf};

/// Payloads above this many bytes leave the journal line for a blob.
pub const INLINE_BYTES_MAX: usize = 8 * 1024;

#[derive(Debug, Clone)]
pub struct Blobs {
    dir: PathBuf,
}

impl Blobs {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Blobs { dir: dir.into() }
    }

    fn path(&self, sha: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{sha}.{ext}"))
    }

    /// Store `bytes`; returns their SHA-256. Idempotent.
    pub fn put(&self, bytes: &[u8], ext: &str) -> std::io::Result<String> {
        let sha = sha256_hex(bytes);
        let path = self.path(&sha, ext);
        if !path.exists() {
            crate::fs::write_atomic(&path, bytes)?;
        }
        Ok(sha)
    }

    /// Read a blob back and verify its digest; a mismatch is corruption, reported as an error.
    pub fn get(&self, sha: &str, ext: &str) -> std::io::Result<Vec<u8>> {
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

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
