//! Worker staging: before a worker starts, the exact sources its task selects are copied into
//! its own directory (`stage/`), each read beneath the project root without following a link,
//! refused if it is a symlink, not a regular file or hard-linked, verified against its pinned
//! SHA-256, and within `STAGE_BYTES_MAX` together. A structured source may be projected to
//! explicit rows and columns (JSON, JSONL, SQLite): the worker then gets only those, in
//! `<path>.projection.json`, with what was withheld recorded. A SQLite source is projected
//! from a private copy of its verified bytes: the live database is never opened.
//!
//! A worker's requested change comes back as a proposal the daemon applies (`proposal`).

use room_core::stage::{Format, Projection, SELECTIONS_MAX, STAGE_BYTES_MAX, Selection};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde_json::{Map, Value, json};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Why a launch could not be staged; `code` is stable, the launch records both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageError {
    /// `stage_digest_mismatch`, `stage_link_refused`, `stage_not_regular`, `stage_too_large`,
    /// `stage_unreadable`, `stage_projection_invalid`, `stage_selection_invalid`.
    pub code: &'static str,
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for StageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.code, self.path, self.message)
    }
}

pub(crate) fn err(code: &'static str, path: &str, message: impl Into<String>) -> StageError {
    StageError {
        code,
        path: path.into(),
        message: message.into(),
    }
}

/// Stage `selections` from beneath `root` into `dest` (created, 0700). Returns the manifest
/// (also written as `dest/manifest.json`). Nothing is staged unless every selection is.
pub fn stage(root: &Path, dest: &Path, selections: &[Selection]) -> Result<Value, StageError> {
    if selections.is_empty() || selections.len() > SELECTIONS_MAX {
        return Err(err(
            "stage_selection_invalid",
            "",
            format!("1 to {SELECTIONS_MAX} selections"),
        ));
    }
    room_core::stage::validate(selections)
        .map_err(|r| err("stage_selection_invalid", "", r.message))?;
    let rootfd = open_root(root)?;
    let mut total = 0u64;
    let mut read = Vec::with_capacity(selections.len());
    for s in selections {
        let bytes = read_pinned(&rootfd, s, STAGE_BYTES_MAX - total)?;
        total += bytes.len() as u64;
        read.push(bytes);
    }
    let mkdir = |d: &Path| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .map_err(|e| err("stage_unreadable", "", format!("{}: {e}", d.display())))
    };
    mkdir(dest)?;
    let mut rows = Vec::new();
    for (s, bytes) in selections.iter().zip(read) {
        let (name, out, projected) = match &s.project {
            None => (s.path.clone(), bytes, Value::Null),
            Some(p) => {
                let (doc, summary) = project(&s.path, p, &bytes, dest)?;
                let text = serde_json::to_vec_pretty(&doc).expect("projections serialize");
                (format!("{}.projection.json", s.path), text, summary)
            }
        };
        let at = dest.join(&name);
        if let Some(parent) = at.parent() {
            mkdir(parent)?;
        }
        write_new(&at, &out).map_err(|e| err("stage_unreadable", &s.path, e.to_string()))?;
        rows.push(
            json!({"path": s.path, "sha256": s.sha256, "staged_as": name,
            "bytes": out.len(), "projection": projected}),
        );
    }
    let manifest = json!({"schema": "room-stage-v1", "root": dest, "bytes_read": total,
        "selections": rows});
    let text = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
    write_new(&dest.join("manifest.json"), &text)
        .map_err(|e| err("stage_unreadable", "manifest.json", e.to_string()))?;
    Ok(manifest)
}

pub(crate) fn write_new(at: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(at)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Read one selection beneath the root (`read_beneath`), with the pinned digest.
fn read_pinned(
    root: &rustix::fd::OwnedFd,
    s: &Selection,
    left: u64,
) -> Result<Vec<u8>, StageError> {
    let (bytes, _) = read_beneath(root, &s.path, left)?;
    let digest = room_core::sha256_hex(&bytes);
    if digest != s.sha256 {
        return Err(err(
            "stage_digest_mismatch",
            &s.path,
            format!("its SHA-256 is {digest}, the task pinned {}", s.sha256),
        ));
    }
    Ok(bytes)
}

/// Open `path` beneath the root: no link followed at any component, a regular file with one
/// link.
pub(crate) fn open_beneath(
    root: &rustix::fd::OwnedFd,
    path: &str,
) -> Result<(rustix::fd::OwnedFd, rustix::fs::Stat), StageError> {
    let fd = rustix::fs::openat2(
        root,
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => {
            err("stage_link_refused", path, "a symlink on its path")
        }
        e => err("stage_unreadable", path, e.to_string()),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| err("stage_unreadable", path, e.to_string()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(err("stage_not_regular", path, "not a regular file"));
    }
    if st.st_nlink != 1 {
        return Err(err(
            "stage_link_refused",
            path,
            format!("hard-linked ({} links)", st.st_nlink),
        ));
    }
    Ok((fd, st))
}

/// The whole of `path` beneath the root (`open_beneath`), at most `left` bytes.
pub(crate) fn read_beneath(
    root: &rustix::fd::OwnedFd,
    path: &str,
    left: u64,
) -> Result<(Vec<u8>, rustix::fs::Stat), StageError> {
    let (fd, st) = open_beneath(root, path)?;
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    let too_large = || {
        err(
            "stage_too_large",
            path,
            format!("the selections exceed {STAGE_BYTES_MAX} bytes together"),
        )
    };
    if size > left {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::fs::File::from(fd)
        .take(left + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err("stage_unreadable", path, e.to_string()))?;
    if bytes.len() as u64 > left {
        return Err(too_large());
    }
    Ok((bytes, st))
}

/// The project root, held as a descriptor every selection is resolved beneath.
pub(crate) fn open_root(root: &Path) -> Result<rustix::fd::OwnedFd, StageError> {
    rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err("stage_unreadable", "", format!("the project root: {e}")))
}

/// The rows of a structured source, each an object.
pub(crate) fn source_rows(
    path: &str,
    p: &Projection,
    bytes: &[u8],
    scratch: &Path,
) -> Result<Vec<Map<String, Value>>, StageError> {
    let bad = |m: String| err("stage_projection_invalid", path, m);
    let objects = |v: Vec<Value>| -> Result<Vec<Map<String, Value>>, StageError> {
        v.into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Value::Object(m) => Ok(m),
                _ => Err(bad(format!("row {i} is not an object"))),
            })
            .collect()
    };
    match p.format {
        Format::Json => match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Array(a)) => objects(a),
            Ok(_) => Err(bad("a JSON source is an array of row objects".into())),
            Err(e) => Err(bad(format!("not JSON: {e}"))),
        },
        Format::Jsonl => {
            let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
            let rows = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .enumerate()
                .map(|(i, l)| {
                    serde_json::from_str(l).map_err(|e| bad(format!("line {}: {e}", i + 1)))
                })
                .collect::<Result<Vec<Value>, _>>()?;
            objects(rows)
        }
        Format::Sqlite => sqlite_rows(path, p, bytes, scratch),
    }
}

/// Rows of a SQLite table, read from a private copy of the verified bytes (never the live
/// file), opened read-only; the copy is removed after.
fn sqlite_rows(
    path: &str,
    p: &Projection,
    bytes: &[u8],
    scratch: &Path,
) -> Result<Vec<Map<String, Value>>, StageError> {
    let bad = |m: String| err("stage_projection_invalid", path, m);
    let tmp = scratch.join(format!(
        ".sqlite-{}",
        room_core::sha256_hex(path.as_bytes())
    ));
    write_new(&tmp, bytes).map_err(|e| err("stage_unreadable", path, e.to_string()))?;
    let read = || -> Result<Vec<Map<String, Value>>, StageError> {
        let conn = rusqlite::Connection::open_with_flags(
            &tmp,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| bad(e.to_string()))?;
        let table = p
            .table
            .as_deref()
            .expect("validated: a SQLite projection names its table");
        let mut st = conn
            .prepare(&format!("SELECT * FROM \"{table}\""))
            .map_err(|e| bad(e.to_string()))?;
        let names: Vec<String> = st.column_names().map(String::from).collect();
        let rows = st
            .query_map([], |r| {
                let mut m = Map::new();
                for (i, n) in names.iter().enumerate() {
                    let v = match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => Value::Null,
                        rusqlite::types::ValueRef::Integer(n) => json!(n),
                        rusqlite::types::ValueRef::Real(f) => json!(f),
                        rusqlite::types::ValueRef::Text(t) => {
                            json!(String::from_utf8_lossy(t))
                        }
                        rusqlite::types::ValueRef::Blob(b) => json!(room_core::sha256_hex(b)),
                    };
                    m.insert(n.clone(), v);
                }
                Ok(m)
            })
            .map_err(|e| bad(e.to_string()))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))
    };
    let out = read();
    let _ = std::fs::remove_file(&tmp);
    out
}

/// A row key in its text form (how projections show it and proposals name it).
pub(crate) fn key_text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// The projection of one source: kept rows with key, version and the named columns only, and
/// a summary of what was withheld.
fn project(
    path: &str,
    p: &Projection,
    bytes: &[u8],
    scratch: &Path,
) -> Result<(Value, Value), StageError> {
    let bad = |m: String| err("stage_projection_invalid", path, m);
    let rows = source_rows(path, p, bytes, scratch)?;
    let admitted: Option<std::collections::BTreeSet<&str>> = p
        .rows
        .as_ref()
        .map(|r| r.iter().map(String::as_str).collect());
    let mut kept = Vec::new();
    let mut withheld_rows = 0u64;
    let mut withheld_fields = std::collections::BTreeSet::new();
    for (i, r) in rows.iter().enumerate() {
        let Some(key) = key_text(r.get(&p.key)) else {
            return Err(bad(format!("row {i} has no {} key", p.key)));
        };
        if !r.get(&p.version).is_some_and(|v| v.is_i64() || v.is_u64()) {
            return Err(bad(format!("row {i} has no integer {} version", p.version)));
        }
        if admitted.as_ref().is_some_and(|a| !a.contains(key.as_str())) {
            withheld_rows += 1;
            continue;
        }
        let mut out = Map::new();
        for (name, v) in r {
            if name == &p.key || name == &p.version || p.columns.contains(name) {
                out.insert(name.clone(), v.clone());
            } else {
                withheld_fields.insert(name.clone());
            }
        }
        kept.push(Value::Object(out));
    }
    let summary = json!({"format": p.format, "table": p.table, "key": p.key,
        "version": p.version, "rows_kept": kept.len(), "rows_withheld": withheld_rows,
        "fields_withheld": withheld_fields});
    let doc = json!({"schema": "room-projection-v1", "source": path, "projection": summary,
        "rows": kept});
    Ok((doc, summary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn sel(path: &str, bytes: &[u8]) -> Selection {
        Selection {
            path: path.into(),
            sha256: room_core::sha256_hex(bytes),
            project: None,
        }
    }

    fn dirs() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let (root, dest) = (tmp.path().join("project"), tmp.path().join("stage"));
        std::fs::create_dir_all(root.join("src")).unwrap();
        (tmp, root, dest)
    }

    #[test]
    fn verified_sources_are_staged_and_listed() {
        let (_t, root, dest) = dirs();
        std::fs::write(root.join("src/a.rs"), b"fn a() {}").unwrap();
        let m = stage(&root, &dest, &[sel("src/a.rs", b"fn a() {}")]).unwrap();
        assert_eq!(std::fs::read(dest.join("src/a.rs")).unwrap(), b"fn a() {}");
        assert_eq!(m["selections"][0]["staged_as"], "src/a.rs");
        assert!(dest.join("manifest.json").exists());
    }

    #[test]
    fn a_digest_mismatch_stages_nothing() {
        let (_t, root, dest) = dirs();
        std::fs::write(root.join("src/a.rs"), b"changed").unwrap();
        let e = stage(&root, &dest, &[sel("src/a.rs", b"pinned")]).unwrap_err();
        assert_eq!(e.code, "stage_digest_mismatch", "{e}");
        assert!(!dest.exists(), "nothing staged");
    }

    #[test]
    fn symlinks_and_hard_links_are_refused() {
        let (_t, root, dest) = dirs();
        std::fs::write(root.join("src/a.rs"), b"x").unwrap();
        std::os::unix::fs::symlink("a.rs", root.join("src/link.rs")).unwrap();
        std::os::unix::fs::symlink("src", root.join("via")).unwrap();
        let outside = root.parent().unwrap().join("secret");
        std::fs::write(&outside, b"x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        for p in ["src/link.rs", "via/a.rs", "out"] {
            let e = stage(&root, &dest, &[sel(p, b"x")]).unwrap_err();
            assert_eq!(e.code, "stage_link_refused", "{p}: {e}");
        }
        std::fs::hard_link(root.join("src/a.rs"), root.join("src/hard.rs")).unwrap();
        let e = stage(&root, &dest, &[sel("src/hard.rs", b"x")]).unwrap_err();
        assert_eq!(e.code, "stage_link_refused", "{e}");
        std::fs::create_dir(root.join("src/dir")).unwrap();
        let e = stage(&root, &dest, &[sel("src/dir", b"x")]).unwrap_err();
        assert_eq!(e.code, "stage_not_regular", "{e}");
        assert!(!dest.exists());
    }

    #[test]
    fn one_byte_over_64_mib_is_refused() {
        let (_t, root, dest) = dirs();
        let f = std::fs::File::create(root.join("big")).unwrap();
        f.set_len(STAGE_BYTES_MAX + 1).unwrap();
        let e = stage(&root, &dest, &[sel("big", b"irrelevant")]).unwrap_err();
        assert_eq!(e.code, "stage_too_large", "{e}");
        // together, too: two halves and one byte more
        let half = STAGE_BYTES_MAX / 2;
        for n in ["h1", "h2"] {
            std::fs::File::create(root.join(n))
                .unwrap()
                .set_len(half)
                .unwrap();
        }
        std::fs::write(root.join("one"), b"1").unwrap();
        let zeros = vec![0u8; half as usize];
        let e = stage(
            &root,
            &dest,
            &[sel("h1", &zeros), sel("h2", &zeros), sel("one", b"1")],
        )
        .unwrap_err();
        assert_eq!(e.code, "stage_too_large", "{e}");
    }

    fn projection(format: Format, table: Option<&str>, rows: Option<&[&str]>) -> Projection {
        Projection {
            format,
            table: table.map(String::from),
            key: "id".into(),
            version: "v".into(),
            columns: vec!["name".into()],
            rows: rows.map(|r| r.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn json_and_jsonl_are_projected_to_their_rows_and_columns() {
        let (_t, root, dest) = dirs();
        let json =
            br#"[{"id":1,"v":3,"name":"a","secret":"s"},{"id":2,"v":1,"name":"b","secret":"t"}]"#;
        let jsonl = b"{\"id\":\"x\",\"v\":1,\"name\":\"n\",\"pin\":4}\n{\"id\":\"y\",\"v\":2,\"name\":\"m\"}\n";
        std::fs::write(root.join("t.json"), json).unwrap();
        std::fs::write(root.join("t.jsonl"), jsonl).unwrap();
        let mut a = sel("t.json", json);
        a.project = Some(projection(Format::Json, None, Some(&["1"])));
        let mut b = sel("t.jsonl", jsonl);
        b.project = Some(projection(Format::Jsonl, None, None));
        let m = stage(&root, &dest, &[a, b]).unwrap();
        let doc: Value =
            serde_json::from_slice(&std::fs::read(dest.join("t.json.projection.json")).unwrap())
                .unwrap();
        assert_eq!(doc["rows"], json!([{"id": 1, "v": 3, "name": "a"}]));
        assert_eq!(m["selections"][0]["projection"]["rows_withheld"], 1);
        assert_eq!(
            m["selections"][0]["projection"]["fields_withheld"],
            json!(["secret"])
        );
        assert_eq!(m["selections"][1]["projection"]["rows_kept"], 2);
        assert!(
            !dest.join("t.json").exists(),
            "the whole source is not staged"
        );
        // a row without an integer version is refused
        let bad = br#"[{"id":1,"v":"3"}]"#;
        std::fs::write(root.join("bad.json"), bad).unwrap();
        let mut c = sel("bad.json", bad);
        c.project = Some(projection(Format::Json, None, None));
        let e = stage(&root, &dest.join("again"), &[c]).unwrap_err();
        assert_eq!(e.code, "stage_projection_invalid", "{e}");
    }

    #[test]
    fn a_sqlite_projection_reads_a_copy_and_never_touches_the_live_file() {
        let (_t, root, dest) = dirs();
        let live = root.join("app.db");
        {
            let c = rusqlite::Connection::open(&live).unwrap();
            c.execute_batch(
                "CREATE TABLE users (id INTEGER PRIMARY KEY, v INTEGER, name TEXT, token TEXT);
                 INSERT INTO users VALUES (1, 1, 'ada', 'k1'), (2, 4, 'bob', 'k2');",
            )
            .unwrap();
        }
        let before = std::fs::metadata(&live).unwrap();
        let bytes = std::fs::read(&live).unwrap();
        let mut s = sel("app.db", &bytes);
        s.project = Some(projection(Format::Sqlite, Some("users"), Some(&["2"])));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let m = stage(&root, &dest, &[s]).unwrap();
        let after = std::fs::metadata(&live).unwrap();
        assert_eq!(
            (before.ino(), before.mtime_nsec(), before.mtime()),
            (after.ino(), after.mtime_nsec(), after.mtime())
        );
        assert!(!root.join("app.db-journal").exists() && !root.join("app.db-wal").exists());
        let doc: Value =
            serde_json::from_slice(&std::fs::read(dest.join("app.db.projection.json")).unwrap())
                .unwrap();
        assert_eq!(doc["rows"], json!([{"id": 2, "v": 4, "name": "bob"}]));
        assert_eq!(
            m["selections"][0]["projection"]["fields_withheld"],
            json!(["token"])
        );
        // the private copy is gone
        let left: Vec<_> = std::fs::read_dir(&dest)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".sqlite-"))
            .collect();
        assert!(left.is_empty());
    }
}
