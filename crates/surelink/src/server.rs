//! Serving requests: the handler API, the executor the endpoint owns, and
//! the glue between sessions' tickets and the scheduler.
//!
//! Sessions admit requests (at most `max_requests_per_peer` outstanding per
//! peer) and hand them out as tickets; tickets go into one [`Scheduler`]
//! (hr-net's priority queues with per-session round robin by default), and
//! up to `max_concurrent_requests` run at once, each in its own task on the
//! endpoint's executor — never inside a reader's or a caller's task. A
//! handler returns a reply or a typed [`HandlerError`]; one that panics is
//! caught: its caller gets [`RemoteError::Panicked`], its slot is freed,
//! and the connection and the other handlers carry on.
//!
//! One peer's requests are *started* (the handler called) in the order the
//! scheduler hands them out — per priority, the order they were sent —
//! even though each runs in its own task and the runtime may poll a later
//! task first (tokio runs the last task a worker spawned before the ones
//! spawned just ahead of it). Once started they run concurrently.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::task::JoinSet;

use surelink_proto::rpc::{Priority, RemoteError, Scheduler, Ticket, TicketKey};
use surelink_proto::{CallId, ChannelId, NodeId};

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

struct Queue {
    scheduler: Box<dyn Scheduler<Job>>,
    running: usize,
}

/// The executor and its queue.
pub(crate) struct Server {
    handler: RwLock<Option<Arc<dyn Handler>>>,
    queue: Mutex<Queue>,
    tasks: Mutex<JoinSet<()>>,
    max_concurrent: usize,
}

impl Server {
    pub(crate) fn new(scheduler: Box<dyn Scheduler<Job>>, max_concurrent: usize) -> Server {
        Server {
            handler: RwLock::new(None),
            queue: Mutex::new(Queue {
                scheduler,
                running: 0,
            }),
            tasks: Mutex::new(JoinSet::new()),
            max_concurrent,
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
                q.scheduler.push(
                    now,
                    key,
                    prio,
                    Job {
                        session: session.clone(),
                        ticket: t,
                    },
                );
            }
            for call in promotes {
                q.scheduler.promote(TicketKey {
                    session: session.key,
                    call,
                });
            }
        }
    }

    /// Starts queued requests while workers are free.
    pub(crate) fn dispatch(shared: &Arc<Shared>) {
        loop {
            let job = {
                let mut q = lock(&shared.server.queue);
                if q.running >= shared.server.max_concurrent {
                    return;
                }
                let now = shared.clock.now_cached();
                let Some(d) = q.scheduler.pop(now) else {
                    return;
                };
                q.running += 1;
                let turn = d.item.session.start_order.issue();
                (d.item, turn)
            };
            let handler = shared.server.handler();
            let sh = shared.clone();
            let mut tasks = lock(&shared.server.tasks);
            // Reap what finished, so the set stays the size of the work.
            while tasks.try_join_next().is_some() {}
            tasks.spawn(run(sh, job.0, job.1, handler));
        }
    }

    /// A session ended: its waiting requests are dropped (never run; the
    /// caller learns the session ended on its side).
    pub(crate) fn remove_session(&self, key: u64) -> usize {
        lock(&self.queue).scheduler.remove_session(key).len()
    }

    /// Requests waiting and running.
    pub(crate) fn load(&self) -> (usize, usize) {
        let q = lock(&self.queue);
        (q.scheduler.len(), q.running)
    }

    /// Stops every running handler (shutdown).
    pub(crate) fn abort_all(&self) {
        lock(&self.tasks).abort_all();
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
    lock(&shared.server.queue).running -= 1;
    Server::dispatch(&shared);
}
