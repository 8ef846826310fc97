//! Review panels (issue 42, item 2): one input fanned out to several reviewers, each a seat
//! of its own (`Phase::seats`) bound to its own backend, so reviewers of one model never
//! rubber-stamp each other. This module holds what is decided without running anything:
//! whether a profile can seat a panel (`check`: every seat bound, the seats' backends, or
//! their model families, distinct) and how the reviewers' findings are put side by side
//! (`merge`: grouped, never voted on).

use crate::pack::{Distinct, Pack, PhaseKind};
use crate::profile::Role;
use room_core::{Code, Refusal};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A seat's backend: its adapter and what it asks for (a model, an ACP preset), with the
/// model route it draws on.
pub fn backend(r: &Role) -> String {
    let what = r.model.as_deref().or(r.preset.as_deref()).unwrap_or("");
    match &r.model_route {
        Some(route) => format!("{}:{what}@{route}", r.adapter),
        None => format!("{}:{what}", r.adapter),
    }
}

/// A seat's model family, as far as its binding tells: an ACP preset's vendor (`claude`,
/// `codex` → `gpt`, `gemini`); an Anthropic model `claude`; another API model the letters it
/// starts with (`gpt-4.1` → `gpt`, `o3` → `gpt`, `llama3.1` → `llama`); a scripted or command
/// backend is a family of its own (a simulated model).
pub fn family(r: &Role) -> String {
    let lower = |s: &str| s.to_ascii_lowercase();
    match r.adapter.as_str() {
        "acp" => match r.preset.as_deref().map(lower).as_deref() {
            Some("codex") => "gpt".into(),
            Some(p) => p.to_string(),
            None => "acp".into(),
        },
        "anthropic" => "claude".into(),
        "openai" => {
            let m = lower(r.model.as_deref().unwrap_or(""));
            let lead: String = m.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
            match lead.as_str() {
                "o" | "chatgpt" | "gpt" => "gpt".into(),
                "" => m,
                other => other.to_string(),
            }
        }
        _ => backend(r),
    }
}

/// Every panel of `pack` seated from its profile: each seat a bound role (`profile_invalid`
/// naming the seat otherwise), and the seats distinct in what the panel asks
/// (`panel_backends_not_distinct`, naming the seats that share one).
pub fn check(pack: &Pack) -> Result<(), Refusal> {
    for (i, p) in pack.phases.iter().enumerate() {
        if p.kind != PhaseKind::Panel {
            continue;
        }
        let seats = p.seats();
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        for seat in &seats {
            let Some(r) = pack.profile.role(seat).filter(|r| !r.adapter.is_empty()) else {
                let role = p.role.as_deref().unwrap_or_default();
                return Err(Refusal::new(
                    Code::ProfileInvalid,
                    format!(
                        "role {seat}: adapter: panel {} seats {} reviewers, and {seat} is not bound",
                        p.name,
                        seats.len()
                    ),
                )
                .detail(json!({"role": seat, "field": "adapter", "phase": p.name}))
                .hint(format!(
                    "name the role once per reviewer: --role {role}=ADAPTER:MODEL, each on another backend"
                )));
            };
            let key = match p.distinct {
                Distinct::Backend => backend(r),
                Distinct::Family => family(r),
            };
            if let Some(other) = seen.insert(key.clone(), seat) {
                return Err(Refusal::new(
                    Code::PanelBackendsNotDistinct,
                    format!(
                        "panel {}: reviewers {other} and {seat} share the {} {key}",
                        p.name,
                        p.distinct.as_str()
                    ),
                )
                .detail(json!({"phase": p.name, "field": format!("phases[{i}].reviewers"),
                    "seats": [other, seat], "distinct": p.distinct.as_str(), "shared": key}))
                .hint("bind each reviewer to another backend (and, for distinct = \"family\", another model family)"));
            }
        }
    }
    Ok(())
}

/// The reviewers' findings side by side: each finding once, with every seat that reported
/// it (the same file, line and title, compared without case or surrounding space) and how
/// each classed it (`blocking`, `non_blocking`, `suggestions`). A finding one reviewer
/// reports and another does not, or one classed differently, is a disagreement: kept and
/// marked, never voted away. `by_seat` maps each seat to its findings' content (seats that
/// wrote none are left out: their state says why).
pub fn merge(by_seat: &BTreeMap<String, Value>) -> Value {
    // (file, line, title) → the first wording seen, and each seat's class for it
    type Classes = BTreeMap<String, String>;
    let mut merged: BTreeMap<(String, i64, String), (Value, Classes)> = BTreeMap::new();
    for (seat, content) in by_seat {
        for class in ["blocking", "non_blocking", "suggestions"] {
            for f in content[class].as_array().into_iter().flatten() {
                let title = f["title"].as_str().unwrap_or("").trim().to_lowercase();
                let file = f["file"].as_str().unwrap_or("").to_string();
                let line = f["line"].as_i64().unwrap_or(0);
                let e = merged
                    .entry((file, line, title))
                    .or_insert_with(|| (f.clone(), BTreeMap::new()));
                e.1.entry(seat.clone()).or_insert_with(|| class.to_string());
            }
        }
    }
    let seats: Vec<&String> = by_seat.keys().collect();
    let items: Vec<Value> = merged
        .into_values()
        .map(|(f, classes)| {
            let agreed = classes.len() == seats.len()
                && classes.values().all(|c| Some(c) == classes.values().next());
            json!({"title": f["title"], "file": f["file"], "line": f["line"],
                "detail": f["detail"], "classes": classes, "disagreement": !agreed})
        })
        .collect();
    let blocking = items
        .iter()
        .filter(|i| {
            i["classes"]
                .as_object()
                .is_some_and(|c| c.values().any(|v| v == "blocking"))
        })
        .count();
    json!({"reviewers": seats, "findings": items, "blocking_any": blocking,
        "disagreements": items.iter().filter(|i| i["disagreement"] == true).count()})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    const PANEL: &str = r#"name = "p"

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 2
writes = ["findings"]
"#;

    fn pack(text: &str, bindings: &[(&str, &str, &str)]) -> Pack {
        let mut p = Pack::load(text, &Profile::default()).unwrap();
        for (role, adapter, model) in bindings {
            p.profile.bind(role, adapter, model);
        }
        p
    }

    #[test]
    fn a_panel_needs_every_seat_bound_to_its_own_backend() {
        let one = pack(PANEL, &[("review", "openai", "gpt-4.1")]);
        let e = check(&one).unwrap_err();
        assert_eq!(
            (e.code, e.detail["role"].as_str()),
            (Code::ProfileInvalid, Some("review-2"))
        );
        let same = pack(
            PANEL,
            &[
                ("review", "openai", "gpt-4.1"),
                ("review-2", "openai", "gpt-4.1"),
            ],
        );
        let e = check(&same).unwrap_err();
        assert_eq!(e.code, Code::PanelBackendsNotDistinct);
        assert_eq!(e.detail["seats"], json!(["review", "review-2"]));
        let two = pack(
            PANEL,
            &[
                ("review", "openai", "gpt-4.1"),
                ("review-2", "openai", "gpt-4.1-mini"),
            ],
        );
        check(&two).unwrap();
        // two sizes of one family are distinct backends, not distinct families
        let fam = pack(
            &PANEL.replace("reviewers = 2", "reviewers = 2\ndistinct = \"family\""),
            &[
                ("review", "openai", "gpt-4.1"),
                ("review-2", "openai", "o3"),
            ],
        );
        let e = check(&fam).unwrap_err();
        assert_eq!(
            (e.code, e.detail["shared"].as_str()),
            (Code::PanelBackendsNotDistinct, Some("gpt"))
        );
        let fam = pack(
            &PANEL.replace("reviewers = 2", "reviewers = 2\ndistinct = \"family\""),
            &[
                ("review", "acp", "codex"),
                ("review-2", "anthropic", "claude-sonnet-4-5"),
            ],
        );
        check(&fam).unwrap();
    }

    #[test]
    fn findings_are_merged_side_by_side_and_disagreements_kept() {
        let mut by = BTreeMap::new();
        by.insert(
            "review".to_string(),
            json!({"blocking": [{"title": "Off by one", "file": "a.rs", "line": 3}],
                "non_blocking": [], "suggestions": [{"title": "rename x"}]}),
        );
        by.insert(
            "review-2".to_string(),
            json!({"blocking": [], "non_blocking": [{"title": "off by one ", "file": "a.rs", "line": 3}],
                "suggestions": [{"title": "Rename x"}]}),
        );
        let m = merge(&by);
        assert_eq!(m["findings"].as_array().unwrap().len(), 2, "{m}");
        let off = m["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["file"] == "a.rs")
            .unwrap();
        assert_eq!(
            off["classes"],
            json!({"review": "blocking", "review-2": "non_blocking"})
        );
        assert_eq!(
            off["disagreement"], true,
            "classed differently: shown, not voted"
        );
        let rename = m["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["file"].is_null())
            .unwrap();
        assert_eq!(rename["disagreement"], false);
        assert_eq!(
            (m["blocking_any"].clone(), m["disagreements"].clone()),
            (json!(1), json!(1))
        );
    }
}
