//! Member authentication on real sockets: strangers, impostors and
//! garbage get nothing, and the real client's session is untouched.
//! (The attacks of issue 12's "Identity" findings, rerun.)

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink::proto::secure::{Handshake, Members, Protection};
use surelink::proto::wire::{encode_hello, Hello};
use surelink::proto::{ClusterId, Epoch, NodeId, SessionId};
use surelink::testing::{fresh_keys, Loopback, LoopbackPair};
use surelink::{Keypair, NetEvent, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

/// Runs a handshake as `keys` (claiming the member list `members`) against
/// `addr`; returns the stream, the handshake's result and the bytes left.
async fn dial_as(
    addr: std::net::SocketAddr,
    keys: &Keypair,
    members: Members,
) -> (
    TcpStream,
    Result<surelink::proto::secure::Established, String>,
) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hs = Handshake::initiator(
        keys,
        Arc::new(members),
        ClusterId(9),
        Protection::Encrypt,
        SERVER,
    )
    .unwrap();
    let mut out = BytesMut::new();
    let mut buf = BytesMut::new();
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if hs.poll_transmit(&mut out) {
                s.write_all(&out).await.map_err(|e| e.to_string())?;
                out.clear();
            }
            if s.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                return Err("closed".to_string());
            }
            if let Some(est) = hs.handle_input(&mut buf).map_err(|e| e.to_string())? {
                if hs.poll_transmit(&mut out) {
                    s.write_all(&out).await.map_err(|e| e.to_string())?;
                }
                return Ok(est);
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err("timeout".into()));
    (s, r)
}

/// Reads until the peer closes (or 5 s): whether it closed.
async fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false)
}

async fn echo_works(pair: &LoopbackPair) {
    let r = pair
        .client
        .call(
            SERVER,
            0,
            Bytes::from_static(b"ok?"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(r, Bytes::from_static(b"ok?"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_key_gets_no_session_and_the_client_is_untouched() {
    let pair = Loopback::new().start().await.unwrap();
    pair.server.serve(|r: Request| async move { r.body });
    let addr = pair.server.local_addrs()[0];
    let stranger = fresh_keys();
    // The stranger knows the server's key (public), but its own is not a member.
    let mut m = Members::new();
    m.insert(SERVER, pair.server.public_key().unwrap()).unwrap();
    m.insert(CLIENT, stranger.public()).unwrap();
    let (mut s, r) = dial_as(addr, &stranger, m).await;
    // XX: the initiator finishes first; the server refuses on message 3.
    assert!(r.is_ok(), "{r:?}");
    assert!(closed_by_peer(&mut s).await, "the server must close it");
    let st = pair.server.stats();
    assert_eq!(st.handshakes_failed, 1);
    assert_eq!(st.sessions.len(), 1, "no session for the stranger");
    echo_works(&pair).await;
    pair.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_claiming_another_nodes_id_cannot_join_or_end_its_session() {
    let pair = Loopback::new().start().await.unwrap();
    pair.server.serve(|r: Request| async move { r.body });
    let addr = pair.server.local_addrs()[0];
    let client_epoch = pair.client.epoch();
    // Node 3 is a legitimate member...
    let mallory = fresh_keys();
    pair.server.add_member(NodeId(3), mallory.public()).unwrap();
    let mut m = Members::new();
    m.insert(SERVER, pair.server.public_key().unwrap()).unwrap();
    m.insert(NodeId(3), mallory.public()).unwrap();
    let mut events = pair.client.events();
    // ...that says "I am node 2, a new incarnation" (would end node 2's
    // session) and, on a second connection, "I am node 2's live session"
    // (would join it as a path).
    for (epoch, session) in [(u64::MAX, 1), (client_epoch.0, 1)] {
        let (mut s, r) = dial_as(addr, &mallory, m.clone()).await;
        let mut est = r.unwrap();
        assert_eq!(est.peer, SERVER);
        let mut hello = BytesMut::new();
        encode_hello(
            &mut hello,
            &Hello {
                cluster: ClusterId(9),
                node: CLIENT,
                epoch: Epoch(epoch),
                session: SessionId(session),
                your_node: SERVER,
                your_epoch: Epoch(0),
                your_session: SessionId(0),
                recv_window: 1 << 20,
                max_message: 1 << 16,
                max_channels: 16,
            },
        );
        let sealed = est.sealer.seal_to_bytes([&hello[..]]).unwrap();
        s.write_all(&sealed).await.unwrap();
        assert!(
            closed_by_peer(&mut s).await,
            "the impostor's path must be closed"
        );
    }
    // Node 2 saw nothing happen to its session.
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
        assert!(
            !matches!(e, NetEvent::SessionEnded { .. } | NetEvent::PathDown { .. }),
            "the real client's session was disturbed: {e:?}"
        );
    }
    for _ in 0..20 {
        echo_works(&pair).await;
    }
    assert_eq!(pair.client.stats().call_errors, 0);
    pair.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialled_address_answering_with_another_key_is_refused() {
    // The client's member list has the wrong key for the server (as if an
    // impostor held the server's address): no path ever comes up.
    let mut lb = Loopback::new();
    lb.client.members = Members::new();
    lb.client
        .members
        .insert(CLIENT, lb.client.identity.as_ref().unwrap().public())
        .unwrap();
    lb.client
        .members
        .insert(SERVER, fresh_keys().public())
        .unwrap();
    let r = start_with_wrong_server_key(lb).await;
    assert!(r, "no path may come up with an impostor's key");
}

/// Starts the fixture's server normally and a client that expects another
/// key for it; returns whether the client got no path.
async fn start_with_wrong_server_key(lb: Loopback) -> bool {
    let server = surelink::Endpoint::bind(lb.server.clone()).await.unwrap();
    let mut c = lb.client.clone();
    c.peers = vec![surelink::PeerConfig::new(
        SERVER,
        server.local_addrs().into_iter().map(Some).collect(),
    )];
    let client = surelink::Endpoint::bind(c).await.unwrap();
    let none = !client
        .wait_for_paths(SERVER, 1, Duration::from_millis(800))
        .await;
    assert!(client.stats().handshakes_failed >= 1);
    tokio::join!(client.shutdown(), server.shutdown());
    none
}

/// Kills both of the client's connections and waits for both paths back.
async fn redial(pair: &LoopbackPair) {
    let killed = pair.client.testing().kill_network(0) + pair.client.testing().kill_network(1);
    assert!(killed >= 2, "{killed} killed");
    assert!(
        pair.client
            .wait_for_paths(SERVER, 2, Duration::from_secs(5))
            .await,
        "the client did not dial both paths again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_dialled_again_resume_with_a_ticket_and_carry_calls() {
    let pair = Loopback::new().start().await.unwrap();
    pair.server.serve(|r: Request| async move { r.body });
    echo_works(&pair).await;
    // Each side stores the ticket a handshake minted when its own part
    // ends: the server's a little after the client's. Redialling before
    // the server held them made a path fall back to a full handshake
    // (1 run in 10).
    assert!(
        pair.server
            .wait_for_paths(CLIENT, 2, Duration::from_secs(5))
            .await
    );
    let before = (
        pair.client.stats().handshakes_resumed,
        pair.server.stats().handshakes_resumed,
    );
    redial(&pair).await;
    echo_works(&pair).await;
    // The server counts a handshake when its own part ends, which can be
    // just after the client's path is up and carrying calls.
    assert!(
        pair.server
            .wait_for_paths(CLIENT, 2, Duration::from_secs(5))
            .await
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while pair.server.stats().handshakes_resumed < before.1 + 2
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (c, s) = (pair.client.stats(), pair.server.stats());
    // Both new paths resumed: the first handshake left a ticket.
    assert!(
        c.handshakes_resumed >= before.0 + 2,
        "client resumed {} (before {})",
        c.handshakes_resumed,
        before.0
    );
    assert!(
        s.handshakes_resumed >= before.1 + 2,
        "server resumed {} (before {})",
        s.handshakes_resumed,
        before.1
    );
    assert_eq!((c.handshakes_failed, s.handshakes_failed), (0, 0));
    pair.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resume_off_every_path_runs_the_full_handshake() {
    let mut lb = Loopback::new();
    lb.client.resume_paths = false;
    let pair = lb.start().await.unwrap();
    pair.server.serve(|r: Request| async move { r.body });
    redial(&pair).await;
    echo_works(&pair).await;
    assert_eq!(pair.client.stats().handshakes_resumed, 0);
    assert_eq!(
        pair.server.stats().handshakes_resumed,
        0,
        "nothing offered one"
    );
    pair.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_the_server_forgot_falls_back_to_a_full_handshake() {
    let mut lb = Loopback::new();
    lb.server.resume_paths = false;
    let pair = lb.start().await.unwrap();
    pair.server.serve(|r: Request| async move { r.body });
    // The client holds tickets the server never kept: each dial offers
    // one, hears "unknown" and runs Noise XX on the same connection.
    redial(&pair).await;
    echo_works(&pair).await;
    let (c, s) = (pair.client.stats(), pair.server.stats());
    assert_eq!((c.handshakes_resumed, s.handshakes_resumed), (0, 0));
    assert_eq!((c.handshakes_failed, s.handshakes_failed), (0, 0));
    pair.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ends_preferring_different_record_ciphers_connect_and_resume() {
    use surelink::proto::secure::RecordCipher;
    for (client, server) in [
        (RecordCipher::ChaCha20Poly1305, RecordCipher::Aes256Gcm),
        (RecordCipher::Aes256Gcm, RecordCipher::ChaCha20Poly1305),
        (
            RecordCipher::ChaCha20Poly1305,
            RecordCipher::ChaCha20Poly1305,
        ),
    ] {
        let mut lb = Loopback::new();
        lb.client.record_cipher = Some(client);
        lb.server.record_cipher = Some(server);
        let pair = lb.start().await.unwrap();
        pair.server.serve(|r: Request| async move { r.body });
        echo_works(&pair).await;
        // Further paths resume with a ticket under the same agreement.
        redial(&pair).await;
        echo_works(&pair).await;
        let (c, s) = (pair.client.stats(), pair.server.stats());
        assert_eq!(
            (c.handshakes_failed, s.handshakes_failed),
            (0, 0),
            "{client} against {server}"
        );
        pair.shutdown().await;
    }
}
