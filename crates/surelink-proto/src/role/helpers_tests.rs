//! The role server with helpers' reports: who may report, what rows
//! list, and how often a change of helpers alone makes a new version.

use std::net::SocketAddr;

use super::*;
use crate::ids::NodeId;
use crate::time::Time;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const HELPER: NodeId = NodeId(3);

fn cfg() -> RoleConfig {
    RoleConfig {
        nodes: vec![A, B, HELPER],
        networks: 2,
        candidates: vec![A],
        ..RoleConfig::default()
    }
}

fn ms(v: u64) -> Time {
    Time::from_millis(v)
}

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7400))
}

fn report(seq: u64, level: u8) -> HelperReport {
    HelperReport {
        helper: HELPER,
        seq,
        addr: addr(),
        level,
    }
}

/// Every row the server sends now.
fn rows(s: &mut RoleServer, now: Time) -> Vec<Push> {
    s.handle_timeout(now);
    std::iter::from_fn(|| s.poll_push(now, Some(Time::MAX))).collect()
}

fn listed(s: &RoleServer) -> Vec<(NodeId, u8)> {
    s.table()
        .helpers
        .iter()
        .map(|h| (h.node, h.level))
        .collect()
}

#[test]
fn a_helper_is_listed_in_every_row_until_its_reports_go_stale() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    s.handle_helper_report(ms(0), HELPER, &report(1, 5))
        .unwrap();
    let pushed = rows(&mut s, ms(0));
    assert_eq!(pushed.len(), 3, "a row for every node");
    for p in &pushed {
        assert_eq!(
            p.view.helpers,
            vec![HelperEntry {
                node: HELPER,
                addr: addr(),
                level: 5
            }]
        );
    }
    let v = s.table().version;
    // Reports at the refresh's pace with the same level: no new version.
    for k in 1..=3u64 {
        s.handle_helper_report(ms(k * 100), HELPER, &report(1 + k, 5))
            .unwrap();
        let _ = rows(&mut s, ms(k * 100));
    }
    assert_eq!(s.table().version, v);
    // Silent past `report_stale_after` (500 ms): unlisted at once, not
    // held like a change of level (a client must not pick a dead one).
    let _ = rows(&mut s, ms(800));
    assert_eq!(listed(&s), vec![(HELPER, 5)], "fresh until 800 ms");
    let _ = rows(&mut s, ms(900));
    assert_eq!(listed(&s), vec![], "a helper that stopped reporting");
    assert_eq!(s.table().version, v + 1);
}

#[test]
fn a_helper_its_peers_report_dead_is_unlisted_at_once() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    s.handle_helper_report(ms(0), HELPER, &report(1, 5))
        .unwrap();
    let _ = rows(&mut s, ms(0));
    assert_eq!(listed(&s), vec![(HELPER, 5)]);
    // Its last report is still fresh, but a peer's detector says dead.
    let dead = StatusReport {
        reporter: B,
        seq: 1,
        watched: 2,
        held: (0, 0),
        peers: vec![PeerReport {
            peer: HELPER,
            alive: false,
            networks: vec![(PathStatus::Down, 0), (PathStatus::Down, 0)],
        }],
    };
    s.handle_report(ms(50), B, &dead).unwrap();
    let _ = rows(&mut s, ms(50));
    assert_eq!(s.table().member(HELPER), Some(MemberState::Down));
    assert_eq!(listed(&s), vec![]);
}

#[test]
fn only_the_helper_reports_for_itself_and_late_reports_are_ignored() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    assert_eq!(
        s.handle_helper_report(ms(0), B, &report(1, 5)),
        Err(ReportRejected::NotReporter {
            from: B,
            named: HELPER
        })
    );
    let stranger = HelperReport {
        helper: NodeId(9),
        ..report(1, 5)
    };
    assert_eq!(
        s.handle_helper_report(ms(0), NodeId(9), &stranger),
        Err(ReportRejected::UnknownNode(NodeId(9)))
    );
    s.handle_helper_report(ms(0), HELPER, &report(2, 5))
        .unwrap();
    // An older report arriving late over another path.
    s.handle_helper_report(ms(10), HELPER, &report(1, 40))
        .unwrap();
    let _ = rows(&mut s, ms(10));
    assert_eq!(listed(&s), vec![(HELPER, 5)]);
}

#[test]
fn a_change_of_helpers_alone_makes_a_version_at_most_once_a_hold() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    s.handle_helper_report(ms(0), HELPER, &report(1, 5))
        .unwrap();
    let _ = rows(&mut s, ms(0));
    let v = s.table().version;
    // A new level 100 ms later waits for the hold (10 refreshes, 1 s).
    let mut seq = 1;
    for t in (100..1000).step_by(100) {
        seq += 1;
        s.handle_helper_report(ms(t), HELPER, &report(seq, 6))
            .unwrap();
        let _ = rows(&mut s, ms(t));
        assert_eq!(listed(&s), vec![(HELPER, 5)], "held at {t} ms");
        assert_eq!(s.table().version, v);
    }
    seq += 1;
    s.handle_helper_report(ms(1000), HELPER, &report(seq, 6))
        .unwrap();
    let pushed = rows(&mut s, ms(1000));
    assert_eq!(listed(&s), vec![(HELPER, 6)]);
    assert_eq!(s.table().version, v + 1);
    assert!(pushed.iter().all(|p| p.view.helpers[0].level == 6));
    // A route's change is not held, and carries the helpers' news along.
    seq += 1;
    s.handle_helper_report(ms(1100), HELPER, &report(seq, 7))
        .unwrap();
    let down = StatusReport {
        reporter: B,
        seq: 1,
        watched: 2,
        held: (0, 0),
        peers: vec![PeerReport {
            peer: A,
            alive: true,
            networks: vec![(PathStatus::Up, 100), (PathStatus::Down, 100)],
        }],
    };
    s.handle_report(ms(1100), B, &down).unwrap();
    let _ = rows(&mut s, ms(1100));
    assert_eq!(s.table().version, v + 2);
    assert_eq!(listed(&s), vec![(HELPER, 7)]);
}

#[test]
fn rows_without_helpers_encode_as_before_and_with_them_round_trip() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    let plain = rows(&mut s, ms(0)).remove(0).into_message();
    let mut b = Vec::new();
    encode(&plain, &mut b);
    assert_eq!(b[0], 2, "a row without helpers keeps the old tag");
    s.handle_helper_report(ms(100), HELPER, &report(1, 5))
        .unwrap();
    let with = rows(&mut s, ms(100)).remove(0).into_message();
    let mut b = Vec::new();
    encode(&with, &mut b);
    assert!(matches!(b[0], 6 | 7), "tag {}", b[0]);
    assert_eq!(decode(&b), Ok(with));
}
