//! The wake queue, launches and sessions on PostgreSQL: sealed permits and their dispatch
//! state, each attempt to deliver one (with its one-launch credential's digest), and the
//! native sessions launches ran in. Several daemons may dispatch from one database, so a
//! launch locks its permit's row in its transaction: one permit is never launched twice.

use crate::control::{PgControl, boxed, bump, exec1, i, u};
use crate::pg;
use room_store::control::{
    LAUNCHES_OF_WAKE_MAX, LaunchEnd, LaunchRow, RoomWitnesses, SESSIONS_PAGE_MAX, SessionRow,
    WAKE_QUEUED, WAKE_WITNESSES_MAX, WAKES_PAGE_MAX, WakeRow, WakeVerdict,
};
use room_store::{Result, StoreError};

/// The wake, launch and session tables, a step of the schema after the control tables
/// (`crate::MIGRATIONS`).
///
/// `wakes_requeue`: SQLite sets it because permits sealed before its queue existed were files.
/// A PostgreSQL store never had those, but it keeps the same contract (a new store asks for
/// one re-queue, which finds no room yet and costs nothing), so both backends answer alike.
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE wakes (
    room text NOT NULL REFERENCES rooms (name),
    agent text NOT NULL,
    source_event text NOT NULL,
    created_ms bigint NOT NULL,
    permit text NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    reason text,
    detail text,
    checked_ms bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (room, agent, source_event)
);
CREATE INDEX wakes_created ON wakes (created_ms);
CREATE INDEX wakes_room_created ON wakes (room, created_ms);
CREATE INDEX wakes_state_checked ON wakes (state, checked_ms);
CREATE INDEX wakes_agent_state ON wakes (agent, state, created_ms);
CREATE TABLE launches (
    id text PRIMARY KEY,
    room text NOT NULL,
    agent text NOT NULL,
    source_event text NOT NULL,
    secret_sha256 text NOT NULL UNIQUE,
    permit_sha256 text NOT NULL,
    state text NOT NULL,
    pid bigint,
    created_ms bigint NOT NULL,
    not_after_ms bigint NOT NULL,
    ended_ms bigint,
    outcome text,
    proof text,
    detail text,
    delivery text,
    started_ms bigint,
    control_epoch bigint NOT NULL DEFAULT 1,
    cancel_gen bigint NOT NULL DEFAULT 0,
    conversation text,
    severed text
);
CREATE INDEX launches_agent ON launches (agent, state);
CREATE INDEX launches_wake ON launches (room, agent, source_event);
CREATE INDEX launches_live ON launches (created_ms) WHERE state != 'ended';
CREATE TABLE sessions (
    id text PRIMARY KEY,
    agent text NOT NULL,
    host text NOT NULL,
    native text NOT NULL,
    cwd text NOT NULL,
    transport text NOT NULL,
    model text,
    proof text NOT NULL,
    parent text,
    launch text NOT NULL,
    launches bigint NOT NULL,
    loadable boolean NOT NULL,
    bound boolean NOT NULL,
    created_ms bigint NOT NULL,
    updated_ms bigint NOT NULL,
    tags text NOT NULL DEFAULT '[]'
);
CREATE INDEX sessions_agent ON sessions (agent, updated_ms);
CREATE UNIQUE INDEX sessions_bound ON sessions (agent) WHERE bound;
INSERT INTO control_meta (key, value) VALUES ('wakes_requeue', 1);
"#;

const WAKE_COLS: &str = "room, agent, source_event, created_ms, permit, state, reason, detail";

const LAUNCH_COLS: &str = "id, room, agent, source_event, secret_sha256, permit_sha256, state, pid, created_ms, not_after_ms, ended_ms, outcome, proof, detail, delivery, started_ms, control_epoch, cancel_gen, conversation, severed";

const SESSION_COLS: &str = "id, agent, host, native, cwd, transport, model, proof, parent, launch, launches, loadable, bound, created_ms, updated_ms, tags";

/// A caller's limit as a bound PostgreSQL takes (SQLite reads a huge one as none).
fn lim(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn opt_u(v: Option<i64>, what: &str) -> Result<Option<u64>> {
    v.map(|v| u(v, what)).transpose()
}

fn wake_from(r: &tokio_postgres::Row) -> Result<WakeRow> {
    Ok(WakeRow {
        room: r.get(0),
        agent: r.get(1),
        source_event: r.get(2),
        created_ms: u(r.get(3), "created_ms")?,
        permit: r.get(4),
        state: r.get(5),
        reason: r.get(6),
        detail: r.get(7),
    })
}

fn launch_from(r: &tokio_postgres::Row) -> Result<LaunchRow> {
    let id: String = r.get(0);
    let pid = r
        .get::<_, Option<i64>>(7)
        .map(|p| u32::try_from(p).map_err(|_| StoreError::Corrupt(format!("launch {id}: pid {p}"))))
        .transpose()?;
    Ok(LaunchRow {
        room: r.get(1),
        agent: r.get(2),
        source_event: r.get(3),
        secret_sha256: r.get(4),
        permit_sha256: r.get(5),
        state: r.get(6),
        pid,
        created_ms: u(r.get(8), "created_ms")?,
        not_after_ms: u(r.get(9), "not_after_ms")?,
        ended_ms: opt_u(r.get(10), "ended_ms")?,
        outcome: r.get(11),
        proof: r.get(12),
        detail: r.get(13),
        delivery: r.get(14),
        started_ms: opt_u(r.get(15), "started_ms")?,
        control_epoch: u(r.get(16), "control_epoch")?,
        cancel_gen: u(r.get(17), "cancel_gen")?,
        conversation: r.get(18),
        severed: r.get(19),
        id,
    })
}

fn session_from(r: &tokio_postgres::Row) -> Result<SessionRow> {
    let id: String = r.get(0);
    let text: String = r.get(15);
    let tags = serde_json::from_str(&text)
        .map_err(|e| StoreError::Corrupt(format!("session {id}: tags {text:?}: {e}")))?;
    Ok(SessionRow {
        agent: r.get(1),
        host: r.get(2),
        native: r.get(3),
        cwd: r.get(4),
        transport: r.get(5),
        model: r.get(6),
        proof: r.get(7),
        parent: r.get(8),
        launch: r.get(9),
        launches: u(r.get(10), "launches")?,
        loadable: r.get(11),
        bound: r.get(12),
        created_ms: u(r.get(13), "created_ms")?,
        updated_ms: u(r.get(14), "updated_ms")?,
        tags,
        id,
    })
}

fn session_elsewhere(s: &SessionRow) -> StoreError {
    StoreError::Corrupt(format!(
        "session {} is kept for another agent than {}",
        s.id, s.agent
    ))
}

/// Insert a session or move an existing one on (its proof, newest launch, count), in `tx`;
/// binding one unbinds the agent's others. A session id kept for another agent is refused:
/// one native session never speaks for two agents.
async fn record_session(tx: &deadpool_postgres::Transaction<'_>, s: &SessionRow) -> Result<()> {
    // locked, so another daemon cannot move the row between this check and the upsert
    let owner: Option<String> = tx
        .query_opt(
            &tx.prepare_cached("SELECT agent FROM sessions WHERE id = $1 FOR UPDATE")
                .await
                .map_err(pg)?,
            &[&s.id],
        )
        .await
        .map_err(pg)?
        .map(|r| r.get(0));
    if owner.as_deref().is_some_and(|a| a != s.agent) {
        return Err(session_elsewhere(s));
    }
    if s.bound {
        tx.execute(
            &tx.prepare_cached(
                "UPDATE sessions SET bound = false WHERE agent = $1 AND id != $2 AND bound",
            )
            .await
            .map_err(pg)?,
            &[&s.agent, &s.id],
        )
        .await
        .map_err(pg)?;
    }
    let tags = serde_json::to_string(&s.tags).expect("a list of strings serializes");
    // the guard on agent covers a row another daemon inserted after the check found none
    let n = tx
        .execute(
            &format!(
                "INSERT INTO sessions ({SESSION_COLS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 1, $11, $12, $13, $13, $14)
                 ON CONFLICT (id) DO UPDATE SET proof = excluded.proof, launch = excluded.launch,
                   launches = sessions.launches + 1, loadable = excluded.loadable,
                   bound = sessions.bound OR excluded.bound, updated_ms = excluded.updated_ms,
                   model = excluded.model, tags = excluded.tags
                 WHERE sessions.agent = excluded.agent"
            ),
            &[
                &s.id,
                &s.agent,
                &s.host,
                &s.native,
                &s.cwd,
                &s.transport,
                &s.model,
                &s.proof,
                &s.parent,
                &s.launch,
                &s.loadable,
                &s.bound,
                &i(s.updated_ms),
                &tags,
            ],
        )
        .await
        .map_err(pg)?;
    if n != 1 {
        return Err(session_elsewhere(s));
    }
    Ok(())
}

impl PgControl {
    /// Queue `rows` in one transaction (one statement: an unknown room fails the whole batch);
    /// a permit already queued under the same key stays as it was sealed.
    pub(crate) fn insert_wakes_pg(&mut self, rows: &[WakeRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let rooms: Vec<String> = rows.iter().map(|w| w.room.clone()).collect();
        let agents: Vec<String> = rows.iter().map(|w| w.agent.clone()).collect();
        let sources: Vec<String> = rows.iter().map(|w| w.source_event.clone()).collect();
        let created: Vec<i64> = rows.iter().map(|w| i(w.created_ms)).collect();
        let permits: Vec<String> = rows.iter().map(|w| w.permit.clone()).collect();
        let p = vec![
            boxed(rooms),
            boxed(agents),
            boxed(sources),
            boxed(created),
            boxed(permits),
        ];
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO wakes (room, agent, source_event, created_ms, permit)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
                 ON CONFLICT DO NOTHING",
                p,
            )
        })?;
        Ok(())
    }

    pub(crate) fn wakes_requeue_pending_pg(&self) -> Result<bool> {
        self.call(|c| async move {
            Ok(c.query_opt(
                &c.prepare_cached("SELECT 1 FROM control_meta WHERE key = 'wakes_requeue'")
                    .await
                    .map_err(pg)?,
                &[],
            )
            .await
            .map_err(pg)?
            .is_some())
        })
    }

    pub(crate) fn wakes_requeue_done_pg(&mut self) -> Result<()> {
        self.write(|c| {
            exec1(
                c,
                "DELETE FROM control_meta WHERE key = 'wakes_requeue'",
                Vec::new(),
            )
        })?;
        Ok(())
    }

    pub(crate) fn room_witnesses_pg(&self, room: &str) -> Result<RoomWitnesses> {
        let room = room.to_string();
        self.call(move |c| async move {
            let reset: Option<i64> = c
                .query_opt(&c.prepare_cached("SELECT reset_gen FROM rooms WHERE name = $1").await.map_err(pg)?, &[&room])
                .await
                .map_err(pg)?
                .map(|r| r.get(0));
            let newest = c
                .query(
                    &c.prepare_cached(r#"SELECT source_event FROM wakes WHERE room = $1
                       ORDER BY created_ms DESC, agent COLLATE "C" DESC, source_event COLLATE "C" DESC
                       LIMIT $2"#).await.map_err(pg)?,
                    &[&room, &lim(WAKE_WITNESSES_MAX)],
                )
                .await
                .map_err(pg)?;
            // DISTINCT would not keep the order: each source once, where it first shows
            let mut wake_sources: Vec<String> = Vec::new();
            for r in &newest {
                let s: String = r.get(0);
                if !wake_sources.contains(&s) {
                    wake_sources.push(s);
                }
            }
            Ok(RoomWitnesses {
                reset_seq: u(reset.unwrap_or(0).max(0), "reset_gen")?,
                wake_sources,
            })
        })
    }

    /// Permits in every state, oldest first, optionally of one room; at most `WAKES_PAGE_MAX`.
    pub(crate) fn wakes_pg(&self, room: Option<&str>) -> Result<Vec<WakeRow>> {
        let room = room.map(str::to_string);
        let by_room = format!(
            r#"SELECT {WAKE_COLS} FROM wakes WHERE room = $1
               ORDER BY created_ms, agent COLLATE "C", source_event COLLATE "C" LIMIT $2"#
        );
        let all = format!(
            r#"SELECT {WAKE_COLS} FROM wakes
               ORDER BY created_ms, room COLLATE "C", agent COLLATE "C", source_event COLLATE "C"
               LIMIT $1"#
        );
        let max = lim(WAKES_PAGE_MAX);
        self.call(move |c| async move {
            // two statements, so each can use its index (a room's rows, or all by creation)
            let rows = match &room {
                Some(r) => c.query(&by_room, &[r, &max]).await,
                None => c.query(&all, &[&max]).await,
            }
            .map_err(pg)?;
            rows.iter().map(wake_from).collect()
        })
    }

    /// Queued permits, least recently revalidated first.
    pub(crate) fn wakes_to_check_pg(&self, limit: usize) -> Result<Vec<WakeRow>> {
        self.call(move |c| async move {
            c.query(
                &format!(
                    r#"SELECT {WAKE_COLS} FROM wakes WHERE state = 'queued'
                       ORDER BY checked_ms, created_ms, room COLLATE "C", agent COLLATE "C",
                         source_event COLLATE "C"
                       LIMIT $1"#
                ),
                &[&lim(limit)],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(wake_from)
            .collect()
        })
    }

    /// Each verdict recorded in one transaction; for each, whether its permit was still queued
    /// (a dead one is dead-lettered, never launched).
    pub(crate) fn wakes_checked_pg(
        &mut self,
        checked: &[WakeVerdict],
        at_ms: u64,
    ) -> Result<Vec<bool>> {
        if checked.is_empty() {
            return Ok(Vec::new());
        }
        let checked = checked.to_vec();
        let at = i(at_ms);
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let st = tx
                .prepare(
                    "UPDATE wakes SET checked_ms = $4,
                        state = CASE WHEN $5::text IS NULL THEN state ELSE 'dead' END,
                        reason = COALESCE($5::text, reason), detail = COALESCE($6::text, detail)
                     WHERE room = $1 AND agent = $2 AND source_event = $3 AND state = 'queued'",
                )
                .await
                .map_err(pg)?;
            let mut moved = Vec::with_capacity(checked.len());
            for v in &checked {
                let w = &v.wake;
                let (reason, detail) = match &v.dead {
                    Some((r, d)) => (Some(r.as_str()), Some(d.as_str())),
                    None => (None, None),
                };
                let n = tx
                    .execute(
                        &st,
                        &[&w.room, &w.agent, &w.source_event, &at, &reason, &detail],
                    )
                    .await
                    .map_err(pg)?;
                moved.push(n == 1);
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(moved)
        })
    }

    pub(crate) fn wake_pg(
        &self,
        room: &str,
        agent: &str,
        source_event: &str,
    ) -> Result<Option<WakeRow>> {
        let (room, agent, src) = (
            room.to_string(),
            agent.to_string(),
            source_event.to_string(),
        );
        self.call(move |c| async move {
            c.query_opt(
                &format!(
                    "SELECT {WAKE_COLS} FROM wakes WHERE room = $1 AND agent = $2 AND source_event = $3"
                ),
                &[&room, &agent, &src],
            )
            .await
            .map_err(pg)?
            .map(|r| wake_from(&r))
            .transpose()
        })
    }

    /// Queued permits of `agents`, oldest first, at most `limit` in all; ties in the order the
    /// agents were named (SQLite reads them agent by agent, then sorts stably).
    pub(crate) fn wakes_queued_of_pg(
        &self,
        agents: &[String],
        limit: usize,
    ) -> Result<Vec<WakeRow>> {
        if agents.is_empty() {
            return Ok(Vec::new());
        }
        let agents = agents.to_vec();
        self.call(move |c| async move {
            c.query(
                &format!(
                    r#"SELECT {WAKE_COLS} FROM wakes WHERE state = 'queued' AND agent = ANY($1::text[])
                       ORDER BY created_ms, array_position($1::text[], agent),
                         room COLLATE "C", source_event COLLATE "C"
                       LIMIT $2"#
                ),
                &[&agents, &lim(limit)],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(wake_from)
            .collect()
        })
    }

    /// Record a launch of a queued permit, which becomes `dispatched`; false, with nothing
    /// written, when the permit is not queued any more.
    pub(crate) fn insert_launch_pg(&mut self, l: &LaunchRow) -> Result<bool> {
        let l = l.clone();
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            // locked until commit: a daemon launching the same permit waits here, then reads
            // it dispatched
            let state: Option<String> = tx
                .query_opt(
                    &tx.prepare_cached("SELECT state FROM wakes WHERE room = $1 AND agent = $2 AND source_event = $3
                     FOR UPDATE").await.map_err(pg)?,
                    &[&l.room, &l.agent, &l.source_event],
                )
                .await
                .map_err(pg)?
                .map(|r| r.get(0));
            if state.as_deref() != Some(WAKE_QUEUED) {
                // taken or dead-lettered meanwhile: dropping the transaction rolls it back
                return Ok(false);
            }
            tx.execute(
                &tx.prepare_cached("UPDATE wakes SET state = 'dispatched' WHERE room = $1 AND agent = $2 AND source_event = $3").await.map_err(pg)?,
                &[&l.room, &l.agent, &l.source_event],
            )
            .await
            .map_err(pg)?;
            tx.execute(
                &format!(
                    "INSERT INTO launches ({LAUNCH_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                     $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)"
                ),
                &[
                    &l.id, &l.room, &l.agent, &l.source_event, &l.secret_sha256, &l.permit_sha256,
                    &l.state, &l.pid.map(i64::from), &i(l.created_ms), &i(l.not_after_ms),
                    &l.ended_ms.map(i), &l.outcome, &l.proof, &l.detail, &l.delivery,
                    &l.started_ms.map(i), &i(l.control_epoch), &i(l.cancel_gen), &l.conversation,
                    &l.severed,
                ],
            )
            .await
            .map_err(pg)?;
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(true)
        })
    }

    pub(crate) fn launch_pg(&self, id: &str) -> Result<Option<LaunchRow>> {
        self.launch_where("id", id)
    }

    pub(crate) fn launch_by_secret_pg(&self, secret_sha256: &str) -> Result<Option<LaunchRow>> {
        self.launch_where("secret_sha256", secret_sha256)
    }

    /// The launch whose unique column `col` (a name of this file's, never a caller's) is `v`.
    fn launch_where(&self, col: &'static str, v: &str) -> Result<Option<LaunchRow>> {
        let v = v.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {LAUNCH_COLS} FROM launches WHERE {col} = $1"),
                &[&v],
            )
            .await
            .map_err(pg)?
            .map(|r| launch_from(&r))
            .transpose()
        })
    }

    /// An agent's launches, newest first.
    pub(crate) fn launches_of_pg(&self, agent: &str, limit: usize) -> Result<Vec<LaunchRow>> {
        let agent = agent.to_string();
        self.call(move |c| async move {
            c.query(
                &format!(
                    r#"SELECT {LAUNCH_COLS} FROM launches WHERE agent = $1
                       ORDER BY created_ms DESC, id COLLATE "C" LIMIT $2"#
                ),
                &[&agent, &lim(limit)],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(launch_from)
            .collect()
        })
    }

    /// A permit's launches, oldest first, at most `LAUNCHES_OF_WAKE_MAX`.
    pub(crate) fn launches_of_wake_pg(
        &self,
        room: &str,
        agent: &str,
        source_event: &str,
    ) -> Result<Vec<LaunchRow>> {
        let (room, agent, src) = (
            room.to_string(),
            agent.to_string(),
            source_event.to_string(),
        );
        self.call(move |c| async move {
            c.query(
                &format!(
                    r#"SELECT {LAUNCH_COLS} FROM launches
                       WHERE room = $1 AND agent = $2 AND source_event = $3
                       ORDER BY created_ms, id COLLATE "C" LIMIT {LAUNCHES_OF_WAKE_MAX}"#
                ),
                &[&room, &agent, &src],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(launch_from)
            .collect()
        })
    }

    /// Launches not ended, by the partial index however many have ended.
    pub(crate) fn launches_live_pg(&self) -> Result<Vec<LaunchRow>> {
        self.call(|c| async move {
            c.query(
                &format!(
                    r#"SELECT {LAUNCH_COLS} FROM launches WHERE state != 'ended'
                       ORDER BY created_ms, id COLLATE "C""#
                ),
                &[],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(launch_from)
            .collect()
        })
    }

    pub(crate) fn launch_running_pg(
        &mut self,
        id: &str,
        pid: Option<u32>,
        at_ms: u64,
    ) -> Result<bool> {
        let p = vec![
            boxed(id.to_string()),
            boxed(pid.map(i64::from)),
            boxed(i(at_ms)),
        ];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE launches SET state = 'running', pid = $2, started_ms = $3
                 WHERE id = $1 AND state = 'starting'",
                p,
            )
        })?;
        Ok(n == 1)
    }

    /// The first severed response is kept.
    pub(crate) fn launch_severed_pg(&mut self, id: &str, detail: &str) -> Result<bool> {
        let p = vec![boxed(id.to_string()), boxed(detail.to_string())];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE launches SET severed = $2 WHERE id = $1 AND severed IS NULL",
                p,
            )
        })?;
        Ok(n == 1)
    }

    pub(crate) fn launch_unconfirmed_pg(&mut self, id: &str, detail: &str) -> Result<bool> {
        let p = vec![boxed(id.to_string()), boxed(detail.to_string())];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE launches SET state = 'unconfirmed', detail = $2
                 WHERE id = $1 AND state IN ('starting', 'running')",
                p,
            )
        })?;
        Ok(n == 1)
    }

    /// End a launch, move its permit and record its session, in one transaction; false when
    /// it had already ended.
    pub(crate) fn launch_ended_pg(&mut self, id: &str, end: &LaunchEnd) -> Result<bool> {
        let (id, end) = (id.to_string(), end.clone());
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let n = tx
                .execute(
                    &tx.prepare_cached("UPDATE launches SET state = 'ended', ended_ms = $2, outcome = $3, proof = $4,
                       detail = $5 WHERE id = $1 AND state != 'ended'").await.map_err(pg)?,
                    &[&id, &i(end.at_ms), &end.outcome, &end.proof, &end.detail],
                )
                .await
                .map_err(pg)?;
            if n == 1 {
                // a dead letter keeps the reason it died of (a cancel's, say)
                tx.execute(
                    &tx.prepare_cached("UPDATE wakes w SET state = $2, reason = $3 FROM launches l
                     WHERE l.id = $1 AND w.room = l.room AND w.agent = l.agent
                       AND w.source_event = l.source_event AND w.state != 'dead'").await.map_err(pg)?,
                    &[&id, &end.wake_state, &end.outcome],
                )
                .await
                .map_err(pg)?;
                if let Some(s) = &end.session {
                    record_session(&tx, s).await?;
                }
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(n == 1)
        })
    }

    /// Sessions, newest first, of one agent or all, at most `limit` and `SESSIONS_PAGE_MAX`.
    pub(crate) fn sessions_pg(&self, agent: Option<&str>, limit: usize) -> Result<Vec<SessionRow>> {
        let agent = agent.map(str::to_string);
        let limit = lim(limit.min(SESSIONS_PAGE_MAX));
        self.call(move |c| async move {
            c.query(
                &format!(
                    r#"SELECT {SESSION_COLS} FROM sessions WHERE $1::text IS NULL OR agent = $1
                       ORDER BY updated_ms DESC, id COLLATE "C" LIMIT $2"#
                ),
                &[&agent, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(session_from)
            .collect()
        })
    }

    pub(crate) fn session_pg(&self, id: &str) -> Result<Option<SessionRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| session_from(&r))
            .transpose()
        })
    }

    /// The session an agent's launches deliver into (at most one: a unique partial index).
    pub(crate) fn session_bound_pg(&self, agent: &str) -> Result<Option<SessionRow>> {
        let agent = agent.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE agent = $1 AND bound"),
                &[&agent],
            )
            .await
            .map_err(pg)?
            .map(|r| session_from(&r))
            .transpose()
        })
    }

    pub(crate) fn wakes_dead_count_pg(&self, room: &str, reason: &str) -> Result<u64> {
        let (room, reason) = (room.to_string(), reason.to_string());
        self.call(move |c| async move {
            let n: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT COUNT(*) FROM wakes WHERE room = $1 AND state = 'dead' AND reason = $2").await.map_err(pg)?,
                    &[&room, &reason],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(n, "count")
        })
    }
}
