//! The endpoint: every session of one process, and the paths that carry them.
//!
//! The shell (or the simulator) hands the endpoint transports as [`PathId`]s,
//! feeds it their bytes and its timers, and writes out what
//! [`Endpoint::poll_transmit`] returns. The endpoint binds each path to a
//! session by the HELLO exchange and ends sessions whose peer restarted.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use bytes::{Bytes, BytesMut};

use crate::config::{ConfigError, EndpointConfig};
use crate::error::{AddPathError, HandshakeError, PathError, ProtocolViolation, SendError};
use crate::event::{Event, PathCloseReason, SessionEndReason};
use crate::handshake::{decide, Current, Decision};
use crate::ids::{ChannelId, Epoch, MessageId, NodeId, PathId, SessionId};
use crate::session::{
    ClosingPath, Ctx, LocalIdentity, PeerInfo, Prefix, Queued, Session, SessionStats,
};
use crate::time::Time;
use crate::wire::{decode, Close, CloseCode, CloseScope, Frame, Hello};

/// A session's view of the endpoint, built from disjoint fields so the
/// session itself can be borrowed at the same time.
macro_rules! ctx {
    ($ep:ident, $slot:expr) => {
        Ctx {
            cfg: &$ep.cfg,
            local: &$ep.local,
            events: &mut $ep.events,
            closing: &mut $ep.closing,
            slot: $slot,
        }
    };
}

#[derive(Debug, Clone, Copy)]
enum PathSlot {
    /// Accepted, waiting for the peer's HELLO to say who it is.
    Unbound { since: Time },
    /// Belongs to the session in this slot.
    Bound(usize),
    /// A CLOSE frame waits to be written; input is ignored.
    Closing,
}

/// The sans-IO endpoint. See the crate docs for the calling convention.
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    local: LocalIdentity,
    max_body: u32,
    sessions: Vec<Option<Session>>,
    free: Vec<usize>,
    by_node: HashMap<NodeId, usize>,
    next_session_id: u64,
    paths: HashMap<PathId, PathSlot>,
    /// Per node, the newest (epoch, session) a session of ours was bound to.
    seen: HashMap<NodeId, (Epoch, SessionId)>,
    events: VecDeque<Queued>,
    closing: VecDeque<ClosingPath>,
    /// Round-robin cursor over sessions for `poll_transmit`.
    cursor: usize,
    /// The latest `now` seen; used to time acknowledgement delays from
    /// `poll_event`, which takes no time argument.
    now: Time,
}

impl Endpoint {
    /// Creates an endpoint. The epoch must be non-zero and larger than any
    /// earlier incarnation of this node used (a start timestamp works).
    pub fn new(cfg: EndpointConfig, local: LocalIdentity) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if local.epoch == Epoch(0) {
            return Err(ConfigError::Zero { field: "epoch" });
        }
        Ok(Endpoint {
            max_body: cfg.max_frame_body(),
            cfg,
            local,
            sessions: Vec::new(),
            free: Vec::new(),
            by_node: HashMap::default(),
            next_session_id: 1,
            paths: HashMap::default(),
            seen: HashMap::default(),
            events: VecDeque::new(),
            closing: VecDeque::new(),
            cursor: 0,
            now: Time::ZERO,
        })
    }

    /// This endpoint's identity.
    pub fn local(&self) -> &LocalIdentity {
        &self.local
    }

    /// The configuration in force.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    fn tick(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    fn session_slot(&mut self, now: Time, node: NodeId) -> Option<usize> {
        if let Some(&slot) = self.by_node.get(&node) {
            return Some(slot);
        }
        if self.by_node.len() >= self.cfg.max_sessions as usize {
            return None;
        }
        let id = SessionId(self.next_session_id);
        self.next_session_id += 1;
        let s = Session::new(id, node, now);
        let slot = match self.free.pop() {
            Some(slot) => {
                self.sessions[slot] = Some(s);
                slot
            }
            None => {
                self.sessions.push(Some(s));
                self.sessions.len() - 1
            }
        };
        self.by_node.insert(node, slot);
        Some(slot)
    }

    fn session(&self, slot: usize) -> Option<&Session> {
        self.sessions.get(slot).and_then(Option::as_ref)
    }

    /// Runs `f` on the session in `slot` with a context, then ends the session
    /// if `f` asked for it.
    fn with_session<R>(
        &mut self,
        slot: usize,
        f: impl FnOnce(&mut Session, &mut Ctx<'_>) -> R,
    ) -> Option<R> {
        let s = self.sessions.get_mut(slot)?.as_mut()?;
        let mut ctx = ctx!(self, slot);
        let r = f(s, &mut ctx);
        if let Some(reason) = s.pending_end.take() {
            self.end_session(slot, reason, CloseCode::NORMAL);
        }
        Some(r)
    }

    fn end_session(&mut self, slot: usize, reason: SessionEndReason, code: CloseCode) {
        let Some(mut s) = self.sessions.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let mut ctx = ctx!(self, slot);
        s.end(reason, code, &mut ctx);
        if self.by_node.get(&s.node) == Some(&slot) {
            self.by_node.remove(&s.node);
        }
        self.free.push(slot);
        self.report_closed_paths();
    }

    /// Reports closing paths that have no CLOSE frame to write; marks the
    /// others so their input is ignored until `poll_transmit` writes them.
    fn report_closed_paths(&mut self) {
        if self.closing.is_empty() {
            return;
        }
        let mut keep = VecDeque::new();
        while let Some(c) = self.closing.pop_front() {
            if c.close.is_some() {
                self.paths.insert(c.path, PathSlot::Closing);
                keep.push_back(c);
            } else {
                self.finish_close(c);
            }
        }
        self.closing = keep;
    }

    fn finish_close(&mut self, c: ClosingPath) {
        self.paths.remove(&c.path);
        self.events
            .push_back(Queued::Event(Box::new(Event::PathClosed {
                peer: c.peer,
                path: c.path,
                reason: c.reason,
                resent: c.resent,
            })));
    }

    /// A new transport is up. `peer` is the node it was dialled to, or `None`
    /// for an accepted connection (the peer's HELLO will say who it is). A
    /// dialled path sends HELLO at once; an accepted one answers the peer's.
    pub fn add_path(
        &mut self,
        now: Time,
        path: PathId,
        peer: Option<NodeId>,
    ) -> Result<(), AddPathError> {
        self.tick(now);
        if self.paths.contains_key(&path) {
            return Err(AddPathError::Duplicate(path));
        }
        match peer {
            None => {
                self.paths.insert(path, PathSlot::Unbound { since: now });
            }
            Some(node) if node == self.local.node => return Err(AddPathError::SelfDial(node)),
            Some(node) => {
                let slot = self
                    .session_slot(now, node)
                    .ok_or(AddPathError::TooManySessions(self.cfg.max_sessions))?;
                let cfg = &self.cfg;
                if let Some(s) = self.sessions[slot].as_mut() {
                    s.add_path(now, path, cfg);
                }
                self.paths.insert(path, PathSlot::Bound(slot));
            }
        }
        Ok(())
    }

    /// The transport under `path` failed (connection reset, or the failure
    /// detector declared it dead). Its in-flight messages are re-sent on the
    /// session's other paths before anything new. Unknown paths are ignored.
    pub fn handle_path_down(&mut self, now: Time, path: PathId) {
        self.tick(now);
        match self.paths.get(&path).copied() {
            None => {}
            Some(PathSlot::Unbound { .. }) => self.finish_close(ClosingPath {
                path,
                peer: None,
                close: None,
                reason: PathCloseReason::TransportFailed,
                resent: 0,
            }),
            Some(PathSlot::Closing) => {
                if let Some(i) = self.closing.iter().position(|c| c.path == path) {
                    if let Some(mut c) = self.closing.remove(i) {
                        c.close = None;
                        self.finish_close(c);
                    }
                }
            }
            Some(PathSlot::Bound(slot)) => {
                self.with_session(slot, |s, ctx| {
                    if let Some(pi) = s.path_index(path) {
                        s.path_failed(now, pi, PathCloseReason::TransportFailed, None, ctx);
                    }
                });
                self.report_closed_paths();
            }
        }
    }

    /// Closes a path from this side (a CLOSE frame is queued for it).
    pub fn close_path(&mut self, now: Time, path: PathId) {
        self.tick(now);
        let close = Close {
            scope: CloseScope::Path,
            code: CloseCode::NORMAL,
            reason: String::new(),
        };
        match self.paths.get(&path).copied() {
            Some(PathSlot::Bound(slot)) => {
                self.with_session(slot, |s, ctx| {
                    if let Some(pi) = s.path_index(path) {
                        s.path_failed(now, pi, PathCloseReason::ClosedLocally, Some(close), ctx);
                    }
                });
            }
            Some(PathSlot::Unbound { .. }) => self.closing.push_back(ClosingPath {
                path,
                peer: None,
                close: Some(close),
                reason: PathCloseReason::ClosedLocally,
                resent: 0,
            }),
            Some(PathSlot::Closing) | None => {}
        }
        self.report_closed_paths();
    }

    /// Ends the session with `peer` from this side: abandons its outstanding
    /// messages (reported in [`Event::SessionEnded`]) and closes its paths.
    pub fn close_session(&mut self, now: Time, peer: NodeId) {
        self.tick(now);
        if let Some(&slot) = self.by_node.get(&peer) {
            self.end_session(slot, SessionEndReason::ClosedLocally, CloseCode::NORMAL);
        }
    }

    /// Feeds bytes that arrived on `path`. Decodes every whole frame in `buf`
    /// and leaves a trailing partial frame there for the next call.
    ///
    /// On error the path is being closed: a CLOSE frame carrying the reason is
    /// queued for it, an [`Event::PathClosed`] follows, and the caller should
    /// stop reading from the transport. Other paths and sessions carry on.
    pub fn handle_input(
        &mut self,
        now: Time,
        path: PathId,
        buf: &mut BytesMut,
    ) -> Result<(), PathError> {
        self.tick(now);
        // Look the path up once per call, not per frame: DATA and ACK (nearly
        // all traffic) cannot change which session a path belongs to.
        let mut slot = self.paths.get(&path).copied();
        loop {
            match slot {
                None => return Err(PathError::UnknownPath(path)),
                Some(PathSlot::Closing) => {
                    buf.clear();
                    return Ok(());
                }
                Some(_) => {}
            }
            let frame = match decode(buf, self.max_body) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(e) => {
                    let e = PathError::from(e);
                    self.refuse_path(now, path, e.clone());
                    buf.clear();
                    return Err(e);
                }
            };
            let fast = matches!(frame, Frame::Data(_) | Frame::Ack(_));
            let r = match slot {
                Some(PathSlot::Bound(s)) if fast => self.session_frame(now, s, path, frame),
                _ => self.handle_frame(now, path, frame),
            };
            if let Err(e) = r {
                self.refuse_path(now, path, e.clone());
                buf.clear();
                return Err(e);
            }
            if !fast {
                slot = self.paths.get(&path).copied();
                if slot.is_none() {
                    // This input closed the path (the peer's CLOSE): done,
                    // and not an error; anything after it is moot.
                    buf.clear();
                    return Ok(());
                }
            }
        }
    }

    /// Hands a frame to the session a path is bound to.
    fn session_frame(
        &mut self,
        now: Time,
        slot: usize,
        path: PathId,
        frame: Frame,
    ) -> Result<(), PathError> {
        let r = self
            .with_session(slot, |s, ctx| match s.path_index(path) {
                Some(pi) => s.handle_frame(now, pi, frame, ctx),
                None => Ok(()),
            })
            .unwrap_or(Ok(()));
        self.report_closed_paths();
        r
    }

    /// Closes `path` because of `e`, telling the peer why.
    fn refuse_path(&mut self, now: Time, path: PathId, e: PathError) {
        let scope = match &e {
            PathError::Handshake(
                HandshakeError::SessionUnknown(_)
                | HandshakeError::EarlierIncarnation { .. }
                | HandshakeError::Stale { .. },
            ) => CloseScope::Session,
            _ => CloseScope::Path,
        };
        let close = Close {
            scope,
            code: e.close_code(),
            reason: e.to_string(),
        };
        match self.paths.get(&path).copied() {
            Some(PathSlot::Bound(slot)) => {
                let mut e = Some(e);
                let closed = self.with_session(slot, |s, ctx| {
                    let pi = s.path_index(path)?;
                    let reason = PathCloseReason::Error(e.take()?);
                    s.path_failed(now, pi, reason, Some(close.clone()), ctx);
                    Some(())
                });
                if closed.flatten().is_none() {
                    // The session no longer holds it (e.g. it just ended).
                    if let Some(e) = e {
                        self.closing.push_back(ClosingPath {
                            path,
                            peer: None,
                            close: Some(close),
                            reason: PathCloseReason::Error(e),
                            resent: 0,
                        });
                    }
                }
            }
            Some(PathSlot::Unbound { .. }) => self.closing.push_back(ClosingPath {
                path,
                peer: None,
                close: Some(close),
                reason: PathCloseReason::Error(e),
                resent: 0,
            }),
            Some(PathSlot::Closing) | None => {}
        }
        self.report_closed_paths();
    }

    fn handle_frame(&mut self, now: Time, path: PathId, frame: Frame) -> Result<(), PathError> {
        match (self.paths.get(&path).copied(), frame) {
            (None, _) => Err(PathError::UnknownPath(path)),
            (Some(PathSlot::Closing), _) => Ok(()),
            (Some(PathSlot::Unbound { .. }), Frame::Hello(h)) => self.on_hello(now, path, None, h),
            (Some(PathSlot::Unbound { .. }), Frame::Close(c)) => {
                self.finish_close(ClosingPath {
                    path,
                    peer: None,
                    close: None,
                    reason: PathCloseReason::ClosedByPeer {
                        code: c.code,
                        reason: c.reason,
                    },
                    resent: 0,
                });
                Ok(())
            }
            // Anything else before HELLO: only a lossy transport does this.
            (Some(PathSlot::Unbound { .. }), _) => Ok(()),
            (Some(PathSlot::Bound(slot)), Frame::Hello(h)) => {
                self.on_hello(now, path, Some(slot), h)
            }
            (Some(PathSlot::Bound(slot)), frame) => self.session_frame(now, slot, path, frame),
        }
    }

    fn on_hello(
        &mut self,
        now: Time,
        path: PathId,
        bound: Option<usize>,
        h: Hello,
    ) -> Result<(), PathError> {
        let expected = bound.and_then(|slot| self.session(slot)).map(|s| s.node);
        // A second HELLO on a path must name the same peer session: a path
        // never changes sessions.
        if let Some(s) = bound.and_then(|slot| self.session(slot)) {
            let seen_here = s
                .path_index(path)
                .is_some_and(|pi| s.paths[pi].peer_hello_seen);
            if seen_here
                && s.peer
                    .is_some_and(|p| (p.epoch, p.session) != (h.epoch, h.session))
            {
                return Err(ProtocolViolation::HelloChanged.into());
            }
        }
        let cur_slot = self.by_node.get(&h.node).copied();
        let cur = cur_slot
            .and_then(|slot| self.session(slot))
            .map(|s| Current {
                id: s.id,
                peer: s.peer,
            });
        let peer_info = PeerInfo {
            epoch: h.epoch,
            session: h.session,
            recv_window: u64::from(h.recv_window),
            max_message: h.max_message,
            max_channels: h.max_channels,
        };
        let seen = self.seen.get(&h.node).copied();
        let slot = match decide(&self.local, &h, expected, cur, seen) {
            Decision::Reject(e) => return Err(e.into()),
            Decision::Attach | Decision::Bind => cur_slot,
            Decision::Create => self.session_slot(now, h.node),
            Decision::Replace(reason) => {
                if let Some(old) = cur_slot {
                    // This path moves to the new session; the old one's other
                    // paths close with it.
                    if let Some(s) = self.sessions[old].as_mut() {
                        s.paths.retain(|p| p.id != path);
                    }
                    self.end_session(old, reason, CloseCode::SUPERSEDED);
                }
                self.session_slot(now, h.node)
            }
        };
        let slot = slot.ok_or(HandshakeError::TooManySessions(self.cfg.max_sessions))?;
        let Some(s) = self.sessions[slot].as_mut() else {
            return Err(HandshakeError::TooManySessions(self.cfg.max_sessions).into());
        };
        if s.peer.is_none() {
            let mut ctx = ctx!(self, slot);
            s.bind(peer_info, &mut ctx);
            self.remember(h.node, (h.epoch, h.session));
        }
        let cfg = &self.cfg;
        let Some(s) = self.sessions[slot].as_mut() else {
            return Err(HandshakeError::TooManySessions(self.cfg.max_sessions).into());
        };
        let pi = match s.path_index(path) {
            Some(pi) => pi,
            None => {
                s.add_path(now, path, cfg);
                s.paths.len() - 1
            }
        };
        s.on_peer_hello(now, pi, cfg);
        self.paths.insert(path, PathSlot::Bound(slot));
        Ok(())
    }

    /// Notes the newest peer session bound for `node`, kept past the end of
    /// sessions (bounded) so a late HELLO of a dead session is refused.
    fn remember(&mut self, node: NodeId, id: (Epoch, SessionId)) {
        let cap = 4 * self.cfg.max_sessions as usize;
        if self.seen.len() >= cap && !self.seen.contains_key(&node) {
            // Forget a node we have no session with (any; order is irrelevant
            // to correctness, only to how long a stale HELLO is recognised).
            let victim = self
                .seen
                .keys()
                .copied()
                .find(|n| !self.by_node.contains_key(n));
            if let Some(v) = victim {
                self.seen.remove(&v);
            }
        }
        let e = self.seen.entry(node).or_insert(id);
        *e = (*e).max(id);
    }

    /// Queues a message for `peer` on `channel`. Opens a session if there is
    /// none (the shell dials it). Returns where the message sits.
    ///
    /// When the session's send buffer is full the message comes back in
    /// [`SendError::Full`]; nothing is dropped.
    pub fn send(
        &mut self,
        now: Time,
        peer: NodeId,
        channel: ChannelId,
        payload: Bytes,
    ) -> Result<MessageId, SendError> {
        self.send_with_prefix(now, peer, channel, Prefix::default(), payload)
    }

    /// Like [`Endpoint::send`], for a message made of a short `prefix` (a
    /// shell's own header) followed by `payload`, without copying either
    /// into a new buffer. The receiver gets them as one message. On
    /// [`SendError::Full`] only `payload` is handed back.
    pub fn send_with_prefix(
        &mut self,
        now: Time,
        peer: NodeId,
        channel: ChannelId,
        prefix: Prefix,
        payload: Bytes,
    ) -> Result<MessageId, SendError> {
        self.tick(now);
        let len = prefix.as_slice().len() + payload.len();
        if peer == self.local.node {
            return Err(SendError::SelfSend(peer));
        }
        if u32::from(channel.0) >= self.cfg.max_channels {
            return Err(SendError::ChannelOutOfRange {
                channel: channel.0,
                max: self.cfg.max_channels,
            });
        }
        if len > self.cfg.max_message_size as usize {
            return Err(SendError::TooLarge {
                len,
                max: self.cfg.max_message_size,
            });
        }
        let slot = self
            .session_slot(now, peer)
            .ok_or(SendError::TooManySessions(self.cfg.max_sessions))?;
        let cfg = &self.cfg;
        let Some(s) = self.sessions[slot].as_mut() else {
            return Err(SendError::TooManySessions(self.cfg.max_sessions));
        };
        // The peer's own limits, once its HELLO told us.
        if let Some(p) = s.peer {
            if u32::from(channel.0) >= p.max_channels {
                return Err(SendError::ChannelOutOfRange {
                    channel: channel.0,
                    max: p.max_channels,
                });
            }
            if len > p.max_message as usize {
                return Err(SendError::TooLarge {
                    len,
                    max: p.max_message,
                });
            }
        }
        if !s.has_room(len, cfg) {
            return Err(SendError::Full {
                message: payload,
                buffered: s.send.cache_bytes,
                limit: cfg.send_buffer,
            });
        }
        let seq = s.push(channel, prefix, payload);
        Ok(MessageId {
            session: s.id,
            channel,
            seq,
        })
    }

    /// Whether a message of `len` bytes to `peer` would fit in its session's
    /// send buffer now.
    pub fn can_send(&self, peer: NodeId, len: usize) -> bool {
        match self.by_node.get(&peer).and_then(|&slot| self.session(slot)) {
            Some(s) => s.has_room(len, &self.cfg),
            None => true,
        }
    }

    /// Appends frames for one path to `buf` (roughly `max_bytes`, at least one
    /// frame) and returns that path, or `None` when nothing is to be sent.
    /// Call until it returns `None` after every input.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut BytesMut,
        max_bytes: usize,
    ) -> Option<PathId> {
        self.tick(now);
        if let Some(c) = self.closing.pop_front() {
            if let Some(close) = &c.close {
                close.encode(buf);
            }
            let path = c.path;
            self.finish_close(c);
            return Some(path);
        }
        let n = self.sessions.len();
        for k in 0..n {
            let slot = (self.cursor + k) % n;
            if self.sessions[slot].is_none() {
                continue;
            }
            let r = self
                .with_session(slot, |s, ctx| s.poll_transmit(now, buf, max_bytes, ctx))
                .flatten();
            if let Some(path) = r {
                // Stay on this session until it has nothing more; then move on.
                self.cursor = slot;
                return Some(path);
            }
            // Writing a CLOSE may have been all it wanted.
            if let Some(c) = self.closing.pop_front() {
                if let Some(close) = &c.close {
                    close.encode(buf);
                }
                let path = c.path;
                self.finish_close(c);
                return Some(path);
            }
        }
        self.cursor = 0;
        None
    }

    /// The next time [`Endpoint::handle_timeout`] has work, if any.
    pub fn poll_timeout(&self) -> Option<Time> {
        let mut t = Time::MAX;
        for s in self.sessions.iter().flatten() {
            t = t.min(s.next_timeout(&self.cfg));
        }
        for slot in self.paths.values() {
            if let PathSlot::Unbound { since } = slot {
                t = t.min(*since + self.cfg.handshake_timeout);
            }
        }
        (t != Time::MAX).then_some(t)
    }

    /// Runs every timer that is due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.tick(now);
        for slot in 0..self.sessions.len() {
            self.with_session(slot, |s, ctx| s.handle_timeout(now, ctx));
        }
        let mut expired: Vec<PathId> = self
            .paths
            .iter()
            .filter_map(|(&id, slot)| match slot {
                PathSlot::Unbound { since } if now >= *since + self.cfg.handshake_timeout => {
                    Some(id)
                }
                _ => None,
            })
            .collect();
        // Map order is random; outputs must not be.
        expired.sort_unstable();
        for path in expired {
            self.refuse_path(now, path, HandshakeError::Timeout.into());
        }
        self.report_closed_paths();
    }

    /// The next event. Taking a [`Event::Message`] counts as delivery: only
    /// then is the message acknowledged to its sender, which frees it from the
    /// sender's cache.
    pub fn poll_event(&mut self) -> Option<Event> {
        loop {
            match self.events.pop_front()? {
                Queued::Event(e) => return Some(*e),
                Queued::Message {
                    slot,
                    session,
                    peer,
                    channel,
                    seq,
                    payload,
                } => {
                    self.consumed(slot, session, channel, seq, payload.len());
                    return Some(Event::Message {
                        peer,
                        session,
                        channel,
                        seq,
                        payload,
                    });
                }
                Queued::Skip {
                    slot,
                    session,
                    channel,
                    seq,
                } => self.consumed(slot, session, channel, seq, 0),
            }
        }
    }

    /// The payload of the next event, if that event is a message: lets a
    /// shell decide, before taking it, whether it has room for it (taking a
    /// message acknowledges it to the sender).
    pub fn peek_message(&self) -> Option<&Bytes> {
        self.events.iter().find_map(|q| match q {
            Queued::Skip { .. } => None,
            Queued::Message { payload, .. } => Some(Some(payload)),
            Queued::Event(_) => Some(None),
        })?
    }

    fn consumed(
        &mut self,
        slot: usize,
        session: SessionId,
        channel: ChannelId,
        seq: u64,
        len: usize,
    ) {
        let now = self.now;
        if let Some(s) = self.sessions.get_mut(slot).and_then(Option::as_mut) {
            if s.id == session {
                s.consumed(now, channel, seq, len);
            }
        }
    }

    /// The application finds message `id` to `peer` overdue (no reply
    /// within its re-send timeout). If the message is still in flight, the
    /// path carrying it is suspected at once, as if its retransmission
    /// timeout had fired: its in-flight messages move to the other paths
    /// and new ones avoid it until it answers a probe. Returns whether a
    /// path was suspected (false: delivered already, queued, or another
    /// session).
    pub fn handle_message_overdue(&mut self, now: Time, peer: NodeId, id: MessageId) -> bool {
        self.tick(now);
        let Some(&slot) = self.by_node.get(&peer) else {
            return false;
        };
        match self.sessions.get_mut(slot).and_then(Option::as_mut) {
            Some(s) if s.id == id.session => s.message_overdue(id.channel, id.seq),
            _ => false,
        }
    }

    /// Counters and gauges of the session with `peer`.
    pub fn session_stats(&self, peer: NodeId) -> Option<SessionStats> {
        let slot = *self.by_node.get(&peer)?;
        self.session(slot).map(Session::snapshot)
    }

    /// The current session with `peer` and the peer's incarnation (once known).
    pub fn session_with(&self, peer: NodeId) -> Option<(SessionId, Option<Epoch>)> {
        let slot = *self.by_node.get(&peer)?;
        self.session(slot).map(|s| (s.id, s.peer.map(|p| p.epoch)))
    }

    /// Peers with a session, in no particular order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.by_node.keys().copied()
    }

    /// Per session: the peer, bytes in the retransmit cache, bytes buffered
    /// on the receiving side. Cheap; for bound checks and gauges.
    pub fn session_buffers(&self) -> impl Iterator<Item = (NodeId, u64, u64)> + '_ {
        self.sessions
            .iter()
            .flatten()
            .map(|s| (s.node, s.send.cache_bytes, s.recv.buffered_bytes))
    }

    #[doc(hidden)]
    pub fn debug_session(&self, peer: NodeId) -> String {
        let Some(s) = self.by_node.get(&peer).and_then(|&slot| self.session(slot)) else {
            return "none".into();
        };
        let mut out = format!(
            "outstanding={} cache={} new_q={} retx_q={} peer={:?} recv_buffered={} dirty={:?}\n",
            s.send.outstanding_bytes,
            s.send.cache_bytes,
            s.send.new_queue.len(),
            s.send.retx_queue.len(),
            s.peer,
            s.recv.buffered_bytes,
            s.recv.dirty
        );
        for (i, ch) in s.send.channels.iter().enumerate() {
            let states: Vec<_> = ch
                .entries
                .iter()
                .take(8)
                .map(|e| (e.state, e.path, e.transmissions))
                .collect();
            out += &format!(
                " send ch{i}: base={} sent_end={} len={} first={:?}\n",
                ch.base,
                ch.sent_end,
                ch.entries.len(),
                states
            );
        }
        for (i, ch) in s.recv.channels.iter().enumerate() {
            out += &format!(
                " recv ch{i}: consumed={} next={} dirty={}\n",
                ch.consumed, ch.next, ch.dirty
            );
        }
        for p in &s.paths {
            out += &format!(
                " path {:?} {:?} suspect={} backoff={} inflight={} fifo={} ping={:?}\n",
                p.id,
                p.phase,
                p.suspect,
                p.backoff,
                p.inflight_bytes,
                p.inflight.len(),
                p.ping_outstanding
            );
        }
        out
    }

    /// Paths known to the endpoint (any state).
    pub fn path_count(&self) -> usize {
        self.paths.len()
    }
}
