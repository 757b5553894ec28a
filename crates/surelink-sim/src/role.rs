//! The role service under partitions, pauses and crashes, on a virtual
//! clock: every node runs the product's [`TableGate`], candidates its
//! [`Candidacy`] and, once they take over, its [`RoleServer`]; every
//! process its SafeTimer [`Fence`]. Role messages travel encoded (the
//! product's codec) with a fixed delay; a partition drops them.
//!
//! The detector is modelled by its proven contract (see
//! `detector_props`): an observer reports a peer dead once it has heard no
//! heartbeat from it for the peer window, and heartbeats are sent only while
//! the sender's fence is valid. So a paused or crashed peer is reported
//! only after its `t_valid` passed, while a partition (heartbeats sent in
//! time, lost on the way) makes a live, unfenced peer look dead — the case
//! the fence does not cover.
//!
//! [`RoleScenario::run`] returns a [`RoleOutcome`]: every table applied at
//! every node, in order, and every push, for the property test to check.
//! It also checks, at every tick, that a table reaches every reachable
//! node within [`RoleScenario::reach_bound`]: whenever a serving role
//! server and a node have been connected (no partition between them,
//! neither paused nor crashed, the server's fence valid) for that long,
//! the node holds the version the server had that long ago, or something
//! newer ([`RoleOutcome::late`]); and it records from when on the cluster
//! stayed converged — one server serving, every node holding its table
//! ([`RoleOutcome::converged_from`]), for [`RoleScenario::converge_bound`].

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use surelink_proto::detector::{DetectorConfig, Fence};
use surelink_proto::role::{
    self, Candidacy, CandidacyAction, HelperReport, Leveler, Reporter, RoleConfig, RoleEvent,
    RoleMessage, RoleServer, Sighting, TableGate,
};
use surelink_proto::{NodeId, Time};

/// A fault of the role scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleFault {
    /// Nothing passes between `a` and `b` (both ways) from `at` for `dur`.
    Partition {
        /// When, from the start.
        at: Duration,
        /// How long.
        dur: Duration,
        /// One side (node index).
        a: usize,
        /// The other side.
        b: usize,
    },
    /// Node `node`'s process stops running from `at` for `dur` (GC,
    /// SIGSTOP): no input handled, no heartbeat sent.
    Pause {
        /// When.
        at: Duration,
        /// How long.
        dur: Duration,
        /// Node index.
        node: usize,
    },
    /// The path between `a` and `b` on `network` is down from `at` for
    /// `dur` (the other network still carries everything): both ends'
    /// detectors see it and their reports say so — a route changes, the
    /// ring does not.
    PathDown {
        /// When.
        at: Duration,
        /// How long.
        dur: Duration,
        /// One end (node index).
        a: usize,
        /// The other end.
        b: usize,
        /// The network (0 or 1).
        network: u8,
    },
    /// Node `node` crashes at `at` and restarts, empty, `down` later.
    Crash {
        /// When.
        at: Duration,
        /// Until the restart.
        down: Duration,
        /// Node index.
        node: usize,
    },
}

/// A role scenario: nodes, candidates, faults.
#[derive(Clone, Debug)]
pub struct RoleScenario {
    /// Nodes (ids 1..=nodes).
    pub nodes: usize,
    /// The first `candidates` nodes are role-server candidates.
    pub candidates: usize,
    /// Faults; all end before `run`.
    pub faults: Vec<RoleFault>,
    /// Simulated time.
    pub run: Duration,
    /// The helper's (the last node's) load doubles and halves every
    /// 350 ms; otherwise it stays, and so does its level (the table then
    /// settles once the faults end).
    pub helper_load_swings: bool,
}

/// A table a node applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppliedTable {
    /// When.
    pub at: Time,
    /// The node.
    pub node: usize,
    /// Its process incarnation (0 first; +1 per restart: a new process
    /// holds no table).
    pub incarnation: u32,
    /// From which node (authenticated sender).
    pub from: NodeId,
    /// Its epoch.
    pub epoch: u64,
    /// Its version.
    pub version: u64,
}

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct RoleOutcome {
    /// Every table applied, in time order.
    pub applied: Vec<AppliedTable>,
    /// `(time, server node index, epoch)` of every push sent.
    pub pushes: Vec<(Time, usize, u64)>,
    /// `(time, node, t_valid)` when a node took over: its fence then.
    pub takeovers: Vec<(Time, usize, u64)>,
    /// At the end: per running node, the `(epoch, version)` it holds.
    pub held_at_end: Vec<Option<(u64, u64)>>,
    /// At the end: the servers still serving, `(node, epoch, version)`.
    pub serving_at_end: Vec<(usize, u64, u64)>,
    /// Time of the last fault's end.
    pub faults_end: Time,
    /// When a node last applied a table.
    pub last_apply: Time,
    /// Messages that failed to decode (must be 0).
    pub decode_errors: u64,
    /// Rows sent with their ring as changes to the one the node held.
    pub delta_rows: u64,
    /// Of those, rows that changed the ring (a member's state).
    pub ring_change_rows: u64,
    /// Rows with ring changes a node holding a table could not apply: it
    /// did not hold their base ring (must be 0 — each costs the node a
    /// refresh).
    pub ring_not_held: u64,
    /// Rows applied whose ring is not the one their server pushed with
    /// that `(epoch, version)` (must be 0: a ring left out is filled in
    /// only with the very ring it was computed with).
    pub wrong_rings: u64,
    /// `(server, epoch, version, ring digest)` of every row pushed.
    pushed_rings: HashSet<(NodeId, u64, u64, u64)>,
    /// Times a node connected to a serving server for
    /// [`RoleScenario::reach_bound`] did not hold the version that server
    /// had that long before (the first few; must be empty).
    pub late: Vec<LateTable>,
    /// How many such (node, tick) pairs there were in all.
    pub late_count: u64,
    /// The longest a connected node went without a serving server's
    /// version: from the later of the version's making and the start of
    /// their connection, to the node holding it (or newer).
    pub max_reach_lag: Duration,
    /// From when on (to the end of the run) exactly one server served and
    /// every node held its current table (`None`: not at the end).
    pub converged_from: Option<Time>,
    /// Load levels the helper (the last node) reported.
    pub helper_levels: HashSet<u8>,
    /// Rows applied that list the helper.
    pub helper_rows: u64,
    /// Rows applied that list a helper other than the one that reports,
    /// at another address, or at a level it never reported (must be 0).
    pub helper_wrong: u64,
    /// The helper's node id.
    helper_node: u64,
}

/// A node that did not hold a reachable server's table in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LateTable {
    /// When.
    pub at: Time,
    /// The serving server's node index.
    pub server: usize,
    /// The node.
    pub node: usize,
    /// Since when they had been connected (and the server serving).
    pub connected_since: Time,
    /// `(epoch, version)` the node should hold at least.
    pub needed: (u64, u64),
    /// What it held.
    pub held: (u64, u64),
}

#[derive(Debug)]
struct Node {
    id: NodeId,
    incarnation: u32,
    running: bool,
    crashed: bool,
    fence: Fence,
    gate: TableGate,
    cand: Option<Candidacy>,
    server: Option<RoleServer>,
    /// Last time a heartbeat from each peer arrived.
    heard: Vec<Time>,
    dead: Vec<bool>,
    /// `(peer, network)` paths its detector sees down.
    paths_down: HashSet<(usize, u8)>,
    /// What this node reports: the product's reporter.
    reporter: Reporter,
    inbox: VecDeque<(usize, Vec<u8>)>,
    /// Since when the current role server serves, and each version it
    /// made, in order.
    serving: Option<(Time, Vec<(Time, u64)>)>,
    /// The helper's reports (the last node is a helper).
    helper_seq: u64,
    leveler: Leveler,
}

/// Where the simulated helper says clients reach it.
fn helper_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 7400))
}

impl Node {
    /// Offers a pushed row to the gate, records it if applied, and returns
    /// the `(epoch, version)` now held (what the node acknowledges).
    fn apply(
        &mut self,
        now: Time,
        index: usize,
        from: NodeId,
        row: RoleMessage,
        out: &mut RoleOutcome,
    ) -> (u64, u64) {
        let result = match row {
            RoleMessage::Table(view) => self.gate.apply(from, view),
            RoleMessage::TableRingDelta { view, ring } => {
                self.gate.apply_ring_delta(from, view, &ring)
            }
            _ => return self.gate.held(),
        };
        // (A process that restarted holds no table; the changes it gets
        // before the server learns of the restart are refused, rightly.)
        if matches!(result, Err(role::TableRejected::RingNotHeld { .. }))
            && self.gate.current().is_some()
        {
            out.ring_not_held += 1;
        }
        if let Ok(a) = result {
            let ring = self
                .gate
                .current()
                .map_or(0, |t| role::ring_digest(&t.ring));
            if !out.pushed_rings.contains(&(from, a.epoch, a.version, ring)) {
                out.wrong_rings += 1;
            }
            if let Some(t) = self.gate.current() {
                for h in &t.helpers {
                    let helper = NodeId(out.helper_node);
                    if h.node != helper
                        || h.addr != helper_addr()
                        || !out.helper_levels.contains(&h.level)
                    {
                        out.helper_wrong += 1;
                    } else {
                        out.helper_rows += 1;
                    }
                }
            }
            out.applied.push(AppliedTable {
                at: now,
                node: index,
                incarnation: self.incarnation,
                from,
                epoch: a.epoch,
                version: a.version,
            });
            out.last_apply = now;
        }
        self.gate.held()
    }

    /// The `(epoch, version)` this node's role server had at `at`, if it
    /// served then, and since when it serves.
    fn served_at(&self, at: Time) -> Option<(Time, (u64, u64))> {
        let s = self.server.as_ref().filter(|s| !s.is_stopped())?;
        let (since, versions) = self.serving.as_ref()?;
        let v = versions.iter().take_while(|(t, _)| *t <= at).last()?.1;
        Some((*since, (s.epoch(), v)))
    }

    /// When this node's serving role server made the first version newer
    /// than `held`, and since when it serves.
    fn first_newer(&self, held: (u64, u64)) -> Option<(Time, Time)> {
        let s = self.server.as_ref().filter(|s| !s.is_stopped())?;
        let (since, versions) = self.serving.as_ref()?;
        let t = versions
            .iter()
            .find(|(_, v)| (s.epoch(), *v) > held)
            .map(|(t, _)| *t)?;
        Some((*since, t))
    }

    /// The `(epoch, version)` of this node's serving role server now.
    fn serving_now(&self) -> Option<(u64, u64)> {
        let s = self.server.as_ref().filter(|s| !s.is_stopped())?;
        Some((s.epoch(), s.table().version))
    }
}

const DELAY: Duration = Duration::from_millis(1);
const TICK: Duration = Duration::from_millis(1);
/// Most [`LateTable`]s kept.
const LATE_KEPT: usize = 16;

impl RoleScenario {
    /// How long a candidate that starts listens before claiming an epoch.
    pub fn listen(&self) -> Duration {
        self.config().refresh * 3
    }

    /// The longest a node connected to a serving role server may go
    /// without that server's table of this long ago:
    ///
    /// - the server re-pushes a row the node has not acknowledged at its
    ///   refresh timer, to nodes whose last push is at least `refresh`
    ///   old; its timer ticks every `refresh`, so a push that went out
    ///   just after a tick (a new version) is repeated two ticks later:
    ///   a push at most every `2 × refresh` (one of them lost on a
    ///   partition that has just healed);
    /// - plus the one-way delay, and one tick of the simulator (a message
    ///   is handled on the tick it arrives, a timer on the tick it falls).
    ///
    /// A new version made while they are connected goes out at once
    /// (`DELAY`); the bound is for the push that was lost.
    pub fn reach_bound(&self) -> Duration {
        self.config().refresh * 2 + DELAY + TICK
    }

    /// From the end of the last fault until one server serves and every
    /// node holds its current table, for good:
    ///
    /// - a candidate whose process restarted at the end of the fault (a
    ///   crash's restart, or the new incarnation of a process fenced by a
    ///   pause) listens for [`RoleScenario::listen`] before it claims an
    ///   epoch — the worst case is the owner's own restart, nobody serving
    ///   meanwhile (a pause shorter than the peer window but longer than
    ///   the send slack fences it without anyone taking over);
    /// - a new server's matrix starts empty: its table settles once every
    ///   node's next report is in (`refresh` + `DELAY`), and a server of
    ///   an older epoch stops on the first report or ack carrying the
    ///   newer one (within `refresh` + `DELAY` of the nodes applying it);
    /// - the last version then reaches every node after `DELAY`;
    /// - plus two ticks (a fenced process restarts on the tick after it
    ///   finds itself fenced; a message is handled on the tick after).
    ///
    /// The detector's peer window does not add: every candidate that had
    /// to be reported dead to be replaced was silent during the fault,
    /// and was reported (and replaced) then.
    pub fn converge_bound(&self) -> Duration {
        self.listen() + self.config().refresh + DELAY * 2 + TICK * 2
    }

    /// The role configuration of this scenario.
    pub fn config(&self) -> RoleConfig {
        RoleConfig {
            nodes: (1..=self.nodes as u64).map(NodeId).collect(),
            networks: 2,
            candidates: (1..=self.candidates as u64).map(NodeId).collect(),
            ..RoleConfig::default()
        }
    }

    fn fresh_node(&self, i: usize, now: Time, det: &DetectorConfig) -> Node {
        let cfg = self.config();
        let id = NodeId(i as u64 + 1);
        let listen = self.listen();
        Node {
            id,
            incarnation: 0,
            running: true,
            crashed: false,
            fence: Fence::new(det, now),
            gate: TableGate::new(cfg.clone(), id),
            cand: (i < self.candidates).then(|| Candidacy::new(cfg.clone(), id, now, listen)),
            server: None,
            heard: vec![now; self.nodes],
            dead: vec![false; self.nodes],
            paths_down: HashSet::new(),
            reporter: {
                // Sessions are modelled as always connected: every path up.
                let mut r = Reporter::new(&cfg, id, now);
                for peer in cfg.nodes.iter().filter(|n| **n != id) {
                    for network in 0..cfg.networks {
                        r.handle_sighting(Sighting::PathUp {
                            peer: *peer,
                            network,
                        });
                    }
                }
                r
            },
            inbox: VecDeque::new(),
            serving: None,
            helper_seq: 0,
            leveler: Leveler::default(),
        }
    }

    /// Runs the scenario.
    pub fn run(&self) -> RoleOutcome {
        let det = DetectorConfig::with_interval(Duration::from_millis(10));
        let cfg = self.config();
        let mut out = RoleOutcome {
            helper_node: self.nodes as u64,
            ..RoleOutcome::default()
        };
        let mut nodes: Vec<Node> = (0..self.nodes)
            .map(|i| self.fresh_node(i, Time::ZERO, &det))
            .collect();
        // In flight: (deliver at, from, to, bytes); heartbeats as None.
        let mut wire: VecDeque<(Time, usize, usize, Option<Vec<u8>>)> = VecDeque::new();
        let end = Time::ZERO + self.run;
        out.faults_end = self
            .faults
            .iter()
            .map(|f| match f {
                RoleFault::Partition { at, dur, .. }
                | RoleFault::Pause { at, dur, .. }
                | RoleFault::PathDown { at, dur, .. } => *at + *dur,
                RoleFault::Crash { at, down, .. } => *at + *down,
            })
            .map(|d| Time::ZERO + d)
            .max()
            .unwrap_or(Time::ZERO);
        // Per (server node, node): since when they have been connected.
        let mut linked: Vec<Vec<Option<Time>>> = vec![vec![None; self.nodes]; self.nodes];
        let mut converged_since: Option<Time> = None;
        let mut now = Time::ZERO;
        while now < end {
            let t = now.saturating_since(Time::ZERO);
            let cut: HashSet<(usize, usize)> = self
                .faults
                .iter()
                .filter_map(|f| match f {
                    RoleFault::Partition { at, dur, a, b } if t >= *at && t < *at + *dur => {
                        Some([(*a, *b), (*b, *a)])
                    }
                    _ => None,
                })
                .flatten()
                .collect();
            // Process states.
            let mut restarted = vec![false; nodes.len()];
            for (i, n) in nodes.iter_mut().enumerate() {
                let paused = self.faults.iter().any(|f| {
                    matches!(f, RoleFault::Pause { at, dur, node } if *node == i && t >= *at && t < *at + *dur)
                });
                let crash = self.faults.iter().find_map(|f| match f {
                    RoleFault::Crash { at, down, node }
                        if *node == i && t >= *at && t < *at + *down =>
                    {
                        Some(())
                    }
                    _ => None,
                });
                if crash.is_some() {
                    n.crashed = true;
                    n.running = false;
                    n.inbox.clear();
                    continue;
                }
                if n.crashed {
                    let inc = n.incarnation + 1;
                    *n = self.fresh_node(i, now, &det);
                    n.incarnation = inc;
                    restarted[i] = true;
                    continue;
                }
                n.running = !paused;
            }
            // Path faults: each end's detector sees them (a paused process
            // sees them when it runs again).
            let paths_down: HashSet<(usize, usize, u8)> = self
                .faults
                .iter()
                .filter_map(|f| match f {
                    RoleFault::PathDown {
                        at,
                        dur,
                        a,
                        b,
                        network,
                    } if t >= *at && t < *at + *dur => {
                        Some([(*a, *b, *network), (*b, *a, *network)])
                    }
                    _ => None,
                })
                .flatten()
                .collect();
            for (i, n) in nodes.iter_mut().enumerate().filter(|(_, n)| n.running) {
                for j in 0..self.nodes {
                    for network in 0..2u8 {
                        let down = paths_down.contains(&(i, j, network));
                        let was = n.paths_down.contains(&(j, network));
                        if down == was {
                            continue;
                        }
                        let peer = NodeId(j as u64 + 1);
                        n.reporter.handle_sighting(if down {
                            n.paths_down.insert((j, network));
                            Sighting::PathDown { peer, network }
                        } else {
                            n.paths_down.remove(&(j, network));
                            Sighting::PathUp { peer, network }
                        });
                    }
                }
            }
            // A fenced process restarts as a new incarnation (what the
            // shell does: recovery is a new epoch).
            // Its candidacy goes on through `Candidacy::handle_fenced`,
            // the transition the shell makes on `NetEvent::Fenced`.
            for i in 0..nodes.len() {
                if nodes[i].running && nodes[i].fence.is_fenced() {
                    let inc = nodes[i].incarnation + 1;
                    let cand = nodes[i].cand.take();
                    nodes[i] = self.fresh_node(i, now, &det);
                    nodes[i].incarnation = inc;
                    if let Some(mut c) = cand {
                        c.handle_fenced(now);
                        nodes[i].cand = Some(c);
                    }
                    restarted[i] = true;
                }
            }
            // A new incarnation is noticed by every server (the router sees
            // its new process epoch): it holds no table.
            for i in 0..nodes.len() {
                if restarted[i] {
                    let id = nodes[i].id;
                    for n in nodes.iter_mut() {
                        if let Some(s) = n.server.as_mut() {
                            s.handle_node_restarted(id);
                        }
                    }
                }
            }
            // Deliver.
            let mut later = VecDeque::new();
            while let Some((at, from, to, msg)) = wire.pop_front() {
                if at > now {
                    later.push_back((at, from, to, msg));
                    continue;
                }
                if cut.contains(&(from, to)) || nodes[to].crashed {
                    continue;
                }
                match msg {
                    None => nodes[to].heard[from] = at,
                    Some(bytes) => nodes[to].inbox.push_back((from, bytes)),
                }
            }
            wire = later;
            for i in 0..nodes.len() {
                if !nodes[i].running {
                    continue;
                }
                self.step_node(i, now, &cfg, &det, &mut nodes, &mut wire, &mut out);
            }
            for (a, row) in linked.iter_mut().enumerate() {
                for (b, since) in row.iter_mut().enumerate() {
                    let up = nodes[a].running
                        && nodes[b].running
                        && !restarted[a]
                        && !restarted[b]
                        && !cut.contains(&(a, b));
                    *since = if up { since.or(Some(now)) } else { None };
                }
            }
            self.check_reach(now, &nodes, &linked, &mut out);
            let converged = {
                let serving: Vec<(u64, u64)> = nodes.iter().filter_map(Node::serving_now).collect();
                match serving[..] {
                    [table] => nodes.iter().all(|n| !n.crashed && n.gate.held() == table),
                    _ => false,
                }
            };
            converged_since = if converged {
                converged_since.or(Some(now))
            } else {
                None
            };
            now += TICK;
        }
        out.converged_from = converged_since;
        for n in &nodes {
            out.held_at_end
                .push((!n.crashed).then(|| n.gate.held()).filter(|h| h.0 > 0));
        }
        for (i, n) in nodes.iter().enumerate() {
            if let Some(s) = &n.server {
                if !s.is_stopped() {
                    out.serving_at_end.push((i, s.epoch(), s.table().version));
                }
            }
        }
        out
    }

    /// A node connected to a serving server for [`Self::reach_bound`]
    /// holds that server's table of then, or a newer one.
    fn check_reach(
        &self,
        now: Time,
        nodes: &[Node],
        linked: &[Vec<Option<Time>>],
        out: &mut RoleOutcome,
    ) {
        let bound = self.reach_bound();
        for (s, server) in nodes.iter().enumerate() {
            if !server.running || !server.fence.may_send(now) {
                continue;
            }
            for (n, node) in nodes.iter().enumerate() {
                let (Some(since), Some((serving, made))) =
                    (linked[s][n], server.first_newer(node.gate.held()))
                else {
                    continue;
                };
                let lag = now.saturating_since(since.max(serving).max(made));
                out.max_reach_lag = out.max_reach_lag.max(lag + TICK);
            }
            let Some(then) = now.as_nanos().checked_sub(bound.as_nanos() as u64) else {
                continue;
            };
            let then = Time::from_nanos(then);
            let Some((serving_since, needed)) = server.served_at(then) else {
                continue;
            };
            for (n, node) in nodes.iter().enumerate() {
                let Some(since) = linked[s][n] else {
                    continue;
                };
                let since = since.max(serving_since);
                if since > then || node.gate.held() >= needed {
                    continue;
                }
                out.late_count += 1;
                if out.late.len() < LATE_KEPT {
                    out.late.push(LateTable {
                        at: now,
                        server: s,
                        node: n,
                        connected_since: since,
                        needed,
                        held: node.gate.held(),
                    });
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step_node(
        &self,
        i: usize,
        now: Time,
        cfg: &RoleConfig,
        det: &DetectorConfig,
        nodes: &mut [Node],
        wire: &mut VecDeque<(Time, usize, usize, Option<Vec<u8>>)>,
        out: &mut RoleOutcome,
    ) {
        let me = nodes[i].id;
        // Heartbeats: sent (and proven sent) at once while running.
        while let Some(due) = nodes[i].fence.poll_heartbeat(now) {
            nodes[i].fence.handle_sent(due.seq, now);
            for j in 0..nodes.len() {
                if j != i {
                    wire.push_back((now + DELAY, i, j, None));
                }
            }
        }
        let t_valid = (!nodes[i].fence.is_fenced()).then(|| nodes[i].fence.t_valid());
        let may_send = t_valid.is_some_and(|t| now < t);
        // Detector: a peer silent for the peer window is dead.
        for j in 0..nodes.len() {
            if j == i {
                continue;
            }
            let silent = now.saturating_since(nodes[i].heard[j]) > det.timeout;
            let was = nodes[i].dead[j];
            nodes[i].dead[j] = silent;
            let peer = NodeId(j as u64 + 1);
            if silent != was {
                nodes[i].reporter.handle_sighting(if silent {
                    Sighting::PeerDead(peer)
                } else {
                    Sighting::PeerAlive(peer)
                });
            }
            if let Some(c) = nodes[i].cand.as_mut() {
                if silent && !was {
                    c.handle_peer_dead(peer);
                } else if !silent && was {
                    c.handle_peer_alive(peer);
                }
            }
        }
        // Inbox.
        while let Some((from, bytes)) = nodes[i].inbox.pop_front() {
            let from_id = NodeId(from as u64 + 1);
            let msg = match role::decode(&bytes) {
                Ok(m) => m,
                Err(_) => {
                    out.decode_errors += 1;
                    continue;
                }
            };
            match msg {
                row @ (RoleMessage::Table(_) | RoleMessage::TableRingDelta { .. }) => {
                    let (e, v) = nodes[i].apply(now, i, from_id, row, out);
                    if let Some(c) = nodes[i].cand.as_mut() {
                        c.handle_epoch(e);
                    }
                    if may_send {
                        let mut b = Vec::new();
                        role::encode(
                            &RoleMessage::Ack {
                                epoch: e,
                                version: v,
                            },
                            &mut b,
                        );
                        wire.push_back((now + DELAY, i, from, Some(b)));
                    }
                }
                RoleMessage::Report(r) => {
                    if let Some(s) = nodes[i].server.as_mut() {
                        let _ = s.handle_report(now, from_id, &r);
                    }
                    if let Some(c) = nodes[i].cand.as_mut() {
                        c.handle_epoch(r.held.0);
                    }
                }
                RoleMessage::HelperReport(r) => {
                    if let Some(s) = nodes[i].server.as_mut() {
                        let _ = s.handle_helper_report(now, from_id, &r);
                    }
                }
                RoleMessage::Ack { epoch, version } => {
                    if let Some(s) = nodes[i].server.as_mut() {
                        s.handle_ack(from_id, epoch, version);
                    }
                    if let Some(c) = nodes[i].cand.as_mut() {
                        c.handle_epoch(epoch);
                    }
                }
            }
        }
        // Candidacy (a fenced process does nothing more: it restarts).
        if let Some(c) = nodes[i].cand.as_mut().filter(|_| may_send) {
            if nodes[i].server.as_ref().is_some_and(RoleServer::is_stopped) {
                nodes[i].server = None;
                c.handle_server_stopped();
            }
            if let Some(CandidacyAction::TakeOver { epoch }) = c.poll(now) {
                if let Ok(s) = RoleServer::new(cfg.clone(), me, epoch, now) {
                    out.takeovers.push((now, i, epoch));
                    nodes[i].server = Some(s);
                    nodes[i].serving = Some((now, Vec::new()));
                }
            }
        }
        // Role server: refresh, then pushes (its own row applied locally).
        if let Some(mut s) = nodes[i].server.take() {
            if s.poll_timeout().is_some_and(|t| t <= now) {
                s.handle_timeout(now);
            }
            while let Some(p) = s.poll_push(now, t_valid) {
                out.pushes.push((now, i, p.view.epoch));
                let ring = p
                    .ring_delta
                    .as_ref()
                    .map_or_else(|| role::ring_digest(&p.view.ring), |d| d.digest);
                out.pushed_rings
                    .insert((me, p.view.epoch, p.view.version, ring));
                let to = (p.to.0 - 1) as usize;
                if to == i {
                    let (e, v) = nodes[i].apply(now, i, me, p.into_message(), out);
                    s.handle_ack(me, e, v);
                } else {
                    out.delta_rows += u64::from(p.ring_delta.is_some());
                    out.ring_change_rows +=
                        u64::from(p.ring_delta.as_ref().is_some_and(|d| !d.changes.is_empty()));
                    let mut b = Vec::new();
                    role::encode(&p.into_message(), &mut b);
                    wire.push_back((now + DELAY, i, to, Some(b)));
                }
            }
            while let Some(ev) = s.poll_event() {
                if let (RoleEvent::TableChanged { version }, Some((_, versions))) =
                    (ev, nodes[i].serving.as_mut())
                {
                    versions.push((now, version));
                }
            }
            nodes[i].server = Some(s);
        }
        // Report to every candidate: the serving one builds its matrix from
        // them, the others learn the current epoch (a restarted candidate
        // must not claim an old one) and keep a warm matrix.
        let held = nodes[i].gate.held();
        nodes[i].reporter.handle_held(held);
        let due = may_send
            .then(|| nodes[i].reporter.poll_report(now))
            .flatten();
        if let Some(report) = due {
            // The last node is a helper: with each report, its load
            // level, from a load that doubles and halves with time.
            let helper = (i + 1 == self.nodes).then(|| {
                let n = &mut nodes[i];
                n.helper_seq += 1;
                let step = now.saturating_since(Time::ZERO).as_millis() / 350;
                let rank = if self.helper_load_swings {
                    1u64 << (step % 12)
                } else {
                    1000
                };
                let level = n.leveler.level(rank);
                out.helper_levels.insert(level);
                HelperReport {
                    helper: me,
                    seq: n.helper_seq,
                    addr: helper_addr(),
                    level,
                }
            });
            for to in 0..self.candidates {
                if to == i {
                    if let Some(s) = nodes[i].server.as_mut() {
                        let _ = s.handle_report(now, me, &report);
                        if let Some(h) = &helper {
                            let _ = s.handle_helper_report(now, me, h);
                        }
                    }
                } else {
                    let mut b = Vec::new();
                    role::encode(&RoleMessage::Report(report.clone()), &mut b);
                    wire.push_back((now + DELAY, i, to, Some(b)));
                    if let Some(h) = &helper {
                        let mut b = Vec::new();
                        role::encode(&RoleMessage::HelperReport(*h), &mut b);
                        wire.push_back((now + DELAY, i, to, Some(b)));
                    }
                }
            }
        }
    }
}
