//! The two non-deterministic inputs of the engine, as traits. The daemon passes the system clock
//! and the OS random source; a simulation passes seeded ones, so a run can be replayed exactly.

/// Physical time as the engine sees it. May jump backwards; the HLC absorbs that.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Random bytes for ids and secrets.
pub trait Entropy: Send + Sync {
    fn fill(&self, buf: &mut [u8]);

    fn hex(&self, bytes: usize) -> String {
        let mut buf = vec![0u8; bytes];
        self.fill(&mut buf);
        hex::encode(buf)
    }
}

/// A clock that returns whatever the test sets. Useful beside the engine and in simulations.
#[derive(Debug, Default)]
pub struct ManualClock(pub std::sync::atomic::AtomicU64);

impl ManualClock {
    pub fn new(ms: u64) -> Self {
        Self(std::sync::atomic::AtomicU64::new(ms))
    }
    pub fn set(&self, ms: u64) {
        self.0.store(ms, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A deterministic xorshift source for simulations and tests. Never used for credentials
/// outside tests: the daemon passes the OS CSPRNG.
#[derive(Debug)]
pub struct SeededEntropy(std::sync::Mutex<u64>);

impl SeededEntropy {
    pub fn new(seed: u64) -> Self {
        Self(std::sync::Mutex::new(seed | 1))
    }
}

impl Entropy for SeededEntropy {
    fn fill(&self, buf: &mut [u8]) {
        let mut s = self.0.lock().expect("entropy lock is never poisoned");
        for b in buf {
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            *b = (*s >> 24) as u8;
        }
    }
}

/// A directory's kernel identity: device, inode and mount id. A root replaced, renamed over or
/// swapped for a symlink changes at least one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ObjectId {
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u64,
}

/// What tells one version of a file from another without reading it: identity, length and
/// both timestamps (nanoseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

/// Everything the engine asks of the file system: territory checks, the owner's policy file
/// and the pins beside project grants. The daemon passes the real one (statx, realpath); a
/// simulation can pass its own. Shards, journals and blobs are the storage backend's.
pub trait Fs: Send + Sync {
    /// The stamp of the file at `path` (following symlinks).
    fn stamp(&self, path: &std::path::Path) -> std::io::Result<FileStamp>;
    /// The whole content of the file at `path`.
    fn read(&self, path: &std::path::Path) -> std::io::Result<Vec<u8>>;
    /// The names of at most `limit` entries of the directory at `path`, sorted (a name that
    /// is not UTF-8 is shown lossily; an absent directory is `NotFound`).
    fn list_dir(&self, path: &std::path::Path, limit: usize) -> std::io::Result<Vec<String>>;
    /// Write a file so that after a crash it is absent, the old version or complete, creating
    /// its directory first if needed.
    fn write_atomic(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()>;
    /// Append `bytes` to the file at `path` (created if absent) and sync them.
    fn append(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()>;
    /// The canonical absolute path (symlinks resolved).
    fn canonicalize(&self, path: &std::path::Path) -> std::io::Result<std::path::PathBuf>;
    /// Identity of the object at `path` without following a final symlink.
    fn object_id(&self, path: &std::path::Path) -> std::io::Result<ObjectId>;
    /// Whether `path` (not following a final symlink) is a directory.
    fn is_dir_nofollow(&self, path: &std::path::Path) -> std::io::Result<bool>;
    /// The target of the symlink at `path` (not followed further).
    fn read_link(&self, path: &std::path::Path) -> std::io::Result<std::path::PathBuf>;
    /// Whether anything is at `path` (following symlinks), with `Path::try_exists` semantics:
    /// an error (permission denied, I/O) is an error, never `false`.
    fn try_exists(&self, path: &std::path::Path) -> std::io::Result<bool>;
    /// The SHA-256 (lower-case hex) and length of the regular file at `rel` beneath `root`,
    /// resolved without ever leaving `root` (a symlink swapped in between a check and the read
    /// cannot lead out), opened without blocking (a FIFO is refused, not waited on), and at
    /// most `SHA256_FILE_BYTES_MAX` long.
    fn sha256_beneath(
        &self,
        root: &std::path::Path,
        rel: &std::path::Path,
    ) -> std::io::Result<(String, u64)>;
    /// The whole content of the regular file at `rel` beneath `root`, opened as
    /// `sha256_beneath` opens it; larger than `bytes_max` is an error.
    fn read_beneath(
        &self,
        root: &std::path::Path,
        rel: &std::path::Path,
        bytes_max: u64,
    ) -> std::io::Result<Vec<u8>>;
}

/// The largest file a `sha256` check reads.
pub const SHA256_FILE_BYTES_MAX: u64 = 1 << 30;

/// A program to run for an acceptance check or a probe: an absolute path, the exact
/// arguments, no shell, no PATH lookup, a bounded time. It runs confined as a worker does
/// (the daemon's runner): `project` is read-only to it unless `project_write`, and it has no
/// network unless `network`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunRequest {
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    pub cwd: std::path::PathBuf,
    pub timeout_ms: u64,
    /// The project tree the run may see (read-only unless `project_write`).
    pub project: Option<std::path::PathBuf>,
    pub project_write: bool,
    pub network: bool,
    /// Bytes written to the run's standard input, which is then closed (empty: no input).
    pub stdin: Vec<u8>,
    /// The run's standard output kept whole up to this many bytes (`RunOutcome::stdout`);
    /// 0: only its tail is kept.
    pub stdout_bytes_max: usize,
}

/// How a run ended. `exit_code` is `None` when a signal ended it (or the deadline did).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub elapsed_ms: u64,
    /// The last bytes of each stream (lossy UTF-8), for the result's detail.
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// The first bytes of standard output, at most `stdout_bytes_max + 1` of them (one more
    /// than asked says it was longer); empty unless the request asked.
    pub stdout: Vec<u8>,
    /// The run's job was observed at zero processes after it ended (nothing it started
    /// outlived it). False: processes were still seen, and the run's result is not trusted.
    pub job_empty: bool,
    /// How the run was confined (`namespaces`, `namespaces_without_pid`, `job_only`).
    pub confinement: String,
}

/// Runs processes for the engine. The daemon passes one that starts each run in its own
/// process group and ends the whole group at the deadline; a simulation passes its own.
pub trait Runner: Send + Sync {
    fn run(&self, req: &RunRequest) -> std::io::Result<RunOutcome>;
}

/// A runner that refuses every run: for engines that must never start a process.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoRunner;

impl Runner for NoRunner {
    fn run(&self, _req: &RunRequest) -> std::io::Result<RunOutcome> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this engine runs no processes",
        ))
    }
}
