//! A surelink node as the `surelink` binary runs it: the configuration
//! file and the cluster file, key files, and the daemons' runners.
//!
//! - [`config_file`]: a process's TOML file, parsed and checked into a
//!   [`surelink::Config`] plus what only the daemons read (metrics port,
//!   `[cache]`, `[proxy]`, `[runtime]`); [`cluster_file`]: the file every
//!   node shares (nodes, addresses, keys, the role service).
//! - [`keys`]: secret key files and `keygen`; [`certs`]: a throwaway CA
//!   and node certificates for trying mutual TLS.
//! - [`role_backend`]: binds an endpoint with the role backend its cluster
//!   file selects (the embedded service, or etcd with the `etcd` feature).
//! - The runners, each until Ctrl-C or its work is done: [`serve`] (an
//!   echo server), [`call`] (a ping client), [`cache`] (a cache node or
//!   proxy), [`helper`] (a PostMan helper relaying clients' connections),
//!   [`role_server`] (a node whose only job is the role service),
//!   [`status`] (the role service's view from every node), [`stats`] (a
//!   running endpoint's counters); [`runtime`] builds the tokio runtime a
//!   configuration file asks for; [`start`] is what they share to start
//!   and stop, and its [`start::StartError`].
//!
//! Runners print what the `surelink` binary shows its user, on stdout;
//! they return a typed error per operation (every enum `#[non_exhaustive]`:
//! a new failure is a new variant, not a breaking change). This crate
//! parses no command line and installs no logger (the binary does both),
//! and it carries no test hook, benchmark or experiment: those live in
//! `surelink-lab`.

pub use surelink;

pub mod cache;
pub mod call;
pub mod certs;
pub mod cluster_file;
pub mod config_file;
pub mod helper;
pub mod keys;
pub mod role_backend;
pub mod role_server;
pub mod runtime;
pub mod serve;
pub mod start;
pub mod stats;
pub mod status;

use std::error::Error;
use std::fmt::Write as _;

/// `e` and every error under it, joined by `: ` (what `anyhow`'s `{:#}`
/// shows): for messages printed without a binary's error report.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let _ = write!(s, ": {cause}");
        next = cause.source();
    }
    s
}
