//! `surelink-lab`: the harness around the product — never shipped, built
//! with `surelink`'s `test-util` (fault hooks).
//!
//! - `demo`: the cache cluster under fire (`--stream`: two endpoints, two
//!   networks, connections killed mid-stream; `--simulated` for the
//!   deterministic simulator).
//! - `bench`: surelink against plain TCP, ZeroMQ (`--features zeromq`) and
//!   NATS (a `nats-server` child process), latency and throughput;
//!   `bench cache`: the cache cluster against memcached and twemproxy.
//! - `testbed up|down|fault|undo|pause|resume`: two network namespaces, two
//!   links, faults on either link, SIGSTOP/SIGCONT of a host (root).
//! - `experiment detector`: false failure reports under local delays
//!   (SafeTimer's Table 1), the sender fence, detection times.
//! - `experiment failover|flows|soak|role` (root): failover time and flow
//!   completion times against plain TCP and Linux MPTCP; a soak of random
//!   faults on both links that fails on any lost, doubled or reordered
//!   message; non-local fault notification with the role service.
//!
//! The hidden subcommands are the child processes those start (this binary
//! re-executes itself), among them `cache node|proxy`: the shipped
//! binary's cache runners from `surelink-node`, so `bench cache` measures
//! the product's code without another package built.

// Reporting code converts counts and durations for display.
#![allow(clippy::cast_possible_truncation)]

mod attack;
mod bench;
mod demo;
mod experiment;
mod memload;
mod plot_style;
mod testbed;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "surelink-lab",
    version,
    about = "surelink's demo, benchmarks, experiments and netns testbed"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A memcached-compatible cache cluster under fire: faults from a relay,
    /// every answer checked (`--stream`: two endpoints, connections killed
    /// mid-stream).
    Demo(demo::DemoArgs),
    /// Benchmark against plain TCP, ZeroMQ and NATS: round-trip latency and
    /// throughput.
    Bench(bench::BenchArgs),
    /// Network namespaces joined by two links, and faults (needs root).
    Testbed(testbed::TestbedArgs),
    /// Attacks on a `surelink` binary it starts: legitimate traffic and
    /// the target's memory during each.
    #[command(subcommand)]
    Attack(attack::Attack),
    /// Multi-process experiments: `detector`, `failover`, `flows`, `soak`,
    /// `role`.
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
    /// The load of `bench helpers` (client sessions in one process).
    #[command(hide = true)]
    BenchHelpersLoad(bench::helpers::LoadArgs),
    /// A plain TCP / MPTCP baseline node of an experiment (used by
    /// `experiment failover`).
    #[command(hide = true)]
    ExperimentTcpNode(experiment::tcpnode::TcpNodeArgs),
    /// A cache node or proxy of `bench cache`, or a helper of `demo
    /// --hot`: the shipped binary's `surelink cache node|proxy` and
    /// `surelink helper`, the same runners.
    #[command(hide = true, subcommand)]
    Cache(CacheCommand),
}

#[derive(Subcommand)]
enum CacheCommand {
    /// A cache node.
    Node(ConfigArg),
    /// A cache proxy.
    Proxy(ConfigArg),
    /// A PostMan helper (`surelink helper`).
    Helper(ConfigArg),
}

#[derive(Args)]
struct ConfigArg {
    /// TOML configuration.
    #[arg(long)]
    config: PathBuf,
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
    // A cache daemon reads its runtime's size from its file, as the
    // shipped binary's does.
    let (config, default_workers) = match &cli.command {
        Command::Cache(CacheCommand::Node(a) | CacheCommand::Proxy(a)) => (
            Some(a.config.as_path()),
            surelink_node::cache::WORKER_THREADS,
        ),
        Command::Cache(CacheCommand::Helper(a)) => (
            Some(a.config.as_path()),
            surelink_node::runtime::WORKER_THREADS,
        ),
        _ => (None, surelink_node::runtime::WORKER_THREADS),
    };
    let rt = surelink_node::runtime::for_config(config, default_workers)?;
    rt.block_on(async {
        match cli.command {
            Command::Demo(a) => demo::run(&a).await,
            Command::Bench(a) => bench::run(&a).await,
            Command::Attack(a) => attack::run(&a).await,
            Command::Testbed(a) => testbed::main(&a),
            Command::Experiment(e) => experiment::run(&e).await,
            Command::ExperimentNode(a) => experiment::node::run(&a).await,
            Command::ExperimentRoleNode(a) => experiment::role_notify::node(&a).await,
            Command::ExperimentTcpNode(a) => experiment::tcpnode::run(&a).await,
            Command::BenchCacheClient(a) => bench::cache::failure::client(&a).await,
            Command::BenchHelpersLoad(a) => bench::helpers::load(&a).await,
            Command::Cache(CacheCommand::Node(a)) => {
                Ok(surelink_node::cache::node(&a.config).await?)
            }
            Command::Cache(CacheCommand::Proxy(a)) => {
                Ok(surelink_node::cache::proxy(&a.config).await?)
            }
            Command::Cache(CacheCommand::Helper(a)) => {
                Ok(surelink_node::helper::helper(&a.config).await?)
            }
        }
    })
}
