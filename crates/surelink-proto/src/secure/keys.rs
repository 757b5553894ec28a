//! Node keys and the member list: who may join the cluster, by public key.
//!
//! Keys are X25519 (Curve25519), written as 44-character base64 strings
//! like WireGuard's. A node's identity is its key pair; the member list
//! maps node ids to public keys, one key per node and one node per key, so
//! an authenticated key names exactly one node.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rustc_hash::FxHashMap as HashMap;
use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};

use crate::ids::{ClusterId, NodeId};

/// Length of a key in bytes.
pub const KEY_LEN: usize = 32;

/// A node's public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; KEY_LEN]);

/// A node's secret key. Its `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey([u8; KEY_LEN]);

/// A key pair: this node's identity.
#[derive(Clone, PartialEq, Eq)]
pub struct Keypair {
    secret: SecretKey,
    public: PublicKey,
}

/// A key that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not base64.
    #[error("a key is 44 characters of base64 (as `surelink keygen` prints); this is not base64")]
    NotBase64,
    /// Decoded to the wrong number of bytes.
    #[error("a key is 32 bytes; this one decodes to {0}")]
    Length(usize),
    /// The system's random number generator failed.
    #[error("the system random number generator failed")]
    Rng,
}

fn x25519() -> Box<dyn snow::types::Dh> {
    // The default resolver always provides Curve25519 (feature use-curve25519).
    #[allow(clippy::expect_used)]
    DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .expect("snow's default resolver has Curve25519")
}

impl Keypair {
    /// A fresh key pair from the operating system's random source.
    pub fn generate() -> Result<Keypair, KeyError> {
        let mut secret = [0u8; KEY_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| KeyError::Rng)?;
        Ok(Keypair::from_secret(SecretKey(secret)))
    }

    /// The key pair of a secret key.
    pub fn from_secret(secret: SecretKey) -> Keypair {
        let mut dh = x25519();
        dh.set(&secret.0);
        let mut public = [0u8; KEY_LEN];
        public.copy_from_slice(dh.pubkey());
        Keypair {
            secret,
            public: PublicKey(public),
        }
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The secret half.
    pub fn secret(&self) -> &SecretKey {
        &self.secret
    }

    /// A key only this node and `peer` can compute (static-static X25519,
    /// then HKDF-SHA256 bound to the cluster, both node ids and `purpose`).
    /// Heartbeats use it: they are authenticated from configuration alone,
    /// without a handshake per datagram. `None` if the peer's key is a
    /// low-order point (the shared secret would be all zeros).
    pub fn pair_key(
        &self,
        cluster: ClusterId,
        us: NodeId,
        peer: NodeId,
        peer_key: &PublicKey,
        purpose: &[u8],
    ) -> Option<[u8; KEY_LEN]> {
        let mut dh = x25519();
        dh.set(&self.secret.0);
        let mut shared = [0u8; KEY_LEN];
        dh.dh(&peer_key.0, &mut shared).ok()?;
        if shared == [0u8; KEY_LEN] {
            return None;
        }
        // Both ends derive the same key: order the node ids.
        let (lo, hi) = if us < peer { (us, peer) } else { (peer, us) };
        let mut info = Vec::with_capacity(purpose.len() + 24);
        info.extend_from_slice(purpose);
        info.extend_from_slice(&cluster.0.to_be_bytes());
        info.extend_from_slice(&lo.0.to_be_bytes());
        info.extend_from_slice(&hi.0.to_be_bytes());
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"surelink pair key v1");
        let prk = salt.extract(&shared);
        let info = [info.as_slice()];
        let okm = prk.expand(&info, ring::hkdf::HKDF_SHA256).ok()?;
        let mut out = [0u8; KEY_LEN];
        okm.fill(&mut out).ok()?;
        Some(out)
    }
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keypair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl SecretKey {
    /// A secret key from raw bytes (any 32 bytes are a valid X25519 key).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> SecretKey {
        SecretKey(bytes)
    }

    /// The raw bytes (for writing a key file).
    pub fn to_bytes(&self) -> [u8; KEY_LEN] {
        self.0
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

/// Prints as base64 (what the key file and `FromStr` take).
impl fmt::Display for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&B64.encode(self.0))
    }
}

fn decode(s: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let v = B64.decode(s.trim()).map_err(|_| KeyError::NotBase64)?;
    v.as_slice()
        .try_into()
        .map_err(|_| KeyError::Length(v.len()))
}

impl FromStr for SecretKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode(s).map(SecretKey)
    }
}

impl FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode(s).map(PublicKey)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&B64.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// Why a member could not be added.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemberError {
    /// Node id 0 is reserved.
    #[error("node id 0 is reserved")]
    NodeZero,
    /// The node is listed twice with different keys.
    #[error("node {0} is listed twice with different keys")]
    NodeTwice(NodeId),
    /// Two nodes share a key: an authenticated key must name one node.
    #[error(
        "nodes {0} and {1} have the same public key; every node needs its own (surelink keygen)"
    )]
    SharedKey(NodeId, NodeId),
}

/// The cluster's members: which public key each node proves in the
/// handshake. A connection whose key is not listed allocates nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    by_node: HashMap<NodeId, PublicKey>,
    by_key: HashMap<PublicKey, NodeId>,
}

impl Members {
    /// No members.
    pub fn new() -> Members {
        Members::default()
    }

    /// Adds `node` with `key`.
    pub fn insert(&mut self, node: NodeId, key: PublicKey) -> Result<(), MemberError> {
        if node == NodeId(0) {
            return Err(MemberError::NodeZero);
        }
        if let Some(&other) = self.by_key.get(&key) {
            if other != node {
                return Err(MemberError::SharedKey(other.min(node), other.max(node)));
            }
        }
        if let Some(old) = self.by_node.get(&node) {
            if *old != key {
                return Err(MemberError::NodeTwice(node));
            }
        }
        self.by_node.insert(node, key);
        self.by_key.insert(key, node);
        Ok(())
    }

    /// The node that holds `key`.
    pub fn node_of(&self, key: &PublicKey) -> Option<NodeId> {
        self.by_key.get(key).copied()
    }

    /// The key of `node`.
    pub fn key_of(&self, node: NodeId) -> Option<&PublicKey> {
        self.by_node.get(&node)
    }

    /// Members, in node order.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, PublicKey)> + '_ {
        let mut v: Vec<_> = self.by_node.iter().map(|(&n, &k)| (n, k)).collect();
        v.sort_unstable_by_key(|&(n, _)| n);
        v.into_iter()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.by_node.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_text() {
        let k = Keypair::generate().unwrap();
        let s = k.secret().to_string();
        assert_eq!(s.len(), 44);
        let back = Keypair::from_secret(s.parse().unwrap());
        assert_eq!(back.public(), k.public());
        let p: PublicKey = k.public().to_string().parse().unwrap();
        assert_eq!(p, k.public());
        assert_eq!("not base64!".parse::<PublicKey>(), Err(KeyError::NotBase64));
        assert_eq!("AAAA".parse::<PublicKey>(), Err(KeyError::Length(3)));
        assert!(
            !format!("{k:?}").contains(&s),
            "Debug must not print the secret"
        );
    }

    #[test]
    fn pair_keys_agree_and_differ_per_pair_and_purpose() {
        let (a, b, c) = (
            Keypair::generate().unwrap(),
            Keypair::generate().unwrap(),
            Keypair::generate().unwrap(),
        );
        let cl = ClusterId(3);
        let ab = a
            .pair_key(cl, NodeId(1), NodeId(2), &b.public(), b"hb")
            .unwrap();
        let ba = b
            .pair_key(cl, NodeId(2), NodeId(1), &a.public(), b"hb")
            .unwrap();
        assert_eq!(ab, ba);
        let ac = a
            .pair_key(cl, NodeId(1), NodeId(3), &c.public(), b"hb")
            .unwrap();
        assert_ne!(ab, ac);
        let other = a
            .pair_key(cl, NodeId(1), NodeId(2), &b.public(), b"x")
            .unwrap();
        assert_ne!(ab, other);
        let other_cluster = a.pair_key(ClusterId(4), NodeId(1), NodeId(2), &b.public(), b"hb");
        assert_ne!(Some(ab), other_cluster);
        // The all-zero point gives an all-zero secret: refused.
        assert_eq!(
            a.pair_key(cl, NodeId(1), NodeId(2), &PublicKey([0; 32]), b"hb"),
            None
        );
    }

    #[test]
    fn members_name_one_node_per_key() {
        let (a, b) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
        let mut m = Members::new();
        m.insert(NodeId(1), a.public()).unwrap();
        m.insert(NodeId(1), a.public()).unwrap();
        assert_eq!(m.insert(NodeId(0), b.public()), Err(MemberError::NodeZero));
        assert_eq!(
            m.insert(NodeId(2), a.public()),
            Err(MemberError::SharedKey(NodeId(1), NodeId(2)))
        );
        assert_eq!(
            m.insert(NodeId(1), b.public()),
            Err(MemberError::NodeTwice(NodeId(1)))
        );
        m.insert(NodeId(2), b.public()).unwrap();
        assert_eq!(m.node_of(&b.public()), Some(NodeId(2)));
        assert_eq!(m.key_of(NodeId(1)), Some(&a.public()));
        assert_eq!(m.len(), 2);
    }
}
