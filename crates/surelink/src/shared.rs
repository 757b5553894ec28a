//! What every task of an endpoint shares, and the router's side of it:
//! the core's [`Router`] (taken only for handshakes, new and ended
//! sessions) and the session map (each session behind its own lock).
//!
//! A HELLO is decided by the core ([`Router::handle_hello`]) and applied
//! with [`HelloDecision::apply`](surelink_proto::HelloDecision::apply)
//! through [`ShellSessions`], the shell's [`SessionTable`]: each session
//! the decision names is locked for its step and driven, the work run
//! once the router's lock is released. The simulator's endpoint applies
//! the very same decision through its own table.
//!
//! The other parts live in their own modules and keep their own state:
//! dialling (`dial.rs`), connections (`conn/`), the detector and its
//! reactions (`detector/`), the request executor (`server/`), one-way
//! message delivery (`incoming.rs`), events, counters and the role task.
//!
//! Lock order: router, then a session, then leaf locks (a connection's
//! write queue, the scheduler, the incoming queue). Nothing takes the
//! router while holding a session.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard, RwLock};

use bytes::{Bytes, BytesMut};
use rustc_hash::FxHashMap;
use tokio::task::JoinHandle;
use tracing::warn;

use surelink_proto::wire::Hello;
use surelink_proto::{
    ChannelId, NodeId, OpenError, PathError, PathId, Router, Session, SessionId, SessionTable,
};

use crate::clock::Clock;
use crate::config::Config;
use crate::conn::ConnIo;
use crate::dial::Dialer;
use crate::error::SendError;
use crate::events::{EventHub, NetEvent};
use crate::incoming::IncomingQueue;
use crate::ratelog::LogLimits;
use crate::server::Server;
use crate::session::{run_session, Offer, Output, Reading, SessionHandle, Work};
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
    pub(crate) clock: Clock,
    /// This process's incarnation (a new one after a fence).
    pub(crate) epoch: AtomicU64,
    pub(crate) router: Mutex<RouterState>,
    /// The current session per peer node.
    sessions: RwLock<FxHashMap<NodeId, Arc<SessionHandle>>>,
    next_session_key: AtomicU64,
    next_path: AtomicU64,
    pub(crate) closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) server: Server,
    pub(crate) incoming: IncomingQueue,
    pub(crate) events: EventHub,
    pub(crate) stats: Stats,
    /// The failure detector, unless it is off.
    pub(crate) detector: Option<Arc<crate::detector::Detector>>,
    pub(crate) dialer: Dialer,
    /// Keys and member list for handshakes; `None` when insecure.
    pub(crate) secure: Option<crate::secure::SecureSetup>,
    /// Limits on accepted connections.
    pub(crate) limits: Arc<crate::admission::ConnLimits>,
    /// Rate limits for log lines a remote party can cause.
    pub(crate) logs: LogLimits,
    /// Queued messages wait for the end of the runtime's turn
    /// ([`WriteBatching`](crate::WriteBatching), resolved at bind).
    pub(crate) turn_writes: bool,
    /// Networks this endpoint is silent on (test hook).
    #[cfg(feature = "test-util")]
    pub(crate) muted: Arc<AtomicU64>,
    /// The role service, when the configuration names one.
    pub(crate) role: Option<Arc<crate::role::RoleShared>>,
    /// Helpers' relays, when `config.helpers` names any.
    pub(crate) relays: Option<crate::relay::Relays>,
    /// Servers this client is helped towards (activation): new traffic
    /// to them prefers a helper's path while it is healthy.
    pub(crate) helped: Mutex<rustc_hash::FxHashSet<NodeId>>,
    /// Per-server calls (round trips, and the calls waiting), for the
    /// servers activation watches (a proxy's p99 towards its hot node,
    /// not mixed with the others').
    peer_calls: RwLock<FxHashMap<NodeId, (usize, Arc<crate::peer_calls::PeerCalls>)>>,
    /// `peer_calls` is not empty (one load on the call path otherwise).
    watching_rtt: AtomicBool,
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

impl Shared {
    pub(crate) fn new(
        config: Config,
        router: Router,
        base: std::time::Instant,
        detector: Option<Arc<crate::detector::Detector>>,
    ) -> Shared {
        let epoch = router.local().epoch;
        let server = Server::new(
            &config.scheduler,
            &config.executor,
            config.max_concurrent_requests,
        );
        let incoming = IncomingQueue::new(
            config.scheduler.aging_bound,
            config.incoming_per_peer,
            config.incoming_bytes_per_peer,
        );
        #[cfg(feature = "test-util")]
        let muted = detector
            .as_ref()
            .map_or_else(Default::default, |d| d.muted.clone());
        Shared {
            epoch: AtomicU64::new(epoch.0),
            clock: Clock::new(base),
            router: Mutex::new(RouterState {
                router,
                unbound: HashMap::new(),
                out: BytesMut::new(),
            }),
            sessions: RwLock::new(FxHashMap::default()),
            next_session_key: AtomicU64::new(1),
            next_path: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            server,
            incoming,
            events: EventHub::new(),
            stats: Stats::default(),
            detector,
            dialer: Dialer::default(),
            secure: crate::secure::SecureSetup::from_config(&config),
            limits: Arc::new(crate::admission::ConnLimits::from_config(&config)),
            logs: LogLimits::default(),
            turn_writes: turn_writes(config.write_batching),
            #[cfg(feature = "test-util")]
            muted,
            role: config
                .role
                .clone()
                .map(|c| Arc::new(crate::role::RoleShared::new(c))),
            helped: Mutex::new(rustc_hash::FxHashSet::default()),
            peer_calls: RwLock::new(FxHashMap::default()),
            watching_rtt: AtomicBool::new(false),
            relays: crate::relay::Relays::new(
                &config.helpers,
                config.relay_channel,
                config.max_slots_per_helper,
            ),
            config,
        }
    }

    /// The networks new traffic to `peer` prefers among healthy paths: a
    /// helper's, while activation has us helped towards it or while its
    /// data comes to us through a helper (`relayed`: our traffic goes back
    /// the same way, so a server's replies to helped clients are batched
    /// too). A helper's path that freezes is suspected and loses to a
    /// healthy direct one; the role table's avoidance still comes first.
    pub(crate) fn prefer_mask(&self, peer: NodeId, relayed: bool) -> u8 {
        if relayed || self.helped.lock().contains(&peer) {
            1u8 << crate::relay::RELAY_NETWORK
        } else {
            0
        }
    }

    /// Starts keeping `peer`'s call round trips apart (activation's
    /// signal); the histogram is shared while anyone watches.
    pub(crate) fn watch_peer_calls(&self, peer: NodeId) -> Arc<crate::peer_calls::PeerCalls> {
        let mut m = self.peer_calls.write();
        let (watchers, h) = m.entry(peer).or_default();
        *watchers += 1;
        self.watching_rtt.store(true, Ordering::Relaxed);
        h.clone()
    }

    /// Stops keeping `peer`'s round trips apart once nobody else watches.
    pub(crate) fn unwatch_peer_calls(&self, peer: NodeId) {
        let mut m = self.peer_calls.write();
        if let Some((watchers, _)) = m.get_mut(&peer) {
            *watchers -= 1;
            if *watchers == 0 {
                m.remove(&peer);
            }
        }
        self.watching_rtt.store(!m.is_empty(), Ordering::Relaxed);
    }

    /// A call to `peer` took `rtt` (kept only for watched peers).
    pub(crate) fn note_peer_rtt(&self, peer: NodeId, rtt: Duration) {
        if !self.watching_rtt.load(Ordering::Relaxed) {
            return;
        }
        if let Some((_, h)) = self.peer_calls.read().get(&peer) {
            h.rtt
                .record(u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1));
        }
    }

    /// A call to `peer` begun at `at` waits (kept only for watched peers)
    /// until the guard drops.
    pub(crate) fn note_call_waiting(
        &self,
        peer: NodeId,
        at: std::time::Instant,
    ) -> Option<crate::peer_calls::Waiting> {
        if !self.watching_rtt.load(Ordering::Relaxed) {
            return None;
        }
        self.peer_calls.read().get(&peer).map(|(_, c)| c.begin(at))
    }

    /// Activation: `peer`'s traffic prefers a helper's path (`on`) or not.
    pub(crate) fn set_helped(self: &Arc<Self>, peer: NodeId, on: bool) {
        if on {
            self.helped.lock().insert(peer);
        } else {
            self.helped.lock().remove(&peer);
        }
        if let Some(h) = self.session(peer) {
            let prefer = self.prefer_mask(peer, h.is_relayed());
            h.with(self, |g, _| g.core().set_preferred_networks(prefer));
        }
    }

    pub(crate) fn next_path_id(&self) -> PathId {
        PathId(self.next_path.fetch_add(1, Ordering::Relaxed))
    }

    /// Spawns a task that is aborted when the endpoint shuts down.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(fut);
        let mut tasks = self.tasks.lock();
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    pub(crate) fn abort_tasks(&self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        self.server.abort_all();
    }

    fn router(&self) -> MutexGuard<'_, RouterState> {
        self.router.lock()
    }

    /// The sessions now (a copy of the map's values).
    pub(crate) fn sessions(&self) -> Vec<Arc<SessionHandle>> {
        self.sessions.read().values().cloned().collect()
    }

    /// Takes every session out of the map (a new incarnation starts).
    pub(crate) fn take_sessions(&self) -> Vec<Arc<SessionHandle>> {
        self.sessions.write().drain().map(|(_, h)| h).collect()
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
    fn install(self: &Arc<Self>, mut core: Session) -> Arc<SessionHandle> {
        let key = self.next_session_key.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = &self.role {
            core.set_avoided_networks(r.avoided(core.peer()));
        }
        core.set_preferred_networks(self.prefer_mask(core.peer(), false));
        let ledger = self.incoming.ledger(core.peer());
        let h = Arc::new(SessionHandle::new(key, core, ledger));
        self.sessions.write().insert(h.node, h.clone());
        self.spawn(run_session(self.clone(), h.clone()));
        h
    }

    /// Stages a normal one-way message on `peer`'s current session if a
    /// flush is coming there anyway (`session/stage.rs`); hands it back
    /// otherwise. Looks the session up under the read lock without
    /// cloning its handle: this runs once per `send`.
    pub(crate) fn offer(&self, peer: NodeId, channel: ChannelId, m: Bytes) -> Result<(), Bytes> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(m);
        }
        let first = {
            let sessions = self.sessions.read();
            let Some(h) = sessions.get(&peer).filter(|h| !h.is_ended()) else {
                return Err(m);
            };
            match h.offer(channel, m) {
                Offer::Staged { first: false } => return Ok(()),
                Offer::Staged { first: true } => h.clone(),
                Offer::Refused(m) => return Err(m),
            }
        };
        // Outside the read lock: the detector takes its own locks.
        first.note_traffic(self);
        Ok(())
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
        let now = self.clock.now();
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
        self.server.remove_session(h);
        self.incoming.forget(h.node);
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
            g.core().add_path(now, io.path);
            g.core().set_path_network(io.path, io.policy_network());
            g.add_conn(io);
        });
        Some(h)
    }

    /// An accepted connection: its HELLO will say which session it joins
    /// (and must name the node its handshake proved, if it had one).
    pub(crate) fn add_accepted(&self, io: &Arc<ConnIo>) {
        let now = self.clock.now();
        let mut r = self.router();
        match r.router.add_unbound_path(now, io.path, io.authenticated) {
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
            let now = self.clock.now();
            let mut r = self.router();
            let res = r.router.handle_unbound_input(now, io.path, buf);
            self.drain_router(&mut r);
            match res? {
                None => return Ok(None),
                Some(h) => h,
            }
        };
        self.route_hello(io, None, hello).map(Some)
    }

    /// Routes a HELLO that arrived on `io` (held by `bound`, if any): the
    /// router decides, the decision runs on the sessions it names. Returns
    /// the session the path belongs to now.
    pub(crate) fn route_hello(
        self: &Arc<Self>,
        io: &Arc<ConnIo>,
        bound: Option<&Arc<SessionHandle>>,
        hello: Hello,
    ) -> Result<Arc<SessionHandle>, PathError> {
        let now = self.clock.now();
        let mut table = ShellSessions {
            shared: self,
            io,
            node: hello.node,
            bound,
            installed: None,
            joined: None,
            works: Vec::new(),
        };
        let result = {
            let mut r = self.router();
            let decision =
                r.router
                    .handle_hello(now, io.path, bound.map(|b| (b.id, b.node)), hello);
            self.drain_router(&mut r);
            let network = Some(io.policy_network());
            let result = decision.apply(now, network, &mut table);
            if table.joined.is_some() {
                r.unbound.remove(&io.path);
            }
            result
        };
        let ShellSessions { joined, works, .. } = table;
        for (h, w) in works {
            h.run(self, w);
        }
        let id = result?;
        joined
            .filter(|h| h.id == id)
            .ok_or(PathError::UnknownPath(io.path))
    }

    /// An unbound connection ended.
    pub(crate) fn unbound_down(&self, path: PathId) {
        let mut r = self.router();
        r.router.unbound_path_down(path);
        self.drain_router(&mut r);
        r.unbound.remove(&path);
    }

    /// Closes unbound connections whose handshake timed out.
    fn router_tick(&self) {
        let now = self.clock.now();
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
            v.extend(h.conns().into_iter().map(|c| (c, Some(h.node))));
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
            .map(|h| (h.node, h.stats()))
            .collect();
        sessions.sort_by_key(|(n, _)| *n);
        let mut held: Vec<(NodeId, u64)> = sessions
            .iter()
            .map(|(n, st)| (*n, st.held_bytes + self.incoming.bytes_of(*n) as u64))
            .collect();
        // Peers whose sessions are gone but whose messages still wait.
        for (n, b) in self.incoming.bytes_per_node() {
            if !held.iter().any(|(x, _)| *x == n) {
                held.push((n, b as u64));
            }
        }
        let mut snap = self.stats.snapshot(sessions);
        snap.peer_bytes_held = held;
        let (queued, running) = self.server.load();
        snap.requests_queued = queued as u64;
        snap.requests_running = running as u64;
        snap.groups = self.server.group_stats();
        snap.cleanup_panics = self.server.cleanup_panics();
        snap.detector = self.detector.as_ref().map(|d| d.snapshot());
        snap.connections_open = self.limits.open() as u64;
        snap.handshakes_resumed = self.secure.as_ref().map_or(0, |s| s.resumed());
        snap
    }
}

/// Closes accepted connections whose handshake does not complete in time.
pub(crate) async fn router_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        shared.router_tick();
    }
}

/// The shell's sessions as one HELLO decision sees them: the session
/// holding the path, the peer's current one, the one the decision opens.
/// Each step locks its session and drives it; the work waits in `works`
/// until the router's lock is released.
struct ShellSessions<'a> {
    shared: &'a Arc<Shared>,
    io: &'a Arc<ConnIo>,
    /// The node the HELLO names.
    node: NodeId,
    bound: Option<&'a Arc<SessionHandle>>,
    installed: Option<Arc<SessionHandle>>,
    /// The session the path joined.
    joined: Option<Arc<SessionHandle>>,
    works: Vec<(Arc<SessionHandle>, Work)>,
}

impl ShellSessions<'_> {
    fn handle(&self, id: SessionId) -> Option<Arc<SessionHandle>> {
        if let Some(b) = self.bound.filter(|b| b.id == id) {
            return Some(b.clone());
        }
        if let Some(h) = self.installed.as_ref().filter(|h| h.id == id) {
            return Some(h.clone());
        }
        self.shared
            .sessions
            .read()
            .get(&self.node)
            .filter(|h| h.id == id)
            .cloned()
    }
}

impl SessionTable for ShellSessions<'_> {
    fn with_session(&mut self, id: SessionId, f: &mut dyn FnMut(&mut Session)) -> bool {
        let Some(h) = self.handle(id) else {
            return false;
        };
        let ((), w) = h.step(self.shared, Reading::Fresh, |g, _| {
            f(g.core());
            ((), Output::Now)
        });
        if let Some(w) = w {
            self.works.push((h, w));
        }
        true
    }

    fn install(&mut self, session: Session) {
        self.installed = Some(self.shared.install(session));
    }

    fn path_left(&mut self, id: SessionId, path: PathId) {
        if let Some(h) = self.handle(id) {
            h.step(self.shared, Reading::Cached, |g, _| {
                g.remove_conn(path);
                ((), Output::Skip)
            });
        }
    }

    fn path_joined(&mut self, id: SessionId, _path: PathId) {
        if let Some(h) = self.handle(id) {
            let io = self.io;
            h.step(self.shared, Reading::Cached, |g, _| {
                g.add_conn(io);
                ((), Output::Skip)
            });
            self.joined = Some(h);
        }
    }
}
