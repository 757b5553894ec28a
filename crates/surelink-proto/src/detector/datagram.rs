//! Heartbeat and barrier datagrams (UDP, one per packet).
//!
//! Both use the stream's 8-byte frame header (version, kind, flags, body
//! length) so a packet capture reads the same way:
//!
//! | kind | body |
//! |---|---|
//! | HEARTBEAT (0x10) | cluster u64, node u64, epoch u64, seq u64 |
//! | BARRIER (0x11) | token u64, copy u16 |
//!
//! A barrier only ever travels from a process to itself.

use crate::ids::{ClusterId, Epoch, NodeId};
use crate::wire::{FrameKind, HEADER_LEN, PROTOCOL_VERSION};

/// Body length of a heartbeat.
const HEARTBEAT_BODY: usize = 32;
/// Body length of a barrier.
const BARRIER_BODY: usize = 10;
/// Bytes of the largest datagram (what a receive buffer needs).
pub const MAX_DATAGRAM: usize = HEADER_LEN + HEARTBEAT_BODY;

/// A decoded datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

fn header(kind: FrameKind, body: usize, out: &mut [u8]) {
    out[0] = PROTOCOL_VERSION;
    out[1] = kind as u8;
    out[2..4].copy_from_slice(&0u16.to_be_bytes());
    // Bodies here are a few dozen bytes.
    out[4..8].copy_from_slice(&u32::try_from(body).unwrap_or(u32::MAX).to_be_bytes());
}

/// Encodes a heartbeat.
pub fn encode_heartbeat(
    cluster: ClusterId,
    node: NodeId,
    epoch: Epoch,
    seq: u64,
) -> [u8; HEADER_LEN + HEARTBEAT_BODY] {
    let mut out = [0u8; HEADER_LEN + HEARTBEAT_BODY];
    header(FrameKind::Heartbeat, HEARTBEAT_BODY, &mut out);
    for (i, v) in [cluster.0, node.0, epoch.0, seq].into_iter().enumerate() {
        out[HEADER_LEN + 8 * i..HEADER_LEN + 8 * i + 8].copy_from_slice(&v.to_be_bytes());
    }
    out
}

/// Encodes a barrier.
pub fn encode_barrier(token: u64, copy: u16) -> [u8; HEADER_LEN + BARRIER_BODY] {
    let mut out = [0u8; HEADER_LEN + BARRIER_BODY];
    header(FrameKind::Barrier, BARRIER_BODY, &mut out);
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
    fn round_trip() {
        let hb = encode_heartbeat(ClusterId(1), NodeId(2), Epoch(3), 4);
        assert_eq!(
            decode_datagram(&hb),
            Ok(Datagram::Heartbeat {
                cluster: ClusterId(1),
                node: NodeId(2),
                epoch: Epoch(3),
                seq: 4
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
        let hb = encode_heartbeat(ClusterId(1), NodeId(2), Epoch(3), 4);
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
