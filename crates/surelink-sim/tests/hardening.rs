//! Regression tests from a review of the core: hostile or unlucky inputs
//! that once ended healthy sessions, stalled a channel, panicked, or cost
//! unbounded work.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink_proto::wire::{self, encode_data, AckWriter, CloseCode, Frame, FrameKind};
use surelink_proto::*;
use surelink_sim::pair::{identity, Pair, Side};

fn cfg() -> EndpointConfig {
    EndpointConfig::default()
}

/// Moves everything `from` writes into `to`, dropping frames `drop` picks;
/// returns the frames seen.
fn pump(
    from: &mut Endpoint,
    to: &mut Endpoint,
    now: Time,
    drop: &dyn Fn(&Frame) -> bool,
) -> Vec<Frame> {
    let mut seen = Vec::new();
    let mut buf = BytesMut::new();
    while let Some(path) = from.poll_transmit(now, &mut buf, 64 << 10) {
        let mut out = BytesMut::new();
        while let Ok(Some(f)) = wire::decode(&mut buf, 1 << 30) {
            if !drop(&f) {
                f.encode(&mut out);
            }
            seen.push(f);
        }
        let _ = to.handle_input(now, path, &mut out);
    }
    seen
}

fn events(ep: &mut Endpoint) -> Vec<Event> {
    std::iter::from_fn(|| ep.poll_event()).collect()
}

/// Runs every endpoint's output to the endpoint `route` names, a few rounds.
fn shuttle(eps: &mut [&mut Endpoint], route: &dyn Fn(usize, PathId) -> Option<usize>, now: Time) {
    for _ in 0..8 {
        for i in 0..eps.len() {
            let mut buf = BytesMut::new();
            let mut outs = Vec::new();
            while let Some(path) = eps[i].poll_transmit(now, &mut buf, 1 << 16) {
                outs.push((path, buf.split()));
            }
            for (path, mut b) in outs {
                if let Some(j) = route(i, path) {
                    let _ = eps[j].handle_input(now, path, &mut b);
                }
            }
        }
    }
}

#[test]
fn sequence_number_beyond_the_window_is_refused_without_panic() {
    let mut p = Pair::new(cfg());
    p.connect(1);
    p.connect(2);
    p.settle();
    let mut buf = BytesMut::new();
    encode_data(
        &mut buf,
        StreamId::oneway(ChannelId(0)).unwrap(),
        u64::MAX,
        0,
        b"boom",
    );
    let now = p.now;
    let err = p.b.handle_input(now, PathId(1), &mut buf).unwrap_err();
    assert!(matches!(
        err,
        PathError::Protocol(ProtocolViolation::SeqBeyondWindow { seq: u64::MAX, .. })
    ));
    // The session goes on over the other path.
    p.send_ab(0, b"still here");
    p.settle();
    assert_eq!(p.received_b(), vec![Bytes::from_static(b"still here")]);
}

#[test]
fn a_dial_reaching_the_wrong_node_leaves_every_session_alone() {
    // A <-> B healthy; one message outstanding.
    let mut p = Pair::new(cfg());
    p.connect(1);
    p.settle();
    p.send_ab(0, b"x");
    p.flush();
    let (sid, _) = p.a.session_with(NodeId(2)).unwrap();
    // A dials "node 2" again, but the address now belongs to C, which also
    // has its own session with A.
    let mut c = Endpoint::new(cfg(), identity(3, 77)).unwrap();
    let now = p.now;
    p.a.add_path(now, PathId(10), Some(NodeId(2))).unwrap();
    c.add_path(now, PathId(10), None).unwrap();
    shuttle(
        &mut [&mut p.a, &mut c],
        &|i, path| (path == PathId(10)).then_some(1 - i),
        now,
    );
    let ev_a = events(&mut p.a);
    let ev_c = events(&mut c);
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
    assert_eq!(p.a.session_with(NodeId(2)).unwrap().0, sid);
    p.settle();
    assert_eq!(p.received_b().len(), 1);
}

#[test]
fn channels_the_peer_does_not_accept_are_rejected_not_fatal() {
    let mut ca = cfg();
    ca.max_channels = 1024;
    let mut p = Pair::new(ca);
    p.b = Endpoint::new(cfg(), identity(2, 1)).unwrap(); // 256 channels
                                                         // Queued before A knows B's limit.
    p.send_ab(300, b"too high");
    p.send_ab(0, b"fine");
    p.connect(1);
    p.settle();
    assert_eq!(p.received_b(), vec![Bytes::from_static(b"fine")]);
    assert!(p.events_a.iter().any(|e| matches!(
        e,
        Event::MessageRejected {
            stream,
            reason: RejectReason::ChannelOutOfRange { max: 256 },
            ..
        } if stream.channel() == Some(ChannelId(300))
    )));
    assert!(!p
        .events_a
        .iter()
        .any(|e| matches!(e, Event::PathClosed { .. })));
    // Once the limit is known, `send` refuses at once.
    let now = p.now;
    assert!(matches!(
        p.a.send(now, NodeId(2), ChannelId(300), Bytes::new()),
        Err(SendError::ChannelOutOfRange {
            channel: 300,
            max: 256
        })
    ));
}

#[test]
fn a_lost_final_ack_on_a_quiet_channel_is_repaired_while_traffic_flows() {
    let mut a = Endpoint::new(cfg(), identity(1, 1)).unwrap();
    let mut b = Endpoint::new(cfg(), identity(2, 1)).unwrap();
    let mut now = Time::from_millis(1);
    a.add_path(now, PathId(1), Some(NodeId(2))).unwrap();
    b.add_path(now, PathId(1), None).unwrap();
    let keep = |_: &Frame| false;
    for _ in 0..4 {
        pump(&mut a, &mut b, now, &keep);
        pump(&mut b, &mut a, now, &keep);
    }
    events(&mut a);
    events(&mut b);
    // One message on channel 1; B holds it (its app has not polled yet).
    a.send(now, NodeId(2), ChannelId(1), Bytes::from_static(b"quiet"))
        .unwrap();
    pump(&mut a, &mut b, now, &keep);
    now += Duration::from_millis(30);
    b.handle_timeout(now);
    pump(&mut b, &mut a, now, &keep);
    // The app takes it; the cumulative ACK saying so is lost.
    assert_eq!(events(&mut b).len(), 1);
    now += Duration::from_millis(30);
    b.handle_timeout(now);
    let lost = pump(&mut b, &mut a, now, &|f| matches!(f, Frame::Ack(_)));
    assert!(lost.iter().any(|f| matches!(f, Frame::Ack(_))));
    // Traffic continues on channel 0 only.
    for _ in 0..200u64 {
        now += Duration::from_millis(1);
        a.send(now, NodeId(2), ChannelId(0), Bytes::from(vec![0u8; 100]))
            .unwrap();
        for ep in [&mut a, &mut b] {
            if ep.poll_timeout().is_some_and(|t| t <= now) {
                ep.handle_timeout(now);
            }
        }
        pump(&mut a, &mut b, now, &keep);
        events(&mut b);
        pump(&mut b, &mut a, now, &keep);
        events(&mut a);
    }
    now += Duration::from_millis(30);
    b.handle_timeout(now);
    pump(&mut b, &mut a, now, &keep);
    let s = a.session_stats(NodeId(2)).unwrap();
    assert_eq!(
        s.cache_messages, 0,
        "the quiet channel's message was released: {s:?}"
    );
}

#[test]
fn a_peer_path_close_is_not_an_input_error() {
    let mut p = Pair::new(cfg());
    p.connect(1);
    p.connect(2);
    p.settle();
    let now = p.now;
    p.a.close_path(now, PathId(1));
    let mut buf = BytesMut::new();
    assert_eq!(p.a.poll_transmit(now, &mut buf, 1 << 16), Some(PathId(1)));
    assert_eq!(p.b.handle_input(now, PathId(1), &mut buf), Ok(()));
}

#[test]
fn window_probes_back_off_and_carry_no_payload_while_the_peer_app_is_slow() {
    let mut p = Pair::new(cfg());
    p.connect(1);
    p.settle();
    p.a.send(
        p.now,
        NodeId(2),
        ChannelId(0),
        Bytes::from(vec![1u8; 1 << 20]),
    )
    .unwrap();
    // B receives the message but its application never polls.
    p.flush();
    let now = p.now;
    let mut buf = BytesMut::new();
    for f in p.peek_frames(1, Side::A) {
        f.encode(&mut buf);
    }
    p.drop_queued(1, Side::A);
    p.b.handle_input(now, PathId(1), &mut buf).unwrap();
    let mut bytes_a_to_b = 0usize;
    for _ in 0..100 {
        p.now += Duration::from_millis(100);
        let now = p.now;
        for ep in [&mut p.a, &mut p.b] {
            if ep.poll_timeout().is_some_and(|t| t <= now) {
                ep.handle_timeout(now);
            }
        }
        let mut buf = BytesMut::new();
        while let Some(path) = p.a.poll_transmit(now, &mut buf, 1 << 22) {
            bytes_a_to_b += buf.len();
            p.b.handle_input(now, path, &mut buf).unwrap();
        }
        while let Some(path) = p.b.poll_transmit(now, &mut buf, 1 << 22) {
            p.a.handle_input(now, path, &mut buf).unwrap();
        }
    }
    let s = p.a.session_stats(NodeId(2)).unwrap();
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
    let mut p = Pair::new(cfg());
    p.connect(1);
    p.settle();
    for _ in 0..1000 {
        p.send_ab(0, b"");
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
    let now = p.now;
    let err = p.a.handle_input(now, PathId(1), &mut ack).unwrap_err();
    assert_eq!(
        err,
        PathError::Protocol(ProtocolViolation::RepeatedAckStream(4))
    );
}

#[test]
fn a_late_hello_of_a_dead_session_cannot_bind_a_fresh_one() {
    let mut a = Endpoint::new(cfg(), identity(1, 1)).unwrap();
    let mut b = Endpoint::new(cfg(), identity(2, 1)).unwrap();
    let now = Time::from_millis(1);
    // B dials A twice; path 2's HELLO is delayed.
    b.add_path(now, PathId(1), Some(NodeId(1))).unwrap();
    b.add_path(now, PathId(2), Some(NodeId(1))).unwrap();
    a.add_path(now, PathId(1), None).unwrap();
    let mut hello = BytesMut::new();
    let mut buf = BytesMut::new();
    while let Some(path) = b.poll_transmit(now, &mut buf, 1 << 16) {
        if path == PathId(2) {
            hello.extend_from_slice(&buf);
        } else {
            a.handle_input(now, path, &mut buf).unwrap();
        }
        buf.clear();
    }
    shuttle(
        &mut [&mut a, &mut b],
        &|i, p| (p == PathId(1)).then_some(1 - i),
        now,
    );
    events(&mut a);
    // B ends the session; A learns it.
    b.close_session(now, NodeId(1));
    shuttle(
        &mut [&mut a, &mut b],
        &|i, p| (p == PathId(1)).then_some(1 - i),
        now,
    );
    assert!(events(&mut a)
        .iter()
        .any(|e| matches!(e, Event::SessionEnded { .. })));
    // A's application sends again: a fresh session, not yet bound.
    let id = a
        .send(now, NodeId(2), ChannelId(0), Bytes::from_static(b"fresh"))
        .unwrap();
    // The delayed HELLO of B's dead session arrives: refused as stale.
    a.add_path(now, PathId(2), None).unwrap();
    let err = a.handle_input(now, PathId(2), &mut hello).unwrap_err();
    assert!(
        matches!(err, PathError::Handshake(HandshakeError::Stale { .. })),
        "{err:?}"
    );
    // A's next dial meets B's current state and the fresh message arrives.
    a.add_path(now, PathId(3), Some(NodeId(2))).unwrap();
    b.add_path(now, PathId(3), None).unwrap();
    shuttle(
        &mut [&mut a, &mut b],
        &|i, p| (p == PathId(3)).then_some(1 - i),
        now,
    );
    assert!(!events(&mut a)
        .iter()
        .any(|e| matches!(e, Event::SessionEnded { session, .. } if *session == id.session)));
    let got: Vec<_> = events(&mut b)
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
    let mut p = Pair::new(cfg());
    p.connect(1);
    p.settle();
    assert!(p.events_a.iter().any(|e| matches!(e, Event::PathUp { .. })));
    // Ten idle minutes, everything delivered: pings flow, nothing closes.
    let mut pings = 0;
    for _ in 0..600 {
        p.advance(Duration::from_secs(1));
        p.flush();
        pings += p
            .peek_frames(1, Side::A)
            .iter()
            .chain(p.peek_frames(1, Side::B).iter())
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
    assert_eq!(closed(&p.events_a) + closed(&p.events_b), 0);
    // Now B goes silent: A's path must close as idle, after the timeout
    // and not before.
    let silent_since = p.now;
    let mut closed_at = None;
    // 75 s: past the idle timeout, before the session's linger ends it.
    for _ in 0..75 {
        p.advance(Duration::from_secs(1));
        p.flush();
        p.drop_queued(1, Side::B);
        p.deliver(1, Side::A);
        if closed_at.is_none()
            && p.events_a.iter().any(|e| {
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
        p.a.session_stats(NodeId(2)).map(|s| s.idle_paths_closed),
        Some(1)
    );
}
