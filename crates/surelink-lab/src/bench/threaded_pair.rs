//! A surelink pair for the benches that load a server: the server runs in
//! a runtime of its own on its own thread (two workers), as it would in
//! its own process, so the callers do not compete with its readers and
//! handlers for the same worker threads; the client is in the caller's
//! runtime. Both on the two loopback networks, with member keys.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result};
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, Endpoint, PeerConfig};

use super::fixture::{CLIENT_IPS, SERVER_IPS};

pub(super) const SERVER: NodeId = NodeId(11);
const CLIENT: NodeId = NodeId(12);
const CLUSTER: ClusterId = ClusterId(0x9710);

/// The client, and what stops the server's thread.
pub(super) struct Pair {
    server_stop: Option<tokio::sync::oneshot::Sender<()>>,
    server_thread: Option<std::thread::JoinHandle<()>>,
    pub(super) client: Endpoint,
}

impl Pair {
    /// A server whose configuration (listen addresses and keys set) `bind`
    /// completes, binds and serves, on its own thread; and a client.
    pub(super) async fn start<F, Fut>(name: &str, bind: F) -> Result<Pair>
    where
        F: FnOnce(Config) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Endpoint>>,
    {
        let (listen, stop, thread) = start_server(name, bind)?;
        let mut cfg = Config::new(CLIENT, CLUSTER);
        cfg.identity = Some(keys().1.clone());
        cfg.members = keys().2.clone();
        cfg.dial_from = CLIENT_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        cfg.peers = vec![PeerConfig::new(
            SERVER,
            listen.iter().copied().map(Some).collect(),
        )];
        let client = Endpoint::bind(cfg)
            .await
            .with_context(|| format!("{name}: client"))?;
        anyhow::ensure!(
            client
                .wait_for_paths(SERVER, 2, Duration::from_secs(10))
                .await,
            "{name}: paths did not come up"
        );
        Ok(Pair {
            server_stop: Some(stop),
            server_thread: Some(thread),
            client,
        })
    }

    pub(super) async fn shutdown(mut self) {
        self.client.shutdown().await;
        if let Some(stop) = self.server_stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.server_thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

type Started = (
    Vec<SocketAddr>,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
);

fn start_server<F, Fut>(name: &str, bind: F) -> Result<Started>
where
    F: FnOnce(Config) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Endpoint>>,
{
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("{name}-server"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow::anyhow!(e)));
                    return;
                }
            };
            rt.block_on(async move {
                let mut cfg = Config::new(SERVER, CLUSTER);
                cfg.identity = Some(keys().0.clone());
                cfg.members = keys().2.clone();
                cfg.listen = SERVER_IPS
                    .iter()
                    .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
                    .collect();
                match bind(cfg).await {
                    Ok(server) => {
                        let _ = ready_tx.send(Ok(server.local_addrs()));
                        let _ = stop_rx.await;
                        server.shutdown().await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })
        .context("server thread")?;
    let listen = ready_rx.recv().context("server thread ended")??;
    Ok((listen, stop_tx, thread))
}

/// The server's and the client's key pairs, one per run, and the member
/// list naming both.
fn keys() -> &'static (surelink::Keypair, surelink::Keypair, surelink::Members) {
    static KEYS: std::sync::OnceLock<(surelink::Keypair, surelink::Keypair, surelink::Members)> =
        std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let (s, c) = (
            surelink::testing::fresh_keys(),
            surelink::testing::fresh_keys(),
        );
        let mut m = surelink::Members::new();
        let _ = m.insert(SERVER, s.public());
        let _ = m.insert(CLIENT, c.public());
        (s, c, m)
    })
}
