//! The serde form of a configuration file: every field the file may
//! hold, unknown ones refused. [`super::parse`] turns it into a
//! [`surelink::Config`]; nothing here checks values.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) node: u64,
    /// Required without a cluster file; with one, its cluster (and then
    /// redundant here).
    pub(super) cluster: Option<u64>,
    pub(super) epoch: Option<u64>,
    /// `None`: this node's `addrs` in the cluster file (none without one).
    pub(super) listen: Option<Vec<SocketAddr>>,
    #[serde(default)]
    pub(super) dial_from: Vec<SocketAddr>,
    /// Interface per network ("" for none).
    #[serde(default)]
    pub(super) devices: Vec<String>,
    pub(super) connections_per_network: Option<usize>,
    pub(super) reconnect_initial_ms: Option<u64>,
    pub(super) reconnect_max_ms: Option<u64>,
    pub(super) tcp_user_timeout_ms: Option<u64>,
    /// `None`: this node's `metrics` in the cluster file (none without one).
    pub(super) metrics: Option<SocketAddr>,
    pub(super) key_file: Option<PathBuf>,
    /// The cluster file (nodes, keys, role service); relative to this file.
    pub(super) cluster_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) insecure: bool,
    pub(super) protection: Option<String>,
    /// `None`: the faster cipher on this CPU.
    pub(super) record_cipher: Option<String>,
    /// `None`: resume further paths with tickets (the default).
    pub(super) resume_paths: Option<bool>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_connections_per_ip: Option<usize>,
    pub(super) max_handshaking: Option<usize>,
    pub(super) max_handshaking_per_ip: Option<usize>,
    pub(super) max_handshaking_per_prefix: Option<usize>,
    pub(super) handshake_prefix_v4: Option<u8>,
    pub(super) handshake_prefix_v6: Option<u8>,
    pub(super) handshake_rate: Option<u32>,
    pub(super) handshake_rate_total: Option<u32>,
    /// Addresses members connect from besides the peers' (and, with a
    /// cluster file, every node's there).
    #[serde(default)]
    pub(super) member_addrs: Vec<std::net::IpAddr>,
    pub(super) member_reserve: Option<usize>,
    pub(super) max_connections_per_member: Option<usize>,
    /// `auto`, `idle` or `turn` (see `surelink::WriteBatching`).
    pub(super) write_batching: Option<String>,
    #[serde(default)]
    pub(super) runtime: RuntimeSection,
    #[serde(default)]
    pub(super) members: Vec<Member>,
    #[serde(default)]
    pub(super) peers: Vec<Peer>,
    #[serde(default)]
    pub(super) core: Core,
    #[serde(default)]
    pub(super) detector: Detector,
    pub(super) tls: Option<Tls>,
    /// `surelink cache node`: the node's store.
    pub(super) cache: Option<CacheSection>,
    /// `surelink cache proxy`: where clients connect and which nodes serve.
    pub(super) proxy: Option<ProxySection>,
    /// Members this server takes relayed connections from (helpers).
    #[serde(default)]
    pub(super) helpers: Vec<u64>,
    /// The channel helpers' relay records travel on (default 255).
    pub(super) relay_channel: Option<u16>,
    /// Clients' connections one helper may hold open here (default 4096).
    pub(super) max_slots_per_helper: Option<usize>,
    /// `surelink helper`: where clients connect and how it batches.
    pub(super) helper: Option<HelperSection>,
    /// Paths to servers through helpers, kept from the start.
    #[serde(default)]
    pub(super) relays: Vec<RelaySection>,
}

/// `[helper]`: a helper's listener and batching (`surelink helper`).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HelperSection {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// `self_clocking` (default) or `adaptive` (PostMan's Algorithm 1).
    pub policy: Option<String>,
    /// Largest batch, bytes (default 65536).
    pub max_frame: Option<usize>,
    /// Self-clocking: the longest a record waits, µs (default 1000).
    pub max_wait_us: Option<u64>,
    /// The address clients list this helper by, reported with its load
    /// to the role service (default: `listen`, unless that is a wildcard
    /// address, which then is not reported).
    pub advertise: Option<SocketAddr>,
}

/// `[[relays]]`: a path to `server` through the helper at `helper`,
/// dialled from this node's address on `network`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RelaySection {
    /// The server.
    pub server: u64,
    /// The helper's `[helper] listen` address.
    pub helper: SocketAddr,
    /// The network to dial from (default 0).
    #[serde(default)]
    pub network: usize,
}

/// `[runtime]`: the process's tokio runtime.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RuntimeSection {
    /// Threads that run the endpoint's tasks (default: the command's).
    pub worker_threads: Option<usize>,
}

impl RuntimeSection {
    /// Most worker threads accepted (well beyond any machine's cores).
    pub const MAX_WORKERS: usize = 1024;

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        match self.worker_threads {
            Some(n) if !(1..=Self::MAX_WORKERS).contains(&n) => Err(ConfigError::WorkerThreads {
                value: n,
                max: Self::MAX_WORKERS,
            }),
            _ => Ok(()),
        }
    }
}

/// `[cache]`: a cache node's store.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CacheSection {
    /// Memory for items, MiB (memcached's `-m`, default 64).
    pub memory_mb: Option<u64>,
    /// Largest item, bytes (memcached's `-I`, default 1 MiB).
    pub max_item: Option<usize>,
    /// `memcached://host:port`: front that memcached instead of holding
    /// items (default: the embedded store).
    pub backend: Option<String>,
    /// Pipelined connections to the backend memcached (default 1).
    pub backend_connections: Option<usize>,
    /// Shards of the embedded store, each a recovery group (default 8,
    /// at most 256): a shard whose command fails is emptied and brought
    /// back while the others serve.
    pub shards: Option<usize>,
}

/// `[proxy]`: the memcached-protocol listener of a proxy.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ProxySection {
    /// Where memcached clients connect.
    pub listen: SocketAddr,
    /// The cache nodes (default: every peer — with a cluster file, every
    /// node there with addresses).
    #[serde(default)]
    pub nodes: Vec<u64>,
    /// Largest item, bytes (default: the proxy's).
    pub max_item: Option<usize>,
    /// Most client connections at once (default: the proxy's).
    pub max_clients: Option<usize>,
    /// Most requests of one client in flight (default: the proxy's).
    pub max_pipeline: Option<usize>,
    /// A request's deadline at the nodes, ms (default: the proxy's).
    pub call_timeout_ms: Option<u64>,
    /// Most client connections from one source address (default: the
    /// proxy's).
    pub max_clients_per_addr: Option<usize>,
    /// Seconds a client may stay idle before it is closed; 0: never
    /// (default: the proxy's).
    pub idle_timeout_secs: Option<u64>,
    /// A client's outstanding reply bytes (default: the proxy's).
    pub max_reply_bytes: Option<usize>,
    /// Nodes holding each key: 1 (the default) as memcached, 2 or more a
    /// replicated pool (writes to every replica, reads from one).
    pub replicas: Option<usize>,
    /// PostMan helpers' relay addresses (`surelink helper`'s `[helper]
    /// listen`): the proxy goes through one to a node whose call p99
    /// stays above `helper_sla_ms` (default: none, always direct).
    #[serde(default)]
    pub helpers: Vec<SocketAddr>,
    /// The p99 (ms) of calls to a node above which the proxy moves to a
    /// helper (default: activation's, 2 ms; back direct under half).
    pub helper_sla_ms: Option<u64>,
}

/// Mutual TLS instead of member keys (paths relative to the file).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct Tls {
    /// This node's certificate chain, PEM, leaf first.
    pub(super) cert: PathBuf,
    /// Its private key, PEM.
    pub(super) key: PathBuf,
    /// The CA certificates to trust, PEM.
    pub(super) ca: PathBuf,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Detector {
    pub(super) mode: Option<String>,
    pub(super) interval_ms: Option<u64>,
    pub(super) path_timeout_ms: Option<u64>,
    pub(super) idle_interval_ms: Option<u64>,
    pub(super) idle_path_timeout_ms: Option<u64>,
    pub(super) busy_linger_ms: Option<u64>,
    pub(super) answer_grace_ms: Option<u64>,
    pub(super) answer_grace_max_ms: Option<u64>,
    pub(super) slow_after_ms: Option<u64>,
    pub(super) slow_factor: Option<u32>,
    pub(super) probe_peers: Option<usize>,
    pub(super) crowd_budget: Option<u32>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) send_slack_ms: Option<u64>,
    pub(super) max_network_delay_ms: Option<u64>,
    pub(super) check_every_ms: Option<u64>,
    pub(super) barrier_timeout_ms: Option<u64>,
    pub(super) data_as_heartbeat: Option<bool>,
    pub(super) standby_interval_ms: Option<u64>,
    pub(super) sender_priority: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct Member {
    pub(super) node: u64,
    pub(super) public_key: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct Peer {
    pub(super) node: u64,
    pub(super) addrs: Vec<String>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Core {
    pub(super) max_message_size: Option<u32>,
    pub(super) send_buffer: Option<u64>,
    pub(super) recv_window: Option<u32>,
    pub(super) max_channels: Option<u32>,
    pub(super) linger_ms: Option<u64>,
    pub(super) min_rto_ms: Option<u64>,
    pub(super) max_rto_ms: Option<u64>,
    pub(super) max_probe_interval_ms: Option<u64>,
    pub(super) max_ack_delay_us: Option<u64>,
    pub(super) handshake_timeout_ms: Option<u64>,
    pub(super) path_keepalive_ms: Option<u64>,
    pub(super) path_idle_timeout_ms: Option<u64>,
    pub(super) call_bytes_per_peer: Option<u64>,
}
