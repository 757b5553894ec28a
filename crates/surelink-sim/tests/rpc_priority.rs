//! Priority scheduling and at-most-once execution on the simulator: a path
//! stalls (not dead), calls on it time out and are re-sent with high
//! priority; the re-sent ones overtake the server's normal queue, no normal
//! request waits past the aging bound behind high-priority ones, every
//! request runs at most once however often it was sent, and every reply
//! reaches the right call.

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::time::Duration;

use proptest::prelude::*;
use surelink_proto::rpc::Priority;
use surelink_proto::EndpointConfig;
use surelink_sim::rpc::{RpcOutcome, RpcScenario, SchedulerSpec};

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn scenario(stall_at: u64, stall_len: u64, service_us: u64, high_every: u64) -> RpcScenario {
    RpcScenario {
        latency: ms(1),
        stalls: vec![(0, ms(stall_at), ms(stall_len))],
        call_every: ms(1),
        burst: 1,
        background_every: None,
        high_every,
        calls: 500,
        resend_after: ms(60),
        deadline: ms(5000),
        workers: 1,
        service: Duration::from_micros(service_us),
        scheduler: SchedulerSpec::Priority(ms(50)),
        endpoint: EndpointConfig::default(),
        run_for: ms(2500),
    }
}

/// The promises every run must keep.
fn check(s: &RpcScenario, o: &RpcOutcome) -> Result<(), String> {
    if let Some((id, n)) = o.executions.iter().find(|(_, n)| **n > 1) {
        return Err(format!("request {id} executed {n} times"));
    }
    if !o.mismatched.is_empty() {
        return Err(format!(
            "replies matched to the wrong call: {:?}",
            o.mismatched
        ));
    }
    if !o.timed_out.is_empty() {
        return Err(format!("calls timed out: {:?}", o.timed_out));
    }
    if !o.failed.is_empty() {
        return Err(format!("calls failed: {:?}", o.failed));
    }
    if o.replied.len() as u64 != s.calls {
        return Err(format!("{} of {} calls answered", o.replied.len(), s.calls));
    }
    // The starvation bound: a high request that was not a re-send never
    // overtakes a normal one that arrived more than the aging bound before
    // it. (A re-send moves to the head by design.)
    let Some(aging) = s.aging_bound() else {
        return Ok(());
    };
    for d in o
        .dispatched
        .iter()
        .filter(|d| d.priority == Priority::High && !d.was_resent)
    {
        if let Some(w) = d.oldest_normal_waiting {
            let oldest_normal_arrival = d.at.as_nanos().saturating_sub(w.as_nanos() as u64);
            let limit = oldest_normal_arrival + aging.as_nanos() as u64;
            if d.arrived.as_nanos() > limit {
                return Err(format!(
                    "high request {:?} (arrived {:?}) ran at {:?} before a normal one that had waited {w:?} (bound {aging:?})",
                    d.id, d.arrived, d.at
                ));
            }
        }
    }
    Ok(())
}

/// How long re-sent requests still waited after their re-send reached the
/// server (mean, and how many there were).
fn wait_after_resend(o: &RpcOutcome) -> (Duration, usize) {
    let v: Vec<Duration> = o
        .dispatched
        .iter()
        .filter_map(|r| r.resend_arrived.map(|t| r.at.saturating_since(t)))
        .collect();
    let n = v.len();
    (
        v.iter().sum::<Duration>() / u32::try_from(n.max(1)).unwrap(),
        n,
    )
}

#[test]
fn stalled_path_resends_jump_the_queue_and_run_once() {
    // Our client calls in bursts of 8 every 4 ms; another client's requests
    // arrive every 2 ms (its own session); each takes 0.45 ms, one worker:
    // the server is busy (~110 % in bursts) and a queue forms. Path 0
    // stalls for 300 ms; calls on it time out after 30 ms and are re-sent
    // (the originals move to path 1 at the first re-send; later calls are
    // re-sent while their originals wait in the queue).
    let mut s = scenario(100, 300, 450, 0);
    s.call_every = ms(4);
    s.burst = 8;
    s.calls = 600;
    s.workers = 1;
    s.background_every = Some(Duration::from_micros(2000));
    s.resend_after = ms(30);
    let o = s.run();
    check(&s, &o).unwrap();
    assert!(
        o.duplicates > 0,
        "originals arrived after their re-sends ran"
    );
    let resent = o.dispatched.iter().filter(|d| d.was_resent).count();
    assert!(resent > 0, "some requests were re-sent before they ran");
    // The same run without priorities: re-sent requests wait their turn.
    let mut fifo = s.clone();
    fifo.scheduler = SchedulerSpec::Fifo;
    let f = fifo.run();
    check(&fifo, &f).unwrap();
    let (prio_wait, prio_n) = wait_after_resend(&o);
    let (fifo_wait, fifo_n) = wait_after_resend(&f);
    assert!(
        prio_n >= 5 && fifo_n >= 5,
        "re-sends reached queued originals: {prio_n}, {fifo_n}"
    );
    assert!(
        prio_wait * 3 <= fifo_wait,
        "after its re-send arrived, a request waited {prio_wait:?} on average with priorities, {fifo_wait:?} in FIFO"
    );
}

#[test]
fn requests_resent_three_times_run_once() {
    // Both paths stall for 500 ms (nothing fails): every call in the
    // window is re-sent at 60, 180 and 420 ms — the first 80 ms of calls
    // all three times within the stall — and all copies arrive at once
    // when the stall ends. (A re-send takes its session's earlier waiting
    // requests to the head with it, so after the stall the queue drains
    // oldest first, before later third re-sends fall due.)
    let mut s = scenario(100, 500, 700, 0);
    s.stalls.push((1, ms(100), ms(500)));
    let o = s.run();
    check(&s, &o).unwrap();
    let thrice = o.sends.values().filter(|n| **n >= 4).count();
    assert!(thrice > 0, "some calls were re-sent three times");
    assert!(
        o.duplicates as usize >= 3 * thrice,
        "their copies were answered, not run"
    );
    assert!(o.executions.values().all(|n| *n == 1));
}

#[test]
fn fifo_baseline_lets_nothing_overtake() {
    let mut s = scenario(100, 300, 1100, 0);
    s.scheduler = SchedulerSpec::Fifo;
    let o = s.run();
    check(&s, &o).unwrap();
    // Arrival order is dispatch order.
    let mut last = None;
    for d in &o.dispatched {
        if let Some(prev) = last {
            assert!(d.arrived >= prev, "FIFO broke order at request {:?}", d.id);
        }
        last = Some(d.arrived);
    }
}

#[test]
fn user_high_priority_calls_go_first_within_the_aging_bound() {
    let s = scenario(100, 0, 1100, 10);
    let o = s.run();
    check(&s, &o).unwrap();
    let waits = |p: Priority| {
        let mut v: Vec<Duration> = o
            .dispatched
            .iter()
            .filter(|d| d.priority == p)
            .map(|d| d.waited)
            .collect();
        v.sort();
        v[v.len() * 99 / 100]
    };
    assert!(
        waits(Priority::High) * 5 <= waits(Priority::Normal),
        "high p99 wait {:?} vs normal {:?}",
        waits(Priority::High),
        waits(Priority::Normal)
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500),
        ..ProptestConfig::default()
    })]

    #[test]
    fn at_most_once_and_bounded_wait_under_random_stalls(
        stall_at in 0u64..800,
        stall_len in 0u64..600,
        both in any::<bool>(),
        service_us in 500u64..1300,
        high_every in prop_oneof![Just(0u64), 2u64..50],
        burst in 1u64..20,
    ) {
        let mut s = scenario(stall_at, stall_len, service_us, high_every);
        s.burst = burst;
        s.call_every = ms(burst);
        if both {
            s.stalls.push((1, ms(stall_at + stall_len / 3), ms(stall_len)));
        }
        let o = s.run();
        if let Err(e) = check(&s, &o) {
            prop_assert!(false, "{e}\nscenario: {s:?}");
        }
    }
}
