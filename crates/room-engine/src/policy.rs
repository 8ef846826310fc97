//! Owner policy from `config.toml`: the fleet tier ceiling and the redaction patterns. Re-read
//! on every call (cached by file content), so an edit bites on the next call. A policy that
//! cannot be loaded fails closed: the ceiling drops to observer and results are withheld.

use room_core::redact::Redactor;
use room_core::{Code, Refusal, Tier};
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

pub(crate) struct PolicyCache {
    path: PathBuf,
    cached: Mutex<Option<(Vec<u8>, Policy)>>,
}

impl PolicyCache {
    pub fn new(path: PathBuf) -> Self {
        PolicyCache {
            path,
            cached: Mutex::new(None),
        }
    }

    pub fn current(&self) -> Policy {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return failed(format!("config.toml unreadable: {e}")),
        };
        let mut cache = self.cached.lock().expect("policy cache lock");
        if let Some((seen, p)) = cache.as_ref()
            && *seen == bytes
        {
            return p.clone();
        }
        let p = parse(&bytes);
        *cache = Some((bytes, p.clone()));
        p
    }
}

fn failed(why: String) -> Policy {
    tracing::error!("{why}");
    Policy {
        ceiling: Tier::Observer,
        redactor: Err(why),
        conversation_meta: Arc::new(default_conversation_meta()),
    }
}

fn parse(bytes: &[u8]) -> Policy {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => return failed("config.toml is not UTF-8".into()),
    };
    let cfg: ConfigFile = match toml::from_str(text) {
        Ok(c) => c,
        Err(e) => return failed(format!("config.toml: {e}")),
    };
    let Some(ceiling) = Tier::parse(&cfg.fleet.ceiling) else {
        return failed(format!(
            "config.toml: fleet.ceiling {:?} is not a tier",
            cfg.fleet.ceiling
        ));
    };
    match Redactor::new(&cfg.redaction.patterns) {
        Ok(r) => Policy {
            ceiling,
            redactor: Ok(Arc::new(r)),
            conversation_meta: Arc::new(cfg.mcp.conversation_meta),
        },
        Err(e) => failed(format!("config.toml: {e}")),
    }
}
