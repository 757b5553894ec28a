//! The sending half of a session: per-channel numbering and the retransmit
//! cache (SQR's cache, kept until the peer's application has the message).
//!
//! Every message stays here from `send` until the peer acknowledges it
//! cumulatively (i.e. its application received it). Each entry knows which
//! path it was last written to, so a failing path's in-flight messages can be
//! found and re-sent elsewhere at once.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::config::message_cost;
use crate::event::Abandoned;
use crate::ids::{ChannelId, PathId};
use crate::time::Time;

/// Where a cached message stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    /// Accepted by `send`, never written to a path.
    Queued,
    /// Written to `path` at `sent_at`, not yet acknowledged.
    InFlight,
    /// The peer reported it received (selective ack) but not yet delivered.
    Sacked,
    /// Needs re-sending (its path failed or timed out); in the retransmit queue.
    Pending,
}

/// Up to [`Prefix::MAX`] bytes written in front of a message's payload: a
/// shell's own header, so it need not copy the payload to prepend it.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Prefix {
    len: u8,
    bytes: [u8; Prefix::MAX],
}

impl Prefix {
    /// Longest prefix.
    pub const MAX: usize = 15;

    /// A prefix of `b`, if it is at most [`Prefix::MAX`] bytes.
    pub fn new(b: &[u8]) -> Option<Prefix> {
        let mut p = Prefix {
            len: u8::try_from(b.len()).ok()?,
            bytes: [0; Prefix::MAX],
        };
        p.bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(p)
    }

    /// The prefix bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) prefix: Prefix,
    pub(crate) payload: Bytes,
    pub(crate) sent_at: Time,
    pub(crate) path: PathId,
    pub(crate) state: EntryState,
    /// Times written to a path (saturating).
    pub(crate) transmissions: u8,
    /// Replaced by an empty "withdrawn" marker (too large for the peer).
    pub(crate) withdrawn: bool,
}

impl Entry {
    /// The message's length on the wire: prefix and payload.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.prefix.len) + self.payload.len()
    }
}

/// One channel's outgoing stream.
#[derive(Debug, Default)]
pub(crate) struct SendChannel {
    /// Sequence number of `entries[0]`; everything below was acknowledged.
    pub(crate) base: u64,
    pub(crate) entries: VecDeque<Entry>,
    /// First sequence number never written to a path. Sends happen in
    /// sequence order per channel, so everything below was sent at least once
    /// and the peer may acknowledge nothing at or above it.
    pub(crate) sent_end: u64,
    /// Every entry below this (and at or above `base`) is `Sacked`: the
    /// peer holds it. (Sacked is final until the cumulative ack passes.)
    pub(crate) sacked_to: u64,
    /// The last ACK frame that named this channel (see `apply_ack`).
    pub(crate) ack_stamp: u64,
}

/// Why an ACK entry was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckError {
    /// It acknowledged a message never sent (the first unsent number).
    Unsent(u64),
    /// The frame named the channel twice.
    RepeatedChannel,
}

impl SendChannel {
    pub(crate) fn next_seq(&self) -> u64 {
        self.base + self.entries.len() as u64
    }

    pub(crate) fn get_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let idx = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.entries.get_mut(idx)
    }

    pub(crate) fn get(&self, seq: u64) -> Option<&Entry> {
        let idx = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.entries.get(idx)
    }
}

/// What an acknowledgement freed, for the caller's path accounting.
#[derive(Debug, Default)]
pub(crate) struct AckOutcome {
    /// Newest message first-transmitted exactly once that this ack newly
    /// covered: `(path, sent_at)`, for an RTT sample (Karn's rule).
    pub(crate) rtt_sample: Option<(PathId, Time, u64)>,
    /// Some channel's cumulative point moved.
    pub(crate) progress: bool,
}

/// All channels' outgoing state plus the scheduling queues.
#[derive(Debug, Default)]
pub(crate) struct SendSide {
    pub(crate) channels: Vec<SendChannel>,
    /// Messages never sent, in `send` order across channels.
    pub(crate) new_queue: VecDeque<(ChannelId, u64)>,
    /// Messages to re-send before any new one (SQR). May hold stale
    /// references (acked meanwhile); they are skipped when popped.
    pub(crate) retx_queue: VecDeque<(ChannelId, u64)>,
    /// Cost of every cached message.
    pub(crate) cache_bytes: u64,
    /// Cost of messages sent at least once and not cumulatively acknowledged:
    /// an upper bound on what the peer buffers for us.
    pub(crate) outstanding_bytes: u64,
    /// Count of messages in the cache.
    pub(crate) cache_len: u64,
}

impl SendSide {
    pub(crate) fn channel_mut(&mut self, channel: ChannelId) -> &mut SendChannel {
        let idx = usize::from(channel.0);
        if idx >= self.channels.len() {
            self.channels.resize_with(idx + 1, SendChannel::default);
        }
        &mut self.channels[idx]
    }

    pub(crate) fn push(&mut self, channel: ChannelId, prefix: Prefix, payload: Bytes) -> u64 {
        let cost = message_cost(usize::from(prefix.len) + payload.len());
        let ch = self.channel_mut(channel);
        let seq = ch.next_seq();
        ch.entries.push_back(Entry {
            prefix,
            payload,
            sent_at: Time::ZERO,
            path: PathId(0),
            state: EntryState::Queued,
            transmissions: 0,
            withdrawn: false,
        });
        self.new_queue.push_back((channel, seq));
        self.cache_bytes += cost;
        self.cache_len += 1;
        seq
    }

    pub(crate) fn entry(&self, channel: ChannelId, seq: u64) -> Option<&Entry> {
        self.channels.get(usize::from(channel.0))?.get(seq)
    }

    pub(crate) fn entry_mut(&mut self, channel: ChannelId, seq: u64) -> Option<&mut Entry> {
        self.channels.get_mut(usize::from(channel.0))?.get_mut(seq)
    }

    /// Applies one channel's acknowledgement. `on_inflight_freed(path, cost)`
    /// is told of every in-flight message that stops counting against its path.
    ///
    /// `stamp` identifies the ACK frame: a channel may appear once per frame,
    /// which (with ranges being disjoint) bounds the work of one frame by the
    /// size of the cache.
    pub(crate) fn apply_ack(
        &mut self,
        channel: ChannelId,
        cumulative: u64,
        ranges: impl Iterator<Item = (u64, u64)>,
        stamp: u64,
        out: &mut AckOutcome,
        mut on_inflight_freed: impl FnMut(PathId, u64),
    ) -> Result<(), AckError> {
        let Some(ch) = self.channels.get_mut(usize::from(channel.0)) else {
            return if cumulative == 0 {
                Ok(())
            } else {
                Err(AckError::Unsent(0))
            };
        };
        if ch.ack_stamp == stamp {
            return Err(AckError::RepeatedChannel);
        }
        ch.ack_stamp = stamp;
        if cumulative > ch.sent_end {
            return Err(AckError::Unsent(ch.sent_end));
        }
        let note_sample = |e: &Entry, seq: u64, out: &mut AckOutcome| {
            if e.transmissions == 1 && e.state == EntryState::InFlight {
                let newer = out.rtt_sample.is_none_or(|(_, t, _)| e.sent_at >= t);
                if newer {
                    out.rtt_sample = Some((e.path, e.sent_at, seq));
                }
            }
        };
        while ch.base < cumulative {
            let Some(e) = ch.entries.pop_front() else {
                break;
            };
            out.progress = true;
            let seq = ch.base;
            ch.base += 1;
            let cost = message_cost(e.len());
            note_sample(&e, seq, out);
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
            self.cache_len -= 1;
        }
        for (start, end) in ranges {
            if end > ch.sent_end {
                return Err(AckError::Unsent(ch.sent_end));
            }
            // Entries in [base, sacked_to) are already marked; a receiver
            // whose application is slow repeats that prefix in every ACK, so
            // skip it rather than walk it again.
            let mut from = start.max(ch.base);
            let contiguous = from <= ch.sacked_to.max(ch.base);
            if contiguous {
                from = from.max(ch.sacked_to);
            }
            for seq in from..end {
                let Some(e) = ch.get_mut(seq) else { break };
                if matches!(e.state, EntryState::InFlight | EntryState::Pending) {
                    note_sample(e, seq, out);
                    if e.state == EntryState::InFlight {
                        on_inflight_freed(e.path, message_cost(e.len()));
                    }
                    e.state = EntryState::Sacked;
                }
            }
            if contiguous {
                ch.sacked_to = ch.sacked_to.max(end);
            }
        }
        Ok(())
    }

    /// Removes everything; returns the unacknowledged runs per channel.
    pub(crate) fn abandon_all(&mut self) -> Vec<Abandoned> {
        let mut out = Vec::new();
        for (idx, ch) in self.channels.iter_mut().enumerate() {
            if !ch.entries.is_empty() {
                let channel = ChannelId(u16::try_from(idx).unwrap_or(u16::MAX));
                out.push(Abandoned {
                    channel,
                    start: ch.base,
                    end: ch.next_seq(),
                });
                ch.base = ch.next_seq();
                ch.sent_end = ch.base;
                ch.entries.clear();
            }
        }
        self.new_queue.clear();
        self.retx_queue.clear();
        self.cache_bytes = 0;
        self.outstanding_bytes = 0;
        self.cache_len = 0;
        out
    }
}
