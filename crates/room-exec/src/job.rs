//! Owned jobs: every process a worker starts stays inside one kernel object the daemon owns,
//! so that stopping the worker ends all of it, and "stopped" is observed, never assumed.
//!
//! Where the daemon can create cgroup v2 directories, a job is a leaf cgroup of its own: the
//! child enters it between fork and exec (so nothing it forks can start outside), a stop
//! writes `cgroup.kill`, and the job is quiescent only once `cgroup.events` says
//! `populated 0`. A process that leaves its process group (`setsid`) stays in its cgroup.
//!
//! Otherwise a job is a subreaper shim (`shim`): a process of Room's own between the daemon
//! and the worker, a child subreaper, so that everything the worker starts stays below it
//! whatever session or group it moves to. A stop asks the shim to end its tree; the job is
//! quiescent only once the shim reports that it has no child left. A shim killed from inside
//! its job reports nothing, and the stop stays unconfirmed.
//!
//! Leaves live under `<the daemon's own cgroup>/room-<name>/`, `name` fixed per state
//! directory, so that a daemon started after a crash finds the leaves of the one before and
//! ends what is left in them (`Jobs::reap_stale`).
//!
//! The limit: a worker runs as the daemon's uid, and the child must be able to write its
//! leaf's `cgroup.procs`, so an unconfined worker that sets out to can move itself into
//! another cgroup the uid may write (the daemon's own) and leave its job unseen. A confined
//! worker (`confine`) is in a cgroup namespace rooted at its leaf, with every cgroup2 mount
//! hidden under an empty tmpfs: it can name no cgroup outside its job (a worker that is root,
//! because the daemon is, can undo a mount and is not held by this).

use rustix::process::{Pid, Signal, kill_process};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a stop looks again for the job to be empty.
const POLL_MS: u64 = 5;
/// Leaves `reap_stale` ends at one start.
const STALE_LEAVES_MAX: usize = 4_096;

/// Whether a process belongs to one job: listed in its cgroup leaf, or (process groups) in
/// its leader's group.
#[derive(Debug, Clone)]
pub struct Membership {
    leaf: Option<PathBuf>,
    shim: Option<Arc<Shim>>,
}

impl Membership {
    /// The job's live processes now (zombies excluded), as `Job::members` sees them.
    pub fn members(&self) -> Vec<u32> {
        match (&self.leaf, &self.shim) {
            (Some(leaf), _) => cgroup_members(leaf),
            (None, Some(shim)) if shim.outcome().is_none() => descendants(shim.pid),
            (None, _) => Vec::new(),
        }
    }

    pub fn contains(&self, pid: u32) -> bool {
        if pid == 0 {
            return false;
        }
        match (&self.leaf, &self.shim) {
            (Some(leaf), _) => cgroup_members(leaf).contains(&pid),
            // a shim that has reported is gone: its pid may name another process now
            (None, Some(shim)) => shim.outcome().is_none() && ancestors(pid).contains(&shim.pid),
            (None, None) => false,
        }
    }
}

/// Which kernel object holds a job's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// A cgroup v2 leaf: everything the worker forks, whatever its session or group.
    Cgroup,
    /// The tree below a subreaper shim: everything the worker forks, whatever its session or
    /// group, unless it kills the shim (then the stop is unconfirmed).
    Subreaper,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Cgroup => "cgroup",
            JobKind::Subreaper => "subreaper",
        }
    }
}

/// What a stop observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub kind: JobKind,
    /// The job was seen empty after the kill: zero processes, observed.
    pub confirmed_empty: bool,
    /// Processes still seen when the wait ran out (empty when confirmed).
    pub remaining: Vec<u32>,
    pub waited_ms: u64,
}

/// Where this daemon creates its jobs.
#[derive(Debug, Clone)]
pub struct Jobs {
    /// `<cgroup2 mount><own cgroup>/room-<name>`, or none (process groups only).
    base: Option<PathBuf>,
    /// The base's path inside the cgroup2 hierarchy (`/<own>/room-<name>`), as
    /// `/proc/<pid>/cgroup` names it.
    base_rel: Option<String>,
    /// Why there is no cgroup base, for the log.
    why_not: Option<String>,
    /// The shims of the jobs started and not yet seen empty, by pid: what `close` stops when
    /// there is no cgroup base to walk.
    live: Live,
    /// Where a subreaper job's shim is recorded while it runs (`<id>.shim`: its pid and start
    /// time), so that a daemon started after a crash finds the shims of the one before and
    /// ends their trees (`reap_stale`); none: not recorded.
    markers: Option<PathBuf>,
    /// What `reap_stale` observed of each recorded shim of a daemon before, by job id.
    reaped: Reaped,
}

type Reaped = Arc<std::sync::Mutex<std::collections::BTreeMap<String, Stopped>>>;

type Live = Arc<std::sync::Mutex<std::collections::BTreeMap<u32, Arc<Shim>>>>;

fn live_set(live: &Live) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u32, Arc<Shim>>> {
    // a panic while holding it leaves a set that is still a set
    live.lock().unwrap_or_else(|e| e.into_inner())
}

impl Jobs {
    /// Jobs under a cgroup v2 base for `name` when this process can create one; otherwise
    /// process groups, with the reason kept for `why_not`.
    pub fn detect(name: &str) -> Jobs {
        let jobs = match cgroup_base(name) {
            Ok((base, rel)) => Jobs {
                base: Some(base),
                base_rel: Some(rel),
                why_not: None,
                live: Live::default(),
                markers: None,
                reaped: Reaped::default(),
            },
            Err(why) => return Jobs::subreapers(why),
        };
        match jobs.probe() {
            Ok(()) => jobs,
            Err(e) => Jobs::subreapers(format!("a process cannot enter a job there: {e}")),
        }
    }

    /// Start `/bin/true` in a leaf and stop it: a base where a child cannot enter its leaf
    /// (a cgroup with controllers whose domain refuses members) is no base.
    fn probe(&self) -> std::io::Result<()> {
        let mut job = self.create(&format!("probe-{}", std::process::id()))?;
        let mut cmd = std::process::Command::new("/bin/true");
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        job.prepare(&mut cmd);
        let spawned = cmd.spawn();
        let waited = spawned.and_then(|mut c| {
            job.started(c.id());
            c.wait()
        });
        let s = job.stop(1_000);
        waited?;
        if !s.confirmed_empty || job.leaf.is_some() {
            return Err(std::io::Error::other(
                "the probe's leaf was not seen empty and removed",
            ));
        }
        Ok(())
    }

    /// Jobs that are subreaper shims only.
    pub fn subreapers(why: impl Into<String>) -> Jobs {
        Jobs {
            base: None,
            base_rel: None,
            why_not: Some(why.into()),
            live: Live::default(),
            markers: None,
            reaped: Reaped::default(),
        }
    }

    /// The jobs a previous daemon made under `base` (a path it recorded), to be reaped; none
    /// when `base` is no cgroup directory any more.
    pub fn existing(base: &Path) -> Option<Jobs> {
        base.join("cgroup.procs").exists().then(|| Jobs {
            base: Some(base.to_path_buf()),
            base_rel: None,
            why_not: None,
            live: Live::default(),
            markers: None,
            reaped: Reaped::default(),
        })
    }

    /// Record each subreaper job's shim in `dir` while it runs (see `markers`).
    pub fn with_markers(mut self, dir: PathBuf) -> Jobs {
        self.markers = Some(dir);
        self
    }

    pub fn kind(&self) -> JobKind {
        if self.base.is_some() {
            JobKind::Cgroup
        } else {
            JobKind::Subreaper
        }
    }

    /// Why jobs are subreaper shims, when they are.
    pub fn why_not_cgroup(&self) -> Option<&str> {
        self.why_not.as_deref()
    }

    /// The cgroup directory jobs are created under.
    pub fn base(&self) -> Option<&Path> {
        self.base.as_deref()
    }

    /// A new job named `id` (a launch id: letters, digits, `_` and `-` only).
    pub fn create(&self, id: &str) -> std::io::Result<Job> {
        if id.is_empty()
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a job id is letters, digits, _ and - only",
            ));
        }
        let Some(base) = &self.base else {
            let mut fds = [0 as libc::c_int; 2];
            // SAFETY: pipe2 fills two descriptors this process then owns
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: both are fresh descriptors owned by nothing else; the write end moves
            // above stdio (a daemon started with 0, 1 or 2 closed would hand one out, and the
            // child's stdio would replace it)
            let (r, w) = unsafe {
                use std::os::fd::FromRawFd;
                let high = libc::fcntl(fds[1], libc::F_DUPFD_CLOEXEC, 3);
                let err = std::io::Error::last_os_error();
                libc::close(fds[1]);
                let r = OwnedFd::from_raw_fd(fds[0]);
                if high < 0 {
                    return Err(err);
                }
                (r, OwnedFd::from_raw_fd(high))
            };
            return Ok(Job {
                kind: JobKind::Subreaper,
                leaf: None,
                procs: None,
                report: Some((r, Arc::new(w))),
                shim: None,
                leader: None,
                live: self.live.clone(),
                marker: self.markers.as_ref().map(|d| d.join(format!("{id}.shim"))),
            });
        };
        let leaf = base.join(id);
        std::fs::create_dir(&leaf)?;
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(leaf.join("cgroup.procs"))
            .map(|f| Arc::new(OwnedFd::from(f)));
        match procs {
            Ok(fd) => Ok(Job {
                kind: JobKind::Cgroup,
                leaf: Some(leaf),
                procs: Some(fd),
                report: None,
                shim: None,
                leader: None,
                live: self.live.clone(),
                marker: None,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir(&leaf);
                Err(e)
            }
        }
    }

    /// End whatever a previous daemon of this state directory left in its leaves, and remove
    /// them. Returns how many leaves held processes.
    pub fn reap_stale(&self, wait_ms: u64) -> std::io::Result<usize> {
        let Some(base) = &self.base else {
            return self.reap_stale_shims(wait_ms);
        };
        let mut held = 0;
        for e in std::fs::read_dir(base)?.flatten().take(STALE_LEAVES_MAX) {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let leaf = e.path();
            // a leaf that cannot be read is still stopped: one bad leaf keeps none from it
            if !cgroup_empty(&leaf).unwrap_or(false) {
                held += 1;
            }
            let s = stop_cgroup(&leaf, wait_ms);
            if s.confirmed_empty {
                let _ = std::fs::remove_dir(&leaf);
            } else if let Some(id) = leaf.file_name().and_then(|n| n.to_str()) {
                self.reaped
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.to_string(), s);
            }
        }
        Ok(held)
    }
}

impl Jobs {
    /// End the trees of the shims a daemon before this one recorded and left running (a
    /// crash: its shims outlive it, and so does everything below them). A recorded shim that
    /// still runs (same pid, same start time) keeps every orphan of its tree below it, so its
    /// tree is found by ancestry: each process below it is killed until none is left, and only
    /// then the shim itself; that is the observation of zero processes. A shim already gone
    /// leaves nothing to observe: its job stays unconfirmed. Returns how many trees held
    /// processes; what was observed of each is kept for `observe_empty`.
    fn reap_stale_shims(&self, wait_ms: u64) -> std::io::Result<usize> {
        let Some(dir) = &self.markers else {
            return Ok(0);
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut held = 0;
        for e in entries.flatten().take(STALE_LEAVES_MAX) {
            let path = e.path();
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".shim"))
                .map(String::from)
            else {
                continue;
            };
            let Some((pid, start)) = read_marker(&path) else {
                let _ = std::fs::remove_file(&path);
                continue;
            };
            if live_set(&self.live).contains_key(&pid) {
                continue; // this daemon's own
            }
            let stopped = if start_time(pid) == Some(start) {
                held += 1;
                end_tree(pid, start, wait_ms)
            } else {
                // gone before this start (killed from inside its job, or ended after the
                // crash): what it held cannot be observed any more, so nothing confirms it
                Some(Stopped {
                    kind: JobKind::Subreaper,
                    confirmed_empty: false,
                    remaining: Vec::new(),
                    waited_ms: 0,
                })
            };
            if let Some(s) = stopped {
                // seen empty, or gone before this start (nothing more can be learned of it)
                if s.confirmed_empty || s.waited_ms == 0 && s.remaining.is_empty() {
                    let _ = std::fs::remove_file(&path);
                }
                self.reaped
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id, s);
            }
        }
        Ok(held)
    }

    /// The jobs of a daemon before this one that this start's reap could not see empty, by
    /// id (a launch's id): their launches must not be recorded as stopped.
    pub fn unconfirmed_stale(&self) -> std::collections::BTreeSet<String> {
        self.reaped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, s)| !s.confirmed_empty)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether `pid` runs inside any job of this daemon: its cgroup is under the base, or
    /// (subreapers) a live shim is among its ancestors. Such a process is a worker, never the
    /// owner console.
    pub fn holds(&self, pid: u32) -> bool {
        if pid == 0 {
            return false;
        }
        if self.base.is_some() {
            let Ok(own) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
                return false;
            };
            let Some(rel) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
                return false;
            };
            // the base's own path in the hierarchy; a member's cgroup is below it
            return self
                .base_rel
                .as_deref()
                .is_some_and(|b| rel.trim().starts_with(&format!("{b}/")));
        }
        let up = ancestors(pid);
        let mut live = live_set(&self.live);
        // a shim that has reported is gone, and its pid may name another process now
        live.retain(|_, s| s.outcome().is_none());
        up.iter().any(|a| live.contains_key(a))
    }

    /// Whether the job named `id`, of a daemon before this one, is seen empty now (after
    /// `reap_stale`): its leaf gone (a leaf is removed only once seen empty) or unpopulated,
    /// None when nothing can be observed: a job of another `kind` than this daemon makes, and
    /// any subreaper job (its report pipe died with the daemon before, and a shim gone may
    /// have been killed from inside its job, its tree still running), whose stop then stays
    /// unconfirmed for an operator to reconcile.
    pub fn observe_empty(&self, id: &str, kind: &str, pgid: Option<u32>) -> Option<Stopped> {
        let start = Instant::now();
        let seen = |kind, confirmed_empty: bool, remaining: Vec<u32>| Stopped {
            kind,
            confirmed_empty,
            remaining,
            waited_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        if kind != self.kind().as_str() {
            // made by a daemon with other means: this one cannot look at it
            return None;
        }
        if let Some(base) = &self.base {
            let leaf = base.join(id);
            if !leaf.exists() || cgroup_empty(&leaf).unwrap_or(false) {
                return Some(seen(JobKind::Cgroup, true, Vec::new()));
            }
            return Some(seen(JobKind::Cgroup, false, cgroup_members(&leaf)));
        }
        // the report pipe died with the daemon before; what this start's reap observed of the
        // job's recorded shim is the observation (a shim that was gone already, or never
        // recorded, may have been killed with its tree still running: nothing confirms)
        if let Some(s) = self
            .reaped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Some(s.clone());
        }
        let _ = pgid?;
        None
    }

    /// At a daemon's shutdown: end every job still running and remove the base, so that
    /// nothing a worker started outlives its daemon. Returns how many jobs held processes.
    pub fn close(&self, wait_ms: u64) -> std::io::Result<usize> {
        let shims: Vec<Arc<Shim>> = live_set(&self.live).values().cloned().collect();
        let mut held = 0;
        for shim in shims {
            if shim.outcome().is_none() {
                held += 1;
            }
            if shim.stop(wait_ms).confirmed_empty {
                live_set(&self.live).remove(&shim.pid);
                shim.forget();
            }
        }
        // what is left in the leaves (a setsid descendant) goes with them
        held = held.max(self.reap_stale(wait_ms)?);
        if let Some(base) = &self.base {
            // a leaf that would not empty keeps the base; the next start tries again
            let _ = std::fs::remove_dir(base);
        }
        Ok(held)
    }
}

/// One worker's job. Drop does not stop it: a stop is an observation the caller records.
#[derive(Debug)]
pub struct Job {
    kind: JobKind,
    leaf: Option<PathBuf>,
    /// `cgroup.procs` of the leaf, open for the child to enter between fork and exec (shared
    /// with the command it was prepared for, which keeps it open until it is dropped).
    procs: Option<Arc<OwnedFd>>,
    /// A subreaper job's report pipe before its start: the read end, and the write end the
    /// shim inherits (shared with the command it was prepared for).
    report: Option<(OwnedFd, Arc<OwnedFd>)>,
    /// A subreaper job's shim, once started.
    shim: Option<Arc<Shim>>,
    /// The started child's pid (a cgroup job's worker, a subreaper job's shim).
    leader: Option<u32>,
    live: Live,
    /// A subreaper job's durable record of its shim (`Jobs::markers`), removed once the job
    /// is seen empty.
    marker: Option<PathBuf>,
}

impl Job {
    pub fn kind(&self) -> JobKind {
        self.kind
    }

    /// Make `cmd`'s child start in its own process group and, for a cgroup job, inside the
    /// leaf before it runs a single instruction of its program; for a subreaper job, below a
    /// shim (the child `spawn` returns is the shim; the worker is its child).
    pub fn prepare(&self, cmd: &mut std::process::Command) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        if let Some((_, w)) = &self.report {
            let w = w.clone();
            // SAFETY: `shim::split` makes system calls only, on a descriptor the closure keeps
            // open; it returns in the worker and never in the shim
            unsafe {
                cmd.pre_exec(move || crate::shim::split(crate::shim::Report::Empty(w.as_raw_fd())));
            }
        }
        if let Some(fd) = self.procs.clone() {
            // SAFETY: between fork and exec only async-signal-safe calls are allowed; this
            // is one write(2), on a descriptor the closure itself keeps open (no allocation,
            // no lock: borrowing an fd touches no reference count).
            unsafe {
                cmd.pre_exec(move || match rustix::io::write(fd.as_fd(), b"0") {
                    Ok(_) => Ok(()),
                    Err(e) => Err(std::io::Error::from_raw_os_error(e.raw_os_error())),
                });
            }
        }
    }

    /// The started child's pid: the worker in a cgroup job, its shim in a subreaper job (the
    /// leader of a process group of its own either way).
    pub fn leader(&self) -> Option<u32> {
        self.leader
    }

    /// What tells whether a process is inside this job (for the broker's peer check).
    pub fn membership(&self) -> Membership {
        Membership {
            leaf: self.leaf.clone(),
            shim: self.shim.clone(),
        }
    }

    /// Record the started child's pid (its process group's id).
    pub fn started(&mut self, pid: u32) {
        self.leader = Some(pid);
        // the child has entered the leaf (or failed to start); the parent needs it no more
        self.procs = None;
        if let Some((report, _write)) = self.report.take() {
            // the write end goes with `_write` (the shim has its own): the pipe's end of file
            // then says that the shim is gone
            let pidfd = Pid::from_raw(pid.cast_signed()).and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
            });
            let marker = self.marker.take().filter(|m| match write_marker(m, pid) {
                Ok(()) => true,
                Err(e) => {
                    // the job runs unrecorded: a crash of the daemon now would leave its tree
                    eprintln!("room: a job's shim record {}: {e}", m.display());
                    false
                }
            });
            let shim = Arc::new(Shim {
                pid,
                pidfd,
                report,
                seen: std::sync::Mutex::new(None),
                marker,
            });
            live_set(&self.live).insert(pid, shim.clone());
            self.shim = Some(shim);
        }
    }

    /// The job's live processes (zombies excluded).
    pub fn members(&self) -> Vec<u32> {
        match (&self.leaf, &self.shim) {
            (Some(leaf), _) => cgroup_members(leaf),
            (None, Some(shim)) if shim.outcome().is_none() => descendants(shim.pid),
            (None, _) => Vec::new(),
        }
    }

    /// Kill every process of the job and wait (at most `wait_ms`) until none is observed.
    /// A cgroup leaf seen empty is removed.
    pub fn stop(&mut self, wait_ms: u64) -> Stopped {
        let s = self.stop_once(wait_ms);
        if s.confirmed_empty
            && let Some(shim) = &self.shim
        {
            live_set(&self.live).remove(&shim.pid);
            shim.forget();
        }
        s
    }

    fn stop_once(&mut self, wait_ms: u64) -> Stopped {
        match (&self.leaf, &self.shim) {
            (Some(leaf), _) => {
                let s = stop_cgroup(leaf, wait_ms);
                if s.confirmed_empty && std::fs::remove_dir(leaf).is_ok() {
                    // nothing is left to look at: `members` is empty from now on
                    self.leaf = None;
                    self.leader = None;
                }
                s
            }
            (None, Some(shim)) => shim.stop(wait_ms),
            (None, None) => Stopped {
                kind: self.kind,
                confirmed_empty: true,
                remaining: Vec::new(),
                waited_ms: 0,
            },
        }
    }
}

/// Why `pid` runs inside a Room job of some daemon (this one's or any other's), as far as the
/// kernel can tell: such a process is never an owner console, whatever its uid. None: no sign
/// of a job.
///
/// The signs, each one a thing a process inside a job cannot undo: a user or PID namespace
/// other than this process's (every confined worker and check has its own); a cgroup below a
/// daemon's job base (`room-<32 hex>/<leaf>`; a confined worker cannot name another cgroup to
/// move to); an ancestor that is a job's shim, door or init (named so before the worker starts,
/// and a process can rename only itself).
pub fn foreign_job(pid: u32) -> Option<String> {
    if pid == 0 {
        return Some("the peer's pid is not visible from here".into());
    }
    let ns = |p: &str, kind: &str| std::fs::read_link(format!("/proc/{p}/ns/{kind}")).ok();
    for kind in ["user", "pid"] {
        let (mine, theirs) = (ns("self", kind), ns(&pid.to_string(), kind));
        if theirs.is_none() || mine != theirs {
            return Some(format!("the peer is in another {kind} namespace"));
        }
    }
    if let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        let in_base = cg.lines().any(|l| {
            let path = l.splitn(3, ':').nth(2).unwrap_or("");
            let parts: Vec<&str> = path.split('/').collect();
            parts.iter().enumerate().any(|(i, c)| {
                i + 1 < parts.len()
                    && !parts[i + 1].is_empty()
                    && c.strip_prefix("room-")
                        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            })
        });
        if in_base {
            return Some("the peer is in a Room job's cgroup".into());
        }
    }
    for a in std::iter::once(pid).chain(ancestors(pid)) {
        let comm = std::fs::read_to_string(format!("/proc/{a}/comm")).unwrap_or_default();
        if a != pid && comm.trim_end().starts_with(crate::shim::JOB_NAME_PREFIX) {
            return Some(format!(
                "the peer runs below a Room job's {}",
                comm.trim_end()
            ));
        }
    }
    None
}

/// A shim's record: its pid and its start time (clock ticks after boot, `/proc/<pid>/stat`
/// field 22), which tells it from a later process given the same pid. Written and synced
/// before the worker's launch goes on.
fn write_marker(path: &Path, pid: u32) -> std::io::Result<()> {
    let start = start_time(pid).ok_or_else(|| std::io::Error::other("the shim is gone"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::File::create(path)?;
    f.write_all(format!("{pid} {start}\n").as_bytes())?;
    f.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn read_marker(path: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut f = text.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// A process's start time (`/proc/<pid>/stat` field 22), None when it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the parenthesised command start at field 3 (state)
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// End everything below the live shim `pid` (start time `start`), then the shim: each process
/// below it is killed (a stopped or frozen one too: SIGKILL reaches it) until a walk finds
/// none while the shim still runs (an orphan of its tree is re-parented to it, so nothing can
/// leave the walk's sight), at most `wait_ms`. Zero processes observed, or what was left.
fn end_tree(pid: u32, start: u64, wait_ms: u64) -> Option<Stopped> {
    let begun = Instant::now();
    let mut thawer = Thawer::new();
    let shim = Pid::from_raw(pid.cast_signed())?;
    loop {
        if start_time(pid) != Some(start) {
            // the shim went while its tree was being ended: what is left is out of sight
            return Some(Stopped {
                kind: JobKind::Subreaper,
                confirmed_empty: false,
                remaining: Vec::new(),
                waited_ms: elapsed_ms(begun),
            });
        }
        let below = descendants(pid);
        if below.is_empty() {
            let _ = kill_process(shim, Signal::KILL);
            return Some(Stopped {
                kind: JobKind::Subreaper,
                confirmed_empty: true,
                remaining: Vec::new(),
                waited_ms: elapsed_ms(begun),
            });
        }
        if begun.elapsed() > Duration::from_millis(wait_ms) {
            return Some(Stopped {
                kind: JobKind::Subreaper,
                confirmed_empty: false,
                remaining: below,
                waited_ms: elapsed_ms(begun),
            });
        }
        for p in &below {
            if let Some(p) = Pid::from_raw(p.cast_signed()) {
                let _ = kill_process(p, Signal::KILL);
            }
        }
        thawer.tick(|| below);
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

/// Ancestors `ancestors` climbs at most (a tree deeper than this is not followed up).
const ANCESTRY_MAX: usize = 4_096;

/// A subreaper job's shim, as the daemon sees it: its pid (held by `pidfd` while the daemon
/// has not reaped it) and the read end of its report pipe.
#[derive(Debug)]
struct Shim {
    pid: u32,
    pidfd: Option<OwnedFd>,
    report: OwnedFd,
    /// What the report said, once it said anything: true for the shim's `EMPTY` byte, false
    /// for an end of file without it (the shim was killed).
    seen: std::sync::Mutex<Option<bool>>,
    /// Its durable record (`Jobs::markers`), while its tree is not seen empty.
    marker: Option<PathBuf>,
}

impl Shim {
    /// Its tree was seen empty: its record goes.
    fn forget(&self) {
        if let Some(m) = &self.marker {
            let _ = std::fs::remove_file(m);
        }
    }

    /// Whether the shim has reported: Some(true) when it saw no child left, Some(false) when
    /// it is gone without saying so, None while it runs.
    fn outcome(&self) -> Option<bool> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.is_none() {
            let mut b = [0u8; 1];
            *seen = match rustix::io::read(&self.report, &mut b) {
                Ok(1) => Some(b[0] == crate::shim::EMPTY),
                Ok(_) => Some(false),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => None,
                Err(_) => Some(false),
            };
        }
        *seen
    }

    /// Ask the shim to end its tree (SIGTERM) and wait, at most `wait_ms`, for its report.
    fn stop(&self, wait_ms: u64) -> Stopped {
        let start = Instant::now();
        if self.outcome().is_none() {
            // the pidfd names this shim even if its pid were reaped and reused meanwhile
            match &self.pidfd {
                Some(fd) => {
                    let _ = rustix::process::pidfd_send_signal(fd, Signal::TERM);
                }
                None => {
                    if let Some(p) = Pid::from_raw(self.pid.cast_signed()) {
                        let _ = kill_process(p, Signal::TERM);
                    }
                }
            }
        }
        let mut thawer = Thawer::new();
        loop {
            let out = self.outcome();
            if out.is_some() || start.elapsed() > Duration::from_millis(wait_ms) {
                let confirmed_empty = out == Some(true);
                return Stopped {
                    kind: JobKind::Subreaper,
                    confirmed_empty,
                    remaining: if out.is_none() {
                        descendants(self.pid)
                    } else {
                        Vec::new()
                    },
                    waited_ms: elapsed_ms(start),
                };
            }
            thawer.tick(|| descendants(self.pid));
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }
}

/// How long a stop waits before it looks for frozen processes, and then how often.
const THAW_EVERY_MS: u64 = 100;

/// A stop that has waited a while thaws what it finds frozen among its members, every
/// `THAW_EVERY_MS`: a process a cgroup freezer holds takes no signal, not even SIGKILL, until
/// it is thawed.
struct Thawer(Instant);

impl Thawer {
    fn new() -> Thawer {
        Thawer(Instant::now() + Duration::from_millis(THAW_EVERY_MS))
    }

    fn tick(&mut self, members: impl FnOnce() -> Vec<u32>) {
        if Instant::now() >= self.0 {
            thaw(&members());
            self.0 = Instant::now() + Duration::from_millis(THAW_EVERY_MS);
        }
    }
}

/// Thaw every frozen cgroup (v1 freezer or v2 `cgroup.freeze`) that holds one of `pids`.
/// Returns how many were thawed.
pub fn thaw(pids: &[u32]) -> usize {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let v1 = freezer_v1_mount(&mountinfo);
    let v2 = cgroup2_mount(&mountinfo);
    let mut thawed = std::collections::BTreeSet::new();
    for pid in pids.iter().take(STALE_LEAVES_MAX) {
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        for l in cg.lines() {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
            let path = path.trim().trim_start_matches('/');
            if path.split('/').any(|c| c == "..") {
                continue;
            }
            let file = match (controllers, &v1, &v2) {
                (c, Some(m), _) if c.split(',').any(|c| c == "freezer") => {
                    let st = m.join(path).join("freezer.state");
                    let frozen = std::fs::read_to_string(&st).is_ok_and(|t| t.trim() != "THAWED");
                    frozen.then_some((st, "THAWED"))
                }
                ("", _, Some(m)) => {
                    let st = m.join(path).join("cgroup.freeze");
                    let frozen = std::fs::read_to_string(&st).is_ok_and(|t| t.trim() == "1");
                    frozen.then_some((st, "0"))
                }
                _ => None,
            };
            if let Some((st, value)) = file
                && !thawed.contains(&st)
                && std::fs::write(&st, value).is_ok()
            {
                thawed.insert(st);
            }
        }
    }
    thawed.len()
}

/// The mount point of the cgroup v1 hierarchy that has the freezer controller.
fn freezer_v1_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        if r.next()? != "cgroup" {
            return None;
        }
        let opts = r.nth(1)?;
        let point = left.split_whitespace().nth(4)?;
        opts.split(',')
            .any(|o| o == "freezer")
            .then(|| PathBuf::from(unescape_mountinfo(point)))
    })
}

/// Each process's parent and whether it is a zombie, from one walk of `/proc`.
fn process_table() -> Vec<(u32, u32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((ppid, zombie)) = parent_of(pid) {
            out.push((pid, ppid, zombie));
        }
    }
    out
}

/// A process's parent and whether it is a zombie, from its stat.
fn parent_of(pid: u32) -> Option<(u32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the parenthesised command: state, ppid, …
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace();
    let state = f.next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((ppid, state == "Z"))
}

/// The live (not zombie) processes below `root`.
fn descendants(root: u32) -> Vec<u32> {
    let table = process_table();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        for t in table.iter().filter(|t| t.1 == p) {
            // a pid reused during the walk could close a loop
            if !found.contains(&t.0) {
                found.push(t.0);
            }
        }
        i += 1;
    }
    found.retain(|p| *p != root && table.iter().any(|t| t.0 == *p && !t.2));
    found
}

/// The parents of `pid` up to init, nearest first (at most `ANCESTRY_MAX`).
fn ancestors(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p = pid;
    while out.len() < ANCESTRY_MAX {
        match parent_of(p) {
            Some((pp, _)) if pp > 1 => {
                out.push(pp);
                p = pp;
            }
            _ => break,
        }
    }
    out
}

fn elapsed_ms(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `cgroup.kill`, then `populated 0` observed; where the kernel has no `cgroup.kill` (before
/// 5.14), each member is killed by pid until none is left.
fn stop_cgroup(leaf: &Path, wait_ms: u64) -> Stopped {
    let start = Instant::now();
    let mut thawer = Thawer::new();
    let killed = std::fs::OpenOptions::new()
        .write(true)
        .open(leaf.join("cgroup.kill"))
        .and_then(|mut f| f.write_all(b"1"))
        .is_ok();
    loop {
        if cgroup_empty(leaf).unwrap_or(false) {
            return Stopped {
                kind: JobKind::Cgroup,
                confirmed_empty: true,
                remaining: Vec::new(),
                waited_ms: elapsed_ms(start),
            };
        }
        if !killed {
            for pid in cgroup_members(leaf) {
                if let Some(p) = Pid::from_raw(pid as i32) {
                    let _ = kill_process(p, Signal::KILL);
                }
            }
        }
        thawer.tick(|| cgroup_members(leaf));
        if start.elapsed() > Duration::from_millis(wait_ms) {
            return Stopped {
                kind: JobKind::Cgroup,
                confirmed_empty: false,
                remaining: cgroup_members(leaf),
                waited_ms: elapsed_ms(start),
            };
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

/// `populated 0` in the leaf's `cgroup.events`: no process in it or below it. A leaf that is
/// gone is empty too: the kernel removes only an unpopulated cgroup, and nothing enters a
/// removed one (another daemon's start reaps and removes stale leaves, for one).
fn cgroup_empty(leaf: &Path) -> std::io::Result<bool> {
    match std::fs::read_to_string(leaf.join("cgroup.events")) {
        Ok(events) => Ok(events.lines().any(|l| l.trim() == "populated 0")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !leaf.exists() => Ok(true),
        Err(e) => Err(e),
    }
}

fn cgroup_members(leaf: &Path) -> Vec<u32> {
    std::fs::read_to_string(leaf.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The directory jobs of `name` are created under: this process's own cgroup on the cgroup2
/// mount (both read from /proc, never assumed), plus `room-<name>`, created if needed and
/// checked usable (a leaf can be made and entered there).
fn cgroup_base(name: &str) -> Result<(PathBuf, String), String> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err("the job base name is letters, digits, _ and - only".into());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let mount = cgroup2_mount(&mounts).ok_or("no cgroup2 file system is mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("this process has no cgroup v2 membership")?;
    let own = own.trim().trim_start_matches('/');
    if own.split('/').any(|c| c == "..") || own.ends_with(" (deleted)") {
        return Err(format!("this process's cgroup {own:?} is not usable"));
    }
    let base = mount.join(own).join(format!("room-{name}"));
    match std::fs::create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", base.display())),
    }
    if !base.join("cgroup.kill").exists() && !base.join("cgroup.procs").exists() {
        return Err(format!("{} is not a cgroup v2 directory", base.display()));
    }
    let rel = if own.is_empty() {
        format!("/room-{name}")
    } else {
        format!("/{own}/room-{name}")
    };
    Ok((base, rel))
}

/// The mount point of the cgroup2 file system in a mountinfo text (the first, when several).
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        // fields: id parent maj:min root mount-point options [optional…] - fstype source super
        let (left, right) = l.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// Every mount point of the cgroup2 file system in a mountinfo text (what a confined worker
/// must not see).
pub(crate) fn cgroup2_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mounts_of(mountinfo, "cgroup2")
}

/// Every mount point of file systems of type `fstype` in a mountinfo text.
pub(crate) fn mounts_of(mountinfo: &str, fstype: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == fstype)
                .then(|| PathBuf::from(unescape_mountinfo(mount_point)))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            // \400 and above name no byte: keep the text as it is
            match u8::try_from(v) {
                Ok(v) => out.push(v),
                Err(_) => out.extend_from_slice(&b[i..i + 4]),
            }
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_cgroup2_mount_is_read_from_mountinfo() {
        let m = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                 41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(m),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure =
            "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount("1 0 0:1 / / rw - ext4 /dev/sda rw\n"), None);
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        let procs = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                     90 27 0:21 / /run/ct\\040x/proc rw - proc proc rw\n";
        assert_eq!(
            mounts_of(procs, "proc"),
            [PathBuf::from("/proc"), PathBuf::from("/run/ct x/proc")]
        );
    }

    #[test]
    fn a_cgroup_leaf_removed_by_someone_else_is_seen_empty_at_once() {
        let jobs = Jobs::detect(&format!("gone-{}", std::process::id()));
        let Some(base) = jobs.base().map(Path::to_path_buf) else {
            return eprintln!("no cgroup v2 base here; skipped");
        };
        let mut job = jobs.create("job-gone").unwrap();
        // a stale-leaf reap of another daemon's start removed it (only an empty one can go)
        std::fs::remove_dir(job.leaf.as_ref().unwrap()).unwrap();
        let s = job.stop(5_000);
        assert!(s.confirmed_empty && s.waited_ms < 1_000, "{s:?}");
        let _ = std::fs::remove_dir(base);
    }

    #[test]
    fn bad_job_ids_are_refused() {
        let jobs = Jobs::subreapers("test");
        for id in ["", "../x", "a/b", "a b"] {
            assert!(jobs.create(id).is_err(), "{id:?}");
        }
    }

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                let st = s.rsplit(')').next().unwrap_or("").trim_start();
                !st.starts_with('Z') && !st.starts_with('X')
            })
            .unwrap_or(false)
    }

    /// A shell that starts a grandchild in a session of its own (out of its process group),
    /// prints its pid, and waits.
    #[allow(clippy::zombie_processes)] // the caller waits for it
    fn escaping(job: &mut Job, dir: &Path) -> (std::process::Child, u32) {
        let pidfile = dir.join("escaped.pid");
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(format!(
            "/usr/bin/setsid /bin/sh -c 'echo $$ > {p}; exec /usr/bin/sleep 600' & sleep 600",
            p = pidfile.display()
        ));
        job.prepare(&mut cmd);
        let child = cmd.spawn().unwrap();
        job.started(child.id());
        let start = Instant::now();
        loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return (child, pid);
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no grandchild");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_cgroup_job_ends_a_grandchild_that_left_its_process_group() {
        let jobs = Jobs::detect(&format!("test-{}", std::process::id()));
        if jobs.kind() != JobKind::Cgroup {
            // the daemon falls back to process groups here; the next test covers those
            eprintln!(
                "no cgroup v2 base here ({}); skipped",
                jobs.why_not_cgroup().unwrap_or("")
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut job = jobs.create("job-a").unwrap();
        let (mut child, escaped) = escaping(&mut job, dir.path());
        let members = job.members();
        assert!(
            members.contains(&child.id()) && members.contains(&escaped),
            "{members:?}"
        );
        let s = job.stop(5_000);
        assert_eq!(s.kind, JobKind::Cgroup);
        assert!(s.confirmed_empty, "{s:?}");
        let _ = child.wait();
        assert!(!alive(escaped), "the setsid grandchild survived its job");
        assert!(job.members().is_empty());
        let base = jobs.base().unwrap().to_path_buf();
        assert!(!base.join("job-a").exists(), "an empty leaf is removed");
        std::fs::remove_dir(base).unwrap();
    }

    #[test]
    fn stale_leaves_of_a_crashed_daemon_are_ended_at_the_next_start() {
        let name = format!("stale-{}", std::process::id());
        let jobs = Jobs::detect(&name);
        if jobs.kind() != JobKind::Cgroup {
            eprintln!("no cgroup v2 base here; skipped");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut job = jobs.create("left-behind").unwrap();
        let (mut child, escaped) = escaping(&mut job, dir.path());
        // the daemon "crashes": its Job is forgotten, the processes run on
        std::mem::forget(job);
        let again = Jobs::detect(&name);
        assert_eq!(again.reap_stale(5_000).unwrap(), 1);
        let _ = child.wait();
        assert!(!alive(escaped));
        let base = again.base().unwrap().to_path_buf();
        assert!(!base.join("left-behind").exists());
        std::fs::remove_dir(base).unwrap();
    }

    #[test]
    fn closing_subreaper_jobs_stops_the_jobs_still_running() {
        let jobs = Jobs::subreapers("forced for the test");
        let mut job = jobs.create("job-c").unwrap();
        let mut cmd = Command::new("/usr/bin/sleep");
        cmd.arg("600");
        job.prepare(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        job.started(child.id());
        let worker = wait_members(&job, 1)[0];
        // the daemon shuts down with the worker running: its job is never stopped by its launch
        assert_eq!(jobs.close(5_000).unwrap(), 1);
        let _ = child.wait();
        assert!(!alive(worker));
        assert_eq!(jobs.close(5_000).unwrap(), 0, "nothing is left to stop");
    }

    /// The job's members once there are at least `n`.
    fn wait_members(job: &Job, n: usize) -> Vec<u32> {
        let start = Instant::now();
        loop {
            let m = job.members();
            if m.len() >= n {
                return m;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "members: {m:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A job whose process sits frozen in a cgroup v1 freezer (a root worker could once put
    /// one there) still stops at zero processes: the stop thaws what it finds frozen. Both job
    /// kinds; skipped where this machine has no v1 freezer this process may write.
    #[test]
    fn a_stop_thaws_a_frozen_member_and_ends_it() {
        let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let Some(freezer) = freezer_v1_mount(&mountinfo) else {
            eprintln!("no cgroup v1 freezer here; skipped");
            return;
        };
        let cg = freezer.join(format!("room-test-{}", std::process::id()));
        if std::fs::create_dir(&cg).is_err() {
            eprintln!("the v1 freezer is not writable here; skipped");
            return;
        }
        let name = format!("{:032x}", u128::from(std::process::id()) << 64 | 0xf1);
        for jobs in [Jobs::subreapers("forced for the test"), Jobs::detect(&name)] {
            let mut job = jobs.create("job-frozen").unwrap();
            let dir = tempfile::tempdir().unwrap();
            let (mut child, escaped) = escaping(&mut job, dir.path());
            std::fs::write(cg.join("cgroup.procs"), escaped.to_string()).unwrap();
            std::fs::write(cg.join("freezer.state"), "FROZEN").unwrap();
            let start = Instant::now();
            while std::fs::read_to_string(cg.join("freezer.state"))
                .unwrap()
                .trim()
                != "FROZEN"
            {
                assert!(start.elapsed() < Duration::from_secs(5), "never froze");
                std::thread::sleep(Duration::from_millis(5));
            }
            let s = job.stop(5_000);
            assert!(s.confirmed_empty, "{:?}: {s:?}", jobs.kind());
            assert!(!alive(escaped), "the frozen process survived its stop");
            let _ = child.wait();
            let _ = jobs.close(5_000);
        }
        let _ = std::fs::remove_dir(&cg);
    }

    /// A recorded shim that a start finds gone (killed from inside its job before the crash, or
    /// ended since) leaves its job unconfirmed: its launch must not be recorded as stopped.
    #[test]
    fn a_recorded_shim_found_gone_leaves_its_job_unconfirmed() {
        let dir = tempfile::tempdir().unwrap();
        let markers = dir.path().join("jobs");
        let mut gone = Command::new("/bin/true").spawn().unwrap();
        let pid = gone.id();
        // recorded with a start time no live process of that pid has
        std::fs::create_dir_all(&markers).unwrap();
        std::fs::write(markers.join("lch_gone.shim"), format!("{pid} 1\n")).unwrap();
        gone.wait().unwrap();
        let jobs = Jobs::subreapers("forced for the test").with_markers(markers.clone());
        assert_eq!(jobs.reap_stale(1_000).unwrap(), 0);
        assert!(jobs.unconfirmed_stale().contains("lch_gone"));
        assert_eq!(
            jobs.observe_empty("lch_gone", "subreaper", Some(pid))
                .map(|s| s.confirmed_empty),
            Some(false)
        );
        assert!(
            !markers.join("lch_gone.shim").exists(),
            "nothing more to learn of it"
        );
    }

    /// A daemon's recorded shim that outlived it: the next start's reap ends its tree (a
    /// setsid grandchild included) and confirms it empty.
    #[test]
    fn a_recorded_shim_that_outlived_its_daemon_is_ended_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let markers = dir.path().join("jobs");
        let before = Jobs::subreapers("forced for the test").with_markers(markers.clone());
        let mut job = before.create("lch_left").unwrap();
        let (mut child, escaped) = escaping(&mut job, dir.path());
        assert!(markers.join("lch_left.shim").exists());
        // the daemon "crashes": its Jobs and Job are forgotten, the shim runs on
        std::mem::forget(job);
        let after = Jobs::subreapers("forced for the test").with_markers(markers.clone());
        assert_eq!(after.reap_stale(5_000).unwrap(), 1);
        assert!(!alive(escaped), "the setsid grandchild outlived the reap");
        assert!(after.unconfirmed_stale().is_empty());
        assert_eq!(
            after
                .observe_empty("lch_left", "subreaper", None)
                .map(|s| s.confirmed_empty),
            Some(true)
        );
        assert!(!markers.join("lch_left.shim").exists());
        let _ = child.wait();
    }

    /// A process below any job of any daemon is never an owner console: below a shim by
    /// the shim's name, in a cgroup job by its leaf under a daemon's base; this test process
    /// is in neither.
    #[test]
    fn a_process_of_any_job_is_foreign_and_this_process_is_not() {
        assert_eq!(foreign_job(std::process::id()), None);
        assert!(foreign_job(0).is_some(), "an unseen peer is no owner");
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::subreapers("forced for the test");
        let mut job = jobs.create("job-foreign").unwrap();
        let (mut child, escaped) = escaping(&mut job, dir.path());
        let why = foreign_job(escaped).expect("a process below a shim is foreign");
        assert!(why.contains("room-job-shim"), "{why}");
        assert!(job.stop(5_000).confirmed_empty);
        let _ = child.wait();
        // a base named as a daemon names its own: 32 hex digits
        let name = format!("{:032x}", u128::from(std::process::id()) << 64 | 0xf0);
        let jobs = Jobs::detect(&name);
        if jobs.kind() != JobKind::Cgroup {
            eprintln!("no cgroup v2 base here; the cgroup sign is not tried");
            return;
        }
        let mut job = jobs.create("job-foreign").unwrap();
        let _ = std::fs::remove_file(dir.path().join("escaped.pid"));
        let (mut child, escaped) = escaping(&mut job, dir.path());
        let why = foreign_job(escaped).expect("a process of a cgroup job is foreign");
        assert!(why.contains("cgroup"), "{why}");
        assert!(job.stop(5_000).confirmed_empty);
        let _ = child.wait();
        jobs.close(5_000).unwrap();
    }

    #[test]
    fn a_subreaper_job_ends_a_grandchild_that_left_its_process_group() {
        let jobs = Jobs::subreapers("forced for the test");
        let mut job = jobs.create("job-b").unwrap();
        assert_eq!(job.kind(), JobKind::Subreaper);
        let dir = tempfile::tempdir().unwrap();
        let (mut child, escaped) = escaping(&mut job, dir.path());
        let members = job.members();
        assert!(members.contains(&escaped), "{members:?}");
        assert!(
            !members.contains(&child.id()),
            "the shim is Room's, not the worker's"
        );
        assert!(job.membership().contains(escaped));
        assert!(jobs.holds(escaped));
        assert!(!job.membership().contains(std::process::id()));
        assert!(!jobs.holds(std::process::id()));
        let s = job.stop(5_000);
        assert_eq!(s.kind, JobKind::Subreaper);
        assert!(s.confirmed_empty, "{s:?}");
        let status = child.wait().unwrap();
        assert!(!alive(escaped), "the setsid grandchild survived its job");
        assert!(job.members().is_empty());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "the worker was killed: {status:?}"
        );
    }

    #[test]
    fn a_subreaper_job_ends_with_its_worker_and_keeps_its_exit_status() {
        let jobs = Jobs::subreapers("forced for the test");
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("left.pid");
        let mut job = jobs.create("job-d").unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(format!(
            "/usr/bin/setsid /bin/sh -c 'echo $$ > {p}; exec /usr/bin/sleep 600' & \
             while [ ! -s {p} ]; do sleep 0.01; done; exit 7",
            p = pidfile.display()
        ));
        job.prepare(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        job.started(child.id());
        // the shim leaves only when nothing of its tree is left: the worker's exit ends the rest
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(7));
        let left: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!alive(left), "what the worker left behind outlived it");
        let s = job.stop(5_000);
        assert!(s.confirmed_empty && s.remaining.is_empty(), "{s:?}");

        let mut job = jobs.create("job-e").unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg("kill -9 $$");
        job.prepare(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        job.started(child.id());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(9));
        assert!(job.stop(5_000).confirmed_empty);

        let job = jobs.create("job-f").unwrap();
        let mut cmd = Command::new("/nonexistent/program");
        job.prepare(&mut cmd);
        assert!(cmd.spawn().is_err(), "an exec failure still reaches spawn");
    }

    #[test]
    fn a_killed_shim_leaves_its_job_unconfirmed() {
        let jobs = Jobs::subreapers("forced for the test");
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("w.pid");
        let mut job = jobs.create("job-g").unwrap();
        let mut cmd = Command::new("/bin/sh");
        // the worker kills the shim above it, then stays
        cmd.arg("-c").arg(format!(
            "echo $$ > {p}; kill -9 $PPID; exec /usr/bin/sleep 600",
            p = pidfile.display()
        ));
        job.prepare(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        job.started(child.id());
        // the command holds the write end too: gone, the shim's death is an end of file
        drop(cmd);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            child.wait().unwrap().signal(),
            Some(9),
            "the shim was killed"
        );
        let s = job.stop(10_000);
        assert!(
            s.waited_ms < 10_000,
            "the end of file was seen, not a deadline: {s:?}"
        );
        assert_eq!(s.kind, JobKind::Subreaper);
        assert!(
            !s.confirmed_empty,
            "a shim gone without its report proves nothing: {s:?}"
        );
        let worker: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = kill_process(Pid::from_raw(worker as i32).unwrap(), Signal::KILL);
    }
}
