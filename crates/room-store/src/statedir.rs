//! The state directory: its layout, the split-brain marker and the machine bootstrap, and the
//! one-daemon lock. Every start revalidates marker and bootstrap and fails closed on any doubt,
//! because two trees that both believe they are the machine's state accumulate two histories.

use crate::fs::write_atomic;
use crate::{Result, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Component, Path, PathBuf};

pub const MARKER: &str = "state_dir_id.json";
pub const SUBDIRS: &[&str] = &["rooms", "stops", "workers", "wakes"];

pub const DEFAULT_CONFIG: &str = r#"# Room daemon configuration. Re-read on every call.

[fleet]
# The highest tier any agent may act with, whatever it declares or the owner allows.
ceiling = "operator"

[redaction]
# Extra regular expressions removed from everything sent to agents.
patterns = []

[quotas]
# Per agent and room: bytes of text and task titles written within a minute.
bytes_per_minute = 67108864
# Per agent and room: tasks created and not yet done or declined.
tasks_open = 10000
# Per agent: MCP sessions held open at once over HTTP (idle ones close after 5 minutes).
mcp_sessions = 64
"#;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    pub id: String,
    pub canonical_path: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Bootstrap {
    #[serde(default)]
    pub instances: BTreeMap<String, String>,
}

/// A validated state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
    pub instance_id: String,
}

impl StateDir {
    pub fn rooms(&self) -> PathBuf {
        self.root.join("rooms")
    }
    /// Shards no room owns (an interrupted or failed creation), kept aside for inspection.
    pub fn debris(&self) -> PathBuf {
        self.root.join("debris")
    }
    /// The commit pipeline's log segments (`pipeline`).
    pub fn commit_log(&self) -> PathBuf {
        self.root.join("commit")
    }
    /// The shard of one room.
    pub fn shard(&self, graph_id: &str) -> crate::shard::Shard {
        crate::shard::Shard::at(&self.rooms(), graph_id)
    }
    /// The identity of a project grant's requested path, pinned beside the grant.
    pub fn project_pin(&self, project_id: &str) -> PathBuf {
        self.root
            .join("projects")
            .join(format!("{project_id}.requested.json"))
    }
    /// Integrity signals (a caller naming another principal), one JSON object a line.
    pub fn integrity_log(&self) -> PathBuf {
        self.root.join("integrity.jsonl")
    }
    /// What `room migrate` leaves once this state dir's store is whole in a database: the
    /// embedded copy is not served again (a split of the state in two).
    pub fn store_migrated(&self) -> PathBuf {
        self.root.join("store_migrated.json")
    }
    pub fn control_db(&self) -> PathBuf {
        self.root.join("control.db")
    }
    pub fn config(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    pub fn socket(&self) -> PathBuf {
        self.root.join("room.sock")
    }
    pub fn lock_path(&self) -> PathBuf {
        self.root.join("room.lock")
    }
}

/// `$XDG_CONFIG_HOME/room/bootstrap.toml`, else `~/.config/room/bootstrap.toml`.
pub fn default_bootstrap_path() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".config"));
    base.join("room").join("bootstrap.toml")
}

/// `$XDG_DATA_HOME/room`, else `~/.local/share/room`.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".local").join("share"))
        .join("room")
}

pub fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

fn split(reason: impl Into<String>) -> StoreError {
    StoreError::SplitBrain(reason.into())
}

/// Absolute, lexically normalised, symlinks not resolved.
pub fn lexical_absolute(dir: &Path) -> Result<PathBuf> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()?.join(dir)
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

fn read_bootstrap(path: &Path) -> Result<Bootstrap> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text)
            .map_err(|e| split(format!("bootstrap {} is unreadable: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Bootstrap::default()),
        Err(e) => Err(split(format!(
            "bootstrap {} is unreadable: {e}",
            path.display()
        ))),
    }
}

/// Every state directory `bootstrap` registers (none when it is missing or unreadable).
pub fn registered_roots(bootstrap: &Path) -> Vec<PathBuf> {
    read_bootstrap(bootstrap)
        .map(|b| b.instances.into_keys().map(PathBuf::from).collect())
        .unwrap_or_default()
}

/// The instance the bootstrap maps `root` to, if any.
pub fn registered_id(bootstrap: &Path, root: &Path) -> Result<Option<String>> {
    let canonical = root
        .to_str()
        .ok_or_else(|| split("state dir path is not UTF-8"))?;
    Ok(read_bootstrap(bootstrap)?.instances.get(canonical).cloned())
}

/// Map `root` to `id` in the bootstrap (a restored state dir on a machine that lost its
/// bootstrap). Another instance mapped there is a split brain.
pub fn register(bootstrap: &Path, root: &Path, id: &str) -> Result<()> {
    let canonical = root
        .to_str()
        .ok_or_else(|| split("state dir path is not UTF-8"))?
        .to_string();
    let mut boot = read_bootstrap(bootstrap)?;
    match boot.instances.get(&canonical) {
        Some(other) if other == id => return Ok(()),
        Some(other) => {
            return Err(split(format!(
                "bootstrap already maps {canonical} to instance {other}"
            )));
        }
        None => {}
    }
    boot.instances.insert(canonical, id.to_string());
    if let Some(parent) = bootstrap.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let text = toml::to_string(&boot).map_err(std::io::Error::other)?;
    write_atomic(bootstrap, text.as_bytes())?;
    Ok(())
}

/// Create the layout (idempotent: an existing valid state dir is returned as it is).
pub fn init(dir: &Path, bootstrap: &Path, new_instance_id: &str) -> Result<StateDir> {
    std::fs::create_dir_all(dir)?;
    let root = std::fs::canonicalize(dir)?;
    if root.join(MARKER).exists() {
        return validate(dir, bootstrap);
    }
    for sub in SUBDIRS {
        std::fs::create_dir_all(root.join(sub))?;
    }
    let config = root.join("config.toml");
    if !config.exists() {
        write_atomic(&config, DEFAULT_CONFIG.as_bytes())?;
    }
    let mut boot = read_bootstrap(bootstrap)?;
    let canonical = root
        .to_str()
        .ok_or_else(|| split("state dir path is not UTF-8"))?
        .to_string();
    if let Some(other) = boot.instances.get(&canonical) {
        return Err(split(format!(
            "bootstrap already maps {canonical} to instance {other} but the marker is missing"
        )));
    }
    let marker = Marker {
        id: new_instance_id.to_string(),
        canonical_path: canonical.clone(),
    };
    write_atomic(
        &root.join(MARKER),
        &serde_json::to_vec_pretty(&marker).map_err(std::io::Error::other)?,
    )?;
    boot.instances
        .insert(canonical, new_instance_id.to_string());
    if let Some(parent) = bootstrap.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let text = toml::to_string(&boot).map_err(std::io::Error::other)?;
    write_atomic(bootstrap, text.as_bytes())?;
    validate(dir, bootstrap)
}

/// Revalidate marker and bootstrap. Any doubt is `state_dir_split_brain`.
pub fn validate(dir: &Path, bootstrap: &Path) -> Result<StateDir> {
    let lexical = lexical_absolute(dir)?;
    let root = std::fs::canonicalize(dir).map_err(|e| {
        split(format!(
            "state dir {} cannot be resolved: {e}",
            dir.display()
        ))
    })?;
    if let Some(why) = crate::snapshot::pending_restore(&root) {
        return Err(StoreError::RestorePending(why));
    }
    if lexical != root {
        return Err(split(format!(
            "state dir {} is reached through a symlink (canonical {})",
            lexical.display(),
            root.display()
        )));
    }
    let marker_text = std::fs::read(root.join(MARKER))
        .map_err(|e| split(format!("marker {MARKER} missing or unreadable: {e}")))?;
    let marker: Marker = serde_json::from_slice(&marker_text)
        .map_err(|e| split(format!("marker {MARKER} is malformed: {e}")))?;
    let canonical = root
        .to_str()
        .ok_or_else(|| split("state dir path is not UTF-8"))?;
    if marker.canonical_path != canonical {
        return Err(split(format!(
            "marker names {} but this dir is {canonical} (copied or moved tree)",
            marker.canonical_path
        )));
    }
    let boot = read_bootstrap(bootstrap)?;
    match boot.instances.get(canonical) {
        None => Err(split(format!(
            "bootstrap {} does not know {canonical}",
            bootstrap.display()
        ))),
        Some(id) if *id != marker.id => Err(split(format!(
            "bootstrap maps {canonical} to instance {id} but the marker says {}",
            marker.id
        ))),
        Some(_) => Ok(StateDir {
            root,
            instance_id: marker.id,
        }),
    }
}

/// The exclusive daemon lock. Held for the daemon's lifetime; released by the kernel on exit,
/// even on SIGKILL, so a crashed daemon never blocks its successor.
///
/// Two locks: `room.lock` (which names the holder's pid) and the state directory itself. A
/// file can be unlinked from under its lock, and a second daemon would then lock a new file
/// of the same name; the directory cannot be replaced while this daemon runs in it without
/// its marker check failing, so its lock is the one that holds.
#[derive(Debug)]
pub struct DaemonLock {
    _file: std::fs::File,
    _dir: std::fs::File,
}

pub fn lock(state: &StateDir) -> Result<DaemonLock> {
    let dir = std::fs::File::open(&state.root)?;
    match rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let pid = std::fs::read_to_string(state.lock_path()).unwrap_or_default();
            return Err(StoreError::Locked {
                pid: pid.trim().to_string(),
            });
        }
        Err(e) => return Err(std::io::Error::from(e).into()),
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(state.lock_path())?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0)?;
            file.rewind()?;
            writeln!(file, "{}", std::process::id())?;
            file.sync_data()?;
            Ok(DaemonLock {
                _file: file,
                _dir: dir,
            })
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            Err(StoreError::Locked {
                pid: pid.trim().to_string(),
            })
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        (t, root.join("state"), root.join("cfg/bootstrap.toml"))
    }

    fn is_split(r: Result<StateDir>) -> String {
        match r {
            Err(StoreError::SplitBrain(why)) => why,
            other => panic!("expected split brain, got {other:?}"),
        }
    }

    /// `room.lock` unlinked under a live daemon: a second one is still refused (the state
    /// directory's own lock holds).
    #[test]
    fn the_daemon_lock_holds_when_its_file_is_unlinked() {
        let (_t, dir, boot) = setup();
        let s = init(&dir, &boot, "inst1").unwrap();
        let held = lock(&s).unwrap();
        assert!(matches!(lock(&s), Err(StoreError::Locked { .. })));
        std::fs::remove_file(s.lock_path()).unwrap();
        match lock(&s) {
            Err(StoreError::Locked { .. }) => {}
            other => panic!("a second lock after the unlink: {other:?}"),
        }
        drop(held);
        lock(&s).expect("the lock is free once its holder is gone");
    }

    #[test]
    fn init_then_validate_and_every_split_is_refused() {
        let (t, dir, boot) = setup();
        let s = init(&dir, &boot, "inst1").unwrap();
        assert_eq!(validate(&dir, &boot).unwrap().instance_id, s.instance_id);

        // unknown root: a different bootstrap
        let other_boot = t.path().join("other.toml");
        assert!(is_split(validate(&dir, &other_boot)).contains("does not know"));

        // a copied tree carries a marker naming the original path
        let copy = t.path().join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(dir.join(MARKER), copy.join(MARKER)).unwrap();
        assert!(is_split(validate(&copy, &boot)).contains("copied or moved"));

        // reached through a symlink
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(is_split(validate(&link, &boot)).contains("symlink"));

        // a different id in the bootstrap
        let text = std::fs::read_to_string(&boot)
            .unwrap()
            .replace("inst1", "inst2");
        std::fs::write(&boot, text).unwrap();
        assert!(is_split(validate(&dir, &boot)).contains("marker says"));

        // missing marker
        std::fs::remove_file(dir.join(MARKER)).unwrap();
        assert!(is_split(validate(&dir, &boot)).contains("missing"));
    }

    #[test]
    fn second_lock_names_the_first_pid() {
        let (_t, dir, boot) = setup();
        let s = init(&dir, &boot, "inst1").unwrap();
        let _held = lock(&s).unwrap();
        match lock(&s) {
            Err(StoreError::Locked { pid }) => assert_eq!(pid, std::process::id().to_string()),
            other => panic!("{other:?}"),
        }
    }
}
