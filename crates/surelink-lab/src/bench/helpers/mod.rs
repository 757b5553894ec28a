//! `surelink-lab bench helpers`: what PostMan helpers save a hot server
//! (issue 28). One `surelink serve` (the echo server, default settings
//! but for the helpers it lists and `max_connections`) pinned to core 0
//! in a cgroup capped at `--quota-pct` of it; on core 1, the load (N
//! client sessions in one process, one request outstanding each, open
//! loop at fixed total rates) and, in the helper arms, `--helpers`
//! `surelink helper` processes through which every client goes (no
//! direct path). Per arm and offered load: goodput, p50/p99, and the
//! headline — the server's CPU per completed request — plus the CPU of
//! every process per request. A step whose client core is ≥ 90 % busy is
//! marked invalid (the load, not the server, was the limit).
//!
//! Arms: `direct`; `self_clocking` (helpers, the default policy);
//! `adaptive` (helpers, PostMan's Algorithm 1); `activation` (clients
//! start direct and move by their own p99). What users run today, on the
//! same cores and cap: `memcached` (one thread, capped, every client
//! connected to it: the direct arm's counterpart) and `nutcracker` (the
//! clients through nutcracker on core 1, which pipelines their requests
//! to the capped memcached: the helpers' counterpart); their clients
//! read a `--payload`-byte value. Rounds alternate the arms.

mod load;
mod report;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use load::Window;
pub(crate) use load::{run as load, LoadArgs};
use surelink_lab::child::{Command, Output};
use surelink_lab::host::CpuCap;

pub(crate) const CLUSTER: u64 = 7;
pub(crate) const SERVER: u64 = 1;
/// Helpers are nodes 2, 3, …; clients start here.
pub(crate) const FIRST_CLIENT: u64 = 100;

/// `surelink-lab bench helpers`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct HelpersArgs {
    /// Client sessions.
    #[arg(long, default_value_t = 200)]
    clients: usize,
    /// Offered loads, requests per second.
    #[arg(long, value_delimiter = ',', default_value = "5000,10000,20000,30000")]
    rates: Vec<f64>,
    /// Arms to run: direct, self_clocking, adaptive, activation (clients
    /// start direct and move to helpers by their own p99; self-clocking
    /// helpers), activation_full_handshake (the same with `resume_paths =
    /// false`: each move a Noise XX handshake at the server, the baseline
    /// for resuming); and what users run today: memcached (every client
    /// connected to a capped one-thread memcached), nutcracker (the
    /// clients through nutcracker on the clients' core to it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,self_clocking,adaptive"
    )]
    arms: Vec<String>,
    /// The activation arm's SLA, ms (release at half of it).
    #[arg(long, default_value_t = 10)]
    sla_ms: u64,
    /// In the helper arms, SIGKILL the first helper halfway through the
    /// window: its clients must be served again (activation: over their
    /// direct paths; otherwise they have none, so this is for
    /// `activation`). Reports the longest gap any client saw.
    #[arg(long)]
    kill_helper: bool,
    /// Helper processes in the helper arms.
    #[arg(long, default_value_t = 2)]
    helpers: usize,
    /// The server's cap, % of core 0 (cgroup cpu quota; needs root).
    #[arg(long, default_value_t = 50)]
    quota_pct: u32,
    /// Request size, bytes.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Seconds measured per step.
    #[arg(long, default_value_t = 6.0)]
    seconds: f64,
    /// Rounds (every arm once per round, alternating).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// The `surelink` binary (default: next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// Directory for helpers.json and helpers.png.
    #[arg(long, default_value = "results/bench")]
    out: PathBuf,
    /// Measure nothing: print and plot (into `--out`) the steps of an
    /// earlier run's helpers.json.
    #[arg(long)]
    from_json: Option<PathBuf>,
}

/// One measured step.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct Step {
    pub(crate) arm: String,
    pub(crate) rate: f64,
    pub(crate) round: usize,
    pub(crate) window: Window,
    pub(crate) seconds: f64,
    /// The server's CPU, % of one core.
    pub(crate) server_cpu_pct: f64,
    /// Server CPU per completed request, µs.
    pub(crate) server_us_per_req: f64,
    /// Of it, the failure detector's threads (heartbeats with direct
    /// clients; relayed clients have none with the server), µs.
    pub(crate) server_detector_us_per_req: f64,
    /// Server, helpers and load together per completed request, µs.
    pub(crate) total_us_per_req: f64,
    /// Core 1 (load and helpers) busy, %.
    pub(crate) client_core_pct: f64,
    /// Client core ≥ 90 % busy: the step measured the load, not the server.
    pub(crate) invalid: bool,
}

fn surelink_bin(a: &HelpersArgs) -> Result<PathBuf> {
    if let Some(b) = &a.surelink_bin {
        return Ok(b.clone());
    }
    let me = std::env::current_exe()?;
    let b = me.with_file_name("surelink");
    if !b.exists() {
        bail!(
            "{} not found: build it (cargo build --release) or pass --surelink-bin",
            b.display()
        );
    }
    Ok(b)
}

/// utime + stime of `pid`, seconds.
pub(crate) fn cpu_of(pid: u32) -> f64 {
    super::idle_peers::ticks_of(pid) as f64 / super::idle_peers::USER_HZ
}

/// CPU of `pid`'s failure-detector threads (`surelink-hb-*`), seconds.
fn detector_cpu_of(pid: u32) -> f64 {
    super::idle_peers::detector_ticks_of(pid) as f64 / super::idle_peers::USER_HZ
}

/// (busy, total) jiffies of core `cpu` from /proc/stat.
pub(crate) fn core_jiffies(cpu: usize) -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let name = format!("cpu{cpu} ");
    let Some(line) = s.lines().find(|l| l.starts_with(&name)) else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The run's keys and configuration files.
struct Setup {
    dir: PathBuf,
    port: u16,
    helper_ports: Vec<u16>,
}

impl Setup {
    fn new(a: &HelpersArgs) -> Result<Setup> {
        let dir =
            std::env::temp_dir().join(format!("surelink-bench-helpers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut nodes = vec![surelink::proto::NodeId(SERVER)];
        nodes.extend((0..a.helpers as u64).map(|k| surelink::proto::NodeId(2 + k)));
        nodes.extend((0..a.clients as u64).map(|i| surelink::proto::NodeId(FIRST_CLIENT + i)));
        surelink_node::keys::make_key_dir(&dir, &nodes)?;
        let port = surelink_lab::host::free_port("127.0.1.1".parse()?)?;
        let mut helper_ports = Vec::new();
        for _ in 0..a.helpers {
            helper_ports.push(surelink_lab::host::free_port("127.0.0.1".parse()?)?);
        }
        Ok(Setup {
            dir,
            port,
            helper_ports,
        })
    }

    fn public(&self, node: u64) -> Result<String> {
        Ok(
            std::fs::read_to_string(self.dir.join(format!("node-{node}.pub")))?
                .trim()
                .to_string(),
        )
    }

    fn write(&self, a: &HelpersArgs) -> Result<()> {
        let port = self.port;
        let helpers: Vec<String> = (0..a.helpers).map(|k| (2 + k).to_string()).collect();
        let mut server = format!(
            "node = {SERVER}\ncluster = {CLUSTER}\nkey_file = \"node-{SERVER}.key\"\n\
             listen = [\"127.0.1.1:{port}\"]\nmax_connections = 4096\nhelpers = [{}]\n",
            helpers.join(", ")
        );
        let members = (0..a.helpers as u64)
            .map(|k| 2 + k)
            .chain((0..a.clients as u64).map(|i| FIRST_CLIENT + i));
        for node in members {
            server.push_str(&format!(
                "\n[[members]]\nnode = {node}\npublic_key = \"{}\"\n",
                self.public(node)?
            ));
        }
        std::fs::write(self.dir.join("server.toml"), server)?;
        let sk = self.public(SERVER)?;
        for (k, hp) in self.helper_ports.iter().enumerate() {
            let node = 2 + k;
            for policy in ["self_clocking", "adaptive"] {
                let h = format!(
                    "node = {node}\ncluster = {CLUSTER}\nkey_file = \"node-{node}.key\"\n\
                     dial_from = [\"127.0.1.{}:0\"]\n\n[helper]\nlisten = \"127.0.0.1:{hp}\"\n\
                     policy = \"{policy}\"\n\n[[members]]\nnode = {SERVER}\npublic_key = \"{sk}\"\n\n\
                     [[peers]]\nnode = {SERVER}\naddrs = [\"127.0.1.1:{port}\"]\n",
                    10 + k
                );
                std::fs::write(self.dir.join(format!("helper-{node}-{policy}.toml")), h)?;
            }
        }
        Ok(())
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if std::env::var_os("SURELINK_KEEP").is_some() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

use super::idle_peers::wait_listening;

/// One step: the server, the helpers (if the arm has them) and the load.
async fn step(
    a: &HelpersArgs,
    bin: &Path,
    s: &Setup,
    arm: &str,
    rate: f64,
) -> Result<(Window, [f64; 5], f64)> {
    let cap = match CpuCap::new("bench-helpers", a.quota_pct, Duration::from_millis(10)) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("warning: the server runs uncapped: {e:#}");
            None
        }
    };
    let mc = matches!(arm, "memcached" | "nutcracker");
    let (server, mc_addr) = if mc {
        let (p, addr) = spawn_memcached(s)?;
        (p, Some(addr))
    } else {
        let log = s.dir.join("server.log");
        let p = Command::new("server", "taskset")
            .args(["-c", "0"])
            .arg(bin)
            .args(["serve", "--config"])
            .arg(s.dir.join("server.toml"))
            .stdout(Output::Null)
            .stderr(Output::Log(log))
            .die_with_parent()
            .spawn()?;
        (p, None)
    };
    if let Some(c) = &cap {
        c.add(server.pid())?;
    }
    let mut helpers = Vec::new();
    let via = !mc && arm != "direct";
    let mc_addr = match mc_addr {
        Some(m) => {
            wait_listening(m, Duration::from_secs(10))?;
            if arm == "nutcracker" {
                let (n, addr) = spawn_nutcracker(s, m)?;
                helpers.push(n);
                wait_listening(addr, Duration::from_secs(10))?;
                Some(addr)
            } else {
                Some(m)
            }
        }
        None => {
            wait_listening(
                std::net::SocketAddr::new("127.0.1.1".parse()?, s.port),
                Duration::from_secs(10),
            )?;
            None
        }
    };
    if via {
        for (k, hp) in s.helper_ports.iter().enumerate() {
            let policy = if arm == "adaptive" {
                "adaptive"
            } else {
                "self_clocking"
            };
            let cfg = s.dir.join(format!("helper-{}-{policy}.toml", 2 + k));
            helpers.push(
                Command::new(format!("helper-{k}"), "taskset")
                    .args(["-c", "1"])
                    .arg(bin)
                    .args(["helper", "--config"])
                    .arg(cfg)
                    .stdout(Output::Null)
                    .stderr(Output::Log(s.dir.join(format!("helper-{k}.log"))))
                    .die_with_parent()
                    .spawn()?,
            );
            wait_listening(
                std::net::SocketAddr::new("127.0.0.1".parse()?, *hp),
                Duration::from_secs(10),
            )?;
        }
    }
    let me = std::env::current_exe()?;
    let mut load = Command::new("load", "taskset")
        .args(["-c", "1"])
        .arg(me)
        .arg("bench-helpers-load")
        .arg("--dir")
        .arg(&s.dir)
        .args(["--port", &s.port.to_string()])
        .args(["--clients", &a.clients.to_string()])
        .args(["--rate", &rate.to_string()])
        .args(["--payload", &a.payload.to_string()])
        .args(["--seconds", &a.seconds.to_string()]);
    if let Some(m) = mc_addr {
        load = load.args(["--memcached", &m.to_string()]);
    }
    if via {
        let addrs: Vec<String> = s
            .helper_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        load = load.args(["--helpers", &addrs.join(",")]);
        if arm.starts_with("activation") {
            load = load.args(["--activate-sla-ms", &a.sla_ms.to_string()]);
        }
        if arm == "activation_full_handshake" {
            load = load.arg("--no-resume");
        }
    }
    let load = load
        .stdout(Output::Lines)
        .stderr(Output::Log(s.dir.join("load.log")))
        .die_with_parent()
        .spawn()?;
    let setup_time = Duration::from_secs(60 + a.clients as u64 / 10);
    if load
        .wait_for_async(setup_time, |l| l.starts_with("MEASURE START"))
        .await
        .is_none()
    {
        bail!(
            "the load did not start (see {}/load.log): {:?}",
            s.dir.display(),
            load.lines()
        );
    }
    if a.kill_helper && !helpers.is_empty() {
        let victim = helpers.remove(0);
        let half = Duration::from_secs_f64(a.seconds / 2.0);
        tokio::spawn(async move {
            tokio::time::sleep(half).await;
            victim.kill();
            eprintln!("    killed helper 0 halfway through the window");
        });
    }
    let pids: Vec<u32> = std::iter::once(server.pid())
        .chain(helpers.iter().map(|h| h.pid()))
        .chain(std::iter::once(load.pid()))
        .collect();
    let before: Vec<f64> = pids.iter().map(|&p| cpu_of(p)).collect();
    let det0 = detector_cpu_of(server.pid());
    let c1 = core_jiffies(1);
    let t0 = std::time::Instant::now();
    let end = load
        .wait_for_async(Duration::from_secs_f64(a.seconds + 30.0), |l| {
            l.starts_with("MEASURE END")
        })
        .await
        .context("the load did not finish its window")?;
    let secs = t0.elapsed().as_secs_f64();
    let after: Vec<f64> = pids.iter().map(|&p| cpu_of(p)).collect();
    let det = detector_cpu_of(server.pid()) - det0;
    let c1b = core_jiffies(1);
    let w: Window = serde_json::from_str(end.trim_start_matches("MEASURE END").trim())?;
    let used: Vec<f64> = before.iter().zip(&after).map(|(b, a)| a - b).collect();
    let server_cpu = used[0];
    let helpers_cpu: f64 = used[1..used.len() - 1].iter().sum();
    let load_cpu = used[used.len() - 1];
    let client_core = (c1b.0 - c1.0) as f64 / ((c1b.1 - c1.1).max(1)) as f64 * 100.0;
    drop(load);
    drop(helpers);
    drop(server);
    drop(cap);
    Ok((
        w,
        [server_cpu, helpers_cpu, load_cpu, client_core, det],
        secs,
    ))
}

/// The programs users run today, when installed.
fn memcached_bin() -> Option<PathBuf> {
    surelink_lab::host::find_program("memcached", &["/usr/bin", "/usr/local/bin"])
}

fn nutcracker_bin() -> Option<PathBuf> {
    surelink_lab::host::find_program("nutcracker", &["/usr/sbin", "/usr/local/sbin"])
}

/// memcached as the capped server: pinned to core 0, one worker thread
/// (one core: more threads only switch), otherwise its defaults.
fn spawn_memcached(s: &Setup) -> Result<(surelink_lab::child::Child, SocketAddr)> {
    let port = surelink_lab::host::free_port("127.0.1.1".parse()?)?;
    let mut m = surelink_lab::host::Memcached::new("127.0.1.1".parse()?, port);
    (m.core, m.threads) = (Some(0), Some(1));
    let cmd = m.command("memcached")?.args(["-c", "4096"]);
    let p = cmd
        .stdout(Output::Null)
        .stderr(Output::Log(s.dir.join("memcached.log")))
        .die_with_parent()
        .spawn()?;
    Ok((p, m.addr()))
}

/// nutcracker on core 1 in front of `server`, as a single-server pool is
/// configured (no ejection: there is nowhere else to send).
fn spawn_nutcracker(
    s: &Setup,
    server: SocketAddr,
) -> Result<(surelink_lab::child::Child, SocketAddr)> {
    let bin = nutcracker_bin().context("nutcracker not installed")?;
    let port = surelink_lab::host::free_port("127.0.0.1".parse()?)?;
    let stats = surelink_lab::host::free_port("127.0.0.1".parse()?)?;
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let conf = s.dir.join("nutcracker.yml");
    std::fs::write(
        &conf,
        format!(
            "bench:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  \
             timeout: 400\n  servers:\n   - {server}:1\n"
        ),
    )?;
    let p = Command::new("nutcracker", "taskset")
        .args(["-c", "1"])
        .arg(bin)
        .arg("-c")
        .arg(&conf)
        .args(["-s", &stats.to_string()])
        .stdout(Output::Null)
        .stderr(Output::Log(s.dir.join("nutcracker.log")))
        .die_with_parent()
        .spawn()?;
    Ok((p, listen))
}

const ARMS: [&str; 7] = [
    "direct",
    "self_clocking",
    "adaptive",
    "activation",
    "activation_full_handshake",
    "memcached",
    "nutcracker",
];

pub(crate) async fn run(a: &HelpersArgs) -> Result<()> {
    if let Some(j) = &a.from_json {
        let text =
            std::fs::read_to_string(j).with_context(|| format!("reading {}", j.display()))?;
        let steps: Vec<Step> =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", j.display()))?;
        std::fs::create_dir_all(&a.out)?;
        report::print(&steps, a);
        let png = a.out.join("helpers.png");
        report::plot(&png, &steps)?;
        eprintln!("wrote {}", png.display());
        return Ok(());
    }
    let bin = surelink_bin(a)?;
    let a_owned;
    let mut a = a;
    for arm in &a.arms {
        if !ARMS.contains(&arm.as_str()) {
            bail!("unknown arm {arm:?}: expected one of {}", ARMS.join(", "));
        }
    }
    let missing = |arm: &str| match arm {
        "memcached" => memcached_bin().is_none().then_some("memcached"),
        "nutcracker" => (memcached_bin().is_none() || nutcracker_bin().is_none())
            .then_some("memcached and nutcracker"),
        _ => None,
    };
    if a.arms.iter().any(|arm| missing(arm).is_some()) {
        for arm in &a.arms {
            if let Some(what) = missing(arm) {
                eprintln!("SKIPPED: the {arm} arm ({what} not installed)");
            }
        }
        a_owned = HelpersArgs {
            arms: a
                .arms
                .iter()
                .filter(|arm| missing(arm).is_none())
                .cloned()
                .collect(),
            ..a.clone()
        };
        a = &a_owned;
    }
    if surelink_lab::host::find_program("taskset", &[]).is_none() {
        bail!("taskset (util-linux) is needed to pin the server and the load");
    }
    std::fs::create_dir_all(&a.out)?;
    let setup = Setup::new(a)?;
    setup.write(a)?;
    let total = a.rounds * a.rates.len() * a.arms.len();
    let mut steps = Vec::new();
    let mut n = 0;
    for round in 0..a.rounds {
        for &rate in &a.rates {
            for arm in &a.arms {
                n += 1;
                eprintln!(
                    "[{n}/{total}] round {round}: {arm} at {rate} req/s, {} clients",
                    a.clients
                );
                let (w, cpu, secs) = step(a, &bin, &setup, arm, rate).await?;
                let [server, helpers, load, client_core, det] = cpu;
                let done = w.completed.max(1) as f64;
                let st = Step {
                    arm: arm.clone(),
                    rate,
                    round,
                    seconds: secs,
                    server_cpu_pct: server / secs * 100.0,
                    server_us_per_req: server / done * 1e6,
                    server_detector_us_per_req: det / done * 1e6,
                    total_us_per_req: (server + helpers + load) / done * 1e6,
                    client_core_pct: client_core,
                    invalid: client_core >= 90.0,
                    window: w,
                };
                eprintln!(
                    "    goodput {:.0}/s, p50 {:.0} µs, p99 {:.0} µs, server {:.1} µs/req ({:.0} %, detector {:.1}), all {:.1} µs/req, client core {:.0} %{}",
                    st.window.completed as f64 / secs,
                    st.window.p50_us,
                    st.window.p99_us,
                    st.server_us_per_req,
                    st.server_cpu_pct,
                    st.server_detector_us_per_req,
                    st.total_us_per_req,
                    st.client_core_pct,
                    if st.invalid { " INVALID" } else { "" }
                );
                if arm.starts_with("activation") {
                    eprintln!(
                        "    activation: {} of {} clients helped at the end; decided: half by {:?} ms, all by {:?} ms; moved (path through the helper up): half by {:?} ms, all by {:?} ms; each move (decision to path up) median {:?} ms, longest {:?} ms; {} moves ((moves, clients): {:?})",
                        st.window.helped, a.clients, st.window.half_helped_ms, st.window.all_helped_ms,
                        st.window.half_relayed_ms, st.window.all_relayed_ms,
                        st.window.move_p50_ms, st.window.move_max_ms, st.window.switches,
                        st.window.switches_per_client
                    );
                }
                eprintln!(
                    "    errors {}, longest time a client went without an answer {:.1} ms ({:.1} ms in the window's second half)",
                    st.window.errors, st.window.max_gap_ms, st.window.max_gap_late_ms
                );
                steps.push(st);
            }
        }
    }
    let json = a.out.join("helpers.json");
    std::fs::write(&json, serde_json::to_string_pretty(&steps)?)?;
    report::print(&steps, a);
    report::plot(&a.out.join("helpers.png"), &steps)?;
    eprintln!(
        "wrote {} and {}",
        json.display(),
        a.out.join("helpers.png").display()
    );
    Ok(())
}
