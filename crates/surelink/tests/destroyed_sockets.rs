//! The detector's private UDP sockets destroyed from outside (`ss -K`, as
//! an administrator, a fault injector or a network manager would): a
//! destroyed connected UDP socket gives its port up and never receives
//! again. The barrier sockets and the private heartbeat sockets must be
//! replaced, or every later barrier round is lost and no path is ever
//! reported down again (the long-fault soak's "in-flight calls wait for
//! the link" stall: after its first `Kill` step, no report at all).
//!
//! Its own test binary: `ss -K` here destroys every connected UDP socket
//! of this process, and no other test may be using them. Needs root (else
//! SKIPPED).

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{DetectorConfig, DetectorMode, Endpoint, NetEvent};

const CLIENT: NodeId = NodeId(2);
/// This process's connected UDP sockets (the detector's private and
/// barrier sockets): `(local, peer)` as `ss -p` lists them. Only ours, so
/// the test leaves alone any other process on these addresses (an example
/// cluster running beside it).
fn connected_udp() -> Vec<(String, String)> {
    let out = Command::new("ss")
        .args(["-H", "-n", "-u", "-p", "state", "established"])
        .output()
        .unwrap();
    let me = format!("pid={},", std::process::id());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&me))
        .filter_map(|l| {
            // Recv-Q Send-Q Local Peer users:(…)
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(2)?.to_string(), f.get(3)?.to_string()))
        })
        .collect()
}

/// Destroys them, each by its exact addresses; how many `ss` says it
/// destroyed.
fn destroy_connected_udp() -> usize {
    connected_udp()
        .iter()
        .map(|(local, peer)| {
            let st = Command::new("ss")
                .args(["-H", "-n", "-K", "-u", "src", local, "dst", peer])
                .output()
                .unwrap();
            assert!(st.status.success(), "ss -K failed: {st:?}");
            String::from_utf8_lossy(&st.stdout).lines().count()
        })
        .sum()
}

/// Whether `ss -K` destroys a connected UDP socket here (root, a kernel
/// with `SOCK_DESTROY` for UDP, iproute2).
fn can_destroy() -> bool {
    let peer = std::net::UdpSocket::bind("127.0.3.9:0").unwrap();
    let s = std::net::UdpSocket::bind("127.0.3.9:0").unwrap();
    s.connect(peer.local_addr().unwrap()).unwrap();
    let ran = Command::new("ss")
        .args(["-K", "-u", "state", "established", "src", "127.0.3.9"])
        .output()
        .is_ok_and(|o| o.status.success());
    ran && s.peer_addr().is_err()
}

async fn pair() -> (Endpoint, Endpoint) {
    let mut lb = Loopback::new();
    for c in [&mut lb.server, &mut lb.client] {
        c.detector = DetectorConfig::with_interval(Duration::from_millis(10));
        c.detector.mode = DetectorMode::SafeTimer;
    }
    let p = lb.start().await.unwrap();
    (p.server, p.client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroyed_private_sockets_are_replaced_and_reports_go_on() {
    if !can_destroy() {
        eprintln!("SKIPPED: ss -K cannot destroy sockets here (needs root and iproute2)");
        return;
    }
    let (server, client) = pair().await;
    // The private handshake completes and the sockets exist.
    let deadline = Instant::now() + Duration::from_secs(5);
    while connected_udp().len() < 4 {
        assert!(Instant::now() < deadline, "no private sockets appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = connected_udp().len();
    let mut events = server.events();
    let destroyed = destroy_connected_udp();
    assert!(
        destroyed >= before,
        "ss -K destroyed {destroyed} of {before}"
    );
    // Replaced, and no false report meanwhile: both peers are alive.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Ok(e)) = tokio::time::timeout_at(deadline, events.recv()).await {
        assert!(
            !matches!(e, NetEvent::PathSilent { .. } | NetEvent::PeerDead { .. }),
            "a live peer reported after its sockets were replaced: {e:?}"
        );
    }
    let after = connected_udp().len();
    assert!(
        after >= before,
        "sockets not replaced: {before} connected before, {after} after"
    );
    // A path that goes silent now is still reported, quickly.
    let muted = Instant::now();
    client.testing().mute_network(0, true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut reported = None;
    while let Ok(Ok(e)) = tokio::time::timeout_at(deadline, events.recv()).await {
        if let NetEvent::PathSilent {
            peer: CLIENT,
            network: 0,
            ..
        } = e
        {
            reported = Some(muted.elapsed());
            break;
        }
    }
    client.testing().mute_network(0, false);
    let d = server.stats().detector.unwrap();
    let took = reported.unwrap_or_else(|| {
        panic!("a silent path was never reported after the sockets were destroyed: {d:?}")
    });
    // Window 50 ms + a check + the barrier; generous for a loaded CI.
    assert!(took < Duration::from_millis(500), "took {took:?}: {d:?}");
}
