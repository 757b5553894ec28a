//! `surelink-lab demo`: by default the cache cluster under fire
//! ([`cluster`]); `--stream` the two-endpoint streaming demo ([`stream`]),
//! `--stream --simulated` the same on the simulator ([`sim`]); `--hot` a
//! hot key making a node hot and PostMan helpers switching on ([`hot`]).

mod cluster;
mod faults;
mod hot;
mod hot_report;
mod plot;
mod report;
mod sim;
mod stream;

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// The two-endpoint streaming demo instead of the cache cluster.
    #[arg(long)]
    pub(crate) stream: bool,
    /// With --stream: run on the deterministic simulator (virtual time)
    /// instead of sockets.
    #[arg(long, requires = "stream")]
    pub(crate) simulated: bool,
    /// Simulator seed (with --simulated); the load's seed otherwise.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Seconds the load (or the stream) runs [default: 20, 24 with
    /// --hot, or 3 with --stream]. The cluster's faults are placed at fixed fractions of it.
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
    /// Cluster: requests per second offered (open loop) [default: 20000,
    /// or 2000 with --hot].
    #[arg(long)]
    pub(crate) rate: Option<u32>,
    /// Cluster: client connections to the proxy.
    #[arg(long, default_value_t = 8)]
    pub(crate) connections: usize,
    /// Cluster: distinct keys (Zipf-popular).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) keys: u32,
    /// Cluster: nodes holding each key (the proxy's `[proxy] replicas`).
    /// 2, the demo's: a node's death costs no miss. 1 is the product's
    /// default, memcached's way: a dead node's keys are lost.
    #[arg(long, default_value_t = 2)]
    pub(crate) replicas: usize,
    /// Cluster: where the report (JSON) and the timeline (PNG) go.
    #[arg(long, default_value = "target/demo")]
    pub(crate) out: PathBuf,
    /// A hot key makes a cache node hot; proxies move to PostMan helpers
    /// by their own p99 and back (needs root for the nodes' CPU caps).
    #[arg(long, conflicts_with = "stream")]
    pub(crate) hot: bool,
    /// --hot: cache proxies (each its own surelink endpoint).
    #[arg(long, default_value_t = 40)]
    pub(crate) proxies: usize,
    /// --hot: the flash crowd's extra gets per second of the hot key.
    #[arg(long, default_value_t = 8000)]
    pub(crate) hot_rate: u32,
    /// --hot: each node's cap, % of one core.
    #[arg(long, default_value_t = 15)]
    pub(crate) quota_pct: u32,
    /// --hot: the proxies' SLA, ms (`[proxy] helper_sla_ms`; the
    /// product's default is 2 ms, below what a node capped at 15 % of a
    /// core in 10 ms periods answers in without any crowd).
    #[arg(long, default_value_t = 20)]
    pub(crate) sla_ms: u64,
    /// --stream: microseconds between messages.
    #[arg(long, default_value_t = 200)]
    pub(crate) interval_us: u64,
    /// --stream: when network 0's connections are killed (seconds in).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) fail_at: f64,
    /// --stream on loopback: seconds later network 1's connections are
    /// killed too. Simulated: how long path 1 stays down.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) down_for: f64,
}

pub(crate) async fn run(args: &DemoArgs) -> Result<()> {
    match (args.stream, args.simulated) {
        (true, true) => sim::run(args),
        (true, false) => stream::run(args).await,
        _ if args.hot => hot::run(args).await,
        _ => cluster::run(args).await,
    }
}
