//! `surelink-lab demo`: by default the cache cluster under fire
//! ([`cluster`]); `--stream` the two-endpoint streaming demo ([`stream`]),
//! `--stream --simulated` the same on the simulator ([`sim`]).

mod cluster;
mod faults;
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
    /// Seconds the load (or the stream) runs [default: 20, or 3 with
    /// --stream]. The cluster's faults are placed at fixed fractions of it.
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
    /// Cluster: requests per second offered (open loop).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) rate: u32,
    /// Cluster: client connections to the proxy.
    #[arg(long, default_value_t = 8)]
    pub(crate) connections: usize,
    /// Cluster: distinct keys (Zipf-popular).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) keys: u32,
    /// Cluster: where the report (JSON) and the timeline (PNG) go.
    #[arg(long, default_value = "target/demo")]
    pub(crate) out: PathBuf,
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
        _ => cluster::run(args).await,
    }
}
