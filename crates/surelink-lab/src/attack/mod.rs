//! `surelink-lab attack …`: the attacks of the hardening issue (the
//! 2026-11-26 attack run), each against a target it starts itself from
//! `--surelink-bin` (default: the `surelink` next to this binary), so one
//! tool measures an old build and a new one. Each reports legitimate
//! traffic during the attack and the target's memory before, during and
//! after, and writes a JSON result.

mod crowd;
mod echo_target;
mod epochs;
mod member_paths;
mod proxy_amplify;
mod proxy_cluster;
mod proxy_slots;
pub(crate) mod udp_flood;
mod unacked;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;

/// Which attack.
#[derive(Subcommand)]
pub(crate) enum Attack {
    /// Strangers hold idle connections from several addresses while a
    /// member calls and re-dials after its connections are cut.
    Crowd(crowd::CrowdArgs),
    /// A member opens ~1 000 paths into one session while another member
    /// calls and a third connects for the first time.
    MemberPaths(member_paths::MemberPathsArgs),
    /// Junk UDP at a plain endpoint's heartbeat port while its peer is
    /// frozen or killed: time to the dead report, false reports of a live
    /// peer, the node's CPU and memory.
    UdpFlood(udp_flood::UdpFloodArgs),
    /// Multi-gets that name large values many times, left unread, against
    /// the cache proxy.
    ProxyAmplify(proxy_amplify::Args),
    /// The cache proxy's connection slots from one address, idle clients,
    /// a trickled 1 MiB line (its CPU against memcached's).
    ProxySlots(proxy_slots::Args),
    /// A member sends thousands of calls and never acknowledges the
    /// replies.
    Unacked(unacked::UnackedArgs),
    /// A member restarts (a new epoch) every couple of seconds, each time
    /// filling the server's one-way queue, which the server never reads.
    Epochs(epochs::EpochsArgs),
}

/// Runs one attack.
pub(crate) async fn run(a: &Attack) -> Result<()> {
    match a {
        Attack::Crowd(a) => crowd::run(a).await,
        Attack::MemberPaths(a) => member_paths::run(a).await,
        Attack::UdpFlood(a) => udp_flood::run(a).await,
        Attack::ProxyAmplify(a) => proxy_amplify::run(a).await,
        Attack::ProxySlots(a) => proxy_slots::run(a).await,
        Attack::Unacked(a) => unacked::run(a).await,
        Attack::Epochs(a) => epochs::run(a).await,
    }
}

/// The `surelink` binary: `given`, or the one next to this executable
/// (`cargo build` puts both in the same directory).
pub(crate) fn surelink_bin(given: Option<&Path>) -> Result<PathBuf> {
    let bin = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("locating surelink-lab")?
            .with_file_name("surelink"),
    };
    if !bin.exists() {
        bail!(
            "{} does not exist (build it: cargo build --release -p surelink-cli, or give --surelink-bin)",
            bin.display()
        );
    }
    Ok(bin)
}

/// A process's resident memory, KiB (`VmRSS` in /proc/PID/status; 0 if gone).
pub(crate) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A process's CPU time so far (user + system), seconds (0 if gone).
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces and parentheses).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // After ')': utime is index 11, stime 12, in USER_HZ (100/s) ticks.
    (tick(11) + tick(12)) as f64 / 100.0
}
