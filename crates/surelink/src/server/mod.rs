//! Serving requests: the handler API, recovery groups, and the executor
//! the endpoint owns.
//!
//! Sessions admit requests (at most `max_requests_per_peer` outstanding per
//! peer) and hand them out as tickets; each ticket is sorted into a
//! **recovery group** (by its channel, [`ExecutorConfig::channels`], or by
//! the service's own routing, [`crate::Endpoint::route_requests`]; group 0
//! otherwise) and queued in the core's [`RecoveryScheduler`]: per group
//! hr-net's priority queues with per-session round robin, round robin
//! across groups, each group within its bound σ of workers
//! (Seshadri et al., FAST '08). Handlers run on **worker pools**, one per
//! runtime worker thread, never inside a reader's or a caller's task: a
//! pool is one long-lived task that takes tickets from the scheduler in a
//! loop while it has free slots (`max_concurrent_requests` split over the
//! pools) and polls the handlers it started side by side — a handler that
//! awaits yields to its pool's others, and the pool takes the next ticket
//! as soon as one ends. No task is spawned per request.
//!
//! **Recovery.** A group enters recovery when one of its handlers panics,
//! returns a [fatal](HandlerError::fatal) error, or the service says so
//! ([`crate::Endpoint::enter_recovery`]). Its queued requests (and those
//! of the groups it suspends) stop being dispatched; its running ones end
//! or, with `cancel_running`, are cancelled (their callers get
//! [`RemoteError::Recovering`](crate::RemoteError::Recovering)). When none
//! runs, the [`Cleanup`] blocks of its failed and cancelled requests run
//! (each request's stack newest first), then the group's own recovery
//! ([`crate::Endpoint::on_recovery`]); then its queued requests are
//! re-driven, or failed to their callers, per its [`RecoveryPolicy`].
//! Other groups keep their workers throughout.
//!
//! A handler returns a reply or a typed [`HandlerError`]; one that panics
//! is caught: its caller gets [`RemoteError::Panicked`](crate::RemoteError::Panicked),
//! its slot is freed, and the connection and the other handlers carry on.
//!
//! One peer's requests are *started* (the handler called) in the order the
//! scheduler hands them out — per group and priority, the order they were
//! sent; a re-sent request promoted to the head takes its session's
//! earlier waiting ones with it — even across pools (each start waits for
//! its turn). Once started they run concurrently. Requests of different
//! groups may start in any order, except one the service's routing marks
//! as spanning groups ([`Routing::spans_groups`]: a multi-key read, a
//! flush): it reaches the scheduler only after every earlier request of
//! its session has been handed to a pool, and the later ones wait for it
//! (in a per-session queue that holds no worker slot).

mod exec;
mod groups;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;

use surelink_proto::rpc::Priority;
use surelink_proto::{CallId, ChannelId, NodeId};

pub(crate) use exec::{Job, Server, Spans, StartOrder};
pub use groups::{GroupError, GroupSnapshot, RecoveryEvent, RouteInfo, Routing};
pub use surelink_proto::rpc::recovery::{
    GroupConfig, GroupEvent, GroupId, GroupState, GroupStats, Mapping, RecoveryPolicy,
};

use crate::sync::lock;

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
    /// The recovery group it runs in.
    pub group: GroupId,
    /// The request body.
    pub body: Bytes,
    /// Where the handler registers what must be undone if it fails or is
    /// cancelled (see [`Cleanup`]).
    pub cleanup: Cleanup,
}

/// An application error a handler returns; the caller receives it as
/// [`RemoteError::App`](crate::RemoteError::App) (through
/// [`CallError::Remote`](crate::CallError::Remote)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct HandlerError {
    /// The application's code.
    pub code: u32,
    /// The application's words (at most 4 KiB reach the caller).
    pub message: String,
    /// Whether the handler's recovery group must recover (see
    /// [`HandlerError::fatal`]).
    pub fatal: bool,
}

impl HandlerError {
    /// An error with `code` and `message`: the caller's, not the server's
    /// (the group carries on).
    pub fn new(code: u32, message: impl Into<String>) -> HandlerError {
        HandlerError {
            code,
            message: message.into(),
            fatal: false,
        }
    }

    /// An error after which the handler's recovery group must recover (its
    /// state is suspect: a lost backend, a corrupt shard), as after a
    /// panic. The caller gets it as an application error all the same.
    pub fn fatal(code: u32, message: impl Into<String>) -> HandlerError {
        HandlerError {
            fatal: true,
            ..HandlerError::new(code, message)
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

type Block = Box<dyn FnOnce() + Send>;

/// A request's stack of clean-up blocks: what its handler must undo if it
/// fails (panics, returns a fatal error) or is cancelled by its group's
/// recovery — a lock taken, a half-written entry, a reservation. The
/// blocks run in the group's clean-up, newest first, before the group's
/// own recovery and before any of its queued requests runs again; a
/// handler that ends normally drops its stack unrun. A block that panics
/// is counted and skipped (the others still run).
#[derive(Clone, Default)]
pub struct Cleanup(Arc<Mutex<Vec<Block>>>);

impl Cleanup {
    /// Registers `block` on top of the stack.
    pub fn push(&self, block: impl FnOnce() + Send + 'static) {
        lock(&self.0).push(Box::new(block));
    }

    /// Drops the newest block unrun (what it undoes was released in the
    /// normal way). Returns whether there was one.
    pub fn pop(&self) -> bool {
        lock(&self.0).pop().is_some()
    }

    /// Blocks registered.
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    /// Whether no block is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs every block, newest first; returns how many panicked.
    pub(crate) fn unwind(&self) -> usize {
        let blocks = std::mem::take(&mut *lock(&self.0));
        blocks
            .into_iter()
            .rev()
            .map(|b| std::panic::catch_unwind(std::panic::AssertUnwindSafe(b)))
            .filter(Result::is_err)
            .count()
    }
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cleanup({} blocks)", self.len())
    }
}

/// The same stack (not equal contents: blocks cannot be compared).
impl PartialEq for Cleanup {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cleanup {}
