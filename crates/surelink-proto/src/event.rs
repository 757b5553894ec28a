//! What the core reports to the shell and the application.

use bytes::Bytes;

use crate::error::PathError;
use crate::ids::{ChannelId, Epoch, NodeId, PathId, SessionId};
use crate::wire::CloseCode;

/// An output of [`Endpoint::poll_event`](crate::Endpoint::poll_event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message, delivered exactly once and in order within its channel.
    Message {
        /// The sender.
        peer: NodeId,
        /// The session it arrived in.
        session: SessionId,
        /// Its channel.
        channel: ChannelId,
        /// Its number in the channel (0, 1, 2, ... per session).
        seq: u64,
        /// The message.
        payload: Bytes,
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
        /// Messages that were in flight on it and are re-sent elsewhere.
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
        /// Its channel.
        channel: ChannelId,
        /// Its sequence number.
        seq: u64,
        /// Which limit.
        reason: RejectReason,
    },
}

/// Which peer limit a queued message broke.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// A run of messages `[start, end)` of one channel whose delivery is not
/// confirmed when their session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Abandoned {
    /// The channel.
    pub channel: ChannelId,
    /// First sequence number.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

/// Why a session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}
