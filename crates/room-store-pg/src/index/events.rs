//! A room's events in the shared sync index: the events themselves (with the audience and the
//! search text taken from each body once, when it is projected), their causal edges and the
//! `exactly_once` registry, which the journal re-creates; and the embeddings and source reads,
//! which a rebuild keeps (the journal does not hold them).

use super::{bump, i, lim, u};
use crate::pg;
use room_core::event::SeqWitness;
use room_store::index::{
    Batch, EventHead, EventRow, IDEMPOTENCY_KEYS_MAX, IndexWitnesses, SOURCE_READS_PER_PART_MAX,
    SourceReadRow,
};
use room_store::journal::JournalMark;
use room_store::{Result, StoreError};
use serde_json::Value;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use tokio_postgres::Row;

/// `events.search` is the tsvector of what the event says (its text, a spilled text's preview,
/// a task's title; NULL: it says nothing), the counterpart of SQLite's `events_fts`; the
/// partial index counts and pages the events that say something (`embedding_*`).
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE events (
    graph_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    id text COLLATE "C" NOT NULL,
    kind text COLLATE "C" NOT NULL,
    actor text COLLATE "C" NOT NULL,
    hlc_ms bigint NOT NULL,
    hlc_c bigint NOT NULL,
    hash text COLLATE "C" NOT NULL,
    task text COLLATE "C",
    body text COLLATE "C" NOT NULL,
    audience text COLLATE "C",
    search tsvector,
    PRIMARY KEY (graph_id, seq),
    UNIQUE (graph_id, id)
);
CREATE INDEX events_task ON events (graph_id, task, seq) WHERE task IS NOT NULL;
CREATE INDEX events_journal_loss ON events (graph_id, seq) WHERE kind = 'journal_loss';
CREATE INDEX events_said ON events (graph_id, seq) WHERE search IS NOT NULL;
CREATE INDEX events_search ON events USING gin (search);
CREATE TABLE causal_edges (
    graph_id text COLLATE "C" NOT NULL,
    child text COLLATE "C" NOT NULL,
    parent text COLLATE "C" NOT NULL,
    PRIMARY KEY (graph_id, child, parent)
);
CREATE INDEX causal_edges_parent ON causal_edges (graph_id, parent);
CREATE TABLE idempotency (
    graph_id text COLLATE "C" NOT NULL,
    actor text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    event text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    task text COLLATE "C",
    PRIMARY KEY (graph_id, actor, key)
);
CREATE INDEX idempotency_seq ON idempotency (graph_id, seq);
CREATE TABLE embeddings (
    graph_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    model text COLLATE "C" NOT NULL,
    hash text COLLATE "C" NOT NULL,
    vector bytea NOT NULL,
    PRIMARY KEY (graph_id, model, seq)
);
CREATE TABLE source_reads (
    graph_id text COLLATE "C" NOT NULL,
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    agent text COLLATE "C" NOT NULL,
    conversation text COLLATE "C" NOT NULL,
    task text COLLATE "C" NOT NULL,
    path text COLLATE "C" NOT NULL,
    sha256 text COLLATE "C" NOT NULL,
    from_byte bigint NOT NULL,
    to_byte bigint NOT NULL,
    at_ms bigint NOT NULL,
    PRIMARY KEY (graph_id, rowid)
);
CREATE INDEX source_reads_reader ON source_reads (graph_id, agent, task, path, rowid);
"#;

const EVENT_COLS: &str = "seq, id, kind, actor, hlc_ms, hlc_c, hash, task, body";
const EVENT_COLS_E: &str =
    "e.seq, e.id, e.kind, e.actor, e.hlc_ms, e.hlc_c, e.hash, e.task, e.body";

/// Project a batch's events, edges and idempotency keys, in SQLite's order (`apply_rows`,
/// `apply_invariant_rows`).
pub(crate) async fn apply(
    tx: &deadpool_postgres::Transaction<'_>,
    graph: &str,
    b: &Batch,
) -> Result<()> {
    if !b.events.is_empty() {
        insert_events(tx, graph, &b.events).await?;
    }
    if !b.edges.is_empty() {
        let (children, parents): (Vec<&str>, Vec<&str>) = b
            .edges
            .iter()
            .map(|(c, p)| (c.as_str(), p.as_str()))
            .unzip();
        tx.execute(
            &tx.prepare_cached(
                "INSERT INTO causal_edges (graph_id, child, parent)
             SELECT $1::text, c, p FROM unnest($2::text[], $3::text[]) AS t(c, p)
             ON CONFLICT DO NOTHING",
            )
            .await
            .map_err(pg)?,
            &[&graph, &children, &parents],
        )
        .await
        .map_err(pg)?;
    }
    if !b.idempotency.is_empty() {
        register_keys(tx, graph, &b.idempotency).await?;
    }
    Ok(())
}

/// The events, in one statement: an event already projected (a replay) is left as it is,
/// search text included (SQLite's `INSERT OR IGNORE` and its `events_fts` insert only when a
/// row was added).
async fn insert_events(
    tx: &deadpool_postgres::Transaction<'_>,
    graph: &str,
    events: &[EventRow],
) -> Result<()> {
    let mut seqs = Vec::with_capacity(events.len());
    let mut hlc_ms = Vec::with_capacity(events.len());
    let mut hlc_c = Vec::with_capacity(events.len());
    let mut audiences = Vec::with_capacity(events.len());
    let mut words = Vec::with_capacity(events.len());
    for e in events {
        let body: Value = serde_json::from_str(&e.body)
            .map_err(|err| StoreError::Corrupt(format!("event {}: body: {err}", e.seq)))?;
        seqs.push(i(e.seq));
        hlc_ms.push(i(e.hlc_ms));
        hlc_c.push(i64::from(e.hlc_c));
        audiences.push(audience_of(&e.body, &body));
        words.push(said(&body).map(|t| fts_words(&t)));
    }
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let actors: Vec<&str> = events.iter().map(|e| e.actor.as_str()).collect();
    let hashes: Vec<&str> = events.iter().map(|e| e.hash.as_str()).collect();
    let tasks: Vec<Option<&str>> = events.iter().map(|e| e.task.as_deref()).collect();
    let bodies: Vec<&str> = events.iter().map(|e| e.body.as_str()).collect();
    tx.execute(
        &tx.prepare_cached("INSERT INTO events (graph_id, seq, id, kind, actor, hlc_ms, hlc_c, hash, task, body, audience, search)
         SELECT $1::text, seq, id, kind, actor, hlc_ms, hlc_c, hash, task, body, audience,
                to_tsvector('simple'::regconfig, words)
         FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[],
                     $8::text[], $9::text[], $10::text[], $11::text[], $12::text[])
           AS t(seq, id, kind, actor, hlc_ms, hlc_c, hash, task, body, audience, words)
         ON CONFLICT DO NOTHING").await.map_err(pg)?,
        &[
            &graph, &seqs, &ids, &kinds, &actors, &hlc_ms, &hlc_c, &hashes, &tasks, &bodies,
            &audiences, &words,
        ],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// `exactly_once` keys: the newest use of a key wins (a replay that meets a key reused after
/// its eviction ends where the live registry did), then the oldest beyond
/// `IDEMPOTENCY_KEYS_MAX` go. One upsert cannot touch a row twice, so a key used twice in the
/// batch is sent once, as the use SQLite's row-by-row upserts would have kept.
async fn register_keys(
    tx: &deadpool_postgres::Transaction<'_>,
    graph: &str,
    rows: &[(String, String, String, u64, Option<String>)],
) -> Result<()> {
    let mut kept: Vec<&(String, String, String, u64, Option<String>)> = Vec::new();
    let mut at: HashMap<(&str, &str), usize> = HashMap::new();
    for r in rows {
        match at.entry((r.0.as_str(), r.1.as_str())) {
            Entry::Occupied(o) => {
                let k = *o.get();
                if r.3 > kept[k].3 {
                    kept[k] = r;
                }
            }
            Entry::Vacant(v) => {
                v.insert(kept.len());
                kept.push(r);
            }
        }
    }
    let actors: Vec<&str> = kept.iter().map(|r| r.0.as_str()).collect();
    let keys: Vec<&str> = kept.iter().map(|r| r.1.as_str()).collect();
    let events: Vec<&str> = kept.iter().map(|r| r.2.as_str()).collect();
    let seqs: Vec<i64> = kept.iter().map(|r| i(r.3)).collect();
    let tasks: Vec<Option<&str>> = kept.iter().map(|r| r.4.as_deref()).collect();
    tx.execute(
        &tx.prepare_cached("INSERT INTO idempotency (graph_id, actor, key, event, seq, task)
         SELECT $1::text, a, k, e, s, t
         FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]) AS r(a, k, e, s, t)
         ON CONFLICT (graph_id, actor, key) DO UPDATE SET event = excluded.event,
           seq = excluded.seq, task = excluded.task WHERE excluded.seq > idempotency.seq").await.map_err(pg)?,
        &[&graph, &actors, &keys, &events, &seqs, &tasks],
    )
    .await
    .map_err(pg)?;
    let keep = i64::try_from(IDEMPOTENCY_KEYS_MAX - 1).expect("the bound is small");
    tx.execute(
        &tx.prepare_cached(
            "DELETE FROM idempotency WHERE graph_id = $1 AND seq < (
           SELECT seq FROM idempotency WHERE graph_id = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)",
        )
        .await
        .map_err(pg)?,
        &[&graph, &keep],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// Empty this room's events (their search text with them), edges and idempotency keys;
/// embeddings and source reads stay, as SQLite's `clear_projection` keeps them.
pub(crate) async fn clear(tx: &deadpool_postgres::Transaction<'_>, graph: &str) -> Result<()> {
    for sql in [
        "DELETE FROM causal_edges WHERE graph_id = $1",
        "DELETE FROM idempotency WHERE graph_id = $1",
        "DELETE FROM events WHERE graph_id = $1",
    ] {
        tx.execute(sql, &[&graph]).await.map_err(pg)?;
    }
    Ok(())
}

impl super::PgIndex {
    pub(crate) fn items_after_pg(&self, seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        let (seq, n) = (bound(seq), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &format!(
                    "SELECT {EVENT_COLS} FROM events WHERE graph_id = $1 AND seq > $2 AND kind = 'items'
                     ORDER BY seq LIMIT $3"
                ),
                &[&g, &seq, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(event_from)
            .collect()
        })
    }

    /// SQLite's `witnesses_of` with no pending mark (every batch commits with its mark), read
    /// in one statement so that every witness comes from the same snapshot.
    pub(crate) fn witnesses_pg(&self, upto: u64) -> Result<IndexWitnesses> {
        let upto = bound(upto);
        self.call(move |c, g| async move {
            let r = c
                .query_one(
                    &c.prepare_cached("SELECT (SELECT value FROM index_meta WHERE graph_id = $1 AND key = 'journal_mark'),
                            (SELECT max(seq) FROM events WHERE graph_id = $1),
                            (SELECT max(tip_seq) FROM receipts WHERE graph_id = $1),
                            (SELECT max(confirmed_seq) FROM checkpoints WHERE graph_id = $1),
                            (SELECT value FROM index_meta WHERE graph_id = $1 AND key = 'wakes_mark'),
                            (SELECT array_agg(body ORDER BY seq) FROM events
                              WHERE graph_id = $1 AND kind = 'journal_loss' AND seq <= $2)").await.map_err(pg)?,
                    &[&g, &upto],
                )
                .await
                .map_err(pg)?;
            let mut seqs = Vec::new();
            if let Some(m) = r.get::<_, Option<String>>(0) {
                let m: JournalMark = serde_json::from_str(&m)
                    .map_err(|e| StoreError::Corrupt(format!("journal mark: {e}")))?;
                seqs.push(witness("index_tip", m.tip_seq));
            }
            // SQLite's CAST reads a wakes mark that is no number as 0: no witness
            let wakes = r
                .get::<_, Option<String>>(4)
                .and_then(|v| v.trim().parse::<i64>().ok());
            for (source, v) in [
                ("events", r.get::<_, Option<i64>>(1)),
                ("receipts", r.get(2)),
                ("checkpoints", r.get(3)),
                ("wakes_mark", wakes),
            ] {
                if let Some(v) = v.filter(|&v| v > 0) {
                    seqs.push(witness(source, u(v, source)?));
                }
            }
            let mut accepted = Vec::new();
            for body in r.get::<_, Option<Vec<String>>>(5).unwrap_or_default() {
                let v: Value = serde_json::from_str(&body)
                    .map_err(|e| StoreError::Corrupt(format!("journal_loss event: {e}")))?;
                let n = |k: &str| v[k].as_u64().unwrap_or(0);
                accepted.push((n("missing_from"), n("missing_to")));
            }
            Ok(IndexWitnesses { seqs, accepted })
        })
    }

    pub(crate) fn idempotent_pg(
        &self,
        actor: &str,
        key: &str,
    ) -> Result<Option<(String, u64, Option<String>)>> {
        let (actor, key) = (actor.to_string(), key.to_string());
        self.call(move |c, g| async move {
            c.query_opt(
                &c.prepare_cached("SELECT event, seq, task FROM idempotency WHERE graph_id = $1 AND actor = $2 AND key = $3").await.map_err(pg)?,
                &[&g, &actor, &key],
            )
            .await
            .map_err(pg)?
            .map(|r| Ok((r.get(0), u(r.get(1), "idempotency seq")?, r.get(2))))
            .transpose()
        })
    }

    pub(crate) fn idempotency_keys_pg(&self) -> Result<u64> {
        self.call(move |c, g| async move {
            let n: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT count(*) FROM idempotency WHERE graph_id = $1")
                        .await
                        .map_err(pg)?,
                    &[&g],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(n, "idempotency keys")
        })
    }

    /// The caller's FTS5 query (quoted words, all required) as a web-search query over the
    /// same words as the events' search text (`fts_words`): a quoted string or bare word is a
    /// phrase of its words, and the phrases are all required, as in FTS5. Lower is better, as
    /// FTS5's rank: the score is minus `ts_rank` normalized by the text's length (option 1),
    /// how often the query's words occur in the event's text, less for a long text. FTS5's
    /// bm25 also weighs how rare each word is across the room, which `ts_rank` does not, so
    /// the two order close matches differently and their scales differ. FTS5's operators
    /// (AND, OR, NOT, NEAR, `*` prefixes, column filters) are not read: their words and
    /// characters are searched as text, and a malformed query (an unclosed quote) is not
    /// refused as FTS5 refuses it: it finds what its words find. A query with no word finds
    /// nothing.
    pub(crate) fn search_pg(
        &self,
        query: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<(u64, f64)>> {
        let Some(q) = web_query(query) else {
            return Ok(Vec::new());
        };
        let (n, skip) = (lim(limit), lim(offset));
        self.call(move |c, g| async move {
            c.query(
                &c.prepare_cached(
                    "SELECT seq, -ts_rank(search, q, 1)::float8 AS score
                 FROM events, websearch_to_tsquery('simple'::regconfig, $2) AS q
                 WHERE graph_id = $1 AND search @@ q
                 ORDER BY score, seq DESC LIMIT $3 OFFSET $4",
                )
                .await
                .map_err(pg)?,
                &[&g, &q, &n, &skip],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| -> Result<(u64, f64)> { Ok((u(r.get(0), "seq")?, r.get(1))) })
            .collect()
        })
    }

    /// The text comes from the body as the search text did (`said`): an event has search
    /// text exactly when it says something.
    pub(crate) fn embedding_todo_pg(
        &self,
        model: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String, String)>> {
        let (model, after, n) = (model.to_string(), bound(after), lim(limit));
        self.call(move |c, g| async move {
            let rows = c
                .query(
                    &c.prepare_cached(
                        "SELECT e.seq, e.hash, e.body FROM events e
                     WHERE e.graph_id = $1 AND e.seq > $3 AND e.search IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM embeddings m WHERE m.graph_id = $1
                                       AND m.model = $2 AND m.seq = e.seq AND m.hash = e.hash)
                     ORDER BY e.seq LIMIT $4",
                    )
                    .await
                    .map_err(pg)?,
                    &[&g, &model, &after, &n],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| -> Result<(u64, String, String)> {
                    let seq = u(r.get(0), "seq")?;
                    let body: String = r.get(2);
                    let text = serde_json::from_str::<Value>(&body)
                        .ok()
                        .and_then(|v| said(&v))
                        .ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "event {seq}: has search text but its body says nothing"
                            ))
                        })?;
                    Ok((seq, r.get(1), text))
                })
                .collect()
        })
    }

    /// Vectors are derived from the journal's text: a commit lost in a crash is computed
    /// again, so this one does not wait for the WAL's flush.
    pub(crate) fn put_embeddings_pg(
        &mut self,
        model: &str,
        rows: &[(u64, String, Vec<i8>)],
    ) -> Result<()> {
        let (model, rows) = (model.to_string(), rows.to_vec());
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(pg)?;
            // row by row, as SQLite's `INSERT OR REPLACE`: a seq given twice keeps the last
            let st = tx
                .prepare_cached(
                    "INSERT INTO embeddings (graph_id, seq, model, hash, vector) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (graph_id, model, seq) DO UPDATE SET hash = excluded.hash,
                       vector = excluded.vector",
                )
                .await
                .map_err(pg)?;
            for (seq, hash, v) in &rows {
                tx.execute(&st, &[&g, &i(*seq), &model, hash, &to_bytes(v)])
                    .await
                    .map_err(pg)?;
            }
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    pub(crate) fn embeddings_pg(
        &self,
        model: &str,
        before: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<i8>)>> {
        let (model, before, n) = (model.to_string(), bound(before), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &c.prepare_cached(
                    "SELECT m.seq, m.vector FROM embeddings m
                 JOIN events e ON e.graph_id = m.graph_id AND e.seq = m.seq AND e.hash = m.hash
                 WHERE m.graph_id = $1 AND m.model = $2 AND m.seq < $3
                 ORDER BY m.seq DESC LIMIT $4",
                )
                .await
                .map_err(pg)?,
                &[&g, &model, &before, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| -> Result<(u64, Vec<i8>)> { Ok((u(r.get(0), "seq")?, from_bytes(r.get(1)))) })
            .collect()
        })
    }

    pub(crate) fn embedding_counts_pg(&self, model: &str) -> Result<(u64, u64)> {
        let model = model.to_string();
        self.call(move |c, g| async move {
            let r = c
                .query_one(
                    &c.prepare_cached("SELECT (SELECT count(*) FROM embeddings m
                             JOIN events e ON e.graph_id = m.graph_id AND e.seq = m.seq AND e.hash = m.hash
                             WHERE m.graph_id = $1 AND m.model = $2),
                            (SELECT count(*) FROM events WHERE graph_id = $1 AND search IS NOT NULL)").await.map_err(pg)?,
                    &[&g, &model],
                )
                .await
                .map_err(pg)?;
            Ok((u(r.get(0), "embedded")?, u(r.get(1), "with text")?))
        })
    }

    pub(crate) fn event_by_seq_pg(&self, seq: u64) -> Result<Option<EventRow>> {
        let seq = bound(seq);
        self.call(move |c, g| async move {
            c.query_opt(
                &format!("SELECT {EVENT_COLS} FROM events WHERE graph_id = $1 AND seq = $2"),
                &[&g, &seq],
            )
            .await
            .map_err(pg)?
            .map(|r| event_from(&r))
            .transpose()
        })
    }

    pub(crate) fn event_by_id_pg(&self, id: &str) -> Result<Option<EventRow>> {
        let id = id.to_string();
        self.call(move |c, g| async move {
            c.query_opt(
                &format!("SELECT {EVENT_COLS} FROM events WHERE graph_id = $1 AND id = $2"),
                &[&g, &id],
            )
            .await
            .map_err(pg)?
            .map(|r| event_from(&r))
            .transpose()
        })
    }

    pub(crate) fn events_from_pg(&self, from: u64, limit: usize) -> Result<Vec<EventRow>> {
        let (from, n) = (bound(from), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &format!(
                    "SELECT {EVENT_COLS} FROM events WHERE graph_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3"
                ),
                &[&g, &from, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(event_from)
            .collect()
        })
    }

    pub(crate) fn event_heads_from_pg(&self, from: u64, limit: usize) -> Result<Vec<EventHead>> {
        let (from, n) = (bound(from), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &c.prepare_cached(
                    "SELECT seq, id, hash, audience FROM events WHERE graph_id = $1 AND seq >= $2
                 ORDER BY seq LIMIT $3",
                )
                .await
                .map_err(pg)?,
                &[&g, &from, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(head_from)
            .collect()
        })
    }

    /// SQLite's test of the audience, on jsonb: no audience, one that is no list or an empty
    /// list is every reader's (`json_array_length` reads 0 for what is no list); `?` finds a
    /// string element, as `json_each`'s `value = actor` does. The CASE keeps
    /// `jsonb_array_length` off what is no list (it refuses one; OR gives no order).
    pub(crate) fn first_foreign_after_pg(&self, seq: u64, actor: &str) -> Result<Option<u64>> {
        let (seq, actor) = (bound(seq), actor.to_string());
        self.call(move |c, g| async move {
            c.query_opt(
                &c.prepare_cached(
                    "SELECT seq FROM events
                 WHERE graph_id = $1 AND seq > $2 AND actor <> $3 AND kind <> 'invariant_violation'
                   AND CASE WHEN audience IS NULL THEN true
                            WHEN jsonb_typeof(audience::jsonb) <> 'array' THEN true
                            ELSE jsonb_array_length(audience::jsonb) = 0 OR audience::jsonb ? $3
                       END
                 ORDER BY seq LIMIT 1",
                )
                .await
                .map_err(pg)?,
                &[&g, &seq, &actor],
            )
            .await
            .map_err(pg)?
            .map(|r| u(r.get(0), "seq"))
            .transpose()
        })
    }

    pub(crate) fn event_count_pg(&self) -> Result<u64> {
        self.call(move |c, g| async move {
            let n: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT count(*) FROM events WHERE graph_id = $1")
                        .await
                        .map_err(pg)?,
                    &[&g],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(n, "event count")
        })
    }

    pub(crate) fn task_records_pg(
        &self,
        task: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>> {
        let (task, after, n) = (task.to_string(), bound(after_seq), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &format!(
                    "SELECT {EVENT_COLS} FROM events
                     WHERE graph_id = $1 AND task = $2 AND seq > $3
                     ORDER BY seq LIMIT $4"
                ),
                &[&g, &task, &after, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(event_from)
            .collect()
        })
    }

    pub(crate) fn task_events_pg(
        &self,
        task: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>> {
        let (task, after, n) = (task.to_string(), bound(after_seq), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &format!(
                    "SELECT {EVENT_COLS} FROM events
                     WHERE graph_id = $1 AND task = $2 AND kind = 'task' AND seq > $3
                     ORDER BY seq LIMIT $4"
                ),
                &[&g, &task, &after, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(event_from)
            .collect()
        })
    }

    pub(crate) fn citing_pg(&self, parent: &str, limit: usize) -> Result<Vec<EventRow>> {
        let (parent, n) = (parent.to_string(), lim(limit));
        self.call(move |c, g| async move {
            c.query(
                &format!(
                    "SELECT {EVENT_COLS_E} FROM causal_edges c
                     JOIN events e ON e.graph_id = c.graph_id AND e.id = c.child
                     WHERE c.graph_id = $1 AND c.parent = $2 ORDER BY e.seq LIMIT $3"
                ),
                &[&g, &parent, &n],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(event_from)
            .collect()
        })
    }

    /// SQLite's recursive walk; its DISTINCT gives no order, here the nearest come first.
    pub(crate) fn ancestors_pg(&self, id: &str, depth_max: u32) -> Result<Vec<String>> {
        let (id, depth) = (id.to_string(), i64::from(depth_max));
        self.call(move |c, g| async move {
            Ok(c.query(
                &c.prepare_cached(
                    "WITH RECURSIVE anc(id, depth) AS (
                    SELECT parent, 1::bigint FROM causal_edges WHERE graph_id = $1 AND child = $2
                    UNION
                    SELECT e.parent, anc.depth + 1 FROM causal_edges e JOIN anc ON e.child = anc.id
                    WHERE e.graph_id = $1 AND anc.depth < $3::bigint
                 ) SELECT id FROM anc GROUP BY id ORDER BY min(depth), id",
                )
                .await
                .map_err(pg)?,
                &[&g, &id, &depth],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
    }

    /// A reading receipt rides an unflushed commit, as SQLite's rides its open transaction:
    /// one lost in a crash fails closed (the reader reads the range again).
    pub(crate) fn put_source_read_pg(&mut self, row: &SourceReadRow) -> Result<()> {
        let r = row.clone();
        self.write(move |mut c, g| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("INSERT INTO source_reads (graph_id, agent, conversation, task, path, sha256, from_byte, to_byte, at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)").await.map_err(pg)?,
                &[
                    &g,
                    &r.agent,
                    &r.conversation,
                    &r.task,
                    &r.path,
                    &r.sha256,
                    &i(r.from_byte),
                    &i(r.to_byte),
                    &i(r.at_ms),
                ],
            )
            .await
            .map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("DELETE FROM source_reads
                 WHERE graph_id = $1 AND agent = $2 AND task = $3 AND path = $4 AND rowid <= (
                   SELECT rowid FROM source_reads
                   WHERE graph_id = $1 AND agent = $2 AND task = $3 AND path = $4
                   ORDER BY rowid DESC LIMIT 1 OFFSET $5)").await.map_err(pg)?,
                &[&g, &r.agent, &r.task, &r.path, &lim(SOURCE_READS_PER_PART_MAX)],
            )
            .await
            .map_err(pg)?;
            bump(&tx, &g).await?;
            tx.commit().await.map_err(pg)
        })
    }

    pub(crate) fn source_reads_pg(
        &self,
        agent: &str,
        conversation: &str,
        task: &str,
        path: &str,
        sha256: &str,
        since_ms: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let (agent, conversation, task) = (
            agent.to_string(),
            conversation.to_string(),
            task.to_string(),
        );
        let (path, sha256, since) = (path.to_string(), sha256.to_string(), bound(since_ms));
        self.call(move |c, g| async move {
            c.query(
                &c.prepare_cached("SELECT from_byte, to_byte FROM source_reads
                 WHERE graph_id = $1 AND agent = $2 AND task = $3 AND path = $4 AND conversation = $5
                   AND sha256 = $6 AND at_ms >= $7
                 ORDER BY rowid").await.map_err(pg)?,
                &[&g, &agent, &task, &path, &conversation, &sha256, &since],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| -> Result<(u64, u64)> { Ok((u(r.get(0), "from_byte")?, u(r.get(1), "to_byte")?)) })
            .collect()
        })
    }
}

/// A caller's seq or time bound as a bigint: one past every stored value stays past them.
fn bound(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn witness(source: &str, seq: u64) -> SeqWitness {
    SeqWitness {
        source: source.into(),
        seq,
    }
}

fn event_from(r: &Row) -> Result<EventRow> {
    let hlc_c: i64 = r.get(5);
    Ok(EventRow {
        seq: u(r.get(0), "seq")?,
        id: r.get(1),
        kind: r.get(2),
        actor: r.get(3),
        hlc_ms: u(r.get(4), "hlc_ms")?,
        hlc_c: u32::try_from(hlc_c)
            .map_err(|_| StoreError::Corrupt(format!("hlc_c {hlc_c} is out of range")))?,
        hash: r.get(6),
        task: r.get(7),
        body: r.get(8),
    })
}

fn head_from(r: &Row) -> Result<EventHead> {
    let seq = u(r.get(0), "seq")?;
    let audience = match r.get::<_, Option<String>>(3) {
        None => Vec::new(),
        Some(a) => serde_json::from_str(&a).map_err(|e| {
            StoreError::Corrupt(format!("event {seq}: audience is not a list of names: {e}"))
        })?,
    };
    Ok(EventHead {
        seq,
        id: r.get(1),
        hash: r.get(2),
        audience,
    })
}

/// What SQLite's `json_extract` yields as text: NULL for JSON null, a string's own text, any
/// other value's JSON.
fn sql_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// SQLite's `CASE WHEN instr(body, '"audience"') > 0 THEN json_extract(body, '$.audience')
/// END`: the key appears in the text only as that key or a value of exactly that word.
fn audience_of(text: &str, body: &Value) -> Option<String> {
    if !text.contains("\"audience\"") {
        return None;
    }
    body.get("audience").and_then(sql_text)
}

/// What an event says (SQLite's `FTS_TEXT`): its text, else a spilled text's preview, else a
/// task's title.
fn said(body: &Value) -> Option<String> {
    [
        body.get("text"),
        body.get("text_blob").and_then(|b| b.get("preview")),
        body.get("created").and_then(|c| c.get("title")),
    ]
    .into_iter()
    .flatten()
    .find_map(sql_text)
}

/// Text as FTS5's `unicode61` tokenizer cuts it (runs of letters and digits, lowercased),
/// joined by spaces: PostgreSQL's parser would otherwise keep `a.b`, `x-y` or a URL whole,
/// and a word inside one would not be found. Diacritics stay (`unicode61` folds them).
fn fts_words(text: &str) -> String {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// An FTS5 query as a `websearch_to_tsquery` one: each quoted string or bare word, cut into
/// words as the events' text is, becomes a quoted phrase (all required); `""` inside quotes
/// is a quote, as in FTS5. `None`: no word at all.
fn web_query(query: &str) -> Option<String> {
    let mut phrases = Vec::new();
    let mut push = |part: &str| {
        let w = fts_words(part);
        if !w.is_empty() {
            phrases.push(format!("\"{w}\""));
        }
    };
    let (mut part, mut quoted) = (String::new(), false);
    let mut chars = query.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '"' {
            if quoted && chars.peek() == Some(&'"') {
                chars.next();
                part.push(ch);
                continue;
            }
            push(&part);
            part.clear();
            quoted = !quoted;
        } else if !quoted && ch.is_whitespace() {
            push(&part);
            part.clear();
        } else {
            part.push(ch);
        }
    }
    push(&part);
    (!phrases.is_empty()).then(|| phrases.join(" "))
}

/// A vector's components as bytes, each an i8's two's complement.
fn to_bytes(v: &[i8]) -> Vec<u8> {
    v.iter().map(|x| x.to_ne_bytes()[0]).collect()
}

fn from_bytes(b: Vec<u8>) -> Vec<i8> {
    b.into_iter().map(|x| i8::from_ne_bytes([x])).collect()
}
