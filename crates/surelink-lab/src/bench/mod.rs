//! `surelink-lab bench`: surelink against the transports users would pick
//! instead — plain TCP, ZeroMQ, NATS and gRPC — all on loopback, all measured in
//! the same process run with the same cases.
//!
//! # What is measured
//!
//! * **Round-trip latency** (ping-pong) with 64 B and 4096 B payloads and 1
//!   and 16 concurrent callers. Each caller sends a request, waits for the
//!   echo, checks it and sends the next; every round trip that starts after
//!   the warm-up is recorded in an HdrHistogram (nanoseconds). Calls carry a
//!   5 s timeout on every contender. Reported: p50, p99, p99.9 and calls/s.
//! * **Pipelined one-way throughput** with 64 B and 4096 B payloads: one
//!   sender sends as fast as the contender lets it; the receiving
//!   application takes the messages and counts them. Delivery is counted *at
//!   the receiver* inside a window that opens after the warm-up and closes
//!   before the sender is told to stop, so neither the ramp-up nor the
//!   backlog still in flight counts as delivered; the backlog is drained
//!   before the next round. Reported: messages per second and goodput
//!   (payload bytes only, MB = 10^6 bytes). A contender that may drop
//!   messages (NATS core is at-most-once) is drained until nothing more
//!   arrives, and what never arrived is reported as lost.
//!
//! # The contenders
//!
//! Each is set up once for the whole run and tuned as its users would.
//!
//! * **surelink** ([`surelink_pair`]): a server endpoint listening on two
//!   loopback networks (127.0.1.1 and 127.0.2.1) with an echo handler, and a
//!   client endpoint dialling it from 127.0.1.2 and 127.0.2.2 (default
//!   [`Config`] otherwise). Latency: callers are tokio tasks looping
//!   `client.call(..)`, once both paths are active. Throughput: one task
//!   loops `client.send(..)`; the server takes batches with `recv_many` and
//!   counts them; its retransmit cache is allowed to empty before the next
//!   round.
//! * **tcp** ([`tcp`]), the baseline: one plain tokio `TcpStream` per
//!   measurement kind between 127.0.1.2 and 127.0.1.1, `TCP_NODELAY` on both
//!   ends, frames of a 4-byte big-endian length (of what follows it), an
//!   8-byte id and the payload; reads buffered on every side (read into a
//!   `BytesMut`, parse every complete frame). Latency: the server echoes
//!   frames (the replies to one read leave in one write); the client
//!   multiplexes its callers over the one connection with write combining
//!   (a caller appends its frame to a shared out-buffer and, unless another
//!   caller is writing already, writes everything buffered itself) and a
//!   reader task that completes the callers' `oneshot`s by request id.
//!   Throughput: the sender writes frames through a 64 KiB
//!   `tokio::io::BufWriter`; the receiver parses frames into `Bytes` and
//!   counts them.
//! * **zeromq** ([`zeromq`], with the `zeromq` cargo feature): real libzmq
//!   (Debian's, through the `zmq` crate) over TCP on 127.0.1.1, one context
//!   (one I/O thread, the default) for the server side and one for the
//!   client side, as two processes would have; default HWMs and socket
//!   options (libzmq sets `TCP_NODELAY` itself). zmq sockets are not
//!   thread-safe and their calls block, so every socket is driven by its own
//!   std thread, never by a tokio worker. Latency: a ROUTER echoes every
//!   message back to its sender; each caller is a thread with its own DEALER
//!   socket (what ZeroMQ users do for concurrent requests), sending
//!   `[request id, payload]` and waiting for the matching reply. Throughput:
//!   PUSH/PULL; the sender thread loops `send` (libzmq batches on its own),
//!   the receiver thread loops `recv` into a reused message and counts.
//! * **nats** ([`nats`]): a `nats-server` child process on a free port of
//!   127.0.1.1 (started by the bench, killed at the end or on error or
//!   Ctrl-C), and the pure-Rust `async-nats` client, one connection per side
//!   with default options (the request timeout set to the common 5 s).
//!   Latency: callers are tokio tasks sharing the client connection and
//!   looping `client.request(..)` (the client multiplexes them over one
//!   reply-inbox subscription); the server side subscribes and answers each
//!   request with `publish(reply_subject, payload)`. Throughput: the sender
//!   loops `publish`, a subscriber on the other connection counts.
//! * **grpc** ([`grpc`]): tonic's server and client with their default
//!   transport (HTTP/2 over one TCP connection from 127.0.1.2 to
//!   127.0.1.1, `TCP_NODELAY` on, no TLS) and prost messages (`bytes
//!   payload = 1`). Latency: callers are tokio tasks on clones of the one
//!   channel looping unary calls (HTTP/2 multiplexes them). Throughput:
//!   one client-streaming call per round whose stream yields messages
//!   until the round stops; the server counts each message it decodes.
//!
//! A contender that cannot run here is skipped with a `SKIPPED` line and the
//! rest run: zeromq when the binary is built without the `zeromq` feature,
//! nats when no `nats-server` is installed.
//!
//! # Fairness
//!
//! All contenders run one after the other in every round, in an order that
//! reverses from round to round (so each one's average position is the
//! same, and drift on a shared machine hits all alike); the report gives
//! medians over rounds. Ratios are surelink / contender: above 1 means
//! surelink is slower for latency; below 1 means surelink is slower for
//! throughput.
//!
//! # Output
//!
//! Progress on stderr, the table on stdout, every per-round figure and the
//! medians in `<out>/bench.json`, and a latency-by-percentile plot of all
//! contenders in `<out>/latency_cdf.png`.
//!
//! [`Config`]: surelink::Config

pub(crate) mod cache;
mod detector;
mod fixture;
mod grpc;
pub(crate) mod helpers;
pub(crate) mod idle_peers;
mod idle_peers_churn;
mod latency;
mod nats;
mod nats_server;
pub(crate) mod plot;
mod priority;
mod recovery;
mod report;
mod surelink_pair;
mod tcp;
mod threaded_pair;
mod throughput;
#[cfg(feature = "zeromq")]
mod zeromq;
#[cfg(not(feature = "zeromq"))]
#[path = "zeromq_off.rs"]
mod zeromq;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde::Serialize;

use fixture::Fixture;
use report::{
    render_table, thousands, LatencyCase, LatencySide, Report, Settings, ThroughputCase,
    ThroughputRound,
};
use surelink_pair::SurelinkStats;

// ---------------------------------------------------------------------------
// Command line and plan
// ---------------------------------------------------------------------------

/// Options of `surelink-lab bench`.
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
    /// A tuned variant: both surelink ends prefer this record cipher
    /// (aes-256-gcm or chacha20-poly1305) instead of the faster one on
    /// this CPU; labelled in bench.json.
    #[arg(long)]
    record_cipher: Option<surelink::proto::secure::RecordCipher>,
    #[command(subcommand)]
    sub: Option<BenchSub>,
}

/// `surelink-lab bench cache`: the cache cluster's own benchmark.
#[derive(clap::Subcommand, Debug)]
enum BenchSub {
    /// The cache cluster against memcached and nutcracker (twemproxy):
    /// throughput, latency and CPU at fixed offered loads; `--failure`
    /// adds a link failure on the netns testbed (root).
    Cache(cache::CacheBenchArgs),
    /// What failure detection costs a server per connected peer: server
    /// CPU and loopback traffic at 0…500 idle clients and 100 loaded
    /// ones, optionally against an older build (`--baseline-bin`).
    IdlePeers(idle_peers::IdlePeersArgs),
    /// PostMan helpers: the capped server's CPU per request and latency,
    /// direct against through helpers (both batching policies), at fixed
    /// offered loads from hundreds of client sessions.
    Helpers(helpers::HelpersArgs),
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
    /// Recovery-conscious scheduling: the paper's experiment with real
    /// handlers on the shell, four mappings, good and bad path.
    Recovery,
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

    /// A plan for tests: one round of 50 ms after 20 ms of warm-up, no
    /// cases.
    #[cfg(test)]
    fn tiny() -> Plan {
        Plan {
            rounds: 1,
            measure: Duration::from_millis(50),
            warmup: Duration::from_millis(20),
            latency: Vec::new(),
            throughput: Vec::new(),
        }
    }

    /// Measurements of a run with `contenders` contenders.
    fn steps(&self, contenders: usize) -> usize {
        if self.latency.is_empty() && self.throughput.is_empty() {
            // The detector bench: both payloads, two contenders.
            return PAYLOADS.len() * self.rounds * 2;
        }
        (self.latency.len() + self.throughput.len()) * self.rounds * contenders
    }
}

/// The contenders, in the report's order (surelink first: the ratios are
/// surelink / each of the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
enum Contender {
    Surelink,
    /// surelink with `insecure = true`: the baseline of authentication's cost.
    SurelinkInsecure,
    Tcp,
    Zeromq,
    Nats,
    /// gRPC (tonic), the RPC system most users would pick instead.
    Grpc,
}

impl Contender {
    /// Every contender this bench knows.
    const ALL: [Contender; 6] = [
        Contender::Surelink,
        Contender::SurelinkInsecure,
        Contender::Tcp,
        Contender::Zeromq,
        Contender::Nats,
        Contender::Grpc,
    ];

    /// The name in progress lines, `SKIPPED` lines and `bench.json`.
    fn name(self) -> &'static str {
        match self {
            Contender::Surelink => "surelink",
            Contender::SurelinkInsecure => "surelink_insecure",
            Contender::Tcp => "tcp",
            Contender::Zeromq => "zeromq",
            Contender::Nats => "nats",
            Contender::Grpc => "grpc",
        }
    }

    /// The name in the plot's legend.
    fn label(self) -> &'static str {
        match self {
            Contender::Surelink => "surelink",
            Contender::SurelinkInsecure => "surelink insecure",
            Contender::Tcp => "plain TCP",
            Contender::Zeromq => "ZeroMQ",
            Contender::Nats => "NATS",
            Contender::Grpc => "gRPC (tonic)",
        }
    }

    /// Who goes when in round `round` (0-based) among `present`: in order
    /// in even rounds, reversed in odd ones.
    fn order(present: &[Contender], round: usize) -> Vec<Contender> {
        let mut order = present.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        order
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

/// Runs the benchmark: sets all contenders up, measures, shuts down, and
/// writes the table, the JSON and the plot.
///
/// Ctrl-C during the measurements stops them and shuts every contender down
/// as at the end of a run (the `nats-server` child is killed and reaped);
/// during the setup it drops what was set up, which kills the child too.
pub(crate) async fn run(args: &BenchArgs) -> Result<()> {
    match &args.sub {
        Some(BenchSub::Cache(c)) => return cache::run(c).await,
        Some(BenchSub::IdlePeers(a)) => return idle_peers::run(a).await,
        Some(BenchSub::Helpers(a)) => return helpers::run(a).await,
        None => {}
    }
    let plan = Plan::new(args)?;
    // Fail on an unwritable output directory before measuring anything.
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create output directory {}", args.out.display()))?;
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if args.only == Some(Only::Priority) {
        announce(&plan, plan.steps(2));
        let report = interruptible(priority::run(&plan)).await?;
        let path = args.out.join("priority_bench.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        return Ok(());
    }
    if args.only == Some(Only::Recovery) {
        announce(&plan, plan.rounds * 8);
        let report = interruptible(recovery::run(&plan)).await?;
        let path = args.out.join("recovery_bench.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        let png = args.out.join("recovery_bench.png");
        match recovery::draw(&report, &png) {
            Ok(()) => eprintln!("wrote {}", png.display()),
            Err(e) => eprintln!("(bar chart not drawn: {e:#})"),
        }
        return Ok(());
    }
    if args.only == Some(Only::Detector) {
        let cases = interruptible(detector::run(&plan, &PAYLOADS)).await?;
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
    let mut fixture = interruptible(Fixture::setup(args.record_cipher))
        .await
        .context("setting up the contenders")?;
    let contenders = fixture.contenders();
    announce(&plan, plan.steps(contenders.len()));
    let outcome = interruptible(measure_all(&mut fixture, &plan, &contenders)).await;
    let surelink_stats = SurelinkStats::collect(&fixture.surelink);
    let descriptions: BTreeMap<Contender, String> = contenders
        .iter()
        .map(|&c| (c, fixture.describe(c)))
        .collect();
    let skipped = fixture.skipped.clone();
    let notes = fixture.shutdown().await;
    let (latency, throughput) = outcome?;

    let report = Report {
        settings: Settings {
            rounds: plan.rounds,
            seconds: plan.measure.as_secs_f64(),
            warmup_seconds: plan.warmup.as_secs_f64(),
            quick: args.quick,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            started_unix_s: started,
            contenders: descriptions,
            skipped,
            ratio: "surelink / contender",
            latency_unit: "microseconds",
            goodput_unit: "MB/s of payload, MB = 10^6 bytes",
        },
        latency,
        throughput,
        surelink_stats,
        notes,
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

/// `work`, unless Ctrl-C comes first (then `work` is dropped).
async fn interruptible<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::select! {
        r = work => r,
        r = tokio::signal::ctrl_c() => {
            r.context("listening for Ctrl-C")?;
            bail!("interrupted by Ctrl-C")
        }
    }
}

/// The first progress line.
fn announce(plan: &Plan, steps: usize) {
    eprintln!(
        "surelink bench: {} round(s) x {:.2} s per contender and case (+{} ms warm-up each), {steps} measurements",
        plan.rounds,
        plan.measure.as_secs_f64(),
        plan.warmup.as_millis(),
    );
}

/// Every case, every round, all `contenders` one after the other.
async fn measure_all(
    fx: &mut Fixture,
    plan: &Plan,
    contenders: &[Contender],
) -> Result<(Vec<LatencyCase>, Vec<ThroughputCase>)> {
    let mut progress = Progress {
        step: 0,
        total: plan.steps(contenders.len()),
    };
    let mut latency = Vec::new();
    for &(payload, callers) in &plan.latency {
        let body = Bytes::from(pattern(payload));
        let mut sides = BTreeMap::new();
        for &who in contenders {
            sides.insert(who, LatencySide::new()?);
        }
        for round in 0..plan.rounds {
            for who in Contender::order(contenders, round) {
                let label = format!(
                    "{} latency {payload} B x{callers} {} round {}/{}",
                    progress.next(),
                    who.name(),
                    round + 1,
                    plan.rounds
                );
                eprint!("{label} ... ");
                let (mut r, hist) = fx
                    .latency_round(who, &body, callers, plan)
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
                let side = sides
                    .get_mut(&who)
                    .context("a contender without a latency side")?;
                side.merged.add(&hist).context("merging histograms")?;
                side.rounds.push(r);
            }
        }
        latency.push(LatencyCase::new(payload, callers, sides));
    }
    let mut throughput = Vec::new();
    for &payload in &plan.throughput {
        let body = Bytes::from(pattern(payload));
        let mut sides: BTreeMap<Contender, Vec<ThroughputRound>> =
            contenders.iter().map(|&who| (who, Vec::new())).collect();
        for round in 0..plan.rounds {
            for who in Contender::order(contenders, round) {
                let label = format!(
                    "{} throughput {payload} B {} round {}/{}",
                    progress.next(),
                    who.name(),
                    round + 1,
                    plan.rounds
                );
                eprint!("{label} ... ");
                let mut r = fx
                    .throughput_round(who, &body, plan)
                    .await
                    .with_context(|| label.clone())?;
                r.round = round + 1;
                eprintln!(
                    "{} msgs/s  {:.1} MB/s  (sender offered {} msgs/s, drained in {:.0} ms{})",
                    thousands(r.msgs_per_s),
                    r.mb_per_s,
                    thousands(r.offered_msgs_per_s),
                    r.drain_seconds * 1e3,
                    if r.lost > 0 {
                        format!(", {} LOST", thousands(r.lost as f64))
                    } else {
                        String::new()
                    }
                );
                sides.entry(who).or_default().push(r);
            }
        }
        throughput.push(ThroughputCase::new(payload, sides));
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
        let two = [Contender::Surelink, Contender::Tcp];
        assert_eq!(Contender::order(&two, 0), two);
        assert_eq!(
            Contender::order(&two, 1),
            [Contender::Tcp, Contender::Surelink]
        );
        let all = Contender::ALL;
        let mut reversed = all;
        reversed.reverse();
        assert_eq!(Contender::order(&all, 2), all);
        assert_eq!(Contender::order(&all, 3), reversed);
        // Over two rounds every contender's average position is the same.
        for who in all {
            let pos = |r| {
                Contender::order(&all, r)
                    .iter()
                    .position(|&c| c == who)
                    .unwrap()
            };
            assert_eq!(pos(0) + pos(1), all.len() - 1);
        }
    }

    #[test]
    fn contender_names_match_the_json() {
        for who in Contender::ALL {
            let json = serde_json::to_string(&who).unwrap();
            assert_eq!(json, format!("\"{}\"", who.name()));
        }
    }
}
