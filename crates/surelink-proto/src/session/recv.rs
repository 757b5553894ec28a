//! The receiving half of a session: duplicate suppression, the bounded
//! reorder buffer, in-order release, and the acknowledgement state.
//!
//! Per channel three counters split the sequence space:
//!
//! ```text
//!   consumed          next
//!      |               |
//! ...--+---------------+----[reorder buffer: out-of-order arrivals]--...
//!  delivered to app     released in order,
//!  (cumulative ack)     waiting for the app to poll (selectively acked)
//! ```
//!
//! The cumulative acknowledgement is `consumed`: a sender keeps a message
//! until the peer *application* has it, so everything buffered here is
//! covered by the sender's cache and bounded by our advertised window.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::config::{message_cost, MESSAGE_OVERHEAD};
use crate::ids::ChannelId;
use crate::time::Time;
use crate::wire::MAX_ACK_RANGES;

/// A set of disjoint half-open ranges `[start, end)`, merged on insert.
#[derive(Debug, Default)]
pub(crate) struct RangeSet {
    /// start -> end
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub(crate) fn insert(&mut self, seq: u64) {
        let mut start = seq;
        // Callers bound `seq` far below u64::MAX; saturate all the same.
        let mut end = seq.saturating_add(1);
        if let Some((&s, &e)) = self.map.range(..=seq).next_back() {
            if e > seq {
                return; // already covered
            }
            if e == seq {
                start = s;
                self.map.remove(&s);
            }
        }
        if let Some(&e) = self.map.get(&end) {
            self.map.remove(&end);
            end = e;
        }
        self.map.insert(start, end);
    }

    /// Removes `seq` from the front range if that range starts at `seq`.
    pub(crate) fn pop_front_if(&mut self, seq: u64) {
        if let Some((&s, &e)) = self.map.first_key_value() {
            if s == seq {
                self.map.remove(&s);
                if e > seq.saturating_add(1) {
                    self.map.insert(seq + 1, e);
                }
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// One channel's incoming stream.
#[derive(Debug, Default)]
pub(crate) struct RecvChannel {
    /// Delivered to the application: the cumulative acknowledgement.
    pub(crate) consumed: u64,
    /// Everything below arrived; `[consumed, next)` waits in the event queue.
    pub(crate) next: u64,
    /// Out-of-order arrivals above `next` (`None`: a withdrawn number).
    reorder: BTreeMap<u64, Option<Bytes>>,
    /// The same sequence numbers as `reorder`, as ranges (for acks).
    ranges: RangeSet,
    /// Changed since the last acknowledgement.
    pub(crate) dirty: bool,
}

impl RecvChannel {
    /// Writes this channel's selective ranges into `out` (cleared first).
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
}

/// The result of offering one DATA frame to the receiver.
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
}

/// All channels' incoming state.
#[derive(Debug, Default)]
pub(crate) struct RecvSide {
    pub(crate) channels: Vec<RecvChannel>,
    /// Channels with `dirty` set, each once.
    pub(crate) dirty: Vec<ChannelId>,
    /// Bytes buffered (reorder + released but not consumed).
    pub(crate) buffered_bytes: u64,
    /// Messages arrived or consumed since the last acknowledgement.
    pub(crate) unacked_events: u32,
    /// When the oldest unacknowledged change happened.
    pub(crate) first_unacked: Option<Time>,
    /// Send an acknowledgement without waiting (duplicate or gap seen).
    pub(crate) ack_now: bool,
    /// Where `refresh` continues.
    refresh_cursor: usize,
}

impl RecvSide {
    fn channel_mut(&mut self, channel: ChannelId) -> &mut RecvChannel {
        let idx = usize::from(channel.0);
        if idx >= self.channels.len() {
            self.channels.resize_with(idx + 1, RecvChannel::default);
        }
        &mut self.channels[idx]
    }

    fn mark_dirty(&mut self, channel: ChannelId, now: Time) {
        let ch = &mut self.channels[usize::from(channel.0)];
        if !ch.dirty {
            ch.dirty = true;
            self.dirty.push(channel);
        }
        self.unacked_events = self.unacked_events.saturating_add(1);
        self.first_unacked.get_or_insert(now);
    }

    /// Offers a message (`None`: a withdrawn number); on `Released`, calls
    /// `release(seq, payload)` for it and every buffered successor, in order.
    pub(crate) fn offer(
        &mut self,
        now: Time,
        channel: ChannelId,
        seq: u64,
        payload: Option<Bytes>,
        window: u64,
        mut release: impl FnMut(u64, Option<Bytes>),
    ) -> Offer {
        let cost = message_cost(payload.as_ref().map_or(0, Bytes::len));
        let buffered = self.buffered_bytes;
        let ch = self.channel_mut(channel);
        // Every outstanding message costs at least MESSAGE_OVERHEAD against
        // the window, so none can be numbered further ahead than this. (Also
        // keeps `seq + 1` below from overflowing.)
        if seq > ch.consumed.saturating_add(window / MESSAGE_OVERHEAD) {
            return Offer::BeyondWindow;
        }
        if seq < ch.next || ch.reorder.contains_key(&seq) {
            self.ack_now = true;
            self.mark_dirty(channel, now);
            return Offer::Duplicate;
        }
        if buffered + cost > window {
            return Offer::OverWindow;
        }
        if seq == ch.next {
            release(seq, payload);
            ch.next += 1;
            // Drain successors that were waiting.
            while let Some(entry) = ch.reorder.first_entry() {
                if *entry.key() != ch.next {
                    break;
                }
                let p = entry.remove();
                ch.ranges.pop_front_if(ch.next);
                release(ch.next, p);
                ch.next += 1;
            }
            self.buffered_bytes += cost;
            self.mark_dirty(channel, now);
            Offer::Released
        } else {
            // Copied: a zero-copy slice would pin the whole receive buffer it
            // came from for as long as the gap stays open.
            ch.reorder
                .insert(seq, payload.map(|p| Bytes::copy_from_slice(&p)));
            ch.ranges.insert(seq);
            self.buffered_bytes += cost;
            // A gap: tell the sender soon, so it can re-send what is missing.
            self.ack_now = true;
            self.mark_dirty(channel, now);
            Offer::Buffered
        }
    }

    /// The application took message `seq` (released earlier) off the queue.
    pub(crate) fn consumed(&mut self, now: Time, channel: ChannelId, seq: u64, len: usize) {
        self.buffered_bytes = self.buffered_bytes.saturating_sub(message_cost(len));
        let ch = self.channel_mut(channel);
        if seq + 1 > ch.consumed {
            ch.consumed = seq + 1;
        }
        self.mark_dirty(channel, now);
    }

    /// Marks every channel with state for acknowledgement, at once: the peer
    /// probed, perhaps because an acknowledgement of ours was lost.
    pub(crate) fn request_full_ack(&mut self, now: Time) {
        for idx in 0..self.channels.len() {
            if self.channels[idx].has_state() {
                let channel = ChannelId(u16::try_from(idx).unwrap_or(u16::MAX));
                self.mark_dirty(channel, now);
            }
        }
        self.ack_now = true;
    }

    /// Picks up to `n` channels with state that are not dirty, round robin,
    /// and marks them dirty: every ACK refreshes a few quiet channels, so a
    /// lost final acknowledgement is repaired while any traffic flows.
    pub(crate) fn refresh(&mut self, n: usize, now: Time) {
        let len = self.channels.len();
        let mut added = 0;
        for _ in 0..len {
            if added == n {
                break;
            }
            self.refresh_cursor = (self.refresh_cursor + 1) % len;
            let idx = self.refresh_cursor;
            let ch = &self.channels[idx];
            if !ch.dirty && ch.has_state() {
                let channel = ChannelId(u16::try_from(idx).unwrap_or(u16::MAX));
                self.mark_dirty(channel, now);
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

    /// Called after acknowledgements for every dirty channel went out.
    pub(crate) fn acked(&mut self) {
        self.unacked_events = 0;
        self.first_unacked = None;
        self.ack_now = false;
    }

    /// Bytes held in reorder buffers (for tests and stats).
    pub(crate) fn reorder_len(&self) -> usize {
        self.channels.iter().map(|c| c.reorder.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_set_merges_neighbours() {
        let mut r = RangeSet::default();
        for s in [5, 7, 6, 10, 9, 1] {
            r.insert(s);
        }
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(1, 2), (5, 8), (9, 11)]);
        r.insert(6);
        assert_eq!(r.iter().count(), 3);
        r.pop_front_if(1);
        r.pop_front_if(9); // not at the front: no effect
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(5, 8), (9, 11)]);
        r.pop_front_if(5);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(6, 8), (9, 11)]);
    }

    #[test]
    fn offer_dedups_reorders_and_bounds() {
        let mut r = RecvSide::default();
        let ch = ChannelId(0);
        let mut got = Vec::new();
        let p = || Some(Bytes::from_static(b"x"));
        let w = 1000;
        assert_eq!(
            r.offer(Time::ZERO, ch, 2, p(), w, |s, _| got.push(s)),
            Offer::Buffered
        );
        assert_eq!(
            r.offer(Time::ZERO, ch, 2, p(), w, |s, _| got.push(s)),
            Offer::Duplicate
        );
        assert_eq!(
            r.offer(Time::ZERO, ch, 1, p(), w, |s, _| got.push(s)),
            Offer::Buffered
        );
        assert!(got.is_empty());
        assert_eq!(
            r.offer(Time::ZERO, ch, 0, p(), w, |s, _| got.push(s)),
            Offer::Released
        );
        assert_eq!(got, vec![0, 1, 2]);
        assert_eq!(
            r.offer(Time::ZERO, ch, 1, p(), w, |s, _| got.push(s)),
            Offer::Duplicate
        );
        assert_eq!(r.reorder_len(), 0);
        // 3 messages of cost 65 buffered; a window of 200 has no room for a 4th.
        assert_eq!(
            r.offer(Time::ZERO, ch, 3, p(), 200, |s, _| got.push(s)),
            Offer::OverWindow
        );
        let mut ranges = Vec::new();
        r.channels[0].ack_ranges(&mut ranges, 8);
        assert_eq!(ranges, vec![(0, 3)]);
        r.consumed(Time::ZERO, ch, 0, 1);
        r.channels[0].ack_ranges(&mut ranges, 8);
        assert_eq!(ranges, vec![(1, 3)]);
    }
}
