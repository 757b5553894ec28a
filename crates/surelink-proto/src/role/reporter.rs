//! What a node reports to the role-server candidates, built from what its
//! failure detector and its sessions saw (sans-IO: the shell feeds it the
//! events and the clock; the simulator drives the same code).

use std::collections::{HashMap, HashSet};

use crate::ids::NodeId;
use crate::time::Time;

use super::matrix::{PathStatus, PeerReport, StatusReport};
use super::{NetworkIndex, RoleConfig};

/// Something the node saw of a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sighting {
    /// A path (a connection) to `peer` on `network` came up.
    PathUp {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: NetworkIndex,
    },
    /// A path to `peer` on `network` went down.
    PathDown {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: NetworkIndex,
    },
    /// The detector found `peer` silent on `network`.
    PathSilent {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: NetworkIndex,
    },
    /// The detector hears `peer` on `network` again.
    PathHeard {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: NetworkIndex,
    },
    /// The detector reported `peer` dead (SafeTimer: it is fenced).
    PeerDead(NodeId),
    /// `peer` is alive again (heard, or a session to it came up).
    PeerAlive(NodeId),
}

/// Builds this node's [`StatusReport`]s: the unusual only (a peer alive
/// and up on every network is left out), sent at once when it changes and
/// every `refresh` otherwise. Round trips are rounded to ~12 % steps and
/// count as changed only when they move by a factor 1.5, so jitter does
/// not make every report — and so every table — a change.
#[derive(Clone, Debug)]
pub struct Reporter {
    me: NodeId,
    peers: Vec<NodeId>,
    networks: NetworkIndex,
    refresh: std::time::Duration,
    silent: HashSet<(NodeId, NetworkIndex)>,
    dead: HashSet<NodeId>,
    /// Working paths per (peer, network).
    paths: HashMap<(NodeId, NetworkIndex), usize>,
    /// Rounded smoothed round trips, µs.
    rtt: HashMap<(NodeId, NetworkIndex), u32>,
    held: (u64, u64),
    seq: u64,
    last: Option<StatusReport>,
    next_due: Time,
    /// What the report would say may have changed.
    dirty: bool,
}

/// `rtt_us` rounded down to its top three bits: steps of at most 12.5 %.
pub fn round_rtt(rtt_us: u32) -> u32 {
    if rtt_us < 8 {
        return rtt_us;
    }
    let shift = 31 - rtt_us.leading_zeros() - 2;
    (rtt_us >> shift) << shift
}

impl Reporter {
    /// A reporter for node `me` of `cfg`; its first report is due at once.
    pub fn new(cfg: &RoleConfig, me: NodeId, now: Time) -> Reporter {
        Reporter {
            me,
            peers: cfg.nodes.iter().copied().filter(|n| *n != me).collect(),
            networks: cfg.networks,
            refresh: cfg.refresh,
            silent: HashSet::new(),
            dead: HashSet::new(),
            paths: HashMap::new(),
            rtt: HashMap::new(),
            held: (0, 0),
            seq: 0,
            last: None,
            next_due: now,
            dirty: true,
        }
    }

    /// Something the node saw.
    pub fn handle_sighting(&mut self, s: Sighting) {
        match s {
            Sighting::PathUp { peer, network } => {
                *self.paths.entry((peer, network)).or_default() += 1;
            }
            Sighting::PathDown { peer, network } => {
                if let Some(n) = self.paths.get_mut(&(peer, network)) {
                    *n = n.saturating_sub(1);
                }
            }
            Sighting::PathSilent { peer, network } => {
                self.silent.insert((peer, network));
            }
            Sighting::PathHeard { peer, network } => {
                self.silent.remove(&(peer, network));
            }
            Sighting::PeerDead(peer) => {
                self.dead.insert(peer);
            }
            Sighting::PeerAlive(peer) => {
                self.dead.remove(&peer);
            }
        }
        self.dirty = true;
    }

    /// The smoothed round trip of the path to `peer` on `network` (µs;
    /// reported for listed peers only).
    pub fn handle_rtt(&mut self, peer: NodeId, network: NetworkIndex, rtt_us: u32) {
        let key = (peer, network);
        // Hysteresis: a round trip within a factor 1.5 of the one reported
        // is no news (each change is a new table version for every node).
        if let Some(&old) = self.rtt.get(&key) {
            let (new, old) = (u64::from(rtt_us), u64::from(old));
            if 3 * new >= 2 * old && 2 * new <= 3 * old {
                return;
            }
        }
        let r = round_rtt(rtt_us);
        if self.rtt.insert(key, r) != Some(r) {
            self.dirty = true;
        }
    }

    /// The `(epoch, version)` of the table this node holds.
    pub fn handle_held(&mut self, held: (u64, u64)) {
        if held != self.held {
            self.held = held;
            self.dirty = true;
        }
    }

    /// The peers a report would list now (not alive, or not up on every
    /// network): the ones whose round trips are worth feeding.
    pub fn unusual(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.last
            .iter()
            .flat_map(|r| r.peers.iter().map(|p| p.peer))
    }

    fn build(&self) -> StatusReport {
        let mut peers = Vec::new();
        for &peer in &self.peers {
            let alive = !self.dead.contains(&peer);
            let nets: Vec<(PathStatus, u32)> = (0..self.networks)
                .map(|n| {
                    let status = if self.silent.contains(&(peer, n)) {
                        PathStatus::Down
                    } else if self.paths.get(&(peer, n)).copied().unwrap_or(0) == 0 {
                        PathStatus::Suspect
                    } else {
                        PathStatus::Up
                    };
                    (status, self.rtt.get(&(peer, n)).copied().unwrap_or(0))
                })
                .collect();
            if alive && nets.iter().all(|(s, _)| *s == PathStatus::Up) {
                continue;
            }
            peers.push(PeerReport {
                peer,
                alive,
                networks: nets,
            });
        }
        StatusReport {
            reporter: self.me,
            seq: self.seq,
            watched: u32::try_from(self.peers.len()).unwrap_or(u32::MAX),
            held: self.held,
            peers,
        }
    }

    /// The report to send now, if one is due: at once when what it says
    /// changed, else every `refresh`. Each one replaces the last.
    pub fn poll_report(&mut self, now: Time) -> Option<StatusReport> {
        let due = now >= self.next_due;
        if !std::mem::take(&mut self.dirty) && !due {
            return None;
        }
        let mut r = self.build();
        let changed = self
            .last
            .as_ref()
            .is_none_or(|l| l.peers != r.peers || l.held != r.held || l.watched != r.watched);
        if !changed && !due {
            return None;
        }
        self.seq += 1;
        r.seq = self.seq;
        self.next_due = now + self.refresh;
        self.last = Some(r.clone());
        Some(r)
    }

    /// When the next report is due without a change.
    pub fn poll_timeout(&self) -> Time {
        self.next_due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg() -> RoleConfig {
        RoleConfig {
            nodes: vec![NodeId(1), NodeId(2), NodeId(3)],
            candidates: vec![NodeId(1)],
            ..RoleConfig::default()
        }
    }

    fn up_everywhere(r: &mut Reporter) {
        for peer in [NodeId(2), NodeId(3)] {
            for network in 0..2 {
                r.handle_sighting(Sighting::PathUp { peer, network });
            }
        }
    }

    #[test]
    fn reports_the_unusual_on_change_and_every_refresh() {
        let t0 = Time::ZERO;
        let mut r = Reporter::new(&cfg(), NodeId(1), t0);
        // Nothing up yet: both peers suspect on both networks.
        let first = r.poll_report(t0).expect("first report at once");
        assert_eq!(first.seq, 1);
        assert_eq!(first.watched, 2);
        assert_eq!(first.peers.len(), 2);
        assert!(r.poll_report(t0).is_none(), "nothing changed");
        up_everywhere(&mut r);
        let healthy = r.poll_report(t0).expect("a change goes at once");
        assert!(healthy.peers.is_empty());
        // An event that changes nothing the report says waits for the refresh.
        r.handle_sighting(Sighting::PeerAlive(NodeId(2)));
        assert!(r.poll_report(t0 + Duration::from_millis(10)).is_none());
        assert_eq!(r.poll_timeout(), t0 + Duration::from_millis(100));
        let again = r
            .poll_report(t0 + Duration::from_millis(100))
            .expect("refresh");
        assert_eq!(again.seq, healthy.seq + 1);
        assert_eq!(again.peers, healthy.peers);
        // Silent on network 1, then dead.
        r.handle_sighting(Sighting::PathSilent {
            peer: NodeId(3),
            network: 1,
        });
        let silent = r
            .poll_report(t0 + Duration::from_millis(101))
            .expect("change");
        assert_eq!(silent.peers.len(), 1);
        assert!(silent.peers[0].alive);
        assert_eq!(silent.peers[0].networks[1].0, PathStatus::Down);
        assert_eq!(silent.peers[0].networks[0].0, PathStatus::Up);
        r.handle_sighting(Sighting::PeerDead(NodeId(3)));
        let dead = r
            .poll_report(t0 + Duration::from_millis(102))
            .expect("change");
        assert!(!dead.peers[0].alive);
        // Holding a newer table is news too.
        r.handle_held((1, 4));
        let held = r
            .poll_report(t0 + Duration::from_millis(103))
            .expect("change");
        assert_eq!(held.held, (1, 4));
        assert_eq!(r.unusual().collect::<Vec<_>>(), vec![NodeId(3)]);
    }

    #[test]
    fn round_trips_are_rounded_so_jitter_is_no_change() {
        assert_eq!(round_rtt(0), 0);
        assert_eq!(round_rtt(7), 7);
        assert_eq!(round_rtt(1000), 896);
        assert_eq!(round_rtt(1023), 896);
        assert_eq!(round_rtt(1024), 1024);
        for v in [9u32, 100, 1000, 12_345, 1_000_000, u32::MAX] {
            let r = round_rtt(v);
            assert!(r <= v && u64::from(v - r) * 8 <= u64::from(v), "{v} -> {r}");
        }
        let t0 = Time::ZERO;
        let mut r = Reporter::new(&cfg(), NodeId(1), t0);
        up_everywhere(&mut r);
        r.handle_sighting(Sighting::PathSilent {
            peer: NodeId(2),
            network: 1,
        });
        r.handle_rtt(NodeId(2), 0, 1000);
        let a = r.poll_report(t0).expect("first");
        assert_eq!(a.peers[0].networks[0], (PathStatus::Up, 896));
        r.handle_rtt(NodeId(2), 0, 1010);
        assert!(r.poll_report(t0 + Duration::from_millis(1)).is_none());
        r.handle_rtt(NodeId(2), 0, 1300);
        assert!(
            r.poll_report(t0 + Duration::from_millis(1)).is_none(),
            "within 1.5x"
        );
        r.handle_rtt(NodeId(2), 0, 2000);
        let b = r
            .poll_report(t0 + Duration::from_millis(2))
            .expect("a real change");
        assert_eq!(b.peers[0].networks[0], (PathStatus::Up, 1792));
    }
}
