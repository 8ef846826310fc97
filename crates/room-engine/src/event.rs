//! The domain events a room's journal carries. Their schema lives in `room_core::event`, so
//! that journals can be read without the engine; this module re-exports it. The journal stores
//! their canonical JSON; the projection into the sync index (and the task effects in
//! control.db) is derived from them by one function (`room::project_into`), used both at
//! commit and at catch-up, so a replay after a crash reproduces exactly what the live path
//! would have written.

pub use room_core::event::*;
