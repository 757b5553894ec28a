//! Throughput rounds: a pipelined sender, deliveries counted at the
//! receiver inside a window, the backlog drained before the next round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use surelink::Endpoint;
use tokio::io::AsyncWriteExt;
use tokio::task::coop::consume_budget;

use super::fixture::{Delivered, SurelinkPair, SERVER};
use super::report::ThroughputRound;
use super::tcp::{frame_header, TcpSink};
use super::Plan;

/// How long a throughput round's backlog may take to arrive.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Deliveries counted inside the measurement window.
struct Window {
    msgs: u64,
    bytes: u64,
    seconds: f64,
}

/// Lets the sender warm up, then counts what the receiver takes during
/// `plan.measure`. The caller stops the sender only after this returns, so
/// the window never includes the drain of the backlog.
async fn delivery_window(delivered: &Delivered, plan: &Plan) -> Window {
    tokio::time::sleep(plan.warmup).await;
    let (m0, b0, t0) = delivered.snapshot();
    tokio::time::sleep(plan.measure).await;
    let (m1, b1, t1) = delivered.snapshot();
    Window {
        msgs: m1 - m0,
        bytes: b1 - b0,
        seconds: (t1 - t0).as_secs_f64(),
    }
}

/// Waits until the receiver has taken `target` messages in all.
async fn drain(delivered: &Delivered, target: u64) -> Result<()> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while delivered.msgs() < target {
        ensure!(
            Instant::now() < deadline,
            "backlog not delivered within {DRAIN_TIMEOUT:?}: {} of {target} messages",
            delivered.msgs()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

fn throughput_round(w: &Window, sent: u64, send_seconds: f64, drain: Duration) -> ThroughputRound {
    ThroughputRound {
        round: 0,
        delivered: w.msgs,
        seconds: w.seconds,
        msgs_per_s: w.msgs as f64 / w.seconds,
        mb_per_s: w.bytes as f64 / w.seconds / 1e6,
        sent,
        offered_msgs_per_s: sent as f64 / send_seconds,
        drain_seconds: drain.as_secs_f64(),
    }
}

/// One surelink throughput round: `send` in a loop, `recv` counting.
pub(super) async fn throughput_surelink(
    pair: &SurelinkPair,
    payload: &Bytes,
    plan: &Plan,
) -> Result<ThroughputRound> {
    let base = pair.delivered.msgs();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sender = {
        let client = pair.client.clone();
        let payload = payload.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                client.send(SERVER, 0, payload.clone()).await?;
                sent += 1;
                consume_budget().await;
            }
            Ok::<u64, anyhow::Error>(sent)
        })
    };
    let window = delivery_window(&pair.delivered, plan).await;
    stop.store(true, Ordering::Relaxed);
    let sent = sender.await.context("sender task failed")??;
    let send_seconds = started.elapsed().as_secs_f64();
    let drain_start = Instant::now();
    drain(&pair.delivered, base + sent).await?;
    let drained = drain_start.elapsed();
    settle(&pair.client).await;
    Ok(throughput_round(&window, sent, send_seconds, drained))
}

/// Gives the client's retransmit cache a moment to empty (the last
/// acknowledgements), so a round does not start with the previous one's
/// messages still held. Not counted anywhere.
async fn settle(client: &Endpoint) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let held: u64 = client
            .stats()
            .sessions
            .iter()
            .map(|(_, s)| s.cache_messages)
            .sum();
        if held == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One baseline throughput round: frames through a `BufWriter`, the
/// receiver counting.
pub(super) async fn throughput_tcp(
    sink: &mut TcpSink,
    payload: &Bytes,
    plan: &Plan,
) -> Result<ThroughputRound> {
    let mut writer = sink
        .writer
        .take()
        .context("the baseline writer was lost in an earlier round")?;
    let base = sink.delivered.msgs();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sender = {
        let payload = payload.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let header = frame_header(sent, payload.len())?;
                writer.write_all(&header).await?;
                writer.write_all(&payload).await?;
                sent += 1;
                consume_budget().await;
            }
            writer.flush().await?;
            Ok::<_, anyhow::Error>((writer, sent))
        })
    };
    let window = delivery_window(&sink.delivered, plan).await;
    stop.store(true, Ordering::Relaxed);
    let (writer, sent) = sender.await.context("sender task failed")??;
    sink.writer = Some(writer);
    let send_seconds = started.elapsed().as_secs_f64();
    let drain_start = Instant::now();
    drain(&sink.delivered, base + sent).await?;
    Ok(throughput_round(
        &window,
        sent,
        send_seconds,
        drain_start.elapsed(),
    ))
}
