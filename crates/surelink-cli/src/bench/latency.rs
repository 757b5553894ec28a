//! Latency rounds: concurrent callers timing round trips into
//! HdrHistograms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use surelink::Endpoint;

use super::fixture::{CALL_TIMEOUT, SERVER};
use super::report::{new_histogram, us, LatencyRound};
use super::tcp::TcpRpc;
use super::Plan;

/// Who the latency callers call.
#[derive(Clone)]
pub(super) enum Caller {
    Surelink(Endpoint),
    Tcp(Arc<TcpRpc>),
}

impl Caller {
    pub(super) async fn call(&self, payload: &Bytes) -> Result<Bytes> {
        match self {
            Caller::Surelink(ep) => Ok(ep.call(SERVER, 0, payload.clone(), CALL_TIMEOUT).await?),
            Caller::Tcp(rpc) => rpc.call(payload).await,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What one caller task saw.
struct CallerOutcome {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

/// One caller: calls back to back until `until`, recording the round trips
/// of calls started at or after `record_from`.
async fn caller_loop(
    caller: Caller,
    payload: Bytes,
    record_from: Instant,
    until: Instant,
) -> Result<CallerOutcome> {
    let mut hist = new_histogram()?;
    let mut errors = 0;
    let mut first_error = None;
    loop {
        let start = Instant::now();
        if start >= until {
            break;
        }
        let result = caller.call(&payload).await;
        let rtt = start.elapsed();
        match result {
            Ok(reply) if reply == payload => {
                if start >= record_from {
                    hist.saturating_record(nanos(rtt));
                }
            }
            Ok(reply) => {
                errors += 1;
                first_error.get_or_insert_with(|| {
                    format!("reply of {} bytes differs from the request", reply.len())
                });
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Ok(CallerOutcome {
        hist,
        errors,
        first_error,
    })
}

/// One latency round of one contender: `callers` concurrent callers.
pub(super) async fn latency_round(
    caller: &Caller,
    payload: &Bytes,
    callers: usize,
    plan: &Plan,
) -> Result<(LatencyRound, Histogram<u64>)> {
    let record_from = Instant::now() + plan.warmup;
    let until = record_from + plan.measure;
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            tokio::spawn(caller_loop(
                caller.clone(),
                payload.clone(),
                record_from,
                until,
            ))
        })
        .collect();
    let mut hist = new_histogram()?;
    let mut errors = 0;
    let mut first_error = None;
    for t in tasks {
        let o = t.await.context("a caller task failed")??;
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
