//! `surelink experiment …`: experiments that run several processes.
//!
//! - `detector`: SafeTimer's Table 1 and detection times.
//!
//! `surelink experiment-node` (hidden) is the process each one starts.

pub(crate) mod detector;
pub(crate) mod failover;
pub(crate) mod node;
mod plot;
mod procs;
pub(crate) mod tcpnode;

use anyhow::Result;
use clap::Subcommand;

/// Which experiment.
#[derive(Subcommand, Debug, Clone)]
pub(crate) enum Experiment {
    /// False failure reports under local delays and drops (SafeTimer's
    /// Table 1), the sender fence, and crash detection times.
    Detector(detector::DetectorArgs),
    /// Failover under link faults on a real (netns) network: surelink vs
    /// plain TCP vs Linux MPTCP (needs root).
    Failover(failover::FailoverArgs),
}

/// Runs one experiment.
pub(crate) async fn run(e: &Experiment) -> Result<()> {
    match e {
        Experiment::Detector(a) => detector::run(a).await,
        Experiment::Failover(a) => failover::run(a).await,
    }
}
