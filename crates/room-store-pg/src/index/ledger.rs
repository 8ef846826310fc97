//! The destination ledger, evidence handles and the blackboard's index on PostgreSQL: the
//! `ops`, `evidence` and `artifacts` tables, keyed by the room's graph id. They are pure
//! projections of the journal (a rebuild empties and refills them), so a replayed batch must
//! land exactly where the live one did: first writes stay, state only moves forward.

use crate::pg;
use deadpool_postgres::Transaction;
use room_store::index::{ArtifactRow, Batch, EvidenceRow, OpChange, OpRow};
use room_store::{Result, StoreError};

use super::{i, lim, u};

/// The ledger's tables, one step of the schema (`super::schema`).
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE ops (
    graph_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    agent text COLLATE "C" NOT NULL,
    task text COLLATE "C" NOT NULL,
    destination text COLLATE "C",
    parent text COLLATE "C",
    state text COLLATE "C" NOT NULL,
    outcome text COLLATE "C",
    probe text COLLATE "C",
    began_seq bigint NOT NULL,
    began_ms bigint NOT NULL,
    ttl_ms bigint NOT NULL,
    lapsed boolean NOT NULL,
    PRIMARY KEY (graph_id, id)
);
CREATE INDEX ops_task ON ops (graph_id, task, began_seq);
CREATE INDEX ops_unresolved ON ops (graph_id, began_seq) WHERE state <> 'resolved';
CREATE TABLE evidence (
    graph_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    agent text COLLATE "C" NOT NULL,
    task text COLLATE "C",
    req text COLLATE "C",
    origin text COLLATE "C",
    lineage text COLLATE "C" NOT NULL,
    event text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    sha256 text COLLATE "C",
    PRIMARY KEY (graph_id, id)
);
CREATE INDEX evidence_task_req ON evidence (graph_id, task, req, seq) WHERE task IS NOT NULL;
CREATE INDEX evidence_task ON evidence (graph_id, task, seq) WHERE task IS NOT NULL;
CREATE TABLE artifacts (
    graph_id text COLLATE "C" NOT NULL,
    kind text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    sha256 text COLLATE "C" NOT NULL,
    bytes bigint NOT NULL,
    producer text COLLATE "C" NOT NULL,
    parents text COLLATE "C" NOT NULL,
    event text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    hlc_ms bigint NOT NULL,
    audience text COLLATE "C" NOT NULL,
    task text COLLATE "C",
    PRIMARY KEY (graph_id, kind, key, version)
);
CREATE INDEX artifacts_task ON artifacts (graph_id, task, kind, key, version) WHERE task IS NOT NULL;
"#;

const OP_COLS: &str = "id, agent, task, destination, parent, state, outcome, probe, began_seq, began_ms, ttl_ms, lapsed";

const EVIDENCE_COLS: &str = "id, agent, task, req, origin, lineage, event, seq, sha256";

const ARTIFACT_COLS: &str =
    "kind, key, version, sha256, bytes, producer, parents, event, seq, hlc_ms, audience, task";

/// Project a batch's artifacts, evidence and operations, in that order (SQLite's).
pub(crate) async fn apply(tx: &Transaction<'_>, graph: &str, b: &Batch) -> Result<()> {
    for a in &b.artifacts {
        put_artifact(tx, graph, a).await?;
    }
    for e in &b.evidence {
        put_evidence(tx, graph, e).await?;
    }
    for c in &b.ops {
        apply_op(tx, graph, c).await?;
    }
    Ok(())
}

/// Empty this room's ledger tables for a rebuild from the journal.
pub(crate) async fn clear(tx: &Transaction<'_>, graph: &str) -> Result<()> {
    for sql in [
        "DELETE FROM ops WHERE graph_id = $1",
        "DELETE FROM evidence WHERE graph_id = $1",
        "DELETE FROM artifacts WHERE graph_id = $1",
    ] {
        tx.execute(sql, &[&graph]).await.map_err(pg)?;
    }
    Ok(())
}

/// A replay projects the same version again, perhaps with other bytes: the first stays.
async fn put_artifact(tx: &Transaction<'_>, graph: &str, a: &ArtifactRow) -> Result<()> {
    let st = tx
        .prepare_cached(&format!(
            "INSERT INTO artifacts (graph_id, {ARTIFACT_COLS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
             ON CONFLICT DO NOTHING"
        ))
        .await
        .map_err(pg)?;
    let parents = serde_json::to_string(&a.parents).expect("parents serialize");
    let audience = serde_json::to_string(&a.audience).expect("audience serializes");
    let (version, bytes, seq, hlc_ms) = (i64::from(a.version), i(a.bytes), i(a.seq), i(a.hlc_ms));
    tx.execute(
        &st,
        &[
            &graph,
            &a.kind,
            &a.key,
            &version,
            &a.sha256,
            &bytes,
            &a.producer,
            &parents,
            &a.event,
            &seq,
            &hlc_ms,
            &audience,
            &a.task,
        ],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// A registration seen again (a replay) keeps the row first projected.
async fn put_evidence(tx: &Transaction<'_>, graph: &str, e: &EvidenceRow) -> Result<()> {
    let st = tx
        .prepare_cached(&format!(
            "INSERT INTO evidence (graph_id, {EVIDENCE_COLS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT DO NOTHING"
        ))
        .await
        .map_err(pg)?;
    let lineage = serde_json::to_string(&e.lineage).expect("lineage serializes");
    let seq = i(e.seq);
    tx.execute(
        &st,
        &[
            &graph, &e.id, &e.agent, &e.task, &e.req, &e.origin, &lineage, &e.event, &seq,
            &e.sha256,
        ],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// Begin -> Effect -> Resolve, each guarded so a replayed or late change never moves an
/// operation backwards; a lapse is recorded whatever the state (`status` reads it).
async fn apply_op(tx: &Transaction<'_>, graph: &str, c: &OpChange) -> Result<()> {
    match c {
        OpChange::Begin(o) => {
            let st = tx
                .prepare_cached(
                    "INSERT INTO ops (graph_id, id, agent, task, destination, parent, state, outcome, probe, began_seq, began_ms, ttl_ms, lapsed)
                     VALUES ($1, $2, $3, $4, $5, $6, 'begun', NULL, $7, $8, $9, $10, false)
                     ON CONFLICT DO NOTHING",
                )
                .await
                .map_err(pg)?;
            let (seq, ms, ttl) = (i(o.began_seq), i(o.began_ms), i(o.ttl_ms));
            tx.execute(
                &st,
                &[
                    &graph,
                    &o.id,
                    &o.agent,
                    &o.task,
                    &o.destination,
                    &o.parent,
                    &o.probe,
                    &seq,
                    &ms,
                    &ttl,
                ],
            )
            .await
            .map_err(pg)?;
        }
        OpChange::Effect { id } => {
            let st = tx
                .prepare_cached(
                    "UPDATE ops SET state = 'effected' WHERE graph_id = $1 AND id = $2 AND state = 'begun'",
                )
                .await
                .map_err(pg)?;
            tx.execute(&st, &[&graph, id]).await.map_err(pg)?;
        }
        OpChange::Resolve { id, outcome } => {
            let st = tx
                .prepare_cached(
                    "UPDATE ops SET state = 'resolved', outcome = $3
                     WHERE graph_id = $1 AND id = $2 AND state <> 'resolved'",
                )
                .await
                .map_err(pg)?;
            tx.execute(&st, &[&graph, id, outcome]).await.map_err(pg)?;
        }
        OpChange::Lapsed { id } => {
            let st = tx
                .prepare_cached("UPDATE ops SET lapsed = true WHERE graph_id = $1 AND id = $2")
                .await
                .map_err(pg)?;
            tx.execute(&st, &[&graph, id]).await.map_err(pg)?;
        }
    }
    Ok(())
}

// SQLite breaks ties of the orderings below by insertion (rowid); PostgreSQL keeps no such
// order, so the id (or key) breaks them here. One event registers at most one evidence row
// or operation, so ties do not arise from the journal.
impl super::PgIndex {
    pub(crate) fn op_pg(&self, id: &str) -> Result<Option<OpRow>> {
        let id = id.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {OP_COLS} FROM ops WHERE graph_id = $1 AND id = $2"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &id])
                .await
                .map_err(pg)?
                .map(|r| op_from(&r))
                .transpose()
        })
    }

    pub(crate) fn ops_of_task_pg(&self, task: &str, limit: usize) -> Result<Vec<OpRow>> {
        let task = task.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {OP_COLS} FROM ops WHERE graph_id = $1 AND task = $2
                     ORDER BY began_seq, id LIMIT $3"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &task, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(op_from)
                .collect()
        })
    }

    pub(crate) fn ops_unresolved_pg(&self, limit: usize) -> Result<Vec<OpRow>> {
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {OP_COLS} FROM ops WHERE graph_id = $1 AND state <> 'resolved'
                     ORDER BY began_seq, id LIMIT $2"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(op_from)
                .collect()
        })
    }

    /// `resolution` for operations: unresolved past their TTL, not yet recorded in doubt.
    pub(crate) fn lapsed_ops_pg(&self, now_ms: u64, limit: usize) -> Result<Vec<OpRow>> {
        let now = i(now_ms);
        self.call(move |c, g| async move {
            // `began_ms + ttl_ms <= now` rearranged: both sides stay non-negative bigints,
            // so no TTL overflows the sum (SQLite would turn it into a float; PostgreSQL errs)
            let st = c
                .prepare_cached(&format!(
                    "SELECT {OP_COLS} FROM ops
                     WHERE graph_id = $1 AND state <> 'resolved' AND NOT lapsed
                       AND began_ms <= $2::bigint - ttl_ms
                     ORDER BY began_seq, id LIMIT $3"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &now, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(op_from)
                .collect()
        })
    }

    pub(crate) fn evidence_pg(&self, id: &str) -> Result<Option<EvidenceRow>> {
        let id = id.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {EVIDENCE_COLS} FROM evidence WHERE graph_id = $1 AND id = $2"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &id])
                .await
                .map_err(pg)?
                .map(|r| evidence_from(&r))
                .transpose()
        })
    }

    pub(crate) fn evidence_for_pg(
        &self,
        task: &str,
        req: &str,
        limit: usize,
    ) -> Result<Vec<EvidenceRow>> {
        let (task, req) = (task.to_string(), req.to_string());
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {EVIDENCE_COLS} FROM evidence
                     WHERE graph_id = $1 AND task = $2 AND req = $3
                     ORDER BY seq, id LIMIT $4"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &task, &req, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(evidence_from)
                .collect()
        })
    }

    pub(crate) fn evidence_of_task_pg(&self, task: &str, limit: usize) -> Result<Vec<EvidenceRow>> {
        let task = task.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {EVIDENCE_COLS} FROM evidence WHERE graph_id = $1 AND task = $2
                     ORDER BY seq, id LIMIT $3"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &task, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(evidence_from)
                .collect()
        })
    }

    /// The given version of an artifact, or its newest when `version` is `None`.
    pub(crate) fn artifact_pg(
        &self,
        kind: &str,
        key: &str,
        version: Option<u32>,
    ) -> Result<Option<ArtifactRow>> {
        let (kind, key, version) = (kind.to_string(), key.to_string(), version.map(i64::from));
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts
                     WHERE graph_id = $1 AND kind = $2 AND key = $3
                       AND ($4::bigint IS NULL OR version = $4::bigint)
                     ORDER BY version DESC LIMIT 1"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &kind, &key, &version])
                .await
                .map_err(pg)?
                .map(|r| artifact_from(&r))
                .transpose()
        })
    }

    /// Each artifact's newest version, by (kind, key) in byte order after `after` (from the
    /// start when `None`, as SQLite's `('', '')` cursor).
    pub(crate) fn artifact_heads_pg(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ArtifactRow>> {
        let (kind, key) = after.unwrap_or(("", ""));
        let (kind, key) = (kind.to_string(), key.to_string());
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts a
                     WHERE a.graph_id = $1
                       AND (a.kind, a.key) > ($2::text COLLATE \"C\", $3::text COLLATE \"C\")
                       AND a.version = (SELECT MAX(b.version) FROM artifacts b
                                        WHERE b.graph_id = a.graph_id AND b.kind = a.kind AND b.key = a.key)
                     ORDER BY a.kind, a.key LIMIT $4"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &kind, &key, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(artifact_from)
                .collect()
        })
    }

    /// The newest version of an artifact written for `task`.
    pub(crate) fn artifact_of_task_pg(
        &self,
        task: &str,
        kind: &str,
        key: &str,
    ) -> Result<Option<ArtifactRow>> {
        let (task, kind, key) = (task.to_string(), kind.to_string(), key.to_string());
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts
                     WHERE graph_id = $1 AND task = $2 AND kind = $3 AND key = $4
                     ORDER BY version DESC LIMIT 1"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &task, &kind, &key])
                .await
                .map_err(pg)?
                .map(|r| artifact_from(&r))
                .transpose()
        })
    }

    /// Distinct (kind, key) pairs on the blackboard.
    pub(crate) fn artifact_keys_pg(&self) -> Result<u64> {
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(
                    "SELECT COUNT(*) FROM (SELECT DISTINCT kind, key FROM artifacts WHERE graph_id = $1) k",
                )
                .await
                .map_err(pg)?;
            let n: i64 = c.query_one(&st, &[&g]).await.map_err(pg)?.get(0);
            u(n, "artifact keys")
        })
    }
}

fn op_from(r: &tokio_postgres::Row) -> Result<OpRow> {
    Ok(OpRow {
        id: r.get(0),
        agent: r.get(1),
        task: r.get(2),
        destination: r.get(3),
        parent: r.get(4),
        state: r.get(5),
        outcome: r.get(6),
        probe: r.get(7),
        began_seq: u(r.get(8), "op began_seq")?,
        began_ms: u(r.get(9), "op began_ms")?,
        ttl_ms: u(r.get(10), "op ttl_ms")?,
        lapsed: r.get(11),
    })
}

fn evidence_from(r: &tokio_postgres::Row) -> Result<EvidenceRow> {
    let id: String = r.get(0);
    Ok(EvidenceRow {
        agent: r.get(1),
        task: r.get(2),
        req: r.get(3),
        origin: r.get(4),
        lineage: json_list(r.get(5), || format!("evidence {id}: lineage"))?,
        event: r.get(6),
        seq: u(r.get(7), "evidence seq")?,
        sha256: r.get(8),
        id,
    })
}

fn artifact_from(r: &tokio_postgres::Row) -> Result<ArtifactRow> {
    let (kind, key): (String, String) = (r.get(0), r.get(1));
    let v: i64 = r.get(2);
    let version = u32::try_from(v).map_err(|_| {
        StoreError::Corrupt(format!("artifact {kind}/{key}: version {v} is not a u32"))
    })?;
    Ok(ArtifactRow {
        version,
        sha256: r.get(3),
        bytes: u(r.get(4), "artifact bytes")?,
        producer: r.get(5),
        parents: json_list(r.get(6), || {
            format!("artifact {kind}/{key} v{version}: parents")
        })?,
        event: r.get(7),
        seq: u(r.get(8), "artifact seq")?,
        hlc_ms: u(r.get(9), "artifact hlc_ms")?,
        audience: json_list(r.get(10), || {
            format!("artifact {kind}/{key} v{version}: audience")
        })?,
        task: r.get(11),
        kind,
        key,
    })
}

/// A list stored as JSON text (as SQLite stores it); `what` names it only if it is not one.
fn json_list(text: String, what: impl FnOnce() -> String) -> Result<Vec<String>> {
    serde_json::from_str(&text)
        .map_err(|e| StoreError::Corrupt(format!("{} {text:?}: {e}", what())))
}
