//! surelink: message passing for cluster services that keeps working
//! through network, process and load failures.
//!
//! This crate is the tokio shell around the sans-IO core in
//! [`surelink_proto`] (re-exported as [`proto`]). It owns the sockets (one or
//! more TCP connections per network to each peer), the timers and the tasks,
//! and gives services [`Endpoint::call`], [`Endpoint::send`] /
//! [`Endpoint::try_send`], [`Endpoint::serve`] and [`Endpoint::recv`].
//!
//! What it adds to the core: listening and dialling on every configured
//! network from the matching local address, `TCP_NODELAY` and
//! `TCP_USER_TIMEOUT`, re-dialling lost connections with capped backoff
//! (the core then runs the resume handshake), request/reply matching,
//! backpressure, events, and counters ([`Endpoint::stats`], Prometheus text,
//! and the `metrics` facade).
//!
//! What it does not do (yet): detect a silently dead path faster than TCP
//! does (the heartbeat failure detector is later work; until then a path
//! that goes silent without the connection failing is caught by the core's
//! retransmission timeout, which re-sends its messages on another path, and
//! by `TCP_USER_TIMEOUT`), priorities, or batching helpers.
//!
//! Data path: no task sits between the application and the sockets. A
//! caller locks the core, queues its message and writes the core's output to
//! the socket itself; a connection's reader task feeds received bytes to the
//! core and writes whatever the core answers. Request handlers run in their
//! own tasks, outside the lock.

mod call;
mod config;
mod conn;
mod detector;
mod dispatch;
mod driver;
mod endpoint;
mod error;
mod exporter;
mod rpc;
mod stats;

pub use call::CallOptions;
pub use config::{default_core, Config, ConfigError, PeerConfig};
pub use detector::{DelayPoint, DetectorSnapshot};
pub use driver::{Handler, HandlerFuture, Incoming, NetEvent, Request};
pub use endpoint::{Endpoint, PathInfo};
pub use error::{BindError, CallError, SendError, TrySendError};
pub use stats::StatsSnapshot;
pub use surelink_proto as proto;
pub use surelink_proto::detector::{DetectorConfig, DetectorMode};
pub use surelink_proto::rpc::{DispatcherConfig, Priority};
