//! What each adapter can actually do and prove, stated once: the session factory's eleven
//! operations and the proof ladder's rungs. Room reports an operation or proof an adapter
//! cannot supply as unsupported; it never infers one from a transport's success.

use serde::Serialize;

/// The session factory's operations, in the seed's order.
pub const OPERATIONS: [&str; 11] = [
    "list",
    "create",
    "bind",
    "resume",
    "focus",
    "send",
    "prove",
    "summarize",
    "fork",
    "archive",
    "restore",
];

/// One adapter's coverage: per operation `supported`, `conditional` (with its condition) or
/// `unsupported`; the proof rungs it can reach; its capability matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    pub adapter: &'static str,
    pub transport: &'static str,
    pub operations: Vec<(&'static str, &'static str)>,
    pub conditions: Vec<(&'static str, &'static str)>,
    pub proofs: &'static [&'static str],
    pub capabilities: Capabilities,
}

/// What an adapter declares it can do, capability by capability (`room adapters probe`
/// checks each it can against a real process or server and reports drift).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// How a tool the role may not use is kept from it: `hard` (no such tool reaches the
    /// agent, or the adapter refuses it) or `advisory` (the agent's own tools: it asks, or
    /// not; only the worker's confinement holds it where the machine confines).
    pub tool_deny: &'static str,
    /// Sub-agents the agent may run: `none`, or `agent_internal` (its own, unseen by Room).
    pub sub_agents: &'static str,
    /// How a turn is interrupted: `session_cancel` (then the job is stopped), `job_stop`,
    /// or `request_dropped` (an API request, no process).
    pub interrupt: &'static str,
    /// How a stop is proved: `zero_processes` (the owned job seen empty) or `in_daemon`
    /// (nothing runs outside the daemon).
    pub cancel: &'static str,
    /// A warm resume of the agent's own conversation: `conditional` (where it offers one) or
    /// `none`.
    pub warm_resume: &'static str,
    /// What its cost is known from: `usage_records` (tokens per call), `agent_reported` (the
    /// agent's own `usage_update` with a cost, when it sends one) or `none`.
    pub cost: &'static str,
    /// How the agent asks before acting: `permission_requests` (answered by the route) or
    /// `none`.
    pub approval: &'static str,
}

/// The capabilities' names, in the order `Capabilities::fields` gives them.
pub const CAPABILITIES: [&str; 7] = [
    "tool_deny",
    "sub_agents",
    "interrupt",
    "cancel",
    "warm_resume",
    "cost",
    "approval",
];

impl Capabilities {
    /// Each capability by name, in a fixed order.
    pub fn fields(&self) -> [(&'static str, &'static str); 7] {
        [
            ("tool_deny", self.tool_deny),
            ("sub_agents", self.sub_agents),
            ("interrupt", self.interrupt),
            ("cancel", self.cancel),
            ("warm_resume", self.warm_resume),
            ("cost", self.cost),
            ("approval", self.approval),
        ]
    }
}

/// A process the daemon starts in an owned job.
const PROCESS: Capabilities = Capabilities {
    tool_deny: "hard",
    sub_agents: "none",
    interrupt: "job_stop",
    cancel: "zero_processes",
    warm_resume: "none",
    cost: "none",
    approval: "none",
};

/// An API model: its only tools are Room's, its turn a request in the daemon.
const API: Capabilities = Capabilities {
    tool_deny: "hard",
    sub_agents: "none",
    interrupt: "request_dropped",
    cancel: "in_daemon",
    warm_resume: "none",
    cost: "usage_records",
    approval: "none",
};

/// The capability matrix of `adapter`, if Room has it.
pub fn capabilities(adapter: &str) -> Option<Capabilities> {
    all()
        .into_iter()
        .find(|c| c.adapter == adapter)
        .map(|c| c.capabilities)
}

fn ops(
    supported: &[&'static str],
    conditional: &[&'static str],
) -> Vec<(&'static str, &'static str)> {
    OPERATIONS
        .iter()
        .map(|&op| {
            let how = if supported.contains(&op) {
                "supported"
            } else if conditional.contains(&op) {
                "conditional"
            } else {
                "unsupported"
            };
            (op, how)
        })
        .collect()
}

/// Every adapter Room offers.
pub fn all() -> Vec<Coverage> {
    vec![
        Coverage {
            adapter: "acp",
            transport: "acp_stdio",
            operations: ops(&["create", "bind", "send", "prove"], &["list", "resume"]),
            conditions: vec![
                (
                    "list",
                    "the agent offers session/list (initialize's sessionCapabilities.list): room sessions native AGENT asks it; otherwise session_op_unsupported",
                ),
                (
                    "resume",
                    "the agent offers session/load (initialize's loadSession); with spawn_policy \"never\" a launch fails rather than open a sibling",
                ),
            ],
            proofs: &[
                "dispatched",
                "delivered_to_body",
                "body_visible_pending_reply",
                "wrong_body_rejected",
                "replied",
            ],
            capabilities: Capabilities {
                tool_deny: "advisory",
                sub_agents: "agent_internal",
                interrupt: "session_cancel",
                cancel: "zero_processes",
                warm_resume: "conditional",
                cost: "agent_reported",
                approval: "permission_requests",
            },
        },
        Coverage {
            adapter: "command",
            transport: "process",
            operations: ops(&["send"], &[]),
            conditions: vec![],
            proofs: &["dispatched", "process_exit_only", "replied"],
            // a program of the owner's: whatever it runs, only confinement holds
            capabilities: Capabilities {
                tool_deny: "advisory",
                ..PROCESS
            },
        },
        Coverage {
            adapter: "script",
            transport: "process",
            operations: ops(&["send"], &[]),
            conditions: vec![],
            proofs: &["dispatched", "process_exit_only", "replied"],
            // Room's scripted agent: its steps are its only tools
            capabilities: PROCESS,
        },
        Coverage {
            adapter: "openai",
            transport: "http_api",
            operations: ops(&["send", "prove"], &[]),
            conditions: vec![],
            proofs: &[
                "dispatched",
                "delivered_to_body",
                "body_visible_pending_reply",
                "replied",
            ],
            capabilities: API,
        },
        Coverage {
            adapter: "anthropic",
            transport: "http_api",
            operations: ops(&["send", "prove"], &[]),
            conditions: vec![],
            proofs: &[
                "dispatched",
                "delivered_to_body",
                "body_visible_pending_reply",
                "replied",
            ],
            capabilities: API,
        },
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_adapter_states_every_operation() {
        for c in super::all() {
            assert_eq!(c.operations.len(), super::OPERATIONS.len(), "{}", c.adapter);
            for (op, _) in &c.conditions {
                assert!(
                    c.operations.contains(&(op, "conditional")),
                    "{}: {op}",
                    c.adapter
                );
            }
        }
    }
}
