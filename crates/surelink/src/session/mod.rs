//! One session in the shell: the core's [`Session`] behind its own lock,
//! the connections under its paths, the callers waiting for replies, and a
//! task for its timers and deferred writes.
//!
//! There is one way into a session, [`SessionHandle::with`] (and
//! [`SessionHandle::step`] for the router, which runs the work later):
//! lock it, give the core its input, *drive* it — write what the core
//! wants written onto the connections' queues, complete waiting calls,
//! collect admitted requests and one-way messages (`drive.rs`) — unlock,
//! and then do the rest (socket writes, scheduling, events). Readers,
//! callers, handlers, timers, the router's HELLO decisions and the
//! detector's reactions all go through it; nothing outside this module
//! touches a session's state. The one input that may skip the lock is a
//! normal one-way send while a flush is coming anyway: it waits in the
//! session's send stage (`stage.rs`) until the lock's next holder moves
//! it into the core. Sessions of different peers never contend,
//! and one peer's overload never stalls another peer's replies, events or
//! timers.
//!
//! What it does not do: decide anything with wire meaning (the core does)
//! or own sockets (connections are [`ConnIo`]s, shared with their tasks).

mod drive;
mod stage;
mod task;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use tokio::sync::{oneshot, Notify};
use tracing::debug;

use surelink_proto::rpc::{CallOptions, Priority, RemoteError};
use surelink_proto::wire::TransmitBuf;
use surelink_proto::{
    CallId, ChannelId, Input, MessageId, NodeId, PathError, PathId, SendLimits, Session, SessionId,
    SessionStats, Time,
};

use crate::conn::ConnIo;
use crate::error::CallError;
use crate::incoming::PeerLedger;
use crate::server::{Spans, StartOrder};
use crate::shared::Shared;

pub(crate) use drive::Work;
pub(crate) use stage::Offer;
pub(crate) use task::run_session;

/// Bytes of deferred sends after which the sender writes them itself.
const FLUSH_BATCH: usize = 64 * 1024;
/// A session that wrote within this long is busy: a message queued then
/// (a one-way send, a request, a reply) is left to the session's flush,
/// which writes it together with whatever else queued meanwhile, in one
/// system call and often one BATCH frame. An idle session writes a lone
/// message at once. Shorter than any round trip, so a caller waiting for
/// each reply before the next call never waits for a flush.
const HOT: u64 = 10_000; // ns

/// A caller waiting for its reply.
pub(crate) type Waiter = oneshot::Sender<Result<Bytes, CallError>>;

/// What a session holds under its lock. Only this module sees the fields;
/// inputs use the methods below.
pub(crate) struct SessionInner {
    core: Session,
    conns: Vec<Arc<ConnIo>>,
    waiters: HashMap<CallId, Waiter>,
    out: TransmitBuf,
    /// The deadline the session's task sleeps towards.
    armed: Option<Time>,
    /// The drain's buffer (its capacity kept between drains).
    staged: Vec<stage::Staged>,
}

/// When the output of an input is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// Now.
    Now,
    /// At once if the session is idle; else with the session's flush, with
    /// whatever queues meanwhile (`usize`: the bytes just queued).
    Batched(usize),
    /// Nothing was queued: no drive.
    Skip,
}

/// Which clock reading an input gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    /// A fresh reading.
    Fresh,
    /// The last reading (free; good enough for queueing, and a fresh one
    /// is taken if the session then writes).
    Cached,
}

/// One session of the endpoint.
pub(crate) struct SessionHandle {
    /// The shell's number for it (unique for the endpoint's life).
    pub(crate) key: u64,
    pub(crate) node: NodeId,
    pub(crate) id: SessionId,
    inner: Mutex<SessionInner>,
    /// Send-buffer room may have been freed (or the session ended).
    space: Notify,
    /// Re-arms the session's task, or asks it to flush.
    wake: Notify,
    /// Set and cleared only under the stage's lock (see `stage.rs`).
    flush_scheduled: AtomicBool,
    /// One-way sends waiting for the scheduled flush (see `stage.rs`).
    stage: stage::Stage,
    /// When the session last wrote (the shell's clock, ns).
    last_tx: AtomicU64,
    /// What the peer node's one-way messages hold in the incoming queue,
    /// across its sessions (shared with them).
    pub(crate) ledger: Arc<PeerLedger>,
    /// Bytes queued since the last write (changed under the lock; read
    /// without it by the flush).
    unflushed: AtomicUsize,
    ended: AtomicBool,
    /// The order its requests start in.
    pub(crate) start_order: StartOrder,
    /// Its requests that span groups, kept in place.
    pub(crate) spans: Spans,
    /// The detector's traffic stamp for the peer (see
    /// [`SessionHandle::note_traffic`]).
    traffic: std::sync::OnceLock<Arc<crate::detector::TrafficCell>>,
    /// The peer's data comes through a helper (a relayed path, within
    /// [`RELAYED_LINGER`]): its traffic does not hold the detector's
    /// direct paths at the busy pace (they are the fallback, watched at
    /// the idle pace).
    relayed: AtomicBool,
    /// When data last came through a helper (the shell clock's ns).
    relayed_at: AtomicU64,
}

/// How long after its last data through a helper a peer still counts as
/// relayed: the direct paths' keepalives and stray frames do not switch
/// it back, a helper's path gone for this long does.
const RELAYED_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

impl SessionInner {
    /// The core session (the router's HELLO decisions act on it).
    pub(crate) fn core(&mut self) -> &mut Session {
        &mut self.core
    }

    /// Whether the core session ended (a new one must be opened).
    pub(crate) fn is_ended(&self) -> bool {
        self.core.ended().is_some()
    }

    /// Queues a call and files its waiter.
    pub(crate) fn call(
        &mut self,
        now: Time,
        channel: ChannelId,
        body: Bytes,
        opts: &CallOptions,
        waiter: Waiter,
    ) -> Result<CallId, surelink_proto::SendError> {
        let id = self.core.call(now, channel, body, opts)?;
        self.waiters.insert(id, waiter);
        Ok(id)
    }

    /// Queues a one-way message.
    pub(crate) fn send(
        &mut self,
        now: Time,
        channel: ChannelId,
        priority: Priority,
        message: Bytes,
    ) -> Result<MessageId, surelink_proto::SendError> {
        self.core.send(now, channel, priority, message)
    }

    /// Files a connection under the session (a path joins).
    pub(crate) fn add_conn(&mut self, io: &Arc<ConnIo>) {
        if !self.conns.iter().any(|c| c.path == io.path) {
            self.conns.push(io.clone());
        }
    }

    /// Takes a connection out of the session's books (its path moved to
    /// another session, or ended).
    pub(crate) fn remove_conn(&mut self, path: PathId) {
        self.conns.retain(|c| c.path != path);
    }
}

impl SessionHandle {
    pub(crate) fn new(key: u64, core: Session, ledger: Arc<PeerLedger>) -> SessionHandle {
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
                staged: Vec::new(),
            }),
            space: Notify::new(),
            wake: Notify::new(),
            flush_scheduled: AtomicBool::new(false),
            stage: stage::Stage::default(),
            last_tx: AtomicU64::new(0),
            ledger,
            unflushed: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            start_order: StartOrder::default(),
            spans: Spans::default(),
            traffic: std::sync::OnceLock::new(),
            relayed: AtomicBool::new(false),
            relayed_at: AtomicU64::new(0),
        }
    }

    /// The session's lock: parking_lot's, which spins briefly before it
    /// parks (a sender and a reader hand it back and forth at high rates;
    /// parking at once would cost a futex round trip each time). It does
    /// not poison: a panic while it is held leaves the core consistent
    /// enough to continue (every mutation is a whole core call).
    fn lock(&self) -> MutexGuard<'_, SessionInner> {
        self.inner.lock()
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The one way in: locks, applies `f` at a fresh clock reading, drives,
    /// unlocks, and does the work found.
    pub(crate) fn with<R>(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        f: impl FnOnce(&mut SessionInner, Time) -> R,
    ) -> R {
        self.with_output(shared, Reading::Fresh, |g, now| (f(g, now), Output::Now))
    }

    /// [`SessionHandle::with`] where `f` also says when its output is
    /// written (see [`Output`]), at the clock reading `clock` asks for.
    pub(crate) fn with_output<R>(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        clock: Reading,
        f: impl FnOnce(&mut SessionInner, Time) -> (R, Output),
    ) -> R {
        let (r, w) = self.step(shared, clock, f);
        if let Some(w) = w {
            self.run(shared, w);
        }
        r
    }

    /// [`SessionHandle::with_output`] without doing the work: the caller
    /// runs it with [`SessionHandle::run`] once it released what it holds
    /// (the router's lock, while a HELLO decision is applied).
    pub(crate) fn step<R>(
        self: &Arc<Self>,
        shared: &Shared,
        clock: Reading,
        f: impl FnOnce(&mut SessionInner, Time) -> (R, Output),
    ) -> (R, Option<Work>) {
        let mut g = self.lock();
        let (now, fresh) = match clock {
            Reading::Fresh => {
                let now = shared.clock.now();
                (now, Some(now))
            }
            Reading::Cached => (shared.clock.now_cached(), None),
        };
        // Staged sends the flush will not drain (what found the send
        // buffer full) go now: the input may have freed room. While a flush
        // is coming, they wait for it, to leave in one write (a send under
        // the lock drains them first itself: `call::send_now_on`).
        if !self.flush_scheduled.load(Ordering::Relaxed) {
            self.drain_stage(&mut g, shared, now);
        }
        let (r, out) = f(&mut g, now);
        let drive_at = match out {
            Output::Now => Some(fresh.unwrap_or_else(|| shared.clock.now())),
            Output::Batched(len) => {
                let core = &g.core;
                self.write_now(shared, len, fresh, || core.send_limits())
            }
            Output::Skip => None,
        };
        let w = drive_at.map(|now| self.drive(&mut g, shared, now));
        (r, w)
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
        // The PathClosed event (handled while driving) still finds the
        // connection, for its network, and takes it out of the books.
        self.with(shared, |g, now| g.core.handle_path_down(now, path));
        self.lock().remove_conn(path);
        self.space.notify_waiters();
    }

    /// A call or message is about to go to the peer: the failure
    /// detector watches a pair with traffic in flight at the busy pace
    /// (one atomic store; see `Detector::note_traffic`).
    pub(crate) fn note_traffic(&self, shared: &Shared) {
        self.note(shared, false);
    }

    /// A reply is about to go to the peer (see `Detector::note_reply`).
    pub(crate) fn note_reply(&self, shared: &Shared) {
        self.note(shared, true);
    }

    fn note(&self, shared: &Shared, reply: bool) {
        if self.relayed.load(Ordering::Relaxed) {
            // Through a helper: the direct paths only stand by.
            return;
        }
        if let Some(d) = &shared.detector {
            let cell = self.traffic.get_or_init(|| d.traffic_cell(self.node));
            if reply {
                d.note_reply(self.node, cell);
            } else {
                d.note_traffic(self.node, cell);
            }
        }
    }

    /// Data from the peer arrived through a helper (`true`) or directly.
    /// When that changes, so does where our traffic to it goes: while its
    /// data comes through a helper, ours prefers going back the same way
    /// (a healthy helper's path first), so a server's replies to helped
    /// clients are batched too.
    pub(crate) fn set_relayed(self: &Arc<Self>, shared: &Arc<Shared>, through_helper: bool) {
        let now = shared.clock.now_cached().as_nanos();
        let was = self.relayed.load(Ordering::Relaxed);
        let relayed = if through_helper {
            // One store per millisecond at most.
            if now.saturating_sub(self.relayed_at.load(Ordering::Relaxed)) > 1_000_000 {
                self.relayed_at.store(now, Ordering::Relaxed);
            }
            true
        } else {
            let since = now.saturating_sub(self.relayed_at.load(Ordering::Relaxed));
            was && u128::from(since) < RELAYED_LINGER.as_nanos()
        };
        if was == relayed {
            return;
        }
        self.relayed.store(relayed, Ordering::Relaxed);
        let prefer = shared.prefer_mask(self.node, relayed);
        self.with(shared, |g, _| g.core.set_preferred_networks(prefer));
    }

    /// Whether the peer's data last came through a helper.
    pub(crate) fn is_relayed(&self) -> bool {
        self.relayed.load(Ordering::Relaxed)
    }

    /// A handler finished: the reply (or the error) goes back — at once if
    /// the session is idle, else with the replies finishing alongside it.
    pub(crate) fn complete(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        call: CallId,
        result: Result<Bytes, RemoteError>,
    ) {
        self.note_reply(shared);
        self.with_output(shared, Reading::Fresh, |g, now| {
            let len = result.as_ref().map_or(0, Bytes::len);
            if let Err(e) = g.core.complete(now, call, result) {
                debug!(peer = %self.node, error = %e, "reply not sent");
            }
            ((), Output::Batched(len))
        });
    }

    /// Drives the session again (after the incoming queue made room).
    pub(crate) fn poke(self: &Arc<Self>, shared: &Arc<Shared>) {
        self.with(shared, |_, _| {});
    }

    /// Decides, after a message was queued under the lock, whether to write
    /// now (an idle session: a lone message leaves at once) or to leave it
    /// for the session's flush (a busy one: it joins what queues behind it;
    /// with [`WriteBatching::Turn`](crate::WriteBatching::Turn), always).
    /// Returns when to drive (the clock read it made or was given), or
    /// `None` to leave it to the flush. `now`: a fresh clock read, if the
    /// caller has one (the cached clock is stale after a quiet spell, which
    /// would make an idle session look busy).
    /// Scheduling the flush opens the send stage with `limits`.
    fn write_now(
        &self,
        shared: &Shared,
        len: usize,
        now: Option<Time>,
        limits: impl FnOnce() -> Option<SendLimits>,
    ) -> Option<Time> {
        let unflushed = self.unflushed.load(Ordering::Relaxed) + len;
        self.unflushed.store(unflushed, Ordering::Relaxed);
        if unflushed >= FLUSH_BATCH {
            return Some(now.unwrap_or_else(|| shared.clock.now()));
        }
        if self.flush_scheduled.load(Ordering::Relaxed) {
            return None;
        }
        let now = now.unwrap_or_else(|| shared.clock.now());
        if !shared.turn_writes
            && now
                .as_nanos()
                .saturating_sub(self.last_tx.load(Ordering::Relaxed))
                > HOT
        {
            return Some(now);
        }
        if self.stage.schedule(&self.flush_scheduled, limits) {
            self.wake.notify_one();
        }
        None
    }

    /// Waits until the send buffer has room for `len` bytes (or the session
    /// ended). Registration costs a lock, so it happens only here, when a
    /// send found the buffer full; the check after registering closes the
    /// race with a wake-up in between.
    pub(crate) async fn wait_for_room(&self, len: usize) {
        let space = self.space.notified();
        tokio::pin!(space);
        space.as_mut().enable();
        {
            let g = self.lock();
            // Staged messages that found the buffer full go first: room
            // for this one alone is not enough.
            if (g.core.has_room(len) && self.stage.is_empty_hint()) || g.core.ended().is_some() {
                return;
            }
        }
        space.await;
    }

    /// The caller stopped waiting for `call`: a late reply is dropped.
    /// Nothing is queued by this, so there is nothing to drive.
    pub(crate) fn cancel_call(&self, call: CallId) {
        let mut g = self.lock();
        g.waiters.remove(&call);
        g.core.cancel_call(call);
    }

    /// Wakes whoever waits for send-buffer room (shutdown).
    pub(crate) fn wake_senders(&self) {
        self.space.notify_waiters();
    }

    /// Fails every waiting call with `err` and forgets the connections
    /// (the process fenced itself or shuts down). Returns the calls failed
    /// and the messages abandoned.
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
        self.stage.close();
        let abandoned = g.core.stats().cache_messages;
        drop(g);
        self.space.notify_waiters();
        (n, abandoned)
    }

    /// The connections under the session's paths now.
    pub(crate) fn conns(&self) -> Vec<Arc<ConnIo>> {
        self.lock().conns.clone()
    }

    /// Shuts down the session's connections on `network` (the detector
    /// found the path silent): the readers see the end at once and the
    /// session re-sends those paths' in-flight messages elsewhere. Each
    /// socket resets as it closes rather than sending a FIN: over a path
    /// that fails one way (our ACKs lost) a FIN waits behind a backed-off
    /// retransmission and the peer, still hearing us, would never learn
    /// the connection is gone (one `role_netns` round in five under load).
    /// Returns how many.
    pub(crate) fn kill_network(&self, network: usize) -> usize {
        let g = self.lock();
        let mut n = 0;
        for c in g.conns.iter().filter(|c| c.network == network) {
            c.reset();
            n += 1;
        }
        n
    }

    /// Resets the session's connections on `network` that the core still
    /// suspects and whose TCP is backing off: the detector hears the
    /// network again, but such a connection would carry nothing until its
    /// next retransmission (a second or more after an outage of some
    /// hundreds of milliseconds), so a fresh one is dialled instead. A
    /// connection to a host that was only late is kept: its kernel
    /// acknowledged all along. Returns how many.
    pub(crate) fn reset_stuck(&self, network: usize) -> usize {
        let g = self.lock();
        let mut n = 0;
        for c in g.conns.iter().filter(|c| c.network == network) {
            if g.core.is_path_suspect(c.path) && c.tcp_backing_off() {
                c.reset();
                n += 1;
            }
        }
        n
    }

    /// Suspects the session's paths on `network` (the detector found it
    /// silent while another path of the peer is heard): their in-flight
    /// messages are re-sent elsewhere and new ones avoid them until they
    /// answer a probe; the connections stay (see
    /// [`PathReport::PathAbandon`](surelink_proto::detector::PathReport)
    /// for when they are given up). Returns how many.
    pub(crate) fn suspect_network(self: &Arc<Self>, shared: &Arc<Shared>, network: usize) -> usize {
        self.with(shared, |g, now| {
            let SessionInner { core, conns, .. } = g;
            conns
                .iter()
                .filter(|c| c.network == network)
                .filter(|c| core.handle_path_suspect(now, c.path))
                .count()
        })
    }

    /// Whether the core suspects `path` (its frames went unanswered).
    pub(crate) fn is_path_suspect(&self, path: PathId) -> bool {
        self.lock().core.is_path_suspect(path)
    }

    /// The core's counters and gauges.
    pub(crate) fn stats(&self) -> SessionStats {
        self.lock().core.stats()
    }

    /// A one-screen dump of the core session.
    #[cfg(feature = "test-util")]
    pub(crate) fn debug_dump(&self) -> String {
        self.lock().core.debug_dump()
    }
}
