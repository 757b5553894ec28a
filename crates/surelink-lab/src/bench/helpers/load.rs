//! The load of `bench helpers`, in its own process (pinned with the
//! helpers to the clients' core): N client endpoints, each its own
//! member with its own key and source address, each with at most one
//! request outstanding, calling the server open loop at a fixed total
//! rate — directly, or only through helpers (`--helpers`); or, for the
//! arms users run today, memcached-protocol connections (`--memcached`).
//! Prints
//! `READY` once every client has its path, `MEASURE START` after the
//! warm-up, and `MEASURE END {json}` with what the window measured.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, Endpoint, PeerConfig, RelayPath};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{CLUSTER, FIRST_CLIENT, SERVER};

/// `surelink-lab bench-helpers-load` (hidden).
#[derive(clap::Args, Debug)]
pub(crate) struct LoadArgs {
    /// Directory with `node-<id>.key` / `.pub` files.
    #[arg(long)]
    dir: PathBuf,
    /// The server's port on 127.0.1.1.
    #[arg(long)]
    port: u16,
    /// Client sessions.
    #[arg(long)]
    clients: usize,
    /// Requests per second, all clients together.
    #[arg(long)]
    rate: f64,
    /// Request size, bytes.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Seconds before the measured window.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Seconds measured.
    #[arg(long)]
    seconds: f64,
    /// Helpers' addresses: each client goes through one (round robin) and
    /// has no direct path. Empty: every client direct.
    #[arg(long, value_delimiter = ',')]
    helpers: Vec<SocketAddr>,
    /// Activation instead: every client starts direct and watches its own
    /// p99 against this SLA (ms), moving to the lighter of two of
    /// `--helpers` drawn at random (release at half the SLA).
    #[arg(long)]
    activate_sla_ms: Option<u64>,
    /// Every path runs the full Noise XX handshake (`resume_paths =
    /// false`): the baseline for what resuming saves a hot server.
    #[arg(long)]
    no_resume: bool,
    /// Instead of surelink sessions: memcached-protocol connections to
    /// this address (memcached itself, or nutcracker in front of it),
    /// each reading its own key, whose value is `--payload` bytes.
    #[arg(long)]
    memcached: Option<SocketAddr>,
}

/// One client: a surelink session, or a memcached-protocol connection.
enum Client {
    Session(Endpoint),
    Memcached {
        r: BufReader<tokio::net::tcp::OwnedReadHalf>,
        w: tokio::net::tcp::OwnedWriteHalf,
        get: Vec<u8>,
        value: Bytes,
        line: String,
    },
}

impl Client {
    /// Connects client `i` to memcached at `addr` and sets its key.
    async fn memcached(addr: SocketAddr, i: usize, value: Bytes) -> Result<Client> {
        let s = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        let (r, mut w) = s.into_split();
        let key = format!("hb:{i}");
        let mut set = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        set.extend_from_slice(&value);
        set.extend_from_slice(b"\r\n");
        w.write_all(&set).await?;
        let mut r = BufReader::new(r);
        let mut line = String::new();
        r.read_line(&mut line).await?;
        if line != "STORED\r\n" {
            bail!("set {key} through {addr}: {line:?}");
        }
        Ok(Client::Memcached {
            r,
            w,
            get: format!("get {key}\r\n").into_bytes(),
            value,
            line,
        })
    }

    /// One request and its answer: an echo call, or a `get` whose value
    /// must be the one set.
    async fn call(&mut self, body: &Bytes) -> Result<()> {
        match self {
            Client::Session(ep) => {
                ep.call(NodeId(SERVER), 1, body.clone(), Duration::from_secs(5))
                    .await?;
                Ok(())
            }
            Client::Memcached {
                r,
                w,
                get,
                value,
                line,
            } => {
                let answer = async {
                    w.write_all(get).await?;
                    line.clear();
                    r.read_line(line).await?;
                    let want = value.len();
                    if !line.starts_with("VALUE ") || !line.ends_with(&format!(" {want}\r\n")) {
                        bail!("unexpected answer {line:?}");
                    }
                    let mut got = vec![0; want + 2];
                    r.read_exact(&mut got).await?;
                    line.clear();
                    r.read_line(line).await?;
                    if got[..want] != value[..] || line != "END\r\n" {
                        bail!("wrong value or end {line:?}");
                    }
                    Ok(())
                };
                tokio::time::timeout(Duration::from_secs(5), answer).await?
            }
        }
    }
}

/// What the measured window saw.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct Window {
    pub(crate) completed: u64,
    pub(crate) errors: u64,
    /// Ticks that found the client's previous request still outstanding.
    pub(crate) skipped: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    /// Activation: clients going through a helper at the end, ms from
    /// the window's start until half and until all of them were (None:
    /// never), and moves in all.
    #[serde(default)]
    pub(crate) helped: usize,
    #[serde(default)]
    pub(crate) half_helped_ms: Option<f64>,
    #[serde(default)]
    pub(crate) all_helped_ms: Option<f64>,
    /// The same for the move done (the path through the helper up), ms
    /// from the window's start.
    #[serde(default)]
    pub(crate) half_relayed_ms: Option<f64>,
    #[serde(default)]
    pub(crate) all_relayed_ms: Option<f64>,
    /// Per client, decision to path up (the move itself), ms: median and
    /// longest over the clients that moved.
    #[serde(default)]
    pub(crate) move_p50_ms: Option<f64>,
    #[serde(default)]
    pub(crate) move_max_ms: Option<f64>,
    #[serde(default)]
    pub(crate) switches: u64,
    /// How many clients made each number of moves: (moves, clients).
    #[serde(default)]
    pub(crate) switches_per_client: Vec<(u64, usize)>,
    /// The longest any client went without an answer in the window, ms
    /// (from its previous answer, or the window's start).
    #[serde(default)]
    pub(crate) max_gap_ms: f64,
    /// The same over the window's second half only (from 45 % of it:
    /// `--kill-helper` kills at 50 %).
    #[serde(default)]
    pub(crate) max_gap_late_ms: f64,
}

fn client_config(a: &LoadArgs, i: usize) -> Result<Config> {
    let node = NodeId(FIRST_CLIENT + i as u64);
    let mut c = Config::new(node, ClusterId(CLUSTER));
    let keys = surelink_node::keys::read_secret(&a.dir.join(format!("node-{}.key", node.0)))?;
    c.members.insert(node, keys.public())?;
    c.identity = Some(keys);
    let server_pub = std::fs::read_to_string(a.dir.join(format!("node-{SERVER}.pub")))?;
    let sk = surelink_node::keys::parse_public(server_pub.trim(), "server")?;
    c.members.insert(NodeId(SERVER), sk)?;
    c.resume_paths = !a.no_resume;
    // Each client from an address of its own, one per /24 (a host of its
    // own, under the server's per-address and per-prefix limits).
    let (b, c3) = (10 + i / 250, i % 250);
    let ip = Ipv4Addr::new(127, u8::try_from(b)?, u8::try_from(c3)?, 1);
    c.dial_from = vec![SocketAddr::new(IpAddr::V4(ip), 0)];
    if a.helpers.is_empty() || a.activate_sla_ms.is_some() {
        let server = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)), a.port);
        c.peers = vec![PeerConfig::new(NodeId(SERVER), vec![Some(server)])];
    }
    Ok(c)
}

pub(crate) async fn run(a: &LoadArgs) -> Result<()> {
    if a.clients == 0 || a.rate <= 0.0 {
        bail!("--clients and --rate must be positive");
    }
    let body = Bytes::from(vec![0x5a; a.payload]);
    let mut eps: Vec<(Endpoint, Option<RelayPath>)> = Vec::with_capacity(a.clients);
    let mut clients: Vec<Client> = Vec::with_capacity(a.clients);
    if let Some(addr) = a.memcached {
        for i in 0..a.clients {
            clients.push(Client::memcached(addr, i, body.clone()).await?);
        }
    }
    for i in 0..a.clients {
        if a.memcached.is_some() {
            break;
        }
        let ep = Endpoint::bind(client_config(a, i)?)
            .await
            .with_context(|| format!("binding client {i}"))?;
        let relay = (!a.helpers.is_empty() && a.activate_sla_ms.is_none())
            .then(|| ep.relay_via(NodeId(SERVER), a.helpers[i % a.helpers.len()], 0));
        eps.push((ep, relay));
        // Not all handshakes at once: the step measures the steady state.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for (i, (ep, _)) in eps.iter().enumerate() {
        if !ep
            .wait_for_paths(NodeId(SERVER), 1, Duration::from_secs(60))
            .await
        {
            bail!("client {i} has no path to the server");
        }
    }
    clients.extend(eps.iter().map(|(ep, _)| Client::Session(ep.clone())));
    println!("READY");
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let measuring = Arc::new(AtomicBool::new(false));
    let (completed, errors, skipped) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let period = Duration::from_secs_f64(a.clients as f64 / a.rate);
    // Per client: its last answer (ns since `origin`) and its longest gap.
    let origin = std::time::Instant::now();
    let gaps: Arc<Vec<(AtomicU64, AtomicU64)>> = Arc::new(
        (0..a.clients)
            .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
            .collect(),
    );
    let mut tasks = Vec::new();
    for (i, mut client) in clients.into_iter().enumerate() {
        let (hist, measuring) = (hist.clone(), measuring.clone());
        let (completed, errors, skipped) = (completed.clone(), errors.clone(), skipped.clone());
        let body = body.clone();
        let gaps = gaps.clone();
        // Spread the clients' ticks over one period.
        let offset = period.mul_f64(i as f64 / a.clients as f64);
        tasks.push(tokio::spawn(async move {
            let start = tokio::time::Instant::now() + offset;
            let mut tick = tokio::time::interval_at(start, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut last = start;
            loop {
                let at = tick.tick().await;
                let on = measuring.load(Ordering::Relaxed);
                if on && at.duration_since(last) > period + period / 2 {
                    // Ticks passed while the last request was out.
                    let missed = at.duration_since(last).as_secs_f64() / period.as_secs_f64();
                    skipped.fetch_add(missed as u64 - 1, Ordering::Relaxed);
                }
                last = at;
                let t = std::time::Instant::now();
                let r = client.call(&body).await;
                if measuring.load(Ordering::Relaxed) {
                    match r {
                        Ok(_) => {
                            completed.fetch_add(1, Ordering::Relaxed);
                            let now =
                                u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
                            let prev = gaps[i].0.swap(now, Ordering::Relaxed);
                            gaps[i]
                                .1
                                .fetch_max(now.saturating_sub(prev), Ordering::Relaxed);
                            let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                            let _ = hist.lock().record(us.max(1));
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(a.warmup)).await;
    // Activation starts with the window: how long until clients move.
    let helped: Vec<surelink::Helped> = match a.activate_sla_ms {
        Some(sla) => {
            let mut cfg = surelink::proto::helper::ActivationConfig::default();
            cfg.sla = Duration::from_millis(sla);
            cfg.release = Duration::from_millis(sla) / 2;
            eps.iter()
                .map(|(ep, _)| ep.helped(NodeId(SERVER), a.helpers.clone(), 0, cfg.clone()))
                .collect::<Result<_, _>>()?
        }
        None => Vec::new(),
    };
    // Gaps count from the window's start.
    let t0 = u64::try_from(origin.elapsed().as_nanos()).unwrap_or(0);
    for g in gaps.iter() {
        g.0.store(t0, Ordering::Relaxed);
    }
    measuring.store(true, Ordering::Relaxed);
    println!("MEASURE START");
    let start = std::time::Instant::now();
    let (mut half, mut all) = (None, None);
    let (mut half_up, mut all_up) = (None, None);
    // Per client: when it decided, and how long the move then took.
    let mut decided: Vec<Option<f64>> = vec![None; helped.len()];
    let mut moves: Vec<Option<f64>> = vec![None; helped.len()];
    let mut early_max: Vec<u64> = Vec::new();
    while start.elapsed().as_secs_f64() < a.seconds {
        if early_max.is_empty() && start.elapsed().as_secs_f64() >= a.seconds * 0.45 {
            // The late half's gaps start here.
            early_max = gaps
                .iter()
                .map(|g| g.1.swap(0, Ordering::Relaxed))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if !helped.is_empty() {
            let st: Vec<_> = helped.iter().map(surelink::Helped::status).collect();
            let n = st.iter().filter(|s| s.helper.is_some()).count();
            let up = st.iter().filter(|s| s.relayed).count();
            let ms = start.elapsed().as_secs_f64() * 1e3;
            for (i, s) in st.iter().enumerate() {
                if s.helper.is_some() && decided[i].is_none() {
                    decided[i] = Some(ms);
                }
                if let (true, Some(d), None) = (s.relayed, decided[i], moves[i]) {
                    moves[i] = Some(ms - d);
                }
            }
            let mark = |at: &mut Option<f64>, k: usize, all: bool| {
                let reached = if all {
                    k == helped.len()
                } else {
                    2 * k >= helped.len()
                };
                if at.is_none() && reached {
                    *at = Some(ms);
                }
            };
            mark(&mut half, n, false);
            mark(&mut all, n, true);
            mark(&mut half_up, up, false);
            mark(&mut all_up, up, true);
        }
    }
    measuring.store(false, Ordering::Relaxed);
    let h = hist.lock().clone();
    let end = u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    // A client still waiting at the end counts its wait so far.
    let late: Vec<u64> = gaps
        .iter()
        .map(|g| {
            let tail = end.saturating_sub(g.0.load(Ordering::Relaxed));
            g.1.load(Ordering::Relaxed).max(tail)
        })
        .collect();
    let w = Window {
        completed: completed.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        skipped: skipped.load(Ordering::Relaxed),
        p50_us: h.value_at_quantile(0.5) as f64,
        p99_us: h.value_at_quantile(0.99) as f64,
        p999_us: h.value_at_quantile(0.999) as f64,
        helped: helped
            .iter()
            .filter(|h| h.status().helper.is_some())
            .count(),
        half_helped_ms: half,
        all_helped_ms: all,
        half_relayed_ms: half_up,
        all_relayed_ms: all_up,
        move_p50_ms: {
            let mut m: Vec<f64> = moves.iter().flatten().copied().collect();
            m.sort_by(f64::total_cmp);
            m.get(m.len() / 2).copied()
        },
        move_max_ms: moves.iter().flatten().copied().reduce(f64::max),
        switches: helped.iter().map(|h| h.status().switches).sum(),
        switches_per_client: {
            let mut m = std::collections::BTreeMap::new();
            for h in &helped {
                *m.entry(h.status().switches).or_insert(0usize) += 1;
            }
            m.into_iter().collect()
        },
        max_gap_ms: late.iter().chain(&early_max).copied().max().unwrap_or(0) as f64 / 1e6,
        max_gap_late_ms: late.iter().copied().max().unwrap_or(0) as f64 / 1e6,
    };
    if let Some(h) = helped.first() {
        eprintln!("first client's activation: {:?}", h.status());
    }
    println!("MEASURE END {}", serde_json::to_string(&w)?);
    for t in tasks {
        t.abort();
    }
    // The parent kills this process; leave without the goodbyes.
    std::process::exit(0);
}
