//! The real file system behind `room_core::Fs`, and durable-write helpers.

use room_core::{FileStamp, Fs, ObjectId};
use rustix::fs::{AtFlags, CWD, StatxFlags};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

/// The regular file at `rel` beneath `root`, resolved without ever leaving `root` (a symlink
/// swapped in between a check and the open cannot lead out) and opened without blocking (a
/// FIFO is refused, not waited on).
fn open_beneath(root: &Path, rel: &Path) -> std::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )?;
    let f = std::fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(f)
}

impl Fs for RealFs {
    fn stamp(&self, path: &Path) -> std::io::Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }

    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn list_dir(&self, path: &Path, limit: usize) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(path)? {
            if out.len() >= limit {
                break;
            }
            out.push(e?.file_name().to_string_lossy().into_owned());
        }
        out.sort();
        Ok(out)
    }

    fn append(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        append_bytes(path, bytes)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        write_atomic(path, bytes)
    }

    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }

    fn object_id(&self, path: &Path) -> std::io::Result<ObjectId> {
        let st = rustix::fs::statx(
            CWD,
            path,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
        )?;
        let dev = (u64::from(st.stx_dev_major) << 32) | u64::from(st.stx_dev_minor);
        Ok(ObjectId {
            dev,
            ino: st.stx_ino,
            mnt_id: st.stx_mnt_id,
        })
    }

    fn is_dir_nofollow(&self, path: &Path) -> std::io::Result<bool> {
        Ok(std::fs::symlink_metadata(path)?.file_type().is_dir())
    }

    fn try_exists(&self, path: &Path) -> std::io::Result<bool> {
        path.try_exists()
    }

    fn read_link(&self, path: &Path) -> std::io::Result<PathBuf> {
        std::fs::read_link(path)
    }

    fn read_beneath(&self, root: &Path, rel: &Path, bytes_max: u64) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let f = open_beneath(root, rel)?;
        if f.metadata()?.len() > bytes_max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("larger than {bytes_max} bytes"),
            ));
        }
        let mut out = Vec::new();
        f.take(bytes_max + 1).read_to_end(&mut out)?;
        if out.len() as u64 > bytes_max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "grew past the limit while it was read",
            ));
        }
        Ok(out)
    }

    fn sha256_beneath(&self, root: &Path, rel: &Path) -> std::io::Result<(String, u64)> {
        use sha2::{Digest, Sha256};
        use std::io::Read;
        let mut f = open_beneath(root, rel)?;
        let meta = f.metadata()?;
        if meta.len() > room_core::env::SHA256_FILE_BYTES_MAX {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!(
                    "larger than {} bytes",
                    room_core::env::SHA256_FILE_BYTES_MAX
                ),
            ));
        }
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut len = 0u64;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            len += n as u64;
            if len > room_core::env::SHA256_FILE_BYTES_MAX {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::FileTooLarge,
                    "grew past the limit while it was read",
                ));
            }
        }
        Ok((hex::encode(h.finalize()), len))
    }
}

/// Write a file so that after a crash it is either absent, the old version, or complete:
/// temp file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no parent"))?;
    // A name of its own per writer: two writers of the same content must not share a temp file.
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.{}.{n}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}

pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Create a file only if absent, durably. Returns false when it already existed.
pub fn create_new_durable(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    if !create_new_unsynced(path, bytes)? {
        return Ok(false);
    }
    sync_file(path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(true)
}

/// Create `path` with `bytes` unless it exists, without syncing: for files derived from the
/// journal (wake permits), which are synced in batches and re-derived after a crash. Returns
/// false when the file already existed.
pub fn create_new_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(bytes)?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// fsync a file that was written earlier.
pub fn sync_file(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Append one JSON line to a log file (errors.jsonl, artifacts.jsonl) and sync it.
pub fn append_jsonl(path: &Path, value: &serde_json::Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    append_bytes(path, &line)
}

/// Append `bytes` to `path` (created if absent) and sync them.
pub fn append_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_data()
}
