//! `surelink-lab attack …`: the attacks of the hardening issue, each
//! against a target it starts itself from `--surelink-bin` (default: the
//! `surelink` next to this binary), so one tool measures an old build and
//! a new one. Each reports legitimate traffic during the attack and the
//! target's memory before, during and after, and writes a JSON result.

mod crowd;
mod echo_target;
mod member_paths;

use anyhow::Result;
use clap::Subcommand;

/// Which attack.
#[derive(Subcommand, Debug, Clone)]
pub(crate) enum Attack {
    /// Strangers hold idle connections from several addresses while a
    /// member calls and re-dials after its connections are cut.
    Crowd(crowd::CrowdArgs),
    /// A member opens ~1 000 paths into one session while another member
    /// calls and a third connects for the first time.
    MemberPaths(member_paths::MemberPathsArgs),
}

/// Runs one attack.
pub(crate) async fn run(a: &Attack) -> Result<()> {
    match a {
        Attack::Crowd(a) => crowd::run(a).await,
        Attack::MemberPaths(a) => member_paths::run(a).await,
    }
}
