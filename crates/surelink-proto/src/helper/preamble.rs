//! What a client says first on a connection to a helper, and the load a
//! helper answers with (12 bytes in, 16 bytes back, big-endian):
//!
//! | bytes | meaning |
//! |---|---|
//! | `SLR1` + server id (u64) | relay this connection to that server: everything after is the client's own byte stream to it |
//! | `SLRQ` + 8 bytes (ignored) | load query: the helper answers [`HelperLoad`] and closes |
//!
//! Neither is authenticated: a helper learns nothing it must trust from
//! them (the server authenticates the client end to end), and a load
//! answer only steers a client's choice among helpers it was given.

use crate::ids::NodeId;

/// Bytes of a preamble.
pub const PREAMBLE_LEN: usize = 12;
/// Bytes of a load answer.
pub const LOAD_LEN: usize = 16;

const RELAY: &[u8; 4] = b"SLR1";
const LOAD: &[u8; 4] = b"SLRQ";

/// A client's first bytes to a helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preamble {
    /// Relay this connection to `server`.
    Relay {
        /// The server.
        server: NodeId,
    },
    /// Tell me your load.
    LoadQuery,
}

/// A preamble this version does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a helper preamble (first bytes {0:02x?})")]
pub struct PreambleError(pub [u8; 4]);

impl Preamble {
    /// Its 12 bytes.
    pub fn encode(self) -> [u8; PREAMBLE_LEN] {
        let mut b = [0u8; PREAMBLE_LEN];
        match self {
            Preamble::Relay { server } => {
                b[..4].copy_from_slice(RELAY);
                b[4..].copy_from_slice(&server.0.to_be_bytes());
            }
            Preamble::LoadQuery => b[..4].copy_from_slice(LOAD),
        }
        b
    }

    /// Reads 12 bytes.
    pub fn decode(b: &[u8; PREAMBLE_LEN]) -> Result<Preamble, PreambleError> {
        let (magic, rest) = b.split_at(4);
        let mut m = [0u8; 4];
        m.copy_from_slice(magic);
        let mut id = [0u8; 8];
        id.copy_from_slice(rest);
        match &m {
            RELAY => Ok(Preamble::Relay {
                server: NodeId(u64::from_be_bytes(id)),
            }),
            LOAD => Ok(Preamble::LoadQuery),
            _ => Err(PreambleError(m)),
        }
    }
}

/// A helper's load as it answers a query: clients connected now, and
/// records relayed over the last second or so.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HelperLoad {
    /// Clients' connections open.
    pub clients: u64,
    /// Records relayed per second, lately.
    pub records_per_s: u64,
}

impl HelperLoad {
    /// Its 16 bytes.
    pub fn encode(self) -> [u8; LOAD_LEN] {
        let mut b = [0u8; LOAD_LEN];
        b[..8].copy_from_slice(&self.clients.to_be_bytes());
        b[8..].copy_from_slice(&self.records_per_s.to_be_bytes());
        b
    }

    /// Reads 16 bytes.
    pub fn decode(b: &[u8; LOAD_LEN]) -> HelperLoad {
        let mut c = [0u8; 8];
        let mut r = [0u8; 8];
        c.copy_from_slice(&b[..8]);
        r.copy_from_slice(&b[8..]);
        HelperLoad {
            clients: u64::from_be_bytes(c),
            records_per_s: u64::from_be_bytes(r),
        }
    }

    /// Lower is lighter: records relayed, then clients.
    pub fn rank(self) -> u64 {
        self.records_per_s
            .saturating_mul(16)
            .saturating_add(self.clients)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preambles_round_trip_and_others_are_refused() {
        for p in [
            Preamble::Relay { server: NodeId(7) },
            Preamble::Relay {
                server: NodeId(u64::MAX),
            },
            Preamble::LoadQuery,
        ] {
            assert_eq!(Preamble::decode(&p.encode()), Ok(p));
        }
        let mut b = Preamble::LoadQuery.encode();
        b[3] = b'X';
        assert_eq!(Preamble::decode(&b), Err(PreambleError(*b"SLRX")));
        assert!(Preamble::decode(b"GET / HTTP/1").is_err());
    }

    #[test]
    fn loads_round_trip_and_rank_by_records_first() {
        let l = HelperLoad {
            clients: 3,
            records_per_s: 9,
        };
        assert_eq!(HelperLoad::decode(&l.encode()), l);
        let busy = HelperLoad {
            clients: 1,
            records_per_s: 100,
        };
        let crowded = HelperLoad {
            clients: 1000,
            records_per_s: 10,
        };
        assert!(crowded.rank() < busy.rank());
    }
}
