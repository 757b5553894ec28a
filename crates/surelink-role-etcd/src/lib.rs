//! The role server's etcd backend (`role.backend = "etcd"`), for clusters
//! that outgrow one role server: etcd elects the role server and carries
//! its routing tables to the nodes. A shell adapter: everything with wire
//! meaning — the matrix, the tables, their encoding, which table a node
//! applies — is `surelink_proto::role`'s; this crate only moves it through
//! etcd.
//!
//! # What it does
//!
//! - **Election.** Each [`Candidate`] grants itself a lease, keeps it alive
//!   from a task, and campaigns in etcd's election
//!   (`<prefix>/election`). The winner's election key's *create revision*
//!   is its role epoch, the fencing token. Leaders follow one another in
//!   the order of their keys' revisions (a key leads only once every
//!   lower one is gone), so epochs only go up.
//! - **`t_valid`.** etcd renews a lease when it processes a keep-alive, so
//!   an acknowledged keep-alive sent at `s` keeps the lease, and the
//!   election, until at least `s + TTL` of etcd's time. A leader's
//!   `t_valid` is its newest acknowledged keep-alive's send time + TTL −
//!   margin ([`Leader::t_valid`]): a leader cut off from etcd stops before
//!   its lease can expire, i.e. before another candidate can be elected.
//!   It sends nothing at or after `t_valid` and, past it once, stops for
//!   good ([`LeaderEnd::Fenced`]) — the core [`RoleServer`]'s rule.
//! - **Tables.** The [`Leader`] runs the core [`RoleServer`] for its epoch
//!   (the nodes' reports reach it over surelink's sessions, as with the
//!   built-in backend) and writes each node's row, encoded as
//!   [`RoleMessage::Table`], under `<prefix>/table/<node>`, in a
//!   transaction that applies only if the election key's create revision
//!   is still its epoch. A failed condition stops it for good
//!   ([`LeaderEnd::LostElection`]). A row etcd accepted counts as
//!   acknowledged: the core stops re-pushing it.
//! - **Nodes.** A [`Watcher`] watches its node's row only and applies it
//!   through an [`ElectedGate`]: newer `(epoch, version)` only, so a node's
//!   epochs never go back and two leaders' tables never interleave.
//!
//! **Why one key per node** rather than the whole table under one key: a
//! node receives only its own row (its unusual routes and the ring), so a
//! change to one pair's routes costs each node one small event instead of
//! the whole cluster's table; the core already encodes rows (there is no
//! whole-table encoding); and a node's row is exactly what the built-in
//! backend pushes over sessions, so both backends apply the same thing.
//! The cost: a version touches every row (the rows carry the ring), in
//! transactions of at most `max_txn_ops` rows each.
//!
//! # Failover time
//!
//! A leader that dies or is cut off from etcd is followed once its lease
//! runs out: the lease's TTL after its last renewal, plus up to the 500 ms
//! at which etcd looks for expired leases; the new leader writes at once
//! and the watchers apply within milliseconds. etcd grants at least 2 s
//! with its default timing. A leader that resigns ([`Leader::resign`], or
//! closing [`Leader::run`]'s reports) hands over in milliseconds.
//! `cargo run --release --manifest-path crates/surelink-role-etcd/Cargo.toml --example failover` measures
//! it on the backend alone, `--example nodes_failover` through real
//! endpoints beside the embedded service's failover.
//!
//! # What it does not do
//!
//! - Liveness stays in surelink: the detector's heartbeats and the nodes'
//!   reports travel over surelink's sessions; etcd holds tables, not
//!   heartbeats, and the leader takes reports from the shell
//!   ([`Leader::handle_report`], [`Leader::run`]).
//! - Trust in etcd is etcd's: with TLS ([`EtcdTls`]: `https://`
//!   endpoints, a CA to trust, a client certificate for etcd's
//!   `--client-cert-auth`) nodes talk only to the real etcd and etcd
//!   only to holders of certificates it trusts; without it, whoever can
//!   reach etcd can write rows. Where etcd's authentication is on, nodes
//!   log in as a user ([`EtcdAuth`], a password; tokens are renewed as
//!   they expire) or as their client certificate's common name. A row's
//!   writer is not checked by the nodes: a
//!   row can only have reached etcd through a transaction conditioned on
//!   the election key of its epoch ([`ElectedGate`]).
//! - No cluster file parsing: `surelink` (built with its `etcd` feature)
//!   reads `role.backend = "etcd"` and builds the [`EtcdRoleConfig`].
//! - A [`Leader`] that stops does not campaign again by itself;
//!   [`EtcdBackend`] does (a new lease, a new epoch).
//! - A [`Leader`] alone starts from an empty matrix (every ring member
//!   suspect until reports arrive); [`EtcdBackend`] seeds it with the
//!   reports its candidate received in the last two refreshes.
//!
//! # Running it for an endpoint
//!
//! [`EtcdBackend::start`] takes an endpoint whose role configuration has
//! `ownership: Ownership::Elected` and runs the watcher (every node) and
//! the campaign-lead-campaign loop (candidates) on its
//! [`ExternalRole`](surelink::ExternalRole) link.

mod candidate;
mod config;
mod gate;
mod leader;
mod lease;
mod node;
#[cfg(feature = "test-util")]
pub mod testing;
mod watcher;

pub use candidate::{CampaignError, Candidate, ConnectError};
pub use config::{EtcdAuth, EtcdConfigError, EtcdRoleConfig, EtcdTls};
pub use gate::ElectedGate;
pub use leader::{Leader, LeaderEnd, LeaderStats, PublishError, Published};
pub use node::{BackendState, EtcdBackend, StartError};
pub use watcher::{BadRow, WatchError, WatchEvent, Watcher};

#[cfg(doc)]
use surelink_proto::role::{RoleMessage, RoleServer};
