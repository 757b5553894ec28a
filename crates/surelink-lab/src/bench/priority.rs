//! `surelink-lab bench --only priority`: does a high-priority call get through
//! a saturated server?
//!
//! Two surelink pairs in one process, identical but for the server's
//! dispatch: hr-net's priority queues (the default) and one plain FIFO
//! queue (`SchedulerKind::Fifo`). Each server runs one request at a
//! time, and each request costs `WORK` of CPU, so 32 normal callers
//! calling back to back keep a queue at the server. One more caller makes
//! high-priority calls at about 1 % of the server's rate. Rounds alternate
//! between the pairs. Reported: high and normal p50/p99, normal calls per
//! second, and the two ratios the issue sets targets for — high p99 with
//! priorities / high p99 in FIFO (target ≤ 0.2) and the normal throughput
//! change (target: drop ≤ 3 %).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;
use surelink::{CallOptions, Config, Endpoint, Priority, Request, SchedulerKind};

use super::report::new_histogram;
use super::threaded_pair::{Pair, SERVER};
use super::Plan;
/// CPU time one request costs the server.
const WORK: Duration = Duration::from_micros(1000);
/// Normal callers, back to back.
const NORMAL_CALLERS: usize = 32;
/// The high-priority caller waits this long between calls (about 1 % of
/// the server's rate of one request per `WORK`).
const HIGH_EVERY: Duration = Duration::from_micros(100_000);

/// Burns `d` of CPU (the request's work).
fn spin(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

async fn pair(fifo: bool) -> Result<Pair> {
    Pair::start("priority-bench", move |mut cfg: Config| async move {
        cfg.max_concurrent_requests = 1;
        if fifo {
            cfg.scheduler.kind = SchedulerKind::Fifo;
        }
        let server = Endpoint::bind(cfg).await.context("priority bench server")?;
        server.serve(|r: Request| async move {
            spin(WORK);
            r.body
        });
        Ok(server)
    })
    .await
}

#[derive(Serialize, Clone, Copy, Default)]
struct RoundResult {
    normal_calls_per_s: f64,
    normal_p50_us: f64,
    normal_p99_us: f64,
    high_calls: u64,
    high_p50_us: f64,
    high_p99_us: f64,
    errors: u64,
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

async fn caller(
    ep: Endpoint,
    priority: Priority,
    pause: Option<Duration>,
    record_from: Instant,
    until: Instant,
) -> Result<(Histogram<u64>, u64, u64)> {
    let mut hist = new_histogram()?;
    let (mut calls, mut errors) = (0u64, 0u64);
    let opts = CallOptions::new(Duration::from_secs(10)).with_priority(priority);
    let body = Bytes::from_static(&[7u8; 64]);
    while Instant::now() < until {
        let start = Instant::now();
        match ep.call_with(SERVER, 0, body.clone(), &opts).await {
            Ok(_) if start >= record_from => {
                hist.saturating_record(
                    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
                );
                calls += 1;
            }
            Ok(_) => {}
            Err(_) => errors += 1,
        }
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
    }
    Ok((hist, calls, errors))
}

async fn round(p: &Pair, plan: &Plan, high_all: &mut Histogram<u64>) -> Result<RoundResult> {
    let record_from = Instant::now() + plan.warmup;
    let until = record_from + plan.measure;
    let mut tasks = Vec::new();
    for _ in 0..NORMAL_CALLERS {
        tasks.push(tokio::spawn(caller(
            p.client.clone(),
            Priority::Normal,
            None,
            record_from,
            until,
        )));
    }
    let high = tokio::spawn(caller(
        p.client.clone(),
        Priority::High,
        Some(HIGH_EVERY),
        record_from,
        until,
    ));
    let mut normal = new_histogram()?;
    let (mut normal_calls, mut errors) = (0u64, 0u64);
    for t in tasks {
        let (h, c, e) = t.await.context("normal caller")??;
        normal.add(&h).context("merging histograms")?;
        normal_calls += c;
        errors += e;
    }
    let (hh, hc, he) = high.await.context("high caller")??;
    high_all.add(&hh).context("merging histograms")?;
    Ok(RoundResult {
        normal_calls_per_s: normal_calls as f64 / plan.measure.as_secs_f64(),
        normal_p50_us: us(&normal, 0.5),
        normal_p99_us: us(&normal, 0.99),
        high_calls: hc,
        high_p50_us: us(&hh, 0.5),
        high_p99_us: us(&hh, 0.99),
        errors: errors + he,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The whole priority measurement.
#[derive(Serialize)]
pub(super) struct PriorityReport {
    work_us: u64,
    normal_callers: usize,
    high_every_us: u64,
    priority_rounds: Vec<RoundResult>,
    fifo_rounds: Vec<RoundResult>,
    /// High-priority calls of all rounds together: p50 and p99 (µs) with
    /// priorities and in FIFO.
    high_all_rounds: [(u64, f64, f64); 2],
    /// High p99 with priorities / in FIFO, all rounds together.
    high_p99_ratio: f64,
    /// 1 - normal calls/s with priorities / in FIFO, percent.
    normal_throughput_drop_pct: f64,
}

/// Runs it and prints the table.
pub(super) async fn run(plan: &Plan) -> Result<PriorityReport> {
    let prio = pair(false).await?;
    let fifo = pair(true).await?;
    let mut rounds: [Vec<RoundResult>; 2] = [Vec::new(), Vec::new()];
    // All high calls of all rounds, per mode: 1 % of the traffic gives few
    // samples per round, so the p99 is taken over the rounds together.
    let mut high_all = [new_histogram()?, new_histogram()?];
    let total = plan.rounds * 2;
    let mut step = 0;
    for r in 0..plan.rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for who in order {
            step += 1;
            let name = if who == 0 { "priorities" } else { "FIFO" };
            eprint!(
                "[{step}/{total}] saturated server, {name}, round {}/{} ... ",
                r + 1,
                plan.rounds
            );
            let p = if who == 0 { &prio } else { &fifo };
            let res = round(p, plan, &mut high_all[who]).await?;
            eprintln!(
                "normal {:.0} calls/s p99 {:.0} µs; high p50 {:.0} µs p99 {:.0} µs ({} calls){}",
                res.normal_calls_per_s,
                res.normal_p99_us,
                res.high_p50_us,
                res.high_p99_us,
                res.high_calls,
                if res.errors > 0 {
                    format!(", {} ERRORS", res.errors)
                } else {
                    String::new()
                }
            );
            rounds[who].push(res);
        }
    }
    tokio::join!(prio.shutdown(), fifo.shutdown());
    let [pr, ff] = rounds;
    let m = |v: &[RoundResult], f: fn(&RoundResult) -> f64| median(v.iter().map(f).collect());
    let report = PriorityReport {
        work_us: u64::try_from(WORK.as_micros()).unwrap_or(0),
        normal_callers: NORMAL_CALLERS,
        high_every_us: u64::try_from(HIGH_EVERY.as_micros()).unwrap_or(0),
        high_all_rounds: [
            (
                high_all[0].len(),
                us(&high_all[0], 0.5),
                us(&high_all[0], 0.99),
            ),
            (
                high_all[1].len(),
                us(&high_all[1], 0.5),
                us(&high_all[1], 0.99),
            ),
        ],
        high_p99_ratio: us(&high_all[0], 0.99) / us(&high_all[1], 0.99),
        normal_throughput_drop_pct: (1.0
            - m(&pr, |r| r.normal_calls_per_s) / m(&ff, |r| r.normal_calls_per_s))
            * 100.0,
        priority_rounds: pr,
        fifo_rounds: ff,
    };
    println!();
    println!(
        "Priority under saturation: 1 worker, {} µs per request, {NORMAL_CALLERS} normal callers, one high call every {} µs; medians of {} rounds",
        report.work_us, report.high_every_us, plan.rounds
    );
    println!(
        "{:<12} | {:>14} {:>12} {:>12} | {:>12} {:>12}",
        "dispatch", "normal calls/s", "normal p50", "normal p99", "high p50", "high p99"
    );
    println!("{}", "-".repeat(84));
    for (name, v) in [
        ("priorities", &report.priority_rounds),
        ("FIFO", &report.fifo_rounds),
    ] {
        println!(
            "{:<12} | {:>14.0} {:>10.0}µs {:>10.0}µs | {:>10.0}µs {:>10.0}µs",
            name,
            m(v, |r| r.normal_calls_per_s),
            m(v, |r| r.normal_p50_us),
            m(v, |r| r.normal_p99_us),
            m(v, |r| r.high_p50_us),
            m(v, |r| r.high_p99_us)
        );
    }
    let [(np, p50p, p99p), (nf, p50f, p99f)] = report.high_all_rounds;
    println!(
        "high calls, all rounds: priorities {np} calls p50 {p50p:.0} µs p99 {p99p:.0} µs; FIFO {nf} calls p50 {p50f:.0} µs p99 {p99f:.0} µs"
    );
    println!(
        "high p99 with priorities / FIFO: {:.3} (target <= 0.2); normal throughput drop: {:.2} % (target <= 3 %)",
        report.high_p99_ratio, report.normal_throughput_drop_pct
    );
    Ok(report)
}
