//! The role service in the shell (hr-net's role server): one task per
//! endpoint that reports what this node sees, applies the tables pushed to
//! it, and — on a role-server candidate — runs the candidacy and, once it
//! takes over, the role server.
//!
//! Everything with wire meaning is in [`surelink_proto::role`]; this file
//! only moves its messages over the sessions (ROUTE_UPDATE frames, so they
//! ride the authenticated paths: the sender of a message is the session's
//! peer), feeds it the detector's and the sessions' events, reads the
//! clock, and applies an accepted table to the sessions as path policy.
//!
//! With an external backend ([`Ownership::Elected`]: an election outside
//! surelink, such as etcd's, names the role server) the task reports and
//! applies as ever but runs no candidacy or server: see [`external`].
//!
//! What it does not do: persist anything (a restarted node starts with no
//! table and listens before it claims an epoch), or elect without the
//! failure detector (with the detector off, candidates never learn that
//! the serving one died, so only the first candidate serves).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use surelink_proto::role::{
    self, Candidacy, CandidacyAction, HelperReport, Leveler, Matrix, Ownership, PathStatus,
    Reporter, RoleConfig, RoleEvent, RoleInput, RoleMessage, RoleServer, Sighting, TableGate,
    TableView,
};
use surelink_proto::{NodeId, SessionEndReason, Time};

use crate::events::NetEvent;
use crate::shared::Shared;

pub(crate) mod external;
mod status;

use external::ExternalLink;
pub use external::{ExternalRole, ExternalRoleError};
pub use status::RoleStatus;

/// Role messages waiting for the role task; beyond this they are dropped
/// (the role protocol re-sends).
const INBOX: usize = 1024;

/// A helper's load, read when its report is due: the rank of
/// `HelperLoad::rank`, or `None` once the helper is gone.
pub(crate) type LoadFn = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// What this node publishes as a helper.
struct Published {
    /// Where clients connect to it.
    addr: std::net::SocketAddr,
    load: LoadFn,
}

/// What the role task shares with the endpoint.
pub(crate) struct RoleShared {
    pub(crate) cfg: RoleConfig,
    inbox: mpsc::Sender<(NodeId, Bytes)>,
    rx: Mutex<Option<mpsc::Receiver<(NodeId, Bytes)>>>,
    /// Per peer: networks the table steers traffic away from.
    avoid: Mutex<HashMap<NodeId, u8>>,
    status: Mutex<RoleStatus>,
    /// The link to an external backend ([`Ownership::Elected`]).
    pub(crate) external: Option<ExternalLink>,
    /// This node is a helper: its address and load go to the role
    /// server with every report.
    helper: Mutex<Option<Published>>,
}

impl RoleShared {
    pub(crate) fn new(cfg: RoleConfig) -> RoleShared {
        let (tx, rx) = mpsc::channel(INBOX);
        RoleShared {
            inbox: tx,
            rx: Mutex::new(Some(rx)),
            avoid: Mutex::new(HashMap::new()),
            status: Mutex::new(RoleStatus {
                external: cfg.ownership == Ownership::Elected,
                ..RoleStatus::default()
            }),
            external: (cfg.ownership == Ownership::Elected).then(ExternalLink::new),
            helper: Mutex::new(None),
            cfg,
        }
    }

    /// This node relays as a helper at `addr`: report it and its load
    /// (`load`, until that says the helper is gone) to the role server.
    pub(crate) fn publish_helper(&self, addr: std::net::SocketAddr, load: LoadFn) {
        *self.helper.lock() = Some(Published { addr, load });
    }

    /// The load level the held row gives the helper at `addr` (`None`:
    /// no row, or the row does not list it).
    pub(crate) fn helper_level(&self, addr: std::net::SocketAddr) -> Option<u8> {
        let st = self.status.lock();
        st.table.as_ref()?.helper_at(addr).map(|h| h.level)
    }

    /// A role message arrived from `peer` (called under its session's lock:
    /// never blocks).
    pub(crate) fn deliver(&self, peer: NodeId, m: Bytes) {
        if self.inbox.try_send((peer, m)).is_err() {
            debug!(%peer, "role inbox full; message dropped");
        }
    }

    /// The networks the current table steers traffic to `peer` away from.
    pub(crate) fn avoided(&self, peer: NodeId) -> u8 {
        self.avoid.lock().get(&peer).copied().unwrap_or(0)
    }

    pub(crate) fn status(&self, now: Time) -> RoleStatus {
        let mut s = self.status.lock().clone();
        s.table_age = s.applied_at.map(|t| now.saturating_since(t));
        s
    }
}

struct Task {
    shared: Arc<Shared>,
    /// The endpoint's role state.
    rs: Arc<RoleShared>,
    me: NodeId,
    /// An external backend pushes the tables ([`Ownership::Elected`]).
    external: bool,
    /// Where a candidate hands reports to the external backend.
    forward: Option<mpsc::Sender<RoleInput>>,
    gate: TableGate,
    candidacy: Option<Candidacy>,
    server: Option<RoleServer>,
    /// What this node reports (the core's, fed from events).
    reporter: Reporter,
    /// The timer fired since the last step.
    ticked: bool,
    /// This node's helper reports: their number, and the level's
    /// hysteresis.
    helper_seq: u64,
    leveler: Leveler,
}

/// Runs the role service of an endpoint until it shuts down.
pub(crate) async fn run(shared: Arc<Shared>) {
    let Some(rs) = shared.role.clone() else {
        return;
    };
    let Some(mut rx) = rs.rx.lock().take() else {
        return;
    };
    let cfg = rs.cfg.clone();
    let me = shared.config.node;
    let now = clock(&shared);
    let mut tables = match &rs.external {
        Some(link) => match link.tables_rx.lock().take() {
            Some(rx) => Some(rx),
            None => return,
        },
        None => None,
    };
    let external = tables.is_some();
    let is_candidate = cfg.candidate_index(me).is_some();
    let candidacy =
        (is_candidate && !external).then(|| Candidacy::new(cfg.clone(), me, now, cfg.refresh * 3));
    // The task holds the only sender: the backend's receiver ends with it.
    let forward = rs
        .external
        .as_ref()
        .and_then(|l| l.inputs.lock().take())
        .filter(|_| is_candidate);
    let mut t = Task {
        rs: rs.clone(),
        external,
        forward,
        gate: TableGate::new(cfg.clone(), me),
        candidacy,
        server: None,
        reporter: Reporter::new(&cfg, me, now),
        ticked: true,
        helper_seq: 0,
        leveler: Leveler::default(),
        me,
        shared: shared.clone(),
    };
    let mut events = shared.events.subscribe();
    // Often enough to meet the refresh and the candidacy's deadlines.
    let mut tick = tokio::time::interval(cfg.refresh / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            m = rx.recv() => match m {
                Some((from, bytes)) => t.on_message(from, &bytes),
                None => return,
            },
            e = events.recv() => match e {
                Ok(e) => t.on_event(&e),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            },
            Some(view) = next_table(&mut tables) => t.apply_external(view),
            _ = tick.tick() => t.ticked = true,
        }
        t.step();
    }
}

/// The next row from the external backend; never, without one.
async fn next_table(rx: &mut Option<mpsc::Receiver<TableView>>) -> Option<TableView> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The matrix as the status shows it: (reporter, peer, network, status,
/// age in µs at `now`).
pub(crate) fn matrix_rows(m: &Matrix, now: Time) -> Vec<(NodeId, NodeId, u8, PathStatus, u64)> {
    m.iter()
        .map(|(from, to, net, e)| {
            let age = now.saturating_since(e.at).as_micros();
            (
                from,
                to,
                net,
                e.status,
                u64::try_from(age).unwrap_or(u64::MAX),
            )
        })
        .collect()
}

/// The role service's clock: the detector's (boot time, the clock its
/// fence's `t_valid` is on) when it runs, the endpoint's otherwise.
fn clock(shared: &Shared) -> Time {
    match &shared.detector {
        Some(d) => d.gate.now(),
        None => shared.clock.now(),
    }
}

impl Task {
    fn send(&self, to: NodeId, msg: &RoleMessage) {
        let mut buf = Vec::new();
        role::encode(msg, &mut buf);
        let b = Bytes::from(buf);
        match self.shared.session_for(to) {
            Ok(h) => {
                if let Err(e) = h.with(&self.shared, |g, now| g.core().send_role(now, b)) {
                    debug!(%to, error = %e, "role message not queued");
                }
            }
            Err(e) => debug!(%to, error = %e, "no session for a role message"),
        }
    }

    fn on_message(&mut self, from: NodeId, bytes: &[u8]) {
        let msg = match role::decode(bytes) {
            Ok(m) => m,
            Err(e) => {
                warn!(%from, error = %e, "undecodable role message dropped");
                return;
            }
        };
        self.handle(from, msg);
    }

    fn handle(&mut self, from: NodeId, msg: RoleMessage) {
        let now = clock(&self.shared);
        match msg {
            RoleMessage::Report(r) => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_epoch(r.held.0);
                }
                if let Some(s) = &mut self.server {
                    if let Err(e) = s.handle_report(now, from, &r) {
                        warn!(%from, error = %e, "role report refused");
                    }
                }
                self.forward(RoleInput::Report { from, report: r });
            }
            RoleMessage::HelperReport(r) => {
                if let Some(s) = &mut self.server {
                    if let Err(e) = s.handle_helper_report(now, from, &r) {
                        warn!(%from, error = %e, "helper report refused");
                    }
                }
                self.forward(RoleInput::HelperReport { from, report: r });
            }
            RoleMessage::Ack { epoch, version } => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_epoch(epoch);
                }
                if let Some(s) = &mut self.server {
                    s.handle_ack(from, epoch, version);
                }
            }
            RoleMessage::Table(_) | RoleMessage::TableRingDelta { .. } if self.external => {
                debug!(%from, "routing table pushed over a session refused: the external backend is the only source");
                self.rs.status.lock().tables_rejected += 1;
            }
            RoleMessage::Table(_) | RoleMessage::TableRingDelta { .. } => {
                self.accept(from, msg);
                let (epoch, version) = self.gate.held();
                let ack = RoleMessage::Ack { epoch, version };
                if from == self.me {
                    self.handle(from, ack);
                } else {
                    self.send(from, &ack);
                }
            }
        }
    }

    /// Hands an input to the external backend (a candidate's only).
    fn forward(&self, input: RoleInput) {
        if let Some(tx) = &self.forward {
            if tx.try_send(input).is_err() {
                debug!("external role backend behind; input dropped (the next refresh re-reports)");
            }
        }
    }

    /// A row from the external backend: the writer it names held the
    /// election of its epoch (the backend's word), so the gate checks it
    /// as if that writer had pushed it.
    fn apply_external(&mut self, view: TableView) {
        let writer = view.role;
        self.accept(writer, RoleMessage::Table(view));
    }

    /// Applies a row (a `Table` or `TableRingDelta` message) through the
    /// gate (newer only) and, if taken, as path policy.
    fn accept(&mut self, from: NodeId, msg: RoleMessage) {
        let (epoch, result) = match msg {
            RoleMessage::Table(view) => (view.epoch, self.gate.apply(from, view)),
            RoleMessage::TableRingDelta { view, ring } => {
                (view.epoch, self.gate.apply_ring_delta(from, view, &ring))
            }
            _ => return,
        };
        match result {
            Ok(a) => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_epoch(a.epoch);
                }
                if a.previous_epoch != a.epoch {
                    info!(role = %from, epoch = a.epoch, version = a.version, "routing table from a new role epoch");
                } else {
                    debug!(
                        epoch = a.epoch,
                        version = a.version,
                        "routing table applied"
                    );
                }
                self.apply_policy();
                self.shared.events.publish(NetEvent::RoutingTable {
                    role: from,
                    epoch: a.epoch,
                    version: a.version,
                });
            }
            Err(e) => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_epoch(epoch);
                }
                debug!(%from, error = %e, "routing table refused");
                self.rs.status.lock().tables_rejected += 1;
            }
        }
    }

    /// Applies the held table to the sessions as path policy.
    fn apply_policy(&mut self) {
        let Some(view) = self.gate.current().cloned() else {
            return;
        };
        let mut avoid = HashMap::new();
        for r in &view.routes {
            let mask = r
                .paths
                .iter()
                .filter(|p| p.network < 8 && !r.usable(p.network))
                .fold(0u8, |m, p| m | (1u8 << p.network));
            avoid.insert(r.to, mask);
        }
        let old = std::mem::replace(&mut *self.rs.avoid.lock(), avoid.clone());
        for peer in old.keys().chain(avoid.keys()) {
            if let Some(h) = self.shared.session(*peer) {
                let mask = avoid.get(peer).copied().unwrap_or(0);
                h.with(&self.shared, |g, _| g.core().set_avoided_networks(mask));
            }
        }
        let mut st = self.rs.status.lock();
        st.table = Some(view);
        st.applied_at = Some(self.shared.clock.now());
        st.tables_applied += 1;
    }

    fn on_event(&mut self, e: &NetEvent) {
        let net = |n: &usize| u8::try_from(*n).ok();
        let sighting = match e {
            NetEvent::PathUp { peer, network, .. } => {
                net(network).map(|network| Sighting::PathUp {
                    peer: *peer,
                    network,
                })
            }
            NetEvent::PathDown {
                peer: Some(peer),
                network,
                ..
            } => net(network).map(|network| Sighting::PathDown {
                peer: *peer,
                network,
            }),
            NetEvent::PathSilent { peer, network, .. } => {
                net(network).map(|network| Sighting::PathSilent {
                    peer: *peer,
                    network,
                })
            }
            NetEvent::PathHeard { peer, network } => {
                net(network).map(|network| Sighting::PathHeard {
                    peer: *peer,
                    network,
                })
            }
            NetEvent::PeerDead { peer } => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_peer_dead(*peer);
                }
                Some(Sighting::PeerDead(*peer))
            }
            NetEvent::PeerAlive { peer } | NetEvent::PeerUp { peer, .. } => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_peer_alive(*peer);
                }
                Some(Sighting::PeerAlive(*peer))
            }
            NetEvent::Fenced { .. } => {
                // A new incarnation: whatever it served ends (its pushes
                // were already gated by t_valid), and it listens before it
                // claims again — as the simulator's restarted process does.
                let now = clock(&self.shared);
                if self.server.take().is_some() {
                    warn!("role server ended: this process fenced itself");
                    self.rs.status.lock().serving = None;
                }
                if let Some(c) = &mut self.candidacy {
                    c.handle_fenced(now);
                }
                None
            }
            NetEvent::SessionEnded {
                peer,
                reason: SessionEndReason::PeerRestarted { .. },
                ..
            } => {
                if let Some(s) = &mut self.server {
                    s.handle_node_restarted(*peer);
                }
                self.forward(RoleInput::NodeRestarted(*peer));
                None
            }
            _ => None,
        };
        if let Some(s) = sighting {
            self.reporter.handle_sighting(s);
        }
    }

    /// The round trips of the peers the report lists (on the timer).
    fn feed_rtts(&mut self) {
        let listed: Vec<NodeId> = self.reporter.unusual().collect();
        for peer in listed {
            let Some(h) = self.shared.session(peer) else {
                continue;
            };
            let rtts = h.with(&self.shared, |g, _| g.core().network_rtts());
            for (network, rtt) in rtts {
                let us = u32::try_from(rtt.as_micros()).unwrap_or(u32::MAX);
                self.reporter.handle_rtt(peer, network, us);
            }
        }
    }

    /// Everything time-driven: reports, the candidacy, the server's pushes.
    /// Called after every input, so nothing here may cost O(cluster) unless
    /// something changed or the timer fired (a serving role server gets a
    /// report from every node every refresh).
    fn step(&mut self) {
        let now = clock(&self.shared);
        let ticked = std::mem::take(&mut self.ticked);
        // Report on change at once, else every refresh.
        if now >= self.reporter.poll_timeout() {
            // Round trips at the refresh's pace: they are policy, not news.
            self.feed_rtts();
        }
        self.reporter.handle_held(self.gate.held());
        if let Some(r) = self.reporter.poll_report(now) {
            let msg = RoleMessage::Report(r);
            self.send_to_candidates(&msg);
            self.rs.status.lock().reports_sent += 1;
            self.report_helper();
        }
        // The candidacy; never while the send fence is shut (a server
        // started then would be fenced at its first push).
        let shut = self.t_valid().is_none_or(|t| now >= t);
        if let Some(c) = self.candidacy.as_mut().filter(|_| !shut) {
            if let Some(CandidacyAction::TakeOver { epoch }) = c.poll(now) {
                let started = RoleServer::new(self.rs.cfg.clone(), self.me, epoch, now);
                match started {
                    Ok(s) => {
                        info!(epoch, "taking over as role server");
                        // Said at once (the rest of the snapshot waits for
                        // the timer): a status read right after its first
                        // table must not say "not serving".
                        self.rs.status.lock().serving = Some(epoch);
                        self.server = Some(s);
                    }
                    Err(e) => {
                        warn!(epoch, error = %e, "could not start the role server");
                        c.handle_server_stopped();
                    }
                }
            }
        }
        self.serve(now, ticked);
    }

    /// Sends `msg` to every role-server candidate (this node's own copy
    /// handled at once).
    fn send_to_candidates(&mut self, msg: &RoleMessage) {
        let candidates = self.rs.cfg.candidates.clone();
        for c in candidates {
            if c == self.me {
                self.handle(c, msg.clone());
            } else {
                self.send(c, msg);
            }
        }
    }

    /// A helper's report, with each status report (every refresh): its
    /// address and load level, to every candidate.
    fn report_helper(&mut self) {
        let (addr, rank) = {
            let mut h = self.rs.helper.lock();
            let Some(p) = h.as_ref() else { return };
            match (p.load)() {
                Some(rank) => (p.addr, rank),
                None => {
                    *h = None;
                    return;
                }
            }
        };
        self.helper_seq += 1;
        let msg = RoleMessage::HelperReport(HelperReport {
            helper: self.me,
            seq: self.helper_seq,
            addr,
            level: self.leveler.level(rank),
        });
        self.send_to_candidates(&msg);
    }

    /// This process's send fence (SafeTimer), on [`clock`]'s time; no
    /// limit without a detector.
    fn t_valid(&self) -> Option<Time> {
        match &self.shared.detector {
            Some(d) => d.gate.t_valid(),
            None => Some(Time::from_nanos(u64::MAX)),
        }
    }

    fn serve(&mut self, now: Time, ticked: bool) {
        let Some(mut s) = self.server.take() else {
            return;
        };
        let t_valid = self.t_valid();
        s.handle_timeout(now);
        let mut pushes = Vec::new();
        while let Some(p) = s.poll_push(now, t_valid) {
            pushes.push(p);
        }
        let mut stopped = false;
        let mut fenced = false;
        while let Some(e) = s.poll_event() {
            match e {
                RoleEvent::TableChanged { version } => {
                    info!(epoch = s.epoch(), version, "routing table changed");
                }
                RoleEvent::Fenced => {
                    warn!(epoch = s.epoch(), "role server fenced (t_valid passed)");
                    stopped = true;
                    fenced = true;
                }
                RoleEvent::SteppedDown { newer } => {
                    info!(epoch = s.epoch(), newer, "role server stepped down");
                    stopped = true;
                }
            }
        }
        if ticked || stopped {
            // The status snapshot (O(matrix)): on the timer only.
            let mut st = self.rs.status.lock();
            st.serving = (!stopped).then(|| s.epoch());
            st.matrix = matrix_rows(s.matrix(), now);
        }
        if stopped {
            if let Some(c) = &mut self.candidacy {
                if fenced {
                    c.handle_fenced(now);
                } else {
                    c.handle_server_stopped();
                }
            }
        } else {
            self.server = Some(s);
        }
        for p in pushes {
            let to = p.to;
            let msg = p.into_message();
            if to == self.me {
                self.handle(to, msg);
            } else {
                self.send(to, &msg);
            }
        }
    }
}
