//! The router: which session a path belongs to, and when a peer's new
//! incarnation replaces a session (quinn's `Endpoint`; sessions are its
//! `Connection`s).
//!
//! The router holds only what spans sessions: this process's identity, the
//! current session per peer node (with the peer incarnation it is bound
//! to), the newest peer session ever bound per node (so a delayed HELLO of
//! a dead session is refused), and accepted transports that have not said
//! who they are. It never touches a session's state, so a shell can keep it
//! behind its own lock and take it only for HELLOs, new sessions and ended
//! ones — never on the data path.
//!
//! A HELLO reaches the router from an unbound path
//! ([`Router::handle_unbound_input`]) or from a session that met it on one
//! of its paths ([`Session::handle_input`] returns [`Input::Hello`]). The
//! router decides ([`Router::handle_hello`]) and returns a complete
//! [`HelloDecision`], which every driver applies with
//! [`HelloDecision::apply`].

use std::collections::VecDeque;

use bytes::BytesMut;
use rustc_hash::FxHashMap as HashMap;

use crate::config::{ConfigError, EndpointConfig};
use crate::error::{AddPathError, HandshakeError, PathError};
use crate::event::{Event, PathCloseReason, SessionEndReason};
use crate::handshake::{self, decide, Decision};
use crate::ids::{Epoch, NodeId, PathId, SessionId};
use crate::session::{ClosingPath, LocalIdentity, Session};
use crate::time::Time;
use crate::wire::{decode, Close, CloseScope, Frame, Hello};

mod hello;

pub use hello::{HelloDecision, HelloStep, SessionTable};

/// Where a HELLO goes, before it is turned into steps.
enum Route {
    /// To the current session with the peer.
    Existing(SessionId),
    /// To a session the router just opened, replacing the one named.
    New {
        session: Box<Session>,
        replaces: Option<(SessionId, SessionEndReason)>,
    },
}

/// An accepted path that has not said who it is.
#[derive(Clone, Copy, Debug)]
struct Unbound {
    since: Time,
    /// The node whose key the transport's handshake proved, if it had one:
    /// the HELLO must name it.
    authenticated: Option<NodeId>,
}

#[derive(Clone, Copy, Debug)]
struct Current {
    id: SessionId,
    peer: Option<(Epoch, SessionId)>,
}

/// Why a session could not be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The peer is this node.
    #[error("cannot open a session with this endpoint's own node id {0}")]
    SelfSession(NodeId),
    /// A new session would exceed `max_sessions`.
    #[error("too many sessions (max_sessions = {0})")]
    TooManySessions(u32),
}

/// The router. See the module docs.
#[derive(Debug)]
pub struct Router {
    cfg: EndpointConfig,
    local: LocalIdentity,
    max_body: u32,
    table: HashMap<NodeId, Current>,
    /// Per node, the newest (epoch, session) a session of ours was bound to.
    seen: HashMap<NodeId, (Epoch, SessionId)>,
    next_session_id: u64,
    /// Accepted paths that have not said who they are.
    unbound: HashMap<PathId, Unbound>,
    closing: VecDeque<ClosingPath>,
    events: VecDeque<Event>,
}

impl Router {
    /// A router for `local`. The epoch must be non-zero and larger than any
    /// earlier incarnation of this node used (a start timestamp works).
    pub fn new(cfg: EndpointConfig, local: LocalIdentity) -> Result<Router, ConfigError> {
        cfg.validate()?;
        if local.epoch == Epoch(0) {
            return Err(ConfigError::Zero { field: "epoch" });
        }
        Ok(Router {
            max_body: cfg.max_frame_body(),
            cfg,
            local,
            table: HashMap::default(),
            seen: HashMap::default(),
            next_session_id: 1,
            unbound: HashMap::default(),
            closing: VecDeque::new(),
            events: VecDeque::new(),
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

    fn mint(&mut self, now: Time, node: NodeId) -> Result<Session, OpenError> {
        if self.table.len() >= self.cfg.max_sessions as usize {
            return Err(OpenError::TooManySessions(self.cfg.max_sessions));
        }
        let id = SessionId(self.next_session_id);
        self.next_session_id += 1;
        self.table.insert(node, Current { id, peer: None });
        Ok(Session::new(self.cfg.clone(), self.local, id, node, now))
    }

    /// The current session with `node`, if any.
    pub fn current(&self, node: NodeId) -> Option<SessionId> {
        self.table.get(&node).map(|r| r.id)
    }

    /// Nodes with a current session, in no particular order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.table.keys().copied()
    }

    /// The current session with `node`, opening one if there is none (the
    /// new session is returned for the driver to install; it is not bound
    /// to a peer incarnation until the peer's HELLO).
    pub fn open(
        &mut self,
        now: Time,
        node: NodeId,
    ) -> Result<(SessionId, Option<Session>), OpenError> {
        if node == self.local.node {
            return Err(OpenError::SelfSession(node));
        }
        if let Some(r) = self.table.get(&node) {
            return Ok((r.id, None));
        }
        let s = self.mint(now, node)?;
        Ok((s.id(), Some(s)))
    }

    /// A session ended (whoever ended it): the node has no current session
    /// until one is opened again. Ignored if `id` is no longer current.
    pub fn session_ended(&mut self, node: NodeId, id: SessionId) {
        if self.table.get(&node).is_some_and(|r| r.id == id) {
            self.table.remove(&node);
        }
    }

    /// An accepted transport: its peer's HELLO will say who it is.
    /// `authenticated`: the node whose key the transport's own handshake
    /// proved, if it had one; a HELLO naming another node is refused.
    pub fn add_unbound_path(
        &mut self,
        now: Time,
        path: PathId,
        authenticated: Option<NodeId>,
    ) -> Result<(), AddPathError> {
        if self.unbound.contains_key(&path) {
            return Err(AddPathError::Duplicate(path));
        }
        self.unbound.insert(
            path,
            Unbound {
                since: now,
                authenticated,
            },
        );
        Ok(())
    }

    /// Whether `path` is accepted and waiting for its HELLO.
    pub fn is_unbound(&self, path: PathId) -> bool {
        self.unbound.contains_key(&path)
    }

    /// Bytes arrived on an unbound path. Returns its HELLO once whole (the
    /// caller routes it with [`Router::handle_hello`] and hands the rest of
    /// the buffer to the session it joins), `None` while incomplete. A
    /// CLOSE closes the path; anything else before HELLO is ignored (only a
    /// lossy transport does that). On error the path is being closed.
    pub fn handle_unbound_input(
        &mut self,
        _now: Time,
        path: PathId,
        buf: &mut BytesMut,
    ) -> Result<Option<Hello>, PathError> {
        loop {
            if !self.unbound.contains_key(&path) {
                buf.clear();
                return if self.closing.iter().any(|c| c.path == path) {
                    Ok(None)
                } else {
                    Err(PathError::UnknownPath(path))
                };
            }
            match decode(buf, self.max_body) {
                Ok(Some(Frame::Hello(h))) => return Ok(Some(h)),
                Ok(Some(Frame::Close(c))) => {
                    self.unbound.remove(&path);
                    self.finish_close(ClosingPath {
                        path,
                        close: None,
                        reason: PathCloseReason::ClosedByPeer {
                            code: c.code,
                            reason: c.reason,
                        },
                        resent: 0,
                    });
                    buf.clear();
                    return Ok(None);
                }
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(None),
                Err(e) => {
                    let e = PathError::from(e);
                    self.unbound.remove(&path);
                    self.refuse_unbound(path, e.clone());
                    buf.clear();
                    return Err(e);
                }
            }
        }
    }

    /// Decides what a HELLO that arrived on `path` means, as the steps
    /// the sessions involved take (apply them with
    /// [`HelloDecision::apply`]). `bound`: the session holding `path` and
    /// its node (a dialled path, or one a HELLO bound before), `None` for
    /// an unbound path. A refused unbound path is closed here; a refused
    /// bound one is closed by its session in the decision's
    /// [`HelloStep::Refuse`].
    pub fn handle_hello(
        &mut self,
        now: Time,
        path: PathId,
        bound: Option<(SessionId, NodeId)>,
        hello: Hello,
    ) -> HelloDecision {
        let unbound = self.unbound.remove(&path);
        // The node the HELLO must name: the one the session holding the
        // path talks to, else the one the transport's handshake proved.
        let expected = bound
            .map(|(_, node)| node)
            .or_else(|| unbound.and_then(|u| u.authenticated));
        let mut steps = Vec::with_capacity(3);
        let mut refused = None;
        match self.route(now, expected, &hello) {
            Err(e) => {
                match bound {
                    Some((session, _)) => steps.push(HelloStep::Refuse {
                        session,
                        error: e.clone(),
                    }),
                    None if unbound.is_some() => self.refuse_unbound(path, e.clone()),
                    None => {}
                }
                refused = Some(e);
            }
            Ok(Route::Existing(id)) => {
                if let Some((b, _)) = bound.filter(|(b, _)| *b != id) {
                    steps.push(HelloStep::Detach { session: b });
                }
                steps.push(HelloStep::Hello { session: id });
            }
            Ok(Route::New { session, replaces }) => {
                let id = session.id();
                let old = replaces.as_ref().map(|(old, _)| *old);
                if let Some((old, reason)) = replaces {
                    steps.push(HelloStep::Supersede {
                        session: old,
                        reason,
                    });
                }
                steps.push(HelloStep::Install(session));
                // The superseded session gave the path up already.
                if let Some((b, _)) = bound.filter(|(b, _)| Some(*b) != old) {
                    steps.push(HelloStep::Detach { session: b });
                }
                steps.push(HelloStep::Hello { session: id });
            }
        }
        HelloDecision {
            path,
            hello,
            steps,
            refused,
        }
    }

    fn route(
        &mut self,
        now: Time,
        expected: Option<NodeId>,
        h: &Hello,
    ) -> Result<Route, PathError> {
        let cur = self.table.get(&h.node).map(|r| handshake::Current {
            id: r.id,
            peer: r.peer,
        });
        let seen = self.seen.get(&h.node).copied();
        let theirs = (h.epoch, h.session);
        let replaces = match decide(&self.local, h, expected, cur, seen) {
            Decision::Reject(e) => return Err(e.into()),
            Decision::Attach => return Ok(Route::Existing(cur.map_or(SessionId(0), |c| c.id))),
            Decision::Bind => {
                if let Some(r) = self.table.get_mut(&h.node) {
                    r.peer = Some(theirs);
                }
                self.remember(h.node, theirs);
                return Ok(Route::Existing(cur.map_or(SessionId(0), |c| c.id)));
            }
            Decision::Create => None,
            Decision::Replace(reason) => {
                // The old session leaves the table; its paths close with it
                // when the driver supersedes it.
                self.table.remove(&h.node);
                cur.map(|c| (c.id, reason))
            }
        };
        let s = self
            .mint(now, h.node)
            .map_err(|_| PathError::from(HandshakeError::TooManySessions(self.cfg.max_sessions)))?;
        if let Some(r) = self.table.get_mut(&h.node) {
            r.peer = Some(theirs);
        }
        self.remember(h.node, theirs);
        Ok(Route::New {
            session: Box::new(s),
            replaces,
        })
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
                .find(|n| !self.table.contains_key(n));
            if let Some(v) = victim {
                self.seen.remove(&v);
            }
        }
        let e = self.seen.entry(node).or_insert(id);
        *e = (*e).max(id);
    }

    /// Closes an unbound path (already out of `unbound`) because of `e`,
    /// telling the peer why.
    fn refuse_unbound(&mut self, path: PathId, e: PathError) {
        let close = Close {
            scope: e.close_scope(),
            code: e.close_code(),
            reason: e.to_string(),
        };
        self.closing.push_back(ClosingPath {
            path,
            close: Some(close),
            reason: PathCloseReason::Error(e),
            resent: 0,
        });
    }

    /// The transport under an unbound path failed.
    pub fn unbound_path_down(&mut self, path: PathId) {
        if self.unbound.remove(&path).is_some() {
            self.finish_close(ClosingPath {
                path,
                close: None,
                reason: PathCloseReason::TransportFailed,
                resent: 0,
            });
        } else if let Some(i) = self.closing.iter().position(|c| c.path == path) {
            if let Some(mut c) = self.closing.remove(i) {
                c.close = None;
                self.finish_close(c);
            }
        }
    }

    /// Closes an unbound path from this side.
    pub fn close_unbound(&mut self, path: PathId) {
        if self.unbound.remove(&path).is_some() {
            self.closing.push_back(ClosingPath {
                path,
                close: Some(Close {
                    scope: CloseScope::Path,
                    code: crate::wire::CloseCode::NORMAL,
                    reason: String::new(),
                }),
                reason: PathCloseReason::ClosedLocally,
                resent: 0,
            });
        }
    }

    fn finish_close(&mut self, c: ClosingPath) {
        self.events.push_back(Event::PathClosed {
            peer: None,
            path: c.path,
            reason: c.reason,
            resent: c.resent,
        });
    }

    /// Appends a CLOSE frame for a refused unbound path and returns the
    /// path; `None` when there is none.
    pub fn poll_transmit(&mut self, buf: &mut BytesMut) -> Option<PathId> {
        let c = self.closing.pop_front()?;
        if let Some(close) = &c.close {
            close.encode(buf);
        }
        let path = c.path;
        self.finish_close(c);
        Some(path)
    }

    /// The next event about an unbound path.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When the oldest unbound path's handshake times out.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.unbound
            .values()
            .map(|u| u.since + self.cfg.handshake_timeout)
            .min()
    }

    /// Closes unbound paths whose handshake did not complete in time.
    pub fn handle_timeout(&mut self, now: Time) {
        let mut expired: Vec<PathId> = self
            .unbound
            .iter()
            .filter(|(_, u)| now >= u.since + self.cfg.handshake_timeout)
            .map(|(&p, _)| p)
            .collect();
        // Map order is random; outputs must not be.
        expired.sort_unstable();
        for path in expired {
            self.unbound.remove(&path);
            self.refuse_unbound(path, HandshakeError::Timeout.into());
        }
    }

    /// Paths the router holds (unbound or closing).
    pub fn path_count(&self) -> usize {
        self.unbound.len() + self.closing.len()
    }
}
