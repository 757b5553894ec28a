//! Errors of the public API, one enum per operation.
//!
//! Every enum is `#[non_exhaustive]`: a later version may add a way to fail
//! without a breaking release, so match with a catch-all arm.

use std::net::SocketAddr;

use bytes::Bytes;
use surelink_proto::rpc::RemoteError;
use surelink_proto::{Epoch, NodeId, SessionEndReason};

use crate::config::ConfigError;

/// Why [`Endpoint::bind`](crate::Endpoint::bind) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The configuration does not validate.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// A listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The failure detector's heartbeat sockets or threads could not start
    /// (a heartbeat socket binds the listener's address and port over UDP).
    #[error("cannot start the failure detector on {addrs:?}: {source}")]
    Detector {
        /// The heartbeat addresses.
        addrs: Vec<SocketAddr>,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why a message could not be queued.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// Refused by the protocol core (too large, bad channel, ...).
    #[error(transparent)]
    Core(surelink_proto::SendError),
    /// The session ended while the message was being queued (the peer
    /// restarted, or it was closed); sending again opens a new session.
    #[error("the session with node {peer} ended")]
    SessionEnded {
        /// The peer.
        peer: NodeId,
    },
    /// The endpoint is shut down.
    #[error("endpoint closed")]
    Closed,
}

/// Why [`Endpoint::try_send`](crate::Endpoint::try_send) did not queue a message.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrySendError {
    /// The session's send buffer is full; the message is handed back.
    #[error("send buffer full; message handed back")]
    Full(Bytes),
    /// Any other refusal.
    #[error(transparent)]
    Send(#[from] SendError),
}

/// Why a [`call`](crate::Endpoint::call) did not return a reply.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// No reply within the deadline. The request may or may not have run.
    #[error("no reply within the deadline")]
    Timeout,
    /// The server answered with an error: the handler's own
    /// ([`RemoteError::App`]), or that it panicked, had no handler, found
    /// the request expired, or is shutting down.
    #[error("the server answered with an error: {0}")]
    Remote(RemoteError),
    /// The peer's process restarted while the call was outstanding. The
    /// request is not replayed into the new process; it may have run in
    /// the old one.
    #[error("peer {peer} restarted (epoch {old} -> {new:?}); the call was not replayed")]
    PeerRestarted {
        /// The peer.
        peer: NodeId,
        /// The incarnation the call went to.
        old: Epoch,
        /// The new incarnation, when known.
        new: Option<Epoch>,
    },
    /// The session ended for another reason (no path for the linger time,
    /// closed by either side).
    #[error("session with {peer} ended: {reason:?}")]
    SessionEnded {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: SessionEndReason,
    },
    /// This process missed a heartbeat deadline and fenced itself (SafeTimer)
    /// while the call was outstanding; the session ended and the process
    /// continues as a new incarnation. The request may have run.
    #[error("this process was fenced (epoch {epoch} ended): the call was abandoned")]
    Fenced {
        /// The incarnation that was fenced.
        epoch: Epoch,
    },
    /// The request could not be queued.
    #[error(transparent)]
    Send(#[from] SendError),
}

impl CallError {
    pub(crate) fn from_end(peer: NodeId, reason: &SessionEndReason) -> CallError {
        match reason {
            SessionEndReason::PeerRestarted { old, new } => CallError::PeerRestarted {
                peer,
                old: *old,
                new: *new,
            },
            other => CallError::SessionEnded {
                peer,
                reason: other.clone(),
            },
        }
    }
}
