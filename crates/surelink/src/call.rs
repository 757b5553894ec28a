//! Calls: the client side of hr-net's message state machine on a real
//! session.
//!
//! A call is sent once; if no reply comes within its re-send timeout it is
//! sent again with the same id — RESEND, high priority unless the call
//! asked for a fixed priority — on the session's priority lane (its own
//! channel, so it does not wait behind the stalled original), after telling
//! the session that the original is overdue (which suspects the path it is
//! stuck on and moves that path's in-flight messages to the others). The
//! timeout doubles per re-send. The server runs each id at most once. The
//! call fails with [`CallError::Timeout`] only when its overall deadline
//! passes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use surelink_proto::rpc::{Call, Priority, Resend, Sent};
use surelink_proto::{ChannelId, MessageId, NodeId};

use crate::driver::{self, Flush, PendingCall, Shared};
use crate::error::{CallError, SendError};
use crate::rpc;

/// How a call is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallOptions {
    /// The call fails with [`CallError::Timeout`] after this long.
    pub timeout: Duration,
    /// Without a reply for this long, the request is sent again (same id,
    /// high priority, doubling the wait each time). `None`: never re-sent
    /// (the session still delivers it exactly once).
    pub resend_after: Option<Duration>,
    /// Priority of the first transmission.
    pub priority: Priority,
    /// Keep `priority` on re-sends (hr-net's synchronous transmission,
    /// which is never re-prioritised).
    pub fixed_priority: bool,
}

impl CallOptions {
    /// A normal-priority call with deadline `timeout`, re-sent after a
    /// quarter of it.
    pub fn new(timeout: Duration) -> CallOptions {
        CallOptions {
            timeout,
            resend_after: Some((timeout / 4).max(Duration::from_millis(1))),
            priority: Priority::Normal,
            fixed_priority: false,
        }
    }

    /// The same with `priority`.
    pub fn with_priority(mut self, priority: Priority) -> CallOptions {
        self.priority = priority;
        self
    }
}

/// The session channel of the priority lane: the last one.
pub(crate) fn lane(shared: &Shared) -> u16 {
    u16::try_from(shared.config.core.max_channels.saturating_sub(1)).unwrap_or(u16::MAX)
}

/// Refuses the lane as a user channel.
pub(crate) fn check_channel(shared: &Shared, channel: u16) -> Result<(), SendError> {
    if channel >= lane(shared) {
        return Err(SendError::ReservedChannel {
            channel,
            lane: lane(shared),
        });
    }
    Ok(())
}

/// Where the call stands between transmissions.
enum State {
    Sent(Call<Sent>, MessageId),
    Resend(Call<Resend>),
}

/// Makes a call (see the module docs).
pub(crate) async fn call(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: u16,
    request: Bytes,
    opts: &CallOptions,
) -> Result<Bytes, CallError> {
    check_channel(shared, channel)?;
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + opts.timeout;
    let (tx, mut rx) = oneshot::channel();
    let id = shared.next_call_id();
    let call = Call::new(id, opts.priority, !opts.fixed_priority).select();
    let high = call.priority() == Priority::High;
    // The call is registered under the same lock that queues and writes
    // the request, so the reply cannot arrive before it is expected.
    let register = move |g: &mut driver::Inner, mid: MessageId| {
        g.calls.insert(
            id,
            PendingCall {
                peer,
                session: mid.session,
                tx,
            },
        );
    };
    let transport = if high { lane(shared) } else { channel };
    let flags = if high { rpc::FLAG_HIGH } else { 0 };
    let mut send = std::pin::pin!(driver::send_message(
        shared,
        peer,
        ChannelId(transport),
        rpc::call_prefix(rpc::REQUEST, flags, channel, id),
        request.clone(),
        Flush::Now,
        register,
    ));
    // Queueing nearly always completes at once; only a full send buffer
    // makes it wait, and only then is a timer needed for it.
    let first = {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        send.as_mut().poll(&mut cx)
    };
    let sent = match first {
        std::task::Poll::Ready(r) => Ok(r),
        std::task::Poll::Pending => tokio::time::timeout_at(deadline, send).await,
    };
    let result = match sent {
        Err(_) => Err(CallError::Timeout),
        Ok(Err(e)) => Err(CallError::Send(e)),
        Ok(Ok(mid)) => {
            let state = State::Sent(call.send(), mid);
            wait(
                shared, peer, channel, &request, opts, state, &mut rx, deadline,
            )
            .await
        }
    };
    if result.is_err() {
        shared.lock().calls.remove(&id);
    }
    shared
        .stats
        .call_done(result.as_ref().ok().map(|_| start.elapsed()));
    result
}

/// Waits for the reply, re-sending on timeouts, until the deadline.
#[allow(clippy::too_many_arguments)]
async fn wait(
    shared: &Arc<Shared>,
    peer: NodeId,
    channel: u16,
    request: &Bytes,
    opts: &CallOptions,
    mut state: State,
    rx: &mut oneshot::Receiver<Result<Bytes, CallError>>,
    deadline: tokio::time::Instant,
) -> Result<Bytes, CallError> {
    let mut backoff = opts.resend_after;
    loop {
        let resend_at = backoff.map(|b| tokio::time::Instant::now() + b);
        tokio::select! {
            r = &mut *rx => {
                return match r {
                    Ok(r) => r,
                    Err(_) => Err(CallError::Send(SendError::Closed)),
                };
            }
            () = tokio::time::sleep_until(deadline) => return Err(CallError::Timeout),
            () = sleep_until_opt(resend_at) => {}
        }
        // TIMEOUT (or an earlier SEND ERROR): send again.
        let resend = match state {
            State::Sent(c, mid) => {
                let now = shared.now();
                shared.lock().core.handle_message_overdue(now, peer, mid);
                c.timeout()
            }
            State::Resend(c) => c,
        };
        let selected = resend.select();
        let flags = rpc::FLAG_RESEND
            | if selected.priority() == Priority::High {
                rpc::FLAG_HIGH
            } else {
                0
            };
        let id = selected.id();
        let sent = tokio::time::timeout_at(
            deadline,
            driver::send_message(
                shared,
                peer,
                ChannelId(lane(shared)),
                rpc::call_prefix(rpc::REQUEST, flags, channel, id),
                request.clone(),
                Flush::Now,
                |_, _| {},
            ),
        )
        .await;
        state = match sent {
            Err(_) => return Err(CallError::Timeout),
            Ok(Ok(mid)) => {
                shared.stats.call_resent();
                State::Sent(selected.send(), mid)
            }
            Ok(Err(SendError::Closed)) => return Err(CallError::Send(SendError::Closed)),
            Ok(Err(_)) => State::Resend(selected.send_failed()),
        };
        backoff = backoff.map(|b| b * 2);
    }
}

async fn sleep_until_opt(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
