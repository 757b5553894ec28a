//! The surelink contender, and every call the bench makes into surelink's
//! API: an echo server endpoint on two loopback networks and its client,
//! a call, the throughput sender and receiver, and the endpoints' own
//! counters for the report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde::Serialize;
use surelink::proto::secure::RecordCipher;
use surelink::proto::NodeId;
use surelink::testing::{Loopback, LoopbackPair};
use surelink::{DetectorConfig, Endpoint, Request, StatsSnapshot};
use tokio::task::coop::consume_budget;
use tokio::task::JoinHandle;

use super::fixture::{Delivered, CALL_TIMEOUT};
use super::report::ThroughputRound;
use super::throughput::{measure_task, Delivery};
use super::Plan;

/// How the contender is set up, for `bench.json`.
pub(super) const DESCRIPTION: &str =
    "Config::new defaults (authenticated, encrypted); 2 networks, 1 connection per network; echo handler; recv_batches receiver";

/// The fixture's server node.
pub(super) const SERVER: NodeId = NodeId(1);
/// How long the paths may take to come up.
const PATHS_TIMEOUT: Duration = Duration::from_secs(10);

/// The surelink contender: an echo server on two networks and its client.
pub(super) struct SurelinkPair {
    pub(super) server: Endpoint,
    pub(super) client: Endpoint,
    pub(super) delivered: Arc<Delivered>,
    receiver: JoinHandle<()>,
}

impl SurelinkPair {
    /// The shared two-network fixture (`surelink::testing::Loopback`) with
    /// `detector` on both ends: an echo server and its client, both paths
    /// up.
    /// `insecure`: both ends without authentication (the baseline that
    /// shows what it costs).
    pub(super) async fn setup(detector: DetectorConfig, insecure: bool) -> Result<SurelinkPair> {
        SurelinkPair::setup_preferring(detector, insecure, None).await
    }

    /// [`SurelinkPair::setup`] with both ends preferring `cipher` (`None`:
    /// the default, the faster on this CPU).
    pub(super) async fn setup_preferring(
        detector: DetectorConfig,
        insecure: bool,
        cipher: Option<RecordCipher>,
    ) -> Result<SurelinkPair> {
        let mut lb = Loopback::new();
        lb.server.record_cipher = cipher;
        lb.client.record_cipher = cipher;
        lb.server.insecure = insecure;
        lb.client.insecure = insecure;
        lb.server.detector = detector.clone();
        lb.client.detector = detector;
        lb.paths_timeout = PATHS_TIMEOUT;
        let LoopbackPair { server, client } = lb
            .start()
            .await
            .context("starting the surelink server and client on loopback")?;
        server.serve(|r: Request| async move { r.body });
        let delivered = Arc::new(Delivered::default());
        let receiver = {
            let server = server.clone();
            let delivered = delivered.clone();
            tokio::spawn(async move {
                // Whole frames, as the baseline takes whole reads: one lock
                // per batch, messages read in place.
                let mut batches = Vec::with_capacity(64);
                while server.recv_batches(&mut batches, 1024).await > 0 {
                    for b in batches.drain(..) {
                        for body in b.iter() {
                            delivered.add(body.len());
                        }
                    }
                }
            })
        };
        Ok(SurelinkPair {
            server,
            client,
            delivered,
            receiver,
        })
    }

    pub(super) async fn shutdown(self) {
        // Both at once: each closes its session before the other's
        // connections go, so neither reports the other unreachable.
        tokio::join!(self.client.shutdown(), self.server.shutdown());
        self.receiver.abort();
    }

    /// One throughput round: `send` in a loop, `recv_batches` counting.
    pub(super) async fn throughput_round(
        &self,
        payload: &Bytes,
        plan: &Plan,
    ) -> Result<ThroughputRound> {
        let (round, ()) = measure_task(&self.delivered, plan, Delivery::Reliable, |stop| {
            send_loop(self.client.clone(), payload.clone(), stop)
        })
        .await?;
        settle(&self.client).await;
        Ok(round)
    }
}

/// One call of a latency caller: the echo of `payload`.
pub(super) async fn call(client: &Endpoint, payload: &Bytes) -> Result<Bytes> {
    Ok(client
        .call(SERVER, 0, payload.clone(), CALL_TIMEOUT)
        .await?)
}

/// The throughput sender: `send` until told to stop; returns the count.
async fn send_loop(client: Endpoint, payload: Bytes, stop: Arc<AtomicBool>) -> Result<((), u64)> {
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        client.send(SERVER, 0, payload.clone()).await?;
        sent += 1;
        consume_budget().await;
    }
    Ok(((), sent))
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

/// The endpoints' own counters at the end of the run (were both paths used,
/// was anything re-sent).
#[derive(Default, Serialize)]
pub(super) struct SurelinkStats {
    client: EndpointStats,
    server: EndpointStats,
}

#[derive(Default, Serialize)]
struct EndpointStats {
    messages_sent: u64,
    messages_received: u64,
    bytes_sent: u64,
    bytes_received: u64,
    calls: u64,
    call_errors: u64,
    paths_up: u64,
    paths_down: u64,
    resent: u64,
    timeouts: u64,
    /// Frames that arrived ahead of a gap (sent on another path) and
    /// waited in the reorder buffer.
    frames_reordered: u64,
    paths: Vec<PathStats>,
}

#[derive(Serialize)]
struct PathStats {
    id: String,
    active: bool,
    srtt_us: f64,
    data_sent: u64,
    data_received: u64,
    resent: u64,
    timeouts: u64,
}

impl SurelinkStats {
    pub(super) fn collect(pair: &SurelinkPair) -> SurelinkStats {
        SurelinkStats {
            client: EndpointStats::from(&pair.client.stats()),
            server: EndpointStats::from(&pair.server.stats()),
        }
    }
}

impl From<&StatsSnapshot> for EndpointStats {
    fn from(s: &StatsSnapshot) -> Self {
        let sessions = s.sessions.iter().map(|(_, st)| st);
        EndpointStats {
            messages_sent: s.messages_sent,
            messages_received: s.messages_received,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            calls: s.calls,
            call_errors: s.call_errors,
            paths_up: s.paths_up,
            paths_down: s.paths_down,
            resent: sessions.clone().map(|st| st.resent).sum(),
            timeouts: sessions.clone().map(|st| st.timeouts).sum(),
            frames_reordered: sessions.clone().map(|st| st.frames_reordered).sum(),
            paths: sessions
                .flat_map(|st| st.paths.iter())
                .map(|p| PathStats {
                    id: p.id.to_string(),
                    active: p.active,
                    srtt_us: p.srtt.as_secs_f64() * 1e6,
                    data_sent: p.stats.data_sent,
                    data_received: p.stats.data_received,
                    resent: p.stats.resent,
                    timeouts: p.stats.timeouts,
                })
                .collect(),
        }
    }
}
