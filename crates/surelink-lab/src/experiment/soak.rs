//! `surelink-lab experiment soak --minutes N`: a sender streams one-way
//! messages (1/ms, with `send`, so every one counts) and calls (one per
//! 5 ms) to a receiver in another namespace while random faults hit both
//! links: link down, one-way and both-way drop, 10 % loss, connection
//! kill, blackhole route, each for 0.2–2.5 s, sometimes on both links at
//! once for at most 1 s. The receiver checks every message arrives
//! exactly once and in order and every call runs once, in order; the
//! sender that every call is answered. Any violation fails the run (exit
//! status 1). Needs root (see `surelink-lab testbed`).
//!
//! Both nodes run the product's default detector: paths fail over on a
//! 50 ms window (10 ms heartbeats), and the send slack (1.5 s) is longer
//! than any both-links outage here, so no fence is expected (a fence fails
//! the run): a sender that cannot get a heartbeat out on *any* link for
//! longer than its slack fences itself by design (SafeTimer) — the
//! detector experiment's subject, not this one's. The soak does not stop
//! or restart processes either. It reports call latency (from each call's
//! scheduled time) and fences.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use super::contenders::{strs, Bed};
use super::procs::NodeProc;
use crate::testbed::{self, Fault};

/// Arguments of `surelink-lab experiment soak`.
#[derive(Args, Debug, Clone)]
pub(crate) struct SoakArgs {
    /// How long to inject faults.
    #[arg(long, default_value_t = 2.0)]
    minutes: f64,
    /// Seed of the fault schedule (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Directory for soak.json.
    #[arg(long, default_value = "results/soak")]
    out: PathBuf,
    /// Blips instead of long faults (the schedule the failover targets are set on): a fault
    /// on either link every 50–500 ms, held 50–500 ms, and one step in
    /// five an outage of every link (both down or blackholed) for
    /// 50–300 ms. Reports whether p99.9 ≤ 50 ms and the slowest call ≤ the
    /// longest full outage + 100 ms.
    #[arg(long)]
    blips: bool,
    /// Data as heartbeats on both nodes (`true` or `false`; without it,
    /// the product's default).
    #[arg(long)]
    data_as_heartbeat: Option<bool>,
    /// The pace following answers on both nodes (ms, 0: off, the linger
    /// for every pair; `DetectorConfig::answer_grace`; without it, the
    /// product's default, 10 ms).
    #[arg(long)]
    answer_grace_ms: Option<u64>,
}

/// Whether `f` on a link stops all traffic on it both ways.
fn blocks_everything(f: Fault) -> bool {
    matches!(f, Fault::LinkDown | Fault::Blackhole | Fault::BothWays)
}

const FAULTS: [Fault; 6] = [
    Fault::LinkDown,
    Fault::OneWay,
    Fault::BothWays,
    Fault::Loss,
    Fault::Kill,
    Fault::Blackhole,
];

/// SplitMix64: a reproducible schedule from a printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let out = super::node::splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        out
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Undoes every fault on both networks (errors ignored: most are not set).
fn undo_all() {
    for net in 0..2 {
        for f in FAULTS {
            let _ = testbed::undo(net, f);
        }
    }
}

/// The nodes run the product's default detector (no settings given
/// unless data as heartbeats is chosen).
fn detector_args(args: &SoakArgs) -> Vec<String> {
    let mut a = strs(&["--quiet"]);
    if let Some(on) = args.data_as_heartbeat {
        a.extend(strs(&[
            "--data-as-heartbeat",
            if on { "true" } else { "false" },
        ]));
    }
    if let Some(g) = args.answer_grace_ms {
        a.extend(["--answer-grace-ms".to_string(), g.to_string()]);
    }
    a
}

fn last(p: &NodeProc, ev: &str) -> Value {
    p.events()
        .into_iter()
        .rev()
        .find(|v| v["ev"] == ev)
        .unwrap_or(Value::Null)
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Runs the soak.
pub(crate) async fn run(args: &SoakArgs) -> Result<()> {
    if !(args.minutes > 0.0 && args.minutes.is_finite()) {
        bail!("--minutes must be a positive number");
    }
    let seed = args.seed.unwrap_or_else(super::node::wall_us);
    let mut rng = Rng(seed);
    let _bed = Bed::up("soak", &args.out, false)?;
    let two = "10.77.1.2:7600,10.77.2.2:7600".to_owned();
    let mut ra = strs(&["--role", "receiver", "--local", &two]);
    ra.extend(detector_args(args));
    let (rx, _) = NodeProc::spawn_in(Some("sl-b"), "experiment-node", &ra)
        .await
        .context("starting the receiver")?;
    let mut sa = strs(&[
        "--role",
        "sender",
        "--local",
        "10.77.1.1:0,10.77.2.1:0",
        "--peer",
        &two,
        "--stream-ms",
        "1",
        "--calls-ms",
        "5",
        "--reliable",
    ]);
    sa.extend(detector_args(args));
    let (mut tx, _) = NodeProc::spawn_in(Some("sl-a"), "experiment-node", &sa)
        .await
        .context("starting the sender")?;
    if rx
        .wait_for(Duration::from_secs(10), |v| v["ev"] == "peer_up")
        .await
        .is_none()
    {
        bail!("the sender never connected");
    }
    println!(
        "soak: {:.1} min of random faults on both links, seed {seed} (rerun: --seed {seed})",
        args.minutes
    );
    let start = Instant::now();
    let start_wall = super::node::wall_us();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut schedule = Vec::new();
    let mut longest_outage = Duration::ZERO;
    while start.elapsed() < total {
        let net = usize::try_from(rng.below(2)).unwrap_or(0);
        let (fault, hold, other) = if args.blips {
            if rng.below(5) == 0 {
                // Every link at once: both down or blackholed.
                let blocking = [Fault::LinkDown, Fault::Blackhole];
                let f = blocking[usize::try_from(rng.below(2)).unwrap_or(0)];
                let g = blocking[usize::try_from(rng.below(2)).unwrap_or(0)];
                let d = rng.millis(50, 300);
                longest_outage = longest_outage.max(d);
                (f, d, Some((g, d)))
            } else {
                let f = FAULTS[usize::try_from(rng.below(6)).unwrap_or(0)];
                (f, rng.millis(50, 500), None)
            }
        } else {
            let fault = FAULTS[usize::try_from(rng.below(6)).unwrap_or(0)];
            let hold = rng.millis(200, 2500);
            // One step in five also faults the other link, for at most 1 s:
            // the session must ride out losing every path for a while (the
            // default send slack, 1.5 s, is longer: no fence).
            let other = (rng.below(5) == 0).then(|| {
                (
                    FAULTS[usize::try_from(rng.below(6)).unwrap_or(0)],
                    hold.min(rng.millis(200, 1000)),
                )
            });
            (fault, hold, other)
        };
        let r = last(&rx, "progress");
        println!(
            "[{:>6.1} s / {:.0} s] network {}: {fault:?} for {:.1} s{} — received {}, calls run {}, violations {}",
            start.elapsed().as_secs_f64(),
            total.as_secs_f64(),
            net + 1,
            hold.as_secs_f64(),
            other.map_or(String::new(), |(f, d)| format!(
                " + network {}: {f:?} for {:.1} s",
                2 - net,
                d.as_secs_f64()
            )),
            n(&r, "received"),
            n(&r, "requests"),
            n(&r, "violations") + n(&r, "duplicated") + n(&r, "reordered"),
        );
        schedule.push(
            json!({"t_s": start.elapsed().as_secs_f64(), "network": net + 1,
            "fault": fault, "hold_ms": hold.as_millis() as u64,
            "other": other.map(|(f, d)| json!({"fault": f, "hold_ms": d.as_millis() as u64}))}),
        );
        testbed::inject(net, fault, 10)?;
        if let Some((f, d)) = other {
            // Every link cut at once: the sender counts calls that overlap
            // it apart (their wait is the outage's, not failover's).
            let full = blocks_everything(fault) && blocks_everything(f);
            if full {
                tx.command("outage on").await?;
            }
            testbed::inject(1 - net, f, 10)?;
            tokio::time::sleep(d).await;
            testbed::undo(1 - net, f)?;
            if full {
                tx.command("outage off").await?;
            }
            tokio::time::sleep(hold.saturating_sub(d)).await;
        } else {
            tokio::time::sleep(hold).await;
        }
        testbed::undo(net, fault)?;
        let gap = if args.blips {
            rng.millis(50, 500)
        } else {
            rng.millis(200, 1000)
        };
        tokio::time::sleep(gap).await;
    }
    undo_all();
    // Stop sending, then wait until everything sent has arrived.
    tx.command("stop").await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut t, mut r);
    loop {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        t = last(&tx, "progress");
        r = last(&rx, "progress");
        let done = n(&r, "received") >= n(&t, "sent")
            && n(&t, "replies") + n(&t, "call_errors") >= n(&t, "calls");
        if done || Instant::now() >= deadline {
            break;
        }
    }
    let t_end = tx.quit().await;
    let r_end = rx.quit().await;
    let fin = |ev: &[Value]| {
        ev.iter()
            .rev()
            .find(|v| v["ev"] == "final")
            .cloned()
            .unwrap_or(Value::Null)
    };
    let (t, r) = (fin(&t_end), fin(&r_end));
    // What the detectors reported, for the report (and to explain a fence).
    let t0 = start_wall;
    let reports: Vec<Value> = t_end
        .iter()
        .map(|v| ("sender", v))
        .chain(r_end.iter().map(|v| ("receiver", v)))
        .filter(|(_, v)| {
            ["fenced", "peer_dead", "peer_alive", "session_ended", "path_silent"]
                .contains(&v["ev"].as_str().unwrap_or(""))
        })
        .map(|(who, v)| {
            json!({"node": who, "t_s": (super::procs::t(v) as f64 - t0 as f64) / 1e6, "event": v})
        })
        .collect();
    let fenced = t_end.iter().filter(|v| v["ev"] == "fenced").count();
    let send_errors = t_end.iter().filter(|v| v["ev"] == "send_error").count();
    let mut problems = Vec::new();
    if t.is_null() || r.is_null() {
        problems.push("a node did not report its final counts".to_owned());
    }
    if n(&r, "received") != n(&t, "sent") {
        problems.push(format!(
            "{} messages sent, {} received",
            n(&t, "sent"),
            n(&r, "received")
        ));
    }
    if n(&r, "violations") > 0 {
        problems.push(format!(
            "{} stream messages out of sequence (first: {})",
            n(&r, "violations"),
            r["first_violation"]
        ));
    }
    if n(&r, "epochs") > 1 || fenced > 0 {
        problems.push(format!(
            "the sender was fenced {fenced} time(s) ({} epochs seen)",
            n(&r, "epochs")
        ));
    }
    for (k, what) in [
        ("duplicated", "requests executed twice"),
        ("reordered", "requests executed out of order"),
    ] {
        if n(&r, k) > 0 {
            problems.push(format!("{} {what}", n(&r, k)));
        }
    }
    if n(&t, "replies") != n(&t, "calls") || n(&r, "requests") != n(&t, "calls") {
        problems.push(format!(
            "{} calls made, {} run, {} answered, {} failed",
            n(&t, "calls"),
            n(&r, "requests"),
            n(&t, "replies"),
            n(&t, "call_errors")
        ));
    }
    if n(&t, "wrong") > 0 || send_errors > 0 {
        problems.push(format!(
            "{} wrong replies, {send_errors} send errors",
            n(&t, "wrong")
        ));
    }
    let report = json!({
        "seed": seed, "minutes": args.minutes, "steps": schedule.len(),
        "sent": n(&t, "sent"), "received": n(&r, "received"),
        "calls": n(&t, "calls"), "replies": n(&t, "replies"),
        "requests_run": n(&r, "requests"), "problems": problems, "schedule": schedule,
        "call_latency_us": {"p50": n(&t, "call_p50_us"), "p99": n(&t, "call_p99_us"),
            "p999": n(&t, "call_p999_us"), "max": n(&t, "call_max_us")},
        "call_latency_with_a_path_us": {"p50": n(&t, "pathful_p50_us"), "p99": n(&t, "pathful_p99_us"),
            "p999": n(&t, "pathful_p999_us"), "max": n(&t, "pathful_max_us")},
        "calls_that_met_a_full_outage": n(&t, "outage_calls"),
        "their_wait_after_it_ended_us": {"p99": n(&t, "after_outage_p99_us"),
            "p999": n(&t, "after_outage_p999_us"), "max": n(&t, "after_outage_max_us")},
        "fences": fenced,
        "blips": args.blips,
        "longest_full_outage_ms": longest_outage.as_millis() as u64,
        "detector_reports": reports,
    });
    let path = args.out.join("soak.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!(
        "soak: {} fault steps; {} messages sent, {} received exactly once in order; {} calls, {} run once in order, {} answered; wrote {}",
        schedule.len(),
        n(&t, "sent"),
        n(&r, "received"),
        n(&t, "calls"),
        n(&r, "requests"),
        n(&t, "replies"),
        path.display()
    );
    let ms = |key: &str| n(&t, key) as f64 / 1e3;
    let latency = |prefix: &str| {
        format!(
            "p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
            ms(&format!("{prefix}_p50_us")),
            ms(&format!("{prefix}_p99_us")),
            ms(&format!("{prefix}_p999_us")),
            ms(&format!("{prefix}_max_us")),
        )
    };
    println!(
        "soak: call latency (from its scheduled time) {}; fences {fenced}",
        latency("call")
    );
    println!(
        "soak: calls that met no outage of every link: {}",
        latency("pathful")
    );
    if n(&t, "outage_calls") > 0 {
        println!(
            "soak: {} calls ({:.2} %) met an outage of every link; their replies came p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms after it ended",
            n(&t, "outage_calls"),
            100.0 * n(&t, "outage_calls") as f64 / n(&t, "calls").max(1) as f64,
            ms("after_outage_p99_us"),
            ms("after_outage_p999_us"),
            ms("after_outage_max_us"),
        );
    }
    // The slowest calls, and what the schedule was doing when they were made.
    let mut slow: Vec<&Value> = t_end.iter().filter(|v| v["ev"] == "slow_call").collect();
    slow.sort_by_key(|v| std::cmp::Reverse(n(v, "us")));
    for v in slow.iter().take(5) {
        let at = (n(v, "sent") as f64 - start_wall as f64) / 1e6;
        let step = schedule
            .iter()
            .rev()
            .find(|s| s["t_s"].as_f64().is_some_and(|t| t <= at));
        println!(
            "soak: slow call {} sent at {at:.2} s took {:.0} ms; last step before it: {}",
            n(v, "id"),
            n(v, "us") as f64 / 1e3,
            step.map_or("none".to_string(), ToString::to_string)
        );
    }
    // The slowest calls that met no outage of every link: failover's own
    // tail, with the steps around them.
    let full: Vec<(f64, f64)> = schedule
        .iter()
        .filter(|s| {
            let f = |v: &Value| {
                FAULTS
                    .iter()
                    .any(|&x| blocks_everything(x) && json!(x) == *v)
            };
            f(&s["fault"]) && s["other"]["fault"].as_str().is_some() && f(&s["other"]["fault"])
        })
        .filter_map(|s| {
            let t = s["t_s"].as_f64()?;
            Some((t, t + s["other"]["hold_ms"].as_f64()? / 1e3))
        })
        .collect();
    let mut shown = 0;
    for v in &slow {
        let at = (n(v, "sent") as f64 - start_wall as f64) / 1e6;
        let done = at + n(v, "us") as f64 / 1e6;
        if full.iter().any(|&(a, b)| a <= done && at <= b) || shown >= 3 {
            continue;
        }
        shown += 1;
        let near: Vec<&Value> = schedule
            .iter()
            .filter(|s| s["t_s"].as_f64().is_some_and(|t| t > at - 1.5 && t <= done))
            .collect();
        println!(
            "soak: slow call with a path {} sent at {at:.2} s took {:.0} ms; steps around it: {}",
            n(v, "id"),
            n(v, "us") as f64 / 1e3,
            serde_json::to_string(&near).unwrap_or_default()
        );
    }
    if args.blips {
        let (p999, max) = (n(&t, "call_p999_us"), n(&t, "call_max_us"));
        let q999 = n(&t, "pathful_p999_us");
        let bound = longest_outage.as_micros() as u64 + 100_000;
        println!(
            "soak --blips targets: p99.9 {:.1} ms <= 50 ms: {} (calls that met no outage of every link: {:.1} ms: {}); slowest {:.1} ms <= longest full outage {} ms + 100 ms: {}",
            p999 as f64 / 1e3,
            if p999 <= 50_000 { "met" } else { "MISSED" },
            q999 as f64 / 1e3,
            if q999 <= 50_000 { "met" } else { "MISSED" },
            max as f64 / 1e3,
            longest_outage.as_millis(),
            if max <= bound { "met" } else { "MISSED" },
        );
    }
    if !problems.is_empty() {
        bail!("soak failed (seed {seed}): {}", problems.join("; "));
    }
    println!("soak: PASSED");
    Ok(())
}
