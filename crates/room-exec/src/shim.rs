//! The subreaper shim: where no cgroup can be made, a job is a process of Room's own that sits
//! between the daemon and the worker and outlives everything the worker starts.
//!
//! The shim is the daemon's direct child. Between fork and exec it becomes a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`) and forks again: the second child, in a process group of its own,
//! goes on to exec the worker; the shim never execs. Every process the worker starts stays
//! below the shim, whatever session or group it moves to: an orphan is re-parented to its
//! nearest subreaper, the shim, and not to init. The shim leaves when it has no child at all
//! (`ECHILD`), and only then writes one byte (`e`) on its report pipe: that byte is the
//! observation of zero processes. A shim that is itself killed writes nothing, and the job is
//! then unconfirmed, never assumed empty.
//!
//! The job ends with its worker, as a cgroup job does: once the worker is reaped, or on
//! SIGTERM (the daemon's stop), the shim kills the worker's group and then each child it has,
//! reaping one at a time, until none is left. Its own children cannot be recycled pids (a
//! child's pid is held until it is reaped), so nothing outside the job is ever signalled.
//!
//! Everything here runs in a child of a multi-threaded process before exec: only system calls
//! on memory prepared before the fork, no allocation, no lock (glibc's `fork` is avoided: its
//! handlers take malloc's locks).

use std::io;
use std::os::fd::RawFd;

/// The byte the shim writes when it has seen no child left.
pub(crate) const EMPTY: u8 = b'e';

const WATCHED: [libc::c_int; 5] = [
    libc::SIGCHLD,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
];

/// A plain fork by the raw `clone` system call (glibc's `fork` runs handlers that take
/// malloc's locks): the child's 0, the parent's child pid, or -1 with errno set.
///
/// # Safety
/// Call only between fork and exec, in a single-threaded child.
pub(crate) unsafe fn fork_raw() -> libc::c_long {
    let (zero, flags) = (0 as libc::c_long, libc::SIGCHLD as libc::c_long);
    // SAFETY: clone with no shared memory and no new stack is a fork
    unsafe {
        // s390x takes the new stack first and the flags second; the others flags first
        if cfg!(target_arch = "s390x") {
            libc::syscall(libc::SYS_clone, zero, flags, zero, zero, zero)
        } else {
            libc::syscall(libc::SYS_clone, flags, zero, zero, zero, zero)
        }
    }
}

/// What the process that splits off the worker reports when its tree is gone, on the write
/// end of a pipe it keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Report {
    /// A shim's: the byte `EMPTY`, once it has no child left (the daemon's observation).
    Empty(RawFd),
    /// A PID namespace init's: the worker's wait status (4 bytes, native order) for the door,
    /// which leaves as the worker did (a PID 1 cannot raise a signal on itself).
    Status(RawFd),
}

impl Report {
    fn fd(self) -> RawFd {
        match self {
            Report::Empty(fd) | Report::Status(fd) => fd,
        }
    }
}

/// Split the child: returns `Ok` in the worker (which goes on to exec); never returns in the
/// shim.
///
/// # Safety
/// Call only between fork and exec (a `pre_exec` closure), with `report` holding the write
/// end of the job's report pipe.
pub(crate) unsafe fn split(report: Report) -> io::Result<()> {
    // SAFETY: plain system calls; the caller runs them in a single-threaded child
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // blocked before the second fork: a stop's SIGTERM that arrives before the shim waits
        // stays pending (and never runs a handler inherited from the daemon)
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in WATCHED {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let pid = fork_raw();
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // the worker starts with the mask std gave the child (empty)
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            // the worker: its own group, so that a stop can end it without ending the shim
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            return Ok(());
        }
        // the name marks the process as a job's keeper: any daemon's socket refuses owner
        // standing to whatever runs below it (`job::foreign_job`); a descendant cannot rename
        // another process
        let name: &std::ffi::CStr = match report {
            Report::Empty(_) => JOB_SHIM_NAME,
            Report::Status(_) => JOB_INIT_NAME,
        };
        libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
        run(pid as libc::pid_t, report, &set)
    }
}

/// The names (`comm`) of Room's own processes above a job's worker; every one starts with
/// `JOB_NAME_PREFIX`.
pub(crate) const JOB_SHIM_NAME: &std::ffi::CStr = c"room-job-shim";
pub(crate) const JOB_INIT_NAME: &std::ffi::CStr = c"room-job-init";
pub(crate) const JOB_DOOR_NAME: &std::ffi::CStr = c"room-job-door";
pub(crate) const JOB_NAME_PREFIX: &str = "room-job-";

/// Split the child as `split` does, as the init of a PID namespace (the first process the
/// caller cloned after `unshare(CLONE_NEWPID)`): it never returns in the init, which ends
/// every process of its namespace with the worker or on a signal and writes the worker's
/// wait status on `status` (its namespace ends with it: the kernel kills every process left
/// in it).
///
/// # Safety
/// As `split`, with `status` the write end of the door's status pipe.
pub(crate) unsafe fn split_init(status: RawFd) -> io::Result<()> {
    // SAFETY: as `split`
    unsafe { split(Report::Status(status)) }
}

/// The door of a PID namespace: the process outside it whose only child is the namespace's
/// init. It holds nothing (every descriptor closed, so the worker's pipes and std's exec-error
/// pipe see their ends), dies of the signals a worker would (the init then gets SIGKILL, its
/// parent-death signal, and the namespace ends), and leaves as the init left.
///
/// # Safety
/// Call only between fork and exec, in the parent of `init`, with `status` the read end of the
/// pipe the init writes the worker's wait status on.
pub(crate) unsafe fn door(init: libc::pid_t, status: RawFd) -> ! {
    // SAFETY: system calls on stack memory only
    unsafe {
        close_all_but(status);
        libc::prctl(
            libc::PR_SET_NAME,
            JOB_DOOR_NAME.as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        // handlers inherited from the daemon must not run here
        for s in WATCHED {
            libc::signal(s, libc::SIG_DFL);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        loop {
            let mut st: libc::c_int = 0;
            let r = libc::waitpid(init, &mut st, 0);
            if r == init {
                // the init has exited, so its end is closed: the worker's status or nothing
                let mut b = [0u8; 4];
                if libc::read(status, b.as_mut_ptr().cast(), 4) == 4 {
                    exit_as(Some(libc::c_int::from_ne_bytes(b)));
                }
                exit_as(Some(st));
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                exit_as(None);
            }
        }
    }
}

/// The shim's life: watch until the worker is reaped or a stop is asked, end every child,
/// report, and leave with the worker's status.
unsafe fn run(worker: libc::pid_t, report: Report, set: &libc::sigset_t) -> ! {
    // SAFETY: system calls on stack memory only
    unsafe {
        close_all_but(report.fd());
        for s in WATCHED {
            libc::signal(s, libc::SIG_DFL);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let mut status: Option<libc::c_int> = None;
        loop {
            if reap_others(worker) {
                break;
            }
            let sig = libc::sigwaitinfo(set, std::ptr::null_mut());
            if sig > 0 && sig != libc::SIGCHLD {
                break;
            }
        }
        // the worker is not reaped yet (alive or a zombie), so its pid, and with it its group,
        // is still the job's
        libc::kill(-worker, libc::SIGKILL);
        loop {
            kill_children();
            let mut st: libc::c_int = 0;
            let r = libc::waitpid(-1, &mut st, 0);
            if r == worker {
                status = Some(st);
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                break;
            }
        }
        match (report, status) {
            (Report::Empty(fd), _) => {
                libc::write(fd, [EMPTY].as_ptr().cast(), 1);
            }
            (Report::Status(fd), Some(st)) => {
                libc::write(fd, st.to_ne_bytes().as_ptr().cast(), 4);
            }
            (Report::Status(_), None) => {}
        }
        exit_as(status)
    }
}

/// Reap every exited child but the worker, which is only looked at (`WNOWAIT`); true once the
/// worker has exited (or no child is left at all).
unsafe fn reap_others(worker: libc::pid_t) -> bool {
    loop {
        // SAFETY: system calls on stack memory
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            if r != 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                return true;
            }
            let pid = info.si_pid();
            if pid == 0 {
                return false;
            }
            if pid == worker {
                return true;
            }
            let mut st: libc::c_int = 0;
            libc::waitpid(pid, &mut st, 0);
        }
    }
}

/// SIGKILL every child listed in `/proc/thread-self/children` (a subreaper's orphans are its
/// children too). Without that file (a kernel without CONFIG_PROC_CHILDREN) only the worker's
/// group was ended, and a stop that cannot finish stays unconfirmed.
unsafe fn kill_children() {
    const PATH: &[u8] = b"/proc/thread-self/children\0";
    // SAFETY: system calls on a static path and a stack buffer
    unsafe {
        let fd = libc::open(PATH.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let mut buf = [0u8; 512];
        let mut pid: libc::pid_t = 0;
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            for &b in &buf[..n as usize] {
                if b.is_ascii_digit() {
                    pid = pid
                        .saturating_mul(10)
                        .saturating_add(libc::pid_t::from(b - b'0'));
                } else {
                    if pid > 0 {
                        libc::kill(pid, libc::SIGKILL);
                    }
                    pid = 0;
                }
            }
        }
        if pid > 0 {
            libc::kill(pid, libc::SIGKILL);
        }
        libc::close(fd);
    }
}

/// Close every descriptor but `keep`: the shim must hold no pipe of the worker's (nor std's
/// exec-error pipe, which would keep `spawn` waiting).
unsafe fn close_all_but(keep: RawFd) {
    let keep = keep.max(0) as libc::c_uint;
    // SAFETY: closing descriptors this process owns
    unsafe {
        let low = if keep > 0 {
            libc::syscall(
                libc::SYS_close_range,
                0 as libc::c_uint,
                keep - 1,
                0 as libc::c_uint,
            )
        } else {
            0
        };
        let high = libc::syscall(
            libc::SYS_close_range,
            keep + 1,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
        if low == 0 && high == 0 {
            return;
        }
        // before close_range (Linux 5.9): one by one, up to the descriptor limit
        let mut lim: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            4_096
        };
        for fd in 0..max {
            if fd as libc::c_uint != keep {
                libc::close(fd);
            }
        }
    }
}

/// Leave as the worker left: its exit code, or its signal raised again (with no core dump).
unsafe fn exit_as(status: Option<libc::c_int>) -> ! {
    // SAFETY: system calls ending this process
    unsafe {
        let Some(st) = status else { libc::_exit(125) };
        if libc::WIFEXITED(st) {
            libc::_exit(libc::WEXITSTATUS(st));
        }
        if libc::WIFSIGNALED(st) {
            let sig = libc::WTERMSIG(st);
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(125)
    }
}
