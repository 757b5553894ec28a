//! What the proxy attacks share: the example cache cluster (three nodes
//! and the proxy, `examples/cache` on free ports) started from a given
//! `surelink` binary, the proxy's RSS and CPU from /proc, and a
//! legitimate client measuring its gets while the attack runs.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use surelink_lab::child::{Child, Command};
use surelink_lab::examples::ExampleCopy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The example cache cluster, running.
pub(super) struct Cluster {
    /// Where memcached clients connect.
    pub(super) addr: SocketAddr,
    /// Nodes 1..3, then the proxy (killed when dropped).
    procs: Vec<Child>,
    copy: ExampleCopy,
}

impl Cluster {
    /// Starts `examples/cache` from `bin`: each node with `node_memory_mb`
    /// of item memory, `proxy_extra` appended to the proxy's `[proxy]`
    /// section (its last one). Logs in the copy's directory.
    pub(super) async fn start(
        bin: &Path,
        node_memory_mb: u64,
        proxy_extra: &[String],
    ) -> Result<Cluster> {
        let copy = ExampleCopy::new("cache", "attack-proxy")?;
        let dir = copy.path().to_path_buf();
        for n in 1..=3 {
            let f = dir.join(format!("node{n}.toml"));
            let text = std::fs::read_to_string(&f)?;
            std::fs::write(
                &f,
                text.replace("memory_mb = 64", &format!("memory_mb = {node_memory_mb}")),
            )?;
        }
        if !proxy_extra.is_empty() {
            let f = dir.join("proxy.toml");
            let mut text = std::fs::read_to_string(&f)?;
            text.push('\n');
            for l in proxy_extra {
                text.push_str(l);
                text.push('\n');
            }
            std::fs::write(&f, text)?;
        }
        let addr = copy.moved("127.0.0.1:11311")?;
        let mut procs = Vec::new();
        for (kind, file) in [
            ("node", "node1"),
            ("node", "node2"),
            ("node", "node3"),
            ("proxy", "proxy"),
        ] {
            procs.push(
                Command::new(format!("surelink cache {kind} {file}"), bin)
                    .args(["cache", kind, "--config"])
                    .arg(dir.join(format!("{file}.toml")))
                    .log(dir.join(format!("{file}.log")))
                    .die_with_parent()
                    .spawn()?,
            );
        }
        let c = Cluster { addr, procs, copy };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for p in &c.procs {
                p.check()
                    .with_context(|| format!("logs in {}", c.copy.path().display()))?;
            }
            if let Ok(mut s) = connect(addr).await {
                if ask(
                    &mut s,
                    b"set attack:ready 0 0 1\r\nx\r\n",
                    b"\r\n",
                    Duration::from_secs(1),
                )
                .await
                .is_some_and(|r| r == b"STORED\r\n")
                {
                    return Ok(c);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the cluster did not store a value in 20 s (logs in {})",
                    c.copy.path().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The proxy's process id.
    pub(super) fn proxy_pid(&self) -> u32 {
        self.procs[3].pid()
    }

    /// Fails if a process of the cluster has exited.
    pub(super) fn check(&self) -> Result<()> {
        for p in &self.procs {
            p.check()?;
        }
        Ok(())
    }
}

pub(super) async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends `req`; the answer once it ends with `end`, `None` on timeout,
/// error or close.
pub(super) async fn ask(
    s: &mut TcpStream,
    req: &[u8],
    end: &[u8],
    timeout: Duration,
) -> Option<Vec<u8>> {
    let work = async {
        s.write_all(req).await.ok()?;
        let mut got = Vec::new();
        let mut b = vec![0u8; 1 << 16];
        while !got.ends_with(end) {
            let n = s.read(&mut b).await.ok()?;
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&b[..n]);
        }
        Some(got)
    };
    tokio::time::timeout(timeout, work).await.ok().flatten()
}

/// One legitimate `get` of the probe: when it was sent, its latency if
/// answered within a second.
type Sample = (Instant, Option<Duration>);

/// A legitimate client: a `get` of a small key every 20 ms (on an idle
/// connection of its own, or a new one), each answered or not within a
/// second of being due.
pub(super) struct Probe {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What the probe saw in a window.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(super) struct Seen {
    pub(super) answered: usize,
    pub(super) total: usize,
    pub(super) p99_ms: f64,
}

impl Probe {
    pub(super) async fn start(addr: SocketAddr) -> Result<Probe> {
        let mut s = connect(addr).await?;
        if ask(
            &mut s,
            b"set attack:probe 0 0 5\r\nhello\r\n",
            b"\r\n",
            Duration::from_secs(2),
        )
        .await
        .is_none()
        {
            bail!("the probe's key was not stored");
        }
        let samples = Arc::new(Mutex::new(Vec::new()));
        let out = samples.clone();
        drop(s);
        let task = tokio::spawn(async move {
            // Idle connections kept for reuse; each get takes one or opens
            // one, so a stalled get does not hold the next ones back.
            let pool = Arc::new(Mutex::new(Vec::<TcpStream>::new()));
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let (out, pool) = (out.clone(), pool.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let conn = pool.lock().pop();
                    let conn = match conn {
                        Some(c) => Some(c),
                        None => tokio::time::timeout(Duration::from_secs(1), connect(addr))
                            .await
                            .ok()
                            .and_then(Result::ok),
                    };
                    let mut ok = false;
                    if let Some(mut c) = conn {
                        let left = Duration::from_secs(1).saturating_sub(t.elapsed());
                        let answer = ask(&mut c, b"get attack:probe\r\n", b"END\r\n", left).await;
                        ok = answer.is_some_and(|a| a.starts_with(b"VALUE attack:probe"));
                        if ok {
                            pool.lock().push(c);
                        }
                    }
                    out.lock().push((t, ok.then(|| t.elapsed())));
                });
            }
        });
        Ok(Probe { samples, task })
    }

    /// What it saw since `from`.
    pub(super) fn since(&self, from: Instant) -> Seen {
        let s = self.samples.lock();
        let mut lat: Vec<Duration> = Vec::new();
        let mut total = 0;
        for (t, l) in s.iter().filter(|(t, _)| *t >= from) {
            let _ = t;
            total += 1;
            if let Some(l) = l {
                lat.push(*l);
            }
        }
        lat.sort();
        let p99 = if lat.is_empty() {
            f64::NAN
        } else {
            lat[(lat.len() * 99 / 100).min(lat.len() - 1)].as_secs_f64() * 1000.0
        };
        Seen {
            answered: lat.len(),
            total,
            p99_ms: p99,
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `v` to `path` (pretty JSON) and says where.
pub(super) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("result: {}", path.display());
    Ok(())
}
