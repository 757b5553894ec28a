//! A router and all its sessions in one value, for single-threaded drivers
//! (the simulator, tests, benchmarks, a helper's demultiplexer).
//!
//! This is the same glue a multi-threaded shell runs with a lock per
//! session: route a path's bytes to the session that holds it, hand HELLOs
//! to the router and apply its decision, tell the router when a session
//! ends. Nothing here has protocol meaning of its own.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use rustc_hash::FxHashMap as HashMap;

use crate::config::{ConfigError, EndpointConfig};
use crate::error::{AddPathError, PathError, SendError};
use crate::event::Event;
use crate::ids::{CallId, ChannelId, Epoch, MessageId, NodeId, PathId, SessionId};
use crate::router::{OpenError, Router, SessionTable};
use crate::rpc::{CallOptions, Priority, RemoteError};
use crate::session::{CompleteError, Input, LocalIdentity, Session, SessionStats};
use crate::time::Time;
use crate::wire::Hello;

/// A router and its sessions. See the crate docs for the calling convention.
#[derive(Debug)]
pub struct Endpoint {
    router: Router,
    sessions: Vec<Option<Session>>,
    free: Vec<usize>,
    by_id: HashMap<SessionId, usize>,
    /// Paths held by a session (including ones it is closing).
    paths: HashMap<PathId, usize>,
    /// Round-robin cursors over sessions.
    tx_cursor: usize,
    ev_cursor: usize,
    /// Events taken from sessions, waiting for `poll_event`.
    events: VecDeque<Event>,
    /// The network of each path the driver named one for.
    networks: HashMap<PathId, u8>,
    /// Round-robin cursor for `poll_role`.
    role_cursor: usize,
}

impl From<OpenError> for SendError {
    fn from(e: OpenError) -> SendError {
        match e {
            OpenError::SelfSession(n) => SendError::SelfSend(n),
            OpenError::TooManySessions(n) => SendError::TooManySessions(n),
        }
    }
}

impl Endpoint {
    /// Creates an endpoint. The epoch must be non-zero and larger than any
    /// earlier incarnation of this node used (a start timestamp works).
    pub fn new(cfg: EndpointConfig, local: LocalIdentity) -> Result<Self, ConfigError> {
        Ok(Endpoint {
            router: Router::new(cfg, local)?,
            sessions: Vec::new(),
            free: Vec::new(),
            by_id: HashMap::default(),
            paths: HashMap::default(),
            tx_cursor: 0,
            ev_cursor: 0,
            networks: HashMap::default(),
            role_cursor: 0,
            events: VecDeque::new(),
        })
    }

    /// This endpoint's identity.
    pub fn local(&self) -> &LocalIdentity {
        self.router.local()
    }

    /// The configuration in force.
    pub fn config(&self) -> &EndpointConfig {
        self.router.config()
    }

    fn install(&mut self, s: Session) -> usize {
        let id = s.id();
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
        self.by_id.insert(id, slot);
        slot
    }

    /// The slot of the current session with `node`, opening one if none.
    fn open(&mut self, now: Time, node: NodeId) -> Result<usize, OpenError> {
        let (id, new) = self.router.open(now, node)?;
        if let Some(s) = new {
            return Ok(self.install(s));
        }
        Ok(self.by_id[&id])
    }

    fn current(&self, node: NodeId) -> Option<usize> {
        self.router
            .current(node)
            .and_then(|id| self.by_id.get(&id).copied())
    }

    fn session(&self, slot: usize) -> Option<&Session> {
        self.sessions.get(slot).and_then(Option::as_ref)
    }

    fn session_mut(&mut self, slot: usize) -> Option<&mut Session> {
        self.sessions.get_mut(slot).and_then(Option::as_mut)
    }

    /// After any input to a session: tell the router if it ended, and take
    /// its events.
    fn after(&mut self, slot: usize) {
        let Some(s) = self.sessions.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if s.ended().is_some() {
            self.router.session_ended(s.peer(), s.id());
        }
        while let Some(e) = s.poll_event() {
            if let Event::PathClosed { path, .. } = &e {
                self.paths.remove(path);
                self.networks.remove(path);
            }
            self.events.push_back(e);
        }
    }

    /// Drops a session that ended and has nothing left to deliver.
    fn reap(&mut self, slot: usize) {
        let done = self
            .session(slot)
            .is_some_and(|s| s.is_drained() && !s.has_messages());
        if done {
            if let Some(s) = self.sessions[slot].take() {
                self.by_id.remove(&s.id());
                self.free.push(slot);
            }
        }
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
        if self.paths.contains_key(&path) || self.router.is_unbound(path) {
            return Err(AddPathError::Duplicate(path));
        }
        match peer {
            None => self.router.add_unbound_path(now, path, None),
            Some(node) => {
                let slot = self.open(now, node).map_err(|e| match e {
                    OpenError::SelfSession(n) => AddPathError::SelfDial(n),
                    OpenError::TooManySessions(n) => AddPathError::TooManySessions(n),
                })?;
                if let Some(s) = self.session_mut(slot) {
                    s.add_path(now, path);
                }
                self.paths.insert(path, slot);
                Ok(())
            }
        }
    }

    /// An accepted transport whose own handshake proved it comes from
    /// `node` (mutual TLS, a Noise handshake): as [`Endpoint::add_path`]
    /// with no peer, but a HELLO naming another node is refused.
    pub fn add_authenticated_path(
        &mut self,
        now: Time,
        path: PathId,
        node: NodeId,
    ) -> Result<(), AddPathError> {
        if self.paths.contains_key(&path) || self.router.is_unbound(path) {
            return Err(AddPathError::Duplicate(path));
        }
        self.router.add_unbound_path(now, path, Some(node))
    }

    /// The transport under `path` failed (connection reset, or the failure
    /// detector declared it dead). Its in-flight messages are re-sent on the
    /// session's other paths before anything new. Unknown paths are ignored.
    pub fn handle_path_down(&mut self, now: Time, path: PathId) {
        match self.paths.get(&path).copied() {
            Some(slot) => {
                if let Some(s) = self.session_mut(slot) {
                    s.handle_path_down(now, path);
                }
                self.after(slot);
                self.paths.remove(&path);
                self.reap(slot);
            }
            None => {
                self.router.unbound_path_down(path);
                self.take_router_events();
            }
        }
    }

    /// Closes a path from this side (a CLOSE frame is queued for it).
    pub fn close_path(&mut self, now: Time, path: PathId) {
        match self.paths.get(&path).copied() {
            Some(slot) => {
                if let Some(s) = self.session_mut(slot) {
                    s.close_path(now, path);
                }
                self.after(slot);
            }
            None => self.router.close_unbound(path),
        }
    }

    /// Ends the session with `peer` from this side: abandons its outstanding
    /// messages (reported in [`Event::SessionEnded`]) and closes its paths.
    pub fn close_session(&mut self, now: Time, peer: NodeId) {
        if let Some(slot) = self.current(peer) {
            if let Some(s) = self.session_mut(slot) {
                s.close(now);
            }
            self.after(slot);
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
        loop {
            let hello = match self.paths.get(&path).copied() {
                Some(slot) => {
                    let r = match self.session_mut(slot) {
                        Some(s) => s.handle_input(now, path, buf),
                        None => Err(PathError::UnknownPath(path)),
                    };
                    self.after(slot);
                    match r? {
                        Input::Done => return Ok(()),
                        Input::Hello(h) => (Some(slot), h),
                    }
                }
                None => {
                    let r = self.router.handle_unbound_input(now, path, buf);
                    self.take_router_events();
                    match r? {
                        None => return Ok(()),
                        Some(h) => (None, h),
                    }
                }
            };
            self.route_hello(now, path, hello.0, hello.1)?;
        }
    }

    /// Routes a HELLO that arrived on `path` (held by `bound`, if any):
    /// the router decides, the decision runs on this endpoint's sessions.
    fn route_hello(
        &mut self,
        now: Time,
        path: PathId,
        bound: Option<usize>,
        h: Hello,
    ) -> Result<(), PathError> {
        let bound = bound
            .and_then(|slot| self.session(slot))
            .map(|s| (s.id(), s.peer()));
        let decision = self.router.handle_hello(now, path, bound, h);
        self.take_router_events();
        let network = self.networks.get(&path).copied();
        decision.apply(now, network, &mut Slots(self)).map(|_| ())
    }

    fn take_router_events(&mut self) {
        while let Some(e) = self.router.poll_event() {
            self.events.push_back(e);
        }
    }

    /// Queues a one-way message for `peer` on `channel`. Opens a session if
    /// there is none (the shell dials it). Returns where the message sits.
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
        self.send_with(now, peer, channel, Priority::Normal, payload)
    }

    /// [`Endpoint::send`] with a priority.
    pub fn send_with(
        &mut self,
        now: Time,
        peer: NodeId,
        channel: ChannelId,
        priority: Priority,
        payload: Bytes,
    ) -> Result<MessageId, SendError> {
        let slot = self.open(now, peer)?;
        let r = match self.session_mut(slot) {
            Some(s) => s.send(now, channel, priority, payload),
            None => Err(SendError::SessionEnded(peer)),
        };
        self.after(slot);
        r
    }

    /// Makes a call to `peer` (see [`Session::call`]); its outcome comes as
    /// [`Event::CallDone`].
    pub fn call(
        &mut self,
        now: Time,
        peer: NodeId,
        channel: ChannelId,
        body: Bytes,
        opts: &CallOptions,
    ) -> Result<(SessionId, CallId), SendError> {
        let slot = self.open(now, peer)?;
        let r = match self.session_mut(slot) {
            Some(s) => s.call(now, channel, body, opts).map(|c| (s.id(), c)),
            None => Err(SendError::SessionEnded(peer)),
        };
        self.after(slot);
        r
    }

    /// Answers a request handed out as [`Event::Request`].
    pub fn complete(
        &mut self,
        now: Time,
        session: SessionId,
        call: CallId,
        result: Result<Bytes, RemoteError>,
    ) -> Result<(), CompleteError> {
        let Some(slot) = self.by_id.get(&session).copied() else {
            return Err(CompleteError::SessionEnded(call));
        };
        let r = match self.session_mut(slot) {
            Some(s) => s.complete(now, call, result),
            None => Err(CompleteError::SessionEnded(call)),
        };
        self.after(slot);
        r
    }

    /// Whether a message of `len` bytes to `peer` would fit in its session's
    /// send buffer now.
    pub fn can_send(&self, peer: NodeId, len: usize) -> bool {
        self.current(peer)
            .and_then(|slot| self.session(slot))
            .is_none_or(|s| s.has_room(len))
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
        if let Some(path) = self.router.poll_transmit(buf) {
            self.take_router_events();
            return Some(path);
        }
        let n = self.sessions.len();
        for k in 0..n {
            let slot = (self.tx_cursor + k) % n;
            let r = self
                .session_mut(slot)
                .and_then(|s| s.poll_transmit(now, buf, max_bytes));
            self.after(slot);
            if let Some(path) = r {
                // Stay on this session until it has nothing more; then move on.
                self.tx_cursor = slot;
                return Some(path);
            }
            self.reap(slot);
        }
        self.tx_cursor = 0;
        None
    }

    /// The next time [`Endpoint::handle_timeout`] has work, if any.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.sessions
            .iter()
            .flatten()
            .filter_map(Session::poll_timeout)
            .chain(self.router.poll_timeout())
            .min()
    }

    /// Runs every timer that is due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        for slot in 0..self.sessions.len() {
            if let Some(s) = self.session_mut(slot) {
                if s.poll_timeout().is_some_and(|t| t <= now) {
                    s.handle_timeout(now);
                }
            }
            self.after(slot);
        }
        self.router.handle_timeout(now);
    }

    /// The next event: path, peer and call events, then one-way messages
    /// ([`Event::Message`]) and admitted requests ([`Event::Request`]).
    /// Taking a message or a request counts as delivery: only then is it
    /// acknowledged to its sender, which frees it from the sender's cache.
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(e) = self.events.pop_front() {
            return Some(e);
        }
        let n = self.sessions.len();
        for k in 0..n {
            let slot = (self.ev_cursor + k) % n;
            let Some(s) = self.session_mut(slot) else {
                continue;
            };
            let e = s
                .poll_message()
                .map(Event::Message)
                .or_else(|| s.poll_request().map(Event::Request));
            self.after(slot);
            if let Some(e) = e {
                self.ev_cursor = slot;
                // Events the take caused (a promotion) come after it.
                self.events.push_front(e);
                return self.events.pop_front();
            }
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            self.reap(slot);
        }
        self.ev_cursor = 0;
        None
    }

    /// The failure detector failed `path` over (see
    /// [`Session::handle_path_suspect`]): its in-flight messages move to
    /// the session's other paths, the connection stays.
    pub fn handle_path_suspect(&mut self, now: Time, path: PathId) -> bool {
        let Some(slot) = self.paths.get(&path).copied() else {
            return false;
        };
        let r = self
            .session_mut(slot)
            .is_some_and(|s| s.handle_path_suspect(now, path));
        self.after(slot);
        r
    }

    /// The application finds message `id` to `peer` overdue (see
    /// [`Session::handle_message_overdue`]).
    pub fn handle_message_overdue(&mut self, now: Time, peer: NodeId, id: MessageId) -> bool {
        let Some(slot) = self.current(peer) else {
            return false;
        };
        let r = self
            .session_mut(slot)
            .is_some_and(|s| s.handle_message_overdue(now, id));
        self.after(slot);
        r
    }

    /// Counters and gauges of the session with `peer`.
    pub fn session_stats(&self, peer: NodeId) -> Option<SessionStats> {
        self.current(peer)
            .and_then(|slot| self.session(slot))
            .map(Session::stats)
    }

    /// The current session with `peer` and the peer's incarnation (once known).
    pub fn session_with(&self, peer: NodeId) -> Option<(SessionId, Option<Epoch>)> {
        self.current(peer)
            .and_then(|slot| self.session(slot))
            .map(|s| (s.id(), s.peer_epoch()))
    }

    /// Peers with a current session, in no particular order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.router.peers()
    }

    /// Per session: the peer, bytes in the retransmit cache, bytes buffered
    /// on the receiving side. Cheap; for bound checks and gauges.
    pub fn session_buffers(&self) -> impl Iterator<Item = (NodeId, u64, u64)> + '_ {
        self.sessions.iter().flatten().map(|s| {
            let (c, r) = s.buffers();
            (s.peer(), c, r)
        })
    }

    /// Bytes held for `peer` across all its sessions here, ended ones not
    /// yet dropped included (see [`Session::held_bytes`]).
    pub fn peer_held_bytes(&self, peer: NodeId) -> u64 {
        self.sessions
            .iter()
            .flatten()
            .filter(|s| s.peer() == peer)
            .map(Session::held_bytes)
            .sum()
    }

    #[doc(hidden)]
    pub fn debug_session(&self, peer: NodeId) -> String {
        self.current(peer)
            .and_then(|slot| self.session(slot))
            .map_or_else(|| "none".into(), Session::debug_dump)
    }

    /// Says which network `path` runs on (see
    /// [`Session::set_path_network`]); remembered for an accepted path until
    /// its HELLO binds it to a session.
    pub fn set_path_network(&mut self, path: PathId, network: u8) {
        self.networks.insert(path, network);
        if let Some(slot) = self.paths.get(&path).copied() {
            if let Some(s) = self.session_mut(slot) {
                s.set_path_network(path, network);
            }
        }
    }

    /// Steers new traffic to `peer` away from the networks set in `avoid`
    /// (see [`Session::set_avoided_networks`]). `false` without a session.
    pub fn set_avoided_networks(&mut self, peer: NodeId, avoid: u8) -> bool {
        match self.current(peer).and_then(|slot| self.session_mut(slot)) {
            Some(s) => {
                s.set_avoided_networks(avoid);
                true
            }
            None => false,
        }
    }

    /// Queues one encoded role message for `peer` (see
    /// [`Session::send_role`]); opens a session if there is none.
    pub fn send_role(
        &mut self,
        now: Time,
        peer: NodeId,
        message: Bytes,
    ) -> Result<(), crate::session::RoleSendError> {
        let slot = self
            .open(now, peer)
            .map_err(|_| crate::session::RoleSendError::Ended)?;
        let r = match self.session_mut(slot) {
            Some(s) => s.send_role(now, message),
            None => Err(crate::session::RoleSendError::Ended),
        };
        self.after(slot);
        r
    }

    /// The next role message any peer sent, with its (authenticated) sender.
    pub fn poll_role(&mut self) -> Option<(NodeId, Bytes)> {
        let n = self.sessions.len();
        for k in 0..n {
            let slot = (self.role_cursor + k) % n;
            let got = self
                .session_mut(slot)
                .and_then(|s| s.poll_role().map(|m| (s.peer(), m)));
            if got.is_some() {
                self.role_cursor = slot + 1;
                return got;
            }
        }
        None
    }

    /// Paths known to the endpoint (any state).
    pub fn path_count(&self) -> usize {
        self.paths.len() + self.router.path_count()
    }
}

/// The endpoint's sessions as a HELLO decision sees them.
struct Slots<'a>(&'a mut Endpoint);

impl SessionTable for Slots<'_> {
    fn with_session(&mut self, id: SessionId, f: &mut dyn FnMut(&mut Session)) -> bool {
        let Some(slot) = self.0.by_id.get(&id).copied() else {
            return false;
        };
        let Some(s) = self.0.session_mut(slot) else {
            return false;
        };
        f(s);
        self.0.after(slot);
        true
    }

    fn install(&mut self, session: Session) {
        self.0.install(session);
    }

    fn path_left(&mut self, id: SessionId, path: PathId) {
        if self.0.paths.get(&path) == self.0.by_id.get(&id) {
            self.0.paths.remove(&path);
        }
    }

    fn path_joined(&mut self, id: SessionId, path: PathId) {
        if let Some(slot) = self.0.by_id.get(&id).copied() {
            self.0.paths.insert(path, slot);
        }
    }
}
