//! Identifiers used across the core.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

id_type!(
    /// A node of the cluster (one process). Chosen by configuration, not by the core.
    NodeId(u64)
);
id_type!(
    /// The cluster all endpoints of a deployment share; a handshake with another
    /// cluster's node is refused.
    ClusterId(u64)
);
id_type!(
    /// The incarnation of a node's process. A restarted process (or one that fenced
    /// itself) comes back with a larger epoch, which ends every session with the
    /// old incarnation. Zero is not a valid epoch.
    Epoch(u64)
);
id_type!(
    /// A transport connection handed to the core by the shell (or by a helper's
    /// demultiplexer). Unique within one endpoint; never reused while the core
    /// still knows it.
    PathId(u64)
);
id_type!(
    /// An application channel inside a session. One-way messages are
    /// delivered exactly once and in order per channel (and priority);
    /// requests are numbered per channel too. Each channel maps to two
    /// [`StreamId`]s on the wire.
    ChannelId(u16)
);
id_type!(
    /// One session with one incarnation of a peer, local to this endpoint. A new
    /// session with the same peer always gets a larger id.
    SessionId(u64)
);

/// Where a message sits in its session: its stream and sequence number.
/// Sequence numbers start at 0 in every stream of every session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId {
    /// The session the message was sent in.
    pub session: SessionId,
    /// Its stream.
    pub stream: StreamId,
    /// Its number in the stream.
    pub seq: u64,
}

id_type!(
    /// A call made in one session, numbered by the caller from 1. The same id
    /// travels with every re-send of the request, so the server runs it at
    /// most once.
    CallId(u64)
);

/// What a session stream carries, from its [`StreamId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamKind {
    /// Replies to our peer's requests (and repeated answers to duplicates).
    Reply,
    /// Replies to requests that came on the request lane: a re-sent request
    /// is answered here, so the answer does not wait behind a reply stuck on
    /// a stalled path.
    ReplyLane,
    /// High-priority and re-sent requests of every channel.
    RequestLane,
    /// High-priority one-way messages of every channel.
    OnewayHigh,
    /// Normal one-way messages of one channel.
    Oneway(ChannelId),
    /// Normal requests of one channel.
    Request(ChannelId),
}

/// A numbered stream inside a session: the unit of order and of
/// acknowledgement on the wire (the `channel` field of DATA, BATCH and ACK
/// frames).
///
/// The message layer gives each class of message its own streams, so that
/// backpressure on one class never blocks another: a server whose request
/// queue is full stops taking requests (which holds the caller back) while
/// replies, one-way messages and path events keep flowing. Layout: four
/// shared streams, then two per application channel:
///
/// | stream | carries |
/// |---|---|
/// | 0 | replies |
/// | 1 | replies to lane requests |
/// | 2 | request lane (high priority, re-sends) |
/// | 3 | high-priority one-way messages |
/// | 4 + 2c | one-way messages of channel c |
/// | 5 + 2c | requests of channel c |
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u16);

impl StreamId {
    /// Replies.
    pub const REPLY: StreamId = StreamId(0);
    /// Replies to lane requests.
    pub const REPLY_LANE: StreamId = StreamId(1);
    /// High-priority and re-sent requests.
    pub const REQUEST_LANE: StreamId = StreamId(2);
    /// High-priority one-way messages.
    pub const ONEWAY_HIGH: StreamId = StreamId(3);
    /// Streams before the per-channel ones.
    pub const SHARED: u16 = 4;
    /// The most application channels a session can have (so that every
    /// stream id fits in 16 bits).
    pub const MAX_CHANNELS: u32 = (u16::MAX as u32 - Self::SHARED as u32) / 2;

    /// The one-way stream of `channel`, if its id fits.
    pub fn oneway(channel: ChannelId) -> Option<StreamId> {
        Self::per_channel(channel, 0)
    }

    /// The request stream of `channel`, if its id fits.
    pub fn request(channel: ChannelId) -> Option<StreamId> {
        Self::per_channel(channel, 1)
    }

    fn per_channel(channel: ChannelId, odd: u16) -> Option<StreamId> {
        if u32::from(channel.0) >= Self::MAX_CHANNELS {
            return None;
        }
        Some(StreamId(Self::SHARED + 2 * channel.0 + odd))
    }

    /// What the stream carries.
    pub fn kind(self) -> StreamKind {
        match self.0 {
            0 => StreamKind::Reply,
            1 => StreamKind::ReplyLane,
            2 => StreamKind::RequestLane,
            3 => StreamKind::OnewayHigh,
            n => {
                let c = ChannelId((n - Self::SHARED) / 2);
                if (n - Self::SHARED) % 2 == 0 {
                    StreamKind::Oneway(c)
                } else {
                    StreamKind::Request(c)
                }
            }
        }
    }

    /// The application channel of a per-channel stream.
    pub fn channel(self) -> Option<ChannelId> {
        match self.kind() {
            StreamKind::Oneway(c) | StreamKind::Request(c) => Some(c),
            _ => None,
        }
    }

    /// Streams of a session with `channels` application channels.
    pub fn count(channels: u32) -> u32 {
        u32::from(Self::SHARED) + 2 * channels.min(Self::MAX_CHANNELS)
    }

    /// Whether the stream exists in a session with `channels` channels.
    pub fn fits(self, channels: u32) -> bool {
        u32::from(self.0) < Self::count(channels)
    }

    /// Dense index (for per-stream tables).
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            StreamKind::Reply => f.write_str("Stream(reply)"),
            StreamKind::ReplyLane => f.write_str("Stream(reply-lane)"),
            StreamKind::RequestLane => f.write_str("Stream(request-lane)"),
            StreamKind::OnewayHigh => f.write_str("Stream(oneway-high)"),
            StreamKind::Oneway(c) => write!(f, "Stream(oneway {c})"),
            StreamKind::Request(c) => write!(f, "Stream(request {c})"),
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_map_both_ways() {
        for c in [0u16, 1, 7, 255, 32_764] {
            let o = StreamId::oneway(ChannelId(c)).unwrap();
            let r = StreamId::request(ChannelId(c)).unwrap();
            assert_eq!(o.kind(), StreamKind::Oneway(ChannelId(c)));
            assert_eq!(r.kind(), StreamKind::Request(ChannelId(c)));
            assert_eq!(o.channel(), Some(ChannelId(c)));
            assert!(o.fits(u32::from(c) + 1) && !o.fits(u32::from(c)));
        }
        assert!(StreamId::oneway(ChannelId(32_765)).is_none());
        assert_eq!(StreamId::REPLY.kind(), StreamKind::Reply);
        assert_eq!(StreamId::ONEWAY_HIGH.channel(), None);
        assert_eq!(StreamId::count(256), 516);
        assert!(StreamId(u16::MAX - 2).fits(StreamId::MAX_CHANNELS));
        assert!(!StreamId(u16::MAX - 1).fits(StreamId::MAX_CHANNELS));
    }
}
