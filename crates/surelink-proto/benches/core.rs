//! The core alone, no IO: messages per second through one sender/receiver
//! pair of sessions on one thread (both ends on the same core), for 64 B and
//! 4 KiB messages.
//!
//! Each iteration: the sender's application hands 256 messages to `send`
//! (spread over 4 channels); the sender encodes them (`poll_transmit`,
//! batching what queued on each stream into BATCH frames); the receiver
//! decodes them (`handle_input`), releases them in order and the
//! application takes them one by one (`poll_message`); the receiver
//! acknowledges (`poll_transmit`) and the sender frees its cache
//! (`handle_input`). So the figure covers encode + decode + both halves of
//! the session, including acknowledgements — what a shell does per message
//! once it holds the session's lock.
//!
//! `poll_batch` takes each released frame whole and reads its messages as
//! borrowed slices (no reference count per message). `unbatched` is the
//! same as `session_one_path` with batching off (`batch_message_max = 0`): one
//! DATA frame, cache entry and ack range per message, as before BATCH.
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
use surelink_proto::rpc::Priority;
use surelink_proto::{
    ChannelId, ClusterId, EndpointConfig, Epoch, Input, LocalIdentity, NodeId, PathId, Router,
    Session, SessionId, SessionTable, Time,
};

/// The one session of each side, as the router's HELLO decisions see it.
struct One<'a>(&'a mut Option<Session>);

impl SessionTable for One<'_> {
    fn with_session(&mut self, id: SessionId, f: &mut dyn FnMut(&mut Session)) -> bool {
        match self.0.as_mut().filter(|s| s.id() == id) {
            Some(s) => {
                f(s);
                true
            }
            None => false,
        }
    }
    fn install(&mut self, session: Session) {
        *self.0 = Some(session);
    }
}

const BATCH: usize = 256;

struct Pair {
    a: Session,
    b: Session,
    now: Time,
    buf: BytesMut,
    delivered: u64,
    /// Take whole frames with `poll_batch` instead of `poll_message`.
    by_batch: bool,
}

fn identity(n: u64) -> LocalIdentity {
    LocalIdentity {
        cluster: ClusterId(1),
        node: NodeId(n),
        epoch: Epoch(1),
    }
}

impl Pair {
    /// Two sessions joined by `paths` paths, after the handshake (the
    /// router glue a shell runs once per path).
    fn new(paths: u64, cfg: &EndpointConfig, by_batch: bool) -> Pair {
        let now = Time::from_millis(1);
        let mut ra = Router::new(cfg.clone(), identity(1)).unwrap();
        let mut rb = Router::new(cfg.clone(), identity(2)).unwrap();
        let (_, mut a) = ra.open(now, NodeId(2)).unwrap();
        let mut b: Option<Session> = None;
        let mut buf = BytesMut::new();
        for i in 1..=paths {
            let path = PathId(i);
            let sa = a.as_mut().unwrap();
            sa.add_path(now, path);
            rb.add_unbound_path(now, path, None).unwrap();
            while sa.poll_transmit(now, &mut buf, 1 << 16).is_some() {}
            let hello = rb
                .handle_unbound_input(now, path, &mut buf)
                .unwrap()
                .unwrap();
            rb.handle_hello(now, path, None, hello)
                .apply(now, None, &mut One(&mut b))
                .unwrap();
            let bs = b.as_mut().unwrap();
            let _ = bs.handle_input(now, path, &mut buf).unwrap();
            // b's HELLO and RESUME back to a, a's RESUME to b.
            for _ in 0..3 {
                while let Some(p) = bs.poll_transmit(now, &mut buf, 1 << 16) {
                    let sa = a.as_mut().unwrap();
                    if let Ok(Input::Hello(h)) = sa.handle_input(now, p, &mut buf) {
                        let bound = Some((sa.id(), NodeId(2)));
                        ra.handle_hello(now, p, bound, h)
                            .apply(now, None, &mut One(&mut a))
                            .unwrap();
                        let _ = a.as_mut().unwrap().handle_input(now, p, &mut buf).unwrap();
                    }
                }
                let sa = a.as_mut().unwrap();
                while let Some(p) = sa.poll_transmit(now, &mut buf, 1 << 16) {
                    let _ = bs.handle_input(now, p, &mut buf).unwrap();
                }
            }
        }
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.active_paths(), paths as usize);
        assert_eq!(b.active_paths(), paths as usize);
        Pair {
            a,
            b,
            now,
            buf: BytesMut::with_capacity(1 << 20),
            delivered: 0,
            by_batch,
        }
    }

    fn pump(&mut self) {
        self.now = Time::from_nanos(self.now.as_nanos() + 1_000);
        while let Some(path) = self.a.poll_transmit(self.now, &mut self.buf, 256 << 10) {
            let _ = self.b.handle_input(self.now, path, &mut self.buf).unwrap();
        }
        if self.by_batch {
            while let Some(batch) = self.b.poll_batch() {
                for (_, _, m) in batch.iter() {
                    self.delivered += 1;
                    black_box(m);
                }
            }
        } else {
            while let Some(m) = self.b.poll_message() {
                self.delivered += 1;
                black_box(m.payload);
            }
        }
        while let Some(path) = self.b.poll_transmit(self.now, &mut self.buf, 256 << 10) {
            let _ = self.a.handle_input(self.now, path, &mut self.buf).unwrap();
        }
        while self.a.poll_event().is_some() {}
        for s in [&mut self.a, &mut self.b] {
            if s.poll_timeout().is_some_and(|t| t <= self.now) {
                s.handle_timeout(self.now);
            }
        }
    }

    fn batch(&mut self, payload: &Bytes) {
        for i in 0..BATCH {
            let ch = ChannelId((i % 4) as u16);
            self.a
                .send(self.now, ch, Priority::Normal, payload.clone())
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
    let batched = EndpointConfig::default();
    let mut unbatched = EndpointConfig::default();
    unbatched.batch_message_max = 0;
    for size in [64usize, 4096] {
        let payload = Bytes::from(vec![0xAB; size]);
        g.throughput(Throughput::Elements(BATCH as u64));
        for (name, paths, cfg, by_batch) in [
            ("session_one_path", 1, &batched, false),
            ("session_two_paths", 2, &batched, false),
            ("session_one_path_poll_batch", 1, &batched, true),
            ("unbatched_one_path", 1, &unbatched, false),
        ] {
            g.bench_with_input(BenchmarkId::new(name, size), &payload, |bch, payload| {
                let mut pair = Pair::new(paths, cfg, by_batch);
                bch.iter(|| pair.batch(payload));
                assert!(pair.delivered > 0);
            });
        }
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
