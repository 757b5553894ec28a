//! The message layer's header, at the front of a message on the streams that
//! need one. Integers are LEB128 varints (shortest form only).
//!
//! | stream | header |
//! |---|---|
//! | one-way (per channel) | none |
//! | high-priority one-way | channel |
//! | request (per channel) | flags u8, call id, [timeout µs if `DEADLINE`] |
//! | request lane | flags u8, channel, call id, [timeout µs if `DEADLINE`] |
//! | reply, reply lane | status u8, call id, then by status: |
//!
//! Reply status: `OK` (body: the reply), `STILL_RUNNING` (no body: the
//! server has the request; wait a full re-send period more), `ERROR` (kind
//! u8: `APP` with code varint and a UTF-8 message, or `PANICKED`,
//! `NO_HANDLER`, `EXPIRED`, `SHUTTING_DOWN`, `OVERLOADED` with an optional
//! UTF-8 message).
//!
//! Request flags: `RESEND` (a re-send of a call already sent once),
//! `HIGH` (high priority), `DEADLINE` (the caller's remaining timeout
//! follows, so the server can skip a request whose caller has given up).
//! Unknown flag bits are refused, as is anything malformed: the message
//! layer checks every header before it acts on the message.

use bytes::{Bytes, BytesMut};

use crate::ids::{CallId, ChannelId};
use crate::session::Prefix;
use crate::wire::{get_varint, put_varint};

/// Request flag: a re-send of a call sent before (same id).
pub(crate) const FLAG_RESEND: u8 = 0x01;
/// Request flag: high priority.
pub(crate) const FLAG_HIGH: u8 = 0x02;
/// Request flag: the caller's remaining timeout (µs) follows the id.
pub(crate) const FLAG_DEADLINE: u8 = 0x04;
const KNOWN_FLAGS: u8 = FLAG_RESEND | FLAG_HIGH | FLAG_DEADLINE;

const STATUS_OK: u8 = 0;
const STATUS_STILL_RUNNING: u8 = 1;
const STATUS_ERROR: u8 = 2;

const ERR_APP: u8 = 1;
const ERR_PANICKED: u8 = 2;
const ERR_NO_HANDLER: u8 = 3;
const ERR_EXPIRED: u8 = 4;
const ERR_SHUTTING_DOWN: u8 = 5;
const ERR_OVERLOADED: u8 = 6;
const ERR_RECOVERING: u8 = 7;
const ERR_RECOVERING_STARTED: u8 = 8;

/// Longest message text an error reply carries (longer ones are cut at a
/// character boundary).
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// Why a server answered a request with an error instead of a reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The handler returned an application error.
    #[error("the handler failed with code {code}: {message}")]
    App {
        /// The application's error code.
        code: u32,
        /// The application's words.
        message: String,
    },
    /// The handler panicked; the server carried on.
    #[error("the handler panicked")]
    Panicked,
    /// The server has no handler registered.
    #[error("the server has no request handler")]
    NoHandler,
    /// The request's deadline passed before a worker was free to run it.
    #[error("the request expired in the server's queue")]
    Expired,
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The server refused the request for lack of capacity.
    #[error("the server is overloaded")]
    Overloaded,
    /// The request's recovery group was recovering: the request was
    /// cancelled while it ran (`started`: it may have done part of its
    /// work; the clean-up blocks it registered ran), or it waited in the
    /// group's queue and the group's policy is to fail what waited (not
    /// `started`: it never ran, and sending it again is safe).
    #[error("the server's recovery group {group:?} was recovering: the request {}", if *started { "was cancelled while it ran" } else { "never ran" })]
    Recovering {
        /// The group's name.
        group: String,
        /// Whether the handler had started.
        started: bool,
    },
    /// An error kind this version does not know (from a newer peer).
    #[error("the server reported error kind {0}")]
    Unknown(u8),
}

/// A request's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// `FLAG_*` bits.
    pub flags: u8,
    /// The caller's channel (implied by the stream, except on the lane).
    pub channel: ChannelId,
    /// The call.
    pub call: CallId,
    /// The caller's remaining timeout when it sent this, in µs.
    pub timeout_us: Option<u64>,
}

/// What a reply says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReplyStatus {
    /// The reply body follows.
    Ok,
    /// The server has the request and is running or queueing it.
    StillRunning,
    /// The server answered with an error.
    Error(RemoteError),
}

/// A malformed message-layer header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed message header: {0}")]
pub struct HeaderError(pub &'static str);

/// Reads a varint at `*at`, moving `*at` past it.
fn varint(b: &[u8], at: &mut usize, what: &'static str) -> Result<u64, HeaderError> {
    let (v, n) = get_varint(b.get(*at..).unwrap_or_default()).ok_or(HeaderError(what))?;
    *at += n;
    Ok(v)
}

fn channel_of(v: u64) -> Result<ChannelId, HeaderError> {
    u16::try_from(v)
        .map(ChannelId)
        .map_err(|_| HeaderError("channel out of range"))
}

/// The header of a high-priority one-way message for `channel`.
pub(crate) fn oneway_high_prefix(channel: ChannelId) -> Prefix {
    let mut b = BytesMut::with_capacity(3);
    put_varint(&mut b, u64::from(channel.0));
    Prefix::new(&b).unwrap_or_default()
}

/// The channel of a high-priority one-way message and the header's length.
pub(crate) fn parse_oneway_high(msg: &[u8]) -> Result<(ChannelId, usize), HeaderError> {
    let mut at = 0;
    let c = channel_of(varint(msg, &mut at, "truncated channel")?)?;
    Ok((c, at))
}

/// The header of a request; `lane`: on the request lane (carries the
/// channel).
pub(crate) fn request_prefix(lane: bool, h: &RequestHeader) -> Prefix {
    let mut b = BytesMut::with_capacity(Prefix::MAX);
    let flags = if h.timeout_us.is_some() {
        h.flags | FLAG_DEADLINE
    } else {
        h.flags & !FLAG_DEADLINE
    };
    b.extend_from_slice(&[flags]);
    if lane {
        put_varint(&mut b, u64::from(h.channel.0));
    }
    put_varint(&mut b, h.call.0);
    if let Some(t) = h.timeout_us {
        put_varint(&mut b, t);
    }
    Prefix::new(&b).unwrap_or_default()
}

/// A request's header and its length. `channel` is the stream's channel
/// (`None` on the lane, where the header names it).
pub(crate) fn parse_request(
    msg: &[u8],
    channel: Option<ChannelId>,
) -> Result<(RequestHeader, usize), HeaderError> {
    let Some(&flags) = msg.first() else {
        return Err(HeaderError("empty request"));
    };
    if flags & !KNOWN_FLAGS != 0 {
        return Err(HeaderError("unknown request flags"));
    }
    let mut at = 1;
    let channel = match channel {
        Some(c) => c,
        None => channel_of(varint(msg, &mut at, "truncated channel")?)?,
    };
    let call = CallId(varint(msg, &mut at, "truncated call id")?);
    if call.0 == 0 {
        // Callers number calls from 1 (the server's bookkeeping relies on it).
        return Err(HeaderError("call id 0"));
    }
    let timeout_us = if flags & FLAG_DEADLINE != 0 {
        Some(varint(msg, &mut at, "truncated timeout")?)
    } else {
        None
    };
    Ok((
        RequestHeader {
            flags: flags & !FLAG_DEADLINE,
            channel,
            call,
            timeout_us,
        },
        at,
    ))
}

/// The header of a reply (and, for errors, its whole body).
pub(crate) fn reply_prefix(call: CallId, status: &ReplyStatus) -> (Prefix, Bytes) {
    let mut b = BytesMut::with_capacity(Prefix::MAX);
    let mut body = Bytes::new();
    match status {
        ReplyStatus::Ok => b.extend_from_slice(&[STATUS_OK]),
        ReplyStatus::StillRunning => b.extend_from_slice(&[STATUS_STILL_RUNNING]),
        ReplyStatus::Error(_) => b.extend_from_slice(&[STATUS_ERROR]),
    }
    put_varint(&mut b, call.0);
    if let ReplyStatus::Error(e) = status {
        let (kind, text) = match e {
            RemoteError::App { code, message } => {
                b.extend_from_slice(&[ERR_APP]);
                put_varint(&mut b, u64::from(*code));
                (None, message.as_str())
            }
            RemoteError::Panicked => (Some(ERR_PANICKED), ""),
            RemoteError::NoHandler => (Some(ERR_NO_HANDLER), ""),
            RemoteError::Expired => (Some(ERR_EXPIRED), ""),
            RemoteError::ShuttingDown => (Some(ERR_SHUTTING_DOWN), ""),
            RemoteError::Overloaded => (Some(ERR_OVERLOADED), ""),
            RemoteError::Recovering { group, started } => (
                Some(if *started {
                    ERR_RECOVERING_STARTED
                } else {
                    ERR_RECOVERING
                }),
                group.as_str(),
            ),
            RemoteError::Unknown(k) => (Some(*k), ""),
        };
        if let Some(k) = kind {
            b.extend_from_slice(&[k]);
        }
        let mut end = text.len().min(MAX_ERROR_MESSAGE);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        body = Bytes::copy_from_slice(&text.as_bytes()[..end]);
    }
    (Prefix::new(&b).unwrap_or_default(), body)
}

/// A reply's call, status and the length of what precedes its body (an
/// error's whole message counts as header).
pub(crate) fn parse_reply(msg: &[u8]) -> Result<(CallId, ReplyStatus, usize), HeaderError> {
    let Some(&status) = msg.first() else {
        return Err(HeaderError("empty reply"));
    };
    let mut at = 1;
    let call = CallId(varint(msg, &mut at, "truncated call id")?);
    let status = match status {
        STATUS_OK => ReplyStatus::Ok,
        STATUS_STILL_RUNNING => ReplyStatus::StillRunning,
        STATUS_ERROR => {
            let Some(&kind) = msg.get(at) else {
                return Err(HeaderError("error reply without a kind"));
            };
            at += 1;
            let e = match kind {
                ERR_APP => {
                    let code = u32::try_from(varint(msg, &mut at, "truncated error code")?)
                        .map_err(|_| HeaderError("error code out of range"))?;
                    let text = msg.get(at..).unwrap_or_default();
                    if text.len() > MAX_ERROR_MESSAGE {
                        return Err(HeaderError("error message too long"));
                    }
                    RemoteError::App {
                        code,
                        message: String::from_utf8_lossy(text).into_owned(),
                    }
                }
                ERR_PANICKED => RemoteError::Panicked,
                ERR_NO_HANDLER => RemoteError::NoHandler,
                ERR_EXPIRED => RemoteError::Expired,
                ERR_SHUTTING_DOWN => RemoteError::ShuttingDown,
                ERR_OVERLOADED => RemoteError::Overloaded,
                ERR_RECOVERING | ERR_RECOVERING_STARTED => {
                    let text = msg.get(at..).unwrap_or_default();
                    if text.len() > MAX_ERROR_MESSAGE {
                        return Err(HeaderError("error message too long"));
                    }
                    RemoteError::Recovering {
                        group: String::from_utf8_lossy(text).into_owned(),
                        started: kind == ERR_RECOVERING_STARTED,
                    }
                }
                k => RemoteError::Unknown(k),
            };
            at = msg.len();
            ReplyStatus::Error(e)
        }
        _ => return Err(HeaderError("unknown reply status")),
    };
    Ok((call, status, at))
}

/// Checks the header of a message on `stream` (one-way messages on a
/// channel's own stream have none).
pub(crate) fn check(stream: crate::ids::StreamId, msg: &[u8]) -> Result<(), HeaderError> {
    use crate::ids::StreamKind;
    match stream.kind() {
        StreamKind::Oneway(_) => Ok(()),
        StreamKind::OnewayHigh => parse_oneway_high(msg).map(|_| ()),
        StreamKind::Request(c) => parse_request(msg, Some(c)).map(|_| ()),
        StreamKind::RequestLane => parse_request(msg, None).map(|_| ()),
        StreamKind::Reply | StreamKind::ReplyLane => parse_reply(msg).map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(p: Prefix, body: &[u8]) -> Vec<u8> {
        let mut b = p.as_slice().to_vec();
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn requests_round_trip_on_both_kinds_of_stream() {
        let h = RequestHeader {
            flags: FLAG_RESEND | FLAG_HIGH,
            channel: ChannelId(300),
            call: CallId(u64::MAX),
            timeout_us: Some(5_000_000),
        };
        let m = join(request_prefix(true, &h), b"body");
        let (got, n) = parse_request(&m, None).unwrap();
        assert_eq!(got, h);
        assert_eq!(&m[n..], b"body");
        // On a channel's own stream the channel is implied, not sent.
        let h = RequestHeader {
            flags: 0,
            channel: ChannelId(7),
            call: CallId(1),
            timeout_us: None,
        };
        let p = request_prefix(false, &h);
        assert_eq!(p.as_slice(), &[0, 1]);
        assert_eq!(
            parse_request(&join(p, b""), Some(ChannelId(7))).unwrap().0,
            h
        );
        assert!(request_prefix(true, &h).as_slice().len() <= Prefix::MAX);
    }

    #[test]
    fn replies_round_trip_every_status() {
        let statuses = [
            ReplyStatus::Ok,
            ReplyStatus::StillRunning,
            ReplyStatus::Error(RemoteError::App {
                code: 42,
                message: "no such key".into(),
            }),
            ReplyStatus::Error(RemoteError::Panicked),
            ReplyStatus::Error(RemoteError::NoHandler),
            ReplyStatus::Error(RemoteError::Expired),
            ReplyStatus::Error(RemoteError::ShuttingDown),
            ReplyStatus::Error(RemoteError::Overloaded),
            ReplyStatus::Error(RemoteError::Recovering {
                group: "shard-3".into(),
                started: true,
            }),
            ReplyStatus::Error(RemoteError::Recovering {
                group: String::new(),
                started: false,
            }),
            ReplyStatus::Error(RemoteError::Unknown(99)),
        ];
        for s in statuses {
            let (p, body) = reply_prefix(CallId(300), &s);
            let extra: &[u8] = if s == ReplyStatus::Ok {
                b"reply"
            } else {
                &body
            };
            let m = join(p, extra);
            let (call, got, n) = parse_reply(&m).unwrap();
            assert_eq!((call, &got), (CallId(300), &s));
            if s == ReplyStatus::Ok {
                assert_eq!(&m[n..], b"reply");
            } else {
                assert_eq!(n, m.len());
            }
        }
        let m = join(oneway_high_prefix(ChannelId(9)), b"x");
        let (c, n) = parse_oneway_high(&m).unwrap();
        assert_eq!((c, &m[n..]), (ChannelId(9), &b"x"[..]));
    }

    #[test]
    fn malformed_headers_are_refused() {
        assert!(parse_request(&[], None).is_err());
        assert!(parse_request(&[0x80], Some(ChannelId(0))).is_err());
        assert!(parse_request(&[0, 0x80], Some(ChannelId(0))).is_err());
        assert!(parse_request(&[FLAG_DEADLINE, 1], Some(ChannelId(0))).is_err());
        assert!(parse_request(&[0, 0xff, 0xff, 0x7f, 1], None).is_err());
        assert!(parse_reply(&[9, 1]).is_err());
        assert!(parse_reply(&[STATUS_ERROR, 1]).is_err());
        assert!(parse_reply(&[STATUS_OK]).is_err());
        assert!(parse_oneway_high(&[0xff, 0xff, 0xff, 0x7f]).is_err());
        let long = vec![b'a'; MAX_ERROR_MESSAGE + 1];
        let mut m = vec![STATUS_ERROR, 1, ERR_APP, 0];
        m.extend_from_slice(&long);
        assert!(parse_reply(&m).is_err());
    }
}
