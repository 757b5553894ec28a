//! Messaging on the public handle: calls, one-way sends (waiting, batched,
//! or handed back when full), serving requests, receiving one-way messages.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use surelink_proto::rpc::{CallOptions, Priority};
use surelink_proto::NodeId;

use super::Endpoint;
use crate::call::{self, Flush};
use crate::error::{CallError, SendError, TrySendError};
use crate::incoming::{Incoming, IncomingBatch};
use crate::server::Handler;

impl Endpoint {
    /// Sends `request` to `peer` on `channel` and waits for the reply.
    ///
    /// The request is delivered exactly once as long as some path to the
    /// peer works again within the linger time, whatever happens to the
    /// connections meanwhile; without a reply after a quarter of `timeout`
    /// it is sent again with the same id (run at most once). Fails with
    /// [`CallError::PeerRestarted`] if the peer's process restarts first
    /// (the request is never replayed into the new process), with
    /// [`CallError::Remote`] when the handler failed, and with
    /// [`CallError::Timeout`] after `timeout`.
    pub async fn call(
        &self,
        peer: NodeId,
        channel: u16,
        request: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        call::call(
            &self.shared,
            peer,
            channel,
            request,
            &CallOptions::new(timeout),
            call::OnQueued::new(|| {}),
        )
        .await
    }

    /// A call with explicit options: priority, re-send timeout, deadline.
    /// A high-priority call travels on the session's priority lane and is
    /// served before normal requests queued at the server (within the
    /// server's aging bound); a call without a reply within
    /// `resend_after` is sent again with the same id (executed at most
    /// once), with high priority unless `fixed_priority`.
    ///
    /// ```no_run
    /// # async fn f(ep: surelink::Endpoint) -> Result<(), surelink::CallError> {
    /// use std::time::Duration;
    /// use surelink::{CallOptions, Priority};
    /// let opts = CallOptions::new(Duration::from_millis(500)).with_priority(Priority::High);
    /// let reply = ep.call_with(surelink::proto::NodeId(2), 0, "lease?".into(), &opts).await?;
    /// # Ok(()) }
    /// ```
    pub async fn call_with(
        &self,
        peer: NodeId,
        channel: u16,
        request: Bytes,
        opts: &CallOptions,
    ) -> Result<Bytes, CallError> {
        call::call(
            &self.shared,
            peer,
            channel,
            request,
            opts,
            call::OnQueued::new(|| {}),
        )
        .await
    }

    /// [`Endpoint::call_with`], and `queued` runs as soon as the request is
    /// in the session's send queue (or the call failed, or was dropped,
    /// before it got there). A caller that must keep its calls in order
    /// issues the next one from there: requests leave in the order they
    /// were queued (and a server starts those of one recovery group in
    /// that order) — while the session's send buffer is full a call waits
    /// *before* it is queued. `queued` runs even if the future is dropped
    /// unpolled.
    pub fn call_then<'a>(
        &'a self,
        peer: NodeId,
        channel: u16,
        request: Bytes,
        opts: &'a CallOptions,
        queued: impl FnOnce() + 'a,
    ) -> impl std::future::Future<Output = Result<Bytes, CallError>> + 'a {
        // Made now: a future dropped unpolled still runs `queued`.
        let queued = call::OnQueued::new(queued);
        call::call(&self.shared, peer, channel, request, opts, queued)
    }

    /// Sends a one-way message, waiting while the session's send buffer is
    /// full. A message sent while the session is idle leaves at once; ones
    /// sent back to back leave together (in BATCH frames) with the
    /// session's next write, and are queued for it without taking the
    /// session's lock (`StatsSnapshot::sends_staged`). For a stream of
    /// small messages [`Endpoint::send_many`] is still the cheapest way.
    pub async fn send(&self, peer: NodeId, channel: u16, message: Bytes) -> Result<(), SendError> {
        // The common case waits for nothing: no future state beyond this.
        match self.send_one_now(peer, channel, message)? {
            call::SendNow::Done(_) => Ok(()),
            call::SendNow::Blocked(m) => Box::pin(call::send(
                &self.shared,
                peer,
                channel,
                Priority::Normal,
                std::iter::once(m),
                Flush::Batched,
            ))
            .await
            .map(|_| ()),
        }
    }

    /// Sends many one-way messages in order, under one lock: the cheapest
    /// way to send small messages fast. Waits while the send buffer is
    /// full; on error, the messages before the failing one were queued.
    pub async fn send_many(
        &self,
        peer: NodeId,
        channel: u16,
        messages: impl IntoIterator<Item = Bytes, IntoIter: Send>,
    ) -> Result<(), SendError> {
        call::send(
            &self.shared,
            peer,
            channel,
            Priority::Normal,
            messages.into_iter(),
            Flush::Batched,
        )
        .await
        .map(|_| ())
    }

    /// Sends a one-way message with a priority. A high-priority message
    /// travels on its own stream, leaves at once, and is handed to the
    /// receiver's [`recv`](Endpoint::recv) before normal ones waiting there
    /// (a normal message waits at most the receiver's aging bound behind
    /// high ones). Order is kept per channel *and* priority.
    pub async fn send_with(
        &self,
        peer: NodeId,
        channel: u16,
        message: Bytes,
        priority: Priority,
    ) -> Result<(), SendError> {
        let flush = match priority {
            Priority::High => Flush::Now,
            Priority::Normal => Flush::Batched,
        };
        call::send(
            &self.shared,
            peer,
            channel,
            priority,
            std::iter::once(message),
            flush,
        )
        .await
        .map(|_| ())
    }

    /// Sends a one-way message if there is room now; otherwise hands it back.
    pub fn try_send(&self, peer: NodeId, channel: u16, message: Bytes) -> Result<(), TrySendError> {
        match self.send_one_now(peer, channel, message)? {
            call::SendNow::Done(_) => Ok(()),
            call::SendNow::Blocked(m) => Err(TrySendError::Full(m)),
        }
    }

    /// Queues one normal message if it fits now (the fast path of `send`
    /// and `try_send`).
    fn send_one_now(
        &self,
        peer: NodeId,
        channel: u16,
        message: Bytes,
    ) -> Result<call::SendNow, SendError> {
        let ch = call::check_channel(&self.shared, channel)?;
        call::send_one_now(&self.shared, peer, ch, message)
    }

    /// Serves requests with `handler` (replacing any earlier one). Each
    /// request runs on the endpoint's worker pools, at most
    /// `max_concurrent_requests` at once, in the order the scheduler picks
    /// (hr-net's priorities, round robin between peers and between
    /// recovery groups). Groups with a handler of their own
    /// ([`Endpoint::serve_group`]) use that one.
    ///
    /// The handler's future returns the reply (`Bytes`), or a
    /// `Result<Bytes, E>` whose error (any `E: Into<HandlerError>`) reaches
    /// the caller as [`CallError::Remote`]. A handler that panics is
    /// caught: the caller gets [`RemoteError::Panicked`](crate::RemoteError::Panicked)
    /// and the endpoint carries on.
    ///
    /// Requests that arrive before `serve` (callers reach the endpoint as
    /// soon as it is bound) wait for it, to their deadline, during the
    /// endpoint's first 2 s; after that a request with no handler is
    /// answered [`RemoteError::NoHandler`](crate::RemoteError::NoHandler)
    /// at once.
    pub fn serve<H: Handler>(&self, handler: H) {
        self.shared.server.set_handler(Arc::new(handler));
        crate::server::Server::dispatch(&self.shared);
    }

    /// The next one-way message, in order per peer, channel and priority.
    /// `None` once the endpoint is shut down.
    pub async fn recv(&self) -> Option<Incoming> {
        let mut one = Vec::with_capacity(1);
        if self.recv_many(&mut one, 1).await == 0 {
            return None;
        }
        one.pop()
    }

    /// Waits for one-way messages and appends up to `limit` of them to
    /// `buf` (in order per peer, channel and priority); returns how many.
    /// `0` once the endpoint is shut down (or when `limit` is 0). One lock
    /// for the whole batch: the way to keep up with a peer sending small
    /// messages fast.
    ///
    /// ```no_run
    /// # async fn f(ep: surelink::Endpoint) {
    /// let mut batch = Vec::new();
    /// while ep.recv_many(&mut batch, 256).await > 0 {
    ///     for m in batch.drain(..) {
    ///         println!("{} bytes from {}", m.body.len(), m.peer);
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn recv_many(&self, buf: &mut Vec<Incoming>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        self.recv_with(|| self.take_incoming(buf, limit)).await
    }

    /// Waits for one-way messages and appends them to `buf` as they
    /// arrived: a frame's messages together (one peer, one channel, one
    /// priority; read as slices of one buffer, without an allocation or a
    /// reference count per message), or single messages. Takes whole
    /// entries until `limit` messages (at least one entry, which may hold
    /// more); returns how many messages. `0` once the endpoint is shut
    /// down (or when `limit` is 0). The cheapest way to take a stream of
    /// small messages; order is as with [`Endpoint::recv_many`].
    ///
    /// ```no_run
    /// # async fn f(ep: surelink::Endpoint) {
    /// let mut batches = Vec::new();
    /// while ep.recv_batches(&mut batches, 1024).await > 0 {
    ///     for b in batches.drain(..) {
    ///         for body in b.iter() {
    ///             println!("{} bytes from {} on {}", body.len(), b.peer(), b.channel());
    ///         }
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn recv_batches(&self, buf: &mut Vec<IncomingBatch>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        self.recv_with(|| {
            let now = self.shared.clock.now_cached();
            let (n, reopened) = self.shared.incoming.take_batches(now, buf, limit);
            self.reopen(reopened);
            n
        })
        .await
    }

    /// The receivers' waiting loop around `take` (which returns how many
    /// messages it took).
    async fn recv_with(&self, mut take: impl FnMut() -> usize) -> usize {
        loop {
            if self.shared.closed.load(Ordering::Relaxed) {
                return 0;
            }
            // Fast path first: registering for a wake-up takes a lock, and a
            // busy receiver almost always finds messages waiting.
            let n = take();
            if n > 0 {
                return n;
            }
            let notified = self.shared.incoming.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Re-check after registering: a message queued in between would
            // otherwise wait for the next one.
            if self.shared.closed.load(Ordering::Relaxed) {
                return 0;
            }
            let n = take();
            if n > 0 {
                return n;
            }
            notified.await;
        }
    }

    fn take_incoming(&self, buf: &mut Vec<Incoming>, limit: usize) -> usize {
        let now = self.shared.clock.now_cached();
        let (n, reopened) = self.shared.incoming.take(now, buf, limit);
        self.reopen(reopened);
        n
    }

    /// Sessions that stopped taking one-way messages for lack of room
    /// take the ones that waited in them now (the node's current one: an
    /// ended session has nothing more to hand over).
    fn reopen(&self, nodes: Vec<NodeId>) {
        for node in nodes {
            if let Some(s) = self.shared.session(node) {
                s.poke(&self.shared);
            }
        }
    }
}
