//! A point in time supplied by the caller.
//!
//! The core never reads a clock: every input carries `now`, and every
//! deadline it hands back is a [`Time`]. The shell maps its monotonic clock
//! onto this type (nanoseconds since a base instant it picks); the simulator
//! uses it as its virtual clock.

use std::fmt;
use std::ops::{Add, AddAssign};
use std::time::Duration;

/// Nanoseconds since an arbitrary, caller-chosen origin. Monotonic by contract.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);
    /// Later than any time the core will be handed; used for "no deadline".
    pub const MAX: Time = Time(u64::MAX);

    /// A time `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Time(nanos)
    }

    /// A time `millis` milliseconds after the origin (tests and the simulator).
    pub const fn from_millis(millis: u64) -> Self {
        Time(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is; zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Time elapsed since the origin, as a duration.
    pub fn since_origin(self) -> Duration {
        Duration::from_nanos(self.0)
    }
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, rhs: Duration) -> Time {
        Time(self.0.saturating_add(saturating_nanos(rhs)))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Time::MAX {
            return f.write_str("t=never");
        }
        write!(
            f,
            "t={}.{:06}s",
            self.0 / 1_000_000_000,
            (self.0 % 1_000_000_000) / 1_000
        )
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let t = Time::from_nanos(u64::MAX - 1);
        assert_eq!(t + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time::ZERO.saturating_since(t), Duration::ZERO);
        assert_eq!(
            Time::from_millis(1500).saturating_since(Time::from_millis(500)),
            Duration::from_secs(1)
        );
        assert_eq!(format!("{:?}", Time::from_millis(1500)), "t=1.500000s");
    }
}
