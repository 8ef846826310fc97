//! Cancellation, holds and collaborations on PostgreSQL: a room's cancel generation with the
//! permits it kills and the items it holds for an operator, and each collaboration's record,
//! phase runs and approval queue. Kept apart from `control`, whose `ControlStore` impl calls
//! these; each keeps the semantics of SQLite's `SqliteControl` method of the same name.

use crate::control::{PgControl, boxed, bump, exec1, i, u};
use crate::pg;
use room_store::backend::CancelEffect;
use room_store::control::{
    ApprovalRow, CollabRow, CollabRunRow, CompositionRow, HOLDS_PAGE_MAX, HoldResolution, HoldRow,
};
use room_store::{Result, StoreError};

/// The tables of holds and collaborations, a step of `crate::MIGRATIONS`. The ids and phases
/// listings sort by are `COLLATE "C"`: byte order, as SQLite's, whatever the database's locale.
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE holds (
    id text COLLATE "C" PRIMARY KEY,
    room text COLLATE "C" NOT NULL REFERENCES rooms (name),
    kind text COLLATE "C" NOT NULL,
    item text COLLATE "C" NOT NULL,
    agent text COLLATE "C",
    task text COLLATE "C",
    cancel_seq bigint NOT NULL,
    created_ms bigint NOT NULL,
    resolved_seq bigint,
    resolved_ms bigint,
    resolved_by text COLLATE "C",
    outcome text COLLATE "C",
    evidence text COLLATE "C"
);
CREATE INDEX holds_room ON holds (room, created_ms);
CREATE TABLE collabs (
    id text COLLATE "C" PRIMARY KEY,
    room text COLLATE "C" NOT NULL,
    project text COLLATE "C",
    goal text COLLATE "C" NOT NULL,
    orchestrator text COLLATE "C" NOT NULL,
    spec text COLLATE "C" NOT NULL,
    state text COLLATE "C" NOT NULL,
    created_ms bigint NOT NULL,
    updated_ms bigint NOT NULL
);
CREATE INDEX collabs_state ON collabs (state, id);
CREATE TABLE collab_runs (
    collab text COLLATE "C" NOT NULL,
    phase text COLLATE "C" NOT NULL,
    run bigint NOT NULL,
    task text COLLATE "C",
    state text COLLATE "C" NOT NULL,
    reads text COLLATE "C" NOT NULL,
    started_ms bigint NOT NULL,
    ended_ms bigint,
    PRIMARY KEY (collab, phase, run)
);
CREATE TABLE collab_approvals (
    id text COLLATE "C" PRIMARY KEY,
    collab text COLLATE "C" NOT NULL,
    phase text COLLATE "C" NOT NULL,
    run bigint NOT NULL,
    digest text COLLATE "C" NOT NULL,
    input text COLLATE "C" NOT NULL,
    state text COLLATE "C" NOT NULL,
    created_ms bigint NOT NULL,
    decided_ms bigint,
    note text COLLATE "C"
);
CREATE INDEX collab_approvals_collab ON collab_approvals (collab, created_ms);
"#;

const HOLD_COLS: &str = "id, room, kind, item, agent, task, cancel_seq, created_ms, resolved_seq, resolved_ms, resolved_by, outcome, evidence";
/// The owner's composition grants (a step of `crate::MIGRATIONS` of its own, after the
/// migration's table).
pub(crate) const COMPOSITIONS_SCHEMA: &str = r#"
CREATE TABLE compositions (
    id text COLLATE "C" PRIMARY KEY,
    agent text COLLATE "C" NOT NULL REFERENCES agents (name),
    rooms text COLLATE "C" NOT NULL,
    project text COLLATE "C",
    created_ms bigint NOT NULL,
    revoked_ms bigint
);
CREATE INDEX compositions_agent ON compositions (agent, id);
"#;

const COMPOSITION_COLS: &str = "id, agent, rooms, project, created_ms, revoked_ms";

fn composition_from(r: &tokio_postgres::Row) -> Result<CompositionRow> {
    let rooms: String = r.get(2);
    Ok(CompositionRow {
        id: r.get(0),
        agent: r.get(1),
        rooms: serde_json::from_str(&rooms)
            .map_err(|e| StoreError::Corrupt(format!("composition rooms: {e}")))?,
        project: r.get(3),
        created_ms: u(r.get(4), "created_ms")?,
        revoked_ms: opt_u(r.get(5), "revoked_ms")?,
    })
}

const COLLAB_COLS: &str =
    "id, room, project, goal, orchestrator, spec, state, created_ms, updated_ms";
const RUN_COLS: &str = "collab, phase, run, task, state, reads, started_ms, ended_ms";
const APPROVAL_COLS: &str =
    "id, collab, phase, run, digest, input, state, created_ms, decided_ms, note";

/// A caller's limit as a `LIMIT` bound: PostgreSQL refuses a negative one where SQLite read
/// `usize::MAX as i64` (-1) as none, so it saturates instead.
fn lim(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn opt_u(v: Option<i64>, what: &str) -> Result<Option<u64>> {
    v.map(|v| u(v, what)).transpose()
}

/// A stored run number (the rows carry a `u32`; the column is a `bigint`).
fn run_no(v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("run {v} is not a run number")))
}

fn hold_from(r: &tokio_postgres::Row) -> Result<HoldRow> {
    Ok(HoldRow {
        id: r.get(0),
        room: r.get(1),
        kind: r.get(2),
        item: r.get(3),
        agent: r.get(4),
        task: r.get(5),
        cancel_seq: u(r.get(6), "cancel_seq")?,
        created_ms: u(r.get(7), "created_ms")?,
        resolved_seq: opt_u(r.get(8), "resolved_seq")?,
        resolved_ms: opt_u(r.get(9), "resolved_ms")?,
        resolved_by: r.get(10),
        outcome: r.get(11),
        evidence: r.get(12),
    })
}

fn collab_from(r: &tokio_postgres::Row) -> Result<CollabRow> {
    Ok(CollabRow {
        id: r.get(0),
        room: r.get(1),
        project: r.get(2),
        goal: r.get(3),
        orchestrator: r.get(4),
        spec: r.get(5),
        state: r.get(6),
        created_ms: u(r.get(7), "created_ms")?,
        updated_ms: u(r.get(8), "updated_ms")?,
    })
}

fn run_from(r: &tokio_postgres::Row) -> Result<CollabRunRow> {
    Ok(CollabRunRow {
        collab: r.get(0),
        phase: r.get(1),
        run: run_no(r.get(2))?,
        task: r.get(3),
        state: r.get(4),
        reads: r.get(5),
        started_ms: u(r.get(6), "started_ms")?,
        ended_ms: opt_u(r.get(7), "ended_ms")?,
    })
}

fn approval_from(r: &tokio_postgres::Row) -> Result<ApprovalRow> {
    Ok(ApprovalRow {
        id: r.get(0),
        collab: r.get(1),
        phase: r.get(2),
        run: run_no(r.get(3))?,
        digest: r.get(4),
        input: r.get(5),
        state: r.get(6),
        created_ms: u(r.get(7), "created_ms")?,
        decided_ms: opt_u(r.get(8), "decided_ms")?,
        note: r.get(9),
    })
}

/// What a cancel changes beyond the room row, owned so it can cross onto the runtime.
struct CancelOwned {
    at_ms: i64,
    why: String,
    held: Vec<room_core::event::Held>,
}

/// Kill the room's queued permits, and those dispatched to a launch whose worker has not
/// claimed them yet: both die with the cancel, never to be retried.
async fn kill_permits(
    tx: &deadpool_postgres::Transaction<'_>,
    room: &str,
    why: &str,
    at_ms: i64,
) -> Result<()> {
    tx.execute(
        &tx.prepare_cached(
            "UPDATE wakes SET state = 'dead', reason = 'room_cancelled', detail = $2,
            checked_ms = $3
         WHERE room = $1 AND (state = 'queued' OR (state = 'dispatched' AND EXISTS (
            SELECT 1 FROM launches l WHERE l.room = wakes.room
              AND l.agent = wakes.agent AND l.source_event = wakes.source_event
              AND l.state = 'starting')))",
        )
        .await
        .map_err(pg)?,
        &[&room, &why, &at_ms],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// Keep what the cancel held; a hold already kept (a replayed record) stays as it was.
async fn keep_holds(
    tx: &deadpool_postgres::Transaction<'_>,
    room: &str,
    seq: i64,
    e: &CancelOwned,
) -> Result<()> {
    for h in &e.held {
        tx.execute(
            &tx.prepare_cached("INSERT INTO holds (id, room, kind, item, agent, task, cancel_seq, created_ms, resolved_seq, resolved_ms, resolved_by, outcome, evidence)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, NULL, NULL, NULL, NULL)
             ON CONFLICT DO NOTHING").await.map_err(pg)?,
            &[&h.hold, &room, &h.kind, &h.item, &h.agent, &h.task, &seq, &e.at_ms],
        )
        .await
        .map_err(pg)?;
    }
    Ok(())
}

impl PgControl {
    pub(crate) fn set_cancelled_pg(
        &mut self,
        room: &str,
        seq: u64,
        cancel: Option<&CancelEffect<'_>>,
    ) -> Result<()> {
        let room = room.to_string();
        let seq = i(seq);
        let cancel = cancel.map(|e| CancelOwned {
            at_ms: i(e.at_ms),
            why: e.why.to_string(),
            held: e.held.to_vec(),
        });
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            // only a newer record moves the generation: a replay changes nothing
            let n = tx
                .execute(
                    &tx.prepare_cached(
                        "UPDATE rooms SET cancel_gen = $2, cancelled = $3, revision = revision + 1
                     WHERE name = $1 AND cancel_gen < $2",
                    )
                    .await
                    .map_err(pg)?,
                    &[&room, &seq, &cancel.is_some()],
                )
                .await
                .map_err(pg)?;
            if n == 1
                && let Some(e) = &cancel
            {
                kill_permits(&tx, &room, &e.why, e.at_ms).await?;
                keep_holds(&tx, &room, seq, e).await?;
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(())
        })
    }

    pub(crate) fn holds_pg(&self, room: &str, limit: usize) -> Result<Vec<HoldRow>> {
        let room = room.to_string();
        let limit = lim(limit.min(HOLDS_PAGE_MAX));
        self.call(move |c| async move {
            c.query(
                &format!(
                    "SELECT {HOLD_COLS} FROM holds WHERE room = $1 ORDER BY created_ms, id LIMIT $2"
                ),
                &[&room, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(hold_from)
            .collect()
        })
    }

    pub(crate) fn hold_pg(&self, id: &str) -> Result<Option<HoldRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {HOLD_COLS} FROM holds WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| hold_from(&r))
            .transpose()
        })
    }

    pub(crate) fn resolve_hold_pg(&mut self, id: &str, r: &HoldResolution<'_>) -> Result<bool> {
        let p = vec![
            boxed(id.to_string()),
            boxed(i(r.seq)),
            boxed(i(r.at_ms)),
            boxed(r.by.to_string()),
            boxed(r.outcome.to_string()),
            boxed(r.evidence.to_string()),
        ];
        // resolved once: a replayed resolution finds it resolved and changes nothing
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE holds SET resolved_seq = $2, resolved_ms = $3, resolved_by = $4,
                    outcome = $5, evidence = $6
                 WHERE id = $1 AND resolved_seq IS NULL",
                p,
            )
        })?;
        Ok(n == 1)
    }

    pub(crate) fn insert_collab_pg(&mut self, c: &CollabRow) -> Result<()> {
        let p = vec![
            boxed(c.id.clone()),
            boxed(c.room.clone()),
            boxed(c.project.clone()),
            boxed(c.goal.clone()),
            boxed(c.orchestrator.clone()),
            boxed(c.spec.clone()),
            boxed(c.state.clone()),
            boxed(i(c.created_ms)),
            boxed(i(c.updated_ms)),
        ];
        // no ON CONFLICT: an id already taken must fail, as the trait promises
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO collabs (id, room, project, goal, orchestrator, spec, state, created_ms, updated_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                p,
            )
        })?;
        Ok(())
    }

    pub(crate) fn insert_composition_pg(&mut self, g: &CompositionRow) -> Result<()> {
        let p = vec![
            boxed(g.id.clone()),
            boxed(g.agent.clone()),
            boxed(serde_json::to_string(&g.rooms).expect("a list of names serializes")),
            boxed(g.project.clone()),
            boxed(i(g.created_ms)),
            boxed(g.revoked_ms.map(i)),
        ];
        // no ON CONFLICT: an id already taken must fail, as the trait promises
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO compositions (id, agent, rooms, project, created_ms, revoked_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                p,
            )
        })?;
        Ok(())
    }

    pub(crate) fn composition_pg(&self, id: &str) -> Result<Option<CompositionRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {COMPOSITION_COLS} FROM compositions WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| composition_from(&r))
            .transpose()
        })
    }

    pub(crate) fn revoke_composition_pg(&mut self, id: &str, now_ms: u64) -> Result<bool> {
        let p = vec![boxed(id.to_string()), boxed(i(now_ms))];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE compositions SET revoked_ms = $2 WHERE id = $1 AND revoked_ms IS NULL",
                p,
            )
        })?;
        Ok(n == 1)
    }

    pub(crate) fn compositions_pg(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<CompositionRow>> {
        let agent = agent.map(str::to_string);
        let limit = lim(limit.min(room_store::control::COMPOSITIONS_PAGE_MAX));
        self.call(move |c| async move {
            c.query(
                &format!(
                    "SELECT {COMPOSITION_COLS} FROM compositions WHERE $1::text IS NULL OR agent = $1
                     ORDER BY id LIMIT $2"
                ),
                &[&agent, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(composition_from)
            .collect()
        })
    }

    pub(crate) fn active_compositions_pg(&self, agent: &str) -> Result<Vec<CompositionRow>> {
        let agent = agent.to_string();
        let limit = lim(room_store::control::COMPOSITIONS_PAGE_MAX);
        self.call(move |c| async move {
            c.query(
                &format!(
                    "SELECT {COMPOSITION_COLS} FROM compositions WHERE agent = $1 AND revoked_ms IS NULL
                     ORDER BY id LIMIT $2"
                ),
                &[&agent, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(composition_from)
            .collect()
        })
    }

    pub(crate) fn collab_pg(&self, id: &str) -> Result<Option<CollabRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {COLLAB_COLS} FROM collabs WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| collab_from(&r))
            .transpose()
        })
    }

    pub(crate) fn collabs_pg(&self, state: Option<&str>, limit: usize) -> Result<Vec<CollabRow>> {
        let state = state.map(str::to_string);
        let limit = lim(limit);
        self.call(move |c| async move {
            // the cast types $1 for `IS NULL`, which alone gives PostgreSQL nothing to infer
            c.query(
                &format!(
                    "SELECT {COLLAB_COLS} FROM collabs WHERE $1::text IS NULL OR state = $1
                     ORDER BY id LIMIT $2"
                ),
                &[&state, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(collab_from)
            .collect()
        })
    }

    pub(crate) fn set_collab_state_pg(
        &mut self,
        id: &str,
        from: &str,
        to: &str,
        now_ms: u64,
    ) -> Result<bool> {
        let p = vec![
            boxed(id.to_string()),
            boxed(from.to_string()),
            boxed(to.to_string()),
            boxed(i(now_ms)),
        ];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE collabs SET state = $3, updated_ms = $4 WHERE id = $1 AND state = $2",
                p,
            )
        })?;
        Ok(n == 1)
    }

    pub(crate) fn put_collab_run_pg(&mut self, r: &CollabRunRow) -> Result<()> {
        let p = vec![
            boxed(r.collab.clone()),
            boxed(r.phase.clone()),
            boxed(i64::from(r.run)),
            boxed(r.task.clone()),
            boxed(r.state.clone()),
            boxed(r.reads.clone()),
            boxed(i(r.started_ms)),
            boxed(r.ended_ms.map(i)),
        ];
        // a run recorded again has moved on: every column is replaced, as SQLite's
        // INSERT OR REPLACE does
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO collab_runs (collab, phase, run, task, state, reads, started_ms, ended_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (collab, phase, run) DO UPDATE SET task = EXCLUDED.task,
                    state = EXCLUDED.state, reads = EXCLUDED.reads,
                    started_ms = EXCLUDED.started_ms, ended_ms = EXCLUDED.ended_ms",
                p,
            )
        })?;
        Ok(())
    }

    pub(crate) fn collab_runs_pg(&self, collab: &str, limit: usize) -> Result<Vec<CollabRunRow>> {
        let collab = collab.to_string();
        let limit = lim(limit);
        self.call(move |c| async move {
            c.query(
                &format!(
                    "SELECT {RUN_COLS} FROM collab_runs WHERE collab = $1 ORDER BY phase, run LIMIT $2"
                ),
                &[&collab, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(run_from)
            .collect()
        })
    }

    pub(crate) fn insert_approval_pg(&mut self, a: &ApprovalRow) -> Result<()> {
        let p = vec![
            boxed(a.id.clone()),
            boxed(a.collab.clone()),
            boxed(a.phase.clone()),
            boxed(i64::from(a.run)),
            boxed(a.digest.clone()),
            boxed(a.input.clone()),
            boxed(a.state.clone()),
            boxed(i(a.created_ms)),
            boxed(a.decided_ms.map(i)),
            boxed(a.note.clone()),
        ];
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO collab_approvals (id, collab, phase, run, digest, input, state, created_ms, decided_ms, note)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                p,
            )
        })?;
        Ok(())
    }

    pub(crate) fn approval_pg(&self, id: &str) -> Result<Option<ApprovalRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {APPROVAL_COLS} FROM collab_approvals WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| approval_from(&r))
            .transpose()
        })
    }

    pub(crate) fn approvals_pg(&self, collab: &str, limit: usize) -> Result<Vec<ApprovalRow>> {
        let collab = collab.to_string();
        let limit = lim(limit);
        self.call(move |c| async move {
            c.query(
                &format!(
                    "SELECT {APPROVAL_COLS} FROM collab_approvals WHERE collab = $1
                     ORDER BY created_ms, id LIMIT $2"
                ),
                &[&collab, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(approval_from)
            .collect()
        })
    }

    pub(crate) fn decide_approval_pg(
        &mut self,
        id: &str,
        digest: &str,
        to: &str,
        now_ms: u64,
        note: Option<&str>,
    ) -> Result<bool> {
        let p = vec![
            boxed(id.to_string()),
            boxed(digest.to_string()),
            boxed(to.to_string()),
            boxed(i(now_ms)),
            boxed(note.map(str::to_string)),
        ];
        // compare-and-set: a decision counts only on the digest the person was shown and
        // only while the request is still pending
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE collab_approvals SET state = $3, decided_ms = $4, note = $5
                 WHERE id = $1 AND digest = $2 AND state = 'pending'",
                p,
            )
        })?;
        Ok(n == 1)
    }
}
