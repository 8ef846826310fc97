//! Tasks on PostgreSQL: their rows and terms, the leases a claim takes (each scope a row of
//! `task_scopes`, so a claim looks up only the leases that could conflict), acceptance
//! evaluations and projects' governing sources. Every compare-and-set is one statement whose
//! condition the database checks, so two daemons moving one task never both win.

use crate::control::{PgControl, boxed, bump, exec1, i, u};
use crate::pg;
use room_core::TaskStatus;
use room_store::control::{TaskCheckRow, TaskRow};
use room_store::{Result, StoreError};
use std::collections::{BTreeMap, BTreeSet};

/// The tasks tables, a step of the schema after the control tables (`crate::MIGRATIONS`).
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE tasks (
    id text COLLATE "C" PRIMARY KEY,
    room text COLLATE "C" NOT NULL REFERENCES rooms (name),
    project_id text COLLATE "C",
    title text COLLATE "C" NOT NULL,
    owner text COLLATE "C" NOT NULL,
    recipient text COLLATE "C",
    parent text COLLATE "C" REFERENCES tasks (id),
    status text COLLATE "C" NOT NULL,
    created_ms bigint NOT NULL,
    updated_ms bigint NOT NULL,
    scopes text COLLATE "C" NOT NULL DEFAULT '[]',
    requirements text COLLATE "C" NOT NULL DEFAULT '[]',
    acceptance text COLLATE "C" NOT NULL DEFAULT '[]',
    coordination_only boolean NOT NULL DEFAULT false,
    lease_gen bigint,
    lease_held boolean NOT NULL DEFAULT false,
    revision bigint NOT NULL DEFAULT 0,
    claim_pin text COLLATE "C",
    override_reason text COLLATE "C",
    successor text COLLATE "C",
    governed boolean NOT NULL DEFAULT false,
    parent_revision bigint,
    stage text COLLATE "C" NOT NULL DEFAULT '[]'
);
CREATE INDEX tasks_parent ON tasks (parent) WHERE parent IS NOT NULL;
CREATE INDEX tasks_leased ON tasks (project_id, room) WHERE lease_held;
CREATE INDEX tasks_successor ON tasks (successor) WHERE successor IS NOT NULL;
CREATE INDEX tasks_lease_gen ON tasks (lease_gen) WHERE lease_gen IS NOT NULL;
CREATE INDEX tasks_claimed_room ON tasks (status, room) WHERE status = 'claimed';
CREATE INDEX tasks_room_owner ON tasks (room, owner);
CREATE TABLE task_scopes (
    task text COLLATE "C" NOT NULL REFERENCES tasks (id),
    namespace text COLLATE "C" NOT NULL,
    resource text COLLATE "C" NOT NULL,
    PRIMARY KEY (task, namespace, resource)
);
CREATE INDEX task_scopes_resource ON task_scopes (namespace, resource);
CREATE TABLE task_checks (
    task text COLLATE "C" PRIMARY KEY REFERENCES tasks (id),
    at_ms bigint NOT NULL,
    pass boolean NOT NULL,
    evaluation text COLLATE "C" NOT NULL
);
CREATE TABLE project_sources (
    project text COLLATE "C" PRIMARY KEY REFERENCES projects (id),
    parts text COLLATE "C" NOT NULL
);
INSERT INTO control_meta (key, value) VALUES ('lease_gen_floor', 0);
"#;

/// The most tasks `superseded_by` lists.
const SUPERSEDED_MAX: i64 = 64;

const TASK_COLS: &str = "id, room, project_id, title, owner, recipient, parent, status, created_ms, updated_ms, scopes, requirements, acceptance, coordination_only, lease_gen, lease_held, revision, claim_pin, override_reason, successor, governed, parent_revision, stage";

fn json<T: serde::de::DeserializeOwned>(id: &str, col: &str, text: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("task {id}: {col} {text:?}: {e}")))
}

fn task_from(r: &tokio_postgres::Row) -> Result<TaskRow> {
    let id: String = r.get(0);
    let status: String = r.get(7);
    Ok(TaskRow {
        room: r.get(1),
        project_id: r.get(2),
        title: r.get(3),
        owner: r.get(4),
        recipient: r.get(5),
        parent: r.get(6),
        status: TaskStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("task {id}: status {status:?}")))?,
        created_ms: u(r.get(8), "created_ms")?,
        updated_ms: u(r.get(9), "updated_ms")?,
        scopes: json(&id, "scopes", r.get(10))?,
        requirements: json(&id, "requirements", r.get(11))?,
        acceptance: json(&id, "acceptance", r.get(12))?,
        coordination_only: r.get(13),
        lease_gen: r
            .get::<_, Option<i64>>(14)
            .map(|v| u(v, "lease_gen"))
            .transpose()?,
        lease_held: r.get(15),
        revision: u(r.get(16), "revision")?,
        claim_pin: r
            .get::<_, Option<&str>>(17)
            .map(|t| json::<BTreeMap<String, String>>(&id, "claim_pin", t))
            .transpose()?,
        override_reason: r.get(18),
        successor: r.get(19),
        governed: r.get(20),
        parent_revision: r
            .get::<_, Option<i64>>(21)
            .map(|v| u(v, "parent_revision"))
            .transpose()?,
        stage: json(&id, "stage", r.get(22))?,
        id,
    })
}

fn tasks_from(rows: &[tokio_postgres::Row]) -> Result<Vec<TaskRow>> {
    rows.iter().map(task_from).collect()
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("task fields serialize")
}

impl PgControl {
    pub(crate) fn tasks_open_count_pg(&self, room: &str, owner: &str) -> Result<u64> {
        let (room, owner) = (room.to_string(), owner.to_string());
        self.call(move |c| async move {
            let n: i64 = c
                .query_one(
                    &c.prepare_cached(
                        "SELECT count(*) FROM tasks WHERE room = $1 AND owner = $2
                       AND status IN ('open', 'claimed', 'blocked')",
                    )
                    .await
                    .map_err(pg)?,
                    &[&room, &owner],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(n, "count")
        })
    }

    pub(crate) fn task_ids_in_pg(
        &self,
        rooms: &[String],
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>> {
        let (rooms, prefix) = (rooms.to_vec(), prefix.to_string());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| async move {
            // the prefix compared as a prefix, not as a LIKE pattern (ids hold `_`)
            Ok(c.query(
                &c.prepare_cached(
                    "SELECT id FROM tasks WHERE room = ANY($1) AND left(id, length($2)) = $2
                 ORDER BY id LIMIT $3",
                )
                .await
                .map_err(pg)?,
                &[&rooms, &prefix, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
    }

    pub(crate) fn rooms_with_claims_pg(&self) -> Result<Vec<String>> {
        self.call(|c| async move {
            Ok(c.query(
                &c.prepare_cached(
                    "SELECT DISTINCT room FROM tasks WHERE status = 'claimed' ORDER BY room",
                )
                .await
                .map_err(pg)?,
                &[],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
    }

    /// A room whose creation failed, with its roster; refused by the foreign keys once
    /// anything else (a task, a permit, a hold) names it.
    pub(crate) fn remove_room_pg(&mut self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("DELETE FROM members WHERE room = $1")
                    .await
                    .map_err(pg)?,
                &[&name],
            )
            .await
            .map_err(pg)?;
            let n = tx
                .execute(
                    &tx.prepare_cached("DELETE FROM rooms WHERE name = $1")
                        .await
                        .map_err(pg)?,
                    &[&name],
                )
                .await
                .map_err(pg)?;
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(n > 0)
        })
    }

    pub(crate) fn task_pg(&self, id: &str) -> Result<Option<TaskRow>> {
        let id = id.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(pg)?
            .map(|r| task_from(&r))
            .transpose()
        })
    }

    pub(crate) fn children_pg(&self, parent: &str) -> Result<Vec<TaskRow>> {
        let parent = parent.to_string();
        self.call(move |c| async move {
            let rows = c
                .query(
                    &format!("SELECT {TASK_COLS} FROM tasks WHERE parent = $1 ORDER BY id"),
                    &[&parent],
                )
                .await
                .map_err(pg)?;
            tasks_from(&rows)
        })
    }

    pub(crate) fn leased_pg(&self, project: Option<&str>, room: &str) -> Result<Vec<TaskRow>> {
        let (project, room) = (project.map(String::from), room.to_string());
        self.call(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "SELECT {TASK_COLS} FROM tasks WHERE lease_held
                           AND (($1::text IS NOT NULL AND project_id = $1)
                             OR ($1::text IS NULL AND project_id IS NULL AND room = $2))
                         ORDER BY id"
                    ),
                    &[&project, &room],
                )
                .await
                .map_err(pg)?;
            tasks_from(&rows)
        })
    }

    /// The holders of an exact scope, of a directory above a file scope, and of anything under
    /// it: each an index lookup or range, never a walk over every lease.
    pub(crate) fn leased_over_pg(
        &self,
        project: Option<&str>,
        room: &str,
        over: &[room_core::scope::Scope],
    ) -> Result<Vec<TaskRow>> {
        let (project, room) = (project.map(String::from), room.to_string());
        let mut exact: Vec<(String, String)> = Vec::new();
        let mut under: Vec<(String, String)> = Vec::new();
        for s in over {
            exact.push((s.namespace.clone(), s.resource.clone()));
            if s.namespace == "file" {
                let mut at = s.resource.as_str();
                while let Some((up, _)) = at.rsplit_once('/') {
                    exact.push((s.namespace.clone(), up.to_string()));
                    at = up;
                }
                under.push((format!("{}/", s.resource), format!("{}0", s.resource)));
            }
        }
        self.call(move |c| async move {
            let mut ids = BTreeSet::new();
            for (ns, res) in &exact {
                for r in c
                    .query(
                        &c.prepare_cached(
                            "SELECT task FROM task_scopes WHERE namespace = $1 AND resource = $2",
                        )
                        .await
                        .map_err(pg)?,
                        &[ns, res],
                    )
                    .await
                    .map_err(pg)?
                {
                    ids.insert(r.get::<_, String>(0));
                }
            }
            for (lo, hi) in &under {
                // byte order (the column's collation is C, as SQLite compares): `/` sorts
                // just below `0`
                for r in c
                    .query(
                        &c.prepare_cached(
                            "SELECT task FROM task_scopes WHERE namespace = 'file'
                           AND resource > $1 AND resource < $2",
                        )
                        .await
                        .map_err(pg)?,
                        &[lo, hi],
                    )
                    .await
                    .map_err(pg)?
                {
                    ids.insert(r.get::<_, String>(0));
                }
            }
            let ids: Vec<String> = ids.into_iter().collect();
            let rows = c
                .query(
                    &format!(
                        "SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1) AND lease_held
                           AND (($2::text IS NOT NULL AND project_id = $2)
                             OR ($2::text IS NULL AND project_id IS NULL AND room = $3))
                         ORDER BY id"
                    ),
                    &[&ids, &project, &room],
                )
                .await
                .map_err(pg)?;
            tasks_from(&rows)
        })
    }

    pub(crate) fn insert_task_pg(&mut self, t: &TaskRow) -> Result<()> {
        let t = t.clone();
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute(
                &tx.prepare_cached("INSERT INTO tasks (id, room, project_id, title, owner, recipient, parent, status, created_ms, updated_ms, scopes, requirements, acceptance, coordination_only, governed, parent_revision, stage)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)").await.map_err(pg)?,
                &[&t.id, &t.room, &t.project_id, &t.title, &t.owner, &t.recipient, &t.parent,
                  &t.status.as_str(), &i(t.created_ms), &i(t.updated_ms), &to_json(&t.scopes),
                  &to_json(&t.requirements), &to_json(&t.acceptance), &t.coordination_only,
                  &t.governed, &t.parent_revision.map(i), &to_json(&t.stage)],
            )
            .await
            .map_err(pg)?;
            for s in &t.scopes {
                let (ns, res) = s.split_once(':').unwrap_or((s.as_str(), ""));
                tx.execute(
                    &tx.prepare_cached("INSERT INTO task_scopes (task, namespace, resource) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING").await.map_err(pg)?,
                    &[&t.id, &ns, &res],
                )
                .await
                .map_err(pg)?;
            }
            bump(&tx).await?;
            tx.commit().await.map_err(pg)
        })
    }

    pub(crate) fn amend_task_pg(
        &mut self,
        id: &str,
        terms: &room_core::event::TaskTerms,
    ) -> Result<bool> {
        let p = vec![
            boxed(id.to_string()),
            boxed(to_json(&terms.requirements)),
            boxed(to_json(&terms.acceptance)),
            boxed(i(terms.revision)),
        ];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE tasks SET requirements = $2, acceptance = $3, revision = $4, override_reason = NULL
                 WHERE id = $1 AND revision < $4 AND status NOT IN ('done', 'declined', 'superseded', 'cancelled')",
                p,
            )
        })?;
        Ok(n == 1)
    }

    pub(crate) fn pin_claim_pg(&mut self, id: &str, pin: &BTreeMap<String, String>) -> Result<()> {
        let p = vec![boxed(id.to_string()), boxed(to_json(pin))];
        self.write(move |c| exec1(c, "UPDATE tasks SET claim_pin = $2 WHERE id = $1", p))?;
        Ok(())
    }

    pub(crate) fn set_override_pg(&mut self, id: &str, reason: &str) -> Result<()> {
        let p = vec![boxed(id.to_string()), boxed(reason.to_string())];
        self.write(move |c| exec1(c, "UPDATE tasks SET override_reason = $2 WHERE id = $1", p))?;
        Ok(())
    }

    pub(crate) fn set_successor_pg(&mut self, id: &str, successor: &str) -> Result<()> {
        let p = vec![boxed(id.to_string()), boxed(successor.to_string())];
        self.write(move |c| exec1(c, "UPDATE tasks SET successor = $2 WHERE id = $1", p))?;
        Ok(())
    }

    pub(crate) fn move_stage_pin_pg(
        &mut self,
        id: &str,
        path: &str,
        from: &str,
        to: &str,
    ) -> Result<bool> {
        let (id, path, from, to) = (
            id.to_string(),
            path.to_string(),
            from.to_string(),
            to.to_string(),
        );
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            // the row locked from the read to the write: the pin moves from what was read
            let Some(row) = tx
                .query_opt(
                    &tx.prepare_cached("SELECT stage FROM tasks WHERE id = $1 FOR UPDATE")
                        .await
                        .map_err(pg)?,
                    &[&id],
                )
                .await
                .map_err(pg)?
            else {
                return Ok(false);
            };
            let mut stage: Vec<room_core::stage::Selection> = json(&id, "stage", row.get(0))?;
            let Some(sel) = stage
                .iter_mut()
                .find(|s| s.path == path && s.sha256 == from)
            else {
                return Ok(false);
            };
            sel.sha256 = to;
            tx.execute(
                &tx.prepare_cached("UPDATE tasks SET stage = $2 WHERE id = $1")
                    .await
                    .map_err(pg)?,
                &[&id, &to_json(&stage)],
            )
            .await
            .map_err(pg)?;
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(true)
        })
    }

    pub(crate) fn project_source_pg(&self, project: &str) -> Result<Option<Vec<String>>> {
        let project = project.to_string();
        self.call(move |c| async move {
            let Some(r) = c
                .query_opt(
                    &c.prepare_cached("SELECT parts FROM project_sources WHERE project = $1")
                        .await
                        .map_err(pg)?,
                    &[&project],
                )
                .await
                .map_err(pg)?
            else {
                return Ok(None);
            };
            let text: &str = r.get(0);
            serde_json::from_str(text)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(format!("project_sources of {project}: {e}")))
        })
    }

    pub(crate) fn set_project_source_pg(
        &mut self,
        project: &str,
        parts: Option<&[String]>,
    ) -> Result<()> {
        match parts {
            Some(parts) => {
                let p = vec![boxed(project.to_string()), boxed(to_json(&parts))];
                self.write(move |c| {
                    exec1(
                        c,
                        "INSERT INTO project_sources (project, parts) VALUES ($1, $2)
                         ON CONFLICT (project) DO UPDATE SET parts = excluded.parts",
                        p,
                    )
                })?
            }
            None => {
                let p = vec![boxed(project.to_string())];
                self.write(move |c| exec1(c, "DELETE FROM project_sources WHERE project = $1", p))?
            }
        };
        Ok(())
    }

    pub(crate) fn superseded_by_pg(&self, successor: &str) -> Result<Vec<TaskRow>> {
        let successor = successor.to_string();
        self.call(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "SELECT {TASK_COLS} FROM tasks WHERE successor = $1 ORDER BY id LIMIT {SUPERSEDED_MAX}"
                    ),
                    &[&successor],
                )
                .await
                .map_err(pg)?;
            tasks_from(&rows)
        })
    }

    /// Compare-and-set in one statement: false when the task was not in `from_status` any
    /// more (another daemon's change won). A transition releases the task's lease unless it
    /// takes a new one (a claim).
    pub(crate) fn update_task_pg(
        &mut self,
        id: &str,
        from_status: &str,
        status: &str,
        recipient: Option<&str>,
        now_ms: u64,
        lease_gen: Option<u64>,
    ) -> Result<bool> {
        let p = vec![
            boxed(id.to_string()),
            boxed(from_status.to_string()),
            boxed(status.to_string()),
            boxed(recipient.map(String::from)),
            boxed(i(now_ms)),
            boxed(lease_gen.map(i)),
        ];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE tasks SET status = $3, recipient = $4, updated_ms = $5,
                    lease_gen = CASE WHEN $6::bigint IS NOT NULL THEN $6
                        WHEN $3 = 'claimed' AND scopes != '[]' THEN COALESCE(lease_gen, 0)
                        ELSE lease_gen END,
                    lease_held = ($6::bigint IS NOT NULL OR ($3 = 'claimed' AND scopes != '[]'))
                 WHERE id = $1 AND status = $2",
                p,
            )
        })?;
        Ok(n == 1)
    }

    pub(crate) fn release_lease_pg(&mut self, id: &str, generation: u64) -> Result<bool> {
        let p = vec![boxed(id.to_string()), boxed(i(generation))];
        let n = self.write(move |c| {
            exec1(
                c,
                "UPDATE tasks SET lease_held = false WHERE id = $1 AND lease_gen = $2 AND lease_held",
                p,
            )
        })?;
        Ok(n == 1)
    }

    /// The rows' and the floor a rebuild left: generations issued before it stay issued.
    pub(crate) fn lease_gen_max_pg(&self) -> Result<u64> {
        self.call(|c| async move {
            let g: i64 = c
                .query_one(
                    &c.prepare_cached("SELECT GREATEST(
                        COALESCE((SELECT max(lease_gen) FROM tasks WHERE lease_gen IS NOT NULL), 0),
                        COALESCE((SELECT value FROM control_meta WHERE key = 'lease_gen_floor'), 0))").await.map_err(pg)?,
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            u(g, "lease_gen")
        })
    }

    pub(crate) fn clear_room_tasks_pg(&mut self, room: &str) -> Result<u64> {
        let room = room.to_string();
        self.write(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            for sql in [
                "DELETE FROM task_checks WHERE task IN (SELECT id FROM tasks WHERE room = $1)",
                "DELETE FROM task_scopes WHERE task IN (SELECT id FROM tasks WHERE room = $1)",
                // the fencing numbers these rows carried were handed out: the next is higher
                // still, whatever the rebuild restores
                "UPDATE control_meta SET value = GREATEST(value,
                    COALESCE((SELECT max(lease_gen) FROM tasks WHERE room = $1), 0))
                 WHERE key = 'lease_gen_floor'",
            ] {
                tx.execute(sql, &[&room]).await.map_err(pg)?;
            }
            let n = tx
                .execute(
                    &tx.prepare_cached("DELETE FROM tasks WHERE room = $1")
                        .await
                        .map_err(pg)?,
                    &[&room],
                )
                .await
                .map_err(pg)?;
            bump(&tx).await?;
            tx.commit().await.map_err(pg)?;
            Ok(n)
        })
    }

    pub(crate) fn record_task_check_pg(&mut self, row: &TaskCheckRow) -> Result<()> {
        let p = vec![
            boxed(row.task.clone()),
            boxed(i(row.at_ms)),
            boxed(row.pass),
            boxed(row.evaluation.clone()),
        ];
        self.write(move |c| {
            exec1(
                c,
                "INSERT INTO task_checks (task, at_ms, pass, evaluation) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (task) DO UPDATE SET at_ms = $2, pass = $3, evaluation = $4",
                p,
            )
        })?;
        Ok(())
    }

    pub(crate) fn task_check_pg(&self, task: &str) -> Result<Option<TaskCheckRow>> {
        let task = task.to_string();
        self.call(move |c| async move {
            c.query_opt(
                &c.prepare_cached(
                    "SELECT task, at_ms, pass, evaluation FROM task_checks WHERE task = $1",
                )
                .await
                .map_err(pg)?,
                &[&task],
            )
            .await
            .map_err(pg)?
            .map(|r| {
                Ok(TaskCheckRow {
                    task: r.get(0),
                    at_ms: u(r.get(1), "at_ms")?,
                    pass: r.get(2),
                    evaluation: r.get(3),
                })
            })
            .transpose()
        })
    }
}
