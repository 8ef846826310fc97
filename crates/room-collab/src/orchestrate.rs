//! An agent orchestrator's floor (issue 42 item 1): what it is told when woken, what its
//! `collab_dispatch` names, and whether its words announce a dispatch it did not make.
//!
//! The choreography is the pack's prompt file, not code: here is only what Room must decide
//! the same way every time, deterministically and without I/O, so the daemon and the
//! simulator agree:
//!
//! - `news`: the items a wake tells (a phase became ready for its next run, a run settled);
//!   the orchestrator is woken only when one of them is new to it, never polled, and never
//!   woken by its own dispatch;
//! - `pick`: the ready phase a dispatch names, by phase or by purpose tag (which selects the
//!   role, so one role can serve several purposes and a purpose several phases);
//! - `announced`: the phases a turn's text says it dispatches (in the present or the near
//!   future), for the daemon to compare with the dispatches the same turn made.

use crate::pack::Pack;
use room_core::Refusal;
use std::collections::BTreeSet;

/// The most items one wake tells (each phase's readiness, each settled run of the newest
/// round); what is cut is in `collab_status`.
pub const NEWS_ITEMS_MAX: usize = 256;
/// Bytes of a turn's text `announced` reads.
pub const ANNOUNCE_TEXT_BYTES_MAX: usize = 16 * 1024;

/// A run as the news reads it: its phase, its number and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunState<'a> {
    pub phase: &'a str,
    pub run: u32,
    pub state: &'a str,
}

/// States in which a run has ended (what a child finishing looks like to the orchestrator).
pub fn settled(state: &str) -> bool {
    matches!(
        state,
        "done"
            | "failed"
            | "rejected"
            | "timed_out"
            | "fixed"
            | "fix_loop_exhausted"
            | "answered"
            | "cancelled"
            | "approved"
    )
}

/// The items the orchestrator would be told now: `ready:PHASE#RUN` for each phase ready for
/// its next run, `settled:PHASE#RUN:STATE` for each phase whose newest run has ended, and
/// `all_done` once every phase's newest run is done. Sorted, bounded by `NEWS_ITEMS_MAX`.
pub fn news(pack: &Pack, ready: &[&str], runs: &[RunState<'_>]) -> Vec<String> {
    let next = |phase: &str| {
        runs.iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.run)
            .max()
            .unwrap_or(0)
            + 1
    };
    let mut out: BTreeSet<String> = ready
        .iter()
        .map(|p| format!("ready:{p}#{}", next(p)))
        .collect();
    // each phase's newest run only: the list stays bounded by the phases, whatever the
    // collaboration's history
    let mut newest: std::collections::BTreeMap<&str, &RunState<'_>> = Default::default();
    for r in runs {
        if newest.get(r.phase).is_none_or(|n| r.run > n.run) {
            newest.insert(r.phase, r);
        }
    }
    out.extend(
        newest
            .values()
            .filter(|r| settled(r.state))
            .map(|r| format!("settled:{}#{}:{}", r.phase, r.run, r.state)),
    );
    let all_done = pack.phases.iter().all(|p| {
        runs.iter()
            .filter(|r| r.phase == p.name)
            .max_by_key(|r| r.run)
            .is_some_and(|r| r.state == "done")
    });
    if all_done {
        out.insert("all_done".into());
    }
    out.into_iter().take(NEWS_ITEMS_MAX).collect()
}

/// The items of `now` the orchestrator was not told yet (`told`: what its earlier wakes
/// said). Empty: no wake.
pub fn untold<'a>(told: &[String], now: &'a [String]) -> Vec<&'a str> {
    now.iter()
        .filter(|i| !told.contains(i))
        .map(String::as_str)
        .collect()
}

/// The ready phase a dispatch names: `phase` by name, or `purpose`, which selects the roles
/// serving it and so the one ready phase they run. `invalid_argument` naming the field for a
/// phase the pack lacks, a purpose no role serves, both or neither, or a purpose that fits
/// several ready phases; `phase_not_ready` (with the ready list) for one that is not ready.
pub fn pick<'p>(
    pack: &'p Pack,
    ready: &[&str],
    phase: Option<&str>,
    purpose: Option<&str>,
) -> Result<&'p str, Refusal> {
    let not_ready = |name: &str| {
        Refusal::new(
            room_core::Code::PhaseNotReady,
            format!("phase {name} is not ready"),
        )
        .detail(serde_json::json!({"field": "phase", "phase": name, "ready": ready}))
        .hint("collab_status says each phase's state; a phase is ready when what it reads exists and what it comes after is done")
    };
    match (phase, purpose) {
        (Some(_), Some(_)) | (None, None) => Err(Refusal::invalid(
            "phase",
            "name a phase or a purpose, not both",
        )),
        (Some(name), None) => {
            let p = pack.phase(name).ok_or_else(|| {
                Refusal::invalid("phase", format!("the pack has no phase {name:?}"))
            })?;
            if ready.contains(&p.name.as_str()) {
                Ok(p.name.as_str())
            } else {
                Err(not_ready(&p.name))
            }
        }
        (None, Some(purpose)) => {
            let roles: Vec<&str> = pack
                .profile
                .roles_for(purpose)
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            let phases: Vec<&'p str> = pack
                .phases
                .iter()
                .filter(|p| p.role.as_deref().is_some_and(|r| roles.contains(&r)))
                .map(|p| p.name.as_str())
                .collect();
            if phases.is_empty() {
                return Err(Refusal::invalid(
                    "purpose",
                    format!("no phase of the pack runs a role serving {purpose:?}"),
                ));
            }
            let fit: Vec<&'p str> = phases
                .iter()
                .copied()
                .filter(|p| ready.contains(p))
                .collect();
            match fit.as_slice() {
                [one] => Ok(one),
                [] => Err(not_ready(phases[0])),
                _ => Err(Refusal::invalid(
                    "purpose",
                    format!(
                        "{purpose:?} fits several ready phases ({}): name one with phase",
                        fit.join(", ")
                    ),
                )),
            }
        }
    }
}

/// Words that announce a dispatch when they lead a clause about a phase or a role.
/// Only the present and near future: a past tense may recap an earlier turn's dispatch.
const ANNOUNCING: [&str; 7] = [
    "dispatching",
    "delegating",
    "handing",
    "assigning",
    "sending",
    "starting",
    "launching",
];
/// Verbs that announce a dispatch after `will`, `'ll`, `am`, `now`, `i`, `let me`.
const ANNOUNCING_BARE: [&str; 7] = [
    "dispatch", "delegate", "hand", "assign", "send", "start", "launch",
];
/// Words that make a sentence no announcement (a condition, a negation, a plan for later).
const HEDGES: [&str; 16] = [
    "not", "no", "never", "won't", "don't", "didn't", "cannot", "can't", "once", "after", "when",
    "until", "if", "later", "waiting", "wait",
];

/// The phases `text` says are being (or were just) dispatched, in the pack's order: a
/// sentence with an announcing verb (`dispatching`, `I will delegate`, `handing … to`, …)
/// and no hedge (`not`, `once`, `after`, `if`, `later`, …), naming a phase, or a role or
/// purpose that runs phases (all of which it then names). Words are matched whole, case
/// folded; the text is read up to `ANNOUNCE_TEXT_BYTES_MAX`.
pub fn announced<'p>(pack: &'p Pack, text: &str) -> Vec<&'p str> {
    let mut cut = text.len().min(ANNOUNCE_TEXT_BYTES_MAX);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    // typographic apostrophes read as plain ones (won’t is won't)
    let text = text[..cut]
        .to_lowercase()
        .replace(['\u{2019}', '\u{2018}'], "'");
    let mut out: BTreeSet<&'p str> = BTreeSet::new();
    for sentence in text.split(['.', '!', '?', ';', '\n']) {
        let words: Vec<&str> = sentence
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '\''))
            .filter(|w| !w.is_empty())
            .collect();
        if words.iter().any(|w| HEDGES.contains(w)) {
            continue;
        }
        let announces = words.iter().enumerate().any(|(i, w)| {
            ANNOUNCING.contains(w)
                || (ANNOUNCING_BARE.contains(w)
                    && i > 0
                    && matches!(words[i - 1], "will" | "i'll" | "i" | "now" | "me" | "am"))
        });
        if !announces {
            continue;
        }
        // a phase named is what is announced; only a sentence naming none announces the
        // phases of the roles (or purposes) it names
        let named: Vec<&'p str> = pack
            .phases
            .iter()
            .map(|p| p.name.as_str())
            .filter(|n| words.contains(n))
            .collect();
        if !named.is_empty() {
            out.extend(named);
            continue;
        }
        for p in &pack.phases {
            let role_named = p.role.as_deref().is_some_and(|r| {
                words.contains(&r)
                    || pack.profile.role(r).is_some_and(|role| {
                        role.purposes.iter().any(|x| words.contains(&x.as_str()))
                    })
            });
            if role_named {
                out.insert(p.name.as_str());
            }
        }
    }
    pack.phases
        .iter()
        .map(|p| p.name.as_str())
        .filter(|n| out.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn pack() -> Pack {
        let mut p = Pack::default_pack();
        p.bind_roles(
            "roles",
            &[
                "orchestrator=openai:m".into(),
                "architecture=openai:m".into(),
                "search=openai:m".into(),
                "reasoning=openai:m".into(),
                "review=openai:m".into(),
                "review=anthropic:m".into(),
            ],
        )
        .unwrap();
        p.keep_used_roles();
        p
    }

    #[test]
    fn the_shipped_pack_names_its_orchestrator_prompt() {
        let p = pack();
        assert!(p.agent_orchestrated());
        assert_eq!(
            p.orchestrator_prompt.as_deref(),
            Some("default/orchestrator.md")
        );
        assert!(p.profile.role("orchestrator").is_some(), "kept when bound");
        let unbound = Pack::default_pack();
        assert!(!unbound.agent_orchestrated());
        p.check_orchestrator().unwrap();
    }

    #[test]
    fn a_bound_orchestrator_without_a_prompt_file_is_refused() {
        let text = "name = \"x\"\n\n[[phases]]\nname = \"spec\"\nkind = \"agent\"\nrole = \"architecture\"\nwrites = [\"spec\"]\n";
        let mut p = Pack::load(text, &Profile::default()).unwrap();
        p.bind_roles("roles", &["orchestrator=openai:m".into()])
            .unwrap();
        let r = p.check_orchestrator().unwrap_err();
        assert_eq!(r.code, room_core::Code::PackInvalid);
        assert_eq!(r.detail["field"], "orchestrator.prompt");
    }

    #[test]
    fn announcements_name_phases_roles_and_purposes() {
        let p = pack();
        let cases: [(&str, &[&str]); 13] = [
            ("Dispatching spec now.", &["spec"]),
            (
                "I will delegate the implementation to reasoning.",
                &["implementation"],
            ),
            ("Handing the diff to the review panel", &["review"]),
            (
                "I'll start research and architecture in parallel.",
                &["research", "architecture"],
            ),
            // a purpose selects its role's phases
            ("Now I dispatch the explore work", &["research"]),
            ("The spec is done. Waiting for research.", &[]),
            ("I will dispatch review once the gate passes.", &[]),
            ("I did not dispatch the gate.", &[]),
            ("Spec looks good.", &[]),
            ("If the gate fails, I will send the fix to reasoning.", &[]),
            ("", &[]),
            // a recap of an earlier turn is no announcement; a typographic apostrophe hedges
            ("The spec I dispatched is done.", &[]),
            ("I won\u{2019}t dispatch review yet.", &[]),
        ];
        for (text, want) in cases {
            assert_eq!(announced(&p, text), want.to_vec(), "{text:?}");
        }
    }

    #[test]
    fn news_tells_readiness_and_ends_never_a_start() {
        let p = pack();
        let runs = [
            RunState {
                phase: "spec",
                run: 1,
                state: "done",
            },
            RunState {
                phase: "research",
                run: 1,
                state: "running",
            },
        ];
        let now = news(&p, &["architecture"], &runs);
        assert_eq!(now, ["ready:architecture#1", "settled:spec#1:done"]);
        // dispatching architecture changes nothing the orchestrator would be told
        let later = news(
            &p,
            &[],
            &[
                runs[0].clone(),
                runs[1].clone(),
                RunState {
                    phase: "architecture",
                    run: 1,
                    state: "running",
                },
            ],
        );
        assert!(untold(&now, &later).is_empty());
        // research ending is news
        let ended = news(
            &p,
            &[],
            &[
                runs[0].clone(),
                RunState {
                    phase: "research",
                    run: 1,
                    state: "failed",
                },
            ],
        );
        assert_eq!(untold(&now, &ended), ["settled:research#1:failed"]);
    }

    #[test]
    fn pick_names_one_ready_phase_by_name_or_purpose() {
        let p = pack();
        assert_eq!(
            pick(&p, &["research"], Some("research"), None).unwrap(),
            "research"
        );
        assert_eq!(
            pick(&p, &["research"], None, Some("explore")).unwrap(),
            "research"
        );
        let r = pick(&p, &["research"], Some("spec"), None).unwrap_err();
        assert_eq!(r.code, room_core::Code::PhaseNotReady);
        assert_eq!(r.detail["ready"], serde_json::json!(["research"]));
        for (phase, purpose, field) in [
            (Some("nope"), None, "phase"),
            (None, None, "phase"),
            (Some("spec"), Some("explore"), "phase"),
            (None, Some("juggle"), "purpose"),
        ] {
            let r = pick(&p, &["research"], phase, purpose).unwrap_err();
            assert_eq!(
                r.code,
                room_core::Code::InvalidArgument,
                "{phase:?} {purpose:?}"
            );
            assert_eq!(r.detail["field"], field);
        }
    }
}
