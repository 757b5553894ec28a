//! `surelink-lab experiment role` (root): non-local fault notification on a
//! three-host network, with the role service and without it.
//!
//! ```text
//!   sr-a (node 1) ──┐        ┌── br1 (network 0, 10.78.1.0/24) ──┐
//!   sr-b (node 2) ──┼─ sr-sw ┤                                    ├─ each host one veth per network
//!   sr-c (node 3) ──┘        └── br2 (network 1, 10.78.2.0/24) ──┘
//! ```
//!
//! Busy arms: nodes 1 and 3 call node 2 every millisecond. Node 3 is first steered
//! onto network 1 (its network-0 connections to node 2 killed, as `ss -K`;
//! the balance rule keeps a light load on the path it is on). Then node
//! 2's link to network 1 fails one way: nothing reaches node 2 there,
//! what it sends still leaves. Measured: how long after the fault node 3
//! (and node 1) last sent data to node 2 on network 1 — with the role
//! service (candidate node 1, defaults) and with every node alone.
//!
//! Idle arms: node 1 calls node 2 as before, node 3 has had nothing in
//! flight with node 2 for 12 s (a slow pair, as the product watches an
//! idle one). Measured: when node 3 first knows network 1 to node 2 is
//! unusable — its pushed table says so (role service), or its connections
//! there closed: node 2 found node 3 silent (cut in: node 2's report
//! probes its other peers at the busy pace), or node 3's own detector
//! found node 2 silent (cut out: nothing sent by node 2 leaves; node 3
//! alone waits out the slow pair's path window).
//!
//! `surelink-lab experiment-role-node` (hidden) is the process on each host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use serde_json::{json, Value};
use surelink::proto::role::RoleConfig;
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, Endpoint, PeerConfig, Request};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::node::wall_us;
use super::procs::{self, NodeProc};
use crate::testbed;

const HOSTS: [&str; 3] = ["sr-a", "sr-b", "sr-c"];
const PORT: u16 = 7300;

fn ip_of(node: u64, net: usize) -> String {
    format!("10.78.{}.{}", net + 1, node)
}

/// Arguments of `surelink-lab experiment role`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RoleNotifyArgs {
    /// Rounds per arm (with and without the role service).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

/// Arguments of `surelink-lab experiment-role-node`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RoleNodeArgs {
    /// This node (1..=3).
    #[arg(long)]
    node: u64,
    /// Key files (`node-<id>.key` / `.pub`).
    #[arg(long)]
    key_dir: std::path::PathBuf,
    /// Run the role service (candidate: node 1).
    #[arg(long)]
    role: bool,
    /// Call this node every millisecond.
    #[arg(long)]
    call: Option<u64>,
    /// Watch this node's paths and the table without calling it.
    #[arg(long)]
    watch: Option<u64>,
}

fn out(v: &Value) {
    println!("{v}");
}

/// One node: echo server, optional caller, and per-network data frames
/// sent to the called node, printed whenever they change.
pub(crate) async fn node(a: &RoleNodeArgs) -> Result<()> {
    let nodes: Vec<NodeId> = (1..=3).map(NodeId).collect();
    let mut c = Config::new(NodeId(a.node), ClusterId(0x5a1e));
    c.identity = Some(surelink_node::keys::read_secret(
        &a.key_dir.join(format!("node-{}.key", a.node)),
    )?);
    for n in &nodes {
        let p = std::fs::read_to_string(a.key_dir.join(format!("node-{}.pub", n.0)))?;
        c.members
            .insert(*n, surelink_node::keys::parse_public(p.trim(), "member")?)
            .context("member key")?;
    }
    c.listen = (0..2)
        .map(|net| format!("{}:{PORT}", ip_of(a.node, net)).parse())
        .collect::<Result<_, _>>()?;
    c.peers = (1..a.node)
        .map(|n| {
            let addrs = (0..2)
                .map(|net| format!("{}:{PORT}", ip_of(n, net)).parse().ok())
                .collect();
            PeerConfig::new(NodeId(n), addrs)
        })
        .collect();
    if a.role {
        c.role = Some(RoleConfig {
            nodes: nodes.clone(),
            candidates: vec![NodeId(1)],
            ..RoleConfig::default()
        });
    }
    let ep = Endpoint::bind(c).await?;
    ep.serve(|r: Request| async move { r.body });
    out(&json!({"t": wall_us(), "ev": "ready"}));
    if let Some(peer) = a.call.map(NodeId) {
        // Open loop: a call every millisecond whatever the earlier ones
        // are waiting for, so the sender keeps choosing a path.
        let caller = ep.clone();
        tokio::spawn(async move {
            let ok = Arc::new(AtomicU64::new(0));
            let failed = Arc::new(AtomicU64::new(0));
            // Why calls failed, the first of each kind (a failed round says why).
            let why = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            for i in 1u64.. {
                tick.tick().await;
                let (c, ok2, failed2, why2) =
                    (caller.clone(), ok.clone(), failed.clone(), why.clone());
                tokio::spawn(async move {
                    let r = c
                        .call(
                            peer,
                            0,
                            Bytes::from_static(&[0u8; 64]),
                            Duration::from_secs(5),
                        )
                        .await;
                    let n = if r.is_ok() { &ok2 } else { &failed2 };
                    n.fetch_add(1, Relaxed);
                    if let Err(e) = r {
                        let mut w = why2.lock();
                        let e = format!("{e}");
                        if w.len() < 8 && !w.contains(&e) {
                            w.push(e);
                        }
                    }
                });
                if i % 500 == 0 {
                    out(&json!({"t": wall_us(), "ev": "calls",
                        "ok": ok.load(Relaxed), "failed": failed.load(Relaxed),
                        "why": why.lock().clone()}));
                }
            }
        });
    }
    if let Some(peer) = a.call.or(a.watch).map(NodeId) {
        let sampler = ep.clone();
        tokio::spawn(async move {
            let mut last = [0u64; 2];
            let mut last_table = (0, 0);
            let mut last_paths1 = usize::MAX;
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let paths1 = sampler
                    .paths()
                    .iter()
                    .filter(|p| p.peer == Some(peer) && p.network == 1)
                    .count();
                if paths1 != last_paths1 {
                    last_paths1 = paths1;
                    out(&json!({"t": wall_us(), "ev": "paths1", "n": paths1}));
                }
                let nets: HashMap<_, _> = sampler
                    .paths()
                    .into_iter()
                    .map(|p| (p.id, p.network))
                    .collect();
                let mut now = [0u64; 2];
                let snap = sampler.stats();
                if let Some((_, s)) = snap.sessions.iter().find(|(n, _)| *n == peer) {
                    for p in &s.paths {
                        if let Some(&net) = nets.get(&p.id) {
                            if net < 2 {
                                now[net] += p.stats.data_sent;
                            }
                        }
                    }
                }
                // Counters of a closed path vanish: only increases count.
                let grew = [now[0] > last[0], now[1] > last[1]];
                if grew[0] || grew[1] {
                    out(&json!({"t": wall_us(), "ev": "tx", "n0": grew[0], "n1": grew[1]}));
                }
                last = now;
                if let Some(t) = sampler.role_status().and_then(|s| s.table) {
                    if (t.epoch, t.version) != last_table {
                        last_table = (t.epoch, t.version);
                        let avoid1 = t.route_to(peer).is_some_and(|r| !r.usable(1));
                        out(&json!({"t": wall_us(), "ev": "table", "epoch": t.epoch,
                            "version": t.version, "avoid1": avoid1}));
                    }
                }
            }
        });
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(l)) = lines.next_line().await {
        if l.trim() == "quit" {
            break;
        }
    }
    ep.shutdown().await;
    Ok(())
}

fn sh(args: &[&str]) -> Result<()> {
    testbed::run(args).map(|_| ())
}

fn down() {
    for ns in HOSTS.iter().chain(&["sr-sw"]) {
        let _ = sh(&["ip", "netns", "del", ns]);
    }
}

/// The three hosts, a switch namespace with one bridge per network.
fn up() -> Result<()> {
    down();
    sh(&["ip", "netns", "add", "sr-sw"])?;
    for br in ["br1", "br2"] {
        sh(&["ip", "-n", "sr-sw", "link", "add", br, "type", "bridge"])?;
        sh(&["ip", "-n", "sr-sw", "link", "set", br, "up"])?;
    }
    for (i, h) in HOSTS.iter().enumerate() {
        sh(&["ip", "netns", "add", h])?;
        sh(&["ip", "-n", h, "link", "set", "lo", "up"])?;
        let node = i as u64 + 1;
        for net in 0..2 {
            let (host_if, sw_if) = (format!("{h}{}", net + 1), format!("sw{}{}", i + 1, net + 1));
            sh(&[
                "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &sw_if,
            ])?;
            sh(&["ip", "link", "set", &host_if, "netns", h])?;
            sh(&["ip", "link", "set", &sw_if, "netns", "sr-sw"])?;
            let br = format!("br{}", net + 1);
            sh(&["ip", "-n", "sr-sw", "link", "set", &sw_if, "master", &br])?;
            sh(&["ip", "-n", "sr-sw", "link", "set", &sw_if, "up"])?;
            let addr = format!("{}/24", ip_of(node, net));
            sh(&["ip", "-n", h, "addr", "add", &addr, "dev", &host_if])?;
            sh(&["ip", "-n", h, "link", "set", &host_if, "up"])?;
        }
    }
    Ok(())
}

/// Which way node 2's link to network 1 fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Nothing arrives at node 2 there: node 2's own detector finds every
    /// peer silent on it.
    In,
    /// Nothing node 2 sends there leaves: its peers each find node 2
    /// silent on their own — a pair with traffic in flight within its
    /// path window, an idle pair within its own (slow) window, unless the
    /// role service tells it first.
    Out,
}

/// Node 2's link to network 1 fails one way (`cut`), or heals.
fn fault(on: bool, cut: Cut) -> Result<()> {
    if on {
        let rule = match cut {
            Cut::In => "add chain inet srf in { type filter hook input priority 0; }\nadd rule inet srf in iifname \"sr-b2\" drop\n",
            Cut::Out => "add chain inet srf out { type filter hook output priority 0; }\nadd rule inet srf out oifname \"sr-b2\" drop\n",
        };
        testbed::nft_in("sr-b", &format!("add table inet srf\n{rule}"))
    } else {
        testbed::nft_in("sr-b", "delete table inet srf\n")
    }
}

/// The last time after `from` that `events` show data sent on network 1.
fn last_on_net1(events: &[Value], from: u64) -> Option<u64> {
    events
        .iter()
        .filter(|v| v["ev"] == "tx" && v["n1"] == true && procs::t(v) >= from)
        .map(procs::t)
        .max()
}

struct Round {
    /// Idle arm: when node 3's last connection to node 2 on network 1
    /// closed.
    c_closed_ms: Option<f64>,
    c_stop_ms: Option<f64>,
    a_stop_ms: Option<f64>,
    table_ms: Option<f64>,
    failed: u64,
    why: Vec<String>,
}

async fn round(role: bool, idle: bool, cut: Cut, keys: &std::path::Path) -> Result<Option<Round>> {
    let mut procs = Vec::new();
    for (i, h) in HOSTS.iter().enumerate() {
        let node = i as u64 + 1;
        let mut args = vec![
            "--node".to_string(),
            node.to_string(),
            "--key-dir".into(),
            keys.display().to_string(),
        ];
        if role {
            args.push("--role".into());
        }
        if node == 3 && idle {
            args.extend(["--watch".to_string(), "2".to_string()]);
        } else if node != 2 {
            args.extend(["--call".to_string(), "2".to_string()]);
        }
        let (p, _) = NodeProc::spawn_in(Some(h), "experiment-role-node", &args).await?;
        procs.push(p);
    }
    // An idle pair is watched as the product watches it: after 10 s of
    // quiet, as a slow pair.
    let warm_up = if idle { 12_000 } else { 1_500 };
    tokio::time::sleep(Duration::from_millis(warm_up)).await;
    if idle {
        // Nothing to steer: node 3 sends nothing to node 2. It must be
        // connected there, though.
        let connected = procs[2]
            .events()
            .iter()
            .rev()
            .find(|v| v["ev"] == "paths1")
            .is_some_and(|v| v["n"].as_u64().unwrap_or(0) > 0);
        if !connected {
            for p in procs {
                p.quit().await;
            }
            return Ok(None);
        }
        return idle_fault(procs, cut).await.map(Some);
    }
    // Steer node 3 onto network 1.
    let _ = sh(&[
        "ip",
        "netns",
        "exec",
        "sr-c",
        "ss",
        "-K",
        "dst",
        &ip_of(2, 0),
    ]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let probe = wall_us();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let on1 = last_on_net1(&procs[2].events(), probe).is_some();
    if !on1 {
        for p in procs {
            p.quit().await;
        }
        return Ok(None);
    }
    let (t_fault, c_ev, a_ev) = fault_window(&procs, Duration::from_millis(1500), cut).await?;
    let ms = |t: u64| t.saturating_sub(t_fault) as f64 / 1000.0;
    let table = first_ms(&c_ev, t_fault, |v| {
        v["ev"] == "table" && v["avoid1"] == true
    });
    let failed = failed_calls(c_ev.iter().chain(a_ev.iter()));
    let mut why: Vec<String> = c_ev
        .iter()
        .chain(a_ev.iter())
        .filter(|v| v["ev"] == "calls")
        .filter_map(|v| v["why"].as_array())
        .flatten()
        .filter_map(|e| e.as_str().map(str::to_owned))
        .collect();
    why.sort();
    why.dedup();
    let r = Round {
        c_closed_ms: None,
        why,
        c_stop_ms: last_on_net1(&c_ev, t_fault).map(ms),
        a_stop_ms: last_on_net1(&a_ev, t_fault).map(ms),
        table_ms: table,
        failed,
    };
    for p in procs {
        p.quit().await;
    }
    Ok(Some(r))
}

/// The fault for `hold`; when it began, and node 3's and node 1's events.
async fn fault_window(
    procs: &[NodeProc],
    hold: Duration,
    cut: Cut,
) -> Result<(u64, Vec<Value>, Vec<Value>)> {
    let t_fault = wall_us();
    fault(true, cut)?;
    tokio::time::sleep(hold).await;
    fault(false, cut)?;
    Ok((t_fault, procs[2].events(), procs[0].events()))
}

/// Milliseconds after `t_fault` of the first event from then on that
/// `pred` accepts.
fn first_ms(events: &[Value], t_fault: u64, pred: impl Fn(&Value) -> bool) -> Option<f64> {
    events
        .iter()
        .find(|v| procs::t(v) >= t_fault && pred(v))
        .map(|v| procs::t(v).saturating_sub(t_fault) as f64 / 1000.0)
}

/// The most failed calls any of `events` reported.
fn failed_calls<'a>(events: impl Iterator<Item = &'a Value>) -> u64 {
    events
        .filter(|v| v["ev"] == "calls")
        .filter_map(|v| v["failed"].as_u64())
        .max()
        .unwrap_or(0)
}

/// The idle arm's fault and what node 3 learnt, when.
async fn idle_fault(procs: Vec<NodeProc>, cut: Cut) -> Result<Round> {
    // Longer than the slow pair's path window (4.8 s), so node 3 alone
    // finds the cut too.
    let (t_fault, c_ev, a_ev) = fault_window(&procs, Duration::from_millis(6000), cut).await?;
    let ms = |t: u64| t.saturating_sub(t_fault) as f64 / 1000.0;
    let table = first_ms(&c_ev, t_fault, |v| {
        v["ev"] == "table" && v["avoid1"] == true
    });
    let closed = first_ms(&c_ev, t_fault, |v| v["ev"] == "paths1" && v["n"] == 0);
    let failed = failed_calls(a_ev.iter());
    let r = Round {
        c_closed_ms: closed,
        c_stop_ms: None,
        a_stop_ms: last_on_net1(&a_ev, t_fault).map(ms),
        table_ms: table,
        failed,
        why: Vec::new(),
    };
    for p in procs {
        p.quit().await;
    }
    Ok(r)
}

fn arm_name(idle: bool, cut: Cut) -> String {
    format!(
        "node 3 {}, cut {}",
        if idle { "idle" } else { "busy" },
        match cut {
            Cut::In => "in",
            Cut::Out => "out",
        }
    )
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

pub(crate) async fn run(a: &RoleNotifyArgs) -> Result<()> {
    if let Some(why) = testbed::unavailable() {
        bail!("{why}");
    }
    up()?;
    let keys = std::env::temp_dir().join(format!("surelink-role-keys-{}", std::process::id()));
    surelink_node::keys::make_key_dir(&keys, &[NodeId(1), NodeId(2), NodeId(3)])?;
    let result = async {
        let mut rows = Vec::new();
        for (idle, cut, role) in [
            (false, Cut::In, false),
            (false, Cut::In, true),
            (true, Cut::In, false),
            (true, Cut::In, true),
            (true, Cut::Out, false),
            (true, Cut::Out, true),
        ] {
            let mut rounds = Vec::new();
            let mut skipped = 0;
            for i in 0..a.rounds {
                eprintln!(
                    "  {}, {} round {}/{}",
                    arm_name(idle, cut),
                    if role {
                        "with the role service"
                    } else {
                        "nodes alone"
                    },
                    i + 1,
                    a.rounds
                );
                match round(role, idle, cut, &keys).await? {
                    Some(r) => rounds.push(r),
                    None => skipped += 1,
                }
            }
            rows.push((idle, cut, role, rounds, skipped));
        }
        Ok::<_, anyhow::Error>(rows)
    }
    .await;
    down();
    let _ = std::fs::remove_dir_all(&keys);
    let rows = result?;
    println!("non-local fault notification: node 2's link to network 1 fails one way (in: nothing arrives there; out: nothing it sends leaves); node 1 calls node 2 every 1 ms; node 3 busy (the same, steered onto network 1 first) or idle (nothing in flight with node 2 for 12 s: a slow pair)");
    println!(
        "{:<48} {:>7} {:>22} {:>22} {:>22} {:>18} {:>8}",
        "arm",
        "rounds",
        "node 3 last on net 1",
        "node 3 net 1 closed",
        "node 1 last on net 1",
        "table (node 3)",
        "failed"
    );
    let mut summary = Vec::new();
    for (idle, cut, role, rounds, skipped) in rows {
        summary.push(json!({
            "idle": idle,
            "cut": format!("{cut:?}").to_lowercase(),
            "role": role,
            "rounds": rounds.len(),
            "skipped": skipped,
            "node3_stop_ms": rounds.iter().map(|r| r.c_stop_ms).collect::<Vec<_>>(),
            "node3_closed_ms": rounds.iter().map(|r| r.c_closed_ms).collect::<Vec<_>>(),
            "node1_stop_ms": rounds.iter().map(|r| r.a_stop_ms).collect::<Vec<_>>(),
            "table_ms": rounds.iter().map(|r| r.table_ms).collect::<Vec<_>>(),
            "failed": rounds.iter().map(|r| r.failed).sum::<u64>(),
            "why_failed": rounds.iter().flat_map(|r| r.why.clone()).collect::<Vec<_>>(),
        }));
        let p = |f: &dyn Fn(&Round) -> Option<f64>| {
            let v: Vec<f64> = rounds.iter().filter_map(f).collect();
            let max = v.iter().copied().fold(f64::NAN, f64::max);
            match median(v) {
                Some(m) => format!("{m:.1} / {max:.1} ms"),
                None => "-".into(),
            }
        };
        println!(
            "{:<48} {:>7} {:>22} {:>22} {:>22} {:>18} {:>8}",
            format!(
                "{}, {}",
                arm_name(idle, cut),
                if role {
                    "with the role service"
                } else {
                    "nodes alone"
                }
            ),
            format!(
                "{}{}",
                rounds.len(),
                if skipped > 0 {
                    format!(" (+{skipped} skipped)")
                } else {
                    String::new()
                }
            ),
            p(&|r| r.c_stop_ms),
            p(&|r| r.c_closed_ms),
            p(&|r| r.a_stop_ms),
            p(&|r| r.table_ms),
            rounds.iter().map(|r| r.failed).sum::<u64>(),
        );
    }
    println!("(median / max after the fault; `skipped`: node 3 was not on network 1 (busy) or not connected there (idle) when the fault came)");
    println!("json: {}", Value::Array(summary));
    Ok(())
}
