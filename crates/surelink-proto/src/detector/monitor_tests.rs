use std::time::Duration;

use super::*;

const A: NodeId = NodeId(7);

fn cfg(mode: DetectorMode) -> DetectorConfig {
    let mut c = DetectorConfig::with_interval(Duration::from_millis(10));
    c.mode = mode;
    c
}

fn ms(m: u64) -> Time {
    Time::from_millis(m)
}

fn w(network: u16) -> Watch {
    Watch { peer: A, network }
}

/// The monitor's actions but its probes (`probes` tests those).
fn actions(m: &mut Monitor) -> Vec<MonitorAction> {
    std::iter::from_fn(|| m.poll_action())
        .filter(|a| !matches!(a, MonitorAction::ProbeNetwork { .. }))
        .collect()
}

/// Every action, probes included.
fn all_actions(m: &mut Monitor) -> Vec<MonitorAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// Runs checks every millisecond from `from` to `to` (inclusive).
fn tick(m: &mut Monitor, from: u64, to: u64) -> Vec<MonitorAction> {
    let mut out = Vec::new();
    for t in from..=to {
        m.handle_timeout(ms(t));
        out.extend(actions(m));
    }
    out
}

fn barrier_token(acts: &[MonitorAction]) -> u64 {
    let tokens: Vec<u64> = acts
        .iter()
        .filter_map(|a| match a {
            MonitorAction::SendBarrier { token } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens.len(), 1, "one barrier round: {acts:?}");
    tokens[0]
}

fn downs(acts: &[MonitorAction]) -> usize {
    acts.iter()
        .filter(|a| matches!(a, MonitorAction::Report(PathReport::PathDown { .. })))
        .count()
}

/// A monitor that heard path 0 at 0 ms and read the drop counters.
fn watching(mode: DetectorMode) -> Monitor {
    let mut m = Monitor::new(&cfg(mode), ms(0));
    m.handle_drop_count(ms(0), 100);
    m.handle_heartbeat(ms(0), w(0), Epoch(1));
    m
}

#[test]
fn heartbeats_in_time_mean_no_check_and_no_report() {
    let mut m = watching(DetectorMode::SafeTimer);
    for t in (10..500).step_by(10) {
        m.handle_heartbeat(ms(t), w(0), Epoch(1));
        assert!(tick(&mut m, t - 9, t).is_empty());
    }
    assert_eq!(m.stats().barrier_rounds, 0);
}

#[test]
fn silence_barrier_back_no_drop_reports_path_down() {
    let mut m = watching(DetectorMode::SafeTimer);
    // Window 50 ms: nothing to do until more than 50 ms passed.
    assert!(tick(&mut m, 1, 50).is_empty());
    let acts = tick(&mut m, 51, 55);
    let token = barrier_token(&acts);
    assert_eq!(downs(&acts), 0, "never before the barrier");
    m.handle_barrier(ms(55), token, 100);
    let acts = actions(&mut m);
    assert_eq!(
        acts,
        vec![MonitorAction::Report(PathReport::PathDown {
            watch: w(0),
            last_heard: ms(0),
            failover: false
        })]
    );
    assert_eq!(m.is_down(w(0)), Some(true));
    assert_eq!(m.stats().reported_down, 1);
    // The peer window (150 ms) has not passed: not dead yet.
    assert!(!m.is_dead(A));
}

#[test]
fn silence_for_the_peer_window_reports_the_peer_dead() {
    let mut m = watching(DetectorMode::SafeTimer);
    let mut dead_at = None;
    for t in 1..=300u64 {
        m.handle_timeout(ms(t));
        for a in actions(&mut m) {
            match a {
                MonitorAction::SendBarrier { token } => m.handle_barrier(ms(t), token, 100),
                MonitorAction::Report(PathReport::PeerDown { peer }) => {
                    assert_eq!(peer, A);
                    dead_at.get_or_insert(t);
                }
                _ => {}
            }
        }
    }
    let t = dead_at.expect("reported dead");
    assert!(
        (151..=160).contains(&t),
        "window 150 ms, checks every 5 ms: {t}"
    );
    assert_eq!(m.stats().reported_dead, 1, "reported once");
}

#[test]
fn barrier_lost_means_no_report_this_round_but_a_later_one() {
    let mut m = watching(DetectorMode::SafeTimer);
    let first = barrier_token(&tick(&mut m, 1, 55));
    // A drop is counted after the barrier left: it may have been the
    // barrier. Overdue (10 ms) at 65 ms: the round ends without a report.
    m.handle_drop_count(ms(57), 101);
    let acts = tick(&mut m, 56, 65);
    assert_eq!(downs(&acts), 0);
    assert_eq!(m.stats().barriers_lost, 1);
    // The drop may have carried the peer's notice that its pace dropped:
    // the path is watched with the idle window (100 ms) for a while, so
    // the next round starts when that ends.
    assert!(!acts
        .iter()
        .any(|a| matches!(a, MonitorAction::SendBarrier { .. })));
    // The lost barrier turning up late is ignored.
    m.handle_barrier(ms(66), first, 101);
    assert_eq!(downs(&actions(&mut m)), 0);
    let second = barrier_token(&tick(&mut m, 66, 101));
    assert_ne!(first, second);
    // The new round's barrier comes back, but the drop at 57 ms is inside
    // the window: still no report.
    m.handle_barrier(ms(102), second, 101);
    assert_eq!(downs(&actions(&mut m)), 0);
    assert_eq!(m.stats().saved_by_drop, 1);
}

#[test]
fn a_slow_barrier_is_waited_for_not_repeated() {
    // The reader is stalled: the barrier is overdue but nothing was
    // dropped. Sending more would only fill the stalled queue.
    let mut m = watching(DetectorMode::SafeTimer);
    let first = barrier_token(&tick(&mut m, 1, 55));
    let acts = tick(&mut m, 56, 200);
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, MonitorAction::SendBarrier { .. })),
        "no second barrier while the first may still come: {acts:?}"
    );
    assert_eq!(downs(&acts), 0);
    // Given up after a peer window (150 ms): a new round at 205 ms.
    let acts = tick(&mut m, 201, 210);
    assert_eq!(m.stats().barriers_lost, 1);
    let second = barrier_token(&acts);
    assert_ne!(first, second);
    // The first barrier, finally out, is ignored; the second reports.
    m.handle_barrier(ms(211), first, 100);
    assert_eq!(downs(&actions(&mut m)), 0);
    m.handle_barrier(ms(212), second, 100);
    assert_eq!(downs(&actions(&mut m)), 1);
}

#[test]
fn heartbeat_waiting_in_our_pipeline_cancels_the_report() {
    // The detector (or the reader) was paused for 2 s: the heartbeats sat in
    // the socket queue; the barrier comes out behind them.
    let mut m = watching(DetectorMode::SafeTimer);
    let token = barrier_token(&tick(&mut m, 2000, 2000));
    m.handle_heartbeat(ms(2000), w(0), Epoch(1));
    m.handle_barrier(ms(2000), token, 100);
    assert_eq!(downs(&actions(&mut m)), 0);
    // Both the path and the peer were suspected; both saved.
    assert_eq!(m.stats().saved_by_barrier, 2);
    assert!(!m.is_dead(A));
    assert_eq!(m.is_down(w(0)), Some(false));
}

#[test]
fn drop_since_window_start_means_no_report() {
    let mut m = watching(DetectorMode::SafeTimer);
    let token = barrier_token(&tick(&mut m, 1, 55));
    // The socket overflowed: the counters grew.
    m.handle_barrier(ms(55), token, 103);
    assert_eq!(downs(&actions(&mut m)), 0);
    assert_eq!(m.stats().saved_by_drop, 1);
    // Still silent, no new drops, but the drop (t_drop = 50 ms) is inside
    // every window starting before it: no report until a window starts
    // after it.
    let mut reported_at = None;
    for t in 56..=200u64 {
        m.handle_timeout(ms(t));
        for a in actions(&mut m) {
            if let MonitorAction::SendBarrier { token } = a {
                m.handle_barrier(ms(t), token, 103);
            }
        }
        if m.is_down(w(0)) == Some(true) {
            reported_at = Some(t);
            break;
        }
    }
    let t = reported_at.expect("reported once the window is clear of drops");
    assert!(
        t > 105,
        "window [t-50, t] must start after the drop at 55 ms: {t}"
    );
}

#[test]
fn drop_before_window_start_does_not_prevent_a_report() {
    let mut m = watching(DetectorMode::SafeTimer);
    m.handle_drop_count(ms(1), 105); // t_drop = 1 ms
    m.handle_heartbeat(ms(5), w(0), Epoch(1));
    // Within the idle window of the drop, a busy path is watched with the
    // idle window (the drop may have been its notice): no round at 55 ms.
    let acts = tick(&mut m, 6, 104);
    assert!(acts.is_empty(), "{acts:?}");
    let token = barrier_token(&tick(&mut m, 105, 106));
    m.handle_barrier(ms(106), token, 105);
    assert_eq!(downs(&actions(&mut m)), 1);
}

#[test]
fn plain_mode_reports_at_the_timeout_without_checks() {
    let mut m = watching(DetectorMode::Plain);
    assert_eq!(downs(&tick(&mut m, 1, 50)), 0);
    let acts = tick(&mut m, 51, 55);
    assert_eq!(downs(&acts), 1);
    assert!(!acts
        .iter()
        .any(|a| matches!(a, MonitorAction::SendBarrier { .. })));
}

#[test]
fn heard_again_brings_path_and_peer_up() {
    let mut m = watching(DetectorMode::Plain);
    tick(&mut m, 1, 60);
    m.handle_heartbeat(ms(80), w(0), Epoch(1));
    assert_eq!(
        actions(&mut m),
        vec![MonitorAction::Report(PathReport::PathUp { watch: w(0) })]
    );
    assert_eq!(m.is_down(w(0)), Some(false));
    // Dead, then heard: path and peer come back.
    let acts = tick(&mut m, 81, 300);
    assert!(acts.contains(&MonitorAction::Report(PathReport::PeerDown { peer: A })));
    m.handle_heartbeat(ms(301), w(0), Epoch(1));
    assert_eq!(
        actions(&mut m),
        vec![
            MonitorAction::Report(PathReport::PathUp { watch: w(0) }),
            MonitorAction::Report(PathReport::PeerUp { peer: A }),
        ]
    );
}

#[test]
fn peer_is_down_only_when_every_path_is() {
    let mut m = watching(DetectorMode::Plain);
    m.handle_heartbeat(ms(0), w(1), Epoch(1));
    // Path 1 keeps talking (data counts), path 0 goes silent.
    for t in 1..=200u64 {
        m.handle_heard(ms(t), w(1));
        m.handle_timeout(ms(t));
    }
    let acts = actions(&mut m);
    assert_eq!(downs(&acts), 1);
    assert!(!acts
        .iter()
        .any(|a| matches!(a, MonitorAction::Report(PathReport::PeerDown { .. }))));
    // Now path 1 too: dead once both were silent for the peer window.
    let acts = tick(&mut m, 201, 349);
    assert_eq!(downs(&acts), 1);
    assert!(!m.is_dead(A));
    let acts = tick(&mut m, 350, 360);
    assert!(acts
        .iter()
        .any(|a| matches!(a, MonitorAction::Report(PathReport::PeerDown { peer: A }))));
    // One path back: the peer is up, the other path still down.
    m.handle_heartbeat(ms(361), w(1), Epoch(1));
    let acts = actions(&mut m);
    assert!(acts.contains(&MonitorAction::Report(PathReport::PeerUp { peer: A })));
    assert_eq!(m.is_down(w(0)), Some(true));
}

#[test]
fn traffic_starts_watching_a_path_and_old_epochs_are_ignored() {
    let mut m = watching(DetectorMode::Plain);
    assert_eq!(m.is_down(w(3)), None);
    // A peer heard only through its handshake, then silent: still reported.
    m.handle_heard(ms(1), w(3));
    assert_eq!(m.is_down(w(3)), Some(false));
    m.handle_heartbeat(ms(2), w(0), Epoch(2));
    // A heartbeat of the earlier incarnation does not keep the path alive.
    for t in 3..=60u64 {
        m.handle_heartbeat(ms(t), w(0), Epoch(1));
        m.handle_timeout(ms(t));
    }
    assert_eq!(m.is_down(w(0)), Some(true));
    // Its heartbeats (at the busy pace) did not come on network 3.
    assert_eq!(m.is_down(w(3)), Some(true));
}

#[test]
fn one_round_at_a_time_and_checks_do_not_pile_up() {
    let mut m = watching(DetectorMode::SafeTimer);
    m.handle_heartbeat(ms(0), w(1), Epoch(1));
    // Both paths suspected in one round.
    let acts = tick(&mut m, 1, 55);
    barrier_token(&acts);
    // The detector sleeps 2 s, then catches up with one check.
    m.handle_timeout(ms(2055));
    let acts = actions(&mut m);
    assert!(acts.len() <= 1, "{acts:?}");
    assert!(m.poll_timeout() > ms(2055));
}

#[test]
fn old_stamps_do_not_bring_a_reported_path_or_peer_back() {
    // The shell folds traffic stamps in at every check; a stamp from before
    // the report must not flip the path (or the peer) back up.
    let mut m = watching(DetectorMode::Plain);
    m.handle_heard(ms(3), w(0));
    let acts = tick(&mut m, 1, 300);
    assert!(acts.contains(&MonitorAction::Report(PathReport::PeerDown { peer: A })));
    for t in 301..=400u64 {
        m.handle_heard(ms(3), w(0)); // the same old stamp, again and again
        m.handle_timeout(ms(t));
    }
    assert!(actions(&mut m).is_empty(), "no flapping on an old stamp");
    assert!(m.is_dead(A));
    // Real news brings it back.
    m.handle_heard(ms(401), w(0));
    assert!(!m.is_dead(A));
}

#[test]
fn a_heartbeat_on_a_new_network_revives_a_dead_peer() {
    let mut m = watching(DetectorMode::Plain);
    tick(&mut m, 1, 300);
    assert!(m.is_dead(A));
    m.handle_heartbeat(ms(301), w(1), Epoch(1));
    assert!(actions(&mut m).contains(&MonitorAction::Report(PathReport::PeerUp { peer: A })));
}

#[test]
fn a_slow_barrier_does_not_make_the_checker_spin() {
    let mut m = watching(DetectorMode::SafeTimer);
    barrier_token(&tick(&mut m, 1, 55));
    for t in 56..=300u64 {
        m.handle_timeout(ms(t));
        actions(&mut m);
        assert!(
            m.poll_timeout() > ms(t),
            "at {t} ms the next wake-up is in the past"
        );
    }
}

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

/// A path at the idle pace is watched with `idle_path_timeout` (100 ms
/// here), one whose peer said FAST with `path_timeout` (50 ms); a peer's
/// "dead" window is the same for both.
#[test]
fn the_window_follows_the_pace_the_peer_announced() {
    let mut m = watching(DetectorMode::Plain);
    m.handle_heartbeat_paced(ms(0), w(0), Epoch(1), HeartbeatQueue::Members, false);
    let acts = tick(&mut m, 1, 99);
    assert!(acts.is_empty(), "{acts:?}");
    let acts = tick(&mut m, 100, 101);
    assert!(acts.contains(&MonitorAction::Report(PathReport::PathDown {
        watch: w(0),
        last_heard: ms(0),
        failover: false
    })));
    // Fast again: the short window.
    m.handle_heartbeat_paced(ms(200), w(0), Epoch(1), HeartbeatQueue::Members, true);
    let acts = tick(&mut m, 200, 249);
    assert_eq!(
        acts,
        vec![MonitorAction::Report(PathReport::PathUp { watch: w(0) })]
    );
    let acts = tick(&mut m, 250, 251);
    assert_eq!(acts.len(), 1, "{acts:?}");
}

/// A `FAST` heartbeat overtaken by the newer notice that the pair went
/// quiet leaves the idle window; the same arrivals without their order
/// would narrow it (and report a path that only carries the idle pace).
#[test]
fn an_overtaken_fast_heartbeat_does_not_narrow_the_window() {
    let run = |ordered: bool| {
        let mut m = watching(DetectorMode::Plain);
        let q = HeartbeatQueue::Members;
        if ordered {
            m.handle_heartbeat_ordered(ms(0), w(0), Epoch(1), q, Pace::Idle, 2);
            m.handle_heartbeat_ordered(ms(5), w(0), Epoch(1), q, Pace::Busy, 1);
        } else {
            m.handle_heartbeat_at(ms(0), w(0), Epoch(1), q, Pace::Idle);
            m.handle_heartbeat_at(ms(5), w(0), Epoch(1), q, Pace::Busy);
        }
        downs(&tick(&mut m, 6, 99))
    };
    assert_eq!(run(true), 0, "the newest heartbeat said idle");
    assert_eq!(run(false), 1, "the latest arrival said busy");
    // A newer FAST one still narrows it, and a new epoch starts afresh.
    let mut m = watching(DetectorMode::Plain);
    let q = HeartbeatQueue::Members;
    m.handle_heartbeat_ordered(ms(0), w(0), Epoch(1), q, Pace::Idle, 7);
    m.handle_heartbeat_ordered(ms(5), w(0), Epoch(2), q, Pace::Busy, 1);
    assert_eq!(downs(&tick(&mut m, 6, 99)), 1);
}

/// Asking a slow peer for the busy pace narrows its paths' window at once:
/// a path that carries nothing for `path_timeout` after the ask is
/// suspect, one that answers is not.
#[test]
fn an_ask_unanswered_within_the_short_window_is_suspect() {
    let mut m = watching(DetectorMode::Plain);
    for n in 0..2 {
        m.handle_heartbeat_paced(ms(0), w(n), Epoch(1), HeartbeatQueue::Members, false);
    }
    m.handle_watch_sent(ms(10), A);
    assert!(
        m.poll_timeout() <= ms(61),
        "a check when the ask's window ends"
    );
    // Network 0 answers (FAST); network 1 stays silent.
    m.handle_heartbeat_paced(ms(12), w(0), Epoch(1), HeartbeatQueue::Members, true);
    for t in (22..=52).step_by(10) {
        m.handle_heartbeat_paced(ms(t), w(0), Epoch(1), HeartbeatQueue::Members, true);
    }
    let acts = tick(&mut m, 11, 61);
    assert_eq!(
        acts,
        vec![MonitorAction::Report(PathReport::PathDown {
            watch: w(1),
            last_heard: ms(0),
            failover: true
        })]
    );
}

/// An ask that ended before the peer answered (its end may have
/// overtaken it) leaves the idle window: the peer owes no answer.
#[test]
fn an_ended_ask_owes_no_answer() {
    let mut m = watching(DetectorMode::Plain);
    m.handle_heartbeat_paced(ms(0), w(0), Epoch(1), HeartbeatQueue::Members, false);
    m.handle_watch_sent(ms(10), A);
    m.handle_watch_ended(A);
    assert_eq!(downs(&tick(&mut m, 11, 99)), 0);
    assert_eq!(
        downs(&tick(&mut m, 100, 101)),
        1,
        "the idle window still holds"
    );
}

/// A path whose newest heartbeat says `SLOW` is watched with the slow
/// windows: its peer reported dead only after `slow_timeout()`, and a
/// newer heartbeat without `SLOW` narrows it again.
#[test]
fn a_slow_peer_gets_the_slow_windows() {
    let mut c = cfg(DetectorMode::Plain);
    c.slow_after = Some(Duration::from_millis(100));
    c.slow_factor = 4;
    assert_eq!(c.slow_timeout(), Duration::from_millis(270));
    assert_eq!(c.slow_path_timeout(), Duration::from_millis(400));
    let dead = |acts: &[MonitorAction]| {
        acts.iter()
            .filter(|a| matches!(a, MonitorAction::Report(PathReport::PeerDown { .. })))
            .count()
    };
    let q = HeartbeatQueue::Members;
    let mut m = Monitor::new(&c, ms(0));
    m.handle_drop_count(ms(0), 0);
    m.handle_heartbeat_ordered(ms(0), w(0), Epoch(1), q, Pace::Slow, 1);
    let acts = tick(&mut m, 1, 270);
    assert_eq!(dead(&acts) + downs(&acts), 0, "{acts:?}");
    assert_eq!(dead(&tick(&mut m, 271, 272)), 1);
    // Not slow any more: the usual windows.
    let mut m = Monitor::new(&c, ms(0));
    m.handle_drop_count(ms(0), 0);
    m.handle_heartbeat_ordered(ms(0), w(0), Epoch(1), q, Pace::Slow, 1);
    m.handle_heartbeat_ordered(ms(10), w(0), Epoch(1), q, Pace::Idle, 2);
    assert_eq!(dead(&tick(&mut m, 11, 161)), 1, "timeout from 10 ms");
    assert_eq!(Pace::of(crate::detector::datagram::FLAG_SLOW), Pace::Slow);
}

/// No fixed tick: with one idle path, the checks wait for its window.
#[test]
fn checks_wake_when_a_window_ends_not_on_a_tick() {
    let mut m = watching(DetectorMode::SafeTimer);
    m.handle_heartbeat_paced(ms(0), w(0), Epoch(1), HeartbeatQueue::Members, false);
    m.handle_timeout(ms(5));
    assert!(m.poll_timeout() >= ms(100), "{:?}", m.poll_timeout());
    assert!(m.poll_timeout() <= ms(101), "{:?}", m.poll_timeout());
    // Heard meanwhile: the check finds nothing due and waits again.
    m.handle_heartbeat_paced(ms(40), w(0), Epoch(1), HeartbeatQueue::Members, false);
    m.handle_timeout(m.poll_timeout());
    assert!(actions(&mut m).is_empty());
    assert!(m.poll_timeout() >= ms(140));
}

/// A FAST heartbeat on one network says the peer is at the busy pace on
/// all: a path of it still at the idle pace that stays silent is suspect
/// after the short window (a network muted one way is found fast).
#[test]
fn a_fast_heartbeat_on_one_network_narrows_the_others() {
    let mut m = watching(DetectorMode::Plain);
    for n in 0..2 {
        m.handle_heartbeat_paced(ms(0), w(n), Epoch(1), HeartbeatQueue::Members, false);
    }
    for t in (20..=80).step_by(10) {
        m.handle_heartbeat_paced(ms(t), w(1), Epoch(1), HeartbeatQueue::Members, true);
    }
    let acts = tick(&mut m, 1, 69);
    assert!(acts.is_empty(), "{acts:?}");
    let acts = tick(&mut m, 70, 71);
    assert_eq!(
        acts,
        vec![MonitorAction::Report(PathReport::PathDown {
            watch: w(0),
            last_heard: ms(0),
            failover: true
        })]
    );
}

/// A path reported down probes its network once (every other peer there
/// asked for the busy pace), and not again within the idle path window.
#[test]
fn a_path_down_probes_its_network_once_per_window() {
    let mut m = watching(DetectorMode::Plain);
    let mut got = Vec::new();
    for t in 1..=60u64 {
        m.handle_timeout(ms(t));
        got.extend(all_actions(&mut m));
    }
    let probes: Vec<_> = got
        .iter()
        .filter(|a| matches!(a, MonitorAction::ProbeNetwork { .. }))
        .collect();
    assert_eq!(
        probes,
        vec![&MonitorAction::ProbeNetwork {
            network: 0,
            except: A
        }]
    );
    // Up and down again within the window: no second probe.
    m.handle_heartbeat(ms(70), w(0), Epoch(1));
    let mut got = Vec::new();
    for t in 70..=130u64 {
        m.handle_timeout(ms(t));
        got.extend(all_actions(&mut m));
    }
    assert!(got.contains(&MonitorAction::Report(PathReport::PathDown {
        watch: w(0),
        last_heard: ms(70),
        failover: false
    })));
    assert!(!got
        .iter()
        .any(|a| matches!(a, MonitorAction::ProbeNetwork { .. })));
}

/// A busy path whose only sign of life is its data: bytes waiting unread
/// in its connection (our reader stalled) hold the path back, and the
/// round asks about exactly the suspect's paths; with the connection read
/// empty the path is reported.
#[test]
fn unread_bytes_in_a_connection_hold_back_its_path() {
    let run = |unread: bool| {
        let mut m = Monitor::new(&cfg(DetectorMode::SafeTimer), ms(0));
        m.handle_drop_count(ms(0), 0);
        m.handle_system_drop_count(ms(0), 0);
        m.handle_heartbeat_paced(ms(0), w(0), Epoch(1), HeartbeatQueue::Members, true);
        m.handle_heartbeat_paced(ms(0), w(1), Epoch(1), HeartbeatQueue::Members, true);
        // Network 1 carries data until 10 ms, network 0 until 60 ms.
        m.handle_heard(ms(10), w(1));
        m.handle_heard(ms(60), w(0));
        let token = barrier_token(&tick(&mut m, 1, 61));
        assert_eq!(m.round_paths(), vec![w(1)], "only the suspect path");
        let q = QueuesAtBarrier {
            drops: 0,
            system_drops: 0,
            members_empty: true,
            strays: None,
            private: Vec::new(),
            unread_streams: if unread { vec![w(1)] } else { Vec::new() },
        };
        m.handle_barrier_queues(ms(61), token, &q);
        let acts = actions(&mut m);
        (downs(&acts), m.stats().saved_by_stream)
    };
    assert_eq!(run(true), (0, 1), "held back by its unread bytes");
    assert_eq!(run(false), (1, 0), "reported once read empty");
}

/// A path that falls silent while another path of its peer is heard is
/// failed over; paths that fall silent together (the peer paused, or every
/// network at once) are reported without failover — nothing to move to —
/// and the one still silent when another is heard again is failed over
/// then.
#[test]
fn paths_silent_together_are_held_until_the_peer_is_heard_again() {
    let mut m = watching(DetectorMode::Plain);
    for n in 0..2 {
        m.handle_heartbeat_paced(ms(0), w(n), Epoch(1), HeartbeatQueue::Members, true);
    }
    // Both silent from 0 ms: a paused peer.
    let got = tick(&mut m, 1, 60);
    let reports: Vec<_> = got
        .iter()
        .filter_map(|a| match a {
            MonitorAction::Report(r) => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(
        reports,
        vec![
            PathReport::PathDown {
                watch: w(0),
                last_heard: ms(0),
                failover: false
            },
            PathReport::PathDown {
                watch: w(1),
                last_heard: ms(0),
                failover: false
            },
        ]
    );
    assert_eq!(m.stats().held, 2);
    // The peer resumes on network 1 only: network 0 is failed over once
    // it stays silent for the margin (15 ms: the same round's copy may be
    // right behind), once.
    m.handle_heartbeat_paced(ms(70), w(1), Epoch(1), HeartbeatQueue::Members, true);
    assert_eq!(
        actions(&mut m),
        vec![MonitorAction::Report(PathReport::PathUp { watch: w(1) })]
    );
    assert!(m.poll_timeout() <= ms(86), "a check when the margin ends");
    m.handle_heartbeat_paced(ms(80), w(1), Epoch(1), HeartbeatQueue::Members, true);
    let got = tick(&mut m, 71, 90);
    assert_eq!(
        got,
        vec![MonitorAction::Report(PathReport::PathFailover {
            watch: w(0)
        })]
    );
    m.handle_heartbeat_paced(ms(95), w(1), Epoch(1), HeartbeatQueue::Members, true);
    assert!(tick(&mut m, 91, 96).is_empty(), "one failover per report");
    // Network 0 heard again, then silent alone: failed over at once.
    m.handle_heartbeat_paced(ms(90), w(0), Epoch(1), HeartbeatQueue::Members, true);
    for t in (100..=200).step_by(10) {
        m.handle_heartbeat_paced(ms(t), w(1), Epoch(1), HeartbeatQueue::Members, true);
    }
    let got = tick(&mut m, 97, 200);
    assert!(
        got.contains(&MonitorAction::Report(PathReport::PathDown {
            watch: w(0),
            last_heard: ms(90),
            failover: true
        })),
        "{got:?}"
    );
    assert!(!got
        .iter()
        .any(|a| matches!(a, MonitorAction::Report(PathReport::PathFailover { .. }))));
}

/// The peer resumes on both paths, one copy a moment behind the other:
/// nothing is failed over.
#[test]
fn a_copy_right_behind_the_first_heard_fails_nothing_over() {
    let mut m = watching(DetectorMode::Plain);
    for n in 0..2 {
        m.handle_heartbeat_paced(ms(0), w(n), Epoch(1), HeartbeatQueue::Members, true);
    }
    let got = tick(&mut m, 1, 60);
    assert_eq!(downs(&got), 2);
    m.handle_heartbeat_paced(ms(70), w(1), Epoch(1), HeartbeatQueue::Members, true);
    m.handle_heartbeat_paced(ms(75), w(0), Epoch(1), HeartbeatQueue::Members, true);
    let mut got = actions(&mut m);
    got.extend(tick(&mut m, 61, 120));
    assert!(
        !got.iter()
            .any(|a| matches!(a, MonitorAction::Report(PathReport::PathFailover { .. }))),
        "{got:?}"
    );
}

/// A path failed over after the whole peer fell silent (`PathFailover`)
/// is given up (its connection torn down) only after a peer window more of
/// silence while its peer is heard, once; one heard again before that is
/// not; a path that fell silent alone is never given up later (the shell
/// tears it down at once).
#[test]
fn a_path_failed_over_after_a_silent_peer_is_given_up_a_peer_window_later_unless_heard() {
    let window = u64::try_from(cfg(DetectorMode::Plain).timeout.as_millis()).unwrap();
    let reports = |acts: Vec<MonitorAction>| -> Vec<PathReport> {
        acts.into_iter()
            .filter_map(|a| match a {
                MonitorAction::Report(r) => Some(r),
                _ => None,
            })
            .collect()
    };
    let is_abandon = |r: &PathReport| matches!(r, PathReport::PathAbandon { .. });
    // Both paths silent from 0 ms (held), then network 1 heard every 10
    // ms from 70 ms while network 0 stays silent (`resumes`: heard again
    // from that time on).
    let run = |resumes: Option<u64>| {
        let mut m = watching(DetectorMode::Plain);
        for n in 0..2 {
            m.handle_heartbeat_paced(ms(0), w(n), Epoch(1), HeartbeatQueue::Members, true);
        }
        let mut got = Vec::new();
        for t in 1..=70 + 2 * window {
            if t >= 70 && t % 10 == 0 {
                m.handle_heartbeat_paced(ms(t), w(1), Epoch(1), HeartbeatQueue::Members, true);
                if resumes.is_some_and(|r| t >= r) {
                    m.handle_heartbeat_paced(ms(t), w(0), Epoch(1), HeartbeatQueue::Members, true);
                }
            }
            m.handle_timeout(ms(t));
            got.extend(reports(actions(&mut m)).into_iter().map(|r| (t, r)));
        }
        (m, got)
    };
    let (m, got) = run(None);
    let failed = got
        .iter()
        .find(|(_, r)| matches!(r, PathReport::PathFailover { watch } if *watch == w(0)))
        .map(|(t, _)| *t)
        .expect("failed over");
    let abandons: Vec<_> = got.iter().filter(|(_, r)| is_abandon(r)).collect();
    assert_eq!(
        abandons.iter().map(|(_, r)| *r).collect::<Vec<_>>(),
        vec![PathReport::PathAbandon { watch: w(0) }],
        "given up once: {got:?}"
    );
    assert!(abandons[0].0 >= failed + window, "{got:?}");
    assert_eq!(m.stats().abandoned, 1);

    // Heard again before the window ends: kept.
    let (_, got) = run(Some(150));
    assert!(got
        .iter()
        .any(|(_, r)| matches!(r, PathReport::PathFailover { .. })));
    assert!(!got.iter().any(|(_, r)| is_abandon(r)), "{got:?}");

    // Silent alone (network 1 heard throughout): failed over at once,
    // never given up later.
    let mut m = watching(DetectorMode::Plain);
    let mut got = Vec::new();
    for t in 1..=2 * window {
        if t % 10 == 0 {
            m.handle_heartbeat_paced(ms(t), w(1), Epoch(1), HeartbeatQueue::Members, true);
        }
        m.handle_timeout(ms(t));
        got.extend(reports(actions(&mut m)));
    }
    assert!(got
        .iter()
        .any(|r| matches!(r, PathReport::PathDown { failover: true, .. })));
    assert!(!got.iter().any(is_abandon), "{got:?}");
}
