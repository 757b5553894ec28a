//! Calls and their answers on a session: the request goes out on its
//! channel's request stream (or the lane), re-sends on the lane with the
//! same id; the server's reply, error or STILL_RUNNING goes back on the
//! reply stream (or the reply lane for lane requests).

use std::time::Duration;

use bytes::Bytes;

use super::{PendingReply, Prefix, Session};
use crate::error::SendError;
use crate::event::Event;
use crate::ids::{CallId, ChannelId, StreamId};
use crate::rpc::calls::{CallOptions, Due};
use crate::rpc::header::{self, RemoteError, ReplyStatus, RequestHeader};
use crate::rpc::{CallFailure, Priority};
use crate::time::Time;

/// Why [`Session::complete`] did not send an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompleteError {
    /// The call was never handed out by this session, or was completed
    /// already.
    #[error("call {0} is not an outstanding request of this session")]
    Unknown(CallId),
    /// The session ended; the caller learns that from its side.
    #[error("the session ended before call {0} completed")]
    SessionEnded(CallId),
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Session {
    /// Makes a call: queues the request and registers the call with its
    /// deadline and re-send timer. The reply (or the failure) comes as
    /// [`Event::CallDone`] with the returned id.
    ///
    /// When the send buffer is full the body comes back in
    /// [`SendError::Full`] and no call is registered.
    pub fn call(
        &mut self,
        now: Time,
        channel: ChannelId,
        body: Bytes,
        opts: &CallOptions,
    ) -> Result<CallId, SendError> {
        self.tick(now);
        let stream = StreamId::request(channel).ok_or(SendError::ChannelOutOfRange {
            channel: channel.0,
            max: self.cfg.max_channels,
        })?;
        if u32::from(channel.0) >= self.cfg.max_channels {
            return Err(SendError::ChannelOutOfRange {
                channel: channel.0,
                max: self.cfg.max_channels,
            });
        }
        // Room first, so a refused call leaves nothing behind.
        if !self.has_room(body.len() + Prefix::MAX) || !self.pending_replies.is_empty() {
            return Err(SendError::Full {
                message: body,
                buffered: self.send.cache_bytes,
                limit: self.cfg.send_buffer,
            });
        }
        let id = self.calls.open(now, channel, body.clone(), opts);
        let high = opts.priority == Priority::High;
        let h = RequestHeader {
            flags: if high { header::FLAG_HIGH } else { 0 },
            channel,
            call: id,
            timeout_us: opts.send_deadline.then(|| micros(opts.timeout)),
        };
        let (stream, lane) = if high {
            (StreamId::REQUEST_LANE, true)
        } else {
            (stream, false)
        };
        match self.push_message(stream, header::request_prefix(lane, &h), body, false) {
            Ok(m) => {
                self.calls.sent(id, m);
                self.stats.calls += 1;
                Ok(id)
            }
            Err(e) => {
                self.calls.remove(id);
                Err(e)
            }
        }
    }

    /// The caller gave up on `call` (dropped its future): a late reply is
    /// ignored. The request itself may still run.
    pub fn cancel_call(&mut self, call: CallId) -> bool {
        self.calls.remove(call).is_some()
    }

    /// Calls outstanding.
    pub fn calls_outstanding(&self) -> usize {
        self.calls.len()
    }

    /// Runs the call timers due at `now`: re-sends (TIMEOUT → RESEND →
    /// SELECT → SEND on the lane, after suspecting the path the last copy
    /// is stuck on) and expired deadlines.
    pub(super) fn call_timers(&mut self, now: Time) {
        while let Some((id, due)) = self.calls.pop_due(now) {
            match due {
                Due::Expired => {
                    let sends = self.calls.remove(id).map_or(0, |o| o.state.sends());
                    self.events.push_back(Event::CallDone {
                        peer: self.node,
                        session: self.id,
                        call: id,
                        sends,
                        result: Err(CallFailure::Timeout),
                    });
                }
                Due::Resend => self.resend(now, id),
            }
        }
    }

    fn resend(&mut self, now: Time, id: CallId) {
        let Some((priority, channel, body, last, deadline, send_deadline)) =
            self.calls.begin_resend(now, id)
        else {
            return;
        };
        // hr-net: RESEND → SELECT another path. The original may sit on a
        // stalled path: suspect it, so the copy (and the original) avoid it.
        if let Some(m) = last {
            self.handle_message_overdue(now, m);
        }
        let mut flags = header::FLAG_RESEND;
        if priority == Priority::High {
            flags |= header::FLAG_HIGH;
        }
        let h = RequestHeader {
            flags,
            channel,
            call: id,
            timeout_us: send_deadline.then(|| micros(deadline.saturating_since(now))),
        };
        let prefix = header::request_prefix(true, &h);
        match self.push_message(StreamId::REQUEST_LANE, prefix, body, false) {
            Ok(m) => {
                self.calls.sent(id, m);
                self.stats.calls_resent += 1;
            }
            // Tried again at the next re-send time.
            Err(_) => self.calls.send_failed(id),
        }
    }

    /// Answers an admitted request: `Ok` with the reply, or an error the
    /// caller receives typed. The reply is queued before any new message;
    /// if the send buffer is full it waits in the session (it is owed) and
    /// goes out as soon as acknowledgements free room.
    pub fn complete(
        &mut self,
        now: Time,
        call: CallId,
        result: Result<Bytes, RemoteError>,
    ) -> Result<(), CompleteError> {
        self.tick(now);
        if self.ended.is_some() {
            return Err(CompleteError::SessionEnded(call));
        }
        let Some(lane) = self.serve.admitted_on_lane(call) else {
            return Err(CompleteError::Unknown(call));
        };
        let stream = if lane {
            StreamId::REPLY_LANE
        } else {
            StreamId::REPLY
        };
        let (prefix, body) = match &result {
            Ok(reply) => (
                header::reply_prefix(call, &ReplyStatus::Ok).0,
                reply.clone(),
            ),
            Err(e) => header::reply_prefix(call, &ReplyStatus::Error(e.clone())),
        };
        self.serve.finish(call, result.ok());
        self.pending_reply_bytes += (prefix.as_slice().len() + body.len()) as u64;
        self.pending_replies.push_back(PendingReply {
            call,
            stream,
            prefix,
            body,
        });
        self.flush_pending_replies();
        Ok(())
    }

    /// Moves replies that waited for room into the send cache, in order.
    pub(super) fn flush_pending_replies(&mut self) {
        while let Some(r) = self.pending_replies.pop_front() {
            let len = (r.prefix.as_slice().len() + r.body.len()) as u64;
            self.pending_reply_bytes = self.pending_reply_bytes.saturating_sub(len);
            match self.push_message(r.stream, r.prefix, r.body, false) {
                Ok(m) => self.serve.reply_sent(r.call, m),
                Err(SendError::Full { message, .. }) => {
                    self.pending_reply_bytes += len;
                    self.pending_replies
                        .push_front(PendingReply { body: message, ..r });
                    return;
                }
                // Too large for the peer, or the session ended: the caller
                // learns from its own side (timeout or session end).
                Err(_) => {}
            }
        }
    }

    /// Bytes this session holds for its peer's calls beyond the send
    /// buffer and the reply cache: admitted requests and replies waiting
    /// for room (bounded by `call_bytes_per_peer`).
    pub fn call_bytes_held(&self) -> u64 {
        self.serve.admitted_bytes() + self.pending_reply_bytes
    }

    /// Whether a new request of `len` bytes may be admitted now: always
    /// when no request or reply of the peer's is outstanding (so one fits
    /// whatever the bound), else while it fits
    /// under `call_bytes_per_peer`. Counts a stop once.
    pub(super) fn call_room(&mut self, len: usize) -> bool {
        let idle = self.serve.admitted == 0 && self.pending_replies.is_empty();
        let fits = idle || self.call_bytes_held() + len as u64 <= self.cfg.call_bytes_per_peer;
        if !fits && !self.call_bound_hit {
            self.stats.call_bound_hits += 1;
        }
        self.call_bound_hit = !fits;
        fits
    }

    /// Answers a duplicate request on the reply lane: the cached reply, or
    /// STILL_RUNNING ("I have it; wait a full period more"). The first
    /// answer may be stuck on a stalled path: suspect it.
    pub(super) fn answer_duplicate(&mut self, call: CallId, reply: Option<Bytes>) {
        let now = self.now;
        if let Some(m) = self.serve.reply_msg(call) {
            self.handle_message_overdue(now, m);
        }
        let (prefix, body) = match reply {
            Some(r) => (header::reply_prefix(call, &ReplyStatus::Ok).0, r),
            None => header::reply_prefix(call, &ReplyStatus::StillRunning),
        };
        // Best effort: if there is no room, the caller asks again.
        if let Ok(m) = self.push_message(StreamId::REPLY_LANE, prefix, body, false) {
            self.serve.reply_sent(call, m);
        }
    }
}
