//! The crowd pace's tests (`crowd.rs`): through the pacer that uses it,
//! and against the monitor that watches what it sends.

use super::super::datagram::{ask_shift, pace_shift, shift_flags, FLAG_FAST, FLAG_WATCH};
use super::super::{DetectorConfig, DetectorMode, HeartbeatQueue, Monitor, MonitorAction, Pace};
use super::super::{PathReport, Watch};
use crate::detector::Pacer;
use crate::ids::{Epoch, NodeId};
use crate::time::Time;

fn ms(m: u64) -> Time {
    Time::from_millis(m)
}

/// The defaults with a budget of one busy peer at 10 ms.
fn small_budget() -> DetectorConfig {
    DetectorConfig {
        crowd_budget: Some(100),
        ..DetectorConfig::default()
    }
}

/// `n` peers asking us all along; the busy rounds from 0 to `until` ms,
/// every interval. Returns, per round, the copies to peer 1.
fn watched_by(n: u64, until: u64, cfg: &DetectorConfig) -> (Pacer, Vec<(u64, u16)>) {
    let mut p = Pacer::new(cfg);
    let mut out = Vec::new();
    let mut to_first = Vec::new();
    for t in (0..=until).step_by(10) {
        if t % 100 == 0 {
            for peer in 1..=n {
                p.handle_watch(ms(t), NodeId(peer), true);
            }
        }
        p.poll_round(ms(t), &mut out);
        to_first.extend(out.iter().filter(|c| c.0 == NodeId(1)).map(|c| (t, c.1)));
    }
    (p, to_first)
}

/// Four busy peers on a budget of one: the shift grows to 2, the copies
/// to each peer say so twice at the old pace, then go every 40 ms, and
/// every copy asks the peers for the same.
#[test]
fn a_crowd_stretches_the_busy_pace_after_saying_so_twice() {
    let (p, copies) = watched_by(4, 1000, &small_budget());
    assert_eq!(p.crowd_shift(), 2);
    let times: Vec<u64> = copies.iter().map(|c| c.0).collect();
    assert_eq!(&times[..5], &[0, 10, 20, 60, 100], "{times:?}");
    assert_eq!(pace_shift(copies[0].1), 0, "not crowded yet");
    for (t, f) in &copies[1..] {
        assert_eq!(pace_shift(*f), 2, "at {t}");
        assert_eq!(ask_shift(*f), 2, "at {t}");
        assert_ne!(f & FLAG_FAST, 0);
    }
    assert!(
        times.windows(2).skip(2).all(|w| w[1] - w[0] == 40),
        "{times:?}"
    );
    // 4 peers at 40 ms: 100 copies a second, the budget.
    assert_eq!(copies.len(), 2 + (1000 - 20) / 40 + 1);
}

/// Without a budget every busy peer gets every round (and no shift bits).
#[test]
fn no_budget_no_crowd() {
    let cfg = DetectorConfig {
        crowd_budget: None,
        ..DetectorConfig::default()
    };
    let (p, copies) = watched_by(50, 500, &cfg);
    assert_eq!(p.crowd_shift(), 0);
    assert_eq!(copies.len(), 51);
    assert!(copies.iter().all(|c| c.1 == FLAG_FAST));
    // The default budget covers 20 busy peers at the busy pace.
    let (p, copies) = watched_by(20, 500, &DetectorConfig::default());
    assert_eq!(p.crowd_shift(), 0);
    assert_eq!(copies.len(), 51);
    let (p, _) = watched_by(500, 500, &DetectorConfig::default());
    assert_eq!(p.crowd_shift(), 5, "500 busy peers: every 320 ms");
}

/// A crowded peer's ask slows our copies to it (after two that say so),
/// and its end speeds them up at once.
#[test]
fn a_peers_ask_slows_our_copies_and_its_end_speeds_them_at_once() {
    let mut p = Pacer::new(&DetectorConfig::default());
    let b = NodeId(9);
    let mut out = Vec::new();
    let ask = |p: &mut Pacer, t: u64, seq: u64, shift: u8| {
        p.handle_flags_ordered(ms(t), b, FLAG_WATCH | shift_flags(0, shift), Epoch(1), seq)
    };
    assert!(ask(&mut p, 0, 1, 3), "a first WATCH kicks");
    let mut sent = Vec::new();
    for t in (0..=250).step_by(10) {
        if p.poll_round(ms(t), &mut out) && !out.is_empty() {
            sent.push((t, pace_shift(out[0].1)));
        }
    }
    assert_eq!(
        sent,
        vec![(0, 3), (10, 3), (90, 3), (170, 3), (250, 3)],
        "announced twice at the busy pace, then every 80 ms"
    );
    // An older heartbeat without the ask changes nothing; a newer one
    // brings the busy pace back at the next round.
    ask(&mut p, 255, 1, 0);
    p.poll_round(ms(260), &mut out);
    assert!(out.is_empty());
    ask(&mut p, 265, 2, 0);
    p.poll_round(ms(270), &mut out);
    assert_eq!(out, vec![(b, FLAG_FAST)]);
    p.poll_round(ms(280), &mut out);
    assert_eq!(out, vec![(b, FLAG_FAST)]);
}

/// Our copies to peer 1 while it and seven more ask us (a budget of one
/// busy peer: shift 3, every 80 ms), fence rounds among them.
fn crowded_copies(cfg: &DetectorConfig) -> Vec<(u64, u16)> {
    let mut p = Pacer::new(cfg);
    let mut out = Vec::new();
    let mut copies = Vec::new();
    for t in (0..=1500).step_by(10) {
        if t % 100 == 0 {
            for peer in 1..=8 {
                p.handle_watch(ms(t), NodeId(peer), true);
            }
        }
        if t % 400 == 0 {
            if let Some(f) = p.fence_copy(ms(t), NodeId(1), true) {
                copies.push((t, f));
            }
        }
        p.poll_round(ms(t), &mut out);
        copies.extend(out.iter().filter(|c| c.0 == NodeId(1)).map(|c| (t, c.1)));
    }
    copies
}

/// Path reports of a plain-timeout monitor (it reports as soon as a
/// window passes, no checks) fed `copies` in order, but copy `lost`.
fn path_downs(cfg: &DetectorConfig, copies: &[(u64, u16)], lost: Option<usize>) -> usize {
    let watch = Watch {
        peer: NodeId(1),
        network: 0,
    };
    let mut m = Monitor::new(cfg, ms(0));
    let mut downs = 0;
    let mut next = copies.iter().enumerate().peekable();
    for t in 0..=copies.last().map_or(0, |c| c.0) {
        while let Some((i, (at, flags))) = next.next_if(|(_, c)| c.0 <= t) {
            if Some(i) != lost {
                let (q, pace) = (HeartbeatQueue::Members, Pace::of(*flags));
                m.handle_heartbeat_ordered(ms(*at), watch, Epoch(1), q, pace, i as u64);
            }
        }
        m.handle_timeout(ms(t));
        while let Some(a) = m.poll_action() {
            downs += usize::from(matches!(
                a,
                MonitorAction::Report(PathReport::PathDown { .. })
            ));
        }
    }
    downs
}

/// What the receiver sees: every copy of a crowded sender, fence rounds
/// included, with any one copy lost, never leaves the path silent for its
/// window — the wider window is announced before the gaps grow.
#[test]
fn one_lost_copy_never_makes_a_crowded_path_look_silent() {
    let cfg = DetectorConfig {
        mode: DetectorMode::Plain,
        ..small_budget()
    };
    let copies = crowded_copies(&cfg);
    assert!(copies.iter().any(|c| pace_shift(c.1) == 3), "{copies:?}");
    assert_eq!(path_downs(&cfg, &copies, None), 0);
    for lost in 0..copies.len() {
        assert_eq!(path_downs(&cfg, &copies, Some(lost)), 0, "copy {lost} lost");
    }
    // The check can fail: a sender that slowed down without saying so
    // twice first (its two announcements at the busy pace said shift 0)
    // is found silent when the second is lost.
    let mut unannounced = copies.clone();
    let first = unannounced
        .iter()
        .position(|c| pace_shift(c.1) == 3)
        .unwrap();
    for c in &mut unannounced[first..first + 2] {
        c.1 &= !shift_flags(7, 0);
    }
    assert!(path_downs(&cfg, &unannounced, Some(first + 1)) > 0);
}

/// Our ask of a crowded peer (its heartbeats asked for shift 3) expects
/// its answer within that pace's window, not `path_timeout`: a crowded
/// server kicked by hundreds of asks at once answers them in one long
/// round. An ask of an uncrowded peer keeps the short window.
#[test]
fn an_ask_of_a_crowded_peer_waits_its_window() {
    let cfg = DetectorConfig {
        mode: DetectorMode::Plain,
        ..small_budget()
    };
    let watch = Watch {
        peer: NodeId(1),
        network: 0,
    };
    let first_down = |shift: u8| {
        let mut m = Monitor::new(&cfg, ms(0));
        let q = HeartbeatQueue::Members;
        m.handle_heartbeat_ordered(ms(0), watch, Epoch(1), q, Pace::Idle, 1);
        m.handle_watch_sent_crowded(ms(10), NodeId(1), shift);
        (0..=1500).find(|t| {
            m.handle_timeout(ms(*t));
            std::iter::from_fn(|| m.poll_action())
                .any(|a| matches!(a, MonitorAction::Report(PathReport::PathDown { .. })))
        })
    };
    let crowded = u64::try_from(cfg.crowd_path_timeout(3).as_millis()).unwrap();
    assert_eq!(crowded, 270);
    assert_eq!(first_down(0), Some(10 + 50 + 1), "the short window");
    assert_eq!(first_down(3), Some(10 + crowded + 1), "the crowded one");
}
