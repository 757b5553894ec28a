//! The role server at scale, on a virtual clock: N nodes × 2 networks
//! driving the product's [`RoleServer`], its codec ([`role::encode`],
//! [`role::decode`]) and every node's [`TableGate`], to measure what the
//! embedded role server costs and how fast a table reaches every node.
//!
//! # The model
//!
//! - **Nodes.** Node 0 hosts the role server (the first candidate, epoch
//!   1; its own report and row stay in the process). Every node sends its
//!   [`StatusReport`] every `refresh` (a seeded phase per node), listing
//!   only the unusual (a healthy peer is left out, as [`StatusReport`]
//!   prescribes), and acknowledges every row pushed to it with the
//!   `(epoch, version)` it then holds.
//! - **Network.** A fixed one-way delay; nothing is lost. Bytes are the
//!   role messages as the codec encodes them plus [`MESSAGE_OVERHEAD`]
//!   per message (the ROUTE_UPDATE frame header and the AEAD record of a
//!   message written alone); TCP/IP headers are not counted.
//! - **The server is one thread, serial.** When it wakes it handles every
//!   message that has arrived (decode + `handle_report` / `handle_ack`),
//!   its timer if due (`handle_timeout`), then takes every push
//!   (`poll_push`, which recomputes the table when it is dirty) and writes
//!   each one before looking at its inbox again. Each call costs the real
//!   time it took on this machine (measured around that call alone); each
//!   push also costs `send_overhead` plus its bytes at `link_bits_per_sec`
//!   (the write and the NIC). Messages arriving while it works wait.
//! - **A node** applies a row after the one-way delay plus the real time
//!   its decode and [`TableGate::apply`] took.
//! - **Faults** (the detector's windows from [`DetectorConfig`]): at
//!   `deaf.0` one node stops hearing anything on the last network; after
//!   the detector's path window it reports every peer down there (so
//!   every peer must avoid that network towards it); at `deaf.1` it hears
//!   again and, a heartbeat later, reports nothing. At `death` a node's
//!   process dies: after the path window every peer reports its paths
//!   down, after the peer window dead; its own reports stop (so it goes
//!   stale after `report_stale_after`).
//!
//! Everything is seeded and deterministic except the measured CPU times
//! (and, through them, the virtual times of the server's work).

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_proto::detector::DetectorConfig;
use surelink_proto::role::{
    self, MemberState, PathStatus, PeerReport, RoleConfig, RoleEvent, RoleMessage, RoleServer,
    StatusReport, TableGate,
};
use surelink_proto::{secure, wire, NodeId, Time};

/// Bytes a role message costs on the wire beyond its encoding when it is
/// written alone: the frame header and the AEAD record's header and tag.
pub const MESSAGE_OVERHEAD: usize = wire::HEADER_LEN + secure::RECORD_HEADER + secure::RECORD_TAG;

/// Width of the time buckets the figures are kept in.
pub const BUCKET: Duration = Duration::from_millis(100);

/// Buckets per second.
const PER_SECOND: usize = 10;

mod report;

use report::max_sum_u64;
pub use report::{quantile, CallCost, Change, Progress, ScaleReport, ServerCalls};

/// One scale run.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// Nodes (ids 1..=nodes; node index 0 hosts the role server).
    pub nodes: usize,
    /// Simulated time.
    pub run: Duration,
    /// The role service's settings (`nodes` and `candidates` are filled
    /// in by the run; `networks`, `refresh` and `report_stale_after` are
    /// used as given).
    pub role: RoleConfig,
    /// The detector's windows: when reports change after a fault.
    pub detector: DetectorConfig,
    /// One-way network delay.
    pub one_way_delay: Duration,
    /// Cost of writing one message on a session (the write call, the
    /// record's sealing set-up), on top of its measured encoding.
    pub send_overhead: Duration,
    /// The role server's link speed: each push's bytes take this long.
    pub link_bits_per_sec: u64,
    /// A node deaf on the last network from `.0` to `.1`.
    pub deaf: Option<(Duration, Duration)>,
    /// A node's process dies at this time.
    pub death: Option<Duration>,
    /// Seed of the report phases, the fault nodes and the detection jitter.
    pub seed: u64,
    /// Every row sent whole (the baseline: the protocol before ring
    /// deltas); `false`, the product: a node gets the ring as changes to
    /// the one it acknowledged.
    pub whole_rows: bool,
}

impl ScaleConfig {
    /// The product's defaults (`RoleConfig::default()`: refresh 100 ms,
    /// reports stale after 500 ms; `DetectorConfig::default()`: path
    /// window 50 ms, peer window 2 s), 10 s, a node deaf on network 1
    /// from 2 s to 5 s, a node dying at 6 s, 100 µs one-way, 5 µs per
    /// write, a 10 Gb/s link.
    pub fn new(nodes: usize) -> Self {
        ScaleConfig {
            nodes,
            run: Duration::from_secs(10),
            role: RoleConfig::default(),
            detector: DetectorConfig::default(),
            one_way_delay: Duration::from_micros(100),
            send_overhead: Duration::from_micros(5),
            link_bits_per_sec: 10_000_000_000,
            deaf: Some((Duration::from_secs(2), Duration::from_secs(5))),
            death: Some(Duration::from_secs(6)),
            seed: 14,
            whole_rows: false,
        }
    }

    fn role_config(&self) -> RoleConfig {
        RoleConfig {
            nodes: (1..=self.nodes as u64).map(NodeId).collect(),
            candidates: vec![NodeId(1)],
            ..self.role.clone()
        }
    }
}

/// What changes in a node's detector view.
#[derive(Clone, Copy, Debug)]
enum ViewChange {
    /// The node hears nobody on the last network.
    DeafOn,
    /// It hears again.
    DeafOff,
    /// The node's paths to `peer` are down on every network.
    PathsDown(usize),
    /// Its detector reports `peer` dead.
    Dead(usize),
}

#[derive(Debug)]
enum Ev {
    Report(usize),
    ToServer(usize, Input),
    ToNode(usize, Vec<u8>),
    ServerWake,
    View(usize, ViewChange),
    Die(usize),
}

#[derive(Debug)]
enum Input {
    Bytes(Vec<u8>),
    Local(StatusReport),
}

struct Queued {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        // Earliest first in a max-heap.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Node {
    gate: TableGate,
    alive: bool,
    seq: u64,
    view: HashMap<usize, PeerReport>,
    /// `(time, version)` of every table applied.
    applied: Vec<(Time, u64)>,
    avoided_deaf: bool,
}

struct Run {
    cfg: ScaleConfig,
    role: RoleConfig,
    rng: ChaCha8Rng,
    events: BinaryHeap<Queued>,
    seq: u64,
    nodes: Vec<Node>,
    server: RoleServer,
    inbox: VecDeque<(Time, usize, Input)>,
    free_at: Time,
    wakes: BTreeSet<Time>,
    out: ScaleReport,
    per_node_down: Vec<Vec<u64>>,
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let v = f();
    (v, start.elapsed())
}

fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

fn bucket(t: Time) -> usize {
    usize::try_from(t.as_nanos() / BUCKET.as_nanos() as u64).unwrap_or(usize::MAX)
}

fn add_at<T: std::ops::AddAssign + Copy>(v: &mut [T], t: Time, x: T) {
    if let Some(slot) = v.get_mut(bucket(t)) {
        *slot += x;
    }
}

impl Run {
    fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.events.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn wake(&mut self, at: Time) {
        if self.wakes.insert(at) {
            self.schedule(at, Ev::ServerWake);
        }
    }

    fn wire_time(&self, bytes: usize) -> Duration {
        let bits = (bytes as u128) * 8 * 1_000_000_000;
        let ns = bits / u128::from(self.cfg.link_bits_per_sec.max(1));
        self.cfg.send_overhead + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    fn report_of(&mut self, i: usize) -> StatusReport {
        let n = &mut self.nodes[i];
        n.seq += 1;
        let mut peers: Vec<PeerReport> = n.view.values().cloned().collect();
        peers.sort_by_key(|p| p.peer);
        StatusReport {
            reporter: NodeId(i as u64 + 1),
            seq: n.seq,
            watched: u32::try_from(self.cfg.nodes - 1).unwrap_or(u32::MAX),
            held: n.gate.held(),
            peers,
        }
    }

    fn on_report(&mut self, now: Time, i: usize) {
        if !self.nodes[i].alive {
            return;
        }
        let report = self.report_of(i);
        if i == 0 {
            self.on_server_input(now, 0, Input::Local(report));
        } else {
            let mut b = Vec::new();
            role::encode(&RoleMessage::Report(report), &mut b);
            add_at(&mut self.out.up, now, (b.len() + MESSAGE_OVERHEAD) as u64);
            let at = now + self.cfg.one_way_delay;
            self.schedule(at, Ev::ToServer(i, Input::Bytes(b)));
        }
        let next = now + self.role.refresh;
        self.schedule(next, Ev::Report(i));
    }

    fn on_server_input(&mut self, now: Time, from: usize, input: Input) {
        self.inbox.push_back((now, from, input));
        self.out.max_queue = self.out.max_queue.max(self.inbox.len());
        if self.free_at <= now {
            self.wake(now);
        }
    }

    /// Offers a pushed row to node `i`'s gate: the version applied, if
    /// any, and the `(epoch, version)` it then holds.
    fn apply(&mut self, i: usize, row: RoleMessage) -> (Option<u64>, (u64, u64)) {
        let (view, ring_delta) = match row {
            RoleMessage::Table(view) => (view, None),
            RoleMessage::TableRingDelta { view, ring } => (view, Some(ring)),
            _ => {
                self.out.decode_errors += 1;
                return (None, self.nodes[i].gate.held());
            }
        };
        let deaf = self.out.deaf_node;
        let last_net = self.role.networks.saturating_sub(1);
        let n = &mut self.nodes[i];
        let avoids = deaf.is_some_and(|d| {
            if d == i {
                !view.routes.is_empty() && view.routes.iter().all(|r| !r.usable(last_net))
            } else {
                !view.usable(NodeId(d as u64 + 1), last_net)
            }
        });
        let applied = match ring_delta {
            None => n.gate.apply(NodeId(1), view),
            Some(d) => n.gate.apply_ring_delta(NodeId(1), view, &d),
        };
        let applied = applied.ok().map(|a| a.version);
        if applied.is_some() {
            n.avoided_deaf |= avoids;
        }
        (applied, n.gate.held())
    }

    fn on_to_node(&mut self, now: Time, i: usize, bytes: Vec<u8>) {
        if !self.nodes[i].alive {
            return;
        }
        // The node's decode and apply take real time: they delay the
        // apply and the ack.
        let start = Instant::now();
        let Ok(row) = role::decode(&bytes) else {
            self.out.decode_errors += 1;
            return;
        };
        let (applied, (epoch, version)) = self.apply(i, row);
        let done = now + start.elapsed();
        if let Some(v) = applied {
            self.nodes[i].applied.push((done, v));
        }
        let mut b = Vec::new();
        role::encode(&RoleMessage::Ack { epoch, version }, &mut b);
        add_at(&mut self.out.up, done, (b.len() + MESSAGE_OVERHEAD) as u64);
        let at = done + self.cfg.one_way_delay;
        self.schedule(at, Ev::ToServer(i, Input::Bytes(b)));
    }

    fn spend(&mut self, s: &mut Time, cpu: Duration, extra: Duration) {
        add_at(&mut self.out.cpu, *s, cpu);
        add_at(&mut self.out.busy, *s, cpu + extra);
        *s += cpu + extra;
    }

    fn on_wake(&mut self, now: Time) {
        self.wakes.remove(&now);
        if now < self.free_at {
            return;
        }
        let mut s = now;
        let mut trigger: Option<Time> = None;
        let mut worked = false;
        let ready = self
            .inbox
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .count();
        for _ in 0..ready {
            let Some((at, from, input)) = self.inbox.pop_front() else {
                break;
            };
            worked = true;
            trigger = Some(trigger.map_or(at, |t| t.min(at)));
            self.out.max_queue_wait = self.out.max_queue_wait.max(s.saturating_since(at));
            let from_id = NodeId(from as u64 + 1);
            let server = &mut self.server;
            let (kind, cost) = match input {
                Input::Local(r) => {
                    let (_, d) = timed(|| server.handle_report(s, from_id, &r));
                    (0, d)
                }
                Input::Bytes(b) => {
                    let (kind, d) = timed(|| match role::decode(&b) {
                        Ok(RoleMessage::Report(r)) => {
                            let _ = server.handle_report(s, from_id, &r);
                            0
                        }
                        Ok(RoleMessage::Ack { epoch, version }) => {
                            server.handle_ack(from_id, epoch, version);
                            1
                        }
                        _ => 2,
                    });
                    (kind, d)
                }
            };
            match kind {
                0 => self.out.calls.report.add(cost),
                1 => self.out.calls.ack.add(cost),
                _ => self.out.decode_errors += 1,
            }
            self.spend(&mut s, cost, Duration::ZERO);
        }
        if let Some(due) = self.server.poll_timeout().filter(|t| *t <= s) {
            worked = true;
            trigger = Some(trigger.map_or(due, |t| t.min(due)));
            let server = &mut self.server;
            let ((), cost) = timed(|| server.handle_timeout(s));
            self.out.calls.timeout.add(cost);
            self.spend(&mut s, cost, Duration::ZERO);
        }
        if worked {
            self.push_all(&mut s, trigger.unwrap_or(now));
        }
        self.free_at = s;
        if worked {
            self.wake(s);
        }
        if let Some(t) = self.server.poll_timeout() {
            self.wake(t.max(s));
        }
    }

    fn push_all(&mut self, s: &mut Time, trigger: Time) {
        let mut first = true;
        let made = *s;
        loop {
            let server = &mut self.server;
            let now = *s;
            let (push, mut cost) = timed(|| {
                server.poll_push(now, Some(Time::MAX)).map(|p| {
                    let to = usize::try_from(p.to.0 - 1).unwrap_or(usize::MAX);
                    let msg = p.into_message();
                    if to == 0 {
                        (to, None, Some(msg))
                    } else {
                        let mut b = Vec::new();
                        role::encode(&msg, &mut b);
                        (to, Some(b), None)
                    }
                })
            });
            let Some((to, bytes, local)) = push else {
                if first {
                    self.out.calls.first_poll.add(cost);
                }
                self.spend(s, cost, Duration::ZERO);
                break;
            };
            let mut wire = Duration::ZERO;
            if let Some(view) = local {
                let start = Instant::now();
                let (applied, (e, v)) = self.apply(0, view);
                self.server.handle_ack(NodeId(1), e, v);
                cost += start.elapsed();
                if let Some(v) = applied {
                    self.nodes[0].applied.push((*s + cost, v));
                }
            }
            if let Some(b) = bytes {
                let len = b.len() + MESSAGE_OVERHEAD;
                wire = self.wire_time(len);
                let sent = *s + cost + wire;
                add_at(&mut self.out.down, sent, len as u64);
                if let Some(v) = self.per_node_down.get_mut(to) {
                    add_at(v, sent, len as u64);
                }
                let at = sent + self.cfg.one_way_delay;
                self.schedule(at, Ev::ToNode(to, b));
            }
            if first {
                self.out.calls.first_poll.add(cost);
                first = false;
            } else {
                self.out.calls.push.add(cost);
            }
            self.spend(s, cost, wire);
        }
        while let Some(ev) = self.server.poll_event() {
            if let RoleEvent::TableChanged { version } = ev {
                self.out.changes.push(Change {
                    version,
                    trigger,
                    made,
                    all_applied: None,
                });
            }
        }
    }

    fn on_view(&mut self, i: usize, change: ViewChange) {
        if !self.nodes[i].alive {
            return;
        }
        let nets = usize::from(self.role.networks);
        let rtt = u32::try_from(self.cfg.one_way_delay.as_micros() * 2).unwrap_or(u32::MAX);
        let down = |peer: usize, alive: bool| PeerReport {
            peer: NodeId(peer as u64 + 1),
            alive,
            networks: vec![(PathStatus::Down, 0); nets],
        };
        let n = self.nodes.len();
        let view = &mut self.nodes[i].view;
        match change {
            ViewChange::DeafOn => {
                for j in (0..n).filter(|j| *j != i) {
                    let mut networks = vec![(PathStatus::Up, rtt); nets];
                    if let Some(last) = networks.last_mut() {
                        *last = (PathStatus::Down, 0);
                    }
                    view.entry(j).or_insert(PeerReport {
                        peer: NodeId(j as u64 + 1),
                        alive: true,
                        networks,
                    });
                }
            }
            ViewChange::DeafOff => {
                view.retain(|_, r| r.networks.first().is_some_and(|x| x.0 != PathStatus::Up));
            }
            ViewChange::PathsDown(p) => {
                view.insert(p, down(p, true));
            }
            ViewChange::Dead(p) => {
                view.insert(p, down(p, false));
            }
        }
    }

    fn finish(&mut self) {
        let live: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].alive)
            .collect();
        self.out.final_version = self.server.table().version;
        self.out.live = live.len();
        self.out.holding_final = live
            .iter()
            .filter(|i| self.nodes[**i].gate.held().1 == self.out.final_version)
            .count();
        self.out.avoided_deaf = self.nodes.iter().filter(|n| n.avoided_deaf).count();
        if let Some(d) = self.out.dead_node {
            let id = NodeId(d as u64 + 1);
            self.out.saw_death = live
                .iter()
                .filter(|i| {
                    self.nodes[**i]
                        .gate
                        .current()
                        .and_then(|t| t.member(id))
                        .is_some_and(|s| s == MemberState::Down)
                })
                .count();
        }
        // When every node alive at the end held each version (the node
        // that dies is left out).
        for c in &mut self.out.changes {
            let mut all = Some(c.made);
            for i in &live {
                let first = self.nodes[*i]
                    .applied
                    .iter()
                    .find(|(_, v)| *v >= c.version)
                    .map(|(t, _)| *t);
                all = match (all, first) {
                    (Some(a), Some(t)) => Some(a.max(t)),
                    _ => None,
                };
            }
            c.all_applied = all;
        }
        self.out.busiest_node_down = self
            .per_node_down
            .iter()
            .map(|v| max_sum_u64(v, PER_SECOND))
            .max()
            .unwrap_or(0);
    }
}

/// Runs one scale scenario.
pub fn run(cfg: ScaleConfig) -> ScaleReport {
    run_with_progress(cfg, &mut |_| {})
}

/// [`run`], handing `progress` a line's worth once per simulated second.
///
/// # Panics
///
/// If `cfg` is not a valid role configuration (fewer than 2 nodes, a zero
/// refresh…).
#[allow(clippy::expect_used)]
pub fn run_with_progress(cfg: ScaleConfig, progress: &mut dyn FnMut(&Progress)) -> ScaleReport {
    let role = cfg.role_config();
    let mut server = RoleServer::new(role.clone(), NodeId(1), 1, Time::ZERO)
        .expect("a valid role configuration");
    if cfg.whole_rows {
        server.send_rows_whole();
    }
    let buckets = usize::try_from(cfg.run.as_nanos() / BUCKET.as_nanos()).unwrap_or(0) + 1;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let n = cfg.nodes;
    let pick = |rng: &mut ChaCha8Rng, not: Option<usize>| -> Option<usize> {
        (n > 2).then(|| loop {
            let i = rng.random_range(1..n);
            if Some(i) != not {
                break i;
            }
        })
    };
    let deaf_node = cfg.deaf.and_then(|_| pick(&mut rng, None));
    let dead_node = cfg.death.and_then(|_| pick(&mut rng, deaf_node));
    let nodes = (0..n)
        .map(|i| Node {
            gate: TableGate::new(role.clone(), NodeId(i as u64 + 1)),
            alive: true,
            seq: 0,
            view: HashMap::new(),
            applied: Vec::new(),
            avoided_deaf: false,
        })
        .collect();
    let mut r = Run {
        out: ScaleReport {
            nodes: n,
            simulated: cfg.run,
            cpu: vec![Duration::ZERO; buckets],
            busy: vec![Duration::ZERO; buckets],
            up: vec![0; buckets],
            down: vec![0; buckets],
            deaf_node,
            dead_node,
            ..ScaleReport::default()
        },
        per_node_down: vec![vec![0; buckets]; n],
        role,
        rng,
        events: BinaryHeap::new(),
        seq: 0,
        nodes,
        server,
        inbox: VecDeque::new(),
        free_at: Time::ZERO,
        wakes: BTreeSet::new(),
        cfg,
    };
    r.wake(Time::ZERO);
    let refresh_ns = u64::try_from(r.role.refresh.as_nanos()).unwrap_or(1).max(1);
    for i in 0..n {
        let phase = r.rng.random_range(0..refresh_ns);
        r.schedule(Time::from_nanos(phase), Ev::Report(i));
    }
    let det = r.cfg.detector.clone();
    let jitter = |rng: &mut ChaCha8Rng, d: Duration| {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(0).max(1);
        Duration::from_nanos(rng.random_range(0..ns))
    };
    if let (Some((on, off)), Some(d)) = (r.cfg.deaf, deaf_node) {
        let t_on = Time::ZERO + on + det.path_timeout + jitter(&mut r.rng, det.check_every);
        let t_off = Time::ZERO + off + jitter(&mut r.rng, det.interval);
        r.schedule(t_on, Ev::View(d, ViewChange::DeafOn));
        r.schedule(t_off, Ev::View(d, ViewChange::DeafOff));
    }
    if let (Some(at), Some(v)) = (r.cfg.death, dead_node) {
        r.schedule(Time::ZERO + at, Ev::Die(v));
        for j in (0..n).filter(|j| *j != v) {
            let paths = Time::ZERO + at + det.path_timeout + jitter(&mut r.rng, det.check_every);
            let dead = Time::ZERO + at + det.timeout + jitter(&mut r.rng, det.check_every);
            r.schedule(paths, Ev::View(j, ViewChange::PathsDown(v)));
            r.schedule(dead, Ev::View(j, ViewChange::Dead(v)));
        }
    }
    let end = Time::ZERO + r.cfg.run;
    let started = Instant::now();
    let cpu0 = thread_cpu();
    let mut next_progress = Time::ZERO + Duration::from_secs(1);
    while let Some(q) = r.events.pop() {
        if q.at >= end {
            break;
        }
        while q.at >= next_progress {
            progress(&Progress {
                simulated: next_progress.since_origin(),
                real: started.elapsed(),
                version: r.server.table().version,
                queued: r.inbox.len(),
            });
            next_progress += Duration::from_secs(1);
        }
        match q.ev {
            Ev::Report(i) => r.on_report(q.at, i),
            Ev::ToServer(from, input) => r.on_server_input(q.at, from, input),
            Ev::ToNode(to, b) => r.on_to_node(q.at, to, b),
            Ev::ServerWake => r.on_wake(q.at),
            Ev::View(i, c) => r.on_view(i, c),
            Ev::Die(i) => r.nodes[i].alive = false,
        }
    }
    r.out.wall = started.elapsed();
    r.out.thread_cpu = match (cpu0, thread_cpu()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    r.finish();
    r.out
}
