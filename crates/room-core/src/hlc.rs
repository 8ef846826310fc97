//! A hybrid logical clock: physical milliseconds plus a logical counter. It never goes
//! backwards, even when the wall clock steps back, so journal order and HLC order agree.

use serde::{Deserialize, Serialize};

/// Logical counter ceiling; past it the clock borrows a millisecond rather than overflow.
pub const LOGICAL_MAX: u32 = u32::MAX - 1;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Hlc {
    pub ms: u64,
    pub c: u32,
}

impl Hlc {
    pub const ZERO: Hlc = Hlc { ms: 0, c: 0 };

    /// The next timestamp after `self` given the physical time now.
    pub fn tick(self, now_ms: u64) -> Hlc {
        if now_ms > self.ms {
            Hlc { ms: now_ms, c: 0 }
        } else if self.c < LOGICAL_MAX {
            Hlc {
                ms: self.ms,
                c: self.c + 1,
            }
        } else {
            Hlc {
                ms: self.ms + 1,
                c: 0,
            }
        }
    }
}

impl std::fmt::Display for Hlc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.ms, self.c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wall_clock_step_back_keeps_order() {
        let a = Hlc::ZERO.tick(1_000);
        let b = a.tick(500);
        assert!(b > a);
        assert_eq!(b, Hlc { ms: 1_000, c: 1 });
    }

    #[test]
    fn counter_overflow_borrows_a_millisecond() {
        let a = Hlc {
            ms: 7,
            c: LOGICAL_MAX,
        };
        assert_eq!(a.tick(7), Hlc { ms: 8, c: 0 });
    }

    proptest! {
        #[test]
        fn strictly_monotonic_under_any_clock(times in prop::collection::vec(0u64..10_000, 1..200)) {
            let mut h = Hlc::ZERO;
            for t in times {
                let n = h.tick(t);
                prop_assert!(n > h);
                prop_assert!(n.ms >= t);
                h = n;
            }
        }
    }
}
