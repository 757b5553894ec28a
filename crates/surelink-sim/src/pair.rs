//! A hand-driven pair of endpoints for targeted tests: the test decides
//! which bytes cross which path and when, and can look at every frame.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use surelink_proto::wire::{decode, Frame};
use surelink_proto::{
    ChannelId, ClusterId, Endpoint, EndpointConfig, Epoch, Event, LocalIdentity, MessageId, NodeId,
    PathId, Time,
};

/// Which endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Node 1, the dialler.
    A,
    /// Node 2, the acceptor.
    B,
}

/// Two endpoints and the byte queues between them, one per path and direction.
pub struct Pair {
    /// Node 1.
    pub a: Endpoint,
    /// Node 2.
    pub b: Endpoint,
    /// The current time; tests advance it.
    pub now: Time,
    /// Bytes written and not yet delivered: (path, from side) -> bytes.
    queued: BTreeMap<(PathId, bool), BytesMut>,
    /// Events seen, per side.
    pub events_a: Vec<Event>,
    /// Events seen at B.
    pub events_b: Vec<Event>,
}

/// The identity of node `n` (epoch `epoch`) in cluster 1.
pub fn identity(n: u64, epoch: u64) -> LocalIdentity {
    LocalIdentity {
        cluster: ClusterId(1),
        node: NodeId(n),
        epoch: Epoch(epoch),
    }
}

impl Pair {
    /// Two endpoints with `cfg`, no paths yet.
    pub fn new(cfg: EndpointConfig) -> Pair {
        Pair {
            a: Endpoint::new(cfg.clone(), identity(1, 1)).expect("valid config"),
            b: Endpoint::new(cfg, identity(2, 1)).expect("valid config"),
            now: Time::from_millis(1),
            queued: BTreeMap::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
        }
    }

    /// Opens path `id` (A dials, B accepts).
    pub fn connect(&mut self, id: u64) {
        let now = self.now;
        self.a
            .add_path(now, PathId(id), Some(NodeId(2)))
            .expect("add_path A");
        self.b.add_path(now, PathId(id), None).expect("add_path B");
    }

    /// The endpoint on `side`.
    pub fn ep(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Sends from A to B.
    pub fn send_ab(&mut self, channel: u16, payload: &'static [u8]) -> MessageId {
        let now = self.now;
        self.a
            .send(
                now,
                NodeId(2),
                ChannelId(channel),
                Bytes::from_static(payload),
            )
            .expect("send")
    }

    /// Collects everything both endpoints want to write into the path queues.
    pub fn flush(&mut self) {
        let now = self.now;
        for from_a in [true, false] {
            let ep = if from_a { &mut self.a } else { &mut self.b };
            let mut buf = BytesMut::new();
            while let Some(path) = ep.poll_transmit(now, &mut buf, 64 << 10) {
                self.queued
                    .entry((path, from_a))
                    .or_default()
                    .extend_from_slice(&buf);
                buf.clear();
            }
        }
    }

    /// The frames queued on `path` from `side`, decoded (not consumed).
    pub fn peek_frames(&self, path: u64, from: Side) -> Vec<Frame> {
        let mut buf = self
            .queued
            .get(&(PathId(path), from == Side::A))
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        while let Ok(Some(f)) = decode(&mut buf, 1 << 30) {
            out.push(f);
        }
        out
    }

    /// Discards what is queued on `path` from `side` (the network lost it).
    pub fn drop_queued(&mut self, path: u64, from: Side) {
        self.queued.remove(&(PathId(path), from == Side::A));
    }

    /// Delivers what is queued on `path` from `side`.
    pub fn deliver(&mut self, path: u64, from: Side) {
        let Some(mut buf) = self.queued.remove(&(PathId(path), from == Side::A)) else {
            return;
        };
        let now = self.now;
        let to = if from == Side::A {
            &mut self.b
        } else {
            &mut self.a
        };
        let _ = to.handle_input(now, PathId(path), &mut buf);
        self.drain_events();
    }

    /// Takes every pending event into `events_a` / `events_b`.
    pub fn drain_events(&mut self) {
        while let Some(e) = self.a.poll_event() {
            self.events_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            self.events_b.push(e);
        }
    }

    /// Flushes and delivers everything, both ways, until quiet (bounded).
    pub fn settle(&mut self) {
        for _ in 0..64 {
            self.flush();
            if self.queued.values().all(|b| b.is_empty()) {
                self.drain_events();
                return;
            }
            let keys: Vec<_> = self.queued.keys().copied().collect();
            for (path, from_a) in keys {
                self.deliver(path.0, if from_a { Side::A } else { Side::B });
            }
        }
        panic!("pair did not settle in 64 rounds");
    }

    /// Advances time and runs due timers on both sides.
    pub fn advance(&mut self, d: std::time::Duration) {
        self.now += d;
        let now = self.now;
        for ep in [&mut self.a, &mut self.b] {
            if ep.poll_timeout().is_some_and(|t| t <= now) {
                ep.handle_timeout(now);
            }
        }
        self.drain_events();
    }

    /// Payloads B received, in order.
    pub fn received_b(&self) -> Vec<Bytes> {
        self.events_b
            .iter()
            .filter_map(|e| match e {
                Event::Message(m) => Some(m.payload.clone()),
                _ => None,
            })
            .collect()
    }

    /// Replaces B with a new incarnation (epoch + 1): a process restart.
    pub fn restart_b(&mut self, cfg: EndpointConfig) {
        let epoch = self.b.local().epoch.0 + 1;
        self.b = Endpoint::new(cfg, identity(2, epoch)).expect("valid config");
        self.queued.clear();
        self.events_b.clear();
    }
}
