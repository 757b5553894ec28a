//! The sans-IO core of surelink.
//!
//! This crate turns any number of unreliable transports ("paths") between
//! two processes into one session that loses nothing, doubles nothing and
//! keeps order per channel, as long as some path works again within the
//! session's linger time. It holds the whole protocol as a deterministic
//! state machine:
//!
//! - [`wire`]: the versioned frame format, zero-copy decoding with bounds.
//! - [`Endpoint`]: every session of one process. Sessions number messages
//!   per channel, keep them in a retransmit cache until the peer's
//!   application has them (SQR), spread them over the least-loaded working
//!   path (hr-net), re-send a failed path's in-flight messages on the others
//!   before anything new, and resume a reconnected path by exchanging receive
//!   state (PostMan's resume handshake). A restarted peer (new epoch) ends the
//!   session and every outstanding message is reported abandoned, never
//!   replayed into the new process.
//!
//! What it does **not** do: read a clock, touch a socket, spawn a task, or
//! decide when a path is dead beyond its own retransmission timeout (the
//! shell reports transport failures; the failure detector comes later).
//!
//! # Calling convention
//!
//! Inputs take an explicit `now` ([`Time`]): [`Endpoint::add_path`],
//! [`Endpoint::handle_input`], [`Endpoint::handle_path_down`],
//! [`Endpoint::handle_timeout`], [`Endpoint::send`]. Outputs are polled:
//! [`Endpoint::poll_transmit`] (bytes for one path), [`Endpoint::poll_timeout`]
//! (when to call `handle_timeout`), [`Endpoint::poll_event`]. After any input,
//! drain `poll_transmit` and `poll_event`, then re-arm the timer.
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use surelink_proto::*;
//!
//! let cfg = EndpointConfig::default();
//! let id = |n| LocalIdentity { cluster: ClusterId(1), node: NodeId(n), epoch: Epoch(1) };
//! let mut a = Endpoint::new(cfg.clone(), id(1)).unwrap();
//! let mut b = Endpoint::new(cfg, id(2)).unwrap();
//! let now = Time::ZERO;
//! // One transport between them: a dials (knows whom), b accepts.
//! a.add_path(now, PathId(1), Some(NodeId(2))).unwrap();
//! b.add_path(now, PathId(1), None).unwrap();
//! a.send(now, NodeId(2), ChannelId(0), Bytes::from_static(b"hello")).unwrap();
//! // Shuttle bytes until both sides are quiet (a real shell writes them
//! // to sockets instead).
//! fn shuttle(from: &mut Endpoint, to: &mut Endpoint, got: &mut Vec<Bytes>) {
//!     let mut buf = BytesMut::new();
//!     while let Some(path) = from.poll_transmit(Time::ZERO, &mut buf, 64 * 1024) {
//!         to.handle_input(Time::ZERO, path, &mut buf).unwrap();
//!     }
//!     while let Some(ev) = to.poll_event() {
//!         if let Event::Message { payload, .. } = ev { got.push(payload) }
//!     }
//! }
//! let mut got = Vec::new();
//! for _ in 0..4 {
//!     shuttle(&mut a, &mut b, &mut got);
//!     shuttle(&mut b, &mut a, &mut Vec::new());
//! }
//! assert_eq!(got, vec![Bytes::from_static(b"hello")]);
//! ```

mod config;
pub mod detector;
mod endpoint;
mod error;
mod event;
mod handshake;
mod ids;
mod router;
pub mod rpc;
mod session;
mod time;
pub mod wire;

pub use config::{ConfigError, EndpointConfig, MESSAGE_OVERHEAD};
pub use endpoint::Endpoint;
pub use error::{AddPathError, HandshakeError, PathError, ProtocolViolation, SendError};
pub use event::{Abandoned, Event, PathCloseReason, RejectReason, SessionEndReason};
pub use ids::{
    CallId, ChannelId, ClusterId, Epoch, MessageId, NodeId, PathId, SessionId, StreamId,
    StreamKind,
};
pub use router::{HelloRoute, OpenError, Router};
pub use session::{
    CompleteError, Input, LocalIdentity, Message, PathSnapshot, PathStats, Session, SessionStats,
};
pub use time::Time;
