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
    /// An ordered stream of messages inside a session. Order and exactly-once
    /// hold per channel.
    ChannelId(u16)
);
id_type!(
    /// One session with one incarnation of a peer, local to this endpoint. A new
    /// session with the same peer always gets a larger id.
    SessionId(u64)
);

/// Where a message sits in its session: its channel and sequence number.
/// Sequence numbers start at 0 in every channel of every session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId {
    /// The session the message was sent in.
    pub session: SessionId,
    /// Its channel.
    pub channel: ChannelId,
    /// Its number in the channel.
    pub seq: u64,
}
