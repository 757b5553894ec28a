//! Which peers get heartbeats at the busy pace, and what our heartbeats
//! say about the pace (the flags `FAST` and `WATCH`).
//!
//! Every peer gets the fence's heartbeat every `idle_interval` (the
//! [`super::Fence`] schedules those). On top of that, a peer is sent one
//! every `interval` while the pair is *busy*:
//!
//! - we wait for it: a call or message of ours has gone unanswered for
//!   `answer_grace` (see "Busy while unanswered"; without `answer_grace`,
//!   any call, message or reply within `busy_linger`,
//!   [`Pacer::handle_traffic`]), or a probe asked for an idle interval —
//!   then our heartbeats to it say `WATCH`, asking for its fast ones too;
//! - or it asked: its newest heartbeat said `WATCH`, within
//!   `idle_interval` ([`Pacer::handle_watch_ordered`]); a newer one
//!   without `WATCH` ends the ask at once.
//!
//! # Busy while unanswered
//!
//! A pair's own traffic is the best liveness signal it has: a reply or an
//! acknowledgement read from the peer shows the peer alive and a path
//! working, at no cost. So with `answer_grace` (the default: one
//! `interval`) the pace follows traffic *in flight*: a call or message
//! that goes out starts a wait ([`Pacer::handle_traffic`]), any data read
//! from the peer after it ends the wait ([`Pacer::handle_answer`]), and
//! only a wait longer than the grace makes the pair busy — until nothing
//! is waiting any more. A pair whose calls are answered within the grace
//! (a cache, a metadata lookup) sends the fence's heartbeats alone
//! however many calls it makes, unless they come so close together that
//! the pair is dense (below); a call that waits (a slow handler, a dead
//! path, a frozen peer) is watched at the busy pace from the end of its
//! grace. Replies ask for no answer (the caller waits for them, and its
//! ask covers the reply's path). The shell looks at sends and answers at
//! least once per `answer_grace` while something waits, so the ask goes
//! within the peer's grace and one `answer_grace` of the first unanswered
//! send: **the window for traffic in flight is `path_timeout` from the
//! ask, at most `2·answer_grace + path_timeout` (70 ms with a 10 ms grace)
//! after the send while the peer answers quickly, at most `answer_grace +
//! answer_grace_max + path_timeout` (260 ms) when its answers are slow
//! (next section); for a pair with
//! nothing in flight it is `idle_path_timeout` (1.2 s) for a path and
//! `timeout` (2 s) for the peer.** A path that dies while another path of
//! a sparse pair keeps answering is left to the session (its retransmission
//! timer turns the path suspect and re-sends on the answering one) and
//! to the idle window here.
//!
//! # A slow server is not asked
//!
//! The grace is per peer: `answer_grace`, or longer when the peer's
//! answers usually take longer — their smoothed time plus four times its
//! deviation (at least half an `answer_grace`), as TCP's retransmission
//! timeout (RFC 6298's gains), up to
//! `answer_grace_max` (default 200 ms). A sample is the time from
//! the earliest unanswered send to the first read after it
//! ([`Pacer::handle_answer`]), a wait past `answer_grace_max` counting as
//! that (one failover widens the grace for a few answers, not for long).
//! Why: with one fixed grace, a loaded server whose answers took a little
//! longer than it was asked by every waiting caller at once; its answers
//! to the asks (and the callers' own busy heartbeats) loaded it further,
//! answers took longer still, and 200 callers every 50 ms kept a server
//! capped at a quarter of a core at the busy pace for good — goodput
//! 430–1 400 of 4 000 calls/s, most of its CPU in heartbeats (2026-12-06,
//! docs/detector.md, "A slow server is not asked"). With the grace
//! following the answer time, a slow answer is a reason to wait, not to
//! watch; a wait well past the usual still asks. The cap is Linux's
//! minimum TCP retransmission timeout: with 50 ms (the path window) the
//! server still tipped over now and then once it was saturated and its
//! answers took longer than that. So the window for traffic in flight is
//! at most `answer_grace + answer_grace_max + path_timeout` (260 ms with
//! the defaults) after the send to a slow peer, and as before (70 ms)
//! while the peer answers quickly.
//!
//! # Dense pairs
//!
//! A pair whose calls, messages or replies go out less than
//! `path_timeout / 2` apart for `path_timeout` or longer — a stream, a
//! proxy's traffic to a node, and the replies to them —
//! has something in flight nearly all the time, and its answers say
//! nothing about the paths it does not use. Such a pair is busy for
//! `busy_linger` after each send ([`Pacer::handle_traffic`],
//! [`Pacer::handle_reply`]), on both sides, as every pair was before the
//! grace: its unused paths are on standby (below),
//! so when its data path dies the session fails over onto a path known to
//! work. (With faults every few seconds, a stream watched at the idle
//! pace failed over onto paths that had died unnoticed: the random-fault
//! soak's p99.9 went from 0.9 s to 1.5 s on one schedule.) A sparse
//! caller — a call every 50 ms or more, a burst now and then — keeps the
//! grace's savings: the pace it costs follows its waits alone. (Half a
//! window, so that calls every 50 ms, a common period, are sparse
//! whatever their jitter.)
//!
//! Every heartbeat sent at the busy pace says `FAST`, so the receiver knows
//! which window to watch the path with. When the pair goes quiet, two more
//! heartbeats go out at the busy pace without `FAST` before the pace drops
//! (the receiver widens its window on the first; two, so one lost datagram
//! does not leave it watching a slow path with a short window).
//!
//! A pair going busy — a grace ending, a probe, a first `WATCH` (or
//! without `answer_grace`, the first traffic after a quiet spell) — sends
//! the busy heartbeats at once instead of at the next tick; when it is
//! our ask, the monitor expects the peer's answer within `path_timeout`
//! ([`Pacer::take_asks`], [`super::Monitor::handle_watch_sent`]).
//!
//! # Data stands in for busy heartbeats
//!
//! A busy pair's data path carries data both ways, and the receiver
//! counts anything authentic it reads from a path as heard. So a busy
//! `FAST` copy to a path that carried data within `interval` is left out
//! ([`Pacer::admit_copy`]) — as long as it would say what the last copy
//! sent there said, and one went there within `idle_interval / 2` (the
//! peer's `WATCH` linger is `idle_interval`: it never lapses for want of a
//! heartbeat). A live path then goes at most about two intervals without
//! data or a heartbeat, well inside `path_timeout`. A path whose data
//! stopped arriving (a cut, a stuck transmit queue) is found as before: it
//! is silent. The two notices that the pair went quiet always go (data
//! says nothing of the pace), and the receiver takes a path's pace from
//! the newest heartbeat by sequence
//! ([`super::Monitor::handle_heartbeat_ordered`]): a `FAST` copy that
//! a notice overtook would otherwise leave it watching the path with the
//! busy window while only data at the idle pace comes.
//!
//! A busy pair's *other* paths — the session keeps a stream on one path
//! while it has room — carry nothing to stand in for heartbeats. While
//! another path of the pair carries data (either way), they are on
//! standby: their copies say `STANDBY` and go every `standby_interval()`
//! (the receiver watches them with `standby_path_timeout()`), after two at
//! the busy pace so one lost copy does not leave the receiver with the
//! short window. When data moves onto a standby path its next copy drops
//! `STANDBY` (a change of flags always goes at once), and its data is
//! heard from the first frame. A busy pair none of whose paths carries
//! data (a call waiting on a slow handler, a peer's `WATCH` alone) keeps
//! the busy pace on every path, as before: whichever path the reply
//! takes is watched with the short window. What the receiver must add (see [`super::Monitor`], "Data
//! as heartbeats"): a barrier round also checks that the suspect path's
//! connections hold no unread bytes, since a stalled connection reader
//! would otherwise read as silence.
//!
//! The fence's copies and greetings are never left out — but see "Slow
//! pairs".
//!
//! # Slow pairs
//!
//! With `slow_after` (on by default), a pair with no traffic of ours for
//! that long — no call, message or reply to the peer (with
//! `answer_grace`, replies count since 2026-12-06, see
//! [`Pacer::handle_reply`]), nothing waiting for an answer, not busy, not
//! asked by the peer — is *slow*: our fence heartbeats to it say `SLOW`,
//! and once two rounds have said so it gets only the *full* rounds, one in
//! `slow_factor` ([`Pacer::fence_copy`], [`super::Fence::is_full`]). The
//! peer's monitor, seeing `SLOW` on a path's newest heartbeat, watches the
//! path with `slow_path_timeout()` and the peer with `slow_timeout()`,
//! which covers a full round's schedule as `timeout` covers every round's.
//! Traffic of ours or the peer's `WATCH` ends it at once: the next copy
//! has no `SLOW`, and every round goes again. Reads do not count (the
//! session's keepalives are reads, and would end it every few seconds): a
//! peer that calls us asks (`WATCH`) when our answers are slow, and a
//! peer whose calls we answer in time has its answers as proof that we
//! live. So the peer is never left with the narrow window
//! while we skip rounds: every copy we send while skipping says `SLOW`,
//! and we skip only after two rounds announced it. What it costs: a slow
//! pair's dead bound is `slow_timeout()` (3.2 s with the defaults and a
//! factor of 4), its path bound `slow_path_timeout()` (4.8 s); a call on
//! it gets the usual ask and busy windows from its first send.
//!
//! # A crowd of busy peers
//!
//! Every busy peer costs `1 / interval` heartbeats a second each way on
//! each network: a server that 500 callers wait on owed them 100 000 a
//! second and received as many, and a quarter-core server capped that
//! way answered 12 calls a second (`bench helpers --clients 500`,
//! 2026-12-07). With `crowd_budget` (default 2 000 a second) a process
//! with more busy peers than `crowd_budget × interval` stretches its busy
//! pace to `interval × 2^shift` for all of them, says so in its copies
//! (the receiver widens the path's window to `crowd_path_timeout(shift)`
//! before the gaps grow), and asks its peers for the same in every
//! heartbeat, so what it receives is bounded too (`crowd.rs` has the
//! rules). Paths of a crowded server are then found silent within about
//! three of its stretched intervals (at most `crowd_path_timeout` of the
//! largest shift, 990 ms with the defaults, still inside the idle
//! window), and the session's own retransmission timer keeps moving
//! data off a dead path as before; dead reports do not change.
//!
//! What it does not do: send anything. The pace is per peer; the shell
//! sends on every network, and asks per copy whether a busy one may be
//! left out.

use std::collections::BTreeMap;
use std::time::Duration;

use super::crowd::{Crowd, PeerShift};
use super::datagram::{ask_shift, FLAG_FAST, FLAG_SLOW, FLAG_STANDBY, FLAG_WATCH};
use super::DetectorConfig;
use crate::ids::{Epoch, NodeId};
use crate::time::Time;

/// Heartbeats at the busy pace (or the last ones of it) that go out
/// without `FAST` when a pair goes quiet; also the copies that announce
/// a slower pace before it is taken (standby, slow, crowded).
pub(super) const NOTICES: u8 = 2;

#[derive(Clone, Copy, Debug, Default)]
struct PeerPace {
    /// A probe (or, without `answer_grace`, our traffic) keeps the pair
    /// busy until then.
    busy_until: Option<Time>,
    /// The peer's `WATCH` keeps it busy until then.
    watched_until: Option<Time>,
    /// The newest of its heartbeats that set or cleared `watched_until`
    /// (heartbeats on two networks overtake each other: an older one
    /// saying nothing of `WATCH` must not end a newer one's).
    watch_order: Option<(Epoch, u64)>,
    /// With `answer_grace`: our latest call or message to the peer, the
    /// latest data read from it, and the earliest send not answered yet
    /// as far as we know (see "Busy while unanswered").
    sent: Option<Time>,
    answered: Option<Time>,
    pending: Option<Time>,
    /// With `answer_grace`: our latest call, message or reply to the
    /// peer, and the first of the current run of them, each within
    /// `path_timeout / 2` of the one before ("Dense pairs").
    last: Option<Time>,
    run_start: Option<Time>,
    /// Our last busy round to it said `WATCH`.
    asking: bool,
    /// Our heartbeats to it currently say `FAST`.
    fast: bool,
    /// Busy-pace heartbeats without `FAST` still to send.
    notices: u8,
    /// A kick is pending: send at once.
    kicked: bool,
    /// The pace of our busy copies when we or it are crowded.
    shift: PeerShift,
}

/// When a path (peer, network) carried data, as the shell saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathUse {
    /// Our last write of data to the path's connection.
    pub wrote: Option<Time>,
    /// Our last write to it or read from it.
    pub used: Option<Time>,
    /// The same for any path of the peer (this one included).
    pub pair_used: Option<Time>,
}

/// What was last sent on one path (peer, network).
#[derive(Clone, Copy, Debug)]
struct PathPace {
    flags: u16,
    sent: Time,
    /// Copies in a row with these flags.
    repeats: u8,
}

impl PeerPace {
    /// Busy: a probe (or the linger) holds, or a send of ours has waited
    /// its grace for an answer — or, once we asked, anything still waits
    /// (a pair answering slowly does not switch pace at every answer).
    fn busy(&self, now: Time, grace: Option<Duration>) -> bool {
        self.busy_until.is_some_and(|t| now < t)
            || grace.is_some_and(|g| self.pending.is_some_and(|s| self.asking || now >= s + g))
    }

    fn watched(&self, now: Time) -> bool {
        self.watched_until.is_some_and(|t| now < t)
    }
}

/// `answer_grace` and `answer_grace_max`, when the pace follows answers.
type Grace = Option<(Duration, Duration)>;

/// How long a peer's answers usually take ("A slow server is not asked").
#[derive(Clone, Copy, Debug)]
struct AnswerTime {
    /// Smoothed time from a send to the first read after it.
    srtt: Duration,
    /// Its mean deviation.
    rttvar: Duration,
}

impl AnswerTime {
    /// An answer came `sample` after the send it answers: the smoothed
    /// time and deviation move an eighth and a quarter of the way
    /// (RFC 6298's gains). A wait longer than `max` counts as `max`: one
    /// failover does not widen the grace for long.
    fn sample(t: Option<Self>, sample: Duration, max: Duration) -> Self {
        let sample = sample.min(max);
        match t {
            None => AnswerTime {
                srtt: sample,
                rttvar: sample / 2,
            },
            Some(t) => {
                let dev = t.srtt.abs_diff(sample);
                AnswerTime {
                    srtt: t.srtt * 7 / 8 + sample / 8,
                    rttvar: t.rttvar * 3 / 4 + dev / 4,
                }
            }
        }
    }
}

/// `peer`'s grace: `answer_grace`, or its answers' usual time when that
/// is longer — the smoothed time plus four deviations, at least half an
/// `answer_grace` above it (RFC 6298's `SRTT + max(G, 4·RTTVAR)`: answers
/// that always take 20 ms leave no deviation) — up to `answer_grace_max`.
/// `None` without `answer_grace`.
fn grace_of(g: Grace, usual: &BTreeMap<NodeId, AnswerTime>, peer: NodeId) -> Option<Duration> {
    let (base, max) = g?;
    let u = usual
        .get(&peer)
        .map_or(Duration::ZERO, |t| t.srtt + (t.rttvar * 4).max(base / 2));
    Some(u.min(max).max(base))
}

/// The pace of every peer of one process.
#[derive(Clone, Debug)]
pub struct Pacer {
    interval: Duration,
    /// `DetectorConfig::data_as_heartbeat`.
    data: bool,
    linger: Duration,
    /// `DetectorConfig::answer_grace` and `answer_grace_max`.
    grace: Grace,
    /// Per peer that answered a send of ours: how long its answers take
    /// (kept while the peer is, unlike `peers`' quiet entries).
    usual: BTreeMap<NodeId, AnswerTime>,
    /// With `answer_grace`: sends closer than `dense / 2` make a run, and
    /// a run this long makes the pair dense (`path_timeout`; "Dense
    /// pairs").
    dense: Duration,
    watch_linger: Duration,
    /// How long a probe asks (`idle_interval`; see [`Pacer::handle_probe`]).
    probe: Duration,
    peers: BTreeMap<NodeId, PeerPace>,
    /// The last copy sent per path (see "Data stands in for busy
    /// heartbeats").
    paths: BTreeMap<(NodeId, u16), PathPace>,
    /// A busy copy still goes out this often on a path carrying data.
    refresh: Duration,
    standby: Duration,
    /// The next busy-pace round (`None`: no peer is busy).
    next_round: Option<Time>,
    kicks: usize,
    /// Peers whose `WATCH` the last rounds started (see [`Pacer::take_asks`]).
    asks: Vec<NodeId>,
    /// Peers whose `WATCH` the last rounds ended ([`Pacer::take_ask_ends`]).
    ask_ends: Vec<NodeId>,
    /// `DetectorConfig::slow_after` (see "Slow pairs").
    slow_after: Option<Duration>,
    /// Per peer: since when it has been quiet, and fence rounds that said
    /// `SLOW` in a row.
    slow: BTreeMap<NodeId, SlowPace>,
    /// `DetectorConfig::crowd_budget` (see "A crowd of busy peers").
    crowd: Option<Crowd>,
}

#[derive(Clone, Copy, Debug)]
struct SlowPace {
    since: Time,
    announced: u8,
}

impl Pacer {
    /// No peer busy yet.
    pub fn new(config: &DetectorConfig) -> Self {
        Pacer {
            interval: config.interval,
            data: config.data_as_heartbeat,
            linger: config.busy_linger,
            grace: config
                .answer_grace
                .map(|g| (g, config.answer_grace_max.max(g))),
            usual: BTreeMap::new(),
            dense: config.path_timeout,
            watch_linger: config.idle_interval,
            probe: config.idle_interval,
            peers: BTreeMap::new(),
            paths: BTreeMap::new(),
            refresh: config.idle_interval / 2,
            standby: config.standby_interval(),
            next_round: None,
            kicks: 0,
            asks: Vec::new(),
            ask_ends: Vec::new(),
            slow_after: config.slow_after,
            slow: BTreeMap::new(),
            crowd: Crowd::new(config),
        }
    }

    /// Our crowd shift: busy copies go every `interval × 2^shift` (0: not
    /// crowded, or no budget; see "A crowd of busy peers").
    pub fn crowd_shift(&self) -> u8 {
        self.crowd.as_ref().map_or(0, Crowd::own)
    }

    /// The crowd shift `peer`'s newest heartbeat asked of us (0: none): its
    /// answers to our asks come at that pace
    /// ([`super::Monitor::handle_watch_sent_crowded`]).
    pub fn peer_crowd_shift(&self, peer: NodeId) -> u8 {
        self.crowd.as_ref().map_or(0, |c| c.ask_of(peer))
    }

    /// The pace and ask shifts of a copy to a peer (`shift` with `FAST`).
    fn crowd_flags(&self, shift: u8) -> u16 {
        self.crowd.as_ref().map_or(0, |c| c.flags(shift))
    }

    /// We had traffic with `peer` at `now` (a call, a one-way message or,
    /// without `answer_grace`, a reply went to it). Returns whether that
    /// is a kick: the pair was quiet, so the shell should wake its sender
    /// now. With `answer_grace` the send starts the grace (see "Busy
    /// while unanswered"; [`Pacer::poll_timeout`] says when it ends), and
    /// is a kick only when it makes the pair dense ("Dense pairs").
    pub fn handle_traffic(&mut self, now: Time, peer: NodeId) -> bool {
        self.touch(now, peer);
        if self.grace.is_none() {
            return self.busy_for(now, peer, self.linger);
        }
        let p = self.peers.entry(peer).or_default();
        p.sent = p.sent.max(Some(now));
        if p.pending.is_none() && p.answered.is_none_or(|a| now > a) {
            // The first send we know of since the last answer.
            p.pending = Some(now);
        }
        self.dense_traffic(now, peer)
    }

    /// A reply went to `peer` at `now`. Without `answer_grace` it is
    /// traffic like a call ([`Pacer::handle_traffic`]); with it, it asks
    /// for no answer (the caller waits for it, and its ask covers the
    /// reply's path) and counts only towards a dense pair ("Dense
    /// pairs"), so a dense pair is busy on both sides, as with the
    /// linger. Returns whether that is a kick.
    pub fn handle_reply(&mut self, now: Time, peer: NodeId) -> bool {
        if self.grace.is_none() {
            return self.handle_traffic(now, peer);
        }
        self.touch(now, peer);
        self.dense_traffic(now, peer)
    }

    /// Traffic of ours at `now` (with `answer_grace`): extends or starts
    /// the pair's run, and keeps a dense one busy for the linger. Returns
    /// whether that is a kick.
    fn dense_traffic(&mut self, now: Time, peer: NodeId) -> bool {
        let dense = self.dense;
        let p = self.peers.entry(peer).or_default();
        if p.last.is_none_or(|s| now >= s + dense / 2) {
            p.run_start = Some(now);
        }
        p.last = p.last.max(Some(now));
        if p.run_start.is_some_and(|s| now >= s + dense) {
            // Traffic nearly all the time: the linger's pace, standby
            // paths included (see "Dense pairs").
            return self.busy_for(now, peer, self.linger);
        }
        false
    }

    /// Data from `peer` was read at `at` (its latest read, any path): an
    /// answer to every send of ours before it. Only with `answer_grace`.
    /// (Reads do not end a slow pace: the session's keepalives are reads
    /// too; see "Slow pairs".)
    pub fn handle_answer(&mut self, at: Time, peer: NodeId) {
        if self.grace.is_none() {
            return;
        }
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.answered.is_some_and(|a| a >= at) {
            return;
        }
        p.answered = Some(at);
        if let Some(s) = p.pending.filter(|s| at >= *s) {
            if let Some((_, max)) = self.grace {
                let t =
                    AnswerTime::sample(self.usual.get(&peer).copied(), at.saturating_since(s), max);
                self.usual.insert(peer, t);
            }
            // What we sent after it waits still; we know only the latest
            // send's time (a later start of the grace, never an earlier one).
            p.pending = p.sent.filter(|s| *s > at);
        }
    }

    /// Traffic with `peer` at `at`: not slow (see "Slow pairs").
    fn touch(&mut self, at: Time, peer: NodeId) {
        if self.slow_after.is_none() {
            return;
        }
        let s = self.slow.entry(peer).or_insert(SlowPace {
            since: at,
            announced: 0,
        });
        // The shell passes the latest read again at every look: only a
        // newer one is traffic.
        if at > s.since {
            s.since = at;
            s.announced = 0;
        }
    }

    /// A fence round goes out at `now`; `full` when it is one that goes to
    /// every peer ([`super::Fence::is_full`]). Returns the flags for
    /// `peer`'s copies, or `None` to leave the peer out: it is slow, and
    /// two rounds have said so (see "Slow pairs"). Call once per peer and
    /// round.
    pub fn fence_copy(&mut self, now: Time, peer: NodeId, full: bool) -> Option<u16> {
        let flags = self.flags(now, peer) & !FLAG_SLOW;
        let Some(after) = self.slow_after else {
            return Some(flags);
        };
        let grace = grace_of(self.grace, &self.usual, peer);
        let active = self.peers.get(&peer).is_some_and(|p| {
            p.fast || p.notices > 0 || p.busy(now, grace) || p.watched(now) || p.pending.is_some()
        });
        let s = self.slow.entry(peer).or_insert(SlowPace {
            since: now,
            announced: 0,
        });
        if active || now < s.since + after {
            if active {
                s.since = s.since.max(now);
            }
            s.announced = 0;
            return Some(flags);
        }
        if s.announced < NOTICES {
            s.announced += 1;
            return Some(flags | FLAG_SLOW);
        }
        full.then_some(flags | FLAG_SLOW)
    }

    /// Peers whose `WATCH` the rounds since the last call started (our
    /// heartbeats to them now ask for the busy pace): the shell tells the
    /// monitor ([`super::Monitor::handle_watch_sent`]).
    pub fn take_asks(&mut self, out: &mut Vec<NodeId>) {
        out.append(&mut self.asks);
    }

    /// Peers whose `WATCH` the rounds since the last call ended (nothing
    /// of ours waits for them any more): the shell tells the monitor
    /// ([`super::Monitor::handle_watch_ended`]), which stops expecting
    /// their busy pace — the peer may never have seen the ask (its end
    /// overtook it), so it owes no answer.
    pub fn take_ask_ends(&mut self, out: &mut Vec<NodeId>) {
        out.append(&mut self.ask_ends);
    }

    /// Keeps the pair busy until `now + d` at least; a kick if it was not.
    fn busy_for(&mut self, now: Time, peer: NodeId, d: Duration) -> bool {
        let grace = grace_of(self.grace, &self.usual, peer);
        let p = self.peers.entry(peer).or_default();
        let was = p.busy(now, grace);
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
    /// with it was reported down): the busy pace and `WATCH` for an idle
    /// interval. Not shorter: the monitor expects the answer on every
    /// network within `path_timeout` of the ask and forgets that when the
    /// ask ends ([`super::Monitor::handle_watch_ended`]), so an ask that
    /// ended at `path_timeout` raced the check that would find a path
    /// silent — on a loaded host the end won in two rounds of five and
    /// the silent path was found only in its idle window (`role_netns`).
    /// Returns whether that is a kick.
    pub fn handle_probe(&mut self, now: Time, peer: NodeId) -> bool {
        self.busy_for(now, peer, self.probe)
    }

    /// An authentic heartbeat of `peer` arrived at `now`, saying `WATCH`
    /// or not. Returns whether that is a kick (it asked and we were slow).
    /// A heartbeat without `WATCH` says nothing of the peer's wish; see
    /// [`Pacer::handle_watch_ordered`].
    pub fn handle_watch(&mut self, now: Time, peer: NodeId, watch: bool) -> bool {
        if !watch {
            return false;
        }
        self.watch(now, peer)
    }

    /// [`Pacer::handle_watch`] for a heartbeat whose place in the peer's
    /// sequence is known (`epoch`, `seq`, as the shell checked them): one
    /// without `WATCH` newer than the last that said it ends the peer's
    /// ask at once — it went quiet — instead of an idle interval later.
    /// Older ones (overtaken on another network) are ignored.
    pub fn handle_watch_ordered(
        &mut self,
        now: Time,
        peer: NodeId,
        watch: bool,
        epoch: Epoch,
        seq: u64,
    ) -> bool {
        let order = (epoch, seq);
        let p = self.peers.entry(peer).or_default();
        if p.watch_order.is_some_and(|o| o >= order) {
            return false;
        }
        p.watch_order = Some(order);
        if !watch {
            // Only a pace that follows answers ends asks early (with the
            // linger, a peer's ask lasts its idle interval, as before).
            if self.grace.is_some() {
                p.watched_until = None;
            }
            return false;
        }
        self.watch(now, peer)
    }

    /// An authentic heartbeat of `peer` with `flags`, at its place in the
    /// peer's sequence: its `WATCH` ([`Pacer::handle_watch_ordered`]) and
    /// its crowd ask ("A crowd of busy peers"; the newest counts). Returns
    /// whether that is a kick.
    pub fn handle_flags_ordered(
        &mut self,
        now: Time,
        peer: NodeId,
        flags: u16,
        epoch: Epoch,
        seq: u64,
    ) -> bool {
        if let Some(c) = &mut self.crowd {
            c.handle_ask(peer, ask_shift(flags), (epoch, seq));
        }
        self.handle_watch_ordered(now, peer, flags & FLAG_WATCH != 0, epoch, seq)
    }

    fn watch(&mut self, now: Time, peer: NodeId) -> bool {
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
            return self.slow_flag(peer) | self.crowd_flags(0);
        };
        let mut f = 0;
        if p.fast {
            f |= FLAG_FAST | self.crowd_flags(p.shift.announced());
        } else {
            f |= self.crowd_flags(0);
        }
        if p.busy(now, grace_of(self.grace, &self.usual, peer)) {
            f |= FLAG_WATCH;
        }
        f | self.slow_flag(peer)
    }

    /// `SLOW` while our fence rounds to `peer` say it (every copy of ours
    /// must, or the peer narrows its window while we skip rounds).
    fn slow_flag(&self, peer: NodeId) -> u16 {
        if self.slow.get(&peer).is_some_and(|s| s.announced > 0) {
            FLAG_SLOW
        } else {
            0
        }
    }

    /// A copy of a heartbeat to `peer` on `network` is about to go out at
    /// `now` with `flags` (the final ones, handshake flags included);
    /// `busy` when it is a busy-pace copy (not the fence's, not a
    /// greeting), and `usage` when the path and the pair carried data.
    /// Returns the flags to send it with (`STANDBY` added to a `FAST` copy
    /// on a path that carried no data either way within `standby_interval()`
    /// while another path of the pair did), or `None` to leave it out: a
    /// busy copy whose flags repeat the last one's there, when we wrote
    /// data to the path within `interval` and a copy went within
    /// `idle_interval / 2`, or when the path is on standby, two copies said
    /// so, and one went within `standby_interval()`. A copy sent is
    /// remembered.
    pub fn admit_copy(
        &mut self,
        now: Time,
        peer: NodeId,
        network: u16,
        flags: u16,
        busy: bool,
        usage: PathUse,
    ) -> Option<u16> {
        let recent = |t: Option<Time>| t.is_some_and(|t| t + self.standby >= now);
        let standby =
            self.data && flags & FLAG_FAST != 0 && !recent(usage.used) && recent(usage.pair_used);
        let carried = usage.wrote;
        let flags = if standby { flags | FLAG_STANDBY } else { flags };
        let last = self
            .paths
            .get(&(peer, network))
            .filter(|l| l.flags == flags);
        let skip = self.data
            && busy
            && last.is_some_and(|l| {
                if standby {
                    l.repeats >= NOTICES && l.sent + self.standby > now
                } else {
                    // Data stands in for `FAST` copies only: a notice that
                    // the pair went quiet goes in both copies (data does
                    // not say the pace changed).
                    flags & FLAG_FAST != 0
                        && carried.is_some_and(|t| t + self.interval >= now)
                        && l.sent + self.refresh > now
                }
            });
        if skip {
            return None;
        }
        let repeats = last.map_or(1, |l| l.repeats.saturating_add(1));
        self.paths.insert(
            (peer, network),
            PathPace {
                flags,
                sent: now,
                repeats,
            },
        );
        Some(flags)
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
        let due = self.kicks > 0
            || self.next_round.is_some_and(|t| now >= t)
            || self.grace_ends().is_some_and(|t| now >= t);
        if !due {
            return false;
        }
        self.kicks = 0;
        let mut more = false;
        let (grace, usual) = (self.grace, &self.usual);
        let asks = &mut self.asks;
        let ask_ends = &mut self.ask_ends;
        let slow = &mut self.slow;
        let crowd = self.crowd.as_ref();
        self.peers.retain(|peer, p| {
            let kicked = std::mem::take(&mut p.kicked);
            let busy = p.busy(now, grace_of(grace, usual, *peer));
            let ask_starts = busy && !p.asking;
            if ask_starts {
                asks.push(*peer);
            } else if !busy && p.asking {
                ask_ends.push(*peer);
            }
            p.asking = busy;
            let fast = busy || p.watched(now);
            if let Some(c) = crowd.filter(|_| fast || p.notices > 0) {
                // A crowded pace: a copy only when this peer's is due (at
                // once when the pair just went busy or asked).
                let urgent = kicked || ask_starts || (fast && !p.fast);
                if !p.shift.due(c, now, c.target(*peer), urgent) {
                    more = true;
                    return true;
                }
                p.shift.sent(now);
            }
            let shifts = |shift| crowd.map_or(0, |c| c.flags(shift));
            if fast {
                p.fast = true;
                p.notices = NOTICES;
                let watch = if busy { FLAG_WATCH } else { 0 };
                out.push((*peer, FLAG_FAST | watch | shifts(p.shift.announced())));
                more = true;
            } else if p.notices > 0 {
                p.fast = false;
                p.notices -= 1;
                out.push((*peer, shifts(0)));
                more = true;
            } else {
                p.fast = false;
            }
            if p.fast || out.last().is_some_and(|(o, _)| o == peer) {
                // These copies do not say SLOW: every fence round goes
                // again, and two must say SLOW before one is skipped (see
                // "Slow pairs").
                if let Some(s) = slow.get_mut(peer) {
                    s.since = s.since.max(now);
                    s.announced = 0;
                }
            }
            // Nothing to remember about a quiet peer (its watch order
            // aside, while it watches, and what waits for an answer).
            p.fast
                || p.notices > 0
                || p.busy_until.is_some_and(|t| now < t)
                || p.pending.is_some()
                || p.watched(now)
        });
        self.next_round = more.then(|| now + self.interval);
        if let Some(c) = &mut self.crowd {
            c.handle_fast_peers(self.peers.values().filter(|p| p.fast).count());
        }
        true
    }

    /// When [`Pacer::poll_round`] is due next (`None`: no busy peer).
    pub fn poll_timeout(&self, now: Time) -> Option<Time> {
        if self.kicks > 0 {
            return Some(now);
        }
        match (self.next_round, self.grace_ends()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest end of a grace not yet acted on: a round is due then
    /// (a peer already asked is in the rounds).
    fn grace_ends(&self) -> Option<Time> {
        self.peers
            .iter()
            .filter(|(_, p)| !p.asking)
            .filter_map(|(peer, p)| Some(p.pending? + grace_of(self.grace, &self.usual, *peer)?))
            .min()
    }

    /// Whether some send of ours waits for an answer (the shell then looks
    /// at its traffic and answers again within the grace).
    pub fn awaits_answers(&self) -> bool {
        self.grace.is_some() && self.peers.values().any(|p| p.pending.is_some())
    }

    /// The peer left: no busy pace for it.
    pub fn forget(&mut self, peer: NodeId) {
        self.paths.retain(|(p, _), _| *p != peer);
        self.usual.remove(&peer);
        self.slow.remove(&peer);
        if let Some(c) = &mut self.crowd {
            c.forget(peer);
        }
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
#[path = "pace_tests.rs"]
mod tests;
