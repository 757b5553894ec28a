//! A session's paths failing, closing and being suspected: what was in
//! flight on them moves to the retransmit queue (re-sent on the other
//! paths before anything new, SQR), and the session tracks whether any
//! path still reaches the peer.

use super::paths::Phase;
use super::{send, ClosingPath, Session};
use crate::error::PathError;
use crate::event::{Event, PathCloseReason};
use crate::ids::{MessageId, PathId};
use crate::time::Time;
use crate::wire::{Close, CloseCode, CloseScope};

impl Session {
    /// Moves every frame in flight on path `i` to the retransmit queue.
    /// Returns how many moved.
    pub(super) fn evacuate(&mut self, i: usize) -> usize {
        let moved = self.evacuate_sent_before(i, Time::MAX);
        self.paths[i].inflight_bytes = 0;
        moved
    }

    /// Moves the frames in flight on path `i` that were sent before
    /// `before` to the retransmit queue. Returns how many moved.
    fn evacuate_sent_before(&mut self, i: usize, before: Time) -> usize {
        let p = &mut self.paths[i];
        let mut moved = 0;
        while let Some(&(st, seq, t)) = p.inflight.front() {
            if t >= before {
                break;
            }
            p.inflight.pop_front();
            if let Some(e) = self.send.entry_mut(st, seq) {
                if e.state == send::EntryState::InFlight && e.path == p.id && e.sent_at == t {
                    e.state = send::EntryState::Pending;
                    p.inflight_bytes = p.inflight_bytes.saturating_sub(e.cost());
                    self.send.retx_queue.push_back((st, seq));
                    moved += 1;
                }
            }
        }
        moved
    }

    /// Path `i` is proven to work: a suspected path answered the PING
    /// sent at `pinged`, or a new path finished its handshake (`pinged`
    /// zero). What went out on it before that PING, and what waits on
    /// other suspected paths, is re-sent now (on the best path, this one
    /// if nothing is healthier) instead of when their backed-off timers
    /// fire — after an outage of every path those timers can be a second
    /// or more away, and messages are delivered in order, so one waiting
    /// on a dead path holds back everything behind it. The receiver drops
    /// any duplicate this makes.
    pub(super) fn path_proven(&mut self, i: usize, pinged: Time) {
        let mut moved = self.evacuate_sent_before(i, pinged);
        for j in 0..self.paths.len() {
            let q = &self.paths[j];
            if j != i && q.phase == Phase::Active && q.suspect && !q.inflight.is_empty() {
                moved += self.evacuate(j);
            }
        }
        if moved > 0 {
            self.stats.resent_on_answer += moved as u64;
        }
    }

    /// The transport under `path` failed (connection reset, or the failure
    /// detector declared it dead). Its in-flight messages are re-sent on the
    /// session's other paths before anything new.
    pub fn handle_path_down(&mut self, now: Time, path: PathId) {
        self.tick(now);
        if let Some(pi) = self.path_index(path) {
            self.path_failed(now, pi, PathCloseReason::TransportFailed, None);
        } else if let Some(i) = self.closing.iter().position(|c| c.path == path) {
            // Its CLOSE can no longer be written: report it now.
            if let Some(mut c) = self.closing.remove(i) {
                c.close = None;
                self.finish_close(c);
            }
        }
    }

    /// Closes a path from this side (a CLOSE frame is queued for it).
    pub fn close_path(&mut self, now: Time, path: PathId) {
        self.tick(now);
        if let Some(pi) = self.path_index(path) {
            let close = Close {
                scope: CloseScope::Path,
                code: CloseCode::NORMAL,
                reason: String::new(),
            };
            self.path_failed(now, pi, PathCloseReason::ClosedLocally, Some(close));
        }
    }

    /// Closes `path` because of `e`, telling the peer why (the router
    /// refused its HELLO, or its input broke the protocol).
    pub fn refuse_path(&mut self, now: Time, path: PathId, e: PathError) {
        self.tick(now);
        let Some(pi) = self.path_index(path) else {
            return;
        };
        let close = Close {
            scope: e.close_scope(),
            code: e.close_code(),
            reason: e.to_string(),
        };
        self.path_failed(now, pi, PathCloseReason::Error(e), Some(close));
    }

    /// Takes `path` out of this session without closing it: the router
    /// moved it to a session that replaces this one.
    pub fn detach_path(&mut self, path: PathId) {
        if let Some(pi) = self.path_index(path) {
            self.evacuate(pi);
            self.paths.remove(pi);
            if self.last_path == Some(path) {
                self.last_path = None;
            }
        }
    }

    /// The transport under path `pi` is gone (or the detector says so).
    pub(crate) fn path_failed(
        &mut self,
        now: Time,
        pi: usize,
        reason: PathCloseReason,
        close: Option<Close>,
    ) {
        let resent = self.evacuate(pi);
        if resent > 0 {
            self.stats.failovers += 1;
        }
        let p = self.paths.remove(pi);
        if self.last_path == Some(p.id) {
            self.last_path = None;
        }
        let c = ClosingPath {
            path: p.id,
            close,
            reason,
            resent,
        };
        if c.close.is_some() {
            self.closing.push_back(c);
        } else {
            self.finish_close(c);
        }
        self.update_reachability(now);
    }

    pub(super) fn finish_close(&mut self, c: ClosingPath) {
        self.events.push_back(Event::PathClosed {
            peer: Some(self.node),
            path: c.path,
            reason: c.reason,
            resent: c.resent,
        });
    }

    pub(super) fn update_reachability(&mut self, now: Time) {
        if self.ended.is_some() {
            return;
        }
        let reachable = self.paths.iter().any(|p| p.phase == Phase::Active);
        if reachable && !self.reachable {
            if let Some(peer) = self.peer {
                self.events.push_back(Event::PeerUp {
                    peer: self.node,
                    session: self.id,
                    epoch: peer.epoch,
                });
            }
        } else if !reachable && self.reachable {
            self.unreachable_since = now;
            self.events.push_back(Event::PeerUnreachable {
                peer: self.node,
                session: self.id,
            });
        }
        self.reachable = reachable;
    }

    /// The application finds message `id` overdue (no reply within its
    /// re-send timeout). If the message is still in flight, the path
    /// carrying it is suspected at once, as if its retransmission timeout
    /// had fired: its in-flight messages move to the other paths and new
    /// ones avoid it until it answers a probe. Returns whether a path was
    /// suspected (false: delivered already, queued, or another session).
    pub fn handle_message_overdue(&mut self, now: Time, id: MessageId) -> bool {
        self.tick(now);
        if id.session != self.id {
            return false;
        }
        let Some(e) = self
            .send
            .streams
            .get(id.stream.index())
            .and_then(|s| s.holding(id.seq))
        else {
            return false;
        };
        if e.state != send::EntryState::InFlight {
            return false;
        }
        let path = e.path;
        let Some(i) = self.path_index(path) else {
            return false;
        };
        if self.paths[i].phase != Phase::Active {
            return false;
        }
        self.paths[i].backoff = self.paths[i].backoff.saturating_add(1);
        self.stats.timeouts += 1;
        self.suspect(i);
        true
    }

    /// The failure detector found `path` silent while another path of the
    /// peer is heard: its in-flight messages move to the other paths and
    /// new ones avoid it until it answers a probe or an acknowledgement
    /// shows progress on it — the connection stays, so a path that was
    /// only late (a busy host) costs no new handshake. Returns whether the
    /// path was active here.
    pub fn handle_path_suspect(&mut self, now: Time, path: PathId) -> bool {
        self.tick(now);
        match self.path_index(path) {
            Some(i) if self.paths[i].phase == Phase::Active => {
                self.suspect(i);
                true
            }
            _ => false,
        }
    }

    /// Whether `path` is suspected (avoided until it answers a probe or an
    /// acknowledgement shows progress on it).
    pub fn is_path_suspect(&self, path: PathId) -> bool {
        self.path_index(path).is_some_and(|i| self.paths[i].suspect)
    }

    /// Suspects active path `i`: probed, avoided, its in-flight moved.
    fn suspect(&mut self, i: usize) {
        let p = &mut self.paths[i];
        p.suspect = true;
        p.ping_due = true;
        self.evacuate(i);
    }
}
