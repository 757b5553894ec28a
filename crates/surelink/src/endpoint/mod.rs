//! The public handle: bind, the endpoint's identity and peers, events,
//! counters, shutdown (this file); calls, sends, serving and receiving
//! (`messages.rs`).

mod groups;
mod messages;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use surelink_proto::{Epoch, LocalIdentity, NodeId, PathId, Router};

use crate::config::{Config, PeerConfig};
use crate::conn;
use crate::detector::{Detector, HeartbeatAuth};
use crate::error::BindError;
use crate::events::Events;
use crate::shared::Shared;
use crate::stats::StatsSnapshot;

/// A path as the endpoint sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathInfo {
    /// The path.
    pub id: PathId,
    /// The peer, once known.
    pub peer: Option<NodeId>,
    /// Its network.
    pub network: usize,
    /// Local socket address.
    pub local: SocketAddr,
    /// Remote socket address.
    pub remote: SocketAddr,
}

/// Stops the endpoint's tasks when the last handle is dropped.
struct Guard(Arc<Shared>);

impl Drop for Guard {
    fn drop(&mut self) {
        // Like a process exit: tasks stop and the kernel closes every socket
        // (handler tasks still running may hold the shared state, so close
        // the connections explicitly).
        self.0.closed.store(true, Ordering::Relaxed);
        if let Some(d) = &self.0.detector {
            d.close();
        }
        self.0.abort_tasks();
        self.0.kill_connections();
    }
}

/// A surelink endpoint: one process's sessions with its peers, over every
/// network it shares with them. Cheap to clone; the last clone dropped stops
/// it.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use surelink::{Config, Endpoint, HandlerError, Keypair, PeerConfig, Request};
/// use surelink::proto::{ClusterId, NodeId};
///
/// // Each node has a key pair (`surelink keygen`); every node lists the
/// // members' public keys.
/// let (server_keys, client_keys) = (Keypair::generate()?, Keypair::generate()?);
///
/// // A server on two networks.
/// let mut cfg = Config::new(NodeId(1), ClusterId(7)).with_identity(server_keys.clone())?;
/// cfg.members.insert(NodeId(2), client_keys.public())?;
/// cfg.listen = vec!["127.0.1.1:7100".parse()?, "127.0.2.1:7100".parse()?];
/// let server = Endpoint::bind(cfg).await?;
/// server.serve(|req: Request| async move {
///     if req.body.is_empty() {
///         return Err(HandlerError::new(400, "empty request"));
///     }
///     Ok(req.body)
/// });
///
/// // A client that dials it on both.
/// let mut cfg = Config::new(NodeId(2), ClusterId(7)).with_identity(client_keys)?;
/// cfg.members.insert(NodeId(1), server_keys.public())?;
/// cfg.dial_from = vec!["127.0.1.2:0".parse()?, "127.0.2.2:0".parse()?];
/// cfg.peers = vec![PeerConfig::new(
///     NodeId(1),
///     vec![Some("127.0.1.1:7100".parse()?), Some("127.0.2.1:7100".parse()?)],
/// )];
/// let client = Endpoint::bind(cfg).await?;
/// let reply = client.call(NodeId(1), 0, "ping".into(), Duration::from_secs(1)).await?;
/// assert_eq!(reply, "ping");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Endpoint {
    shared: Arc<Shared>,
    _guard: Arc<Guard>,
    listen: Arc<Vec<SocketAddr>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("node", &self.shared.config.node)
            .field("listen", &self.listen)
            .finish()
    }
}

/// Tries at binding listeners on port 0 whose port is taken for UDP.
const BIND_ATTEMPTS: u32 = 16;

impl Endpoint {
    /// The endpoint's state, for the crate's other parts (helpers).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Validates `config`, opens the listeners, and starts dialling the
    /// configured peers. Must be called within a tokio runtime.
    pub async fn bind(mut config: Config) -> Result<Endpoint, BindError> {
        config.validate()?;
        // The groups' homes against this runtime's pools (one per worker).
        config
            .executor
            .validate_for_runtime(config.max_concurrent_requests)?;
        // Each connection is a file descriptor: raise the soft limit where
        // allowed, and keep the accept limit well below what is left
        // (listeners, heartbeat sockets, dialled connections, the
        // application's own files).
        if let Ok(fds) = surelink_sys::raise_fd_limit() {
            let budget = usize::try_from(fds.saturating_sub(64) / 2).unwrap_or(usize::MAX);
            if config.max_connections > budget {
                warn!(
                    max_connections = config.max_connections,
                    fd_limit = fds,
                    now = budget,
                    "max_connections lowered below the open-file limit"
                );
                config.max_connections = budget.max(1);
            }
        }
        let epoch = config.epoch.unwrap_or_else(|| {
            let us = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            Epoch(us.max(1))
        });
        let local = LocalIdentity {
            cluster: config.cluster,
            node: config.node,
            epoch,
        };
        let router =
            Router::new(config.core.clone(), local).map_err(|e| BindError::Config(e.into()))?;
        let base = std::time::Instant::now();
        let auth = match (&config.identity, config.insecure, &config.tls) {
            (_, true, _) => HeartbeatAuth::None,
            (_, false, Some(_)) => HeartbeatAuth::PerConnection,
            (Some(k), false, None) => HeartbeatAuth::Members(k, &config.members),
            (None, false, None) => HeartbeatAuth::None,
        };
        let peers = config.peers.clone();
        // A listener on port 0 takes a port free for TCP; the heartbeat
        // socket needs the same port for UDP, which another socket may
        // hold: then the listeners are dropped and picked afresh.
        let any_port = config.listen.iter().any(|a| a.port() == 0);
        let mut attempt = 0;
        let (listeners, listen, detector) = loop {
            attempt += 1;
            let mut listeners = Vec::new();
            for (i, &addr) in config.listen.iter().enumerate() {
                let device = config.devices.get(i).and_then(|d| d.as_deref());
                let l = conn::listen(addr, device)
                    .map_err(|source| BindError::Listen { addr, source })?;
                listeners.push(l);
            }
            let listen: Vec<SocketAddr> = listeners
                .iter()
                .filter_map(|l| l.local_addr().ok())
                .collect();
            // One heartbeat socket per network: on the listener's address
            // and port, or the dial-from address with a free port.
            let hb_addrs: Vec<SocketAddr> = (0..config.networks())
                .filter_map(|i| match (listen.get(i), config.local_addr(i)) {
                    (Some(l), _) => Some(*l),
                    (None, Some(a)) => Some(SocketAddr::new(a.ip(), 0)),
                    (None, None) => None,
                })
                .collect();
            match Detector::start(
                &config.detector,
                config.cluster,
                config.node,
                epoch,
                &hb_addrs,
                auth,
                config.detector_priority,
            ) {
                Err(e)
                    if any_port
                        && attempt < BIND_ATTEMPTS
                        && e.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    continue
                }
                r => {
                    let d = r.map_err(|source| BindError::Detector {
                        addrs: hb_addrs.clone(),
                        source,
                    })?;
                    break (listeners, listen, d);
                }
            }
        };
        let (detector, signals) = match detector {
            Some((d, rx)) => (Some(d), Some(rx)),
            None => (None, None),
        };
        let shared = Arc::new(Shared::new(config, router, base, detector));
        if let Some(rx) = signals {
            shared.spawn(crate::detector::signal_loop(shared.clone(), rx));
        }
        shared.spawn(crate::shared::router_loop(shared.clone()));
        if shared.role.is_some() {
            shared.spawn(crate::role::run(shared.clone()));
        }
        if shared.relays.is_some() {
            let events = shared.events.subscribe();
            shared.spawn(crate::relay::watch_helpers(Arc::downgrade(&shared), events));
        }
        for (network, l) in listeners.into_iter().enumerate() {
            shared.spawn(conn::accept_loop(shared.clone(), l, network));
        }
        let ep = Endpoint {
            _guard: Arc::new(Guard(shared.clone())),
            shared,
            listen: Arc::new(listen),
        };
        for p in peers {
            crate::dial::dial_peer(&ep.shared, &p);
        }
        if ep.shared.config.insecure {
            warn!(node = %ep.shared.config.node, "INSECURE: insecure = true — no member authentication and no encryption; anyone who can reach these ports can join as any node and read or alter every message. Use only for benchmarks on a trusted host.");
        }
        info!(node = %ep.shared.config.node, epoch = %epoch, listen = ?ep.listen, protection = %if ep.shared.config.insecure { "none (insecure)".to_string() } else { ep.shared.config.protection.to_string() }, "endpoint up");
        Ok(ep)
    }

    /// Adds a path of this endpoint's session to `server` through the
    /// helper listening at `helper` (see [`crate::Helper`]), dialled from
    /// this node's address on `network`: a TCP connection to the helper,
    /// then the same end-to-end handshake as a direct path. The session
    /// uses it alongside its other paths and fails over from it like from
    /// any; it is re-dialled while the returned handle lives.
    pub fn relay_via(
        &self,
        server: NodeId,
        helper: SocketAddr,
        network: usize,
    ) -> crate::RelayPath {
        crate::RelayPath::start(&self.shared, server, helper, network)
    }

    /// Starts PostMan's activation towards `server`: every `cfg.window`
    /// the p99 of this endpoint's calls to `server` is taken; above
    /// `cfg.sla` it goes through the least loaded of `cfg.choices`
    /// helpers drawn from `helpers` (a path through it, preferred among
    /// healthy paths, so a helper that dies or freezes loses the traffic
    /// to the direct ones), and back direct under `cfg.release` — with
    /// hysteresis and a dwell so it does not flap.
    /// Stops, going direct, when the handle is dropped.
    pub fn helped(
        &self,
        server: NodeId,
        helpers: Vec<SocketAddr>,
        network: usize,
        cfg: surelink_proto::helper::ActivationConfig,
    ) -> Result<crate::Helped, surelink_proto::ConfigError> {
        crate::Helped::start(&self.shared, server, helpers, network, cfg)
    }

    /// The peers this endpoint was configured to dial.
    pub(crate) fn configured_peers(&self) -> Vec<NodeId> {
        self.shared.config.peers.iter().map(|p| p.node).collect()
    }

    /// The endpoint's clock.
    pub(crate) fn now(&self) -> surelink_proto::Time {
        self.shared.clock.now()
    }

    /// This node's view of the role service: the routing-table row it
    /// holds and, on the serving role server, the path-status matrix.
    /// `None` when no role service is configured.
    pub fn role_status(&self) -> Option<crate::RoleStatus> {
        self.shared
            .role
            .as_ref()
            .map(|r| r.status(self.shared.clock.now()))
    }

    /// The link for an external role backend (etcd's, say), when the role
    /// configuration's ownership is
    /// [`Elected`](surelink_proto::role::Ownership::Elected): reports in,
    /// rows out. `None` without a role service or with the embedded one.
    pub fn external_role(&self) -> Option<crate::ExternalRole> {
        crate::role::external::ExternalRole::of(&self.shared)
    }

    /// Starts dialling a peer not in the configuration (e.g. one whose port
    /// was only known after it bound). Addresses on networks this node has
    /// no local address for are ignored.
    pub fn add_peer(&self, peer: PeerConfig) {
        crate::dial::dial_peer(&self.shared, &peer);
    }

    /// The failure detector's heartbeat addresses (UDP), one per network;
    /// empty when the detector is off.
    pub fn heartbeat_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .detector
            .as_ref()
            .map(|d| d.local_addrs())
            .unwrap_or_default()
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.shared.config.node
    }

    /// The cluster this endpoint belongs to.
    pub fn cluster(&self) -> surelink_proto::ClusterId {
        self.shared.config.cluster
    }

    /// This node's public key (`None` when insecure).
    pub fn public_key(&self) -> Option<surelink_proto::secure::PublicKey> {
        self.shared.config.identity.as_ref().map(|k| k.public())
    }

    /// Lets `node` connect with `key` from now on (a member that joined
    /// after this endpoint started). Ignored when insecure.
    pub fn add_member(
        &self,
        node: NodeId,
        key: surelink_proto::secure::PublicKey,
    ) -> Result<(), surelink_proto::secure::MemberError> {
        match &self.shared.secure {
            Some(s) => {
                s.add_member(node, key)?;
                if let Some(d) = &self.shared.detector {
                    d.add_member(node, &key);
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// This process's incarnation.
    pub fn epoch(&self) -> Epoch {
        Epoch(self.shared.epoch.load(Ordering::Relaxed))
    }

    /// The listening addresses, one per network, with the ports bound.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listen.to_vec()
    }

    /// Path and peer events. The subscription first yields a `PathUp` for
    /// every working path and a `PeerUp` for every reachable peer at the
    /// moment of the call, then every event after it, so a subscriber never
    /// misses a session that came up before it subscribed.
    pub fn events(&self) -> Events {
        self.shared.events.subscribe()
    }

    /// Counters, histograms and per-session state.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.snapshot()
    }

    /// Waits until the session with `peer` has at least `paths` working
    /// paths, or `timeout` passes. Returns whether it did.
    pub async fn wait_for_paths(&self, peer: NodeId, paths: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut events = self.events();
        loop {
            if self.shared.events.paths_up(peer) >= paths {
                return true;
            }
            // Woken by any path event, checked at least every 10 ms.
            let wait = tokio::time::timeout(Duration::from_millis(10), events.recv());
            if tokio::time::timeout_at(deadline, wait).await.is_err() {
                return false;
            }
        }
    }

    /// Serves the counters as Prometheus text on `http://addr/metrics`.
    /// Returns the bound address (port 0 picks one).
    #[cfg(feature = "prometheus")]
    pub async fn serve_metrics(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = crate::exporter::bind(addr).await?;
        let bound = listener.local_addr()?;
        self.shared
            .spawn(crate::exporter::serve(listener, self.shared.clone()));
        Ok(bound)
    }

    /// The connections carrying paths now.
    pub fn paths(&self) -> Vec<PathInfo> {
        let mut v: Vec<PathInfo> = self
            .shared
            .connections()
            .into_iter()
            .map(|(c, peer)| PathInfo {
                id: c.path,
                peer: peer.or_else(|| c.peer()),
                network: c.network,
                local: c.local,
                remote: c.remote,
            })
            .collect();
        v.sort_by_key(|p| p.id);
        v
    }

    /// Closes every session (peers see an orderly close) and stops all tasks.
    pub async fn shutdown(self) {
        // Stop dialling, reading and timers first, so nothing reopens a
        // session while the goodbyes go out.
        self.shared.closed.store(true, Ordering::Relaxed);
        if let Some(d) = &self.shared.detector {
            d.close();
        }
        self.shared.abort_tasks();
        for s in self.shared.sessions() {
            s.with(&self.shared, |g, now| g.core().close(now));
        }
        // Give the CLOSE frames (written above) a moment to leave.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.shared.incoming.ready.notify_waiters();
        for s in self.shared.sessions() {
            s.wake_senders();
        }
        self.shared.kill_connections();
    }

    /// Debugging and fault-injection hooks (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn testing(&self) -> crate::testing::Testing<'_> {
        crate::testing::Testing {
            shared: &self.shared,
        }
    }
}
