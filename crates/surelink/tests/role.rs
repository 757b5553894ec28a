//! The role service on loopback: three nodes on two networks, role-server
//! candidates 1 then 2, the product's defaults otherwise. Tables reach
//! every node over the authenticated sessions, a network one node cannot
//! be heard on is avoided by the others, and when the serving role server
//! dies the next candidate takes over with a higher epoch. With an
//! external backend (here a stand-in running the core's role server), the
//! nodes report over their sessions and apply what the backend hands them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use surelink::proto::role::{Ownership, PathStatus, RoleConfig, RoleServer};
use surelink::proto::{NodeId, Time};
use surelink::testing::{role_cluster, role_expect as until, steers_off};
use surelink::{Endpoint, ExternalRole, NetEvent, Request};

async fn cluster() -> Vec<Endpoint> {
    cluster_with(Ownership::CandidateOrder).await
}

/// Three nodes, candidates 1 then 2.
async fn cluster_with(ownership: Ownership) -> Vec<Endpoint> {
    let role = RoleConfig {
        nodes: vec![NodeId(1), NodeId(2), NodeId(3)],
        candidates: vec![NodeId(1), NodeId(2)],
        ownership,
        ..RoleConfig::default()
    };
    role_cluster(role, 40).await.expect("role cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_reach_every_node_and_a_muted_network_is_avoided() {
    let eps = cluster().await;
    for e in &eps {
        let st = until(e, Duration::from_secs(10), |s| {
            s.table.as_ref().is_some_and(|t| t.epoch == 1)
        })
        .await;
        let t = st.table.expect("table");
        assert_eq!(t.role, NodeId(1));
        assert_eq!(t.node, e.node());
    }
    let server = until(&eps[0], Duration::from_secs(1), |s| s.serving == Some(1)).await;
    assert_eq!(server.serving, Some(1));
    // Node 3 cannot be heard on network 1 (index 1): its peers' detectors
    // find it silent there and report it; the role server steers node 2's
    // traffic to node 3 off that network.
    eps[2].testing().mute_network(1, true);
    let st = until(&eps[1], Duration::from_secs(10), |s| {
        steers_off(s, NodeId(3), 1)
    })
    .await;
    let held = st.table.expect("table");
    // Node 1's matrix holds node 2's view of node 3 on network 1 (the
    // status snapshot is refreshed on the role task's timer).
    until(&eps[0], Duration::from_secs(1), |s| {
        s.matrix.iter().any(|(from, to, net, st, _)| {
            *from == NodeId(2) && *to == NodeId(3) && *net == 1 && *st == PathStatus::Down
        })
    })
    .await;
    // Heard again: the route returns to the default.
    eps[2].testing().mute_network(1, false);
    until(&eps[1], Duration::from_secs(10), |s| {
        s.table.as_ref().is_some_and(|t| {
            t.version > held.version && t.route_to(NodeId(3)).is_none_or(|r| r.usable(1))
        })
    })
    .await;
    for e in eps {
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_candidate_takes_over_when_the_role_server_dies() {
    let mut eps = cluster().await;
    for e in &eps {
        until(e, Duration::from_secs(10), |s| {
            s.table.as_ref().is_some_and(|t| t.epoch == 1)
        })
        .await;
    }
    // Load between the survivors while the role server dies: calls from
    // node 3 to node 2 every millisecond, each executed exactly once.
    let executed = Arc::new(AtomicU64::new(0));
    let ex = executed.clone();
    eps[1].serve(move |r: Request| {
        ex.fetch_add(1, Ordering::Relaxed);
        let body = r.body;
        async move { body }
    });
    let caller = eps[2].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let load = tokio::spawn(async move {
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut i = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            i += 1;
            match caller
                .call(
                    NodeId(2),
                    0,
                    Bytes::from(i.to_be_bytes().to_vec()),
                    Duration::from_secs(5),
                )
                .await
            {
                Ok(r) if r.as_ref() == i.to_be_bytes() => ok += 1,
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (ok, failed)
    });
    // Every table node 3 applies, in order.
    let mut events = eps[2].events();
    let applied = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(e) = events.recv().await {
            if let NetEvent::RoutingTable { epoch, version, .. } = e {
                seen.push((epoch, version));
            }
        }
        seen
    });
    let first = eps.remove(0);
    let killed = Instant::now();
    first.shutdown().await;
    // Candidate 2 owns epoch 2; node 3 applies its table, and never an
    // older epoch after it.
    let st = until(&eps[1], Duration::from_secs(10), |s| {
        s.table.as_ref().is_some_and(|t| t.epoch == 2)
    })
    .await;
    let took = killed.elapsed();
    assert_eq!(st.table.as_ref().map(|t| t.role), Some(NodeId(2)));
    until(&eps[0], Duration::from_secs(1), |s| s.serving == Some(2)).await;
    // The dead node is out of the ring view.
    let ring = &st.table.expect("table").ring;
    assert!(
        ring.iter()
            .any(|m| m.node == NodeId(1) && m.state != surelink::proto::role::MemberState::Up),
        "{ring:?}"
    );
    eprintln!("role server failover: node 3 applied epoch 2 {took:?} after the kill");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.await.expect("load task");
    assert_eq!(failed, 0, "calls lost during the role-server failover");
    assert!(ok > 100, "too few calls to mean anything: {ok}");
    assert_eq!(
        executed.load(Ordering::Relaxed),
        ok,
        "a call ran twice or not at all"
    );
    let node3 = eps.remove(1);
    node3.shutdown().await;
    let seen = applied.await.expect("event task");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "node 3 applied tables out of order: {seen:?}"
    );
    assert!(seen.iter().any(|t| t.0 == 2), "{seen:?}");
    for e in eps {
        e.shutdown().await;
    }
}

/// A stand-in for an external backend (etcd's, say): node 1's link runs the
/// core's role server for `epoch` on the inputs it receives and hands each
/// node its row through that node's link, as a store's watchers would.
fn stand_in_backend(
    epoch: u64,
    leader: ExternalRole,
    links: Vec<ExternalRole>,
) -> tokio::task::JoinHandle<u64> {
    let mut inputs_rx = leader.take_inputs().expect("inputs");
    tokio::spawn(async move {
        let origin = Instant::now();
        let now = |o: Instant| Time::from_nanos(u64::try_from(o.elapsed().as_nanos()).unwrap_or(0));
        let mut server =
            RoleServer::new(leader.config().clone(), leader.node(), epoch, now(origin))
                .expect("server");
        let mut inputs = 0u64;
        loop {
            tokio::select! {
                i = inputs_rx.recv() => match i {
                    Some(i) => {
                        inputs += 1;
                        let _ = server.handle_input(now(origin), &i);
                    }
                    None => return inputs,
                },
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            let t = now(origin);
            server.handle_timeout(t);
            while let Some(p) = server.poll_push(t, Some(Time::from_nanos(u64::MAX))) {
                let link = if p.to == leader.node() {
                    &leader
                } else {
                    links
                        .iter()
                        .find(|l| l.node() == p.to)
                        .expect("a link per node")
                };
                if link.apply(p.view.clone()).await.is_err() {
                    return inputs;
                }
                server.handle_ack(p.to, p.view.epoch, p.view.version);
            }
            leader.set_serving(Some((epoch, server.matrix(), t)));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_backend_elects_and_carries_the_tables() {
    let eps = cluster_with(Ownership::Elected).await;
    let links: Vec<ExternalRole> = eps
        .iter()
        .map(|e| {
            e.external_role()
                .expect("an elected role service has a link")
        })
        .collect();
    assert!(links[0].is_candidate() && links[1].is_candidate() && !links[2].is_candidate());
    let backend = stand_in_backend(7, links[0].clone(), links.clone());
    assert!(
        links[0].take_inputs().is_none(),
        "one input receiver per endpoint"
    );
    // A non-candidate receives nothing: its receiver ends at once.
    let mut none = links[2].take_inputs().expect("receiver");
    assert!(none.recv().await.is_none());
    // Every node applies the backend's epoch-7 rows; node 1 serves.
    for e in &eps {
        let st = until(e, Duration::from_secs(10), |s| {
            s.table.as_ref().is_some_and(|t| t.epoch == 7)
        })
        .await;
        assert!(st.external);
        assert_eq!(st.table.expect("table").role, NodeId(1));
    }
    until(&eps[0], Duration::from_secs(1), |s| s.serving == Some(7)).await;
    // Reports still travel over the sessions: node 3 muted on network 1
    // is reported by its peers, and the backend's table steers node 2 off
    // that network.
    eps[2].testing().mute_network(1, true);
    let st = until(&eps[1], Duration::from_secs(10), |s| {
        steers_off(s, NodeId(3), 1)
    })
    .await;
    let held = st.table.expect("table");
    // An older epoch's row, handed over late, is refused: epochs only go up.
    let mut stale = held.clone();
    stale.epoch = 6;
    stale.version = held.version + 100;
    links[1].apply(stale).await.expect("endpoint up");
    let st = until(&eps[1], Duration::from_secs(5), |s| s.tables_rejected >= 1).await;
    // (The backend may have moved on meanwhile, within epoch 7.)
    let now = st.table.as_ref().map(|t| (t.epoch, t.version));
    assert!(
        now.is_some_and(|(e, v)| e == 7 && v < held.version + 100),
        "{now:?}"
    );
    // So is a row written by a node that is no candidate.
    let mut forged = held.clone();
    forged.epoch = 8;
    forged.role = NodeId(3);
    links[1].apply(forged).await.expect("endpoint up");
    let st = until(&eps[1], Duration::from_secs(5), |s| s.tables_rejected >= 2).await;
    assert_eq!(st.table.map(|t| t.epoch), Some(7));
    eps[2].testing().mute_network(1, false);
    for e in eps {
        e.shutdown().await;
    }
    // The endpoint's end closes the link.
    let inputs = tokio::time::timeout(Duration::from_secs(5), backend)
        .await
        .expect("the backend sees the endpoint go")
        .expect("backend task");
    assert!(inputs > 3, "reports reached the backend: {inputs}");
}
