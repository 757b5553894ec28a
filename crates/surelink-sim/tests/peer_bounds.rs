//! What one peer can make a node hold is bounded per peer, across its
//! sessions and epochs: a caller that never acknowledges replies is held
//! back by its own flow control once `call_bytes_per_peer` is held, and a
//! peer's new incarnation frees everything its old session held.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink_proto::rpc::CallOptions;
use surelink_proto::wire::{self, Frame};
use surelink_proto::*;
use surelink_sim::fixture::{World, A, B};

/// Small bounds, so a few hundred calls cross them.
fn cfg() -> EndpointConfig {
    let mut c = EndpointConfig::default();
    c.max_message_size = 64 << 10;
    c.send_buffer = 512 << 10;
    c.recv_window = 512 << 10;
    c.path_inflight_limit = 256 << 10;
    c.call_bytes_per_peer = 256 << 10;
    c.validate().unwrap();
    c
}

/// Moves everything node `from` writes to the other end, losing the
/// frames `drop` picks.
fn pump(p: &mut World, from: usize, drop: &dyn Fn(&Frame) -> bool) {
    let _ = p.step_with(from, |_, buf| {
        let mut out = BytesMut::new();
        while let Ok(Some(f)) = wire::decode(buf, 1 << 30) {
            if !drop(&f) {
                f.encode(&mut out);
            }
        }
        *buf = out;
    });
}

/// B answers every request it was handed with its body (an echo server).
fn serve(p: &mut World) {
    p.drain_events();
    let now = p.now;
    for e in p.take_events(B) {
        if let Event::Request(t) = e {
            let _ = p[B].complete(now, t.session, t.call, Ok(t.body));
        }
    }
}

fn answered(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::CallDone { result: Ok(_), .. }))
        .count()
}

#[test]
fn a_caller_that_never_acknowledges_replies_is_held_back_at_the_bound() {
    let c = cfg();
    let mut p = World::pair(c.clone());
    p.connect(A, B, PathId(1));
    p.settle();
    let a = NodeId(1);
    let b = NodeId(2);
    let body = Bytes::from(vec![7u8; 16 << 10]);
    let opts = CallOptions::new(Duration::from_secs(3600));
    const CALLS: usize = 400; // 6.4 MiB of replies: far over every bound
    let mut made = 0;
    let mut most = 0;
    let mut log = Vec::new();
    // The replies' acknowledgements never reach B.
    for _ in 0..200 {
        let now = p.now;
        while made < CALLS && p[A].can_send(b, body.len() + 64) {
            p[A].call(now, b, ChannelId(0), body.clone(), &opts)
                .unwrap();
            made += 1;
        }
        pump(&mut p, A, &|f| matches!(f, Frame::Ack(_)));
        serve(&mut p);
        pump(&mut p, B, &|_| false);
        p.drain_events();
        log.extend(p.take_events(A));
        most = most.max(p[B].peer_held_bytes(a));
        p.advance(Duration::from_millis(1));
    }
    // Whatever it sends, B holds at most its send buffer (replies not
    // acknowledged), its receive window (requests not admitted), the call
    // bound and the reply cache, plus one admitted request's reply.
    let bound = c.send_buffer
        + u64::from(c.recv_window)
        + c.call_bytes_per_peer
        + c.reply_cache_bytes as u64
        + (64 << 10);
    assert!(most <= bound, "B held {most} bytes for A; bound {bound}");
    // It was pushed there, and the caller was held back, not refused.
    assert!(most > c.send_buffer, "B held only {most}");
    assert!(made < CALLS, "the caller was never held back");
    let st = p[B].session_stats(a).unwrap();
    assert!(st.call_bound_hits >= 1);
    assert!(st.call_bytes_held <= c.call_bytes_per_peer + (64 << 10));
    // Acknowledgements flow again: every call is answered, none lost.
    for _ in 0..2000 {
        let now = p.now;
        while made < CALLS && p[A].can_send(b, body.len() + 64) {
            p[A].call(now, b, ChannelId(0), body.clone(), &opts)
                .unwrap();
            made += 1;
        }
        pump(&mut p, A, &|_| false);
        serve(&mut p);
        pump(&mut p, B, &|_| false);
        p.drain_events();
        log.extend(p.take_events(A));
        if made == CALLS && answered(&log) == CALLS {
            break;
        }
        p.advance(Duration::from_millis(1));
    }
    assert_eq!(answered(&log), CALLS);
    p.settle();
    assert_eq!(p[B].session_stats(a).unwrap().call_bytes_held, 0);
}

#[test]
fn a_new_epoch_frees_what_the_old_session_held() {
    let c = cfg();
    let mut p = World::pair(c.clone());
    p.collect_events = false; // B's application takes nothing
    p.connect(A, B, PathId(1));
    p.settle();
    let a = NodeId(1);
    let b = NodeId(2);
    for epoch in 0..5 {
        // Fill B's receive window with one-way messages nobody takes.
        for _ in 0..200 {
            let now = p.now;
            while p[A].can_send(b, 8 << 10) {
                p[A].send(now, b, ChannelId(0), Bytes::from(vec![1u8; 8 << 10]))
                    .unwrap();
            }
            p.settle();
            p.advance(Duration::from_millis(5));
        }
        let held = p[B].peer_held_bytes(a);
        assert!(held > u64::from(c.recv_window) / 2, "epoch {epoch}: {held}");
        // Across every epoch so far, never more than one window.
        assert!(
            held <= u64::from(c.recv_window) + (16 << 10),
            "epoch {epoch}: B holds {held} bytes for A"
        );
        p.restart(A, c.clone());
        p.connect(A, B, PathId(10 + epoch));
        p.settle();
        // The old session is gone with what it held; the new one is empty.
        assert_eq!(p[B].peer_held_bytes(a), 0, "after restart {epoch}");
    }
}
