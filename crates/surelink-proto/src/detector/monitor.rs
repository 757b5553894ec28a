//! The SafeTimer receiver (paper Fig. 2) and the plain-timeout baseline.
//!
//! Watches paths, each identified by [`Watch`] (peer and network). A path
//! comes under watch with its first heartbeat; after that, heartbeats and
//! any other traffic on the path refresh it. When a window is due (not on
//! a fixed tick; no more often than `check_every`) the monitor looks for
//! paths silent for their window — `path_timeout` while the peer's latest
//! heartbeat there said `FAST`, `idle_path_timeout` otherwise, and
//! `path_timeout` from the moment we asked a slow peer for the busy pace
//! ([`Monitor::handle_watch_sent`]) — and for peers silent on every path
//! for `timeout`:
//!
//! - Plain mode reports them at once.
//! - SafeTimer mode asks the shell for a barrier (one round for all
//!   suspects). When the shell says the barrier came out of the heartbeat
//!   queue, with the drop counters read at that moment, each suspect whose
//!   window began at `start` is reported only if nothing was heard
//!   since `start` and no drop was counted since `start`. A barrier not back
//!   within `barrier_timeout` ends the round with no report; the next check
//!   starts a new one.
//!
//! A down path comes back up with its next heartbeat, a dead peer with its
//! next heartbeat on any path.
//!
//! # Proof obligations with two paces
//!
//! (Three with slow pairs: see the last paragraph.)
//!
//! A *dead* report still rests on the fence alone: the peer's fence
//! schedules a heartbeat to every peer every `idle_interval`, whatever
//! the pace, and `timeout ≥ idle_interval + send_slack +
//! max_network_delay` ([`DetectorConfig::validate`]). So a window of
//! `timeout` with nothing heard holds the schedule of a fenced heartbeat
//! whose deadline and delivery both fall inside it: if the peer were still
//! valid at the report, that heartbeat left in time and was heard (the
//! argument of [`crate::detector`], with `idle_interval` for `interval`).
//! Busy-pace heartbeats are extra, unfenced and unstamped: they only make
//! silence rarer. The receiver's barrier and drop checks guard every
//! report, whatever window started it.
//!
//! Drops are dated when first read, later than they happened (so they
//! hold back more, never less). With no fixed tick the shell must read
//! them as its readers take datagrams (a drop leaves a full queue, which
//! is read at once), not only at the checker's wakes, which may be a
//! whole idle window apart; the interfaces' counters are still read at
//! the checks (at most every 100 ms while the checker is awake).
//!
//! A *path* report claims only that the path is silent now (it moves
//! traffic; a false one costs a re-send), so its window follows the pace
//! the peer announced: a peer's `FAST` heartbeats come every `interval`
//! (or its data does, see "Data as heartbeats"), and the path is watched
//! with `path_timeout`; with `FAST` and `STANDBY` (a busy pair's path that
//! carries no data while another does) every `standby_interval()`, watched
//! with `standby_path_timeout() ≥ 2·standby_interval() + max_network_delay`;
//! without `FAST` every `idle_interval`, watched with `idle_path_timeout
//! ≥ 2·idle_interval + max_network_delay`. A path leaving a pace for a
//! slower one says so in two copies at the faster pace first. A peer
//! leaving the busy pace says so first (two heartbeats without `FAST` at
//! the busy pace, never left out for data), so the window widens before
//! the gaps do; the pace is the newest heartbeat's by sequence
//! ([`Monitor::handle_heartbeat_ordered`]), so a `FAST` one overtaken on
//! the network does not narrow it again. Traffic of ours to a slow peer that goes unanswered for
//! `answer_grace` asks it for the busy pace (`WATCH`) and narrows the
//! window at once: from the ask, a path that carries nothing for
//! `path_timeout` is suspect — as fast as a busy path. The ask ends with
//! the wait (a newer heartbeat without `WATCH` ends the peer's busy pace,
//! after its notices). None of this touches a *dead* report: the pace
//! decides only which path window applies, and the fence's heartbeats,
//! which alone back a dead report, go every `idle_interval` whatever the
//! pace. A path report still needs its window of silence, then the
//! barrier, drop and connection checks: an answer that never came is
//! never itself a report.
//!
//! Slow pairs (`DetectorConfig::slow_after`): a peer whose newest
//! heartbeat on a path says `SLOW` gets only the sender's full fence
//! rounds, one in `slow_factor`; its dead window `slow_timeout()` covers
//! `slow_factor · idle_interval + send_slack + max_network_delay`, so the
//! argument above holds with the full rounds' schedule (a partial round
//! covers no full one in the fence: [`super::Fence::is_full`]). The sender
//! skips rounds only after two said `SLOW`, and every copy without it
//! (busy, notice) brings every round back, so the narrow window is never
//! applied while rounds are skipped. A drop in a path's queue may have
//! carried such a change of pace: within `slow_path_timeout()` of one, the
//! path is watched with the widest path window and its peer with
//! `slow_timeout()` (`monitor_check.rs`).
//!
//! Paths of a peer that fell silent as a whole (`PathReport::PathFailover`,
//! then `PathAbandon` a `timeout` later if the path alone stays silent)
//! claim no more than any path report: each passed its window and the
//! barrier, drop and connection checks, and acting on it moves traffic
//! (suspect first, tear down after a peer window), never fences or
//! declares anyone dead. The shell may reset a suspected connection whose
//! TCP backed off once its network is heard again (`PathUp`): that too
//! costs a re-dial, not a report.
//!
//! # Data as heartbeats
//!
//! Anything authentic read from a path's connection counts as heard
//! ([`Monitor::handle_heard`]), and a busy peer leaves out its busy-pace
//! heartbeats on a path that carries data ([`super::Pacer::admit_copy`]).
//! Then a busy path's only sign of life may be its data, which waits in
//! the connection's receive queue — not in any heartbeat queue the barrier
//! proves clear — while our connection reader is stalled. So a round's
//! end also takes, for every suspect path, its connections' state
//! ([`QueuesAtBarrier::unread_streams`]): a suspect with a connection
//! holding unread bytes, or whose reader read bytes it has not stamped
//! yet, is held back (`saved_by_stream`). The shell reads each connection's
//! queue (`FIONREAD`), then its reader's in-read flag, then the heard
//! stamps, in that order: bytes that arrived in the window are then either
//! still queued, in a read not yet stamped, or stamped. A stalled reader
//! holds back only the path reports of its own connections.
//!
//! The *dead* report does not lean on data: the fence's heartbeats are
//! never left out, and the argument above holds unchanged.
//!
//! # Two queues: drops told apart by source
//!
//! A drop counted since a suspect's window began holds its report back (a
//! heartbeat may have been among what was dropped). With one queue for
//! everything, anyone who can send a datagram to the heartbeat port can
//! overflow it and keep a dead peer "maybe alive" for as long as the flood
//! lasts. So the shell may split the port in two ([`HeartbeatQueue`]): the
//! *members'* queue gets datagrams whose source address is one a member's
//! authenticated heartbeat came from (or one configured for it, or our
//! own: the barriers), the *strays'* queue everything else. Then:
//!
//! - a drop in the members' queue (or the interfaces') holds back every
//!   suspect, as before ([`Monitor::handle_drop_count`]);
//! - a drop in the strays' queue ([`Monitor::handle_stray_drop_count`])
//!   holds back only a suspect that is *unsorted*: one of its paths has not
//!   had a heartbeat out of the members' queue since its last one out of the
//!   strays' queue (or has had none at all). Such a suspect is also reported
//!   only when the strays' queue was empty as its round ended, since the
//!   barrier proves only the members' queue clear.
//!
//! Why a sorted suspect may ignore stray drops: its last heartbeat came out
//! of the members' queue, so its source address was steered there, and the
//! shell never takes an address out of the steering while it runs — its
//! later heartbeats, from the same address, cannot be in the strays' queue.
//! The assumption this adds: a member's heartbeats keep their source
//! address (they leave from a socket bound to its configured address).
//!
//! # Private queues: drops a spoofed flood cannot cause
//!
//! Steering is by source address, which a flood can forge: junk claiming a
//! member's address lands in the members' queue, overflows it, and with the
//! rules above holds back every report for as long as it lasts. So each
//! side also opens a *private* socket per peer and network, on a port of
//! its own choosing, connected to the peer's heartbeat address (the kernel
//! gives it only datagrams from that address and port, and answers any
//! other source as a closed port would), and tells the peer the port in its
//! authenticated heartbeats. The peer's heartbeats go there from then on
//! (and a copy to the public port now and then, for a restarted peer to
//! learn it anew). A forger must then guess the port as well as forge the
//! address: off the path, one port among tens of thousands, sprayed blind.
//!
//! A path whose heartbeat of its current epoch came out of its private
//! queue ([`HeartbeatQueue::Private`]) is *private*, until the epoch
//! changes, the shell says the socket was replaced
//! ([`Monitor::handle_private_reset`]) or the peer stopped counting its
//! private copy ([`Monitor::handle_private_uncommitted`]): its peer knows
//! the port, and the sender's fence counts only the private copy for it
//! (the shell passes `Private` only for a heartbeat whose sender says so:
//! a peer behind a relay that forwards the public port only never does),
//! so a live unfenced peer's heartbeats are in that queue. A
//! private suspect is held back only by a drop in its own private queue
//! ([`Monitor::handle_private_drop_count`]), by one at the interfaces or
//! the per-CPU backlogs every queue's packets pass
//! ([`Monitor::handle_system_drop_count`]), or by its private queue not
//! being empty as the round ends — not by the members' or the strays'
//! queues. The barriers then must not go through a queue a flood can
//! reach either: a shell with private queues sends them to a private
//! socket of its own, which proves the per-CPU backlogs clear, and reports
//! every queue's state as the round ends ([`Monitor::handle_barrier_queues`]):
//! the members' queue too must be empty for a suspect that is not private.

use std::collections::BTreeMap;
use std::collections::VecDeque;

use super::{DetectorConfig, DetectorMode};
use crate::ids::{Epoch, NodeId};
use crate::time::Time;

pub use super::monitor_types::{
    HeartbeatQueue, MonitorAction, MonitorStats, Pace, PathReport, QueueAtBarrier, QueuesAtBarrier,
    StraysAtBarrier, Watch,
};

#[derive(Clone, Debug)]
struct PathState {
    last_heard: Time,
    epoch: Epoch,
    down: bool,
    /// When it was reported down: only something heard after that brings
    /// it back (a stamp taken before the report is old news).
    down_at: Time,
    /// Which queue its heartbeats are in: where the latest came out of,
    /// except that `Private` stays for the epoch (see "Private queues").
    queue: HeartbeatQueue,
    /// The pace the peer's newest heartbeat here announced (newest by its
    /// sequence where the shell passes one: an overtaken heartbeat's pace
    /// is stale, see [`Monitor::handle_heartbeat_ordered`]).
    pace: Pace,
    /// The sequence of that heartbeat, when known.
    pace_seq: Option<u64>,
    /// We asked the (slow) peer for the busy pace then, and have heard
    /// nothing on the path since; its answer is due within the duration
    /// (`path_timeout`, or a crowded peer's window).
    asked: Option<(Time, std::time::Duration)>,
    /// Reported down without `failover` (the whole peer was silent), and
    /// no failover reported since.
    held: bool,
    /// Held, and another path of the peer was heard: failed over if still
    /// silent then (a copy of the same round may be just behind).
    failover_at: Option<Time>,
    /// Failed over by `PathFailover`: given up (`PathAbandon`) if still
    /// silent then.
    abandon_at: Option<Time>,
}

/// What a round may report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suspect {
    Path(Watch),
    Peer(NodeId),
}

#[derive(Clone, Debug)]
struct Round {
    token: u64,
    sent_at: Time,
    /// Suspects and the start of their window.
    suspects: Vec<(Suspect, Time)>,
}

/// The receiver side of the detector for one process.
#[derive(Clone, Debug)]
pub struct Monitor {
    config: DetectorConfig,
    paths: BTreeMap<Watch, PathState>,
    /// Peers reported dead, and when.
    dead: BTreeMap<NodeId, Time>,
    next_check: Time,
    round: Option<Round>,
    next_token: u64,
    /// Drop counters' last reading, and when they last grew.
    drops: Option<u64>,
    t_drop: Option<Time>,
    /// The same for the strays' queue.
    stray_drops: Option<u64>,
    t_stray_drop: Option<Time>,
    /// The same for the interfaces and backlogs alone (a shell with private
    /// queues reports them apart).
    system_drops: Option<u64>,
    t_system_drop: Option<Time>,
    /// The same per private queue.
    private_drops: BTreeMap<Watch, (u64, Option<Time>)>,
    /// When each network was last probed (see [`MonitorAction::ProbeNetwork`]).
    probed: BTreeMap<u16, Time>,
    actions: VecDeque<MonitorAction>,
    stats: MonitorStats,
}

impl Monitor {
    /// A monitor watching nothing yet.
    pub fn new(config: &DetectorConfig, now: Time) -> Self {
        Monitor {
            config: config.clone(),
            paths: BTreeMap::new(),
            dead: BTreeMap::new(),
            next_check: now + config.check_every,
            round: None,
            next_token: 1,
            drops: None,
            t_drop: None,
            stray_drops: None,
            t_stray_drop: None,
            system_drops: None,
            t_system_drop: None,
            private_drops: BTreeMap::new(),
            probed: BTreeMap::new(),
            actions: VecDeque::new(),
            stats: MonitorStats::default(),
        }
    }

    /// A heartbeat from `watch.peer` (incarnation `epoch`) arrived at `now`.
    /// Starts watching the path on first contact; a newer epoch starts
    /// afresh.
    pub fn handle_heartbeat(&mut self, now: Time, watch: Watch, epoch: Epoch) {
        self.handle_heartbeat_from(now, watch, epoch, HeartbeatQueue::Members);
    }

    /// [`Monitor::handle_heartbeat`] for a shell with two queues: which one
    /// the heartbeat came out of.
    pub fn handle_heartbeat_from(
        &mut self,
        now: Time,
        watch: Watch,
        epoch: Epoch,
        queue: HeartbeatQueue,
    ) {
        self.handle_heartbeat_paced(now, watch, epoch, queue, true);
    }

    /// [`Monitor::handle_heartbeat_from`] with the pace the heartbeat
    /// announced: `fast` when it said `FAST` (the path is then watched with
    /// `path_timeout`, else with `idle_path_timeout`).
    pub fn handle_heartbeat_paced(
        &mut self,
        now: Time,
        watch: Watch,
        epoch: Epoch,
        queue: HeartbeatQueue,
        fast: bool,
    ) {
        let pace = if fast { Pace::Busy } else { Pace::Idle };
        self.handle_heartbeat_at(now, watch, epoch, queue, pace);
    }

    /// [`Monitor::handle_heartbeat_from`] with the pace the heartbeat
    /// announced ([`Pace::of`] its flags). Without a sequence the latest
    /// arrival sets the pace: a shell whose heartbeats can overtake each
    /// other on one path uses [`Monitor::handle_heartbeat_ordered`].
    pub fn handle_heartbeat_at(
        &mut self,
        now: Time,
        watch: Watch,
        epoch: Epoch,
        queue: HeartbeatQueue,
        pace: Pace,
    ) {
        self.handle_heartbeat_seq(now, watch, epoch, queue, pace, None);
    }

    /// [`Monitor::handle_heartbeat_at`] for a heartbeat whose place in the
    /// sender's sequence (`seq`, within `epoch`) is known. It counts as
    /// heard whatever its place, but only the newest one sets the path's
    /// pace: a `FAST` heartbeat overtaken by the notice that the pair went
    /// quiet would otherwise leave the path watched with the busy window
    /// while only the idle pace (and data) arrives — a false path report.
    pub fn handle_heartbeat_ordered(
        &mut self,
        now: Time,
        watch: Watch,
        epoch: Epoch,
        queue: HeartbeatQueue,
        pace: Pace,
        seq: u64,
    ) {
        self.handle_heartbeat_seq(now, watch, epoch, queue, pace, Some(seq));
    }

    fn handle_heartbeat_seq(
        &mut self,
        now: Time,
        watch: Watch,
        epoch: Epoch,
        queue: HeartbeatQueue,
        pace: Pace,
        seq: Option<u64>,
    ) {
        let mut pace = pace;
        match self.paths.get_mut(&watch) {
            Some(p) if epoch < p.epoch => {}
            Some(p) => {
                // A new incarnation knows no private port of ours yet.
                let keep_private = p.queue == HeartbeatQueue::Private && p.epoch == epoch;
                let overtaken = p.epoch == epoch
                    && matches!((seq, p.pace_seq), (Some(s), Some(newest)) if s < newest);
                p.epoch = epoch;
                if !keep_private {
                    p.queue = queue;
                }
                if overtaken {
                    pace = p.pace;
                } else {
                    p.pace = pace;
                    p.pace_seq = seq;
                }
                self.heard(now, watch);
            }
            None => {
                self.paths.insert(
                    watch,
                    PathState {
                        last_heard: now,
                        epoch,
                        down: false,
                        down_at: Time::ZERO,
                        queue,
                        pace,
                        pace_seq: seq,
                        asked: None,
                        held: false,
                        failover_at: None,
                        abandon_at: None,
                    },
                );
                // A heartbeat on a new network is news of a dead peer too.
                self.heard(now, watch);
            }
        }
        // A narrower window may be due before the check planned.
        let window = self.window(pace).min(self.config.timeout);
        self.due_by(now + window);
        if pace.is_busy() {
            // The pace is the peer's, on every network: a path of it still
            // at the idle pace must carry its busy heartbeats from now on
            // (a network silent one way is found as fast as on a busy
            // path) — at a crowded peer's pace, within its window.
            let within = match pace {
                Pace::Crowded(shift) => self.config.crowd_path_timeout(shift),
                _ => self.config.path_timeout,
            };
            self.expect_busy(now, watch.peer, within);
        }
    }

    /// We asked `peer` for the busy pace at `now` (our heartbeats started
    /// saying `WATCH`: we have traffic in flight with it). Its paths that
    /// are at the idle pace are suspect if nothing arrives on them within
    /// `path_timeout` from now.
    pub fn handle_watch_sent(&mut self, now: Time, peer: NodeId) {
        self.expect_busy(now, peer, self.config.path_timeout);
    }

    /// [`Monitor::handle_watch_sent`] to a peer whose newest heartbeat
    /// asked for our busy copies at `crowd_shift` (it is crowded: see the
    /// Pacer's "A crowd of busy peers"): its answers come at that pace, so
    /// they are due within `crowd_path_timeout(crowd_shift)`, not
    /// `path_timeout` — a crowded server kicked by hundreds of asks at once
    /// answers them all in one round, which takes it a while.
    pub fn handle_watch_sent_crowded(&mut self, now: Time, peer: NodeId, crowd_shift: u8) {
        let within = if crowd_shift == 0 {
            self.config.path_timeout
        } else {
            self.config.crowd_path_timeout(crowd_shift)
        };
        self.expect_busy(now, peer, within);
    }

    /// Our ask of `peer` ended (nothing of ours waits for it any more): its
    /// paths are no longer expected at the busy pace for our sake. The ask
    /// may never have reached it — the heartbeat ending it can overtake
    /// the one that made it — so it owes no answer; each path keeps the
    /// window of the pace its own heartbeats announce.
    pub fn handle_watch_ended(&mut self, peer: NodeId) {
        for (_, p) in self.paths.range_mut(
            Watch { peer, network: 0 }..=Watch {
                peer,
                network: u16::MAX,
            },
        ) {
            p.asked = None;
        }
    }

    /// `peer`'s heartbeats come at the busy pace from `now` on every
    /// network (we asked, or one arrived): its paths still at the idle
    /// pace are suspect if nothing arrives on them `within`.
    fn expect_busy(&mut self, now: Time, peer: NodeId, within: std::time::Duration) {
        let mut any = false;
        for (_, p) in self.paths.range_mut(
            Watch { peer, network: 0 }..=Watch {
                peer,
                network: u16::MAX,
            },
        ) {
            if matches!(p.pace, Pace::Idle | Pace::Slow) && !p.down && p.asked.is_none() {
                p.asked = Some((now, within));
                any = true;
            }
        }
        if any {
            self.due_by(now + within);
        }
    }

    /// Held paths whose peer was heard elsewhere and that stayed silent
    /// since: failed over now. Failed-over paths silent for a peer window
    /// since: given up now.
    pub(super) fn fail_over_or_abandon_held(&mut self, now: Time) {
        let abandon_after = self.config.timeout;
        for (w, p) in self.paths.iter_mut() {
            if p.failover_at.is_some_and(|t| t <= now) {
                p.failover_at = None;
                if p.held && p.down {
                    p.held = false;
                    p.abandon_at = Some(now + abandon_after);
                    self.actions
                        .push_back(MonitorAction::Report(PathReport::PathFailover {
                            watch: *w,
                        }));
                }
            }
            if p.abandon_at.is_some_and(|t| t <= now) {
                p.abandon_at = None;
                if p.down {
                    self.stats.abandoned += 1;
                    self.actions
                        .push_back(MonitorAction::Report(PathReport::PathAbandon { watch: *w }));
                }
            }
        }
    }

    /// How much later than a path's last heartbeat another path must be
    /// heard to show that the peer sent something this path did not
    /// carry: two copies of one round arrive up to `max_network_delay`
    /// apart (and the sender hands them over a moment apart), so within
    /// that, a later arrival on the other path is the same round.
    fn failover_margin(&self) -> std::time::Duration {
        self.config.max_network_delay + self.config.interval / 2
    }

    /// The path window for a pace.
    fn window(&self, pace: Pace) -> std::time::Duration {
        match pace {
            Pace::Busy => self.config.path_timeout,
            Pace::Standby => self.config.standby_path_timeout(),
            Pace::Crowded(shift) => self.config.crowd_path_timeout(shift),
            Pace::Idle => self.config.idle_path_timeout,
            Pace::Slow => self.config.slow_path_timeout(),
        }
    }

    /// The dead window of a peer one of whose paths is at `pace`: the
    /// widest of its paths' wins.
    fn peer_window(&self, pace: Pace) -> std::time::Duration {
        match pace {
            Pace::Slow => self.config.slow_timeout(),
            _ => self.config.timeout,
        }
    }

    /// A window ends at `t`: check no later than just after it.
    fn due_by(&mut self, t: Time) {
        let t = t + std::time::Duration::from_micros(1);
        if t < self.next_check {
            self.next_check = t;
        }
    }

    /// Traffic other than a heartbeat arrived on a path (data and acks
    /// count as heartbeats; the shell reports only authenticated peers'
    /// traffic). Starts watching a path not watched yet: a peer that dies
    /// after its handshake but before its first heartbeat arrived must
    /// still be reported dead (members all run the detector, so a live
    /// one's heartbeats follow within an interval). The epoch is learnt
    /// from the first heartbeat.
    pub fn handle_heard(&mut self, now: Time, watch: Watch) {
        // Unsorted until a heartbeat says which queue its source reaches.
        // At the idle pace until a heartbeat says otherwise.
        let new = !self.paths.contains_key(&watch);
        self.paths.entry(watch).or_insert(PathState {
            last_heard: now,
            epoch: Epoch(0),
            down: false,
            down_at: Time::ZERO,
            queue: HeartbeatQueue::Strays,
            pace: Pace::Idle,
            pace_seq: None,
            asked: None,
            held: false,
            failover_at: None,
            abandon_at: None,
        });
        if new {
            self.due_by(now + self.config.idle_path_timeout);
        }
        self.heard(now, watch);
    }

    fn heard(&mut self, now: Time, watch: Watch) {
        let Some(p) = self.paths.get_mut(&watch) else {
            return;
        };
        if now > p.last_heard {
            p.last_heard = now;
        }
        if p.asked.is_some_and(|(t, _)| now >= t) {
            p.asked = None;
        }
        let pace = p.pace;
        let window = self.window(pace);
        let Some(p) = self.paths.get_mut(&watch) else {
            return;
        };
        if p.down && now > p.down_at {
            p.down = false;
            p.held = false;
            p.failover_at = None;
            p.abandon_at = None;
            // Watched again from now.
            let t = now + window.min(self.config.timeout);
            self.due_by(t);
            self.actions
                .push_back(MonitorAction::Report(PathReport::PathUp { watch }));
        }
        // The peer is alive: its paths that went silent with the rest of
        // it are failed over if they stay silent for the margin (a copy of
        // the round just heard may be right behind on them).
        let margin = self.failover_margin();
        let mut due = None;
        for (w, p) in self.paths.range_mut(
            Watch {
                peer: watch.peer,
                network: 0,
            }..=Watch {
                peer: watch.peer,
                network: u16::MAX,
            },
        ) {
            if *w != watch && p.held && p.down && p.failover_at.is_none() {
                p.failover_at = Some(now + margin);
                due = Some(now + margin);
            }
        }
        if let Some(t) = due {
            self.due_by(t);
        }
        if self.dead.get(&watch.peer).is_some_and(|at| now > *at) {
            self.dead.remove(&watch.peer);
            self.due_by(now + window.min(self.config.timeout));
            self.actions
                .push_back(MonitorAction::Report(PathReport::PeerUp {
                    peer: watch.peer,
                }));
        }
    }

    /// The paths of the suspects of the barrier round under way (a peer's:
    /// all of them): the ones whose connections the shell must look at as
    /// the round ends ([`QueuesAtBarrier::unread_streams`]).
    pub fn round_paths(&self) -> Vec<Watch> {
        let Some(r) = &self.round else {
            return Vec::new();
        };
        let mut out: Vec<Watch> = r
            .suspects
            .iter()
            .flat_map(|(s, _)| self.suspect_paths(*s).map(|(w, _)| w))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// When the suspect was last heard (for a peer: on any path).
    fn last_heard(&self, suspect: Suspect) -> Option<Time> {
        match suspect {
            Suspect::Path(w) => self.paths.get(&w).map(|p| p.last_heard),
            Suspect::Peer(peer) => self.peer_paths(peer).map(|(_, p)| p.last_heard).max(),
        }
    }

    /// The suspect's paths and the queue each one's heartbeats are in.
    fn suspect_paths(
        &self,
        suspect: Suspect,
    ) -> impl Iterator<Item = (Watch, HeartbeatQueue)> + '_ {
        let (lo, hi) = match suspect {
            Suspect::Path(w) => (w, w),
            Suspect::Peer(peer) => (
                Watch { peer, network: 0 },
                Watch {
                    peer,
                    network: u16::MAX,
                },
            ),
        };
        self.paths.range(lo..=hi).map(|(w, p)| (*w, p.queue))
    }

    fn reported(&self, suspect: Suspect) -> bool {
        match suspect {
            Suspect::Path(w) => self.paths.get(&w).is_some_and(|p| p.down),
            Suspect::Peer(peer) => self.dead.contains_key(&peer),
        }
    }

    fn peer_paths(&self, peer: NodeId) -> impl Iterator<Item = (&Watch, &PathState)> + '_ {
        self.paths.range(
            Watch { peer, network: 0 }..=Watch {
                peer,
                network: u16::MAX,
            },
        )
    }

    fn report(&mut self, now: Time, suspects: Vec<Suspect>) {
        for suspect in suspects {
            match suspect {
                Suspect::Path(watch) => {
                    let Some(last_heard) = self.paths.get(&watch).map(|p| p.last_heard) else {
                        continue;
                    };
                    let margin = self.failover_margin();
                    let failover = self
                        .peer_paths(watch.peer)
                        .any(|(w, p)| *w != watch && p.last_heard > last_heard + margin);
                    let Some(p) = self.paths.get_mut(&watch) else {
                        continue;
                    };
                    p.down = true;
                    p.down_at = now;
                    p.held = !failover;
                    p.abandon_at = None;
                    self.stats.reported_down += 1;
                    if !failover {
                        self.stats.held += 1;
                    }
                    self.actions
                        .push_back(MonitorAction::Report(PathReport::PathDown {
                            watch,
                            last_heard,
                            failover,
                        }));
                    let recently = self
                        .probed
                        .get(&watch.network)
                        .is_some_and(|t| now.saturating_since(*t) < self.config.idle_path_timeout);
                    if !recently {
                        self.probed.insert(watch.network, now);
                        self.actions.push_back(MonitorAction::ProbeNetwork {
                            network: watch.network,
                            except: watch.peer,
                        });
                    }
                }
                Suspect::Peer(peer) => {
                    if self.dead.insert(peer, now).is_none() {
                        self.stats.reported_dead += 1;
                        self.actions
                            .push_back(MonitorAction::Report(PathReport::PeerDown { peer }));
                    }
                }
            }
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

    /// Whether `peer` is currently reported dead.
    pub fn is_dead(&self, peer: NodeId) -> bool {
        self.dead.contains_key(&peer)
    }

    /// Every watched path, its last-heard time and whether it is down.
    pub fn watched(&self) -> impl Iterator<Item = (Watch, Time, bool)> + '_ {
        self.paths.iter().map(|(w, p)| (*w, p.last_heard, p.down))
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[path = "monitor_check.rs"]
mod check;
#[path = "monitor_round.rs"]
mod round;
#[cfg(test)]
#[path = "monitor_tests.rs"]
mod tests;
