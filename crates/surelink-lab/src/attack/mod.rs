//! `surelink-lab attack …`: the attacks of the hardening issue (the
//! 2026-11-26 attack run), each against a target it starts itself from
//! `--surelink-bin` (default: the `surelink` next to this binary), so one
//! tool measures an old build and a new one. Each reports legitimate
//! traffic during the attack and the target's memory before, during and
//! after, and writes a JSON result.

mod crowd;
mod echo_target;
mod member_paths;
mod proxy_amplify;
mod proxy_cluster;
mod proxy_slots;
pub(crate) mod udp_flood;

use std::path::PathBuf;

use anyhow::{Context, Result};
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
}

/// Runs one attack.
pub(crate) async fn run(a: &Attack) -> Result<()> {
    match a {
        Attack::Crowd(a) => crowd::run(a).await,
        Attack::MemberPaths(a) => member_paths::run(a).await,
        Attack::UdpFlood(a) => udp_flood::run(a).await,
        Attack::ProxyAmplify(a) => proxy_amplify::run(a).await,
        Attack::ProxySlots(a) => proxy_slots::run(a).await,
    }
}

/// The `surelink` binary: `given`, or the one next to this executable.
pub(crate) fn surelink_bin(given: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().context("locating surelink-lab")?;
    Ok(me.with_file_name("surelink"))
}

/// A process's resident memory (`VmRSS`), KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A process's CPU time so far (user + system), seconds.
pub(crate) fn cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at state.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(ticks as f64 / 100.0)
}
