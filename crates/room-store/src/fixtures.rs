//! Files as older builds left them, for the upgrade tests of the crates above (feature
//! `fixtures`, never in a release build): the SQL that fakes them stays in this crate.

use crate::Result;
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

/// Turn a sync index back into schema 1 (before the invariant tables, the open counts and the
/// destination ledger).
pub fn index_back_to_schema_1(path: &Path) -> Result<()> {
    Connection::open(path)?.execute_batch(
        "DROP TABLE embeddings; DROP TABLE events_fts; DROP TABLE artifacts; ALTER TABLE events DROP COLUMN audience; DROP INDEX causal_edges_parent; ALTER TABLE receipts DROP COLUMN page_bytes; ALTER TABLE receipts DROP COLUMN base; DROP INDEX obligations_open_all; DROP TABLE source_reads; DROP INDEX evidence_task; DROP TABLE evidence; DROP TABLE ops; DROP TABLE idempotency; DROP TABLE lifecycles;
         DROP INDEX mentions_open; DROP INDEX obligations_open;
         DROP INDEX mentions_task_open; DROP INDEX obligations_task_open;
         DROP TABLE open_counts;
         DROP TRIGGER mentions_opened; DROP TRIGGER mentions_closed; DROP TRIGGER mentions_deleted;
         DROP TRIGGER obligations_opened; DROP TRIGGER obligations_closed;
         DROP TRIGGER obligations_deleted;
         CREATE INDEX mentions_open ON mentions(agent, status);
         CREATE INDEX obligations_open ON obligations(agent, status);
         PRAGMA user_version = 1;",
    )?;
    Ok(())
}

/// Turn control.db back into schema 2 (wake permits were files, no queue, no archive, no
/// task requirements or acceptance, no terms, pins or scope index).
pub fn control_back_to_schema_2(path: &Path) -> Result<()> {
    Connection::open(path)?.execute_batch(
        "DROP TABLE compositions;
         DROP TABLE collabs; DROP TABLE collab_runs; DROP TABLE collab_approvals;
         DROP INDEX agents_parent; ALTER TABLE agents DROP COLUMN parent;
         ALTER TABLE agents DROP COLUMN scopes; ALTER TABLE agents DROP COLUMN revoked_by;
         DROP INDEX tasks_claimed_room;
         ALTER TABLE tasks DROP COLUMN stage; DROP INDEX holds_room; DROP TABLE holds; DELETE FROM meta WHERE key = 'break_glass';
         ALTER TABLE rooms DROP COLUMN cancel_gen; ALTER TABLE rooms DROP COLUMN cancelled;
         DROP TABLE sessions; DROP TABLE launches; DROP INDEX tasks_lease_gen; ALTER TABLE tasks DROP COLUMN parent_revision;
         DROP TABLE project_sources; ALTER TABLE tasks DROP COLUMN governed;
         ALTER TABLE rooms DROP COLUMN admission_open;
         DROP TABLE task_scopes; DROP INDEX tasks_successor;
         ALTER TABLE tasks DROP COLUMN revision; ALTER TABLE tasks DROP COLUMN claim_pin;
         ALTER TABLE tasks DROP COLUMN override_reason; ALTER TABLE tasks DROP COLUMN successor;
         DROP INDEX tasks_leased; CREATE INDEX tasks_claimed ON tasks(status) WHERE status = 'claimed';
         ALTER TABLE tasks DROP COLUMN coordination_only; ALTER TABLE tasks DROP COLUMN lease_gen;
         ALTER TABLE tasks DROP COLUMN lease_held;
         DROP TABLE task_checks;
         ALTER TABLE tasks DROP COLUMN requirements; ALTER TABLE tasks DROP COLUMN acceptance;
         DROP TABLE wakes; DELETE FROM meta WHERE key = 'wakes_requeue';
         ALTER TABLE rooms DROP COLUMN archived_ms;
         PRAGMA user_version = 2;",
    )?;
    Ok(())
}

/// Whether control.db's meta table holds `key`.
pub fn control_meta_has(path: &Path, key: &str) -> Result<bool> {
    Ok(Connection::open(path)?
        .query_row("SELECT 1 FROM meta WHERE key = ?1", [key], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Rewrite `from` to `to` inside every queued wake permit's sealed text (a tampered queue).
pub fn tamper_wake_permits(path: &Path, from: &str, to: &str) -> Result<()> {
    Connection::open(path)?.execute(
        "UPDATE wakes SET permit = replace(permit, ?1, ?2)",
        [from, to],
    )?;
    Ok(())
}
