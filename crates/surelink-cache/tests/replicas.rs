//! Replicated pools on loopback (three nodes, `replicas = 2`): a node's
//! death costs no miss and no error; a node cut off past its peer window
//! and back serves nothing stale; writes that depend on the item leave no
//! replica holding another value. Each replica's content is read
//! directly (a `get` sent to that node), not only through the proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use surelink::proto::NodeId;
use surelink_cache::local::{Items, LocalCluster};
use surelink_cache::{Ring, CACHE_CHANNEL};
use tokio::net::TcpStream;

mod common;
use common::ask_str as ask;

async fn cluster() -> LocalCluster {
    LocalCluster::start_tuned(
        3,
        Items::Embedded(16 << 20),
        "127.0.0.1:0".parse().unwrap(),
        |cfg| cfg.replicas = 2,
    )
    .await
    .unwrap()
}

/// What node `n` itself holds for `key` (its `get` answer).
async fn held(c: &LocalCluster, n: NodeId, key: &str) -> String {
    let r = c
        .proxy_ep
        .call(
            n,
            CACHE_CHANNEL,
            Bytes::from(format!("get {key}\r\n")),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    String::from_utf8(r.to_vec()).unwrap()
}

fn replicas(c: &LocalCluster, key: &str) -> Vec<NodeId> {
    Ring::new(&c.node_ids()).replicas(key.as_bytes(), 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_costs_no_miss_and_no_error() {
    let mut c = cluster().await;
    let mut s = TcpStream::connect(c.proxy.local_addr()).await.unwrap();
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    for k in &keys {
        assert_eq!(
            ask(
                &mut s,
                format!("set {k} 0 0 2\r\nv1\r\n").as_bytes(),
                b"\r\n"
            )
            .await,
            "STORED\r\n"
        );
    }
    // Both replicas hold every key; the third node none of them.
    for k in keys.iter().take(20) {
        let r = replicas(&c, k);
        for n in c.node_ids() {
            let want = if r.contains(&n) {
                format!("VALUE {k} 0 2\r\nv1\r\nEND\r\n")
            } else {
                "END\r\n".to_string()
            };
            assert_eq!(held(&c, n, k).await, want, "{k} on {n}");
        }
    }
    let dead = NodeId(2);
    c.kill_node(dead);
    // Reads while it is dead, before and after it is ejected: every key
    // found, none an error.
    for round in 0..2 {
        for chunk in keys.chunks(50) {
            let req = format!("get {}\r\n", chunk.join(" "));
            let got = ask(&mut s, req.as_bytes(), b"END\r\n").await;
            assert_eq!(
                got.matches("VALUE ").count(),
                chunk.len(),
                "round {round}: {got}"
            );
        }
        for k in keys.iter().take(50) {
            let got = ask(&mut s, format!("mg {k} v\r\nmn\r\n").as_bytes(), b"MN\r\n").await;
            assert_eq!(got, "VA 2\r\nv1\r\nMN\r\n", "round {round}: {k}");
        }
        common::wait_until("node not ejected", Duration::from_secs(10), || {
            c.proxy.ejected() == vec![dead]
        })
        .await;
    }
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    assert_eq!(c.proxy.stats().get_misses.load(Relaxed), 0);
    // Writes while it is out go to the live replica; back, it is empty
    // and reads still find every key (a miss there goes on).
    for k in &keys {
        ask(
            &mut s,
            format!("set {k} 0 0 2\r\nv2\r\n").as_bytes(),
            b"\r\n",
        )
        .await;
    }
    c.restart_node(dead).await.unwrap();
    common::wait_until("node not restored", Duration::from_secs(10), || {
        c.proxy.ejected().is_empty()
    })
    .await;
    for chunk in keys.chunks(50) {
        let req = format!("get {}\r\n", chunk.join(" "));
        let got = ask(&mut s, req.as_bytes(), b"END\r\n").await;
        assert_eq!(got.matches("v2\r\n").count(), chunk.len(), "{got}");
    }
    for k in keys
        .iter()
        .filter(|k| replicas(&c, k).contains(&dead))
        .take(20)
    {
        assert_eq!(held(&c, dead, k).await, "END\r\n", "{k}: back empty");
    }
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    assert_eq!(c.proxy.stats().get_misses.load(Relaxed), 0);
    c.shutdown().await;
}

/// A replica cut off (alive, its items kept) until it is ejected; its keys
/// are written meanwhile; when it is heard again it comes back empty and
/// no read through the proxy ever returns the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_and_back_serves_nothing_stale() {
    let c = cluster().await;
    let node = NodeId(3);
    let keys: Vec<String> = (0..200)
        .map(|i| format!("c{i}"))
        .filter(|k| replicas(&c, k).contains(&node))
        .take(40)
        .collect();
    let mut s = TcpStream::connect(c.proxy.local_addr()).await.unwrap();
    for k in &keys {
        ask(
            &mut s,
            format!("set {k} 0 0 3\r\nold\r\n").as_bytes(),
            b"\r\n",
        )
        .await;
    }
    let ep = c.node(node).unwrap().clone();
    ep.testing().mute_network(0, true);
    ep.testing().mute_network(1, true);
    common::wait_until("node not ejected", Duration::from_secs(10), || {
        c.proxy.ejected() == vec![node]
    })
    .await;
    for k in &keys {
        assert_eq!(
            ask(
                &mut s,
                format!("set {k} 0 0 3\r\nnew\r\n").as_bytes(),
                b"\r\n"
            )
            .await,
            "STORED\r\n"
        );
    }
    // It still holds the old values while cut off.
    ep.testing().mute_network(0, false);
    ep.testing().mute_network(1, false);
    // Reads all along its return: never the old value.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut back = false;
    while std::time::Instant::now() < deadline {
        for k in &keys {
            let got = ask(&mut s, format!("get {k}\r\n").as_bytes(), b"END\r\n").await;
            assert_eq!(got, format!("VALUE {k} 0 3\r\nnew\r\nEND\r\n"));
        }
        if c.proxy.ejected().is_empty() {
            if back {
                break;
            }
            back = true;
        }
    }
    assert!(back, "node not restored");
    for k in &keys {
        assert_eq!(held(&c, node, k).await, "END\r\n", "{k}: back empty");
    }
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    c.shutdown().await;
}

/// `incr`, `append`, `add` run on the first replica; the other loses the
/// key, so it never serves another value; `set` goes to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_depend_on_the_item_leave_no_replica_behind() {
    let c = cluster().await;
    let mut s = TcpStream::connect(c.proxy.local_addr()).await.unwrap();
    let k = "counter";
    let r = replicas(&c, k);
    ask(
        &mut s,
        format!("set {k} 0 0 1\r\n5\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    for n in &r {
        assert_eq!(
            held(&c, *n, k).await,
            format!("VALUE {k} 0 1\r\n5\r\nEND\r\n")
        );
    }
    assert_eq!(
        ask(&mut s, format!("incr {k} 3\r\n").as_bytes(), b"\r\n").await,
        "8\r\n"
    );
    assert_eq!(
        held(&c, r[0], k).await,
        format!("VALUE {k} 0 1\r\n8\r\nEND\r\n")
    );
    assert_eq!(held(&c, r[1], k).await, "END\r\n");
    // Reads, whichever replica they go to, see 8.
    for _ in 0..20 {
        assert_eq!(
            ask(&mut s, format!("get {k}\r\n").as_bytes(), b"END\r\n").await,
            format!("VALUE {k} 0 1\r\n8\r\nEND\r\n")
        );
    }
    // A failed conditional write changes nothing anywhere.
    ask(
        &mut s,
        format!("set {k} 0 0 1\r\n1\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    assert_eq!(
        ask(
            &mut s,
            format!("add {k} 0 0 1\r\n2\r\n").as_bytes(),
            b"\r\n"
        )
        .await,
        "NOT_STORED\r\n"
    );
    for n in &r {
        assert_eq!(
            held(&c, *n, k).await,
            format!("VALUE {k} 0 1\r\n1\r\nEND\r\n")
        );
    }
    // Meta: a quiet `ma` and an `ms` append leave the second without it.
    assert_eq!(
        ask(&mut s, format!("ma {k} q\r\nmn\r\n").as_bytes(), b"MN\r\n").await,
        "MN\r\n"
    );
    assert_eq!(held(&c, r[1], k).await, "END\r\n");
    assert_eq!(
        ask(&mut s, format!("mg {k} v\r\n").as_bytes(), b"2\r\n").await,
        "VA 1\r\n2\r\n"
    );
    assert_eq!(c.proxy.stats().node_errors.load(Relaxed), 0);
    c.shutdown().await;
}

/// A read that misses on one replica and goes on to the next keeps its
/// place in the client's order: a write pipelined after it, to the same
/// key, is not what it finds there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_going_on_to_the_next_replica_keeps_the_clients_order() {
    let c = cluster().await;
    let mut s = TcpStream::connect(c.proxy.local_addr()).await.unwrap();
    for i in 0..20 {
        let k = format!("o{i}");
        let r = replicas(&c, &k);
        ask(
            &mut s,
            format!("set {k} 0 0 2\r\nv1\r\n").as_bytes(),
            b"\r\n",
        )
        .await;
        // The first replica (where an idle proxy reads first) loses it.
        c.proxy_ep
            .call(
                r[0],
                CACHE_CHANNEL,
                Bytes::from(format!("delete {k}\r\n")),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let got = ask(
            &mut s,
            format!("get {k}\r\nset {k} 0 0 2\r\nv2\r\nget {k}\r\n").as_bytes(),
            b"v2\r\nEND\r\n",
        )
        .await;
        assert_eq!(
            got,
            format!("VALUE {k} 0 2\r\nv1\r\nEND\r\nSTORED\r\nVALUE {k} 0 2\r\nv2\r\nEND\r\n")
        );
    }
    c.shutdown().await;
}

/// `gat` is a write too: every replica takes the new exptime (a `gat -1`
/// expires the item everywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gat_gives_every_replica_the_new_exptime() {
    let c = cluster().await;
    let mut s = TcpStream::connect(c.proxy.local_addr()).await.unwrap();
    ask(&mut s, b"set gk 0 0 2\r\nv1\r\n", b"\r\n").await;
    assert_eq!(
        ask(&mut s, b"gat 100 gk\r\n", b"END\r\n").await,
        "VALUE gk 0 2\r\nv1\r\nEND\r\n"
    );
    assert_eq!(
        ask(&mut s, b"gat -1 gk\r\n", b"END\r\n").await,
        "VALUE gk 0 2\r\nv1\r\nEND\r\n"
    );
    for _ in 0..10 {
        assert_eq!(ask(&mut s, b"get gk\r\n", b"END\r\n").await, "END\r\n");
    }
    for n in replicas(&c, "gk") {
        assert_eq!(held(&c, n, "gk").await, "END\r\n", "on {n}");
    }
    c.shutdown().await;
}

/// A read pipelined after an `incr` sees it, whichever replica it goes
/// to (other connections keep the first replica busy, so reads go to the
/// second): the other replica's delete is queued before later commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_after_an_item_dependent_write_sees_it() {
    let c = cluster().await;
    let ring = Ring::new(&c.node_ids());
    let k = "cnt";
    let rk = ring.replicas(k.as_bytes(), 2);
    let others: Vec<String> = (0..500)
        .map(|i| format!("o{i}"))
        .filter(|o| {
            let r = ring.replicas(o.as_bytes(), 2);
            r.contains(&rk[0]) && !r.contains(&rk[1])
        })
        .take(30)
        .collect();
    let mut s = TcpStream::connect(c.proxy.local_addr()).await.unwrap();
    for o in &others {
        ask(
            &mut s,
            format!("set {o} 0 0 1\r\nx\r\n").as_bytes(),
            b"\r\n",
        )
        .await;
    }
    ask(
        &mut s,
        format!("set {k} 0 0 1\r\n0\r\n").as_bytes(),
        b"\r\n",
    )
    .await;
    let mut busy = Vec::new();
    for _ in 0..8 {
        let (addr, others) = (c.proxy.local_addr(), others.clone());
        busy.push(tokio::spawn(async move {
            let mut t = TcpStream::connect(addr).await.unwrap();
            loop {
                let mut req = String::new();
                for o in &others {
                    req.push_str(&format!("mg {o} v\r\n"));
                }
                req.push_str("mn\r\n");
                ask(&mut t, req.as_bytes(), b"MN\r\n").await;
            }
        }));
    }
    for i in 1..=300u32 {
        let got = ask(
            &mut s,
            format!("incr {k} 1\r\nmg {k} v\r\nmn\r\n").as_bytes(),
            b"MN\r\n",
        )
        .await;
        assert_eq!(
            got,
            format!("{i}\r\nVA {}\r\n{i}\r\nMN\r\n", i.to_string().len())
        );
    }
    for b in busy {
        // They loop for ever: one that ended failed (its connection was
        // closed or answered wrong).
        assert!(!b.is_finished(), "a busy connection failed");
        b.abort();
    }
    c.shutdown().await;
}
