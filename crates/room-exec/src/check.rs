//! Acceptance checks and destination probes, run as workers are: each in an owned job of its
//! own (a cgroup v2 leaf or a subreaper shim), confined where the machine allows it (the
//! worker's mount and PID namespaces: no state directory, no owner socket, no other daemon's
//! state directory or bootstrap, the project read-only unless the check declares a write, no
//! network unless it declares one), under its deadline, and ended at zero processes whatever
//! way it ends. A check never carries owner standing: a process of its job is a worker to any
//! socket of the daemon, and confined it sees nothing of Room at all.
//!
//! The engine knows none of this: it hands a `RunRequest` to the `Runner` trait, and this is
//! the daemon's runner.

use crate::confine::{Confinement, Support};
use crate::job::Jobs;
use room_core::{RunOutcome, RunRequest, Runner};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the stop at a run's end may wait for its job to be seen empty.
pub const CHECK_STOP_WAIT_MS: u64 = 5_000;

/// Directories to hide from a confined process, listed again for each one (registrations
/// change while the daemon runs).
#[derive(Clone)]
pub struct HiddenDirs(std::sync::Arc<dyn Fn() -> Vec<PathBuf> + Send + Sync>);

impl HiddenDirs {
    pub fn new(list: impl Fn() -> Vec<PathBuf> + Send + Sync + 'static) -> HiddenDirs {
        HiddenDirs(std::sync::Arc::new(list))
    }

    /// None at all.
    pub fn none() -> HiddenDirs {
        HiddenDirs::new(Vec::new)
    }

    pub fn list(&self) -> Vec<PathBuf> {
        (self.0)()
    }
}

impl std::fmt::Debug for HiddenDirs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HiddenDirs")
    }
}

/// What the runner needs of its daemon: where jobs are made and how workers are confined.
#[derive(Debug, Clone)]
pub struct CheckEnv {
    /// The daemon's state directory (hidden from every run).
    pub state_dir: PathBuf,
    /// The daemon's jobs: the same set its socket asks `holds` of, so a run's process is a
    /// worker there, never the owner.
    pub jobs: Jobs,
    /// What the confinement probe found; none: the machine allows no namespaces, and runs
    /// are held by their job only.
    pub support: Option<Support>,
    /// Directories no run may see besides the state directory (other daemons' state
    /// directories, the bootstraps' directories), read again for each run.
    pub hidden: HiddenDirs,
}

/// The daemon's `Runner` (see the module comment).
#[derive(Debug, Clone)]
pub struct ConfinedRunner {
    env: CheckEnv,
}

impl ConfinedRunner {
    pub fn new(env: CheckEnv) -> ConfinedRunner {
        ConfinedRunner { env }
    }

    /// How runs are confined here, as a result's detail names it.
    fn confinement_name(&self) -> &'static str {
        match &self.env.support {
            Some(s) if s.no_pid_namespace.is_none() => "namespaces",
            Some(_) => "namespaces_without_pid",
            None => "job_only",
        }
    }

    /// A fresh run id and its directory `<state>/workers/<id>` (what the confinement binds
    /// back inside the hidden state directory; empty, and removed after the run).
    fn run_dir(&self) -> std::io::Result<(String, PathBuf)> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for _ in 0..16 {
            let id = format!(
                "chk-{}-{}-{nanos:x}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            );
            let dir = self.env.state_dir.join("workers").join(&id);
            match std::fs::DirBuilder::new()
                .recursive(false)
                .mode(0o700)
                .create(&dir)
            {
                Ok(()) => return Ok((id, dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(self.env.state_dir.join("workers"))?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other("no fresh directory for a check run"))
    }

    fn confine(&self, id: &str, req: &RunRequest, cmd: &mut Command) -> std::io::Result<()> {
        let Some(support) = &self.env.support else {
            return Ok(());
        };
        let mut c = Confinement::for_check(&self.env.state_dir, id)?.cwd(&req.cwd)?;
        if support.no_pid_namespace.is_some() {
            c = c.without_pid_namespace();
        }
        if !req.network {
            c = c.without_network();
        }
        if let Some(root) = &req.project {
            if !req.project_write {
                c = c.read_only(root)?;
            } else if root.starts_with(&self.env.state_dir) {
                // a working tree Room made beneath the state directory (its `trees/`)
                c = c.writable_within(root)?;
            }
        }
        c = c.hiding(&self.env.hidden.list())?;
        c.prepare(cmd);
        Ok(())
    }
}

impl Runner for ConfinedRunner {
    fn run(&self, req: &RunRequest) -> std::io::Result<RunOutcome> {
        if !req.program.is_absolute() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the program must be an absolute path",
            ));
        }
        let (id, dir) = self.run_dir()?;
        let ran = self.run_in(&id, req);
        let _ = std::fs::remove_dir(&dir);
        ran
    }
}

impl ConfinedRunner {
    fn run_in(&self, id: &str, req: &RunRequest) -> std::io::Result<RunOutcome> {
        let started = Instant::now();
        let mut cmd = Command::new(&req.program);
        cmd.args(&req.args)
            .current_dir(&req.cwd)
            .env_clear()
            .env("PATH", crate::PATH)
            .env("LANG", "C.UTF-8")
            .stdin(if req.stdin.is_empty() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(home) = std::env::var_os("HOME") {
            cmd.env("HOME", home);
        }
        let mut job = self.env.jobs.create(id)?;
        job.prepare(&mut cmd);
        if let Err(e) = self.confine(id, req, &mut cmd) {
            job.stop(CHECK_STOP_WAIT_MS);
            return Err(e);
        }
        let spawned = cmd.spawn();
        // the command holds the leaf's cgroup.procs open for the child; no longer needed
        drop(cmd);
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                job.stop(CHECK_STOP_WAIT_MS);
                return Err(e);
            }
        };
        job.started(child.id());
        crate::feed(child.stdin.take(), &req.stdin);
        let out = crate::tail_reader(child.stdout.take(), req.stdout_bytes_max);
        let err = crate::tail_reader(child.stderr.take(), 0);
        let deadline = started + Duration::from_millis(req.timeout_ms);
        let mut pause = Duration::from_millis(1);
        let waited = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Ok((Some(s), false)),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                break Ok((None, true));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        };
        // whatever way it ended, nothing it started outlives it: the job is stopped and must
        // be seen empty (a setsid grandchild, a double fork, a frozen tree)
        let stopped = job.stop(CHECK_STOP_WAIT_MS);
        let (status, timed_out) = waited?;
        let status = match status {
            Some(s) => s,
            None => child.wait()?,
        };
        let grace = Instant::now() + Duration::from_millis(crate::READER_GRACE_MS);
        let (stdout_tail, stdout) = out.finish_with_head(grace);
        use std::os::unix::process::ExitStatusExt;
        Ok(RunOutcome {
            exit_code: if timed_out { None } else { status.code() },
            signal: status.signal(),
            timed_out,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            stdout_tail,
            stderr_tail: err.finish(grace),
            stdout,
            job_empty: stopped.confirmed_empty,
            confinement: self.confinement_name().into(),
        })
    }
}
