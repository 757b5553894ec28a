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
mod failover;
mod input;
mod observe;
mod paths;
mod recv;
mod route;
mod rpc;
mod send;
mod timers;
mod transmit;

use std::collections::VecDeque;

use bytes::Bytes;

pub(crate) use deliver::Released;
pub use deliver::{Message, MessageBatch};
pub use observe::{PathSnapshot, SendLimits, SessionStats};
pub use paths::PathStats;
use paths::{PathState, Phase};
use recv::RecvSide;
pub use route::{RoleSendError, ROLE_QUEUE, ROLE_QUEUE_BYTES};
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
    /// [`Router::handle_hello`](crate::Router::handle_hello), apply the
    /// decision, then hand the rest of the buffer to the session that
    /// holds the path now.
    Hello(Hello),
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
    /// Bytes of `pending_replies` (prefixes and bodies).
    pending_reply_bytes: u64,
    /// Admission is stopped at `call_bytes_per_peer` (counted once per stop).
    call_bound_hit: bool,
    /// Chunks released by one frame (kept to reuse its allocation).
    released_scratch: Vec<(u64, recv::Chunk)>,
    /// The latest `now` seen (for inputs that take none).
    now: Time,
    /// Role messages to send, oldest first (see `route.rs`).
    role_out: route::RoleQueue,
    /// Role messages received, oldest first.
    role_in: route::RoleQueue,
    /// Networks the routing table steers new traffic away from (a bit each).
    avoid: u8,
    /// Networks new traffic prefers among healthy paths (a helper's).
    prefer: u8,
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
            pending_reply_bytes: 0,
            call_bound_hit: false,
            released_scratch: Vec::new(),
            now,
            role_out: route::RoleQueue::default(),
            role_in: route::RoleQueue::default(),
            avoid: 0,
            prefer: 0,
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

    /// A hint: `messages` messages of `bytes` bytes in all are about to be
    /// sent back to back (a shell draining sends it queued). A batch formed
    /// meanwhile is given room for them at once (up to the batch size)
    /// rather than growing by copies. `expect_sends(0, 0)` clears it.
    /// Changes nothing else: what is sent, and when, stays the same.
    pub fn expect_sends(&mut self, messages: usize, bytes: usize) {
        // Per message: the batch's message header and the one-way prefix.
        self.send.expected = bytes.saturating_add(messages.saturating_mul(8));
    }

    // ----- ending --------------------------------------------------------

    /// Ends the session from this side: abandons its outstanding messages
    /// (reported in [`Event::SessionEnded`]) and closes its paths.
    pub fn close(&mut self, now: Time) {
        self.end(now, SessionEndReason::ClosedLocally, CloseCode::NORMAL);
    }

    /// Ends the session because the router replaced it (the peer restarted
    /// or reset its side). Its paths are closed as superseded, and what it
    /// held for the peer is freed at once, released one-way messages not
    /// yet taken included: they were never acknowledged, the incarnation
    /// that sent them is gone, and its successor's session holds the
    /// peer's budget now (else a peer restarting every few seconds would
    /// add a receive window each time).
    pub fn supersede(&mut self, now: Time, reason: SessionEndReason) {
        self.end(now, reason, CloseCode::SUPERSEDED);
        self.oneway.clear();
        self.recv = RecvSide::default();
    }

    /// Ends the session: abandons every unacknowledged message, fails every
    /// call, forgets admitted requests, replies waiting for room and
    /// out-of-order arrivals, and queues a session CLOSE on every path.
    /// Released one-way messages stay available to `poll_message` (unless
    /// the session was superseded).
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
        self.pending_reply_bytes = 0;
        // Out-of-order chunks can never be released now; what was released
        // stays for `poll_message` (bounded by the window).
        self.recv.drop_reorder();
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
}
