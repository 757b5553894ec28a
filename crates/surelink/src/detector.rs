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
//! The [`Gate`] is the send fence every socket write passes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use surelink_proto::detector::datagram::{self, Datagram, Freshness, HeartbeatKey, MAX_DATAGRAM};
use surelink_proto::detector::{
    DetectorConfig, DetectorMode, Fence, FenceState, Monitor, MonitorAction, MonitorStats,
    PathReport, Watch,
};
use surelink_proto::secure::{Keypair, Members, PublicKey};
use surelink_proto::{ClusterId, Epoch, NodeId, Time};
use surelink_sys::{counters, cpu, HeartbeatSocket, TxTimestamp};

/// How long a blocked reader waits before looking at the closed flag.
const READ_POLL: Duration = Duration::from_millis(50);
/// How often the checker reads the interfaces' drop counters between barriers.
const SYSTEM_COUNTERS_EVERY: Duration = Duration::from_millis(100);
/// How long the sender waits for the kernel's TX timestamps of one round.
const TIMESTAMP_WAIT: Duration = Duration::from_millis(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The send fence every socket write passes: no frame leaves after
/// `t_valid` (SafeTimer, paper Fig. 3).
#[derive(Debug)]
pub(crate) struct Gate {
    /// `CLOCK_BOOTTIME` at start: the gate's clock keeps counting through
    /// a suspend, so the fence closes across one.
    base: Duration,
    /// Nanoseconds since `base`; `u64::MAX` when no fence runs.
    t_valid: AtomicU64,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            base: surelink_sys::boottime(),
            t_valid: AtomicU64::new(u64::MAX),
        }
    }

    /// Whether a frame may leave now.
    pub(crate) fn may_send(&self) -> bool {
        let t = self.t_valid.load(Ordering::Acquire);
        t == u64::MAX || self.now().as_nanos() <= t
    }

    /// The fence's `t_valid` on this gate's clock (far future when no
    /// fence runs).
    pub(crate) fn t_valid(&self) -> Option<Time> {
        Some(Time::from_nanos(self.t_valid.load(Ordering::Acquire)))
    }

    pub(crate) fn now(&self) -> Time {
        let d = surelink_sys::boottime().saturating_sub(self.base);
        Time::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Where a test or experiment can stall one of the detector's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelayPoint {
    /// The thread that reads heartbeats off the sockets (after it took one
    /// datagram, before handing it on).
    Reader,
    /// The thread that checks windows and sends barriers.
    Checker,
    /// The thread that sends heartbeats.
    Sender,
}

/// What the threads tell the async side.
#[derive(Debug)]
pub(crate) enum Signal {
    Report(PathReport),
    Fenced { at: Time, missed_seq: u64 },
}

/// Detector counters for stats and experiments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DetectorSnapshot {
    /// Which detector runs.
    pub mode: Option<DetectorMode>,
    /// Heartbeats sent (one per peer address per interval).
    pub heartbeats_sent: u64,
    /// Heartbeats received.
    pub heartbeats_received: u64,
    /// Heartbeats whose TX timestamp came from the kernel (the rest used
    /// the time after the send call returned).
    pub tx_timestamped: u64,
    /// Times this process fenced itself.
    pub fences: u64,
    /// Datagrams refused: heartbeats with a bad tag, from a non-member or
    /// replayed; barriers not from this process or with a stale token.
    pub datagrams_refused: u64,
    /// Microseconds from now until `t_valid` (negative: the gate is shut).
    pub t_valid_in_us: i64,
    /// The monitor's counters.
    pub monitor: MonitorStats,
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
    fence: Mutex<Fence>,
    /// Bumped when the fence is replaced after a new epoch.
    fence_generation: AtomicU64,
    dests: Mutex<BTreeMap<(NodeId, usize), SocketAddr>>,
    /// When traffic last arrived per (peer, network), ns on the gate's clock.
    heard: Mutex<BTreeMap<(NodeId, usize), Arc<AtomicU64>>>,
    /// The interfaces' drop counters' last sum and when it was read.
    system_drops: Mutex<(u64, Option<Time>)>,
    signals: mpsc::UnboundedSender<Signal>,
    delays: [AtomicU64; 3],
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
    ) -> std::io::Result<Option<(Arc<Detector>, mpsc::UnboundedReceiver<Signal>)>> {
        if cfg.mode == DetectorMode::Off {
            return Ok(None);
        }
        let mut sockets = Vec::new();
        let mut barrier_from = Vec::new();
        let mut interfaces = Vec::new();
        for addr in local {
            let s = HeartbeatSocket::bind(*addr)?;
            s.set_read_timeout(Some(READ_POLL))?;
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
        let gate = Arc::new(Gate::new());
        let now = gate.now();
        // The schedule starts when the sender thread does (a cold start
        // must not count as a missed heartbeat); until then nobody has
        // heard us, so nobody can report us and the gate stays open.
        let fence = Fence::new(cfg, now);
        let (tx, rx) = mpsc::unbounded_channel();
        let n = sockets.len();
        let det = Arc::new(Detector {
            cfg: cfg.clone(),
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
            fence: Mutex::new(fence),
            fence_generation: AtomicU64::new(0),
            dests: Mutex::new(BTreeMap::new()),
            heard: Mutex::new(BTreeMap::new()),
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
            #[cfg(feature = "test-util")]
            muted: Arc::new(AtomicU64::new(0)),
        });
        if let HeartbeatAuth::Members(_, members) = auth {
            for (peer, key) in members.iter() {
                det.add_member(peer, &key);
            }
        }
        {
            let drops = det.drop_total(&lock(&det.checker).ovfl, true);
            lock(&det.checker).monitor.handle_drop_count(now, drops);
        }
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            let h = std::thread::Builder::new().name(name).spawn(f)?;
            lock(&det.threads).push(h);
            Ok::<_, std::io::Error>(())
        };
        let d = det.clone();
        spawn(
            "surelink-hb-send".into(),
            Box::new(move || d.sender_thread()),
        )?;
        let d = det.clone();
        spawn(
            "surelink-hb-check".into(),
            Box::new(move || d.checker_thread()),
        )?;
        for i in 0..n {
            let d = det.clone();
            spawn(
                format!("surelink-hb-read{i}"),
                Box::new(move || d.reader_thread(i)),
            )?;
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
                lock(keys).insert(peer, vec![HeartbeatKey::new(&k)]);
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
        let mut g = lock(keys);
        let v = g.entry(peer).or_default();
        v.insert(0, HeartbeatKey::new(exported));
        v.truncate(CONNECTION_KEYS);
    }

    /// Forgets where a peer that left was: no more heartbeats to it. (Its
    /// replay window stays — bounded by the member list — so its old
    /// heartbeats cannot be replayed to bring the address back.)
    pub(crate) fn forget_peer(&self, peer: NodeId) {
        lock(&self.dests).retain(|(p, _), _| *p != peer);
        lock(&self.heard).retain(|(p, _), _| *p != peer);
    }

    /// Heartbeats for `peer` on `network` go to `addr` (its listener's
    /// address: the heartbeat socket shares the port).
    pub(crate) fn add_destination(&self, peer: NodeId, network: usize, addr: SocketAddr) {
        lock(&self.dests).insert((peer, network), addr);
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
        lock(&self.checker).monitor.is_down(Watch { peer, network }) == Some(false)
    }

    /// The cell a connection to `peer` on `network` stamps on every read
    /// (traffic counts as a heartbeat). An atomic store per read instead of
    /// a lock; the checker folds the stamps in before every check.
    pub(crate) fn heard_cell(&self, peer: NodeId, network: usize) -> Arc<AtomicU64> {
        lock(&self.heard)
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
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
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
        lock(&self.sockets).clear();
        lock(&self.barrier_from).clear();
    }

    fn socks(&self) -> Vec<Arc<HeartbeatSocket>> {
        lock(&self.sockets).clone()
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

    pub(crate) fn snapshot(&self) -> DetectorSnapshot {
        let now = self.gate.now().as_nanos();
        let t_valid = self.gate.t_valid.load(Ordering::Acquire);
        let t_valid_in_us = if t_valid == u64::MAX {
            i64::MAX
        } else {
            let d = i128::from(t_valid) - i128::from(now);
            i64::try_from(d / 1000).unwrap_or(i64::MIN)
        };
        DetectorSnapshot {
            mode: Some(self.cfg.mode),
            heartbeats_sent: self.heartbeats_sent.load(Ordering::Relaxed),
            heartbeats_received: self.heartbeats_received.load(Ordering::Relaxed),
            tx_timestamped: self.tx_timestamped.load(Ordering::Relaxed),
            fences: self.fences.load(Ordering::Relaxed),
            datagrams_refused: self.refused.load(Ordering::Relaxed),
            t_valid_in_us,
            monitor: lock(&self.checker).monitor.stats(),
        }
    }

    /// After a fence: heartbeats carry `epoch` and a fresh schedule starts.
    pub(crate) fn restart_fence(&self, epoch: Epoch) {
        self.epoch.store(epoch.0, Ordering::Relaxed);
        let mut f = lock(&self.fence);
        // Unarmed until a heartbeat of the new incarnation gets out: one
        // fence per isolation, not one per slack while it lasts.
        *f = Fence::unarmed(&self.cfg, self.gate.now());
        self.gate
            .t_valid
            .store(f.t_valid().as_nanos(), Ordering::Release);
        self.fence_generation.fetch_add(1, Ordering::Release);
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

    fn sleep_until(&self, t: Time) {
        let now = self.gate.now();
        let d = t.saturating_since(now).min(READ_POLL);
        if !d.is_zero() {
            // Parked, so `close` can wake us.
            std::thread::park_timeout(d);
        }
    }

    // ---- sender -------------------------------------------------------

    fn sender_thread(self: Arc<Self>) {
        let mut stamps = Vec::new();
        let mut signalled = u64::MAX;
        let safetimer = self.cfg.mode == DetectorMode::SafeTimer;
        {
            let mut f = lock(&self.fence);
            *f = Fence::new(&self.cfg, self.gate.now());
            if safetimer {
                self.gate
                    .t_valid
                    .store(f.t_valid().as_nanos(), Ordering::Release);
            }
        }
        while !self.closed.load(Ordering::Relaxed) {
            self.stall(DelayPoint::Sender);
            let now = self.gate.now();
            // Everything that reads or writes the fence, and the gate that
            // mirrors it, happens under the fence lock with the generation
            // read there: a fence replaced by `restart_fence` meanwhile is
            // never written back over the new one.
            let (due, generation) = {
                let mut f = lock(&self.fence);
                if !safetimer && f.is_fenced() {
                    // The baseline has no fence: a late thread just starts
                    // a fresh schedule.
                    *f = Fence::new(&self.cfg, now);
                }
                (
                    f.poll_heartbeat(now),
                    self.fence_generation.load(Ordering::Acquire),
                )
            };
            if let Some(due) = due {
                let sent_at = self.send_heartbeats(due.seq, &mut stamps);
                let mut f = lock(&self.fence);
                if self.fence_generation.load(Ordering::Acquire) != generation {
                    continue;
                }
                match (safetimer, sent_at) {
                    (true, Some(t)) => f.handle_sent(due.seq, t),
                    // Unconfirmed: the fence closes at its deadline.
                    (true, None) => {}
                    (false, _) => f.handle_sent(due.seq, Time::ZERO),
                }
                if safetimer {
                    self.gate
                        .t_valid
                        .store(f.t_valid().as_nanos(), Ordering::Release);
                }
                continue;
            }
            let next = {
                let mut f = lock(&self.fence);
                let generation = self.fence_generation.load(Ordering::Acquire);
                match f.state(self.gate.now()) {
                    FenceState::Fenced { at, missed_seq } if safetimer => {
                        self.gate.t_valid.store(at.as_nanos(), Ordering::Release);
                        if signalled != generation {
                            signalled = generation;
                            self.fences.fetch_add(1, Ordering::Relaxed);
                            let _ = self.signals.send(Signal::Fenced { at, missed_seq });
                        }
                        None
                    }
                    _ => f.poll_timeout(),
                }
            };
            match next {
                Some(t) => self.sleep_until(t),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    /// Sends heartbeat `seq` to every known peer address. Returns when it
    /// provably left the host *for every peer* — per peer the earliest
    /// confirmed copy (any network), and the latest of those — or `None`
    /// if some peer got no confirmed copy, which leaves the heartbeat
    /// unconfirmed (the fence closes at its deadline). A copy is confirmed
    /// by its kernel TX timestamp; only on a socket without timestamps does
    /// the time after `sendmsg` returned stand in (the paper's `t_after`).
    fn send_heartbeats(&self, seq: u64, stamps: &mut Vec<TxTimestamp>) -> Option<Time> {
        let dests: Vec<((NodeId, usize), SocketAddr)> =
            lock(&self.dests).iter().map(|(k, v)| (*k, *v)).collect();
        let epoch = Epoch(self.epoch.load(Ordering::Relaxed));
        // Held for the sends only (no copy of the key map per heartbeat).
        let keys = self.hb_keys.as_ref().map(|k| lock(k));
        // Heartbeats of a fenced process must not leave either.
        if !self.gate.may_send() && self.cfg.mode == DetectorMode::SafeTimer {
            return None;
        }
        if dests.is_empty() {
            // Nobody to tell, so nobody can report us: the thread ran in
            // time, which is what the schedule asks.
            return Some(self.gate.now());
        }
        let sockets = self.socks();
        // Timestamps left from earlier rounds must not confirm this one.
        for sock in &sockets {
            stamps.clear();
            let _ = sock.take_tx_timestamps(stamps);
        }
        let round_start = SystemTime::now();
        let mut confirmed: BTreeMap<NodeId, Option<Time>> =
            dests.iter().map(|((p, _), _)| (*p, None)).collect();
        // Per socket: (peer, datagram id) sent, and whether a send failed
        // (the kernel may have numbered the failed one: ids are then not
        // trusted for that socket).
        let mut sent: Vec<Vec<(NodeId, u32)>> = vec![Vec::new(); sockets.len()];
        let mut failed = vec![false; sockets.len()];
        #[cfg(feature = "test-util")]
        let mut lost_on_wire: Vec<NodeId> = Vec::new();
        for ((peer, network), addr) in dests {
            let Some(sock) = sockets.get(network) else {
                continue;
            };
            // Silent on this network (test hook): the datagram is lost on
            // the wire, as in a blackhole; our side did send it in time.
            #[cfg(feature = "test-util")]
            if crate::testing::is_muted(&self.muted, network) {
                lost_on_wire.push(peer);
                continue;
            }
            // Tagged for this peer (a peer without a key gets nothing: it
            // could not check it, and it is not a member).
            let key = match &keys {
                None => None,
                Some(k) => match k.get(&peer).and_then(|v| v.first()) {
                    Some(k) => Some(k),
                    None => continue,
                },
            };
            let hb = datagram::encode_heartbeat(self.cluster, self.node, epoch, seq, key);
            match sock.send_to(&hb, addr) {
                Ok(id) => sent[network].push((peer, id)),
                Err(e) => {
                    failed[network] = true;
                    debug!(%addr, error = %e, "heartbeat not sent");
                }
            }
        }
        // The reader checks tags under this lock: not held while waiting
        // for TX timestamps.
        drop(keys);
        let t_after = self.gate.now();
        let n_sent: usize = sent.iter().map(Vec::len).sum();
        self.heartbeats_sent
            .fetch_add(n_sent as u64, Ordering::Relaxed);
        let confirm = |c: &mut BTreeMap<NodeId, Option<Time>>, peer: NodeId, at: Time| {
            if let Some(slot) = c.get_mut(&peer) {
                *slot = Some(slot.map_or(at, |t| t.min(at)));
            }
        };
        #[cfg(feature = "test-util")]
        for peer in lost_on_wire {
            confirm(&mut confirmed, peer, t_after);
        }
        for (network, sock) in sockets.iter().enumerate() {
            if !sock.timestamps_enabled() {
                for (peer, _) in &sent[network] {
                    confirm(&mut confirmed, *peer, t_after);
                }
            }
        }
        let deadline = Instant::now() + TIMESTAMP_WAIT;
        let mut got: Vec<Vec<TxTimestamp>> = vec![Vec::new(); sockets.len()];
        loop {
            for (network, sock) in sockets.iter().enumerate() {
                if !sock.timestamps_enabled() || sent[network].is_empty() {
                    continue;
                }
                stamps.clear();
                let _ = sock.take_tx_timestamps(stamps);
                got[network].extend(stamps.iter().filter(|ts| ts.at >= round_start));
                if failed[network] {
                    // Ids not trusted: every copy on this socket counts as
                    // confirmed only once as many stamps came back, at the
                    // latest of them.
                    if got[network].len() >= sent[network].len() {
                        if let Some(latest) = got[network].iter().map(|ts| ts.at).max() {
                            let at = self.to_time(latest);
                            for (peer, _) in &sent[network] {
                                confirm(&mut confirmed, *peer, at);
                            }
                        }
                    }
                } else {
                    for ts in &got[network] {
                        if let Some((peer, _)) = sent[network].iter().find(|(_, id)| *id == ts.id) {
                            confirm(&mut confirmed, *peer, self.to_time(ts.at));
                        }
                    }
                }
            }
            if confirmed.values().all(Option::is_some) || Instant::now() >= deadline {
                break;
            }
            std::thread::yield_now();
        }
        let mut latest = Time::ZERO;
        for t in confirmed.values() {
            latest = latest.max((*t)?);
        }
        self.tx_timestamped.fetch_add(1, Ordering::Relaxed);
        Some(latest)
    }

    /// A kernel wall-clock timestamp on the gate's scale. The wall clock is
    /// read first: a delay between the two reads then makes the result
    /// later, never earlier (a late heartbeat is never taken for on time).
    fn to_time(&self, at: SystemTime) -> Time {
        let ago = SystemTime::now()
            .duration_since(at)
            .unwrap_or(Duration::ZERO);
        let now = self.gate.now();
        Time::from_nanos(
            now.as_nanos()
                .saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    // ---- reader -------------------------------------------------------

    fn reader_thread(self: Arc<Self>, network: usize) {
        let Some(sock) = self.socks().get(network).cloned() else {
            return;
        };
        let mut buf = [0u8; MAX_DATAGRAM + 64];
        while !self.closed.load(Ordering::Relaxed) {
            let r = match sock.recv(&mut buf) {
                Ok(r) => r,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    debug!(network, error = %e, "heartbeat read failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            self.stall(DelayPoint::Reader);
            let now = self.gate.now();
            let mut c = lock(&self.checker);
            if let Some(d) = r.drops {
                c.ovfl[network] = u64::from(d);
            }
            let bytes = &buf[..r.len.min(buf.len())];
            match datagram::decode_datagram(bytes) {
                Ok(Datagram::Heartbeat {
                    cluster,
                    node,
                    epoch,
                    seq,
                }) if cluster == self.cluster && node != self.node => {
                    let authentic = match &self.hb_keys {
                        None => true,
                        Some(keys) => lock(keys).get(&node).is_some_and(|v| {
                            v.iter().any(|k| datagram::verify_heartbeat(bytes, k))
                        }),
                    };
                    let net = u16::try_from(network).unwrap_or(u16::MAX);
                    if !authentic
                        || (self.hb_keys.is_some() && !c.fresh.accept(node, net, epoch, seq))
                    {
                        // Forged, from a stranger, or replayed: as if never sent.
                        self.refused.fetch_add(1, Ordering::Relaxed);
                        self.dispatch(&mut c);
                        continue;
                    }
                    self.heartbeats_received.fetch_add(1, Ordering::Relaxed);
                    // Only an authenticated heartbeat's source becomes where
                    // ours go (one address per member and network).
                    lock(&self.dests).insert((node, network), r.from);
                    if let Ok(n) = u16::try_from(network) {
                        c.monitor.handle_heartbeat(
                            now,
                            Watch {
                                peer: node,
                                network: n,
                            },
                            epoch,
                        );
                    }
                }
                Ok(Datagram::Barrier { token: wire, .. }) => {
                    // Ours only: from one of our barrier sockets, with this
                    // round's random token.
                    let ours = lock(&self.barrier_from)
                        .iter()
                        .any(|s| s.local_addr().is_ok_and(|a| a == r.from));
                    let done = match &mut c.round {
                        Some(round) if ours && round.wire == wire => {
                            round.missing = round.missing.saturating_sub(1);
                            (round.missing == 0).then_some(round.token)
                        }
                        _ => {
                            self.refused.fetch_add(1, Ordering::Relaxed);
                            None
                        }
                    };
                    if let Some(token) = done {
                        c.round = None;
                        let drops = self.drop_total(&c.ovfl, true);
                        c.monitor.handle_barrier(now, token, drops);
                    }
                }
                Ok(_) => {}
                Err(e) => debug!(network, from = %r.from, error = %e, "datagram ignored"),
            }
            self.dispatch(&mut c);
        }
    }

    /// Every receive drop counter that a heartbeat of ours may be in,
    /// summed: the sockets' `SO_RXQ_OVFL` (the socket's own `sk_drops`,
    /// free: it comes with each datagram) and the interfaces' `rx_dropped`
    /// (the device and the per-CPU backlogs; files: read when a barrier
    /// returns, `fresh`, and otherwise at most every
    /// [`SYSTEM_COUNTERS_EVERY`]). Only changes matter. An unreadable
    /// counter counts as a change (no report on a guess).
    ///
    /// Not the host's UDP counters (`RcvbufErrors`/`InErrors` in
    /// `/proc/net/snmp`): every drop at the UDP layer of a datagram bound
    /// for our socket also counts in that socket's `sk_drops`; what they
    /// add is other sockets' drops, and a datagram whose checksum failed
    /// (as a heartbeat it would fail its MAC too: loss on the way). With
    /// them, any socket of the host that overflows — a frozen peer on the
    /// same host among them — held back every report for as long as it
    /// dropped.
    fn drop_total(&self, ovfl: &[u64], fresh: bool) -> u64 {
        let now = self.gate.now();
        let mut sys = lock(&self.system_drops);
        if fresh
            || sys
                .1
                .is_none_or(|at| now.saturating_since(at) >= SYSTEM_COUNTERS_EVERY)
        {
            let mut total = 0u64;
            for i in &self.interfaces {
                match counters::interface_rx_dropped(i) {
                    Ok(n) => total = total.wrapping_add(n),
                    Err(_) => total = total.wrapping_add(now.as_nanos()),
                }
            }
            *sys = (total, Some(now));
        }
        ovfl.iter().sum::<u64>().wrapping_add(sys.0)
    }

    // ---- checker ------------------------------------------------------

    fn checker_thread(self: Arc<Self>) {
        let cpus = cpu::allowed_cpus().unwrap_or_default();
        while !self.closed.load(Ordering::Relaxed) {
            self.stall(DelayPoint::Checker);
            let now = self.gate.now();
            let (barrier, next) = {
                let mut c = lock(&self.checker);
                // Read the drop counters at every check, so a drop is dated
                // close to when it happened (a later round is not blocked
                // by a drop long past).
                let drops = self.drop_total(&c.ovfl, false);
                c.monitor.handle_drop_count(now, drops);
                for (&(peer, network), cell) in lock(&self.heard).iter() {
                    let t = cell.load(Ordering::Relaxed);
                    if let (true, Ok(network)) = (t > 0, u16::try_from(network)) {
                        c.monitor
                            .handle_heard(Time::from_nanos(t), Watch { peer, network });
                    }
                }
                c.monitor.handle_timeout(now);
                let barrier = self.dispatch(&mut c).map(|token| {
                    let copies = self.networks * cpus.len().max(1);
                    let wire = random_u64();
                    c.round = Some(RoundState {
                        token,
                        wire,
                        missing: copies,
                    });
                    wire
                });
                (barrier, c.monitor.poll_timeout())
            };
            if let Some(token) = barrier {
                self.send_barriers(token, &cpus);
            }
            self.sleep_until(next);
        }
    }

    /// One barrier per CPU per socket, each sent while pinned to that CPU,
    /// so it queues behind whatever that CPU's backlog holds.
    fn send_barriers(&self, token: u64, cpus: &[usize]) {
        let targets: Vec<SocketAddr> = self.local_addrs();
        let barrier_from = lock(&self.barrier_from).clone();
        let pinned = cpus.len() > 1;
        for (copy, &c) in cpus.iter().enumerate() {
            if pinned {
                let _ = cpu::pin_to(&[c]);
            }
            for (from, to) in barrier_from.iter().zip(&targets) {
                let b = datagram::encode_barrier(token, u16::try_from(copy).unwrap_or(u16::MAX));
                if let Err(e) = from.send_to(&b, *to) {
                    debug!(error = %e, "barrier not sent");
                }
            }
        }
        if pinned {
            let _ = cpu::pin_to(cpus);
        }
        if cpus.is_empty() {
            for (from, to) in barrier_from.iter().zip(&targets) {
                let _ = from.send_to(&datagram::encode_barrier(token, 0), *to);
            }
        }
    }

    /// Forwards the monitor's reports; returns a barrier request if any.
    fn dispatch(&self, c: &mut CheckerState) -> Option<u64> {
        let mut barrier = None;
        while let Some(a) = c.monitor.poll_action() {
            match a {
                MonitorAction::SendBarrier { token } => barrier = Some(token),
                MonitorAction::Report(r) => {
                    let _ = self.signals.send(Signal::Report(r));
                }
            }
        }
        barrier
    }
}

/// Acts on the detector's signals inside the runtime.
pub(crate) async fn signal_loop(
    shared: Arc<crate::shared::Shared>,
    mut rx: mpsc::UnboundedReceiver<Signal>,
) {
    while let Some(s) = rx.recv().await {
        match s {
            Signal::Report(r) => shared.detector_report(r),
            Signal::Fenced { at, missed_seq } => {
                warn!(
                    ?at,
                    missed_seq, "heartbeat missed its deadline: fenced; starting a new epoch"
                );
                shared.recover_from_fence();
            }
        }
    }
    info!("detector signals ended");
}
