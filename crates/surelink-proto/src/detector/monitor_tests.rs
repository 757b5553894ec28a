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

#[path = "monitor_queue_tests.rs"]
mod queues;

#[path = "monitor_pace_tests.rs"]
mod windows;
