//! `surelink-lab attack <name>`: attacks on a `surelink` binary started
//! here with a configuration in a temporary directory (`--surelink-bin`
//! picks the binary, so the same tool measures an old build and a new
//! one). Each reports legitimate traffic during the attack and the
//! target's RSS before, during and after, and writes a JSON result.

mod epochs;
mod unacked;

use clap::Subcommand;

/// The attacks.
#[derive(Subcommand)]
pub(crate) enum Attack {
    /// A member sends thousands of calls and never acknowledges the
    /// replies.
    Unacked(unacked::UnackedArgs),
    /// A member restarts (a new epoch) every couple of seconds, each time
    /// filling the server's one-way queue, which the server never reads.
    Epochs(epochs::EpochsArgs),
}

/// Runs one attack.
pub(crate) async fn run(a: &Attack) -> anyhow::Result<()> {
    match a {
        Attack::Unacked(a) => unacked::run(a).await,
        Attack::Epochs(a) => epochs::run(a).await,
    }
}
