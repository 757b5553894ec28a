//! The public handle: bind, call, send, serve, receive, observe.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;
use tracing::info;

use surelink_proto::{ChannelId, Endpoint as Core, Epoch, LocalIdentity, NodeId, PathId};

use crate::call::CallOptions;
use crate::config::{Config, PeerConfig};
use crate::conn;
use crate::detector::{DelayPoint, Detector};
use crate::driver::{self, Flush, Handler, Incoming, NetEvent, Shared};
use crate::error::{BindError, CallError, SendError, TrySendError};
use crate::rpc;
use crate::stats::StatsSnapshot;

/// A path as the endpoint sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Aborts the endpoint's tasks when the last handle is dropped.
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
/// use surelink::{Config, Endpoint, PeerConfig};
/// use surelink::proto::{ClusterId, NodeId};
///
/// // A server on two networks.
/// let mut cfg = Config::new(NodeId(1), ClusterId(7));
/// cfg.listen = vec!["127.0.1.1:7100".parse()?, "127.0.2.1:7100".parse()?];
/// let server = Endpoint::bind(cfg).await?;
/// server.serve(|req: surelink::Request| async move { req.body });
///
/// // A client that dials it on both.
/// let mut cfg = Config::new(NodeId(2), ClusterId(7));
/// cfg.dial_from = vec!["127.0.1.2:0".parse()?, "127.0.2.2:0".parse()?];
/// cfg.peers = vec![PeerConfig {
///     node: NodeId(1),
///     addrs: vec![Some("127.0.1.1:7100".parse()?), Some("127.0.2.1:7100".parse()?)],
/// }];
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

impl Endpoint {
    /// Validates `config`, opens the listeners, and starts dialling the
    /// configured peers. Must be called within a tokio runtime.
    pub async fn bind(config: Config) -> Result<Endpoint, BindError> {
        config.validate()?;
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
        let core =
            Core::new(config.core.clone(), local).map_err(|e| BindError::Config(e.into()))?;
        let mut listeners = Vec::new();
        for (i, &addr) in config.listen.iter().enumerate() {
            let device = config.devices.get(i).and_then(|d| d.as_deref());
            let l =
                conn::listen(addr, device).map_err(|source| BindError::Listen { addr, source })?;
            listeners.push(l);
        }
        let listen: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let peers = config.peers.clone();
        // One heartbeat socket per network: on the listener's address and
        // port, or the dial-from address with a free port.
        let hb_addrs: Vec<SocketAddr> = (0..config.networks())
            .filter_map(|i| match (listen.get(i), config.local_addr(i)) {
                (Some(l), _) => Some(*l),
                (None, Some(a)) => Some(SocketAddr::new(a.ip(), 0)),
                (None, None) => None,
            })
            .collect();
        let base = std::time::Instant::now();
        let detector = Detector::start(
            &config.detector,
            config.cluster,
            config.node,
            epoch,
            &hb_addrs,
        )
        .map_err(|source| BindError::Detector {
            addrs: hb_addrs.clone(),
            source,
        })?;
        let (detector, signals) = match detector {
            Some((d, rx)) => (Some(d), Some(rx)),
            None => (None, None),
        };
        let shared = Arc::new(Shared::new(config, core, epoch, base, detector));
        if let Some(rx) = signals {
            shared.spawn(crate::detector::signal_loop(shared.clone(), rx));
        }
        shared.spawn(driver::timer_loop(shared.clone()));
        shared.spawn(driver::flush_loop(shared.clone()));
        for (network, l) in listeners.into_iter().enumerate() {
            shared.spawn(conn::accept_loop(shared.clone(), l, network));
        }
        let ep = Endpoint {
            _guard: Arc::new(Guard(shared.clone())),
            shared,
            listen: Arc::new(listen),
        };
        for p in peers {
            ep.dial_peer(&p);
        }
        info!(node = %ep.shared.config.node, epoch = %epoch, listen = ?ep.listen, "endpoint up");
        Ok(ep)
    }

    fn dial_peer(&self, p: &PeerConfig) {
        let cfg = &self.shared.config;
        for (network, addr) in p.addrs.iter().enumerate() {
            let (Some(remote), Some(local)) = (addr, cfg.local_addr(network)) else {
                continue;
            };
            if let Some(d) = &self.shared.detector {
                // The peer's heartbeat socket shares its listener's port.
                d.add_destination(p.node, network, *remote);
            }
            for _ in 0..cfg.connections_per_network {
                self.shared.spawn(conn::dial_loop(
                    self.shared.clone(),
                    p.node,
                    network,
                    local,
                    *remote,
                ));
            }
        }
    }

    /// Starts dialling a peer not in the configuration (e.g. one whose port
    /// was only known after it bound). Addresses on networks this node has
    /// no local address for are ignored.
    pub fn add_peer(&self, peer: PeerConfig) {
        self.dial_peer(&peer);
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

    /// Stalls one of the failure detector's threads for `d`, as a GC pause
    /// or a blocked disk would. For experiments and tests; does nothing when
    /// the detector is off.
    #[doc(hidden)]
    pub fn inject_delay(&self, point: DelayPoint, d: Duration) {
        if let Some(det) = &self.shared.detector {
            det.inject_delay(point, d);
        }
    }

    /// Sets the heartbeat sockets' receive buffer (experiments that make
    /// the kernel drop heartbeats).
    #[doc(hidden)]
    pub fn set_heartbeat_recv_buffer(&self, bytes: usize) -> std::io::Result<()> {
        match &self.shared.detector {
            Some(d) => d.set_recv_buffer(bytes),
            None => Ok(()),
        }
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.shared.config.node
    }

    /// This process's incarnation.
    pub fn epoch(&self) -> Epoch {
        Epoch(self.shared.epoch.load(Ordering::Relaxed))
    }

    /// The listening addresses, one per network, with the ports bound.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listen.to_vec()
    }

    /// Sends `request` to `peer` on `channel` and waits for the reply.
    ///
    /// The request is delivered exactly once as long as some path to the
    /// peer works again within the linger time, whatever happens to the
    /// connections meanwhile. Fails with [`CallError::PeerRestarted`] if the
    /// peer's process restarts first (the request is never replayed into the
    /// new process), and with [`CallError::Timeout`] after `timeout`.
    pub async fn call(
        &self,
        peer: NodeId,
        channel: u16,
        request: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        crate::call::call(
            &self.shared,
            peer,
            channel,
            request,
            &CallOptions::new(timeout),
        )
        .await
    }

    /// A call with explicit options: priority, re-send timeout, deadline.
    /// A high-priority call travels on the session's priority lane and is
    /// served before normal requests queued at the server (within the
    /// server's aging bound); a call without a reply within
    /// `resend_after` is sent again with the same id (executed at most
    /// once), with high priority unless `fixed_priority`.
    ///
    /// ```no_run
    /// # async fn f(ep: surelink::Endpoint) -> Result<(), surelink::CallError> {
    /// use std::time::Duration;
    /// use surelink::{CallOptions, Priority};
    /// let opts = CallOptions::new(Duration::from_millis(500)).with_priority(Priority::High);
    /// let reply = ep.call_with(surelink::proto::NodeId(2), 0, "lease?".into(), &opts).await?;
    /// # Ok(()) }
    /// ```
    pub async fn call_with(
        &self,
        peer: NodeId,
        channel: u16,
        request: Bytes,
        opts: &CallOptions,
    ) -> Result<Bytes, CallError> {
        crate::call::call(&self.shared, peer, channel, request, opts).await
    }

    /// Sends a one-way message, waiting while the session's send buffer is full.
    pub async fn send(&self, peer: NodeId, channel: u16, message: Bytes) -> Result<(), SendError> {
        crate::call::check_channel(&self.shared, channel)?;
        driver::send_message(
            &self.shared,
            peer,
            ChannelId(channel),
            rpc::oneway_prefix(),
            message,
            Flush::Deferred,
            |_, _| {},
        )
        .await
        .map(|_| ())
    }

    /// Sends a one-way message with a priority. A high-priority message
    /// travels on the session's priority lane and is handed to the
    /// receiver's [`recv`](Endpoint::recv) before normal ones waiting there
    /// (a normal message waits at most the receiver's aging bound behind
    /// high ones). Order is kept per channel *and* priority: a high message
    /// may overtake normal ones of its channel.
    pub async fn send_with(
        &self,
        peer: NodeId,
        channel: u16,
        message: Bytes,
        priority: crate::Priority,
    ) -> Result<(), SendError> {
        if priority == crate::Priority::Normal {
            return self.send(peer, channel, message).await;
        }
        crate::call::check_channel(&self.shared, channel)?;
        driver::send_message(
            &self.shared,
            peer,
            ChannelId(crate::call::lane(&self.shared)),
            rpc::oneway_high_prefix(channel),
            message,
            Flush::Now,
            |_, _| {},
        )
        .await
        .map(|_| ())
    }

    /// Sends a one-way message if there is room now; otherwise hands it back.
    pub fn try_send(&self, peer: NodeId, channel: u16, message: Bytes) -> Result<(), TrySendError> {
        if self.shared.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed.into());
        }
        crate::call::check_channel(&self.shared, channel)?;
        // Written by the flush task, as for `send`.
        let r = {
            let mut g = self.shared.lock();
            let now = self.shared.now();
            g.core
                .send_with_prefix(now, peer, ChannelId(channel), rpc::oneway_prefix(), message)
        };
        match r {
            Ok(_) => {
                self.shared.request_flush();
                self.shared.stats.message_sent();
                Ok(())
            }
            Err(surelink_proto::SendError::Full { message, .. }) => {
                Err(TrySendError::Full(message))
            }
            Err(e) => Err(SendError::Core(e).into()),
        }
    }

    /// Serves requests with `handler` (replacing any earlier one). Each
    /// request runs in its own task; at most `max_concurrent_requests` at once.
    pub fn serve<H: Handler>(&self, handler: H) {
        let jobs = {
            let mut g = self.shared.lock();
            g.handler = Some(Arc::new(handler));
            driver::drive(&mut g, &self.shared)
        };
        driver::run_jobs(&self.shared, jobs);
    }

    /// The next one-way message, in order per peer and channel. `None` once
    /// the endpoint is shut down.
    pub async fn recv(&self) -> Option<Incoming> {
        let mut one = Vec::with_capacity(1);
        if self.recv_many(&mut one, 1).await == 0 {
            return None;
        }
        one.pop()
    }

    /// Waits for one-way messages and appends up to `limit` of them to
    /// `buf` (in order per peer and channel); returns how many. `0` once the
    /// endpoint is shut down (or when `limit` is 0). One lock for the whole
    /// batch: the way to keep up with a peer sending small messages fast.
    ///
    /// ```no_run
    /// # async fn f(ep: surelink::Endpoint) {
    /// let mut batch = Vec::new();
    /// while ep.recv_many(&mut batch, 256).await > 0 {
    ///     for m in batch.drain(..) {
    ///         println!("{} bytes from {}", m.body.len(), m.peer);
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn recv_many(&self, buf: &mut Vec<Incoming>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        loop {
            if self.shared.closed.load(Ordering::Relaxed) {
                return 0;
            }
            // Fast path first: registering for a wake-up takes a lock, and a
            // busy receiver almost always finds messages waiting.
            let n = self.take_incoming(buf, limit);
            if n > 0 {
                return n;
            }
            let notified = self.shared.incoming_ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Re-check after registering: a message queued in between would
            // otherwise wait for the next one.
            if self.shared.closed.load(Ordering::Relaxed) {
                return 0;
            }
            let n = self.take_incoming(buf, limit);
            if n > 0 {
                return n;
            }
            notified.await;
        }
    }

    /// Moves up to `limit` queued messages into `buf`; when the queue was
    /// full, lets the core hand over the messages that waited for room.
    fn take_incoming(&self, buf: &mut Vec<Incoming>, limit: usize) -> usize {
        let (n, was_full) = {
            let mut q = self
                .shared
                .incoming
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let n = q.queue.len().min(limit);
            let before = self.shared.incoming_len.load(Ordering::Relaxed);
            let now = self.shared.now_cached();
            buf.extend(std::iter::from_fn(|| q.queue.pop(now).map(|(_, m)| m)).take(n));
            if n > 0 {
                self.shared.incoming_len.fetch_sub(n, Ordering::Relaxed);
            }
            (n, before >= self.shared.config.incoming_buffer)
        };
        if n > 0 && was_full {
            let jobs = {
                let mut g = self.shared.lock();
                driver::drive(&mut g, &self.shared)
            };
            driver::run_jobs(&self.shared, jobs);
        }
        n
    }

    /// Path and peer events (path up/down, peer up/unreachable, session
    /// ended) from the moment of the call on: a session that came up
    /// between [`Endpoint::bind`] and this call sent its `PeerUp` before;
    /// [`Endpoint::stats`] (`paths_up`, `sessions`) shows the state then.
    pub fn events(&self) -> broadcast::Receiver<NetEvent> {
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
            let up = {
                let g = self.shared.lock();
                g.core
                    .session_stats(peer)
                    .map_or(0, |s| s.paths.iter().filter(|p| p.active).count())
            };
            if up >= paths {
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
    pub async fn serve_metrics(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = crate::exporter::bind(addr).await?;
        let bound = listener.local_addr()?;
        self.shared
            .spawn(crate::exporter::serve(listener, self.shared.clone()));
        Ok(bound)
    }

    /// The connections carrying paths now.
    pub fn paths(&self) -> Vec<PathInfo> {
        let g = self.shared.lock();
        let mut v: Vec<PathInfo> = g
            .conns
            .values()
            .map(|c| PathInfo {
                id: c.io.path,
                peer: c.peer,
                network: c.io.network,
                local: c.io.local,
                remote: c.io.remote,
            })
            .collect();
        v.sort_by_key(|p| p.id);
        v
    }

    /// Shuts down the sockets of every connection on `network` (as `ss -K`
    /// would), returning how many. Both ends see the connections end; their
    /// messages fail over and the dialler reconnects. For tests and demos.
    pub fn kill_network(&self, network: usize) -> usize {
        let g = self.shared.lock();
        let mut n = 0;
        for c in g.conns.values().filter(|c| c.io.network == network) {
            c.io.kill();
            n += 1;
        }
        n
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
        let jobs = {
            let mut g = self.shared.lock();
            let now = self.shared.now();
            let peers: Vec<NodeId> = g.core.peers().collect();
            for p in peers {
                g.core.close_session(now, p);
            }
            driver::drive(&mut g, &self.shared)
        };
        driver::run_jobs(&self.shared, jobs);
        // Give the CLOSE frames (written inline above) a moment to leave.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.shared.incoming_ready.notify_waiters();
        self.shared.space.notify_waiters();
        self.shared.kill_connections();
    }
}
