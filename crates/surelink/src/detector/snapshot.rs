//! The detector's counters, for stats, metrics and experiments.

use std::sync::atomic::Ordering;

use surelink_proto::detector::{DetectorMode, MonitorStats};

use super::{Detector, RefusedCounts, StraysSnapshot};

/// Detector counters for stats and experiments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DetectorSnapshot {
    /// Which detector runs.
    pub mode: Option<DetectorMode>,
    /// Heartbeats sent (one per peer address per interval).
    pub heartbeats_sent: u64,
    /// Heartbeats received.
    pub heartbeats_received: u64,
    /// Heartbeats whose TX timestamp came from the kernel (the rest used
    /// the time after the send call returned).
    pub tx_timestamped: u64,
    /// Times this process fenced itself.
    pub fences: u64,
    /// Datagrams refused: heartbeats with a bad tag, from a non-member or
    /// replayed; barriers not from this process or with a stale token.
    pub datagrams_refused: u64,
    /// The same by reason.
    pub refused: RefusedCounts,
    /// The port's split by source: members' queue and strays' queue.
    pub strays: StraysSnapshot,
    /// Microseconds from now until `t_valid` (negative: the gate is shut).
    pub t_valid_in_us: i64,
    /// Peers sent heartbeats at the busy pace now (traffic in flight).
    pub busy_peers: u64,
    /// Our crowd shift: busy copies go every `interval × 2^shift` (0: not
    /// crowded; see `DetectorConfig::crowd_budget`).
    pub crowd_shift: u8,
    /// Busy-pace rounds sent (the fence's rounds are `tx_timestamped`).
    pub busy_rounds: u64,
    /// Quiet pairs woken by traffic (each one a busy round at once).
    pub kicks: u64,
    /// Networks probed after a path on them was reported down (every
    /// other peer there asked for the busy pace).
    pub probes: u64,
    /// The monitor's counters.
    pub monitor: MonitorStats,
}

impl Detector {
    pub(crate) fn snapshot(&self) -> DetectorSnapshot {
        let now = self.gate.now().as_nanos();
        let t_valid = self
            .gate
            .t_valid()
            .map_or(u64::MAX, surelink_proto::Time::as_nanos);
        let t_valid_in_us = if t_valid == u64::MAX {
            i64::MAX
        } else {
            let d = i128::from(t_valid) - i128::from(now);
            i64::try_from(d / 1000).unwrap_or(i64::MIN)
        };
        // One lock at a time: a temporary guard lives to the end of the
        // statement, and the reader takes the pacer under the checker.
        let (busy_peers, crowd_shift) = {
            let p = self.pacer.lock();
            (p.fast_peers() as u64, p.crowd_shift())
        };
        let monitor = self.checker.lock().monitor.stats();
        DetectorSnapshot {
            mode: Some(self.cfg.mode),
            heartbeats_sent: self.heartbeats_sent.load(Ordering::Relaxed),
            heartbeats_received: self.heartbeats_received.load(Ordering::Relaxed),
            tx_timestamped: self.tx_timestamped.load(Ordering::Relaxed),
            fences: self.fences.load(Ordering::Relaxed),
            datagrams_refused: self.refused.load(Ordering::Relaxed),
            refused: self.junk.snapshot(),
            strays: self.strays_snapshot(),
            t_valid_in_us,
            busy_peers,
            crowd_shift,
            busy_rounds: self.busy_rounds.load(Ordering::Relaxed),
            kicks: self.kick_count.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
            monitor,
        }
    }
}
