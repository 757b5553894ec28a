//! What one member can make a node hold, bounded per node across its
//! sessions and restarts, on real loopback sockets (the core's side is
//! tested on the simulator: `surelink-sim/tests/peer_bounds.rs`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use surelink::proto::{Epoch, NodeId};
use surelink::testing::{Loopback, LoopbackPair};
use surelink::Endpoint;

const SERVER: NodeId = NodeId(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incoming_bound_holds_per_node_across_restarts() {
    // A member restarts (a new epoch each time, gone without a CLOSE) and
    // each incarnation fills the one-way queue the application never
    // reads. The byte bound is the node's, not each session's: what waits
    // for `recv` stays at one bound's worth however many incarnations came
    // (before the per-node ledger, each one added a bound's worth).
    let mut lb = Loopback::new();
    lb.server.incoming_bytes_per_peer = 1 << 20;
    lb.client.epoch = Some(Epoch(1_001));
    let client_cfg = lb.client.clone();
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    let client_node = client.node();
    let msg = Bytes::from(vec![7u8; 64 * 1024]);
    let fill = |ep: Endpoint| {
        let msg = msg.clone();
        async move {
            let mut accepted = 0usize;
            for _ in 0..200 {
                match ep.try_send(SERVER, 0, msg.clone()) {
                    Ok(()) => accepted += 1,
                    Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Gone without a CLOSE, as a crashed process.
            ep.testing().kill_network(0);
            ep.testing().kill_network(1);
            drop(ep);
            accepted
        }
    };
    let mut accepted = fill(client).await;
    for epoch in 2..=5u64 {
        let mut c = client_cfg.clone();
        c.epoch = Some(Epoch(1_000 + epoch));
        c.peers = vec![surelink::PeerConfig::new(
            SERVER,
            server.local_addrs().into_iter().map(Some).collect(),
        )];
        let ep = Endpoint::bind(c).await.unwrap();
        assert!(
            ep.wait_for_paths(SERVER, 1, Duration::from_secs(10)).await,
            "incarnation {epoch} connected"
        );
        accepted += fill(ep).await;
    }
    assert!(accepted > 32, "the senders got going: {accepted}");
    let stats = server.stats();
    assert!(stats.peer_bound_hits > 0, "the bound was reached");
    let held = stats
        .peer_bytes_held
        .iter()
        .find(|(n, _)| *n == client_node)
        .map_or(0, |(_, b)| *b);
    // One bound (1 MiB) and the message that crossed it, plus at most one
    // receive window of the live session's.
    let window = u64::from(client_cfg.core.recv_window);
    assert!(
        held <= (1 << 20) + 64 * 1024 + window,
        "{held} bytes held for node {client_node} after five incarnations"
    );
    let mut buf = Vec::new();
    let waiting = tokio::time::timeout(
        Duration::from_millis(300),
        server.recv_many(&mut buf, 10_000),
    )
    .await
    .unwrap_or(0);
    // 1 MiB of 64 KiB messages: 16, plus the one that crossed the bound —
    // across all five incarnations, not per incarnation.
    assert!(
        waiting <= 17,
        "{waiting} messages of 64 KiB waited for recv after five incarnations"
    );
}
