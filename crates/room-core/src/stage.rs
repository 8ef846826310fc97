//! Worker staging selections: the exact project sources a task hands its worker, each pinned
//! by SHA-256, optionally projected to explicit rows and columns. The selection is part of the
//! task (journaled with it); staging itself (reading, verifying, projecting) is `room-exec`'s.

use crate::Refusal;
use serde::{Deserialize, Serialize};

/// Selections one task may carry.
pub const SELECTIONS_MAX: usize = 256;
/// Bytes of all of one task's selected sources together.
pub const STAGE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Columns and admitted rows one projection may name.
pub const PROJECTION_NAMES_MAX: usize = 1_024;
/// Longest project-relative path of a selection.
pub const STAGE_PATH_BYTES_MAX: usize = 1_024;

/// One source: a project-relative file and the digest it must have when staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    pub path: String,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<Projection>,
}

/// Which rows and columns of a structured source the worker gets. Every row must carry the
/// `key` and an integer `version`; both are always kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Projection {
    pub format: Format,
    /// SQLite: the table read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    pub key: String,
    pub version: String,
    /// The columns kept besides key and version.
    #[serde(default)]
    pub columns: Vec<String>,
    /// The keys of the rows kept (their text form); none: every row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Json,
    Jsonl,
    Sqlite,
}

/// A plain identifier (a column or table name): letters, digits and `_`, not first a digit.
pub fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A relative path without `.`, `..`, empty components or control characters.
pub fn is_relative_path(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= STAGE_PATH_BYTES_MAX
        && !p.starts_with('/')
        && !p.chars().any(char::is_control)
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Check a task's selections, naming the field of the first that is wrong.
pub fn validate(list: &[Selection]) -> Result<(), Refusal> {
    if list.len() > SELECTIONS_MAX {
        return Err(Refusal::invalid(
            "stage",
            format!("at most {SELECTIONS_MAX} selections"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, s) in list.iter().enumerate() {
        let at = |f: &str| format!("stage[{i}].{f}");
        if !is_relative_path(&s.path) {
            return Err(Refusal::invalid(
                &at("path"),
                "a project-relative path without . or .. components",
            ));
        }
        if !seen.insert(s.path.as_str()) {
            return Err(Refusal::invalid(&at("path"), "selected twice"));
        }
        if s.sha256.len() != 64
            || !s
                .sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(Refusal::invalid(&at("sha256"), "64 lower-case hex digits"));
        }
        let Some(p) = &s.project else { continue };
        let names = p.columns.iter().chain([&p.key, &p.version]);
        if let Some(bad) = names.into_iter().find(|c| !is_identifier(c)) {
            return Err(Refusal::invalid(
                &at("project"),
                format!("{bad:?} is not a plain column name"),
            ));
        }
        match (p.format, &p.table) {
            (Format::Sqlite, Some(t)) if is_identifier(t) => {}
            (Format::Sqlite, _) => {
                return Err(Refusal::invalid(
                    &at("project.table"),
                    "a SQLite projection names its table (a plain name)",
                ));
            }
            (_, Some(_)) => {
                return Err(Refusal::invalid(
                    &at("project.table"),
                    "only a SQLite projection names a table",
                ));
            }
            _ => {}
        }
        let n = p.columns.len() + p.rows.as_ref().map_or(0, Vec::len);
        if n > PROJECTION_NAMES_MAX {
            return Err(Refusal::invalid(
                &at("project"),
                format!("at most {PROJECTION_NAMES_MAX} columns and rows"),
            ));
        }
    }
    Ok(())
}

/// Columns one proposal may set.
pub const PROPOSAL_COLUMNS_MAX: usize = 64;
/// Bytes of one proposal's values together (their JSON text).
pub const PROPOSAL_VALUE_BYTES_MAX: usize = 64 * 1024;

/// A worker's requested change to one row of a projected source: the row (`key`, in the
/// text form the projection shows), the version it read, and the projected columns it sets.
/// The daemon applies it to the live source, moving the row's version by exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proposal {
    pub path: String,
    pub key: String,
    /// The row's version as the worker read it: the live row must still be at it.
    pub version: i64,
    pub set: serde_json::Map<String, serde_json::Value>,
}

/// Check a proposal against the selections of its task: the path is a projected selection,
/// every column set is one the projection gave the worker (never its key or version), the
/// row is one it was given, and the values are scalars within bounds.
pub fn admit_proposal<'a>(list: &'a [Selection], p: &Proposal) -> Result<&'a Selection, Refusal> {
    use crate::Code;
    let withheld = |m: String| Refusal::new(Code::ProposalWithheld, m);
    if !is_relative_path(&p.path) {
        return Err(Refusal::invalid(
            "path",
            "a project-relative path without . or .. components",
        ));
    }
    if p.key.is_empty() || p.key.len() > STAGE_PATH_BYTES_MAX || p.key.chars().any(char::is_control)
    {
        return Err(Refusal::invalid(
            "key",
            format!("1..={STAGE_PATH_BYTES_MAX} bytes without control characters"),
        ));
    }
    if p.set.is_empty() || p.set.len() > PROPOSAL_COLUMNS_MAX {
        return Err(Refusal::invalid(
            "set",
            format!("1 to {PROPOSAL_COLUMNS_MAX} columns"),
        ));
    }
    let bytes: usize = p.set.values().map(|v| v.to_string().len()).sum();
    if bytes > PROPOSAL_VALUE_BYTES_MAX {
        return Err(Refusal::new(
            Code::PayloadTooLarge,
            format!("set: {bytes} bytes of values, at most {PROPOSAL_VALUE_BYTES_MAX}"),
        )
        .detail(serde_json::json!({"field": "set"})));
    }
    if let Some((c, _)) = p.set.iter().find(|(_, v)| v.is_object() || v.is_array()) {
        return Err(Refusal::invalid(
            &format!("set.{c}"),
            "a value is null, a boolean, a number or a string",
        ));
    }
    let Some(sel) = list.iter().find(|s| s.path == p.path) else {
        return Err(withheld(format!(
            "{} is not among the task's selections",
            p.path
        )));
    };
    let Some(proj) = &sel.project else {
        return Err(withheld(format!(
            "{} is staged whole, not projected: only a projected source takes proposals",
            p.path
        )));
    };
    if let Some(c) = p
        .set
        .keys()
        .find(|c| **c == proj.key || **c == proj.version)
    {
        return Err(withheld(format!(
            "{c} is the row's key or version: the daemon keeps both"
        )));
    }
    if let Some(c) = p.set.keys().find(|c| !proj.columns.contains(c)) {
        return Err(withheld(format!(
            "column {c} of {} was withheld from the worker",
            p.path
        )));
    }
    if proj.rows.as_ref().is_some_and(|r| !r.contains(&p.key)) {
        return Err(withheld(format!(
            "row {} of {} was withheld from the worker",
            p.key, p.path
        )));
    }
    Ok(sel)
}
