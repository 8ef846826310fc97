//! Typed scopes: what a task's lease covers, as `namespace:resource`. The `exclusive` runtime
//! invariant asks whether two scopes conflict: file scopes conflict hierarchically (a directory
//! covers everything under it), every other namespace by exact identity. The shape is strict so
//! that two spellings of one file can never slip past each other (`src//a.rs`, `./src/a.rs`,
//! `src/../src/a.rs` are refused rather than normalized).

use crate::refusal::Refusal;

/// Scopes one task may name.
pub const SCOPES_PER_TASK_MAX: usize = 16;
const NAMESPACE_BYTES_MAX: usize = 32;
const RESOURCE_BYTES_MAX: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scope {
    pub namespace: String,
    pub resource: String,
}

impl Scope {
    /// Parse `namespace:resource`; `field` names the argument in the error.
    pub fn parse(field: &str, s: &str) -> Result<Scope, Refusal> {
        let bad = |why: &str| Refusal::invalid(field, format!("scope {s:?}: {why}"));
        let (ns, res) = s
            .split_once(':')
            .ok_or_else(|| bad("must be namespace:resource, e.g. file:src/lib.rs"))?;
        if ns.is_empty()
            || ns.len() > NAMESPACE_BYTES_MAX
            || !ns.as_bytes()[0].is_ascii_lowercase()
            || !ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(bad(
                "the namespace must be 1..=32 of a-z, 0-9, _ and -, starting with a letter",
            ));
        }
        if res.is_empty() || res.len() > RESOURCE_BYTES_MAX {
            return Err(bad("the resource must be 1..=512 bytes"));
        }
        if res.chars().any(char::is_control) {
            return Err(bad("the resource contains a control character"));
        }
        if ns == "file" {
            if res.starts_with('/') || res.ends_with('/') {
                return Err(bad(
                    "a file scope is a path relative to the project root, without a leading or trailing /",
                ));
            }
            if res
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\\'))
            {
                return Err(bad(
                    "a file scope has no empty, '.' or '..' components and no backslash",
                ));
            }
        }
        Ok(Scope {
            namespace: ns.into(),
            resource: res.into(),
        })
    }

    /// Whether everything `other` names is inside this scope: a file scope contains itself
    /// and everything under it, any other scope only itself.
    pub fn contains(&self, other: &Scope) -> bool {
        if self.namespace != other.namespace {
            return false;
        }
        if self.namespace != "file" {
            return self.resource == other.resource;
        }
        let (a, b) = (&self.resource, &other.resource);
        a == b || (b.len() > a.len() && b.starts_with(a.as_str()) && b[a.len()..].starts_with('/'))
    }

    /// Whether two live holders of these scopes would conflict.
    pub fn conflicts(&self, other: &Scope) -> bool {
        if self.namespace != other.namespace {
            return false;
        }
        if self.namespace != "file" {
            return self.resource == other.resource;
        }
        let (a, b) = (&self.resource, &other.resource);
        let under = |x: &str, y: &str| {
            x.len() > y.len() && x.starts_with(y) && x[y.len()..].starts_with('/')
        };
        a == b || under(a, b) || under(b, a)
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.namespace, self.resource)
    }
}

/// Parse a task's scope list: at most `SCOPES_PER_TASK_MAX`, no duplicates, sorted.
pub fn parse_list(field: &str, list: &[String]) -> Result<Vec<Scope>, Refusal> {
    if list.len() > SCOPES_PER_TASK_MAX {
        return Err(Refusal::invalid(
            field,
            format!("at most {SCOPES_PER_TASK_MAX} scopes"),
        ));
    }
    let mut out = list
        .iter()
        .map(|s| Scope::parse(field, s))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(x: &str) -> Scope {
        Scope::parse("scope", x).unwrap()
    }

    #[test]
    fn files_conflict_hierarchically_others_by_identity() {
        assert!(s("file:src").conflicts(&s("file:src/a.rs")));
        assert!(s("file:src/a.rs").conflicts(&s("file:src")));
        assert!(s("file:src/a.rs").conflicts(&s("file:src/a.rs")));
        assert!(!s("file:src/a.rs").conflicts(&s("file:src/a.rs.bak")));
        assert!(!s("file:src").conflicts(&s("file:srcs/a.rs")));
        assert!(!s("file:src").conflicts(&s("api:src")));
        assert!(s("api:stripe").conflicts(&s("api:stripe")));
        assert!(!s("api:stripe").conflicts(&s("api:stripe/charges")));
    }

    #[test]
    fn ambiguous_spellings_are_refused() {
        for bad in [
            "src/a.rs",
            "file:/etc/passwd",
            "file:src/",
            "file:src//a.rs",
            "file:./src",
            "file:src/../x",
            "file:a\\b",
            "File:x",
            ":x",
            "file:",
            "file:a\nb",
        ] {
            let r = Scope::parse("scopes", bad).unwrap_err();
            assert_eq!(r.code, crate::Code::InvalidArgument, "{bad}");
            assert_eq!(r.detail["field"], "scopes");
        }
    }

    #[test]
    fn lists_are_bounded_sorted_and_deduplicated() {
        let l = parse_list(
            "scopes",
            &["file:b".into(), "file:a".into(), "file:b".into()],
        )
        .unwrap();
        assert_eq!(l, vec![s("file:a"), s("file:b")]);
        let many: Vec<String> = (0..=SCOPES_PER_TASK_MAX)
            .map(|i| format!("k:{i}"))
            .collect();
        assert!(parse_list("scopes", &many).is_err());
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-c]{1,2}", 1..4).prop_map(|v| v.join("/"))
    }

    proptest! {
        #[test]
        fn conflict_is_symmetric_and_reflexive(a in path(), b in path()) {
            let (x, y) = (s(&format!("file:{a}")), s(&format!("file:{b}")));
            prop_assert!(x.conflicts(&x));
            prop_assert_eq!(x.conflicts(&y), y.conflicts(&x));
            // a conflict is exactly a component-wise prefix relation
            let (ca, cb): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
            let n = ca.len().min(cb.len());
            prop_assert_eq!(x.conflicts(&y), ca[..n] == cb[..n]);
        }

        /// Containment is what delegation checks: a parent contains its child exactly when the
        /// child's components extend the parent's; it is reflexive and transitive, and two
        /// scopes one of which contains the other always conflict.
        #[test]
        fn a_parent_contains_its_child_and_containment_implies_conflict(
            a in path(), b in path(), c in path(), ns in "(file|api)",
        ) {
            let sc = |p: &str| s(&format!("{ns}:{p}"));
            let (x, y, z) = (sc(&a), sc(&b), sc(&c));
            prop_assert!(x.contains(&x));
            if x.contains(&y) {
                prop_assert!(x.conflicts(&y) && y.conflicts(&x));
            }
            if x.contains(&y) && y.contains(&z) {
                prop_assert!(x.contains(&z));
            }
            if x.contains(&y) && y.contains(&x) {
                prop_assert_eq!(&x, &y);
            }
            let child = sc(&format!("{a}/{b}"));
            prop_assert_eq!(x.contains(&child), ns == "file");
            prop_assert!(!child.contains(&x));
            let (ca, cb): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
            let expect = if ns == "file" { cb.len() >= ca.len() && cb[..ca.len()] == ca[..] } else { a == b };
            prop_assert_eq!(x.contains(&y), expect);
        }
    }
}
