//! Room's shared vocabulary. Everything here is pure: no I/O, no async, no wall clock.
//! Other crates agree on ids, digests, the clock, the chain and refusal codes through this crate,
//! so a code or a digest means the same thing in the engine, the store, the daemon and a test.

pub mod acceptance;
pub mod artifact;
pub mod canon;
pub mod chain;
pub mod chunk;
pub mod env;
pub mod event;
pub mod hlc;
pub mod id;
pub mod name;
pub mod redact;
pub mod refusal;
pub mod scope;
pub mod stage;
pub mod tier;
pub mod wake;

pub use canon::{canonical_bytes, sha256_hex};
pub use chain::{ChainError, Record, Sealed};
pub use env::{Clock, Entropy, FileStamp, Fs, ObjectId, RunOutcome, RunRequest, Runner};
pub use event::TaskStatus;
pub use hlc::Hlc;
pub use refusal::{Code, Refusal};
pub use tier::{GatedVerb, Tier, Verb};
