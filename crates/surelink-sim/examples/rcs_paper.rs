//! The recovery-conscious scheduling experiment (FAST '08, §5) on the
//! simulator: each mapping on the good path and with 5 % recovery
//! overhead in one group; prints a table beside the paper's figures.
//!
//! `cargo run --release -p surelink-sim --example rcs_paper [-- SECONDS [SIGMA]]`
//! (SIGMA: every group's bound under the dynamic mappings, a tuning;
//! default the core's, half the workers).

use std::time::Duration;

use surelink_proto::rpc::recovery::Mapping;
use surelink_sim::rcs::RcsScenario;

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let sigma: Option<usize> = std::env::args().nth(2).and_then(|s| s.parse().ok());
    let mappings = [
        ("performance-oriented", Mapping::PerformanceOriented),
        ("static", Mapping::Static),
        ("partially dynamic", Mapping::PartiallyDynamic),
        ("dynamic", Mapping::Dynamic),
    ];
    println!(
        "{:<22} {:>5} {:>12} {:>10} {:>10} {:>14} {:>12}",
        "scheduler", "path", "k tasks/s", "mean ms", "p99 ms", "healthy p99", "recoveries"
    );
    for bad in [false, true] {
        for (name, m) in mappings {
            let mut s = RcsScenario::paper(m, bad);
            s.run_for = Duration::from_secs(secs);
            s.sigma = sigma;
            let o = s.run();
            println!(
                "{:<22} {:>5} {:>12.1} {:>10.2} {:>10.2} {:>14.2} {:>12}",
                name,
                if bad { "bad" } else { "good" },
                o.throughput / 1000.0,
                o.mean.as_secs_f64() * 1e3,
                o.p99.as_secs_f64() * 1e3,
                o.healthy_p99.as_secs_f64() * 1e3,
                o.recoveries
            );
        }
    }
}
