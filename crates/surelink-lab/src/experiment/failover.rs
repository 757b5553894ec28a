//! `surelink-lab experiment failover`: a client streaming requests (64 B, one
//! per millisecond) to a server in another network namespace; at 2 s a
//! fault hits network 1 for 3 s. Contenders, same script: surelink (two
//! paths, heartbeats every 10 ms and 100 ms), plain TCP over network 1, and
//! Linux MPTCP with a second subflow on network 2. Per run: the longest gap
//! between replies (the failover time), requests lost, duplicated (replied
//! or executed twice) and reordered (reaching the server after a later
//! one), replies that answer the wrong request, the p99 and the maximum
//! latency of requests sent during the fault, and a PNG per fault with
//! every request's latency. Needs root (see `surelink-lab testbed`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use super::contenders::{run_once, Bed, Contender, Load, Timing};
use super::procs::t;
use crate::testbed::Fault;

/// Arguments of `surelink-lab experiment failover`.
#[derive(Args, Debug, Clone)]
pub(crate) struct FailoverArgs {
    /// Directory for failover.json.
    #[arg(long, default_value = "results/failover")]
    out: PathBuf,
    /// Runs per cell (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// One run per cell.
    #[arg(long)]
    quick: bool,
}

const FAULTS: [Fault; 6] = [
    Fault::LinkDown,
    Fault::OneWay,
    Fault::BothWays,
    Fault::Kill,
    Fault::Loss,
    Fault::TcpOnly,
];

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
struct Run {
    fault: Fault,
    contender: Contender,
    /// Longest time without a reply from 1 s before the fault to the end, ms.
    longest_gap_ms: f64,
    /// Replies stopped for good (the end of the run was reached without one).
    never_recovered: bool,
    replies: usize,
    lost: usize,
    duplicated: usize,
    /// Replies that answered another request (echo of another id).
    wrong: usize,
    /// Calls that failed with a typed error (the application was told;
    /// counted in `lost` too), and the first error.
    call_errors: usize,
    first_error: Option<String>,
    /// Replies that came after the reply to a later request (request ids
    /// are issued in sending order).
    reordered: usize,
    /// p99 latency of requests sent during the fault, ms.
    p99_fault_ms: Option<f64>,
    /// The slowest request sent during the fault, ms: how long a request
    /// caught on the failing link waited (the per-request failover time;
    /// the reply gap can stay small while some requests wait, because
    /// requests spread over both paths).
    max_fault_ms: Option<f64>,
    /// Every answered request: (sent, ms since the fault began; latency,
    /// ms) — drawn, not written to the JSON.
    #[serde(skip)]
    points: Vec<(f64, f64)>,
}

fn fault_file(f: Fault) -> String {
    format!("{f:?}").to_lowercase()
}

fn evaluate(
    fault: Fault,
    c: Contender,
    events: &[Value],
    server_events: &[Value],
    (f0, f1, end): (u64, u64, u64),
) -> Run {
    let mut times = Vec::new();
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    let mut wrong = 0;
    let mut lat = Vec::new();
    let mut points = Vec::new();
    let mut reordered = 0;
    let mut top_id = None;
    for v in events.iter().filter(|v| v["ev"] == "reply") {
        let id = v["id"].as_u64().unwrap_or(0);
        let at = t(v);
        *seen.entry(id).or_default() += 1;
        if v["echo"].as_u64() != Some(id) {
            wrong += 1;
        }
        if top_id.is_some_and(|m| id < m) {
            reordered += 1;
        }
        top_id = top_id.max(Some(id));
        times.push(at);
        let sent = v["sent"].as_u64().unwrap_or(0);
        points.push((
            (sent as f64 - f0 as f64) / 1e3,
            at.saturating_sub(sent) as f64 / 1e3,
        ));
        if sent >= f0 && sent <= f1 {
            lat.push(at.saturating_sub(sent) as f64 / 1e3);
        }
    }
    times.sort_unstable();
    let from = f0.saturating_sub(1_000_000);
    let mut last = from;
    let mut gap = 0u64;
    for &x in times.iter().filter(|&&x| x >= from && x <= end) {
        gap = gap.max(x.saturating_sub(last));
        last = x;
    }
    let never_recovered = last < f1;
    gap = gap.max(end.saturating_sub(last));
    // Requests still in flight when the run stopped are not lost: judge
    // only those sent half a second or more before the end.
    let top = events
        .iter()
        .filter(|v| v["ev"] == "reply" && v["sent"].as_u64().is_some_and(|s| s + 500_000 <= end))
        .filter_map(|v| v["id"].as_u64())
        .max()
        .unwrap_or(0);
    let lost = (0..=top).filter(|id| !seen.contains_key(id)).count();
    // Calls failed before the end (at the end, the client's shutdown fails
    // what is still in flight with "endpoint closed").
    let errors: Vec<&Value> = events
        .iter()
        .filter(|v| v["ev"] == "call_error" && t(v) <= end)
        .collect();
    let mut duplicated = seen.values().filter(|n| **n > 1).count();
    // The surelink receiver counts what it executed: requests run twice,
    // and requests that arrived after a later one (the client issues them
    // in id order). A TCP byte stream is echoed in order, so the replies'
    // order is the arrival order.
    if let Some(o) = server_events.iter().find(|v| v["ev"] == "server_order") {
        let n = |k: &str| usize::try_from(o[k].as_u64().unwrap_or(0)).unwrap_or(usize::MAX);
        duplicated = duplicated.max(n("duplicated"));
        reordered = n("reordered");
    }
    lat.sort_by(f64::total_cmp);
    Run {
        fault,
        contender: c,
        longest_gap_ms: gap as f64 / 1e3,
        never_recovered,
        replies: times.len(),
        lost,
        duplicated,
        wrong,
        call_errors: errors.len(),
        first_error: errors.first().map(|v| v["error"].to_string()),
        reordered,
        p99_fault_ms: (!lat.is_empty()).then(|| lat[(lat.len() * 99 / 100).min(lat.len() - 1)]),
        max_fault_ms: lat.last().copied(),
        points,
    }
}

/// Runs the experiment.
pub(crate) async fn run(args: &FailoverArgs) -> Result<()> {
    let _bed = Bed::up("failover", &args.out, true)?;
    let runs = if args.quick { 1 } else { args.runs.max(1) };
    let load = Load {
        calls_ms: 1,
        call_bytes: "64".into(),
    };
    let timing = Timing {
        before: Duration::from_secs(2),
        fault: Duration::from_secs(3),
        after: Duration::from_secs(3),
    };
    let mut step = 0;
    let mut all = Vec::new();
    // SURELINK_FAILOVER_ONLY=LinkDown keeps the faults whose name contains
    // it (debugging one cell).
    let only = std::env::var("SURELINK_FAILOVER_ONLY").unwrap_or_default();
    let faults: Vec<Fault> = FAULTS
        .into_iter()
        .filter(|f| format!("{f:?}").contains(&only))
        .collect();
    let total = faults.len() * Contender::ALL.len() * runs;
    for &fault in &faults {
        for c in Contender::ALL {
            for r in 0..runs {
                step += 1;
                eprint!(
                    "[{step}/{total}] {fault:?}, {}, run {}/{runs} ... ",
                    c.name(),
                    r + 1
                );
                let port = 7500 + u16::try_from(step).unwrap_or(0);
                let tr = run_once(Some(fault), c, port, &load, timing).await?;
                let res = evaluate(fault, c, &tr.client, &tr.server, (tr.f0, tr.f1, tr.end));
                eprintln!(
                    "gap {:.0} ms{}, lost {} ({} call errors{}), dup {}, reordered {}, wrong {}",
                    res.longest_gap_ms,
                    if res.never_recovered {
                        " (never recovered)"
                    } else {
                        ""
                    },
                    res.lost,
                    res.call_errors,
                    res.first_error
                        .as_ref()
                        .map_or(String::new(), |e| format!(", first: {e}")),
                    res.duplicated,
                    res.reordered,
                    res.wrong
                );
                all.push(res);
            }
        }
    }
    println!();
    println!("Failover: 1 request/ms, 3 s fault on link 1 at t = 2 s; median of {runs} run(s)");
    println!(
        "{:<10} | {:<30} | {:>12} | {:>5} {:>5} {:>5} {:>5} | {:>12} {:>12}",
        "fault",
        "contender",
        "longest gap",
        "lost",
        "dup",
        "reord",
        "wrong",
        "p99 in fault",
        "max in fault"
    );
    println!("{}", "-".repeat(106));
    for &fault in &faults {
        let mut lanes = Vec::new();
        for c in Contender::ALL {
            let mut cell: Vec<&Run> = all
                .iter()
                .filter(|r| r.fault == fault && r.contender == c)
                .collect();
            cell.sort_by(|a, b| a.longest_gap_ms.total_cmp(&b.longest_gap_ms));
            let m = cell[cell.len() / 2];
            println!(
                "{:<10} | {:<30} | {:>9.0} ms{} | {:>5} {:>5} {:>5} {:>5} | {:>12} {:>12}",
                format!("{fault:?}"),
                c.name(),
                m.longest_gap_ms,
                if m.never_recovered { "*" } else { " " },
                m.lost,
                m.duplicated,
                m.reordered,
                m.wrong,
                m.p99_fault_ms.map_or("-".into(), |p| format!("{p:.1} ms")),
                m.max_fault_ms.map_or("-".into(), |p| format!("{p:.0} ms"))
            );
            lanes.push(super::plot::LatencyLane {
                title: format!(
                    "{} — longest reply gap {:.0} ms{}",
                    c.name(),
                    m.longest_gap_ms,
                    if m.never_recovered {
                        " (never recovered)"
                    } else {
                        ""
                    }
                ),
                points: m.points.clone(),
            });
        }
        let png = args.out.join(format!("failover-{}.png", fault_file(fault)));
        let title =
            format!("{fault:?} on link 1 (shaded, 3 s): latency of every request, median run");
        match super::plot::latency_timeline(&png, &title, &lanes, (0.0, 3000.0)) {
            Ok(()) => println!("wrote {}", png.display()),
            Err(e) => eprintln!("plot {}: {e:#}", png.display()),
        }
    }
    println!("* replies never resumed (the client does not reconnect)");
    let json = args.out.join("failover.json");
    std::fs::write(&json, serde_json::to_string_pretty(&all)?)?;
    println!("wrote {}", json.display());
    Ok(())
}
