//! `surelink call`: a ping client from a configuration file. It calls one
//! peer (an echo server) a number of times, prints each reply's round
//! trip, then the minimum, median and maximum.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use surelink::proto::NodeId;

use crate::config_file::{self};
use crate::start::StartError;

/// What to call, how often, how large.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PingOptions {
    /// The node to call.
    pub peer: NodeId,
    /// Calls to make (at least one).
    pub count: u64,
    /// Request size in bytes.
    pub size: usize,
    /// Pause between calls.
    pub interval: Duration,
    /// Per-call deadline.
    pub timeout: Duration,
}

impl PingOptions {
    /// Ten 64-byte calls to `peer`, 100 ms apart, each within 2 s (the
    /// binary's defaults).
    pub fn new(peer: NodeId) -> PingOptions {
        PingOptions {
            peer,
            count: 10,
            size: 64,
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(2000),
        }
    }
}

/// Why the ping client failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PingError {
    /// `count` was zero.
    #[error("--count must be positive")]
    ZeroCount,
    /// Loading or binding.
    #[error(transparent)]
    Start(#[from] StartError),
    /// Some calls failed or came back with another body (each is printed
    /// as it happens).
    #[error("{failed} of {count} calls failed")]
    Failed {
        /// Calls that failed.
        failed: u64,
        /// Calls made.
        count: u64,
    },
}

/// Calls `opts.peer` from the endpoint the configuration file `config`
/// describes, printing every reply and a summary.
pub async fn call(config: &Path, opts: &PingOptions) -> Result<(), PingError> {
    if opts.count == 0 {
        return Err(PingError::ZeroCount);
    }
    let loaded = config_file::load(config).map_err(StartError::from)?;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref())
        .await
        .map_err(StartError::from)?;
    let relays = crate::start::relays(&ep, &loaded.relays);
    if !relays.is_empty() {
        let _ = ep
            .wait_for_paths(opts.peer, 1, std::time::Duration::from_secs(5))
            .await;
    }
    let body = Bytes::from(vec![0x5a; opts.size]);
    let mut rtts = Vec::new();
    let mut errors = 0;
    for i in 0..opts.count {
        let t = Instant::now();
        match ep.call(opts.peer, 0, body.clone(), opts.timeout).await {
            Ok(reply) if reply == body => {
                let rtt = t.elapsed();
                println!(
                    "reply {i}: {} bytes in {:.1} µs",
                    reply.len(),
                    rtt.as_secs_f64() * 1e6
                );
                rtts.push(rtt);
            }
            Ok(reply) => {
                errors += 1;
                println!("reply {i}: unexpected body of {} bytes", reply.len());
            }
            Err(e) => {
                errors += 1;
                println!("call {i}: {e}");
            }
        }
        tokio::time::sleep(opts.interval).await;
    }
    // A sorted list of the samples is all three figures need.
    rtts.sort();
    if let (Some(min), Some(max)) = (rtts.first(), rtts.last()) {
        let p50 = rtts[rtts.len() / 2];
        println!(
            "{} replies, {errors} errors; rtt min {:.1} µs, p50 {:.1} µs, max {:.1} µs",
            rtts.len(),
            min.as_secs_f64() * 1e6,
            p50.as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e6
        );
    }
    role.stop().await;
    ep.shutdown().await;
    if errors > 0 {
        return Err(PingError::Failed {
            failed: errors,
            count: opts.count,
        });
    }
    Ok(())
}
