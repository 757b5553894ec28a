//! The etcd backend over TLS, against a real etcd serving only TLS and
//! requiring client certificates (its certificates from a throwaway CA):
//! a candidate with the right settings is elected and writes, a watcher
//! reads its row; a client without a certificate, one trusting another
//! CA, and one speaking plain HTTP get nothing. Prints `SKIPPED: …` where
//! etcd is not installed.

use std::time::Duration;

use surelink_proto::role::RoleConfig;
use surelink_proto::secure::TestCa;
use surelink_proto::{ClusterId, NodeId};
use surelink_role_etcd::testing::{EtcdProcess, SKIPPED};
use surelink_role_etcd::{Candidate, EtcdRoleConfig, EtcdTls, WatchEvent, Watcher};
use tokio::time::timeout;

fn role() -> RoleConfig {
    RoleConfig {
        nodes: (1..=3).map(NodeId).collect(),
        candidates: vec![NodeId(1), NodeId(2)],
        ..RoleConfig::default()
    }
}

fn cfg(endpoint: String, tls: Option<EtcdTls>) -> EtcdRoleConfig {
    let mut c = EtcdRoleConfig::for_cluster("tls", vec![endpoint]);
    c.tls = tls;
    c
}

#[tokio::test]
async fn only_clients_etcd_trusts_take_part() {
    let started = EtcdProcess::start_tls()
        .await
        .expect("etcd is installed but did not start");
    let Some((etcd, tls)) = started else {
        println!("{SKIPPED}");
        return;
    };
    assert!(etcd.endpoint().starts_with("https://"));
    // The real thing: elected, writes, a watcher applies its row.
    let good = cfg(etcd.endpoint(), Some(tls.clone()));
    let cand = Candidate::connect(good.clone(), role(), NodeId(1))
        .await
        .expect("candidate over TLS");
    let mut leader = timeout(Duration::from_secs(5), cand.campaign())
        .await
        .expect("uncontested")
        .expect("campaign");
    let out = leader.publish().await.expect("publish over TLS");
    assert_eq!(out.rows, 3);
    let mut w = Watcher::connect(good, role(), NodeId(3))
        .await
        .expect("watcher over TLS");
    match timeout(Duration::from_secs(5), w.next()).await {
        Ok(Ok(WatchEvent::Applied { view, .. })) => {
            assert_eq!((view.role, view.epoch), (NodeId(1), leader.epoch()));
        }
        other => panic!("unexpected: {other:?}"),
    }

    // Without a client certificate: etcd refuses the handshake.
    let anonymous = EtcdTls {
        client: None,
        ..tls.clone()
    };
    let e = Candidate::connect(cfg(etcd.endpoint(), Some(anonymous)), role(), NodeId(2))
        .await
        .expect_err("no client certificate");
    println!("without a client certificate: {e}");
    // Trusting another CA: the client refuses etcd.
    let other = TestCa::new(ClusterId(1)).expect("ca");
    let stranger = EtcdTls {
        ca_pem: other.cert_pem(),
        ..tls.clone()
    };
    let e = Candidate::connect(cfg(etcd.endpoint(), Some(stranger)), role(), NodeId(2))
        .await
        .expect_err("another CA");
    println!("trusting another CA: {e}");
    // Plain HTTP to the TLS port.
    let plain = etcd.endpoint().replace("https://", "http://");
    let e = Candidate::connect(cfg(plain, None), role(), NodeId(2))
        .await
        .expect_err("plain http");
    println!("plain http: {e}");
    leader.resign().await;
}
