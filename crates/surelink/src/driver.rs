//! The state every task shares, and the one routine that drives the core:
//! after any input, write what the core wants written, hand out what it
//! delivered, and re-arm its timer.
//!
//! There is no driver task in the way of the data: a reader task that
//! receives bytes, or a caller that sends, locks the core, feeds it, and
//! writes its output straight to the sockets. Work that may block or take
//! long (running a request handler) happens after the lock is released.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use tokio::sync::{broadcast, oneshot, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use surelink_proto::detector::PathReport;
use surelink_proto::rpc::{DispatchQueue, Priority};
use surelink_proto::{
    ChannelId, Endpoint as Core, Epoch, Event, MessageId, NodeId, PathCloseReason, PathError,
    PathId, Prefix, SessionEndReason, SessionId, Time,
};

use crate::config::Config;
use crate::conn::ConnIo;
use crate::error::CallError;
use crate::rpc::{self, Body};
use crate::stats::Stats;

/// Longest the timer task sleeps while the core has any deadline.
const TIMER_TICK: std::time::Duration = std::time::Duration::from_millis(25);

/// Bytes of deferred sends after which the sender writes them itself.
const FLUSH_BATCH: usize = 32 * 1024;

/// Bytes per `poll_transmit`: big enough to batch, small enough to interleave paths.
const TRANSMIT_BUDGET: usize = 256 * 1024;

/// A request handed to a [`Handler`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The caller.
    pub peer: NodeId,
    /// The channel it came on (the reply goes back on it).
    pub channel: u16,
    /// The request body.
    pub body: Bytes,
}

/// A one-way message taken by [`Endpoint::recv`](crate::Endpoint::recv).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The sender.
    pub peer: NodeId,
    /// Its channel.
    pub channel: u16,
    /// The message.
    pub body: Bytes,
}

/// One-way messages waiting for `recv`: high priority first, normal ones
/// no longer than the aging bound behind them (hr-net's queues).
pub(crate) struct IncomingQueue {
    pub(crate) queue: DispatchQueue<Incoming>,
    next: u64,
}

/// The boxed future a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Bytes> + Send + 'static>>;

/// Serves requests: one call per request, exactly once per request the
/// session delivers; the returned bytes are the reply.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, request: Request) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Bytes> + Send + 'static,
{
    fn handle(&self, request: Request) -> HandlerFuture {
        Box::pin(self(request))
    }
}

/// What the endpoint reports about paths and peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetEvent {
    /// A path finished its handshake.
    PathUp {
        /// The peer.
        peer: NodeId,
        /// The path.
        path: PathId,
        /// Its network.
        network: usize,
    },
    /// A path is gone; its in-flight messages moved to the other paths.
    PathDown {
        /// The peer, when known.
        peer: Option<NodeId>,
        /// The path.
        path: PathId,
        /// Its network.
        network: usize,
        /// Messages re-sent elsewhere.
        resent: usize,
        /// Why, in words.
        reason: String,
    },
    /// A peer has a working path (again).
    PeerUp {
        /// The peer.
        peer: NodeId,
        /// Its incarnation.
        epoch: Epoch,
    },
    /// A peer has no working path; messages queue until one returns or the
    /// linger time passes.
    PeerUnreachable {
        /// The peer.
        peer: NodeId,
    },
    /// The failure detector found a path silent for a whole window (after
    /// its SafeTimer checks); its connections were shut down and their
    /// in-flight messages moved to the other paths.
    PathSilent {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: usize,
        /// How long ago it was last heard, in microseconds.
        silent_for_us: u64,
    },
    /// A silent path is heard again (and is being re-dialled).
    PathHeard {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: usize,
    },
    /// Every path to the peer is silent: the detector considers it dead.
    PeerDead {
        /// The peer.
        peer: NodeId,
    },
    /// A peer considered dead is heard again.
    PeerAlive {
        /// The peer.
        peer: NodeId,
    },
    /// This process missed a heartbeat deadline and fenced itself: nothing
    /// it queued before went out after `t_valid`, every session ended, and it
    /// continues as a new incarnation (peers see `PeerRestarted`).
    Fenced {
        /// The incarnation that was fenced.
        old_epoch: Epoch,
        /// The new one.
        new_epoch: Epoch,
        /// Calls failed with [`CallError::Fenced`].
        calls_failed: usize,
        /// Messages that were not confirmed delivered.
        abandoned: u64,
    },
    /// A session ended; outstanding calls failed with the matching error.
    SessionEnded {
        /// The peer.
        peer: NodeId,
        /// Why (e.g. `PeerRestarted`).
        reason: SessionEndReason,
        /// Messages whose delivery was not confirmed.
        abandoned: u64,
    },
}

/// A call waiting for its reply.
#[derive(Debug)]
pub(crate) struct PendingCall {
    pub(crate) peer: NodeId,
    pub(crate) session: SessionId,
    pub(crate) tx: oneshot::Sender<Result<Bytes, CallError>>,
}

/// A connection as the core's driver knows it.
#[derive(Debug)]
pub(crate) struct ConnEntry {
    pub(crate) io: Arc<ConnIo>,
    pub(crate) peer: Option<NodeId>,
}

/// Everything behind the lock.
pub(crate) struct Inner {
    pub(crate) core: Core,
    pub(crate) conns: HashMap<PathId, ConnEntry>,
    pub(crate) calls: HashMap<u64, PendingCall>,
    /// One-way messages taken in this `drive`, moved to `Shared::incoming`
    /// at its end in one go.
    incoming_batch: Vec<(Incoming, Priority)>,
    pub(crate) requests_running: usize,
    pub(crate) handler: Option<Arc<dyn Handler>>,
    /// Request queues and at-most-once bookkeeping.
    pub(crate) server: crate::dispatch::ServerState,
    out: BytesMut,
    /// The deadline the timer task sleeps towards.
    armed: Option<Time>,
}

/// State shared by the public handles and every task.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    pub(crate) config: Config,
    /// This process's incarnation (a new one after a fence).
    pub(crate) epoch: AtomicU64,
    base: tokio::time::Instant,
    /// The failure detector, unless it is off.
    pub(crate) detector: Option<Arc<crate::detector::Detector>>,
    /// A silent path is heard again: dial loops retry at once.
    pub(crate) redial: Notify,
    /// Re-arms the timer task.
    timer: Notify,
    /// Asks the flush task to write what `send` queued.
    flush: Notify,
    /// Send-buffer space may have been freed.
    pub(crate) space: Notify,
    /// A one-way message was queued for `recv`.
    pub(crate) incoming_ready: Notify,
    /// One-way messages for `recv`, behind their own lock so a receiving
    /// application does not contend with the core.
    pub(crate) incoming: Mutex<IncomingQueue>,
    pub(crate) incoming_len: std::sync::atomic::AtomicUsize,
    pub(crate) events: broadcast::Sender<NetEvent>,
    pub(crate) stats: Stats,
    next_path: AtomicU64,
    next_call: AtomicU64,
    last_now: AtomicU64,
    /// Bytes queued by deferred sends since the core was last driven.
    unflushed: std::sync::atomic::AtomicUsize,
    /// The flush task has been asked to run and has not started yet.
    flush_scheduled: AtomicBool,
    pub(crate) closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Work found while holding the lock, done after releasing it.
pub(crate) enum Job {
    Request {
        handler: Arc<dyn Handler>,
        request: Request,
        work: crate::dispatch::Work,
    },
    Event(NetEvent),
    Close(Arc<ConnIo>),
    IncomingReady,
    /// Write what was queued on this connection.
    Flush(Arc<ConnIo>),
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        core: Core,
        epoch: Epoch,
        base: std::time::Instant,
        detector: Option<Arc<crate::detector::Detector>>,
    ) -> Shared {
        let (events, _) = broadcast::channel(1024);
        let aging = config.dispatch.aging_bound;
        Shared {
            inner: Mutex::new(Inner {
                core,
                conns: HashMap::new(),
                calls: HashMap::new(),
                incoming_batch: Vec::new(),
                requests_running: 0,
                handler: None,
                server: crate::dispatch::ServerState::new(config.dispatch.clone()),
                out: BytesMut::with_capacity(TRANSMIT_BUDGET * 2),
                armed: None,
            }),
            config,
            epoch: AtomicU64::new(epoch.0),
            base: tokio::time::Instant::from_std(base),
            detector,
            redial: Notify::new(),
            timer: Notify::new(),
            flush: Notify::new(),
            space: Notify::new(),
            incoming_ready: Notify::new(),
            incoming: Mutex::new(IncomingQueue {
                queue: DispatchQueue::new(aging),
                next: 0,
            }),
            incoming_len: std::sync::atomic::AtomicUsize::new(0),
            events,
            stats: Stats::default(),
            next_path: AtomicU64::new(1),
            next_call: AtomicU64::new(1),
            last_now: AtomicU64::new(0),
            unflushed: std::sync::atomic::AtomicUsize::new(0),
            flush_scheduled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the core consistent enough to
        // continue (every mutation is a whole core call); do not cascade it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The core's clock: time since the endpoint started.
    pub(crate) fn now(&self) -> Time {
        let t = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_now.store(t, Ordering::Relaxed);
        Time::from_nanos(t)
    }

    /// The last time read by `now`: good enough for queueing a message (the
    /// core only keeps its clock monotonic with it), and free.
    pub(crate) fn now_cached(&self) -> Time {
        Time::from_nanos(self.last_now.load(Ordering::Relaxed))
    }

    fn instant(&self, t: Time) -> tokio::time::Instant {
        self.base + t.since_origin()
    }

    pub(crate) fn next_path_id(&self) -> PathId {
        PathId(self.next_path.fetch_add(1, Ordering::Relaxed))
    }

    /// Spawns a task that is aborted when the endpoint shuts down.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(fut);
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    /// Shuts down every connection's socket and forgets them.
    pub(crate) fn kill_connections(&self) {
        let mut g = self.lock();
        for (_, c) in g.conns.drain() {
            c.io.kill();
        }
    }

    /// Counters, histograms and per-session state.
    pub(crate) fn snapshot(&self) -> crate::stats::StatsSnapshot {
        let sessions = {
            let g = self.lock();
            let mut peers: Vec<NodeId> = g.core.peers().collect();
            peers.sort();
            peers
                .into_iter()
                .filter_map(|p| g.core.session_stats(p).map(|s| (p, s)))
                .collect()
        };
        let mut snap = self.stats.snapshot(sessions);
        snap.detector = self.detector.as_ref().map(|d| d.snapshot());
        snap
    }

    /// A fresh call id.
    pub(crate) fn next_call_id(&self) -> u64 {
        self.next_call.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes the flush task.
    pub(crate) fn request_flush(&self) {
        self.flush.notify_one();
    }

    pub(crate) fn abort_tasks(&self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// Writes what the core wants written, hands out what it delivered, and
/// re-arms the timer. Call with the lock held after every input to the core.
pub(crate) fn drive(inner: &mut Inner, shared: &Shared) -> Vec<Job> {
    let now = shared.now();
    shared.unflushed.store(0, Ordering::Relaxed);
    let mut jobs = Vec::new();
    loop {
        let Inner {
            core, out, conns, ..
        } = &mut *inner;
        let Some(path) = core.poll_transmit(now, out, TRANSMIT_BUDGET) else {
            break;
        };
        let bytes = out.split().freeze();
        shared.stats.bytes_sent(bytes.len());
        if let Some(c) = conns.get(&path) {
            c.io.enqueue(bytes);
            // Written after the lock is released (see `ConnIo::flush`).
            if !jobs
                .iter()
                .any(|j| matches!(j, Job::Flush(io) if io.path == path))
            {
                jobs.push(Job::Flush(c.io.clone()));
            }
        }
    }
    loop {
        // Take a message only if there is room for it: leaving it in the core
        // leaves it unacknowledged, which holds the sender back.
        if let Some(p) = inner.core.peek_message() {
            match rpc::kind(p) {
                Some(rpc::REQUEST)
                    if inner.server.dispatcher.queued() >= shared.config.max_queued_requests =>
                {
                    break
                }
                Some(rpc::ONEWAY)
                    if shared.incoming_len.load(Ordering::Relaxed) + inner.incoming_batch.len()
                        >= shared.config.incoming_buffer =>
                {
                    break
                }
                _ => {}
            }
        }
        let Some(ev) = inner.core.poll_event() else {
            break;
        };
        handle_event(inner, shared, ev, &mut jobs);
    }
    crate::dispatch::dispatch_ready(inner, shared, &mut jobs);
    if !inner.incoming_batch.is_empty() {
        let mut q = shared.incoming.lock().unwrap_or_else(|e| e.into_inner());
        shared
            .incoming_len
            .fetch_add(inner.incoming_batch.len(), Ordering::Relaxed);
        let now = shared.now_cached();
        for (m, priority) in inner.incoming_batch.drain(..) {
            let key = q.next;
            q.next += 1;
            q.queue.push(now, key, m, priority, None);
        }
        jobs.push(Job::IncomingReady);
    }
    let t = inner.core.poll_timeout();
    if t.is_some() && (inner.armed.is_none() || t < inner.armed) {
        inner.armed = t;
        shared.timer.notify_one();
    }
    jobs
}

fn handle_event(inner: &mut Inner, shared: &Shared, ev: Event, jobs: &mut Vec<Job>) {
    match ev {
        Event::Message {
            peer,
            channel,
            payload,
            ..
        } => {
            shared.stats.message_received();
            match rpc::decode(payload) {
                Some(Body::Oneway(body)) => {
                    inner.incoming_batch.push((
                        Incoming {
                            peer,
                            channel: channel.0,
                            body,
                        },
                        Priority::Normal,
                    ));
                }
                Some(Body::OnewayHigh(channel, body)) => {
                    inner.incoming_batch.push((
                        Incoming {
                            peer,
                            channel,
                            body,
                        },
                        Priority::High,
                    ));
                }
                Some(Body::Request(header, body)) => {
                    crate::dispatch::on_request(inner, shared, peer, channel, header, body);
                }
                Some(Body::Reply(id, body)) => {
                    if let Some(call) = inner.calls.remove(&id) {
                        if call.peer == peer {
                            let _ = call.tx.send(Ok(body));
                        } else {
                            inner.calls.insert(id, call);
                        }
                    }
                }
                None => {
                    shared.stats.malformed_message();
                    warn!(%peer, channel = channel.0, "message without a valid header dropped");
                }
            }
        }
        Event::PathUp { peer, path } => {
            let network = inner.conns.get(&path).map_or(0, |c| c.io.network);
            if let Some(c) = inner.conns.get_mut(&path) {
                c.peer = Some(peer);
                c.io.set_peer(peer);
            }
            info!(%peer, %path, network, "path up");
            shared.stats.path_up();
            jobs.push(Job::Event(NetEvent::PathUp {
                peer,
                path,
                network,
            }));
        }
        Event::PathClosed {
            peer,
            path,
            reason,
            resent,
        } => {
            let (network, peer) = match inner.conns.remove(&path) {
                Some(c) => {
                    let network = c.io.network;
                    jobs.push(Job::Close(c.io));
                    (network, peer.or(c.peer))
                }
                None => (0, peer),
            };
            match &reason {
                PathCloseReason::Error(e) => warn!(%path, ?peer, error = %e, "path closed"),
                r => info!(%path, ?peer, reason = ?r, resent, "path closed"),
            }
            shared.stats.path_down(resent);
            jobs.push(Job::Event(NetEvent::PathDown {
                peer,
                path,
                network,
                resent,
                reason: format!("{reason:?}"),
            }));
        }
        Event::PeerUp { peer, epoch, .. } => {
            jobs.push(Job::Event(NetEvent::PeerUp { peer, epoch }))
        }
        Event::PeerUnreachable { peer, .. } => {
            warn!(%peer, "peer unreachable: no working path");
            jobs.push(Job::Event(NetEvent::PeerUnreachable { peer }))
        }
        Event::SessionEnded {
            peer,
            session,
            reason,
            abandoned,
        } => {
            let failed: Vec<u64> = inner
                .calls
                .iter()
                .filter(|(_, c)| c.peer == peer && c.session == session)
                .map(|(&id, _)| id)
                .collect();
            for id in failed {
                if let Some(c) = inner.calls.remove(&id) {
                    let _ = c.tx.send(Err(CallError::from_end(peer, &reason)));
                }
            }
            let n: u64 = abandoned.iter().map(|a| a.end - a.start).sum();
            match reason {
                SessionEndReason::ClosedLocally | SessionEndReason::ClosedByPeer { .. } => {
                    info!(%peer, ?reason, abandoned = n, "session closed")
                }
                _ => warn!(%peer, ?reason, abandoned = n, "session ended"),
            }
            crate::dispatch::forget_peer(inner, peer);
            jobs.push(Job::Event(NetEvent::SessionEnded {
                peer,
                reason,
                abandoned: n,
            }));
        }
        Event::MessageRejected { peer, reason, .. } => {
            warn!(%peer, ?reason, "queued message rejected by the peer's limits");
        }
    }
}

thread_local! {
    /// Set while a handler runs inline in `run_jobs` (and while its reply
    /// is being queued): requests dispatched then go to their own task.
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Does what `drive` found, outside the lock.
pub(crate) fn run_jobs(shared: &Arc<Shared>, jobs: Vec<Job>) {
    let mut ready = Vec::new();
    for job in jobs {
        match job {
            Job::Request {
                handler,
                request,
                work,
            } => {
                let (peer, channel) = (request.peer, request.channel);
                if INLINE.with(std::cell::Cell::get) {
                    // Already inside an inline handler (a reply just went
                    // out and freed a worker): run this one in its own
                    // task, so the reader gets back to its socket and new
                    // requests — high-priority ones among them — reach the
                    // dispatch queues instead of waiting in the kernel.
                    let fut = handler.handle(request);
                    spawn_reply(shared, work, peer, channel, fut);
                    continue;
                }
                let mut fut = handler.handle(request);
                // Try the handler right here first: most handlers of a
                // metadata or key-value service answer without waiting, and
                // then the reply leaves without a task switch. One that waits
                // moves to its own task (polling it again there registers
                // the real waker; the no-op one used here is forgotten).
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                INLINE.with(|i| i.set(true));
                let polled = fut.as_mut().poll(&mut cx);
                INLINE.with(|i| i.set(false));
                if let std::task::Poll::Ready(reply) = polled {
                    // Answered at once: queued with the other ready replies
                    // of this batch, written together below.
                    ready.push((work, peer, channel, reply));
                    continue;
                }
                spawn_reply(shared, work, peer, channel, fut);
            }
            Job::Event(e) => {
                let _ = shared.events.send(e);
            }
            Job::Close(io) => {
                tokio::spawn(io.close_after_flush());
            }
            Job::IncomingReady => shared.incoming_ready.notify_waiters(),
            Job::Flush(io) => io.flush(),
        }
    }
    if !ready.is_empty() {
        // Replies of inline handlers free workers; what `reply_batch`
        // dispatches next runs in tasks (see `INLINE`).
        INLINE.with(|i| i.set(true));
        reply_batch(shared, ready);
        INLINE.with(|i| i.set(false));
    }
}

/// Runs a handler that has to wait in its own task, then sends its reply.
fn spawn_reply(
    shared: &Arc<Shared>,
    work: crate::dispatch::Work,
    peer: NodeId,
    channel: u16,
    fut: HandlerFuture,
) {
    let sh = shared.clone();
    tokio::spawn(async move {
        let reply = fut.await;
        let prefix = rpc::call_prefix(rpc::REPLY, 0, channel, work.id);
        let sent = match send_message(
            &sh,
            peer,
            ChannelId(work.reply_channel),
            prefix,
            reply.clone(),
            Flush::Now,
            |_, _| {},
        )
        .await
        {
            Ok(m) => Some(m),
            Err(e) => {
                debug!(%peer, error = %e, "reply not sent");
                None
            }
        };
        let jobs = {
            let mut g = sh.lock();
            crate::dispatch::finished(&mut g, &work, reply, sent);
            drive(&mut g, &sh)
        };
        run_jobs(&sh, jobs);
    });
}

/// A reply that was ready at once: (work, peer, the caller's channel, reply).
type Ready = (crate::dispatch::Work, NodeId, u16, Bytes);

/// Queues replies that were ready at once, all under one lock, and writes
/// them with one `drive` (one system call per path for the whole batch).
/// Replies that do not fit the send buffer wait in their own task.
fn reply_batch(shared: &Arc<Shared>, ready: Vec<Ready>) {
    let mut waiting = Vec::new();
    let jobs = {
        let mut g = shared.lock();
        let now = shared.now();
        for (work, peer, channel, reply) in ready {
            let prefix = rpc::call_prefix(rpc::REPLY, 0, channel, work.id);
            let sent = match g.core.send_with_prefix(
                now,
                peer,
                ChannelId(work.reply_channel),
                prefix,
                reply.clone(),
            ) {
                Err(surelink_proto::SendError::Full { message, .. }) => {
                    waiting.push((work, peer, channel, message));
                    continue;
                }
                Err(e) => {
                    debug!(%peer, error = %e, "reply not sent");
                    None
                }
                Ok(m) => {
                    shared.stats.message_sent();
                    Some(m)
                }
            };
            crate::dispatch::finished(&mut g, &work, reply, sent);
        }
        drive(&mut g, shared)
    };
    for (work, peer, channel, reply) in waiting {
        spawn_reply(shared, work, peer, channel, Box::pin(async move { reply }));
    }
    run_jobs(shared, jobs);
}

/// When a queued message is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flush {
    /// By the caller, before `send_message` returns: lowest latency (calls,
    /// replies).
    Now,
    /// By the flush task: a caller sending in a loop does not pay a system
    /// call per message; the flush task writes whatever accumulated at once.
    Deferred,
}

/// Writes what `send` queued; see [`Flush::Deferred`].
pub(crate) async fn flush_loop(shared: Arc<Shared>) {
    loop {
        shared.flush.notified().await;
        // Let a sender in a loop add a few more messages first: one write
        // for many, at the cost of one scheduling round of latency.
        tokio::task::yield_now().await;
        shared.flush_scheduled.store(false, Ordering::Relaxed);
        let jobs = {
            let mut g = shared.lock();
            drive(&mut g, &shared)
        };
        run_jobs(&shared, jobs);
    }
}

/// Queues a message, waiting while the session's send buffer is full.
pub(crate) async fn send_message(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: ChannelId,
    prefix: Prefix,
    mut msg: Bytes,
    flush: Flush,
    on_queued: impl FnOnce(&mut Inner, MessageId),
) -> Result<MessageId, crate::error::SendError> {
    let mut on_queued = Some(on_queued);
    // Registered only once the buffer was found full (registering costs a
    // lock); the retry after registering closes the race with a wake-up.
    let mut space = std::pin::pin!(shared.space.notified());
    let mut registered = false;
    loop {
        if shared.closed.load(Ordering::Relaxed) {
            return Err(crate::error::SendError::Closed);
        }
        let len = prefix.as_slice().len() + msg.len();
        let (r, drove, jobs) = {
            let mut g = shared.lock();
            let now = if flush == Flush::Now {
                shared.now()
            } else {
                shared.now_cached()
            };
            let r = g.core.send_with_prefix(now, peer, channel, prefix, msg);
            if let (Ok(id), Some(f)) = (&r, on_queued.take()) {
                f(&mut g, *id);
            }
            // Deferred sends still write themselves once a batch is big
            // enough to be worth a system call.
            let drive_now = r.is_ok()
                && (flush == Flush::Now
                    || shared.unflushed.fetch_add(len, Ordering::Relaxed) + len >= FLUSH_BATCH);
            let jobs = if drive_now {
                drive(&mut g, shared)
            } else {
                Vec::new()
            };
            (r, drive_now, jobs)
        };
        run_jobs(shared, jobs);
        match r {
            Ok(id) => {
                if !drove && !shared.flush_scheduled.swap(true, Ordering::Relaxed) {
                    shared.flush.notify_one();
                }
                shared.stats.message_sent();
                return Ok(id);
            }
            Err(surelink_proto::SendError::Full { message, .. }) => {
                msg = message;
                if registered {
                    space.as_mut().await;
                    space.set(shared.space.notified());
                    registered = false;
                } else {
                    space.as_mut().enable();
                    registered = true;
                }
            }
            Err(e) => return Err(crate::error::SendError::Core(e)),
        }
    }
}

/// Bytes arrived on `path`. Returns the error if the core refused them (the
/// connection is then closed).
pub(crate) fn input(shared: &Arc<Shared>, path: PathId, buf: &mut BytesMut) -> Option<PathError> {
    let (err, jobs) = {
        let mut g = shared.lock();
        let now = shared.now();
        let err = g.core.handle_input(now, path, buf).err();
        (err, drive(&mut g, shared))
    };
    run_jobs(shared, jobs);
    // Acknowledgements may have freed send-buffer space.
    shared.space.notify_waiters();
    match err {
        // Closed meanwhile; the reader ends on its own.
        Some(PathError::UnknownPath(_)) => None,
        Some(e) => {
            shared.stats.refused_input();
            Some(e)
        }
        None => None,
    }
}

/// A new connection joins the core.
pub(crate) fn add_path(shared: &Arc<Shared>, io: Arc<ConnIo>, peer: Option<NodeId>) {
    let jobs = {
        let mut g = shared.lock();
        let now = shared.now();
        let path = io.path;
        g.conns.insert(path, ConnEntry { io, peer });
        if let Err(e) = g.core.add_path(now, path, peer) {
            warn!(%path, error = %e, "path refused");
            if let Some(c) = g.conns.remove(&path) {
                c.io.kill();
            }
        }
        drive(&mut g, shared)
    };
    run_jobs(shared, jobs);
}

/// A connection ended.
pub(crate) fn path_down(shared: &Arc<Shared>, path: PathId) {
    let jobs = {
        let mut g = shared.lock();
        let now = shared.now();
        g.core.handle_path_down(now, path);
        // Drive first: the PathClosed event it yields still finds the
        // connection (for its network).
        let jobs = drive(&mut g, shared);
        g.conns.remove(&path);
        jobs
    };
    run_jobs(shared, jobs);
    shared.space.notify_waiters();
}

/// Runs the core's timers.
pub(crate) async fn timer_loop(shared: Arc<Shared>) {
    loop {
        let notified = shared.timer.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Sleep to the core's deadline, but never longer than a tick while
        // one exists: then a new deadline at least a tick away (a delayed
        // acknowledgement, a retransmission timeout) needs no wake-up call
        // from the data path, which would cost a thread switch per message.
        let wake_at = {
            let mut g = shared.lock();
            let now = shared.now();
            let w = g.core.poll_timeout().map(|t| t.min(now + TIMER_TICK));
            g.armed = w;
            w
        };
        match wake_at {
            Some(t) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(shared.instant(t)) => {
                        let jobs = {
                            let mut g = shared.lock();
                            let now = shared.now();
                            if g.core.poll_timeout().is_some_and(|d| d <= now) {
                                g.core.handle_timeout(now);
                            }
                            drive(&mut g, &shared)
                        };
                        run_jobs(&shared, jobs);
                        shared.space.notify_waiters();
                    }
                    _ = &mut notified => {}
                }
            }
            None => notified.await,
        }
    }
}

/// Acts on a failure-detector report.
pub(crate) fn detector_report(shared: &Arc<Shared>, report: PathReport) {
    let event = match report {
        PathReport::PathDown { watch, last_heard } => {
            let network = usize::from(watch.network);
            let mut killed = 0;
            {
                let g = shared.lock();
                for c in g.conns.values() {
                    if c.io.network == network && c.io.peer() == Some(watch.peer) {
                        // The reader sees the end at once and the session
                        // re-sends this path's in-flight messages elsewhere.
                        c.io.kill();
                        killed += 1;
                    }
                }
            }
            // `last_heard` is on the detector's clock.
            let now = shared
                .detector
                .as_ref()
                .map_or(last_heard, |d| d.gate.now());
            let silent = now.saturating_since(last_heard);
            warn!(peer = %watch.peer, network, silent_ms = silent.as_millis(), killed, "path silent: failing over");
            NetEvent::PathSilent {
                peer: watch.peer,
                network,
                silent_for_us: u64::try_from(silent.as_micros()).unwrap_or(u64::MAX),
            }
        }
        PathReport::PathUp { watch } => {
            info!(peer = %watch.peer, network = watch.network, "path heard again");
            shared.redial.notify_waiters();
            NetEvent::PathHeard {
                peer: watch.peer,
                network: usize::from(watch.network),
            }
        }
        PathReport::PeerDown { peer } => {
            warn!(%peer, "every path to the peer is silent: peer dead");
            NetEvent::PeerDead { peer }
        }
        PathReport::PeerUp { peer } => NetEvent::PeerAlive { peer },
    };
    let _ = shared.events.send(event);
}

/// After the fence closed: end every session, fail every call, and go on
/// as a new incarnation so peers learn that this one stopped.
pub(crate) fn recover_from_fence(shared: &Arc<Shared>) {
    let old = Epoch(shared.epoch.load(Ordering::Relaxed));
    let new = Epoch(old.0 + 1);
    let (calls_failed, abandoned) = {
        let mut g = shared.lock();
        for (_, c) in g.conns.drain() {
            c.io.kill();
        }
        let abandoned: u64 = g
            .core
            .peers()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|p| g.core.session_stats(p))
            .map(|s| s.cache_messages)
            .sum();
        let calls: Vec<PendingCall> = g.calls.drain().map(|(_, c)| c).collect();
        let n = calls.len();
        for c in calls {
            let _ = c.tx.send(Err(CallError::Fenced { epoch: old }));
        }
        let identity = surelink_proto::LocalIdentity {
            cluster: shared.config.cluster,
            node: shared.config.node,
            epoch: new,
        };
        match Core::new(shared.config.core.clone(), identity) {
            Ok(core) => g.core = core,
            Err(e) => warn!(error = %e, "could not start the new incarnation"),
        }
        shared.epoch.store(new.0, Ordering::Relaxed);
        g.armed = None;
        (n, abandoned)
    };
    if let Some(d) = &shared.detector {
        d.restart_fence(new);
    }
    shared.timer.notify_one();
    shared.space.notify_waiters();
    shared.redial.notify_waiters();
    let _ = shared.events.send(NetEvent::Fenced {
        old_epoch: old,
        new_epoch: new,
        calls_failed,
        abandoned,
    });
}
