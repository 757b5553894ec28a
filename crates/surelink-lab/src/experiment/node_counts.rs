//! What an experiment node counts and checks while it runs: the sender's
//! calls and their latencies (HdrHistograms), the receiver's check of the
//! stream's order, the requests as the receiver saw them, and the summary
//! line built from them.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde_json::json;

use super::node::{wall_us, Role};

/// The sender's counts.
#[derive(Default)]
pub(super) struct Counts {
    /// Stream messages accepted by the session.
    pub(super) sent: AtomicU64,
    pub(super) calls: AtomicU64,
    pub(super) replies: AtomicU64,
    pub(super) call_errors: AtomicU64,
    /// Replies that echo another request's id.
    pub(super) wrong: AtomicU64,
    /// Call latency from the request's scheduled time to its reply, µs.
    rtt_us: Mutex<Option<hdrhistogram::Histogram<u64>>>,
    /// The same, only calls made and answered while some path existed.
    pathful_us: Mutex<Option<hdrhistogram::Histogram<u64>>>,
    /// For calls that met an outage of every link: how long after the
    /// outage ended their reply came, µs.
    after_outage_us: Mutex<Option<hdrhistogram::Histogram<u64>>>,
    /// Outage boundaries announced by the controller (odd: in an outage
    /// of every link).
    pub(super) outages: AtomicU64,
    /// Wall time of the last outage's end, µs.
    pub(super) outage_off_us: AtomicU64,
}

fn record(m: &Mutex<Option<hdrhistogram::Histogram<u64>>>, us: u64) {
    let mut h = m.lock();
    let h = h.get_or_insert_with(|| {
        hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .unwrap_or_else(|_| hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!()))
    });
    let _ = h.record(us.max(1));
}

/// p50, p99, p99.9, max and count (zeros when empty).
fn quantiles(m: &Mutex<Option<hdrhistogram::Histogram<u64>>>) -> [u64; 5] {
    let h = m.lock();
    match &*h {
        Some(h) if !h.is_empty() => [
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            h.len(),
        ],
        _ => [0; 5],
    }
}

impl Counts {
    pub(super) fn record_rtt(&self, us: u64, pathful: bool) {
        record(&self.rtt_us, us);
        if pathful {
            record(&self.pathful_us, us);
        }
    }

    pub(super) fn record_after_outage(&self, us: u64) {
        record(&self.after_outage_us, us);
    }
}

/// The receiver's check of the stream: each epoch's messages must come
/// numbered 0, 1, 2, ... with nothing missing, doubled or out of order.
#[derive(Default)]
pub(super) struct StreamCheck {
    epoch: Option<u64>,
    next: u64,
    received: u64,
    epochs: u64,
    violations: u64,
    first_violation: Option<String>,
}

impl StreamCheck {
    pub(super) fn saw(&mut self, epoch: u64, seq: u64) {
        self.received += 1;
        if self.epoch != Some(epoch) {
            // A new sender incarnation (after a fence) numbers from where
            // its stream task is; only order within it is checked.
            self.epoch = Some(epoch);
            self.epochs += 1;
            self.next = seq;
        }
        if seq != self.next {
            self.violations += 1;
            self.first_violation.get_or_insert_with(|| {
                format!("epoch {epoch}: expected message {}, got {seq}", self.next)
            });
        }
        self.next = seq + 1;
    }
}

pub(super) fn summary(
    role: Role,
    c: &Counts,
    check: &Mutex<StreamCheck>,
    order: &Mutex<ServerOrder>,
    ev: &str,
) -> serde_json::Value {
    match role {
        Role::Sender => {
            let [p50, p99, p999, max, _] = quantiles(&c.rtt_us);
            let [q50, q99, q999, qmax, _] = quantiles(&c.pathful_us);
            let [_, a99, a999, amax, an] = quantiles(&c.after_outage_us);
            json!({"t": wall_us(), "ev": ev,
                "sent": c.sent.load(Relaxed), "calls": c.calls.load(Relaxed),
                "replies": c.replies.load(Relaxed), "call_errors": c.call_errors.load(Relaxed),
                "wrong": c.wrong.load(Relaxed),
                "call_p50_us": p50, "call_p99_us": p99, "call_p999_us": p999, "call_max_us": max,
                "pathful_p50_us": q50, "pathful_p99_us": q99, "pathful_p999_us": q999,
                "pathful_max_us": qmax, "outage_calls": an, "after_outage_p99_us": a99,
                "after_outage_p999_us": a999, "after_outage_max_us": amax})
        }
        Role::Receiver => {
            let s = check.lock();
            let o = order.lock();
            json!({"t": wall_us(), "ev": ev, "received": s.received, "next": s.next,
                "epochs": s.epochs, "violations": s.violations,
                "first_violation": s.first_violation, "requests": o.runs.len(),
                "reordered": o.reordered, "duplicated": o.duplicated})
        }
    }
}

/// Requests as the receiver saw them.
#[derive(Default)]
pub(super) struct ServerOrder {
    pub(super) runs: HashSet<u64>,
    top: Option<u64>,
    pub(super) reordered: u64,
    pub(super) duplicated: u64,
}

impl ServerOrder {
    pub(super) fn saw(&mut self, id: u64) {
        if !self.runs.insert(id) {
            self.duplicated += 1;
        } else if self.top.is_some_and(|t| id < t) {
            self.reordered += 1;
        }
        self.top = self.top.max(Some(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_check_counts_every_kind_of_violation() {
        let mut c = StreamCheck::default();
        for s in 0..5 {
            c.saw(1, s);
        }
        assert_eq!((c.received, c.violations), (5, 0));
        c.saw(1, 4); // duplicate
        c.saw(1, 7); // 5 and 6 lost
        c.saw(1, 6); // reordered
        assert_eq!(c.violations, 3);
        assert!(c
            .first_violation
            .as_deref()
            .unwrap_or("")
            .contains("expected message 5"));
        // A new epoch restarts the numbering check.
        c.saw(2, 100);
        c.saw(2, 101);
        assert_eq!((c.epochs, c.violations), (2, 3));
    }

    #[test]
    fn server_order_counts_duplicates_and_reordering() {
        let mut o = ServerOrder::default();
        for id in [0, 1, 3, 2, 3, 4] {
            o.saw(id);
        }
        assert_eq!((o.runs.len(), o.duplicated, o.reordered), (5, 1, 1));
    }
}
