//! A virtual-time model of one heartbeat sender and one receiver, for the
//! detector's accuracy and completeness properties.
//!
//! The sender runs the core's [`Fence`]: a heartbeat thread (its TX
//! timestamp comes a little after the send, as the kernel's does) and a data
//! thread that sends a frame every millisecond through the gate. The
//! receiver runs the core's [`Monitor`] behind a bounded FIFO socket queue
//! (overflow counted as drops, like `SO_RXQ_OVFL`), a reader thread that
//! drains it, a checker thread whose barriers go through the same queue, and
//! a TCP reader whose traffic counts as heard. Heartbeats go over two
//! networks with a delay of at most `max_network_delay` (the paper's
//! blackbox assumption); one network may be cut for a while.
//!
//! Faults: pauses of the whole sender, of its heartbeat thread, of the whole
//! receiver, of its reader or of its checker; bursts of junk that overflow
//! the receiver's queue; a flood forging the sender's address; a sender
//! crash. The model steps in 100 µs ticks.
//!
//! Data frames go on network 0 or alternate between both (`data_paths`)
//! and wait in a per-network stream queue until the
//! receiver's connection reader takes them; as in the shell, a busy copy
//! to a network that carried data within `interval` is left out
//! ([`Pacer::admit_copy`]), and a round's end reports the stream queues
//! holding unread bytes ([`QueuesAtBarrier::unread_streams`]).
//!
//! Heartbeats come at two paces, as the shell sends them: the fence's
//! every `idle_interval`, and while the pair is busy one every `interval`
//! too (the core's [`Pacer`]). The sender is busy while its data thread
//! sends; the receiver while a `receiver_busy` window lasts — its heartbeats
//! to the sender then say `WATCH` (modelled as a datagram every `interval`
//! back to the sender, delayed like the rest), and the first one is an ask
//! its monitor starts the short window from; going quiet, one more
//! without `WATCH` ends the ask (the sender takes the newest of them, as
//! the shell does).
//!
//! With `answer_grace` (the default) the sender's pace follows answers:
//! each data frame is a send awaiting one, and with `answer_delay` the
//! receiver's connection reader acknowledges what it reads, back on the
//! same network; a send unanswered for the grace makes the sender busy
//! until answered, and frames less than half a path window apart (the
//! default 1 ms) make it dense, busy whatever the answers (`Pacer`,
//! "Dense pairs"). A stalled receiver, a cut path, a late answer all
//! switch the pace.
//!
//! With `private` the receiver keeps the shell's private queues (the core
//! monitor's "Private queues"): one per network that the sender's
//! heartbeats go to (every 8th also to the public queue), and one for its
//! own barriers; a round's end reports every queue's drops and emptiness
//! ([`Monitor::handle_barrier_queues`]). A forged flood then fills only the
//! public queue, and a `Flood` stands for junk that guessed a private port.

use std::collections::VecDeque;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_proto::detector::{
    DetectorConfig, Fence, HeartbeatQueue, Monitor, MonitorAction, Pace, Pacer, PathReport,
    PathUse, QueueAtBarrier, QueuesAtBarrier, Watch,
};
use surelink_proto::{Epoch, NodeId, Time};

/// The sender's node id in the model.
pub const SENDER: NodeId = NodeId(1);
/// The receiver's node id in the model.
pub const RECEIVER: NodeId = NodeId(2);

/// Which part of which process a pause stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseTarget {
    /// Every thread of the sender (SIGSTOP, GC).
    SenderProcess,
    /// Only the sender's heartbeat thread.
    SenderHeartbeat,
    /// The sender's kernel transmit path (a stuck qdisc or driver): every
    /// packet handed to it in the window leaves when the window ends, and
    /// its TX timestamp says so. The process keeps running.
    SenderKernel,
    /// Every thread of the receiver.
    ReceiverProcess,
    /// The receiver's heartbeat reader.
    ReceiverReader,
    /// The receiver's checker.
    ReceiverChecker,
    /// The receiver's connection reader (an async runtime that stalls):
    /// data waits in its stream queues.
    ReceiverStream,
}

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetectorFault {
    /// `target` stops from `at` for `len`.
    Pause {
        /// What stops.
        target: PauseTarget,
        /// When, from the start.
        at: Duration,
        /// For how long.
        len: Duration,
    },
    /// Network 1 loses everything from `at` for `len`.
    Cut {
        /// When.
        at: Duration,
        /// For how long.
        len: Duration,
    },
    /// `count` junk datagrams hit the receiver's heartbeat queue at `at`
    /// (with `private`: its private queues, as if the port were guessed).
    Flood {
        /// When.
        at: Duration,
        /// How many.
        count: usize,
    },
    /// Junk forging the sender's address: `per_tick` datagrams into the
    /// receiver's public (members') queue every tick from `at` for `len`.
    ForgedFlood {
        /// When.
        at: Duration,
        /// For how long.
        len: Duration,
        /// Datagrams per 100 µs tick.
        per_tick: usize,
    },
    /// The sender dies at `at`.
    Crash {
        /// When.
        at: Duration,
    },
}

/// A scenario: settings, faults, seed.
#[derive(Clone, Debug)]
pub struct DetectorScenario {
    /// Detector settings (both sides).
    pub config: DetectorConfig,
    /// The faults.
    pub faults: Vec<DetectorFault>,
    /// How long to run.
    pub run_for: Duration,
    /// Capacity of the receiver's heartbeat queue, in datagrams.
    pub queue_capacity: usize,
    /// Seeds network delays and TX-timestamp lag.
    pub seed: u64,
    /// The sender's data thread sends a frame this often (traffic counts
    /// as heartbeats); `None`: heartbeats only, so accuracy rests on the
    /// fence alone.
    pub data_every: Option<Duration>,
    /// Per mille of heartbeats that sit in the sender's kernel (qdisc,
    /// driver) for up to twice the send slack before they leave.
    pub late_permille: u32,
    /// Per mille of heartbeats the sender's kernel drops without a TX
    /// timestamp.
    pub lost_permille: u32,
    /// Per mille of the fence's heartbeats that leave but whose TX
    /// timestamp never comes back (an overflowing error queue): the thread
    /// knows only that it handed them over ([`Fence::handle_handed`]).
    pub unstamped_permille: u32,
    /// The sender starts as the incarnation after a fence: no deadline
    /// until a heartbeat is out ([`Fence::unarmed`]).
    pub start_unarmed: bool,
    /// Networks the data frames alternate between (1: network 0 only,
    /// network 1 on standby; 2: both).
    pub data_paths: u16,
    /// The receiver keeps private queues (see the module docs).
    pub private: bool,
    /// Windows (start, length) in which the receiver has traffic in flight
    /// with the sender and asks for the busy pace.
    pub receiver_busy: Vec<(Duration, Duration)>,
    /// The receiver answers the data it reads (an acknowledgement back on
    /// the same network, this long after the read plus the network's
    /// delay); the sender's pacer takes each as an answer to its sends
    /// (`DetectorConfig::answer_grace`). `None`: no answers, so a sender
    /// with `answer_grace` goes busy one grace after its data starts.
    pub answer_delay: Option<Duration>,
}

/// What happened.
#[derive(Clone, Debug, Default)]
pub struct DetectorOutcome {
    /// When the receiver reported the sender dead (each time).
    pub peer_reports: Vec<Time>,
    /// When the sender let a frame out (data, and heartbeats leaving the
    /// host).
    pub data_sent: Vec<Time>,
    /// When the sender's fence closed for good (its `t_valid`), if it did.
    pub fenced_at: Option<Time>,
    /// When the sender crashed, if it did.
    pub crashed_at: Option<Time>,
    /// Datagrams the receiver's queues dropped.
    pub drops: u64,
    /// When the last drop that may hold a report back happened (with
    /// `private`, the public queue's do not).
    pub last_drop: Option<Time>,
    /// When the sender's last frame actually left its host (a delayed
    /// heartbeat may leave after the fence closed).
    pub last_departure: Option<Time>,
    /// Barrier rounds the monitor ran.
    pub barrier_rounds: u64,
    /// Whether the receiver ever heard the sender (a peer never heard is
    /// not watched, so never reported).
    pub watched: bool,
    /// Paths reported down: when, and which network.
    pub path_reports: Vec<(Time, u16)>,
    /// Paths the receiver was told to fail over (a report with
    /// `failover`, or a later [`PathReport::PathFailover`]): when, and
    /// which network.
    pub failovers: Vec<(Time, u16)>,
    /// Failed-over paths given up a peer window later
    /// ([`PathReport::PathAbandon`]): when, and which network.
    pub abandons: Vec<(Time, u16)>,
    /// Heartbeats the sender let out (both paces).
    pub heartbeats: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    Heartbeat { network: u16, pace: Pace, seq: u64 },
    Barrier { token: u64 },
    Junk,
}

/// Which receive queue a datagram is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    Public,
    Private(u16),
    Barriers,
}

/// Every this many heartbeats a copy also goes to the public queue.
const PUBLIC_EVERY: u64 = 8;

/// A bounded FIFO receive queue with its drop count.
#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    drops: u64,
}

/// The receiver's queues: the public one, the private ones per network,
/// our barriers'.
#[derive(Default)]
struct Queues {
    public: Queue,
    private: [Queue; 2],
    barriers: Queue,
}

impl Queues {
    fn get(&mut self, dest: Dest) -> &mut Queue {
        match dest {
            Dest::Public => &mut self.public,
            Dest::Private(n) => &mut self.private[usize::from(n.min(1))],
            Dest::Barriers => &mut self.barriers,
        }
    }
}

const TICK: Duration = Duration::from_micros(100);
/// Frames of the sender's data thread: one per millisecond.
const DATA_EVERY: Duration = Duration::from_millis(1);
/// Most items the reader takes per tick.
const READ_PER_TICK: usize = 64;

fn at(d: Duration) -> Time {
    Time::ZERO + d
}

impl DetectorScenario {
    /// A scenario with nothing going on: no fault, no data, no lateness or
    /// loss, armed from the start, two networks, the shared queue, an
    /// idle receiver, seed 1. Tests name what they change and take the
    /// rest from here (`..DetectorScenario::quiet(config, run_for)`).
    pub fn quiet(config: DetectorConfig, run_for: Duration) -> Self {
        DetectorScenario {
            config,
            faults: Vec::new(),
            run_for,
            queue_capacity: 64,
            seed: 1,
            data_every: None,
            late_permille: 0,
            lost_permille: 0,
            unstamped_permille: 0,
            start_unarmed: false,
            data_paths: 2,
            private: false,
            receiver_busy: Vec::new(),
            answer_delay: None,
        }
    }

    fn paused(&self, target: PauseTarget, now: Time) -> bool {
        self.faults.iter().any(|f| match *f {
            DetectorFault::Pause {
                target: t,
                at: a,
                len,
            } => {
                let hit = t == target
                    || (target == PauseTarget::SenderHeartbeat && t == PauseTarget::SenderProcess)
                    || (matches!(
                        target,
                        PauseTarget::ReceiverReader | PauseTarget::ReceiverChecker
                    ) && t == PauseTarget::ReceiverProcess)
                    || (target == PauseTarget::ReceiverStream && t == PauseTarget::ReceiverProcess);
                hit && now >= at(a) && now < at(a + len)
            }
            _ => false,
        })
    }

    /// When a packet handed to the sender's kernel at `t` leaves it.
    fn departure(&self, t: Time) -> Time {
        self.faults
            .iter()
            .filter_map(|f| match *f {
                DetectorFault::Pause {
                    target: PauseTarget::SenderKernel,
                    at: a,
                    len,
                } if t >= at(a) && t < at(a + len) => Some(at(a + len)),
                _ => None,
            })
            .max()
            .unwrap_or(t)
    }

    fn cut(&self, network: u16, now: Time) -> bool {
        network == 1
            && self.faults.iter().any(|f| match *f {
                DetectorFault::Cut { at: a, len } => now >= at(a) && now < at(a + len),
                _ => false,
            })
    }

    fn receiver_busy_at(&self, now: Time) -> bool {
        self.receiver_busy
            .iter()
            .any(|&(a, len)| now >= at(a) && now < at(a + len))
    }

    fn crash_time(&self) -> Option<Time> {
        self.faults
            .iter()
            .filter_map(|f| match f {
                DetectorFault::Crash { at: a } => Some(at(*a)),
                _ => None,
            })
            .min()
    }

    /// The time after which the receiver has run normally: no pause of any
    /// of its threads and no flood.
    pub fn receiver_settled(&self) -> Time {
        self.faults
            .iter()
            .filter_map(|f| match *f {
                DetectorFault::Pause {
                    target:
                        PauseTarget::ReceiverProcess
                        | PauseTarget::ReceiverReader
                        | PauseTarget::ReceiverChecker
                        | PauseTarget::ReceiverStream,
                    at: a,
                    len,
                } => Some(at(a + len)),
                DetectorFault::Flood { at: a, .. } => Some(at(a)),
                // Its reader is not the private queues' one.
                DetectorFault::ForgedFlood { at: a, len, .. } if !self.private => Some(at(a + len)),
                _ => None,
            })
            .max()
            .unwrap_or(Time::ZERO)
    }

    fn forged_per_tick(&self, now: Time) -> usize {
        self.faults
            .iter()
            .map(|f| match *f {
                DetectorFault::ForgedFlood {
                    at: a,
                    len,
                    per_tick,
                } if now >= at(a) && now < at(a + len) => per_tick,
                _ => 0,
            })
            .sum()
    }

    /// Runs the model.
    pub fn run(&self) -> DetectorOutcome {
        let cfg = &self.config;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut out = DetectorOutcome {
            crashed_at: self.crash_time(),
            ..DetectorOutcome::default()
        };
        let mut fence = if self.start_unarmed {
            Fence::unarmed(cfg, Time::ZERO)
        } else {
            Fence::new(cfg, Time::ZERO)
        };
        let mut pacer = Pacer::new(cfg);
        let mut busy_round = Vec::new();
        // The receiver's heartbeats on their way to the sender, for what
        // they say of WATCH: (arrival, WATCH, sequence).
        let mut watch_flight: Vec<(Time, bool, u64)> = Vec::new();
        let mut watch_seq = 0u64;
        // The receiver's answers to data on their way to the sender.
        let mut answer_flight: Vec<Time> = Vec::new();
        let mut receiver_was_busy = false;
        let mut next_watch = Time::ZERO;
        let mut monitor = Monitor::new(cfg, Time::ZERO);
        monitor.handle_drop_count(Time::ZERO, 0);
        monitor.handle_system_drop_count(Time::ZERO, 0);
        let watch = |network| Watch {
            peer: SENDER,
            network,
        };
        // In flight: (arrival, queue, item) for UDP, arrival for TCP.
        let mut udp_flight: Vec<(Time, Dest, Item)> = Vec::new();
        let mut tcp_flight: VecDeque<(Time, u16)> = VecDeque::new();
        // Data arrived and not yet read, per network (the connections'
        // receive queues); when data last left per network.
        let mut streams: [usize; 2] = [0, 0];
        let mut carried: [Option<Time>; 2] = [None, None];
        let mut next_data_network = 0u16;
        let mut qs = Queues::default();
        // TX timestamps the heartbeat thread has not read yet.
        let mut stamps: Vec<(Time, u64, Time)> = Vec::new();
        let mut next_data = Time::ZERO;
        let mut round: Option<(u64, usize)> = None;
        let floods: Vec<(Time, usize)> = self
            .faults
            .iter()
            .filter_map(|f| match *f {
                DetectorFault::Flood { at: a, count } => Some((at(a), count)),
                _ => None,
            })
            .collect();
        let max_delay_us = u64::try_from(cfg.max_network_delay.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let end = at(self.run_for);
        let mut now = Time::ZERO;
        while now <= end {
            let alive = out.crashed_at.is_none_or(|c| now < c);
            // ---- sender ----
            if alive && !self.paused(PauseTarget::SenderHeartbeat, now) {
                // Read the timestamps the kernel produced so far.
                stamps.retain(|&(ready, seq, stamp)| {
                    if ready <= now {
                        fence.handle_sent(seq, stamp);
                        false
                    } else {
                        true
                    }
                });
                // The receiver's asks (and their ends) that arrived, and
                // our own traffic.
                watch_flight.sort_by_key(|&(t, _, _)| t);
                watch_flight.retain(|&(t, watch, seq)| {
                    if t <= now {
                        pacer.handle_watch_ordered(now, RECEIVER, watch, Epoch(1), seq);
                        false
                    } else {
                        true
                    }
                });
                let lingering = cfg.answer_grace.is_none();
                if lingering
                    && self.data_every.is_some()
                    && !self.paused(PauseTarget::SenderProcess, now)
                {
                    pacer.handle_traffic(now, RECEIVER);
                }
                if !self.paused(PauseTarget::SenderProcess, now) {
                    answer_flight.retain(|&t| {
                        if t <= now {
                            pacer.handle_answer(now, RECEIVER);
                            false
                        } else {
                            true
                        }
                    });
                }
                // What this tick sends: the fence's heartbeat (stamped), a
                // busy one (not), or both at once; per network, whether
                // the copy goes (a busy copy may be left out where data
                // flows, as the shell's).
                let mut sends: Vec<(Option<u64>, [Option<u16>; 2])> = Vec::new();
                // The sender only writes data (the receiver's asks are
                // datagrams): a path's use is its writes.
                let usage = |n: u16| PathUse {
                    wrote: carried[usize::from(n)],
                    used: carried[usize::from(n)],
                    pair_used: carried[0].max(carried[1]),
                };
                if let Some(due) = fence.poll_heartbeat(now) {
                    match pacer.fence_copy(now, RECEIVER, fence.is_full(due.seq)) {
                        Some(flags) => {
                            let nets = [0u16, 1].map(|n| {
                                pacer.admit_copy(now, RECEIVER, n, flags, false, usage(n))
                            });
                            sends.push((Some(due.seq), nets));
                        }
                        // A slow pair skips the round: nobody is in it, so
                        // it left in time (as the shell's empty round).
                        None if fence.may_send(now) => fence.handle_sent(due.seq, now),
                        None => {}
                    }
                }
                if pacer.poll_round(now, &mut busy_round) {
                    for (_, flags) in &busy_round {
                        let nets = [0u16, 1]
                            .map(|n| pacer.admit_copy(now, RECEIVER, n, *flags, true, usage(n)));
                        if nets.iter().any(Option::is_some) {
                            sends.push((None, nets));
                        }
                    }
                }
                for (stamped, nets) in sends {
                    if fence.may_send(now) {
                        // Handed to the kernel: an unarmed fence arms
                        // (peers may hear it), as the shell's does.
                        if let Some(seq) = stamped {
                            fence.handle_handed(seq, now);
                        }
                        out.heartbeats += 1;
                        // The packet reaches the device a little later
                        // (sometimes much later, or never); that moment is
                        // its TX timestamp, read by the thread after it.
                        let roll = rng.random_range(0..1000u32);
                        let lag = if roll < self.late_permille {
                            let slack = u64::try_from(cfg.send_slack.as_micros()).unwrap_or(0);
                            Duration::from_micros(rng.random_range(0..=2 * slack.max(1)))
                        } else {
                            Duration::from_micros(rng.random_range(0..300))
                        };
                        let lost = roll >= 1000 - self.lost_permille.min(1000);
                        if lost {
                            // No stamp will come: the shell's round ends
                            // unconfirmed, and the heartbeat is retried.
                            if let Some(seq) = stamped {
                                fence.handle_unconfirmed(seq, now);
                            }
                        } else {
                            let departs = self.departure(now + lag);
                            // Judged by when it was generated: a packet the
                            // gate let out before `t_valid` may leave later
                            // (the paper's rule, and the kernel's doing).
                            out.data_sent.push(now);
                            out.last_departure = out.last_departure.max(Some(departs));
                            for network in 0..2u16 {
                                let Some(flags) = nets[usize::from(network)] else {
                                    continue;
                                };
                                if self.cut(network, departs) {
                                    continue;
                                }
                                let item = Item::Heartbeat {
                                    network,
                                    pace: Pace::of(flags),
                                    seq: out.heartbeats,
                                };
                                let mut dests = vec![if self.private {
                                    Dest::Private(network)
                                } else {
                                    Dest::Public
                                }];
                                if self.private && out.heartbeats % PUBLIC_EVERY == 0 {
                                    dests.push(Dest::Public);
                                }
                                for d in dests {
                                    let delay =
                                        Duration::from_micros(rng.random_range(0..=max_delay_us));
                                    udp_flight.push((departs + delay, d, item));
                                }
                            }
                            if let Some(seq) = stamped {
                                // Drawn only when asked for: the other
                                // scenarios keep their random sequence.
                                let unstamped = self.unstamped_permille > 0
                                    && rng.random_range(0..1000u32) < self.unstamped_permille;
                                if !unstamped {
                                    stamps.push((
                                        departs + Duration::from_micros(50),
                                        seq,
                                        departs,
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            if alive
                && self.data_every.is_some()
                && !self.paused(PauseTarget::SenderProcess, now)
                && now >= next_data
            {
                next_data = now + self.data_every.unwrap_or(DATA_EVERY);
                // The first frame of an unarmed incarnation arms its fence.
                if fence.admit_frame(now) {
                    if cfg.answer_grace.is_some() {
                        // A send waiting for its answer (with a grace).
                        pacer.handle_traffic(now, RECEIVER);
                    }
                    out.data_sent.push(now);
                    let departs = self.departure(now);
                    out.last_departure = out.last_departure.max(Some(departs));
                    // Frames alternate between the paths; one on a cut
                    // network is lost (the sender does not know).
                    let network = next_data_network;
                    if self.data_paths > 1 {
                        next_data_network = 1 - next_data_network;
                    }
                    carried[usize::from(network)] = Some(now);
                    if !self.cut(network, departs) {
                        let delay = Duration::from_micros(rng.random_range(0..=max_delay_us));
                        tcp_flight.push_back((departs + delay, network));
                    }
                }
            }
            if out.fenced_at.is_none() && fence.is_fenced() {
                out.fenced_at = Some(fence.t_valid());
            }
            // ---- network into the receiver's kernel ----
            let mut arrived = Vec::new();
            udp_flight.retain(|&(t, dest, item)| {
                if t <= now {
                    arrived.push((t, dest, item));
                    false
                } else {
                    true
                }
            });
            arrived.sort_by_key(|(t, _, _)| *t);
            let capacity = self.queue_capacity;
            // A drop holds reports back unless it is the public queue's and
            // the receiver has private queues.
            let counts = |dest: Dest| !(self.private && dest == Dest::Public);
            let enqueue = |qs: &mut Queues, dest: Dest, item: Item, out: &mut DetectorOutcome| {
                let q = qs.get(dest);
                if q.items.len() < capacity {
                    q.items.push_back(item);
                } else {
                    q.drops += 1;
                    out.drops += 1;
                    if counts(dest) {
                        out.last_drop = Some(now);
                    }
                }
            };
            for (_, dest, item) in arrived {
                enqueue(&mut qs, dest, item, &mut out);
            }
            for &(t, count) in &floods {
                if t >= now && t < now + TICK {
                    for i in 0..count {
                        let dest = if self.private {
                            Dest::Private(u16::from(i % 2 == 1))
                        } else {
                            Dest::Public
                        };
                        enqueue(&mut qs, dest, Item::Junk, &mut out);
                    }
                }
            }
            for _ in 0..self.forged_per_tick(now) {
                enqueue(&mut qs, Dest::Public, Item::Junk, &mut out);
            }
            // ---- receiver ----
            while tcp_flight.front().is_some_and(|(t, _)| *t <= now) {
                if let Some((_, network)) = tcp_flight.pop_front() {
                    streams[usize::from(network)] += 1;
                }
            }
            if !self.paused(PauseTarget::ReceiverStream, now) {
                for (n, queued) in streams.iter_mut().enumerate() {
                    if std::mem::take(queued) > 0 {
                        let network = u16::try_from(n).unwrap_or(0);
                        monitor.handle_heard(now, watch(network));
                        if let Some(d) = self.answer_delay {
                            // Its acknowledgement goes back the same way.
                            if !self.cut(network, now) {
                                let delay =
                                    Duration::from_micros(rng.random_range(0..=max_delay_us));
                                answer_flight.push(now + d + delay);
                            }
                        }
                    }
                }
            }
            if !self.paused(PauseTarget::ReceiverReader, now) {
                // One reader per queue (the shell's members' reader and its
                // private thread), each with its own budget.
                let mut readers = vec![(HeartbeatQueue::Members, Dest::Public)];
                if self.private {
                    readers.push((HeartbeatQueue::Private, Dest::Private(0)));
                    readers.push((HeartbeatQueue::Private, Dest::Private(1)));
                    readers.push((HeartbeatQueue::Private, Dest::Barriers));
                }
                let mut barriers_back = Vec::new();
                for (from, dest) in readers {
                    let q = qs.get(dest);
                    if let (Dest::Private(n), false) = (dest, q.items.is_empty()) {
                        // The reader reads the queue's drop count with what
                        // it takes (a drop leaves a full queue behind, so it
                        // is dated when that queue is read).
                        monitor.handle_private_drop_count(now, watch(n), q.drops);
                    }
                    if let (Dest::Public, false) = (dest, q.items.is_empty()) {
                        // So does the members' reader (`SO_RXQ_OVFL` comes
                        // with each datagram): a drop is dated as the queue
                        // it left full is read, not at the next check.
                        monitor.handle_drop_count(now, q.drops);
                    }
                    for _ in 0..READ_PER_TICK {
                        let Some(item) = q.items.pop_front() else {
                            break;
                        };
                        match item {
                            Item::Heartbeat { network, pace, seq } => {
                                monitor.handle_heartbeat_ordered(
                                    now,
                                    watch(network),
                                    Epoch(1),
                                    from,
                                    pace,
                                    seq,
                                );
                            }
                            Item::Barrier { token } => barriers_back.push(token),
                            Item::Junk => {}
                        }
                    }
                }
                for token in barriers_back {
                    let Some((t, missing)) = &mut round else {
                        continue;
                    };
                    if *t != token {
                        continue;
                    }
                    *missing -= 1;
                    if *missing > 0 {
                        continue;
                    }
                    round = None;
                    let unread_streams: Vec<Watch> = (0..2u16)
                        .filter(|n| streams[usize::from(*n)] > 0)
                        .map(watch)
                        .collect();
                    if self.private {
                        let at_barrier = |q: &Queue| QueueAtBarrier {
                            drops: q.drops,
                            empty: q.items.is_empty(),
                        };
                        let queues = QueuesAtBarrier {
                            drops: qs.public.drops,
                            system_drops: 0,
                            members_empty: qs.public.items.is_empty(),
                            strays: None,
                            private: vec![
                                (watch(0), at_barrier(&qs.private[0])),
                                (watch(1), at_barrier(&qs.private[1])),
                            ],
                            unread_streams,
                        };
                        monitor.handle_barrier_queues(now, token, &queues);
                    } else {
                        // One queue: the barrier came out behind everything
                        // in it (as `Monitor::handle_barrier`).
                        let queues = QueuesAtBarrier {
                            drops: qs.public.drops,
                            system_drops: 0,
                            members_empty: true,
                            strays: None,
                            private: Vec::new(),
                            unread_streams,
                        };
                        monitor.handle_barrier_queues(now, token, &queues);
                    }
                }
            }
            // The receiver's heartbeats to the sender say WATCH while it is
            // busy (its heartbeat thread; the first one is the ask).
            if !self.paused(PauseTarget::ReceiverProcess, now) {
                let busy = self.receiver_busy_at(now);
                // Going quiet, its next heartbeat says so (no WATCH).
                let ended = !busy && receiver_was_busy;
                if ended || (busy && (!receiver_was_busy || now >= next_watch)) {
                    if busy && !receiver_was_busy {
                        monitor.handle_watch_sent(now, SENDER);
                    }
                    if ended {
                        // Nothing waits: the sender owes no answer (the
                        // end may overtake the ask).
                        monitor.handle_watch_ended(SENDER);
                    }
                    next_watch = now + cfg.interval;
                    watch_seq += 1;
                    for network in 0..2u16 {
                        if !self.cut(network, now) {
                            let delay = Duration::from_micros(rng.random_range(0..=max_delay_us));
                            watch_flight.push((now + delay, busy, watch_seq));
                        }
                    }
                }
                receiver_was_busy = busy;
            }
            if !self.paused(PauseTarget::ReceiverChecker, now) && now >= monitor.poll_timeout() {
                // The checker reads the drop counters at every check, so a
                // drop is dated close to when it happened.
                monitor.handle_drop_count(now, qs.public.drops);
                monitor.handle_system_drop_count(now, 0);
                monitor.handle_timeout(now);
            }
            while let Some(a) = monitor.poll_action() {
                match a {
                    MonitorAction::SendBarrier { token } => {
                        // Two copies, as for two CPUs; with private queues
                        // through our own, and every private queue's drops
                        // read as the round begins.
                        round = Some((token, 2));
                        let dest = if self.private {
                            for (n, q) in qs.private.iter().enumerate() {
                                let n = u16::try_from(n).unwrap_or(0);
                                monitor.handle_private_drop_count(now, watch(n), q.drops);
                            }
                            Dest::Barriers
                        } else {
                            Dest::Public
                        };
                        for _ in 0..2 {
                            enqueue(&mut qs, dest, Item::Barrier { token }, &mut out);
                        }
                    }
                    MonitorAction::Report(PathReport::PeerDown { .. }) => {
                        out.peer_reports.push(now)
                    }
                    MonitorAction::Report(PathReport::PathDown {
                        watch, failover, ..
                    }) => {
                        out.path_reports.push((now, watch.network));
                        if failover {
                            out.failovers.push((now, watch.network));
                        }
                    }
                    MonitorAction::Report(PathReport::PathFailover { watch }) => {
                        out.failovers.push((now, watch.network))
                    }
                    MonitorAction::Report(PathReport::PathAbandon { watch }) => {
                        out.abandons.push((now, watch.network))
                    }
                    MonitorAction::Report(_) => {}
                    // One sender in the model: nobody else to probe.
                    MonitorAction::ProbeNetwork { .. } => {}
                }
            }
            now += TICK;
        }
        out.barrier_rounds = monitor.stats().barrier_rounds;
        out.watched = monitor.watched().next().is_some();
        out
    }
}

impl DetectorOutcome {
    /// Accuracy (Theorem A.1): after every report, the sender let no frame
    /// out. Returns the first violation.
    pub fn accuracy_violation(&self) -> Option<String> {
        let first = self.peer_reports.first()?;
        self.data_sent
            .iter()
            .find(|&&t| t > *first)
            .map(|t| format!("reported dead at {first:?} but the sender sent a frame at {t:?}"))
    }
}
