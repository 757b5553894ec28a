//! When queued messages reach the socket (`WriteBatching`), on real
//! loopback sockets: a turn's messages in one write on a one-thread
//! runtime, a lone message written inside `send` with several workers, and
//! nothing lost or reordered either way.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use surelink::proto::NodeId;
use surelink::testing::{Loopback, LoopbackPair};
use surelink::{Request, WriteBatching};

const SERVER: NodeId = NodeId(1);

async fn pair(policy: WriteBatching) -> LoopbackPair {
    let mut lb = Loopback::new();
    lb.server.write_batching = policy;
    lb.client.write_batching = policy;
    lb.start().await.unwrap()
}

/// Makes `n` echo calls in one turn (all queued before any is written) and
/// returns the socket writes each side made for them.
async fn burst(p: &LoopbackPair, n: u32) -> (u64, u64) {
    // Let the handshakes' and heartbeats' traffic settle first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (c0, s0) = (
        p.client.stats().socket_writes,
        p.server.stats().socket_writes,
    );
    let calls = (0..n).map(|i| {
        let body = Bytes::from(i.to_be_bytes().to_vec());
        let c = p.client.clone();
        async move {
            let r = c
                .call(SERVER, 0, body.clone(), Duration::from_secs(5))
                .await;
            assert_eq!(r.unwrap(), body, "call {i}: wrong reply");
        }
    });
    join_all(calls).await;
    (
        p.client.stats().socket_writes - c0,
        p.server.stats().socket_writes - s0,
    )
}

/// On a one-thread runtime `Auto` is `Turn`: 64 calls made in one turn
/// leave in a few writes (not 64), and the server's 64 replies, which run
/// in one turn of its handlers, likewise.
#[tokio::test(flavor = "current_thread")]
async fn a_turns_calls_and_replies_leave_in_a_few_writes() {
    let p = pair(WriteBatching::Auto).await;
    p.server.serve(|r: Request| async move { r.body });
    let (client_writes, server_writes) = burst(&p, 64).await;
    // A request or reply counted alone would be 64 writes each; acks and a
    // keepalive may add one or two.
    assert!(
        client_writes <= 6,
        "64 calls in one turn took {client_writes} client writes"
    );
    assert!(
        server_writes <= 8,
        "64 replies took {server_writes} server writes"
    );
}

/// Calls from many tasks runnable in one turn, each doing some work
/// first (a proxy's clients parsing their commands): `work` apart, each
/// finds the session idle again under `Idle`. Returns the client's writes.
async fn tasks_in_one_turn(p: &LoopbackPair, tasks: u32, work: Duration) -> u64 {
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = p.client.stats().socket_writes;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let c = p.client.clone();
            tokio::spawn(async move {
                let t = std::time::Instant::now();
                while t.elapsed() < work {
                    std::hint::spin_loop();
                }
                let body = Bytes::from(i.to_be_bytes().to_vec());
                let r = c
                    .call(SERVER, 0, body.clone(), Duration::from_secs(5))
                    .await;
                assert_eq!(r.unwrap(), body);
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    p.client.stats().socket_writes - before
}

/// The proxy's pattern: 16 tasks, each with 30 µs of work before its call,
/// all runnable in one turn. `Turn` (here via `Auto`) sends them in a few
/// writes; `Idle` writes each call alone.
#[tokio::test(flavor = "current_thread")]
async fn calls_of_many_tasks_in_one_turn_share_writes_under_turn_only() {
    let work = Duration::from_micros(30);
    let p = pair(WriteBatching::Auto).await;
    p.server.serve(|r: Request| async move { r.body });
    let turn = tasks_in_one_turn(&p, 16, work).await;
    let p = pair(WriteBatching::Idle).await;
    p.server.serve(|r: Request| async move { r.body });
    let idle = tasks_in_one_turn(&p, 16, work).await;
    assert!(turn <= 4, "Turn: 16 tasks' calls took {turn} writes");
    assert!(idle >= 12, "Idle: 16 tasks' calls took only {idle} writes");
}

/// `Idle` forced on a one-thread runtime: a lone message on an idle
/// session is written inside `send` (the policy is honoured whatever the
/// runtime).
#[tokio::test(flavor = "current_thread")]
async fn idle_writes_a_lone_message_inside_send_even_on_one_thread() {
    let p = pair(WriteBatching::Idle).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = p.client.stats().socket_writes;
    p.client
        .send(SERVER, 2, Bytes::from_static(b"alone"))
        .await
        .unwrap();
    assert!(
        p.client.stats().socket_writes > before,
        "Idle: nothing written inside send"
    );
    let m = tokio::time::timeout(Duration::from_secs(2), p.server.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.body, Bytes::from_static(b"alone"));
}

/// On one thread, `Turn` (via `Auto`) leaves the write to the flush task:
/// `send` itself writes nothing.
#[tokio::test(flavor = "current_thread")]
async fn auto_on_one_thread_leaves_a_lone_message_to_the_turns_end() {
    let p = pair(WriteBatching::Auto).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = p.client.stats().socket_writes;
    p.client
        .send(SERVER, 2, Bytes::from_static(b"queued"))
        .await
        .unwrap();
    assert_eq!(
        p.client.stats().socket_writes,
        before,
        "written inside send: Auto did not batch on one thread"
    );
    let m = tokio::time::timeout(Duration::from_secs(2), p.server.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.body, Bytes::from_static(b"queued"));
}

/// Many senders and callers at once under `Turn` on several workers:
/// every message arrives once and in order per sender, every call is
/// answered (the flush never strands a message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_on_several_workers_loses_and_reorders_nothing() {
    let p = pair(WriteBatching::Turn).await;
    p.server.serve(|r: Request| async move { r.body });
    let senders = (0..4u16).map(|ch| {
        let c = p.client.clone();
        tokio::spawn(async move {
            for i in 0..500u32 {
                let mut b = ch.to_be_bytes().to_vec();
                b.extend_from_slice(&i.to_be_bytes());
                c.send(SERVER, ch, Bytes::from(b)).await.unwrap();
                if i % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    });
    let callers = (0..4u32).map(|k| {
        let c = p.client.clone();
        tokio::spawn(async move {
            for i in 0..200u32 {
                let body = Bytes::from((k * 1000 + i).to_be_bytes().to_vec());
                let r = c
                    .call(SERVER, 9, body.clone(), Duration::from_secs(5))
                    .await;
                assert_eq!(r.unwrap(), body);
            }
        })
    });
    for t in senders.chain(callers).collect::<Vec<_>>() {
        t.await.unwrap();
    }
    let mut next = [0u32; 4];
    let mut got = Vec::new();
    while next.iter().sum::<u32>() < 2000 {
        got.clear();
        tokio::time::timeout(Duration::from_secs(5), p.server.recv_many(&mut got, 1000))
            .await
            .unwrap();
        for m in &got {
            let ch = usize::from(u16::from_be_bytes([m.body[0], m.body[1]]));
            let i = u32::from_be_bytes([m.body[2], m.body[3], m.body[4], m.body[5]]);
            assert_eq!(i, next[ch], "channel {ch}: out of order or doubled");
            next[ch] += 1;
        }
    }
    assert_eq!(p.client.stats().call_errors, 0);
}

/// A busy session keeps moving its deadlines ahead (acknowledgements ride
/// on the replies); its task's timer must follow them rather than fire at
/// every tick (a cross-thread wake-up each time on several workers — this
/// made the demo's latency climb when the timer only ever moved earlier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_sessions_timer_follows_its_deadlines() {
    let p = pair(WriteBatching::Auto).await;
    p.server.serve(|r: Request| async move { r.body });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = p.client.testing().timer_fires();
    let started = std::time::Instant::now();
    // 16 callers back to back for ~300 ms: the session is never idle.
    let callers: Vec<_> = (0..16u32)
        .map(|k| {
            let c = p.client.clone();
            tokio::spawn(async move {
                let mut i = 0u32;
                while started.elapsed() < Duration::from_millis(300) {
                    let body = Bytes::from((k << 20 | i).to_be_bytes().to_vec());
                    let r = c
                        .call(SERVER, 0, body.clone(), Duration::from_secs(5))
                        .await;
                    assert_eq!(r.unwrap(), body);
                    i += 1;
                }
            })
        })
        .collect();
    for c in callers {
        c.await.unwrap();
    }
    let fires = p.client.testing().timer_fires() - before;
    let ticks = u64::try_from(started.elapsed().as_millis()).unwrap() / 5;
    // A timer left at a stale deadline fires about once per 5 ms tick.
    assert!(
        fires < ticks / 3,
        "the busy session's timer fired {fires} times in {ticks} ticks"
    );
}
