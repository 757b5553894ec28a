//! The send stage: where a busy session's one-way sends wait for its next
//! drive without taking the session's lock.
//!
//! A stream of small `send`s used to take the session's lock, read the
//! clock and run the core once per message — less than half the
//! throughput of `send_many`, which does all that once per batch. While a
//! flush is scheduled (the session wrote within the last few microseconds
//! and its task will write again shortly), `send` instead appends the
//! message here, under a lock that only senders and the drain touch, and
//! the next holder of the session's lock moves everything staged into the
//! core in one go, before its own input: so staged messages keep their
//! order with every later send, and leave with the flush that was already
//! coming.
//!
//! The stage is open only while a flush is scheduled, and both change
//! together under the stage's lock. The flush drives (draining the stage)
//! with the stage still open — senders stage on meanwhile instead of
//! waiting for the session's lock — and closes it only when it finds it
//! empty after a drive, else goes round again: so nothing staged waits
//! for a drive that will not come. It takes only what
//! the core is known to accept — normal priority, within both ends'
//! limits ([`SendLimits`]) — so the one refusal left at the drain is a
//! full send buffer, after which the messages stay staged, in order, and
//! every later send waits behind them. Bounded per session by
//! [`STAGE_BYTES`] and [`STAGE_MESSAGES`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tracing::debug;

use surelink_proto::rpc::Priority;
use surelink_proto::{ChannelId, SendLimits, Time};

use super::{SessionHandle, SessionInner};
use crate::shared::Shared;

/// Most bytes staged per session: a flush's worth (the sender that would
/// go past it takes the session's lock and writes everything itself).
pub(crate) const STAGE_BYTES: usize = 8 * super::FLUSH_BATCH;
/// Most messages staged per session (empty messages cost bytes too).
pub(crate) const STAGE_MESSAGES: usize = 16384;

/// A staged message.
pub(crate) type Staged = (ChannelId, Bytes);

/// See the module docs.
#[derive(Default)]
pub(crate) struct Stage {
    inner: Mutex<Inner>,
    /// Messages staged (a hint read without the lock: the drain skips the
    /// lock when it reads 0).
    len: AtomicUsize,
    /// Bytes staged (a hint, for the flush's "is the queue growing").
    bytes: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    /// `Some` while open: what a staged message must stay within.
    open: Option<SendLimits>,
    msgs: Vec<Staged>,
    bytes: usize,
}

/// What [`Stage::offer`] did.
pub(crate) enum Offer {
    /// Staged; `first`: the stage was empty (the first of a run).
    Staged { first: bool },
    /// Not staged (closed, full, or outside the limits): handed back.
    Refused(Bytes),
}

impl Stage {
    /// Stages `m` on `channel` if the stage is open, has room, and the
    /// core will accept it.
    pub(crate) fn offer(&self, channel: ChannelId, m: Bytes) -> Offer {
        let mut s = self.inner.lock();
        let Some(limits) = s.open else {
            return Offer::Refused(m);
        };
        let len = m.len();
        if len > limits.max_message
            || u32::from(channel.0) >= limits.channels
            || s.bytes + len >= STAGE_BYTES
            || s.msgs.len() >= STAGE_MESSAGES
        {
            return Offer::Refused(m);
        }
        let first = s.msgs.is_empty();
        s.msgs.push((channel, m));
        s.bytes += len;
        self.len.store(s.msgs.len(), Ordering::Relaxed);
        self.bytes.store(s.bytes, Ordering::Relaxed);
        Offer::Staged { first }
    }

    /// A flush is being scheduled: unless `scheduled` is already set, sets
    /// it and opens the stage with `limits` (`None`: stays closed).
    /// Returns whether it set it (the caller then wakes the flush).
    pub(crate) fn schedule(
        &self,
        scheduled: &AtomicBool,
        limits: impl FnOnce() -> Option<SendLimits>,
    ) -> bool {
        let mut s = self.inner.lock();
        if scheduled.load(Ordering::Relaxed) {
            return false;
        }
        scheduled.store(true, Ordering::Release);
        s.open = limits();
        true
    }

    /// The flush drove: if nothing was staged meanwhile, closes the stage
    /// and clears `scheduled` together and returns `true` (a send that
    /// then finds it closed takes the session's lock). Otherwise leaves
    /// both, and the flush goes round again: senders stage on while a
    /// flush writes, instead of waiting for the session's lock.
    pub(crate) fn unschedule_if_empty(&self, scheduled: &AtomicBool) -> bool {
        let mut s = self.inner.lock();
        if !s.msgs.is_empty() {
            return false;
        }
        s.open = None;
        scheduled.store(false, Ordering::Release);
        true
    }

    /// The flush found the send buffer full: closes the stage and clears
    /// `scheduled` whatever it holds. What stays staged is drained by the
    /// next input that finds no flush scheduled (acknowledgements freeing
    /// room: `SessionHandle::step`), and later sends take the session's
    /// lock and wait for room behind it — rather than the flush going
    /// round and round while nothing can leave.
    pub(crate) fn unschedule(&self, scheduled: &AtomicBool) {
        let mut s = self.inner.lock();
        s.open = None;
        scheduled.store(false, Ordering::Release);
    }

    /// Closes the stage for good (the session ended); what it held is
    /// dropped by the next drain.
    pub(crate) fn close(&self) {
        self.inner.lock().open = None;
    }

    /// Whether anything may be staged (without the lock).
    pub(crate) fn is_empty_hint(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Bytes staged (without the lock).
    pub(crate) fn bytes_hint(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The size of the first message staged, if any.
    pub(crate) fn head_len(&self) -> Option<usize> {
        self.inner.lock().msgs.first().map(|(_, m)| m.len())
    }

    /// Moves everything staged into `out` (empty, its capacity reused);
    /// returns the bytes moved.
    pub(crate) fn take(&self, out: &mut Vec<Staged>) -> usize {
        let mut s = self.inner.lock();
        std::mem::swap(&mut s.msgs, out);
        let bytes = std::mem::take(&mut s.bytes);
        self.len.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        bytes
    }

    /// Puts back, in front of whatever was staged meanwhile, what the core
    /// had no room for.
    pub(crate) fn put_back(&self, rest: impl Iterator<Item = Staged>) {
        let mut s = self.inner.lock();
        let mut msgs: Vec<Staged> = rest.collect();
        msgs.append(&mut s.msgs);
        s.bytes = msgs.iter().map(|(_, m)| m.len()).sum();
        s.msgs = msgs;
        self.len.store(s.msgs.len(), Ordering::Relaxed);
        self.bytes.store(s.bytes, Ordering::Relaxed);
    }
}

impl SessionHandle {
    /// A normal one-way message, queued without the session's lock if a
    /// flush is coming anyway (see the module docs); handed back
    /// otherwise, for the locked path. On `Staged { first: true }` the
    /// caller notes traffic for the detector: once per staged run (a
    /// flush's worth), not once per message.
    pub(crate) fn offer(&self, channel: ChannelId, m: Bytes) -> Offer {
        self.stage.offer(channel, m)
    }

    /// Moves what was staged into the core, in order (before a send under
    /// the lock, so that every later one keeps its order). Returns `false`
    /// if the send buffer filled first: the rest stays staged, in front.
    /// What an ended session can no longer take is dropped (as the
    /// messages it held were).
    pub(crate) fn drain_stage(&self, g: &mut SessionInner, shared: &Shared, now: Time) -> bool {
        if self.stage.is_empty_hint() {
            return true;
        }
        // With the send buffer full (the drain on each input until acks
        // free room), leave everything where it is: taking it all to put
        // it all back costs as much as what is staged.
        if !g.core.has_room(self.stage.bytes_hint())
            && self
                .stage
                .head_len()
                .is_some_and(|len| !g.core.has_room(len))
            && !g.is_ended()
        {
            return false;
        }
        let mut drained = true;
        let mut msgs = std::mem::take(&mut g.staged);
        let staged_bytes = self.stage.take(&mut msgs);
        // Batches formed now get room for all of it at once.
        g.core.expect_sends(msgs.len(), staged_bytes);
        let (mut sent, mut bytes, mut dropped) = (0u64, 0usize, 0usize);
        let mut it = msgs.drain(..);
        while let Some((channel, m)) = it.next() {
            let len = m.len();
            match g.send(now, channel, Priority::Normal, m) {
                Ok(_) => {
                    sent += 1;
                    bytes += len;
                }
                Err(surelink_proto::SendError::Full { message, .. }) => {
                    self.stage
                        .put_back(std::iter::once((channel, message)).chain(it.by_ref()));
                    drained = false;
                    break;
                }
                Err(e) => {
                    // The session ended (anything else was checked when
                    // the message was staged).
                    dropped += 1 + it.len();
                    debug!(peer = %self.node, error = %e, dropped, "staged messages dropped");
                    break;
                }
            }
        }
        drop(it);
        g.core.expect_sends(0, 0);
        g.staged = msgs;
        if sent > 0 {
            shared.stats.messages_sent(sent);
            shared.stats.sends_staged(sent);
            let unflushed = self.unflushed.load(Ordering::Relaxed) + bytes;
            self.unflushed.store(unflushed, Ordering::Relaxed);
        }
        drained
    }

    /// The flush's drive: everything staged goes, then out. Returns
    /// `false` if the send buffer was full before the stage was empty.
    pub(super) fn poke_drain(self: &Arc<Self>, shared: &Arc<Shared>) -> bool {
        self.with(shared, |g, now| self.drain_stage(g, shared, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SendLimits = SendLimits {
        max_message: 100,
        channels: 2,
    };

    fn staged(o: Offer) -> bool {
        matches!(o, Offer::Staged { .. })
    }

    #[test]
    fn takes_only_while_open_and_within_limits_and_bounds() {
        let stage = Stage::default();
        let flag = AtomicBool::new(false);
        assert!(!staged(stage.offer(ChannelId(0), Bytes::from_static(b"x"))));
        assert!(stage.schedule(&flag, || Some(LIMITS)));
        assert!(flag.load(Ordering::Relaxed));
        // A second schedule finds it set and changes nothing.
        assert!(!stage.schedule(&flag, || None));
        assert!(matches!(
            stage.offer(ChannelId(0), Bytes::from_static(b"a")),
            Offer::Staged { first: true }
        ));
        assert!(matches!(
            stage.offer(ChannelId(1), Bytes::from_static(b"b")),
            Offer::Staged { first: false }
        ));
        // Beyond either end's limits: left to the core to refuse.
        assert!(!staged(stage.offer(ChannelId(2), Bytes::from_static(b"c"))));
        assert!(!staged(
            stage.offer(ChannelId(0), Bytes::from(vec![0; 101]))
        ));
        assert_eq!(stage.bytes_hint(), 2);
        // Not while something waits in it: the flush must go round again.
        assert!(!stage.unschedule_if_empty(&flag));
        assert!(flag.load(Ordering::Relaxed));
        let mut out = Vec::new();
        stage.take(&mut out);
        assert!(stage.unschedule_if_empty(&flag));
        assert!(!flag.load(Ordering::Relaxed));
        assert!(!staged(stage.offer(ChannelId(0), Bytes::from_static(b"d"))));
        let got: Vec<_> = out.iter().map(|(c, m)| (c.0, m.clone())).collect();
        assert_eq!(got, vec![(0, Bytes::from("a")), (1, Bytes::from("b"))]);
        assert!(stage.is_empty_hint());
    }

    #[test]
    fn bounded_in_messages_and_bytes() {
        let stage = Stage::default();
        let flag = AtomicBool::new(false);
        let wide = SendLimits {
            max_message: usize::MAX,
            channels: 1,
        };
        stage.schedule(&flag, || Some(wide));
        let mut n = 0;
        while staged(stage.offer(ChannelId(0), Bytes::new())) {
            n += 1;
        }
        assert_eq!(n, STAGE_MESSAGES);
        stage.take(&mut Vec::new());
        let big = Bytes::from(vec![0; STAGE_BYTES / 2]);
        assert!(staged(stage.offer(ChannelId(0), big.clone())));
        assert!(!staged(stage.offer(ChannelId(0), big)));
    }

    #[test]
    fn put_back_goes_in_front_of_later_messages() {
        let stage = Stage::default();
        let flag = AtomicBool::new(false);
        stage.schedule(&flag, || Some(LIMITS));
        for m in ["1", "2", "3"] {
            stage.offer(ChannelId(0), Bytes::from(m));
        }
        let mut out = Vec::new();
        stage.take(&mut out);
        stage.offer(ChannelId(0), Bytes::from("4"));
        // The core took "1" only.
        stage.put_back(out.drain(1..));
        stage.take(&mut out);
        let got: Vec<_> = out.iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(got, vec!["2", "3", "4"]);
        assert_eq!(stage.bytes_hint(), 0);
    }
}
