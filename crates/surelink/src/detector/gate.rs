//! The send fence every socket write passes: no frame leaves after
//! `t_valid` (SafeTimer, paper Fig. 3). The sender thread moves `t_valid`;
//! connections read it before every write. The gate holds the fence itself
//! so that the first data frame of a new incarnation can arm it
//! ([`Fence::admit_frame`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use surelink_proto::detector::{DetectorConfig, Fence};
use surelink_proto::Time;

/// `t_valid` while no fence runs (the baseline mode, or before the sender
/// thread starts): every frame may leave.
const OPEN: u64 = u64::MAX;
/// `t_valid` while the fence is unarmed: the next data frame arms it.
const UNARMED: u64 = u64::MAX - 1;

/// The send fence every socket write passes: no frame leaves after
/// `t_valid` (SafeTimer, paper Fig. 3).
#[derive(Debug)]
pub(crate) struct Gate {
    /// `CLOCK_BOOTTIME` at start: the gate's clock keeps counting through
    /// a suspend, so the fence closes across one.
    base: Duration,
    /// Nanoseconds since `base`, or [`OPEN`] or [`UNARMED`]; mirrors
    /// `fence`, written only under its lock.
    t_valid: AtomicU64,
    /// The fence (SafeTimer mode; the sender thread runs it).
    pub(super) fence: Mutex<Fence>,
}

impl Gate {
    pub(super) fn new(cfg: &DetectorConfig) -> Gate {
        let base = surelink_sys::boottime();
        Gate {
            base,
            t_valid: AtomicU64::new(OPEN),
            // Replaced when the sender thread starts.
            fence: Mutex::new(Fence::new(cfg, Time::ZERO)),
        }
    }

    /// Whether a data frame may leave now. The first one after a fence
    /// arms the new incarnation's fence.
    pub(crate) fn may_send(&self) -> bool {
        match self.t_valid.load(Ordering::Acquire) {
            OPEN => true,
            UNARMED => {
                let mut f = self.fence.lock();
                let ok = f.admit_frame(self.now());
                self.publish(&f);
                ok
            }
            t => self.now().as_nanos() <= t,
        }
    }

    /// Whether a heartbeat may leave now: an unarmed fence lets it (the
    /// sender thread arms the fence when one is handed over).
    pub(super) fn may_send_heartbeat(&self) -> bool {
        match self.t_valid.load(Ordering::Acquire) {
            OPEN | UNARMED => true,
            t => self.now().as_nanos() <= t,
        }
    }

    /// Mirrors `f` (held under [`Gate::fence`]'s lock) for the writers.
    pub(super) fn publish(&self, f: &Fence) {
        let t = if f.is_armed() || f.is_fenced() {
            f.t_valid().as_nanos().min(UNARMED - 1)
        } else {
            UNARMED
        };
        self.t_valid.store(t, Ordering::Release);
    }

    /// The fence's `t_valid` on this gate's clock (far future while no
    /// fence runs or it is unarmed: no deadline yet).
    pub(crate) fn t_valid(&self) -> Option<Time> {
        match self.t_valid.load(Ordering::Acquire) {
            OPEN | UNARMED => Some(Time::from_nanos(u64::MAX)),
            t => Some(Time::from_nanos(t)),
        }
    }

    pub(crate) fn now(&self) -> Time {
        let d = surelink_sys::boottime().saturating_sub(self.base);
        Time::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first data frame through an unarmed gate arms the fence: from
    /// then on the gate has a deadline one interval and a slack away.
    #[test]
    fn the_first_frame_arms_an_unarmed_gate() {
        let cfg = DetectorConfig::default();
        let gate = Gate::new(&cfg);
        assert!(gate.may_send(), "open before the fence runs");
        {
            let mut f = gate.fence.lock();
            *f = Fence::unarmed(&cfg, gate.now());
            gate.publish(&f);
        }
        assert_eq!(gate.t_valid(), Some(Time::from_nanos(u64::MAX)));
        // A heartbeat may leave without arming it...
        assert!(gate.may_send_heartbeat());
        assert!(!gate.fence.lock().is_armed());
        // ...a data frame arms it.
        let before = gate.now();
        assert!(gate.may_send());
        assert!(gate.fence.lock().is_armed());
        let after = gate.now();
        let t = gate.t_valid().unwrap();
        let span = cfg.idle_interval + cfg.send_slack;
        assert!(t >= before + span && t <= after + span, "t_valid {t:?}");
    }
}
