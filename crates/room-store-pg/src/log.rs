//! A room's journal in PostgreSQL: one row per record holding the very line the file journal
//! would hold (canonical JSON), at the byte offset it would have, so marks, ranges and
//! anchors mean what they mean for a file. The room's head row (`room_heads`) is the tip:
//! each append locks it in its transaction and refuses to write past a head another writer
//! moved (`StoreError::Conflict`). Every record is checked against the chain before a byte is
//! sent, and again when read back.

use crate::{not_found, pg, run_on, run_within};
use deadpool_postgres::{GenericClient, Pool};
use room_core::chain::ChainTip;
use room_core::{Hlc, Record, Sealed};
use room_store::journal::{
    ANCHOR_BYTES_MAX, APPEND_BYTES_MAX, Anchor, ChainPos, JournalMark, RECORD_BYTES_MAX, Scanned,
    VerifyReport,
};
use room_store::{Result, StoreError};
use std::path::PathBuf;
use std::sync::Arc;

/// Records read per query when scanning.
const SCAN_PAGE: i64 = 1_000;
/// How often, and how many times, a lost commit's transaction is asked after (half a minute
/// in all, so a server that restarts meanwhile still answers).
const READ_BACK_POLL_MS: u64 = 50;
const READ_BACK_POLLS_MAX: usize = 600;

/// Records ready to insert: `(seq, offset, line with its newline)`, the tip after them and
/// the end offset.
pub(crate) struct Lines {
    pub rows: Vec<(i64, i64, Vec<u8>)>,
    pub tip: ChainTip,
    pub end: u64,
}

/// Check `records` against the chain from `tip` at byte `start`, and lay them out.
pub(crate) fn lines_after(tip: &ChainTip, start: u64, records: &[Sealed]) -> Result<Lines> {
    let mut tip = tip.clone();
    let mut at = start;
    let mut rows = Vec::with_capacity(records.len());
    let mut bytes = 0usize;
    for s in records {
        tip = s
            .check_after(&tip)
            .map_err(|e| StoreError::Corrupt(format!("refusing to append: {e}")))?;
        let mut line = s.line().to_vec();
        line.push(b'\n');
        if line.len() > RECORD_BYTES_MAX {
            return Err(StoreError::Corrupt(format!(
                "record {} exceeds {RECORD_BYTES_MAX} bytes",
                s.record().seq
            )));
        }
        bytes += line.len();
        rows.push((i(s.record().seq), i(at), line));
        at += rows.last().map_or(0, |r| r.2.len() as u64);
    }
    if bytes > APPEND_BYTES_MAX {
        return Err(StoreError::Corrupt(format!(
            "an append of {bytes} bytes exceeds {APPEND_BYTES_MAX}"
        )));
    }
    Ok(Lines { rows, tip, end: at })
}

fn i(v: u64) -> i64 {
    i64::try_from(v).expect("offsets and seqs fit in a bigint")
}

fn u(v: i64) -> u64 {
    u64::try_from(v).expect("offsets and seqs are never negative")
}

pub(crate) async fn insert_head(
    c: &impl GenericClient,
    graph_id: &str,
    tip: &ChainTip,
    len: u64,
) -> Result<()> {
    c.execute(
        &c.prepare_cached("INSERT INTO room_heads (graph_id, seq, len, hash, hlc_ms, hlc_c) VALUES ($1, $2, $3, $4, $5, $6)").await.map_err(pg)?,
        &[&graph_id, &i(tip.seq), &i(len), &tip.hash, &i(tip.hlc.ms), &i(u64::from(tip.hlc.c))],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

pub(crate) async fn set_head(
    c: &impl GenericClient,
    graph_id: &str,
    tip: &ChainTip,
    len: u64,
) -> Result<()> {
    c.execute(
        &c.prepare_cached("UPDATE room_heads SET seq = $2, len = $3, hash = $4, hlc_ms = $5, hlc_c = $6 WHERE graph_id = $1").await.map_err(pg)?,
        &[&graph_id, &i(tip.seq), &i(len), &tip.hash, &i(tip.hlc.ms), &i(u64::from(tip.hlc.c))],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

pub(crate) async fn insert_lines(
    c: &impl GenericClient,
    graph_id: &str,
    rows: &[(i64, i64, Vec<u8>)],
) -> Result<()> {
    let st = c
        .prepare_cached(
            "INSERT INTO journal (graph_id, seq, \"offset\", line) VALUES ($1, $2, $3, $4)",
        )
        .await
        .map_err(pg)?;
    for (seq, offset, line) in rows {
        c.execute(&st, &[&graph_id, seq, offset, line])
            .await
            .map_err(pg)?;
    }
    Ok(())
}

/// The head row: (shard id, tip, len).
async fn head(c: &impl GenericClient, graph_id: &str, lock: bool) -> Result<(i64, ChainTip, u64)> {
    let sql = format!(
        "SELECT s.id, h.seq, h.hash, h.hlc_ms, h.hlc_c, h.len FROM room_heads h JOIN shards s USING (graph_id) WHERE graph_id = $1{}",
        if lock { " FOR UPDATE OF h" } else { "" }
    );
    let r = c
        .query_opt(&c.prepare_cached(&sql).await.map_err(pg)?, &[&graph_id])
        .await
        .map_err(pg)?
        .ok_or_else(|| not_found(graph_id))?;
    let tip = ChainTip {
        seq: u(r.get(1)),
        hash: r.get(2),
        hlc: Hlc {
            ms: u(r.get(3)),
            c: u32::try_from(r.get::<_, i64>(4)).expect("an HLC counter fits"),
        },
    };
    Ok((r.get(0), tip, u(r.get(5))))
}

/// Parse a stored line and check it follows `tip`: the record and the tip after it.
fn check_line(line: &[u8], tip: &ChainTip) -> std::result::Result<(Record, ChainTip), String> {
    let body = line
        .strip_suffix(b"\n")
        .ok_or("a line without its newline")?;
    let record: Record = serde_json::from_slice(body).map_err(|e| format!("not a record: {e}"))?;
    let sealed = Sealed::of(record);
    if sealed.line() != body {
        return Err("a line that is not its record's canonical form".into());
    }
    let next = sealed.check_after(tip).map_err(|e| e.to_string())?;
    Ok((sealed.into_record(), next))
}

/// The journal's last `ANCHOR_BYTES_MAX` bytes before `len` (each line's tail only is read).
async fn tail_before(c: &impl GenericClient, graph_id: &str, len: u64) -> Result<Vec<u8>> {
    let sql = format!(
        "SELECT substring(line FROM greatest(length(line) - {ANCHOR_BYTES_MAX} + 1, 1)) FROM journal
         WHERE graph_id = $1 AND \"offset\" < $2 ORDER BY seq DESC LIMIT {ANCHOR_BYTES_MAX}"
    );
    let st = c.prepare_cached(&sql).await.map_err(pg)?;
    let rows = c.query(&st, &[&graph_id, &i(len)]).await.map_err(pg)?;
    let mut tail: Vec<u8> = Vec::new();
    for r in rows {
        let mut joined: Vec<u8> = r.get(0);
        joined.extend_from_slice(&tail);
        tail = joined;
        if tail.len() as u64 >= ANCHOR_BYTES_MAX {
            break;
        }
    }
    Ok(keep_tail(tail))
}

/// The last `ANCHOR_BYTES_MAX` bytes of `bytes`.
fn keep_tail(mut bytes: Vec<u8>) -> Vec<u8> {
    let cut = bytes.len().saturating_sub(ANCHOR_BYTES_MAX as usize);
    bytes.drain(..cut);
    bytes
}

/// A room's journal, open for appends.
pub struct PgLog {
    rt: Arc<crate::Rt>,
    pool: Pool,
    serving: Arc<crate::serving::Serving>,
    graph_id: String,
    mark: JournalMark,
    /// The journal's last `ANCHOR_BYTES_MAX` bytes: what the mark's anchor hashes, kept here
    /// so an append that committed never needs the server again to say where it stands.
    tail: Vec<u8>,
    poisoned: Option<String>,
}

impl PgLog {
    /// Open `graph_id`'s journal: records after `known` (all without it) are checked and fed
    /// to `each`; a `known` mark of another journal (one set aside and made again, or cut
    /// below it) is `Rotated`.
    pub(crate) fn open(
        rt: Arc<crate::Rt>,
        pool: Pool,
        serving: Arc<crate::serving::Serving>,
        graph_id: &str,
        known: Option<&JournalMark>,
        each: room_store::backend::ScanEach<'_>,
    ) -> Result<PgLog> {
        let (p, g, k) = (pool.clone(), graph_id.to_string(), known.cloned());
        let (shard, head_tip, len, start) = run_on(&rt, async move {
            let c = p.get().await.map_err(pg)?;
            let (shard, tip, len) = head(&c, &g, false).await?;
            let start = match &k {
                None => (ChainTip::genesis(&g), 0),
                Some(m) => {
                    let ours = m.ino == u(shard) && m.len <= len && {
                        let a = Anchor::of_tail(&tail_before(&c, &g, m.len).await?);
                        a == m.anchor_sha256
                    };
                    if !ours {
                        return Err(StoreError::Rotated(format!(
                            "{g}: the index's mark is not of this journal"
                        )));
                    }
                    (m.tip(), m.len)
                }
            };
            Ok((shard, tip, len, start))
        })?;
        let (mut tip, mut at) = start;
        // page through the records after the start, checking each as it comes
        // up to the head as it was read: what other writers add meanwhile is the next
        // open's (an append past it finds the head moved)
        while tip.seq < head_tip.seq {
            let (p, g, from, upto) = (pool.clone(), graph_id.to_string(), tip.seq, head_tip.seq);
            let page: Vec<(i64, i64, Vec<u8>)> = run_on(&rt, async move {
                let c = p.get().await.map_err(pg)?;
                let rows = c
                    .query(
                        &c.prepare_cached("SELECT seq, \"offset\", line FROM journal WHERE graph_id = $1 AND seq > $2 AND seq <= $4 ORDER BY seq LIMIT $3").await.map_err(pg)?,
                        &[&g, &i(from), &SCAN_PAGE, &i(upto)],
                    )
                    .await
                    .map_err(pg)?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect())
            })?;
            if page.is_empty() {
                break;
            }
            for (seq, offset, line) in page {
                if u(offset) != at {
                    return Err(StoreError::Corrupt(format!(
                        "{graph_id}: record {seq} at byte {offset}, not where the last ended ({at})"
                    )));
                }
                let (record, next) = check_line(&line, &tip).map_err(|why| {
                    StoreError::Corrupt(format!("{graph_id}: record {seq}: {why}"))
                })?;
                each(Scanned {
                    record,
                    offset: at,
                    len: line.len() as u64,
                })?;
                tip = next;
                at += line.len() as u64;
            }
        }
        if tip != head_tip || at != len {
            return Err(StoreError::Corrupt(format!(
                "{graph_id}: the records end at seq {} (byte {at}) but the head says seq {} (byte {len})",
                tip.seq, head_tip.seq
            )));
        }
        let (p, g) = (pool.clone(), graph_id.to_string());
        let tail = run_on(&rt, async move {
            let c = p.get().await.map_err(pg)?;
            tail_before(&c, &g, len).await
        })?;
        Ok(PgLog {
            rt,
            pool,
            serving,
            graph_id: graph_id.to_string(),
            mark: mark(u(shard), len, Anchor::of_tail(&tail), &tip),
            tail,
            poisoned: None,
        })
    }
}

fn mark(shard: u64, len: u64, anchor: Anchor, tip: &ChainTip) -> JournalMark {
    JournalMark {
        dev: 0,
        ino: shard,
        len,
        anchor_sha256: anchor,
        tip_seq: tip.seq,
        tip_hash: tip.hash.clone(),
        tip_hlc: tip.hlc,
    }
}

impl room_store::backend::RoomLog for PgLog {
    fn append(&mut self, records: &[Sealed]) -> Result<Vec<(u64, u64)>> {
        if let Some(why) = &self.poisoned {
            return Err(StoreError::Corrupt(format!("journal is poisoned: {why}")));
        }
        self.serving.check()?;
        let ours = self.serving.generation();
        let old = self.mark.tip();
        let lines = lines_after(&old, self.mark.len, records)?;
        let ranges: Vec<(u64, u64)> = lines
            .rows
            .iter()
            .map(|(_, off, line)| (u(*off), line.len() as u64))
            .collect();
        let added: Vec<u8> = lines
            .rows
            .iter()
            .flat_map(|r| r.2.iter().copied())
            .collect();
        let (pool, g, shard) = (self.pool.clone(), self.graph_id.clone(), self.mark.ino);
        let (rows, new_tip, end) = (lines.rows, lines.tip.clone(), lines.end);
        // what a read-back compares the journal with: this append's first line
        let first = rows
            .first()
            .map(|(seq, _, line)| (*seq, line.clone()))
            .expect("an append writes at least one line");
        let expect = old.clone();
        // Ok(xid, the commit's own outcome): only a commit whose answer was lost leaves the
        // outcome to be read back; every earlier failure rolled the transaction back
        let sent = run_within(&self.rt, async move {
            let mut c = pool.get().await.map_err(pg)?;
            // read committed whatever the server's default: the fence reads the generation
            // after its lock, which a snapshot taken at the first statement would not see
            let tx = c
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
                .start()
                .await
                .map_err(pg)?;
            crate::serving::fence_append(&tx, ours).await?;
            let (id, at, _) = head(&tx, &g, true).await?;
            if u(id) != shard {
                return Err(StoreError::Rotated(format!(
                    "{g}: the room's journal was replaced since this writer opened it"
                )));
            }
            if at != expect {
                return Err(StoreError::Conflict(format!(
                    "{g}: another writer appended first (the head is at seq {}, this writer's at {})",
                    at.seq, expect.seq
                )));
            }
            let xid: i64 = tx
                .query_one(
                    &tx.prepare_cached("SELECT txid_current()")
                        .await
                        .map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            insert_lines(&tx, &g, &rows).await?;
            set_head(&tx, &g, &new_tip, end).await?;
            Ok((xid, tx.commit().await.map_err(|e| e.to_string())))
        });
        match sent {
            Some(Ok((_, Ok(())))) => {}
            Some(Ok((xid, Err(why)))) => self.read_back(xid, first, &why)?,
            Some(Err(StoreError::Fenced(why))) => {
                // the database says another daemon serves it now: this one stops writing
                self.serving.fence(why.clone());
                return Err(StoreError::Fenced(why));
            }
            Some(Err(e)) => return Err(e),
            None => {
                // no answer at all: the transaction may still commit on the server
                let why = format!(
                    "{}: an append got no answer within {} ms; what it did is unknown",
                    self.graph_id,
                    crate::CALL_TIMEOUT_MS
                );
                self.poisoned = Some(why.clone());
                return Err(StoreError::InDoubt(why));
            }
        }
        self.tail.extend_from_slice(&added);
        self.tail = keep_tail(std::mem::take(&mut self.tail));
        self.mark = mark(self.mark.ino, end, Anchor::of_tail(&self.tail), &lines.tip);
        Ok(ranges)
    }

    fn tip(&self) -> ChainTip {
        self.mark.tip()
    }

    fn mark(&self) -> &JournalMark {
        &self.mark
    }

    fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    fn synced_len(&self) -> u64 {
        // a commit returned only once the server made it durable
        self.mark.len
    }

    fn len_now(&self) -> u64 {
        self.mark.len
    }

    fn location(&self) -> PathBuf {
        PathBuf::from(format!("postgres:{}", self.graph_id))
    }
}

impl PgLog {
    /// After a commit whose answer was lost: wait until its transaction is no longer in
    /// progress on the server (`txid_status`, on a fresh connection, across a server
    /// restart), then let the journal decide: the append landed if and only if the journal
    /// holds its first line, byte for byte (a transaction id alone could, after a crash, be
    /// given again to another transaction). No answer within the polls: in doubt, and the log
    /// takes no more appends.
    fn read_back(&mut self, xid: i64, first: (i64, Vec<u8>), why: &str) -> Result<()> {
        let (pool, g) = (self.pool.clone(), self.graph_id.clone());
        let landed = run_on(&self.rt, async move {
            let mut last = String::from("no answer");
            for _ in 0..READ_BACK_POLLS_MAX {
                match settled(&pool, xid, &g, &first).await {
                    Ok(Some(landed)) => return Ok(landed),
                    Ok(None) => last = "its transaction is in progress".into(),
                    Err(e) => last = e,
                }
                tokio::time::sleep(std::time::Duration::from_millis(READ_BACK_POLL_MS)).await;
            }
            Err(StoreError::Postgres(last))
        });
        match landed {
            Ok(true) => Ok(()),
            Ok(false) => Err(StoreError::Postgres(format!(
                "{}: the append did not commit ({why})",
                self.graph_id
            ))),
            Err(e) => {
                let doubt = format!(
                    "{}: a commit's answer was lost ({why}) and it cannot be read back: {e}",
                    self.graph_id
                );
                self.poisoned = Some(doubt.clone());
                Err(StoreError::InDoubt(doubt))
            }
        }
    }
}

/// Whether a lost commit landed, once that can be told: none while its transaction is still
/// in progress; an error while the server cannot be asked.
async fn settled(
    pool: &Pool,
    xid: i64,
    graph_id: &str,
    first: &(i64, Vec<u8>),
) -> std::result::Result<Option<bool>, String> {
    let c = pool.get().await.map_err(|e| pg(e).to_string())?;
    match c.query_one("SELECT txid_status($1)", &[&xid]).await {
        Ok(r) if r.get::<_, Option<String>>(0).as_deref() == Some("in progress") => {
            return Ok(None);
        }
        Ok(_) => {}
        // an id the server calls "in the future" after a restart never reached its WAL, so
        // it is not running: the journal below says it did not land
        Err(e) if never_logged(&e) => {}
        Err(e) => return Err(pg(e).to_string()),
    }
    let row = c
        .query_opt(
            "SELECT line FROM journal WHERE graph_id = $1 AND seq = $2",
            &[&graph_id, &first.0],
        )
        .await
        .map_err(|e| pg(e).to_string())?;
    Ok(Some(row.is_some_and(|r| r.get::<_, Vec<u8>>(0) == first.1)))
}

/// `txid_status` refused a transaction id as one the server has not reached: after a crash
/// and restart, the id of a transaction that wrote no WAL before the crash.
fn never_logged(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|d| {
        *d.code() == tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE
            && d.message().contains("in the future")
    })
}

/// Verify the records after `from` (the start when none) that end before `stop` (the end
/// when none), read-only; damage is reported, not raised.
pub(crate) async fn verify(
    pool: &Pool,
    graph_id: &str,
    from: Option<ChainPos>,
    stop: Option<u64>,
) -> Result<VerifyReport> {
    let c = pool.get().await.map_err(pg)?;
    head(&c, graph_id, false).await?;
    let mut tip = from
        .as_ref()
        .map_or_else(|| ChainTip::genesis(graph_id), ChainPos::tip);
    let mut at = from.as_ref().map_or(0, |p| p.len);
    let (mut torn, mut damage, mut damaged) = (0u64, None, 0u64);
    let mut after = tip.seq;
    'pages: loop {
        let rows = c
            .query(
                &c.prepare_cached("SELECT seq, \"offset\", line FROM journal WHERE graph_id = $1 AND seq > $2 ORDER BY seq LIMIT $3").await.map_err(pg)?,
                &[&graph_id, &i(after), &SCAN_PAGE],
            )
            .await
            .map_err(pg)?;
        if rows.is_empty() {
            break;
        }
        for (n, r) in rows.iter().enumerate() {
            let (seq, offset, line): (i64, i64, Vec<u8>) = (r.get(0), r.get(1), r.get(2));
            after = u(seq);
            let end = u(offset) + line.len() as u64;
            if stop.is_some_and(|s| end > s) {
                torn = stop.map_or(0, |s| s.saturating_sub(u(offset).max(at)));
                break 'pages;
            }
            let checked = if u(offset) != at {
                Err(format!("not where the last record ended (byte {at})"))
            } else {
                check_line(&line, &tip).map(|(_, next)| next)
            };
            match checked {
                Ok(next) => {
                    tip = next;
                    at = end;
                }
                Err(why) => {
                    damage = Some(format!("record {seq} at byte {offset}: {why}"));
                    // the damaged record and the rest of this page that ends before `stop`
                    let left = rows[n..]
                        .iter()
                        .filter(|r| {
                            let end = u(r.get::<_, i64>(1)) + r.get::<_, Vec<u8>>(2).len() as u64;
                            stop.is_none_or(|s| end <= s)
                        })
                        .count();
                    damaged = left as u64
                        + count_after(&c, graph_id, rows.last().map_or(0, |r| r.get(0)), stop)
                            .await?;
                    break 'pages;
                }
            }
        }
    }
    Ok(VerifyReport {
        records: tip.seq,
        tip_hash: tip.hash,
        tip_hlc: tip.hlc,
        bytes: at,
        torn_bytes: torn,
        damage,
        damaged_records: damaged,
    })
}

async fn count_after(
    c: &impl GenericClient,
    graph_id: &str,
    seq: i64,
    stop: Option<u64>,
) -> Result<u64> {
    let stop = stop.map_or(i64::MAX, i);
    let n: i64 = c
        .query_one(
            &c.prepare_cached("SELECT COUNT(*) FROM journal WHERE graph_id = $1 AND seq > $2 AND \"offset\" + length(line) <= $3").await.map_err(pg)?,
            &[&graph_id, &seq, &stop],
        )
        .await
        .map_err(pg)?
        .get(0);
    Ok(u(n))
}

/// Cut `graph_id`'s journal back to `len` (a record boundary): the records past it are kept
/// in `journal_cut` under a cut id, and the head moves back. Where they were kept.
pub(crate) async fn cut(pool: &Pool, graph_id: &str, len: u64) -> Result<String> {
    let mut c = pool.get().await.map_err(pg)?;
    let tx = c.transaction().await.map_err(pg)?;
    head(&tx, graph_id, true).await?;
    // the tip at `len`: the record that ends there (the genesis at 0)
    let tip = if len == 0 {
        ChainTip::genesis(graph_id)
    } else {
        let r = tx
            .query_opt(
                &tx.prepare_cached("SELECT line FROM journal WHERE graph_id = $1 AND \"offset\" + length(line) = $2").await.map_err(pg)?,
                &[&graph_id, &i(len)],
            )
            .await
            .map_err(pg)?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("{graph_id}: no record ends at byte {len}"))
            })?;
        let line: Vec<u8> = r.get(0);
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        let record: Record = serde_json::from_slice(body)
            .map_err(|e| StoreError::Corrupt(format!("{graph_id}: the record at {len}: {e}")))?;
        ChainTip {
            seq: record.seq,
            hash: record.hash,
            hlc: record.hlc,
        }
    };
    let id: i64 = tx
        .query_one(
            &tx.prepare_cached("SELECT nextval('journal_cuts')")
                .await
                .map_err(pg)?,
            &[],
        )
        .await
        .map_err(pg)?
        .get(0);
    tx.execute(
        &tx.prepare_cached("INSERT INTO journal_cut (graph_id, seq, \"offset\", line, cut_id)
         SELECT graph_id, seq, \"offset\", line, $3 FROM journal WHERE graph_id = $1 AND \"offset\" >= $2").await.map_err(pg)?,
        &[&graph_id, &i(len), &id],
    )
    .await
    .map_err(pg)?;
    tx.execute(
        &tx.prepare_cached("DELETE FROM journal WHERE graph_id = $1 AND \"offset\" >= $2")
            .await
            .map_err(pg)?,
        &[&graph_id, &i(len)],
    )
    .await
    .map_err(pg)?;
    set_head(&tx, graph_id, &tip, len).await?;
    tx.commit().await.map_err(pg)?;
    Ok(format!("postgres table journal_cut, cut {id}"))
}
