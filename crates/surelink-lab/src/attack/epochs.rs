//! `attack epochs`: a member (node 2) restarts every `--interval-secs`
//! — a new endpoint with a new epoch, the same node id and key — and each
//! time sends one-way messages of `--body` bytes as fast as the server
//! takes them, for the whole interval; the server (`surelink serve`, an
//! echo server) never reads one-way messages. Each incarnation leaves
//! without closing its session (its sockets are shut down), so the next
//! one's HELLO supersedes it. Another member calls the server every
//! 10 ms meanwhile. Reports the server's RSS over time (before, the
//! maximum during, after), the held-bytes gauge where the binary has one,
//! and the legitimate calls.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use clap::Args;
use parking_lot::Mutex;

use surelink::proto::Epoch;
use surelink::TrySendError;

use super::unacked::{
    max_in, sample, write_json, Legit, Samples, Target, TargetArgs, ATTACKER, SERVER,
};

/// `attack epochs` options.
#[derive(Args, Clone, Debug)]
pub(crate) struct EpochsArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Incarnations of the attacker.
    #[arg(long, default_value_t = 8)]
    pub(crate) epochs: u64,
    /// Seconds each one lives.
    #[arg(long, default_value_t = 2)]
    pub(crate) interval_secs: u64,
    /// Bytes of each one-way message.
    #[arg(long, default_value_t = 64 << 10)]
    pub(crate) body: usize,
}

/// One incarnation of the attacker: fills what the server takes for
/// `life`, then vanishes without a goodbye (counting into `sent`).
async fn incarnation(
    t: &Target,
    epoch: u64,
    body: &Bytes,
    life: Duration,
    sent: &AtomicU64,
) -> Result<()> {
    let mut c = t.attacker_config()?;
    c.epoch = Some(Epoch(epoch));
    let ep = surelink::Endpoint::bind(c).await?;
    let end = Instant::now() + life;
    while Instant::now() < end {
        match ep.try_send(SERVER, 0, body.clone()) {
            Ok(()) => {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    // Gone without a CLOSE: the connections die with the process.
    ep.testing().kill_network(0);
    drop(ep);
    Ok(())
}

pub(super) async fn run(a: &EpochsArgs) -> Result<()> {
    let t = Target::start(&a.target, "epochs")?;
    println!(
        "target: {} (pid {}) on {}",
        t.bin.display(),
        t.child.pid(),
        t.addr
    );
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let legit = Arc::new(Legit::default());
    let legit_task = tokio::spawn(legit.clone().run(t.legit_config()?, stop.clone()));
    let samples = Mutex::new(Samples::default());
    let sent = AtomicU64::new(0);
    let body = Bytes::from(vec![0x33; a.body]);
    let base = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    let mut per_epoch = Vec::new();
    let work = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = t.rss_mib();
        let start = t0.elapsed().as_secs_f64();
        println!(
            "before: RSS {before:.1} MiB; {} epochs of {} s",
            a.epochs, a.interval_secs
        );
        for i in 0..a.epochs {
            if let Err(e) = incarnation(
                &t,
                base + i,
                &body,
                Duration::from_secs(a.interval_secs),
                &sent,
            )
            .await
            {
                println!("  epoch {i}: {e:#}");
            }
            let rss = t.rss_mib();
            let held = t.held_bytes(ATTACKER);
            let (ok, total, _) = legit.summary();
            println!(
                "  epoch {i}: t={:5.1}s sent {:6} msgs  RSS {rss:7.1} MiB  held {:>12}  legit {ok}/{total}",
                t0.elapsed().as_secs_f64(),
                sent.load(Ordering::Relaxed),
                held.map_or("-".into(), |b| b.to_string()),
            );
            per_epoch.push(serde_json::json!({"epoch": i, "rss_mib": rss, "held_bytes": held}));
        }
        let end = t0.elapsed().as_secs_f64();
        // The last incarnation's session lingers; wait past the default
        // linger (30 s) so "after" sees it gone.
        tokio::time::sleep(Duration::from_secs(32)).await;
        let after = t.rss_mib();
        anyhow::Ok((before, start, end, after))
    };
    let (r, ()) = tokio::join!(
        async {
            let r = work.await;
            stop.store(true, Ordering::Relaxed);
            r
        },
        sample(&t, t0, &stop, &samples)
    );
    let (before, start, end, after) = r?;
    let _ = legit_task.await;
    let (ok, total, p99) = legit.summary();
    let s = samples.lock();
    let during = max_in(&s.rss, start, end);
    let held_max = s.held.iter().map(|(_, h)| *h).max();
    let held_after = s.held.last().map(|(_, h)| *h);
    println!("legitimate calls answered {ok}/{total}, p99 {p99} µs");
    println!(
        "server RSS: before {before:.1} MiB, during (max) {during:.1} MiB, after {after:.1} MiB"
    );
    println!(
        "held for the attacker: max {}, at the end {}",
        held_max.map_or("- (no gauge)".into(), |b| format!("{b} B")),
        held_after.map_or("-".into(), |b| format!("{b} B"))
    );
    write_json(
        &a.target,
        "attack-epochs.json",
        &serde_json::json!({
            "attack": "epochs",
            "binary": t.bin.display().to_string(),
            "epochs": a.epochs, "interval_secs": a.interval_secs, "body": a.body,
            "messages_sent": sent.load(Ordering::Relaxed),
            "legit": {"answered": ok, "total": total, "p99_us": p99},
            "rss_mib": {"before": before, "during_max": during, "after": after},
            "held_bytes": {"max": held_max, "last": held_after},
            "per_epoch": per_epoch,
            "rss_series": s.rss, "held_series": s.held,
        }),
    )
}
