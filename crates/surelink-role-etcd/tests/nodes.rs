//! The etcd backend driving real surelink endpoints on loopback (three
//! nodes on two networks, candidates 1 and 2, the product's defaults),
//! against a real etcd: the nodes report over their sessions, the elected
//! candidate's tables reach every node through etcd and steer its paths,
//! and when the leader dies or is cut off from etcd the other candidate
//! takes over — calls between the survivors meanwhile are neither lost nor
//! run twice, and every node applies tables strictly in order. Prints
//! `SKIPPED: …` where etcd is not installed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use surelink::proto::role::{MemberState, Ownership, RoleConfig};
use surelink::proto::NodeId;
use surelink::testing::{role_cluster, role_until};
use surelink::{Endpoint, NetEvent, Request, RoleStatus};
use surelink_role_etcd::testing::{EtcdProcess, Relay, SKIPPED};
use surelink_role_etcd::{EtcdBackend, EtcdRoleConfig, LeaderEnd};
use tokio::task::JoinHandle;

async fn etcd() -> Option<EtcdProcess> {
    let e = EtcdProcess::start()
        .await
        .expect("etcd is installed but did not start");
    if e.is_none() {
        println!("{SKIPPED}");
    }
    e
}

async fn cluster(base: u8) -> Vec<Endpoint> {
    let role = RoleConfig {
        nodes: vec![NodeId(1), NodeId(2), NodeId(3)],
        candidates: vec![NodeId(1), NodeId(2)],
        ownership: Ownership::Elected,
        ..RoleConfig::default()
    };
    role_cluster(role, base).await.expect("role cluster")
}

async fn until(ep: &Endpoint, within: Duration, f: impl Fn(&RoleStatus) -> bool) -> RoleStatus {
    match role_until(ep, within, f).await {
        Some(st) => st,
        None => panic!(
            "node {}: condition not met within {within:?}; status {:?}",
            ep.node(),
            ep.role_status()
        ),
    }
}

/// Node 1's backend first (it wins the election), then the others'.
async fn backends(eps: &[Endpoint], endpoint_of: impl Fn(usize) -> String) -> Vec<EtcdBackend> {
    let mut out = Vec::new();
    for (i, e) in eps.iter().enumerate() {
        let cfg = EtcdRoleConfig::for_cluster("nodes", vec![endpoint_of(i)]);
        let b = EtcdBackend::start(e, cfg).expect("backend");
        if i == 0 {
            let start = Instant::now();
            while b.state().leading.is_none() {
                assert!(start.elapsed() < Duration::from_secs(10), "{:?}", b.state());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        out.push(b);
    }
    out
}

/// Calls from `caller` to node 2 every millisecond until `stop`; (ok,
/// failed).
fn load(caller: Endpoint, stop: Arc<AtomicBool>) -> JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let body = Bytes::from(i.to_be_bytes().to_vec());
            match caller
                .call(NodeId(2), 0, body, Duration::from_secs(5))
                .await
            {
                Ok(r) if r.as_ref() == i.to_be_bytes() => ok += 1,
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (ok, failed)
    })
}

/// Every table `ep` applies, in the order applied.
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

fn count(executed: &Arc<AtomicU64>) -> impl Fn(Request) -> std::future::Ready<Bytes> {
    let ex = executed.clone();
    move |r: Request| {
        ex.fetch_add(1, Ordering::Relaxed);
        std::future::ready(r.body)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elected_tables_steer_the_nodes_and_survive_the_leaders_death() {
    let Some(etcd) = etcd().await else { return };
    let mut eps = cluster(60).await;
    let mut bs = backends(&eps, |_| etcd.endpoint()).await;
    let epoch1 = bs[0].state().leading.expect("node 1 leads");
    for e in &eps {
        let st = until(e, Duration::from_secs(10), |s| {
            s.table.as_ref().is_some_and(|t| t.epoch == epoch1)
        })
        .await;
        assert_eq!(st.table.map(|t| t.role), Some(NodeId(1)));
    }
    until(&eps[0], Duration::from_secs(2), |s| {
        s.serving == Some(epoch1)
    })
    .await;
    // Reports travel over the sessions to the elected leader: node 3 muted
    // on network 1, and node 2's row from etcd steers it off that network.
    eps[2].testing().mute_network(1, true);
    until(&eps[1], Duration::from_secs(10), |s| {
        s.table.as_ref().is_some_and(|t| {
            t.route_to(NodeId(3))
                .is_some_and(|r| !r.usable(1) && r.usable(0))
        })
    })
    .await;
    eps[2].testing().mute_network(1, false);
    until(&eps[1], Duration::from_secs(10), |s| {
        s.table
            .as_ref()
            .is_some_and(|t| t.route_to(NodeId(3)).is_none_or(|r| r.usable(1)))
    })
    .await;

    // The leader dies (endpoint and backend at once, no resignation)
    // under load between the survivors.
    let executed = Arc::new(AtomicU64::new(0));
    eps[1].serve(count(&executed));
    let stop = Arc::new(AtomicBool::new(false));
    let calls = load(eps[2].clone(), stop.clone());
    let applied = tables(&eps[2]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    drop(bs.remove(0));
    eps.remove(0).shutdown().await;
    let st = until(&eps[1], Duration::from_secs(15), |s| {
        s.table.as_ref().is_some_and(|t| t.epoch > epoch1)
    })
    .await;
    let took = killed.elapsed();
    let epoch2 = st.table.as_ref().map_or(0, |t| t.epoch);
    assert_eq!(st.table.as_ref().map(|t| t.role), Some(NodeId(2)));
    assert_eq!(bs[0].state().leading, Some(epoch2));
    // Seeded with the reports of the last refreshes: node 2's first
    // table of its epoch already has node 3 up, node 1 not.
    let ring = &st.table.expect("table").ring;
    let state = |n| ring.iter().find(|m| m.node == NodeId(n)).map(|m| m.state);
    assert_ne!(state(1), Some(MemberState::Up), "{ring:?}");
    assert_eq!(state(2), Some(MemberState::Up), "{ring:?}");
    assert_eq!(state(3), Some(MemberState::Up), "{ring:?}");
    println!("etcd backend, leader killed: node 3 applied the next leader's table {took:?} after");
    assert!(took < Duration::from_secs(6), "{took:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = calls.await.expect("load");
    assert_eq!(failed, 0, "calls lost during the failover");
    assert!(ok > 100, "too few calls to mean anything: {ok}");
    assert_eq!(
        executed.load(Ordering::Relaxed),
        ok,
        "a call ran twice or not at all"
    );
    for b in bs {
        b.stop().await;
    }
    let node3 = eps.remove(1);
    node3.shutdown().await;
    let seen = applied.await.expect("events");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order: {seen:?}"
    );
    assert!(seen.iter().any(|t| t.0 == epoch2), "{seen:?}");
    for e in eps {
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_is_fenced_and_followed() {
    let Some(etcd) = etcd().await else { return };
    let relay = Relay::start(etcd.addr()).await.expect("relay");
    let eps = cluster(80).await;
    // Node 1 reaches etcd only through the relay.
    let relayed = relay.endpoint();
    let bs = backends(&eps, |i| {
        if i == 0 {
            relayed.clone()
        } else {
            etcd.endpoint()
        }
    })
    .await;
    let epoch1 = bs[0].state().leading.expect("node 1 leads");
    for e in &eps {
        until(e, Duration::from_secs(10), |s| {
            s.table.as_ref().is_some_and(|t| t.epoch == epoch1)
        })
        .await;
    }
    let applied = tables(&eps[2]);
    let cut = Instant::now();
    relay.cut();
    let st = until(&eps[2], Duration::from_secs(15), |s| {
        s.table.as_ref().is_some_and(|t| t.epoch > epoch1)
    })
    .await;
    let took = cut.elapsed();
    assert_eq!(st.table.as_ref().map(|t| t.role), Some(NodeId(2)));
    // The old leader stopped, fenced by its lease, before the new one won.
    let old = bs[0].state();
    assert_eq!(old.leading, None, "{old:?}");
    assert!(
        matches!(
            old.last_end,
            Some(LeaderEnd::Fenced | LeaderEnd::LostElection)
        ),
        "{old:?}"
    );
    assert!(eps[0].role_status().is_some_and(|s| s.serving.is_none()));
    println!("etcd backend, leader cut off from etcd: node 3 applied the next leader's table {took:?} after");
    // Healed, node 1 catches up with the newer epoch (its watcher reads
    // its row anew) and campaigns again, behind node 2.
    relay.heal();
    let epoch2 = st.table.map_or(0, |t| t.epoch);
    until(&eps[0], Duration::from_secs(15), |s| {
        s.table.as_ref().is_some_and(|t| t.epoch >= epoch2)
    })
    .await;
    for b in bs {
        b.stop().await;
    }
    for e in eps {
        e.shutdown().await;
    }
    let seen = applied.await.expect("events");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order: {seen:?}"
    );
}
