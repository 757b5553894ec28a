//! One session in the shell: the core's [`Session`] behind its own lock,
//! the connections under its paths, the callers waiting for replies, and a
//! task for its timers and deferred writes.
//!
//! Everything that touches a session happens under its lock and nothing
//! else: a reader feeds bytes in, a caller queues a request, a handler
//! queues a reply; each then *drives* the session — writes what the core
//! wants written onto the connections' queues, completes waiting calls,
//! collects admitted requests and one-way messages — and, after the lock is
//! released, does the rest (socket writes, scheduling, events). Sessions of
//! different peers never contend, and one peer's overload never stalls
//! another peer's replies, events or timers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{oneshot, Notify};
use tracing::{debug, info, warn};

use surelink_proto::rpc::{CallFailure, RemoteError, Ticket};
use surelink_proto::wire::TransmitBuf;
use surelink_proto::{
    CallId, Event, Input, NodeId, PathCloseReason, PathError, PathId, Session, SessionEndReason,
    SessionId, Time,
};

use crate::conn::ConnIo;
use crate::error::CallError;
use crate::events::NetEvent;
use crate::incoming::Incoming;
use crate::server::{Server, StartOrder};
use crate::shared::Shared;

/// Bytes per `poll_transmit`: big enough to batch, small enough to
/// interleave paths.
const TRANSMIT_BUDGET: usize = 256 * 1024;
/// Longest the session's task sleeps while the core has any deadline
/// (it then looks again): a new deadline later than where the task sleeps
/// needs no wake-up call from the data path. The tick starts at the
/// acknowledgement delay — every message received sets an ack deadline
/// that far ahead, so on a busy session those never wake the task (a
/// wake-up per message otherwise). It stays there while the session
/// writes, and doubles on each wake-up that finds neither a deadline due
/// nor a write since the last one, up to this bound: a session that only
/// waits (a long call) costs a wake-up a second. (Letting a busy session's
/// tick grow would make every new ack deadline a wake-up call from the data
/// path — a second task scheduled beside the one the data path wakes,
/// which makes tokio unpark another worker and hand every later message
/// across threads.)
const TIMER_TICK_MAX: Duration = Duration::from_secs(1);
/// Bytes of deferred sends after which the sender writes them itself.
const FLUSH_BATCH: usize = 64 * 1024;
/// Most times a flush yields to let senders add to it.
const MAX_FLUSH_YIELDS: usize = 32;
/// A session that wrote within this long is busy: a message queued then
/// (a one-way send, a request, a reply) is left to the session's flush,
/// which writes it together with whatever else queued meanwhile, in one
/// system call and often one BATCH frame. An idle session writes a lone
/// message at once. Shorter than any round trip, so a caller waiting for
/// each reply before the next call never waits for a flush.
const HOT: u64 = 10_000; // ns

/// A caller waiting for its reply.
pub(crate) type Waiter = oneshot::Sender<Result<Bytes, CallError>>;

/// What a session holds under its lock.
pub(crate) struct SessionInner {
    pub(crate) core: Session,
    pub(crate) conns: Vec<Arc<ConnIo>>,
    pub(crate) waiters: HashMap<CallId, Waiter>,
    out: TransmitBuf,
    /// The deadline the session's task sleeps towards.
    armed: Option<Time>,
}

/// One session of the endpoint.
pub(crate) struct SessionHandle {
    /// The shell's number for it (unique for the endpoint's life).
    pub(crate) key: u64,
    pub(crate) node: NodeId,
    pub(crate) id: SessionId,
    inner: Mutex<SessionInner>,
    /// Send-buffer room may have been freed (or the session ended).
    pub(crate) space: Notify,
    /// Re-arms the session's task, or asks it to flush.
    wake: Notify,
    flush_scheduled: AtomicBool,
    /// When the session last wrote (the shell's clock, ns).
    last_tx: AtomicU64,
    /// One-way messages handed to the incoming queue and not yet taken.
    pub(crate) incoming: AtomicUsize,
    /// Bytes of those messages.
    pub(crate) incoming_bytes: AtomicUsize,
    /// Bytes queued since the last write (changed under the lock; read
    /// without it by the flush).
    unflushed: AtomicUsize,
    ended: AtomicBool,
    /// The order its requests start in.
    pub(crate) start_order: StartOrder,
}

/// Work found while holding a session's lock, done after releasing it.
#[derive(Default)]
pub(crate) struct Work {
    flush: Vec<Arc<ConnIo>>,
    close: Vec<Arc<ConnIo>>,
    events: Vec<NetEvent>,
    tickets: Vec<Ticket>,
    promotes: Vec<CallId>,
    messages: Vec<Incoming>,
    ended: bool,
    space: bool,
    /// Requests were handed to the scheduler: start what can start.
    dispatch: bool,
    rearm: bool,
}

impl SessionHandle {
    pub(crate) fn new(key: u64, core: Session) -> SessionHandle {
        SessionHandle {
            key,
            node: core.peer(),
            id: core.id(),
            inner: Mutex::new(SessionInner {
                core,
                conns: Vec::new(),
                waiters: HashMap::new(),
                out: TransmitBuf::with_head(BytesMut::with_capacity(16 * 1024)),
                armed: None,
            }),
            space: Notify::new(),
            wake: Notify::new(),
            flush_scheduled: AtomicBool::new(false),
            last_tx: AtomicU64::new(0),
            incoming: AtomicUsize::new(0),
            incoming_bytes: AtomicUsize::new(0),
            unflushed: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            start_order: StartOrder::default(),
        }
    }

    /// The session's lock: parking_lot's, which spins briefly before it
    /// parks (a sender and a reader hand it back and forth at high rates;
    /// parking at once would cost a futex round trip each time). It does
    /// not poison: a panic while it is held leaves the core consistent
    /// enough to continue (every mutation is a whole core call).
    pub(crate) fn lock(&self) -> MutexGuard<'_, SessionInner> {
        self.inner.lock()
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Writes what the core wants written, hands out what it delivered,
    /// and re-arms the timer. Call with the lock held after every input.
    /// `now`: a clock read of the caller's, taken under the lock.
    pub(crate) fn drive(
        self: &Arc<Self>,
        g: &mut SessionInner,
        shared: &Shared,
        now: Time,
    ) -> Work {
        let mut w = Work::default();
        let SessionInner {
            core, conns, out, ..
        } = &mut *g;
        while let Some(path) = core.poll_transmit_gather(now, out, TRANSMIT_BUDGET) {
            shared.stats.bytes_sent(out.len());
            match conns.iter().find(|c| c.path == path) {
                Some(c) => {
                    c.enqueue_all(out.drain());
                    if !w.flush.iter().any(|f| Arc::ptr_eq(f, c)) {
                        w.flush.push(c.clone());
                    }
                }
                None => {
                    out.drain();
                }
            }
        }
        if !w.flush.is_empty() {
            self.last_tx.store(now.as_nanos(), Ordering::Relaxed);
        }
        self.unflushed.store(0, Ordering::Relaxed);
        while let Some(ev) = g.core.poll_event() {
            self.on_event(g, shared, ev, &mut w);
        }
        while let Some(m) = g.core.poll_role() {
            if let Some(r) = &shared.role {
                r.deliver(self.node, m);
            }
        }
        // Requests: the core admits up to its per-peer bound.
        while let Some(t) = g.core.poll_request() {
            w.tickets.push(t);
        }
        // One-way messages: up to this peer's share of the incoming queue.
        let bound = shared.config.incoming_per_peer;
        let byte_bound = shared.config.incoming_bytes_per_peer;
        let mut room = bound.saturating_sub(self.incoming.load(Ordering::Acquire));
        let held = self.incoming_bytes.load(Ordering::Acquire);
        let mut added = 0usize;
        // In bytes too (memory, not message count, is what a peer could
        // exhaust); one message is always let through an empty queue.
        while room > 0 && (held + added < byte_bound || held + added == 0) {
            let Some(m) = g.core.poll_message() else {
                break;
            };
            added += m.payload.len();
            w.messages.push(Incoming {
                peer: m.peer,
                channel: m.channel,
                priority: m.priority,
                body: m.payload,
            });
            room -= 1;
        }
        if !w.messages.is_empty() {
            self.incoming.fetch_add(w.messages.len(), Ordering::AcqRel);
            self.incoming_bytes.fetch_add(added, Ordering::AcqRel);
            shared.stats.messages_received(w.messages.len());
            // Queued here, under the session's lock: two drives of one
            // session (a reader and the session task, say) must hand over
            // their runs in the order they took them from the core, or a
            // stream's messages reach `recv` out of order.
            shared
                .incoming
                .push(self, shared.now_cached(), std::mem::take(&mut w.messages));
        }
        // Requests likewise reach the scheduler in the order the core
        // admitted them (starting them waits for `run`).
        w.dispatch = !w.tickets.is_empty() || !w.promotes.is_empty();
        Server::enqueue(
            shared,
            self,
            std::mem::take(&mut w.tickets),
            std::mem::take(&mut w.promotes),
        );
        let t = g.core.poll_timeout();
        if t.is_some() && (g.armed.is_none() || t < g.armed) {
            g.armed = t;
            w.rearm = true;
        }
        w
    }

    fn on_event(&self, g: &mut SessionInner, shared: &Shared, ev: Event, w: &mut Work) {
        match ev {
            Event::CallDone { call, result, .. } => {
                if let Some(tx) = g.waiters.remove(&call) {
                    let r = result.map_err(|f| match f {
                        CallFailure::Timeout => CallError::Timeout,
                        CallFailure::Remote(e) => CallError::Remote(e),
                        CallFailure::SessionEnded(reason) => {
                            CallError::from_end(self.node, &reason)
                        }
                        // A failure kind newer than this shell.
                        _ => CallError::Remote(RemoteError::Unknown(0)),
                    });
                    let _ = tx.send(r);
                }
            }
            Event::Promote { call, .. } => w.promotes.push(call),
            Event::PathUp { peer, path } => {
                let network = g.conns.iter().find(|c| c.path == path).map_or(0, |c| {
                    c.set_peer(peer);
                    c.network
                });
                info!(%peer, %path, network, "path up");
                shared.stats.path_up();
                w.events.push(NetEvent::PathUp {
                    peer,
                    path,
                    network,
                });
            }
            Event::PathClosed {
                peer,
                path,
                reason,
                resent,
            } => {
                let network = match g.conns.iter().position(|c| c.path == path) {
                    Some(i) => {
                        let c = g.conns.swap_remove(i);
                        let n = c.network;
                        w.close.push(c);
                        n
                    }
                    None => 0,
                };
                match &reason {
                    PathCloseReason::Error(e) => warn!(%path, ?peer, error = %e, "path closed"),
                    r => info!(%path, ?peer, reason = ?r, resent, "path closed"),
                }
                shared.stats.path_down(resent);
                w.events.push(NetEvent::PathDown {
                    peer,
                    path,
                    network,
                    resent,
                    reason: format!("{reason:?}"),
                });
            }
            Event::PeerUp { peer, epoch, .. } => w.events.push(NetEvent::PeerUp { peer, epoch }),
            Event::PeerUnreachable { peer, .. } => {
                warn!(%peer, "peer unreachable: no working path");
                w.events.push(NetEvent::PeerUnreachable { peer });
            }
            Event::SessionEnded {
                peer,
                reason,
                abandoned,
                ..
            } => {
                let n: u64 = abandoned.iter().map(|a| a.end - a.start).sum();
                match reason {
                    SessionEndReason::ClosedLocally | SessionEndReason::ClosedByPeer { .. } => {
                        info!(%peer, ?reason, abandoned = n, "session closed");
                    }
                    _ => warn!(%peer, ?reason, abandoned = n, "session ended"),
                }
                self.ended.store(true, Ordering::Release);
                w.ended = true;
                w.space = true;
                w.events.push(NetEvent::SessionEnded {
                    peer,
                    reason,
                    abandoned: n,
                });
            }
            Event::MessageRejected { peer, reason, .. } => {
                warn!(%peer, ?reason, "queued message rejected by the peer's limits");
            }
            other => debug!(?other, "session event ignored"),
        }
    }

    /// Does what `drive` found, outside the lock.
    pub(crate) fn run(self: &Arc<Self>, shared: &Arc<Shared>, w: Work) {
        for c in &w.flush {
            c.flush();
        }
        for c in w.close {
            tokio::spawn(c.close_after_flush());
        }
        for e in w.events {
            shared.events.publish(e);
        }
        if w.dispatch {
            Server::dispatch(shared);
        }
        if w.rearm {
            self.wake.notify_one();
        }
        if w.space {
            self.space.notify_waiters();
        }
        if w.ended {
            shared.session_ended(self);
        }
    }

    /// Locks, applies `f`, drives, unlocks, runs the work.
    pub(crate) fn with<R>(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        f: impl FnOnce(&mut SessionInner, Time) -> R,
    ) -> R {
        let (r, w) = {
            let mut g = self.lock();
            let now = shared.now();
            let r = f(&mut g, now);
            let w = self.drive(&mut g, shared, now);
            (r, w)
        };
        self.run(shared, w);
        r
    }

    /// Bytes arrived on one of the session's paths.
    pub(crate) fn input(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        path: PathId,
        buf: &mut BytesMut,
    ) -> Result<Input, PathError> {
        let r = self.with(shared, |g, now| g.core.handle_input(now, path, buf));
        // Acknowledgements may have freed send-buffer room.
        self.space.notify_waiters();
        r
    }

    /// One of the session's connections ended.
    pub(crate) fn path_down(self: &Arc<Self>, shared: &Arc<Shared>, path: PathId) {
        let w = {
            let mut g = self.lock();
            let now = shared.now();
            g.core.handle_path_down(now, path);
            // The PathClosed event (handled in `drive`) still finds the
            // connection, for its network.
            let w = self.drive(&mut g, shared, now);
            g.conns.retain(|c| c.path != path);
            w
        };
        self.run(shared, w);
        self.space.notify_waiters();
    }

    /// A handler finished: the reply (or the error) goes back — at once if
    /// the session is idle, else with the replies finishing alongside it.
    pub(crate) fn complete(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        call: CallId,
        result: Result<Bytes, RemoteError>,
    ) {
        let w = {
            let mut g = self.lock();
            let now = shared.now();
            let len = result.as_ref().map_or(0, Bytes::len);
            if let Err(e) = g.core.complete(now, call, result) {
                debug!(peer = %self.node, error = %e, "reply not sent");
            }
            self.write_now(shared, len, Some(now))
                .map(|now| self.drive(&mut g, shared, now))
        };
        if let Some(w) = w {
            self.run(shared, w);
        }
    }

    /// Decides, after a message was queued under the lock, whether to write
    /// now (an idle session: a lone message leaves at once) or to leave it
    /// for the session's flush (a busy one: it joins what queues behind it;
    /// with [`WriteBatching::Turn`](crate::WriteBatching::Turn), always).
    /// Returns when to drive (the clock read it made or was given), or
    /// `None` to leave it to the flush. `now`: a fresh clock read, if the
    /// caller has one (the cached clock is stale after a quiet spell, which
    /// would make an idle session look busy).
    pub(crate) fn write_now(&self, shared: &Shared, len: usize, now: Option<Time>) -> Option<Time> {
        let unflushed = self.unflushed.load(Ordering::Relaxed) + len;
        self.unflushed.store(unflushed, Ordering::Relaxed);
        if unflushed >= FLUSH_BATCH {
            return Some(now.unwrap_or_else(|| shared.now()));
        }
        if self.flush_scheduled.load(Ordering::Relaxed) {
            return None;
        }
        let now = now.unwrap_or_else(|| shared.now());
        if !shared.turn_writes
            && now
                .as_nanos()
                .saturating_sub(self.last_tx.load(Ordering::Relaxed))
                > HOT
        {
            return Some(now);
        }
        if !self.flush_scheduled.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
        None
    }

    /// Drives the session again (after the incoming queue made room).
    pub(crate) fn poke(self: &Arc<Self>, shared: &Arc<Shared>) {
        self.with(shared, |_, _| {});
    }

    /// Fails every waiting call with `err` and forgets the connections
    /// (the process fenced itself or shuts down).
    pub(crate) fn abandon(&self, err: &CallError) -> (usize, u64) {
        let mut g = self.lock();
        let n = g.waiters.len();
        for (_, tx) in g.waiters.drain() {
            let _ = tx.send(Err(err.clone()));
        }
        for c in g.conns.drain(..) {
            c.kill();
        }
        self.ended.store(true, Ordering::Release);
        let abandoned = g.core.stats().cache_messages;
        drop(g);
        self.space.notify_waiters();
        (n, abandoned)
    }
}

/// The session's task: runs its timers, and the deferred writes of one-way
/// sends, until it ended and has nothing left to write.
pub(crate) async fn run_session(shared: Arc<Shared>, h: Arc<SessionHandle>) {
    let tick_min = shared
        .config
        .core
        .max_ack_delay
        .max(Duration::from_millis(1));
    let mut tick = tick_min;
    let mut seen_tx = h.last_tx.load(Ordering::Relaxed);
    // One timer for the task's life, reset when the wanted deadline
    // changes. A fresh sleep per turn of this loop (it turns at every
    // flush) registered a new timer each time, and one set ahead of the
    // runtime's next wake-up makes tokio wake its driver (an eventfd write
    // and an extra poll). It follows the deadline later too: on a busy
    // session the ack deadline keeps moving (acks ride on replies), and a
    // timer left at a stale, earlier one fires every tick for nothing — a
    // cross-thread wake-up on a multi-worker runtime.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut timer_at: Option<Time> = None;
    loop {
        let notified = h.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut g = h.lock();
            if h.is_ended() && g.core.is_drained() {
                return;
            }
            let now = shared.now();
            let want = g.core.poll_timeout().map(|t| t.min(now + tick));
            if want != timer_at {
                if let Some(t) = want {
                    timer.as_mut().reset(shared.instant(t));
                }
                timer_at = want;
            }
            g.armed = timer_at;
        }
        let timer_armed = timer_at.is_some();
        tokio::select! {
            () = &mut timer, if timer_armed => {
                timer_at = None;
                shared.stats.timer_fires.fetch_add(1, Ordering::Relaxed);
                let due = h.with(&shared, |g, now| {
                    let due = g.core.poll_timeout().is_some_and(|d| d <= now);
                    if due {
                        g.core.handle_timeout(now);
                    }
                    due
                });
                let tx = h.last_tx.load(Ordering::Relaxed);
                if due || tx != seen_tx {
                    tick = tick_min;
                } else {
                    tick = (tick * 2).min(TIMER_TICK_MAX);
                }
                seen_tx = tx;
                h.space.notify_waiters();
            }
            () = &mut notified => {
                if !h.flush_scheduled.load(Ordering::Acquire) {
                    // Re-armed for an earlier deadline: the session is busy.
                    tick = tick_min;
                } else {
                    // Let senders add more first: yield while the queue
                    // grows (up to a write's worth), then write it all in
                    // one go. A message that queues alone is written after
                    // one yield.
                    let mut before = h.unflushed.load(Ordering::Relaxed);
                    for _ in 0..MAX_FLUSH_YIELDS {
                        tokio::task::yield_now().await;
                        let now = h.unflushed.load(Ordering::Relaxed);
                        if now == before || now >= FLUSH_BATCH || now == 0 {
                            break;
                        }
                        before = now;
                    }
                    h.flush_scheduled.store(false, Ordering::Release);
                    h.poke(&shared);
                }
            }
        }
    }
}
