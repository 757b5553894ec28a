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
//! The two sessions sit on the test fixture (`surelink_sim::fixture`):
//! each pump is `World::step` one way, the application's reads, `step`
//! back, and the due timers.
//!
//! Run: `cargo bench -p surelink-proto --bench core`

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::hint::black_box;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use surelink_proto::rpc::Priority;
use surelink_proto::{
    ChannelId, ClusterId, EndpointConfig, Epoch, Event, Input, LocalIdentity, NodeId, PathError,
    PathId, Router, Session, SessionId, SessionTable, Time,
};
use surelink_sim::fixture::{Driven, World, A, B};

const BATCH: usize = 256;

fn identity(n: u64) -> LocalIdentity {
    LocalIdentity {
        cluster: ClusterId(1),
        node: NodeId(n),
        epoch: Epoch(1),
    }
}

/// A router and the one session it holds: the glue a shell runs once per
/// path (a HELLO goes to the router, whose decision runs on the session;
/// everything else goes to the session), enough to handshake the two
/// sessions.
struct Routed {
    router: Router,
    session: Option<Session>,
}

/// The one session, as the router's HELLO decisions see it.
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

impl Driven for Routed {
    fn poll_transmit(&mut self, now: Time, buf: &mut BytesMut, max: usize) -> Option<PathId> {
        self.router
            .poll_transmit(buf)
            .or_else(|| self.session.as_mut()?.poll_transmit(now, buf, max))
    }

    fn handle_input(
        &mut self,
        now: Time,
        path: PathId,
        buf: &mut BytesMut,
    ) -> Result<(), PathError> {
        loop {
            let bound = self
                .session
                .as_ref()
                .filter(|s| s.has_path(path))
                .map(|s| (s.id(), s.peer()));
            let hello = match (bound, self.session.as_mut()) {
                (Some(_), Some(s)) => match s.handle_input(now, path, buf)? {
                    Input::Done => return Ok(()),
                    Input::Hello(h) => h,
                },
                _ => match self.router.handle_unbound_input(now, path, buf)? {
                    None => return Ok(()),
                    Some(h) => h,
                },
            };
            self.router.handle_hello(now, path, bound, hello).apply(
                now,
                None,
                &mut One(&mut self.session),
            )?;
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.session.as_ref().and_then(Session::poll_timeout)
    }

    fn handle_timeout(&mut self, now: Time) {
        if let Some(s) = &mut self.session {
            s.handle_timeout(now);
        }
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.router
            .poll_event()
            .or_else(|| self.session.as_mut()?.poll_event())
    }
}

struct Pair {
    /// The sender (A) and the receiver (B), bare sessions on the fixture.
    w: World<Session>,
    delivered: u64,
    /// Take whole frames with `poll_batch` instead of `poll_message`.
    by_batch: bool,
}

impl Pair {
    /// Two sessions joined by `paths` paths, after the handshake (the
    /// router glue a shell runs once per path).
    fn new(paths: u64, cfg: &EndpointConfig, by_batch: bool) -> Pair {
        let now = Time::from_millis(1);
        let mut ra = Router::new(cfg.clone(), identity(1)).unwrap();
        let (_, a) = ra.open(now, NodeId(2)).unwrap();
        let rb = Router::new(cfg.clone(), identity(2)).unwrap();
        let routed = |router, session| Routed { router, session };
        let mut w = World::new(vec![routed(ra, a), routed(rb, None)], now);
        // Events stay in the sessions, as a shell's would until polled.
        w.collect_events = false;
        for i in 1..=paths {
            let path = PathId(i);
            w[A].session.as_mut().unwrap().add_path(now, path);
            w[B].router.add_unbound_path(now, path, None).unwrap();
            w.wire((A, path), (B, path));
            w.settle();
        }
        let mut w = w.map(|r| r.session.unwrap());
        assert_eq!(w[A].active_paths(), paths as usize);
        assert_eq!(w[B].active_paths(), paths as usize);
        w.budget = 256 << 10;
        Pair {
            w,
            delivered: 0,
            by_batch,
        }
    }

    fn pump(&mut self) {
        let w = &mut self.w;
        w.now = Time::from_nanos(w.now.as_nanos() + 1_000);
        assert_eq!(w.step(A).error, None);
        if self.by_batch {
            while let Some(batch) = w[B].poll_batch() {
                for (_, _, m) in batch.iter() {
                    self.delivered += 1;
                    black_box(m);
                }
            }
        } else {
            while let Some(m) = w[B].poll_message() {
                self.delivered += 1;
                black_box(m.payload);
            }
        }
        assert_eq!(w.step(B).error, None);
        while w[A].poll_event().is_some() {}
        w.run_timeouts();
    }

    fn batch(&mut self, payload: &Bytes) {
        let now = self.w.now;
        for i in 0..BATCH {
            let ch = ChannelId((i % 4) as u16);
            self.w[A]
                .send(now, ch, Priority::Normal, payload.clone())
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
