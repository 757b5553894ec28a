//! `attack unacked`: a member (node 2) sends `--calls` requests of
//! `--body` bytes to an echo server (`surelink serve`, node 1) and never
//! acknowledges the replies: it speaks the protocol with the core's own
//! handshake, records and endpoint over a plain socket, and strips every
//! ACK frame it would send. Meanwhile another member (node 3) calls the
//! server every 10 ms. Reports the legitimate calls answered and their
//! p99, the server's RSS before, during and after (the attacker closes its
//! session at the end), and the server's `surelink_peer_bytes_held` gauge
//! for the attacker where the binary has one.
//!
//! Also the target helpers `attack epochs` shares: keys and configuration
//! in a temporary directory, the server started from `--surelink-bin`, the
//! legitimate caller, RSS and metrics sampling.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use clap::Args;
use parking_lot::Mutex;

use surelink::proto::secure::{Handshake, Keypair, Members, Protection};
use surelink::proto::wire::FrameKind;
use surelink::proto::{
    ChannelId, ClusterId, Endpoint as Core, EndpointConfig, Epoch, Event, LocalIdentity, NodeId,
    PathId, Time,
};
use surelink::CallOptions;
use surelink_lab::child::{Child, Command, Output};

/// The cluster the target and its members use.
pub(super) const CLUSTER: u64 = 7;
/// The server's node id (the attacker is 2, the legitimate caller 3).
pub(super) const SERVER: NodeId = NodeId(1);
pub(super) const ATTACKER: NodeId = NodeId(2);

/// Where the target comes from and where the result goes.
#[derive(Args, Clone, Debug)]
pub(crate) struct TargetArgs {
    /// The `surelink` binary to attack (default: the one next to this
    /// executable).
    #[arg(long)]
    pub(crate) surelink_bin: Option<PathBuf>,
    /// Where the JSON result goes.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

/// `attack unacked` options.
#[derive(Args, Clone, Debug)]
pub(crate) struct UnackedArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Calls the attacker sends.
    #[arg(long, default_value_t = 4096)]
    pub(crate) calls: usize,
    /// Bytes of each request (echoed back as the reply).
    #[arg(long, default_value_t = 64 << 10)]
    pub(crate) body: usize,
    /// How long the attacker keeps its session open after its last call.
    #[arg(long, default_value_t = 5)]
    pub(crate) hold_secs: u64,
    /// The attack ends after this long even if the server has not taken
    /// every call (a server that holds the attacker back never does).
    #[arg(long, default_value_t = 30)]
    pub(crate) max_secs: u64,
}

/// A started target: the server process, its addresses, the members' keys.
pub(super) struct Target {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
    pub(super) metrics: SocketAddr,
    pub(super) dir: PathBuf,
    pub(super) attacker: Keypair,
    pub(super) members: Arc<Members>,
    pub(super) bin: PathBuf,
}

fn free_port() -> Result<u16> {
    surelink_lab::host::free_port("127.0.0.1".parse()?)
}

fn write_key(dir: &Path, name: &str, k: &Keypair) -> Result<PathBuf> {
    let path = dir.join(format!("{name}.key"));
    surelink_node::keys::write_secret(&path, k).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(path)
}

impl Target {
    /// Writes keys and configurations into a fresh temporary directory and
    /// starts `surelink serve` (node 1) with the product's defaults.
    pub(super) fn start(args: &TargetArgs, name: &str) -> Result<Target> {
        let bin = super::surelink_bin(args.surelink_bin.as_deref())?;
        let dir =
            std::env::temp_dir().join(format!("surelink-attack-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let gen = || Keypair::generate().map_err(|e| anyhow::anyhow!("key pair: {e}"));
        let (server, attacker, legit) = (gen()?, gen()?, gen()?);
        write_key(&dir, "server", &server)?;
        write_key(&dir, "legit", &legit)?;
        let port = free_port()?;
        let mport = free_port()?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let metrics: SocketAddr = format!("127.0.0.1:{mport}").parse()?;
        let text = format!(
            "node = 1\ncluster = {CLUSTER}\nkey_file = \"server.key\"\nlisten = [\"{addr}\"]\nmetrics = \"{metrics}\"\n\n[[members]]\nnode = 2\npublic_key = \"{}\"\n\n[[members]]\nnode = 3\npublic_key = \"{}\"\n",
            attacker.public(),
            legit.public()
        );
        std::fs::write(dir.join("server.toml"), text)?;
        let legit_text = format!(
            "node = 3\ncluster = {CLUSTER}\nkey_file = \"legit.key\"\ndial_from = [\"127.0.0.1:0\"]\n\n[[members]]\nnode = 1\npublic_key = \"{}\"\n\n[[peers]]\nnode = 1\naddrs = [\"{addr}\"]\n",
            server.public()
        );
        std::fs::write(dir.join("legit.toml"), &legit_text)?;
        write_key(&dir, "attacker", &attacker)?;
        std::fs::write(
            dir.join("attacker.toml"),
            legit_text
                .replace("node = 3\n", "node = 2\n")
                .replace("legit.key", "attacker.key"),
        )?;
        let mut members = Members::new();
        members.insert(SERVER, server.public())?;
        let child = Command::new("surelink serve", &bin)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("server.toml"))
            .stdout(Output::Null)
            .stderr(Output::Log(dir.join("server.log")))
            .die_with_parent()
            .spawn()?;
        let t = Target {
            child,
            addr,
            metrics,
            dir,
            attacker,
            members: Arc::new(members),
            bin,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            t.child.check()?;
            if Instant::now() > until {
                bail!("the server did not listen on {addr}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(t)
    }

    /// The server's resident memory now, MiB.
    pub(super) fn rss_mib(&self) -> f64 {
        super::rss_kib(self.child.pid()) as f64 / 1024.0
    }

    /// The server's `surelink_peer_bytes_held` for `peer`, if its binary
    /// has the gauge.
    pub(super) fn held_bytes(&self, peer: NodeId) -> Option<u64> {
        let mut s = TcpStream::connect_timeout(&self.metrics, Duration::from_secs(1)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let key = format!("surelink_peer_bytes_held{{peer=\"{peer}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .or_else(|| text.contains("surelink_peer_bytes_held").then_some(0))
    }

    /// The legitimate member's configuration.
    pub(super) fn legit_config(&self) -> Result<surelink::Config> {
        Ok(surelink_node::config_file::load(&self.dir.join("legit.toml"))?.config)
    }

    /// The attacker's configuration (as a library endpoint).
    pub(super) fn attacker_config(&self) -> Result<surelink::Config> {
        Ok(surelink_node::config_file::load(&self.dir.join("attacker.toml"))?.config)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Legitimate calls: a 64-byte echo every 10 ms, each with a 2 s timeout.
#[derive(Default)]
pub(super) struct Legit {
    pub(super) total: AtomicU64,
    pub(super) answered: AtomicU64,
    pub(super) rtts_us: Mutex<Vec<u64>>,
}

impl Legit {
    /// Calls until `stop`.
    pub(super) async fn run(self: Arc<Self>, cfg: surelink::Config, stop: Arc<AtomicBool>) {
        let Ok(ep) = surelink::Endpoint::bind(cfg).await else {
            return;
        };
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let t = Instant::now();
            self.total.fetch_add(1, Ordering::Relaxed);
            let r = ep
                .call(
                    SERVER,
                    0,
                    Bytes::from_static(&[7; 64]),
                    Duration::from_secs(2),
                )
                .await;
            if r.is_ok() {
                self.answered.fetch_add(1, Ordering::Relaxed);
                self.rtts_us
                    .lock()
                    .push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
        }
        ep.shutdown().await;
    }

    /// (answered, total, p99 in microseconds).
    pub(super) fn summary(&self) -> (u64, u64, u64) {
        let mut v = self.rtts_us.lock().clone();
        v.sort_unstable();
        let p99 = if v.is_empty() {
            0
        } else {
            v[((v.len() - 1) * 99) / 100]
        };
        (
            self.answered.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
            p99,
        )
    }
}

/// RSS samples of the target, MiB, with the held-bytes gauge.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) rss: Vec<(f64, f64)>,
    pub(super) held: Vec<(f64, u64)>,
}

/// Samples the target every 250 ms until `stop`.
pub(super) async fn sample(t: &Target, t0: Instant, stop: &AtomicBool, s: &Mutex<Samples>) {
    while !stop.load(Ordering::Relaxed) {
        let at = t0.elapsed().as_secs_f64();
        let rss = t.rss_mib();
        let held = t.held_bytes(ATTACKER);
        {
            let mut g = s.lock();
            g.rss.push((at, rss));
            if let Some(h) = held {
                g.held.push((at, h));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the attacker did.
#[derive(Debug, Default, serde::Serialize)]
struct AttackerReport {
    calls_sent: usize,
    replies_received: usize,
    acks_withheld: u64,
}

/// Copies `plain`'s frames into `out`, leaving out ACK frames; returns
/// how many it left out.
fn strip_acks(plain: &[u8], out: &mut BytesMut) -> u64 {
    let mut at = 0;
    let mut n = 0;
    while at + 8 <= plain.len() {
        let len = u32::from_be_bytes([plain[at + 4], plain[at + 5], plain[at + 6], plain[at + 7]])
            as usize;
        let end = (at + 8 + len).min(plain.len());
        if plain[at + 1] == FrameKind::Ack as u8 {
            n += 1;
        } else {
            out.extend_from_slice(&plain[at..end]);
        }
        at = end;
    }
    n
}

/// The attacker: the core endpoint over a socket, without acknowledgements.
fn attacker(
    addr: SocketAddr,
    keys: &Keypair,
    members: Arc<Members>,
    a: &UnackedArgs,
    progress: &AtomicU64,
) -> Result<AttackerReport> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut hs = Handshake::initiator(
        keys,
        members,
        ClusterId(CLUSTER),
        Protection::default(),
        SERVER,
    )?;
    let mut out = BytesMut::new();
    let mut raw = BytesMut::new();
    let mut tmp = vec![0u8; 256 << 10];
    let est = loop {
        if hs.poll_transmit(&mut out) {
            s.write_all(&out)?;
            out.clear();
        }
        let n = s.read(&mut tmp)?;
        if n == 0 {
            bail!("the server closed the connection during the handshake");
        }
        raw.extend_from_slice(&tmp[..n]);
        if let Some(est) = hs.handle_input(&mut raw)? {
            if hs.poll_transmit(&mut out) {
                s.write_all(&out)?;
                out.clear();
            }
            break est;
        }
    };
    let (mut sealer, mut opener) = (est.sealer, est.opener);
    let t0 = Instant::now();
    let now = || Time::from_nanos(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let epoch = Epoch(u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?);
    let local = LocalIdentity {
        cluster: ClusterId(CLUSTER),
        node: ATTACKER,
        epoch,
    };
    let mut core = Core::new(EndpointConfig::default(), local)?;
    core.add_path(now(), PathId(1), Some(SERVER))?;
    s.set_read_timeout(Some(Duration::from_millis(2)))?;
    let body = Bytes::from(vec![0x5a; a.body]);
    let opts = CallOptions::new(Duration::from_secs(600));
    let mut rep = AttackerReport::default();
    let mut plain = BytesMut::new();
    let mut tx = BytesMut::new();
    let mut last_call = Instant::now();
    let mut up = false;
    loop {
        let t = now();
        while up && rep.calls_sent < a.calls && core.can_send(SERVER, body.len() + 64) {
            core.call(t, SERVER, ChannelId(0), body.clone(), &opts)?;
            rep.calls_sent += 1;
            last_call = Instant::now();
            progress.store(rep.calls_sent as u64, Ordering::Relaxed);
        }
        while core.poll_transmit(t, &mut tx, 256 << 10).is_some() {
            let mut kept = BytesMut::new();
            rep.acks_withheld += strip_acks(&tx, &mut kept);
            tx.clear();
            out.clear();
            sealer.seal([&kept[..]], &mut out)?;
            s.write_all(&out)?;
        }
        match s.read(&mut tmp) {
            Ok(0) => bail!("the server closed the connection"),
            Ok(n) => {
                raw.extend_from_slice(&tmp[..n]);
                opener.open(&mut raw, &mut plain)?;
                core.handle_input(now(), PathId(1), &mut plain)?;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
        if core.poll_timeout().is_some_and(|d| d <= now()) {
            core.handle_timeout(now());
        }
        while let Some(ev) = core.poll_event() {
            match ev {
                Event::PeerUp { .. } => up = true,
                Event::CallDone { result: Ok(_), .. } => rep.replies_received += 1,
                _ => {}
            }
        }
        let finished =
            rep.calls_sent >= a.calls && last_call.elapsed() >= Duration::from_secs(a.hold_secs);
        if finished || t0.elapsed() >= Duration::from_secs(a.max_secs) {
            break;
        }
    }
    // Leave: a session CLOSE, so the server ends the session at once.
    core.close_session(now(), SERVER);
    while core.poll_transmit(now(), &mut tx, 256 << 10).is_some() {
        let mut kept = BytesMut::new();
        strip_acks(&tx, &mut kept);
        tx.clear();
        out.clear();
        sealer.seal([&kept[..]], &mut out)?;
        s.write_all(&out)?;
    }
    std::thread::sleep(Duration::from_millis(100));
    Ok(rep)
}

/// Max of the samples in `[from, to)` seconds.
pub(super) fn max_in(v: &[(f64, f64)], from: f64, to: f64) -> f64 {
    v.iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, x)| *x)
        .fold(0.0, f64::max)
}

/// Writes `value` as JSON to `--out` or `default`.
pub(super) fn write_json(
    args: &TargetArgs,
    default: &str,
    value: &serde_json::Value,
) -> Result<()> {
    let path = args.out.clone().unwrap_or_else(|| PathBuf::from(default));
    std::fs::write(&path, serde_json::to_string_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("result: {}", path.display());
    Ok(())
}

pub(super) async fn run(a: &UnackedArgs) -> Result<()> {
    let t = Target::start(&a.target, "unacked")?;
    println!(
        "target: {} (pid {}) on {}",
        t.bin.display(),
        t.child.pid(),
        t.addr
    );
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let legit = Arc::new(Legit::default());
    let legit_task = tokio::spawn(legit.clone().run(t.legit_config()?, stop.clone()));
    let samples = Mutex::new(Samples::default());
    let progress = Arc::new(AtomicU64::new(0));
    let sampling = sample(&t, t0, &stop, &samples);
    let work = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = t.rss_mib();
        let start = t0.elapsed().as_secs_f64();
        println!(
            "before: RSS {before:.1} MiB; attacker sends {} calls of {} bytes",
            a.calls, a.body
        );
        let (addr, keys, members, args, p) = (
            t.addr,
            t.attacker.clone(),
            t.members.clone(),
            a.clone(),
            progress.clone(),
        );
        let mut h = tokio::task::spawn_blocking(move || attacker(addr, &keys, members, &args, &p));
        let rep = loop {
            tokio::select! {
                r = &mut h => break r?,
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    let (ok, total, _) = legit.summary();
                    println!(
                        "  t={:5.1}s calls sent {:5}  RSS {:7.1} MiB  held {:>12}  legit {ok}/{total}",
                        t0.elapsed().as_secs_f64(),
                        progress.load(Ordering::Relaxed),
                        t.rss_mib(),
                        t.held_bytes(ATTACKER).map_or("-".into(), |b| b.to_string()),
                    );
                }
            }
        };
        let end = t0.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = t.rss_mib();
        anyhow::Ok((before, start, end, after, rep))
    };
    let (r, ()) = tokio::join!(
        async {
            let r = work.await;
            stop.store(true, Ordering::Relaxed);
            r
        },
        sampling
    );
    let (before, start, end, after, rep) = r?;
    let _ = legit_task.await;
    let rep = rep.map_err(|e| anyhow::anyhow!("attacker: {e:#}"));
    let (ok, total, p99) = legit.summary();
    let s = samples.lock();
    let during = max_in(&s.rss, start, end);
    let held_max = s.held.iter().map(|(_, h)| *h).max();
    let held_after = s.held.last().map(|(_, h)| *h);
    println!("attacker: {rep:?}");
    println!("legitimate calls answered {ok}/{total}, p99 {p99} µs");
    println!(
        "server RSS: before {before:.1} MiB, during (max) {during:.1} MiB, after {after:.1} MiB"
    );
    println!(
        "held for the attacker: max {}, at the end {}",
        held_max.map_or("- (no gauge)".into(), |b| format!("{b} B")),
        held_after.map_or("-".into(), |b| format!("{b} B"))
    );
    let rep = rep.unwrap_or_default();
    write_json(
        &a.target,
        "attack-unacked.json",
        &serde_json::json!({
            "attack": "unacked",
            "binary": t.bin.display().to_string(),
            "calls": a.calls, "body": a.body,
            "attacker": rep,
            "legit": {"answered": ok, "total": total, "p99_us": p99},
            "rss_mib": {"before": before, "during_max": during, "after": after},
            "held_bytes": {"max": held_max, "last": held_after},
            "rss_series": s.rss, "held_series": s.held,
        }),
    )
}
