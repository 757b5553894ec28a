//! `surelink-lab bench --only detector`: the cost of the failure detector.
//!
//! Two surelink pairs in one process, identical but for the detector: the
//! default SafeTimer detector (heartbeats every 10 ms on both networks,
//! barrier checks, the send fence in front of every socket write, traffic
//! counted as heartbeats) and none at all. The ping-pong latency round of
//! the main bench runs on each alternately, round by round, with 16
//! concurrent callers (the paper's method: enough callers to saturate), at
//! 64 B and 4 KiB. Reported per payload: medians over rounds of calls per
//! second, p50 and p99, and the detector's cost (throughput loss, p99
//! increase).

use anyhow::{Context, Result};
use bytes::Bytes;
use serde::Serialize;
use surelink::{DetectorConfig, DetectorMode};

use super::latency::{latency_round, Caller};
use super::surelink_pair::SurelinkPair;
use super::Plan;

/// Concurrent callers.
const CALLERS: usize = 16;

/// One round: calls per second, p50 µs, p99 µs.
type Round = (f64, f64, f64);

#[derive(Serialize, Clone, Copy, Default)]
struct Side {
    calls_per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// One payload size.
#[derive(Serialize)]
pub(super) struct DetectorCase {
    payload: usize,
    callers: usize,
    on_rounds: Vec<Round>,
    off_rounds: Vec<Round>,
    on: Side,
    off: Side,
    /// 1 - on/off calls per second, percent (medians).
    throughput_loss_pct: f64,
    /// on/off p99 - 1, percent (medians).
    p99_increase_pct: f64,
    /// The same from each round's adjacent on/off pair, then the median:
    /// robust to the machine drifting during the run.
    paired_throughput_loss_pct: f64,
    paired_p99_increase_pct: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn side(rounds: &[Round]) -> Side {
    Side {
        calls_per_s: median(rounds.iter().map(|r| r.0).collect()),
        p50_us: median(rounds.iter().map(|r| r.1).collect()),
        p99_us: median(rounds.iter().map(|r| r.2).collect()),
    }
}

/// Measures both pairs; returns the cases and prints the table.
pub(super) async fn run(plan: &Plan, payloads: &[usize]) -> Result<Vec<DetectorCase>> {
    let on = SurelinkPair::setup(DetectorConfig::default(), false)
        .await
        .context("the pair with the detector")?;
    let off_cfg = DetectorConfig {
        mode: DetectorMode::Off,
        ..DetectorConfig::default()
    };
    let off = SurelinkPair::setup(off_cfg, false)
        .await
        .context("the pair without the detector")?;
    let total = payloads.len() * plan.rounds * 2;
    let mut step = 0;
    let mut cases = Vec::new();
    let mut outcome = Ok(());
    'payloads: for &payload in payloads {
        let body = Bytes::from((0..=250u8).cycle().take(payload).collect::<Vec<u8>>());
        let mut rounds: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
        for round in 0..plan.rounds {
            // Alternate who goes first.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for who in order {
                step += 1;
                let name = if who == 0 {
                    "detector on"
                } else {
                    "detector off"
                };
                eprint!(
                    "[{step}/{total}] ping-pong {payload} B x{CALLERS} {name} round {}/{} ... ",
                    round + 1,
                    plan.rounds
                );
                let pair = if who == 0 { &on } else { &off };
                let caller = Caller::Surelink(pair.client.clone());
                match latency_round(&caller, &body, CALLERS, plan).await {
                    Ok((r, _)) => {
                        eprintln!(
                            "{:.0} calls/s  p50 {:.1} µs  p99 {:.1} µs",
                            r.calls_per_s, r.p50_us, r.p99_us
                        );
                        rounds[who].push((r.calls_per_s, r.p50_us, r.p99_us));
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break 'payloads;
                    }
                }
            }
        }
        let [on_rounds, off_rounds] = rounds;
        let (s_on, s_off) = (side(&on_rounds), side(&off_rounds));
        let paired = |f: fn(&Round, &Round) -> f64| {
            median(
                on_rounds
                    .iter()
                    .zip(&off_rounds)
                    .map(|(a, b)| f(a, b))
                    .collect(),
            )
        };
        cases.push(DetectorCase {
            payload,
            callers: CALLERS,
            throughput_loss_pct: (1.0 - s_on.calls_per_s / s_off.calls_per_s) * 100.0,
            p99_increase_pct: (s_on.p99_us / s_off.p99_us - 1.0) * 100.0,
            paired_throughput_loss_pct: paired(|a, b| (1.0 - a.0 / b.0) * 100.0),
            paired_p99_increase_pct: paired(|a, b| (a.2 / b.2 - 1.0) * 100.0),
            on: s_on,
            off: s_off,
            on_rounds,
            off_rounds,
        });
    }
    let fenced = on.client.stats().detector.map_or(0, |d| d.fences)
        + on.server.stats().detector.map_or(0, |d| d.fences);
    tokio::join!(on.shutdown(), off.shutdown());
    outcome?;
    println!();
    println!(
        "Detector cost: ping-pong, {CALLERS} callers, medians of {} rounds (negative = the detector run was faster)",
        plan.rounds
    );
    println!(
        "{:<8} | {:>12} {:>9} {:>9} | {:>12} {:>9} {:>9} | {:>10} {:>10} | {:>11} {:>10}",
        "payload",
        "on calls/s",
        "p50 µs",
        "p99 µs",
        "off calls/s",
        "p50 µs",
        "p99 µs",
        "tput loss",
        "p99 +",
        "paired loss",
        "paired p99"
    );
    println!("{}", "-".repeat(132));
    for c in &cases {
        println!(
            "{:<8} | {:>12.0} {:>9.1} {:>9.1} | {:>12.0} {:>9.1} {:>9.1} | {:>9.2}% {:>9.2}% | {:>10.2}% {:>9.2}%",
            format!("{} B", c.payload),
            c.on.calls_per_s,
            c.on.p50_us,
            c.on.p99_us,
            c.off.calls_per_s,
            c.off.p50_us,
            c.off.p99_us,
            c.throughput_loss_pct,
            c.p99_increase_pct,
            c.paired_throughput_loss_pct,
            c.paired_p99_increase_pct
        );
    }
    if fenced > 0 {
        println!("WARNING: the detector pair fenced itself {fenced} time(s) during the run");
    }
    Ok(cases)
}
