//! The daemon's hold on its database, and its fence. A daemon serves a database alone: it
//! holds an advisory lock on a session of its own, and takes a new serving generation in
//! the `serving` row when it does. The lock is a session's, so it goes when that connection
//! does (a server restart, a network cut, the server ending an idle session): the daemon
//! then refuses every write until it has the lock again, and takes it back only while the
//! serving generation is still its own. A daemon that took the database over in between
//! moved the generation: the first one is fenced for good, and its journal appends are
//! refused by the database itself (each append reads the serving row, `FOR SHARE`, in its
//! transaction, so a takeover waits for appends in flight and every later one sees it).
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

/// How often a daemon that lost its lock's session tries to take it back.
const TAKE_BACK_EVERY_MS: u64 = 250;
/// How often the lock's session is asked whether it still answers, and how long an answer
/// is waited for.
const PING_EVERY_MS: u64 = 1_000;
const PING_TIMEOUT_MS: u64 = 2_000;
/// A daemon whose lock's session has not answered for this long writes nothing until it
/// does: it may be cut off, and the server may be about to end that session and free the
/// lock for another daemon. The server ends a silent session only after its keepalives
/// failed (`KEEPALIVE_*`: 25 s), well after this.
const HOLD_STALE_MS: u64 = 8_000;
/// The lock's session's server-side TCP keepalives (seconds): a daemon whose host died
/// frees the lock after about half a minute, not the kernel's two hours.
const KEEPALIVE_IDLE_S: u32 = 10;
const KEEPALIVE_INTERVAL_S: u32 = 5;
const KEEPALIVE_COUNT: u32 = 3;

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
    /// Tells the watcher to drop the lock's session once fenced.
    fenced_now: tokio::sync::Notify,
    /// When the lock's session last answered, in ms since `epoch`.
    answered_ms: std::sync::atomic::AtomicU64,
    epoch: std::sync::OnceLock<std::time::Instant>,
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

    fn now_ms(&self) -> u64 {
        let epoch = self.epoch.get_or_init(std::time::Instant::now);
        u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn answered(&self) {
        self.answered_ms.store(self.now_ms(), Ordering::SeqCst);
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

    /// Keep `held` as this process's lock, at `generation`, and watch it (on the backend's
    /// runtime) for as long as the process serves.
    pub(crate) fn hold(
        self: &Arc<Self>,
        rt: &tokio::runtime::Runtime,
        config: tokio_postgres::Config,
        held: Held,
        generation: i64,
    ) {
        self.generation.store(generation, Ordering::SeqCst);
        self.lost.store(false, Ordering::SeqCst);
        self.answered();
        rt.spawn(watch(self.clone(), config, held));
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
                    let asked = tokio::time::timeout(
                        Duration::from_millis(PING_TIMEOUT_MS),
                        held.client.simple_query("SELECT 1"),
                    );
                    if matches!(asked.await, Ok(Ok(_))) {
                        serving.answered();
                    }
                }
            }
        }
        drop(held);
        serving.lost.store(true, Ordering::SeqCst);
        tracing::warn!("the session holding this daemon's database lock ended: taking it back");
        held = loop {
            tokio::time::sleep(Duration::from_millis(TAKE_BACK_EVERY_MS)).await;
            match take_back(&config, serving.generation()).await {
                Ok(TakeBack::Held(held)) => {
                    serving.answered();
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
    let mut config = config.clone();
    config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(u64::from(KEEPALIVE_IDLE_S)))
        .keepalives_interval(Duration::from_secs(u64::from(KEEPALIVE_INTERVAL_S)))
        .keepalives_retries(KEEPALIVE_COUNT);
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(pg)?;
    let (tx, ended) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = conn.await;
        let _ = tx.send(());
    });
    // the server's side of the same: it frees the lock of a host that went silent
    client
        .batch_execute(&format!(
            "SET tcp_keepalives_idle = {KEEPALIVE_IDLE_S}; SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL_S}; SET tcp_keepalives_count = {KEEPALIVE_COUNT}"
        ))
        .await
        .map_err(pg)?;
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
pub(crate) async fn take_generation(c: &tokio_postgres::Client, now_ms: i64) -> Result<i64> {
    let holder = format!(
        "pid {} on {}",
        std::process::id(),
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "an unnamed host".into())
    );
    Ok(c.query_one(
        "UPDATE serving SET generation = generation + 1, holder = $1, since_ms = $2 RETURNING generation",
        &[&holder, &now_ms],
    )
    .await
    .map_err(pg)?
    .get(0))
}

/// In an append's transaction: refuse it unless the serving generation is still `ours`
/// (nothing to check when `ours` is 0). `FOR SHARE` makes a takeover wait for this append.
pub(crate) async fn fence_append(tx: &deadpool_postgres::Transaction<'_>, ours: i64) -> Result<()> {
    if ours == 0 {
        return Ok(());
    }
    let row = tx
        .query_one("SELECT generation, holder FROM serving FOR SHARE", &[])
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
