//! The self-contained HTML form of `room audit TASK` (`--html FILE`): one task's audit report,
//! as the daemon computed it, rendered as a single page a person can send to someone who runs
//! no Room. The page holds everything it shows: one inline style sheet and nothing else. It has
//! no script, no font, no image and nothing it fetches, so it reads the same offline, in a mail
//! client's viewer or years later. Its own content security policy forbids all of those too, so
//! an escape missed here could neither run nor fetch anything. Every string from the report is
//! escaped, and a field that is absent or not of the expected type renders as "—" instead of
//! failing: an audit of a task whose records are damaged is exactly when the page is wanted.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt::Write;

/// What a field that is absent, null or empty renders as.
const NONE: &str = "—";

/// Stands in for a row that one side of a comparison lacks.
static NULL: Value = Value::Null;

/// The page's policy: nothing but its own inline style loads or runs. The page needs nothing
/// else, so this only matters if an escape were ever missed.
const CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'";

/// The whole style: the reader's own fonts, a light and a dark palette whose text contrast is
/// at least 7:1 on every background used, and colors that only repeat what a word says.
const STYLE: &str = r#"
:root { color-scheme: light dark; --fg: #1b1b1b; --bg: #ffffff; --muted: #4d4d4d; --line: #bdbdbd;
  --head: #f0f0f0; --code: #f3f3f3; --ok: #0a5c1f; --ok-bg: #e2f3e7; --bad: #8c1010; --bad-bg: #fbe4e4;
  --warn: #6a4200; --warn-bg: #fff0d1; --unk: #333333; --unk-bg: #ebebeb; --changed: #fff2bf; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #ececec; --bg: #141414; --muted: #bdbdbd; --line: #555555; --head: #232323;
    --code: #262626; --ok: #93e3a8; --ok-bg: #10301a; --bad: #ffb0b0; --bad-bg: #3d1414;
    --warn: #ffd48a; --warn-bg: #382708; --unk: #dddddd; --unk-bg: #2a2a2a; --changed: #3b3209; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
main, footer { max-width: 80rem; margin: 0 auto; padding: 1rem 1.5rem; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; }
h2 { font-size: 1.25rem; margin: 2rem 0 .5rem; border-bottom: 1px solid var(--line); }
h3 { font-size: 1.05rem; margin: 1rem 0 .25rem; }
.lede { font-size: 1.1rem; margin: 0; }
.meta { color: var(--muted); margin: .25rem 0 1rem; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .9em;
  background: var(--code); padding: 0 .2em; border-radius: 3px; overflow-wrap: anywhere; }
.verdict { border: 3px solid; border-radius: 8px; padding: 1rem 1.25rem; margin: 1rem 0; }
.verdict h2 { font-size: 1.75rem; margin: 0; border: 0; }
.verdict.proven { color: var(--ok); background: var(--ok-bg); }
.verdict.failed { color: var(--bad); background: var(--bad-bg); }
.verdict.unproven { color: var(--warn); background: var(--warn-bg); }
.verdict.unknown { color: var(--unk); background: var(--unk-bg); }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; margin: .5rem 0; }
.kv dt { font-weight: 600; }
.kv dd { margin: 0; }
.scroll { overflow-x: auto; margin: .5rem 0; }
.scroll:focus { outline: 2px solid var(--fg); outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; }
th, td { border: 1px solid var(--line); padding: .35rem .5rem; text-align: left; vertical-align: top; }
thead th { background: var(--head); }
tbody th { font-weight: 600; }
tr.changed { background: var(--changed); }
tr.changed th { box-shadow: inset 5px 0 0 var(--warn); }
tr.held { background: var(--warn-bg); }
.ok { color: var(--ok); font-weight: 600; }
.bad { color: var(--bad); font-weight: 600; }
ul.plain { list-style: none; margin: 0; padding: 0; }
.detail { margin-top: .2rem; }
time { white-space: nowrap; }
@media print { .scroll { overflow: visible; } * { print-color-adjust: exact; -webkit-print-color-adjust: exact; } }
"#;

/// The report as one HTML document. Never fails: whatever the report lacks shows as "—".
pub fn render(report: &Value) -> String {
    let verdict = Verdict::of(&report["verdict"]);
    let mut out = String::with_capacity(32 * 1024);
    let _ = writeln!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light dark\">\n\
         <title>Audit of task {}: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>",
        plain(&report["task"]["id"]),
        verdict.word,
    );
    header(&mut out, report, &verdict);
    task_summary(&mut out, &report["task"]);
    acceptance(&mut out, &report["acceptance"]);
    readiness(&mut out, list(&report["readiness"]));
    wakes(&mut out, list(&report["wakes"]));
    holds(&mut out, list(&report["holds"]));
    events(&mut out, list(&report["events"]));
    out.push_str(
        "</main>\n<footer class=\"meta\"><p>Written by <code>room audit</code>. \
         This page loads nothing and runs no script.</p></footer>\n</body>\n</html>\n",
    );
    out
}

/// The verdict as shown. The word always says it; the class only colors what the word says.
struct Verdict {
    /// the word, escaped
    word: String,
    class: &'static str,
    mark: &'static str,
}

impl Verdict {
    fn of(v: &Value) -> Self {
        let (word, class, mark) = match v.as_str() {
            Some("proven") => ("proven".to_owned(), "proven", "✓"),
            Some("failed") => ("failed".to_owned(), "failed", "✗"),
            Some("unproven") => ("unproven".to_owned(), "unproven", "?"),
            // a verdict this page does not know is shown as written, without a color
            Some(other) if !other.is_empty() => (esc(other), "unknown", "?"),
            _ => ("unknown".to_owned(), "unknown", "?"),
        };
        Verdict { word, class, mark }
    }
}

/// The heading, the task's title and the verdict with its reasons: what a reader needs if
/// they read nothing else.
fn header(out: &mut String, report: &Value, verdict: &Verdict) {
    let task = &report["task"];
    let _ = writeln!(
        out,
        "<header>\n<h1>Audit of task <code>{}</code></h1>\n<p class=\"lede\">{}</p>\n\
         <p class=\"meta\">Audited at {}</p>\n</header>",
        plain(&task["id"]),
        cell(&task["title"]),
        time(&report["audited_ms"]),
    );
    let _ = writeln!(
        out,
        "<section class=\"verdict {}\" aria-labelledby=\"verdict\">\n<h2 id=\"verdict\">Verdict: \
         <span aria-hidden=\"true\">{}</span> <span class=\"word\">{}</span></h2>",
        verdict.class, verdict.mark, verdict.word,
    );
    let reasons = list(&report["reasons"]);
    if reasons.is_empty() {
        out.push_str("<p>No reasons given.</p>\n");
    } else {
        out.push_str("<h3>Reasons</h3>\n<ul>\n");
        for r in reasons {
            let _ = writeln!(out, "<li>{}</li>", cell(r));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n");
}

/// Who asked whom for what, and the checks the task declared, numbered from 0 as the
/// reasons name them (`accept[0]`).
fn task_summary(out: &mut String, task: &Value) {
    section(out, "task", "Task");
    out.push_str("<dl class=\"kv\">\n");
    for (label, key) in [
        ("ID", "id"),
        ("Title", "title"),
        ("Room", "room"),
        ("Status", "status"),
        ("Owner", "owner"),
        ("Recipient", "recipient"),
    ] {
        let _ = writeln!(out, "<dt>{label}</dt><dd>{}</dd>", cell(&task[key]));
    }
    out.push_str("</dl>\n<h3>Declared acceptance</h3>\n");
    let checks = list(&task["acceptance"]);
    if checks.is_empty() {
        none(out);
    } else {
        out.push_str("<ol start=\"0\">\n");
        for c in checks {
            let _ = writeln!(out, "<li>{}</li>", criterion(c));
        }
        out.push_str("</ol>\n");
    }
    out.push_str("</section>\n");
}

/// One declared check: its kind, then its other fields as compact JSON.
fn criterion(c: &Value) -> String {
    let Value::Object(fields) = c else {
        return cell(c);
    };
    let rest: Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "kind")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if rest.is_empty() {
        cell(&c["kind"])
    } else {
        format!("{} {}", cell(&c["kind"]), code(&Value::Object(rest)))
    }
}

/// The evaluation recorded when the task was done beside one measured for this audit; a check
/// whose outcome moved between them is marked, in words and in color.
fn acceptance(out: &mut String, acc: &Value) {
    let (recorded, now) = (&acc["recorded"], &acc["now"]);
    section(out, "acceptance", "Acceptance: recorded and now");
    let _ = writeln!(
        out,
        "<dl class=\"kv\">\n<dt>Recorded</dt><dd>{}</dd>\n<dt>Recorded at</dt><dd>{}</dd>\n\
         <dt>Source</dt><dd>{}</dd>\n<dt>Now</dt><dd>{}</dd>\n</dl>",
        pass(&recorded["acceptance_pass"]),
        time(&recorded["at_ms"]),
        cell(&recorded["source"]),
        pass(&now["acceptance_pass"]),
    );
    // the daemon names the changed checks; without its list nothing is claimed either way
    let changed: Option<BTreeSet<u64>> = acc["changed"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_u64).collect());
    let then = list(&recorded["acceptance_results"]);
    let current = list(&now["acceptance_results"]);
    let rows: Vec<Row> = (0..then.len().max(current.len()))
        .map(|i| {
            let (r, n) = (
                then.get(i).unwrap_or(&NULL),
                current.get(i).unwrap_or(&NULL),
            );
            let kind = if r["kind"].is_null() {
                &n["kind"]
            } else {
                &r["kind"]
            };
            // a check one side lacks was not compared, so it is neither changed nor unchanged
            let moved = changed
                .as_ref()
                .filter(|_| !r.is_null() && !n.is_null())
                .map(|c| c.contains(&(i as u64)));
            let (class, mark) = match moved {
                Some(true) => ("changed", "<strong>changed</strong>".to_owned()),
                Some(false) => ("", "unchanged".to_owned()),
                None => ("", NONE.to_owned()),
            };
            let cells = vec![i.to_string(), cell(kind), result(r), result(n), mark];
            Row { class, cells }
        })
        .collect();
    table(
        out,
        "acceptance checks",
        &["#", "Check", "Recorded", "Now", "Since recorded"],
        &rows,
    );
    out.push_str("</section>\n");
}

/// One check's outcome in one evaluation: pass or fail, and what was measured.
fn result(r: &Value) -> String {
    if r.is_null() {
        return NONE.to_owned();
    }
    match &r["detail"] {
        Value::Null => pass(&r["pass"]),
        detail => format!(
            "{}<div class=\"detail\">{}</div>",
            pass(&r["pass"]),
            code(detail)
        ),
    }
}

/// Each event the task depended on: which members confirmed reading it, and which did not.
fn readiness(out: &mut String, events: &[Value]) {
    section(out, "readiness", "Readiness: who had read what");
    let rows: Vec<Row> = events
        .iter()
        .map(|e| Row {
            class: "",
            cells: vec![
                cell(&e["seq"]),
                ident(&e["id"]),
                cell(&e["kind"]),
                cell(&e["actor"]),
                items(&e["confirmed_by"], |c| {
                    format!(
                        "{} through #{} at {}",
                        cell(&c["agent"]),
                        cell(&c["through_seq"]),
                        time(&c["at_ms"]),
                    )
                }),
                items(&e["unconfirmed_by"], cell),
            ],
        })
        .collect();
    let cols = [
        "Seq",
        "Event",
        "Kind",
        "Actor",
        "Confirmed by",
        "Not confirmed by",
    ];
    table(out, "readiness", &cols, &rows);
    out.push_str("</section>\n");
}

/// Each wake sealed for the task: its state, whether its permit still replays, and what each
/// of its launches proved.
fn wakes(out: &mut String, wakes: &[Value]) {
    section(out, "wakes", "Wakes");
    let rows: Vec<Row> = wakes
        .iter()
        .map(|w| Row {
            class: "",
            cells: vec![
                cell(&w["agent"]),
                ident(&w["source_event"]),
                cell(&w["state"]),
                cell(&w["reason"]),
                time(&w["created_ms"]),
                replay(&w["replay"]),
                items(&w["launches"], launch),
            ],
        })
        .collect();
    let cols = [
        "Agent",
        "Source event",
        "State",
        "Reason",
        "Created",
        "Replay",
        "Launches",
    ];
    table(out, "wakes", &cols, &rows);
    out.push_str("</section>\n");
}

/// Whether the wake's permit would be granted again now, and if not, the refusal.
fn replay(r: &Value) -> String {
    match r["passes"].as_bool() {
        Some(true) => {
            "<span class=\"ok\"><span aria-hidden=\"true\">✓</span> passes</span>".to_owned()
        }
        Some(false) => format!(
            "<span class=\"bad\"><span aria-hidden=\"true\">✗</span> fails</span><br>{} {}",
            ident(&r["code"]),
            cell(&r["message"]),
        ),
        None => cell(r),
    }
}

/// One launch of a wake: its state, its outcome, the proof it left and when it ran.
fn launch(l: &Value) -> String {
    format!(
        "{} {}, outcome {}, proof <strong>{}</strong>, {} to {}",
        ident(&l["id"]),
        cell(&l["state"]),
        cell(&l["outcome"]),
        cell(&l["proof"]),
        time(&l["started_ms"]),
        time(&l["ended_ms"]),
    )
}

/// What a cancel held until reconciled; an unresolved hold is marked in words and color.
fn holds(out: &mut String, holds: &[Value]) {
    let held = holds.iter().filter(|h| h["state"] == "held").count();
    section(out, "holds", &format!("Holds ({held} unresolved)"));
    let rows: Vec<Row> = holds
        .iter()
        .map(|h| {
            let is_held = h["state"] == "held";
            let state = if is_held {
                "<strong>held</strong>".to_owned()
            } else {
                cell(&h["state"])
            };
            Row {
                class: if is_held { "held" } else { "" },
                cells: vec![
                    ident(&h["id"]),
                    cell(&h["kind"]),
                    ident(&h["item"]),
                    cell(&h["agent"]),
                    state,
                    cell(&h["outcome"]),
                ],
            }
        })
        .collect();
    table(
        out,
        "holds",
        &["Hold", "Kind", "Item", "Agent", "State", "Outcome"],
        &rows,
    );
    out.push_str("</section>\n");
}

/// The task's events in journal order.
fn events(out: &mut String, events: &[Value]) {
    section(out, "events", &format!("Events ({})", events.len()));
    let rows: Vec<Row> = events
        .iter()
        .map(|e| Row {
            class: "",
            cells: vec![
                cell(&e["seq"]),
                time(&e["hlc_ms"]),
                cell(&e["kind"]),
                cell(&e["actor"]),
                cell(&e["what"]),
                ident(&e["id"]),
            ],
        })
        .collect();
    table(
        out,
        "events",
        &["Seq", "Time", "Kind", "Actor", "What", "Event"],
        &rows,
    );
    out.push_str("</section>\n");
}

/// Opens a section with its heading; `heading` is this module's own text, never the report's.
fn section(out: &mut String, id: &str, heading: &str) {
    let _ = writeln!(
        out,
        "<section aria-labelledby=\"{id}\">\n<h2 id=\"{id}\">{heading}</h2>"
    );
}

fn none(out: &mut String) {
    out.push_str("<p>None.</p>\n");
}

/// One table row: its cells as HTML already escaped, the first its row header, and a class
/// ("" for none).
struct Row {
    class: &'static str,
    cells: Vec<String>,
}

/// A table in a region that scrolls sideways on a narrow screen (focusable, so a keyboard can
/// scroll it too), with a column header per `cols`.
fn table(out: &mut String, label: &str, cols: &[&str], rows: &[Row]) {
    if rows.is_empty() {
        none(out);
        return;
    }
    let _ = write!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-label=\"{}\" tabindex=\"0\">\n<table>\n<thead><tr>",
        esc(label),
    );
    for c in cols {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(c));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        if row.class.is_empty() {
            out.push_str("<tr>");
        } else {
            let _ = write!(out, "<tr class=\"{}\">", row.class);
        }
        for (i, c) in row.cells.iter().enumerate() {
            let tag = if i == 0 { "th scope=\"row\"" } else { "td" };
            let end = if i == 0 { "th" } else { "td" };
            let _ = write!(out, "<{tag}>{c}</{end}>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n</div>\n");
}

/// A list field as a plain list, each item rendered by `each`; "none" when it is empty and
/// "—" when it is absent or not a list.
fn items(v: &Value, each: impl Fn(&Value) -> String) -> String {
    let Some(all) = v.as_array() else {
        return cell(v);
    };
    if all.is_empty() {
        return "none".to_owned();
    }
    let mut s = String::from("<ul class=\"plain\">");
    for item in all {
        let _ = write!(s, "<li>{}</li>", each(item));
    }
    s.push_str("</ul>");
    s
}

/// A list field, or no items when it is absent or not a list.
fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Escaped text for any value, without markup (fit for `<title>` too).
fn plain(v: &Value) -> String {
    match v {
        Value::Null => NONE.to_owned(),
        Value::String(s) if s.is_empty() => NONE.to_owned(),
        Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    }
}

/// A value in a cell: text escaped, anything structured as compact JSON in `<code>`.
fn cell(v: &Value) -> String {
    if v.is_object() || v.is_array() {
        code(v)
    } else {
        plain(v)
    }
}

/// An identifier or code, set in monospace.
fn ident(v: &Value) -> String {
    if v.is_null() {
        NONE.to_owned()
    } else {
        format!("<code>{}</code>", plain(v))
    }
}

fn code(v: &Value) -> String {
    format!("<code>{}</code>", esc(&v.to_string()))
}

/// A pass or a failure in a word with a mark; the color only repeats it.
fn pass(v: &Value) -> String {
    match v.as_bool() {
        Some(true) => {
            "<span class=\"ok\"><span aria-hidden=\"true\">✓</span> pass</span>".to_owned()
        }
        Some(false) => {
            "<span class=\"bad\"><span aria-hidden=\"true\">✗</span> fail</span>".to_owned()
        }
        None => cell(v),
    }
}

/// A millisecond timestamp as UTC text in a `<time>` element; anything else as a value.
fn time(v: &Value) -> String {
    match v.as_u64() {
        Some(ms) => {
            let t = iso_ms(ms);
            format!("<time datetime=\"{t}\">{t}</time>")
        }
        None => cell(v),
    }
}

/// RFC 3339 UTC text for milliseconds since the epoch (no clock, no time zone data).
fn iso_ms(ms: u64) -> String {
    room_core::wake::rfc3339_ms(ms)
}

/// Text made safe for HTML content and for quoted attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const XSS: &str = "<script>alert(1)</script>";

    fn sample() -> Value {
        json!({
            "task": {"id": "tsk_0123456789abcdef", "room": "build", "title": "write out/a.txt",
                     "status": "done", "owner": "alice", "recipient": "bob",
                     "acceptance": [{"kind": "sha256", "path": "out/a.txt", "sha256": "aa"},
                                    {"kind": "file_exists", "path": "out/a.txt"}]},
            "audited_ms": 1_796_644_506_381_u64,
            "verdict": "failed",
            "reasons": ["sha256 (accept[0]) fails now", "bob's launch left no proof"],
            "events": [{"seq": 3, "id": "evt_1", "kind": "task", "actor": "alice",
                        "hlc_ms": 1_796_644_506_381_u64, "what": "created"}],
            "readiness": [{"seq": 1, "id": "evt_0", "kind": "room_created", "actor": "owner",
                           "confirmed_by": [{"agent": "bob", "through_seq": 5,
                                             "at_ms": 1_796_644_506_381_u64}],
                           "unconfirmed_by": ["carol"]}],
            "wakes": [{"agent": "bob", "source_event": "evt_1", "state": "ended", "reason": null,
                       "created_ms": 1_796_644_506_381_u64,
                       "replay": {"passes": false, "code": "wake_room_authority_changed",
                                  "message": "the room's authority changed"},
                       "launches": [{"id": "lch_1", "state": "ended", "outcome": "replied",
                                     "proof": "replied", "started_ms": 1_796_644_506_381_u64,
                                     "ended_ms": 1_796_644_507_381_u64}]}],
            "acceptance": {
                "recorded": {"source": "done event evt_2", "at_ms": 1_796_644_506_381_u64,
                             "acceptance_pass": true,
                             "acceptance_results": [
                                 {"kind": "sha256", "pass": true, "detail": {"actual": "aa"}},
                                 {"kind": "file_exists", "pass": true, "detail": {"path": "out/a.txt"}}]},
                "now": {"acceptance_pass": false,
                        "acceptance_results": [
                            {"kind": "sha256", "pass": false, "detail": {"actual": "bb"}},
                            {"kind": "file_exists", "pass": true, "detail": {"path": "out/a.txt"}}]},
                "changed": [0]
            },
            "holds": [{"id": "hld_1", "kind": "destination_operation", "item": "op_1", "agent": "bob",
                       "state": "held", "outcome": null},
                      {"id": "hld_2", "kind": "destination_operation", "item": "op_2", "agent": "bob",
                       "state": "resolved", "outcome": "reconciled"}]
        })
    }

    #[test]
    fn strings_from_the_report_are_escaped() {
        let mut r = sample();
        r["task"]["title"] = json!(XSS);
        r["events"][0]["actor"] = json!(XSS);
        r["reasons"] = json!([XSS]);
        r["verdict"] = json!(XSS);
        r["acceptance"]["now"]["acceptance_results"][0]["detail"] = json!({"actual": XSS});
        let html = render(&r);
        assert!(!html.to_lowercase().contains("<script"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
    }

    #[test]
    fn the_page_fetches_nothing() {
        let html = render(&sample()).to_lowercase();
        for fetching in [
            "http://", "https://", " src=", " href=", "<link", "<img", "url(", "@import",
        ] {
            assert!(!html.contains(fetching), "{fetching} in {html}");
        }
    }

    #[test]
    fn a_report_missing_everything_renders_unknown() {
        let odd = json!({"task": 3, "events": {"a": 1}, "wakes": [null, 7, {"launches": "x"}],
                         "acceptance": {"recorded": [], "now": {"acceptance_results": [1]},
                                        "changed": "x"},
                         "holds": [{"state": 1}], "readiness": [{"confirmed_by": [null]}]});
        for report in [json!({}), json!(null), json!([1, 2]), json!("x"), odd] {
            let html = render(&report);
            assert!(html.contains("<html"), "{html}");
            assert!(html.contains("unknown"), "{html}");
            assert!(html.ends_with("</html>\n"), "{html}");
        }
    }

    #[test]
    fn a_full_report_shows_its_verdict_reasons_and_changed_check() {
        let html = render(&sample());
        assert!(html.contains("<title>Audit of task tsk_0123456789abcdef: failed</title>"));
        assert!(html.contains("<section class=\"verdict failed\""), "{html}");
        assert!(
            html.contains("<span class=\"word\">failed</span>"),
            "{html}"
        );
        assert!(
            html.contains("<li>sha256 (accept[0]) fails now</li>"),
            "{html}"
        );
        assert!(
            html.contains("<li>bob&#39;s launch left no proof</li>"),
            "{html}"
        );
        // the first check moved and is marked in words; the second did not
        assert_eq!(html.matches("<tr class=\"changed\">").count(), 1, "{html}");
        let row = html
            .split("<tr class=\"changed\">")
            .nth(1)
            .unwrap_or_default();
        let row = row.split("</tr>").next().unwrap_or_default();
        assert!(row.starts_with("<th scope=\"row\">0</th>"), "{row}");
        assert!(row.contains("<strong>changed</strong>"), "{row}");
        assert!(html.contains("<td>unchanged</td>"), "{html}");
        assert!(html.contains("wake_room_authority_changed"), "{html}");
        assert!(html.contains("Holds (1 unresolved)"), "{html}");
        assert!(
            html.contains("<time datetime=\"2026-12-07T11:55:06.381Z\">"),
            "{html}"
        );
    }

    #[test]
    fn headings_descend_one_level_at_a_time() {
        let html = render(&sample());
        let levels: Vec<u8> = html
            .match_indices("<h")
            .filter_map(|(i, _)| html.as_bytes().get(i + 2))
            .copied()
            .filter(u8::is_ascii_digit)
            .collect();
        assert_eq!(levels.first(), Some(&b'1'), "{levels:?}");
        for pair in levels.windows(2) {
            assert!(
                pair[1] <= pair[0] + 1,
                "a heading skips a level: {levels:?}"
            );
        }
    }

    #[test]
    fn esc_covers_the_five_characters() {
        assert_eq!(esc(r#"<a b="c">&'"#), "&lt;a b=&quot;c&quot;&gt;&amp;&#39;");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(iso_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_ms(1_796_644_506_381), "2026-12-07T11:55:06.381Z");
        assert_eq!(iso_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }
}
