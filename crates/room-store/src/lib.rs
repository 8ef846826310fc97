//! Room's durable storage. The journal append (made durable by the commit pipeline's shared
//! fdatasync, or its own) is the commit point of every event;
//! the SQLite sync index is a projection of the journal plus the receipts and checkpoints that
//! only it holds; `control` holds the machine-wide tables. The engine reaches all of it through
//! the traits in `backend`. This crate knows bytes, files and tables; what they mean is the
//! engine's.

pub mod backend;
pub mod blobs;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod control;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod fs;
pub mod index;
pub mod journal;
pub mod pipeline;
pub mod shard;
pub mod snapshot;
pub mod statedir;

pub use backend::{
    Backend, BlobStore, ChangeStamp, ControlStore, JournalSync, RoomIndex, RoomLog, ShardCreated,
    SqliteBackend, SqliteBackendConfig, WriterGuard,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("sqlite: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("state_dir_split_brain: {0}")]
    SplitBrain(String),
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Pragma(String),
    #[error("daemon already running for this state dir (pid {pid})")]
    Locked { pid: String },
    #[error("journal rotated or replaced: {0}")]
    Rotated(String),
    /// The bytes were written but their fsync failed: they may or may not survive a power cut.
    #[error("append in doubt: {0}")]
    InDoubt(String),
    /// A shared database's error (the PostgreSQL backend).
    #[error("postgres: {0}")]
    Postgres(String),
    /// Another writer (another daemon on a shared database) appended to the room first: the
    /// append wrote nothing, and the writer reads what landed before it writes again.
    #[error("concurrent arrival: {0}")]
    Conflict(String),
    /// A state dir whose store was migrated to a database: serving its embedded copy would
    /// split the state in two.
    #[error("store migrated: {0}")]
    Migrated(String),
    /// A database a migration has not finished filling: a daemon on it would miss what is
    /// not copied yet.
    #[error("migration unfinished: {0}")]
    MigrationUnfinished(String),
    /// A database that belongs to another Room instance than the state dir serving it: its
    /// permits, read positions and conversations are keyed by that instance.
    #[error("store of another instance: {0}")]
    OtherInstance(String),
    /// Another daemon took the shared database over: this one writes nothing more to it.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A `room restore` that has not finished: the tree is part old, part restored, and
    /// nothing reads or serves it until the same restore runs again.
    #[error("restore pending: {0}")]
    RestorePending(String),
    /// A part of the store this backend does not have yet.
    #[error("not supported: {0}")]
    Unsupported(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;
