use std::collections::VecDeque;

use proptest::prelude::*;

use super::*;

fn us(u: u64) -> Time {
    Time::from_nanos(u * 1000)
}

fn self_clocking(max_wait_us: u64, max_frame: usize) -> Batcher {
    Batcher::new(BatcherConfig {
        policy: BatchPolicy::SelfClocking {
            max_wait: Duration::from_micros(max_wait_us),
        },
        max_frame,
        max_pending: max_frame * 4,
    })
    .unwrap()
}

fn adaptive() -> Batcher {
    Batcher::new(BatcherConfig {
        policy: BatchPolicy::Adaptive(AdaptiveConfig::default()),
        ..BatcherConfig::default()
    })
    .unwrap()
}

/// Nothing outstanding: a message goes at once. Then messages gather
/// while the batch is unanswered, and all go together when it is.
#[test]
fn self_clocking_sends_when_everything_is_answered() {
    let mut b = self_clocking(1000, 64 * 1024);
    b.handle_queued(us(0), 100).unwrap();
    assert_eq!(
        b.poll_flush(us(0)),
        Some(Flush {
            messages: 1,
            bytes: 100
        })
    );
    for t in 1..=5 {
        b.handle_queued(us(t), 100).unwrap();
        assert_eq!(b.poll_flush(us(t)), None, "the first is unanswered");
    }
    // Without an answer, the batch is given up on `max_wait` after it went.
    assert_eq!(b.poll_timeout(), Some(us(1000)));
    b.handle_answered(us(10), 1);
    assert_eq!(
        b.poll_flush(us(50)),
        Some(Flush {
            messages: 5,
            bytes: 500
        })
    );
    assert_eq!(b.outstanding(), 5);
    assert_eq!(b.poll_flush(us(50)), None);
    assert_eq!(b.totals(), (2, 6));
}

/// An answer that never comes holds a message no longer than `max_wait`.
#[test]
fn self_clocking_waits_at_most_max_wait() {
    let mut b = self_clocking(200, 64 * 1024);
    b.handle_queued(us(0), 10).unwrap();
    b.poll_flush(us(0)).unwrap();
    b.handle_queued(us(10), 10).unwrap();
    assert_eq!(b.poll_flush(us(199)), None);
    assert_eq!(b.poll_timeout(), Some(us(200)));
    assert!(b.poll_flush(us(200)).is_some());
    // A lost path voids what was outstanding: the next goes at once.
    b.handle_reset();
    b.handle_queued(us(300), 10).unwrap();
    assert!(b.poll_flush(us(300)).is_some());
}

/// A batch the server never answers (an acknowledgement alone, say)
/// holds the next one back only about twice the server's usual answer
/// time, not the whole `max_wait`.
#[test]
fn self_clocking_stops_waiting_for_an_answer_that_is_not_coming() {
    let mut b = self_clocking(1000, 64 * 1024);
    // Three round trips of 50 µs teach it the server's answer time.
    for k in 0..3u64 {
        let t = k * 1000;
        b.handle_queued(us(t), 100).unwrap();
        assert!(b.poll_flush(us(t)).is_some());
        b.handle_answered(us(t + 50), 1);
    }
    assert_eq!(b.answer_wait(), Duration::from_micros(100));
    // An acknowledgement goes out; no answer will come.
    b.handle_queued(us(5000), 40).unwrap();
    assert!(b.poll_flush(us(5000)).is_some());
    // The next request waits for the answer wait, not max_wait.
    b.handle_queued(us(5010), 100).unwrap();
    assert_eq!(b.poll_flush(us(5010)), None);
    assert_eq!(b.poll_timeout(), Some(us(5100)));
    assert_eq!(b.poll_flush(us(5099)), None);
    assert_eq!(
        b.poll_flush(us(5100)),
        Some(Flush {
            messages: 1,
            bytes: 100
        })
    );
    assert_eq!(b.outstanding(), 1, "the unanswered one is void");
}

/// A full frame goes whatever the policy says; the oldest messages that
/// fit, and a message larger than a frame alone.
#[test]
fn a_full_frame_goes_and_an_oversized_message_goes_alone() {
    let mut b = self_clocking(1000, 1000);
    b.handle_queued(us(0), 1).unwrap();
    b.poll_flush(us(0)).unwrap();
    for _ in 0..3 {
        b.handle_queued(us(1), 400).unwrap();
    }
    assert_eq!(
        b.poll_flush(us(1)),
        Some(Flush {
            messages: 2,
            bytes: 800
        }),
        "1 200 bytes wait: the two oldest fill the frame"
    );
    assert_eq!(b.poll_flush(us(1)), None, "400 bytes: not full");
    b.handle_queued(us(2), 3500).unwrap();
    assert_eq!(
        b.poll_flush(us(2)),
        Some(Flush {
            messages: 1,
            bytes: 400
        })
    );
    assert_eq!(
        b.poll_flush(us(2)),
        Some(Flush {
            messages: 1,
            bytes: 3500
        })
    );
}

/// What may wait is bounded; one message alone is always taken.
#[test]
fn waiting_bytes_are_bounded() {
    let mut b = self_clocking(1000, 1000);
    b.handle_queued(us(0), 1).unwrap();
    b.poll_flush(us(0)).unwrap();
    b.handle_queued(us(1), 3000).unwrap();
    assert_eq!(
        b.handle_queued(us(1), 1001),
        Err(BatcherError::Full {
            pending: 3000,
            len: 1001,
            limit: 4000
        })
    );
    b.handle_queued(us(1), 1000).unwrap();
    let mut empty = self_clocking(1000, 1000);
    empty.handle_queued(us(0), 10_000).unwrap();
}

/// Algorithm 1 at light load: a batch goes after `T`; its size, far under
/// `S`, takes `S` down to the floor; a period inside [0.5T, 1.5T] leaves
/// `T` alone.
#[test]
fn adaptive_light_load_waits_t_and_shrinks_s() {
    let mut b = adaptive();
    assert_eq!(b.interval(), Duration::from_micros(100));
    b.handle_queued(us(0), 64).unwrap();
    assert_eq!(b.poll_flush(us(99)), None);
    assert_eq!(b.poll_timeout(), Some(us(100)));
    assert!(b.poll_flush(us(100)).is_some());
    assert_eq!(b.size(), 1500, "64 bytes << S: S to its floor");
    b.handle_queued(us(110), 64).unwrap();
    assert!(b.poll_flush(us(210)).is_some());
    assert_eq!(
        b.interval(),
        Duration::from_micros(100),
        "a period of 110 µs is within [50, 150]"
    );
}

/// Algorithm 1 under load: batches fill before `T`, so `T` follows the
/// shorter period; a burst takes `S` up (to the frame at most); a period
/// under 10 µs is noise; a long idle gap takes `T` to its ceiling only.
#[test]
fn adaptive_heavy_load_retunes_t_and_s() {
    let mut b = adaptive();
    let fill = |b: &mut Batcher, at: u64, n: usize| {
        for _ in 0..n {
            b.handle_queued(us(at), 1000).unwrap();
        }
    };
    fill(&mut b, 0, 9);
    assert_eq!(b.poll_flush(us(0)).unwrap().messages, 9, "9 000 ≥ S");
    fill(&mut b, 20, 9);
    assert!(b.poll_flush(us(20)).is_some());
    assert_eq!(b.interval(), Duration::from_micros(20), "period 20 < 50");
    fill(&mut b, 25, 9);
    assert!(b.poll_flush(us(25)).is_some());
    assert_eq!(
        b.interval(),
        Duration::from_micros(20),
        "a 5 µs period is below the 10 µs floor: not a measurement"
    );
    fill(&mut b, 45, 30);
    assert_eq!(b.poll_flush(us(45)).unwrap().bytes, 30_000);
    assert_eq!(b.size(), 30_000, "a burst: S up");
    fill(&mut b, 1_000_000, 40);
    assert!(b.poll_flush(us(1_000_000)).is_some());
    assert_eq!(b.interval(), Duration::from_millis(1), "T's ceiling");
}

#[test]
fn bad_settings_are_refused() {
    let bad = |cfg: BatcherConfig| Batcher::new(cfg).is_err();
    assert!(bad(BatcherConfig {
        max_frame: 0,
        ..BatcherConfig::default()
    }));
    assert!(bad(BatcherConfig {
        max_pending: 10,
        ..BatcherConfig::default()
    }));
    assert!(bad(BatcherConfig {
        policy: BatchPolicy::SelfClocking {
            max_wait: Duration::ZERO
        },
        ..BatcherConfig::default()
    }));
    for a in [
        AdaptiveConfig {
            min_interval: Duration::ZERO,
            ..AdaptiveConfig::default()
        },
        AdaptiveConfig {
            initial_interval: Duration::from_millis(5),
            ..AdaptiveConfig::default()
        },
        AdaptiveConfig {
            initial_size: 100,
            ..AdaptiveConfig::default()
        },
        AdaptiveConfig {
            min_size: 0,
            ..AdaptiveConfig::default()
        },
    ] {
        assert!(bad(BatcherConfig {
            policy: BatchPolicy::Adaptive(a),
            ..BatcherConfig::default()
        }));
    }
    Batcher::new(BatcherConfig::default()).unwrap();
    adaptive();
}

/// A driver that polls after every arrival and answer and at every
/// timeout, as a shell does. Checks that no message waits past the
/// policy's ceiling, no batch passes the frame unless one message alone
/// does, messages go in order and none is lost, and `T`, `S` stay in
/// their bounds.
fn drive(mut b: Batcher, ceiling: Duration, events: &[(u64, u16, bool)]) {
    let max_frame = 16 * 1024;
    let mut arrivals: VecDeque<(Time, usize)> = VecDeque::new();
    let (mut queued, mut sent) = (0usize, 0usize);
    let mut now = Time::ZERO;
    let mut flush = |b: &mut Batcher, at: Time, arrivals: &mut VecDeque<(Time, usize)>| {
        while let Some(f) = b.poll_flush(at) {
            assert!(f.messages >= 1);
            let mut bytes = 0;
            for _ in 0..f.messages {
                let (t, len) = arrivals.pop_front().expect("no more than queued");
                assert!(
                    at.saturating_since(t) <= ceiling,
                    "waited {:?}",
                    at.saturating_since(t)
                );
                bytes += len;
            }
            assert_eq!(bytes, f.bytes);
            assert!(f.bytes <= max_frame || f.messages == 1);
            sent += f.messages;
        }
    };
    for &(gap_us, len, answer) in events {
        let next = now + Duration::from_micros(gap_us);
        while let Some(t) = b.poll_timeout().filter(|t| *t <= next) {
            flush(&mut b, t.max(now), &mut arrivals);
        }
        now = next;
        if answer {
            let n = b.outstanding();
            b.handle_answered(now, n.div_ceil(2));
        }
        let len = usize::from(len);
        if b.handle_queued(now, len).is_ok() {
            arrivals.push_back((now, len));
            queued += 1;
        }
        flush(&mut b, now, &mut arrivals);
        if let BatchPolicy::Adaptive(a) = &b.cfg.policy {
            assert!(b.interval() >= a.min_interval && b.interval() <= a.max_interval);
            assert!(b.size() >= a.min_size && b.size() <= max_frame);
        }
    }
    while let Some(t) = b.poll_timeout() {
        flush(&mut b, t.max(now), &mut arrivals);
        now = t.max(now);
    }
    assert!(arrivals.is_empty());
    assert_eq!(queued, sent);
}

fn events() -> impl Strategy<Value = Vec<(u64, u16, bool)>> {
    proptest::collection::vec((0u64..400, 1u16..20_000, any::<bool>()), 1..300)
}

proptest! {
    #[test]
    fn self_clocking_bounds_hold(evs in events(), wait in 1u64..2000) {
        let b = Batcher::new(BatcherConfig {
            policy: BatchPolicy::SelfClocking { max_wait: Duration::from_micros(wait) },
            max_frame: 16 * 1024,
            max_pending: 64 * 1024,
        }).unwrap();
        drive(b, Duration::from_micros(wait), &evs);
    }

    #[test]
    fn adaptive_bounds_hold(evs in events(), max in 10u64..3000) {
        let a = AdaptiveConfig {
            initial_interval: Duration::from_micros(max.min(100)),
            max_interval: Duration::from_micros(max),
            initial_size: 4096,
            ..AdaptiveConfig::default()
        };
        let b = Batcher::new(BatcherConfig {
            policy: BatchPolicy::Adaptive(a),
            max_frame: 16 * 1024,
            max_pending: 64 * 1024,
        }).unwrap();
        drive(b, Duration::from_micros(max), &evs);
    }
}
