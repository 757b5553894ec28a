//! `surelink bench`: surelink against a plain-TCP baseline on loopback, both
//! measured in the same process run.
//!
//! # What is measured
//!
//! * **Round-trip latency** (ping-pong) with 64 B and 4096 B payloads and 1
//!   and 16 concurrent callers. surelink: a server endpoint listening on two
//!   loopback networks (127.0.1.1 and 127.0.2.1) with an echo handler, and a
//!   client endpoint dialling it from 127.0.1.2 and 127.0.2.2 (default
//!   [`Config`] otherwise); once both paths are active, each caller loops
//!   `client.call(..)` and every round trip that starts after the warm-up is
//!   recorded in an HdrHistogram (nanoseconds). Reported: p50, p99, p99.9.
//! * **Pipelined one-way throughput** with 64 B and 4096 B payloads: one
//!   sender loops `client.send(..)` as fast as it can; the server takes
//!   messages with `recv()` and counts them. Delivery is counted *at the
//!   receiver* inside a window that opens after the warm-up and closes before
//!   the sender is told to stop, so neither the ramp-up nor the backlog still
//!   in flight counts as delivered; the backlog is drained (and surelink's
//!   retransmit cache allowed to empty) before the next round. Reported:
//!   messages per second and goodput (payload bytes only, MB = 10^6 bytes).
//!
//! # The baseline
//!
//! One plain tokio `TcpStream` per measurement kind between 127.0.1.2 and
//! 127.0.1.1, `TCP_NODELAY` on both ends, frames of a 4-byte big-endian
//! length (of what follows it), an 8-byte id and the payload. Reads are
//! buffered on every side: read into a `BytesMut`, parse every complete frame.
//!
//! * Latency: the server echoes frames (the replies to one read leave in one
//!   write). The client multiplexes its callers over the one connection. A
//!   caller registers a `oneshot` under its request id, appends its frame to
//!   a shared out-buffer and, unless another caller is writing already,
//!   writes everything buffered itself (write combining: no hop through a
//!   writer task, as surelink's callers write the core's output themselves).
//!   A reader task completes the `oneshot`s from a
//!   `Mutex<HashMap<u64, oneshot::Sender<Bytes>>>`. Calls carry the same
//!   5 s timeout as surelink's.
//! * Throughput: the sender writes frames through a 64 KiB
//!   `tokio::io::BufWriter` (it flushes whenever it fills, and at the end of
//!   the round); the receiver parses frames into `Bytes` and counts them.
//!
//! # Fairness
//!
//! Both contenders run alternately round by round (the order swaps every
//! round), so drift on a shared machine hits both alike, and the report gives
//! medians over rounds. Ratios are surelink / TCP: above 1 means surelink is
//! slower for latency; below 1 means surelink is slower for throughput.
//!
//! # Output
//!
//! Progress on stderr, the table on stdout, every per-round figure and the
//! medians in `<out>/bench.json`, and a latency-by-percentile plot in
//! `<out>/latency_cdf.png`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, Endpoint, PeerConfig, Request, StatsSnapshot};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::coop::consume_budget;
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------
// Command line and plan
// ---------------------------------------------------------------------------

/// Options of `surelink bench`.
#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Rounds per case and contender; the report gives the median.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per measurement (one round of one contender), after a warm-up.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Directory for bench.json and latency_cdf.png (created if missing).
    #[arg(long, default_value = "results/bench")]
    out: PathBuf,
    /// Smoke test: 2 rounds of 0.25 s (overrides --rounds and --seconds).
    #[arg(long)]
    quick: bool,
    /// Run only one kind of measurement.
    #[arg(long, value_enum)]
    only: Option<Only>,
}

/// Which measurements `--only` keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Only {
    /// Round-trip latency only.
    Latency,
    /// One-way throughput only.
    Throughput,
}

/// Payload sizes of both measurements, bytes.
const PAYLOADS: [usize; 2] = [64, 4096];
/// Concurrent callers of the latency measurement.
const CALLERS: [usize; 2] = [1, 16];

/// What one run does, derived from the arguments.
#[derive(Clone, Debug)]
struct Plan {
    rounds: usize,
    measure: Duration,
    warmup: Duration,
    latency: Vec<(usize, usize)>,
    throughput: Vec<usize>,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Plan> {
        let (rounds, seconds) = if args.quick {
            (2, 0.25)
        } else {
            (args.rounds, args.seconds)
        };
        ensure!((1..=1000).contains(&rounds), "--rounds must be 1..=1000");
        ensure!(
            seconds.is_finite() && (0.01..=3600.0).contains(&seconds),
            "--seconds must be between 0.01 and 3600"
        );
        let measure = Duration::from_secs_f64(seconds);
        // A fifth of the measurement, within 50..300 ms, before every round.
        let warmup = (measure / 5).clamp(Duration::from_millis(50), Duration::from_millis(300));
        let latency = if args.only == Some(Only::Throughput) {
            Vec::new()
        } else {
            PAYLOADS
                .iter()
                .flat_map(|&p| CALLERS.iter().map(move |&c| (p, c)))
                .collect()
        };
        let throughput = if args.only == Some(Only::Latency) {
            Vec::new()
        } else {
            PAYLOADS.to_vec()
        };
        Ok(Plan {
            rounds,
            measure,
            warmup,
            latency,
            throughput,
        })
    }

    fn steps(&self) -> usize {
        (self.latency.len() + self.throughput.len()) * self.rounds * 2
    }
}

/// The two contenders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Contender {
    Surelink,
    Tcp,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Surelink => "surelink",
            Contender::Tcp => "tcp",
        }
    }

    /// Who goes first in round `round` (0-based): alternates.
    fn order(round: usize) -> [Contender; 2] {
        if round % 2 == 0 {
            [Contender::Surelink, Contender::Tcp]
        } else {
            [Contender::Tcp, Contender::Surelink]
        }
    }
}

/// Numbers the progress lines.
struct Progress {
    step: usize,
    total: usize,
}

impl Progress {
    fn next(&mut self) -> String {
        self.step += 1;
        format!("[{}/{}]", self.step, self.total)
    }
}

// ---------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------

/// Runs the benchmark: sets both contenders up, measures, shuts down, and
/// writes the table, the JSON and the plot.
pub(crate) async fn run(args: &BenchArgs) -> Result<()> {
    let plan = Plan::new(args)?;
    // Fail on an unwritable output directory before measuring anything.
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create output directory {}", args.out.display()))?;
    eprintln!(
        "surelink bench: {} round(s) x {:.2} s per contender and case (+{} ms warm-up each), {} measurements",
        plan.rounds,
        plan.measure.as_secs_f64(),
        plan.warmup.as_millis(),
        plan.steps()
    );
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut fixture = Fixture::setup()
        .await
        .context("setting up the contenders")?;
    let outcome = measure_all(&mut fixture, &plan).await;
    let surelink_stats = SurelinkStats::collect(&fixture.surelink);
    fixture.shutdown().await;
    let (latency, throughput) = outcome?;

    let report = Report {
        settings: Settings {
            rounds: plan.rounds,
            seconds: plan.measure.as_secs_f64(),
            warmup_seconds: plan.warmup.as_secs_f64(),
            quick: args.quick,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            started_unix_s: started,
            surelink_config: "Config::new defaults; 2 networks, 1 connection per network",
            baseline: "one tokio TcpStream, TCP_NODELAY, 4-byte length + 8-byte id + payload",
            ratio: "surelink / tcp",
            latency_unit: "microseconds",
            goodput_unit: "MB/s of payload, MB = 10^6 bytes",
        },
        latency,
        throughput,
        surelink_stats,
    };
    print!("{}", render_table(&report));

    let json_path = args.out.join("bench.json");
    let json = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
    std::fs::write(&json_path, json)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    eprintln!("wrote {}", json_path.display());

    if report.latency.is_empty() {
        eprintln!("no latency measured: latency_cdf.png not written");
    } else {
        let png = args.out.join("latency_cdf.png");
        match plot::latency_cdf(&png, &report.latency) {
            Ok(true) => eprintln!("wrote {}", png.display()),
            Ok(false) => {}
            // The figures are in the JSON already; a plot problem is not fatal.
            Err(e) => eprintln!("warning: could not draw {}: {e:#}", png.display()),
        }
    }
    Ok(())
}

/// Every case, every round, both contenders alternately.
async fn measure_all(
    fx: &mut Fixture,
    plan: &Plan,
) -> Result<(Vec<LatencyCase>, Vec<ThroughputCase>)> {
    let mut progress = Progress {
        step: 0,
        total: plan.steps(),
    };
    let mut latency = Vec::new();
    for &(payload, callers) in &plan.latency {
        let body = Bytes::from(pattern(payload));
        let mut sides = [LatencySide::new()?, LatencySide::new()?];
        for round in 0..plan.rounds {
            for who in Contender::order(round) {
                let label = format!(
                    "{} latency {payload} B x{callers} {} round {}/{}",
                    progress.next(),
                    who.name(),
                    round + 1,
                    plan.rounds
                );
                eprint!("{label} ... ");
                let caller = match who {
                    Contender::Surelink => Caller::Surelink(fx.surelink.client.clone()),
                    Contender::Tcp => Caller::Tcp(fx.tcp_rpc.clone()),
                };
                let (mut r, hist) = latency_round(&caller, &body, callers, plan)
                    .await
                    .with_context(|| label.clone())?;
                r.round = round + 1;
                eprintln!(
                    "p50 {:.1} µs  p99 {:.1} µs  p99.9 {:.1} µs  ({} calls{})",
                    r.p50_us,
                    r.p99_us,
                    r.p999_us,
                    r.calls,
                    if r.errors > 0 {
                        format!(
                            ", {} ERRORS: {}",
                            r.errors,
                            r.first_error.as_deref().unwrap_or("")
                        )
                    } else {
                        String::new()
                    }
                );
                let side = &mut sides[usize::from(who == Contender::Tcp)];
                side.merged.add(&hist).context("merging histograms")?;
                side.rounds.push(r);
            }
        }
        let [surelink, tcp] = sides;
        latency.push(LatencyCase::new(payload, callers, surelink, tcp));
    }
    let mut throughput = Vec::new();
    for &payload in &plan.throughput {
        let body = Bytes::from(pattern(payload));
        let mut sides: [Vec<ThroughputRound>; 2] = [Vec::new(), Vec::new()];
        for round in 0..plan.rounds {
            for who in Contender::order(round) {
                let label = format!(
                    "{} throughput {payload} B {} round {}/{}",
                    progress.next(),
                    who.name(),
                    round + 1,
                    plan.rounds
                );
                eprint!("{label} ... ");
                let mut r = match who {
                    Contender::Surelink => throughput_surelink(&fx.surelink, &body, plan).await,
                    Contender::Tcp => throughput_tcp(&mut fx.tcp_sink, &body, plan).await,
                }
                .with_context(|| label.clone())?;
                r.round = round + 1;
                eprintln!(
                    "{} msgs/s  {:.1} MB/s  (sender offered {} msgs/s, drained in {:.0} ms)",
                    thousands(r.msgs_per_s),
                    r.mb_per_s,
                    thousands(r.offered_msgs_per_s),
                    r.drain_seconds * 1e3
                );
                sides[usize::from(who == Contender::Tcp)].push(r);
            }
        }
        let [surelink, tcp] = sides;
        throughput.push(ThroughputCase::new(payload, surelink, tcp));
    }
    Ok((latency, throughput))
}

/// A recognisable payload (not all zeros) of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..=250u8).cycle().take(len).collect()
}

// ---------------------------------------------------------------------------
// Setup and teardown
// ---------------------------------------------------------------------------

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);
const CLUSTER: ClusterId = ClusterId(0xbe7c);
/// Timeout of every call, both contenders.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the paths may take to come up.
const PATHS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a throughput round's backlog may take to arrive.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

const SERVER_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 1, 1), Ipv4Addr::new(127, 0, 2, 1)];
const CLIENT_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 1, 2), Ipv4Addr::new(127, 0, 2, 2)];

/// Both contenders, set up once for the whole run.
struct Fixture {
    surelink: SurelinkPair,
    tcp_rpc: Arc<TcpRpc>,
    tcp_sink: TcpSink,
    /// The baseline's tasks (echo server, reply reader, sink reader).
    tcp_tasks: Vec<JoinHandle<Result<()>>>,
}

impl Fixture {
    async fn setup() -> Result<Fixture> {
        let surelink = SurelinkPair::setup().await?;
        let tcp = async {
            let (tcp_rpc, mut tcp_tasks) = TcpRpc::setup().await?;
            match TcpSink::setup().await {
                Ok((tcp_sink, sink_task)) => {
                    tcp_tasks.push(sink_task);
                    Ok((tcp_rpc, tcp_sink, tcp_tasks))
                }
                Err(e) => {
                    tcp_tasks.iter().for_each(JoinHandle::abort);
                    Err(e)
                }
            }
        };
        match tcp.await {
            Ok((tcp_rpc, tcp_sink, tcp_tasks)) => Ok(Fixture {
                surelink,
                tcp_rpc,
                tcp_sink,
                tcp_tasks,
            }),
            Err(e) => {
                surelink.shutdown().await;
                Err(e.context("setting up the plain-TCP baseline"))
            }
        }
    }

    async fn shutdown(self) {
        for t in &self.tcp_tasks {
            t.abort();
        }
        self.tcp_rpc.close();
        self.surelink.shutdown().await;
    }
}

/// Messages and payload bytes delivered to a receiving application.
#[derive(Debug, Default)]
struct Delivered {
    msgs: AtomicU64,
    bytes: AtomicU64,
}

impl Delivered {
    fn add(&self, payload_len: usize) {
        self.msgs.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(
            u64::try_from(payload_len).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn msgs(&self) -> u64 {
        self.msgs.load(Ordering::Relaxed)
    }

    fn snapshot(&self) -> (u64, u64, Instant) {
        (
            self.msgs.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            Instant::now(),
        )
    }
}

/// The surelink contender: an echo server on two networks and its client.
struct SurelinkPair {
    server: Endpoint,
    client: Endpoint,
    delivered: Arc<Delivered>,
    receiver: JoinHandle<()>,
}

impl SurelinkPair {
    async fn setup() -> Result<SurelinkPair> {
        let mut cfg = Config::new(SERVER, CLUSTER);
        cfg.listen = SERVER_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        let server = Endpoint::bind(cfg)
            .await
            .context("binding the surelink server")?;
        server.serve(|r: Request| async move { r.body });

        let delivered = Arc::new(Delivered::default());
        let receiver = {
            let server = server.clone();
            let delivered = delivered.clone();
            tokio::spawn(async move {
                while let Some(m) = server.recv().await {
                    delivered.add(m.body.len());
                }
            })
        };

        let mut cfg = Config::new(CLIENT, CLUSTER);
        cfg.dial_from = CLIENT_IPS
            .iter()
            .map(|&ip| SocketAddr::new(IpAddr::V4(ip), 0))
            .collect();
        cfg.peers = vec![PeerConfig {
            node: SERVER,
            addrs: server.local_addrs().into_iter().map(Some).collect(),
        }];
        let client = match Endpoint::bind(cfg).await {
            Ok(c) => c,
            Err(e) => {
                receiver.abort();
                server.shutdown().await;
                return Err(e).context("binding the surelink client");
            }
        };
        let pair = SurelinkPair {
            server,
            client,
            delivered,
            receiver,
        };
        let up = async {
            wait_paths(&pair.client, 2).await?;
            wait_paths(&pair.server, 2).await
        };
        if let Err(e) = up.await {
            pair.shutdown().await;
            return Err(e);
        }
        Ok(pair)
    }

    async fn shutdown(self) {
        // Both at once: each closes its session before the other's
        // connections go, so neither reports the other unreachable.
        tokio::join!(self.client.shutdown(), self.server.shutdown());
        self.receiver.abort();
    }
}

/// Waits until `ep` has `n` active paths (there is no readiness signal in
/// the API, so this polls the session stats as the loopback tests do).
async fn wait_paths(ep: &Endpoint, n: usize) -> Result<()> {
    let deadline = Instant::now() + PATHS_TIMEOUT;
    loop {
        if active_paths(&ep.stats()) >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "node {}: {n} active paths did not come up within {PATHS_TIMEOUT:?} (connections: {:?})",
                ep.node(),
                ep.paths()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn active_paths(s: &StatsSnapshot) -> usize {
    s.sessions
        .iter()
        .map(|(_, st)| st.paths.iter().filter(|p| p.active).count())
        .sum()
}

// ---------------------------------------------------------------------------
// The plain-TCP baseline
// ---------------------------------------------------------------------------

/// Bytes before the payload: length (of id + payload) and id.
const FRAME_HEADER: usize = 12;
/// Largest frame the baseline accepts.
const MAX_FRAME: usize = 16 << 20;
/// Bytes asked of the kernel per read (as surelink's connections do).
const READ_CHUNK: usize = 64 * 1024;
/// The throughput sender's buffer.
const WRITE_BUFFER: usize = 64 * 1024;

/// Appends one frame to `buf`.
fn put_frame(buf: &mut BytesMut, id: u64, payload: &[u8]) -> Result<()> {
    let len = u32::try_from(8 + payload.len()).context("payload too large for a frame")?;
    buf.reserve(FRAME_HEADER + payload.len());
    buf.put_u32(len);
    buf.put_u64(id);
    buf.put_slice(payload);
    Ok(())
}

/// The header of one frame.
fn frame_header(id: u64, payload_len: usize) -> Result<[u8; FRAME_HEADER]> {
    let len = u32::try_from(8 + payload_len).context("payload too large for a frame")?;
    let mut h = [0u8; FRAME_HEADER];
    h[..4].copy_from_slice(&len.to_be_bytes());
    h[4..].copy_from_slice(&id.to_be_bytes());
    Ok(h)
}

/// Takes the next complete frame off `buf`: its id and payload.
fn take_frame(buf: &mut BytesMut) -> Result<Option<(u64, Bytes)>> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = usize::try_from(u32::from_be_bytes(prefix.try_into()?))?;
    ensure!(
        (8..=MAX_FRAME).contains(&len),
        "baseline frame of bad length {len}"
    );
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len).freeze();
    frame.advance(4);
    let id = frame.get_u64();
    Ok(Some((id, frame)))
}

/// Keeps room for a full read at the end of `buf`.
fn reserve_read(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One connection from 127.0.1.2 to a fresh listener on 127.0.1.1, with
/// `TCP_NODELAY` on both ends: (client side, server side).
async fn tcp_pair() -> Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(SERVER_IPS[0]), 0))
        .await
        .context("baseline listener")?;
    let addr = listener.local_addr()?;
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(CLIENT_IPS[0]), 0))?;
    let (client, (server, _)) =
        tokio::try_join!(socket.connect(addr), listener.accept()).context("baseline connection")?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// Writes all of `data`, trying the socket first and waiting for it only
/// when it is full (what surelink's connections do).
async fn write_all(stream: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match stream.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The frames callers appended and nobody has written yet.
#[derive(Debug, Default)]
struct Outbox {
    buf: BytesMut,
    /// Some caller is writing the outbox to the socket now.
    writing: bool,
}

/// The baseline's request/reply client: callers multiplexed over one
/// connection.
#[derive(Debug)]
struct TcpRpc {
    stream: TcpStream,
    outbox: Mutex<Outbox>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    next_id: AtomicU64,
}

impl TcpRpc {
    /// Connects a client to an echo server; returns it and the tasks (echo
    /// server, reply reader).
    async fn setup() -> Result<(Arc<TcpRpc>, Vec<JoinHandle<Result<()>>>)> {
        let (client, server) = tcp_pair().await?;
        let echo = tokio::spawn(echo_server(server));
        let rpc = Arc::new(TcpRpc {
            stream: client,
            outbox: Mutex::new(Outbox::default()),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        });
        let reader = tokio::spawn(read_replies(rpc.clone()));
        Ok((rpc, vec![echo, reader]))
    }

    /// Sends `payload` as a request and waits for the echo.
    async fn call(&self, payload: &[u8]) -> Result<Bytes> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(id, tx);
        let result = async {
            let write = {
                let mut out = lock(&self.outbox);
                put_frame(&mut out.buf, id, payload)?;
                !std::mem::replace(&mut out.writing, true)
            };
            // Not under the timeout: a writer cancelled half-way would keep
            // the writer role for ever. (The server always reads, so the
            // write cannot block for long.)
            if write {
                self.write_outbox().await?;
            }
            match tokio::time::timeout(CALL_TIMEOUT, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => bail!("baseline connection closed"),
                Err(_) => bail!("baseline call timed out"),
            }
        }
        .await;
        if result.is_err() {
            lock(&self.waiting).remove(&id);
        }
        result
    }

    /// Writes the outbox until it is empty, then hands the writer role back.
    async fn write_outbox(&self) -> Result<()> {
        loop {
            let chunk = {
                let mut out = lock(&self.outbox);
                if out.buf.is_empty() {
                    out.writing = false;
                    return Ok(());
                }
                out.buf.split()
            };
            if let Err(e) = write_all(&self.stream, &chunk).await {
                lock(&self.outbox).writing = false;
                return Err(e).context("baseline write");
            }
        }
    }

    fn close(&self) {
        // Dropping the waiters fails any call still waiting.
        lock(&self.waiting).clear();
    }
}

/// The baseline client's reader: completes the callers' `oneshot`s.
async fn read_replies(rpc: Arc<TcpRpc>) -> Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut replies = Vec::new();
    let mut ready = Vec::new();
    loop {
        reserve_read(&mut buf);
        rpc.stream.readable().await?;
        match rpc.stream.try_read_buf(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e).context("baseline read"),
        }
        while let Some(frame) = take_frame(&mut buf)? {
            replies.push(frame);
        }
        if replies.is_empty() {
            continue;
        }
        {
            let mut waiting = lock(&rpc.waiting);
            for (id, body) in replies.drain(..) {
                if let Some(tx) = waiting.remove(&id) {
                    ready.push((tx, body));
                }
            }
        }
        for (tx, body) in ready.drain(..) {
            let _ = tx.send(body);
        }
    }
}

/// The baseline's echo server: the replies to one read leave in one write.
async fn echo_server(mut stream: TcpStream) -> Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    loop {
        reserve_read(&mut buf);
        if stream.read_buf(&mut buf).await.context("echo read")? == 0 {
            return Ok(());
        }
        while let Some((id, body)) = take_frame(&mut buf)? {
            put_frame(&mut out, id, &body)?;
        }
        if !out.is_empty() {
            stream.write_all(&out).await.context("echo write")?;
            out.clear();
        }
    }
}

/// The baseline's one-way connection: the sender's buffered writer (handed
/// to each round's sender task and back) and the receiver's counter.
struct TcpSink {
    writer: Option<BufWriter<TcpStream>>,
    delivered: Arc<Delivered>,
}

impl TcpSink {
    async fn setup() -> Result<(TcpSink, JoinHandle<Result<()>>)> {
        let (client, server) = tcp_pair().await?;
        let delivered = Arc::new(Delivered::default());
        let task = tokio::spawn(sink_receiver(server, delivered.clone()));
        Ok((
            TcpSink {
                writer: Some(BufWriter::with_capacity(WRITE_BUFFER, client)),
                delivered,
            },
            task,
        ))
    }
}

/// The baseline's receiver: parses frames into `Bytes` and counts them.
async fn sink_receiver(mut stream: TcpStream, delivered: Arc<Delivered>) -> Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        reserve_read(&mut buf);
        if stream.read_buf(&mut buf).await.context("sink read")? == 0 {
            return Ok(());
        }
        while let Some((_, body)) = take_frame(&mut buf)? {
            delivered.add(body.len());
        }
    }
}

// ---------------------------------------------------------------------------
// Latency rounds
// ---------------------------------------------------------------------------

/// Who the latency callers call.
#[derive(Clone)]
enum Caller {
    Surelink(Endpoint),
    Tcp(Arc<TcpRpc>),
}

impl Caller {
    async fn call(&self, payload: &Bytes) -> Result<Bytes> {
        match self {
            Caller::Surelink(ep) => Ok(ep.call(SERVER, 0, payload.clone(), CALL_TIMEOUT).await?),
            Caller::Tcp(rpc) => rpc.call(payload).await,
        }
    }
}

/// Round trips recorded in nanoseconds, 1 ns .. 100 s, 3 significant digits.
fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).context("histogram bounds")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

/// What one caller task saw.
struct CallerOutcome {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

/// One caller: calls back to back until `until`, recording the round trips
/// of calls started at or after `record_from`.
async fn caller_loop(
    caller: Caller,
    payload: Bytes,
    record_from: Instant,
    until: Instant,
) -> Result<CallerOutcome> {
    let mut hist = new_histogram()?;
    let mut errors = 0;
    let mut first_error = None;
    loop {
        let start = Instant::now();
        if start >= until {
            break;
        }
        let result = caller.call(&payload).await;
        let rtt = start.elapsed();
        match result {
            Ok(reply) if reply == payload => {
                if start >= record_from {
                    hist.saturating_record(nanos(rtt));
                }
            }
            Ok(reply) => {
                errors += 1;
                first_error.get_or_insert_with(|| {
                    format!("reply of {} bytes differs from the request", reply.len())
                });
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Ok(CallerOutcome {
        hist,
        errors,
        first_error,
    })
}

/// One latency round of one contender: `callers` concurrent callers.
async fn latency_round(
    caller: &Caller,
    payload: &Bytes,
    callers: usize,
    plan: &Plan,
) -> Result<(LatencyRound, Histogram<u64>)> {
    let record_from = Instant::now() + plan.warmup;
    let until = record_from + plan.measure;
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            tokio::spawn(caller_loop(
                caller.clone(),
                payload.clone(),
                record_from,
                until,
            ))
        })
        .collect();
    let mut hist = new_histogram()?;
    let mut errors = 0;
    let mut first_error = None;
    for t in tasks {
        let o = t.await.context("a caller task failed")??;
        hist.add(&o.hist).context("merging histograms")?;
        errors += o.errors;
        first_error = first_error.or(o.first_error);
    }
    ensure!(
        !hist.is_empty(),
        "no call succeeded ({errors} errors; first: {})",
        first_error.as_deref().unwrap_or("none")
    );
    let seconds = plan.measure.as_secs_f64();
    let round = LatencyRound {
        round: 0,
        calls: hist.len(),
        errors,
        first_error,
        seconds,
        calls_per_s: hist.len() as f64 / seconds,
        p50_us: us(&hist, 0.5),
        p99_us: us(&hist, 0.99),
        p999_us: us(&hist, 0.999),
        max_us: hist.max() as f64 / 1e3,
        mean_us: hist.mean() / 1e3,
    };
    Ok((round, hist))
}

// ---------------------------------------------------------------------------
// Throughput rounds
// ---------------------------------------------------------------------------

/// Deliveries counted inside the measurement window.
struct Window {
    msgs: u64,
    bytes: u64,
    seconds: f64,
}

/// Lets the sender warm up, then counts what the receiver takes during
/// `plan.measure`. The caller stops the sender only after this returns, so
/// the window never includes the drain of the backlog.
async fn delivery_window(delivered: &Delivered, plan: &Plan) -> Window {
    tokio::time::sleep(plan.warmup).await;
    let (m0, b0, t0) = delivered.snapshot();
    tokio::time::sleep(plan.measure).await;
    let (m1, b1, t1) = delivered.snapshot();
    Window {
        msgs: m1 - m0,
        bytes: b1 - b0,
        seconds: (t1 - t0).as_secs_f64(),
    }
}

/// Waits until the receiver has taken `target` messages in all.
async fn drain(delivered: &Delivered, target: u64) -> Result<()> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while delivered.msgs() < target {
        ensure!(
            Instant::now() < deadline,
            "backlog not delivered within {DRAIN_TIMEOUT:?}: {} of {target} messages",
            delivered.msgs()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

fn throughput_round(w: &Window, sent: u64, send_seconds: f64, drain: Duration) -> ThroughputRound {
    ThroughputRound {
        round: 0,
        delivered: w.msgs,
        seconds: w.seconds,
        msgs_per_s: w.msgs as f64 / w.seconds,
        mb_per_s: w.bytes as f64 / w.seconds / 1e6,
        sent,
        offered_msgs_per_s: sent as f64 / send_seconds,
        drain_seconds: drain.as_secs_f64(),
    }
}

/// One surelink throughput round: `send` in a loop, `recv` counting.
async fn throughput_surelink(
    pair: &SurelinkPair,
    payload: &Bytes,
    plan: &Plan,
) -> Result<ThroughputRound> {
    let base = pair.delivered.msgs();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sender = {
        let client = pair.client.clone();
        let payload = payload.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                client.send(SERVER, 0, payload.clone()).await?;
                sent += 1;
                consume_budget().await;
            }
            Ok::<u64, anyhow::Error>(sent)
        })
    };
    let window = delivery_window(&pair.delivered, plan).await;
    stop.store(true, Ordering::Relaxed);
    let sent = sender.await.context("sender task failed")??;
    let send_seconds = started.elapsed().as_secs_f64();
    let drain_start = Instant::now();
    drain(&pair.delivered, base + sent).await?;
    let drained = drain_start.elapsed();
    settle(&pair.client).await;
    Ok(throughput_round(&window, sent, send_seconds, drained))
}

/// Gives the client's retransmit cache a moment to empty (the last
/// acknowledgements), so a round does not start with the previous one's
/// messages still held. Not counted anywhere.
async fn settle(client: &Endpoint) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let held: u64 = client
            .stats()
            .sessions
            .iter()
            .map(|(_, s)| s.cache_messages)
            .sum();
        if held == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One baseline throughput round: frames through a `BufWriter`, the
/// receiver counting.
async fn throughput_tcp(
    sink: &mut TcpSink,
    payload: &Bytes,
    plan: &Plan,
) -> Result<ThroughputRound> {
    let mut writer = sink
        .writer
        .take()
        .context("the baseline writer was lost in an earlier round")?;
    let base = sink.delivered.msgs();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sender = {
        let payload = payload.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let header = frame_header(sent, payload.len())?;
                writer.write_all(&header).await?;
                writer.write_all(&payload).await?;
                sent += 1;
                consume_budget().await;
            }
            writer.flush().await?;
            Ok::<_, anyhow::Error>((writer, sent))
        })
    };
    let window = delivery_window(&sink.delivered, plan).await;
    stop.store(true, Ordering::Relaxed);
    let (writer, sent) = sender.await.context("sender task failed")??;
    sink.writer = Some(writer);
    let send_seconds = started.elapsed().as_secs_f64();
    let drain_start = Instant::now();
    drain(&sink.delivered, base + sent).await?;
    Ok(throughput_round(
        &window,
        sent,
        send_seconds,
        drain_start.elapsed(),
    ))
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// The whole report, as written to `bench.json`.
#[derive(Serialize)]
struct Report {
    settings: Settings,
    latency: Vec<LatencyCase>,
    throughput: Vec<ThroughputCase>,
    surelink_stats: SurelinkStats,
}

#[derive(Serialize)]
struct Settings {
    rounds: usize,
    seconds: f64,
    warmup_seconds: f64,
    quick: bool,
    cpus: usize,
    started_unix_s: u64,
    surelink_config: &'static str,
    baseline: &'static str,
    ratio: &'static str,
    latency_unit: &'static str,
    goodput_unit: &'static str,
}

/// One latency round of one contender.
#[derive(Serialize)]
struct LatencyRound {
    round: usize,
    calls: u64,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
    calls_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    mean_us: f64,
}

/// Medians over rounds.
#[derive(Serialize)]
struct LatencyMedians {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    calls_per_s: f64,
}

/// One contender in one latency case.
#[derive(Serialize)]
struct LatencySide {
    rounds: Vec<LatencyRound>,
    median: LatencyMedians,
    /// Percentiles of all rounds' calls together: (percentile, µs).
    all_rounds_percentiles: Vec<(f64, f64)>,
    #[serde(skip)]
    merged: Histogram<u64>,
}

impl LatencySide {
    fn new() -> Result<LatencySide> {
        Ok(LatencySide {
            rounds: Vec::new(),
            median: LatencyMedians {
                p50_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                calls_per_s: 0.0,
            },
            all_rounds_percentiles: Vec::new(),
            merged: new_histogram()?,
        })
    }

    fn finish(&mut self) {
        let m = |f: fn(&LatencyRound) -> f64| median(self.rounds.iter().map(f));
        self.median = LatencyMedians {
            p50_us: m(|r| r.p50_us),
            p99_us: m(|r| r.p99_us),
            p999_us: m(|r| r.p999_us),
            calls_per_s: m(|r| r.calls_per_s),
        };
        if !self.merged.is_empty() {
            self.all_rounds_percentiles = [50.0, 90.0, 99.0, 99.9, 99.99, 100.0]
                .iter()
                .map(|&p| (p, us(&self.merged, p / 100.0)))
                .collect();
        }
    }
}

/// surelink / TCP for the three percentiles.
#[derive(Serialize)]
struct LatencyRatios {
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
}

/// One latency case: payload size and callers, both contenders.
#[derive(Serialize)]
struct LatencyCase {
    payload: usize,
    callers: usize,
    surelink: LatencySide,
    tcp: LatencySide,
    ratio: LatencyRatios,
    /// surelink p50 - TCP p50, microseconds.
    p50_diff_us: f64,
}

impl LatencyCase {
    fn new(
        payload: usize,
        callers: usize,
        mut surelink: LatencySide,
        mut tcp: LatencySide,
    ) -> LatencyCase {
        surelink.finish();
        tcp.finish();
        let (s, t) = (&surelink.median, &tcp.median);
        LatencyCase {
            payload,
            callers,
            ratio: LatencyRatios {
                p50: ratio(s.p50_us, t.p50_us),
                p99: ratio(s.p99_us, t.p99_us),
                p999: ratio(s.p999_us, t.p999_us),
            },
            p50_diff_us: s.p50_us - t.p50_us,
            surelink,
            tcp,
        }
    }
}

/// One throughput round of one contender.
#[derive(Serialize)]
struct ThroughputRound {
    round: usize,
    /// Messages the receiver took inside the window.
    delivered: u64,
    /// The window's length.
    seconds: f64,
    msgs_per_s: f64,
    mb_per_s: f64,
    /// Messages the sender queued in the whole round (warm-up included).
    sent: u64,
    /// `sent` over the sender's running time: above `msgs_per_s` means a
    /// backlog built up in buffers.
    offered_msgs_per_s: f64,
    /// Time for the backlog to arrive after the sender stopped.
    drain_seconds: f64,
}

/// One contender in one throughput case.
#[derive(Serialize)]
struct ThroughputSide {
    rounds: Vec<ThroughputRound>,
    median_msgs_per_s: f64,
    median_mb_per_s: f64,
}

impl ThroughputSide {
    fn new(rounds: Vec<ThroughputRound>) -> ThroughputSide {
        ThroughputSide {
            median_msgs_per_s: median(rounds.iter().map(|r| r.msgs_per_s)),
            median_mb_per_s: median(rounds.iter().map(|r| r.mb_per_s)),
            rounds,
        }
    }
}

/// One throughput case, both contenders.
#[derive(Serialize)]
struct ThroughputCase {
    payload: usize,
    surelink: ThroughputSide,
    tcp: ThroughputSide,
    /// surelink msgs/s / TCP msgs/s.
    ratio_msgs_per_s: Option<f64>,
}

impl ThroughputCase {
    fn new(payload: usize, surelink: Vec<ThroughputRound>, tcp: Vec<ThroughputRound>) -> Self {
        let (surelink, tcp) = (ThroughputSide::new(surelink), ThroughputSide::new(tcp));
        ThroughputCase {
            payload,
            ratio_msgs_per_s: ratio(surelink.median_msgs_per_s, tcp.median_msgs_per_s),
            surelink,
            tcp,
        }
    }
}

/// The endpoints' own counters at the end of the run (were both paths used,
/// was anything re-sent).
#[derive(Serialize)]
struct SurelinkStats {
    client: EndpointStats,
    server: EndpointStats,
}

#[derive(Serialize)]
struct EndpointStats {
    messages_sent: u64,
    messages_received: u64,
    bytes_sent: u64,
    bytes_received: u64,
    calls: u64,
    call_errors: u64,
    paths_up: u64,
    paths_down: u64,
    resent: u64,
    timeouts: u64,
    paths: Vec<PathStats>,
}

#[derive(Serialize)]
struct PathStats {
    id: String,
    active: bool,
    srtt_us: f64,
    data_sent: u64,
    data_received: u64,
    resent: u64,
    timeouts: u64,
}

impl SurelinkStats {
    fn collect(pair: &SurelinkPair) -> SurelinkStats {
        SurelinkStats {
            client: EndpointStats::from(&pair.client.stats()),
            server: EndpointStats::from(&pair.server.stats()),
        }
    }
}

impl From<&StatsSnapshot> for EndpointStats {
    fn from(s: &StatsSnapshot) -> Self {
        let sessions = s.sessions.iter().map(|(_, st)| st);
        EndpointStats {
            messages_sent: s.messages_sent,
            messages_received: s.messages_received,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            calls: s.calls,
            call_errors: s.call_errors,
            paths_up: s.paths_up,
            paths_down: s.paths_down,
            resent: sessions.clone().map(|st| st.resent).sum(),
            timeouts: sessions.clone().map(|st| st.timeouts).sum(),
            paths: sessions
                .flat_map(|st| st.paths.iter())
                .map(|p| PathStats {
                    id: p.id.to_string(),
                    active: p.active,
                    srtt_us: p.srtt.as_secs_f64() * 1e6,
                    data_sent: p.stats.data_sent,
                    data_received: p.stats.data_received,
                    resent: p.stats.resent,
                    timeouts: p.stats.timeouts,
                })
                .collect(),
        }
    }
}

/// Median; the mean of the middle two for an even count; 0 when empty.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn ratio(surelink: f64, tcp: f64) -> Option<f64> {
    (tcp > 0.0).then(|| surelink / tcp)
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

/// `1234567.8` as `1,234,568`.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))
}

fn render_table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nsurelink bench: medians of {} round(s) x {:.2} s per contender and case; ratio = surelink / plain TCP",
        r.settings.rounds, r.settings.seconds
    );
    if !r.latency.is_empty() {
        let _ = writeln!(s, "\nRound-trip latency (µs; ratio > 1: surelink slower)");
        let _ = writeln!(
            s,
            "{:<14} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>7} {:>7} {:>7} | {:>8} | {:>9} {:>9}",
            "case", "sl p50", "sl p99", "sl p99.9", "tcp p50", "tcp p99", "tcp p99.9",
            "p50", "p99", "p99.9", "Δp50 µs", "sl call/s", "tcp call/s"
        );
        let _ = writeln!(s, "{}", "-".repeat(132));
        for c in &r.latency {
            let (sl, t) = (&c.surelink.median, &c.tcp.median);
            let _ = writeln!(
                s,
                "{:<14} | {:>8.1} {:>8.1} {:>8.1} | {:>8.1} {:>8.1} {:>8.1} | {:>7} {:>7} {:>7} | {:>+8.1} | {:>9} {:>9}",
                format!("{} B x{}", c.payload, c.callers),
                sl.p50_us,
                sl.p99_us,
                sl.p999_us,
                t.p50_us,
                t.p99_us,
                t.p999_us,
                fmt_ratio(c.ratio.p50),
                fmt_ratio(c.ratio.p99),
                fmt_ratio(c.ratio.p999),
                c.p50_diff_us,
                thousands(sl.calls_per_s),
                thousands(t.calls_per_s),
            );
        }
        let errors: u64 = r
            .latency
            .iter()
            .flat_map(|c| c.surelink.rounds.iter().chain(&c.tcp.rounds))
            .map(|x| x.errors)
            .sum();
        if errors > 0 {
            let _ = writeln!(s, "WARNING: {errors} failed calls (see bench.json)");
        }
    }
    if !r.throughput.is_empty() {
        let _ = writeln!(
            s,
            "\nOne-way pipelined throughput, delivered at the receiver (ratio < 1: surelink slower)"
        );
        let _ = writeln!(
            s,
            "{:<8} | {:>12} {:>9} | {:>12} {:>9} | {:>7}",
            "payload", "sl msgs/s", "sl MB/s", "tcp msgs/s", "tcp MB/s", "msgs/s"
        );
        let _ = writeln!(s, "{}", "-".repeat(70));
        for c in &r.throughput {
            let _ = writeln!(
                s,
                "{:<8} | {:>12} {:>9.1} | {:>12} {:>9.1} | {:>7}",
                format!("{} B", c.payload),
                thousands(c.surelink.median_msgs_per_s),
                c.surelink.median_mb_per_s,
                thousands(c.tcp.median_msgs_per_s),
                c.tcp.median_mb_per_s,
                fmt_ratio(c.ratio_msgs_per_s),
            );
        }
    }
    s
}

// ---------------------------------------------------------------------------
// The plot
// ---------------------------------------------------------------------------

mod plot {
    //! Latency by percentile, one panel per case: x = round trip (µs, log
    //! scale), y = percentile on a "nines" scale (0, 90, 99, 99.9, ...), so
    //! both the body and the tail are visible.

    use std::path::Path;

    use anyhow::Result;
    use hdrhistogram::Histogram;
    use plotters::prelude::*;
    use plotters::style::{register_font, FontStyle};

    use super::LatencyCase;

    const FONT_CANDIDATES: [&str; 4] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ];

    /// Registers a TTF as "sans-serif" (the ab_glyph backend has no system
    /// fonts). `SURELINK_BENCH_FONT` overrides the search.
    fn register_sans_serif() -> bool {
        let from_env = std::env::var("SURELINK_BENCH_FONT").ok();
        for path in from_env.iter().map(String::as_str).chain(FONT_CANDIDATES) {
            let Ok(bytes) = std::fs::read(path) else {
                continue;
            };
            // plotters keeps the font for the rest of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
        false
    }

    /// Percentile as "nines": -log10(1 - q), capped at `top`.
    fn nines(q: f64, top: f64) -> f64 {
        if q >= 1.0 {
            top
        } else {
            (-(1.0 - q).log10()).clamp(0.0, top)
        }
    }

    fn nines_label(y: f64) -> String {
        const LABELS: [&str; 7] = ["0", "90", "99", "99.9", "99.99", "99.999", "99.9999"];
        LABELS
            .iter()
            .enumerate()
            .find(|(k, _)| (y - *k as f64).abs() < 1e-6)
            .map_or_else(String::new, |(_, l)| format!("{l}%"))
    }

    /// The histogram's CDF as (µs, nines) points.
    fn cdf(h: &Histogram<u64>, top: f64) -> Vec<(f64, f64)> {
        let mut points = vec![(h.min() as f64 / 1e3, 0.0)];
        points.extend(
            h.iter_recorded()
                .map(|v| (v.value_iterated_to() as f64 / 1e3, nines(v.quantile(), top))),
        );
        points
    }

    /// Draws `path`. Returns false (after a warning) when no font is found.
    pub(super) fn latency_cdf(path: &Path, cases: &[LatencyCase]) -> Result<bool> {
        if !register_sans_serif() {
            eprintln!(
                "warning: no TTF font found (tried {}; set SURELINK_BENCH_FONT to one); {} not written",
                FONT_CANDIDATES.join(", "),
                path.display()
            );
            return Ok(false);
        }
        let cols = if cases.len() > 1 { 2 } else { 1 };
        let rows = cases.len().div_ceil(cols);
        let width = u32::try_from(cols * 640)?;
        let height = u32::try_from(rows * 420)? + 50;
        let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (title, body) = root.split_vertically(50);
        title.draw_text(
            "Round-trip latency by percentile: surelink (2 paths) vs plain TCP, all rounds",
            &("sans-serif", 22).into_font().color(&BLACK),
            (20, 15),
        )?;
        let panels = body.split_evenly((rows, cols));
        for (case, panel) in cases.iter().zip(panels.iter()) {
            let sides = [
                ("surelink", &case.surelink.merged, BLUE),
                ("plain TCP", &case.tcp.merged, RED),
            ];
            let count = sides.iter().map(|(_, h, _)| h.len()).min().unwrap_or(0);
            // As many nines as there are samples to support them.
            let steps: usize = match count {
                0..1_000 => 2,
                1_000..10_000 => 3,
                10_000..100_000 => 4,
                100_000..1_000_000 => 5,
                _ => 6,
            };
            let top = f64::from(u32::try_from(steps)?);
            let series: Vec<_> = sides
                .iter()
                .filter(|(_, h, _)| !h.is_empty())
                .map(|(name, h, color)| (*name, cdf(h, top), *color))
                .collect();
            let xs = series
                .iter()
                .flat_map(|(_, p, _)| p.iter().map(|&(x, _)| x));
            let lo = xs.clone().fold(f64::INFINITY, f64::min).max(0.1) * 0.8;
            let hi = xs.fold(0.0, f64::max).max(lo * 2.0) * 1.25;
            let callers = if case.callers == 1 {
                "1 caller".to_owned()
            } else {
                format!("{} concurrent callers", case.callers)
            };
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    format!("{} B payload, {callers}", case.payload),
                    ("sans-serif", 18),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d((lo..hi).log_scale(), 0.0..top)?;
            chart
                .configure_mesh()
                .x_desc("round trip (µs, log scale)")
                .y_desc("percentile")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_labels(4 * steps + 1)
                .y_label_formatter(&|y| nines_label(*y))
                .draw()?;
            for (name, points, color) in series {
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_split_anywhere() {
        let mut wire = BytesMut::new();
        put_frame(&mut wire, 7, b"hello").unwrap();
        put_frame(&mut wire, 8, b"").unwrap();
        let whole = wire.freeze();
        for cut in 0..=whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            let mut got = Vec::new();
            while let Some(f) = take_frame(&mut buf).unwrap() {
                got.push(f);
            }
            buf.extend_from_slice(&whole[cut..]);
            while let Some(f) = take_frame(&mut buf).unwrap() {
                got.push(f);
            }
            assert_eq!(
                got,
                vec![(7, Bytes::from_static(b"hello")), (8, Bytes::new())]
            );
        }
        let mut h = BytesMut::new();
        h.extend_from_slice(&frame_header(9, 3).unwrap());
        h.extend_from_slice(b"abc");
        assert_eq!(
            take_frame(&mut h).unwrap(),
            Some((9, Bytes::from_static(b"abc")))
        );
        let mut bad = BytesMut::from(&[0u8, 0, 0, 3][..]);
        assert!(take_frame(&mut bad).is_err());
    }

    #[test]
    fn medians_and_formatting() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
        assert_eq!(median(std::iter::empty()), 0.0);
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(ratio(2.0, 0.0), None);
        assert_eq!(Contender::order(1), [Contender::Tcp, Contender::Surelink]);
    }
}
