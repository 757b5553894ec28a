//! `surelink-lab experiment detector`: SafeTimer's Table 1 (false reports
//! under injected local delays and drops, and the sender fence) and the
//! time to detect a real crash or a one-way silent link.
//!
//! Every run uses two processes, a receiver and a streaming sender, on
//! loopback over two networks (127.0.1.x, 127.0.2.x).

use std::net::UdpSocket;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use super::node::{wall_us, Mode, SENDER};
use super::procs::{addrs, t, NodeProc};

/// Arguments of `surelink-lab experiment detector`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DetectorArgs {
    /// Directory for detector.json and detector_timeline.png.
    #[arg(long, default_value = "results/detector")]
    out: PathBuf,
    /// Runs per detection-time cell (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Shorter: one run per cell, no 1 s interval.
    #[arg(long)]
    quick: bool,
    /// Only the Table 1 rows (no detection times).
    #[arg(long)]
    table_only: bool,
    /// Only this Table 1 row.
    #[arg(long, value_enum)]
    fault: Option<Fault>,
    /// Table 1 with the product's default detector instead of the paper's
    /// settings: 12 s of quiet first (an idle pair goes slow after 10 s),
    /// and 4 s faults, beyond the slow pair's 3.2 s and a busy pair's 2 s
    /// windows.
    #[arg(long)]
    defaults: bool,
}

/// The detector and the fault's size in the Table 1 runs.
#[derive(Clone, Copy, Debug)]
struct TableSettings {
    /// The product's defaults (else the paper's: 100 ms heartbeats, 1 s
    /// timeout).
    defaults: bool,
}

impl TableSettings {
    fn node_args(self, mode: Mode) -> Vec<String> {
        let mode = match mode {
            Mode::Safetimer => "safetimer",
            Mode::Plain => "plain",
        };
        let mut args = vec!["--mode".to_owned(), mode.to_owned()];
        if !self.defaults {
            args.extend(
                [
                    "--interval-ms",
                    "100",
                    "--timeout-ms",
                    "1000",
                    "--slack-ms",
                    "500",
                    "--network-delay-ms",
                    "100",
                ]
                .map(String::from),
            );
        }
        args
    }

    /// Heartbeats flow this long before the fault.
    fn warm_up(self) -> Duration {
        Duration::from_millis(if self.defaults { 12_000 } else { 1_500 })
    }

    /// How long the fault lasts.
    fn fault(self) -> Duration {
        Duration::from_secs(if self.defaults { 4 } else { 2 })
    }

    fn describe(self) -> &'static str {
        if self.defaults {
            "the product's defaults: 10 ms busy / 400 ms fence heartbeats, 2 s timeout, slow pairs after 10 s; 4 s faults after 12 s quiet"
        } else {
            "the paper's settings: timeout 1 s, heartbeats every 100 ms; 2 s faults"
        }
    }
}

/// Where the 2 s fault of a Table 1 row hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub(crate) enum Fault {
    /// The receiver's heartbeat reader thread stalls.
    ReceiverReader,
    /// The receiver's checker (detector) thread stalls.
    ReceiverChecker,
    /// The whole receiver process stops (SIGSTOP).
    ReceiverProcess,
    /// The receiver's heartbeat socket overflows (tiny buffer, reader
    /// stalled, junk flood): heartbeats are dropped.
    ReceiverDrops,
    /// The sender's heartbeat thread stalls.
    SenderHeartbeat,
    /// The whole sender process stops (SIGSTOP).
    SenderProcess,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Fault::ReceiverReader,
        Fault::ReceiverChecker,
        Fault::ReceiverProcess,
        Fault::ReceiverDrops,
        Fault::SenderHeartbeat,
        Fault::SenderProcess,
    ];

    fn label(self) -> &'static str {
        match self {
            Fault::ReceiverReader => "receiver reader thread delayed",
            Fault::ReceiverChecker => "receiver detector thread delayed",
            Fault::ReceiverProcess => "receiver process stopped (SIGSTOP)",
            Fault::ReceiverDrops => "receiver socket overflow (drops)",
            Fault::SenderHeartbeat => "sender heartbeat thread delayed",
            Fault::SenderProcess => "sender process stopped (SIGSTOP)",
        }
    }

    fn on_sender(self) -> bool {
        matches!(self, Fault::SenderHeartbeat | Fault::SenderProcess)
    }
}

/// One Table 1 cell.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TableRun {
    fault: Fault,
    mode: String,
    /// The receiver reported the sender dead.
    reported: bool,
    /// Milliseconds from the fault to the report.
    report_after_ms: Option<f64>,
    /// The sender fenced itself.
    sender_fenced: bool,
    /// Messages of the sender's first incarnation that arrived after the
    /// report (each one proves the report false).
    msgs_after_report: usize,
    /// The report was false: the sender was alive and not fenced.
    false_report: bool,
    /// When the last message of the first incarnation arrived, ms from the
    /// fault.
    last_first_incarnation_ms: Option<f64>,
    /// Sequence numbers of first-incarnation messages after the report.
    seqs_after_report: Vec<u64>,
    /// Message arrivals (ms from the fault, epoch was the first one).
    #[serde(skip)]
    arrivals: Vec<(f64, bool)>,
    #[serde(skip)]
    fenced_after_ms: Option<f64>,
    /// How long the fault lasted, ms.
    fault_ms: f64,
}

const RECEIVER_ADDRS: &str = "127.0.1.1:0,127.0.2.1:0";
const SENDER_ADDRS: &str = "127.0.1.2:0,127.0.2.2:0";

/// Starts a receiver and a sender with `extra` settings; returns them once
/// the receiver has met the sender.
async fn start_pair(extra: &[String], stream_ms: u64) -> Result<(NodeProc, NodeProc, u64)> {
    let mut args = vec!["--role".to_owned(), "receiver".to_owned()];
    args.extend(["--local".to_owned(), RECEIVER_ADDRS.to_owned()]);
    args.extend(extra.iter().cloned());
    let (rx, ready) = NodeProc::spawn(&args).await?;
    let listen = addrs(&ready, "listen")?.join(",");
    let mut args = vec!["--role".to_owned(), "sender".to_owned()];
    args.extend(["--local".to_owned(), SENDER_ADDRS.to_owned()]);
    args.extend(["--peer".to_owned(), listen]);
    args.extend(["--stream-ms".to_owned(), stream_ms.to_string()]);
    args.extend(extra.iter().cloned());
    let (tx, ready) = NodeProc::spawn(&args).await?;
    let epoch = ready["epoch"].as_u64().unwrap_or(0);
    rx.wait_for(Duration::from_secs(10), |v| v["ev"] == "peer_up")
        .await
        .context("the sender never reached the receiver")?;
    Ok((rx, tx, epoch))
}

/// Floods `to` with junk datagrams until `until` (wall µs).
fn flood(to: Vec<String>, until: u64) {
    let Ok(sock) = UdpSocket::bind("127.0.0.1:0") else {
        return;
    };
    let junk = [0u8; 512];
    while wall_us() < until {
        for a in &to {
            let _ = sock.send_to(&junk, a.as_str());
        }
    }
}

async fn table_run(fault: Fault, mode: Mode, set: TableSettings) -> Result<TableRun> {
    // Receiver-side rows run on heartbeats alone, as in the paper (traffic
    // would count as heartbeats and hide the stall); sender-side rows
    // stream a message per millisecond, so a report the sender outlives
    // shows up as messages arriving after it.
    let stream = u64::from(fault.on_sender());
    let (mut rx, mut tx, first_epoch) = start_pair(&set.node_args(mode), stream).await?;
    // Let heartbeats flow for a while.
    tokio::time::sleep(set.warm_up()).await;
    let start = wall_us();
    let pause = set.fault();
    let len_ms = pause.as_millis();
    match fault {
        Fault::ReceiverReader => rx.command(&format!("delay reader {len_ms}")).await?,
        Fault::ReceiverChecker => rx.command(&format!("delay checker {len_ms}")).await?,
        Fault::SenderHeartbeat => tx.command(&format!("delay sender {len_ms}")).await?,
        Fault::ReceiverProcess | Fault::SenderProcess => {
            let pid = if fault == Fault::ReceiverProcess {
                rx.pid
            } else {
                tx.pid
            };
            surelink_sys::process::stop(pid).context("SIGSTOP")?;
            tokio::time::sleep(pause).await;
            surelink_sys::process::resume(pid).context("SIGCONT")?;
        }
        Fault::ReceiverDrops => {
            rx.command("rcvbuf 1").await?;
            rx.command(&format!("delay reader {len_ms}")).await?;
            let ready = rx
                .wait_for(Duration::from_secs(1), |v| v["ev"] == "ready")
                .await
                .context("ready")?;
            let hb = addrs(&ready, "heartbeat")?;
            let until = start + micros(pause);
            tokio::task::spawn_blocking(move || flood(hb, until)).await?;
        }
    }
    // Watch the aftermath until 2.5 s after the fault ended.
    let end = start + micros(pause) + 2_500_000;
    let now = wall_us();
    if end > now {
        tokio::time::sleep(Duration::from_micros(end - now)).await;
    }
    let rx_events = rx.quit().await;
    let tx_events = tx.quit().await;
    // Messages the sender built under the old epoch but queued under the
    // new one (a race in this test's sender, not a message of the old
    // incarnation) are not counted.
    let raced: Vec<u64> = tx_events
        .iter()
        .filter(|v| v["ev"] == "epoch_race")
        .filter_map(|v| v["seq"].as_u64())
        .collect();
    let first = |v: &&Value| {
        v["ev"] == "msg"
            && v["epoch"].as_u64() == Some(first_epoch)
            && !v["seq"].as_u64().is_some_and(|s| raced.contains(&s))
    };
    let report = rx_events
        .iter()
        .find(|v| v["ev"] == "peer_dead" && v["peer"] == SENDER.0 && t(v) >= start)
        .map(t);
    let fenced = tx_events.iter().find(|v| v["ev"] == "fenced").map(t);
    let ms = |x: u64| (x as f64 - start as f64) / 1e3;
    let arrivals: Vec<(f64, bool)> = rx_events
        .iter()
        .filter(|v| v["ev"] == "msg")
        .map(|v| (ms(t(v)), v["epoch"].as_u64() == Some(first_epoch)))
        .collect();
    let after: Vec<u64> = report.map_or(Vec::new(), |r| {
        rx_events
            .iter()
            .filter(|v| first(v) && t(v) > r)
            .filter_map(|v| v["seq"].as_u64())
            .collect()
    });
    let msgs_after_report = after.len();
    let last_first = rx_events.iter().filter(first).map(t).max();
    Ok(TableRun {
        fault,
        mode: format!("{mode:?}").to_lowercase(),
        reported: report.is_some(),
        report_after_ms: report.map(ms),
        sender_fenced: fenced.is_some(),
        msgs_after_report,
        false_report: report.is_some() && (fenced.is_none() || msgs_after_report > 0),
        last_first_incarnation_ms: last_first.map(ms),
        seqs_after_report: after,
        arrivals,
        fenced_after_ms: fenced.map(ms),
        fault_ms: pause.as_secs_f64() * 1e3,
    })
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One detection-time cell.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DetectRun {
    kind: String,
    interval_ms: u64,
    /// Median over the runs, ms; `None` if never detected.
    median_ms: Option<f64>,
    /// Every run, ms.
    runs_ms: Vec<Option<f64>>,
    /// Peer window (timeout), ms.
    timeout_ms: u64,
}

/// Detection settings for interval `h`: path and peer window 5 h, send
/// slack 3 h, network delay h.
fn detect_node_args(h: u64) -> Vec<String> {
    [
        "--interval-ms".to_owned(),
        h.to_string(),
        "--timeout-ms".to_owned(),
        (5 * h).to_string(),
        "--slack-ms".to_owned(),
        (3 * h).to_string(),
        "--network-delay-ms".to_owned(),
        h.to_string(),
    ]
    .to_vec()
}

/// kill -9 of the sender: time to the receiver's `peer_dead`.
async fn crash_run(h: u64) -> Result<Option<f64>> {
    let (rx, mut tx, _) = start_pair(&detect_node_args(h), 0).await?;
    tokio::time::sleep(Duration::from_millis((10 * h).max(500))).await;
    let killed = tx.kill().await?;
    let dead = rx
        .wait_for(Duration::from_millis(20 * h + 3000), |v| {
            v["ev"] == "peer_dead" && t(v) >= killed
        })
        .await;
    rx.quit().await;
    Ok(dead.map(|v| (t(&v) as f64 - killed as f64) / 1e3))
}

fn nft(script: &str) -> Result<()> {
    surelink_lab::child::run_with_input(&["nft", "-f", "-"], Some(script))?;
    Ok(())
}

const NFT_TABLE: &str = "surelink_detector_exp";

/// Whether one-way drops can be injected here (root and nftables).
fn can_drop_one_way() -> bool {
    nft(&format!(
        "add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
    ))
    .is_ok()
}

/// Network 1 goes silent from sender to receiver only: time to the
/// receiver's `path_silent` for that network.
async fn one_way_run(h: u64) -> Result<Option<f64>> {
    let (rx, tx, _) = start_pair(&detect_node_args(h), 0).await?;
    tokio::time::sleep(Duration::from_millis((10 * h).max(500))).await;
    let cut = wall_us();
    nft(&format!(
        "add table inet {NFT_TABLE}\n\
         add chain inet {NFT_TABLE} in {{ type filter hook input priority 0; }}\n\
         add rule inet {NFT_TABLE} in ip saddr 127.0.1.2 ip daddr 127.0.1.1 drop\n"
    ))?;
    let silent = rx
        .wait_for(Duration::from_millis(20 * h + 3000), |v| {
            v["ev"] == "path_silent" && v["network"] == 0 && t(v) >= cut
        })
        .await;
    let _ = nft(&format!("delete table inet {NFT_TABLE}\n"));
    rx.quit().await;
    tx.quit().await;
    Ok(silent.map(|v| (t(&v) as f64 - cut as f64) / 1e3))
}

fn median(v: &[Option<f64>]) -> Option<f64> {
    let mut got: Vec<f64> = v.iter().flatten().copied().collect();
    if got.len() < v.len() || got.is_empty() {
        return None;
    }
    got.sort_by(f64::total_cmp);
    Some(got[got.len() / 2])
}

#[derive(Serialize)]
struct Report {
    table: Vec<TableRun>,
    detection: Vec<DetectRun>,
    one_way_skipped: Option<String>,
}

/// Runs the experiment.
pub(crate) async fn run(args: &DetectorArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut table = Vec::new();

    let faults: Vec<Fault> = match args.fault {
        Some(f) => vec![f],
        None => Fault::ALL.to_vec(),
    };
    let total = faults.len() * 2;
    let set = TableSettings {
        defaults: args.defaults,
    };
    for (i, fault) in faults.iter().enumerate() {
        for (j, mode) in [Mode::Plain, Mode::Safetimer].into_iter().enumerate() {
            eprint!(
                "[{}/{total}] {} — {mode:?} ... ",
                i * 2 + j + 1,
                fault.label()
            );
            let r = table_run(*fault, mode, set).await?;
            eprintln!(
                "{}{}",
                if r.reported {
                    "reported dead"
                } else {
                    "no report"
                },
                if r.sender_fenced {
                    ", sender fenced"
                } else {
                    ""
                }
            );
            table.push(r);
        }
    }
    let mut detection = Vec::new();
    let mut one_way_skipped = None;
    if !args.table_only {
        let runs = if args.quick { 1 } else { args.runs.max(1) };
        let intervals: &[u64] = if args.quick {
            &[10, 100]
        } else {
            &[10, 100, 1000]
        };
        let one_way = can_drop_one_way();
        if !one_way {
            let why = "one-way silence needs root and nftables (nft): skipped".to_owned();
            eprintln!("NOTICE: {why}");
            one_way_skipped = Some(why);
        }
        for &h in intervals {
            let mut kinds = vec!["kill -9 of the sender (peer dead)"];
            if one_way {
                kinds.push("one-way silent link (path failover)");
            }
            for kind in kinds {
                let mut v = Vec::new();
                for r in 0..runs {
                    eprint!("detect: {kind}, interval {h} ms, run {}/{runs} ... ", r + 1);
                    let got = if kind.starts_with("kill") {
                        crash_run(h).await?
                    } else {
                        one_way_run(h).await?
                    };
                    eprintln!(
                        "{}",
                        got.map_or("not detected".into(), |m| format!("{m:.1} ms"))
                    );
                    v.push(got);
                }
                detection.push(DetectRun {
                    kind: kind.to_owned(),
                    interval_ms: h,
                    median_ms: median(&v),
                    runs_ms: v,
                    timeout_ms: 5 * h,
                });
            }
        }
    }
    print_report(&table, &detection, set);
    let json = args.out.join("detector.json");
    let report = Report {
        table: table.clone(),
        detection,
        one_way_skipped,
    };
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!("wrote {}", json.display());
    let png = args.out.join("detector_timeline.png");
    let runs: Vec<&TableRun> = table.iter().filter(|r| r.fault.on_sender()).collect();
    match super::plot::timeline(&png, &runs_for_plot(&runs)) {
        Ok(()) => println!("wrote {}", png.display()),
        Err(e) => println!("timeline not drawn: {e:#}"),
    }
    Ok(())
}

fn runs_for_plot(runs: &[&TableRun]) -> Vec<super::plot::Lane> {
    runs.iter()
        .map(|r| super::plot::Lane {
            title: format!("{} — {}", r.mode, r.fault.label()),
            arrivals: r.arrivals.clone(),
            report_ms: r.report_after_ms,
            fenced_ms: r.fenced_after_ms,
            fault_ms: (0.0, r.fault_ms),
        })
        .collect()
}

fn print_report(table: &[TableRun], detection: &[DetectRun], set: TableSettings) {
    println!();
    println!("SafeTimer Table 1 ({})", set.describe());
    println!(
        "{:<42} | {:^22} | {:^34}",
        "injected", "plain timeout", "surelink (SafeTimer)"
    );
    println!(
        "{:<42} | {:>10} {:>11} | {:>10} {:>11} {:>11}",
        "", "false rep.", "msgs after", "false rep.", "msgs after", "fenced"
    );
    println!("{}", "-".repeat(104));
    for fault in Fault::ALL {
        let cell = |mode: &str| table.iter().find(|r| r.fault == fault && r.mode == mode);
        let yn = |b: bool| if b { "YES" } else { "no" };
        let (Some(p), Some(s)) = (cell("plain"), cell("safetimer")) else {
            continue;
        };
        let fenced = if fault.on_sender() {
            yn(s.sender_fenced)
        } else {
            "n/a"
        };
        println!(
            "{:<42} | {:>10} {:>11} | {:>10} {:>11} {:>11}",
            fault.label(),
            yn(p.false_report),
            p.msgs_after_report,
            yn(s.false_report),
            s.msgs_after_report,
            fenced
        );
    }
    if detection.is_empty() {
        return;
    }
    println!();
    println!("Detection time (windows of 5 intervals; median of runs)");
    println!(
        "{:<40} | {:>11} | {:>10} | runs (ms)",
        "event", "interval ms", "median ms"
    );
    println!("{}", "-".repeat(90));
    for d in detection {
        let runs: Vec<String> = d
            .runs_ms
            .iter()
            .map(|r| r.map_or("-".into(), |m| format!("{m:.0}")))
            .collect();
        println!(
            "{:<40} | {:>11} | {:>10} | {}",
            d.kind,
            d.interval_ms,
            d.median_ms
                .map_or("not detected".into(), |m| format!("{m:.1}")),
            runs.join(" ")
        );
    }
}
