use std::net::SocketAddr;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::ids::NodeId;
use crate::time::Time;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const C: NodeId = NodeId(3);

fn cfg() -> RoleConfig {
    RoleConfig {
        nodes: vec![A, B, C],
        networks: 2,
        candidates: vec![A, B, C],
        ..RoleConfig::default()
    }
}

fn ms(v: u64) -> Time {
    Time::from_millis(v)
}

fn peer(p: NodeId, net0: PathStatus, net1: PathStatus) -> PeerReport {
    PeerReport {
        peer: p,
        alive: true,
        networks: vec![(net0, 100), (net1, 100)],
    }
}

fn report(reporter: NodeId, seq: u64, peers: Vec<PeerReport>) -> StatusReport {
    StatusReport {
        reporter,
        seq,
        watched: 2,
        held: (0, 0),
        peers,
    }
}

#[test]
fn config_errors_are_typed() {
    assert_eq!(cfg().validate(), Ok(()));
    let mut c = cfg();
    c.nodes.push(A);
    assert_eq!(c.validate(), Err(RoleConfigError::DuplicateNode(A)));
    let mut c = cfg();
    c.candidates = vec![NodeId(9)];
    assert_eq!(c.validate(), Err(RoleConfigError::BadCandidate(NodeId(9))));
    let mut c = cfg();
    c.candidates.clear();
    assert_eq!(c.validate(), Err(RoleConfigError::NoCandidates));
    let mut c = cfg();
    c.networks = 0;
    assert_eq!(c.validate(), Err(RoleConfigError::Networks(0)));
    let mut c = cfg();
    c.report_stale_after = c.refresh;
    assert!(matches!(
        c.validate(),
        Err(RoleConfigError::StaleBeforeRefresh { .. })
    ));
}

#[test]
fn each_epoch_has_one_owner_in_candidate_order() {
    let c = cfg();
    assert_eq!(c.owner(0), None);
    assert_eq!(c.owner(1), Some(A));
    assert_eq!(c.owner(2), Some(B));
    assert_eq!(c.owner(3), Some(C));
    assert_eq!(c.owner(4), Some(A));
    assert_eq!(c.next_epoch_of(B, 0), Some(2));
    assert_eq!(c.next_epoch_of(B, 2), Some(5));
    assert_eq!(c.next_epoch_of(A, 3), Some(4));
    assert_eq!(c.next_epoch_of(C, 4), Some(6));
    for above in 0..50 {
        for who in [A, B, C] {
            let e = c.next_epoch_of(who, above).unwrap();
            assert!(e > above);
            assert_eq!(c.owner(e), Some(who));
            assert!(e - above <= 3);
        }
    }
}

#[test]
fn a_node_deaf_on_a_network_is_avoided_by_everyone_sending_to_it() {
    // B hears neither A nor C on network 1 (a one-way fault into B): A and
    // C still hear B there, so only B's report tells them.
    let c = cfg();
    let mut m = Matrix::new();
    let down = PathStatus::Down;
    let up = PathStatus::Up;
    assert!(m.record(
        ms(0),
        &report(B, 1, vec![peer(A, up, down), peer(C, up, down)])
    ));
    assert!(m.deaf_on(ms(1), c.report_stale_after, B, 1));
    assert!(!m.deaf_on(ms(1), c.report_stale_after, B, 0));
    let (routes, _) = table::compute(&c, &m, ms(1));
    let t = RoutingTable {
        role: A,
        epoch: 1,
        version: 1,
        routes,
        ring: Vec::new(),
        helpers: Vec::new(),
    };
    let row_c = t.view_for(C);
    assert!(!row_c.usable(B, 1), "C must avoid network 1 to B");
    assert!(row_c.usable(B, 0));
    assert!(row_c.usable(A, 1), "C to A is untouched");
    let route = row_c.route_to(B).unwrap();
    assert_eq!(route.paths[0].network, 0);
    assert_eq!(route.paths[0].status, PathStatus::Up);
    assert_eq!(route.paths[1].status, PathStatus::Down);
    assert_eq!(route.paths[1].weight, 0);
    assert!(!t.view_for(A).usable(B, 1));
    // Once stale, B's report no longer makes B deaf (its reporter may see
    // otherwise now); its cells are at best suspect.
    let later = ms(0) + c.report_stale_after + Duration::from_millis(1);
    assert!(!m.deaf_on(later, c.report_stale_after, B, 1));
}

/// A reports B silent on network 1 while it hears C there: B's link most
/// likely fails outwards. The pair A–B is down on network 1; every other
/// pair with B is made suspect there, so C (idle with B, its own window
/// seconds long) prefers network 0 to B at once; C–A is untouched.
#[test]
fn a_node_one_peer_stopped_hearing_is_suspect_there_for_everyone_and_down_for_that_pair() {
    let c = cfg();
    let mut m = Matrix::new();
    m.record(
        ms(0),
        &report(A, 1, vec![peer(B, PathStatus::Up, PathStatus::Down)]),
    );
    let (routes, ring) = table::compute(&c, &m, ms(1));
    let pairs: Vec<_> = routes.iter().map(|r| (r.from, r.to)).collect();
    assert_eq!(pairs, vec![(A, B), (B, A), (B, C), (C, B)]);
    assert!(routes.iter().all(|r| !r.usable(1) && r.usable(0)));
    let status = |from, to| {
        routes
            .iter()
            .find(|r| r.from == from && r.to == to)
            .and_then(|r| r.paths.iter().find(|p| p.network == 1))
            .map(|p| p.status)
    };
    assert_eq!(status(A, B), Some(PathStatus::Down));
    assert_eq!(status(C, B), Some(PathStatus::Suspect));
    // A reported; B and C did not yet.
    assert_eq!(ring[0].state, MemberState::Up);
    assert_eq!(ring[1].state, MemberState::Suspect);
}

/// A witness that hears nobody on the network (it watches only B there)
/// says nothing about B: the fault is as likely its own link (it is the
/// one avoided there). B–C is untouched.
#[test]
fn a_deaf_witness_says_nothing_of_the_node_it_stopped_hearing() {
    let c = cfg();
    let mut m = Matrix::new();
    let mut r = report(A, 1, vec![peer(B, PathStatus::Up, PathStatus::Down)]);
    r.watched = 1;
    m.record(ms(0), &r);
    let (routes, _) = table::compute(&c, &m, ms(1));
    assert!(
        routes
            .iter()
            .all(|r| (r.from, r.to) != (B, C) && (r.from, r.to) != (C, B)),
        "{routes:?}"
    );
}

#[test]
fn an_older_report_is_ignored() {
    let mut m = Matrix::new();
    assert!(m.record(
        ms(0),
        &report(A, 5, vec![peer(B, PathStatus::Down, PathStatus::Up)])
    ));
    assert!(!m.record(ms(1), &report(A, 4, Vec::new())));
    assert_eq!(m.entry(A, B, 0).unwrap().status, PathStatus::Down);
    assert!(m.record(ms(2), &report(A, 6, Vec::new())));
    assert_eq!(m.entry(A, B, 0), None);
}

fn drain(s: &mut RoleServer, now: Time, t_valid: Time) -> Vec<Push> {
    let mut out = Vec::new();
    while let Some(p) = s.poll_push(now, Some(t_valid)) {
        out.push(p);
    }
    out
}

#[test]
fn the_server_pushes_every_row_on_a_change_and_re_pushes_until_acknowledged() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    let pushes = drain(&mut s, ms(0), ms(1000));
    assert_eq!(pushes.len(), 3);
    assert!(pushes
        .iter()
        .all(|p| p.view.epoch == 1 && p.view.version == 1));
    assert_eq!(s.poll_event(), Some(RoleEvent::TableChanged { version: 1 }));
    s.handle_ack(B, 1, 1);
    s.handle_ack(C, 1, 1);
    // Nothing new before the refresh; then only the unacknowledged A.
    assert!(drain(&mut s, ms(1), ms(1000)).is_empty());
    s.handle_timeout(ms(100));
    let again: Vec<_> = drain(&mut s, ms(100), ms(1000))
        .into_iter()
        .map(|p| p.to)
        .collect();
    assert_eq!(again, vec![A]);
    // A report that changes the table: version 2 to everyone.
    s.handle_report(
        ms(120),
        B,
        &report(B, 1, vec![peer(C, PathStatus::Down, PathStatus::Up)]),
    )
    .unwrap();
    let v2 = drain(&mut s, ms(120), ms(1000));
    assert_eq!(v2.len(), 3);
    assert!(v2.iter().all(|p| p.view.version == 2));
    let row_b = &v2.iter().find(|p| p.to == B).unwrap().view;
    assert!(!row_b.usable(C, 0) && row_b.usable(C, 1));
}

#[test]
fn a_dead_node_gets_each_version_once_not_every_refresh() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    let dead_c = |seq| {
        report(
            A,
            seq,
            vec![PeerReport {
                peer: C,
                alive: false,
                networks: vec![(PathStatus::Down, 0), (PathStatus::Down, 0)],
            }],
        )
    };
    let mut b_too = dead_c(1);
    b_too.reporter = B;
    s.handle_report(ms(0), A, &dead_c(1)).unwrap();
    s.handle_report(ms(0), B, &b_too).unwrap();
    let first = drain(&mut s, ms(0), ms(10_000));
    assert!(
        first.iter().any(|p| p.to == C),
        "the version goes to C once"
    );
    assert_eq!(s.table().member(C), Some(MemberState::Down));
    for p in &first {
        if p.to != C {
            s.handle_ack(p.to, 1, p.view.version);
        }
    }
    // Refreshes: A and B keep reporting C dead; C, silent, gets nothing.
    for (i, t) in [100, 200, 300, 700].into_iter().enumerate() {
        let seq = i as u64 + 2;
        s.handle_report(ms(t), A, &dead_c(seq)).unwrap();
        let mut b = dead_c(seq);
        b.reporter = B;
        s.handle_report(ms(t), B, &b).unwrap();
        s.handle_timeout(ms(t));
        let again = drain(&mut s, ms(t), ms(10_000));
        assert!(
            again.iter().all(|p| p.to != C),
            "re-pushed to the dead at {t} ms: {again:?}"
        );
    }
    // C reports (it was only cut off): its row goes out again.
    s.handle_report(ms(750), C, &report(C, 1, Vec::new()))
        .unwrap();
    s.handle_timeout(ms(800));
    let back = drain(&mut s, ms(800), ms(10_000));
    assert!(back.iter().any(|p| p.to == C), "{back:?}");
}

#[test]
fn the_server_refuses_a_report_for_someone_else() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    assert_eq!(
        s.handle_report(ms(0), B, &report(C, 1, Vec::new())),
        Err(server::ReportRejected::NotReporter { from: B, named: C })
    );
    assert_eq!(
        s.handle_report(ms(0), NodeId(9), &report(NodeId(9), 1, Vec::new())),
        Err(server::ReportRejected::UnknownNode(NodeId(9)))
    );
    assert!(
        RoleServer::new(cfg(), B, 1, ms(0)).is_err(),
        "B does not own epoch 1"
    );
}

#[test]
fn a_fenced_server_pushes_nothing_ever_again() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    assert!(s.poll_push(ms(0), Some(ms(50))).is_some());
    // Past t_valid (a pause): fenced, even if a later t_valid is handed in.
    assert_eq!(s.poll_push(ms(60), Some(ms(50))), None);
    assert_eq!(s.poll_push(ms(61), Some(ms(500))), None);
    let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(events.contains(&RoleEvent::Fenced));
    assert!(s.is_stopped());
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    assert_eq!(s.poll_push(ms(0), None), None, "None is fenced");
}

#[test]
fn a_newer_epoch_in_an_ack_stops_the_server() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    drain(&mut s, ms(0), ms(1000));
    s.handle_ack(C, 2, 1);
    assert!(s.is_stopped());
    assert_eq!(s.poll_push(ms(1), Some(ms(1000))), None);
    let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(events.contains(&RoleEvent::SteppedDown { newer: 2 }));
}

fn view(role: NodeId, epoch: u64, version: u64, node: NodeId) -> TableView {
    TableView {
        role,
        epoch,
        version,
        node,
        routes: Vec::new(),
        ring: Vec::new(),
        helpers: Vec::new(),
    }
}

#[test]
fn the_gate_applies_only_newer_tables_from_the_epochs_owner() {
    let mut g = TableGate::new(cfg(), C);
    assert_eq!(g.held(), (0, 0));
    assert!(matches!(
        g.apply(B, view(B, 1, 1, C)),
        Err(TableRejected::NotOwner { owner: Some(A), .. })
    ));
    assert!(matches!(
        g.apply(A, view(B, 1, 1, C)),
        Err(TableRejected::NotOwner { .. })
    ));
    assert!(matches!(
        g.apply(A, view(A, 1, 1, B)),
        Err(TableRejected::WrongRow { .. })
    ));
    assert_eq!(g.apply(A, view(A, 1, 1, C)).unwrap().epoch, 1);
    assert!(matches!(
        g.apply(A, view(A, 1, 1, C)),
        Err(TableRejected::Stale { .. })
    ));
    g.apply(A, view(A, 1, 7, C)).unwrap();
    let applied = g.apply(B, view(B, 2, 1, C)).unwrap();
    assert_eq!((applied.previous_epoch, applied.epoch), (1, 2));
    // The old owner's later versions no longer count.
    assert!(matches!(
        g.apply(A, view(A, 1, 9, C)),
        Err(TableRejected::Stale { .. })
    ));
    assert_eq!(g.held(), (2, 1));
}

#[test]
fn candidates_take_over_in_order_once_the_owner_is_dead() {
    let listen = Duration::from_millis(300);
    let mut a = Candidacy::new(cfg(), A, ms(0), listen);
    let mut b = Candidacy::new(cfg(), B, ms(0), listen);
    let mut c = Candidacy::new(cfg(), C, ms(0), listen);
    // Nobody claims while listening; then A, the first candidate.
    assert_eq!(a.poll(ms(100)), None);
    assert_eq!(
        a.poll(ms(300)),
        Some(CandidacyAction::TakeOver { epoch: 1 })
    );
    assert_eq!(b.poll(ms(300)), None);
    b.handle_epoch(1);
    c.handle_epoch(1);
    assert_eq!(b.poll(ms(400)), None);
    assert_eq!(c.poll(ms(400)), None);
    // A dead: B goes on; C waits for B.
    b.handle_peer_dead(A);
    c.handle_peer_dead(A);
    assert_eq!(c.poll(ms(500)), None);
    assert_eq!(
        b.poll(ms(500)),
        Some(CandidacyAction::TakeOver { epoch: 2 })
    );
    c.handle_epoch(2);
    // B dead too: C, then A's restarted process would wait for C.
    c.handle_peer_dead(B);
    assert_eq!(
        c.poll(ms(600)),
        Some(CandidacyAction::TakeOver { epoch: 3 })
    );
    let mut a2 = Candidacy::new(cfg(), A, ms(600), listen);
    a2.handle_epoch(3);
    assert_eq!(a2.poll(ms(1000)), None);
    a2.handle_peer_dead(C);
    a2.handle_peer_dead(B);
    assert_eq!(
        a2.poll(ms(1000)),
        Some(CandidacyAction::TakeOver { epoch: 4 })
    );
}

#[test]
fn a_fenced_owner_listens_before_it_claims_again() {
    let listen = Duration::from_millis(300);
    let mut a = Candidacy::new(cfg(), A, ms(0), listen);
    assert_eq!(
        a.poll(ms(300)),
        Some(CandidacyAction::TakeOver { epoch: 1 })
    );
    // A froze past its t_valid: its server stopped, it is a new
    // incarnation. It does not claim the next epoch at once (the fence may
    // still be shut, and B may be taking over)...
    a.handle_fenced(ms(5000));
    assert_eq!(a.serving(), None);
    assert_eq!(a.poll(ms(5000)), None);
    assert_eq!(a.poll(ms(5299)), None);
    // ...and, having heard meanwhile that B took epoch 2 and B is alive,
    // never: B goes on.
    a.handle_epoch(2);
    assert_eq!(a.poll(ms(5300)), None);
    assert_eq!(a.poll(ms(9000)), None);
    // Had nobody taken over, it goes on after listening, one epoch up.
    let mut a = Candidacy::new(cfg(), A, ms(0), listen);
    assert!(a.poll(ms(300)).is_some());
    a.handle_fenced(ms(5000));
    assert_eq!(
        a.poll(ms(5300)),
        Some(CandidacyAction::TakeOver { epoch: 4 })
    );
}

#[test]
fn decoding_rejects_bad_input_with_typed_errors() {
    assert_eq!(decode(&[]), Err(RoleDecodeError::Truncated));
    assert_eq!(decode(&[9]), Err(RoleDecodeError::UnknownTag(9)));
    let mut buf = Vec::new();
    encode(
        &RoleMessage::Ack {
            epoch: 3,
            version: 4,
        },
        &mut buf,
    );
    buf.push(0);
    assert_eq!(decode(&buf), Err(RoleDecodeError::Trailing(1)));
    buf.truncate(buf.len() - 2);
    assert_eq!(decode(&buf), Err(RoleDecodeError::Truncated));
    // A count that promises more than is there allocates nothing.
    let mut t = vec![2u8];
    t.extend_from_slice(&[0; 32]);
    t.extend_from_slice(&u16::MAX.to_be_bytes());
    assert_eq!(decode(&t), Err(RoleDecodeError::Truncated));
    assert_eq!(
        decode(&vec![0; MAX_ROLE_MESSAGE + 1]),
        Err(RoleDecodeError::TooLarge(MAX_ROLE_MESSAGE + 1))
    );
}

fn status() -> impl Strategy<Value = PathStatus> {
    prop_oneof![
        Just(PathStatus::Up),
        Just(PathStatus::Suspect),
        Just(PathStatus::Down)
    ]
}

fn message() -> impl Strategy<Value = RoleMessage> {
    let report = (
        any::<u64>(),
        any::<u64>(),
        (any::<u32>(), any::<u64>(), any::<u64>()),
        prop::collection::vec(
            (
                any::<u64>(),
                any::<bool>(),
                prop::collection::vec((status(), any::<u32>()), 0..=MAX_NETWORKS),
            ),
            0..20,
        ),
    )
        .prop_map(|(r, seq, (watched, he, hv), peers)| {
            RoleMessage::Report(StatusReport {
                reporter: NodeId(r),
                seq,
                watched,
                held: (he, hv),
                peers: peers
                    .into_iter()
                    .map(|(p, alive, networks)| PeerReport {
                        peer: NodeId(p),
                        alive,
                        networks,
                    })
                    .collect(),
            })
        });
    let table = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::btree_map(
            any::<u64>(),
            prop::collection::vec((any::<u8>(), status(), any::<u8>()), 0..=MAX_NETWORKS),
            0..20,
        ),
        prop::collection::vec((any::<u64>(), 0u8..3), 0..20),
    );
    let addr = (any::<bool>(), any::<[u8; 16]>(), any::<u16>()).prop_map(|(v4, ip, port)| {
        if v4 {
            SocketAddr::from(([ip[0], ip[1], ip[2], ip[3]], port))
        } else {
            SocketAddr::from((ip, port))
        }
    });
    let helpers = prop::collection::btree_map(any::<u64>(), (addr.clone(), 0..=MAX_LEVEL), 0..5);
    let helper_report =
        (any::<u64>(), any::<u64>(), addr, 0..=MAX_LEVEL).prop_map(|(h, seq, addr, level)| {
            RoleMessage::HelperReport(HelperReport {
                helper: NodeId(h),
                seq,
                addr,
                level,
            })
        });
    // Whole rows, and rows without their ring; with helpers or not.
    let table = (table, any::<bool>(), helpers).prop_map(
        |((role, epoch, version, node, routes, ring), same, helpers)| {
            let view = TableView {
                role: NodeId(role),
                epoch,
                version,
                node: NodeId(node),
                routes: routes
                    .into_iter()
                    .map(|(to, paths)| Route {
                        from: NodeId(node),
                        to: NodeId(to),
                        paths: paths
                            .into_iter()
                            .map(|(network, status, weight)| PathChoice {
                                network,
                                status,
                                weight,
                            })
                            .collect(),
                    })
                    .collect(),
                ring: ring
                    .into_iter()
                    .map(|(n, s)| RingMember {
                        node: NodeId(n),
                        state: MemberState::from_u8(s).unwrap_or(MemberState::Up),
                    })
                    .collect(),
                helpers: helpers
                    .into_iter()
                    .map(|(n, (addr, level))| HelperEntry {
                        node: NodeId(n),
                        addr,
                        level,
                    })
                    .collect(),
            };
            if same {
                // The ring as changes (its members), against an arbitrary base.
                let ring = RingDelta {
                    base: version ^ epoch,
                    digest: ring_digest(&view.ring),
                    changes: view.ring,
                };
                RoleMessage::TableRingDelta {
                    view: TableView {
                        ring: Vec::new(),
                        ..view
                    },
                    ring,
                }
            } else {
                RoleMessage::Table(view)
            }
        },
    );
    let ack = (any::<u64>(), any::<u64>())
        .prop_map(|(epoch, version)| RoleMessage::Ack { epoch, version });
    prop_oneof![report, table, ack, helper_report]
}

proptest! {
    #[test]
    fn every_message_round_trips(msg in message()) {
        let mut buf = Vec::new();
        encode(&msg, &mut buf);
        prop_assert_eq!(decode(&buf), Ok(msg));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode(&bytes);
    }
}

#[test]
fn elected_ownership_lets_any_candidate_own_any_epoch_but_only_upwards() {
    let cfg = RoleConfig {
        nodes: vec![NodeId(1), NodeId(2), NodeId(3)],
        candidates: vec![NodeId(1), NodeId(2)],
        ownership: Ownership::Elected,
        ..RoleConfig::default()
    };
    // Epoch 7 would be node 1's by order; elected, node 2 may serve it.
    assert!(cfg.may_own(NodeId(2), 7));
    assert!(!cfg.may_own(NodeId(3), 7), "not a candidate");
    assert!(!cfg.may_own(NodeId(2), 0));
    let s = RoleServer::new(cfg.clone(), NodeId(2), 7, Time::ZERO);
    assert!(s.is_ok());
    assert!(RoleServer::new(cfg.clone(), NodeId(3), 7, Time::ZERO).is_err());
    let mut gate = TableGate::new(cfg, NodeId(3));
    let row = |role: u64, epoch, version| TableView {
        role: NodeId(role),
        epoch,
        version,
        node: NodeId(3),
        routes: Vec::new(),
        ring: Vec::new(),
        helpers: Vec::new(),
    };
    assert!(gate.apply(NodeId(2), row(2, 7, 1)).is_ok());
    // An older election's leader: refused, whoever it is.
    assert!(matches!(
        gate.apply(NodeId(1), row(1, 5, 9)),
        Err(TableRejected::Stale { .. })
    ));
    // A row naming another server than its sender: refused.
    assert!(matches!(
        gate.apply(NodeId(1), row(2, 9, 1)),
        Err(TableRejected::NotOwner { .. })
    ));
    assert!(gate.apply(NodeId(1), row(1, 9, 1)).is_ok());
    assert_eq!(gate.held(), (9, 1));
}

/// Rows carry their ring as changes to the ring the node acknowledged:
/// whole until the node's ack shows a ring the server still knows; none
/// when the ring did not change, the changed members when it did; whole
/// again when the node restarts; never with `send_rows_whole`.
#[test]
fn rows_carry_their_ring_as_changes_to_the_acknowledged_one() {
    let mut s = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    drain(&mut s, ms(0), ms(10_000));
    // Everyone reports: every member up (the first ring B acknowledges).
    for n in [A, B, C] {
        s.handle_report(ms(1), n, &report(n, 1, Vec::new()))
            .unwrap();
    }
    let v2 = drain(&mut s, ms(1), ms(10_000));
    assert!(v2
        .iter()
        .all(|p| p.ring_delta.is_none() && p.view.ring.len() == 3 && p.view.version == 2));
    let to = |v: &[Push], n: NodeId| v.iter().find(|p| p.to == n).cloned().unwrap();
    let mut gate = TableGate::new(cfg(), B);
    gate.apply(A, to(&v2, B).view).unwrap();
    s.handle_ack(B, 1, 2);
    let ring2 = v2[0].view.ring.clone();

    // A route change, the ring unchanged: B gets no ring changes, C (no
    // ack yet) the whole row.
    s.handle_report(
        ms(10),
        B,
        &report(B, 2, vec![peer(C, PathStatus::Down, PathStatus::Up)]),
    )
    .unwrap();
    let v3 = drain(&mut s, ms(10), ms(10_000));
    let b3 = to(&v3, B);
    assert_eq!(b3.view.version, 3);
    assert!(b3.view.ring.is_empty());
    let d = b3.ring_delta.clone().expect("B holds the ring");
    assert!(d.changes.is_empty());
    assert_eq!(
        (d.base, d.digest),
        (ring_digest(&ring2), ring_digest(&ring2))
    );
    assert!(to(&v3, C).ring_delta.is_none());
    // On the wire: fewer bytes; B's gate fills in the ring it holds.
    let mut whole = Vec::new();
    encode(&RoleMessage::Table(to(&v3, C).view), &mut whole);
    let msg = b3.into_message();
    let mut bytes = Vec::new();
    encode(&msg, &mut bytes);
    assert!(
        bytes.len() < whole.len(),
        "{} vs {}",
        bytes.len(),
        whole.len()
    );
    assert_eq!(decode(&bytes), Ok(msg.clone()));
    let RoleMessage::TableRingDelta { view, ring } = msg else {
        panic!("not a ring delta: {msg:?}");
    };
    assert_eq!(gate.apply_ring_delta(A, view, &ring).unwrap().version, 3);
    assert_eq!(gate.current().unwrap().ring, ring2);
    assert!(!gate.current().unwrap().usable(C, 0));
    s.handle_ack(B, 1, 3);

    // The ring changes (A and B report C dead): B, which acknowledged the
    // old ring, gets C's new state only; C (never acknowledged) gets it whole.
    let dead = PeerReport {
        peer: C,
        alive: false,
        networks: vec![(PathStatus::Down, 0), (PathStatus::Down, 0)],
    };
    s.handle_report(ms(20), A, &report(A, 2, vec![dead.clone()]))
        .unwrap();
    s.handle_report(ms(20), B, &report(B, 3, vec![dead]))
        .unwrap();
    let v4 = drain(&mut s, ms(20), ms(10_000));
    let b4 = to(&v4, B);
    let d = b4.ring_delta.clone().expect("changes to the ring B holds");
    assert_eq!(
        d.changes,
        vec![RingMember {
            node: C,
            state: MemberState::Down
        }]
    );
    let RoleMessage::TableRingDelta { view, ring } = b4.into_message() else {
        panic!("not a ring delta");
    };
    gate.apply_ring_delta(A, view, &ring).unwrap();
    assert_eq!(gate.current().unwrap().ring, to(&v4, C).view.ring);
    assert_eq!(gate.current().unwrap().member(C), Some(MemberState::Down));
    assert!(to(&v4, C).ring_delta.is_none());

    // A restarted node holds nothing: whole again.
    s.handle_ack(B, 1, 4);
    s.handle_node_restarted(B);
    let after = drain(&mut s, ms(30), ms(10_000));
    assert!(to(&after, B).ring_delta.is_none());

    // A server whose rows stay in a store sends every row whole.
    let mut w = RoleServer::new(cfg(), A, 1, ms(0)).unwrap();
    w.send_rows_whole();
    drain(&mut w, ms(0), ms(10_000));
    w.handle_ack(B, 1, 1);
    w.handle_report(
        ms(10),
        B,
        &report(B, 1, vec![peer(C, PathStatus::Down, PathStatus::Up)]),
    )
    .unwrap();
    assert!(drain(&mut w, ms(10), ms(10_000))
        .iter()
        .all(|p| p.ring_delta.is_none() && p.view.ring.len() == 3));
}

/// Ring changes are applied only to the very ring they name, and only if
/// they make the ring they name.
#[test]
fn ring_changes_need_their_base_ring() {
    let ring = |s: MemberState| {
        vec![
            RingMember {
                node: A,
                state: MemberState::Up,
            },
            RingMember { node: B, state: s },
        ]
    };
    let up = ring(MemberState::Up);
    let down = ring(MemberState::Down);
    let to_down = RingDelta::between(&up, &down).unwrap();
    assert_eq!(to_down.changes, vec![down[1]]);
    assert_eq!(to_down.apply_to(&up), Some(down.clone()));
    assert_eq!(to_down.apply_to(&down), None, "not its base");
    assert_eq!(RingDelta::between(&up, &up[..1]), None, "other members");
    let mut gate = TableGate::new(cfg(), C);
    // Nothing held.
    assert_eq!(
        gate.apply_ring_delta(A, view(A, 1, 2, C), &to_down),
        Err(TableRejected::RingNotHeld {
            epoch: 1,
            version: 2
        })
    );
    // Another ring held: refused, nothing changes.
    let mut first = view(A, 1, 1, C);
    first.ring = ring(MemberState::Suspect);
    gate.apply(A, first).unwrap();
    assert!(matches!(
        gate.apply_ring_delta(A, view(A, 1, 2, C), &to_down),
        Err(TableRejected::RingNotHeld { .. })
    ));
    assert_eq!(gate.held(), (1, 1));
    let mut second = view(A, 1, 2, C);
    second.ring = up.clone();
    gate.apply(A, second).unwrap();
    // Changes that do not make the ring they name (a bad or hostile
    // server), or name a node not in the ring: refused.
    let lying = RingDelta {
        digest: ring_digest(&up),
        ..to_down.clone()
    };
    assert!(matches!(
        gate.apply_ring_delta(A, view(A, 1, 3, C), &lying),
        Err(TableRejected::RingNotHeld { .. })
    ));
    let stranger = RingDelta {
        changes: vec![RingMember {
            node: NodeId(9),
            state: MemberState::Down,
        }],
        ..to_down.clone()
    };
    assert!(matches!(
        gate.apply_ring_delta(A, view(A, 1, 3, C), &stranger),
        Err(TableRejected::RingNotHeld { .. })
    ));
    // The right base: applied; the usual rules still hold.
    gate.apply_ring_delta(A, view(A, 1, 3, C), &to_down)
        .unwrap();
    assert_eq!(gate.current().unwrap().ring, down);
    // Changes against a ring held a version ago (the server had not seen
    // the newer acknowledgement yet): still applied, to that ring.
    let suspect = ring(MemberState::Suspect);
    let from_up = RingDelta::between(&up, &suspect).unwrap();
    gate.apply_ring_delta(A, view(A, 1, 4, C), &from_up)
        .unwrap();
    assert_eq!(gate.current().unwrap().ring, suspect);
    let back = RingDelta::between(&suspect, &down).unwrap();
    gate.apply_ring_delta(A, view(A, 1, 5, C), &back).unwrap();
    assert_eq!(gate.current().unwrap().ring, down);
    let same = RingDelta::between(&down, &down).unwrap();
    assert!(matches!(
        gate.apply_ring_delta(A, view(A, 1, 5, C), &same),
        Err(TableRejected::Stale { .. })
    ));
    assert!(matches!(
        gate.apply_ring_delta(B, view(B, 1, 6, C), &same),
        Err(TableRejected::NotOwner { .. })
    ));
    // Digests differ with any member's state or id.
    assert_ne!(ring_digest(&up), ring_digest(&down));
    assert_ne!(ring_digest(&up), ring_digest(&up[..1]));
}
