//! The core's clock for one endpoint: time since the endpoint started, on
//! tokio's clock (so paused-time tests move it), with a cached last reading
//! for the data path's queueing decisions.

use std::sync::atomic::{AtomicU64, Ordering};

use surelink_proto::Time;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Clock {
    base: tokio::time::Instant,
    /// The last reading, ns since `base`.
    last: AtomicU64,
}

impl Clock {
    pub(crate) fn new(base: std::time::Instant) -> Clock {
        Clock {
            base: tokio::time::Instant::from_std(base),
            last: AtomicU64::new(0),
        }
    }

    /// Time since the endpoint started.
    pub(crate) fn now(&self) -> Time {
        let t = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(t, Ordering::Relaxed);
        Time::from_nanos(t)
    }

    /// The last time read by `now`: good enough for queueing (the core only
    /// keeps its clock monotonic with it), and free.
    pub(crate) fn now_cached(&self) -> Time {
        Time::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// The instant `t` is, for tokio's timers.
    pub(crate) fn instant(&self, t: Time) -> tokio::time::Instant {
        self.base + t.since_origin()
    }
}
