//! The proxy's bounds on loopback (three nodes, a second proxy with the
//! limits under test on the cluster's proxy endpoint): a client that
//! never reads holds at most its reply bound, a key named many times is
//! fetched once, a multi-get fetched in chunks keeps the client's order,
//! clients per address are capped, idle ones closed, and binary-protocol
//! bytes are read as text (memcached with `-B ascii`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use surelink_cache::local::LocalCluster;
use surelink_cache::{Proxy, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::{ask, connect_from, read_until};

async fn cluster() -> LocalCluster {
    LocalCluster::start(3, 256 << 20, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A proxy on the cluster's proxy endpoint, `tune` applied to its config.
async fn proxy(c: &LocalCluster, tune: impl FnOnce(&mut ProxyConfig)) -> Proxy {
    let mut cfg = ProxyConfig::new("127.0.0.1:0".parse().unwrap(), c.node_ids());
    tune(&mut cfg);
    Proxy::start(c.proxy_ep.clone(), cfg).await.unwrap()
}

/// Whether the proxy closed `s` (EOF or reset) within 5 s.
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

fn set(key: &str, value: &[u8]) -> Vec<u8> {
    let mut r = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\n");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_holds_at_most_its_reply_bound() {
    const BOUND: usize = 4 << 20;
    let c = cluster().await;
    let p = proxy(&c, |cfg| cfg.max_reply_bytes = BOUND).await;
    let addr = p.local_addr();
    let mut setter = TcpStream::connect(addr).await.unwrap();
    let value = vec![b'v'; 512 << 10];
    let keys: Vec<String> = (0..100).map(|i| format!("big{i}")).collect();
    for k in &keys {
        assert_eq!(
            ask(&mut setter, &set(k, &value), b"\r\n").await,
            b"STORED\r\n"
        );
    }
    // 50 MiB asked for in one 1 KB line; the client reads nothing.
    let mut hog = connect_from(addr, [127, 0, 0, 1], Some(64 << 10)).await;
    let before = c.proxy_ep.stats().bytes_received;
    hog.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())
        .await
        .unwrap();
    let mut most = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        most = most.max(p.stats().reply_bytes.load(Relaxed));
    }
    assert!(most > 0, "the multi-get never started");
    assert!(most <= BOUND as u64, "{most} outstanding reply bytes");
    let fetched = c.proxy_ep.stats().bytes_received - before;
    assert!(
        fetched < 20 << 20,
        "{fetched} bytes fetched for a client that reads nothing"
    );
    eprintln!("most outstanding {most} B, fetched {fetched} B");
    assert!(p.stats().reply_pauses.load(Relaxed) >= 1);
    // Another client is served meanwhile.
    let mut other = TcpStream::connect(addr).await.unwrap();
    let got = ask(
        &mut other,
        b"set small 0 0 1\r\nx\r\nget small\r\n",
        b"END\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\nVALUE small 0 1\r\nx\r\nEND\r\n");
    // The reader wakes up: the whole answer, in the order asked.
    let got = read_until(&mut hog, b"END\r\n").await;
    let mut want = Vec::new();
    for k in &keys {
        want.extend_from_slice(format!("VALUE {k} 0 {}\r\n", value.len()).as_bytes());
        want.extend_from_slice(&value);
        want.extend_from_slice(b"\r\n");
    }
    want.extend_from_slice(b"END\r\n");
    assert!(
        got == want,
        "the answer differs ({} bytes, want {})",
        got.len(),
        want.len()
    );
    // Everything written: nothing outstanding left.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(p.stats().reply_bytes.load(Relaxed), 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_named_many_times_is_fetched_once_and_answered_each_time() {
    let c = cluster().await;
    let p = proxy(&c, |_| {}).await;
    let mut s = TcpStream::connect(p.local_addr()).await.unwrap();
    let value = vec![b'r'; 512 << 10];
    assert_eq!(
        ask(&mut s, &set("rep", &value), b"\r\n").await,
        b"STORED\r\n"
    );
    let before = c.proxy_ep.stats().bytes_received;
    let req = format!("get {}\r\n", vec!["rep"; 400].join(" "));
    let got = ask(&mut s, req.as_bytes(), b"END\r\n").await;
    let fetched = c.proxy_ep.stats().bytes_received - before;
    let block = value.len() + "VALUE rep 0 524288\r\n\r\n".len();
    assert_eq!(got.len(), 400 * block + 5);
    assert!(got.starts_with(b"VALUE rep 0 524288\r\nrrr"));
    // 400 repeats would be 200 MiB from the nodes; one fetch is 512 KiB.
    assert!(fetched < 2 << 20, "{fetched} bytes fetched");
    assert_eq!(p.stats().get_hits.load(Relaxed), 400);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_get_fetched_in_chunks_keeps_the_clients_order() {
    let c = cluster().await;
    // Four keys of the largest item per chunk.
    let p = proxy(&c, |cfg| {
        cfg.limits.max_item = 4096;
        cfg.max_reply_bytes = 4 * 4096;
    })
    .await;
    let mut s = TcpStream::connect(p.local_addr()).await.unwrap();
    let mut req = Vec::new();
    for i in 0..50 {
        req.extend_from_slice(&set(&format!("k{i}"), format!("old{i}").as_bytes()));
    }
    let got = ask(&mut s, &req, &b"STORED\r\n".repeat(50)).await;
    assert_eq!(got, b"STORED\r\n".repeat(50));
    // The multi-get, then a set of its last key and a get of it, in one
    // write: the multi-get sees the old value (it was sent first).
    let keys: Vec<String> = (0..50)
        .map(|i| format!("k{i}"))
        .chain(["k3".into(), "nope".into(), "k3".into()])
        .collect();
    let mut req = format!("get {}\r\n", keys.join(" ")).into_bytes();
    req.extend_from_slice(&set("k49", b"new"));
    req.extend_from_slice(b"get k49\r\n");
    let got = ask(&mut s, &req, b"VALUE k49 0 3\r\nnew\r\nEND\r\n").await;
    let mut want = String::new();
    for i in (0..50).chain([3, 3]) {
        let v = format!("old{i}");
        want.push_str(&format!("VALUE k{i} 0 {}\r\n{v}\r\n", v.len()));
    }
    want.push_str("END\r\nSTORED\r\nVALUE k49 0 3\r\nnew\r\nEND\r\n");
    assert_eq!(String::from_utf8(got).unwrap(), want);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_per_source_address_are_capped() {
    let c = cluster().await;
    let p = proxy(&c, |cfg| cfg.max_clients_per_addr = 3).await;
    let addr = p.local_addr();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from(addr, [127, 0, 0, 1], None).await;
        assert_eq!(
            ask(&mut s, b"version\r\n", b"\r\n").await,
            b"VERSION 1.6.18-surelink\r\n"
        );
        held.push(s);
    }
    let mut fourth = connect_from(addr, [127, 0, 0, 1], None).await;
    assert!(
        closed(&mut fourth).await,
        "a fourth client from one address"
    );
    assert_eq!(p.stats().rejected_per_addr.load(Relaxed), 1);
    // Another address is not held back.
    let mut elsewhere = connect_from(addr, [127, 0, 3, 20], None).await;
    assert_eq!(
        ask(&mut elsewhere, b"version\r\n", b"\r\n").await,
        b"VERSION 1.6.18-surelink\r\n"
    );
    // A place freed is a place again.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while p.stats().curr_connections.load(Relaxed) > 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the closed client's place"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut again = connect_from(addr, [127, 0, 0, 1], None).await;
    assert_eq!(
        ask(&mut again, b"version\r\n", b"\r\n").await,
        b"VERSION 1.6.18-surelink\r\n"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_are_closed_and_busy_ones_are_not() {
    let c = cluster().await;
    let p = proxy(&c, |cfg| cfg.idle_timeout = Duration::from_millis(300)).await;
    let addr = p.local_addr();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let mut busy = TcpStream::connect(addr).await.unwrap();
    // Busy: a command every 100 ms for 1.2 s, each answered.
    for _ in 0..12 {
        assert_eq!(
            ask(&mut busy, b"version\r\n", b"\r\n").await,
            b"VERSION 1.6.18-surelink\r\n"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed(&mut idle).await, "the idle client is still open");
    assert_eq!(p.stats().idle_kicks.load(Relaxed), 1);
    c.shutdown().await;
}

/// A binary request: magic, opcode, key length 0, no extras, `body`
/// bytes of body, opaque.
fn binary(opcode: u8, body: &[u8], opaque: u32) -> Vec<u8> {
    let mut b = vec![0x80, opcode, 0, 0, 0, 0, 0, 0];
    b.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    b.extend_from_slice(&opaque.to_be_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(body);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_protocol_bytes_are_read_as_text_as_memcached_b_ascii_does() {
    let c = cluster().await;
    let p = proxy(&c, |_| {}).await;
    // A binary GET has no newline byte: nothing is answered, the
    // connection stays open (memcached `-B ascii` waits the same way).
    let mut s = TcpStream::connect(p.local_addr()).await.unwrap();
    s.write_all(&binary(0x00, b"", 7)).await.unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), s.read(&mut byte))
            .await
            .is_err(),
        "a binary request without a newline got an answer"
    );
    // Once a newline comes, the line (read up to its first NUL) is an
    // unknown command; the text protocol goes on after it.
    s.write_all(b"\r\nversion\r\n").await.unwrap();
    let mut got = [0u8; 64];
    let mut n = 0;
    while !got[..n].ends_with(b"-surelink\r\n") {
        n += tokio::time::timeout(Duration::from_secs(5), s.read(&mut got[n..]))
            .await
            .expect("answered")
            .unwrap();
    }
    assert_eq!(&got[..n], b"ERROR\r\nVERSION 1.6.18-surelink\r\n");
    c.shutdown().await;
}
