//! The client side of a session's calls: ids, deadlines, re-send timers and
//! hr-net's client state machine per call. The session sends and receives;
//! this table says what each call is waiting for and when it must act.
//!
//! Timers: one heap entry per call for its next wake-up (the earlier of its
//! re-send time and its deadline); entries of calls that finished or moved
//! are skipped when they surface, and the heap is rebuilt when stale
//! entries outnumber live ones, so its size stays proportional to the calls
//! outstanding.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use bytes::Bytes;
use rustc_hash::FxHashMap as HashMap;

use super::call::{AnyCall, Call, CallInput};
use super::Priority;
use crate::ids::{CallId, ChannelId, MessageId};
use crate::time::Time;

/// How a call is made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallOptions {
    /// The call fails with a timeout after this long.
    pub timeout: Duration,
    /// Without a reply for this long, the request is sent again (same id,
    /// on the priority lane, high priority unless `fixed_priority`), the
    /// wait doubling each time. `None`: never re-sent (the session still
    /// delivers it exactly once).
    pub resend_after: Option<Duration>,
    /// Priority of the first transmission.
    pub priority: Priority,
    /// Keep `priority` on re-sends (hr-net's synchronous transmission,
    /// which is never re-prioritised).
    pub fixed_priority: bool,
    /// Tell the server the remaining timeout, so it skips the request if it
    /// would start after the caller gave up.
    pub send_deadline: bool,
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
            send_deadline: true,
        }
    }

    /// The same with `priority`.
    pub fn with_priority(mut self, priority: Priority) -> CallOptions {
        self.priority = priority;
        self
    }

    /// The same with re-sends after `after` (`None`: never).
    pub fn with_resend_after(mut self, after: Option<Duration>) -> CallOptions {
        self.resend_after = after;
        self
    }

    /// The same, keeping the priority on re-sends.
    pub fn with_fixed_priority(mut self, fixed: bool) -> CallOptions {
        self.fixed_priority = fixed;
        self
    }
}

/// One outstanding call.
#[derive(Debug)]
pub(crate) struct Outstanding {
    pub(crate) state: AnyCall,
    pub(crate) channel: ChannelId,
    /// Kept for re-sends (shares the caller's buffer).
    pub(crate) body: Bytes,
    pub(crate) deadline: Time,
    pub(crate) resend_at: Option<Time>,
    pub(crate) backoff: Duration,
    /// The last transmission, once one was queued.
    pub(crate) msg: Option<MessageId>,
    pub(crate) send_deadline: bool,
}

impl Outstanding {
    fn wake(&self) -> Time {
        self.resend_at
            .map_or(self.deadline, |r| r.min(self.deadline))
    }
}

/// What a due call needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Its deadline passed.
    Expired,
    /// Its re-send time came.
    Resend,
}

/// The calls of one session.
#[derive(Debug, Default)]
pub(crate) struct CallTable {
    last_id: u64,
    calls: HashMap<CallId, Outstanding>,
    timers: BinaryHeap<Reverse<(Time, CallId)>>,
}

impl CallTable {
    /// Registers a call (INIT → SELECT); the session queues its request
    /// and then reports [`CallTable::sent`] or [`CallTable::send_failed`].
    pub(crate) fn open(
        &mut self,
        now: Time,
        channel: ChannelId,
        body: Bytes,
        opts: &CallOptions,
    ) -> CallId {
        self.last_id += 1;
        let id = CallId(self.last_id);
        let call = Call::new(id.0, opts.priority, !opts.fixed_priority).select();
        let o = Outstanding {
            state: AnyCall::Selected(call),
            channel,
            body,
            deadline: now + opts.timeout,
            resend_at: opts.resend_after.map(|d| now + d),
            backoff: opts.resend_after.unwrap_or(Duration::ZERO),
            msg: None,
            send_deadline: opts.send_deadline,
        };
        self.timers.push(Reverse((o.wake(), id)));
        self.calls.insert(id, o);
        id
    }

    /// The request of `id` was queued as message `msg` (SELECT → SEND).
    pub(crate) fn sent(&mut self, id: CallId, msg: MessageId) {
        if let Some(o) = self.calls.get_mut(&id) {
            o.msg = Some(msg);
            if let Ok(s) = o.state.apply(CallInput::Send) {
                o.state = s;
            }
        }
    }

    /// The request of `id` could not be queued (SELECT → RESEND, priority
    /// kept); it is tried again at its next re-send time.
    pub(crate) fn send_failed(&mut self, id: CallId) {
        if let Some(o) = self.calls.get_mut(&id) {
            if let Ok(s) = o.state.apply(CallInput::SendError) {
                o.state = s;
            }
        }
    }

    /// Removes a call: answered, failed or given up by the caller.
    pub(crate) fn remove(&mut self, id: CallId) -> Option<Outstanding> {
        let o = self.calls.remove(&id)?;
        self.compact();
        Some(o)
    }

    /// A reply arrived for `id` (SEND → DONE). `None` if the call is not
    /// outstanding (answered before, given up, or never made).
    pub(crate) fn answered(&mut self, id: CallId) -> Option<Outstanding> {
        let mut o = self.remove(id)?;
        if let Ok(s) = o.state.apply(CallInput::Reply) {
            o.state = s;
        }
        Some(o)
    }

    /// The server has the request (STILL_RUNNING): wait a full period more
    /// before sending again.
    pub(crate) fn still_running(&mut self, now: Time, id: CallId) {
        if let Some(o) = self.calls.get_mut(&id) {
            if o.resend_at.is_some() {
                o.resend_at = Some(now + o.backoff);
                self.timers.push(Reverse((o.wake(), id)));
            }
        }
    }

    /// Takes the next call whose timer is due at `now`, if any.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<(CallId, Due)> {
        while let Some(&Reverse((t, id))) = self.timers.peek() {
            if t > now {
                return None;
            }
            self.timers.pop();
            let Some(o) = self.calls.get(&id) else {
                continue; // finished meanwhile
            };
            if o.wake() != t {
                continue; // moved; a newer entry exists
            }
            return Some((
                id,
                if now >= o.deadline {
                    Due::Expired
                } else {
                    Due::Resend
                },
            ));
        }
        None
    }

    /// Moves a call to RESEND (TIMEOUT: high priority unless fixed) and on
    /// to SELECT, doubling its re-send wait; returns its priority and body
    /// for the re-send.
    pub(crate) fn begin_resend(
        &mut self,
        now: Time,
        id: CallId,
    ) -> Option<(Priority, ChannelId, Bytes, Option<MessageId>, Time, bool)> {
        let o = self.calls.get_mut(&id)?;
        let state = match o.state {
            AnyCall::Sent(_) => o.state.apply(CallInput::Timeout).ok()?,
            s => s,
        };
        let state = state.apply(CallInput::Select).ok()?;
        o.state = state;
        o.backoff = o.backoff.saturating_mul(2);
        o.resend_at = Some(now + o.backoff);
        self.timers.push(Reverse((o.wake(), id)));
        Some((
            state.priority(),
            o.channel,
            o.body.clone(),
            o.msg,
            o.deadline,
            o.send_deadline,
        ))
    }

    /// The earliest timer.
    pub(crate) fn next_timeout(&self) -> Option<Time> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Calls outstanding.
    pub(crate) fn len(&self) -> usize {
        self.calls.len()
    }

    /// Removes every call (the session ended): ids and times sent.
    pub(crate) fn drain(&mut self) -> Vec<(CallId, u32)> {
        let mut ids: Vec<(CallId, u32)> = self
            .calls
            .iter()
            .map(|(&id, o)| (id, o.state.sends()))
            .collect();
        ids.sort_unstable();
        self.calls.clear();
        self.timers.clear();
        ids
    }

    /// Rebuilds the timer heap when stale entries outnumber live calls.
    fn compact(&mut self) {
        if self.timers.len() > 64 && self.timers.len() > 4 * self.calls.len() {
            self.timers = self
                .calls
                .iter()
                .map(|(&id, o)| Reverse((o.wake(), id)))
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{SessionId, StreamId};

    fn ms(m: u64) -> Time {
        Time::from_millis(m)
    }

    fn msg(seq: u64) -> MessageId {
        MessageId {
            session: SessionId(1),
            stream: StreamId(5),
            seq,
        }
    }

    #[test]
    fn resend_timers_double_and_deadlines_expire() {
        let mut t = CallTable::default();
        let opts = CallOptions::new(Duration::from_millis(100))
            .with_resend_after(Some(Duration::from_millis(10)));
        let id = t.open(ms(0), ChannelId(0), Bytes::new(), &opts);
        t.sent(id, msg(0));
        assert_eq!(t.next_timeout(), Some(ms(10)));
        assert_eq!(t.pop_due(ms(9)), None);
        assert_eq!(t.pop_due(ms(10)), Some((id, Due::Resend)));
        let (prio, ..) = t.begin_resend(ms(10), id).unwrap();
        assert_eq!(prio, Priority::High, "a timed-out call is promoted");
        t.sent(id, msg(1));
        assert_eq!(t.next_timeout(), Some(ms(30)));
        // STILL_RUNNING pushes the re-send a full period out.
        t.still_running(ms(20), id);
        assert_eq!(t.pop_due(ms(30)), None, "the old timer is stale");
        assert_eq!(t.pop_due(ms(40)), Some((id, Due::Resend)));
        t.begin_resend(ms(40), id).unwrap();
        assert_eq!(t.pop_due(ms(100)), Some((id, Due::Expired)));
        assert!(t.remove(id).is_some());
        assert_eq!(t.pop_due(ms(1000)), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn answered_calls_leave_and_unknown_replies_are_ignored() {
        let mut t = CallTable::default();
        let opts = CallOptions::new(Duration::from_secs(1)).with_fixed_priority(true);
        let a = t.open(ms(0), ChannelId(1), Bytes::new(), &opts);
        let b = t.open(ms(0), ChannelId(1), Bytes::new(), &opts);
        assert_ne!(a, b);
        t.sent(a, msg(0));
        assert!(t.answered(a).is_some());
        assert!(t.answered(a).is_none(), "a second reply finds nothing");
        t.send_failed(b);
        let (prio, ..) = t.begin_resend(ms(250), b).unwrap();
        assert_eq!(prio, Priority::Normal, "fixed priority is kept");
        assert_eq!(t.drain(), vec![(b, 0)], "never sent");
        // Many finished calls do not grow the heap without bound.
        for _ in 0..10_000 {
            let id = t.open(ms(0), ChannelId(0), Bytes::new(), &opts);
            t.remove(id);
        }
        assert!(t.timers.len() <= 64 * 4 + 1);
    }
}
