//! The seeded network: each transmission a node writes is sealed (with
//! the secure layer on), then lost or delayed by latency and jitter per
//! the link's state, and arrives as a job at the other node. Connections
//! have generations: bytes of a connection that is gone are dropped, and a
//! link without one is redialled after `reconnect_after`.

use std::time::Duration;

use bytes::Bytes;
use rand::RngExt;
use surelink_proto::{PathId, Time};

use super::{node_id, Action, Conn, Job, Sim};
use crate::secure::ConnSec;

impl Sim {
    /// Carries a transmission node `n` wrote on `path` onto its connection.
    pub(super) fn carry(&mut self, n: usize, path: PathId, mut bytes: Bytes) {
        let Some(&(link, gen)) = self.nodes[n].paths.get(&path) else {
            return;
        };
        let l = &mut self.links[link];
        let dir = if n == l.a { 0 } else { 1 };
        let Some(conn) = l.conn.as_mut().filter(|c| c.gen == gen) else {
            return;
        };
        if let Some(sec) = &mut conn.sec {
            // Sealed before the network may lose it: a lost record breaks
            // the stream, as a deleted byte would.
            match sec.seal(dir, &bytes) {
                Ok(sealed) => bytes = sealed,
                Err(_) => {
                    self.drop_conn(link, gen);
                    return;
                }
            }
        }
        self.send_on(link, gen, dir, bytes);
    }

    /// Puts `bytes` on connection `gen` of `link` in direction `dir`
    /// (0: a to b), subject to the link's state, loss and latency.
    pub(super) fn send_on(&mut self, link: usize, gen: u64, dir: usize, bytes: Bytes) {
        let l = &self.links[link];
        if l.conn.as_ref().is_none_or(|c| c.gen != gen) {
            return;
        }
        if !l.up[dir] || (l.loss[dir] > 0.0 && self.rng.random_bool(l.loss[dir])) {
            return;
        }
        if l.helper.is_some() {
            self.helper_queue(link, gen, dir, bytes);
            return;
        }
        let spec = &self.cfg.link;
        let jitter = if spec.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.rng.random_range(0..spec.jitter.as_nanos() as u64))
        };
        let mut at = self.world.now + spec.latency + jitter;
        let l = &mut self.links[link];
        let to = if dir == 0 { l.b } else { l.a };
        if let Some(conn) = &mut l.conn {
            if spec.fifo {
                at = at.max(conn.last_arrival[dir]);
            }
            // Tracked in both modes: a FIN never overtakes data.
            conn.last_arrival[dir] = conn.last_arrival[dir].max(at);
        }
        self.schedule(
            at,
            Job::Node(
                to,
                Action::Deliver {
                    link,
                    gen,
                    dir,
                    bytes,
                },
            ),
        );
    }

    pub(super) fn reconnect(&mut self, link: usize) {
        let l = &mut self.links[link];
        l.reconnect_pending = false;
        if l.conn.is_some() {
            return;
        }
        if !(l.up[0] && l.up[1]) {
            l.reconnect_pending = true;
            let at = self.world.now + self.cfg.reconnect_after;
            self.schedule(at, Job::Reconnect(link));
            return;
        }
        let gen = self.next_gen;
        self.next_gen += 1;
        let (a, b) = (l.a, l.b);
        let a_path = PathId(self.nodes[a].next_path);
        self.nodes[a].next_path += 1;
        let b_path = PathId(self.nodes[b].next_path);
        self.nodes[b].next_path += 1;
        let now = self.world.now;
        if let Some(keys) = &self.keys {
            // Secure: the handshake first; each end adds its path when its
            // side of the handshake finishes (see `apply`'s `Deliver`).
            let (sec, first) = ConnSec::dial(keys, now, a, b, node_id(b));
            self.links[link].conn = Some(Conn {
                gen,
                a_path,
                b_path,
                last_arrival: [Time::ZERO; 2],
                sec: Some(sec),
            });
            self.send_on(link, gen, 0, first);
            let deadline = now + self.cfg.endpoint.handshake_timeout;
            self.schedule(deadline, Job::HandshakeDeadline { link, gen });
            return;
        }
        self.links[link].conn = Some(Conn {
            gen,
            a_path,
            b_path,
            last_arrival: [Time::ZERO; 2],
            sec: None,
        });
        // The lower-numbered node dials; the other accepts.
        self.schedule(
            now,
            Job::Node(
                a,
                Action::AddPath {
                    link,
                    gen,
                    path: a_path,
                    dial: Some(node_id(b)),
                },
            ),
        );
        self.schedule(
            now,
            Job::Node(
                b,
                Action::AddPath {
                    link,
                    gen,
                    path: b_path,
                    dial: None,
                },
            ),
        );
    }

    /// Both ends learn the connection is gone; a new one is dialled later.
    pub(super) fn drop_conn(&mut self, link: usize, gen: u64) {
        let l = &mut self.links[link];
        let Some(conn) = l.conn.take_if(|c| c.gen == gen) else {
            return;
        };
        let (a, b) = (l.a, l.b);
        let now = self.world.now;
        self.schedule(now, Job::Node(a, Action::PathDown { path: conn.a_path }));
        self.schedule(now, Job::Node(b, Action::PathDown { path: conn.b_path }));
        self.schedule_reconnect(link);
    }

    /// Node `n` closed its end; the other end notices after the bytes
    /// already sent (the FIN follows them), and the connection retires then.
    pub(super) fn close_conn_from(&mut self, n: usize, link: usize, gen: u64) {
        let l = &self.links[link];
        let Some(conn) = l.conn.as_ref().filter(|c| c.gen == gen) else {
            return;
        };
        let dir = if n == l.a { 0 } else { 1 };
        let (other, other_path) = if dir == 0 {
            (l.b, conn.b_path)
        } else {
            (l.a, conn.a_path)
        };
        let fin_at = (self.world.now + self.cfg.link.latency).max(conn.last_arrival[dir]);
        self.schedule(
            fin_at,
            Job::Node(other, Action::PathDown { path: other_path }),
        );
        self.schedule(fin_at, Job::Retire { link, gen });
    }

    pub(super) fn schedule_reconnect(&mut self, link: usize) {
        if !self.links[link].reconnect_pending {
            self.links[link].reconnect_pending = true;
            let at = self.world.now + self.cfg.reconnect_after;
            self.schedule(at, Job::Reconnect(link));
        }
    }

    pub(super) fn detect(&mut self, link: usize, gen: u64) {
        let l = &self.links[link];
        let silent = !(l.up[0] && l.up[1]);
        if silent && l.conn.as_ref().is_some_and(|c| c.gen == gen) {
            self.drop_conn(link, gen);
        }
    }
}
