//! A cache proxy with PostMan helpers (issue 28): it goes through a
//! helper to a node whose calls stay slow, answers stay right across the
//! move, and it goes direct again when the node is fast.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surelink::proto::helper::{ActivationConfig, BatcherConfig};
use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{Handler, HandlerError, HandlerFuture, Helper, Request};
use surelink_cache::text::Limits;
use surelink_cache::{Proxy, ProxyConfig, Shards, StoreHandler};
use tokio::net::TcpStream;

mod common;
use common::ask_open as ask;

/// The embedded store, each command delayed by `delay_ms`.
struct Slow {
    store: StoreHandler,
    delay_ms: Arc<AtomicU64>,
}

impl Handler for Slow {
    fn handle(&self, request: Request) -> HandlerFuture {
        // Applied now (the order the node started them in), answered late.
        let r = self.store.run(&request.body).map_err(HandlerError::from);
        let ms = self.delay_ms.load(Ordering::Relaxed);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            r
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_moves_to_a_helper_for_a_slow_node_and_back() {
    let mut lb = Loopback::new();
    lb.server.helpers = vec![NodeId(3), NodeId(5)];
    let p = lb.start().await.unwrap();
    let node = p.server.node();
    let delay_ms = Arc::new(AtomicU64::new(30));
    p.server.serve(Slow {
        store: StoreHandler::new(Arc::new(Shards::new(16 << 20, 4)), Limits::default()),
        delay_ms: delay_ms.clone(),
    });
    let mut helpers = Vec::new();
    for id in [3, 5] {
        let ep = p.add_client(NodeId(id), |_| {}).await.unwrap();
        let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let h = Helper::start(ep.clone(), listen, BatcherConfig::default(), 255)
            .await
            .unwrap();
        helpers.push((ep, h));
    }
    let mut pc = ProxyConfig::new("127.0.0.1:0".parse().unwrap(), vec![node]);
    pc.helpers = helpers.iter().map(|(_, h)| h.local_addr()).collect();
    let mut act = ActivationConfig::default();
    act.window = Duration::from_millis(100);
    act.sla = Duration::from_millis(20);
    act.release = Duration::from_millis(10);
    act.windows_below = 3;
    act.dwell = Duration::from_millis(500);
    pc.activation = act;
    let proxy = Proxy::start(Arc::new(p.client), pc).await.unwrap();
    let status = || proxy.helpers_status()[0].1.clone();
    assert_eq!(proxy.helpers_status()[0].0, node);
    let stop = AtomicBool::new(false);
    let wrong = AtomicU64::new(0);
    let clients = (0..2u32).map(|c| {
        let (stop, wrong) = (&stop, &wrong);
        let addr = proxy.local_addr();
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let (k, v) = (format!("k{c}-{i}"), format!("v{i}"));
                let set = format!("set {k} 0 0 {}\r\n{v}\r\n", v.len());
                if ask(&mut s, set.as_bytes(), b"\r\n").await != b"STORED\r\n" {
                    wrong.fetch_add(1, Ordering::Relaxed);
                }
                let want = format!("VALUE {k} 0 {}\r\n{v}\r\nEND\r\n", v.len());
                let got = ask(&mut s, format!("get {k}\r\n").as_bytes(), b"END\r\n").await;
                if got != want.as_bytes() {
                    wrong.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }
    });
    let script = async {
        let mut moved = false;
        for _ in 0..150 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if status().helper.is_some() {
                moved = true;
                break;
            }
        }
        assert!(moved, "the proxy went through a helper: {:?}", status());
        let via = status().helper.unwrap();
        let carrier = &helpers
            .iter()
            .find(|(_, h)| h.local_addr() == via)
            .unwrap()
            .1;
        let before = carrier.stats().bytes_out;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            carrier.stats().bytes_out > before,
            "the proxy's calls go through the helper: {:?}",
            carrier.stats()
        );
        delay_ms.store(0, Ordering::Relaxed);
        let mut direct = false;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if status().helper.is_none() {
                direct = true;
                break;
            }
        }
        assert!(direct, "the proxy went direct again: {:?}", status());
        assert_eq!(status().switches, 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures_util::future::join_all(clients), script);
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "every answer was right");
    let s = proxy.stats();
    assert_eq!(s.node_errors.load(Ordering::Relaxed), 0);
}
