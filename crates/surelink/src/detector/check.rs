//! The checker thread: runs the monitor's windows (waking when one ends,
//! not on a tick), and before a report
//! sends barriers through the heartbeat sockets' own queues — one per CPU,
//! pinned to each in turn, since the kernel queues a packet in the backlog
//! of the CPU that sent or received it (SafeTimer's receiver side).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::debug;

use surelink_proto::detector::datagram;
use surelink_proto::detector::MonitorAction;
use surelink_proto::NodeId;
use surelink_sys::cpu;

use super::{random_u64, CheckerState, DelayPoint, Detector, RoundState, Signal};
use surelink_proto::detector::MonitorStats;

/// Says at debug level what a check or a round's end decided (why a
/// silent path was or was not reported), when it decided anything.
pub(super) fn log_round(before: &MonitorStats, after: &MonitorStats) {
    if before == after {
        return;
    }
    let d = |a: u64, b: u64| b.saturating_sub(a);
    debug!(
        rounds = d(before.barrier_rounds, after.barrier_rounds),
        lost = d(before.barriers_lost, after.barriers_lost),
        down = d(before.reported_down, after.reported_down),
        dead = d(before.reported_dead, after.reported_dead),
        saved_by_barrier = d(before.saved_by_barrier, after.saved_by_barrier),
        saved_by_drop = d(before.saved_by_drop, after.saved_by_drop),
        saved_by_stray = d(before.saved_by_stray, after.saved_by_stray),
        saved_by_private = d(before.saved_by_private, after.saved_by_private),
        saved_by_stream = d(before.saved_by_stream, after.saved_by_stream),
        "detector check"
    );
}

impl Detector {
    pub(super) fn checker_thread(self: Arc<Self>) {
        let cpus = cpu::allowed_cpus().unwrap_or_default();
        while !self.closed.load(Ordering::Relaxed) {
            self.stall(DelayPoint::Checker);
            let now = self.gate.now();
            let (barrier, next, lost) = {
                let mut c = self.checker.lock();
                // Read the drop counters at every check, so a drop is dated
                // close to when it happened (a later round is not blocked
                // by a drop long past).
                let drops = self.drop_total(&c.ovfl, false);
                c.monitor.handle_drop_count(now, drops);
                c.monitor
                    .handle_system_drop_count(now, self.system_drop_total(false));
                if self.split() {
                    c.monitor.handle_stray_drop_count(now, self.stray_drops());
                }
                self.fold_heard(&mut c.monitor);
                let before = c.monitor.stats();
                c.monitor.handle_timeout(now);
                let after = c.monitor.stats();
                log_round(&before, &after);
                let lost = after.barriers_lost > before.barriers_lost;
                let barrier = self.dispatch(&mut c).map(|token| {
                    self.read_private_drops(&mut c, now);
                    let wire = random_u64();
                    c.round = Some(RoundState {
                        token,
                        wire,
                        missing: self.barrier_copies(&cpus),
                    });
                    wire
                });
                let next = c.monitor.poll_timeout();
                // Under the lock: whoever brings a deadline forward after
                // this sees it and wakes us.
                self.checker_wake.store(next.as_nanos(), Ordering::Relaxed);
                (barrier, next, lost)
            };
            if let Some(token) = barrier {
                self.send_barriers(token, &cpus);
            }
            if lost {
                // Outside the checker lock: a replacement sends the round's
                // barriers again.
                self.check_barrier_sockets();
            }
            self.sleep_until(next);
        }
    }

    /// Barrier copies a round sends (see [`Detector::send_barriers`]): one
    /// per CPU per network.
    fn barrier_copies(&self, cpus: &[usize]) -> usize {
        self.networks * cpus.len().max(1)
    }

    /// Sends the barriers of the round under way again, under a new wire
    /// token (a barrier socket was replaced: copies sent to the old one
    /// are lost, and copies counted before must not complete the new
    /// count). Takes the checker lock: not to be called under it.
    pub(super) fn restart_round(&self) {
        let cpus = cpu::allowed_cpus().unwrap_or_default();
        let wire = {
            let mut c = self.checker.lock();
            let Some(r) = c.round.as_mut() else {
                return;
            };
            r.wire = random_u64();
            r.missing = self.barrier_copies(&cpus);
            r.wire
        };
        self.send_barriers(wire, &cpus);
    }

    /// One barrier per CPU per socket, each sent while pinned to that CPU,
    /// so it queues behind whatever that CPU's backlog holds.
    fn send_barriers(&self, token: u64, cpus: &[usize]) {
        let targets: Vec<SocketAddr> = self.private.lock().barrier_targets().to_vec();
        let barrier_from = self.barrier_from.lock().clone();
        let pinned = cpus.len() > 1;
        for (copy, &c) in cpus.iter().enumerate() {
            if pinned {
                let _ = cpu::pin_to(&[c]);
            }
            for (from, to) in barrier_from.iter().zip(&targets) {
                let b = datagram::encode_barrier(token, u16::try_from(copy).unwrap_or(u16::MAX));
                if let Err(e) = from.send_to(&b, *to) {
                    debug!(error = %e, "barrier not sent");
                }
            }
        }
        if pinned {
            let _ = cpu::pin_to(cpus);
        }
        if cpus.is_empty() {
            for (from, to) in barrier_from.iter().zip(&targets) {
                let _ = from.send_to(&datagram::encode_barrier(token, 0), *to);
            }
        }
    }

    /// Asks `probe_peers` peers but `except` that we send to on `network`
    /// for the busy pace now, taking them in turn across probes (see
    /// `MonitorAction::ProbeNetwork`). Called under the checker lock:
    /// takes the destinations', the cursor's, the pacer's and the kicks'
    /// locks, never the checker's.
    fn probe_network(&self, network: usize, except: NodeId) {
        let on: Vec<NodeId> = self
            .dests
            .lock()
            .keys()
            .filter(|(p, n)| *n == network && *p != except)
            .map(|(p, _)| *p)
            .collect();
        let peers = {
            let mut cursors = self.probe_cursor.lock();
            let cursor = cursors.entry(network).or_insert(NodeId(0));
            let peers = take_in_turn(&on, *cursor, self.cfg.probe_peers);
            if let Some(last) = peers.last() {
                *cursor = *last;
            }
            peers
        };
        if peers.is_empty() {
            return;
        }
        let now = self.gate.now();
        let mut kicked = Vec::new();
        {
            let mut pacer = self.pacer.lock();
            for p in peers {
                if pacer.handle_probe(now, p) {
                    kicked.push(p);
                }
            }
        }
        if !kicked.is_empty() {
            self.probes.fetch_add(1, Ordering::Relaxed);
            self.probed.lock().extend(kicked);
            self.wake_sender();
        }
    }

    /// Forwards the monitor's reports; returns a barrier request if any.
    pub(super) fn dispatch(&self, c: &mut CheckerState) -> Option<u64> {
        let mut barrier = None;
        while let Some(a) = c.monitor.poll_action() {
            match a {
                MonitorAction::SendBarrier { token } => barrier = Some(token),
                MonitorAction::Report(r) => {
                    let _ = self.signals.send(Signal::Report(r));
                }
                MonitorAction::ProbeNetwork { network, except } => {
                    self.probe_network(usize::from(network), except);
                }
            }
        }
        barrier
    }
}

/// Up to `n` of `peers` (sorted) in turn: those after `after`, then from
/// the start again.
fn take_in_turn(peers: &[NodeId], after: NodeId, n: usize) -> Vec<NodeId> {
    let start = peers.partition_point(|p| *p <= after);
    peers[start..]
        .iter()
        .chain(&peers[..start])
        .take(n)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_take_peers_in_turn_and_wrap() {
        let peers: Vec<NodeId> = [2, 3, 5, 8, 13].map(NodeId).to_vec();
        assert_eq!(take_in_turn(&peers, NodeId(0), 2), [NodeId(2), NodeId(3)]);
        assert_eq!(take_in_turn(&peers, NodeId(3), 2), [NodeId(5), NodeId(8)]);
        assert_eq!(
            take_in_turn(&peers, NodeId(8), 3),
            [NodeId(13), NodeId(2), NodeId(3)]
        );
        assert_eq!(take_in_turn(&peers, NodeId(4), 9).len(), 5, "each once");
        assert!(take_in_turn(&[], NodeId(4), 9).is_empty());
    }
}
