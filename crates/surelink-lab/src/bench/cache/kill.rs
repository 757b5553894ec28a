//! The kill row of `bench cache` (`--kill`): one cache server's process
//! SIGKILLed under load — nutcracker's second memcached, or the second
//! surelink node, with one replica per key (the product's default) and
//! with two (`[proxy] replicas = 2`). Every server has its defaults but
//! that one setting; client and servers share this machine's cores.
//!
//! Reported per contender (medians of the rounds): misses of keys the load
//! had set, answered after the kill (each one a load on the database
//! behind a cache), errors (error replies, unanswered, stale or wrong
//! values), and the longest time without a good answer.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::{median, start, Contender};
use crate::memload::{Load, LoadConfig, Outcome, Progress};

const RATE: f64 = 20_000.0;
const SECONDS: u64 = 8;
const KILL_AT: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;

/// What one round saw.
#[derive(Clone, Debug, Serialize)]
struct Seen {
    requests: u64,
    misses_after_kill: u64,
    errors: u64,
    longest_gap_ms: f64,
}

pub(super) async fn run(out: &Path) -> Result<serde_json::Value> {
    let dir = out.join("kill");
    std::fs::create_dir_all(&dir)?;
    let mut contenders = vec![Contender::Surelink, Contender::SurelinkReplicated];
    if super::nutcracker_bin().is_some() && super::memcached_bin().is_some() {
        contenders.insert(0, Contender::Nutcracker);
    } else {
        println!("  SKIPPED nutcracker in the kill row: memcached and nutcracker not installed");
    }
    println!();
    println!(
        "  kill row: {RATE} req/s for {SECONDS} s, one server process SIGKILLed {KILL_AT:?} in (nutcracker's second memcached; surelink's node 2); {ROUNDS} rounds, defaults but replicas"
    );
    let mut rows: Vec<(Contender, Vec<Seen>)> =
        contenders.iter().map(|&c| (c, Vec::new())).collect();
    for round in 0..ROUNDS {
        for (c, seen) in &mut rows {
            let running = start(*c, &dir, "").await?;
            let s = one(&running, round)
                .await
                .with_context(|| format!("{}, round {}", c.label(), round + 1))?;
            eprintln!(
                "  round {} {:<40}: misses after the kill {}, errors {}, longest gap {:.1} ms",
                round + 1,
                c.label(),
                s.misses_after_kill,
                s.errors,
                s.longest_gap_ms
            );
            seen.push(s);
            drop(running);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    println!();
    println!(
        "  {:<40} {:>20} {:>8} {:>16}",
        "contender", "misses after kill", "errors", "longest gap ms"
    );
    let mut json = Vec::new();
    for (c, seen) in &rows {
        let med = |f: fn(&Seen) -> f64| median(seen.iter().map(f).collect());
        let (m, e, g) = (
            med(|s| s.misses_after_kill as f64),
            med(|s| s.errors as f64),
            med(|s| s.longest_gap_ms),
        );
        println!("  {:<40} {m:>20.0} {e:>8.0} {g:>16.1}", c.label());
        json.push(serde_json::json!({ "contender": c, "rounds": seen }));
    }
    Ok(serde_json::Value::Array(json))
}

async fn one(r: &super::Running, round: usize) -> Result<Seen> {
    let duration = Duration::from_secs(SECONDS);
    let cfg = LoadConfig {
        addrs: vec![r.addr],
        rate: RATE,
        duration,
        connections: 8,
        keys: 10_000,
        zipf: 0.99,
        get_share: 0.9,
        value_size: 64,
        seed: 100 + round as u64,
        drain: Duration::from_secs(5),
        hot: None,
    };
    let mut load = Load::connect(cfg).await?;
    load.preload().await?;
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let victim = r.procs.get(1).context("no second server process")?;
    let kill_ns = u64::try_from(KILL_AT.as_nanos())?;
    let killer = async {
        tokio::time::sleep_until(start + KILL_AT).await;
        victim.kill();
    };
    let (samples, ()) = tokio::join!(load.run(start, Arc::new(Progress::default())), killer);
    let end = u64::try_from(duration.as_nanos())?;
    let gap = super::failure::longest_gap_ns(&samples, end);
    Ok(Seen {
        requests: samples.len() as u64,
        misses_after_kill: samples
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Miss { known: true }) && s.done_ns >= kill_ns)
            .count() as u64,
        errors: samples
            .iter()
            .filter(|s| {
                s.outcome.is_error() || matches!(s.outcome, Outcome::Stale | Outcome::Wrong)
            })
            .count() as u64,
        longest_gap_ms: gap as f64 / 1e6,
    })
}
