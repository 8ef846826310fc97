//! Room's adapters to agents: how a sealed wake reaches an agent's own session, and what each
//! adapter can prove about it. The engine decides who is woken and judges what was proven;
//! an adapter only speaks the agent's protocol and reports what it saw, never more.
//!
//! Processes are the caller's (the daemon's dispatcher owns their jobs): `acp` gets the
//! agent's stdin and stdout; `api` (the `openai` and `anthropic` adapters) gets an HTTP
//! client and the tools it may run. `acp_script` is the other side: Room's scripted ACP
//! agent, for showing the adapter's proofs with no model.

pub mod acp;
pub mod acp_script;
pub mod api;
pub mod coverage;
