//! The MCP tool definitions are generated from the wire structs: their limits are the engine's
//! constants, their shape is lean, and what a host pays for them does not grow.

use room_core::scope::SCOPES_PER_TASK_MAX;
use room_engine::invariants::{
    CLAIM_TTL_MS_MAX, CLAIM_TTL_MS_MIN, IDEMPOTENCY_KEY_BYTES_MAX, IDEMPOTENCY_KEY_PATTERN,
    check_key,
};
use room_engine::verbs::TITLE_BYTES_MAX;
use room_engine::{EngineConfig, TEXT_BYTES_MAX};
use room_server::mcp::tools::{self, ToolsMode};
use room_server::mcp::{definitions_bytes, tool_list};
use serde_json::{Value, json};

/// The budget for the definitions (the figures docs/guide.md gives), measured as the Python client
/// dumps them (when first generated from the wire structs: 17,510 full and 2,465 compact; the
/// full refusal loop now rides only on room_sync and room). A change that grows them past it
/// should be a decision, so it has to move these figures. Acceptance (task_create's typed
/// checks and requirements, task_accept_check), lineage (coordination_only), the destination
/// ledger (op_begin, op_effect, op_resolve) and evidence (evidence_register) took them from
/// 15,338 and 2,454 to 20,422 and 2,935; task_amend, task_supersede, room_compose, source_read
/// and task_create's governed to 23,774 and 3,086; `read_through` on each of the nine
/// contribution verbs and the multiplexer (issue 15: read and act in one call) to 25,119 and
/// 3,114; room_cancel (active cancellation, for operator-tier agents) to 25,759 and 3,114;
/// task_create's stage (worker staging selections) to 26,074 and 3,171; task_propose (a
/// worker's change to a projected source, applied by the daemon) to 27,057 and 3,201;
/// `worker_receipt` among the acceptance kinds to 27,121 and 3,201; room_wake_take (a session
/// takes its own queued wake) to 27,785 and 3,261; `audience` on room_note, room_say, room_send,
/// evidence_register and the multiplexer (issue 12: a record withheld from everyone outside it)
/// to 28,455 and 3,321; task_cancel and task_delegate (issue 12: the cancelled status, and
/// delegation named as such), and the multiplexer taking task_supersede's `successor` and
/// task_cancel's `reason`, to 30,324 and 3,412; `artifact` among the acceptance kinds (a
/// phase run's writes, issue 41) to 30,360 and 3,412; `room_search` (issue 46: full-text
/// search, per reader) to these (31,261 and 3,412 measured). The blackboard's own tools are
/// listed only to the principals whose scopes allow them, outside these figures.
const FULL_BYTES_MAX: usize = 31_270;
const COMPACT_BYTES_MAX: usize = 3_415;

fn input(name: &str) -> Value {
    tools::all()
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
        .input
}

#[test]
fn definitions_stay_as_small_as_they_were() {
    let full = definitions_bytes(ToolsMode::Full);
    let compact = definitions_bytes(ToolsMode::Compact);
    println!("tool definitions: full {full} bytes, compact {compact} bytes");
    assert!(full <= FULL_BYTES_MAX, "full definitions take {full} bytes");
    assert!(
        compact <= COMPACT_BYTES_MAX,
        "compact definitions take {compact} bytes"
    );
    assert_eq!(tool_list(ToolsMode::Compact).len(), 2);
}

#[test]
fn measured_as_the_python_client_dumps_them() {
    // ", " and ": " separators, non-ASCII escaped: `{"a": "…"}` is 15 bytes that way
    let tools = serde_json::to_value(tool_list(ToolsMode::Compact)).unwrap();
    let compact_rust = serde_json::to_string(&tools).unwrap();
    let ellipses = compact_rust.matches('…').count();
    let commas_colons = compact_rust
        .chars()
        .scan(false, |in_str, c| {
            let counted = !*in_str && (c == ',' || c == ':');
            if c == '"' {
                *in_str = !*in_str;
            }
            Some(counted)
        })
        .filter(|c| *c)
        .count();
    // escapes inside strings never contain a bare `"` in these definitions
    assert!(!compact_rust.contains("\\\""));
    assert_eq!(
        definitions_bytes(ToolsMode::Compact),
        compact_rust.len() + commas_colons + ellipses * (6 - '…'.len_utf8())
    );
}

#[test]
fn limits_in_the_schemas_are_the_engines_constants() {
    assert_eq!(EngineConfig::default().text_bytes_max, TEXT_BYTES_MAX);
    for t in [
        "room_note",
        "room_say",
        "room_reply",
        "room_send",
        "room_handoff",
        "room_done",
        "room_blocked",
        "room_decline",
        "room_circle",
    ] {
        let p = &input(t)["properties"];
        assert_eq!(p["text"]["maxLength"], json!(TEXT_BYTES_MAX), "{t}");
        assert_eq!(
            p["idempotency_key"]["maxLength"],
            json!(IDEMPOTENCY_KEY_BYTES_MAX),
            "{t}"
        );
        assert_eq!(
            p["idempotency_key"]["pattern"],
            json!(IDEMPOTENCY_KEY_PATTERN),
            "{t}"
        );
    }
    let create = &input("task_create")["properties"];
    assert_eq!(create["title"]["maxLength"], json!(TITLE_BYTES_MAX));
    assert_eq!(create["scopes"]["maxItems"], json!(SCOPES_PER_TASK_MAX));
    assert_eq!(
        create["idempotency_key"]["maxLength"],
        json!(IDEMPOTENCY_KEY_BYTES_MAX)
    );
    assert_eq!(
        create["idempotency_key"]["pattern"],
        json!(IDEMPOTENCY_KEY_PATTERN)
    );
    let claim = &input("task_claim")["properties"];
    assert_eq!(claim["ttl_ms"]["minimum"], json!(CLAIM_TTL_MS_MIN));
    assert_eq!(claim["ttl_ms"]["maximum"], json!(CLAIM_TTL_MS_MAX));
}

#[test]
fn the_key_pattern_is_the_shape_the_engine_accepts() {
    // the pattern is one character class: expand it and compare byte by byte with check_key
    let class = IDEMPOTENCY_KEY_PATTERN
        .strip_prefix("^[")
        .and_then(|p| p.strip_suffix("]+$"))
        .expect("one character class");
    let b = class.as_bytes();
    let mut allowed = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if i + 2 < b.len() && b[i + 1] == b'-' {
            allowed.extend(b[i]..=b[i + 2]);
            i += 3;
        } else {
            allowed.push(b[i]);
            i += 1;
        }
    }
    for byte in 1u8..128 {
        let key = (byte as char).to_string();
        assert_eq!(
            check_key(Some(&key)).is_ok(),
            allowed.contains(&byte),
            "byte {byte:#x}"
        );
    }
    let longest = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX);
    assert!(check_key(Some(&longest)).is_ok());
    assert!(check_key(Some(&format!("{longest}k"))).is_err());
}

#[test]
fn schemas_are_lean_and_typed() {
    fn walk(v: &Value, at: &str) {
        let Value::Object(m) = v else { return };
        for k in ["$schema", "title", "$defs", "default", "format", "anyOf"] {
            assert!(!m.contains_key(k), "{at}: {k}");
        }
        if let Some(t) = m.get("type") {
            assert!(!t.to_string().contains("null"), "{at}: nullable type {t}");
        }
        if let Some(Value::String(d)) = m.get("description") {
            assert!(!d.contains('\n'), "{at}: multi-line description");
        }
        if let Some(Value::Object(props)) = m.get("properties") {
            for (k, v) in props {
                walk(v, &format!("{at}.{k}"));
            }
        }
        if let Some(items) = m.get("items") {
            walk(items, &format!("{at}[]"));
        }
    }
    for t in tools::all() {
        walk(&t.input, t.name);
        assert_eq!(t.input["additionalProperties"], json!(false), "{}", t.name);
    }
    // the multiplexer types every field with one type (single-type dialects such as Gemini's
    // function declarations); `to` is a list of agents, task_create's one recipient a list of one
    let mux = input("room");
    for (k, v) in mux["properties"].as_object().unwrap() {
        assert!(v.get("type").is_some_and(Value::is_string), "room.{k}: {v}");
    }
    assert_eq!(mux["properties"]["to"]["items"], json!({"type": "string"}));
    assert_eq!(mux["properties"]["to"]["type"], json!("array"));
    let args = |v: Value| v.as_object().unwrap().clone();
    assert_eq!(
        tools::multiplexer_args(args(json!({"action": "task_create", "to": ["beta"]}))),
        args(json!({"action": "task_create", "to": "beta"}))
    );
    let send = args(json!({"action": "send", "to": ["beta"]}));
    assert_eq!(tools::multiplexer_args(send.clone()), send);
}

/// docs/reference/mcp.md is generated from the server's own definitions, so it cannot drift:
/// this test renders it and fails when the file differs (`ROOM_UPDATE_DOCS=1` rewrites it).
#[test]
fn the_mcp_reference_is_the_definitions() {
    let mut md = String::from(
        "# MCP tools\n\nGenerated from the server's definitions (`crates/room-server/src/mcp/tools.rs`) by\n`ROOM_UPDATE_DOCS=1 cargo test -p room-server --test tool_definitions`: do not edit by hand.\nEvery host sees the tools of the first part (`/mcp-compact` and `room mcp --tools compact`: only\n`room_sync` and `room`); the blackboard's tools are listed only to a delegated principal whose\nscopes allow each.\n",
    );
    let render = |md: &mut String, t: &tools::ToolDef| {
        md.push_str(&format!(
            "\n### `{}`\n\n{}\n",
            t.name,
            tools::description(t)
        ));
        let required: Vec<&str> = t.input["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let props = t.input["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        if props.is_empty() {
            md.push_str("\nNo arguments.\n");
            return;
        }
        md.push_str("\n| argument | type | required | description |\n|---|---|---|---|\n");
        for (name, p) in props {
            let ty = match &p["type"] {
                Value::String(s) => s.clone(),
                Value::Array(a) => a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" or "),
                _ => "any".into(),
            };
            let desc = p["description"].as_str().unwrap_or("").replace('|', "\\|");
            md.push_str(&format!(
                "| `{name}` | {ty} | {} | {desc} |\n",
                if required.contains(&name.as_str()) {
                    "yes"
                } else {
                    ""
                }
            ));
        }
    };
    md.push_str("\n## Every host\n");
    for t in tools::all() {
        render(&mut md, &t);
    }
    md.push_str("\n## The blackboard (listed by scope)\n");
    for t in tools::blackboard() {
        render(&mut md, &t);
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/mcp.md");
    if std::env::var_os("ROOM_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &md).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == md,
        "docs/reference/mcp.md differs from the definitions: ROOM_UPDATE_DOCS=1 cargo test -p room-server --test tool_definitions"
    );
}
