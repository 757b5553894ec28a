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
//! - 65 %: node 2 killed (its items are gone with it; its addresses refuse
//!   connections, as its host's kernel would);
//! - 85 %: node 2 restarted, empty, on the same addresses.
//!
//! The report: ops/s and latency per phase, errors, misses the fabric
//! caused (must be 0: the load knows what it set) apart from misses of
//! keys that lived on the killed node, failovers, the time to re-route
//! after the node kill; a PNG timeline.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use surelink::proto::NodeId;
use surelink::NetEvent;
use surelink_cache::local::LocalCluster;
use surelink_cache::Ring;
use surelink_relay::{Direction, LinkSpec, Links, Relay};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::plot::{self, Marker};
use super::DemoArgs;
use crate::memload::{key_name, Load, LoadConfig, Outcome, Progress, Sample};

/// The node the demo kills and restarts.
const VICTIM: NodeId = NodeId(2);

/// What the fault task did and saw, in ns since the start.
#[derive(Debug, Default)]
struct Timeline {
    kill_net0: u64,
    mute: (u64, u64),
    kill_node: u64,
    restart_node: u64,
    /// The proxy took the node out of the ring: its connections were
    /// refused on both networks (`PeerRefused`) or its detector reported
    /// it dead, whichever came first.
    node_out: Option<(u64, &'static str)>,
    /// The proxy heard the restarted node (it is back in the ring).
    node_back: Option<u64>,
    connections_killed: usize,
    paths_down: u64,
    /// The proxy's routing table first steered it off network 1 to every
    /// node (the nodes saw its silence there; it could not).
    table_avoid: Option<u64>,
    /// ... and back onto it after the fault.
    table_clear: Option<u64>,
    /// The proxy's table first showed the killed node down in the ring.
    table_node_down: Option<u64>,
    /// Tables the proxy applied during the run.
    tables: u64,
}

/// One phase of the run, by scheduled time.
struct Phase {
    name: &'static str,
    from_ns: u64,
    to_ns: u64,
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
    let (cluster, relay) = start_cluster().await?;
    let addr = cluster.proxy.local_addr();
    println!("surelink demo: a memcached-compatible cache cluster under fire");
    println!(
        "  3 cache nodes (embedded store) and a proxy on {addr}, in this process, over two networks (127.0.1.x, 127.0.2.x); default configuration"
    );
    println!("  the proxy reaches every node through a TCP/UDP relay on each network: the faults are made there");
    println!("  role service on: candidates node 1, node 2 (hr-net's role server pushes routing tables and the ring view)");
    let cfg = LoadConfig {
        addr,
        rate: f64::from(args.rate),
        duration: Duration::from_secs(seconds),
        connections: args.connections,
        keys: args.keys,
        zipf: 0.99,
        get_share: 0.9,
        value_size: 64,
        seed: args.seed,
        drain: Duration::from_secs(10),
    };
    println!(
        "  load: {} requests/s open loop for {seconds} s, 90 % get / 10 % set, {} keys (Zipf 0.99), 64 B values, {} client connections",
        args.rate, args.keys, args.connections
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

    // Keys whose items died with the victim.
    let lost: Vec<bool> = (0..args.keys)
        .map(|k| ring.node_for(key_name(k).as_bytes()) == Some(VICTIM))
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
    let c = Counts::of(&samples, &lost, tl.kill_node);
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
    println!(
        "  misses of keys that lived on node {VICTIM} after its kill (expected): {} ({} of {} keys were on it)",
        c.expected_misses,
        lost.iter().filter(|l| **l).count(),
        args.keys
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
    println!("  every request answered, no value lost or stale but those the dead node held");
    Ok(())
}

/// The relay's links in front of the nodes: one per node and network, on
/// 127.0.N.100 (free ports), leaving from 127.0.N.101 towards the node.
#[derive(Clone)]
struct DemoRelay {
    relay: std::sync::Arc<Relay>,
    /// The links to each node.
    to: Vec<(NodeId, Links)>,
}

impl DemoRelay {
    fn network(&self, n: usize) -> Links {
        self.relay.network(n)
    }

    fn to_node(&self, node: NodeId) -> Option<&Links> {
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
async fn start_cluster() -> Result<(LocalCluster, DemoRelay)> {
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
        .start_proxy("127.0.0.1:0".parse()?, |id| {
            via.iter()
                .find(|(n, _)| *n == id)
                .map(|(_, a)| a.clone())
                .unwrap_or_default()
        })
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

/// Runs the fault schedule against the cluster and watches the proxy's
/// events until told to stop; gives the cluster back.
async fn faults(
    mut cluster: LocalCluster,
    relay: DemoRelay,
    start: Instant,
    d: f64,
    mut stop: oneshot::Receiver<()>,
) -> Result<(LocalCluster, Timeline)> {
    let at = |f: f64| start + Duration::from_secs_f64(f * d);
    let since = move || u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut tl = Timeline::default();
    let mut events = cluster.proxy_ep.events();
    // Skip the replay of what is up now.
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(1), events.recv()).await {}
    let steps: [(f64, u8); 5] = [(0.2, 0), (0.35, 1), (0.5, 2), (0.65, 3), (0.85, 4)];
    let mut next = 0;
    loop {
        let wake = steps.get(next).map(|(f, _)| at(*f));
        tokio::select! {
            () = async { tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)).await }, if wake.is_some() => {
                let step = steps[next].1;
                next += 1;
                let t = since();
                match step {
                    0 => {
                        tl.kill_net0 = t;
                        tl.connections_killed = relay.network(0).kill();
                    }
                    1 => {
                        tl.mute.0 = t;
                        relay.network(1).blackhole(Direction::Up);
                    }
                    2 => {
                        relay.network(1).heal();
                        tl.mute.1 = t;
                    }
                    3 => {
                        tl.kill_node = t;
                        cluster.kill_node(VICTIM);
                        // Its host no longer listens: connects are refused.
                        if let Some(l) = relay.to_node(VICTIM) {
                            l.refuse();
                        }
                    }
                    _ => {
                        tl.restart_node = t;
                        cluster
                            .restart_node(VICTIM)
                            .await
                            .context("restarting node 2")?;
                        if let Some(l) = relay.to_node(VICTIM) {
                            l.heal();
                        }
                    }
                }
            }
            e = events.recv() => match e {
                Ok(NetEvent::PeerDead { peer }) if peer == VICTIM => {
                    tl.node_out.get_or_insert((since(), "its detector reported it dead"));
                }
                Ok(NetEvent::PeerRefused { peer }) if peer == VICTIM => {
                    tl.node_out.get_or_insert((since(), "both networks refused connections: its process is gone"));
                }
                Ok(NetEvent::PeerUp { peer, .. } | NetEvent::PeerAlive { peer })
                    if peer == VICTIM && tl.restart_node > 0 =>
                {
                    tl.node_back.get_or_insert(since());
                }
                Ok(NetEvent::PathDown { .. }) => tl.paths_down += 1,
                Ok(NetEvent::RoutingTable { .. }) => {
                    tl.tables += 1;
                    let t = since();
                    if let Some(table) = cluster.proxy_ep.role_status().and_then(|s| s.table) {
                        let nodes = cluster.node_ids();
                        let off1 = nodes
                            .iter()
                            .all(|n| table.route_to(*n).is_some_and(|r| !r.usable(1)));
                        if tl.mute.0 > 0 && tl.mute.1 == 0 && off1 {
                            tl.table_avoid.get_or_insert(t);
                        }
                        if tl.mute.1 > 0 && tl.table_avoid.is_some() && !off1 {
                            tl.table_clear.get_or_insert(t);
                        }
                        let down = table.member(VICTIM) == Some(surelink::proto::role::MemberState::Down);
                        if tl.kill_node > 0 && tl.restart_node == 0 && down {
                            tl.table_node_down.get_or_insert(t);
                        }
                    }
                }
                Ok(_) => {}
                Err(surelink::RecvError::Lagged(_)) => {}
                Err(_) => break,
            },
            _ = &mut stop => break,
        }
    }
    Ok((cluster, tl))
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

/// What the answers add up to.
#[derive(Debug, Default, serde::Serialize)]
struct Counts {
    errors: u64,
    fabric_misses: u64,
    expected_misses: u64,
    stale: u64,
    wrong: u64,
    /// The longest a command for the victim's keys, sent while it was
    /// dead, waited for its answer.
    victim_wait_ns: Option<u64>,
}

impl Counts {
    fn of(samples: &[Sample], lost: &[bool], kill_ns: u64) -> Counts {
        let mut c = Counts::default();
        for s in samples {
            let on_victim = lost.get(s.key as usize).copied().unwrap_or(false);
            match s.outcome {
                Outcome::Error | Outcome::Unanswered => c.errors += 1,
                Outcome::Stale => c.stale += 1,
                Outcome::Wrong => c.wrong += 1,
                // Answered after the victim died, for a key it held: its
                // item died with it.
                Outcome::Miss { known: true } if on_victim && s.done_ns >= kill_ns => {
                    c.expected_misses += 1;
                }
                Outcome::Miss { known: true } => c.fabric_misses += 1,
                _ => {}
            }
            if on_victim && s.sched_ns >= kill_ns {
                if let Some(l) = s.latency_us() {
                    let w = c.victim_wait_ns.get_or_insert(0);
                    *w = (*w).max(l * 1000);
                }
            }
        }
        c
    }
}

#[derive(Debug, Default, serde::Serialize)]
struct Row {
    ops: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

/// Throughput (answers in the window, by reply time) and latency
/// (requests scheduled in the window) of one phase.
fn phase_row(samples: &[Sample], p: &Phase) -> Result<Row> {
    let mut h = Histogram::<u64>::new(3)?;
    let mut done = 0u64;
    let mut last_done = 0u64;
    for s in samples {
        if s.done_ns != u64::MAX && (p.from_ns..p.to_ns).contains(&s.done_ns) {
            done += 1;
            last_done = last_done.max(s.done_ns);
        }
        if (p.from_ns..p.to_ns).contains(&s.sched_ns) {
            if let Some(l) = s.latency_us() {
                let _ = h.record(l.max(1));
            }
        }
    }
    let span = if p.to_ns == u64::MAX {
        last_done.saturating_sub(p.from_ns)
    } else {
        p.to_ns - p.from_ns
    };
    let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
    Ok(Row {
        ops: done as f64 / (span as f64 / 1e9).max(1e-9),
        p50: q(0.5),
        p99: q(0.99),
        p999: q(0.999),
        max: h.max() as f64 / 1000.0,
    })
}

fn write_json(
    path: &Path,
    rows: &[(&str, Row)],
    all: &Row,
    c: &Counts,
    tl: &Timeline,
) -> Result<()> {
    let phases: serde_json::Map<String, serde_json::Value> = rows
        .iter()
        .map(|(n, r)| Ok(((*n).to_string(), serde_json::to_value(r)?)))
        .collect::<Result<_>>()?;
    let v = serde_json::json!({
        "phases": phases,
        "whole_run": all,
        "counts": c,
        "node_out_after_ms": tl.node_out.map(|(t, _)| t.saturating_sub(tl.kill_node) as f64 / 1e6),
        "node_back_after_ms": tl.node_back.map(|t| t.saturating_sub(tl.restart_node) as f64 / 1e6),
        "connections_killed": tl.connections_killed,
        "proxy_path_down_events": tl.paths_down,
        "role_table_off_network1_after_ms": tl.table_avoid.map(|t| t.saturating_sub(tl.mute.0) as f64 / 1e6),
        "role_table_node_down_after_ms": tl.table_node_down.map(|t| t.saturating_sub(tl.kill_node) as f64 / 1e6),
        "role_tables_applied_by_proxy": tl.tables,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&v)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
