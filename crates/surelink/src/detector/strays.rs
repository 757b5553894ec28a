//! The heartbeat port split by source (see `surelink_sys::steer` and the
//! core monitor's "Two queues"): which source addresses are steered to the
//! members' queue, the strays' reader, and the counts of junk by reason.
//!
//! A source address is steered once one of these vouches for it: it is
//! ours (the barriers come from it), it is configured for a peer we dial,
//! or a member's authenticated heartbeat came from it. An address is never
//! taken off the list while the detector runs (the monitor relies on it: a
//! path whose heartbeat came out of the members' queue keeps coming out of
//! it). The list is bounded: [`MAX_SOURCES_PER_PEER`] per peer and
//! `surelink_sys::steer::MAX_STEERED` in all; a source past either stays a
//! stray, which only makes its path wait for the strays' queue as before.
//!
//! The strays' reader reads in batches, checks the cheap things first
//! (format, cluster, a known sender) and the tag last, and reads at most
//! [`STRAYS_PER_SLICE`] datagrams per [`SLICE`]: what a flood sends beyond
//! that is dropped by the kernel, costing this process nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use surelink_proto::detector::datagram::{self, Datagram};
use surelink_proto::detector::{HeartbeatQueue, Pace, StraysAtBarrier, Watch};
use surelink_proto::{Epoch, NodeId};
use surelink_sys::steer::{Batch, MAX_STEERED};

use super::{CheckerState, Detector, READ_POLL};

/// Source addresses steered per peer (a connection per network, plus a
/// move or two).
pub(super) const MAX_SOURCES_PER_PEER: usize = 8;
/// The strays' reader's budget: datagrams per slice.
const STRAYS_PER_SLICE: u64 = 500;
/// The slice (so at most 50 000 stray datagrams a second are read).
const SLICE: Duration = Duration::from_millis(10);

/// Which source addresses the members' queue takes.
#[derive(Debug, Default)]
pub(super) struct Steering {
    listed: BTreeSet<Ipv4Addr>,
    by_peer: BTreeMap<NodeId, BTreeSet<Ipv4Addr>>,
}

/// Datagrams refused, by reason (both queues).
#[derive(Debug, Default)]
pub(super) struct Junk {
    /// Not a heartbeat or barrier we can decode.
    pub(super) malformed: AtomicU64,
    /// Another cluster's, or claiming to be from this node.
    pub(super) foreign: AtomicU64,
    /// From a node we hold no heartbeat key for.
    pub(super) stranger: AtomicU64,
    /// A tag that does not verify.
    pub(super) bad_tag: AtomicU64,
    /// An (epoch, seq) already seen.
    pub(super) replay: AtomicU64,
    /// A barrier not from our barrier socket or with a stale token.
    pub(super) barrier: AtomicU64,
}

/// Why a datagram was refused (its counter in [`Junk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    Malformed,
    Foreign,
    Stranger,
    BadTag,
    Replay,
    Barrier,
}

/// Refusals by reason, for stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefusedCounts {
    /// Not a heartbeat or barrier.
    pub malformed: u64,
    /// Another cluster's, or claiming to be this node.
    pub foreign: u64,
    /// From a node with no heartbeat key here (not a member); insecure:
    /// from a node we neither dial nor hold a connection from.
    pub stranger: u64,
    /// A tag that does not verify.
    pub bad_tag: u64,
    /// Replayed.
    pub replay: u64,
    /// A barrier that is not ours.
    pub barrier: u64,
}

/// What the strays' side reports, for stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StraysSnapshot {
    /// Whether the port is split (the kernel took the steering program).
    pub split: bool,
    /// Source addresses steered to the members' queue.
    pub steered: u64,
    /// Datagrams the kernel dropped in the strays' queue (a flood).
    pub dropped: u64,
    /// Datagrams read from the strays' queue.
    pub read: u64,
    /// Sources not steered because a bound was reached.
    pub not_steered: u64,
}

impl Junk {
    fn counter(&self, r: Refused) -> &AtomicU64 {
        match r {
            Refused::Malformed => &self.malformed,
            Refused::Foreign => &self.foreign,
            Refused::Stranger => &self.stranger,
            Refused::BadTag => &self.bad_tag,
            Refused::Replay => &self.replay,
            Refused::Barrier => &self.barrier,
        }
    }

    pub(super) fn snapshot(&self) -> RefusedCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RefusedCounts {
            malformed: l(&self.malformed),
            foreign: l(&self.foreign),
            stranger: l(&self.stranger),
            bad_tag: l(&self.bad_tag),
            replay: l(&self.replay),
            barrier: l(&self.barrier),
        }
    }
}

/// A heartbeat that passed the checks that need no lock.
pub(super) struct Checked {
    pub(super) node: NodeId,
    pub(super) epoch: Epoch,
    pub(super) seq: u64,
    /// Its sender's private port for us (0: none).
    pub(super) port: u16,
    /// Its handshake flags (`datagram::FLAG_*`).
    pub(super) flags: u16,
}

impl Detector {
    /// Counts a refused datagram.
    pub(super) fn refuse(&self, why: Refused) {
        self.junk.counter(why).fetch_add(1, Ordering::Relaxed);
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Cheap checks first (format, cluster, a sender we hold a key for),
    /// the tag last. Barriers are not handled here.
    pub(super) fn check_heartbeat(&self, bytes: &[u8]) -> Result<Checked, Refused> {
        let Ok(Datagram::Heartbeat {
            cluster,
            node,
            epoch,
            seq,
            port,
            flags,
        }) = datagram::decode_datagram(bytes)
        else {
            return Err(Refused::Malformed);
        };
        if cluster != self.cluster || node == self.node {
            return Err(Refused::Foreign);
        }
        if let Some(keys) = &self.hb_keys {
            let keys = keys.lock();
            let Some(v) = keys.get(&node) else {
                return Err(Refused::Stranger);
            };
            if !v.iter().any(|k| datagram::verify_heartbeat(bytes, k)) {
                return Err(Refused::BadTag);
            }
        } else if !self.knows(node) {
            // Insecure: no key says who sent it. A node we neither dial
            // nor hold a connection from is nobody we watch — else every
            // forged name would become state here and a destination of
            // our heartbeats.
            return Err(Refused::Stranger);
        }
        Ok(Checked {
            node,
            epoch,
            seq,
            port,
            flags,
        })
    }

    /// Whether `node` is one we dial (a destination) or hold a
    /// connection from.
    fn knows(&self, node: NodeId) -> bool {
        fn has<V>(m: &BTreeMap<(NodeId, usize), V>, node: NodeId) -> bool {
            m.range((node, 0)..=(node, usize::MAX)).next().is_some()
        }
        has(&self.dests.lock(), node) || has(&self.heard.lock(), node)
    }

    /// Hands an authentic heartbeat to the monitor (under the checker
    /// lock), unless it is a replay.
    pub(super) fn accept_heartbeat(
        &self,
        c: &mut CheckerState,
        network: usize,
        hb: &Checked,
        from: SocketAddr,
        queue: HeartbeatQueue,
    ) -> Result<(), Refused> {
        let net = u16::try_from(network).unwrap_or(u16::MAX);
        if self.hb_keys.is_some() && c.fresh.is_newest(hb.node, net, hb.epoch, hb.seq) {
            // The other copy of one already taken (public and private).
            return Ok(());
        }
        if self.hb_keys.is_some() && !c.fresh.accept(hb.node, net, hb.epoch, hb.seq) {
            return Err(Refused::Replay);
        }
        self.heartbeats_received.fetch_add(1, Ordering::Relaxed);
        // Only an authenticated heartbeat's source becomes where ours go
        // (one address per member and network), and is steered; its port
        // field, where they go privately (0: the sender has no private
        // socket for us, e.g. a new process: public only).
        if self.dests.lock().insert((hb.node, network), from) != Some(from) {
            self.greet(hb.node);
        }
        let now = self.gate.now();
        {
            let mut hs = self.handshakes.lock();
            hs.entry((hb.node, network))
                .or_default()
                .handle_heartbeat(now, from, hb.epoch, hb.port, hb.flags);
        }
        let watch = Watch {
            peer: hb.node,
            network: net,
        };
        if hb.flags & datagram::FLAG_COMMITTED == 0 {
            // The sender counts its public copy again (its peer's acks
            // stopped): the path is no longer private.
            c.monitor.handle_private_uncommitted(watch, hb.epoch);
        }
        if queue != HeartbeatQueue::Private {
            self.steer_source(hb.node, from.ip());
            self.ensure_private(c, hb.node, network, from);
        }
        c.monitor
            .handle_heartbeat_ordered(now, watch, hb.epoch, queue, Pace::of(hb.flags), hb.seq);
        if c.monitor.poll_timeout().as_nanos() < self.checker_wake.load(Ordering::Relaxed) {
            // A narrower window than the checker sleeps towards.
            if let Some(t) = self.checker_thread.get() {
                t.unpark();
            }
        }
        if self
            .pacer
            .lock()
            .handle_flags_ordered(now, hb.node, hb.flags, hb.epoch, hb.seq)
        {
            self.wake_sender();
        }
        Ok(())
    }

    /// Steers `ip` to the members' queue on behalf of `peer` (see the
    /// module docs for the bounds).
    pub(super) fn steer_source(&self, peer: NodeId, ip: IpAddr) {
        let IpAddr::V4(ip) = ip else { return };
        if !self.split() {
            return;
        }
        let mut s = self.steering.lock();
        if s.listed.contains(&ip) {
            return;
        }
        let full = s.listed.len() >= MAX_STEERED
            || s.by_peer
                .get(&peer)
                .is_some_and(|v| v.len() >= MAX_SOURCES_PER_PEER);
        if full {
            self.not_steered.fetch_add(1, Ordering::Relaxed);
            return;
        }
        s.by_peer.entry(peer).or_default().insert(ip);
        s.listed.insert(ip);
        self.install(&s);
    }

    /// Steers our own addresses (where the barriers come from).
    pub(super) fn steer_own(&self, ips: &[Ipv4Addr]) {
        let mut s = self.steering.lock();
        s.listed.extend(ips.iter().copied());
        self.install(&s);
    }

    fn install(&self, s: &Steering) {
        let list: Vec<Ipv4Addr> = s.listed.iter().copied().collect();
        for sock in self.socks() {
            if let Err(e) = sock.steer(&list) {
                // Its sources stay strays: their paths wait for the strays'
                // queue, as with one queue.
                warn!(error = %e, "heartbeat steering not updated");
            }
        }
    }

    /// Whether the port is split in two queues.
    pub(super) fn split(&self) -> bool {
        self.strays.lock().iter().any(Option::is_some)
    }

    /// The strays' queues' drop counts, summed.
    pub(super) fn stray_drops(&self) -> u64 {
        self.strays
            .lock()
            .iter()
            .flatten()
            .map(|s| s.queue_state().map_or(u64::MAX, |q| u64::from(q.drops)))
            .fold(0u64, u64::wrapping_add)
    }

    /// The strays' queues as a barrier round ends (called with the checker
    /// lock held, so a stray reader holding a datagram cannot hand it on
    /// meanwhile). The queue state is read before the in-hand count: a
    /// datagram taken before the queue was seen empty is then either
    /// processed already or still counted in hand.
    pub(super) fn strays_at_barrier(&self) -> StraysAtBarrier {
        let mut drops = 0u64;
        let mut empty = true;
        for s in self.strays.lock().iter().flatten() {
            match s.queue_state() {
                Ok(q) => {
                    drops = drops.wrapping_add(u64::from(q.drops));
                    empty &= q.queued == 0;
                }
                Err(_) => empty = false,
            }
        }
        empty &= self.stray_in_hand.load(Ordering::SeqCst) == 0;
        StraysAtBarrier { drops, empty }
    }

    /// The strays' reader of `network`: batches, within its budget.
    pub(super) fn strays_thread(self: Arc<Self>, network: usize) {
        let Some(sock) = self.strays.lock().get(network).cloned().flatten() else {
            return;
        };
        let mut batch = Batch::default();
        let mut slice = Instant::now();
        let mut read = 0u64;
        while !self.closed.load(Ordering::Relaxed) {
            if read >= STRAYS_PER_SLICE {
                let next = slice + SLICE;
                let now = Instant::now();
                if next > now {
                    std::thread::park_timeout(next - now);
                    continue;
                }
            }
            if slice.elapsed() >= SLICE {
                slice = Instant::now();
                read = 0;
            }
            match sock.wait(READ_POLL) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    debug!(network, error = %e, "strays' wait failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
            // Counted in hand from before the datagrams leave the queue
            // until they are processed (see `strays_at_barrier`).
            self.stray_in_hand.fetch_add(1, Ordering::SeqCst);
            let n = sock.recv_batch(&mut batch).unwrap_or(0);
            read += n as u64;
            self.strays_read.fetch_add(n as u64, Ordering::Relaxed);
            if n > 0 {
                // Its drops dated as the queue is read, not at the
                // checker's next wake (which may be a window away).
                let drops = self.stray_drops();
                let now = self.gate.now();
                self.checker
                    .lock()
                    .monitor
                    .handle_stray_drop_count(now, drops);
            }
            for (bytes, from) in batch.iter() {
                let Some(from) = from else {
                    self.refuse(Refused::Malformed);
                    continue;
                };
                let hb = match self.check_heartbeat(bytes) {
                    Ok(hb) => hb,
                    Err(why) => {
                        // Our barriers come from a steered address: one
                        // here is someone else's.
                        let why = match datagram::decode_datagram(bytes) {
                            Ok(Datagram::Barrier { .. }) => Refused::Barrier,
                            _ => why,
                        };
                        self.refuse(why);
                        continue;
                    }
                };
                let mut c = self.checker.lock();
                if let Err(why) =
                    self.accept_heartbeat(&mut c, network, &hb, from, HeartbeatQueue::Strays)
                {
                    self.refuse(why);
                }
                self.dispatch(&mut c);
            }
            self.stray_in_hand.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub(super) fn strays_snapshot(&self) -> StraysSnapshot {
        StraysSnapshot {
            split: self.split(),
            steered: self.steering.lock().listed.len() as u64,
            dropped: if self.split() { self.stray_drops() } else { 0 },
            read: self.strays_read.load(Ordering::Relaxed),
            not_steered: self.not_steered.load(Ordering::Relaxed),
        }
    }
}
