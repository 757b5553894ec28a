//! The proxy end to end on loopback: three cache nodes over two networks,
//! a raw memcached-protocol client, answers checked byte for byte
//! (memcached's own answers are checked by `tests/conformance.py`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use surelink_cache::local::LocalCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::{ask, connect_from, wait_until, wait_until_at};

async fn cluster() -> LocalCluster {
    LocalCluster::start(3, 16 << 20, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_across_nodes_answer_like_memcached() {
    let c = cluster().await;
    let mut s = connect(c.proxy.local_addr()).await;
    // Keys spread over the three nodes; a multi-get joins them in order,
    // repeats included, misses skipped.
    let mut req = Vec::new();
    for i in 0..30 {
        req.extend_from_slice(
            format!(
                "set key{i} {i} 0 {}\r\nvalue{i}\r\n",
                5 + i.to_string().len()
            )
            .as_bytes(),
        );
    }
    let got = ask(&mut s, &req, b"STORED\r\n".repeat(30).as_slice()).await;
    assert_eq!(got, b"STORED\r\n".repeat(30));
    let got = ask(&mut s, b"get key3 nope key17 key3 key29\r\n", b"END\r\n").await;
    assert_eq!(
        String::from_utf8(got).unwrap(),
        "VALUE key3 3 6\r\nvalue3\r\nVALUE key17 17 7\r\nvalue17\r\nVALUE key3 3 6\r\nvalue3\r\nVALUE key29 29 7\r\nvalue29\r\nEND\r\n"
    );
    let got = ask(
        &mut s,
        b"set n 0 0 2\r\n10\r\nincr n 5\r\ndecr n 20\r\nappend n 0 0 1\r\nx\r\nget n\r\ndelete n\r\ndelete n\r\n",
        b"NOT_FOUND\r\n",
    )
    .await;
    assert_eq!(
        String::from_utf8(got).unwrap(),
        "STORED\r\n15\r\n0\r\nSTORED\r\nVALUE n 0 3\r\n0 x\r\nEND\r\nDELETED\r\nNOT_FOUND\r\n"
    );
    // noreply: no answer, but applied before what follows.
    let got = ask(&mut s, b"set q 0 0 1 noreply\r\nz\r\nget q\r\n", b"END\r\n").await;
    assert_eq!(got, b"VALUE q 0 1\r\nz\r\nEND\r\n");
    // Bad input gets memcached's answers and the connection goes on.
    let got = ask(
        &mut s,
        b"bogus\r\nset a 0 0 2\r\nxyz\r\nversion\r\n",
        b"surelink\r\n",
    )
    .await;
    assert_eq!(
        String::from_utf8(got).unwrap(),
        "ERROR\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\nVERSION 1.6.18-surelink\r\n"
    );
    // A too-large set is refused and removes the old value.
    let mut big = b"set key1 0 0 2000000\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'x', 2_000_000));
    big.extend_from_slice(b"\r\nget key1\r\n");
    let got = ask(&mut s, &big, b"END\r\n").await;
    assert_eq!(got, b"SERVER_ERROR object too large for cache\r\nEND\r\n");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_fail_over_without_an_error() {
    let c = cluster().await;
    let mut s = connect(c.proxy.local_addr()).await;
    for round in 0..40 {
        if round % 10 == 5 {
            // Every connection of one network, on the proxy's side.
            let killed = c.proxy_ep.testing().kill_network(round / 10 % 2);
            assert!(killed > 0);
        }
        let v = format!("v{round}");
        let req = format!("set k{round} 0 0 {}\r\n{v}\r\nget k{round}\r\n", v.len());
        let got = ask(&mut s, req.as_bytes(), b"END\r\n").await;
        assert_eq!(
            String::from_utf8(got).unwrap(),
            format!("STORED\r\nVALUE k{round} 0 {}\r\n{v}\r\nEND\r\n", v.len())
        );
    }
    assert_eq!(
        c.proxy
            .stats()
            .node_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    c.shutdown().await;
}

/// A key the ring puts on `node` (and one on another node).
fn key_on(c: &LocalCluster, node: surelink::proto::NodeId, on: bool) -> String {
    let ring = surelink_cache::Ring::new(&c.node_ids());
    (0..)
        .map(|i| format!("key{i}"))
        .find(|k| (ring.node_for(k.as_bytes()) == Some(node)) == on)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_commands_go_to_the_next_node_in_order() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut c = cluster().await;
    let dead = surelink::proto::NodeId(2);
    let (k, other) = (key_on(&c, dead, true), key_on(&c, dead, false));
    let mut s = connect(c.proxy.local_addr()).await;
    let got = ask(
        &mut s,
        format!("set {other} 0 0 1\r\nx\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    c.kill_node(dead);
    // Sent while the node is dead but still in the ring: they wait for the
    // detector, then go to the key's next node in the order sent.
    let t = std::time::Instant::now();
    let req = format!(
        "set {k} 0 0 1\r\na\r\nappend {k} 0 0 1\r\nb\r\nset {k} 0 0 2\r\ncd\r\nappend {k} 0 0 1\r\ne\r\nget {other} {k}\r\n"
    );
    let got = match tokio::time::timeout(
        Duration::from_secs(8),
        ask(&mut s, req.as_bytes(), b"END\r\n"),
    )
    .await
    {
        Ok(g) => g,
        Err(_) => panic!(
            "not re-routed in 8 s: ejected {:?}, rerouted {}, errors {}, {}",
            c.proxy.ejected(),
            c.proxy.stats().rerouted.load(Relaxed),
            c.proxy.stats().node_errors.load(Relaxed),
            c.proxy_ep.testing().debug_session(dead)
        ),
    };
    assert_eq!(
        String::from_utf8(got).unwrap(),
        format!("STORED\r\nSTORED\r\nSTORED\r\nSTORED\r\nVALUE {other} 0 1\r\nx\r\nVALUE {k} 0 3\r\ncde\r\nEND\r\n")
    );
    let waited = t.elapsed();
    let st = c.proxy.stats();
    assert_eq!(st.node_errors.load(Relaxed), 0);
    assert_eq!(st.ejections.load(Relaxed), 1);
    assert!(
        st.rerouted.load(Relaxed) >= 4,
        "{}",
        st.rerouted.load(Relaxed)
    );
    assert_eq!(c.proxy.ejected(), vec![dead]);
    // The node's process is gone: its addresses refuse connections, which
    // the proxy takes as that at once (the detector's verdict would take
    // its 2 s window).
    assert!(waited < Duration::from_millis(1000), "{waited:?}");
    // Back, empty: its keys return to it.
    c.restart_node(dead).await.unwrap();
    wait_until("node not restored", Duration::from_secs(10), || {
        c.proxy.ejected().is_empty()
    })
    .await;
    let got = ask(
        &mut s,
        format!("get {k}\r\nset {k} 0 0 1\r\nz\r\nget {k}\r\n").as_bytes(),
        b"z\r\nEND\r\n",
    )
    .await;
    assert_eq!(
        String::from_utf8(got).unwrap(),
        format!("END\r\nSTORED\r\nVALUE {k} 0 1\r\nz\r\nEND\r\n")
    );
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    c.shutdown().await;
}

/// A node cut off (not crashed) long enough to be reported dead keeps its
/// items; its keys are written elsewhere meanwhile. When it is heard
/// again it rejoins the ring empty, so no client reads what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_and_back_serves_nothing_stale() {
    use std::sync::atomic::Ordering::Relaxed;
    let c = cluster().await;
    let node = surelink::proto::NodeId(3);
    let k = key_on(&c, node, true);
    let mut s = connect(c.proxy.local_addr()).await;
    let got = ask(
        &mut s,
        format!("set {k} 0 0 2\r\nv1\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    let ep = c.node(node).unwrap().clone();
    ep.testing().mute_network(0, true);
    ep.testing().mute_network(1, true);
    let within = Duration::from_secs(8);
    wait_until("node not ejected", within, || {
        c.proxy.ejected() == vec![node]
    })
    .await;
    let got = ask(
        &mut s,
        format!("set {k} 0 0 2\r\nv2\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    ep.testing().mute_network(0, false);
    ep.testing().mute_network(1, false);
    wait_until("node not restored", within, || c.proxy.ejected().is_empty()).await;
    // Back on its node, which still held v1 before it was emptied.
    let got = ask(&mut s, format!("get {k}\r\n").as_bytes(), b"END\r\n").await;
    assert_eq!(String::from_utf8(got).unwrap(), "END\r\n");
    assert_eq!(ep.stats().detector.unwrap().fences, 0, "a cut, not a fence");
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_idle_clients_harm_no_one() {
    let c = cluster().await;
    let addr = c.proxy.local_addr();
    // A line of garbage over 2 KiB: the connection is closed.
    let mut g = connect(addr).await;
    g.write_all(&[b'x'; 5000]).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), g.read(&mut b))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    // A declared length beyond a C int's: memcached's answer, nothing held.
    let mut h = connect(addr).await;
    let got = ask(&mut h, b"set a 0 0 2147483647\r\n", b"\r\n").await;
    assert_eq!(got, b"CLIENT_ERROR bad command line format\r\n");
    // 10 000 idle clients from ten addresses (under the per-address cap;
    // each costs the test two descriptors: its end and the proxy's); a
    // working one is still served, and quickly.
    let limit = surelink_sys::raise_fd_limit_to(24_000).unwrap_or(1024);
    let want = 10_000usize;
    let n = want.min(usize::try_from(limit.saturating_sub(1000) / 2).unwrap_or(0));
    if n < want {
        eprintln!("NOTE: {n} idle clients instead of {want}: open-file limit {limit} (raise it, or run as root)");
    }
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        idle.push(connect_from(addr, [127, 0, 3, 1 + u8::try_from(i / 1000).unwrap()], None).await);
    }
    // Every one was accepted (none refused at max_clients, 10 000 by default).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c
        .proxy
        .stats()
        .curr_connections
        .load(std::sync::atomic::Ordering::Relaxed)
        < n as u64
    {
        assert!(
            std::time::Instant::now() < deadline,
            "idle clients not all accepted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut s = connect(addr).await;
    let t = std::time::Instant::now();
    let got = ask(&mut s, b"set z 0 0 1\r\n1\r\nget z\r\n", b"END\r\n").await;
    assert_eq!(got, b"STORED\r\nVALUE z 0 1\r\n1\r\nEND\r\n");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{:?} with {n} idle clients",
        t.elapsed()
    );
    drop(idle);
    c.shutdown().await;
}

/// A node that dies, comes back and dies again: its keys go to the next
/// node both times, and the copies its first absence left there are gone
/// by the second (deleted once it was back) — no stale value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fails_twice_serves_nothing_stale() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut c = cluster().await;
    let node = surelink::proto::NodeId(2);
    let k = key_on(&c, node, true);
    let mut s = connect(c.proxy.local_addr()).await;
    let wait = |c: &LocalCluster, out: bool| c.proxy.ejected().contains(&node) == out;
    c.kill_node(node);
    wait_until("not ejected", Duration::from_secs(10), || wait(&c, true)).await;
    // Written on the next node while its own is out.
    let got = ask(
        &mut s,
        format!("set {k} 0 0 2\r\nv1\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    c.restart_node(node).await.unwrap();
    wait_until("not restored", Duration::from_secs(10), || wait(&c, false)).await;
    let got = ask(
        &mut s,
        format!("set {k} 0 0 2\r\nv2\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    // Give the clean-up its moment (it follows the restore).
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.kill_node(node);
    wait_until("not ejected", Duration::from_secs(10), || wait(&c, true)).await;
    // v2 died with the node (one replica); v1 must not come back.
    let got = ask(&mut s, format!("get {k}\r\n").as_bytes(), b"END\r\n").await;
    assert_eq!(String::from_utf8(got).unwrap(), "END\r\n");
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    c.shutdown().await;
}

/// Two nodes out: a key's own and the next; its write lands on the third.
/// When the second returns, that copy goes too (it stood in for both), so
/// a later failure of the second does not bring it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_stood_in_for_two_nodes_goes_when_either_returns() {
    let mut c = cluster().await;
    let ring = surelink_cache::Ring::new(&c.node_ids());
    let k = "sk";
    let chain = ring.replicas(k.as_bytes(), 3);
    let (o, n1) = (chain[0], chain[1]);
    let mut s = connect(c.proxy.local_addr()).await;
    let until = |c: &LocalCluster, want: usize| c.proxy.ejected().len() == want;
    c.kill_node(o);
    c.kill_node(n1);
    // One deadline for the three waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    wait_until_at("not ejected", deadline, || until(&c, 2)).await;
    let got = ask(
        &mut s,
        format!("set {k} 0 0 2\r\nv1\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    c.restart_node(n1).await.unwrap();
    wait_until_at("not restored", deadline, || until(&c, 1)).await;
    let got = ask(
        &mut s,
        format!("set {k} 0 0 2\r\nv2\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(got, b"STORED\r\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.kill_node(n1);
    wait_until_at("not ejected again", deadline, || until(&c, 2)).await;
    let got = ask(&mut s, format!("get {k}\r\n").as_bytes(), b"END\r\n").await;
    assert_eq!(String::from_utf8(got).unwrap(), "END\r\n");
    c.shutdown().await;
}

/// A client's pipelined `set k` then a multi-get naming `k` after a key
/// of another shard: the get sees the set (the node starts a command
/// that spans shards only after the commands sent before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_get_across_shards_sees_the_writes_before_it() {
    let c = cluster().await;
    let mut s = connect(c.proxy.local_addr()).await;
    for round in 0..5 {
        let mut req = Vec::new();
        let mut want = Vec::new();
        for i in 0..200 {
            req.extend_from_slice(
                format!("set k{round}x{i} 0 0 1\r\nv\r\nget z{i} k{round}x{i}\r\n").as_bytes(),
            );
            want.extend_from_slice(
                format!("STORED\r\nVALUE k{round}x{i} 0 1\r\nv\r\nEND\r\n").as_bytes(),
            );
        }
        s.write_all(&req).await.unwrap();
        // Every answer ends in END; count them rather than match bytes.
        let mut got = Vec::new();
        while got.windows(5).filter(|w| w == b"END\r\n").count() < 200 {
            let mut b = [0u8; 65536];
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
                .await
                .expect("answers in time")
                .unwrap();
            assert!(n > 0, "proxy closed");
            got.extend_from_slice(&b[..n]);
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "round {round}"
        );
    }
}
