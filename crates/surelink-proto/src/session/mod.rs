//! One session with one incarnation of a peer, carried by any number of paths.
//!
//! The session numbers messages per channel, keeps each in the retransmit
//! cache until the peer's application has it, spreads new messages over the
//! least-loaded working path, and, when a path fails or stalls, re-sends that
//! path's in-flight messages on the others before anything new (SQR). The
//! receiving half releases messages exactly once and in order per channel.
//!
//! Sessions know nothing of handshakes between incarnations; the endpoint
//! binds paths to sessions and ends sessions (see `endpoint.rs`).

mod paths;
mod recv;
mod send;
mod transmit;

use std::collections::VecDeque;

use bytes::Bytes;

pub use paths::PathStats;
use paths::{PathState, Phase};
use recv::{Offer, RecvSide};
pub use send::Prefix;
use send::{AckError, AckOutcome, EntryState, SendSide};

use crate::config::{message_cost, EndpointConfig};
use crate::error::{PathError, ProtocolViolation};
use crate::event::{Event, PathCloseReason, RejectReason, SessionEndReason};
use crate::ids::{ChannelId, ClusterId, Epoch, NodeId, PathId, SessionId};
use crate::time::Time;
use crate::wire::{AckFrame, Close, CloseCode, CloseScope, DataFrame, Frame, DATA_FLAG_WITHDRAWN};

/// This endpoint's identity, shared by all its sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalIdentity {
    /// The cluster.
    pub cluster: ClusterId,
    /// This node.
    pub node: NodeId,
    /// This process incarnation (non-zero).
    pub epoch: Epoch,
}

/// What the peer told us about itself in its HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub(crate) epoch: Epoch,
    pub(crate) session: SessionId,
    pub(crate) recv_window: u64,
    pub(crate) max_message: u32,
    pub(crate) max_channels: u32,
}

/// Something queued for `poll_event`.
#[derive(Debug)]
pub(crate) enum Queued {
    Event(Box<Event>),
    /// A released message: consuming it advances the cumulative ack.
    Message {
        slot: usize,
        session: SessionId,
        peer: NodeId,
        channel: ChannelId,
        seq: u64,
        payload: Bytes,
    },
    /// A withdrawn number: consumed silently.
    Skip {
        slot: usize,
        session: SessionId,
        channel: ChannelId,
        seq: u64,
    },
}

/// A path leaving a session; the endpoint writes its CLOSE frame (if any)
/// and then reports it.
#[derive(Debug)]
pub(crate) struct ClosingPath {
    pub(crate) path: PathId,
    pub(crate) peer: Option<NodeId>,
    pub(crate) close: Option<Close>,
    pub(crate) reason: PathCloseReason,
    pub(crate) resent: usize,
}

/// What a session needs from its endpoint for one call.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a EndpointConfig,
    pub(crate) local: &'a LocalIdentity,
    pub(crate) events: &'a mut VecDeque<Queued>,
    pub(crate) closing: &'a mut VecDeque<ClosingPath>,
    pub(crate) slot: usize,
}

/// Counters and gauges of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Messages accepted by `send`.
    pub messages_sent: u64,
    /// Messages released to the application.
    pub messages_delivered: u64,
    /// DATA frames re-sent (after a path failure, timeout, or resume).
    pub resent: u64,
    /// DATA frames received that we already had.
    pub duplicates_received: u64,
    /// DATA frames dropped because they would exceed the receive window.
    pub over_window: u64,
    /// Frames ignored because they arrived on a path before its handshake.
    pub early_frames: u64,
    /// Paths lost while they had messages in flight (failovers).
    pub failovers: u64,
    /// Retransmission timeouts across paths.
    pub timeouts: u64,
    /// Window probes: re-sends that ask a silent peer for its acknowledgement.
    pub probes: u64,
    /// Bytes held in the retransmit cache now.
    pub cache_bytes: u64,
    /// Messages held in the retransmit cache now.
    pub cache_messages: u64,
    /// Bytes held on the receiving side now (reorder + undelivered).
    pub recv_buffered_bytes: u64,
    /// Out-of-order messages held now.
    pub reorder_messages: u64,
    /// Per path: id, phase ("handshaking"/"active"), srtt, in-flight bytes, counters.
    pub paths: Vec<PathSnapshot>,
}

/// A path's state at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSnapshot {
    /// The path.
    pub id: PathId,
    /// Whether it carries traffic.
    pub active: bool,
    /// Whether it timed out recently.
    pub suspect: bool,
    /// Smoothed RTT.
    pub srtt: std::time::Duration,
    /// Unacknowledged bytes on it.
    pub inflight_bytes: u64,
    /// Its counters.
    pub stats: PathStats,
}

#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: SessionId,
    pub(crate) node: NodeId,
    pub(crate) peer: Option<PeerInfo>,
    pub(crate) send: SendSide,
    pub(crate) recv: RecvSide,
    pub(crate) paths: Vec<PathState>,
    /// The path the last data went to (balance hysteresis).
    last_path: Option<PathId>,
    /// The path the last data came from (where acks go).
    last_data_path: Option<PathId>,
    /// Has at least one active path.
    pub(crate) reachable: bool,
    /// Since when it has had no active path.
    unreachable_since: Time,
    next_ping_token: u64,
    pub(crate) stats: SessionStats,
    scratch: Vec<(u64, u64)>,
    /// When some channel's cumulative acknowledgement last moved (or the
    /// last window probe went out).
    last_progress: Time,
    /// Consecutive window probes without progress (backs the probe off).
    probe_backoff: u32,
    /// ACK and RESUME frames processed (stamps each; see `apply_ack`).
    ack_frames: u64,
    /// Set when the session must end (peer's session CLOSE, linger); the
    /// endpoint ends it after the call that set it.
    pub(crate) pending_end: Option<SessionEndReason>,
}

impl Session {
    pub(crate) fn new(id: SessionId, node: NodeId, now: Time) -> Self {
        Session {
            id,
            node,
            peer: None,
            send: SendSide::default(),
            recv: RecvSide::default(),
            paths: Vec::new(),
            last_path: None,
            last_data_path: None,
            reachable: false,
            unreachable_since: now,
            next_ping_token: 1,
            stats: SessionStats::default(),
            scratch: Vec::new(),
            last_progress: now,
            probe_backoff: 0,
            ack_frames: 0,
            pending_end: None,
        }
    }

    pub(crate) fn path_index(&self, path: PathId) -> Option<usize> {
        self.paths.iter().position(|p| p.id == path)
    }

    /// The peer's identity and limits are known (first HELLO). Messages
    /// queued for channels the peer does not accept are dropped and reported;
    /// they were never sent, so no sequence number of an accepted channel moves.
    pub(crate) fn bind(&mut self, peer: PeerInfo, ctx: &mut Ctx<'_>) {
        self.peer = Some(peer);
        let from = usize::try_from(peer.max_channels).unwrap_or(usize::MAX);
        for idx in from..self.send.channels.len() {
            let channel = ChannelId(u16::try_from(idx).unwrap_or(u16::MAX));
            let ch = &mut self.send.channels[idx];
            let base = ch.base;
            for (i, e) in ch.entries.drain(..).enumerate() {
                self.send.cache_bytes -= message_cost(e.len());
                self.send.cache_len -= 1;
                ctx.events
                    .push_back(Queued::Event(Box::new(Event::MessageRejected {
                        peer: self.node,
                        session: self.id,
                        channel,
                        seq: base + i as u64,
                        reason: RejectReason::ChannelOutOfRange {
                            max: peer.max_channels,
                        },
                    })));
            }
            ch.base = ch.sent_end.max(base);
        }
    }

    /// A new transport joins; HELLO goes out first.
    pub(crate) fn add_path(&mut self, now: Time, path: PathId, cfg: &EndpointConfig) {
        self.paths.push(PathState::new(path, now, cfg));
    }

    /// The peer's HELLO arrived on `path` (the endpoint checked it fits).
    pub(crate) fn on_peer_hello(&mut self, now: Time, path: usize, cfg: &EndpointConfig) {
        let p = &mut self.paths[path];
        if !p.peer_hello_seen {
            p.peer_hello_seen = true;
            p.resume_due = true;
        } else if p.phase == Phase::Active
            && p.last_resume.is_none_or(|t| now >= t + cfg.handshake_retry)
        {
            // A repeated HELLO on a path that works for us: the peer retries
            // because our RESUME was lost (it has our HELLO, or it would not
            // have sent its RESUME). Answering with a HELLO too could make
            // two endpoints echo each other forever; answering every HELLO
            // with a RESUME (much larger) would amplify a flood of them.
            p.resume_due = true;
        }
        // Still handshaking: our own retry timer re-sends HELLO and RESUME.
    }

    /// Accepts a message from the application (checks done by the endpoint).
    pub(crate) fn push(&mut self, channel: ChannelId, prefix: Prefix, payload: Bytes) -> u64 {
        self.stats.messages_sent += 1;
        self.send.push(channel, prefix, payload)
    }

    /// Handles one frame (not HELLO) that arrived on path index `pi`.
    pub(crate) fn handle_frame(
        &mut self,
        now: Time,
        pi: usize,
        frame: Frame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), PathError> {
        if !self.paths[pi].peer_hello_seen {
            // Possible only over a lossy or reordering transport; the sender
            // re-sends whatever this was.
            if let Frame::Close(c) = frame {
                self.peer_closed(now, pi, c, ctx);
            } else {
                self.stats.early_frames += 1;
            }
            return Ok(());
        }
        match frame {
            Frame::Data(d) => self.on_data(now, pi, d, ctx),
            Frame::Ack(a) => self.on_ack(now, pi, &a, ctx.cfg),
            Frame::Resume(a) => {
                self.on_ack(now, pi, &a, ctx.cfg)?;
                let p = &mut self.paths[pi];
                if p.phase == Phase::Handshaking {
                    p.phase = Phase::Active;
                    let path = p.id;
                    ctx.events.push_back(Queued::Event(Box::new(Event::PathUp {
                        peer: self.node,
                        path,
                    })));
                    self.update_reachability(now, ctx);
                }
                Ok(())
            }
            Frame::Ping(token) => {
                self.paths[pi].pong_due = Some(token);
                // A probe may mean our last acknowledgements were lost.
                self.recv.request_full_ack(now);
                Ok(())
            }
            Frame::Pong(token) => {
                let p = &mut self.paths[pi];
                if let Some((t, sent)) = p.ping_outstanding {
                    if t == token {
                        p.rtt.sample(now.saturating_since(sent));
                        p.ping_outstanding = None;
                        p.suspect = false;
                        p.backoff = 0;
                    }
                }
                Ok(())
            }
            Frame::Close(c) => {
                self.peer_closed(now, pi, c, ctx);
                Ok(())
            }
            Frame::Hello(_) => Ok(()), // routed by the endpoint, never here
        }
    }

    fn on_data(
        &mut self,
        now: Time,
        pi: usize,
        d: DataFrame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), PathError> {
        if u32::from(d.channel.0) >= ctx.cfg.max_channels {
            return Err(ProtocolViolation::ChannelOutOfRange(d.channel.0).into());
        }
        if d.payload.len() > ctx.cfg.max_message_size as usize {
            return Err(ProtocolViolation::MessageTooLarge {
                len: d.payload.len(),
                max: ctx.cfg.max_message_size,
            }
            .into());
        }
        let p = &mut self.paths[pi];
        p.stats.data_received += 1;
        self.last_data_path = Some(p.id);
        let payload = if d.flags & DATA_FLAG_WITHDRAWN != 0 {
            None
        } else {
            Some(d.payload)
        };
        let (slot, session, peer, channel) = (ctx.slot, self.id, self.node, d.channel);
        let events = &mut *ctx.events;
        let mut delivered = 0;
        let offer = self.recv.offer(
            now,
            channel,
            d.seq,
            payload,
            u64::from(ctx.cfg.recv_window),
            |seq, payload| {
                events.push_back(match payload {
                    Some(payload) => {
                        delivered += 1;
                        Queued::Message {
                            slot,
                            session,
                            peer,
                            channel,
                            seq,
                            payload,
                        }
                    }
                    None => Queued::Skip {
                        slot,
                        session,
                        channel,
                        seq,
                    },
                })
            },
        );
        self.stats.messages_delivered += delivered;
        match offer {
            Offer::Duplicate => self.stats.duplicates_received += 1,
            Offer::OverWindow => self.stats.over_window += 1,
            Offer::BeyondWindow => {
                return Err(ProtocolViolation::SeqBeyondWindow {
                    channel: channel.0,
                    seq: d.seq,
                }
                .into())
            }
            Offer::Released | Offer::Buffered => {}
        }
        Ok(())
    }

    fn on_ack(
        &mut self,
        now: Time,
        pi: usize,
        a: &AckFrame,
        cfg: &EndpointConfig,
    ) -> Result<(), PathError> {
        let mut out = AckOutcome::default();
        self.ack_frames += 1;
        let stamp = self.ack_frames;
        let Session { send, paths, .. } = self;
        for e in a.entries() {
            if u32::from(e.channel.0) >= cfg.max_channels {
                return Err(ProtocolViolation::ChannelOutOfRange(e.channel.0).into());
            }
            send.apply_ack(
                e.channel,
                e.cumulative,
                e.ranges,
                stamp,
                &mut out,
                |path, cost| {
                    if let Some(p) = paths.iter_mut().find(|p| p.id == path) {
                        p.inflight_bytes = p.inflight_bytes.saturating_sub(cost);
                        // Progress on the path: it works again.
                        p.backoff = 0;
                        p.suspect = false;
                    }
                },
            )
            .map_err(|err| match err {
                AckError::Unsent(seq) => ProtocolViolation::AckOfUnsent {
                    channel: e.channel.0,
                    seq,
                },
                AckError::RepeatedChannel => ProtocolViolation::RepeatedAckChannel(e.channel.0),
            })?;
        }
        if let Some((path, sent_at, _)) = out.rtt_sample {
            if let Some(p) = paths.iter_mut().find(|p| p.id == path) {
                let rtt = now.saturating_since(sent_at).saturating_sub(a.delay());
                p.rtt.sample(rtt.max(std::time::Duration::from_micros(1)));
            }
        }
        if out.progress {
            self.last_progress = now;
            self.probe_backoff = 0;
        }
        let _ = pi;
        for i in 0..self.paths.len() {
            self.trim_inflight(i);
        }
        Ok(())
    }

    /// When a window probe is due, if one can be: messages are outstanding
    /// (sent, not cumulatively acknowledged) but none is in flight, so no
    /// retransmission timer runs. That happens when the acknowledgement that
    /// would free them was lost (TCP's lost window update): without a probe
    /// the sender would wait forever with a full window.
    fn probe_deadline(&self, cfg: &EndpointConfig) -> Option<Time> {
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
            let r = p.rto(cfg);
            rto = Some(rto.map_or(r, |x: std::time::Duration| x.min(r)));
        }
        rto.map(|r| self.last_progress + r.saturating_mul(1 << self.probe_backoff.min(6)))
    }

    /// Drops references at the front of a path's in-flight queue that no
    /// longer describe a message in flight on it.
    fn trim_inflight(&mut self, i: usize) {
        let p = &mut self.paths[i];
        while let Some(&(ch, seq, t)) = p.inflight.front() {
            match self.send.entry(ch, seq) {
                Some(e) if e.state == EntryState::InFlight && e.path == p.id && e.sent_at == t => {
                    break
                }
                _ => {
                    p.inflight.pop_front();
                }
            }
        }
    }

    /// Moves every message in flight on path `i` to the retransmit queue.
    /// Returns how many moved.
    fn evacuate(&mut self, i: usize) -> usize {
        let p = &mut self.paths[i];
        let mut moved = 0;
        for (ch, seq, t) in p.inflight.drain(..) {
            if let Some(e) = self.send.entry_mut(ch, seq) {
                if e.state == EntryState::InFlight && e.path == p.id && e.sent_at == t {
                    e.state = EntryState::Pending;
                    self.send.retx_queue.push_back((ch, seq));
                    moved += 1;
                }
            }
        }
        p.inflight_bytes = 0;
        moved
    }

    /// The application finds message `(ch, seq)` overdue (a call's re-send
    /// timeout): if it is in flight, its path is treated as if its
    /// retransmission timeout had fired — suspected, probed, and its
    /// in-flight messages moved to the other paths — so the caller's
    /// re-send and the original both avoid it (hr-net: RESEND → SELECT).
    /// Returns whether a path was suspected.
    pub(crate) fn message_overdue(&mut self, ch: ChannelId, seq: u64) -> bool {
        let Some(e) = self.send.entry(ch, seq) else {
            return false;
        };
        if e.state != EntryState::InFlight {
            return false;
        }
        let path = e.path;
        let Some(i) = self.paths.iter().position(|p| p.id == path) else {
            return false;
        };
        let p = &mut self.paths[i];
        if p.phase != Phase::Active {
            return false;
        }
        p.suspect = true;
        p.backoff = p.backoff.saturating_add(1);
        p.ping_due = true;
        self.stats.timeouts += 1;
        self.evacuate(i);
        true
    }

    /// The transport under path `pi` is gone (or the detector says so).
    pub(crate) fn path_failed(
        &mut self,
        now: Time,
        pi: usize,
        reason: PathCloseReason,
        close: Option<Close>,
        ctx: &mut Ctx<'_>,
    ) {
        let resent = self.evacuate(pi);
        if resent > 0 {
            self.stats.failovers += 1;
        }
        let p = self.paths.remove(pi);
        if self.last_path == Some(p.id) {
            self.last_path = None;
        }
        ctx.closing.push_back(ClosingPath {
            path: p.id,
            peer: Some(self.node),
            close,
            reason,
            resent,
        });
        self.update_reachability(now, ctx);
    }

    fn peer_closed(&mut self, now: Time, pi: usize, c: Close, ctx: &mut Ctx<'_>) {
        match c.scope {
            CloseScope::Path => {
                let reason = PathCloseReason::ClosedByPeer {
                    code: c.code,
                    reason: c.reason,
                };
                self.path_failed(now, pi, reason, None, ctx);
            }
            CloseScope::Session => {
                // The endpoint ends the session when it sees this flag.
                let reason = match c.code {
                    CloseCode::SESSION_UNKNOWN => SessionEndReason::PeerReset,
                    CloseCode::RESTARTED => SessionEndReason::PeerRestarted {
                        old: self.peer.map_or(Epoch(0), |p| p.epoch),
                        new: None,
                    },
                    CloseCode::STALE => SessionEndReason::Rejected(c.code),
                    code => SessionEndReason::ClosedByPeer {
                        code,
                        reason: c.reason,
                    },
                };
                self.pending_end = Some(reason);
            }
        }
    }

    fn update_reachability(&mut self, now: Time, ctx: &mut Ctx<'_>) {
        let reachable = self.paths.iter().any(|p| p.phase == Phase::Active);
        if reachable && !self.reachable {
            if let Some(peer) = self.peer {
                ctx.events.push_back(Queued::Event(Box::new(Event::PeerUp {
                    peer: self.node,
                    session: self.id,
                    epoch: peer.epoch,
                })));
            }
        } else if !reachable && self.reachable {
            self.unreachable_since = now;
            ctx.events
                .push_back(Queued::Event(Box::new(Event::PeerUnreachable {
                    peer: self.node,
                    session: self.id,
                })));
        }
        self.reachable = reachable;
    }

    /// Runs expired timers (may set `pending_end`).
    pub(crate) fn handle_timeout(&mut self, now: Time, ctx: &mut Ctx<'_>) {
        let cfg = ctx.cfg;
        let mut i = 0;
        while i < self.paths.len() {
            let p = &mut self.paths[i];
            match p.phase {
                Phase::Handshaking => {
                    if now >= p.created + cfg.handshake_timeout {
                        let err = PathError::Handshake(crate::error::HandshakeError::Timeout);
                        let close = Close {
                            scope: CloseScope::Path,
                            code: err.close_code(),
                            reason: err.to_string(),
                        };
                        self.path_failed(now, i, PathCloseReason::Error(err), Some(close), ctx);
                        continue;
                    }
                    if now >= p.next_handshake_retry {
                        p.hello_due = true;
                        p.resume_due = p.peer_hello_seen;
                        p.next_handshake_retry = now + cfg.handshake_retry;
                    }
                }
                Phase::Active => {
                    if let Some((_, sent)) = p.ping_outstanding {
                        if now >= sent + p.rto(cfg) {
                            p.ping_due = true;
                            p.backoff = p.backoff.saturating_add(1);
                        }
                    }
                    self.trim_inflight(i);
                    let p = &mut self.paths[i];
                    if let Some(&(_, _, sent)) = p.inflight.front() {
                        if now >= sent + p.rto(cfg) {
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
        if self.probe_deadline(cfg).is_some_and(|t| now >= t) {
            // A PING makes the peer send its whole receive state (see
            // `RecvSide::request_full_ack`); backed off while nothing moves,
            // as when the peer's application is merely slow.
            if let Some(i) = paths::select(&self.paths, self.last_path, cfg) {
                self.paths[i].ping_due = true;
                self.stats.probes += 1;
            }
            self.probe_backoff = self.probe_backoff.saturating_add(1);
            self.last_progress = now;
        }
        if !self.reachable
            && self.pending_end.is_none()
            && now >= self.unreachable_since + cfg.linger
        {
            self.pending_end = Some(SessionEndReason::LingerExpired);
        }
    }

    /// The earliest time `handle_timeout` has work.
    pub(crate) fn next_timeout(&self, cfg: &EndpointConfig) -> Time {
        let mut t = Time::MAX;
        let mut can_ack = false;
        for p in &self.paths {
            match p.phase {
                Phase::Handshaking => {
                    t = t
                        .min(p.next_handshake_retry)
                        .min(p.created + cfg.handshake_timeout);
                    can_ack |= p.peer_hello_seen;
                }
                Phase::Active => {
                    can_ack = true;
                    let rto = p.rto(cfg);
                    if let Some(&(_, _, sent)) = p.inflight.front() {
                        t = t.min(sent + rto);
                    }
                    if let Some((_, sent)) = p.ping_outstanding {
                        t = t.min(sent + rto);
                    }
                }
            }
        }
        if can_ack {
            if let Some(d) = self.recv.ack_deadline(cfg.max_ack_delay) {
                t = t.min(d);
            }
        }
        if !self.reachable {
            t = t.min(self.unreachable_since + cfg.linger);
        }
        if let Some(p) = self.probe_deadline(cfg) {
            t = t.min(p);
        }
        t
    }

    /// Ends the session: abandons every unacknowledged message and queues a
    /// session CLOSE on every path.
    pub(crate) fn end(
        &mut self,
        reason: SessionEndReason,
        close_code: CloseCode,
        ctx: &mut Ctx<'_>,
    ) {
        let abandoned = self.send.abandon_all();
        for p in self.paths.drain(..) {
            let close = Close {
                scope: CloseScope::Session,
                code: close_code,
                reason: String::new(),
            };
            ctx.closing.push_back(ClosingPath {
                path: p.id,
                peer: Some(self.node),
                close: Some(close),
                reason: PathCloseReason::SessionEnded,
                resent: 0,
            });
        }
        ctx.events
            .push_back(Queued::Event(Box::new(Event::SessionEnded {
                peer: self.node,
                session: self.id,
                reason,
                abandoned,
            })));
    }

    /// A snapshot of counters and gauges.
    pub(crate) fn snapshot(&self) -> SessionStats {
        let mut s = self.stats.clone();
        s.cache_bytes = self.send.cache_bytes;
        s.cache_messages = self.send.cache_len;
        s.recv_buffered_bytes = self.recv.buffered_bytes;
        s.reorder_messages = self.recv.reorder_len() as u64;
        s.paths = self
            .paths
            .iter()
            .map(|p| PathSnapshot {
                id: p.id,
                active: p.phase == Phase::Active,
                suspect: p.suspect,
                srtt: p.rtt.srtt,
                inflight_bytes: p.inflight_bytes,
                stats: p.stats,
            })
            .collect();
        s
    }

    /// The application consumed a released message.
    pub(crate) fn consumed(&mut self, now: Time, channel: ChannelId, seq: u64, len: usize) {
        self.recv.consumed(now, channel, seq, len);
    }

    /// Whether the cache can take a message of `len` bytes.
    pub(crate) fn has_room(&self, len: usize, cfg: &EndpointConfig) -> bool {
        self.send.cache_bytes + message_cost(len) <= cfg.send_buffer
    }
}
