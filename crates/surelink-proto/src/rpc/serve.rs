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
//! The cache is bounded by entries and by bytes; ids are remembered
//! (without their reply) in a ring indexed by the id itself, which a
//! caller numbers from 1 upwards: an id is forgotten when the id
//! `remember` (rounded up to a power of two) above it arrives, so an
//! evicted reply is still never re-executed within that window. Consecutive
//! calls touch neighbouring slots, so the bookkeeping stays in cache however
//! many calls went before (a hash map of the same ids missed the cache on
//! every eviction). A request still running when its slot is needed moves
//! aside to a small map; it is never forgotten.

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Handed out as a ticket; `lane`: it came on the request lane;
    /// `bytes`: the request's size, held until it is answered.
    Admitted { lane: bool, bytes: u32 },
    /// Finished (its reply, while cached, is in the reply cache).
    Done,
}

/// One remembered call.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The call (0: the slot is free; callers number from 1).
    call: u64,
    state: State,
    /// The message that carried its reply (a duplicate means it may be
    /// stuck on a stalled path).
    reply_msg: Option<MessageId>,
}

const FREE: Slot = Slot {
    call: 0,
    state: State::Done,
    reply_msg: None,
};

/// Slots allocated at first (the ring doubles up to its bound as ids grow).
const INITIAL_SLOTS: usize = 64;

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
    /// Indexed by call id modulo its length (a power of two).
    ring: Vec<Slot>,
    /// The ring's largest length.
    ring_max: usize,
    /// Admitted calls whose slot a newer id took.
    displaced: HashMap<CallId, Slot>,
    /// Cached replies, oldest first.
    cache: VecDeque<(CallId, Bytes)>,
    cache_bytes: usize,
    /// Tickets handed out and not completed.
    pub(crate) admitted: usize,
    /// Bytes of those requests.
    admitted_bytes: u64,
    pub(crate) executed: u64,
    pub(crate) duplicates: u64,
}

impl ServeState {
    pub(crate) fn new(limits: ServeLimits) -> ServeState {
        let ring_max = limits.remember.max(1).next_power_of_two();
        ServeState {
            limits,
            ring: Vec::new(),
            ring_max,
            displaced: HashMap::default(),
            cache: VecDeque::new(),
            cache_bytes: 0,
            admitted: 0,
            admitted_bytes: 0,
            executed: 0,
            duplicates: 0,
        }
    }

    fn index(&self, call: CallId) -> usize {
        // Truncation is the point: the low bits pick the slot.
        #[allow(clippy::cast_possible_truncation)]
        let low = call.0 as usize;
        low & (self.ring.len() - 1)
    }

    fn slot(&self, call: CallId) -> Option<&Slot> {
        if !self.ring.is_empty() {
            let s = &self.ring[self.index(call)];
            if s.call == call.0 {
                return Some(s);
            }
        }
        if self.displaced.is_empty() {
            None
        } else {
            self.displaced.get(&call)
        }
    }

    fn slot_mut(&mut self, call: CallId) -> Option<&mut Slot> {
        if !self.ring.is_empty() {
            let i = self.index(call);
            if self.ring[i].call == call.0 {
                return Some(&mut self.ring[i]);
            }
        }
        if self.displaced.is_empty() {
            None
        } else {
            self.displaced.get_mut(&call)
        }
    }

    /// Grows the ring (up to its bound) so `call` gets a slot of its own
    /// while ids are still small.
    fn grow_for(&mut self, call: CallId) {
        let want = usize::try_from(call.0.saturating_add(1))
            .unwrap_or(usize::MAX)
            .max(INITIAL_SLOTS)
            .checked_next_power_of_two()
            .unwrap_or(self.ring_max)
            .min(self.ring_max);
        if want <= self.ring.len() {
            return;
        }
        let old = std::mem::replace(&mut self.ring, vec![FREE; want]);
        for s in old.into_iter().filter(|s| s.call != 0) {
            // Distinct modulo the old length means distinct modulo a
            // multiple of it: no two land on one slot.
            let i = self.index(CallId(s.call));
            self.ring[i] = s;
        }
    }

    /// Records `call` as admitted, taking its slot from an older id.
    fn insert(&mut self, call: CallId, lane: bool, bytes: u32) {
        self.grow_for(call);
        let i = self.index(call);
        let old = std::mem::replace(
            &mut self.ring[i],
            Slot {
                call: call.0,
                state: State::Admitted { lane, bytes },
                reply_msg: None,
            },
        );
        // A running request is never forgotten; a finished one is, once
        // `remember` newer ids came.
        if old.call != 0 && matches!(old.state, State::Admitted { .. }) {
            self.displaced.insert(CallId(old.call), old);
        }
    }

    /// The cached reply of `call`, if still cached (newest first: only a
    /// duplicate, which is rare, looks).
    fn cached_reply(&self, call: CallId) -> Option<Bytes> {
        self.cache
            .iter()
            .rev()
            .find(|(c, _)| *c == call)
            .map(|(_, r)| r.clone())
    }

    /// Classifies an arriving request of `bytes` bytes; a new one is
    /// admitted (the caller hands out its ticket) and its bytes are held
    /// until it is answered.
    pub(crate) fn arrive(&mut self, call: CallId, lane: bool, bytes: usize) -> Arrival {
        match self.slot(call).map(|s| s.state) {
            None => {
                let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
                self.insert(call, lane, bytes);
                self.admitted += 1;
                self.admitted_bytes += u64::from(bytes);
                self.executed += 1;
                Arrival::New
            }
            Some(State::Admitted { .. }) => {
                self.duplicates += 1;
                Arrival::Admitted
            }
            Some(State::Done) => {
                self.duplicates += 1;
                Arrival::Done(self.cached_reply(call))
            }
        }
    }

    /// Whether `call` was seen (admitted or finished, and not forgotten).
    pub(crate) fn knows(&self, call: CallId) -> bool {
        self.slot(call).is_some()
    }

    /// Whether `call` is admitted and not finished; `Some(lane)`.
    pub(crate) fn admitted_on_lane(&self, call: CallId) -> Option<bool> {
        match self.slot(call)?.state {
            State::Admitted { lane, .. } => Some(lane),
            State::Done => None,
        }
    }

    /// The request finished; `reply` is kept for duplicates (only a
    /// successful reply is worth repeating; an error is answered again as
    /// "still running" and its first answer is in flight).
    pub(crate) fn finish(&mut self, call: CallId, reply: Option<Bytes>) {
        let Some(s) = self.slot_mut(call) else {
            return;
        };
        let State::Admitted { bytes, .. } = s.state else {
            return;
        };
        s.state = State::Done;
        self.admitted -= 1;
        self.admitted_bytes -= u64::from(bytes);
        // A displaced call is older than the window: remembered no longer.
        if !self.displaced.is_empty() {
            self.displaced.remove(&call);
        }
        let limits = self.limits;
        if let Some(r) =
            reply.filter(|r| r.len() <= limits.reply_cache_bytes && limits.reply_cache_entries > 0)
        {
            self.cache_bytes += r.len();
            self.cache.push_back((call, r));
        }
        while self.cache.len() > limits.reply_cache_entries
            || self.cache_bytes > limits.reply_cache_bytes
        {
            let Some((_, r)) = self.cache.pop_front() else {
                break;
            };
            self.cache_bytes -= r.len();
        }
    }

    /// The reply to `call` went out as `msg`.
    pub(crate) fn reply_sent(&mut self, call: CallId, msg: MessageId) {
        if let Some(s) = self.slot_mut(call) {
            s.reply_msg = Some(msg);
        }
    }

    /// The message that carried the reply to `call`, if it went out.
    pub(crate) fn reply_msg(&self, call: CallId) -> Option<MessageId> {
        self.slot(call)?.reply_msg
    }

    /// Bytes of cached replies.
    #[cfg(test)]
    pub(crate) fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// Bytes of admitted requests not yet answered.
    pub(crate) fn admitted_bytes(&self) -> u64 {
        self.admitted_bytes
    }

    /// Bytes of cached replies (bounded by `reply_cache_bytes`).
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cache_bytes as u64
    }

    /// Forgets everything (the session ended).
    pub(crate) fn clear(&mut self) {
        self.ring = Vec::new();
        self.displaced.clear();
        self.cache.clear();
        self.cache_bytes = 0;
        self.admitted = 0;
        self.admitted_bytes = 0;
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
        assert_eq!(s.arrive(CallId(1), false, 0), Arrival::New);
        assert_eq!(s.arrive(CallId(1), true, 0), Arrival::Admitted);
        assert_eq!(s.admitted_on_lane(CallId(1)), Some(false));
        s.finish(CallId(1), Some(Bytes::from_static(b"r")));
        assert_eq!(s.admitted, 0);
        assert_eq!(
            s.arrive(CallId(1), true, 0),
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
            assert_eq!(s.arrive(CallId(i), false, 0), Arrival::New);
            s.finish(CallId(i), Some(Bytes::from(vec![0; 4])));
        }
        assert!(s.cache_bytes() <= 10);
        // Evicted from the cache but remembered: never run again.
        assert_eq!(s.arrive(CallId(4), false, 0), Arrival::Done(None));
        assert_eq!(
            s.arrive(CallId(6), false, 0),
            Arrival::Done(Some(Bytes::from(vec![0; 4])))
        );
        // Forgotten beyond `remember`.
        assert_eq!(s.arrive(CallId(1), false, 0), Arrival::New);
        // A reply larger than the cache is not kept.
        let mut s = ServeState::new(limits(2, 10, 4));
        s.arrive(CallId(1), false, 0);
        s.finish(CallId(1), Some(Bytes::from(vec![0; 11])));
        assert_eq!(s.arrive(CallId(1), false, 0), Arrival::Done(None));
    }

    #[test]
    fn a_running_call_is_never_forgotten_and_the_ring_grows_with_ids() {
        let mut s = ServeState::new(limits(4, 1024, 8));
        assert_eq!(s.arrive(CallId(3), false, 0), Arrival::New);
        // 20 newer calls pass through the 8-slot ring while 3 runs.
        for i in 4..24 {
            assert_eq!(s.arrive(CallId(i), true, 0), Arrival::New);
            s.finish(CallId(i), None);
        }
        assert_eq!(s.admitted_on_lane(CallId(3)), Some(false));
        assert_eq!(s.arrive(CallId(3), false, 0), Arrival::Admitted);
        s.finish(CallId(3), Some(Bytes::from_static(b"late")));
        assert_eq!(s.admitted, 0);
        // Recent ids are remembered, older ones forgotten.
        assert!(s.knows(CallId(23)) && s.knows(CallId(16)));
        assert!(!s.knows(CallId(15)));
        // An id far ahead takes its slot without growing past the bound.
        assert_eq!(s.arrive(CallId(1 << 40), false, 0), Arrival::New);
        assert!(s.ring.len() <= 8);
        assert_eq!(s.admitted_on_lane(CallId(1 << 40)), Some(false));
    }
}
