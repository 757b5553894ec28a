//! One-way messages taken a frame at a time (`Endpoint::recv_batches`),
//! mixed with `recv_many` and `recv` on the same queue, on real loopback
//! sockets: every message once and in order per channel, frames really
//! handed over whole, the per-peer bound's ledger back to zero once all is
//! taken (a frame split by a small `recv_many` leaves none of its framing
//! counted), and a receiver that stopped at the bound resumes.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use surelink::proto::NodeId;
use surelink::testing::{Loopback, LoopbackPair};
use surelink::Priority;

const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);
const N: u32 = 20_000;

fn numbered(ch: u16, i: u32) -> Bytes {
    let mut b = ch.to_be_bytes().to_vec();
    b.extend_from_slice(&i.to_be_bytes());
    b.resize(24, 0);
    Bytes::from(b)
}

/// Checks that `body` is the next message of `channel`.
fn check(next: &mut [u32; 2], channel: u16, body: &[u8]) {
    let ch = u16::from_be_bytes([body[0], body[1]]);
    let i = u32::from_be_bytes([body[2], body[3], body[4], body[5]]);
    assert_eq!(ch, channel, "a message of channel {ch} came on {channel}");
    let want = &mut next[usize::from(ch)];
    assert_eq!(i, *want, "channel {ch}: message {i} where {want} was due");
    *want += 1;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_and_single_messages_share_one_ordered_queue() {
    let mut lb = Loopback::new();
    // Small: the sessions stop at it again and again and must resume.
    lb.server.incoming_per_peer = 512;
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    let sender = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut i = [0u32; 2];
            while i.iter().any(|&x| x < N) {
                for ch in 0..2u16 {
                    let from = i[usize::from(ch)];
                    let to = (from + 50).min(N);
                    client
                        .send_many(SERVER, ch, (from..to).map(|k| numbered(ch, k)))
                        .await
                        .unwrap();
                    i[usize::from(ch)] = to;
                }
            }
        })
    };
    let mut next = [0u32; 2];
    let (mut batches, mut msgs) = (Vec::new(), Vec::new());
    let (mut whole, mut round) = (0usize, 0u64);
    while next.iter().any(|&x| x < N) {
        round += 1;
        let got = tokio::time::timeout(Duration::from_secs(5), async {
            match round % 3 {
                // A small limit: frames are split, the rest stays in front.
                0 => server.recv_many(&mut msgs, 7).await,
                1 => server.recv_batches(&mut batches, 100).await,
                _ => match server.recv().await {
                    Some(m) => {
                        msgs.push(m);
                        1
                    }
                    None => 0,
                },
            }
        })
        .await
        .unwrap_or_else(|_| panic!("stalled at {next:?}"));
        assert!(got > 0);
        let mut counted = msgs.len();
        for b in batches.drain(..) {
            assert_eq!(b.peer(), CLIENT);
            assert_eq!(b.priority(), Priority::Normal);
            assert!(!b.is_empty());
            if b.len() > 1 {
                whole += 1;
            }
            counted += b.len();
            let mut seen = 0;
            for body in b.iter() {
                check(&mut next, b.channel().0, body);
                seen += 1;
            }
            assert_eq!(seen, b.len());
        }
        assert_eq!(
            counted, got,
            "the count returned is the messages handed over"
        );
        for m in msgs.drain(..) {
            check(&mut next, m.channel.0, &m.body);
        }
    }
    sender.await.unwrap();
    assert!(whole > 0, "no frame was handed over whole");
    // Nothing counted against the client once everything is taken.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let held = loop {
        let held: u64 = server
            .stats()
            .peer_bytes_held
            .iter()
            .filter(|(n, _)| *n == CLIENT)
            .map(|(_, b)| *b)
            .sum();
        if held == 0 || tokio::time::Instant::now() >= deadline {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(held, 0, "bytes still counted for the client");
    // And the bound did not shrink: another full run gets through.
    for k in 0..1000 {
        client.send(SERVER, 0, numbered(0, N + k)).await.unwrap();
    }
    let mut got = 0;
    while got < 1000 {
        got += tokio::time::timeout(
            Duration::from_secs(5),
            server.recv_batches(&mut batches, 1000),
        )
        .await
        .expect("the bound stayed shut");
        for b in batches.drain(..) {
            for body in b.iter() {
                check(&mut next, b.channel().0, body);
            }
        }
    }
    tokio::join!(client.shutdown(), server.shutdown());
}
