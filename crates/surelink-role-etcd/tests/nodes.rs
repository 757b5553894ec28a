//! The etcd backend driving real surelink endpoints on loopback (three
//! nodes on two networks, candidates 1 and 2, the product's defaults),
//! against a real etcd: the nodes report over their sessions, the elected
//! candidate's tables reach every node through etcd and steer its paths,
//! and when the leader dies or is cut off from etcd the other candidate
//! takes over — calls between the survivors meanwhile are neither lost nor
//! run twice, and every node applies tables strictly in order. Prints
//! `SKIPPED: …` where etcd is not installed.

use std::time::Duration;

use surelink::proto::role::{MemberState, Ownership, RoleConfig};
use surelink::proto::NodeId;
use surelink::testing::{role_cluster, role_expect as until, steers_off};
use surelink_role_etcd::testing::{failover_round, EtcdProcess, Fault, Round, SKIPPED};
use surelink_role_etcd::{EtcdBackend, EtcdRoleConfig, LeaderEnd};

async fn etcd() -> Option<EtcdProcess> {
    let e = EtcdProcess::start()
        .await
        .expect("etcd is installed but did not start");
    if e.is_none() {
        println!("{SKIPPED}");
    }
    e
}

/// What every failover round must show.
fn check(r: &Round) {
    assert!(r.epochs.1 > r.epochs.0, "{r:?}");
    assert_eq!(r.new_role, NodeId(2), "{r:?}");
    assert_eq!(r.calls_failed, 0, "calls lost during the failover: {r:?}");
    assert!(r.calls_ok > 100, "too few calls to mean anything: {r:?}");
    assert_eq!(
        r.executed, r.calls_ok,
        "a call ran twice or not at all: {r:?}"
    );
    assert!(r.in_order(), "tables out of order: {:?}", r.tables);
    assert!(r.tables.iter().any(|t| t.0 == r.epochs.1), "{r:?}");
    assert!(r.took < Duration::from_secs(6), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elected_tables_reach_every_node_and_steer_its_paths() {
    let Some(etcd) = etcd().await else { return };
    let role = RoleConfig {
        nodes: vec![NodeId(1), NodeId(2), NodeId(3)],
        candidates: vec![NodeId(1), NodeId(2)],
        ownership: Ownership::Elected,
        ..RoleConfig::default()
    };
    let eps = role_cluster(role, 60).await.expect("cluster");
    let mut bs = Vec::new();
    for e in &eps {
        let cfg = EtcdRoleConfig::for_cluster("steer", vec![etcd.endpoint()]);
        bs.push(EtcdBackend::start(e, cfg).expect("backend"));
    }
    assert!(matches!(
        EtcdBackend::start(
            &eps[0],
            EtcdRoleConfig::for_cluster("steer", vec![etcd.endpoint()])
        ),
        Err(surelink_role_etcd::StartError::AlreadyRunning)
    ));
    let st = until(&eps[2], Duration::from_secs(10), |s| s.table.is_some()).await;
    let (role, epoch) = st.table.map(|t| (t.role, t.epoch)).expect("table");
    for e in &eps {
        until(e, Duration::from_secs(10), |s| {
            s.table.as_ref().is_some_and(|t| t.epoch == epoch)
        })
        .await;
    }
    let leader = eps.iter().find(|e| e.node() == role).expect("leader");
    until(leader, Duration::from_secs(2), |s| s.serving == Some(epoch)).await;
    // Reports travel over the sessions to the elected leader: node 3 muted
    // on network 1, and node 1's row from etcd steers it off that network.
    eps[2].testing().mute_network(1, true);
    until(&eps[0], Duration::from_secs(10), |s| {
        steers_off(s, NodeId(3), 1)
    })
    .await;
    eps[2].testing().mute_network(1, false);
    until(&eps[0], Duration::from_secs(10), |s| {
        s.table
            .as_ref()
            .is_some_and(|t| t.route_to(NodeId(3)).is_none_or(|r| r.usable(1)))
    })
    .await;
    for b in bs {
        b.stop().await;
    }
    for e in eps {
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_followed_without_losing_calls() {
    let Some(etcd) = etcd().await else { return };
    let r = failover_round(Some(&etcd), Fault::EtcdKill, 70)
        .await
        .expect("round");
    check(&r);
    // The new leader's first table comes from the reports it received
    // while campaigning: the survivors are up, the dead node is not.
    let state = |n| {
        r.new_ring
            .iter()
            .find(|m| m.node == NodeId(n))
            .map(|m| m.state)
    };
    assert_ne!(state(1), Some(MemberState::Up), "{r:?}");
    assert_eq!(state(2), Some(MemberState::Up), "{r:?}");
    assert_eq!(state(3), Some(MemberState::Up), "{r:?}");
    println!(
        "etcd backend, leader killed: next leader's table on node 3 after {:?}",
        r.took
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_is_fenced_and_followed() {
    let Some(etcd) = etcd().await else { return };
    let r = failover_round(Some(&etcd), Fault::EtcdCut, 80)
        .await
        .expect("round");
    check(&r);
    // The old leader stopped, fenced by its lease (or told so by etcd).
    assert!(
        matches!(r.old_end, Some(LeaderEnd::Fenced | LeaderEnd::LostElection)),
        "{r:?}"
    );
    println!(
        "etcd backend, leader cut off from etcd: next leader's table on node 3 after {:?}",
        r.took
    );
}
