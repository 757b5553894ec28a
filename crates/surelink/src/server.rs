//! Serving requests: the handler API, the executor the endpoint owns, and
//! the glue between sessions' tickets and the scheduler.
//!
//! Sessions admit requests (at most `max_requests_per_peer` outstanding per
//! peer) and hand them out as tickets; tickets go into the core's
//! [`RecoveryScheduler`] (one group, each pool's queue hr-net's priority
//! queues with per-session round robin by default). Handlers run on
//! **worker pools**, one per runtime worker thread, never inside a
//! reader's or a caller's task: a pool is one long-lived task that takes
//! tickets from the scheduler in a loop while it has free slots
//! (`max_concurrent_requests` split over the pools) and polls the
//! handlers it started side by side — a handler that awaits yields to its
//! pool's others, and the pool takes the next ticket as soon as one ends.
//! No task is spawned per request.
//!
//! A handler returns a reply or a typed [`HandlerError`]; one that panics
//! is caught: its caller gets [`RemoteError::Panicked`], its slot is
//! freed, and the connection and the other handlers carry on.
//!
//! One peer's requests are *started* (the handler called) in the order the
//! scheduler hands them out — per priority, the order they were sent —
//! even across pools (each start waits for its turn). Once started they run
//! concurrently.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use surelink_proto::rpc::recovery::{
    GroupId, Mapping, PoolId, RecoveryConfig, RecoveryScheduler, TaskOutcome,
};
use surelink_proto::rpc::{Priority, RemoteError, Ticket, TicketKey};
use surelink_proto::{CallId, ChannelId, NodeId};

use crate::config::SchedulerConfig;

use crate::session::SessionHandle;
use crate::shared::Shared;
use crate::sync::{lock, read, write};

/// A request handed to a [`Handler`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Request {
    /// The caller.
    pub peer: NodeId,
    /// The channel it came on.
    pub channel: ChannelId,
    /// Its priority (re-sent requests are high).
    pub priority: Priority,
    /// When the caller gives up, if it said (a handler may stop early).
    pub deadline: Option<Instant>,
    /// The caller's id for the call (the same on re-sends).
    pub call: CallId,
    /// The request body.
    pub body: Bytes,
}

/// An application error a handler returns; the caller receives it as
/// [`RemoteError::App`] (through [`CallError::Remote`](crate::CallError::Remote)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct HandlerError {
    /// The application's code.
    pub code: u32,
    /// The application's words (at most 4 KiB reach the caller).
    pub message: String,
}

impl HandlerError {
    /// An error with `code` and `message`.
    pub fn new(code: u32, message: impl Into<String>) -> HandlerError {
        HandlerError {
            code,
            message: message.into(),
        }
    }
}

/// What a handler's future may return: a reply, or a reply or an error.
pub trait IntoReply {
    /// The reply or the error.
    fn into_reply(self) -> Result<Bytes, HandlerError>;
}

impl IntoReply for Bytes {
    fn into_reply(self) -> Result<Bytes, HandlerError> {
        Ok(self)
    }
}

impl<E: Into<HandlerError>> IntoReply for Result<Bytes, E> {
    fn into_reply(self) -> Result<Bytes, HandlerError> {
        self.map_err(Into::into)
    }
}

/// The boxed future a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, HandlerError>> + Send>>;

/// Serves requests: one call per request the session admits (at most once
/// per call, however often it was sent).
pub trait Handler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, request: Request) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoReply,
{
    fn handle(&self, request: Request) -> HandlerFuture {
        let fut = self(request);
        Box::pin(async move { fut.await.into_reply() })
    }
}

/// A ticket on its way to a worker, with the session to answer through.
pub(crate) struct Job {
    pub(crate) session: Arc<SessionHandle>,
    pub(crate) ticket: Ticket,
}

/// The turns in which one session's requests start (see the module docs).
#[derive(Default)]
pub(crate) struct StartOrder {
    /// Turns handed out (under the queue lock, so in the scheduler's order).
    issued: AtomicU64,
    /// The turn that may start now.
    next: AtomicU64,
    /// Tasks polled before their turn came.
    early: Mutex<Vec<(u64, Waker)>>,
}

impl StartOrder {
    fn issue(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::Relaxed)
    }

    /// Waits until `turn` may start.
    async fn wait(&self, turn: u64) {
        std::future::poll_fn(|cx| {
            if self.next.load(Ordering::Acquire) == turn {
                return Poll::Ready(());
            }
            let mut early = lock(&self.early);
            // Checked again under the lock: `done` stores before it locks.
            if self.next.load(Ordering::Acquire) == turn {
                return Poll::Ready(());
            }
            match early.iter_mut().find(|(t, _)| *t == turn) {
                Some((_, w)) => w.clone_from(cx.waker()),
                None => early.push((turn, cx.waker().clone())),
            }
            Poll::Pending
        })
        .await;
    }

    /// `turn` has started: the next one may.
    fn done(&self, turn: u64) {
        self.next.store(turn + 1, Ordering::Release);
        let mut early = lock(&self.early);
        if let Some(i) = early.iter().position(|(t, _)| *t == turn + 1) {
            early.swap_remove(i).1.wake();
        }
    }
}

/// Passes the turn on however the start ends (a panic included).
struct Turn<'a>(&'a StartOrder, u64);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

/// Every request is in this group until services declare their own.
const DEFAULT_GROUP: GroupId = GroupId(0);

/// The executor: the scheduler, and its pools' tasks.
pub(crate) struct Server {
    handler: RwLock<Option<Arc<dyn Handler>>>,
    queue: Mutex<RecoveryScheduler<Job>>,
    /// Per pool: wakes its task (a ticket queued for it).
    wake: Vec<Notify>,
    pools: Mutex<Vec<JoinHandle<()>>>,
    started: AtomicBool,
    /// Slots per pool.
    slots: usize,
    running: AtomicUsize,
}

impl Server {
    /// Pools: one per worker thread of the runtime it is made on (one
    /// outside a runtime), `max_concurrent` slots split over them.
    pub(crate) fn new(sched: &SchedulerConfig, max_concurrent: usize) -> Server {
        let pools = tokio::runtime::Handle::try_current()
            .map_or(1, |h| h.metrics().num_workers())
            .max(1);
        let slots = max_concurrent.div_ceil(pools).max(1);
        let mut cfg = RecoveryConfig::new(pools, slots, &["default"]);
        cfg.mapping = Mapping::Dynamic;
        // One group is the whole server: no bound below the slots.
        cfg.groups[0].sigma = Some(max_concurrent.max(1));
        cfg.aging_bound = sched.aging_bound;
        let kind = sched.clone();
        let scheduler = RecoveryScheduler::with_queues(&cfg, move || kind.build())
            .expect("one group and pools of at least one slot are valid");
        Server {
            handler: RwLock::new(None),
            queue: Mutex::new(scheduler),
            wake: (0..pools).map(|_| Notify::new()).collect(),
            pools: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
            slots,
            running: AtomicUsize::new(0),
        }
    }

    pub(crate) fn set_handler(&self, h: Arc<dyn Handler>) {
        *write(&self.handler) = Some(h);
    }

    fn handler(&self) -> Option<Arc<dyn Handler>> {
        read(&self.handler).clone()
    }

    /// Queues admitted requests and promotes re-sent ones, then starts what
    /// workers are free for.
    /// Hands admitted requests (and promotions) to the scheduler. Called
    /// under the session's lock, so one session's requests enter in the
    /// order its core admitted them; [`Server::dispatch`] then starts them.
    pub(crate) fn enqueue(
        shared: &Shared,
        session: &Arc<SessionHandle>,
        tickets: Vec<Ticket>,
        promotes: Vec<CallId>,
    ) {
        if tickets.is_empty() && promotes.is_empty() {
            return;
        }
        let now = shared.clock.now_cached();
        {
            let mut q = lock(&shared.server.queue);
            for t in tickets {
                let key = TicketKey {
                    session: session.key,
                    call: t.call,
                };
                let prio = t.priority;
                let job = Job {
                    session: session.clone(),
                    ticket: t,
                };
                // The one group exists: nothing is handed back.
                let _ = q.push(now, DEFAULT_GROUP, key, prio, job);
            }
            for call in promotes {
                q.promote(TicketKey {
                    session: session.key,
                    call,
                });
            }
        }
    }

    /// Wakes a pool for what was queued (the pools start on first use,
    /// inside the runtime).
    pub(crate) fn dispatch(shared: &Arc<Shared>) {
        let server = &shared.server;
        // A closed endpoint starts no pool (one would hold it for ever).
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
        if !server.started.swap(true, Ordering::AcqRel) {
            let mut pools = lock(&server.pools);
            for p in 0..server.wake.len() {
                let sh = shared.clone();
                pools.push(tokio::spawn(pool_loop(sh, p)));
            }
        }
        server.wake_one_with_room(&lock(&server.queue));
    }

    /// Wakes the least busy pool that has a free slot, if something waits
    /// (when every pool is full, the first handler to end takes it).
    fn wake_one_with_room(&self, q: &RecoveryScheduler<Job>) {
        if q.is_empty() {
            return;
        }
        let least = (0..self.wake.len())
            .map(|p| (q.busy(PoolId(u16::try_from(p).unwrap_or(u16::MAX))), p))
            .min();
        if let Some((_, p)) = least.filter(|(busy, _)| *busy < self.slots) {
            self.wake[p].notify_one();
        }
    }

    /// A session ended: its waiting requests are dropped (never run; the
    /// caller learns the session ended on its side).
    pub(crate) fn remove_session(&self, key: u64) -> usize {
        lock(&self.queue).remove_session(key).len()
    }

    /// Requests waiting and running.
    pub(crate) fn load(&self) -> (usize, usize) {
        let waiting = lock(&self.queue).len();
        (waiting, self.running.load(Ordering::Relaxed))
    }

    /// Stops every running handler (shutdown): the pools and what they run.
    pub(crate) fn abort_all(&self) {
        for p in lock(&self.pools).drain(..) {
            p.abort();
        }
    }
}

/// One pool: takes tickets from the scheduler while it has free slots,
/// runs their handlers side by side in this one task, and takes the next
/// as soon as one ends.
async fn pool_loop(shared: Arc<Shared>, p: usize) {
    let pool = PoolId(u16::try_from(p).unwrap_or(u16::MAX));
    let server = &shared.server;
    let mut running = FuturesUnordered::new();
    loop {
        loop {
            let next = {
                let mut q = lock(&server.queue);
                let now = shared.clock.now_cached();
                q.pop(now, pool).map(|t| {
                    let turn = t.dispatch.item.session.start_order.issue();
                    (t, turn)
                })
            };
            let Some((task, turn)) = next else { break };
            server.running.fetch_add(1, Ordering::Relaxed);
            let handler = server.handler();
            // Whatever panics in it ends that request only, not the pool
            // (the handler's own panics are answered inside `run`).
            let fut = run(shared.clone(), task.dispatch.item, turn, handler);
            running.push(AssertUnwindSafe(fut).catch_unwind().map(|_| ()));
        }
        // More waits than this pool takes now: a pool with room takes it.
        server.wake_one_with_room(&lock(&server.queue));
        tokio::select! {
            Some(()) = running.next(), if !running.is_empty() => {
                server.running.fetch_sub(1, Ordering::Relaxed);
                let now = shared.clock.now_cached();
                lock(&server.queue).handle_done(now, pool, DEFAULT_GROUP, TaskOutcome::Completed);
            }
            () = server.wake[p].notified() => {}
        }
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
    }
}

/// Runs one request and answers it through its session.
async fn run(shared: Arc<Shared>, job: Job, turn: u64, handler: Option<Arc<dyn Handler>>) {
    let Job { session, ticket } = job;
    session.start_order.wait(turn).await;
    let turn = Turn(&session.start_order, turn);
    let now = shared.clock.now_cached();
    let result = match handler {
        None => Err(RemoteError::NoHandler),
        Some(_) if ticket.deadline.is_some_and(|d| d <= now) => Err(RemoteError::Expired),
        Some(h) => {
            let req = Request {
                peer: ticket.peer,
                channel: ticket.channel,
                priority: ticket.priority,
                deadline: ticket.deadline.map(|d| shared.clock.instant(d).into_std()),
                call: ticket.call,
                body: ticket.body,
            };
            // Both the call that makes the future and the future itself may
            // panic; either way the caller gets a typed answer.
            let started = std::panic::catch_unwind(AssertUnwindSafe(|| h.handle(req)));
            drop(turn);
            match started {
                Err(_) => Err(RemoteError::Panicked),
                Ok(fut) => match AssertUnwindSafe(fut).catch_unwind().await {
                    Ok(Ok(reply)) => Ok(reply),
                    Ok(Err(e)) => Err(RemoteError::App {
                        code: e.code,
                        message: e.message,
                    }),
                    Err(_) => Err(RemoteError::Panicked),
                },
            }
        }
    };
    match &result {
        Err(RemoteError::Panicked) => shared.stats.handler_panicked(),
        Err(_) => shared.stats.handler_failed(),
        Ok(_) => {}
    }
    session.complete(&shared, ticket.call, result);
}
