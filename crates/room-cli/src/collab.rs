//! `room collab`: collaborative sessions from the command line. Offline: `check` validates a
//! pack and the profile its roles are bound with, against the adapters and ACP presets Room
//! has and the model routes of the state dir's config.toml; `artifact` checks a blackboard
//! artifact against its kind's schema. Through the daemon: `start` (the pack and its prompt
//! files are read here and sent), `status`, `list`, `artifacts`, `show`, `approve`, `revise`,
//! `reject`, `cancel`, `rerun --from PHASE`.

use crate::cmd::{Cli, EXIT_IO, EXIT_REFUSED};
use clap::Subcommand;
use room_collab::pack::{DEFAULT_PROMPTS, Pack};
use room_collab::profile::{Backends, Profile};
use room_core::Refusal;
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum CollabCmd {
    /// Validate a pack (default: the shipped one) and its roles' bindings; prints the phases
    /// in their order and the roles.
    Check {
        /// The pack file (TOML); its prompt files are read beside it.
        #[arg(long)]
        pack: Option<PathBuf>,
        /// Bind a role: NAME=ADAPTER:MODEL (an acp role's MODEL is its preset). Repeatable.
        #[arg(long = "role")]
        roles: Vec<String>,
    },
    /// Check an artifact (JSON) against its kind's schema: spec, research, adr, task-list,
    /// diff, findings or extra/KEY.
    Artifact { kind: String, file: PathBuf },
    /// Start a collaboration on a goal: its room (bound to --project), an orchestrator and one
    /// child per role, each role routed to its backend. Prints its id.
    Start {
        #[arg(long)]
        goal: String,
        /// The project (prj_…) it works on; required when the pack has a gate.
        #[arg(long)]
        project: Option<String>,
        /// The pack file (TOML); its prompt files are read beside it.
        #[arg(long)]
        pack: Option<PathBuf>,
        /// Bind a role: NAME=ADAPTER:MODEL (a script role's MODEL is its steps). Repeatable;
        /// a panel's role once per reviewer.
        #[arg(long = "role")]
        roles: Vec<String>,
        /// A money ceiling in US dollars: past it (or with a cost that cannot be known),
        /// nothing new is dispatched (over the pack's [guards] usd_max).
        #[arg(long)]
        usd_max: Option<f64>,
    },
    /// A collaboration's phases, runs and approval queue (each request with its digest).
    Status { id: String },
    /// Every collaboration.
    List,
    /// The newest version of each artifact on its blackboard.
    Artifacts { id: String },
    /// One artifact with its content: KIND[/KEY] (key main unless named).
    Show {
        id: String,
        artifact: String,
        #[arg(long)]
        version: Option<u32>,
    },
    /// Approve a request, naming the digest of what you were shown.
    Approve {
        approval: String,
        #[arg(long)]
        digest: String,
    },
    /// Approve a request with its prompt replaced by the text of FILE.
    Revise {
        approval: String,
        #[arg(long)]
        digest: String,
        #[arg(long)]
        prompt: PathBuf,
    },
    /// Reject a request: its phase's run ends.
    Reject {
        approval: String,
        #[arg(long)]
        digest: String,
    },
    /// Cancel a collaboration: its room is cancelled, its identities revoked.
    Cancel { id: String },
    /// Run a phase again (after a failure or a rejection); the phases after it follow.
    Rerun {
        id: String,
        #[arg(long = "from")]
        phase: String,
    },
}

pub fn run(cli: &Cli, cmd: &CollabCmd) -> i32 {
    let out = match cmd {
        CollabCmd::Check { pack, roles } => check(cli, pack.as_deref(), roles),
        CollabCmd::Artifact { kind, file } => artifact(kind, file),
        daemon => {
            let req = match request(daemon) {
                Ok(r) => r,
                Err(Failed::Refused(r)) => {
                    if cli.json {
                        println!("{}", json!({"refusal": r}));
                    }
                    eprintln!("{r}");
                    return EXIT_REFUSED;
                }
                Err(Failed::Io(e)) => {
                    eprintln!("error: {e}");
                    return EXIT_IO;
                }
            };
            let sock = crate::cmd::socket(cli);
            let resp =
                room_server::client::Client::connect(&sock).and_then(|mut c| c.request(&req));
            return crate::cmd::print_response(resp, cli.json);
        }
    };
    match out {
        Ok(v) => {
            if cli.json {
                println!("{v}");
            } else {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).expect("values print")
                );
            }
            0
        }
        Err(Failed::Refused(r)) => {
            if cli.json {
                println!("{}", json!({"refusal": r}));
            }
            eprintln!("{r}");
            EXIT_REFUSED
        }
        Err(Failed::Io(e)) => {
            eprintln!("error: {e}");
            EXIT_IO
        }
    }
}

enum Failed {
    Refused(Refusal),
    Io(String),
}

impl From<Refusal> for Failed {
    fn from(r: Refusal) -> Self {
        Failed::Refused(r)
    }
}

/// The bytes a pack or artifact file may hold.
const FILE_BYTES_MAX: u64 = 4 << 20;

fn read_text(path: &Path) -> Result<String, Failed> {
    let meta =
        std::fs::metadata(path).map_err(|e| Failed::Io(format!("{}: {e}", path.display())))?;
    if meta.len() > FILE_BYTES_MAX {
        return Err(Failed::Refused(Refusal::new(
            room_core::Code::PayloadTooLarge,
            format!("{}: more than {FILE_BYTES_MAX} bytes", path.display()),
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| Failed::Io(format!("{}: {e}", path.display())))?;
    String::from_utf8(bytes).map_err(|_| {
        Failed::Refused(Refusal::invalid(
            &path.display().to_string(),
            "not UTF-8 text",
        ))
    })
}

/// What the machine and the owner offer roles: Room's adapters and ACP presets, and the model
/// routes of the state dir's config.toml (none without one; a config that does not load is
/// refused as the daemon would refuse it).
fn backends(cli: &Cli) -> Result<Backends, Failed> {
    let presets: Vec<&str> = room_agents::acp::PRESETS.iter().map(|p| p.name).collect();
    let config = crate::cmd::state_dir(cli).join("config.toml");
    let routes: Vec<String> = match std::fs::read(&config) {
        Ok(bytes) => room_engine::policy::policy_of(&bytes)
            .map_err(|why| Failed::Refused(Refusal::invalid("config.toml", why)))?
            .model_routes
            .keys()
            .cloned()
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Failed::Io(format!("{}: {e}", config.display()))),
    };
    Ok(Backends::room(&presets, &routes))
}

fn check(cli: &Cli, pack: Option<&Path>, roles: &[String]) -> Result<serde_json::Value, Failed> {
    let loaded = match pack {
        None => {
            let p = Pack::default_pack();
            p.check_prompts(|f| {
                DEFAULT_PROMPTS
                    .iter()
                    .find(|(name, _)| *name == f)
                    .map(|(_, t)| t.to_string())
                    .ok_or_else(|| "not shipped".to_string())
            })?;
            p
        }
        Some(path) => {
            let text = read_text(path)?;
            let p = Pack::load(&text, &Profile::default())?;
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            p.check_prompts(|f| {
                let file = dir.join(f);
                let meta = std::fs::symlink_metadata(&file).map_err(|e| e.to_string())?;
                if !meta.is_file() {
                    return Err("not a regular file".into());
                }
                if meta.len() > room_collab::pack::PROMPT_BYTES_MAX as u64 {
                    return Err("too large".into());
                }
                std::fs::read_to_string(&file).map_err(|e| e.to_string())
            })?;
            p
        }
    };
    let mut bound = loaded;
    bound.bind_roles("role", roles)?;
    let before: Vec<String> = bound
        .profile
        .roles
        .iter()
        .filter(|r| !r.adapter.is_empty())
        .map(|r| r.name.clone())
        .collect();
    bound.keep_used_roles();
    // a role bound that no phase runs is configuration with nothing to do here: said
    let unused: Vec<String> = before
        .into_iter()
        .filter(|n| bound.profile.role(n).is_none())
        .collect();
    bound.check_orchestrator()?;
    bound.profile.validate(&backends(cli)?)?;
    room_collab::panel::check(&bound)?;
    let mut view = bound.view();
    view["valid"] = json!(true);
    view["capabilities"] = capabilities(&bound);
    view["unused_bindings"] = json!(unused);
    Ok(view)
}

/// The role picker's matrix: each bound role's adapter capabilities (`room adapters list`;
/// `room adapters probe` checks them), and a flag where its tool deny is advisory: the
/// backend's own tools are held only by the agent asking, or by the worker's confinement.
fn capabilities(pack: &Pack) -> serde_json::Value {
    let roles: Vec<serde_json::Value> = pack
        .profile
        .roles
        .iter()
        .filter(|r| !r.adapter.is_empty())
        .map(|r| {
            let caps = room_agents::coverage::capabilities(&r.adapter);
            let advisory = caps.is_some_and(|c| c.tool_deny == "advisory");
            json!({"role": r.name, "adapter": r.adapter, "capabilities": caps,
                "flag": advisory.then(|| format!(
                    "{}: tool deny is advisory on {} (its own tools are held by asking, or by confinement where the machine confines): check it with room adapters probe {}",
                    r.name, r.adapter, r.adapter))})
        })
        .collect();
    json!(roles)
}

/// The daemon request of a collaboration command (the pack and its prompts read here).
fn request(cmd: &CollabCmd) -> Result<room_server::wire::Request, Failed> {
    use room_server::wire::Request;
    let decide = |approval: &str, digest: &str, verdict: &str| {
        Request::new(
            "collab_decide",
            json!({"approval": approval, "digest": digest, "verdict": verdict}),
        )
    };
    Ok(match cmd {
        CollabCmd::Start {
            goal,
            project,
            pack,
            roles,
            usd_max,
        } => {
            let mut args = json!({"goal": goal, "roles": roles});
            if let Some(u) = usd_max {
                args["usd_max"] = json!(u);
            }
            if let Some(p) = project {
                args["project"] = json!(p);
            }
            if let Some(path) = pack {
                let text = read_text(path)?;
                let loaded = Pack::load(&text, &Profile::default())?;
                let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
                let mut prompts = serde_json::Map::new();
                let files = loaded.phases.iter().filter_map(|p| p.prompt.as_ref());
                for p in files.chain(loaded.orchestrator_prompt.iter()) {
                    prompts.insert(p.clone(), json!(read_text(&dir.join(p))?));
                }
                args["pack"] = json!(text);
                args["prompts"] = serde_json::Value::Object(prompts);
            }
            Request::new("collab_start", args)
        }
        CollabCmd::Status { id } => Request::new("collab_status", json!({"id": id})),
        CollabCmd::List => Request::new("collab_list", json!({})),
        CollabCmd::Artifacts { id } => Request::new("collab_artifacts", json!({"room": id})),
        CollabCmd::Show {
            id,
            artifact,
            version,
        } => {
            let (kind, key) = match artifact.strip_prefix("extra/") {
                Some(rest) => match rest.split_once('/') {
                    Some((k, key)) => (format!("extra/{k}"), Some(key.to_string())),
                    None => (artifact.clone(), None),
                },
                None => match artifact.split_once('/') {
                    Some((k, key)) => (k.to_string(), Some(key.to_string())),
                    None => (artifact.clone(), None),
                },
            };
            let mut args = json!({"room": id, "kind": kind});
            if let Some(k) = key {
                args["key"] = json!(k);
            }
            if let Some(v) = version {
                args["version"] = json!(v);
            }
            Request::new("collab_artifact", args)
        }
        CollabCmd::Approve { approval, digest } => decide(approval, digest, "approve"),
        CollabCmd::Reject { approval, digest } => decide(approval, digest, "reject"),
        CollabCmd::Revise {
            approval,
            digest,
            prompt,
        } => {
            let mut r = decide(approval, digest, "revise");
            r.args["prompt"] = json!(read_text(prompt)?);
            r
        }
        CollabCmd::Cancel { id } => Request::new("collab_cancel", json!({"id": id})),
        CollabCmd::Rerun { id, phase } => {
            Request::new("collab_rerun", json!({"id": id, "phase": phase}))
        }
        CollabCmd::Check { .. } | CollabCmd::Artifact { .. } => {
            unreachable!("offline commands are run where they are")
        }
    })
}

fn artifact(kind: &str, file: &Path) -> Result<serde_json::Value, Failed> {
    let kind = room_collab::ArtifactKind::parse("kind", kind)?;
    let text = read_text(file)?;
    let limits = room_collab::ArtifactLimits::default();
    if text.len() > limits.artifact_bytes_max {
        return Err(Failed::Refused(Refusal::new(
            room_core::Code::PayloadTooLarge,
            format!(
                "an artifact holds at most {} bytes",
                limits.artifact_bytes_max
            ),
        )));
    }
    let content: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Refusal::new(
            room_core::Code::ArtifactSchemaInvalid,
            format!("(content): not JSON: {e}"),
        )
        .detail(json!({"field": "(content)"}))
    })?;
    room_collab::artifact::validate(&kind, &content)?;
    Ok(
        json!({"kind": kind.to_string(), "valid": true, "bytes": text.len(),
        "sha256": room_core::sha256_hex(text.as_bytes())}),
    )
}
