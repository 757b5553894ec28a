//! Role-server failover through real endpoints, measured: the embedded
//! role service (its own failover, the baseline) and the etcd backend
//! (leader killed; leader cut off from etcd), in one run.
//!
//! ```sh
//! cargo run --release --manifest-path crates/surelink-role-etcd/Cargo.toml --example nodes_failover -- [--rounds N]
//! ```
//!
//! Each round builds three endpoints on loopback (two networks, the
//! product's defaults, candidates 1 and 2, node 1 serving), runs calls
//! from node 3 to node 2 every millisecond, strikes node 1, and measures
//! the time until node 3 holds the next role server's table (see
//! `surelink_role_etcd::testing::failover_round`). Over all rounds it
//! counts calls lost (failed or wrong body) and doubled (executions ≠
//! successes), and rounds where node 3 applied a table out of order.
//! The faults take turns, so drift on a shared machine touches each alike.

use std::time::Duration;

use surelink_role_etcd::testing::{failover_round, EtcdProcess, Fault, SKIPPED};

#[derive(Default)]
struct Tally {
    took: Vec<Duration>,
    ok: u64,
    lost: u64,
    doubled: u64,
    out_of_order: u64,
    errors: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `num/den` quantile (nearest rank).
fn pct(v: &[Duration], num: usize, den: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    let i = (v.len().saturating_sub(1) * num).div_ceil(den);
    v.get(i).copied().unwrap_or_default()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut rounds = 10usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--rounds", Some(n)) if n > 0 => rounds = n,
            _ => {
                eprintln!("usage: nodes_failover [--rounds N]");
                std::process::exit(2);
            }
        }
    }
    let etcd = match EtcdProcess::start().await {
        Ok(Some(e)) => e,
        Ok(None) => {
            println!("{SKIPPED}");
            return;
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let faults = [Fault::EmbeddedKill, Fault::EtcdKill, Fault::EtcdCut];
    let mut tally: Vec<Tally> = faults.iter().map(|_| Tally::default()).collect();
    for round in 1..=rounds {
        for (i, f) in faults.iter().enumerate() {
            let t = &mut tally[i];
            match failover_round(Some(&etcd), *f, 100).await {
                Ok(r) => {
                    eprintln!(
                        "round {round}/{rounds} {f:?}: {:.0} ms, epochs {:?}, calls {} ok {} failed {} executed, tables in order: {}",
                        ms(r.took), r.epochs, r.calls_ok, r.calls_failed, r.executed, r.in_order()
                    );
                    t.took.push(r.took);
                    t.ok += r.calls_ok;
                    t.lost += r.calls_failed;
                    t.doubled += r.executed.saturating_sub(r.calls_ok);
                    t.out_of_order += u64::from(!r.in_order());
                }
                Err(e) => {
                    eprintln!("round {round}/{rounds} {f:?}: FAILED: {e}");
                    t.errors += 1;
                }
            }
        }
    }
    println!("\nrole-server failover through real endpoints ({rounds} rounds each; fault -> node 3 holds the next role server's table)");
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>6} {:>8} {:>12} {:>7}",
        "fault", "p50 ms", "max ms", "calls", "lost", "doubled", "out of order", "failed"
    );
    let names = [
        "embedded: role server killed (baseline)",
        "etcd: leader killed",
        "etcd: leader cut off from etcd",
    ];
    for (name, t) in names.iter().zip(&tally) {
        println!(
            "{name:<44} {:>9.0} {:>9.0} {:>9} {:>6} {:>8} {:>12} {:>7}",
            ms(pct(&t.took, 1, 2)),
            ms(pct(&t.took, 1, 1)),
            t.ok,
            t.lost,
            t.doubled,
            t.out_of_order,
            t.errors
        );
    }
    let base = ms(pct(&tally[0].took, 1, 2));
    if base > 0.0 {
        println!(
            "p50 ratio to the embedded baseline: leader killed {:.2}, cut off {:.2}",
            ms(pct(&tally[1].took, 1, 2)) / base,
            ms(pct(&tally[2].took, 1, 2)) / base
        );
    }
    let bad: u64 = tally
        .iter()
        .map(|t| t.lost + t.doubled + t.out_of_order + t.errors)
        .sum();
    if bad > 0 {
        std::process::exit(1);
    }
}
