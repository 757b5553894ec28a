//! The shell's message header inside a session message: one byte of kind,
//! then for requests and replies the call id. Calls and replies travel on the
//! channel the caller chose, each direction numbered on its own.

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

/// Bytes the header adds to a request or reply.
pub(crate) const CALL_HEADER: usize = 9;

/// What a session message carries, as the shell sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// One-way message.
    Oneway(Bytes),
    /// Request `id`.
    Request(u64, Bytes),
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

/// The header of a request or reply.
pub(crate) fn call_prefix(kind: u8, id: u64) -> Prefix {
    let mut h = [0u8; CALL_HEADER];
    h[0] = kind;
    h[1..].copy_from_slice(&id.to_be_bytes());
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
fn encode_call(kind: u8, id: u64, body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(CALL_HEADER + body.len());
    b.put_u8(kind);
    b.put_u64(id);
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
        k @ (REQUEST | REPLY) if msg.len() >= CALL_HEADER => {
            msg.advance(1);
            let id = msg.get_u64();
            Some(if k == REQUEST {
                Body::Request(id, msg)
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
        assert_eq!(
            call_prefix(REPLY, 7).as_slice(),
            &encode_call(REPLY, 7, b"")[..]
        );
        assert_eq!(oneway_prefix().as_slice(), &[ONEWAY]);
        assert_eq!(
            decode(encode_oneway(b"hi")),
            Some(Body::Oneway(Bytes::from_static(b"hi")))
        );
        assert_eq!(
            decode(encode_call(REQUEST, 7, b"q")),
            Some(Body::Request(7, Bytes::from_static(b"q")))
        );
        assert_eq!(
            decode(encode_call(REPLY, 7, b"")),
            Some(Body::Reply(7, Bytes::new()))
        );
        assert_eq!(decode(Bytes::from_static(&[REQUEST, 1, 2])), None);
        assert_eq!(decode(Bytes::from_static(&[9])), None);
        assert_eq!(decode(Bytes::new()), None);
    }
}
