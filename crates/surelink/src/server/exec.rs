//! The executor: the scheduler and its worker pools (see the module docs
//! of `server`).

use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Poll, Waker};

use futures_util::future::{AbortHandle, AbortRegistration, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

use surelink_proto::rpc::recovery::{
    GroupEvent, GroupId, Mapping, PoolId, RecoveryConfig, RecoveryScheduler, TaskOutcome,
};
use surelink_proto::rpc::{RemoteError, Ticket, TicketKey};
use surelink_proto::{CallId, ChannelId};

use super::groups::{Handlers, RecoveryEvent, RouteInfo, Routing};
use super::{Cleanup, Handler, Request};
use crate::clock::Clock;
use crate::config::{ExecutorConfig, SchedulerConfig};
use crate::session::SessionHandle;
use crate::shared::Shared;
use crate::sync::{lock, read, write};

/// How long after the endpoint starts a request that finds no handler
/// waits for one (to its deadline at most) rather than being answered
/// `NoHandler`. A service binds its endpoint and then calls `serve`;
/// callers that were waiting for it to come back reach it between the
/// two, and their first calls must not fail for that.
pub(crate) const HANDLER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A ticket on its way to a worker, with the session to answer through.
pub(crate) struct Job {
    pub(crate) session: Arc<SessionHandle>,
    pub(crate) ticket: Ticket,
    mark: SpanMark,
}

/// One session's requests that span groups, kept in place (see
/// [`Routing::spans_groups`]): such a request reaches the scheduler only
/// once every earlier request of its session has been handed to a pool
/// (pools then start them in that order: [`StartOrder`]), and the
/// session's later requests wait here until it has been. What waits here
/// takes no worker slot, so no pool can be filled with requests waiting
/// for ones it cannot take. Bounded by the session's admitted requests.
#[derive(Default)]
pub(crate) struct Spans {
    /// The session's requests in the scheduler, not yet handed to a pool.
    queued: AtomicUsize,
    /// A spanning request is among them.
    spanning: AtomicBool,
    /// Requests held back, in arrival order, with their routing.
    held: Mutex<VecDeque<(Ticket, Routing)>>,
}

/// A job's place in its session's [`Spans`] count until a pool takes it
/// (or it is dropped unrun: its session ended).
struct SpanMark {
    spans: bool,
    session: Option<Arc<SessionHandle>>,
}

impl SpanMark {
    fn leave(&mut self) -> Option<Arc<SessionHandle>> {
        let session = self.session.take()?;
        let s = &session.spans;
        if self.spans {
            s.spanning.store(false, Ordering::SeqCst);
        }
        s.queued.fetch_sub(1, Ordering::SeqCst);
        Some(session)
    }

    /// A pool took its job (or it was answered unrun): its session's
    /// requests held behind it may go.
    fn taken(mut self, shared: &Arc<Shared>) {
        if let Some(session) = self.leave() {
            Server::release(shared, &session);
        }
    }
}

impl Drop for SpanMark {
    fn drop(&mut self) {
        // Dropped unrun (its session ended): only the count is kept true.
        self.leave();
    }
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

/// Where a request goes when nothing routes it.
pub(super) const DEFAULT_GROUP: GroupId = GroupId(0);

/// What a group's recovery needs of the executor (per group).
#[derive(Default)]
pub(super) struct GroupRuntime {
    /// Cancel running tasks when it enters recovery.
    pub(super) cancel_running: bool,
    /// Its name, for events and errors.
    pub(super) name: String,
    /// Its running tasks that can be cancelled, by task number.
    pub(super) running: BTreeMap<u64, AbortHandle>,
    /// Clean-up stacks of its failed and cancelled tasks, oldest first.
    pub(super) pending: Vec<Cleanup>,
}

/// The executor: the scheduler, its pools' tasks, and the groups.
pub(crate) struct Server {
    pub(super) handlers: RwLock<Handlers>,
    pub(super) queue: Mutex<RecoveryScheduler<Job>>,
    /// Per group (indexed by id).
    pub(super) groups: Vec<Mutex<GroupRuntime>>,
    /// Requests on these channels go to these groups.
    channels: BTreeMap<ChannelId, GroupId>,
    /// Per pool: wakes its task (a ticket queued for it).
    wake: Vec<Notify>,
    pools: Mutex<Vec<JoinHandle<()>>>,
    started: AtomicBool,
    running: AtomicUsize,
    next_task: AtomicU64,
    /// Clean-up blocks that panicked.
    pub(super) cleanup_panics: AtomicU64,
    pub(super) events: broadcast::Sender<RecoveryEvent>,
    /// A handler was given (`serve`, `serve_group`): requests waiting for
    /// one look again.
    pub(super) handler_given: Notify,
}

/// A task's end, as its pool reports it to the scheduler.
struct Done {
    group: GroupId,
    task: u64,
    outcome: TaskOutcome,
    cleanup: Option<Cleanup>,
}

impl Server {
    /// Pools: one per worker thread of the runtime it is made on (one
    /// outside a runtime), `max_concurrent` slots split over them; the
    /// groups of `exec` (validated with the configuration).
    pub(crate) fn new(
        sched: &SchedulerConfig,
        exec: &ExecutorConfig,
        max_concurrent: usize,
    ) -> Server {
        let pools = tokio::runtime::Handle::try_current()
            .map_or(1, |h| h.metrics().num_workers())
            .max(1);
        let slots = max_concurrent.div_ceil(pools).max(1);
        let cfg = exec.recovery_config(pools, slots, max_concurrent);
        let kind = sched.clone();
        let fallback = || {
            let mut c = RecoveryConfig::new(pools, slots, &["default"]);
            c.mapping = Mapping::Dynamic;
            c
        };
        let (cfg, scheduler) = match RecoveryScheduler::with_queues(&cfg, || kind.build()) {
            Ok(s) => (cfg, s),
            // `Endpoint::bind` checked it for this runtime: only an
            // executor built elsewhere gets here, and keeps one group.
            Err(e) => {
                tracing::error!(error = %e, "recovery groups refused; one group serves all");
                let c = fallback();
                let s = RecoveryScheduler::with_queues(&c, || kind.build())
                    .expect("one group and pools of at least one slot are valid");
                (c, s)
            }
        };
        let groups = cfg
            .groups
            .iter()
            .map(|g| {
                Mutex::new(GroupRuntime {
                    cancel_running: g.cancel_running,
                    name: g.name.clone(),
                    ..GroupRuntime::default()
                })
            })
            .collect::<Vec<_>>();
        let channels = exec
            .channels
            .iter()
            .filter(|(_, g)| usize::from(g.0) < groups.len())
            .copied()
            .collect();
        Server {
            handlers: RwLock::new(Handlers::new(groups.len())),
            queue: Mutex::new(scheduler),
            groups,
            channels,
            wake: (0..pools).map(|_| Notify::new()).collect(),
            pools: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            next_task: AtomicU64::new(0),
            cleanup_panics: AtomicU64::new(0),
            events: broadcast::channel(256).0,
            handler_given: Notify::new(),
        }
    }

    pub(crate) fn set_handler(&self, h: Arc<dyn Handler>) {
        write(&self.handlers).default = Some(h);
        self.handler_given.notify_waiters();
    }

    /// `group`'s handler; if there is none yet and the endpoint started
    /// less than [`HANDLER_GRACE`] ago, waits for one until then or until
    /// `deadline`, whichever is first.
    async fn await_handler(
        &self,
        clock: &Clock,
        group: GroupId,
        deadline: Option<surelink_proto::Time>,
    ) -> Option<Arc<dyn Handler>> {
        let grace = surelink_proto::Time::ZERO + HANDLER_GRACE;
        let until = deadline.map_or(grace, |d| d.min(grace));
        loop {
            let notified = self.handler_given.notified();
            tokio::pin!(notified);
            // Registered before the look: a handler given in between wakes it.
            notified.as_mut().enable();
            if let Some(h) = read(&self.handlers).for_group(group) {
                return Some(h);
            }
            if clock.now() >= until {
                return None;
            }
            let _ = tokio::time::timeout_at(clock.instant(until), notified).await;
        }
    }

    /// The group a ticket runs in: the service's routing, else its
    /// channel's group, else the default.
    fn group_of(&self, route: Option<&super::groups::Route>, t: &Ticket) -> Routing {
        let by_channel = self
            .channels
            .get(&t.channel)
            .copied()
            .unwrap_or(DEFAULT_GROUP);
        match route {
            Some(r) => {
                let g = r(&RouteInfo {
                    peer: t.peer,
                    channel: t.channel,
                    priority: t.priority,
                    body: &t.body,
                });
                if usize::from(g.group.0) < self.groups.len() {
                    g
                } else {
                    // By channel, but still in its place if it spans.
                    Routing {
                        group: by_channel,
                        ..g
                    }
                }
            }
            None => by_channel.into(),
        }
    }

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
        let server = &shared.server;
        let now = shared.clock.now_cached();
        let route = read(&server.handlers).route.clone();
        let spans = &session.spans;
        let mut held = lock(&spans.held);
        let mut q = lock(&server.queue);
        for t in tickets {
            let routing = server.group_of(route.as_deref(), &t);
            let wait = !held.is_empty()
                || spans.spanning.load(Ordering::SeqCst)
                || (routing.spans_groups && spans.queued.load(Ordering::SeqCst) > 0);
            if wait {
                held.push_back((t, routing));
            } else {
                Server::queue_job(&mut q, now, session, t, routing);
            }
        }
        for call in promotes {
            q.promote(TicketKey {
                session: session.key,
                call,
            });
        }
    }

    /// Queues one admitted request (its session's [`Spans`] allow it).
    fn queue_job(
        q: &mut RecoveryScheduler<Job>,
        now: surelink_proto::Time,
        session: &Arc<SessionHandle>,
        ticket: Ticket,
        routing: Routing,
    ) {
        let key = TicketKey {
            session: session.key,
            call: ticket.call,
        };
        let prio = ticket.priority;
        let spans = &session.spans;
        spans.queued.fetch_add(1, Ordering::SeqCst);
        if routing.spans_groups {
            spans.spanning.store(true, Ordering::SeqCst);
        }
        let job = Job {
            session: session.clone(),
            ticket,
            mark: SpanMark {
                spans: routing.spans_groups,
                session: Some(session.clone()),
            },
        };
        // `group_of` names an existing group: nothing is handed back.
        let _ = q.push(now, routing.group, key, prio, job);
    }

    /// Queues what `session` held back that may go now (a job of it was
    /// taken). Not under the queue lock.
    fn release(shared: &Arc<Shared>, session: &Arc<SessionHandle>) {
        let spans = &session.spans;
        let mut held = lock(&spans.held);
        if held.is_empty() {
            return;
        }
        let server = &shared.server;
        let now = shared.clock.now_cached();
        let mut q = lock(&server.queue);
        let mut queued = false;
        while let Some((_, r)) = held.front() {
            if spans.spanning.load(Ordering::SeqCst)
                || (r.spans_groups && spans.queued.load(Ordering::SeqCst) > 0)
            {
                break;
            }
            let Some((t, r)) = held.pop_front() else {
                break;
            };
            Server::queue_job(&mut q, now, session, t, r);
            queued = true;
        }
        if queued {
            server.wake_one_with_room(&q);
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

    /// Wakes the least busy pool that the scheduler would give a task
    /// now, if any (when none may take one, the first handler to end, or
    /// a group's return from recovery, wakes them).
    fn wake_one_with_room(&self, q: &RecoveryScheduler<Job>) {
        if q.is_empty() {
            return;
        }
        let least = (0..self.wake.len())
            .map(|p| PoolId(u16::try_from(p).unwrap_or(u16::MAX)))
            .filter(|&p| q.has_ready(p))
            .map(|p| (q.busy(p), usize::from(p.0)))
            .min();
        if let Some((_, p)) = least {
            self.wake[p].notify_one();
        }
    }

    /// Wakes every pool (a group came back: any of them may take its work).
    pub(super) fn wake_all(&self) {
        for w in &self.wake {
            w.notify_one();
        }
    }

    /// A session ended: its waiting requests are dropped (never run; the
    /// caller learns the session ended on its side).
    pub(crate) fn remove_session(&self, session: &SessionHandle) -> usize {
        // What it held back goes first (so no job of it taken later can
        // release any), then what it queued; both dropped unrun.
        let held = std::mem::take(&mut *lock(&session.spans.held));
        let queued = lock(&self.queue).remove_session(session.key);
        held.len() + queued.len()
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

    /// The scheduler's events since the last call (taken under its lock,
    /// acted on outside it).
    pub(super) fn take_events(q: &mut RecoveryScheduler<Job>) -> Vec<GroupEvent> {
        std::iter::from_fn(|| q.poll_event()).collect()
    }

    /// A task ended: its clean-up stack kept if it failed or was cancelled,
    /// the scheduler told, and what that starts acted on.
    fn finish(shared: &Arc<Shared>, pool: PoolId, done: Done) {
        let server = &shared.server;
        server.running.fetch_sub(1, Ordering::Relaxed);
        if let Some(g) = server.groups.get(usize::from(done.group.0)) {
            let mut g = lock(g);
            g.running.remove(&done.task);
            if let Some(c) = done.cleanup.filter(|c| !c.is_empty()) {
                g.pending.push(c);
            }
        }
        let events = {
            let mut q = lock(&server.queue);
            // A failure starts a recovery, which is timed: a fresh clock.
            let now = if done.outcome == TaskOutcome::Completed {
                shared.clock.now_cached()
            } else {
                shared.clock.now()
            };
            q.handle_done(now, pool, done.group, done.outcome);
            Server::take_events(&mut q)
        };
        Server::on_events(shared, events);
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
                    let task = server.next_task.fetch_add(1, Ordering::Relaxed);
                    // Registered before the queue lock goes: a recovery
                    // that starts next finds it.
                    let abort = server.groups.get(usize::from(t.group.0)).and_then(|g| {
                        let mut g = lock(g);
                        g.cancel_running.then(|| {
                            let (h, reg) = AbortHandle::new_pair();
                            g.running.insert(task, h);
                            reg
                        })
                    });
                    (t, turn, task, abort)
                })
            };
            let Some((t, turn, task, abort)) = next else {
                break;
            };
            server.running.fetch_add(1, Ordering::Relaxed);
            let group = t.group;
            let handler = read(&server.handlers).for_group(group);
            // Whatever panics in it ends that request only, not the pool
            // (the handler's own panics are answered inside `run`).
            let fut = run(shared.clone(), t.dispatch.item, turn, handler, group, abort);
            running.push(AssertUnwindSafe(fut).catch_unwind().map(move |r| {
                let (outcome, cleanup) = r.unwrap_or((TaskOutcome::Completed, None));
                Done {
                    group,
                    task,
                    outcome,
                    cleanup,
                }
            }));
        }
        // More waits than this pool takes now: a pool with room takes it.
        server.wake_one_with_room(&lock(&server.queue));
        tokio::select! {
            Some(done) = running.next(), if !running.is_empty() => {
                Server::finish(&shared, pool, done);
            }
            () = server.wake[p].notified() => {}
        }
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
    }
}

/// Runs one request and answers it through its session. Returns how it
/// ended for its group, with its clean-up stack if that must run.
async fn run(
    shared: Arc<Shared>,
    job: Job,
    turn: u64,
    handler: Option<Arc<dyn Handler>>,
    group: GroupId,
    abort: Option<AbortRegistration>,
) -> (TaskOutcome, Option<Cleanup>) {
    let Job {
        session,
        ticket,
        mark,
    } = job;
    mark.taken(&shared);
    session.start_order.wait(turn).await;
    let turn = Turn(&session.start_order, turn);
    let cleanup = Cleanup::default();
    let (handler, now) = match handler {
        Some(h) => (Some(h), shared.clock.now_cached()),
        None => {
            let h = shared
                .server
                .await_handler(&shared.clock, group, ticket.deadline)
                .await;
            (h, shared.clock.now())
        }
    };
    let (result, outcome) = match handler {
        None => (Err(RemoteError::NoHandler), TaskOutcome::Completed),
        Some(_) if ticket.deadline.is_some_and(|d| d <= now) => {
            (Err(RemoteError::Expired), TaskOutcome::Completed)
        }
        Some(h) => {
            let req = Request {
                peer: ticket.peer,
                channel: ticket.channel,
                priority: ticket.priority,
                deadline: ticket.deadline.map(|d| shared.clock.instant(d).into_std()),
                call: ticket.call,
                group,
                body: ticket.body,
                cleanup: cleanup.clone(),
            };
            // Both the call that makes the future and the future itself may
            // panic; either way the caller gets a typed answer.
            let started = std::panic::catch_unwind(AssertUnwindSafe(|| h.handle(req)));
            drop(turn);
            match started {
                Err(_) => (Err(RemoteError::Panicked), TaskOutcome::Failed),
                Ok(fut) => {
                    let fut = AssertUnwindSafe(fut).catch_unwind();
                    let out = match abort {
                        Some(reg) => Abortable::new(fut, reg).await.ok(),
                        None => Some(fut.await),
                    };
                    match out {
                        None => (
                            Err(RemoteError::Recovering {
                                group: shared.server.group_name(group),
                                started: true,
                            }),
                            TaskOutcome::Cancelled,
                        ),
                        Some(Ok(Ok(reply))) => (Ok(reply), TaskOutcome::Completed),
                        Some(Ok(Err(e))) => {
                            let outcome = if e.fatal {
                                TaskOutcome::Failed
                            } else {
                                TaskOutcome::Completed
                            };
                            let err = RemoteError::App {
                                code: e.code,
                                message: e.message,
                            };
                            (Err(err), outcome)
                        }
                        Some(Err(_)) => (Err(RemoteError::Panicked), TaskOutcome::Failed),
                    }
                }
            }
        }
    };
    match &result {
        Err(RemoteError::Panicked) => shared.stats.handler_panicked(),
        Err(_) => shared.stats.handler_failed(),
        Ok(_) => {}
    }
    session.complete(&shared, ticket.call, result);
    let keep = (outcome != TaskOutcome::Completed).then_some(cleanup);
    (outcome, keep)
}

/// Answers a request its group's recovery failed (it never ran).
pub(super) fn fail_unrun(shared: &Arc<Shared>, job: Job, group: String) {
    let Job {
        session,
        ticket,
        mark,
    } = job;
    mark.taken(shared);
    shared.stats.handler_failed();
    session.complete(
        shared,
        ticket.call,
        Err(RemoteError::Recovering {
            group,
            started: false,
        }),
    );
}
