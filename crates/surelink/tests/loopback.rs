//! Integration tests on real loopback sockets, two networks
//! (127.0.1.x and 127.0.2.x).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use surelink::proto::{Epoch, NodeId};
use surelink::testing::{Loopback, LoopbackPair};
use surelink::{CallError, Config, Endpoint, NetEvent, Request};
use tokio::io::AsyncWriteExt;

const SERVER: NodeId = NodeId(1);

/// The shared two-network fixture, with the server's epoch set; also
/// returns the server's configuration (its keys and member list), to
/// restart it.
async fn pair_with_epoch(epoch: Option<u64>) -> (LoopbackPair, Config) {
    let mut lb = Loopback::new();
    lb.server.epoch = epoch.map(Epoch);
    let server = lb.server.clone();
    (lb.start().await.unwrap(), server)
}

async fn pair() -> LoopbackPair {
    pair_with_epoch(None).await.0
}

/// The server's configuration for a restart on the same addresses.
fn server_config_at(mut c: Config, addrs: &[std::net::SocketAddr], epoch: u64) -> Config {
    c.listen = addrs.to_vec();
    c.epoch = Some(Epoch(epoch));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_call_over_two_networks() {
    let LoopbackPair { server, client } = pair().await;
    server.serve(|r: Request| async move { r.body });
    for i in 0..100u32 {
        let body = Bytes::from(i.to_be_bytes().to_vec());
        let reply = client
            .call(SERVER, 3, body.clone(), Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(reply, body);
    }
    assert_eq!(client.stats().call_errors, 0);
}

/// Calls that reach a server between its `bind` and its `serve` wait for
/// the handler (it used to answer them "no request handler": the first
/// calls of clients waiting for a restarted server failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_before_serve_wait_for_the_handler() {
    let LoopbackPair { server, client } = pair().await;
    let calls: Vec<_> = (0..5u8)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move {
                c.call(SERVER, 0, Bytes::from(vec![i]), Duration::from_secs(5))
                    .await
            })
        })
        .collect();
    // Long enough for the requests to arrive and find no handler.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.serve(|r: Request| async move { r.body });
    for (i, c) in (0..5u8).zip(calls) {
        assert_eq!(c.await.unwrap().unwrap(), Bytes::from(vec![i]));
    }
}

/// An endpoint that never serves answers "no request handler" once its
/// first 2 s are over — a misdirected call fails at once, it does not
/// wait for its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_handler_answers_no_handler_after_its_grace() {
    let LoopbackPair {
        server: _server,
        client,
    } = pair().await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let start = std::time::Instant::now();
    let r = client
        .call(SERVER, 0, Bytes::from_static(b"x"), Duration::from_secs(5))
        .await;
    assert!(
        matches!(r, Err(CallError::Remote(surelink::RemoteError::NoHandler))),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_survives_its_connections_being_killed_mid_flight() {
    let LoopbackPair { server, client } = pair().await;
    let executions = Arc::new(AtomicU64::new(0));
    let ex = executions.clone();
    server.serve(move |r: Request| {
        let ex = ex.clone();
        async move {
            ex.fetch_add(1, Ordering::SeqCst);
            // Long enough for the connections to die and come back meanwhile.
            tokio::time::sleep(Duration::from_millis(150)).await;
            r.body
        }
    });
    for round in 0..4u8 {
        let c = client.clone();
        let call = tokio::spawn(async move {
            c.call(
                SERVER,
                0,
                Bytes::from(vec![round; 100]),
                Duration::from_secs(10),
            )
            .await
        });
        // Kill the request's connection while it is in flight or executing
        // (alternating which network carries the blow, and sometimes both).
        tokio::time::sleep(Duration::from_millis(if round % 2 == 0 { 1 } else { 50 })).await;
        let killed = server.testing().kill_network(usize::from(round % 2))
            + if round == 3 {
                client.testing().kill_network(1)
            } else {
                0
            };
        assert!(killed > 0);
        let reply = call.await.unwrap().expect("the call survives");
        assert_eq!(reply, Bytes::from(vec![round; 100]));
        assert_eq!(
            executions.load(Ordering::SeqCst),
            u64::from(round) + 1,
            "exactly one execution per call"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_arrives_complete_in_order_across_a_path_failure() {
    let LoopbackPair { server, client } = pair().await;
    const N: u64 = 100_000;
    let sender = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 0..N {
                client
                    .send(
                        SERVER,
                        (i % 4) as u16,
                        Bytes::from(i.to_be_bytes().to_vec()),
                    )
                    .await
                    .unwrap();
            }
        })
    };
    let killer = {
        let client = client.clone();
        let server = server.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            client.testing().kill_network(0);
            tokio::time::sleep(Duration::from_millis(60)).await;
            server.testing().kill_network(1);
        })
    };
    let mut next = [0u64; 4];
    let mut got = 0;
    while got < N {
        let m = tokio::time::timeout(Duration::from_secs(30), server.recv())
            .await
            .expect("flood stalled")
            .unwrap();
        let v = u64::from_be_bytes(m.body[..8].try_into().unwrap());
        let ch = usize::from(m.channel.0);
        assert_eq!(v % 4, ch as u64, "message on the wrong channel");
        assert_eq!(
            v,
            next[ch] * 4 + ch as u64,
            "channel {ch}: out of order or duplicated"
        );
        next[ch] += 1;
        got += 1;
    }
    sender.await.unwrap();
    killer.await.unwrap();
    // Nothing more arrives: no duplicates after the last one.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), server.recv())
            .await
            .is_err()
    );
    let st = client.stats();
    assert!(st.paths_down >= 2, "the failures happened: {st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_fails_outstanding_calls_with_peer_restarted() {
    let (LoopbackPair { server, client }, server_cfg) = pair_with_epoch(Some(100)).await;
    let addrs = server.local_addrs();
    // The old server never answers.
    server.serve(|_r: Request| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Bytes::new()
    });
    let c = client.clone();
    let call = tokio::spawn(async move {
        c.call(SERVER, 0, Bytes::from_static(b"q"), Duration::from_secs(20))
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Crash: the process goes away without a goodbye; a new one starts on
    // the same addresses.
    drop(server);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let executed = Arc::new(AtomicU64::new(0));
    let ex = executed.clone();
    let server2 = Endpoint::bind(server_config_at(server_cfg, &addrs, 200))
        .await
        .unwrap();
    server2.serve(move |r: Request| {
        ex.fetch_add(1, Ordering::SeqCst);
        async move { r.body }
    });
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            CallError::PeerRestarted {
                peer: SERVER,
                old: Epoch(100),
                ..
            }
        ),
        "got {err:?}"
    );
    // Not replayed into the new process; new calls work.
    let reply = client
        .call(
            SERVER,
            0,
            Bytes::from_static(b"again"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(reply, Bytes::from_static(b"again"));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bytes_close_only_that_connection() {
    let LoopbackPair { server, client } = pair().await;
    server.serve(|r: Request| async move { r.body });
    let addrs = server.local_addrs();
    let mut events = server.events();
    let mut raw = tokio::net::TcpStream::connect(addrs[0]).await.unwrap();
    raw.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The server closes the raw connection...
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), async {
        use tokio::io::AsyncReadExt;
        let mut total = 0;
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    })
    .await
    .expect("server closes the connection");
    assert!(n < 256, "at most a CLOSE frame comes back");
    // ...counts it, and allocated no path for it (it never proved a key)...
    assert_eq!(server.stats().handshakes_failed, 1);
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
        assert!(
            !matches!(e, NetEvent::PathDown { peer: None, .. }),
            "an unauthenticated connection became a path: {e:?}"
        );
    }
    // ...and the real client's session is untouched.
    let reply = client
        .call(
            SERVER,
            0,
            Bytes::from_static(b"fine"),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    assert_eq!(reply, Bytes::from_static(b"fine"));
    assert_eq!(client.stats().paths_down, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_call_and_the_session_carries_on() {
    let LoopbackPair { server, client } = pair().await;
    server.serve(|r: Request| async move {
        if r.body == "boom" {
            panic!("handler bug (expected by this test)");
        }
        if r.body == "bad" {
            return Err(surelink::HandlerError::new(404, "no such key"));
        }
        Ok(r.body)
    });
    let err = client
        .call(
            SERVER,
            0,
            Bytes::from_static(b"boom"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(err, CallError::Remote(surelink::RemoteError::Panicked));
    let err = client
        .call(
            SERVER,
            0,
            Bytes::from_static(b"bad"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CallError::Remote(surelink::RemoteError::App {
            code: 404,
            message: "no such key".into()
        })
    );
    // The slot was released and the session is untouched: many calls after,
    // with fewer workers than calls.
    for i in 0..200u32 {
        let body = Bytes::from(i.to_be_bytes().to_vec());
        let reply = client
            .call(SERVER, 0, body.clone(), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(reply, body);
    }
    let st = server.stats();
    assert_eq!((st.handler_panics, st.handler_errors), (1, 2));
    assert_eq!((st.requests_running, st.requests_queued), (0, 0));
    assert_eq!(client.stats().paths_down, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_requests_start_in_the_order_it_made_them() {
    // Bursts of calls made in order from one task (join_all polls them in
    // order, and a call's first poll queues it): the handler must be called
    // in the same order, although each request runs in its own task and
    // tokio polls the task a worker spawned last first.
    let LoopbackPair { server, client } = pair().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    server.serve(move |r: Request| {
        s2.lock()
            .unwrap()
            .push(u32::from_be_bytes(r.body[..4].try_into().unwrap()));
        async move {
            tokio::task::yield_now().await;
            r.body
        }
    });
    let mut next = 0u32;
    for _ in 0..50 {
        let calls = (0..64).map(|_| {
            let body = Bytes::from(next.to_be_bytes().to_vec());
            next += 1;
            client.call(SERVER, 0, body, Duration::from_secs(10))
        });
        for r in futures_util::future::join_all(calls.collect::<Vec<_>>()).await {
            r.unwrap();
        }
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), next as usize);
    let out_of_order = seen.windows(2).filter(|w| w[1] < w[0]).count();
    assert_eq!(
        out_of_order, 0,
        "{out_of_order} requests started after a later one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_peer_does_not_delay_another_peers_calls() {
    // Four workers, each request of the flooding peer takes 20 ms: its
    // backlog alone would take seconds. The other peer's calls are served
    // round robin between peers, so each waits at most for the workers to
    // come free (~20 ms), not for the backlog.
    let mut lb = Loopback::new();
    lb.server.max_concurrent_requests = 4;
    let pair = lb.start().await.unwrap();
    pair.server.serve(|r: Request| async move {
        if r.channel.0 == 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        r.body
    });
    let flooder = pair.client.clone();
    let mut flood = Vec::new();
    for i in 0..400u32 {
        let f = flooder.clone();
        flood.push(tokio::spawn(async move {
            f.call(
                SERVER,
                1,
                Bytes::from(i.to_be_bytes().to_vec()),
                Duration::from_secs(60),
            )
            .await
        }));
    }
    // Let the flood queue up at the server.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (queued, _) = {
        let s = pair.server.stats();
        (s.requests_queued, s.requests_running)
    };
    assert!(queued > 100, "the flood is queued at the server: {queued}");
    let other = pair.add_client(NodeId(3), |_| {}).await.unwrap();
    let mut worst = Duration::ZERO;
    for i in 0..20u32 {
        let t = std::time::Instant::now();
        let body = Bytes::from(i.to_be_bytes().to_vec());
        let reply = other
            .call(SERVER, 0, body.clone(), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(reply, body);
        worst = worst.max(t.elapsed());
    }
    // ~20 ms for a worker to free up, plus scheduling on a busy 2-core VM.
    assert!(
        worst < Duration::from_millis(80),
        "another peer's call took {worst:?} behind the flood"
    );
    assert!(
        pair.server.stats().requests_queued > 0,
        "the flood was still queued while the other peer was served"
    );
    for f in flood {
        f.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_message_is_written_before_send_returns() {
    let LoopbackPair { server, client } = pair().await;
    // Idle session: the message goes to the socket inside `send`, not
    // with a later batch.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let before = client.stats().bytes_sent;
    client
        .send(SERVER, 2, Bytes::from_static(b"alone"))
        .await
        .unwrap();
    let after = client.stats().bytes_sent;
    assert!(
        after > before,
        "nothing written by send: {before} -> {after}"
    );
    let m = tokio::time::timeout(Duration::from_secs(2), server.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.body, Bytes::from_static(b"alone"));
    // Back-to-back messages leave in batches: fewer frames than messages.
    let msgs: Vec<Bytes> = (0..1000u32)
        .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
        .collect();
    client.send_many(SERVER, 2, msgs.clone()).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 1000 {
        tokio::time::timeout(Duration::from_secs(5), server.recv_many(&mut got, 1000))
            .await
            .unwrap();
    }
    assert_eq!(got.iter().map(|m| m.body.clone()).collect::<Vec<_>>(), msgs);
    let s = &client.stats().sessions[0].1;
    assert!(
        s.batches_sent > 0 && s.frames_sent < 500,
        "1001 messages in {} frames ({} batches)",
        s.frames_sent,
        s.batches_sent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_subscriber_sees_the_paths_already_up() {
    let LoopbackPair { server, client } = pair().await;
    let mut events = client.events();
    let mut up = Vec::new();
    while let Ok(e) = events.try_recv() {
        up.push(e);
    }
    let paths = up
        .iter()
        .filter(|e| matches!(e, NetEvent::PathUp { peer, .. } if *peer == SERVER))
        .count();
    assert_eq!(paths, 2, "{up:?}");
    assert!(up
        .iter()
        .any(|e| matches!(e, NetEvent::PeerUp { peer, .. } if *peer == SERVER)));
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incoming_queue_is_bounded_in_bytes() {
    // A peer sending big one-way messages to an application that does not
    // read: what waits for `recv` stays under the byte bound (the rest
    // waits unacknowledged in the sender's session, holding it back).
    let mut lb = Loopback::new();
    lb.server.incoming_bytes_per_peer = 1 << 20;
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    let msg = Bytes::from(vec![7u8; 64 * 1024]);
    let mut accepted = 0usize;
    for _ in 0..400 {
        match client.try_send(SERVER, 0, msg.clone()) {
            Ok(()) => accepted += 1,
            Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut buf = Vec::new();
    let waiting = tokio::time::timeout(
        Duration::from_millis(200),
        server.recv_many(&mut buf, 10_000),
    )
    .await
    .unwrap_or(0);
    assert!(accepted > 32, "the sender got going: {accepted}");
    // 1 MiB of 64 KiB messages: 16, plus the one that crossed the bound.
    assert!(
        waiting <= 17,
        "{waiting} messages of 64 KiB waited for recv"
    );
    // Reading reopens the queue: everything accepted arrives.
    let mut got = waiting;
    while got < accepted {
        buf.clear();
        got += tokio::time::timeout(Duration::from_secs(5), server.recv_many(&mut buf, 10_000))
            .await
            .expect("the rest arrives once the application reads");
    }
    assert_eq!(got, accepted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_peers_memory_is_returned() {
    // A client leaves with big replies cached and calls in flight: once its
    // session ends, the server holds nothing for it (no session, no cached
    // replies, no retransmit cache).
    let mut lb = Loopback::new();
    lb.server.core.linger = Duration::from_millis(500);
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    server.serve(|_r: Request| async move { Bytes::from(vec![9u8; 256 * 1024]) });
    let mut calls = Vec::new();
    for _ in 0..32 {
        let c = client.clone();
        calls.push(tokio::spawn(async move {
            c.call(
                SERVER,
                0,
                Bytes::from_static(b"big"),
                Duration::from_secs(5),
            )
            .await
        }));
    }
    for c in calls.drain(..16) {
        assert_eq!(c.await.unwrap().unwrap().len(), 256 * 1024);
    }
    let st = server.stats();
    assert_eq!(st.sessions.len(), 1, "the client's session exists");
    client.shutdown().await;
    let gone = async {
        loop {
            if server.stats().sessions.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), gone)
        .await
        .expect("the departed client's session (and its caches) is dropped");
    assert_eq!(
        server.stats().connections_open,
        0,
        "its connections are closed"
    );
    for c in calls {
        c.abort();
    }
}

/// `Testing::mute_network`: the muted endpoint's peer stops hearing it on
/// that network, calls carry on over the other one without an error, and
/// the path is heard again once it speaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_silent_one_way_costs_no_call() {
    let LoopbackPair { server, client } = pair().await;
    server.serve(|r: Request| async move { r.body });
    let mut events = server.events();
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(50), events.recv()).await {}
    client.testing().mute_network(0, true);
    let started = tokio::time::Instant::now();
    let mut silent = false;
    for i in 0..100u32 {
        let body = Bytes::from(i.to_be_bytes().to_vec());
        let r = client
            .call(SERVER, 0, body.clone(), Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(r, body);
        while let Ok(e) = events.try_recv() {
            if let NetEvent::PathSilent { network: 0, .. } = e {
                silent = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert!(silent, "the server kept hearing a muted network");
    // The muted network's bytes wait; they are not lost or doubled when it
    // speaks again.
    client.testing().mute_network(0, false);
    let deadline = started + Duration::from_secs(10);
    let mut heard = false;
    while !heard && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(NetEvent::PathHeard { network: 0, .. })) =
            tokio::time::timeout(Duration::from_millis(100), events.recv()).await
        {
            heard = true;
        }
    }
    assert!(heard, "network 0 not heard again after the mute ended");
    let r = client
        .call(
            SERVER,
            0,
            Bytes::from_static(b"after"),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    assert_eq!(&r[..], b"after");
}

/// `call_then`'s `queued` runs when the request enters the session's send
/// queue, not before: while the send buffer is full (the server admits 2
/// requests and holds them) the calls past it wait unqueued, so a caller
/// that issues its next call from `queued` never lets one overtake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_then_reports_queued_only_once_the_request_is_in_the_session() {
    let mut lb = Loopback::new();
    lb.server.core.max_requests_per_peer = 2;
    lb.client.core.max_message_size = 4096;
    lb.client.core.send_buffer = 16 * 1024;
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    server.serve(move |req: Request| {
        let g = g.clone();
        async move {
            let _p = g.acquire().await;
            req.body
        }
    });
    let queued = Arc::new(std::sync::Mutex::new(Vec::new()));
    let opts = surelink::CallOptions::new(Duration::from_secs(20));
    let calls: Vec<_> = (0..40usize)
        .map(|i| {
            let q = queued.clone();
            let client = client.clone();
            let opts = opts.clone();
            async move {
                client
                    .call_then(SERVER, 0, Bytes::from(vec![7u8; 1024]), &opts, move || {
                        q.lock().unwrap().push(i);
                    })
                    .await
            }
        })
        .collect();
    let all = tokio::spawn(futures_util::future::join_all(calls));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = queued.lock().unwrap().clone();
    assert!(
        !before.is_empty() && before.len() < 20,
        "a 16 KiB buffer queues some, not all, of 40 KiB: {before:?}"
    );
    // The calls queued at once are queued in the order they were made (a
    // prefix 0..k); any queued later waited for room, and a waiter can only
    // follow them. (Which of several waiters goes first when room frees
    // is not promised: a caller that needs order chains its calls.)
    let k = before
        .iter()
        .enumerate()
        .take_while(|&(n, &i)| n == i)
        .count();
    assert!(k > 0, "nothing queued at once: {before:?}");
    let mut later = before[k..].to_vec();
    later.sort_unstable();
    later.dedup();
    assert!(
        later.len() == before.len() - k && later.iter().all(|&i| i >= k),
        "a call overtook one made before it: {before:?}"
    );
    gate.add_permits(1000);
    for r in all.await.unwrap() {
        assert_eq!(r.unwrap().len(), 1024);
    }
    assert_eq!(queued.lock().unwrap().len(), 40);
}
