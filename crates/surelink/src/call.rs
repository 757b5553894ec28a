//! Calls and one-way sends from the application's side.
//!
//! A call is one entry in its session's call table (in the core): the core
//! sends the request, re-sends it with the same id when it has no reply
//! within its re-send timeout (on the priority lane, after suspecting the
//! path the original is stuck on), and fails it when its deadline passes —
//! all on the session's own timer. The caller only waits for the outcome;
//! no timer is armed per call, and the reply reaches the caller straight
//! from the reader that received it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::oneshot;

use surelink_proto::rpc::{CallOptions, Priority};
use surelink_proto::{CallId, ChannelId, MessageId, NodeId};

use crate::error::{CallError, SendError};
use crate::session::{Output, Reading, SessionHandle};
use crate::shared::Shared;

/// Refuses a channel the core does not have (before any session work).
pub(crate) fn check_channel(shared: &Shared, channel: u16) -> Result<ChannelId, SendError> {
    if u32::from(channel) >= shared.config.core.max_channels {
        return Err(SendError::Core(
            surelink_proto::SendError::ChannelOutOfRange {
                channel,
                max: shared.config.core.max_channels,
            },
        ));
    }
    Ok(ChannelId(channel))
}

/// Forgets the call in its session if the caller stops waiting.
struct Pending {
    session: Arc<SessionHandle>,
    call: CallId,
    done: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.session.cancel_call(self.call);
        }
    }
}

/// How one attempt to queue a call went.
enum Attempt {
    Sent(CallId, usize),
    Full(Bytes),
    Ended(Bytes),
    Failed(surelink_proto::SendError),
}

/// The reply of a call made with [`call`].
struct Reply {
    rx: oneshot::Receiver<Result<Bytes, CallError>>,
    pending: Pending,
}

impl Future for Reply {
    type Output = Result<Bytes, CallError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                self.pending.done = true;
                Poll::Ready(r.unwrap_or(Err(CallError::Send(SendError::Closed))))
            }
        }
    }
}

/// Runs its closure once: when the request enters the session, or when
/// the call ends (or is dropped, polled or not) before it did.
pub(crate) struct OnQueued<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnQueued<F> {
    pub(crate) fn new(f: F) -> Self {
        OnQueued(Some(f))
    }

    fn fire(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl<F: FnOnce()> Drop for OnQueued<F> {
    fn drop(&mut self) {
        self.fire();
    }
}

/// Makes a call (see the module docs); `queued` runs once the request is
/// in its session's send queue, or once the call failed or was dropped
/// before that.
pub(crate) async fn call(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: u16,
    mut body: Bytes,
    opts: &CallOptions,
    mut queued: OnQueued<impl FnOnce()>,
) -> Result<Bytes, CallError> {
    let started = Instant::now();
    let channel = check_channel(shared, channel)?;
    // Activation counts a call waiting past the SLA as slow.
    let _waiting = shared.note_call_waiting(peer, started);
    let deadline = tokio::time::Instant::now() + opts.timeout;
    let reply = loop {
        let session = shared.session_for(peer)?;
        session.note_traffic(shared);
        let (tx, rx) = oneshot::channel();
        let attempt = session.with_output(shared, Reading::Fresh, |g, now| {
            let a = if g.is_ended() {
                Attempt::Ended(body)
            } else {
                let len = body.len();
                match g.call(now, channel, body, opts, tx) {
                    Ok(id) => Attempt::Sent(id, len),
                    Err(surelink_proto::SendError::Full { message, .. }) => Attempt::Full(message),
                    Err(e) => Attempt::Failed(e),
                }
            };
            // A high-priority call leaves at once; others at once when the
            // session is idle, else with the calls queued alongside.
            let out = match a {
                Attempt::Sent(_, len) if opts.priority != Priority::High => Output::Batched(len),
                _ => Output::Now,
            };
            (a, out)
        });
        match attempt {
            Attempt::Sent(call, _) => {
                queued.fire();
                break Reply {
                    rx,
                    pending: Pending {
                        session,
                        call,
                        done: false,
                    },
                };
            }
            Attempt::Full(b) => {
                let len = b.len() + 64;
                body = b;
                if tokio::time::timeout_at(deadline, session.wait_for_room(len))
                    .await
                    .is_err()
                {
                    shared.stats.call_done(None);
                    return Err(CallError::Timeout);
                }
            }
            // The session ended under us: the next attempt opens a new one.
            Attempt::Ended(b) => body = b,
            Attempt::Failed(e) => return Err(CallError::Send(SendError::Core(e))),
        }
    };
    let r = reply.await;
    let rtt = r.as_ref().ok().map(|_| started.elapsed());
    if let Some(rtt) = rtt {
        shared.note_peer_rtt(peer, rtt);
    }
    shared.stats.call_done(rtt);
    r
}

/// When a one-way message is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flush {
    /// At once (high priority).
    Now,
    /// At once if the session is idle; otherwise with the session's next
    /// write, batched with what queues meanwhile.
    Batched,
}

/// What a send that could not wait found.
pub(crate) enum SendNow {
    /// Queued (the last message's id).
    Done(Option<MessageId>),
    /// The send buffer is full (or the session ended under us): the
    /// message not queued, to be sent by the waiting path.
    Blocked(Bytes),
}

/// Queues one-way messages without waiting: the fast path of every send.
/// Stops at the first message that does not fit and hands it back.
pub(crate) fn send_now(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: ChannelId,
    priority: Priority,
    msgs: &mut impl Iterator<Item = Bytes>,
    flush: Flush,
) -> Result<SendNow, SendError> {
    let session = shared.session_for(peer)?;
    send_now_on(shared, &session, channel, priority, msgs, flush)
}

/// One normal one-way message: staged without the session's lock when a
/// flush is coming anyway (see `session/stage.rs`), else as [`send_now`].
pub(crate) fn send_one_now(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: ChannelId,
    message: Bytes,
) -> Result<SendNow, SendError> {
    let message = match shared.offer(peer, channel, message) {
        Ok(()) => return Ok(SendNow::Done(None)),
        Err(m) => m,
    };
    let session = shared.session_for(peer)?;
    send_now_on(
        shared,
        &session,
        channel,
        Priority::Normal,
        &mut std::iter::once(message),
        Flush::Batched,
    )
}

/// [`send_now`] on a session already looked up.
fn send_now_on(
    shared: &Arc<Shared>,
    session: &Arc<SessionHandle>,
    channel: ChannelId,
    priority: Priority,
    msgs: &mut impl Iterator<Item = Bytes>,
    flush: Flush,
) -> Result<SendNow, SendError> {
    session.note_traffic(shared);
    session.with_output(shared, Reading::Cached, |g, now| {
        // What was staged goes before these.
        let drained = session.drain_stage(g, shared, now);
        let mut r = Ok(SendNow::Done(None));
        let mut last = None;
        let mut queued = 0usize;
        let mut count = 0u64;
        for m in msgs.by_ref() {
            if g.is_ended() {
                // The session ended under us: the waiting path opens a new one.
                r = Ok(SendNow::Blocked(m));
                break;
            }
            if !drained && priority == Priority::Normal {
                // Staged messages wait for room: a smaller one must not
                // pass them.
                r = Ok(SendNow::Blocked(m));
                break;
            }
            let len = m.len();
            match g.send(now, channel, priority, m) {
                Ok(id) => {
                    last = Some(id);
                    queued += len;
                    count += 1;
                }
                Err(surelink_proto::SendError::Full { message, .. }) => {
                    r = Ok(SendNow::Blocked(message));
                    break;
                }
                Err(e) => {
                    r = Err(SendError::Core(e));
                    break;
                }
            }
        }
        if let Ok(SendNow::Done(l)) = &mut r {
            *l = last;
        }
        shared.stats.messages_sent(count);
        let out = match (count, flush) {
            (0, _) => Output::Skip,
            (_, Flush::Now) => Output::Now,
            (_, Flush::Batched) => Output::Batched(queued),
        };
        (r, out)
    })
}

/// Queues one-way messages, waiting while the session's send buffer is
/// full. `msgs` are sent in order; on success all were queued.
pub(crate) async fn send(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: u16,
    priority: Priority,
    mut msgs: impl Iterator<Item = Bytes> + Send,
    flush: Flush,
) -> Result<Option<MessageId>, SendError> {
    let channel = check_channel(shared, channel)?;
    let mut last = None;
    loop {
        match send_now(shared, peer, channel, priority, &mut msgs, flush)? {
            SendNow::Done(l) => return Ok(l.or(last)),
            SendNow::Blocked(m) => {
                // Slow path (boxed, so the common case's future stays small).
                let l = Box::pin(send_waiting(shared, peer, channel, priority, m, flush)).await?;
                last = l.or(last);
            }
        }
    }
}

/// Waits for room, then queues `m` (re-resolving the session if it ended).
async fn send_waiting(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: ChannelId,
    priority: Priority,
    m: Bytes,
    flush: Flush,
) -> Result<Option<MessageId>, SendError> {
    let mut pending = Some(m);
    loop {
        if shared.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        let session = shared.session_for(peer)?;
        let len = pending.as_ref().map_or(0, Bytes::len);
        session.wait_for_room(len).await;
        let mut one = pending.take().into_iter();
        match send_now(shared, peer, channel, priority, &mut one, flush)? {
            SendNow::Done(l) => return Ok(l),
            SendNow::Blocked(m) => pending = Some(m),
        }
    }
}
