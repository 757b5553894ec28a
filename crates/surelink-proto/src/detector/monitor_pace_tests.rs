//! The monitor's tests of the windows that follow the pace the peer
//! announced (fast, standby, slow) and of asks.

use super::*;

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
