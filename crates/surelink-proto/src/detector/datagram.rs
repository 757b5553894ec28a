//! Heartbeat and barrier datagrams (UDP, one per packet).
//!
//! Both use the stream's 8-byte frame header (version, kind, flags, body
//! length) so a packet capture reads the same way:
//!
//! | kind | body |
//! |---|---|
//! | HEARTBEAT (0x10) | cluster u64, node u64, epoch u64, seq u64, port u16, tag 16 B |
//! | BARRIER (0x11) | token u64, copy u16 |
//!
//! `port` is the sender's *private* heartbeat port for the receiver on this
//! network (0: none yet): the receiver's heartbeats to the sender go there
//! from then on, to a socket that takes datagrams from the receiver's
//! address only and whose number a stranger off the path never sees (see
//! the monitor's "Private queues").
//!
//! A heartbeat's header flags carry the private ports' handshake, per
//! path: [`FLAG_ACK`] ("your private copies reach me") and
//! [`FLAG_COMMITTED`] ("my fence counts the copy to your private port
//! alone"). A sender commits only while its peer acknowledges, so a relay
//! or NAT that forwards the public port only never leaves a path counted
//! on copies that cannot arrive; a receiver treats a path as private only
//! on a committed heartbeat out of its private queue.
//!
//! Two more flags carry the pace (see [`super::Pacer`]), per pair:
//! [`FLAG_FAST`] ("I send you heartbeats every `interval` now: watch my
//! paths with the short window") and [`FLAG_WATCH`] ("I have traffic in
//! flight with you: send me yours fast"). They are under the tag, so a
//! stranger cannot make a pair slow (or fast).
//!
//! The tag is HMAC-SHA256 (first 16 bytes) over header (flags included) and the first 34
//! body bytes, keyed per pair of nodes ([`HeartbeatKey`], from the
//! members' static keys), so a heartbeat proves its sender without a
//! handshake; all zeros when the endpoints run insecure. [`Freshness`]
//! refuses replays: per peer and network, (epoch, seq) must grow.
//!
//! A barrier only ever travels from a process to itself (its token is
//! random, its source checked by the shell).

use crate::ids::{ClusterId, Epoch, NodeId};
use crate::wire::{FrameKind, HEADER_LEN, PROTOCOL_VERSION};

/// Body length of a heartbeat: four u64, the port and the tag.
const HEARTBEAT_BODY: usize = 34 + TAG_LEN;
/// Bytes of a heartbeat's tag.
const TAG_LEN: usize = 16;
/// What the tag covers: header, the four u64 and the port.
const SIGNED: usize = HEADER_LEN + 34;
/// Body length of a barrier.
const BARRIER_BODY: usize = 10;
/// Bytes of the largest datagram (what a receive buffer needs).
pub const MAX_DATAGRAM: usize = HEADER_LEN + HEARTBEAT_BODY;
/// Heartbeat flag: the sender's private socket for the receiver gets the
/// receiver's heartbeats (of its current incarnation, lately).
pub const FLAG_ACK: u16 = 1;
/// Heartbeat flag: this heartbeat's copy to the receiver's private port is
/// the one the sender's fence counted (the copy to the public port, if
/// any, is an extra).
pub const FLAG_COMMITTED: u16 = 2;
/// Heartbeat flag: the sender sends the receiver a heartbeat every
/// `interval` (busy pace) until one without this flag says otherwise.
pub const FLAG_FAST: u16 = 4;
/// Heartbeat flag: the sender has traffic in flight with the receiver and
/// asks for heartbeats at the busy pace.
pub const FLAG_WATCH: u16 = 8;
/// Heartbeat flag (with `FAST`): this path carries none of the sender's
/// data now, so its busy-pace copies come only every `standby_interval()`;
/// watch it with `standby_path_timeout()`. A path that carries data needs no
/// more: its data is heard.
pub const FLAG_STANDBY: u16 = 16;
/// Heartbeat flag (without `FAST`): the pair is slow — the sender's fence
/// heartbeats come only in one round of `slow_factor` until one without
/// this flag says otherwise; watch its paths with `slow_path_timeout()` and
/// the peer with `slow_timeout()`.
pub const FLAG_SLOW: u16 = 32;
/// Heartbeat flags (three bits; with `FAST`): the sender's busy copies on
/// this path come every `interval × 2^shift` (a crowded sender, see the
/// Pacer's "A crowd of busy peers"); 0: every `interval`. Read with
/// [`pace_shift`].
pub const PACE_SHIFT_MASK: u16 = 0b111 << 6;
/// Heartbeat flags (three bits): the sender is crowded and asks for our
/// busy copies no more often than every `interval × 2^shift`. Read with
/// [`ask_shift`].
pub const ASK_SHIFT_MASK: u16 = 0b111 << 9;

/// The pace shift a heartbeat's flags announce ([`PACE_SHIFT_MASK`]).
pub fn pace_shift(flags: u16) -> u8 {
    ((flags & PACE_SHIFT_MASK) >> 6) as u8
}

/// The ask shift a heartbeat's flags carry ([`ASK_SHIFT_MASK`]).
pub fn ask_shift(flags: u16) -> u8 {
    ((flags & ASK_SHIFT_MASK) >> 9) as u8
}

/// Flags carrying a pace and an ask shift (each 0 to 7; larger ones are
/// taken as 7).
pub fn shift_flags(pace: u8, ask: u8) -> u16 {
    (u16::from(pace.min(7)) << 6) | (u16::from(ask.min(7)) << 9)
}

/// A decoded datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Datagram {
    /// A peer's heartbeat.
    Heartbeat {
        /// The sender's cluster.
        cluster: ClusterId,
        /// The sender.
        node: NodeId,
        /// The sender's incarnation.
        epoch: Epoch,
        /// Its number in the sender's schedule.
        seq: u64,
        /// The sender's private heartbeat port for us on this network (0:
        /// none; send to its public port).
        port: u16,
        /// [`FLAG_ACK`], [`FLAG_COMMITTED`], [`FLAG_FAST`], [`FLAG_WATCH`]
        /// (others ignored).
        flags: u16,
    },
    /// One of our own barriers.
    Barrier {
        /// The round.
        token: u64,
        /// Which copy (one per CPU).
        copy: u16,
    },
}

/// Why a datagram was not understood. Not fatal: the packet is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// Shorter than its header says, or than the kind needs.
    #[error("datagram of {len} bytes is truncated")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// A protocol version this build does not speak.
    #[error("datagram of protocol version {0}")]
    Version(u8),
    /// Not a heartbeat or a barrier.
    #[error("datagram of kind {0:#04x} is not a heartbeat or barrier")]
    Kind(u8),
}

fn header(kind: FrameKind, flags: u16, body: usize, out: &mut [u8]) {
    out[0] = PROTOCOL_VERSION;
    out[1] = kind as u8;
    out[2..4].copy_from_slice(&flags.to_be_bytes());
    // Bodies here are a few dozen bytes.
    out[4..8].copy_from_slice(&u32::try_from(body).unwrap_or(u32::MAX).to_be_bytes());
}

/// The key that authenticates heartbeats between two nodes (both derive
/// it: see `secure::Keypair::pair_key`).
#[derive(Clone)]
pub struct HeartbeatKey(ring::hmac::Key);

impl HeartbeatKey {
    /// Purpose string for `Keypair::pair_key`.
    pub const PURPOSE: &'static [u8] = b"surelink heartbeat v1";

    /// A key from 32 bytes of pair key.
    pub fn new(bytes: &[u8; 32]) -> HeartbeatKey {
        HeartbeatKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes))
    }

    fn tag(&self, signed: &[u8]) -> [u8; TAG_LEN] {
        let t = ring::hmac::sign(&self.0, signed);
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&t.as_ref()[..TAG_LEN]);
        out
    }
}

impl std::fmt::Debug for HeartbeatKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeartbeatKey(..)")
    }
}

/// Encodes a heartbeat, tagged with `key` (zeros without one: insecure).
pub fn encode_heartbeat(
    cluster: ClusterId,
    node: NodeId,
    epoch: Epoch,
    seq: u64,
    port: u16,
    flags: u16,
    key: Option<&HeartbeatKey>,
) -> [u8; HEADER_LEN + HEARTBEAT_BODY] {
    let mut out = [0u8; HEADER_LEN + HEARTBEAT_BODY];
    header(FrameKind::Heartbeat, flags, HEARTBEAT_BODY, &mut out);
    for (i, v) in [cluster.0, node.0, epoch.0, seq].into_iter().enumerate() {
        out[HEADER_LEN + 8 * i..HEADER_LEN + 8 * i + 8].copy_from_slice(&v.to_be_bytes());
    }
    out[HEADER_LEN + 32..SIGNED].copy_from_slice(&port.to_be_bytes());
    if let Some(k) = key {
        let tag = k.tag(&out[..SIGNED]);
        out[SIGNED..].copy_from_slice(&tag);
    }
    out
}

/// Whether heartbeat datagram `b` carries a valid tag under `key`
/// (compared in constant time).
pub fn verify_heartbeat(b: &[u8], key: &HeartbeatKey) -> bool {
    if b.len() < SIGNED + TAG_LEN {
        return false;
    }
    let want = key.tag(&b[..SIGNED]);
    let diff = want
        .iter()
        .zip(&b[SIGNED..SIGNED + TAG_LEN])
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    diff == 0
}

/// Replay protection for heartbeats: per (peer, network) the newest
/// (epoch, seq) accepted; anything not newer is refused. Heartbeats
/// reordered in flight are dropped too, which costs nothing (the next one
/// is 10 ms away). Bounded by the members × networks it is fed.
#[derive(Debug, Default)]
pub struct Freshness {
    newest: rustc_hash::FxHashMap<(NodeId, u16), (Epoch, u64)>,
}

impl Freshness {
    /// Accepts (and records) `(epoch, seq)` from `node` on `network` if it
    /// is newer than anything accepted before.
    pub fn accept(&mut self, node: NodeId, network: u16, epoch: Epoch, seq: u64) -> bool {
        match self.newest.get_mut(&(node, network)) {
            Some(n) if *n >= (epoch, seq) => false,
            Some(n) => {
                *n = (epoch, seq);
                true
            }
            None => {
                self.newest.insert((node, network), (epoch, seq));
                true
            }
        }
    }

    /// Whether `(epoch, seq)` is exactly the newest accepted from `node`
    /// on `network`: a second copy of the same heartbeat (a sender with a
    /// private port for us sends some heartbeats twice), not news.
    pub fn is_newest(&self, node: NodeId, network: u16, epoch: Epoch, seq: u64) -> bool {
        self.newest.get(&(node, network)) == Some(&(epoch, seq))
    }

    /// Forgets a node (it left the cluster).
    pub fn forget(&mut self, node: NodeId) {
        self.newest.retain(|(n, _), _| *n != node);
    }
}

/// Encodes a barrier.
pub fn encode_barrier(token: u64, copy: u16) -> [u8; HEADER_LEN + BARRIER_BODY] {
    let mut out = [0u8; HEADER_LEN + BARRIER_BODY];
    header(FrameKind::Barrier, 0, BARRIER_BODY, &mut out);
    out[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&token.to_be_bytes());
    out[HEADER_LEN + 8..].copy_from_slice(&copy.to_be_bytes());
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Decodes one datagram.
pub fn decode_datagram(b: &[u8]) -> Result<Datagram, DatagramError> {
    let truncated = DatagramError::Truncated { len: b.len() };
    if b.len() < HEADER_LEN {
        return Err(truncated);
    }
    if b[0] != PROTOCOL_VERSION {
        return Err(DatagramError::Version(b[0]));
    }
    let body = &b[HEADER_LEN..];
    match FrameKind::from_u8(b[1]) {
        Some(FrameKind::Heartbeat) if body.len() >= HEARTBEAT_BODY => Ok(Datagram::Heartbeat {
            cluster: ClusterId(u64_at(body, 0)),
            node: NodeId(u64_at(body, 8)),
            epoch: Epoch(u64_at(body, 16)),
            seq: u64_at(body, 24),
            port: u16::from_be_bytes([body[32], body[33]]),
            flags: u16::from_be_bytes([b[2], b[3]]),
        }),
        Some(FrameKind::Barrier) if body.len() >= BARRIER_BODY => Ok(Datagram::Barrier {
            token: u64_at(body, 0),
            copy: u16::from_be_bytes([body[8], body[9]]),
        }),
        Some(FrameKind::Heartbeat | FrameKind::Barrier) => Err(truncated),
        _ => Err(DatagramError::Kind(b[1])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_verify_only_under_the_pair_key_and_replays_are_refused() {
        let k = HeartbeatKey::new(&[1; 32]);
        let other = HeartbeatKey::new(&[2; 32]);
        let hb = encode_heartbeat(ClusterId(1), NodeId(2), Epoch(3), 4, 0, FLAG_ACK, Some(&k));
        assert!(verify_heartbeat(&hb, &k));
        assert!(!verify_heartbeat(&hb, &other));
        let plain = encode_heartbeat(
            ClusterId(1),
            NodeId(2),
            Epoch(3),
            4,
            5,
            FLAG_COMMITTED,
            None,
        );
        assert!(!verify_heartbeat(&plain, &k));
        for i in 0..hb.len() {
            let mut bad = hb;
            bad[i] ^= 1;
            assert!(
                !verify_heartbeat(&bad, &k),
                "byte {i} altered still verifies"
            );
        }
        assert!(!verify_heartbeat(&hb[..hb.len() - 1], &k));
        let mut f = Freshness::default();
        assert!(f.accept(NodeId(2), 0, Epoch(3), 4));
        assert!(!f.accept(NodeId(2), 0, Epoch(3), 4), "replay");
        assert!(f.is_newest(NodeId(2), 0, Epoch(3), 4), "a second copy");
        assert!(!f.is_newest(NodeId(2), 0, Epoch(3), 3));
        assert!(!f.accept(NodeId(2), 0, Epoch(3), 3), "older");
        assert!(f.accept(NodeId(2), 1, Epoch(3), 4), "other network");
        assert!(f.accept(NodeId(2), 0, Epoch(4), 0), "new incarnation");
        assert!(!f.accept(NodeId(2), 0, Epoch(3), 99), "old incarnation");
        f.forget(NodeId(2));
        assert!(f.accept(NodeId(2), 0, Epoch(3), 4));
    }

    #[test]
    fn round_trip() {
        let hb = encode_heartbeat(
            ClusterId(1),
            NodeId(2),
            Epoch(3),
            4,
            5,
            FLAG_COMMITTED,
            None,
        );
        assert_eq!(
            decode_datagram(&hb),
            Ok(Datagram::Heartbeat {
                cluster: ClusterId(1),
                node: NodeId(2),
                epoch: Epoch(3),
                seq: 4,
                port: 5,
                flags: FLAG_COMMITTED,
            })
        );
        let b = encode_barrier(9, 1);
        assert_eq!(
            decode_datagram(&b),
            Ok(Datagram::Barrier { token: 9, copy: 1 })
        );
    }

    #[test]
    fn garbage_is_a_typed_error_never_a_panic() {
        let hb = encode_heartbeat(
            ClusterId(1),
            NodeId(2),
            Epoch(3),
            4,
            5,
            FLAG_COMMITTED,
            None,
        );
        for cut in 0..hb.len() {
            assert!(decode_datagram(&hb[..cut]).is_err());
        }
        let mut bad = hb;
        bad[0] = 9;
        assert_eq!(decode_datagram(&bad), Err(DatagramError::Version(9)));
        bad[0] = PROTOCOL_VERSION;
        bad[1] = 0x03;
        assert_eq!(decode_datagram(&bad), Err(DatagramError::Kind(0x03)));
    }
}
