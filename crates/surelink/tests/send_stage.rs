//! One-way sends a busy session takes without its lock (the send stage,
//! `session/stage.rs`), on real loopback sockets: they keep their order
//! with every other kind of send on the same channel, nothing is lost or
//! doubled when the send buffer fills behind them, and they are really
//! taken that way (`StatsSnapshot::sends_staged`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use surelink::proto::NodeId;
use surelink::testing::{Loopback, LoopbackPair};
use surelink::{Endpoint, Incoming, TrySendError};

const SERVER: NodeId = NodeId(1);

fn numbered(ch: u16, i: u32, pad: usize) -> Bytes {
    let mut b = ch.to_be_bytes().to_vec();
    b.extend_from_slice(&i.to_be_bytes());
    b.resize(6 + pad, 0);
    Bytes::from(b)
}

fn parse(m: &Incoming) -> (usize, u32) {
    let ch = usize::from(u16::from_be_bytes([m.body[0], m.body[1]]));
    let i = u32::from_be_bytes([m.body[2], m.body[3], m.body[4], m.body[5]]);
    (ch, i)
}

/// Sends `n` numbered messages on `ch`, mixing `send` (most), `send_many`
/// (runs of three) and `try_send` (falling back to `send` when full).
async fn mixed_sender(c: Endpoint, ch: u16, n: u32, pad: usize) {
    let mut i = 0;
    while i < n {
        match i % 100 {
            0 if i + 3 <= n => {
                let run = (i..i + 3).map(|k| numbered(ch, k, pad));
                c.send_many(SERVER, ch, run.collect::<Vec<_>>())
                    .await
                    .unwrap();
                i += 3;
                continue;
            }
            50 => match c.try_send(SERVER, ch, numbered(ch, i, pad)) {
                Ok(()) => {}
                Err(TrySendError::Full(m)) => c.send(SERVER, ch, m).await.unwrap(),
                Err(e) => panic!("try_send: {e}"),
            },
            _ => c.send(SERVER, ch, numbered(ch, i, pad)).await.unwrap(),
        }
        i += 1;
        if i % 1000 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Receives until every channel's count reached `n`, checking order.
async fn receive_in_order(server: &Endpoint, channels: usize, n: u32) {
    let mut next = vec![0u32; channels];
    let mut got = Vec::new();
    while next.iter().any(|&k| k < n) {
        got.clear();
        let r = tokio::time::timeout(Duration::from_secs(10), server.recv_many(&mut got, 1024))
            .await
            .unwrap_or_else(|_| panic!("stalled: received {next:?} of {n} per channel"));
        assert!(r > 0, "endpoint shut down");
        for m in &got {
            let (ch, i) = parse(m);
            assert_eq!(i, next[ch], "channel {ch}: out of order, lost or doubled");
            next[ch] += 1;
        }
    }
}

/// Four senders at full speed on two workers: every message once, in
/// order per channel, whichever way each was queued — and the stream was
/// busy enough that most sends were staged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_sends_keep_their_order_with_every_other_kind_of_send() {
    let LoopbackPair { server, client } = Loopback::new().start().await.unwrap();
    const N: u32 = 20_000;
    let senders: Vec<_> = (0..4u16)
        .map(|ch| tokio::spawn(mixed_sender(client.clone(), ch, N, 0)))
        .collect();
    receive_in_order(&server, 4, N).await;
    for s in senders {
        s.await.unwrap();
    }
    let st = client.stats();
    assert!(
        st.sends_staged > u64::from(N),
        "only {} of {} sends were staged: the stage was not used",
        st.sends_staged,
        4 * N
    );
    assert!(st.sends_staged <= st.messages_sent);
}

/// A send buffer of 64 KiB and a receiver that does not read for a while:
/// staged messages find the buffer full, wait in front of later ones, and
/// all arrive, in order, once the receiver reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_sends_behind_a_full_send_buffer_wait_and_arrive_in_order() {
    let mut lb = Loopback::new();
    lb.client.core.send_buffer = 64 * 1024;
    lb.client.core.max_message_size = 16 * 1024;
    lb.server.incoming_per_peer = 256;
    let LoopbackPair { server, client } = lb.start().await.unwrap();
    const N: u32 = 5_000;
    let sender = tokio::spawn(mixed_sender(client.clone(), 0, N, 200));
    // The receiver sleeps: the incoming bound and then the send buffer
    // fill, and the sender waits.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Nothing spins meanwhile: the flush stops once the buffer is full.
    let cpu0 = process_cpu();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let spent = process_cpu() - cpu0;
    assert!(!sender.is_finished(), "the sender never had to wait");
    assert!(
        spent < Duration::from_millis(200),
        "{spent:?} of CPU in 400 ms with nothing able to leave: something spins"
    );
    receive_in_order(&server, 1, N).await;
    sender.await.unwrap();
}

/// CPU time of this process so far (user + system, from /proc).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}
