//! Hand-written fault scenarios: each checks the promises on one story.

use std::time::Duration;

use surelink_sim::{Fault, Sim, SimConfig};

fn run(cfg: SimConfig, faults: &[Fault]) -> surelink_sim::SimReport {
    let r = Sim::new(cfg, faults).run(Duration::from_secs(10));
    eprintln!(
        "{:?} drained_at={:?} resent={} refused_full={} steps={}",
        r.tally, r.drained_at, r.resent, r.refused_full, r.steps
    );
    assert!(r.ok(), "violations: {:#?}", r.violations);
    r
}

#[test]
fn no_faults_delivers_everything_once() {
    let r = run(SimConfig::small(1), &[]);
    assert!(r.tally.sent > 1500);
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert_eq!(r.resent, 0);
}

fn d(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[test]
fn connection_reset_mid_stream_costs_resends_not_messages() {
    let r = run(
        SimConfig::small(2),
        &[
            Fault::Reset {
                link: 0,
                at: d(500),
            },
            Fault::Reset {
                link: 1,
                at: d(900),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
}

#[test]
fn link_down_detected_fails_over() {
    // Load balancing keeps one path busy and the other idle; failing each in
    // turn makes sure the busy one fails once.
    let r = run(
        SimConfig::small(3),
        &[
            Fault::LinkDown {
                link: 0,
                at: d(300),
                dur: d(500),
            },
            Fault::LinkDown {
                link: 1,
                at: d(1000),
                dur: d(500),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert!(
        r.resent > 0,
        "the dead path's in-flight messages are re-sent"
    );
}

#[test]
fn link_down_without_detector_recovers_by_timeout() {
    let mut cfg = SimConfig::small(4);
    cfg.detect_after = None;
    let r = run(
        cfg,
        &[Fault::LinkDown {
            link: 1,
            at: d(300),
            dur: d(800),
        }],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert!(r.resent > 0);
}

#[test]
fn one_way_silence_without_detector() {
    let mut cfg = SimConfig::small(5);
    cfg.detect_after = None;
    let r = run(
        cfg,
        &[
            Fault::OneWay {
                link: 0,
                a_to_b: true,
                at: d(200),
                dur: d(1200),
            },
            Fault::OneWay {
                link: 1,
                a_to_b: false,
                at: d(400),
                dur: d(300),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
}

#[test]
fn heavy_loss_on_both_paths() {
    let r = run(
        SimConfig::small(6),
        &[
            Fault::Loss {
                link: 0,
                percent: 40,
                one_way: None,
                at: d(100),
                dur: d(1500),
            },
            Fault::Loss {
                link: 1,
                percent: 30,
                one_way: Some(true),
                at: d(300),
                dur: d(1500),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
}

#[test]
fn both_paths_down_shorter_than_linger() {
    let r = run(
        SimConfig::small(7),
        &[
            Fault::LinkDown {
                link: 0,
                at: d(500),
                dur: d(1000),
            },
            Fault::LinkDown {
                link: 1,
                at: d(600),
                dur: d(1000),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
}

#[test]
fn pause_of_either_end() {
    let r = run(
        SimConfig::small(8),
        &[
            Fault::Pause {
                node: 0,
                at: d(300),
                dur: d(700),
            },
            Fault::Pause {
                node: 1,
                at: d(1200),
                dur: d(400),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
}

#[test]
fn restart_reports_abandoned_never_replays() {
    let r = run(
        SimConfig::small(9),
        &[Fault::Restart {
            node: 1,
            at: d(800),
        }],
    );
    // Messages to the dead incarnation are either delivered before the crash
    // or reported abandoned; the dead sender's own unsent ones may be lost.
    assert_eq!(r.tally.pending, 0);
    assert!(r.tally.abandoned + r.tally.abandoned_but_delivered > 0 || r.tally.sender_died > 0);
}

#[test]
fn outage_longer_than_linger_is_reported() {
    let mut cfg = SimConfig::small(10);
    cfg.endpoint.linger = d(400);
    let r = run(
        cfg,
        &[
            Fault::LinkDown {
                link: 0,
                at: d(500),
                dur: d(1000),
            },
            Fault::LinkDown {
                link: 1,
                at: d(500),
                dur: d(1000),
            },
        ],
    );
    assert!(r.tally.abandoned > 0, "{:?}", r.tally);
    assert_eq!(r.tally.pending, 0);
}

#[test]
fn three_nodes_mixed_faults() {
    let mut cfg = SimConfig::small(11);
    cfg.nodes = 3;
    let r = run(
        cfg,
        &[
            Fault::Reset {
                link: 0,
                at: d(200),
            },
            Fault::LinkDown {
                link: 3,
                at: d(400),
                dur: d(300),
            },
            Fault::Pause {
                node: 2,
                at: d(700),
                dur: d(200),
            },
            Fault::Loss {
                link: 5,
                percent: 20,
                one_way: Some(false),
                at: d(100),
                dur: d(1000),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
}

/// The product's default: every connection authenticated and encrypted.
fn secure(seed: u64) -> SimConfig {
    let mut cfg = SimConfig::small(seed);
    cfg.secure = Some(surelink_proto::secure::Protection::Encrypt);
    cfg
}

#[test]
fn secure_connections_carry_everything_once() {
    let r = run(secure(12), &[]);
    assert!(r.tally.sent > 1500);
    assert_eq!(r.tally.delivered, r.tally.sent);
    // Two links, both ends of each handshake.
    assert_eq!(
        (r.handshakes, r.handshakes_failed, r.records_refused),
        (4, 0, 0)
    );
    // Both paths dial at the start, before either minted a ticket.
    assert_eq!(r.handshakes_resumed, 0);
}

#[test]
fn deleted_bytes_break_the_record_stream_and_the_session_rides_it_out() {
    // Loss inside a connection is, to the record layer, an attacker
    // deleting bytes: the receiver refuses the next record and closes the
    // connection; a new handshake follows, and nothing is lost or doubled.
    let r = run(
        secure(13),
        &[
            Fault::Loss {
                link: 0,
                percent: 20,
                one_way: None,
                at: d(200),
                dur: d(600),
            },
            Fault::Loss {
                link: 1,
                percent: 20,
                one_way: Some(true),
                at: d(600),
                dur: d(600),
            },
        ],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert!(
        r.records_refused > 2,
        "{} streams broken",
        r.records_refused
    );
    assert!(r.handshakes > 4 + 2 * 2, "{} handshake ends", r.handshakes);
    // The reconnections resume with the first handshakes' tickets (both
    // ends of each), and the session's promises hold over them.
    assert!(
        r.handshakes_resumed >= 2 * 2,
        "{} of {} handshake ends resumed",
        r.handshakes_resumed,
        r.handshakes
    );
}

#[test]
fn a_handshake_cut_short_is_timed_out_and_redialled() {
    // Network 1 goes silent one way while its connection is being set up
    // (the simulator dials at t=0): the handshake cannot finish, is
    // dropped at its timeout, and a new one succeeds after the fault.
    let mut cfg = secure(14);
    cfg.detect_after = None; // the handshake timeout, not the detector, must act
    let r = run(
        cfg,
        &[Fault::OneWay {
            link: 0,
            a_to_b: false,
            at: Duration::ZERO,
            dur: d(2500),
        }],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert!(r.handshakes_failed >= 1, "{}", r.handshakes_failed);
}

#[test]
fn mutual_tls_connections_ride_out_deleted_bytes_too() {
    let mut cfg = secure(15);
    cfg.tls = true;
    let r = run(
        cfg,
        &[Fault::Loss {
            link: 0,
            percent: 20,
            one_way: None,
            at: d(200),
            dur: d(600),
        }],
    );
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert!(
        r.records_refused > 0,
        "{} streams broken",
        r.records_refused
    );
    assert!(r.handshakes > 4, "{} handshake ends", r.handshakes);
}
