//! Detector settings.

use std::time::Duration;

use crate::config::ConfigError;

/// Which detector runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DetectorMode {
    /// SafeTimer: barrier and drop checks before a report, and the sender
    /// fence.
    #[default]
    SafeTimer,
    /// The baseline: the same heartbeats, a plain timeout, no checks, no
    /// fence. Reports a live peer dead when this process is slow.
    Plain,
    /// No heartbeats at all; paths fail only through TCP errors and the
    /// session's retransmission timeout.
    Off,
}

/// Heartbeat timing.
///
/// Heartbeats come at two paces (see [`crate::detector::Pacer`]). Every
/// peer gets one every `idle_interval`: these are the fence's, TX-stamped,
/// and they alone back a "dead" report. A peer with traffic in flight —
/// ours to it, or its to us (it says so with `WATCH`) — also gets one every
/// `interval`, so its paths are watched with the short `path_timeout`; an
/// idle pair's paths with `idle_path_timeout`. So a quiet cluster pays per
/// peer a few datagrams a second, and a busy pair fails over as fast as
/// ever.
///
/// The defaults keep two promises at once. Path failover stays fast: a
/// path silent for 50 ms (5 heartbeats) is failed over, which costs
/// nothing when it was a false alarm (the path is used again when heard).
/// Ending things stays slow: a peer is reported dead only after 2 s of
/// silence on every path, and a process fences itself only when a
/// heartbeat could not leave for 1.5 s — so an outage of every link, or a
/// pause of the process, shorter than ~1.5 s ends no session and fails no
/// call whose deadline is longer. The anchors: memberlist's LAN profile
/// (probe every 1 s, 500 ms probe timeout, then a suspicion period of
/// several seconds before "dead") and Lifeguard's longer suspicion under
/// load; a false "dead" (a session ended, calls failed, a replica
/// re-synced) costs far more than a second of detection. Tighter windows
/// ([`DetectorConfig::with_interval`]) are a tuning for dedicated
/// networks and are labelled as such wherever they are used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectorConfig {
    /// Which detector runs.
    pub mode: DetectorMode,
    /// Heartbeat period of a busy pair (traffic in flight either way):
    /// extra heartbeats, not the fence's, that keep `path_timeout` short.
    pub interval: Duration,
    /// The fence's heartbeat period: every peer gets one this often, busy
    /// or idle. `timeout` must cover it plus `send_slack` and
    /// `max_network_delay`.
    pub idle_interval: Duration,
    /// A path of a busy pair silent this long is suspected and, after the
    /// SafeTimer checks, reported down: the session fails over. A path
    /// report claims nothing about the peer, so this window may be short.
    pub path_timeout: Duration,
    /// The same for a pair with nothing in flight (heartbeats every
    /// `idle_interval`). A call or message to the peer switches its paths
    /// to `path_timeout` from the moment it is sent.
    pub idle_path_timeout: Duration,
    /// With `answer_grace` off: a pair stays busy this long after its last
    /// traffic (so a burst every few hundred milliseconds does not switch
    /// pace each time). With it on (the default), only a dense pair —
    /// sends less than `path_timeout / 2` apart for `path_timeout` — lingers
    /// this long after each send (see [`crate::detector::Pacer`], "Dense
    /// pairs").
    pub busy_linger: Duration,
    /// How long a call or one-way message of ours may go unanswered — no
    /// data (a reply, an acknowledgement) read from the peer since it went
    /// — before the pair goes to the busy pace and asks the peer for it
    /// (`WATCH`); answered, the pair drops back to the idle pace at once.
    /// So the pace follows traffic *in flight*, not traffic in the last
    /// `busy_linger`: a pair whose calls are answered within the grace
    /// exchanges no busy-pace heartbeat at all (its answers are the
    /// liveness signal), and a call that waits — a slow handler, a dead
    /// path — is watched at the busy pace from the end of the grace.
    /// A dense pair (sends less than `path_timeout / 2` apart for
    /// `path_timeout` or longer) is busy for `busy_linger` after each
    /// send whatever its answers: its unused paths stay on standby.
    /// Must cover the peer's acknowledgement delay (the shell's default
    /// is 5 ms). Default: one `interval` (10 ms), since 2026-12-06 — with
    /// dense pairs lingering, the random-fault soak's tail is the
    /// linger's, and sparse callers cost a quarter (docs/detector.md,
    /// "Busy while unanswered"). `None`: busy for `busy_linger` after any
    /// call, message or reply (`with_interval`'s choice).
    pub answer_grace: Option<Duration>,
    /// With `answer_grace`: the most a peer's grace may grow to when its
    /// answers usually take longer than `answer_grace` (the grace is the
    /// smoothed answer time plus four times its deviation, as TCP's
    /// retransmission timeout, never below `answer_grace`). Without it, a
    /// loaded server whose answers took longer than the grace was watched
    /// at the busy pace by every caller at once — heartbeats that loaded
    /// it further (docs/detector.md, "A slow server is not asked").
    /// Default 200 ms (Linux's minimum TCP retransmission timeout; 50 ms,
    /// the path window, still let 200 callers every 50 ms tip a
    /// quarter-core server into heartbeats now and then; `with_interval`:
    /// its idle interval, four intervals): traffic in flight to such a
    /// peer is then reported within `answer_grace + answer_grace_max +
    /// path_timeout` (260 ms) of its send at worst, to a peer answering
    /// within `answer_grace` as before (70 ms).
    /// Equal to `answer_grace`: a fixed grace.
    pub answer_grace_max: Duration,
    /// A peer whose every path has been silent this long is suspected and,
    /// after the checks, reported dead. Only this report is backed by the
    /// sender fence, so it must be at least `interval + send_slack +
    /// max_network_delay`.
    pub timeout: Duration,
    /// How late after its scheduled time a heartbeat may leave the host
    /// before the sender fences itself. Too small fences a merely busy
    /// process (a new epoch, messages abandoned); it costs detection time
    /// through `timeout`.
    pub send_slack: Duration,
    /// The longest the network itself may take to deliver a heartbeat (the
    /// paper's blackbox assumption). Local delays are not part of it.
    pub max_network_delay: Duration,
    /// The shortest spacing between two checks of the windows. The
    /// checker wakes when a window is due (not on a fixed tick), but no
    /// more often than this.
    pub check_every: Duration,
    /// A barrier not back within this is lost: no report that round.
    pub barrier_timeout: Duration,
    /// Let a busy pair's data stand in for its busy-pace heartbeats, and
    /// its paths without data stand by (see [`crate::detector::Pacer`],
    /// "Data stands in for busy heartbeats"). On by default since
    /// 2026-11-29, with the standby pace at two intervals: a busy cache
    /// cluster's heartbeats fall by about three quarters and every path
    /// stays watched within ~60 ms (docs/detector.md has the soaks). A
    /// path of a busy pair that carries no data is watched with
    /// [`standby_path_timeout`](Self::standby_path_timeout), not
    /// `path_timeout`. The receiver's check of connections' unread bytes
    /// runs either way.
    pub data_as_heartbeat: bool,
    /// How often a busy pair's *standby* path (one that carries none of
    /// our data while another path of the pair does) gets a busy-pace
    /// heartbeat, with `data_as_heartbeat`. It is watched so a failover
    /// finds it alive; its window is
    /// [`standby_path_timeout`](Self::standby_path_timeout). At least
    /// `interval`; above `idle_interval` it is taken as `idle_interval`.
    /// Longer saves heartbeats and costs failover onto a path that died
    /// unnoticed (default two intervals: 20 ms, window 60 ms).
    pub standby_interval: Duration,
    /// A pair with no traffic either way for this long (and not busy) gets
    /// the fence's heartbeats from us only in one round of `slow_factor`
    /// (see [`crate::detector::Pacer`], "Slow pairs"): its heartbeats say
    /// `SLOW`, and the peer watches its paths with
    /// [`slow_path_timeout`](Self::slow_path_timeout) and reports it dead
    /// after [`slow_timeout`](Self::slow_timeout). Any call, message or
    /// data read ends it at once. Default 10 s (since 2026-12-06; it was
    /// opt-in while a 500-client start spiralled into re-dials with it,
    /// which bounding the probe ended — docs/detector.md, "Slow pairs").
    /// `None`: every pair gets every round. [`Self::with_interval`] leaves
    /// it off.
    pub slow_after: Option<Duration>,
    /// With `slow_after`: a slow pair gets one fence round in this many
    /// (1 to 16; default 4: every 1.6 s with the default idle interval).
    pub slow_factor: u32,
    /// A path reported down probes at most this many other peers on its
    /// network (asked for the busy pace, taken in turn across probes;
    /// [`super::MonitorAction::ProbeNetwork`]). Default 8: a few peers
    /// show whether this node's network is broken, as SWIM asks a few
    /// members; asking all 500 peers of a server made it send 1 000 busy
    /// copies every interval on a host that was already late (1 to 4 096).
    pub probe_peers: usize,
    /// The most busy-pace heartbeats a second this process sends on each
    /// network, all peers together, and asks its peers to send it (see
    /// [`crate::detector::Pacer`], "A crowd of busy peers"). Up to
    /// `crowd_budget × interval` busy peers get the busy pace; past that
    /// the pace halves for every doubling of busy peers (announced in the
    /// heartbeats, so receivers widen their windows first), down to the
    /// [`max_crowd_shift`](Self::max_crowd_shift). Without it, a server
    /// waited on by 500 callers owed them 100 000 heartbeats a second and
    /// received as many — a hot server's CPU spent on watching, not
    /// serving. Default 2 000 (20 busy peers at 10 ms; 640 at 320 ms).
    /// `None`: every busy peer at `interval` ([`Self::with_interval`]).
    pub crowd_budget: Option<u32>,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        let interval = Duration::from_millis(10);
        DetectorConfig {
            send_slack: Duration::from_millis(1500),
            timeout: Duration::from_secs(2),
            // 400 + 1500 + 10 ≤ 2000: 90 ms to spare for a slow network.
            // Per idle peer and network, 2.5 heartbeats a second each way.
            idle_interval: Duration::from_millis(400),
            // Three idle heartbeats: one lost datagram is no report.
            idle_path_timeout: Duration::from_millis(1200),
            busy_linger: Duration::from_secs(1),
            // Sparse callers cost fence rounds alone; dense pairs linger.
            answer_grace: Some(interval),
            // A slow peer's grace grows up to Linux's minimum TCP
            // retransmission timeout.
            answer_grace_max: Duration::from_millis(200),
            // A quiet pair gets one fence round in 4 after 10 s: dead
            // after 3.2 s, path window 4.8 s, for such pairs only.
            slow_after: Some(Duration::from_secs(10)),
            crowd_budget: Some(2000),
            ..DetectorConfig::with_interval(interval)
        }
    }
}

impl DetectorConfig {
    /// Compact settings scaled to one heartbeat `interval` (a tuning, not
    /// the default): path window 5 intervals, peer window 15, send slack
    /// 10 (a process may stall that long before it fences itself), network
    /// delay 1, checks at most twice per interval; idle pairs: heartbeats
    /// every 4 intervals, path window 10; standby paths of a busy pair:
    /// heartbeats every 2 intervals.
    pub fn with_interval(interval: Duration) -> Self {
        DetectorConfig {
            mode: DetectorMode::SafeTimer,
            interval,
            idle_interval: interval * 4,
            idle_path_timeout: interval * 10,
            busy_linger: interval * 20,
            answer_grace: None,
            // Unused without a grace; valid if one is set (≤ idle_interval).
            answer_grace_max: interval * 4,
            path_timeout: interval * 5,
            timeout: interval * 15,
            send_slack: interval * 10,
            max_network_delay: interval,
            check_every: interval / 2,
            barrier_timeout: interval.max(Duration::from_millis(5)),
            data_as_heartbeat: true,
            standby_interval: interval * 2,
            slow_after: None,
            slow_factor: 4,
            probe_peers: 8,
            crowd_budget: None,
        }
    }

    /// How often a busy peer gets a heartbeat from a crowded sender at
    /// `shift` (see [`Self::crowd_budget`]): `interval × 2^shift`.
    pub fn crowd_interval(&self, shift: u8) -> Duration {
        self.interval * (1u32 << shift.min(15))
    }

    /// The window of a path whose heartbeats say `FAST` at `shift` > 0:
    /// three of its heartbeats (each up to one `interval` late, the busy
    /// rounds' granularity), or two and the network's delay, and never
    /// less than a standby path's (defaults: 90 ms at shift 1, 990 ms at
    /// shift 5). Shifts past [`Self::crowd_shift_limit`] count as it; a
    /// receiver honours a peer's shift whatever its own budget.
    pub fn crowd_path_timeout(&self, shift: u8) -> Duration {
        self.crowd_window(shift.min(self.crowd_shift_limit()))
            .max(self.standby_path_timeout())
    }

    /// Three heartbeats at `shift`, each up to an interval late, or two
    /// and the network's delay.
    fn crowd_window(&self, shift: u8) -> Duration {
        let c = self.crowd_interval(shift) + self.interval;
        (c * 3).max(c * 2 + self.max_network_delay)
    }

    /// The largest crowd shift this process sends at: the
    /// [`Self::crowd_shift_limit`], 0 when [`Self::crowd_budget`] is off.
    pub fn max_crowd_shift(&self) -> u8 {
        if self.crowd_budget.is_none() {
            return 0;
        }
        self.crowd_shift_limit()
    }

    /// The largest crowd shift there is: its pace no slower than the
    /// fence's (`idle_interval`) and its window no wider than an idle
    /// path's (defaults: 5, a heartbeat every 320 ms).
    pub fn crowd_shift_limit(&self) -> u8 {
        let mut s = 0u8;
        while s < 7
            && self.crowd_interval(s + 1) <= self.idle_interval
            && self.crowd_window(s + 1) <= self.idle_path_timeout
        {
            s += 1;
        }
        s
    }

    /// One fence round in this many goes to a slow pair (1: slow pairs are
    /// off).
    pub fn slow_rounds(&self) -> u32 {
        if self.slow_after.is_some() {
            self.slow_factor.max(1)
        } else {
            1
        }
    }

    /// The dead window for a peer whose heartbeats say `SLOW`: `timeout`
    /// plus the rounds it skips, so it covers `slow_factor ×
    /// idle_interval + send_slack + max_network_delay` as `timeout`
    /// covers one round (defaults with a factor of 4: 3.2 s).
    pub fn slow_timeout(&self) -> Duration {
        self.timeout + self.idle_interval * (self.slow_rounds() - 1)
    }

    /// The path window for a pair at the slow pace: the idle one times the
    /// factor (defaults with a factor of 4: 4.8 s).
    pub fn slow_path_timeout(&self) -> Duration {
        self.idle_path_timeout * self.slow_rounds()
    }

    /// How often a standby path gets a busy-pace heartbeat:
    /// [`standby_interval`](Self::standby_interval), kept between
    /// `interval` and `idle_interval`.
    pub fn standby_interval(&self) -> Duration {
        self.standby_interval
            .min(self.idle_interval)
            .max(self.interval)
    }

    /// The window of a standby path: three of its heartbeats, or two and
    /// the network's delay, and never less than `path_timeout` (defaults:
    /// 60 ms).
    pub fn standby_path_timeout(&self) -> Duration {
        let s = self.standby_interval();
        (s * 3)
            .max(s * 2 + self.max_network_delay)
            .max(self.path_timeout)
    }

    /// Checks the settings; the relation between them is what makes a
    /// report safe (see the module docs).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        for (field, v) in [
            ("detector.interval", self.interval),
            ("detector.idle_interval", self.idle_interval),
            ("detector.timeout", self.timeout),
            ("detector.path_timeout", self.path_timeout),
            ("detector.idle_path_timeout", self.idle_path_timeout),
            ("detector.busy_linger", self.busy_linger),
            ("detector.check_every", self.check_every),
            ("detector.barrier_timeout", self.barrier_timeout),
            ("detector.standby_interval", self.standby_interval),
            (
                "detector.slow_after",
                self.slow_after.unwrap_or(Duration::MAX),
            ),
            (
                "detector.answer_grace",
                self.answer_grace.unwrap_or(Duration::MAX),
            ),
        ] {
            if v.is_zero() {
                return Err(ConfigError::Zero { field });
            }
        }
        if self.idle_interval < self.interval {
            return Err(ConfigError::Inconsistent {
                field: "detector.idle_interval (µs)",
                value: ms(self.idle_interval),
                other: "detector.interval (µs)",
                other_value: ms(self.interval),
                why: "idle pairs cannot get heartbeats more often than busy ones",
            });
        }
        if self.standby_interval < self.interval {
            return Err(ConfigError::Inconsistent {
                field: "detector.standby_interval (µs)",
                value: ms(self.standby_interval),
                other: "detector.interval (µs)",
                other_value: ms(self.interval),
                why: "a standby path gets heartbeats no more often than a busy one",
            });
        }
        let need = self.idle_interval + self.send_slack + self.max_network_delay;
        if self.timeout < need {
            return Err(ConfigError::Inconsistent {
                field: "detector.timeout (µs)",
                value: ms(self.timeout),
                other: "idle_interval + send_slack + max_network_delay (µs)",
                other_value: ms(need),
                why: "a shorter window could report a sender whose heartbeat is still on time",
            });
        }
        let idle_need = (self.idle_interval * 2 + self.max_network_delay).max(self.path_timeout);
        if self.idle_path_timeout < idle_need {
            return Err(ConfigError::Inconsistent {
                field: "detector.idle_path_timeout (µs)",
                value: ms(self.idle_path_timeout),
                other: "max(2 × idle_interval + max_network_delay, path_timeout) (µs)",
                other_value: ms(idle_need),
                why: "an idle path would be reported down between two of its heartbeats",
            });
        }
        if let Some(g) = self.answer_grace.filter(|g| *g > self.idle_interval) {
            return Err(ConfigError::Inconsistent {
                field: "detector.answer_grace (µs)",
                value: ms(g),
                other: "detector.idle_interval (µs)",
                other_value: ms(self.idle_interval),
                why: "an unanswered call would be watched no sooner than an idle pair",
            });
        }
        if let Some(g) = self.answer_grace.filter(|g| *g > self.answer_grace_max) {
            return Err(ConfigError::Inconsistent {
                field: "detector.answer_grace_max (µs)",
                value: ms(self.answer_grace_max),
                other: "detector.answer_grace (µs)",
                other_value: ms(g),
                why: "a peer's grace never shrinks below answer_grace",
            });
        }
        if self.answer_grace.is_some() && self.answer_grace_max > self.idle_interval {
            return Err(ConfigError::Inconsistent {
                field: "detector.answer_grace_max (µs)",
                value: ms(self.answer_grace_max),
                other: "detector.idle_interval (µs)",
                other_value: ms(self.idle_interval),
                why: "an unanswered call would be watched no sooner than an idle pair",
            });
        }
        if self.slow_after.is_some() && !(1..=16).contains(&self.slow_factor) {
            return Err(ConfigError::Inconsistent {
                field: "detector.slow_factor",
                value: u64::from(self.slow_factor),
                other: "1..=16",
                other_value: 16,
                why: "a slow pair gets one fence round in 1 to 16",
            });
        }
        if !(1..=4096).contains(&self.probe_peers) {
            return Err(ConfigError::Inconsistent {
                field: "detector.probe_peers",
                value: u64::try_from(self.probe_peers).unwrap_or(u64::MAX),
                other: "1..=4096",
                other_value: 4096,
                why: "a report probes 1 to 4096 other peers of its network",
            });
        }
        if self.crowd_budget == Some(0) {
            return Err(ConfigError::Zero {
                field: "detector.crowd_budget",
            });
        }
        if let Some(a) = self.slow_after.filter(|a| *a < self.idle_interval) {
            return Err(ConfigError::Inconsistent {
                field: "detector.slow_after (µs)",
                value: ms(a),
                other: "detector.idle_interval (µs)",
                other_value: ms(self.idle_interval),
                why: "a pair is idle for at least one idle interval before it is slow",
            });
        }
        if self.check_every > self.path_timeout.min(self.timeout) {
            return Err(ConfigError::Inconsistent {
                field: "detector.timeout (µs)",
                value: ms(self.timeout),
                other: "detector.check_every (µs)",
                other_value: ms(self.check_every),
                why: "windows must be checked at least once per window",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_scaled() {
        DetectorConfig::default().validate().unwrap();
        for ms in [1, 10, 100, 1000] {
            DetectorConfig::with_interval(Duration::from_millis(ms))
                .validate()
                .unwrap();
        }
    }

    #[test]
    fn window_shorter_than_schedule_is_rejected() {
        let mut c = DetectorConfig::with_interval(Duration::from_millis(10));
        c.timeout = Duration::from_millis(140);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent { .. })
        ));
        c.timeout = Duration::from_millis(150);
        c.validate().unwrap();
        c.idle_interval = Duration::from_millis(5);
        assert!(
            matches!(c.validate(), Err(ConfigError::Inconsistent { .. })),
            "idle pace faster than busy"
        );
        c.idle_interval = Duration::from_millis(40);
        c.idle_path_timeout = Duration::from_millis(80);
        c.timeout = Duration::from_millis(150);
        assert!(
            matches!(c.validate(), Err(ConfigError::Inconsistent { .. })),
            "idle window shorter than two idle heartbeats"
        );
        c.idle_path_timeout = Duration::from_millis(90);
        c.validate().unwrap();
        c.interval = Duration::ZERO;
        assert!(matches!(c.validate(), Err(ConfigError::Zero { .. })));
    }

    #[test]
    fn a_crowd_pace_stays_within_the_fence_and_the_idle_window() {
        let c = DetectorConfig::default();
        assert_eq!(c.max_crowd_shift(), 5);
        assert_eq!(c.crowd_interval(5), Duration::from_millis(320));
        assert_eq!(c.crowd_path_timeout(1), Duration::from_millis(90));
        assert_eq!(c.crowd_path_timeout(5), Duration::from_millis(990));
        // A shift past the largest is watched as the largest.
        assert_eq!(c.crowd_path_timeout(7), c.crowd_path_timeout(5));
        assert!(c.crowd_path_timeout(5) <= c.idle_path_timeout);
        let off = DetectorConfig::with_interval(Duration::from_millis(10));
        assert_eq!(off.max_crowd_shift(), 0);
        // Its own budget off, a receiver still honours a peer's shift.
        assert_eq!(off.crowd_shift_limit(), 1);
        assert_eq!(off.crowd_path_timeout(1), Duration::from_millis(90));
        let z = DetectorConfig {
            crowd_budget: Some(0),
            ..DetectorConfig::default()
        };
        assert!(matches!(z.validate(), Err(ConfigError::Zero { .. })));
    }
}
