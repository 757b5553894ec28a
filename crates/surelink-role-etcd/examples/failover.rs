//! Role-server failover with the etcd backend, measured.
//!
//! ```sh
//! cargo run --release --manifest-path crates/surelink-role-etcd/Cargo.toml --example failover -- [--rounds N] [--nodes N]
//! ```
//!
//! Starts a throwaway etcd on loopback, three candidates (nodes 1–3), each
//! talking to etcd through its own TCP relay, and a watcher for the last
//! node. Every leader re-publishes its table every 100 ms (a report flips
//! a path, so each round is a new version of every node's row). Each
//! round then (a) kills the leader (its task, keep-alives and connection
//! go at once; its lease is left to run out) and (b) partitions the
//! leader from etcd (its relay goes silent; the process runs on). For each
//! fault: the time from the fault until the watcher applies the next
//! leader's first table; and, over the run, tables that went back or
//! leaders whose writes interleaved (both must be 0), and for (b) whether
//! the cut-off leader stopped before the next one was elected.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use surelink_proto::role::{PathStatus, PeerReport, RoleConfig, StatusReport, TableRejected};
use surelink_proto::NodeId;
use surelink_role_etcd::testing::{EtcdProcess, Relay, SKIPPED};
use surelink_role_etcd::{
    BadRow, Candidate, EtcdRoleConfig, LeaderEnd, PublishError, WatchEvent, Watcher,
};
use tokio::time::{sleep, timeout, Instant};

const CANDIDATES: u64 = 3;

/// One leader's record.
#[derive(Clone, Debug)]
struct Term {
    node: NodeId,
    won_at: Instant,
    first_write_sent: Option<Instant>,
    last_write_sent: Option<Instant>,
    first_rev: Option<i64>,
    last_rev: Option<i64>,
    /// Stopped by itself: when, why, its `t_valid` then.
    ended: Option<(Instant, LeaderEnd, Option<Instant>)>,
    killed: bool,
}

#[derive(Default)]
struct Book {
    terms: BTreeMap<u64, Term>,
    /// (epoch, version, when) the watcher applied.
    seen: Vec<(u64, u64, Instant)>,
    backwards: u64,
    duplicates: u64,
    other_skips: u64,
}

type Shared = Arc<Mutex<Book>>;

fn book(b: &Shared) -> parking_lot::MutexGuard<'_, Book> {
    b.lock()
}

fn report(seq: u64, nodes: u64) -> StatusReport {
    let down = seq % 2 == 0;
    StatusReport {
        reporter: NodeId(CANDIDATES + 2),
        seq,
        watched: u32::try_from(nodes - 1).unwrap_or(u32::MAX),
        held: (0, 0),
        peers: if down {
            vec![PeerReport {
                peer: NodeId(CANDIDATES + 1),
                alive: true,
                networks: vec![(PathStatus::Up, 0), (PathStatus::Down, 0)],
            }]
        } else {
            Vec::new()
        },
    }
}

/// A candidate node for ever: campaign, lead (publishing every 100 ms)
/// until stopped, resign, campaign again.
async fn candidate(cfg: EtcdRoleConfig, role: RoleConfig, me: NodeId, b: Shared) {
    let nodes = u64::try_from(role.nodes.len()).unwrap_or(0);
    loop {
        let cand = match Candidate::connect(cfg.clone(), role.clone(), me).await {
            Ok(c) => c,
            Err(_) => {
                sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok(mut leader) = cand.campaign().await else {
            continue;
        };
        let epoch = leader.epoch();
        book(&b).terms.insert(
            epoch,
            Term {
                node: me,
                won_at: leader.stats().won_at,
                first_write_sent: None,
                last_write_sent: None,
                first_rev: None,
                last_rev: None,
                ended: None,
                killed: false,
            },
        );
        let mut seq = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            seq += 1;
            let _ = leader.handle_report(NodeId(CANDIDATES + 2), &report(seq, nodes));
            let r = leader.publish().await;
            let s = leader.stats();
            let mut bk = book(&b);
            if let Some(t) = bk.terms.get_mut(&epoch) {
                t.first_write_sent = s.first_write_sent;
                t.last_write_sent = s.last_write_sent;
                t.first_rev = s.first_revision;
                t.last_rev = s.last_revision;
                if let Err(PublishError::Ended(why)) = r {
                    t.ended = Some((Instant::now(), why, leader.t_valid()));
                }
            }
            if matches!(r, Err(PublishError::Ended(_))) {
                break;
            }
        }
        leader.resign().await;
    }
}

async fn watch(mut w: Watcher, b: Shared) {
    loop {
        match w.next().await {
            Ok(WatchEvent::Applied { view, .. }) => {
                book(&b)
                    .seen
                    .push((view.epoch, view.version, Instant::now()));
            }
            Ok(WatchEvent::Skipped {
                reason:
                    BadRow::Rejected(TableRejected::Stale {
                        epoch,
                        version,
                        held_epoch,
                        held_version,
                    }),
                ..
            }) => {
                let mut bk = book(&b);
                if (epoch, version) == (held_epoch, held_version) {
                    bk.duplicates += 1;
                } else {
                    bk.backwards += 1;
                }
            }
            Ok(_) => book(&b).other_skips += 1,
            Err(_) => sleep(Duration::from_millis(20)).await,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median_max(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let med = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
    (med, v.last().copied().unwrap_or(f64::NAN))
}

#[derive(Default)]
struct Figures {
    gap: Vec<f64>,
    elected: Vec<f64>,
    stopped: Vec<f64>,
    fenced_before_election: usize,
    rounds: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rounds = 10usize;
    let mut nodes = 8u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().ok_or("--rounds N")?.parse()?,
            "--nodes" => nodes = args.next().ok_or("--nodes N")?.parse()?,
            _ => return Err(format!("unknown argument {a}; use --rounds N --nodes N").into()),
        }
    }
    let nodes = nodes.max(CANDIDATES + 2);
    let Some(etcd) = EtcdProcess::start().await? else {
        println!("{SKIPPED}");
        return Ok(());
    };
    let role = RoleConfig {
        nodes: (1..=nodes).map(NodeId).collect(),
        candidates: (1..=CANDIDATES).map(NodeId).collect(),
        ..RoleConfig::default()
    };
    let direct = EtcdRoleConfig::for_cluster("failover", vec![etcd.endpoint()]);
    let b: Shared = Arc::default();
    let (mut relays, mut cfgs, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
    for i in 1..=CANDIDATES {
        let relay = Relay::start(etcd.addr()).await?;
        let mut cfg = direct.clone();
        cfg.endpoints = vec![relay.endpoint()];
        tasks.push(tokio::spawn(candidate(
            cfg.clone(),
            role.clone(),
            NodeId(i),
            b.clone(),
        )));
        cfgs.push(cfg);
        relays.push(relay);
        // Node 1 campaigns first and leads first.
        sleep(Duration::from_millis(100)).await;
    }
    let w = Watcher::connect(direct.clone(), role.clone(), NodeId(nodes)).await?;
    tokio::spawn(watch(w, b.clone()));

    let started = Instant::now();
    let (mut killed, mut cut) = (Figures::default(), Figures::default());
    for round in 1..=rounds {
        for partition in [false, true] {
            let (epoch, node) = settle(&b).await?;
            let idx = usize::try_from(node.0 - 1)?;
            let t0 = Instant::now();
            if partition {
                relays[idx].cut();
            } else {
                tasks[idx].abort();
                if let Some(t) = book(&b).terms.get_mut(&epoch) {
                    t.killed = true;
                }
            }
            let (next, seen_at) = newer_seen(&b, epoch).await?;
            let new = book(&b).terms.get(&next).cloned().ok_or("unknown epoch")?;
            let f = if partition { &mut cut } else { &mut killed };
            f.rounds += 1;
            f.gap.push(ms(seen_at - t0));
            f.elected.push(ms(new.won_at.saturating_duration_since(t0)));
            if partition {
                let (at, why, tv) = ended(&b, epoch).await?;
                f.stopped.push(ms(at - t0));
                let old = book(&b).terms.get(&epoch).cloned().ok_or("unknown epoch")?;
                // The watcher may see the new leader's write before its task
                // books it.
                let new = written(&b, next).await?;
                let ok = at < new.won_at
                    && tv.is_some_and(|tv| tv < new.won_at)
                    && old.last_write_sent < new.first_write_sent;
                f.fenced_before_election += usize::from(ok);
                if why != LeaderEnd::Fenced || !ok {
                    let rel = |i: Option<Instant>| i.map(|i| ms(i.saturating_duration_since(t0)));
                    println!(
                        "  round {round}: cut-off leader ended {why:?} at {:.0} ms, t_valid {:?} ms, \
                         last write sent {:?} ms; next leader elected {:.0} ms, first write {:?} ms",
                        ms(at - t0),
                        rel(tv),
                        rel(old.last_write_sent),
                        ms(new.won_at.saturating_duration_since(t0)),
                        rel(new.first_write_sent),
                    );
                }
                relays[idx].heal();
            } else {
                tasks[idx] =
                    tokio::spawn(candidate(cfgs[idx].clone(), role.clone(), node, b.clone()));
            }
            println!(
                "round {round:2}: leader {:<7} epoch {epoch} (node {}) -> {next} (node {}): \
                 elected after {:.0} ms, its first table applied after {:.0} ms",
                if partition { "cut off" } else { "killed" },
                node.0,
                new.node.0,
                ms(new.won_at.saturating_duration_since(t0)),
                ms(seen_at - t0),
            );
        }
    }
    let elapsed = started.elapsed();
    for t in tasks {
        t.abort();
    }

    let bk = book(&b);
    let mut interleaved = 0;
    let written: Vec<&Term> = bk
        .terms
        .values()
        .filter(|t| t.first_rev.is_some())
        .collect();
    for w in written.windows(2) {
        if w[0].last_rev >= w[1].first_rev {
            interleaved += 1;
        }
    }
    let mut went_back = bk.backwards;
    for w in bk.seen.windows(2) {
        if (w[0].0, w[0].1) >= (w[1].0, w[1].1) {
            went_back += 1;
        }
    }
    println!();
    println!(
        "etcd backend failover: {rounds} rounds, {nodes} nodes, {CANDIDATES} candidates; \
         lease TTL {:?}, keep-alive every {:?}, margin {:?}; tables re-published every 100 ms; {:.0} s",
        direct.lease_ttl,
        direct.keepalive_every,
        direct.margin,
        elapsed.as_secs_f64()
    );
    println!(
        "{:<26} {:>6} {:>16} {:>10} {:>16} {:>22}",
        "fault", "rounds", "next table p50", "max", "elected p50", "old leader stopped p50"
    );
    for (name, f) in [
        ("leader killed", &mut killed),
        ("leader cut off from etcd", &mut cut),
    ] {
        let (g50, gmax) = median_max(&mut f.gap);
        let (e50, _) = median_max(&mut f.elected);
        let stopped = if f.stopped.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0} ms", median_max(&mut f.stopped).0)
        };
        println!(
            "{name:<26} {:>6} {:>13.0} ms {:>7.0} ms {:>13.0} ms {stopped:>22}",
            f.rounds, g50, gmax, e50
        );
    }
    println!(
        "tables applied by the watcher: {} over {} epochs; went back: {went_back}; \
         leaders' writes interleaved: {interleaved}; rows rewritten unchanged: {}; other skips: {}",
        bk.seen.len(),
        bk.terms.len(),
        bk.duplicates,
        bk.other_skips
    );
    println!(
        "cut-off leaders stopped (t_valid) before the next election and wrote nothing after it: {} of {}",
        cut.fenced_before_election, cut.rounds
    );
    println!(
        "command: cargo run --release --manifest-path crates/surelink-role-etcd/Cargo.toml --example failover -- --rounds {rounds} --nodes {nodes}"
    );
    if went_back > 0 || interleaved > 0 || cut.fenced_before_election < cut.rounds {
        return Err("promise broken (see above)".into());
    }
    Ok(())
}

/// Waits for a leader that has been publishing for a while (the watcher
/// applied five of its tables) while the other candidates campaign.
async fn settle(b: &Shared) -> Result<(u64, NodeId), Box<dyn std::error::Error>> {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        {
            let bk = book(b);
            if let Some((epoch, t)) = bk.terms.iter().next_back() {
                let seen = bk.seen.iter().filter(|s| s.0 == *epoch).count();
                if !t.killed && t.ended.is_none() && seen >= 5 {
                    return Ok((*epoch, t.node));
                }
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    Err("no leader settled within 20 s".into())
}

/// Waits for the watcher to apply a table of an epoch above `epoch`.
async fn newer_seen(b: &Shared, epoch: u64) -> Result<(u64, Instant), Box<dyn std::error::Error>> {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Some(s) = book(b).seen.iter().find(|s| s.0 > epoch) {
            return Ok((s.0, s.2));
        }
        sleep(Duration::from_millis(1)).await;
    }
    Err(format!("no table above epoch {epoch} within 20 s").into())
}

/// Waits for the leader of `epoch` to book its first write.
async fn written(b: &Shared, epoch: u64) -> Result<Term, Box<dyn std::error::Error>> {
    timeout(Duration::from_secs(5), async {
        loop {
            if let Some(t) = book(b).terms.get(&epoch) {
                if t.first_write_sent.is_some() {
                    return t.clone();
                }
            }
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_err(|_| format!("the leader of epoch {epoch} booked no write").into())
}

/// Waits for the leader of `epoch` to record why it stopped.
async fn ended(
    b: &Shared,
    epoch: u64,
) -> Result<(Instant, LeaderEnd, Option<Instant>), Box<dyn std::error::Error>> {
    timeout(Duration::from_secs(10), async {
        loop {
            if let Some(e) = book(b).terms.get(&epoch).and_then(|t| t.ended) {
                return e;
            }
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_err(|_| format!("the leader of epoch {epoch} did not stop").into())
}
