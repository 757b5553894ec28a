//! Integration tests on real loopback sockets, two networks
//! (127.0.1.x and 127.0.2.x).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use surelink::proto::{ClusterId, Epoch, NodeId};
use surelink::{CallError, Config, Endpoint, NetEvent, PeerConfig, Request};
use tokio::io::AsyncWriteExt;

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

fn server_config(epoch: Option<u64>) -> Config {
    let mut c = Config::new(SERVER, ClusterId(9));
    c.listen = vec![
        "127.0.1.1:0".parse().unwrap(),
        "127.0.2.1:0".parse().unwrap(),
    ];
    c.epoch = epoch.map(Epoch);
    c
}

fn server_config_at(addrs: &[std::net::SocketAddr], epoch: u64) -> Config {
    let mut c = Config::new(SERVER, ClusterId(9));
    c.listen = addrs.to_vec();
    c.epoch = Some(Epoch(epoch));
    c
}

async fn client_for(server: &[std::net::SocketAddr]) -> Endpoint {
    let mut c = Config::new(CLIENT, ClusterId(9));
    c.dial_from = vec![
        "127.0.1.2:0".parse().unwrap(),
        "127.0.2.2:0".parse().unwrap(),
    ];
    c.peers = vec![PeerConfig {
        node: SERVER,
        addrs: server.iter().copied().map(Some).collect(),
    }];
    Endpoint::bind(c).await.unwrap()
}

async fn wait_paths(ep: &Endpoint, n: usize) {
    assert!(
        ep.wait_for_paths(SERVER, n, Duration::from_secs(5)).await,
        "{n} active paths did not come up: {:?}",
        ep.paths()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_call_over_two_networks() {
    let server = Endpoint::bind(server_config(None)).await.unwrap();
    server.serve(|r: Request| async move { r.body });
    let client = client_for(&server.local_addrs()).await;
    wait_paths(&client, 2).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_survives_its_connections_being_killed_mid_flight() {
    let server = Endpoint::bind(server_config(None)).await.unwrap();
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
    let client = client_for(&server.local_addrs()).await;
    wait_paths(&client, 2).await;
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
        let killed = server.kill_network(usize::from(round % 2))
            + if round == 3 {
                client.kill_network(1)
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
    let server = Endpoint::bind(server_config(None)).await.unwrap();
    let client = client_for(&server.local_addrs()).await;
    wait_paths(&client, 2).await;
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
            client.kill_network(0);
            tokio::time::sleep(Duration::from_millis(60)).await;
            server.kill_network(1);
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
        let ch = m.channel as usize;
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
    let server = Endpoint::bind(server_config(Some(100))).await.unwrap();
    let addrs = server.local_addrs();
    // The old server never answers.
    server.serve(|_r: Request| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Bytes::new()
    });
    let client = client_for(&addrs).await;
    wait_paths(&client, 2).await;
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
    let server2 = Endpoint::bind(server_config_at(&addrs, 200)).await.unwrap();
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
    let server = Endpoint::bind(server_config(None)).await.unwrap();
    server.serve(|r: Request| async move { r.body });
    let addrs = server.local_addrs();
    let client = client_for(&addrs).await;
    wait_paths(&client, 2).await;
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
    // ...reports why...
    let mut saw = false;
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
        if let NetEvent::PathDown {
            reason, peer: None, ..
        } = e
        {
            assert!(reason.contains("Version"), "{reason}");
            saw = true;
            break;
        }
    }
    assert!(saw, "a PathDown event names the decode error");
    assert_eq!(server.stats().refused_inputs, 1);
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
