//! The monitor's tests of the stray, members' and private queues:
//! drops and backlogs that hold a report back, forged floods.

use super::*;

/// Drives `m` from `from` to `to` ms under a junk flood of the strays'
/// queue (its drop counter grows every millisecond), answering every
/// barrier with the strays' queue as `strays_empty` says; returns when the
/// peer was reported dead.
fn flood(m: &mut Monitor, from: u64, to: u64, strays_empty: bool) -> Option<u64> {
    let mut dead_at = None;
    for t in from..=to {
        let stray_drops = 1000 + t;
        m.handle_stray_drop_count(ms(t), stray_drops);
        m.handle_timeout(ms(t));
        for a in actions(m) {
            match a {
                MonitorAction::SendBarrier { token } => m.handle_barrier_steered(
                    ms(t),
                    token,
                    100,
                    StraysAtBarrier {
                        drops: stray_drops,
                        empty: strays_empty,
                    },
                ),
                MonitorAction::Report(PathReport::PeerDown { .. }) => {
                    dead_at.get_or_insert(t);
                }
                _ => {}
            }
        }
    }
    dead_at
}

/// The flood's drops are in the strays' queue; the dead peer's heartbeats
/// came out of the members' queue: it is reported as soon as without the
/// flood (the window, then the next check), not held back.
#[test]
fn stray_drops_do_not_hold_back_a_sorted_dead_peer() {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_stray_drop_count(ms(0), 1000);
    m.handle_heartbeat_from(ms(0), w(0), Epoch(1), HeartbeatQueue::Members);
    let t = flood(&mut m, 1, 400, false).expect("reported dead under the flood");
    assert!(
        (151..=160).contains(&t),
        "window 150 ms, checks every 5 ms: {t}"
    );
    assert!(m.stats().reported_through_stray_drops >= 1);
    assert_eq!(m.stats().saved_by_stray, 0);
}

/// A live peer whose heartbeats reach the strays' queue (its address not
/// steered yet) and are dropped there by the flood is never reported: the
/// stray drops count against it as any drop did before.
#[test]
fn a_live_peer_whose_heartbeats_drop_in_the_strays_queue_is_never_reported() {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_stray_drop_count(ms(0), 1000);
    m.handle_heartbeat_from(ms(0), w(0), Epoch(1), HeartbeatQueue::Strays);
    // Every later heartbeat is among the strays' drops.
    assert_eq!(flood(&mut m, 1, 2000, true), None);
    assert_eq!(m.is_down(w(0)), Some(false));
    assert!(m.stats().saved_by_stray > 0);
    assert_eq!(m.stats().reported_dead + m.stats().reported_down, 0);
}

/// A path watched through its traffic before any heartbeat is unsorted
/// too: where its heartbeats go is not known.
#[test]
fn a_path_known_only_from_traffic_is_held_by_stray_drops() {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_stray_drop_count(ms(0), 1000);
    m.handle_heard(ms(0), w(0));
    assert_eq!(flood(&mut m, 1, 1000, true), None);
}

/// Unsorted and no stray drop, but something waits in the strays' queue
/// (the barrier does not go through it): no report until it is seen empty.
#[test]
fn an_unsorted_suspect_waits_for_an_empty_strays_queue() {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_stray_drop_count(ms(0), 1000);
    m.handle_heartbeat_from(ms(0), w(0), Epoch(1), HeartbeatQueue::Strays);
    let strays = |empty| StraysAtBarrier { drops: 1000, empty };
    let token = barrier_token(&tick(&mut m, 1, 55));
    m.handle_barrier_steered(ms(55), token, 100, strays(false));
    assert_eq!(downs(&actions(&mut m)), 0);
    assert_eq!(m.stats().saved_by_stray, 1);
    let token = barrier_token(&tick(&mut m, 56, 60));
    m.handle_barrier_steered(ms(60), token, 100, strays(true));
    assert_eq!(
        downs(&actions(&mut m)),
        1,
        "reported once the queue is empty"
    );
}

/// A sorted path that then gets a heartbeat out of the strays' queue (its
/// source moved) is unsorted again; one out of the members' queue sorts
/// it back. A peer is sorted only if all its paths are.
#[test]
fn the_latest_heartbeat_decides_which_queue_a_path_is_in() {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_stray_drop_count(ms(0), 1000);
    m.handle_heartbeat_from(ms(0), w(0), Epoch(1), HeartbeatQueue::Members);
    m.handle_heartbeat_from(ms(0), w(1), Epoch(1), HeartbeatQueue::Members);
    m.handle_heartbeat_from(ms(1), w(1), Epoch(1), HeartbeatQueue::Strays);
    assert_eq!(flood(&mut m, 2, 600, true), None, "network 1 is unsorted");
    m.handle_heartbeat_from(ms(601), w(0), Epoch(1), HeartbeatQueue::Members);
    m.handle_heartbeat_from(ms(601), w(1), Epoch(1), HeartbeatQueue::Members);
    let t = flood(&mut m, 602, 1200, true).expect("both sorted: reported");
    assert!((752..=762).contains(&t), "{t}");
}

/// Drops in the members' queue still hold back every report, sorted or
/// not: the attribution only ever removes the strays' drops.
#[test]
fn members_queue_drops_still_hold_back_a_sorted_suspect() {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_heartbeat_from(ms(0), w(0), Epoch(1), HeartbeatQueue::Members);
    let token = barrier_token(&tick(&mut m, 1, 55));
    let strays = StraysAtBarrier {
        drops: 0,
        empty: true,
    };
    m.handle_barrier_steered(ms(55), token, 101, strays);
    assert_eq!(downs(&actions(&mut m)), 0);
    assert_eq!(m.stats().saved_by_drop, 1);
}

/// Drives `m` from `from` to `to` ms under a flood forging a member's
/// address: the members' queue drops every millisecond (and is never seen
/// empty); barriers come out of the private barrier socket. `private` says
/// each private queue's state at every round's end (`drops` grows with
/// `t` when `dropping`). Returns when the peer was reported dead.
fn forged_flood(
    m: &mut Monitor,
    from: u64,
    to: u64,
    private: &[(Watch, bool, bool)],
) -> Option<u64> {
    let mut dead_at = None;
    for t in from..=to {
        m.handle_drop_count(ms(t), 100 + t);
        m.handle_timeout(ms(t));
        for a in actions(m) {
            match a {
                MonitorAction::SendBarrier { token } => {
                    let q = QueuesAtBarrier {
                        drops: 100 + t,
                        system_drops: 7,
                        members_empty: false,
                        strays: Some(QueueAtBarrier {
                            drops: 1000 + t,
                            empty: false,
                        }),
                        private: private
                            .iter()
                            .map(|&(w, dropping, empty)| {
                                let drops = if dropping { t } else { 0 };
                                (w, QueueAtBarrier { drops, empty })
                            })
                            .collect(),
                        unread_streams: Vec::new(),
                    };
                    m.handle_barrier_queues(ms(t), token, &q);
                }
                MonitorAction::Report(PathReport::PeerDown { .. }) => {
                    dead_at.get_or_insert(t);
                }
                _ => {}
            }
        }
    }
    dead_at
}

fn private_peer() -> Monitor {
    let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_system_drop_count(ms(0), 7);
    m.handle_stray_drop_count(ms(0), 1000);
    m.handle_private_drop_count(ms(0), w(0), 0);
    m.handle_private_drop_count(ms(0), w(1), 0);
    m.handle_heartbeat_from(ms(0), w(0), Epoch(1), HeartbeatQueue::Private);
    m.handle_heartbeat_from(ms(0), w(1), Epoch(1), HeartbeatQueue::Private);
    m
}

/// A dead peer whose heartbeats came out of its private queues is reported
/// as soon as without a flood, although junk forging its (or any member's)
/// address overflows the members' and strays' queues the whole time.
#[test]
fn a_forged_flood_does_not_hold_back_a_private_dead_peer() {
    let mut m = private_peer();
    let clear = [(w(0), false, true), (w(1), false, true)];
    let t = forged_flood(&mut m, 1, 400, &clear).expect("reported under the flood");
    assert!((151..=160).contains(&t), "window 150 ms: {t}");
    assert!(m.stats().reported_through_member_drops >= 1);
}

/// A drop in a private queue, or a private queue not yet read empty,
/// holds the peer back: a live peer's heartbeat may be among them.
#[test]
fn a_private_queues_own_drops_or_backlog_hold_back_its_peer() {
    let mut m = private_peer();
    let dropping = [(w(0), false, true), (w(1), true, true)];
    assert_eq!(forged_flood(&mut m, 1, 600, &dropping), None);
    assert!(m.stats().saved_by_private > 0);
    let mut m = private_peer();
    let waiting = [(w(0), false, false), (w(1), false, true)];
    assert_eq!(forged_flood(&mut m, 1, 600, &waiting), None);
    // Drops before the window began no longer count.
    let mut m = private_peer();
    m.private_drops.insert(w(1), (0, Some(ms(1))));
    let t = forged_flood(&mut m, 2, 600, &[(w(0), false, true), (w(1), false, true)]);
    assert!(t.is_some_and(|t| t <= 160), "{t:?}");
}

/// Drops at the interfaces or backlogs reach every queue: they hold back
/// a private suspect too.
#[test]
fn system_drops_hold_back_a_private_suspect() {
    let mut m = private_peer();
    let token = barrier_token(&tick(&mut m, 1, 155));
    let q = QueuesAtBarrier {
        drops: 100,
        system_drops: 8,
        members_empty: true,
        strays: None,
        private: vec![
            (
                w(0),
                QueueAtBarrier {
                    drops: 0,
                    empty: true,
                },
            ),
            (
                w(1),
                QueueAtBarrier {
                    drops: 0,
                    empty: true,
                },
            ),
        ],
        unread_streams: Vec::new(),
    };
    m.handle_barrier_queues(ms(155), token, &q);
    assert!(!m.is_dead(A));
    assert!(m.stats().saved_by_drop >= 1);
}

/// A peer with one path private and one not is held back by the members'
/// queue for the other; a new epoch, or a replaced private socket, makes
/// a path public again (the new incarnation does not know the port).
#[test]
fn a_path_is_private_for_its_epoch_until_its_socket_is_replaced() {
    let mut m = private_peer();
    // Network 1's heartbeat from the members' queue (a public copy) keeps
    // it private for the epoch.
    m.handle_heartbeat_from(ms(1), w(1), Epoch(1), HeartbeatQueue::Members);
    let clear = [(w(0), false, true), (w(1), false, true)];
    assert!(forged_flood(&mut m, 2, 400, &clear).is_some());

    let mut m = private_peer();
    m.handle_heartbeat_from(ms(1), w(1), Epoch(2), HeartbeatQueue::Members);
    assert_eq!(
        forged_flood(&mut m, 2, 600, &clear),
        None,
        "new epoch: public"
    );

    let mut m = private_peer();
    m.handle_private_reset(w(0));
    assert_eq!(
        forged_flood(&mut m, 1, 600, &clear),
        None,
        "socket replaced"
    );
    // Out of the new private queue: private again.
    m.handle_heartbeat_from(ms(601), w(0), Epoch(1), HeartbeatQueue::Private);
    m.handle_heartbeat_from(ms(601), w(1), Epoch(1), HeartbeatQueue::Private);
    let t = forged_flood(&mut m, 602, 1200, &clear).expect("private again");
    assert!((752..=762).contains(&t), "{t}");
}

/// A heartbeat whose sender counted its public copy (its private copies
/// are no longer acknowledged) makes the path public: the members' queue
/// holds it back again. An uncommitted heartbeat of an older epoch than
/// the path's changes nothing.
#[test]
fn a_path_whose_sender_stopped_committing_is_public_again() {
    let clear = [(w(0), false, true), (w(1), false, true)];
    let mut m = private_peer();
    m.handle_private_uncommitted(w(1), Epoch(1));
    assert_eq!(forged_flood(&mut m, 1, 600, &clear), None, "uncommitted");
    // A committed one out of the private queue: private again.
    m.handle_heartbeat_from(ms(601), w(0), Epoch(1), HeartbeatQueue::Private);
    m.handle_heartbeat_from(ms(601), w(1), Epoch(1), HeartbeatQueue::Private);
    assert!(forged_flood(&mut m, 602, 1200, &clear).is_some());

    let mut m = private_peer();
    m.handle_private_uncommitted(w(1), Epoch(0));
    assert!(
        forged_flood(&mut m, 1, 400, &clear).is_some(),
        "an old epoch's word does not count"
    );
}
