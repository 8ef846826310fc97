//! Planted bugs, for `room prove`'s own proof (issue 45): a card that cannot fail proves
//! nothing, so each claim's card is also run against a build in which one of the mechanisms
//! it exercises is broken on purpose, and must then report that claim failed.
//!
//! Only a build with the `planted-bugs` feature has them, and then only the one named by
//! `ROOM_PLANTED_BUG` (a claim id, `04-C05`) is active. Every other build compiles `bug` to a
//! constant `false`: no release and no default build can be switched into a broken one.

/// Whether the planted bug of `claim` is active in this process.
#[cfg(feature = "planted-bugs")]
pub fn bug(claim: &str) -> bool {
    std::env::var("ROOM_PLANTED_BUG").is_ok_and(|v| v == claim)
}

/// Whether the planted bug of `claim` is active in this process: never, in this build.
#[cfg(not(feature = "planted-bugs"))]
#[inline(always)]
pub const fn bug(_claim: &str) -> bool {
    false
}
