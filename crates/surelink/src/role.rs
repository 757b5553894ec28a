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
//! What it does not do: persist anything (a restarted node starts with no
//! table and listens before it claims an epoch), or elect without the
//! failure detector (with the detector off, candidates never learn that
//! the serving one died, so only the first candidate serves).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use surelink_proto::role::{
    self, Candidacy, CandidacyAction, PathStatus, PeerReport, RoleConfig, RoleEvent, RoleMessage,
    RoleServer, StatusReport, TableGate, TableView,
};
use surelink_proto::{NodeId, SessionEndReason, Time};

use crate::events::NetEvent;
use crate::shared::Shared;

/// Role messages waiting for the role task; beyond this they are dropped
/// (the role protocol re-sends).
const INBOX: usize = 1024;

/// What the role task shares with the endpoint.
pub(crate) struct RoleShared {
    pub(crate) cfg: RoleConfig,
    inbox: mpsc::Sender<(NodeId, Bytes)>,
    rx: Mutex<Option<mpsc::Receiver<(NodeId, Bytes)>>>,
    /// Per peer: networks the table steers traffic away from.
    avoid: Mutex<HashMap<NodeId, u8>>,
    status: Mutex<RoleStatus>,
}

/// This node's view of the role service (from
/// [`Endpoint::role_status`](crate::Endpoint::role_status)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoleStatus {
    /// The table row this node holds (`None`: none yet).
    pub table: Option<TableView>,
    /// When it was applied, on the endpoint's clock.
    pub applied_at: Option<Time>,
    /// How long ago it was applied (when the snapshot was taken).
    pub table_age: Option<std::time::Duration>,
    /// Tables applied since start.
    pub tables_applied: u64,
    /// Pushed tables refused (stale, wrong owner, wrong row).
    pub tables_rejected: u64,
    /// The role epoch this node serves, if it is the role server
    /// (refreshed on the role task's timer, every quarter refresh).
    pub serving: Option<u64>,
    /// The matrix this node's role server holds (reporter, peer, network,
    /// status, age in µs), when it serves (refreshed likewise).
    pub matrix: Vec<(NodeId, NodeId, u8, PathStatus, u64)>,
    /// Reports sent.
    pub reports_sent: u64,
}

impl RoleShared {
    pub(crate) fn new(cfg: RoleConfig) -> RoleShared {
        let (tx, rx) = mpsc::channel(INBOX);
        RoleShared {
            cfg,
            inbox: tx,
            rx: Mutex::new(Some(rx)),
            avoid: Mutex::new(HashMap::new()),
            status: Mutex::new(RoleStatus::default()),
        }
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

impl RoleStatus {
    /// Prometheus text: the held table's epoch, version and age, the
    /// epoch served, counters.
    pub fn to_prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let (epoch, version) = self.table.as_ref().map_or((0, 0), |t| (t.epoch, t.version));
        let gauges: [(&str, &str, f64); 4] = [
            (
                "surelink_role_table_epoch",
                "Role epoch of the routing table held (0: none).",
                epoch as f64,
            ),
            (
                "surelink_role_table_version",
                "Version of the routing table held.",
                version as f64,
            ),
            (
                "surelink_role_table_age_seconds",
                "Seconds since the held routing table was applied (-1: none).",
                self.table_age.map_or(-1.0, |d| d.as_secs_f64()),
            ),
            (
                "surelink_role_serving_epoch",
                "Role epoch this node serves as role server (0: not serving).",
                self.serving.unwrap_or(0) as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let counters: [(&str, &str, u64); 3] = [
            (
                "surelink_role_tables_applied_total",
                "Routing tables applied.",
                self.tables_applied,
            ),
            (
                "surelink_role_tables_rejected_total",
                "Pushed routing tables refused (stale, wrong owner or row).",
                self.tables_rejected,
            ),
            (
                "surelink_role_reports_sent_total",
                "Status reports sent to the role-server candidates.",
                self.reports_sent,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        o
    }

    /// A human-readable rendering (`surelink status`): the table row held,
    /// and the matrix when this node serves.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        match &self.table {
            None => o.push_str("table: none yet\n"),
            Some(t) => {
                let age = self
                    .table_age
                    .map_or_else(|| "?".into(), |d| format!("{} ms", d.as_millis()));
                let _ = writeln!(
                    o,
                    "table: role server node {}, epoch {}, version {}, applied {age} ago",
                    t.role, t.epoch, t.version
                );
                if t.routes.is_empty() {
                    o.push_str("routes: every pair uses every network alike\n");
                }
                for r in &t.routes {
                    let paths: Vec<String> = r
                        .paths
                        .iter()
                        .map(|p| format!("net{} {:?} w{}", p.network, p.status, p.weight))
                        .collect();
                    let _ = writeln!(o, "route {} -> {}: {}", r.from, r.to, paths.join(", "));
                }
                let ring: Vec<String> = t
                    .ring
                    .iter()
                    .map(|m| format!("{}:{:?}", m.node, m.state))
                    .collect();
                let _ = writeln!(o, "ring: {}", ring.join(" "));
            }
        }
        match self.serving {
            Some(e) => {
                let _ = writeln!(o, "serving as role server, epoch {e}");
                if self.matrix.is_empty() {
                    o.push_str("matrix: nothing unusual reported\n");
                }
                for (from, to, net, s, age) in &self.matrix {
                    let _ = writeln!(
                        o,
                        "matrix {from} -> {to} net{net}: {s:?} ({} ms old)",
                        age / 1000
                    );
                }
            }
            None => o.push_str("not serving as role server\n"),
        }
        let _ = writeln!(
            o,
            "tables applied {}, refused {}; reports sent {}",
            self.tables_applied, self.tables_rejected, self.reports_sent
        );
        o
    }
}

/// What the reporter knows of each peer, from events.
#[derive(Default)]
struct Seen {
    /// (peer, network) the detector found silent.
    silent: HashSet<(NodeId, usize)>,
    /// Peers the detector reported dead.
    dead: HashSet<NodeId>,
    /// Working paths per (peer, network).
    paths: HashMap<(NodeId, usize), usize>,
}

struct Task {
    shared: Arc<Shared>,
    me: NodeId,
    gate: TableGate,
    candidacy: Option<Candidacy>,
    server: Option<RoleServer>,
    seen: Seen,
    seq: u64,
    last_report: Option<StatusReport>,
    next_report: Time,
    /// What the report would say may have changed (an event, a table).
    report_due: bool,
    /// The timer fired since the last step.
    ticked: bool,
}

/// Runs the role service of an endpoint until it shuts down.
pub(crate) async fn run(shared: Arc<Shared>) {
    let Some(rs) = shared.role.as_ref() else {
        return;
    };
    let Some(mut rx) = rs.rx.lock().take() else {
        return;
    };
    let cfg = rs.cfg.clone();
    let me = shared.config.node;
    let now = clock(&shared);
    let candidacy = cfg
        .candidate_index(me)
        .map(|_| Candidacy::new(cfg.clone(), me, now, cfg.refresh * 3));
    let mut t = Task {
        gate: TableGate::new(cfg.clone(), me),
        candidacy,
        server: None,
        seen: Seen::default(),
        seq: 0,
        last_report: None,
        next_report: now,
        report_due: true,
        ticked: true,
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
            _ = tick.tick() => t.ticked = true,
        }
        t.step();
    }
}

/// The role service's clock: the detector's (boot time, the clock its
/// fence's `t_valid` is on) when it runs, the endpoint's otherwise.
fn clock(shared: &Shared) -> Time {
    match &shared.detector {
        Some(d) => d.gate.now(),
        None => shared.now(),
    }
}

impl Task {
    fn role(&self) -> &RoleShared {
        // `run` returns at once without it.
        self.shared.role.as_ref().expect("role service configured")
    }

    fn send(&self, to: NodeId, msg: &RoleMessage) {
        let mut buf = Vec::new();
        role::encode(msg, &mut buf);
        let b = Bytes::from(buf);
        match self.shared.session_for(to) {
            Ok(h) => {
                if let Err(e) = h.with(&self.shared, |g, now| g.core.send_role(now, b)) {
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
            }
            RoleMessage::Ack { epoch, version } => {
                if let Some(c) = &mut self.candidacy {
                    c.handle_epoch(epoch);
                }
                if let Some(s) = &mut self.server {
                    s.handle_ack(from, epoch, version);
                }
            }
            RoleMessage::Table(view) => self.apply(from, view),
        }
    }

    fn apply(&mut self, from: NodeId, view: TableView) {
        let epoch = view.epoch;
        match self.gate.apply(from, view) {
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
                self.role().status.lock().tables_rejected += 1;
            }
        }
        self.report_due = true;
        let (epoch, version) = self.gate.held();
        let ack = RoleMessage::Ack { epoch, version };
        if from == self.me {
            self.handle(from, ack);
        } else {
            self.send(from, &ack);
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
        let old = std::mem::replace(&mut *self.role().avoid.lock(), avoid.clone());
        for peer in old.keys().chain(avoid.keys()) {
            if let Some(h) = self.shared.session(*peer) {
                let mask = avoid.get(peer).copied().unwrap_or(0);
                h.with(&self.shared, |g, _| g.core.set_avoided_networks(mask));
            }
        }
        let mut st = self.role().status.lock();
        st.table = Some(view);
        st.applied_at = Some(self.shared.now());
        st.tables_applied += 1;
    }

    fn on_event(&mut self, e: &NetEvent) {
        self.report_due = true;
        let seen = &mut self.seen;
        match e {
            NetEvent::PathUp { peer, network, .. } => {
                *seen.paths.entry((*peer, *network)).or_default() += 1;
            }
            NetEvent::PathDown {
                peer: Some(peer),
                network,
                ..
            } => {
                if let Some(n) = seen.paths.get_mut(&(*peer, *network)) {
                    *n = n.saturating_sub(1);
                }
            }
            NetEvent::PathSilent { peer, network, .. } => {
                seen.silent.insert((*peer, *network));
            }
            NetEvent::PathHeard { peer, network } => {
                seen.silent.remove(&(*peer, *network));
            }
            NetEvent::PeerDead { peer } => {
                seen.dead.insert(*peer);
                if let Some(c) = &mut self.candidacy {
                    c.handle_peer_dead(*peer);
                }
            }
            NetEvent::PeerAlive { peer } | NetEvent::PeerUp { peer, .. } => {
                seen.dead.remove(peer);
                if let Some(c) = &mut self.candidacy {
                    c.handle_peer_alive(*peer);
                }
            }
            NetEvent::SessionEnded {
                peer,
                reason: SessionEndReason::PeerRestarted { .. },
                ..
            } => {
                if let Some(s) = &mut self.server {
                    s.handle_node_restarted(*peer);
                }
            }
            _ => {}
        }
    }

    /// What this node sees of its peers; only the unusual is listed.
    fn report(&mut self) -> StatusReport {
        let cfg = &self.role().cfg;
        let networks = usize::from(cfg.networks);
        let mut peers = Vec::new();
        let mut watched = 0u32;
        for &peer in cfg.nodes.iter().filter(|n| **n != self.me) {
            watched += 1;
            let alive = !self.seen.dead.contains(&peer);
            let nets: Vec<(PathStatus, u32)> = (0..networks)
                .map(|n| {
                    let status = if self.seen.silent.contains(&(peer, n)) {
                        PathStatus::Down
                    } else if self.seen.paths.get(&(peer, n)).copied().unwrap_or(0) == 0 {
                        PathStatus::Suspect
                    } else {
                        PathStatus::Up
                    };
                    (status, 0)
                })
                .collect();
            if alive && nets.iter().all(|(s, _)| *s == PathStatus::Up) {
                continue;
            }
            peers.push(PeerReport {
                peer,
                alive,
                networks: nets,
            });
        }
        StatusReport {
            reporter: self.me,
            seq: 0,
            watched,
            held: self.gate.held(),
            peers,
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
        if std::mem::take(&mut self.report_due) || now >= self.next_report {
            let mut r = self.report();
            let changed = self
                .last_report
                .as_ref()
                .is_none_or(|l| l.peers != r.peers || l.held != r.held || l.watched != r.watched);
            if changed || now >= self.next_report {
                self.seq += 1;
                r.seq = self.seq;
                self.next_report = now + self.role().cfg.refresh;
                let msg = RoleMessage::Report(r.clone());
                let candidates = self.role().cfg.candidates.clone();
                for c in candidates {
                    if c == self.me {
                        self.handle(c, msg.clone());
                    } else {
                        self.send(c, &msg);
                    }
                }
                self.last_report = Some(r);
                self.role().status.lock().reports_sent += 1;
            }
        }
        // The candidacy.
        if let Some(c) = &mut self.candidacy {
            if let Some(CandidacyAction::TakeOver { epoch }) = c.poll(now) {
                let cfg = self.shared.role.as_ref().map(|r| r.cfg.clone());
                let started = cfg
                    .ok_or(surelink_proto::role::RoleConfigError::NoNodes)
                    .and_then(|cfg| RoleServer::new(cfg, self.me, epoch, now));
                match started {
                    Ok(s) => {
                        info!(epoch, "taking over as role server");
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

    fn serve(&mut self, now: Time, ticked: bool) {
        let Some(mut s) = self.server.take() else {
            return;
        };
        let t_valid = match &self.shared.detector {
            Some(d) => d.gate.t_valid(),
            None => Some(Time::from_nanos(u64::MAX)),
        };
        s.handle_timeout(now);
        let mut pushes = Vec::new();
        while let Some(p) = s.poll_push(now, t_valid) {
            pushes.push(p);
        }
        let mut stopped = false;
        while let Some(e) = s.poll_event() {
            match e {
                RoleEvent::TableChanged { version } => {
                    info!(epoch = s.epoch(), version, "routing table changed");
                }
                RoleEvent::Fenced => {
                    warn!(epoch = s.epoch(), "role server fenced (t_valid passed)");
                    stopped = true;
                }
                RoleEvent::SteppedDown { newer } => {
                    info!(epoch = s.epoch(), newer, "role server stepped down");
                    stopped = true;
                }
            }
        }
        if ticked || stopped {
            // The status snapshot (O(matrix)): on the timer only.
            let mut st = self.role().status.lock();
            st.serving = (!stopped).then(|| s.epoch());
            st.matrix = s
                .matrix()
                .iter()
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
                .collect();
        }
        if stopped {
            if let Some(c) = &mut self.candidacy {
                c.handle_server_stopped();
            }
        } else {
            self.server = Some(s);
        }
        for p in pushes {
            if p.to == self.me {
                self.apply(p.to, p.view);
            } else {
                self.send(p.to, &RoleMessage::Table(p.view));
            }
        }
    }
}
