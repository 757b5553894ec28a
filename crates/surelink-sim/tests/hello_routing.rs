//! Property test of HELLO routing — which session a path joins, restarts,
//! supersedes — through the core's one decision
//! ([`Router::handle_hello`] → [`HelloDecision::apply`]), the code the
//! tokio shell applies too.
//!
//! Two endpoints on the test fixture. A random schedule dials paths from
//! either side (so HELLOs cross), delivers each path's bytes in any order
//! (HELLOs on several paths race), kills paths, restarts either process,
//! closes sessions (the peer's next session supersedes the old one), sends
//! one-way messages and makes calls, and moves the clock. Then the network
//! heals. Checked at every step and at the end:
//!
//! - a receiving session hears from one peer session only, every message
//!   in order and at most once, and only in the incarnation the sender's
//!   session was bound to when it sent (never replayed into a restart);
//! - a request runs at most once per receiving session, a reply only comes
//!   from the incarnation the call was bound to, and every call ends once;
//! - after healing both ends hold one session, bound to each other's
//!   current incarnation, and everything the final sessions sent arrived.
//!
//! A failing schedule is shrunk and printed by proptest; replay it by
//! pasting it into `replay` below.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use surelink_proto::rpc::{CallFailure, CallOptions};
use surelink_proto::{
    ChannelId, Endpoint, EndpointConfig, Epoch, Event, NodeId, PathId, SessionEndReason, SessionId,
};
use surelink_sim::fixture::{World, A, B};

/// One step of a schedule.
#[derive(Clone, Debug)]
enum Op {
    /// A new path: `A` dials `B`, or `B` dials `A`.
    Dial { by: usize },
    /// What `from` wrote on live path `path` (modulo the live count)
    /// arrives at the other end.
    Deliver { path: usize, from: usize },
    /// The transport under a live path fails (both ends notice; what was
    /// on it is lost).
    Kill { path: usize },
    /// The process restarts: a new incarnation, every connection gone.
    Restart { node: usize },
    /// The application ends its session with the other side.
    Close { node: usize },
    /// A one-way message to the other side.
    Send { node: usize },
    /// A call to the other side.
    Call { node: usize },
    /// The clock moves on.
    Advance { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize).prop_map(|by| Op::Dial { by }),
        8 => (0..8usize, 0..2usize).prop_map(|(path, from)| Op::Deliver { path, from }),
        1 => (0..8usize).prop_map(|path| Op::Kill { path }),
        1 => (0..2usize).prop_map(|node| Op::Restart { node }),
        1 => (0..2usize).prop_map(|node| Op::Close { node }),
        3 => (0..2usize).prop_map(|node| Op::Send { node }),
        2 => (0..2usize).prop_map(|node| Op::Call { node }),
        2 => (0..3000u16).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// What a message carries: who sent it, from which incarnation, and a
/// number unique to that incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Tag {
    node: u64,
    epoch: u64,
    n: u64,
}

impl Tag {
    fn encode(self) -> Bytes {
        let mut b = BytesMut::with_capacity(24);
        for v in [self.node, self.epoch, self.n] {
            b.put_u64(v);
        }
        b.freeze()
    }

    fn decode(b: &[u8]) -> Tag {
        let v = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_be_bytes(x)
        };
        Tag {
            node: v(0),
            epoch: v(1),
            n: v(2),
        }
    }
}

/// A message or call as the sender saw it.
#[derive(Clone, Copy, Debug)]
struct Sent {
    /// The sending session.
    session: SessionId,
    /// Its place among that session's messages (0, 1, ...).
    index: usize,
    /// The peer incarnation the sending session was bound to, if any yet.
    bound: Option<Epoch>,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// (node, epoch, session): one side of a session.
type SessionKey = (u64, u64, u64);
/// (node, epoch, session, call id).
type CallKey = (u64, u64, u64, u64);
/// A call as made, and how it ended.
type CallRecord = (Sent, Option<Result<Bytes, CallFailure>>);

struct Run {
    w: World<Endpoint>,
    cfg: EndpointConfig,
    /// Live paths (both ends still hold them).
    live: Vec<PathId>,
    next_path: u64,
    /// The next message number per sender incarnation.
    counter: u64,
    /// Messages per tag.
    sent: BTreeMap<Tag, Sent>,
    /// Message tags per sending (node, epoch, session), in order.
    by_session: BTreeMap<SessionKey, Vec<Tag>>,
    /// Calls per (caller node, epoch, caller session, call id).
    calls: BTreeMap<CallKey, CallRecord>,
    /// Per receiving (node, epoch, session): the peer session heard and
    /// the next place in it expected.
    heard: BTreeMap<SessionKey, ((u64, u64), usize)>,
    /// Delivered message tags.
    delivered: BTreeSet<Tag>,
    /// Requests run, per receiving (node, epoch, session, call id).
    ran: BTreeSet<CallKey>,
}

fn node_id(n: usize) -> NodeId {
    NodeId(n as u64 + 1)
}

fn other(n: usize) -> usize {
    1 - n
}

impl Run {
    fn new() -> Run {
        let cfg = EndpointConfig::default();
        Run {
            w: World::pair(cfg.clone()),
            cfg,
            live: Vec::new(),
            next_path: 1,
            counter: 0,
            sent: BTreeMap::new(),
            by_session: BTreeMap::new(),
            calls: BTreeMap::new(),
            heard: BTreeMap::new(),
            delivered: BTreeSet::new(),
            ran: BTreeSet::new(),
        }
    }

    fn epoch(&self, n: usize) -> u64 {
        self.w[n].local().epoch.0
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Dial { by } => {
                let path = PathId(self.next_path);
                self.next_path += 1;
                self.w.connect(by, other(by), path);
                self.live.push(path);
            }
            Op::Deliver { path, from } => {
                if let Some(&p) = self.live.get(path % self.live.len().max(1)) {
                    self.w.flush_from(from);
                    self.w.deliver(from, p);
                }
            }
            Op::Kill { path } => {
                if !self.live.is_empty() {
                    let p = self.live.remove(path % self.live.len());
                    self.kill(p);
                }
            }
            Op::Restart { node } => {
                self.take_events(node);
                self.w.restart(node, self.cfg.clone());
                let now = self.w.now;
                // Its connections die with it: the other side sees them end.
                for p in std::mem::take(&mut self.live) {
                    self.w[other(node)].handle_path_down(now, p);
                }
            }
            Op::Close { node } => {
                let now = self.w.now;
                self.w[node].close_session(now, node_id(other(node)));
            }
            Op::Send { node } => self.send(node),
            Op::Call { node } => self.call(node),
            Op::Advance { ms } => self.w.advance(Duration::from_millis(u64::from(ms))),
        }
        for n in [A, B] {
            self.take_events(n);
        }
    }

    /// Both ends drop the path; whatever was on it is lost.
    fn kill(&mut self, p: PathId) {
        self.w.drop_queued(A, p);
        self.w.drop_queued(B, p);
        let now = self.w.now;
        self.w[A].handle_path_down(now, p);
        self.w[B].handle_path_down(now, p);
    }

    /// The session `n` has with the other side now, and what it is bound to.
    fn session(&self, n: usize) -> Option<(SessionId, Option<Epoch>)> {
        self.w[n].session_with(node_id(other(n)))
    }

    fn send(&mut self, n: usize) {
        let now = self.w.now;
        let peer = node_id(other(n));
        let tag = Tag {
            node: node_id(n).0,
            epoch: self.epoch(n),
            n: self.counter,
        };
        // A full send buffer hands the message back: not sent.
        if self.w[n]
            .send(now, peer, ChannelId(0), tag.encode())
            .is_err()
        {
            return;
        }
        self.counter += 1;
        // The send opened a session if there was none: it sits there.
        let (session, bound) = self.session(n).expect("a send opens a session");
        let list = self
            .by_session
            .entry((tag.node, tag.epoch, session.0))
            .or_default();
        self.sent.insert(
            tag,
            Sent {
                session,
                index: list.len(),
                bound,
            },
        );
        list.push(tag);
    }

    fn call(&mut self, n: usize) {
        let now = self.w.now;
        let peer = node_id(other(n));
        let opts = CallOptions::new(CALL_TIMEOUT);
        let body = Bytes::from_static(b"call");
        let Ok((sid, call)) = self.w[n].call(now, peer, ChannelId(1), body, &opts) else {
            return;
        };
        let bound = self
            .session(n)
            .filter(|(s, _)| *s == sid)
            .and_then(|(_, b)| b);
        let sent = Sent {
            session: sid,
            index: 0,
            bound,
        };
        let key = (node_id(n).0, self.epoch(n), sid.0, call.0);
        self.calls.insert(key, (sent, None));
    }

    /// Takes node `n`'s events and checks each against the promises.
    fn take_events(&mut self, n: usize) {
        self.w.drain_events();
        let me = (node_id(n).0, self.epoch(n));
        for e in self.w.take_events(n) {
            match e {
                Event::Message(m) => {
                    let t = Tag::decode(&m.payload);
                    let s = self.sent.get(&t).copied();
                    let s = s.unwrap_or_else(|| panic!("{t:?} delivered but never sent"));
                    if let Some(b) = s.bound {
                        assert_eq!(
                            b.0, me.1,
                            "{t:?} was sent to incarnation {b:?}, delivered to {}",
                            me.1
                        );
                    }
                    let key = (me.0, me.1, m.session.0);
                    let (from, next) = self.heard.entry(key).or_insert(((t.epoch, s.session.0), 0));
                    assert_eq!(
                        *from,
                        (t.epoch, s.session.0),
                        "session {key:?} heard from two peer sessions"
                    );
                    assert_eq!(
                        s.index, *next,
                        "{t:?} out of order, doubled or after a gap at {key:?}"
                    );
                    *next += 1;
                    assert!(self.delivered.insert(t), "{t:?} delivered twice");
                }
                Event::Request(r) => {
                    let key = (me.0, me.1, r.session.0, r.call.0);
                    assert!(self.ran.insert(key), "request {key:?} ran twice");
                    // The reply names the incarnation that ran it.
                    let now = self.w.now;
                    let reply = Bytes::from(me.1.to_be_bytes().to_vec());
                    let _ = self.w[n].complete(now, r.session, r.call, Ok(reply));
                }
                Event::CallDone {
                    session,
                    call,
                    result,
                    ..
                } => {
                    let key = (me.0, me.1, session.0, call.0);
                    let (sent, done) = self
                        .calls
                        .get_mut(&key)
                        .unwrap_or_else(|| panic!("call {key:?} ended but never made"));
                    assert!(done.is_none(), "call {key:?} ended twice");
                    if let (Ok(reply), Some(b)) = (&result, sent.bound) {
                        let mut x = [0u8; 8];
                        x.copy_from_slice(&reply[..8]);
                        assert_eq!(
                            u64::from_be_bytes(x),
                            b.0,
                            "call {key:?} bound to {b:?} answered by another incarnation"
                        );
                    }
                    *done = Some(result);
                }
                Event::SessionEnded {
                    session, reason, ..
                } => {
                    if let SessionEndReason::PeerRestarted { old, new } = reason {
                        assert!(new.is_none_or(|new| new > old), "restart to an older epoch");
                    }
                    // Its calls ended with it (their failures come first).
                    for ((node, epoch, sid, call), (_, done)) in &self.calls {
                        if (*node, *epoch, *sid) == (me.0, me.1, session.0) {
                            assert!(
                                done.is_some(),
                                "session {session:?} ended ({reason:?}) leaving call {call} pending"
                            );
                        }
                    }
                }
                Event::PathClosed { path, .. } => {
                    // The shell closes the transport once its CLOSE frame is
                    // out: the other end sees it end.
                    if let Some(i) = self.live.iter().position(|&p| p == path) {
                        self.w.flush_from(n);
                        self.w.deliver(n, path);
                        self.live.remove(i);
                        let now = self.w.now;
                        self.w[other(n)].handle_path_down(now, path);
                    }
                }
                _ => {}
            }
        }
    }

    /// The network heals: old paths are gone, a fresh one is dialled, and
    /// time passes until every call has ended.
    fn heal(&mut self) {
        for p in std::mem::take(&mut self.live) {
            self.kill(p);
        }
        for n in [A, B] {
            self.take_events(n);
        }
        self.apply(&Op::Dial { by: A });
        for _ in 0..8 {
            self.w.settle();
            for n in [A, B] {
                self.take_events(n);
            }
            self.w.advance(Duration::from_millis(500));
            for n in [A, B] {
                self.take_events(n);
            }
            // A path the core closed meanwhile (a stale HELLO's) is
            // replaced, as a dial loop would.
            if self.live.is_empty() {
                self.apply(&Op::Dial { by: A });
            }
        }
        self.w.settle();
        for n in [A, B] {
            self.take_events(n);
        }
    }

    fn check_end(&mut self) {
        // One session each: every replaced or closed one ended and left.
        for n in [A, B] {
            let held = self.w[n].session_buffers().count();
            assert_eq!(held, 1, "node {n} holds {held} sessions after healing");
        }
        let (ea, eb) = (self.epoch(A), self.epoch(B));
        let sa = self.session(A).expect("A holds a session after healing");
        let sb = self.session(B).expect("B holds a session after healing");
        assert_eq!(
            sa.1,
            Some(Epoch(eb)),
            "A's session is bound to B's current incarnation"
        );
        assert_eq!(
            sb.1,
            Some(Epoch(ea)),
            "B's session is bound to A's current incarnation"
        );
        // Messages still flow both ways.
        self.send(A);
        self.send(B);
        self.w.settle();
        for n in [A, B] {
            self.take_events(n);
        }
        // Everything the final sessions sent arrived: they never ended.
        for (n, e, s) in [(A, ea, sa.0), (B, eb, sb.0)] {
            let sent = self.by_session.get(&(node_id(n).0, e, s.0));
            for t in sent.into_iter().flatten() {
                assert!(self.delivered.contains(t), "{t:?} lost in a live session");
            }
        }
        // Every call of a current incarnation ended.
        for ((node, epoch, _, _), (sent, done)) in &self.calls {
            let current = if *node == 1 { ea } else { eb };
            if *epoch == current {
                assert!(done.is_some(), "call {sent:?} never ended");
            }
        }
    }
}

fn run(ops: &[Op]) {
    let mut r = Run::new();
    for op in ops {
        r.apply(op);
    }
    r.heal();
    r.check_end();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn hello_routing_keeps_the_promises(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops);
    }
}

/// A schedule that crosses HELLOs on two paths, restarts the acceptor
/// between them and supersedes a session by closing it.
#[test]
fn crossing_hellos_a_restart_and_a_supersede() {
    use Op::*;
    run(&[
        Dial { by: A },
        Dial { by: B },
        Send { node: A },
        Call { node: B },
        Deliver { path: 1, from: B },
        Deliver { path: 0, from: A },
        Deliver { path: 0, from: B },
        Restart { node: B },
        Dial { by: A },
        Send { node: A },
        Deliver { path: 0, from: A },
        Close { node: A },
        Dial { by: B },
        Send { node: A },
        Deliver { path: 1, from: B },
        Deliver { path: 0, from: A },
        Advance { ms: 2500 },
    ]);
}

/// Paste a shrunk schedule here to replay it.
#[test]
fn replay() {
    run(&[]);
}
