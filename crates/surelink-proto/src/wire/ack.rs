//! ACK and RESUME bodies: validated once, iterated in place, written without
//! intermediate allocation.

use std::fmt;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{DecodeError, FrameKind, HEADER_LEN, MAX_ACK_RANGES, PROTOCOL_VERSION};
use crate::ids::StreamId;

const ENTRY_FIXED: usize = 2 + 8 + 2;
const RANGE_LEN: usize = 16;

/// A validated ACK or RESUME body. Cheap to clone (shares the received buffer).
#[derive(Clone, PartialEq, Eq)]
pub struct AckFrame {
    delay_us: u32,
    count: u16,
    /// The entries, already checked to be well-formed.
    entries: Bytes,
}

/// One stream's acknowledgement state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckEntry {
    /// The stream.
    pub stream: StreamId,
    /// Every message with a smaller sequence number has been delivered to the
    /// receiving application.
    pub cumulative: u64,
    /// Half-open ranges `[start, end)` above `cumulative` that arrived and wait
    /// in the receiver's buffers. Ascending, non-overlapping, non-empty.
    pub ranges: AckRanges,
}

/// Iterator over the selective ranges of one entry.
#[derive(Clone, PartialEq, Eq)]
pub struct AckRanges {
    buf: Bytes,
}

impl Iterator for AckRanges {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.buf.remaining() < RANGE_LEN {
            return None;
        }
        let start = self.buf.get_u64();
        let end = self.buf.get_u64();
        Some((start, end))
    }
}

impl fmt::Debug for AckRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

impl AckFrame {
    /// The time the receiver held the acknowledgement back, for RTT estimation.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(u64::from(self.delay_us))
    }

    /// The number of channel entries.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The entries, in the order they were written.
    pub fn entries(&self) -> AckEntries {
        AckEntries {
            buf: self.entries.clone(),
            left: self.count,
        }
    }

    /// Validates an ACK body (after the frame header) without copying it.
    pub(super) fn parse(mut body: Bytes, kind: FrameKind) -> Result<AckFrame, DecodeError> {
        let malformed = |reason| DecodeError::Malformed { kind, reason };
        if body.remaining() < 6 {
            return Err(malformed("body shorter than its fixed part"));
        }
        let delay_us = body.get_u32();
        let count = body.get_u16();
        let entries = body.clone();
        for _ in 0..count {
            if body.remaining() < ENTRY_FIXED {
                return Err(malformed("entry count exceeds the body"));
            }
            let _channel = body.get_u16();
            let cumulative = body.get_u64();
            let nranges = usize::from(body.get_u16());
            if nranges > MAX_ACK_RANGES {
                return Err(malformed("too many selective ranges in one entry"));
            }
            if body.remaining() < nranges * RANGE_LEN {
                return Err(malformed("range count exceeds the body"));
            }
            // The first range may start at the cumulative point (arrived but not
            // yet delivered); later ones ascend and never touch, since touching
            // ranges are written as one.
            let mut floor = cumulative;
            for i in 0..nranges {
                let start = body.get_u64();
                let end = body.get_u64();
                let above_floor = if i == 0 {
                    start >= floor
                } else {
                    start > floor
                };
                if !above_floor || start >= end {
                    return Err(malformed("selective ranges not ascending and disjoint"));
                }
                floor = end;
            }
        }
        if body.has_remaining() {
            return Err(malformed("trailing bytes after the last entry"));
        }
        Ok(AckFrame {
            delay_us,
            count,
            entries,
        })
    }
}

impl fmt::Debug for AckFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckFrame")
            .field("delay_us", &self.delay_us)
            .field("entries", &self.entries().collect::<Vec<_>>())
            .finish()
    }
}

/// Iterator over the entries of a validated ack body.
#[derive(Clone)]
pub struct AckEntries {
    buf: Bytes,
    left: u16,
}

impl Iterator for AckEntries {
    type Item = AckEntry;
    fn next(&mut self) -> Option<AckEntry> {
        // The body was validated by `AckFrame::parse`, so reads cannot run short;
        // the length checks stay anyway so a bug here cannot become a panic.
        if self.left == 0 || self.buf.remaining() < ENTRY_FIXED {
            return None;
        }
        self.left -= 1;
        let stream = StreamId(self.buf.get_u16());
        let cumulative = self.buf.get_u64();
        let n = usize::from(self.buf.get_u16()) * RANGE_LEN;
        let n = n.min(self.buf.remaining());
        let ranges = AckRanges {
            buf: self.buf.split_to(n),
        };
        Some(AckEntry {
            stream,
            cumulative,
            ranges,
        })
    }
}

/// Writes an ACK or RESUME frame straight into an output buffer.
///
/// ```
/// # use surelink_proto::wire::{AckWriter, FrameKind, decode, Frame};
/// # use surelink_proto::StreamId;
/// let mut buf = bytes::BytesMut::new();
/// let mut w = AckWriter::begin(&mut buf, FrameKind::Ack, 25);
/// w.entry(&mut buf, StreamId(3), 10, &[(12, 15)]);
/// w.finish(&mut buf);
/// let frame = decode(&mut buf, 1 << 20).unwrap().unwrap();
/// let Frame::Ack(ack) = frame else { panic!() };
/// let e = ack.entries().next().unwrap();
/// assert_eq!((e.stream, e.cumulative), (StreamId(3), 10));
/// assert_eq!(e.ranges.collect::<Vec<_>>(), vec![(12, 15)]);
/// ```
#[derive(Debug)]
pub struct AckWriter {
    start: usize,
    count: u16,
}

impl AckWriter {
    /// Bytes of one entry with `ranges` selective ranges.
    pub const fn entry_len(ranges: usize) -> usize {
        ENTRY_FIXED + ranges * RANGE_LEN
    }

    /// Bytes of an ack frame with no entries.
    pub const EMPTY_LEN: usize = HEADER_LEN + 6;

    /// Starts a frame of `kind` (ACK or RESUME) at the end of `buf`.
    pub fn begin(buf: &mut BytesMut, kind: FrameKind, delay_us: u32) -> AckWriter {
        debug_assert!(matches!(kind, FrameKind::Ack | FrameKind::Resume));
        let start = buf.len();
        buf.put_u8(PROTOCOL_VERSION);
        buf.put_u8(kind as u8);
        buf.put_u16(0);
        buf.put_u32(0); // patched by finish
        buf.put_u32(delay_us);
        buf.put_u16(0); // patched by finish
        AckWriter { start, count: 0 }
    }

    /// Appends one stream entry. `ranges` must be ascending, disjoint, above
    /// `cumulative`, and at most `MAX_ACK_RANGES` long (extra ranges are dropped,
    /// which only costs the peer an unneeded re-send).
    pub fn entry(
        &mut self,
        buf: &mut BytesMut,
        stream: StreamId,
        cumulative: u64,
        ranges: &[(u64, u64)],
    ) {
        let ranges = &ranges[..ranges.len().min(MAX_ACK_RANGES)];
        buf.put_u16(stream.0);
        buf.put_u64(cumulative);
        buf.put_u16(u16::try_from(ranges.len()).unwrap_or(0));
        for &(s, e) in ranges {
            buf.put_u64(s);
            buf.put_u64(e);
        }
        self.count += 1;
    }

    /// Entries written so far.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Patches the lengths. Returns the frame's total size.
    pub fn finish(self, buf: &mut BytesMut) -> usize {
        let total = buf.len() - self.start;
        let body = u32::try_from(total - HEADER_LEN).unwrap_or(u32::MAX);
        buf[self.start + 4..self.start + 8].copy_from_slice(&body.to_be_bytes());
        buf[self.start + 12..self.start + 14].copy_from_slice(&self.count.to_be_bytes());
        total
    }
}
