//! One-way messages waiting for [`Endpoint::recv`](crate::Endpoint::recv).
//!
//! Sessions hand over released messages in runs (whatever one frame or one
//! read released), each run tagged with its session, so taking messages
//! costs one lock per batch and one counter update per run. Admission is
//! per peer node, across its sessions and epochs (one [`PeerLedger`] per
//! node, shared by its sessions): a session stops taking one-way messages
//! from its core while `incoming_per_peer` of its node's messages, or
//! `incoming_bytes_per_peer` bytes of them, wait here, which leaves them
//! unacknowledged and holds that sender back — and only that sender, and
//! only its one-way traffic. A peer that restarts finds what its earlier
//! incarnations left here counted against it, so restarting never buys it
//! more room. Queued runs name the ledger, not the session, so a session
//! that ended is not kept alive by the messages it delivered. High-priority messages go first, but a normal run that has
//! waited longer than the aging bound goes before them (hr-net's queues).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use surelink_proto::rpc::Priority;
use surelink_proto::{ChannelId, MessageBatch, NodeId, Time};

use rustc_hash::FxHashMap;

/// A one-way message taken by [`Endpoint::recv`](crate::Endpoint::recv).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Incoming {
    /// The sender.
    pub peer: NodeId,
    /// Its channel.
    pub channel: ChannelId,
    /// Its priority.
    pub priority: Priority,
    /// The message.
    pub body: Bytes,
}

/// One-way messages of one peer, one channel and one priority, handed
/// over together by [`Endpoint::recv_batches`](crate::Endpoint::recv_batches):
/// a frame's messages as the session released them (read as slices of
/// one buffer, with no reference count or allocation per message), or a
/// single message.
#[derive(Debug)]
pub struct IncomingBatch {
    repr: Repr,
}

#[derive(Debug)]
enum Repr {
    One(Incoming),
    /// A normal one-way stream's frame: one channel, normal priority.
    Frame {
        peer: NodeId,
        channel: ChannelId,
        batch: MessageBatch,
    },
}

impl IncomingBatch {
    pub(crate) fn one(m: Incoming) -> IncomingBatch {
        IncomingBatch { repr: Repr::One(m) }
    }

    /// A frame of a normal one-way stream on `channel`.
    pub(crate) fn frame(peer: NodeId, channel: ChannelId, batch: MessageBatch) -> IncomingBatch {
        IncomingBatch {
            repr: Repr::Frame {
                peer,
                channel,
                batch,
            },
        }
    }

    /// The sender.
    pub fn peer(&self) -> NodeId {
        match &self.repr {
            Repr::One(m) => m.peer,
            Repr::Frame { peer, .. } => *peer,
        }
    }

    /// The channel of all its messages.
    pub fn channel(&self) -> ChannelId {
        match &self.repr {
            Repr::One(m) => m.channel,
            Repr::Frame { channel, .. } => *channel,
        }
    }

    /// The priority of all its messages.
    pub fn priority(&self) -> Priority {
        match &self.repr {
            Repr::One(m) => m.priority,
            Repr::Frame { .. } => Priority::Normal,
        }
    }

    /// How many messages it holds.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::One(_) => 1,
            Repr::Frame { batch, .. } => batch.len(),
        }
    }

    /// Whether it holds none (never so when handed over).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The messages' bodies, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let it: Box<dyn Iterator<Item = &[u8]> + '_> = match &self.repr {
            Repr::One(m) => Box::new(std::iter::once(&m.body[..])),
            Repr::Frame { batch, .. } => Box::new(batch.iter().map(|(_, _, m)| m)),
        };
        it
    }

    /// The messages as [`Incoming`]s (a reference-counted slice each).
    pub fn into_messages(self) -> impl Iterator<Item = Incoming> {
        let it: Box<dyn Iterator<Item = Incoming>> = match self.repr {
            Repr::One(m) => Box::new(std::iter::once(m)),
            Repr::Frame { peer, batch, .. } => {
                Box::new(batch.into_messages().map(move |m| Incoming {
                    peer,
                    channel: m.channel,
                    priority: m.priority,
                    body: m.payload,
                }))
            }
        };
        it
    }

    /// What it counts in its peer's ledger: body bytes (a frame's framing
    /// included).
    pub(crate) fn bytes(&self) -> usize {
        match &self.repr {
            Repr::One(m) => m.body.len(),
            Repr::Frame { batch, .. } => batch.body_len(),
        }
    }
}

/// What one peer node's one-way messages hold in the queue, across all its
/// sessions and epochs.
#[derive(Debug)]
pub(crate) struct PeerLedger {
    pub(crate) node: NodeId,
    /// Messages queued and not yet taken.
    pub(crate) messages: AtomicUsize,
    /// Bytes of their bodies.
    pub(crate) bytes: AtomicUsize,
    /// A session of this node stopped taking for lack of room (so a stop
    /// is counted once).
    pub(crate) blocked: AtomicBool,
}

impl PeerLedger {
    fn new(node: NodeId) -> PeerLedger {
        PeerLedger {
            node,
            messages: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            blocked: AtomicBool::new(false),
        }
    }
}

struct Run {
    peer: Arc<PeerLedger>,
    at: Time,
    msgs: VecDeque<IncomingBatch>,
}

#[derive(Default)]
struct Queues {
    normal: VecDeque<Run>,
    high: VecDeque<Run>,
}

/// The queue and its wake-up.
pub(crate) struct IncomingQueue {
    queues: Mutex<Queues>,
    /// The ledger of every node with a session or with messages queued.
    ledgers: Mutex<FxHashMap<NodeId, Arc<PeerLedger>>>,
    pub(crate) ready: Notify,
    aging: Duration,
    /// One peer node's share: messages and their body bytes
    /// (`incoming_per_peer`, `incoming_bytes_per_peer`).
    pub(crate) bound: usize,
    pub(crate) byte_bound: usize,
    /// The application took messages with `recv_batches`: sessions queue
    /// frames whole from then on. Until then they queue single messages,
    /// made on the reader's side, as `recv_many` wants them (splitting
    /// frames on the receiver's side measured slower there).
    frames: AtomicBool,
}

impl IncomingQueue {
    pub(crate) fn new(aging: Duration, bound: usize, byte_bound: usize) -> IncomingQueue {
        IncomingQueue {
            queues: Mutex::new(Queues::default()),
            ledgers: Mutex::new(FxHashMap::default()),
            ready: Notify::new(),
            aging,
            bound,
            byte_bound,
            frames: AtomicBool::new(false),
        }
    }

    /// Whether sessions should queue frames whole (see `frames`).
    pub(crate) fn wants_frames(&self) -> bool {
        self.frames.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock()
    }

    /// The ledger of `node` (made on its first session).
    pub(crate) fn ledger(&self, node: NodeId) -> Arc<PeerLedger> {
        self.ledgers
            .lock()
            .entry(node)
            .or_insert_with(|| Arc::new(PeerLedger::new(node)))
            .clone()
    }

    /// Forgets `node`'s ledger if nothing of it is queued and no session
    /// holds it (its session ended and no new one started).
    pub(crate) fn forget(&self, node: NodeId) {
        let mut l = self.ledgers.lock();
        if let Some(x) = l.get(&node) {
            // Only the map and the ended session's handle hold it: no
            // other session, no queued run.
            if Arc::strong_count(x) <= 2 && x.messages.load(Ordering::Acquire) == 0 {
                l.remove(&node);
            }
        }
    }

    /// Per node with messages queued: their bytes now.
    pub(crate) fn bytes_per_node(&self) -> Vec<(NodeId, usize)> {
        self.ledgers
            .lock()
            .values()
            .map(|x| (x.node, x.bytes.load(Ordering::Relaxed)))
            .filter(|(_, b)| *b > 0)
            .collect()
    }

    /// Bytes queued for `node` now.
    pub(crate) fn bytes_of(&self, node: NodeId) -> usize {
        self.ledgers
            .lock()
            .get(&node)
            .map_or(0, |x| x.bytes.load(Ordering::Relaxed))
    }

    /// Queues messages a session released (counted against its admission
    /// already: [`IncomingBatch::len`] messages, [`IncomingBatch::bytes`]
    /// bytes each) and wakes a receiver.
    pub(crate) fn push(&self, peer: &Arc<PeerLedger>, now: Time, msgs: Vec<IncomingBatch>) {
        if msgs.is_empty() {
            return;
        }
        {
            // Nearly always all of one priority: the vector becomes the run
            // as it is (no copy of the messages).
            let (normal, high): (VecDeque<IncomingBatch>, VecDeque<IncomingBatch>) =
                if msgs.iter().all(|m| m.priority() == Priority::Normal) {
                    (msgs.into(), VecDeque::new())
                } else if msgs.iter().all(|m| m.priority() == Priority::High) {
                    (VecDeque::new(), msgs.into())
                } else {
                    msgs.into_iter()
                        .partition(|m| m.priority() == Priority::Normal)
                };
            let mut q = self.lock();
            if !normal.is_empty() {
                q.normal.push_back(Run {
                    peer: peer.clone(),
                    at: now,
                    msgs: normal,
                });
            }
            if !high.is_empty() {
                q.high.push_back(Run {
                    peer: peer.clone(),
                    at: now,
                    msgs: high,
                });
            }
        }
        self.ready.notify_waiters();
    }

    /// Moves up to `limit` messages into `buf`, splitting a frame that
    /// does not fit whole. Returns how many, and the nodes whose admission
    /// just reopened (their current sessions are to be driven again).
    pub(crate) fn take(
        &self,
        now: Time,
        buf: &mut Vec<Incoming>,
        limit: usize,
    ) -> (usize, Vec<NodeId>) {
        // Entries move out under the queue's lock; their messages are made
        // after it is released (the readers queue under it).
        let mut items: Vec<IncomingBatch> = Vec::new();
        let r = self.take_with(now, limit, |run, room| {
            let mut n = 0;
            let mut bytes = 0;
            while n < room {
                let Some(front) = run.msgs.front() else { break };
                if front.len() > room - n {
                    // Split: what is left stays in front, as single
                    // messages counted by their bodies (the frame's
                    // framing is no longer held).
                    let Some(frame) = run.msgs.pop_front() else {
                        break;
                    };
                    let (framed, counted) = (frame.bytes(), frame.len());
                    let msgs: Vec<Incoming> = frame.into_messages().collect();
                    let bodies: usize = msgs.iter().map(|m| m.body.len()).sum();
                    run.peer
                        .bytes
                        .fetch_sub(framed.saturating_sub(bodies), Ordering::AcqRel);
                    run.peer
                        .messages
                        .fetch_sub(counted.saturating_sub(msgs.len()), Ordering::AcqRel);
                    for m in msgs.into_iter().rev() {
                        run.msgs.push_front(IncomingBatch::one(m));
                    }
                    continue;
                }
                let Some(item) = run.msgs.pop_front() else {
                    break;
                };
                n += item.len();
                bytes += item.bytes();
                match item.repr {
                    // Single messages move as they are, until a frame:
                    // from there on, in order, after the lock.
                    Repr::One(m) if items.is_empty() => buf.push(m),
                    repr => items.push(IncomingBatch { repr }),
                }
            }
            (n, bytes)
        });
        for item in items {
            match item.repr {
                Repr::One(m) => buf.push(m),
                repr => buf.extend(IncomingBatch { repr }.into_messages()),
            }
        }
        r
    }

    /// Moves whole entries (frames or single messages) into `buf` until
    /// `limit` messages are taken (at least one entry, however many it
    /// holds). Returns how many messages, and the reopened nodes (as
    /// [`IncomingQueue::take`]).
    pub(crate) fn take_batches(
        &self,
        now: Time,
        buf: &mut Vec<IncomingBatch>,
        limit: usize,
    ) -> (usize, Vec<NodeId>) {
        if !self.frames.load(Ordering::Relaxed) {
            self.frames.store(true, Ordering::Relaxed);
        }
        let mut first = true;
        self.take_with(now, limit, |run, room| {
            let mut n = 0;
            let mut bytes = 0;
            while let Some(front) = run.msgs.front() {
                if !first && front.len() > room - n {
                    break;
                }
                first = false;
                let Some(item) = run.msgs.pop_front() else {
                    break;
                };
                n += item.len();
                bytes += item.bytes();
                buf.push(item);
                if n >= room {
                    break;
                }
            }
            (n, bytes)
        })
    }

    /// The taking loop: runs in priority order (high first, unless the
    /// oldest normal run aged past the bound); `from_run(run, room)`
    /// moves up to `room` messages out of a run's front and returns the
    /// messages and ledger bytes it took (0 messages: stop).
    fn take_with(
        &self,
        now: Time,
        limit: usize,
        mut from_run: impl FnMut(&mut Run, usize) -> (usize, usize),
    ) -> (usize, Vec<NodeId>) {
        let (bound, byte_bound) = (self.bound, self.byte_bound);
        let mut taken = 0;
        let mut reopened = Vec::new();
        let mut q = self.lock();
        while taken < limit {
            // High first, unless the oldest normal run has aged past it.
            let normal_aged = q.normal.front().is_some_and(|r| now >= r.at + self.aging)
                && q.high.front().is_none_or(|h| h.at + self.aging > now);
            let list = if !q.high.is_empty() && !normal_aged {
                &mut q.high
            } else {
                &mut q.normal
            };
            let Some(run) = list.front_mut() else { break };
            let (n, bytes) = from_run(run, limit - taken);
            taken += n;
            let before = run.peer.messages.fetch_sub(n, Ordering::AcqRel);
            let before_bytes = run.peer.bytes.fetch_sub(bytes, Ordering::AcqRel);
            if ((before >= bound && before - n < bound)
                || (before_bytes >= byte_bound && before_bytes - bytes < byte_bound)
                || run.peer.blocked.load(Ordering::Relaxed))
                && !reopened.contains(&run.peer.node)
            {
                run.peer.blocked.store(false, Ordering::Relaxed);
                reopened.push(run.peer.node);
            }
            if run.msgs.is_empty() {
                list.pop_front();
            } else if n == 0 {
                break;
            }
        }
        (taken, reopened)
    }
}
