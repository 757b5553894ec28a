//! The sending half of a session: per-stream numbering and the retransmit
//! cache (SQR's cache, kept until the peer's application has the message).
//!
//! Every message stays here from `send` until the peer acknowledges it
//! cumulatively (i.e. its application received it). A cache *entry* is what
//! goes out as one frame: a single message (DATA) or a run of consecutive
//! small messages of one stream (BATCH). A message joins the last entry of
//! its stream while that entry has not been written yet, so messages that
//! queue behind a write in progress leave together, and a lone message is
//! never held back. Each entry knows which path it was last written to, so a
//! failing path's in-flight entries can be found and re-sent elsewhere at
//! once; an entry is always re-sent whole, with the same numbers.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::config::message_cost;
use crate::event::Abandoned;
use crate::ids::{PathId, StreamId};
use crate::time::Time;
use crate::wire::{batched_message_overhead, put_batched_message, MAX_BATCH_COUNT};

/// Where a cached entry stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    /// Accepted by `send`, never written to a path (may still grow).
    Queued,
    /// Written to `path` at `sent_at`, not yet acknowledged.
    InFlight,
    /// The peer reported it received (selective ack) but not yet delivered.
    Sacked,
    /// Needs re-sending (its path failed or timed out); in the retransmit queue.
    Pending,
}

/// Up to [`Prefix::MAX`] bytes written in front of a message's payload: the
/// message layer's header, so the payload need not be copied to prepend it.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Prefix {
    len: u8,
    bytes: [u8; Prefix::MAX],
}

impl Prefix {
    /// Longest prefix.
    pub(crate) const MAX: usize = 32;

    /// A prefix of `b`, if it is at most [`Prefix::MAX`] bytes.
    pub(crate) fn new(b: &[u8]) -> Option<Prefix> {
        let mut p = Prefix {
            len: u8::try_from(b.len()).ok()?,
            bytes: [0; Prefix::MAX],
        };
        p.bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(p)
    }

    /// The prefix bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// What an entry carries.
#[derive(Debug)]
pub(crate) enum Body {
    /// One message: the message layer's header and the payload.
    Single { prefix: Prefix, payload: Bytes },
    /// Several messages, each framed for a BATCH frame, still growing
    /// (never written).
    Batch { messages: BytesMut },
    /// A batch written at least once: frozen, so every transmission
    /// shares it instead of copying it.
    Sealed(Bytes),
}

#[derive(Debug)]
pub(crate) struct Entry {
    /// Sequence number of its first message.
    pub(crate) seq: u64,
    /// Messages in it (1 for a single message).
    pub(crate) count: u32,
    pub(crate) body: Body,
    /// Bytes of `body` on the wire (prefix and payload, or the batch's
    /// framed messages).
    pub(crate) len: usize,
    pub(crate) sent_at: Time,
    pub(crate) path: PathId,
    pub(crate) state: EntryState,
    /// Times written to a path (saturating).
    pub(crate) transmissions: u8,
    /// Replaced by an empty "withdrawn" marker (too large for the peer).
    pub(crate) withdrawn: bool,
}

impl Entry {
    /// The sequence number after its last message.
    pub(crate) fn end(&self) -> u64 {
        self.seq + u64::from(self.count)
    }

    /// Bytes it occupies on the wire after the frame's fixed part.
    #[inline]
    pub(crate) fn wire_len(&self) -> usize {
        self.len
    }

    /// Its accounting cost (cache, window, in-flight bytes).
    #[inline]
    pub(crate) fn cost(&self) -> u64 {
        message_cost(self.len)
    }
}

/// One stream's outgoing state.
#[derive(Debug, Default)]
pub(crate) struct SendStream {
    /// Sequence number of `entries[0]`'s first message; everything below
    /// was acknowledged.
    pub(crate) base: u64,
    /// Entries in sequence order, each starting where the previous ends.
    pub(crate) entries: VecDeque<Entry>,
    /// Sequence number after the last message in `entries`.
    next: u64,
    /// First sequence number never written to a path. Sends happen in
    /// sequence order per stream, so everything below was sent at least once
    /// and the peer may acknowledge nothing at or above it.
    pub(crate) sent_end: u64,
    /// Every entry below this (and at or above `base`) is `Sacked`: the
    /// peer holds it. (Sacked is final until the cumulative ack passes.)
    pub(crate) sacked_to: u64,
    /// The last ACK frame that named this stream (see `apply_ack`).
    pub(crate) ack_stamp: u64,
    /// Selective ranges already reported above `sacked_to`: a range is
    /// walked only where it says something new, so a peer repeating its
    /// ranges costs O(ranges · log n) per ACK, not a walk of the cache.
    pub(crate) reported: super::recv::RangeSet,
}

/// Why an ACK entry was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckError {
    /// It acknowledged a message never sent (the first unsent number).
    Unsent(u64),
    /// The frame named the stream twice.
    RepeatedStream,
}

impl SendStream {
    /// Index of the entry holding `seq`.
    fn index(&self, seq: u64) -> Option<usize> {
        if seq < self.base || seq >= self.next {
            return None;
        }
        // Singles only (the common case for large messages): direct.
        if let Ok(i) = usize::try_from(seq - self.base) {
            if self.entries.get(i).is_some_and(|e| e.seq == seq) {
                return Some(i);
            }
        }
        let i = self.entries.partition_point(|e| e.end() <= seq);
        (i < self.entries.len()).then_some(i)
    }

    /// The entry whose first message is `seq`.
    pub(crate) fn get_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let i = self.index(seq)?;
        self.entries.get_mut(i).filter(|e| e.seq == seq)
    }

    /// The entry whose first message is `seq`.
    pub(crate) fn get(&self, seq: u64) -> Option<&Entry> {
        let i = self.index(seq)?;
        self.entries.get(i).filter(|e| e.seq == seq)
    }

    /// The entry holding message `seq` (first or not).
    pub(crate) fn holding(&self, seq: u64) -> Option<&Entry> {
        self.entries.get(self.index(seq)?)
    }
}

/// What an acknowledgement freed, for the caller's path accounting.
#[derive(Debug, Default)]
pub(crate) struct AckOutcome {
    /// Newest entry first-transmitted exactly once that this ack newly
    /// covered: `(path, sent_at)`, for an RTT sample (Karn's rule).
    pub(crate) rtt_sample: Option<(PathId, Time)>,
    /// Some stream's cumulative point moved.
    pub(crate) progress: bool,
}

/// How messages are batched.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchLimits {
    /// Largest message that joins a batch.
    pub(crate) message: usize,
    /// Largest batch, messages and their framing.
    pub(crate) bytes: usize,
}

/// All streams' outgoing state plus the scheduling queues.
#[derive(Debug, Default)]
pub(crate) struct SendSide {
    pub(crate) streams: Vec<SendStream>,
    /// Entries visited while applying selective ACK ranges (to show that
    /// repeated ranges are not walked again).
    pub(crate) ack_walked: u64,
    /// Entries never sent, in `send` order across streams.
    pub(crate) new_queue: VecDeque<(StreamId, u64)>,
    /// Entries to re-send before any new one (SQR). May hold stale
    /// references (acked meanwhile); they are skipped when popped.
    pub(crate) retx_queue: VecDeque<(StreamId, u64)>,
    /// Cost of every cached entry.
    pub(crate) cache_bytes: u64,
    /// Cost of entries sent at least once and not cumulatively acknowledged:
    /// an upper bound on what the peer buffers for us.
    pub(crate) outstanding_bytes: u64,
    /// Messages in the cache.
    pub(crate) cache_len: u64,
    /// Entries in the cache.
    pub(crate) cache_entries: u64,
    /// Bytes of messages the caller said follow at once (a drain of many
    /// queued sends): a batch formed meanwhile is sized for them from the
    /// start instead of growing by copies.
    pub(crate) expected: usize,
}

impl SendSide {
    pub(crate) fn stream_mut(&mut self, stream: StreamId) -> &mut SendStream {
        let idx = stream.index();
        if idx >= self.streams.len() {
            self.streams.resize_with(idx + 1, SendStream::default);
        }
        &mut self.streams[idx]
    }

    /// Queues a message; joins the stream's last entry when `batch` allows
    /// and that entry has not been written yet. Returns its sequence number.
    pub(crate) fn push(
        &mut self,
        stream: StreamId,
        prefix: Prefix,
        payload: Bytes,
        batch: Option<BatchLimits>,
    ) -> u64 {
        let len = prefix.as_slice().len() + payload.len();
        let expected = self.expected;
        let st = self.stream_mut(stream);
        let seq = st.next;
        if let (Some(limits), Some(last)) = (batch, st.entries.back_mut()) {
            let framed = batched_message_overhead(len) + len;
            let last_len = match &last.body {
                Body::Single { .. } if last.len <= limits.message => {
                    batched_message_overhead(last.len) + last.len
                }
                Body::Single { .. } | Body::Sealed(_) => usize::MAX,
                Body::Batch { .. } => last.len,
            };
            let joins = last.state == EntryState::Queued
                && !last.withdrawn
                && len <= limits.message
                && (last.count as usize) < MAX_BATCH_COUNT
                && last_len.saturating_add(framed) <= limits.bytes;
            if joins {
                let before = last.len;
                append(
                    last,
                    prefix.as_slice(),
                    &payload,
                    expected.min(limits.bytes),
                );
                st.next += 1;
                self.cache_bytes += (last.len - before) as u64;
                self.expected = expected.saturating_sub(framed);
                self.cache_len += 1;
                return seq;
            }
        }
        let e = Entry {
            seq,
            count: 1,
            body: Body::Single { prefix, payload },
            len,
            sent_at: Time::ZERO,
            path: PathId(0),
            state: EntryState::Queued,
            transmissions: 0,
            withdrawn: false,
        };
        let cost = e.cost();
        st.entries.push_back(e);
        st.next += 1;
        self.expected = expected.saturating_sub(batched_message_overhead(len) + len);
        self.cache_bytes += cost;
        self.new_queue.push_back((stream, seq));
        self.cache_len += 1;
        self.cache_entries += 1;
        seq
    }

    pub(crate) fn entry(&self, stream: StreamId, seq: u64) -> Option<&Entry> {
        self.streams.get(stream.index())?.get(seq)
    }

    pub(crate) fn entry_mut(&mut self, stream: StreamId, seq: u64) -> Option<&mut Entry> {
        self.streams.get_mut(stream.index())?.get_mut(seq)
    }

    /// Applies one stream's acknowledgement. `on_inflight_freed(path, cost)`
    /// is told of every in-flight entry that stops counting against its path.
    ///
    /// `stamp` identifies the ACK frame: a stream may appear once per frame,
    /// which (with ranges being disjoint) bounds the work of one frame by the
    /// size of the cache.
    pub(crate) fn apply_ack(
        &mut self,
        stream: StreamId,
        cumulative: u64,
        ranges: impl Iterator<Item = (u64, u64)>,
        stamp: u64,
        out: &mut AckOutcome,
        mut on_inflight_freed: impl FnMut(PathId, u64),
    ) -> Result<(), AckError> {
        let Some(st) = self.streams.get_mut(stream.index()) else {
            return if cumulative == 0 {
                Ok(())
            } else {
                Err(AckError::Unsent(0))
            };
        };
        if st.ack_stamp == stamp {
            return Err(AckError::RepeatedStream);
        }
        st.ack_stamp = stamp;
        if cumulative > st.sent_end {
            return Err(AckError::Unsent(st.sent_end));
        }
        let note_sample = |e: &Entry, out: &mut AckOutcome| {
            if e.transmissions == 1 && e.state == EntryState::InFlight {
                let newer = out.rtt_sample.is_none_or(|(_, t)| e.sent_at >= t);
                if newer {
                    out.rtt_sample = Some((e.path, e.sent_at));
                }
            }
        };
        // Whole entries below the cumulative point: delivered, freed.
        while st.entries.front().is_some_and(|e| e.end() <= cumulative) {
            let Some(e) = st.entries.pop_front() else {
                break;
            };
            out.progress = true;
            st.base = e.end();
            let cost = e.cost();
            note_sample(&e, out);
            match e.state {
                EntryState::InFlight => {
                    on_inflight_freed(e.path, cost);
                    self.outstanding_bytes -= cost;
                }
                EntryState::Sacked | EntryState::Pending => self.outstanding_bytes -= cost,
                // Unreachable: `cumulative <= sent_end` was checked above.
                EntryState::Queued => {}
            }
            self.cache_bytes -= cost;
            self.cache_len -= u64::from(e.count);
            self.cache_entries -= 1;
        }
        // An entry the receiving application is part-way through: the peer
        // holds all of it (frames arrive whole), so it needs no re-send.
        if let Some(e) = st.entries.front_mut() {
            if e.seq < cumulative {
                out.progress = true;
                mark_sacked(e, out, &mut on_inflight_freed, note_sample);
                st.sacked_to = st.sacked_to.max(e.end());
            }
        }
        for (start, end) in ranges {
            if end > st.sent_end {
                return Err(AckError::Unsent(st.sent_end));
            }
            // Entries in [base, sacked_to) are already marked; a receiver
            // whose application is slow repeats that prefix in every ACK, so
            // skip it rather than walk it again.
            let mut from = start.max(st.base);
            let contiguous = from <= st.sacked_to.max(st.base);
            if contiguous {
                from = from.max(st.sacked_to);
            }
            if from >= end {
                continue;
            }
            // Only entries the range covers whole (a well-behaved peer never
            // reports part of a frame), and only where it is news: the parts
            // of it no earlier ACK reported. (An entry a misbehaving peer
            // covered piecewise, never whole, stays unmarked: re-sent later,
            // dropped as a duplicate.)
            let mut covered_to = from;
            let gaps = if contiguous {
                vec![(from, end)]
            } else {
                st.reported.gaps(from, end)
            };
            for (gs, ge) in gaps {
                let Some(mut i) = st.index(gs) else {
                    continue;
                };
                while let Some(e) = st.entries.get_mut(i) {
                    if e.seq >= ge {
                        break;
                    }
                    self.ack_walked += 1;
                    if e.seq >= start && e.end() <= end {
                        mark_sacked(e, out, &mut on_inflight_freed, note_sample);
                        if e.seq <= covered_to {
                            covered_to = e.end();
                        }
                    }
                    i += 1;
                }
            }
            if contiguous {
                st.sacked_to = st.sacked_to.max(covered_to);
            } else {
                st.reported.insert(from, end);
            }
        }
        // What lies below the marked prefix needs no memory.
        let floor = st.sacked_to.max(st.base);
        st.reported.trim_below(floor);
        Ok(())
    }

    /// Removes everything; returns the unacknowledged runs per stream.
    pub(crate) fn abandon_all(&mut self) -> Vec<Abandoned> {
        let mut out = Vec::new();
        for (idx, st) in self.streams.iter_mut().enumerate() {
            if !st.entries.is_empty() {
                let stream = StreamId(u16::try_from(idx).unwrap_or(u16::MAX));
                out.push(Abandoned {
                    stream,
                    start: st.base,
                    end: st.next,
                });
                st.base = st.next;
                st.sent_end = st.base;
                st.entries.clear();
                st.reported.clear();
            }
        }
        self.new_queue.clear();
        self.retx_queue.clear();
        self.cache_bytes = 0;
        self.outstanding_bytes = 0;
        self.cache_len = 0;
        self.cache_entries = 0;
        out
    }
}

fn mark_sacked(
    e: &mut Entry,
    out: &mut AckOutcome,
    on_inflight_freed: &mut impl FnMut(PathId, u64),
    note_sample: impl Fn(&Entry, &mut AckOutcome),
) {
    if matches!(e.state, EntryState::InFlight | EntryState::Pending) {
        note_sample(e, out);
        if e.state == EntryState::InFlight {
            on_inflight_freed(e.path, e.cost());
        }
        e.state = EntryState::Sacked;
    }
}

/// Appends a message to a queued entry, turning a single into a batch.
/// `reserve`: bytes the batch is expected to grow to (0: unknown).
fn append(e: &mut Entry, prefix: &[u8], payload: &[u8], reserve: usize) {
    if let Body::Single {
        prefix: p0,
        payload: b0,
    } = &e.body
    {
        let first = batched_message_overhead(e.len) + e.len;
        let next =
            batched_message_overhead(prefix.len() + payload.len()) + prefix.len() + payload.len();
        // Room for a few more: a batch forms when messages queue quickly.
        let mut messages = BytesMut::with_capacity(((first + next) * 4).max(reserve));
        put_batched_message(&mut messages, p0.as_slice(), b0);
        e.body = Body::Batch { messages };
    }
    if let Body::Batch { messages } = &mut e.body {
        put_batched_message(messages, prefix, payload);
        e.count += 1;
        e.len = messages.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::BatchIter;

    const S: StreamId = StreamId(4);
    const LIMITS: Option<BatchLimits> = Some(BatchLimits {
        message: 100,
        bytes: 300,
    });

    fn msg(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    fn batch_buffer(s: &SendSide) -> (*const u8, usize) {
        match &s.streams[S.index()].entries.back().unwrap().body {
            Body::Batch { messages } => (messages.as_ptr(), messages.capacity()),
            _ => panic!("not a batch"),
        }
    }

    #[test]
    fn an_expected_run_sizes_its_batch_once_and_the_hint_runs_out() {
        let limits = Some(BatchLimits {
            message: 100,
            bytes: 4096,
        });
        let mut s = SendSide {
            expected: 40 * 60,
            ..SendSide::default()
        };
        s.push(S, Prefix::default(), msg(50), limits);
        s.push(S, Prefix::default(), msg(50), limits);
        let (ptr, cap) = batch_buffer(&s);
        assert!(cap >= 40 * 52, "room for the whole run: {cap}");
        for _ in 2..40 {
            s.push(S, Prefix::default(), msg(50), limits);
        }
        // Never grown (moved) on the way.
        assert_eq!(batch_buffer(&s), (ptr, cap));
        assert_eq!(s.streams[S.index()].entries.len(), 1);
        // The run used up the hint: the next batch is sized as usual.
        assert!(s.expected < 40 * 60 - 39 * 52, "{}", s.expected);
        s.expected = 0;
        let t = StreamId(8);
        s.push(t, Prefix::default(), msg(50), limits);
        s.push(t, Prefix::default(), msg(50), limits);
        match &s.streams[t.index()].entries.back().unwrap().body {
            Body::Batch { messages } => assert!(messages.capacity() < 1024),
            _ => panic!("not a batch"),
        }
    }

    #[test]
    fn queued_messages_join_until_a_limit_then_start_anew() {
        let mut s = SendSide::default();
        for _ in 0..3 {
            s.push(S, Prefix::default(), msg(50), LIMITS);
        }
        // Too large to batch: its own entry; the next joins nothing queued
        // behind a single that is too large either.
        s.push(S, Prefix::default(), msg(150), LIMITS);
        s.push(S, Prefix::default(), msg(10), LIMITS);
        let st = &s.streams[S.index()];
        let shape: Vec<(u64, u32)> = st.entries.iter().map(|e| (e.seq, e.count)).collect();
        assert_eq!(shape, vec![(0, 3), (3, 1), (4, 1)]);
        assert_eq!(s.cache_len, 5);
        assert_eq!(s.cache_entries, 3);
        assert_eq!(
            s.cache_bytes,
            st.entries.iter().map(Entry::cost).sum::<u64>()
        );
        // A batch's messages come back out whole, in order.
        assert!(st.entries.iter().all(|e| e.len
            == match &e.body {
                Body::Single { prefix, payload } => prefix.as_slice().len() + payload.len(),
                Body::Batch { messages } => messages.len(),
                Body::Sealed(b) => b.len(),
            }));
        let Body::Batch { messages } = &st.entries[0].body else {
            panic!("not a batch")
        };
        let out: Vec<Bytes> = BatchIter::new(messages.clone().freeze()).collect();
        assert_eq!(out, vec![msg(50), msg(50), msg(50)]);
        // Byte limit: 6 x 52 > 300.
        let mut s = SendSide::default();
        for _ in 0..6 {
            s.push(S, Prefix::default(), msg(50), LIMITS);
        }
        let counts: Vec<u32> = s.streams[S.index()]
            .entries
            .iter()
            .map(|e| e.count)
            .collect();
        assert_eq!(counts, vec![5, 1]);
        assert_eq!(s.streams[S.index()].holding(4).map(|e| e.seq), Some(0));
        assert_eq!(s.streams[S.index()].holding(5).map(|e| e.seq), Some(5));
    }

    #[test]
    fn a_written_entry_takes_no_more_messages() {
        let mut s = SendSide::default();
        s.push(S, Prefix::default(), msg(10), LIMITS);
        s.streams[S.index()].entries[0].state = EntryState::InFlight;
        s.push(S, Prefix::default(), msg(10), LIMITS);
        assert_eq!(s.streams[S.index()].entries.len(), 2);
        // Without limits (peer unknown) nothing batches.
        let mut s = SendSide::default();
        s.push(S, Prefix::default(), msg(10), None);
        s.push(S, Prefix::default(), msg(10), None);
        assert_eq!(s.streams[S.index()].entries.len(), 2);
    }

    #[test]
    fn acks_free_whole_entries_and_sack_partly_consumed_ones() {
        let mut s = SendSide::default();
        for _ in 0..4 {
            s.push(S, Prefix::default(), msg(10), LIMITS);
        }
        // Entry [0, 4) in flight on path 1.
        let cost = {
            let st = s.stream_mut(S);
            let e = &mut st.entries[0];
            e.state = EntryState::InFlight;
            e.path = PathId(1);
            e.transmissions = 1;
            st.sent_end = 4;
            st.entries[0].cost()
        };
        s.outstanding_bytes = cost;
        let mut freed = Vec::new();
        let mut out = AckOutcome::default();
        // The application took two of the four: sacked, not freed.
        s.apply_ack(S, 2, std::iter::empty(), 1, &mut out, |p, c| {
            freed.push((p, c))
        })
        .unwrap();
        assert_eq!(freed, vec![(PathId(1), cost)]);
        assert_eq!(s.streams[S.index()].entries[0].state, EntryState::Sacked);
        assert_eq!(s.cache_len, 4);
        // All four: freed.
        s.apply_ack(S, 4, std::iter::empty(), 2, &mut out, |_, _| {})
            .unwrap();
        assert_eq!((s.cache_len, s.cache_bytes, s.outstanding_bytes), (0, 0, 0));
        assert_eq!(s.streams[S.index()].base, 4);
        // Beyond what was sent: refused.
        assert_eq!(
            s.apply_ack(S, 5, std::iter::empty(), 3, &mut out, |_, _| {}),
            Err(AckError::Unsent(4))
        );
        assert_eq!(
            s.apply_ack(S, 4, std::iter::empty(), 3, &mut out, |_, _| {}),
            Err(AckError::RepeatedStream)
        );
    }

    #[test]
    fn repeated_selective_ranges_are_not_walked_again() {
        // 10 000 singles in flight; the peer holds all but the first and
        // says so in every ACK (as an attacker or a stuck head would).
        let mut s = SendSide::default();
        let n = 10_000u64;
        for _ in 0..n {
            s.push(S, Prefix::default(), msg(10), None);
        }
        {
            let st = s.stream_mut(S);
            st.sent_end = n;
            for e in &mut st.entries {
                e.state = EntryState::InFlight;
                e.path = PathId(1);
                e.transmissions = 1;
            }
        }
        s.outstanding_bytes = s.cache_bytes;
        let mut out = AckOutcome::default();
        for stamp in 1..=1_000u64 {
            s.apply_ack(S, 0, [(1, n)].into_iter(), stamp, &mut out, |_, _| {})
                .unwrap();
        }
        let st = &s.streams[S.index()];
        assert!(st
            .entries
            .iter()
            .skip(1)
            .all(|e| e.state == EntryState::Sacked));
        assert_eq!(st.entries[0].state, EntryState::InFlight);
        // Each entry walked once, not once per ACK (10 million).
        assert!(s.ack_walked <= n + 1_000, "walked {} entries", s.ack_walked);
        // The head arrives: everything frees, nothing is left to remember.
        s.apply_ack(S, n, std::iter::empty(), 1_001, &mut out, |_, _| {})
            .unwrap();
        assert_eq!(s.cache_len, 0);
        assert!(s.streams[S.index()].reported.is_empty());
    }
}
