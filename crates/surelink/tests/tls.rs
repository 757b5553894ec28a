//! Mutual TLS instead of member keys, on real sockets: nodes with
//! certificates from one CA talk, their heartbeats are authenticated with
//! keys exported from their connections (also across a re-dial), and a
//! certificate from another CA gets no session.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use surelink::proto::secure::{TestCa, TlsSetup};
use surelink::proto::{ClusterId, NodeId};
use surelink::testing::{Loopback, LoopbackPair};
use surelink::Request;

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

/// One echo call from `client` to the server, checked.
async fn echo(client: &surelink::Endpoint, body: &'static [u8]) {
    let reply = client
        .call(SERVER, 0, Bytes::from_static(body), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(&reply[..], body);
}

fn new_ca() -> TestCa {
    TestCa::new(ClusterId(9)).unwrap()
}

/// Node `node` of cluster 9 (the loopback fixture's), certificate from
/// `issuer`, trusting `trust`.
fn setup(node: NodeId, issuer: &TestCa, trust: &TestCa) -> TlsSetup {
    issuer.setup_trusting(ClusterId(9), node, trust).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_certificates_talk_and_their_heartbeats_are_authenticated() {
    let ca = new_ca();
    let mut lb = Loopback::new();
    lb.server.tls = Some(setup(SERVER, &ca, &ca));
    lb.client.tls = Some(setup(CLIENT, &ca, &ca));
    // No member keys needed: the certificates say who is who.
    lb.server.identity = None;
    lb.client.identity = None;
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    server.serve(|r: Request| async move { r.body });
    echo(&client, b"over tls").await;
    // An answered call leaves the pair at the idle pace: the fence's
    // heartbeats, every 400 ms per network (and the greetings).
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let heard = |ep: &surelink::Endpoint| {
        let d = ep.stats().detector.unwrap();
        (d.heartbeats_received, d.datagrams_refused)
    };
    let (s0, _) = heard(&server);
    let (c0, _) = heard(&client);
    assert!(
        s0 >= 5 && c0 >= 5,
        "heartbeats accepted: server {s0}, client {c0}"
    );
    // Kill network 1's connection: the re-dialled one brings a new key;
    // heartbeats keep being accepted throughout, calls keep working.
    assert!(client.testing().kill_network(0) > 0);
    assert!(
        client
            .wait_for_paths(SERVER, 2, Duration::from_secs(5))
            .await
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (s1, s_refused) = heard(&server);
    let (c1, c_refused) = heard(&client);
    assert!(
        s1 >= s0 + 5 && c1 >= c0 + 5,
        "heartbeats after the re-dial: {s1}, {c1}"
    );
    // A heartbeat keyed by a connection the other end has not finished may
    // be refused once; not a stream of them.
    assert!(
        s_refused + c_refused <= 4,
        "refused {s_refused} + {c_refused}"
    );
    echo(&client, b"again").await;
    let st = server.stats();
    assert_eq!(st.sessions.len(), 1);
    assert_eq!(st.handshakes_failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_gets_no_session() {
    let (ca, other) = (new_ca(), new_ca());
    let mut lb = Loopback::new();
    lb.server.tls = Some(setup(SERVER, &ca, &ca));
    // Trusts the server's CA, but its own certificate is from another.
    lb.client.tls = Some(setup(CLIENT, &other, &ca));
    lb.paths_timeout = Duration::from_millis(800);
    let r = lb.start().await;
    assert!(
        matches!(r, Err(surelink::testing::LoopbackError::NoPaths { .. })),
        "no path comes up: {:?}",
        r.err()
    );
}
