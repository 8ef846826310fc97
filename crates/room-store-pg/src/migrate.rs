//! `room migrate`: an embedded state dir's store copied into an empty PostgreSQL database
//! (issue 44).
//!
//! Each room's journal is copied record by record through the backends' own paths: read by
//! the SQLite backend (which replays its commit log first, as a daemon start does), appended
//! by the PostgreSQL one (which checks each record against the head it locks), then verified
//! whole on both sides, and the two verdicts must agree to the byte. The room's blobs follow,
//! and the parts of its sync index the journal cannot re-create: receipts, checkpoints,
//! source reads, vectors and the log's trust. The rest of the index is rebuilt from the
//! journal by the first daemon that opens the room, as after `room index rebuild`.
//!
//! The control store goes last, in one transaction that also marks the migration finished.
//! Until then the database is refused to a daemon (`StoreError::MigrationUnfinished`), and
//! running the migration again resumes it: a room already whole is checked and kept, a room
//! cut short is continued from its head, after checking that head is the source's record.
//! A database that holds anything else is refused as a target (`MigrateError::NotEmpty`).

use crate::{PgBackend, pg};
use room_core::chain::Sealed;
use room_store::backend::{Backend, RoomLog};
use room_store::control::RoomRow;
use room_store::journal::{Scanned, VerifyReport};
use room_store::statedir::StateDir;
use room_store::{SqliteBackend, StoreError};
use rusqlite::types::Value;
use tokio_postgres::types::{ToSql, Type};

/// The table that records migrations into a database (a step of `crate::MIGRATIONS`).
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE migrate_runs (
    source_id text COLLATE "C" PRIMARY KEY,
    source_path text NOT NULL,
    started_ms bigint NOT NULL,
    finished_ms bigint
);
"#;

/// Records appended to the target in one transaction, at most.
const BATCH_RECORDS_MAX: usize = 512;
/// Journal bytes appended to the target in one transaction, at most (one record may exceed it).
const BATCH_BYTES_MAX: usize = 4 << 20;

/// The control tables, each after the tables it references.
const CONTROL_TABLES: &[&str] = &[
    "agents",
    "retired_secrets",
    "denied_verbs",
    "projects",
    "project_sources",
    "rooms",
    "members",
    "tasks",
    "task_scopes",
    "task_checks",
    "wakes",
    "launches",
    "sessions",
    "holds",
    "collabs",
    "collab_runs",
    "collab_approvals",
    "compositions",
];

/// control.db's own bookkeeping, which has a counterpart of its own in the target (`meta`)
/// or none.
const CONTROL_TABLES_NOT_COPIED: &[&str] = &["meta"];

/// control.db's `meta` keys the target keeps (in `control_meta`, as integers).
const CONTROL_META_KEYS: &[&str] = &[
    "control_epoch",
    "break_glass",
    "lease_gen_floor",
    "wakes_requeue",
];

/// A source's expression for each target column named otherwise there: (target, source).
type Aliases = &'static [(&'static str, &'static str)];

/// The sync index's tables the journal does not re-create, each with the source's expression
/// for a target column named otherwise there (a receipt's `ordinal` is SQLite's rowid) and
/// the order its rows keep.
const INDEX_TABLES: &[(&str, Aliases, &str)] = &[
    ("checkpoints", &[], ""),
    ("receipts", &[("ordinal", "rowid")], " ORDER BY rowid"),
    ("source_reads", &[], " ORDER BY rowid"),
    ("embeddings", &[], ""),
];

/// The sync index's `meta` keys that are not the journal's to re-create.
const INDEX_META_KEYS: &[&str] = &["log_trust"];

/// Tables a database must hold no row in to be a migration's target.
const MUST_BE_EMPTY: &[&str] = &[
    "shards",
    "journal",
    "blobs",
    "agents",
    "projects",
    "rooms",
    "tasks",
    "wakes",
    "launches",
    "sessions",
    "collabs",
    "index_meta",
    "receipts",
    "checkpoints",
];

/// Why a migration stopped.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The target holds something else: nothing was written.
    #[error("{0}")]
    NotEmpty(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Result<T> = std::result::Result<T, MigrateError>;

/// The state dir a migration copies, opened by the caller (validated, its lock held).
pub struct Source<'a> {
    pub state: &'a StateDir,
    pub store: &'a SqliteBackend,
}

/// One room as it stands in the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomCopied {
    pub name: String,
    pub graph_id: String,
    /// Records its chain holds, on both sides.
    pub records: u64,
    /// Of them, the ones this run appended (fewer when it resumed).
    pub appended: u64,
    pub tip_hash: String,
    pub blobs: u64,
    /// Receipts, checkpoints, source reads and vectors copied.
    pub index_rows: u64,
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// It continued an earlier run that had not finished.
    pub resumed: bool,
    pub rooms: Vec<RoomCopied>,
    pub control_rows: u64,
}

/// A step done, for the caller to report as it goes.
#[derive(Debug)]
pub enum Progress<'a> {
    Room(&'a RoomCopied),
    Control { rows: u64 },
}

/// Copy `src` into `dst` (see the module comment), reporting each step to `progress`.
pub fn migrate(
    src: &Source<'_>,
    dst: &PgBackend,
    now_ms: u64,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Migrated> {
    // no daemon serves the target while it is filled (and none starts: the run is unfinished)
    dst.hold_alone()?;
    let source_path = src.state.root.display().to_string();
    let resumed = claim(dst, &src.state.instance_id, &source_path, now_ms)?;
    // the database is the migration's now: whatever served it before is fenced
    dst.start_serving()?;
    let control = src.store.open_control()?;
    let mut rooms = Vec::new();
    for room in control.rooms()? {
        let copied = copy_room(src, dst, &room)?;
        progress(Progress::Room(&copied));
        rooms.push(copied);
    }
    drop(control);
    let control_rows = copy_control(src, dst, &src.state.instance_id, now_ms)?;
    progress(Progress::Control { rows: control_rows });
    Ok(Migrated {
        resumed,
        rooms,
        control_rows,
    })
}

/// Start a run, or find the unfinished one of the same source; true when resuming.
fn claim(dst: &PgBackend, source_id: &str, source_path: &str, now_ms: u64) -> Result<bool> {
    let (id, path, now) = (
        source_id.to_string(),
        source_path.to_string(),
        crate::index::i(now_ms),
    );
    let pool = dst.pool.clone();
    let outcome: std::result::Result<bool, String> = dst.run(async move {
        let mut c = pool.get().await.map_err(pg)?;
        let tx = c.transaction().await.map_err(pg)?;
        tx.execute("LOCK TABLE migrate_runs IN EXCLUSIVE MODE", &[])
            .await
            .map_err(pg)?;
        let runs = tx
            .query(
                "SELECT source_id, source_path, finished_ms FROM migrate_runs",
                &[],
            )
            .await
            .map_err(pg)?;
        for r in &runs {
            let (sid, spath, finished): (String, String, Option<i64>) =
                (r.get(0), r.get(1), r.get(2));
            if finished.is_some() {
                return Ok(Err(format!(
                    "the database already holds the state dir migrated from {spath} (instance {sid})"
                )));
            }
            if sid != id {
                return Ok(Err(format!(
                    "a migration from another state dir ({spath}, instance {sid}) has not finished in this database"
                )));
            }
        }
        // an empty database is the migrated state dir's, whatever instance served it before
        // (a run resumed binds it too: one begun before the binding existed had not)
        let bind = "INSERT INTO store_instance (instance, bound_ms) VALUES ($1, $2)
             ON CONFLICT (only_row) DO UPDATE SET instance = excluded.instance, bound_ms = excluded.bound_ms";
        if !runs.is_empty() {
            tx.execute(bind, &[&id, &now]).await.map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            return Ok(Ok(true));
        }
        for t in MUST_BE_EMPTY {
            let held: bool = tx
                .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {t})"), &[])
                .await
                .map_err(pg)?
                .get(0);
            if held {
                return Ok(Err(format!("the database is not empty: its table {t} holds rows")));
            }
        }
        tx.execute(bind, &[&id, &now]).await.map_err(pg)?;
        tx.execute(
            "INSERT INTO migrate_runs (source_id, source_path, started_ms) VALUES ($1, $2, $3)",
            &[&id, &path, &now],
        )
        .await
        .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(Ok(false))
    })?;
    outcome.map_err(MigrateError::NotEmpty)
}

/// Appends a source room's records to the target, from where the target's head stands.
struct Copier<'a> {
    dst: &'a PgBackend,
    graph_id: &'a str,
    binding: Vec<u8>,
    manifest: Vec<u8>,
    /// The target's head when the run began (none when it had no such room yet).
    start: Option<room_core::chain::ChainTip>,
    log: Option<Box<dyn RoomLog>>,
    batch: Vec<Sealed>,
    batch_bytes: usize,
    records: u64,
    appended: u64,
}

impl Copier<'_> {
    fn take(&mut self, s: Scanned) -> room_store::Result<()> {
        self.records += 1;
        let sealed = Sealed::of(s.record);
        let seq = sealed.record().seq;
        if let Some(start) = &self.start {
            if seq < start.seq {
                return Ok(());
            }
            if seq == start.seq {
                // the chain makes one hash stand for everything before it
                if sealed.record().hash != start.hash {
                    return Err(StoreError::Corrupt(format!(
                        "{}: the database's copy of this room differs from the state dir's at seq {seq}",
                        self.graph_id
                    )));
                }
                return Ok(());
            }
        }
        self.batch_bytes += sealed.line().len();
        self.batch.push(sealed);
        if self.batch.len() >= BATCH_RECORDS_MAX || self.batch_bytes >= BATCH_BYTES_MAX {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> room_store::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        match &mut self.log {
            Some(log) => {
                log.append(&batch)?;
            }
            None => {
                // the room's shard, whole with its first records, or not at all
                self.dst
                    .create_shard(self.graph_id, &self.binding, &self.manifest, &batch)?;
                self.log = Some(self.dst.open_log(self.graph_id, None, &mut |_| Ok(()))?);
            }
        }
        self.appended += batch.len() as u64;
        Ok(())
    }
}

/// Copy one room: its journal (checked on both sides), blobs and the index's survivors.
fn copy_room(src: &Source<'_>, dst: &PgBackend, room: &RoomRow) -> Result<RoomCopied> {
    let g = room.graph_id.as_str();
    let name = &room.name;
    let at = |e: StoreError| StoreError::Corrupt(format!("room {name}: {e}"));
    let binding = src.store.read_binding(g).map_err(at)?;
    let manifest =
        std::fs::read(src.state.shard(g).manifest()).map_err(|e| at(StoreError::Io(e)))?;
    let start = match dst.read_binding(g) {
        Ok(_) => Some(dst.open_log(g, None, &mut |_| Ok(())).map_err(at)?),
        Err(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(at(e).into()),
    };
    let mut copier = Copier {
        dst,
        graph_id: g,
        binding,
        manifest,
        start: start.as_ref().map(|l| l.tip()),
        log: start,
        batch: Vec::new(),
        batch_bytes: 0,
        records: 0,
        appended: 0,
    };
    // opening replays what the commit log holds and cuts a torn tail, as a daemon start does
    let opened = src.store.open_log(g, None, &mut |s| copier.take(s));
    drop(opened.map_err(at)?);
    copier.flush().map_err(at)?;
    if copier.log.is_none() {
        return Err(at(StoreError::Corrupt("its journal holds no record".into())).into());
    }
    let theirs = src.store.verify_log(g).map_err(at)?;
    whole(name, "state dir", &theirs)?;
    let ours = dst.verify_log(g).map_err(at)?;
    whole(name, "database", &ours)?;
    if (ours.records, &ours.tip_hash, ours.bytes)
        != (theirs.records, &theirs.tip_hash, theirs.bytes)
        || copier.records != theirs.records
    {
        return Err(at(StoreError::Corrupt(format!(
            "the copies differ: the state dir's chain holds {} records to {} ({} bytes), the database's {} to {} ({} bytes)",
            theirs.records, theirs.tip_hash, theirs.bytes, ours.records, ours.tip_hash, ours.bytes
        )))
        .into());
    }
    let blobs = copy_blobs(src, dst, g).map_err(at)?;
    let index_rows = copy_index(src, dst, g).map_err(at)?;
    Ok(RoomCopied {
        name: name.clone(),
        graph_id: g.to_string(),
        records: ours.records,
        appended: copier.appended,
        tip_hash: ours.tip_hash,
        blobs,
        index_rows,
    })
}

/// A verification that found damage is a refusal to copy: only whole chains move.
fn whole(room: &str, side: &str, v: &VerifyReport) -> Result<()> {
    match &v.damage {
        Some(d) => Err(StoreError::Corrupt(format!(
            "room {room}: the {side}'s journal does not verify ({d}); hint: `room verify {room}` says where, and a migration copies only whole chains"
        ))
        .into()),
        None => Ok(()),
    }
}

/// Every blob of a room, each checked against its name; how many.
fn copy_blobs(src: &Source<'_>, dst: &PgBackend, g: &str) -> room_store::Result<u64> {
    let dir = src.state.shard(g).blobs();
    let entries = match std::fs::read_dir(&dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let blobs = dst.open_blobs(g)?;
    let mut n = 0;
    for e in entries {
        let e = e?;
        let file = e.file_name();
        let Some(file) = file.to_str() else {
            return Err(StoreError::Corrupt(format!(
                "blob file {:?} is not named by a digest",
                e.path()
            )));
        };
        // what a crash left of a write is no blob (a record names only what was renamed)
        if file.starts_with('.') {
            continue;
        }
        let Some((sha, ext)) = file.split_once('.') else {
            return Err(StoreError::Corrupt(format!(
                "blob file {file:?} has no extension"
            )));
        };
        let bytes = std::fs::read(e.path())?;
        let put = blobs.put(&bytes, ext)?;
        if put != sha {
            return Err(StoreError::Corrupt(format!(
                "blob {file} does not match its digest ({put})"
            )));
        }
        n += 1;
    }
    Ok(n)
}

/// A table's rows read from SQLite, ready to be written to its PostgreSQL namesake.
struct Rows {
    table: String,
    columns: Vec<(String, Type)>,
    rows: Vec<Vec<Value>>,
}

/// The target columns of `table` that a copy writes (not an identity; not `graph_id` in a
/// room's table, `per_room`, where each row takes the room's), typed.
fn target_columns(
    dst: &PgBackend,
    table: &str,
    per_room: bool,
) -> room_store::Result<Vec<(String, Type)>> {
    let (pool, t) = (dst.pool.clone(), table.to_string());
    let cols: Vec<(String, String)> = dst.run(async move {
        let c = pool.get().await.map_err(pg)?;
        let rows = c
            .query(
                "SELECT column_name::text, data_type::text FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = $1
                   AND NOT ($2 AND column_name = 'graph_id')
                   AND is_identity = 'NO' AND is_generated = 'NEVER'
                 ORDER BY ordinal_position",
                &[&t, &per_room],
            )
            .await
            .map_err(pg)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    })?;
    if cols.is_empty() {
        return Err(StoreError::Corrupt(format!(
            "the database has no table {table}"
        )));
    }
    cols.into_iter()
        .map(|(name, ty)| {
            let ty = match ty.as_str() {
                "bigint" => Type::INT8,
                "integer" => Type::INT4,
                "boolean" => Type::BOOL,
                "text" => Type::TEXT,
                "bytea" => Type::BYTEA,
                "double precision" => Type::FLOAT8,
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "{table}.{name}: a column of type {other} has no copy from SQLite"
                    )));
                }
            };
            Ok((name, ty))
        })
        .collect()
}

/// Read `table` from `conn` as the target's columns want it (`alias`: the source's expression
/// for a column named otherwise there).
fn read_rows(
    conn: &rusqlite::Connection,
    table: &str,
    columns: Vec<(String, Type)>,
    alias: &[(&str, &str)],
    order: &str,
) -> room_store::Result<Rows> {
    let exprs: Vec<String> = columns
        .iter()
        .map(|(c, _)| {
            alias
                .iter()
                .find(|(to, _)| to == c)
                .map_or_else(|| format!("\"{c}\""), |(_, from)| (*from).to_string())
        })
        .collect();
    let sql = format!("SELECT {} FROM \"{table}\"{order}", exprs.join(", "));
    let mut st = conn
        .prepare(&sql)
        .map_err(|e| StoreError::Corrupt(format!("reading {table}: {e}")))?;
    let n = columns.len();
    let rows = st
        .query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect())?
        .collect::<std::result::Result<Vec<Vec<Value>>, _>>()?;
    Ok(Rows {
        table: table.to_string(),
        columns,
        rows,
    })
}

/// One SQLite value as the parameter a target column of type `ty` takes.
fn param(v: &Value, ty: &Type, at: &str) -> room_store::Result<Box<dyn ToSql + Sync + Send>> {
    let wrong = || StoreError::Corrupt(format!("{at}: {v:?} does not fit a {ty} column"));
    Ok(match (ty, v) {
        (t, Value::Null) if *t == Type::INT8 => Box::new(None::<i64>),
        (t, Value::Null) if *t == Type::INT4 => Box::new(None::<i32>),
        (t, Value::Null) if *t == Type::BOOL => Box::new(None::<bool>),
        (t, Value::Null) if *t == Type::TEXT => Box::new(None::<String>),
        (t, Value::Null) if *t == Type::BYTEA => Box::new(None::<Vec<u8>>),
        (t, Value::Null) if *t == Type::FLOAT8 => Box::new(None::<f64>),
        (t, Value::Integer(i)) if *t == Type::INT8 => Box::new(*i),
        (t, Value::Text(s)) if *t == Type::INT8 => Box::new(s.parse::<i64>().map_err(|_| wrong())?),
        (t, Value::Integer(i)) if *t == Type::INT4 => {
            Box::new(i32::try_from(*i).map_err(|_| wrong())?)
        }
        (t, Value::Integer(i)) if *t == Type::BOOL => Box::new(*i != 0),
        (t, Value::Text(s)) if *t == Type::TEXT => Box::new(s.clone()),
        (t, Value::Blob(b)) if *t == Type::BYTEA => Box::new(b.clone()),
        (t, Value::Text(s)) if *t == Type::BYTEA => Box::new(s.clone().into_bytes()),
        (t, Value::Real(f)) if *t == Type::FLOAT8 => Box::new(*f),
        (t, Value::Integer(i)) if *t == Type::FLOAT8 => Box::new(*i as f64),
        _ => return Err(wrong()),
    })
}

/// Write `rows` into their table with one `COPY` (one statement: references among its own
/// rows, a task's parent, are checked at its end), `graph` in each row's `graph_id` when set.
async fn copy_in(
    tx: &tokio_postgres::Transaction<'_>,
    rows: Rows,
    graph: Option<&str>,
) -> room_store::Result<u64> {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    if rows.rows.is_empty() {
        return Ok(0);
    }
    let mut names: Vec<String> = rows
        .columns
        .iter()
        .map(|(c, _)| format!("\"{c}\""))
        .collect();
    let mut types: Vec<Type> = rows.columns.iter().map(|(_, t)| t.clone()).collect();
    if graph.is_some() {
        names.insert(0, "graph_id".into());
        types.insert(0, Type::TEXT);
    }
    let sink = tx
        .copy_in(&format!(
            "COPY \"{}\" ({}) FROM STDIN BINARY",
            rows.table,
            names.join(", ")
        ))
        .await
        .map_err(pg)?;
    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &types));
    for (n, row) in rows.rows.iter().enumerate() {
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::with_capacity(row.len() + 1);
        if let Some(g) = graph {
            params.push(Box::new(g.to_string()));
        }
        for ((col, ty), v) in rows.columns.iter().zip(row) {
            params.push(param(
                v,
                ty,
                &format!("{}.{col} (row {})", rows.table, n + 1),
            )?);
        }
        let refs: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        writer.as_mut().write(&refs).await.map_err(pg)?;
    }
    writer.finish().await.map_err(pg)
}

/// The parts of a room's sync index the journal does not re-create, replacing any an
/// interrupted run left; how many rows.
fn copy_index(src: &Source<'_>, dst: &PgBackend, g: &str) -> room_store::Result<u64> {
    // the backend brings the index's schema up to date before it is read here
    drop(src.store.open_index(g)?);
    let conn = rusqlite::Connection::open_with_flags(
        src.state.shard(g).index(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    let mut tables = Vec::new();
    for (table, alias, order) in INDEX_TABLES {
        let columns = target_columns(dst, table, true)?;
        tables.push(read_rows(&conn, table, columns, alias, order)?);
    }
    let mut meta = Vec::new();
    for key in INDEX_META_KEYS {
        let value: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        if let Some(v) = value {
            meta.push((key.to_string(), v));
        }
    }
    drop(conn);
    let (pool, g) = (dst.pool.clone(), g.to_string());
    dst.run_unbounded(async move {
        let mut c = pool.get().await.map_err(pg)?;
        let tx = c.transaction().await.map_err(pg)?;
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(pg)?;
        let mut n = 0;
        for rows in tables {
            tx.execute(
                &format!("DELETE FROM \"{}\" WHERE graph_id = $1", rows.table),
                &[&g],
            )
            .await
            .map_err(pg)?;
            n += copy_in(&tx, rows, Some(&g)).await?;
        }
        for (key, value) in &meta {
            tx.execute(
                "INSERT INTO index_meta (graph_id, key, value) VALUES ($1, $2, $3)
                 ON CONFLICT (graph_id, key) DO UPDATE SET value = excluded.value",
                &[&g, key, value],
            )
            .await
            .map_err(pg)?;
        }
        crate::index::bump(&tx, &g).await?;
        tx.commit().await.map_err(pg)?;
        Ok(n)
    })
}

/// The control store whole, with the run marked finished, in one transaction; how many rows.
fn copy_control(
    src: &Source<'_>,
    dst: &PgBackend,
    source_id: &str,
    now_ms: u64,
) -> room_store::Result<u64> {
    let conn = rusqlite::Connection::open_with_flags(
        src.state.control_db(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    // a table this build does not know would be lost without a word: refuse instead
    let mut st = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )?;
    let held = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<std::result::Result<Vec<_>, _>>()?;
    drop(st);
    if let Some(t) = held.iter().find(|t| {
        !CONTROL_TABLES.contains(&t.as_str()) && !CONTROL_TABLES_NOT_COPIED.contains(&t.as_str())
    }) {
        return Err(StoreError::Corrupt(format!(
            "control.db holds a table {t} this build of Room cannot copy: upgrade Room"
        )));
    }
    let mut tables = Vec::new();
    for table in CONTROL_TABLES {
        let columns = target_columns(dst, table, false)?;
        tables.push(read_rows(&conn, table, columns, &[], " ORDER BY rowid")?);
    }
    let mut meta = Vec::new();
    for key in CONTROL_META_KEYS {
        let value: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        let value = value
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    StoreError::Corrupt(format!("control.db meta {key} {v:?} is not an integer"))
                })
            })
            .transpose()?;
        meta.push((key.to_string(), value));
    }
    drop(conn);
    let (pool, id, now) = (
        dst.pool.clone(),
        source_id.to_string(),
        crate::index::i(now_ms),
    );
    dst.run_unbounded(async move {
        let mut c = pool.get().await.map_err(pg)?;
        let tx = c.transaction().await.map_err(pg)?;
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(pg)?;
        let mut n = 0;
        for rows in tables {
            n += copy_in(&tx, rows, None).await?;
        }
        for (key, value) in &meta {
            match value {
                Some(v) => tx
                    .execute(
                        "INSERT INTO control_meta (key, value) VALUES ($1, $2)
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        &[key, v],
                    )
                    .await
                    .map_err(pg)?,
                None => tx
                    .execute("DELETE FROM control_meta WHERE key = $1", &[key])
                    .await
                    .map_err(pg)?,
            };
        }
        tx.execute("SELECT nextval('control_writes')", &[])
            .await
            .map_err(pg)?;
        let marked = tx
            .execute(
                "UPDATE migrate_runs SET finished_ms = $2 WHERE source_id = $1 AND finished_ms IS NULL",
                &[&id, &now],
            )
            .await
            .map_err(pg)?;
        if marked != 1 {
            return Err(StoreError::Corrupt(
                "the migration's run is no longer open in the database".into(),
            ));
        }
        tx.commit().await.map_err(pg)?;
        Ok(n)
    })
}
