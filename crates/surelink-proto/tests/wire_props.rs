//! Property tests for the wire codec (`surelink_proto::wire`).
//!
//! What is checked:
//!
//! 1. **Round trips**: every implemented frame kind (HELLO, RESUME, DATA,
//!    BATCH, ACK, CLOSE, PING, PONG) encodes and decodes back to an equal frame, alone,
//!    concatenated with others, fed one byte at a time and in random chunks
//!    (`Ok(None)` until a frame is complete, buffer untouched meanwhile).
//! 2. **No panics on hostile input**: arbitrary bytes, plausible headers over
//!    random bodies, and mutated valid encodings decode to a frame or an error;
//!    every decoded frame is canonical (re-encodes to something that decodes to
//!    the same frame) and every decoded ack iterates in full.
//! 3. **Bounded allocation**: a header announcing a body above the maximum is
//!    refused with `TooLarge` as soon as its 8 bytes arrive, without growing
//!    the buffer.
//! 4. **Typed errors** for wrong versions, unknown and reserved kinds, and
//!    malformed HELLO, ACK/RESUME, CLOSE, DATA and BATCH bodies.
//! 5. **`decode_frame`** accepts exactly one frame and rejects trailing bytes
//!    and short buffers.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use surelink_proto::wire::{
    decode, decode_frame, encode_batch, encode_data, encode_hello, encode_ping, encode_pong,
    put_batched_message, AckFrame, AckWriter, Close, CloseCode, CloseScope, DataFrame, DecodeError,
    Frame, FrameKind, Hello, HEADER_LEN, HELLO_BODY_LEN, MAX_ACK_RANGES, MAX_CLOSE_REASON,
    PROTOCOL_VERSION,
};
use surelink_proto::{ClusterId, Epoch, NodeId, SessionId, StreamId};

/// The body limit used wherever a test does not vary it.
const MAX: u32 = 1 << 20;

/// Kind bytes that name a frame kind (implemented or reserved).
const KNOWN_KINDS: [u8; 11] = [
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x10, 0x11, 0x20, 0x30,
];

/// Kind bytes this version decodes.
const IMPLEMENTED_KINDS: [u8; 8] = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x20];

// ---------------------------------------------------------------------------
// Model of a frame to encode
// ---------------------------------------------------------------------------

/// One ack entry as the test means it.
#[derive(Clone, Debug)]
struct EntrySpec {
    channel: u16,
    cumulative: u64,
    ranges: Vec<(u64, u64)>,
}

/// An ack entry as plain values: channel, cumulative, ranges.
type EntryTuple = (u16, u64, Vec<(u64, u64)>);

/// A frame to encode and the frame it must decode to. Ack bodies have no public
/// constructor, so they are modelled field by field and written with `AckWriter`.
#[derive(Clone, Debug)]
enum Spec {
    /// Hello, Data, Close, Ping or Pong: encoded with `Frame::encode`.
    Plain(Frame),
    /// Ack or Resume: written with `AckWriter`.
    Ack {
        resume: bool,
        delay_us: u32,
        entries: Vec<EntrySpec>,
    },
    /// Batch: written with `put_batched_message` and `encode_batch`.
    Batch {
        stream: u16,
        first: u64,
        flags: u16,
        messages: Vec<Vec<u8>>,
    },
}

impl Spec {
    fn kind(&self) -> FrameKind {
        match self {
            Spec::Plain(f) => frame_kind(f),
            Spec::Ack { resume: true, .. } => FrameKind::Resume,
            Spec::Ack { resume: false, .. } => FrameKind::Ack,
            Spec::Batch { .. } => FrameKind::Batch,
        }
    }

    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Spec::Plain(f) => f.encode(buf),
            Spec::Ack {
                resume,
                delay_us,
                entries,
            } => {
                write_ack(buf, *resume, *delay_us, entries);
            }
            Spec::Batch {
                stream,
                first,
                flags,
                messages,
            } => write_batch(buf, *stream, *first, *flags, messages),
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf.to_vec()
    }

    /// Checks that `f` is the frame this spec describes.
    fn check(&self, f: &Frame) -> Result<(), TestCaseError> {
        match self {
            Spec::Plain(expected) => prop_assert_eq!(f, expected),
            Spec::Ack {
                resume,
                delay_us,
                entries,
            } => {
                let a = match (resume, f) {
                    (false, Frame::Ack(a)) | (true, Frame::Resume(a)) => a,
                    _ => return Err(fail(format!("expected {:?}, got {f:?}", self.kind()))),
                };
                prop_assert_eq!(a.delay(), Duration::from_micros(u64::from(*delay_us)));
                prop_assert_eq!(a.len(), entries.len());
                prop_assert_eq!(a.is_empty(), entries.is_empty());
                let got: Vec<EntryTuple> = a
                    .entries()
                    .map(|e| (e.stream.0, e.cumulative, e.ranges.collect()))
                    .collect();
                let want: Vec<EntryTuple> = entries
                    .iter()
                    .map(|e| (e.channel, e.cumulative, e.ranges.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Spec::Batch {
                stream,
                first,
                flags,
                messages,
            } => {
                let Frame::Batch(b) = f else {
                    return Err(fail(format!("expected a batch, got {f:?}")));
                };
                prop_assert_eq!(
                    (b.stream, b.first, b.flags, usize::from(b.count)),
                    (StreamId(*stream), *first, *flags, messages.len())
                );
                prop_assert_eq!(b.end(), first + messages.len() as u64);
                let got: Vec<Vec<u8>> = b.messages().map(|m| m.to_vec()).collect();
                prop_assert_eq!(&got, messages);
                let slices: Vec<Vec<u8>> = b.slices().map(<[u8]>::to_vec).collect();
                prop_assert_eq!(&slices, messages);
                let longest = messages.iter().map(Vec::len).max().unwrap_or(0);
                prop_assert_eq!(b.max_len as usize, longest);
            }
        }
        Ok(())
    }
}

fn write_batch(buf: &mut BytesMut, stream: u16, first: u64, flags: u16, messages: &[Vec<u8>]) {
    let mut body = BytesMut::new();
    for m in messages {
        put_batched_message(&mut body, &[], m);
    }
    let count = u16::try_from(messages.len()).expect("test batches are small");
    encode_batch(buf, StreamId(stream), first, count, flags, &body);
}

fn write_ack(buf: &mut BytesMut, resume: bool, delay_us: u32, entries: &[EntrySpec]) -> usize {
    let kind = if resume {
        FrameKind::Resume
    } else {
        FrameKind::Ack
    };
    let start = buf.len();
    let mut w = AckWriter::begin(buf, kind, delay_us);
    for e in entries {
        w.entry(buf, StreamId(e.channel), e.cumulative, &e.ranges);
    }
    let total = w.finish(buf);
    assert_eq!(
        total,
        buf.len() - start,
        "AckWriter::finish reports the frame size"
    );
    total
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

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

fn encode_frame(f: &Frame) -> Vec<u8> {
    let mut buf = BytesMut::new();
    f.encode(&mut buf);
    buf.to_vec()
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn hello_with(
    epoch: impl Strategy<Value = u64>,
    session: impl Strategy<Value = u64>,
) -> impl Strategy<Value = Hello> {
    (
        any::<u64>(),
        any::<u64>(),
        epoch,
        session,
        (any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<u32>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(
            |(
                cluster,
                node,
                epoch,
                session,
                (your_node, your_epoch, your_session),
                (rw, mm, mc),
            )| Hello {
                cluster: ClusterId(cluster),
                node: NodeId(node),
                epoch: Epoch(epoch),
                session: SessionId(session),
                your_node: NodeId(your_node),
                your_epoch: Epoch(your_epoch),
                your_session: SessionId(your_session),
                recv_window: rw,
                max_message: mm,
                max_channels: mc,
            },
        )
}

fn hello() -> impl Strategy<Value = Hello> {
    hello_with(1..=u64::MAX, 1..=u64::MAX)
}

fn data() -> impl Strategy<Value = DataFrame> {
    let payload = prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..64),
        1 => prop::collection::vec(any::<u8>(), 0..4096),
    ];
    (any::<u16>(), any::<u64>(), any::<u16>(), payload).prop_map(|(stream, seq, flags, p)| {
        DataFrame {
            stream: StreamId(stream),
            seq,
            flags,
            payload: Bytes::from(p),
        }
    })
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn truncate_utf8(mut s: String, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

fn reason() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        prop::collection::vec(any::<char>(), 0..=400)
            .prop_map(|cs| truncate_utf8(cs.into_iter().collect(), MAX_CLOSE_REASON)),
        (0..=MAX_CLOSE_REASON).prop_map(|n| "x".repeat(n)),
        Just("é".repeat(MAX_CLOSE_REASON / 2)),
    ]
}

fn close() -> impl Strategy<Value = Close> {
    let scope = prop_oneof![Just(CloseScope::Path), Just(CloseScope::Session)];
    (scope, any::<u16>(), reason()).prop_map(|(scope, code, reason)| Close {
        scope,
        code: CloseCode(code),
        reason,
    })
}

fn cumulative() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1000, any::<u64>(), (u64::MAX - 1000)..=u64::MAX]
}

/// Ascending, disjoint, non-empty ranges above `cumulative` (the first may
/// start at it), built from `(gap, len)` steps; steps that would overflow `u64`
/// are dropped.
fn ranges_from_steps(cumulative: u64, steps: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut ranges = Vec::with_capacity(steps.len());
    let mut floor = cumulative;
    for (i, &(gap, len)) in steps.iter().enumerate() {
        let gap = if i == 0 { gap } else { gap.max(1) };
        let Some(start) = floor.checked_add(gap) else {
            break;
        };
        let Some(end) = start.checked_add(len.max(1)) else {
            break;
        };
        ranges.push((start, end));
        floor = end;
    }
    ranges
}

fn steps(n: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let gap = prop_oneof![3 => 0u64..4, 1 => 0u64..(1 << 40)];
    let len = prop_oneof![3 => 1u64..4, 1 => 1u64..(1 << 40)];
    prop::collection::vec((gap, len), n)
}

fn entry() -> impl Strategy<Value = EntrySpec> {
    let n = prop_oneof![3 => 0usize..=4, 1 => 0usize..=MAX_ACK_RANGES];
    (
        any::<u16>(),
        cumulative(),
        n.prop_flat_map(|n| steps(n..=n)),
    )
        .prop_map(|(channel, cumulative, steps)| EntrySpec {
            channel,
            cumulative,
            ranges: ranges_from_steps(cumulative, &steps),
        })
}

fn ack_spec() -> impl Strategy<Value = Spec> {
    (
        any::<bool>(),
        any::<u32>(),
        prop::collection::vec(entry(), 0..6),
    )
        .prop_map(|(resume, delay_us, entries)| Spec::Ack {
            resume,
            delay_us,
            entries,
        })
}

fn batch() -> impl Strategy<Value = Spec> {
    let message = prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..80),
        1 => prop::collection::vec(any::<u8>(), 0..400),
    ];
    (
        any::<u16>(),
        prop_oneof![0u64..1000, 0u64..(u64::MAX - 100)],
        any::<u16>(),
        prop::collection::vec(message, 1..40),
    )
        .prop_map(|(stream, first, flags, messages)| Spec::Batch {
            stream,
            first,
            flags,
            messages,
        })
}

/// Any frame of an implemented kind.
fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        1 => hello().prop_map(|h| Spec::Plain(Frame::Hello(h))),
        3 => data().prop_map(|d| Spec::Plain(Frame::Data(d))),
        2 => batch(),
        3 => ack_spec(),
        1 => close().prop_map(|c| Spec::Plain(Frame::Close(c))),
        1 => any::<u64>().prop_map(|t| Spec::Plain(Frame::Ping(t))),
        1 => any::<u64>().prop_map(|t| Spec::Plain(Frame::Pong(t))),
        1 => prop::collection::vec(any::<u8>(), 0..256)
            .prop_map(|m| Spec::Plain(Frame::RouteUpdate(Bytes::from(m)))),
    ]
}

fn max_body() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), 0u32..64, 0u32..4096, Just(MAX), Just(u32::MAX)]
}

// ---------------------------------------------------------------------------
// Raw frame building (for inputs the encoders refuse to produce)
// ---------------------------------------------------------------------------

fn header(version: u8, kind: u8, flags: u16, len: u32) -> Vec<u8> {
    let mut h = vec![version, kind];
    h.extend_from_slice(&flags.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

fn raw_frame(kind: u8, flags: u16, body: &[u8]) -> BytesMut {
    let len = u32::try_from(body.len()).expect("test bodies fit in u32");
    let mut v = header(PROTOCOL_VERSION, kind, flags, len);
    v.extend_from_slice(body);
    BytesMut::from(&v[..])
}

/// An unchecked ack entry: channel, cumulative, announced range count, ranges.
type RawEntry = (u16, u64, u16, Vec<(u64, u64)>);

/// An ack body written field by field, with no checks at all.
fn raw_ack_body(delay_us: u32, count: u16, entries: &[RawEntry]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&delay_us.to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    for (channel, cumulative, nranges, ranges) in entries {
        b.extend_from_slice(&channel.to_be_bytes());
        b.extend_from_slice(&cumulative.to_be_bytes());
        b.extend_from_slice(&nranges.to_be_bytes());
        for (s, e) in ranges {
            b.extend_from_slice(&s.to_be_bytes());
            b.extend_from_slice(&e.to_be_bytes());
        }
    }
    b
}

fn expect_malformed<T: std::fmt::Debug>(
    r: Result<T, DecodeError>,
    kind: FrameKind,
) -> Result<(), TestCaseError> {
    match r {
        Err(DecodeError::Malformed { kind: k, .. }) if k == kind => Ok(()),
        other => Err(fail(format!(
            "expected Malformed {{ kind: {kind:?} }}, got {other:?}"
        ))),
    }
}

// ---------------------------------------------------------------------------
// Invariants of anything the decoder returns
// ---------------------------------------------------------------------------

/// A decoded ack iterates fully, and what it yields obeys the rules `parse`
/// enforced.
fn check_ack(a: &AckFrame) -> Result<(), TestCaseError> {
    let mut n = 0usize;
    for e in a.entries() {
        n += 1;
        let ranges: Vec<(u64, u64)> = e.ranges.clone().collect();
        prop_assert!(ranges.len() <= MAX_ACK_RANGES);
        let mut floor = e.cumulative;
        for (i, &(start, end)) in ranges.iter().enumerate() {
            prop_assert!(
                if i == 0 {
                    start >= floor
                } else {
                    start > floor
                },
                "{:?}",
                e
            );
            prop_assert!(start < end, "{:?}", e);
            floor = end;
        }
        // Debug output walks the ranges again.
        let _ = format!("{e:?}");
    }
    prop_assert_eq!(n, a.len());
    prop_assert_eq!(a.is_empty(), n == 0);
    let _ = format!("{a:?}");
    Ok(())
}

/// Checks one decoded frame: acks iterate, and the frame is canonical (its
/// encoding decodes back to the same frame).
fn check_decoded(f: &Frame) -> Result<(), TestCaseError> {
    if let Frame::Ack(a) | Frame::Resume(a) = f {
        check_ack(a)?;
    }
    let again = decode_frame(Bytes::from(encode_frame(f)), u32::MAX);
    prop_assert_eq!(again.as_ref(), Ok(f));
    Ok(())
}

/// Decodes frames off `buf` until it needs more bytes or fails, checking the
/// buffer contract at every step. Returns the frames and the final error.
fn drain(buf: &mut BytesMut, max: u32) -> Result<(Vec<Frame>, Option<DecodeError>), TestCaseError> {
    let mut frames = Vec::new();
    loop {
        let before = buf.to_vec();
        match decode(buf, max) {
            Ok(None) => {
                prop_assert_eq!(
                    &buf[..],
                    &before[..],
                    "Ok(None) must leave the buffer untouched"
                );
                return Ok((frames, None));
            }
            Ok(Some(f)) => {
                prop_assert!(before.len() >= HEADER_LEN);
                let len = u32::from_be_bytes([before[4], before[5], before[6], before[7]]);
                prop_assert!(len <= max);
                let total = HEADER_LEN + usize::try_from(len).expect("u32 fits in usize");
                prop_assert_eq!(&buf[..], &before[total..], "exactly one frame consumed");
                check_decoded(&f)?;
                frames.push(f);
            }
            Err(e) => return Ok((frames, Some(e))),
        }
    }
}

// ---------------------------------------------------------------------------
// 1. Round trips
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Every implemented kind decodes to what was encoded, consuming exactly
    /// its bytes, and re-encodes to the same bytes.
    #[test]
    fn roundtrip_single(s in spec(), max_extra in 0u32..16) {
        let bytes = s.to_bytes();
        let body = u32::try_from(bytes.len() - HEADER_LEN).unwrap();
        let mut buf = BytesMut::from(&bytes[..]);
        // The tightest limit that admits the frame.
        let f = decode(&mut buf, body + max_extra).unwrap().unwrap();
        s.check(&f)?;
        prop_assert!(buf.is_empty());
        prop_assert_eq!(encode_frame(&f), bytes.clone());
        prop_assert_eq!(decode_frame(Bytes::from(bytes), body), Ok(f));
    }

    /// The free encoding functions agree with `Frame::encode`.
    #[test]
    fn free_encoders_match_frame_encode(h in hello(), d in data(), token in any::<u64>()) {
        let mut buf = BytesMut::new();
        encode_hello(&mut buf, &h);
        prop_assert_eq!(buf.to_vec(), encode_frame(&Frame::Hello(h)));

        let mut buf = BytesMut::new();
        encode_data(&mut buf, d.stream, d.seq, d.flags, &d.payload);
        prop_assert_eq!(buf.len(), surelink_proto::wire::DATA_OVERHEAD + d.payload.len());
        prop_assert_eq!(buf.to_vec(), encode_frame(&Frame::Data(d)));

        let mut buf = BytesMut::new();
        encode_ping(&mut buf, token);
        prop_assert_eq!(buf.to_vec(), encode_frame(&Frame::Ping(token)));

        let mut buf = BytesMut::new();
        encode_pong(&mut buf, token);
        prop_assert_eq!(buf.to_vec(), encode_frame(&Frame::Pong(token)));
    }

    /// Several frames in one buffer decode back in order, then `Ok(None)`.
    #[test]
    fn roundtrip_concatenated(specs in prop::collection::vec(spec(), 1..8)) {
        let mut buf = BytesMut::new();
        for s in &specs {
            s.encode(&mut buf);
        }
        for s in &specs {
            let f = decode(&mut buf, MAX).unwrap().unwrap();
            s.check(&f)?;
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(decode(&mut buf, MAX), Ok(None));
    }

    /// Two frames fed one byte at a time: `Ok(None)` with the buffer untouched
    /// until a frame is whole, then exactly that frame, leaving the rest.
    #[test]
    fn roundtrip_every_split_point(a in spec(), b in spec()) {
        let ea = a.to_bytes();
        let eb = b.to_bytes();
        let stream = [ea.clone(), eb.clone()].concat();
        let mut buf = BytesMut::new();
        let mut consumed = 0;
        let mut decoded = Vec::new();
        for fed in 1..=stream.len() {
            buf.extend_from_slice(&stream[fed - 1..fed]);
            match decode(&mut buf, MAX).unwrap() {
                None => {
                    prop_assert!(fed != ea.len() && fed != stream.len(), "whole frame not decoded");
                    prop_assert_eq!(&buf[..], &stream[consumed..fed]);
                }
                Some(f) => {
                    let end = if decoded.is_empty() { ea.len() } else { stream.len() };
                    prop_assert_eq!(fed, end, "frame decoded before it was whole");
                    consumed = fed;
                    prop_assert!(buf.is_empty());
                    decoded.push(f);
                }
            }
        }
        prop_assert_eq!(decoded.len(), 2);
        a.check(&decoded[0])?;
        b.check(&decoded[1])?;
    }

    /// A stream of frames arriving in random-sized chunks decodes in order.
    #[test]
    fn roundtrip_random_chunks(
        specs in prop::collection::vec(spec(), 1..6),
        chunks in prop::collection::vec(1usize..200, 1..64),
    ) {
        let stream: Vec<u8> = specs.iter().flat_map(|s| s.to_bytes()).collect();
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        let mut pos = 0;
        let mut sizes = chunks.iter().cycle();
        while pos < stream.len() {
            let n = (*sizes.next().unwrap()).min(stream.len() - pos);
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            let (got, err) = drain(&mut buf, MAX)?;
            prop_assert_eq!(err, None);
            frames.extend(got);
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(frames.len(), specs.len());
        for (s, f) in specs.iter().zip(&frames) {
            s.check(f)?;
        }
    }

    /// A CLOSE reason above the limit is cut at a character boundary and the
    /// frame still decodes, to the cut reason.
    #[test]
    fn close_long_reason_is_cut(
        pad in 1000usize..=MAX_CLOSE_REASON,
        tail in prop::collection::vec(any::<char>(), 1..40),
    ) {
        let reason: String = "a".repeat(pad).chars().chain(tail).collect();
        prop_assume!(reason.len() > MAX_CLOSE_REASON);
        let c = Close { scope: CloseScope::Session, code: CloseCode(9), reason: reason.clone() };
        let f = decode_frame(Bytes::from(encode_frame(&Frame::Close(c.clone()))), MAX).unwrap();
        let want = Close { reason: truncate_utf8(reason, MAX_CLOSE_REASON), ..c };
        prop_assert_eq!(f, Frame::Close(want));
    }

    /// `AckWriter` drops ranges beyond `MAX_ACK_RANGES`; the rest decode.
    #[test]
    fn ack_writer_drops_extra_ranges(
        cum in 0u64..1000,
        st in steps(MAX_ACK_RANGES + 1..=MAX_ACK_RANGES + 40),
    ) {
        let ranges = ranges_from_steps(cum, &st);
        prop_assert!(ranges.len() > MAX_ACK_RANGES);
        let mut buf = BytesMut::new();
        let entry = |ranges: &[(u64, u64)]| {
            EntrySpec { channel: 1, cumulative: cum, ranges: ranges.to_vec() }
        };
        write_ack(&mut buf, false, 0, &[entry(&ranges)]);
        let want = Spec::Ack {
            resume: false,
            delay_us: 0,
            entries: vec![entry(&ranges[..MAX_ACK_RANGES])],
        };
        want.check(&decode(&mut buf, MAX).unwrap().unwrap())?;
    }
}

// ---------------------------------------------------------------------------
// 2. Hostile input never panics
// ---------------------------------------------------------------------------

/// A header that passes the version check over a random body, with a length
/// that matches the body or misses it by a little.
fn plausible_frame() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![4 => prop::sample::select(IMPLEMENTED_KINDS.to_vec()), 1 => any::<u8>()];
    (
        kind,
        any::<u16>(),
        prop::collection::vec(any::<u8>(), 0..300),
        -4i64..=4,
    )
        .prop_map(|(kind, flags, body, skew)| {
            let len = i64::try_from(body.len()).expect("short body") + skew;
            let len = u32::try_from(len.max(0)).expect("short body");
            let mut v = header(PROTOCOL_VERSION, kind, flags, len);
            v.extend_from_slice(&body);
            v
        })
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(Index, u8),
    Set(Index, u8),
    Truncate(Index),
    Remove(Index, usize),
    Insert(Index, Vec<u8>),
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), 1usize..24).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..24))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
    ]
}

fn apply(v: &mut Vec<u8>, m: &Mutation) {
    if v.is_empty() {
        if let Mutation::Extend(b) | Mutation::Insert(_, b) = m {
            v.extend_from_slice(b);
        }
        return;
    }
    match m {
        Mutation::Flip(i, mask) => {
            let i = i.index(v.len());
            v[i] ^= mask;
        }
        Mutation::Set(i, b) => {
            let i = i.index(v.len());
            v[i] = *b;
        }
        Mutation::Truncate(i) => v.truncate(i.index(v.len())),
        Mutation::Remove(i, n) => {
            let i = i.index(v.len());
            let end = (i + n).min(v.len());
            v.drain(i..end);
        }
        Mutation::Insert(i, b) => {
            let i = i.index(v.len() + 1);
            v.splice(i..i, b.iter().copied());
        }
        Mutation::Extend(b) => v.extend_from_slice(b),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Arbitrary bytes decode to frames or an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        max in max_body(),
    ) {
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = decode(&mut buf.clone(), max);
        drain(&mut buf, max)?;
        let _ = decode_frame(Bytes::from(bytes), max);
    }

    /// Valid version byte and mostly implemented kinds over random bodies, so
    /// the body parsers see garbage.
    #[test]
    fn plausible_frames_never_panic(
        frames in prop::collection::vec(plausible_frame(), 1..4),
        max in max_body(),
    ) {
        let stream = frames.concat();
        drain(&mut BytesMut::from(&stream[..]), max)?;
        for f in frames {
            if let Ok(f) = decode_frame(Bytes::from(f), max) {
                check_decoded(&f)?;
            }
        }
    }

    /// Mutated valid encodings (flipped, overwritten, cut, removed, inserted,
    /// appended bytes) never panic; whatever still decodes iterates in full
    /// and is canonical.
    #[test]
    fn mutated_frames_never_panic(
        specs in prop::collection::vec(spec(), 1..4),
        mutations in prop::collection::vec(mutation(), 1..6),
        max in prop_oneof![Just(MAX), Just(u32::MAX), 0u32..4096],
    ) {
        let mut bytes: Vec<u8> = specs.iter().flat_map(|s| s.to_bytes()).collect();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        drain(&mut BytesMut::from(&bytes[..]), max)?;
        if let Ok(f) = decode_frame(Bytes::from(bytes), max) {
            check_decoded(&f)?;
        }
    }

    /// Targeted: ack bodies with one field of one entry overwritten.
    #[test]
    fn mutated_acks_iterate(
        entries in prop::collection::vec(entry(), 1..4),
        at in any::<Index>(),
        word in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..100],
        width in prop::sample::select(vec![1usize, 2, 8]),
    ) {
        let mut buf = BytesMut::new();
        write_ack(&mut buf, false, 7, &entries);
        let mut v = buf.to_vec();
        let i = HEADER_LEN + at.index(v.len() - HEADER_LEN);
        let end = (i + width).min(v.len());
        let w = word.to_be_bytes();
        let n = end - i;
        v[i..end].copy_from_slice(&w[8 - n..]);
        drain(&mut BytesMut::from(&v[..]), MAX)?;
    }
}

// ---------------------------------------------------------------------------
// 3. Bounded allocation
// ---------------------------------------------------------------------------

/// A limit and a length above it.
fn oversized() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![0u32..4096, 0u32..u32::MAX, Just(u32::MAX - 1)]
        .prop_flat_map(|max| (Just(max), prop_oneof![Just(max + 1), (max + 1)..=u32::MAX]))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The header alone (plus perhaps a few body bytes) is enough to refuse a
    /// body above the limit, and the buffer is not grown for it. Fewer than 8
    /// bytes are simply not enough to decide.
    #[test]
    fn too_large_refused_at_header(
        (max, len) in oversized(),
        kind in prop::sample::select(IMPLEMENTED_KINDS.to_vec()),
        flags in any::<u16>(),
        body in prop::collection::vec(any::<u8>(), 0..32),
    ) {
        let h = header(PROTOCOL_VERSION, kind, flags, len);
        for cut in 0..HEADER_LEN {
            let mut buf = BytesMut::from(&h[..cut]);
            prop_assert_eq!(decode(&mut buf, max), Ok(None));
            prop_assert_eq!(&buf[..], &h[..cut]);
        }
        let mut v = h.clone();
        v.extend_from_slice(&body);
        let mut buf = BytesMut::from(&v[..]);
        let cap = buf.capacity();
        prop_assert_eq!(decode(&mut buf, max), Err(DecodeError::TooLarge { len, max }));
        prop_assert_eq!(buf.capacity(), cap, "no allocation for a refused frame");
        prop_assert_eq!(
            decode_frame(Bytes::from(v), max),
            Err(DecodeError::TooLarge { len, max })
        );
    }

    /// A body exactly at the limit is not refused for its size.
    #[test]
    fn length_at_limit_is_accepted(max in 0u32..2048, flags in any::<u16>()) {
        let body = vec![0u8; usize::try_from(max).unwrap()];
        // DATA accepts any body of 10 bytes or more.
        let mut buf = raw_frame(FrameKind::Data as u8, flags, &body);
        let r = decode(&mut buf, max);
        if max >= 10 {
            prop_assert!(matches!(r, Ok(Some(Frame::Data(_)))), "{:?}", r);
        } else {
            expect_malformed(r, FrameKind::Data)?;
        }
    }
}

// ---------------------------------------------------------------------------
// 4. Typed errors
// ---------------------------------------------------------------------------

/// Corruptions that make a valid entry's ranges violate the ack rules.
#[derive(Clone, Copy, Debug)]
enum Break {
    /// First range starts below the cumulative point.
    BelowCumulative,
    /// A range is empty (`start == end`).
    Empty,
    /// A range is reversed (`start > end`).
    Reversed,
    /// A range starts where the previous one ends (should have been merged).
    Touching,
    /// A range starts inside the previous one.
    Overlapping,
    /// Two neighbouring ranges swapped (descending).
    Swapped,
}

fn breakage() -> impl Strategy<Value = Break> {
    prop::sample::select(vec![
        Break::BelowCumulative,
        Break::Empty,
        Break::Reversed,
        Break::Touching,
        Break::Overlapping,
        Break::Swapped,
    ])
}

/// Applies `b` to the ranges (at least two) of an entry whose cumulative is
/// at least 1.
fn break_ranges(cumulative: u64, r: &mut [(u64, u64)], b: Break, at: Index) {
    let i = at.index(r.len());
    let j = 1 + at.index(r.len() - 1); // a range with a predecessor
    match b {
        Break::BelowCumulative => r[0].0 = cumulative - 1,
        Break::Empty => r[i].1 = r[i].0,
        Break::Reversed => r[i] = (r[i].1, r[i].0),
        Break::Touching => r[j].0 = r[j - 1].1,
        Break::Overlapping => r[j].0 = r[j - 1].1 - 1,
        Break::Swapped => r.swap(j - 1, j),
    }
}

fn version_byte() -> impl Strategy<Value = u8> {
    any::<u8>().prop_filter("not the current version", |v| *v != PROTOCOL_VERSION)
}

fn unknown_kind() -> impl Strategy<Value = u8> {
    any::<u8>().prop_filter("not a known kind", |k| !KNOWN_KINDS.contains(k))
}

fn invalid_utf8() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![
        vec![0xFF],
        vec![0xFE],
        vec![0x80],                   // lone continuation byte
        vec![0xC0, 0x80],             // overlong NUL
        vec![0xED, 0xA0, 0x80],       // UTF-16 surrogate
        vec![0xF4, 0x90, 0x80, 0x80], // above U+10FFFF
        vec![0xE2, 0x82],             // truncated sequence
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn wrong_version(
        v in version_byte(),
        kind in any::<u8>(),
        flags in any::<u16>(),
        len in any::<u32>(),
        max in max_body(),
    ) {
        let mut buf = BytesMut::from(&header(v, kind, flags, len)[..]);
        prop_assert_eq!(decode(&mut buf, max), Err(DecodeError::Version(v)));
    }

    #[test]
    fn unknown_kind_refused(
        kind in unknown_kind(),
        flags in any::<u16>(),
        body in prop::collection::vec(any::<u8>(), 0..32),
    ) {
        let mut buf = raw_frame(kind, flags, &body);
        prop_assert_eq!(decode(&mut buf, MAX), Err(DecodeError::UnknownKind(kind)));
    }

    /// Reserved kinds are refused from the header alone, body or not.
    #[test]
    fn reserved_kinds_refused(
        (byte, kind) in prop::sample::select(vec![
            (0x10u8, FrameKind::Heartbeat),
            (0x11, FrameKind::Barrier),
        ]),
        flags in any::<u16>(),
        body in prop::collection::vec(any::<u8>(), 0..64),
        header_only in any::<bool>(),
    ) {
        let mut buf = raw_frame(byte, flags, &body);
        if header_only {
            buf.truncate(HEADER_LEN);
        }
        prop_assert_eq!(decode(&mut buf, MAX), Err(DecodeError::Reserved(kind)));
        prop_assert_eq!(FrameKind::from_u8(byte), Some(kind));
        prop_assert!(!kind.is_implemented());
    }

    #[test]
    fn hello_epoch_zero(h in hello_with(Just(0), 1..=u64::MAX)) {
        let mut buf = BytesMut::new();
        encode_hello(&mut buf, &h);
        expect_malformed(decode(&mut buf, MAX), FrameKind::Hello)?;
    }

    #[test]
    fn hello_session_zero(h in hello_with(1..=u64::MAX, Just(0))) {
        let mut buf = BytesMut::new();
        encode_hello(&mut buf, &h);
        expect_malformed(decode(&mut buf, MAX), FrameKind::Hello)?;
    }

    #[test]
    fn hello_wrong_length(
        h in hello(),
        len in prop_oneof![0..HELLO_BODY_LEN, HELLO_BODY_LEN + 1..HELLO_BODY_LEN + 16],
    ) {
        let mut v = encode_frame(&Frame::Hello(h));
        v.resize(HEADER_LEN + len, 0);
        v[4..8].copy_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
        expect_malformed(decode(&mut BytesMut::from(&v[..]), MAX), FrameKind::Hello)?;
    }

    /// Ranges that are not ascending and disjoint make the whole ack (or
    /// resume) malformed, wherever the bad entry sits.
    #[test]
    fn ack_ranges_not_ascending(
        resume in any::<bool>(),
        mut good in prop::collection::vec(entry(), 0..3),
        channel in any::<u16>(),
        cum in 1u64..(1 << 62),
        st in steps(2..=MAX_ACK_RANGES),
        b in breakage(),
        at in any::<Index>(),
        pos in any::<Index>(),
    ) {
        let mut ranges = ranges_from_steps(cum, &st);
        prop_assert_eq!(ranges.len(), st.len(), "no overflow in this range of values");
        break_ranges(cum, &mut ranges, b, at);
        good.insert(pos.index(good.len() + 1), EntrySpec { channel, cumulative: cum, ranges });
        let mut buf = BytesMut::new();
        write_ack(&mut buf, resume, 0, &good);
        let kind = if resume { FrameKind::Resume } else { FrameKind::Ack };
        expect_malformed(decode(&mut buf, MAX), kind)?;
    }

    /// Ack bodies whose counts disagree with their length, or that carry too
    /// many ranges in one entry.
    #[test]
    fn ack_bad_counts(
        kind in prop::sample::select(vec![FrameKind::Ack, FrameKind::Resume]),
        e in entry(),
        case in 0u8..5,
        trailing in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        let nranges = u16::try_from(e.ranges.len()).unwrap();
        let entry = (e.channel, e.cumulative, nranges, e.ranges.clone());
        let body = match case {
            // Body shorter than delay + count.
            0 => raw_ack_body(0, 0, &[])[..5].to_vec(),
            // More entries announced than present.
            1 => raw_ack_body(0, 2, std::slice::from_ref(&entry)),
            // More ranges announced than present.
            2 => raw_ack_body(0, 1, &[(e.channel, e.cumulative, nranges + 1, e.ranges.clone())]),
            // Trailing bytes after the last entry.
            3 => [raw_ack_body(0, 1, &[entry]), trailing].concat(),
            // More than MAX_ACK_RANGES ranges, all of them valid.
            _ => {
                let n = u16::try_from(MAX_ACK_RANGES + 1).unwrap();
                let ranges: Vec<(u64, u64)> =
                    (0..u64::from(n)).map(|i| (2 * i, 2 * i + 1)).collect();
                raw_ack_body(0, 1, &[(0, 0, n, ranges)])
            }
        };
        expect_malformed(decode(&mut raw_frame(kind as u8, 0, &body), MAX), kind)?;
    }

    #[test]
    fn close_reason_not_utf8(
        scope in 0u8..=1,
        code in any::<u16>(),
        prefix in "\\PC{0,40}",
        bad in invalid_utf8(),
        suffix in "\\PC{0,40}",
    ) {
        let reason = [prefix.as_bytes(), &bad, suffix.as_bytes()].concat();
        prop_assert!(std::str::from_utf8(&reason).is_err());
        prop_assert!(reason.len() <= MAX_CLOSE_REASON);
        let mut body = vec![scope];
        body.extend_from_slice(&code.to_be_bytes());
        body.extend_from_slice(&u16::try_from(reason.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&reason);
        let mut buf = raw_frame(FrameKind::Close as u8, 0, &body);
        expect_malformed(decode(&mut buf, MAX), FrameKind::Close)?;
    }

    /// Unknown scopes, reason lengths that disagree with the body, and reasons
    /// above the limit.
    #[test]
    fn close_bad_layout(
        scope in 2u8..=255,
        code in any::<u16>(),
        reason in "[a-z]{0,40}",
        delta in prop_oneof![-40i64..0, 1i64..40],
        short in 0usize..5,
    ) {
        let body = |scope: u8, n: usize, reason: &[u8]| {
            let mut b = vec![scope];
            b.extend_from_slice(&code.to_be_bytes());
            b.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
            b.extend_from_slice(reason);
            b
        };
        let malformed = |body: &[u8]| {
            let mut buf = raw_frame(FrameKind::Close as u8, 0, body);
            expect_malformed(decode(&mut buf, MAX), FrameKind::Close)
        };
        let r = reason.as_bytes();
        // Unknown scope.
        malformed(&body(scope, r.len(), r))?;
        // Announced reason length differs from the bytes present.
        if let Ok(wrong) = usize::try_from(i64::try_from(r.len()).unwrap() + delta) {
            malformed(&body(0, wrong, r))?;
        }
        // Body shorter than the fixed part.
        malformed(&body(0, 0, b"")[..short])?;
        // Consistent length but above the limit.
        let long = vec![b'x'; MAX_CLOSE_REASON + 1 + r.len()];
        malformed(&body(1, long.len(), &long))?;
    }

    #[test]
    fn data_body_too_short(
        flags in any::<u16>(),
        body in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let mut buf = raw_frame(FrameKind::Data as u8, flags, &body);
        expect_malformed(decode(&mut buf, MAX), FrameKind::Data)?;
    }

    /// BATCH bodies whose messages do not add up: no messages, a count
    /// above what the body holds, trailing bytes, a length running past the
    /// body, a non-minimal or overlong length, per-message flags, sequence
    /// numbers that overflow.
    #[test]
    fn batch_bad_layout(
        stream in any::<u16>(),
        first in 0u64..1000,
        messages in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..50), 1..10),
        extra in prop::collection::vec(any::<u8>(), 1..8),
        which in 0usize..7,
    ) {
        let mut msgs = BytesMut::new();
        for m in &messages {
            put_batched_message(&mut msgs, &[], m);
        }
        let body = |first: u64, count: u16, msgs: &[u8]| {
            let mut b = stream.to_be_bytes().to_vec();
            b.extend_from_slice(&first.to_be_bytes());
            b.extend_from_slice(&count.to_be_bytes());
            b.extend_from_slice(msgs);
            b
        };
        let n = u16::try_from(messages.len()).unwrap();
        let bad = match which {
            0 => body(first, 0, &[]),
            1 => body(first, n + 1, &msgs),
            2 => body(first, n, &[&msgs[..], &extra[..]].concat()),
            // The last message claims more bytes than remain.
            3 => {
                let mut m = msgs.to_vec();
                m.extend_from_slice(&[0, 0x7f]);
                body(first, n + 1, &m)
            }
            // A length in non-minimal form, or longer than a u64.
            4 => body(first, 1, &[0, 0x80, 0x00]),
            5 => body(first, 1, &[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
            _ => {
                let mut m = msgs.to_vec();
                m[0] = 1; // flags of the first message
                if which == 6 && first % 2 == 0 {
                    body(u64::MAX - 1, n + 1, &msgs) // also refused: overflow
                } else {
                    body(first, n, &m)
                }
            }
        };
        let mut buf = raw_frame(FrameKind::Batch as u8, 0, &bad);
        expect_malformed(decode(&mut buf, MAX), FrameKind::Batch)?;
    }

    #[test]
    fn ping_pong_wrong_length(
        kind in prop::sample::select(vec![FrameKind::Ping, FrameKind::Pong]),
        body in prop::collection::vec(any::<u8>(), 0..24)
            .prop_filter("not 8 bytes", |b| b.len() != 8),
    ) {
        expect_malformed(decode(&mut raw_frame(kind as u8, 0, &body), MAX), kind)?;
    }
}

// ---------------------------------------------------------------------------
// 5. decode_frame
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decode_frame_exact(s in spec()) {
        let f = decode_frame(Bytes::from(s.to_bytes()), MAX).unwrap();
        s.check(&f)?;
    }

    /// Anything after the frame (even a whole second frame) is refused.
    #[test]
    fn decode_frame_rejects_trailing_bytes(
        s in spec(),
        trailing in prop_oneof![
            prop::collection::vec(any::<u8>(), 1..32),
            spec().prop_map(|t| t.to_bytes()),
        ],
    ) {
        let bytes = [s.to_bytes(), trailing].concat();
        expect_malformed(decode_frame(Bytes::from(bytes), MAX), s.kind())?;
    }

    /// Every proper prefix of a frame is refused as short.
    #[test]
    fn decode_frame_rejects_short_buffers(s in spec(), cut in any::<Index>()) {
        let bytes = s.to_bytes();
        let cut = cut.index(bytes.len());
        let r = decode_frame(Bytes::copy_from_slice(&bytes[..cut]), MAX);
        // With the kind byte present the error names the kind; before that it
        // cannot, and any kind is acceptable.
        match r {
            Err(DecodeError::Malformed { kind, .. }) => {
                if cut >= 2 {
                    prop_assert_eq!(kind, s.kind());
                }
            }
            other => return Err(fail(format!("expected Malformed, got {other:?}"))),
        }
    }
}

#[test]
fn decode_frame_rejects_empty_buffer() {
    assert!(matches!(
        decode_frame(Bytes::new(), MAX),
        Err(DecodeError::Malformed { .. })
    ));
}
