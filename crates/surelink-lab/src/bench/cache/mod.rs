//! `surelink-lab bench cache`: the cache cluster against what its users run
//! instead, through the same open-loop memcached load (`memload`: 64 B
//! values, 90 % get, Zipf keys; latency from the scheduled time):
//!
//! - `memcached`: one memcached, clients straight to it (no cluster, no
//!   failover: the floor);
//! - `nutcracker`: twemproxy in front of three memcached, as its README
//!   configures a cache that ejects failed servers;
//! - `surelink`: `surelink cache proxy` in front of three `surelink cache
//!   node`s with the embedded store, over two networks (loopback ranges);
//! - `surelink-replicated`: `surelink` with `[proxy] replicas = 2` (each
//!   key on two nodes: every set written twice);
//! - `surelink-memcached`: the same, each node fronting its own memcached.
//!
//! Every server is its own process with the product's defaults; each is
//! started once, and every round measures every contender at every offered
//! load, the contenders' order rotating between rounds; the report gives
//! medians. Client and servers share this machine's cores — the report
//! says how many — so each server's CPU seconds per million requests are
//! reported next to its throughput. `--failure` adds the netns row
//! ([`failure`]); `--kill` the row of a server process killed under load
//! ([`kill`]).

pub(crate) mod failure;
mod kill;
mod procs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::memload::{Load, LoadConfig, Outcome, Progress, Sample};
use procs::{NodeSpec, Proc};

use surelink_lab::host::find_program;

/// Options of `surelink-lab bench cache`.
#[derive(Args, Debug, Clone)]
pub(crate) struct CacheBenchArgs {
    /// Rounds; the report gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Offered loads, requests per second (open loop), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10000,20000,40000,80000,120000,160000,200000,240000"
    )]
    rates: Vec<u32>,
    /// Client connections.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Distinct keys (Zipf 0.99).
    #[arg(long, default_value_t = 10_000)]
    keys: u32,
    /// Contenders (default: all whose programs are installed).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Contender>,
    /// Also the failure row on the netns testbed (root): link 1 down 3 s.
    #[arg(long)]
    failure: bool,
    /// Only the failure row.
    #[arg(long)]
    failure_only: bool,
    /// Also the kill row: a cache server process killed under load
    /// (nutcracker's memcached; a surelink node with 1 and 2 replicas).
    #[arg(long)]
    kill: bool,
    /// Only the kill row.
    #[arg(long)]
    kill_only: bool,
    /// Directory for cache.json, logs and the configurations.
    #[arg(long, default_value = "results/bench-cache")]
    out: PathBuf,
    /// TOML appended to every surelink configuration (e.g.
    /// `$'[detector]\nmode = "off"'`): a tuned variant, announced as such
    /// in the report. Default: none (the product's defaults).
    #[arg(long, default_value = "")]
    surelink_tuned: String,
}

/// A contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Contender {
    Memcached,
    Nutcracker,
    Surelink,
    SurelinkReplicated,
    SurelinkMemcached,
}

impl Contender {
    fn label(self) -> &'static str {
        match self {
            Contender::Memcached => "memcached (direct)",
            Contender::Nutcracker => "nutcracker -> 3 memcached",
            Contender::Surelink => "surelink proxy -> 3 nodes",
            Contender::SurelinkReplicated => "surelink proxy -> 3 nodes, 2 replicas",
            Contender::SurelinkMemcached => "surelink -> 3 nodes -> memcached",
        }
    }
}

/// A contender's running servers.
struct Running {
    addr: SocketAddr,
    procs: Vec<Proc>,
}

impl Running {
    fn cpu(&self) -> Vec<f64> {
        self.procs.iter().map(procs::cpu_of).collect()
    }

    fn switches(&self) -> u64 {
        self.procs.iter().map(procs::switches_of).sum()
    }

    /// CPU seconds of the failure detector's threads, all processes.
    fn detector_cpu(&self) -> f64 {
        self.procs
            .iter()
            .map(|p| procs::detector_cpu_seconds(p.pid()))
            .sum()
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
struct Point {
    contender: Contender,
    round: usize,
    offered: u32,
    /// Good answers (not errors) within the load's duration, per second.
    achieved: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// CPU seconds per million answers, per server process (name, s).
    cpu_per_million: Vec<(String, f64)>,
    /// Of that, the failure detector's threads (all processes; surelink
    /// only).
    detector_cpu_per_million: f64,
    /// Context switches of all its server processes per answer: on two
    /// shared cores (and in a VM, where a switch is dear) what a server
    /// costs beyond its own instructions.
    switches_per_request: f64,
}

fn memcached_bin() -> Option<PathBuf> {
    find_program("memcached", &["/usr/bin", "/usr/local/bin"])
}

fn nutcracker_bin() -> Option<PathBuf> {
    find_program("nutcracker", &["/usr/sbin", "/usr/local/sbin"])
}

/// A memcached on a free port of 127.0.0.1, its log `name.log` in `dir`.
fn local_memcached(dir: &Path, name: &str, procs: &mut Vec<Proc>) -> Result<SocketAddr> {
    let bin = memcached_bin().context("memcached not installed (apt-get install memcached)")?;
    let port = procs::free_port("127.0.0.1")?;
    procs.push(procs::memcached(
        &bin,
        "127.0.0.1",
        port,
        None,
        &dir.join(format!("{name}.log")),
    )?);
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

async fn start(c: Contender, dir: &Path, tuned: &str) -> Result<Running> {
    let dir = dir.join(format!("{c:?}").to_lowercase());
    std::fs::create_dir_all(&dir)?;
    let mut procs = Vec::new();
    let addr: SocketAddr;
    match c {
        Contender::Memcached => {
            addr = local_memcached(&dir, "memcached", &mut procs)?;
        }
        Contender::Nutcracker => {
            let mut servers = Vec::new();
            for i in 0..3 {
                servers.push(local_memcached(&dir, &format!("memcached{i}"), &mut procs)?);
            }
            let port = procs::free_port("127.0.0.1")?;
            addr = SocketAddr::from(([127, 0, 0, 1], port));
            let bin = nutcracker_bin()
                .context("nutcracker not installed (apt-get install nutcracker)")?;
            procs.push(procs::nutcracker(&bin, &dir, addr, &servers, None)?);
        }
        Contender::Surelink | Contender::SurelinkReplicated | Contender::SurelinkMemcached => {
            let mut nodes = Vec::new();
            for id in 1..=3u8 {
                let ips = [
                    format!("127.0.1.{}", 20 + id),
                    format!("127.0.2.{}", 20 + id),
                ];
                let port = procs::free_port(&ips[0])?;
                let listen = [
                    format!("{}:{port}", ips[0]).parse()?,
                    format!("{}:{port}", ips[1]).parse()?,
                ];
                let backend = if c == Contender::SurelinkMemcached {
                    Some(local_memcached(
                        &dir,
                        &format!("memcached{id}"),
                        &mut procs,
                    )?)
                } else {
                    None
                };
                nodes.push(NodeSpec {
                    id: u64::from(id),
                    listen,
                    backend,
                });
            }
            let port = procs::free_port("127.0.0.1")?;
            addr = SocketAddr::from(([127, 0, 0, 1], port));
            let replicas = if c == Contender::SurelinkReplicated {
                2
            } else {
                1
            };
            let (node_files, proxy_file) = procs::surelink_configs(
                &dir,
                &nodes,
                addr,
                ["127.0.1.20", "127.0.2.20"],
                replicas,
                tuned,
            )?;
            // memcached listens before the nodes connect to it.
            tokio::time::sleep(Duration::from_millis(200)).await;
            procs.extend(procs::spawn_surelink(
                &dir,
                &node_files,
                &proxy_file,
                None,
                None,
            )?);
        }
    }
    procs::wait_ready(addr, &procs, Duration::from_secs(20))
        .await
        .with_context(|| format!("{} did not come up (logs in {})", c.label(), dir.display()))?;
    Ok(Running { addr, procs })
}

/// Runs one measurement against `r`.
async fn measure(
    args: &CacheBenchArgs,
    c: Contender,
    r: &Running,
    offered: u32,
    round: usize,
) -> Result<Point> {
    let duration = Duration::from_secs_f64(args.seconds);
    let cfg = LoadConfig {
        addrs: vec![r.addr],
        rate: f64::from(offered),
        duration,
        connections: args.connections,
        keys: args.keys,
        zipf: 0.99,
        get_share: 0.9,
        value_size: 64,
        seed: 1 + round as u64,
        drain: Duration::from_secs(3),
        hot: None,
    };
    procs::wait_serving(r.addr, Duration::from_secs(10))
        .await
        .with_context(|| format!("{} did not serve again after the last load", c.label()))?;
    let mut load = Load::connect(cfg).await?;
    load.preload().await?;
    let cpu0 = r.cpu();
    let det0 = r.detector_cpu();
    let sw0 = r.switches();
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let samples = load.run(start, Arc::new(Progress::default())).await;
    let cpu1 = r.cpu();
    let det1 = r.detector_cpu();
    let sw1 = r.switches();
    let (achieved, p50, p99, errors) = summarize(&samples, duration)?;
    let answered = samples
        .iter()
        .filter(|s| s.done_ns != u64::MAX)
        .count()
        .max(1) as f64;
    let cpu_per_million = r
        .procs
        .iter()
        .zip(cpu0.iter().zip(&cpu1))
        .map(|(p, (a, b))| (p.name().to_string(), (b - a) / answered * 1e6))
        .collect();
    Ok(Point {
        contender: c,
        round,
        offered,
        achieved,
        p50_ms: p50,
        p99_ms: p99,
        errors,
        cpu_per_million,
        detector_cpu_per_million: (det1 - det0) / answered * 1e6,
        switches_per_request: sw1.saturating_sub(sw0) as f64 / answered,
    })
}

/// Throughput (good answers — stored, hit, miss — within `duration` of
/// the start), p50 and p99 of every answered request (ms), errors (error
/// replies, unanswered, wrong values).
fn summarize(samples: &[Sample], duration: Duration) -> Result<(f64, f64, f64, u64)> {
    let end = u64::try_from(duration.as_nanos())?;
    let mut h = Histogram::<u64>::new(3)?;
    let mut done = 0u64;
    let mut errors = 0u64;
    for s in samples {
        // Throughput counts good answers only: an error reply is fast but
        // is not service.
        let good = matches!(
            s.outcome,
            Outcome::Stored | Outcome::Hit | Outcome::Miss { .. }
        );
        if s.done_ns <= end && good {
            done += 1;
        }
        if let Some(l) = s.latency_us() {
            h.record(l.max(1))?;
        }
        if s.outcome.is_error() || matches!(s.outcome, Outcome::Stale | Outcome::Wrong) {
            errors += 1;
        }
    }
    let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
    Ok((
        done as f64 / duration.as_secs_f64(),
        q(0.5),
        q(0.99),
        errors,
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(crate) async fn run(args: &CacheBenchArgs) -> Result<()> {
    anyhow::ensure!((1..=100).contains(&args.rounds), "--rounds must be 1..=100");
    anyhow::ensure!(
        args.seconds.is_finite() && (0.1..=600.0).contains(&args.seconds),
        "--seconds must be between 0.1 and 600"
    );
    anyhow::ensure!(
        !args.rates.is_empty() && args.rates.iter().all(|r| *r > 0),
        "--rates must be positive"
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!("surelink bench cache: 64 B values, 90 % get / 10 % set, {} keys (Zipf 0.99), {} client connections, open loop, {} s per point, {} rounds", args.keys, args.connections, args.seconds, args.rounds);
    println!("  client and every server share this machine's {cores} cores: compare CPU seconds per million requests too");
    if !args.surelink_tuned.trim().is_empty() {
        println!(
            "  TUNED: every surelink configuration adds {:?} (not the defaults)",
            args.surelink_tuned
        );
    }
    let mut points = Vec::new();
    if !args.failure_only && !args.kill_only {
        let mut contenders: Vec<Contender> = if args.only.is_empty() {
            vec![
                Contender::Memcached,
                Contender::Nutcracker,
                Contender::Surelink,
                Contender::SurelinkReplicated,
                Contender::SurelinkMemcached,
            ]
        } else {
            args.only.clone()
        };
        contenders.retain(|c| {
            let missing = match c {
                Contender::Memcached | Contender::SurelinkMemcached => {
                    memcached_bin().is_none().then_some("memcached")
                }
                Contender::Nutcracker => (memcached_bin().is_none() || nutcracker_bin().is_none())
                    .then_some("memcached and nutcracker"),
                Contender::Surelink | Contender::SurelinkReplicated => None,
            };
            if let Some(m) = missing {
                println!("  SKIPPED {}: {m} not installed", c.label());
            }
            missing.is_none()
        });
        let mut running = Vec::new();
        for &c in &contenders {
            eprintln!("  starting {} ...", c.label());
            running.push((c, start(c, &args.out, &args.surelink_tuned).await?));
        }
        let total = args.rounds * args.rates.len() * running.len();
        let mut k = 0;
        for round in 0..args.rounds {
            for &rate in &args.rates {
                for i in 0..running.len() {
                    let (c, r) = &running[(i + round) % running.len()];
                    k += 1;
                    eprint!(
                        "\r  [{k}/{total}] round {} {:>7} req/s {:<34}",
                        round + 1,
                        rate,
                        c.label()
                    );
                    let p = measure(args, *c, r, rate, round).await?;
                    points.push(p);
                }
            }
        }
        eprintln!();
        report(args, &contenders, &points);
    }
    let failure = if args.failure || args.failure_only {
        Some(failure::run(&args.out).await?)
    } else {
        None
    };
    let kill = if args.kill || args.kill_only {
        Some(kill::run(&args.out).await?)
    } else {
        None
    };
    let json = serde_json::json!({
        "cores": cores,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "connections": args.connections,
        "keys": args.keys,
        "surelink_tuned": args.surelink_tuned,
        "points": points,
        "failure": failure,
        "kill": kill,
    });
    let path = args.out.join("cache.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&json)?)?;
    println!("  raw figures: {}", path.display());
    Ok(())
}

fn report(args: &CacheBenchArgs, contenders: &[Contender], points: &[Point]) {
    println!();
    println!(
        "  {:<34} {:>9} {:>11} {:>9} {:>9} {:>7} {:>12} {:>13} {:>11}",
        "contender",
        "offered",
        "good ans/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "CPU s/M req",
        "of it detector",
        "ctx sw/req"
    );
    let mut sat: Vec<(Contender, f64)> = Vec::new();
    for &c in contenders {
        let mut best: f64 = 0.0;
        for &rate in &args.rates {
            let ps: Vec<&Point> = points
                .iter()
                .filter(|p| p.contender == c && p.offered == rate)
                .collect();
            if ps.is_empty() {
                continue;
            }
            let achieved = median(ps.iter().map(|p| p.achieved).collect());
            best = best.max(achieved);
            let cpu: f64 = median(
                ps.iter()
                    .map(|p| p.cpu_per_million.iter().map(|(_, s)| s).sum())
                    .collect(),
            );
            let detector = if matches!(
                c,
                Contender::Surelink | Contender::SurelinkReplicated | Contender::SurelinkMemcached
            ) {
                format!(
                    "{:.2}",
                    median(ps.iter().map(|p| p.detector_cpu_per_million).collect())
                )
            } else {
                "-".to_string()
            };
            println!(
                "  {:<34} {:>9} {:>11.0} {:>9.3} {:>9.3} {:>7} {:>12.2} {:>13} {:>11.2}",
                c.label(),
                rate,
                achieved,
                median(ps.iter().map(|p| p.p50_ms).collect()),
                median(ps.iter().map(|p| p.p99_ms).collect()),
                ps.iter().map(|p| p.errors).sum::<u64>(),
                cpu,
                detector,
                median(ps.iter().map(|p| p.switches_per_request).collect()),
            );
        }
        sat.push((c, best));
    }
    println!();
    for (c, s) in &sat {
        println!(
            "  saturation {:<34} {:>9.0} good answers/s (median of rounds, best offered load)",
            c.label(),
            s
        );
    }
    let get = |c: Contender| sat.iter().find(|(x, _)| *x == c).map(|(_, s)| *s);
    if let (Some(s), Some(n)) = (get(Contender::Surelink), get(Contender::Nutcracker)) {
        println!(
            "  surelink / nutcracker at saturation: {:.2}x (target >= 1)",
            s / n
        );
        for &rate in &args.rates {
            let p99 = |c: Contender| {
                median(
                    points
                        .iter()
                        .filter(|p| p.contender == c && p.offered == rate)
                        .map(|p| p.p99_ms)
                        .collect(),
                )
            };
            let (a, b) = (p99(Contender::Surelink), p99(Contender::Nutcracker));
            if a.is_finite() && b.is_finite() {
                println!(
                    "  p99 at {rate:>7} req/s: surelink {a:.3} ms, nutcracker {b:.3} ms ({:.2}x)",
                    a / b
                );
            }
        }
    }
}
