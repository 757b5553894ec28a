//! `surelink-lab demo`: a memcached-compatible cache cluster under fire.
//!
//! Three cache nodes (embedded store) and a proxy start in this process on
//! loopback over two networks (127.0.1.x and 127.0.2.x); the proxy reaches
//! each node through a relay on each network (`surelink-relay`: TCP and
//! the heartbeats' UDP), which is where the faults are made — the product
//! runs as it ships, with no hook in its socket path. An open-loop
//! memcached-protocol load (`memload`: 90 % get, 10 % set, Zipf keys)
//! runs through the proxy while faults hit, at fixed fractions of the run:
//!
//! - 20 %: every connection of network 0 reset, both ends (as `ss -K`);
//! - 35–50 %: network 1 silent from the proxy to the nodes (its bytes held,
//!   its heartbeats lost; the nodes' still arrive);
//! - 55–62 %: a failing store shard on node 1: the node's service puts
//!   shard 3 (a recovery group) into recovery every 20 ms, each recovery
//!   emptying it, while its other shards serve;
//! - 65 %: node 2 killed (its items are gone with it; its addresses refuse
//!   connections, as its host's kernel would);
//! - 85 %: node 2 restarted, empty, on the same addresses.
//!
//! The report: ops/s and latency per phase, errors, misses the fabric
//! caused (must be 0: the load knows what it set) apart from misses of
//! keys that lived on the killed node, failovers, the time to re-route
//! after the node kill; a PNG timeline.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use surelink::proto::NodeId;
use surelink_cache::local::LocalCluster;
use surelink_cache::shards::{shard_index, DEFAULT_SHARDS};
use surelink_cache::Ring;
use surelink_relay::{LinkSpec, Links, Relay};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::faults::faults;
use super::plot::{self, Marker};
use super::report::{phase_row, phase_row_of, write_json, Counts};
use super::DemoArgs;
use crate::memload::{key_name, Load, LoadConfig, Progress, Sample};

/// The node the demo kills and restarts.
pub(super) const VICTIM: NodeId = NodeId(2);
/// The node whose store shard fails, and the shard.
pub(super) const SHARD_NODE: NodeId = NodeId(1);
pub(super) const SHARD: usize = 3;
/// How often the failing shard is put into recovery.
pub(super) const SHARD_EVERY: Duration = Duration::from_millis(20);

/// What the fault task did and saw, in ns since the start.
#[derive(Debug, Default)]
pub(super) struct Timeline {
    /// The failing shard's window.
    pub(super) shard_fault: (u64, u64),
    /// Recoveries it went through.
    pub(super) shard_recoveries: u64,
    pub(super) kill_net0: u64,
    pub(super) mute: (u64, u64),
    pub(super) kill_node: u64,
    pub(super) restart_node: u64,
    /// The proxy took the node out of the ring: its connections were
    /// refused on both networks (`PeerRefused`) or its detector reported
    /// it dead, whichever came first.
    pub(super) node_out: Option<(u64, &'static str)>,
    /// The proxy heard the restarted node (it is back in the ring).
    pub(super) node_back: Option<u64>,
    pub(super) connections_killed: usize,
    pub(super) paths_down: u64,
    /// The proxy's routing table first steered it off network 1 to every
    /// node (the nodes saw its silence there; it could not).
    pub(super) table_avoid: Option<u64>,
    /// ... and back onto it after the fault.
    pub(super) table_clear: Option<u64>,
    /// The proxy's table first showed the killed node down in the ring.
    pub(super) table_node_down: Option<u64>,
    /// Tables the proxy applied during the run.
    pub(super) tables: u64,
}

/// One phase of the run, by scheduled time.
pub(super) struct Phase {
    pub(super) name: &'static str,
    pub(super) from_ns: u64,
    pub(super) to_ns: u64,
}

fn ns(s: f64) -> u64 {
    (s * 1e9) as u64
}

pub(crate) async fn run(args: &DemoArgs) -> Result<()> {
    let seconds = args.seconds.unwrap_or(20);
    if seconds < 10 {
        bail!("--seconds must be at least 10 (the faults need room)");
    }
    let d = seconds as f64;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let (cluster, relay) = start_cluster(args.replicas).await?;
    let addr = cluster.proxy.local_addr();
    println!("surelink demo: a memcached-compatible cache cluster under fire");
    println!(
        "  3 cache nodes (embedded store) and a proxy on {addr}, in this process, over two networks (127.0.1.x, 127.0.2.x); default configuration but one setting:"
    );
    if args.replicas > 1 {
        println!(
            "  replicated pool: each key on {} nodes (`[proxy] replicas = {}`; the product's default is 1, memcached's way — `--replicas 1`)",
            args.replicas, args.replicas
        );
    } else {
        println!("  one node per key (`[proxy] replicas = 1`, the product's default): a dead node's keys are lost, as with memcached");
    }
    println!("  the proxy reaches every node through a TCP/UDP relay on each network: the faults are made there");
    println!("  role service on: candidates node 1, node 2 (hr-net's role server pushes routing tables and the ring view)");
    let cfg = LoadConfig {
        addrs: vec![addr],
        rate: f64::from(args.rate.unwrap_or(20_000)),
        duration: Duration::from_secs(seconds),
        connections: args.connections,
        keys: args.keys,
        zipf: 0.99,
        get_share: 0.9,
        value_size: 64,
        seed: args.seed,
        drain: Duration::from_secs(10),
        hot: None,
    };
    println!(
        "  load: {} requests/s open loop for {seconds} s, 90 % get / 10 % set, {} keys (Zipf 0.99), 64 B values, {} client connections",
        args.rate.unwrap_or(20_000), args.keys, args.connections
    );
    let mut load = Load::connect(cfg).await?;
    let pre = load.preload().await?;
    println!(
        "  preloaded every key in {:.0} ms; faults at:",
        pre.as_secs_f64() * 1000.0
    );
    println!(
        "    {:>5.1} s  every connection of network 0 reset, both ends (as `ss -K`)",
        0.2 * d
    );
    println!(
        "    {:>5.1} s  network 1 silent from the proxy to the nodes (its bytes held, its heartbeats lost) for {:.1} s",
        0.35 * d,
        0.15 * d
    );
    println!(
        "    {:>5.1} s  node {SHARD_NODE}'s store shard {SHARD} failing for {:.1} s: its service puts it into recovery every {} ms (each empties it)",
        0.55 * d,
        0.07 * d,
        SHARD_EVERY.as_millis()
    );
    println!(
        "    {:>5.1} s  node {VICTIM} killed; {:>5.1} s  restarted, empty",
        0.65 * d,
        0.85 * d
    );
    let before = cluster.proxy_ep.stats();
    let start = Instant::now() + Duration::from_millis(100);
    let progress = Arc::new(Progress::default());
    let (stop_tx, stop_rx) = oneshot::channel();
    let faults = tokio::spawn(faults(cluster, relay.clone(), start, d, stop_rx));
    let bar = spawn_bar(start, seconds, progress.clone());
    let samples = load.run(start, progress.clone()).await;
    bar.abort();
    let _ = stop_tx.send(());
    let (cluster, tl) = faults.await.context("the fault task")??;
    let after = cluster.proxy_ep.stats();
    let proxy_stats = cluster.proxy.stats();
    let (ejections, rerouted, node_errors) = (
        proxy_stats.ejections.load(Ordering::Relaxed),
        proxy_stats.rerouted.load(Ordering::Relaxed),
        proxy_stats.node_errors.load(Ordering::Relaxed),
    );
    let ring = Ring::new(&cluster.node_ids());
    cluster.shutdown().await;
    relay.shutdown().await;

    // Where each key's copies lived: the failing shard empties node 1's
    // copy, the kill node 2's.
    let emptied_by_shard = |key: &str, n: NodeId| {
        n == SHARD_NODE && shard_index(key.as_bytes(), DEFAULT_SHARDS) == SHARD
    };
    // Keys every copy of which died with the victim (or before it, in the
    // failing shard): with one replica, node 2's keys.
    let lost: Vec<bool> = (0..args.keys)
        .map(|k| {
            let key = key_name(k);
            ring.replicas(key.as_bytes(), args.replicas)
                .iter()
                .all(|&n| n == VICTIM || emptied_by_shard(&key, n))
        })
        .collect();
    // Keys every copy of which the failing shard held.
    let in_shard: Vec<bool> = (0..args.keys)
        .map(|k| {
            let key = key_name(k);
            ring.replicas(key.as_bytes(), args.replicas)
                .iter()
                .all(|&n| emptied_by_shard(&key, n))
        })
        .collect();
    let phases = [
        Phase {
            name: "no fault",
            from_ns: ns(1.0),
            to_ns: ns(0.2 * d),
        },
        Phase {
            name: "network 0 killed (1 s after)",
            from_ns: tl.kill_net0,
            to_ns: tl.kill_net0 + ns(1.0),
        },
        Phase {
            name: "network 1 silent one way",
            from_ns: tl.mute.0,
            to_ns: tl.mute.1,
        },
        Phase {
            name: "node 1's shard 3 failing",
            from_ns: tl.shard_fault.0,
            to_ns: tl.shard_fault.1,
        },
        Phase {
            name: "node 2 dead",
            from_ns: tl.kill_node,
            to_ns: tl.restart_node,
        },
        Phase {
            name: "node 2 back, empty",
            from_ns: tl.restart_node,
            to_ns: ns(d),
        },
    ];
    let c = Counts::of(&samples, &lost, tl.kill_node, &in_shard, tl.shard_fault.0);
    println!();
    println!(
        "  {:<30} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "phase", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    let mut rows = Vec::new();
    for p in &phases {
        let r = phase_row(&samples, p)?;
        println!(
            "  {:<30} {:>9.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            p.name, r.ops, r.p50, r.p99, r.p999, r.max
        );
        rows.push((p.name, r));
    }
    let all = phase_row(
        &samples,
        &Phase {
            name: "all",
            from_ns: 0,
            to_ns: u64::MAX,
        },
    )?;
    println!(
        "  {:<30} {:>9.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
        "whole run", all.ops, all.p50, all.p99, all.p999, all.max
    );
    println!();
    println!(
        "  requests {}: errors {}, misses caused by the fabric {}, stale or wrong values {}",
        samples.len(),
        c.errors,
        c.fabric_misses,
        c.stale + c.wrong
    );
    if args.replicas > 1 {
        println!(
            "  misses after node {VICTIM}'s kill: {} — every one a key whose other copy node {SHARD_NODE}'s failing shard {SHARD} had emptied just before ({} of {} keys; expected); of the keys with a copy left: 0",
            c.expected_misses,
            lost.iter().filter(|l| **l).count(),
            args.keys,
        );
    } else {
        println!(
            "  misses of keys that lived on node {VICTIM} after its kill (expected): {} ({} of {} keys were on it)",
            c.expected_misses,
            lost.iter().filter(|l| **l).count(),
            args.keys
        );
    }
    println!(
        "  misses of keys in node {SHARD_NODE}'s shard {SHARD} after its fault began (expected: each recovery emptied it): {} ({} of {} keys had every copy in it)",
        c.shard_misses,
        in_shard.iter().filter(|l| **l).count(),
        args.keys
    );
    // Keys with a copy in the failing shard (their latency during it).
    let has_shard_copy: Vec<bool> = (0..args.keys)
        .map(|k| {
            let key = key_name(k);
            ring.replicas(key.as_bytes(), args.replicas)
                .iter()
                .any(|&n| emptied_by_shard(&key, n))
        })
        .collect();
    let shard_key = |s: &Sample| has_shard_copy.get(s.key as usize).copied().unwrap_or(false);
    let fault = &phases[3];
    let (others, its) = (
        phase_row_of(&samples, fault, |s| !shard_key(s))?,
        phase_row_of(&samples, fault, shard_key)?,
    );
    let calm = phase_row_of(&samples, &phases[0], |s| !shard_key(s))?;
    println!(
        "  shard {SHARD} went through {} recoveries in {:.1} s while the other {} shards served: p99 of the other keys {:.3} ms during its fault vs {:.3} ms with no fault (the failing shard's own keys: p99 {:.3} ms)",
        tl.shard_recoveries,
        (tl.shard_fault.1.saturating_sub(tl.shard_fault.0)) as f64 / 1e9,
        DEFAULT_SHARDS - 1,
        others.p99,
        calm.p99,
        its.p99
    );
    let free = rows[0].1.ops.max(1.0);
    let single = rows[1].1.ops.min(rows[2].1.ops);
    println!(
        "  ops/s during the single-link faults: {:.1} % of the failure-free rate (target: within 8 %)",
        100.0 * single / free
    );
    println!(
        "  failovers: {} connections killed; proxy paths down {}, messages moved to the other path {}, calls re-sent {}",
        tl.connections_killed,
        after.paths_down.saturating_sub(before.paths_down),
        after
            .failover_resends
            .saturating_sub(before.failover_resends),
        after.calls_resent.saturating_sub(before.calls_resent)
    );
    let ms = |t: u64| t as f64 / 1e6;
    match tl.node_out {
        Some((out, why)) => println!(
            "  node {VICTIM} out of the ring {:.1} ms after its kill ({why}); {ejections} ejection, {rerouted} waiting commands re-routed to the next node",
            ms(out.saturating_sub(tl.kill_node))
        ),
        None => println!("  node {VICTIM} was never taken out of the ring"),
    }
    if let Some(w) = c.victim_wait_ns {
        println!(
            "  longest wait of a command for node {VICTIM}'s keys while it was dead: {:.1} ms (re-route time)",
            ms(w)
        );
    }
    match tl.node_back {
        Some(back) => println!(
            "  node {VICTIM} back in the ring {:.0} ms after its restart",
            ms(back.saturating_sub(tl.restart_node))
        ),
        None => println!("  node {VICTIM} was not back in the ring before the end"),
    }
    match tl.table_avoid {
        Some(t) => println!(
            "  role service: the proxy's own detector cannot see its loss on network 1 (it hears every node there); the nodes' detectors do (they shut their network-1 connections to it), and the role server's table told the proxy to avoid network 1 to every node {:.1} ms after the fault{}",
            ms(t.saturating_sub(tl.mute.0)),
            tl.table_clear.map_or_else(String::new, |c| format!(
                ", back onto it {:.1} ms after it healed",
                ms(c.saturating_sub(tl.mute.1))
            ))
        ),
        None => println!("  role service: no table steered the proxy off network 1 during its silence there"),
    }
    match tl.table_node_down {
        Some(t) => println!(
            "  role service: node {VICTIM} down in the shared ring view {:.1} ms after its kill ({} tables applied by the proxy over the run)",
            ms(t.saturating_sub(tl.kill_node)),
            tl.tables
        ),
        None => println!("  role service: the shared ring view never showed node {VICTIM} down ({} tables applied)", tl.tables),
    }
    if node_errors > 0 {
        println!("  the proxy answered {node_errors} commands with SERVER_ERROR");
    }
    if let Some(e) = progress.first_error() {
        println!("  first error reply: {e}");
    }
    let markers = vec![
        Marker::Line(ms(tl.kill_net0), "network 0 connections killed"),
        Marker::Span(ms(tl.mute.0), ms(tl.mute.1), "network 1 silent one way"),
        Marker::Span(
            ms(tl.shard_fault.0),
            ms(tl.shard_fault.1),
            "node 1's shard 3 failing",
        ),
        Marker::Span(ms(tl.kill_node), ms(tl.restart_node), "node 2 dead"),
    ];
    let png = args.out.join("timeline.png");
    match plot::timeline(&png, &samples, seconds, &markers) {
        Ok(true) => println!("  timeline (ops/s and p99 per 100 ms): {}", png.display()),
        Ok(false) => {
            println!("  (no TrueType font found: timeline not drawn; set SURELINK_BENCH_FONT)")
        }
        Err(e) => println!("  (timeline not drawn: {e:#})"),
    }
    write_json(&args.out.join("report.json"), &rows, &all, &c, &tl)?;
    if c.errors > 0 || c.fabric_misses > 0 || c.stale + c.wrong > 0 {
        bail!("the cluster lost requests or data under faults it should ride out");
    }
    println!("  every request answered, no value lost or stale but those the dead node and the emptied shard held");
    Ok(())
}

/// The relay's links in front of the nodes: one per node and network, on
/// 127.0.N.100 (free ports), leaving from 127.0.N.101 towards the node.
#[derive(Clone)]
pub(super) struct DemoRelay {
    relay: std::sync::Arc<Relay>,
    /// The links to each node.
    to: Vec<(NodeId, Links)>,
}

impl DemoRelay {
    pub(super) fn network(&self, n: usize) -> Links {
        self.relay.network(n)
    }

    pub(super) fn to_node(&self, node: NodeId) -> Option<&Links> {
        self.to.iter().find(|(n, _)| *n == node).map(|(_, l)| l)
    }

    async fn shutdown(self) {
        if let Ok(r) = std::sync::Arc::try_unwrap(self.relay) {
            r.shutdown().await;
        }
    }
}

/// The nodes, a relay link in front of each of their addresses, and the
/// proxy dialling the links.
async fn start_cluster(replicas: usize) -> Result<(LocalCluster, DemoRelay)> {
    let nodes =
        LocalCluster::bind_nodes(3, surelink_cache::local::Items::Embedded(256 << 20), true)
            .await
            .context("starting the cache nodes on 127.0.1.x / 127.0.2.x")?;
    let relay = Relay::new();
    let ip = |net: usize, host: u8| {
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, net as u8 + 1, host))
    };
    let mut via = Vec::new();
    let mut to = Vec::new();
    for (node, addrs) in nodes.addrs() {
        let mut ids = Vec::new();
        let mut dial = Vec::new();
        for (net, &upstream) in addrs.iter().enumerate() {
            let spec = LinkSpec::new(net, std::net::SocketAddr::new(ip(net, 100), 0), upstream)
                .from_ip(ip(net, 101));
            let info = relay
                .add_link(spec)
                .await
                .with_context(|| format!("a relay link to node {node} on network {net}"))?;
            ids.push(info.id);
            dial.push(info.listen);
        }
        via.push((node, dial));
        to.push((node, ids));
    }
    let to = to
        .into_iter()
        .map(|(node, ids)| (node, relay.links(&ids)))
        .collect();
    let cluster = nodes
        .start_proxy_tuned(
            "127.0.0.1:0".parse()?,
            |id| {
                via.iter()
                    .find(|(n, _)| *n == id)
                    .map(|(_, a)| a.clone())
                    .unwrap_or_default()
            },
            |cfg| cfg.replicas = replicas,
        )
        .await
        .context("starting the proxy through the relay")?;
    Ok((
        cluster,
        DemoRelay {
            relay: std::sync::Arc::new(relay),
            to,
        },
    ))
}

fn spawn_bar(start: Instant, seconds: u64, progress: Arc<Progress>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let bar = ProgressBar::new(seconds * 10);
        bar.set_style(
            ProgressStyle::with_template("  [{elapsed_precise}] {bar:30} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        tokio::time::sleep_until(start).await;
        let mut last = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let answered = progress.answered.load(Ordering::Relaxed);
            let pos = (start.elapsed().as_millis() / 100) as u64;
            bar.set_position(pos.min(seconds * 10));
            bar.set_message(format!(
                "{:>6} ops/s, {} answered, {} errors",
                (answered - last) * 10,
                answered,
                progress.errors.load(Ordering::Relaxed)
            ));
            last = answered;
            if pos >= seconds * 10 {
                bar.finish_and_clear();
                return;
            }
        }
    })
}
