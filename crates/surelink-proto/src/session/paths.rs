//! Paths of a session: handshake phase, RTT estimate, in-flight accounting,
//! and the balance rule that picks a path for each message.

use std::collections::VecDeque;
use std::time::Duration;

use crate::config::EndpointConfig;
use crate::ids::{PathId, StreamId};
use crate::time::Time;

/// RFC 6298 smoothed RTT.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RttEstimator {
    pub(crate) srtt: Duration,
    pub(crate) rttvar: Duration,
    pub(crate) samples: u64,
}

impl RttEstimator {
    pub(crate) fn new(initial: Duration) -> Self {
        RttEstimator {
            srtt: initial,
            rttvar: initial / 2,
            samples: 0,
        }
    }

    pub(crate) fn sample(&mut self, rtt: Duration) {
        if self.samples == 0 {
            self.srtt = rtt;
            self.rttvar = rtt / 2;
        } else {
            let diff = self.srtt.abs_diff(rtt);
            self.rttvar = (self.rttvar * 3 + diff) / 4;
            self.srtt = (self.srtt * 7 + rtt) / 8;
        }
        self.samples += 1;
    }

    /// The retransmission timeout before backoff.
    pub(crate) fn rto(&self, cfg: &EndpointConfig) -> Duration {
        (self.srtt + self.rttvar * 4 + cfg.max_ack_delay).clamp(cfg.min_rto, cfg.max_rto)
    }
}

/// Where a path is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the peer's HELLO and RESUME.
    Handshaking,
    /// Carrying traffic.
    Active,
}

/// One path as a session sees it.
#[derive(Debug)]
pub(crate) struct PathState {
    pub(crate) id: PathId,
    pub(crate) phase: Phase,
    pub(crate) created: Time,
    /// When a valid frame last arrived on it (keepalive and idle timeout).
    pub(crate) last_recv: Time,
    /// HELLO to (re)send on this path.
    pub(crate) hello_due: bool,
    /// RESUME to (re)send (only once the peer's HELLO bound the path).
    pub(crate) resume_due: bool,
    pub(crate) peer_hello_seen: bool,
    /// When a RESUME last went out on it.
    pub(crate) last_resume: Option<Time>,
    pub(crate) next_handshake_retry: Time,
    /// PONGs owed to the peer (latest token only; older probes are moot).
    pub(crate) pong_due: Option<u64>,
    /// A PING to send now.
    pub(crate) ping_due: bool,
    /// The probe in flight: token and send time.
    pub(crate) ping_outstanding: Option<(u64, Time)>,
    pub(crate) rtt: RttEstimator,
    pub(crate) inflight_bytes: u64,
    /// `(stream, first seq, sent_at)` of cache entries in send order; may
    /// hold entries acknowledged
    /// or moved since (checked against the cache when they reach the front).
    pub(crate) inflight: VecDeque<(StreamId, u64, Time)>,
    /// Consecutive retransmission timeouts without progress.
    pub(crate) backoff: u32,
    /// Timed out recently; used only when no unsuspected path is available,
    /// and probed with PINGs until it answers.
    pub(crate) suspect: bool,
    /// The network it runs on, once the driver said (routing-table policy).
    pub(crate) network: Option<u8>,
    pub(crate) stats: PathStats,
}

/// Counters of one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// DATA frames written (first transmissions and re-sends).
    pub data_sent: u64,
    /// DATA frames that were re-sends.
    pub resent: u64,
    /// DATA frames received.
    pub data_received: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Bytes of frames written.
    pub bytes_sent: u64,
}

impl PathState {
    pub(crate) fn new(id: PathId, now: Time, cfg: &EndpointConfig) -> Self {
        PathState {
            id,
            phase: Phase::Handshaking,
            created: now,
            last_recv: now,
            hello_due: true,
            resume_due: false,
            peer_hello_seen: false,
            last_resume: None,
            next_handshake_retry: now + cfg.handshake_retry,
            pong_due: None,
            ping_due: false,
            ping_outstanding: None,
            rtt: RttEstimator::new(cfg.initial_rtt),
            inflight_bytes: 0,
            inflight: VecDeque::new(),
            backoff: 0,
            suspect: false,
            network: None,
            stats: PathStats::default(),
        }
    }

    /// The retransmission timeout with backoff applied.
    pub(crate) fn rto(&self, cfg: &EndpointConfig) -> Duration {
        let base = self.rtt.rto(cfg);
        base.saturating_mul(1u32 << self.backoff.min(16))
            .min(cfg.max_rto)
    }

    /// How long an unanswered PING waits before the next: the backed-off
    /// timeout, but no longer than `max_probe_interval` (or the timeout
    /// before backoff, if longer), so a path whose fault ended is found
    /// again soon whatever the outage cost its timer.
    pub(crate) fn probe_rto(&self, cfg: &EndpointConfig) -> Duration {
        let base = self.rtt.rto(cfg);
        self.rto(cfg).min(base.max(cfg.max_probe_interval))
    }

    /// When a keepalive PING is due: the path has been quiet for
    /// `path_keepalive` and no probe is queued or waiting for its PONG.
    pub(crate) fn keepalive_due(&self, cfg: &EndpointConfig) -> Option<Time> {
        (!self.ping_due && self.ping_outstanding.is_none())
            .then(|| self.last_recv + cfg.path_keepalive)
    }

    pub(crate) fn has_control(&self) -> bool {
        self.hello_due || self.resume_due || self.pong_due.is_some() || self.ping_due
    }

    /// Whether new or re-sent messages may be written to it.
    pub(crate) fn usable(&self, cfg: &EndpointConfig) -> bool {
        self.phase == Phase::Active && self.inflight_bytes < cfg.path_inflight_limit
    }

    /// Whether the routing table steers new traffic away from its network
    /// (`avoid`: one bit per network).
    pub(crate) fn avoided(&self, avoid: u8) -> bool {
        self.network
            .is_some_and(|n| n < 8 && avoid & (1u8 << n) != 0)
    }

    /// Whether this path's network is one new traffic prefers (`prefer`:
    /// a bit per network, like `avoid`).
    pub(crate) fn preferred(&self, prefer: u8) -> bool {
        self.avoided(prefer)
    }
}

/// The balance rule (hr-net): among usable paths prefer unsuspected ones,
/// then the least in-flight bytes; keep the previous choice while it is
/// within `balance_slack` of the lightest, so one stream's messages are not
/// split across paths (and reordered) without need. Before all of that,
/// paths on a network the routing table steers away from (`avoid`, one
/// bit per network) are used only when no other path is usable: the table
/// is policy, never a reason to stop sending.
pub(crate) fn select(
    paths: &[PathState],
    last: Option<PathId>,
    cfg: &EndpointConfig,
    avoid: u8,
    prefer: u8,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, p) in paths.iter().enumerate() {
        if !p.usable(cfg) {
            continue;
        }
        best = match best {
            None => Some(i),
            Some(b) => {
                let q = &paths[b];
                // Avoided last; then suspected; then, among the healthy,
                // the preferred networks (a helper's path) first.
                let key = |x: &PathState| {
                    (
                        x.avoided(avoid),
                        x.suspect,
                        !x.preferred(prefer),
                        x.inflight_bytes,
                        x.rtt.srtt,
                    )
                };
                let better = key(p) < key(q);
                Some(if better { i } else { b })
            }
        };
    }
    let best = best?;
    if let Some(last) = last {
        if let Some(li) = paths.iter().position(|p| p.id == last) {
            let l = &paths[li];
            let b = &paths[best];
            if l.usable(cfg)
                && l.avoided(avoid) == b.avoided(avoid)
                && l.suspect == b.suspect
                && l.preferred(prefer) == b.preferred(prefer)
                && l.inflight_bytes <= b.inflight_bytes + cfg.balance_slack
            {
                return Some(li);
            }
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(id: u64, inflight: u64, suspect: bool) -> PathState {
        let cfg = EndpointConfig::default();
        let mut p = PathState::new(PathId(id), Time::ZERO, &cfg);
        p.phase = Phase::Active;
        p.inflight_bytes = inflight;
        p.suspect = suspect;
        p
    }

    #[test]
    fn picks_least_loaded_with_hysteresis_and_avoids_suspects() {
        let cfg = EndpointConfig {
            balance_slack: 100,
            ..Default::default()
        };
        let paths = vec![path(1, 1000, false), path(2, 950, false), path(3, 0, true)];
        // Lightest unsuspected is path 2; path 3 is suspect.
        assert_eq!(select(&paths, None, &cfg, 0, 0), Some(1));
        // Path 1 is within the slack of path 2: keep it.
        assert_eq!(select(&paths, Some(PathId(1)), &cfg, 0, 0), Some(0));
        let paths = vec![path(1, 1200, false), path(2, 950, false)];
        assert_eq!(select(&paths, Some(PathId(1)), &cfg, 0, 0), Some(1));
        // Only suspects left: still usable.
        let paths = vec![path(3, 10, true)];
        assert_eq!(select(&paths, None, &cfg, 0, 0), Some(0));
        let mut full = path(4, cfg.path_inflight_limit, false);
        assert_eq!(select(std::slice::from_ref(&full), None, &cfg, 0, 0), None);
        full.phase = Phase::Handshaking;
        full.inflight_bytes = 0;
        assert_eq!(select(std::slice::from_ref(&full), None, &cfg, 0, 0), None);
    }

    #[test]
    fn avoided_networks_carry_traffic_only_when_nothing_else_can() {
        let cfg = EndpointConfig::default();
        let mut a = path(1, 0, false);
        a.network = Some(1);
        let mut b = path(2, 5000, true);
        b.network = Some(0);
        let paths = vec![a, b];
        // Unsteered: the idle, unsuspected path on network 1.
        assert_eq!(select(&paths, None, &cfg, 0, 0), Some(0));
        // Network 1 avoided: the loaded, suspect path on network 0 wins, and
        // the hysteresis does not keep the avoided one.
        assert_eq!(select(&paths, None, &cfg, 0b10, 0), Some(1));
        assert_eq!(select(&paths, Some(PathId(1)), &cfg, 0b10, 0), Some(1));
        // Only avoided paths left: still used.
        assert_eq!(select(&paths[..1], None, &cfg, 0b10, 0), Some(0));
        // A path whose network is unknown is never avoided.
        let paths = vec![path(3, 100, false), path(4, 0, false)];
        assert_eq!(select(&paths, None, &cfg, 0xff, 0), Some(1));
    }

    #[test]
    fn a_preferred_network_wins_among_healthy_paths_not_over_a_suspect() {
        let cfg = EndpointConfig::default();
        let mut direct = path(1, 0, false);
        direct.network = Some(0);
        let mut helper = path(2, 3000, false);
        helper.network = Some(7);
        let paths = vec![direct, helper];
        // Unsteered: the idle direct path.
        assert_eq!(select(&paths, None, &cfg, 0, 0), Some(0));
        // The helper's network preferred: it carries, loaded as it is,
        // and the hysteresis does not keep the direct one.
        assert_eq!(select(&paths, None, &cfg, 0, 0x80), Some(1));
        assert_eq!(select(&paths, Some(PathId(1)), &cfg, 0, 0x80), Some(1));
        // A suspected helper path (it froze) loses to a healthy direct one.
        let mut paths = paths;
        paths[1].suspect = true;
        assert_eq!(select(&paths, None, &cfg, 0, 0x80), Some(0));
        // Avoidance still comes first: an avoided direct path loses even
        // to a suspect preferred one (the role table's rule).
        assert_eq!(select(&paths, None, &cfg, 0b1, 0x80), Some(1));
    }

    #[test]
    fn rto_backs_off_and_is_bounded() {
        let cfg = EndpointConfig::default();
        let mut p = path(1, 0, false);
        p.rtt.sample(Duration::from_millis(1));
        assert_eq!(p.rto(&cfg), cfg.min_rto);
        p.backoff = 3;
        assert_eq!(p.rto(&cfg), cfg.min_rto * 8);
        p.backoff = 40;
        assert_eq!(p.rto(&cfg), cfg.max_rto);
    }
}
