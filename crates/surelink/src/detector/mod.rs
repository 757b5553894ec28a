//! The failure detector's shell: heartbeat sockets and threads around the
//! core's [`Fence`] and [`Monitor`] (SafeTimer).
//!
//! One UDP socket per network (bound to the TCP listener's address and
//! port, or an ephemeral port for a pure client) carries heartbeats; a
//! second socket per network sends barriers to the first. Three kinds of OS
//! thread, so a saturated async runtime cannot starve them:
//!
//! - the *sender* runs the fence: sends each heartbeat to every known peer
//!   address, reads the kernel's TX timestamps and moves `t_valid`;
//! - a *reader* per socket feeds heartbeats and barriers to the monitor in
//!   queue order, with the socket's drop count;
//! - the *checker* runs the monitor's windows and sends barriers, one per
//!   CPU (pinned to each in turn, since the kernel queues a packet in the
//!   backlog of the CPU that sent or received it).
//!
//! Reports and the fence's closing go to an async task that acts on the
//! session: a silent path's connections are shut down (the session re-sends
//! their in-flight messages elsewhere), a path heard again is re-dialled at
//! once, and a fenced process starts a new epoch.
//!
//! The [`Gate`] is the send fence every socket write passes. The threads
//! live in `send.rs`, `read.rs` and `check.rs`; what the endpoint does with
//! their reports and with a closed fence, in `react.rs`.
//!
//! What it does not do: decide (the core's [`Fence`] and [`Monitor`] do),
//! or touch a session (the reactions go through the session's own entry).

mod check;
mod gate;
mod pace;
mod private;
mod react;
mod read;
mod send;
mod snapshot;
mod strays;
mod streams;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::warn;

use surelink_proto::detector::datagram::{Freshness, HeartbeatKey};
use surelink_proto::detector::{
    DetectorConfig, DetectorMode, Fence, Monitor, Pacer, PathReport, Watch,
};
use surelink_proto::secure::{Keypair, Members, PublicKey};
use surelink_proto::{ClusterId, Epoch, NodeId, Time};
use surelink_sys::{counters, HeartbeatSocket, StraySocket};

pub(crate) use gate::Gate;
pub(crate) use pace::TrafficCell;
pub(crate) use react::signal_loop;
pub use snapshot::DetectorSnapshot;
pub use strays::{RefusedCounts, StraysSnapshot};
pub(crate) use streams::StreamHandles;

/// How long a blocked reader waits before looking at the closed flag. A
/// fallback only: closing shuts the sockets down, which wakes every reader
/// at once (an idle process has no reader waking on a timer).
const READ_POLL: Duration = Duration::from_secs(1);
/// How long a read blocks once a wait said a datagram is there.
const RECV_TIMEOUT: Duration = Duration::from_millis(50);
/// How often the checker reads the interfaces' drop counters between barriers.
const SYSTEM_COUNTERS_EVERY: Duration = Duration::from_millis(100);
/// How long the sender waits for the kernel's TX timestamps of one round.
const TIMESTAMP_WAIT: Duration = Duration::from_millis(2);

/// Where a test or experiment can stall one of the detector's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DelayPoint {
    /// The thread that reads heartbeats off the sockets (after it took one
    /// datagram, before handing it on).
    Reader,
    /// The thread that checks windows and sends barriers.
    Checker,
    /// The thread that sends heartbeats.
    Sender,
    /// Not a detector thread: every connection's reader (an async task),
    /// before its next read — the peer's data waits in the sockets, as
    /// behind a stalled runtime. Tests only.
    ConnectionReader,
}

/// What the threads tell the async side.
#[derive(Debug)]
pub(crate) enum Signal {
    Report(PathReport),
    Fenced { at: Time, missed_seq: u64 },
}

struct RoundState {
    token: u64,
    /// The random token the barriers carry (the monitor's counts from 1;
    /// a guessable token would let anyone complete a round).
    wire: u64,
    /// Barrier copies still to come back.
    missing: usize,
}

struct CheckerState {
    monitor: Monitor,
    round: Option<RoundState>,
    /// Latest `SO_RXQ_OVFL` count per socket.
    ovfl: Vec<u64>,
    /// Replay protection for authenticated heartbeats.
    fresh: Freshness,
}

/// The detector of one endpoint.
pub(crate) struct Detector {
    cfg: DetectorConfig,
    /// The sender thread's scheduling class.
    priority: crate::DetectorPriority,
    pub(crate) gate: Arc<Gate>,
    cluster: ClusterId,
    node: NodeId,
    epoch: AtomicU64,
    /// Heartbeat sockets per network; emptied by `close` (closing them).
    sockets: Mutex<Vec<Arc<HeartbeatSocket>>>,
    /// The second socket per network that barriers come from.
    barrier_from: Mutex<Vec<Arc<HeartbeatSocket>>>,
    networks: usize,
    interfaces: Vec<String>,
    checker: Mutex<CheckerState>,
    /// Bumped when the fence is replaced after a new epoch.
    fence_generation: AtomicU64,
    dests: Mutex<BTreeMap<(NodeId, usize), SocketAddr>>,
    /// When traffic last arrived per (peer, network), ns on the gate's clock.
    heard: Mutex<BTreeMap<(NodeId, usize), Arc<AtomicU64>>>,
    /// Per path, when our data last left and its connections' probes.
    streams: Mutex<streams::Streams>,
    /// The interfaces' drop counters' last sum and when it was read.
    system_drops: Mutex<(u64, Option<Time>)>,
    signals: mpsc::UnboundedSender<Signal>,
    delays: [AtomicU64; 4],
    closed: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    heartbeats_sent: AtomicU64,
    heartbeats_received: AtomicU64,
    tx_timestamped: AtomicU64,
    fences: AtomicU64,
    /// Heartbeat keys per peer, newest first (`None`: insecure, heartbeats
    /// untagged). With member keys one per member; with mutual TLS one per
    /// recent connection ([`CONNECTION_KEYS`]).
    hb_keys: Option<Mutex<BTreeMap<NodeId, Vec<HeartbeatKey>>>>,
    /// This node's key pair and cluster, to derive keys of members added later.
    identity: Option<Keypair>,
    /// Datagrams refused: bad tag, unknown sender, replay, foreign barrier.
    refused: AtomicU64,
    /// The same by reason.
    junk: strays::Junk,
    /// The strays' socket per network (`None`: the port is not split).
    strays: Mutex<Vec<Option<Arc<StraySocket>>>>,
    /// Source addresses steered to the members' queue.
    steering: Mutex<strays::Steering>,
    /// Stray readers holding datagrams they have not processed yet.
    stray_in_hand: AtomicU64,
    /// The same for the members' readers.
    members_in_hand: AtomicU64,
    /// Private sockets per peer and network, and our barriers' ones.
    private: Mutex<private::Private>,
    /// Which peers get the busy pace.
    pacer: Mutex<Pacer>,
    /// When we last had traffic with each peer, ns on the gate's clock
    /// (stamped by sessions; the sender folds them into the pacer).
    traffic: Mutex<BTreeMap<NodeId, Arc<pace::TrafficCell>>>,
    /// Quiet pairs whose traffic just started: the sender goes at once.
    kicks: Mutex<Vec<NodeId>>,
    /// Peers with a new destination: the sender greets them at once.
    greetings: Mutex<Vec<NodeId>>,
    /// Peers just probed (a path on a network we share was reported down):
    /// the monitor expects their busy pace once our ask is out.
    probed: Mutex<Vec<NodeId>>,
    /// Per network, the last peer a probe asked (the next probe asks the
    /// ones after it).
    probe_cursor: Mutex<BTreeMap<usize, NodeId>>,
    probes: AtomicU64,
    kick_count: AtomicU64,
    /// With `answer_grace`: when the sender will next look at the traffic
    /// stamps, ns (a send wakes it only if that is later than the grace
    /// allows), and whether a send came since it last looked.
    sender_plan: AtomicU64,
    traffic_dirty: std::sync::atomic::AtomicBool,
    busy_rounds: AtomicU64,
    /// When the checker will look next, ns (it is woken for anything
    /// earlier: a new path, an ask for the busy pace).
    checker_wake: AtomicU64,
    sender_thread: std::sync::OnceLock<std::thread::Thread>,
    checker_thread: std::sync::OnceLock<std::thread::Thread>,
    /// Per peer and network: where our heartbeats go privately, and the
    /// handshake that says whether the private copy is the counted one.
    handshakes: Mutex<BTreeMap<(NodeId, usize), surelink_proto::detector::Handshake>>,
    strays_read: AtomicU64,
    not_steered: AtomicU64,
    /// Networks this endpoint is silent on (test hook: see
    /// `Testing::mute_network`); shared with the endpoint's connections.
    #[cfg(feature = "test-util")]
    pub(crate) muted: Arc<AtomicU64>,
}

/// Heartbeat keys with mutual TLS: one per connection, this many kept per
/// peer (a connection per network, plus re-dials in flight).
const CONNECTION_KEYS: usize = 4;

/// How heartbeats are authenticated.
#[derive(Clone, Copy)]
pub(crate) enum HeartbeatAuth<'a> {
    /// Insecure: untagged.
    None,
    /// Per-pair keys from this node's key pair and the members' keys.
    Members(&'a Keypair, &'a Members),
    /// Mutual TLS: keys from each connection's exported keying material
    /// ([`Detector::add_connection_key`]); none for a peer until a
    /// connection to it finished its handshake.
    PerConnection,
}

/// A random u64 (barrier tokens).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        // No randomness: fall back to the clock (still not a count from 1).
        return u64::try_from(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        )
        .unwrap_or(u64::MAX);
    }
    u64::from_ne_bytes(b)
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detector")
            .field("mode", &self.cfg.mode)
            .finish_non_exhaustive()
    }
}

impl Detector {
    /// Opens the sockets (one per local address) and starts the threads.
    /// `None` when the detector is off.
    /// `auth`: how heartbeats are tagged and checked (see [`HeartbeatAuth`]).
    pub(crate) fn start(
        cfg: &DetectorConfig,
        cluster: ClusterId,
        node: NodeId,
        epoch: Epoch,
        local: &[SocketAddr],
        auth: HeartbeatAuth<'_>,
        priority: crate::DetectorPriority,
    ) -> std::io::Result<Option<(Arc<Detector>, mpsc::UnboundedReceiver<Signal>)>> {
        if cfg.mode == DetectorMode::Off {
            return Ok(None);
        }
        let mut sockets = Vec::new();
        let mut barrier_from = Vec::new();
        let mut interfaces = Vec::new();
        let mut strays = Vec::new();
        for addr in local {
            let s = HeartbeatSocket::bind(*addr)?;
            s.set_read_timeout(Some(RECV_TIMEOUT))?;
            // The split by source is what keeps a junk flood from holding
            // back reports; without it (no reuseport) one queue, as before.
            match s.open_strays() {
                Ok(st) => strays.push(Some(Arc::new(st))),
                Err(e) => {
                    warn!(%addr, error = %e, "heartbeat port not split by source: a flood can hold back reports");
                    strays.push(None);
                }
            }
            barrier_from.push(Arc::new(HeartbeatSocket::bind(SocketAddr::new(
                addr.ip(),
                0,
            ))?));
            if let Some(i) = counters::interface_of(addr.ip()) {
                if !interfaces.contains(&i) {
                    interfaces.push(i);
                }
            }
            sockets.push(Arc::new(s));
        }
        if strays.iter().any(Option::is_none) {
            // All or nothing: the monitor sees one strays' queue.
            strays.iter_mut().for_each(|s| *s = None);
        }
        let own: Vec<std::net::Ipv4Addr> = local
            .iter()
            .filter_map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) if !v4.is_unspecified() => Some(v4),
                _ => None,
            })
            .collect();
        if own.len() < local.len() {
            // A wildcard address: our barriers' source is not known in
            // advance, so the port is not split.
            strays.iter_mut().for_each(|s| *s = None);
        }
        let barrier_addrs: Vec<SocketAddr> = barrier_from
            .iter()
            .map(|s: &Arc<HeartbeatSocket>| s.local_addr())
            .collect::<std::io::Result<_>>()?;
        let (private, poller) = private::Private::open(&barrier_addrs)?;
        // The fence's schedule starts when the sender thread does (a cold
        // start must not count as a missed heartbeat); until then nobody
        // has heard us, so nobody can report us and the gate stays open.
        let gate = Arc::new(Gate::new(cfg));
        let now = gate.now();
        let (tx, rx) = mpsc::unbounded_channel();
        let n = sockets.len();
        let det = Arc::new(Detector {
            cfg: cfg.clone(),
            priority,
            gate,
            cluster,
            node,
            epoch: AtomicU64::new(epoch.0),
            sockets: Mutex::new(sockets),
            barrier_from: Mutex::new(barrier_from),
            networks: n,
            interfaces,
            checker: Mutex::new(CheckerState {
                monitor: Monitor::new(cfg, now),
                round: None,
                ovfl: vec![0; n],
                fresh: Freshness::default(),
            }),
            fence_generation: AtomicU64::new(0),
            dests: Mutex::new(BTreeMap::new()),
            heard: Mutex::new(BTreeMap::new()),
            streams: Mutex::new(streams::Streams::default()),
            system_drops: Mutex::new((0, None)),
            signals: tx,
            delays: std::array::from_fn(|_| AtomicU64::new(0)),
            closed: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            heartbeats_sent: AtomicU64::new(0),
            heartbeats_received: AtomicU64::new(0),
            tx_timestamped: AtomicU64::new(0),
            fences: AtomicU64::new(0),
            hb_keys: (!matches!(auth, HeartbeatAuth::None)).then(|| Mutex::new(BTreeMap::new())),
            identity: match auth {
                HeartbeatAuth::Members(k, _) => Some(k.clone()),
                _ => None,
            },
            refused: AtomicU64::new(0),
            junk: strays::Junk::default(),
            strays: Mutex::new(strays),
            steering: Mutex::new(strays::Steering::default()),
            stray_in_hand: AtomicU64::new(0),
            members_in_hand: AtomicU64::new(0),
            private: Mutex::new(private),
            pacer: Mutex::new(Pacer::new(cfg)),
            traffic: Mutex::new(BTreeMap::new()),
            kicks: Mutex::new(Vec::new()),
            greetings: Mutex::new(Vec::new()),
            probed: Mutex::new(Vec::new()),
            probe_cursor: Mutex::new(BTreeMap::new()),
            probes: AtomicU64::new(0),
            kick_count: AtomicU64::new(0),
            sender_plan: AtomicU64::new(0),
            traffic_dirty: std::sync::atomic::AtomicBool::new(false),
            busy_rounds: AtomicU64::new(0),
            checker_wake: AtomicU64::new(0),
            sender_thread: std::sync::OnceLock::new(),
            checker_thread: std::sync::OnceLock::new(),
            handshakes: Mutex::new(BTreeMap::new()),
            strays_read: AtomicU64::new(0),
            not_steered: AtomicU64::new(0),
            #[cfg(feature = "test-util")]
            muted: Arc::new(AtomicU64::new(0)),
        });
        if det.split() {
            // Before any reader runs: from now on only listed sources reach
            // the members' queue.
            det.steer_own(&own);
        }
        if let HeartbeatAuth::Members(_, members) = auth {
            for (peer, key) in members.iter() {
                det.add_member(peer, &key);
            }
        }
        {
            let drops = det.drop_total(&det.checker.lock().ovfl, true);
            let system = det.system_drop_total(false);
            let mut c = det.checker.lock();
            c.monitor.handle_drop_count(now, drops);
            c.monitor.handle_system_drop_count(now, system);
        }
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            let h = std::thread::Builder::new().name(name).spawn(f)?;
            let t = h.thread().clone();
            det.threads.lock().push(h);
            Ok::<_, std::io::Error>(t)
        };
        let d = det.clone();
        let t = spawn(
            "surelink-hb-send".into(),
            Box::new(move || d.sender_thread()),
        )?;
        let _ = det.sender_thread.set(t);
        let d = det.clone();
        let t = spawn(
            "surelink-hb-check".into(),
            Box::new(move || d.checker_thread()),
        )?;
        let _ = det.checker_thread.set(t);
        let d = det.clone();
        spawn(
            "surelink-hb-private".into(),
            Box::new(move || d.private_thread(poller)),
        )?;
        for i in 0..n {
            let d = det.clone();
            spawn(
                format!("surelink-hb-read{i}"),
                Box::new(move || d.reader_thread(i)),
            )?;
            if det.split() {
                let d = det.clone();
                spawn(
                    format!("surelink-hb-stray{i}"),
                    Box::new(move || d.strays_thread(i)),
                )?;
            }
        }
        Ok(Some((det, rx)))
    }

    /// The heartbeat sockets' addresses, one per network.
    pub(crate) fn local_addrs(&self) -> Vec<SocketAddr> {
        self.socks()
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }

    /// Derives the heartbeat key shared with `peer` (no-op when insecure).
    pub(crate) fn add_member(&self, peer: NodeId, key: &PublicKey) {
        let (Some(keys), Some(id)) = (&self.hb_keys, &self.identity) else {
            return;
        };
        if peer == self.node {
            return;
        }
        match id.pair_key(self.cluster, self.node, peer, key, HeartbeatKey::PURPOSE) {
            Some(k) => {
                keys.lock().insert(peer, vec![HeartbeatKey::new(&k)]);
            }
            None => warn!(%peer, "member key is a low-order point; its heartbeats will be refused"),
        }
    }

    /// Mutual TLS: a connection to `peer` finished its handshake; its
    /// exported keying material keys our heartbeats to `peer` from now on
    /// (the peer derives the same). The last few stay valid for what
    /// arrives, so heartbeats cross a re-dial without a gap.
    pub(crate) fn add_connection_key(&self, peer: NodeId, exported: &[u8; 32]) {
        let Some(keys) = &self.hb_keys else { return };
        let mut g = keys.lock();
        let v = g.entry(peer).or_default();
        v.insert(0, HeartbeatKey::new(exported));
        v.truncate(CONNECTION_KEYS);
    }

    /// Forgets where a peer that left was: no more heartbeats to it. (Its
    /// replay window stays — bounded by the member list — so its old
    /// heartbeats cannot be replayed to bring the address back.)
    pub(crate) fn forget_peer(&self, peer: NodeId) {
        self.dests.lock().retain(|(p, _), _| *p != peer);
        self.handshakes.lock().retain(|(p, _), _| *p != peer);
        self.private.lock().forget(peer);
        self.heard.lock().retain(|(p, _), _| *p != peer);
        self.streams.lock().forget(peer);
        self.traffic.lock().remove(&peer);
        self.pacer.lock().forget(peer);
    }

    /// Heartbeats for `peer` on `network` go to `addr` (its listener's
    /// address: the heartbeat socket shares the port).
    pub(crate) fn add_destination(&self, peer: NodeId, network: usize, addr: SocketAddr) {
        if self.dests.lock().insert((peer, network), addr) != Some(addr) {
            self.greet(peer);
        }
        // A configured peer's address: its heartbeats come from there.
        self.steer_source(peer, addr.ip());
    }

    /// Whether `peer` is heard on `network` now: its heartbeats (or
    /// traffic) arrive and the path is not reported silent. A dial loop
    /// retries at once while this holds: the peer is alive on that network,
    /// so a failed connect means our way there is cut for now (a one-way
    /// fault or a route gone), and no "heard again" will come to wake it.
    pub(crate) fn hears(&self, peer: NodeId, network: usize) -> bool {
        let Ok(network) = u16::try_from(network) else {
            return false;
        };
        self.checker.lock().monitor.is_down(Watch { peer, network }) == Some(false)
    }

    /// A connection authenticated as `peer` comes from `ip`: its
    /// heartbeats are steered to the members' queue from the start, not
    /// only once one of them got through the strays' reader (TCP's own
    /// handshake proves the address; the key proves the node).
    pub(crate) fn vouch(&self, peer: NodeId, ip: std::net::IpAddr) {
        self.steer_source(peer, ip);
    }

    /// The cell a connection to `peer` on `network` stamps on every read
    /// (traffic counts as a heartbeat). An atomic store per read instead of
    /// a lock; the checker folds the stamps in before every check.
    pub(crate) fn heard_cell(&self, peer: NodeId, network: usize) -> Arc<AtomicU64> {
        self.heard
            .lock()
            .entry((peer, network))
            .or_insert_with(|| Arc::new(AtomicU64::new(0)))
            .clone()
    }

    /// Stops the threads and closes the sockets before returning, so a new
    /// endpoint can bind the same addresses at once (as after a crash).
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        for s in self.socks() {
            s.shutdown();
        }
        for s in self.strays.lock().iter().flatten() {
            s.shutdown();
        }
        // Wakes the private sockets' reader (its epoll set holds them).
        self.private.lock().shutdown();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        let me = std::thread::current().id();
        for t in &threads {
            t.thread().unpark();
        }
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        // The threads are gone: dropping the sockets closes them.
        self.sockets.lock().clear();
        self.barrier_from.lock().clear();
        self.strays.lock().clear();
        self.private.lock().clear();
    }

    fn socks(&self) -> Vec<Arc<HeartbeatSocket>> {
        self.sockets.lock().clone()
    }

    /// Stalls a thread of the detector for `d` from now.
    #[cfg(feature = "test-util")]
    pub(crate) fn inject_delay(&self, point: DelayPoint, d: Duration) {
        let until = self.gate.now() + d;
        self.delays[point as usize].store(until.as_nanos(), Ordering::Relaxed);
    }

    /// Sets the heartbeat sockets' receive buffer.
    #[cfg(feature = "test-util")]
    pub(crate) fn set_recv_buffer(&self, bytes: usize) -> std::io::Result<()> {
        for s in self.socks() {
            s.set_recv_buffer(bytes)?;
        }
        Ok(())
    }

    /// After a fence: heartbeats carry `epoch` and a fresh schedule starts.
    pub(crate) fn restart_fence(&self, epoch: Epoch) {
        self.epoch.store(epoch.0, Ordering::Relaxed);
        let mut f = self.gate.fence.lock();
        // Unarmed until a heartbeat or data frame of the new incarnation
        // gets out: one fence per isolation, not one per slack while it
        // lasts.
        *f = Fence::unarmed(&self.cfg, self.gate.now());
        self.gate.publish(&f);
        self.fence_generation.fetch_add(1, Ordering::Release);
    }

    /// Sleeps (async) while an injected [`DelayPoint::ConnectionReader`]
    /// delay lasts.
    #[cfg(feature = "test-util")]
    pub(crate) async fn stall_connection_reader(&self) {
        let until = self.delays[DelayPoint::ConnectionReader as usize].load(Ordering::Relaxed);
        let now = self.gate.now().as_nanos();
        if until > now {
            tokio::time::sleep(Duration::from_nanos(until - now)).await;
        }
    }

    /// Sleeps while an injected delay for `point` lasts.
    fn stall(&self, point: DelayPoint) {
        let until = self.delays[point as usize].load(Ordering::Relaxed);
        loop {
            let now = self.gate.now().as_nanos();
            if until <= now || self.closed.load(Ordering::Relaxed) {
                return;
            }
            std::thread::park_timeout(Duration::from_nanos(until - now));
        }
    }

    /// Parks until `t` (no fixed tick: `close`, a kick or a new deadline
    /// unparks the thread).
    fn sleep_until(&self, t: Time) {
        let now = self.gate.now();
        // Bounded anyway, in case a wake is ever missed.
        let d = t.saturating_since(now).min(Duration::from_secs(5));
        if !d.is_zero() {
            // Parked, so `close` can wake us.
            std::thread::park_timeout(d);
        }
    }
}
