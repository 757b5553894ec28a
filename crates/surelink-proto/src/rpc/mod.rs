//! Request/response scheduling (hr-net's message priority scheduling) and
//! at-most-once execution, without IO.
//!
//! - [`Call`]: the client message state machine (INIT → SELECT → SEND →
//!   DONE, RESEND on receive error, send error or timeout) with hr-net's
//!   priority adjustments; typed states make illegal transitions fail to
//!   compile.
//! - [`DispatchQueue`]: the three queues — priority queue (promotion moves
//!   to the head), FIFO queue with an aging bound (no starvation), deadline
//!   detection.
//! - [`Dispatcher`]: the server side — requests classified SEND / RESEND /
//!   FORWARD, queued by priority, executed at most once per (caller
//!   incarnation, call id), duplicates answered from a bounded reply cache.
//!
//! What it does not do: run handlers, keep time, or send anything; the
//! shell (and the simulator) drive it.

mod call;
mod queue;
mod server;

pub use call::{
    AnyCall, Call, CallInput, Done, IllegalTransition, Init, Resend, ResendReason, Selected, Sent,
};
pub use queue::DispatchQueue;
pub use server::{Caller, Dispatched, Dispatcher, DispatcherConfig, Duplicate, RequestClass};

/// How urgent a message is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Served in arrival order.
    #[default]
    Normal,
    /// Served before normal messages (up to the aging bound).
    High,
}
