//! What every task of an endpoint shares: the router (taken only for
//! handshakes, new and ended sessions), the sessions (each behind its own
//! lock), the request executor, the incoming queue, events, counters.
//!
//! Lock order: router, then a session, then leaf locks (a connection's
//! write queue, the scheduler, the incoming queue). Nothing takes the
//! router while holding a session.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use parking_lot::RwLock;

use bytes::BytesMut;
use rustc_hash::FxHashMap;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use surelink_proto::detector::PathReport;
use surelink_proto::wire::Hello;
use surelink_proto::{
    Epoch, HelloRoute, LocalIdentity, NodeId, OpenError, PathError, PathId, Router, Time,
};

use crate::config::Config;
use crate::conn::ConnIo;
use crate::error::{CallError, SendError};
use crate::events::{EventHub, NetEvent};
use crate::incoming::IncomingQueue;
use crate::ratelog::LogLimit;
use crate::server::Server;
use crate::session::{run_session, SessionHandle, Work};
use crate::stats::Stats;

/// The router and the transports that have not said who they are.
pub(crate) struct RouterState {
    pub(crate) router: Router,
    pub(crate) unbound: HashMap<PathId, Arc<ConnIo>>,
    out: BytesMut,
}

/// State shared by the public handles and every task.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// This process's incarnation (a new one after a fence).
    pub(crate) epoch: AtomicU64,
    base: tokio::time::Instant,
    router: Mutex<RouterState>,
    /// The current session per peer node.
    sessions: RwLock<FxHashMap<NodeId, Arc<SessionHandle>>>,
    next_session_key: AtomicU64,
    pub(crate) server: Server,
    pub(crate) incoming: IncomingQueue,
    pub(crate) events: EventHub,
    pub(crate) stats: Stats,
    /// The failure detector, unless it is off.
    pub(crate) detector: Option<Arc<crate::detector::Detector>>,
    /// A silent path is heard again: dial loops retry at once.
    pub(crate) redial: Notify,
    /// Per dialled peer: networks where a connect was refused since it
    /// was last connected, and whether `PeerRefused` was reported.
    refused: Mutex<FxHashMap<NodeId, (u64, bool)>>,
    next_path: AtomicU64,
    last_now: AtomicU64,
    pub(crate) closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Keys and member list for handshakes; `None` when insecure.
    pub(crate) secure: Option<crate::secure::SecureSetup>,
    /// Limits on accepted connections.
    pub(crate) limits: Arc<crate::secure::ConnLimits>,
    /// Rate limits for log lines a remote party can cause.
    pub(crate) log_refused: LogLimit,
    pub(crate) log_handshake: LogLimit,
    pub(crate) log_limits: LogLimit,
    /// Queued messages wait for the end of the runtime's turn
    /// ([`WriteBatching`](crate::WriteBatching), resolved at bind).
    pub(crate) turn_writes: bool,
    /// Networks this endpoint is silent on (test hook).
    #[cfg(feature = "test-util")]
    pub(crate) muted: Arc<std::sync::atomic::AtomicU64>,
    /// The role service, when the configuration names one.
    pub(crate) role: Option<Arc<crate::role::RoleShared>>,
}

/// Resolves the write policy for the runtime the endpoint is bound on.
fn turn_writes(policy: crate::WriteBatching) -> bool {
    match policy {
        crate::WriteBatching::Turn => true,
        crate::WriteBatching::Idle => false,
        // `bind` runs inside the runtime that will run the endpoint's tasks.
        _ => tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().num_workers() == 1),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        router: Router,
        base: std::time::Instant,
        detector: Option<Arc<crate::detector::Detector>>,
    ) -> Shared {
        let epoch = router.local().epoch;
        let server = Server::new(config.scheduler.build(), config.max_concurrent_requests);
        let incoming = IncomingQueue::new(config.scheduler.aging_bound);
        #[cfg(feature = "test-util")]
        let muted = detector
            .as_ref()
            .map_or_else(Default::default, |d| d.muted.clone());
        Shared {
            epoch: AtomicU64::new(epoch.0),
            base: tokio::time::Instant::from_std(base),
            router: Mutex::new(RouterState {
                router,
                unbound: HashMap::new(),
                out: BytesMut::new(),
            }),
            sessions: RwLock::new(FxHashMap::default()),
            next_session_key: AtomicU64::new(1),
            server,
            incoming,
            events: EventHub::new(),
            stats: Stats::default(),
            detector,
            redial: Notify::new(),
            refused: Mutex::new(FxHashMap::default()),
            next_path: AtomicU64::new(1),
            last_now: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            secure: crate::secure::SecureSetup::from_config(&config),
            limits: Arc::new(crate::secure::ConnLimits::new(
                config.max_connections,
                config.max_connections_per_ip,
                config.max_handshaking,
            )),
            log_refused: LogLimit::default(),
            log_handshake: LogLimit::default(),
            log_limits: LogLimit::default(),
            turn_writes: turn_writes(config.write_batching),
            #[cfg(feature = "test-util")]
            muted,
            role: config
                .role
                .clone()
                .map(|c| Arc::new(crate::role::RoleShared::new(c))),
            config,
        }
    }

    /// A connect to `peer` on `network` was refused. Reports
    /// [`NetEvent::PeerRefused`] when every network of the peer refused
    /// and no path to it is up.
    pub(crate) fn dial_refused(&self, peer: NodeId, network: usize) {
        let Some(p) = self.config.peers.iter().find(|p| p.node == peer) else {
            return;
        };
        let want = p
            .addrs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_some())
            .fold(0u64, |m, (i, _)| m | 1u64 << i.min(63));
        let report = {
            let mut r = lock(&self.refused);
            let e = r.entry(peer).or_default();
            e.0 |= 1u64 << network.min(63);
            let all = e.0 & want == want;
            if all && !e.1 && self.events.paths_up(peer) == 0 {
                e.1 = true;
                true
            } else {
                false
            }
        };
        if report {
            warn!(%peer, "every network refused our connections: no process listens at the peer's addresses");
            self.events.publish(NetEvent::PeerRefused { peer });
        }
    }

    /// A connect to `peer` succeeded: refusals start over.
    pub(crate) fn dial_connected(&self, peer: NodeId) {
        lock(&self.refused).remove(&peer);
    }

    /// The core's clock: time since the endpoint started.
    pub(crate) fn now(&self) -> Time {
        let t = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_now.fetch_max(t, Ordering::Relaxed);
        Time::from_nanos(t)
    }

    /// The last time read by `now`: good enough for queueing (the core only
    /// keeps its clock monotonic with it), and free.
    pub(crate) fn now_cached(&self) -> Time {
        Time::from_nanos(self.last_now.load(Ordering::Relaxed))
    }

    pub(crate) fn instant(&self, t: Time) -> tokio::time::Instant {
        self.base + t.since_origin()
    }

    pub(crate) fn next_path_id(&self) -> PathId {
        PathId(self.next_path.fetch_add(1, Ordering::Relaxed))
    }

    /// Spawns a task that is aborted when the endpoint shuts down.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(fut);
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    pub(crate) fn abort_tasks(&self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        self.server.abort_all();
    }

    fn router(&self) -> MutexGuard<'_, RouterState> {
        lock(&self.router)
    }

    /// The sessions now (a copy of the map's values).
    pub(crate) fn sessions(&self) -> Vec<Arc<SessionHandle>> {
        self.sessions.read().values().cloned().collect()
    }

    /// The current session with `peer`, if any.
    pub(crate) fn session(&self, peer: NodeId) -> Option<Arc<SessionHandle>> {
        self.sessions
            .read()
            .get(&peer)
            .filter(|h| !h.is_ended())
            .cloned()
    }

    /// Makes a session the router opened into a handle and starts its task.
    fn install(self: &Arc<Self>, core: surelink_proto::Session) -> Arc<SessionHandle> {
        let key = self.next_session_key.fetch_add(1, Ordering::Relaxed);
        let mut core = core;
        if let Some(r) = &self.role {
            core.set_avoided_networks(r.avoided(core.peer()));
        }
        let h = Arc::new(SessionHandle::new(key, core));
        self.sessions.write().insert(h.node, h.clone());
        self.spawn(run_session(self.clone(), h.clone()));
        h
    }

    /// The current session with `peer`, opening one if there is none (it
    /// is dialled if the peer is configured; otherwise it waits for the peer
    /// to dial us).
    pub(crate) fn session_for(
        self: &Arc<Self>,
        peer: NodeId,
    ) -> Result<Arc<SessionHandle>, SendError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        if let Some(h) = self.session(peer) {
            return Ok(h);
        }
        let now = self.now();
        let mut r = self.router();
        if let Some(h) = self.session(peer) {
            return Ok(h);
        }
        loop {
            match r.router.open(now, peer) {
                Ok((_, Some(core))) => return Ok(self.install(core)),
                Ok((id, None)) => {
                    // The router's current session ended and its cleanup
                    // has not run yet: finish it here.
                    r.router.session_ended(peer, id);
                }
                Err(OpenError::SelfSession(n)) => {
                    return Err(SendError::Core(surelink_proto::SendError::SelfSend(n)))
                }
                Err(e) => {
                    return Err(SendError::Core(surelink_proto::SendError::TooManySessions(
                        match e {
                            OpenError::TooManySessions(n) => n,
                            _ => 0,
                        },
                    )))
                }
            }
        }
    }

    /// A session ended: it leaves the router and the map, and its waiting
    /// requests leave the scheduler.
    pub(crate) fn session_ended(&self, h: &Arc<SessionHandle>) {
        {
            let mut r = self.router();
            r.router.session_ended(h.node, h.id);
            let mut map = self.sessions.write();
            if map.get(&h.node).is_some_and(|x| x.key == h.key) {
                map.remove(&h.node);
            }
        }
        self.server.remove_session(h.key);
        // A peer we do not dial (a client) that left: stop heartbeating
        // the address it last used. Configured peers keep theirs.
        if let Some(d) = &self.detector {
            let configured = self.config.peers.iter().any(|p| p.node == h.node);
            let current = self.sessions.read().contains_key(&h.node);
            if !configured && !current {
                d.forget_peer(h.node);
            }
        }
    }

    /// A dialled connection to `peer` is up: it joins the peer's session.
    pub(crate) fn add_dialled(
        self: &Arc<Self>,
        io: &Arc<ConnIo>,
        peer: NodeId,
    ) -> Option<Arc<SessionHandle>> {
        let h = match self.session_for(peer) {
            Ok(h) => h,
            Err(e) => {
                warn!(path = %io.path, %peer, error = %e, "dialled connection refused");
                io.kill();
                return None;
            }
        };
        h.with(self, |g, now| {
            g.core.add_path(now, io.path);
            g.core
                .set_path_network(io.path, u8::try_from(io.network).unwrap_or(u8::MAX));
            g.conns.push(io.clone());
        });
        Some(h)
    }

    /// An accepted connection: its HELLO will say which session it joins.
    pub(crate) fn add_accepted(&self, io: &Arc<ConnIo>) {
        let now = self.now();
        let mut r = self.router();
        match r.router.add_unbound_path(now, io.path) {
            Ok(()) => {
                r.unbound.insert(io.path, io.clone());
            }
            Err(e) => {
                warn!(path = %io.path, error = %e, "accepted connection refused");
                io.kill();
            }
        }
    }

    /// Writes the router's CLOSE frames and reports its closed paths.
    fn drain_router(&self, r: &mut RouterState) {
        let RouterState {
            router,
            unbound,
            out,
        } = r;
        while let Some(path) = router.poll_transmit(out) {
            let bytes = out.split().freeze();
            if let Some(io) = unbound.get(&path) {
                io.enqueue(bytes);
                io.flush();
            }
        }
        while let Some(ev) = router.poll_event() {
            if let surelink_proto::Event::PathClosed { path, reason, .. } = ev {
                let network = match unbound.remove(&path) {
                    Some(io) => {
                        warn!(%path, remote = %io.remote, ?reason, "connection closed before its handshake");
                        let n = io.network;
                        tokio::spawn(io.close_after_flush());
                        n
                    }
                    None => 0,
                };
                self.stats.path_down(0);
                self.events.publish(NetEvent::PathDown {
                    peer: None,
                    path,
                    network,
                    resent: 0,
                    reason: format!("{reason:?}"),
                });
            }
        }
    }

    /// Bytes arrived on a connection no session holds yet. Returns the
    /// session its HELLO bound it to, once it did.
    pub(crate) fn unbound_input(
        self: &Arc<Self>,
        io: &Arc<ConnIo>,
        buf: &mut BytesMut,
    ) -> Result<Option<Arc<SessionHandle>>, PathError> {
        let hello = {
            let now = self.now();
            let mut r = self.router();
            let res = r.router.handle_unbound_input(now, io.path, buf);
            self.drain_router(&mut r);
            match res? {
                None => return Ok(None),
                Some(h) => h,
            }
        };
        self.route_hello(io, None, &hello).map(Some)
    }

    /// Routes a HELLO that arrived on `io` (held by `bound`, if any) and
    /// applies the router's decision. Returns the session the path belongs
    /// to now.
    pub(crate) fn route_hello(
        self: &Arc<Self>,
        io: &Arc<ConnIo>,
        bound: Option<&Arc<SessionHandle>>,
        hello: &Hello,
    ) -> Result<Arc<SessionHandle>, PathError> {
        let now = self.now();
        let path = io.path;
        let mut works: Vec<(Arc<SessionHandle>, Work)> = Vec::new();
        let result = {
            let mut r = self.router();
            // The node a HELLO must name: the session's holding the path,
            // else the one whose key the handshake proved.
            let expected = bound.map(|b| b.node).or(io.authenticated);
            let decision = r.router.handle_hello(now, path, expected, hello);
            self.drain_router(&mut r);
            let target = match decision {
                Err(e) => {
                    if let Some(b) = bound {
                        let mut g = b.lock();
                        g.core.refuse_path(now, path, e.clone());
                        works.push((b.clone(), b.drive(&mut g, self, now)));
                    }
                    Err(e)
                }
                Ok(HelloRoute::Existing(id)) => match self.session(hello.node) {
                    Some(h) if h.id == id => Ok(h),
                    _ => Err(PathError::UnknownPath(path)),
                },
                Ok(HelloRoute::New { session, replaces }) => {
                    if let Some((old_id, reason)) = replaces {
                        let old = self
                            .sessions
                            .read()
                            .get(&hello.node)
                            .filter(|h| h.id == old_id)
                            .cloned();
                        if let Some(old) = old {
                            let mut g = old.lock();
                            g.core.detach_path(path);
                            g.conns.retain(|c| c.path != path);
                            g.core.supersede(now, reason);
                            works.push((old.clone(), old.drive(&mut g, self, now)));
                        }
                    }
                    Ok(self.install(*session))
                }
            };
            match target {
                Err(e) => Err(e),
                Ok(t) => {
                    if let Some(b) = bound.filter(|b| b.key != t.key) {
                        let mut g = b.lock();
                        g.core.detach_path(path);
                        g.conns.retain(|c| c.path != path);
                        works.push((b.clone(), b.drive(&mut g, self, now)));
                    }
                    r.unbound.remove(&path);
                    let mut g = t.lock();
                    if !g.conns.iter().any(|c| c.path == path) {
                        g.conns.push(io.clone());
                    }
                    let res = g.core.handle_hello(now, path, hello);
                    g.core
                        .set_path_network(path, u8::try_from(io.network).unwrap_or(u8::MAX));
                    works.push((t.clone(), t.drive(&mut g, self, now)));
                    drop(g);
                    res.map(|()| t)
                }
            }
        };
        for (h, w) in works {
            h.run(self, w);
        }
        result
    }

    /// An unbound connection ended.
    pub(crate) fn unbound_down(&self, path: PathId) {
        let mut r = self.router();
        r.router.unbound_path_down(path);
        self.drain_router(&mut r);
        r.unbound.remove(&path);
    }

    /// Closes unbound connections whose handshake timed out.
    pub(crate) fn router_tick(&self) {
        let now = self.now();
        let mut r = self.router();
        if r.router.poll_timeout().is_some_and(|t| t <= now) {
            r.router.handle_timeout(now);
            self.drain_router(&mut r);
        }
    }

    /// The connections of every session, and the unbound ones.
    pub(crate) fn connections(&self) -> Vec<(Arc<ConnIo>, Option<NodeId>)> {
        let mut v: Vec<(Arc<ConnIo>, Option<NodeId>)> = self
            .router()
            .unbound
            .values()
            .map(|c| (c.clone(), None))
            .collect();
        for h in self.sessions() {
            let g = h.lock();
            v.extend(g.conns.iter().map(|c| (c.clone(), Some(h.node))));
        }
        v
    }

    /// Shuts down every connection's socket.
    pub(crate) fn kill_connections(&self) {
        for (c, _) in self.connections() {
            c.kill();
        }
    }

    /// Counters, histograms and per-session state.
    pub(crate) fn snapshot(&self) -> crate::stats::StatsSnapshot {
        let mut sessions: Vec<_> = self
            .sessions()
            .into_iter()
            .map(|h| (h.node, h.lock().core.stats()))
            .collect();
        sessions.sort_by_key(|(n, _)| *n);
        let mut snap = self.stats.snapshot(sessions);
        let (queued, running) = self.server.load();
        snap.requests_queued = queued as u64;
        snap.requests_running = running as u64;
        snap.detector = self.detector.as_ref().map(|d| d.snapshot());
        snap.connections_open = self.limits.open() as u64;
        snap
    }

    /// Acts on a failure-detector report.
    pub(crate) fn detector_report(&self, report: PathReport) {
        let event = match report {
            PathReport::PathDown { watch, last_heard } => {
                let network = usize::from(watch.network);
                let mut killed = 0;
                if let Some(h) = self.session(watch.peer) {
                    for c in h.lock().conns.iter().filter(|c| c.network == network) {
                        // The reader sees the end at once and the session
                        // re-sends this path's in-flight messages elsewhere.
                        c.kill();
                        killed += 1;
                    }
                }
                // `last_heard` is on the detector's clock.
                let now = self.detector.as_ref().map_or(last_heard, |d| d.gate.now());
                let silent = now.saturating_since(last_heard);
                warn!(peer = %watch.peer, network, silent_ms = silent.as_millis(), killed, "path silent: failing over");
                NetEvent::PathSilent {
                    peer: watch.peer,
                    network,
                    silent_for_us: u64::try_from(silent.as_micros()).unwrap_or(u64::MAX),
                }
            }
            PathReport::PathUp { watch } => {
                info!(peer = %watch.peer, network = watch.network, "path heard again");
                self.redial.notify_waiters();
                NetEvent::PathHeard {
                    peer: watch.peer,
                    network: usize::from(watch.network),
                }
            }
            PathReport::PeerDown { peer } => {
                warn!(%peer, "every path to the peer is silent: peer dead");
                NetEvent::PeerDead { peer }
            }
            PathReport::PeerUp { peer } => NetEvent::PeerAlive { peer },
        };
        self.events.publish(event);
    }

    /// After the fence closed: end every session, fail every call, and go
    /// on as a new incarnation so peers learn that this one stopped.
    pub(crate) fn recover_from_fence(&self) {
        let old = Epoch(self.epoch.load(Ordering::Relaxed));
        let new = Epoch(old.0 + 1);
        let err = CallError::Fenced { epoch: old };
        let (mut calls_failed, mut abandoned) = (0, 0);
        {
            let mut r = self.router();
            let identity = LocalIdentity {
                cluster: self.config.cluster,
                node: self.config.node,
                epoch: new,
            };
            match Router::new(self.config.core.clone(), identity) {
                Ok(router) => r.router = router,
                Err(e) => warn!(error = %e, "could not start the new incarnation"),
            }
            for (_, io) in r.unbound.drain() {
                io.kill();
            }
            let old_sessions: Vec<Arc<SessionHandle>> =
                self.sessions.write().drain().map(|(_, h)| h).collect();
            for h in old_sessions {
                let (c, a) = h.abandon(&err);
                calls_failed += c;
                abandoned += a;
                self.server.remove_session(h.key);
            }
            self.epoch.store(new.0, Ordering::Relaxed);
        }
        if let Some(d) = &self.detector {
            d.restart_fence(new);
        }
        self.redial.notify_waiters();
        self.events.publish(NetEvent::Fenced {
            old_epoch: old,
            new_epoch: new,
            calls_failed,
            abandoned,
        });
    }
}
