//! `surelink-lab demo --hot`: a hot key makes a cache node hot, the
//! proxies move to PostMan helpers by their own p99 towards it, and p99
//! comes back (issue 28).
//!
//! Two cache nodes, each `surelink cache node` (the shipped runner)
//! fronting its own memcached — the embedded store when memcached is not
//! installed — both on core 0, each node with its memcached capped at
//! `--quota-pct` of that core (cgroup cpu, 10 ms period; a smaller
//! machine, as the bench does); two `surelink helper`s on core 1. In this
//! process, pinned to core 1: `--proxies` cache proxies (a proxy per
//! application host, each its own surelink endpoint with the two helpers
//! in its configuration and the default activation), and an open-loop
//! memcached-protocol load with one client connection per proxy.
//!
//! From 25 % to 65 % of the run a flash crowd reads one key of node 1
//! from every proxy at `--hot-rate` on top of the base load. Node 1's
//! many small requests from many proxies exhaust its core; each proxy's
//! p99 towards node 1 crosses the SLA and it goes through the lighter of
//! two helpers drawn (node 2 stays direct: activation is per node); the
//! helpers pack the proxies' requests into few frames and node 1 merges
//! the reads queued together into one multi-get, each key once. After
//! the crowd the proxies go direct again.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, Endpoint, PeerConfig};
use surelink_cache::{Proxy, ProxyConfig, Ring};
use surelink_lab::child::{Child, Command, Output};
use surelink_lab::host::{find_program, free_port, CpuCap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::hot_report::{report, Helped, Tick};
use super::DemoArgs;
use crate::bench::idle_peers::wait_listening;
use crate::memload::{key_name, HotKey, Load, LoadConfig, Progress};

const CLUSTER: u64 = 12;
const HELPERS: [u64; 2] = [3, 4];
const FIRST_PROXY: u64 = 100;

/// The run's keys, addresses and configuration files.
struct Setup {
    dir: PathBuf,
    node_ports: [u16; 2],
    helper_ports: [u16; 2],
}

impl Setup {
    fn new(proxies: usize) -> Result<Setup> {
        let dir = std::env::temp_dir().join(format!("surelink-demo-hot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ids: Vec<NodeId> = [1, 2]
            .into_iter()
            .chain(HELPERS)
            .chain((0..proxies as u64).map(|i| FIRST_PROXY + i))
            .map(NodeId)
            .collect();
        surelink_node::keys::make_key_dir(&dir, &ids)?;
        Ok(Setup {
            node_ports: [
                free_port(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)))?,
                free_port(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 2)))?,
            ],
            helper_ports: [
                free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))?,
                free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))?,
            ],
            dir,
        })
    }

    fn public(&self, node: u64) -> Result<String> {
        Ok(
            std::fs::read_to_string(self.dir.join(format!("node-{node}.pub")))?
                .trim()
                .to_string(),
        )
    }

    fn node_addr(&self, n: usize) -> SocketAddr {
        SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + n as u8)),
            self.node_ports[n],
        )
    }

    fn helper_addrs(&self) -> Vec<SocketAddr> {
        self.helper_ports
            .iter()
            .map(|&p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
            .collect()
    }

    /// Node `n` (0 or 1) fronting `backend` (or its embedded store).
    fn write_node(&self, n: usize, proxies: usize, backend: Option<SocketAddr>) -> Result<PathBuf> {
        let node = n as u64 + 1;
        let mut s = format!(
            "node = {node}\ncluster = {CLUSTER}\nkey_file = \"node-{node}.key\"\n\
             listen = [\"{}\"]\nmax_connections = 4096\nhelpers = [{}, {}]\n",
            self.node_addr(n),
            HELPERS[0],
            HELPERS[1]
        );
        let members = HELPERS
            .into_iter()
            .chain((0..proxies as u64).map(|i| FIRST_PROXY + i));
        for m in members {
            s.push_str(&format!(
                "\n[[members]]\nnode = {m}\npublic_key = \"{}\"\n",
                self.public(m)?
            ));
        }
        s.push_str("\n[cache]\n");
        match backend {
            Some(a) => s.push_str(&format!("backend = \"memcached://{a}\"\n")),
            None => s.push_str("memory_mb = 64\n"),
        }
        let p = self.dir.join(format!("node{node}.toml"));
        std::fs::write(&p, s)?;
        Ok(p)
    }

    fn write_helper(&self, k: usize) -> Result<PathBuf> {
        let node = HELPERS[k];
        let mut s = format!(
            "node = {node}\ncluster = {CLUSTER}\nkey_file = \"node-{node}.key\"\n\
             dial_from = [\"127.0.1.{}:0\"]\n\n[helper]\nlisten = \"127.0.0.1:{}\"\n",
            20 + k,
            self.helper_ports[k]
        );
        for n in 0..2 {
            let id = n as u64 + 1;
            s.push_str(&format!(
                "\n[[members]]\nnode = {id}\npublic_key = \"{}\"\n\n[[peers]]\nnode = {id}\naddrs = [\"{}\"]\n",
                self.public(id)?,
                self.node_addr(n)
            ));
        }
        let p = self.dir.join(format!("helper{node}.toml"));
        std::fs::write(&p, s)?;
        Ok(p)
    }

    /// Proxy `i`'s endpoint settings: its own source address (a host of
    /// its own), both nodes as peers; tuned as `surelink cache proxy` is.
    fn proxy_config(&self, i: usize) -> Result<Config> {
        let node = NodeId(FIRST_PROXY + i as u64);
        let mut c = Config::new(node, ClusterId(CLUSTER));
        let keys =
            surelink_node::keys::read_secret(&self.dir.join(format!("node-{}.key", node.0)))?;
        c.members.insert(node, keys.public())?;
        c.identity = Some(keys);
        for n in 0..2 {
            let id = n as u64 + 1;
            let pk = surelink_node::keys::parse_public(&self.public(id)?, "node")?;
            c.members.insert(NodeId(id), pk)?;
            c.peers
                .push(PeerConfig::new(NodeId(id), vec![Some(self.node_addr(n))]));
        }
        let ip = Ipv4Addr::new(127, u8::try_from(10 + i / 250)?, u8::try_from(i % 250)?, 1);
        c.dial_from = vec![SocketAddr::new(IpAddr::V4(ip), 0)];
        surelink_cache::proxy::tune_endpoint(&mut c);
        Ok(c)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if std::env::var_os("SURELINK_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Pins every thread of this process to core 1 (new ones inherit it).
fn pin_self_to_core_1() {
    let pid = std::process::id().to_string();
    if surelink_lab::child::run(&["taskset", "-a", "-p", "-c", "1", &pid]).is_err() {
        eprintln!(
            "  warning: could not pin the demo to core 1 (taskset): clients share the nodes' core"
        );
    }
}

/// memcached's `stats` value `name` at `addr`.
async fn memcached_stat(addr: SocketAddr, name: &str) -> Option<u64> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"stats\r\n").await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.ends_with(b"END\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.trim().parse().ok())
}

pub(crate) async fn run(args: &DemoArgs) -> Result<()> {
    let seconds = args.seconds.unwrap_or(24);
    if seconds < 12 {
        bail!("--seconds must be at least 12 with --hot");
    }
    let proxies = args.proxies;
    if !(1..=1000).contains(&proxies) {
        bail!("--proxies must be 1 to 1000");
    }
    let base = f64::from(args.rate.unwrap_or(2000));
    let hot_rate = f64::from(args.hot_rate);
    let d = seconds as f64;
    let (crowd_from, crowd_to) = (0.25 * d, 0.65 * d);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    println!("surelink demo --hot: a hot key makes a cache node hot; PostMan helpers switch on");
    pin_self_to_core_1();
    let setup = Setup::new(proxies)?;
    let memcached = find_program("memcached", &["/usr/bin", "/usr/local/bin"]);
    let mut keep: Vec<Child> = Vec::new();
    let mut caps = Vec::new();
    let mut backends: [Option<SocketAddr>; 2] = [None, None];
    let mut node_pids = Vec::new();
    let me = std::env::current_exe()?;
    for (n, backend) in backends.iter_mut().enumerate() {
        let cap = match CpuCap::new(
            &format!("demo-hot-node{}", n + 1),
            args.quota_pct,
            Duration::from_millis(10),
        ) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("  warning: node {} runs uncapped: {e:#}", n + 1);
                None
            }
        };
        if memcached.is_some() {
            let port = free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
            let mut m = surelink_lab::host::Memcached::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
            (m.core, m.threads, m.memory_mb) = (Some(0), Some(1), Some(64));
            let c = m
                .command(&format!("memcached-{}", n + 1))?
                .die_with_parent()
                .spawn()?;
            if let Some(cap) = &cap {
                cap.add(c.pid())?;
            }
            wait_listening(addr, Duration::from_secs(10))?;
            *backend = Some(addr);
            keep.push(c);
        }
        let cfg = setup.write_node(n, proxies, *backend)?;
        let c = Command::new(format!("node-{}", n + 1), "taskset")
            .args(["-c", "0"])
            .arg(&me)
            .args(["cache", "node", "--config"])
            .arg(cfg)
            .stderr(Output::Log(setup.dir.join(format!("node{}.log", n + 1))))
            .die_with_parent()
            .spawn()?;
        if let Some(cap) = &cap {
            cap.add(c.pid())?;
        }
        wait_listening(setup.node_addr(n), Duration::from_secs(10))?;
        node_pids.push(c.pid());
        keep.push(c);
        caps.push(cap);
    }
    for (k, id) in HELPERS.into_iter().enumerate() {
        let cfg = setup.write_helper(k)?;
        let c = Command::new(format!("helper-{id}"), "taskset")
            .args(["-c", "1"])
            .arg(&me)
            .args(["cache", "helper", "--config"])
            .arg(cfg)
            .stderr(Output::Log(setup.dir.join(format!("helper{id}.log"))))
            .die_with_parent()
            .spawn()?;
        wait_listening(setup.helper_addrs()[k], Duration::from_secs(10))?;
        keep.push(c);
    }
    let what = match &memcached {
        Some(_) => "each fronting its own memcached (1 thread)",
        None => "embedded store (memcached not installed)",
    };
    println!(
        "  2 cache nodes ({what}) on core 0, each capped at {} % of it; 2 helpers on core 1",
        args.quota_pct
    );
    // The proxies, each with its own endpoint.
    let mut sla = surelink::proto::helper::ActivationConfig::default();
    sla.sla = Duration::from_millis(args.sla_ms);
    sla.release = Duration::from_millis(args.sla_ms) / 2;
    let mut eps = Vec::new();
    let mut px = Vec::new();
    for i in 0..proxies {
        let ep = Arc::new(
            Endpoint::bind(setup.proxy_config(i)?)
                .await
                .with_context(|| format!("binding proxy {i}"))?,
        );
        let mut pc = ProxyConfig::new("127.0.0.1:0".parse()?, vec![NodeId(1), NodeId(2)]);
        pc.helpers = setup.helper_addrs();
        pc.activation = sla.clone();
        px.push(Proxy::start(ep.clone(), pc).await?);
        eps.push(ep);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for (i, ep) in eps.iter().enumerate() {
        for n in [NodeId(1), NodeId(2)] {
            if !ep.wait_for_paths(n, 1, Duration::from_secs(30)).await {
                bail!(
                    "proxy {i} has no path to node {n} (see {})",
                    setup.dir.display()
                );
            }
        }
    }
    println!(
        "  {proxies} cache proxies in this process on core 1 (a proxy per application host), each with both helpers and the default activation but its SLA: {} ms (back direct under {} ms)",
        sla.sla.as_millis(),
        sla.release.as_millis()
    );
    let ring = Ring::new(&[NodeId(1), NodeId(2)]);
    let on: Vec<u8> = (0..args.keys)
        .map(|k| match ring.node_for(key_name(k).as_bytes()) {
            Some(NodeId(2)) => 2,
            _ => 1,
        })
        .collect();
    let hot_key = on.iter().position(|&n| n == 1).unwrap_or(0) as u32;
    let cfg = LoadConfig {
        addrs: px.iter().map(Proxy::local_addr).collect(),
        rate: base,
        duration: Duration::from_secs(seconds),
        connections: proxies,
        keys: args.keys,
        zipf: 0.99,
        get_share: 0.9,
        value_size: 64,
        seed: args.seed,
        drain: Duration::from_secs(10),
        hot: Some(HotKey {
            key: hot_key,
            from: Duration::from_secs_f64(crowd_from),
            to: Duration::from_secs_f64(crowd_to),
            rate: hot_rate,
        }),
    };
    println!(
        "  load: {base} requests/s open loop for {seconds} s (90 % get, {} keys, Zipf 0.99, 64 B), one client connection per proxy",
        args.keys
    );
    println!(
        "  flash crowd: {crowd_from:.1}–{crowd_to:.1} s, {hot_rate} more gets/s of {} (on node 1) from every proxy",
        key_name(hot_key)
    );
    let mut load = Load::connect(cfg).await?;
    load.preload().await?;
    let cmd_get0 = match backends[0] {
        Some(a) => memcached_stat(a, "cmd_get").await,
        None => None,
    };
    let cpu0: Vec<f64> = node_pids
        .iter()
        .map(|&p| crate::bench::helpers::cpu_of(p))
        .collect();
    // Watch the proxies' activation.
    let helped: Helped = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now() + Duration::from_millis(200);
    let px = Arc::new(px);
    let watcher = {
        let (helped, stop, px) = (helped.clone(), stop.clone(), px.clone());
        let pids = node_pids.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start).await;
            while !stop.load(Ordering::Relaxed) {
                let mut c = [0usize; 2];
                for p in px.iter() {
                    for (node, st) in p.helpers_status() {
                        if st.helper.is_some() {
                            c[usize::from(node == NodeId(2))] += 1;
                        }
                    }
                }
                let tick = Tick {
                    t: start.elapsed().as_secs_f64(),
                    helped: c,
                    core1: crate::bench::helpers::core_jiffies(1),
                    node_cpu: [
                        crate::bench::helpers::cpu_of(pids[0]),
                        crate::bench::helpers::cpu_of(pids[1]),
                    ],
                };
                helped.lock().push(tick);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let progress = Arc::new(Progress::default());
    let bar = indicatif::ProgressBar::new(seconds);
    bar.set_style(
        indicatif::ProgressStyle::with_template("  {bar:40} {pos}/{len} s {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let ticker = {
        let (bar, helped) = (bar.clone(), helped.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let t = start.elapsed().as_secs();
                bar.set_position(t.min(seconds));
                if let Some(t) = helped.lock().last() {
                    bar.set_message(format!(
                        "proxies through a helper: node 1 {}, node 2 {}",
                        t.helped[0], t.helped[1]
                    ));
                }
            }
        })
    };
    let samples = load.run(start, progress.clone()).await;
    ticker.abort();
    bar.finish_and_clear();
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.await;
    let cpu1: Vec<f64> = node_pids
        .iter()
        .map(|&p| crate::bench::helpers::cpu_of(p))
        .collect();
    let cmd_get1 = match backends[0] {
        Some(a) => memcached_stat(a, "cmd_get").await,
        None => None,
    };
    report(
        args,
        &samples,
        &on,
        &helped.lock(),
        (crowd_from, crowd_to, d),
        proxies,
        (cmd_get0, cmd_get1),
        (&cpu0, &cpu1),
        &px,
    )?;
    drop(keep);
    drop(caps);
    Ok(())
}
