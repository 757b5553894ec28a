//! Driving a session: after every input, under the session's lock, take
//! what the core produced — frames onto the connections' write queues,
//! replies to waiting callers, admitted requests to the scheduler, one-way
//! messages to the incoming queue, role messages to the role task, events
//! — and leave what must not happen under the lock (socket writes, waking
//! tasks, publishing events) as [`Work`] for after it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::{debug, info, warn};

use surelink_proto::rpc::{CallFailure, RemoteError, Ticket};
use surelink_proto::{CallId, Event, PathCloseReason, SessionEndReason, StreamKind, Time};

use super::{SessionHandle, SessionInner};
use crate::conn::ConnIo;
use crate::error::CallError;
use crate::events::NetEvent;
use crate::incoming::{Incoming, IncomingBatch};
use crate::server::Server;
use crate::shared::Shared;

/// Bytes per `poll_transmit`: big enough to batch, small enough to
/// interleave paths.
const TRANSMIT_BUDGET: usize = 256 * 1024;

/// Work found while holding a session's lock, done after releasing it.
#[derive(Default)]
pub(crate) struct Work {
    flush: Vec<Arc<ConnIo>>,
    close: Vec<Arc<ConnIo>>,
    events: Vec<NetEvent>,
    tickets: Vec<Ticket>,
    promotes: Vec<CallId>,
    messages: Vec<IncomingBatch>,
    /// Helpers' relays and slots to start after the lock.
    relay: crate::relay::Started,
    ended: bool,
    space: bool,
    /// Requests were handed to the scheduler: start what can start.
    dispatch: bool,
    rearm: bool,
}

impl SessionHandle {
    /// Writes what the core wants written, hands out what it delivered,
    /// and re-arms the timer. Runs with the lock held after every input.
    /// `now`: a clock read of the caller's, taken under the lock.
    pub(super) fn drive(
        self: &Arc<Self>,
        g: &mut SessionInner,
        shared: &Shared,
        now: Time,
    ) -> Work {
        let mut w = Work::default();
        let SessionInner {
            core, conns, out, ..
        } = &mut *g;
        while let Some(path) = core.poll_transmit_gather(now, out, TRANSMIT_BUDGET) {
            shared.stats.bytes_sent(out.len());
            match conns.iter().find(|c| c.path == path) {
                Some(c) => {
                    c.enqueue_all(out.drain());
                    if !w.flush.iter().any(|f| Arc::ptr_eq(f, c)) {
                        w.flush.push(c.clone());
                    }
                }
                None => {
                    out.drain();
                }
            }
        }
        if !w.flush.is_empty() {
            self.last_tx.store(now.as_nanos(), Ordering::Relaxed);
        }
        self.unflushed.store(0, Ordering::Relaxed);
        while let Some(ev) = g.core.poll_event() {
            self.on_event(g, shared, ev, &mut w);
        }
        while let Some(m) = g.core.poll_role() {
            if let Some(r) = &shared.role {
                r.deliver(self.node, m);
            }
        }
        // Requests: the core admits up to its per-peer bound.
        while let Some(t) = g.core.poll_request() {
            w.tickets.push(t);
        }
        self.take_messages(g, shared, &mut w);
        // Requests likewise reach the scheduler in the order the core
        // admitted them (starting them waits for `run`).
        w.dispatch = !w.tickets.is_empty() || !w.promotes.is_empty();
        Server::enqueue(
            shared,
            self,
            std::mem::take(&mut w.tickets),
            std::mem::take(&mut w.promotes),
        );
        let t = g.core.poll_timeout();
        if t.is_some() && (g.armed.is_none() || t < g.armed) {
            g.armed = t;
            w.rearm = true;
        }
        w
    }

    /// One-way messages: up to this peer node's share of the incoming
    /// queue (counted across its sessions: see `incoming.rs`).
    fn take_messages(self: &Arc<Self>, g: &mut SessionInner, shared: &Shared, w: &mut Work) {
        let (bound, byte_bound) = (shared.incoming.bound, shared.incoming.byte_bound);
        let ledger = &self.ledger;
        let mut room = bound.saturating_sub(ledger.messages.load(Ordering::Acquire));
        let held = ledger.bytes.load(Ordering::Acquire);
        let mut added = 0usize;
        // In bytes too (memory, not message count, is what a peer could
        // exhaust); one message is always let through an empty queue.
        let mut count = 0usize;
        let frames = shared.incoming.wants_frames();
        while room > 0 && (held + added < byte_bound || held + added == 0) {
            // For `recv_batches`: a normal one-way frame goes whole when
            // the bounds have room for all of it (no slice, reference
            // count or `Incoming` per message here, on the session's lock).
            if let Some((stream, n, bytes)) = g.core.peek_batch().filter(|_| frames) {
                let n = n as usize;
                if let StreamKind::Oneway(channel) = stream.kind() {
                    if n > 1
                        && n <= room
                        && held + added + bytes <= byte_bound
                        && !shared
                            .relays
                            .as_ref()
                            .is_some_and(|r| r.takes(self.node, channel.0))
                    {
                        let Some(b) = g.core.poll_batch() else { break };
                        let n = b.len();
                        added += b.body_len();
                        room = room.saturating_sub(n);
                        count += n;
                        w.messages.push(IncomingBatch::frame(self.node, channel, b));
                        continue;
                    }
                }
            }
            let Some(m) = g.core.poll_message() else {
                break;
            };
            if let Some(r) = shared
                .relays
                .as_ref()
                .filter(|r| r.takes(m.peer, m.channel.0))
            {
                // A helper's relay records: clients' connections, not
                // the application's messages (applied here, in order).
                r.deliver(shared, m.peer, m.payload, &mut w.relay);
                continue;
            }
            added += m.payload.len();
            w.messages.push(IncomingBatch::one(Incoming {
                peer: m.peer,
                channel: m.channel,
                priority: m.priority,
                body: m.payload,
            }));
            room -= 1;
            count += 1;
        }
        if g.core.has_messages() && !ledger.blocked.swap(true, Ordering::Relaxed) {
            // Stopped at the bound with messages waiting: they stay
            // unacknowledged, which holds the peer back.
            shared.stats.peer_bound_hit();
        }
        if !w.messages.is_empty() {
            ledger.messages.fetch_add(count, Ordering::AcqRel);
            ledger.bytes.fetch_add(added, Ordering::AcqRel);
            shared.stats.messages_received(count);
            // Queued here, under the session's lock: two drives of one
            // session (a reader and the session task, say) must hand over
            // their runs in the order they took them from the core, or a
            // stream's messages reach `recv` out of order.
            shared.incoming.push(
                ledger,
                shared.clock.now_cached(),
                std::mem::take(&mut w.messages),
            );
        }
    }

    fn on_event(&self, g: &mut SessionInner, shared: &Shared, ev: Event, w: &mut Work) {
        match ev {
            Event::CallDone { call, result, .. } => {
                if let Some(tx) = g.waiters.remove(&call) {
                    let r = result.map_err(|f| match f {
                        CallFailure::Timeout => CallError::Timeout,
                        CallFailure::Remote(e) => CallError::Remote(e),
                        CallFailure::SessionEnded(reason) => {
                            CallError::from_end(self.node, &reason)
                        }
                        // A failure kind newer than this shell.
                        _ => CallError::Remote(RemoteError::Unknown(0)),
                    });
                    let _ = tx.send(r);
                }
            }
            Event::Promote { call, .. } => w.promotes.push(call),
            Event::PathUp { peer, path } => {
                let network = g.conns.iter().find(|c| c.path == path).map_or(0, |c| {
                    c.set_peer(peer);
                    c.network
                });
                info!(%peer, %path, network, "path up");
                shared.stats.path_up();
                w.events.push(NetEvent::PathUp {
                    peer,
                    path,
                    network,
                });
            }
            Event::PathClosed {
                peer,
                path,
                reason,
                resent,
            } => {
                let network = match g.conns.iter().position(|c| c.path == path) {
                    Some(i) => {
                        let c = g.conns.swap_remove(i);
                        if let PathCloseReason::ClosedByPeer { code, .. } = &reason {
                            c.set_peer_close(*code);
                        }
                        let n = c.network;
                        w.close.push(c);
                        n
                    }
                    None => 0,
                };
                match &reason {
                    PathCloseReason::Error(e) => warn!(%path, ?peer, error = %e, "path closed"),
                    r => info!(%path, ?peer, reason = ?r, resent, "path closed"),
                }
                shared.stats.path_down(resent);
                w.events.push(NetEvent::PathDown {
                    peer,
                    path,
                    network,
                    resent,
                    reason: format!("{reason:?}"),
                });
            }
            Event::PeerUp { peer, epoch, .. } => w.events.push(NetEvent::PeerUp { peer, epoch }),
            Event::PeerUnreachable { peer, .. } => {
                warn!(%peer, "peer unreachable: no working path");
                w.events.push(NetEvent::PeerUnreachable { peer });
            }
            Event::SessionEnded {
                peer,
                reason,
                abandoned,
                ..
            } => {
                let n: u64 = abandoned.iter().map(|a| a.end - a.start).sum();
                match reason {
                    SessionEndReason::ClosedLocally | SessionEndReason::ClosedByPeer { .. } => {
                        info!(%peer, ?reason, abandoned = n, "session closed");
                    }
                    _ => warn!(%peer, ?reason, abandoned = n, "session ended"),
                }
                self.ended.store(true, Ordering::Release);
                self.stage.close();
                w.ended = true;
                w.space = true;
                w.events.push(NetEvent::SessionEnded {
                    peer,
                    reason,
                    abandoned: n,
                });
            }
            Event::MessageRejected { peer, reason, .. } => {
                warn!(%peer, ?reason, "queued message rejected by the peer's limits");
            }
            other => debug!(?other, "session event ignored"),
        }
    }

    /// Does what `drive` found, outside the lock.
    pub(crate) fn run(self: &Arc<Self>, shared: &Arc<Shared>, w: Work) {
        for c in &w.flush {
            c.flush();
        }
        for c in w.close {
            tokio::spawn(c.close_after_flush());
        }
        for e in w.events {
            shared.events.publish(e);
        }
        if !w.relay.is_empty() {
            w.relay.start(shared);
        }
        if w.dispatch {
            Server::dispatch(shared);
        }
        if w.rearm {
            self.wake.notify_one();
        }
        if w.space {
            self.space.notify_waiters();
        }
        if w.ended {
            shared.session_ended(self);
        }
    }
}
