//! The blackboard's artifacts as data: their kinds, the schema each core kind is checked
//! against on write (`artifact_schema_invalid`, naming the field), and the limits every
//! artifact is held to. Where versions are kept, who may read or write which kind, and
//! whether a `diff` applies to the project are the engine's and the store's.

use crate::{Code, Refusal};
use serde_json::Value;

/// What an artifact is. The core kinds have schemas; `extra/<key>` holds anything a pack
/// names, still scoped per role.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ArtifactKind {
    Spec,
    Research,
    Adr,
    TaskList,
    Diff,
    Findings,
    Extra(String),
}

/// The longest key of an `extra/<key>` artifact.
pub const EXTRA_KEY_BYTES_MAX: usize = 64;

impl ArtifactKind {
    /// Parse `spec`, `research`, `adr`, `task-list`, `diff`, `findings` or `extra/<key>`
    /// (a key of 1..=64 of a-z, 0-9, `_` and `-`); `field` names the argument in the error.
    pub fn parse(field: &str, s: &str) -> Result<ArtifactKind, Refusal> {
        Ok(match s {
            "spec" => ArtifactKind::Spec,
            "research" => ArtifactKind::Research,
            "adr" => ArtifactKind::Adr,
            "task-list" => ArtifactKind::TaskList,
            "diff" => ArtifactKind::Diff,
            "findings" => ArtifactKind::Findings,
            other => match other.strip_prefix("extra/") {
                Some(k)
                    if !k.is_empty()
                        && k.len() <= EXTRA_KEY_BYTES_MAX
                        && k.bytes().all(|b| {
                            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                        }) =>
                {
                    ArtifactKind::Extra(k.to_string())
                }
                _ => {
                    return Err(Refusal::invalid(
                        field,
                        format!(
                            "{s:?} is not an artifact kind (spec, research, adr, task-list, diff, findings, extra/<key>)"
                        ),
                    ));
                }
            },
        })
    }

    pub fn as_str(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ArtifactKind::Spec => "spec".into(),
            ArtifactKind::Research => "research".into(),
            ArtifactKind::Adr => "adr".into(),
            ArtifactKind::TaskList => "task-list".into(),
            ArtifactKind::Diff => "diff".into(),
            ArtifactKind::Findings => "findings".into(),
            ArtifactKind::Extra(k) => format!("extra/{k}").into(),
        }
    }
}

impl std::fmt::Display for ArtifactKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// The limits every blackboard is held to (config: `[blackboard]`, each with its unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArtifactLimits {
    /// Bytes of one artifact version's content (its canonical JSON).
    pub artifact_bytes_max: usize,
    /// Versions one key holds at most.
    pub versions_per_key_max: u32,
    /// Keys (kind and key) one collaboration's room holds.
    pub keys_per_collaboration_max: u32,
}

/// The ceilings a configured `[blackboard]` may not pass.
pub const ARTIFACT_BYTES_LIMIT: usize = 64 << 20;
pub const VERSIONS_PER_KEY_LIMIT: u32 = 65_536;
pub const KEYS_PER_COLLABORATION_LIMIT: u32 = 65_536;

impl ArtifactLimits {
    /// Each limit at least 1 and at most its ceiling, naming the first that is not.
    pub fn check(&self) -> Result<(), String> {
        let bad = |name: &str, v: u64, max: u64| {
            (v == 0 || v > max).then(|| format!("blackboard.{name} {v} is not within 1..={max}"))
        };
        bad(
            "artifact_bytes_max",
            self.artifact_bytes_max as u64,
            ARTIFACT_BYTES_LIMIT as u64,
        )
        .or_else(|| {
            bad(
                "versions_per_key_max",
                self.versions_per_key_max.into(),
                VERSIONS_PER_KEY_LIMIT.into(),
            )
        })
        .or_else(|| {
            bad(
                "keys_per_collaboration_max",
                self.keys_per_collaboration_max.into(),
                KEYS_PER_COLLABORATION_LIMIT.into(),
            )
        })
        .map_or(Ok(()), Err)
    }
}

/// An artifact's key within its kind: 1..=64 of a-z, 0-9, `_` and `-` (`main` unless named;
/// a reviewer's `findings` are keyed by the reviewer).
pub fn check_key(field: &str, key: &str) -> Result<(), Refusal> {
    if !key.is_empty()
        && key.len() <= EXTRA_KEY_BYTES_MAX
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        Ok(())
    } else {
        Err(Refusal::invalid(
            field,
            format!(
                "{key:?} is not an artifact key (1 to {EXTRA_KEY_BYTES_MAX} of a-z, 0-9, _ and -)"
            ),
        ))
    }
}

/// The key an artifact has when none is named.
pub const DEFAULT_KEY: &str = "main";

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits {
            artifact_bytes_max: 4 << 20,
            versions_per_key_max: 256,
            keys_per_collaboration_max: 512,
        }
    }
}

/// Items one list of a core artifact holds at most, and the longest string in one.
pub const LIST_ITEMS_MAX: usize = 1_024;
pub const STRING_BYTES_MAX: usize = 64 * 1024;

fn schema(field: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(Code::ArtifactSchemaInvalid, format!("{field}: {why}"))
        .detail(serde_json::json!({"field": field}))
}

/// Reads one JSON object's fields, naming each by its path in errors.
struct Obj<'a> {
    path: String,
    o: &'a serde_json::Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn of(path: &str, v: &'a Value) -> Result<Obj<'a>, Refusal> {
        match v.as_object() {
            Some(o) => Ok(Obj {
                path: path.to_string(),
                o,
            }),
            None => Err(schema(
                if path.is_empty() { "(content)" } else { path },
                "must be an object",
            )),
        }
    }

    fn at(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn only(&self, allowed: &[&str]) -> Result<(), Refusal> {
        match self.o.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(schema(
                &self.at(k),
                format!("not a field here ({})", allowed.join(", ")),
            )),
            None => Ok(()),
        }
    }

    fn string(&self, name: &str, required: bool) -> Result<Option<&'a str>, Refusal> {
        match self.o.get(name) {
            None | Some(Value::Null) if !required => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= STRING_BYTES_MAX => {
                Ok(Some(s))
            }
            _ => Err(schema(
                &self.at(name),
                format!("must be a non-empty string of at most {STRING_BYTES_MAX} bytes"),
            )),
        }
    }

    fn list(&self, name: &str, required: bool) -> Result<&'a [Value], Refusal> {
        match self.o.get(name) {
            None | Some(Value::Null) if !required => Ok(&[]),
            Some(Value::Array(a)) if a.len() <= LIST_ITEMS_MAX => Ok(a),
            _ => Err(schema(
                &self.at(name),
                format!("must be a list of at most {LIST_ITEMS_MAX} items"),
            )),
        }
    }

    fn strings(&self, name: &str, required: bool) -> Result<(), Refusal> {
        for (i, v) in self.list(name, required)?.iter().enumerate() {
            if !v
                .as_str()
                .is_some_and(|s| !s.trim().is_empty() && s.len() <= STRING_BYTES_MAX)
            {
                return Err(schema(
                    &format!("{}[{i}]", self.at(name)),
                    "must be a non-empty string",
                ));
            }
        }
        Ok(())
    }
}

/// Check `content` against `kind`'s schema (an `extra/<key>` artifact is any JSON within the
/// limits). Sizes are checked by the caller, which holds the bytes.
pub fn validate(kind: &ArtifactKind, content: &Value) -> Result<(), Refusal> {
    match kind {
        ArtifactKind::Spec => {
            let o = Obj::of("", content)?;
            o.only(&["title", "goal", "requirements", "acceptance", "notes"])?;
            o.string("title", true)?;
            o.string("goal", true)?;
            o.strings("requirements", true)?;
            o.list("acceptance", false)?;
            o.string("notes", false)?;
        }
        ArtifactKind::Research => {
            let o = Obj::of("", content)?;
            o.only(&["question", "summary", "findings"])?;
            o.string("question", false)?;
            o.string("summary", true)?;
            for (i, f) in o.list("findings", true)?.iter().enumerate() {
                let f = Obj::of(&format!("findings[{i}]"), f)?;
                f.only(&["claim", "source"])?;
                f.string("claim", true)?;
                f.string("source", true)?;
            }
        }
        ArtifactKind::Adr => {
            let o = Obj::of("", content)?;
            o.only(&["title", "status", "context", "decision", "consequences"])?;
            o.string("title", true)?;
            let status = o.string("status", true)?.unwrap_or_default();
            if !matches!(status, "proposed" | "accepted" | "superseded") {
                return Err(schema("status", "one of proposed, accepted, superseded"));
            }
            o.string("context", true)?;
            o.string("decision", true)?;
            o.string("consequences", false)?;
        }
        ArtifactKind::TaskList => validate_task_list(content)?,
        ArtifactKind::Diff => {
            let o = Obj::of("", content)?;
            o.only(&["base", "patch", "summary"])?;
            o.string("base", true)?;
            let patch = o.string("patch", true)?.unwrap_or_default();
            o.string("summary", false)?;
            check_unified_diff(patch)?;
        }
        ArtifactKind::Findings => {
            let o = Obj::of("", content)?;
            o.only(&["reviewer", "blocking", "non_blocking", "suggestions"])?;
            o.string("reviewer", false)?;
            for list in ["blocking", "non_blocking", "suggestions"] {
                for (i, f) in o.list(list, true)?.iter().enumerate() {
                    let f = Obj::of(&format!("{list}[{i}]"), f)?;
                    f.only(&["title", "detail", "file", "line"])?;
                    f.string("title", true)?;
                    f.string("detail", false)?;
                    f.string("file", false)?;
                    match f.o.get("line") {
                        None | Some(Value::Null) => {}
                        Some(l) if l.as_u64().is_some_and(|l| l >= 1) => {}
                        Some(_) => {
                            return Err(schema(&f.at("line"), "must be a line number (1 or more)"));
                        }
                    }
                }
            }
        }
        ArtifactKind::Extra(_) => {}
    }
    Ok(())
}

fn validate_task_list(content: &Value) -> Result<(), Refusal> {
    let o = Obj::of("", content)?;
    o.only(&["tasks"])?;
    let tasks = o.list("tasks", true)?;
    let mut ids = std::collections::BTreeSet::new();
    for (i, t) in tasks.iter().enumerate() {
        let t = Obj::of(&format!("tasks[{i}]"), t)?;
        t.only(&["id", "title", "role", "depends_on"])?;
        let id = t.string("id", true)?.unwrap_or_default();
        if !ids.insert(id) {
            return Err(schema(&t.at("id"), format!("{id:?} is listed twice")));
        }
        t.string("title", true)?;
        t.string("role", false)?;
        t.strings("depends_on", false)?;
    }
    // a dependency names a task of the list
    for (i, t) in tasks.iter().enumerate() {
        for (j, d) in t["depends_on"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if !d.as_str().is_some_and(|d| ids.contains(d)) {
                return Err(schema(
                    &format!("tasks[{i}].depends_on[{j}]"),
                    "names no task of the list",
                ));
            }
        }
    }
    Ok(())
}

/// A unified diff, in shape: at least one file (`--- ` then `+++ `), each with at least one
/// hunk (`@@ -a,b +c,d @@`), and every hunk line a context, removal or addition (or the
/// no-newline marker). Whether it applies to the project is the daemon's to check.
pub fn check_unified_diff(patch: &str) -> Result<(), Refusal> {
    let bad = |line: usize, why: &str| schema("patch", format!("line {line}: {why}"));
    let mut files = 0;
    let mut hunks_in_file = 0;
    let mut in_hunk = false;
    let mut lines = patch.lines().enumerate().peekable();
    while let Some((i, l)) = lines.next() {
        let n = i + 1;
        if l.starts_with("--- ") {
            if files > 0 && hunks_in_file == 0 {
                return Err(bad(n, "the file before has no hunk"));
            }
            match lines.next() {
                Some((_, next)) if next.starts_with("+++ ") => {}
                _ => return Err(bad(n + 1, "a '--- ' line is followed by '+++ '")),
            }
            files += 1;
            hunks_in_file = 0;
            in_hunk = false;
        } else if l.starts_with("@@ ") {
            if files == 0 {
                return Err(bad(n, "a hunk before any '--- '/'+++ ' header"));
            }
            if !hunk_header(l) {
                return Err(bad(n, "a hunk header is '@@ -a,b +c,d @@'"));
            }
            hunks_in_file += 1;
            in_hunk = true;
        } else if in_hunk
            && !(l.starts_with(' ')
                || l.starts_with('+')
                || l.starts_with('-')
                || l.starts_with('\\')
                || l.is_empty())
        {
            // a git header line (`diff --git`, `index`) ends the hunk
            in_hunk = false;
        }
    }
    if files == 0 {
        return Err(schema("patch", "holds no file ('--- '/'+++ ' header)"));
    }
    if hunks_in_file == 0 {
        return Err(schema("patch", "its last file has no hunk"));
    }
    Ok(())
}

fn hunk_header(l: &str) -> bool {
    let Some(rest) = l.strip_prefix("@@ -") else {
        return false;
    };
    let Some((ranges, _)) = rest.split_once(" @@") else {
        return false;
    };
    let Some((old, new)) = ranges.split_once(" +") else {
        return false;
    };
    let range = |r: &str| {
        let mut it = r.splitn(2, ',');
        it.next().is_some_and(|a| a.parse::<u64>().is_ok())
            && it.next().is_none_or(|b| b.parse::<u64>().is_ok())
    };
    range(old) && range(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[track_caller]
    fn refused(kind: &str, v: Value, field: &str) {
        let k = ArtifactKind::parse("kind", kind).unwrap();
        let r = validate(&k, &v).unwrap_err();
        assert_eq!(r.code, Code::ArtifactSchemaInvalid, "{r}");
        assert_eq!(r.detail["field"], field, "{r}");
    }

    const PATCH: &str = "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,2 +1,2 @@\n fn a() {}\n-fn b() {}\n+fn b() { a() }\n";

    #[test]
    fn kinds_parse_and_print_back() {
        for k in [
            "spec",
            "research",
            "adr",
            "task-list",
            "diff",
            "findings",
            "extra/reasoning",
        ] {
            assert_eq!(ArtifactKind::parse("k", k).unwrap().as_str(), k);
        }
        for bad in ["", "specs", "extra/", "extra/Up", "extra/a/b", "../spec"] {
            assert!(ArtifactKind::parse("k", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn core_kinds_validate_and_name_the_field_they_refuse() {
        let spec = json!({"title": "t", "goal": "g", "requirements": ["r1"]});
        validate(&ArtifactKind::Spec, &spec).unwrap();
        refused("spec", json!({"title": "t", "requirements": []}), "goal");
        refused(
            "spec",
            json!({"title": "t", "goal": "g", "requirements": [""]}),
            "requirements[0]",
        );
        refused("spec", json!([1]), "(content)");
        refused(
            "research",
            json!({"summary": "s", "findings": [{"claim": "c"}]}),
            "findings[0].source",
        );
        refused(
            "adr",
            json!({"title": "t", "status": "maybe", "context": "c", "decision": "d"}),
            "status",
        );
        refused(
            "task-list",
            json!({"tasks": [{"id": "a", "title": "x", "depends_on": ["b"]}]}),
            "tasks[0].depends_on[0]",
        );
        refused(
            "task-list",
            json!({"tasks": [{"id": "a", "title": "x"}, {"id": "a", "title": "y"}]}),
            "tasks[1].id",
        );
        validate(
            &ArtifactKind::Diff,
            &json!({"base": "abc123", "patch": PATCH}),
        )
        .unwrap();
        refused(
            "diff",
            json!({"base": "abc", "patch": "not a diff"}),
            "patch",
        );
        refused(
            "findings",
            json!({"blocking": [{"title": "t", "line": 0}], "non_blocking": [], "suggestions": []}),
            "blocking[0].line",
        );
        refused(
            "findings",
            json!({"blocking": [], "non_blocking": [], "suggestions": [], "vote": 1}),
            "vote",
        );
        validate(&ArtifactKind::Extra("anything".into()), &json!(42)).unwrap();
    }

    #[test]
    fn a_unified_diff_needs_headers_and_hunks() {
        check_unified_diff(PATCH).unwrap();
        let two = format!("diff --git a/x b/x\nindex 1..2\n{PATCH}{PATCH}");
        check_unified_diff(&two).unwrap();
        assert!(check_unified_diff("--- a\n+++ b\n").is_err());
        assert!(check_unified_diff("@@ -1 +1 @@\n-a\n+b\n").is_err());
        assert!(check_unified_diff("--- a\n+++ b\n@@ -x +1 @@\n").is_err());
    }

    proptest::proptest! {
        /// Whatever text is handed in, the check answers (never panics), and only a text
        /// with a header and a hunk passes.
        #[test]
        fn any_text_is_judged_without_panic(s in ".{0,400}") {
            if check_unified_diff(&s).is_ok() {
                proptest::prop_assert!(s.contains("--- ") && s.contains("@@ -"));
            }
        }
    }
}
