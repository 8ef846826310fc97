//! What the server library's calls can fail with, as cases an edge can match on: the CLI chooses
//! its exit status from the case (and a refusal's code), never from message text. A refusal is
//! the one `Refusal` type, whoever refused.

use room_core::Refusal;
use room_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The daemon (or the engine behind it) refused the request.
    #[error(transparent)]
    Refused(Refusal),
    /// No daemon answers on the socket.
    #[error("no daemon answers at {path}: {source}")]
    DaemonUnreachable {
        path: String,
        source: std::io::Error,
    },
    /// The connection to the daemon failed after it was made.
    #[error("daemon connection failed: {0}")]
    Connection(std::io::Error),
    /// The daemon's answer was not a response of the wire protocol.
    #[error("daemon sent a malformed response: {0}")]
    Protocol(String),
    /// The state directory is not one to serve: a split brain (`StoreError::SplitBrain`), a
    /// lock another daemon holds (`StoreError::Locked`), or a failure reading it.
    #[error("{0}")]
    State(StoreError),
    /// The engine could not open over a valid, locked state directory.
    #[error("cannot open the engine: {0}")]
    EngineOpen(StoreError),
    /// A listener address the daemon will not use.
    #[error("--listen must be a loopback address (got {0})")]
    ListenNotLoopback(std::net::SocketAddr),
    /// Binding a listener failed.
    #[error("binding {what}: {source}")]
    Bind {
        what: String,
        source: std::io::Error,
    },
    /// Any other I/O of the daemon (socket permissions, the address file, the runtime).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The MCP service on stdio failed.
    #[error("{0}")]
    Mcp(String),
    /// A daemon thread or task ended, panicked, or never came up.
    #[error("{0}")]
    Daemon(String),
}

impl From<Refusal> for ServerError {
    fn from(r: Refusal) -> Self {
        ServerError::Refused(r)
    }
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;
