//! `surelink`: the command-line tool — argument parsing and dispatch to
//! `surelink-node`, which does the work.
//!
//! - `serve --config F`: an echo server; `call --config F --peer N`: a ping
//!   client; `stats --metrics ADDR`: a running endpoint's counters.
//! - `cache node|proxy --config F`: the memcached-compatible cache cluster.
//! - `role-server --config F`: a node whose only job is the role service;
//!   `status --cluster F`: the role service's view from every node.
//! - `keygen`: a node key pair; `certs`: a throwaway CA and node
//!   certificates for trying mutual TLS.
//!
//! The demo, benchmarks, experiments and the netns testbed are the lab's
//! (`cargo run -p surelink-lab -- demo`), not this binary's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use surelink_node::surelink::proto::NodeId;

/// mimalloc rather than glibc's malloc: a session, a proxy and a node
/// allocate and free small buffers per message on one thread, where
/// glibc's free lists cost 6–8 % of a cache server's CPU (`perf` at 10k
/// req/s; docs/cache.md "Where the cost went").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "surelink",
    version,
    about = "Message passing for cluster services that keeps working through failures"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an echo server from a TOML configuration.
    Serve(ConfigArg),
    /// The memcached-compatible cache cluster: `node` and `proxy`.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Call a peer (ping/echo) from a TOML configuration.
    Call(CallArgs),
    /// Generate a node key pair (the secret to a file, the public key to
    /// paste into the node's entry of the cluster file, or every node's
    /// `[[members]]`).
    Keygen(KeygenArgs),
    /// Generate a throwaway CA and a certificate per node, for trying
    /// mutual TLS (`[tls]`) instead of member keys.
    Certs(CertsArgs),
    /// A PostMan helper: relays clients' connections to servers, many per
    /// message (the configuration's `[helper]` section).
    Helper(ConfigArg),
    /// Print a running endpoint's counters from its metrics port.
    Stats(StatsArgs),
    /// Run a node whose only job is the role service (hr-net's role
    /// server): a candidate from the cluster file.
    RoleServer(RoleServerArgs),
    /// The role service's view from every node: the routing table each
    /// holds, and the path-status matrix on the serving role server.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
struct ConfigArg {
    /// TOML configuration (every key and its default: docs/configuration.md).
    #[arg(long)]
    config: PathBuf,
}

#[derive(Subcommand, Debug)]
enum CacheCommand {
    /// A cache node: holds items in memory and serves proxies over surelink.
    Node(CacheConfigArg),
    /// A proxy: memcached's text protocol on a local port, keys routed to
    /// the nodes by consistent hashing.
    Proxy(CacheConfigArg),
}

#[derive(Args, Debug)]
struct CacheConfigArg {
    /// TOML configuration.
    #[arg(long)]
    config: PathBuf,
}

#[derive(Args, Debug)]
struct CallArgs {
    /// TOML configuration of this (client) endpoint.
    #[arg(long)]
    config: PathBuf,
    /// The node to call.
    #[arg(long)]
    peer: u64,
    /// Calls to make.
    #[arg(long, default_value_t = 10)]
    count: u64,
    /// Request size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Pause between calls, milliseconds.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Per-call deadline, milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

/// `surelink keygen`.
#[derive(Args, Debug)]
struct KeygenArgs {
    /// Write the secret key to this file (mode 0600; refuses to overwrite)
    /// and print only the public key. Without it, both are printed.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `surelink certs`.
#[derive(Args, Debug)]
struct CertsArgs {
    /// Directory to write into (created; existing files are not replaced).
    #[arg(long)]
    out: PathBuf,
    /// The cluster id the certificates name.
    #[arg(long)]
    cluster: u64,
    /// Node ids, comma separated (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<u64>,
}

#[derive(Args, Debug)]
struct StatsArgs {
    /// The endpoint's metrics address (`metrics = ...` in its config).
    #[arg(long)]
    metrics: SocketAddr,
    /// Print the raw Prometheus text.
    #[arg(long)]
    raw: bool,
}

#[derive(Args, Debug)]
struct RoleServerArgs {
    /// TOML configuration of this node; it must name a `cluster_file`
    /// that lists this node among the role-server candidates.
    #[arg(long)]
    config: PathBuf,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// The cluster file: every node with a `metrics` address is asked.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Ask only this metrics address (`host:port`).
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// Ask only this node of the cluster file.
    #[arg(long)]
    node: Option<u64>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Daemons read their runtime's size from their configuration file.
    let (config, default_workers) = match &cli.command {
        Command::Cache(CacheCommand::Node(a) | CacheCommand::Proxy(a)) => (
            Some(a.config.as_path()),
            surelink_node::cache::WORKER_THREADS,
        ),
        Command::Serve(ConfigArg { config })
        | Command::Helper(ConfigArg { config })
        | Command::RoleServer(RoleServerArgs { config })
        | Command::Call(CallArgs { config, .. }) => (
            Some(config.as_path()),
            surelink_node::runtime::WORKER_THREADS,
        ),
        _ => (None, surelink_node::runtime::WORKER_THREADS),
    };
    let rt = surelink_node::runtime::for_config(config, default_workers)?;
    rt.block_on(async {
        match cli.command {
            Command::Serve(a) => surelink_node::serve::serve(&a.config).await?,
            Command::Helper(a) => surelink_node::helper::helper(&a.config).await?,
            Command::Call(a) => {
                let mut opts = surelink_node::call::PingOptions::new(NodeId(a.peer));
                opts.count = a.count;
                opts.size = a.size;
                opts.interval = Duration::from_millis(a.interval_ms);
                opts.timeout = Duration::from_millis(a.timeout_ms);
                surelink_node::call::call(&a.config, &opts).await?;
            }
            Command::Keygen(a) => surelink_node::keys::keygen(a.out.as_deref())?,
            Command::Certs(a) => surelink_node::certs::certs(&a.out, a.cluster, &a.nodes)?,
            Command::Stats(a) => surelink_node::stats::stats(a.metrics, a.raw).await?,
            Command::RoleServer(a) => surelink_node::role_server::role_server(&a.config).await?,
            Command::Status(a) => {
                surelink_node::status::status(a.cluster.as_deref(), a.addr, a.node)?;
            }
            Command::Cache(CacheCommand::Node(a)) => surelink_node::cache::node(&a.config).await?,
            Command::Cache(CacheCommand::Proxy(a)) => {
                surelink_node::cache::proxy(&a.config).await?;
            }
        }
        Ok(())
    })
}
