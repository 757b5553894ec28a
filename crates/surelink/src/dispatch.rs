//! The server's request dispatch: requests taken from the sessions go into
//! the core's [`Dispatcher`] (hr-net's three queues, at-most-once per caller
//! incarnation and call id) and from there to the handler, at most
//! `max_concurrent_requests` at a time.
//!
//! The seam for a later task scheduler (recovery groups mapped to worker
//! pools): [`dispatch_ready`] is the only place that decides *which* queued
//! request runs *now*; handlers only see a [`Request`](crate::Request) and
//! return a reply. A scheduler that maps channels to groups and groups to
//! pools replaces this function and the single concurrency limit, not the
//! handlers.

use std::collections::HashMap;

use bytes::Bytes;
use tracing::{debug, warn};

use surelink_proto::rpc::{Caller, Duplicate, Priority, RequestClass};
use surelink_proto::{ChannelId, Epoch, MessageId, NodeId};

use crate::driver::{Inner, Job, Shared};
use crate::rpc::{self, RequestHeader};
use crate::Request;

/// What a queued request needs besides the handler's view.
#[derive(Clone, Debug)]
pub(crate) struct Work {
    pub(crate) caller: Caller,
    pub(crate) id: u64,
    /// The transport channel the reply goes back on.
    pub(crate) reply_channel: u16,
}

/// A request waiting in the dispatcher.
pub(crate) type Queued = (Work, Request);

/// Reply message ids kept for duplicate requests (a duplicate means the
/// reply may be stuck on a stalled path).
const REPLY_IDS_KEPT: usize = 65_536;

/// Server-side state behind the endpoint lock.
pub(crate) struct ServerState {
    pub(crate) dispatcher: surelink_proto::rpc::Dispatcher<Queued>,
    pub(crate) reply_ids: HashMap<(Caller, u64), MessageId>,
}

impl ServerState {
    pub(crate) fn new(cfg: surelink_proto::rpc::DispatcherConfig) -> ServerState {
        ServerState {
            dispatcher: surelink_proto::rpc::Dispatcher::new(cfg),
            reply_ids: HashMap::new(),
        }
    }
}

/// A request arrived on `transport_channel` from `peer`.
pub(crate) fn on_request(
    inner: &mut Inner,
    shared: &Shared,
    peer: NodeId,
    transport_channel: ChannelId,
    header: RequestHeader,
    body: Bytes,
) {
    let now = shared.now();
    let epoch = inner
        .core
        .session_with(peer)
        .and_then(|(_, e)| e)
        .unwrap_or(Epoch(0));
    let caller = Caller { node: peer, epoch };
    let class = if header.flags & rpc::FLAG_RESEND != 0 {
        RequestClass::Resend
    } else {
        RequestClass::Send
    };
    let hint = if header.flags & rpc::FLAG_HIGH != 0 {
        Priority::High
    } else {
        Priority::Normal
    };
    let work = Work {
        caller,
        id: header.id,
        reply_channel: transport_channel.0,
    };
    let request = Request {
        peer,
        channel: header.channel,
        body,
    };
    let dup = inner.server.dispatcher.handle_request(
        now,
        caller,
        header.id,
        class,
        hint,
        (work, request),
    );
    let Some(dup) = dup else { return };
    shared.stats.duplicate_request();
    // The caller sent again: whatever we sent it may sit on a stalled path.
    if let Some(m) = inner.server.reply_ids.get(&(caller, header.id)) {
        inner.core.handle_message_overdue(now, peer, *m);
    }
    if let Duplicate::Reply(reply) = dup {
        let prefix = rpc::call_prefix(rpc::REPLY, 0, header.channel, header.id);
        match inner
            .core
            .send_with_prefix(now, peer, transport_channel, prefix, reply)
        {
            Ok(m) => {
                inner.server.reply_ids.insert((caller, header.id), m);
            }
            Err(e) => debug!(%peer, error = %e, "repeated reply not sent"),
        }
    }
}

/// Hands queued requests to the handler while workers are free.
pub(crate) fn dispatch_ready(inner: &mut Inner, shared: &Shared, jobs: &mut Vec<Job>) {
    let max = shared.config.max_concurrent_requests;
    if inner.requests_running >= max || inner.server.dispatcher.queued() == 0 {
        return;
    }
    let Some(handler) = inner.handler.clone() else {
        // No handler: answer every waiting request with an empty reply
        // rather than leave the callers to time out.
        let now = shared.now();
        while let Some(d) = inner.server.dispatcher.next(now) {
            let (work, request) = d.request;
            warn!(peer = %request.peer, id = work.id, "request received but no handler is registered");
            let prefix = rpc::call_prefix(rpc::REPLY, 0, request.channel, work.id);
            let _ = inner.core.send_with_prefix(
                now,
                request.peer,
                ChannelId(work.reply_channel),
                prefix,
                Bytes::new(),
            );
            inner
                .server
                .dispatcher
                .complete(work.caller, work.id, Bytes::new());
        }
        return;
    };
    let now = shared.now();
    while inner.requests_running < max {
        let Some(d) = inner.server.dispatcher.next(now) else {
            break;
        };
        let (work, request) = d.request;
        inner.requests_running += 1;
        jobs.push(Job::Request {
            handler: handler.clone(),
            request,
            work,
        });
    }
}

/// A handler finished: remember the reply for duplicates.
pub(crate) fn finished(inner: &mut Inner, work: &Work, reply: Bytes, sent: Option<MessageId>) {
    inner.requests_running -= 1;
    inner
        .server
        .dispatcher
        .complete(work.caller, work.id, reply);
    if let Some(m) = sent {
        if inner.server.reply_ids.len() >= REPLY_IDS_KEPT {
            // Rare and cheap enough: forget them all rather than keep an LRU.
            inner.server.reply_ids.clear();
        }
        inner.server.reply_ids.insert((work.caller, work.id), m);
    }
}

/// A peer's session ended: its queued requests are dropped (they were
/// never run; the caller learns the session ended).
pub(crate) fn forget_peer(inner: &mut Inner, peer: NodeId) {
    inner.server.dispatcher.forget_node(peer);
    inner.server.reply_ids.retain(|(c, _), _| c.node != peer);
}
