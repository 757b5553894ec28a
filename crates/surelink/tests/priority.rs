//! Priorities and at-most-once execution on real loopback sockets.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{CallOptions, Endpoint, Priority, Request, SendError};

const SERVER: NodeId = NodeId(1);

async fn pair(max_concurrent: usize) -> (Endpoint, Endpoint) {
    let mut lb = Loopback::new();
    lb.server.max_concurrent_requests = max_concurrent;
    let p = lb.start().await.unwrap();
    (p.server, p.client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_re_sent_while_running_executes_once() {
    let (server, client) = pair(16).await;
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    server.serve(move |req: Request| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            req.body
        }
    });
    let opts =
        CallOptions::new(Duration::from_secs(5)).with_resend_after(Some(Duration::from_millis(40)));
    let reply = client
        .call_with(SERVER, 3, Bytes::from_static(b"once"), &opts)
        .await
        .unwrap();
    assert_eq!(reply, Bytes::from_static(b"once"));
    // Re-sent at 40, 120, 280 ms while the handler ran.
    assert!(
        client.stats().calls_resent >= 3,
        "{:?}",
        client.stats().calls_resent
    );
    assert!(server.stats().duplicate_requests >= 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "executed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_call_overtakes_the_server_queue() {
    let (server, client) = pair(1).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    server.serve(move |req: Request| {
        o.lock().unwrap().push(req.body.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            req.body
        }
    });
    let mut calls = Vec::new();
    for i in 0..8u8 {
        let c = client.clone();
        calls.push(tokio::spawn(async move {
            c.call(SERVER, 0, Bytes::from(vec![i]), Duration::from_secs(5))
                .await
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let opts = CallOptions::new(Duration::from_secs(5)).with_priority(Priority::High);
    let high = client
        .call_with(SERVER, 0, Bytes::from_static(b"H"), &opts)
        .await
        .unwrap();
    assert_eq!(high, Bytes::from_static(b"H"));
    for c in calls {
        c.await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    let pos = order
        .iter()
        .position(|b| b == &Bytes::from_static(b"H"))
        .unwrap();
    assert!(
        pos <= 2,
        "the high call ran at position {pos} of {}",
        order.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_one_way_messages_are_received_first() {
    let (server, client) = pair(16).await;
    for i in 0..50u8 {
        client.send(SERVER, 1, Bytes::from(vec![i])).await.unwrap();
    }
    client
        .send_with(SERVER, 1, Bytes::from_static(b"H"), Priority::High)
        .await
        .unwrap();
    // Let everything arrive before the receiver looks.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.stats().messages_received < 51 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "messages did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut got = Vec::new();
    while got.len() < 51 {
        server.recv_many(&mut got, 100).await;
    }
    assert_eq!(got[0].body, Bytes::from_static(b"H"));
    assert_eq!(
        got[0].channel.0, 1,
        "delivered on the channel it was sent to"
    );
    assert_eq!(got[0].priority, Priority::High);
    // The normal ones keep their order.
    let normal: Vec<u8> = got[1..].iter().map(|m| m.body[0]).collect();
    assert_eq!(normal, (0..50).collect::<Vec<u8>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_configured_channel_is_the_users_and_no_more() {
    // The priority lane is a stream of the session, not a channel: all
    // `max_channels` channels are the application's.
    let (server, client) = pair(16).await;
    server.serve(|r: Request| async move { r.body });
    let reply = client
        .call(
            SERVER,
            255,
            Bytes::from_static(b"x"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(reply, Bytes::from_static(b"x"));
    let err = client
        .send(SERVER, 256, Bytes::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            SendError::Core(surelink::proto::SendError::ChannelOutOfRange {
                channel: 256,
                max: 256
            })
        ),
        "{err:?}"
    );
}
