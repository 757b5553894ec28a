//! Both contenders set up once for the whole run: the surelink endpoints
//! (an echo server on two loopback networks and its client) and the plain-TCP
//! baseline, the addresses they use, and the receivers' delivery counter.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, DetectorConfig, Endpoint, PeerConfig, Request, StatsSnapshot};
use tokio::task::JoinHandle;

use super::tcp::{TcpRpc, TcpSink};

pub(super) const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);
const CLUSTER: ClusterId = ClusterId(0xbe7c);
/// Timeout of every call, both contenders.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the paths may take to come up.
const PATHS_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) const SERVER_IPS: [Ipv4Addr; 2] =
    [Ipv4Addr::new(127, 0, 1, 1), Ipv4Addr::new(127, 0, 2, 1)];
pub(super) const CLIENT_IPS: [Ipv4Addr; 2] =
    [Ipv4Addr::new(127, 0, 1, 2), Ipv4Addr::new(127, 0, 2, 2)];

/// Both contenders, set up once for the whole run.
pub(super) struct Fixture {
    pub(super) surelink: SurelinkPair,
    pub(super) tcp_rpc: Arc<TcpRpc>,
    pub(super) tcp_sink: TcpSink,
    /// The baseline's tasks (echo server, reply reader, sink reader).
    tcp_tasks: Vec<JoinHandle<Result<()>>>,
}

impl Fixture {
    pub(super) async fn setup() -> Result<Fixture> {
        let surelink = SurelinkPair::setup(DetectorConfig::default()).await?;
        let tcp = async {
            let (tcp_rpc, mut tcp_tasks) = TcpRpc::setup().await?;
            match TcpSink::setup().await {
                Ok((tcp_sink, sink_task)) => {
                    tcp_tasks.push(sink_task);
                    Ok((tcp_rpc, tcp_sink, tcp_tasks))
                }
                Err(e) => {
                    tcp_tasks.iter().for_each(JoinHandle::abort);
                    Err(e)
                }
            }
        };
        match tcp.await {
            Ok((tcp_rpc, tcp_sink, tcp_tasks)) => Ok(Fixture {
                surelink,
                tcp_rpc,
                tcp_sink,
                tcp_tasks,
            }),
            Err(e) => {
                surelink.shutdown().await;
                Err(e.context("setting up the plain-TCP baseline"))
            }
        }
    }

    pub(super) async fn shutdown(self) {
        for t in &self.tcp_tasks {
            t.abort();
        }
        self.tcp_rpc.close();
        self.surelink.shutdown().await;
    }
}

/// Messages and payload bytes delivered to a receiving application.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    msgs: AtomicU64,
    bytes: AtomicU64,
}

impl Delivered {
    pub(super) fn add(&self, payload_len: usize) {
        self.msgs.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(
            u64::try_from(payload_len).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(super) fn msgs(&self) -> u64 {
        self.msgs.load(Ordering::Relaxed)
    }

    pub(super) fn snapshot(&self) -> (u64, u64, Instant) {
        (
            self.msgs.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            Instant::now(),
        )
    }
}

/// The surelink contender: an echo server on two networks and its client.
pub(super) struct SurelinkPair {
    pub(super) server: Endpoint,
    pub(super) client: Endpoint,
    pub(super) delivered: Arc<Delivered>,
    receiver: JoinHandle<()>,
}

impl SurelinkPair {
    /// Two endpoints on two networks with `detector` on both.
    pub(super) async fn setup(detector: DetectorConfig) -> Result<SurelinkPair> {
        let mut cfg = Config::new(SERVER, CLUSTER);
        cfg.detector = detector.clone();
        cfg.listen = SERVER_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        let server = Endpoint::bind(cfg)
            .await
            .context("binding the surelink server")?;
        server.serve(|r: Request| async move { r.body });

        let delivered = Arc::new(Delivered::default());
        let receiver = {
            let server = server.clone();
            let delivered = delivered.clone();
            tokio::spawn(async move {
                // Batches, as the baseline takes whole reads: one lock per batch.
                let mut batch = Vec::with_capacity(1024);
                while server.recv_many(&mut batch, 1024).await > 0 {
                    for m in batch.drain(..) {
                        delivered.add(m.body.len());
                    }
                }
            })
        };

        let mut cfg = Config::new(CLIENT, CLUSTER);
        cfg.detector = detector;
        cfg.dial_from = CLIENT_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        cfg.peers = vec![PeerConfig::new(
            SERVER,
            server.local_addrs().into_iter().map(Some).collect(),
        )];
        let client = match Endpoint::bind(cfg).await {
            Ok(c) => c,
            Err(e) => {
                receiver.abort();
                server.shutdown().await;
                return Err(e).context("binding the surelink client");
            }
        };
        let pair = SurelinkPair {
            server,
            client,
            delivered,
            receiver,
        };
        let up = async {
            wait_paths(&pair.client, 2).await?;
            wait_paths(&pair.server, 2).await
        };
        if let Err(e) = up.await {
            pair.shutdown().await;
            return Err(e);
        }
        Ok(pair)
    }

    pub(super) async fn shutdown(self) {
        // Both at once: each closes its session before the other's
        // connections go, so neither reports the other unreachable.
        tokio::join!(self.client.shutdown(), self.server.shutdown());
        self.receiver.abort();
    }
}

/// Waits until `ep` has `n` active paths (there is no readiness signal in
/// the API, so this polls the session stats as the loopback tests do).
async fn wait_paths(ep: &Endpoint, n: usize) -> Result<()> {
    let deadline = Instant::now() + PATHS_TIMEOUT;
    loop {
        if active_paths(&ep.stats()) >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "node {}: {n} active paths did not come up within {PATHS_TIMEOUT:?} (connections: {:?})",
                ep.node(),
                ep.paths()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn active_paths(s: &StatsSnapshot) -> usize {
    s.sessions
        .iter()
        .map(|(_, st)| st.paths.iter().filter(|p| p.active).count())
        .sum()
}
