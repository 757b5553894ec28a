//! Private heartbeat queues (the core monitor's "Private queues"): a
//! socket per peer and network, connected to the peer's heartbeat address
//! on a port only the peer learns (in our authenticated heartbeats); a
//! private socket per network for our own barriers; one thread reading all
//! of them through an epoll set; and the end of a barrier round, which
//! reads every queue's state.
//!
//! Why the barriers moved here: a flood forging a member's address fills
//! the members' queue, and a barrier dropped there ends its round with no
//! report. Through a private socket a barrier still proves the per-CPU
//! backlogs clear up to when it was sent; every queue is then proven clear
//! by being empty with nothing in hand.
//!
//! Bounds: one private socket per (peer, network) whose authenticated
//! heartbeat we accepted, at most [`MAX_PRIVATE`] in all (past it a path
//! simply stays public, as before).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;
use tracing::{debug, warn};

use surelink_proto::detector::datagram::{self, Datagram};
use surelink_proto::detector::{HeartbeatQueue, QueueAtBarrier, QueuesAtBarrier, Watch};
use surelink_proto::{NodeId, Time};
use surelink_sys::steer::Batch;
use surelink_sys::{PollRegistry, Poller, PrivateSocket};

use super::strays::Refused;
use super::{CheckerState, DelayPoint, Detector, READ_POLL};

/// With more private sockets than this, the private thread lets arrivals
/// gather for [`GATHER`] after each wake-up.
const GATHER_ABOVE: usize = 64;
/// How long arrivals gather (see [`GATHER_ABOVE`]).
const GATHER: Duration = Duration::from_millis(3);

/// Private sockets in all (members × networks, with room to spare).
pub(super) const MAX_PRIVATE: usize = 4096;
/// Every this many heartbeats a copy also goes to a peer's public port,
/// so a peer that restarted (and forgot our port) hears us anyway.
pub(super) const PUBLIC_EVERY: u64 = 8;

/// What a token of the epoll set stands for.
#[derive(Clone)]
enum Slot {
    /// A peer's private socket on a network.
    Peer(NodeId, usize, Arc<PrivateSocket>),
    /// Our barriers' socket on a network (its index).
    Barrier(usize, Arc<PrivateSocket>),
}

/// The private sockets and the epoll set's registry.
pub(super) struct Private {
    registry: PollRegistry,
    by_path: BTreeMap<(NodeId, usize), (u64, Arc<PrivateSocket>)>,
    by_token: FxHashMap<u64, Slot>,
    next_token: u64,
    /// Where each network's barriers are sent.
    barrier_to: Vec<SocketAddr>,
}

/// The address a private socket binds on the network of `local` (a
/// wildcard listener's barriers go over loopback).
fn bind_ip(local: SocketAddr) -> IpAddr {
    match local.ip() {
        ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        ip => ip,
    }
}

impl Private {
    /// The epoll set (for the reading thread) and the barrier sockets, one
    /// per network, each connected to that network's barrier sender.
    pub(super) fn open(barrier_from: &[SocketAddr]) -> std::io::Result<(Private, Poller)> {
        let (poller, registry) = Poller::new()?;
        let mut p = Private {
            registry,
            by_path: BTreeMap::new(),
            by_token: FxHashMap::default(),
            next_token: 1,
            barrier_to: Vec::new(),
        };
        for (network, from) in barrier_from.iter().enumerate() {
            let ip = bind_ip(*from);
            let s = Arc::new(PrivateSocket::open(ip, SocketAddr::new(ip, from.port()))?);
            p.barrier_to.push(s.local_addr()?);
            p.add(Slot::Barrier(network, s))?;
        }
        Ok((p, poller))
    }

    fn add(&mut self, slot: Slot) -> std::io::Result<u64> {
        let token = self.next_token;
        self.next_token += 1;
        let fd = match &slot {
            Slot::Peer(_, _, s) | Slot::Barrier(_, s) => s.fd(),
        };
        self.registry.add(fd, token)?;
        self.by_token.insert(token, slot);
        Ok(token)
    }

    fn remove(&mut self, token: u64) {
        if let Some(Slot::Peer(_, _, s) | Slot::Barrier(_, s)) = self.by_token.remove(&token) {
            let _ = self.registry.remove(s.fd());
        }
    }

    /// Replaces network `network`'s barrier socket, found broken (see
    /// [`PrivateSocket::is_intact`]), with a new one connected to the same
    /// sender. False if `old` was replaced already or no new one opens.
    fn replace_barrier(&mut self, network: usize, old: &Arc<PrivateSocket>) -> bool {
        let Some(token) = self.by_token.iter().find_map(|(t, s)| match s {
            Slot::Barrier(n, s) if *n == network && Arc::ptr_eq(s, old) => Some(*t),
            _ => None,
        }) else {
            return false;
        };
        let opened =
            PrivateSocket::open(old.peer().ip(), old.peer()).and_then(|s| Ok((s.local_addr()?, s)));
        let sock = match opened {
            Ok((to, s)) => {
                if let Some(t) = self.barrier_to.get_mut(network) {
                    *t = to;
                }
                Arc::new(s)
            }
            Err(e) => {
                warn!(network, error = %e, "barrier socket broken and not replaced: no report until it is");
                return false;
            }
        };
        self.remove(token);
        if let Err(e) = self.add(Slot::Barrier(network, sock)) {
            warn!(network, error = %e, "barrier socket not watched");
        }
        true
    }

    /// Where this network's barriers go.
    pub(super) fn barrier_targets(&self) -> &[SocketAddr] {
        &self.barrier_to
    }

    /// Our private port for `peer` on `network` (0: none).
    pub(super) fn port(&self, peer: NodeId, network: usize) -> u16 {
        self.by_path
            .get(&(peer, network))
            .map_or(0, |(_, s)| s.port())
    }

    /// Closes a departed peer's sockets.
    pub(super) fn forget(&mut self, peer: NodeId) {
        let gone: Vec<(NodeId, usize)> = self
            .by_path
            .keys()
            .filter(|(p, _)| *p == peer)
            .copied()
            .collect();
        for k in gone {
            if let Some((token, _)) = self.by_path.remove(&k) {
                self.remove(token);
            }
        }
    }

    /// Shuts every socket down: the reading thread wakes (the endpoint
    /// closes).
    pub(super) fn shutdown(&self) {
        for slot in self.by_token.values() {
            match slot {
                Slot::Peer(_, _, s) | Slot::Barrier(_, s) => s.shutdown(),
            }
        }
    }

    /// Closes every socket (the endpoint closes).
    pub(super) fn clear(&mut self) {
        let tokens: Vec<u64> = self.by_token.keys().copied().collect();
        for t in tokens {
            self.remove(t);
        }
        self.by_path.clear();
    }

    fn queues(&self) -> impl Iterator<Item = (Watch, &PrivateSocket)> + '_ {
        self.by_path.iter().filter_map(|((peer, network), (_, s))| {
            let network = u16::try_from(*network).ok()?;
            Some((
                Watch {
                    peer: *peer,
                    network,
                },
                s.as_ref(),
            ))
        })
    }
}

impl Detector {
    /// An authenticated heartbeat from `peer` on `network` came from
    /// `from`: make sure our private socket for it is connected there. A
    /// socket connected elsewhere (the peer moved) is replaced, and the
    /// monitor told the path is public until the peer learns the new port.
    pub(super) fn ensure_private(
        &self,
        c: &mut CheckerState,
        peer: NodeId,
        network: usize,
        from: SocketAddr,
    ) {
        if self
            .private
            .lock()
            .by_path
            .get(&(peer, network))
            .is_some_and(|(_, s)| s.peer() == from)
        {
            return;
        }
        self.open_private(c, peer, network, from);
    }

    /// Opens our private socket for `peer` on `network`, connected to
    /// `from`, in place of the one there (if any).
    fn open_private(&self, c: &mut CheckerState, peer: NodeId, network: usize, from: SocketAddr) {
        let mut p = self.private.lock();
        let old = p.by_path.get(&(peer, network)).map(|(t, _)| *t);
        if old.is_none() && p.by_path.len() >= MAX_PRIVATE {
            return;
        }
        let Some(local) = self.local_addrs().get(network).copied() else {
            return;
        };
        let sock = match PrivateSocket::open(bind_ip(local), from) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                debug!(%peer, network, error = %e, "no private heartbeat socket");
                return;
            }
        };
        match p.add(Slot::Peer(peer, network, sock.clone())) {
            Ok(token) => {
                if let Some(old) = old {
                    p.remove(old);
                    if let Ok(network) = u16::try_from(network) {
                        c.monitor.handle_private_reset(Watch { peer, network });
                    }
                }
                p.by_path.insert((peer, network), (token, sock));
            }
            Err(e) => warn!(%peer, network, error = %e, "private heartbeat socket not watched"),
        }
    }

    /// Reads every private socket: peers' heartbeats and our barriers.
    pub(super) fn private_thread(self: Arc<Self>, mut poller: Poller) {
        let mut ready = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        let mut batch = Batch::default();
        while !self.closed.load(Ordering::Relaxed) {
            if let Err(e) = poller.wait(READ_POLL, &mut ready) {
                debug!(error = %e, "private sockets' wait failed");
                std::thread::sleep(READ_POLL);
                continue;
            }
            if self.private.lock().by_token.len() > GATHER_ABOVE {
                // Many peers' heartbeats arrive spread out: let a few
                // gather rather than wake for each (a wake-up costs more
                // than the datagrams it reads). Heartbeats and barriers
                // are then read up to this much later: heard later (never
                // a false silence), barriers back later (a report later).
                std::thread::sleep(GATHER);
                // Edge-triggered: the sockets already reported stay in the
                // list (a second wait does not report them again).
                let mut more = Vec::new();
                let _ = poller.wait(Duration::ZERO, &mut more);
                ready.extend(more);
                ready.sort_unstable();
                ready.dedup();
            }
            // One look at the sockets per wake-up, not one per socket.
            slots.clear();
            {
                let p = self.private.lock();
                slots.extend(ready.iter().filter_map(|t| p.by_token.get(t).cloned()));
            }
            for slot in slots.drain(..) {
                let sock = match &slot {
                    Slot::Peer(_, _, s) | Slot::Barrier(_, s) => s.clone(),
                };
                // Edge-triggered: read until the queue is empty. A batch
                // that came back short emptied it (what arrives later is a
                // new edge): no extra call just to hear "nothing left".
                let mut errors = 0;
                loop {
                    let n = match sock.recv_batch(&mut batch) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) => {
                            if !sock.is_intact() {
                                self.replace_broken(&slot, &e);
                                break;
                            }
                            // A pending error (an ICMP report) taken by
                            // the read: what is queued behind it is read
                            // now, not at the next edge.
                            errors += 1;
                            if errors > 1 {
                                break;
                            }
                            continue;
                        }
                    };
                    let drained = n < surelink_sys::steer::BATCH;
                    self.stall(DelayPoint::Reader);
                    for (bytes, from) in batch.iter() {
                        match &slot {
                            Slot::Barrier(..) => self.barrier_datagram(bytes),
                            Slot::Peer(peer, network, _) => {
                                self.private_heartbeat(*peer, *network, bytes, from);
                            }
                        }
                    }
                    if drained {
                        break;
                    }
                }
                if let (Slot::Peer(peer, network, _), Ok(q)) = (&slot, sock.queue_state()) {
                    // Its drop count with what was read: a drop leaves a
                    // full queue behind, so it is dated when that is read
                    // (not only when a round next begins).
                    if let Ok(network) = u16::try_from(*network) {
                        let w = Watch {
                            peer: *peer,
                            network,
                        };
                        let now = self.gate.now();
                        self.checker.lock().monitor.handle_private_drop_count(
                            now,
                            w,
                            u64::from(q.drops),
                        );
                    }
                }
            }
        }
    }

    /// `slot`'s socket was destroyed from outside (`e` said so): it will
    /// never receive again. A barrier socket is replaced and the round
    /// under way sends its barriers afresh; a peer's is replaced too, and
    /// the path counts as public until the peer learns the new port (from
    /// our next heartbeat). Without this, every later round's barrier is
    /// lost and no path is ever reported down again.
    fn replace_broken(&self, slot: &Slot, e: &std::io::Error) {
        match slot {
            Slot::Barrier(network, s) => {
                if !self.private.lock().replace_barrier(*network, s) {
                    return;
                }
                warn!(network, error = %e, "barrier socket destroyed from outside: replaced");
                self.restart_round();
            }
            Slot::Peer(peer, network, s) => {
                {
                    let mut c = self.checker.lock();
                    let current = self
                        .private
                        .lock()
                        .by_path
                        .get(&(*peer, *network))
                        .is_some_and(|(_, cur)| Arc::ptr_eq(cur, s));
                    if !current {
                        return;
                    }
                    warn!(%peer, network, error = %e, "private heartbeat socket destroyed from outside: replaced");
                    self.open_private(&mut c, *peer, *network, s.peer());
                }
                self.handshakes
                    .lock()
                    .entry((*peer, *network))
                    .or_default()
                    .handle_socket_replaced();
            }
        }
    }

    /// Checks every barrier socket and replaces the broken ones (after a
    /// round's barriers were lost: an error report may have been missed).
    pub(super) fn check_barrier_sockets(&self) {
        let broken: Vec<Slot> = self
            .private
            .lock()
            .by_token
            .values()
            .filter(|s| matches!(s, Slot::Barrier(_, s) if !s.is_intact()))
            .cloned()
            .collect();
        for slot in broken {
            let e = std::io::Error::from(std::io::ErrorKind::NotConnected);
            self.replace_broken(&slot, &e);
        }
    }

    fn private_heartbeat(
        &self,
        peer: NodeId,
        network: usize,
        bytes: &[u8],
        from: Option<SocketAddr>,
    ) {
        let (hb, Some(from)) = (self.check_heartbeat(bytes), from) else {
            self.refuse(Refused::Malformed);
            return;
        };
        let hb = match hb {
            Ok(hb) if hb.node == peer => hb,
            Ok(_) => return self.refuse(Refused::Foreign),
            Err(why) => return self.refuse(why),
        };
        // Authentic and through the private port: the peer's private
        // copies reach us (a second copy of one already taken counts too).
        let now = self.gate.now();
        self.handshakes
            .lock()
            .entry((peer, network))
            .or_default()
            .handle_private_arrival(now, hb.epoch);
        // Private for the monitor only if the sender's fence counted this
        // copy; an uncommitted one is a probe, and the path stays public.
        let queue = if hb.flags & datagram::FLAG_COMMITTED != 0 {
            HeartbeatQueue::Private
        } else {
            HeartbeatQueue::Members
        };
        let mut c = self.checker.lock();
        if let Err(why) = self.accept_heartbeat(&mut c, network, &hb, from, queue) {
            self.refuse(why);
        }
        self.dispatch(&mut c);
    }

    /// One of our barriers came back (its socket takes datagrams from our
    /// barrier sender only; the random token is checked too).
    fn barrier_datagram(&self, bytes: &[u8]) {
        let Ok(Datagram::Barrier { token: wire, .. }) = datagram::decode_datagram(bytes) else {
            return self.refuse(Refused::Barrier);
        };
        let now = self.gate.now();
        let mut c = self.checker.lock();
        let done = match &mut c.round {
            Some(round) if round.wire == wire => {
                round.missing = round.missing.saturating_sub(1);
                (round.missing == 0).then_some(round.token)
            }
            _ => {
                self.refuse(Refused::Barrier);
                None
            }
        };
        if let Some(token) = done {
            c.round = None;
            let queues = self.queues_at_barrier(&mut c);
            // After the connections' queues and flags were read: a stamp
            // made before a flag went down is seen.
            self.fold_heard(&mut c.monitor);
            let before = c.monitor.stats();
            c.monitor.handle_barrier_queues(now, token, &queues);
            super::check::log_round(&before, &c.monitor.stats());
        }
        self.dispatch(&mut c);
    }

    /// Every heartbeat queue's state as a round ends (under the checker
    /// lock: a reader holding a datagram cannot hand it on meanwhile, and
    /// each queue is read before its reader's in-hand count). The private
    /// queues need no in-hand count: their reader is the caller.
    fn queues_at_barrier(&self, c: &mut CheckerState) -> QueuesAtBarrier {
        let mut members_empty = true;
        for (i, s) in self.socks().iter().enumerate() {
            match s.queue_state() {
                Ok(q) => {
                    members_empty &= q.queued == 0;
                    if let Some(o) = c.ovfl.get_mut(i) {
                        *o = u64::from(q.drops);
                    }
                }
                Err(_) => members_empty = false,
            }
        }
        members_empty &= self.members_in_hand.load(Ordering::SeqCst) == 0;
        let system_drops = self.system_drop_total(true);
        let drops = c.ovfl.iter().sum::<u64>().wrapping_add(system_drops);
        let private = self
            .private
            .lock()
            .queues()
            .map(|(w, s)| {
                let q = match s.queue_state() {
                    Ok(q) => QueueAtBarrier {
                        drops: u64::from(q.drops),
                        empty: q.queued == 0,
                    },
                    // Unreadable: as if something waited (no report).
                    Err(_) => QueueAtBarrier {
                        drops: 0,
                        empty: false,
                    },
                };
                (w, q)
            })
            .collect();
        QueuesAtBarrier {
            drops,
            system_drops,
            members_empty,
            strays: self.split().then(|| self.strays_at_barrier()),
            private,
            unread_streams: self.unread_streams(&c.monitor.round_paths()),
        }
    }

    /// Reads every private queue's drop count as a round begins, so a drop
    /// before it is dated no later than now.
    pub(super) fn read_private_drops(&self, c: &mut CheckerState, now: Time) {
        for (w, s) in self.private.lock().queues() {
            if let Ok(q) = s.queue_state() {
                c.monitor
                    .handle_private_drop_count(now, w, u64::from(q.drops));
            }
        }
    }
}
