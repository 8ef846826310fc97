//! Principals: enrollment, rotation, revocation, and the per-call authorization of an agent.
//! A token is 32 bytes from the entropy source (the OS CSPRNG in the daemon), shown once; only
//! its SHA-256 is stored. Every call re-reads the credential, the owner's per-agent policy and
//! the fleet ceiling, so a rotation, revocation or policy change bites on the very next call.

use crate::authority::Authority;
use crate::{Outcome, store_err};
use room_core::canon::digest_of;
use room_core::{Code, Refusal, Tier, Verb, name, sha256_hex};
use room_store::ControlStore;
use room_store::control::AgentRow;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

pub const TOKEN_PREFIX: &str = "room_tok_";
pub const CONVERSATION_BYTES_MAX: usize = 128;
/// Names no agent may be enrolled under: the daemon's (`room`) and the owner console's.
pub const RESERVED_AGENT_NAMES: [&str; 2] = ["room", "owner"];

/// What a transport observed about the other end of a connection, as the operating system
/// reports it. A transport hands this to the engine as it found it; only the engine turns
/// evidence into standing (`Engine::owner`), so no route can present a ready-made owner.
/// More kinds will follow (a dashboard session).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Evidence {
    /// A peer of the daemon's Unix socket: its uid and pid from `SO_PEERCRED`.
    UnixPeer { uid: u32, pid: u32 },
    /// A process inside a launched worker's owned job: on its launch's broker socket
    /// (`launch`), or on the daemon's socket (none). Never the owner, whatever its uid.
    Worker { launch: Option<String>, pid: u32 },
}

/// Where an agent's credential arrived, as the transport knows it: a launch's broker (its
/// peer already checked against the launch's job and pinned programs), the daemon's own
/// in-process callers (an API worker's tool calls), or anywhere else (the owner's socket,
/// HTTP). The engine decides what each admits ([`crate::Engine::credential_admits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialVia<'a> {
    Broker(&'a str),
    Daemon,
    Elsewhere,
}

/// Who is calling, as the transport established it. The engine decides what that allows.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A caller that presents no credential, only what its transport observed about it (the
    /// CLI on the Unix socket). Whether that is the owner is `Engine::owner`'s decision.
    Local(Evidence),
    Agent(AgentCaller),
}

#[derive(Debug, Clone)]
pub struct AgentCaller {
    pub token: String,
    /// The native conversation, from transport metadata, never from model-authored arguments.
    pub conversation: String,
    /// The tier the connection declares; `None` declares no limit of its own.
    pub declared_tier: Option<Tier>,
    /// The transport's ceiling for one page, envelope included, when it is below the engine's
    /// (MCP: a result carries its page twice, as text and as structured content).
    pub page_bytes_max: Option<usize>,
}

/// An authenticated, authorized agent for the duration of one call.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    pub registration_sha256: String,
    pub conversation: String,
    pub tier: Tier,
    /// See [`AgentCaller::page_bytes_max`].
    pub page_bytes_max: Option<usize>,
    /// What a delegated node holds (`delegation`); `None` for a root the owner enrolled.
    pub scopes: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct Enrolled {
    pub name: String,
    pub token: String,
    pub registration_sha256: String,
    pub max_tier: Tier,
}

fn registration_digest(name: &str, secret_sha256: &str, generation: u64, host: &str) -> String {
    digest_of(
        &json!({"agent": name, "secret_sha256": secret_sha256, "generation": generation, "host": host}),
    )
}

pub fn validate_conversation(c: &str) -> Outcome<()> {
    if c.is_empty() || c.len() > CONVERSATION_BYTES_MAX || c.chars().any(char::is_control) {
        return Err(Refusal::invalid(
            "conversation",
            format!("must be 1..={CONVERSATION_BYTES_MAX} bytes without control characters"),
        ));
    }
    Ok(())
}

impl Authority {
    fn new_token(&self) -> (String, String) {
        let token = format!("{TOKEN_PREFIX}{}", self.env.entropy.hex(32));
        let digest = sha256_hex(token.as_bytes());
        (token, digest)
    }

    pub fn enroll(
        &self,
        _owner: &crate::Owner,
        agent: &str,
        max_tier: Tier,
        host: &str,
    ) -> Outcome<Enrolled> {
        name::validate("agent", agent)?;
        name::validate("host", host)?;
        if RESERVED_AGENT_NAMES.contains(&agent) {
            // the journal's own authors: an agent by one of these names would read as the
            // daemon or the owner, and skip the records it must read
            return Err(Refusal::invalid(
                "agent",
                format!(
                    "{agent:?} is reserved (the journal's own authors are {RESERVED_AGENT_NAMES:?})"
                ),
            ));
        }
        let (token, secret) = self.new_token();
        let reg = registration_digest(agent, &secret, 1, host);
        let mut c = self.control();
        if c.agent(agent).map_err(store_err)?.is_some() {
            return Err(Refusal::new(
                Code::AlreadyExists,
                format!("agent {agent:?} is already enrolled"),
            )
            .hint(format!("use `room agent rotate {agent}` for a new token")));
        }
        c.insert_agent(&AgentRow {
            name: agent.into(),
            secret_sha256: secret,
            registration_sha256: reg.clone(),
            generation: 1,
            max_tier: max_tier.as_str().into(),
            host_kind: host.into(),
            created_ms: self.now_ms(),
            revoked_ms: None,
            parent: None,
            scopes: None,
            revoked_by: None,
        })
        .map_err(store_err)?;
        Ok(Enrolled {
            name: agent.into(),
            token,
            registration_sha256: reg,
            max_tier,
        })
    }

    fn agent_row(&self, agent: &str) -> Outcome<AgentRow> {
        name::validate("agent", agent)?;
        self.control()
            .agent(agent)
            .map_err(store_err)?
            .ok_or_else(|| {
                Refusal::new(Code::NotFound, format!("no agent named {agent:?}"))
                    .hint("run `room agent list`")
            })
    }

    /// A new token for an agent; the old one stops working at once. Also lifts a revocation.
    pub fn rotate(&self, _owner: &crate::Owner, agent: &str) -> Outcome<Enrolled> {
        let row = self.agent_row(agent)?;
        // a node revoked with its ancestor's subtree comes back only once that ancestor has
        if let Some(by) = row.revoked_by.as_ref().filter(|by| **by != row.name)
            && self.agent_row(by)?.revoked_ms.is_some()
        {
            return Err(Refusal::invalid(
                "agent",
                format!("{agent} was revoked with its ancestor {by}, which is still revoked"),
            )
            .hint(format!("rotate {by} first")));
        }
        let (token, secret) = self.new_token();
        let reg = registration_digest(agent, &secret, row.generation + 1, &row.host_kind);
        self.control()
            .replace_secret(&row, &secret, &reg, self.now_ms())
            .map_err(store_err)?;
        let max_tier = Tier::parse(&row.max_tier).unwrap_or(Tier::Observer);
        Ok(Enrolled {
            name: agent.into(),
            token,
            registration_sha256: reg,
            max_tier,
        })
    }

    /// Revoke an agent and, in the same durable step, every agent delegated below it.
    pub fn revoke(&self, _owner: &crate::Owner, agent: &str) -> Outcome<Value> {
        let row = self.agent_row(agent)?;
        let revoked = self
            .control()
            .revoke_subtree(
                &row.name,
                self.now_ms(),
                crate::delegation::DELEGATION_DEPTH_MAX as u32,
            )
            .map_err(store_err)?;
        Ok(json!({"agent": agent, "revoked": true, "subtree": revoked}))
    }

    /// The agent row of a name, for the delegation tree.
    pub(crate) fn agent_named(&self, agent: &str) -> Outcome<AgentRow> {
        self.agent_row(agent)
    }

    /// Insert a delegated agent (validated by `delegation`), with a fresh token.
    pub(crate) fn insert_delegated(
        &self,
        agent: &str,
        parent: Option<&str>,
        scopes: Vec<String>,
        max_tier: Tier,
        host: &str,
    ) -> Outcome<Enrolled> {
        let (token, secret) = self.new_token();
        let reg = registration_digest(agent, &secret, 1, host);
        let mut c = self.control();
        if c.agent(agent).map_err(store_err)?.is_some() {
            return Err(Refusal::new(
                Code::AlreadyExists,
                format!("agent {agent:?} is already enrolled"),
            ));
        }
        c.insert_agent(&AgentRow {
            name: agent.into(),
            secret_sha256: secret,
            registration_sha256: reg.clone(),
            generation: 1,
            max_tier: max_tier.as_str().into(),
            host_kind: host.into(),
            created_ms: self.now_ms(),
            revoked_ms: None,
            parent: parent.map(String::from),
            scopes: Some(scopes),
            revoked_by: None,
        })
        .map_err(store_err)?;
        Ok(Enrolled {
            name: agent.into(),
            token,
            registration_sha256: reg,
            max_tier,
        })
    }

    /// Owner policy for one agent: deny or allow verbs, change the max tier.
    pub fn set_agent_policy(
        &self,
        _owner: &crate::Owner,
        agent: &str,
        deny: &[Verb],
        allow: &[Verb],
        max_tier: Option<Tier>,
    ) -> Outcome<Value> {
        self.agent_row(agent)?;
        let mut c = self.control();
        for v in deny {
            c.set_verb_denied(agent, v.as_str(), true)
                .map_err(store_err)?;
        }
        for v in allow {
            c.set_verb_denied(agent, v.as_str(), false)
                .map_err(store_err)?;
        }
        if let Some(t) = max_tier {
            c.set_max_tier(agent, t.as_str()).map_err(store_err)?;
        }
        let denied = c.denied_verbs(agent).map_err(store_err)?;
        let row = c
            .agent(agent)
            .map_err(store_err)?
            .expect("agent checked above and never deleted");
        Ok(json!({"agent": agent, "max_tier": row.max_tier, "denied_verbs": denied}))
    }

    pub fn agents_view(&self, _owner: &crate::Owner) -> Outcome<Value> {
        let c = self.control();
        let mut out = Vec::new();
        for a in c.agents().map_err(store_err)? {
            let mut v = json!({
                "name": a.name,
                "max_tier": a.max_tier,
                "host": a.host_kind,
                "generation": a.generation,
                "registration_sha256": a.registration_sha256,
                "revoked": a.revoked_ms.is_some(),
                "denied_verbs": c.denied_verbs(&a.name).map_err(store_err)?,
            });
            // the delegated identity tree, where the agent is part of it
            if let Some(p) = &a.parent {
                v["parent"] = json!(p);
            }
            if let Some(s) = &a.scopes {
                v["scopes"] = json!(s);
            }
            if let Some(by) = a.revoked_by.as_ref().filter(|by| **by != a.name) {
                v["revoked_by"] = json!(by);
            }
            out.push(v);
        }
        Ok(json!({"agents": out}))
    }

    /// Authenticate a token against the current credential table.
    pub fn authenticate(&self, token: &str) -> Outcome<AgentRow> {
        if let Some(agent) = self.scheduler_agent(token) {
            return scheduler_agent_row(self.control().as_ref(), &agent);
        }
        authenticate_in(self.control().as_ref(), token)
    }

    /// A credential for the daemon's scheduler acting as `agent` (a collaboration's
    /// orchestrator, by its record): held in memory only, valid while this process runs and
    /// the agent is not revoked. The agent's enrolled credential is left as it is.
    /// One per agent per process: asking again returns the same credential, so the map holds
    /// at most one entry per collaboration this process drove.
    pub(crate) fn scheduler_token(&self, agent: &str) -> String {
        let mut map = self.scheduler.lock().expect("scheduler credentials lock");
        if let Some(t) = map.get(&format!("agent:{agent}")) {
            return t.clone();
        }
        let token = format!("{SCHEDULER_TOKEN_PREFIX}{}", self.env.entropy.hex(32));
        map.insert(sha256_hex(token.as_bytes()), agent.to_string());
        map.insert(format!("agent:{agent}"), token.clone());
        token
    }

    fn scheduler_agent(&self, token: &str) -> Option<String> {
        if !token.starts_with(SCHEDULER_TOKEN_PREFIX) {
            return None;
        }
        let digest = sha256_hex(token.as_bytes());
        self.scheduler
            .lock()
            .expect("scheduler credentials lock")
            .get(&digest)
            .cloned()
    }

    /// [`Authority::authenticate`] when control.db is not busy (a commit holds it for an fsync),
    /// `None` otherwise: for a caller that must not block, such as an async HTTP layer, which
    /// then takes the blocking path.
    pub fn try_authenticate(&self, token: &str) -> Option<Outcome<AgentRow>> {
        let c = match self.control.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::WouldBlock) => return None,
            Err(std::sync::TryLockError::Poisoned(_)) => {
                panic!("control lock is never poisoned: no panics while held")
            }
        };
        if c.is_stale() {
            return None;
        }
        if let Some(agent) = self.scheduler_agent(token) {
            return Some(scheduler_agent_row(c.as_ref(), &agent));
        }
        Some(authenticate_in(c.as_ref(), token))
    }

    /// Authenticate and authorize one call of `verb`: credential, effective tier, verb policy.
    pub fn authorize(&self, caller: &AgentCaller, verb: Verb) -> Outcome<Principal> {
        validate_conversation(&caller.conversation)?;
        let row = self.authenticate(&caller.token)?;
        let policy = self.policy();
        let owner_max = Tier::parse(&row.max_tier).unwrap_or(Tier::Observer);
        let declared = caller.declared_tier.unwrap_or(Tier::Operator);
        let tier = declared.min(owner_max).min(policy.ceiling);
        if tier < verb.min_tier() && !crate::planted::bug("04-C02") {
            return Err(Refusal::new(
                Code::TierInsufficient,
                format!(
                    "{verb} needs tier {} but {} acts as {tier}",
                    verb.min_tier(),
                    row.name
                ),
            )
            .detail(json!({
                "verb": verb.as_str(), "needed": verb.min_tier(), "effective": tier,
                "declared": declared, "owner_max": owner_max, "fleet_ceiling": policy.ceiling
            })));
        }
        let denied = self.control().denied_verbs(&row.name).map_err(store_err)?;
        if denied.iter().any(|d| d == verb.as_str()) {
            return Err(Refusal::new(
                Code::VerbDenied,
                format!("the owner denied {verb} to {}", row.name),
            )
            .detail(json!({"verb": verb.as_str()})));
        }
        Ok(Principal {
            name: row.name,
            registration_sha256: row.registration_sha256,
            conversation: caller.conversation.clone(),
            tier,
            page_bytes_max: caller.page_bytes_max,
            scopes: row.scopes,
        })
    }

    /// A self-identifying argument must name the bound principal. A mismatch is refused and
    /// recorded as an integrity signal.
    pub fn check_actor(&self, p: &Principal, claimed: Option<&str>, field: &str) -> Outcome<()> {
        match claimed {
            Some(c) if c != p.name => {
                let signal = json!({
                    "kind": "actor_mismatch", "principal": p.name, "claimed": c,
                    "field": field, "at_ms": self.now_ms(),
                });
                let mut line = serde_json::to_vec(&signal).expect("a signal serializes");
                line.push(b'\n');
                self.env
                    .fs
                    .append(&self.state.integrity_log(), &line)
                    .map_err(Refusal::storage)?;
                Err(Refusal::new(
                    Code::ActorMismatch,
                    format!("{field} names {c:?} but the caller is {}", p.name),
                )
                .detail(json!({"field": field, "claimed": c, "principal": p.name})))
            }
            _ => Ok(()),
        }
    }
}

/// The credential check itself, over a held control lock.
/// The credential check of [`Authority::authenticate`] against a control store opened without
/// an engine: `room mcp` uses it, holding the daemon lock, before it starts a daemon, so that a
/// token that does not authenticate never starts one.
pub fn authenticate_offline(c: &dyn ControlStore, token: &str) -> Outcome<AgentRow> {
    authenticate_in(c, token)
}

/// The agent a running launch's credential acts for, while the launch still stands: the
/// permit it was claimed with is still the queue's, intact; the task it works on (and every
/// ancestor) is not cancelled; its agent is not revoked. Checked again on every call.
fn running_launch_agent(
    c: &dyn ControlStore,
    l: &room_store::control::LaunchRow,
) -> Outcome<AgentRow> {
    if !crate::dispatch::permit_stands(c, l)? {
        return Err(Refusal::new(
            Code::CredentialRevoked,
            format!(
                "the permit launch {} was claimed with changed or is gone: its credential acts no more",
                l.id
            ),
        )
        .detail(serde_json::json!({"launch": l.id, "reason": "permit_changed"})));
    }
    if let Some(t) = crate::dispatch::launch_task_cancelled(c, l)? {
        return Err(Refusal::new(
            Code::CredentialRevoked,
            format!(
                "launch {} worked on task {t}, which was cancelled: its credential acts no more",
                l.id
            ),
        )
        .detail(serde_json::json!({"launch": l.id, "reason": "task_cancelled", "task": t})));
    }
    match c.agent(&l.agent).map_err(store_err)? {
        Some(row) if row.revoked_ms.is_none() => Ok(row),
        _ => Err(Refusal::new(
            Code::CredentialRevoked,
            format!("launch {} acts for an agent that is revoked", l.id),
        )),
    }
}

/// Tokens of the daemon's scheduler (`Authority::scheduler_token`).
pub const SCHEDULER_TOKEN_PREFIX: &str = "room_sch_";

/// The agent a scheduler credential acts as, unless it is gone or revoked since.
fn scheduler_agent_row(c: &dyn ControlStore, agent: &str) -> Outcome<AgentRow> {
    let Some(row) = c.agent(agent).map_err(store_err)? else {
        return Err(Refusal::new(
            Code::CredentialInvalid,
            "credential is not known",
        ));
    };
    if row.revoked_ms.is_some() {
        let by = row.revoked_by.clone().unwrap_or_else(|| row.name.clone());
        return Err(Refusal::new(
            Code::CredentialRevoked,
            format!("credential of {} is revoked", row.name),
        )
        .detail(serde_json::json!({"agent": row.name, "revoked_by": by})));
    }
    Ok(row)
}

fn authenticate_in(c: &dyn ControlStore, token: &str) -> Outcome<AgentRow> {
    let digest = sha256_hex(token.as_bytes());
    if token.starts_with(crate::dispatch::WORKER_TOKEN_PREFIX) {
        // a worker's one-launch credential acts as its launch's agent while the launch runs
        let launch = c.launch_by_secret(&digest).map_err(store_err)?;
        return match launch {
            Some(l) if l.state == "running" => running_launch_agent(c, &l),
            Some(l) => Err(Refusal::new(
                Code::CredentialRevoked,
                format!("the credential of launch {} ended with its launch", l.id),
            )),
            None => Err(Refusal::new(
                Code::CredentialInvalid,
                "credential is not known",
            )),
        };
    }
    if let Some(row) = c.agent_by_secret(&digest).map_err(store_err)? {
        // The lookup was by digest; compare again in constant time before trusting it.
        if bool::from(row.secret_sha256.as_bytes().ct_eq(digest.as_bytes())) {
            if row.revoked_ms.is_some() {
                // revoked with its subtree: the node whose revocation reached it is named
                let by = row.revoked_by.clone().unwrap_or_else(|| row.name.clone());
                let why = if by == row.name {
                    format!("credential of {} is revoked", row.name)
                } else {
                    format!(
                        "credential of {} is revoked: its ancestor {by} was revoked",
                        row.name
                    )
                };
                return Err(Refusal::new(Code::CredentialRevoked, why)
                    .detail(serde_json::json!({"agent": row.name, "revoked_by": by}))
                    .hint("ask the owner for `room agent rotate` to get a new token"));
            }
            return Ok(row);
        }
    }
    if let Some((agent, why)) = c.retired_secret(&digest).map_err(store_err)? {
        return Err(Refusal::new(
            Code::CredentialRevoked,
            format!("credential of {agent} was {why}"),
        )
        .hint("use the current token for this agent"));
    }
    Err(Refusal::new(Code::CredentialInvalid, "credential is not known").hint("check ROOM_TOKEN"))
}
