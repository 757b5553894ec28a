//! The SafeTimer receiver (paper Fig. 2) and the plain-timeout baseline.
//!
//! Watches paths, each identified by [`Watch`] (peer and network). A path
//! comes under watch with its first heartbeat; after that, heartbeats and
//! any other traffic on the path refresh it. Every `check_every` the
//! monitor looks for paths silent for a whole window (`timeout`):
//!
//! - Plain mode reports them down at once.
//! - SafeTimer mode asks the shell for a barrier (one round for all
//!   suspects). When the shell says the barrier came out of the heartbeat
//!   queue, with the drop counters read at that moment, each suspect whose
//!   window began at `start` is reported down only if nothing was heard
//!   since `start` and no drop was counted since `start`. A barrier not back
//!   within `barrier_timeout` ends the round with no report; the next check
//!   starts a new one.
//!
//! A down path comes back up with its next heartbeat. A peer is down when
//! every watched path to it is down.

use std::collections::BTreeMap;
use std::collections::VecDeque;

use super::{DetectorConfig, DetectorMode};
use crate::ids::{Epoch, NodeId};
use crate::time::Time;

/// One watched path: a peer on one network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watch {
    /// The peer.
    pub peer: NodeId,
    /// The network (index into the shell's local addresses).
    pub network: u16,
}

/// A change the monitor reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathReport {
    /// The path is silent: fail over.
    PathDown {
        /// Which path.
        watch: Watch,
        /// When it was last heard.
        last_heard: Time,
    },
    /// The path is heard again.
    PathUp {
        /// Which path.
        watch: Watch,
    },
    /// Every watched path to the peer is down.
    PeerDown {
        /// The peer.
        peer: NodeId,
    },
    /// A path to a peer that was down is heard again.
    PeerUp {
        /// The peer.
        peer: NodeId,
    },
}

/// What the monitor asks of the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorAction {
    /// Send a barrier with this token through the heartbeat queue (one per
    /// CPU whose backlog heartbeats may wait in), then call
    /// [`Monitor::handle_barrier`] once all of them came out.
    SendBarrier {
        /// Identifies the round.
        token: u64,
    },
    /// Report this.
    Report(PathReport),
}

/// Counters, for experiments and stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorStats {
    /// Paths reported down.
    pub reported_down: u64,
    /// Barrier rounds started.
    pub barrier_rounds: u64,
    /// Rounds ended because the barrier did not come back.
    pub barriers_lost: u64,
    /// Suspects cleared because something was heard from them before the
    /// barrier came out (a plain detector would have reported these).
    pub saved_by_barrier: u64,
    /// Suspects not reported because a receive drop was counted since their
    /// window began.
    pub saved_by_drop: u64,
}

#[derive(Clone, Debug)]
struct PathState {
    last_heard: Time,
    epoch: Epoch,
    down: bool,
}

#[derive(Clone, Debug)]
struct Round {
    token: u64,
    sent_at: Time,
    /// Suspects and the start of their window.
    suspects: Vec<(Watch, Time)>,
}

/// The receiver side of the detector for one process.
#[derive(Clone, Debug)]
pub struct Monitor {
    config: DetectorConfig,
    paths: BTreeMap<Watch, PathState>,
    next_check: Time,
    round: Option<Round>,
    next_token: u64,
    /// Drop counters' last reading, and when they last grew.
    drops: Option<u64>,
    t_drop: Option<Time>,
    actions: VecDeque<MonitorAction>,
    stats: MonitorStats,
}

impl Monitor {
    /// A monitor watching nothing yet.
    pub fn new(config: &DetectorConfig, now: Time) -> Self {
        Monitor {
            config: config.clone(),
            paths: BTreeMap::new(),
            next_check: now + config.check_every,
            round: None,
            next_token: 1,
            drops: None,
            t_drop: None,
            actions: VecDeque::new(),
            stats: MonitorStats::default(),
        }
    }

    /// A heartbeat from `watch.peer` (incarnation `epoch`) arrived at `now`.
    /// Starts watching the path on first contact; a newer epoch starts
    /// afresh.
    pub fn handle_heartbeat(&mut self, now: Time, watch: Watch, epoch: Epoch) {
        match self.paths.get_mut(&watch) {
            Some(p) if epoch < p.epoch => {}
            Some(p) => {
                p.epoch = epoch;
                self.heard(now, watch);
            }
            None => {
                self.paths.insert(
                    watch,
                    PathState {
                        last_heard: now,
                        epoch,
                        down: false,
                    },
                );
            }
        }
    }

    /// Traffic other than a heartbeat arrived on a watched path (data and
    /// acks count as heartbeats). Ignored for a path not watched yet.
    pub fn handle_heard(&mut self, now: Time, watch: Watch) {
        if self.paths.contains_key(&watch) {
            self.heard(now, watch);
        }
    }

    fn heard(&mut self, now: Time, watch: Watch) {
        let Some(p) = self.paths.get_mut(&watch) else {
            return;
        };
        if now > p.last_heard {
            p.last_heard = now;
        }
        if p.down {
            let peer_was_down = self.peer_down(watch.peer);
            if let Some(p) = self.paths.get_mut(&watch) {
                p.down = false;
            }
            self.actions
                .push_back(MonitorAction::Report(PathReport::PathUp { watch }));
            if peer_was_down {
                self.actions
                    .push_back(MonitorAction::Report(PathReport::PeerUp {
                        peer: watch.peer,
                    }));
            }
        }
    }

    /// The drop counters' total, read at `now` outside a barrier round
    /// (once at start, so the first round has something to compare with).
    pub fn handle_drop_count(&mut self, now: Time, total: u64) {
        if let Some(before) = self.drops {
            if total != before {
                self.t_drop = Some(now);
            }
        }
        self.drops = Some(total);
    }

    /// Every barrier of round `token` came out of the heartbeat queue; the
    /// drop counters read right after total `drops`.
    pub fn handle_barrier(&mut self, now: Time, token: u64, drops: u64) {
        let Some(round) = self.round.take_if(|r| r.token == token) else {
            return;
        };
        self.handle_drop_count(now, drops);
        let mut newly_down = Vec::new();
        for (watch, start) in round.suspects {
            let Some(p) = self.paths.get(&watch) else {
                continue;
            };
            if p.down {
                continue;
            }
            if p.last_heard >= start {
                // Heard after all: the heartbeat was waiting in our own
                // pipeline.
                self.stats.saved_by_barrier += 1;
                continue;
            }
            if self.t_drop.is_some_and(|t| t >= start) {
                // A heartbeat may have been among what we dropped.
                self.stats.saved_by_drop += 1;
                continue;
            }
            newly_down.push(watch);
        }
        self.mark_down(newly_down);
    }

    fn mark_down(&mut self, watches: Vec<Watch>) {
        for watch in watches {
            let Some(p) = self.paths.get_mut(&watch) else {
                continue;
            };
            p.down = true;
            let last_heard = p.last_heard;
            self.stats.reported_down += 1;
            self.actions
                .push_back(MonitorAction::Report(PathReport::PathDown {
                    watch,
                    last_heard,
                }));
            if self.peer_down(watch.peer) {
                self.actions
                    .push_back(MonitorAction::Report(PathReport::PeerDown {
                        peer: watch.peer,
                    }));
            }
        }
    }

    fn peer_down(&self, peer: NodeId) -> bool {
        self.paths
            .range(
                Watch { peer, network: 0 }..=Watch {
                    peer,
                    network: u16::MAX,
                },
            )
            .all(|(_, p)| p.down)
    }

    /// Runs the checks due by `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        if self
            .round
            .as_ref()
            .is_some_and(|r| now >= r.sent_at + self.config.barrier_timeout)
        {
            // The barrier was lost (dropped, or we are too slow to see it):
            // no report for this round.
            self.round = None;
            self.stats.barriers_lost += 1;
        }
        if now < self.next_check {
            return;
        }
        // Late checks do not pile up: the next one is a period from now.
        self.next_check = now + self.config.check_every;
        let window = self.config.timeout;
        let suspects: Vec<(Watch, Time)> = self
            .paths
            .iter()
            .filter(|(_, p)| !p.down && p.last_heard + window < now)
            .map(|(w, _)| {
                (
                    *w,
                    Time::from_nanos(now.as_nanos().saturating_sub(nanos(window))),
                )
            })
            .collect();
        if suspects.is_empty() {
            return;
        }
        match self.config.mode {
            DetectorMode::Plain => self.mark_down(suspects.into_iter().map(|(w, _)| w).collect()),
            DetectorMode::SafeTimer if self.round.is_none() => {
                let token = self.next_token;
                self.next_token += 1;
                self.stats.barrier_rounds += 1;
                self.round = Some(Round {
                    token,
                    sent_at: now,
                    suspects,
                });
                self.actions.push_back(MonitorAction::SendBarrier { token });
            }
            _ => {}
        }
    }

    /// When to call [`Monitor::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Time {
        match &self.round {
            Some(r) => self.next_check.min(r.sent_at + self.config.barrier_timeout),
            None => self.next_check,
        }
    }

    /// The next thing to do or report.
    pub fn poll_action(&mut self) -> Option<MonitorAction> {
        self.actions.pop_front()
    }

    /// Counters so far.
    pub fn stats(&self) -> MonitorStats {
        self.stats
    }

    /// Whether `watch` is watched and currently down.
    pub fn is_down(&self, watch: Watch) -> Option<bool> {
        self.paths.get(&watch).map(|p| p.down)
    }

    /// Every watched path, its last-heard time and whether it is down.
    pub fn watched(&self) -> impl Iterator<Item = (Watch, Time, bool)> + '_ {
        self.paths.iter().map(|(w, p)| (*w, p.last_heard, p.down))
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "monitor_tests.rs"]
mod tests;
