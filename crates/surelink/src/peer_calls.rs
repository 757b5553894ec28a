//! A watched server's calls, for activation (`relay::activate`): the
//! round trips of the calls that ended, and when each call still waiting
//! began. A call waiting past the SLA is slow though it has not ended: a
//! server so hot that it answers nothing must still look slow to its
//! clients, or none of them would ever move to a helper.
//!
//! Kept only for servers activation watches; the waiting calls are this
//! endpoint's own (each entry lives as long as its call), so nothing a
//! peer sends grows it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::histogram::Histogram;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct PeerCalls {
    /// Round trips of the calls that ended with a reply, µs.
    pub(crate) rtt: Histogram,
    /// The calls waiting now: id → when each began.
    waiting: Mutex<BTreeMap<u64, Instant>>,
    next: AtomicU64,
}

impl PeerCalls {
    /// A call that began at `at` waits until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>, at: Instant) -> Waiting {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.waiting.lock().insert(id, at);
        Waiting {
            calls: self.clone(),
            id,
        }
    }

    /// When the longest-waiting call began (ids grow with time, so the
    /// first entry is the oldest but for calls begun the same instant).
    pub(crate) fn oldest_waiting(&self) -> Option<Instant> {
        self.waiting.lock().values().next().copied()
    }
}

/// A call waiting for its reply (see [`PeerCalls::begin`]).
#[derive(Debug)]
pub(crate) struct Waiting {
    calls: Arc<PeerCalls>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.calls.waiting.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_oldest_waiting_call_is_the_first_begun_still_waiting() {
        let c = Arc::new(PeerCalls::default());
        assert_eq!(c.oldest_waiting(), None);
        let t0 = Instant::now();
        let a = c.begin(t0);
        let b = c.begin(t0 + Duration::from_millis(5));
        assert_eq!(c.oldest_waiting(), Some(t0));
        drop(a);
        assert_eq!(c.oldest_waiting(), Some(t0 + Duration::from_millis(5)));
        drop(b);
        assert_eq!(c.oldest_waiting(), None);
    }
}
