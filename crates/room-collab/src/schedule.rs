//! The phase scheduler's one question: which phases are ready now. A phase is ready when it
//! is not running, every phase it comes after has completed, every artifact it reads exists,
//! and either it never ran or something it reads has a version newer than the one its last
//! run read; and no running phase writes what it writes (two writers of one key never run
//! together). Independent phases are ready together, so they run in parallel.
//!
//! The answer is a function of two maps the caller keeps durably (the blackboard's newest
//! version per kind, each phase's last run), so a restart asks again and gets the same
//! answer: nothing here is kept in memory.

use crate::artifact::ArtifactKind;
use crate::pack::Pack;
use std::collections::BTreeMap;

/// A phase's last run, as the caller recorded it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseRun {
    /// Started and not finished (dispatched, or waiting for approval).
    pub running: bool,
    /// Finished with its acceptance passed (at least once).
    pub completed: bool,
    /// The version of each artifact it read, when it started.
    pub read_versions: BTreeMap<ArtifactKind, u64>,
}

/// The phases ready to start now, in the pack's order.
pub fn ready<'p>(
    pack: &'p Pack,
    versions: &BTreeMap<ArtifactKind, u64>,
    runs: &BTreeMap<String, PhaseRun>,
) -> Vec<&'p str> {
    let pred = pack.predecessors();
    let run = |name: &str| runs.get(name).cloned().unwrap_or_default();
    // fresh: it never completed, or something it reads is newer than what its last run read
    let fresh = |name: &str| {
        let mine = run(name);
        let p = pack
            .phase(name)
            .expect("predecessors name phases of the pack");
        !mine.completed
            || p.reads.iter().any(|k| {
                versions
                    .get(k)
                    .is_some_and(|v| mine.read_versions.get(k).is_none_or(|seen| v > seen))
            })
    };
    // stale: fresh, or after a phase that is (its inputs are about to change again); the
    // pack is acyclic, so the walk ends
    fn stale<'a>(
        n: &'a str,
        pred: &BTreeMap<&'a str, std::collections::BTreeSet<&'a str>>,
        fresh: &dyn Fn(&str) -> bool,
        memo: &mut BTreeMap<&'a str, bool>,
    ) -> bool {
        if let Some(s) = memo.get(n) {
            return *s;
        }
        let s = fresh(n) || pred[n].iter().any(|q| stale(q, pred, fresh, memo));
        memo.insert(n, s);
        s
    }
    let mut memo = BTreeMap::new();
    let running_writes: Vec<&ArtifactKind> = pack
        .phases
        .iter()
        .filter(|p| run(&p.name).running)
        .flat_map(|p| p.writes.iter())
        .collect();
    let mut out = Vec::new();
    for p in &pack.phases {
        let n = p.name.as_str();
        if run(n).running || !fresh(n) {
            continue;
        }
        let before_done = pred[n].iter().all(|q| {
            let r = run(q);
            r.completed && !r.running && !stale(q, &pred, &fresh, &mut memo)
        });
        let inputs = p.reads.iter().all(|k| versions.contains_key(k));
        let clear = !p.writes.iter().any(|w| running_writes.contains(&w));
        if before_done && inputs && clear {
            out.push(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ArtifactKind::*;

    fn done(read: &[(ArtifactKind, u64)]) -> PhaseRun {
        PhaseRun {
            running: false,
            completed: true,
            read_versions: read.iter().cloned().collect(),
        }
    }

    #[test]
    fn the_default_pack_runs_in_its_order_with_research_and_architecture_together() {
        let pack = Pack::default_pack();
        let mut v = BTreeMap::new();
        let mut runs = BTreeMap::new();
        assert_eq!(ready(&pack, &v, &runs), ["spec"]);
        runs.insert(
            "spec".to_string(),
            PhaseRun {
                running: true,
                ..Default::default()
            },
        );
        assert!(ready(&pack, &v, &runs).is_empty(), "spec is running");
        v.insert(Spec, 1);
        runs.insert("spec".into(), done(&[]));
        // two independent phases, ready together
        assert_eq!(ready(&pack, &v, &runs), ["research", "architecture"]);
        v.insert(Research, 1);
        runs.insert("research".into(), done(&[(Spec, 1)]));
        assert_eq!(ready(&pack, &v, &runs), ["architecture"]);
        v.insert(Adr, 1);
        runs.insert("architecture".into(), done(&[(Spec, 1)]));
        assert_eq!(ready(&pack, &v, &runs), ["implementation"]);
        v.insert(Diff, 1);
        runs.insert(
            "implementation".into(),
            done(&[(Spec, 1), (Research, 1), (Adr, 1)]),
        );
        assert_eq!(ready(&pack, &v, &runs), ["gate"]);
        runs.insert("gate".into(), done(&[(Diff, 1)]));
        assert_eq!(ready(&pack, &v, &runs), ["review"]);
        v.insert(Findings, 1);
        runs.insert("review".into(), done(&[(Diff, 1), (Spec, 1)]));
        assert_eq!(ready(&pack, &v, &runs), ["approval"]);
        runs.insert("approval".into(), done(&[(Diff, 1), (Findings, 1)]));
        assert!(
            ready(&pack, &v, &runs).is_empty(),
            "everything ran on what is there"
        );
        // a new spec makes what reads it ready again (and nothing that waits on them)
        v.insert(Spec, 2);
        assert_eq!(ready(&pack, &v, &runs), ["research", "architecture"]);
    }

    #[test]
    fn two_writers_of_one_key_never_run_together() {
        let text = r#"
name = "t"
[[phases]]
name = "a"
kind = "agent"
role = "architecture"
writes = ["spec"]
[[phases]]
name = "b"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
[[phases]]
name = "c"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
after = ["b"]
"#;
        let pack = Pack::load(text, &crate::Profile::default()).unwrap();
        let mut v = BTreeMap::new();
        v.insert(Spec, 1);
        let mut runs = BTreeMap::new();
        runs.insert("a".to_string(), done(&[]));
        assert_eq!(ready(&pack, &v, &runs), ["b"]);
        runs.insert("b".into(), done(&[(Spec, 1)]));
        assert_eq!(ready(&pack, &v, &runs), ["c"]);
        // a new spec: b is ready again; c waits while b runs (it comes after b)
        v.insert(Spec, 2);
        runs.insert(
            "b".into(),
            PhaseRun {
                running: true,
                ..done(&[(Spec, 1)])
            },
        );
        assert!(ready(&pack, &v, &runs).is_empty());
    }
}
