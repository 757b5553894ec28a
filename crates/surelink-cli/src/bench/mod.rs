//! `surelink bench`: surelink against a plain-TCP baseline on loopback, both
//! measured in the same process run.
//!
//! # What is measured
//!
//! * **Round-trip latency** (ping-pong) with 64 B and 4096 B payloads and 1
//!   and 16 concurrent callers. surelink: a server endpoint listening on two
//!   loopback networks (127.0.1.1 and 127.0.2.1) with an echo handler, and a
//!   client endpoint dialling it from 127.0.1.2 and 127.0.2.2 (default
//!   [`Config`] otherwise); once both paths are active, each caller loops
//!   `client.call(..)` and every round trip that starts after the warm-up is
//!   recorded in an HdrHistogram (nanoseconds). Reported: p50, p99, p99.9.
//! * **Pipelined one-way throughput** with 64 B and 4096 B payloads: one
//!   sender loops `client.send(..)` as fast as it can; the server takes
//!   messages with `recv()` and counts them. Delivery is counted *at the
//!   receiver* inside a window that opens after the warm-up and closes before
//!   the sender is told to stop, so neither the ramp-up nor the backlog still
//!   in flight counts as delivered; the backlog is drained (and surelink's
//!   retransmit cache allowed to empty) before the next round. Reported:
//!   messages per second and goodput (payload bytes only, MB = 10^6 bytes).
//!
//! # The baseline
//!
//! One plain tokio `TcpStream` per measurement kind between 127.0.1.2 and
//! 127.0.1.1, `TCP_NODELAY` on both ends, frames of a 4-byte big-endian
//! length (of what follows it), an 8-byte id and the payload. Reads are
//! buffered on every side: read into a `BytesMut`, parse every complete frame.
//!
//! * Latency: the server echoes frames (the replies to one read leave in one
//!   write). The client multiplexes its callers over the one connection. A
//!   caller registers a `oneshot` under its request id, appends its frame to
//!   a shared out-buffer and, unless another caller is writing already,
//!   writes everything buffered itself (write combining: no hop through a
//!   writer task, as surelink's callers write the core's output themselves).
//!   A reader task completes the `oneshot`s from a
//!   `Mutex<HashMap<u64, oneshot::Sender<Bytes>>>`. Calls carry the same
//!   5 s timeout as surelink's.
//! * Throughput: the sender writes frames through a 64 KiB
//!   `tokio::io::BufWriter` (it flushes whenever it fills, and at the end of
//!   the round); the receiver parses frames into `Bytes` and counts them.
//!
//! # Fairness
//!
//! Both contenders run alternately round by round (the order swaps every
//! round), so drift on a shared machine hits both alike, and the report gives
//! medians over rounds. Ratios are surelink / TCP: above 1 means surelink is
//! slower for latency; below 1 means surelink is slower for throughput.
//!
//! # Output
//!
//! Progress on stderr, the table on stdout, every per-round figure and the
//! medians in `<out>/bench.json`, and a latency-by-percentile plot in
//! `<out>/latency_cdf.png`.

mod detector;
mod fixture;
mod latency;
pub(crate) mod plot;
mod priority;
mod report;
mod tcp;
mod throughput;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde::Serialize;

use fixture::Fixture;
use latency::{latency_round, Caller};
use report::{
    render_table, thousands, LatencyCase, LatencySide, Report, Settings, SurelinkStats,
    ThroughputCase, ThroughputRound,
};
use throughput::{throughput_surelink, throughput_tcp};

// ---------------------------------------------------------------------------
// Command line and plan
// ---------------------------------------------------------------------------

/// Options of `surelink bench`.
#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Rounds per case and contender; the report gives the median.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per measurement (one round of one contender), after a warm-up.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Directory for bench.json and latency_cdf.png (created if missing).
    #[arg(long, default_value = "results/bench")]
    out: PathBuf,
    /// Smoke test: 2 rounds of 0.25 s (overrides --rounds and --seconds).
    #[arg(long)]
    quick: bool,
    /// Run only one kind of measurement.
    #[arg(long, value_enum)]
    only: Option<Only>,
}

/// Which measurements `--only` keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Only {
    /// Round-trip latency only.
    Latency,
    /// One-way throughput only.
    Throughput,
    /// The failure detector's cost: surelink with the detector against
    /// surelink without it (ping-pong, 16 callers).
    Detector,
    /// Priority scheduling: high-priority calls through a saturated
    /// server, priority queues against one FIFO queue.
    Priority,
}

/// Payload sizes of both measurements, bytes.
const PAYLOADS: [usize; 2] = [64, 4096];
/// Concurrent callers of the latency measurement.
const CALLERS: [usize; 2] = [1, 16];

/// What one run does, derived from the arguments.
#[derive(Clone, Debug)]
struct Plan {
    rounds: usize,
    measure: Duration,
    warmup: Duration,
    latency: Vec<(usize, usize)>,
    throughput: Vec<usize>,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Plan> {
        let (rounds, seconds) = if args.quick {
            (2, 0.25)
        } else {
            (args.rounds, args.seconds)
        };
        ensure!((1..=1000).contains(&rounds), "--rounds must be 1..=1000");
        ensure!(
            seconds.is_finite() && (0.01..=3600.0).contains(&seconds),
            "--seconds must be between 0.01 and 3600"
        );
        let measure = Duration::from_secs_f64(seconds);
        // A fifth of the measurement, within 50..300 ms, before every round.
        let warmup = (measure / 5).clamp(Duration::from_millis(50), Duration::from_millis(300));
        let latency = if args.only.is_some_and(|o| o != Only::Latency) {
            Vec::new()
        } else {
            PAYLOADS
                .iter()
                .flat_map(|&p| CALLERS.iter().map(move |&c| (p, c)))
                .collect()
        };
        let throughput = if args.only.is_some_and(|o| o != Only::Throughput) {
            Vec::new()
        } else {
            PAYLOADS.to_vec()
        };
        Ok(Plan {
            rounds,
            measure,
            warmup,
            latency,
            throughput,
        })
    }

    fn steps(&self) -> usize {
        if self.latency.is_empty() && self.throughput.is_empty() {
            // The detector bench: both payloads, two contenders.
            return PAYLOADS.len() * self.rounds * 2;
        }
        (self.latency.len() + self.throughput.len()) * self.rounds * 2
    }
}

/// The two contenders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Contender {
    Surelink,
    Tcp,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Surelink => "surelink",
            Contender::Tcp => "tcp",
        }
    }

    /// Who goes first in round `round` (0-based): alternates.
    fn order(round: usize) -> [Contender; 2] {
        if round % 2 == 0 {
            [Contender::Surelink, Contender::Tcp]
        } else {
            [Contender::Tcp, Contender::Surelink]
        }
    }
}

/// Numbers the progress lines.
struct Progress {
    step: usize,
    total: usize,
}

impl Progress {
    fn next(&mut self) -> String {
        self.step += 1;
        format!("[{}/{}]", self.step, self.total)
    }
}

// ---------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------

/// Runs the benchmark: sets both contenders up, measures, shuts down, and
/// writes the table, the JSON and the plot.
pub(crate) async fn run(args: &BenchArgs) -> Result<()> {
    let plan = Plan::new(args)?;
    // Fail on an unwritable output directory before measuring anything.
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create output directory {}", args.out.display()))?;
    eprintln!(
        "surelink bench: {} round(s) x {:.2} s per contender and case (+{} ms warm-up each), {} measurements",
        plan.rounds,
        plan.measure.as_secs_f64(),
        plan.warmup.as_millis(),
        plan.steps()
    );
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if args.only == Some(Only::Priority) {
        let report = priority::run(&plan).await?;
        let path = args.out.join("priority_bench.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        return Ok(());
    }
    if args.only == Some(Only::Detector) {
        let cases = detector::run(&plan, &PAYLOADS).await?;
        let path = args.out.join("detector_bench.json");
        let json = serde_json::json!({
            "started_unix_s": started,
            "rounds": plan.rounds,
            "seconds": plan.measure.as_secs_f64(),
            "on": "DetectorConfig::default() (SafeTimer, 10 ms heartbeats)",
            "off": "DetectorMode::Off",
            "cases": cases,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        return Ok(());
    }
    let mut fixture = Fixture::setup()
        .await
        .context("setting up the contenders")?;
    let outcome = measure_all(&mut fixture, &plan).await;
    let surelink_stats = SurelinkStats::collect(&fixture.surelink);
    fixture.shutdown().await;
    let (latency, throughput) = outcome?;

    let report = Report {
        settings: Settings {
            rounds: plan.rounds,
            seconds: plan.measure.as_secs_f64(),
            warmup_seconds: plan.warmup.as_secs_f64(),
            quick: args.quick,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            started_unix_s: started,
            surelink_config: "Config::new defaults; 2 networks, 1 connection per network",
            baseline: "one tokio TcpStream, TCP_NODELAY, 4-byte length + 8-byte id + payload",
            ratio: "surelink / tcp",
            latency_unit: "microseconds",
            goodput_unit: "MB/s of payload, MB = 10^6 bytes",
        },
        latency,
        throughput,
        surelink_stats,
    };
    print!("{}", render_table(&report));

    let json_path = args.out.join("bench.json");
    let json = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
    std::fs::write(&json_path, json)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    eprintln!("wrote {}", json_path.display());

    if report.latency.is_empty() {
        eprintln!("no latency measured: latency_cdf.png not written");
    } else {
        let png = args.out.join("latency_cdf.png");
        match plot::latency_cdf(&png, &report.latency) {
            Ok(true) => eprintln!("wrote {}", png.display()),
            Ok(false) => {}
            // The figures are in the JSON already; a plot problem is not fatal.
            Err(e) => eprintln!("warning: could not draw {}: {e:#}", png.display()),
        }
    }
    Ok(())
}

/// Every case, every round, both contenders alternately.
async fn measure_all(
    fx: &mut Fixture,
    plan: &Plan,
) -> Result<(Vec<LatencyCase>, Vec<ThroughputCase>)> {
    let mut progress = Progress {
        step: 0,
        total: plan.steps(),
    };
    let mut latency = Vec::new();
    for &(payload, callers) in &plan.latency {
        let body = Bytes::from(pattern(payload));
        let mut sides = [LatencySide::new()?, LatencySide::new()?];
        for round in 0..plan.rounds {
            for who in Contender::order(round) {
                let label = format!(
                    "{} latency {payload} B x{callers} {} round {}/{}",
                    progress.next(),
                    who.name(),
                    round + 1,
                    plan.rounds
                );
                eprint!("{label} ... ");
                let caller = match who {
                    Contender::Surelink => Caller::Surelink(fx.surelink.client.clone()),
                    Contender::Tcp => Caller::Tcp(fx.tcp_rpc.clone()),
                };
                let (mut r, hist) = latency_round(&caller, &body, callers, plan)
                    .await
                    .with_context(|| label.clone())?;
                r.round = round + 1;
                eprintln!(
                    "p50 {:.1} µs  p99 {:.1} µs  p99.9 {:.1} µs  ({} calls{})",
                    r.p50_us,
                    r.p99_us,
                    r.p999_us,
                    r.calls,
                    if r.errors > 0 {
                        format!(
                            ", {} ERRORS: {}",
                            r.errors,
                            r.first_error.as_deref().unwrap_or("")
                        )
                    } else {
                        String::new()
                    }
                );
                let side = &mut sides[usize::from(who == Contender::Tcp)];
                side.merged.add(&hist).context("merging histograms")?;
                side.rounds.push(r);
            }
        }
        let [surelink, tcp] = sides;
        latency.push(LatencyCase::new(payload, callers, surelink, tcp));
    }
    let mut throughput = Vec::new();
    for &payload in &plan.throughput {
        let body = Bytes::from(pattern(payload));
        let mut sides: [Vec<ThroughputRound>; 2] = [Vec::new(), Vec::new()];
        for round in 0..plan.rounds {
            for who in Contender::order(round) {
                let label = format!(
                    "{} throughput {payload} B {} round {}/{}",
                    progress.next(),
                    who.name(),
                    round + 1,
                    plan.rounds
                );
                eprint!("{label} ... ");
                let mut r = match who {
                    Contender::Surelink => throughput_surelink(&fx.surelink, &body, plan).await,
                    Contender::Tcp => throughput_tcp(&mut fx.tcp_sink, &body, plan).await,
                }
                .with_context(|| label.clone())?;
                r.round = round + 1;
                eprintln!(
                    "{} msgs/s  {:.1} MB/s  (sender offered {} msgs/s, drained in {:.0} ms)",
                    thousands(r.msgs_per_s),
                    r.mb_per_s,
                    thousands(r.offered_msgs_per_s),
                    r.drain_seconds * 1e3
                );
                sides[usize::from(who == Contender::Tcp)].push(r);
            }
        }
        let [surelink, tcp] = sides;
        throughput.push(ThroughputCase::new(payload, surelink, tcp));
    }
    Ok((latency, throughput))
}

/// A recognisable payload (not all zeros) of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..=250u8).cycle().take(len).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_alternate() {
        assert_eq!(Contender::order(1), [Contender::Tcp, Contender::Surelink]);
    }
}
