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
/// `unsupported`; the proof rungs it can reach.
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    pub adapter: &'static str,
    pub transport: &'static str,
    pub operations: Vec<(&'static str, &'static str)>,
    pub conditions: Vec<(&'static str, &'static str)>,
    pub proofs: &'static [&'static str],
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
            operations: ops(&["create", "bind", "send", "prove"], &["resume"]),
            conditions: vec![(
                "resume",
                "the agent offers session/load (initialize's loadSession); with spawn_policy \"never\" a launch fails rather than open a sibling",
            )],
            proofs: &[
                "dispatched",
                "delivered_to_body",
                "body_visible_pending_reply",
                "wrong_body_rejected",
                "replied",
            ],
        },
        Coverage {
            adapter: "command",
            transport: "process",
            operations: ops(&["send"], &[]),
            conditions: vec![],
            proofs: &["dispatched", "process_exit_only", "replied"],
        },
        Coverage {
            adapter: "script",
            transport: "process",
            operations: ops(&["send"], &[]),
            conditions: vec![],
            proofs: &["dispatched", "process_exit_only", "replied"],
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
