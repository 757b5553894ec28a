//! The shell's message header inside a session message.
//!
//! ```text
//! one-way:  kind=0
//! request:  kind=1, flags u8, channel u16, id u64
//! reply:    kind=2, flags u8, channel u16, id u64
//! ```
//!
//! `channel` is the caller's channel: a high-priority or re-sent request
//! travels on the session's priority lane (its own channel, so it does not
//! wait behind the caller's normal traffic in the session's per-channel
//! order) and carries the channel it belongs to here. Replies go back on
//! the transport channel their request came on. Flags: [`FLAG_RESEND`],
//! [`FLAG_HIGH`].

use bytes::{Buf, Bytes};
#[cfg(test)]
use bytes::{BufMut, BytesMut};
use surelink_proto::Prefix;

/// A one-way message.
pub(crate) const ONEWAY: u8 = 0;
/// A request expecting a reply with the same id.
pub(crate) const REQUEST: u8 = 1;
/// A reply to the request with the same id.
pub(crate) const REPLY: u8 = 2;
/// A high-priority one-way message (on the priority lane): channel u16.
pub(crate) const ONEWAY_HIGH: u8 = 3;

/// The request is a re-send (same id as before).
pub(crate) const FLAG_RESEND: u8 = 1;
/// The request is high priority.
pub(crate) const FLAG_HIGH: u8 = 2;

/// Bytes the header adds to a request or reply.
pub(crate) const CALL_HEADER: usize = 12;

/// A request as the server sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub(crate) id: u64,
    pub(crate) flags: u8,
    /// The caller's channel.
    pub(crate) channel: u16,
}

/// What a session message carries, as the shell sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// One-way message.
    Oneway(Bytes),
    /// High-priority one-way message for the caller's channel.
    OnewayHigh(u16, Bytes),
    /// A request.
    Request(RequestHeader, Bytes),
    /// Reply to request `id`.
    Reply(u64, Bytes),
}

/// The kind byte of an encoded message, if it has one.
pub(crate) fn kind(msg: &[u8]) -> Option<u8> {
    msg.first().copied()
}

/// The header of a one-way message.
pub(crate) fn oneway_prefix() -> Prefix {
    Prefix::new(&[ONEWAY]).unwrap_or_default()
}

/// The header of a high-priority one-way message for `channel`.
pub(crate) fn oneway_high_prefix(channel: u16) -> Prefix {
    let c = channel.to_be_bytes();
    Prefix::new(&[ONEWAY_HIGH, c[0], c[1]]).unwrap_or_default()
}

/// The header of a request or reply.
pub(crate) fn call_prefix(kind: u8, flags: u8, channel: u16, id: u64) -> Prefix {
    let mut h = [0u8; CALL_HEADER];
    h[0] = kind;
    h[1] = flags;
    h[2..4].copy_from_slice(&channel.to_be_bytes());
    h[4..].copy_from_slice(&id.to_be_bytes());
    Prefix::new(&h).unwrap_or_default()
}

#[cfg(test)]
fn encode_oneway(body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(1 + body.len());
    b.put_u8(ONEWAY);
    b.put_slice(body);
    b.freeze()
}

#[cfg(test)]
fn encode_call(kind: u8, flags: u8, channel: u16, id: u64, body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(CALL_HEADER + body.len());
    b.put_slice(call_prefix(kind, flags, channel, id).as_slice());
    b.put_slice(body);
    b.freeze()
}

/// Splits a session message; `None` if it is not one of ours.
pub(crate) fn decode(mut msg: Bytes) -> Option<Body> {
    match kind(&msg)? {
        ONEWAY => {
            msg.advance(1);
            Some(Body::Oneway(msg))
        }
        ONEWAY_HIGH if msg.len() >= 3 => {
            msg.advance(1);
            let channel = msg.get_u16();
            Some(Body::OnewayHigh(channel, msg))
        }
        k @ (REQUEST | REPLY) if msg.len() >= CALL_HEADER => {
            msg.advance(1);
            let flags = msg.get_u8();
            let channel = msg.get_u16();
            let id = msg.get_u64();
            Some(if k == REQUEST {
                Body::Request(RequestHeader { id, flags, channel }, msg)
            } else {
                Body::Reply(id, msg)
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        assert_eq!(oneway_prefix().as_slice(), &[ONEWAY]);
        assert_eq!(
            decode(encode_oneway(b"hi")),
            Some(Body::Oneway(Bytes::from_static(b"hi")))
        );
        assert_eq!(
            decode(encode_call(REQUEST, FLAG_HIGH | FLAG_RESEND, 5, 7, b"q")),
            Some(Body::Request(
                RequestHeader {
                    id: 7,
                    flags: 3,
                    channel: 5
                },
                Bytes::from_static(b"q")
            ))
        );
        assert_eq!(
            decode(encode_call(REPLY, 0, 5, 7, b"")),
            Some(Body::Reply(7, Bytes::new()))
        );
        assert_eq!(decode(Bytes::from_static(&[REQUEST, 1, 2])), None);
        assert_eq!(decode(Bytes::from_static(&[9])), None);
        assert_eq!(
            decode(Bytes::from_static(&[ONEWAY_HIGH, 0, 4, b'x'])),
            Some(Body::OnewayHigh(4, Bytes::from_static(b"x")))
        );
        assert_eq!(decode(Bytes::from_static(&[ONEWAY_HIGH, 0])), None);
        assert_eq!(decode(Bytes::new()), None);
    }
}
