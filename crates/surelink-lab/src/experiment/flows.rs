//! `surelink-lab experiment flows` (SQR's flow-completion figure): a client
//! sends request flows of 1–100 KiB (sizes log-uniform, the same sequence
//! for every contender) every 5 ms and the server answers each with 64
//! bytes; the flow completes when the answer arrives. Each contender runs
//! twice per repetition: once undisturbed, once with network 1 going down
//! at t = 2 s for 3 s. Reported: flow completion time p50 / p99 / max
//! (pooled over the repetitions) and flows left unfinished, with and
//! without the failure; a PNG of every flow's completion time in the
//! failure runs. Needs root (see `surelink-lab testbed`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use super::contenders::{run_once, Bed, Contender, Load, Timing, Trace};
use super::procs::t;
use crate::testbed::Fault;

/// Arguments of `surelink-lab experiment flows`.
#[derive(Args, Debug, Clone)]
pub(crate) struct FlowsArgs {
    /// Directory for flows.json and the plot.
    #[arg(long, default_value = "results/flows")]
    out: PathBuf,
    /// Repetitions per contender and case (completion times are pooled).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// One contender's figures in one case.
#[derive(Clone, Debug, Serialize)]
struct Cell {
    contender: Contender,
    failure: bool,
    flows: usize,
    unfinished: usize,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
}

/// Completion times (ms) of the flows in a run, each with its start (ms
/// from the fault), and how many started flows never completed.
fn fcts(tr: &Trace) -> (Vec<(f64, f64)>, usize) {
    let mut done = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for v in tr.client.iter().filter(|v| v["ev"] == "reply") {
        let sent = v["sent"].as_u64().unwrap_or(0);
        ids.insert(v["id"].as_u64().unwrap_or(0));
        done.push((
            (sent as f64 - tr.f0 as f64) / 1e3,
            t(v).saturating_sub(sent) as f64 / 1e3,
        ));
    }
    // Flows started more than a second before the end must have finished
    // (ids are issued in order; the highest answered id bounds them).
    let cutoff = tr.end.saturating_sub(1_000_000);
    let top = tr
        .client
        .iter()
        .filter(|v| v["ev"] == "reply" && v["sent"].as_u64().is_some_and(|s| s <= cutoff))
        .filter_map(|v| v["id"].as_u64())
        .max();
    let issued_by_cutoff = top.map_or(0, |m| m + 1);
    let unfinished = (0..issued_by_cutoff).filter(|i| !ids.contains(i)).count();
    (done, unfinished)
}

fn pct(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

fn ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1}"))
}

/// Runs the experiment.
pub(crate) async fn run(args: &FlowsArgs) -> Result<()> {
    let _bed = Bed::up("flows", &args.out, true)?;
    let load = Load {
        calls_ms: 5,
        call_bytes: "1024-102400".into(),
    };
    let timing = Timing {
        before: Duration::from_secs(2),
        fault: Duration::from_secs(3),
        after: Duration::from_secs(3),
    };
    let runs = args.runs.max(1);
    let total = Contender::ALL.len() * 2 * runs;
    let mut step = 0;
    let mut cells = Vec::new();
    let mut lanes = Vec::new();
    for c in Contender::ALL {
        for failure in [false, true] {
            let mut all = Vec::new();
            let mut unfinished = 0;
            let mut shown = Vec::new();
            for r in 0..runs {
                step += 1;
                eprint!(
                    "[{step}/{total}] {}, {}, run {}/{runs} ... ",
                    c.name(),
                    if failure { "link 1 down" } else { "no failure" },
                    r + 1
                );
                let port = 7800 + u16::try_from(step).unwrap_or(0);
                let fault = failure.then_some(Fault::LinkDown);
                let tr = run_once(fault, c, port, &load, timing).await?;
                let (points, left) = fcts(&tr);
                let mut v: Vec<f64> = points.iter().map(|p| p.1).collect();
                v.sort_by(f64::total_cmp);
                eprintln!(
                    "{} flows, p99 {} ms, max {} ms, unfinished {left}",
                    v.len(),
                    ms(pct(&v, 0.99)),
                    ms(v.last().copied())
                );
                all.extend(v);
                unfinished += left;
                if r == 0 {
                    shown = points;
                }
            }
            all.sort_by(f64::total_cmp);
            cells.push(Cell {
                contender: c,
                failure,
                flows: all.len(),
                unfinished,
                p50_ms: pct(&all, 0.5),
                p99_ms: pct(&all, 0.99),
                max_ms: all.last().copied(),
            });
            if failure {
                lanes.push(super::plot::LatencyLane {
                    title: format!(
                        "{} — {runs} run(s) pooled: p99 {} ms, max {} ms, unfinished {unfinished}",
                        c.name(),
                        ms(pct(&all, 0.99)),
                        ms(all.last().copied())
                    ),
                    points: shown,
                });
            }
        }
    }
    println!();
    println!(
        "Flows of 1–100 KiB every 5 ms; link 1 down for 3 s at t = 2 s in the failure runs; {runs} run(s) pooled"
    );
    println!(
        "{:<30} | {:>26} | {:>26} | {:>10}",
        "contender", "no failure p50/p99/max ms", "failure p50/p99/max ms", "unfinished"
    );
    println!("{}", "-".repeat(102));
    for c in Contender::ALL {
        let get = |f: bool| cells.iter().find(|x| x.contender == c && x.failure == f);
        let (Some(a), Some(b)) = (get(false), get(true)) else {
            continue;
        };
        println!(
            "{:<30} | {:>26} | {:>26} | {:>10}",
            c.name(),
            format!("{} / {} / {}", ms(a.p50_ms), ms(a.p99_ms), ms(a.max_ms)),
            format!("{} / {} / {}", ms(b.p50_ms), ms(b.p99_ms), ms(b.max_ms)),
            format!("{} / {}", a.unfinished, b.unfinished),
        );
    }
    let json = args.out.join("flows.json");
    std::fs::write(&json, serde_json::to_string_pretty(&cells)?)?;
    println!("wrote {}", json.display());
    let png = args.out.join("flows-linkdown.png");
    let title =
        "Flows of 1–100 KiB, link 1 down (shaded, 3 s): completion time of every flow in the first run";
    match super::plot::latency_timeline(&png, title, &lanes, (0.0, 3000.0)) {
        Ok(()) => println!("wrote {}", png.display()),
        Err(e) => eprintln!("plot {}: {e:#}", png.display()),
    }
    Ok(())
}
