//! `surelink experiment …`: experiments that run several processes.
//!
//! - `detector`: SafeTimer's Table 1 and detection times.
//!
//! `surelink experiment-node` (hidden) is the process each one starts.

pub(crate) mod detector;
pub(crate) mod node;
mod plot;
mod procs;

use anyhow::Result;
use clap::Subcommand;

/// Which experiment.
#[derive(Subcommand, Debug, Clone)]
pub(crate) enum Experiment {
    /// False failure reports under local delays and drops (SafeTimer's
    /// Table 1), the sender fence, and crash detection times.
    Detector(detector::DetectorArgs),
}

/// Runs one experiment.
pub(crate) async fn run(e: &Experiment) -> Result<()> {
    match e {
        Experiment::Detector(a) => detector::run(a).await,
    }
}
