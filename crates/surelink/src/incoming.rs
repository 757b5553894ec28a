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
use surelink_proto::{ChannelId, NodeId, Time};

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
    msgs: VecDeque<Incoming>,
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
}

impl IncomingQueue {
    pub(crate) fn new(aging: Duration) -> IncomingQueue {
        IncomingQueue {
            queues: Mutex::new(Queues::default()),
            ledgers: Mutex::new(FxHashMap::default()),
            ready: Notify::new(),
            aging,
        }
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
    /// already) and wakes a receiver.
    pub(crate) fn push(&self, peer: &Arc<PeerLedger>, now: Time, msgs: Vec<Incoming>) {
        if msgs.is_empty() {
            return;
        }
        {
            // Nearly always all of one priority: the vector becomes the run
            // as it is (no copy of the messages).
            let (normal, high): (VecDeque<Incoming>, VecDeque<Incoming>) =
                if msgs.iter().all(|m| m.priority == Priority::Normal) {
                    (msgs.into(), VecDeque::new())
                } else if msgs.iter().all(|m| m.priority == Priority::High) {
                    (VecDeque::new(), msgs.into())
                } else {
                    msgs.into_iter()
                        .partition(|m| m.priority == Priority::Normal)
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

    /// Moves up to `limit` messages into `buf`. Returns how many, and the
    /// nodes whose admission just reopened (their current sessions are to
    /// be driven again).
    pub(crate) fn take(
        &self,
        now: Time,
        buf: &mut Vec<Incoming>,
        limit: usize,
        bound: usize,
        byte_bound: usize,
    ) -> (usize, Vec<NodeId>) {
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
            let n = run.msgs.len().min(limit - taken);
            let from = buf.len();
            buf.extend(run.msgs.drain(..n));
            let bytes: usize = buf[from..].iter().map(|m| m.body.len()).sum();
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
            }
        }
        (taken, reopened)
    }
}
