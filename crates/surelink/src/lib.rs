//! surelink: message passing for cluster services that keeps working
//! through network, process and load failures.
//!
//! This crate is the tokio shell around the sans-IO core in
//! [`surelink_proto`] (re-exported as [`proto`]). It owns the sockets (one or
//! more TCP connections per network to each peer, UDP heartbeats), the
//! timers, the tasks and the request executor, and gives services
//! [`Endpoint::call`], [`Endpoint::send`] / [`Endpoint::send_many`] /
//! [`Endpoint::try_send`], [`Endpoint::serve`] and [`Endpoint::recv_many`].
//!
//! What it adds to the core: listening and dialling on every configured
//! network from the matching local address, `TCP_NODELAY` and
//! `TCP_USER_TIMEOUT`, re-dialling lost connections with capped backoff
//! (the core then runs the resume handshake), the failure detector
//! (SafeTimer: heartbeats, barrier checks, the send fence), backpressure,
//! events, and counters ([`Endpoint::stats`], Prometheus text with the
//! `prometheus` feature, and the `metrics` facade). With `Config::role`,
//! the role service (hr-net's role server): reports, routing tables as
//! path policy, the embedded candidates' failover, or an external
//! backend's tables through [`Endpoint::external_role`]
//! ([`Endpoint::role_status`]).
//!
//! # Shape
//!
//! quinn's: the core's [`Router`](proto::Router) sits behind one lock and
//! is taken only for handshakes, new sessions and ended ones; a HELLO is
//! decided there and the decision applied with
//! [`HelloDecision::apply`](proto::HelloDecision::apply), exactly as the
//! simulator applies it. Each [`Session`](proto::Session) has its own lock,
//! its own task for timers and deferred writes, and its connections, and
//! one way in: lock, input, drive, unlock, then the socket writes and
//! wake-ups. A reader task feeds its connection's bytes straight into its
//! session and writes what the session answers; a caller queues its
//! request and writes it itself; a reply reaches its caller from the
//! reader that received it. Request handlers run on the endpoint's
//! executor (one task each), in the order the scheduler picks, never
//! inside a reader or a caller.
//!
//! By file: `endpoint/` the public handle; `shared.rs` the router and the
//! session map; `session/` one session (its entry, drive and task);
//! `call.rs` calls and sends; `conn/` connections (write queue, reader,
//! listening and accepting); `dial.rs` dialling; `detector/` SafeTimer's
//! threads, the send gate and the endpoint's reactions to reports and to a
//! closed fence; `server/` the executor and recovery groups; `incoming.rs` one-way delivery;
//! `role/` the role service's task; `events.rs`, `stats.rs`,
//! `exporter.rs` what an operator sees.
//!
//! # Stability
//!
//! Public enums and configuration structs are `#[non_exhaustive]`: later
//! versions add variants and fields (with defaults) without a breaking
//! release. Build configurations with `Config::new` / `PeerConfig::new`
//! and change fields; match enums with a catch-all arm.
//!
//! # Features
//!
//! - `prometheus` (default): [`Endpoint::serve_metrics`].
//! - `test-util`: the [`testing`] module — fault injection (kill a
//!   network's connections, stall the detector's threads), debugging
//!   hooks, and the two-network loopback fixture for tests, demos and
//!   benchmarks.

mod admission;
mod call;
mod clock;
mod config;
mod conn;
mod detector;
mod dial;
mod endpoint;
mod error;
mod events;
#[cfg(feature = "prometheus")]
mod exporter;
mod histogram;
mod incoming;
mod peer_calls;
mod ratelog;
mod relay;
mod role;
mod secure;
mod server;
mod session;
mod shared;
mod stats;
mod sync;
#[cfg(feature = "test-util")]
pub mod testing;

pub use config::{
    default_core, Config, ConfigError, DetectorPriority, ExecutorConfig, PeerConfig,
    SchedulerConfig, SchedulerKind, WriteBatching,
};
pub use detector::{DelayPoint, DetectorSnapshot, RefusedCounts, StraysSnapshot};
pub use endpoint::{Endpoint, PathInfo};
pub use error::{BindError, CallError, SendError, TrySendError};
pub use events::{Events, NetEvent, RecvError, TryRecvError};
pub use incoming::{Incoming, IncomingBatch};
pub use relay::{Helped, HelpedStatus, Helper, HelperError, HelperStats, RelayPath};
pub use role::{ExternalRole, ExternalRoleError, RoleStatus};
pub use server::{
    Cleanup, GroupConfig, GroupError, GroupEvent, GroupId, GroupSnapshot, GroupState, GroupStats,
    Handler, HandlerError, HandlerFuture, IntoReply, Mapping, RecoveryEvent, RecoveryPolicy,
    Request, RouteInfo, Routing,
};
pub use stats::{ConnectionsRefused, StatsSnapshot};
pub use surelink_proto as proto;
pub use surelink_proto::detector::{DetectorConfig, DetectorMode};
pub use surelink_proto::rpc::{CallOptions, Priority, RemoteError};
pub use surelink_proto::secure::{Keypair, Members, Protection, PublicKey};
pub use surelink_proto::ChannelId;
