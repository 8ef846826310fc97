//! Linux process supervision for Room. It owns two things: running an acceptance `command`
//! check the way the seed demands (an absolute program, the exact arguments, no shell, no PATH
//! lookup, a bounded time), so that the engine can measure work without knowing what a process
//! is; and owned jobs (`job`: a cgroup v2 leaf per worker, or its process group where no
//! cgroup can be made), so that a stopped worker is observed gone. The observer, the stop
//! outbox and the broker arrive here with active cancellation.
//!
//! Each run starts in a process group of its own. At the deadline, and again once the program
//! exits, the whole group is killed: a check must not leave a grandchild running, and a
//! grandchild holding the output pipes must not hang the caller.

pub mod bridge;
pub mod check;
pub mod confine;
pub mod job;
pub mod proposal;
mod shim;
pub mod staging;
pub mod stop;
pub mod tree;

use room_core::{RunOutcome, RunRequest, Runner};
use rustix::process::{Pid, Signal, kill_process_group};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of each output stream kept for the result (the end, where errors usually are).
pub const OUTPUT_TAIL_BYTES_MAX: usize = 2_048;
/// The environment a check runs with: nothing of the daemon's but these.
pub(crate) const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How long to wait for the output readers after the group is gone.
pub(crate) const READER_GRACE_MS: u64 = 200;

/// Runs acceptance commands as plain child processes in a process group of their own,
/// unconfined: for benchmarks and tools that run no daemon. The daemon runs its checks with
/// `check::ConfinedRunner` (an owned job, the worker's confinement).
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessRunner;

impl Runner for ProcessRunner {
    fn run(&self, req: &RunRequest) -> std::io::Result<RunOutcome> {
        if !req.program.is_absolute() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the program must be an absolute path",
            ));
        }
        let started = Instant::now();
        let mut cmd = Command::new(&req.program);
        cmd.args(&req.args)
            .current_dir(&req.cwd)
            .env_clear()
            .env("PATH", PATH)
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
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn()?;
        crate::feed(child.stdin.take(), &req.stdin);
        let pgid = Pid::from_raw(i32::try_from(child.id()).expect("pids fit i32"))
            .expect("a spawned child has a positive pid");
        let out = tail_reader(child.stdout.take(), req.stdout_bytes_max);
        let err = tail_reader(child.stderr.take(), 0);
        let deadline = started + Duration::from_millis(req.timeout_ms);
        let mut pause = Duration::from_millis(1);
        let (status, timed_out) = loop {
            if let Some(s) = child.try_wait()? {
                break (Some(s), false);
            }
            let now = Instant::now();
            if now >= deadline {
                break (None, true);
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        };
        // the group outlives its leader if a descendant is still in it; end them all
        let _ = kill_process_group(pgid, Signal::KILL);
        let group_empty = stop_group(pgid.as_raw_pid().cast_unsigned(), READER_GRACE_MS);
        let status = match status {
            Some(s) => s,
            None => child.wait()?,
        };
        let grace = Instant::now() + Duration::from_millis(READER_GRACE_MS);
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
            // what left the group (setsid) is not seen here: this runner holds no job
            job_empty: group_empty,
            confinement: "process_group".into(),
        })
    }
}

/// Write `bytes` to a child's standard input from a thread of its own (a child that does not
/// read them cannot stall the caller's deadline), then close it.
pub(crate) fn feed(stdin: Option<std::process::ChildStdin>, bytes: &[u8]) {
    if let Some(mut w) = stdin {
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            use std::io::Write;
            // a child that exits before reading all of it closes the pipe: not an error here
            let _ = w.write_all(&bytes);
        });
    }
}

/// What a reader keeps of one stream: its tail, and its head when asked.
#[derive(Default)]
struct Kept {
    tail: Vec<u8>,
    head: Vec<u8>,
}

pub(crate) struct Tail {
    buf: Arc<Mutex<Kept>>,
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl Tail {
    /// The kept tail, waiting until `grace` at most for the reader to reach the end.
    pub(crate) fn finish(self, grace: Instant) -> String {
        self.finish_with_head(grace).0
    }

    /// The kept tail and head (see `tail_reader`).
    pub(crate) fn finish_with_head(self, grace: Instant) -> (String, Vec<u8>) {
        while !self.done.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut k = self.buf.lock().expect("tail lock");
        let head = std::mem::take(&mut k.head);
        (String::from_utf8_lossy(&k.tail).into_owned(), head)
    }
}

/// Read `src` to its end on a thread of its own, keeping its last `OUTPUT_TAIL_BYTES_MAX`
/// bytes and, when `head_bytes_max` is not 0, its first `head_bytes_max + 1` (one more says
/// the stream was longer than asked).
pub(crate) fn tail_reader(src: Option<impl Read + Send + 'static>, head_bytes_max: usize) -> Tail {
    let buf = Arc::new(Mutex::new(Kept::default()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(src.is_none()));
    let head_max = if head_bytes_max == 0 {
        0
    } else {
        head_bytes_max.saturating_add(1)
    };
    if let Some(mut src) = src {
        let (b, d) = (buf.clone(), done.clone());
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = src.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let mut k = b.lock().expect("tail lock");
                let room = head_max - k.head.len();
                k.head.extend_from_slice(&chunk[..n.min(room)]);
                k.tail.extend_from_slice(&chunk[..n]);
                if k.tail.len() > OUTPUT_TAIL_BYTES_MAX {
                    let cut = k.tail.len() - OUTPUT_TAIL_BYTES_MAX;
                    k.tail.drain(..cut);
                }
            }
            d.store(true, std::sync::atomic::Ordering::Release);
        });
    }
    Tail { buf, done }
}

/// The processes of group `pgid` still alive, by a walk of `/proc` (each process's stat names
/// its group). A worker's group is quiescent only when this is empty: a kill request alone is
/// never taken for quiescence.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // fields after the parenthesised command: state, ppid, pgrp, …
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // a zombie has exited: it holds no resources but its exit status
        if fields.first() == Some(&"Z") {
            continue;
        }
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Kill every process of group `pgid` and wait (at most `wait_ms`) until none is left; true
/// when the group was seen empty.
pub fn stop_group(pgid: u32, wait_ms: u64) -> bool {
    let start = Instant::now();
    loop {
        if group_members(pgid).is_empty() {
            return true;
        }
        if let Some(p) = Pid::from_raw(pgid as i32) {
            let _ = kill_process_group(p, Signal::KILL);
        }
        if start.elapsed() > Duration::from_millis(wait_ms) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn req(program: &str, args: &[&str], timeout_ms: u64) -> RunRequest {
        RunRequest {
            program: PathBuf::from(program),
            args: args.iter().map(|s| s.to_string()).collect(),
            cwd: PathBuf::from("/"),
            timeout_ms,
            ..Default::default()
        }
    }

    #[test]
    fn stdin_is_fed_then_closed() {
        let mut r = req("/bin/cat", &[], 10_000);
        r.stdin = b"a patch\n".to_vec();
        let out = ProcessRunner.run(&r).unwrap();
        assert_eq!(out.exit_code, Some(0), "cat ends at the end of its input");
        assert_eq!(out.stdout_tail, "a patch\n");
        // without input, stdin is empty (not the caller's)
        let out = ProcessRunner.run(&req("/bin/cat", &[], 10_000)).unwrap();
        assert_eq!((out.exit_code, out.stdout_tail.as_str()), (Some(0), ""));
    }

    #[test]
    fn exit_codes_and_output_come_back() {
        let r = ProcessRunner
            .run(&req(
                "/bin/sh",
                &["-c", "echo out; echo err >&2; exit 3"],
                10_000,
            ))
            .unwrap();
        assert_eq!(r.exit_code, Some(3));
        assert!(!r.timed_out);
        assert_eq!(r.stdout_tail, "out\n");
        assert_eq!(r.stderr_tail, "err\n");
    }

    #[test]
    fn the_deadline_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("grandchild-alive");
        // a grandchild that would write the marker after the deadline
        let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let r = ProcessRunner
            .run(&req("/bin/sh", &["-c", &script], 300))
            .unwrap();
        assert!(r.timed_out);
        assert_eq!(r.exit_code, None);
        assert_eq!(r.signal, Some(9));
        std::thread::sleep(Duration::from_millis(2_500));
        assert!(!marker.exists(), "a grandchild survived the deadline");
    }

    #[test]
    fn relative_programs_are_refused_and_missing_ones_fail() {
        assert!(ProcessRunner.run(&req("sh", &[], 1_000)).is_err());
        let e = ProcessRunner
            .run(&req("/nonexistent/program", &[], 1_000))
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn only_the_tail_of_long_output_is_kept() {
        let r = ProcessRunner
            .run(&req(
                "/bin/sh",
                &["-c", "head -c 100000 /dev/zero | tr '\\0' a; echo END"],
                10_000,
            ))
            .unwrap();
        assert_eq!(r.stdout_tail.len(), OUTPUT_TAIL_BYTES_MAX);
        assert!(r.stdout_tail.ends_with("aEND\n"));
    }

    #[test]
    fn the_head_of_the_output_is_kept_whole_when_asked_and_one_byte_more_says_it_was_longer() {
        let mut r = req(
            "/bin/sh",
            &["-c", "head -c 10000 /dev/zero | tr '\\0' a; echo END"],
            10_000,
        );
        r.stdout_bytes_max = 20_000;
        let out = ProcessRunner.run(&r).unwrap();
        assert_eq!(out.stdout.len(), 10_004);
        assert!(out.stdout.ends_with(b"aEND\n"));
        r.stdout_bytes_max = 100;
        let out = ProcessRunner.run(&r).unwrap();
        assert_eq!(
            out.stdout.len(),
            101,
            "one byte more than asked: it was longer"
        );
        r.stdout_bytes_max = 0;
        assert!(ProcessRunner.run(&r).unwrap().stdout.is_empty());
    }
}
