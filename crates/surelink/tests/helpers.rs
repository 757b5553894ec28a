//! Helpers (PostMan, issue 28) on real loopback sockets: clients reach a
//! server through a helper's relay, end to end authenticated, and lose
//! nothing when a helper goes.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use surelink::proto::helper::BatcherConfig;
use surelink::proto::NodeId;
use surelink::testing::{fresh_keys, Loopback, LoopbackPair};
use surelink::{Config, Endpoint, Helper, PeerConfig, Request};

const SERVER: NodeId = NodeId(1);
const CHANNEL: u16 = 3;

/// The server (accepting helpers `helpers`) and its first client.
async fn pair(helpers: &[NodeId]) -> LoopbackPair {
    let mut lb = Loopback::new();
    lb.server.helpers = helpers.to_vec();
    lb.start().await.unwrap()
}

/// A helper: node `node` dialling the server directly, relaying on a
/// free loopback port.
async fn helper(p: &LoopbackPair, node: NodeId) -> (Endpoint, Helper) {
    let ep = p.add_client(node, |_| {}).await.unwrap();
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let h = Helper::start(ep.clone(), listen, BatcherConfig::default(), 255)
        .await
        .unwrap();
    (ep, h)
}

/// A client that knows the server's key but has no direct address for
/// it (`direct` false) or has both networks' (`direct` true).
async fn client(p: &LoopbackPair, node: NodeId, direct: bool) -> Endpoint {
    let keys = fresh_keys();
    let mut c = Config::new(node, p.server.cluster());
    c.identity = Some(keys.clone());
    c.members.insert(node, keys.public()).unwrap();
    c.members
        .insert(SERVER, p.server.public_key().unwrap())
        .unwrap();
    let last = 10u8.wrapping_add(node.0.to_le_bytes()[0]);
    c.dial_from = (1..=2u8)
        .map(|net| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, net, last)), 0))
        .collect();
    if direct {
        let addrs = p.server.local_addrs().into_iter().map(Some).collect();
        c.peers = vec![PeerConfig::new(SERVER, addrs)];
    }
    p.server.add_member(node, keys.public()).unwrap();
    Endpoint::bind(c).await.unwrap()
}

/// Caller `k`: numbered calls to the server until `stop`; a failed or
/// wrong reply counts in `failed`.
async fn call_until(
    c: &Endpoint,
    k: u32,
    stop: &std::sync::atomic::AtomicBool,
    failed: &std::sync::atomic::AtomicU64,
) {
    use std::sync::atomic::Ordering;
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let body = Bytes::from([k.to_be_bytes(), i.to_be_bytes()].concat());
        match c
            .call(SERVER, 1, body.clone(), Duration::from_secs(5))
            .await
        {
            Ok(r) if r == body => {}
            _ => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        i += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_through_a_helper_reach_the_server_end_to_end() {
    let p = pair(&[NodeId(3)]).await;
    p.server.serve(|r: Request| async move { r.body });
    let (_hep, h) = helper(&p, NodeId(3)).await;
    let c = client(&p, NodeId(4), false).await;
    let _path = c.relay_via(SERVER, h.local_addr(), 0);
    assert!(c.wait_for_paths(SERVER, 1, Duration::from_secs(10)).await);
    let calls = (0..200u32).map(|i| {
        let c = &c;
        async move {
            let body = Bytes::from(i.to_be_bytes().to_vec());
            let reply = c
                .call(SERVER, 1, body.clone(), Duration::from_secs(5))
                .await;
            assert_eq!(reply.unwrap(), body);
        }
    });
    futures_util::future::join_all(calls).await;
    let s = h.stats();
    assert_eq!(s.clients, 1);
    assert!(
        s.records_out >= 3,
        "OPEN, handshake and calls went through: {s:?}"
    );
    assert!(
        s.messages_in > 0,
        "replies came back through the helper: {s:?}"
    );
    // The only way to the server is the helper.
    assert!(c.paths().iter().all(|p| p.peer == Some(SERVER)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ignores_relay_records_from_a_member_not_listed_as_helper() {
    // Node 3 relays, but the server lists no helper: its relay messages
    // are the application's, and no client connection opens through it.
    let p = pair(&[]).await;
    p.server.serve(|r: Request| async move { r.body });
    let (_hep, h) = helper(&p, NodeId(3)).await;
    let c = client(&p, NodeId(4), false).await;
    let _path = c.relay_via(SERVER, h.local_addr(), 0);
    assert!(
        !c.wait_for_paths(SERVER, 1, Duration::from_millis(1500))
            .await
    );
    let m = tokio::time::timeout(Duration::from_secs(2), p.server.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((m.peer, m.channel.0), (NodeId(3), 255));
}

/// One-way messages numbered 0..N from a client whose only way to the
/// server is helper A; halfway, with messages in flight, A is shut down
/// and the client given helper B. The server gets every number once, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_gone_under_load_loses_nothing_and_keeps_order() {
    let p = pair(&[NodeId(3), NodeId(5)]).await;
    let (hep_a, ha) = helper(&p, NodeId(3)).await;
    let (_hep_b, hb) = helper(&p, NodeId(5)).await;
    let c = client(&p, NodeId(4), false).await;
    let _a = c.relay_via(SERVER, ha.local_addr(), 0);
    assert!(c.wait_for_paths(SERVER, 1, Duration::from_secs(10)).await);
    let mut gone = Some((hep_a, ha));
    let mut via_b = None;
    const N: u32 = 20_000;
    let sender = async {
        for i in 0..N {
            c.send(SERVER, CHANNEL, Bytes::from(i.to_be_bytes().to_vec()))
                .await
                .unwrap();
            if i == N / 2 {
                let (ep, h) = gone.take().unwrap();
                // A has carried a good part of the first half (each
                // message is at least its 4 bytes on the wire).
                let mut waited = 0;
                while h.stats().bytes_out < 4 * u64::from(N) / 4 && waited < 500 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    waited += 1;
                }
                let s = h.stats();
                assert!(
                    s.bytes_out >= 4 * u64::from(N) / 4,
                    "helper A carried the traffic: {s:?}"
                );
                drop(h);
                ep.shutdown().await;
                via_b = Some(c.relay_via(SERVER, hb.local_addr(), 1));
            }
            if i % 64 == 0 {
                tokio::task::yield_now().await;
            }
        }
    };
    let receiver = async {
        let mut next = 0u32;
        while next < N {
            let m = tokio::time::timeout(Duration::from_secs(10), p.server.recv())
                .await
                .expect("messages keep coming through the next helper")
                .unwrap();
            assert_eq!(m.peer, NodeId(4));
            let got = u32::from_be_bytes(m.body[..4].try_into().unwrap());
            assert_eq!(got, next, "every message once, in order");
            next += 1;
        }
    };
    tokio::join!(sender, receiver);
    let s = hb.stats();
    assert!(
        s.bytes_out > 4 * u64::from(N) / 4,
        "helper B carried the rest: {s:?}"
    );
    drop(via_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_continue_direct_when_the_helper_is_killed() {
    let p = pair(&[NodeId(3)]).await;
    p.server.serve(|r: Request| async move { r.body });
    let (hep, h) = helper(&p, NodeId(3)).await;
    let c = client(&p, NodeId(4), true).await;
    let path = c.relay_via(SERVER, h.local_addr(), 0);
    assert!(c.wait_for_paths(SERVER, 3, Duration::from_secs(10)).await);
    assert!(path.is_up());
    let calls = (0..2000u32).map(|i| {
        let c = &c;
        async move {
            let body = Bytes::from(i.to_be_bytes().to_vec());
            c.call(SERVER, 1, body.clone(), Duration::from_secs(5))
                .await
                .map(|r| r == body)
        }
    });
    let killer = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(h);
        hep.shutdown().await;
    };
    let (results, ()) = tokio::join!(futures_util::future::join_all(calls), killer);
    assert!(
        results.iter().all(|r| matches!(r, Ok(true))),
        "every call answered, right"
    );
}

/// A helper that stops forwarding with its connections open (frozen)
/// while calls are in flight through it (the handler takes 100 ms), and
/// the client then given a direct path: the frozen path is never closed,
/// yet every call is answered — the replies and any re-sent frames take
/// the healthy paths — and run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_continue_direct_when_the_helper_freezes() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let p = pair(&[NodeId(3)]).await;
    let runs = std::sync::Arc::new(AtomicU64::new(0));
    let r2 = runs.clone();
    p.server.serve(move |r: Request| {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::Relaxed);
            // Slow enough that the replies are still to come when the
            // helper freezes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            r.body
        }
    });
    let (_hep, h) = helper(&p, NodeId(3)).await;
    let c = client(&p, NodeId(4), false).await;
    let _path = c.relay_via(SERVER, h.local_addr(), 0);
    assert!(c.wait_for_paths(SERVER, 1, Duration::from_secs(10)).await);
    const N: u32 = 3000;
    let before = h.stats().bytes_out;
    let calls = (0..N).map(|i| {
        let c = &c;
        async move {
            let body = Bytes::from(i.to_be_bytes().to_vec());
            c.call(SERVER, 1, body.clone(), Duration::from_secs(10))
                .await
                .map(|r| r == body)
        }
    });
    let freezer = async {
        // Frozen once it carried some of the calls.
        for _ in 0..2000 {
            if h.stats().bytes_out > before + 2_000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        h.pause(true);
        let carried = h.stats().bytes_out - before;
        c.add_peer(PeerConfig::new(
            SERVER,
            p.server.local_addrs().into_iter().map(Some).collect(),
        ));
        carried
    };
    let (results, carried) = tokio::join!(futures_util::future::join_all(calls), freezer);
    assert!(
        carried > 2_000,
        "the helper carried calls before it froze: {carried} bytes"
    );
    let ok = results.iter().filter(|r| matches!(r, Ok(true))).count();
    assert_eq!(ok, N as usize, "every call answered, right");
    assert_eq!(runs.load(Ordering::Relaxed), u64::from(N), "each run once");
}

/// Activation: a client whose p99 passes its SLA (the server's handler
/// slowed) moves to one of two helpers and its traffic goes through it;
/// once the p99 is back under the release threshold (handler fast again)
/// for its windows and past the dwell, it goes direct again. No call
/// fails across either move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_moves_to_a_helper_above_its_sla_and_back_below() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use surelink::proto::helper::ActivationConfig;
    let p = pair(&[NodeId(3), NodeId(5)]).await;
    let slow = std::sync::Arc::new(AtomicU64::new(30));
    let s2 = slow.clone();
    p.server.serve(move |r: Request| {
        let ms = s2.load(Ordering::Relaxed);
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            r.body
        }
    });
    let (_e3, h3) = helper(&p, NodeId(3)).await;
    let (_e5, h5) = helper(&p, NodeId(5)).await;
    let c = client(&p, NodeId(4), true).await;
    let mut cfg = ActivationConfig::default();
    cfg.window = Duration::from_millis(100);
    cfg.sla = Duration::from_millis(20);
    cfg.release = Duration::from_millis(10);
    cfg.windows_above = 2;
    cfg.windows_below = 3;
    cfg.dwell = Duration::from_millis(500);
    let helped = c
        .helped(SERVER, vec![h3.local_addr(), h5.local_addr()], 0, cfg)
        .unwrap();
    let stop = AtomicBool::new(false);
    let failed = AtomicU64::new(0);
    let callers = (0..4u32).map(|k| call_until(&c, k, &stop, &failed));
    let script = async {
        // Slow: within a few windows the client goes through a helper.
        let mut moved = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if helped.status().helper.is_some() {
                moved = true;
                break;
            }
        }
        assert!(moved, "moved to a helper: {:?}", helped.status());
        let via = helped.status().helper.unwrap();
        let carrier = if via == h3.local_addr() { &h3 } else { &h5 };
        let before = carrier.stats().bytes_out;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            carrier.stats().bytes_out > before,
            "the calls go through the helper: {:?}",
            carrier.stats()
        );
        // Fast again: back direct after 3 windows under 10 ms and the dwell.
        slow.store(0, Ordering::Relaxed);
        let mut direct = false;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if helped.status().helper.is_none() {
                direct = true;
                break;
            }
        }
        assert!(direct, "went direct again: {:?}", helped.status());
        assert_eq!(helped.status().switches, 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures_util::future::join_all(callers), script);
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no call failed across the moves"
    );
}

/// A server so hot that it answers nothing still looks slow: a call
/// waiting past the SLA counts at its wait so far, so the client moves
/// though no call has ended (by the p99 of ended calls alone it would
/// wait for ever), and its calls then reach the server through the
/// helper, relayed ones answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_calls_get_no_answer_moves_to_a_helper() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use surelink::proto::helper::ActivationConfig;
    let p = pair(&[NodeId(3)]).await;
    // Calls that arrive before the move wait (for ever, as far as the
    // window goes); once the client moved, the server answers.
    let answering = std::sync::Arc::new(AtomicBool::new(false));
    let a2 = answering.clone();
    p.server.serve(move |r: Request| {
        let a2 = a2.clone();
        async move {
            while !a2.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            r.body
        }
    });
    let (_e3, h3) = helper(&p, NodeId(3)).await;
    let c = client(&p, NodeId(4), true).await;
    let mut cfg = ActivationConfig::default();
    cfg.sla = Duration::from_millis(20);
    cfg.release = Duration::from_millis(10);
    let helped = c.helped(SERVER, vec![h3.local_addr()], 0, cfg).unwrap();
    let waiting = c.call(
        SERVER,
        1,
        Bytes::from_static(b"first"),
        Duration::from_secs(30),
    );
    let script = async {
        let mut moved = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if helped.status().helper.is_some() {
                moved = true;
                break;
            }
        }
        assert!(
            moved,
            "moved to a helper with no call ended: {:?}",
            helped.status()
        );
        assert!(
            helped.status().last_p99_us.is_some_and(|us| us >= 20_000),
            "the wait counted: {:?}",
            helped.status()
        );
        answering.store(true, Ordering::Relaxed);
    };
    let (first, ()) = tokio::join!(waiting, script);
    assert_eq!(first.unwrap(), Bytes::from_static(b"first"));
}

/// Anyone can connect to a helper, so a helper could make a server run
/// any number of handshakes at once: the server takes at most
/// `max_handshaking` (128) of one helper's slots in their handshake and
/// closes the rest (the helper then closes those clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_cannot_make_the_server_handshake_more_than_its_bound() {
    use surelink::proto::helper::Preamble;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = pair(&[NodeId(3)]).await;
    let (_hep, h) = helper(&p, NodeId(3)).await;
    // 200 connections that name the server and then say nothing: each
    // slot waits in its handshake at the server.
    let mut conns = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(h.local_addr())
            .await
            .unwrap();
        s.write_all(&Preamble::Relay { server: SERVER }.encode())
            .await
            .unwrap();
        conns.push(s);
    }
    // The refused ones are closed: their read ends (after the server's
    // first handshake bytes, which every slot gets).
    let reads = conns.into_iter().map(|mut s| async move {
        let mut b = [0u8; 64];
        let until_eof = async {
            loop {
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(1), until_eof)
            .await
            .unwrap_or(false)
    });
    let closed = futures_util::future::join_all(reads)
        .await
        .into_iter()
        .filter(|c| *c)
        .count();
    assert!(
        (72..200).contains(&closed),
        "{closed} of 200 closed: at most 128 wait in their handshake"
    );
    // A real client still gets through once those time out or go.
    let c = client(&p, NodeId(4), false).await;
    let _path = c.relay_via(SERVER, h.local_addr(), 0);
    assert!(c.wait_for_paths(SERVER, 1, Duration::from_secs(10)).await);
}

/// How the helper in use stops serving in [`leaves_a_helper_for_another`].
#[derive(Clone, Copy)]
enum Gone {
    /// Shut down: its connections close.
    Dies,
    /// Paused with its connections open.
    Freezes,
}

/// A client moves to one of two helpers (the server stays slow), then
/// the helper in use goes (`gone`): activation leaves it and goes through
/// the other within `within`; no call fails meanwhile (the session
/// carries them on its direct paths).
async fn leaves_a_helper_for_another(gone: Gone, within: Duration) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use surelink::proto::helper::ActivationConfig;
    let p = pair(&[NodeId(3), NodeId(5)]).await;
    p.server.serve(move |r: Request| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        r.body
    });
    let mut helpers = vec![helper(&p, NodeId(3)).await, helper(&p, NodeId(5)).await];
    let c = client(&p, NodeId(4), true).await;
    let mut cfg = ActivationConfig::default();
    cfg.sla = Duration::from_millis(20);
    cfg.release = Duration::from_millis(10);
    let addrs: Vec<SocketAddr> = helpers.iter().map(|(_, h)| h.local_addr()).collect();
    let helped = c.helped(SERVER, addrs, 0, cfg).unwrap();
    let stop = AtomicBool::new(false);
    let failed = AtomicU64::new(0);
    let callers = (0..4u32).map(|k| call_until(&c, k, &stop, &failed));
    let script = async {
        let mut first = None;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let st = helped.status();
            if st.relayed {
                first = st.helper;
                break;
            }
        }
        let first = first.expect("moved to a helper, path up");
        let i = helpers
            .iter()
            .position(|(_, h)| h.local_addr() == first)
            .unwrap();
        let (ep, h) = helpers.remove(i);
        let other = helpers[0].1.local_addr();
        let _frozen = match gone {
            Gone::Dies => {
                drop(h);
                ep.shutdown().await;
                None
            }
            Gone::Freezes => {
                h.pause(true);
                Some((ep, h))
            }
        };
        let t = std::time::Instant::now();
        let mut moved = false;
        while t.elapsed() < within {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if helped.status().helper == Some(other) {
                moved = true;
                break;
            }
        }
        assert!(
            moved,
            "left the helper for the other: {:?}",
            helped.status()
        );
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures_util::future::join_all(callers), script);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no call failed");
}

/// The helper in use dies: its path stays down, and within about a
/// second activation leaves it for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaves_a_helper_that_died_for_another() {
    leaves_a_helper_for_another(Gone::Dies, Duration::from_secs(4)).await;
}

/// The helper in use freezes with its connections open: frames through
/// it go unanswered, the session suspects its path and sends around it,
/// and after a second of that activation leaves it for the other (the
/// frozen one does not answer its load query, so it is not drawn back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaves_a_helper_that_froze_for_another() {
    leaves_a_helper_for_another(Gone::Freezes, Duration::from_secs(5)).await;
}

/// The helper freezes before the client's path through it is up: it
/// still accepts connections (its kernel does) and answers nothing of
/// the handshake. The client, moved to it, must not wait for the
/// handshake's deadline (10 s): an attempt under way past
/// `ATTEMPT_STALL` (2 s) counts as failing, and a second later
/// activation leaves the helper (goes direct until it draws again).
/// Calls go on over the direct paths throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaves_a_helper_frozen_before_its_path_was_up() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use surelink::proto::helper::ActivationConfig;
    let p = pair(&[NodeId(3)]).await;
    p.server.serve(move |r: Request| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        r.body
    });
    let (_e3, h3) = helper(&p, NodeId(3)).await;
    h3.pause(true);
    let c = client(&p, NodeId(4), true).await;
    let mut cfg = ActivationConfig::default();
    cfg.sla = Duration::from_millis(20);
    cfg.release = Duration::from_millis(10);
    let helped = c.helped(SERVER, vec![h3.local_addr()], 0, cfg).unwrap();
    let stop = AtomicBool::new(false);
    let failed = AtomicU64::new(0);
    let callers = (0..4u32).map(|k| call_until(&c, k, &stop, &failed));
    let script = async {
        let mut chosen = None;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if helped.status().helper.is_some() {
                chosen = Some(std::time::Instant::now());
                break;
            }
        }
        let chosen = chosen.expect("moved to the (frozen) helper");
        assert!(!helped.status().relayed, "no path through a frozen helper");
        let mut left = None;
        while chosen.elapsed() < Duration::from_secs(6) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if helped.status().helper.is_none() {
                left = Some(chosen.elapsed());
                break;
            }
        }
        let left = left.expect("left the frozen helper well before the handshake's 10 s");
        eprintln!("left the frozen helper {left:?} after choosing it");
        assert!(
            left >= Duration::from_millis(1500),
            "a young attempt is given its time: left after {left:?}"
        );
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures_util::future::join_all(callers), script);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no call failed");
}

/// With a role service, the helper reports its address and load level
/// and every node's row lists it: the client, over its SLA, ranks the
/// helpers it drew from its row and moves without asking any of them
/// (the helper answers no load query).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_role_service_a_client_moves_without_asking_the_helper() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use surelink::proto::helper::ActivationConfig;
    use surelink::proto::role::RoleConfig;
    use surelink::testing::{role_cluster_with, role_expect};
    let role = RoleConfig {
        nodes: vec![SERVER, NodeId(2), NodeId(3)],
        candidates: vec![SERVER],
        ..RoleConfig::default()
    };
    let eps = role_cluster_with(role, 60, |node, c| {
        if node == SERVER {
            c.helpers = vec![NodeId(3)];
        }
    })
    .await
    .unwrap();
    let (server, c) = (&eps[0], &eps[1]);
    server.serve(move |r: Request| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        r.body
    });
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let h = Helper::start(eps[2].clone(), listen, BatcherConfig::default(), 255)
        .await
        .unwrap();
    let addr = h.local_addr();
    let st = role_expect(c, Duration::from_secs(10), |s| {
        s.table
            .as_ref()
            .is_some_and(|t| t.helper_at(addr).is_some())
    })
    .await;
    let entry = *st.table.unwrap().helper_at(addr).unwrap();
    assert_eq!(entry.node, NodeId(3));
    let mut cfg = ActivationConfig::default();
    cfg.sla = Duration::from_millis(20);
    cfg.release = Duration::from_millis(10);
    let helped = c.helped(SERVER, vec![addr], 0, cfg).unwrap();
    let stop = AtomicBool::new(false);
    let failed = AtomicU64::new(0);
    let callers = (0..4u32).map(|k| call_until(c, k, &stop, &failed));
    let script = async {
        let mut relayed = false;
        for _ in 0..250 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if helped.status().relayed {
                relayed = true;
                break;
            }
        }
        assert!(relayed, "moved through the helper: {:?}", helped.status());
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures_util::future::join_all(callers), script);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no call failed");
    assert_eq!(h.stats().load_queries, 0, "the row ranked it: no query");
    assert!(h.stats().records_out > 0, "calls went through it");
    drop(h);
    for e in eps {
        e.shutdown().await;
    }
}
