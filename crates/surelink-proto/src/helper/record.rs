//! The records a helper packs into one message of its own session to a
//! server: many clients' byte streams (*virtual connections*, see
//! docs/postman.md), each record behind a 7-byte header, big-endian:
//!
//! ```text
//!  0       1                       4                       7
//! +-------+-----------------------+-----------------------+----------
//! | kind  |   slot (24 bits)      |  length (24 bits)     | body ...
//! +-------+-----------------------+-----------------------+----------
//! ```
//!
//! | kind | name | body |
//! |---|---|---|
//! | 0x01 | OPEN | empty: the helper opened `slot` for a client (what the client then sends is its own HELLO and handshake, end to end) |
//! | 0x02 | DATA | the next bytes of `slot`'s stream, either way |
//! | 0x03 | CLOSE | code u16: `slot`'s stream ended |
//!
//! PostMan's header is 7 bytes too (type, length, source address, L94);
//! ours names a slot of the helper's table instead of an address, since
//! the stream inside is authenticated end to end.
//!
//! Decoding is zero-copy (a DATA body is a slice of the message) and
//! checks every length against what is there before taking it; a message
//! that does not parse is refused whole, with the reason.

use bytes::{BufMut, Bytes, BytesMut};

/// Header bytes per record.
pub const RECORD_HEADER: usize = 7;
/// The largest slot number (24 bits).
pub const MAX_SLOT: u32 = (1 << 24) - 1;
/// The largest record body (24 bits).
pub const MAX_RECORD_BODY: usize = (1 << 24) - 1;

const KIND_OPEN: u8 = 0x01;
const KIND_DATA: u8 = 0x02;
const KIND_CLOSE: u8 = 0x03;

/// One record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Record {
    /// The helper opened `slot` for a client.
    Open {
        /// The client's slot.
        slot: u32,
    },
    /// The next bytes of `slot`'s stream.
    Data {
        /// The client's slot.
        slot: u32,
        /// The bytes.
        body: Bytes,
    },
    /// `slot`'s stream ended.
    Close {
        /// The client's slot.
        slot: u32,
        /// Why (the session's close codes).
        code: u16,
    },
}

/// A record that cannot be written or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The slot does not fit 24 bits.
    #[error("slot {0} is larger than {MAX_SLOT}")]
    SlotTooLarge(u32),
    /// The body does not fit 24 bits of length.
    #[error("a record body of {0} bytes is larger than {MAX_RECORD_BODY}")]
    BodyTooLarge(usize),
    /// The message ends inside a record's header.
    #[error("{0} bytes left: shorter than a record header")]
    TruncatedHeader(usize),
    /// A record's length runs past the end of the message.
    #[error("a record says {len} bytes of body, {left} are left")]
    TruncatedBody {
        /// The length the header gives.
        len: usize,
        /// What is left of the message.
        left: usize,
    },
    /// A kind this version does not know.
    #[error("unknown record kind {0:#04x}")]
    UnknownKind(u8),
    /// An OPEN or CLOSE whose body is not the size its kind has.
    #[error("a record of kind {kind:#04x} has {len} bytes of body, not {want}")]
    BadLength {
        /// The kind.
        kind: u8,
        /// The length given.
        len: usize,
        /// The length the kind has.
        want: usize,
    },
}

impl Record {
    /// Appends this record to `out`.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), RecordError> {
        let code;
        let (kind, slot, body): (u8, u32, &[u8]) = match self {
            Record::Open { slot } => (KIND_OPEN, *slot, &[]),
            Record::Data { slot, body } => (KIND_DATA, *slot, body),
            Record::Close { slot, code: c } => {
                code = c.to_be_bytes();
                (KIND_CLOSE, *slot, &code[..])
            }
        };
        if slot > MAX_SLOT {
            return Err(RecordError::SlotTooLarge(slot));
        }
        if body.len() > MAX_RECORD_BODY {
            return Err(RecordError::BodyTooLarge(body.len()));
        }
        out.reserve(RECORD_HEADER + body.len());
        out.put_u8(kind);
        out.put_slice(&slot.to_be_bytes()[1..]);
        let len = u32::try_from(body.len()).map_err(|_| RecordError::BodyTooLarge(body.len()))?;
        out.put_slice(&len.to_be_bytes()[1..]);
        out.put_slice(body);
        Ok(())
    }

    /// Bytes this record takes on the wire.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER
            + match self {
                Record::Open { .. } => 0,
                Record::Data { body, .. } => body.len(),
                Record::Close { .. } => 2,
            }
    }
}

/// Reads every record of one message, in order; a message that does not
/// parse is refused whole.
pub fn decode_records(mut msg: Bytes) -> Result<Vec<Record>, RecordError> {
    let mut out = Vec::new();
    while !msg.is_empty() {
        if msg.len() < RECORD_HEADER {
            return Err(RecordError::TruncatedHeader(msg.len()));
        }
        let kind = msg[0];
        let slot = u32::from_be_bytes([0, msg[1], msg[2], msg[3]]);
        let len =
            usize::try_from(u32::from_be_bytes([0, msg[4], msg[5], msg[6]])).unwrap_or(usize::MAX);
        let left = msg.len() - RECORD_HEADER;
        if len > left {
            return Err(RecordError::TruncatedBody { len, left });
        }
        let mut rec = msg.split_to(RECORD_HEADER + len);
        let body = rec.split_off(RECORD_HEADER);
        let want = |want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(RecordError::BadLength { kind, len, want })
            }
        };
        out.push(match kind {
            KIND_OPEN => {
                want(0)?;
                Record::Open { slot }
            }
            KIND_DATA => Record::Data { slot, body },
            KIND_CLOSE => {
                want(2)?;
                Record::Close {
                    slot,
                    code: u16::from_be_bytes([body[0], body[1]]),
                }
            }
            other => return Err(RecordError::UnknownKind(other)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (0..=MAX_SLOT).prop_map(|slot| Record::Open { slot }),
            (0..=MAX_SLOT, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(slot, b)| {
                Record::Data {
                    slot,
                    body: Bytes::from(b),
                }
            }),
            (0..=MAX_SLOT, any::<u16>()).prop_map(|(slot, code)| Record::Close { slot, code }),
        ]
    }

    #[test]
    fn a_data_record_has_a_seven_byte_header() {
        let mut out = BytesMut::new();
        let r = Record::Data {
            slot: 0x01_0203,
            body: Bytes::from_static(b"hi"),
        };
        r.encode(&mut out).unwrap();
        assert_eq!(&out[..], &[0x02, 0x01, 0x02, 0x03, 0, 0, 2, b'h', b'i']);
        assert_eq!(r.encoded_len(), out.len());
    }

    #[test]
    fn what_does_not_fit_is_refused() {
        let mut out = BytesMut::new();
        assert_eq!(
            Record::Open { slot: MAX_SLOT + 1 }.encode(&mut out),
            Err(RecordError::SlotTooLarge(MAX_SLOT + 1))
        );
        assert!(out.is_empty());
        let bad = |b: &'static [u8]| decode_records(Bytes::from_static(b)).unwrap_err();
        assert_eq!(bad(&[2, 0, 0]), RecordError::TruncatedHeader(3));
        assert_eq!(
            bad(&[2, 0, 0, 1, 0, 0, 5, 1, 2]),
            RecordError::TruncatedBody { len: 5, left: 2 }
        );
        assert_eq!(bad(&[9, 0, 0, 1, 0, 0, 0]), RecordError::UnknownKind(9));
        assert_eq!(
            bad(&[3, 0, 0, 1, 0, 0, 1, 7]),
            RecordError::BadLength {
                kind: 3,
                len: 1,
                want: 2
            }
        );
        assert_eq!(
            bad(&[1, 0, 0, 1, 0, 0, 1, 7]),
            RecordError::BadLength {
                kind: 1,
                len: 1,
                want: 0
            }
        );
    }

    proptest! {
        #[test]
        fn records_round_trip(recs in proptest::collection::vec(record(), 0..20)) {
            let mut out = BytesMut::new();
            for r in &recs {
                r.encode(&mut out).unwrap();
            }
            prop_assert_eq!(out.len(), recs.iter().map(Record::encoded_len).sum::<usize>());
            prop_assert_eq!(decode_records(out.freeze()).unwrap(), recs);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(recs) = decode_records(Bytes::from(b.clone())) {
                let total: usize = recs.iter().map(Record::encoded_len).sum();
                prop_assert_eq!(total, b.len());
            }
        }
    }
}
