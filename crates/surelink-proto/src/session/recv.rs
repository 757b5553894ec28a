//! The receiving half of a session: duplicate suppression, the bounded
//! reorder buffer, in-order release, and the acknowledgement state.
//!
//! Per stream three counters split the sequence space:
//!
//! ```text
//!   consumed          next
//!      |               |
//! ...--+---------------+----[reorder buffer: out-of-order arrivals]--...
//!  delivered to app     released in order,
//!  (cumulative ack)     waiting for the app to poll (selectively acked)
//! ```
//!
//! What arrives is a *chunk*: the messages of one DATA or BATCH frame, with
//! consecutive numbers. Chunks are held and released whole. The cumulative
//! acknowledgement is `consumed`: a sender keeps a message until the peer
//! *application* has it, so everything buffered here is covered by the
//! sender's cache and bounded by our advertised window.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::config::message_cost;
use crate::ids::StreamId;
use crate::time::Time;
use crate::wire::{MAX_ACK_RANGES, MIN_BATCHED_MESSAGE};

/// A set of disjoint half-open ranges `[start, end)`, merged on insert.
#[derive(Debug, Default)]
pub(crate) struct RangeSet {
    /// start -> end
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Adds `[start, end)`, merging with neighbours it touches or overlaps.
    pub(crate) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                if e >= end {
                    return; // already covered
                }
                start = s;
                self.map.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.map.range(start..).next() {
            if s > end {
                break;
            }
            self.map.remove(&s);
            end = end.max(e);
        }
        self.map.insert(start, end);
    }

    /// Removes everything below `seq`.
    pub(crate) fn trim_below(&mut self, seq: u64) {
        while let Some((&s, &e)) = self.map.first_key_value() {
            if s >= seq {
                break;
            }
            self.map.remove(&s);
            if e > seq {
                self.map.insert(seq, e);
                break;
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }

    /// The parts of `[start, end)` not in the set, in order. O(log n + the
    /// ranges it overlaps).
    pub(crate) fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        if let Some((_, &e)) = self.map.range(..=start).next_back() {
            at = at.max(e);
        }
        for (&s, &e) in self.map.range(start..end) {
            if at >= end {
                break;
            }
            if s > at {
                out.push((at, s.min(end)));
            }
            at = at.max(e);
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Removes everything.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// What a chunk carries.
#[derive(Clone, Debug)]
pub(crate) enum ChunkBody {
    /// One message (`None`: a withdrawn number, delivered as nothing).
    Single(Option<Bytes>),
    /// Several messages, framed as in a BATCH frame (validated).
    Batch(Bytes),
}

/// The messages of one frame.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    pub(crate) count: u32,
    /// Accounting cost against the window (the sender's entry cost).
    pub(crate) cost: u64,
    pub(crate) body: ChunkBody,
}

impl Chunk {
    /// A chunk of the frame body `wire_len` bytes long.
    pub(crate) fn new(count: u32, wire_len: usize, body: ChunkBody) -> Chunk {
        Chunk {
            count,
            cost: message_cost(wire_len),
            body,
        }
    }

    /// The same chunk with its bytes copied out of the buffer they arrived
    /// in: a zero-copy slice would pin the whole receive buffer for as long
    /// as the chunk waits.
    fn detached(self) -> Chunk {
        let body = match self.body {
            ChunkBody::Single(p) => ChunkBody::Single(p.map(|p| Bytes::copy_from_slice(&p))),
            ChunkBody::Batch(b) => ChunkBody::Batch(Bytes::copy_from_slice(&b)),
        };
        Chunk { body, ..self }
    }
}

/// One stream's incoming state.
#[derive(Debug, Default)]
pub(crate) struct RecvStream {
    /// Delivered to the application: the cumulative acknowledgement.
    pub(crate) consumed: u64,
    /// Everything below arrived; `[consumed, next)` waits for the application.
    pub(crate) next: u64,
    /// Out-of-order arrivals above `next`, by first sequence number.
    reorder: BTreeMap<u64, Chunk>,
    /// The same sequence numbers as `reorder`, as ranges (for acks).
    ranges: RangeSet,
    /// Changed since the last acknowledgement.
    pub(crate) dirty: bool,
}

impl RecvStream {
    /// Writes this stream's selective ranges into `out` (cleared first).
    pub(crate) fn ack_ranges(&self, out: &mut Vec<(u64, u64)>, max: usize) {
        out.clear();
        if self.next > self.consumed {
            out.push((self.consumed, self.next));
        }
        for r in self.ranges.iter() {
            if out.len() >= max.min(MAX_ACK_RANGES) {
                break;
            }
            out.push(r);
        }
    }

    pub(crate) fn has_state(&self) -> bool {
        self.consumed > 0 || self.next > 0 || !self.ranges.is_empty()
    }

    /// Whether `[first, end)` overlaps a buffered chunk other than one
    /// starting exactly at `first`.
    fn overlaps(&self, first: u64, end: u64) -> bool {
        let before = self.reorder.range(..first).next_back();
        let after = self.reorder.range(first + 1..).next();
        before.is_some_and(|(&s, c)| s + u64::from(c.count) > first)
            || after.is_some_and(|(&s, _)| s < end)
    }
}

/// The result of offering one frame's messages to the receiver.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// In order: it and any buffered successors were released.
    Released,
    /// Out of order: buffered.
    Buffered,
    /// Already had it.
    Duplicate,
    /// Would exceed the receive window; dropped unacknowledged (the sender
    /// will re-send it).
    OverWindow,
    /// Numbered beyond anything a sender honouring our window could have
    /// outstanding: a protocol violation.
    BeyondWindow,
    /// Covers part of a frame we already hold, cut differently: a sender
    /// re-sends frames whole, so this is a protocol violation.
    Overlap,
}

/// All streams' incoming state.
#[derive(Debug, Default)]
pub(crate) struct RecvSide {
    pub(crate) streams: Vec<RecvStream>,
    /// Streams with `dirty` set, each once.
    pub(crate) dirty: Vec<StreamId>,
    /// Bytes buffered (reorder + released but not consumed).
    pub(crate) buffered_bytes: u64,
    /// Frames arrived or consumed since the last acknowledgement.
    pub(crate) unacked_events: u32,
    /// When the oldest unacknowledged change happened.
    pub(crate) first_unacked: Option<Time>,
    /// Send an acknowledgement without waiting (duplicate or gap seen).
    pub(crate) ack_now: bool,
    /// Where `refresh` continues.
    refresh_cursor: usize,
}

impl RecvSide {
    fn stream_mut(&mut self, stream: StreamId) -> &mut RecvStream {
        let idx = stream.index();
        if idx >= self.streams.len() {
            self.streams.resize_with(idx + 1, RecvStream::default);
        }
        &mut self.streams[idx]
    }

    /// Marks `stream` for acknowledgement; `event` counts towards the
    /// acknowledgement frequency.
    fn mark_dirty(&mut self, stream: StreamId, now: Time, event: bool) {
        let st = &mut self.streams[stream.index()];
        if !st.dirty {
            st.dirty = true;
            self.dirty.push(stream);
        }
        if event {
            self.unacked_events = self.unacked_events.saturating_add(1);
        }
        self.first_unacked.get_or_insert(now);
    }

    /// Offers the messages `[first, first + chunk.count)`; on `Released`,
    /// calls `release(first, chunk)` for it and every buffered successor,
    /// in order.
    pub(crate) fn offer(
        &mut self,
        now: Time,
        stream: StreamId,
        first: u64,
        chunk: Chunk,
        window: u64,
        mut release: impl FnMut(u64, Chunk),
    ) -> Offer {
        let buffered = self.buffered_bytes;
        let st = self.stream_mut(stream);
        // Every outstanding message costs at least MIN_BATCHED_MESSAGE
        // against the window, so none can be numbered further ahead than
        // this. (Also keeps the arithmetic below from overflowing.)
        let horizon = st
            .consumed
            .saturating_add(window / MIN_BATCHED_MESSAGE as u64);
        let end = first.saturating_add(u64::from(chunk.count));
        if end > horizon || chunk.count == 0 {
            return Offer::BeyondWindow;
        }
        if end <= st.next {
            self.ack_now = true;
            self.mark_dirty(stream, now, false);
            return Offer::Duplicate;
        }
        if first < st.next {
            return Offer::Overlap;
        }
        if let Some(held) = st.reorder.get(&first) {
            if held.count != chunk.count {
                return Offer::Overlap;
            }
            self.ack_now = true;
            self.mark_dirty(stream, now, false);
            return Offer::Duplicate;
        }
        if st.overlaps(first, end) {
            return Offer::Overlap;
        }
        if buffered + chunk.cost > window {
            return Offer::OverWindow;
        }
        let cost = chunk.cost;
        if first == st.next {
            release(first, chunk);
            st.next = end;
            // Drain successors that were waiting.
            while let Some(entry) = st.reorder.first_entry() {
                if *entry.key() != st.next {
                    break;
                }
                let c = entry.remove();
                let from = st.next;
                st.next += u64::from(c.count);
                release(from, c);
            }
            st.ranges.trim_below(st.next);
            self.buffered_bytes += cost;
            self.mark_dirty(stream, now, true);
            Offer::Released
        } else {
            st.reorder.insert(first, chunk.detached());
            st.ranges.insert(first, end);
            self.buffered_bytes += cost;
            // A gap: tell the sender soon, so it can re-send what is missing.
            self.ack_now = true;
            self.mark_dirty(stream, now, true);
            Offer::Buffered
        }
    }

    /// The application finished chunks of `stream` up to (not including)
    /// `upto`; `freed` is their cost.
    pub(crate) fn consumed(&mut self, now: Time, stream: StreamId, upto: u64, freed: u64) {
        self.buffered_bytes = self.buffered_bytes.saturating_sub(freed);
        let st = self.stream_mut(stream);
        if upto > st.consumed {
            st.consumed = upto;
        }
        self.mark_dirty(stream, now, true);
    }

    /// Marks every stream with state for acknowledgement, at once: the peer
    /// probed, perhaps because an acknowledgement of ours was lost.
    pub(crate) fn request_full_ack(&mut self, now: Time) {
        for idx in 0..self.streams.len() {
            if self.streams[idx].has_state() {
                let stream = StreamId(u16::try_from(idx).unwrap_or(u16::MAX));
                self.mark_dirty(stream, now, true);
            }
        }
        self.ack_now = true;
    }

    /// Picks up to `n` streams with state that are not dirty, round robin,
    /// and marks them dirty: every ACK refreshes a few quiet streams, so a
    /// lost final acknowledgement is repaired while any traffic flows.
    pub(crate) fn refresh(&mut self, n: usize, now: Time) {
        let len = self.streams.len();
        let mut added = 0;
        for _ in 0..len {
            if added == n {
                break;
            }
            self.refresh_cursor = (self.refresh_cursor + 1) % len;
            let idx = self.refresh_cursor;
            let st = &self.streams[idx];
            if !st.dirty && st.has_state() {
                let stream = StreamId(u16::try_from(idx).unwrap_or(u16::MAX));
                self.mark_dirty(stream, now, false);
                added += 1;
            }
        }
    }

    /// Whether an acknowledgement should go out now.
    pub(crate) fn ack_due(
        &self,
        now: Time,
        frequency: u32,
        max_delay: std::time::Duration,
    ) -> bool {
        if self.dirty.is_empty() {
            return false;
        }
        self.ack_now
            || self.unacked_events >= frequency
            || self.first_unacked.is_some_and(|t| now >= t + max_delay)
    }

    /// When an acknowledgement will be due at the latest.
    pub(crate) fn ack_deadline(&self, max_delay: std::time::Duration) -> Option<Time> {
        if self.dirty.is_empty() {
            return None;
        }
        self.first_unacked.map(|t| t + max_delay)
    }

    /// Called after acknowledgements for every dirty stream went out.
    pub(crate) fn acked(&mut self) {
        self.unacked_events = 0;
        self.first_unacked = None;
        self.ack_now = false;
    }

    /// Frees every out-of-order chunk (the session ended: they can never
    /// be released).
    pub(crate) fn drop_reorder(&mut self) {
        for st in &mut self.streams {
            for (_, c) in std::mem::take(&mut st.reorder) {
                self.buffered_bytes = self.buffered_bytes.saturating_sub(c.cost);
            }
            st.ranges.clear();
        }
    }

    /// Chunks held in reorder buffers (for tests and stats).
    pub(crate) fn reorder_len(&self) -> usize {
        self.streams.iter().map(|c| c.reorder.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gaps_are_what_the_set_lacks() {
        let mut r = super::RangeSet::default();
        assert_eq!(r.gaps(5, 10), vec![(5, 10)]);
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(r.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(r.gaps(12, 18), vec![]);
        assert_eq!(r.gaps(15, 35), vec![(20, 30)]);
        assert_eq!(r.gaps(20, 30), vec![(20, 30)]);
        assert_eq!(r.gaps(5, 12), vec![(5, 10)]);
        assert_eq!(r.gaps(38, 45), vec![(40, 45)]);
    }

    use super::*;

    #[test]
    fn range_set_merges_neighbours_and_trims() {
        let mut r = RangeSet::default();
        for s in [5, 7, 6, 10, 9, 1] {
            r.insert(s, s + 1);
        }
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(1, 2), (5, 8), (9, 11)]);
        r.insert(6, 7);
        assert_eq!(r.iter().count(), 3);
        r.insert(11, 20);
        r.insert(3, 5);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(1, 2), (3, 8), (9, 20)]);
        r.insert(2, 9);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(1, 20)]);
        r.trim_below(6);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(6, 20)]);
        r.trim_below(30);
        assert!(r.is_empty());
    }

    fn one() -> Chunk {
        Chunk::new(1, 1, ChunkBody::Single(Some(Bytes::from_static(b"x"))))
    }

    fn batch(count: u32) -> Chunk {
        Chunk::new(count, 2 * count as usize, ChunkBody::Batch(Bytes::new()))
    }

    #[test]
    fn offer_dedups_reorders_and_bounds() {
        let mut r = RecvSide::default();
        let s = StreamId(4);
        let mut got = Vec::new();
        let w = 1000;
        let t = Time::ZERO;
        assert_eq!(
            r.offer(t, s, 2, one(), w, |q, _| got.push(q)),
            Offer::Buffered
        );
        assert_eq!(
            r.offer(t, s, 2, one(), w, |q, _| got.push(q)),
            Offer::Duplicate
        );
        assert_eq!(
            r.offer(t, s, 1, one(), w, |q, _| got.push(q)),
            Offer::Buffered
        );
        assert!(got.is_empty());
        assert_eq!(
            r.offer(t, s, 0, one(), w, |q, _| got.push(q)),
            Offer::Released
        );
        assert_eq!(got, vec![0, 1, 2]);
        assert_eq!(
            r.offer(t, s, 1, one(), w, |q, _| got.push(q)),
            Offer::Duplicate
        );
        assert_eq!(r.reorder_len(), 0);
        // 3 chunks of cost 65 buffered; a window of 200 has no room for a 4th.
        assert_eq!(
            r.offer(t, s, 3, one(), 200, |q, _| got.push(q)),
            Offer::OverWindow
        );
        let mut ranges = Vec::new();
        r.streams[s.index()].ack_ranges(&mut ranges, 8);
        assert_eq!(ranges, vec![(0, 3)]);
        r.consumed(t, s, 1, 65);
        r.streams[s.index()].ack_ranges(&mut ranges, 8);
        assert_eq!(ranges, vec![(1, 3)]);
        // Numbered beyond what the window allows.
        assert_eq!(
            r.offer(t, s, 10_000, one(), w, |_, _| {}),
            Offer::BeyondWindow
        );
    }

    #[test]
    fn batches_release_whole_and_refuse_other_cuts() {
        let mut r = RecvSide::default();
        let s = StreamId(5);
        let t = Time::ZERO;
        let w = 1 << 20;
        let mut got = Vec::new();
        // [10, 20) early, then [0, 10): both released, in order.
        assert_eq!(
            r.offer(t, s, 10, batch(10), w, |q, c| got.push((q, c.count))),
            Offer::Buffered
        );
        // Another cut over the same numbers is a violation...
        assert_eq!(r.offer(t, s, 10, batch(5), w, |_, _| {}), Offer::Overlap);
        assert_eq!(r.offer(t, s, 15, batch(10), w, |_, _| {}), Offer::Overlap);
        assert_eq!(r.offer(t, s, 5, batch(10), w, |_, _| {}), Offer::Overlap);
        // ...the same cut again is a duplicate.
        assert_eq!(r.offer(t, s, 10, batch(10), w, |_, _| {}), Offer::Duplicate);
        let mut ranges = Vec::new();
        r.streams[s.index()].ack_ranges(&mut ranges, 8);
        assert_eq!(ranges, vec![(10, 20)]);
        assert_eq!(
            r.offer(t, s, 0, batch(10), w, |q, c| got.push((q, c.count))),
            Offer::Released
        );
        assert_eq!(got, vec![(0, 10), (10, 10)]);
        r.streams[s.index()].ack_ranges(&mut ranges, 8);
        assert_eq!(ranges, vec![(0, 20)]);
        // Everything below `next` was released: old news, whatever the cut.
        assert_eq!(r.offer(t, s, 5, batch(10), w, |_, _| {}), Offer::Duplicate);
        assert_eq!(r.offer(t, s, 15, batch(10), w, |_, _| {}), Offer::Overlap);
    }
}
