//! Privileged acceptance: the engine measures a task's declared checks against live files and
//! processes, never on the worker's word. File observations follow the seed's law: an error
//! (permission denied, I/O) is `observation: "unconfirmed"` and fails, never read as presence
//! or absence; a path that resolves outside the project root is unconfirmed too. `command`
//! checks run outside every lock, before the transition (`prepare_turn` runs them first);
//! everything else is observed again inside it, so `done` closes on what is true at its commit.
//!
//! The newest evaluation of each task is kept in control.db (an observation for `task show`);
//! what `done` decided is in the journal.

use crate::ledger::OPS_PER_TASK_MAX;
use crate::room::RoomHandle;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::acceptance::{Check, CheckResult, Evaluation, UNCONFIRMED};
use room_core::event::Probe;
use room_core::scope::Scope;
use room_core::{Code, Refusal, RunRequest};
use room_store::control::{TaskCheckRow, TaskRow};
use room_store::index::OpRow;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Evaluations (commands and probes: processes) running at once in the daemon. An
/// evaluation holds a blocking thread for as long as its processes run.
pub const EVALUATIONS_MAX: usize = 4;

/// The tasks being evaluated now (see `Engine::evaluations`).
#[derive(Debug, Default)]
pub(crate) struct Evaluations(std::sync::Mutex<std::collections::BTreeSet<String>>);

/// One task's evaluation slot, given back when dropped.
pub(crate) struct Evaluating<'a> {
    set: &'a Evaluations,
    task: String,
}

impl Drop for Evaluating<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.task);
    }
}

impl Evaluations {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        // a set of names stays a set whatever panicked while holding it
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot to evaluate `task` now, or `acceptance_evaluation_busy` when it is being
    /// evaluated already or the daemon runs `EVALUATIONS_MAX` evaluations.
    pub(crate) fn enter(&self, task: &str) -> Outcome<Evaluating<'_>> {
        let mut set = self.lock();
        if set.contains(task) {
            return Err(Refusal::new(
                Code::AcceptanceEvaluationBusy,
                format!("the acceptance of {task} is being evaluated already"),
            )
            .detail(json!({"task": task, "reason": "task_evaluating"}))
            .hint("wait for that evaluation to end, then call again"));
        }
        if set.len() >= EVALUATIONS_MAX {
            return Err(Refusal::new(
                Code::AcceptanceEvaluationBusy,
                format!("the daemon runs {EVALUATIONS_MAX} evaluations already"),
            )
            .detail(json!({"task": task, "reason": "daemon_busy",
                "evaluations_max": EVALUATIONS_MAX}))
            .hint("call again in a moment"));
        }
        set.insert(task.to_string());
        Ok(Evaluating {
            set: self,
            task: task.to_string(),
        })
    }
}

/// What `command` checks produced before the transition, for the task and checks they ran
/// against (`done` uses them only if both are unchanged).
pub(crate) struct PreRun {
    pub task: String,
    pub acceptance: Vec<Check>,
    pub results: Vec<(usize, CheckResult)>,
    /// Fresh probe observations of the task's recorded operations, by operation id.
    pub probes: std::collections::BTreeMap<String, Value>,
    /// The `sha256` checks' files hashed outside the room lock, by check index: the digest and
    /// the file's stamp it was taken under (unchanged before and after the read).
    pub hashes: Hashes,
}

/// A file's digest taken outside every lock, and the stamp it holds for.
#[derive(Debug, Clone)]
pub(crate) struct PreHash {
    stamp: room_core::FileStamp,
    digest: String,
    bytes: u64,
}

/// Why a file could not be hashed outside the lock: the observation error, as the in-lock
/// path reports it (`unconfirmed`, with its kind).
#[derive(Debug, Clone)]
pub(crate) struct PreErr {
    error: String,
    kind: String,
}

pub(crate) type Hashes = std::collections::BTreeMap<usize, Result<PreHash, PreErr>>;

/// Where a task's file checks are measured: its project's canonical root, revalidated.
pub(crate) struct Place {
    pub root: Option<PathBuf>,
}

impl Place {
    fn shown(&self, rel: &str) -> String {
        match self.root {
            Some(_) => format!("project:/{rel}"),
            None => rel.to_string(),
        }
    }
}

/// Why a command or probe did not run: the evaluation's time was spent before it.
const BUDGET_SPENT: &str =
    "the evaluation's time (acceptance.evaluation_ms_max) was spent before it could run";

fn unconfirmed(path: &str, e: &std::io::Error) -> Value {
    json!({"path": path, "error": e.to_string(), "error_kind": format!("{:?}", e.kind()),
        "observation": UNCONFIRMED})
}

fn outside(path: &str) -> Value {
    json!({"path": path, "error": "the path resolves outside the project root",
        "error_kind": "OutsideTerritory", "observation": UNCONFIRMED})
}

/// Where a file check's path leads: a file inside the root, nothing, a symlink inside the
/// root whose target does not exist (a name that exists is not absent, and there is no file
/// to measure), or not knowable.
enum Found {
    Present,
    Absent,
    Dangling,
    Unknown(Value),
}

impl Engine {
    /// The place a task's checks are measured. A project whose root moved refuses
    /// (`project_root_redirected`): nothing is measured in a directory that is not the grant.
    ///
    /// In a collaboration whose roles work in trees, checks measure its gate tree (the base
    /// with the diff under review applied), never the person's checkout.
    pub(crate) fn acceptance_place(&self, t: &TaskRow) -> Outcome<Place> {
        if t.project_id.is_some()
            && let Some(trees) = self.collab_trees(&t.room)?
        {
            return Ok(Place {
                root: Some(trees.gate_tree()),
            });
        }
        let root = match &t.project_id {
            Some(p) => Some(PathBuf::from(self.revalidate_project(p)?.canonical_root)),
            None => None,
        };
        Ok(Place { root })
    }

    /// Run the task's `command` checks (long: call this outside every lock), each within what
    /// is left of the evaluation's time (`deadline_ms`, on the engine's clock).
    pub(crate) fn run_commands(
        &self,
        t: &TaskRow,
        place: &Place,
        deadline_ms: u64,
    ) -> Vec<(usize, CheckResult)> {
        let allowed = self.policy().acceptance_commands;
        t.acceptance
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_command())
            .map(|(i, c)| (i, self.run_command(c, place, &allowed, deadline_ms)))
            .collect()
    }

    /// What is left of an evaluation's time now, if anything.
    fn time_left_ms(&self, deadline_ms: u64) -> Option<u64> {
        Some(deadline_ms.saturating_sub(self.now_ms())).filter(|l| *l > 0)
    }

    fn run_command(
        &self,
        c: &Check,
        place: &Place,
        allowed: &[String],
        deadline_ms: u64,
    ) -> CheckResult {
        let Check::Command {
            program,
            args,
            timeout_ms,
            exit_code,
            project_write,
            network,
        } = c
        else {
            unreachable!("run_commands passes only command checks")
        };
        let mut detail = json!({"program": program, "args": args, "expected_exit_code": exit_code,
            "timeout_ms": timeout_ms});
        if *project_write {
            detail["project_write"] = json!(true);
        }
        if *network {
            detail["network"] = json!(true);
        }
        let result = |pass: bool, detail: Value| CheckResult {
            kind: "command".into(),
            pass,
            detail,
        };
        if !allowed.iter().any(|a| a == program) {
            detail["error"] = json!("the program is not on the owner's allowlist");
            detail["observation"] = json!("refused");
            return result(false, detail);
        }
        let Some(left) = self.time_left_ms(deadline_ms) else {
            detail["observation"] = json!(UNCONFIRMED);
            detail["why"] = json!(BUDGET_SPENT);
            return result(false, detail);
        };
        let req = RunRequest {
            program: PathBuf::from(program),
            args: args.clone(),
            cwd: place.root.clone().unwrap_or_else(|| PathBuf::from("/")),
            timeout_ms: (*timeout_ms).min(left),
            project: place.root.clone(),
            project_write: *project_write,
            network: *network,
            stdin: Vec::new(),
            stdout_bytes_max: 0,
        };
        match self.env.runner.run(&req) {
            Err(e) => {
                detail["error"] = json!(e.to_string());
                detail["error_kind"] = json!(format!("{:?}", e.kind()));
                detail["observation"] = json!(UNCONFIRMED);
                result(false, detail)
            }
            Ok(out) => {
                detail["exit_code"] = json!(out.exit_code);
                detail["timed_out"] = json!(out.timed_out);
                detail["elapsed_ms"] = json!(out.elapsed_ms);
                if !out.confinement.is_empty() {
                    detail["confinement"] = json!(out.confinement);
                }
                if let Some(s) = out.signal {
                    detail["signal"] = json!(s);
                }
                if !out.stderr_tail.is_empty() {
                    detail["stderr_tail"] = json!(out.stderr_tail);
                }
                if !out.stdout_tail.is_empty() {
                    detail["stdout_tail"] = json!(out.stdout_tail);
                }
                // a check whose processes outlived it measured nothing Room can stand behind
                if !out.job_empty {
                    detail["observation"] = json!(UNCONFIRMED);
                    detail["why"] =
                        json!("processes of the check were still running after it ended");
                    return result(false, detail);
                }
                let pass = !out.timed_out && out.exit_code == Some(*exit_code);
                result(pass, detail)
            }
        }
    }

    /// Observe every check that is not a command, now (the ledger from `h`, under its lock).
    pub(crate) fn observe_now(
        &self,
        t: &TaskRow,
        place: &Place,
        h: &RoomHandle,
        probes: Option<&std::collections::BTreeMap<String, Value>>,
        hashes: Option<&Hashes>,
    ) -> Outcome<Vec<(usize, CheckResult)>> {
        let mut out = Vec::new();
        for (i, c) in t.acceptance.iter().enumerate() {
            match c {
                Check::Command { .. } => {}
                Check::Destination { destination } => {
                    let r = self.observe_destination(t, destination.as_deref(), h, probes)?;
                    out.push((i, r));
                }
                Check::EvidenceOrigins { req, min } => {
                    out.push((i, self.observe_origins(&t.id, req, *min, h)?));
                }
                Check::WorkerReceipt(r) => out.push((i, self.observe_receipt(t, r, h)?)),
                Check::Artifact { artifact, key } => {
                    out.push((i, self.observe_artifact(t, artifact, key.as_deref(), h)?));
                }
                _ => out.push((i, self.observe_file(c, place, hashes.map(|h| h.get(&i))))),
            }
        }
        Ok(out)
    }

    /// The task's operations a destination check reads: those its current holder recorded
    /// (an earlier holder's operation is not this claim's work), on `destination` (inside it)
    /// or all. None when the task holds more operations than one check reads
    /// (`OPS_PER_TASK_MAX`): a count cut before the filter would judge on part of them.
    fn ops_for(
        &self,
        t: &TaskRow,
        destination: Option<&str>,
        h: &RoomHandle,
    ) -> Outcome<Option<Vec<OpRow>>> {
        let within = destination.and_then(|d| Scope::parse("destination", d).ok());
        let all = h
            .index
            .ops_of_task(&t.id, OPS_PER_TASK_MAX + 1)
            .map_err(store_err)?;
        if all.len() > OPS_PER_TASK_MAX {
            return Ok(None);
        }
        Ok(Some(
            all.into_iter()
                .filter(|o| t.recipient.as_deref() == Some(o.agent.as_str()))
                .filter(|o| {
                    match (
                        &within,
                        o.destination
                            .as_deref()
                            .and_then(|d| Scope::parse("d", d).ok()),
                    ) {
                        (None, _) => true,
                        (Some(w), Some(d)) => w.contains(&d),
                        (Some(_), None) => false,
                    }
                })
                .collect(),
        ))
    }

    /// `destination`: each operation resolved `succeeded` in the ledger, and its effect
    /// observed present by a fresh probe.
    fn observe_destination(
        &self,
        t: &TaskRow,
        destination: Option<&str>,
        h: &RoomHandle,
        probes: Option<&std::collections::BTreeMap<String, Value>>,
    ) -> Outcome<CheckResult> {
        let Some(ops) = self.ops_for(t, destination, h)? else {
            return Ok(CheckResult {
                kind: "destination".into(),
                pass: false,
                detail: json!({"destination": destination, "observation": UNCONFIRMED,
                    "why": format!("the task holds more than {OPS_PER_TASK_MAX} operations; a check reads at most that many")}),
            });
        };
        let mut pass = !ops.is_empty();
        let mut each = Vec::new();
        for o in &ops {
            let seen = probes.and_then(|p| p.get(&o.id)).cloned().unwrap_or_else(|| {
                json!({"effect_present": UNCONFIRMED, "why": "not observed before the transition; try again"})
            });
            let present = seen["effect_present"] == true;
            pass &=
                o.status() == "resolved" && o.outcome.as_deref() == Some("succeeded") && present;
            each.push(json!({"operation_id": o.id, "destination": o.destination,
                "status": o.status(), "outcome": o.outcome, "effect_present": seen["effect_present"],
                "observation": seen}));
        }
        let mut detail = json!({"destination": destination, "operations": each});
        if ops.is_empty() {
            detail["observation"] = json!("no_operation");
            detail["why"] = json!("the task recorded no operation here (op_begin)");
        }
        if let [one] = each.as_slice() {
            for k in ["operation_id", "status", "effect_present"] {
                detail[k] = one[k].clone();
            }
        }
        Ok(CheckResult {
            kind: "destination".into(),
            pass,
            detail,
        })
    }

    /// Observe each operation's effect afresh with its probe (a process: outside every lock),
    /// each within what is left of the evaluation's time.
    pub(crate) fn run_probes(
        &self,
        ops: &[OpRow],
        place: &Place,
        deadline_ms: u64,
    ) -> std::collections::BTreeMap<String, Value> {
        let allowed = self.policy().acceptance_commands;
        ops.iter()
            .map(|o| {
                let seen = match o.probe.as_deref().map(serde_json::from_str::<Probe>) {
                    None => json!({"effect_present": UNCONFIRMED, "why": "no probe was declared with op_begin"}),
                    Some(Err(e)) => json!({"effect_present": UNCONFIRMED, "why": format!("stored probe unreadable: {e}")}),
                    Some(Ok(p)) if !allowed.contains(&p.program) => {
                        json!({"effect_present": UNCONFIRMED, "why": "the probe's program is no longer on the owner's allowlist"})
                    }
                    Some(Ok(_)) if self.time_left_ms(deadline_ms).is_none() => {
                        json!({"effect_present": UNCONFIRMED, "why": BUDGET_SPENT})
                    }
                    Some(Ok(p)) => {
                        let left = self.time_left_ms(deadline_ms).unwrap_or(1);
                        // a probe observes: the project is read-only to it, always
                        let req = RunRequest {
                            program: PathBuf::from(&p.program),
                            args: p.args.clone(),
                            cwd: place.root.clone().unwrap_or_else(|| PathBuf::from("/")),
                            timeout_ms: p.timeout_ms.min(left),
                            project: place.root.clone(),
                            project_write: false,
                            network: p.network,
                            stdin: Vec::new(),
                            stdout_bytes_max: 0,
                        };
                        match self.env.runner.run(&req) {
                            Err(e) => json!({"effect_present": UNCONFIRMED, "error": e.to_string(),
                                "error_kind": format!("{:?}", e.kind())}),
                            Ok(out) if out.timed_out => json!({"effect_present": UNCONFIRMED, "timed_out": true}),
                            Ok(out) if !out.job_empty => json!({"effect_present": UNCONFIRMED,
                                "why": "processes of the probe were still running after it ended"}),
                            Ok(out) => json!({"effect_present": out.exit_code == Some(0), "exit_code": out.exit_code}),
                        }
                    }
                };
                (o.id.clone(), seen)
            })
            .collect()
    }

    /// `pre`: for a `sha256` check, the digest taken outside the lock (Some(None): the file
    /// could not be hashed there, or changed while it was); None: nothing was taken outside,
    /// and the file is hashed here.
    fn observe_file(
        &self,
        c: &Check,
        place: &Place,
        pre: Option<Option<&Result<PreHash, PreErr>>>,
    ) -> CheckResult {
        let rel = c.path().expect("file checks have a path");
        let shown = place.shown(rel);
        let found = match &place.root {
            Some(root) => self.find(root, rel, &shown),
            None => Found::Unknown(
                json!({"path": shown, "error": "file checks need a project room",
                "error_kind": "NoProject", "observation": UNCONFIRMED}),
            ),
        };
        let (pass, detail) = match (c, found) {
            (_, Found::Unknown(d)) => (false, d),
            (Check::Sha256 { expected, .. }, Found::Dangling) => (
                false,
                json!({"path": shown, "expected": expected, "actual": null,
                    "observation": "dangling_link"}),
            ),
            (_, Found::Dangling) => (
                false,
                json!({"path": shown, "observation": "dangling_link",
                    "why": "a symlink whose target does not exist: the name is there, no file is"}),
            ),
            (Check::FileExists { .. }, Found::Present) => {
                (true, json!({"path": shown, "observation": "present"}))
            }
            (Check::FileExists { .. }, Found::Absent) => {
                (false, json!({"path": shown, "observation": "absent"}))
            }
            (Check::FileAbsent { .. }, Found::Present) => {
                (false, json!({"path": shown, "observation": "present"}))
            }
            (Check::FileAbsent { .. }, Found::Absent) => {
                (true, json!({"path": shown, "observation": "absent"}))
            }
            (Check::Sha256 { expected, .. }, Found::Absent) => (
                false,
                json!({"path": shown, "expected": expected, "actual": null, "observation": "absent"}),
            ),
            (Check::Sha256 { expected, .. }, Found::Present) => {
                let root = place
                    .root
                    .as_deref()
                    .expect("a present file has a project root");
                // hashed outside the lock: it counts only while the file holds the stamp it was
                // taken under (a file up to 1 GiB is never read under the room's lock)
                if let Some(pre) = pre {
                    let now = self.env.fs.stamp(&root.join(rel)).ok();
                    if let Some(Err(e)) = pre {
                        return CheckResult {
                            kind: c.kind().into(),
                            pass: false,
                            detail: json!({"path": shown, "expected": expected,
                                "error": e.error, "error_kind": e.kind,
                                "observation": UNCONFIRMED}),
                        };
                    }
                    let kept = pre.and_then(|r| r.as_ref().ok());
                    return match kept.filter(|h| Some(h.stamp) == now) {
                        Some(h) => CheckResult {
                            kind: c.kind().into(),
                            pass: h.digest == *expected,
                            detail: json!({"path": shown, "expected": expected,
                                "actual": h.digest, "bytes": h.bytes}),
                        },
                        None => CheckResult {
                            kind: c.kind().into(),
                            pass: false,
                            detail: json!({"path": shown, "expected": expected,
                                "observation": UNCONFIRMED,
                                "why": "the file changed (or could not be read) while it was hashed outside the room's lock; evaluate again"}),
                        },
                    };
                }
                // read beneath the root whatever the path resolves to now, not the checked path
                match self.env.fs.sha256_beneath(root, std::path::Path::new(rel)) {
                    Err(e) => {
                        let mut d = unconfirmed(&shown, &e);
                        d["expected"] = json!(expected);
                        (false, d)
                    }
                    Ok((actual, bytes)) => (
                        actual == *expected,
                        json!({"path": shown, "expected": expected, "actual": actual, "bytes": bytes}),
                    ),
                }
            }
            (
                Check::Command { .. }
                | Check::Destination { .. }
                | Check::EvidenceOrigins { .. }
                | Check::WorkerReceipt(_)
                | Check::Artifact { .. },
                _,
            ) => {
                unreachable!("observe_now observes files only here")
            }
        };
        CheckResult {
            kind: c.kind().into(),
            pass,
            detail,
        }
    }

    /// Resolve `rel` under `root` with `try_exists` semantics, and refuse to measure anything
    /// a symlink leads outside the root.
    fn find(&self, root: &Path, rel: &str, shown: &str) -> Found {
        let fs = &self.env.fs;
        let full = root.join(rel);
        match fs.try_exists(&full) {
            Err(e) => Found::Unknown(unconfirmed(shown, &e)),
            Ok(true) => match fs.canonicalize(&full) {
                Err(e) => Found::Unknown(unconfirmed(shown, &e)),
                Ok(c) if c.starts_with(root) => Found::Present,
                Ok(_) => Found::Unknown(outside(shown)),
            },
            Ok(false) => {
                // nothing at the end of the path: but is the name itself there (a symlink
                // whose target is missing)? a name that exists is not absent
                match fs.object_id(&full) {
                    Ok(_) => return self.dangling(root, &full, shown),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Found::Unknown(unconfirmed(shown, &e)),
                }
                // absent: but absent where? the nearest existing ancestor must be ours
                for a in full.ancestors().skip(1) {
                    match fs.try_exists(a) {
                        Err(e) => return Found::Unknown(unconfirmed(shown, &e)),
                        Ok(false) => continue,
                        Ok(true) => {
                            return match fs.canonicalize(a) {
                                Err(e) => Found::Unknown(unconfirmed(shown, &e)),
                                Ok(c) if c.starts_with(root) => Found::Absent,
                                Ok(_) => Found::Unknown(outside(shown)),
                            };
                        }
                    }
                }
                Found::Unknown(outside(shown))
            }
        }
    }

    /// A name at `full` that leads nowhere: a symlink whose target is missing. Inside the
    /// root it is a name that exists (never absent); leading out of the root, or anywhere
    /// that cannot be told, it is unconfirmed.
    fn dangling(&self, root: &Path, full: &Path, shown: &str) -> Found {
        let fs = &self.env.fs;
        let target = match fs.read_link(full) {
            Ok(t) => t,
            Err(e) => return Found::Unknown(unconfirmed(shown, &e)),
        };
        let Some(parent) = full.parent() else {
            return Found::Unknown(outside(shown));
        };
        let parent = match fs.canonicalize(parent) {
            Ok(p) => p,
            Err(e) => return Found::Unknown(unconfirmed(shown, &e)),
        };
        // where the target would be: its nearest existing ancestor, resolved, must be ours,
        // and nothing after it may climb out
        let aimed = parent.join(target);
        let mut rest_climbs = false;
        for a in aimed.ancestors() {
            match fs.try_exists(a) {
                Err(e) => return Found::Unknown(unconfirmed(shown, &e)),
                Ok(false) => {
                    rest_climbs |= a.file_name().is_none_or(|n| n == ".." || n == ".");
                    continue;
                }
                Ok(true) => {
                    return match fs.canonicalize(a) {
                        Err(e) => Found::Unknown(unconfirmed(shown, &e)),
                        Ok(c) if c.starts_with(root) && !rest_climbs => Found::Dangling,
                        Ok(_) => Found::Unknown(outside(shown)),
                    };
                }
            }
        }
        Found::Unknown(outside(shown))
    }

    /// Keep `ev` as the task's newest evaluation.
    pub(crate) fn record_evaluation(&self, ev: &Evaluation) -> Outcome<()> {
        let row = TaskCheckRow {
            task: ev.task.clone(),
            at_ms: self.now_ms(),
            pass: ev.acceptance_pass,
            evaluation: ev.to_value().to_string(),
        };
        self.control().record_task_check(&row).map_err(store_err)
    }

    /// The task's newest evaluation, with when it was made.
    pub(crate) fn last_evaluation(&self, task: &str) -> Outcome<Value> {
        let row = self.control().task_check(task).map_err(store_err)?;
        Ok(match row {
            None => Value::Null,
            Some(r) => {
                let mut v: Value = serde_json::from_str(&r.evaluation).map_err(|e| {
                    Refusal::storage(format!("stored evaluation of {task} unreadable: {e}"))
                })?;
                v["at_ms"] = json!(r.at_ms);
                v
            }
        })
    }
}

/// Merge command and file results back into the declared order.
pub(crate) fn merge(task: &str, n: usize, mut parts: Vec<(usize, CheckResult)>) -> Evaluation {
    parts.sort_by_key(|(i, _)| *i);
    assert_eq!(
        parts.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>(),
        "every declared check is evaluated exactly once"
    );
    Evaluation::new(task, parts.into_iter().map(|(_, r)| r).collect())
}

/// The refusal of a `done` whose checks did not all pass, carrying the evaluation.
pub(crate) fn failed(ev: &Evaluation) -> Refusal {
    let failing: Vec<String> = ev
        .acceptance_results
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.pass)
        .map(|(i, r)| format!("{} (accept[{i}])", r.kind))
        .collect();
    Refusal::new(
        Code::TaskAcceptanceFailed,
        format!(
            "task {} is not done: {} of {} checks failed: {}",
            ev.task,
            failing.len(),
            ev.acceptance_results.len(),
            failing.join(", ")
        ),
    )
    .detail(ev.to_value())
    .hint("produce what the failing checks measure, then done again (task_accept_check evaluates without closing)")
}

impl Engine {
    /// Whether a new task may declare `checks`: file checks measure a project, a `sha256`
    /// reads an in-scope file when the task names file scopes, and a command must be on the
    /// owner's allowlist now (it is checked again when it runs).
    pub(crate) fn admit_checks(
        &self,
        checks: &[Check],
        in_project: bool,
        scopes: &[String],
    ) -> Outcome<()> {
        let file_scopes: Vec<room_core::scope::Scope> = scopes
            .iter()
            .filter_map(|s| room_core::scope::Scope::parse("scopes", s).ok())
            .filter(|s| s.namespace == "file")
            .collect();
        let allowed = self.policy().acceptance_commands;
        for (i, c) in checks.iter().enumerate() {
            match c {
                Check::Command { program, .. } if !allowed.iter().any(|a| a == program) => {
                    return Err(Refusal::new(
                        Code::AcceptanceCommandNotAllowed,
                        format!("accept[{i}]: {program} is not on the owner's command allowlist"),
                    )
                    .detail(json!({"field": format!("accept[{i}].program"), "program": program}))
                    .hint(format!(
                        "the owner can allow it in config.toml: [acceptance] commands = [\"{program}\"]"
                    )));
                }
                Check::Command { .. }
                | Check::Destination { .. }
                | Check::EvidenceOrigins { .. }
                | Check::Artifact { .. } => {}
                _ if !in_project => {
                    return Err(Refusal::invalid(
                        &format!("accept[{i}]"),
                        "file checks need a project room: their paths are relative to its root",
                    ));
                }
                Check::Sha256 { path, .. } if !file_scopes.is_empty() => {
                    let me = room_core::scope::Scope::parse("path", &format!("file:{path}"))?;
                    let inside = file_scopes.iter().any(|s| {
                        s.resource == me.resource
                            || me.resource.starts_with(&format!("{}/", s.resource))
                    });
                    if !inside {
                        return Err(Refusal::invalid(
                            &format!("accept[{i}].path"),
                            "a sha256 check reads an in-scope file: the path is outside the task's file scopes",
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `done`'s command checks, run before the transition and outside every lock, when the
    /// caller holds the claimed task (otherwise the plan refuses, and nothing runs).
    pub(crate) fn pre_run(
        &self,
        caller: &str,
        room: &str,
        task: Option<&str>,
    ) -> Outcome<Option<PreRun>> {
        let Some(task) = task.filter(|t| room_core::id::is_task_id(t)) else {
            return Ok(None);
        };
        let Some(t) = self.control().task(task).map_err(store_err)? else {
            return Ok(None);
        };
        // only a done the plan could accept runs anything: the task of this room, claimed by
        // the caller, its lease (if scoped) still held
        let held = t.status == room_core::TaskStatus::Claimed
            && t.recipient.as_deref() == Some(caller)
            && t.room == room
            && (t.scopes.is_empty() || t.lease_held);
        // processes to run, or files to hash: both outside every lock
        let outside = t.acceptance.iter().any(|c| {
            matches!(
                c,
                Check::Command { .. } | Check::Destination { .. } | Check::Sha256 { .. }
            )
        });
        if !held || !outside {
            return Ok(None);
        }
        self.pre_run_task(&t).map(Some)
    }

    /// Run a task's commands and probe its operations, outside every lock: one evaluation
    /// of a task at a time, at most `EVALUATIONS_MAX` in the daemon
    /// (`acceptance_evaluation_busy`), all within the owner's `evaluation_ms_max`.
    pub(crate) fn pre_run_task(&self, t: &TaskRow) -> Outcome<PreRun> {
        let _slot = self.evaluations.enter(&t.id)?;
        let place = self.acceptance_place(t)?;
        let deadline_ms = self
            .now_ms()
            .saturating_add(self.policy().evaluation_ms_max);
        let results = self.run_commands(t, &place, deadline_ms);
        let probes = if t
            .acceptance
            .iter()
            .any(|c| matches!(c, Check::Destination { .. }))
        {
            let handle = self.room_handle(&t.room)?;
            // read the ledger under the room lock, probe after releasing it
            let ops: Vec<OpRow> = {
                let h = lock_room(&handle);
                h.index
                    .ops_of_task(&t.id, OPS_PER_TASK_MAX)
                    .map_err(store_err)?
                    .into_iter()
                    .filter(|o| t.recipient.as_deref() == Some(o.agent.as_str()))
                    .collect()
            };
            self.run_probes(&ops, &place, deadline_ms)
        } else {
            Default::default()
        };
        Ok(PreRun {
            task: t.id.clone(),
            acceptance: t.acceptance.clone(),
            results,
            probes,
            hashes: self.pre_hash(t, &place),
        })
    }

    /// Hash each `sha256` check's file outside every lock, keeping a digest only when the
    /// file's stamp was the same before and after the read.
    fn pre_hash(&self, t: &TaskRow, place: &Place) -> Hashes {
        let fs = &self.env.fs;
        let Some(root) = place.root.as_deref() else {
            return Hashes::new();
        };
        let mut out = Hashes::new();
        for (i, c) in t.acceptance.iter().enumerate() {
            let Check::Sha256 { path, .. } = c else {
                continue;
            };
            let full = root.join(path);
            let err = |e: std::io::Error| PreErr {
                error: e.to_string(),
                kind: format!("{:?}", e.kind()),
            };
            let Ok(before) = fs.stamp(&full) else {
                // absent or unreadable now: the observation under the lock says which
                continue;
            };
            match fs.sha256_beneath(root, Path::new(path)) {
                Err(e) => {
                    out.insert(i, Err(err(e)));
                }
                Ok((digest, bytes)) if fs.stamp(&full).ok() == Some(before) => {
                    out.insert(
                        i,
                        Ok(PreHash {
                            stamp: before,
                            digest,
                            bytes,
                        }),
                    );
                }
                // written while it was read: nothing kept, the lock's recheck says so
                Ok(_) => {}
            }
        }
        out
    }

    /// Evaluate every check of `t`: commands from `pre` when they ran against these checks
    /// (else they count as not run, and fail), files now.
    pub(crate) fn evaluate(
        &self,
        t: &TaskRow,
        pre: Option<&PreRun>,
        h: &RoomHandle,
    ) -> Outcome<Evaluation> {
        let place = self.acceptance_place(t)?;
        let fresh = pre.filter(|p| p.task == t.id && p.acceptance == t.acceptance);
        let mut parts = self.observe_now(
            t,
            &place,
            h,
            fresh.map(|p| &p.probes),
            fresh.map(|p| &p.hashes),
        )?;
        match pre {
            Some(p) if p.task == t.id && p.acceptance == t.acceptance => {
                parts.extend(p.results.iter().cloned());
            }
            _ => parts.extend(
                t.acceptance
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.is_command())
                    .map(|(i, _)| {
                        let r = CheckResult {
                            kind: "command".into(),
                            pass: false,
                            detail: json!({"observation": "not_run",
                                "error": "the task changed while its commands ran; try again"}),
                        };
                        (i, r)
                    }),
            ),
        }
        Ok(merge(&t.id, t.acceptance.len(), parts))
    }
}
