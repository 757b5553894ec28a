//! The message layer: calls, at-most-once execution and request scheduling
//! (hr-net's message priority scheduling), without IO.
//!
//! A [`Session`](crate::Session) carries three classes of message on
//! separate streams (see [`StreamId`](crate::StreamId)): one-way messages,
//! requests and replies. This module holds the parts of the message layer
//! that are not about streams:
//!
//! - [`Call`]: hr-net's client message state machine (INIT → SELECT → SEND
//!   → DONE, RESEND on receive error, send error or timeout) with its
//!   priority adjustments; typed states make illegal transitions fail to
//!   compile. Each session keeps a table of outstanding calls with their
//!   deadlines and re-send timers ([`CallOptions`]).
//! - The server side of each session: requests classified SEND / RESEND /
//!   FORWARD, admitted at most once per call (a session is one incarnation
//!   of the caller), duplicates answered from a bounded reply cache or with
//!   STILL_RUNNING; admission bounded per peer.
//! - [`Scheduler`]: which admitted request runs next, across sessions
//!   ([`PriorityScheduler`], [`FifoScheduler`]).
//! - [`recovery`]: recovery-conscious scheduling — recovery groups mapped
//!   to worker pools, a bound per group, suspension and clean-up.
//! - [`DispatchQueue`]: the three queues — priority queue (promotion moves
//!   to the head), FIFO queue with an aging bound, deadline detection.
//! - The header codec ([`RequestHeader`], [`RemoteError`]).
//!
//! What it does not do: run handlers, keep time, or send anything; the
//! session and whoever drives it do.

mod call;
pub(crate) mod calls;
pub(crate) mod header;
mod queue;
pub mod recovery;
mod sched;
pub(crate) mod serve;

pub use call::{
    AnyCall, Call, CallInput, Done, IllegalTransition, Init, Resend, ResendReason, Selected, Sent,
};
pub use calls::CallOptions;
pub use header::{HeaderError, RemoteError, RequestHeader, MAX_ERROR_MESSAGE};
pub use queue::DispatchQueue;
pub use sched::{Dispatch, FifoScheduler, PriorityScheduler, Scheduler, TicketKey};

use bytes::Bytes;

use crate::ids::{CallId, ChannelId, NodeId, SessionId};
use crate::time::Time;

/// How urgent a message is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Served in arrival order.
    #[default]
    Normal,
    /// Served before normal messages (up to the aging bound).
    High,
}

/// How a request reached the server (hr-net's server table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestClass {
    /// First transmission.
    Send,
    /// The caller sent it again (timeout or lost reply).
    Resend,
    /// Forwarded by another server.
    Forward,
}

/// A request admitted by a session: run it, then hand the result to
/// [`Session::complete`](crate::Session::complete) with its `call`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ticket {
    /// The caller.
    pub peer: NodeId,
    /// The session it arrived in.
    pub session: SessionId,
    /// The caller's call id.
    pub call: CallId,
    /// The caller's channel.
    pub channel: ChannelId,
    /// Its priority on arrival (re-sent and forwarded requests are high).
    pub priority: Priority,
    /// SEND or RESEND.
    pub class: RequestClass,
    /// When the session handed it out.
    pub arrived: Time,
    /// When the caller gives up, if it said.
    pub deadline: Option<Time>,
    /// The request.
    pub body: Bytes,
}

/// Why a call ended without a reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallFailure {
    /// No reply within the call's timeout. The request may or may not have
    /// run.
    #[error("no reply within the deadline")]
    Timeout,
    /// The server answered with an error.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The session ended (the peer restarted, no path for the linger time,
    /// closed by either side). The request is never replayed into another
    /// session; it may have run.
    #[error("the session ended: {0:?}")]
    SessionEnded(crate::SessionEndReason),
}
