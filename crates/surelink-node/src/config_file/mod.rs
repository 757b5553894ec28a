//! The TOML form of a process's configuration, read by every daemon
//! (`serve`, `call`, `cache node|proxy`, `role-server`): [`load`] a file,
//! or [`parse`] text, into a [`Loaded`]. Only syntax and values are
//! checked here; nothing is bound or dialled.
//!
//! In a cluster, a process's file names the cluster file and says only
//! what is its own; the cluster file gives the cluster id, this node's
//! listen and metrics addresses, every node's key (the members), whom to
//! dial (the peers) and the role service ([`crate::cluster_file`]; the
//! rules, and how entries that repeat it are checked, are in `join.rs`):
//!
//! ```toml
//! node = 1
//! key_file = "node1.key"          # this node's secret (surelink keygen --out); relative to this file
//! cluster_file = "cluster.toml"   # relative to this file
//! # listen = [...]                # default: this node's addrs in the cluster file (where the
//! # metrics = "…"                 #   others dial it), metrics likewise; set to bind other ones
//!
//! [cache]                         # or [proxy], or nothing (serve, role-server)
//! memory_mb = 64
//! ```
//!
//! Without a cluster file, the file lists everything itself:
//!
//! ```toml
//! node = 1
//! cluster = 7                     # required without cluster_file
//! key_file = "node1.key"
//! # protection = "integrity_only"  # default "encrypt"
//! # record_cipher = "chacha20-poly1305"  # preferred; default: the faster here (aes-256-gcm with AES instructions)
//! # resume_paths = false           # default true: further paths to a peer resume with a ticket
//! # insecure = true                # no authentication or encryption: benchmarks only
//! listen = ["127.0.1.1:7100", "127.0.2.1:7100"]   # one per network
//! # dial_from = ["127.0.1.9:0", "127.0.2.9:0"]     # clients without listeners
//! connections_per_network = 1
//! metrics = "127.0.0.1:9100"                        # optional Prometheus port
//!
//! # [tls]                         # instead of key_file and [[members]]: mutual TLS
//! # cert = "node-1.crt"           # naming node-1.cluster-7.surelink (surelink certs)
//! # key = "node-1.key.pem"
//! # ca = "ca.crt"
//!
//! [[members]]                     # every node that may connect, and its public key
//! node = 2
//! public_key = "…"                # from `surelink keygen`
//!
//! [[peers]]                       # nodes this one dials (each needs a member entry)
//! node = 2
//! addrs = ["127.0.1.2:7100", "127.0.2.2:7100"]     # "" where not attached
//! ```
//!
//! Either way, any process may also set:
//!
//! ```toml
//! # max_connections = 1024; max_connections_per_ip = 64; max_handshaking = 128
//! # max_handshaking_per_ip = 8; max_handshaking_per_prefix = 16   # strangers, per address / prefix
//! # handshake_prefix_v4 = 24; handshake_prefix_v6 = 64
//! # handshake_rate = 32; handshake_rate_total = 256                # handshakes/s: per prefix, all strangers
//! # member_addrs = ["10.0.0.7"]   # members' addresses besides the peers' (and the cluster file's)
//! # member_reserve = 256          # of max_connections, kept for members' addresses
//! # max_connections_per_member = 16   # default: 8 × networks × connections_per_network, at least 16
//! # write_batching = "auto"       # or "idle", "turn": when queued messages are written
//!
//! # [runtime]                     # the process's tokio runtime
//! # worker_threads = 1            # default: 1 for `cache node|proxy` (one event loop), 2 otherwise; at most the CPUs the process may use
//!
//! [core]                                            # all optional
//! linger_ms = 30000
//! min_rto_ms = 20                                   # the shell default (core: 200)
//! max_probe_interval_ms = 50                        # an unanswered path is PINGed at least this often
//! send_buffer = 16777216
//! path_keepalive_ms = 15000                         # PING on a path quiet this long
//! path_idle_timeout_ms = 60000                      # close a path silent this long
//! call_bytes_per_peer = 16777216                    # a peer's admitted requests + replies waiting
//!
//! [detector]                                        # all optional; defaults shown
//! mode = "safetimer"                                # or "plain", "off"
//! interval_ms = 10                                  # busy pace; given: the others scale with it
//! path_timeout_ms = 50                              # a busy pair's path window
//! idle_interval_ms = 400                            # the fence's pace, every peer
//! idle_path_timeout_ms = 1200                       # an idle pair's path window
//! busy_linger_ms = 1000                             # a dense pair: busy this long after its last send
//! answer_grace_ms = 10                              # busy only while a call waits this long, or dense (0: linger)
//! answer_grace_max_ms = 200                         # a slow peer's grace grows with its answers up to this (at most idle_interval_ms)
//! slow_after_ms = 10000                             # a pair quiet this long is slow (0: off)
//! slow_factor = 4                                   # then: one fence round in this many goes to it
//! probe_peers = 8                                   # a path report probes this many peers of its network
//! crowd_budget = 2000                               # busy-pace heartbeats a second per network, all peers (0: no cap)
//! timeout_ms = 2000
//! send_slack_ms = 1500
//! max_network_delay_ms = 10
//! data_as_heartbeat = true                          # busy pairs' data stands in for heartbeats
//! standby_interval_ms = 20                          # then: a busy pair's path without data
//! sender_priority = "unchanged"                     # or "raised": the heartbeat sender's class
//!                                                   #   (SCHED_RR 1, else nice -20, where allowed)
//!
//! [cache]                                           # `surelink cache node`
//! memory_mb = 64                                    # item memory (memcached -m)
//! max_item = 1048576                                # memcached -I
//! # shards = 8                                      # store shards = recovery groups (1..=256)
//! # backend = "memcached://127.0.0.1:11211"         # front a local memcached instead
//! # backend_connections = 1
//!
//! [proxy]                                           # `surelink cache proxy`
//! listen = "127.0.0.1:11311"                        # memcached clients connect here
//! nodes = [1, 2, 3]                                 # default: every peer (with a cluster
//!                                                   #   file: every node there with addrs)
//! # max_clients = 10000; max_pipeline = 128; call_timeout_ms = 5000
//! # max_clients_per_addr = 1024; idle_timeout_secs = 600; max_reply_bytes = 16777216
//! # replicas = 1                                   # 2+: a replicated pool (docs/cache.md)
//! ```
//!
//! A file written before cluster files said less still loads: entries
//! that repeat the cluster file (`cluster`, `listen`, `metrics`, a
//! `[[members]]` key, a `[[peers]]` entry) are accepted with one warning
//! naming them; one that contradicts it is refused, naming both values.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use surelink::proto::{ClusterId, Epoch, NodeId};
use surelink::{Config, DetectorConfig, DetectorMode, PeerConfig, Protection, WriteBatching};
use tracing::warn;

use crate::cluster_file::Cluster;

mod error;
mod join;
mod schema;

pub use error::{ConfigError, LoadError};
pub use join::Redundant;
pub use schema::{CacheSection, HelperSection, ProxySection, RelaySection, RuntimeSection};

/// A parsed configuration plus what only the daemons read.
#[derive(Debug)]
#[non_exhaustive]
pub struct Loaded {
    /// The endpoint's configuration, validated.
    pub config: Config,
    /// Where to serve Prometheus `/metrics` (and `/role`).
    pub metrics: Option<SocketAddr>,
    /// `[cache]`: a cache node's store.
    pub cache: Option<CacheSection>,
    /// `[proxy]`: a cache proxy's listener.
    pub proxy: Option<ProxySection>,
    /// `[helper]`: a helper's listener and batching.
    pub helper: Option<HelperSection>,
    /// `[[relays]]`: paths to servers through helpers.
    pub relays: Vec<RelaySection>,
    /// The cluster file, when the configuration names one.
    pub cluster: Option<Cluster>,
    /// Where it was read from.
    pub cluster_file: Option<PathBuf>,
    /// The entries of the file that only repeat the cluster file
    /// (accepted; the loader warns once).
    pub redundant: Vec<Redundant>,
}

impl Loaded {
    /// A proxy's ring: `[proxy] nodes`, or else every peer (with a
    /// cluster file, every node there with addresses); empty without a
    /// `[proxy]` section.
    pub fn ring(&self) -> Vec<NodeId> {
        match &self.proxy {
            None => Vec::new(),
            Some(p) if p.nodes.is_empty() => self.config.peers.iter().map(|x| x.node).collect(),
            Some(p) => p.nodes.iter().map(|&n| NodeId(n)).collect(),
        }
    }
}

/// Only the `[runtime]` section of a configuration file, read before the
/// runtime it describes is built (the whole file is checked afterwards,
/// by [`load`]).
pub fn runtime(path: &Path) -> Result<RuntimeSection, LoadError> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        runtime: RuntimeSection,
    }
    let text = read(path)?;
    let invalid = |source| LoadError::Invalid {
        path: path.to_path_buf(),
        source,
    };
    let only: Only = toml::from_str(&text).map_err(|e| invalid(e.into()))?;
    only.runtime.check().map_err(invalid)?;
    Ok(only.runtime)
}

/// Reads and checks the configuration file `path`; the files it names
/// (`key_file`, `cluster_file`, `[tls]`) are relative to its directory.
/// Entries that only repeat the cluster file are listed in
/// [`Loaded::redundant`] and warned about once, naming `path`.
pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    let text = read(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let loaded = parse_only(&text, base).map_err(|source| LoadError::Invalid {
        path: path.to_path_buf(),
        source,
    })?;
    warn_redundant(&path.display().to_string(), &loaded);
    Ok(loaded)
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses a configuration; relative paths (`key_file`, `cluster_file`,
/// `[tls]`) are taken from `base`. Entries that only repeat the cluster
/// file are listed in [`Loaded::redundant`] and warned about once.
pub fn parse(text: &str, base: &Path) -> Result<Loaded, ConfigError> {
    let loaded = parse_only(text, base)?;
    warn_redundant("the configuration", &loaded);
    Ok(loaded)
}

/// One warning listing the entries of `file` that only repeat its cluster
/// file.
fn warn_redundant(file: &str, l: &Loaded) {
    if let (false, Some(cf)) = (l.redundant.is_empty(), &l.cluster_file) {
        let list: Vec<String> = l.redundant.iter().map(ToString::to_string).collect();
        warn!(
            "{file}: {} only repeat the cluster file {}: they can be removed",
            list.join(", "),
            cf.display()
        );
    }
}

/// The admission limits of [`surelink::Config`] the file sets.
fn admission(c: &mut Config, f: &schema::File) {
    let set = |v: Option<usize>, to: &mut usize| {
        if let Some(v) = v {
            *to = v;
        }
    };
    set(f.max_handshaking_per_ip, &mut c.max_handshaking_per_ip);
    set(
        f.max_handshaking_per_prefix,
        &mut c.max_handshaking_per_prefix,
    );
    set(f.member_reserve, &mut c.member_reserve);
    if let Some(v) = f.handshake_prefix_v4 {
        c.handshake_prefix_v4 = v;
    }
    if let Some(v) = f.handshake_prefix_v6 {
        c.handshake_prefix_v6 = v;
    }
    if let Some(v) = f.handshake_rate {
        c.handshake_rate = v;
    }
    if let Some(v) = f.handshake_rate_total {
        c.handshake_rate_total = v;
    }
    c.member_addrs.extend(&f.member_addrs);
    if f.max_connections_per_member.is_some() {
        c.max_connections_per_member = f.max_connections_per_member;
    }
}

/// [`parse`] without the warning (its caller names the file in it).
fn parse_only(text: &str, base: &Path) -> Result<Loaded, ConfigError> {
    let f: schema::File = toml::from_str(text)?;
    let mut redundant = Vec::new();
    let cluster_file = match &f.cluster_file {
        Some(p) => {
            let path = base.join(p);
            match Cluster::load(&path) {
                Ok(cl) => Some((path, cl)),
                Err(source) => return Err(ConfigError::ClusterFile { path, source }),
            }
        }
        None => None,
    };
    let cluster = match (&cluster_file, f.cluster) {
        (Some((path, cl)), own) => join::cluster_id(own, cl, path, &mut redundant)?,
        (None, Some(id)) => id,
        (None, None) => return Err(ConfigError::NoCluster),
    };
    let mut c = Config::new(NodeId(f.node), ClusterId(cluster));
    c.insecure = f.insecure;
    if let Some(p) = &f.protection {
        c.protection = match p.as_str() {
            "encrypt" => Protection::Encrypt,
            "integrity_only" => Protection::IntegrityOnly,
            other => return Err(ConfigError::Protection(other.to_string())),
        };
    }
    if let Some(r) = &f.record_cipher {
        c.record_cipher = Some(
            r.parse()
                .map_err(|_| ConfigError::RecordCipher(r.clone()))?,
        );
    }
    if let Some(r) = f.resume_paths {
        c.resume_paths = r;
    }
    if let (Some(t), false) = (&f.tls, f.insecure) {
        let read = |p: &Path, what: &'static str| {
            let path = base.join(p);
            std::fs::read(&path).map_err(|source| ConfigError::TlsFile { what, path, source })
        };
        c.tls = Some(
            surelink::proto::secure::TlsSetup::from_pem_preferring(
                c.cluster,
                c.node,
                &read(&t.cert, "certificate")?,
                &read(&t.key, "key")?,
                &read(&t.ca, "CA bundle")?,
                c.record_cipher
                    .unwrap_or_else(surelink::proto::secure::RecordCipher::fastest_here),
            )
            .map_err(ConfigError::Tls)?,
        );
    }
    match (&f.key_file, f.insecure) {
        (Some(k), _) => {
            c.identity = Some(crate::keys::read_secret(&base.join(k))?);
        }
        (None, false) if f.tls.is_some() => {}
        (None, false) => return Err(ConfigError::NoKey { node: f.node }),
        (None, true) => {}
    }
    if let Some(k) = &c.identity {
        c.members
            .insert(c.node, k.public())
            .map_err(ConfigError::OwnKey)?;
    }
    let mut members = Vec::with_capacity(f.members.len());
    for m in &f.members {
        let key = crate::keys::parse_public(&m.public_key, &format!("member {}", m.node))?;
        c.members
            .insert(NodeId(m.node), key)
            .map_err(|source| ConfigError::Member {
                node: m.node,
                source,
            })?;
        members.push((NodeId(m.node), key));
    }
    if let Some(v) = f.max_connections {
        c.max_connections = v;
    }
    if let Some(v) = f.max_connections_per_ip {
        c.max_connections_per_ip = v;
    }
    if let Some(v) = f.max_handshaking {
        c.max_handshaking = v;
    }
    admission(&mut c, &f);
    if let Some(w) = &f.write_batching {
        c.write_batching = match w.as_str() {
            "auto" => WriteBatching::Auto,
            "idle" => WriteBatching::Idle,
            "turn" => WriteBatching::Turn,
            other => return Err(ConfigError::WriteBatching(other.to_string())),
        };
    }
    f.runtime.check()?;
    c.epoch = f.epoch.map(Epoch);
    c.listen = f.listen.clone().unwrap_or_default();
    c.dial_from = f.dial_from;
    c.devices = f
        .devices
        .into_iter()
        .map(|d| (!d.is_empty()).then_some(d))
        .collect();
    if let Some(n) = f.connections_per_network {
        c.connections_per_network = n;
    }
    let ms = Duration::from_millis;
    if let Some(v) = f.reconnect_initial_ms {
        c.reconnect_initial = ms(v);
    }
    if let Some(v) = f.reconnect_max_ms {
        c.reconnect_max = ms(v);
    }
    if let Some(v) = f.tcp_user_timeout_ms {
        c.tcp_user_timeout = (v > 0).then(|| ms(v));
    }
    for p in f.peers {
        let addrs = parse_addrs(&p.addrs)
            .map_err(|addr| ConfigError::PeerAddress { node: p.node, addr })?;
        c.peers.push(PeerConfig::new(NodeId(p.node), addrs));
    }
    c.helpers = f.helpers.iter().map(|&n| NodeId(n)).collect();
    if let Some(v) = f.relay_channel {
        c.relay_channel = v;
    }
    if let Some(v) = f.max_slots_per_helper {
        c.max_slots_per_helper = v;
    }
    core(&mut c, f.core);
    detector(&mut c, f.detector)?;
    let mut metrics = f.metrics;
    if let Some((path, cl)) = &cluster_file {
        let own_dial_from = c.dial_from.clone();
        let own = join::Own {
            listen: f.listen.as_deref(),
            metrics: f.metrics,
            dial_from: (!own_dial_from.is_empty()).then_some(own_dial_from.as_slice()),
            members: &members,
            proxy: f.proxy.is_some(),
        };
        metrics = join::join(&mut c, &own, cl, path, &mut redundant)?;
        if let Some(p) = &f.proxy {
            join::check_ring(&p.nodes, cl, path)?;
        }
    }
    c.validate()?;
    let (cluster_file, cluster) = cluster_file.unzip();
    let loaded = Loaded {
        config: c,
        metrics,
        cache: f.cache,
        proxy: f.proxy,
        helper: f.helper,
        relays: f.relays,
        cluster,
        cluster_file,
        redundant,
    };
    if loaded.proxy.is_some() && loaded.ring().is_empty() {
        return Err(ConfigError::ProxyNoNodes);
    }
    Ok(loaded)
}

/// `[core]`: the protocol core's settings (every one optional).
fn core(c: &mut Config, core: schema::Core) {
    let ms = Duration::from_millis;
    let k = &mut c.core;
    if let Some(v) = core.max_message_size {
        k.max_message_size = v;
    }
    if let Some(v) = core.send_buffer {
        k.send_buffer = v;
    }
    if let Some(v) = core.recv_window {
        k.recv_window = v;
    }
    if let Some(v) = core.max_channels {
        k.max_channels = v;
    }
    if let Some(v) = core.linger_ms {
        k.linger = ms(v);
    }
    if let Some(v) = core.min_rto_ms {
        k.min_rto = ms(v);
    }
    if let Some(v) = core.max_rto_ms {
        k.max_rto = ms(v);
    }
    if let Some(v) = core.max_probe_interval_ms {
        k.max_probe_interval = ms(v);
    }
    if let Some(v) = core.max_ack_delay_us {
        k.max_ack_delay = Duration::from_micros(v);
    }
    if let Some(v) = core.handshake_timeout_ms {
        k.handshake_timeout = ms(v);
    }
    if let Some(v) = core.path_keepalive_ms {
        k.path_keepalive = ms(v);
    }
    if let Some(v) = core.path_idle_timeout_ms {
        k.path_idle_timeout = ms(v);
    }
    if let Some(v) = core.call_bytes_per_peer {
        k.call_bytes_per_peer = v;
    }
}

/// `[detector]`: `interval_ms` first (the others scale with it), then the
/// mode and each window given.
fn detector(c: &mut Config, d: schema::Detector) -> Result<(), ConfigError> {
    let ms = Duration::from_millis;
    if let Some(h) = d.interval_ms {
        let (mode, slow) = (c.detector.mode, c.detector.slow_after);
        let grace = c.detector.answer_grace.is_some();
        c.detector = DetectorConfig::with_interval(ms(h));
        c.detector.mode = mode;
        c.detector.slow_after = slow;
        // The grace is one interval, as by default.
        c.detector.answer_grace = grace.then(|| ms(h));
    }
    if let Some(m) = d.mode {
        c.detector.mode = match m.as_str() {
            "safetimer" => DetectorMode::SafeTimer,
            "plain" => DetectorMode::Plain,
            "off" => DetectorMode::Off,
            other => return Err(ConfigError::DetectorMode(other.to_string())),
        };
    }
    let det = &mut c.detector;
    for (v, field) in [
        (d.path_timeout_ms, &mut det.path_timeout),
        (d.idle_interval_ms, &mut det.idle_interval),
        (d.idle_path_timeout_ms, &mut det.idle_path_timeout),
        (d.busy_linger_ms, &mut det.busy_linger),
        (d.timeout_ms, &mut det.timeout),
        (d.send_slack_ms, &mut det.send_slack),
        (d.max_network_delay_ms, &mut det.max_network_delay),
        (d.check_every_ms, &mut det.check_every),
        (d.barrier_timeout_ms, &mut det.barrier_timeout),
        (d.standby_interval_ms, &mut det.standby_interval),
    ] {
        if let Some(v) = v {
            *field = ms(v);
        }
    }
    if let Some(on) = d.data_as_heartbeat {
        det.data_as_heartbeat = on;
    }
    if let Some(g) = d.answer_grace_ms {
        det.answer_grace = (g > 0).then(|| ms(g));
    }
    // Not given: the default (200 ms), never below the grace nor above
    // the idle interval.
    det.answer_grace_max = d.answer_grace_max_ms.map_or_else(
        || {
            DetectorConfig::default()
                .answer_grace_max
                .min(det.idle_interval)
                .max(det.answer_grace.unwrap_or_default())
        },
        ms,
    );
    match d.slow_after_ms {
        Some(a) => det.slow_after = (a > 0).then(|| ms(a)),
        // Not given: as configured before (10 s by default), after five
        // idle rounds at least (a longer idle pace keeps it valid).
        None => det.slow_after = det.slow_after.map(|s| s.max(det.idle_interval * 5)),
    }
    if let Some(f) = d.slow_factor {
        det.slow_factor = f;
    }
    if let Some(n) = d.probe_peers {
        det.probe_peers = n;
    }
    if let Some(b) = d.crowd_budget {
        // 0 turns the budget off: every busy peer at the busy pace.
        det.crowd_budget = (b > 0).then_some(b);
    }
    if let Some(p) = &d.sender_priority {
        c.detector_priority = match p.as_str() {
            "raised" => surelink::DetectorPriority::Raised,
            "unchanged" => surelink::DetectorPriority::Unchanged,
            other => return Err(ConfigError::SenderPriority(other.to_string())),
        };
    }
    Ok(())
}

/// A node's address per network (`""` where it is not attached); the
/// text that does not parse as the error.
pub fn parse_addrs(list: &[String]) -> Result<Vec<Option<SocketAddr>>, String> {
    list.iter()
        .map(|a| match a.as_str() {
            "" => Ok(None),
            a => a.parse().map(Some).map_err(|_| a.to_string()),
        })
        .collect()
}
