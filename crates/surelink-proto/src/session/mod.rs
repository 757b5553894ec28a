//! One session with one incarnation of a peer, carried by any number of
//! paths: the whole per-peer protocol as one state machine.
//!
//! The session numbers messages per stream, keeps each in the retransmit
//! cache until the peer's application has it, spreads new frames over the
//! least-loaded working path, and, when a path fails or stalls, re-sends
//! that path's in-flight frames on the others before anything new (SQR).
//! The receiving half releases messages exactly once and in order per
//! stream. On top sits the message layer: one-way messages, calls (ids,
//! deadlines, re-sends with the same id), and the server side (at most
//! once per call, duplicates answered, admission bounded per peer).
//!
//! A session owns everything about its peer, so a shell can give each
//! session its own lock (quinn's `Connection`): nothing here touches
//! another session. What it does not decide is which session a new path
//! belongs to, or whether a peer restarted: the [`Router`](crate::Router)
//! does, from the HELLO that [`Session::handle_input`] hands back.
//!
//! # Calling convention
//!
//! Inputs take `now`: [`Session::add_path`], [`Session::handle_input`],
//! [`Session::handle_hello`], [`Session::handle_path_down`],
//! [`Session::handle_timeout`], [`Session::send`], [`Session::call`],
//! [`Session::complete`]. Outputs are polled: [`Session::poll_transmit`]
//! (bytes for one path), [`Session::poll_event`] (path, peer and call
//! events), [`Session::poll_message`] (one-way messages),
//! [`Session::poll_request`] (admitted requests), [`Session::poll_timeout`].
//! Taking a message or a request acknowledges it to the sender; a driver
//! that has no room for more simply stops polling that class, which holds
//! the sender back without blocking the other classes.

mod deliver;
mod input;
mod paths;
mod recv;
mod rpc;
mod send;
mod timers;
mod transmit;

use std::collections::VecDeque;

use bytes::Bytes;

pub(crate) use deliver::Released;
pub use deliver::{Message, MessageBatch};
pub use paths::PathStats;
use paths::{PathState, Phase};
use recv::RecvSide;
pub use rpc::CompleteError;
pub(crate) use send::Prefix;
use send::{BatchLimits, SendSide};

use crate::config::{message_cost, EndpointConfig};
use crate::error::{PathError, SendError};
use crate::event::{Event, PathCloseReason, RejectReason, SessionEndReason};
use crate::ids::{ChannelId, ClusterId, Epoch, MessageId, NodeId, PathId, SessionId, StreamId};
use crate::rpc::calls::CallTable;
use crate::rpc::serve::{ServeLimits, ServeState};
use crate::time::Time;
use crate::wire::{Close, CloseCode, CloseScope, Hello};

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

impl PeerInfo {
    pub(crate) fn from_hello(h: &Hello) -> PeerInfo {
        PeerInfo {
            epoch: h.epoch,
            session: h.session,
            recv_window: u64::from(h.recv_window),
            max_message: h.max_message,
            max_channels: h.max_channels,
        }
    }
}

/// A path leaving a session; its CLOSE frame (if any) is written by
/// `poll_transmit`, and then it is reported.
#[derive(Debug)]
pub(crate) struct ClosingPath {
    pub(crate) path: PathId,
    pub(crate) close: Option<Close>,
    pub(crate) reason: PathCloseReason,
    pub(crate) resent: usize,
}

/// What [`Session::handle_input`] stopped at.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Input {
    /// Every whole frame was handled; a partial one stays in the buffer.
    Done,
    /// A HELLO (taken off the buffer): route it with
    /// [`Router::handle_hello`](crate::Router::handle_hello), then hand
    /// the rest of the buffer in again.
    Hello(Hello),
}

/// Counters and gauges of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionStats {
    /// Messages accepted by `send` and `call` (and replies sent).
    pub messages_sent: u64,
    /// Messages released in order.
    pub messages_delivered: u64,
    /// DATA and BATCH frames written for the first time.
    pub frames_sent: u64,
    /// BATCH frames among them.
    pub batches_sent: u64,
    /// Frames re-sent (after a path failure, timeout, or resume).
    pub resent: u64,
    /// Frames received that we already had.
    pub duplicates_received: u64,
    /// Frames that arrived ahead of a gap and waited in the reorder buffer.
    pub frames_reordered: u64,
    /// Frames dropped because they would exceed the receive window.
    pub over_window: u64,
    /// Frames ignored because they arrived on a path before its handshake.
    pub early_frames: u64,
    /// Paths lost while they had messages in flight (failovers).
    pub failovers: u64,
    /// Retransmission timeouts across paths.
    pub timeouts: u64,
    /// Window probes: re-sends that ask a silent peer for its acknowledgement.
    pub probes: u64,
    /// Calls made.
    pub calls: u64,
    /// Call requests re-sent (same id).
    pub calls_resent: u64,
    /// Calls outstanding now.
    pub calls_outstanding: u64,
    /// Requests admitted (each at most once).
    pub requests_admitted: u64,
    /// Duplicate requests answered without running them.
    pub duplicate_requests: u64,
    /// Requests admitted and not completed now.
    pub requests_outstanding: u64,
    /// Bytes held in the retransmit cache now.
    pub cache_bytes: u64,
    /// Messages held in the retransmit cache now.
    pub cache_messages: u64,
    /// Bytes held on the receiving side now (reorder + undelivered).
    pub recv_buffered_bytes: u64,
    /// Out-of-order frames held now.
    pub reorder_frames: u64,
    /// Per path: id, phase, srtt, in-flight bytes, counters.
    pub paths: Vec<PathSnapshot>,
}

/// A path's state at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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

/// A reply that found the send buffer full; it goes out as soon as
/// acknowledgements free room, before any new message.
#[derive(Debug)]
struct PendingReply {
    call: crate::ids::CallId,
    stream: StreamId,
    prefix: Prefix,
    body: Bytes,
}

/// One session. See the module docs.
#[derive(Debug)]
pub struct Session {
    cfg: EndpointConfig,
    local: LocalIdentity,
    pub(crate) id: SessionId,
    pub(crate) node: NodeId,
    pub(crate) peer: Option<PeerInfo>,
    pub(crate) send: SendSide,
    pub(crate) recv: RecvSide,
    pub(crate) paths: Vec<PathState>,
    closing: VecDeque<ClosingPath>,
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
    /// When some stream's cumulative acknowledgement last moved (or the
    /// last window probe went out).
    last_progress: Time,
    /// Consecutive window probes without progress (backs the probe off).
    probe_backoff: u32,
    /// ACK and RESUME frames processed (stamps each; see `apply_ack`).
    ack_frames: u64,
    /// Why it ended, once it has.
    ended: Option<SessionEndReason>,
    events: VecDeque<Event>,
    /// Released one-way messages, waiting for `poll_message`.
    oneway: VecDeque<Released>,
    /// Released requests, waiting for `poll_request`.
    requests: VecDeque<Released>,
    calls: CallTable,
    serve: ServeState,
    pending_replies: VecDeque<PendingReply>,
    /// Chunks released by one frame (kept to reuse its allocation).
    released_scratch: Vec<(u64, recv::Chunk)>,
    /// The latest `now` seen (for inputs that take none).
    now: Time,
}

impl Session {
    /// A session with `node`, not yet bound to a peer incarnation. Made by
    /// the [`Router`](crate::Router), which numbers sessions.
    pub(crate) fn new(
        cfg: EndpointConfig,
        local: LocalIdentity,
        id: SessionId,
        node: NodeId,
        now: Time,
    ) -> Self {
        let serve = ServeState::new(ServeLimits {
            reply_cache_entries: cfg.reply_cache_entries,
            reply_cache_bytes: cfg.reply_cache_bytes,
            remember: cfg.remember_calls,
        });
        Session {
            cfg,
            local,
            id,
            node,
            peer: None,
            send: SendSide::default(),
            recv: RecvSide::default(),
            paths: Vec::new(),
            closing: VecDeque::new(),
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
            ended: None,
            events: VecDeque::new(),
            oneway: VecDeque::new(),
            requests: VecDeque::new(),
            calls: CallTable::default(),
            serve,
            pending_replies: VecDeque::new(),
            released_scratch: Vec::new(),
            now,
        }
    }

    fn tick(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    /// Our id for this session.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The peer node.
    pub fn peer(&self) -> NodeId {
        self.node
    }

    /// The peer's incarnation, once its HELLO told us.
    pub fn peer_epoch(&self) -> Option<Epoch> {
        self.peer.map(|p| p.epoch)
    }

    /// Why the session ended, if it has. An ended session sends nothing new
    /// and takes no input; what it had released can still be polled.
    pub fn ended(&self) -> Option<&SessionEndReason> {
        self.ended.as_ref()
    }

    /// Whether some path carries traffic.
    pub fn is_reachable(&self) -> bool {
        self.reachable
    }

    /// The paths the session holds (any phase).
    pub fn paths(&self) -> impl Iterator<Item = PathId> + '_ {
        self.paths.iter().map(|p| p.id)
    }

    /// Active paths.
    pub fn active_paths(&self) -> usize {
        self.paths
            .iter()
            .filter(|p| p.phase == Phase::Active)
            .count()
    }

    pub(crate) fn path_index(&self, path: PathId) -> Option<usize> {
        self.paths.iter().position(|p| p.id == path)
    }

    /// Whether the session holds `path` (or is still closing it).
    pub fn has_path(&self, path: PathId) -> bool {
        self.path_index(path).is_some() || self.closing.iter().any(|c| c.path == path)
    }

    /// A new transport joins (dialled, or accepted and bound by a HELLO);
    /// HELLO goes out first.
    pub fn add_path(&mut self, now: Time, path: PathId) {
        self.tick(now);
        if self.ended.is_some() || self.path_index(path).is_some() {
            return;
        }
        self.paths.push(PathState::new(path, now, &self.cfg));
    }

    /// Hands a HELLO the [`Router`](crate::Router) routed to this session:
    /// binds the session to the peer's incarnation (first HELLO) and
    /// answers on `path` (added if new).
    pub fn handle_hello(&mut self, now: Time, path: PathId, h: &Hello) -> Result<(), PathError> {
        self.tick(now);
        if self.ended.is_some() {
            return Err(crate::error::HandshakeError::SessionUnknown(h.node).into());
        }
        let pi = match self.path_index(path) {
            Some(pi) => {
                // A second HELLO on a path must name the same peer session:
                // a path never changes sessions.
                let p = &self.paths[pi];
                if p.peer_hello_seen
                    && self
                        .peer
                        .is_some_and(|x| (x.epoch, x.session) != (h.epoch, h.session))
                {
                    let e: PathError = crate::error::ProtocolViolation::HelloChanged.into();
                    self.refuse_path(now, path, e.clone());
                    return Err(e);
                }
                pi
            }
            None => {
                self.paths.push(PathState::new(path, now, &self.cfg));
                self.paths.len() - 1
            }
        };
        if self.peer.is_none() {
            self.bind(PeerInfo::from_hello(h));
        }
        self.on_peer_hello(now, pi);
        Ok(())
    }

    /// The peer's identity and limits are known (first HELLO). Messages
    /// queued for channels the peer does not accept are dropped and
    /// reported; they were never sent, so no sequence number of an accepted
    /// stream moves.
    fn bind(&mut self, peer: PeerInfo) {
        self.peer = Some(peer);
        for idx in 0..self.send.streams.len() {
            let stream = StreamId(u16::try_from(idx).unwrap_or(u16::MAX));
            if stream.fits(peer.max_channels) {
                continue;
            }
            let st = &mut self.send.streams[idx];
            let base = st.base;
            for e in st.entries.drain(..) {
                self.send.cache_bytes -= e.cost();
                self.send.cache_len -= u64::from(e.count);
                self.send.cache_entries -= 1;
                for seq in e.seq..e.end() {
                    self.events.push_back(Event::MessageRejected {
                        peer: self.node,
                        session: self.id,
                        stream,
                        seq,
                        reason: RejectReason::ChannelOutOfRange {
                            max: peer.max_channels,
                        },
                    });
                }
            }
            st.base = st.sent_end.max(base);
        }
    }

    /// The peer's HELLO arrived on path index `pi`.
    fn on_peer_hello(&mut self, now: Time, pi: usize) {
        let retry = self.cfg.handshake_retry;
        let p = &mut self.paths[pi];
        if !p.peer_hello_seen {
            p.peer_hello_seen = true;
            p.resume_due = true;
        } else if p.phase == Phase::Active && p.last_resume.is_none_or(|t| now >= t + retry) {
            // A repeated HELLO on a path that works for us: the peer retries
            // because our RESUME was lost (it has our HELLO, or it would not
            // have sent its RESUME). Answering with a HELLO too could make
            // two endpoints echo each other forever; answering every HELLO
            // with a RESUME (much larger) would amplify a flood of them.
            p.resume_due = true;
        }
        // Still handshaking: our own retry timer re-sends HELLO and RESUME.
    }

    // ----- sending -----------------------------------------------------

    /// How messages of `len` bytes are batched now (not before the peer's
    /// limits are known).
    fn batch_limits(&self, len: usize) -> Option<BatchLimits> {
        let peer = self.peer?;
        if len > self.cfg.batch_message_max as usize || len > peer.max_message as usize {
            return None;
        }
        Some(BatchLimits {
            message: (self.cfg.batch_message_max as usize).min(peer.max_message as usize),
            bytes: self.cfg.batch_bytes as usize,
        })
    }

    /// Queues one message on `stream` after the checks every message
    /// passes. `replies_first`: refuse while replies wait for room.
    pub(crate) fn push_message(
        &mut self,
        stream: StreamId,
        prefix: Prefix,
        payload: Bytes,
        replies_first: bool,
    ) -> Result<MessageId, SendError> {
        if self.ended.is_some() {
            return Err(SendError::SessionEnded(self.node));
        }
        let len = prefix.as_slice().len() + payload.len();
        if !stream.fits(self.cfg.max_channels) {
            return Err(SendError::ChannelOutOfRange {
                channel: stream.channel().map_or(0, |c| c.0),
                max: self.cfg.max_channels,
            });
        }
        if len > self.cfg.max_message_size as usize {
            return Err(SendError::TooLarge {
                len,
                max: self.cfg.max_message_size,
            });
        }
        // The peer's own limits, once its HELLO told us.
        if let Some(p) = self.peer {
            if !stream.fits(p.max_channels) {
                return Err(SendError::ChannelOutOfRange {
                    channel: stream.channel().map_or(0, |c| c.0),
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
        if !self.has_room(len) || (replies_first && !self.pending_replies.is_empty()) {
            return Err(SendError::Full {
                message: payload,
                buffered: self.send.cache_bytes,
                limit: self.cfg.send_buffer,
            });
        }
        let batch = self.batch_limits(len);
        let seq = self.send.push(stream, prefix, payload, batch);
        self.stats.messages_sent += 1;
        Ok(MessageId {
            session: self.id,
            stream,
            seq,
        })
    }

    /// Queues a one-way message on `channel`. A high-priority one travels
    /// on its own stream and is handed out before normal ones by the
    /// receiving driver; order is kept per channel *and* priority.
    ///
    /// When the send buffer is full the message comes back in
    /// [`SendError::Full`]; nothing is dropped.
    pub fn send(
        &mut self,
        now: Time,
        channel: ChannelId,
        priority: crate::rpc::Priority,
        payload: Bytes,
    ) -> Result<MessageId, SendError> {
        self.tick(now);
        let (stream, prefix) = match priority {
            crate::rpc::Priority::Normal => (
                StreamId::oneway(channel).ok_or(SendError::ChannelOutOfRange {
                    channel: channel.0,
                    max: self.cfg.max_channels,
                })?,
                Prefix::default(),
            ),
            crate::rpc::Priority::High => {
                if u32::from(channel.0) >= self.cfg.max_channels {
                    return Err(SendError::ChannelOutOfRange {
                        channel: channel.0,
                        max: self.cfg.max_channels,
                    });
                }
                (
                    StreamId::ONEWAY_HIGH,
                    crate::rpc::header::oneway_high_prefix(channel),
                )
            }
        };
        self.push_message(stream, prefix, payload, true)
    }

    /// Whether a message of `len` bytes would fit in the send buffer now.
    pub fn has_room(&self, len: usize) -> bool {
        self.send.cache_bytes + message_cost(len) <= self.cfg.send_buffer
    }

    // ----- paths ---------------------------------------------------------

    /// Moves every frame in flight on path `i` to the retransmit queue.
    /// Returns how many moved.
    fn evacuate(&mut self, i: usize) -> usize {
        let p = &mut self.paths[i];
        let mut moved = 0;
        for (st, seq, t) in p.inflight.drain(..) {
            if let Some(e) = self.send.entry_mut(st, seq) {
                if e.state == send::EntryState::InFlight && e.path == p.id && e.sent_at == t {
                    e.state = send::EntryState::Pending;
                    self.send.retx_queue.push_back((st, seq));
                    moved += 1;
                }
            }
        }
        p.inflight_bytes = 0;
        moved
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

    fn finish_close(&mut self, c: ClosingPath) {
        self.events.push_back(Event::PathClosed {
            peer: Some(self.node),
            path: c.path,
            reason: c.reason,
            resent: c.resent,
        });
    }

    fn update_reachability(&mut self, now: Time) {
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

    // ----- ending --------------------------------------------------------

    /// Ends the session from this side: abandons its outstanding messages
    /// (reported in [`Event::SessionEnded`]) and closes its paths.
    pub fn close(&mut self, now: Time) {
        self.end(now, SessionEndReason::ClosedLocally, CloseCode::NORMAL);
    }

    /// Ends the session because the router replaced it (the peer restarted
    /// or reset its side). Its paths are closed as superseded.
    pub fn supersede(&mut self, now: Time, reason: SessionEndReason) {
        self.end(now, reason, CloseCode::SUPERSEDED);
    }

    /// Ends the session: abandons every unacknowledged message, fails every
    /// call, forgets admitted requests, and queues a session CLOSE on every
    /// path. Released one-way messages stay available to `poll_message`.
    pub(crate) fn end(&mut self, now: Time, reason: SessionEndReason, close_code: CloseCode) {
        self.tick(now);
        if self.ended.is_some() {
            return;
        }
        let abandoned = self.send.abandon_all();
        for p in std::mem::take(&mut self.paths) {
            self.closing.push_back(ClosingPath {
                path: p.id,
                close: Some(Close {
                    scope: CloseScope::Session,
                    code: close_code,
                    reason: String::new(),
                }),
                reason: PathCloseReason::SessionEnded,
                resent: 0,
            });
        }
        for (call, sends) in self.calls.drain() {
            self.events.push_back(Event::CallDone {
                peer: self.node,
                session: self.id,
                call,
                sends,
                result: Err(crate::rpc::CallFailure::SessionEnded(reason.clone())),
            });
        }
        self.serve.clear();
        self.requests.clear();
        self.pending_replies.clear();
        self.events.push_back(Event::SessionEnded {
            peer: self.node,
            session: self.id,
            reason: reason.clone(),
            abandoned,
        });
        self.ended = Some(reason);
        self.reachable = false;
    }

    /// Whether the session ended and has nothing left to write or report:
    /// its driver may drop it (after draining `poll_message` if it wants
    /// the last one-way messages).
    pub fn is_drained(&self) -> bool {
        self.ended.is_some() && self.closing.is_empty() && self.events.is_empty()
    }

    // ----- observing -----------------------------------------------------

    /// The next path, peer or call event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// A snapshot of counters and gauges.
    pub fn stats(&self) -> SessionStats {
        let mut s = self.stats.clone();
        s.cache_bytes = self.send.cache_bytes;
        s.cache_messages = self.send.cache_len;
        s.recv_buffered_bytes = self.recv.buffered_bytes;
        s.reorder_frames = self.recv.reorder_len() as u64;
        s.calls_outstanding = self.calls.len() as u64;
        s.requests_admitted = self.serve.executed;
        s.duplicate_requests = self.serve.duplicates;
        s.requests_outstanding = self.serve.admitted as u64;
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

    /// Bytes in the retransmit cache and on the receiving side (cheap; for
    /// bound checks and gauges).
    pub fn buffers(&self) -> (u64, u64) {
        (self.send.cache_bytes, self.recv.buffered_bytes)
    }

    /// A one-screen dump of the session's state, for debugging.
    #[doc(hidden)]
    pub fn debug_dump(&self) -> String {
        let s = self;
        let mut out = format!(
            "outstanding={} cache={} new_q={} retx_q={} peer={:?} recv_buffered={} dirty={:?} ended={:?}\n",
            s.send.outstanding_bytes,
            s.send.cache_bytes,
            s.send.new_queue.len(),
            s.send.retx_queue.len(),
            s.peer,
            s.recv.buffered_bytes,
            s.recv.dirty,
            s.ended,
        );
        for (i, st) in s.send.streams.iter().enumerate() {
            if st.entries.is_empty() && st.base == 0 {
                continue;
            }
            let states: Vec<_> = st
                .entries
                .iter()
                .take(8)
                .map(|e| (e.seq, e.count, e.state, e.path, e.transmissions))
                .collect();
            out += &format!(
                " send {:?}: base={} sent_end={} entries={} first={:?}\n",
                StreamId(u16::try_from(i).unwrap_or(u16::MAX)),
                st.base,
                st.sent_end,
                st.entries.len(),
                states
            );
        }
        for (i, st) in s.recv.streams.iter().enumerate() {
            if !st.has_state() {
                continue;
            }
            out += &format!(
                " recv {:?}: consumed={} next={} dirty={}\n",
                StreamId(u16::try_from(i).unwrap_or(u16::MAX)),
                st.consumed,
                st.next,
                st.dirty
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
}
