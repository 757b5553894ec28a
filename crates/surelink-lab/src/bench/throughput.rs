//! Throughput rounds, the same for every contender: a pipelined sender,
//! deliveries counted at the receiver inside a window, the backlog drained
//! before the next round.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::fixture::Delivered;
use super::report::ThroughputRound;
use super::Plan;

/// How long a throughput round's backlog may take to arrive.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// An at-most-once contender's drain ends after this long without a
/// delivery: what has not arrived by then was dropped.
const DRAIN_QUIET: Duration = Duration::from_millis(500);

/// What a contender promises about delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Delivery {
    /// Every message sent arrives: a round fails if the backlog does not
    /// arrive within [`DRAIN_TIMEOUT`].
    Reliable,
    /// Messages may be dropped (NATS core): the drain ends once nothing has
    /// arrived for [`DRAIN_QUIET`], and what is missing is reported lost.
    AtMostOnce,
}

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

/// Waits until the receiver has taken `target` messages in all; returns how
/// many never arrived (always 0 for [`Delivery::Reliable`]).
async fn drain(delivered: &Delivered, target: u64, delivery: Delivery) -> Result<u64> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut last = (delivered.msgs(), Instant::now());
    loop {
        let now_msgs = delivered.msgs();
        if now_msgs >= target {
            return Ok(0);
        }
        let now = Instant::now();
        if now_msgs != last.0 {
            last = (now_msgs, now);
        } else if delivery == Delivery::AtMostOnce && now - last.1 >= DRAIN_QUIET {
            return Ok(target - now_msgs);
        }
        ensure!(
            now < deadline,
            "backlog not delivered within {DRAIN_TIMEOUT:?}: {now_msgs} of {target} messages"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Stops the sender also when a round is dropped half-way (Ctrl-C).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One throughput round. `start` starts the contender's sender (a task or
/// a thread, running by the time `start` returns) and returns a future of
/// its outcome: what the sender hands back (e.g. its buffered writer) and
/// how many messages it sent. The sender sends until `stop` is set, which
/// happens when the window closes.
pub(super) async fn measure<T, S, F>(
    delivered: &Delivered,
    plan: &Plan,
    delivery: Delivery,
    start: S,
) -> Result<(ThroughputRound, T)>
where
    S: FnOnce(Arc<AtomicBool>) -> F,
    F: Future<Output = Result<(T, u64)>>,
{
    let base = delivered.msgs();
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let started = Instant::now();
    let sender = start(stop.0.clone());
    let window = delivery_window(delivered, plan).await;
    stop.0.store(true, Ordering::Relaxed);
    let (handed_back, sent) = sender.await?;
    let send_seconds = started.elapsed().as_secs_f64();
    let drain_start = Instant::now();
    let lost = drain(delivered, base + sent, delivery).await?;
    let round = ThroughputRound {
        round: 0,
        delivered: window.msgs,
        seconds: window.seconds,
        msgs_per_s: window.msgs as f64 / window.seconds,
        mb_per_s: window.bytes as f64 / window.seconds / 1e6,
        sent,
        offered_msgs_per_s: sent as f64 / send_seconds,
        drain_seconds: drain_start.elapsed().as_secs_f64(),
        lost,
    };
    Ok((round, handed_back))
}

/// [`measure`] with the sender run as a tokio task of its own: `sender`
/// makes its future from the stop flag.
pub(super) async fn measure_task<T, F>(
    delivered: &Delivered,
    plan: &Plan,
    delivery: Delivery,
    sender: impl FnOnce(Arc<AtomicBool>) -> F,
) -> Result<(ThroughputRound, T)>
where
    F: Future<Output = Result<(T, u64)>> + Send + 'static,
    T: Send + 'static,
{
    measure(delivered, plan, delivery, |stop| {
        let task = tokio::spawn(sender(stop));
        async move { task.await.context("sender task failed")? }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_reports_what_an_at_most_once_contender_dropped() {
        let d = Delivered::default();
        (0..3).for_each(|_| d.add(8));
        assert_eq!(drain(&d, 3, Delivery::Reliable).await.unwrap(), 0);
        assert_eq!(drain(&d, 5, Delivery::AtMostOnce).await.unwrap(), 2);
    }
}
