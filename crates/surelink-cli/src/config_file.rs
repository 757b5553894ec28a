//! The TOML form of an endpoint's configuration, read by `serve` and `call`.
//!
//! ```toml
//! node = 1
//! cluster = 7
//! key_file = "node1.key"          # this node's secret (surelink keygen --out); relative to this file
//! # protection = "integrity_only"  # default "encrypt"
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
//!
//! # max_connections = 1024; max_connections_per_ip = 64; max_handshaking = 128
//! # write_batching = "auto"       # or "idle", "turn": when queued messages are written
//!
//! # [runtime]                     # the process's tokio runtime
//! # worker_threads = 1            # default: 1 for `cache node|proxy` (one event loop), 2 otherwise
//!
//! [core]                                            # all optional
//! linger_ms = 30000
//! min_rto_ms = 20                                   # the shell default (core: 200)
//! send_buffer = 16777216
//! path_keepalive_ms = 15000                         # PING on a path quiet this long
//! path_idle_timeout_ms = 60000                      # close a path silent this long
//!
//! [detector]                                        # all optional
//! mode = "safetimer"                                # or "plain", "off"
//! interval_ms = 10                                  # others scale with it
//! path_timeout_ms = 50
//! timeout_ms = 150
//! send_slack_ms = 100
//! max_network_delay_ms = 10
//!
//! [cache]                                           # `surelink cache node`
//! memory_mb = 64                                    # item memory (memcached -m)
//! max_item = 1048576                                # memcached -I
//! # backend = "memcached://127.0.0.1:11211"         # front a local memcached instead
//! # backend_connections = 1
//!
//! [proxy]                                           # `surelink cache proxy`
//! listen = "127.0.0.1:11311"                        # memcached clients connect here
//! nodes = [1, 2, 3]                                 # default: every [[peers]] node
//! # max_clients = 10000; max_pipeline = 128; call_timeout_ms = 5000
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;
use surelink::proto::{ClusterId, Epoch, NodeId};
use surelink::{Config, DetectorConfig, DetectorMode, PeerConfig, Protection, WriteBatching};

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct File {
    node: u64,
    cluster: u64,
    epoch: Option<u64>,
    #[serde(default)]
    listen: Vec<SocketAddr>,
    #[serde(default)]
    dial_from: Vec<SocketAddr>,
    /// Interface per network ("" for none).
    #[serde(default)]
    devices: Vec<String>,
    connections_per_network: Option<usize>,
    reconnect_initial_ms: Option<u64>,
    reconnect_max_ms: Option<u64>,
    tcp_user_timeout_ms: Option<u64>,
    metrics: Option<SocketAddr>,
    key_file: Option<std::path::PathBuf>,
    /// The cluster file (nodes, keys, role service); relative to this file.
    cluster_file: Option<std::path::PathBuf>,
    #[serde(default)]
    insecure: bool,
    protection: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    max_handshaking: Option<usize>,
    /// `auto`, `idle` or `turn` (see `surelink::WriteBatching`).
    write_batching: Option<String>,
    #[serde(default)]
    runtime: RuntimeSection,
    #[serde(default)]
    members: Vec<Member>,
    #[serde(default)]
    peers: Vec<Peer>,
    #[serde(default)]
    core: Core,
    #[serde(default)]
    detector: Detector,
    tls: Option<Tls>,
    /// `surelink cache node`: the node's store.
    cache: Option<CacheSection>,
    /// `surelink cache proxy`: where clients connect and which nodes serve.
    proxy: Option<ProxySection>,
}

/// `[runtime]`: the process's tokio runtime.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuntimeSection {
    /// Threads that run the endpoint's tasks (default: the command's).
    pub(crate) worker_threads: Option<usize>,
}

impl RuntimeSection {
    /// Most worker threads accepted (well beyond any machine's cores).
    const MAX_WORKERS: usize = 1024;

    fn check(&self) -> Result<()> {
        if let Some(n) = self.worker_threads {
            anyhow::ensure!(
                (1..=Self::MAX_WORKERS).contains(&n),
                "runtime.worker_threads = {n}: must be 1..={}",
                Self::MAX_WORKERS
            );
        }
        Ok(())
    }
}

/// `[cache]`: a cache node's store.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheSection {
    /// Memory for items, MiB (memcached's `-m`, default 64).
    pub(crate) memory_mb: Option<u64>,
    /// Largest item, bytes (memcached's `-I`, default 1 MiB).
    pub(crate) max_item: Option<usize>,
    /// `memcached://host:port`: front that memcached instead of holding
    /// items (default: the embedded store).
    pub(crate) backend: Option<String>,
    /// Pipelined connections to the backend memcached (default 1).
    pub(crate) backend_connections: Option<usize>,
}

/// `[proxy]`: the memcached-protocol listener of a proxy.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProxySection {
    /// Where memcached clients connect.
    pub(crate) listen: SocketAddr,
    /// The cache nodes (default: every `[[peers]]` entry).
    #[serde(default)]
    pub(crate) nodes: Vec<u64>,
    pub(crate) max_item: Option<usize>,
    pub(crate) max_clients: Option<usize>,
    pub(crate) max_pipeline: Option<usize>,
    pub(crate) call_timeout_ms: Option<u64>,
}

/// Mutual TLS instead of member keys (paths relative to the file).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Tls {
    /// This node's certificate chain, PEM, leaf first.
    cert: std::path::PathBuf,
    /// Its private key, PEM.
    key: std::path::PathBuf,
    /// The CA certificates to trust, PEM.
    ca: std::path::PathBuf,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct Detector {
    mode: Option<String>,
    interval_ms: Option<u64>,
    path_timeout_ms: Option<u64>,
    timeout_ms: Option<u64>,
    send_slack_ms: Option<u64>,
    max_network_delay_ms: Option<u64>,
    check_every_ms: Option<u64>,
    barrier_timeout_ms: Option<u64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Member {
    node: u64,
    public_key: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Peer {
    node: u64,
    addrs: Vec<String>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct Core {
    max_message_size: Option<u32>,
    send_buffer: Option<u64>,
    recv_window: Option<u32>,
    max_channels: Option<u32>,
    linger_ms: Option<u64>,
    min_rto_ms: Option<u64>,
    max_rto_ms: Option<u64>,
    max_ack_delay_us: Option<u64>,
    handshake_timeout_ms: Option<u64>,
    path_keepalive_ms: Option<u64>,
    path_idle_timeout_ms: Option<u64>,
}

/// A parsed configuration plus the CLI-only settings.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) config: Config,
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) cache: Option<CacheSection>,
    pub(crate) proxy: Option<ProxySection>,
    /// The cluster file, when the configuration names one.
    pub(crate) cluster: Option<crate::cluster_file::Cluster>,
}

/// Only the `[runtime]` section of a configuration file, read before the
/// runtime it describes is built (the whole file is checked afterwards,
/// by [`load`]).
pub(crate) fn runtime(path: &Path) -> Result<RuntimeSection> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        runtime: RuntimeSection,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let only: Only = toml::from_str(&text).with_context(|| format!("in {}", path.display()))?;
    only.runtime
        .check()
        .with_context(|| format!("in {}", path.display()))?;
    Ok(only.runtime)
}

pub(crate) fn load(path: &Path) -> Result<Loaded> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&text, base).with_context(|| format!("in {}", path.display()))
}

/// Parses a configuration; relative paths (`key_file`) are taken from `base`.
pub(crate) fn parse(text: &str, base: &Path) -> Result<Loaded> {
    let f: File = toml::from_str(text)?;
    let mut c = Config::new(NodeId(f.node), ClusterId(f.cluster));
    c.insecure = f.insecure;
    if let Some(p) = &f.protection {
        c.protection = match p.as_str() {
            "encrypt" => Protection::Encrypt,
            "integrity_only" => Protection::IntegrityOnly,
            other => anyhow::bail!("protection {other:?}: use encrypt or integrity_only"),
        };
    }
    if let (Some(t), false) = (&f.tls, f.insecure) {
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(base.join(p))
                .with_context(|| format!("reading the TLS {what} {}", base.join(p).display()))
        };
        c.tls = Some(
            surelink::proto::secure::TlsSetup::from_pem(
                c.cluster,
                c.node,
                &read(&t.cert, "certificate")?,
                &read(&t.key, "key")?,
                &read(&t.ca, "CA bundle")?,
            )
            .context("[tls]")?,
        );
    }
    match (&f.key_file, f.insecure) {
        (Some(k), _) => {
            c.identity = Some(crate::keys::read_secret(&base.join(k))?);
        }
        (None, false) if f.tls.is_some() => {}
        (None, false) => anyhow::bail!(
            "key_file is required (make one with `surelink keygen --out node{}.key`), or a [tls] section with certificates, or insecure = true for a benchmark on a trusted host",
            f.node
        ),
        (None, true) => {}
    }
    if let Some(k) = &c.identity {
        c.members
            .insert(c.node, k.public())
            .context("this node's own key")?;
    }
    for m in &f.members {
        let key = crate::keys::parse_public(&m.public_key, &format!("member {}", m.node))?;
        c.members
            .insert(NodeId(m.node), key)
            .with_context(|| format!("member {}", m.node))?;
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
    if let Some(w) = &f.write_batching {
        c.write_batching = match w.as_str() {
            "auto" => WriteBatching::Auto,
            "idle" => WriteBatching::Idle,
            "turn" => WriteBatching::Turn,
            other => anyhow::bail!("write_batching {other:?}: use auto, idle or turn"),
        };
    }
    f.runtime.check()?;
    c.epoch = f.epoch.map(Epoch);
    c.listen = f.listen;
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
            .map_err(|a| anyhow::anyhow!("peer {}: bad address {a:?}", p.node))?;
        c.peers.push(PeerConfig::new(NodeId(p.node), addrs));
    }
    let k = &mut c.core;
    let core = f.core;
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
    let d = f.detector;
    if let Some(h) = d.interval_ms {
        let mode = c.detector.mode;
        c.detector = DetectorConfig::with_interval(ms(h));
        c.detector.mode = mode;
    }
    if let Some(m) = d.mode {
        c.detector.mode = match m.as_str() {
            "safetimer" => DetectorMode::SafeTimer,
            "plain" => DetectorMode::Plain,
            "off" => DetectorMode::Off,
            other => anyhow::bail!("detector.mode {other:?}: use safetimer, plain or off"),
        };
    }
    let det = &mut c.detector;
    for (v, field) in [
        (d.path_timeout_ms, &mut det.path_timeout),
        (d.timeout_ms, &mut det.timeout),
        (d.send_slack_ms, &mut det.send_slack),
        (d.max_network_delay_ms, &mut det.max_network_delay),
        (d.check_every_ms, &mut det.check_every),
        (d.barrier_timeout_ms, &mut det.barrier_timeout),
    ] {
        if let Some(v) = v {
            *field = ms(v);
        }
    }
    let cluster = match &f.cluster_file {
        Some(p) => {
            let path = base.join(p);
            let cl = crate::cluster_file::Cluster::load(&path)
                .with_context(|| format!("cluster file {}", path.display()))?;
            join_cluster(&mut c, &cl)?;
            Some(cl)
        }
        None => None,
    };
    c.validate()?;
    Ok(Loaded {
        config: c,
        metrics: f.metrics,
        cache: f.cache,
        proxy: f.proxy,
        cluster,
    })
}

/// A node's address per network (`""` where it is not attached); the
/// text that does not parse as the error.
pub(crate) fn parse_addrs(list: &[String]) -> Result<Vec<Option<SocketAddr>>, String> {
    list.iter()
        .map(|a| match a.as_str() {
            "" => Ok(None),
            a => a.parse().map(Some).map_err(|_| a.to_string()),
        })
        .collect()
}

/// What a cluster file adds to a node's configuration: every node's key
/// as a member, a peer entry for each node it dials, the role service.
fn join_cluster(c: &mut Config, cl: &crate::cluster_file::Cluster) -> Result<()> {
    anyhow::ensure!(
        cl.cluster == c.cluster.0,
        "the cluster file is for cluster {}, this node is in cluster {}",
        cl.cluster,
        c.cluster.0
    );
    anyhow::ensure!(
        cl.node(c.node).is_some(),
        "node {} is not listed in the cluster file",
        c.node
    );
    for n in &cl.nodes {
        if let Some(k) = n.public_key {
            // The same key twice is fine; another key for a node (or this
            // node's key file disagreeing with the cluster file) is not.
            c.members
                .insert(n.node, k)
                .with_context(|| format!("cluster file: node {}'s key", n.node))?;
        }
    }
    for n in cl.dials(c.node) {
        if !c.peers.iter().any(|p| p.node == n.node) {
            c.peers.push(PeerConfig::new(n.node, n.addrs.clone()));
        }
    }
    c.role = Some(cl.role.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Loaded> {
        super::parse(&format!("insecure = true\n{text}"), Path::new("."))
    }

    #[test]
    fn keys_and_members_are_read_and_required() {
        let dir = std::env::temp_dir().join(format!("surelink-cfg-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        crate::keys::make_key_dir(&dir, &[NodeId(1), NodeId(2)]).unwrap();
        let pub2 = std::fs::read_to_string(dir.join("node-2.pub")).unwrap();
        let text = format!(
            "node = 1\ncluster = 7\nkey_file = \"node-1.key\"\nlisten = [\"127.0.1.1:7100\"]\n\
             [[members]]\nnode = 2\npublic_key = \"{}\"\n\
             [[peers]]\nnode = 2\naddrs = [\"127.0.1.2:7100\"]\n",
            pub2.trim()
        );
        let l = super::parse(&text, &dir).unwrap();
        assert!(l.config.identity.is_some());
        assert_eq!(l.config.members.len(), 2);
        assert!(!l.config.insecure);
        // No key file and not insecure: refused with the way out named.
        let err = super::parse("node = 1\ncluster = 7\n", &dir).unwrap_err();
        assert!(format!("{err:#}").contains("surelink keygen"), "{err:#}");
        // A dialled peer without a member key: refused.
        let err = super::parse(
            "node = 1\ncluster = 7\nkey_file = \"node-1.key\"\nlisten = [\"127.0.1.1:7100\"]\n\
             [[peers]]\nnode = 2\naddrs = [\"127.0.1.2:7100\"]\n",
            &dir,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("no public key"), "{err:#}");
        let err = super::parse(
            "node = 1\ncluster = 7\nkey_file = \"node-1.key\"\n[[members]]\nnode = 2\npublic_key = \"xyz\"\n",
            &dir,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("member 2"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_the_documented_example_and_refuses_typos() {
        let ok = r#"
            node = 1
            cluster = 7
            listen = ["127.0.1.1:7100", "127.0.2.1:7100"]
            metrics = "127.0.0.1:9100"
            [[peers]]
            node = 2
            addrs = ["127.0.1.2:7100", ""]
            [core]
            linger_ms = 5000
        "#;
        let l = parse(ok).unwrap();
        assert_eq!(l.config.peers[0].addrs[1], None);
        assert_eq!(l.config.core.linger, Duration::from_secs(5));
        assert!(l.metrics.is_some());
        assert!(parse("node = 1\ncluster = 7\nlisten_typo = []\n").is_err());
        assert!(
            parse("node = 0\ncluster = 7\n").is_err(),
            "node 0 is refused by validation"
        );
        let err =
            parse("node = 1\ncluster = 7\n[[peers]]\nnode = 2\naddrs = [\"nope\"]\n").unwrap_err();
        assert!(format!("{err:#}").contains("bad address"));
        let l = parse("node = 1\ncluster = 7\n[detector]\nmode = \"plain\"\ninterval_ms = 100\n")
            .unwrap();
        assert_eq!(l.config.detector.mode, DetectorMode::Plain);
        assert_eq!(l.config.detector.timeout, Duration::from_millis(1500));
        // A window the fence cannot back is refused.
        let err = parse("node = 1\ncluster = 7\n[detector]\ntimeout_ms = 20\n").unwrap_err();
        assert!(format!("{err:#}").contains("detector.timeout"), "{err:#}");
        assert!(parse("node = 1\ncluster = 7\n[detector]\nmode = \"fast\"\n").is_err());
    }

    #[test]
    fn runtime_threads_and_write_batching_are_read_and_checked() {
        let l = parse("node = 1\ncluster = 7\n").unwrap();
        assert_eq!(l.config.write_batching, WriteBatching::Auto);
        let text =
            "node = 1\ncluster = 7\nwrite_batching = \"turn\"\n[runtime]\nworker_threads = 4\n";
        let l = parse(text).unwrap();
        assert_eq!(l.config.write_batching, WriteBatching::Turn);
        // The runtime's size is read on its own, before the runtime exists.
        let file =
            std::env::temp_dir().join(format!("surelink-rt-test-{}.toml", std::process::id()));
        std::fs::write(&file, text).unwrap();
        assert_eq!(runtime(&file).unwrap().worker_threads, Some(4));
        std::fs::write(&file, "[runtime]\nworker_threads = 0\n").unwrap();
        let err = runtime(&file).unwrap_err();
        assert!(format!("{err:#}").contains("must be 1..=1024"), "{err:#}");
        std::fs::remove_file(&file).unwrap();
        let err = parse("node = 1\ncluster = 7\n[runtime]\nworker_threads = 0\n").unwrap_err();
        assert!(
            format!("{err:#}").contains("runtime.worker_threads"),
            "{err:#}"
        );
        let err = parse("node = 1\ncluster = 7\nwrite_batching = \"sometimes\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("auto, idle or turn"), "{err:#}");
        assert!(parse("node = 1\ncluster = 7\n[runtime]\nthreads = 2\n").is_err());
    }
}
