//! A crowd of busy peers: the busy pace stretched so that a process's
//! busy-pace heartbeats stay within `DetectorConfig::crowd_budget` however
//! many peers wait on it (see [`super::Pacer`], "A crowd of busy peers").
//!
//! A process with more busy peers than `crowd_budget × interval` is
//! *crowded*: its shift `s` is the smallest with `busy peers ≤ crowd_budget
//! × interval × 2^s` (at most `max_crowd_shift()`; it falls back only
//! below half the capacity of `s − 1`, so a crowd at a boundary does not
//! switch at every round). It then
//!
//! - sends each busy peer a copy every `interval × 2^s` instead of every
//!   `interval`, its copies saying so (the pace shift: the receiver watches
//!   the path with `crowd_path_timeout(s)`);
//! - asks every peer, in every heartbeat, for the same (the ask shift): a
//!   peer's busy copies to it go at the larger of the peer's own shift and
//!   the ask, so what the crowded process *receives* is bounded too.
//!
//! A slower pace is announced before it is taken: two copies at the pace
//! the receiver expects say the new shift first (as a pair going quiet
//! says so in two copies), so one lost datagram never leaves a receiver
//! with a window narrower than the gaps. A faster pace is taken at once
//! (the window narrows only when a copy saying so arrives, and copies then
//! come faster). Dead reports do not move: they rest on the fence's
//! heartbeats, which go every `idle_interval` whatever the pace.

use std::collections::BTreeMap;
use std::time::Duration;

use super::datagram::shift_flags;
use super::pace::NOTICES;
use super::DetectorConfig;
use crate::ids::{Epoch, NodeId};
use crate::time::Time;

/// The crowd state of one process.
#[derive(Clone, Debug)]
pub(super) struct Crowd {
    interval: Duration,
    /// Busy peers the budget covers at shift 0.
    base: f64,
    max: u8,
    /// `crowd_shift_limit()`: the most a peer's ask slows us.
    limit: u8,
    /// Our shift: the pace of our busy copies, and our ask of every peer.
    own: u8,
    /// Per peer heard from: the newest heartbeat whose ask was read
    /// (heartbeats on two networks overtake each other), and its ask.
    asks: BTreeMap<NodeId, ((Epoch, u64), u8)>,
}

/// The pace of our busy copies to one peer.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PeerShift {
    /// The shift our copies announce.
    announced: u8,
    /// The shift they go at: below `announced` while its notices go.
    paced: u8,
    /// Copies still to go at `paced` that announce `announced`.
    notices: u8,
    /// When the last copy went.
    last: Option<Time>,
}

impl Crowd {
    /// `None` when `crowd_budget` is off.
    pub(super) fn new(config: &DetectorConfig) -> Option<Crowd> {
        let budget = config.crowd_budget?;
        Some(Crowd {
            interval: config.interval,
            base: f64::from(budget) * config.interval.as_secs_f64(),
            max: config.max_crowd_shift(),
            limit: config.crowd_shift_limit(),
            own: 0,
            asks: BTreeMap::new(),
        })
    }

    /// Busy peers the budget covers at `shift`.
    fn capacity(&self, shift: u8) -> f64 {
        self.base * f64::from(1u32 << shift)
    }

    /// `fast` peers are at the busy pace after a round: our shift follows.
    pub(super) fn handle_fast_peers(&mut self, fast: usize) {
        let n = fast as f64;
        while self.own < self.max && n > self.capacity(self.own) {
            self.own += 1;
        }
        while self.own > 0 && n <= self.capacity(self.own - 1) / 2.0 {
            self.own -= 1;
        }
    }

    /// Our shift (what every heartbeat of ours asks).
    pub(super) fn own(&self) -> u8 {
        self.own
    }

    /// A heartbeat of `peer` at `order` carried `ask`: the newest counts.
    pub(super) fn handle_ask(&mut self, peer: NodeId, ask: u8, order: (Epoch, u64)) {
        if self.asks.get(&peer).is_some_and(|(o, _)| *o >= order) {
            return;
        }
        self.asks.insert(peer, (order, ask));
    }

    /// `peer`'s ask (0: none).
    pub(super) fn ask_of(&self, peer: NodeId) -> u8 {
        self.asks.get(&peer).map_or(0, |a| a.1)
    }

    /// The shift of our busy copies to `peer`: ours or its ask.
    pub(super) fn target(&self, peer: NodeId) -> u8 {
        self.own.max(self.ask_of(peer)).min(self.limit)
    }

    /// The peer left.
    pub(super) fn forget(&mut self, peer: NodeId) {
        self.asks.remove(&peer);
    }

    /// The flags of a copy to a peer: the pace `shift` (with `FAST`; 0
    /// otherwise) and our ask.
    pub(super) fn flags(&self, shift: u8) -> u16 {
        shift_flags(shift, self.own)
    }

    /// The interval at `shift`.
    fn interval_at(&self, shift: u8) -> Duration {
        self.interval * (1u32 << shift.min(15))
    }
}

impl PeerShift {
    /// A busy round at `now` with this peer's copies at `target`: whether
    /// its copy is due (`urgent`: it goes at once — the pair just went
    /// busy, or a kick). A faster target is taken at once; a slower one is
    /// announced first (see the module docs).
    pub(super) fn due(&mut self, crowd: &Crowd, now: Time, target: u8, urgent: bool) -> bool {
        if target < self.announced {
            self.announced = target;
            self.paced = target;
            self.notices = 0;
        } else if target > self.announced {
            self.announced = target;
            self.notices = NOTICES;
        }
        // A round may come up to half an interval early for its copy: the
        // receiver's window allows one interval of lateness.
        urgent
            || self.paced == 0
            || self
                .last
                .is_none_or(|t| now + crowd.interval / 2 >= t + crowd.interval_at(self.paced))
    }

    /// The copy went at `now`.
    pub(super) fn sent(&mut self, now: Time) {
        self.last = Some(now);
        if self.notices > 0 {
            self.notices -= 1;
            if self.notices == 0 {
                self.paced = self.announced;
            }
        }
    }

    /// The shift our copies announce.
    pub(super) fn announced(&self) -> u8 {
        self.announced
    }
}

#[cfg(test)]
#[path = "crowd_tests.rs"]
mod tests;
