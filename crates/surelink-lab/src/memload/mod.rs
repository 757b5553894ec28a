//! An open-loop load generator speaking memcached's text protocol: the
//! demo's client and `bench cache`'s. Request times come from the
//! schedule (a fixed rate), not from replies, and latency is measured from
//! the scheduled time — a stalled server shows as latency, not as fewer
//! requests (no coordinated omission).
//!
//! It also checks every answer: each key is always sent on the same
//! connection (so its commands apply in the order sent, as memcached
//! promises per connection), the generator remembers the version of each
//! key's last `set`, and a `get` must return exactly that version — an
//! older one is stale, another key's data is wrong, and a miss of a key
//! that was set is reported for the caller to explain (a node that died
//! takes its keys with it; anything else is the fabric's fault).

mod conn;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};
use tokio::net::TcpStream;
use tokio::time::Instant;

pub(crate) use conn::Progress;
use conn::{Conn, Kind, Waiting};

/// What to send.
#[derive(Clone, Debug)]
pub(crate) struct LoadConfig {
    /// The memcached-protocol servers: connection `i` goes to
    /// `addrs[i % len]` (a proxy per application host).
    pub(crate) addrs: Vec<SocketAddr>,
    /// Requests per second offered.
    pub(crate) rate: f64,
    /// How long the schedule runs.
    pub(crate) duration: Duration,
    /// Client connections (keys are spread over them).
    pub(crate) connections: usize,
    /// Distinct keys.
    pub(crate) keys: u32,
    /// Zipf exponent of key popularity.
    pub(crate) zipf: f64,
    /// Share of requests that are `get`s (the rest are `set`s).
    pub(crate) get_share: f64,
    /// Value size in bytes.
    pub(crate) value_size: usize,
    /// Seed of the key and operation draws.
    pub(crate) seed: u64,
    /// How long replies may take after the schedule ends.
    pub(crate) drain: Duration,
    /// A flash crowd on one key, on top of the schedule.
    pub(crate) hot: Option<HotKey>,
}

/// A flash crowd: from `from` to `to` (since the start), `rate` more
/// `get`s per second of `key`, spread over every connection (every
/// application host reads it). The key is never written after the
/// preload, so any connection may read it.
#[derive(Clone, Debug)]
pub(crate) struct HotKey {
    pub(crate) key: u32,
    pub(crate) from: Duration,
    pub(crate) to: Duration,
    pub(crate) rate: f64,
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Stored,
    /// The value of the key's last `set`.
    Hit,
    /// Not found; `known`: the key had been set.
    Miss {
        known: bool,
    },
    /// The key's data, but an older version than its last `set`.
    Stale,
    /// Another key's data, or bytes never written.
    Wrong,
    /// An error reply (`SERVER_ERROR …`) or an unexpected one.
    Error,
    /// No reply before the drain ended, or the connection was lost.
    Unanswered,
}

impl Outcome {
    pub(crate) fn is_error(self) -> bool {
        matches!(self, Outcome::Error | Outcome::Unanswered)
    }
}

/// One request's record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) key: u32,
    /// Scheduled send time, ns since the start.
    pub(crate) sched_ns: u64,
    /// Reply time, ns since the start (`u64::MAX`: none).
    pub(crate) done_ns: u64,
    pub(crate) outcome: Outcome,
}

impl Sample {
    /// Latency from the scheduled time, µs (`None`: unanswered).
    pub(crate) fn latency_us(&self) -> Option<u64> {
        (self.done_ns != u64::MAX).then(|| self.done_ns.saturating_sub(self.sched_ns) / 1000)
    }
}

/// The key name on the wire.
pub(crate) fn key_name(key: u32) -> String {
    format!("key:{key}")
}

/// Counts a request the schedule queued (`ok`) on connection `c`, or
/// records it unanswered (its connection is broken).
fn queued(
    ok: bool,
    c: usize,
    key: u32,
    sched_ns: u64,
    touched: &mut [bool],
    not_sent: &mut Vec<Sample>,
    progress: &Progress,
) {
    if ok {
        touched[c] = true;
    } else {
        progress.errors.fetch_add(1, Ordering::Relaxed);
        not_sent.push(Sample {
            key,
            sched_ns,
            done_ns: u64::MAX,
            outcome: Outcome::Unanswered,
        });
    }
    progress.sent.fetch_add(1, Ordering::Relaxed);
}

/// Connected clients, preloaded, ready to run the schedule.
pub(crate) struct Load {
    cfg: LoadConfig,
    conns: Vec<Arc<Conn>>,
    halves: Vec<(
        tokio::net::tcp::OwnedReadHalf,
        tokio::net::tcp::OwnedWriteHalf,
    )>,
    /// Per key: the version of its last `set` sent (0: never).
    last: Vec<u64>,
}

impl Load {
    /// Connects `cfg.connections` clients to `cfg.addr`.
    pub(crate) async fn connect(cfg: LoadConfig) -> Result<Load> {
        anyhow::ensure!(cfg.connections > 0, "at least one connection");
        anyhow::ensure!(!cfg.addrs.is_empty(), "at least one server address");
        anyhow::ensure!(cfg.keys > 0, "at least one key");
        anyhow::ensure!(cfg.rate > 0.0, "the rate must be above zero");
        anyhow::ensure!(
            (0.0..=1.0).contains(&cfg.get_share),
            "the get share is a fraction"
        );
        let mut halves = Vec::new();
        for i in 0..cfg.connections {
            let addr = cfg.addrs[i % cfg.addrs.len()];
            let s = TcpStream::connect(addr)
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            s.set_nodelay(true)?;
            halves.push(s.into_split());
        }
        Ok(Load {
            conns: (0..cfg.connections)
                .map(|_| Arc::new(Conn::default()))
                .collect(),
            last: vec![0; cfg.keys as usize],
            halves,
            cfg,
        })
    }

    /// Sets every key once (version 1), a window of requests at a time,
    /// so `get`s find values from the start. Returns how long it took.
    pub(crate) async fn preload(&mut self) -> Result<Duration> {
        let t = Instant::now();
        let size = self.cfg.value_size;
        // One connection at a time per chunk keeps it simple: the keys of
        // a chunk are pipelined on their connections.
        let mut streams: Vec<TcpStream> = Vec::new();
        for (r, w) in self.halves.drain(..) {
            streams.push(r.reunite(w).context("reuniting a client connection")?);
        }
        let n = self.cfg.connections;
        for (c, s) in streams.iter_mut().enumerate() {
            let keys: Vec<u32> = (0..self.cfg.keys)
                .filter(|k| *k as usize % n == c)
                .collect();
            for chunk in keys.chunks(256) {
                let mut out = Vec::new();
                for &k in chunk {
                    let v = conn::value(k, 1, size);
                    out.extend_from_slice(
                        format!("set {} 0 0 {}\r\n", key_name(k), v.len()).as_bytes(),
                    );
                    out.extend_from_slice(&v);
                    out.extend_from_slice(b"\r\n");
                }
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                s.write_all(&out).await?;
                let want = b"STORED\r\n".len() * chunk.len();
                let mut got = vec![0u8; want];
                tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
                    .await
                    .context("preload: no answer within 10 s")??;
                anyhow::ensure!(
                    got == b"STORED\r\n".repeat(chunk.len()),
                    "preload: a set was not stored: {:?}",
                    String::from_utf8_lossy(&got[..got.len().min(80)])
                );
                for &k in chunk {
                    self.last[k as usize] = 1;
                }
            }
        }
        self.halves = streams.into_iter().map(TcpStream::into_split).collect();
        Ok(t.elapsed())
    }

    /// Runs the schedule from `start` (which should be a moment ahead):
    /// every request at its time, every reply checked. Returns every
    /// request's sample, in no particular order.
    pub(crate) async fn run(mut self, start: Instant, progress: Arc<Progress>) -> Vec<Sample> {
        let cfg = self.cfg.clone();
        let total = (cfg.rate * cfg.duration.as_secs_f64()) as u64;
        let deadline = start + cfg.duration + cfg.drain;
        let mut readers = Vec::new();
        for (c, (r, w)) in self.conns.iter().zip(self.halves.drain(..)) {
            tokio::spawn(conn::writer(c.clone(), w));
            readers.push(tokio::spawn(conn::reader(
                c.clone(),
                r,
                start,
                deadline,
                progress.clone(),
            )));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        // Zipf over ranks 1..=keys; rank r is key r-1 (key 0 the hottest).
        let zipf = Zipf::new(f64::from(cfg.keys), cfg.zipf).ok();
        let mut versions = self.last.clone();
        let mut not_sent = Vec::new();
        let interval_ns = 1e9 / cfg.rate;
        let mut i = 0u64;
        let mut touched = vec![false; self.conns.len()];
        let hot_key = cfg.hot.as_ref().map(|h| h.key);
        let (hot_total, hot_from_ns, hot_interval_ns) = match &cfg.hot {
            Some(h) if h.rate > 0.0 && h.to > h.from => (
                (h.rate * (h.to - h.from).as_secs_f64()) as u64,
                h.from.as_nanos() as u64,
                1e9 / h.rate,
            ),
            _ => (0, 0, 1.0),
        };
        let hot_at = |j: u64| hot_from_ns + (j as f64 * hot_interval_ns) as u64;
        let mut j = 0u64;
        loop {
            let next = match (i < total, j < hot_total) {
                (false, false) => break,
                (true, false) => (i as f64 * interval_ns) as u64,
                (false, true) => hot_at(j),
                (true, true) => ((i as f64 * interval_ns) as u64).min(hot_at(j)),
            };
            tokio::time::sleep_until(start + Duration::from_nanos(next)).await;
            // Everything due by now goes out in this batch.
            let now_ns = conn::ns_since(start);
            while j < hot_total && hot_at(j) <= now_ns {
                let sched_ns = hot_at(j);
                let c = usize::try_from(j % self.conns.len() as u64).unwrap_or(0);
                j += 1;
                let Some(key) = hot_key else { break };
                let w = Waiting {
                    key,
                    sched_ns,
                    kind: Kind::Get {
                        expect: self.last[key as usize],
                    },
                };
                let name = key_name(key);
                let ok = self.conns[c].push(w, |out| {
                    out.extend_from_slice(format!("get {name}\r\n").as_bytes());
                });
                queued(ok, c, key, sched_ns, &mut touched, &mut not_sent, &progress);
            }
            while i < total && (i as f64 * interval_ns) as u64 <= now_ns {
                let sched_ns = (i as f64 * interval_ns) as u64;
                i += 1;
                let key = match &zipf {
                    Some(z) => (z.sample(&mut rng) as u32).clamp(1, cfg.keys) - 1,
                    None => rng.random_range(0..cfg.keys),
                };
                let c = key as usize % self.conns.len();
                let name = key_name(key);
                // The flash crowd's key is only read (any connection may).
                let ok = if rng.random_bool(cfg.get_share) || Some(key) == hot_key {
                    let w = Waiting {
                        key,
                        sched_ns,
                        kind: Kind::Get {
                            expect: self.last[key as usize],
                        },
                    };
                    self.conns[c].push(w, |out| {
                        out.extend_from_slice(format!("get {name}\r\n").as_bytes());
                    })
                } else {
                    versions[key as usize] += 1;
                    let version = versions[key as usize];
                    let w = Waiting {
                        key,
                        sched_ns,
                        kind: Kind::Set { version },
                    };
                    let v = conn::value(key, version, cfg.value_size);
                    let ok = self.conns[c].push(w, |out| {
                        out.extend_from_slice(format!("set {name} 0 0 {}\r\n", v.len()).as_bytes());
                        out.extend_from_slice(&v);
                        out.extend_from_slice(b"\r\n");
                    });
                    if ok {
                        self.last[key as usize] = version;
                    }
                    ok
                };
                queued(ok, c, key, sched_ns, &mut touched, &mut not_sent, &progress);
            }
            for (c, t) in touched.iter_mut().enumerate() {
                if std::mem::take(t) {
                    self.conns[c].flush();
                }
            }
        }
        for c in &self.conns {
            c.finish();
        }
        let mut samples = not_sent;
        for r in readers {
            if let Ok(s) = r.await {
                samples.extend(s);
            }
        }
        samples
    }
}
