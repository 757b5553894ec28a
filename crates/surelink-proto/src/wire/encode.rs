//! Encoding frames into an output buffer.

use bytes::{BufMut, BytesMut};

use super::{
    AckWriter, Close, CloseScope, DataFrame, Frame, FrameKind, Hello, HEADER_LEN, HELLO_BODY_LEN,
    MAX_CLOSE_REASON, PROTOCOL_VERSION,
};
use crate::ids::StreamId;

fn put_header(buf: &mut BytesMut, kind: FrameKind, flags: u16, body_len: usize) {
    buf.put_u8(PROTOCOL_VERSION);
    buf.put_u8(kind as u8);
    buf.put_u16(flags);
    buf.put_u32(u32::try_from(body_len).unwrap_or(u32::MAX));
}

/// Appends a DATA frame. The hot path: one header write and one copy.
#[inline]
pub fn encode_data(buf: &mut BytesMut, stream: StreamId, seq: u64, flags: u16, payload: &[u8]) {
    encode_data_parts(buf, stream, seq, flags, &[], payload)
}

/// Appends a DATA frame whose message is `prefix` followed by `payload`.
#[inline]
pub fn encode_data_parts(
    buf: &mut BytesMut,
    stream: StreamId,
    seq: u64,
    flags: u16,
    prefix: &[u8],
    payload: &[u8],
) {
    // One 18-byte write for header, stream and sequence number: this is the
    // per-message cost of the whole protocol, so it avoids per-field checks.
    let h = data_header(stream, seq, flags, prefix.len() + payload.len());
    buf.reserve(h.len() + prefix.len() + payload.len());
    buf.extend_from_slice(&h);
    buf.extend_from_slice(prefix);
    buf.extend_from_slice(payload);
}

/// The 18 bytes in front of a DATA frame's message.
#[inline]
pub fn data_header(stream: StreamId, seq: u64, flags: u16, len: usize) -> [u8; HEADER_LEN + 10] {
    let body = u32::try_from(10 + len).unwrap_or(u32::MAX);
    let mut h = [0u8; HEADER_LEN + 10];
    h[0] = PROTOCOL_VERSION;
    h[1] = FrameKind::Data as u8;
    h[2..4].copy_from_slice(&flags.to_be_bytes());
    h[4..8].copy_from_slice(&body.to_be_bytes());
    h[8..10].copy_from_slice(&stream.0.to_be_bytes());
    h[10..18].copy_from_slice(&seq.to_be_bytes());
    h
}

/// Appends a HELLO frame.
pub fn encode_hello(buf: &mut BytesMut, h: &Hello) {
    put_header(buf, FrameKind::Hello, 0, HELLO_BODY_LEN);
    buf.put_u64(h.cluster.0);
    buf.put_u64(h.node.0);
    buf.put_u64(h.epoch.0);
    buf.put_u64(h.session.0);
    buf.put_u64(h.your_node.0);
    buf.put_u64(h.your_epoch.0);
    buf.put_u64(h.your_session.0);
    buf.put_u32(h.recv_window);
    buf.put_u32(h.max_message);
    buf.put_u32(h.max_channels);
}

/// Appends a PING frame.
pub fn encode_ping(buf: &mut BytesMut, token: u64) {
    put_header(buf, FrameKind::Ping, 0, 8);
    buf.put_u64(token);
}

/// Appends a PONG frame.
pub fn encode_pong(buf: &mut BytesMut, token: u64) {
    put_header(buf, FrameKind::Pong, 0, 8);
    buf.put_u64(token);
}

/// Appends a ROUTE_UPDATE frame carrying one encoded role message.
pub fn encode_route_update(buf: &mut BytesMut, message: &[u8]) {
    put_header(buf, FrameKind::RouteUpdate, 0, message.len());
    buf.extend_from_slice(message);
}

impl Close {
    /// Appends this CLOSE frame; a reason longer than the limit is cut at a
    /// character boundary.
    pub fn encode(&self, buf: &mut BytesMut) {
        let mut end = self.reason.len().min(MAX_CLOSE_REASON);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        let reason = &self.reason.as_bytes()[..end];
        put_header(buf, FrameKind::Close, 0, 5 + reason.len());
        buf.put_u8(match self.scope {
            CloseScope::Path => 0,
            CloseScope::Session => 1,
        });
        buf.put_u16(self.code.0);
        buf.put_u16(u16::try_from(reason.len()).unwrap_or(0));
        buf.put_slice(reason);
    }
}

impl Frame {
    /// Appends this frame to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            Frame::Hello(h) => encode_hello(buf, h),
            Frame::Data(DataFrame {
                stream,
                seq,
                flags,
                payload,
            }) => encode_data(buf, *stream, *seq, *flags, payload),
            Frame::Batch(b) => b.encode(buf),
            Frame::Ack(a) | Frame::Resume(a) => {
                let kind = if matches!(self, Frame::Ack(_)) {
                    FrameKind::Ack
                } else {
                    FrameKind::Resume
                };
                let delay = u32::try_from(a.delay().as_micros()).unwrap_or(u32::MAX);
                let mut w = AckWriter::begin(buf, kind, delay);
                let mut ranges = Vec::new();
                for e in a.entries() {
                    ranges.clear();
                    ranges.extend(e.ranges);
                    w.entry(buf, e.stream, e.cumulative, &ranges);
                }
                w.finish(buf);
            }
            Frame::Close(c) => c.encode(buf),
            Frame::Ping(t) => encode_ping(buf, *t),
            Frame::Pong(t) => encode_pong(buf, *t),
            Frame::RouteUpdate(m) => encode_route_update(buf, m),
        }
    }
}
