//! The attacks of issue 12, rerun against a server on loopback with the
//! product's defaults while a legitimate client keeps calling: each must be
//! refused or harmless. Per attack the test checks the client's p50 stays
//! within 2x of its quiet p50 (plus 2 ms for a shared CI machine), no call
//! fails, the server keeps one session, the process's file descriptors and
//! memory stay bounded, and the server counts what it refused.

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use surelink::proto::detector::datagram::{encode_barrier, encode_heartbeat};
use surelink::proto::{ClusterId, Epoch, NodeId};
use surelink::testing::{Loopback, LoopbackPair};
use surelink::{NetEvent, Request};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn rss_mb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// p50 of `n` calls, in microseconds; panics if any fails.
async fn p50_us(pair: &LoopbackPair, n: usize) -> u64 {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let body = Bytes::from((i as u64).to_be_bytes().to_vec());
        let r = pair
            .client
            .call(SERVER, 0, body.clone(), Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("a legitimate call failed under attack: {e}"));
        assert_eq!(r, body);
        v.push(t.elapsed().as_micros() as u64);
    }
    v.sort_unstable();
    v[n / 2]
}

/// A TCP connection from `ip` (any port) to `to`.
async fn connect_from(ip: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(IpAddr::V4(ip), 0))?;
    s.connect(to).await
}

struct Bench {
    pair: LoopbackPair,
    quiet_p50: u64,
    fds: usize,
    rss: u64,
}

impl Bench {
    async fn new() -> Bench {
        let pair = Loopback::new().start().await.unwrap();
        pair.server.serve(|r: Request| async move { r.body });
        // Warm up, then the quiet figure.
        p50_us(&pair, 200).await;
        let quiet_p50 = p50_us(&pair, 500).await;
        Bench {
            pair,
            quiet_p50,
            fds: open_fds(),
            rss: rss_mb(),
        }
    }

    /// Runs `attack` while the client calls; checks the client and the
    /// server's state.
    async fn under<F>(&self, name: &str, attack: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut events = self.pair.client.events();
        let task = tokio::spawn(attack);
        // Let the attack get going.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p50 = p50_us(&self.pair, 500).await;
        let fds = open_fds();
        let rss = rss_mb();
        let open = self.pair.server.stats().connections_open;
        task.abort();
        let _ = task.await;
        eprintln!(
            "{name}: client p50 {p50} µs (quiet {} µs); server holds {open} accepted connections; process fds {fds} (before {}, the attacker's own included); RSS {rss} MB (before {} MB)",
            self.quiet_p50, self.fds, self.rss
        );
        // The server's share: its per-address and in-handshake limits
        // (64 and 128) bound what an attacker makes it hold.
        assert!(
            open <= 128 + 64 + 4,
            "{name}: the server holds {open} connections"
        );
        assert!(
            p50 <= 2 * self.quiet_p50 + 2_000,
            "{name}: p50 {p50} µs against {} µs quiet",
            self.quiet_p50
        );
        assert!(rss < self.rss + 200, "{name}: RSS {rss} MB");
        assert_eq!(
            self.pair.server.stats().sessions.len(),
            1,
            "{name}: the server holds a session for someone else"
        );
        while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(50), events.recv()).await {
            assert!(
                !matches!(
                    e,
                    NetEvent::SessionEnded { .. }
                        | NetEvent::PeerDead { .. }
                        | NetEvent::Fenced { .. }
                ),
                "{name}: the client's session was disturbed: {e:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_is_refused_or_harmless() {
    let b = Bench::new().await;
    let tcp = b.pair.server.local_addrs()[0];
    let hb = b.pair.server.heartbeat_addrs();
    let client_epoch = b.pair.client.epoch();

    // 1. Thousands of idle connections from one address, then from many.
    b.under("connection flood", async move {
        let mut held = Vec::new();
        for i in 0..2000u32 {
            let ip = Ipv4Addr::new(127, 0, 3 + (i / 250) as u8, 1 + (i % 250) as u8);
            let ip = if i < 1000 {
                Ipv4Addr::new(127, 0, 3, 1)
            } else {
                ip
            };
            if let Ok(s) = connect_from(ip, tcp).await {
                held.push(s);
            }
        }
        std::future::pending::<()>().await;
        drop(held);
    })
    .await;
    let st = b.pair.server.stats();
    assert!(
        st.connections_refused > 0,
        "limits must have refused some: {st:?}"
    );

    // 2. Connections that speak garbage or an unauthenticated HELLO: the
    //    handshake fails at the first bytes, nothing is allocated.
    b.under("garbage and plain HELLOs", async move {
        loop {
            for payload in [
                &b"GET / HTTP/1.1\r\n\r\n"[..],
                &[1u8, 0, 0, 40, 0, 0, 0, 0][..],
            ] {
                if let Ok(mut s) = connect_from(Ipv4Addr::new(127, 0, 4, 1), tcp).await {
                    let _ = s.write_all(payload).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(b.pair.server.stats().handshakes_failed > 0);

    // 3. Slow handshakes: the preamble, then silence (slots held until the
    //    handshake timeout; the per-address limit keeps them few).
    b.under("slow handshakes", async move {
        let mut held = Vec::new();
        for _ in 0..300 {
            if let Ok(mut s) = connect_from(Ipv4Addr::new(127, 0, 5, 1), tcp).await {
                let mut pre = b"SLNK\x01\x01\x00\x00".to_vec();
                pre.extend_from_slice(&9u64.to_be_bytes());
                let _ = s.write_all(&pre).await;
                held.push(s);
            }
        }
        std::future::pending::<()>().await;
        drop(held);
    })
    .await;

    // 4. Forged heartbeats: in the client's name (keeping it "alive",
    //    locking it out with epoch u64::MAX) and in random names (making
    //    the server heartbeat forged addresses).
    let hb2 = hb.clone();
    b.under("forged heartbeats", async move {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut seq = 1u64 << 40;
        loop {
            for i in 0..200u64 {
                seq += 1;
                let (node, epoch) = match i % 3 {
                    0 => (CLIENT, Epoch(u64::MAX)),
                    1 => (CLIENT, client_epoch),
                    _ => (NodeId(1000 + i), Epoch(1)),
                };
                let d = encode_heartbeat(ClusterId(9), node, epoch, seq, 0, 0, None);
                for a in &hb2 {
                    let _ = sock.send_to(&d, a);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    // 5. Forged barriers with guessable tokens.
    let hb3 = hb.clone();
    b.under("forged barriers", async move {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        loop {
            for token in 0..500u64 {
                for a in &hb3 {
                    let _ = sock.send_to(&encode_barrier(token, 0), a);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let d = b.pair.server.stats().detector.unwrap();
    assert!(
        d.datagrams_refused > 1000,
        "forged datagrams counted: {d:?}"
    );
    // The forged sources did not become heartbeat destinations: the
    // server still sends about one heartbeat per interval per network.
    let before = b.pair.server.stats().detector.unwrap().heartbeats_sent;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = b.pair.server.stats().detector.unwrap().heartbeats_sent - before;
    assert!(
        sent < 500,
        "{sent} heartbeats in 500 ms: sending to forged addresses"
    );
    b.pair.shutdown().await;
}

/// Insecure mode has no keys to tell a forged heartbeat from a real one:
/// a heartbeat in the name of a node the server neither dials nor holds a
/// connection from is refused, so a flood of made-up names becomes no
/// state and no destinations of its heartbeats, and the client's calls go
/// on. (Before the check every name became a destination, greeted at
/// once and sent every fence round.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_heartbeats_in_unknown_names_are_refused() {
    let mut lb = Loopback::new();
    lb.server.insecure = true;
    lb.client.insecure = true;
    let pair = lb.start().await.unwrap();
    pair.server.serve(|r: Request| async move { r.body });
    let hb = pair.server.heartbeat_addrs();
    let sent = |p: &LoopbackPair| p.server.stats().detector.unwrap().heartbeats_sent;
    let window = Duration::from_millis(1000);
    let before = sent(&pair);
    tokio::time::sleep(window).await;
    let quiet = sent(&pair) - before;

    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let names = 2000u64;
    for i in 0..names {
        let d = encode_heartbeat(ClusterId(9), NodeId(1000 + i), Epoch(1), 1, 0, 0, None);
        for a in &hb {
            let _ = sock.send_to(&d, a);
        }
        if i % 200 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = sent(&pair);
    tokio::time::sleep(window).await;
    let flooded = sent(&pair) - before;
    let d = pair.server.stats().detector.unwrap();
    eprintln!(
        "heartbeats sent per {window:?}: {quiet} quiet, {flooded} after the flood; refused {:?}",
        d.refused
    );
    assert!(
        flooded <= 2 * quiet + 50,
        "{flooded} heartbeats in {window:?} after the flood against {quiet} before: forged names became destinations"
    );
    assert!(
        d.refused.stranger >= names,
        "forged names counted as strangers: {:?}",
        d.refused
    );
    p50_us(&pair, 50).await;
    pair.shutdown().await;
}
