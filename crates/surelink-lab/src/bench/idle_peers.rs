//! `surelink-lab bench idle-peers`: what failure detection costs a server
//! per connected peer, idle and under load.
//!
//! One `surelink serve` (the echo server, default configuration, two
//! networks: 127.0.1.1 and 127.0.2.1) and N `surelink call` clients, each
//! its own process and member (keys made for the run) with addresses of
//! its own (127.10.x.y and 127.20.x.y, 50 per /24, as hosts of their own
//! would be), connected on both networks. The server's `max_connections`
//! is raised to 4096 (the default 1024 holds 500 two-network clients only
//! with members' addresses listed); nothing else is tuned. Idle: each client makes one call and then waits. Loaded: each
//! calls every `--loaded-interval-ms`. Measured over `--seconds`, after
//! the clients are up and their start has quietened (their shared log
//! stopped growing for 3 s, at most 60 s; the step reports how long that
//! took and the start's failed handshakes and fences, from that log — a
//! build that keeps its connections through the start would otherwise be
//! measured sooner, churn and all): the server's CPU (utime + stime from
//! /proc, % of one core), every client's CPU summed, and what crossed the
//! loopback interface (packets and bytes per second; heartbeats are most
//! of it when idle).
//!
//! With `--baseline-bin` (an older `surelink` binary) each step runs with
//! both builds, alternating, so the ratio comes from one run on one
//! machine. Server and clients share the machine's cores: a build whose
//! clients saturate them shows a server throttled by it (the clients' CPU
//! is reported next to it, and the step is marked saturated).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

use super::idle_peers_churn::{self as churn, Churn};

/// `surelink-lab bench idle-peers`.
#[derive(clap::Args, Debug)]
pub(crate) struct IdlePeersArgs {
    /// Client counts to measure, idle.
    #[arg(long, value_delimiter = ',', default_value = "0,10,100,500")]
    peers: Vec<usize>,
    /// Client count measured under load as well (0: none).
    #[arg(long, default_value_t = 100)]
    loaded_peers: usize,
    /// Under load, each client calls this often.
    #[arg(long, default_value_t = 50)]
    loaded_interval_ms: u64,
    /// Seconds measured per step.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// Rounds (each build once per round, alternating).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The `surelink` binary measured (default: next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// An older `surelink` binary measured in the same run.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// A third arm, `tuned`: the measured build with these `[detector]`
    /// settings in every configuration (TOML lines, e.g.
    /// "slow_after_ms = 10000"); the other arms keep the defaults.
    #[arg(long)]
    tuned: Option<String>,
    /// Directory for idle_peers.json and idle_peers.png.
    #[arg(long, default_value = "results/bench")]
    out: PathBuf,
    /// Measure nothing: print the table and draw the plot of an earlier
    /// run's idle_peers.json.
    #[arg(long)]
    from_json: Option<PathBuf>,
}

/// One measured step.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct Step {
    build: String,
    peers: usize,
    loaded: bool,
    round: usize,
    /// The server's CPU, % of one core.
    server_cpu_pct: f64,
    /// Of it, the failure detector's threads (on loopback their sends
    /// also pay the receiving clients' kernel work).
    server_detector_cpu_pct: f64,
    /// Every client's CPU summed, % of one core.
    clients_cpu_pct: f64,
    /// Loopback packets per second (both directions counted once).
    lo_packets_per_s: f64,
    /// Loopback bytes per second.
    lo_bytes_per_s: f64,
    /// Clients that were still running at the end.
    clients_alive: usize,
    /// Established connections to the server as the measurement began
    /// (two per client when all are in).
    connections: usize,
    /// Established connections as it ended (fewer: clients reconnected
    /// during the step, which then measured more than the idle state).
    #[serde(default)]
    connections_after: usize,
    /// Server plus clients used ≥ 90 % of the machine's cores.
    saturated: bool,
    /// Seconds from the last client's start until the clients' log was
    /// quiet (the measurement began then).
    #[serde(default)]
    settle_s: f64,
    /// What the clients logged from their start to the step's end.
    #[serde(default)]
    churn: Churn,
}

const CLUSTER: u64 = 7;
const SERVER: u64 = 1;

pub(crate) fn ticks_of(pid: u32) -> u64 {
    ticks_of_path(&format!("/proc/{pid}/stat"))
}

fn ticks_of_path(path: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string(path) else {
        return 0;
    };
    // Fields after the command name (which may hold spaces): utime is the
    // 14th field, stime the 15th.
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// CPU ticks of `pid`'s failure-detector threads (named `surelink-hb-*`).
pub(crate) fn detector_ticks_of(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("surelink-hb"))
        })
        .filter_map(|t| t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .map(|tid| ticks_of_path(&format!("/proc/{pid}/task/{tid}/stat")))
        .sum()
}

fn lo_counters() -> (u64, u64) {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/lo/statistics/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (read("tx_packets"), read("tx_bytes"))
}

/// /proc's clock ticks per second (`USER_HZ`: 100 on every Linux ABI).
pub(crate) const USER_HZ: f64 = 100.0;

/// Kills and reaps on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// The run's key files and configurations.
struct Setup {
    dir: PathBuf,
    port: u16,
}

impl Setup {
    fn new(peers: usize) -> Result<Setup> {
        let dir = std::env::temp_dir().join(format!("surelink-idle-peers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let nodes: Vec<surelink::proto::NodeId> = (SERVER..=SERVER + peers as u64)
            .map(surelink::proto::NodeId)
            .collect();
        surelink_node::keys::make_key_dir(&dir, &nodes)?;
        let ip = "127.0.1.1".parse()?;
        let port = surelink_lab::host::free_port(ip)?;
        Ok(Setup { dir, port })
    }

    fn public(&self, node: u64) -> Result<String> {
        Ok(
            std::fs::read_to_string(self.dir.join(format!("node-{node}.pub")))?
                .trim()
                .to_string(),
        )
    }

    /// The server's and every client's configuration files, with
    /// `detector` as their `[detector]` section (named with `tag`).
    fn write(
        &self,
        peers: usize,
        detector: Option<&str>,
        tag: &str,
    ) -> Result<(PathBuf, Vec<PathBuf>)> {
        let port = self.port;
        let section = detector.map_or(String::new(), |d| format!("\n[detector]\n{d}\n"));
        let mut server = format!(
            "node = {SERVER}\ncluster = {CLUSTER}\nkey_file = \"node-{SERVER}.key\"\n\
             listen = [\"127.0.1.1:{port}\", \"127.0.2.1:{port}\"]\nmax_connections = 4096\n"
        );
        for n in 0..peers as u64 {
            let node = SERVER + 1 + n;
            server.push_str(&format!(
                "\n[[members]]\nnode = {node}\npublic_key = \"{}\"\n",
                self.public(node)?
            ));
        }
        server.push_str(&section);
        let server_path = self.dir.join(format!("{tag}server.toml"));
        std::fs::write(&server_path, server)?;
        let server_key = self.public(SERVER)?;
        let mut clients = Vec::new();
        for n in 0..peers as u64 {
            let node = SERVER + 1 + n;
            let (hi, lo) = (n / 50, n % 50 + 1);
            let c = format!(
                "node = {node}\ncluster = {CLUSTER}\nkey_file = \"node-{node}.key\"\n\
                 dial_from = [\"127.10.{hi}.{lo}:0\", \"127.20.{hi}.{lo}:0\"]\n\n\
                 [[members]]\nnode = {SERVER}\npublic_key = \"{server_key}\"\n\n\
                 [[peers]]\nnode = {SERVER}\naddrs = [\"127.0.1.1:{port}\", \"127.0.2.1:{port}\"]\n"
            );
            let p = self.dir.join(format!("{tag}client-{node}.toml"));
            std::fs::write(&p, c + &section)?;
            clients.push(p);
        }
        Ok((server_path, clients))
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn wait_listening(addr: SocketAddr, within: Duration) -> Result<()> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("the server did not listen on {addr}")
}

/// What one step measured.
struct Measured {
    server: f64,
    detector: f64,
    clients: f64,
    packets: f64,
    bytes: f64,
    alive: usize,
    connections: usize,
    connections_after: usize,
    settle: Duration,
    churn: Churn,
}

/// Established TCP connections to the server's port (both networks), as
/// the measurement starts: every client should hold two.
fn established(port: u16) -> usize {
    let local = |line: &str| line.split_whitespace().nth(1).map(str::to_owned);
    let want = format!(":{port:04X}");
    ["/proc/net/tcp"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|s| s.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| {
            // st 01 = ESTABLISHED, on the server's side of the port.
            l.split_whitespace().nth(3) == Some("01")
                && local(l).is_some_and(|a| a.ends_with(&want))
        })
        .count()
}

/// One step: a server and `clients` with `bin`, measured.
fn step(
    bin: &Path,
    setup: &Setup,
    server_cfg: &Path,
    clients: &[PathBuf],
    loaded_interval: Option<u64>,
    seconds: f64,
    log: &Path,
) -> Result<Measured> {
    let mut procs = Procs(Vec::new());
    // The server's log, each step's after the last (why a client was
    // dropped, if one was).
    let log_path = log;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    {
        use std::io::Write;
        writeln!(log, "=== {} with {} clients", bin.display(), clients.len())?;
    }
    let server = Command::new(bin)
        .args(["serve", "--config"])
        .arg(server_cfg)
        .current_dir(&setup.dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let server_pid = server.id();
    procs.0.push(server);
    wait_listening(
        SocketAddr::new("127.0.1.1".parse()?, setup.port),
        Duration::from_secs(10),
    )?;
    let (count, interval) = match loaded_interval {
        // Far more calls than the step lasts.
        Some(ms) => (1_000_000u64, ms),
        // One call, then idle for longer than the step.
        None => (2, 3_600_000),
    };
    // The clients' logs, all in one file next to the server's (why a
    // client dropped its session, if one did).
    let client_log = log_path.with_file_name("idle_peers_clients.log");
    let mut clients_log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&client_log)
        .with_context(|| format!("opening {}", client_log.display()))?;
    {
        use std::io::Write;
        writeln!(
            clients_log,
            "=== {} with {} clients",
            bin.display(),
            clients.len()
        )?;
    }
    let churn_from = churn::log_len(&client_log);
    let mut client_pids = Vec::new();
    for c in clients {
        let child = Command::new(bin)
            .args(["call", "--peer", "1", "--count"])
            .arg(count.to_string())
            .arg("--interval-ms")
            .arg(interval.to_string())
            .arg("--config")
            .arg(c)
            .current_dir(&setup.dir)
            .stdout(Stdio::null())
            .stderr(clients_log.try_clone()?)
            .spawn()
            .context("starting a client")?;
        client_pids.push(child.id());
        procs.0.push(child);
        // Forty a second: 500 handshakes at once on two cores time out
        // and retry, and the step would measure the storm (at a hundred a
        // second the 500-client start still stormed now and then).
        std::thread::sleep(Duration::from_millis(25));
    }
    // Every client connected (two connections each) and past its first
    // call, then until the start has quietened: the step measures the
    // idle steady state.
    let started = Instant::now();
    let want = 2 * clients.len();
    let end = Instant::now() + Duration::from_secs(60);
    while established(setup.port) < want && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    churn::wait_quiet(&client_log, Duration::from_secs(3), Duration::from_secs(60));
    let settle = started.elapsed();
    let connections = established(setup.port);
    let hz = USER_HZ;
    let s0 = ticks_of(server_pid);
    let d0 = detector_ticks_of(server_pid);
    let c0: u64 = client_pids.iter().map(|p| ticks_of(*p)).sum();
    let (p0, b0) = lo_counters();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let dt = t0.elapsed().as_secs_f64();
    let s1 = ticks_of(server_pid);
    let d1 = detector_ticks_of(server_pid);
    let c1: u64 = client_pids.iter().map(|p| ticks_of(*p)).sum();
    let (p1, b1) = lo_counters();
    let connections_after = established(setup.port);
    let alive = procs
        .0
        .iter_mut()
        .skip(1)
        .filter_map(|c| c.try_wait().ok())
        .filter(Option::is_none)
        .count();
    ensure!(
        matches!(procs.0[0].try_wait(), Ok(None)),
        "the server exited during the step"
    );
    let pct = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / hz / dt * 100.0;
    Ok(Measured {
        server: pct(s0, s1),
        detector: pct(d0, d1),
        clients: pct(c0, c1),
        packets: (p1 - p0) as f64 / dt,
        bytes: (b1 - b0) as f64 / dt,
        alive,
        connections,
        connections_after,
        settle,
        churn: churn::count(&client_log, churn_from),
    })
}

/// The table and the plot of earlier steps.
fn report(steps: &[Step], png: &Path) -> Result<()> {
    let mut builds: Vec<(String, PathBuf)> = Vec::new();
    for b in ["current", "tuned", "baseline"] {
        if steps.iter().any(|s| s.build == b) {
            builds.push((b.to_string(), PathBuf::new()));
        }
    }
    let mut plan: Vec<(usize, bool)> = steps.iter().map(|s| (s.peers, s.loaded)).collect();
    plan.sort_unstable();
    plan.dedup();
    plan.sort_by_key(|&(n, loaded)| (loaded, n));
    let peers: Vec<usize> = plan.iter().filter(|p| !p.1).map(|p| p.0).collect();
    print_table(steps, &builds, &plan);
    draw(steps, &builds, &peers, png)
}

pub(crate) async fn run(args: &IdlePeersArgs) -> Result<()> {
    if let Some(json) = &args.from_json {
        let steps: Vec<Step> = serde_json::from_str(
            &std::fs::read_to_string(json)
                .with_context(|| format!("reading {}", json.display()))?,
        )
        .with_context(|| format!("parsing {}", json.display()))?;
        let png = json.with_extension("png");
        report(&steps, &png)?;
        println!("wrote {}", png.display());
        return Ok(());
    }
    ensure!(
        args.seconds.is_finite() && (0.5..=600.0).contains(&args.seconds),
        "--seconds must be 0.5..600"
    );
    ensure!((1..=20).contains(&args.rounds), "--rounds must be 1..20");
    ensure!(
        args.peers.iter().all(|n| *n <= 2000) && args.loaded_peers <= 2000,
        "at most 2000 peers"
    );
    let _ = surelink_sys::raise_fd_limit();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let server_log = args.out.join("idle_peers_server.log");
    let _ = std::fs::remove_file(&server_log);
    let _ = std::fs::remove_file(server_log.with_file_name("idle_peers_clients.log"));
    let current = crate::attack::surelink_bin(args.surelink_bin.as_deref())?;
    let mut builds = vec![("current".to_string(), current.clone())];
    if args.tuned.is_some() {
        builds.push(("tuned".to_string(), current));
    }
    if let Some(b) = &args.baseline_bin {
        ensure!(b.exists(), "{} does not exist", b.display());
        builds.push(("baseline".to_string(), b.clone()));
    }
    let mut plan: Vec<(usize, bool)> = args.peers.iter().map(|n| (*n, false)).collect();
    if args.loaded_peers > 0 {
        plan.push((args.loaded_peers, true));
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let total = plan.len() * args.rounds * builds.len();
    let mut steps = Vec::new();
    let mut done = 0;
    for &(peers, loaded) in &plan {
        let setup = tokio::task::block_in_place(|| Setup::new(peers))?;
        let plain = setup.write(peers, None, "")?;
        let tuned = match &args.tuned {
            Some(t) => Some(setup.write(peers, Some(t), "tuned-")?),
            None => None,
        };
        for round in 0..args.rounds {
            // Alternate which build goes first.
            let mut order: Vec<&(String, PathBuf)> = builds.iter().collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for (name, bin) in order {
                done += 1;
                eprintln!(
                    "[{done}/{total}] {name}: {peers} peers{}, round {}",
                    if loaded { " under load" } else { " idle" },
                    round + 1
                );
                let interval = loaded.then_some(args.loaded_interval_ms);
                let (server_cfg, clients) = match (name.as_str(), &tuned) {
                    ("tuned", Some(t)) => t,
                    _ => &plain,
                };
                let m = tokio::task::block_in_place(|| {
                    step(
                        bin,
                        &setup,
                        server_cfg,
                        clients,
                        interval,
                        args.seconds,
                        &server_log,
                    )
                })?;
                let (server, clients_cpu) = (m.server, m.clients);
                let s = Step {
                    build: name.clone(),
                    peers,
                    loaded,
                    round,
                    server_cpu_pct: server,
                    server_detector_cpu_pct: m.detector,
                    clients_cpu_pct: clients_cpu,
                    lo_packets_per_s: m.packets,
                    lo_bytes_per_s: m.bytes,
                    clients_alive: m.alive,
                    connections: m.connections,
                    connections_after: m.connections_after,
                    saturated: server + clients_cpu >= 90.0 * cores,
                    settle_s: m.settle.as_secs_f64(),
                    churn: m.churn,
                };
                eprintln!(
                    "    server {:.1} % (detector threads {:.1} %) · clients {:.1} % · lo {:.0} pkt/s {:.0} B/s · {} alive · {}→{} connections{}",
                    s.server_cpu_pct,
                    s.server_detector_cpu_pct,
                    s.clients_cpu_pct,
                    s.lo_packets_per_s,
                    s.lo_bytes_per_s,
                    s.clients_alive,
                    s.connections,
                    s.connections_after,
                    if s.saturated { " · SATURATED" } else { "" }
                );
                eprintln!(
                    "    start: quiet after {:.1} s · clients logged {} warnings, {} failed handshakes, {} sessions ended",
                    s.settle_s,
                    s.churn.warnings,
                    s.churn.failed_handshakes,
                    s.churn.sessions_ended
                );
                steps.push(s);
                // Let the ports and the kernel settle.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let json = args.out.join("idle_peers.json");
    std::fs::write(&json, serde_json::to_string_pretty(&steps)?)?;
    let png = args.out.join("idle_peers.png");
    report(&steps, &png)?;
    println!("wrote {} and {}", json.display(), png.display());
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn med(steps: &[Step], build: &str, peers: usize, loaded: bool, f: fn(&Step) -> f64) -> f64 {
    median(
        steps
            .iter()
            .filter(|s| s.build == build && s.peers == peers && s.loaded == loaded)
            .map(f)
            .collect(),
    )
}

fn print_table(steps: &[Step], builds: &[(String, PathBuf)], plan: &[(usize, bool)]) {
    println!("\nserver CPU (% of one core) and loopback traffic, medians over rounds");
    println!(
        "{:>6} {:>7} {:>10} {:>14} {:>16} {:>14} {:>14}",
        "peers", "load", "build", "server CPU %", "detector thr. %", "clients CPU %", "lo pkt/s"
    );
    for &(peers, loaded) in plan {
        for (b, _) in builds {
            println!(
                "{:>6} {:>7} {:>10} {:>14.2} {:>16.2} {:>14.1} {:>14.0}",
                peers,
                if loaded { "loaded" } else { "idle" },
                b,
                med(steps, b, peers, loaded, |s| s.server_cpu_pct),
                med(steps, b, peers, loaded, |s| s.server_detector_cpu_pct),
                med(steps, b, peers, loaded, |s| s.clients_cpu_pct),
                med(steps, b, peers, loaded, |s| s.lo_packets_per_s),
            );
        }
        for (b, _) in builds {
            if steps
                .iter()
                .any(|s| s.build == *b && s.peers == peers && s.loaded == loaded && s.saturated)
            {
                println!(
                    "{:>6} {:>7} {:>10} saturated: the clients used the machine's cores",
                    "", "", b
                );
            }
        }
        // Each other arm against `current`, and `current` against the
        // baseline build.
        let cur = med(steps, "current", peers, loaded, |s| s.server_cpu_pct);
        for (b, _) in builds.iter().filter(|(b, _)| b != "current") {
            let other = med(steps, b, peers, loaded, |s| s.server_cpu_pct);
            let (label, r) = if b == "baseline" {
                ("cur/base", cur / other)
            } else {
                ("tuned/cur", other / cur)
            };
            println!("{:>6} {:>7} {:>10} {:>14.3}", "", "", label, r);
        }
    }
}

fn draw(steps: &[Step], builds: &[(String, PathBuf)], peers: &[usize], png: &Path) -> Result<()> {
    use plotters::prelude::*;
    crate::plot_style::require_font()?;
    let root = BitMapBackend::new(png, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_x = peers.iter().copied().max().unwrap_or(1).max(1) as f64;
    let max_y = steps
        .iter()
        .filter(|s| !s.loaded && !s.saturated)
        .map(|s| s.server_cpu_pct)
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Server CPU with idle client peers (saturated runs left out)",
            crate::plot_style::TITLE,
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    chart
        .configure_mesh()
        .x_desc("idle client peers")
        .y_desc("server CPU, % of one core")
        .draw()?;
    for (i, (b, _)) in builds.iter().enumerate() {
        let color = if i == 0 { BLUE } else { RED };
        // A point whose clients saturated the machine says nothing of the
        // server: left out (the table marks it).
        let pts: Vec<(f64, f64)> = peers
            .iter()
            .filter(|&&n| {
                !steps
                    .iter()
                    .any(|s| s.build == *b && s.peers == n && !s.loaded && s.saturated)
            })
            .map(|&n| (n as f64, med(steps, b, n, false, |s| s.server_cpu_pct)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(b.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
