//! The core alone, no IO: messages per second through one sender/receiver
//! pair on one thread (both endpoints on the same core), for 64 B and 4 KiB
//! messages.
//!
//! Each iteration: the sender's application hands a batch to `send`; the
//! sender encodes them (`poll_transmit`); the receiver decodes them
//! (`handle_input`), releases them in order and the application takes them
//! (`poll_event`); the receiver acknowledges (`poll_transmit`) and the sender
//! frees its cache (`handle_input`). So the figure covers encode + decode +
//! both halves of the session, including acknowledgements.
//!
//! The baseline in the same run, `length_prefix_only`, is the least any
//! framing can cost: a 4-byte length prefix written and parsed for each
//! message, with the same copies and `Bytes` slices. The ratio says what the
//! session adds on top of bare framing.
//!
//! Run: `cargo bench -p surelink-proto --bench core`

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::hint::black_box;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use surelink_proto::{
    ChannelId, ClusterId, Endpoint, EndpointConfig, Epoch, Event, LocalIdentity, NodeId, PathId,
    Time,
};

const BATCH: usize = 256;

struct Pair {
    a: Endpoint,
    b: Endpoint,
    now: Time,
    buf: BytesMut,
    delivered: u64,
}

impl Pair {
    fn new(paths: u64) -> Pair {
        let cfg = EndpointConfig::default();
        let id = |n| LocalIdentity {
            cluster: ClusterId(1),
            node: NodeId(n),
            epoch: Epoch(1),
        };
        let mut p = Pair {
            a: Endpoint::new(cfg.clone(), id(1)).unwrap(),
            b: Endpoint::new(cfg, id(2)).unwrap(),
            now: Time::from_millis(1),
            buf: BytesMut::with_capacity(1 << 20),
            delivered: 0,
        };
        for i in 1..=paths {
            p.a.add_path(p.now, PathId(i), Some(NodeId(2))).unwrap();
            p.b.add_path(p.now, PathId(i), None).unwrap();
        }
        for _ in 0..4 {
            p.pump();
        }
        p
    }

    fn pump(&mut self) {
        self.now = Time::from_nanos(self.now.as_nanos() + 1_000);
        while let Some(path) = self.a.poll_transmit(self.now, &mut self.buf, 256 << 10) {
            self.b.handle_input(self.now, path, &mut self.buf).unwrap();
        }
        while let Some(ev) = self.b.poll_event() {
            if let Event::Message { payload, .. } = ev {
                self.delivered += 1;
                black_box(payload);
            }
        }
        while let Some(path) = self.b.poll_transmit(self.now, &mut self.buf, 256 << 10) {
            self.a.handle_input(self.now, path, &mut self.buf).unwrap();
        }
        while self.a.poll_event().is_some() {}
        if self.a.poll_timeout().is_some_and(|t| t <= self.now) {
            self.a.handle_timeout(self.now);
        }
        if self.b.poll_timeout().is_some_and(|t| t <= self.now) {
            self.b.handle_timeout(self.now);
        }
    }

    fn batch(&mut self, payload: &Bytes) {
        for i in 0..BATCH {
            let ch = ChannelId((i % 4) as u16);
            self.a
                .send(self.now, NodeId(2), ch, payload.clone())
                .unwrap();
        }
        self.pump();
    }
}

/// Bare framing: length prefix out, length prefix in, same copies.
fn framing_batch(out: &mut BytesMut, payload: &Bytes) -> u64 {
    for _ in 0..BATCH {
        out.reserve(4 + payload.len());
        out.put_u32(payload.len() as u32);
        out.put_slice(payload);
    }
    let mut n = 0;
    while out.len() >= 4 {
        let len = (&out[..4]).get_u32() as usize;
        let mut frame = out.split_to(4 + len).freeze();
        frame.advance(4);
        black_box(frame);
        n += 1;
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("core_pair");
    for size in [64usize, 4096] {
        let payload = Bytes::from(vec![0xAB; size]);
        g.throughput(Throughput::Elements(BATCH as u64));
        g.bench_with_input(
            BenchmarkId::new("session_one_path", size),
            &payload,
            |bch, payload| {
                let mut pair = Pair::new(1);
                bch.iter(|| pair.batch(payload));
                assert!(pair.delivered > 0);
            },
        );
        g.bench_with_input(
            BenchmarkId::new("session_two_paths", size),
            &payload,
            |bch, payload| {
                let mut pair = Pair::new(2);
                bch.iter(|| pair.batch(payload));
                assert!(pair.delivered > 0);
            },
        );
        g.bench_with_input(
            BenchmarkId::new("length_prefix_only", size),
            &payload,
            |bch, payload| {
                let mut out = BytesMut::with_capacity(1 << 20);
                bch.iter(|| framing_batch(&mut out, payload));
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
