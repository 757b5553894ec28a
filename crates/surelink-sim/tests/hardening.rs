//! Regression tests from a review of the core: hostile or unlucky inputs
//! that once ended healthy sessions, stalled a channel, panicked, or cost
//! unbounded work.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink_proto::wire::{self, encode_data, AckWriter, CloseCode, Frame, FrameKind};
use surelink_proto::*;
use surelink_sim::fixture::{identity, World, A, B};

fn cfg() -> EndpointConfig {
    EndpointConfig::default()
}

/// Moves everything node `from` writes to the other end, losing the
/// frames `drop` picks; returns the frames seen.
fn pump(p: &mut World, from: usize, drop: &dyn Fn(&Frame) -> bool) -> Vec<Frame> {
    let mut seen = Vec::new();
    let _ = p.step_with(from, |_, buf| {
        let mut out = BytesMut::new();
        while let Ok(Some(f)) = wire::decode(buf, 1 << 30) {
            if !drop(&f) {
                f.encode(&mut out);
            }
            seen.push(f);
        }
        *buf = out;
    });
    seen
}

/// A few rounds in which each of `nodes` in turn writes and what it
/// writes on `path` arrives; what it writes on other paths is lost.
fn shuttle(p: &mut World, nodes: &[usize], path: PathId) {
    for _ in 0..8 {
        for &n in nodes {
            let _ = p.step_with(n, |on, buf| {
                if on != path {
                    buf.clear();
                }
            });
        }
    }
}

#[test]
fn sequence_number_beyond_the_window_is_refused_without_panic() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    let mut buf = BytesMut::new();
    encode_data(
        &mut buf,
        StreamId::oneway(ChannelId(0)).unwrap(),
        u64::MAX,
        0,
        b"boom",
    );
    let err = p.input(B, PathId(1), &mut buf).unwrap_err();
    assert!(matches!(
        err,
        PathError::Protocol(ProtocolViolation::SeqBeyondWindow { seq: u64::MAX, .. })
    ));
    // The session goes on over the other path.
    p.send(A, B, 0, b"still here");
    p.settle();
    assert_eq!(p.received(B), vec![Bytes::from_static(b"still here")]);
}

#[test]
fn a_dial_reaching_the_wrong_node_leaves_every_session_alone() {
    // A <-> B healthy; one message outstanding.
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    p.send(A, B, 0, b"x");
    p.flush();
    let (sid, _) = p[A].session_with(NodeId(2)).unwrap();
    // A dials "node 2" again, but the address now belongs to C, which also
    // has its own session with A.
    let c = p.push(Endpoint::new(cfg(), identity(3, 77)).unwrap());
    let now = p.now;
    p[A].add_path(now, PathId(10), Some(NodeId(2))).unwrap();
    p[c].add_path(now, PathId(10), None).unwrap();
    p.wire((A, PathId(10)), (c, PathId(10)));
    // What A sees from here on.
    p.clear_events(A);
    shuttle(&mut p, &[A, c], PathId(10));
    let ev_a = p.take_events(A);
    let ev_c = p.take_events(c);
    assert!(
        !ev_a.iter().any(|e| matches!(e, Event::SessionEnded { .. })),
        "{ev_a:#?}"
    );
    assert!(
        !ev_c.iter().any(|e| matches!(e, Event::SessionEnded { .. })),
        "{ev_c:#?}"
    );
    assert!(ev_c.iter().any(|e| matches!(
        e,
        Event::PathClosed {
            reason: PathCloseReason::Error(PathError::Handshake(HandshakeError::WrongNode { .. })),
            ..
        }
    )));
    assert!(ev_a.iter().any(|e| matches!(
        e,
        Event::PathClosed {
            path: PathId(10),
            reason: PathCloseReason::ClosedByPeer {
                code: CloseCode::UNEXPECTED_PEER,
                ..
            },
            ..
        }
    )));
    assert_eq!(p[A].session_with(NodeId(2)).unwrap().0, sid);
    p.settle();
    assert_eq!(p.received(B).len(), 1);
}

#[test]
fn channels_the_peer_does_not_accept_are_rejected_not_fatal() {
    let mut ca = cfg();
    ca.max_channels = 1024;
    let mut p = World::pair(ca);
    // 256 channels.
    p.replace(B, Endpoint::new(cfg(), identity(2, 1)).unwrap());
    // Queued before A knows B's limit.
    p.send(A, B, 300, b"too high");
    p.send(A, B, 0, b"fine");
    p.connect(A, B, PathId(1));
    p.settle();
    assert_eq!(p.received(B), vec![Bytes::from_static(b"fine")]);
    assert!(p.events(A).iter().any(|e| matches!(
        e,
        Event::MessageRejected {
            stream,
            reason: RejectReason::ChannelOutOfRange { max: 256 },
            ..
        } if stream.channel() == Some(ChannelId(300))
    )));
    assert!(!p
        .events(A)
        .iter()
        .any(|e| matches!(e, Event::PathClosed { .. })));
    // Once the limit is known, `send` refuses at once.
    let now = p.now;
    assert!(matches!(
        p[A].send(now, NodeId(2), ChannelId(300), Bytes::new()),
        Err(SendError::ChannelOutOfRange {
            channel: 300,
            max: 256
        })
    ));
}

#[test]
fn a_lost_final_ack_on_a_quiet_channel_is_repaired_while_traffic_flows() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    let keep = |_: &Frame| false;
    for _ in 0..4 {
        pump(&mut p, A, &keep);
        pump(&mut p, B, &keep);
    }
    p.take_events(A);
    p.take_events(B);
    // One message on channel 1; B holds it (its app has not polled yet).
    let now = p.now;
    p[A].send(now, NodeId(2), ChannelId(1), Bytes::from_static(b"quiet"))
        .unwrap();
    pump(&mut p, A, &keep);
    p.now += Duration::from_millis(30);
    p.handle_timeout(B);
    pump(&mut p, B, &keep);
    // The app takes it; the cumulative ACK saying so is lost.
    assert_eq!(p.take_events(B).len(), 1);
    p.now += Duration::from_millis(30);
    p.handle_timeout(B);
    let lost = pump(&mut p, B, &|f| matches!(f, Frame::Ack(_)));
    assert!(lost.iter().any(|f| matches!(f, Frame::Ack(_))));
    // Traffic continues on channel 0 only.
    for _ in 0..200u64 {
        p.now += Duration::from_millis(1);
        let now = p.now;
        p[A].send(now, NodeId(2), ChannelId(0), Bytes::from(vec![0u8; 100]))
            .unwrap();
        p.run_timeouts();
        pump(&mut p, A, &keep);
        p.take_events(B);
        pump(&mut p, B, &keep);
        p.take_events(A);
    }
    p.now += Duration::from_millis(30);
    p.handle_timeout(B);
    pump(&mut p, B, &keep);
    let s = p[A].session_stats(NodeId(2)).unwrap();
    assert_eq!(
        s.cache_messages, 0,
        "the quiet channel's message was released: {s:?}"
    );
}

#[test]
fn a_peer_path_close_is_not_an_input_error() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.connect(A, B, PathId(2));
    p.settle();
    let now = p.now;
    p[A].close_path(now, PathId(1));
    let (path, close) = p.transmit(A).unwrap();
    assert_eq!(path, PathId(1));
    assert_eq!(p.input(B, path, &mut BytesMut::from(&close[..])), Ok(()));
}

#[test]
fn window_probes_back_off_and_carry_no_payload_while_the_peer_app_is_slow() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    let now = p.now;
    p[A].send(
        now,
        NodeId(2),
        ChannelId(0),
        Bytes::from(vec![1u8; 1 << 20]),
    )
    .unwrap();
    // B receives the message but its application never polls.
    p.flush();
    let mut buf = BytesMut::new();
    for f in p.peek_frames(A, PathId(1)) {
        f.encode(&mut buf);
    }
    p.drop_queued(A, PathId(1));
    p.input(B, PathId(1), &mut buf).unwrap();
    p.budget = 1 << 22;
    let mut bytes_a_to_b = 0usize;
    for _ in 0..100 {
        p.now += Duration::from_millis(100);
        p.run_timeouts();
        let to_b = p.step(A);
        assert_eq!(to_b.error, None);
        bytes_a_to_b += to_b.bytes;
        assert_eq!(p.step(B).error, None);
    }
    let s = p[A].session_stats(NodeId(2)).unwrap();
    assert!(
        (1..=8).contains(&s.probes),
        "probes back off exponentially: {}",
        s.probes
    );
    assert_eq!(s.resent, 0, "probes do not re-send the message");
    assert!(
        bytes_a_to_b < 4096,
        "{bytes_a_to_b} bytes of probes in 10 s"
    );
}

#[test]
fn an_ack_naming_a_stream_twice_is_refused() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    for _ in 0..1000 {
        p.send(A, B, 0, b"");
    }
    p.flush();
    let mut ack = BytesMut::new();
    let mut w = AckWriter::begin(&mut ack, FrameKind::Ack, 0);
    for _ in 0..1000 {
        w.entry(
            &mut ack,
            StreamId::oneway(ChannelId(0)).unwrap(),
            0,
            &[(0, 1000)],
        );
    }
    w.finish(&mut ack);
    let err = p.input(A, PathId(1), &mut ack).unwrap_err();
    assert_eq!(
        err,
        PathError::Protocol(ProtocolViolation::RepeatedAckStream(4))
    );
}

#[test]
fn a_late_hello_of_a_dead_session_cannot_bind_a_fresh_one() {
    let mut p = World::pair(cfg());
    // B dials A twice; path 2's HELLO is delayed.
    p.connect(B, A, PathId(1));
    let now = p.now;
    p[B].add_path(now, PathId(2), Some(NodeId(1))).unwrap();
    let mut hello = BytesMut::new();
    let first = p.step_with(B, |path, buf| {
        if path == PathId(2) {
            hello.extend_from_slice(buf);
            buf.clear();
        }
    });
    assert_eq!(first.error, None);
    shuttle(&mut p, &[A, B], PathId(1));
    p.take_events(A);
    // B ends the session; A learns it.
    p[B].close_session(now, NodeId(1));
    shuttle(&mut p, &[A, B], PathId(1));
    assert!(p
        .take_events(A)
        .iter()
        .any(|e| matches!(e, Event::SessionEnded { .. })));
    // A's application sends again: a fresh session, not yet bound.
    let id = p[A]
        .send(now, NodeId(2), ChannelId(0), Bytes::from_static(b"fresh"))
        .unwrap();
    // The delayed HELLO of B's dead session arrives: refused as stale.
    p[A].add_path(now, PathId(2), None).unwrap();
    let err = p.input(A, PathId(2), &mut hello).unwrap_err();
    assert!(
        matches!(err, PathError::Handshake(HandshakeError::Stale { .. })),
        "{err:?}"
    );
    // A's next dial meets B's current state and the fresh message arrives.
    p.connect(A, B, PathId(3));
    shuttle(&mut p, &[A, B], PathId(3));
    assert!(!p
        .take_events(A)
        .iter()
        .any(|e| matches!(e, Event::SessionEnded { session, .. } if *session == id.session)));
    let got: Vec<_> = p
        .take_events(B)
        .into_iter()
        .filter_map(|e| match e {
            Event::Message(m) => Some(m.payload),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![Bytes::from_static(b"fresh")]);
}

/// A quiet path keeps proving itself with keepalive PINGs and stays up; a
/// path whose peer stops answering (half-open, or a member holding the
/// connection without talking) is closed after `path_idle_timeout`.
#[test]
fn quiet_paths_are_kept_alive_and_silent_ones_closed() {
    let mut p = World::pair(cfg());
    p.connect(A, B, PathId(1));
    p.settle();
    assert!(p
        .events(A)
        .iter()
        .any(|e| matches!(e, Event::PathUp { .. })));
    // Ten idle minutes, everything delivered: pings flow, nothing closes.
    let mut pings = 0;
    for _ in 0..600 {
        p.advance(Duration::from_secs(1));
        p.flush();
        pings += p
            .peek_frames(A, PathId(1))
            .iter()
            .chain(p.peek_frames(B, PathId(1)).iter())
            .filter(|f| matches!(f, Frame::Ping(_)))
            .count();
        p.settle();
    }
    assert!(pings >= 600 / 15, "keepalives sent: {pings}");
    assert!(
        pings <= 2 * 600 / 15 + 2,
        "keepalives are not chatty: {pings}"
    );
    let closed = |evs: &[Event]| {
        evs.iter()
            .filter(|e| matches!(e, Event::PathClosed { .. }))
            .count()
    };
    assert_eq!(closed(p.events(A)) + closed(p.events(B)), 0);
    // Now B goes silent: A's path must close as idle, after the timeout
    // and not before.
    let silent_since = p.now;
    let mut closed_at = None;
    // 75 s: past the idle timeout, before the session's linger ends it.
    for _ in 0..75 {
        p.advance(Duration::from_secs(1));
        p.flush();
        p.drop_queued(B, PathId(1));
        p.deliver(A, PathId(1));
        if closed_at.is_none()
            && p.events(A).iter().any(|e| {
                matches!(
                    e,
                    Event::PathClosed {
                        reason: PathCloseReason::Idle,
                        ..
                    }
                )
            })
        {
            closed_at = Some(p.now);
        }
    }
    let after = closed_at
        .expect("the silent path was closed")
        .saturating_since(silent_since);
    let timeout = cfg().path_idle_timeout;
    assert!(
        after >= timeout - Duration::from_secs(15) && after <= timeout + Duration::from_secs(2),
        "closed {after:?} after the peer went silent (timeout {timeout:?})"
    );
    assert_eq!(
        p[A].session_stats(NodeId(2)).map(|s| s.idle_paths_closed),
        Some(1)
    );
}
