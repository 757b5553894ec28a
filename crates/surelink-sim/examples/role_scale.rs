//! The embedded role server at 10, 100 and 1 000 nodes on the simulator
//! (see `surelink_sim::role_scale` for the model and `docs/role.md` for the
//! figures).
//!
//! ```sh
//! cargo run --release -p surelink-sim --example role_scale
//! cargo run --release -p surelink-sim --example role_scale -- --nodes 10,100,1000,2000 --link-gbps 1 --seconds 10 --seed 14
//! ```
//!
//! Each size runs twice: every row whole (the baseline, the protocol
//! before rows carried ring deltas) and as the product sends them (the
//! ring as changes to the one the node acknowledged); `--baseline off`
//! runs the product only.

// Command-line figures to integer settings.
#![allow(clippy::cast_possible_truncation)]

use std::time::Duration;

use surelink_sim::role_scale::{quantile, run_with_progress, ScaleConfig, ScaleReport};

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

fn row(r: &ScaleReport) -> String {
    let (cpu, cpu_max) = r.cpu_percent();
    let (_, busy_max) = r.busy_percent();
    let (up, up_max) = r.up_per_node();
    let (down, down_max) = r.down_per_node();
    let (times, never) = r.push_times(Duration::from_secs(1), r.simulated);
    let never = if never > 0 {
        format!(" ({never} never)")
    } else {
        String::new()
    };
    format!(
        "{:>6} {:>7.2} {:>7.2} {:>7.1} {:>8.0} {:>8.0} {:>9.0} {:>10.0} {:>9.2} {:>6} {:>8} {:>8}{never}",
        r.nodes,
        cpu,
        cpu_max,
        busy_max,
        up,
        up_max,
        down,
        down_max,
        r.server_out_max() as f64 / 1e6,
        times.len(),
        ms(quantile(&times, 0.5)),
        ms(times.last().copied()),
    )
}

fn detail(r: &ScaleReport, cfg: &ScaleConfig) {
    let c = &r.calls;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "  n={}: report {} × {:.2} µs (max {:.0}); ack {} × {:.2} µs; timeout {} × {:.2} µs; \
         first poll (recompute) {} × {:.1} µs (max {:.0}); push {} × {:.2} µs",
        r.nodes,
        c.report.calls,
        us(c.report.mean()),
        us(c.report.max),
        c.ack.calls,
        us(c.ack.mean()),
        c.timeout.calls,
        us(c.timeout.mean()),
        c.first_poll.calls,
        us(c.first_poll.mean()),
        us(c.first_poll.max),
        c.push.calls,
        us(c.push.mean()),
    );
    let (steady_up, steady_down) =
        r.per_node_between(Duration::from_secs(1), Duration::from_secs(2));
    println!(
        "  n={}: healthy 1–2 s: up {:.0} B/node/s, down {:.0} B/node/s; busiest node down {} B in 1 s; \
         queue max {} msgs, longest wait {:.2} ms; versions {} (final {}), live nodes holding it {}/{}; \
         nodes that avoided the deaf network {}; live nodes seeing the dead node down {}; decode errors {}",
        r.nodes,
        steady_up,
        steady_down,
        r.busiest_node_down,
        r.max_queue,
        r.max_queue_wait.as_secs_f64() * 1e3,
        r.changes.len(),
        r.final_version,
        r.holding_final,
        r.live,
        r.avoided_deaf,
        r.saw_death,
        r.decode_errors,
    );
    let sec = Duration::from_secs;
    println!(
        "  n={}: server CPU % of a core by phase: healthy 1–2 s {:.2}, one node deaf 3–4 s {:.2}, \
         after the death 9–10 s {:.2}",
        r.nodes,
        r.cpu_percent_between(sec(1), sec(2)),
        r.cpu_percent_between(sec(3), sec(4)),
        r.cpu_percent_between(sec(9), sec(10)),
    );
    let mut phases = vec![("start", Duration::ZERO, Duration::from_secs(1))];
    if let Some((on, off)) = cfg.deaf {
        phases.push(("deaf", on, off));
        phases.push(("heard again", off, off + Duration::from_secs(1)));
    }
    if let Some(d) = cfg.death {
        let dead = d + cfg.detector.timeout;
        phases.push(("death: paths down, then stale", d, dead));
        phases.push(("death: reported dead", dead, r.simulated));
    }
    let text: Vec<String> = phases
        .iter()
        .map(|(name, from, to)| {
            let (t, never) = r.push_times(*from, *to);
            format!(
                "{name} {} versions, p50 {} max {} ms{}",
                t.len() + never,
                ms(quantile(&t, 0.5)),
                ms(t.last().copied()),
                if never > 0 {
                    format!(", {never} never reached everyone")
                } else {
                    String::new()
                }
            )
        })
        .collect();
    println!("  n={}: push times by cause: {}", r.nodes, text.join("; "));
    // The thread's CPU time is read from schedstat, exact only to a
    // scheduler tick: say nothing for short runs.
    let off = r
        .thread_cpu
        .filter(|_| r.wall >= Duration::from_secs(1))
        .map(|c| (100.0 * (1.0 - c.as_secs_f64() / r.wall.as_secs_f64())).max(0.0));
    println!(
        "  n={}: real {:.1} s{}",
        r.nodes,
        r.wall.as_secs_f64(),
        off.map_or(String::new(), |o| format!(
            ", off-CPU {o:.0} % of it (a busy machine: per-call times inflated by up to that)"
        )),
    );
}

fn main() {
    let mut nodes = vec![10usize, 100, 1000];
    let mut base = ScaleConfig::new(0);
    let mut baseline_too = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--nodes" => nodes = v.split(',').filter_map(|x| x.parse().ok()).collect(),
            "--seconds" => base.run = Duration::from_secs(v.parse().unwrap_or(10)),
            "--link-gbps" => {
                base.link_bits_per_sec = (v.parse::<f64>().unwrap_or(10.0) * 1e9) as u64;
            }
            "--send-us" => base.send_overhead = Duration::from_micros(v.parse().unwrap_or(5)),
            "--seed" => base.seed = v.parse().unwrap_or(14),
            "--baseline" => baseline_too = v != "off",
            _ => {
                eprintln!(
                    "usage: role_scale [--nodes 10,100,1000] [--seconds 10] [--link-gbps 10] [--send-us 5] [--seed 14] [--baseline on|off]"
                );
                std::process::exit(2);
            }
        }
    }
    println!(
        "role server on the simulator: {} s, 2 networks, refresh {:?}, reports stale after {:?}, \
         one-way {:?}, {:?} per write, {} Gb/s; faults: a node deaf on network 1 at 2–5 s, a node dead at 6 s",
        base.run.as_secs(),
        base.role.refresh,
        base.role.report_stale_after,
        base.one_way_delay,
        base.send_overhead,
        base.link_bits_per_sec as f64 / 1e9,
    );
    // Each size twice in this run: the baseline sends every row whole
    // (the ring in each), the product sends the ring's changes only.
    let modes: &[(&str, bool)] = if baseline_too {
        &[("whole", true), ("delta", false)]
    } else {
        &[("delta", false)]
    };
    let mut reports = Vec::new();
    for n in nodes {
        for &(mode, whole_rows) in modes {
            let cfg = ScaleConfig {
                nodes: n,
                whole_rows,
                ..base.clone()
            };
            let r = run_with_progress(cfg.clone(), &mut |p| {
                eprintln!(
                    "  n={n} ({mode} rows): {:>2} s simulated, {:.1} s real, version {}, {} queued",
                    p.simulated.as_secs(),
                    p.real.as_secs_f64(),
                    p.version,
                    p.queued
                );
            });
            println!("  n={n}, {mode} rows:");
            detail(&r, &cfg);
            reports.push((mode, r));
        }
    }
    println!();
    println!(
        "{:>9} {:>6} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>10} {:>9} {:>6} {:>8} {:>8}",
        "rows",
        "nodes",
        "cpu%",
        "cpu%max",
        "busy%mx",
        "up B/s",
        "up max",
        "down B/s",
        "down max",
        "out MB/s",
        "chg",
        "push p50",
        "push max"
    );
    for (mode, r) in &reports {
        println!("{mode:>9} {}", row(r));
    }
    if baseline_too {
        println!();
        println!("ring-delta rows vs whole rows, same run (ratio < 1: less):");
        for pair in reports.chunks(2) {
            let [(_, whole), (_, same)] = pair else {
                continue;
            };
            let push_max = |r: &ScaleReport| {
                r.push_times(Duration::from_secs(1), r.simulated)
                    .0
                    .last()
                    .map_or(f64::NAN, Duration::as_secs_f64)
            };
            println!(
                "  n={}: server bytes out in its busiest 1 s {:.3}, push max {:.3}, CPU busiest 1 s {:.3}",
                same.nodes,
                same.server_out_max() as f64 / whole.server_out_max().max(1) as f64,
                push_max(same) / push_max(whole),
                same.cpu_percent().1 / whole.cpu_percent().1,
            );
        }
    }
    println!(
        "(cpu% of one core: mean / busiest 1 s; busy%: CPU + modelled writes, busiest 1 s; \
         B/s per node (mean / busiest 1 s); out: the server's bytes out in its busiest 1 s; \
         chg: table versions after the first second; push: trigger to every live node holding it, ms)"
    );
}
