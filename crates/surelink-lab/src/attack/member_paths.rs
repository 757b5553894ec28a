//! `surelink-lab attack member-paths`: a member opens ~1 000 real paths
//! into its one session (the library dialling the target's one address as
//! `--sources` "networks", `--per-source` connections each, from
//! 127.0.4.x), while another member calls throughout and, midway, a third
//! member connects for the first time and calls. Reports the callers'
//! calls (answered/total, p50, p99), whether the newcomer got in and how
//! fast, the target's connections held and its memory before, during and
//! after; writes a JSON result.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use surelink::proto::NodeId;

use super::echo_target::{call_once, Caller, Calls, MemberSpec, Rss, Target, SERVER};

const CALLER: NodeId = NodeId(2);
const GREEDY: NodeId = NodeId(3);
const NEWCOMER: NodeId = NodeId(4);
const CALLER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 2);
const NEWCOMER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 4);

/// `attack member-paths`.
#[derive(Args, Debug, Clone)]
pub(crate) struct MemberPathsArgs {
    /// The `surelink` binary to attack (default: the one next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// Source addresses the greedy member dials from (one "network" each).
    #[arg(long, default_value_t = 16)]
    sources: u8,
    /// Connections per source (at most 64).
    #[arg(long, default_value_t = 64)]
    per_source: usize,
    /// Seconds the attack lasts.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// The JSON result.
    #[arg(long, default_value = "attack-member-paths.json")]
    out: PathBuf,
}

#[derive(serde::Serialize)]
struct Report {
    target: String,
    command: String,
    greedy_wants: usize,
    greedy_held_max: usize,
    seconds: u64,
    caller: super::echo_target::CallSummary,
    newcomer_connected: bool,
    newcomer_connect_ms: Option<u64>,
    newcomer: super::echo_target::CallSummary,
    rss: Rss,
    target_counters: Vec<(String, f64)>,
}

/// Runs the attack.
pub(crate) async fn run(a: &MemberPathsArgs) -> Result<()> {
    let bin = super::surelink_bin(a.surelink_bin.as_deref())?;
    let target = Target::start(
        &bin,
        "attack-member-paths",
        &[
            MemberSpec {
                node: CALLER,
                listed: Some(CALLER_IP),
            },
            MemberSpec {
                node: GREEDY,
                listed: None,
            },
            MemberSpec {
                node: NEWCOMER,
                listed: Some(NEWCOMER_IP),
            },
        ],
    )
    .await?;
    let caller = target.warm_member(CALLER, CALLER_IP).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut rss = Rss {
        before_mib: Rss::mib(target.rss_kib()),
        ..Rss::default()
    };
    let wants = usize::from(a.sources) * a.per_source;
    println!(
        "target {} (RSS {:.1} MiB); member {GREEDY} opens {wants} paths from {} addresses",
        bin.display(),
        rss.before_mib,
        a.sources
    );
    let calling = Caller::start(&caller);
    let calls = calling.calls.clone();
    let sources: Vec<Ipv4Addr> = (0..a.sources)
        .map(|i| Ipv4Addr::new(127, 0, 4, 1 + i))
        .collect();
    let greedy = target
        .member(GREEDY, &sources, a.per_source.min(64))
        .await?;
    let start = Instant::now();
    let mut held_max = 0;
    let mut newcomer = None;
    let mut newcomer_calls = Calls::default();
    let mut connect_ms = None;
    let mut last_print = start;
    while start.elapsed() < Duration::from_secs(a.seconds) {
        target.check()?;
        rss.during_max_mib = rss.during_max_mib.max(Rss::mib(target.rss_kib()));
        let open = open_connections(&target).await;
        held_max = held_max.max(open);
        if newcomer.is_none() && start.elapsed() >= Duration::from_secs(a.seconds / 2) {
            let t = Instant::now();
            let ep = target.member(NEWCOMER, &[NEWCOMER_IP], 1).await?;
            if ep.wait_for_paths(SERVER, 1, Duration::from_secs(5)).await {
                connect_ms = Some(t.elapsed().as_millis() as u64);
            }
            for i in 0..20 {
                newcomer_calls.record(call_once(&ep, i).await);
            }
            newcomer = Some(ep);
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            let c = calls.lock();
            println!(
                "  t={:>3}s caller {}/{} answered; target holds {open} accepted connections; RSS {:.1} MiB",
                start.elapsed().as_secs(),
                c.answered,
                c.total,
                Rss::mib(target.rss_kib())
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    calling.stop().await;
    let counters = target.connection_counters().await;
    greedy.shutdown().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rss.after_mib = Rss::mib(target.rss_kib());
    let summary = calls.lock().summary();
    let nc = newcomer_calls.summary();
    println!(
        "caller answered {}/{} ({:.2} %), p50 {} µs, p99 {} µs; newcomer connected: {} ({connect_ms:?} ms), its calls {}/{}; target held at most {held_max} accepted connections; RSS {:.1} / {:.1} / {:.1} MiB (before / max during / after)",
        summary.answered,
        summary.total,
        summary.answered_pct,
        summary.p50_us,
        summary.p99_us,
        connect_ms.is_some(),
        nc.answered,
        nc.total,
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
        greedy_wants: wants,
        greedy_held_max: held_max,
        seconds: a.seconds,
        caller: summary,
        newcomer_connected: connect_ms.is_some(),
        newcomer_connect_ms: connect_ms,
        newcomer: nc,
        rss,
        target_counters: counters,
    };
    std::fs::write(&a.out, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", a.out.display());
    if let Some(ep) = newcomer {
        ep.shutdown().await;
    }
    caller.shutdown().await;
    Ok(())
}

/// The target's accepted connections open now (its gauge).
async fn open_connections(t: &Target) -> usize {
    t.connection_counters()
        .await
        .iter()
        .find(|(k, _)| k == "surelink_connections_open")
        .map_or(0, |(_, v)| *v as usize)
}
