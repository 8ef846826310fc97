//! API models driven by a bounded tool-calling loop whose tools are Room's own (the caller's
//! `ToolHost` runs them under the launch's credential), in two dialects: `openai` (chat
//! completions, which OpenAI and local servers such as Ollama or vLLM speak) and `anthropic`
//! (the Messages API).
//!
//! One launch is one loop: the wake as the user message, then at most `rounds_max` completions;
//! each tool call the model makes is run and its result (or refusal) handed back, until the
//! model answers without a tool call or a bound is reached. Every bound is explicit: rounds,
//! tool calls per round, response bytes, tool result bytes, the deadline.
//!
//! What the model showed is reported, never inferred: how many completions answered (a valid
//! completion proves the prompt reached the model), whether it ended its turn, each call's
//! token usage, and every malformed or truncated response as an error. A reply is proven only
//! by Room's own journal.

use serde::Serialize;
use serde_json::{Value, json};
use std::time::Duration;

/// Completions one loop may ask for at most (the route's `rounds_max` is clamped to this).
pub const ROUNDS_MAX: u32 = 64;
/// Tool calls of one completion that are run; more are answered as refused.
pub const TOOL_CALLS_PER_ROUND_MAX: usize = 16;
/// Bytes of one response body read at most; a longer one is malformed.
pub const RESPONSE_BYTES_MAX: usize = 4 << 20;
/// Bytes of one tool result handed back to the model (a page is at most 24 KiB).
pub const TOOL_RESULT_BYTES_MAX: usize = 32 << 10;
/// Bytes of an error body kept in the report.
const ERROR_BODY_BYTES_MAX: usize = 512;
/// Bytes the whole conversation (prompt, answers, tool results) may grow to; every request
/// resends it.
pub const CONVERSATION_BYTES_MAX: usize = 8 << 20;

/// A tool the model may call: what chat completions calls a function.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// What running a tool gave back: its text, and whether it was refused.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    pub text: String,
    pub is_error: bool,
}

/// Runs the model's tool calls (in the daemon: Room's tools, as the launch's recipient).
pub trait ToolHost: Send + Sync {
    fn tools(&self) -> Vec<ToolSpec>;
    fn call(
        &self,
        name: &str,
        args: Value,
    ) -> impl std::future::Future<Output = ToolOutcome> + Send;
}

/// Which API the loop speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `POST {base}/chat/completions`, `Authorization: Bearer`, `tools[].function`.
    OpenAi,
    /// `POST {base}/messages`, `x-api-key` and `anthropic-version`, `tool_use` and
    /// `tool_result` blocks.
    Anthropic,
}

/// The base URL of an `anthropic` route that names none.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";
/// Completions one wake may take when its route says nothing.
pub const ROUNDS_DEFAULT: u32 = 16;

/// The `anthropic-version` header the Messages API dialect sends.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` of a Messages API request when the route sets none (the API requires one).
pub const ANTHROPIC_MAX_TOKENS_DEFAULT: u32 = 4_096;

/// One loop to run.
#[derive(Debug, Clone)]
pub struct Turn {
    pub dialect: Dialect,
    /// The API's base URL, up to and including its version (`http://127.0.0.1:11434/v1`,
    /// `https://api.anthropic.com/v1`).
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer`, when set.
    pub api_key: Option<String>,
    pub system: String,
    pub prompt: String,
    pub rounds_max: u32,
    /// Tokens one completion may produce (the Messages API requires it; chat completions
    /// sends it only when set).
    pub max_tokens: Option<u32>,
    /// The time the whole loop may take.
    pub deadline_ms: u64,
}

/// Tokens one completion used, as the API reported them (absent fields are absent).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

/// What the model showed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub model: String,
    /// Valid completions received.
    pub completions: u32,
    pub tool_calls: u32,
    /// Tool calls refused before they ran (unknown tool, arguments that are not a JSON
    /// object, too many in one completion) or refused by Room.
    pub tool_errors: u32,
    /// Per completion, in order.
    pub usage: Vec<Usage>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The last completion's `finish_reason`.
    pub finish_reason: Option<String>,
    /// The model answered without asking for a tool: its turn ended.
    pub turn_ended: bool,
    pub timed_out: bool,
    pub error: Option<String>,
    /// What the model said in its own words over the turn (each completion's text, in order,
    /// cut at `SAID_BYTES_MAX`): what a caller compares with what the turn did. Not part of
    /// the recorded report (the words are the model's; the record keeps what it proved).
    #[serde(skip)]
    pub said: String,
}

/// Bytes of the model's own words a report keeps.
pub const SAID_BYTES_MAX: usize = 16 * 1024;

/// The text of an assistant message in either dialect: chat completions' `content` string,
/// or the Messages API's `text` blocks.
fn message_text(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// `text` added to `said`, bounded by `SAID_BYTES_MAX` on a character boundary.
fn keep_said(said: &mut String, text: &str) {
    if text.is_empty() || said.len() >= SAID_BYTES_MAX {
        return;
    }
    if !said.is_empty() {
        said.push('\n');
    }
    let mut cut = text
        .len()
        .min(SAID_BYTES_MAX - said.len().min(SAID_BYTES_MAX));
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    said.push_str(&text[..cut]);
}

/// What the report proves about delivery, in the ladder's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Proven {
    /// No valid completion came back.
    Nothing,
    /// The model answered on the prompt but did not end its turn.
    Delivered,
    /// The model ended its turn on the prompt.
    TurnEnded,
}

impl Report {
    pub fn proven(&self) -> Proven {
        match (self.completions, self.turn_ended) {
            (0, _) => Proven::Nothing,
            (_, true) => Proven::TurnEnded,
            (_, false) => Proven::Delivered,
        }
    }
}

/// One parsed completion: the assistant message to keep, its tool calls, why it stopped.
struct Completion {
    message: Value,
    calls: Vec<Call>,
    finish_reason: Option<String>,
    usage: Usage,
}

struct Call {
    id: String,
    name: String,
    /// The arguments: chat completions sends a JSON string, the Messages API an object.
    arguments: Args,
}

enum Args {
    Text(String),
    Value(Value),
}

/// The HTTP client a loop uses: no redirects (a key is never sent on to another host).
pub fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())
}

/// Run the loop. Every request is bounded by what is left of `turn.deadline_ms`, and no tool
/// call starts past it; a tool call that has started is never abandoned (what it writes, it
/// writes while the launch's credential still works).
pub async fn run<H: ToolHost>(http: &reqwest::Client, host: &H, turn: Turn) -> Report {
    let mut report = Report {
        model: turn.model.clone(),
        ..Report::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(turn.deadline_ms);
    if let Err(e) = drive(http, host, &turn, deadline, &mut report).await {
        report.timed_out = e.timed_out;
        report.error = Some(e.text);
    }
    report
}

/// Why a loop ended before the model ended its turn.
struct Stop {
    text: String,
    timed_out: bool,
}

impl Stop {
    fn error(text: impl Into<String>) -> Stop {
        Stop {
            text: text.into(),
            timed_out: false,
        }
    }

    fn late() -> Stop {
        Stop {
            text: "the model did not end its turn in time".into(),
            timed_out: true,
        }
    }
}

async fn drive<H: ToolHost>(
    http: &reqwest::Client,
    host: &H,
    turn: &Turn,
    deadline: tokio::time::Instant,
    report: &mut Report,
) -> Result<(), Stop> {
    let tools = tool_list(turn.dialect, host.tools());
    let mut messages = match turn.dialect {
        Dialect::OpenAi => vec![
            json!({"role": "system", "content": turn.system}),
            json!({"role": "user", "content": turn.prompt}),
        ],
        Dialect::Anthropic => vec![json!({"role": "user", "content": turn.prompt})],
    };
    let mut bytes = turn.system.len() + turn.prompt.len();
    let rounds = turn.rounds_max.clamp(1, ROUNDS_MAX);
    for _ in 0..rounds {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(Stop::late());
        }
        let body = request_body(turn, &messages, &tools);
        let c = complete(http, turn, &body, left).await?;
        report.completions += 1;
        report.prompt_tokens += c.usage.prompt_tokens.unwrap_or(0);
        report.completion_tokens += c.usage.completion_tokens.unwrap_or(0);
        report.usage.push(c.usage);
        report.finish_reason = c.finish_reason.clone();
        if matches!(c.finish_reason.as_deref(), Some("length" | "max_tokens")) {
            // an answer cut at its token limit may carry a half-written tool call: run none
            return Err(Stop::error(format!(
                "truncated answer: the model stopped at its token limit ({})",
                c.finish_reason.unwrap_or_default()
            )));
        }
        bytes += c.message.to_string().len();
        keep_said(&mut report.said, &message_text(&c.message));
        messages.push(c.message);
        if c.calls.is_empty() {
            report.turn_ended = true;
            return Ok(());
        }
        let mut results = Vec::new();
        for (i, call) in c.calls.iter().enumerate() {
            if tokio::time::Instant::now() >= deadline {
                return Err(Stop::late());
            }
            report.tool_calls += 1;
            let out = if i >= TOOL_CALLS_PER_ROUND_MAX {
                refused(format!(
                    "not run: at most {TOOL_CALLS_PER_ROUND_MAX} tool calls per answer"
                ))
            } else {
                run_call(host, call).await
            };
            report.tool_errors += u32::from(out.is_error);
            let r = tool_result(turn.dialect, call, &out);
            bytes += r.to_string().len();
            results.push(r);
        }
        if bytes > CONVERSATION_BYTES_MAX {
            return Err(Stop::error(format!(
                "the conversation grew past {CONVERSATION_BYTES_MAX} bytes"
            )));
        }
        match turn.dialect {
            Dialect::OpenAi => messages.extend(results),
            // every result of one answer rides in one user message
            Dialect::Anthropic => messages.push(json!({"role": "user", "content": results})),
        }
    }
    Err(Stop::error(format!(
        "the model used all {rounds} of its rounds without ending its turn"
    )))
}

/// The tools as the dialect names them.
fn tool_list(dialect: Dialect, tools: Vec<ToolSpec>) -> Vec<Value> {
    tools
        .into_iter()
        .map(|t| match dialect {
            Dialect::OpenAi => json!({"type": "function", "function": {"name": t.name,
                "description": t.description, "parameters": t.parameters}}),
            Dialect::Anthropic => json!({"name": t.name, "description": t.description,
                "input_schema": t.parameters}),
        })
        .collect()
}

fn request_body(turn: &Turn, messages: &[Value], tools: &[Value]) -> Value {
    match turn.dialect {
        Dialect::OpenAi => {
            let mut b = json!({"model": turn.model, "messages": messages, "tools": tools});
            if let Some(n) = turn.max_tokens {
                b["max_tokens"] = json!(n);
            }
            b
        }
        Dialect::Anthropic => json!({"model": turn.model,
            "max_tokens": turn.max_tokens.unwrap_or(ANTHROPIC_MAX_TOKENS_DEFAULT),
            "system": turn.system, "messages": messages, "tools": tools}),
    }
}

/// A tool's result as the dialect hands it back, clipped to `TOOL_RESULT_BYTES_MAX`.
fn tool_result(dialect: Dialect, call: &Call, out: &ToolOutcome) -> Value {
    let text = clip(&out.text, TOOL_RESULT_BYTES_MAX);
    match dialect {
        Dialect::OpenAi => json!({"role": "tool", "tool_call_id": call.id, "content": text}),
        Dialect::Anthropic => json!({"type": "tool_result", "tool_use_id": call.id,
            "content": text, "is_error": out.is_error}),
    }
}

fn refused(text: String) -> ToolOutcome {
    ToolOutcome {
        text,
        is_error: true,
    }
}

async fn run_call<H: ToolHost>(host: &H, call: &Call) -> ToolOutcome {
    if !host.tools().iter().any(|t| t.name == call.name) {
        return refused(format!("unknown tool {:?}", call.name));
    }
    let args = match &call.arguments {
        // an empty arguments string is an empty object (some servers send it for no arguments)
        Args::Text(t) if t.trim().is_empty() => Ok(json!({})),
        Args::Text(t) => serde_json::from_str::<Value>(t),
        Args::Value(v) => Ok(v.clone()),
    };
    match args {
        Ok(v @ Value::Object(_)) => host.call(&call.name, v).await,
        Ok(_) => refused("arguments must be a JSON object".into()),
        Err(e) => refused(format!("arguments are not JSON: {e}")),
    }
}

/// One POST of a completion within `left`, read within `RESPONSE_BYTES_MAX` and parsed.
async fn complete(
    http: &reqwest::Client,
    turn: &Turn,
    body: &Value,
    left: Duration,
) -> Result<Completion, Stop> {
    let base = turn.base_url.trim_end_matches('/');
    let url = match turn.dialect {
        Dialect::OpenAi => format!("{base}/chat/completions"),
        Dialect::Anthropic => format!("{base}/messages"),
    };
    let mut req = http
        .post(&url)
        .timeout(left)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).expect("request bodies serialize"));
    match (turn.dialect, &turn.api_key) {
        (Dialect::OpenAi, Some(k)) => req = req.bearer_auth(k),
        (Dialect::Anthropic, k) => {
            req = req.header("anthropic-version", ANTHROPIC_VERSION);
            if let Some(k) = k {
                req = req.header("x-api-key", k);
            }
        }
        (Dialect::OpenAi, None) => {}
    }
    let failed = |e: reqwest::Error, what: &str| {
        if e.is_timeout() {
            Stop::late()
        } else {
            Stop::error(format!("{what}: {e}"))
        }
    };
    let mut resp = req.send().await.map_err(|e| failed(e, &url))?;
    let status = resp.status();
    let mut bytes = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if bytes.len() + c.len() > RESPONSE_BYTES_MAX {
                    return Err(Stop::error(format!(
                        "malformed response: longer than {RESPONSE_BYTES_MAX} bytes"
                    )));
                }
                bytes.extend_from_slice(&c);
            }
            Ok(None) => break,
            // a body cut short (the connection closed before its length) is truncated
            Err(e) => return Err(failed(e, "truncated response")),
        }
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        return Err(Stop::error(format!(
            "the API answered {status}: {}",
            clip(&text, ERROR_BODY_BYTES_MAX)
        )));
    }
    match turn.dialect {
        Dialect::OpenAi => parse(&bytes),
        Dialect::Anthropic => parse_message(&bytes),
    }
    .map_err(Stop::error)
}

/// A Messages API answer: its content blocks, `tool_use` among them, checked field by field.
fn parse_message(bytes: &[u8]) -> Result<Completion, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("malformed response: {e}"))?;
    let Value::Array(content) = &v["content"] else {
        return Err("malformed response: no content list".into());
    };
    let mut calls = Vec::new();
    for (i, b) in content.iter().enumerate() {
        if b["type"] != "tool_use" {
            continue;
        }
        let (Some(id), Some(name)) = (b["id"].as_str(), b["name"].as_str()) else {
            return Err(format!(
                "malformed response: content[{i}] is a tool_use without id or name"
            ));
        };
        calls.push(Call {
            id: id.to_string(),
            name: name.to_string(),
            arguments: Args::Value(b["input"].clone()),
        });
    }
    let u = &v["usage"];
    let (input, output) = (u["input_tokens"].as_u64(), u["output_tokens"].as_u64());
    Ok(Completion {
        // the assistant turn is sent back as it came: its blocks, tool_use ids included
        message: json!({"role": "assistant", "content": content}),
        calls,
        finish_reason: v["stop_reason"].as_str().map(String::from),
        usage: Usage {
            prompt_tokens: input,
            completion_tokens: output,
            total_tokens: input.zip(output).map(|(a, b)| a + b),
        },
    })
}

/// A chat completion's first choice, checked field by field.
fn parse(bytes: &[u8]) -> Result<Completion, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("malformed response: {e}"))?;
    let choice = &v["choices"][0];
    let message = choice["message"].clone();
    if !message.is_object() {
        return Err("malformed response: no choices[0].message".into());
    }
    let mut calls = Vec::new();
    match &message["tool_calls"] {
        Value::Null => {}
        Value::Array(list) => {
            for (i, c) in list.iter().enumerate() {
                let f = &c["function"];
                let (Some(id), Some(name)) = (c["id"].as_str(), f["name"].as_str()) else {
                    return Err(format!(
                        "malformed response: tool_calls[{i}] has no id or function.name"
                    ));
                };
                let arguments = match &f["arguments"] {
                    Value::String(s) => Args::Text(s.clone()),
                    Value::Null => Args::Text(String::new()),
                    // some servers send the object itself
                    other => Args::Value(other.clone()),
                };
                calls.push(Call {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments,
                });
            }
        }
        _ => return Err("malformed response: tool_calls is not a list".into()),
    }
    let u = &v["usage"];
    Ok(Completion {
        message,
        calls,
        finish_reason: choice["finish_reason"].as_str().map(String::from),
        usage: Usage {
            prompt_tokens: u["prompt_tokens"].as_u64(),
            completion_tokens: u["completion_tokens"].as_u64(),
            total_tokens: u["total_tokens"].as_u64(),
        },
    })
}

/// At most `max` bytes of `s`, cut at a character boundary, marked when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut at {max} bytes]", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_with_tool_calls_parses_and_a_bad_one_says_why() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"room_sync","arguments":"{\"room\":\"a\"}"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}"#;
        let c = parse(ok).unwrap();
        assert_eq!(c.calls.len(), 1);
        assert_eq!(c.calls[0].name, "room_sync");
        assert_eq!(c.usage.total_tokens, Some(13));
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
        for (bad, why) in [
            (&b"{\"choices\": [{\"mess"[..], "malformed response"),
            (b"{\"choices\": []}", "no choices[0].message"),
            (
                b"{\"choices\":[{\"message\":{\"tool_calls\":{}}}]}",
                "not a list",
            ),
            (
                b"{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{}}]}}]}",
                "no id or function.name",
            ),
        ] {
            let e = parse(bad).err().unwrap();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn a_messages_api_answer_parses_and_a_bad_one_says_why() {
        let ok = br#"{"type":"message","role":"assistant","content":[{"type":"text","text":"ok"},
            {"type":"tool_use","id":"tu_1","name":"room_sync","input":{"room":"a"}}],
            "stop_reason":"tool_use","usage":{"input_tokens":12,"output_tokens":5}}"#;
        let c = parse_message(ok).unwrap();
        assert_eq!(c.calls.len(), 1);
        assert!(matches!(&c.calls[0].arguments, Args::Value(v) if v["room"] == "a"));
        assert_eq!(c.usage.total_tokens, Some(17));
        assert_eq!(c.message["content"][1]["id"], "tu_1");
        for (bad, why) in [
            (&b"{\"content\": 3}"[..], "no content list"),
            (
                b"{\"content\": [{\"type\": \"tool_use\"}]}",
                "without id or name",
            ),
            (b"not json", "malformed response"),
        ] {
            let e = parse_message(bad).err().unwrap();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn clipping_keeps_characters_whole() {
        assert_eq!(clip("abc", 8), "abc");
        let c = clip("ééé", 3);
        assert!(c.starts_with('é') && c.contains("cut at 3"), "{c}");
    }
}
