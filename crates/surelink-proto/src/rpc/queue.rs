//! hr-net's three queues: a priority queue, a FIFO queue, and timeout
//! detection, with a bound on how long a normal item can wait.
//!
//! - High-priority items wait in their own queue and go first; an item
//!   promoted to high moves to that queue's *head* (hr-net: "moved to the
//!   head of the queue and handled prior to others").
//! - Normal items wait in FIFO order.
//! - No starvation: once the oldest normal item has waited `aging_bound`,
//!   it goes before any high-priority item. Aged items leave in FIFO order,
//!   so the guarantee is: **a normal item waits at most `aging_bound` plus
//!   the time to dispatch the normal items queued before it** — high-priority
//!   traffic can no longer delay it after `aging_bound`.
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
        let to = if priority == Priority::High && !self.fifo_only {
            self.high.push_back(key);
            Where::High
        } else {
            self.normal.push_back(key);
            Where::Normal
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
        let Some((at, _)) = self.slots.get_mut(&key) else {
            return false;
        };
        match *at {
            Where::High => self.high.retain(|k| *k != key),
            Where::Normal => self.normal.retain(|k| *k != key),
        }
        *at = Where::High;
        self.high.push_front(key);
        true
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
        let aged = self.normal.front().is_some_and(|k| {
            self.slots
                .get(k)
                .is_some_and(|(_, s)| now.saturating_since(s.enqueued) >= self.aging_bound)
        });
        let key = if aged {
            self.normal.front().copied()
        } else {
            self.high.front().or(self.normal.front()).copied()
        }?;
        let waited = self.waited(now, key).unwrap_or_default();
        self.remove(key).map(|item| (key, item, waited))
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
    fn an_aged_normal_item_overtakes_high_ones() {
        let mut q = DispatchQueue::new(Duration::from_millis(100));
        q.push(ms(0), 1, (), Priority::Normal, None);
        for k in 2..10 {
            q.push(ms(50), k, (), Priority::High, None);
        }
        assert_eq!(q.pop(ms(99)).map(|p| p.0), Some(2));
        assert_eq!(q.pop(ms(100)).map(|p| p.0), Some(1), "waited the bound");
        assert_eq!(q.pop(ms(100)).map(|p| p.0), Some(3));
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
