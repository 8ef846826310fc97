//! The Room daemon's edge: listeners, request decoding, egress redaction. It hands the engine
//! what the transport observed (the socket peer's credentials, an agent's token) and every
//! decision with it; it decides no authority itself.

mod api_worker;
pub mod client;
pub mod collab;
pub mod daemon;
pub mod dashboard;
pub mod dispatch;
pub mod embeddings;
pub mod error;
pub mod mcp;
mod proposals;
pub mod wire;
pub mod workers;

pub use error::ServerError;
