//! The simulator's state and event loop: N nodes (an endpoint each, on the
//! [`World`] fixture, plus what the simulated process holds around it),
//! the links between them, one queue of timed jobs on a virtual clock, and
//! the run that drains it and reports.
//!
//! The rest is by area: `node.rs` applies a job to a node (bytes in, paths
//! up and down, timers, the workload, the node's worker) and drains what
//! the node's endpoint wants to do; `network.rs` carries transmissions over
//! the seeded links (latency, jitter, loss, FIFO or not, the secure layer,
//! connection generations and reconnects); `inject.rs` applies the fault
//! schedule. The core's decisions are never made here: every byte goes
//! through [`surelink_proto::Endpoint`] on the fixture.

mod config;
mod helper;
mod inject;
mod network;
mod node;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_proto::rpc::{PriorityScheduler, Ticket};
use surelink_proto::{ClusterId, Endpoint, Epoch, LocalIdentity, NodeId, PathId, Time};

use crate::checker::Checker;
use crate::faults::Fault;
use crate::fixture::World;
use crate::secure::{ConnSec, Keys};

pub use config::{LinkSpec, SimConfig, SimReport, Workload};

/// What the simulated process holds around its endpoint (which lives in
/// the [`World`]).
#[derive(Debug)]
struct Node {
    incarnation: u32,
    paused_until: Time,
    /// Events held while paused, replayed in order on resume.
    inbox: VecDeque<Action>,
    resume_scheduled: bool,
    /// path -> (link, connection generation)
    paths: BTreeMap<PathId, (usize, u64)>,
    next_path: u64,
    wake_at: Option<Time>,
    /// Consecutive wake-ups at one instant (a timer livelock if large).
    spins: u32,
    last_wake: Time,
    /// Admitted requests waiting for the node's one worker.
    sched: PriorityScheduler<Ticket>,
    /// The worker is running a request.
    busy: bool,
}

#[derive(Debug)]
struct Conn {
    gen: u64,
    a_path: PathId,
    b_path: PathId,
    last_arrival: [Time; 2],
    /// The secure layer, when on.
    sec: Option<ConnSec>,
}

#[derive(Debug)]
struct Link {
    a: usize,
    b: usize,
    /// Direction up: [a->b, b->a].
    up: [bool; 2],
    /// Drop probability per direction: [a->b, b->a].
    loss: [f64; 2],
    conn: Option<Conn>,
    reconnect_pending: bool,
    /// Number of outstanding down faults per direction (overlapping faults).
    down_count: [u32; 2],
    loss_count: [u32; 2],
    /// The helper carrying this link's connections, if it has one.
    helper: Option<Box<helper::HelperModel>>,
}

#[derive(Clone, Debug)]
enum Action {
    Deliver {
        link: usize,
        gen: u64,
        dir: usize,
        bytes: Bytes,
    },
    AddPath {
        link: usize,
        gen: u64,
        path: PathId,
        dial: Option<NodeId>,
    },
    PathDown {
        path: PathId,
    },
    Wake,
    /// The workload's next send; stale generations (from before a restart) are dropped.
    AppTick(u32),
    /// The workload's next call.
    CallTick(u32),
    /// The worker finished a request (of incarnation `inc`).
    Complete(u32, Box<Ticket>),
}

#[derive(Debug)]
enum Job {
    Node(usize, Action),
    Resume(usize),
    Fault(Fault),
    FaultEnd(Fault),
    Reconnect(usize),
    Detect {
        link: usize,
        gen: u64,
    },
    /// The FIN of a connection one end closed reaches the other end.
    Retire {
        link: usize,
        gen: u64,
    },
    /// A secure connection still handshaking now is closed.
    HandshakeDeadline {
        link: usize,
        gen: u64,
    },
    /// A link's helper looks at what its batcher says is due.
    HelperFlush {
        link: usize,
        dir: usize,
    },
    /// A helper's batch reaches the far end of the link.
    HelperArrive {
        link: usize,
        gen: u64,
        dir: usize,
        msg: Bytes,
    },
}

/// The deterministic simulator.
pub struct Sim {
    cfg: SimConfig,
    /// The endpoints and the virtual clock.
    world: World,
    rng: ChaCha8Rng,
    nodes: Vec<Node>,
    links: Vec<Link>,
    queue: BinaryHeap<Reverse<(Time, u64)>>,
    jobs: BTreeMap<u64, Job>,
    seq: u64,
    next_gen: u64,
    ids: BTreeMap<NodeId, usize>,
    /// The promise checker.
    pub checker: Checker,
    refused_full: u64,
    resent: u64,
    peak_cache: u64,
    peak_recv: u64,
    faults_end: Duration,
    steps: u64,
    batches: u64,
    /// Every node's keys, when the secure layer is on.
    keys: Option<Keys>,
    handshakes: u64,
    handshakes_resumed: u64,
    handshakes_failed: u64,
    records_refused: u64,
}

fn node_id(i: usize) -> NodeId {
    NodeId(i as u64 + 1)
}

fn ms(t: Time) -> f64 {
    t.as_nanos() as f64 / 1e6
}

impl Sim {
    /// Builds the nodes and links and schedules the workload and `faults`.
    pub fn new(cfg: SimConfig, faults: &[Fault]) -> Self {
        let mut nodes = Vec::new();
        let mut endpoints = Vec::new();
        let mut ids = BTreeMap::new();
        for i in 0..cfg.nodes {
            endpoints.push(Self::endpoint(&cfg, i, 1));
            nodes.push(Node {
                incarnation: 1,
                paused_until: Time::ZERO,
                inbox: VecDeque::new(),
                resume_scheduled: false,
                paths: BTreeMap::new(),
                next_path: 1,
                wake_at: None,
                spins: 0,
                last_wake: Time::ZERO,
                sched: PriorityScheduler::new(Duration::from_millis(50)),
                busy: false,
            });
            ids.insert(node_id(i), i);
        }
        let mut links = Vec::new();
        for a in 0..cfg.nodes {
            for b in a + 1..cfg.nodes {
                for _ in 0..cfg.paths {
                    links.push(Link {
                        a,
                        b,
                        up: [true, true],
                        loss: [0.0; 2],
                        conn: None,
                        reconnect_pending: false,
                        down_count: [0, 0],
                        loss_count: [0; 2],
                        helper: cfg.helper_links.contains(&links.len()).then(|| {
                            Box::new(helper::HelperModel::new(cfg.helper_batching.clone()))
                        }),
                    });
                }
            }
        }
        let keys = cfg.secure.map(|p| {
            let ids: Vec<NodeId> = (0..cfg.nodes).map(node_id).collect();
            Keys::new(&ids, cfg.seed, ClusterId(42), p, cfg.tls)
        });
        let mut world = World::new(endpoints, Time::ZERO);
        world.budget = cfg.transmit_budget;
        // Each node's events go to the checker as they come.
        world.collect_events = false;
        let mut sim = Sim {
            keys,
            handshakes: 0,
            handshakes_resumed: 0,
            handshakes_failed: 0,
            records_refused: 0,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            world,
            nodes,
            links,
            queue: BinaryHeap::new(),
            jobs: BTreeMap::new(),
            seq: 0,
            next_gen: 1,
            ids,
            checker: Checker::default(),
            refused_full: 0,
            resent: 0,
            peak_cache: 0,
            peak_recv: 0,
            faults_end: Duration::ZERO,
            steps: 0,
            batches: 0,
        };
        for l in 0..sim.links.len() {
            sim.schedule(Time::ZERO, Job::Reconnect(l));
            sim.links[l].reconnect_pending = true;
        }
        for n in 0..sim.nodes.len() {
            let jitter = Duration::from_micros(sim.rng.random_range(0..1000));
            sim.schedule(Time::ZERO + jitter, Job::Node(n, Action::AppTick(1)));
            if sim.cfg.workload.call_every.is_some() {
                let jitter = Duration::from_micros(sim.rng.random_range(0..1000));
                sim.schedule(Time::ZERO + jitter, Job::Node(n, Action::CallTick(1)));
            }
        }
        for f in faults {
            let f = f.clone();
            if f.end() > sim.faults_end {
                sim.faults_end = f.end();
            }
            let valid = match &f {
                Fault::LinkDown { link, .. }
                | Fault::OneWay { link, .. }
                | Fault::Loss { link, .. }
                | Fault::Reset { link, .. } => *link < sim.links.len(),
                Fault::HelperPause { link, .. } | Fault::HelperCrash { link, .. } => {
                    sim.links.get(*link).is_some_and(|l| l.helper.is_some())
                }
                Fault::Pause { node, .. } | Fault::Restart { node, .. } => *node < sim.nodes.len(),
            };
            if valid {
                sim.schedule(Time::ZERO + f.at(), Job::Fault(f));
            }
        }
        sim
    }

    fn endpoint(cfg: &SimConfig, i: usize, incarnation: u32) -> Endpoint {
        let local = LocalIdentity {
            cluster: ClusterId(42),
            node: node_id(i),
            epoch: Epoch(u64::from(incarnation)),
        };
        Endpoint::new(cfg.endpoint.clone(), local).expect("simulator endpoint config is valid")
    }

    /// Number of links (`nodes*(nodes-1)/2 * paths`).
    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.world.now
    }

    fn schedule(&mut self, at: Time, job: Job) {
        let seq = self.seq;
        self.seq += 1;
        self.jobs.insert(seq, job);
        self.queue.push(Reverse((at.max(self.world.now), seq)));
    }

    /// Processes the next event; returns false when nothing is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, seq))) = self.queue.pop() else {
            return false;
        };
        let Some(job) = self.jobs.remove(&seq) else {
            return true;
        };
        self.world.now = at;
        self.steps += 1;
        match job {
            Job::Node(n, action) => self.node_action(n, action),
            Job::Resume(n) => self.resume(n),
            Job::Fault(f) => self.fault(f),
            Job::FaultEnd(f) => self.fault_end(f),
            Job::Reconnect(l) => self.reconnect(l),
            Job::Detect { link, gen } => self.detect(link, gen),
            Job::HandshakeDeadline { link, gen } => {
                let unfinished = self.links[link].conn.as_ref().is_some_and(|c| {
                    c.gen == gen
                        && c.sec
                            .as_ref()
                            .is_some_and(|s| !(s.established(0) && s.established(1)))
                });
                if unfinished {
                    self.handshakes_failed += 1;
                    self.drop_conn(link, gen);
                }
            }
            Job::HelperFlush { link, dir } => self.helper_flush(link, dir),
            Job::HelperArrive {
                link,
                gen,
                dir,
                msg,
            } => self.helper_arrive(link, gen, dir, msg),
            Job::Retire { link, gen } => {
                let l = &mut self.links[link];
                if l.conn.as_ref().is_some_and(|c| c.gen == gen) {
                    l.conn = None;
                }
                self.schedule_reconnect(link);
            }
        }
        true
    }

    /// Runs until virtual time `until` (or the queue empties).
    pub fn run_until(&mut self, until: Duration) {
        let until = Time::ZERO + until;
        while let Some(Reverse((at, _))) = self.queue.peek() {
            if *at > until {
                break;
            }
            self.step();
        }
        self.world.now = self.world.now.max(until);
    }

    /// Runs the workload and faults, then keeps going until every message is
    /// delivered or reported, or `drain_limit` after the later of the last
    /// fault and the end of the workload. Returns the report.
    pub fn run(mut self, drain_limit: Duration) -> SimReport {
        let quiet = self.faults_end.max(self.cfg.workload.until);
        self.run_until(quiet);
        let deadline = quiet + drain_limit;
        let mut drained_at = None;
        loop {
            if self.checker.pending() == 0 && self.checker.calls_pending() == 0 {
                drained_at = Some(self.world.now.since_origin());
                break;
            }
            // Past the bound, or nothing left that could ever change it.
            if self.world.now.since_origin() > deadline || self.queue.is_empty() {
                break;
            }
            // Advance in small slices so the pending check is timely.
            let next = self.world.now.since_origin() + Duration::from_millis(1);
            self.run_until(next);
        }
        self.finish(drained_at, quiet, drain_limit)
    }

    fn finish(
        mut self,
        drained_at: Option<Duration>,
        quiet: Duration,
        drain_limit: Duration,
    ) -> SimReport {
        if drained_at.is_none() && std::env::var_os("SIM_TRACE").is_some() {
            for n in 0..self.nodes.len() {
                for m in 0..self.nodes.len() {
                    if n != m {
                        eprintln!(
                            "node {n} -> {m}: {}",
                            self.world[n].debug_session(node_id(m))
                        );
                    }
                }
            }
        }
        if drained_at.is_none() {
            let pending = self.checker.pending();
            let calls = self.checker.calls_pending();
            let sample = self.checker.describe_pending(5).join("; ");
            self.checker.violations.push(format!(
                "{pending} messages neither delivered nor reported and {calls} calls neither answered nor failed {:?} after the faults and load stopped at {:?} (e.g. {sample})",
                drain_limit, quiet
            ));
        }
        for n in 0..self.nodes.len() {
            let peers: Vec<NodeId> = {
                let mut v: Vec<NodeId> = self.world[n].peers().collect();
                v.sort();
                v
            };
            for p in peers {
                if let Some(s) = self.world[n].session_stats(p) {
                    self.resent += s.resent;
                    self.batches += s.batches_sent;
                }
            }
        }
        SimReport {
            tally: self.checker.tally(),
            calls: self.checker.call_tally(),
            violations: std::mem::take(&mut self.checker.violations),
            drained_at,
            faults_end: self.faults_end,
            refused_full: self.refused_full,
            resent: self.resent,
            batches: self.batches,
            peak_cache: self.peak_cache,
            peak_recv: self.peak_recv,
            latencies: self.checker.latencies.take().unwrap_or_default(),
            steps: self.steps,
            handshakes: self.handshakes,
            handshakes_resumed: self.handshakes_resumed,
            handshakes_failed: self.handshakes_failed,
            records_refused: self.records_refused,
            helper_batches: self
                .links
                .iter()
                .filter_map(|l| l.helper.as_ref())
                .map(|h| h.batches)
                .sum(),
            helper_records: self
                .links
                .iter()
                .filter_map(|l| l.helper.as_ref())
                .map(|h| h.records)
                .sum(),
        }
    }

    /// Records the latency of every delivery in the report.
    pub fn record_latencies(&mut self) {
        self.checker.latencies = Some(Vec::new());
    }

    /// Access to a node's endpoint (for tests).
    pub fn endpoint_of(&self, n: usize) -> &Endpoint {
        &self.world[n]
    }
}
