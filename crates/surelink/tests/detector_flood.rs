//! The failure detector under a junk UDP flood of its heartbeat port, on
//! loopback: the flood comes from an address no member's heartbeat came
//! from, so the kernel steers it to the strays' queue; its drops there
//! neither keep a vanished peer alive nor make a live one look dead. And a
//! flood forging the peer's own address (on loopback any 127/8 address can
//! be a source): it overflows the members' queue, but the peer's heartbeats
//! come out of their private queue, which the flood cannot reach.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{DetectorConfig, Endpoint, NetEvent};

const CLIENT: NodeId = NodeId(2);

async fn pair() -> (Endpoint, Endpoint) {
    let mut lb = Loopback::new();
    // The compact tuning (window 150 ms), so the test is short.
    lb.server.detector = DetectorConfig::with_interval(Duration::from_millis(10));
    lb.client.detector = DetectorConfig::with_interval(Duration::from_millis(10));
    let p = lb.start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let heard = |e: &Endpoint| {
            e.stats()
                .detector
                .is_some_and(|d| d.heartbeats_received >= 10)
        };
        if heard(&p.server) && heard(&p.client) {
            break;
        }
        assert!(Instant::now() < deadline, "heartbeats do not flow");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (p.server, p.client)
}

/// Junk as fast as one thread sends it, from 127.0.0.1 (no member's
/// address) to every heartbeat socket, until dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Flood {
    fn start(to: Vec<SocketAddr>) -> Flood {
        Flood::forging(&[std::net::Ipv4Addr::LOCALHOST.into()], to)
    }

    /// Junk from each of `from` (other ports), to each of `to`.
    fn forging(from: &[std::net::IpAddr], to: Vec<SocketAddr>) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let tx: Vec<std::net::UdpSocket> = from
            .iter()
            .map(|ip| std::net::UdpSocket::bind(SocketAddr::new(*ip, 0)).unwrap())
            .collect();
        let thread = std::thread::spawn(move || {
            let mut sent = 0u64;
            while !s.load(Ordering::Relaxed) {
                for (t, a) in tx.iter().zip(to.iter().cycle()) {
                    if t.send_to(&[0xa5u8; 64], a).is_ok() {
                        sent += 1;
                    }
                }
            }
            sent
        });
        Flood {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The bound stated in docs/detector.md, for this tuning: the peer window
/// (150 ms) plus a check period and a barrier round, with room for a
/// loaded two-core machine that is also running the flood.
const BOUND: Duration = Duration::from_millis(1000);

/// Starts `flood` against `server`, lets it overflow, drops `client` and
/// waits up to 5 s for its dead report; asserts it came within [`BOUND`].
/// Returns datagrams sent and the server's detector counters.
async fn dead_report_under(
    server: &Endpoint,
    client: Endpoint,
    flood: impl FnOnce(&Endpoint, &Endpoint) -> Flood,
) -> (u64, surelink::DetectorSnapshot) {
    let mut events = server.events();
    let flood = flood(server, &client);
    // The flood is under way and overflowing before the peer goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gone = Instant::now();
    drop(client);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut dead_after = None;
    while let Ok(Ok(e)) = tokio::time::timeout_at(deadline, events.recv()).await {
        if matches!(e, NetEvent::PeerDead { peer } if peer == CLIENT) {
            dead_after = Some(gone.elapsed());
            break;
        }
    }
    let sent = flood.stop();
    let d = server.stats().detector.unwrap();
    let after = dead_after.unwrap_or_else(|| panic!("not reported dead under the flood: {d:?}"));
    assert!(after < BOUND, "took {after:?}: {d:?}");
    (sent, d)
}

/// Runs `flood` against `server` for 3 s while `client` lives; asserts no
/// report of it. Returns the server's detector counters.
async fn no_report_under(
    server: &Endpoint,
    client: Endpoint,
    flood: impl FnOnce(&Endpoint, &Endpoint) -> Flood,
) -> surelink::DetectorSnapshot {
    let mut events = server.events();
    let flood = flood(server, &client);
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut false_reports = Vec::new();
    while let Ok(Ok(e)) = tokio::time::timeout_at(until, events.recv()).await {
        if matches!(e, NetEvent::PeerDead { .. } | NetEvent::PathSilent { .. }) {
            false_reports.push(e);
        }
    }
    flood.stop();
    let d = server.stats().detector.unwrap();
    assert!(false_reports.is_empty(), "{false_reports:?}: {d:?}");
    assert_eq!(d.monitor.reported_dead, 0);
    drop(client);
    d
}

fn from_localhost(server: &Endpoint, _: &Endpoint) -> Flood {
    Flood::start(server.heartbeat_addrs())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_junk_flood_does_not_keep_a_vanished_peer_alive() {
    let (server, client) = pair().await;
    let (sent, d) = dead_report_under(&server, client, from_localhost).await;
    // The flood did what it did before: overflow a queue (now the strays').
    assert!(d.strays.split, "{d:?}");
    assert!(
        d.strays.dropped > 0,
        "the flood overflowed nothing ({sent} sent): {d:?}"
    );
    assert!(d.refused.malformed > 0, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_peer_under_a_junk_flood_is_never_reported() {
    let (server, client) = pair().await;
    let d = no_report_under(&server, client, from_localhost).await;
    assert!(d.strays.dropped > 0, "the flood overflowed nothing: {d:?}");
}

/// The client's own addresses, each flooding the server's heartbeat port
/// on the same network.
fn forged_flood(server: &Endpoint, client: &Endpoint) -> Flood {
    let from: Vec<std::net::IpAddr> = client
        .heartbeat_addrs()
        .iter()
        .map(SocketAddr::ip)
        .collect();
    Flood::forging(&from, server.heartbeat_addrs())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_forging_the_peers_address_does_not_keep_it_alive() {
    let (server, client) = pair().await;
    let (sent, d) = dead_report_under(&server, client, forged_flood).await;
    // The flood reached the members' queue and overflowed it: without the
    // private queues these drops held the report back.
    assert!(
        d.monitor.reported_through_member_drops > 0,
        "the forged flood ({sent} sent) held back nothing: {d:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_peer_under_a_forged_flood_is_never_reported() {
    let (server, client) = pair().await;
    let d = no_report_under(&server, client, forged_flood).await;
    assert!(d.heartbeats_received > 100, "{d:?}");
}
