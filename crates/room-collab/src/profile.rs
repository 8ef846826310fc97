//! Profiles: roles as data. A role binds a name to a backend (`adapter`, `preset`, `model`), a
//! prompt, a policy (tier, tools, budgets, what of the project and the network it may reach)
//! and the purpose tags a dispatch may name to select it. Adding a role (a security reviewer,
//! a test author) is configuration, never code. A profile is validated fail-closed against
//! what exists: the adapters, the ACP presets and the model routes the owner configured; the
//! first thing wrong is `profile_invalid`, naming the role and the field.

use room_core::{Code, Refusal};
use serde::{Deserialize, Serialize};

/// Roles one profile holds at most.
pub const ROLES_MAX: usize = 32;
/// Purpose tags one role serves at most.
pub const PURPOSES_PER_ROLE_MAX: usize = 8;
/// Tool kinds one role's policy names at most (each kind once).
pub const TOOLS_PER_ROLE_MAX: usize = room_engine::policy::ACP_TOOL_KINDS.len();
/// The longest model id, preset or prompt file name.
pub const BINDING_BYTES_MAX: usize = 128;
/// The bounds of a role's tool-call budget per dispatch and of its failures before it is
/// blocked.
pub const TOOL_CALLS_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
pub const FAILURES_RANGE: std::ops::RangeInclusive<u32> = 1..=100;

/// What of the project a role's worker may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjectAccess {
    /// Nothing of it (the orchestrator: it plans and dispatches).
    None,
    /// Read it, write nothing (research, architecture, review).
    Read,
    /// Write it, in a working tree of its own, never the person's checkout (implementation).
    Write,
}

/// A role's policy: its tier, the tools it may call, its budgets, and what it may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolePolicy {
    pub tier: String,
    /// The kinds of its backend's own tools (ACP's: `read`, `edit`, `execute`, `fetch`, …)
    /// its agent may be allowed when it asks; empty: what its scopes give. Its child holds
    /// `tools:execute` when this names `execute`, or is empty and the role writes the
    /// project; edits need `project:write` whatever this says.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Tool calls its child may make in the collaboration, all its launches together (as
    /// the adapters report them); past it, nothing more is dispatched to it.
    pub tool_calls_max: u32,
    /// Tokens (in and out) its child may use in the collaboration; none: no budget.
    #[serde(default)]
    pub tokens_max: Option<u64>,
    /// Consecutive failed runs after which its child is no longer dispatched
    /// (`child_auto_blocked`); 0: never blocked.
    pub failures_max: u32,
    pub project: ProjectAccess,
    #[serde(default)]
    pub network: bool,
}

/// One role, bound to a backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Role {
    pub name: String,
    /// `script`, `command`, `acp`, `openai` or `anthropic` (what `Backends` lists); empty
    /// while unbound (the default profile's roles are, until the person binds them).
    #[serde(default)]
    pub adapter: String,
    /// An ACP preset (`claude`, `codex`, `gemini`), for the `acp` adapter only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// The model id the backend is asked for (required by the API adapters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The owner's model route this role draws on (`[dispatch.model_routes]`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_route: Option<String>,
    /// Its prompt file, relative to the pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    pub policy: RolePolicy,
    /// The purpose tags a dispatch names to select this role (`implement`, `review`, …).
    #[serde(default)]
    pub purposes: Vec<String>,
}

/// What the machine and the owner's configuration offer roles: the adapters that exist, the
/// ACP presets, and the configured model routes.
#[derive(Debug, Clone, Default)]
pub struct Backends {
    pub adapters: Vec<String>,
    pub acp_presets: Vec<String>,
    pub model_routes: Vec<String>,
}

impl Backends {
    /// The adapters Room ships, with the given presets and model routes.
    pub fn room(acp_presets: &[&str], model_routes: &[String]) -> Backends {
        Backends {
            adapters: ["script", "command", "acp", "openai", "anthropic"]
                .map(String::from)
                .to_vec(),
            acp_presets: acp_presets.iter().map(|p| p.to_string()).collect(),
            model_routes: model_routes.to_vec(),
        }
    }
}

/// A collaboration's roles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub roles: Vec<Role>,
}

fn policy(tier: &str, project: ProjectAccess, network: bool) -> RolePolicy {
    RolePolicy {
        tier: tier.into(),
        tools: Vec::new(),
        tool_calls_max: 200,
        tokens_max: None,
        failures_max: 3,
        project,
        network,
    }
}

fn role(name: &str, p: RolePolicy, purposes: &[&str]) -> Role {
    Role {
        name: name.into(),
        adapter: String::new(),
        preset: None,
        model: None,
        model_route: None,
        prompt: None,
        policy: p,
        purposes: purposes.iter().map(|s| s.to_string()).collect(),
    }
}

impl Default for Profile {
    /// The five default roles (the seed's table), unbound: each needs a backend before the
    /// profile validates. The orchestrator plans and dispatches and reaches no project;
    /// search reads and may reach the network; reasoning implements in its own working tree;
    /// architecture and review read.
    fn default() -> Profile {
        use ProjectAccess::{None as Nothing, Read, Write};
        Profile {
            roles: vec![
                role(
                    "orchestrator",
                    policy("coordinator", Nothing, false),
                    &["plan", "synthesize"],
                ),
                role(
                    "search",
                    policy("member", Read, true),
                    &["explore", "research"],
                ),
                role(
                    "reasoning",
                    policy("member", Write, false),
                    &["implement", "fix"],
                ),
                role("architecture", policy("member", Read, false), &["decide"]),
                role("review", policy("member", Read, false), &["review"]),
            ],
        }
    }
}

/// A binding `NAME=ADAPTER:MODEL` (a role, the adapter it runs on, its model or ACP preset),
/// or `invalid_argument` naming `field`.
pub fn parse_binding<'a>(field: &str, s: &'a str) -> Result<(&'a str, &'a str, &'a str), Refusal> {
    let bad = || Refusal::invalid(field, format!("{s:?} is not NAME=ADAPTER:MODEL"));
    let (name, rest) = s.split_once('=').ok_or_else(bad)?;
    let (adapter, model) = rest.split_once(':').ok_or_else(bad)?;
    if name.is_empty() || adapter.is_empty() || model.is_empty() {
        return Err(bad());
    }
    Ok((name, adapter, model))
}

/// `profile_invalid` for `role`'s `field`.
fn invalid(role: &str, field: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(Code::ProfileInvalid, format!("role {role}: {field}: {why}"))
        .detail(serde_json::json!({"role": role, "field": field}))
}

/// A name of roles and purposes: 1..=32 of a-z, 0-9, `_` and `-`, starting with a letter.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn plain(s: &str) -> bool {
    !s.is_empty() && s.len() <= BINDING_BYTES_MAX && !s.chars().any(char::is_control)
}

impl Profile {
    /// The role named `name`.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }

    /// The roles a dispatch naming `purpose` selects (a panel's purpose may select many).
    pub fn roles_for(&self, purpose: &str) -> Vec<&Role> {
        self.roles
            .iter()
            .filter(|r| r.purposes.iter().any(|p| p == purpose))
            .collect()
    }

    /// Bind `role` to `adapter` and `model` (`--role NAME=ADAPTER:MODEL`); an ACP binding's
    /// model is its preset. A role the profile does not have is added with a reader's policy,
    /// serving the purpose of its own name.
    pub fn bind(&mut self, role: &str, adapter: &str, model: &str) {
        let r = match self.roles.iter_mut().position(|r| r.name == role) {
            Some(i) => &mut self.roles[i],
            None => {
                self.roles.push(self::role(
                    role,
                    policy("member", ProjectAccess::Read, false),
                    &[role],
                ));
                self.roles.last_mut().expect("just pushed")
            }
        };
        r.adapter = adapter.into();
        if adapter == "acp" {
            r.preset = Some(model.into());
            r.model = None;
        } else {
            r.model = Some(model.into());
            r.preset = None;
        }
    }

    /// Check every role against `backends`, fail-closed: the first thing wrong is refused.
    pub fn validate(&self, backends: &Backends) -> Result<(), Refusal> {
        if self.roles.is_empty() || self.roles.len() > ROLES_MAX {
            return Err(Refusal::new(
                Code::ProfileInvalid,
                format!("a profile holds 1..={ROLES_MAX} roles"),
            )
            .detail(serde_json::json!({"field": "roles"})));
        }
        let mut seen = std::collections::BTreeSet::new();
        for r in &self.roles {
            if !valid_name(&r.name) {
                return Err(invalid(
                    &r.name,
                    "name",
                    "1..=32 of a-z, 0-9, _ and -, starting with a letter",
                ));
            }
            if !seen.insert(r.name.as_str()) {
                return Err(invalid(&r.name, "name", "named twice"));
            }
            validate_binding(r, backends)?;
            validate_policy(r)?;
        }
        Ok(())
    }
}

fn validate_binding(r: &Role, backends: &Backends) -> Result<(), Refusal> {
    let n = r.name.as_str();
    if r.adapter.is_empty() {
        return Err(invalid(n, "adapter", "the role is not bound to a backend")
            .hint(format!("bind it: --role {n}=ADAPTER:MODEL")));
    }
    if !backends.adapters.contains(&r.adapter) {
        return Err(invalid(
            n,
            "adapter",
            format!(
                "{:?} is not an adapter here (one of {})",
                r.adapter,
                backends.adapters.join(", ")
            ),
        ));
    }
    match (&r.preset, r.adapter.as_str()) {
        (Some(_), a) if a != "acp" => {
            return Err(invalid(n, "preset", "a preset is for the acp adapter only"));
        }
        (Some(p), _) if !backends.acp_presets.contains(p) => {
            return Err(invalid(
                n,
                "preset",
                format!(
                    "{p:?} is not an ACP preset (one of {})",
                    backends.acp_presets.join(", ")
                ),
            ));
        }
        (None, "acp") => return Err(invalid(n, "preset", "an acp role names its preset")),
        _ => {}
    }
    match (&r.model, r.adapter.as_str()) {
        (None, "openai" | "anthropic") => {
            return Err(invalid(n, "model", "an API role names its model"));
        }
        (Some(m), _) if !plain(m) => {
            return Err(invalid(
                n,
                "model",
                format!("1..={BINDING_BYTES_MAX} bytes without control characters"),
            ));
        }
        _ => {}
    }
    if let Some(m) = &r.model_route
        && !backends.model_routes.contains(m)
    {
        return Err(invalid(
            n,
            "model_route",
            format!("{m:?} is not a model route of config.toml [dispatch.model_routes]"),
        ));
    }
    if let Some(p) = &r.prompt
        && (!plain(p) || p.starts_with('/') || p.split('/').any(|c| c == ".." || c.is_empty()))
    {
        return Err(invalid(
            n,
            "prompt",
            "a file relative to the pack, without '..' or empty components",
        ));
    }
    Ok(())
}

fn validate_policy(r: &Role) -> Result<(), Refusal> {
    let n = r.name.as_str();
    let p = &r.policy;
    if room_core::Tier::parse(&p.tier).is_none() {
        return Err(invalid(
            n,
            "policy.tier",
            format!("{:?} is not a tier", p.tier),
        ));
    }
    let kinds = room_engine::policy::ACP_TOOL_KINDS;
    if p.tools.len() > TOOLS_PER_ROLE_MAX || p.tools.iter().any(|t| !kinds.contains(&t.as_str())) {
        return Err(invalid(
            n,
            "policy.tools",
            format!("at most {TOOLS_PER_ROLE_MAX} of the tool kinds {kinds:?}"),
        ));
    }
    if !TOOL_CALLS_RANGE.contains(&p.tool_calls_max) {
        return Err(invalid(
            n,
            "policy.tool_calls_max",
            format!("not within {TOOL_CALLS_RANGE:?}"),
        ));
    }
    if !FAILURES_RANGE.contains(&p.failures_max) {
        return Err(invalid(
            n,
            "policy.failures_max",
            format!("not within {FAILURES_RANGE:?}"),
        ));
    }
    if r.purposes.len() > PURPOSES_PER_ROLE_MAX || r.purposes.iter().any(|t| !valid_name(t)) {
        return Err(invalid(
            n,
            "purposes",
            format!("at most {PURPOSES_PER_ROLE_MAX} tags, each a name"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends() -> Backends {
        Backends::room(&["claude", "codex", "gemini"], &["fast".to_string()])
    }

    fn bound() -> Profile {
        let mut p = Profile::default();
        p.bind("orchestrator", "anthropic", "claude-sonnet");
        p.bind("search", "openai", "gpt-search");
        p.bind("reasoning", "acp", "codex");
        p.bind("architecture", "openai", "o-architect");
        p.bind("review", "acp", "gemini");
        p
    }

    #[track_caller]
    fn refused(p: &Profile, role: &str, field: &str) {
        let r = p.validate(&backends()).unwrap_err();
        assert_eq!(r.code, Code::ProfileInvalid, "{r}");
        assert_eq!(r.detail["role"], role, "{r}");
        assert_eq!(r.detail["field"], field, "{r}");
    }

    #[test]
    fn the_default_profile_has_the_five_roles_and_validates_once_bound() {
        let p = Profile::default();
        let names: Vec<&str> = p.roles.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "orchestrator",
                "search",
                "reasoning",
                "architecture",
                "review"
            ]
        );
        refused(&p, "orchestrator", "adapter");
        bound().validate(&backends()).unwrap();
        assert_eq!(bound().roles_for("implement")[0].name, "reasoning");
        assert_eq!(
            bound().role("orchestrator").unwrap().policy.project,
            ProjectAccess::None
        );
    }

    #[test]
    fn adding_a_role_is_configuration() {
        let mut p = bound();
        p.bind("security-reviewer", "anthropic", "claude-opus");
        p.validate(&backends()).unwrap();
        assert_eq!(p.roles_for("security-reviewer").len(), 1);
    }

    #[test]
    fn each_field_is_refused_by_name() {
        let mut p = bound();
        p.roles[1].adapter = "telepathy".into();
        refused(&p, "search", "adapter");
        let mut p = bound();
        p.roles[2].preset = Some("cursor".into());
        refused(&p, "reasoning", "preset");
        let mut p = bound();
        p.roles[0].model = None;
        refused(&p, "orchestrator", "model");
        let mut p = bound();
        p.roles[0].model_route = Some("slow".into());
        refused(&p, "orchestrator", "model_route");
        let mut p = bound();
        p.roles[3].policy.tier = "emperor".into();
        refused(&p, "architecture", "policy.tier");
        let mut p = bound();
        p.roles[4].policy.tool_calls_max = 0;
        refused(&p, "review", "policy.tool_calls_max");
        let mut p = bound();
        p.roles[4].prompt = Some("../../etc/passwd".into());
        refused(&p, "review", "prompt");
        let mut p = bound();
        p.roles[4].name = "orchestrator".into();
        refused(&p, "orchestrator", "name");
    }
}
