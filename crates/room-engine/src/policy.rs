//! Owner policy from `config.toml`: the fleet tier ceiling and the redaction patterns. Checked
//! on every call (a `stat`, and a read when the file changed or changed too recently for its
//! timestamps to tell), so an edit bites on the next call. A policy that
//! cannot be loaded fails closed: the ceiling drops to observer and results are withheld.

use room_core::redact::Redactor;
use room_core::{Code, FileStamp, Fs, Refusal, Tier};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    fleet: Fleet,
    #[serde(default)]
    redaction: Redaction,
    #[serde(default)]
    mcp: Mcp,
    #[serde(default)]
    quotas: Quotas,
    #[serde(default)]
    acceptance: Acceptance,
    /// Per agent, how a wake reaches it: without one, its permits stay queued for its own
    /// MCP session.
    #[serde(default)]
    routes: BTreeMap<String, Route>,
    #[serde(default)]
    dispatch: DispatchLimits,
    #[serde(default)]
    gate: GateLimits,
    #[serde(default)]
    blackboard: room_core::artifact::ArtifactLimits,
    /// Per adapter, the route fields a collaboration's role on it takes (an API role's
    /// `base_url` and `api_key_env`, an ACP role's `command`): its binding gives the rest.
    #[serde(default)]
    backends: BTreeMap<String, toml::Table>,
    /// Per model, its price: money in a cost roll-up comes only from here.
    #[serde(default)]
    prices: BTreeMap<String, Price>,
    #[serde(default)]
    search: SearchConfig,
    #[serde(default)]
    store: StoreConfig,
}

/// `[store]`: where the daemon keeps what it stores (read by `room serve` before the engine
/// opens; the engine itself runs on whatever store it is given).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StoreConfig {
    /// A PostgreSQL url; none: the state dir's embedded store.
    url: Option<String>,
}

/// Whether `url` names a PostgreSQL server (the one store besides the embedded one).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `[store] url` of a config.toml's text, checked: none when it names no store.
pub fn store_url(bytes: &[u8]) -> Result<Option<String>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "config.toml is not UTF-8".to_string())?;
    let cfg: ConfigFile = toml::from_str(text).map_err(|e| format!("config.toml: {e}"))?;
    match cfg.store.url {
        Some(u) if !is_postgres_url(&u) => Err(
            "config.toml: store.url is not a postgres:// url (the embedded store needs none)"
                .to_string(),
        ),
        other => Ok(other),
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SearchConfig {
    #[serde(default)]
    embeddings: Option<Embeddings>,
}

/// `[search.embeddings]`: the owner's OpenAI-compatible embeddings endpoint, which semantic
/// search uses (the daemon sends it the redacted text of events, away from any write, and
/// each semantic query). Without one, semantic search is refused, saying so.
#[derive(Debug, Deserialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Embeddings {
    /// The API's base URL up to its version (`http://127.0.0.1:11434/v1`): `/embeddings` is
    /// posted there. https, or http to this machine when a key is sent.
    pub base_url: String,
    /// The embedding model to ask (1–256 bytes); its vectors are kept per model.
    pub model: String,
    /// The daemon environment variable holding the API key (none: no key sent).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Texts one request carries at most (1..=256, default 32).
    #[serde(default = "embeddings_batch_default")]
    pub batch_max: usize,
    /// The longest one request may take (1 s to 10 min, default 30 s).
    #[serde(default = "embeddings_timeout_default")]
    pub timeout_ms: u64,
}

fn embeddings_batch_default() -> usize {
    32
}

fn embeddings_timeout_default() -> u64 {
    30_000
}

fn check_embeddings(e: &Embeddings) -> Result<(), String> {
    let at = "config.toml: search.embeddings";
    check_api_url(at, &e.base_url, e.api_key_env.is_some())?;
    if e.model.is_empty() || e.model.len() > 256 || e.model.chars().any(char::is_control) {
        return Err(format!("{at}.model must name a model (1-256 bytes)"));
    }
    if let Some(k) = &e.api_key_env
        && (k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    {
        return Err(format!(
            "{at}.api_key_env must be an environment variable name"
        ));
    }
    if !(1..=256).contains(&e.batch_max) {
        return Err(format!("{at}.batch_max must be within 1..=256"));
    }
    if !(1_000..=600_000).contains(&e.timeout_ms) {
        return Err(format!("{at}.timeout_ms must be within 1000..=600000"));
    }
    Ok(())
}

/// A model's price, in US dollars per million tokens in and out.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub usd_per_million_input_tokens: f64,
    pub usd_per_million_output_tokens: f64,
}

/// Check a route given as JSON as the loader would: its shape, then its fields.
pub fn check_route_value(agent: &str, route: &serde_json::Value) -> Result<(), String> {
    let r: Route = serde_json::from_value(route.clone())
        .map_err(|e| format!("config.toml: routes.{agent}: {e}"))?;
    check_route(agent, &r)
}

/// Backends and prices one config names at most.
pub const BACKENDS_MAX: usize = 16;
pub const PRICES_MAX: usize = 256;

/// `[backends.<adapter>]`: each, with its adapter and a placeholder model, must make a route
/// the loader takes.
fn check_backends(cfg: &ConfigFile) -> Result<BTreeMap<String, serde_json::Value>, String> {
    if cfg.backends.len() > BACKENDS_MAX {
        return Err(format!("config.toml: backends: at most {BACKENDS_MAX}"));
    }
    if cfg.prices.len() > PRICES_MAX {
        return Err(format!("config.toml: prices: at most {PRICES_MAX}"));
    }
    for (model, p) in &cfg.prices {
        for v in [
            p.usd_per_million_input_tokens,
            p.usd_per_million_output_tokens,
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "config.toml: prices.{model:?}: a price is a finite number of at least 0"
                ));
            }
        }
    }
    let mut out = BTreeMap::new();
    for (adapter, table) in &cfg.backends {
        let mut v = serde_json::to_value(table).map_err(|e| e.to_string())?;
        let m = v
            .as_object_mut()
            .ok_or_else(|| format!("config.toml: backends.{adapter} is not a table"))?;
        if m.contains_key("adapter") || m.contains_key("model") || m.contains_key("preset") {
            return Err(format!(
                "config.toml: backends.{adapter}: adapter, model and preset come from a role's binding"
            ));
        }
        let mut probe = m.clone();
        probe.insert("adapter".into(), adapter.clone().into());
        match adapter.as_str() {
            "openai" | "anthropic" => {
                probe.insert("model".into(), "placeholder".into());
            }
            "acp" => {
                probe.insert("preset".into(), "claude".into());
            }
            _ => {}
        }
        let route: Route = serde_json::from_value(serde_json::Value::Object(probe))
            .map_err(|e| format!("config.toml: backends.{adapter}: {e}"))?;
        check_route(&format!("backends-{adapter}"), &route)?;
        out.insert(adapter.clone(), v);
    }
    Ok(out)
}

/// The turnstile's bounds (`[gate]`): how long a refused turn's retry slot is held for it,
/// how many turns may wait in one room, and how long one may wait in all.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct GateLimits {
    pub turn_slot_ms: u64,
    /// 0: no turnstile (every turn goes straight to the gate).
    pub turn_queue_max: u64,
    pub turn_wait_ms_max: u64,
}

/// `[gate] turn_slot_ms` bounds.
pub const TURN_SLOT_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=60_000;
/// `[gate] turn_queue_max` bound.
pub const TURN_QUEUE_MAX_LIMIT: u64 = 4096;
/// `[gate] turn_wait_ms_max` bounds.
pub const TURN_WAIT_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=600_000;

impl Default for GateLimits {
    fn default() -> Self {
        GateLimits {
            turn_slot_ms: 500,
            turn_queue_max: 256,
            turn_wait_ms_max: 10_000,
        }
    }
}

impl GateLimits {
    fn check(&self) -> Result<(), String> {
        if !TURN_SLOT_MS_RANGE.contains(&self.turn_slot_ms) {
            return Err(format!(
                "config.toml: gate.turn_slot_ms {} is not within {TURN_SLOT_MS_RANGE:?}",
                self.turn_slot_ms
            ));
        }
        if self.turn_queue_max > TURN_QUEUE_MAX_LIMIT {
            return Err(format!(
                "config.toml: gate.turn_queue_max {} is more than {TURN_QUEUE_MAX_LIMIT}",
                self.turn_queue_max
            ));
        }
        if !TURN_WAIT_MS_RANGE.contains(&self.turn_wait_ms_max) {
            return Err(format!(
                "config.toml: gate.turn_wait_ms_max {} is not within {TURN_WAIT_MS_RANGE:?}",
                self.turn_wait_ms_max
            ));
        }
        Ok(())
    }
}

/// How many workers the dispatcher keeps running at once, across every route, and when an
/// unanswered obligation is folded to `dead_obligation`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DispatchLimits {
    workers_max: u64,
    obligation_fold_ms: u64,
    untasked_deadline_ms: u64,
    tasked_deadline_ms: u64,
    /// Per model route (a name routes give as `model_route`), the workers of every route
    /// naming it that may run at once: a model or backend that several agents share is
    /// loaded no more than its owner allows.
    model_routes: BTreeMap<String, u64>,
    /// Below this many free bytes on the state directory's file system no worker starts
    /// (its permits wait, `state_dir_space_low`): what is left is the journals' reserve.
    state_dir_free_bytes_min: u64,
    /// The most the workers' share of the state directory (`workers/`: logs, staged
    /// sources) may hold before no worker starts (`worker_space_quota`).
    workers_bytes_max: u64,
}

/// Free bytes the state directory's file system keeps for the journals by default (1 GiB).
pub const STATE_DIR_FREE_BYTES_MIN_DEFAULT: u64 = 1 << 30;
/// The workers' share of the state directory by default (8 GiB).
pub const WORKERS_BYTES_MAX_DEFAULT: u64 = 8 << 30;

/// The bounds of `[dispatch] untasked_deadline_ms` and `tasked_deadline_ms`: a permit sealed
/// under them keeps its own deadline, whatever the config says later.
pub const WAKE_DEADLINE_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=24 * 3_600_000;

/// How long past its wake deadline an unanswered obligation stays `pending` by default.
pub const OBLIGATION_FOLD_MS_DEFAULT: u64 = 10 * 60_000;
/// The longest `[dispatch] obligation_fold_ms` may be (30 days).
pub const OBLIGATION_FOLD_MS_MAX: u64 = 30 * 24 * 3_600_000;

/// Workers running at once when `[dispatch] workers_max` says nothing.
pub const WORKERS_MAX_DEFAULT: usize = 8;
/// The most `[dispatch] workers_max` may allow.
pub const WORKERS_MAX_LIMIT: u64 = 256;

impl Default for DispatchLimits {
    fn default() -> Self {
        DispatchLimits {
            workers_max: WORKERS_MAX_DEFAULT as u64,
            obligation_fold_ms: OBLIGATION_FOLD_MS_DEFAULT,
            untasked_deadline_ms: room_core::wake::UNTASKED_DEADLINE_MS,
            tasked_deadline_ms: room_core::wake::TASKED_DEADLINE_MS,
            model_routes: BTreeMap::new(),
            state_dir_free_bytes_min: STATE_DIR_FREE_BYTES_MIN_DEFAULT,
            workers_bytes_max: WORKERS_BYTES_MAX_DEFAULT,
        }
    }
}

/// Model routes `[dispatch.model_routes]` may name.
pub const MODEL_ROUTES_MAX: usize = 64;

/// A model route's name: 1-64 bytes of letters, digits, `.`, `_`, `-`, `:` (the tags' alphabet).
fn is_label(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b))
}

/// How the dispatcher delivers an agent's wakes: an adapter and what it runs.
#[derive(Debug, Deserialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// `command` (a one-shot program: the wake prompt on stdin), `acp` (an Agent Client
    /// Protocol agent: the wake is a prompt in a session given Room's MCP server) or `script`
    /// (Room's own scripted agent, following `steps`).
    pub adapter: String,
    /// `command` and `acp`: the absolute program and its exact arguments (no shell, no PATH
    /// lookup).
    #[serde(default)]
    pub command: Vec<String>,
    /// `acp`: what a known agent needs beyond its command (`claude`, `codex`, `gemini`): the
    /// environment names it reads, the settings it must have, an `authenticate` method.
    #[serde(default)]
    pub preset: Option<String>,
    /// `acp`: how the agent's permission requests are answered: `reject` (the default) or
    /// `allow_once`.
    #[serde(default)]
    pub permissions: Option<String>,
    /// `acp`: the kinds of tool (`read`, `edit`, `delete`, `move`, `search`, `execute`,
    /// `think`, `fetch`, `switch_mode`, `other`) a permission request may be allowed for;
    /// a request for another kind is rejected. Empty (the default): any kind. A delegated
    /// principal's scopes narrow it further at each launch (`LaunchAccess`).
    #[serde(default)]
    pub tool_kinds: Vec<String>,
    /// `acp`: `new` (the default: each wake opens a session) or `never` (the first wake's
    /// session is bound to the agent and every later wake is delivered into it with
    /// `session/load`; a launch that cannot load it fails rather than open a sibling).
    #[serde(default)]
    pub spawn_policy: Option<String>,
    /// `openai` and `anthropic`: the API's base URL up to its version
    /// (`http://127.0.0.1:11434/v1`; `anthropic` defaults to `https://api.anthropic.com/v1`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// `openai` and `anthropic`: the model to ask.
    #[serde(default)]
    pub model: Option<String>,
    /// `openai` and `anthropic`: the daemon environment variable holding the API key (none:
    /// no key sent).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `openai` and `anthropic`: completions one wake may take at most (1..=64, default 16).
    #[serde(default)]
    pub rounds_max: Option<u32>,
    /// `openai` and `anthropic`: tokens one completion may produce (1..=1,000,000; `anthropic`
    /// defaults to 4,096, `openai` sends none unless set).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `script`: the steps, in order (`read`, `reply`, `write:PATH`, `exit`, `fail`, `hang`).
    #[serde(default)]
    pub steps: Vec<String>,
    /// Names of the daemon's environment variables the worker gets (nothing else passes).
    #[serde(default)]
    pub env: Vec<String>,
    /// The worker's working directory (absolute; default: the state directory's `workers/`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// `command`, `acp` and `script`: a working tree Room made for this worker beneath the
    /// state directory's `trees/` (a collaboration's implementing role): the worker starts
    /// in it and may write there (confined, it is bound back beneath the hidden state
    /// directory); the project itself stays as `project` says.
    #[serde(default)]
    pub tree: Option<String>,
    /// The longest a worker may run (bounded by the permit's own deadline too).
    #[serde(default = "route_timeout_ms")]
    pub timeout_ms: u64,
    /// `command`, `acp` and `script`: `none` runs the worker in a network namespace with no
    /// interface (model access, if any, only through Room); `host` (the default) leaves it
    /// the machine's network.
    #[serde(default)]
    pub network: Option<String>,
    /// `command`, `acp` and `script` in a project room: `read_only` lets the worker read the
    /// project and write nothing in it (its changes come back as proposals, `task_propose`);
    /// `writable` (the default) leaves it as the machine has it.
    #[serde(default)]
    pub project: Option<String>,
    /// `command`, `acp` and `script`: absolute paths of programs, beyond Room's own binary and
    /// the route's program, that may reach the launch's broker (a process of the job running
    /// anything else is refused; an interpreter runs a script, so name the interpreter).
    #[serde(default)]
    pub broker_programs: Vec<String>,
    /// Labels its sessions carry in the session factory (at most 16, each 1–64 bytes of
    /// letters, digits, `.`, `_`, `-`, `:`).
    #[serde(default)]
    pub tags: Vec<String>,
    /// The model route its workers draw on: a name of `[dispatch.model_routes]`, whose bound
    /// every route naming it shares (a permit past it waits, `worker_route_capacity`).
    #[serde(default)]
    pub model_route: Option<String>,
}

/// Programs a route may add to its broker's.
pub const BROKER_PROGRAMS_MAX: usize = 8;

fn route_timeout_ms() -> u64 {
    10 * 60_000
}

/// An `openai` or `anthropic` route: a base URL (`anthropic` may leave it to the adapter's
/// default) that is https, or http to this machine only when a key would be sent; a model, a
/// plain environment name for the key, bounds within their ranges, no command, steps, env or
/// cwd (the loop runs in the daemon).
fn check_api_route(at: &str, r: &Route) -> Result<(), String> {
    match r.base_url.as_deref() {
        None if r.adapter == "anthropic" => {}
        None => return Err(format!("{at}.base_url must be an http:// or https:// URL")),
        Some(url) => check_api_url(at, url, r.api_key_env.is_some())?,
    }
    if r.model
        .as_deref()
        .is_none_or(|m| m.is_empty() || m.len() > 256)
    {
        return Err(format!("{at}.model must name a model (1-256 bytes)"));
    }
    if let Some(k) = &r.api_key_env
        && (k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    {
        return Err(format!(
            "{at}.api_key_env must be an environment variable name"
        ));
    }
    if r.rounds_max.is_some_and(|n| !(1..=64).contains(&n)) {
        return Err(format!("{at}.rounds_max must be within 1..=64"));
    }
    if r.max_tokens.is_some_and(|n| !(1..=1_000_000).contains(&n)) {
        return Err(format!("{at}.max_tokens must be within 1..=1000000"));
    }
    if !r.command.is_empty() || !r.steps.is_empty() || !r.env.is_empty() || r.cwd.is_some() {
        return Err(format!(
            "{at}: an {} route runs no command and no steps, and has no env or cwd",
            r.adapter
        ));
    }
    Ok(())
}

/// https anywhere; http only to a loopback host when a key rides along (a key is never sent
/// in clear across a network).
fn check_api_url(at: &str, url: &str, with_key: bool) -> Result<(), String> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", ""));
    if !matches!(scheme, "http" | "https") || rest.is_empty() || url.contains(char::is_whitespace) {
        return Err(format!("{at}.base_url must be an http:// or https:// URL"));
    }
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if scheme == "http" && with_key && !loopback {
        return Err(format!(
            "{at}.base_url: an API key is sent only over https, or over http to this machine"
        ));
    }
    Ok(())
}

/// The ACP agents a route may name as its `preset`.
pub const ACP_PRESETS: [&str; 3] = ["claude", "codex", "gemini"];
/// How a route may answer an ACP agent's permission requests.
pub const ACP_PERMISSIONS: [&str; 2] = ["reject", "allow_once"];
/// The kinds of tool an ACP agent names in a permission request (ACP's `ToolKind`).
pub const ACP_TOOL_KINDS: [&str; 10] = [
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
];
/// The kinds that change the project (held by `project:write`) and that run a program
/// (held by `tools:execute`).
pub const WRITE_TOOL_KINDS: [&str; 3] = ["edit", "delete", "move"];
pub const EXECUTE_TOOL_KINDS: [&str; 1] = ["execute"];

/// Steps the scripted agent knows.
pub const SCRIPT_STEPS: [&str; 14] = [
    "read", "reply", "exit", "fail", "hang", "claim", "done", "diff", "decline", "ask", "dispatch",
    "close", "stubborn", "leak",
];

/// `reply:TEXT`: the scripted agent answers each obligation of its wake with TEXT (1..=256
/// bytes, no comma: the steps travel comma-separated; no control character).
pub fn is_reply_text_step(step: &str) -> bool {
    step.strip_prefix("reply:").is_some_and(|t| {
        !t.is_empty() && t.len() <= 256 && !t.contains(',') && !t.chars().any(char::is_control)
    })
}

/// `put:KIND=PATH`: the scripted agent writes the JSON file at PATH (absolute, at most 256
/// bytes, no `.`, `..` or empty component, no comma) as a new version of the blackboard
/// artifact KIND, for its wake's task.
/// `fulfil:PATH`: the scripted agent writes every artifact its wake's task's acceptance
/// names (kind and key), each with the JSON file at PATH (absolute, as `put:`'s).
pub fn is_fulfil_step(step: &str) -> bool {
    step.strip_prefix("fulfil:")
        .is_some_and(|p| is_put_step(&format!("put:spec={p}")))
}

pub fn is_put_step(step: &str) -> bool {
    step.strip_prefix("put:")
        .and_then(|s| s.split_once('='))
        .is_some_and(|(address, path)| {
            let (kind, key) = address.split_once('@').unwrap_or((address, "main"));
            room_core::artifact::ArtifactKind::parse("kind", kind).is_ok()
                && room_core::artifact::check_key("key", key).is_ok()
                && path.len() <= 256
                && !path.contains(',')
                && !path.chars().any(char::is_control)
                && path
                    .strip_prefix('/')
                    .is_some_and(|p| p.split('/').all(|c| !c.is_empty() && c != "." && c != ".."))
        })
}

/// `write:PATH`: the scripted agent writes its wake's prompt text to PATH beneath its working
/// directory (a relative path of at most 256 bytes, no `.`, `..` or empty component, no comma:
/// the steps travel comma-separated).
pub fn is_write_step(step: &str) -> bool {
    step.strip_prefix("write:").is_some_and(|p| {
        !p.is_empty()
            && p.len() <= 256
            && !p.contains(',')
            && !p.chars().any(char::is_control)
            && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
    })
}
/// Tags one route may give its sessions.
pub const ROUTE_TAGS_MAX: usize = 16;
/// The longest route timeout.
pub const ROUTE_TIMEOUT_MS_MAX: u64 = 60 * 60_000;

fn check_route(agent: &str, r: &Route) -> Result<(), String> {
    let at = format!("config.toml: routes.{agent}");
    match r.adapter.as_str() {
        "command" | "acp" => match r.command.first() {
            Some(p) if p.starts_with('/') && !p.split('/').any(|x| x == "." || x == "..") => {}
            _ => {
                return Err(format!(
                    "{at}.command must start with an absolute program path"
                ));
            }
        },
        "script" => {
            if let Some(s) = r.steps.iter().find(|s| {
                !SCRIPT_STEPS.contains(&s.as_str())
                    && !is_write_step(s)
                    && !is_put_step(s)
                    && !is_fulfil_step(s)
                    && !is_reply_text_step(s)
            }) {
                return Err(format!(
                    "{at}.steps: {s:?} is not one of {SCRIPT_STEPS:?} nor write:PATH (relative, without . or .. or commas) nor put:KIND[@KEY]=PATH nor fulfil:PATH (absolute) nor reply:TEXT (no commas)"
                ));
            }
        }
        "openai" | "anthropic" => check_api_route(&at, r)?,
        other => {
            return Err(format!(
                "{at}.adapter {other:?} is not command, acp, openai, anthropic or script"
            ));
        }
    }
    let api_fields = r.base_url.is_some()
        || r.model.is_some()
        || r.api_key_env.is_some()
        || r.rounds_max.is_some()
        || r.max_tokens.is_some();
    if !matches!(r.adapter.as_str(), "openai" | "anthropic") && api_fields {
        return Err(format!(
            "{at}: base_url, model, api_key_env, rounds_max and max_tokens are for the openai and anthropic adapters"
        ));
    }
    if !r.broker_programs.is_empty() {
        if matches!(r.adapter.as_str(), "openai" | "anthropic") {
            return Err(format!(
                "{at}: broker_programs is for workers that run as processes (command, acp, script)"
            ));
        }
        if r.broker_programs.len() > BROKER_PROGRAMS_MAX {
            return Err(format!(
                "{at}.broker_programs: at most {BROKER_PROGRAMS_MAX}"
            ));
        }
        if let Some(p) = r
            .broker_programs
            .iter()
            .find(|p| !p.starts_with('/') || p.split('/').any(|x| x == "." || x == ".."))
        {
            return Err(format!(
                "{at}.broker_programs: {p:?} is not an absolute path"
            ));
        }
    }
    if r.tags.len() > ROUTE_TAGS_MAX {
        return Err(format!("{at}.tags: at most {ROUTE_TAGS_MAX}"));
    }
    if let Some(t) = r.tags.iter().find(|t| !is_label(t)) {
        return Err(format!(
            "{at}.tags: {t:?} is not 1-64 bytes of letters, digits, '.', '_', '-', ':'"
        ));
    }
    if r.adapter != "script" && !r.steps.is_empty() {
        return Err(format!("{at}: steps are for the script adapter"));
    }
    if r.adapter != "acp" && r.spawn_policy.is_some() {
        return Err(format!("{at}: spawn_policy is for the acp adapter"));
    }
    if let Some(n) = r.network.as_deref() {
        if matches!(r.adapter.as_str(), "openai" | "anthropic") {
            return Err(format!(
                "{at}: network is for workers that run as processes (command, acp, script)"
            ));
        }
        if !["none", "host"].contains(&n) {
            return Err(format!("{at}.network {n:?} is not none or host"));
        }
    }
    if let Some(p) = r.project.as_deref() {
        if matches!(r.adapter.as_str(), "openai" | "anthropic") {
            return Err(format!(
                "{at}: project is for workers that run as processes (command, acp, script)"
            ));
        }
        if !["read_only", "writable"].contains(&p) {
            return Err(format!("{at}.project {p:?} is not read_only or writable"));
        }
    }
    if let Some(p) = r
        .spawn_policy
        .as_deref()
        .filter(|p| !["new", "never"].contains(p))
    {
        return Err(format!("{at}.spawn_policy {p:?} is not new or never"));
    }
    if r.adapter != "acp" && (r.preset.is_some() || r.permissions.is_some()) {
        return Err(format!(
            "{at}: preset and permissions are for the acp adapter"
        ));
    }
    if r.adapter != "acp" && !r.tool_kinds.is_empty() {
        return Err(format!("{at}: tool_kinds is for the acp adapter"));
    }
    if r.tool_kinds.len() > ACP_TOOL_KINDS.len() {
        return Err(format!(
            "{at}.tool_kinds: at most {} kinds",
            ACP_TOOL_KINDS.len()
        ));
    }
    if let Some(k) = r
        .tool_kinds
        .iter()
        .find(|k| !ACP_TOOL_KINDS.contains(&k.as_str()))
    {
        return Err(format!(
            "{at}.tool_kinds {k:?} is not one of {ACP_TOOL_KINDS:?}"
        ));
    }
    if let Some(p) = r.preset.as_deref().filter(|p| !ACP_PRESETS.contains(p)) {
        return Err(format!("{at}.preset {p:?} is not one of {ACP_PRESETS:?}"));
    }
    if let Some(p) = r
        .permissions
        .as_deref()
        .filter(|p| !ACP_PERMISSIONS.contains(p))
    {
        return Err(format!(
            "{at}.permissions {p:?} is not one of {ACP_PERMISSIONS:?}"
        ));
    }
    if let Some(t) = r.tree.as_deref() {
        if matches!(r.adapter.as_str(), "openai" | "anthropic") {
            return Err(format!(
                "{at}: tree is for workers that run as processes (command, acp, script)"
            ));
        }
        let plain = std::path::Path::new(t)
            .components()
            .skip(1)
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !t.starts_with('/') || !plain || r.cwd.is_some() {
            return Err(format!(
                "{at}.tree must be an absolute path of plain names, and cwd unset (the worker starts in its tree)"
            ));
        }
    }
    if r.cwd.as_deref().is_some_and(|c| !c.starts_with('/')) {
        return Err(format!("{at}.cwd must be absolute"));
    }
    if !(1_000..=ROUTE_TIMEOUT_MS_MAX).contains(&r.timeout_ms) {
        return Err(format!(
            "{at}.timeout_ms must be 1000..={ROUTE_TIMEOUT_MS_MAX}"
        ));
    }
    Ok(())
}

/// What acceptance checks may run: `command` programs by absolute path, exactly as listed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Acceptance {
    #[serde(default)]
    commands: Vec<String>,
    /// Distinct first-hand origins every `evidence_origins` check needs at least.
    #[serde(default = "one")]
    evidence_origins_min: u32,
    /// The wall time one evaluation's commands and probes may take in all; each runs within
    /// what is left, and those left when it is spent are unconfirmed.
    #[serde(default = "evaluation_ms_default")]
    evaluation_ms_max: u64,
}

fn evaluation_ms_default() -> u64 {
    EVALUATION_MS_DEFAULT
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            commands: Vec::new(),
            evidence_origins_min: one(),
            evaluation_ms_max: EVALUATION_MS_DEFAULT,
        }
    }
}

/// An evaluation's wall time by default (20 minutes: a tasked wake's deadline).
pub const EVALUATION_MS_DEFAULT: u64 = 20 * 60_000;
/// The bounds of `[acceptance] evaluation_ms_max` (1 s to 2 h).
pub const EVALUATION_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=2 * 3_600_000;

fn one() -> u32 {
    1
}

/// Limits per agent that keep one member from exhausting a room or the daemon. The defaults
/// are far above what a team of agents writes; an owner lowers them in `[quotas]`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Bytes of text and task titles one agent may write into one room within a minute.
    pub bytes_per_minute: u64,
    /// Tasks one agent may have created and not yet settled (done or declined) in one room.
    pub tasks_open: u64,
    /// MCP sessions one agent may hold open at once over HTTP.
    pub mcp_sessions: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            bytes_per_minute: 64 << 20,
            tasks_open: 10_000,
            mcp_sessions: 64,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mcp {
    /// Per host kind, the `_meta` key that carries the host's native conversation id.
    #[serde(default = "default_conversation_meta")]
    conversation_meta: BTreeMap<String, String>,
}

impl Default for Mcp {
    fn default() -> Self {
        Mcp {
            conversation_meta: default_conversation_meta(),
        }
    }
}

fn default_conversation_meta() -> BTreeMap<String, String> {
    BTreeMap::from([("codex".to_string(), "threadId".to_string())])
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fleet {
    #[serde(default = "operator")]
    ceiling: String,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            ceiling: operator(),
        }
    }
}

fn operator() -> String {
    "operator".into()
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Redaction {
    #[serde(default)]
    patterns: Vec<String>,
}

/// The policy in force for one call.
#[derive(Clone)]
pub struct Policy {
    pub ceiling: Tier,
    pub redactor: Result<Arc<Redactor>, String>,
    /// Per host kind, the request-metadata key naming the native conversation.
    pub conversation_meta: Arc<BTreeMap<String, String>>,
    pub quotas: Quotas,
    /// Programs (absolute paths) an acceptance `command` check may run.
    pub acceptance_commands: Arc<Vec<String>>,
    /// The owner-wide minimum of distinct origins behind an `evidence_origins` check.
    pub evidence_origins_min: u32,
    /// The wall time one evaluation's commands and probes may take in all.
    pub evaluation_ms_max: u64,
    /// Per agent, how its wakes are delivered.
    pub routes: Arc<BTreeMap<String, Route>>,
    /// Workers running at once, across every route (a permit beyond it waits, queued).
    pub workers_max: usize,
    /// Per model route, workers running at once across the routes that name it.
    pub model_routes: Arc<BTreeMap<String, usize>>,
    /// Free bytes of the state directory's file system below which no worker starts.
    pub state_dir_free_bytes_min: u64,
    /// The workers' share of the state directory (`workers/`) past which no worker starts.
    pub workers_bytes_max: u64,
    /// How long past its wake deadline an unanswered obligation stays `pending`.
    pub obligation_fold_ms: u64,
    /// The deadline a wake permit is sealed with, untasked and task-bound (the seed's 60 s and
    /// 20 minutes unless `[dispatch]` says otherwise); queue time counts against it.
    pub untasked_deadline_ms: u64,
    pub tasked_deadline_ms: u64,
    /// The turnstile's bounds.
    pub gate: GateLimits,
    /// The blackboard's limits (`[blackboard]`).
    pub blackboard: room_core::artifact::ArtifactLimits,
    /// `[backends.<adapter>]`, as JSON route fields.
    pub backends: Arc<BTreeMap<String, serde_json::Value>>,
    /// `[prices."<model>"]`.
    pub prices: Arc<BTreeMap<String, Price>>,
    /// `[search.embeddings]`, if the owner configured an endpoint.
    pub embeddings: Option<Arc<Embeddings>>,
}

impl Policy {
    /// The redactor, or the `tool_result_withheld` refusal when none could be established.
    pub fn redactor(&self) -> Result<&Redactor, Refusal> {
        self.redactor.as_deref().map_err(|why| {
            Refusal::new(
                Code::ToolResultWithheld,
                "result withheld: the redaction policy could not be loaded",
            )
            .hint(format!("fix config.toml: {why}"))
        })
    }
}

/// A file changed less than this long ago may change again within the same timestamp tick,
/// leaving its stamp as it was ("racy" in git's words): such a version is re-read on every
/// call until it has settled.
const RACY_MS: i128 = 2_000;

struct Seen {
    stamp: Option<FileStamp>,
    /// The stamp alone proves the content unchanged.
    settled: bool,
    bytes: Vec<u8>,
    policy: Policy,
}

pub(crate) struct PolicyCache {
    path: PathBuf,
    fs: Arc<dyn Fs>,
    cached: Mutex<Option<Seen>>,
}

impl PolicyCache {
    pub fn new(path: PathBuf, fs: Arc<dyn Fs>) -> Self {
        PolicyCache {
            path,
            fs,
            cached: Mutex::new(None),
        }
    }

    /// The policy in force now: one `stat` when config.toml has not changed, a read (and a
    /// parse if the bytes differ) when it has or may have.
    pub fn current(&self, now_ms: u64) -> Policy {
        let stamp = match self.fs.stamp(&self.path) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return failed(format!("config.toml unreadable: {e}")),
        };
        if let Some(seen) = self.cached.lock().expect("policy cache lock").as_ref()
            && seen.settled
            && seen.stamp == stamp
        {
            return seen.policy.clone();
        }
        let bytes = match self.fs.read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return failed(format!("config.toml unreadable: {e}")),
        };
        let settled = match stamp {
            // a file created since would change the stamp
            None => bytes.is_empty(),
            Some(s) => s.ctime_ns / 1_000_000 + RACY_MS < i128::from(now_ms),
        };
        let mut cache = self.cached.lock().expect("policy cache lock");
        let policy = match cache.as_ref() {
            Some(seen) if seen.bytes == bytes => seen.policy.clone(),
            _ => parse(&bytes),
        };
        *cache = Some(Seen {
            stamp,
            settled,
            bytes,
            policy: policy.clone(),
        });
        policy
    }
}

fn failed(why: String) -> Policy {
    tracing::error!("{why}");
    Policy {
        ceiling: Tier::Observer,
        redactor: Err(why),
        conversation_meta: Arc::new(default_conversation_meta()),
        quotas: Quotas::default(),
        acceptance_commands: Arc::new(Vec::new()),
        evidence_origins_min: 1,
        evaluation_ms_max: EVALUATION_MS_DEFAULT,
        routes: Arc::new(BTreeMap::new()),
        workers_max: WORKERS_MAX_DEFAULT,
        model_routes: Arc::new(BTreeMap::new()),
        state_dir_free_bytes_min: STATE_DIR_FREE_BYTES_MIN_DEFAULT,
        workers_bytes_max: WORKERS_BYTES_MAX_DEFAULT,
        obligation_fold_ms: OBLIGATION_FOLD_MS_DEFAULT,
        untasked_deadline_ms: room_core::wake::UNTASKED_DEADLINE_MS,
        tasked_deadline_ms: room_core::wake::TASKED_DEADLINE_MS,
        gate: GateLimits::default(),
        blackboard: room_core::artifact::ArtifactLimits::default(),
        backends: Arc::new(BTreeMap::new()),
        prices: Arc::new(BTreeMap::new()),
        embeddings: None,
    }
}

fn parse(bytes: &[u8]) -> Policy {
    check_config(bytes).unwrap_or_else(failed)
}

/// The policy a config.toml makes, or why it makes none.
/// The policy a config.toml's bytes make, or why they make none (for tools that read a state
/// dir's config without an engine, such as `room collab check`).
pub fn policy_of(bytes: &[u8]) -> Result<Policy, String> {
    check_config(bytes)
}

pub(crate) fn check_config(bytes: &[u8]) -> Result<Policy, String> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => return Err("config.toml is not UTF-8".into()),
    };
    let cfg: ConfigFile = match toml::from_str(text) {
        Ok(c) => c,
        Err(e) => return Err(format!("config.toml: {e}")),
    };
    if cfg
        .store
        .url
        .as_deref()
        .is_some_and(|u| !is_postgres_url(u))
    {
        return Err(
            "config.toml: store.url is not a postgres:// url (the embedded store needs none)"
                .into(),
        );
    }
    let Some(ceiling) = Tier::parse(&cfg.fleet.ceiling) else {
        return Err(format!(
            "config.toml: fleet.ceiling {:?} is not a tier",
            cfg.fleet.ceiling
        ));
    };
    if let Some((i, c)) = (cfg.acceptance.commands.iter().enumerate())
        .find(|(_, c)| !c.starts_with('/') || c.split('/').any(|x| x == "." || x == ".."))
    {
        return Err(format!(
            "config.toml: acceptance.commands[{i}] {c:?} is not an absolute path"
        ));
    }
    if let Some(why) = cfg.routes.iter().find_map(|(a, r)| check_route(a, r).err()) {
        return Err(why);
    }
    // a dispatch pass looks at the oldest permit of every routed agent
    if cfg.routes.len() > crate::dispatch::ROUTED_AGENTS_PER_PASS_MAX {
        return Err(format!(
            "config.toml: routes: at most {} routed agents ({} given)",
            crate::dispatch::ROUTED_AGENTS_PER_PASS_MAX,
            cfg.routes.len()
        ));
    }
    let workers_max = cfg.dispatch.workers_max;
    if !(1..=WORKERS_MAX_LIMIT).contains(&workers_max) {
        return Err(format!(
            "config.toml: dispatch.workers_max {workers_max} is not within 1..={WORKERS_MAX_LIMIT}"
        ));
    }
    let model_routes = check_model_routes(&cfg)?;
    if !EVALUATION_MS_RANGE.contains(&cfg.acceptance.evaluation_ms_max) {
        return Err(format!(
            "config.toml: acceptance.evaluation_ms_max {} is not within {}..={} (1 s to 2 h)",
            cfg.acceptance.evaluation_ms_max,
            EVALUATION_MS_RANGE.start(),
            EVALUATION_MS_RANGE.end()
        ));
    }
    if cfg.dispatch.workers_bytes_max < 1 << 20 {
        return Err(format!(
            "config.toml: dispatch.workers_bytes_max {} is less than 1 MiB (1048576)",
            cfg.dispatch.workers_bytes_max
        ));
    }
    let fold_ms = cfg.dispatch.obligation_fold_ms;
    if fold_ms > OBLIGATION_FOLD_MS_MAX {
        return Err(format!(
            "config.toml: dispatch.obligation_fold_ms {fold_ms} is more than {OBLIGATION_FOLD_MS_MAX} (30 days)"
        ));
    }
    for (field, ms) in [
        ("untasked_deadline_ms", cfg.dispatch.untasked_deadline_ms),
        ("tasked_deadline_ms", cfg.dispatch.tasked_deadline_ms),
    ] {
        if !WAKE_DEADLINE_MS_RANGE.contains(&ms) {
            return Err(format!(
                "config.toml: dispatch.{field} {ms} is not within {}..={} (1 s to 24 h)",
                WAKE_DEADLINE_MS_RANGE.start(),
                WAKE_DEADLINE_MS_RANGE.end()
            ));
        }
    }
    cfg.gate.check()?;
    cfg.blackboard
        .check()
        .map_err(|why| format!("config.toml: {why}"))?;
    let backends = check_backends(&cfg)?;
    if let Some(e) = &cfg.search.embeddings {
        check_embeddings(e)?;
    }
    match Redactor::new(&cfg.redaction.patterns) {
        Ok(r) => Ok(Policy {
            ceiling,
            redactor: Ok(Arc::new(r)),
            conversation_meta: Arc::new(cfg.mcp.conversation_meta),
            quotas: cfg.quotas,
            acceptance_commands: Arc::new(cfg.acceptance.commands),
            evidence_origins_min: cfg.acceptance.evidence_origins_min.clamp(1, 16),
            evaluation_ms_max: cfg.acceptance.evaluation_ms_max,
            routes: Arc::new(cfg.routes),
            workers_max: workers_max as usize,
            model_routes: Arc::new(model_routes),
            state_dir_free_bytes_min: cfg.dispatch.state_dir_free_bytes_min,
            workers_bytes_max: cfg.dispatch.workers_bytes_max,
            obligation_fold_ms: fold_ms,
            untasked_deadline_ms: cfg.dispatch.untasked_deadline_ms,
            tasked_deadline_ms: cfg.dispatch.tasked_deadline_ms,
            gate: cfg.gate,
            blackboard: cfg.blackboard,
            backends: Arc::new(backends),
            prices: Arc::new(cfg.prices),
            embeddings: cfg.search.embeddings.map(Arc::new),
        }),
        Err(e) => Err(format!("config.toml: {e}")),
    }
}

/// `[dispatch.model_routes]`: at most `MODEL_ROUTES_MAX` names, each bound within
/// 1..=`WORKERS_MAX_LIMIT`; every route's `model_route` must name one of them.
fn check_model_routes(cfg: &ConfigFile) -> Result<BTreeMap<String, usize>, String> {
    let declared = &cfg.dispatch.model_routes;
    if declared.len() > MODEL_ROUTES_MAX {
        return Err(format!(
            "config.toml: dispatch.model_routes: at most {MODEL_ROUTES_MAX}"
        ));
    }
    for (name, n) in declared {
        if !is_label(name) {
            return Err(format!(
                "config.toml: dispatch.model_routes: {name:?} is not 1-64 bytes of letters, digits, '.', '_', '-', ':'"
            ));
        }
        if !(1..=WORKERS_MAX_LIMIT).contains(n) {
            return Err(format!(
                "config.toml: dispatch.model_routes.{name} {n} is not within 1..={WORKERS_MAX_LIMIT}"
            ));
        }
    }
    for (agent, r) in &cfg.routes {
        if let Some(m) = r.model_route.as_deref()
            && !declared.contains_key(m)
        {
            return Err(format!(
                "config.toml: routes.{agent}.model_route {m:?} is not a name of [dispatch.model_routes]"
            ));
        }
    }
    Ok(declared
        .iter()
        .map(|(k, v)| (k.clone(), *v as usize))
        .collect())
}

thread_local! {
    /// The policy of the call running on this thread (see [`OneCall`]), once first read.
    static CALL_POLICY: std::cell::RefCell<Option<Policy>> = const { std::cell::RefCell::new(None) };
    /// Whether a call scope is open on this thread (scopes nest; the outermost owns the policy).
    static IN_CALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One call's scope on this thread: the owner policy is read at the call's first check and
/// holds until the scope ends, so every check of one call sees the same policy, and a call
/// costs one `stat` of config.toml instead of one per check. Dropping it ends the scope, on
/// a panic too.
pub struct OneCall {
    outermost: bool,
    /// Not `Send`: the scope must end on the thread that opened it.
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl OneCall {
    pub(crate) fn enter() -> OneCall {
        let outermost = !IN_CALL.with(|c| c.replace(true));
        OneCall {
            outermost,
            _this_thread: std::marker::PhantomData,
        }
    }
}

impl Drop for OneCall {
    fn drop(&mut self) {
        if self.outermost {
            IN_CALL.with(|c| c.set(false));
            CALL_POLICY.with(|p| p.borrow_mut().take());
        }
    }
}

impl PolicyCache {
    /// The policy for a check: the call's own when a call scope is open, else the current one.
    pub fn for_check(&self, now_ms: u64) -> Policy {
        if !IN_CALL.with(|c| c.get()) {
            return self.current(now_ms);
        }
        if let Some(p) = CALL_POLICY.with(|p| p.borrow().clone()) {
            return p;
        }
        let p = self.current(now_ms);
        CALL_POLICY.with(|c| *c.borrow_mut() = Some(p.clone()));
        p
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests edit real files
mod tests {
    use super::*;

    fn wall_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as u64
    }

    #[test]
    fn backends_prices_and_blackboard_limits_load_only_when_sound() {
        let p = check_config(
            b"[backends.openai]\nbase_url = \"https://api.example.com/v1\"\napi_key_env = \"KEY\"\n\n[prices.\"m\"]\nusd_per_million_input_tokens = 3.0\nusd_per_million_output_tokens = 15\n[blackboard]\nversions_per_key_max = 9\n",
        )
        .unwrap();
        assert_eq!(
            p.backends["openai"]["base_url"],
            "https://api.example.com/v1"
        );
        assert_eq!(p.prices["m"].usd_per_million_output_tokens, 15.0);
        assert_eq!(p.blackboard.versions_per_key_max, 9);
        for (bad, names) in [
            (
                "[backends.openai]\nmodel = \"x\"\nbase_url = \"https://a\"\n",
                "binding",
            ),
            ("[backends.openai]\nbase_url = \"ftp://a\"\n", "base_url"),
            ("[backends.acp]\ncommand = [\"relative\"]\n", "command"),
            (
                "[backends.openai]\nbase_urll = \"https://a\"\n",
                "base_urll",
            ),
            (
                "[prices.\"m\"]\nusd_per_million_input_tokens = -1.0\nusd_per_million_output_tokens = 1.0\n",
                "finite",
            ),
            (
                "[prices.\"m\"]\nusd_per_million_input_tokens = 1.0\n",
                "usd_per_million_output_tokens",
            ),
            (
                "[blackboard]\nkeys_per_collaboration_max = 0\n",
                "keys_per_collaboration_max",
            ),
        ] {
            let why = check_config(bad.as_bytes()).err().expect(bad);
            assert!(why.contains(names), "{bad}: {why}");
        }
    }

    #[test]
    fn wake_deadlines_default_to_the_seed_s_and_load_only_within_their_bounds() {
        let p = check_config(b"").unwrap();
        assert_eq!(
            (p.untasked_deadline_ms, p.tasked_deadline_ms),
            (60_000, 1_200_000)
        );
        let p = check_config(b"[dispatch]\ntasked_deadline_ms = 1500\n").unwrap();
        assert_eq!(
            (p.untasked_deadline_ms, p.tasked_deadline_ms),
            (60_000, 1_500)
        );
        for bad in [
            "[dispatch]\nuntasked_deadline_ms = 999\n",
            "[dispatch]\ntasked_deadline_ms = 86400001\n",
        ] {
            let why = check_config(bad.as_bytes()).err().expect(bad);
            assert!(why.contains("deadline_ms"), "{why}");
        }
    }

    #[test]
    fn an_edit_of_the_same_size_within_one_timestamp_tick_is_seen() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("config.toml");
        let cache = PolicyCache::new(path.clone(), Arc::new(room_store::fs::RealFs));
        assert_eq!(cache.current(wall_ms()).ceiling, Tier::Operator);
        // two versions of equal length, written back to back: their stamps may be equal
        let a = "[fleet]\nceiling = \"member\"   #\n";
        let b = "[fleet]\nceiling = \"observer\" #\n";
        assert_eq!(a.len(), b.len());
        std::fs::write(&path, a).unwrap();
        assert_eq!(cache.current(wall_ms()).ceiling, Tier::Member);
        std::fs::write(&path, b).unwrap();
        assert_eq!(cache.current(wall_ms()).ceiling, Tier::Observer);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(cache.current(wall_ms()).ceiling, Tier::Operator);
    }

    #[test]
    fn one_call_sees_one_policy_and_the_next_call_sees_the_edit() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("config.toml");
        std::fs::write(&path, "[fleet]\nceiling = \"member\"\n").unwrap();
        let cache = PolicyCache::new(path.clone(), Arc::new(room_store::fs::RealFs));
        {
            let _call = OneCall::enter();
            assert_eq!(cache.for_check(wall_ms()).ceiling, Tier::Member);
            std::fs::write(&path, "[fleet]\nceiling = \"observer\"\n").unwrap();
            {
                let _nested = OneCall::enter();
                assert_eq!(cache.for_check(wall_ms()).ceiling, Tier::Member);
            }
            // the nested scope's end does not end the call's
            assert_eq!(cache.for_check(wall_ms()).ceiling, Tier::Member);
        }
        assert_eq!(cache.for_check(wall_ms()).ceiling, Tier::Observer);
        let _next = OneCall::enter();
        assert_eq!(cache.for_check(wall_ms()).ceiling, Tier::Observer);
    }
}
