//! The control store on PostgreSQL (issue 44), whole: principals and their credential
//! digests, verb policy, project grants, rooms and rosters, the control epoch and break-glass
//! here; tasks and leases (`control_tasks`), wakes, launches and sessions (`control_wakes`),
//! cancellation, holds and collaborations (`control_collab`). Several daemons may share one
//! database, so nothing is cached across calls as SQLite's store does (it owns its file
//! alone): every read asks the database, and a room's view generation is computed again
//! whenever what it is made of (the room's row, its members' standing, the control epoch)
//! reads differently. Every write is one transaction, committed with `synchronous_commit =
//! on` before the call returns, and counted in `control_meta` for every daemon's change stamp.
//! Text columns sort in byte order (`COLLATE "C"`), as SQLite's do, whatever the database's
//! locale.

use crate::{pg, run_on};
use deadpool_postgres::{Object, Pool};
use room_store::backend::{CancelEffect, ChangeStamp, ControlStore};
use room_store::control::{
    AgentRow, MemberStanding, ProjectRow, RoomRow, RoomWitnesses, TaskCheckRow, TaskRow, WakeRow,
};
use room_store::{Result, StoreError};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

/// The control tables, the schema's second step (`crate::MIGRATIONS`).
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE control_meta (key text COLLATE "C" PRIMARY KEY, value bigint NOT NULL);
INSERT INTO control_meta (key, value) VALUES ('control_epoch', 1), ('break_glass', 0);
-- counts writes for the change stamp: a sequence, not a row, so writers never queue on it
CREATE SEQUENCE control_writes;
CREATE TABLE agents (
    name text COLLATE "C" PRIMARY KEY,
    secret_sha256 text COLLATE "C" NOT NULL UNIQUE,
    registration_sha256 text COLLATE "C" NOT NULL,
    generation bigint NOT NULL,
    max_tier text COLLATE "C" NOT NULL,
    host_kind text COLLATE "C" NOT NULL,
    created_ms bigint NOT NULL,
    revoked_ms bigint,
    parent text COLLATE "C",
    scopes text COLLATE "C",
    revoked_by text COLLATE "C"
);
CREATE INDEX agents_parent ON agents (parent) WHERE parent IS NOT NULL;
CREATE TABLE retired_secrets (
    secret_sha256 text COLLATE "C" PRIMARY KEY,
    agent text COLLATE "C" NOT NULL,
    retired_ms bigint NOT NULL,
    why text COLLATE "C" NOT NULL
);
CREATE TABLE denied_verbs (
    agent text COLLATE "C" NOT NULL REFERENCES agents (name),
    verb text COLLATE "C" NOT NULL,
    PRIMARY KEY (agent, verb)
);
CREATE TABLE projects (
    id text COLLATE "C" PRIMARY KEY,
    name text COLLATE "C" NOT NULL,
    requested_root text COLLATE "C" NOT NULL,
    canonical_root text COLLATE "C" NOT NULL UNIQUE,
    dev bigint NOT NULL,
    ino bigint NOT NULL,
    mnt_id bigint NOT NULL,
    opened_ms bigint NOT NULL
);
CREATE TABLE rooms (
    name text COLLATE "C" PRIMARY KEY,
    graph_id text COLLATE "C" NOT NULL UNIQUE,
    project_id text COLLATE "C" REFERENCES projects (id),
    created_ms bigint NOT NULL,
    revision bigint NOT NULL,
    reset_gen bigint NOT NULL,
    reset_ms bigint,
    admission_gen bigint NOT NULL,
    admission_open boolean NOT NULL,
    archived_ms bigint,
    cancel_gen bigint NOT NULL DEFAULT 0,
    cancelled boolean NOT NULL DEFAULT false
);
CREATE TABLE members (
    room text COLLATE "C" NOT NULL REFERENCES rooms (name),
    agent text COLLATE "C" NOT NULL REFERENCES agents (name),
    PRIMARY KEY (room, agent)
);
"#;

/// Agents' descendants `revoke_subtree` looks at most this many levels down, whatever the
/// caller asks (the engine's own bound is smaller).
const SUBTREE_DEPTH_MAX: u32 = 64;

/// A stored integer that must not be negative (every count, time and generation here).
pub(crate) fn u(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} is negative")))
}

pub(crate) fn i(v: u64) -> i64 {
    i64::try_from(v).expect("stored values stay below 2^63")
}

const AGENT_COLS: &str = "name, secret_sha256, registration_sha256, generation, max_tier, host_kind, created_ms, revoked_ms, parent, scopes, revoked_by";

fn agent_from(r: &tokio_postgres::Row) -> Result<AgentRow> {
    let name: String = r.get(0);
    let scopes = match r.get::<_, Option<String>>(9) {
        None => None,
        Some(t) => Some(
            serde_json::from_str(&t)
                .map_err(|e| StoreError::Corrupt(format!("agent {name}: scopes {t:?}: {e}")))?,
        ),
    };
    Ok(AgentRow {
        secret_sha256: r.get(1),
        registration_sha256: r.get(2),
        generation: u(r.get(3), "generation")?,
        max_tier: r.get(4),
        host_kind: r.get(5),
        created_ms: u(r.get(6), "created_ms")?,
        revoked_ms: r
            .get::<_, Option<i64>>(7)
            .map(|v| u(v, "revoked_ms"))
            .transpose()?,
        parent: r.get(8),
        scopes,
        revoked_by: r.get(10),
        name,
    })
}

const PROJECT_COLS: &str = "id, name, requested_root, canonical_root, dev, ino, mnt_id, opened_ms";

fn project_from(r: &tokio_postgres::Row) -> Result<ProjectRow> {
    Ok(ProjectRow {
        id: r.get(0),
        name: r.get(1),
        requested_root: r.get(2),
        canonical_root: r.get(3),
        dev: u(r.get(4), "dev")?,
        ino: u(r.get(5), "ino")?,
        mnt_id: u(r.get(6), "mnt_id")?,
        opened_ms: u(r.get(7), "opened_ms")?,
    })
}

const ROOM_COLS: &str = "name, graph_id, project_id, created_ms, revision, reset_gen, reset_ms, admission_gen, admission_open, archived_ms, cancel_gen, cancelled";

fn room_from(r: &tokio_postgres::Row) -> Result<RoomRow> {
    Ok(RoomRow {
        name: r.get(0),
        graph_id: r.get(1),
        project_id: r.get(2),
        created_ms: u(r.get(3), "created_ms")?,
        revision: u(r.get(4), "revision")?,
        reset_gen: u(r.get(5), "reset_gen")?,
        reset_ms: r
            .get::<_, Option<i64>>(6)
            .map(|v| u(v, "reset_ms"))
            .transpose()?,
        admission_gen: u(r.get(7), "admission_gen")?,
        admission_open: r.get(8),
        archived_ms: r
            .get::<_, Option<i64>>(9)
            .map(|v| u(v, "archived_ms"))
            .transpose()?,
        cancel_gen: u(r.get(10), "cancel_gen")?,
        cancelled: r.get(11),
    })
}

/// What a room's view generation is computed from, as read together: the key its cached
/// digest is kept under.
#[derive(PartialEq, Eq)]
struct ViewInputs {
    epoch: u64,
    room: RoomRow,
    members: Vec<(String, Option<AgentRow>, Vec<String>)>,
}

/// What every call reads (principals and their policy, rooms and rosters, the epoch), kept
/// while this daemon holds the database alone (`PgBackend::serve_alone`): then every write
/// goes through this process, and each one empties the cache (writes are rare beside reads;
/// each read fills what it misses). Shared by every control handle of one backend. Without
/// the database to itself, a backend caches nothing and reads fresh on every call.
#[derive(Default)]
pub(crate) struct Cache {
    epoch: Option<u64>,
    agents: HashMap<String, Option<AgentRow>>,
    /// A credential digest to its agent's name (none: no agent holds it).
    by_secret: HashMap<String, Option<String>>,
    denied: HashMap<String, Vec<String>>,
    rooms: HashMap<String, Option<RoomRow>>,
    members: HashMap<String, Vec<String>>,
}

/// The cache a backend's control handles share, and whether it is in use.
#[derive(Default)]
pub(crate) struct SharedCache {
    pub(crate) enabled: std::sync::atomic::AtomicBool,
    cache: std::sync::Mutex<Cache>,
}

impl SharedCache {
    fn on(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn clear(&self) {
        *self.lock() = Cache::default();
    }
}

/// The control store on PostgreSQL.
pub struct PgControl {
    rt: Arc<crate::Rt>,
    pool: Pool,
    /// Writes attempted through this handle (the change stamp's local part).
    writes: u64,
    /// Each room's view generation with what it was computed from.
    view_gens: HashMap<String, (ViewInputs, String)>,
    cache: Arc<SharedCache>,
    serving: Arc<crate::serving::Serving>,
}

impl PgControl {
    pub(crate) fn new(
        rt: Arc<crate::Rt>,
        pool: Pool,
        cache: Arc<SharedCache>,
        serving: Arc<crate::serving::Serving>,
    ) -> PgControl {
        PgControl {
            rt,
            pool,
            writes: 0,
            view_gens: HashMap::new(),
            cache,
            serving,
        }
    }

    /// `key`'s entry of the cache if it is in use and holds it, else `load` (kept when the
    /// cache is in use).
    fn cached<K: std::hash::Hash + Eq + Clone, V: Clone>(
        &self,
        map: impl Fn(&mut Cache) -> &mut HashMap<K, V>,
        key: &K,
        load: impl FnOnce() -> Result<V>,
    ) -> Result<V> {
        if !self.cache.on() {
            return load();
        }
        if let Some(v) = map(&mut self.cache.lock()).get(key) {
            return Ok(v.clone());
        }
        let v = load()?;
        map(&mut self.cache.lock()).insert(key.clone(), v.clone());
        Ok(v)
    }

    fn load_agent(&self, name: &str) -> Result<Option<AgentRow>> {
        let name = name.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {AGENT_COLS} FROM agents WHERE name = $1"),
                &[&name],
            )
            .await
            .map_err(pg)?
            .map(|r| agent_from(&r))
            .transpose()
        })
    }

    /// `f` with a connection of the pool, on the backend's runtime, waited for here.
    pub(crate) fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let pool = self.pool.clone();
        run_on(&self.rt, async move {
            let c = pool.get().await.map_err(pg)?;
            f(c).await
        })
    }

    /// A write: `call`, counted for the change stamp whether or not it succeeds. Each write
    /// bumps the database's own write counter in its transaction (`bump`), which another
    /// daemon's change stamp reads.
    pub(crate) fn write<T, F, Fut>(&mut self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        // a daemon that lost its hold on the database (or was fenced) writes nothing
        self.serving.check()?;
        self.writes += 1;
        // emptied before (no read meanwhile keeps what is being changed) and after (what a
        // read filled while the write ran may be older than it)
        self.cache.clear();
        let out = self.call(f);
        self.cache.clear();
        out
    }

    /// `view_inputs` from the cache (filling what it misses): valid while every write goes
    /// through this process.
    fn view_inputs_cached(&self, room: &str) -> Result<Option<ViewInputs>> {
        let Some(row) = self.room(room)? else {
            return Ok(None);
        };
        let mut members = Vec::new();
        for n in self.members(room)? {
            let agent = self.agent(&n)?;
            let denied = self.denied_verbs(&n)?;
            members.push((n, agent, denied));
        }
        Ok(Some(ViewInputs {
            epoch: self.control_epoch()?,
            room: row,
            members,
        }))
    }

    fn view_inputs(&self, room: &str) -> Result<Option<ViewInputs>> {
        let room = room.to_string();
        self.call(move |mut c| async move {
            // one snapshot: the row, the roster and each member's standing read together
            let tx = c
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(pg)?;
            let Some(row) = tx
                .query_opt(
                    &format!("SELECT {ROOM_COLS} FROM rooms WHERE name = $1"),
                    &[&room],
                )
                .await
                .map_err(pg)?
            else {
                return Ok(None);
            };
            let epoch: i64 = tx
                .query_one(
                    &tx.prepare_cached(
                        "SELECT value FROM control_meta WHERE key = 'control_epoch'",
                    )
                    .await
                    .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            let names: Vec<String> = tx
                .query(
                    &tx.prepare_cached("SELECT agent FROM members WHERE room = $1 ORDER BY agent")
                        .await
                        .map_err(pg)?,
                    &[&room],
                )
                .await
                .map_err(pg)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let mut members = Vec::with_capacity(names.len());
            for n in names {
                let agent = tx
                    .query_opt(
                        &format!("SELECT {AGENT_COLS} FROM agents WHERE name = $1"),
                        &[&n],
                    )
                    .await
                    .map_err(pg)?
                    .map(|r| agent_from(&r))
                    .transpose()?;
                let denied: Vec<String> = tx
                    .query(
                        &tx.prepare_cached(
                            "SELECT verb FROM denied_verbs WHERE agent = $1 ORDER BY verb",
                        )
                        .await
                        .map_err(pg)?,
                        &[&n],
                    )
                    .await
                    .map_err(pg)?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                members.push((n, agent, denied));
            }
            tx.commit().await.map_err(pg)?;
            Ok(Some(ViewInputs {
                epoch: u(epoch, "control_epoch")?,
                room: room_from(&row)?,
                members,
            }))
        })
    }
}

/// Count a write in the database (what `change_stamp` reads across daemons). A sequence takes
/// no lock that another writer waits on: a counter row would make every control write of
/// every room queue behind one another's commit.
pub(crate) async fn bump(tx: &deadpool_postgres::Transaction<'_>) -> Result<()> {
    tx.execute(
        &tx.prepare_cached("SELECT nextval('control_writes')")
            .await
            .map_err(pg)?,
        &[],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// One statement and the write count, in one transaction; the rows it changed.
pub(crate) async fn exec1(
    mut c: Object,
    sql: &'static str,
    params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>>,
) -> Result<u64> {
    let tx = c.transaction().await.map_err(pg)?;
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        params.iter().map(|p| p.as_ref() as _).collect();
    let st = tx.prepare_cached(sql).await.map_err(pg)?;
    let n = tx.execute(&st, &refs).await.map_err(pg)?;
    bump(&tx).await?;
    tx.commit().await.map_err(pg)?;
    Ok(n)
}

pub(crate) fn boxed<T: tokio_postgres::types::ToSql + Sync + Send + 'static>(
    v: T,
) -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
    Box::new(v)
}

/// Retire `secret` and mark `name` revoked by `by`, in `tx`.
async fn revoke_in(
    tx: &deadpool_postgres::Transaction<'_>,
    name: &str,
    secret: &str,
    by: &str,
    now_ms: i64,
) -> Result<()> {
    tx.execute(
        &tx.prepare_cached("INSERT INTO retired_secrets (secret_sha256, agent, retired_ms, why) VALUES ($1, $2, $3, 'revoked') ON CONFLICT DO NOTHING").await.map_err(pg)?,
        &[&secret, &name, &now_ms],
    )
    .await
    .map_err(pg)?;
    tx.execute(
        &tx.prepare_cached("UPDATE agents SET revoked_ms = $2, revoked_by = $3 WHERE name = $1")
            .await
            .map_err(pg)?,
        &[&name, &now_ms, &by],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

impl ControlStore for PgControl {
    fn change_stamp(&self) -> Result<ChangeStamp> {
        let external = self.call(|c| async move {
            let v: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT last_value FROM control_writes")
                        .await
                        .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(v, "writes")
        })?;
        Ok(ChangeStamp {
            external,
            local: self.writes,
        })
    }

    // nothing is cached across calls: nothing is ever stale
    fn refresh_if_stale(&mut self) {}

    fn is_stale(&self) -> bool {
        false
    }

    fn control_epoch(&self) -> Result<u64> {
        if self.cache.on()
            && let Some(e) = self.cache.lock().epoch
        {
            return Ok(e);
        }
        let e = self.call(|c| async move {
            let v: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT value FROM control_meta WHERE key = 'control_epoch'")
                        .await
                        .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(v, "control_epoch")
        })?;
        if self.cache.on() {
            self.cache.lock().epoch = Some(e);
        }
        Ok(e)
    }

    fn agent(&self, name: &str) -> Result<Option<AgentRow>> {
        self.cached(
            |c| &mut c.agents,
            &name.to_string(),
            || self.load_agent(name),
        )
    }

    fn agent_by_secret(&self, secret_sha256: &str) -> Result<Option<AgentRow>> {
        let s = secret_sha256.to_string();
        let name = self.cached(
            |c| &mut c.by_secret,
            &s,
            || {
                let s = s.clone();
                self.call(move |c| async move {
                    Ok(c.query_opt(
                        &c.prepare_cached("SELECT name FROM agents WHERE secret_sha256 = $1")
                            .await
                            .map_err(pg)?,
                        &[&s],
                    )
                    .await
                    .map_err(pg)?
                    .map(|r| r.get::<_, String>(0)))
                })
            },
        )?;
        match name {
            Some(n) => self.agent(&n),
            None => Ok(None),
        }
    }

    fn agents(&self) -> Result<Vec<AgentRow>> {
        self.call(|c| async move {
            c.query(
                &format!("SELECT {AGENT_COLS} FROM agents ORDER BY name"),
                &[],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(agent_from)
            .collect()
        })
    }

    fn denied_verbs(&self, agent: &str) -> Result<Vec<String>> {
        let a = agent.to_string();
        self.cached(
            |c| &mut c.denied,
            &a,
            || {
                let a = a.clone();
                self.call(move |c| async move {
                    Ok(c.query(
                        &c.prepare_cached(
                            "SELECT verb FROM denied_verbs WHERE agent = $1 ORDER BY verb",
                        )
                        .await
                        .map_err(pg)?,
                        &[&a],
                    )
                    .await
                    .map_err(pg)?
                    .iter()
                    .map(|r| r.get(0))
                    .collect())
                })
            },
        )
    }

    fn projects(&self) -> Result<Vec<ProjectRow>> {
        self.call(|c| async move {
            c.query(
                &format!("SELECT {PROJECT_COLS} FROM projects ORDER BY opened_ms, id"),
                &[],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(project_from)
            .collect()
        })
    }

    fn project(&self, id: &str) -> Result<Option<ProjectRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {PROJECT_COLS} FROM projects WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| project_from(&r))
            .transpose()
        })
    }

    fn rooms(&self) -> Result<Vec<RoomRow>> {
        self.call(|c| async move {
            c.query(&format!("SELECT {ROOM_COLS} FROM rooms ORDER BY name"), &[])
                .await
                .map_err(pg)?
                .iter()
                .map(room_from)
                .collect()
        })
    }

    fn room(&self, name: &str) -> Result<Option<RoomRow>> {
        let n = name.to_string();
        self.cached(
            |c| &mut c.rooms,
            &n,
            || {
                let n = n.clone();
                self.call(move |c| async move {
                    c.query_opt(
                        &format!("SELECT {ROOM_COLS} FROM rooms WHERE name = $1"),
                        &[&n],
                    )
                    .await
                    .map_err(pg)?
                    .map(|r| room_from(&r))
                    .transpose()
                })
            },
        )
    }

    /// Computed by `digest` again only when what it is made of reads differently (another
    /// daemon's change included). `None`: no such room, or the database did not answer (the
    /// caller refuses either way: a view is never served unread).
    fn view_gen(
        &mut self,
        room: &str,
        digest: &dyn Fn(&RoomRow, &[MemberStanding<'_>]) -> String,
    ) -> Option<String> {
        let inputs = if self.cache.on() {
            self.view_inputs_cached(room).ok()??
        } else {
            self.view_inputs(room).ok()??
        };
        if let Some((seen, v)) = self.view_gens.get(room)
            && *seen == inputs
        {
            return Some(v.clone());
        }
        let standings: Vec<MemberStanding<'_>> = inputs
            .members
            .iter()
            .map(|(name, agent, denied)| MemberStanding {
                name,
                agent: agent.as_ref(),
                denied,
            })
            .collect();
        let v = digest(&inputs.room, &standings);
        drop(standings);
        self.view_gens.insert(room.to_string(), (inputs, v.clone()));
        Some(v)
    }

    fn members(&self, room: &str) -> Result<Vec<String>> {
        let r = room.to_string();
        self.cached(
            |c| &mut c.members,
            &r,
            || {
                let r = r.clone();
                self.call(move |c| async move {
                    Ok(c.query(
                        &c.prepare_cached(
                            "SELECT agent FROM members WHERE room = $1 ORDER BY agent",
                        )
                        .await
                        .map_err(pg)?,
                        &[&r],
                    )
                    .await
                    .map_err(pg)?
                    .iter()
                    .map(|r| r.get(0))
                    .collect())
                })
            },
        )
    }

    fn is_member(&self, room: &str, agent: &str) -> Result<bool> {
        Ok(self.members(room)?.iter().any(|m| m == agent))
    }

    fn retired_secret(&self, secret_sha256: &str) -> Result<Option<(String, String)>> {
        let s = secret_sha256.to_string();
        self.call(move |c| async move {
            Ok(c.query_opt(
                &c.prepare_cached(
                    "SELECT agent, why FROM retired_secrets WHERE secret_sha256 = $1",
                )
                .await
                .map_err(pg)?,
                &[&s],
            )
            .await
            .map_err(pg)?
            .map(|r| (r.get(0), r.get(1))))
        })
    }

    fn insert_agent(&mut self, a: &AgentRow) -> Result<()> {
        let scopes = a
            .scopes
            .as_ref()
            .map(|s| serde_json::to_string(s).expect("a list of strings serializes"));
        let p = vec![
            boxed(a.name.clone()),
            boxed(a.secret_sha256.clone()),
            boxed(a.registration_sha256.clone()),
            boxed(i(a.generation)),
            boxed(a.max_tier.clone()),
            boxed(a.host_kind.clone()),
            boxed(i(a.created_ms)),
            boxed(a.parent.clone()),
            boxed(scopes),
        ];
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO agents (name, secret_sha256, registration_sha256, generation, max_tier, host_kind, created_ms, revoked_ms, parent, scopes)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, $8, $9)",
                p,
            )
        })?;
        Ok(())
    }

    fn replace_secret(
        &mut self,
        old: &AgentRow,
        new_secret: &str,
        new_registration: &str,
        now_ms: u64,
    ) -> Result<()> {
        let (name, old_secret) = (old.name.clone(), old.secret_sha256.clone());
        let (secret, registration) = (new_secret.to_string(), new_registration.to_string());
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("INSERT INTO retired_secrets (secret_sha256, agent, retired_ms, why) VALUES ($1, $2, $3, 'rotated') ON CONFLICT DO NOTHING").await.map_err(pg)?,
                &[&old_secret, &name, &i(now_ms)],
            )
            .await
            .map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("UPDATE agents SET secret_sha256 = $2, registration_sha256 = $3, generation = generation + 1, revoked_ms = NULL WHERE name = $1").await.map_err(pg)?,
                &[&name, &secret, &registration],
            )
            .await
            .map_err(pg)?;
            bump(&tx).await?;
            tx.commit().await.map_err(pg)
        })
    }

    fn revoke(&mut self, a: &AgentRow, now_ms: u64) -> Result<()> {
        let (name, secret) = (a.name.clone(), a.secret_sha256.clone());
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            revoke_in(&tx, &name, &secret, &name, i(now_ms)).await?;
            bump(&tx).await?;
            tx.commit().await.map_err(pg)
        })
    }

    fn revoke_subtree(&mut self, root: &str, now_ms: u64, depth_max: u32) -> Result<Vec<String>> {
        let root = root.to_string();
        let depth = i64::from(depth_max.min(SUBTREE_DEPTH_MAX));
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            // the subtree's rows locked for the transaction: a node delegated meanwhile under
            // one of them waits, and is then seen revoked by the credential check
            let rows = tx
                .query(
                    &tx.prepare_cached(
                        "WITH RECURSIVE sub(name, depth) AS (
                        SELECT $1::text COLLATE \"C\", 0::bigint
                        UNION ALL
                        SELECT a.name, sub.depth + 1 FROM agents a JOIN sub ON a.parent = sub.name
                        WHERE sub.depth < $2)
                     SELECT a.name, a.secret_sha256, a.revoked_ms IS NOT NULL
                     FROM agents a JOIN sub ON a.name = sub.name
                     ORDER BY a.name FOR UPDATE OF a",
                    )
                    .await
                    .map_err(pg)?,
                    &[&root, &depth],
                )
                .await
                .map_err(pg)?;
            let mut revoked = Vec::new();
            for r in rows {
                let (name, secret, already): (String, String, bool) =
                    (r.get(0), r.get(1), r.get(2));
                if already {
                    continue;
                }
                revoke_in(&tx, &name, &secret, &root, i(now_ms)).await?;
                revoked.push(name);
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(revoked)
        })
    }

    fn set_max_tier(&mut self, agent: &str, tier: &str) -> Result<()> {
        let p = vec![boxed(agent.to_string()), boxed(tier.to_string())];
        self.write(move |c| exec1(c, "UPDATE agents SET max_tier = $2 WHERE name = $1", p))?;
        Ok(())
    }

    fn set_scopes(&mut self, agent: &str, scopes: &[String]) -> Result<()> {
        let text = serde_json::to_string(scopes).expect("a list of strings serializes");
        let p = vec![boxed(agent.to_string()), boxed(text)];
        self.write(move |c| exec1(c, "UPDATE agents SET scopes = $2 WHERE name = $1", p))?;
        Ok(())
    }

    fn set_verb_denied(&mut self, agent: &str, verb: &str, denied: bool) -> Result<()> {
        let p = vec![boxed(agent.to_string()), boxed(verb.to_string())];
        self.write(move |c| {
            exec1(
                c,
                if denied {
                    "INSERT INTO denied_verbs (agent, verb) VALUES ($1, $2) ON CONFLICT DO NOTHING"
                } else {
                    "DELETE FROM denied_verbs WHERE agent = $1 AND verb = $2"
                },
                p,
            )
        })?;
        Ok(())
    }

    fn insert_project(&mut self, p: &ProjectRow) -> Result<()> {
        let v = vec![
            boxed(p.id.clone()),
            boxed(p.name.clone()),
            boxed(p.requested_root.clone()),
            boxed(p.canonical_root.clone()),
            boxed(i(p.dev)),
            boxed(i(p.ino)),
            boxed(i(p.mnt_id)),
            boxed(i(p.opened_ms)),
        ];
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO projects (id, name, requested_root, canonical_root, dev, ino, mnt_id, opened_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                v,
            )
        })?;
        Ok(())
    }

    fn insert_room(&mut self, r: &RoomRow, members: &[String]) -> Result<()> {
        let (r, members) = (r.clone(), members.to_vec());
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &format!("INSERT INTO rooms ({ROOM_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"),
                &[&r.name, &r.graph_id, &r.project_id, &i(r.created_ms), &i(r.revision), &i(r.reset_gen),
                  &r.reset_ms.map(i), &i(r.admission_gen), &r.admission_open, &r.archived_ms.map(i),
                  &i(r.cancel_gen), &r.cancelled],
            )
            .await
            .map_err(pg)?;
            for m in &members {
                tx.execute(
                    &tx.prepare_cached("INSERT INTO members (room, agent) VALUES ($1, $2) ON CONFLICT DO NOTHING").await.map_err(pg)?,
                    &[&r.name, m],
                )
                .await
                .map_err(pg)?;
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)
        })
    }

    fn archive_room(&mut self, name: &str, at_ms: u64) -> Result<bool> {
        let p = vec![boxed(name.to_string()), boxed(i(at_ms))];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE rooms SET archived_ms = $2 WHERE name = $1 AND archived_ms IS NULL",
                p,
            )
        })?;
        Ok(n == 1)
    }

    fn add_member(&mut self, room: &str, agent: &str) -> Result<bool> {
        let (room, agent) = (room.to_string(), agent.to_string());
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let n = tx
                .execute(
                    &tx.prepare_cached(
                        "INSERT INTO members (room, agent) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    )
                    .await
                    .map_err(pg)?,
                    &[&room, &agent],
                )
                .await
                .map_err(pg)?;
            if n > 0 {
                tx.execute(
                    &tx.prepare_cached("UPDATE rooms SET revision = revision + 1 WHERE name = $1")
                        .await
                        .map_err(pg)?,
                    &[&room],
                )
                .await
                .map_err(pg)?;
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(n > 0)
        })
    }

    fn reset_room_at(&mut self, room: &str, seq: u64, at_ms: u64) -> Result<()> {
        let p = vec![boxed(room.to_string()), boxed(i(seq)), boxed(i(at_ms))];
        self.write(move |c| {
            exec1(
                c,
                "UPDATE rooms SET reset_gen = $2, revision = revision + 1, reset_ms = $3 WHERE name = $1 AND reset_gen < $2",
                p,
            )
        })?;
        Ok(())
    }

    fn set_admission(&mut self, room: &str, seq: u64, open: bool) -> Result<()> {
        let p = vec![boxed(room.to_string()), boxed(i(seq)), boxed(open)];
        self.write(move |c| {
            exec1(
                c,
                "UPDATE rooms SET admission_gen = $2, admission_open = $3, revision = revision + 1
                 WHERE name = $1 AND admission_gen < $2",
                p,
            )
        })?;
        Ok(())
    }

    fn break_glass(&self) -> Result<bool> {
        self.call(|c| async move {
            let v: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT value FROM control_meta WHERE key = 'break_glass'")
                        .await
                        .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            Ok(v != 0)
        })
    }

    fn set_break_glass(&mut self, engaged: bool) -> Result<u64> {
        let v = i64::from(engaged);
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("UPDATE control_meta SET value = $1 WHERE key = 'break_glass'").await.map_err(pg)?,
                &[&v],
            )
            .await
            .map_err(pg)?;
            let epoch: i64 = tx
                .query_one(
                    &tx.prepare_cached("UPDATE control_meta SET value = value + 1 WHERE key = 'control_epoch' RETURNING value").await.map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            u(epoch, "control_epoch")
        })
    }

    fn tasks_open_count(&self, room: &str, owner: &str) -> Result<u64> {
        self.tasks_open_count_pg(room, owner)
    }

    fn task_ids_in(&self, rooms: &[String], prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.task_ids_in_pg(rooms, prefix, limit)
    }

    fn rooms_with_claims(&self) -> Result<Vec<String>> {
        self.rooms_with_claims_pg()
    }

    fn remove_room(&mut self, name: &str) -> Result<bool> {
        self.remove_room_pg(name)
    }

    fn set_cancelled(
        &mut self,
        room: &str,
        seq: u64,
        cancel: Option<&CancelEffect<'_>>,
    ) -> Result<()> {
        self.set_cancelled_pg(room, seq, cancel)
    }

    fn wakes_dead_count(&self, room: &str, reason: &str) -> Result<u64> {
        self.wakes_dead_count_pg(room, reason)
    }

    fn holds(&self, room: &str, limit: usize) -> Result<Vec<room_store::control::HoldRow>> {
        self.holds_pg(room, limit)
    }

    fn hold(&self, id: &str) -> Result<Option<room_store::control::HoldRow>> {
        self.hold_pg(id)
    }

    fn insert_composition(&mut self, g: &room_store::control::CompositionRow) -> Result<()> {
        self.insert_composition_pg(g)
    }

    fn composition(&self, id: &str) -> Result<Option<room_store::control::CompositionRow>> {
        self.composition_pg(id)
    }

    fn revoke_composition(&mut self, id: &str, now_ms: u64) -> Result<bool> {
        self.revoke_composition_pg(id, now_ms)
    }

    fn compositions(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<room_store::control::CompositionRow>> {
        self.compositions_pg(agent, limit)
    }

    fn active_compositions(&self, agent: &str) -> Result<Vec<room_store::control::CompositionRow>> {
        self.active_compositions_pg(agent)
    }

    fn insert_collab(&mut self, c: &room_store::control::CollabRow) -> Result<()> {
        self.insert_collab_pg(c)
    }

    fn collab(&self, id: &str) -> Result<Option<room_store::control::CollabRow>> {
        self.collab_pg(id)
    }

    fn collabs(
        &self,
        state: Option<&str>,
        limit: usize,
    ) -> Result<Vec<room_store::control::CollabRow>> {
        self.collabs_pg(state, limit)
    }

    fn set_collab_state(&mut self, id: &str, from: &str, to: &str, now_ms: u64) -> Result<bool> {
        self.set_collab_state_pg(id, from, to, now_ms)
    }

    fn put_collab_run(&mut self, r: &room_store::control::CollabRunRow) -> Result<()> {
        self.put_collab_run_pg(r)
    }

    fn collab_runs(
        &self,
        collab: &str,
        limit: usize,
    ) -> Result<Vec<room_store::control::CollabRunRow>> {
        self.collab_runs_pg(collab, limit)
    }

    fn insert_approval(&mut self, a: &room_store::control::ApprovalRow) -> Result<()> {
        self.insert_approval_pg(a)
    }

    fn approval(&self, id: &str) -> Result<Option<room_store::control::ApprovalRow>> {
        self.approval_pg(id)
    }

    fn approvals(
        &self,
        collab: &str,
        limit: usize,
    ) -> Result<Vec<room_store::control::ApprovalRow>> {
        self.approvals_pg(collab, limit)
    }

    fn decide_approval(
        &mut self,
        id: &str,
        digest: &str,
        to: &str,
        now_ms: u64,
        note: Option<&str>,
    ) -> Result<bool> {
        self.decide_approval_pg(id, digest, to, now_ms, note)
    }

    fn resolve_hold(
        &mut self,
        id: &str,
        r: &room_store::control::HoldResolution<'_>,
    ) -> Result<bool> {
        self.resolve_hold_pg(id, r)
    }

    fn task(&self, id: &str) -> Result<Option<TaskRow>> {
        self.task_pg(id)
    }

    fn children(&self, parent: &str) -> Result<Vec<TaskRow>> {
        self.children_pg(parent)
    }

    fn leased(&self, project: Option<&str>, room: &str) -> Result<Vec<TaskRow>> {
        self.leased_pg(project, room)
    }

    fn leased_over(
        &self,
        project: Option<&str>,
        room: &str,
        over: &[room_core::scope::Scope],
    ) -> Result<Vec<TaskRow>> {
        self.leased_over_pg(project, room, over)
    }

    fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.insert_task_pg(t)
    }

    fn amend_task(&mut self, id: &str, terms: &room_core::event::TaskTerms) -> Result<bool> {
        self.amend_task_pg(id, terms)
    }

    fn pin_claim(
        &mut self,
        id: &str,
        pin: &std::collections::BTreeMap<String, String>,
    ) -> Result<()> {
        self.pin_claim_pg(id, pin)
    }

    fn set_override(&mut self, id: &str, reason: &str) -> Result<()> {
        self.set_override_pg(id, reason)
    }

    fn set_successor(&mut self, id: &str, successor: &str) -> Result<()> {
        self.set_successor_pg(id, successor)
    }

    fn move_stage_pin(&mut self, id: &str, path: &str, from: &str, to: &str) -> Result<bool> {
        self.move_stage_pin_pg(id, path, from, to)
    }

    fn project_source(&self, project: &str) -> Result<Option<Vec<String>>> {
        self.project_source_pg(project)
    }

    fn set_project_source(&mut self, project: &str, parts: Option<&[String]>) -> Result<()> {
        self.set_project_source_pg(project, parts)
    }

    fn superseded_by(&self, successor: &str) -> Result<Vec<TaskRow>> {
        self.superseded_by_pg(successor)
    }

    fn update_task(
        &mut self,
        id: &str,
        from_status: &str,
        status: &str,
        recipient: Option<&str>,
        now_ms: u64,
        lease_gen: Option<u64>,
    ) -> Result<bool> {
        self.update_task_pg(id, from_status, status, recipient, now_ms, lease_gen)
    }

    fn release_lease(&mut self, id: &str, generation: u64) -> Result<bool> {
        self.release_lease_pg(id, generation)
    }

    fn lease_gen_max(&self) -> Result<u64> {
        self.lease_gen_max_pg()
    }

    fn clear_room_tasks(&mut self, room: &str) -> Result<u64> {
        self.clear_room_tasks_pg(room)
    }

    fn record_task_check(&mut self, row: &TaskCheckRow) -> Result<()> {
        self.record_task_check_pg(row)
    }

    fn task_check(&self, task: &str) -> Result<Option<TaskCheckRow>> {
        self.task_check_pg(task)
    }

    fn wakes_to_check(&self, limit: usize) -> Result<Vec<WakeRow>> {
        self.wakes_to_check_pg(limit)
    }

    fn wakes_checked(
        &mut self,
        checked: &[room_store::control::WakeVerdict],
        at_ms: u64,
    ) -> Result<Vec<bool>> {
        self.wakes_checked_pg(checked, at_ms)
    }

    fn wake(&self, room: &str, agent: &str, source_event: &str) -> Result<Option<WakeRow>> {
        self.wake_pg(room, agent, source_event)
    }

    fn wakes_queued_of(&self, agents: &[String], limit: usize) -> Result<Vec<WakeRow>> {
        self.wakes_queued_of_pg(agents, limit)
    }

    fn insert_launch(&mut self, l: &room_store::control::LaunchRow) -> Result<bool> {
        self.insert_launch_pg(l)
    }

    fn launch(&self, id: &str) -> Result<Option<room_store::control::LaunchRow>> {
        self.launch_pg(id)
    }

    fn launch_by_secret(
        &self,
        secret_sha256: &str,
    ) -> Result<Option<room_store::control::LaunchRow>> {
        self.launch_by_secret_pg(secret_sha256)
    }

    fn launches_of(
        &self,
        agent: &str,
        limit: usize,
    ) -> Result<Vec<room_store::control::LaunchRow>> {
        self.launches_of_pg(agent, limit)
    }

    fn launches_of_wake(
        &self,
        room: &str,
        agent: &str,
        source_event: &str,
    ) -> Result<Vec<room_store::control::LaunchRow>> {
        self.launches_of_wake_pg(room, agent, source_event)
    }

    fn launches_live(&self) -> Result<Vec<room_store::control::LaunchRow>> {
        self.launches_live_pg()
    }

    fn launch_running(&mut self, id: &str, pid: Option<u32>, at_ms: u64) -> Result<bool> {
        self.launch_running_pg(id, pid, at_ms)
    }

    fn launch_severed(&mut self, id: &str, detail: &str) -> Result<bool> {
        self.launch_severed_pg(id, detail)
    }

    fn launch_unconfirmed(&mut self, id: &str, detail: &str) -> Result<bool> {
        self.launch_unconfirmed_pg(id, detail)
    }

    fn launch_ended(&mut self, id: &str, end: &room_store::control::LaunchEnd) -> Result<bool> {
        self.launch_ended_pg(id, end)
    }

    fn sessions(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<room_store::control::SessionRow>> {
        self.sessions_pg(agent, limit)
    }

    fn session(&self, id: &str) -> Result<Option<room_store::control::SessionRow>> {
        self.session_pg(id)
    }

    fn session_bound(&self, agent: &str) -> Result<Option<room_store::control::SessionRow>> {
        self.session_bound_pg(agent)
    }

    fn insert_wakes(&mut self, rows: &[WakeRow]) -> Result<()> {
        self.insert_wakes_pg(rows)
    }

    fn wakes_requeue_pending(&self) -> Result<bool> {
        self.wakes_requeue_pending_pg()
    }

    fn wakes_requeue_done(&mut self) -> Result<()> {
        self.wakes_requeue_done_pg()
    }

    fn room_witnesses(&self, room: &str) -> Result<RoomWitnesses> {
        self.room_witnesses_pg(room)
    }

    fn wakes(&self, room: Option<&str>) -> Result<Vec<WakeRow>> {
        self.wakes_pg(room)
    }
}
