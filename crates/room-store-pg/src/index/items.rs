//! Mentions and obligations (with their open totals per addressee), checkpoints, receipts and
//! (agent, task) lifecycles on PostgreSQL, keyed by the room's graph id. Items, totals and
//! lifecycles are projections of the journal (a rebuild empties and refills them); receipts
//! and checkpoints only the index holds, so a rebuild keeps them.

use crate::pg;
use deadpool_postgres::{Object, Transaction};
use room_store::index::{
    Batch, CheckpointRow, FoldAdvance, ItemKind, ItemRow, LifecycleChange, LifecycleRow, ReceiptRow,
};
use room_store::{Result, StoreError};
use tokio_postgres::types::ToSql;

use super::{bump, i, lim, u};

/// This part's tables, one step of the schema (`super::schema`).
///
/// `open_counts` has no triggers: `apply` keeps it in the statement that opens or closes an
/// item (from the rows the insert or update returns), the only place an item's status changes.
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE mentions (
    graph_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    source text COLLATE "C" NOT NULL,
    source_seq bigint NOT NULL,
    agent text COLLATE "C" NOT NULL,
    from_agent text COLLATE "C" NOT NULL,
    task text COLLATE "C",
    status text COLLATE "C" NOT NULL,
    resolved_by text COLLATE "C",
    not_after_ms bigint,
    PRIMARY KEY (graph_id, id)
);
CREATE INDEX mentions_open ON mentions (graph_id, agent, status, source_seq);
CREATE INDEX mentions_task_open ON mentions (graph_id, task, agent, source_seq)
    WHERE status = 'open' AND task IS NOT NULL;
CREATE TABLE obligations (
    graph_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    source text COLLATE "C" NOT NULL,
    source_seq bigint NOT NULL,
    agent text COLLATE "C" NOT NULL,
    from_agent text COLLATE "C" NOT NULL,
    task text COLLATE "C",
    status text COLLATE "C" NOT NULL,
    resolved_by text COLLATE "C",
    not_after_ms bigint,
    PRIMARY KEY (graph_id, id)
);
CREATE INDEX obligations_open ON obligations (graph_id, agent, status, source_seq);
CREATE INDEX obligations_task_open ON obligations (graph_id, task, agent, source_seq)
    WHERE status = 'open' AND task IS NOT NULL;
CREATE INDEX obligations_open_all ON obligations (graph_id, source_seq) WHERE status = 'open';
CREATE TABLE open_counts (
    graph_id text COLLATE "C" NOT NULL,
    agent text COLLATE "C" NOT NULL,
    kind text COLLATE "C" NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (graph_id, agent, kind)
);
CREATE TABLE checkpoints (
    graph_id text COLLATE "C" NOT NULL,
    actor text COLLATE "C" NOT NULL,
    conversation text COLLATE "C" NOT NULL,
    conversation_key text COLLATE "C" NOT NULL,
    view_gen text COLLATE "C" NOT NULL,
    confirmed_seq bigint NOT NULL,
    chunk_seq bigint,
    chunk_offset bigint NOT NULL,
    updated_ms bigint NOT NULL,
    PRIMARY KEY (graph_id, actor, conversation)
);
CREATE TABLE receipts (
    graph_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    actor text COLLATE "C" NOT NULL,
    conversation text COLLATE "C" NOT NULL,
    conversation_key text COLLATE "C" NOT NULL,
    view_gen text COLLATE "C" NOT NULL,
    from_seq bigint NOT NULL,
    from_offset bigint NOT NULL,
    to_seq bigint NOT NULL,
    chunk_seq bigint,
    chunk_offset bigint NOT NULL,
    tip_seq bigint NOT NULL,
    tip_hash text COLLATE "C" NOT NULL,
    delivered_sha256 text COLLATE "C" NOT NULL,
    created_ms bigint NOT NULL,
    confirmed_ms bigint,
    base text COLLATE "C",
    page_bytes bigint,
    ordinal bigint NOT NULL,
    PRIMARY KEY (graph_id, id)
);
CREATE INDEX receipts_ordinal ON receipts (graph_id, ordinal);
CREATE TABLE lifecycles (
    graph_id text COLLATE "C" NOT NULL,
    agent text COLLATE "C" NOT NULL,
    task text COLLATE "C" NOT NULL,
    state text COLLATE "C" NOT NULL,
    began_seq bigint NOT NULL,
    began_ms bigint NOT NULL,
    ttl_ms bigint NOT NULL,
    lapsed boolean NOT NULL,
    PRIMARY KEY (graph_id, agent, task)
);
CREATE INDEX lifecycles_begun ON lifecycles (graph_id, began_seq) WHERE state = 'begun' AND NOT lapsed;
CREATE INDEX lifecycles_task ON lifecycles (graph_id, task);
"#;

/// Receipts a room keeps, newest first (room_store's `SqliteConfig::default().receipts_kept_max`:
/// PostgreSQL has no such setting yet). Confirming an evicted one is refused `receipt_unknown`.
const RECEIPTS_KEPT_MAX: i64 = 100_000;

/// Receipts written between two evictions of the oldest (`RECEIPTS_EVICT_EVERY` in
/// room_store's index.rs).
const RECEIPTS_EVICT_EVERY: i64 = 1024;

const ITEM_COLS: &str =
    "id, source, source_seq, agent, from_agent, task, status, resolved_by, not_after_ms";

const CHECKPOINT_COLS: &str = "actor, conversation, conversation_key, view_gen, confirmed_seq, chunk_seq, chunk_offset, updated_ms";

const RECEIPT_COLS: &str = "id, actor, conversation, conversation_key, view_gen, from_seq, from_offset, to_seq, chunk_seq, chunk_offset, tip_seq, tip_hash, delivered_sha256, created_ms, confirmed_ms, base, page_bytes";

const LIFECYCLE_COLS: &str = "agent, task, state, began_seq, began_ms, ttl_ms, lapsed";

type Param<'a> = &'a (dyn ToSql + Sync);

/// Project a batch's items, resolutions, checkpoints, fold advances and lifecycle changes, in
/// that order (SQLite's).
pub(crate) async fn apply(tx: &Transaction<'_>, graph: &str, b: &Batch) -> Result<()> {
    for kind in ItemKind::ALL {
        let items: Vec<&ItemRow> = b.items.iter().filter(|it| it.kind == kind).collect();
        insert_items(tx, graph, kind, &items).await?;
    }
    for (kind, id, status, by) in &b.resolutions {
        resolve(tx, graph, *kind, id, status, by).await?;
    }
    for c in &b.checkpoints {
        upsert_checkpoint(tx, graph, c).await?;
    }
    for f in &b.folds {
        fold(tx, graph, f).await?;
    }
    for c in &b.lifecycles {
        apply_lifecycle(tx, graph, c).await?;
    }
    Ok(())
}

/// Empty this room's projected items, their totals and its lifecycles for a rebuild from the
/// journal; receipts and checkpoints stay (SQLite's `clear_projection` keeps them).
pub(crate) async fn clear(tx: &Transaction<'_>, graph: &str) -> Result<()> {
    for sql in [
        "DELETE FROM mentions WHERE graph_id = $1",
        "DELETE FROM obligations WHERE graph_id = $1",
        "DELETE FROM open_counts WHERE graph_id = $1",
        "DELETE FROM lifecycles WHERE graph_id = $1",
    ] {
        tx.execute(sql, &[&graph]).await.map_err(pg)?;
    }
    Ok(())
}

/// Each kind's table (room_store's own mapping is private to it).
fn table(kind: ItemKind) -> &'static str {
    match kind {
        ItemKind::Mention => "mentions",
        ItemKind::Obligation => "obligations",
    }
}

/// Insert one kind's items of a batch in one statement, in the batch's order: an item already
/// there (a replay), or met earlier in the batch, stays as it was. The totals count exactly
/// the open rows the insert returns, as SQLite's insert trigger does.
async fn insert_items(
    tx: &Transaction<'_>,
    graph: &str,
    kind: ItemKind,
    items: &[&ItemRow],
) -> Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    let st = tx
        .prepare_cached(&format!(
            "WITH added AS (
                INSERT INTO {t} (graph_id, {ITEM_COLS})
                SELECT $1::text, r.id, r.source, r.source_seq, r.agent, r.from_agent, r.task,
                       r.status, r.resolved_by, r.not_after_ms
                FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
                            $7::text[], $8::text[], $9::text[], $10::bigint[])
                     WITH ORDINALITY AS r (id, source, source_seq, agent, from_agent, task,
                                           status, resolved_by, not_after_ms, ord)
                ORDER BY r.ord
                ON CONFLICT DO NOTHING
                RETURNING agent, status
             )
             INSERT INTO open_counts (graph_id, agent, kind, n)
             SELECT $1::text, agent, $11::text, count(*) FROM added WHERE status = 'open' GROUP BY agent
             ON CONFLICT (graph_id, agent, kind) DO UPDATE SET n = open_counts.n + excluded.n",
            t = table(kind)
        ))
        .await
        .map_err(pg)?;
    let ids: Vec<&str> = items.iter().map(|it| it.id.as_str()).collect();
    let sources: Vec<&str> = items.iter().map(|it| it.source.as_str()).collect();
    let seqs: Vec<i64> = items.iter().map(|it| i(it.source_seq)).collect();
    let agents: Vec<&str> = items.iter().map(|it| it.agent.as_str()).collect();
    let froms: Vec<&str> = items.iter().map(|it| it.from_agent.as_str()).collect();
    let tasks: Vec<Option<&str>> = items.iter().map(|it| it.task.as_deref()).collect();
    let statuses: Vec<&str> = items.iter().map(|it| it.status.as_str()).collect();
    let bys: Vec<Option<&str>> = items.iter().map(|it| it.resolved_by.as_deref()).collect();
    let not_after: Vec<Option<i64>> = items.iter().map(|it| it.not_after_ms.map(i)).collect();
    let kind_name = kind.as_str();
    tx.execute(
        &st,
        &[
            &graph, &ids, &sources, &seqs, &agents, &froms, &tasks, &statuses, &bys, &not_after,
            &kind_name,
        ],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// Close an open item (a closed one stays as it was, so only the first resolution counts)
/// and take it off its addressee's total when it leaves `open`, as SQLite's update trigger.
async fn resolve(
    tx: &Transaction<'_>,
    graph: &str,
    kind: ItemKind,
    id: &str,
    status: &str,
    by: &str,
) -> Result<()> {
    let st = tx
        .prepare_cached(&format!(
            "WITH closed AS (
                UPDATE {t} SET status = $3, resolved_by = $4
                WHERE graph_id = $1 AND id = $2 AND status = 'open'
                RETURNING agent, status
             )
             UPDATE open_counts SET n = open_counts.n - 1 FROM closed
             WHERE open_counts.graph_id = $1 AND open_counts.agent = closed.agent
               AND open_counts.kind = $5 AND closed.status <> 'open'",
            t = table(kind)
        ))
        .await
        .map_err(pg)?;
    let kind_name = kind.as_str();
    tx.execute(&st, &[&graph, &id, &status, &by, &kind_name])
        .await
        .map_err(pg)?;
    Ok(())
}

async fn upsert_checkpoint(tx: &Transaction<'_>, graph: &str, c: &CheckpointRow) -> Result<()> {
    let st = tx
        .prepare_cached(&format!(
            "INSERT INTO checkpoints (graph_id, {CHECKPOINT_COLS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (graph_id, actor, conversation) DO UPDATE SET
               conversation_key = excluded.conversation_key, view_gen = excluded.view_gen,
               confirmed_seq = excluded.confirmed_seq, chunk_seq = excluded.chunk_seq,
               chunk_offset = excluded.chunk_offset, updated_ms = excluded.updated_ms"
        ))
        .await
        .map_err(pg)?;
    let (seq, chunk_seq) = (i(c.confirmed_seq), c.chunk_seq.map(i));
    let (offset, updated) = (i(c.chunk_offset), i(c.updated_ms));
    tx.execute(
        &st,
        &[
            &graph,
            &c.actor,
            &c.conversation,
            &c.conversation_key,
            &c.view_gen,
            &seq,
            &chunk_seq,
            &offset,
            &updated,
        ],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// The Fold Rule moves only an existing checkpoint of the same key and view, only forward.
async fn fold(tx: &Transaction<'_>, graph: &str, f: &FoldAdvance) -> Result<()> {
    let st = tx
        .prepare_cached(
            "UPDATE checkpoints SET confirmed_seq = $5, chunk_seq = NULL, chunk_offset = 0
             WHERE graph_id = $1 AND actor = $2 AND conversation_key = $3 AND view_gen = $4
               AND confirmed_seq < $5",
        )
        .await
        .map_err(pg)?;
    let seq = i(f.seq);
    tx.execute(
        &st,
        &[&graph, &f.actor, &f.conversation_key, &f.view_gen, &seq],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

async fn apply_lifecycle(tx: &Transaction<'_>, graph: &str, c: &LifecycleChange) -> Result<()> {
    match c {
        LifecycleChange::Begin {
            agent,
            task,
            seq,
            at_ms,
            ttl_ms,
        } => {
            let st = tx
                .prepare_cached(
                    "INSERT INTO lifecycles (graph_id, agent, task, state, began_seq, began_ms, ttl_ms, lapsed)
                     VALUES ($1, $2, $3, 'begun', $4, $5, $6, false)
                     ON CONFLICT (graph_id, agent, task) DO UPDATE SET state = 'begun',
                       began_seq = excluded.began_seq, began_ms = excluded.began_ms,
                       ttl_ms = excluded.ttl_ms, lapsed = false",
                )
                .await
                .map_err(pg)?;
            let (seq, at, ttl) = (i(*seq), i(*at_ms), i(*ttl_ms));
            tx.execute(&st, &[&graph, agent, task, &seq, &at, &ttl])
                .await
                .map_err(pg)?;
        }
        LifecycleChange::Resolve { task } => {
            let st = tx
                .prepare_cached(
                    "UPDATE lifecycles SET state = 'resolved'
                     WHERE graph_id = $1 AND task = $2 AND state = 'begun'",
                )
                .await
                .map_err(pg)?;
            tx.execute(&st, &[&graph, task]).await.map_err(pg)?;
        }
        LifecycleChange::Lapsed { agent, task } => {
            let st = tx
                .prepare_cached(
                    "UPDATE lifecycles SET lapsed = true WHERE graph_id = $1 AND agent = $2 AND task = $3",
                )
                .await
                .map_err(pg)?;
            tx.execute(&st, &[&graph, agent, task]).await.map_err(pg)?;
        }
    }
    Ok(())
}

/// The items `filter` (conditions after the graph's, and what follows them; `$1` is the
/// graph) selects from each table, oldest first, mentions before obligations of one source,
/// as SQLite's `items_where` merges them.
async fn items_where(c: &Object, filter: &str, params: &[Param<'_>]) -> Result<Vec<ItemRow>> {
    let mut out = Vec::new();
    for kind in ItemKind::ALL {
        let st = c
            .prepare_cached(&format!(
                "SELECT {ITEM_COLS} FROM {t} WHERE graph_id = $1 AND {filter}",
                t = table(kind)
            ))
            .await
            .map_err(pg)?;
        for r in c.query(&st, params).await.map_err(pg)? {
            out.push(item_from(kind, &r)?);
        }
    }
    // stable: within one seq, mentions stay before obligations
    out.sort_by_key(|it| it.source_seq);
    Ok(out)
}

// SQLite breaks ties of the orderings below by insertion (rowid); PostgreSQL keeps no such
// order, so the id (or conversation, or key) breaks them here. An addressee has at most one
// item of a kind per source, so ties do not arise for one agent's items.
impl super::PgIndex {
    pub(crate) fn lifecycle_pg(&self, agent: &str, task: &str) -> Result<Option<LifecycleRow>> {
        let (agent, task) = (agent.to_string(), task.to_string());
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {LIFECYCLE_COLS} FROM lifecycles WHERE graph_id = $1 AND agent = $2 AND task = $3"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &agent, &task])
                .await
                .map_err(pg)?
                .map(|r| lifecycle_from(&r))
                .transpose()
        })
    }

    /// `resolution`: begun lifecycles whose TTL ran out at `now_ms`, not yet recorded lapsed.
    pub(crate) fn lapsed_begins_pg(&self, now_ms: u64, limit: usize) -> Result<Vec<LifecycleRow>> {
        let now = i(now_ms);
        self.call(move |c, g| async move {
            // `began_ms + ttl_ms <= now` rearranged so that no TTL overflows the sum (SQLite
            // would turn it into a float; PostgreSQL errs)
            let st = c
                .prepare_cached(&format!(
                    "SELECT {LIFECYCLE_COLS} FROM lifecycles
                     WHERE graph_id = $1 AND state = 'begun' AND NOT lapsed
                       AND began_ms <= $2::bigint - ttl_ms
                     ORDER BY began_seq, agent, task LIMIT $3"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &now, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(lifecycle_from)
                .collect()
        })
    }

    pub(crate) fn checkpoints_of_pg(
        &self,
        actor: &str,
        limit: usize,
    ) -> Result<Vec<CheckpointRow>> {
        let actor = actor.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {CHECKPOINT_COLS} FROM checkpoints WHERE graph_id = $1 AND actor = $2
                     ORDER BY confirmed_seq DESC, conversation LIMIT $3"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &actor, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(checkpoint_from)
                .collect()
        })
    }

    /// The oldest `limit` open items of `agent`, and how many are open in all (from the kept
    /// totals: one read however many are open).
    pub(crate) fn open_items_page_pg(
        &self,
        agent: &str,
        limit: usize,
    ) -> Result<(Vec<ItemRow>, u64)> {
        let agent = agent.to_string();
        self.call(move |c, g| async move {
            let n = lim(limit);
            let mut out = items_where(
                &c,
                "agent = $2 AND status = 'open' ORDER BY source_seq, id LIMIT $3",
                &[&g, &agent, &n],
            )
            .await?;
            out.truncate(limit);
            // sum(bigint) is numeric in PostgreSQL
            let st = c
                .prepare_cached(
                    "SELECT coalesce(sum(n), 0)::bigint FROM open_counts WHERE graph_id = $1 AND agent = $2",
                )
                .await
                .map_err(pg)?;
            let total: i64 = c.query_one(&st, &[&g, &agent]).await.map_err(pg)?.get(0);
            if total < lim(out.len()) {
                return Err(StoreError::Corrupt(format!(
                    "open_counts says {total} open items for {agent} but {} are listed",
                    out.len()
                )));
            }
            Ok((out, u(total, "open item total")?))
        })
    }

    /// The sources of `agent`'s open items, oldest first, at most `limit`: each source holds
    /// at most one item of each kind for one agent, so `limit` rows of each kind are enough.
    pub(crate) fn open_sources_pg(&self, agent: &str, limit: usize) -> Result<Vec<String>> {
        let agent = agent.to_string();
        self.call(move |c, g| async move {
            let mut seen: Vec<(u64, String)> = Vec::new();
            for kind in ItemKind::ALL {
                let st = c
                    .prepare_cached(&format!(
                        "SELECT source, source_seq FROM {t}
                         WHERE graph_id = $1 AND agent = $2 AND status = 'open'
                         ORDER BY source_seq, source LIMIT $3",
                        t = table(kind)
                    ))
                    .await
                    .map_err(pg)?;
                for r in c.query(&st, &[&g, &agent, &lim(limit)]).await.map_err(pg)? {
                    seen.push((u(r.get(1), "item source_seq")?, r.get(0)));
                }
            }
            seen.sort();
            seen.dedup();
            seen.truncate(limit);
            Ok(seen.into_iter().map(|(_, s)| s).collect())
        })
    }

    /// The room's open obligations, whoever they are addressed to, oldest first.
    pub(crate) fn open_obligations_pg(&self, limit: usize) -> Result<Vec<ItemRow>> {
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ITEM_COLS} FROM obligations WHERE graph_id = $1 AND status = 'open'
                     ORDER BY source_seq, id LIMIT $2"
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g, &lim(limit)])
                .await
                .map_err(pg)?
                .iter()
                .map(|r| item_from(ItemKind::Obligation, r))
                .collect()
        })
    }

    /// The open items addressed to `agent` for `task`, oldest first.
    pub(crate) fn open_items_for_task_pg(&self, agent: &str, task: &str) -> Result<Vec<ItemRow>> {
        let (agent, task) = (agent.to_string(), task.to_string());
        self.call(move |c, g| async move {
            items_where(
                &c,
                "agent = $2 AND task = $3 AND status = 'open' ORDER BY source_seq, id",
                &[&g, &agent, &task],
            )
            .await
        })
    }

    /// Every agent's open items on a task, oldest first, at most `limit`.
    pub(crate) fn open_items_of_task_pg(&self, task: &str, limit: usize) -> Result<Vec<ItemRow>> {
        let task = task.to_string();
        self.call(move |c, g| async move {
            let n = lim(limit);
            let mut all = items_where(
                &c,
                "task = $2 AND status = 'open' ORDER BY source_seq, id LIMIT $3",
                &[&g, &task, &n],
            )
            .await?;
            all.truncate(limit);
            Ok(all)
        })
    }

    pub(crate) fn item_pg(&self, kind: ItemKind, id: &str) -> Result<Option<ItemRow>> {
        let id = id.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ITEM_COLS} FROM {t} WHERE graph_id = $1 AND id = $2",
                    t = table(kind)
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &id])
                .await
                .map_err(pg)?
                .map(|r| item_from(kind, &r))
                .transpose()
        })
    }

    /// Every item of a kind, for listings and audits.
    pub(crate) fn items_pg(&self, kind: ItemKind) -> Result<Vec<ItemRow>> {
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ITEM_COLS} FROM {t} WHERE graph_id = $1 ORDER BY source_seq, id",
                    t = table(kind)
                ))
                .await
                .map_err(pg)?;
            c.query(&st, &[&g])
                .await
                .map_err(pg)?
                .iter()
                .map(|r| item_from(kind, r))
                .collect()
        })
    }

    pub(crate) fn checkpoint_pg(
        &self,
        actor: &str,
        conversation: &str,
    ) -> Result<Option<CheckpointRow>> {
        let (actor, conversation) = (actor.to_string(), conversation.to_string());
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {CHECKPOINT_COLS} FROM checkpoints
                     WHERE graph_id = $1 AND actor = $2 AND conversation = $3"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &actor, &conversation])
                .await
                .map_err(pg)?
                .map(|r| checkpoint_from(&r))
                .transpose()
        })
    }

    /// Store a checkpoint, committed synchronously before returning.
    pub(crate) fn put_checkpoint_pg(&mut self, c: &CheckpointRow) -> Result<()> {
        let cp = c.clone();
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            upsert_checkpoint(&tx, &g, &cp).await?;
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    /// Store a receipt, and every `RECEIPTS_EVICT_EVERY` receipts past the kept many evict the
    /// oldest. The room's own count of receipts (`ordinal`) stands for SQLite's rowid, which
    /// PostgreSQL's shared table cannot give per room.
    pub(crate) fn put_receipt_pg(&mut self, r: &ReceiptRow) -> Result<()> {
        let r = r.clone();
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let st = tx
                .prepare_cached(&format!(
                    "INSERT INTO receipts (graph_id, {RECEIPT_COLS}, ordinal)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                             $17, $18,
                             (SELECT coalesce(max(ordinal), 0) + 1 FROM receipts WHERE graph_id = $1))
                     RETURNING ordinal"
                ))
                .await
                .map_err(pg)?;
            let (from_seq, from_offset, to_seq) = (i(r.from_seq), i(r.from_offset), i(r.to_seq));
            let (chunk_seq, chunk_offset, tip_seq) = (r.chunk_seq.map(i), i(r.chunk_offset), i(r.tip_seq));
            let (created, confirmed, page_bytes) =
                (i(r.created_ms), r.confirmed_ms.map(i), r.page_bytes.map(i));
            let params: [Param<'_>; 18] = [
                &g, &r.id, &r.actor, &r.conversation, &r.conversation_key, &r.view_gen,
                &from_seq, &from_offset, &to_seq, &chunk_seq, &chunk_offset, &tip_seq,
                &r.tip_hash, &r.delivered_sha256, &created, &confirmed, &r.base, &page_bytes,
            ];
            let n: i64 = tx.query_one(&st, &params).await.map_err(pg)?.get(0);
            if n > RECEIPTS_KEPT_MAX && n % RECEIPTS_EVICT_EVERY.min(RECEIPTS_KEPT_MAX) == 0 {
                tx.execute(
                    &tx.prepare_cached("DELETE FROM receipts WHERE graph_id = $1 AND ordinal <= $2").await.map_err(pg)?,
                    &[&g, &(n - RECEIPTS_KEPT_MAX)],
                )
                .await
                .map_err(pg)?;
            }
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    pub(crate) fn receipt_pg(&self, id: &str) -> Result<Option<ReceiptRow>> {
        let id = id.to_string();
        self.call(move |c, g| async move {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {RECEIPT_COLS} FROM receipts WHERE graph_id = $1 AND id = $2"
                ))
                .await
                .map_err(pg)?;
            c.query_opt(&st, &[&g, &id])
                .await
                .map_err(pg)?
                .map(|r| receipt_from(&r))
                .transpose()
        })
    }

    /// Mark a receipt confirmed and store the checkpoint it establishes, in one synchronous
    /// commit (an unknown receipt changes nothing of receipts, as in SQLite).
    pub(crate) fn confirm_pg(
        &mut self,
        receipt_id: &str,
        now_ms: u64,
        checkpoint: &CheckpointRow,
    ) -> Result<()> {
        let (id, now, cp) = (receipt_id.to_string(), i(now_ms), checkpoint.clone());
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &tx.prepare_cached(
                    "UPDATE receipts SET confirmed_ms = $3 WHERE graph_id = $1 AND id = $2",
                )
                .await
                .map_err(pg)?,
                &[&g, &id, &now],
            )
            .await
            .map_err(pg)?;
            upsert_checkpoint(&tx, &g, &cp).await?;
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }
}

fn item_from(kind: ItemKind, r: &tokio_postgres::Row) -> Result<ItemRow> {
    Ok(ItemRow {
        kind,
        id: r.get(0),
        source: r.get(1),
        source_seq: u(r.get(2), "item source_seq")?,
        agent: r.get(3),
        from_agent: r.get(4),
        task: r.get(5),
        status: r.get(6),
        resolved_by: r.get(7),
        not_after_ms: opt_u(r.get(8), "item not_after_ms")?,
    })
}

fn checkpoint_from(r: &tokio_postgres::Row) -> Result<CheckpointRow> {
    Ok(CheckpointRow {
        actor: r.get(0),
        conversation: r.get(1),
        conversation_key: r.get(2),
        view_gen: r.get(3),
        confirmed_seq: u(r.get(4), "checkpoint confirmed_seq")?,
        chunk_seq: opt_u(r.get(5), "checkpoint chunk_seq")?,
        chunk_offset: u(r.get(6), "checkpoint chunk_offset")?,
        updated_ms: u(r.get(7), "checkpoint updated_ms")?,
    })
}

fn receipt_from(r: &tokio_postgres::Row) -> Result<ReceiptRow> {
    Ok(ReceiptRow {
        id: r.get(0),
        actor: r.get(1),
        conversation: r.get(2),
        conversation_key: r.get(3),
        view_gen: r.get(4),
        from_seq: u(r.get(5), "receipt from_seq")?,
        from_offset: u(r.get(6), "receipt from_offset")?,
        to_seq: u(r.get(7), "receipt to_seq")?,
        chunk_seq: opt_u(r.get(8), "receipt chunk_seq")?,
        chunk_offset: u(r.get(9), "receipt chunk_offset")?,
        tip_seq: u(r.get(10), "receipt tip_seq")?,
        tip_hash: r.get(11),
        delivered_sha256: r.get(12),
        created_ms: u(r.get(13), "receipt created_ms")?,
        confirmed_ms: opt_u(r.get(14), "receipt confirmed_ms")?,
        base: r.get(15),
        page_bytes: opt_u(r.get(16), "receipt page_bytes")?,
    })
}

fn lifecycle_from(r: &tokio_postgres::Row) -> Result<LifecycleRow> {
    Ok(LifecycleRow {
        agent: r.get(0),
        task: r.get(1),
        state: r.get(2),
        began_seq: u(r.get(3), "lifecycle began_seq")?,
        began_ms: u(r.get(4), "lifecycle began_ms")?,
        ttl_ms: u(r.get(5), "lifecycle ttl_ms")?,
        lapsed: r.get(6),
    })
}

fn opt_u(v: Option<i64>, what: &str) -> Result<Option<u64>> {
    v.map(|v| u(v, what)).transpose()
}
