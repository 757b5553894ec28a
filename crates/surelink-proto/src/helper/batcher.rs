//! When a helper sends what it gathered for one server.
//!
//! PostMan's helper packs many clients' small messages into one frame for
//! the hot server. Waiting longer makes frames larger (less per-message
//! work at the server) and every message later; the policy decides.
//!
//! **Adaptive** (PostMan's Algorithm 1, `postman.txt` L159–167): a batch
//! goes when it has waited the interval `T` or holds `S` bytes. After each
//! batch, with `t` its observed period (the time since the batch before)
//! and `s` its size: when `t` is outside [0.5·T, 1.5·T] and at least
//! 10 µs, `T ← t`; when `s` is outside [0.5·S, 1.5·S], `S ← s`; each kept
//! between its floor and its ceiling (the paper gives floors — `S` the
//! MTU, `T` from the SLA — and no ceilings; ours bound the wait and the
//! frame). Under heavy load batches fill before `T`, so `T` shrinks to the
//! period and `S` follows what arrives; under light load `S` falls to its
//! floor.
//!
//! **Self-clocking** (ours): a batch goes at once when the server has
//! answered everything sent to it, else when the frame is full or the
//! oldest message has waited `max_wait`. A server keeping up sees no added
//! wait at all; a loaded one gets, per round trip, one frame holding
//! whatever arrived meanwhile — the batch size follows the load with no
//! interval to tune (the idea of Nagle's algorithm and TCP autocorking,
//! with a bound on the wait).
//!
//! Either way a message never waits longer than the policy's ceiling
//! (`max_interval` or `max_wait`), and a batch never exceeds `max_frame`
//! bytes unless one message alone does (it then goes alone).
//!
//! What it does not do: hold the messages (the shell keeps them, in the
//! order given; a [`Flush`] says how many of the oldest go), read a clock,
//! or know which server answered what (the shell says how many messages
//! were answered).

use std::collections::VecDeque;
use std::time::Duration;

use crate::config::ConfigError;
use crate::time::Time;

/// Algorithm 1's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdaptiveConfig {
    /// `T` at start.
    pub initial_interval: Duration,
    /// `T`'s floor; also the smallest period taken as a measurement (the
    /// paper's 10 µs: shorter ones are timer noise).
    pub min_interval: Duration,
    /// `T`'s ceiling: the longest a message waits in the helper.
    pub max_interval: Duration,
    /// `S` at start, bytes.
    pub initial_size: usize,
    /// `S`'s floor (the paper: one MTU).
    pub min_size: usize,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            initial_interval: Duration::from_micros(100),
            min_interval: Duration::from_micros(10),
            max_interval: Duration::from_millis(1),
            initial_size: 8 * 1024,
            min_size: 1500,
        }
    }
}

/// How a batch is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchPolicy {
    /// PostMan's Algorithm 1.
    Adaptive(AdaptiveConfig),
    /// Send when everything sent was answered, the frame is full, or the
    /// oldest message waited `max_wait`.
    SelfClocking {
        /// The longest a message waits in the helper.
        max_wait: Duration,
    },
}

impl Default for BatchPolicy {
    fn default() -> Self {
        BatchPolicy::SelfClocking {
            max_wait: Duration::from_millis(1),
        }
    }
}

/// A batcher's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatcherConfig {
    /// The policy.
    pub policy: BatchPolicy,
    /// The largest batch, bytes (messages' records included).
    pub max_frame: usize,
    /// The most bytes waiting at once; more is refused
    /// ([`BatcherError::Full`]).
    pub max_pending: usize,
}

impl Default for BatcherConfig {
    fn default() -> Self {
        BatcherConfig {
            policy: BatchPolicy::default(),
            max_frame: 64 * 1024,
            max_pending: 1024 * 1024,
        }
    }
}

impl BatcherConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        if self.max_frame == 0 {
            return Err(ConfigError::Zero {
                field: "helper.max_frame",
            });
        }
        if self.max_pending < self.max_frame {
            return Err(ConfigError::Inconsistent {
                field: "helper.max_pending",
                value: n(self.max_pending),
                other: "helper.max_frame",
                other_value: n(self.max_frame),
                why: "a full frame must fit in what may wait",
            });
        }
        match &self.policy {
            BatchPolicy::SelfClocking { max_wait } if max_wait.is_zero() => {
                Err(ConfigError::Zero {
                    field: "helper.max_wait",
                })
            }
            BatchPolicy::SelfClocking { .. } => Ok(()),
            BatchPolicy::Adaptive(a) => {
                if a.min_interval.is_zero() {
                    return Err(ConfigError::Zero {
                        field: "helper.min_interval",
                    });
                }
                if a.min_size == 0 {
                    return Err(ConfigError::Zero {
                        field: "helper.min_size",
                    });
                }
                let t = a.initial_interval;
                if t < a.min_interval || t > a.max_interval {
                    return Err(ConfigError::OutOfRange {
                        field: "helper.initial_interval (µs)",
                        value: us(t),
                        min: us(a.min_interval),
                        max: us(a.max_interval),
                    });
                }
                if a.min_size > self.max_frame {
                    return Err(ConfigError::Inconsistent {
                        field: "helper.max_frame",
                        value: n(self.max_frame),
                        other: "helper.min_size",
                        other_value: n(a.min_size),
                        why: "the batch size's floor must fit in a frame",
                    });
                }
                let s = a.initial_size;
                if s < a.min_size || s > self.max_frame {
                    return Err(ConfigError::OutOfRange {
                        field: "helper.initial_size",
                        value: n(s),
                        min: n(a.min_size),
                        max: n(self.max_frame),
                    });
                }
                Ok(())
            }
        }
    }
}

/// The shortest a self-clocking batcher waits for an answer before it
/// sends the next batch anyway.
pub const MIN_ANSWER_WAIT: Duration = Duration::from_micros(20);

/// A message the batcher cannot take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatcherError {
    /// Taking it would put more than `max_pending` bytes in waiting: the
    /// shell pushes back on the client (or sends it direct).
    #[error(
        "{pending} bytes already wait for the server; {len} more would pass the limit of {limit}"
    )]
    Full {
        /// Bytes waiting.
        pending: usize,
        /// The message's size.
        len: usize,
        /// `max_pending`.
        limit: usize,
    },
}

/// A batch to send now: the `messages` oldest waiting, `bytes` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flush {
    /// How many of the oldest waiting messages go.
    pub messages: usize,
    /// Their bytes.
    pub bytes: usize,
}

/// The batching state for one server.
#[derive(Clone, Debug)]
pub struct Batcher {
    cfg: BatcherConfig,
    /// Algorithm 1's `T` and `S` (unused when self-clocking).
    interval: Duration,
    size: usize,
    /// Waiting messages: size and when each came.
    waiting: VecDeque<(usize, Time)>,
    waiting_bytes: usize,
    /// Messages sent and not yet answered.
    outstanding: u64,
    /// Self-clocking: when the oldest batch still unanswered went out.
    awaiting: Option<Time>,
    /// Self-clocking: the smoothed time from a batch to the server's
    /// next answer.
    srtt: Option<Duration>,
    last_flush: Option<Time>,
    flushes: u64,
    flushed_messages: u64,
}

impl Batcher {
    /// A batcher with nothing waiting.
    pub fn new(cfg: BatcherConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let (interval, size) = match &cfg.policy {
            BatchPolicy::Adaptive(a) => (a.initial_interval, a.initial_size),
            BatchPolicy::SelfClocking { max_wait } => (*max_wait, cfg.max_frame),
        };
        Ok(Batcher {
            cfg,
            interval,
            size,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            outstanding: 0,
            awaiting: None,
            srtt: None,
            last_flush: None,
            flushes: 0,
            flushed_messages: 0,
        })
    }

    /// A message of `len` bytes joined at `now`, after every message
    /// given before it.
    pub fn handle_queued(&mut self, now: Time, len: usize) -> Result<(), BatcherError> {
        let limit = self.cfg.max_pending;
        if self.waiting_bytes.saturating_add(len) > limit && !self.waiting.is_empty() {
            return Err(BatcherError::Full {
                pending: self.waiting_bytes,
                len,
                limit,
            });
        }
        self.waiting.push_back((len, now));
        self.waiting_bytes += len;
        Ok(())
    }

    /// The server answered `messages` of those sent (in any order), at
    /// `now`. Self-clocking also learns from it how long the server
    /// takes to answer.
    pub fn handle_answered(&mut self, now: Time, messages: u64) {
        if let Some(t) = self.awaiting {
            let sample = now.saturating_since(t);
            self.srtt = Some(match self.srtt {
                None => sample,
                Some(s) => (s * 7 + sample) / 8,
            });
        }
        self.outstanding = self.outstanding.saturating_sub(messages);
        self.awaiting = (self.outstanding > 0).then_some(now);
    }

    /// What was sent and not yet answered is void (the path to the
    /// server was lost; the session re-sends it and the shell counts it
    /// again as answered when it is).
    pub fn handle_reset(&mut self) {
        self.outstanding = 0;
        self.awaiting = None;
    }

    /// Self-clocking: how long an unanswered batch holds the next one
    /// back — twice the server's usual answer time (not every batch gets
    /// an answer: an acknowledgement alone does not), between
    /// [`MIN_ANSWER_WAIT`] and `max_wait`.
    pub fn answer_wait(&self) -> Duration {
        let max = match &self.cfg.policy {
            BatchPolicy::SelfClocking { max_wait } => *max_wait,
            BatchPolicy::Adaptive(_) => self.interval,
        };
        self.srtt
            .map_or(max, |s| (s * 2).max(MIN_ANSWER_WAIT).min(max))
    }

    /// The batch due at `now`, if one is; it counts as sent.
    pub fn poll_flush(&mut self, now: Time) -> Option<Flush> {
        let oldest = self.waiting.front()?.1;
        let waited = now.saturating_since(oldest);
        let full = self.waiting_bytes >= self.cfg.max_frame;
        let due = full
            || match &self.cfg.policy {
                BatchPolicy::Adaptive(_) => {
                    self.waiting_bytes >= self.size || waited >= self.interval
                }
                BatchPolicy::SelfClocking { max_wait } => {
                    self.outstanding == 0 || waited >= *max_wait || self.unanswerable(now)
                }
            };
        if !due {
            return None;
        }
        if self.unanswerable(now) {
            // No answer is coming for what is outstanding: stop waiting.
            self.outstanding = 0;
        }
        if self.outstanding == 0 {
            self.awaiting = Some(now);
        }
        // The oldest messages that fit one frame; one alone if it is larger.
        let (mut messages, mut bytes) = (0, 0);
        for (len, _) in &self.waiting {
            if messages > 0 && bytes + len > self.cfg.max_frame {
                break;
            }
            messages += 1;
            bytes += len;
        }
        self.waiting.drain(..messages);
        self.waiting_bytes -= bytes;
        self.outstanding += messages as u64;
        self.retune(now, bytes);
        self.last_flush = Some(now);
        self.flushes += 1;
        self.flushed_messages += messages as u64;
        Some(Flush { messages, bytes })
    }

    /// Algorithm 1's update after a batch of `bytes` sent at `now`.
    fn retune(&mut self, now: Time, bytes: usize) {
        let BatchPolicy::Adaptive(a) = &self.cfg.policy else {
            return;
        };
        if let Some(prev) = self.last_flush {
            let t = now.saturating_since(prev);
            let (lo, hi) = (self.interval / 2, self.interval * 3 / 2);
            if (t < lo || t > hi) && t >= a.min_interval {
                self.interval = t.clamp(a.min_interval, a.max_interval);
            }
        }
        let (lo, hi) = (self.size / 2, self.size.saturating_mul(3) / 2);
        if bytes < lo || bytes > hi {
            self.size = bytes.clamp(a.min_size, self.cfg.max_frame);
        }
    }

    /// Self-clocking: the outstanding batch waited past
    /// [`Batcher::answer_wait`].
    fn unanswerable(&self, now: Time) -> bool {
        matches!(self.cfg.policy, BatchPolicy::SelfClocking { .. })
            && self
                .awaiting
                .is_some_and(|t| now.saturating_since(t) >= self.answer_wait())
    }

    /// When [`Batcher::poll_flush`] is next due by time alone (`None`:
    /// nothing waits, or only an answer or more messages can make it due).
    pub fn poll_timeout(&self) -> Option<Time> {
        let oldest = self.waiting.front()?.1;
        let by_age = oldest + self.interval;
        match (&self.cfg.policy, self.awaiting) {
            (BatchPolicy::SelfClocking { .. }, Some(t)) => Some(by_age.min(t + self.answer_wait())),
            _ => Some(by_age),
        }
    }

    /// Algorithm 1's current interval `T` (self-clocking: `max_wait`).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Algorithm 1's current size `S` (self-clocking: `max_frame`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes waiting.
    pub fn waiting_bytes(&self) -> usize {
        self.waiting_bytes
    }

    /// Messages sent and not yet answered.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// Batches sent, and the messages in them.
    pub fn totals(&self) -> (u64, u64) {
        (self.flushes, self.flushed_messages)
    }
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
