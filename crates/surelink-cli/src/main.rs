//! `surelink`: the command-line tool.
//!
//! - `demo`: two endpoints, two networks, connections killed mid-stream;
//!   what arrived (`--simulated` for the deterministic simulator).
//! - `serve --config F`: an echo server; `call --config F --peer N`: a ping
//!   client; `stats --metrics ADDR`: a running endpoint's counters.
//! - `bench`: surelink against plain TCP, ZeroMQ (`--features zeromq`) and
//!   NATS (a `nats-server` child process), latency and throughput.
//! - `testbed up|down|fault|undo|pause|resume`: two network namespaces, two
//!   links, faults on either link, SIGSTOP/SIGCONT of a host (root).
//! - `experiment detector`: false failure reports under local delays
//!   (SafeTimer's Table 1), the sender fence, detection times.
//! - `experiment failover|flows|soak` (root): failover time and flow
//!   completion times against plain TCP and Linux MPTCP; a soak of random
//!   faults on both links that fails on any lost, doubled or reordered
//!   message.

// Reporting code converts counts and durations for display.
#![allow(clippy::cast_possible_truncation)]

mod bench;
mod cache;
mod certs;
mod cluster_file;
mod config_file;
mod demo;
mod experiment;
mod keys;
mod memload;
mod role;
mod role_backend;
mod serve;
mod stats;
mod testbed;

use clap::{Parser, Subcommand};

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
    /// Two endpoints, two networks, connections killed mid-stream: what arrived?
    Demo(demo::DemoArgs),
    /// Run an echo server from a TOML configuration.
    Serve(serve::ServeArgs),
    /// The memcached-compatible cache cluster: `node` and `proxy`.
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// Call a peer (ping/echo) from a TOML configuration.
    Call(serve::CallArgs),
    /// Generate a node key pair (the secret to a file, the public key to
    /// paste into every node's `[[members]]`).
    Keygen(keys::KeygenArgs),
    /// Generate a throwaway CA and a certificate per node, for trying
    /// mutual TLS (`[tls]`) instead of member keys.
    Certs(certs::CertsArgs),
    /// Print a running endpoint's counters from its metrics port.
    Stats(stats::StatsArgs),
    /// Run a node whose only job is the role service (hr-net's role
    /// server): a candidate from the cluster file.
    RoleServer(role::RoleServerArgs),
    /// The role service's view from every node: the routing table each
    /// holds, and the path-status matrix on the serving role server.
    Status(role::StatusArgs),
    /// Benchmark against plain TCP, ZeroMQ and NATS: round-trip latency and
    /// throughput.
    Bench(bench::BenchArgs),
    /// Network namespaces joined by two links, and faults (needs root).
    Testbed(testbed::TestbedArgs),
    /// Multi-process experiments (`detector`).
    #[command(subcommand)]
    Experiment(experiment::Experiment),
    /// One endpoint of an experiment, in its own process (used by
    /// `experiment`).
    #[command(hide = true)]
    ExperimentNode(experiment::node::NodeArgs),
    /// One node of `experiment role`, inside its host's namespace.
    #[command(hide = true)]
    ExperimentRoleNode(experiment::role_notify::RoleNodeArgs),
    /// The client of `bench cache --failure`, inside the testbed's host a.
    #[command(hide = true)]
    BenchCacheClient(bench::cache::failure::ClientArgs),
    /// A plain TCP / MPTCP baseline node of an experiment (used by
    /// `experiment failover`).
    #[command(hide = true)]
    ExperimentTcpNode(experiment::tcpnode::TcpNodeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The demo reports the faults it injects itself: the warnings they
    // cause would bury its report (RUST_LOG still shows them).
    let default_level = match cli.command {
        Command::Demo(_) => "error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .init();
    // Daemons read their runtime's size from their configuration file.
    let (config, default_workers) = match &cli.command {
        Command::Cache(c) => (Some(c.config()), cache::WORKER_THREADS),
        Command::Serve(a) => (Some(a.config.as_path()), 2),
        Command::RoleServer(a) => (Some(a.config.as_path()), 2),
        Command::Call(a) => (Some(a.config.as_path()), 2),
        _ => (None, 2),
    };
    let workers = match config {
        Some(path) => config_file::runtime(path)?
            .worker_threads
            .unwrap_or(default_workers),
        None => default_workers,
    };
    // One worker: a current-thread runtime, whose run queue is plain FIFO
    // (a multi-thread one with one worker still runs a just-woken task
    // first, through its LIFO slot) and cheaper per wake-up.
    let rt = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()?
    };
    rt.block_on(async {
        match cli.command {
            Command::Demo(a) => demo::run(&a).await,
            Command::Serve(a) => serve::serve(&a).await,
            Command::Call(a) => serve::call(&a).await,
            Command::Keygen(a) => keys::keygen(&a),
            Command::Certs(a) => certs::certs(&a),
            Command::Stats(a) => stats::run(&a).await,
            Command::RoleServer(a) => role::role_server(&a).await,
            Command::Status(a) => role::status(&a),
            Command::Bench(a) => bench::run(&a).await,
            Command::Testbed(a) => testbed::main(&a),
            Command::Cache(c) => cache::main(&c).await,
            Command::Experiment(e) => experiment::run(&e).await,
            Command::ExperimentNode(a) => experiment::node::run(&a).await,
            Command::ExperimentRoleNode(a) => experiment::role_notify::node(&a).await,
            Command::ExperimentTcpNode(a) => experiment::tcpnode::run(&a).await,
            Command::BenchCacheClient(a) => bench::cache::failure::client(&a).await,
        }
    })
}
