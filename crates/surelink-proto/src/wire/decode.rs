//! Decoding frames from a byte stream.

use bytes::{Buf, Bytes, BytesMut};

use super::{
    AckFrame, BatchFrame, Close, CloseCode, CloseScope, DataFrame, Frame, FrameKind, Hello,
    HEADER_LEN, HELLO_BODY_LEN, MAX_CLOSE_REASON, PROTOCOL_VERSION,
};
use crate::ids::{ClusterId, Epoch, NodeId, SessionId, StreamId};

/// Why bytes did not decode into a frame. Any of these closes the path it
/// came from; none is a reason to panic or to buffer without bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The header names a protocol version this build does not speak.
    #[error("unsupported protocol version {0} (this build speaks version {PROTOCOL_VERSION})")]
    Version(u8),
    /// The header's kind byte names no frame kind.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The kind is reserved for a later protocol version.
    #[error("frame kind {0:?} is reserved and not implemented by this version")]
    Reserved(FrameKind),
    /// The header announces a body larger than the configured maximum.
    #[error("frame body of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// The announced body length.
        len: u32,
        /// The configured maximum.
        max: u32,
    },
    /// The body does not match the layout of its kind.
    #[error("malformed {kind:?} frame: {reason}")]
    Malformed {
        /// The frame's kind.
        kind: FrameKind,
        /// What was wrong.
        reason: &'static str,
    },
}

/// Most a partial frame makes `decode` reserve at once.
const RESERVE_STEP: usize = 64 * 1024;

/// Checks a header and returns `(kind, flags, body length)`.
fn parse_header(h: &[u8], max_body: u32) -> Result<(FrameKind, u16, u32), DecodeError> {
    let version = h[0];
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = FrameKind::from_u8(h[1]).ok_or(DecodeError::UnknownKind(h[1]))?;
    if !kind.is_implemented() {
        return Err(DecodeError::Reserved(kind));
    }
    let flags = u16::from_be_bytes([h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    if len > max_body {
        return Err(DecodeError::TooLarge { len, max: max_body });
    }
    Ok((kind, flags, len))
}

/// Takes one frame off the front of a stream buffer.
///
/// Returns `Ok(None)` when the buffer does not yet hold a whole frame (and
/// leaves it untouched). Errors are final for the stream: the caller closes
/// the path. The header is checked as soon as its 8 bytes are present, so an
/// oversized or foreign frame is refused before its body is buffered.
pub fn decode(buf: &mut BytesMut, max_body: u32) -> Result<Option<Frame>, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let (kind, flags, len) = parse_header(&buf[..HEADER_LEN], max_body)?;
    let total = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(HEADER_LEN))
        .ok_or(DecodeError::TooLarge { len, max: max_body })?;
    if buf.len() < total {
        // Grow towards the announced size in steps, so 8 header bytes alone
        // cannot make us allocate a whole maximal frame up front.
        buf.reserve((total - buf.len()).min(RESERVE_STEP));
        return Ok(None);
    }
    let mut frame = buf.split_to(total).freeze();
    frame.advance(HEADER_LEN);
    parse_body(kind, flags, frame).map(Some)
}

/// Decodes exactly one frame from `bytes` (header included); trailing bytes
/// or a short buffer are errors.
pub fn decode_frame(bytes: Bytes, max_body: u32) -> Result<Frame, DecodeError> {
    let mut buf = BytesMut::from(bytes.as_ref());
    match decode(&mut buf, max_body)? {
        Some(frame) if buf.is_empty() => Ok(frame),
        Some(frame) => Err(DecodeError::Malformed {
            kind: frame_kind(&frame),
            reason: "trailing bytes after the frame",
        }),
        None => Err(DecodeError::Malformed {
            kind: bytes
                .get(1)
                .and_then(|b| FrameKind::from_u8(*b))
                .unwrap_or(FrameKind::Data),
            reason: "frame shorter than its header announces",
        }),
    }
}

fn frame_kind(f: &Frame) -> FrameKind {
    match f {
        Frame::Hello(_) => FrameKind::Hello,
        Frame::Resume(_) => FrameKind::Resume,
        Frame::Data(_) => FrameKind::Data,
        Frame::Batch(_) => FrameKind::Batch,
        Frame::Ack(_) => FrameKind::Ack,
        Frame::Close(_) => FrameKind::Close,
        Frame::Ping(_) => FrameKind::Ping,
        Frame::Pong(_) => FrameKind::Pong,
        Frame::RouteUpdate(_) => FrameKind::RouteUpdate,
    }
}

fn parse_body(kind: FrameKind, flags: u16, mut body: Bytes) -> Result<Frame, DecodeError> {
    let malformed = |reason| DecodeError::Malformed { kind, reason };
    match kind {
        FrameKind::Data => {
            if body.len() < 10 {
                return Err(malformed("body shorter than stream and sequence number"));
            }
            let stream = StreamId(body.get_u16());
            let seq = body.get_u64();
            Ok(Frame::Data(DataFrame {
                stream,
                seq,
                flags,
                payload: body,
            }))
        }
        FrameKind::Batch => BatchFrame::parse(body, flags).map(Frame::Batch),
        FrameKind::Ack => AckFrame::parse(body, kind).map(Frame::Ack),
        FrameKind::Resume => AckFrame::parse(body, kind).map(Frame::Resume),
        FrameKind::Hello => {
            if body.len() != HELLO_BODY_LEN {
                return Err(malformed("body length differs from the HELLO layout"));
            }
            let hello = Hello {
                cluster: ClusterId(body.get_u64()),
                node: NodeId(body.get_u64()),
                epoch: Epoch(body.get_u64()),
                session: SessionId(body.get_u64()),
                your_node: NodeId(body.get_u64()),
                your_epoch: Epoch(body.get_u64()),
                your_session: SessionId(body.get_u64()),
                recv_window: body.get_u32(),
                max_message: body.get_u32(),
                max_channels: body.get_u32(),
            };
            if hello.epoch.0 == 0 {
                return Err(malformed("epoch 0 is not a valid incarnation"));
            }
            if hello.session.0 == 0 {
                return Err(malformed("session id 0 is not valid"));
            }
            Ok(Frame::Hello(hello))
        }
        FrameKind::Close => {
            if body.len() < 5 {
                return Err(malformed("body shorter than its fixed part"));
            }
            let scope = match body.get_u8() {
                0 => CloseScope::Path,
                1 => CloseScope::Session,
                _ => return Err(malformed("unknown close scope")),
            };
            let code = CloseCode(body.get_u16());
            let n = usize::from(body.get_u16());
            if n > MAX_CLOSE_REASON || n != body.len() {
                return Err(malformed("reason length does not match the body"));
            }
            let reason = std::str::from_utf8(&body)
                .map_err(|_| malformed("reason is not UTF-8"))?
                .to_owned();
            Ok(Frame::Close(Close {
                scope,
                code,
                reason,
            }))
        }
        FrameKind::Ping | FrameKind::Pong => {
            if body.len() != 8 {
                return Err(malformed("body is not one 8-byte token"));
            }
            let token = body.get_u64();
            Ok(if kind == FrameKind::Ping {
                Frame::Ping(token)
            } else {
                Frame::Pong(token)
            })
        }
        FrameKind::RouteUpdate => {
            if body.len() > crate::role::MAX_ROLE_MESSAGE {
                return Err(malformed("role message longer than MAX_ROLE_MESSAGE"));
            }
            Ok(Frame::RouteUpdate(body))
        }
        FrameKind::Heartbeat | FrameKind::Barrier => Err(DecodeError::Reserved(kind)),
    }
}
