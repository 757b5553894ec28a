//! `surelink-lab attack …`: the attacks of issue 25, each against a
//! target it starts itself from `--surelink-bin` (so the same tool
//! measures an old binary and a new one), reporting legitimate traffic
//! during the attack and the target's RSS before, during and after, with
//! a JSON result.

use anyhow::Result;
use clap::Subcommand;

mod proxy_amplify;
mod proxy_cluster;
mod proxy_slots;

/// One attack.
#[derive(Subcommand)]
pub(crate) enum Attack {
    /// Multi-gets that name large values many times, left unread, against
    /// the cache proxy.
    ProxyAmplify(proxy_amplify::Args),
    /// The cache proxy's connection slots from one address, idle clients,
    /// a trickled 1 MiB line (its CPU against memcached's).
    ProxySlots(proxy_slots::Args),
}

pub(crate) async fn run(a: &Attack) -> Result<()> {
    match a {
        Attack::ProxyAmplify(a) => proxy_amplify::run(a).await,
        Attack::ProxySlots(a) => proxy_slots::run(a).await,
    }
}
