//! `attack udp-flood`: a plain endpoint pair (the example server and
//! client, on free ports), junk UDP from 127.0.0.1 at the server's
//! heartbeat ports as fast as `--threads` threads send it, then the client
//! frozen (SIGSTOP) or killed while the flood goes on. With `--forge` the
//! junk comes from the client's own addresses instead (on loopback any
//! 127/8 address can be a source), as a flood forging a member would: it
//! lands in the members' queue.
//!
//! Reported: the client's calls during the flood while it is alive
//! (answered/total, p99), false reports of the live client (`peer 2 dead`
//! or a silent path), the time from freezing the client to the server's
//! `peer 2 dead` (the detector's default window is 2 s), the server's CPU
//! share during the flood and its RSS before, during and after. The same
//! scenario without the flood runs first, as the baseline of the run.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use surelink_lab::child::{Child, Command, Output};
use surelink_lab::examples::ExampleCopy;

use super::{cpu_seconds, rss_kib, surelink_bin};

/// `attack udp-flood`.
#[derive(Args)]
pub(crate) struct UdpFloodArgs {
    /// The `surelink` binary to attack (default: next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// Flooding threads (each sends as fast as one core does).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds of flood while the client is alive (false reports, calls).
    #[arg(long, default_value_t = 10)]
    alive_secs: u64,
    /// Seconds to wait for the dead report after the client stops.
    #[arg(long, default_value_t = 30)]
    max_wait_secs: u64,
    /// SIGKILL the client instead of freezing it (SIGSTOP).
    #[arg(long)]
    kill: bool,
    /// Forge the client's source addresses (127.0.1.2, 127.0.2.2), one per
    /// network, instead of sending from 127.0.0.1.
    #[arg(long)]
    forge: bool,
    /// Skip the baseline run without a flood.
    #[arg(long)]
    no_baseline: bool,
    /// Where the JSON result goes.
    #[arg(long, default_value = "attack-udp-flood.json")]
    out: PathBuf,
}

/// A line of a child's output and when it came.
#[derive(Clone, Debug)]
struct Line {
    at: Instant,
    text: String,
}

fn parse(l: &str) -> Option<Line> {
    Some(Line {
        at: Instant::now(),
        text: l.to_owned(),
    })
}

/// One run's figures.
#[derive(Debug, Default)]
struct Outcome {
    flood_rate: f64,
    calls: u64,
    answered: u64,
    p99_us: f64,
    false_reports: Vec<String>,
    dead_after: Option<Duration>,
    cpu_share: f64,
    rss_before: u64,
    rss_during: u64,
    rss_after: u64,
}

struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// Junk to each of `to`, from the source address beside it.
    fn start(to: &[(IpAddr, SocketAddr)], threads: usize) -> Result<Flood> {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let mut hs = Vec::new();
        for i in 0..threads {
            let to: Vec<(UdpSocket, SocketAddr)> = to
                .iter()
                .map(|(from, to)| {
                    UdpSocket::bind(SocketAddr::new(*from, 0))
                        .map(|s| (s, *to))
                        .context("binding the flood's socket")
                })
                .collect::<Result<_>>()?;
            let (stop, sent) = (stop.clone(), sent.clone());
            hs.push(std::thread::spawn(move || {
                // Junk of a heartbeat's size; a byte varies so it is not
                // one datagram repeated.
                let mut junk = [0x5au8; 56];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for (sock, a) in &to {
                        junk[0] = (n as u8).wrapping_add(i as u8);
                        if sock.send_to(&junk, a).is_ok() {
                            n += 1;
                        }
                    }
                    if n % 4096 == 0 {
                        sent.fetch_add(4096, Ordering::Relaxed);
                    }
                }
            }));
        }
        Ok(Flood {
            stop,
            sent,
            threads: hs,
        })
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.sent.load(Ordering::Relaxed)
    }
}

fn is_report_of_client(l: &str) -> bool {
    l.starts_with("peer 2 dead") || (l.starts_with("path to 2 ") && l.contains("silent"))
}

async fn one_run(bin: &PathBuf, a: &UdpFloodArgs, flood: bool) -> Result<Outcome> {
    let copy = ExampleCopy::new(".", "attack-udp-flood")?;
    let dir = copy.path();
    let server: Child<Line> = Command::new("server", bin)
        .args(["serve", "--config"])
        .arg(dir.join("server.toml"))
        .stdout(Output::Lines)
        .stderr(Output::Log(dir.join("server.log")))
        .die_with_parent()
        .spawn_parsed(parse)?;
    server
        .wait_for_async(Duration::from_secs(10), |l| l.text.starts_with("serving"))
        .await
        .context("the server did not start")?;
    let client: Child<Line> = Command::new("client", bin)
        .args(["call", "--config"])
        .arg(dir.join("client.toml"))
        .args([
            "--peer",
            "1",
            "--count",
            "1000000",
            "--interval-ms",
            "20",
            "--timeout-ms",
            "1000",
        ])
        .stdout(Output::Lines)
        .stderr(Output::Log(dir.join("client.log")))
        .die_with_parent()
        .spawn_parsed(parse)?;
    client
        .wait_for_async(Duration::from_secs(10), |l| l.text.starts_with("reply "))
        .await
        .context("the client's calls are not answered")?;
    let sources: [IpAddr; 2] = if a.forge {
        [[127, 0, 1, 2].into(), [127, 0, 2, 2].into()]
    } else {
        [[127, 0, 0, 1].into(); 2]
    };
    let targets = vec![
        (sources[0], copy.moved("127.0.1.1:7100")?),
        (sources[1], copy.moved("127.0.2.1:7100")?),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = server.pid();
    let mut o = Outcome {
        rss_before: rss_kib(pid),
        ..Outcome::default()
    };
    let f = if flood {
        Some(Flood::start(&targets, a.threads)?)
    } else {
        None
    };
    let start = Instant::now();
    let cpu0 = cpu_seconds(pid);
    eprintln!(
        "  {} for {} s with the client alive…",
        if flood { "flooding" } else { "quiet" },
        a.alive_secs
    );
    tokio::time::sleep(Duration::from_secs(a.alive_secs)).await;
    let alive_end = Instant::now();
    let wall = alive_end.duration_since(start).as_secs_f64();
    o.cpu_share = (cpu_seconds(pid) - cpu0) / wall;
    o.rss_during = rss_kib(pid);
    let mut rtts = Vec::new();
    for l in client.lines() {
        if l.at < start || l.at > alive_end {
            continue;
        }
        if l.text.starts_with("reply ") {
            o.calls += 1;
            if let Some(us) = l
                .text
                .split(" in ")
                .nth(1)
                .and_then(|r| r.trim_end_matches(" µs").parse::<f64>().ok())
            {
                o.answered += 1;
                rtts.push(us);
            }
        } else if l.text.starts_with("call ") {
            o.calls += 1;
        }
    }
    rtts.sort_by(f64::total_cmp);
    if !rtts.is_empty() {
        o.p99_us = rtts[(rtts.len() * 99 / 100).min(rtts.len() - 1)];
    }
    o.false_reports = server
        .lines()
        .into_iter()
        .filter(|l| l.at >= start && is_report_of_client(&l.text))
        .map(|l| l.text)
        .collect();
    eprintln!(
        "  client alive: {}/{} calls answered, p99 {:.0} µs, {} false reports",
        o.answered,
        o.calls,
        o.p99_us,
        o.false_reports.len()
    );
    let gone = Instant::now();
    if a.kill {
        client.kill();
    } else {
        surelink_sys::process::stop(client.pid()).context("freezing the client")?;
    }
    eprintln!(
        "  client {} at {:.1} s; waiting up to {} s for `peer 2 dead`…",
        if a.kill { "killed" } else { "frozen" },
        gone.duration_since(start).as_secs_f64(),
        a.max_wait_secs
    );
    let dead = server
        .wait_for_async(Duration::from_secs(a.max_wait_secs), |l| {
            l.at >= gone && l.text.starts_with("peer 2 dead")
        })
        .await;
    o.dead_after = dead.map(|l| l.at.duration_since(gone));
    if let Some(f) = f {
        let sent = f.stop();
        o.flood_rate = sent as f64 / start.elapsed().as_secs_f64();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    o.rss_after = rss_kib(pid);
    if !a.kill {
        let _ = surelink_sys::process::resume(client.pid());
    }
    client.kill();
    server.kill();
    Ok(o)
}

fn show(name: &str, o: &Outcome) {
    println!(
        "{name:<9} flood {:>9.0}/s  calls {:>4}/{:<4} p99 {:>8.0} µs  false reports {}  dead after {:>8}  cpu {:>5.1} %  rss {}/{}/{} KiB",
        o.flood_rate,
        o.answered,
        o.calls,
        o.p99_us,
        o.false_reports.len(),
        o.dead_after
            .map_or("never".to_string(), |d| format!("{:.2} s", d.as_secs_f64())),
        o.cpu_share * 100.0,
        o.rss_before,
        o.rss_during,
        o.rss_after
    );
}

fn to_json(o: &Outcome) -> serde_json::Value {
    json!({
        "flood_datagrams_per_s": o.flood_rate,
        "calls": o.calls,
        "answered": o.answered,
        "p99_us": o.p99_us,
        "false_reports": o.false_reports,
        "dead_report_after_s": o.dead_after.map(|d| d.as_secs_f64()),
        "server_cpu_share": o.cpu_share,
        "rss_kib": { "before": o.rss_before, "during": o.rss_during, "after": o.rss_after },
    })
}

/// Runs the attack.
pub(crate) async fn run(a: &UdpFloodArgs) -> Result<()> {
    let bin = surelink_bin(a.surelink_bin.as_deref())?;
    eprintln!("attack udp-flood on {}", bin.display());
    let baseline = if a.no_baseline {
        None
    } else {
        eprintln!("baseline (no flood):");
        Some(one_run(&bin, a, false).await?)
    };
    eprintln!(
        "flood ({} thread(s), {}):",
        a.threads,
        if a.forge {
            "forging the client's addresses"
        } else {
            "from 127.0.0.1"
        }
    );
    let flood = one_run(&bin, a, true).await?;
    if let Some(b) = &baseline {
        show("baseline", b);
    }
    show("flood", &flood);
    let result = json!({
        "attack": "udp-flood",
        "surelink_bin": bin.display().to_string(),
        "client_stopped_by": if a.kill { "SIGKILL" } else { "SIGSTOP" },
        "forged_sources": a.forge,
        "threads": a.threads,
        "alive_secs": a.alive_secs,
        "max_wait_secs": a.max_wait_secs,
        "baseline": baseline.as_ref().map(to_json),
        "flood": to_json(&flood),
    });
    std::fs::write(&a.out, serde_json::to_string_pretty(&result)?)
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
