//! The pacer's unit tests (`pace.rs`).

use super::*;

fn ms(m: u64) -> Time {
    Time::from_millis(m)
}

fn pacer() -> Pacer {
    Pacer::new(&DetectorConfig::default())
}

/// The default pace (`answer_grace` off).
fn lingering_pacer() -> Pacer {
    Pacer::new(&DetectorConfig {
        answer_grace: None,
        ..DetectorConfig::default()
    })
}

/// The pace following answers (`answer_grace` one interval).
fn answering_pacer() -> Pacer {
    Pacer::new(&DetectorConfig {
        answer_grace: Some(Duration::from_millis(10)),
        ..DetectorConfig::default()
    })
}

/// Without `answer_grace`: traffic kicks a round at once; the busy pace
/// holds while traffic lingers, then two notices without FAST, then
/// nothing.
#[test]
fn traffic_makes_a_pair_fast_then_it_slows_with_notices() {
    let mut p = lingering_pacer();
    let a = NodeId(7);
    let mut out = Vec::new();
    assert!(!p.poll_round(ms(0), &mut out), "quiet: no busy rounds");
    assert_eq!(p.poll_timeout(ms(0)), None);
    assert!(p.handle_traffic(ms(5), a), "first traffic kicks");
    assert!(!p.handle_traffic(ms(6), a), "already busy");
    assert_eq!(p.poll_timeout(ms(6)), Some(ms(6)), "kick: at once");
    assert!(p.poll_round(ms(6), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    assert_eq!(p.poll_timeout(ms(6)), Some(ms(16)));
    assert_eq!(p.flags(ms(7), a), FLAG_FAST | FLAG_WATCH);
    // Busy until 6 + 1000 ms.
    assert!(p.poll_round(ms(1005), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    assert!(
        !p.poll_round(ms(1010), &mut out),
        "the next tick is at 1015"
    );
    assert!(p.poll_round(ms(1015), &mut out));
    assert_eq!(out, vec![(a, 0)], "first notice");
    assert_eq!(p.flags(ms(1016), a), 0);
    assert!(p.poll_round(ms(1025), &mut out));
    assert_eq!(out, vec![(a, 0)], "second notice");
    assert!(p.poll_round(ms(1035), &mut out));
    assert!(out.is_empty());
    assert_eq!(p.poll_timeout(ms(1035)), None, "no more busy rounds");
    assert_eq!(p.fast_peers(), 0);
}

/// A peer's WATCH makes us fast toward it (FAST without WATCH) for an
/// idle interval after its last one.
#[test]
fn a_watching_peer_gets_the_busy_pace() {
    let mut p = pacer();
    let b = NodeId(9);
    let mut out = Vec::new();
    assert!(!p.handle_watch(ms(0), b, false));
    assert!(p.handle_watch(ms(0), b, true));
    assert!(p.poll_round(ms(1), &mut out));
    assert_eq!(out, vec![(b, FLAG_FAST)]);
    assert!(!p.handle_watch(ms(5), b, true), "fast already: no kick");
    // Its last WATCH at 5 ms holds for an idle interval (400 ms).
    assert!(p.poll_round(ms(401), &mut out));
    assert_eq!(out, vec![(b, FLAG_FAST)]);
    assert!(p.poll_round(ms(411), &mut out));
    assert_eq!(out, vec![(b, 0)], "its watch lapsed");
    assert!(!p.is_fast(b));
}

/// A probe is a busy spell of an idle interval (400 ms): WATCH goes out
/// at once, and the pace drops again after it with its notices — not
/// after `path_timeout`, when the ask's end raced the monitor's check of
/// the answer.
#[test]
fn a_probe_asks_at_once_and_lasts_an_idle_interval() {
    let mut p = pacer();
    let c = NodeId(3);
    let mut out = Vec::new();
    assert!(p.handle_probe(ms(100), c));
    assert!(p.poll_round(ms(100), &mut out));
    assert_eq!(out, vec![(c, FLAG_FAST | FLAG_WATCH)]);
    assert!(p.poll_round(ms(150), &mut out));
    assert_eq!(out, vec![(c, FLAG_FAST | FLAG_WATCH)], "past path_timeout");
    assert!(p.poll_round(ms(490), &mut out));
    assert_eq!(out, vec![(c, FLAG_FAST | FLAG_WATCH)]);
    assert!(p.poll_round(ms(500), &mut out));
    assert_eq!(out, vec![(c, 0)], "400 ms later: notices");
}

/// A busy copy to a path that carried data is left out while it says
/// the same as the last one, but one still goes every half idle
/// interval; a change of flags, a fence copy, a notice go out. A path without
/// data is on standby: two copies at the busy pace say so, then one
/// per standby interval.
#[test]
fn data_stands_in_for_busy_copies_and_other_paths_stand_by() {
    // A standby pace of 100 ms (the default is 20) spreads the steps.
    let mut p = Pacer::new(&DetectorConfig {
        data_as_heartbeat: true,
        standby_interval: Duration::from_millis(100),
        ..DetectorConfig::default()
    });
    let a = NodeId(4);
    let ff = FLAG_FAST | FLAG_WATCH;
    let sb = ff | FLAG_STANDBY;
    // Network 0 carries our data; `pair` says when the pair last did.
    let wrote = |t: u64| PathUse {
        wrote: Some(ms(t)),
        used: Some(ms(t)),
        pair_used: Some(ms(t)),
    };
    let idle_here = |pair: u64| PathUse {
        wrote: None,
        used: None,
        pair_used: Some(ms(pair)),
    };
    // Nothing sent there yet: the first copy goes.
    assert_eq!(p.admit_copy(ms(0), a, 0, ff, true, wrote(0)), Some(ff));
    assert_eq!(p.admit_copy(ms(10), a, 0, ff, true, wrote(5)), None);
    assert_eq!(
        p.admit_copy(ms(20), a, 0, ff, true, wrote(9)),
        Some(ff),
        "no data within the last interval"
    );
    assert_eq!(p.admit_copy(ms(30), a, 0, ff, true, wrote(29)), None);
    assert_eq!(
        p.admit_copy(ms(30), a, 0, FLAG_FAST, true, wrote(29)),
        Some(FLAG_FAST),
        "the flags changed"
    );
    assert_eq!(
        p.admit_copy(ms(219), a, 0, FLAG_FAST, true, wrote(218)),
        None
    );
    assert!(
        p.admit_copy(ms(230), a, 0, FLAG_FAST, true, wrote(229))
            .is_some(),
        "200 ms since the last copy there"
    );
    assert!(
        p.admit_copy(ms(231), a, 0, FLAG_FAST, false, wrote(231))
            .is_some(),
        "the fence's copies always go"
    );
    // The pair went quiet: both notices go though data flows (data
    // does not say the pace dropped).
    assert_eq!(p.admit_copy(ms(240), a, 0, 0, true, wrote(239)), Some(0));
    assert_eq!(
        p.admit_copy(ms(250), a, 0, 0, true, wrote(249)),
        Some(0),
        "the second notice"
    );
    // Network 1 carries nothing while network 0 does: standby, twice
    // at the busy pace, then every 100 ms.
    assert_eq!(p.admit_copy(ms(0), a, 1, ff, true, idle_here(0)), Some(sb));
    assert_eq!(p.admit_copy(ms(10), a, 1, ff, true, idle_here(9)), Some(sb));
    assert_eq!(p.admit_copy(ms(20), a, 1, ff, true, idle_here(19)), None);
    assert_eq!(p.admit_copy(ms(109), a, 1, ff, true, idle_here(108)), None);
    assert_eq!(
        p.admit_copy(ms(110), a, 1, ff, true, idle_here(109)),
        Some(sb)
    );
    // Data moves there: the next copy says so at once.
    assert_eq!(p.admit_copy(ms(120), a, 1, ff, true, wrote(115)), Some(ff));
    // No path of the pair carries data (a call waits on a slow
    // handler): the busy pace everywhere.
    assert_eq!(
        p.admit_copy(ms(400), a, 1, ff, true, idle_here(120)),
        Some(ff)
    );
    assert_eq!(
        p.admit_copy(ms(410), a, 1, ff, true, idle_here(120)),
        Some(ff)
    );
    // What the peer sent us on a path counts as the path's data.
    let read = PathUse {
        wrote: None,
        used: Some(ms(415)),
        pair_used: Some(ms(415)),
    };
    assert_eq!(p.admit_copy(ms(420), a, 1, ff, true, read), Some(ff));
    // A quiet pair's copies are not standby ones.
    assert_eq!(
        p.admit_copy(ms(430), a, 1, 0, false, idle_here(429)),
        Some(0)
    );
    p.forget(a);
    assert!(
        p.admit_copy(ms(432), a, 0, FLAG_FAST, true, wrote(432))
            .is_some(),
        "a forgotten peer's paths start afresh"
    );
}

/// By default a standby path gets a copy every 20 ms (window 60 ms).
#[test]
fn by_default_a_standby_path_gets_a_copy_every_two_intervals() {
    let c = DetectorConfig::default();
    assert!(c.data_as_heartbeat);
    assert_eq!(c.standby_path_timeout(), Duration::from_millis(60));
    let mut p = pacer();
    let a = NodeId(4);
    let ff = FLAG_FAST | FLAG_WATCH;
    let sb = ff | FLAG_STANDBY;
    let idle_here = |pair: u64| PathUse {
        wrote: None,
        used: None,
        pair_used: Some(ms(pair)),
    };
    let sent: Vec<u64> = (0..=60)
        .step_by(10)
        .filter(|t| p.admit_copy(ms(*t), a, 1, ff, true, idle_here(*t)) == Some(sb))
        .collect();
    assert_eq!(sent, vec![0, 10, 30, 50], "two notices, then every 20 ms");
}

/// Off, every copy goes, with the flags it was given.
#[test]
fn off_data_stands_in_for_nothing() {
    let mut p = Pacer::new(&DetectorConfig {
        data_as_heartbeat: false,
        ..DetectorConfig::default()
    });
    let a = NodeId(4);
    let ff = FLAG_FAST | FLAG_WATCH;
    let wrote = PathUse {
        wrote: Some(ms(9)),
        used: Some(ms(9)),
        pair_used: Some(ms(9)),
    };
    let other = PathUse {
        wrote: None,
        used: None,
        pair_used: Some(ms(9)),
    };
    for t in [0, 10, 20] {
        assert_eq!(p.admit_copy(ms(t), a, 0, ff, true, wrote), Some(ff));
        assert_eq!(p.admit_copy(ms(t), a, 1, ff, true, other), Some(ff));
    }
}

#[test]
fn forgetting_a_kicked_peer_leaves_no_kick() {
    for mut p in [answering_pacer(), lingering_pacer()] {
        p.handle_traffic(ms(0), NodeId(1));
        p.forget(NodeId(1));
        assert_eq!(p.poll_timeout(ms(0)), None);
        assert!(!p.awaits_answers());
    }
}

/// With `answer_grace`, a call answered within the grace (one
/// interval) costs no busy-pace heartbeat at all: no kick, no round.
#[test]
fn answered_traffic_stays_at_the_idle_pace() {
    let mut p = answering_pacer();
    let a = NodeId(7);
    let mut out = Vec::new();
    for call in 0..20u64 {
        let t = call * 50;
        assert!(!p.handle_traffic(ms(t), a), "a send is no kick");
        assert!(p.awaits_answers());
        assert_eq!(p.poll_timeout(ms(t)), Some(ms(t + 10)), "the grace ends");
        p.handle_answer(ms(t + 3), a);
        assert!(!p.awaits_answers());
        assert!(!p.poll_round(ms(t + 10), &mut out), "answered: no round");
        assert_eq!(p.flags(ms(t + 10), a), 0);
    }
    assert_eq!(p.fast_peers(), 0);
    let mut asks = Vec::new();
    p.take_asks(&mut asks);
    assert!(asks.is_empty());
}

/// A send unanswered for the grace makes the pair busy — WATCH, an ask
/// the shell gives the monitor — until the answer comes; then the two
/// notices, and quiet.
#[test]
fn an_unanswered_send_asks_after_the_grace_until_answered() {
    let mut p = answering_pacer();
    let a = NodeId(7);
    let mut out = Vec::new();
    let mut asks = Vec::new();
    p.handle_traffic(ms(100), a);
    // An answer read before the send answers nothing.
    p.handle_answer(ms(99), a);
    assert!(p.awaits_answers());
    assert!(!p.poll_round(ms(105), &mut out), "within the grace");
    assert_eq!(p.flags(ms(105), a), 0);
    assert!(p.poll_round(ms(110), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    p.take_asks(&mut asks);
    assert_eq!(asks, vec![a], "the ask goes to the monitor once");
    // More sends while waiting: still the same wait.
    p.handle_traffic(ms(115), a);
    assert!(p.poll_round(ms(120), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    p.take_asks(&mut asks);
    assert_eq!(asks, vec![a], "no second ask while it lasts");
    // Data read at 121 answers both; a send at 125 waits, and the pair,
    // asking already, stays busy while it does.
    p.handle_traffic(ms(125), a);
    p.handle_answer(ms(121), a);
    assert!(p.awaits_answers());
    assert!(p.poll_round(ms(130), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    p.handle_answer(ms(131), a);
    assert!(!p.awaits_answers());
    assert!(p.poll_round(ms(140), &mut out));
    assert_eq!(out, vec![(a, 0)], "first notice");
    let mut ends = Vec::new();
    p.take_ask_ends(&mut ends);
    assert_eq!(ends, vec![a], "the ask's end goes to the monitor");
    assert!(p.poll_round(ms(150), &mut out));
    assert_eq!(out, vec![(a, 0)], "second notice");
    assert!(p.poll_round(ms(160), &mut out));
    assert!(out.is_empty());
    assert_eq!(p.poll_timeout(ms(160)), None);
    p.take_ask_ends(&mut ends);
    assert_eq!(ends, vec![a], "once");
    // A new wait asks again — after the peer's grace, which its answers
    // (21 and 6 ms after the sends they answered) widened to 65.6 ms
    // (smoothed 19.1 ms plus four deviations of 11.6).
    p.handle_traffic(ms(200), a);
    let due = p.poll_timeout(ms(200)).unwrap();
    assert!(due > ms(265) && due < ms(266), "{due:?}");
    assert!(!p.poll_round(ms(265), &mut out));
    assert!(p.poll_round(ms(266), &mut out));
    p.take_asks(&mut asks);
    assert_eq!(asks, vec![a, a]);
}

/// The grace follows the peer's answer time: answers within
/// `answer_grace` leave it there; slower ones widen it (smoothed time
/// plus four deviations) up to `answer_grace_max`, a wait longer than
/// that counting as that; quick answers bring it back; another peer
/// keeps its own.
#[test]
fn the_grace_follows_the_answer_time_between_its_bounds() {
    let mut p = answering_pacer();
    let (a, b) = (NodeId(7), NodeId(8));
    let mut out = Vec::new();
    // Answers 1 ms after each send, every 100 ms: the grace stays 10 ms.
    let mut t = 1_000;
    for _ in 0..20 {
        p.handle_traffic(ms(t), a);
        p.handle_answer(ms(t + 1), a);
        t += 100;
    }
    p.handle_traffic(ms(t), a);
    assert_eq!(p.poll_timeout(ms(t)), Some(ms(t + 10)));
    p.handle_answer(ms(t + 1), a);
    p.poll_round(ms(t + 1), &mut out);
    assert!(out.is_empty(), "answered within the grace: never asked");
    // Answers 20 ms after each send (a loaded server): asked once or
    // twice at first, then the grace covers them and nothing asks.
    // One call answered after 20 ms, with the rounds the shell would run
    // (the notices, if it asked); returns whether it was within the grace
    // 19 ms after the send.
    let slow_call = |p: &mut Pacer, t: u64, asks: &mut Vec<NodeId>| {
        let mut out = Vec::new();
        p.handle_traffic(ms(t), a);
        let quiet = p.flags(ms(t + 19), a) & FLAG_WATCH == 0;
        for k in (1..20).step_by(5) {
            p.poll_round(ms(t + k), &mut out);
        }
        p.handle_answer(ms(t + 20), a);
        for k in (20..60).step_by(5) {
            p.poll_round(ms(t + k), &mut out);
        }
        p.take_asks(asks);
        quiet
    };
    let mut asks = Vec::new();
    for _ in 0..20 {
        t += 100;
        slow_call(&mut p, t, &mut asks);
    }
    let early = asks.len();
    assert!((1..=5).contains(&early), "asked {early} times");
    asks.clear();
    for _ in 0..10 {
        t += 100;
        assert!(slow_call(&mut p, t, &mut asks), "within its grace");
    }
    assert!(asks.is_empty(), "usual answers are not asked for");
    // Never past answer_grace_max (200 ms), however slow: a 2 s wait
    // counts as 200 ms, and the next wait asks 200 ms after its send.
    t += 100;
    p.handle_traffic(ms(t), a);
    p.handle_answer(ms(t + 2_000), a);
    t += 2_100;
    p.handle_traffic(ms(t), a);
    assert_eq!(p.poll_timeout(ms(t)), Some(ms(t + 200)));
    p.handle_answer(ms(t + 1), a);
    // Quick answers again: back to 10 ms within a few dozen.
    for _ in 0..40 {
        t += 100;
        p.handle_traffic(ms(t), a);
        p.handle_answer(ms(t + 1), a);
    }
    t += 100;
    p.handle_traffic(ms(t), a);
    assert_eq!(p.poll_timeout(ms(t)), Some(ms(t + 10)));
    // Another peer has its own: 10 ms.
    p.handle_traffic(ms(t), b);
    p.handle_answer(ms(t + 1), a);
    assert_eq!(p.poll_timeout(ms(t)), Some(ms(t + 10)));
    // With answer_grace_max = answer_grace, the grace is fixed.
    let mut fixed = Pacer::new(&DetectorConfig {
        answer_grace: Some(Duration::from_millis(10)),
        answer_grace_max: Duration::from_millis(10),
        ..DetectorConfig::default()
    });
    for i in 0..10 {
        fixed.handle_traffic(ms(100 * i), a);
        fixed.handle_answer(ms(100 * i + 30), a);
    }
    fixed.handle_traffic(ms(5_000), a);
    assert_eq!(fixed.poll_timeout(ms(5_000)), Some(ms(5_010)));
}

/// A pair quiet for `slow_after` announces `SLOW` in two fence rounds,
/// then gets only the full ones; traffic either way ends it at once,
/// and every copy says `SLOW` while rounds are skipped.
#[test]
fn a_quiet_pair_goes_slow_after_two_notices_and_traffic_ends_it() {
    let mut p = Pacer::new(&DetectorConfig {
        slow_after: Some(Duration::from_millis(1000)),
        ..DetectorConfig::default()
    });
    let a = NodeId(5);
    assert_eq!(p.fence_copy(ms(0), a, true), Some(0), "first seen");
    assert_eq!(p.fence_copy(ms(400), a, false), Some(0));
    assert_eq!(p.fence_copy(ms(1000), a, false), Some(FLAG_SLOW));
    assert_eq!(p.flags(ms(1001), a), FLAG_SLOW, "greetings say it too");
    assert_eq!(p.fence_copy(ms(1400), a, false), Some(FLAG_SLOW));
    assert_eq!(p.fence_copy(ms(1800), a, false), None, "skipped");
    assert_eq!(p.fence_copy(ms(2200), a, false), None);
    assert_eq!(p.fence_copy(ms(2600), a, true), Some(FLAG_SLOW), "full");
    // A read is no traffic of ours (keepalives are reads).
    p.handle_answer(ms(2650), a);
    assert_eq!(p.flags(ms(2651), a), FLAG_SLOW);
    // The peer's WATCH: every round again, no SLOW.
    p.handle_watch_ordered(ms(2700), a, true, Epoch(1), 1);
    assert_eq!(p.fence_copy(ms(3000), a, false), Some(0));
    let mut out = Vec::new();
    assert!(p.poll_round(ms(3001), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST)]);
    // Its ask lapses (an idle interval), two notices, then quiet.
    for t in [3110u64, 3120, 3130] {
        p.poll_round(ms(t), &mut out);
    }
    assert_eq!(
        p.fence_copy(ms(3400), a, false),
        Some(0),
        "not quiet long enough"
    );
    // Quiet again: two notices before any skip.
    assert_eq!(p.fence_copy(ms(4500), a, false), Some(FLAG_SLOW));
    assert_eq!(p.fence_copy(ms(4900), a, false), Some(FLAG_SLOW));
    assert_eq!(p.fence_copy(ms(5300), a, false), None);
    // A call of ours: busy (the linger), so every round.
    p.handle_traffic(ms(5400), a);
    assert_eq!(p.fence_copy(ms(5700), a, false), Some(FLAG_WATCH));
    // Off (`slow_after = None`): every round, never SLOW.
    let mut d = Pacer::new(&DetectorConfig {
        slow_after: None,
        ..DetectorConfig::default()
    });
    assert_eq!(d.fence_copy(ms(0), a, false), Some(0));
    assert_eq!(d.fence_copy(ms(60_000), a, false), Some(0));
}

/// A heartbeat without WATCH, newer than the last with it, ends the
/// peer's ask at once; an older one (overtaken on the other network)
/// does not.
#[test]
fn a_newer_heartbeat_without_watch_ends_the_ask() {
    let mut p = answering_pacer();
    let b = NodeId(9);
    let e = Epoch(1);
    let mut out = Vec::new();
    assert!(p.handle_watch_ordered(ms(0), b, true, e, 10));
    assert!(p.poll_round(ms(0), &mut out));
    assert_eq!(out, vec![(b, FLAG_FAST)]);
    assert!(!p.handle_watch_ordered(ms(5), b, false, e, 9), "older");
    assert!(p.poll_round(ms(10), &mut out));
    assert_eq!(out, vec![(b, FLAG_FAST)], "still watched");
    assert!(!p.handle_watch_ordered(ms(12), b, false, e, 11));
    assert!(p.poll_round(ms(20), &mut out));
    assert_eq!(out, vec![(b, 0)], "ended: notices at once");
    // A replayed WATCH from before does not start it again.
    assert!(!p.handle_watch_ordered(ms(25), b, true, e, 10));
    assert!(p.poll_round(ms(30), &mut out));
    assert_eq!(out, vec![(b, 0)], "second notice");
    // A new incarnation's counter starts low, and is newer.
    assert!(p.handle_watch_ordered(ms(40), b, true, Epoch(2), 1));
}

/// With `answer_grace` (the default), sends less than `path_timeout / 2`
/// apart for `path_timeout` make the pair dense: busy for `busy_linger`
/// after each send however quickly it is answered (its unused paths
/// then go on standby); a short burst or calls 25 ms apart do not.
#[test]
fn a_dense_pair_lingers_a_sparse_one_does_not() {
    let mut p = pacer();
    let a = NodeId(7);
    let b = NodeId(8);
    let mut out = Vec::new();
    // A burst of 5 sends 1 ms apart, answered: not dense.
    for t in 0..5u64 {
        assert!(!p.handle_traffic(ms(t), b));
        p.handle_answer(ms(t), b);
    }
    assert!(!p.poll_round(ms(10), &mut out));
    // A stream every 5 ms, each answered at once: dense from 50 ms on.
    let mut kicked = None;
    for t in (100..=200u64).step_by(5) {
        if p.handle_traffic(ms(t), a) {
            kicked.get_or_insert(t);
        }
        p.handle_answer(ms(t), a);
    }
    assert_eq!(kicked, Some(150), "dense once the run spans path_timeout");
    assert!(p.poll_round(ms(200), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    // Busy for busy_linger (1 s) after its last send, though answered.
    assert!(p.poll_round(ms(1190), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    assert!(p.poll_round(ms(1200), &mut out));
    assert_eq!(out, vec![(a, 0)], "first notice after the linger");
    // A gap of half a path window starts a new run: calls 25 ms apart
    // are sparse.
    for t in [1300u64, 1325, 1350, 1375, 1400] {
        assert!(!p.handle_traffic(ms(t), a), "calls 25 ms apart at {t}");
        p.handle_answer(ms(t), a);
    }
}

/// With `answer_grace`, replies await no answer but count towards a dense
/// pair: the side answering a stream is busy too, as with the linger;
/// sparse replies cost nothing.
#[test]
fn dense_replies_linger_without_awaiting_answers() {
    let mut p = pacer();
    let a = NodeId(7);
    let mut out = Vec::new();
    for t in (0..=40u64).step_by(20) {
        assert!(!p.handle_reply(ms(t), a), "sparse replies at {t}");
    }
    assert!(!p.awaits_answers(), "a reply waits for nothing");
    assert!(!p.poll_round(ms(60), &mut out));
    let mut kicked = None;
    for t in (100..=160u64).step_by(10) {
        if p.handle_reply(ms(t), a) {
            kicked.get_or_insert(t);
        }
    }
    assert_eq!(kicked, Some(150));
    assert!(!p.awaits_answers());
    assert!(p.poll_round(ms(160), &mut out));
    assert_eq!(out, vec![(a, FLAG_FAST | FLAG_WATCH)]);
    // Without the grace a reply is traffic like any other.
    let mut l = lingering_pacer();
    assert!(l.handle_reply(ms(0), a));
}
