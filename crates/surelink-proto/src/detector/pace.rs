//! Which peers get heartbeats at the busy pace, and what our heartbeats
//! say about the pace (the flags `FAST` and `WATCH`).
//!
//! Every peer gets the fence's heartbeat every `idle_interval` (the
//! [`super::Fence`] schedules those). On top of that, a peer is sent one
//! every `interval` while the pair is *busy*:
//!
//! - we have traffic with it: a call, a message or a reply went to it
//!   within `busy_linger` ([`Pacer::handle_traffic`]) — then our heartbeats
//!   to it say `WATCH`, asking for its fast ones too;
//! - or it asked: one of its heartbeats said `WATCH` within
//!   `idle_interval` ([`Pacer::handle_watch`]).
//!
//! Every heartbeat sent at the busy pace says `FAST`, so the receiver knows
//! which window to watch the path with. When the pair goes quiet, two more
//! heartbeats go out at the busy pace without `FAST` before the pace drops
//! (the receiver widens its window on the first; two, so one lost datagram
//! does not leave it watching a slow path with a short window).
//!
//! A pair going busy — the first traffic after a quiet spell, or a first
//! `WATCH` — is a *kick*: the shell wakes its sender, which sends the busy
//! heartbeats at once instead of at the next tick, and the monitor expects
//! the peer's answer within `path_timeout` ([`super::Monitor::handle_watch_sent`]).
//!
//! What it does not do: send anything, or know about networks (the pace is
//! per peer; the shell sends on every network).

use std::collections::BTreeMap;
use std::time::Duration;

use super::datagram::{FLAG_FAST, FLAG_WATCH};
use super::DetectorConfig;
use crate::ids::NodeId;
use crate::time::Time;

/// Heartbeats at the busy pace (or the last ones of it) that go out
/// without `FAST` when a pair goes quiet.
const NOTICES: u8 = 2;

#[derive(Clone, Copy, Debug, Default)]
struct PeerPace {
    /// Our traffic with the peer keeps the pair busy until then.
    busy_until: Option<Time>,
    /// The peer's `WATCH` keeps it busy until then.
    watched_until: Option<Time>,
    /// Our heartbeats to it currently say `FAST`.
    fast: bool,
    /// Busy-pace heartbeats without `FAST` still to send.
    notices: u8,
    /// A kick is pending: send at once.
    kicked: bool,
}

impl PeerPace {
    fn busy(&self, now: Time) -> bool {
        self.busy_until.is_some_and(|t| now < t)
    }

    fn watched(&self, now: Time) -> bool {
        self.watched_until.is_some_and(|t| now < t)
    }
}

/// The pace of every peer of one process.
#[derive(Clone, Debug)]
pub struct Pacer {
    interval: Duration,
    linger: Duration,
    watch_linger: Duration,
    probe: Duration,
    peers: BTreeMap<NodeId, PeerPace>,
    /// The next busy-pace round (`None`: no peer is busy).
    next_round: Option<Time>,
    kicks: usize,
}

impl Pacer {
    /// No peer busy yet.
    pub fn new(config: &DetectorConfig) -> Self {
        Pacer {
            interval: config.interval,
            linger: config.busy_linger,
            watch_linger: config.idle_interval,
            probe: config.path_timeout,
            peers: BTreeMap::new(),
            next_round: None,
            kicks: 0,
        }
    }

    /// We had traffic with `peer` at `now` (a call, a one-way message or a
    /// reply went to it). Returns whether that is a kick: the pair was
    /// quiet, so the shell should wake its sender now.
    pub fn handle_traffic(&mut self, now: Time, peer: NodeId) -> bool {
        self.busy_for(now, peer, self.linger)
    }

    /// Keeps the pair busy until `now + d` at least; a kick if it was not.
    fn busy_for(&mut self, now: Time, peer: NodeId, d: Duration) -> bool {
        let p = self.peers.entry(peer).or_default();
        let was = p.busy(now);
        let until = now + d;
        if p.busy_until.is_none_or(|t| t < until) {
            p.busy_until = Some(until);
        }
        let kick = !was;
        if kick && !p.kicked {
            p.kicked = true;
            self.kicks += 1;
        }
        kick
    }

    /// Probe `peer` at `now` (a path of another peer on a network we share
    /// with it was reported down): the busy pace and `WATCH` for a short
    /// while (`path_timeout`), enough for the peer to answer at its busy
    /// pace for an idle interval. Returns whether that is a kick.
    pub fn handle_probe(&mut self, now: Time, peer: NodeId) -> bool {
        self.busy_for(now, peer, self.probe)
    }

    /// An authentic heartbeat of `peer` arrived at `now`, saying `WATCH`
    /// or not. Returns whether that is a kick (it asked and we were slow).
    pub fn handle_watch(&mut self, now: Time, peer: NodeId, watch: bool) -> bool {
        if !watch {
            return false;
        }
        let p = self.peers.entry(peer).or_default();
        p.watched_until = Some(now + self.watch_linger);
        let kick = !p.fast;
        if kick && !p.kicked {
            p.kicked = true;
            self.kicks += 1;
        }
        kick
    }

    /// The flags our heartbeats to `peer` carry at `now` (for the fence's
    /// rounds; the busy rounds get theirs from [`Pacer::poll_round`]).
    pub fn flags(&self, now: Time, peer: NodeId) -> u16 {
        let Some(p) = self.peers.get(&peer) else {
            return 0;
        };
        let mut f = 0;
        if p.fast {
            f |= FLAG_FAST;
        }
        if p.busy(now) {
            f |= FLAG_WATCH;
        }
        f
    }

    /// Whether `peer` is sent heartbeats at the busy pace now.
    pub fn is_fast(&self, peer: NodeId) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.fast)
    }

    /// The busy-pace round due at `now`, if one is: every peer to send a
    /// heartbeat to, with its flags, into `out` (cleared first). A kick
    /// makes a round due at once. Returns whether a round is due.
    pub fn poll_round(&mut self, now: Time, out: &mut Vec<(NodeId, u16)>) -> bool {
        out.clear();
        let due = self.kicks > 0 || self.next_round.is_some_and(|t| now >= t);
        if !due {
            return false;
        }
        self.kicks = 0;
        let mut more = false;
        self.peers.retain(|peer, p| {
            p.kicked = false;
            let busy = p.busy(now);
            if busy || p.watched(now) {
                p.fast = true;
                p.notices = NOTICES;
                out.push((*peer, FLAG_FAST | if busy { FLAG_WATCH } else { 0 }));
                more = true;
            } else if p.notices > 0 {
                p.fast = false;
                p.notices -= 1;
                out.push((*peer, 0));
                more = true;
            } else {
                p.fast = false;
            }
            // Nothing to remember about a quiet peer.
            p.fast || p.notices > 0 || p.busy_until.is_some_and(|t| now < t)
        });
        self.next_round = more.then(|| now + self.interval);
        true
    }

    /// When [`Pacer::poll_round`] is due next (`None`: no busy peer).
    pub fn poll_timeout(&self, now: Time) -> Option<Time> {
        if self.kicks > 0 {
            return Some(now);
        }
        self.next_round
    }

    /// The peer left: no busy pace for it.
    pub fn forget(&mut self, peer: NodeId) {
        if self.peers.remove(&peer).is_some_and(|p| p.kicked) {
            self.kicks = self.kicks.saturating_sub(1);
        }
    }

    /// How many peers are at the busy pace.
    pub fn fast_peers(&self) -> usize {
        self.peers.values().filter(|p| p.fast).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(m: u64) -> Time {
        Time::from_millis(m)
    }

    fn pacer() -> Pacer {
        Pacer::new(&DetectorConfig::default())
    }

    /// Traffic kicks a round at once; the busy pace holds while traffic
    /// lingers, then two notices without FAST, then nothing.
    #[test]
    fn traffic_makes_a_pair_fast_then_it_slows_with_notices() {
        let mut p = pacer();
        let a = NodeId(7);
        let mut out = Vec::new();
        assert!(!p.poll_round(ms(0), &mut out), "quiet: no busy rounds");
        assert_eq!(p.poll_timeout(ms(0)), None);
        assert!(p.handle_traffic(ms(5), a), "first traffic kicks");
        assert!(!p.handle_traffic(ms(6), a), "already busy");
        assert_eq!(p.poll_timeout(ms(6)), Some(ms(6)), "kick: at once");
        assert!(p.poll_round(ms(6), &mut out));
        assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
        assert_eq!(p.poll_timeout(ms(6)), Some(ms(16)));
        assert_eq!(p.flags(ms(7), a), FLAG_FAST | FLAG_WATCH);
        // Busy until 6 + 1000 ms.
        assert!(p.poll_round(ms(1005), &mut out));
        assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
        assert!(
            !p.poll_round(ms(1010), &mut out),
            "the next tick is at 1015"
        );
        assert!(p.poll_round(ms(1015), &mut out));
        assert_eq!(out, vec![(a, 0)], "first notice");
        assert_eq!(p.flags(ms(1016), a), 0);
        assert!(p.poll_round(ms(1025), &mut out));
        assert_eq!(out, vec![(a, 0)], "second notice");
        assert!(p.poll_round(ms(1035), &mut out));
        assert!(out.is_empty());
        assert_eq!(p.poll_timeout(ms(1035)), None, "no more busy rounds");
        assert_eq!(p.fast_peers(), 0);
    }

    /// A peer's WATCH makes us fast toward it (FAST without WATCH) for an
    /// idle interval after its last one.
    #[test]
    fn a_watching_peer_gets_the_busy_pace() {
        let mut p = pacer();
        let b = NodeId(9);
        let mut out = Vec::new();
        assert!(!p.handle_watch(ms(0), b, false));
        assert!(p.handle_watch(ms(0), b, true));
        assert!(p.poll_round(ms(1), &mut out));
        assert_eq!(out, vec![(b, FLAG_FAST)]);
        assert!(!p.handle_watch(ms(5), b, true), "fast already: no kick");
        // Its last WATCH at 5 ms holds for an idle interval (400 ms).
        assert!(p.poll_round(ms(401), &mut out));
        assert_eq!(out, vec![(b, FLAG_FAST)]);
        assert!(p.poll_round(ms(411), &mut out));
        assert_eq!(out, vec![(b, 0)], "its watch lapsed");
        assert!(!p.is_fast(b));
    }

    /// A probe is a short busy spell: WATCH goes out at once, and the pace
    /// drops again after `path_timeout` (50 ms) with its notices.
    #[test]
    fn a_probe_asks_at_once_and_lasts_briefly() {
        let mut p = pacer();
        let c = NodeId(3);
        let mut out = Vec::new();
        assert!(p.handle_probe(ms(100), c));
        assert!(p.poll_round(ms(100), &mut out));
        assert_eq!(out, vec![(c, FLAG_FAST | FLAG_WATCH)]);
        assert!(p.poll_round(ms(140), &mut out));
        assert_eq!(out, vec![(c, FLAG_FAST | FLAG_WATCH)]);
        assert!(p.poll_round(ms(150), &mut out));
        assert_eq!(out, vec![(c, 0)], "50 ms later: notices");
    }

    #[test]
    fn forgetting_a_kicked_peer_leaves_no_kick() {
        let mut p = pacer();
        p.handle_traffic(ms(0), NodeId(1));
        p.forget(NodeId(1));
        assert_eq!(p.poll_timeout(ms(0)), None);
    }
}
