//! A room's sync index on PostgreSQL (issue 44): the projection of its journal (events and
//! their causal edges, mentions and obligations, checkpoints and receipts, the registries the
//! invariants read, the blackboard and the destination ledger) and the marks that say how far
//! it has caught up. Every room's rows share the tables, keyed by the room's graph id.
//!
//! The index trails the journal, which re-creates it: a projected batch commits at once with
//! `synchronous_commit = off` (visible to every reader, durable within the server's WAL
//! flush), the batch's journal mark in the same transaction, so a server crash loses at most
//! the newest batches and the next open catches up from the mark. `flush` is a synchronous
//! commit, which makes every earlier one durable. What a reader recovers rather than the
//! journal re-creating (trust, marks moved on their own, receipts, checkpoints) commits
//! synchronously.
//!
//! The parts: `events` (events, edges, search, vectors, source reads, idempotency),
//! `items` (mentions, obligations, checkpoints, receipts, lifecycles), `ledger` (ops,
//! evidence, artifacts). Each owns its tables (`SCHEMA`), projects its share of a batch
//! (`apply`) and empties its share for a rebuild (`clear`).

pub(crate) mod events;
pub(crate) mod items;
pub(crate) mod ledger;

use crate::{pg, run_on};
use deadpool_postgres::{Object, Pool, Transaction};
use room_store::backend::{ChangeStamp, RoomIndex};
use room_store::index::{
    ArtifactRow, Batch, CheckpointRow, EventHead, EventRow, EvidenceRow, IndexWitnesses, ItemKind,
    ItemRow, LifecycleRow, LogTrust, OpRow, ReceiptRow,
};
use room_store::journal::JournalMark;
use room_store::{Result, StoreError};
use std::future::Future;
use std::sync::Arc;

/// The index's own table: per room, its marks, trust and write count.
pub(crate) const META_SCHEMA: &str = r#"
CREATE TABLE index_meta (
    graph_id text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value text COLLATE "C" NOT NULL,
    PRIMARY KEY (graph_id, key)
);
CREATE SEQUENCE index_writes;
"#;

/// One room's sync index.
pub struct PgIndex {
    rt: Arc<crate::Rt>,
    pool: Pool,
    serving: Arc<crate::serving::Serving>,
    graph: String,
    /// Writes attempted through this handle (the change stamp's local part).
    writes: u64,
}

/// Count a write of an index in the database (another daemon's change stamp reads it): one
/// sequence for every room's index, which no writer waits on (a room's stamp may move for
/// another room's write: it says only that the index may have changed).
pub(crate) async fn bump(tx: &Transaction<'_>, _graph: &str) -> Result<()> {
    tx.execute(
        &tx.prepare_cached("SELECT nextval('index_writes')")
            .await
            .map_err(pg)?,
        &[],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// A stored integer that must not be negative.
pub(crate) fn u(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} is negative")))
}

pub(crate) fn i(v: u64) -> i64 {
    i64::try_from(v).expect("stored values stay below 2^63")
}

/// A caller's limit as a `LIMIT` bound (PostgreSQL refuses a negative one).
pub(crate) fn lim(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

async fn meta_get(c: &Object, graph: &str, key: &str) -> Result<Option<String>> {
    Ok(c.query_opt(
        &c.prepare_cached("SELECT value FROM index_meta WHERE graph_id = $1 AND key = $2")
            .await
            .map_err(pg)?,
        &[&graph, &key],
    )
    .await
    .map_err(pg)?
    .map(|r| r.get(0)))
}

async fn meta_put(tx: &Transaction<'_>, graph: &str, key: &str, value: &str) -> Result<()> {
    tx.execute(
        &tx.prepare_cached(
            "INSERT INTO index_meta (graph_id, key, value) VALUES ($1, $2, $3)
         ON CONFLICT (graph_id, key) DO UPDATE SET value = excluded.value",
        )
        .await
        .map_err(pg)?,
        &[&graph, &key, &value],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

impl PgIndex {
    pub(crate) fn new(
        rt: Arc<crate::Rt>,
        pool: Pool,
        serving: Arc<crate::serving::Serving>,
        graph: &str,
    ) -> PgIndex {
        PgIndex {
            rt,
            pool,
            serving,
            graph: graph.to_string(),
            writes: 0,
        }
    }

    /// `f` with a connection and this room's graph id, on the backend's runtime, waited for
    /// here.
    pub(crate) fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Object, String) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (pool, graph) = (self.pool.clone(), self.graph.clone());
        run_on(&self.rt, async move {
            let c = pool.get().await.map_err(pg)?;
            f(c, graph).await
        })
    }

    /// A write: `call`, counted for the change stamp whether or not it succeeds. The write's
    /// transaction calls `bump` once before it commits.
    pub(crate) fn write<T, F, Fut>(&mut self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Object, String) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        self.writes += 1;
        // a daemon that lost its hold on the database (or was fenced) writes nothing
        self.serving.check()?;
        self.call(f)
    }

    fn meta<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        key: &'static str,
    ) -> Result<Option<T>> {
        self.call(move |c, g| async move {
            meta_get(&c, &g, key)
                .await?
                .map(|v| {
                    serde_json::from_str(&v)
                        .map_err(|e| StoreError::Corrupt(format!("index {g}: {key} {v:?}: {e}")))
                })
                .transpose()
        })
    }

    fn set_meta(&mut self, key: &'static str, value: String) -> Result<()> {
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            meta_put(&tx, &g, key, &value).await?;
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }
}

impl RoomIndex for PgIndex {
    fn change_stamp(&self) -> Result<ChangeStamp> {
        let external = self.call(|c, _| async move {
            let v: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT last_value FROM index_writes")
                        .await
                        .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(v, "index_writes")
        })?;
        Ok(ChangeStamp {
            external,
            local: self.writes,
        })
    }

    fn wakes_mark(&self) -> Result<u64> {
        Ok(self.meta::<u64>("wakes_mark")?.unwrap_or(0))
    }

    fn set_wakes_mark(&mut self, seq: u64) -> Result<()> {
        self.set_meta("wakes_mark", seq.to_string())
    }

    fn mark(&self) -> Result<Option<JournalMark>> {
        self.meta("journal_mark")
    }

    fn trust(&self) -> Result<LogTrust> {
        Ok(self.meta("log_trust")?.unwrap_or_default())
    }

    fn set_trust(&mut self, t: &LogTrust) -> Result<()> {
        self.set_meta(
            "log_trust",
            serde_json::to_string(t).expect("log trust serializes"),
        )
    }

    /// A synchronous commit: every batch committed before it is durable once it returns.
    fn flush(&mut self) -> Result<()> {
        self.write(|mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    /// Nothing is pending here (a batch commits when it is applied): a server crash decides
    /// what of the newest batches survives, and the next open catches up from the mark.
    fn discard_pending(&mut self) {}

    fn broken(&self) -> Option<&str> {
        None
    }

    fn apply(&mut self, b: &Batch) -> Result<()> {
        self.apply_deferred(b)?;
        self.flush()
    }

    /// Project a batch and move the journal mark in one transaction, committed without
    /// waiting for the WAL's flush (the journal re-creates what a crash takes).
    fn apply_deferred(&mut self, b: &Batch) -> Result<()> {
        let b = b.clone();
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(pg)?;
            events::apply(&tx, &g, &b).await?;
            items::apply(&tx, &g, &b).await?;
            ledger::apply(&tx, &g, &b).await?;
            if let Some(m) = &b.mark {
                let v = serde_json::to_string(m).expect("a journal mark serializes");
                meta_put(&tx, &g, "journal_mark", &v).await?;
            }
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    /// Empty the projection for a rebuild from the journal, marks included, synchronously
    /// (the owner is told the rebuild began from nothing: that must survive a crash).
    fn clear_projection(&mut self) -> Result<()> {
        self.write(|mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            ledger::clear(&tx, &g).await?;
            items::clear(&tx, &g).await?;
            events::clear(&tx, &g).await?;
            tx.execute(
                &tx.prepare_cached("DELETE FROM index_meta WHERE graph_id = $1 AND key IN ('journal_mark', 'wakes_mark')").await.map_err(pg)?,
                &[&g],
            )
            .await
            .map_err(pg)?;
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    fn items_after(&self, seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        self.items_after_pg(seq, limit)
    }

    fn witnesses(&self, upto: u64) -> Result<IndexWitnesses> {
        self.witnesses_pg(upto)
    }

    fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, u64, Option<String>)>> {
        self.idempotent_pg(actor, key)
    }

    fn idempotency_keys(&self) -> Result<u64> {
        self.idempotency_keys_pg()
    }

    fn lifecycle(&self, agent: &str, task: &str) -> Result<Option<LifecycleRow>> {
        self.lifecycle_pg(agent, task)
    }

    fn lapsed_begins(&self, now_ms: u64, limit: usize) -> Result<Vec<LifecycleRow>> {
        self.lapsed_begins_pg(now_ms, limit)
    }

    fn op(&self, id: &str) -> Result<Option<OpRow>> {
        self.op_pg(id)
    }

    fn evidence(&self, id: &str) -> Result<Option<EvidenceRow>> {
        self.evidence_pg(id)
    }

    fn evidence_for(&self, task: &str, req: &str, limit: usize) -> Result<Vec<EvidenceRow>> {
        self.evidence_for_pg(task, req, limit)
    }

    fn evidence_of_task(&self, task: &str, limit: usize) -> Result<Vec<EvidenceRow>> {
        self.evidence_of_task_pg(task, limit)
    }

    fn artifact(&self, kind: &str, key: &str, version: Option<u32>) -> Result<Option<ArtifactRow>> {
        self.artifact_pg(kind, key, version)
    }

    fn artifact_heads(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ArtifactRow>> {
        self.artifact_heads_pg(after, limit)
    }

    fn artifact_of_task(&self, task: &str, kind: &str, key: &str) -> Result<Option<ArtifactRow>> {
        self.artifact_of_task_pg(task, kind, key)
    }

    fn search(&self, query: &str, offset: usize, limit: usize) -> Result<Vec<(u64, f64)>> {
        self.search_pg(query, offset, limit)
    }

    fn embedding_todo(
        &self,
        model: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String, String)>> {
        self.embedding_todo_pg(model, after, limit)
    }

    fn put_embeddings(&mut self, model: &str, rows: &[(u64, String, Vec<i8>)]) -> Result<()> {
        self.put_embeddings_pg(model, rows)
    }

    fn embeddings(&self, model: &str, before: u64, limit: usize) -> Result<Vec<(u64, Vec<i8>)>> {
        self.embeddings_pg(model, before, limit)
    }

    fn embedding_counts(&self, model: &str) -> Result<(u64, u64)> {
        self.embedding_counts_pg(model)
    }

    fn artifact_keys(&self) -> Result<u64> {
        self.artifact_keys_pg()
    }

    fn ops_of_task(&self, task: &str, limit: usize) -> Result<Vec<OpRow>> {
        self.ops_of_task_pg(task, limit)
    }

    fn lapsed_ops(&self, now_ms: u64, limit: usize) -> Result<Vec<OpRow>> {
        self.lapsed_ops_pg(now_ms, limit)
    }

    fn ops_unresolved(&self, limit: usize) -> Result<Vec<OpRow>> {
        self.ops_unresolved_pg(limit)
    }

    fn event_by_seq(&self, seq: u64) -> Result<Option<EventRow>> {
        self.event_by_seq_pg(seq)
    }

    fn event_by_id(&self, id: &str) -> Result<Option<EventRow>> {
        self.event_by_id_pg(id)
    }

    fn events_from(&self, from: u64, limit: usize) -> Result<Vec<EventRow>> {
        self.events_from_pg(from, limit)
    }

    fn event_heads_from(&self, from: u64, limit: usize) -> Result<Vec<EventHead>> {
        self.event_heads_from_pg(from, limit)
    }

    fn first_foreign_after(&self, seq: u64, actor: &str) -> Result<Option<u64>> {
        self.first_foreign_after_pg(seq, actor)
    }

    fn event_count(&self) -> Result<u64> {
        self.event_count_pg()
    }

    fn task_events(&self, task: &str, after_seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        self.task_events_pg(task, after_seq, limit)
    }

    fn task_records(&self, task: &str, after_seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        self.task_records_pg(task, after_seq, limit)
    }

    fn citing(&self, parent: &str, limit: usize) -> Result<Vec<EventRow>> {
        self.citing_pg(parent, limit)
    }

    fn checkpoints_of(&self, actor: &str, limit: usize) -> Result<Vec<CheckpointRow>> {
        self.checkpoints_of_pg(actor, limit)
    }

    fn open_items_page(&self, agent: &str, limit: usize) -> Result<(Vec<ItemRow>, u64)> {
        self.open_items_page_pg(agent, limit)
    }

    fn open_sources(&self, agent: &str, limit: usize) -> Result<Vec<String>> {
        self.open_sources_pg(agent, limit)
    }

    fn open_obligations(&self, limit: usize) -> Result<Vec<ItemRow>> {
        self.open_obligations_pg(limit)
    }

    fn open_items_for_task(&self, agent: &str, task: &str) -> Result<Vec<ItemRow>> {
        self.open_items_for_task_pg(agent, task)
    }

    fn put_source_read(&mut self, row: &room_store::index::SourceReadRow) -> Result<()> {
        self.put_source_read_pg(row)
    }

    fn source_reads(
        &self,
        agent: &str,
        conversation: &str,
        task: &str,
        path: &str,
        sha256: &str,
        since_ms: u64,
    ) -> Result<Vec<(u64, u64)>> {
        self.source_reads_pg(agent, conversation, task, path, sha256, since_ms)
    }

    fn open_items_of_task(&self, task: &str, limit: usize) -> Result<Vec<ItemRow>> {
        self.open_items_of_task_pg(task, limit)
    }

    fn item(&self, kind: ItemKind, id: &str) -> Result<Option<ItemRow>> {
        self.item_pg(kind, id)
    }

    fn items(&self, kind: ItemKind) -> Result<Vec<ItemRow>> {
        self.items_pg(kind)
    }

    fn checkpoint(&self, actor: &str, conversation: &str) -> Result<Option<CheckpointRow>> {
        self.checkpoint_pg(actor, conversation)
    }

    fn put_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.put_checkpoint_pg(c)
    }

    fn put_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.put_receipt_pg(r)
    }

    fn receipt(&self, id: &str) -> Result<Option<ReceiptRow>> {
        self.receipt_pg(id)
    }

    fn confirm(&mut self, receipt_id: &str, now_ms: u64, checkpoint: &CheckpointRow) -> Result<()> {
        self.confirm_pg(receipt_id, now_ms, checkpoint)
    }

    fn ancestors(&self, id: &str, depth_max: u32) -> Result<Vec<String>> {
        self.ancestors_pg(id, depth_max)
    }
}
