//! Decoded frames.

use bytes::Bytes;

use super::{AckFrame, BatchFrame};
use crate::ids::{ClusterId, Epoch, NodeId, SessionId, StreamId};

/// The kind byte of a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum FrameKind {
    /// Identity exchange at the start of every path.
    Hello = 0x01,
    /// Receive state exchanged once per path, after HELLO.
    Resume = 0x02,
    /// One application message.
    Data = 0x03,
    /// Cumulative and selective acknowledgements.
    Ack = 0x04,
    /// Closing a path or a whole session, with a reason.
    Close = 0x05,
    /// Liveness/RTT probe on one path.
    Ping = 0x06,
    /// Answer to a PING, on the path it came from.
    Pong = 0x07,
    /// Reserved: failure-detector heartbeat.
    Heartbeat = 0x10,
    /// Reserved: failure-detector barrier.
    Barrier = 0x11,
    /// Consecutive small messages of one stream.
    Batch = 0x20,
    /// A role-service message (status report, routing-table row, ack).
    RouteUpdate = 0x30,
}

impl FrameKind {
    /// The kind for a header byte, if it names one.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0x01 => FrameKind::Hello,
            0x02 => FrameKind::Resume,
            0x03 => FrameKind::Data,
            0x04 => FrameKind::Ack,
            0x05 => FrameKind::Close,
            0x06 => FrameKind::Ping,
            0x07 => FrameKind::Pong,
            0x10 => FrameKind::Heartbeat,
            0x11 => FrameKind::Barrier,
            0x20 => FrameKind::Batch,
            0x30 => FrameKind::RouteUpdate,
            _ => return None,
        })
    }

    /// Whether this version of the protocol decodes the kind (the others are
    /// reserved for later versions).
    pub fn is_implemented(self) -> bool {
        (self as u8) < 0x10 || self == FrameKind::Batch || self == FrameKind::RouteUpdate
    }
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// See [`Hello`].
    Hello(Hello),
    /// The peer's receive state for this session, sent once per path.
    Resume(AckFrame),
    /// One message.
    Data(DataFrame),
    /// Several consecutive messages of one stream.
    Batch(BatchFrame),
    /// Acknowledgements.
    Ack(AckFrame),
    /// See [`Close`].
    Close(Close),
    /// A probe carrying a token to echo.
    Ping(u64),
    /// The echo of a probe's token.
    Pong(u64),
    /// One role-service message, opaque to the session (decoded by
    /// [`role::decode`](crate::role::decode)); unsequenced: the role
    /// protocol re-sends until acknowledged.
    RouteUpdate(Bytes),
}

/// The first frame on every path, from both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Must equal the receiver's cluster id.
    pub cluster: ClusterId,
    /// The sender's node.
    pub node: NodeId,
    /// The sender's process incarnation.
    pub epoch: Epoch,
    /// The sender's local id of the session this path joins.
    pub session: SessionId,
    /// The node the sender means to reach (the one it dialled), or 0 when
    /// answering an accepted connection. A node that is not it refuses the
    /// path before any session logic, so a stale address book cannot end a
    /// healthy session.
    pub your_node: NodeId,
    /// The receiver's incarnation as the sender's session knows it; 0 when
    /// the sender's session has not yet met the receiver. Lets the receiver
    /// notice that the sender still talks to an earlier incarnation.
    pub your_epoch: Epoch,
    /// The receiver's session id as the sender knows it; 0 when the sender's
    /// session has not yet met the receiver's. Lets the receiver notice that
    /// the sender talks about a session it has already ended.
    pub your_session: SessionId,
    /// Bytes of messages the sender is willing to buffer for this session
    /// (reorder buffer plus undelivered messages).
    pub recv_window: u32,
    /// The largest message payload the sender accepts.
    pub max_message: u32,
    /// Application channels the sender accepts (ids below this).
    pub max_channels: u32,
}

/// One message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFrame {
    /// The stream it belongs to.
    pub stream: StreamId,
    /// Its number in the stream.
    pub seq: u64,
    /// Header flags (see `DATA_FLAG_*`).
    pub flags: u16,
    /// The message, a slice of the received buffer.
    pub payload: Bytes,
}

/// What a CLOSE frame closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseScope {
    /// Only the path it arrives on.
    Path = 0,
    /// The whole session: every path, every outstanding message.
    Session = 1,
}

/// Why something was closed. Unknown codes are kept as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// Orderly shutdown.
    pub const NORMAL: CloseCode = CloseCode(0);
    /// The peer sent bytes that do not decode.
    pub const MALFORMED: CloseCode = CloseCode(1);
    /// The peer broke the protocol (e.g. data before HELLO).
    pub const PROTOCOL: CloseCode = CloseCode(2);
    /// The handshake named another cluster.
    pub const WRONG_CLUSTER: CloseCode = CloseCode(3);
    /// The handshake came from an older incarnation or session than the one we know.
    pub const STALE: CloseCode = CloseCode(4);
    /// The handshake referred to a session this side no longer has; the peer
    /// must end its side of that session and start a new one.
    pub const SESSION_UNKNOWN: CloseCode = CloseCode(5);
    /// The path was dialled to one node but another answered.
    pub const UNEXPECTED_PEER: CloseCode = CloseCode(6);
    /// The session was replaced by a newer one with the same peer.
    pub const SUPERSEDED: CloseCode = CloseCode(7);
    /// The handshake referred to an earlier incarnation of this node: the
    /// process restarted since, and the peer's session with it is over.
    pub const RESTARTED: CloseCode = CloseCode(9);
    /// A frame was larger than the receiver accepts.
    pub const TOO_LARGE: CloseCode = CloseCode(8);
    /// The receiver is at a limit for this peer (say, the connections one
    /// member may hold): the path is refused; dial again later, not at once.
    pub const LIMIT: CloseCode = CloseCode(10);
}

/// Closes a path or a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Close {
    /// Path or session.
    pub scope: CloseScope,
    /// Machine-readable reason.
    pub code: CloseCode,
    /// Human-readable reason (at most `MAX_CLOSE_REASON` bytes).
    pub reason: String,
}
