//! Worker confinement: a launched worker never sees the state directory, so it can neither
//! reach the owner's socket nor read `control.db`, journals or other workers' files. Its only
//! road to Room is its launch's broker socket.
//!
//! Between fork and exec the child enters a mount namespace of its own (with a user namespace
//! mapping only its own uid when the daemon is not root), makes every mount private (nothing
//! it mounts reaches the machine), and mounts an empty tmpfs over the state directory. Inside
//! that tmpfs it binds back its own worker directory
//! (`workers/<launch>/`, where its logs and its broker socket are) and, at the path of the
//! daemon's socket (`room.sock`), its broker socket; and, where the launch has one, the staged
//! bridge (`bridge/room-<sha256>`, Room's binary) bound read-only at its path, checked to be
//! the very file that was staged. Every client that follows
//! `ROOM_SOCKET`/`ROOM_STATE_DIR` therefore reaches the broker, which admits only processes of
//! the launch's job and only the launch's own credential.
//!
//! The child also enters a cgroup namespace rooted at its job's leaf (it has entered the leaf
//! by then), and every cgroup2 mount is hidden under an empty tmpfs: it can name no cgroup
//! outside its job, so it cannot move itself out of it. A worker that is root (the daemon is)
//! keeps the capabilities to undo a mount; one that is not loses them at its exec.

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// Trees inside the state directory one view binds back at most.
pub const WITHIN_TREES_MAX: usize = 4;

/// What the child needs, prepared before fork (nothing is allocated after it).
#[derive(Debug, Clone)]
struct Prepared {
    root: bool,
    /// A network namespace of its own too: no interface but a down loopback.
    no_network: bool,
    /// Trees the worker sees read-only (a project it may only change through proposals),
    /// each with the mount flags it already has (a user namespace may add flags, never drop
    /// them).
    read_only: Vec<(CString, MountFlags)>,
    /// Trees inside the state directory's `trees/` (a collaboration's working trees) bound
    /// back at their paths beneath its tmpfs: each path, the directories to make for it
    /// there (outermost first), whether the worker may write in it, and the mount flags it
    /// already has. At most `WITHIN_TREES_MAX` (held in a fixed array in the child).
    within: Vec<(CString, Vec<CString>, bool, MountFlags)>,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    state: CString,
    workers: CString,
    worker: CString,
    socket: CString,
    /// The launch's broker socket, bound at `socket`; none for a check or probe, which has no
    /// road to Room at all.
    broker: Option<CString>,
    /// The cgroup mounts (v2 and v1), proc mounts other than `/proc`, and the other paths
    /// the view leaves out (other daemons' state directories, the bootstrap's directory), to
    /// hide under an empty read-only tmpfs (read before the fork).
    hidden_mounts: Vec<CString>,
    /// A PID namespace of its own, with its own `/proc` (see `enter_pid_namespace`).
    pid_namespace: bool,
    /// A root daemon's maps of its worker's user namespace: every uid and gid range the
    /// daemon's own namespace maps, each to itself.
    uid_map_all: Vec<u8>,
    gid_map_all: Vec<u8>,
    /// Where the worker starts, entered again once the mounts are made (std enters it
    /// before them, on the machine's tree beneath).
    cwd: Option<CString>,
    /// The staged bridge (a file inside the state directory, in a directory of its own
    /// there), bound read-only at its own path, with the mount flags it already has, and the
    /// device and inode it must still have when the child opens it.
    bridge: Option<(CString, CString, MountFlags, (u64, u64))>,
}

/// Each range of a `uid_map`/`gid_map` text (inside, outside, count) mapped to itself, as a
/// map to write for a child namespace.
fn identity_map(own: &str) -> Vec<u8> {
    let mut out = String::new();
    for l in own.lines() {
        let mut f = l.split_whitespace();
        if let (Some(inside), Some(_), Some(count)) = (f.next(), f.next(), f.next()) {
            out.push_str(&format!("{inside} {inside} {count}\n"));
        }
    }
    out.into_bytes()
}

/// What the machine lets a confined worker have (`Confinement::probe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Support {
    /// Why a worker cannot have a PID namespace of its own here, when it cannot (it is then
    /// confined without one, and sees the machine's processes in `/proc`).
    pub no_pid_namespace: Option<String>,
}

/// How a worker's view of the state directory is narrowed (see the module comment).
#[derive(Debug, Clone)]
pub struct Confinement {
    p: Arc<Prepared>,
}

fn cstr(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with a NUL byte")
    })
}

impl Confinement {
    /// The view of a worker whose directory is `<state>/workers/<launch>` and whose broker
    /// socket is `broker.sock` in it; `socket` is the daemon's socket inside `state`.
    pub fn new(state: &Path, launch: &str, socket: &Path) -> std::io::Result<Confinement> {
        let workers = state.join("workers");
        let worker = workers.join(launch);
        if !socket.starts_with(state) || launch.contains('/') || launch.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the socket must be inside the state directory and the launch a plain name",
            ));
        }
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let mut mounts = crate::job::cgroup2_mounts(&mountinfo);
        // a v1 hierarchy too: its freezer can freeze a process out of reach of a stop, and
        // its other controllers name cgroups outside the job
        mounts.extend(crate::job::mounts_of(&mountinfo, "cgroup"));
        // another proc mount than /proc (a container runtime's tree, say) would show the
        // machine's processes past the worker's own /proc
        mounts.extend(
            crate::job::mounts_of(&mountinfo, "proc")
                .into_iter()
                .filter(|m| !m.starts_with("/proc")),
        );
        mounts.sort();
        mounts.dedup();
        // one beneath another is hidden with it (and its mount point is gone under the tmpfs)
        let outer: Vec<std::path::PathBuf> = mounts
            .iter()
            .filter(|m| !mounts.iter().any(|o| o != *m && m.starts_with(o)))
            .cloned()
            .collect();
        let hidden_mounts = outer
            .iter()
            .map(|m| cstr(m))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Confinement {
            p: Arc::new(Prepared {
                root: uid == 0,
                no_network: false,
                read_only: Vec::new(),
                within: Vec::new(),
                uid_map: format!("{uid} {uid} 1").into_bytes(),
                gid_map: format!("{gid} {gid} 1").into_bytes(),
                state: cstr(state)?,
                workers: cstr(&workers)?,
                worker: cstr(&worker)?,
                socket: cstr(socket)?,
                broker: Some(cstr(&worker.join("broker.sock"))?),
                hidden_mounts,
                pid_namespace: true,
                uid_map_all: identity_map(&std::fs::read_to_string("/proc/self/uid_map")?),
                gid_map_all: identity_map(&std::fs::read_to_string("/proc/self/gid_map")?),
                cwd: None,
                bridge: None,
            }),
        })
    }

    /// The view of an acceptance check or a destination probe named `id` (its directory is
    /// `<state>/workers/<id>`, made by the caller): as a worker's, but with no broker, so
    /// nothing of Room answers at the daemon's socket path.
    pub fn for_check(state: &Path, id: &str) -> std::io::Result<Confinement> {
        let c = Confinement::new(state, id, &state.join("room.sock"))?;
        let mut p = (*c.p).clone();
        p.broker = None;
        Ok(Confinement { p: Arc::new(p) })
    }

    /// Hide each of `dirs` too (another daemon's state directory, the directory of a
    /// bootstrap file), under an empty read-only tmpfs. A path that is not a directory now,
    /// or that holds the state directory, the working directory or a read-only tree of this
    /// view (hiding it would hide them), is left as it is.
    pub fn hiding(self, dirs: &[std::path::PathBuf]) -> std::io::Result<Confinement> {
        let as_path =
            |c: &CString| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(c.as_bytes()));
        let mut kept: Vec<std::path::PathBuf> = vec![as_path(&self.p.state)];
        kept.extend(self.p.cwd.iter().map(as_path));
        kept.extend(self.p.read_only.iter().map(|(t, _)| as_path(t)));
        let mut p = (*self.p).clone();
        for d in dirs {
            let Ok(meta) = std::fs::symlink_metadata(d) else {
                continue;
            };
            // beneath the state directory it is hidden with it (and gone under its tmpfs)
            if !meta.is_dir()
                || !d.is_absolute()
                || kept.iter().any(|k| k.starts_with(d))
                || d.starts_with(&kept[0])
            {
                continue;
            }
            let c = cstr(d)?;
            if !p.hidden_mounts.contains(&c) {
                p.hidden_mounts.push(c);
            }
        }
        // one beneath another is hidden with it: its mount point is gone under the tmpfs
        let all: Vec<std::path::PathBuf> = p.hidden_mounts.iter().map(as_path).collect();
        p.hidden_mounts.retain(|m| {
            let m = as_path(m);
            !all.iter().any(|o| *o != m && m.starts_with(o))
        });
        Ok(Confinement { p: Arc::new(p) })
    }

    /// The worker starts in `dir` (its command's current directory), entered again inside
    /// its view: a directory under the hidden state directory other than its own is not there.
    pub fn cwd(self, dir: &Path) -> std::io::Result<Confinement> {
        if !dir.is_absolute() {
            // std has entered it already: a relative one would be entered from there again
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a worker's cwd must be absolute",
            ));
        }
        let mut p = (*self.p).clone();
        p.cwd = Some(cstr(dir)?);
        Ok(Confinement { p: Arc::new(p) })
    }

    /// No PID namespace: the worker sees the machine's `/proc` (a machine that allows mount
    /// namespaces but not a PID namespace with its own `/proc`).
    pub fn without_pid_namespace(self) -> Confinement {
        let mut p = (*self.p).clone();
        p.pid_namespace = false;
        Confinement { p: Arc::new(p) }
    }

    /// No network either: the worker gets a network namespace with no interface.
    pub fn without_network(self) -> Confinement {
        let mut p = (*self.p).clone();
        p.no_network = true;
        Confinement { p: Arc::new(p) }
    }

    /// `tree` (an existing directory, such as a project root) read-only for the worker: it
    /// can read there and write nowhere in it, so a change reaches it only as a proposal the
    /// daemon applies. A tree inside the state directory's `trees/` is bound back beneath the
    /// hidden state directory, read-only.
    pub fn read_only(self, tree: &Path) -> std::io::Result<Confinement> {
        if tree.starts_with(self.state_path()) {
            return self.within(tree, false);
        }
        let flags = kept_flags(tree)?;
        let mut p = (*self.p).clone();
        p.read_only.push((cstr(tree)?, flags));
        Ok(Confinement { p: Arc::new(p) })
    }

    /// `tree`, a directory inside the state directory's `trees/` (a working tree Room made
    /// for this worker), bound back at its path beneath the hidden state directory, where the
    /// worker may write. Nothing else of the state directory comes back with it.
    pub fn writable_within(self, tree: &Path) -> std::io::Result<Confinement> {
        self.within(tree, true)
    }

    fn state_path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(self.p.state.as_bytes()))
    }

    fn within(self, tree: &Path, writable: bool) -> std::io::Result<Confinement> {
        let trees = self.state_path().join("trees");
        let invalid =
            |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_string());
        let rel = tree
            .strip_prefix(&trees)
            .map_err(|_| invalid("a tree inside the state directory must be beneath its trees/"))?;
        if rel.as_os_str().is_empty()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(invalid(
                "a tree beneath trees/ is named by plain components",
            ));
        }
        if self.p.within.len() >= WITHIN_TREES_MAX {
            return Err(invalid(
                "too many trees inside the state directory for one view",
            ));
        }
        let meta = std::fs::symlink_metadata(tree)?;
        if !meta.is_dir() {
            return Err(invalid("a tree must be a directory (not a link)"));
        }
        let mut dirs = vec![cstr(&trees)?];
        let mut at = trees.clone();
        for c in rel.components() {
            at.push(c);
            dirs.push(cstr(&at)?);
        }
        let flags = kept_flags(tree)?;
        let mut p = (*self.p).clone();
        p.within.push((cstr(tree)?, dirs, writable, flags));
        Ok(Confinement { p: Arc::new(p) })
    }

    /// The staged bridge `file` (in a directory of its own directly inside the state
    /// directory) stays at its path for the worker, read-only: the one program of the state
    /// directory it may run.
    pub fn bridge(self, file: &Path, identity: (u64, u64)) -> std::io::Result<Confinement> {
        let state = Path::new(std::ffi::OsStr::from_bytes(self.p.state.as_bytes()));
        let dir = file
            .parent()
            .filter(|d| d.parent() == Some(state) && *d != state);
        let Some(dir) = dir else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the bridge must be in a directory of its own inside the state directory",
            ));
        };
        let mut p = (*self.p).clone();
        p.bridge = Some((cstr(file)?, cstr(dir)?, kept_flags(file)?, identity));
        Ok(Confinement { p: Arc::new(p) })
    }

    /// Narrow `cmd`'s child to this view before it runs its program (after any hook added
    /// before, such as entering its job).
    pub fn prepare(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let p = self.p.clone();
        // SAFETY: between fork and exec only async-signal-safe calls are allowed: this runs
        // system calls on buffers prepared before the fork, allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || hide(&p).map_err(std::io::Error::from));
        }
    }

    /// Whether this machine lets a child narrow its view so: start `/bin/true` confined in a
    /// scratch state directory, with a PID namespace and without one.
    pub fn probe(scratch: &Path) -> Result<Support, String> {
        let with = Confinement::probe_one(scratch, true);
        let _ = std::fs::remove_dir_all(scratch);
        let Err(why) = with else {
            return Ok(Support {
                no_pid_namespace: None,
            });
        };
        let without = Confinement::probe_one(scratch, false);
        let _ = std::fs::remove_dir_all(scratch);
        without.map(|()| Support {
            no_pid_namespace: Some(why),
        })
    }

    fn probe_one(scratch: &Path, pid_namespace: bool) -> Result<(), String> {
        let launch = "probe";
        let worker = scratch.join("workers").join(launch);
        std::fs::create_dir_all(&worker).map_err(|e| e.to_string())?;
        let socket = scratch.join("room.sock");
        std::fs::write(worker.join("broker.sock"), b"").map_err(|e| e.to_string())?;
        let mut c = Confinement::new(scratch, launch, &socket).map_err(|e| e.to_string())?;
        if !pid_namespace {
            c = c.without_pid_namespace();
        }
        let mut cmd = std::process::Command::new("/bin/true");
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c.prepare(&mut cmd);
        let ran = cmd.status().map_err(|e| e.to_string());
        match ran? {
            s if s.success() => Ok(()),
            s => Err(format!("a confined /bin/true exited {s}")),
        }
    }
}

/// The flags of the mount `path` is on that a read-only remount of a bind of it must keep (a
/// user namespace may add flags, never drop them).
fn kept_flags(path: &Path) -> std::io::Result<MountFlags> {
    let kept = MountFlags::NOSUID
        | MountFlags::NODEV
        | MountFlags::NOEXEC
        | MountFlags::NOATIME
        | MountFlags::NODIRATIME
        | MountFlags::RELATIME;
    let st = rustix::fs::statvfs(path)?;
    // statvfs's ST_* flags carry the values of the MS_* ones they mirror
    Ok(MountFlags::from_bits_truncate((st.f_flag.bits() & 0xffff_ffff) as u32) & kept)
}

fn write_all(path: &CStr, bytes: &[u8]) -> rustix::io::Result<()> {
    let fd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    let mut done = 0;
    while done < bytes.len() {
        done += rustix::io::write(&fd, &bytes[done..])?;
    }
    Ok(())
}

/// `/proc/self/fd/<fd>` in `buf`, NUL-terminated, without allocating.
fn fd_path(fd: i32, buf: &mut [u8; 32]) -> &CStr {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let at = prefix.len() + write_decimal(fd, &mut buf[prefix.len()..]);
    buf[at] = 0;
    CStr::from_bytes_with_nul(&buf[..=at]).expect("one NUL, at the end")
}

fn hide(p: &Prepared) -> rustix::io::Result<()> {
    use rustix::thread::UnshareFlags;
    // the cgroup namespace is rooted where the child is now: its job's leaf
    let mut net = UnshareFlags::NEWCGROUP;
    if p.no_network {
        net |= UnshareFlags::NEWNET;
    }
    if p.pid_namespace {
        net |= UnshareFlags::NEWPID;
    }
    if p.root {
        // SAFETY: the child has one thread; no descriptor table is unshared.
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS | net)? };
    } else {
        // SAFETY: as above.
        unsafe {
            rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS | net)?
        };
        write_all(c"/proc/self/setgroups", b"deny")?;
        write_all(c"/proc/self/uid_map", &p.uid_map)?;
        write_all(c"/proc/self/gid_map", &p.gid_map)?;
    }
    rustix::mount::mount_change(
        c"/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )?;
    // the worker's own directory, held before the state directory disappears under the tmpfs
    let worker = rustix::fs::open(
        p.worker.as_c_str(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // the trees bound back, held before the state directory disappears under the tmpfs
    let mut held: [Option<rustix::fd::OwnedFd>; WITHIN_TREES_MAX] = [None, None, None, None];
    for (slot, (tree, ..)) in held.iter_mut().zip(&p.within) {
        *slot = Some(rustix::fs::open(
            tree.as_c_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
    }
    let bridge = match &p.bridge {
        Some((file, _, _, (dev, ino))) => {
            let held = rustix::fs::open(
                file.as_c_str(),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            // the very file that was staged and read back, not whatever is at its path now
            let st = rustix::fs::fstat(&held)?;
            if st.st_dev != *dev || st.st_ino != *ino {
                return Err(rustix::io::Errno::STALE);
            }
            Some(held)
        }
        None => None,
    };
    rustix::mount::mount(
        c"tmpfs",
        p.state.as_c_str(),
        c"tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"mode=0700,size=64k",
    )?;
    let dir = Mode::from_raw_mode(0o700);
    rustix::fs::mkdir(p.workers.as_c_str(), dir)?;
    rustix::fs::mkdir(p.worker.as_c_str(), dir)?;
    let mut buf = [0u8; 32];
    let src = fd_path(rustix::fd::AsRawFd::as_raw_fd(&worker), &mut buf);
    rustix::mount::mount_bind(src, p.worker.as_c_str())?;
    drop(worker);
    for (slot, (tree, dirs, writable, flags)) in held.iter_mut().zip(&p.within) {
        for d in dirs {
            match rustix::fs::mkdir(d.as_c_str(), dir) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e),
            }
        }
        let fd = slot.take().expect("a held descriptor for each tree");
        let src = fd_path(rustix::fd::AsRawFd::as_raw_fd(&fd), &mut buf);
        rustix::mount::mount_bind_recursive(src, tree.as_c_str())?;
        drop(fd);
        if !*writable {
            rustix::mount::mount_remount(
                tree.as_c_str(),
                MountFlags::BIND | MountFlags::RDONLY | *flags,
                c"",
            )?;
        }
    }
    if let Some(broker) = &p.broker {
        let sock = rustix::fs::open(
            p.socket.as_c_str(),
            OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        drop(sock);
        rustix::mount::mount_bind(broker.as_c_str(), p.socket.as_c_str())?;
    }
    if let (Some((file, bdir, flags, _)), Some(held)) = (&p.bridge, bridge) {
        rustix::fs::mkdir(bdir.as_c_str(), dir)?;
        drop(rustix::fs::open(
            file.as_c_str(),
            OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o500),
        )?);
        let src = fd_path(rustix::fd::AsRawFd::as_raw_fd(&held), &mut buf);
        rustix::mount::mount_bind(src, file.as_c_str())?;
        drop(held);
        rustix::mount::mount_remount(
            file.as_c_str(),
            MountFlags::BIND | MountFlags::RDONLY | *flags,
            c"",
        )?;
    }
    for m in &p.hidden_mounts {
        rustix::mount::mount(
            c"tmpfs",
            m.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY,
            c"mode=0555,size=4k",
        )?;
    }
    for (tree, flags) in &p.read_only {
        rustix::mount::mount_bind_recursive(tree.as_c_str(), tree.as_c_str())?;
        rustix::mount::mount_remount(
            tree.as_c_str(),
            MountFlags::BIND | MountFlags::RDONLY | *flags,
            c"",
        )?;
    }
    if let Some(cwd) = &p.cwd {
        rustix::process::chdir(cwd.as_c_str())?;
    }
    if p.pid_namespace {
        enter_pid_namespace(p)?;
    }
    Ok(())
}

/// Go on as the worker in a PID namespace of its own (returns there; never returns in the
/// door it leaves behind, see `shim::door`).
///
/// The first process cloned after `unshare(CLONE_NEWPID)` is the namespace's init: it mounts
/// a `/proc` of the namespace (so `/proc/<pid>/root` names only the job's own processes, never
/// the daemon's or an owner's shell's view of the state directory), becomes undumpable (the
/// worker, of its uid, cannot ptrace it to use what it holds) and splits off the worker as a
/// shim does, ending the whole namespace when the worker ends. Its parent, still outside, is
/// the door: the process `spawn` returned, which leaves as the worker did (the init writes
/// it the worker's status: a PID 1 cannot raise the worker's signal on itself).
///
/// Under a root daemon the init then enters a user namespace of its own (and a mount
/// namespace owned by it), mapped by the door to the daemon's own uids, so the worker is root
/// for files but holds no capability outside that namespace: every mount it inherited is
/// locked (it cannot take the hiding away), and the kernel's settings are read-only.
fn enter_pid_namespace(p: &Prepared) -> rustix::io::Result<()> {
    use rustix::pipe::{PipeFlags, pipe_with};
    let ready = pipe_with(PipeFlags::CLOEXEC)?;
    let go = pipe_with(PipeFlags::CLOEXEC)?;
    let status = pipe_with(PipeFlags::CLOEXEC)?;
    // SAFETY: a raw fork in a single-threaded child, as `shim::split` does
    let init = unsafe { crate::shim::fork_raw() };
    if init < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(errno()));
    }
    if init > 0 {
        drop((ready.1, go.0, status.1));
        if p.root {
            let mut b = [0u8; 1];
            if matches!(rustix::io::read(&ready.0, &mut b), Ok(1))
                && map_all(init as i32, p).is_ok()
            {
                let _ = rustix::io::write(&go.1, b"m");
            }
        }
        drop((ready.0, go.1));
        let status = rustix::fd::AsRawFd::as_raw_fd(&status.0);
        // SAFETY: the parent of `init`, between fork and exec
        unsafe { crate::shim::door(init as libc::pid_t, status) }
    }
    drop((ready.0, go.1, status.0));
    be_init(p, &ready.1, &go.0, &status.1)?;
    drop((ready.1, go.0));
    // SAFETY: plain system calls, then the split in a single-threaded child
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(rustix::io::Errno::from_raw_os_error(errno()));
        }
        crate::shim::split_init(rustix::fd::AsRawFd::as_raw_fd(&status.1)).map_err(|e| {
            rustix::io::Errno::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EPERM))
        })
    }
}

/// The init's own setup: its parent's death is its end, a `/proc` of its namespace with the
/// kernel's settings read-only, and (a root daemon) a user namespace the door maps (`ready`
/// says it is entered, `go` that the maps are written).
fn be_init(
    p: &Prepared,
    ready: &rustix::fd::OwnedFd,
    go: &rustix::fd::OwnedFd,
    status: &rustix::fd::OwnedFd,
) -> rustix::io::Result<()> {
    use rustix::thread::UnshareFlags;
    // SAFETY: plain system calls in a single-threaded child
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(rustix::io::Errno::from_raw_os_error(errno()));
        }
        // a door that died before that (it alone holds the status pipe's read end) sent no
        // signal: the init ends itself instead of running on outside every door
        let mut fds = [libc::pollfd {
            fd: rustix::fd::AsRawFd::as_raw_fd(status),
            events: libc::POLLOUT,
            revents: 0,
        }];
        if libc::poll(fds.as_mut_ptr(), 1, 0) == 1 && fds[0].revents & libc::POLLERR != 0 {
            libc::_exit(137);
        }
        // a mount namespace of the init's own: the door keeps the machine's /proc, where it
        // finds the init to map
        rustix::thread::unshare_unsafe(UnshareFlags::NEWNS)?;
    }
    let fs = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount(c"proc", c"/proc", c"proc", fs, c"")?;
    for knob in [c"/proc/sys", c"/proc/sysrq-trigger"] {
        match rustix::mount::mount_bind(knob, knob) {
            Ok(()) => {}
            // a kernel without magic SysRq has no trigger to guard
            Err(rustix::io::Errno::NOENT) if knob != c"/proc/sys" => continue,
            Err(e) => return Err(e),
        }
        rustix::mount::mount_remount(knob, MountFlags::BIND | MountFlags::RDONLY | fs, c"")?;
    }
    if p.root {
        // SAFETY: as above
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS)? };
        rustix::io::write(ready, b"u")?;
        let mut b = [0u8; 1];
        if !matches!(rustix::io::read(go, &mut b), Ok(1)) {
            // the door could not write the maps (a namespace that maps fewer uids than it
            // says, say): no worker starts unmapped
            return Err(rustix::io::Errno::PERM);
        }
    }
    Ok(())
}

fn errno() -> i32 {
    // SAFETY: reading this thread's errno
    unsafe { *libc::__errno_location() }
}

/// Map into the user namespace `pid` has just entered every uid and gid the daemon's own
/// namespace maps, each to itself (a root daemon's door, which holds CAP_SETUID and
/// CAP_SETGID where the namespace's parent is).
fn map_all(pid: i32, p: &Prepared) -> rustix::io::Result<()> {
    for (file, map) in [
        (&b"/uid_map"[..], &p.uid_map_all),
        (&b"/gid_map"[..], &p.gid_map_all),
    ] {
        let mut buf = [0u8; 48];
        write_all(proc_path(pid, file, &mut buf), map)?;
    }
    Ok(())
}

/// `/proc/<pid><file>` in `buf`, NUL-terminated, without allocating.
fn proc_path<'b>(pid: i32, file: &[u8], buf: &'b mut [u8; 48]) -> &'b CStr {
    let prefix = b"/proc/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut at = prefix.len() + write_decimal(pid, &mut buf[prefix.len()..]);
    buf[at..at + file.len()].copy_from_slice(file);
    at += file.len();
    buf[at] = 0;
    CStr::from_bytes_with_nul(&buf[..=at]).expect("one NUL, at the end")
}

/// `n` in decimal at the start of `out`; its length.
fn write_decimal(n: i32, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (n.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        out[i] = *d;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine without namespaces skips these tests, unless the test run says this one
    /// has them (`ROOM_TEST_CONFINEMENT=required`, as `scripts/test` does): then a
    /// confinement that fails to start is a failure, never a skip.
    fn unavailable(e: std::io::Error) {
        assert!(
            std::env::var("ROOM_TEST_CONFINEMENT").as_deref() != Ok("required"),
            "confinement is required here and failed: {e}"
        );
        eprintln!("confinement unavailable here: {e}");
    }

    #[test]
    fn the_probe_finds_what_this_machine_allows() {
        let tmp = tempfile::tempdir().unwrap();
        let found = Confinement::probe(&tmp.path().join("probe"));
        if std::env::var("ROOM_TEST_CONFINEMENT").as_deref() == Ok("required") {
            assert_eq!(
                found,
                Ok(Support {
                    no_pid_namespace: None
                })
            );
        }
    }

    #[test]
    fn a_root_daemon_s_worker_maps_each_range_of_its_own_to_itself() {
        assert_eq!(
            identity_map("         0          0 4294967295\n"),
            b"0 0 4294967295\n"
        );
        // a daemon in a container's namespace maps what it has, no more
        assert_eq!(
            identity_map("0 100000 65536\n65536 1000 1\n"),
            b"0 0 65536\n65536 65536 1\n"
        );
        assert_eq!(identity_map(""), b"");
    }

    #[test]
    fn fd_paths_are_written_without_allocating() {
        let mut b = [0u8; 32];
        assert_eq!(fd_path(0, &mut b).to_str().unwrap(), "/proc/self/fd/0");
        assert_eq!(
            fd_path(2_147_483_647, &mut b).to_str().unwrap(),
            "/proc/self/fd/2147483647"
        );
    }

    #[test]
    fn a_confined_child_sees_only_its_own_processes_and_holds_no_machine_capability() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir_all(state.join("workers/lch_1")).unwrap();
        std::fs::write(state.join("workers/lch_1/broker.sock"), b"").unwrap();
        let c = Confinement::new(&state, "lch_1", &state.join("room.sock")).unwrap();
        // its pid, how many processes /proc shows, whether it can see the daemon (this test)
        let script = format!(
            "echo $$; ls /proc | grep -c '^[0-9]'; test -e /proc/{me} && echo SEEN; \
             cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'; \
             awk '$5 == \"/proc/sys\" {{ print \"sys \" substr($6, 1, 2) }}' /proc/self/mountinfo | tail -1; \
             echo 1 > /proc/sys/kernel/ns_last_pid 2>/dev/null && echo SYSWROTE; exit 4",
            me = std::process::id()
        );
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", &script]);
        c.prepare(&mut cmd);
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) => return unavailable(e),
        };
        // the worker's exit status comes back through the init and the door
        assert_eq!(out.status.code(), Some(4), "{out:?}");
        // and so does its signal (a PID 1 cannot raise one on itself; the door does)
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", "kill -9 $$"]);
        c.prepare(&mut cmd);
        let killed = cmd.status().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&killed),
            Some(9),
            "{killed:?}"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        // the init is 1, the worker 2, and the shell's ls and grep at most two more
        assert_eq!(lines[0], "2", "{text:?} {:?}", out.stderr);
        assert!(lines[1].parse::<u32>().unwrap() <= 4, "{text:?}");
        assert!(!text.contains("SEEN"), "{text:?}");
        let uid = rustix::process::geteuid().as_raw();
        // a root daemon's worker is root in a namespace of its own, mapped to the uids of the
        // daemon's own
        let map = if uid == 0 {
            let own = std::fs::read_to_string("/proc/self/uid_map").unwrap();
            let f: Vec<&str> = own.split_whitespace().collect();
            format!("{} {} {}", f[0], f[0], f[2])
        } else {
            format!("{uid} {uid} 1")
        };
        assert_eq!(lines[2], map, "{text:?}");
        // the kernel's settings are read-only in its view: the last mount on /proc/sys (the
        // one it sees) is, and a write there fails
        assert!(lines.contains(&"sys ro"), "{text:?}");
        assert!(!text.contains("SYSWROTE"), "{text:?}");
    }

    #[test]
    fn a_read_only_tree_can_be_read_and_not_written() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir_all(state.join("workers/lch_1")).unwrap();
        std::fs::write(state.join("workers/lch_1/broker.sock"), b"").unwrap();
        let project = tmp.path().join("project");
        std::fs::create_dir_all(project.join("src")).unwrap();
        std::fs::write(project.join("src/a.json"), b"[]").unwrap();
        let c = Confinement::new(&state, "lch_1", &state.join("room.sock"))
            .unwrap()
            .read_only(&project)
            .unwrap();
        // relative paths too: the worker starts in the project (std enters it before the
        // mounts; the confinement enters it again inside them)
        let script = format!(
            "cat {p}/src/a.json; echo; echo x > {p}/src/a.json 2>/dev/null && echo WROTE; touch {p}/new 2>/dev/null && echo MADE; touch rel 2>/dev/null && echo REL; echo done",
            p = project.display()
        );
        let c = c.cwd(&project).unwrap();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", &script]).current_dir(&project);
        c.prepare(&mut cmd);
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) => return unavailable(e),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text, "[]\ndone\n", "{text:?} {:?}", out.stderr);
        assert_eq!(std::fs::read(project.join("src/a.json")).unwrap(), b"[]");
        assert!(!project.join("new").exists());
        assert!(!project.join("rel").exists());
        // outside the worker, the tree is as writable as before
        std::fs::write(project.join("src/a.json"), b"[1]").unwrap();
    }

    #[test]
    fn a_tree_beneath_the_state_directory_comes_back_writable_or_read_only_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir_all(state.join("workers/lch_1")).unwrap();
        std::fs::write(state.join("workers/lch_1/broker.sock"), b"").unwrap();
        std::fs::write(state.join("control.db"), b"secret").unwrap();
        let mine = state.join("trees/c1/impl");
        let base = state.join("trees/c1/base");
        let other = state.join("trees/c2/impl");
        for d in [&mine, &base, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("f"), b"old").unwrap();
        }
        let c = Confinement::new(&state, "lch_1", &state.join("room.sock"))
            .unwrap()
            .writable_within(&mine)
            .unwrap()
            .read_only(&base)
            .unwrap()
            .cwd(&mine)
            .unwrap();
        let script = format!(
            "echo new > f && cat f; cat {b}/f; echo; echo x > {b}/f 2>/dev/null && echo BASEWROTE; \
             ls {s}/trees; ls {s}/trees/c1; cat {s}/control.db 2>/dev/null && echo LEAK; echo done",
            b = base.display(),
            s = state.display()
        );
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", &script]).current_dir(&mine);
        c.prepare(&mut cmd);
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) => return unavailable(e),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text, "new\nold\nc1\nbase\nimpl\ndone\n",
            "{text:?} {:?}",
            out.stderr
        );
        assert_eq!(std::fs::read(mine.join("f")).unwrap(), b"new\n");
        assert_eq!(std::fs::read(base.join("f")).unwrap(), b"old");
        // only beneath trees/, by plain names, and only directories
        let c = Confinement::new(&state, "lch_1", &state.join("room.sock")).unwrap();
        assert!(c.clone().writable_within(&state.join("workers")).is_err());
        assert!(
            c.clone()
                .writable_within(&state.join("trees/c1/../c2"))
                .is_err()
        );
        assert!(
            c.clone()
                .writable_within(&state.join("trees/c1/impl/f"))
                .is_err()
        );
        assert!(c.writable_within(&state.join("trees")).is_err());
    }

    #[test]
    fn a_confined_child_sees_only_its_own_directory_and_the_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let worker = state.join("workers/lch_1");
        std::fs::create_dir_all(&worker).unwrap();
        std::fs::write(state.join("control.db"), b"secret").unwrap();
        std::fs::write(worker.join("broker.sock"), b"broker").unwrap();
        std::fs::write(worker.join("mine"), b"mine").unwrap();
        std::fs::create_dir_all(state.join("workers/lch_2")).unwrap();
        let socket = state.join("room.sock");
        std::fs::write(&socket, b"owner").unwrap();
        let c = Confinement::new(&state, "lch_1", &socket).unwrap();
        let script = format!(
            "cat {s}/control.db 2>/dev/null && echo LEAK; ls {s}/workers; cat {s}/room.sock; echo; cat {w}/mine",
            s = state.display(),
            w = worker.display()
        );
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", &script]);
        c.prepare(&mut cmd);
        let out = match cmd.output() {
            Ok(o) => o,
            // a machine without namespaces: nothing to check here (the daemon probes first)
            Err(e) => return unavailable(e),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text, "lch_1\nbroker\nmine", "{text:?} {:?}", out.stderr);
        // the machine's view is untouched
        assert_eq!(std::fs::read(state.join("control.db")).unwrap(), b"secret");
        assert_eq!(std::fs::read(&socket).unwrap(), b"owner");
    }
}
