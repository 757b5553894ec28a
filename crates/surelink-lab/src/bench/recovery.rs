//! `surelink-lab bench --only recovery`: the paper's experiment (Seshadri
//! et al., FAST '08) with real handlers on the shell's worker pools.
//!
//! One server (its own runtime, two worker threads, so two pools) with
//! `WORKERS` handler slots and the simulator's 16 groups and workload
//! shares; requests name their group in their first byte and the service
//! routes them by it. A request's service is `SERVICE` of *waiting* (a
//! sleep: disk or backend I/O), so the two cores are not the limit; what
//! is simulated is the work, not the scheduling. `CALLERS` callers call
//! back to back, each request's group drawn by the shares.
//!
//! Bad path: a request of group 1 fails with the probability that makes
//! its `RECOVERY`-long recoveries 5 % of the aggregate execution time
//! (from the service time measured in a calibration round first: a 1 ms
//! sleep lasts about 2 on tokio's 1 ms timer; each round reports the
//! overhead it got), and
//! a request of group 1 that starts while that group recovers waits for
//! the recovery to end (it needs the state being rebuilt). Where the
//! recovery runs is each scheduler's own: the performance-oriented one
//! has no recovery machinery, so the failing handler recovers inline,
//! holding its worker; the recovery-conscious ones suspend the group and
//! run the recovery as its clean-up ([`Endpoint::on_recovery`]), holding
//! no worker.
//!
//! Reported per mapping and path: calls/s, mean and p99 response time,
//! and the p99 of the requests of the healthy groups (all but group 1);
//! medians of the rounds, the mappings and paths alternating.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use surelink::{CallError, Config, Endpoint, GroupConfig, GroupId, HandlerError, Mapping, Request};

use super::report::new_histogram;
use super::threaded_pair::{Pair, SERVER};
use super::Plan;

/// Handler slots of the server (the paper's 8 workers).
const WORKERS: usize = 8;
/// A request's service: waiting.
const SERVICE: Duration = Duration::from_millis(1);
/// One recovery.
const RECOVERY: Duration = Duration::from_millis(10);
/// Callers calling back to back.
const CALLERS: usize = 64;
/// The faulty group on the bad path.
const FAULTY: u8 = 1;
/// Share of the aggregate execution time recoveries take on the bad path.
const OVERHEAD: f64 = 0.05;
/// The simulator's workload shares (16 groups, three idle).
const SHARES: [f64; 16] = [
    0.20, 0.15, 0.12, 0.10, 0.08, 0.08, 0.06, 0.05, 0.04, 0.04, 0.03, 0.03, 0.02, 0.0, 0.0, 0.0,
];

const MAPPINGS: [(Mapping, &str); 4] = [
    (Mapping::PerformanceOriented, "performance-oriented"),
    (Mapping::Static, "static"),
    (Mapping::PartiallyDynamic, "partially dynamic"),
    (Mapping::Dynamic, "dynamic"),
];

/// The failure probability for `OVERHEAD` at a mean service of `service`.
fn fail_prob(service: Duration) -> f64 {
    (OVERHEAD * service.as_secs_f64() / (SHARES[usize::from(FAULTY)] * RECOVERY.as_secs_f64()))
        .min(1.0)
}

/// What the server's handlers share: whether the bad path is on, and
/// until when (ns since `origin`) the faulty group recovers.
struct Fault {
    bad: AtomicBool,
    /// The failure probability (f64 bits).
    prob: AtomicU64,
    /// Service time served, and requests served (the calibration).
    served_ns: AtomicU64,
    served: AtomicU64,
    /// Recoveries begun.
    recoveries: AtomicU64,
    rng: parking_lot::Mutex<rand_chacha::ChaCha8Rng>,
    origin: Instant,
    recovering_until: AtomicU64,
}

impl Fault {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Waits out a recovery in progress.
    async fn wait_recovery(&self) {
        let until = self.recovering_until.load(Ordering::Acquire);
        let now = self.now_ns();
        if until > now {
            tokio::time::sleep(Duration::from_nanos(until - now)).await;
        }
    }

    fn prob(&self) -> f64 {
        f64::from_bits(self.prob.load(Ordering::Relaxed))
    }

    fn start_recovery(&self) {
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        let until = self.now_ns() + u64::try_from(RECOVERY.as_nanos()).unwrap_or(0);
        self.recovering_until.fetch_max(until, Ordering::AcqRel);
    }
}

async fn server(mapping: Mapping, fault: Arc<Fault>) -> Result<Pair> {
    Pair::start("recovery-bench", move |mut cfg: Config| async move {
        cfg.max_concurrent_requests = WORKERS;
        cfg.executor.mapping = mapping;
        cfg.executor.groups = (0..SHARES.len())
            .map(|g| GroupConfig::new(format!("g{g}")))
            .collect();
        let server = Endpoint::bind(cfg).await.context("recovery bench server")?;
        server.route_requests(|r| GroupId(u16::from(r.body.first().copied().unwrap_or(0))));
        let inline = mapping == Mapping::PerformanceOriented;
        let f = fault.clone();
        server.serve(move |r: Request| {
            let f = f.clone();
            async move {
                let faulty = r.group == GroupId(u16::from(FAULTY));
                if faulty {
                    f.wait_recovery().await;
                }
                let t = Instant::now();
                tokio::time::sleep(SERVICE).await;
                let took = u64::try_from(t.elapsed().as_nanos()).unwrap_or(0);
                f.served_ns.fetch_add(took, Ordering::Relaxed);
                f.served.fetch_add(1, Ordering::Relaxed);
                let fails =
                    faulty && f.bad.load(Ordering::Relaxed) && f.rng.lock().random_bool(f.prob());
                if !fails {
                    return Ok(r.body);
                }
                if inline {
                    f.start_recovery();
                    tokio::time::sleep(RECOVERY).await;
                    return Err(HandlerError::new(1, "recovered inline"));
                }
                Err(HandlerError::fatal(1, "group fault"))
            }
        });
        let f = fault.clone();
        server
            .on_recovery(GroupId(u16::from(FAULTY)), move |_| {
                let f = f.clone();
                async move {
                    f.start_recovery();
                    tokio::time::sleep(RECOVERY).await;
                }
            })
            .context("recovery bench: group 1")?;
        Ok(server)
    })
    .await
}

#[derive(Serialize, Clone, Copy, Default)]
struct RoundResult {
    calls_per_s: f64,
    mean_ms: f64,
    p99_ms: f64,
    healthy_p99_ms: f64,
    failed: u64,
    /// Recoveries' share of the workers' time in the measured window, %.
    recovery_overhead_pct: f64,
}

/// One caller: draws a group by the shares, calls, records.
async fn caller(
    ep: Endpoint,
    seed: u64,
    record_from: Instant,
    until: Instant,
) -> Result<(Histogram<u64>, Histogram<u64>, u64)> {
    let (mut all, mut healthy) = (new_histogram()?, new_histogram()?);
    let mut failed = 0;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let total: f64 = SHARES.iter().sum();
    while Instant::now() < until {
        let mut x = rng.random_range(0.0..total);
        let mut g = 0u8;
        for (i, s) in SHARES.iter().enumerate() {
            if x < *s {
                g = u8::try_from(i).unwrap_or(0);
                break;
            }
            x -= s;
        }
        let start = Instant::now();
        let r = ep
            .call(SERVER, 0, Bytes::from(vec![g; 16]), Duration::from_secs(10))
            .await;
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match r {
            Ok(_) | Err(CallError::Remote(_)) if start >= record_from => {
                all.saturating_record(ns);
                if g != FAULTY {
                    healthy.saturating_record(ns);
                }
                failed += u64::from(r.is_err());
            }
            Ok(_) | Err(CallError::Remote(_)) => {}
            Err(e) => anyhow::bail!("recovery bench call: {e}"),
        }
    }
    Ok((all, healthy, failed))
}

async fn round(p: &Pair, fault: &Fault, plan: &Plan, seed: u64) -> Result<RoundResult> {
    let record_from = Instant::now() + plan.warmup;
    let until = record_from + plan.measure;
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            tokio::spawn(caller(
                p.client.clone(),
                seed * 1000 + i as u64,
                record_from,
                until,
            ))
        })
        .collect();
    tokio::time::sleep_until(record_from.into()).await;
    let rec_from = fault.recoveries.load(Ordering::Relaxed);
    tokio::time::sleep_until(until.into()).await;
    let recs = fault.recoveries.load(Ordering::Relaxed) - rec_from;
    let (mut all, mut healthy) = (new_histogram()?, new_histogram()?);
    let mut failed = 0;
    for t in tasks {
        let (a, h, f) = t.await.context("caller")??;
        all.add(&a).context("merging histograms")?;
        healthy.add(&h).context("merging histograms")?;
        failed += f;
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e6;
    Ok(RoundResult {
        calls_per_s: all.len() as f64 / plan.measure.as_secs_f64(),
        mean_ms: all.mean() / 1e6,
        p99_ms: ms(&all, 0.99),
        healthy_p99_ms: ms(&healthy, 0.99),
        failed,
        recovery_overhead_pct: 100.0 * recs as f64 * RECOVERY.as_secs_f64()
            / (WORKERS as f64 * plan.measure.as_secs_f64()),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One mapping and path: its rounds and their medians.
#[derive(Serialize)]
pub(super) struct Case {
    mapping: &'static str,
    bad_path: bool,
    rounds: Vec<RoundResult>,
    calls_per_s: f64,
    mean_ms: f64,
    p99_ms: f64,
    healthy_p99_ms: f64,
}

/// The whole measurement.
#[derive(Serialize)]
pub(super) struct RecoveryReport {
    workers: usize,
    service_ms: f64,
    recovery_ms: f64,
    callers: usize,
    /// Mean service time measured in the calibration round.
    measured_service_ms: f64,
    fail_prob: f64,
    cases: Vec<Case>,
}

/// Runs it and prints the table.
pub(super) async fn run(plan: &Plan) -> Result<RecoveryReport> {
    let mut pairs = Vec::new();
    for (m, _) in MAPPINGS {
        let fault = Arc::new(Fault {
            bad: AtomicBool::new(false),
            prob: AtomicU64::new(0),
            served_ns: AtomicU64::new(0),
            served: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            rng: parking_lot::Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(7)),
            origin: Instant::now(),
            recovering_until: AtomicU64::new(0),
        });
        pairs.push((server(m, fault.clone()).await?, fault));
    }
    // Calibration: the service a request really gets, on the good path.
    eprint!("calibrating the service time (one good-path round, performance-oriented) ... ");
    round(&pairs[0].0, &pairs[0].1, plan, 999).await?;
    let f = &pairs[0].1;
    let service = Duration::from_nanos(
        f.served_ns.load(Ordering::Relaxed) / f.served.load(Ordering::Relaxed).max(1),
    );
    let prob = fail_prob(service);
    eprintln!(
        "{:.3} ms per request: p = {prob:.4}",
        service.as_secs_f64() * 1e3
    );
    for (_, f) in &pairs {
        f.prob.store(prob.to_bits(), Ordering::Relaxed);
    }
    let mut results: Vec<Vec<RoundResult>> = vec![Vec::new(); MAPPINGS.len() * 2];
    let total = plan.rounds * results.len();
    let mut step = 0;
    for r in 0..plan.rounds {
        for k in 0..results.len() {
            // Alternate the order between rounds.
            let k = if r % 2 == 0 { k } else { results.len() - 1 - k };
            let (mi, bad) = (k / 2, k % 2 == 1);
            let (pair, fault) = &pairs[mi];
            fault.bad.store(bad, Ordering::Relaxed);
            step += 1;
            eprint!(
                "[{step}/{total}] {}, {} path, round {}/{} ... ",
                MAPPINGS[mi].1,
                if bad { "bad" } else { "good" },
                r + 1,
                plan.rounds
            );
            let res = round(pair, fault, plan, (r * 100 + k) as u64).await?;
            eprintln!(
                "{:.0} calls/s, mean {:.2} ms, p99 {:.2} ms, healthy p99 {:.2} ms, {} failed, recoveries {:.1} % of worker time",
                res.calls_per_s, res.mean_ms, res.p99_ms, res.healthy_p99_ms, res.failed, res.recovery_overhead_pct
            );
            results[k].push(res);
        }
    }
    for (p, _) in pairs {
        p.shutdown().await;
    }
    let cases: Vec<Case> = results
        .into_iter()
        .enumerate()
        .map(|(k, rounds)| {
            let m = |f: fn(&RoundResult) -> f64| median(rounds.iter().map(f).collect());
            Case {
                mapping: MAPPINGS[k / 2].1,
                bad_path: k % 2 == 1,
                calls_per_s: m(|r| r.calls_per_s),
                mean_ms: m(|r| r.mean_ms),
                p99_ms: m(|r| r.p99_ms),
                healthy_p99_ms: m(|r| r.healthy_p99_ms),
                rounds,
            }
        })
        .collect();
    let report = RecoveryReport {
        workers: WORKERS,
        service_ms: SERVICE.as_secs_f64() * 1e3,
        recovery_ms: RECOVERY.as_secs_f64() * 1e3,
        callers: CALLERS,
        measured_service_ms: service.as_secs_f64() * 1e3,
        fail_prob: prob,
        cases,
    };
    print_table(&report, plan);
    Ok(report)
}

/// The bar charts of `experiment recovery`, for the real run.
pub(super) fn draw(report: &RecoveryReport, png: &std::path::Path) -> Result<()> {
    let rows: Vec<crate::experiment::recovery::Row<'_>> = report
        .cases
        .iter()
        .map(|c| {
            (
                c.mapping,
                c.bad_path,
                [c.calls_per_s / 1e3, c.mean_ms, c.p99_ms, c.healthy_p99_ms],
                [0.0, 0.0],
            )
        })
        .collect();
    crate::experiment::recovery::draw(
        png,
        "Recovery-conscious scheduling on the shell (16 groups, 8 workers, 1 ms of waiting per request)",
        &rows,
        false,
    )
}

fn print_table(report: &RecoveryReport, plan: &Plan) {
    println!();
    println!(
        "Recovery-conscious scheduling on the shell: {} workers (2 pools), {} ms of waiting per request ({:.2} ms measured), {} callers, 16 groups; bad path: group 1 fails with p = {:.4}, {} ms recoveries (5 % overhead); medians of {} rounds; client and server share the cores",
        report.workers, report.service_ms, report.measured_service_ms, report.callers, report.fail_prob, report.recovery_ms, plan.rounds
    );
    println!(
        "{:<22} {:<5} | {:>10} {:>8} | {:>9} {:>9} {:>12} | {:>9}",
        "mapping", "path", "calls/s", "ratio", "mean ms", "p99 ms", "healthy p99", "recovery"
    );
    println!("{}", "-".repeat(98));
    for c in &report.cases {
        let base = report
            .cases
            .iter()
            .find(|b| b.mapping == "performance-oriented" && b.bad_path == c.bad_path)
            .map_or(f64::NAN, |b| b.calls_per_s);
        let overhead = median(c.rounds.iter().map(|r| r.recovery_overhead_pct).collect());
        println!(
            "{:<22} {:<5} | {:>10.0} {:>8.3} | {:>9.2} {:>9.2} {:>12.2} | {:>8.1}%",
            c.mapping,
            if c.bad_path { "bad" } else { "good" },
            c.calls_per_s,
            c.calls_per_s / base,
            c.mean_ms,
            c.p99_ms,
            c.healthy_p99_ms,
            overhead
        );
    }
}
