//! The collaboration floor (DESIGN.md §7): a person states a goal, binds a model and backend to
//! each role, and the roles converge through typed artifacts on a blackboard. This crate owns
//! what a collaboration *is* as data, and decides nothing about authority:
//!
//! - `profile`: roles as data (`{name, adapter, preset, model, prompt, policy, purposes}`), the
//!   default profile, and its fail-closed validation against the adapters that exist and the
//!   model routes the owner configured (`profile_invalid`);
//! - `artifact` (re-exported from `room_core`, where the engine checks every write against
//!   it): the blackboard's kinds, their schemas (`artifact_schema_invalid`) and limits;
//! - `pack`: a pack file (TOML: roles and phases with `reads` and `writes`), validated at load
//!   (`pack_invalid`, `pack_write_overlap`, `pack_cycle`);
//! - `schedule`: which phases are ready, given what the blackboard holds and what each phase
//!   last ran on;
//! - `orchestrate`: an agent orchestrator's news (what a wake tells it), the phase its
//!   dispatch names (by phase or purpose tag) and the phases its words announce;
//! - `scheduler`: the pass over a running collaboration, acting as its orchestrator through
//!   the engine (phases, panels, the fix loop, gates, approvals, plans, guards, questions);
//!   the host (its working trees, a gate's measurement away from the pass) comes in
//!   through `Host`;
//! - `start`: recording a checked collaboration (its identities, routes, room, goal task and
//!   record), which the daemon and the simulator share;
//! - `steer`: an agent orchestrator's tools (`collab_status`, `collab_dispatch`,
//!   `collab_request_approval`, `collab_close`) and what its wakes tell it.
//!
//! Everything here is deterministic and synchronous (no tokio, no clock, no file system: a
//! pack's text and its prompt files are handed in; the scheduler acts through the engine,
//! whose clock and entropy are the host's), so the daemon's loop and the simulator drive it
//! alike. Every authority question (who may read or write an artifact, who may dispatch)
//! goes to the engine.

/// The blackboard's kinds, schemas and limits live in `room_core::artifact`, where the engine's
/// fence validates every write; re-exported here as the collaboration's vocabulary.
pub use room_core::artifact;
pub mod orchestrate;
pub mod pack;
pub mod panel;
pub mod profile;
pub mod schedule;
pub mod scheduler;
pub mod start;
pub mod steer;

pub use artifact::{ArtifactKind, ArtifactLimits};
pub use pack::{Pack, Phase, PhaseKind};
pub use profile::{Profile, Role, RolePolicy};
