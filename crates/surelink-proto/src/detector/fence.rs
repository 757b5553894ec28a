//! The SafeTimer sender fence (paper Fig. 3).
//!
//! `t_valid` says until when this process may let frames out. It starts at
//! the first heartbeat's deadline and each heartbeat that left the host in
//! time moves it to the next heartbeat's deadline. A heartbeat that missed
//! its deadline fences the process for good, even if a later one leaves in
//! time, because a receiver may already have counted the gap (see the
//! module docs of [`crate::detector`]).
//!
//! One addition to the paper: heartbeat `j` leaving at `T` also *covers*
//! every earlier heartbeat `k < j` whose deadline is at or after `T`. The
//! receiver's argument needs only that something sent no earlier than
//! `scheduled(k)` leaves by `deadline(k)`; `j` is scheduled after `k`, so
//! it lands in the same window. So a heartbeat whose every send failed
//! (both interfaces down for a moment) does not fence the process when a
//! later one gets out within the slack — without it, a 10 ms outage of
//! every link would end every session a slack later.
//! And a heartbeat whose copies all went out unconfirmed is sent again
//! every `slack / 30` until one is confirmed or its deadline passes
//! ([`Fence::handle_unconfirmed`]): outages of every link chained with
//! short gaps otherwise caught each round of the idle pace and fenced a
//! live process, though a copy in any gap would have covered them.
//!
//! A second: a fence made for the incarnation that follows a fence
//! ([`Fence::unarmed`]) has no deadline until one of its heartbeats or
//! data frames ([`Fence::admit_frame`]) has left the host. Before that,
//! nobody can have heard that incarnation, so nobody
//! can count a gap in it; without this, a process cut off from every link
//! would fence again every slack for as long as the outage lasts (a new
//! epoch each time), instead of once. A third: with slow pairs
//! (`DetectorConfig::slow_after`) only one round in `slow_factor` is
//! *full* — it goes to every peer — and the others skip the slow ones. A
//! round covers an earlier one only if it went to everyone that one went
//! to: a full round covers any, a partial one only partial ones ([`Fence::is_full`]).
//! "Left" means confirmed by its TX
//! timestamp or, when none comes back, handed to the kernel
//! ([`Fence::handle_handed`]): a heartbeat peers may hear arms the fence
//! either way.

use std::time::Duration;

use super::DetectorConfig;
use crate::time::Time;

/// A heartbeat to send now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatDue {
    /// Its number in the schedule.
    pub seq: u64,
    /// It counts only if it leaves the host by this time.
    pub deadline: Time,
}

/// Whether frames may leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceState {
    /// Frames may leave until `t_valid`.
    Valid {
        /// The current `t_valid`.
        t_valid: Time,
    },
    /// A heartbeat missed its deadline: nothing leaves any more (until the
    /// process starts a new epoch).
    Fenced {
        /// The `t_valid` that ran out: nothing generated after it left.
        at: Time,
        /// The heartbeat that was late or never sent.
        missed_seq: u64,
    },
}

/// The sender side of SafeTimer for one process.
#[derive(Clone, Debug)]
pub struct Fence {
    origin: Time,
    interval: Duration,
    slack: Duration,
    /// Next heartbeat to hand out.
    next_seq: u64,
    /// Every heartbeat below this left in time, or a later one left by
    /// its deadline.
    confirmed: u64,
    fenced: Option<(Time, u64)>,
    /// Deadlines apply (see the module docs on [`Fence::unarmed`]).
    armed: bool,
    /// One round in this many is full (see the module docs).
    full_every: u64,
    /// The first round handed out full and not confirmed yet: every round
    /// from it on is full until one is confirmed.
    full_pending: Option<u64>,
    /// When the last heartbeat was handed out (its copies may be on their
    /// way while the sender has not reported it yet).
    last_handout: Option<Time>,
    /// An unconfirmed heartbeat to send again, and when (see
    /// [`Fence::handle_unconfirmed`]).
    retry: Option<(u64, Time)>,
}

impl Fence {
    /// A fence whose schedule starts at `now` (heartbeat 0 is due at once).
    pub fn new(config: &DetectorConfig, now: Time) -> Self {
        Fence {
            origin: now,
            // The fence's heartbeats go to every peer at the idle pace; the
            // busy pace's extra ones are not the fence's.
            interval: config.idle_interval,
            slack: config.send_slack,
            next_seq: 0,
            confirmed: 0,
            fenced: None,
            armed: true,
            full_every: u64::from(config.slow_rounds()),
            full_pending: None,
            last_handout: None,
            retry: None,
        }
    }

    /// Whether round `seq` goes to every peer, slow ones included: one in
    /// `slow_factor`, and every round after a full one not yet confirmed.
    /// Without the second rule one unconfirmed full round fenced the
    /// process (no partial round covers it, and the next full one is due
    /// after its deadline): a 500-client start fenced a server 14 times
    /// where every round full fenced it once.
    pub fn is_full(&self, seq: u64) -> bool {
        seq % self.full_every.max(1) == 0 || self.full_pending.is_some_and(|s| seq >= s)
    }

    /// Every heartbeat below `c` is confirmed (or covered).
    fn set_confirmed(&mut self, c: u64) {
        self.confirmed = c;
        if self.full_pending.is_some_and(|s| s < c) {
            self.full_pending = None;
        }
    }

    /// `seq` is handed out at `now`.
    fn hand_out(&mut self, seq: u64, now: Time) {
        self.next_seq = seq + 1;
        self.last_handout = Some(now);
        if self.full_pending.is_none() && self.is_full(seq) {
            self.full_pending = Some(seq);
        }
    }

    /// A fence with no deadline until a heartbeat has left the host: for
    /// the incarnation after a fence. Heartbeats are handed out on
    /// schedule from `now`; the first confirmed one arms the fence, its
    /// schedule re-based so that heartbeat counts as on time.
    pub fn unarmed(config: &DetectorConfig, now: Time) -> Self {
        Fence {
            armed: false,
            ..Fence::new(config, now)
        }
    }

    /// Whether deadlines apply yet.
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// When heartbeat `seq` is scheduled.
    pub fn scheduled(&self, seq: u64) -> Time {
        let nanos = u64::try_from(self.interval.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(seq);
        Time::from_nanos(self.origin.as_nanos().saturating_add(nanos))
    }

    /// The time heartbeat `seq` must have left the host by.
    pub fn deadline(&self, seq: u64) -> Time {
        self.scheduled(seq) + self.slack
    }

    /// The current state (fences first if a deadline has passed unconfirmed
    /// by `now`).
    pub fn state(&mut self, now: Time) -> FenceState {
        self.check(now);
        match self.fenced {
            Some((at, missed_seq)) => FenceState::Fenced { at, missed_seq },
            None => FenceState::Valid {
                t_valid: self.t_valid(),
            },
        }
    }

    /// `t_valid`: no frame may leave after it.
    pub fn t_valid(&self) -> Time {
        match self.fenced {
            Some((at, _)) => at,
            None if !self.armed => Time::from_nanos(u64::MAX),
            None => self.deadline(self.confirmed),
        }
    }

    /// Whether a frame may leave at `now`. Passive: it does not fence (a
    /// confirmation may still be on its way from the socket's error queue);
    /// [`Fence::state`] and [`Fence::poll_heartbeat`] do.
    pub fn may_send(&self, now: Time) -> bool {
        self.fenced.is_none() && now <= self.t_valid()
    }

    /// A frame other than a heartbeat is about to leave at `now`: whether
    /// it may. An unarmed fence arms first — the frame tells its peer this
    /// incarnation lives, so from now on a gap in it may be counted — as if
    /// a heartbeat had left at `now`: the next one is scheduled an interval
    /// later and must leave by its deadline. If a heartbeat was handed out
    /// earlier (its copies may be out while the sender has not reported
    /// it: a peer may have heard it, not the frame), an interval after
    /// that hand-out instead — never later than either asks. Without it, a new incarnation
    /// whose heartbeat thread stalled from its first slot sent data with no
    /// deadline, and the peer that read it reported it dead while data kept
    /// coming (the simulator found it). Not gating data until a heartbeat
    /// arms the fence instead: a process redialling after a fence, with no
    /// peer yet to send a heartbeat to, would wait on itself.
    pub fn admit_frame(&mut self, now: Time) -> bool {
        if !self.armed && self.fenced.is_none() {
            let nanos = u64::try_from(self.interval.as_nanos()).unwrap_or(u64::MAX);
            let base = self.last_handout.map_or(now, |h| h.min(now));
            // Heartbeat `next_seq` at `base + interval` (never later: slots
            // are handed out from the old origin, so `next_seq` intervals
            // fit in `now + interval`).
            self.origin = Time::from_nanos(
                (base.as_nanos().saturating_add(nanos))
                    .saturating_sub(nanos.saturating_mul(self.next_seq)),
            );
            self.set_confirmed(self.next_seq);
            self.armed = true;
        }
        self.may_send(now)
    }

    /// Whether the fence has closed for good.
    pub fn is_fenced(&self) -> bool {
        self.fenced.is_some()
    }

    /// The heartbeat to send now, if one is due. A heartbeat whose deadline
    /// passed before it could even be handed out (this process was not
    /// running) fences instead.
    pub fn poll_heartbeat(&mut self, now: Time) -> Option<HeartbeatDue> {
        self.check(now);
        if !self.armed {
            // Not heard by anyone yet: skip the slots a pause or an outage
            // missed rather than hand them all out at once.
            let slot = self.slot_at(now);
            self.next_seq = self.next_seq.max(slot);
        }
        if self.fenced.is_some() {
            return None;
        }
        if now < self.scheduled(self.next_seq) {
            return self.poll_retry(now);
        }
        // A scheduled heartbeat confirmed in time covers the one waiting
        // for a retry: it replaces it.
        self.retry = None;
        let seq = self.next_seq;
        if !self.armed {
            self.hand_out(seq, now);
            return Some(HeartbeatDue {
                seq,
                deadline: self.deadline(seq),
            });
        }
        if now > self.deadline(seq) {
            self.fence(seq);
            return None;
        }
        self.hand_out(seq, now);
        Some(HeartbeatDue {
            seq,
            deadline: self.deadline(seq),
        })
    }

    /// When the next heartbeat is due, or an unconfirmed one is sent again
    /// (`None` once fenced).
    pub fn poll_timeout(&self) -> Option<Time> {
        let next = self.scheduled(self.next_seq);
        self.fenced.is_none().then(|| match self.retry {
            Some((_, at)) => at.min(next),
            None => next,
        })
    }

    /// Every copy of heartbeat `seq`, handed out at `now`'s round, went
    /// out unconfirmed (every link down, or no TX timestamp came back).
    /// The heartbeat is sent again every `slack / 30` (50 ms with the
    /// defaults) until a copy is confirmed or its deadline passes: outages
    /// of every link chained with short gaps otherwise left each round of
    /// the idle pace inside an outage and fenced a live process, although
    /// a copy sent in any gap would have covered them. Sound: a retry
    /// leaves after `scheduled(seq)`, so one confirmed by `deadline(seq)`
    /// is the evidence the receiver's argument needs — and more copies
    /// only mean peers hear us more often. An unarmed fence has no
    /// deadlines to save: nothing is retried there.
    pub fn handle_unconfirmed(&mut self, seq: u64, now: Time) {
        if !self.armed || self.fenced.is_some() || seq < self.confirmed || seq >= self.next_seq {
            return;
        }
        let at = now + (self.slack / 30).max(Duration::from_millis(1));
        if at <= self.deadline(seq) {
            self.retry = Some((seq, at));
        }
    }

    /// The retry due at `now`, if one is still worth sending.
    fn poll_retry(&mut self, now: Time) -> Option<HeartbeatDue> {
        let (seq, at) = self.retry?;
        if seq < self.confirmed || now > self.deadline(seq) {
            self.retry = None;
            return None;
        }
        if now < at {
            return None;
        }
        // Re-armed by the shell if this copy goes out unconfirmed too.
        self.retry = None;
        Some(HeartbeatDue {
            seq,
            deadline: self.deadline(seq),
        })
    }

    /// Heartbeat `seq` left the host at `sent_at` (its TX timestamp, or the
    /// time after the send call returned when there is none). Late means
    /// fenced. In time, it covers every unconfirmed heartbeat before it
    /// whose deadline is not yet past at `sent_at` (see the module docs).
    pub fn handle_sent(&mut self, seq: u64, sent_at: Time) {
        if self.fenced.is_some() || seq < self.confirmed || seq >= self.next_seq {
            return;
        }
        if !self.armed {
            // The first heartbeat out: deadlines start, counted from it.
            self.arm(sent_at, self.next_seq);
            return;
        }
        if sent_at > self.deadline(seq) {
            self.fence(seq);
            return;
        }
        // Deadlines grow with the sequence: if the oldest unconfirmed one
        // is not past, none up to `seq` is. Otherwise the oldest stays
        // unconfirmed and `check` fences at its (passed) deadline unless an
        // earlier confirmation, still unread on another socket, covers it.
        // A partial round covers no full one (a slow peer got nothing
        // from it): it waits for its own confirmation or a later full one.
        let f = self.full_every.max(1);
        let first_full = self
            .confirmed
            .div_ceil(f)
            .saturating_mul(f)
            .min(self.full_pending.unwrap_or(u64::MAX));
        let covers = self.is_full(seq) || first_full >= seq;
        if sent_at <= self.deadline(self.confirmed) && covers {
            self.set_confirmed(seq + 1);
        }
    }

    /// Heartbeat `seq` was handed to the kernel no earlier than `at`, and
    /// no TX timestamp has confirmed when it left. An unarmed fence arms
    /// here all the same: receivers may hear this heartbeat, so from now on
    /// they may count a gap in this incarnation. The heartbeat stays
    /// unconfirmed, so the fence closes at `at + slack` unless a later one
    /// is confirmed in time. `at` is a lower bound of the departure, which
    /// makes every deadline early, never late. An armed fence ignores it
    /// (an unconfirmed heartbeat proves nothing there).
    ///
    /// Without it, an incarnation whose heartbeats left but were never
    /// confirmed (stamps lost) ran with no deadline while its peers heard
    /// it: a stall then went unfenced.
    pub fn handle_handed(&mut self, seq: u64, at: Time) {
        if self.armed || self.fenced.is_some() || seq >= self.next_seq {
            return;
        }
        self.arm(at, self.next_seq - 1);
    }

    /// Deadlines start: the last heartbeat handed out so far counts as
    /// scheduled at `at` (when the arming one left, or was handed over),
    /// and every heartbeat from `confirmed` on must be confirmed in time.
    ///
    /// Re-based on the *last* one handed out, not on the arming one:
    /// several may have been handed out while the first waited (a stuck
    /// transmit queue lets them all leave at once); re-based on the first,
    /// the next one would be scheduled that many intervals after `at`, and
    /// a receiver that heard the burst at `at` timed out before it came —
    /// while the fence still let frames out. The simulator found it.
    fn arm(&mut self, at: Time, confirmed: u64) {
        let last = self.next_seq.saturating_sub(1);
        let nanos = u64::try_from(self.interval.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(last);
        self.origin = Time::from_nanos(at.as_nanos().saturating_sub(nanos));
        self.set_confirmed(confirmed);
        self.armed = true;
    }

    /// The schedule slot `now` falls in.
    fn slot_at(&self, now: Time) -> u64 {
        let i = u64::try_from(self.interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        now.as_nanos().saturating_sub(self.origin.as_nanos()) / i
    }

    fn check(&mut self, now: Time) {
        if self.armed && self.fenced.is_none() && now > self.deadline(self.confirmed) {
            // The deadline of the first unconfirmed heartbeat has passed.
            // Called only where confirmations have been read first (the
            // heartbeat task), so this is a miss, not a slow read.
            self.fence(self.confirmed);
        }
    }

    fn fence(&mut self, missed_seq: u64) {
        if self.fenced.is_none() {
            self.fenced = Some((self.deadline(self.confirmed), missed_seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heartbeats every 10 ms, each due 20 ms after its slot.
    fn cfg() -> DetectorConfig {
        let mut c = DetectorConfig::with_interval(Duration::from_millis(10));
        c.idle_interval = c.interval;
        c.send_slack = Duration::from_millis(20);
        c
    }

    fn ms(m: u64) -> Time {
        Time::from_millis(m)
    }

    /// An unarmed fence whose heartbeats leave unconfirmed arms on the
    /// first one handed out, and fences a slack later unless a later
    /// heartbeat is confirmed in time.
    #[test]
    fn an_unconfirmed_heartbeat_arms_an_unarmed_fence() {
        let mut f = Fence::unarmed(&cfg(), ms(100));
        assert!(!f.is_armed());
        let due = f.poll_heartbeat(ms(100)).unwrap();
        f.handle_handed(due.seq, ms(100));
        assert!(f.is_armed());
        assert_eq!(f.t_valid(), ms(120));
        // A later heartbeat confirmed in time keeps it valid...
        let next = f.poll_heartbeat(ms(110)).unwrap();
        f.handle_sent(next.seq, ms(111));
        assert_eq!(f.t_valid(), ms(140));
        // ...and with none confirmed it closes at the deadline.
        let mut g = Fence::unarmed(&cfg(), ms(100));
        let due = g.poll_heartbeat(ms(100)).unwrap();
        g.handle_handed(due.seq, ms(100));
        g.poll_heartbeat(ms(110)).unwrap();
        assert!(matches!(g.state(ms(121)), FenceState::Fenced { at, .. } if at == ms(120)));
        // Armed already: an unconfirmed heartbeat changes nothing.
        let mut h = Fence::new(&cfg(), ms(0));
        let due = h.poll_heartbeat(ms(0)).unwrap();
        h.handle_handed(due.seq, ms(0));
        assert_eq!(h.t_valid(), ms(20));
    }

    /// Data leaving an unarmed fence arms it as a heartbeat would: the
    /// next heartbeat is due an interval later, and a heartbeat thread
    /// stalled from then on fences the process at that one's deadline —
    /// no data leaves after it.
    #[test]
    fn data_arms_an_unarmed_fence() {
        let mut f = Fence::unarmed(&cfg(), ms(100));
        // A slot handed out to nobody (no peer yet) leaves it unarmed.
        let due = f.poll_heartbeat(ms(100)).unwrap();
        assert_eq!(due.seq, 0);
        assert!(!f.is_armed());
        // Its copies may be out unreported: the deadlines count from its
        // hand-out, not from the frame.
        assert!(f.admit_frame(ms(105)));
        assert!(f.is_armed());
        assert_eq!(f.scheduled(1), ms(110));
        assert_eq!(f.t_valid(), ms(130));
        assert!(f.admit_frame(ms(130)));
        assert!(!f.admit_frame(ms(131)));
        assert!(f.poll_heartbeat(ms(131)).is_none());
        assert!(f.is_fenced());
        // In time, the next heartbeat keeps it open as usual.
        let mut g = Fence::unarmed(&cfg(), ms(100));
        assert!(g.admit_frame(ms(100)));
        assert_eq!(g.poll_heartbeat(ms(109)), None);
        let due = g.poll_heartbeat(ms(110)).unwrap();
        g.handle_sent(due.seq, ms(111));
        assert_eq!(g.t_valid(), ms(140));
        // An armed fence is not moved by data.
        assert!(g.admit_frame(ms(112)));
        assert_eq!(g.t_valid(), ms(140));
    }

    #[test]
    fn starts_valid_until_the_first_deadline() {
        let f = Fence::new(&cfg(), ms(0));
        assert_eq!(f.t_valid(), ms(20));
        assert!(f.may_send(ms(20)));
        assert!(!f.may_send(ms(21)));
    }

    #[test]
    fn in_time_heartbeats_extend_t_valid() {
        let mut f = Fence::new(&cfg(), ms(0));
        for k in 0..5u64 {
            let due = f.poll_heartbeat(ms(10 * k)).unwrap();
            assert_eq!(due.seq, k);
            assert_eq!(due.deadline, ms(10 * k + 20));
            assert_eq!(f.poll_heartbeat(ms(10 * k)), None, "one per slot");
            f.handle_sent(k, ms(10 * k + 1));
            assert_eq!(f.t_valid(), ms(10 * (k + 1) + 20));
        }
        assert!(matches!(f.state(ms(45)), FenceState::Valid { .. }));
    }

    #[test]
    fn late_tx_timestamp_fences_for_good() {
        let mut f = Fence::new(&cfg(), ms(0));
        f.poll_heartbeat(ms(0)).unwrap();
        f.handle_sent(0, ms(1));
        let due = f.poll_heartbeat(ms(10)).unwrap();
        f.handle_sent(due.seq, ms(31)); // deadline 30
        assert_eq!(
            f.state(ms(31)),
            FenceState::Fenced {
                at: ms(30),
                missed_seq: 1
            }
        );
        // A later heartbeat in time changes nothing.
        assert_eq!(f.poll_heartbeat(ms(40)), None);
        f.handle_sent(2, ms(40));
        assert!(!f.may_send(ms(25)));
        assert!(f.is_fenced());
    }

    #[test]
    fn woken_after_the_deadline_fences_instead_of_sending() {
        let mut f = Fence::new(&cfg(), ms(0));
        f.poll_heartbeat(ms(0)).unwrap();
        f.handle_sent(0, ms(0));
        // The task slept through heartbeat 1's deadline (30 ms).
        assert_eq!(f.poll_heartbeat(ms(2000)), None);
        assert_eq!(
            f.state(ms(2000)),
            FenceState::Fenced {
                at: ms(30),
                missed_seq: 1
            }
        );
    }

    #[test]
    fn passive_gate_closes_at_t_valid_without_fencing() {
        let mut f = Fence::new(&cfg(), ms(0));
        f.poll_heartbeat(ms(0)).unwrap();
        f.handle_sent(0, ms(0));
        let due = f.poll_heartbeat(ms(10)).unwrap();
        // The confirmation of heartbeat 1 is not read yet at 31 ms: frames
        // wait, but the fence is not final.
        assert!(!f.may_send(ms(31)));
        assert!(!f.is_fenced());
        // It had left at 29 ms: valid again.
        f.handle_sent(due.seq, ms(29));
        assert!(f.may_send(ms(31)));
    }

    #[test]
    fn unconfirmed_heartbeat_fences_at_its_deadline() {
        let mut f = Fence::new(&cfg(), ms(0));
        f.poll_heartbeat(ms(0)).unwrap();
        // Never confirmed (every send failed).
        assert!(matches!(f.state(ms(20)), FenceState::Valid { .. }));
        assert!(matches!(
            f.state(ms(21)),
            FenceState::Fenced { missed_seq: 0, .. }
        ));
    }

    #[test]
    fn an_unconfirmed_heartbeat_is_sent_again_until_a_copy_is_confirmed() {
        // The defaults: a round every 400 ms, 1.5 s slack, retries 50 ms apart.
        let mut f = Fence::new(&DetectorConfig::default(), ms(0));
        let d = f.poll_heartbeat(ms(0)).unwrap();
        f.handle_sent(d.seq, ms(0));
        let d = f.poll_heartbeat(ms(400)).unwrap();
        assert_eq!(d.seq, 1);
        // Every link down: no copy confirmed.
        f.handle_unconfirmed(1, ms(400));
        assert_eq!(f.poll_timeout(), Some(ms(450)));
        assert_eq!(f.poll_heartbeat(ms(449)), None);
        let again = f.poll_heartbeat(ms(450)).unwrap();
        assert_eq!(
            again,
            HeartbeatDue {
                seq: 1,
                deadline: ms(1900)
            }
        );
        // Still down.
        f.handle_unconfirmed(1, ms(450));
        let again = f.poll_heartbeat(ms(500)).unwrap();
        assert_eq!(again.seq, 1);
        // A gap between outages: this copy left.
        f.handle_sent(1, ms(505));
        assert_eq!(f.t_valid(), ms(800 + 1500));
        assert_eq!(f.poll_timeout(), Some(ms(800)), "no more retries");
        assert_eq!(f.poll_heartbeat(ms(560)), None);
        assert!(matches!(f.state(ms(2000)), FenceState::Valid { .. }));
    }

    #[test]
    fn retries_stop_at_the_deadline_and_a_scheduled_round_replaces_them() {
        let mut f = Fence::new(&DetectorConfig::default(), ms(0));
        let d = f.poll_heartbeat(ms(0)).unwrap();
        f.handle_sent(d.seq, ms(0));
        // From 400 ms on, every copy of every round and retry fails.
        let mut sent = Vec::new();
        let mut t = 400;
        while t <= 2000 {
            if let Some(d) = f.poll_heartbeat(ms(t)) {
                assert!(ms(t) <= d.deadline, "a retry after its deadline at {t} ms");
                sent.push((t, d.seq));
                f.handle_unconfirmed(d.seq, ms(t));
            }
            t += 5;
        }
        // Heartbeat 1 and its retries until the next round, then round 2
        // and its, and so on: each round replaces the last one's retries.
        assert_eq!(sent[0], (400, 1));
        assert_eq!(sent[1], (450, 1));
        assert!(sent.contains(&(800, 2)) && sent.contains(&(850, 2)));
        assert!(!sent.iter().any(|&(t, s)| s == 1 && t >= 800));
        // Nothing confirmed: fenced at heartbeat 1's deadline, as before.
        assert!(matches!(
            f.state(ms(1901)),
            FenceState::Fenced { missed_seq: 1, .. }
        ));
        assert!(sent.iter().all(|&(t, _)| t <= 1900));
    }

    #[test]
    fn an_unarmed_fence_retries_nothing() {
        let mut f = Fence::unarmed(&DetectorConfig::default(), ms(0));
        let d = f.poll_heartbeat(ms(0)).unwrap();
        f.handle_unconfirmed(d.seq, ms(0));
        assert_eq!(f.poll_timeout(), Some(ms(400)));
    }

    #[test]
    fn a_later_heartbeat_in_time_covers_an_earlier_one() {
        let mut f = Fence::new(&cfg(), ms(0));
        f.poll_heartbeat(ms(0)).unwrap();
        f.poll_heartbeat(ms(10)).unwrap();
        // Heartbeat 0 never left (every send failed); 1 left at 11 ms,
        // before 0's deadline (20 ms): it covers 0.
        f.handle_sent(1, ms(11));
        assert_eq!(f.t_valid(), ms(40));
        // Duplicate, stale and unknown confirmations are ignored.
        f.handle_sent(0, ms(500));
        f.handle_sent(1, ms(500));
        f.handle_sent(7, ms(11));
        assert_eq!(f.t_valid(), ms(40));
        assert!(matches!(f.state(ms(35)), FenceState::Valid { .. }));
    }

    #[test]
    fn after_a_fence_an_isolated_process_does_not_fence_again_until_heard() {
        let mut f = Fence::unarmed(&cfg(), ms(0));
        assert!(!f.is_armed());
        // Every send fails for two seconds: heartbeats are handed out on
        // schedule, no deadline passes, frames may leave (none can).
        let mut handed = 0;
        for t in (0..2000).step_by(5) {
            if f.poll_heartbeat(ms(t)).is_some() {
                handed += 1;
            }
            assert!(matches!(f.state(ms(t)), FenceState::Valid { .. }));
        }
        assert_eq!(handed, 200, "one per slot, none bunched");
        // A pause: slots missed are skipped, not handed out at once.
        let due = f.poll_heartbeat(ms(5000)).unwrap();
        assert_eq!(due.seq, 500);
        assert_eq!(f.poll_heartbeat(ms(5000)), None);
        // It leaves: the fence arms, counted from that heartbeat.
        f.handle_sent(500, ms(5001));
        assert!(f.is_armed());
        assert_eq!(f.t_valid(), ms(5001 + 10 + 20));
        // From now on deadlines apply as usual.
        let due = f.poll_heartbeat(ms(5011)).unwrap();
        assert_eq!(due.seq, 501);
        assert!(matches!(
            f.state(ms(5032)),
            FenceState::Fenced {
                missed_seq: 501,
                ..
            }
        ));
    }

    /// With slow pairs (one full round in 4), a partial round covers
    /// earlier partial ones but not a full one: a slow peer got nothing
    /// from it.
    #[test]
    fn a_partial_round_does_not_cover_a_full_one() {
        let mut c = cfg();
        c.slow_after = Some(Duration::from_millis(100));
        c.slow_factor = 4;
        c.send_slack = Duration::from_millis(100);
        let mut f = Fence::new(&c, ms(0));
        assert!(f.is_full(0) && !f.is_full(1) && !f.is_full(3) && f.is_full(4));
        // Full round 0 handed out and not confirmed: the next rounds go
        // full too, so any of them covers it.
        assert_eq!(f.poll_heartbeat(ms(0)).map(|d| d.seq), Some(0));
        assert!(f.is_full(1) && f.is_full(3));
        assert_eq!(f.poll_heartbeat(ms(10)).map(|d| d.seq), Some(1));
        f.handle_sent(1, ms(11));
        assert_eq!(f.t_valid(), ms(120), "round 2's deadline");
        // Confirmed: partial again.
        assert!(!f.is_full(2) && f.is_full(4));
        let due: Vec<u64> = (20..=40)
            .step_by(10)
            .filter_map(|t| f.poll_heartbeat(ms(t)).map(|d| d.seq))
            .collect();
        assert_eq!(due, vec![2, 3, 4]);
        // Partial 2 never confirmed, full 4 not yet: partial 3 covers 2,
        // not 4.
        f.handle_sent(3, ms(39));
        assert_eq!(f.t_valid(), ms(140), "round 4's deadline");
        f.handle_sent(4, ms(40));
        assert_eq!(f.t_valid(), ms(150), "round 5's deadline");
        // Full 8 unconfirmed: 9 goes full, and partial-by-schedule rounds
        // after it can no longer leave it behind.
        let mut f = Fence::new(&c, ms(0));
        for t in (0..=90).step_by(10) {
            if let Some(d) = f.poll_heartbeat(ms(t)) {
                if d.seq < 8 {
                    f.handle_sent(d.seq, ms(t + 1));
                }
            }
        }
        assert!(f.is_full(8) && f.is_full(9) && f.is_full(10));
        assert_eq!(f.t_valid(), ms(180), "round 8's deadline");
        f.handle_sent(9, ms(91));
        assert_eq!(f.t_valid(), ms(200), "round 10's deadline");
        assert!(!f.is_full(10) && f.is_full(12));
        // A partial round covers earlier partial ones.
        let mut f = Fence::new(&c, ms(0));
        for t in (0..=30).step_by(10) {
            f.poll_heartbeat(ms(t));
        }
        f.handle_sent(0, ms(1));
        f.handle_sent(3, ms(35));
        assert_eq!(f.t_valid(), ms(140), "round 4's deadline");
    }

    #[test]
    fn a_later_heartbeat_after_the_oldest_deadline_does_not_cover_it() {
        let mut f = Fence::new(&cfg(), ms(0));
        f.poll_heartbeat(ms(0)).unwrap();
        f.poll_heartbeat(ms(10)).unwrap();
        f.poll_heartbeat(ms(20)).unwrap();
        // Heartbeat 0 (deadline 20 ms) never left; 2 left at 21 ms, in its
        // own time but too late for 0.
        f.handle_sent(2, ms(21));
        assert_eq!(
            f.state(ms(21)),
            FenceState::Fenced {
                at: ms(20),
                missed_seq: 0
            }
        );
    }
}
