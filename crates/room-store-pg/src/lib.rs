//! Room's PostgreSQL storage backend (issue 44), behind the same [`Backend`] traits as the
//! embedded SQLite one and held to the same conformance suite. It stores everything the
//! embedded one does: each room's shard (binding and manifest), its journal (a table of the
//! very lines the file journal holds, with the same hash chain, offsets and marks), its blobs
//! and sync index, and the control store. A room's head row is locked in each append's
//! transaction, so writers on several daemons sharing one database keep each chain linear:
//! the one that finds the head moved gets `StoreError::Conflict`, never a fork. A commit
//! whose answer was lost is read back before anything is claimed (`InDoubt` only when even
//! that cannot tell). `migrate` copies an embedded state dir's store into an empty database.
//!
//! Several daemons on one database are not built yet: a daemon holds its database alone
//! (`PgBackend::serve_alone`), and is fenced once another takes it over (`serving`).
//!
//! The traits are synchronous (the engine runs on blocking threads); every call here runs
//! on this backend's own small tokio runtime and is waited for on the caller's thread, so a
//! caller on any thread works.

mod control;
mod control_collab;
mod control_tasks;
mod control_wakes;
mod index;
mod log;
pub mod migrate;
mod serving;

pub use control::PgControl;
pub use index::PgIndex;
pub use log::PgLog;
pub use tokio_postgres::Config as PgConfig;
pub use tokio_postgres::config::Host as PgHost;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use room_core::Sealed;
use room_core::chain::ChainTip;
use room_store::backend::{
    Backend, BlobStore, ControlStore, RoomIndex, RoomLog, RoomWriters, ScanEach, ShardCreated,
    WriterGuard,
};
use room_store::journal::{ChainPos, JournalMark, VerifyReport};
use room_store::{Result, StoreError};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Connections one backend keeps at most.
pub const POOL_MAX: usize = 16;
/// The longest a connection may take to open.
const CONNECT_TIMEOUT_MS: u64 = 10_000;
/// The longest one statement may run on the server.
const STATEMENT_TIMEOUT_MS: u64 = 60_000;
/// A transaction idle this long (its client cut off mid-transaction) is ended by the server.
const IDLE_IN_TRANSACTION_MS: u64 = 60_000;
/// TCP keepalives (seconds, probes) on every connection, the server's side included: a
/// silent peer is given up after about 25 s.
pub(crate) const KEEPALIVE_IDLE_S: u64 = 10;
pub(crate) const KEEPALIVE_INTERVAL_S: u64 = 5;
pub(crate) const KEEPALIVE_COUNT: u32 = 3;
/// How long the server's side waits for its sent data to be acknowledged before it gives
/// up a connection (keepalives do not fire while data is unacknowledged).
const TCP_USER_TIMEOUT_MS: u64 = 25_000;
/// The longest a caller waits for one call (a pool connection and its statements).
pub(crate) const CALL_TIMEOUT_MS: u64 = 90_000;
/// The advisory lock key migrations run under (daemons starting together apply them once).
const MIGRATION_LOCK: i64 = 0x526f_6f6d_4d69_6731; // "RoomMig1"

/// The schema, one step per entry; `room_migrations` records the steps applied.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE shards (
    graph_id text PRIMARY KEY,
    id bigserial UNIQUE NOT NULL,
    binding bytea NOT NULL,
    manifest bytea NOT NULL
);
CREATE TABLE room_heads (
    graph_id text PRIMARY KEY REFERENCES shards (graph_id) ON UPDATE CASCADE ON DELETE CASCADE,
    seq bigint NOT NULL,
    len bigint NOT NULL,
    hash text NOT NULL,
    hlc_ms bigint NOT NULL,
    hlc_c bigint NOT NULL
);
CREATE TABLE journal (
    graph_id text NOT NULL REFERENCES shards (graph_id) ON UPDATE CASCADE ON DELETE CASCADE,
    seq bigint NOT NULL,
    "offset" bigint NOT NULL,
    line bytea NOT NULL,
    PRIMARY KEY (graph_id, seq)
);
CREATE TABLE journal_cut (
    graph_id text NOT NULL,
    seq bigint NOT NULL,
    "offset" bigint NOT NULL,
    line bytea NOT NULL,
    cut_id bigint NOT NULL
);
CREATE SEQUENCE journal_cuts;
CREATE TABLE blobs (
    graph_id text NOT NULL REFERENCES shards (graph_id) ON UPDATE CASCADE ON DELETE CASCADE,
    name text NOT NULL,
    bytes bytea NOT NULL,
    PRIMARY KEY (graph_id, name)
);
"#,
    control::SCHEMA,
    control_tasks::SCHEMA,
    control_wakes::SCHEMA,
    control_collab::SCHEMA,
    index::META_SCHEMA,
    index::events::SCHEMA,
    index::items::SCHEMA,
    index::ledger::SCHEMA,
    migrate::SCHEMA,
    control_collab::COMPOSITIONS_SCHEMA,
    INSTANCE_SCHEMA,
    serving::SCHEMA,
];

/// The Room instance a database belongs to: the state dir instance of the first daemon that
/// served it (or of the state dir migrated into it). Wake permits, read positions and
/// conversations are keyed by the instance, so a daemon of another instance would read them
/// all as someone else's. A database migrated before this table existed belongs to the
/// state dir it was migrated from.
const INSTANCE_SCHEMA: &str = r#"
CREATE TABLE store_instance (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    instance text COLLATE "C" NOT NULL,
    bound_ms bigint NOT NULL
);
INSERT INTO store_instance (instance, bound_ms)
    SELECT source_id, finished_ms FROM migrate_runs WHERE finished_ms IS NOT NULL LIMIT 1;
"#;

/// The prefix of a shard kept aside (set aside, or a stray swept): never read as a room.
const ASIDE: &str = "aside:";

/// Map a driver error to the store's, with the causes the driver keeps beneath it (the
/// server's own message is one: "db error" alone says nothing).
pub(crate) fn pg(e: impl std::error::Error) -> StoreError {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        // a wrapper often repeats its cause's words
        if !text.contains(&c_text) {
            text.push_str(&format!(": {c_text}"));
        }
        cause = c.source();
    }
    StoreError::Postgres(text)
}

/// The backend's own runtime, shared by every part it opened. The last holder may drop it
/// anywhere, a daemon's async context included, where a runtime's blocking shutdown panics:
/// it is shut down in the background instead (its calls were each waited for already).
pub(crate) struct Rt(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Rt {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0
            .as_ref()
            .expect("a runtime is taken only when dropped")
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// How long `serve_alone` waits for a lock another session holds.
const ALONE_WAIT_MS: u64 = 2_000;

/// The PostgreSQL backend.
pub struct PgBackend {
    rt: Arc<Rt>,
    pool: Pool,
    writers: RoomWriters,
    config: tokio_postgres::Config,
    /// This process's hold on the database once `serve_alone` took it, and its fence.
    serving: Arc<serving::Serving>,
    /// The control handles' cache, in use once `serve_alone` holds the database.
    cache: Arc<control::SharedCache>,
}

impl PgBackend {
    /// Connect to `url` (`postgres://user@host:port/db`, or libpq's `key=value` form) and
    /// apply the schema's missing steps under an advisory lock.
    pub fn connect(url: &str) -> Result<PgBackend> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Postgres(format!("the store url: {e}")))?;
        Self::connect_with(config)
    }

    fn connect_with(mut config: tokio_postgres::Config) -> Result<PgBackend> {
        // every write durable before it is acknowledged, and nothing waits for ever
        // keepalives on both sides: a daemon learns its server is gone, and the server ends
        // the sessions of a host that went silent (freeing its lock and its transactions)
        // in about half a minute, not the kernel's two hours; a transaction left open by a
        // cut connection ends on its own
        config
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(KEEPALIVE_IDLE_S))
            .keepalives_interval(Duration::from_secs(KEEPALIVE_INTERVAL_S))
            .keepalives_retries(KEEPALIVE_COUNT)
            .options(format!(
                "-c synchronous_commit=on -c statement_timeout={STATEMENT_TIMEOUT_MS} \
                 -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} \
                 -c tcp_keepalives_idle={KEEPALIVE_IDLE_S} -c tcp_keepalives_interval={KEEPALIVE_INTERVAL_S} \
                 -c tcp_keepalives_count={KEEPALIVE_COUNT} -c tcp_user_timeout={TCP_USER_TIMEOUT_MS}"
            ));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("room-postgres")
            .enable_all()
            .build()?;
        let manager = Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_MAX)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_millis(CALL_TIMEOUT_MS)))
            .create_timeout(Some(Duration::from_millis(CONNECT_TIMEOUT_MS)))
            .recycle_timeout(Some(Duration::from_millis(CONNECT_TIMEOUT_MS)))
            .build()
            .map_err(pg)?;
        let b = PgBackend {
            rt: Arc::new(Rt(Some(rt))),
            pool,
            writers: RoomWriters::default(),
            config,
            serving: Arc::default(),
            cache: Arc::default(),
        };
        let pool = b.pool.clone();
        b.run(async move { migrate(&pool).await })?;
        Ok(b)
    }

    /// Hold the database for this daemon alone, or refuse: a daemon keeps each open room's
    /// tip and projection in memory, and one beside it on the same database would find its
    /// rooms moved under it (its appends refused as conflicts, its views stale). Several
    /// daemons on one database are not built yet; until they are, a second one does not
    /// start. The lock is a session's: it goes with the connection, also when the process
    /// dies.
    pub fn serve_alone(&self) -> Result<()> {
        self.hold_alone()?;
        let pool = self.pool.clone();
        let unfinished: Option<String> = self.run(async move {
            let c = pool.get().await.map_err(pg)?;
            Ok(c.query_opt(
                &c.prepare_cached("SELECT source_path FROM migrate_runs WHERE finished_ms IS NULL")
                    .await
                    .map_err(pg)?,
                &[],
            )
            .await
            .map_err(pg)?
            .map(|r| r.get(0)))
        })?;
        match unfinished {
            Some(from) => {
                // refused: the lock goes, and reads are read fresh again
                self.serving.release();
                self.cache
                    .enabled
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                self.cache.clear();
                Err(StoreError::MigrationUnfinished(format!(
                    "the migration of {from} into this database has not finished"
                )))
            }
            None => Ok(()),
        }
    }

    /// The Room instance this database belongs to, if a daemon or a migration bound it.
    pub fn instance(&self) -> Result<Option<String>> {
        let pool = self.pool.clone();
        self.run(async move {
            let c = pool.get().await.map_err(pg)?;
            Ok(c.query_opt(
                &c.prepare_cached("SELECT instance FROM store_instance")
                    .await
                    .map_err(pg)?,
                &[],
            )
            .await
            .map_err(pg)?
            .map(|r| r.get(0)))
        })
    }

    /// Bind this database to the state dir instance `instance` if it belongs to none yet, or
    /// check that it belongs to that one (`StoreError::OtherInstance` when not: nothing is
    /// written).
    pub fn bind_instance(&self, instance: &str, now_ms: u64) -> Result<()> {
        let pool = self.pool.clone();
        let (ours, now) = (instance.to_string(), crate::index::i(now_ms));
        let bound: Option<String> = self.run(async move {
            let mut c = pool.get().await.map_err(pg)?;
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("LOCK TABLE store_instance IN EXCLUSIVE MODE")
                    .await
                    .map_err(pg)?,
                &[],
            )
            .await
            .map_err(pg)?;
            let row = tx
                .query_opt(
                    &tx.prepare_cached("SELECT instance FROM store_instance")
                        .await
                        .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?;
            if let Some(r) = row {
                return Ok(Some(r.get::<_, String>(0)));
            }
            tx.execute(
                &tx.prepare_cached(
                    "INSERT INTO store_instance (instance, bound_ms) VALUES ($1, $2)",
                )
                .await
                .map_err(pg)?,
                &[&ours, &now],
            )
            .await
            .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            Ok(None)
        })?;
        match bound {
            Some(other) if other != instance => Err(StoreError::OtherInstance(format!(
                "this database belongs to Room instance {other}; this state dir is instance {instance}"
            ))),
            _ => Ok(()),
        }
    }

    /// Start serving the database held alone (`serve_alone`, once whatever could refuse the
    /// start has passed): a new serving generation fences every daemon that served it before,
    /// and the lock's session is watched from now on.
    pub fn start_serving(&self) -> Result<()> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.serving.start(&self.rt, self.config.clone(), now_ms)
    }

    /// Hold the database's daemon lock (what `serve_alone` and a migration take first).
    pub(crate) fn hold_alone(&self) -> Result<()> {
        let config = self.config.clone();
        let client = self.run(async move {
            let held = serving::connect(&config).await?;
            // a daemon that just stopped (or died) ends its session a moment after its
            // connection closes: its lock is waited for, briefly
            let started = std::time::Instant::now();
            loop {
                if serving::try_lock(&held.client).await? {
                    return Ok(Some(held));
                }
                if started.elapsed() >= Duration::from_millis(ALONE_WAIT_MS) {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })?;
        match client {
            Some(held) => {
                self.serving.hold(held);
                // every write goes through this process now: its reads may be kept
                self.cache.clear();
                self.cache
                    .enabled
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
            None => Err(StoreError::Unsupported(
                "another daemon serves this database, and several daemons on one database are not built yet".into(),
            )),
        }
    }

    /// Run `f` on this backend's runtime and wait for it here, however long it takes (a
    /// migration's copy of a large table; never on a runtime's thread).
    pub(crate) fn run_unbounded<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.rt.block_on(f)
    }

    /// Run `f` on this backend's runtime and wait for it here.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        run_on(&self.rt, f)
    }
}

pub(crate) fn run_on<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    f: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    run_within(rt, f).unwrap_or_else(|| {
        Err(StoreError::Postgres(format!(
            "no answer within {CALL_TIMEOUT_MS} ms"
        )))
    })
}

/// `f` on `rt`, waited for here at most `CALL_TIMEOUT_MS`: none when it did not end in time
/// (it may still end: an append then does not know what it did).
pub(crate) fn run_within<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    f: impl Future<Output = Result<T>> + Send + 'static,
) -> Option<Result<T>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    match rx.recv_timeout(Duration::from_millis(CALL_TIMEOUT_MS)) {
        Ok(r) => Some(r),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Some(Err(StoreError::Postgres(
            "the backend's runtime dropped a call".into(),
        ))),
    }
}

async fn migrate(pool: &Pool) -> Result<()> {
    let mut c = pool.get().await.map_err(pg)?;
    let tx = c.transaction().await.map_err(pg)?;
    tx.execute(
        &tx.prepare_cached("SELECT pg_advisory_xact_lock($1)")
            .await
            .map_err(pg)?,
        &[&MIGRATION_LOCK],
    )
    .await
    .map_err(pg)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS room_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(pg)?;
    let applied: i32 = tx
        .query_one(
            &tx.prepare_cached("SELECT COALESCE(MAX(version), 0) FROM room_migrations")
                .await
                .map_err(pg)?,
            &[],
        )
        .await
        .map_err(pg)?
        .get(0);
    let applied = usize::try_from(applied).unwrap_or(usize::MAX);
    if applied > MIGRATIONS.len() {
        return Err(StoreError::Postgres(format!(
            "the database's schema is at step {applied}, newer than this build's {}: upgrade Room",
            MIGRATIONS.len()
        )));
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(applied) {
        tx.batch_execute(step).await.map_err(pg)?;
        let v = i32::try_from(i + 1).expect("a few steps");
        tx.execute(
            &tx.prepare_cached("INSERT INTO room_migrations (version) VALUES ($1)")
                .await
                .map_err(pg)?,
            &[&v],
        )
        .await
        .map_err(pg)?;
    }
    tx.commit().await.map_err(pg)
}

fn not_found(graph_id: &str) -> StoreError {
    StoreError::Io(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("no shard {graph_id} in the database"),
    ))
}

impl Backend for PgBackend {
    /// The database holds exactly what committed, and an open reads it back (a commit whose
    /// answer was lost is found there, or not): a room halted by a lost connection is whole
    /// again once opened anew.
    fn reopen_heals_halts(&self) -> bool {
        true
    }

    fn fenced(&self) -> Option<String> {
        self.serving.fenced()
    }

    fn open_control(&self) -> Result<Box<dyn ControlStore>> {
        Ok(Box::new(PgControl::new(
            self.rt.clone(),
            self.pool.clone(),
            self.cache.clone(),
            self.serving.clone(),
        )))
    }

    fn create_shard(
        &self,
        graph_id: &str,
        binding: &[u8],
        manifest: &[u8],
        first: &[Sealed],
    ) -> Result<ShardCreated> {
        self.serving.check()?;
        if graph_id.starts_with(ASIDE) {
            return Err(StoreError::Corrupt(format!(
                "{graph_id:?} is no room's graph id"
            )));
        }
        // checked before anything is written: a shard is whole or absent
        let lines = log::lines_after(&ChainTip::genesis(graph_id), 0, first)?;
        let (pool, g, b, m) = (
            self.pool.clone(),
            graph_id.to_string(),
            binding.to_vec(),
            manifest.to_vec(),
        );
        self.run(async move {
            let mut c = pool.get().await.map_err(pg)?;
            let tx = c.transaction().await.map_err(pg)?;
            let made = tx
                .execute(
                    &tx.prepare_cached("INSERT INTO shards (graph_id, binding, manifest) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING").await.map_err(pg)?,
                    &[&g, &b, &m],
                )
                .await
                .map_err(pg)?;
            if made == 0 {
                return Ok(ShardCreated::Exists);
            }
            let genesis = ChainTip::genesis(&g);
            log::insert_head(&tx, &g, &genesis, 0).await?;
            log::insert_lines(&tx, &g, &lines.rows).await?;
            log::set_head(&tx, &g, &lines.tip, lines.end).await?;
            tx.commit().await.map_err(pg)?;
            Ok(ShardCreated::Ready)
        })
    }

    fn set_aside(&self, graph_id: &str, now_ms: u64) -> Result<String> {
        self.serving.check()?;
        let (pool, g) = (self.pool.clone(), graph_id.to_string());
        self.run(async move {
            let mut c = pool.get().await.map_err(pg)?;
            set_aside(&mut c, &g, now_ms).await
        })
    }

    fn sweep_strays(
        &self,
        known: &std::collections::BTreeSet<String>,
        now_ms: u64,
    ) -> Result<Vec<String>> {
        let (pool, known) = (self.pool.clone(), known.clone());
        self.run(async move {
            let mut c = pool.get().await.map_err(pg)?;
            let rows = c
                .query(
                    &c.prepare_cached("SELECT graph_id FROM shards WHERE graph_id NOT LIKE 'aside:%' ORDER BY graph_id").await.map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?;
            let mut out = Vec::new();
            for r in rows {
                let g: String = r.get(0);
                if !known.contains(&g) {
                    out.push(set_aside(&mut c, &g, now_ms).await?);
                }
            }
            Ok(out)
        })
    }

    fn read_binding(&self, graph_id: &str) -> Result<Vec<u8>> {
        let (pool, g) = (self.pool.clone(), graph_id.to_string());
        self.run(async move {
            let c = pool.get().await.map_err(pg)?;
            c.query_opt(
                &c.prepare_cached("SELECT binding FROM shards WHERE graph_id = $1")
                    .await
                    .map_err(pg)?,
                &[&g],
            )
            .await
            .map_err(pg)?
            .map(|r| r.get::<_, Vec<u8>>(0))
            .ok_or_else(|| not_found(&g))
        })
    }

    fn open_index(&self, graph_id: &str) -> Result<Box<dyn RoomIndex>> {
        Ok(Box::new(PgIndex::new(
            self.rt.clone(),
            self.pool.clone(),
            self.serving.clone(),
            graph_id,
        )))
    }

    fn open_log(
        &self,
        graph_id: &str,
        known: Option<&JournalMark>,
        each: ScanEach<'_>,
    ) -> Result<Box<dyn RoomLog>> {
        Ok(Box::new(PgLog::open(
            self.rt.clone(),
            self.pool.clone(),
            self.serving.clone(),
            graph_id,
            known,
            each,
        )?))
    }

    fn open_blobs(&self, graph_id: &str) -> Result<Arc<dyn BlobStore>> {
        Ok(Arc::new(PgBlobs {
            rt: self.rt.clone(),
            pool: self.pool.clone(),
            serving: self.serving.clone(),
            graph_id: graph_id.to_string(),
        }))
    }

    fn verify_log(&self, graph_id: &str) -> Result<VerifyReport> {
        let r = self.verify_log_from(graph_id, None, None)?;
        match &r.damage {
            Some(d) => Err(StoreError::Corrupt(format!("{graph_id}: {d}"))),
            None => Ok(r),
        }
    }

    fn verify_log_from(
        &self,
        graph_id: &str,
        from: Option<&ChainPos>,
        stop: Option<u64>,
    ) -> Result<VerifyReport> {
        let (pool, g, from) = (self.pool.clone(), graph_id.to_string(), from.cloned());
        self.run(async move { log::verify(&pool, &g, from, stop).await })
    }

    fn cut_log(&self, graph_id: &str, len: u64) -> Result<String> {
        let (pool, g) = (self.pool.clone(), graph_id.to_string());
        self.run(async move { log::cut(&pool, &g, len).await })
    }

    fn room_writer(&self, graph_id: &str) -> Result<WriterGuard> {
        self.writers.acquire(graph_id)
    }
}

/// Keep a shard aside under a name no room has (its rows follow by cascade), in one
/// transaction; that name.
async fn set_aside(
    c: &mut deadpool_postgres::Object,
    graph_id: &str,
    now_ms: u64,
) -> Result<String> {
    let tx = c.transaction().await.map_err(pg)?;
    let row = tx
        .query_opt(
            &tx.prepare_cached("SELECT id FROM shards WHERE graph_id = $1 FOR UPDATE")
                .await
                .map_err(pg)?,
            &[&graph_id],
        )
        .await
        .map_err(pg)?
        .ok_or_else(|| not_found(graph_id))?;
    let id: i64 = row.get(0);
    let to = format!("{ASIDE}{graph_id}:{now_ms}:{id}");
    let moved = tx
        .execute(
            &tx.prepare_cached("UPDATE shards SET graph_id = $2 WHERE graph_id = $1 AND id = $3")
                .await
                .map_err(pg)?,
            &[&graph_id, &to, &id],
        )
        .await
        .map_err(pg)?;
    if moved != 1 {
        return Err(StoreError::Corrupt(format!(
            "{graph_id}: set aside moved {moved} shards, not one"
        )));
    }
    tx.commit().await.map_err(pg)?;
    Ok(format!("postgres shard {to}"))
}

/// A room's blobs: content-addressed rows, verified against their digest when read.
struct PgBlobs {
    rt: Arc<crate::Rt>,
    pool: Pool,
    serving: Arc<serving::Serving>,
    graph_id: String,
}

fn io(e: StoreError) -> std::io::Error {
    match e {
        StoreError::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}

fn is_digest(sha: &str) -> bool {
    sha.len() == 64
        && sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn valid_ext(ext: &str) -> bool {
    !ext.is_empty() && ext.len() <= 16 && ext.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl BlobStore for PgBlobs {
    fn put(&self, bytes: &[u8], ext: &str) -> std::io::Result<String> {
        if !valid_ext(ext) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{ext:?} is not a blob extension"),
            ));
        }
        self.serving.check().map_err(io)?;
        let sha = room_core::sha256_hex(bytes);
        let name = format!("{sha}.{ext}");
        let (pool, g, b) = (self.pool.clone(), self.graph_id.clone(), bytes.to_vec());
        run_on(&self.rt, async move {
            let c = pool.get().await.map_err(pg)?;
            c.execute(
                &c.prepare_cached("INSERT INTO blobs (graph_id, name, bytes) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING").await.map_err(pg)?,
                &[&g, &name, &b],
            )
            .await
            .map_err(pg)?;
            Ok(())
        })
        .map_err(io)?;
        Ok(sha)
    }

    fn get(&self, sha: &str, ext: &str) -> std::io::Result<Vec<u8>> {
        if !is_digest(sha) || !valid_ext(ext) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{sha:?}.{ext:?} is not a blob's name"),
            ));
        }
        let name = format!("{sha}.{ext}");
        let (pool, g) = (self.pool.clone(), self.graph_id.clone());
        let bytes = run_on(&self.rt, async move {
            let c = pool.get().await.map_err(pg)?;
            c.query_opt(
                &c.prepare_cached("SELECT bytes FROM blobs WHERE graph_id = $1 AND name = $2")
                    .await
                    .map_err(pg)?,
                &[&g, &name],
            )
            .await
            .map_err(pg)?
            .map(|r| r.get::<_, Vec<u8>>(0))
            .ok_or_else(|| {
                StoreError::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no blob {name}"),
                ))
            })
        })
        .map_err(io)?;
        if room_core::sha256_hex(&bytes) != sha {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("blob {sha}.{ext} does not match its digest"),
            ));
        }
        Ok(bytes)
    }

    fn sweep_temps(&self) -> std::io::Result<usize> {
        // a put is one statement: nothing half-written to sweep
        Ok(0)
    }
}

/// A database made for a measurement and dropped with this value (`room bench core
/// --store`): Room's tables need an empty database, and a person's must stay untouched.
pub struct ScratchDatabase {
    admin: tokio_postgres::Config,
    name: String,
    /// The scratch database's own connection settings.
    pub config: tokio_postgres::Config,
}

/// Connect with `config` on a one-off runtime and run `sql` (no parameters).
fn admin_execute(config: &tokio_postgres::Config, sql: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(pg)?;
        let task = tokio::spawn(conn);
        let out = client.batch_execute(sql).await.map_err(pg);
        drop(client);
        let _ = task.await;
        out
    })
}

impl ScratchDatabase {
    /// Create an empty database `name` on the server `url` names (its user needs CREATEDB).
    pub fn create(url: &str, name: &str) -> Result<ScratchDatabase> {
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(StoreError::Postgres(format!(
                "{name:?} is not a plain database name"
            )));
        }
        let admin: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Postgres(format!("the store url: {e}")))?;
        admin_execute(&admin, &format!("CREATE DATABASE {name}"))?;
        let mut config = admin.clone();
        config.dbname(name);
        Ok(ScratchDatabase {
            admin,
            name: name.to_string(),
            config,
        })
    }
}

impl ScratchDatabase {
    /// Run `sql` (no parameters) in the scratch database.
    pub fn execute(&self, sql: &str) -> Result<()> {
        admin_execute(&self.config, sql)
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        // connections still open (a backend not yet dropped) are ended with it
        let _ = admin_execute(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

impl PgBackend {
    /// `connect`, from connection settings already parsed.
    pub fn connect_config(config: &tokio_postgres::Config) -> Result<PgBackend> {
        Self::connect_with(config.clone())
    }
}
