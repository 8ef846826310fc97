//! The simulated disk under SQLite: a VFS (`room-sim`) that keeps each database file's page
//! cache in memory and writes it to the real file only at `xSync`. SQLite reads and writes the
//! cache, as it would the kernel's; a simulated crash then keeps, tears or loses each write made
//! since the last sync, and a failed fsync marks its writes clean without writing them (as Linux
//! does), so they vanish at the next crash although SQLite read them back until then. Faults
//! strike SQLite's own writes and syncs (the WAL, the database, a checkpoint), not a commit
//! emulated above it.
//!
//! Files outside a mounted root, and SQLite's temporary files, pass straight through to the
//! default VFS. Locks and shared memory always do: the daemon holds its databases in exclusive
//! locking mode, so no shared-memory wal-index is involved.

use room_store::journal::Fault;
use rusqlite::ffi;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The name to open a database with (`EngineConfig::sqlite_vfs`).
pub const VFS_NAME: &str = "room-sim";

/// A torn write keeps whole sectors of this size.
pub(crate) const SECTOR_BYTES: u64 = 512;

/// Decides the fault, if any, for SQLite's next write or sync of a file.
pub trait DiskFaults: Send + Sync {
    fn on_write(&self, path: &Path) -> Option<Fault>;
    fn on_sync(&self, path: &Path) -> Option<Fault>;
}

/// One file's page cache: what SQLite reads, and what has not reached the disk yet.
struct Cached {
    data: Vec<u8>,
    /// Byte ranges written since the last sync, in the order they were written.
    dirty: Vec<(u64, u64)>,
    /// The size changed since the last sync.
    resized: bool,
    /// The smallest size since the last sync: bytes past it were cut, even if later writes
    /// grew the file again, and must not come back from the disk.
    low_water: Option<u64>,
}

impl Cached {
    /// The unsynced writes, clipped to the current size.
    fn clipped(&self) -> Vec<(u64, u64)> {
        let len = self.data.len() as u64;
        self.dirty
            .iter()
            .map(|&(a, b)| (a.min(len), b.min(len)))
            .filter(|(a, b)| a < b)
            .collect()
    }
}

/// What SQLite did on the simulated disk, so a run shows the page cache was in play.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub writes: u64,
    /// Writes to a database file itself (checkpoints), not its WAL.
    pub db_writes: u64,
    pub syncs: u64,
    /// Writes and syncs an injected fault struck.
    pub faults: u64,
    /// Unsynced writes at crashes: lost whole, torn, or kept.
    pub lost: u64,
    pub torn: u64,
    pub kept: u64,
}

impl std::ops::AddAssign for DiskStats {
    fn add_assign(&mut self, o: DiskStats) {
        self.writes += o.writes;
        self.db_writes += o.db_writes;
        self.syncs += o.syncs;
        self.faults += o.faults;
        self.lost += o.lost;
        self.torn += o.torn;
        self.kept += o.kept;
    }
}

struct DiskState {
    files: BTreeMap<PathBuf, Cached>,
    /// SQLite handles open on cached files: none may outlive a crash.
    open: usize,
    stats: DiskStats,
    /// The process has died: nothing more reaches the disk until the restart.
    crashed: bool,
}

struct Disk {
    root: PathBuf,
    faults: Arc<dyn DiskFaults>,
    /// A planted bug: `xSync` answers success and writes nothing.
    lying_sync: bool,
    state: Mutex<DiskState>,
}

impl Disk {
    fn lock(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.state.lock().expect("disk state lock")
    }
}

static DISKS: Mutex<Vec<Arc<Disk>>> = Mutex::new(Vec::new());

fn disk_for(path: &Path) -> Option<Arc<Disk>> {
    DISKS
        .lock()
        .expect("disk registry lock")
        .iter()
        .find(|d| path.starts_with(&d.root))
        .cloned()
}

/// A simulated disk mounted over a directory; unmounted when dropped.
pub struct Mount(Arc<Disk>);

impl Mount {
    /// Simulate the page cache of every SQLite file under `root` (registering the VFS once).
    pub fn new(root: &Path, faults: Arc<dyn DiskFaults>, lying_sync: bool) -> Mount {
        register();
        // SQLite names files by their canonical path
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let disk = Arc::new(Disk {
            root,
            faults,
            lying_sync,
            state: Mutex::new(DiskState {
                files: BTreeMap::new(),
                open: 0,
                stats: DiskStats::default(),
                crashed: false,
            }),
        });
        DISKS.lock().expect("disk registry lock").push(disk.clone());
        Mount(disk)
    }

    pub fn stats(&self) -> DiskStats {
        self.0.lock().stats
    }

    /// The process dies now: every later write, sync or delete fails and changes nothing.
    pub fn crash(&self) {
        self.0.lock().crashed = true;
    }

    /// After a crash, with every connection closed: each file keeps what was synced, plus (by
    /// `rng`, which returns a number below its argument) all, none, a torn prefix or a random
    /// part of what was written since. The caches are dropped; SQLite reads the disk anew.
    pub fn restart(&self, rng: &mut dyn FnMut(u64) -> u64) -> std::io::Result<Vec<String>> {
        let mut st = self.0.lock();
        if st.open > 0 {
            return Err(std::io::Error::other(format!(
                "{} SQLite files are still open at the restart",
                st.open
            )));
        }
        let mut notes = Vec::new();
        for (path, c) in std::mem::take(&mut st.files) {
            if c.dirty.is_empty() && !c.resized {
                continue;
            }
            let clipped = c.clipped();
            let kept = survivors(&clipped, rng);
            let torn = kept.iter().filter(|r| !clipped.contains(r)).count() as u64;
            st.stats.torn += torn;
            st.stats.kept += kept.len() as u64 - torn;
            st.stats.lost += (clipped.len() - kept.len()) as u64;
            let keep_size = c.resized && kept.len() == clipped.len() && rng(2) == 0;
            if kept.is_empty() && !keep_size {
                notes.push(format!(
                    "crash: {} loses its unsynced writes",
                    path.display()
                ));
                continue;
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            if keep_size && let Some(low) = c.low_water {
                f.set_len(low)?;
            }
            use std::os::unix::fs::FileExt;
            for (a, b) in &kept {
                f.write_all_at(&c.data[*a as usize..*b as usize], *a)?;
            }
            if keep_size {
                f.set_len(c.data.len() as u64)?;
            }
            notes.push(format!(
                "crash: {} keeps {} of {} unsynced writes",
                path.display(),
                kept.len(),
                clipped.len()
            ));
        }
        st.crashed = false;
        Ok(notes)
    }
}

/// Which of the (clipped) unsynced writes reach the disk at a crash.
fn survivors(clipped: &[(u64, u64)], rng: &mut dyn FnMut(u64) -> u64) -> Vec<(u64, u64)> {
    let clipped = clipped.iter().copied();
    let torn = |(a, b): (u64, u64), rng: &mut dyn FnMut(u64) -> u64| {
        let sectors = (b - a).div_ceil(SECTOR_BYTES);
        (a, (a + rng(sectors + 1) * SECTOR_BYTES).min(b))
    };
    match rng(4) {
        0 => Vec::new(),
        1 => clipped.collect(),
        2 => {
            // written back in order until the power went, the last one torn
            let all: Vec<_> = clipped.collect();
            let n = rng(all.len() as u64 + 1) as usize;
            let mut v = all[..n].to_vec();
            if n < all.len() {
                v.push(torn(all[n], rng));
            }
            v
        }
        _ => clipped
            .filter_map(|r| match rng(4) {
                0 => None,
                1 => Some(torn(r, rng)),
                _ => Some(r),
            })
            .collect(),
    }
    .into_iter()
    .filter(|(a, b)| a < b)
    .collect()
}

/// The default VFS, which does the real work.
struct Inner(*mut ffi::sqlite3_vfs);
// SAFETY: the default VFS is a process-wide static that SQLite itself shares across threads.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

static INNER: OnceLock<Inner> = OnceLock::new();

fn inner_vfs() -> *mut ffi::sqlite3_vfs {
    INNER.get().expect("the simulated disk VFS is registered").0
}

fn register() {
    INNER.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find initializes SQLite and returns the static default VFS; the
        // VFS we register is leaked, so it outlives every connection.
        unsafe {
            let inner = ffi::sqlite3_vfs_find(std::ptr::null());
            assert!(!inner.is_null(), "SQLite has a default VFS");
            let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
                iVersion: 2,
                szOsFile: std::mem::size_of::<SimFile>() as c_int,
                mxPathname: (*inner).mxPathname,
                pNext: std::ptr::null_mut(),
                zName: c"room-sim".as_ptr(),
                pAppData: std::ptr::null_mut(),
                xOpen: Some(x_open),
                xDelete: Some(x_delete),
                xAccess: Some(x_access),
                xFullPathname: Some(x_full_pathname),
                xDlOpen: (*inner).xDlOpen,
                xDlError: (*inner).xDlError,
                xDlSym: (*inner).xDlSym,
                xDlClose: (*inner).xDlClose,
                xRandomness: Some(x_randomness),
                xSleep: Some(x_sleep),
                xCurrentTime: Some(x_current_time),
                xGetLastError: Some(x_get_last_error),
                xCurrentTimeInt64: Some(x_current_time_int64),
                xSetSystemCall: None,
                xGetSystemCall: None,
                xNextSystemCall: None,
            }));
            let rc = ffi::sqlite3_vfs_register(vfs, 0);
            assert_eq!(rc, ffi::SQLITE_OK, "registering the simulated disk VFS");
            Inner(inner)
        }
    });
}

/// SQLite's handle: our methods, the default VFS's file, and what we know of it.
#[repr(C)]
struct SimFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    ctx: *mut FileCtx,
}

struct FileCtx {
    /// Set for a database, WAL or journal under a mounted root: its cache lives there.
    disk: Option<Arc<Disk>>,
    path: PathBuf,
    layout: Layout,
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

/// The inner file and its methods.
///
/// # Safety
/// `f` is a `SimFile` that `x_open` opened and `x_close` has not closed.
unsafe fn inner(
    f: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: per the contract, `inner` is an open file of the default VFS, whose methods are
    // static.
    unsafe {
        let i = (*(f as *mut SimFile)).inner;
        (i, &*(*i).pMethods)
    }
}

/// # Safety
/// As for [`inner`].
unsafe fn ctx<'a>(f: *mut ffi::sqlite3_file) -> &'a FileCtx {
    // SAFETY: per the contract, `ctx` was boxed by `x_open` and lives until `x_close`.
    unsafe { &*(*(f as *mut SimFile)).ctx }
}

/// The cached file's state, or `None` for a pass-through file.
fn with_cache<T>(c: &FileCtx, f: impl FnOnce(&mut DiskState, &Arc<Disk>) -> T) -> Option<T> {
    let disk = c.disk.as_ref()?;
    let mut st = disk.lock();
    Some(f(&mut st, disk))
}

fn path_of(z: *const c_char) -> Option<PathBuf> {
    if z.is_null() {
        return None;
    }
    // SAFETY: SQLite passes a NUL-terminated file name.
    let s = unsafe { CStr::from_ptr(z) };
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes())))
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let iv = inner_vfs();
    // SAFETY: `file` has room for a SimFile (our szOsFile); the inner file gets the size the
    // default VFS asks for, and is freed if its open fails.
    unsafe {
        (*file).pMethods = std::ptr::null();
        let layout = Layout::from_size_align((*iv).szOsFile as usize, 16)
            .expect("the default VFS's file size is a valid layout");
        let inner = std::alloc::alloc_zeroed(layout) as *mut ffi::sqlite3_file;
        if inner.is_null() {
            return ffi::SQLITE_NOMEM;
        }
        let rc = (*iv).xOpen.expect("xOpen")(iv, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            if !(*inner).pMethods.is_null() {
                (*(*inner).pMethods).xClose.expect("xClose")(inner);
            }
            std::alloc::dealloc(inner as *mut u8, layout);
            return rc;
        }
        let durable =
            ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL | ffi::SQLITE_OPEN_MAIN_JOURNAL;
        let path = path_of(name).unwrap_or_default();
        let disk = if flags & durable != 0 {
            disk_for(&path)
        } else {
            None
        };
        if let Some(d) = &disk {
            let mut st = d.lock();
            if !st.files.contains_key(&path) {
                // the first open since the restart reads the disk, through this very handle
                match read_whole(inner) {
                    Ok(data) => {
                        st.files.insert(
                            path.clone(),
                            Cached {
                                data,
                                dirty: Vec::new(),
                                resized: false,
                                low_water: None,
                            },
                        );
                    }
                    Err(rc) => {
                        (*(*inner).pMethods).xClose.expect("xClose")(inner);
                        std::alloc::dealloc(inner as *mut u8, layout);
                        return rc;
                    }
                }
            }
            st.open += 1;
        }
        let sim = file as *mut SimFile;
        (*sim).inner = inner;
        (*sim).ctx = Box::into_raw(Box::new(FileCtx { disk, path, layout }));
        (*file).pMethods = &METHODS;
        ffi::SQLITE_OK
    }
}

/// A file's whole content, read through an open handle of the default VFS.
///
/// # Safety
/// `f` is an open file of the default VFS.
unsafe fn read_whole(f: *mut ffi::sqlite3_file) -> Result<Vec<u8>, c_int> {
    // SAFETY: per the contract; the buffer is as long as the read.
    unsafe {
        let m = &*(*f).pMethods;
        let mut size: ffi::sqlite3_int64 = 0;
        let rc = m.xFileSize.expect("xFileSize")(f, &mut size);
        if rc != ffi::SQLITE_OK {
            return Err(rc);
        }
        let mut data = vec![0u8; size as usize];
        if size > 0 {
            let rc = m.xRead.expect("xRead")(f, data.as_mut_ptr() as *mut c_void, size as c_int, 0);
            if rc != ffi::SQLITE_OK {
                return Err(rc);
            }
        }
        Ok(data)
    }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes each file it opened once; the page cache outlives the handle.
    unsafe {
        if let Some(d) = &ctx(f).disk {
            d.lock().open -= 1;
        }
        let (i, m) = inner(f);
        let rc = m.xClose.expect("xClose")(i);
        let sim = f as *mut SimFile;
        let ctx = Box::from_raw((*sim).ctx);
        std::alloc::dealloc(i as *mut u8, ctx.layout);
        (*sim).ctx = std::ptr::null_mut();
        (*sim).inner = std::ptr::null_mut();
        rc
    }
}

unsafe extern "C" fn x_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite hands a buffer of `amt` bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amt as usize) };
    let c = unsafe { ctx(f) };
    let cached = with_cache(c, |st, _| {
        let Some(file) = st.files.get(&c.path) else {
            return ffi::SQLITE_IOERR_READ;
        };
        let data = &file.data;
        let off = off as usize;
        let n = data.len().saturating_sub(off).min(out.len());
        if n > 0 {
            out[..n].copy_from_slice(&data[off..off + n]);
        }
        out[n..].fill(0);
        if n < out.len() {
            ffi::SQLITE_IOERR_SHORT_READ
        } else {
            ffi::SQLITE_OK
        }
    });
    cached.unwrap_or_else(|| unsafe {
        let (i, m) = inner(f);
        m.xRead.expect("xRead")(i, buf, amt, off)
    })
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite hands `amt` bytes.
    let src = unsafe { std::slice::from_raw_parts(buf as *const u8, amt as usize) };
    let c = unsafe { ctx(f) };
    let cached = with_cache(c, |st, disk| {
        if st.crashed {
            return ffi::SQLITE_IOERR_WRITE;
        }
        st.stats.writes += 1;
        st.stats.db_writes += u64::from(c.path.extension().is_some_and(|e| e == "db"));
        let fault = disk.faults.on_write(&c.path);
        st.stats.faults += u64::from(fault.is_some());
        let (n, rc) = match fault {
            None => (src.len(), ffi::SQLITE_OK),
            Some(Fault::WriteError(std::io::ErrorKind::StorageFull)) => (0, ffi::SQLITE_FULL),
            Some(Fault::ShortWrite(n)) => (n.min(src.len()), ffi::SQLITE_FULL),
            Some(Fault::CrashAfterWrite) => {
                // the write lands in the cache, then the process dies
                st.crashed = true;
                (src.len(), ffi::SQLITE_IOERR_WRITE)
            }
            Some(_) => (0, ffi::SQLITE_IOERR_WRITE),
        };
        let Some(file) = st.files.get_mut(&c.path) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let off = off as usize;
        if n > 0 {
            if file.data.len() < off + n {
                file.data.resize(off + n, 0);
            }
            file.data[off..off + n].copy_from_slice(&src[..n]);
            file.dirty.push((off as u64, (off + n) as u64));
        }
        rc
    });
    cached.unwrap_or_else(|| unsafe {
        let (i, m) = inner(f);
        m.xWrite.expect("xWrite")(i, buf, amt, off)
    })
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let c = unsafe { ctx(f) };
    let cached = with_cache(c, |st, _| {
        if st.crashed {
            return ffi::SQLITE_IOERR_TRUNCATE;
        }
        let Some(file) = st.files.get_mut(&c.path) else {
            return ffi::SQLITE_IOERR_TRUNCATE;
        };
        let size = size as u64;
        if size < file.data.len() as u64 {
            file.low_water = Some(file.low_water.map_or(size, |l| l.min(size)));
        }
        file.data.resize(size as usize, 0);
        file.resized = true;
        ffi::SQLITE_OK
    });
    cached.unwrap_or_else(|| unsafe {
        let (i, m) = inner(f);
        m.xTruncate.expect("xTruncate")(i, size)
    })
}

unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let c = unsafe { ctx(f) };
    let (i, m) = unsafe { inner(f) };
    let cached = with_cache(c, |st, disk| {
        if st.crashed {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        st.stats.syncs += 1;
        let fault = disk.faults.on_sync(&c.path);
        st.stats.faults += u64::from(fault.is_some());
        let Some(file) = st.files.get_mut(&c.path) else {
            return ffi::SQLITE_IOERR_FSYNC;
        };
        match fault {
            None => {}
            Some(Fault::CrashAfterWrite) => {
                st.crashed = true;
                return ffi::SQLITE_IOERR_FSYNC;
            }
            Some(_) => {
                // the kernel marks the pages clean without writing them
                file.dirty.clear();
                file.resized = false;
                file.low_water = None;
                return ffi::SQLITE_IOERR_FSYNC;
            }
        }
        if disk.lying_sync {
            return ffi::SQLITE_OK;
        }
        let len = file.data.len() as u64;
        if let Some(low) = file.low_water {
            // SAFETY: the inner file is open.
            let rc = unsafe { m.xTruncate.expect("xTruncate")(i, low as ffi::sqlite3_int64) };
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        for (a, b) in file.clipped() {
            let bytes = &file.data[a as usize..b as usize];
            // SAFETY: the inner file is open; the bytes live through the call.
            let rc = unsafe {
                m.xWrite.expect("xWrite")(
                    i,
                    bytes.as_ptr() as *const c_void,
                    bytes.len() as c_int,
                    a as ffi::sqlite3_int64,
                )
            };
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        // SAFETY: as above.
        let rc = unsafe { m.xTruncate.expect("xTruncate")(i, len as ffi::sqlite3_int64) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        file.dirty.clear();
        file.resized = false;
        file.low_water = None;
        // SAFETY: as above.
        unsafe { m.xSync.expect("xSync")(i, flags) }
    });
    cached.unwrap_or_else(|| unsafe { m.xSync.expect("xSync")(i, flags) })
}

unsafe extern "C" fn x_file_size(
    f: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    let c = unsafe { ctx(f) };
    let cached = with_cache(c, |st, _| {
        st.files
            .get(&c.path)
            .map(|f| f.data.len() as ffi::sqlite3_int64)
    });
    match cached {
        Some(None) => ffi::SQLITE_IOERR_FSTAT,
        Some(Some(n)) => {
            // SAFETY: SQLite passes a place for the size.
            unsafe { *size = n };
            ffi::SQLITE_OK
        }
        None => unsafe {
            let (i, m) = inner(f);
            m.xFileSize.expect("xFileSize")(i, size)
        },
    }
}

unsafe extern "C" fn x_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let c = unsafe { ctx(f) };
    // size hints and chunk sizes would grow the real file behind the cache: hints, ignored
    if c.disk.is_some() && (op == ffi::SQLITE_FCNTL_SIZE_HINT || op == ffi::SQLITE_FCNTL_CHUNK_SIZE)
    {
        return ffi::SQLITE_OK;
    }
    unsafe {
        let (i, m) = inner(f);
        m.xFileControl.expect("xFileControl")(i, op, arg)
    }
}

unsafe extern "C" fn x_lock(f: *mut ffi::sqlite3_file, lock: c_int) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        m.xLock.expect("xLock")(i, lock)
    }
}

unsafe extern "C" fn x_unlock(f: *mut ffi::sqlite3_file, lock: c_int) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        m.xUnlock.expect("xUnlock")(i, lock)
    }
}

unsafe extern "C" fn x_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        m.xCheckReservedLock.expect("xCheckReservedLock")(i, out)
    }
}

unsafe extern "C" fn x_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        m.xSectorSize.expect("xSectorSize")(i)
    }
}

unsafe extern "C" fn x_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        m.xDeviceCharacteristics.expect("xDeviceCharacteristics")(i)
    }
}

unsafe extern "C" fn x_shm_map(
    f: *mut ffi::sqlite3_file,
    page: c_int,
    page_bytes: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        match m.xShmMap {
            Some(x) => x(i, page, page_bytes, extend, out),
            None => ffi::SQLITE_IOERR_SHMMAP,
        }
    }
}

unsafe extern "C" fn x_shm_lock(
    f: *mut ffi::sqlite3_file,
    off: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        match m.xShmLock {
            Some(x) => x(i, off, n, flags),
            None => ffi::SQLITE_IOERR_SHMLOCK,
        }
    }
}

unsafe extern "C" fn x_shm_barrier(f: *mut ffi::sqlite3_file) {
    unsafe {
        let (i, m) = inner(f);
        if let Some(x) = m.xShmBarrier {
            x(i)
        }
    }
}

unsafe extern "C" fn x_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe {
        let (i, m) = inner(f);
        match m.xShmUnmap {
            Some(x) => x(i, delete),
            None => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    if let Some(path) = path_of(name)
        && let Some(disk) = disk_for(&path)
    {
        let mut st = disk.lock();
        if st.crashed {
            return ffi::SQLITE_IOERR_DELETE;
        }
        st.files.remove(&path);
    }
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xDelete.expect("xDelete")(iv, name, sync_dir) }
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xAccess.expect("xAccess")(iv, name, flags, out) }
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xFullPathname.expect("xFullPathname")(iv, name, n, out) }
}

unsafe extern "C" fn x_randomness(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xRandomness.expect("xRandomness")(iv, n, out) }
}

unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xSleep.expect("xSleep")(iv, us) }
}

unsafe extern "C" fn x_current_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xCurrentTime.expect("xCurrentTime")(iv, out) }
}

unsafe extern "C" fn x_get_last_error(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xGetLastError.expect("xGetLastError")(iv, n, out) }
}

unsafe extern "C" fn x_current_time_int64(
    _vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    let iv = inner_vfs();
    // SAFETY: a plain delegation to the default VFS.
    unsafe { (*iv).xCurrentTimeInt64.expect("xCurrentTimeInt64")(iv, out) }
}

impl Drop for Mount {
    fn drop(&mut self) {
        DISKS
            .lock()
            .expect("disk registry lock")
            .retain(|d| !Arc::ptr_eq(d, &self.0));
    }
}
