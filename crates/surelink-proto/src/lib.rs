//! The sans-IO core of surelink.
//!
//! This crate turns any number of unreliable transports ("paths") between
//! two processes into one session that loses nothing, doubles nothing and
//! keeps order per stream, as long as some path works again within the
//! session's linger time, and runs the message layer on top of it. It holds
//! the whole protocol as deterministic state machines:
//!
//! - [`wire`]: the versioned frame format (DATA, BATCH, ACK, ...),
//!   zero-copy decoding with bounds.
//! - [`Session`]: everything about one peer incarnation. Messages are
//!   numbered per stream, kept in a retransmit cache until the peer's
//!   application has them (SQR), batched when they queue behind a write,
//!   spread over the least-loaded working path (hr-net), re-sent on the
//!   other paths before anything new when a path fails, and resumed on a
//!   reconnected path by exchanging receive state (PostMan's resume
//!   handshake). The message layer: one-way messages, calls with ids,
//!   deadlines and re-sends under the same id, and the server side —
//!   at most once per call, duplicates answered, admission bounded per
//!   peer.
//! - [`Router`]: which session a path belongs to; a restarted peer (new
//!   epoch) ends the old session, whose outstanding messages and calls are
//!   reported, never replayed into the new process. A HELLO's whole
//!   decision is one [`HelloDecision`], which every driver applies with
//!   [`HelloDecision::apply`] over its own [`SessionTable`].
//! - [`rpc`]: the client state machine, the [`rpc::Scheduler`] that picks
//!   which admitted request runs next, and the header codec.
//! - [`detector`]: the failure detector's logic (SafeTimer).
//! - [`helper`]: PostMan helpers' logic (when a helper sends a batch).
//! - [`Endpoint`]: a router and its sessions in one value, for
//!   single-threaded drivers (the simulator drives exactly this code; the
//!   tokio shell keeps the same router and sessions behind locks and
//!   applies the same decisions).
//!
//! What it does **not** do: read a clock, touch a socket, spawn a task, run
//! a handler, or decide when a path is dead beyond its own retransmission
//! timeout (the shell reports transport failures and runs the detector).
//!
//! # Calling convention
//!
//! Inputs take an explicit `now` ([`Time`]): `add_path`, `handle_input`,
//! `handle_path_down`, `handle_timeout`, `send`, `call`, `complete`.
//! Outputs are polled: `poll_transmit` (bytes for one path), `poll_timeout`
//! (when to call `handle_timeout`), `poll_event`. After any input, drain
//! `poll_transmit` and `poll_event`, then re-arm the timer. A multi-threaded
//! shell keeps each [`Session`] behind its own lock and the [`Router`]
//! behind another, taken only for handshakes; it implements
//! [`SessionTable`] to apply the router's [`HelloDecision`]s.
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
//! let opts = rpc::CallOptions::new(std::time::Duration::from_secs(1));
//! a.call(now, NodeId(2), ChannelId(0), Bytes::from_static(b"ping"), &opts).unwrap();
//! // Shuttle bytes until both sides are quiet (a real shell writes them
//! // to sockets instead); b answers every request with its body reversed.
//! fn shuttle(from: &mut Endpoint, to: &mut Endpoint, got: &mut Vec<Event>) {
//!     let mut buf = BytesMut::new();
//!     while let Some(path) = from.poll_transmit(Time::ZERO, &mut buf, 64 * 1024) {
//!         to.handle_input(Time::ZERO, path, &mut buf).unwrap();
//!     }
//!     while let Some(ev) = to.poll_event() {
//!         if let Event::Request(t) = &ev {
//!             let reply: Vec<u8> = t.body.iter().rev().copied().collect();
//!             to.complete(Time::ZERO, t.session, t.call, Ok(reply.into())).unwrap();
//!         }
//!         got.push(ev);
//!     }
//! }
//! let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
//! for _ in 0..4 {
//!     shuttle(&mut a, &mut b, &mut at_b);
//!     shuttle(&mut b, &mut a, &mut at_a);
//! }
//! assert!(at_b.iter().any(|e| matches!(e, Event::Message(m) if m.payload == "hello")));
//! assert!(at_a.iter().any(|e| matches!(e,
//!     Event::CallDone { result: Ok(r), .. } if r == "gnip")));
//! ```

//! # Stability
//!
//! Errors, configuration, events and data that later versions may extend
//! are `#[non_exhaustive]` (match them with a catch-all arm; build
//! configurations from their defaults). Exhaustive on purpose are the
//! wire's vocabulary ([`wire::Frame`]) and the decisions a driver must act
//! on in full — [`Input`], [`detector::PathReport`],
//! [`detector::MonitorAction`], [`detector::FenceState`], the role
//! service's messages, inputs, events and candidacy actions,
//! [`rpc::Priority`]: a new one must break every driver's build rather
//! than fall into a catch-all arm and be ignored.

mod config;
pub mod detector;
mod endpoint;
mod error;
mod event;
mod handshake;
pub mod helper;
mod ids;
pub mod role;
mod router;
pub mod rpc;
pub mod secure;
mod session;
mod time;
pub mod wire;

pub use config::{ConfigError, EndpointConfig, MESSAGE_OVERHEAD};
pub use endpoint::Endpoint;
pub use error::{AddPathError, HandshakeError, PathError, ProtocolViolation, SendError};
pub use event::{Abandoned, Event, PathCloseReason, RejectReason, SessionEndReason};
pub use ids::{
    CallId, ChannelId, ClusterId, Epoch, MessageId, NodeId, PathId, SessionId, StreamId, StreamKind,
};
pub use router::{HelloDecision, HelloStep, OpenError, Router, SessionTable};
pub use session::{
    CompleteError, Input, LocalIdentity, Message, MessageBatch, PathSnapshot, PathStats,
    RoleSendError, SendLimits, Session, SessionStats, ROLE_QUEUE, ROLE_QUEUE_BYTES,
};
pub use time::Time;
