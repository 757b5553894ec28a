//! Two real surelink endpoints talking through relays on both networks:
//! the client dials the relay's links, which forward to the server's
//! listen addresses (TCP and heartbeats). A kill on network 0 costs no
//! message; a blackhole on network 1 (client → server) makes the server's
//! detector report the path silent while traffic goes on over network 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{Config, Endpoint, NetEvent, PeerConfig};
use surelink_relay::{Direction, LinkSpec, Relay};
use tokio::time::{timeout, Instant};

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

/// The relay's address on network `net` (0 or 1): 127.0.{net+1}.100.
fn relay_ip(net: usize) -> IpAddr {
    let n = u8::try_from(net + 1).unwrap();
    IpAddr::V4(Ipv4Addr::new(127, 0, n, 100))
}

/// The shared fixture's two configurations (fresh keys, defaults), with
/// the client dialling the relay instead of the server.
async fn through_relay() -> (Endpoint, Endpoint, Relay) {
    let lb = Loopback::new();
    let (server_cfg, mut client_cfg): (Config, Config) = (lb.server, lb.client);
    let server = Endpoint::bind(server_cfg).await.unwrap();
    let relay = Relay::new();
    let mut dial = Vec::new();
    for (net, addr) in server.local_addrs().into_iter().enumerate() {
        let spec =
            LinkSpec::new(net, SocketAddr::new(relay_ip(net), 0), addr).from_ip(relay_ip(net));
        dial.push(Some(relay.add_link(spec).await.unwrap().listen));
    }
    client_cfg.peers = vec![PeerConfig::new(SERVER, dial)];
    let client = Endpoint::bind(client_cfg).await.unwrap();
    let wait = Duration::from_secs(10);
    assert!(
        client.wait_for_paths(SERVER, 2, wait).await,
        "client: paths"
    );
    assert!(
        server.wait_for_paths(CLIENT, 2, wait).await,
        "server: paths"
    );
    (server, client, relay)
}

/// Collects the numbers of the messages the server receives.
fn receiver(server: &Endpoint) -> Arc<Mutex<Vec<u64>>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let (s, g) = (server.clone(), got.clone());
    tokio::spawn(async move {
        while let Some(m) = s.recv().await {
            let n = u64::from_be_bytes(m.body[..8].try_into().unwrap());
            g.lock().push(n);
        }
    });
    got
}

/// Sends `n` numbered one-way messages from `from`, one every 500 µs.
async fn stream(client: &Endpoint, from: u64, n: u64) {
    let start = Instant::now();
    for i in 0..n {
        tokio::time::sleep_until(start + Duration::from_micros(500 * i)).await;
        let mut body = (from + i).to_be_bytes().to_vec();
        body.resize(64, 0);
        client.send(SERVER, 0, Bytes::from(body)).await.unwrap();
    }
}

/// Waits until `got` holds `0..n`, then checks it is exactly that: every
/// message once, in order.
async fn expect_all(got: &Mutex<Vec<u64>>, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (got.lock().len() as u64) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = got.lock();
    let want: Vec<u64> = (0..n).collect();
    assert!(
        *got == want,
        "{} of {n} arrived; first difference at {:?}",
        got.len(),
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_on_network_0_costs_no_message() {
    let (server, client, relay) = through_relay().await;
    let got = receiver(&server);
    let mut events = client.events();
    let killer = {
        let net0 = relay.network(0);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            net0.kill()
        })
    };
    stream(&client, 0, 3000).await;
    let killed = killer.await.unwrap();
    assert!(killed >= 1, "no connection to kill on network 0");
    expect_all(&got, 3000).await;
    let c = relay.network(0).status()[0].counters;
    assert!(c.tcp_killed >= 1, "{c:?}");
    // The client saw the path go down, and it came back through the relay.
    let mut went_down = false;
    while let Ok(e) = events.try_recv() {
        went_down |= matches!(e, NetEvent::PathDown { network: 0, .. });
    }
    assert!(went_down, "the kill went unnoticed");
    assert!(
        client
            .wait_for_paths(SERVER, 2, Duration::from_secs(5))
            .await,
        "network 0 did not come back"
    );
    for s in relay.status() {
        println!("{s}");
    }
    tokio::join!(client.shutdown(), server.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackhole_on_network_1_is_reported_silent_while_network_0_carries_on() {
    let (server, client, relay) = through_relay().await;
    let got = receiver(&server);
    let mut events = server.events();
    let net1 = relay.network(1);
    let sender = {
        let client = client.clone();
        tokio::spawn(async move { stream(&client, 0, 4000).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let blackholed_at = Instant::now();
    net1.blackhole(Direction::Up);
    let silent = timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Ok(NetEvent::PathSilent {
                    peer: CLIENT,
                    network: 1,
                    silent_for_us,
                }) => return silent_for_us,
                Ok(_) => {}
                Err(e) => panic!("events: {e:?}"),
            }
        }
    })
    .await
    .expect("the server's detector did not report network 1 silent");
    println!(
        "network 1 reported silent {:?} after the blackhole (silent for {silent_for_us} µs)",
        blackholed_at.elapsed(),
        silent_for_us = silent
    );
    sender.await.unwrap();
    expect_all(&got, 4000).await;
    let st = net1.status()[0];
    println!("during the blackhole: {st}");
    assert!(st.counters.udp_dropped_up > 0, "no heartbeat was dropped");
    net1.heal();
    assert!(
        server
            .wait_for_paths(CLIENT, 2, Duration::from_secs(10))
            .await,
        "network 1 did not come back after heal"
    );
    for s in relay.status() {
        println!("{s}");
    }
    tokio::join!(client.shutdown(), server.shutdown());
}

/// The relay forwards the public heartbeat port only: private copies
/// never arrive, so neither side is acknowledged, neither commits to its
/// peer's private port, and the public copy of every heartbeat keeps each
/// path fresh. (Committed without acknowledgement, the public copy went
/// out every 8th heartbeat only, 80 ms apart, past the 50 ms window: the
/// paths were reported silent again and again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_relay_that_forwards_the_public_port_only_no_path_goes_silent() {
    let (server, client, relay) = through_relay().await;
    let (mut server_events, mut client_events) = (server.events(), client.events());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut silent = Vec::new();
    for (who, events) in [
        ("server", &mut server_events),
        ("client", &mut client_events),
    ] {
        while let Ok(e) = events.try_recv() {
            if matches!(e, NetEvent::PathSilent { .. } | NetEvent::PathDown { .. }) {
                silent.push(format!("{who}: {e:?}"));
            }
        }
    }
    assert!(
        silent.is_empty(),
        "paths reported in 3 s of quiet: {silent:#?}"
    );
    let up = relay.network(0).status()[0].counters;
    assert!(up.udp_datagrams_up > 0, "no heartbeat went through: {up:?}");
    tokio::join!(client.shutdown(), server.shutdown());
}
