//! `surelink-lab attack crowd`: strangers hold idle connections (no
//! handshake bytes, refilled as the target closes them) from several
//! source addresses while a member calls, its connections cut every few
//! seconds so it must re-dial through the crowd. Reports the member's
//! calls (answered/total, p50, p99), its re-dials (recovered/total, time),
//! the target's memory before, during and after, and its connection
//! counters; writes a JSON result.
//!
//! On loopback every 127.x.y.z is a distinct source address: the crowd
//! uses 127.0.(100 + p).(1 + a) for `--prefixes` p and `--per-prefix` a;
//! the member dials from 127.0.1.2, listed as the target's peer.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use surelink::proto::NodeId;
use tokio::io::AsyncReadExt;
use tokio::net::TcpSocket;

use super::echo_target::{Caller, MemberSpec, Rss, Target, SERVER};

const MEMBER: NodeId = NodeId(2);
const MEMBER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 2);

/// `attack crowd`.
#[derive(Args, Debug, Clone)]
pub(crate) struct CrowdArgs {
    /// The `surelink` binary to attack (default: the one next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// Idle connections the crowd keeps open (spread over its addresses).
    #[arg(long, default_value_t = 512)]
    connections: usize,
    /// /24 prefixes the crowd comes from.
    #[arg(long, default_value_t = 1)]
    prefixes: u8,
    /// Source addresses per prefix.
    #[arg(long, default_value_t = 3)]
    per_prefix: u8,
    /// Seconds the attack lasts (after the crowd is in place).
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds between cuts of the member's connections.
    #[arg(long, default_value_t = 5)]
    cut_every: u64,
    /// The JSON result.
    #[arg(long, default_value = "attack-crowd.json")]
    out: PathBuf,
}

#[derive(serde::Serialize)]
struct Report {
    target: String,
    command: String,
    crowd_connections: usize,
    crowd_sources: usize,
    crowd_prefixes: u8,
    crowd_held_max: usize,
    seconds: u64,
    calls: super::echo_target::CallSummary,
    redials: usize,
    redials_recovered: usize,
    redial_ms: Vec<u64>,
    rss: Rss,
    target_counters: Vec<(String, f64)>,
}

/// Runs the attack.
pub(crate) async fn run(a: &CrowdArgs) -> Result<()> {
    let bin = super::surelink_bin(a.surelink_bin.as_deref())?;
    let target = Target::start(
        &bin,
        "attack-crowd",
        &[MemberSpec {
            node: MEMBER,
            listed: Some(MEMBER_IP),
        }],
    )
    .await?;
    let member = target.warm_member(MEMBER, MEMBER_IP).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut rss = Rss {
        before_mib: Rss::mib(target.rss_kib()),
        ..Rss::default()
    };
    println!(
        "target {} (pid RSS {:.1} MiB); crowd: {} idle connections from {} addresses in {} /24s",
        bin.display(),
        rss.before_mib,
        a.connections,
        usize::from(a.prefixes) * usize::from(a.per_prefix),
        a.prefixes
    );
    let (held, tasks) = crowd(target.listen, a);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let caller = Caller::start(&member);
    let calls = caller.calls.clone();
    let start = Instant::now();
    let mut next_cut = start + Duration::from_secs(a.cut_every);
    let (mut redials, mut recovered, mut redial_ms) = (0, 0, Vec::new());
    let mut held_max = 0;
    let mut last_print = start;
    while start.elapsed() < Duration::from_secs(a.seconds) {
        target.check()?;
        rss.during_max_mib = rss.during_max_mib.max(Rss::mib(target.rss_kib()));
        held_max = held_max.max(held.load(Ordering::Relaxed));
        if Instant::now() >= next_cut {
            redials += 1;
            let t = Instant::now();
            member.testing().kill_network(0);
            // The kill is seen at once; wait for a new path (10 s at most).
            tokio::time::sleep(Duration::from_millis(20)).await;
            if member
                .wait_for_paths(SERVER, 1, Duration::from_secs(10))
                .await
            {
                recovered += 1;
                redial_ms.push(t.elapsed().as_millis() as u64);
            }
            next_cut = Instant::now() + Duration::from_secs(a.cut_every);
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            let c = calls.lock();
            println!(
                "  t={:>3}s calls {}/{} answered, crowd holds {}, re-dials {recovered}/{redials}, target RSS {:.1} MiB",
                start.elapsed().as_secs(),
                c.answered,
                c.total,
                held.load(Ordering::Relaxed),
                Rss::mib(target.rss_kib())
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    caller.stop().await;
    let counters = target.connection_counters().await;
    for t in tasks {
        t.abort();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    rss.after_mib = Rss::mib(target.rss_kib());
    let summary = calls.lock().summary();
    println!(
        "calls answered {}/{} ({:.2} %), p50 {} µs, p99 {} µs; re-dials recovered {recovered}/{redials} (ms: {redial_ms:?}); crowd held at most {held_max}; target RSS {:.1} / {:.1} / {:.1} MiB (before / max during / after)",
        summary.answered,
        summary.total,
        summary.answered_pct,
        summary.p50_us,
        summary.p99_us,
        rss.before_mib,
        rss.during_max_mib,
        rss.after_mib
    );
    for (k, v) in &counters {
        println!("  {k} {v}");
    }
    let report = Report {
        target: bin.display().to_string(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        crowd_connections: a.connections,
        crowd_sources: usize::from(a.prefixes) * usize::from(a.per_prefix),
        crowd_prefixes: a.prefixes,
        crowd_held_max: held_max,
        seconds: a.seconds,
        calls: summary,
        redials,
        redials_recovered: recovered,
        redial_ms,
        rss,
        target_counters: counters,
    };
    std::fs::write(&a.out, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", a.out.display());
    member.shutdown().await;
    Ok(())
}

/// The crowd: `a.connections` idle connections spread over its source
/// addresses, each refilled when the target closes it. Returns a gauge of
/// those open and the tasks (abort them to stop).
fn crowd(to: SocketAddr, a: &CrowdArgs) -> (Arc<AtomicUsize>, Vec<tokio::task::JoinHandle<()>>) {
    let held = Arc::new(AtomicUsize::new(0));
    let sources: Vec<Ipv4Addr> = (0..a.prefixes)
        .flat_map(|p| (0..a.per_prefix).map(move |i| Ipv4Addr::new(127, 0, 100 + p, 1 + i)))
        .collect();
    let tasks = (0..a.connections)
        .map(|i| {
            let ip = sources[i % sources.len()];
            let held = held.clone();
            tokio::spawn(async move {
                loop {
                    let s = TcpSocket::new_v4().and_then(|s| {
                        s.bind(SocketAddr::new(IpAddr::V4(ip), 0))?;
                        Ok(s)
                    });
                    let Ok(s) = s else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let Ok(mut s) = s.connect(to).await else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    held.fetch_add(1, Ordering::Relaxed);
                    let mut b = [0u8; 64];
                    while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
                    held.fetch_sub(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    (held, tasks)
}
