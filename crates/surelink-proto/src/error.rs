//! Errors, one enum per operation.
//!
//! Every public error enum is `#[non_exhaustive]`: a later version may add a
//! variant (a new way to fail) without a breaking release, so match with a
//! catch-all arm. Variants are never removed or changed in meaning within
//! a protocol version.

use bytes::Bytes;

use crate::ids::{ClusterId, Epoch, NodeId, PathId};
use crate::wire::{CloseCode, CloseScope, DecodeError};

/// Why a session did not take a message ([`Session::send`](crate::Session::send),
/// [`Session::call`](crate::Session::call)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The session's send buffer (retransmit cache) is full. The message is
    /// handed back untouched; try again after acknowledgements free space
    /// (the shell waits for that).
    #[error("send buffer full ({buffered} of {limit} bytes in use); message handed back")]
    Full {
        /// The message, returned to the caller.
        message: Bytes,
        /// Bytes currently held.
        buffered: u64,
        /// The configured bound.
        limit: u64,
    },
    /// The message is larger than this endpoint, or the peer, accepts.
    #[error("message of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The smaller of our and the peer's maximum.
        max: u32,
    },
    /// The channel id is not below the configured `max_channels`.
    #[error("channel {channel} is out of range (max_channels = {max})")]
    ChannelOutOfRange {
        /// The channel asked for.
        channel: u16,
        /// The configured number of channels.
        max: u32,
    },
    /// The peer is this endpoint itself.
    #[error("cannot open a session with this endpoint's own node id {0}")]
    SelfSend(NodeId),
    /// A new session would exceed the configured `max_sessions`.
    #[error("too many sessions (max_sessions = {0})")]
    TooManySessions(u32),
    /// The session ended (its peer restarted, or it was closed); a new one
    /// is opened for the next message.
    #[error("the session with node {0} has ended")]
    SessionEnded(NodeId),
}

impl SendError {
    /// The message, if the error handed it back.
    pub fn into_message(self) -> Option<Bytes> {
        match self {
            SendError::Full { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// Why [`Endpoint::add_path`](crate::Endpoint::add_path) refused a path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddPathError {
    /// The path id is already in use by this endpoint.
    #[error("path {0} is already known to this endpoint")]
    Duplicate(PathId),
    /// The path was dialled to this endpoint's own node id.
    #[error("cannot dial this endpoint's own node id {0}")]
    SelfDial(NodeId),
    /// A new session would exceed the configured `max_sessions`.
    #[error("too many sessions (max_sessions = {0})")]
    TooManySessions(u32),
}

/// Why a handshake on a path was refused. The path is closed with a CLOSE
/// frame carrying the matching [`CloseCode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer belongs to another cluster (wrong cluster id or key).
    #[error("peer is in cluster {theirs}, this endpoint in cluster {ours}")]
    WrongCluster {
        /// Ours.
        ours: ClusterId,
        /// Theirs.
        theirs: ClusterId,
    },
    /// The path leads back to this endpoint.
    #[error("path leads back to this node ({0})")]
    SelfConnect(NodeId),
    /// The path was dialled to one node and another answered.
    #[error("dialled node {expected} but node {got} answered")]
    UnexpectedPeer {
        /// The node dialled.
        expected: NodeId,
        /// The node that answered.
        got: NodeId,
    },
    /// The HELLO came from an older incarnation or session of the peer than
    /// the one this endpoint already talks to (a stale connection).
    #[error("stale handshake from node {node}: epoch {epoch}, newer session already known")]
    Stale {
        /// The peer.
        node: NodeId,
        /// The epoch in the stale HELLO.
        epoch: Epoch,
    },
    /// The peer referred to a session of ours that has ended (or to an earlier
    /// incarnation of this process). It must start a new session.
    #[error("peer {0} referred to a session this endpoint no longer has")]
    SessionUnknown(NodeId),
    /// The peer's session was with an earlier incarnation of this process,
    /// which has since restarted; that session is over.
    #[error("peer {node} referred to our earlier incarnation {epoch}")]
    EarlierIncarnation {
        /// The peer.
        node: NodeId,
        /// The epoch it believed we had.
        epoch: Epoch,
    },
    /// The HELLO was meant for another node (the dialler's address book is
    /// out of date). Only this path is refused.
    #[error("peer meant to reach node {intended}, this is node {got}")]
    WrongNode {
        /// The node the dialler meant.
        intended: NodeId,
        /// This node.
        got: NodeId,
    },
    /// The HELLO announced limits nothing can be sent under (zero channels,
    /// zero message size, or a receive window smaller than one message).
    #[error("peer {0} announced unusable limits")]
    BadLimits(NodeId),
    /// The handshake did not complete within `handshake_timeout`.
    #[error("handshake did not complete in time")]
    Timeout,
    /// Too many sessions already.
    #[error("too many sessions (max_sessions = {0})")]
    TooManySessions(u32),
    /// The HELLO named node 0, which is reserved.
    #[error("peer claimed the reserved node id 0")]
    ReservedNode,
}

impl HandshakeError {
    /// The code sent to the peer in the CLOSE frame.
    pub fn close_code(&self) -> CloseCode {
        match self {
            HandshakeError::WrongCluster { .. } => CloseCode::WRONG_CLUSTER,
            HandshakeError::SelfConnect(_) => CloseCode::PROTOCOL,
            HandshakeError::UnexpectedPeer { .. } => CloseCode::UNEXPECTED_PEER,
            HandshakeError::Stale { .. } => CloseCode::STALE,
            HandshakeError::SessionUnknown(_) => CloseCode::SESSION_UNKNOWN,
            HandshakeError::EarlierIncarnation { .. } => CloseCode::RESTARTED,
            HandshakeError::WrongNode { .. } => CloseCode::UNEXPECTED_PEER,
            HandshakeError::BadLimits(_) => CloseCode::PROTOCOL,
            HandshakeError::Timeout => CloseCode::PROTOCOL,
            HandshakeError::TooManySessions(_) => CloseCode::PROTOCOL,
            HandshakeError::ReservedNode => CloseCode::PROTOCOL,
        }
    }
}

/// A protocol rule the peer broke on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// A frame other than HELLO or CLOSE arrived before the peer's HELLO.
    #[error("{0} frame before HELLO")]
    BeforeHello(&'static str),
    /// A second HELLO on a path with a different identity.
    #[error("HELLO changed identity mid-path")]
    HelloChanged,
    /// A DATA, BATCH or ACK named a stream this session does not have
    /// (a channel at or above `max_channels`).
    #[error("stream {0} out of range")]
    StreamOutOfRange(u16),
    /// An ACK acknowledged a message that was never sent.
    #[error("acknowledgement of unsent message (stream {stream}, seq {seq})")]
    AckOfUnsent {
        /// The stream.
        stream: u16,
        /// The first sequence number not yet sent that it covered.
        seq: u64,
    },
    /// An ACK or RESUME named the same stream twice.
    #[error("stream {0} repeated in one acknowledgement")]
    RepeatedAckStream(u16),
    /// A frame's sequence numbers lie beyond anything the sender could
    /// have outstanding within our receive window.
    #[error("sequence number {seq} on stream {stream} is beyond the receive window")]
    SeqBeyondWindow {
        /// The stream.
        stream: u16,
        /// The sequence number.
        seq: u64,
    },
    /// A frame covers part of a frame already held, cut differently (frames
    /// are re-sent whole).
    #[error("frame at sequence number {seq} on stream {stream} overlaps one already held")]
    Overlap {
        /// The stream.
        stream: u16,
        /// Its first sequence number.
        seq: u64,
    },
    /// A message's message-layer header (call id, reply status, ...) does
    /// not decode.
    #[error("malformed message header: {0}")]
    MalformedMessage(&'static str),
    /// A DATA frame carried more than the announced maximum message size.
    #[error("message of {len} bytes exceeds the announced maximum {max}")]
    MessageTooLarge {
        /// Its payload length.
        len: usize,
        /// Our maximum.
        max: u32,
    },
}

/// Why bytes arriving on a path were refused. The path is closed (a CLOSE
/// frame is queued to tell the peer) and the error is also reported in
/// [`Event::PathClosed`](crate::Event::PathClosed); other paths and sessions
/// are not affected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The bytes did not decode.
    #[error("malformed input: {0}")]
    Decode(#[from] DecodeError),
    /// The handshake was refused.
    #[error("handshake refused: {0}")]
    Handshake(#[from] HandshakeError),
    /// A well-formed frame broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(#[from] ProtocolViolation),
    /// The path id is not known to this endpoint (never added, or closed).
    #[error("unknown path {0}")]
    UnknownPath(PathId),
}

impl PathError {
    /// Whether the CLOSE frame closes the peer's whole session (a handshake
    /// that refers to a session or incarnation of ours that is gone) or
    /// only the path.
    pub fn close_scope(&self) -> CloseScope {
        match self {
            PathError::Handshake(
                HandshakeError::SessionUnknown(_)
                | HandshakeError::EarlierIncarnation { .. }
                | HandshakeError::Stale { .. },
            ) => CloseScope::Session,
            _ => CloseScope::Path,
        }
    }

    /// The code sent to the peer in the CLOSE frame.
    pub fn close_code(&self) -> CloseCode {
        match self {
            PathError::Decode(DecodeError::TooLarge { .. }) => CloseCode::TOO_LARGE,
            PathError::Decode(_) => CloseCode::MALFORMED,
            PathError::Handshake(h) => h.close_code(),
            PathError::Protocol(_) | PathError::UnknownPath(_) => CloseCode::PROTOCOL,
        }
    }
}
