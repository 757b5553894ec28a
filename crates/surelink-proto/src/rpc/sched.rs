//! Which admitted request runs next: the [`Scheduler`] trait and its two
//! implementations.
//!
//! Sessions admit requests (a bounded number per peer) and hand them out as
//! tickets; the shell pushes each ticket into one scheduler and its workers
//! pop them. The scheduler is the only place that decides *which* request
//! runs *now*, so a recovery-conscious scheduler (recovery groups mapped to
//! worker pools, bounds per group, suspension) replaces it without touching
//! sessions or handlers.
//!
//! - [`PriorityScheduler`] (the default): hr-net's queues — high-priority
//!   requests first, a re-sent request promoted to the head (with its
//!   session's earlier waiting requests, in order: a re-send never passes
//!   its own session's earlier requests) — with two
//!   bounds. A normal request is never overtaken by a high-priority one
//!   that arrived more than `aging_bound` after it (the virtual-time rule
//!   of [`DispatchQueue`](super::DispatchQueue)). And normal requests are
//!   served round robin *per session*, so one peer flooding a slow handler
//!   cannot make another peer's requests wait behind its whole backlog.
//! - [`FifoScheduler`]: one queue in arrival order, priorities ignored (the
//!   baseline of the priority benchmark).

use std::collections::VecDeque;
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use super::Priority;
use crate::ids::CallId;
use crate::time::Time;

/// Identifies a ticket across sessions: the shell's number for the session
/// and the caller's call id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TicketKey {
    /// The session, as numbered by whoever drives the scheduler.
    pub session: u64,
    /// The call.
    pub call: CallId,
}

/// A request leaving the scheduler for a worker.
#[derive(Debug, PartialEq, Eq)]
pub struct Dispatch<T> {
    /// Its key.
    pub key: TicketKey,
    /// Its priority now (promotion may have raised it).
    pub priority: Priority,
    /// How long it waited.
    pub waited: Duration,
    /// What the driver queued.
    pub item: T,
}

/// Decides which admitted request runs next. Sans-IO: every input carries
/// `now`.
pub trait Scheduler<T>: Send {
    /// Queues an admitted request.
    fn push(&mut self, now: Time, key: TicketKey, priority: Priority, item: T);
    /// A waiting request was asked for again (a re-send): move it to the
    /// head of the high queue. Returns whether it was waiting.
    fn promote(&mut self, key: TicketKey) -> bool;
    /// The next request to run.
    fn pop(&mut self, now: Time) -> Option<Dispatch<T>>;
    /// Drops the waiting requests of a session that ended.
    fn remove_session(&mut self, session: u64) -> Vec<T>;
    /// Requests waiting.
    fn len(&self) -> usize;
    /// Whether nothing waits.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    High,
    Normal,
}

#[derive(Debug)]
struct Slot<T> {
    item: T,
    priority: Priority,
    arrived: Time,
    place: Place,
    /// Dispatch order among high items (arrival, or a promoted head's).
    vt: Time,
}

/// hr-net's priority queues with an aging bound and per-session round
/// robin among normal requests. See the module docs.
#[derive(Debug)]
pub struct PriorityScheduler<T> {
    aging_bound: Duration,
    slots: HashMap<TicketKey, Slot<T>>,
    /// High keys in dispatch order (may hold stale keys).
    high: VecDeque<TicketKey>,
    /// Normal keys per session in arrival order (may hold stale keys).
    normal: HashMap<u64, VecDeque<TicketKey>>,
    /// Sessions with normal keys, in round-robin order.
    ring: VecDeque<u64>,
    /// Every normal key in arrival order (may hold stale keys): the oldest
    /// one is what the aging bound protects.
    arrivals: VecDeque<TicketKey>,
}

/// The first key of `queue` whose ticket still waits in `place` (keys of
/// tickets taken, promoted or removed are dropped lazily, here).
fn live_front<T>(
    queue: &mut VecDeque<TicketKey>,
    slots: &HashMap<TicketKey, Slot<T>>,
    place: Place,
) -> Option<TicketKey> {
    while let Some(k) = queue.front() {
        if slots.get(k).is_some_and(|s| s.place == place) {
            return Some(*k);
        }
        queue.pop_front();
    }
    None
}

impl<T> PriorityScheduler<T> {
    /// Empty queues; a normal request waits at most `aging_bound` behind
    /// high-priority ones.
    pub fn new(aging_bound: Duration) -> Self {
        PriorityScheduler {
            aging_bound,
            slots: HashMap::default(),
            high: VecDeque::new(),
            normal: HashMap::default(),
            ring: VecDeque::new(),
            arrivals: VecDeque::new(),
        }
    }

    fn high_head(&mut self) -> Option<TicketKey> {
        live_front(&mut self.high, &self.slots, Place::High)
    }

    fn oldest_normal(&mut self) -> Option<TicketKey> {
        live_front(&mut self.arrivals, &self.slots, Place::Normal)
    }

    /// The next normal key, round robin over sessions.
    fn next_round_robin(&mut self) -> Option<TicketKey> {
        while let Some(s) = self.ring.pop_front() {
            let Some(q) = self.normal.get_mut(&s) else {
                continue;
            };
            while let Some(k) = q.pop_front() {
                if self.slots.get(&k).is_some_and(|x| x.place == Place::Normal) {
                    if q.is_empty() {
                        self.normal.remove(&s);
                    } else {
                        self.ring.push_back(s);
                    }
                    return Some(k);
                }
            }
            self.normal.remove(&s);
        }
        None
    }

    fn take(&mut self, now: Time, key: TicketKey) -> Option<Dispatch<T>> {
        let s = self.slots.remove(&key)?;
        Some(Dispatch {
            key,
            priority: s.priority,
            waited: now.saturating_since(s.arrived),
            item: s.item,
        })
    }
}

impl<T: Send> Scheduler<T> for PriorityScheduler<T> {
    fn push(&mut self, now: Time, key: TicketKey, priority: Priority, item: T) {
        if self.slots.contains_key(&key) {
            return;
        }
        let place = if priority == Priority::High {
            Place::High
        } else {
            Place::Normal
        };
        // Keep the high queue sorted by virtual time even if a caller's
        // clock steps back.
        let vt = match (place, self.high.back().and_then(|k| self.slots.get(k))) {
            (Place::High, Some(prev)) => prev.vt.max(now),
            _ => now,
        };
        self.slots.insert(
            key,
            Slot {
                item,
                priority,
                arrived: now,
                place,
                vt,
            },
        );
        match place {
            Place::High => self.high.push_back(key),
            Place::Normal => {
                let q = self.normal.entry(key.session).or_default();
                if q.is_empty() {
                    self.ring.push_back(key.session);
                }
                q.push_back(key);
                self.arrivals.push_back(key);
            }
        }
    }

    fn promote(&mut self, key: TicketKey) -> bool {
        if !self.slots.contains_key(&key) {
            return false;
        }
        let head_vt = self
            .high_head()
            .and_then(|k| self.slots.get(&k))
            .map(|s| s.vt);
        // A re-sent request goes to the head, but never ahead of its own
        // session's earlier requests (re-sends of A then B would otherwise
        // run B first): those it passes go with it, in call order — its
        // session's waiting keys, normal ones from its own queue and high
        // ones from the high queue (both may hold stale keys).
        let earlier = |k: &&TicketKey| k.session == key.session && k.call <= key.call;
        let mut moved: Vec<TicketKey> = self
            .normal
            .get(&key.session)
            .into_iter()
            .flatten()
            .chain(self.high.iter())
            .filter(earlier)
            .filter(|k| self.slots.contains_key(k))
            .copied()
            .collect();
        moved.sort_unstable_by_key(|k| k.call);
        moved.dedup();
        let vt = moved
            .iter()
            .filter_map(|k| self.slots.get(k))
            .map(|s| s.arrived.min(s.vt))
            .chain(head_vt)
            .min();
        self.high.retain(|k| {
            k.session != key.session || moved.binary_search_by_key(&k.call, |m| m.call).is_err()
        });
        for k in moved.iter().rev() {
            if let Some(s) = self.slots.get_mut(k) {
                s.place = Place::High;
                s.priority = Priority::High;
                if let Some(vt) = vt {
                    s.vt = vt;
                }
            }
            self.high.push_front(*k);
        }
        true
    }

    fn pop(&mut self, now: Time) -> Option<Dispatch<T>> {
        let high = self.high_head();
        let oldest = self.oldest_normal();
        let key = match (high, oldest) {
            (Some(h), Some(o)) => {
                let hvt = self.slots.get(&h).map(|s| s.vt);
                let ovt = self.slots.get(&o).map(|s| s.arrived + self.aging_bound);
                // The oldest normal request has aged past the high head:
                // it goes now (the starvation bound), whatever the round
                // robin says.
                if ovt < hvt {
                    o
                } else {
                    h
                }
            }
            (Some(h), None) => h,
            (None, Some(_)) => self.next_round_robin()?,
            (None, None) => return None,
        };
        self.take(now, key)
    }

    fn remove_session(&mut self, session: u64) -> Vec<T> {
        let keys: Vec<TicketKey> = self
            .slots
            .keys()
            .filter(|k| k.session == session)
            .copied()
            .collect();
        self.normal.remove(&session);
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(s) = self.slots.remove(&k) {
                out.push(s.item);
            }
        }
        out
    }

    fn len(&self) -> usize {
        self.slots.len()
    }
}

/// One queue in arrival order; priorities and promotions ignored.
#[derive(Debug)]
pub struct FifoScheduler<T> {
    queue: VecDeque<(TicketKey, Priority, Time, T)>,
}

impl<T> FifoScheduler<T> {
    /// An empty queue.
    pub fn new() -> Self {
        FifoScheduler {
            queue: VecDeque::new(),
        }
    }
}

impl<T> Default for FifoScheduler<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send> Scheduler<T> for FifoScheduler<T> {
    fn push(&mut self, now: Time, key: TicketKey, priority: Priority, item: T) {
        self.queue.push_back((key, priority, now, item));
    }

    fn promote(&mut self, key: TicketKey) -> bool {
        self.queue.iter().any(|(k, ..)| *k == key)
    }

    fn pop(&mut self, now: Time) -> Option<Dispatch<T>> {
        let (key, priority, arrived, item) = self.queue.pop_front()?;
        Some(Dispatch {
            key,
            priority,
            waited: now.saturating_since(arrived),
            item,
        })
    }

    fn remove_session(&mut self, session: u64) -> Vec<T> {
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(self.queue.len());
        for e in self.queue.drain(..) {
            if e.0.session == session {
                out.push(e.3);
            } else {
                keep.push_back(e);
            }
        }
        self.queue = keep;
        out
    }

    fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: u64, call: u64) -> TicketKey {
        TicketKey {
            session,
            call: CallId(call),
        }
    }

    fn ms(m: u64) -> Time {
        Time::from_millis(m)
    }

    fn order<S: Scheduler<()>>(s: &mut S, now: Time) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| s.pop(now).map(|d| (d.key.session, d.key.call.0))).collect()
    }

    #[test]
    fn high_first_and_promotion_to_the_head() {
        let mut s = PriorityScheduler::new(Duration::from_millis(100));
        s.push(ms(0), key(2, 1), Priority::Normal, ());
        s.push(ms(0), key(1, 2), Priority::Normal, ());
        s.push(ms(0), key(1, 3), Priority::High, ());
        s.push(ms(0), key(1, 4), Priority::High, ());
        assert!(s.promote(key(1, 2)));
        assert!(!s.promote(key(9, 9)));
        assert_eq!(order(&mut s, ms(1)), vec![(1, 2), (1, 3), (1, 4), (2, 1)]);
        assert!(s.is_empty());
    }

    #[test]
    fn a_resent_request_never_passes_its_own_sessions_earlier_ones() {
        let mut s = PriorityScheduler::new(Duration::from_millis(100));
        for c in 1..=4 {
            s.push(ms(0), key(1, c), Priority::Normal, ());
        }
        s.push(ms(0), key(2, 1), Priority::Normal, ());
        // Re-sends of 2 then 3 (a failover re-sends in order): each goes
        // to the head, taking its session's earlier ones along, in order.
        assert!(s.promote(key(1, 2)));
        assert!(s.promote(key(1, 3)));
        assert_eq!(
            order(&mut s, ms(1)),
            vec![(1, 1), (1, 2), (1, 3), (1, 4), (2, 1)]
        );
    }

    #[test]
    fn normal_requests_are_served_round_robin_per_session() {
        let mut s = PriorityScheduler::new(Duration::from_millis(100));
        // Session 1 floods first; session 2's one request does not wait
        // behind all of them.
        for c in 0..5 {
            s.push(ms(0), key(1, c), Priority::Normal, ());
        }
        s.push(ms(1), key(2, 0), Priority::Normal, ());
        let got = order(&mut s, ms(2));
        let pos = got.iter().position(|k| *k == (2, 0)).unwrap();
        assert!(pos <= 1, "session 2 served at position {pos}: {got:?}");
        assert_eq!(got.len(), 6);
    }

    #[test]
    fn aged_normal_requests_beat_younger_high_ones() {
        let mut s = PriorityScheduler::new(Duration::from_millis(100));
        s.push(ms(0), key(1, 1), Priority::Normal, ());
        s.push(ms(50), key(1, 2), Priority::High, ()); // within the bound: first
        s.push(ms(150), key(1, 3), Priority::High, ()); // beyond: after 1
        s.push(ms(60), key(2, 4), Priority::Normal, ());
        assert_eq!(order(&mut s, ms(200)), vec![(1, 2), (1, 1), (1, 3), (2, 4)]);
    }

    #[test]
    fn an_ended_session_leaves_the_queues() {
        let mut s = PriorityScheduler::new(Duration::from_millis(100));
        s.push(ms(0), key(1, 1), Priority::Normal, ());
        s.push(ms(0), key(1, 2), Priority::High, ());
        s.push(ms(0), key(2, 1), Priority::Normal, ());
        assert_eq!(s.remove_session(1).len(), 2);
        assert_eq!(order(&mut s, ms(0)), vec![(2, 1)]);
    }

    #[test]
    fn fifo_ignores_priorities() {
        let mut s = FifoScheduler::new();
        s.push(ms(0), key(1, 1), Priority::Normal, ());
        s.push(ms(0), key(1, 2), Priority::High, ());
        assert!(s.promote(key(1, 2)));
        assert_eq!(order(&mut s, ms(0)), vec![(1, 1), (1, 2)]);
        s.push(ms(0), key(3, 1), Priority::Normal, ());
        assert_eq!(s.remove_session(3).len(), 1);
        assert!(s.is_empty());
    }
}
