//! A session's timers: handshake retries and timeouts, retransmission
//! timeouts, window probes, delayed acknowledgements, call re-sends and
//! deadlines, and the linger time without a path.

use super::paths::{self, Phase};
use super::Session;
use crate::error::{HandshakeError, PathError};
use crate::event::{PathCloseReason, SessionEndReason};
use crate::time::Time;
use crate::wire::{Close, CloseCode, CloseScope};

impl Session {
    /// When a window probe is due, if one can be: messages are outstanding
    /// (sent, not cumulatively acknowledged) but none is in flight, so no
    /// retransmission timer runs. That happens when the acknowledgement that
    /// would free them was lost (TCP's lost window update): without a probe
    /// the sender would wait forever with a full window.
    fn probe_deadline(&self) -> Option<Time> {
        if self.send.outstanding_bytes == 0 || !self.send.retx_queue.is_empty() {
            return None;
        }
        let mut rto = None;
        for p in &self.paths {
            if p.phase != Phase::Active {
                continue;
            }
            if !p.inflight.is_empty() {
                return None; // a retransmission timer covers it
            }
            let r = p.rto(&self.cfg);
            rto = Some(rto.map_or(r, |x: std::time::Duration| x.min(r)));
        }
        rto.map(|r| self.last_progress + r.saturating_mul(1 << self.probe_backoff.min(6)))
    }

    /// Runs every timer that is due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.tick(now);
        if self.ended.is_some() {
            return;
        }
        let mut i = 0;
        while i < self.paths.len() {
            let p = &mut self.paths[i];
            match p.phase {
                Phase::Handshaking => {
                    if now >= p.created + self.cfg.handshake_timeout {
                        let err = PathError::Handshake(HandshakeError::Timeout);
                        let close = Close {
                            scope: CloseScope::Path,
                            code: err.close_code(),
                            reason: err.to_string(),
                        };
                        self.path_failed(now, i, PathCloseReason::Error(err), Some(close));
                        continue;
                    }
                    if now >= p.next_handshake_retry {
                        p.hello_due = true;
                        p.resume_due = p.peer_hello_seen;
                        p.next_handshake_retry = now + self.cfg.handshake_retry;
                    }
                }
                Phase::Active => {
                    if now >= p.last_recv + self.cfg.path_idle_timeout {
                        let close = Close {
                            scope: CloseScope::Path,
                            code: CloseCode::NORMAL,
                            reason: "idle".into(),
                        };
                        self.stats.idle_paths_closed += 1;
                        self.path_failed(now, i, PathCloseReason::Idle, Some(close));
                        continue;
                    }
                    if p.keepalive_due(&self.cfg).is_some_and(|t| now >= t) {
                        p.ping_due = true;
                    }
                    if let Some((_, sent)) = p.ping_outstanding {
                        if now >= sent + p.probe_rto(&self.cfg) {
                            p.ping_due = true;
                            p.backoff = p.backoff.saturating_add(1);
                        }
                    }
                    self.trim_inflight(i);
                    let p = &mut self.paths[i];
                    if let Some(&(_, _, sent)) = p.inflight.front() {
                        if now >= sent + p.rto(&self.cfg) {
                            p.suspect = true;
                            p.backoff = p.backoff.saturating_add(1);
                            p.stats.timeouts += 1;
                            p.ping_due = true;
                            self.stats.timeouts += 1;
                            self.evacuate(i);
                        }
                    }
                }
            }
            i += 1;
        }
        if self.probe_deadline().is_some_and(|t| now >= t) {
            // A PING makes the peer send its whole receive state (see
            // `RecvSide::request_full_ack`); backed off while nothing moves,
            // as when the peer's application is merely slow.
            if let Some(i) = paths::select(
                &self.paths,
                self.last_path,
                &self.cfg,
                self.avoid,
                self.prefer,
            ) {
                self.paths[i].ping_due = true;
                self.stats.probes += 1;
            }
            self.probe_backoff = self.probe_backoff.saturating_add(1);
            self.last_progress = now;
        }
        self.call_timers(now);
        if !self.reachable && now >= self.unreachable_since + self.cfg.linger {
            self.end(now, SessionEndReason::LingerExpired, CloseCode::NORMAL);
        }
    }

    /// The earliest time [`Session::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.ended.is_some() {
            return None;
        }
        let mut t = Time::MAX;
        let mut can_ack = false;
        for p in &self.paths {
            match p.phase {
                Phase::Handshaking => {
                    t = t
                        .min(p.next_handshake_retry)
                        .min(p.created + self.cfg.handshake_timeout);
                    can_ack |= p.peer_hello_seen;
                }
                Phase::Active => {
                    can_ack = true;
                    t = t.min(p.last_recv + self.cfg.path_idle_timeout);
                    if let Some(k) = p.keepalive_due(&self.cfg) {
                        t = t.min(k);
                    }
                    if let Some(&(_, _, sent)) = p.inflight.front() {
                        t = t.min(sent + p.rto(&self.cfg));
                    }
                    if let Some((_, sent)) = p.ping_outstanding {
                        t = t.min(sent + p.probe_rto(&self.cfg));
                    }
                }
            }
        }
        if can_ack {
            if let Some(d) = self.recv.ack_deadline(self.cfg.max_ack_delay) {
                t = t.min(d);
            }
        }
        if !self.reachable {
            t = t.min(self.unreachable_since + self.cfg.linger);
        }
        if let Some(p) = self.probe_deadline() {
            t = t.min(p);
        }
        if let Some(c) = self.calls.next_timeout() {
            t = t.min(c);
        }
        (t != Time::MAX).then_some(t)
    }
}
