//! Test support (feature `test-util`): fault-injection and debugging hooks
//! ([`Testing`], from `Endpoint::testing`), and the two-network loopback
//! fixture every test, the demo and the benchmark share ([`Loopback`]).
//! Nothing here belongs in a service's normal code path.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surelink_proto::{ClusterId, NodeId};

use crate::config::{Config, PeerConfig};
use crate::detector::DelayPoint;
use crate::endpoint::Endpoint;
use crate::error::BindError;
use crate::shared::Shared;
use surelink_proto::secure::{Keypair, Members};

/// The hooks of one endpoint (from `Endpoint::testing`).
#[derive(Clone, Copy)]
pub struct Testing<'a> {
    pub(crate) shared: &'a Arc<Shared>,
}

impl std::fmt::Debug for Testing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testing")
            .field("node", &self.shared.config.node)
            .finish()
    }
}

impl Testing<'_> {
    /// Shuts down the sockets of every connection on `network` (as `ss -K`
    /// would), returning how many. Both ends see the connections end; their
    /// messages fail over and the dialler reconnects.
    pub fn kill_network(&self, network: usize) -> usize {
        let mut n = 0;
        for (c, _) in self.shared.connections() {
            if c.network == network {
                c.kill();
                n += 1;
            }
        }
        n
    }

    /// Times the endpoint's session tasks were woken by their timers so far.
    /// A busy session's deadlines (acknowledgements, re-sends) keep moving
    /// ahead with its traffic; its timer should follow them, not fire at
    /// every tick.
    pub fn timer_fires(&self) -> u64 {
        self.shared.stats.timer_fires.load(Ordering::Relaxed)
    }

    /// Makes this endpoint silent on `network` (`true`) or not, as a
    /// route that drops everything it sends there would: bytes for that
    /// network's connections wait in their queues (TCP would keep
    /// re-sending them) and go out when it speaks again, its heartbeats on
    /// that network are lost on the wire (sent in time as far as it knows,
    /// so it does not fence itself), and it dials no new connection there.
    /// What the peers send still arrives. So peers stop hearing it on that
    /// network, and its own messages there get no acknowledgement.
    pub fn mute_network(&self, network: usize, muted: bool) {
        let bit = 1u64 << network.min(63);
        if muted {
            self.shared.muted.fetch_or(bit, Ordering::Relaxed);
        } else {
            self.shared.muted.fetch_and(!bit, Ordering::Relaxed);
            // Queued bytes go out now.
            for (c, _) in self.shared.connections() {
                if c.network == network {
                    c.flush();
                }
            }
        }
    }

    /// Stalls one of the failure detector's threads for `d`, as a GC pause
    /// or a blocked disk would. Does nothing when the detector is off.
    pub fn inject_delay(&self, point: DelayPoint, d: Duration) {
        if let Some(det) = &self.shared.detector {
            det.inject_delay(point, d);
        }
    }

    /// Sets the heartbeat sockets' receive buffer (experiments that make
    /// the kernel drop heartbeats).
    pub fn set_heartbeat_recv_buffer(&self, bytes: usize) -> std::io::Result<()> {
        match &self.shared.detector {
            Some(d) => d.set_recv_buffer(bytes),
            None => Ok(()),
        }
    }

    /// A one-screen dump of the session with `peer`.
    pub fn debug_session(&self, peer: NodeId) -> String {
        self.shared
            .session(peer)
            .map_or_else(|| "none".into(), |h| h.debug_dump())
    }
}

/// Whether `network` is muted in `mask` (see [`Testing::mute_network`]).
pub(crate) fn is_muted(mask: &AtomicU64, network: usize) -> bool {
    mask.load(Ordering::Relaxed) & (1u64 << network.min(63)) != 0
}

/// Two endpoints on loopback over two networks — a server listening on
/// 127.0.1.1 and 127.0.2.1 (free ports) and a client dialling it from
/// 127.0.1.2 and 127.0.2.2 — set up the same way by every test, the demo
/// and the benchmark. Change `server` and `client` (defaults otherwise),
/// then [`Loopback::start`].
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let mut lb = surelink::testing::Loopback::new();
/// lb.server.max_concurrent_requests = 1;
/// let pair = lb.start().await?;
/// pair.server.serve(|r: surelink::Request| async move { r.body });
/// let reply = pair.client.call(pair.server.node(), 0, "x".into(),
///     std::time::Duration::from_secs(1)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Loopback {
    /// The server's configuration (listen addresses filled in).
    pub server: Config,
    /// The client's configuration (dial-from addresses filled in; the
    /// server is added as its peer at start).
    pub client: Config,
    /// How long `start` waits for both paths on both sides.
    pub paths_timeout: Duration,
}

/// Why [`Loopback::start`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoopbackError {
    /// An endpoint did not bind.
    #[error("binding node {node}: {source}")]
    Bind {
        /// The node.
        node: NodeId,
        /// Why.
        source: BindError,
    },
    /// A member could not be added to the server's list.
    #[error("member keys: {0}")]
    Keys(String),
    /// The paths did not all come up in time.
    #[error("node {node}: {want} active paths did not come up within {timeout:?}")]
    NoPaths {
        /// The node that waited.
        node: NodeId,
        /// Paths wanted.
        want: usize,
        /// How long it waited.
        timeout: Duration,
    },
}

/// The endpoints [`Loopback::start`] made.
#[derive(Clone, Debug)]
pub struct LoopbackPair {
    /// The server (node 1 unless changed).
    pub server: Endpoint,
    /// The client (node 2 unless changed).
    pub client: Endpoint,
}

/// The loopback addresses of the two networks: the server's, the client's.
pub const SERVER_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 1, 1), Ipv4Addr::new(127, 0, 2, 1)];
/// The client's addresses on the two networks.
pub const CLIENT_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 1, 2), Ipv4Addr::new(127, 0, 2, 2)];

impl Default for Loopback {
    fn default() -> Self {
        Self::new()
    }
}

impl Loopback {
    /// Node 1 serves, node 2 calls, cluster 9, every other setting the
    /// product's default.
    ///
    /// Each gets a fresh key pair and the other's public key in its member
    /// list (`Config::insecure` turns authentication off for both, for
    /// benchmarks that measure its cost).
    pub fn new() -> Loopback {
        let (sk, ck) = (fresh_keys(), fresh_keys());
        let mut server = Config::new(NodeId(1), ClusterId(9));
        server.identity = Some(sk.clone());
        server.members = members(&[(NodeId(1), &sk), (NodeId(2), &ck)]);
        server.listen = SERVER_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        let mut client = Config::new(NodeId(2), ClusterId(9));
        client.identity = Some(ck);
        client.members = server.members.clone();
        client.dial_from = CLIENT_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        Loopback {
            server,
            client,
            paths_timeout: Duration::from_secs(10),
        }
    }

    /// Binds both, and waits until each sees both paths.
    pub async fn start(self) -> Result<LoopbackPair, LoopbackError> {
        let server_node = self.server.node;
        let client_node = self.client.node;
        // The tweaks may have renumbered nodes: list the keys under the
        // ids in force.
        let (mut server_cfg, mut client_cfg) = (self.server, self.client);
        let mut m = Members::new();
        for c in [&server_cfg, &client_cfg] {
            if let Some(k) = &c.identity {
                let _ = m.insert(c.node, k.public());
            }
        }
        // Members the caller added (entries under the old ids conflict
        // and drop out).
        for (n, k) in server_cfg.members.iter().chain(client_cfg.members.iter()) {
            let _ = m.insert(n, k);
        }
        server_cfg.members = m.clone();
        client_cfg.members = m;
        let server = Endpoint::bind(server_cfg)
            .await
            .map_err(|source| LoopbackError::Bind {
                node: server_node,
                source,
            })?;
        client_cfg.peers = vec![PeerConfig::new(
            server_node,
            server.local_addrs().into_iter().map(Some).collect(),
        )];
        let client = Endpoint::bind(client_cfg)
            .await
            .map_err(|source| LoopbackError::Bind {
                node: client_node,
                source,
            })?;
        for (ep, peer) in [(&client, server_node), (&server, client_node)] {
            if !ep.wait_for_paths(peer, 2, self.paths_timeout).await {
                return Err(LoopbackError::NoPaths {
                    node: ep.node(),
                    want: 2,
                    timeout: self.paths_timeout,
                });
            }
        }
        Ok(LoopbackPair { server, client })
    }
}

impl LoopbackPair {
    /// Shuts both down together (each closes its session before the other's
    /// connections go, so neither reports the other unreachable).
    pub async fn shutdown(self) {
        tokio::join!(self.client.shutdown(), self.server.shutdown());
    }
}

impl LoopbackPair {
    /// Binds one more client, node `node`, dialling the server on both
    /// networks from 127.0.1.`n` and 127.0.2.`n` (`n` = 10 + the node id's
    /// low byte), with `tweak` applied to its configuration; waits for its
    /// paths.
    pub async fn add_client(
        &self,
        node: NodeId,
        tweak: impl FnOnce(&mut Config),
    ) -> Result<Endpoint, LoopbackError> {
        let last = 10u8.wrapping_add(node.0.to_le_bytes()[0]);
        let keys = fresh_keys();
        let mut c = Config::new(node, self.server_cluster());
        if self.server.public_key().is_some() {
            c.identity = Some(keys.clone());
            c.members = members(&[(node, &keys)]);
            if let Some(sk) = self.server.public_key() {
                let _ = c.members.insert(self.server.node(), sk);
            }
        } else {
            c.insecure = true;
        }
        c.dial_from = (1..=2u8)
            .map(|net| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, net, last)), 0))
            .collect();
        c.peers = vec![PeerConfig::new(
            self.server.node(),
            self.server.local_addrs().into_iter().map(Some).collect(),
        )];
        tweak(&mut c);
        if let Some(k) = &c.identity {
            self.server
                .add_member(c.node, k.public())
                .map_err(|e| LoopbackError::Keys(e.to_string()))?;
        }
        let ep = Endpoint::bind(c)
            .await
            .map_err(|source| LoopbackError::Bind { node, source })?;
        let timeout = Duration::from_secs(10);
        if !ep.wait_for_paths(self.server.node(), 2, timeout).await {
            return Err(LoopbackError::NoPaths {
                node,
                want: 2,
                timeout,
            });
        }
        Ok(ep)
    }

    fn server_cluster(&self) -> ClusterId {
        self.server.cluster()
    }
}

/// A fresh key pair; tests and demos cannot run without the OS's random
/// source anyway.
pub fn fresh_keys() -> Keypair {
    #[allow(clippy::expect_used)]
    Keypair::generate().expect("the system random number generator works")
}

fn members(list: &[(NodeId, &Keypair)]) -> Members {
    let mut m = Members::new();
    for (n, k) in list {
        let _ = m.insert(*n, k.public());
    }
    m
}

/// A role-service cluster on loopback: one endpoint per node of `role`,
/// each on two networks (`127.0.1.<base + node>`, `127.0.2.<base + node>`),
/// each dialling the ones started before it, with the product's defaults
/// otherwise; returns once every pair has both paths up. Tests of the role
/// service and of its backends share it.
pub async fn role_cluster(
    role: surelink_proto::role::RoleConfig,
    base: u8,
) -> Result<Vec<Endpoint>, LoopbackError> {
    role_cluster_with(role, base, |_, _| {}).await
}

/// [`role_cluster`], each node's configuration changed by `configure`
/// before it binds.
pub async fn role_cluster_with(
    role: surelink_proto::role::RoleConfig,
    base: u8,
    configure: impl Fn(NodeId, &mut Config),
) -> Result<Vec<Endpoint>, LoopbackError> {
    let keys: Vec<(NodeId, Keypair)> = role.nodes.iter().map(|n| (*n, fresh_keys())).collect();
    let list: Vec<(NodeId, &Keypair)> = keys.iter().map(|(n, k)| (*n, k)).collect();
    let members = members(&list);
    let mut eps: Vec<Endpoint> = Vec::new();
    for (node, k) in &keys {
        let last = u8::try_from(node.0)
            .ok()
            .and_then(|n| n.checked_add(base))
            .ok_or_else(|| LoopbackError::Keys(format!("node {node} does not fit an address")))?;
        let addr = |net| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, net, last)), 0);
        let mut c = Config::new(*node, ClusterId(77));
        c.identity = Some(k.clone());
        c.members = members.clone();
        c.listen = vec![addr(1), addr(2)];
        c.role = Some(role.clone());
        c.peers = eps
            .iter()
            .map(|e| PeerConfig::new(e.node(), e.local_addrs().into_iter().map(Some).collect()))
            .collect();
        configure(*node, &mut c);
        let ep = Endpoint::bind(c)
            .await
            .map_err(|source| LoopbackError::Bind {
                node: *node,
                source,
            })?;
        eps.push(ep);
    }
    let timeout = Duration::from_secs(10);
    for e in &eps {
        for p in &eps {
            if p.node() != e.node() && !e.wait_for_paths(p.node(), 2, timeout).await {
                return Err(LoopbackError::NoPaths {
                    node: e.node(),
                    want: 2,
                    timeout,
                });
            }
        }
    }
    Ok(eps)
}

/// Waits until `f` holds for `ep`'s role status; panics naming the node
/// and its status if it did not within `within`.
pub async fn role_expect(
    ep: &Endpoint,
    within: Duration,
    f: impl Fn(&crate::RoleStatus) -> bool,
) -> crate::RoleStatus {
    match role_until(ep, within, f).await {
        Some(st) => st,
        None => panic!(
            "node {}: role condition not met within {within:?}; status {:?}",
            ep.node(),
            ep.role_status()
        ),
    }
}

/// Whether the row `s` holds steers traffic to `to` off `network` while
/// leaving it another network.
pub fn steers_off(s: &crate::RoleStatus, to: NodeId, network: u8) -> bool {
    s.table.as_ref().is_some_and(|t| {
        t.route_to(to)
            .is_some_and(|r| !r.usable(network) && (0..8).any(|n| n != network && r.usable(n)))
    })
}

/// Waits until `f` holds for `ep`'s role status; `None` if it did not
/// within `within` (or no role service runs).
pub async fn role_until(
    ep: &Endpoint,
    within: Duration,
    f: impl Fn(&crate::RoleStatus) -> bool,
) -> Option<crate::RoleStatus> {
    let start = std::time::Instant::now();
    loop {
        let st = ep.role_status()?;
        if f(&st) {
            return Some(st);
        }
        if start.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
