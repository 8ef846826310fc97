//! The Room daemon's edge: listeners, request decoding, egress redaction. It classifies the
//! caller by transport (owner console on the Unix socket, agent by token) and hands every
//! decision to the engine; it decides no authority itself.

pub mod client;
pub mod daemon;
pub mod dispatch;
pub mod mcp;
pub mod wire;
