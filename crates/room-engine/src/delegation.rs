//! The delegated identity tree (DESIGN.md §7): owner → orchestrator → role child (→ sub-agent),
//! each an enrolled principal with a `parent` and the scopes it holds. A node holds at most
//! what its parent holds: an agent that delegates a child under itself may give it only
//! scopes it holds and a tier no higher than its own (`scope_escalation_refused`, naming the
//! scope); the owner may mint a child with what its profile sanctions under any node. The
//! tree is at most `DELEGATION_DEPTH_MAX` deep below a root (`delegation_too_deep`).
//! Revoking a node revokes its whole subtree in one durable step (`Authority::revoke`), and
//! every credential below it is refused from its next call, naming the revoked ancestor.
//!
//! The scopes a node may hold are a closed vocabulary: `session:read`, `session:dispatch`,
//! `artifact:read:<kind>`, `artifact:write:<kind>`, `project:read`, `project:write`,
//! `tools:execute`. A root the owner enrolled holds no list: it is bounded by its tier, as
//! every agent was before the tree existed.

use crate::principal::AgentCaller;
use crate::{Engine, Outcome};
use room_core::{Code, Refusal, Tier};
use serde_json::{Value, json};

/// Levels below a root the tree reaches at most (root → orchestrator → role → sub-agent →
/// one more).
pub const DELEGATION_DEPTH_MAX: usize = 4;
/// Scopes one node holds at most.
pub const SCOPES_PER_NODE_MAX: usize = 32;

/// Whether `s` is a scope of the vocabulary (see the module comment).
pub fn valid_scope(s: &str) -> bool {
    match s {
        "session:read" | "session:dispatch" | "project:read" | "project:write"
        | "tools:execute" => true,
        _ => {
            let kind = s
                .strip_prefix("artifact:read:")
                .or_else(|| s.strip_prefix("artifact:write:"));
            kind.is_some_and(valid_kind)
        }
    }
}

/// An artifact kind as a scope names it: a core kind or `extra/<key>`.
fn valid_kind(k: &str) -> bool {
    matches!(
        k,
        "spec" | "research" | "adr" | "task-list" | "diff" | "findings"
    ) || k.strip_prefix("extra/").is_some_and(|key| {
        !key.is_empty()
            && key.len() <= 64
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    })
}

/// `scopes`, checked against the vocabulary and the bound, without repeats, in order.
fn parse_scopes(scopes: &[String]) -> Outcome<Vec<String>> {
    if scopes.len() > SCOPES_PER_NODE_MAX {
        return Err(Refusal::invalid(
            "scopes",
            format!("at most {SCOPES_PER_NODE_MAX} scopes"),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for (i, s) in scopes.iter().enumerate() {
        if !valid_scope(s) {
            return Err(Refusal::invalid(
                &format!("scopes[{i}]"),
                format!(
                    "{s:?} is not a scope (session:read, session:dispatch, artifact:read:<kind>, artifact:write:<kind>, project:read, project:write, tools:execute)"
                ),
            ));
        }
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    out.sort();
    Ok(out)
}

/// What a child of `parent` is asked to hold beyond what `parent` holds: the first scope it
/// does not hold (a root's list is open), or its tier above the parent's.
fn escalation(
    parent: &room_store::control::AgentRow,
    scopes: &[String],
    tier: Tier,
) -> Option<(String, String)> {
    if let Some(held) = &parent.scopes
        && let Some(s) = scopes.iter().find(|s| !held.contains(s))
    {
        return Some(("scopes".into(), s.clone()));
    }
    let parent_tier = Tier::parse(&parent.max_tier).unwrap_or(Tier::Observer);
    (tier > parent_tier).then(|| ("max_tier".into(), tier.as_str().to_string()))
}

impl Engine {
    /// The levels below its root `agent` sits at (a root: 0); refused past the bound, which
    /// a tree never reaches (no delegation makes it deeper).
    fn depth_of(&self, agent: &str) -> Outcome<usize> {
        let mut depth = 0;
        let mut next = self.authority.agent_named(agent)?.parent;
        while let Some(p) = next {
            depth += 1;
            if depth > DELEGATION_DEPTH_MAX {
                return Err(Refusal::storage(format!(
                    "agent {agent}'s ancestry is deeper than {DELEGATION_DEPTH_MAX}"
                )));
            }
            next = self.authority.agent_named(&p)?.parent;
        }
        Ok(depth)
    }

    /// An agent delegates a child under itself: the child holds at most the caller's scopes
    /// and tier. Its token is not shown to the caller.
    pub fn delegate(
        &self,
        caller: &AgentCaller,
        name: &str,
        scopes: &[String],
        max_tier: Option<Tier>,
    ) -> Outcome<Value> {
        let me = self.authenticate(&caller.token)?;
        let tier = max_tier.unwrap_or(Tier::parse(&me.max_tier).unwrap_or(Tier::Observer));
        let mut v = self.mint(Some(&me.name), name, scopes, tier, false)?;
        self.journal_minted(&me.name, &v)?;
        // a credential never passes through an agent (its context is a model's): the child's
        // token stays with the daemon, which hands it to the child's own launches; the owner
        // can rotate it to hold one
        if let Some(o) = v.as_object_mut() {
            o.remove("token");
            o.insert(
                "credential".into(),
                json!(
                    "kept by the daemon: the owner rotates it (room agent rotate) to hand it out"
                ),
            );
        }
        Ok(v)
    }

    /// The owner mints a node with what it sanctions: under `parent` (a role its profile
    /// grants more than the orchestrator holds), or a root holding exactly `scopes` (an
    /// orchestrator with `session:read` and `session:dispatch` only). Only the depth bounds it.
    pub fn delegate_as_owner(
        &self,
        _owner: &crate::Owner,
        parent: Option<&str>,
        name: &str,
        scopes: &[String],
        max_tier: Option<Tier>,
    ) -> Outcome<Value> {
        let Some(parent) = parent else {
            let tier = max_tier.unwrap_or(Tier::Member);
            return self.mint(None, name, scopes, tier, true);
        };
        let p = self.authority.agent_named(parent)?;
        if p.revoked_ms.is_some() {
            return Err(Refusal::invalid(
                "parent",
                format!("{parent} is revoked: nothing is delegated under it"),
            ));
        }
        let tier = max_tier.unwrap_or(Tier::parse(&p.max_tier).unwrap_or(Tier::Observer));
        let v = self.mint(Some(parent), name, scopes, tier, true)?;
        self.journal_minted("owner", &v)?;
        Ok(v)
    }

    /// A node minted inside a collaboration's tree is journaled in its room (`identity`,
    /// `minted`), as the collaboration's own are, so an audit replays the whole tree. A node
    /// whose record cannot be written is revoked again: no tree change stands unrecorded.
    fn journal_minted(&self, actor: &str, minted: &Value) -> Outcome<()> {
        let name = minted["agent"].as_str().unwrap_or_default();
        let change = room_core::event::IdentityChange {
            actor: actor.into(),
            action: "minted".into(),
            principal: name.into(),
            parent: minted["parent"].as_str().map(String::from),
            scopes: serde_json::from_value(minted["scopes"].clone()).ok(),
            max_tier: minted["max_tier"].as_str().map(String::from),
            subtree: Vec::new(),
        };
        match self.journal_tree_change(name, change) {
            Ok(()) => Ok(()),
            Err(e) => {
                let undone = match self.authority.revoke(&crate::collab::daemon(), name) {
                    Ok(_) => "it is revoked again".to_string(),
                    Err(r) => format!("and revoking it again failed too ({r}): revoke it"),
                };
                Err(Refusal::storage(format!(
                    "{name} was minted but its record could not be journaled ({e}); {undone}"
                )))
            }
        }
    }

    /// The owner revokes a node and its subtree in one durable step; inside a
    /// collaboration's tree the revocation is then journaled in its room (`revoked`, with
    /// the subtree). A revocation stands even when its record fails (the error says so).
    pub fn revoke(&self, owner: &crate::Owner, agent: &str) -> Outcome<Value> {
        let v = self.authority.revoke(owner, agent)?;
        let change = room_core::event::IdentityChange {
            actor: "owner".into(),
            action: "revoked".into(),
            principal: agent.into(),
            parent: self.authority.agent_named(agent)?.parent,
            scopes: None,
            max_tier: None,
            subtree: serde_json::from_value(v["subtree"].clone()).unwrap_or_default(),
        };
        self.journal_tree_change(agent, change).map_err(|e| {
            Refusal::storage(format!(
                "{agent} is revoked (with its subtree), but the revocation's record could not be journaled: {e}"
            ))
        })?;
        Ok(v)
    }

    fn mint(
        &self,
        parent: Option<&str>,
        name: &str,
        scopes: &[String],
        tier: Tier,
        sanctioned: bool,
    ) -> Outcome<Value> {
        room_core::name::validate("name", name)?;
        if crate::principal::RESERVED_AGENT_NAMES.contains(&name) {
            return Err(Refusal::invalid("name", format!("{name:?} is reserved")));
        }
        let scopes = parse_scopes(scopes)?;
        let depth = match parent {
            None => 0,
            Some(parent) => {
                let p = self.authority.agent_named(parent)?;
                if !sanctioned && let Some((field, what)) = escalation(&p, &scopes, tier) {
                    return Err(Refusal::new(
                        Code::ScopeEscalationRefused,
                        format!("{parent} cannot give {name} {what}: it does not hold it"),
                    )
                    .detail(json!({"field": field, "scope": what, "parent": parent}))
                    .hint("a child holds a subset of its parent's scopes and tier; the owner sanctions more"));
                }
                self.depth_of(parent)? + 1
            }
        };
        if depth > DELEGATION_DEPTH_MAX {
            return Err(Refusal::new(
                Code::DelegationTooDeep,
                format!(
                    "{name} would sit {depth} levels below its root (at most {DELEGATION_DEPTH_MAX})"
                ),
            )
            .detail(json!({"parent": parent, "depth": depth, "depth_max": DELEGATION_DEPTH_MAX})));
        }
        let e = self
            .authority
            .insert_delegated(name, parent, scopes.clone(), tier, "delegated")?;
        Ok(
            json!({"agent": e.name, "token": e.token, "parent": parent, "scopes": scopes,
            "max_tier": e.max_tier, "depth": depth, "registration_sha256": e.registration_sha256}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_vocabulary_is_closed() {
        for s in [
            "session:read",
            "session:dispatch",
            "artifact:read:diff",
            "artifact:write:extra/reasoning",
            "project:write",
            "tools:execute",
        ] {
            assert!(valid_scope(s), "{s}");
        }
        for s in [
            "session:*",
            "artifact:read:",
            "artifact:read:memo",
            "root",
            "project:admin",
        ] {
            assert!(!valid_scope(s), "{s}");
        }
    }
}
