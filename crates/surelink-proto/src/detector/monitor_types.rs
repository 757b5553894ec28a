//! The monitor's vocabulary: the paths it watches, what it reports and
//! asks the shell for, and its counters (the logic is in `monitor.rs`).

use crate::ids::NodeId;
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
    /// The path is silent.
    PathDown {
        /// Which path.
        watch: Watch,
        /// When it was last heard.
        last_heard: Time,
        /// Fail over: another path of the peer was heard since this one
        /// fell silent (later than a copy of the same round could arrive:
        /// `max_network_delay + interval / 2` after this path's last), so
        /// the peer is alive and this path is what failed.
        /// `false`: every path of the peer fell silent together — the
        /// peer is slow, paused or dead, or every network failed at once.
        /// There is then nowhere to move traffic, and tearing the path
        /// down would only cost a reconnection when the peer is heard
        /// again; a [`PathReport::PathFailover`] follows if another path
        /// is heard while this one stays silent.
        failover: bool,
    },
    /// A path reported down without `failover` stays silent while another
    /// path of its peer is heard: fail over now.
    PathFailover {
        /// Which path.
        watch: Watch,
    },
    /// A path failed over by a `PathFailover` is still silent a peer
    /// window (`timeout`) later while its peer is heard: give its
    /// connection up and dial anew. A `PathDown` with `failover` (this
    /// path alone fell silent: a path fault) is given up at once; a
    /// `PathFailover` follows the whole peer falling silent — a busy host,
    /// where the path is most likely late, not broken — so its traffic
    /// moves at once but its connection is kept that long: tearing it
    /// down costs a handshake on that busy host (a re-dial storm when
    /// hundreds of peers do it together).
    PathAbandon {
        /// Which path.
        watch: Watch,
    },
    /// The path is heard again.
    PathUp {
        /// Which path.
        watch: Watch,
    },
    /// Every path to the peer has been silent for the peer window (and the
    /// checks passed): the peer is dead, or fenced.
    PeerDown {
        /// The peer.
        peer: NodeId,
    },
    /// A peer reported dead is heard again (a fenced peer comes back as a
    /// new incarnation).
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
    /// [`Monitor::handle_barrier`](super::Monitor::handle_barrier) once all of them came out.
    SendBarrier {
        /// Identifies the round.
        token: u64,
    },
    /// Report this.
    Report(PathReport),
    /// A path on `network` was just reported down: ask other peers on
    /// that network — `probe_peers` of them, in turn — for the busy pace
    /// now ([`super::Pacer::handle_probe`]),
    /// so that if this node is the one cut off there, its idle pairs find
    /// out within the short window too, not the idle one — and so do
    /// their peers, through this node's reports and the role service's
    /// tables. At most once per network per `idle_path_timeout`.
    ProbeNetwork {
        /// The network.
        network: u16,
        /// The peer whose path was reported (it needs no probe).
        except: NodeId,
    },
}

/// The pace a heartbeat announces for its path, and so the path's window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pace {
    /// No `FAST`: the fence's heartbeats only; `idle_path_timeout`.
    #[default]
    Idle,
    /// `SLOW` without `FAST`: the fence's full rounds only (a slow pair,
    /// see [`crate::detector::Pacer`]); `slow_path_timeout()`, and the
    /// peer's dead window `slow_timeout()`.
    Slow,
    /// `FAST` and `STANDBY`: a busy pair's path that carries no data;
    /// `standby_path_timeout()`.
    Standby,
    /// `FAST`: heartbeats every `interval`, or data; `path_timeout`.
    Busy,
    /// `FAST` from a crowded sender: heartbeats every `interval × 2^shift`
    /// (standby or not), or data; `crowd_path_timeout(shift)`.
    Crowded(u8),
}

impl Pace {
    /// Whether the pace is one of a busy pair (`FAST`).
    pub fn is_busy(self) -> bool {
        matches!(self, Pace::Busy | Pace::Standby | Pace::Crowded(_))
    }

    /// The pace a heartbeat's flags announce.
    pub fn of(flags: u16) -> Pace {
        use super::datagram::{pace_shift, FLAG_FAST, FLAG_SLOW, FLAG_STANDBY};
        match (flags & FLAG_FAST != 0, flags & FLAG_STANDBY != 0) {
            (false, _) if flags & FLAG_SLOW != 0 => Pace::Slow,
            (false, _) => Pace::Idle,
            (true, _) if pace_shift(flags) > 0 => Pace::Crowded(pace_shift(flags)),
            (true, true) => Pace::Standby,
            (true, false) => Pace::Busy,
        }
    }
}

/// Which receive queue a heartbeat came out of (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeartbeatQueue {
    /// The queue whose sources are members' known addresses (and ours).
    /// With one queue for everything, every heartbeat comes out of this one.
    #[default]
    Members,
    /// The queue of every other source.
    Strays,
    /// The path's own private queue (see "Private queues").
    Private,
}

/// A receive queue as a barrier round ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAtBarrier {
    /// Its drop counter's total.
    pub drops: u64,
    /// Whether it was empty, with nothing read from it still unprocessed.
    pub empty: bool,
}

/// The strays' queue as a barrier round ends (see
/// [`Monitor::handle_barrier_steered`](super::Monitor::handle_barrier_steered)).
pub type StraysAtBarrier = QueueAtBarrier;

/// Every queue as a round ends, for a shell whose barriers come out of a
/// private socket of its own (see [`Monitor::handle_barrier_queues`](super::Monitor::handle_barrier_queues)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuesAtBarrier {
    /// The drops that hold back every path that is not private: the
    /// members' queue plus `system_drops` (as [`Monitor::handle_drop_count`](super::Monitor::handle_drop_count)).
    pub drops: u64,
    /// The drops every queue's packets may meet (interfaces, per-CPU
    /// backlogs), as [`Monitor::handle_system_drop_count`](super::Monitor::handle_system_drop_count).
    pub system_drops: u64,
    /// Whether the members' queue was empty with nothing in hand.
    pub members_empty: bool,
    /// The strays' queue, when the port is split.
    pub strays: Option<QueueAtBarrier>,
    /// Each private queue.
    pub private: Vec<(Watch, QueueAtBarrier)>,
    /// Paths whose connections held bytes not yet read, or whose reader
    /// was between a read and its stamp, as the round ended (see "Data as
    /// heartbeats"). The shell need look only at [`Monitor::round_paths`](super::Monitor::round_paths).
    pub unread_streams: Vec<Watch>,
}

/// Counters, for experiments and stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorStats {
    /// Paths reported down.
    pub reported_down: u64,
    /// Of them, reported without failover (every path of the peer was
    /// silent: see [`PathReport::PathDown`]).
    pub held: u64,
    /// Paths failed over by [`PathReport::PathFailover`] and given up a
    /// peer window later, still silent ([`PathReport::PathAbandon`]).
    pub abandoned: u64,
    /// Peers reported dead.
    pub reported_dead: u64,
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
    /// Unsorted suspects not reported because the strays' queue dropped
    /// something since their window began, or was not empty.
    pub saved_by_stray: u64,
    /// Suspects reported although the strays' queue dropped datagrams
    /// during their window: junk that would have held them back with one
    /// queue.
    pub reported_through_stray_drops: u64,
    /// Private suspects not reported because their private queue dropped
    /// something since their window began, or was not empty.
    pub saved_by_private: u64,
    /// Private suspects reported although the members' queue dropped
    /// datagrams during their window: a flood forging members' addresses
    /// that would have held them back without private queues.
    pub reported_through_member_drops: u64,
    /// Suspects not reported because one of their connections held bytes
    /// not yet read as the round ended: data the peer sent, waiting behind
    /// our own stalled reader.
    pub saved_by_stream: u64,
}
