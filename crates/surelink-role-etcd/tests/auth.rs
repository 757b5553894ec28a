//! The etcd backend against a real etcd with authentication on (Debian's
//! `etcd-server`): a user with read-write on the cluster's prefix is
//! elected, writes and watches — also after its token has expired several
//! times over; a wrong password, an anonymous client and a user without
//! rights on the prefix get nothing written. Prints `SKIPPED: …` where
//! etcd is not installed.

use std::time::Duration;

use surelink_proto::role::{PathStatus, PeerReport, RoleConfig, StatusReport};
use surelink_proto::NodeId;
use surelink_role_etcd::testing::{EtcdProcess, SKIPPED};
use surelink_role_etcd::{Candidate, ConnectError, EtcdAuth, EtcdRoleConfig, WatchEvent, Watcher};
use tokio::time::{sleep, timeout};

/// etcd's tokens live this long in these tests.
const TOKEN_TTL: Duration = Duration::from_secs(1);

fn role() -> RoleConfig {
    RoleConfig {
        nodes: (1..=3).map(NodeId).collect(),
        candidates: vec![NodeId(1), NodeId(2)],
        ..RoleConfig::default()
    }
}

fn cfg(endpoint: String, auth: Option<EtcdAuth>) -> EtcdRoleConfig {
    let mut c = EtcdRoleConfig::for_cluster("auth", vec![endpoint]);
    c.auth = auth;
    c
}

/// Node 3's report: its path to node 2 on network 1 down, or all well.
fn report(seq: u64, down: bool) -> StatusReport {
    StatusReport {
        reporter: NodeId(3),
        seq,
        watched: 2,
        held: (0, 0),
        peers: if down {
            vec![PeerReport {
                peer: NodeId(2),
                alive: true,
                networks: vec![(PathStatus::Up, 0), (PathStatus::Down, 0)],
            }]
        } else {
            Vec::new()
        },
    }
}

#[tokio::test]
async fn only_users_etcd_admits_take_part() {
    let prefix = cfg(String::new(), None).prefix;
    let started = EtcdProcess::start_auth(&prefix, TOKEN_TTL)
        .await
        .expect("etcd is installed but did not start");
    let Some((etcd, auth)) = started else {
        println!("{SKIPPED}");
        return;
    };
    let good = cfg(etcd.endpoint(), Some(auth.clone()));
    let cand = Candidate::connect(good.clone(), role(), NodeId(1))
        .await
        .expect("candidate with a user");
    let mut leader = timeout(Duration::from_secs(5), cand.campaign())
        .await
        .expect("uncontested")
        .expect("campaign as the user");
    assert_eq!(leader.publish().await.expect("publish").rows, 3);
    let mut w = Watcher::connect(good.clone(), role(), NodeId(2))
        .await
        .expect("watcher with a user");
    match timeout(Duration::from_secs(5), w.next()).await {
        Ok(Ok(WatchEvent::Applied { view, .. })) => assert_eq!(view.version, 1),
        other => panic!("unexpected: {other:?}"),
    }

    // Tokens expire every TOKEN_TTL; the leader keeps writing and the
    // watcher keeps reading across several expiries.
    for seq in 1..=3u64 {
        sleep(TOKEN_TTL * 2).await;
        leader
            .handle_report(NodeId(3), &report(seq, seq % 2 == 1))
            .expect("report");
        let out = leader
            .publish()
            .await
            .unwrap_or_else(|e| panic!("publish after the token expired ({seq}): {e}"));
        assert_eq!(out.version, 1 + seq);
        match timeout(Duration::from_secs(5), w.next()).await {
            Ok(Ok(WatchEvent::Applied { view, .. })) => assert_eq!(view.version, 1 + seq),
            other => panic!("watch after the token expired ({seq}): {other:?}"),
        }
    }
    // A watcher connecting long after the first login reads the row.
    let mut late = Watcher::connect(good, role(), NodeId(3))
        .await
        .expect("late watcher");
    match timeout(Duration::from_secs(5), late.next()).await {
        Ok(Ok(WatchEvent::Applied { view, .. })) => assert_eq!(view.version, 4),
        other => panic!("late watcher: {other:?}"),
    }

    // A wrong password: refused at login, typed.
    let wrong = EtcdAuth {
        password: "guess".into(),
        ..auth.clone()
    };
    let e = Candidate::connect(cfg(etcd.endpoint(), Some(wrong)), role(), NodeId(2))
        .await
        .expect_err("wrong password");
    assert!(matches!(e, ConnectError::Connect(_)), "{e:?}");
    println!("wrong password: {e}");

    // Anonymous, and a user with no rights on the prefix: whatever step
    // fails, nothing is elected and nothing written.
    let mut root = etcd_client::Client::connect(
        [etcd.endpoint()],
        Some(
            etcd_client::ConnectOptions::new()
                .with_user("root", surelink_role_etcd::testing::ROOT_PASSWORD),
        ),
    )
    .await
    .expect("root");
    root.user_add("stranger", "pw", None)
        .await
        .expect("user add");
    let stranger = EtcdAuth {
        user: "stranger".into(),
        password: "pw".into(),
    };
    for (name, who) in [("anonymous", None), ("no rights", Some(stranger))] {
        let outcome = async {
            let c = Candidate::connect(cfg(etcd.endpoint(), who), role(), NodeId(2))
                .await
                .map_err(|e| e.to_string())?;
            let mut l = timeout(Duration::from_secs(3), c.campaign())
                .await
                .map_err(|_| "campaign hung".to_string())?
                .map_err(|e| e.to_string())?;
            l.publish().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        }
        .await;
        let e = outcome.expect_err(name);
        println!("{name}: {e}");
    }
    let rows = root
        .get(
            format!("{prefix}/table/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("read rows");
    assert_eq!(rows.kvs().len(), 3, "only the user's rows");
    leader.resign().await;
}
