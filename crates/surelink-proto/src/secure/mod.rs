//! Member authentication: who may open a path, and what protects the
//! bytes on it afterwards.
//!
//! Every path (one TCP connection) starts with a Noise XX handshake
//! ([`Handshake`]) in which both ends prove the static key the member list
//! ([`Members`]) gives their node; then every byte travels in AEAD records
//! ([`Sealer`], [`Opener`]) under keys fresh to that connection. The frames
//! the session layer exchanges (HELLO first) run inside, unchanged, and the
//! router only hears HELLOs from paths whose peer is authenticated: a HELLO
//! naming another node than the key proved is refused.
//!
//! A full Noise handshake also leaves both ends a [`Ticket`]: further
//! paths between the same two members resume with it ([`Dial`],
//! [`Accept`]; HMAC only, no public-key work), which matters when many
//! clients open paths to a hot server at once (through helpers).
//!
//! Pair keys ([`Keypair::pair_key`]) authenticate what does not run over a
//! path: the detector's heartbeat datagrams.
//!
//! For sites with a certificate authority, [`TlsHandshake`] proves the ends
//! with mutual TLS 1.3 instead (certificates naming
//! [`node_name`]`(cluster, node)`); the record layer after it is the same,
//! keyed from TLS's traffic secrets, and heartbeat keys come from each
//! connection's exported keying material.
//!
//! Not here: connection limits, handshake timeouts and the choice to run
//! without any of this (`insecure`) belong to the shell, which owns
//! sockets and clocks.

mod keys;
mod noise;
mod preamble;
mod record;
mod resume;
#[cfg(any(test, feature = "test-ca"))]
mod test_ca;
mod tls;

pub use keys::{KeyError, Keypair, MemberError, Members, PublicKey, SecretKey, KEY_LEN};
pub use noise::{Established, Handshake, NOISE_PARAMS};
pub use preamble::{Auth, PREAMBLE_LEN};
pub use record::{
    Opener, RecordCipher, RecordError, Sealer, MAX_RECORD, RECORD_HEADER, RECORD_TAG,
};
pub use resume::{Accept, Dial, MakeHandshake, Ticket, TicketLookup, TicketStore, TICKET_ID_LEN};
#[cfg(any(test, feature = "test-ca"))]
pub use test_ca::{Issued, TestCa};
pub use tls::{node_name, TlsHandshake, TlsSetup, TlsSetupError};

/// A path handshake of either kind, for callers that run whichever the
/// configuration chose.
#[derive(Debug)]
#[non_exhaustive]
pub enum PathHandshake {
    /// Noise XX with member keys.
    Noise(Box<Handshake>),
    /// Mutual TLS with certificates.
    Tls(Box<TlsHandshake>),
    /// Dialling with a ticket from an earlier Noise handshake (Noise XX on
    /// the same connection if the peer no longer knows it).
    Dial(Box<Dial>),
    /// Accepting Noise XX or a ticket.
    Accept(Box<Accept>),
}

impl PathHandshake {
    /// See [`Handshake::poll_transmit`].
    pub fn poll_transmit(&mut self, out: &mut bytes::BytesMut) -> bool {
        match self {
            PathHandshake::Noise(h) => h.poll_transmit(out),
            PathHandshake::Tls(h) => h.poll_transmit(out),
            PathHandshake::Dial(h) => h.poll_transmit(out),
            PathHandshake::Accept(h) => h.poll_transmit(out),
        }
    }

    /// Prefers `cipher` for the records (see [`Handshake::prefer_cipher`];
    /// with TLS the [`TlsSetup`]'s preference decides instead). Call before
    /// the first [`PathHandshake::poll_transmit`].
    pub fn prefer_cipher(&mut self, cipher: RecordCipher) {
        match self {
            PathHandshake::Noise(h) => h.prefer_cipher(cipher),
            PathHandshake::Tls(_) => {}
            PathHandshake::Dial(h) => h.prefer_cipher(cipher),
            PathHandshake::Accept(h) => h.prefer_cipher(cipher),
        }
    }

    /// See [`Handshake::handle_input`].
    pub fn handle_input(
        &mut self,
        buf: &mut bytes::BytesMut,
    ) -> Result<Option<Established>, SecureError> {
        match self {
            PathHandshake::Noise(h) => h.handle_input(buf),
            PathHandshake::Tls(h) => h.handle_input(buf),
            PathHandshake::Dial(h) => h.handle_input(buf),
            PathHandshake::Accept(h) => h.handle_input(buf),
        }
    }
}

use crate::ids::{ClusterId, NodeId};

/// Members with fresh keys, for this module's tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod test_nodes {
    use std::sync::Arc;

    use super::{Keypair, Members};
    use crate::ids::NodeId;

    pub(crate) struct Node {
        pub(crate) id: NodeId,
        pub(crate) keys: Keypair,
    }

    pub(crate) fn node(n: u64) -> Node {
        Node {
            id: NodeId(n),
            keys: Keypair::generate().unwrap(),
        }
    }

    pub(crate) fn members(ns: &[&Node]) -> Arc<Members> {
        let mut m = Members::new();
        for n in ns {
            m.insert(n.id, n.keys.public()).unwrap();
        }
        Arc::new(m)
    }
}

/// Runs an initiator and a responder to completion (or the first error
/// of either), moving bytes between them; what the initiator sent that
/// the responder left comes back too. The one driver of this module's
/// tests.
#[cfg(test)]
pub(crate) fn run_both(
    mut i: PathHandshake,
    mut r: PathHandshake,
) -> (
    Result<Established, SecureError>,
    Result<Established, SecureError>,
    bytes::BytesMut,
) {
    let (mut to_r, mut to_i) = (bytes::BytesMut::new(), bytes::BytesMut::new());
    let (mut ie, mut re) = (None, None);
    for _ in 0..8 {
        i.poll_transmit(&mut to_r);
        if re.is_none() {
            re = r.handle_input(&mut to_r).transpose();
        }
        r.poll_transmit(&mut to_i);
        if ie.is_none() {
            ie = i.handle_input(&mut to_i).transpose();
        }
        if let (Some(Err(_)), _) | (_, Some(Err(_))) | (Some(_), Some(_)) = (&ie, &re) {
            break;
        }
    }
    (
        ie.unwrap_or(Err(SecureError::Malformed("unfinished"))),
        re.unwrap_or(Err(SecureError::Malformed("unfinished"))),
        to_r,
    )
}

/// What the record layer does to frames after the handshake. Both ends of
/// a path must agree (the handshake checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protection {
    /// Authenticated and encrypted (AES-256-GCM or ChaCha20-Poly1305: see
    /// [`RecordCipher`]). The default.
    #[default]
    Encrypt,
    /// Authenticated only (GMAC over the plaintext): on-path observers can
    /// read messages but not alter, inject or replay them.
    IntegrityOnly,
}

impl Protection {
    fn code(self) -> u8 {
        match self {
            Protection::Encrypt => 1,
            Protection::IntegrityOnly => 2,
        }
    }

    fn from_code(c: u8) -> Option<Protection> {
        match c {
            1 => Some(Protection::Encrypt),
            2 => Some(Protection::IntegrityOnly),
            _ => None,
        }
    }
}

impl std::fmt::Display for Protection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protection::Encrypt => "encrypt",
            Protection::IntegrityOnly => "integrity_only",
        })
    }
}

/// Why a path handshake failed. The transport must be closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecureError {
    /// The peer's first bytes are not surelink's secure preamble: it runs
    /// with `insecure = true`, or is not surelink at all.
    #[error("the peer did not start an authenticated handshake (does it run with insecure = true, or is it not surelink?)")]
    NotSecure,
    /// The peer speaks another version of the handshake.
    #[error("the peer speaks handshake version {0}; this build speaks 1")]
    Version(u8),
    /// The peer belongs to another cluster.
    #[error("the peer is in cluster {theirs}, this node in cluster {ours}")]
    WrongCluster {
        /// Ours.
        ours: ClusterId,
        /// Theirs.
        theirs: ClusterId,
    },
    /// The peer authenticates differently (member keys against
    /// certificates).
    #[error("the peer authenticates with {theirs}, this node with {ours}; configure the same on every node")]
    AuthMismatch {
        /// Ours.
        ours: Auth,
        /// Theirs.
        theirs: Auth,
    },
    /// Mutual TLS refused the peer (bad or untrusted certificate, wrong
    /// name, protocol error), in rustls's words.
    #[error("TLS: {0}")]
    Tls(String),
    /// The peer protects records differently.
    #[error("the peer uses protection {theirs}, this node {ours}; set the same on every node")]
    ProtectionMismatch {
        /// Ours.
        ours: Protection,
        /// Theirs.
        theirs: Protection,
    },
    /// The two ends offer no record cipher in common (one bit per
    /// [`RecordCipher`] code each): a build that knows other ciphers only.
    #[error("no record cipher in common (dialler offers {initiator:#06b}, acceptor {responder:#06b}); this build offers aes-256-gcm and chacha20-poly1305")]
    NoCommonCipher {
        /// The dialling side's offers.
        initiator: u8,
        /// The accepting side's offers.
        responder: u8,
    },
    /// The connecting peer's key is not in the member list.
    #[error("the peer's key {0} is not in the member list")]
    UnknownKey(PublicKey),
    /// The dialled address answered with another key than the dialled
    /// node's: a wrong address book, or someone impersonating it.
    #[error("dialled node {expected} but the peer proved {}", .got.map_or("a key not in the member list".to_string(), |n| format!("node {n}'s key")))]
    WrongKey {
        /// The node dialled.
        expected: NodeId,
        /// The member whose key the peer proved, if any.
        got: Option<NodeId>,
    },
    /// Dialling a node the member list has no key for.
    #[error("no public key for node {0} in the member list")]
    NoKeyFor(NodeId),
    /// A handshake message failed to decrypt or verify: altered in flight,
    /// or the peer does not hold the key it claims.
    #[error("handshake message failed authentication")]
    Failed,
    /// A handshake message is not well formed.
    #[error("malformed handshake: {0}")]
    Malformed(&'static str),
    /// The Noise library refused (cannot happen with valid keys).
    #[error("noise: {0}")]
    Noise(String),
}
