//! The shell's side of the two paces: sessions stamp their traffic per
//! peer (a quiet pair's first traffic kicks the sender), new destinations
//! are greeted at once, and the threads are woken when the core's pacer or
//! monitor brings something forward.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use surelink_proto::NodeId;

use super::Detector;

/// What a session with a peer stamps for the pace (ns on the gate's
/// clock; 0: never).
#[derive(Debug, Default)]
pub(crate) struct TrafficCell {
    /// Our latest call or message (with the linger: or reply).
    pub(super) sent: AtomicU64,
    /// Our latest reply, with `answer_grace` (it awaits no answer, and
    /// counts only towards a dense pair).
    pub(super) replied: AtomicU64,
}

impl Detector {
    /// The cell a session with `peer` stamps when it sends a call, a
    /// message or a reply ([`Detector::note_traffic`]).
    pub(crate) fn traffic_cell(&self, peer: NodeId) -> Arc<TrafficCell> {
        self.traffic.lock().entry(peer).or_default().clone()
    }

    /// We have traffic in flight with `peer` (`cell` is its
    /// [`Detector::traffic_cell`]): an atomic store. With `answer_grace`
    /// the sender looks at it within the grace (woken only if it sleeps
    /// longer), and asks the peer for the busy pace if no answer came by
    /// then. Without, a quiet pair's first traffic is a kick — the sender
    /// asks the peer for the busy pace at once.
    pub(crate) fn note_traffic(&self, peer: NodeId, cell: &TrafficCell) {
        let now = self.gate.now().as_nanos().max(1);
        let prev = cell.sent.swap(now, Ordering::Relaxed);
        if self.cfg.answer_grace.is_some() {
            self.look_within_grace(now);
            return;
        }
        let linger = u64::try_from(self.cfg.busy_linger.as_nanos()).unwrap_or(u64::MAX);
        if prev == 0 || now.saturating_sub(prev) >= linger {
            self.kicks.lock().push(peer);
            self.kick_count.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = self.sender_thread.get() {
                t.unpark();
            }
        }
    }

    /// A reply went to `peer`: traffic for the pace without
    /// `answer_grace`; with it, the caller waits for the reply (its ask
    /// covers the reply's path), so a reply asks for no answer and
    /// counts only towards a dense pair (`Pacer::handle_reply`).
    pub(crate) fn note_reply(&self, peer: NodeId, cell: &TrafficCell) {
        if self.cfg.answer_grace.is_none() {
            self.note_traffic(peer, cell);
            return;
        }
        // Only a dense pair's replies change the pace, but the sender
        // must see them close together to know it is dense: it is woken
        // when one follows another within the run's gap (a sparse
        // server's replies wake nobody).
        let now = self.gate.now().as_nanos().max(1);
        let prev = cell.replied.swap(now, Ordering::Relaxed);
        let gap = u64::try_from((self.cfg.path_timeout / 2).as_nanos()).unwrap_or(u64::MAX);
        if prev != 0 && now.saturating_sub(prev) < gap {
            self.look_within_grace(now);
        }
    }

    /// With `answer_grace`: the sender looks at the stamps within the
    /// grace of `now` (woken only if it sleeps longer).
    fn look_within_grace(&self, now: u64) {
        let grace = self.cfg.answer_grace.unwrap_or_default();
        // Either the sender sees the flag after planning its sleep, or
        // we see its plan (both sequentially consistent).
        self.traffic_dirty.store(true, Ordering::SeqCst);
        let grace = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
        if self.sender_plan.load(Ordering::SeqCst) > now.saturating_add(grace) {
            if let Some(t) = self.sender_thread.get() {
                t.unpark();
            }
        }
    }

    /// A new destination for `peer`: it hears from us at once (an extra
    /// heartbeat, not the fence's), not only at the next fence round — so
    /// it watches the path from the start.
    pub(super) fn greet(&self, peer: NodeId) {
        self.greetings.lock().push(peer);
        self.wake_sender();
    }

    /// Wakes the sender: the pacer has a round due before it planned (a
    /// peer asked for the busy pace).
    pub(super) fn wake_sender(&self) {
        if let Some(t) = self.sender_thread.get() {
            t.unpark();
        }
    }

    /// Wakes the checker if the monitor now wants a check before the one
    /// it sleeps towards. Call without the checker lock.
    pub(super) fn wake_checker_if_due(&self) {
        let due = self.checker.lock().monitor.poll_timeout().as_nanos();
        if due < self.checker_wake.load(Ordering::Relaxed) {
            if let Some(t) = self.checker_thread.get() {
                t.unpark();
            }
        }
    }
}
