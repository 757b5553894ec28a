//! The proxy: memcached's text protocol on a local TCP port, each key
//! routed by the [`Ring`] to a cache node over surelink sessions (every
//! network, failover, exactly-once calls), a node the detector reports
//! dead taken out of the ring and put back when it is heard again.
//!
//! Per client connection: commands are parsed as they arrive and sent at
//! once (pipelined, in order: a node starts one peer's requests in the
//! order they were sent), replies written back in request order. Memory
//! per client is bounded: the read buffer by the largest item plus a line,
//! the commands in flight by `max_pipeline`, and the bytes of its replies
//! not yet written plus those it may still be sent by `max_reply_bytes`
//! (reading pauses at either bound; a long multi-get is fetched in chunks
//! as the client drains its replies). Replies are written as the nodes'
//! own buffers (vectored writes), never copied into one.
//!
//! Connections: at most `max_clients`, `max_clients_per_addr` from one
//! source address; one that moves no byte either way for `idle_timeout`
//! with nothing in flight is closed.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::RwLock;
use surelink::proto::role::MemberState;
use surelink::proto::NodeId;
use surelink::{Endpoint, NetEvent};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, info, warn};

use crate::ring::Ring;
use crate::text::Limits;

mod client;
mod outq;
mod replica;
mod route;
mod stats;
mod strays;

/// Keys per `get` a node is sent at once (a multi-get is split further).
pub const GET_BATCH: usize = 16;

/// The largest message cache endpoints need: a reply of [`GET_BATCH`]
/// items of memcached's largest size, and their framing.
pub const MAX_MESSAGE: u32 = 17 << 20;

/// Sets what cache endpoints (nodes and proxies) need beyond surelink's
/// defaults: messages up to [`MAX_MESSAGE`], and send and receive bounds
/// (and a path's in-flight bound) that hold two of them. `LocalCluster` and `surelink cache` apply it.
pub fn tune_endpoint(c: &mut surelink::Config) {
    c.core.max_message_size = c.core.max_message_size.max(MAX_MESSAGE);
    let two = u64::from(c.core.max_message_size) * 2 + 4096;
    c.core.send_buffer = c.core.send_buffer.max(two);
    c.core.recv_window = c
        .core
        .recv_window
        .max(u32::try_from(two).unwrap_or(u32::MAX));
    c.core.path_inflight_limit = c.core.path_inflight_limit.max(two);
}

/// The version the proxy reports (memcached's, which it speaks).
pub const VERSION: &str = "1.6.18-surelink";

/// How a proxy behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The cache nodes (surelink node ids) the ring spreads keys over.
    pub nodes: Vec<NodeId>,
    /// Item size limit and longest `get` line.
    pub limits: Limits,
    /// Client connections at once; more are closed at accept.
    pub max_clients: usize,
    /// Commands one client may have in flight; reading pauses beyond.
    pub max_pipeline: usize,
    /// How long a command waits for its node before the client gets
    /// `SERVER_ERROR`.
    pub call_timeout: Duration,
    /// Client connections from one source address (IPv6: one /64) at
    /// once; more are closed at accept.
    pub max_clients_per_addr: usize,
    /// A client that moves no byte either way for this long, with no
    /// command in flight, is closed (zero: never).
    pub idle_timeout: Duration,
    /// A client's outstanding reply bytes: replies not yet written to it,
    /// plus what its commands in flight may still bring (each `get` key
    /// counted as `max_item` until its value arrives, a value sent as its
    /// size). Reading that client's commands pauses while it is reached;
    /// a long multi-get is fetched in chunks as the client drains.
    pub max_reply_bytes: usize,
    /// PostMan helpers (their relay listen addresses) this proxy may go
    /// through to a node whose call p99 stays above `activation.sla`
    /// (empty: always direct). The nodes must list the helpers' node ids
    /// in their `helpers`.
    pub helpers: Vec<SocketAddr>,
    /// The local network a helper is dialled from.
    pub helper_network: usize,
    /// When to move to a helper and back (per node).
    pub activation: surelink::proto::helper::ActivationConfig,
    /// Nodes holding each key (1: one, memcached's way — a dead node's
    /// keys are lost). With 2 or more, a key lives on the first
    /// `replicas` nodes of the ring whatever their state: writes go to
    /// every one in the ring, reads to the least loaded and on to the
    /// next on a miss or a failure (see `replica.rs`).
    pub replicas: usize,
}

impl ProxyConfig {
    /// Defaults for `nodes`, listening on `listen`.
    pub fn new(listen: SocketAddr, nodes: Vec<NodeId>) -> ProxyConfig {
        ProxyConfig {
            listen,
            nodes,
            limits: Limits::default(),
            max_clients: 10_000,
            max_pipeline: 128,
            call_timeout: Duration::from_secs(5),
            max_clients_per_addr: 1024,
            // memcached's default is never; a slot held for ever by a
            // vanished or hostile client is worse than a pooled client
            // reconnecting after ten idle minutes.
            idle_timeout: Duration::from_secs(600),
            // One node request's worth of the largest items (GET_BATCH
            // of them): a multi-get of up to 16 keys is fetched at once.
            max_reply_bytes: GET_BATCH << 20,
            helpers: Vec::new(),
            helper_network: 0,
            activation: surelink::proto::helper::ActivationConfig::default(),
            replicas: 1,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ProxyConfigError> {
        if self.nodes.is_empty() {
            return Err(ProxyConfigError::NoNodes);
        }
        if self.max_clients == 0
            || self.max_pipeline == 0
            || self.max_clients_per_addr == 0
            || self.max_reply_bytes == 0
        {
            return Err(ProxyConfigError::Zero);
        }
        if self.call_timeout.is_zero() {
            return Err(ProxyConfigError::Zero);
        }
        if self.replicas == 0 || self.replicas > self.nodes.len() {
            return Err(ProxyConfigError::Replicas {
                replicas: self.replicas,
                nodes: self.nodes.len(),
            });
        }
        if self.limits.max_item < 1024 {
            return Err(ProxyConfigError::ItemLimit(self.limits.max_item));
        }
        if !self.helpers.is_empty() {
            self.activation
                .validate()
                .map_err(|e| ProxyConfigError::Activation(e.to_string()))?;
        }
        Ok(())
    }
}

/// A proxy configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyConfigError {
    /// No cache node to route to.
    #[error("the proxy needs at least one cache node")]
    NoNodes,
    /// `max_clients`, `max_clients_per_addr`, `max_pipeline`,
    /// `max_reply_bytes` or `call_timeout` is zero.
    #[error("max_clients, max_clients_per_addr, max_pipeline, max_reply_bytes and call_timeout must be above zero")]
    Zero,
    /// The item limit is below 1 KiB.
    #[error("max_item {0} is below 1024 bytes")]
    ItemLimit(usize),
    /// The helpers' activation settings cannot work.
    #[error("helper activation: {0}")]
    Activation(String),
    /// `replicas` is zero or more than there are nodes.
    #[error("replicas = {replicas} needs 1 to {nodes} (the cache nodes)")]
    Replicas {
        /// As configured.
        replicas: usize,
        /// Cache nodes.
        nodes: usize,
    },
}

/// Starting a proxy failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ProxyConfigError),
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Counters of a proxy (memcached's names where there is one).
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Clients connected now.
    pub curr_connections: AtomicU64,
    /// Clients accepted so far.
    pub total_connections: AtomicU64,
    /// Clients refused at `max_clients` or `max_clients_per_addr`.
    pub rejected_connections: AtomicU64,
    /// Of those, refused at `max_clients_per_addr`.
    pub rejected_per_addr: AtomicU64,
    /// Clients closed after `idle_timeout` (memcached's name).
    pub idle_kicks: AtomicU64,
    /// Outstanding reply bytes of every client now (see
    /// [`ProxyConfig::max_reply_bytes`]).
    pub reply_bytes: AtomicU64,
    /// Times a client's reading paused at `max_reply_bytes`.
    pub reply_pauses: AtomicU64,
    /// Keys asked for by `get`/`gets`.
    pub cmd_get: AtomicU64,
    /// Storage commands.
    pub cmd_set: AtomicU64,
    /// Keys touched by `touch`, `gat`/`gats`.
    pub cmd_touch: AtomicU64,
    /// Keys found.
    pub get_hits: AtomicU64,
    /// Keys not found.
    pub get_misses: AtomicU64,
    /// Commands answered `SERVER_ERROR` because their node did not answer.
    pub node_errors: AtomicU64,
    /// Times a node was taken out of the ring.
    pub ejections: AtomicU64,
    /// Commands (or a multi-get's part) sent again to another node
    /// because theirs left the ring or restarted.
    pub rerouted: AtomicU64,
    /// Replicated writes that failed on one replica still in the ring,
    /// whose key was then deleted there.
    pub mended: AtomicU64,
}

struct Shared {
    ep: Arc<Endpoint>,
    cfg: ProxyConfig,
    ring: RwLock<Ring>,
    /// The ring's generation: bumped on every change (commands waiting on
    /// a node watch it).
    gen: watch::Receiver<u64>,
    stats: ProxyStats,
    started: Instant,
    /// Open client connections per source address.
    per_addr: parking_lot::Mutex<HashMap<IpAddr, usize>>,
    /// Reads in flight per node (a replicated read goes to the least
    /// loaded replica).
    load: HashMap<NodeId, AtomicU64>,
    /// Keys written on a node other than their own (`strays.rs`).
    strays: parking_lot::Mutex<strays::Strays>,
}

/// A running proxy.
pub struct Proxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Activation towards each node, when the proxy has helpers.
    helped: Vec<(NodeId, surelink::Helped)>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).finish()
    }
}

impl Proxy {
    /// Listens on `cfg.listen` and serves clients through `ep` (which must
    /// know the cache nodes as peers).
    pub async fn start(ep: Arc<Endpoint>, cfg: ProxyConfig) -> Result<Proxy, ProxyError> {
        cfg.validate()?;
        let listener =
            TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| ProxyError::Listen {
                    addr: cfg.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Listen {
            addr: cfg.listen,
            source,
        })?;
        let (gen_tx, gen) = watch::channel(0);
        let cfg_nodes = cfg.nodes.clone();
        let shared = Arc::new(Shared {
            ring: RwLock::new(Ring::new(&cfg.nodes)),
            ep,
            cfg,
            gen,
            stats: ProxyStats::default(),
            started: Instant::now(),
            per_addr: parking_lot::Mutex::new(HashMap::new()),
            load: cfg_nodes.iter().map(|&n| (n, AtomicU64::new(0))).collect(),
            strays: parking_lot::Mutex::new(strays::Strays::default()),
        });
        let mut helped = Vec::new();
        if !shared.cfg.helpers.is_empty() {
            for &node in &shared.cfg.nodes {
                let h = shared
                    .ep
                    .helped(
                        node,
                        shared.cfg.helpers.clone(),
                        shared.cfg.helper_network,
                        shared.cfg.activation.clone(),
                    )
                    .map_err(|e| ProxyConfigError::Activation(e.to_string()))?;
                helped.push((node, h));
            }
        }
        let events = tokio::spawn(watch_nodes(shared.clone(), gen_tx));
        let accept = tokio::spawn(accept_loop(shared.clone(), listener));
        Ok(Proxy {
            shared,
            addr,
            tasks: vec![events, accept],
            helped,
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn stats(&self) -> &ProxyStats {
        &self.shared.stats
    }

    /// Per node, what helper activation is doing (empty without helpers).
    pub fn helpers_status(&self) -> Vec<(NodeId, surelink::HelpedStatus)> {
        self.helped.iter().map(|(n, h)| (*n, h.status())).collect()
    }

    /// Nodes currently out of the ring.
    pub fn ejected(&self) -> Vec<NodeId> {
        self.shared.ring.read().ejected().collect()
    }

    /// Stops accepting and watching (open client connections end when
    /// their clients leave).
    pub fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ejects nodes the detector reports dead or whose process is gone
/// (connections refused on every network); puts them back when heard,
/// after emptying them.
///
/// A node comes back into the ring empty: while it was out its keys were
/// written elsewhere, so what it still holds may be stale (a node that
/// restarted is empty anyway; one that was only cut off is not). Its
/// `flush_all` is a proxy's call like any other, so it runs after every
/// command this proxy sent it before.
async fn watch_nodes(shared: Arc<Shared>, gen: watch::Sender<u64>) {
    let gen = Arc::new(gen);
    let mut events = shared.ep.events();
    let ours = |p: &NodeId| shared.cfg.nodes.contains(p);
    let mut restoring = Restoring::new();
    loop {
        let e = match events.recv().await {
            Ok(e) => e,
            Err(surelink::RecvError::Lagged(n)) => {
                // Events were missed: a node's state may be stale until its
                // next event. Rare (the hub keeps many), so say it.
                warn!(missed = n, "proxy missed endpoint events");
                continue;
            }
            Err(_) => return,
        };
        restoring.retain(|_, t| !t.is_finished());
        match e {
            // Dead (the detector: silent for its whole window), or its
            // process gone (every network refuses connections: a crash on
            // a live host, known within a round trip — waiting for the
            // detector would hold every client whose pipeline has one of
            // its commands for the whole window).
            NetEvent::PeerDead { peer } | NetEvent::PeerRefused { peer } if ours(&peer) => {
                eject(&shared, &gen, &mut restoring, peer, &e);
            }
            NetEvent::PeerAlive { peer } | NetEvent::PeerUp { peer, .. }
                if ours(&peer) && !table_says_down(&shared.ep, peer) =>
            {
                start_restore(&shared, &gen, &mut restoring, peer);
            }
            // The role server's ring view, shared by every proxy: a node
            // the cluster's detectors report dead leaves this proxy's ring
            // too, even while this proxy still reaches it (so every proxy
            // places keys alike); one it reports up again comes back
            // (emptied first) once this proxy reaches it.
            NetEvent::RoutingTable { .. } => {
                let Some(table) = shared.ep.role_status().and_then(|s| s.table) else {
                    continue;
                };
                let reached: Vec<NodeId> =
                    shared.ep.paths().iter().filter_map(|p| p.peer).collect();
                for m in table.ring.iter().filter(|m| ours(&m.node)) {
                    match m.state {
                        MemberState::Down => eject(&shared, &gen, &mut restoring, m.node, &e),
                        MemberState::Up if reached.contains(&m.node) => {
                            start_restore(&shared, &gen, &mut restoring, m.node);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

type Restoring = std::collections::HashMap<NodeId, tokio::task::JoinHandle<()>>;

/// Takes `node` out of the ring (stopping its restore, if one runs).
fn eject(
    shared: &Arc<Shared>,
    gen: &watch::Sender<u64>,
    restoring: &mut Restoring,
    node: NodeId,
    why: &NetEvent,
) {
    if let Some(t) = restoring.remove(&node) {
        t.abort();
    }
    if shared.ring.write().eject(node) {
        shared.stats.ejections.fetch_add(1, Relaxed);
        gen.send_modify(|g| *g += 1);
        warn!(%node, ?why, "cache node out of the ring");
    }
}

/// Starts emptying an ejected `node` and putting it back, unless that runs.
fn start_restore(
    shared: &Arc<Shared>,
    gen: &Arc<watch::Sender<u64>>,
    restoring: &mut Restoring,
    node: NodeId,
) {
    if shared.ring.read().is_ejected(node) && !restoring.contains_key(&node) {
        let task = tokio::spawn(restore(shared.clone(), gen.clone(), node));
        restoring.insert(node, task);
    }
}

/// Whether the role server's table (if any) reports `node` dead.
fn table_says_down(ep: &Endpoint, node: NodeId) -> bool {
    ep.role_status()
        .and_then(|s| s.table)
        .is_some_and(|t| t.member(node) == Some(MemberState::Down))
}

/// Empties `node` and puts it back into the ring; retried until it
/// answers (the task is aborted if the node is reported dead again).
async fn restore(shared: Arc<Shared>, gen: Arc<watch::Sender<u64>>, node: NodeId) {
    let flush = Bytes::from_static(b"flush_all\r\n");
    loop {
        match shared
            .ep
            .call(
                node,
                crate::node::CACHE_CHANNEL,
                flush.clone(),
                shared.cfg.call_timeout,
            )
            .await
        {
            Ok(r) if &r[..] == b"OK\r\n" => break,
            Ok(r) => {
                warn!(%node, reply = %String::from_utf8_lossy(&r), "node refused flush_all before rejoining")
            }
            Err(e) => debug!(%node, error = %e, "flush_all before rejoining failed; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if shared.ring.write().restore(node) {
        gen.send_modify(|g| *g += 1);
        info!(%node, "cache node back in the ring (emptied)");
    }
    // Its own task: a new ejection aborts this one, and must not stop a
    // clean-up that took the strays already.
    tokio::spawn(clean_strays(shared, node));
}

/// Deletes what `node`'s keys left on other nodes while it was out (it is
/// back: those copies are no longer read, and must not be if it fails
/// again). Nodes that took too many of its keys to remember are emptied.
async fn clean_strays(shared: Arc<Shared>, node: NodeId) {
    let left = shared.strays.lock().take(node);
    let timeout = shared.cfg.call_timeout;
    let flush = Bytes::from_static(b"flush_all\r\n");
    let mut calls = Vec::new();
    for n in left.flush {
        warn!(%node, at = %n, "emptying a node that took too many of a returning node's keys");
        calls.push((n, flush.clone()));
    }
    for (n, keys) in left.keys {
        calls.extend(keys.iter().map(|k| (n, strays::delete(k))));
    }
    let done = calls.len();
    for chunk in calls.chunks(256) {
        let sent = chunk.iter().map(|(n, body)| {
            shared
                .ep
                .call(*n, crate::node::CACHE_CHANNEL, body.clone(), timeout)
        });
        for r in futures_util::future::join_all(sent).await {
            if let Err(e) = r {
                // That node is gone or going: it comes back empty.
                debug!(error = %e, "deleting a stray copy failed");
            }
        }
    }
    if done > 0 {
        info!(%node, copies = done, "stray copies of a returned node's keys deleted");
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(shared.cfg.max_clients));
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of fds and the like: wait instead of spinning.
                debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            shared.stats.rejected_connections.fetch_add(1, Relaxed);
            drop(stream);
            continue;
        };
        let Some(place) = AddrPlace::take(&shared, source_key(from.ip())) else {
            shared.stats.rejected_connections.fetch_add(1, Relaxed);
            shared.stats.rejected_per_addr.fetch_add(1, Relaxed);
            drop(stream);
            continue;
        };
        shared.stats.total_connections.fetch_add(1, Relaxed);
        shared.stats.curr_connections.fetch_add(1, Relaxed);
        let s = shared.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            if let Err(e) = client::client(&s, stream).await {
                debug!(%from, error = %e, "client connection ended");
            }
            s.stats.curr_connections.fetch_sub(1, Relaxed);
            drop(place);
            drop(permit);
        });
    }
}

/// What `max_clients_per_addr` counts a client under: its IPv4 address
/// (also when it comes as an IPv4-mapped IPv6 one), or its IPv6 /64 —
/// one host usually holds a whole /64, so counting its addresses one by
/// one would cap nothing.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// One client's place under `max_clients_per_addr`; given back on drop.
struct AddrPlace {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl AddrPlace {
    fn take(shared: &Arc<Shared>, ip: IpAddr) -> Option<AddrPlace> {
        let mut m = shared.per_addr.lock();
        let n = m.entry(ip).or_insert(0);
        if *n >= shared.cfg.max_clients_per_addr {
            return None;
        }
        *n += 1;
        Some(AddrPlace {
            shared: shared.clone(),
            ip,
        })
    }
}

impl Drop for AddrPlace {
    fn drop(&mut self) {
        let mut m = self.shared.per_addr.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                // The map holds only addresses with a client now.
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_counted_per_ipv4_address_and_per_ipv6_64() {
        let k = |s: &str| source_key(s.parse().unwrap());
        assert_eq!(k("192.0.2.7"), k("::ffff:192.0.2.7"));
        assert_ne!(k("192.0.2.7"), k("192.0.2.8"));
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
    }
}
