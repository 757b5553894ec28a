//! One role-server failover on real endpoints, measured: the shared
//! scenario of this crate's node tests and of the `nodes_failover`
//! example (which also runs the embedded service's as its baseline).
//!
//! Three endpoints on loopback (two networks each, the product's
//! defaults), candidates 1 and 2, node 1 serving. Node 3 calls node 2
//! every millisecond (each call's body is its number, echoed; node 2
//! counts executions) while the fault strikes node 1; the round ends when
//! node 3 holds a table of a newer epoch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surelink::proto::role::{Ownership, RingMember, RoleConfig};
use surelink::proto::NodeId;
use surelink::testing::{role_cluster, role_until};
use surelink::{Endpoint, NetEvent, Request};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use super::{EtcdProcess, Relay};
use crate::{EtcdBackend, EtcdRoleConfig, LeaderEnd};

/// What strikes the serving role server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The embedded service (no etcd): node 1's endpoint shuts down.
    EmbeddedKill,
    /// etcd backend: node 1's endpoint and backend end at once, without
    /// resigning (its lease runs out).
    EtcdKill,
    /// etcd backend: node 1's connection to etcd goes silent (a relay that
    /// holds every byte); the node itself lives on.
    EtcdCut,
}

/// What one round measured.
#[derive(Clone, Debug)]
pub struct Round {
    /// Fault → node 3 holds a table of a newer epoch.
    pub took: Duration,
    /// The epoch before, and the one after.
    pub epochs: (u64, u64),
    /// Who pushed the newer epoch's first table node 3 held.
    pub new_role: NodeId,
    /// That table's ring view.
    pub new_ring: Vec<RingMember>,
    /// Calls node 3 → node 2 that returned their own body.
    pub calls_ok: u64,
    /// Calls that failed or returned something else.
    pub calls_failed: u64,
    /// Executions node 2's handler counted.
    pub executed: u64,
    /// Every (epoch, version) node 3 applied during the round, in order.
    pub tables: Vec<(u64, u64)>,
    /// How node 1's leadership ended (etcd faults).
    pub old_end: Option<LeaderEnd>,
}

impl Round {
    /// Whether node 3 applied tables strictly upwards (never two role
    /// servers' interleaved).
    pub fn in_order(&self) -> bool {
        self.tables.windows(2).all(|w| w[0] < w[1])
    }
}

fn count(executed: &Arc<AtomicU64>) -> impl Fn(Request) -> std::future::Ready<bytes::Bytes> {
    let ex = executed.clone();
    move |r: Request| {
        ex.fetch_add(1, Ordering::Relaxed);
        std::future::ready(r.body)
    }
}

/// Calls from `caller` to node 2 every millisecond until `stop`.
fn load(caller: Endpoint, stop: Arc<AtomicBool>) -> JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let body = bytes::Bytes::from(i.to_be_bytes().to_vec());
            match caller
                .call(NodeId(2), 0, body, Duration::from_secs(5))
                .await
            {
                Ok(r) if r.as_ref() == i.to_be_bytes() => ok += 1,
                _ => failed += 1,
            }
            sleep(Duration::from_millis(1)).await;
        }
        (ok, failed)
    })
}

/// Every table `ep` applies, in order, until it shuts down.
fn tables(ep: &Endpoint) -> JoinHandle<Vec<(u64, u64)>> {
    let mut events = ep.events();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(e) = events.recv().await {
            if let NetEvent::RoutingTable { epoch, version, .. } = e {
                seen.push((epoch, version));
            }
        }
        seen
    })
}

async fn wait(
    ep: &Endpoint,
    within: Duration,
    what: &str,
    f: impl Fn(&surelink::RoleStatus) -> bool,
) -> Result<surelink::RoleStatus, String> {
    role_until(ep, within, f).await.ok_or_else(|| {
        format!(
            "node {}: {what} not within {within:?}: {:?}",
            ep.node(),
            ep.role_status()
        )
    })
}

/// Runs one round; `etcd` is needed for the etcd faults. `base`: the
/// loopback addresses' last octet offset (see `role_cluster`).
pub async fn failover_round(
    etcd: Option<&EtcdProcess>,
    fault: Fault,
    base: u8,
) -> Result<Round, String> {
    let ownership = match fault {
        Fault::EmbeddedKill => Ownership::CandidateOrder,
        Fault::EtcdKill | Fault::EtcdCut => Ownership::Elected,
    };
    let role = RoleConfig {
        nodes: vec![NodeId(1), NodeId(2), NodeId(3)],
        candidates: vec![NodeId(1), NodeId(2)],
        ownership,
        ..RoleConfig::default()
    };
    let mut eps = role_cluster(role, base).await.map_err(|e| e.to_string())?;
    let relay = match (fault, etcd) {
        (Fault::EtcdCut, Some(e)) => Some(Relay::start(e.addr()).await.map_err(|e| e.to_string())?),
        _ => None,
    };
    static ROUNDS: AtomicU64 = AtomicU64::new(0);
    let round = ROUNDS.fetch_add(1, Ordering::Relaxed);
    let mut backends = Vec::new();
    if ownership == Ownership::Elected {
        let etcd = etcd.ok_or("the etcd faults need etcd")?;
        // Node 1's backend first, elected before the others start.
        for (i, e) in eps.iter().enumerate() {
            let endpoint = match (&relay, i) {
                (Some(r), 0) => r.endpoint(),
                _ => etcd.endpoint(),
            };
            // A fresh prefix per round: no earlier round's rows or keys.
            let mut cfg = EtcdRoleConfig::for_cluster("failover", vec![endpoint]);
            cfg.prefix = format!("/surelink/failover-{}-{round}", std::process::id());
            let b = EtcdBackend::start(e, cfg).map_err(|e| e.to_string())?;
            if i == 0 {
                let start = Instant::now();
                while b.state().leading.is_none() {
                    if start.elapsed() > Duration::from_secs(10) {
                        return Err(format!("node 1 not elected: {:?}", b.state()));
                    }
                    sleep(Duration::from_millis(5)).await;
                }
            }
            backends.push(b);
        }
    }
    let mut epoch1 = 0;
    for e in &eps {
        let st = wait(e, Duration::from_secs(10), "node 1's table", |s| {
            s.table.as_ref().is_some_and(|t| t.role == NodeId(1))
        })
        .await?;
        epoch1 = st.table.map_or(0, |t| t.epoch);
    }
    let executed = Arc::new(AtomicU64::new(0));
    eps[1].serve(count(&executed));
    let stop = Arc::new(AtomicBool::new(false));
    let calls = load(eps[2].clone(), stop.clone());
    let applied = tables(&eps[2]);
    sleep(Duration::from_millis(300)).await;

    let struck = Instant::now();
    let old_backend = match fault {
        Fault::EmbeddedKill | Fault::EtcdKill => {
            // Node 1's backend goes as a crash would: no resignation.
            if !backends.is_empty() {
                drop(backends.remove(0));
            }
            eps.remove(0).shutdown().await;
            None
        }
        Fault::EtcdCut => {
            if let Some(r) = &relay {
                r.cut();
            }
            Some(backends.remove(0))
        }
    };
    let node3 = eps.last().ok_or("no node 3")?.clone();
    let st = wait(
        &node3,
        Duration::from_secs(15),
        "a newer epoch's table",
        |s| s.table.as_ref().is_some_and(|t| t.epoch > epoch1),
    )
    .await?;
    let took = struck.elapsed();
    // Its events end when the endpoint's last handle goes.
    drop(node3);
    let table = st.table.ok_or("no table")?;
    sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (calls_ok, calls_failed) = calls.await.map_err(|e| e.to_string())?;
    let old_end = old_backend.and_then(|b| b.state().last_end);
    for b in backends {
        b.stop().await;
    }
    for e in eps {
        e.shutdown().await;
    }
    let seen = tokio::time::timeout(Duration::from_secs(10), applied)
        .await
        .map_err(|_| "node 3's events did not end with it".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(Round {
        took,
        epochs: (epoch1, table.epoch),
        new_role: table.role,
        new_ring: table.ring,
        calls_ok,
        calls_failed,
        executed: executed.load(Ordering::Relaxed),
        tables: seen,
        old_end,
    })
}
