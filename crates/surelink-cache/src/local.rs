//! A whole cache cluster in one process on loopback, over two networks:
//! `n` cache nodes with the embedded store and one proxy endpoint dialling
//! each on both — what the demo, the tests and `bench cache` start.
//! Every endpoint has a fresh key pair and the others' public keys, and
//! the product's default configuration.
//!
//! The nodes start first ([`LocalCluster::bind_nodes`]); the proxy then
//! dials each node at the addresses its caller names
//! ([`LocalNodes::start_proxy`]) — the nodes' own, or a fault-injecting
//! relay's in front of them, as the demo does.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use surelink::proto::role::RoleConfig;
use surelink::proto::{ClusterId, NodeId};
use surelink::{BindError, Config, Endpoint, Keypair, Members, PeerConfig};

use crate::proxy::{Proxy, ProxyConfig, ProxyError};
use crate::shards::{Shards, DEFAULT_SHARDS};
use crate::text::Limits;

/// The proxy endpoint's node id (cache nodes are 1..=n).
pub const PROXY_NODE: NodeId = NodeId(100);

/// Starting a local cluster failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// An endpoint did not bind.
    #[error("binding node {node}: {source}")]
    Bind {
        /// The node.
        node: NodeId,
        /// Why.
        source: BindError,
    },
    /// The OS random source failed making a key pair.
    #[error("generating a key pair: {0}")]
    Keys(String),
    /// The proxy's paths to a node did not come up.
    #[error("no paths to node {0} within 10 s")]
    NoPaths(NodeId),
    /// The proxy did not start.
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    /// A node could not reach its memcached.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// What a local cluster's nodes keep items in.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Items {
    /// The embedded store, this many bytes per node.
    Embedded(u64),
    /// Node `i` fronts the memcached at the `i`-th address.
    Memcached(Vec<SocketAddr>),
}

/// A running cluster.
pub struct LocalCluster {
    /// Node ids, keys and listen addresses, to restart a node.
    nodes: Vec<NodeSlot>,
    members: Members,
    /// The proxy's surelink endpoint.
    pub proxy_ep: Arc<Endpoint>,
    /// The proxy.
    pub proxy: Proxy,
    items: Items,
    /// The role service, when the cluster runs one.
    role: Option<RoleConfig>,
}

struct NodeSlot {
    id: NodeId,
    keys: Keypair,
    listen: Vec<SocketAddr>,
    ep: Option<Endpoint>,
}

fn addr(net: u8, host: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, net, host)), port)
}

fn keypair() -> Result<Keypair, LocalError> {
    Keypair::generate().map_err(|e| LocalError::Keys(e.to_string()))
}

/// Binds a cache node with a fresh embedded store, or fronting its
/// memcached (on its previous addresses after a restart).
async fn bind_node(
    s: &mut NodeSlot,
    members: &Members,
    items: &Items,
    role: Option<(&RoleConfig, Vec<PeerConfig>)>,
) -> Result<(), LocalError> {
    let mut cfg = Config::new(s.id, ClusterId(9));
    crate::proxy::tune_endpoint(&mut cfg);
    cfg.identity = Some(s.keys.clone());
    cfg.members = members.clone();
    if let Some((r, peers)) = role {
        cfg.role = Some(r.clone());
        cfg.peers = peers;
    }
    let host = 10u8.wrapping_add(s.id.0.to_le_bytes()[0]);
    cfg.listen = if s.listen.is_empty() {
        vec![addr(1, host, 0), addr(2, host, 0)]
    } else {
        s.listen.clone()
    };
    if matches!(items, Items::Embedded(_)) {
        crate::node::configure(&mut cfg, DEFAULT_SHARDS);
    }
    let ep = Endpoint::bind(cfg)
        .await
        .map_err(|source| LocalError::Bind { node: s.id, source })?;
    match items {
        Items::Embedded(memory) => {
            let store = Arc::new(Shards::new(*memory, DEFAULT_SHARDS));
            crate::node::serve_store(&ep, store, Limits::default());
        }
        Items::Memcached(addrs) => {
            let i = usize::try_from(s.id.0 - 1).unwrap_or(0);
            let addr = addrs[i % addrs.len().max(1)];
            let h = crate::backend::MemcachedHandler::connect(addr, 1, Limits::default()).await?;
            crate::backend::serve_backend(&ep, h);
        }
    }
    s.listen = ep.local_addrs();
    s.ep = Some(ep);
    Ok(())
}

/// The cache nodes of a cluster whose proxy has not started yet.
pub struct LocalNodes {
    nodes: Vec<NodeSlot>,
    members: Members,
    proxy_keys: Keypair,
    items: Items,
    role: Option<RoleConfig>,
}

/// A node's own listen addresses in `addrs` (as from [`LocalNodes::addrs`]).
fn direct_addrs(addrs: &[(NodeId, Vec<SocketAddr>)], id: NodeId) -> Vec<SocketAddr> {
    addrs
        .iter()
        .find(|(n, _)| *n == id)
        .map(|(_, a)| a.clone())
        .unwrap_or_default()
}

impl LocalNodes {
    /// Each node's listen addresses, one per network.
    pub fn addrs(&self) -> Vec<(NodeId, Vec<SocketAddr>)> {
        self.nodes
            .iter()
            .map(|s| (s.id, s.listen.clone()))
            .collect()
    }

    /// Starts the proxy endpoint, dialling node `id` at `dial(id)` (one
    /// address per network), and the memcached-protocol proxy on
    /// `listen`; returns once the proxy has both paths to every node.
    pub async fn start_proxy(
        self,
        listen: SocketAddr,
        dial: impl Fn(NodeId) -> Vec<SocketAddr>,
    ) -> Result<LocalCluster, LocalError> {
        self.start_proxy_tuned(listen, dial, |_| {}).await
    }

    /// As [`LocalNodes::start_proxy`], the proxy's configuration changed
    /// by `tune` first (say, `replicas`).
    pub async fn start_proxy_tuned(
        self,
        listen: SocketAddr,
        dial: impl Fn(NodeId) -> Vec<SocketAddr>,
        tune: impl FnOnce(&mut ProxyConfig),
    ) -> Result<LocalCluster, LocalError> {
        let LocalNodes {
            nodes,
            members,
            proxy_keys,
            items,
            role,
        } = self;
        let mut pc = Config::new(PROXY_NODE, ClusterId(9));
        crate::proxy::tune_endpoint(&mut pc);
        pc.identity = Some(proxy_keys);
        pc.members = members.clone();
        pc.dial_from = vec![addr(1, 2, 0), addr(2, 2, 0)];
        pc.role = role.clone();
        pc.peers = nodes
            .iter()
            .map(|s| PeerConfig::new(s.id, dial(s.id).into_iter().map(Some).collect()))
            .collect();
        let proxy_ep = Arc::new(
            Endpoint::bind(pc)
                .await
                .map_err(|source| LocalError::Bind {
                    node: PROXY_NODE,
                    source,
                })?,
        );
        for s in &nodes {
            if !proxy_ep
                .wait_for_paths(s.id, 2, Duration::from_secs(10))
                .await
            {
                return Err(LocalError::NoPaths(s.id));
            }
        }
        let ids = nodes.iter().map(|s| s.id).collect();
        let mut cfg = ProxyConfig::new(listen, ids);
        tune(&mut cfg);
        let proxy = Proxy::start(proxy_ep.clone(), cfg).await?;
        Ok(LocalCluster {
            nodes,
            members,
            proxy_ep,
            proxy,
            items,
            role,
        })
    }
}

/// Peer entries for the nodes in `before` (a node dials those listed
/// before it, so each pair of nodes has one session).
fn earlier_peers(before: &[NodeSlot]) -> Vec<PeerConfig> {
    before
        .iter()
        .map(|s| PeerConfig::new(s.id, s.listen.iter().copied().map(Some).collect()))
        .collect()
}

impl LocalCluster {
    /// `n` nodes with `memory` bytes each, and a proxy listening on
    /// `listen` (port 0: any).
    pub async fn start(
        n: u64,
        memory: u64,
        listen: SocketAddr,
    ) -> Result<LocalCluster, LocalError> {
        Self::start_with(n, Items::Embedded(memory), listen).await
    }

    /// `n` nodes keeping items as `items` says, and a proxy on `listen`.
    pub async fn start_with(
        n: u64,
        items: Items,
        listen: SocketAddr,
    ) -> Result<LocalCluster, LocalError> {
        Self::start_full(n, items, listen, false).await
    }

    /// `n` nodes keeping items as `items` says, and a proxy on `listen`
    /// configured by `tune` (say, `replicas`).
    pub async fn start_tuned(
        n: u64,
        items: Items,
        listen: SocketAddr,
        tune: impl FnOnce(&mut ProxyConfig),
    ) -> Result<LocalCluster, LocalError> {
        let nodes = Self::bind_nodes(n, items, false).await?;
        let direct = nodes.addrs();
        nodes
            .start_proxy_tuned(listen, |id| direct_addrs(&direct, id), tune)
            .await
    }

    /// As [`LocalCluster::start_with`], and with `role` the role service
    /// (hr-net's role server) on every endpoint: candidates nodes 1 and 2,
    /// each node dialling the nodes before it, the proxy following the
    /// role server's ring view.
    pub async fn start_full(
        n: u64,
        items: Items,
        listen: SocketAddr,
        role: bool,
    ) -> Result<LocalCluster, LocalError> {
        let nodes = Self::bind_nodes(n, items, role).await?;
        let direct = nodes.addrs();
        nodes
            .start_proxy(listen, |id| direct_addrs(&direct, id))
            .await
    }

    /// Binds the `n` cache nodes (and the role service with `role`, as
    /// [`LocalCluster::start_full`]); the proxy starts with
    /// [`LocalNodes::start_proxy`].
    pub async fn bind_nodes(n: u64, items: Items, role: bool) -> Result<LocalNodes, LocalError> {
        if let Items::Memcached(a) = &items {
            if a.is_empty() {
                return Err(
                    crate::backend::BackendError::Url("no memcached address".into()).into(),
                );
            }
        }
        let proxy_keys = keypair()?;
        let mut members = Members::new();
        let _ = members.insert(PROXY_NODE, proxy_keys.public());
        let mut nodes = Vec::new();
        for i in 1..=n {
            let keys = keypair()?;
            let _ = members.insert(NodeId(i), keys.public());
            nodes.push(NodeSlot {
                id: NodeId(i),
                keys,
                listen: Vec::new(),
                ep: None,
            });
        }
        let role = role.then(|| {
            let mut all: Vec<NodeId> = (1..=n).map(NodeId).collect();
            all.push(PROXY_NODE);
            RoleConfig {
                nodes: all,
                candidates: (1..=n.min(2)).map(NodeId).collect(),
                ..RoleConfig::default()
            }
        });
        for i in 0..nodes.len() {
            let peers = earlier_peers(&nodes[..i]);
            let r = role.as_ref().map(|r| (r, peers));
            bind_node(&mut nodes[i], &members, &items, r).await?;
        }
        Ok(LocalNodes {
            nodes,
            members,
            proxy_keys,
            items,
            role,
        })
    }

    /// The cache nodes' ids.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|s| s.id).collect()
    }

    /// A node's endpoint (`None` while it is stopped).
    pub fn node(&self, id: NodeId) -> Option<&Endpoint> {
        self.nodes.iter().find(|s| s.id == id)?.ep.as_ref()
    }

    /// Stops node `id` as a crash would: its tasks and sockets go at
    /// once, without closing its sessions; its items are lost.
    pub fn kill_node(&mut self, id: NodeId) {
        if let Some(s) = self.nodes.iter_mut().find(|s| s.id == id) {
            drop(s.ep.take());
        }
    }

    /// Starts node `id` again, empty, on its old addresses.
    pub async fn restart_node(&mut self, id: NodeId) -> Result<(), LocalError> {
        let (members, items) = (self.members.clone(), self.items.clone());
        let Some(i) = self.nodes.iter().position(|s| s.id == id) else {
            return Ok(());
        };
        let peers = earlier_peers(&self.nodes[..i]);
        let role = self.role.as_ref().map(|r| (r, peers));
        match self.nodes.get_mut(i) {
            Some(s) if s.ep.is_none() => bind_node(s, &members, &items, role).await,
            _ => Ok(()),
        }
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        self.proxy.stop();
        for s in &mut self.nodes {
            if let Some(ep) = s.ep.take() {
                ep.shutdown().await;
            }
        }
    }
}
