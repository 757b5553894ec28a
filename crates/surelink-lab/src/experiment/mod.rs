//! `surelink-lab experiment …`: experiments that run several processes.
//!
//! - `detector`: SafeTimer's Table 1 and detection times.
//! - `failover`: failover time under link faults, surelink vs TCP vs MPTCP.
//! - `flows`: flow completion times (1–100 KiB) with and without a link
//!   failure, the same contenders.
//! - `soak`: random faults on both links for minutes; every message once
//!   and in order.
//! - `role`: non-local fault notification on three hosts, with and
//!   without the role service.
//! - `recovery`: recovery-conscious scheduling, the paper's experiment on
//!   the simulator's virtual workers (no processes).
//!
//! `surelink-lab experiment-node` (hidden) is the process each one starts.

mod contenders;
pub(crate) mod detector;
pub(crate) mod failover;
pub(crate) mod flows;
pub(crate) mod node;
mod node_counts;
mod plot;
mod procs;
pub(crate) mod recovery;
pub(crate) mod role_notify;
pub(crate) mod soak;
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
    /// Flow completion times of 1–100 KiB requests with and without a
    /// link failure: surelink vs plain TCP vs Linux MPTCP (needs root).
    Flows(flows::FlowsArgs),
    /// Random faults on both links for `--minutes`; fails unless every
    /// message arrives once and in order (needs root).
    Soak(soak::SoakArgs),
    /// Non-local fault notification on three hosts: a one-way fault on a
    /// node's link, with and without the role service (needs root).
    Role(role_notify::RoleNotifyArgs),
    /// Recovery-conscious scheduling (FAST '08): the paper's experiment on
    /// the simulator — each mapping, good path and 5 % recovery overhead.
    Recovery(recovery::RecoveryArgs),
}

/// Runs one experiment. Ctrl-C drops it, and with it the node processes
/// (killed on drop) and the testbed (removed by its guard).
pub(crate) async fn run(e: &Experiment) -> Result<()> {
    let r = tokio::select! {
        r = run_inner(e) => r,
        _ = tokio::signal::ctrl_c() => {
            Err(anyhow::anyhow!("interrupted: node processes stopped, testbed removed"))
        }
    };
    procs::remove_key_dir();
    r
}

async fn run_inner(e: &Experiment) -> Result<()> {
    match e {
        Experiment::Detector(a) => detector::run(a).await,
        Experiment::Failover(a) => failover::run(a).await,
        Experiment::Flows(a) => flows::run(a).await,
        Experiment::Soak(a) => soak::run(a).await,
        Experiment::Role(a) => role_notify::run(a).await,
        Experiment::Recovery(a) => recovery::run(a).await,
    }
}
