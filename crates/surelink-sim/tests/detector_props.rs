//! The detector's promises under random pauses, floods, cuts and crashes
//! (virtual time): accuracy — once the receiver reports the sender dead,
//! the sender lets nothing out (SafeTimer Theorem A.1); completeness — a
//! crashed or fenced sender is reported within the bound of Theorem A.2
//! once the receiver runs normally.
//!
//! A failing case prints its scenario (faults and seed); paste it into
//! `replay_one` to debug.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use surelink_proto::detector::DetectorConfig;
use surelink_sim::detector::{DetectorFault, DetectorScenario, PauseTarget};

const RUN: Duration = Duration::from_millis(4000);

fn config() -> DetectorConfig {
    DetectorConfig::with_interval(Duration::from_millis(10))
}

fn target() -> impl Strategy<Value = PauseTarget> {
    prop_oneof![
        Just(PauseTarget::SenderProcess),
        Just(PauseTarget::SenderHeartbeat),
        Just(PauseTarget::ReceiverProcess),
        Just(PauseTarget::ReceiverReader),
        Just(PauseTarget::ReceiverChecker),
    ]
}

fn fault() -> impl Strategy<Value = DetectorFault> {
    let ms = |r: std::ops::Range<u64>| r.prop_map(Duration::from_millis);
    prop_oneof![
        4 => (target(), ms(0..3000), ms(0..800))
            .prop_map(|(target, at, len)| DetectorFault::Pause { target, at, len }),
        1 => (ms(0..3000), ms(0..1000)).prop_map(|(at, len)| DetectorFault::Cut { at, len }),
        1 => (ms(0..3000), 0usize..300).prop_map(|(at, count)| DetectorFault::Flood { at, count }),
        1 => ms(100..3000).prop_map(|at| DetectorFault::Crash { at }),
    ]
}

fn scenario() -> impl Strategy<Value = DetectorScenario> {
    (proptest::collection::vec(fault(), 0..6), any::<u64>()).prop_map(|(faults, seed)| {
        DetectorScenario {
            config: config(),
            faults,
            run_for: RUN,
            queue_capacity: 64,
            seed,
        }
    })
}

fn check(s: &DetectorScenario) -> Result<(), String> {
    let out = s.run();
    if let Some(v) = out.accuracy_violation() {
        return Err(format!("accuracy: {v}"));
    }
    let c = &s.config;
    // When the sender stopped for good: crashed, or fenced (its t_valid).
    let stopped = match (out.crashed_at, out.fenced_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let Some(stopped) = stopped else {
        if let Some(r) = out.peer_reports.first() {
            return Err(format!(
                "a live, unfenced sender was reported dead at {r:?}"
            ));
        }
        return Ok(());
    };
    // Theorem A.2: bounded once the receiver runs normally and drops
    // nothing. The window then runs from the latest of: the sender's last
    // heartbeat arriving, the receiver's last stall ending (heartbeats that
    // waited in its queue are read then) and its last drop being counted.
    let last_drop = out.last_drop.map(|t| t.since_origin());
    let settled = s.receiver_settled().since_origin();
    let slack = c.check_every + c.barrier_timeout + Duration::from_millis(1);
    let mut start = (stopped.since_origin() + c.max_network_delay).max(settled);
    if let Some(d) = last_drop {
        start = start.max(d + c.check_every);
    }
    let bound = start + c.timeout + slack;
    if bound > RUN || !out.watched {
        // Not enough quiet time left to judge, or never heard at all.
        return Ok(());
    }
    match out.peer_reports.first() {
        Some(r) if r.since_origin() <= bound => Ok(()),
        Some(r) => Err(format!(
            "completeness: stopped at {stopped:?}, reported at {r:?}, bound {bound:?}"
        )),
        None => Err(format!(
            "completeness: stopped at {stopped:?}, never reported (bound {bound:?})"
        )),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300),
        ..ProptestConfig::default()
    })]

    #[test]
    fn accurate_and_complete_under_random_pauses(s in scenario()) {
        if let Err(e) = check(&s) {
            prop_assert!(false, "{e}\nscenario: {s:?}");
        }
    }
}

#[test]
fn a_two_second_receiver_pause_is_no_false_report() {
    let s = DetectorScenario {
        config: config(),
        faults: vec![DetectorFault::Pause {
            target: PauseTarget::ReceiverProcess,
            at: Duration::from_millis(500),
            len: Duration::from_millis(2000),
        }],
        run_for: RUN,
        queue_capacity: 64,
        seed: 1,
    };
    let out = s.run();
    assert!(out.peer_reports.is_empty(), "{:?}", out.peer_reports);
    // The queue overflowed during the pause (heartbeats dropped): counted.
    assert!(out.drops > 0);
}

#[test]
fn a_stalled_sender_is_fenced_then_reported() {
    let s = DetectorScenario {
        config: config(),
        faults: vec![DetectorFault::Pause {
            target: PauseTarget::SenderHeartbeat,
            at: Duration::from_millis(500),
            len: Duration::from_millis(2000),
        }],
        run_for: RUN,
        queue_capacity: 64,
        seed: 2,
    };
    let out = s.run();
    let fenced = out.fenced_at.expect("fenced");
    let report = *out.peer_reports.first().expect("reported");
    assert!(
        report > fenced,
        "report {report:?} after t_valid {fenced:?}"
    );
    assert!(out.accuracy_violation().is_none());
    check(&s).unwrap();
}

#[test]
fn a_crash_is_reported_within_the_bound() {
    let s = DetectorScenario {
        config: config(),
        faults: vec![DetectorFault::Crash {
            at: Duration::from_millis(1000),
        }],
        run_for: RUN,
        queue_capacity: 64,
        seed: 3,
    };
    check(&s).unwrap();
    let out = s.run();
    let r = out.peer_reports[0].since_origin();
    // Window 150 ms after the last heartbeat, checks every 5 ms.
    assert!(
        r > Duration::from_millis(1150) && r < Duration::from_millis(1180),
        "{r:?}"
    );
}
