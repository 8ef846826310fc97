//! Acceptance checks: what a task declares must be true of the world before it may close, in
//! the seed's shape (`{"kind": "file_exists", "path": "out.txt"}`). The engine evaluates them
//! against live files and processes, never on the worker's word; this module only says what a
//! well-formed check is and what a result looks like (the seed's Exhibits 4 and 5).
//!
//! Six of the seven kinds are measured today. `worker_receipt` needs worker submissions, which
//! do not exist yet: a task naming it is refused (`acceptance_kind_unsupported`) rather than
//! created with a check nobody can evaluate.

use crate::refusal::{Code, Refusal};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

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

/// The kinds the seed defines, in its order.
pub const KINDS: [&str; 7] = [
    "sha256",
    "file_exists",
    "file_absent",
    "command",
    "evidence_origins",
    "destination",
    "worker_receipt",
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
    /// `exit_code` within `timeout_ms`, run in the project root without a shell.
    Command {
        program: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
        timeout_ms: u64,
        exit_code: i32,
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
}

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
        }
    }

    /// The project-relative path a file check observes.
    pub fn path(&self) -> Option<&str> {
        match self {
            Check::Sha256 { path, .. }
            | Check::FileExists { path }
            | Check::FileAbsent { path } => Some(path),
            Check::Command { .. } | Check::Destination { .. } | Check::EvidenceOrigins { .. } => {
                None
            }
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
                f.only(&["kind", "program", "args", "timeout_ms", "exit_code"])?;
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
            "worker_receipt" => {
                return Err(Refusal::new(
                    Code::AcceptanceKindUnsupported,
                    format!("{field}: acceptance kind {kind} is not measured yet"),
                )
                .detail(json!({"field": format!("{field}.kind"), "kind": kind,
                    "measured": ["sha256", "file_exists", "file_absent", "command", "destination", "evidence_origins"]}))
                .hint("declare another kind instead; worker_receipt needs worker submissions, which Room does not record yet"));
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
    })
}

struct Fields<'a> {
    field: &'a str,
    o: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn only(&self, allowed: &[&str]) -> Result<(), Refusal> {
        match self.o.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(Refusal::invalid(
                &format!("{}.{k}", self.field),
                format!(
                    "unknown field; a {} check has {}",
                    self.o["kind"],
                    allowed[1..].join(", ")
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
    fn kinds_not_measured_yet_are_refused_by_name() {
        let r = parse(json!({"kind": "worker_receipt"})).unwrap_err();
        assert_eq!(r.code, Code::AcceptanceKindUnsupported);
        assert_eq!(r.detail["kind"], "worker_receipt");
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
