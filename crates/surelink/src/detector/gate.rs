//! The send fence every socket write passes: no frame leaves after
//! `t_valid` (SafeTimer, paper Fig. 3). The sender thread moves `t_valid`;
//! connections read it before every write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use surelink_proto::Time;

/// The send fence every socket write passes: no frame leaves after
/// `t_valid` (SafeTimer, paper Fig. 3).
#[derive(Debug)]
pub(crate) struct Gate {
    /// `CLOCK_BOOTTIME` at start: the gate's clock keeps counting through
    /// a suspend, so the fence closes across one.
    base: Duration,
    /// Nanoseconds since `base`; `u64::MAX` when no fence runs.
    pub(super) t_valid: AtomicU64,
}

impl Gate {
    pub(super) fn new() -> Gate {
        Gate {
            base: surelink_sys::boottime(),
            t_valid: AtomicU64::new(u64::MAX),
        }
    }

    /// Whether a frame may leave now.
    pub(crate) fn may_send(&self) -> bool {
        let t = self.t_valid.load(Ordering::Acquire);
        t == u64::MAX || self.now().as_nanos() <= t
    }

    /// The fence's `t_valid` on this gate's clock (far future when no
    /// fence runs).
    pub(crate) fn t_valid(&self) -> Option<Time> {
        Some(Time::from_nanos(self.t_valid.load(Ordering::Acquire)))
    }

    pub(crate) fn now(&self) -> Time {
        let d = surelink_sys::boottime().saturating_sub(self.base);
        Time::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}
