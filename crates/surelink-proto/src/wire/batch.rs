//! BATCH frames: consecutive small messages of one stream in one frame.
//!
//! ```text
//! body: stream u16 | first seq u64 | count u16 | count x message
//! message: flags u8 | length (varint) | bytes
//! ```
//!
//! The sequence numbers are implied (`first`, `first + 1`, ...), so a 64 B
//! message costs 2 bytes of framing instead of a DATA frame's 18 (PostMan's
//! compact header is the model: its 7 bytes also name the original sender,
//! which a helper's batches will carry in a flag-selected field). A batch is
//! one entry of the sender's retransmit cache and one range of the
//! receiver's acknowledgements; it is re-sent whole, never re-cut.
//!
//! Per-message flag bits are reserved: sent as zero, and a receiver refuses
//! a batch with any set (a later version that uses them bumps the protocol
//! version), so no message is ever misread.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::varint::{get_varint, varint_len};
use super::{DecodeError, FrameKind, HEADER_LEN, PROTOCOL_VERSION};
use crate::ids::StreamId;

/// Bytes of a BATCH body before its messages.
pub const BATCH_FIXED: usize = 2 + 8 + 2;
/// Bytes a BATCH frame adds before its messages (header included).
pub const BATCH_OVERHEAD: usize = HEADER_LEN + BATCH_FIXED;
/// The most messages one batch may carry.
pub const MAX_BATCH_COUNT: usize = u16::MAX as usize;
/// Least framing one batched message takes (flags and a one-byte length).
pub const MIN_BATCHED_MESSAGE: usize = 2;

/// Framing bytes of one batched message of `len` bytes.
#[inline]
pub fn batched_message_overhead(len: usize) -> usize {
    1 + varint_len(len as u64)
}

/// A validated BATCH frame. Cheap to clone (shares the received buffer).
#[derive(Clone, PartialEq, Eq)]
pub struct BatchFrame {
    /// The stream.
    pub stream: StreamId,
    /// Sequence number of the first message.
    pub first: u64,
    /// Number of messages (at least 1).
    pub count: u16,
    /// Header flags (see `DATA_FLAG_RETRANSMIT`).
    pub flags: u16,
    /// The longest message in it.
    pub max_len: u32,
    /// The messages, validated.
    pub(crate) messages: Bytes,
}

impl BatchFrame {
    /// Sequence number after the last message.
    pub fn end(&self) -> u64 {
        self.first + u64::from(self.count)
    }

    /// The messages' bytes, framing included (what the sender's cache holds).
    pub fn body(&self) -> &Bytes {
        &self.messages
    }

    /// The messages, in order.
    pub fn messages(&self) -> BatchIter {
        BatchIter {
            buf: self.messages.clone(),
        }
    }

    /// The messages as borrowed slices (no reference counting).
    pub fn slices(&self) -> BatchSlices<'_> {
        BatchSlices {
            buf: &self.messages,
        }
    }

    /// Validates a BATCH body (after the frame header) without copying it.
    pub(super) fn parse(mut body: Bytes, flags: u16) -> Result<BatchFrame, DecodeError> {
        let malformed = |reason| DecodeError::Malformed {
            kind: FrameKind::Batch,
            reason,
        };
        if body.len() < BATCH_FIXED {
            return Err(malformed("body shorter than its fixed part"));
        }
        let stream = StreamId(body.get_u16());
        let first = body.get_u64();
        let count = body.get_u16();
        if count == 0 {
            return Err(malformed("a batch without messages"));
        }
        if first.checked_add(u64::from(count)).is_none() {
            return Err(malformed("sequence numbers overflow"));
        }
        let mut at = 0;
        let mut max_len = 0;
        for _ in 0..count {
            let rest = &body[at..];
            let Some((&msg_flags, rest)) = rest.split_first() else {
                return Err(malformed("message count exceeds the body"));
            };
            if msg_flags != 0 {
                return Err(malformed("unknown per-message flags"));
            }
            let (len, n) = get_varint(rest).ok_or_else(|| malformed("bad message length"))?;
            let len = usize::try_from(len).map_err(|_| malformed("bad message length"))?;
            // Checked: a varint length near 2^64 must not wrap around.
            let total = len
                .checked_add(1 + n)
                .ok_or_else(|| malformed("message longer than the body"))?;
            if total > body.len() - at {
                return Err(malformed("message longer than the body"));
            }
            max_len = max_len.max(len);
            at += total;
        }
        if at != body.len() {
            return Err(malformed("trailing bytes after the last message"));
        }
        Ok(BatchFrame {
            stream,
            first,
            count,
            flags,
            max_len: u32::try_from(max_len).unwrap_or(u32::MAX),
            messages: body,
        })
    }

    /// Appends this frame.
    pub fn encode(&self, buf: &mut BytesMut) {
        encode_batch(
            buf,
            self.stream,
            self.first,
            self.count,
            self.flags,
            &self.messages,
        );
    }
}

impl fmt::Debug for BatchFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchFrame")
            .field("stream", &self.stream)
            .field("first", &self.first)
            .field("count", &self.count)
            .field("flags", &self.flags)
            .field("bytes", &self.messages.len())
            .finish()
    }
}

/// The messages of a validated batch.
#[derive(Clone, Debug)]
pub struct BatchIter {
    buf: Bytes,
}

impl BatchIter {
    /// Iterates over a body known to be well-formed (from the cache or a
    /// validated frame).
    pub(crate) fn new(buf: Bytes) -> BatchIter {
        BatchIter { buf }
    }

    /// Bytes left, framing included.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// What is left, framing included.
    pub(crate) fn into_inner(self) -> Bytes {
        self.buf
    }
}

impl<'a> BatchSlices<'a> {
    /// Iterates over a body known to be well-formed.
    pub(crate) fn new(buf: &'a [u8]) -> BatchSlices<'a> {
        BatchSlices { buf }
    }
}

impl Iterator for BatchIter {
    type Item = Bytes;
    #[inline]
    fn next(&mut self) -> Option<Bytes> {
        // Validated at parse time; the checks stay so a bug here cannot
        // become a panic.
        let (len, n) = get_varint(self.buf.get(1..)?)?;
        let len = usize::try_from(len).ok()?;
        let start = 1 + n;
        let end = start.checked_add(len)?;
        if end > self.buf.len() {
            self.buf = Bytes::new();
            return None;
        }
        if end == self.buf.len() {
            // The last message takes the buffer itself: one reference
            // count fewer per batch.
            let mut msg = std::mem::take(&mut self.buf);
            msg.advance(start);
            return Some(msg);
        }
        let msg = self.buf.slice(start..end);
        self.buf.advance(end);
        Some(msg)
    }
}

/// The messages of a validated batch, borrowed.
#[derive(Clone, Debug)]
pub struct BatchSlices<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for BatchSlices<'a> {
    type Item = &'a [u8];
    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let (len, n) = get_varint(self.buf.get(1..)?)?;
        let start = 1 + n;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        let msg = self.buf.get(start..end)?;
        self.buf = &self.buf[end..];
        Some(msg)
    }
}

/// Appends one message (a short header and a payload, stored as one
/// message) to a batch body being built.
#[inline]
pub fn put_batched_message(body: &mut BytesMut, head: &[u8], payload: &[u8]) {
    let len = head.len() + payload.len();
    body.reserve(1 + super::MAX_VARINT + len);
    // Byte by byte: each is one store once inlined (a copy of a short
    // variable-length slice would be a call to memcpy).
    body.put_u8(0);
    let mut v = len as u64;
    while v >= 0x80 {
        body.put_u8((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    body.put_u8((v & 0x7f) as u8);
    if !head.is_empty() {
        body.extend_from_slice(head);
    }
    body.extend_from_slice(payload);
}

/// The 20 bytes in front of a BATCH frame's messages.
pub fn batch_header(
    stream: StreamId,
    first: u64,
    count: u16,
    flags: u16,
    messages_len: usize,
) -> [u8; BATCH_OVERHEAD] {
    let body = u32::try_from(BATCH_FIXED + messages_len).unwrap_or(u32::MAX);
    let mut h = [0u8; BATCH_OVERHEAD];
    h[0] = PROTOCOL_VERSION;
    h[1] = FrameKind::Batch as u8;
    h[2..4].copy_from_slice(&flags.to_be_bytes());
    h[4..8].copy_from_slice(&body.to_be_bytes());
    h[8..10].copy_from_slice(&stream.0.to_be_bytes());
    h[10..18].copy_from_slice(&first.to_be_bytes());
    h[18..20].copy_from_slice(&count.to_be_bytes());
    h
}

/// Appends a BATCH frame whose messages (framing included) are `messages`.
pub fn encode_batch(
    buf: &mut BytesMut,
    stream: StreamId,
    first: u64,
    count: u16,
    flags: u16,
    messages: &[u8],
) {
    let h = batch_header(stream, first, count, flags, messages.len());
    buf.reserve(h.len() + messages.len());
    buf.extend_from_slice(&h);
    buf.extend_from_slice(messages);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    /// Found by `cargo fuzz run frame_decoder` (issue 12): a message
    /// length near 2^64 wrapped `1 + n + len` around and panicked in a
    /// debug build (a wrong length in release).
    #[test]
    fn a_message_length_near_u64_max_is_malformed_not_a_panic() {
        for len in [u64::MAX, u64::MAX - 1, u64::MAX - 10, 1 << 63] {
            let mut body = BytesMut::new();
            body.put_u16(3);
            body.put_u64(0);
            body.put_u16(1);
            body.put_u8(0);
            crate::wire::put_varint(&mut body, len);
            body.put_slice(b"tail");
            assert!(matches!(
                BatchFrame::parse(body.freeze(), 0),
                Err(DecodeError::Malformed { .. })
            ));
        }
    }
}
