//! The etcd backend against a real etcd on loopback (Debian's
//! `etcd-server`). Where etcd is not installed each test prints
//! `SKIPPED: …` and returns; where it is installed but does not start, the
//! test fails.

use std::time::Duration;

use surelink_proto::role::{
    encode, PathStatus, PeerReport, RoleConfig, RoleInput, RoleMessage, StatusReport,
    TableRejected, TableView,
};
use surelink_proto::NodeId;
use surelink_role_etcd::testing::{EtcdProcess, Relay, SKIPPED};
use surelink_role_etcd::{
    BadRow, Candidate, EtcdRoleConfig, Leader, LeaderEnd, PublishError, WatchEvent, Watcher,
};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

async fn etcd() -> Option<EtcdProcess> {
    match EtcdProcess::start()
        .await
        .expect("etcd is installed but did not start")
    {
        Some(e) => Some(e),
        None => {
            println!("{SKIPPED}");
            None
        }
    }
}

fn role() -> RoleConfig {
    RoleConfig {
        nodes: (1..=5).map(NodeId).collect(),
        candidates: vec![NodeId(1), NodeId(2), NodeId(3)],
        ..RoleConfig::default()
    }
}

fn cfg(endpoint: String) -> EtcdRoleConfig {
    EtcdRoleConfig::for_cluster("test", vec![endpoint])
}

/// Node 5's report: its path to node 4 on network 1 is down (`down`) or
/// everything is fine. Alternating them changes the table each time.
fn report(seq: u64, down: bool) -> StatusReport {
    let peers = if down {
        vec![PeerReport {
            peer: NodeId(4),
            alive: true,
            networks: vec![(PathStatus::Up, 0), (PathStatus::Down, 0)],
        }]
    } else {
        Vec::new()
    };
    StatusReport {
        reporter: NodeId(5),
        seq,
        watched: 4,
        held: (0, 0),
        peers,
    }
}

/// What a watcher applied, and when.
#[derive(Clone, Copy, Debug)]
struct Seen {
    epoch: u64,
    version: u64,
    at: Instant,
}

/// Runs a watcher for node 4 in a task; everything applied comes out of
/// the channel, and anything skipped other than a duplicate fails the test.
fn watch(w: Watcher) -> mpsc::UnboundedReceiver<Seen> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut w = w;
        loop {
            match w.next().await {
                Ok(WatchEvent::Applied { view, .. }) => {
                    let seen = Seen {
                        epoch: view.epoch,
                        version: view.version,
                        at: Instant::now(),
                    };
                    if tx.send(seen).is_err() {
                        return;
                    }
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
                }) => assert_eq!(
                    (epoch, version),
                    (held_epoch, held_version),
                    "a row older than the one held reached etcd"
                ),
                Ok(other) => panic!("unexpected: {other:?}"),
                Err(e) => {
                    eprintln!("watch: {e}");
                    sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    rx
}

/// Waits for the first table of an epoch above `above`; returns everything
/// seen until then (inclusive).
async fn until_epoch_above(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    above: u64,
    log: &mut Vec<Seen>,
) -> Seen {
    loop {
        let s = timeout(Duration::from_secs(15), rx.recv())
            .await
            .expect("no newer table within 15 s")
            .expect("watcher ended");
        log.push(s);
        if s.epoch > above {
            return s;
        }
    }
}

fn assert_monotonic(log: &[Seen]) {
    for w in log.windows(2) {
        assert!(
            (w[0].epoch, w[0].version) < (w[1].epoch, w[1].version),
            "tables went back or interleaved: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

/// Drives a leader by hand, a report every 100 ms (so a new version
/// every round), until it stops; returns it with why and when.
async fn drive(mut leader: Leader, mut seq: u64) -> (Leader, LeaderEnd, Instant) {
    loop {
        seq += 1;
        leader
            .handle_report(NodeId(5), &report(seq, seq % 2 == 0))
            .expect("report");
        match leader.publish().await {
            Err(PublishError::Ended(end)) => return (leader, end, Instant::now()),
            Err(e) => eprintln!("publish: {e}"),
            Ok(_) => {}
        }
        sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn one_candidate_wins_writes_and_a_watcher_sees_it() {
    let Some(etcd) = etcd().await else { return };
    let cfg = cfg(etcd.endpoint());
    let before = Instant::now();
    let cand = Candidate::connect(cfg.clone(), role(), NodeId(1))
        .await
        .expect("candidate");
    let after = Instant::now();
    assert_eq!(cand.lease_ttl(), Duration::from_secs(2));
    // t_valid = the grant's send time + TTL − margin.
    let tv = cand.t_valid().expect("lease held");
    let span = cand.lease_ttl() - cfg.margin;
    assert!(tv >= before + span && tv <= after + span, "t_valid {tv:?}");
    // Keep-alives move it on.
    sleep(cfg.keepalive_every * 2).await;
    let tv2 = cand.t_valid().expect("lease held");
    assert!(tv2 > tv, "t_valid did not move: {tv:?} → {tv2:?}");
    assert!(tv2 <= Instant::now() + span);
    assert_eq!(tv2, cand.last_acked_keepalive() + span);

    let mut leader = timeout(Duration::from_secs(5), cand.campaign())
        .await
        .expect("an uncontested campaign wins at once")
        .expect("campaign");
    assert!(leader.epoch() > 0);
    let first = leader.publish().await.expect("publish");
    assert_eq!((first.rows, first.version), (5, 1));
    assert_eq!(leader.stats().txns, 1);

    let mut w = Watcher::connect(cfg.clone(), role(), NodeId(4))
        .await
        .expect("watcher");
    match w.next().await.expect("watch") {
        WatchEvent::Applied { view, applied, .. } => {
            assert_eq!((view.role, view.node), (NodeId(1), NodeId(4)));
            assert_eq!((view.epoch, view.version), (leader.epoch(), 1));
            assert_eq!(applied.previous_epoch, 0);
        }
        other => panic!("unexpected: {other:?}"),
    }
    // A change reaches the node as the next version; node 4 learns that
    // node 5 cannot reach it on network 1.
    leader
        .handle_report(NodeId(5), &report(1, true))
        .expect("report");
    let second = leader.publish().await.expect("publish");
    assert_eq!(second.version, 2);
    match w.next().await.expect("watch") {
        WatchEvent::Applied { view, .. } => {
            assert_eq!(view.version, 2);
            assert!(!view.usable(NodeId(5), 1));
            assert!(view.usable(NodeId(5), 0));
        }
        other => panic!("unexpected: {other:?}"),
    }
    // Nothing is due without a change.
    assert_eq!(leader.publish().await.expect("publish").rows, 0);

    // Bad data in the row's key is skipped with a typed reason.
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("raw client");
    let key = cfg.table_key(NodeId(4));
    raw.put(key.as_str(), vec![2u8, 0, 1], None)
        .await
        .expect("put");
    let mut other_row = Vec::new();
    let row3 = TableView {
        role: NodeId(1),
        epoch: leader.epoch() + 100,
        version: 1,
        node: NodeId(3),
        routes: Vec::new(),
        ring: Vec::new(),
        helpers: Vec::new(),
    };
    encode(&RoleMessage::Table(row3), &mut other_row);
    raw.put(key.as_str(), other_row, None).await.expect("put");
    let mut ack = Vec::new();
    encode(
        &RoleMessage::Ack {
            epoch: 9,
            version: 9,
        },
        &mut ack,
    );
    raw.put(key.as_str(), ack, None).await.expect("put");
    let mut got = Vec::new();
    for _ in 0..3 {
        match w.next().await.expect("watch") {
            WatchEvent::Skipped { reason, .. } => got.push(reason),
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert!(matches!(got[0], BadRow::Decode(_)), "{got:?}");
    assert!(
        matches!(got[1], BadRow::Rejected(TableRejected::WrongRow { .. })),
        "{got:?}"
    );
    assert_eq!(got[2], BadRow::NotATable);
    assert_eq!(w.held(), (leader.epoch(), 2));
    leader.resign().await;
}

#[tokio::test]
async fn a_killed_leader_is_followed_by_a_larger_epoch_never_interleaved() {
    let Some(etcd) = etcd().await else { return };
    let cfg = cfg(etcd.endpoint());
    let c1 = Candidate::connect(cfg.clone(), role(), NodeId(1))
        .await
        .expect("candidate 1");
    let leader1 = c1.campaign().await.expect("campaign 1");
    let epoch1 = leader1.epoch();
    let c2 = Candidate::connect(cfg.clone(), role(), NodeId(2))
        .await
        .expect("candidate 2");
    let c2 = tokio::spawn(c2.campaign());
    let mut seen = watch(
        Watcher::connect(cfg.clone(), role(), NodeId(4))
            .await
            .expect("watcher"),
    );
    let l1 = tokio::spawn(drive(leader1, 0));
    let mut log = Vec::new();
    while log.iter().filter(|s: &&Seen| s.epoch == epoch1).count() < 3 {
        log.push(seen.recv().await.expect("watcher"));
    }
    // Kill: the task, its keep-alives and its connection go at once; the
    // lease is not revoked and runs out after its TTL.
    let killed = Instant::now();
    l1.abort();
    let leader2 = timeout(Duration::from_secs(10), c2)
        .await
        .expect("candidate 2 wins within 10 s")
        .expect("task")
        .expect("campaign 2");
    let epoch2 = leader2.epoch();
    assert!(epoch2 > epoch1, "epochs {epoch1} then {epoch2}");
    assert!(leader2.stats().won_at >= killed + Duration::from_millis(500));

    // The second leader runs as the shell would run it.
    let (tx, mut rx) = mpsc::channel(16);
    let run2 =
        tokio::spawn(async move { leader2.run(&mut rx, std::future::pending(), |_| {}).await });
    let first2 = until_epoch_above(&mut seen, epoch1, &mut log).await;
    let gap = first2.at - killed;
    println!("leader killed: next table after {gap:?}");
    assert!(gap < Duration::from_secs(5), "{gap:?}");
    for seq in 1..=4 {
        tx.send(RoleInput::Report {
            from: NodeId(5),
            report: report(seq, seq % 2 == 1),
        })
        .await
        .expect("send");
        sleep(Duration::from_millis(100)).await;
    }
    while log.iter().filter(|s| s.epoch == epoch2).count() < 3 {
        log.push(
            timeout(Duration::from_secs(5), seen.recv())
                .await
                .expect("tables of epoch 2")
                .expect("watcher"),
        );
    }

    // A resigning leader (reports closed) revokes its lease: the next
    // candidate wins without waiting for a TTL.
    let c3 = Candidate::connect(cfg.clone(), role(), NodeId(3))
        .await
        .expect("candidate 3");
    let c3 = tokio::spawn(c3.campaign());
    sleep(Duration::from_millis(200)).await;
    let resigned = Instant::now();
    drop(tx);
    assert_eq!(run2.await.expect("task"), LeaderEnd::Resigned);
    let mut leader3 = timeout(Duration::from_secs(2), c3)
        .await
        .expect("candidate 3 wins at once")
        .expect("task")
        .expect("campaign 3");
    assert!(leader3.epoch() > epoch2);
    leader3.publish().await.expect("publish");
    let first3 = until_epoch_above(&mut seen, epoch2, &mut log).await;
    println!(
        "leader resigned: next table after {:?}",
        first3.at - resigned
    );
    assert!(first3.at - resigned < Duration::from_secs(1));
    assert_monotonic(&log);
    leader3.resign().await;
}

#[tokio::test]
async fn a_leader_cut_off_from_etcd_stops_before_the_next_one_writes() {
    let Some(etcd) = etcd().await else { return };
    let relay = Relay::start(etcd.addr()).await.expect("relay");
    let direct = cfg(etcd.endpoint());
    let c1 = Candidate::connect(cfg(relay.endpoint()), role(), NodeId(1))
        .await
        .expect("candidate 1");
    let leader1 = c1.campaign().await.expect("campaign 1");
    let epoch1 = leader1.epoch();
    let c2 = Candidate::connect(direct.clone(), role(), NodeId(2))
        .await
        .expect("candidate 2");
    let c2 = tokio::spawn(c2.campaign());
    let mut seen = watch(
        Watcher::connect(direct.clone(), role(), NodeId(4))
            .await
            .expect("watcher"),
    );
    let l1 = tokio::spawn(drive(leader1, 0));
    let mut log = Vec::new();
    while log.iter().filter(|s: &&Seen| s.epoch == epoch1).count() < 3 {
        log.push(seen.recv().await.expect("watcher"));
    }

    // The partition: leader 1's process runs on, its connection to etcd
    // goes silent.
    let cut = Instant::now();
    relay.cut();
    let (mut leader1, end1, stopped1) = timeout(Duration::from_secs(10), l1)
        .await
        .expect("leader 1 stops within 10 s")
        .expect("task");
    assert_eq!(end1, LeaderEnd::Fenced);
    let tv1 = leader1
        .t_valid()
        .expect("etcd cannot have said the lease is gone: unreachable");
    let s1 = leader1.stats();
    let last1 = s1.last_write_sent.expect("leader 1 wrote");
    assert!(last1 < tv1, "wrote at or after t_valid");
    assert!(tv1 <= cut + leader1.lease_ttl(), "t_valid beyond the lease");

    let mut leader2 = timeout(Duration::from_secs(10), c2)
        .await
        .expect("candidate 2 wins within 10 s")
        .expect("task")
        .expect("campaign 2");
    let epoch2 = leader2.epoch();
    assert!(epoch2 > epoch1);
    let won2 = leader2.stats().won_at;
    leader2.publish().await.expect("publish");
    let first2 = leader2.stats().first_write_sent.expect("leader 2 wrote");
    println!(
        "partition at 0: leader 1's last write {:?}, its t_valid {:?}, stopped {:?}; \
         leader 2 elected {:?}, first write {:?}",
        last1.saturating_duration_since(cut),
        tv1 - cut,
        stopped1 - cut,
        won2 - cut,
        first2 - cut
    );
    // Fenced before the other could be elected, let alone write.
    assert!(
        tv1 < won2,
        "t_valid {tv1:?} not before the election {won2:?}"
    );
    assert!(
        stopped1 < won2,
        "stopped {stopped1:?}, other elected {won2:?}"
    );
    assert!(last1 < first2);
    let seen2 = until_epoch_above(&mut seen, epoch1, &mut log).await;
    assert_eq!(seen2.epoch, epoch2);

    // Healed: whatever leader 1 still had in flight arrives now, and its
    // own conditional transaction is refused.
    relay.heal();
    assert!(
        !leader1
            .write_ignoring_t_valid()
            .await
            .expect("etcd answers once healed"),
        "the old leader's conditional write applied"
    );
    assert_eq!(leader1.ended(), Some(LeaderEnd::Fenced));
    // Its keep-alives learn that the lease is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    while leader1.t_valid().is_some() && Instant::now() < deadline {
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(leader1.t_valid(), None, "the lost lease went unnoticed");
    // Nothing of epoch 1 after epoch 2.
    leader2
        .handle_report(NodeId(5), &report(1, true))
        .expect("report");
    leader2.publish().await.expect("publish");
    while let Ok(Some(s)) = timeout(Duration::from_millis(500), seen.recv()).await {
        log.push(s);
    }
    assert!(log.last().is_some_and(|s| s.epoch == epoch2));
    assert_monotonic(&log);
    leader2.resign().await;
}
