//! The daemon's hold on its database, and its fence. A daemon serves a database alone: it
//! holds an advisory lock on a session of its own, and takes a new serving generation in
//! the `serving` row when it does. The lock is a session's, so it goes when that connection
//! does (a server restart, a network cut, the server ending an idle session): the daemon
//! then refuses every write until it has the lock again, and takes it back only while the
//! serving generation is still its own. A daemon that took the database over in between
//! moved the generation: the first one is fenced for good, and its journal appends are
//! refused by the database itself (each append reads the serving row in its transaction,
//! under a shared transaction lock a takeover takes exclusively, so a takeover waits for
//! appends in flight and every later one sees it).
//!
//! A lock's session can also go silent without ending (a cut network): the daemon asks it
//! every second and writes nothing once it has been silent for `HOLD_STALE_MS`, while the
//! server frees a silent session's lock only after its keepalives failed, later. So a daemon
//! cut off from its database has stopped writing before another can take the lock.

use crate::pg;
use room_store::{Result, StoreError};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The advisory lock key a daemon holds for as long as it serves a database.
pub(crate) const DAEMON_LOCK: i64 = 0x526f_6f6d_4461_656d; // "RoomDaem"
/// The transaction advisory lock an append holds shared while it checks the generation, and
/// a takeover exclusively while it moves it: a takeover waits for appends in flight, and
/// every later append sees it (no row lock written on every append).
const GENERATION_LOCK: i64 = 0x526f_6f6d_4765_6e73; // "RoomGens"

/// How often a daemon that lost its lock's session tries to take it back.
const TAKE_BACK_EVERY_MS: u64 = 250;
/// How often the lock's session is asked whether it still answers, and how long an answer
/// is waited for.
const PING_EVERY_MS: u64 = 1_000;
const PING_TIMEOUT_MS: u64 = 2_000;
/// A daemon whose lock's session has not answered a ping sent within this long writes
/// nothing until it does: it may be cut off, and the server may be about to end that
/// session and free the lock for another daemon. The server ends a silent session only
/// after its keepalives failed (`crate::KEEPALIVE_*`: about 25 s), well after this.
const HOLD_STALE_MS: u64 = 8_000;

pub(crate) const SCHEMA: &str = r#"
CREATE TABLE serving (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    generation bigint NOT NULL,
    holder text NOT NULL,
    since_ms bigint NOT NULL
);
INSERT INTO serving (generation, holder, since_ms) VALUES (0, '', 0);
"#;

/// What this process knows of its hold on the database.
#[derive(Default)]
pub(crate) struct Serving {
    /// The serving generation taken with the lock; 0 while this process serves nothing (a
    /// `room verify`, a test's second writer): nothing is fenced then.
    generation: AtomicI64,
    /// The lock's session ended and the lock is not taken back yet.
    lost: AtomicBool,
    /// Another daemon took the database over: this process never writes to it again.
    fenced: Mutex<Option<String>>,
    /// The lock's session once taken, until serving starts (`start`): a process refused
    /// after taking the lock (another instance's state dir, a database not empty) never
    /// moves the generation.
    pending: Mutex<Option<Held>>,
    /// Tells the watcher to drop the lock's session once fenced.
    fenced_now: tokio::sync::Notify,
    /// When the newest answered ping was sent, on the boot clock (`now_ms`).
    answered_ms: std::sync::atomic::AtomicU64,
}

/// The session that holds the lock, and what resolves when its connection ends.
pub(crate) struct Held {
    pub(crate) client: tokio_postgres::Client,
    ended: tokio::sync::oneshot::Receiver<()>,
}

impl Serving {
    /// The generation an append must find in the serving row (0: none).
    pub(crate) fn generation(&self) -> i64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Refuse a write while this process does not hold the database it serves.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(why) = self.fenced() {
            return Err(StoreError::Fenced(why));
        }
        if self.generation() == 0 {
            return Ok(());
        }
        if self.lost.load(Ordering::SeqCst) {
            return Err(StoreError::Postgres(
                "this daemon's lock on the database went with its connection and is not taken back yet".into(),
            ));
        }
        let silent_ms = self
            .now_ms()
            .saturating_sub(self.answered_ms.load(Ordering::SeqCst));
        if silent_ms > HOLD_STALE_MS {
            return Err(StoreError::Postgres(format!(
                "the session holding this daemon's lock on the database has not answered for {silent_ms} ms"
            )));
        }
        Ok(())
    }

    /// The boot clock in ms: it runs on while the machine sleeps (a lease outlives no pause).
    fn now_ms(&self) -> u64 {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000)
            .saturating_add(u64::try_from(t.tv_nsec / 1_000_000).unwrap_or(0))
    }

    /// The lock's session answered a ping sent at `sent_ms`: the lease runs from then.
    fn answered(&self, sent_ms: u64) {
        self.answered_ms.fetch_max(sent_ms, Ordering::SeqCst);
    }

    pub(crate) fn fenced(&self) -> Option<String> {
        self.fenced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn fence(&self, why: String) {
        *self.fenced.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        self.fenced_now.notify_one();
    }

    /// Let the lock taken go (a start refused after taking it).
    pub(crate) fn release(&self) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// Keep `held` (the lock taken) until serving starts.
    pub(crate) fn hold(&self, held: Held) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(held);
    }

    /// Start serving on the lock taken: take a new generation (fencing every process that
    /// served before) and watch the lock's session (on the backend's runtime) from now on.
    pub(crate) fn start(
        self: &Arc<Self>,
        rt: &tokio::runtime::Runtime,
        config: tokio_postgres::Config,
        now_ms: i64,
    ) -> Result<()> {
        let held = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| StoreError::Postgres("serving starts only on the lock taken".into()))?;
        let asked = self.now_ms();
        let (held, generation) = crate::run_on(rt, async move {
            let mut held = held;
            let generation = take_generation(&mut held.client, now_ms).await?;
            Ok((held, generation))
        })?;
        self.generation.store(generation, Ordering::SeqCst);
        self.lost.store(false, Ordering::SeqCst);
        self.answered(asked);
        rt.spawn(watch(self.clone(), config, held));
        Ok(())
    }
}

/// Ask the lock's session every `PING_EVERY_MS` whether it answers; when it ends, take the
/// lock back (or learn that another daemon took the database over), for as long as the
/// process serves. The session is the watcher's: dropping it frees the lock.
async fn watch(serving: Arc<Serving>, config: tokio_postgres::Config, mut held: Held) {
    loop {
        let mut ping = tokio::time::interval(Duration::from_millis(PING_EVERY_MS));
        loop {
            tokio::select! {
                _ = &mut held.ended => break,
                _ = serving.fenced_now.notified() => return,
                _ = ping.tick() => {
                    let sent = serving.now_ms();
                    let asked = tokio::time::timeout(
                        Duration::from_millis(PING_TIMEOUT_MS),
                        held.client.simple_query("SELECT 1"),
                    );
                    if matches!(asked.await, Ok(Ok(_))) {
                        serving.answered(sent);
                    }
                }
            }
        }
        drop(held);
        serving.lost.store(true, Ordering::SeqCst);
        tracing::warn!("the session holding this daemon's database lock ended: taking it back");
        held = loop {
            tokio::time::sleep(Duration::from_millis(TAKE_BACK_EVERY_MS)).await;
            let asked = serving.now_ms();
            match take_back(&config, serving.generation()).await {
                Ok(TakeBack::Held(held)) => {
                    serving.answered(asked);
                    serving.lost.store(false, Ordering::SeqCst);
                    tracing::info!("the database lock is held again");
                    break held;
                }
                Ok(TakeBack::TakenOver(why)) => {
                    tracing::error!("{why}");
                    serving.fence(why);
                    return;
                }
                Ok(TakeBack::Busy) => {}
                Err(e) => tracing::debug!("taking the database lock back: {e}"),
            }
        };
    }
}

enum TakeBack {
    Held(Held),
    /// Another session holds the lock and the generation is still ours: try again.
    Busy,
    TakenOver(String),
}

/// One attempt: the lock, kept only while the serving generation is still `ours`.
async fn take_back(config: &tokio_postgres::Config, ours: i64) -> Result<TakeBack> {
    let held = connect(config).await?;
    let taken_over = |g: i64, holder: String| {
        TakeBack::TakenOver(format!(
            "another daemon took this database over ({holder}, serving generation {g}; this daemon's was {ours}): this daemon writes nothing more to it"
        ))
    };
    let (g, holder) = generation_of(&held.client).await?;
    if g != ours {
        return Ok(taken_over(g, holder));
    }
    if !try_lock(&held.client).await? {
        return Ok(TakeBack::Busy);
    }
    // the generation again, under the lock: a takeover could have come in between
    let (g, holder) = generation_of(&held.client).await?;
    if g != ours {
        return Ok(taken_over(g, holder));
    }
    Ok(TakeBack::Held(held))
}

/// A session of its own for the lock.
pub(crate) async fn connect(config: &tokio_postgres::Config) -> Result<Held> {
    // the backend's config: its keepalives (both sides) are this session's too
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(pg)?;
    let (tx, ended) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = conn.await;
        let _ = tx.send(());
    });
    Ok(Held { client, ended })
}

pub(crate) async fn try_lock(c: &tokio_postgres::Client) -> Result<bool> {
    Ok(
        c.query_one("SELECT pg_try_advisory_lock($1)", &[&DAEMON_LOCK])
            .await
            .map_err(pg)?
            .get(0),
    )
}

async fn generation_of(c: &tokio_postgres::Client) -> Result<(i64, String)> {
    let row = c
        .query_one("SELECT generation, holder FROM serving", &[])
        .await
        .map_err(pg)?;
    Ok((row.get(0), row.get(1)))
}

/// Take a new serving generation (the lock is held on `c`): every daemon that served
/// before is fenced from now on.
async fn take_generation(c: &mut tokio_postgres::Client, now_ms: i64) -> Result<i64> {
    let holder = format!(
        "pid {} on {}",
        std::process::id(),
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "an unnamed host".into())
    );
    let tx = c.transaction().await.map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&GENERATION_LOCK])
        .await
        .map_err(pg)?;
    let generation: i64 = tx
        .query_one(
            "UPDATE serving SET generation = generation + 1, holder = $1, since_ms = $2 RETURNING generation",
            &[&holder, &now_ms],
        )
        .await
        .map_err(pg)?
        .get(0);
    tx.commit().await.map_err(pg)?;
    Ok(generation)
}

/// In an append's transaction: refuse it unless the serving generation is still `ours`
/// (nothing to check when `ours` is 0). The shared lock makes a takeover wait for this
/// append; the generation is read by a statement of its own, after the lock (a statement's
/// snapshot is taken as it starts).
pub(crate) async fn fence_append(tx: &deadpool_postgres::Transaction<'_>, ours: i64) -> Result<()> {
    if ours == 0 {
        return Ok(());
    }
    tx.execute(
        &tx.prepare_cached("SELECT pg_advisory_xact_lock_shared($1)")
            .await
            .map_err(pg)?,
        &[&GENERATION_LOCK],
    )
    .await
    .map_err(pg)?;
    let row = tx
        .query_one(
            &tx.prepare_cached("SELECT generation, holder FROM serving")
                .await
                .map_err(pg)?,
            &[],
        )
        .await
        .map_err(pg)?;
    let (g, holder): (i64, String) = (row.get(0), row.get(1));
    if g != ours {
        return Err(StoreError::Fenced(format!(
            "another daemon took this database over ({holder}, serving generation {g}; this daemon's was {ours}): nothing was written"
        )));
    }
    Ok(())
}
