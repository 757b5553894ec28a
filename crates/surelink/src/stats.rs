//! Counters and a histogram: kept here as atomics (cheap on the data path),
//! mirrored to the `metrics` facade for whatever recorder the application
//! installs, snapshot for `surelink stats`, and rendered as Prometheus text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use surelink_proto::{NodeId, SessionStats};

use crate::histogram::Histogram;

/// The endpoint's counters.
#[derive(Debug)]
pub(crate) struct Stats {
    messages_sent: AtomicU64,
    /// One-way sends queued behind a scheduled flush without the
    /// session's lock (`session/stage.rs`), counted as they are drained.
    sends_staged: AtomicU64,
    messages_received: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    /// Shared with every connection, which counts its own writes.
    socket_writes: std::sync::Arc<AtomicU64>,
    paths_up: AtomicU64,
    paths_down: AtomicU64,
    failover_resends: AtomicU64,
    calls: AtomicU64,
    call_errors: AtomicU64,
    refused_inputs: AtomicU64,
    handshakes_failed: AtomicU64,
    connections_refused: AtomicU64,
    /// Per limit, in the order of [`ConnectionsRefused::NAMES`].
    refused_by: [AtomicU64; 9],
    handler_errors: AtomicU64,
    handler_panics: AtomicU64,
    /// Times a peer node's one-way messages stopped at its incoming bound.
    peer_bound_hits: AtomicU64,
    /// Times a session task's timer fired (test hook: `Testing`).
    pub(crate) timer_fires: AtomicU64,
    /// Call round trips, microseconds.
    call_rtt: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            messages_sent: AtomicU64::new(0),
            sends_staged: AtomicU64::new(0),
            messages_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            socket_writes: std::sync::Arc::default(),
            paths_up: AtomicU64::new(0),
            paths_down: AtomicU64::new(0),
            failover_resends: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            call_errors: AtomicU64::new(0),
            refused_inputs: AtomicU64::new(0),
            handshakes_failed: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            refused_by: Default::default(),
            handler_errors: AtomicU64::new(0),
            handler_panics: AtomicU64::new(0),
            peer_bound_hits: AtomicU64::new(0),
            timer_fires: AtomicU64::new(0),
            call_rtt: Histogram::default(),
        }
    }
}

impl Stats {
    pub(crate) fn messages_sent(&self, n: u64) {
        if n > 0 {
            self.messages_sent.fetch_add(n, Relaxed);
            metrics::counter!("surelink_messages_sent_total").increment(n);
        }
    }
    /// `n` staged sends drained into their session (already counted
    /// sent by `messages_sent`).
    pub(crate) fn sends_staged(&self, n: u64) {
        self.sends_staged.fetch_add(n, Relaxed);
        metrics::counter!("surelink_sends_staged_total").increment(n);
    }
    pub(crate) fn handler_panicked(&self) {
        self.handler_panics.fetch_add(1, Relaxed);
        self.handler_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn peer_bound_hit(&self) {
        self.peer_bound_hits.fetch_add(1, Relaxed);
        metrics::counter!("surelink_peer_bound_hits_total").increment(1);
    }
    pub(crate) fn group_recovery(&self) {
        metrics::counter!("surelink_group_recoveries_total").increment(1);
    }
    pub(crate) fn handler_failed(&self) {
        self.handler_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn messages_received(&self, n: usize) {
        self.messages_received.fetch_add(n as u64, Relaxed);
        metrics::counter!("surelink_messages_received_total").increment(n as u64);
    }
    pub(crate) fn bytes_sent(&self, n: usize) {
        self.bytes_sent.fetch_add(n as u64, Relaxed);
        metrics::counter!("surelink_bytes_sent_total").increment(n as u64);
    }
    /// The counter a connection adds its socket writes to.
    pub(crate) fn write_counter(&self) -> std::sync::Arc<AtomicU64> {
        self.socket_writes.clone()
    }
    pub(crate) fn bytes_received(&self, n: usize) {
        self.bytes_received.fetch_add(n as u64, Relaxed);
        metrics::counter!("surelink_bytes_received_total").increment(n as u64);
    }
    pub(crate) fn path_up(&self) {
        self.paths_up.fetch_add(1, Relaxed);
        metrics::counter!("surelink_paths_up_total").increment(1);
    }
    pub(crate) fn path_down(&self, resent: usize) {
        self.paths_down.fetch_add(1, Relaxed);
        self.failover_resends.fetch_add(resent as u64, Relaxed);
        metrics::counter!("surelink_paths_down_total").increment(1);
        metrics::counter!("surelink_failover_resends_total").increment(resent as u64);
    }

    pub(crate) fn call_done(&self, rtt: Option<Duration>) {
        self.calls.fetch_add(1, Relaxed);
        match rtt {
            Some(rtt) => {
                let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1);
                self.call_rtt.record(us);
                metrics::histogram!("surelink_call_seconds").record(rtt.as_secs_f64());
            }
            None => {
                self.call_errors.fetch_add(1, Relaxed);
                metrics::counter!("surelink_call_errors_total").increment(1);
            }
        }
    }
    pub(crate) fn refused_input(&self) {
        self.refused_inputs.fetch_add(1, Relaxed);
        metrics::counter!("surelink_refused_inputs_total").increment(1);
    }

    pub(crate) fn handshake_failed(&self) {
        self.handshakes_failed.fetch_add(1, Relaxed);
        metrics::counter!("surelink_handshakes_failed_total").increment(1);
    }

    /// A connection closed at the limit numbered `limit`
    /// ([`ConnectionsRefused::NAMES`]).
    pub(crate) fn connection_refused(&self, limit: usize) {
        self.connections_refused.fetch_add(1, Relaxed);
        if let Some(c) = self.refused_by.get(limit) {
            c.fetch_add(1, Relaxed);
        }
        metrics::counter!("surelink_connections_refused_total").increment(1);
        let name = ConnectionsRefused::NAMES
            .get(limit)
            .copied()
            .unwrap_or("other");
        metrics::counter!("surelink_connections_refused_by_limit_total", "limit" => name)
            .increment(1);
    }

    pub(crate) fn snapshot(&self, sessions: Vec<(NodeId, SessionStats)>) -> StatsSnapshot {
        let ([p50, p99, p999], max) = self.call_rtt.quantiles([0.5, 0.99, 0.999]);
        StatsSnapshot {
            messages_sent: self.messages_sent.load(Relaxed),
            sends_staged: self.sends_staged.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
            duplicate_requests: sessions.iter().map(|(_, s)| s.duplicate_requests).sum(),
            calls_resent: sessions.iter().map(|(_, s)| s.calls_resent).sum(),
            bytes_sent: self.bytes_sent.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            socket_writes: self.socket_writes.load(Relaxed),
            paths_up: self.paths_up.load(Relaxed),
            paths_down: self.paths_down.load(Relaxed),
            failover_resends: self.failover_resends.load(Relaxed),
            calls: self.calls.load(Relaxed),
            call_errors: self.call_errors.load(Relaxed),
            refused_inputs: self.refused_inputs.load(Relaxed),
            handshakes_failed: self.handshakes_failed.load(Relaxed),
            handshakes_resumed: 0,
            connections_refused: self.connections_refused.load(Relaxed),
            connections_refused_by: ConnectionsRefused(std::array::from_fn(|i| {
                self.refused_by[i].load(Relaxed)
            })),
            connections_open: 0,
            handler_errors: self.handler_errors.load(Relaxed),
            handler_panics: self.handler_panics.load(Relaxed),
            peer_bound_hits: self.peer_bound_hits.load(Relaxed)
                + sessions.iter().map(|(_, s)| s.call_bound_hits).sum::<u64>(),
            peer_bytes_held: Vec::new(),
            requests_queued: 0,
            requests_running: 0,
            groups: Vec::new(),
            cleanup_panics: 0,
            call_rtt_us: [p50, p99, p999, max],
            sessions,
            detector: None,
        }
    }
}

/// The counters at one moment.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Messages queued by this endpoint (one-way, requests, replies).
    pub messages_sent: u64,
    /// Of the one-way messages, those a busy session took without its
    /// lock, to leave with the flush already coming (`send` and
    /// `try_send` while the session is writing back to back).
    pub sends_staged: u64,
    /// Messages delivered to this endpoint.
    pub messages_received: u64,
    /// Requests that arrived again (re-sends) and were answered without
    /// running the handler a second time (sessions alive now).
    pub duplicate_requests: u64,
    /// Requests this endpoint sent again (same id) after their re-send
    /// timeout (sessions alive now).
    pub calls_resent: u64,
    /// Bytes written to sockets.
    pub bytes_sent: u64,
    /// Bytes read from sockets.
    pub bytes_received: u64,
    /// Write system calls on data connections (`bytes_sent` over this is
    /// the average write; see [`WriteBatching`](crate::WriteBatching)).
    pub socket_writes: u64,
    /// Paths that finished a handshake.
    pub paths_up: u64,
    /// Paths closed (failovers and shutdowns).
    pub paths_down: u64,
    /// Messages moved to another path when theirs failed.
    pub failover_resends: u64,
    /// Calls completed (with or without error).
    pub calls: u64,
    /// Calls that failed.
    pub call_errors: u64,
    /// Connections closed because their peer sent bytes the core refused.
    pub refused_inputs: u64,
    /// Connections whose authenticating handshake failed or timed out
    /// (unknown keys, impostors, other clusters, garbage).
    pub handshakes_failed: u64,
    /// Paths (dialled or accepted) that resumed with a ticket from an
    /// earlier full handshake with the same peer: no public-key work
    /// (`Config::resume_paths`).
    pub handshakes_resumed: u64,
    /// Connections closed at once because a connection limit was reached.
    pub connections_refused: u64,
    /// The same, per limit.
    pub connections_refused_by: ConnectionsRefused,
    /// Accepted connections open now (authenticated or in their handshake).
    pub connections_open: u64,
    /// Requests whose handler returned an error or panicked.
    pub handler_errors: u64,
    /// Requests whose handler panicked (caught; the caller got an error).
    pub handler_panics: u64,
    /// Times a peer reached a bound on what it can make this node hold
    /// (its one-way messages at `incoming_per_peer` /
    /// `incoming_bytes_per_peer`, or its calls at
    /// `core.call_bytes_per_peer`; sessions alive now) and was held back.
    pub peer_bound_hits: u64,
    /// Per peer with a session or with one-way messages still queued:
    /// every byte held for it now — its
    /// session's retransmit cache, receive side and calls
    /// ([`SessionStats::held_bytes`]) and its one-way messages waiting
    /// for [`Endpoint::recv`](crate::Endpoint::recv), earlier sessions'
    /// included.
    pub peer_bytes_held: Vec<(NodeId, u64)>,
    /// Requests admitted and waiting for a worker now.
    pub requests_queued: u64,
    /// Requests running now.
    pub requests_running: u64,
    /// Per recovery group: state, queue depth, workers held, recoveries,
    /// time in recovery.
    pub groups: Vec<crate::server::GroupSnapshot>,
    /// Clean-up blocks (and groups' own recoveries) that panicked.
    pub cleanup_panics: u64,
    /// Call round trip p50, p99, p99.9, max in microseconds.
    pub call_rtt_us: [u64; 4],
    /// Per peer session counters from the core.
    pub sessions: Vec<(NodeId, SessionStats)>,
    /// The failure detector's counters (`None` when it is off).
    pub detector: Option<crate::DetectorSnapshot>,
}

/// Accepted connections closed at each limit (see
/// [`Config`](crate::Config)'s connection limits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionsRefused(pub [u64; 9]);

impl ConnectionsRefused {
    /// The limits, in the order of the array: `max_connections`; the
    /// shared pool's share of it (`max_connections` less
    /// `member_reserve`); `max_connections_per_ip`; `max_handshaking`;
    /// `max_handshaking_per_ip`; `max_handshaking_per_prefix`;
    /// `handshake_rate`; `handshake_rate_total`;
    /// `max_connections_per_member`.
    pub const NAMES: [&'static str; 9] = crate::admission::LimitHit::NAMES;

    /// Connections closed at the limit called `name` (one of
    /// [`ConnectionsRefused::NAMES`]); 0 for an unknown name.
    pub fn get(&self, name: &str) -> u64 {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| self.0[i])
    }
}

impl StatsSnapshot {
    /// Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            "surelink_messages_sent_total",
            "Messages queued",
            self.messages_sent,
        );
        counter(
            "surelink_messages_received_total",
            "Messages delivered",
            self.messages_received,
        );
        counter(
            "surelink_bytes_sent_total",
            "Bytes written to sockets",
            self.bytes_sent,
        );
        counter(
            "surelink_bytes_received_total",
            "Bytes read from sockets",
            self.bytes_received,
        );
        counter(
            "surelink_socket_writes_total",
            "Write system calls on data connections",
            self.socket_writes,
        );
        counter(
            "surelink_paths_up_total",
            "Paths that finished a handshake",
            self.paths_up,
        );
        counter("surelink_paths_down_total", "Paths closed", self.paths_down);
        counter(
            "surelink_failover_resends_total",
            "Messages moved off a failed path",
            self.failover_resends,
        );
        counter(
            "surelink_sends_staged_total",
            "One-way sends queued behind a busy session's flush without its lock",
            self.sends_staged,
        );
        counter("surelink_calls_total", "Calls completed", self.calls);
        counter(
            "surelink_call_errors_total",
            "Calls failed",
            self.call_errors,
        );
        counter(
            "surelink_refused_inputs_total",
            "Connections closed for bad input",
            self.refused_inputs,
        );
        counter(
            "surelink_handshakes_failed_total",
            "Connections whose authenticating handshake failed",
            self.handshakes_failed,
        );
        counter(
            "surelink_handshakes_resumed_total",
            "Paths that resumed with a ticket (no public-key work)",
            self.handshakes_resumed,
        );
        counter(
            "surelink_connections_refused_total",
            "Connections refused at a connection limit",
            self.connections_refused,
        );
        counter(
            "surelink_peer_bound_hits_total",
            "Times a peer was held back at a bound on what it can make this node hold",
            self.peer_bound_hits,
        );
        let _ = writeln!(s, "# HELP surelink_connections_refused_by_limit_total Connections refused, per limit\n# TYPE surelink_connections_refused_by_limit_total counter");
        for (name, v) in ConnectionsRefused::NAMES
            .iter()
            .zip(self.connections_refused_by.0)
        {
            let _ = writeln!(
                s,
                "surelink_connections_refused_by_limit_total{{limit=\"{name}\"}} {v}"
            );
        }
        let _ = writeln!(
            s,
            "# HELP surelink_connections_open Accepted connections open now\n# TYPE surelink_connections_open gauge\nsurelink_connections_open {}",
            self.connections_open
        );
        let _ = writeln!(s, "# HELP surelink_peer_bytes_held Bytes held for a peer now (its session's buffers and calls, its queued one-way messages)\n# TYPE surelink_peer_bytes_held gauge");
        for (peer, b) in &self.peer_bytes_held {
            let _ = writeln!(s, "surelink_peer_bytes_held{{peer=\"{peer}\"}} {b}");
        }
        self.groups_to_prometheus(&mut s);
        let _ = writeln!(s, "# HELP surelink_call_rtt_microseconds Call round trip\n# TYPE surelink_call_rtt_microseconds summary");
        for (q, v) in [
            ("0.5", self.call_rtt_us[0]),
            ("0.99", self.call_rtt_us[1]),
            ("0.999", self.call_rtt_us[2]),
        ] {
            let _ = writeln!(s, "surelink_call_rtt_microseconds{{quantile=\"{q}\"}} {v}");
        }
        let _ = writeln!(s, "# HELP surelink_session_resent_total Messages re-sent per peer\n# TYPE surelink_session_resent_total counter");
        for (peer, st) in &self.sessions {
            let _ = writeln!(
                s,
                "surelink_session_resent_total{{peer=\"{peer}\"}} {}",
                st.resent
            );
        }
        let _ = writeln!(s, "# HELP surelink_session_idle_paths_closed_total Paths closed after path_idle_timeout without valid input, per peer\n# TYPE surelink_session_idle_paths_closed_total counter");
        for (peer, st) in &self.sessions {
            let _ = writeln!(
                s,
                "surelink_session_idle_paths_closed_total{{peer=\"{peer}\"}} {}",
                st.idle_paths_closed
            );
        }
        let _ = writeln!(s, "# HELP surelink_path_srtt_microseconds Smoothed RTT per path\n# TYPE surelink_path_srtt_microseconds gauge");
        for (peer, st) in &self.sessions {
            for p in &st.paths {
                let _ = writeln!(
                    s,
                    "surelink_path_srtt_microseconds{{peer=\"{peer}\",path=\"{}\"}} {}",
                    p.id,
                    p.srtt.as_micros()
                );
            }
        }
        if let Some(d) = &self.detector {
            let m = &d.monitor;
            for (name, help, v) in [
                (
                    "heartbeats_sent_total",
                    "Heartbeats sent",
                    d.heartbeats_sent,
                ),
                (
                    "heartbeats_received_total",
                    "Heartbeats received",
                    d.heartbeats_received,
                ),
                ("fences_total", "Times this process fenced itself", d.fences),
                (
                    "paths_silent_total",
                    "Paths reported silent",
                    m.reported_down,
                ),
                ("peers_dead_total", "Peers reported dead", m.reported_dead),
                (
                    "barrier_rounds_total",
                    "SafeTimer barrier rounds",
                    m.barrier_rounds,
                ),
                (
                    "barriers_lost_total",
                    "Barrier rounds that ended without the barrier",
                    m.barriers_lost,
                ),
                (
                    "saved_by_barrier_total",
                    "Suspects heard after all (a plain timeout would have reported them)",
                    m.saved_by_barrier,
                ),
                (
                    "saved_by_drop_total",
                    "Suspects not reported because of a receive drop",
                    m.saved_by_drop,
                ),
                (
                    "saved_by_stray_total",
                    "Suspects not steered yet, not reported because the strays' queue dropped or held datagrams",
                    m.saved_by_stray,
                ),
                (
                    "reported_through_stray_drops_total",
                    "Reports made although the strays' queue dropped datagrams (junk that one queue would have let hold them back)",
                    m.reported_through_stray_drops,
                ),
                (
                    "saved_by_private_total",
                    "Private suspects not reported because their private queue dropped or held datagrams",
                    m.saved_by_private,
                ),
                (
                    "reported_through_member_drops_total",
                    "Private suspects reported although the members' queue dropped datagrams (a flood forging members' addresses)",
                    m.reported_through_member_drops,
                ),
                (
                    "saved_by_stream_total",
                    "Suspects not reported because one of their connections held bytes not yet read (our own reader stalled)",
                    m.saved_by_stream,
                ),
                (
                    "strays_dropped_total",
                    "Datagrams from unsteered sources the kernel dropped (a flood)",
                    d.strays.dropped,
                ),
                (
                    "strays_read_total",
                    "Datagrams read from the strays' queue",
                    d.strays.read,
                ),
                (
                    "refused_malformed_total",
                    "Datagrams refused: not a heartbeat or barrier",
                    d.refused.malformed,
                ),
                (
                    "refused_foreign_total",
                    "Datagrams refused: another cluster's, or claiming to be this node",
                    d.refused.foreign,
                ),
                (
                    "refused_stranger_total",
                    "Heartbeats refused: from a node that is not a member",
                    d.refused.stranger,
                ),
                (
                    "refused_bad_tag_total",
                    "Heartbeats refused: tag does not verify",
                    d.refused.bad_tag,
                ),
                (
                    "refused_replay_total",
                    "Heartbeats refused: replayed",
                    d.refused.replay,
                ),
                (
                    "refused_barrier_total",
                    "Barriers refused: not this process's",
                    d.refused.barrier,
                ),
                (
                    "busy_rounds_total",
                    "Heartbeat rounds at the busy pace (peers with traffic in flight)",
                    d.busy_rounds,
                ),
                (
                    "kicks_total",
                    "Quiet pairs whose first traffic woke the heartbeat sender",
                    d.kicks,
                ),
                (
                    "probes_total",
                    "Networks probed after a path on them was reported down",
                    d.probes,
                ),
            ] {
                let _ = writeln!(
                    s,
                    "# HELP surelink_detector_{name} {help}\n# TYPE surelink_detector_{name} counter\nsurelink_detector_{name} {v}"
                );
            }
            let _ = writeln!(
                s,
                "# HELP surelink_detector_busy_peers Peers sent heartbeats at the busy pace now\n# TYPE surelink_detector_busy_peers gauge\nsurelink_detector_busy_peers {}",
                d.busy_peers
            );
            let _ = writeln!(
                s,
                "# HELP surelink_detector_crowd_shift Busy heartbeats go every interval times 2 to this power (0: not crowded; crowd_budget)\n# TYPE surelink_detector_crowd_shift gauge\nsurelink_detector_crowd_shift {}",
                d.crowd_shift
            );
            let _ = writeln!(
                s,
                "# HELP surelink_detector_steered_sources Source addresses steered to the members' heartbeat queue\n# TYPE surelink_detector_steered_sources gauge\nsurelink_detector_steered_sources {}",
                d.strays.steered
            );
            let _ = writeln!(
                s,
                "# HELP surelink_detector_t_valid_remaining_microseconds Time until the send fence closes unless a heartbeat moves it (negative: closed)\n# TYPE surelink_detector_t_valid_remaining_microseconds gauge\nsurelink_detector_t_valid_remaining_microseconds {}",
                d.t_valid_in_us
            );
        }
        s
    }
}

impl StatsSnapshot {
    /// Per recovery group: its state, queue, workers held, recoveries and
    /// time in recovery.
    fn groups_to_prometheus(&self, s: &mut String) {
        use crate::server::{GroupState, GroupStats};
        // Name, type, help, and the figure.
        type Row = (
            &'static str,
            &'static str,
            &'static str,
            fn(&GroupStats) -> f64,
        );
        let rows: [Row; 6] = [
            (
                "surelink_group_recovering",
                "gauge",
                "1 while the recovery group recovers",
                |g| f64::from(u8::from(g.state != GroupState::Normal)),
            ),
            (
                "surelink_group_queued",
                "gauge",
                "Requests waiting in the group",
                |g| g.queued as f64,
            ),
            (
                "surelink_group_running",
                "gauge",
                "Workers the group holds",
                |g| g.running as f64,
            ),
            (
                "surelink_group_recoveries_total",
                "counter",
                "Recoveries the group began",
                |g| g.recoveries as f64,
            ),
            (
                "surelink_group_failed_total",
                "counter",
                "Tasks of the group that failed",
                |g| g.failed as f64,
            ),
            (
                "surelink_group_recovery_seconds_total",
                "counter",
                "Time the group spent in recovery",
                |g| g.in_recovery.as_secs_f64(),
            ),
        ];
        for (name, kind, help, f) in rows {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for g in &self.groups {
                let _ = writeln!(s, "{name}{{group=\"{}\"}} {}", g.name, f(&g.stats));
            }
        }
        let _ = writeln!(
            s,
            "# HELP surelink_cleanup_panics_total Clean-up blocks that panicked\n# TYPE surelink_cleanup_panics_total counter\nsurelink_cleanup_panics_total {}",
            self.cleanup_panics
        );
    }
}
