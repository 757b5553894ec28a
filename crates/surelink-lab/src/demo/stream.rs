//! `surelink-lab demo --stream`: two endpoints on real loopback sockets
//! over two networks (127.0.1.x and 127.0.2.x), the client reaching the
//! server through a TCP/UDP relay on each (`surelink-relay`). A client
//! streams one-way messages on four channels; mid-stream the relay resets
//! every connection of network 0 (as `ss -K` would, both ends), later
//! those of network 1. The report says what arrived.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::DemoArgs;
use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{Endpoint, NetEvent, PeerConfig};
use surelink_relay::{LinkSpec, Relay};
use tokio::time::Instant;

const SERVER: NodeId = NodeId(1);
const CHANNELS: u64 = 4;

/// What the receiver saw.
#[derive(Default)]
struct Seen {
    next: HashMap<u16, u64>,
    delivered: u64,
    duplicated: u64,
    out_of_order: u64,
    /// (sent at ms, latency ms)
    latencies: Vec<(f64, f64)>,
}

pub(crate) async fn run(args: &DemoArgs) -> Result<()> {
    let seconds = args.seconds.unwrap_or(3);
    if args.interval_us == 0 || seconds == 0 {
        bail!("--interval-us and --seconds must be positive");
    }
    let second_kill = args.fail_at + args.down_for;
    if !(args.fail_at >= 0.0 && args.down_for > 0.0 && second_kill < seconds as f64) {
        bail!("both kills (--fail-at, --fail-at + --down-for) must fall inside the stream (--seconds)");
    }
    let (server, client, relay) = start()
        .await
        .context("starting two endpoints on 127.0.1.x and 127.0.2.x")?;
    let mut events = client.events();
    let n = seconds * 1_000_000 / args.interval_us;
    println!("surelink demo: two endpoints on loopback, two networks (127.0.1.x, 127.0.2.x)");
    for p in client.paths() {
        println!(
            "  path {} on network {}: {} -> {}",
            p.id, p.network, p.local, p.remote
        );
    }
    println!(
        "  streaming {n} one-way messages (64 B, one every {} µs, 4 channels) for {} s",
        args.interval_us, seconds
    );
    println!(
        "  t={:.3}s  reset every connection on network 0, both ends (as `ss -K`)",
        args.fail_at
    );
    println!(
        "  t={:.3}s  reset every connection on network 1",
        second_kill
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    let start = Instant::now();
    let receiver = {
        let server = server.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(m) = server.recv().await {
                let mut b = m.body.clone();
                if b.len() < 16 {
                    continue;
                }
                let seq = b.get_u64();
                let sent_ns = b.get_u64();
                let now_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let mut s = seen.lock();
                let next = s.next.entry(m.channel.0).or_insert(0);
                let expect = *next;
                if seq < expect {
                    s.duplicated += 1;
                    continue;
                }
                if seq > expect {
                    s.out_of_order += 1;
                }
                *s.next.entry(m.channel.0).or_insert(0) = seq + 1;
                s.delivered += 1;
                s.latencies.push((
                    sent_ns as f64 / 1e6,
                    now_ns.saturating_sub(sent_ns) as f64 / 1e6,
                ));
            }
        })
    };
    let killer = {
        let (net0, net1) = (relay.network(0), relay.network(1));
        let (a, b) = (args.fail_at, second_kill);
        tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(a)).await;
            let k0 = net0.kill();
            tokio::time::sleep_until(start + Duration::from_secs_f64(b)).await;
            let k1 = net1.kill();
            (k0, k1)
        })
    };
    let mut per_channel = [0u64; CHANNELS as usize];
    for i in 0..n {
        tokio::time::sleep_until(start + Duration::from_micros(i * args.interval_us)).await;
        let ch = (i % CHANNELS) as usize;
        let mut b = BytesMut::with_capacity(64);
        b.put_u64(per_channel[ch]);
        b.put_u64(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
        b.resize(64, 0);
        per_channel[ch] += 1;
        client
            .send(SERVER, ch as u16, Bytes::from(b))
            .await
            .context("send")?;
    }
    let (k0, k1) = killer.await.context("killer task")?;
    // Let the tail arrive.
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().delivered < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    receiver.abort();
    let mut timeline = Vec::new();
    while let Ok(e) = events.try_recv() {
        timeline.push(e);
    }
    let stats = client.stats();
    // The receiver is stopped: take what it saw out of the lock.
    let s = std::mem::take(&mut *seen.lock());
    let lost = n - s.delivered;
    println!();
    println!("  connections killed: {k0} on network 0, {k1} on network 1");
    for e in &timeline {
        match e {
            NetEvent::PathDown {
                path,
                network,
                resent,
                ..
            } => {
                println!("    path {path} (network {network}) down, {resent} in-flight frames re-sent on the other path")
            }
            NetEvent::PathUp { path, network, .. } => {
                println!("    path {path} (network {network}) up")
            }
            _ => {}
        }
    }
    println!();
    println!("  sent        {n:>8}");
    println!("  delivered   {:>8}", s.delivered);
    println!("  lost        {lost:>8}");
    println!("  duplicated  {:>8}", s.duplicated);
    println!("  out of order{:>8}", s.out_of_order);
    let resent: u64 = stats.sessions.iter().map(|(_, st)| st.resent).sum();
    println!(
        "  re-sent     {resent:>8}  (failover copies of in-flight frames: a message or a batch)"
    );
    let worst = |from: f64, to: f64| {
        s.latencies
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|&(_, l)| l)
            .fold(0.0, f64::max)
    };
    let mut lat: Vec<f64> = s.latencies.iter().map(|&(_, l)| l).collect();
    lat.sort_by(f64::total_cmp);
    if !lat.is_empty() {
        let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
        println!(
            "  message latency p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
            q(0.5),
            q(0.99),
            q(0.999),
            q(1.0)
        );
    }
    let f0 = args.fail_at * 1000.0;
    let f1 = second_kill * 1000.0;
    println!(
        "  worst message latency before the first kill      {:>8.3} ms",
        worst(0.0, f0 - 5.0)
    );
    println!(
        "  worst for messages sent around the first kill    {:>8.3} ms",
        worst(f0 - 5.0, f0 + 50.0)
    );
    println!(
        "  worst for messages sent around the second kill   {:>8.3} ms",
        worst(f1 - 5.0, f1 + 50.0)
    );
    println!(
        "  worst after both paths came back                 {:>8.3} ms",
        worst(f1 + 200.0, f64::MAX)
    );
    let ok = lost == 0 && s.duplicated == 0 && s.out_of_order == 0;
    client.shutdown().await;
    server.shutdown().await;
    relay.shutdown().await;
    if !ok {
        bail!("the demo lost, doubled or reordered messages");
    }
    println!("  every message arrived exactly once and in order per channel");
    Ok(())
}

/// The server (node 1) on 127.0.1.1 and 127.0.2.1, a relay link in front
/// of each of its addresses (on 127.0.N.100, leaving from 127.0.N.101),
/// and the client (node 2) dialling the links; both paths up on both.
async fn start() -> Result<(Endpoint, Endpoint, Relay)> {
    let lb = Loopback::new();
    let server = Endpoint::bind(lb.server)
        .await
        .context("binding the server")?;
    let relay = Relay::new();
    let mut via = Vec::new();
    for (net, upstream) in server.local_addrs().into_iter().enumerate() {
        let ip = |host| std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, net as u8 + 1, host));
        let spec =
            LinkSpec::new(net, std::net::SocketAddr::new(ip(100), 0), upstream).from_ip(ip(101));
        via.push(Some(
            relay.add_link(spec).await.context("a relay link")?.listen,
        ));
    }
    let mut cc = lb.client;
    cc.peers = vec![PeerConfig::new(server.node(), via)];
    let client = Endpoint::bind(cc).await.context("binding the client")?;
    for (ep, peer) in [(&client, server.node()), (&server, client.node())] {
        if !ep.wait_for_paths(peer, 2, Duration::from_secs(10)).await {
            bail!("node {}: both paths did not come up within 10 s", ep.node());
        }
    }
    Ok((server, client, relay))
}
