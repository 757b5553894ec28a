//! The server side: requests classified by type (hr-net's server table),
//! queued in [`DispatchQueue`], executed at most once.
//!
//! | request type | priority |
//! |---|---|
//! | SEND | normal (or the caller's hint) |
//! | RESEND | high |
//! | FORWARD | high |
//!
//! At most once: each request is identified by its caller (node and
//! incarnation) and call id. A duplicate — a re-send of a request this
//! server already has — is never executed again:
//!
//! - still queued: it is promoted to the head of the high queue (the caller
//!   is waiting), nothing else;
//! - running: answered with [`Duplicate::StillRunning`];
//! - finished: answered from the reply cache with the same reply, or with
//!   [`Duplicate::Answered`] once the reply has been evicted (the first
//!   reply is already on its way through the session).
//!
//! The cache is bounded by entries and by bytes; ids of finished requests
//! are remembered (without their reply) up to `remember` per caller, so an
//! evicted reply is still never re-executed within that window.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use super::queue::DispatchQueue;
use super::Priority;
use crate::ids::{Epoch, NodeId};
use crate::time::Time;

/// How a request reached the server (hr-net's server table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// First transmission.
    Send,
    /// The caller sent it again (timeout or lost reply).
    Resend,
    /// Forwarded by another server.
    Forward,
}

/// Who called: node and incarnation (ids restart with a new incarnation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Caller {
    /// The node.
    pub node: NodeId,
    /// Its incarnation.
    pub epoch: Epoch,
}

/// The answer to a duplicate request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Duplicate {
    /// Still waiting in the queue (now at the head of the high queue).
    Queued,
    /// A handler is running it.
    StillRunning,
    /// Finished: the same reply again.
    Reply(Bytes),
    /// Finished, reply evicted from the cache; it was sent once already.
    Answered,
}

/// Settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// A normal request waits at most this long behind high-priority ones.
    pub aging_bound: Duration,
    /// Ignore priorities: one FIFO (the benchmark's baseline).
    pub fifo_only: bool,
    /// Replies kept for duplicates, in total.
    pub reply_cache_entries: usize,
    /// Bytes of replies kept, in total.
    pub reply_cache_bytes: usize,
    /// Finished ids remembered per caller (without replies).
    pub remember: usize,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            aging_bound: Duration::from_millis(50),
            fifo_only: false,
            reply_cache_entries: 4096,
            reply_cache_bytes: 4 << 20,
            remember: 65_536,
        }
    }
}

#[derive(Clone, Debug)]
enum State {
    Queued(u64),
    Running,
    Done(Option<Bytes>),
}

/// A request handed to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched<R> {
    /// Who called.
    pub caller: Caller,
    /// The call id.
    pub id: u64,
    /// The request.
    pub request: R,
    /// Its priority when dispatched.
    pub priority: Priority,
    /// How long it waited in the queue.
    pub waited: Duration,
}

/// Server-side queues and at-most-once bookkeeping.
#[derive(Debug)]
pub struct Dispatcher<R> {
    cfg: DispatcherConfig,
    queue: DispatchQueue<(Caller, u64, R, Priority)>,
    states: BTreeMap<(Caller, u64), State>,
    /// Finished ids per caller, oldest first (for forgetting).
    finished: BTreeMap<Caller, VecDeque<u64>>,
    /// Cached replies, oldest first.
    cache: VecDeque<(Caller, u64)>,
    cache_bytes: usize,
    next_key: u64,
    executed: u64,
    duplicates: u64,
}

impl<R> Dispatcher<R> {
    /// An empty dispatcher.
    pub fn new(cfg: DispatcherConfig) -> Self {
        let queue = if cfg.fifo_only {
            DispatchQueue::fifo(cfg.aging_bound)
        } else {
            DispatchQueue::new(cfg.aging_bound)
        };
        Dispatcher {
            cfg,
            queue,
            states: BTreeMap::new(),
            finished: BTreeMap::new(),
            cache: VecDeque::new(),
            cache_bytes: 0,
            next_key: 0,
            executed: 0,
            duplicates: 0,
        }
    }

    /// A request arrived. `None`: queued (or promoted, if it was queued
    /// already); `Some`: a duplicate to answer at once, not queued.
    pub fn handle_request(
        &mut self,
        now: Time,
        caller: Caller,
        id: u64,
        class: RequestClass,
        hint: Priority,
        request: R,
    ) -> Option<Duplicate> {
        let priority = match class {
            RequestClass::Resend | RequestClass::Forward => Priority::High,
            RequestClass::Send => hint,
        };
        match self.states.get(&(caller, id)) {
            Some(State::Queued(key)) => {
                let key = *key;
                self.duplicates += 1;
                if priority == Priority::High {
                    self.queue.promote(key);
                    if let Some(item) = self.queue.get_mut(key) {
                        item.3 = Priority::High;
                    }
                }
                Some(Duplicate::Queued)
            }
            Some(State::Running) => {
                self.duplicates += 1;
                Some(Duplicate::StillRunning)
            }
            Some(State::Done(reply)) => {
                self.duplicates += 1;
                Some(match reply {
                    Some(r) => Duplicate::Reply(r.clone()),
                    None => Duplicate::Answered,
                })
            }
            None => {
                let key = self.next_key;
                self.next_key += 1;
                self.queue
                    .push(now, key, (caller, id, request, priority), priority, None);
                self.states.insert((caller, id), State::Queued(key));
                None
            }
        }
    }

    /// The next request to run (it is then RUNNING until
    /// [`Dispatcher::complete`]).
    pub fn next(&mut self, now: Time) -> Option<Dispatched<R>> {
        let (_, (caller, id, request, priority), waited) = self.queue.pop_waited(now)?;
        self.states.insert((caller, id), State::Running);
        self.executed += 1;
        Some(Dispatched {
            caller,
            id,
            request,
            priority,
            waited,
        })
    }

    /// The request finished with `reply`: remembered for duplicates.
    pub fn complete(&mut self, caller: Caller, id: u64, reply: Bytes) {
        let fits = reply.len() <= self.cfg.reply_cache_bytes && self.cfg.reply_cache_entries > 0;
        if fits {
            self.cache_bytes += reply.len();
            self.cache.push_back((caller, id));
        }
        self.states
            .insert((caller, id), State::Done(fits.then_some(reply)));
        while self.cache.len() > self.cfg.reply_cache_entries
            || self.cache_bytes > self.cfg.reply_cache_bytes
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
        let ids = self.finished.entry(caller).or_default();
        ids.push_back(id);
        while ids.len() > self.cfg.remember {
            if let Some(old) = ids.pop_front() {
                if let Some(State::Done(Some(r))) = self.states.remove(&(caller, old)) {
                    self.cache_bytes -= r.len();
                    self.cache.retain(|k| *k != (caller, old));
                }
            }
        }
    }

    /// Forgets a caller's incarnation (its session ended): its queued
    /// requests are dropped and returned.
    pub fn forget(&mut self, caller: Caller) -> Vec<R> {
        let keys: Vec<(Caller, u64)> = self
            .states
            .range((caller, 0)..=(caller, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        let mut dropped = Vec::new();
        for k in keys {
            if let Some(State::Queued(key)) = self.states.remove(&k) {
                if let Some((_, _, r, _)) = self.queue.remove(key) {
                    dropped.push(r);
                }
            }
        }
        self.finished.remove(&caller);
        let before = self.cache.len();
        self.cache.retain(|(c, _)| *c != caller);
        if self.cache.len() != before {
            self.cache_bytes = 0;
            for k in &self.cache {
                if let Some(State::Done(Some(r))) = self.states.get(k) {
                    self.cache_bytes += r.len();
                }
            }
        }
        dropped
    }

    /// How long the oldest normal request has waited.
    pub fn oldest_normal_wait(&self, now: Time) -> Option<Duration> {
        self.queue.oldest_normal_wait(now)
    }

    /// Forgets every incarnation of `node` (see [`Dispatcher::forget`]).
    pub fn forget_node(&mut self, node: NodeId) -> Vec<R> {
        let callers: std::collections::BTreeSet<Caller> = self
            .states
            .keys()
            .map(|(c, _)| *c)
            .chain(self.finished.keys().copied())
            .filter(|c| c.node == node)
            .collect();
        callers.into_iter().flat_map(|c| self.forget(c)).collect()
    }

    /// Requests waiting.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Requests handed to workers so far (each at most once).
    pub fn executed(&self) -> u64 {
        self.executed
    }

    /// Duplicates answered without execution.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// When the oldest normal request ages (the caller may want to wake a
    /// worker then).
    pub fn poll_timeout(&self) -> Option<Time> {
        self.queue.poll_timeout()
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
