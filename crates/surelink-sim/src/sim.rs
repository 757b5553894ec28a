//! The simulator: endpoints, links, a virtual clock, and the event loop.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_proto::{
    ChannelId, ClusterId, Endpoint, EndpointConfig, Epoch, Event, LocalIdentity, NodeId, PathId,
    SendError, Time,
};

use surelink_proto::rpc::{CallOptions, PriorityScheduler, Scheduler, Ticket, TicketKey};

use surelink_proto::secure::Protection;

use crate::checker::{make_payload, Checker, Tally};
use crate::faults::Fault;
use crate::secure::{ConnSec, Keys};

/// Link behaviour in the absence of faults.
#[derive(Clone, Debug)]
pub struct LinkSpec {
    /// One-way latency.
    pub latency: Duration,
    /// Extra random delay in `[0, jitter)` per transmission.
    pub jitter: Duration,
    /// Keep each direction first-in first-out, like a TCP stream. When false,
    /// jitter may reorder transmissions within a connection.
    pub fifo: bool,
}

/// The application load each node offers.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Each node sends one message every `interval` to a random peer.
    pub interval: Duration,
    /// Sending stops at this time.
    pub until: Duration,
    /// Channels used, `0..channels`.
    pub channels: u16,
    /// Payload lengths are drawn from `[8, max_len]`.
    pub max_len: usize,
    /// Messages sent back to back per tick (to the same peer and channel):
    /// above 1, they queue behind each other and leave as BATCH frames.
    pub burst: usize,
    /// Each node also calls a random peer this often (`None`: no calls).
    /// Every node serves: admitted requests go through the product's
    /// `PriorityScheduler` to one worker per node.
    pub call_every: Option<std::time::Duration>,
    /// Each request takes this long to run.
    pub service: std::time::Duration,
    /// Calls fail with a timeout after this long.
    pub call_timeout: std::time::Duration,
}

/// A simulation's setup.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Number of endpoints.
    pub nodes: usize,
    /// Paths (links) between each pair of nodes.
    pub paths: usize,
    /// Seeds every random choice.
    pub seed: u64,
    /// Configuration of every endpoint.
    pub endpoint: EndpointConfig,
    /// Per-link latency and jitter.
    pub link: LinkSpec,
    /// How long after a link goes silent both ends are told its transport
    /// failed (models the failure detector). `None`: never; only the core's
    /// retransmission timeout reacts.
    pub detect_after: Option<Duration>,
    /// Delay between connection attempts on a link without a connection.
    pub reconnect_after: Duration,
    /// Bytes per `poll_transmit` call.
    pub transmit_budget: usize,
    /// The offered load.
    pub workload: Workload,
    /// Run every connection through the secure layer (handshake, then
    /// records) with this protection; `None`: plaintext, as `insecure = true`.
    /// Needs FIFO links (records must arrive in order, as on TCP).
    pub secure: Option<Protection>,
    /// With `secure`: mutual TLS with certificates from one simulated CA
    /// instead of Noise with member keys.
    pub tls: bool,
}

impl SimConfig {
    /// A small, fast setup suited to property tests.
    pub fn small(seed: u64) -> Self {
        SimConfig {
            nodes: 2,
            paths: 2,
            seed,
            endpoint: {
                let mut e = EndpointConfig::default();
                e.min_rto = Duration::from_millis(40);
                e.max_rto = Duration::from_millis(500);
                e.handshake_retry = Duration::from_millis(50);
                e.handshake_timeout = Duration::from_secs(2);
                e.linger = Duration::from_secs(10);
                e.send_buffer = 256 << 10;
                e.recv_window = 256 << 10;
                e.max_message_size = 16 << 10;
                e.path_inflight_limit = 128 << 10;
                e.max_channels = 8;
                e.batch_bytes = 4 << 10;
                e.batch_message_max = 1 << 10;
                e
            },
            link: LinkSpec {
                latency: Duration::from_micros(200),
                jitter: Duration::from_micros(300),
                fifo: true,
            },
            detect_after: Some(Duration::from_millis(30)),
            reconnect_after: Duration::from_millis(20),
            transmit_budget: 16 << 10,
            workload: Workload {
                interval: Duration::from_millis(2),
                until: Duration::from_secs(2),
                channels: 3,
                max_len: 600,
                burst: 1,
                call_every: None,
                service: Duration::from_micros(300),
                call_timeout: Duration::from_secs(2),
            },
            secure: None,
            tls: false,
        }
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// Outcome counts.
    pub tally: Tally,
    /// Broken promises (empty on success).
    pub violations: Vec<String>,
    /// Virtual time when the last pending message was delivered or reported.
    pub drained_at: Option<Duration>,
    /// When the last fault ended.
    pub faults_end: Duration,
    /// `send` calls refused with `Full` (backpressure, not loss).
    pub refused_full: u64,
    /// Frames re-sent, summed over the sessions alive at the end.
    pub resent: u64,
    /// BATCH frames sent, summed over the sessions alive at the end.
    pub batches: u64,
    /// Largest send cache and receive buffer seen in any session, in bytes.
    pub peak_cache: u64,
    /// Largest receive-side buffer seen.
    pub peak_recv: u64,
    /// `(sent at, latency)` in virtual ms per delivery, when recording.
    pub latencies: Vec<(f64, f64)>,
    /// Call outcome counts.
    pub calls: crate::checker::CallTally,
    /// Events processed.
    pub steps: u64,
    /// Secure layer: handshakes completed (both ends), failed, and
    /// connections closed for a refused record.
    pub handshakes: u64,
    /// Handshakes that failed or timed out.
    pub handshakes_failed: u64,
    /// Connections closed because a record failed its tag.
    pub records_refused: u64,
}

impl SimReport {
    /// Whether every promise held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

#[derive(Debug)]
struct Node {
    ep: Endpoint,
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
}

/// The deterministic simulator.
pub struct Sim {
    cfg: SimConfig,
    now: Time,
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
    buf: BytesMut,
    batches: u64,
    /// Every node's keys, when the secure layer is on.
    keys: Option<Keys>,
    handshakes: u64,
    handshakes_failed: u64,
    records_refused: u64,
}

fn node_id(i: usize) -> NodeId {
    NodeId(i as u64 + 1)
}

fn loss_dirs(one_way: Option<bool>) -> &'static [usize] {
    match one_way {
        Some(true) => &[0],
        Some(false) => &[1],
        None => &[0, 1],
    }
}

fn ms(t: Time) -> f64 {
    t.as_nanos() as f64 / 1e6
}

impl Sim {
    /// Builds the nodes and links and schedules the workload and `faults`.
    pub fn new(cfg: SimConfig, faults: &[Fault]) -> Self {
        let mut nodes = Vec::new();
        let mut ids = BTreeMap::new();
        for i in 0..cfg.nodes {
            nodes.push(Node {
                ep: Self::endpoint(&cfg, i, 1),
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
                    });
                }
            }
        }
        let keys = cfg.secure.map(|p| {
            let ids: Vec<NodeId> = (0..cfg.nodes).map(node_id).collect();
            Keys::new(&ids, cfg.seed, ClusterId(42), p, cfg.tls)
        });
        let mut sim = Sim {
            keys,
            handshakes: 0,
            handshakes_failed: 0,
            records_refused: 0,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            now: Time::ZERO,
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
            buf: BytesMut::new(),
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
        self.now
    }

    fn schedule(&mut self, at: Time, job: Job) {
        let seq = self.seq;
        self.seq += 1;
        self.jobs.insert(seq, job);
        self.queue.push(Reverse((at.max(self.now), seq)));
    }

    /// Processes the next event; returns false when nothing is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, seq))) = self.queue.pop() else {
            return false;
        };
        let Some(job) = self.jobs.remove(&seq) else {
            return true;
        };
        self.now = at;
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
        self.now = self.now.max(until);
    }

    fn node_action(&mut self, n: usize, action: Action) {
        let node = &mut self.nodes[n];
        if self.now < node.paused_until || !node.inbox.is_empty() {
            node.inbox.push_back(action);
            if !node.resume_scheduled {
                node.resume_scheduled = true;
                let at = node.paused_until;
                self.schedule(at, Job::Resume(n));
            }
            return;
        }
        self.apply(n, action);
        self.service(n);
    }

    fn resume(&mut self, n: usize) {
        self.nodes[n].resume_scheduled = false;
        if self.now < self.nodes[n].paused_until {
            self.nodes[n].resume_scheduled = true;
            let at = self.nodes[n].paused_until;
            self.schedule(at, Job::Resume(n));
            return;
        }
        while let Some(a) = self.nodes[n].inbox.pop_front() {
            self.apply(n, a);
        }
        // Timers that expired during the pause fire now.
        self.nodes[n].wake_at = None;
        let now = self.now;
        self.nodes[n].ep.handle_timeout(now);
        self.service(n);
    }

    fn apply(&mut self, n: usize, action: Action) {
        let now = self.now;
        match action {
            Action::Deliver {
                link,
                gen,
                dir,
                bytes,
            } => {
                let Some(c) = self.links[link].conn.as_mut().filter(|c| c.gen == gen) else {
                    return; // connection gone
                };
                let path = if dir == 0 { c.b_path } else { c.a_path };
                let mut buf = match &mut c.sec {
                    None => BytesMut::from(&bytes[..]),
                    Some(sec) => {
                        // The receiving side is the one the bytes travel to.
                        let side = 1 - dir;
                        match sec.receive(side, &bytes) {
                            Ok(r) => {
                                if let Some(reply) = r.reply {
                                    self.send_on(link, gen, side, reply);
                                }
                                if r.established {
                                    self.handshakes += 1;
                                    let l = &self.links[link];
                                    let dial = (side == 0).then(|| node_id(l.b));
                                    self.apply(
                                        n,
                                        Action::AddPath {
                                            link,
                                            gen,
                                            path,
                                            dial,
                                        },
                                    );
                                }
                                r.plaintext
                            }
                            Err(e) => {
                                if std::env::var_os("SIM_TRACE").is_some() {
                                    eprintln!("t={:.3}ms node {n}: link {link}: {e}", ms(now));
                                }
                                match e {
                                    crate::secure::Broken::Handshake(_) => {
                                        self.handshakes_failed += 1;
                                    }
                                    crate::secure::Broken::Record(_) => self.records_refused += 1,
                                }
                                self.drop_conn(link, gen);
                                return;
                            }
                        }
                    }
                };
                if buf.is_empty() || !self.nodes[n].paths.contains_key(&path) {
                    return; // nothing for the core, or this end already closed it
                }
                // On error the core queues a CLOSE and reports PathClosed, after
                // which `service` closes the transport.
                let _ = self.nodes[n].ep.handle_input(now, path, &mut buf);
            }
            Action::AddPath {
                link,
                gen,
                path,
                dial,
            } => {
                if !matches!(&self.links[link].conn, Some(c) if c.gen == gen) {
                    return;
                }
                self.nodes[n].paths.insert(path, (link, gen));
                if self.nodes[n].ep.add_path(now, path, dial).is_err() {
                    self.drop_conn(link, gen);
                }
            }
            Action::PathDown { path } => {
                self.nodes[n].paths.remove(&path);
                self.nodes[n].ep.handle_path_down(now, path);
            }
            Action::Wake => {
                let node = &mut self.nodes[n];
                if node.wake_at.is_some_and(|t| t <= now) {
                    node.wake_at = None;
                    if node.last_wake == now {
                        node.spins += 1;
                        if node.spins == 10_000 {
                            self.checker.violations.push(format!(
                                "t={:.3}ms: node {n} timer livelock (wakes at one instant)",
                                ms(now)
                            ));
                        }
                    } else {
                        node.spins = 0;
                        node.last_wake = now;
                    }
                    if node.spins < 10_000 {
                        node.ep.handle_timeout(now);
                    }
                }
            }
            Action::AppTick(inc) => {
                if inc != self.nodes[n].incarnation {
                    return;
                }
                self.app_send(n);
                let w = &self.cfg.workload;
                if now.since_origin() + w.interval < w.until {
                    let at = now + w.interval;
                    self.schedule(at, Job::Node(n, Action::AppTick(inc)));
                }
            }
            Action::CallTick(inc) => {
                if inc != self.nodes[n].incarnation {
                    return;
                }
                self.app_call(n);
                let w = &self.cfg.workload;
                if let Some(every) = w.call_every {
                    if now.since_origin() + every < w.until {
                        self.schedule(now + every, Job::Node(n, Action::CallTick(inc)));
                    }
                }
            }
            Action::Complete(inc, t) => {
                let node = &mut self.nodes[n];
                if inc != node.incarnation {
                    return; // the process that ran it is gone
                }
                node.busy = false;
                let reply = crate::checker::answer(&t.body);
                // Refused if the session ended meanwhile: the caller learns
                // that from its own side.
                let _ = node.ep.complete(now, t.session, t.call, Ok(reply));
            }
        }
    }

    /// A random node other than `n` (none in a one-node run).
    fn other_node(&mut self, n: usize) -> Option<usize> {
        if self.cfg.nodes < 2 {
            return None;
        }
        let dst = self.rng.random_range(0..self.cfg.nodes - 1);
        Some(if dst >= n { dst + 1 } else { dst })
    }

    fn app_call(&mut self, n: usize) {
        let Some(dst) = self.other_node(n) else {
            return;
        };
        let channel = ChannelId(self.rng.random_range(0..self.cfg.workload.channels.max(1)));
        let len = self
            .rng
            .random_range(8..=self.cfg.workload.max_len.clamp(8, 256));
        let uid = self.checker.next_call_uid();
        let body = make_payload(uid, len);
        let now = self.now;
        let opts = CallOptions::new(self.cfg.workload.call_timeout);
        let node = &mut self.nodes[n];
        match node.ep.call(now, node_id(dst), channel, body, &opts) {
            Ok((session, call)) => {
                let inc = node.incarnation;
                self.checker
                    .call_started(ms(now), uid, n, inc, dst, session, call, len);
            }
            Err(SendError::Full { .. }) => self.refused_full += 1,
            Err(e) => self
                .checker
                .violations
                .push(format!("node {n}: call refused: {e}")),
        }
    }

    fn app_send(&mut self, n: usize) {
        let Some(dst) = self.other_node(n) else {
            return;
        };
        let channel = ChannelId(self.rng.random_range(0..self.cfg.workload.channels.max(1)));
        for _ in 0..self.cfg.workload.burst.max(1) {
            let len = self.rng.random_range(8..=self.cfg.workload.max_len.max(8));
            let uid = self.checker.next_uid();
            let payload = make_payload(uid, len);
            let now = self.now;
            let node = &mut self.nodes[n];
            match node.ep.send(now, node_id(dst), channel, payload) {
                Ok(id) => {
                    let inc = node.incarnation;
                    self.checker.sent(ms(now), uid, n, inc, dst, id, len);
                }
                Err(SendError::Full { .. }) => self.refused_full += 1,
                Err(e) => self
                    .checker
                    .violations
                    .push(format!("node {n}: send failed: {e}")),
            }
        }
    }

    /// Drains a node's outputs: transmissions, events, and its timer.
    fn service(&mut self, n: usize) {
        let now = self.now;
        for round in 0.. {
            if round == 1_000_000 {
                self.checker.violations.push(format!(
                    "t={:.3}ms: node {n} poll_transmit never returns None",
                    ms(now)
                ));
                break;
            }
            self.buf.clear();
            let budget = self.cfg.transmit_budget;
            let Some(path) = self.nodes[n].ep.poll_transmit(now, &mut self.buf, budget) else {
                break;
            };
            let bytes = self.buf.split().freeze();
            self.transmit(n, path, bytes);
        }
        while let Some(ev) = self.nodes[n].ep.poll_event() {
            let inc = self.nodes[n].incarnation;
            if std::env::var_os("SIM_TRACE").is_some() && !matches!(ev, Event::Message { .. }) {
                eprintln!("t={:.3}ms node {n}.{inc}: {ev:?}", ms(now));
            }
            self.checker.event(ms(now), n, inc, &ev, &self.ids);
            match ev {
                Event::PathClosed { path, .. } => {
                    // The core is done with the path; close the transport.
                    if let Some((link, gen)) = self.nodes[n].paths.remove(&path) {
                        self.close_conn_from(n, link, gen);
                    }
                }
                Event::Request(t) => {
                    let key = TicketKey {
                        session: t.session.0,
                        call: t.call,
                    };
                    let prio = t.priority;
                    self.nodes[n].sched.push(now, key, prio, t);
                }
                Event::Promote { session, call, .. } => {
                    self.nodes[n].sched.promote(TicketKey {
                        session: session.0,
                        call,
                    });
                }
                Event::SessionEnded { session, .. } => {
                    self.nodes[n].sched.remove_session(session.0);
                }
                _ => {}
            }
        }
        // The node's one worker takes the next request.
        if !self.nodes[n].busy {
            if let Some(d) = self.nodes[n].sched.pop(now) {
                let inc = self.nodes[n].incarnation;
                self.checker.executed(ms(now), n, &d.item.body);
                self.nodes[n].busy = true;
                let at = now + self.cfg.workload.service;
                self.schedule(at, Job::Node(n, Action::Complete(inc, Box::new(d.item))));
            }
        }
        // Memory bounds, checked after every step.
        for (peer, cache, recv) in self.nodes[n].ep.session_buffers() {
            self.peak_cache = self.peak_cache.max(cache);
            self.peak_recv = self.peak_recv.max(recv);
            if cache > self.cfg.endpoint.send_buffer
                || recv > u64::from(self.cfg.endpoint.recv_window)
            {
                self.checker.violations.push(format!(
                    "t={:.3}ms: node {n} session with {peer}: cache {cache} / recv {recv} bytes over the bound",
                    ms(now)
                ));
            }
        }
        if let Some(t) = self.nodes[n].ep.poll_timeout() {
            let node = &mut self.nodes[n];
            if node.wake_at.is_none_or(|w| t < w) {
                node.wake_at = Some(t);
                self.schedule(t, Job::Node(n, Action::Wake));
            }
        }
    }

    fn transmit(&mut self, n: usize, path: PathId, mut bytes: Bytes) {
        let Some(&(link, gen)) = self.nodes[n].paths.get(&path) else {
            return;
        };
        let l = &mut self.links[link];
        let dir = if n == l.a { 0 } else { 1 };
        let Some(conn) = l.conn.as_mut().filter(|c| c.gen == gen) else {
            return;
        };
        if let Some(sec) = &mut conn.sec {
            // Sealed before the network may lose it: a lost record breaks
            // the stream, as a deleted byte would.
            match sec.seal(dir, &bytes) {
                Ok(sealed) => bytes = sealed,
                Err(_) => {
                    self.drop_conn(link, gen);
                    return;
                }
            }
        }
        self.send_on(link, gen, dir, bytes);
    }

    /// Puts `bytes` on connection `gen` of `link` in direction `dir`
    /// (0: a to b), subject to the link's state, loss and latency.
    fn send_on(&mut self, link: usize, gen: u64, dir: usize, bytes: Bytes) {
        let l = &self.links[link];
        if l.conn.as_ref().is_none_or(|c| c.gen != gen) {
            return;
        }
        if !l.up[dir] || (l.loss[dir] > 0.0 && self.rng.random_bool(l.loss[dir])) {
            return;
        }
        let spec = &self.cfg.link;
        let jitter = if spec.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.rng.random_range(0..spec.jitter.as_nanos() as u64))
        };
        let mut at = self.now + spec.latency + jitter;
        let l = &mut self.links[link];
        let to = if dir == 0 { l.b } else { l.a };
        if let Some(conn) = &mut l.conn {
            if spec.fifo {
                at = at.max(conn.last_arrival[dir]);
            }
            // Tracked in both modes: a FIN never overtakes data.
            conn.last_arrival[dir] = conn.last_arrival[dir].max(at);
        }
        self.schedule(
            at,
            Job::Node(
                to,
                Action::Deliver {
                    link,
                    gen,
                    dir,
                    bytes,
                },
            ),
        );
    }

    fn reconnect(&mut self, link: usize) {
        let l = &mut self.links[link];
        l.reconnect_pending = false;
        if l.conn.is_some() {
            return;
        }
        if !(l.up[0] && l.up[1]) {
            l.reconnect_pending = true;
            let at = self.now + self.cfg.reconnect_after;
            self.schedule(at, Job::Reconnect(link));
            return;
        }
        let gen = self.next_gen;
        self.next_gen += 1;
        let (a, b) = (l.a, l.b);
        let a_path = PathId(self.nodes[a].next_path);
        self.nodes[a].next_path += 1;
        let b_path = PathId(self.nodes[b].next_path);
        self.nodes[b].next_path += 1;
        let now = self.now;
        if let Some(keys) = &self.keys {
            // Secure: the handshake first; each end adds its path when its
            // side of the handshake finishes (see `apply`'s `Deliver`).
            let (sec, first) = ConnSec::dial(keys, a, b, node_id(b));
            self.links[link].conn = Some(Conn {
                gen,
                a_path,
                b_path,
                last_arrival: [Time::ZERO; 2],
                sec: Some(sec),
            });
            self.send_on(link, gen, 0, first);
            let deadline = now + self.cfg.endpoint.handshake_timeout;
            self.schedule(deadline, Job::HandshakeDeadline { link, gen });
            return;
        }
        self.links[link].conn = Some(Conn {
            gen,
            a_path,
            b_path,
            last_arrival: [Time::ZERO; 2],
            sec: None,
        });
        // The lower-numbered node dials; the other accepts.
        self.schedule(
            now,
            Job::Node(
                a,
                Action::AddPath {
                    link,
                    gen,
                    path: a_path,
                    dial: Some(node_id(b)),
                },
            ),
        );
        self.schedule(
            now,
            Job::Node(
                b,
                Action::AddPath {
                    link,
                    gen,
                    path: b_path,
                    dial: None,
                },
            ),
        );
    }

    /// Both ends learn the connection is gone; a new one is dialled later.
    fn drop_conn(&mut self, link: usize, gen: u64) {
        let l = &mut self.links[link];
        let Some(conn) = l.conn.take_if(|c| c.gen == gen) else {
            return;
        };
        let (a, b) = (l.a, l.b);
        let now = self.now;
        self.schedule(now, Job::Node(a, Action::PathDown { path: conn.a_path }));
        self.schedule(now, Job::Node(b, Action::PathDown { path: conn.b_path }));
        self.schedule_reconnect(link);
    }

    /// Node `n` closed its end; the other end notices after the bytes
    /// already sent (the FIN follows them), and the connection retires then.
    fn close_conn_from(&mut self, n: usize, link: usize, gen: u64) {
        let l = &self.links[link];
        let Some(conn) = l.conn.as_ref().filter(|c| c.gen == gen) else {
            return;
        };
        let dir = if n == l.a { 0 } else { 1 };
        let (other, other_path) = if dir == 0 {
            (l.b, conn.b_path)
        } else {
            (l.a, conn.a_path)
        };
        let fin_at = (self.now + self.cfg.link.latency).max(conn.last_arrival[dir]);
        self.schedule(
            fin_at,
            Job::Node(other, Action::PathDown { path: other_path }),
        );
        self.schedule(fin_at, Job::Retire { link, gen });
    }

    fn schedule_reconnect(&mut self, link: usize) {
        if !self.links[link].reconnect_pending {
            self.links[link].reconnect_pending = true;
            let at = self.now + self.cfg.reconnect_after;
            self.schedule(at, Job::Reconnect(link));
        }
    }

    fn detect(&mut self, link: usize, gen: u64) {
        let l = &self.links[link];
        let silent = !(l.up[0] && l.up[1]);
        if silent && l.conn.as_ref().is_some_and(|c| c.gen == gen) {
            self.drop_conn(link, gen);
        }
    }

    fn fault(&mut self, f: Fault) {
        let now = self.now;
        match &f {
            Fault::LinkDown { link, dur, .. } | Fault::OneWay { link, dur, .. } => {
                let dirs: &[usize] = match &f {
                    Fault::OneWay { a_to_b: true, .. } => &[0],
                    Fault::OneWay { a_to_b: false, .. } => &[1],
                    _ => &[0, 1],
                };
                let l = &mut self.links[*link];
                for &d in dirs {
                    l.down_count[d] += 1;
                    l.up[d] = false;
                }
                if let (Some(after), Some(conn)) = (self.cfg.detect_after, &l.conn) {
                    let gen = conn.gen;
                    self.schedule(now + after, Job::Detect { link: *link, gen });
                }
                let end = now + *dur;
                self.schedule(end, Job::FaultEnd(f));
            }
            Fault::Loss {
                link,
                percent,
                dur,
                one_way,
                ..
            } => {
                let l = &mut self.links[*link];
                for &d in loss_dirs(*one_way) {
                    l.loss_count[d] += 1;
                    l.loss[d] = f64::from(*percent) / 100.0;
                }
                let end = now + *dur;
                self.schedule(end, Job::FaultEnd(f));
            }
            Fault::Reset { link, .. } => {
                if let Some(gen) = self.links[*link].conn.as_ref().map(|c| c.gen) {
                    self.drop_conn(*link, gen);
                }
            }
            Fault::Pause { node, dur, .. } => {
                let nd = &mut self.nodes[*node];
                nd.paused_until = nd.paused_until.max(now + *dur);
            }
            Fault::Restart { node, .. } => self.restart(*node),
        }
    }

    fn fault_end(&mut self, f: Fault) {
        match f {
            Fault::LinkDown { link, .. } | Fault::OneWay { link, .. } => {
                let dirs: &[usize] = match &f {
                    Fault::OneWay { a_to_b: true, .. } => &[0],
                    Fault::OneWay { a_to_b: false, .. } => &[1],
                    _ => &[0, 1],
                };
                let l = &mut self.links[link];
                for &d in dirs {
                    l.down_count[d] -= 1;
                    l.up[d] = l.down_count[d] == 0;
                }
            }
            Fault::Loss { link, one_way, .. } => {
                let l = &mut self.links[link];
                for &d in loss_dirs(one_way) {
                    l.loss_count[d] -= 1;
                    if l.loss_count[d] == 0 {
                        l.loss[d] = 0.0;
                    }
                }
            }
            _ => {}
        }
    }

    fn restart(&mut self, n: usize) {
        let inc = self.nodes[n].incarnation;
        self.checker.sender_died(n, inc);
        let node = &mut self.nodes[n];
        node.incarnation += 1;
        node.ep = Self::endpoint(&self.cfg, n, node.incarnation);
        node.inbox.clear();
        node.paths.clear();
        node.wake_at = None;
        node.paused_until = Time::ZERO;
        node.sched = PriorityScheduler::new(Duration::from_millis(50));
        node.busy = false;
        // The kernel resets every connection of the dead process; peers see
        // the reset after one latency.
        let at = self.now + self.cfg.link.latency;
        for link in 0..self.links.len() {
            let l = &mut self.links[link];
            if l.a != n && l.b != n {
                continue;
            }
            if let Some(conn) = l.conn.take() {
                let (other, path) = if l.a == n {
                    (l.b, conn.b_path)
                } else {
                    (l.a, conn.a_path)
                };
                self.schedule(at, Job::Node(other, Action::PathDown { path }));
                self.schedule_reconnect(link);
            }
        }
        let now = self.now;
        if now.since_origin() < self.cfg.workload.until {
            let inc = self.nodes[n].incarnation;
            self.schedule(now, Job::Node(n, Action::AppTick(inc)));
            if self.cfg.workload.call_every.is_some() {
                self.schedule(now, Job::Node(n, Action::CallTick(inc)));
            }
        }
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
                drained_at = Some(self.now.since_origin());
                break;
            }
            // Past the bound, or nothing left that could ever change it.
            if self.now.since_origin() > deadline || self.queue.is_empty() {
                break;
            }
            // Advance in small slices so the pending check is timely.
            let next = self.now.since_origin() + Duration::from_millis(1);
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
                            self.nodes[n].ep.debug_session(node_id(m))
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
                let mut v: Vec<NodeId> = self.nodes[n].ep.peers().collect();
                v.sort();
                v
            };
            for p in peers {
                if let Some(s) = self.nodes[n].ep.session_stats(p) {
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
            handshakes_failed: self.handshakes_failed,
            records_refused: self.records_refused,
        }
    }

    /// Records the latency of every delivery in the report.
    pub fn record_latencies(&mut self) {
        self.checker.latencies = Some(Vec::new());
    }

    /// Access to a node's endpoint (for tests).
    pub fn endpoint_of(&self, n: usize) -> &Endpoint {
        &self.nodes[n].ep
    }
}
