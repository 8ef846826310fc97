//! The broker's program check: a process inside a worker's job reaches the launch's broker
//! only if the program it runs (`/proc/<pid>/exe`, the file the kernel executed, whatever its
//! path says now) is one pinned for the launch: Room's own binary (the bridge that `room mcp`,
//! `room api` and `room agent-script` run) or the program the route starts. A shell tool,
//! `curl` or a compiled helper of the agent's is refused, though it runs in the job.
//!
//! Pins are taken when the launch starts: each program's file identity (device, inode, size,
//! modification and change times). A peer whose executable is that very file is admitted at
//! the cost of one `fstat`; any other file is admitted only if its SHA-256 equals a pinned
//! program's, and a pinned program whose file changed since the launch started is never
//! matched by digest (what it was at the launch is no longer knowable).

use room_core::FileStamp as Stamp;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;

/// Programs one launch may pin (its route's, Room's and the route's `broker_programs`).
pub const PINNED_MAX: usize = 10;
/// The largest executable hashed to compare by digest.
pub const EXE_BYTES_MAX: u64 = 1 << 30;

/// A file's identity: a change of content changes its size, times or inode.
fn stamp_of(m: &std::fs::Metadata) -> Stamp {
    Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    }
}

#[derive(Debug, Clone)]
struct Pin {
    path: PathBuf,
    stamp: Stamp,
}

/// The programs a launch's broker admits.
#[derive(Debug, Clone, Default)]
pub struct Pinned {
    pins: Vec<Pin>,
}

/// Digests already computed, by file identity (a daemon hashes each binary once).
static DIGESTS: Mutex<Option<HashMap<Stamp, String>>> = Mutex::new(None);

fn digest(f: &mut std::fs::File, stamp: Stamp) -> std::io::Result<String> {
    if let Some(d) = DIGESTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(&stamp))
    {
        return Ok(d.clone());
    }
    if stamp.len > EXE_BYTES_MAX {
        return Err(std::io::Error::other(format!(
            "larger than {EXE_BYTES_MAX} bytes: not hashed"
        )));
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let d = hex::encode(h.finalize());
    DIGESTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(stamp, d.clone());
    Ok(d)
}

impl Pinned {
    /// Pin `paths` (following links to the regular file each names). A path that cannot be
    /// pinned is an error: the launch does not start with a broker it cannot check.
    pub fn pin(paths: &[PathBuf]) -> Result<Pinned, String> {
        let mut pins: Vec<Pin> = Vec::new();
        for p in paths {
            if pins.len() >= PINNED_MAX {
                return Err(format!("more than {PINNED_MAX} broker programs"));
            }
            let m = std::fs::metadata(p)
                .map_err(|e| format!("the broker program {}: {e}", p.display()))?;
            if !m.is_file() {
                return Err(format!(
                    "the broker program {} is not a regular file",
                    p.display()
                ));
            }
            let stamp = stamp_of(&m);
            if !pins.iter().any(|x| x.stamp == stamp) {
                pins.push(Pin {
                    path: p.clone(),
                    stamp,
                });
            }
        }
        Ok(Pinned { pins })
    }

    /// The pinned programs' paths, for the launch's record.
    pub fn paths(&self) -> Vec<String> {
        self.pins
            .iter()
            .map(|p| p.path.display().to_string())
            .collect()
    }

    /// Whether process `pid` runs a pinned program; `Err` says what it runs instead, or why
    /// that cannot be known (which refuses it too).
    pub fn admits(&self, pid: u32) -> Result<(), String> {
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        let shown =
            std::fs::read_link(&exe).map_or_else(|_| "?".into(), |p| p.display().to_string());
        let mut f = std::fs::File::open(&exe)
            .map_err(|e| format!("its program cannot be observed: {e}"))?;
        let stamp = stamp_of(&f.metadata().map_err(|e| e.to_string())?);
        if self.pins.iter().any(|p| p.stamp == stamp) {
            return Ok(());
        }
        let theirs = digest(&mut f, stamp)
            .map_err(|e| format!("its program {shown} cannot be hashed: {e}"))?;
        for p in &self.pins {
            if self.pinned_digest(p).as_deref() == Some(theirs.as_str()) {
                return Ok(());
            }
        }
        Err(format!(
            "it runs {shown}, not a program pinned for this launch ({})",
            self.paths().join(", ")
        ))
    }

    /// A pin's digest, only while its file is still what it was when pinned.
    fn pinned_digest(&self, p: &Pin) -> Option<String> {
        let mut f = std::fs::File::open(&p.path).ok()?;
        let now = stamp_of(&f.metadata().ok()?);
        (now == p.stamp).then(|| digest(&mut f, now).ok()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_program_is_admitted_by_identity_a_copy_by_digest_another_refused() {
        let me = std::env::current_exe().unwrap();
        let pid = std::process::id();
        assert!(
            Pinned::pin(std::slice::from_ref(&me))
                .unwrap()
                .admits(pid)
                .is_ok()
        );
        // a copy of this test binary is another file with the same bytes
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("copy");
        std::fs::copy(&me, &copy).unwrap();
        assert!(
            Pinned::pin(std::slice::from_ref(&copy))
                .unwrap()
                .admits(pid)
                .is_ok()
        );
        // a different program is refused, and says what runs
        let other = Pinned::pin(&[PathBuf::from("/bin/sh")]).unwrap();
        let why = other.admits(pid).unwrap_err();
        assert!(why.contains("not a program pinned"), "{why}");
        // a pinned file changed after the launch started is matched neither way
        let pinned = Pinned::pin(std::slice::from_ref(&copy)).unwrap();
        std::fs::write(&copy, b"changed").unwrap();
        assert!(pinned.admits(pid).is_err());
        // an unobservable peer is refused, not admitted
        assert!(pinned.admits(u32::MAX).is_err());
        assert!(
            Pinned::pin(&[tmp.path().to_path_buf()]).is_err(),
            "a directory"
        );
        assert!(Pinned::pin(&[tmp.path().join("absent")]).is_err());
    }
}
