//! The failure row of `bench cache`, on the netns testbed (root): three
//! cache servers on host b, the proxy and the client on host a, and link 1
//! down for 3 s in the middle of an open-loop load.
//!
//! - nutcracker (host a) in front of three memcached (host b) reached
//!   over link 1 — it has one address per server — with its README's
//!   failure settings (`auto_eject_hosts`, `timeout: 400`,
//!   `server_failure_limit: 1`, `server_retry_timeout: 2000`);
//! - `surelink cache proxy` (host a) in front of three `surelink cache
//!   node`s (host b) over both links, defaults.
//!
//! The client runs inside host a (`surelink-lab bench-cache-client`, a child
//! process) and reports errors, the longest time without an answer, and
//! the slowest answer.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use surelink_lab::child::{Command, Output};

use super::procs::{self, NodeSpec, Proc};
use crate::memload::{Load, LoadConfig, Outcome, Progress};
use crate::testbed::{self, Fault, ADDRS, HOSTS};

/// Offered load of the failure row, requests per second.
const RATE: u32 = 10_000;
/// Seconds of load; the link goes down 2 s in, for 3 s.
const SECONDS: u64 = 8;
const FAULT_AT: Duration = Duration::from_secs(2);
const FAULT_FOR: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;

/// What one run saw (from the client).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Seen {
    requests: u64,
    errors: u64,
    /// The longest stretch without a good answer (error replies do not
    /// count), ms.
    longest_gap_ms: f64,
    /// The slowest answer (from its scheduled time), ms.
    max_latency_ms: f64,
    /// The slowest answer among requests scheduled outside the fault, ms.
    max_latency_outside_ms: f64,
    /// The first error reply, if any.
    first_error: Option<String>,
}

/// Arguments of the hidden client subcommand.
#[derive(Args, Debug)]
pub(crate) struct ClientArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long)]
    rate: u32,
    #[arg(long)]
    seconds: u64,
    /// When the fault starts and how long it lasts (ms after the start),
    /// to tell answers outside it apart.
    #[arg(long)]
    fault_ms: u64,
    #[arg(long)]
    fault_for_ms: u64,
}

/// `surelink-lab bench-cache-client`: waits until `addr` stores a value,
/// preloads, prints `START` when the schedule begins, runs it, and prints
/// a JSON line of what it saw.
pub(crate) async fn client(a: &ClientArgs) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let none: [Proc; 0] = [];
    procs::wait_ready(a.addr, &none, deadline - std::time::Instant::now()).await?;
    let cfg = LoadConfig {
        addrs: vec![a.addr],
        rate: f64::from(a.rate),
        duration: Duration::from_secs(a.seconds),
        connections: 8,
        keys: 10_000,
        zipf: 0.99,
        get_share: 0.9,
        value_size: 64,
        seed: 3,
        drain: Duration::from_secs(10),
        hot: None,
    };
    // The check above reached one server behind the proxy; the preload
    // reaches all of them, and one may still be starting (nutcracker then
    // answers errors and ejects it for a while): try again, afresh.
    let load = loop {
        let mut load = Load::connect(cfg.clone()).await?;
        match load.preload().await {
            Ok(_) => break load,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("  (client: preload failed, retrying: {e:#})");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.context("preload")),
        }
    };
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    println!("START");
    let progress = Arc::new(Progress::default());
    let samples = load.run(start, progress.clone()).await;
    let end = a.seconds * 1_000_000_000;
    let gap = longest_gap_ns(&samples, end);
    let (f0, f1) = (
        a.fault_ms * 1_000_000,
        (a.fault_ms + a.fault_for_ms) * 1_000_000,
    );
    let lat = |outside: bool| {
        samples
            .iter()
            .filter(|s| !outside || !(f0..f1).contains(&s.sched_ns))
            .filter_map(crate::memload::Sample::latency_us)
            .max()
            .unwrap_or(0) as f64
            / 1000.0
    };
    let seen = Seen {
        requests: samples.len() as u64,
        errors: samples
            .iter()
            .filter(|s| {
                s.outcome.is_error() || matches!(s.outcome, Outcome::Stale | Outcome::Wrong)
            })
            .count() as u64,
        longest_gap_ms: gap as f64 / 1e6,
        max_latency_ms: lat(false),
        max_latency_outside_ms: lat(true),
        first_error: progress.first_error(),
    };
    println!("{}", serde_json::to_string(&seen)?);
    Ok(())
}

/// Removes the testbed when dropped.
struct Testbed;

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Err(e) = testbed::down() {
            eprintln!("warning: removing the testbed: {e:#}");
        }
    }
}

/// Runs the failure row; `null` when it cannot run here (said so).
pub(super) async fn run(out: &Path) -> Result<serde_json::Value> {
    if let Some(why) = testbed::unavailable() {
        println!("  SKIPPED failure row: {why}");
        return Ok(serde_json::Value::Null);
    }
    let (Some(mc), Some(nc)) = (super::memcached_bin(), super::nutcracker_bin()) else {
        println!("  SKIPPED failure row: needs memcached and nutcracker (apt-get install memcached nutcracker)");
        return Ok(serde_json::Value::Null);
    };
    let dir = out.join("failure");
    std::fs::create_dir_all(&dir)?;
    println!();
    println!(
        "  failure row (netns testbed, defaults): {RATE} req/s for {SECONDS} s, link 1 down from {FAULT_AT:?} for {FAULT_FOR:?}; {ROUNDS} rounds"
    );
    let mut rows: Vec<(&str, Vec<Seen>)> =
        vec![("nutcracker", Vec::new()), ("surelink", Vec::new())];
    for round in 0..ROUNDS {
        for (name, seen) in &mut rows {
            testbed::up().context("building the testbed")?;
            let _tb = Testbed;
            let (procs, addr) = if *name == "nutcracker" {
                start_nutcracker(&mc, &nc, &dir)?
            } else {
                start_surelink(&dir)?
            };
            let s = one(addr, procs)
                .await
                .with_context(|| format!("{name}, round {}", round + 1))?;
            eprintln!(
                "  round {} {name:<10}: errors {}, longest gap {:.1} ms, slowest answer {:.1} ms ({:.1} ms outside the fault){}",
                round + 1,
                s.errors,
                s.longest_gap_ms,
                s.max_latency_ms,
                s.max_latency_outside_ms,
                s.first_error
                    .as_ref()
                    .map(|e| format!(" (first error: {e})"))
                    .unwrap_or_default()
            );
            seen.push(s);
        }
    }
    println!(
        "  {:<12} {:>10} {:>16} {:>18}",
        "contender", "errors", "longest gap ms", "slowest answer ms"
    );
    for (name, seen) in &rows {
        let med = |f: fn(&Seen) -> f64| super::median(seen.iter().map(f).collect());
        println!(
            "  {:<12} {:>10} {:>16.1} {:>18.1}   (medians of {ROUNDS}; errors summed)",
            name,
            seen.iter().map(|s| s.errors).sum::<u64>(),
            med(|s| s.longest_gap_ms),
            med(|s| s.max_latency_ms)
        );
    }
    Ok(serde_json::to_value(
        rows.iter()
            .map(|(n, s)| ((*n).to_string(), s.clone()))
            .collect::<std::collections::BTreeMap<_, _>>(),
    )?)
}

fn start_nutcracker(mc: &Path, nc: &Path, dir: &Path) -> Result<(Vec<Proc>, SocketAddr)> {
    let mut procs = Vec::new();
    let mut servers = Vec::new();
    for i in 0..3u16 {
        let port = 11211 + i;
        procs.push(procs::memcached(
            mc,
            "0.0.0.0",
            port,
            Some(HOSTS[1]),
            &dir.join(format!("memcached{i}.log")),
        )?);
        servers.push(format!("{}:{port}", ADDRS[1][0]).parse()?);
    }
    let addr: SocketAddr = "127.0.0.1:22121".parse()?;
    procs.push(procs::nutcracker(nc, dir, addr, &servers, Some(HOSTS[0]))?);
    Ok((procs, addr))
}

fn start_surelink(dir: &Path) -> Result<(Vec<Proc>, SocketAddr)> {
    let nodes: Vec<NodeSpec> = (1..=3u16)
        .map(|id| {
            Ok(NodeSpec {
                id: u64::from(id),
                listen: [
                    format!("{}:{}", ADDRS[1][0], 7200 + id).parse()?,
                    format!("{}:{}", ADDRS[1][1], 7200 + id).parse()?,
                ],
                backend: None,
            })
        })
        .collect::<Result<_>>()?;
    let addr: SocketAddr = "127.0.0.1:22122".parse()?;
    let (files, proxy) = procs::surelink_configs(
        &dir.join("surelink"),
        &nodes,
        addr,
        [ADDRS[0][0], ADDRS[0][1]],
        1,
        "",
    )?;
    let procs = procs::spawn_surelink(dir, &files, &proxy, Some(HOSTS[1]), Some(HOSTS[0]))?;
    Ok((procs, addr))
}

/// One run: the client in host a, link 1 down at its time.
async fn one(addr: SocketAddr, procs: Vec<Proc>) -> Result<Seen> {
    let me = std::env::current_exe()?;
    let client = Command::new("the client in host a", &me)
        .netns(Some(HOSTS[0]))
        .args([
            "bench-cache-client",
            "--addr",
            &addr.to_string(),
            "--rate",
            &RATE.to_string(),
            "--seconds",
            &SECONDS.to_string(),
            "--fault-ms",
            &FAULT_AT.as_millis().to_string(),
            "--fault-for-ms",
            &FAULT_FOR.as_millis().to_string(),
        ])
        .stdout(Output::Lines)
        .spawn()
        .context("starting the client in host a")?;
    let started = client
        .wait_for_async(Duration::from_secs(40), |_| true)
        .await;
    if started.is_none() && client.exited().is_none() {
        bail!("the client did not start within 40 s");
    }
    if started.as_deref() != Some("START") {
        for p in &procs {
            p.check()?;
        }
        bail!("the client did not start: {started:?}");
    }
    let t0 = tokio::time::Instant::now() + Duration::from_millis(50);
    tokio::time::sleep_until(t0 + FAULT_AT).await;
    testbed::inject(0, Fault::LinkDown, 0)?;
    tokio::time::sleep(FAULT_FOR).await;
    testbed::undo(0, Fault::LinkDown)?;
    let json = client
        .wait_for_async(Duration::from_secs(60), |l| l != "START")
        .await;
    let json = match json {
        Some(j) => j,
        None if client.exited().is_none() => bail!("the client did not finish"),
        None => bail!("the client printed no result"),
    };
    client.wait_or_kill(Duration::from_secs(60)).await;
    drop(procs);
    serde_json::from_str(&json).context("the client's result")
}

/// The longest time within `end` ns of the start without a good answer
/// (an error reply is not service).
pub(super) fn longest_gap_ns(samples: &[crate::memload::Sample], end: u64) -> u64 {
    let mut done: Vec<u64> = samples
        .iter()
        .filter(|s| {
            s.done_ns != u64::MAX
                && matches!(
                    s.outcome,
                    Outcome::Stored | Outcome::Hit | Outcome::Miss { .. }
                )
        })
        .map(|s| s.done_ns)
        .collect();
    done.sort_unstable();
    let (mut gap, mut prev) = (0u64, 0u64);
    for &t in done.iter().filter(|t| **t <= end) {
        gap = gap.max(t - prev);
        prev = t;
    }
    gap.max(end.saturating_sub(prev))
}
