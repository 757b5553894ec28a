//! The target of the admission attacks: `surelink serve` (an echo server)
//! started from a given binary with a configuration in a temporary
//! directory, so the same attack measures an old build and a new one;
//! and the members that call it, in this process.
//!
//! The configuration uses only keys every build reads. A member whose
//! address the server should know is listed as a `[[peers]]` entry at a
//! port where nothing listens: the server's dials there fail (and back
//! off), and a build that keeps room for its peers' addresses keeps it
//! for that member, which dials the server from that address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, Endpoint, Keypair, PeerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use surelink_lab::child::{Child, Command};
use surelink_lab::examples::TempDir;
use surelink_lab::host::free_port;

const CLUSTER: ClusterId = ClusterId(25);
/// The server's node id.
pub(crate) const SERVER: NodeId = NodeId(1);
/// The server's address (network 0 of the loopback layout).
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);

/// A member of the target's cluster.
pub(crate) struct MemberSpec {
    pub(crate) node: NodeId,
    /// Listed as a peer at this address (the server knows where it
    /// connects from), or not.
    pub(crate) listed: Option<Ipv4Addr>,
}

/// A running target and its members' keys.
pub(crate) struct Target {
    child: Child,
    dir: TempDir,
    pub(crate) listen: SocketAddr,
    metrics: SocketAddr,
    server_key: surelink::PublicKey,
    members: Vec<(NodeId, Keypair)>,
}

impl Target {
    /// Writes the configuration and starts `bin serve`; waits until it
    /// accepts connections.
    pub(crate) async fn start(bin: &Path, name: &str, members: &[MemberSpec]) -> Result<Target> {
        if !bin.exists() {
            bail!(
                "{} not found (build it: cargo build --release -p surelink-cli, or pass --surelink-bin)",
                bin.display()
            );
        }
        let dir = TempDir::new(name)?;
        let server = Keypair::generate()?;
        surelink_node::keys::write_secret(&dir.path().join("server.key"), &server)?;
        let listen = SocketAddr::new(IpAddr::V4(SERVER_IP), free_port(IpAddr::V4(SERVER_IP))?);
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let metrics = SocketAddr::new(localhost, free_port(localhost)?);
        let mut text = format!(
            "node = {}\ncluster = {}\nkey_file = \"server.key\"\nlisten = [\"{listen}\"]\nmetrics = \"{metrics}\"\n",
            SERVER.0, CLUSTER.0
        );
        let mut keys = Vec::new();
        for m in members {
            let k = Keypair::generate()?;
            text += &format!(
                "\n[[members]]\nnode = {}\npublic_key = \"{}\"\n",
                m.node.0,
                k.public()
            );
            if let Some(ip) = m.listed {
                // Nothing listens there: see the module docs.
                let port = free_port(IpAddr::V4(ip))?;
                text += &format!(
                    "[[peers]]\nnode = {}\naddrs = [\"{ip}:{port}\"]\n",
                    m.node.0
                );
            }
            keys.push((m.node, k));
        }
        let file = dir.path().join("server.toml");
        std::fs::write(&file, text)?;
        let child = Command::new("surelink serve", bin)
            .args(["serve", "--config"])
            .arg(&file)
            .log(dir.path().join("server.log"))
            .die_with_parent()
            .spawn()?;
        let t = Target {
            child,
            dir,
            listen,
            metrics,
            server_key: server.public(),
            members: keys,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(metrics).await.is_err() {
            t.child.check()?;
            if Instant::now() > deadline {
                bail!("the target did not start: see {}", t.log().display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(t)
    }

    /// The server's log.
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The target's resident memory, KiB (VmRSS).
    pub(crate) fn rss_kib(&self) -> u64 {
        super::rss_kib(self.child.pid())
    }

    /// Fails if the target exited.
    pub(crate) fn check(&self) -> Result<()> {
        self.child.check()
    }

    /// The target's counters whose names start with `surelink_connections`
    /// (every build has some), from its metrics port.
    pub(crate) async fn connection_counters(&self) -> Vec<(String, f64)> {
        let Ok(Ok(text)) = tokio::time::timeout(Duration::from_secs(2), scrape(self.metrics)).await
        else {
            return Vec::new();
        };
        text.lines()
            .filter(|l| l.starts_with("surelink_connections"))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    /// A member endpoint in this process: node `node`, dialling the target
    /// from each of `from` (one network each, `per_network` connections
    /// on each).
    pub(crate) async fn member(
        &self,
        node: NodeId,
        from: &[Ipv4Addr],
        per_network: usize,
    ) -> Result<Endpoint> {
        let keys = self
            .members
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, k)| k.clone())
            .context("not a member of the target")?;
        let mut c = Config::new(node, CLUSTER);
        c.members.insert(SERVER, self.server_key)?;
        c = c.with_identity(keys)?;
        c.dial_from = from
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        c.peers = vec![PeerConfig::new(SERVER, vec![Some(self.listen); from.len()])];
        c.connections_per_network = per_network;
        Ok(Endpoint::bind(c).await?)
    }

    /// A member from `ip` with one path, connected and warmed up (200
    /// calls) before an attack starts.
    pub(crate) async fn warm_member(&self, node: NodeId, ip: Ipv4Addr) -> Result<Endpoint> {
        let ep = self.member(node, &[ip], 1).await?;
        anyhow::ensure!(
            ep.wait_for_paths(SERVER, 1, Duration::from_secs(10)).await,
            "member {node} could not connect before the attack: see {}",
            self.log().display()
        );
        for i in 0..200 {
            call_once(&ep, i).await;
        }
        Ok(ep)
    }
}

/// A legitimate member calling the target every 10 ms until stopped.
pub(crate) struct Caller {
    /// What its calls got.
    pub(crate) calls: Arc<Mutex<Calls>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Caller {
    /// Starts calling from `ep`.
    pub(crate) fn start(ep: &Endpoint) -> Caller {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (ep, calls, stop) = (ep.clone(), calls.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let r = call_once(&ep, i).await;
                    calls.lock().record(r);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        Caller { calls, stop, task }
    }

    /// Stops calling (the call in flight ends first).
    pub(crate) async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: target\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// The target's memory before, at most during, and after an attack, MiB.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(crate) struct Rss {
    pub(crate) before_mib: f64,
    pub(crate) during_max_mib: f64,
    pub(crate) after_mib: f64,
}

impl Rss {
    pub(crate) fn mib(kib: u64) -> f64 {
        kib as f64 / 1024.0
    }
}

/// Calls answered and their latencies.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    pub(crate) total: u64,
    pub(crate) answered: u64,
    lat_us: Vec<u64>,
}

impl Calls {
    pub(crate) fn record(&mut self, took: Option<Duration>) {
        self.total += 1;
        if let Some(t) = took {
            self.answered += 1;
            self.lat_us.push(t.as_micros() as u64);
        }
    }

    /// The p-th percentile of answered calls' latency, microseconds.
    pub(crate) fn percentile_us(&self, p: f64) -> u64 {
        let mut v = self.lat_us.clone();
        v.sort_unstable();
        match v.len() {
            0 => 0,
            n => v[((n as f64 * p / 100.0).ceil() as usize).clamp(1, n) - 1],
        }
    }

    pub(crate) fn summary(&self) -> CallSummary {
        CallSummary {
            total: self.total,
            answered: self.answered,
            answered_pct: if self.total == 0 {
                0.0
            } else {
                100.0 * self.answered as f64 / self.total as f64
            },
            p50_us: self.percentile_us(50.0),
            p99_us: self.percentile_us(99.0),
        }
    }
}

/// What the JSON result says of a member's calls.
#[derive(Debug, serde::Serialize)]
pub(crate) struct CallSummary {
    pub(crate) total: u64,
    pub(crate) answered: u64,
    pub(crate) answered_pct: f64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
}

/// Calls `ep`'s server once (2 s deadline); the round trip if answered.
pub(crate) async fn call_once(ep: &Endpoint, i: u64) -> Option<Duration> {
    let t = Instant::now();
    let body = bytes::Bytes::from(i.to_be_bytes().to_vec());
    match ep
        .call(SERVER, 0, body.clone(), Duration::from_secs(2))
        .await
    {
        Ok(r) if r == body => Some(t.elapsed()),
        _ => None,
    }
}
