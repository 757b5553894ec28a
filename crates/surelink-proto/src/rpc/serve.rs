//! The server side of a session's calls: at most once per call, and the
//! answers to duplicates.
//!
//! A session is one incarnation of the caller, so a call id identifies a
//! request for the session's whole life. A duplicate — a re-send of a
//! request this server already has — is never handed out again:
//!
//! - admitted (queued at the scheduler or running): answered with
//!   STILL_RUNNING, and the session asks for it to be promoted to the head
//!   of the high queue if it still waits (hr-net: the caller is waiting);
//! - finished: answered from the reply cache with the same reply, or with
//!   STILL_RUNNING once the reply was evicted (the first reply is in the
//!   session's retransmit cache until the caller's application has it).
//!
//! The cache is bounded by entries and by bytes; ids of finished requests
//! are remembered (without their reply) up to `remember`, so an evicted
//! reply is still never re-executed within that window.

use std::collections::VecDeque;

use bytes::Bytes;
use rustc_hash::FxHashMap as HashMap;

use crate::ids::{CallId, MessageId};

/// Bounds of the server side, per session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServeLimits {
    pub(crate) reply_cache_entries: usize,
    pub(crate) reply_cache_bytes: usize,
    pub(crate) remember: usize,
}

#[derive(Debug)]
enum State {
    /// Handed out as a ticket; `lane`: it came on the request lane.
    Admitted { lane: bool },
    /// Finished; its reply while cached.
    Done(Option<Bytes>),
}

/// What to do with an arriving request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// New: hand out a ticket.
    New,
    /// Admitted earlier and not finished.
    Admitted,
    /// Finished: answer with this reply (`None`: evicted).
    Done(Option<Bytes>),
}

/// At-most-once bookkeeping of one session.
#[derive(Debug)]
pub(crate) struct ServeState {
    limits: ServeLimits,
    states: HashMap<CallId, State>,
    /// Finished ids, oldest first (for forgetting).
    finished: VecDeque<CallId>,
    /// Cached replies, oldest first.
    cache: VecDeque<CallId>,
    cache_bytes: usize,
    /// The message that carried each reply (a duplicate means it may be
    /// stuck on a stalled path).
    reply_msgs: HashMap<CallId, MessageId>,
    /// Tickets handed out and not completed.
    pub(crate) admitted: usize,
    pub(crate) executed: u64,
    pub(crate) duplicates: u64,
}

impl ServeState {
    pub(crate) fn new(limits: ServeLimits) -> ServeState {
        ServeState {
            limits,
            states: HashMap::default(),
            finished: VecDeque::new(),
            cache: VecDeque::new(),
            cache_bytes: 0,
            reply_msgs: HashMap::default(),
            admitted: 0,
            executed: 0,
            duplicates: 0,
        }
    }

    /// Classifies an arriving request; a new one is admitted (the caller
    /// hands out its ticket).
    pub(crate) fn arrive(&mut self, call: CallId, lane: bool) -> Arrival {
        match self.states.get(&call) {
            None => {
                self.states.insert(call, State::Admitted { lane });
                self.admitted += 1;
                self.executed += 1;
                Arrival::New
            }
            Some(State::Admitted { .. }) => {
                self.duplicates += 1;
                Arrival::Admitted
            }
            Some(State::Done(r)) => {
                self.duplicates += 1;
                Arrival::Done(r.clone())
            }
        }
    }

    /// Whether `call` was seen (admitted or finished, and not forgotten).
    pub(crate) fn knows(&self, call: CallId) -> bool {
        self.states.contains_key(&call)
    }

    /// Whether `call` is admitted and not finished; `Some(lane)`.
    pub(crate) fn admitted_on_lane(&self, call: CallId) -> Option<bool> {
        match self.states.get(&call) {
            Some(State::Admitted { lane }) => Some(*lane),
            _ => None,
        }
    }

    /// The request finished; `reply` is kept for duplicates (only a
    /// successful reply is worth repeating; an error is answered again as
    /// "still running" and its first answer is in flight).
    pub(crate) fn finish(&mut self, call: CallId, reply: Option<Bytes>) {
        if !matches!(self.states.get(&call), Some(State::Admitted { .. })) {
            return;
        }
        self.admitted -= 1;
        let reply = reply.filter(|r| {
            r.len() <= self.limits.reply_cache_bytes && self.limits.reply_cache_entries > 0
        });
        if let Some(r) = &reply {
            self.cache_bytes += r.len();
            self.cache.push_back(call);
        }
        self.states.insert(call, State::Done(reply));
        while self.cache.len() > self.limits.reply_cache_entries
            || self.cache_bytes > self.limits.reply_cache_bytes
        {
            let Some(old) = self.cache.pop_front() else {
                break;
            };
            if let Some(State::Done(r)) = self.states.get_mut(&old) {
                if let Some(r) = r.take() {
                    self.cache_bytes -= r.len();
                }
            }
        }
        self.finished.push_back(call);
        while self.finished.len() > self.limits.remember {
            let Some(old) = self.finished.pop_front() else {
                break;
            };
            if let Some(State::Done(Some(r))) = self.states.remove(&old) {
                self.cache_bytes -= r.len();
                self.cache.retain(|k| *k != old);
            }
            self.reply_msgs.remove(&old);
        }
    }

    /// The reply to `call` went out as `msg`.
    pub(crate) fn reply_sent(&mut self, call: CallId, msg: MessageId) {
        if self.states.contains_key(&call) {
            self.reply_msgs.insert(call, msg);
        }
    }

    /// The message that carried the reply to `call`, if it went out.
    pub(crate) fn reply_msg(&self, call: CallId) -> Option<MessageId> {
        self.reply_msgs.get(&call).copied()
    }

    /// Bytes of cached replies.
    #[cfg(test)]
    pub(crate) fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// Forgets everything (the session ended).
    pub(crate) fn clear(&mut self) {
        self.states.clear();
        self.finished.clear();
        self.cache.clear();
        self.cache_bytes = 0;
        self.reply_msgs.clear();
        self.admitted = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(entries: usize, bytes: usize, remember: usize) -> ServeLimits {
        ServeLimits {
            reply_cache_entries: entries,
            reply_cache_bytes: bytes,
            remember,
        }
    }

    #[test]
    fn a_call_is_admitted_once_and_duplicates_get_its_reply() {
        let mut s = ServeState::new(limits(8, 1024, 16));
        assert_eq!(s.arrive(CallId(1), false), Arrival::New);
        assert_eq!(s.arrive(CallId(1), true), Arrival::Admitted);
        assert_eq!(s.admitted_on_lane(CallId(1)), Some(false));
        s.finish(CallId(1), Some(Bytes::from_static(b"r")));
        assert_eq!(s.admitted, 0);
        assert_eq!(
            s.arrive(CallId(1), true),
            Arrival::Done(Some(Bytes::from_static(b"r")))
        );
        assert_eq!((s.executed, s.duplicates), (1, 2));
        // Finishing twice, or a call never admitted, changes nothing.
        s.finish(CallId(1), None);
        s.finish(CallId(9), None);
        assert_eq!(s.admitted, 0);
    }

    #[test]
    fn the_cache_and_the_memory_of_ids_are_bounded() {
        let mut s = ServeState::new(limits(2, 10, 4));
        for i in 1..=6 {
            assert_eq!(s.arrive(CallId(i), false), Arrival::New);
            s.finish(CallId(i), Some(Bytes::from(vec![0; 4])));
        }
        assert!(s.cache_bytes() <= 10);
        // Evicted from the cache but remembered: never run again.
        assert_eq!(s.arrive(CallId(4), false), Arrival::Done(None));
        assert_eq!(
            s.arrive(CallId(6), false),
            Arrival::Done(Some(Bytes::from(vec![0; 4])))
        );
        // Forgotten beyond `remember`.
        assert_eq!(s.arrive(CallId(1), false), Arrival::New);
        // A reply larger than the cache is not kept.
        let mut s = ServeState::new(limits(2, 10, 4));
        s.arrive(CallId(1), false);
        s.finish(CallId(1), Some(Bytes::from(vec![0; 11])));
        assert_eq!(s.arrive(CallId(1), false), Arrival::Done(None));
    }
}
