//! Targeted checks of the session rules on a hand-driven pair: SQR re-send
//! order, the resume handshake, restarts, backpressure, and refusal of bad
//! input without harm to other paths.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink_proto::wire::{Frame, DATA_FLAG_RETRANSMIT};
use surelink_proto::*;
use surelink_sim::fixture::{identity, World, A, B};

const A_ID: NodeId = NodeId(1);
const B_ID: NodeId = NodeId(2);

fn cfg() -> EndpointConfig {
    EndpointConfig::default()
}

/// Every message in DATA and BATCH frames: its number and its frame's flags.
fn data_frames(frames: &[Frame]) -> Vec<(u64, u16)> {
    frames
        .iter()
        .flat_map(|f| match f {
            Frame::Data(d) => vec![(d.seq, d.flags)],
            Frame::Batch(b) => (b.first..b.end()).map(|q| (q, b.flags)).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// A pair on two paths with five messages in flight on one of them:
/// `(world, that path, the other)`.
fn five_in_flight_on_one_of_two_paths() -> (World, u64, u64) {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    for _ in 0..5 {
        p.send(A, B, 0, b"before");
    }
    p.flush();
    // All five went to one path (balance keeps the last path while light).
    let (busy, idle) = if data_frames(&p.peek_frames(A, PathId(1))).len() == 5 {
        (1, 2)
    } else {
        (2, 1)
    };
    assert_eq!(data_frames(&p.peek_frames(A, PathId(busy))).len(), 5);
    (p, busy, idle)
}

/// The app sends one more; `path` then carries the re-sends of 0..5
/// first, flagged, then the new message 5.
fn send_one_and_expect_resends_first_on(p: &mut World, path: u64) {
    p.send(A, B, 0, b"after");
    p.flush();
    let frames = data_frames(&p.peek_frames(A, PathId(path)));
    assert_eq!(frames.len(), 6, "{frames:?}");
    for (i, (seq, flags)) in frames.iter().enumerate().take(5) {
        assert_eq!(*seq, i as u64);
        assert_ne!(flags & DATA_FLAG_RETRANSMIT, 0);
    }
    assert_eq!(frames[5], (5, 0));
}

#[test]
fn failed_path_in_flight_is_resent_first_on_the_survivor() {
    let (mut p, busy, idle) = five_in_flight_on_one_of_two_paths();
    // The busy path dies with its bytes; then the app sends more.
    p.drop_queued(A, PathId(busy));
    let now = p.now;
    p[A].handle_path_down(now, PathId(busy));
    send_one_and_expect_resends_first_on(&mut p, idle);
    p.settle();
    assert_eq!(p.received(B).len(), 6);
    let closed = p
        .events(A)
        .iter()
        // The five went as one batch: one frame moved.
        .any(|e| matches!(e, Event::PathClosed { resent: 1, .. }));
    assert!(closed, "{:?}", p.events(A));
}

/// The detector fails a late path over without tearing it down: what was
/// in flight on it is re-sent on the other path first, the late copies
/// that arrive after are dropped as duplicates, and the path is trusted
/// again once it answers the probe.
#[test]
fn a_suspected_path_is_evacuated_kept_and_trusted_again_when_it_answers() {
    let (mut p, late, other) = five_in_flight_on_one_of_two_paths();
    let now = p.now;
    assert!(p[A].handle_path_suspect(now, PathId(late)));
    assert!(!p[A].handle_path_suspect(now, PathId(9)), "no such path");
    let suspect = |p: &World| {
        p[A].session_stats(B_ID)
            .unwrap()
            .paths
            .iter()
            .find(|s| s.id == PathId(late))
            .map(|s| s.suspect)
    };
    assert_eq!(suspect(&p), Some(true));
    send_one_and_expect_resends_first_on(&mut p, other);
    // The other path's frames arrive first, then the late path's copies
    // (and its probe): each message once, in order.
    p.deliver(A, PathId(other));
    p.settle();
    let got = p.received(B);
    assert_eq!(got.len(), 6);
    assert!(got[..5].iter().all(|m| &m[..] == b"before"));
    assert_eq!(&got[5][..], b"after");
    assert!(p[B].session_stats(A_ID).unwrap().duplicates_received >= 1);
    assert_eq!(suspect(&p), Some(false), "answered its probe");
    // No path closed: the connection stayed.
    assert!(
        !p.events(A)
            .iter()
            .any(|e| matches!(e, Event::PathClosed { .. })),
        "{:?}",
        p.events(A)
    );
}

/// The soak's slowest calls (seed 1796553979681814): path 1 lost both
/// ways for 1.5 s while path 2 loses A's frames for its first 0.7 s.
/// Returns when B has all three messages sent at the start, from the
/// start. Path 2 works again at 0.7 s; before then every path has backed
/// its timer off many times.
fn outage_then_recovery(c: EndpointConfig) -> Duration {
    let mut p = World::pair(c);
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    let start = p.now;
    let mut sent = 0;
    loop {
        let t = p.now.saturating_since(start);
        // A message every 5 ms until path 2 is back (as the soak's calls).
        if t < Duration::from_millis(700) {
            p.send(A, B, 0, b"m");
            sent += 1;
        }
        if t == Duration::from_millis(50) {
            // B's detector hears nothing from A: both paths suspected.
            let now = p.now;
            p[B].handle_path_suspect(now, PathId(1));
            p[B].handle_path_suspect(now, PathId(2));
        }
        p.flush();
        if t < Duration::from_millis(1500) {
            p.drop_queued(A, PathId(1));
        }
        if t < Duration::from_millis(700) {
            p.drop_queued(A, PathId(2));
        }
        p.deliver_all();
        if p.received(B).len() == sent && t >= Duration::from_millis(700) {
            return t;
        }
        assert!(t < Duration::from_secs(10), "never delivered");
        p.advance(Duration::from_millis(5));
    }
}

/// After an outage of every path, a path whose fault ended is probed at
/// least every `max_probe_interval` however far its timer backed off, and
/// its PONG re-sends what waited at once: B has everything within a probe
/// interval of path 2 coming back, not when the backed-off probe would
/// have found it.
#[test]
fn after_an_outage_the_first_path_back_carries_what_waited_within_a_probe_interval() {
    let mut c = cfg();
    c.min_rto = Duration::from_millis(20);
    let back = Duration::from_millis(700);
    let bound = back + c.max_probe_interval;
    let got = outage_then_recovery(c.clone());
    assert!(
        got >= back && got <= bound,
        "delivered {got:?} after the start; path 2 back at {back:?}"
    );
    // The control: probes backing off with the timers (as before this
    // rule) miss that bound.
    c.max_probe_interval = c.max_rto;
    let slow = outage_then_recovery(c);
    assert!(slow > bound, "control took {slow:?}");
}

/// Messages in flight on a path that loses everything, its timer backed
/// off, go out at once on a path that comes up meanwhile (a re-dial on
/// the network that came back) — not when the dead path's timer fires:
/// delivery is in order, so they would hold back everything behind them.
#[test]
fn a_new_path_carries_at_once_what_waits_on_a_suspected_one() {
    let mut c = cfg();
    c.min_rto = Duration::from_millis(20);
    let mut p = World::pair(c);
    p.connect(A, B, PathId(1));
    p.settle();
    for _ in 0..3 {
        p.send(A, B, 0, b"m");
    }
    // Path 1 loses all A sends for 300 ms: its timer backs off.
    for _ in 0..60 {
        p.flush();
        p.drop_queued(A, PathId(1));
        p.deliver_all();
        p.advance(Duration::from_millis(5));
    }
    assert_eq!(p.received(B).len(), 0);
    assert!(p[A].session_stats(B_ID).unwrap().timeouts >= 1);
    // Path 2 comes up; path 1 still loses everything. No time passes.
    p.connect(A, B, PathId(2));
    for _ in 0..8 {
        p.flush();
        p.drop_queued(A, PathId(1));
        p.deliver_all();
    }
    assert_eq!(p.received(B).len(), 3, "waited for path 1's timer");
    assert!(p[A].session_stats(B_ID).unwrap().resent_on_answer >= 1);
}

#[test]
fn resume_resends_exactly_what_is_missing() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    for _ in 0..10 {
        p.send(A, B, 3, b"m");
    }
    p.flush();
    // B gets the data, but its acknowledgements are lost with the connection.
    p.deliver(A, PathId(1));
    p.flush();
    p.drop_queued(B, PathId(1));
    assert_eq!(p.received(B).len(), 10);
    let now = p.now;
    p[A].handle_path_down(now, PathId(1));
    p[B].handle_path_down(now, PathId(1));
    // Three more while no path exists.
    for _ in 0..3 {
        p.send(A, B, 3, b"n");
    }
    // Reconnect: the RESUME tells A that B has 0..10, so only 10..13 go out.
    p.connect(A, B, PathId(2));
    p.settle();
    let received = p.received(B);
    assert_eq!(received.len(), 13);
    p.advance(Duration::from_millis(30)); // let B's delayed ack go out
    p.settle();
    let stats = p[A].session_stats(NodeId(2)).unwrap();
    assert_eq!(stats.resent, 0, "nothing B had was sent again");
    assert_eq!(stats.cache_messages, 0);
    assert_eq!(
        p[B].session_stats(NodeId(1)).unwrap().duplicates_received,
        0
    );
}

#[test]
fn restarted_peer_fails_outstanding_and_gets_nothing_replayed() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    let first = p.send(A, B, 0, b"delivered");
    p.settle();
    p.advance(Duration::from_millis(30)); // its acknowledgement reaches A
    p.settle();
    // Two messages leave A, but B dies before reading them.
    p.send(A, B, 0, b"lost-1");
    p.send(A, B, 1, b"lost-2");
    p.flush();
    p.restart(B, cfg());
    let now = p.now;
    p[A].handle_path_down(now, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    let ended = p.events(A).iter().find_map(|e| match e {
        Event::SessionEnded {
            reason,
            abandoned,
            session,
            ..
        } => Some((reason.clone(), abandoned.clone(), *session)),
        _ => None,
    });
    let (reason, abandoned, session) = ended.expect("A reports the old session ended");
    assert_eq!(session, first.session);
    // A dialled the new process, which refused A's HELLO for naming the old
    // epoch: A learns of the restart but not (yet) the new epoch.
    assert_eq!(
        reason,
        SessionEndReason::PeerRestarted {
            old: Epoch(1),
            new: None
        }
    );
    assert_eq!(
        abandoned,
        vec![
            Abandoned {
                stream: StreamId::oneway(ChannelId(0)).unwrap(),
                start: 1,
                end: 2
            },
            Abandoned {
                stream: StreamId::oneway(ChannelId(1)).unwrap(),
                start: 0,
                end: 1
            }
        ]
    );
    assert!(
        p.received(B).is_empty(),
        "nothing replayed into the new process"
    );
    // The new session works and starts numbering afresh.
    let id = p.send(A, B, 0, b"fresh");
    assert_ne!(id.session, first.session);
    assert_eq!(id.seq, 0);
    // The refused path closed; the shell dials again.
    p.connect(A, B, PathId(3));
    p.settle();
    assert_eq!(p.received(B), vec![Bytes::from_static(b"fresh")]);
}

#[test]
fn full_send_buffer_hands_the_message_back() {
    let mut c = cfg();
    c.max_message_size = 1000;
    c.send_buffer = 4 * (1000 + MESSAGE_OVERHEAD);
    let mut p = World::pair(c);
    let big = Bytes::from(vec![7u8; 1000]);
    let now = p.now;
    for _ in 0..4 {
        p[A].send(now, NodeId(2), ChannelId(0), big.clone())
            .unwrap();
    }
    let err = p[A]
        .send(now, NodeId(2), ChannelId(0), big.clone())
        .unwrap_err();
    assert!(matches!(&err, SendError::Full { buffered, limit, .. } if buffered == limit));
    assert_eq!(err.into_message(), Some(big.clone()));
    // Once the peer has them (and acknowledges, after at most max_ack_delay),
    // there is room again.
    p.connect(A, B, PathId(1));
    p.settle();
    p.advance(Duration::from_millis(30));
    p.settle();
    let now = p.now;
    assert!(p[A].send(now, NodeId(2), ChannelId(0), big).is_ok());
}

#[test]
fn send_errors_are_typed() {
    let mut p = World::pair(cfg());
    let now = p.now;
    assert!(matches!(
        p[A].send(now, NodeId(2), ChannelId(999), Bytes::new()),
        Err(SendError::ChannelOutOfRange { channel: 999, .. })
    ));
    assert!(matches!(
        p[A].send(now, NodeId(1), ChannelId(0), Bytes::new()),
        Err(SendError::SelfSend(_))
    ));
    let huge = Bytes::from(vec![0u8; (1 << 20) + 1]);
    assert!(matches!(
        p[A].send(now, NodeId(2), ChannelId(0), huge),
        Err(SendError::TooLarge { .. })
    ));
    assert!(matches!(
        p[A].add_path(now, PathId(5), Some(NodeId(1))),
        Err(AddPathError::SelfDial(_))
    ));
    p[A].add_path(now, PathId(5), Some(NodeId(2))).unwrap();
    assert_eq!(
        p[A].add_path(now, PathId(5), Some(NodeId(2))),
        Err(AddPathError::Duplicate(PathId(5)))
    );
}

#[test]
fn garbage_closes_only_its_path() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    p.send(A, B, 0, b"x");
    p.settle();
    // A raw socket sends junk on a third, accepted connection of B.
    let now = p.now;
    p[B].add_path(now, PathId(9), None).unwrap();
    let mut junk = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
    let err = p.input(B, PathId(9), &mut junk).unwrap_err();
    assert!(
        matches!(err, PathError::Decode(wire::DecodeError::Version(b'G'))),
        "{err:?}"
    );
    // B answers with a CLOSE and reports the path closed, with the error.
    let (path, out) = p.transmit(B).unwrap();
    assert_eq!(path, PathId(9));
    let close = wire::decode(&mut BytesMut::from(&out[..]), 1 << 20)
        .unwrap()
        .unwrap();
    assert!(matches!(
        close,
        Frame::Close(wire::Close {
            code: wire::CloseCode::MALFORMED,
            ..
        })
    ));
    p.drain_events();
    assert!(p.events(B).iter().any(|e| matches!(
        e,
        Event::PathClosed {
            path: PathId(9),
            reason: PathCloseReason::Error(PathError::Decode(_)),
            ..
        }
    )));
    // The session with A is untouched.
    p.send(A, B, 0, b"y");
    p.settle();
    assert_eq!(p.received(B).len(), 2);
    assert_eq!(p[A].session_stats(NodeId(2)).unwrap().paths.len(), 2);
}

#[test]
fn oversized_frame_is_refused_from_its_header() {
    let mut p = World::pair(cfg());
    let now = p.now;
    p[B].add_path(now, PathId(1), None).unwrap();
    // Header only: version 1, DATA, flags 0, body length 2^31.
    let mut hdr = BytesMut::from(&[1u8, 3, 0, 0, 0x80, 0, 0, 0][..]);
    let err = p.input(B, PathId(1), &mut hdr).unwrap_err();
    assert!(matches!(
        err,
        PathError::Decode(wire::DecodeError::TooLarge {
            len: 0x8000_0000,
            ..
        })
    ));
}

#[test]
fn wrong_cluster_is_refused() {
    let mut p = World::pair(cfg());
    let stranger = Endpoint::new(
        cfg(),
        LocalIdentity {
            cluster: ClusterId(99),
            ..identity(2, 1)
        },
    )
    .unwrap();
    p.replace(B, stranger);
    p.connect(A, B, PathId(1));
    p.settle();
    assert!(p.events(B).iter().any(|e| matches!(
        e,
        Event::PathClosed {
            reason: PathCloseReason::Error(PathError::Handshake(
                HandshakeError::WrongCluster { .. }
            )),
            ..
        }
    )));
    assert!(p.events(A).iter().any(|e| matches!(
        e,
        Event::PathClosed {
            reason: PathCloseReason::ClosedByPeer {
                code: wire::CloseCode::WRONG_CLUSTER,
                ..
            },
            ..
        }
    )));
}

#[test]
fn stalled_path_times_out_and_its_messages_move() {
    let mut c = cfg();
    c.min_rto = Duration::from_millis(50);
    let mut p = World::pair(c);
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    for _ in 0..3 {
        p.send(A, B, 0, b"s");
    }
    p.flush();
    let busy = if data_frames(&p.peek_frames(A, PathId(1))).len() == 3 {
        1
    } else {
        2
    };
    // The busy path silently eats everything (not dead as far as anyone knows).
    p.drop_queued(A, PathId(busy));
    p.advance(Duration::from_millis(300));
    p.settle();
    assert_eq!(p.received(B).len(), 3);
    let s = p[A].session_stats(NodeId(2)).unwrap();
    // Re-sent as the frame they went in (one batch of three).
    assert!(s.timeouts >= 1 && s.resent >= 1, "{s:?}");
}

#[test]
fn duplicate_deliveries_are_suppressed() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    p.send(A, B, 0, b"once");
    p.flush();
    let frames = p.peek_frames(A, PathId(1));
    p.deliver(A, PathId(1));
    // Replay the same DATA frame (a re-send after a lost ack).
    let mut again = BytesMut::new();
    for f in frames {
        f.encode(&mut again);
    }
    p.input(B, PathId(1), &mut again).unwrap();
    p.drain_events();
    assert_eq!(p.received(B).len(), 1);
    assert_eq!(
        p[B].session_stats(NodeId(1)).unwrap().duplicates_received,
        1
    );
}

#[test]
fn a_high_priority_message_keeps_its_channel_and_its_header_counts() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    let now = p.now;
    p[A].send_with(
        now,
        NodeId(2),
        ChannelId(7),
        rpc::Priority::High,
        Bytes::from_static(b"urgent"),
    )
    .unwrap();
    p.settle();
    let got: Vec<(ChannelId, rpc::Priority, Bytes)> = p
        .events(B)
        .iter()
        .filter_map(|e| match e {
            Event::Message(m) => Some((m.channel, m.priority, m.payload.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        vec![(
            ChannelId(7),
            rpc::Priority::High,
            Bytes::from_static(b"urgent")
        )]
    );
    // The message layer's header counts against the limits like the payload.
    let mut c = cfg();
    c.max_message_size = 8;
    c.batch_bytes = 64;
    let mut q = World::pair(c);
    let now = q.now;
    let err = q[A]
        .send_with(
            now,
            NodeId(2),
            ChannelId(0),
            rpc::Priority::High,
            Bytes::from_static(b"12345678"),
        )
        .unwrap_err();
    assert_eq!(err, SendError::TooLarge { len: 9, max: 8 });
}

#[test]
fn role_messages_cross_the_session_ahead_of_data() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    p.send(A, B, 0, b"data");
    let now = p.now;
    p[A].send_role(now, NodeId(2), Bytes::from_static(b"table row"))
        .expect("queued");
    p.flush();
    let frames = p.peek_frames(A, PathId(1));
    let role = frames
        .iter()
        .position(|f| matches!(f, Frame::RouteUpdate(m) if m.as_ref() == b"table row"));
    let data = frames.iter().position(|f| matches!(f, Frame::Data(_)));
    assert!(role.is_some() && role < data, "{frames:?}");
    p.settle();
    assert_eq!(
        p[B].poll_role(),
        Some((NodeId(1), Bytes::from_static(b"table row")))
    );
    assert_eq!(p[B].poll_role(), None);
    assert_eq!(p.received(B).len(), 1);
    // Too large for the role protocol: a typed error, nothing queued.
    let big = Bytes::from(vec![0u8; role::MAX_ROLE_MESSAGE + 1]);
    assert!(matches!(
        p[A].send_role(now, NodeId(2), big),
        Err(RoleSendError::TooLarge { .. })
    ));
}

#[test]
fn role_queue_keeps_the_newest() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    let now = p.now;
    for i in 0..(u32::try_from(ROLE_QUEUE).expect("small") + 5) {
        p[A].send_role(now, NodeId(2), Bytes::from(i.to_be_bytes().to_vec()))
            .expect("queued");
    }
    p.settle();
    let got: Vec<u32> = std::iter::from_fn(|| p[B].poll_role())
        .map(|(_, m)| u32::from_be_bytes(m.as_ref().try_into().expect("4 bytes")))
        .collect();
    let want: Vec<u32> = (5..u32::try_from(ROLE_QUEUE).expect("small") + 5).collect();
    assert_eq!(got, want);
    assert_eq!(
        p[A].session_stats(NodeId(2)).expect("session").role_dropped,
        5
    );
}

/// A peer cannot make a session hold more than [`ROLE_QUEUE_BYTES`] of
/// role messages: long ones are dropped oldest first by bytes too.
#[test]
fn role_queue_is_bounded_in_bytes() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    let now = p.now;
    // Each a little over a quarter of the bound: three fit.
    let len = ROLE_QUEUE_BYTES / 4 + 1;
    for i in 0..8u8 {
        p[A].send_role(now, NodeId(2), Bytes::from(vec![i; len]))
            .expect("queued");
    }
    assert_eq!(
        p[A].session_stats(NodeId(2)).expect("session").role_dropped,
        5
    );
    p.settle();
    let got: Vec<u8> = std::iter::from_fn(|| p[B].poll_role())
        .map(|(_, m)| {
            assert_eq!(m.len(), len);
            m[0]
        })
        .collect();
    assert_eq!(got, vec![5, 6, 7]);
}

#[test]
fn avoided_network_carries_new_traffic_only_when_nothing_else_can() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    // Path 1 (the one light traffic would stay on) is on network 1.
    p[A].set_path_network(PathId(1), 1);
    p[A].set_path_network(PathId(2), 0);
    p.settle();
    // The table steers A's traffic to B off network 1 (path 1).
    assert!(p[A].set_avoided_networks(NodeId(2), 0b10));
    let mut on_2 = 0;
    for _ in 0..40 {
        p.send(A, B, 0, b"steered");
        p.flush();
        assert!(data_frames(&p.peek_frames(A, PathId(1))).is_empty());
        on_2 += data_frames(&p.peek_frames(A, PathId(2))).len();
        p.deliver(A, PathId(1));
        p.deliver(A, PathId(2));
    }
    assert_eq!(on_2, 40);
    p.settle();
    // Network 0's path fails: the avoided one is better than none.
    let now = p.now;
    p[A].handle_path_down(now, PathId(2));
    p.send(A, B, 0, b"only network 1 left");
    p.flush();
    // (After the re-sends of what B's application had not taken yet.)
    let frames = data_frames(&p.peek_frames(A, PathId(1)));
    assert_eq!(frames.last(), Some(&(40, 0)), "{frames:?}");
    p.settle();
    assert_eq!(p.received(B).len(), 41);
}
