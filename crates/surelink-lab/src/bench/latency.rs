//! Latency rounds: concurrent callers timing round trips into
//! HdrHistograms. Async contenders' callers are tokio tasks (here); a
//! contender with blocking sockets runs the same loop on threads of its own
//! with [`CallerOutcome`] and [`summarize`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use surelink::Endpoint;

use super::grpc::GrpcCaller;
use super::nats::NatsCaller;
use super::report::{new_histogram, us, LatencyRound};
use super::surelink_pair;
use super::tcp::TcpRpc;
use super::Plan;

/// Who the async latency callers call.
#[derive(Clone)]
pub(super) enum Caller {
    Surelink(Endpoint),
    Tcp(Arc<TcpRpc>),
    Nats(NatsCaller),
    Grpc(GrpcCaller),
}

impl Caller {
    pub(super) async fn call(&self, payload: &Bytes) -> Result<Bytes> {
        match self {
            Caller::Surelink(ep) => surelink_pair::call(ep, payload).await,
            Caller::Tcp(rpc) => rpc.call(payload).await,
            Caller::Nats(nats) => nats.call(payload).await,
            Caller::Grpc(grpc) => grpc.call(payload).await,
        }
    }
}

/// When a round's callers record and when they stop.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    /// Calls that start at or after this are recorded (the warm-up ends).
    pub(super) record_from: Instant,
    /// No call starts at or after this.
    pub(super) until: Instant,
}

impl Timing {
    /// A round that starts now.
    pub(super) fn starting_now(plan: &Plan) -> Timing {
        let record_from = Instant::now() + plan.warmup;
        Timing {
            record_from,
            until: record_from + plan.measure,
        }
    }
}

/// Checks that `reply` echoes `payload`.
pub(super) fn check_echo(reply: &[u8], payload: &[u8]) -> Result<()> {
    if reply != payload {
        bail!("reply of {} bytes differs from the request", reply.len());
    }
    Ok(())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What one caller saw.
pub(super) struct CallerOutcome {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl CallerOutcome {
    pub(super) fn new() -> Result<CallerOutcome> {
        Ok(CallerOutcome {
            hist: new_histogram()?,
            errors: 0,
            first_error: None,
        })
    }

    /// Records one call that started at `start` and ended now.
    pub(super) fn record(&mut self, timing: &Timing, start: Instant, result: Result<()>) {
        let rtt = start.elapsed();
        match result {
            Ok(()) => {
                if start >= timing.record_from {
                    self.hist.saturating_record(nanos(rtt));
                }
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
}

/// One async caller: calls back to back until `timing.until`.
async fn caller_loop(caller: Caller, payload: Bytes, timing: Timing) -> Result<CallerOutcome> {
    let mut outcome = CallerOutcome::new()?;
    loop {
        let start = Instant::now();
        if start >= timing.until {
            break;
        }
        let result = caller
            .call(&payload)
            .await
            .and_then(|reply| check_echo(&reply, &payload));
        outcome.record(&timing, start, result);
    }
    Ok(outcome)
}

/// One latency round of an async contender: `callers` concurrent callers,
/// each a tokio task.
pub(super) async fn latency_round(
    caller: &Caller,
    payload: &Bytes,
    callers: usize,
    plan: &Plan,
) -> Result<(LatencyRound, Histogram<u64>)> {
    let timing = Timing::starting_now(plan);
    let tasks: Vec<_> = (0..callers)
        .map(|_| tokio::spawn(caller_loop(caller.clone(), payload.clone(), timing)))
        .collect();
    let mut outcomes = Vec::with_capacity(callers);
    for t in tasks {
        outcomes.push(t.await.context("a caller task failed")??);
    }
    summarize(outcomes, plan)
}

/// The round's figures from all its callers' outcomes.
pub(super) fn summarize(
    outcomes: Vec<CallerOutcome>,
    plan: &Plan,
) -> Result<(LatencyRound, Histogram<u64>)> {
    let mut hist = new_histogram()?;
    let mut errors = 0;
    let mut first_error = None;
    for o in outcomes {
        hist.add(&o.hist).context("merging histograms")?;
        errors += o.errors;
        first_error = first_error.or(o.first_error);
    }
    ensure!(
        !hist.is_empty(),
        "no call succeeded ({errors} errors; first: {})",
        first_error.as_deref().unwrap_or("none")
    );
    let seconds = plan.measure.as_secs_f64();
    let round = LatencyRound {
        round: 0,
        calls: hist.len(),
        errors,
        first_error,
        seconds,
        calls_per_s: hist.len() as f64 / seconds,
        p50_us: us(&hist, 0.5),
        p99_us: us(&hist, 0.99),
        p999_us: us(&hist, 0.999),
        max_us: hist.max() as f64 / 1e3,
        mean_us: hist.mean() / 1e3,
    };
    Ok((round, hist))
}
