//! Endpoint configuration: plain values with defaults, validated once.
//!
//! A *network* is one of the independent networks a node is attached to
//! (one NIC, one address range). `listen[i]` is this node's address on
//! network `i`; a peer's `addrs[i]` is its address on the same network. The
//! endpoint dials each configured peer on every network both have, from the
//! local address of that network, `connections_per_network` times.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use surelink_proto::detector::DetectorConfig;
use surelink_proto::rpc::recovery::{
    GroupConfig, GroupId, Mapping, RecoveryConfig, RecoveryConfigError,
};
use surelink_proto::rpc::{FifoScheduler, PriorityScheduler, Scheduler};
use surelink_proto::secure::{Keypair, Members, Protection, RecordCipher, TlsSetup};
use surelink_proto::{ChannelId, ClusterId, EndpointConfig, Epoch, NodeId};

use crate::server::Job;

/// A peer this endpoint dials.
///
/// Non-exhaustive, like every configuration struct here: later versions
/// add fields with defaults, so build one with [`PeerConfig::new`] (and
/// [`Config::new`]) and change fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerConfig {
    /// Its node id.
    pub node: NodeId,
    /// Its address on each network, in the order of [`Config::listen`];
    /// `None` where it is not attached.
    pub addrs: Vec<Option<SocketAddr>>,
}

impl PeerConfig {
    /// A peer with its address on each network.
    pub fn new(node: NodeId, addrs: Vec<Option<SocketAddr>>) -> PeerConfig {
        PeerConfig { node, addrs }
    }
}

/// Which scheduler picks the next request to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchedulerKind {
    /// hr-net's priority queues (re-sent and high-priority requests first,
    /// a normal request waits at most the aging bound behind them), normal
    /// requests round robin between peers. The default.
    Priority,
    /// One queue in arrival order (the baseline of the priority bench).
    Fifo,
}

/// How the server schedules admitted requests (and the aging bound of the
/// one-way incoming queue).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// Which scheduler.
    pub kind: SchedulerKind,
    /// A normal request (or one-way message) waits at most this long behind
    /// high-priority ones.
    pub aging_bound: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            kind: SchedulerKind::Priority,
            aging_bound: Duration::from_millis(50),
        }
    }
}

impl SchedulerConfig {
    pub(crate) fn build(&self) -> Box<dyn Scheduler<Job>> {
        match self.kind {
            SchedulerKind::Priority => Box::new(PriorityScheduler::new(self.aging_bound)),
            SchedulerKind::Fifo => Box::new(FifoScheduler::new()),
        }
    }
}

/// The server's recovery groups (Seshadri et al., FAST '08; see
/// `docs/recovery.md`): the units a failing part of a service recovers in,
/// while the others keep their workers.
///
/// The default is one group, `default`, that may use every worker: no
/// isolation, and no recovery beyond answering a panicking handler's
/// caller (a handler's panic still makes the group clean up and re-drive,
/// which costs nothing when it registered no clean-up). A service that
/// declares groups gets per group a bound σ of the workers it may hold
/// (the paper's default unless set: half of them under the dynamic
/// mapping), suspension and clean-up when it recovers, and its own
/// handler ([`crate::Endpoint::serve_group`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutorConfig {
    /// How groups map to the worker pools (one pool per runtime worker
    /// thread). Default: dynamic (any pool, each group within σ).
    pub mapping: Mapping,
    /// The groups, [`GroupId`] `i` being the `i`th; empty: one group
    /// that may use every worker.
    pub groups: Vec<GroupConfig>,
    /// Requests on these channels go to these groups (others to group 0,
    /// unless [`crate::Endpoint::route_requests`] decides).
    pub channels: Vec<(ChannelId, GroupId)>,
}

impl ExecutorConfig {
    /// The core's configuration for `pools` pools of `slots` each.
    pub(crate) fn recovery_config(
        &self,
        pools: usize,
        slots: usize,
        max_concurrent: usize,
    ) -> RecoveryConfig {
        let mut cfg = RecoveryConfig::new(pools, slots, &["default"]);
        cfg.mapping = self.mapping;
        if self.groups.is_empty() {
            // One group is the whole server: no bound below the slots.
            cfg.groups[0].sigma = Some(max_concurrent.max(1));
        } else {
            cfg.groups.clone_from(&self.groups);
        }
        cfg
    }

    /// The groups against the pools of the runtime this is called on (one
    /// per worker thread): a home past them is refused.
    pub(crate) fn validate_for_runtime(&self, max_concurrent: usize) -> Result<(), ConfigError> {
        let pools = tokio::runtime::Handle::try_current()
            .map_or(1, |h| h.metrics().num_workers())
            .max(1);
        let slots = max_concurrent.div_ceil(pools).max(1);
        self.recovery_config(pools, slots, max_concurrent)
            .validate()?;
        Ok(())
    }

    fn validate(&self, max_concurrent: usize) -> Result<(), ConfigError> {
        // The pools are the runtime's worker threads, known at bind: here
        // as many as the homes name (a home past the runtime's pools is
        // refused when the endpoint binds, and one group serves all).
        let pools = self
            .groups
            .iter()
            .flat_map(|g| g.home.iter().map(|p| usize::from(p.0) + 1))
            .max()
            .unwrap_or(1);
        self.recovery_config(pools, max_concurrent, max_concurrent)
            .validate()?;
        let groups = self.groups.len().max(1);
        if self
            .channels
            .iter()
            .any(|(_, g)| usize::from(g.0) >= groups)
        {
            return Err(ConfigError::Invalid {
                field: "executor.channels",
                reason: "names a recovery group that is not in executor.groups",
            });
        }
        Ok(())
    }
}

/// When the messages a task queues (requests, replies, one-way messages)
/// are written to the socket.
///
/// A write on loopback or a LAN carries the peer's whole receive path and
/// usually wakes it, so on a busy server the number of writes, not bytes,
/// is the cost. The choice is between writing a lone message at once and
/// writing everything one turn of the runtime queued in one system call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteBatching {
    /// [`Turn`](WriteBatching::Turn) when the endpoint's runtime runs its
    /// tasks on one thread (a current-thread runtime, or a multi-thread one
    /// with one worker), else [`Idle`](WriteBatching::Idle). Decided when
    /// the endpoint is bound. With several workers, a write left for later
    /// is usually picked up by another worker — a cross-thread wake-up that
    /// costs more than the write it saves.
    #[default]
    Auto,
    /// A message queued on an idle session is written at once, inside the
    /// call that queued it; one queued while the session is busy (it wrote
    /// within the last few microseconds) joins the session's next write.
    Idle,
    /// Every message is left to the session's flush, which runs once the
    /// tasks already runnable in this turn of the runtime have run — the
    /// event-loop model of twemproxy or memcached: everything queued for a
    /// peer in one turn (many clients' requests, a batch of replies) goes
    /// out in one write. A lone message waits one task switch. High-priority
    /// messages are written at once either way.
    Turn,
}

/// The scheduling class of the detector's sender thread — the one thread
/// whose lateness costs the whole process: a heartbeat that cannot leave
/// within `send_slack` fences the process, ending every session.
///
/// Measured on a 2-core host with 500 client processes (2026-12-06,
/// docs/detector.md "The 500-client start traced"): a server's round of a
/// thousand heartbeats took 0.3–1.9 s of wall time for ~20 ms of CPU,
/// because each loopback delivery wakes a receiver that preempts the
/// sender. With [`DetectorPriority::Raised`] on every process the server
/// fenced twice in nine 500-client steps (at the ordinary class 1–12 times
/// in most runs), but the clients' side churned more (6 of the 9 steps
/// saturated the cores), so it is not the default: raise it on a server
/// with many peers (corosync runs its whole
/// process under `SCHED_RR` for the same reason; here only this thread,
/// which sleeps between rounds, asks for it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DetectorPriority {
    /// `SCHED_RR` at priority 1 (above every ordinary thread, below any
    /// other real-time one); where that is not allowed (no `CAP_SYS_NICE`
    /// or `RLIMIT_RTPRIO`, or a cgroup without a real-time budget), nice
    /// −20; where that is not allowed either, unchanged. Which one applied
    /// is logged at start.
    Raised,
    /// The thread keeps the process's class (the default).
    #[default]
    Unchanged,
}

/// How an endpoint runs. Build one with [`Config::new`] and adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// This node.
    pub node: NodeId,
    /// The cluster; handshakes with other clusters are refused.
    pub cluster: ClusterId,
    /// This process's incarnation. `None`: the wall-clock time at start in
    /// microseconds, which grows across restarts.
    pub epoch: Option<Epoch>,
    /// One listening address per network (port 0 picks a free port). May be
    /// empty for a pure client, which still dials from the addresses in
    /// `dial_from`.
    pub listen: Vec<SocketAddr>,
    /// Local address to dial from on each network when `listen` is empty or
    /// shorter; otherwise `listen[i]`'s IP is used.
    pub dial_from: Vec<SocketAddr>,
    /// Network interface per network (`SO_BINDTODEVICE`, needs
    /// CAP_NET_RAW), so a network's traffic cannot take another's route;
    /// `None` (or a shorter list): bind by address only.
    pub devices: Vec<Option<String>>,
    /// Peers to dial.
    pub peers: Vec<PeerConfig>,
    /// TCP connections per network per peer (hr-net's redundancy inside one
    /// network).
    pub connections_per_network: usize,
    /// First delay before re-dialling a lost connection; doubles per failure.
    pub reconnect_initial: Duration,
    /// Upper bound of the re-dial delay.
    pub reconnect_max: Duration,
    /// Connect attempts give up after this long.
    pub connect_timeout: Duration,
    /// `TCP_USER_TIMEOUT`: the kernel fails a connection whose sent data
    /// stays unacknowledged this long.
    pub tcp_user_timeout: Option<Duration>,
    /// Request handlers running at once (the executor's width); admitted
    /// requests beyond it wait in the scheduler. How many a peer may have
    /// admitted at once is `core.max_requests_per_peer`; beyond that its
    /// requests wait in its session, unacknowledged, holding it back.
    pub max_concurrent_requests: usize,
    /// One-way messages per peer waiting for [`crate::Endpoint::recv`];
    /// beyond it, that peer's messages wait in its session likewise.
    pub incoming_per_peer: usize,
    /// The same bound in bytes of message bodies (memory is what a peer
    /// could exhaust; a message larger than it still passes alone).
    pub incoming_bytes_per_peer: usize,
    /// The server's request scheduling. See [`SchedulerConfig`].
    pub scheduler: SchedulerConfig,
    /// The server's recovery groups and their mapping to worker pools.
    /// See [`ExecutorConfig`].
    pub executor: ExecutorConfig,
    /// The protocol core's settings ([`default_core`] unless changed).
    pub core: EndpointConfig,
    /// The failure detector: heartbeats per path over UDP (on the same
    /// address and port as each listener), SafeTimer checks and the send
    /// fence. See [`DetectorConfig`].
    pub detector: DetectorConfig,
    /// The scheduling class the detector's sender thread asks for. See
    /// [`DetectorPriority`].
    pub detector_priority: DetectorPriority,
    /// This node's key pair (`surelink keygen`). Required unless
    /// `insecure`: every path starts with a Noise handshake proving it.
    pub identity: Option<Keypair>,
    /// Who may connect: each member node's public key. Every dialled peer
    /// needs an entry; a connection proving a key not listed here is
    /// closed before anything is allocated for it.
    pub members: Members,
    /// Mutual TLS instead of member keys, for sites with a certificate
    /// authority: this node's certificate (naming
    /// [`surelink_proto::secure::node_name`]), key and trusted CA, built
    /// with [`TlsSetup::from_pem`]. When set, `identity` and `members` are
    /// not used: any node with a certificate from the CA naming it may
    /// connect, as that node.
    pub tls: Option<TlsSetup>,
    /// Encrypt frames (the default) or only authenticate them.
    pub protection: Protection,
    /// The record cipher this endpoint prefers (member keys; with `tls`,
    /// [`TlsSetup::from_pem_preferring`] sets it). An end preferring
    /// ChaCha20-Poly1305 offers both ciphers; one preferring AES-256-GCM
    /// offers it alone, exactly as builds before this setting did (so they
    /// still connect). The accepting end's preference decides when the
    /// dialler offers it. `None` (the default):
    /// [`RecordCipher::fastest_here`], AES-256-GCM on CPUs with AES
    /// instructions.
    pub record_cipher: Option<RecordCipher>,
    /// Member keys (Noise): a further path to a peer this endpoint already
    /// completed a full handshake with resumes with a ticket from it (HMAC
    /// only, no public-key work; `surelink_proto::secure::Dial`). On by
    /// default; a ticket lives in memory for an hour, and whoever reads
    /// one out of either process can read the paths resumed with it (no
    /// forward secrecy within that hour). `false`: every path runs the full
    /// handshake.
    pub resume_paths: bool,
    /// Members this server takes relayed connections from (PostMan
    /// helpers, see `surelink::Helper`): their one-way messages on
    /// `relay_channel` carry clients' connections, each authenticated end
    /// to end with the client. Empty (the default): no helper.
    pub helpers: Vec<NodeId>,
    /// The one-way channel helpers' relay records travel on (255 by
    /// default: the last of the default 256 channels), reserved on servers
    /// with `helpers` and on helpers. Must be below `core.max_channels`.
    pub relay_channel: u16,
    /// Clients' connections one helper may hold open here at once.
    pub max_slots_per_helper: usize,
    /// No handshake, no authentication, no encryption: anyone who reaches
    /// a port can join as any node and read or alter every message. For
    /// benchmarks and trusted single-host tests only; logged as a warning
    /// at start.
    pub insecure: bool,
    /// Accepted connections open at once, at most (each is a file
    /// descriptor; keep it below the process's limit, which `bind` raises
    /// to the hard limit where allowed).
    pub max_connections: usize,
    /// Accepted connections from one source address, at most.
    pub max_connections_per_ip: usize,
    /// Accepted connections still in their handshake, at most, in each of
    /// two pools: members' addresses (see `member_addrs`) and everyone
    /// else. Bounds the key exchanges strangers can make us compute, and
    /// strangers never take a member address's place.
    pub max_handshaking: usize,
    /// Of the shared pool (addresses not listed as members'), connections
    /// from one address in their handshake, at most.
    pub max_handshaking_per_ip: usize,
    /// Of the shared pool, connections from one prefix (the first
    /// `handshake_prefix_v4`/`_v6` bits of the address) in their
    /// handshake, at most: `k` prefixes hold at most `k` times this.
    pub max_handshaking_per_prefix: usize,
    /// Bits of an IPv4 address that make its prefix (24: a /24).
    pub handshake_prefix_v4: u8,
    /// Bits of an IPv6 address that make its prefix (64: a /64).
    pub handshake_prefix_v6: u8,
    /// Handshakes started per second from one prefix of the shared pool,
    /// or from one member's address (a token bucket; bursts of twice
    /// this). A connection over it is closed before any key exchange.
    pub handshake_rate: u32,
    /// Handshakes started per second by the whole shared pool (bursts of
    /// twice this): bounds the CPU strangers can make us spend on key
    /// exchanges, however many prefixes they have.
    pub handshake_rate_total: u32,
    /// Addresses members connect from, besides the peers' addresses
    /// (always included; with a cluster file, every node's addresses
    /// there). Connections from them have their own handshake pool and
    /// `member_reserve`, which strangers never take.
    pub member_addrs: Vec<IpAddr>,
    /// Of `max_connections`, kept for members' addresses (at most half of
    /// it): connections from other addresses hold at most the rest.
    pub member_reserve: usize,
    /// Accepted connections one member (its node id proved by the
    /// handshake) may hold at once, across all its sessions and
    /// incarnations; beyond it new ones are closed, the ones it has kept.
    /// `None`: [`Config::connections_per_member`]'s default.
    pub max_connections_per_member: Option<usize>,
    /// When queued messages are written: see [`WriteBatching`].
    pub write_batching: WriteBatching,
    /// The role service (hr-net's role server): the cluster's nodes and
    /// role-server candidates, the same on every node. `None` (the
    /// default): every node decides alone which paths work. With
    /// `ownership: Ownership::Elected` an external backend elects the role
    /// server and carries the tables
    /// ([`Endpoint::external_role`](crate::Endpoint::external_role)).
    pub role: Option<surelink_proto::role::RoleConfig>,
}

/// The core's defaults as the shell runs it: a LAN cluster whose paths are
/// TCP connections, with a second path to re-send on. A path's
/// retransmission floor is 20 ms instead of TCP's 200 ms and
/// acknowledgements wait at most 5 ms (they ride on replies when there are
/// any): a message caught on a failing path (one-way drop, loss) is re-sent
/// on the other path after ~25 ms, well inside the detector's 5-interval
/// path window. A premature re-send costs one duplicate, which the receiver
/// drops; a late one stalls the stream, so the floor leans short.
pub fn default_core() -> EndpointConfig {
    let mut c = EndpointConfig::default();
    c.min_rto = Duration::from_millis(20);
    c.max_ack_delay = Duration::from_millis(5);
    c
}

impl Config {
    /// Defaults for node `node` in cluster `cluster`.
    pub fn new(node: NodeId, cluster: ClusterId) -> Config {
        Config {
            node,
            cluster,
            epoch: None,
            listen: Vec::new(),
            dial_from: Vec::new(),
            devices: Vec::new(),
            peers: Vec::new(),
            connections_per_network: 1,
            reconnect_initial: Duration::from_millis(10),
            reconnect_max: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            tcp_user_timeout: Some(Duration::from_secs(5)),
            max_concurrent_requests: 4096,
            incoming_per_peer: 65_536,
            incoming_bytes_per_peer: 64 << 20,
            scheduler: SchedulerConfig::default(),
            executor: ExecutorConfig::default(),
            core: default_core(),
            detector: DetectorConfig::default(),
            detector_priority: DetectorPriority::default(),
            identity: None,
            members: Members::new(),
            tls: None,
            protection: Protection::Encrypt,
            record_cipher: None,
            resume_paths: true,
            helpers: Vec::new(),
            relay_channel: surelink_proto::helper::DEFAULT_RELAY_CHANNEL,
            max_slots_per_helper: surelink_proto::helper::DEFAULT_MAX_SLOTS,
            insecure: false,
            max_connections: 1024,
            max_connections_per_ip: 64,
            max_handshaking: 128,
            max_handshaking_per_ip: 8,
            max_handshaking_per_prefix: 16,
            handshake_prefix_v4: 24,
            handshake_prefix_v6: 64,
            handshake_rate: 32,
            handshake_rate_total: 256,
            member_addrs: Vec::new(),
            member_reserve: 256,
            max_connections_per_member: None,
            write_batching: WriteBatching::Auto,
            role: None,
        }
    }

    /// Sets this node's key pair and adds its public key to `members`.
    pub fn with_identity(mut self, keys: Keypair) -> Result<Config, ConfigError> {
        self.members
            .insert(self.node, keys.public())
            .map_err(ConfigError::Members)?;
        self.identity = Some(keys);
        Ok(self)
    }

    /// Number of networks: the longest of `listen`, `dial_from` and the
    /// peers' address lists.
    pub fn networks(&self) -> usize {
        let peers = self.peers.iter().map(|p| p.addrs.len()).max().unwrap_or(0);
        self.listen.len().max(self.dial_from.len()).max(peers)
    }

    /// Accepted connections one member may hold: `max_connections_per_member`,
    /// or by default 8 times what a peer dialling like this node needs
    /// (`networks × connections_per_network`), at least 16 — room for a
    /// restart's new connections while the old ones are still closing.
    pub fn connections_per_member(&self) -> usize {
        self.max_connections_per_member
            .unwrap_or_else(|| (8 * self.networks().max(1) * self.connections_per_network).max(16))
    }

    /// Checks every field; returns the first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.core.validate()?;
        self.detector.validate()?;
        if self.node == NodeId(0) {
            return Err(ConfigError::Invalid {
                field: "node",
                reason: "node id 0 is reserved",
            });
        }
        if let Some(r) = &self.role {
            r.validate()?;
            if !r.nodes.contains(&self.node) {
                return Err(ConfigError::Invalid {
                    field: "role.nodes",
                    reason: "this node is not one of the cluster's nodes",
                });
            }
        }
        if self.epoch == Some(Epoch(0)) {
            return Err(ConfigError::Invalid {
                field: "epoch",
                reason: "epoch 0 is reserved",
            });
        }
        if self.connections_per_network == 0 || self.connections_per_network > 64 {
            return Err(ConfigError::Invalid {
                field: "connections_per_network",
                reason: "must be 1..=64",
            });
        }
        if self.reconnect_initial.is_zero() || self.reconnect_max < self.reconnect_initial {
            return Err(ConfigError::Invalid {
                field: "reconnect_initial",
                reason: "must be non-zero and at most reconnect_max",
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                field: "connect_timeout",
                reason: "must be non-zero",
            });
        }
        if u32::from(self.relay_channel) >= self.core.max_channels {
            return Err(ConfigError::Invalid {
                field: "relay_channel",
                reason: "must be below core.max_channels",
            });
        }
        if self.max_slots_per_helper == 0 {
            return Err(ConfigError::Invalid {
                field: "max_slots_per_helper",
                reason: "must be non-zero",
            });
        }
        if self.max_concurrent_requests == 0 {
            return Err(ConfigError::Invalid {
                field: "max_concurrent_requests",
                reason: "must be non-zero",
            });
        }
        self.executor.validate(self.max_concurrent_requests)?;
        if self.max_connections == 0
            || self.max_connections_per_ip == 0
            || self.max_handshaking == 0
        {
            return Err(ConfigError::Invalid {
                field: "max_connections",
                reason:
                    "max_connections, max_connections_per_ip and max_handshaking must be non-zero",
            });
        }
        self.validate_admission()?;
        if self.incoming_per_peer == 0 || self.incoming_bytes_per_peer == 0 {
            return Err(ConfigError::Invalid {
                field: "incoming_per_peer",
                reason: "must be non-zero",
            });
        }
        if let (false, Some(t)) = (self.insecure, &self.tls) {
            if (t.cluster(), t.node()) != (self.cluster, self.node) {
                return Err(ConfigError::Invalid {
                    field: "tls",
                    reason: "the certificate setup was built for another node or cluster",
                });
            }
        }
        if !self.insecure && self.tls.is_none() {
            let Some(keys) = &self.identity else {
                return Err(ConfigError::Invalid {
                    field: "identity",
                    reason: "required unless insecure = true (generate one with `surelink keygen`)",
                });
            };
            if self
                .members
                .key_of(self.node)
                .is_some_and(|k| *k != keys.public())
            {
                return Err(ConfigError::Invalid {
                    field: "members",
                    reason: "this node's entry is not the public key of `identity`",
                });
            }
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.peers {
            if !self.insecure && self.tls.is_none() && self.members.key_of(p.node).is_none() {
                return Err(ConfigError::Peer {
                    node: p.node,
                    reason: "has no public key in `members`",
                });
            }
            if p.node == self.node {
                return Err(ConfigError::Peer {
                    node: p.node,
                    reason: "a peer cannot have this node's id",
                });
            }
            if !seen.insert(p.node) {
                return Err(ConfigError::Peer {
                    node: p.node,
                    reason: "listed twice",
                });
            }
            if p.addrs.iter().all(Option::is_none) {
                return Err(ConfigError::Peer {
                    node: p.node,
                    reason: "has no address on any network",
                });
            }
            for (i, a) in p.addrs.iter().enumerate() {
                if a.is_some() && self.local_addr(i).is_none() {
                    return Err(ConfigError::Peer {
                        node: p.node,
                        reason: "has an address on a network this node has no local address for",
                    });
                }
            }
        }
        Ok(())
    }

    fn validate_admission(&self) -> Result<(), ConfigError> {
        let bad = |field, reason| Err(ConfigError::Invalid { field, reason });
        if self.max_handshaking_per_ip == 0 || self.max_handshaking_per_prefix == 0 {
            return bad(
                "max_handshaking_per_ip",
                "max_handshaking_per_ip and max_handshaking_per_prefix must be non-zero",
            );
        }
        if self.handshake_prefix_v4 > 32 || self.handshake_prefix_v6 > 128 {
            return bad(
                "handshake_prefix_v4",
                "handshake_prefix_v4 must be at most 32, handshake_prefix_v6 at most 128",
            );
        }
        if self.handshake_rate == 0 || self.handshake_rate_total == 0 {
            return bad(
                "handshake_rate",
                "handshake_rate and handshake_rate_total must be non-zero",
            );
        }
        if self.max_connections_per_member == Some(0) {
            return bad("max_connections_per_member", "must be non-zero");
        }
        Ok(())
    }

    /// The local address to use on network `i` (its port is ignored when dialling).
    pub fn local_addr(&self, i: usize) -> Option<SocketAddr> {
        self.listen
            .get(i)
            .or_else(|| self.dial_from.get(i))
            .copied()
    }
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting of the protocol core.
    #[error("core: {0}")]
    Core(#[from] surelink_proto::ConfigError),
    /// A field of the shell configuration.
    #[error("`{field}`: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The member list.
    #[error("members: {0}")]
    Members(#[from] surelink_proto::secure::MemberError),
    /// The recovery groups (`executor`).
    #[error("executor: {0}")]
    Recovery(#[from] RecoveryConfigError),
    /// The role service's configuration.
    #[error("role: {0}")]
    Role(#[from] surelink_proto::role::RoleConfigError),
    /// A peer entry.
    #[error("peer {node}: {reason}")]
    Peer {
        /// The peer.
        node: NodeId,
        /// What is wrong.
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = Config::new(NodeId(1), ClusterId(1));
        c.listen = vec![addr("127.0.1.1:0")];
        c.peers = vec![PeerConfig::new(
            NodeId(2),
            vec![Some(addr("127.0.1.2:7000"))],
        )];
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Invalid {
                field: "identity",
                ..
            })
        ));
        let mut c = c.with_identity(Keypair::generate().unwrap()).unwrap();
        assert_eq!(
            c.validate(),
            Err(ConfigError::Peer {
                node: NodeId(2),
                reason: "has no public key in `members`"
            })
        );
        let mut insecure = c.clone();
        insecure.insecure = true;
        insecure.validate().unwrap();
        let peer = Keypair::generate().unwrap();
        c.members.insert(NodeId(2), peer.public()).unwrap();
        c.validate().unwrap();
        let mut bad = c.clone();
        bad.identity = Some(peer);
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::Invalid {
                field: "members",
                ..
            })
        ));
        let mut bad = c.clone();
        bad.peers.push(bad.peers[0].clone());
        assert_eq!(
            bad.validate(),
            Err(ConfigError::Peer {
                node: NodeId(2),
                reason: "listed twice"
            })
        );
        let mut bad = c.clone();
        bad.peers[0].addrs.push(Some(addr("127.0.2.2:7000")));
        assert!(matches!(bad.validate(), Err(ConfigError::Peer { .. })));
        let mut bad = c.clone();
        bad.core.max_channels = 0;
        assert!(matches!(bad.validate(), Err(ConfigError::Core(_))));
        let mut bad = c;
        bad.connections_per_network = 0;
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::Invalid {
                field: "connections_per_network",
                ..
            })
        ));
    }
}
