//! The broker's program check: a process inside a worker's job reaches the launch's broker
//! only if the program it runs (`/proc/<pid>/exe`, the file the kernel executed, whatever its
//! path says now) is one pinned for the launch: the bridge (Room's own binary, which `room
//! mcp`, `room api` and `room agent-script` run, staged by content digest) or the program the
//! route starts. A shell tool, `curl` or a compiled helper of the agent's is refused, though
//! it runs in the job.
//!
//! The bridge is staged once per daemon ([`Bridge`]): Room's binary copied into
//! `<state>/bridge/room-<sha256>` (mode 0555), its digest taken while copying and taken again
//! by reading the copy back through the handle it is pinned by. Workers run that copy (a
//! confined worker sees it bound read-only into its view), never the daemon's own path, which
//! a rebuild may replace. A staged copy whose file changed is staged again before the next
//! launch.
//!
//! Pins are taken when the launch starts: each program's file identity (device, inode, size,
//! modification and change times). A peer whose executable is that very file is admitted at
//! the cost of one `fstat`; any other file is admitted only if its SHA-256 equals a pinned
//! program's (the bridge's as staged; another's only while its file is unchanged since the
//! launch started: what it was then is no longer knowable otherwise).

use room_core::FileStamp as Stamp;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
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
    /// Known when pinned (the staged bridge's digest, verified when it was staged).
    sha256: Option<String>,
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
                    sha256: None,
                });
            }
        }
        Ok(Pinned { pins })
    }

    /// Pin the staged bridge too, by its identity and the digest it was staged at.
    pub fn with_bridge(mut self, b: &Staged) -> Result<Pinned, String> {
        if self.pins.len() >= PINNED_MAX {
            return Err(format!("more than {PINNED_MAX} broker programs"));
        }
        self.pins.retain(|p| p.stamp != b.stamp);
        self.pins.push(Pin {
            path: b.path.clone(),
            stamp: b.stamp,
            sha256: Some(b.sha256.clone()),
        });
        Ok(self)
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

    /// A pin's digest: the staged bridge's as staged, another's only while its file is still
    /// what it was when pinned.
    fn pinned_digest(&self, p: &Pin) -> Option<String> {
        if let Some(d) = &p.sha256 {
            return Some(d.clone());
        }
        let mut f = std::fs::File::open(&p.path).ok()?;
        let now = stamp_of(&f.metadata().ok()?);
        (now == p.stamp).then(|| digest(&mut f, now).ok()).flatten()
    }
}

/// Room's binary staged by content digest for one daemon's workers (see the module comment).
#[derive(Debug)]
pub struct Bridge {
    source: PathBuf,
    dir: PathBuf,
    staged: Mutex<Option<Staged>>,
}

/// The bridge as staged: its path, digest and the identity it was read back with.
#[derive(Debug, Clone)]
pub struct Staged {
    pub path: PathBuf,
    pub sha256: String,
    stamp: Stamp,
}

impl Staged {
    /// The staged file's device and inode, for a confined child to check what it binds.
    pub fn identity(&self) -> (u64, u64) {
        (self.stamp.dev, self.stamp.ino)
    }
}

impl Bridge {
    /// The bridge of Room's binary at `source`, to be staged in `dir` (`<state>/bridge`).
    pub fn new(source: PathBuf, dir: PathBuf) -> Bridge {
        Bridge {
            source,
            dir,
            staged: Mutex::new(None),
        }
    }

    /// The staged bridge: staged now if it was not, or if its file changed since (a copy
    /// whose identity moved is never trusted to be what was staged).
    pub fn staged(&self) -> Result<Staged, String> {
        let mut g = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = g.as_ref()
            && std::fs::metadata(&s.path).is_ok_and(|m| stamp_of(&m) == s.stamp)
        {
            return Ok(s.clone());
        }
        let first = g.is_none();
        let s = stage(&self.source, &self.dir)
            .map_err(|e| format!("staging the bridge {}: {e}", self.source.display()))?;
        if first {
            // earlier daemons' bridges (another binary) are nobody's now
            sweep(&self.dir, &s.path);
        }
        *g = Some(s.clone());
        Ok(s)
    }

    /// The bridge as last staged (none before the first launch staged it).
    pub fn current(&self) -> Option<Staged> {
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Copy `source` into `dir` while hashing it, make it read-only, rename it to its digest's
/// name, and read it back through the handle it is pinned by.
fn stage(source: &Path, dir: &Path) -> std::io::Result<Staged> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut src = std::fs::File::open(source)?;
    let m = src.metadata()?;
    if !m.is_file() || m.size() > EXE_BYTES_MAX {
        return Err(std::io::Error::other(format!(
            "not a regular file of at most {EXE_BYTES_MAX} bytes"
        )));
    }
    // a program on a file system mounted noexec cannot run: say so before any worker tries
    let fs = rustix::fs::statvfs(dir)?;
    if fs.f_flag.contains(rustix::fs::StatVfsMountFlags::NOEXEC) {
        return Err(std::io::Error::other(format!(
            "{} is on a file system mounted noexec: no program can run from it",
            dir.display()
        )));
    }
    let tmp = dir.join(format!(".staging-{}", std::process::id()));
    // an earlier attempt's copy (read-only by then) is not written over but replaced
    let _ = std::fs::remove_file(&tmp);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&tmp)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    out.sync_all()?;
    drop(out);
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o555))?;
    let sha256 = hex::encode(h.finalize());
    let path = dir.join(format!("room-{sha256}"));
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    // read back through the handle it is pinned by: these are the bytes the digest names
    let mut f = std::fs::File::open(&path)?;
    let stamp = stamp_of(&f.metadata()?);
    let mut back = Sha256::new();
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        back.update(&buf[..n]);
    }
    if hex::encode(back.finalize()) != sha256 {
        return Err(std::io::Error::other(
            "the staged copy does not read back as the bytes copied",
        ));
    }
    DIGESTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(stamp, sha256.clone());
    Ok(Staged {
        path,
        sha256,
        stamp,
    })
}

/// Remove the bridges in `dir` other than `keep` (best effort: a running worker's copy stays
/// open to it).
fn sweep(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let ours = e.file_name().to_string_lossy().starts_with("room-")
            || e.file_name().to_string_lossy().starts_with(".staging-");
        if ours && p != keep {
            let _ = std::fs::remove_file(&p);
        }
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

    #[test]
    fn the_bridge_is_staged_by_digest_read_back_and_staged_again_when_changed() {
        let me = std::env::current_exe().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bridge");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("room-old"), b"an earlier daemon's").unwrap();
        let b = Bridge::new(me.clone(), dir.clone());
        assert!(b.current().is_none());
        let s = b.staged().unwrap();
        let bytes = std::fs::read(&me).unwrap();
        assert_eq!(s.sha256, hex::encode(Sha256::digest(&bytes)));
        assert_eq!(s.path, dir.join(format!("room-{}", s.sha256)));
        assert_eq!(std::fs::read(&s.path).unwrap(), bytes);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&s.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o555);
        assert!(!dir.join("room-old").exists(), "an old bridge stays");
        // staged once: the next launch finds it as it was
        assert_eq!(b.staged().unwrap().stamp, s.stamp);
        // the running test binary is admitted by the staged digest, though it is another file
        let pinned = Pinned::default().with_bridge(&s).unwrap();
        assert!(pinned.admits(std::process::id()).is_ok());
        // a staged copy that changed is staged again, never taken for what was staged
        std::fs::set_permissions(&s.path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(&s.path, b"a worker's own program").unwrap();
        let again = b.staged().unwrap();
        assert_eq!(again.sha256, s.sha256);
        assert_eq!(std::fs::read(&again.path).unwrap(), bytes);
        // a source that cannot be staged is said so
        let none = Bridge::new(tmp.path().join("absent"), dir);
        assert!(none.staged().unwrap_err().contains("staging the bridge"));
    }
}
