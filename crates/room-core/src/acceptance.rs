//! Acceptance checks: what a task declares must be true of the world before it may close, in
//! the seed's shape (`{"kind": "file_exists", "path": "out.txt"}`). The engine evaluates them
//! against live files and processes, never on the worker's word; this module only says what a
//! well-formed check is and what a result looks like (the seed's Exhibits 4 and 5).
//!
//! `worker_receipt` reads the task's immutable submissions (the journaled proposal records),
//! never a worker-authored receipt, in the seed's three profiles (`basic`, `strict`,
//! `successor`); each profile admits exactly the fields the seed gives it.

use crate::refusal::Refusal;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Checks one task may declare.
pub const CHECKS_PER_TASK_MAX: usize = 64;
/// Requirements one task may state, and the length of each.
pub const REQUIREMENTS_PER_TASK_MAX: usize = 32;
pub const REQUIREMENT_BYTES_MAX: usize = 512;
/// A file path in a check: relative to the project root, like a file scope.
pub const PATH_BYTES_MAX: usize = 512;
/// A `command` check's bounds.
pub const COMMAND_TIMEOUT_MS_DEFAULT: u64 = 60_000;
pub const COMMAND_TIMEOUT_MS_MAX: u64 = 600_000;
pub const COMMAND_ARGS_MAX: usize = 64;
pub const COMMAND_ARG_BYTES_MAX: usize = 4_096;
pub const COMMAND_PROGRAM_BYTES_MAX: usize = 1_024;

/// The kinds the seed defines, in its order, then the blackboard's.
pub const KINDS: [&str; 8] = [
    "sha256",
    "file_exists",
    "file_absent",
    "command",
    "evidence_origins",
    "destination",
    "worker_receipt",
    "artifact",
];

/// One declared check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// The live SHA-256 of the file at `path` equals `expected` (64 lower-case hex).
    Sha256 { path: String, expected: String },
    /// The file at `path` exists (an observation error is `unconfirmed`, never success).
    FileExists { path: String },
    /// Nothing is at `path` (an observation error is `unconfirmed`, never absence).
    FileAbsent { path: String },
    /// `program` (absolute, on the owner's allowlist) with exactly `args` exits with
    /// `exit_code` within `timeout_ms`, run in the project root without a shell, confined as
    /// a worker is: its own job, no state directory, the project read-only unless
    /// `project_write`, no network unless `network`.
    Command {
        program: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
        timeout_ms: u64,
        exit_code: i32,
        /// The check may write the project tree (a build that writes its outputs).
        #[serde(default, skip_serializing_if = "is_false")]
        project_write: bool,
        /// The check may reach the network.
        #[serde(default, skip_serializing_if = "is_false")]
        network: bool,
    },
    /// Every operation the task recorded (on `destination`, if given; at least one) is
    /// resolved `succeeded` in the ledger, and its probe observes the effect present now.
    Destination {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        destination: Option<String>,
    },
    /// At least `min` (1..=16) distinct first-hand origins, after collapsing lineage, behind
    /// the evidence registered for the task's requirement `req`.
    EvidenceOrigins { req: String, min: u32 },
    /// The task's submissions (its journaled proposal records) prove the worker's return, in
    /// one of three profiles (see [`Receipt`]).
    WorkerReceipt(Box<Receipt>),
    /// The room's blackboard holds a version of `artifact`/`key` written for this task by its
    /// holder, whose content still matches its digest and its kind's schema (a phase run's
    /// `writes`).
    Artifact {
        artifact: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
}

/// A `worker_receipt` check. Which fields are present depends on the profile; `parse` admits
/// no other combination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    pub profile: ReceiptProfile,
    /// `task`: this task's submissions; `successor`: those of a task this one succeeds.
    pub proposals: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Basic: terminal submissions required (1..=`RECEIPT_MIN_MAX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    /// Strict: the row the submission changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ReceiptTarget>,
    /// Strict: exactly the fields the submission set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal_id: Option<String>,
    /// Successor: SHA-256 of the change asked for (canonical JSON of the record's `change`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal_sha256: Option<String>,
    /// Successor: SHA-256 of the whole journaled record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_sha256: Option<String>,
    /// Successor: SHA-256 of what the daemon did (`ProposalRecord::outcome_view`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptProfile {
    /// At least `min` terminal submissions, none pending, in doubt or unread by its worker.
    Basic,
    /// One applied submission of exactly this worker, row and fields, version moved by one,
    /// whose result the same session read and answered with a Room message citing it.
    Strict,
    /// A fresh acknowledgment of a historical result of a superseded task, pinned by eight
    /// values; it never stands for the original session's return.
    Successor,
}

impl ReceiptProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptProfile::Basic => "basic",
            ReceiptProfile::Strict => "strict",
            ReceiptProfile::Successor => "successor",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptTarget {
    pub path: String,
    pub key: String,
}

/// A basic receipt's `min`, at most.
pub const RECEIPT_MIN_MAX: u32 = 64;
/// The outcomes a proposal record may have.
pub const PROPOSAL_OUTCOMES: [&str; 3] = ["applied", "not_applied", "in_doubt"];

/// Bounds of an `evidence_origins` check.
pub const EVIDENCE_ORIGINS_MIN_MAX: u32 = 16;

/// A requirement label (`R1`, `perf-budget`): 1..=32 of A-Z a-z 0-9 _ -.
pub fn valid_req(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Check {
    pub fn kind(&self) -> &'static str {
        match self {
            Check::Sha256 { .. } => "sha256",
            Check::FileExists { .. } => "file_exists",
            Check::FileAbsent { .. } => "file_absent",
            Check::Command { .. } => "command",
            Check::Destination { .. } => "destination",
            Check::EvidenceOrigins { .. } => "evidence_origins",
            Check::WorkerReceipt(_) => "worker_receipt",
            Check::Artifact { .. } => "artifact",
        }
    }

    /// The project-relative path a file check observes.
    pub fn path(&self) -> Option<&str> {
        match self {
            Check::Sha256 { path, .. }
            | Check::FileExists { path }
            | Check::FileAbsent { path } => Some(path),
            Check::Command { .. }
            | Check::Destination { .. }
            | Check::EvidenceOrigins { .. }
            | Check::WorkerReceipt(_)
            | Check::Artifact { .. } => None,
        }
    }

    /// Checks that run processes (commands, destination probes): outside every lock.
    pub fn is_command(&self) -> bool {
        matches!(self, Check::Command { .. })
    }

    /// Parse one check from its JSON; `field` (for example `accept[2]`) names it in errors.
    pub fn parse(field: &str, v: &Value) -> Result<Check, Refusal> {
        let o = v.as_object().ok_or_else(|| {
            Refusal::invalid(
                field,
                "a check is an object such as {\"kind\":\"file_exists\",\"path\":\"out.txt\"}",
            )
        })?;
        let kind = o.get("kind").and_then(Value::as_str).ok_or_else(|| {
            Refusal::invalid(
                &format!("{field}.kind"),
                format!("must be one of {}", KINDS.join(", ")),
            )
        })?;
        let f = Fields { field, o };
        let check = match kind {
            "sha256" => {
                f.only(&["kind", "path", "expected"])?;
                let expected = f.string("expected", 64)?;
                if expected.len() != 64
                    || !expected
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(Refusal::invalid(
                        &format!("{field}.expected"),
                        "must be 64 lower-case hex digits",
                    ));
                }
                Check::Sha256 {
                    path: f.path()?,
                    expected,
                }
            }
            "file_exists" => {
                f.only(&["kind", "path"])?;
                Check::FileExists { path: f.path()? }
            }
            "file_absent" => {
                f.only(&["kind", "path"])?;
                Check::FileAbsent { path: f.path()? }
            }
            "command" => {
                f.only(&[
                    "kind",
                    "program",
                    "args",
                    "timeout_ms",
                    "exit_code",
                    "project_write",
                    "network",
                ])?;
                parse_command(&f)?
            }
            "destination" => {
                f.only(&["kind", "destination"])?;
                let destination = match f.o.get("destination") {
                    None | Some(Value::Null) => None,
                    Some(_) => {
                        let d = f.string("destination", 600)?;
                        crate::scope::Scope::parse(&format!("{field}.destination"), &d)?;
                        Some(d)
                    }
                };
                Check::Destination { destination }
            }
            "evidence_origins" => {
                f.only(&["kind", "req", "min"])?;
                let req = f.string("req", 32)?;
                if !valid_req(&req) {
                    return Err(Refusal::invalid(
                        &format!("{field}.req"),
                        "must be 1..=32 of A-Z a-z 0-9 _ -",
                    ));
                }
                let min = match f.o.get("min") {
                    None | Some(Value::Null) => 1,
                    Some(v) => match v.as_u64() {
                        Some(m) if (1..=u64::from(EVIDENCE_ORIGINS_MIN_MAX)).contains(&m) => {
                            m as u32
                        }
                        _ => {
                            return Err(Refusal::invalid(
                                &format!("{field}.min"),
                                format!("must be 1..={EVIDENCE_ORIGINS_MIN_MAX}"),
                            ));
                        }
                    },
                };
                Check::EvidenceOrigins { req, min }
            }
            "worker_receipt" => Check::WorkerReceipt(Box::new(parse_receipt(&f)?)),
            "artifact" => {
                f.only(&["kind", "artifact", "key"])?;
                let kind = f.string("artifact", 128)?;
                crate::artifact::ArtifactKind::parse(&format!("{field}.artifact"), &kind)?;
                let key = match f.o.get("key") {
                    None | Some(Value::Null) => None,
                    Some(_) => {
                        let k = f.string("key", 64)?;
                        crate::artifact::check_key(&format!("{field}.key"), &k)?;
                        Some(k)
                    }
                };
                Check::Artifact {
                    artifact: kind,
                    key,
                }
            }
            other => {
                return Err(Refusal::invalid(
                    &format!("{field}.kind"),
                    format!("unknown kind {other:?}; one of {}", KINDS.join(", ")),
                ));
            }
        };
        Ok(check)
    }
}

/// A `worker_receipt` check: its profile decides which fields it has (the seed's law).
fn parse_receipt(f: &Fields<'_>) -> Result<Receipt, Refusal> {
    let field = |n: &str| format!("{}.{n}", f.field);
    let profile = match f.o.get("profile").and_then(Value::as_str) {
        Some("basic") => ReceiptProfile::Basic,
        Some("strict") => ReceiptProfile::Strict,
        Some("successor") => ReceiptProfile::Successor,
        _ => {
            return Err(Refusal::invalid(
                &field("profile"),
                "must be basic, strict or successor",
            ));
        }
    };
    let want = match profile {
        ReceiptProfile::Successor => "successor",
        _ => "task",
    };
    let proposals = match f.o.get("proposals") {
        None | Some(Value::Null) if profile != ReceiptProfile::Successor => want.to_string(),
        Some(Value::String(s)) if s == want => want.to_string(),
        _ => {
            return Err(Refusal::invalid(
                &field("proposals"),
                format!("a {} receipt reads \"{want}\" proposals", profile.as_str()),
            ));
        }
    };
    let mut r = Receipt {
        profile,
        proposals,
        worker: None,
        min: None,
        target: None,
        fields: Vec::new(),
        proposal_id: None,
        proposal_sha256: None,
        record_sha256: None,
        outcome_sha256: None,
        outcome: None,
    };
    if let Some(w) = f.o.get("worker").filter(|v| !v.is_null()) {
        let w = w.as_str().unwrap_or_default();
        crate::name::validate(&field("worker"), w)?;
        r.worker = Some(w.to_string());
    }
    match profile {
        ReceiptProfile::Basic => {
            f.only(&["kind", "profile", "proposals", "worker", "min"])?;
            r.min = Some(match f.o.get("min") {
                None | Some(Value::Null) => 1,
                Some(v) => match v.as_u64() {
                    Some(m) if (1..=u64::from(RECEIPT_MIN_MAX)).contains(&m) => m as u32,
                    _ => {
                        return Err(Refusal::invalid(
                            &field("min"),
                            format!("must be 1..={RECEIPT_MIN_MAX}"),
                        ));
                    }
                },
            });
        }
        ReceiptProfile::Strict => {
            for forbidden in ["outcome", "min"] {
                if f.o.contains_key(forbidden) {
                    return Err(Refusal::invalid(
                        &field(forbidden),
                        "a strict receipt forbids outcome and min: it proves one applied submission",
                    ));
                }
            }
            f.only(&[
                "kind",
                "profile",
                "proposals",
                "worker",
                "target",
                "fields",
                "proposal_id",
            ])?;
            required(f, "worker", r.worker.is_some(), "strict")?;
            r.target = Some(parse_target(f)?);
            r.fields = parse_fields(f)?;
            if f.o.get("proposal_id").is_some_and(|v| !v.is_null()) {
                r.proposal_id = Some(proposal_id(f)?);
            }
        }
        ReceiptProfile::Successor => {
            let pins = [
                "worker",
                "proposal_id",
                "proposal_sha256",
                "record_sha256",
                "outcome_sha256",
                "outcome",
            ];
            f.only(&[
                "kind",
                "profile",
                "proposals",
                "worker",
                "proposal_id",
                "proposal_sha256",
                "record_sha256",
                "outcome_sha256",
                "outcome",
            ])?;
            for pin in pins {
                required(
                    f,
                    pin,
                    f.o.get(pin).is_some_and(|v| !v.is_null()),
                    "successor",
                )?;
            }
            r.proposal_id = Some(proposal_id(f)?);
            r.proposal_sha256 = Some(hex64(f, "proposal_sha256")?);
            r.record_sha256 = Some(hex64(f, "record_sha256")?);
            r.outcome_sha256 = Some(hex64(f, "outcome_sha256")?);
            let outcome = f.string("outcome", 16)?;
            if !PROPOSAL_OUTCOMES.contains(&outcome.as_str()) {
                return Err(Refusal::invalid(
                    &field("outcome"),
                    format!("one of {}", PROPOSAL_OUTCOMES.join(", ")),
                ));
            }
            r.outcome = Some(outcome);
        }
    }
    Ok(r)
}

fn required(f: &Fields<'_>, name: &str, present: bool, profile: &str) -> Result<(), Refusal> {
    if present {
        return Ok(());
    }
    Err(Refusal::invalid(
        &format!("{}.{name}", f.field),
        match profile {
            "successor" => {
                "a successor receipt pins all eight: proposals \"successor\", worker, proposal_id, proposal_sha256, record_sha256, outcome_sha256 and outcome"
            }
            _ => "a strict receipt names its worker, target and fields",
        },
    ))
}

fn hex64(f: &Fields<'_>, name: &str) -> Result<String, Refusal> {
    let s = f.string(name, 64)?;
    if !crate::canon::is_sha256_hex(&s) {
        return Err(Refusal::invalid(
            &format!("{}.{name}", f.field),
            "must be 64 lower-case hex digits",
        ));
    }
    Ok(s)
}

fn proposal_id(f: &Fields<'_>) -> Result<String, Refusal> {
    let s = f.string("proposal_id", 20)?;
    if !crate::id::is_proposal_id(&s) {
        return Err(Refusal::invalid(
            &format!("{}.proposal_id", f.field),
            "a proposal id: prp_ and 16 lower-case hex digits",
        ));
    }
    Ok(s)
}

fn parse_target(f: &Fields<'_>) -> Result<ReceiptTarget, Refusal> {
    let name = format!("{}.target", f.field);
    let o =
        f.o.get("target")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                Refusal::invalid(
                    &name,
                    "the row a strict receipt proves: {\"path\": \"data.json\", \"key\": \"2\"}",
                )
            })?;
    let t = Fields { field: &name, o };
    t.only(&["path", "key"])?;
    Ok(ReceiptTarget {
        path: t.path()?,
        key: t.string("key", crate::stage::STAGE_PATH_BYTES_MAX)?,
    })
}

fn parse_fields(f: &Fields<'_>) -> Result<Vec<String>, Refusal> {
    let name = format!("{}.fields", f.field);
    let list = f.o.get("fields").and_then(Value::as_array);
    let bad = || {
        Refusal::invalid(
            &name,
            format!(
                "the fields the submission set: 1..={} distinct column names",
                crate::stage::PROPOSAL_COLUMNS_MAX
            ),
        )
    };
    let list = list
        .filter(|l| !l.is_empty() && l.len() <= crate::stage::PROPOSAL_COLUMNS_MAX)
        .ok_or_else(bad)?;
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for v in list {
        match v.as_str() {
            Some(s)
                if !s.is_empty()
                    && s.len() <= 256
                    && !s.chars().any(char::is_control)
                    && !out.iter().any(|o| o == s) =>
            {
                out.push(s.to_string())
            }
            _ => return Err(bad()),
        }
    }
    out.sort();
    Ok(out)
}

fn parse_command(f: &Fields<'_>) -> Result<Check, Refusal> {
    let program = f.string("program", COMMAND_PROGRAM_BYTES_MAX)?;
    if !program.starts_with('/')
        || program
            .split('/')
            .skip(1)
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(Refusal::invalid(
            &format!("{}.program", f.field),
            "must be an absolute path without '.', '..' or empty components (no PATH lookup)",
        ));
    }
    let args = match f.o.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.len() <= COMMAND_ARGS_MAX => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x.as_str() {
                Some(s) if s.len() <= COMMAND_ARG_BYTES_MAX && !s.contains('\0') => {
                    Ok(s.to_string())
                }
                _ => Err(Refusal::invalid(
                    &format!("{}.args[{i}]", f.field),
                    format!(
                        "must be a string of at most {COMMAND_ARG_BYTES_MAX} bytes without NUL"
                    ),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(Refusal::invalid(
                &format!("{}.args", f.field),
                format!("must be a list of at most {COMMAND_ARGS_MAX} strings"),
            ));
        }
    };
    let timeout_ms = match f.o.get("timeout_ms") {
        None | Some(Value::Null) => COMMAND_TIMEOUT_MS_DEFAULT,
        Some(v) => match v.as_u64() {
            Some(t) if (1..=COMMAND_TIMEOUT_MS_MAX).contains(&t) => t,
            _ => {
                return Err(Refusal::invalid(
                    &format!("{}.timeout_ms", f.field),
                    format!("must be 1..={COMMAND_TIMEOUT_MS_MAX} milliseconds"),
                ));
            }
        },
    };
    let exit_code = match f.o.get("exit_code") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64().and_then(|c| i32::try_from(c).ok()) {
            Some(c) if (0..=255).contains(&c) => c,
            _ => {
                return Err(Refusal::invalid(
                    &format!("{}.exit_code", f.field),
                    "must be an integer 0..=255",
                ));
            }
        },
    };
    Ok(Check::Command {
        program,
        args,
        timeout_ms,
        exit_code,
        project_write: f.flag("project_write")?,
        network: f.flag("network")?,
    })
}

/// For `skip_serializing_if`: a flag left at its default is not written, so a check written
/// before the flag existed keeps its canonical bytes (and the digests taken over them).
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

struct Fields<'a> {
    field: &'a str,
    o: &'a Map<String, Value>,
}

impl Fields<'_> {
    /// An optional boolean, false when absent.
    fn flag(&self, name: &str) -> Result<bool, Refusal> {
        match self.o.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Refusal::invalid(
                &format!("{}.{name}", self.field),
                "must be true or false",
            )),
        }
    }

    fn only(&self, allowed: &[&str]) -> Result<(), Refusal> {
        match self.o.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(Refusal::invalid(
                &format!("{}.{k}", self.field),
                format!(
                    "unknown field; {} has {}",
                    self.o
                        .get("kind")
                        .and_then(Value::as_str)
                        .map_or("a target".to_string(), |k| format!("a {k:?} check")),
                    allowed
                        .iter()
                        .filter(|a| **a != "kind")
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            None => Ok(()),
        }
    }

    fn string(&self, name: &str, max: usize) -> Result<String, Refusal> {
        match self.o.get(name).and_then(Value::as_str) {
            Some(s) if !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control) => {
                Ok(s.to_string())
            }
            _ => Err(Refusal::invalid(
                &format!("{}.{name}", self.field),
                format!("must be a string of 1..={max} bytes without control characters"),
            )),
        }
    }

    /// A path relative to the project root, in the strict shape of a file scope: no leading
    /// or trailing `/`, no empty, `.` or `..` component, so it cannot climb out by spelling.
    fn path(&self) -> Result<String, Refusal> {
        let p = self.string("path", PATH_BYTES_MAX)?;
        crate::scope::Scope::parse(&format!("{}.path", self.field), &format!("file:{p}"))?;
        Ok(p)
    }
}

/// Parse a task's checks: at most `CHECKS_PER_TASK_MAX`, each named `accept[i]` in errors.
pub fn parse_list(list: &[Value]) -> Result<Vec<Check>, Refusal> {
    if list.len() > CHECKS_PER_TASK_MAX {
        return Err(Refusal::invalid(
            "accept",
            format!("at most {CHECKS_PER_TASK_MAX} checks"),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| Check::parse(&format!("accept[{i}]"), v))
        .collect()
}

/// Validate a task's requirements: short lines of text, at most `REQUIREMENTS_PER_TASK_MAX`.
pub fn check_requirements(list: &[String]) -> Result<(), Refusal> {
    if list.len() > REQUIREMENTS_PER_TASK_MAX {
        return Err(Refusal::invalid(
            "requirements",
            format!("at most {REQUIREMENTS_PER_TASK_MAX}"),
        ));
    }
    for (i, r) in list.iter().enumerate() {
        if r.trim().is_empty() || r.len() > REQUIREMENT_BYTES_MAX || r.chars().any(char::is_control)
        {
            return Err(Refusal::invalid(
                &format!("requirements[{i}]"),
                format!("must be 1..={REQUIREMENT_BYTES_MAX} bytes without control characters"),
            ));
        }
    }
    Ok(())
}

/// How an observation ended: measured, or not knowable (an error is never read as a value).
pub const UNCONFIRMED: &str = "unconfirmed";

/// One evaluated check, in the seed's shape: `{"kind", "pass", "detail"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub kind: String,
    pub pass: bool,
    pub detail: Value,
}

/// A whole evaluation: the seed's Exhibit 4 shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub task: String,
    pub acceptance_pass: bool,
    pub acceptance_results: Vec<CheckResult>,
}

impl Evaluation {
    pub fn new(task: &str, results: Vec<CheckResult>) -> Evaluation {
        Evaluation {
            task: task.into(),
            acceptance_pass: results.iter().all(|r| r.pass),
            acceptance_results: results,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("an evaluation serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::Code;
    use serde_json::json;

    fn parse(v: Value) -> Result<Check, Refusal> {
        Check::parse("accept[0]", &v)
    }

    #[test]
    fn checks_parse_in_the_seed_shape_and_round_trip() {
        let c = parse(json!({"kind": "file_exists", "path": "out/a.txt"})).unwrap();
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"kind": "file_exists", "path": "out/a.txt"})
        );
        let c = parse(json!({"kind": "command", "program": "/usr/bin/test", "args": ["-f", "x"]}))
            .unwrap();
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["timeout_ms"], COMMAND_TIMEOUT_MS_DEFAULT);
        assert_eq!(v["exit_code"], 0);
        assert_eq!(serde_json::from_value::<Check>(v).unwrap(), c);
    }

    #[test]
    fn bad_checks_name_their_field() {
        let cases = [
            (json!("x"), "accept[0]"),
            (json!({"path": "a"}), "accept[0].kind"),
            (json!({"kind": "nope"}), "accept[0].kind"),
            (json!({"kind": "file_exists"}), "accept[0].path"),
            (
                json!({"kind": "file_exists", "path": "../etc/passwd"}),
                "accept[0].path",
            ),
            (
                json!({"kind": "file_exists", "path": "/etc/passwd"}),
                "accept[0].path",
            ),
            (
                json!({"kind": "file_exists", "path": "a", "extra": 1}),
                "accept[0].extra",
            ),
            (
                json!({"kind": "sha256", "path": "a", "expected": "ABC"}),
                "accept[0].expected",
            ),
            (
                json!({"kind": "command", "program": "true"}),
                "accept[0].program",
            ),
            (
                json!({"kind": "command", "program": "/bin/../bin/true"}),
                "accept[0].program",
            ),
            (
                json!({"kind": "command", "program": "/bin/true", "args": [1]}),
                "accept[0].args[0]",
            ),
            (
                json!({"kind": "command", "program": "/bin/true", "timeout_ms": 0}),
                "accept[0].timeout_ms",
            ),
            (
                json!({"kind": "command", "program": "/bin/true", "exit_code": 300}),
                "accept[0].exit_code",
            ),
        ];
        for (v, field) in cases {
            let r = parse(v.clone()).unwrap_err();
            assert_eq!(r.code, Code::InvalidArgument, "{v}");
            assert_eq!(r.detail["field"], field, "{v}: {r}");
        }
    }

    #[test]
    fn each_receipt_profile_admits_exactly_its_fields() {
        let h = "a".repeat(64);
        let basic = parse(json!({"kind": "worker_receipt", "profile": "basic"})).unwrap();
        assert_eq!(
            serde_json::to_value(&basic).unwrap(),
            json!({"kind": "worker_receipt", "profile": "basic", "proposals": "task", "min": 1})
        );
        let strict = json!({"kind": "worker_receipt", "profile": "strict", "worker": "beta",
            "target": {"path": "data.json", "key": "2"}, "fields": ["name", "b"]});
        let c = parse(strict.clone()).unwrap();
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["fields"], json!(["b", "name"]), "sorted: a set");
        assert_eq!(serde_json::from_value::<Check>(v).unwrap(), c);
        let successor = json!({"kind": "worker_receipt", "profile": "successor",
            "proposals": "successor", "worker": "beta", "proposal_id": "prp_0123456789abcdef",
            "proposal_sha256": h, "record_sha256": h, "outcome_sha256": h, "outcome": "applied"});
        let c = parse(successor.clone()).unwrap();
        assert_eq!(
            serde_json::from_value::<Check>(serde_json::to_value(&c).unwrap()).unwrap(),
            c
        );
        let with = |base: &Value, k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        let without = |base: &Value, k: &str| {
            let mut b = base.clone();
            b.as_object_mut().unwrap().remove(k);
            b
        };
        let cases = [
            (json!({"kind": "worker_receipt"}), "accept[0].profile"),
            (
                json!({"kind": "worker_receipt", "profile": "lenient"}),
                "accept[0].profile",
            ),
            (
                json!({"kind": "worker_receipt", "profile": "basic", "min": 0}),
                "accept[0].min",
            ),
            (
                json!({"kind": "worker_receipt", "profile": "basic", "min": 65}),
                "accept[0].min",
            ),
            (
                json!({"kind": "worker_receipt", "profile": "basic", "proposals": "successor"}),
                "accept[0].proposals",
            ),
            (
                json!({"kind": "worker_receipt", "profile": "basic", "target": {}}),
                "accept[0].target",
            ),
            (
                with(&strict, "outcome", json!("applied")),
                "accept[0].outcome",
            ),
            (with(&strict, "min", json!(1)), "accept[0].min"),
            (without(&strict, "worker"), "accept[0].worker"),
            (with(&strict, "worker", json!("../x")), "accept[0].worker"),
            (without(&strict, "target"), "accept[0].target"),
            (
                with(&strict, "target", json!({"path": "../a", "key": "1"})),
                "accept[0].target.path",
            ),
            (
                with(&strict, "target", json!({"path": "a", "key": "1", "x": 1})),
                "accept[0].target.x",
            ),
            (without(&strict, "fields"), "accept[0].fields"),
            (
                with(&strict, "fields", json!(["a", "a"])),
                "accept[0].fields",
            ),
            (
                with(&strict, "proposal_id", json!("prp_xyz")),
                "accept[0].proposal_id",
            ),
            (without(&successor, "proposals"), "accept[0].proposals"),
            (
                with(&successor, "proposals", json!("task")),
                "accept[0].proposals",
            ),
            (
                without(&successor, "record_sha256"),
                "accept[0].record_sha256",
            ),
            (without(&successor, "outcome"), "accept[0].outcome"),
            (without(&successor, "worker"), "accept[0].worker"),
            (
                with(&successor, "outcome", json!("done")),
                "accept[0].outcome",
            ),
            (
                with(&successor, "outcome_sha256", json!("AB")),
                "accept[0].outcome_sha256",
            ),
            (with(&successor, "min", json!(1)), "accept[0].min"),
        ];
        for (v, field) in cases {
            let r = parse(v.clone()).unwrap_err();
            assert_eq!(r.code, Code::InvalidArgument, "{v}");
            assert_eq!(r.detail["field"], field, "{v}: {r}");
        }
    }

    #[test]
    fn an_evaluation_passes_only_when_every_check_does() {
        let ok = CheckResult {
            kind: "file_exists".into(),
            pass: true,
            detail: json!({}),
        };
        let bad = CheckResult {
            pass: false,
            ..ok.clone()
        };
        assert!(Evaluation::new("t", vec![ok.clone()]).acceptance_pass);
        assert!(!Evaluation::new("t", vec![ok, bad]).acceptance_pass);
    }
}
