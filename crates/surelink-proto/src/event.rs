//! What the core reports to the shell and the application.

use bytes::Bytes;

use crate::error::PathError;
use crate::ids::{CallId, Epoch, NodeId, PathId, SessionId, StreamId};
use crate::rpc::{CallFailure, Ticket};
use crate::session::Message;
use crate::wire::CloseCode;

/// An output of [`Session::poll_event`](crate::Session::poll_event) (path,
/// peer and call events) or of the single-threaded
/// [`Endpoint::poll_event`](crate::Endpoint::poll_event), which also hands
/// out one-way messages and admitted requests.
///
/// Non-exhaustive: later versions add events; a driver ignores the ones it
/// does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A one-way message, delivered exactly once and in order within its
    /// channel and priority ([`Endpoint`](crate::Endpoint) only; a
    /// session hands them out with `poll_message`).
    Message(Message),
    /// An admitted request to run ([`Endpoint`](crate::Endpoint) only; a
    /// session hands them out with `poll_request`).
    Request(Ticket),
    /// A call ended: its reply, or why there is none.
    CallDone {
        /// The peer called.
        peer: NodeId,
        /// The session it was made in.
        session: SessionId,
        /// The call.
        call: CallId,
        /// Times the request was sent (1 + re-sends).
        sends: u32,
        /// The reply, or the failure.
        result: Result<Bytes, CallFailure>,
    },
    /// A request handed out earlier was asked for again (its caller re-sent
    /// it): if it still waits for a worker, it should go first.
    Promote {
        /// The caller.
        peer: NodeId,
        /// The session.
        session: SessionId,
        /// The call.
        call: CallId,
    },
    /// A path finished its handshake and carries traffic.
    PathUp {
        /// The peer.
        peer: NodeId,
        /// The path.
        path: PathId,
    },
    /// A path is gone. Its unacknowledged messages were moved to the other
    /// paths (or wait for the next one). The shell closes the transport once it
    /// has written whatever `poll_transmit` still returns for this path.
    PathClosed {
        /// The peer, if the handshake had named one.
        peer: Option<NodeId>,
        /// The path.
        path: PathId,
        /// Why.
        reason: PathCloseReason,
        /// Frames (single messages or batches) that were in flight on it
        /// and are re-sent elsewhere.
        resent: usize,
    },
    /// A session has its first working path (or one again after losing all).
    PeerUp {
        /// The peer.
        peer: NodeId,
        /// Our session with it.
        session: SessionId,
        /// The peer's incarnation.
        epoch: Epoch,
    },
    /// A session lost its last working path. Messages keep queueing until a
    /// path returns or `linger` passes.
    PeerUnreachable {
        /// The peer.
        peer: NodeId,
        /// Our session with it.
        session: SessionId,
    },
    /// A session ended. Every message of it that the peer's application had
    /// not yet received is listed in `abandoned`; none of them will be sent
    /// again (in particular, never into a restarted peer).
    SessionEnded {
        /// The peer.
        peer: NodeId,
        /// The session that ended.
        session: SessionId,
        /// Why.
        reason: SessionEndReason,
        /// Messages whose delivery is not confirmed, as sequence ranges.
        abandoned: Vec<Abandoned>,
    },
    /// A queued message broke a limit of the peer learned only after `send`
    /// accepted it (the session had not met the peer yet); it was dropped
    /// without being delivered.
    MessageRejected {
        /// The peer.
        peer: NodeId,
        /// The session.
        session: SessionId,
        /// Its stream.
        stream: StreamId,
        /// Its sequence number.
        seq: u64,
        /// Which limit.
        reason: RejectReason,
    },
}

/// Which peer limit a queued message broke.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// Longer than the peer's maximum message size.
    TooLarge {
        /// Its length.
        len: usize,
        /// The peer's maximum.
        max: u32,
    },
    /// A channel the peer does not accept.
    ChannelOutOfRange {
        /// The peer's channel count.
        max: u32,
    },
}

/// A run of messages `[start, end)` of one stream whose delivery is not
/// confirmed when their session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Abandoned {
    /// The stream.
    pub stream: StreamId,
    /// First sequence number.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

/// Why a session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEndReason {
    /// The peer's process restarted (new epoch). Outstanding messages are
    /// not replayed into the new process.
    PeerRestarted {
        /// The incarnation we talked to.
        old: Epoch,
        /// The new one, when the handshake told us.
        new: Option<Epoch>,
    },
    /// The peer ended its side of the session (its linger expired, or it
    /// dropped the session) while keeping the same process.
    PeerReset,
    /// No path worked for `linger`.
    LingerExpired,
    /// The peer closed the session.
    ClosedByPeer {
        /// Its code.
        code: CloseCode,
        /// Its words.
        reason: String,
    },
    /// This side closed it.
    ClosedLocally,
    /// The peer stopped talking to us (stale handshake).
    Rejected(CloseCode),
}

/// Why a path closed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathCloseReason {
    /// The shell reported the transport failed (or the failure detector
    /// declared the path down).
    TransportFailed,
    /// We refused the peer's input.
    Error(PathError),
    /// The peer sent CLOSE.
    ClosedByPeer {
        /// Its code.
        code: CloseCode,
        /// Its words.
        reason: String,
    },
    /// The session the path belonged to ended.
    SessionEnded,
    /// This side closed it.
    ClosedLocally,
    /// Nothing arrived on it for `path_idle_timeout`, keepalives included.
    Idle,
}
