//! hr-net's three queues: a priority queue, a FIFO queue, and timeout
//! detection, with a bound on how long a normal item can wait.
//!
//! - High-priority items wait in their own queue and go first; an item
//!   promoted to high moves to that queue's *head* (hr-net: "moved to the
//!   head of the queue and handled prior to others").
//! - Normal items wait in FIFO order.
//! - No starvation, either way: every item has a *virtual time* — its
//!   arrival for a normal item, its arrival minus `aging_bound` for a high
//!   one — and the smallest goes first. So a high item overtakes normal
//!   items that arrived up to `aging_bound` before it, and no more: **a
//!   normal item is never overtaken by a high-priority item that arrived
//!   more than `aging_bound` after it** (promotions aside, below). Under
//!   overload both classes keep moving; a plain "aged items first" rule
//!   would starve high-priority items as soon as every normal one is aged.
//! - Promotion (a re-sent request, hr-net's "moved to the head") takes the
//!   virtual time of the current head of the high queue, so it goes next
//!   among high items; it never jumps an item whose virtual time is older.
//! - Timeout detection: every item may carry a deadline; [`DispatchQueue::
//!   poll_expired`] hands back the overdue ones (the caller turns a request
//!   into a RESEND, or fails it).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::Priority;
use crate::time::Time;

#[derive(Clone, Debug)]
struct Slot<T> {
    item: T,
    enqueued: Time,
    deadline: Option<Time>,
    /// Dispatch order key: arrival, plus the aging bound when normal.
    vt: Time,
}

/// Which queue an item is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    High,
    Normal,
}

/// The three queues over items of type `T` identified by a `u64` key.
#[derive(Clone, Debug)]
pub struct DispatchQueue<T> {
    aging_bound: Duration,
    /// Keys in dispatch order.
    high: VecDeque<u64>,
    normal: VecDeque<u64>,
    slots: BTreeMap<u64, (Where, Slot<T>)>,
    /// Keys by deadline.
    deadlines: BTreeMap<(Time, u64), ()>,
    /// Priorities disabled: one FIFO for all (the baseline).
    fifo_only: bool,
}

impl<T> DispatchQueue<T> {
    /// Empty queues; a normal item waits at most `aging_bound` behind
    /// high-priority ones.
    pub fn new(aging_bound: Duration) -> Self {
        DispatchQueue {
            aging_bound,
            high: VecDeque::new(),
            normal: VecDeque::new(),
            slots: BTreeMap::new(),
            deadlines: BTreeMap::new(),
            fifo_only: false,
        }
    }

    /// One FIFO for everything: priorities ignored (the baseline of the
    /// priority benchmark).
    pub fn fifo(aging_bound: Duration) -> Self {
        DispatchQueue {
            fifo_only: true,
            ..DispatchQueue::new(aging_bound)
        }
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `key` waits.
    pub fn contains(&self, key: u64) -> bool {
        self.slots.contains_key(&key)
    }

    /// Adds an item; a high-priority one goes behind the other high ones.
    /// A key already queued is replaced in place (returns the old item).
    pub fn push(
        &mut self,
        now: Time,
        key: u64,
        item: T,
        priority: Priority,
        deadline: Option<Time>,
    ) -> Option<T> {
        let old = self.remove(key);
        let high = priority == Priority::High && !self.fifo_only;
        let to = if high {
            self.high.push_back(key);
            Where::High
        } else {
            self.normal.push_back(key);
            Where::Normal
        };
        // Normal items count from `now + aging_bound`, high ones from
        // `now`: the same order as "high minus the bound", without
        // underflow near the clock's origin.
        let vt = if high { now } else { now + self.aging_bound };
        // Keep the high queue sorted by virtual time (a late push with an
        // earlier clock must not break the order).
        let vt = match (high, self.high.iter().rev().nth(1)) {
            (true, Some(prev)) => self.slots.get(prev).map_or(vt, |(_, s)| s.vt.max(vt)),
            _ => vt,
        };
        if let Some(d) = deadline {
            self.deadlines.insert((d, key), ());
        }
        self.slots.insert(
            key,
            (
                to,
                Slot {
                    item,
                    enqueued: now,
                    deadline,
                    vt,
                },
            ),
        );
        old
    }

    /// Promotes a waiting item to high priority: it moves to the head of
    /// the high queue. Returns whether it was waiting.
    pub fn promote(&mut self, key: u64) -> bool {
        if self.fifo_only {
            return self.slots.contains_key(&key);
        }
        let head_vt = self
            .high
            .front()
            .and_then(|k| self.slots.get(k))
            .map(|(_, s)| s.vt);
        let Some((at, slot)) = self.slots.get_mut(&key) else {
            return false;
        };
        match *at {
            Where::High => self.high.retain(|k| *k != key),
            Where::Normal => self.normal.retain(|k| *k != key),
        }
        *at = Where::High;
        let own = slot.enqueued;
        slot.vt = head_vt.map_or(own, |h| h.min(own).min(slot.vt));
        self.high.push_front(key);
        true
    }

    /// The waiting item `key`.
    pub fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        self.slots.get_mut(&key).map(|(_, s)| &mut s.item)
    }

    /// Takes an item out of the queues.
    pub fn remove(&mut self, key: u64) -> Option<T> {
        let (at, slot) = self.slots.remove(&key)?;
        let q = match at {
            Where::High => &mut self.high,
            Where::Normal => &mut self.normal,
        };
        // Dispatch takes from the front: O(1) there, a scan elsewhere.
        if q.front() == Some(&key) {
            q.pop_front();
        } else {
            q.retain(|k| *k != key);
        }
        if let Some(d) = slot.deadline {
            self.deadlines.remove(&(d, key));
        }
        Some(slot.item)
    }

    /// The next item to dispatch at `now`: an aged normal item first, then
    /// the high queue, then the normal queue.
    pub fn pop(&mut self, now: Time) -> Option<(u64, T)> {
        self.pop_waited(now).map(|(k, item, _)| (k, item))
    }

    /// Like [`DispatchQueue::pop`], with how long the item waited.
    pub fn pop_waited(&mut self, now: Time) -> Option<(u64, T, Duration)> {
        let vt = |k: Option<&u64>| k.and_then(|k| self.slots.get(k)).map(|(_, s)| s.vt);
        let key = match (vt(self.high.front()), vt(self.normal.front())) {
            (Some(h), Some(n)) if n < h => self.normal.front(),
            (Some(_), _) => self.high.front(),
            (None, _) => self.normal.front(),
        }
        .copied()?;
        let waited = self.waited(now, key).unwrap_or_default();
        self.remove(key).map(|item| (key, item, waited))
    }

    /// How long the oldest normal item has waited (the aging bound applies
    /// to it first).
    pub fn oldest_normal_wait(&self, now: Time) -> Option<Duration> {
        self.normal
            .front()
            .and_then(|k| self.slots.get(k))
            .map(|(_, s)| now.saturating_since(s.enqueued))
    }

    /// How long the item `key` has waited.
    pub fn waited(&self, now: Time, key: u64) -> Option<Duration> {
        self.slots
            .get(&key)
            .map(|(_, s)| now.saturating_since(s.enqueued))
    }

    /// Removes and returns the items whose deadline is at or before `now`.
    pub fn poll_expired(&mut self, now: Time) -> Vec<(u64, T)> {
        let due: Vec<u64> = self
            .deadlines
            .range(..=(now, u64::MAX))
            .map(|((_, k), _)| *k)
            .collect();
        due.into_iter()
            .filter_map(|k| self.remove(k).map(|item| (k, item)))
            .collect()
    }

    /// The earliest deadline, and when the oldest normal item ages.
    pub fn poll_timeout(&self) -> Option<Time> {
        let deadline = self.deadlines.keys().next().map(|(t, _)| *t);
        let aging = self
            .normal
            .front()
            .and_then(|k| self.slots.get(k))
            .map(|(_, s)| s.enqueued + self.aging_bound);
        match (deadline, aging) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(m: u64) -> Time {
        Time::from_millis(m)
    }

    #[test]
    fn high_goes_first_and_promotion_moves_to_the_head() {
        let mut q = DispatchQueue::new(Duration::from_millis(100));
        q.push(ms(0), 1, "n1", Priority::Normal, None);
        q.push(ms(0), 2, "n2", Priority::Normal, None);
        q.push(ms(0), 3, "h3", Priority::High, None);
        q.push(ms(0), 4, "h4", Priority::High, None);
        assert!(q.promote(2));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(ms(1)).map(|(k, _)| k)).collect();
        assert_eq!(order, vec![2, 3, 4, 1]);
        assert!(!q.promote(9));
    }

    #[test]
    fn high_items_overtake_only_normal_ones_younger_than_the_bound() {
        let mut q = DispatchQueue::new(Duration::from_millis(100));
        q.push(ms(0), 1, (), Priority::Normal, None);
        q.push(ms(50), 2, (), Priority::High, None); // vt -50: before 1
        q.push(ms(150), 3, (), Priority::High, None); // vt 50: after 1
        q.push(ms(60), 4, (), Priority::Normal, None);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(ms(200)).map(|(k, _)| k)).collect();
        assert_eq!(order, vec![2, 1, 3, 4]);
    }

    #[test]
    fn under_overload_both_classes_keep_moving() {
        // Every normal item is long past the bound; high ones still get
        // their head start of one bound.
        let mut q = DispatchQueue::new(Duration::from_millis(10));
        for k in 0..100u64 {
            q.push(ms(k), k, (), Priority::Normal, None);
        }
        q.push(ms(100), 1000, (), Priority::High, None); // vt 90
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(ms(500)).map(|(k, _)| k)).collect();
        let pos = order.iter().position(|k| *k == 1000).unwrap();
        assert_eq!(
            pos, 90,
            "after the normal items older than 90 ms, before the rest"
        );
    }

    #[test]
    fn fifo_mode_ignores_priorities() {
        let mut q = DispatchQueue::fifo(Duration::from_millis(100));
        q.push(ms(0), 1, (), Priority::Normal, None);
        q.push(ms(0), 2, (), Priority::High, None);
        q.promote(2);
        assert_eq!(q.pop(ms(0)).map(|p| p.0), Some(1));
        assert_eq!(q.pop(ms(0)).map(|p| p.0), Some(2));
    }

    #[test]
    fn deadlines_expire_in_order_and_removed_items_do_not() {
        let mut q = DispatchQueue::new(Duration::from_millis(100));
        q.push(ms(0), 1, "a", Priority::Normal, Some(ms(30)));
        q.push(ms(0), 2, "b", Priority::Normal, Some(ms(10)));
        q.push(ms(0), 3, "c", Priority::Normal, Some(ms(20)));
        q.remove(3);
        assert_eq!(q.poll_timeout(), Some(ms(10)));
        assert_eq!(q.poll_expired(ms(25)), vec![(2, "b")]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.poll_expired(ms(30)), vec![(1, "a")]);
        assert!(q.is_empty());
        assert_eq!(q.poll_timeout(), None);
    }

    #[test]
    fn re_pushing_a_key_replaces_it() {
        let mut q = DispatchQueue::new(Duration::from_millis(100));
        q.push(ms(0), 1, "a", Priority::Normal, Some(ms(5)));
        assert_eq!(q.push(ms(1), 1, "b", Priority::High, None), Some("a"));
        assert_eq!(q.len(), 1);
        assert!(q.poll_expired(ms(10)).is_empty());
        assert_eq!(q.pop(ms(10)), Some((1, "b")));
    }
}
