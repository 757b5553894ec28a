//! The wire format: a versioned frame header and the frame kinds.
//!
//! Every frame starts with an 8-byte header, all integers big-endian:
//!
//! ```text
//!  0       1       2               4                               8
//! +-------+-------+---------------+-------------------------------+
//! |version| kind  |    flags      |          body length          |
//! +-------+-------+---------------+-------------------------------+
//! ```
//!
//! Bodies by kind:
//!
//! | kind | name | body |
//! |---|---|---|
//! | 0x01 | HELLO | cluster u64, node u64, epoch u64, session u64, your_node u64, your_epoch u64, your_session u64, recv_window u32, max_message u32, max_channels u32 |
//! | 0x02 | RESUME | an ack body: the sender's whole receive state, sent once per new path |
//! | 0x03 | DATA | stream u16, seq u64, message (rest of the body) |
//! | 0x04 | ACK | ack_delay_us u32, count u16, count × (stream u16, cumulative u64, ranges u16, ranges × (start u64, end u64)) |
//! | 0x05 | CLOSE | scope u8, code u16, reason length u16, reason (UTF-8) |
//! | 0x06 | PING | token u64 |
//! | 0x07 | PONG | token u64 |
//! | 0x10 | HEARTBEAT | reserved (failure detector) |
//! | 0x11 | BARRIER | reserved (failure detector) |
//! | 0x20 | BATCH | stream u16, first seq u64, count u16, count × (flags u8, length varint, message) — see [`BatchFrame`] |
//! | 0x30 | ROUTE_UPDATE | one role-service message (see [`role`](crate::role)): unsequenced, re-sent by the role protocol until acknowledged |
//!
//! A *stream* ([`StreamId`](crate::StreamId)) is a numbered sequence of
//! messages inside a session; the message layer maps application channels
//! and message classes onto streams. RESUME shares ACK's body layout
//! (ack_delay is sent as 0 and ignored).
//! Flag bits a kind does not define are sent as zero and ignored on receipt,
//! so later versions can add hints without breaking this one.
//!
//! Decoding is zero-copy: a DATA payload is a slice of the input buffer, and
//! ack bodies are validated once and then iterated in place. A decoder never
//! allocates more than the frame it was handed, and the frame length is
//! checked against the configured maximum before any byte of the body is
//! buffered.

mod ack;
mod batch;
mod decode;
mod encode;
mod frame;
mod gather;
mod varint;

pub use ack::{AckEntry, AckFrame, AckRanges, AckWriter};
pub use batch::{
    batch_header, batched_message_overhead, encode_batch, put_batched_message, BatchFrame,
    BatchIter, BatchSlices, BATCH_FIXED, BATCH_OVERHEAD, MAX_BATCH_COUNT, MIN_BATCHED_MESSAGE,
};
pub use decode::{decode, decode_frame, DecodeError};
pub use encode::{
    data_header, encode_data, encode_data_parts, encode_hello, encode_ping, encode_pong,
    encode_route_update,
};
pub use frame::{Close, CloseCode, CloseScope, DataFrame, Frame, FrameKind, Hello};
pub use gather::TransmitBuf;
pub use varint::{get_varint, put_varint, varint_len, MAX_VARINT};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes in every frame header.
pub const HEADER_LEN: usize = 8;
/// Bytes a DATA frame adds in front of its payload (header + stream + seq).
pub const DATA_OVERHEAD: usize = HEADER_LEN + 2 + 8;
/// Body length of a HELLO frame.
pub const HELLO_BODY_LEN: usize = 8 * 7 + 4 * 3;
/// Flag on DATA: this is a re-send of a message already sent once.
pub const DATA_FLAG_RETRANSMIT: u16 = 0x0001;
/// Flag on DATA: the sender withdrew this message (it was larger than the
/// receiver accepts); the payload is empty and the receiver skips the number
/// without delivering anything.
pub const DATA_FLAG_WITHDRAWN: u16 = 0x0002;
/// The most selective-ack ranges one channel entry may carry. Bounds the work
/// a single ack can cause on the receiving side.
pub const MAX_ACK_RANGES: usize = 64;
/// The longest CLOSE reason accepted, in bytes.
pub const MAX_CLOSE_REASON: usize = 1024;
