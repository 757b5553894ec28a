//! The sender thread: runs the fence (SafeTimer's sender side) and the
//! pacer. The fence's heartbeat goes to every known peer address every
//! `idle_interval`; the thread reads the kernel's TX timestamps as the
//! proof it left in time, and moves `t_valid`; a heartbeat that missed its
//! deadline closes the fence and tells the async side (a new incarnation
//! follows). Between them, peers at the busy pace get a heartbeat every
//! `interval` (not stamped, not waited for). The thread sleeps until the
//! next of the two is due, or until a quiet pair's first traffic kicks it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustc_hash::FxHashMap;
use tracing::{debug, info};

use surelink_proto::detector::datagram;
use surelink_proto::detector::{DetectorMode, Fence, FenceState, Pacer};
use surelink_proto::{Epoch, NodeId, Time};
use surelink_sys::TxTimestamp;

use super::private::PUBLIC_EVERY;
use super::{DelayPoint, Detector, Signal, TIMESTAMP_WAIT};

/// Whom one round of heartbeats goes to.
#[derive(Clone, Copy)]
enum Round<'a> {
    /// The fence's: every peer (but slow ones unless the round is full,
    /// `Pacer::fence_copy`), each copy TX-stamped and waited for.
    Fence { full: bool },
    /// The busy pace's: these peers with these pace flags, not waited for;
    /// a copy to a path that carries data may be left out
    /// (`Pacer::admit_copy`).
    Busy(&'a [(NodeId, u16)]),
    /// New destinations': like the busy pace's, but every copy goes.
    Greet(&'a [(NodeId, u16)]),
}

/// The peers a round goes to (`None`: every peer).
fn round_peers<'a>(round: Round<'a>) -> Option<&'a [(NodeId, u16)]> {
    match round {
        Round::Fence { .. } => None,
        Round::Busy(p) | Round::Greet(p) => Some(p),
    }
}

/// A fence heartbeat this close to its deadline is logged (debug).
const LATE_WARNING: Duration = Duration::from_millis(500);

/// Datagrams after which a socket's TX timestamps are read (well under
/// what its error queue holds).
const STAMP_CHUNK: usize = 64;

/// Datagrams per send call before the next network's turn (a divisor of
/// [`STAMP_CHUNK`]).
const SEND_CHUNK: usize = 16;

/// One datagram to send: its bytes, where it goes, and whose counted copy
/// it is (`None`: an extra copy).
type Outgoing = (Vec<u8>, SocketAddr, Option<NodeId>);

/// The sender thread's own books.
#[derive(Default)]
struct SenderState {
    stamps: Vec<TxTimestamp>,
    /// The heartbeats' wire sequence: grows with every round, fence or
    /// busy (receivers refuse a (epoch, seq) not newer than the last).
    wire_seq: u64,
    /// Heartbeats sent per destination (every [`PUBLIC_EVERY`]th also
    /// goes to a committed peer's public port).
    per_dest: BTreeMap<(NodeId, usize), u64>,
    /// The busy round in hand.
    busy: Vec<(NodeId, u16)>,
    /// Traffic stamps already given to the pacer, per peer.
    folded: BTreeMap<NodeId, (u64, u64)>,
    kicked: Vec<NodeId>,
    /// Peers whose ask (our `WATCH`) the last round ended.
    ask_ends: Vec<NodeId>,
    /// When the last fence round began handing heartbeats to the kernel
    /// (`None`: nothing of it was handed over).
    handed_at: Option<Time>,
    /// Where the last round's time went (for the late-heartbeat log):
    /// choosing whom (locks included), the sends, the stamps' wait.
    phases: [Duration; 3],
}

impl Detector {
    pub(super) fn sender_thread(self: Arc<Self>) {
        let mut st = SenderState::default();
        let mut signalled = u64::MAX;
        let safetimer = self.cfg.mode == DetectorMode::SafeTimer;
        self.raise_priority();
        {
            let mut f = self.gate.fence.lock();
            *f = Fence::new(&self.cfg, self.gate.now());
            if safetimer {
                self.gate.publish(&f);
            }
        }
        // Per kicked peer, its crowd ask (reused across rounds).
        let mut crowded: Vec<u8> = Vec::new();
        while !self.closed.load(Ordering::Relaxed) {
            self.stall(DelayPoint::Sender);
            let now = self.gate.now();
            self.fold_traffic(now, &mut st);
            // Everything that reads or writes the fence, and the gate that
            // mirrors it, happens under the fence lock with the generation
            // read there: a fence replaced by `restart_fence` meanwhile is
            // never written back over the new one.
            let (due, full, generation) = {
                let mut f = self.gate.fence.lock();
                if !safetimer && f.is_fenced() {
                    // The baseline has no fence: a late thread just starts
                    // a fresh schedule.
                    *f = Fence::new(&self.cfg, now);
                }
                let due = f.poll_heartbeat(now);
                (
                    due,
                    due.is_none_or(|d| f.is_full(d.seq)),
                    self.fence_generation.load(Ordering::Acquire),
                )
            };
            if let Some(due) = due {
                let sent_at = self.send_round(Round::Fence { full }, &mut st);
                if sent_at.is_none_or(|t| t + LATE_WARNING > due.deadline) {
                    debug!(
                        seq = due.seq,
                        handed = ?now,
                        ?sent_at,
                        deadline = ?due.deadline,
                        phases = ?st.phases,
                        "fence heartbeat late or unconfirmed"
                    );
                }
                let mut f = self.gate.fence.lock();
                if self.fence_generation.load(Ordering::Acquire) != generation {
                    continue;
                }
                // Handed over: an unarmed fence arms (peers may hear it),
                // confirmed or not.
                if let (true, Some(at)) = (safetimer, st.handed_at) {
                    f.handle_handed(due.seq, at);
                }
                match (safetimer, sent_at) {
                    (true, Some(t)) => f.handle_sent(due.seq, t),
                    // Unconfirmed: sent again shortly (every link may be
                    // down for a moment); the fence closes at its deadline
                    // unless a copy is confirmed by then.
                    (true, None) => f.handle_unconfirmed(due.seq, self.gate.now()),
                    (false, _) => f.handle_sent(due.seq, Time::ZERO),
                }
                if safetimer {
                    self.gate.publish(&f);
                }
                continue;
            }
            let now = self.gate.now();
            let mut busy = std::mem::take(&mut st.busy);
            let mut greet: Vec<NodeId> = std::mem::take(&mut *self.greetings.lock());
            greet.sort_unstable();
            greet.dedup();
            if !greet.is_empty() {
                let round: Vec<(NodeId, u16)> = {
                    let pacer = self.pacer.lock();
                    greet.iter().map(|p| (*p, pacer.flags(now, *p))).collect()
                };
                self.send_round(Round::Greet(&round), &mut st);
            }
            let due = {
                let mut pacer = self.pacer.lock();
                let due = pacer.poll_round(now, &mut busy);
                // Sends unanswered for the grace: our WATCH goes now.
                pacer.take_asks(&mut st.kicked);
                pacer.take_ask_ends(&mut st.ask_ends);
                // A crowded peer answers at its own pace.
                crowded.clear();
                crowded.extend(st.kicked.iter().map(|p| pacer.peer_crowd_shift(*p)));
                due
            };
            if due {
                // A crowded round may have no copy due (see the core's
                // "A crowd of busy peers").
                if !busy.is_empty() {
                    self.send_round(Round::Busy(&busy), &mut st);
                    self.busy_rounds.fetch_add(1, Ordering::Relaxed);
                }
                if !st.kicked.is_empty() || !st.ask_ends.is_empty() {
                    // Our WATCH is out: the monitor expects the busy pace
                    // back within the short window (or no longer).
                    let mut c = self.checker.lock();
                    for peer in st.ask_ends.drain(..) {
                        c.monitor.handle_watch_ended(peer);
                    }
                    for (peer, shift) in st.kicked.drain(..).zip(crowded.iter()) {
                        c.monitor.handle_watch_sent_crowded(now, peer, *shift);
                    }
                    drop(c);
                    self.wake_checker_if_due();
                }
            }
            st.busy = busy;
            let next = {
                let mut f = self.gate.fence.lock();
                let generation = self.fence_generation.load(Ordering::Acquire);
                match f.state(self.gate.now()) {
                    FenceState::Fenced { at, missed_seq } if safetimer => {
                        self.gate.publish(&f);
                        if signalled != generation {
                            signalled = generation;
                            self.fences.fetch_add(1, Ordering::Relaxed);
                            let _ = self.signals.send(Signal::Fenced { at, missed_seq });
                        }
                        None
                    }
                    _ => f.poll_timeout(),
                }
            };
            let busy_next = self.pacer.lock().poll_timeout(self.gate.now());
            let wake = match (next, busy_next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (Some(t), None) | (None, Some(t)) => Some(t),
                // Fenced, nobody busy: until a kick or the new epoch.
                (None, None) => None,
            };
            if self.cfg.answer_grace.is_some() {
                // Sends since we looked are looked at within their grace:
                // publish the plan, then see whether one came meanwhile.
                let plan = wake.unwrap_or(self.gate.now() + Duration::from_millis(100));
                self.sender_plan.store(plan.as_nanos(), Ordering::SeqCst);
                if self.traffic_dirty.load(Ordering::SeqCst) {
                    let grace = self.cfg.answer_grace.unwrap_or_default();
                    let soon = self.gate.now() + grace;
                    if plan > soon {
                        self.sender_plan.store(soon.as_nanos(), Ordering::SeqCst);
                        self.sleep_until(soon);
                        continue;
                    }
                }
            }
            match wake {
                Some(t) => self.sleep_until(t),
                None => std::thread::park_timeout(Duration::from_millis(100)),
            }
        }
    }

    /// Puts this thread in the class [`crate::DetectorPriority`] asks for,
    /// and logs which one it got.
    fn raise_priority(&self) {
        use surelink_sys::priority;
        if self.priority == crate::DetectorPriority::Unchanged {
            return;
        }
        match priority::set_realtime(1) {
            Ok(p) => info!(priority = %p, "detector sender raised"),
            Err(rt) => match priority::set_nice(-20) {
                Ok(p) => {
                    info!(priority = %p, realtime = %rt, "detector sender raised (real-time not allowed)")
                }
                Err(e) => {
                    info!(realtime = %rt, nice = %e, "detector sender at the ordinary priority (raising it is not allowed: CAP_SYS_NICE, or RLIMIT_RTPRIO / RLIMIT_NICE, allow it)")
                }
            },
        }
    }

    /// Gives the pacer the traffic stamped since the last look, and the
    /// kicks (a quiet pair's first traffic) with it.
    fn fold_traffic(&self, now: Time, st: &mut SenderState) {
        self.traffic_dirty.store(false, Ordering::SeqCst);
        let kicks: Vec<NodeId> = std::mem::take(&mut *self.kicks.lock());
        let cells: Vec<(NodeId, u64, u64)> = self
            .traffic
            .lock()
            .iter()
            .map(|(p, c)| {
                let sent = c.sent.load(Ordering::Relaxed);
                (*p, sent, c.replied.load(Ordering::Relaxed))
            })
            .collect();
        // A forgotten peer's stamps go with it (cells only ever leave
        // the map with their peer, so a longer `folded` means one left).
        if st.folded.len() > cells.len() {
            let live: std::collections::BTreeSet<NodeId> =
                cells.iter().map(|(p, _, _)| *p).collect();
            st.folded.retain(|p, _| live.contains(p));
        }
        let mut pacer = self.pacer.lock();
        for (peer, sent, replied) in cells {
            let seen = st.folded.entry(peer).or_default();
            let new_sent = sent != 0 && seen.0 != sent;
            let new_reply = replied != 0 && seen.1 != replied;
            *seen = (sent, replied);
            let at = |t: u64| Time::from_nanos(t).min(now);
            // In time order: the pacer's run of traffic is one sequence.
            let mut kick = false;
            let (first, second) = if replied < sent {
                ((new_reply, replied, true), (new_sent, sent, false))
            } else {
                ((new_sent, sent, false), (new_reply, replied, true))
            };
            for (new, t, reply) in [first, second] {
                if new {
                    kick |= if reply {
                        pacer.handle_reply(at(t), peer)
                    } else {
                        pacer.handle_traffic(at(t), peer)
                    };
                }
            }
            if kick {
                st.kicked.push(peer);
            }
        }
        for peer in kicks {
            if pacer.handle_traffic(now, peer) || !pacer.is_fast(peer) {
                st.kicked.push(peer);
            }
        }
        if self.cfg.answer_grace.is_some() && pacer.awaits_answers() {
            // Data read from a peer answers our sends before it.
            for ((peer, _), t) in self.heard.lock().iter() {
                let t = t.load(Ordering::Relaxed);
                if t > 0 {
                    pacer.handle_answer(Time::from_nanos(t).min(now), *peer);
                }
            }
        }
        drop(pacer);
        // Probed by the checker: already busy in the pacer.
        st.kicked.extend(std::mem::take(&mut *self.probed.lock()));
        st.kicked.sort_unstable();
        st.kicked.dedup();
    }

    /// Sends one round of heartbeats on every network. For the fence's
    /// round, returns when it provably left the host *for every peer* —
    /// per peer the earliest confirmed copy (any network), and the latest
    /// of those — or `None` if some peer got no confirmed copy, which
    /// leaves the heartbeat unconfirmed (the fence closes at its deadline).
    /// A copy is confirmed by its kernel TX timestamp; only on a socket
    /// without timestamps does the time after `sendmsg` returned stand in
    /// (the paper's `t_after`). A busy round is not the fence's: its
    /// timestamps are only cleared away.
    ///
    /// Where a peer gave us a private port on a network and acknowledges
    /// that our copies there reach it, we are *committed*: the copy goes
    /// there and only that copy counts (the peer's monitor, once it saw a
    /// committed one there, looks for our heartbeats in that queue alone);
    /// every [`PUBLIC_EVERY`]th also goes to its public port, uncounted.
    /// Not yet acknowledged (or behind a relay that forwards the public
    /// port only), the public copy counts and a private one goes along as
    /// a probe.
    fn send_round(&self, round: Round<'_>, st: &mut SenderState) -> Option<Time> {
        let now = self.gate.now();
        let began = Instant::now();
        st.handed_at = None;
        // Acks come with the peer's heartbeats, at the idle pace when it is
        // idle (at the slow one when it is slow): the handshake's window is
        // the widest path window.
        let window = self.cfg.slow_path_timeout();
        let stamped = matches!(round, Round::Fence { .. });
        st.wire_seq += 1;
        let seq = st.wire_seq;
        // Per destination: where the counted copy goes, an extra copy, and
        // the flags.
        type Dest = ((NodeId, usize), SocketAddr, Option<SocketAddr>, u16);
        // When each destination's path carried data (read before the
        // pacer's lock: the cells' locks are the connections').
        let usage = self.path_usage(round_peers(round));
        let dests: Vec<Dest> = {
            let public = self.dests.lock();
            let hs = self.handshakes.lock();
            let mut pacer = self.pacer.lock();
            let mut out = Vec::new();
            if matches!(round, Round::Fence { .. }) {
                // A forgotten peer's count goes with it.
                st.per_dest.retain(|k, _| public.contains_key(k));
            }
            let busy = matches!(round, Round::Busy(_));
            let mut add =
                |pacer: &mut Pacer, k: &(NodeId, usize), public: &SocketAddr, pace: u16| {
                    let n = st.per_dest.entry(*k).or_insert(0);
                    let h = hs.get(k).copied().unwrap_or_default();
                    let c = h.copies(now, window, *n + 1, PUBLIC_EVERY, *public);
                    let flags = c.flags | pace;
                    let network = u16::try_from(k.1).unwrap_or(u16::MAX);
                    let data = usage.get(k).copied().unwrap_or_default();
                    if let Some(flags) = pacer.admit_copy(now, k.0, network, flags, busy, data) {
                        *n += 1;
                        out.push((*k, c.counted, c.extra, flags));
                    }
                };
            match round {
                Round::Fence { full } => {
                    // One decision per peer and round (its networks are
                    // next to each other in the map).
                    let mut last: Option<(NodeId, Option<u16>)> = None;
                    for (k, p) in public.iter() {
                        let pace = match last {
                            Some((peer, pace)) if peer == k.0 => pace,
                            _ => {
                                let pace = pacer.fence_copy(now, k.0, full);
                                last = Some((k.0, pace));
                                pace
                            }
                        };
                        if let Some(pace) = pace {
                            add(&mut pacer, k, p, pace);
                        }
                    }
                }
                Round::Busy(peers) | Round::Greet(peers) => {
                    for (peer, flags) in peers {
                        for (k, p) in public.range((*peer, 0)..=(*peer, usize::MAX)) {
                            add(&mut pacer, k, p, *flags);
                        }
                    }
                }
            }
            out
        };
        let ports: Vec<u16> = {
            let p = self.private.lock();
            dests
                .iter()
                .map(|((peer, n), _, _, _)| p.port(*peer, *n))
                .collect()
        };
        let epoch = Epoch(self.epoch.load(Ordering::Relaxed));
        // Held for the sends only (no copy of the key map per heartbeat).
        let keys = self.hb_keys.as_ref().map(|k| k.lock());
        // Heartbeats of a fenced process must not leave either.
        if !self.gate.may_send_heartbeat() && self.cfg.mode == DetectorMode::SafeTimer {
            return None;
        }
        if dests.is_empty() {
            // Nobody to tell, so nobody can report us: the thread ran in
            // time, which is what the schedule asks.
            return Some(self.gate.now());
        }
        let sockets = self.socks();
        // Timestamps left from earlier rounds must not confirm this one
        // (nor fill the socket's error queue).
        for sock in &sockets {
            st.stamps.clear();
            let _ = sock.take_tx_timestamps(&mut st.stamps);
        }
        let round_start = SystemTime::now();
        let mut confirmed: BTreeMap<NodeId, Option<Time>> =
            dests.iter().map(|((p, _), _, _, _)| (*p, None)).collect();
        // Per socket: (peer, datagram id) sent, and whether a send failed
        // (the kernel may have numbered the failed one: ids are then not
        // trusted for that socket).
        let mut sent: Vec<Vec<(NodeId, u32)>> = vec![Vec::new(); sockets.len()];
        let mut failed = vec![false; sockets.len()];
        #[cfg(feature = "test-util")]
        let mut lost_on_wire: Vec<NodeId> = Vec::new();
        // Per socket: the datagrams, where each goes, and whose counted
        // copy it is (`None`: an extra copy).
        let mut out: Vec<Vec<Outgoing>> = vec![Vec::new(); sockets.len()];
        for (((peer, network), counted, extra, flags), port) in dests.into_iter().zip(ports) {
            if network >= sockets.len() {
                continue;
            }
            // Silent on this network (test hook): the datagram is lost on
            // the wire, as in a blackhole; our side did send it in time.
            #[cfg(feature = "test-util")]
            if crate::testing::is_muted(&self.muted, network) {
                lost_on_wire.push(peer);
                continue;
            }
            // Tagged for this peer (a peer without a key gets nothing: it
            // could not check it, and it is not a member).
            let key = match &keys {
                None => None,
                Some(k) => match k.get(&peer).and_then(|v| v.first()) {
                    Some(k) => Some(k),
                    None => continue,
                },
            };
            let hb =
                datagram::encode_heartbeat(self.cluster, self.node, epoch, seq, port, flags, key);
            if let Some(addr) = extra {
                out[network].push((hb.to_vec(), addr, None));
            }
            out[network].push((hb.to_vec(), counted, Some(peer)));
        }
        // Stamps drained as they come, per socket: the error queue holds
        // only what the socket's receive buffer does (about 250 stamps by
        // default) and the kernel drops the rest, which left every round
        // past that many peers unconfirmed.
        let mut early: Vec<Vec<TxTimestamp>> = vec![Vec::new(); sockets.len()];
        // Counted copies the path refused (an ICMP error, no route, a
        // filter): lost on the way, not late.
        let mut refused: Vec<NodeId> = Vec::new();
        let handed_at = self.gate.now();
        let sends_began = Instant::now();
        st.phases[0] = sends_began - began;
        // A few datagrams per system call, the networks taking turns: a
        // round that leaves slowly (a busy host preempts the sender at
        // each loopback delivery) delays every path of a peer alike, so
        // the peer sees us late — not one network silent while the other
        // is heard, which it would fail over, tearing down a path.
        let batches: Vec<Vec<(&[u8], SocketAddr)>> = out
            .iter()
            .map(|o| o.iter().map(|(b, a, _)| (b.as_slice(), *a)).collect())
            .collect();
        let longest = batches.iter().map(Vec::len).max().unwrap_or(0);
        for start in (0..longest).step_by(SEND_CHUNK) {
            for (network, sock) in sockets.iter().enumerate() {
                let end = (start + SEND_CHUNK).min(batches[network].len());
                if start >= end {
                    continue;
                }
                let msgs = &batches[network][start..end];
                let outgoing = &out[network][start..end];
                for (r, (_, addr, counted)) in sock.send_batch(msgs).into_iter().zip(outgoing) {
                    match (r, counted) {
                        (Ok(id), Some(peer)) => sent[network].push((*peer, id)),
                        (Ok(_), None) => {}
                        (Err(e), counted) => {
                            // Its id may be taken: the socket's ids are not
                            // trusted this round.
                            failed[network] = true;
                            if let (Some(peer), false) =
                                (counted, surelink_sys::is_local_shortage(&e))
                            {
                                refused.push(*peer);
                            }
                            debug!(%addr, error = %e, "heartbeat not sent");
                        }
                    }
                }
                // Drained as they come (well under what the error queue
                // holds).
                if stamped
                    && sock.timestamps_enabled()
                    && (end % STAMP_CHUNK == 0 || end == batches[network].len())
                {
                    st.stamps.clear();
                    let _ = sock.take_tx_timestamps(&mut st.stamps);
                    early[network].extend(st.stamps.iter().filter(|ts| ts.at >= round_start));
                }
            }
        }
        // The reader checks tags under this lock: not held while waiting
        // for TX timestamps.
        drop(keys);
        let t_after = self.gate.now();
        st.phases[1] = sends_began.elapsed();
        let stamps_began = Instant::now();
        // No stamps to wait for (returned early below): none of this
        // round's time went to them.
        st.phases[2] = Duration::ZERO;
        let n_sent: usize = sent.iter().map(Vec::len).sum();
        self.heartbeats_sent
            .fetch_add(n_sent as u64, Ordering::Relaxed);
        if n_sent > 0 {
            st.handed_at = Some(handed_at);
        }
        if !stamped {
            return Some(t_after);
        }
        let confirm = |c: &mut BTreeMap<NodeId, Option<Time>>, peer: NodeId, at: Time| {
            if let Some(slot) = c.get_mut(&peer) {
                *slot = Some(slot.map_or(at, |t| t.min(at)));
            }
        };
        #[cfg(feature = "test-util")]
        for peer in lost_on_wire {
            confirm(&mut confirmed, peer, t_after);
        }
        // A peer whose path refused our copy does not hold back the round
        // (one unreachable peer would fence the process and end every
        // session) — as long as something left for someone: a host whose
        // every copy failed is cut off, and fences as before.
        if n_sent > 0 {
            for peer in refused {
                confirm(&mut confirmed, peer, t_after);
            }
        }
        for (network, sock) in sockets.iter().enumerate() {
            if !sock.timestamps_enabled() {
                for (peer, _) in &sent[network] {
                    confirm(&mut confirmed, *peer, t_after);
                }
            }
        }
        let deadline = Instant::now() + TIMESTAMP_WAIT;
        // Per socket: whose copy each datagram id is, the stamps of this
        // round seen so far, and the latest of them.
        let owners: Vec<FxHashMap<u32, NodeId>> = sent
            .iter()
            .map(|v| v.iter().map(|(peer, id)| (*id, *peer)).collect())
            .collect();
        let mut got = vec![0usize; sockets.len()];
        let mut latest_stamp: Vec<Option<SystemTime>> = vec![None; sockets.len()];
        // Slept, not spun: the kernel stamps a datagram within
        // microseconds, and a round is four times a second.
        let mut nap = Duration::from_micros(20);
        loop {
            for (network, sock) in sockets.iter().enumerate() {
                if !sock.timestamps_enabled() || sent[network].is_empty() {
                    continue;
                }
                st.stamps.clear();
                st.stamps.append(&mut early[network]);
                let _ = sock.take_tx_timestamps(&mut st.stamps);
                for ts in st.stamps.iter().filter(|ts| ts.at >= round_start) {
                    got[network] += 1;
                    latest_stamp[network] = latest_stamp[network].max(Some(ts.at));
                    if !failed[network] {
                        if let Some(peer) = owners[network].get(&ts.id) {
                            confirm(&mut confirmed, *peer, self.to_time(ts.at));
                        }
                    }
                }
                if failed[network] && got[network] >= sent[network].len() {
                    // Ids not trusted: every copy on this socket counts as
                    // confirmed only once as many stamps came back, at the
                    // latest of them.
                    if let Some(latest) = latest_stamp[network] {
                        let at = self.to_time(latest);
                        for (peer, _) in &sent[network] {
                            confirm(&mut confirmed, *peer, at);
                        }
                    }
                }
            }
            if confirmed.values().all(Option::is_some) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_micros(500));
        }
        st.phases[2] = stamps_began.elapsed();
        let unconfirmed = confirmed.values().filter(|t| t.is_none()).count();
        if unconfirmed > 0 {
            let first = confirmed.iter().find(|(_, t)| t.is_none()).map(|(p, _)| *p);
            debug!(
                unconfirmed,
                peers = confirmed.len(),
                ?first,
                sent = ?sent.iter().map(Vec::len).collect::<Vec<_>>(),
                stamps = ?got,
                ?failed,
                "fence round not confirmed"
            );
            return None;
        }
        let mut latest = Time::ZERO;
        for t in confirmed.values() {
            latest = latest.max((*t)?);
        }
        self.tx_timestamped.fetch_add(1, Ordering::Relaxed);
        Some(latest)
    }

    /// A kernel wall-clock timestamp on the gate's scale. The wall clock is
    /// read first: a delay between the two reads then makes the result
    /// later, never earlier (a late heartbeat is never taken for on time).
    fn to_time(&self, at: SystemTime) -> Time {
        let ago = SystemTime::now()
            .duration_since(at)
            .unwrap_or(Duration::ZERO);
        let now = self.gate.now();
        Time::from_nanos(
            now.as_nanos()
                .saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}
