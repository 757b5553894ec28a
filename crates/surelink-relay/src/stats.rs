//! A link's counters and the status line built from them.
//!
//! Counters are relaxed atomics, written by the forwarding tasks and read
//! by [`status`](crate::Relay::status); a snapshot is consistent per
//! counter, not across counters (a connection may be counted accepted
//! and not yet open).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::fault::{Direction, Faults};
use crate::link::LinkInfo;

/// The live counters of one link.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) tcp_accepted: AtomicU64,
    pub(crate) tcp_rejected: AtomicU64,
    pub(crate) tcp_connect_failed: AtomicU64,
    pub(crate) tcp_killed: AtomicU64,
    pub(crate) tcp_broken: AtomicU64,
    pub(crate) tcp_open: AtomicU64,
    pub(crate) tcp_bytes_up: AtomicU64,
    pub(crate) tcp_bytes_down: AtomicU64,
    pub(crate) udp_up: AtomicU64,
    pub(crate) udp_down: AtomicU64,
    pub(crate) udp_dropped_up: AtomicU64,
    pub(crate) udp_dropped_down: AtomicU64,
    pub(crate) udp_clients: AtomicU64,
    pub(crate) udp_clients_evicted: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn tcp_bytes(&self, dir: Direction, n: usize) {
        let c = match dir {
            Direction::Down => &self.tcp_bytes_down,
            _ => &self.tcp_bytes_up,
        };
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn udp_sent(&self, dir: Direction) {
        bump(match dir {
            Direction::Down => &self.udp_down,
            _ => &self.udp_up,
        });
    }

    pub(crate) fn udp_dropped(&self, dir: Direction) {
        bump(match dir {
            Direction::Down => &self.udp_dropped_down,
            _ => &self.udp_dropped_up,
        });
    }

    pub(crate) fn snapshot(&self) -> LinkCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkCounters {
            tcp_accepted: g(&self.tcp_accepted),
            tcp_rejected: g(&self.tcp_rejected),
            tcp_connect_failed: g(&self.tcp_connect_failed),
            tcp_killed: g(&self.tcp_killed),
            tcp_broken: g(&self.tcp_broken),
            tcp_open: g(&self.tcp_open),
            tcp_bytes_up: g(&self.tcp_bytes_up),
            tcp_bytes_down: g(&self.tcp_bytes_down),
            udp_datagrams_up: g(&self.udp_up),
            udp_datagrams_down: g(&self.udp_down),
            udp_dropped_up: g(&self.udp_dropped_up),
            udp_dropped_down: g(&self.udp_dropped_down),
            udp_clients: g(&self.udp_clients),
            udp_clients_evicted: g(&self.udp_clients_evicted),
        }
    }
}

/// What one link has done so far (up = client → upstream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkCounters {
    /// TCP connections accepted from clients.
    pub tcp_accepted: u64,
    /// Accepted, then reset at once: the link had
    /// [`Limits::max_connections`](crate::Limits::max_connections) open.
    pub tcp_rejected: u64,
    /// Accepted, then reset: the upstream connect failed or timed out.
    pub tcp_connect_failed: u64,
    /// Reset by [`Links::kill`](crate::Links::kill).
    pub tcp_killed: u64,
    /// Ended by an I/O error on either side (both sides then reset).
    pub tcp_broken: u64,
    /// Open now (accepted, not yet ended).
    pub tcp_open: u64,
    /// Bytes written to upstream.
    pub tcp_bytes_up: u64,
    /// Bytes written to clients.
    pub tcp_bytes_down: u64,
    /// Datagrams sent upstream.
    pub udp_datagrams_up: u64,
    /// Datagrams sent to clients.
    pub udp_datagrams_down: u64,
    /// Datagrams from clients not sent upstream (blackhole, random drop,
    /// send error).
    pub udp_dropped_up: u64,
    /// Datagrams from upstream not sent to their client.
    pub udp_dropped_down: u64,
    /// UDP clients with an upstream socket now.
    pub udp_clients: u64,
    /// UDP clients whose upstream socket was closed to make room for a
    /// new one (idle ones expire without counting here).
    pub udp_clients_evicted: u64,
}

/// One link: where it listens and forwards, its faults and counters.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LinkStatus {
    /// The link.
    pub link: LinkInfo,
    /// Its faults now.
    pub faults: Faults,
    /// Its counters.
    pub counters: LinkCounters,
}

impl std::fmt::Display for LinkStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (l, c) = (&self.link, &self.counters);
        write!(
            f,
            "link {} (network {}) {} -> {}: {} | tcp {} accepted, {} open, {} killed, \
             {} broken, {} B up, {} B down | udp {} up, {} down, {} dropped up, \
             {} dropped down, {} clients",
            l.id.0,
            l.network,
            l.listen,
            l.upstream,
            self.faults,
            c.tcp_accepted,
            c.tcp_open,
            c.tcp_killed,
            c.tcp_broken,
            c.tcp_bytes_up,
            c.tcp_bytes_down,
            c.udp_datagrams_up,
            c.udp_datagrams_down,
            c.udp_dropped_up,
            c.udp_dropped_down,
            c.udp_clients,
        )
    }
}
