//! The path handshake: Noise XX over one transport, before any frame.
//!
//! ```text
//! both  -> preamble (see `preamble`, auth = Noise)
//! I -> R: [len u16] e
//! R -> I: [len u16] e, ee, s, es      I checks: s is the dialled node's key
//! I -> R: [len u16] s, se             R checks: s is some member's key
//! then records both ways (see `record`)
//! ```
//!
//! XX rather than IK: the responder learns who dials only from message 3,
//! whose proof is fresh (it answers the responder's own ephemeral key), so
//! a replayed first message gets a responder nowhere and nothing is
//! allocated for it beyond this state. The preamble makes mismatches
//! (another cluster, an insecure peer, another protection mode) name
//! themselves instead of failing as "bad MAC". Each side checks the
//! peer's preamble against its own values and uses its own as the Noise
//! prologue, so both have agreed on cluster and protection before a key
//! is trusted.

use bytes::{BufMut, BytesMut};

use super::keys::{Keypair, Members, PublicKey, KEY_LEN};
use super::preamble::{self, Auth, PREAMBLE_LEN};
use super::record::{Opener, Sealer};
use super::{Protection, SecureError};
use crate::ids::{ClusterId, NodeId};

/// The Noise protocol name. AES-GCM: the record layer uses AES-256-GCM,
/// which has hardware support where clusters run.
pub const NOISE_PARAMS: &str = "Noise_XX_25519_AESGCM_SHA256";
/// Longest handshake message we accept (XX's are 32, 96 and 64 bytes).
const MAX_MESSAGE: usize = 256;

/// A finished handshake: who the peer proved to be, and the record layer
/// for each direction.
#[derive(Debug)]
pub struct Established {
    /// The authenticated peer.
    pub peer: NodeId,
    /// Seals what we send.
    pub sealer: Sealer,
    /// Opens what we receive.
    pub opener: Opener,
    /// Mutual TLS: 32 bytes of keying material exported from this
    /// connection (label `EXPORTER-surelink-heartbeat`), the same at both
    /// ends; `None` with Noise, whose heartbeat keys come from the members'
    /// static keys.
    pub exporter: Option<[u8; 32]>,
    /// Noise: the ticket this handshake minted, for resuming further
    /// paths with the same peer without public-key work (see `resume`).
    /// `None` after mutual TLS or a resumption.
    pub ticket: Option<super::resume::Ticket>,
}

enum Step {
    /// Initiator: waiting for message 2. Responder: waiting for message 1.
    First,
    /// Responder: waiting for message 3.
    Third,
    Done,
}

/// One side of a path handshake (sans-IO: feed it bytes, send what it
/// writes). See the module docs.
pub struct Handshake {
    noise: snow::HandshakeState,
    initiator: bool,
    /// Initiator: the node dialled.
    expected: Option<NodeId>,
    members: std::sync::Arc<Members>,
    cluster: ClusterId,
    protection: Protection,
    got_preamble: bool,
    step: Step,
    out: BytesMut,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("initiator", &self.initiator)
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// The dialling side, reaching `peer`.
    pub fn initiator(
        keys: &Keypair,
        members: std::sync::Arc<Members>,
        cluster: ClusterId,
        protection: Protection,
        peer: NodeId,
    ) -> Result<Handshake, SecureError> {
        if members.key_of(peer).is_none() {
            return Err(SecureError::NoKeyFor(peer));
        }
        let mut h = Handshake::new(keys, members, cluster, protection, true, Some(peer))?;
        // Message 1 goes out with the preamble.
        h.write_message()?;
        Ok(h)
    }

    /// The accepting side.
    pub fn responder(
        keys: &Keypair,
        members: std::sync::Arc<Members>,
        cluster: ClusterId,
        protection: Protection,
    ) -> Result<Handshake, SecureError> {
        Handshake::new(keys, members, cluster, protection, false, None)
    }

    fn new(
        keys: &Keypair,
        members: std::sync::Arc<Members>,
        cluster: ClusterId,
        protection: Protection,
        initiator: bool,
        expected: Option<NodeId>,
    ) -> Result<Handshake, SecureError> {
        let pre = preamble::encode(cluster, protection, Auth::Noise);
        let params = NOISE_PARAMS
            .parse()
            .map_err(|e| SecureError::Noise(format!("{e}")))?;
        let secret = keys.secret().to_bytes();
        let b = snow::Builder::new(params)
            .local_private_key(&secret)
            .and_then(|b| b.prologue(&pre))
            .map_err(|e| SecureError::Noise(format!("{e}")))?;
        let noise = if initiator {
            b.build_initiator()
        } else {
            b.build_responder()
        }
        .map_err(|e| SecureError::Noise(format!("{e}")))?;
        let mut out = BytesMut::with_capacity(PREAMBLE_LEN + 2 * MAX_MESSAGE);
        out.extend_from_slice(&pre);
        Ok(Handshake {
            noise,
            initiator,
            expected,
            members,
            cluster,
            protection,
            got_preamble: false,
            step: Step::First,
            out,
        })
    }

    /// Appends what this side has to send to `buf`; `false` when nothing.
    /// Call after construction and after every [`Handshake::handle_input`]
    /// (also the one that returns [`Established`]: the initiator's last
    /// message is still to be sent then).
    pub fn poll_transmit(&mut self, buf: &mut BytesMut) -> bool {
        if self.out.is_empty() {
            return false;
        }
        buf.extend_from_slice(&self.out);
        self.out.clear();
        true
    }

    /// Both preambles were already exchanged (`resume::Dial` falling back,
    /// `resume::Accept` choosing Noise): ours is not sent again.
    pub(super) fn skip_preamble(&mut self) {
        if self.out.starts_with(b"SLNK") {
            let _ = self.out.split_to(PREAMBLE_LEN);
        }
        self.got_preamble = true;
    }

    fn write_message(&mut self) -> Result<(), SecureError> {
        let mut msg = [0u8; MAX_MESSAGE];
        let n = self
            .noise
            .write_message(&[], &mut msg)
            .map_err(|e| SecureError::Noise(format!("{e}")))?;
        let len = u16::try_from(n).map_err(|_| SecureError::Malformed("handshake message"))?;
        self.out.put_u16(len);
        self.out.extend_from_slice(&msg[..n]);
        Ok(())
    }

    fn remote_static(&self) -> Result<PublicKey, SecureError> {
        let k = self
            .noise
            .get_remote_static()
            .ok_or(SecureError::Malformed("no static key"))?;
        let k: [u8; KEY_LEN] = k
            .try_into()
            .map_err(|_| SecureError::Malformed("static key"))?;
        Ok(PublicKey(k))
    }

    fn establish(&mut self, peer: NodeId) -> Established {
        self.step = Step::Done;
        let (i2r, r2i) = self.noise.dangerously_get_raw_split();
        let (send, recv) = if self.initiator {
            (i2r, r2i)
        } else {
            (r2i, i2r)
        };
        Established {
            peer,
            sealer: Sealer::new(&send, self.protection),
            opener: Opener::new(&recv, self.protection),
            exporter: None,
            ticket: Some(super::resume::Ticket::from_split(peer, &i2r, &r2i)),
        }
    }

    /// Feeds bytes received; consumes what it uses. Returns the finished
    /// handshake once done — bytes left in `buf` then are the first
    /// records. Any error means the transport must be closed.
    pub fn handle_input(&mut self, buf: &mut BytesMut) -> Result<Option<Established>, SecureError> {
        loop {
            if matches!(self.step, Step::Done) {
                return Err(SecureError::Malformed("handshake already finished"));
            }
            if !self.got_preamble {
                if !preamble::read(buf, self.cluster, self.protection, Auth::Noise)? {
                    return Ok(None);
                }
                self.got_preamble = true;
            }
            if buf.len() < 2 {
                return Ok(None);
            }
            let len = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
            if len > MAX_MESSAGE {
                return Err(SecureError::Malformed("handshake message too long"));
            }
            if buf.len() < 2 + len {
                return Ok(None);
            }
            let msg = buf.split_to(2 + len);
            let mut payload = [0u8; MAX_MESSAGE];
            self.noise
                .read_message(&msg[2..], &mut payload)
                .map_err(|_| SecureError::Failed)?;
            match (self.initiator, &self.step) {
                (true, Step::First) => {
                    // Message 2 carried the responder's static key.
                    let key = self.remote_static()?;
                    let expected = self.expected.ok_or(SecureError::Malformed("no peer"))?;
                    let got = self.members.node_of(&key);
                    if got != Some(expected) {
                        return Err(SecureError::WrongKey { expected, got });
                    }
                    self.write_message()?;
                    return Ok(Some(self.establish(expected)));
                }
                (false, Step::First) => {
                    self.write_message()?;
                    self.step = Step::Third;
                }
                (false, Step::Third) => {
                    let key = self.remote_static()?;
                    let peer = self
                        .members
                        .node_of(&key)
                        .ok_or(SecureError::UnknownKey(key))?;
                    return Ok(Some(self.establish(peer)));
                }
                _ => return Err(SecureError::Malformed("unexpected handshake message")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::secure::test_nodes::{members, node};

    /// Both Noise sides through the module's one driver.
    fn run(
        i: Handshake,
        r: Handshake,
    ) -> (
        Result<Established, SecureError>,
        Result<Established, SecureError>,
        BytesMut,
    ) {
        crate::secure::run_both(
            crate::secure::PathHandshake::Noise(Box::new(i)),
            crate::secure::PathHandshake::Noise(Box::new(r)),
        )
    }

    #[test]
    fn members_authenticate_each_other_and_talk() {
        let (a, b) = (node(1), node(2));
        let m = members(&[&a, &b]);
        let c = ClusterId(5);
        for p in [Protection::Encrypt, Protection::IntegrityOnly] {
            let i = Handshake::initiator(&a.keys, m.clone(), c, p, b.id).unwrap();
            let r = Handshake::responder(&b.keys, m.clone(), c, p).unwrap();
            let (ie, re, _) = run(i, r);
            let (mut ie, mut re) = (ie.unwrap(), re.unwrap());
            assert_eq!(ie.peer, b.id);
            assert_eq!(re.peer, a.id);
            let mut wire = BytesMut::new();
            ie.sealer.seal([&b"from a"[..]], &mut wire).unwrap();
            let mut out = BytesMut::new();
            re.opener.open(&mut wire, &mut out).unwrap();
            assert_eq!(&out[..], b"from a");
            let mut wire = BytesMut::new();
            re.sealer.seal([&b"from b"[..]], &mut wire).unwrap();
            let mut out = BytesMut::new();
            ie.opener.open(&mut wire, &mut out).unwrap();
            assert_eq!(&out[..], b"from b");
        }
    }

    #[test]
    fn strangers_and_impostors_are_refused() {
        let (a, b, x) = (node(1), node(2), node(3));
        let c = ClusterId(5);
        let p = Protection::Encrypt;
        // x is not a member of b's list: b refuses after message 3.
        let i = Handshake::initiator(&x.keys, members(&[&x, &b]), c, p, b.id).unwrap();
        let r = Handshake::responder(&b.keys, members(&[&a, &b]), c, p).unwrap();
        let (_, re, _) = run(i, r);
        assert!(matches!(re, Err(SecureError::UnknownKey(k)) if k == x.keys.public()));
        // x pretends to be node 1 with its own key: b sees x's key, not 1's.
        let mut xm = Members::new();
        xm.insert(a.id, x.keys.public()).unwrap();
        xm.insert(b.id, b.keys.public()).unwrap();
        let i = Handshake::initiator(&x.keys, Arc::new(xm), c, p, b.id).unwrap();
        let r = Handshake::responder(&b.keys, members(&[&a, &b]), c, p).unwrap();
        let (_, re, _) = run(i, r);
        assert!(matches!(re, Err(SecureError::UnknownKey(_))));
        // x answers a dial meant for b: a refuses after message 2.
        let i = Handshake::initiator(&a.keys, members(&[&a, &b]), c, p, b.id).unwrap();
        let r = Handshake::responder(&x.keys, members(&[&a, &x]), c, p).unwrap();
        let (ie, _, _) = run(i, r);
        assert_eq!(
            ie.err(),
            Some(SecureError::WrongKey {
                expected: b.id,
                got: None
            })
        );
        // A dial to a node without a key is refused before any byte.
        assert_eq!(
            Handshake::initiator(&a.keys, members(&[&a]), c, p, b.id).err(),
            Some(SecureError::NoKeyFor(b.id))
        );
    }

    #[test]
    fn mismatches_name_themselves() {
        let (a, b) = (node(1), node(2));
        let m = members(&[&a, &b]);
        let i = Handshake::initiator(&a.keys, m.clone(), ClusterId(5), Protection::Encrypt, b.id)
            .unwrap();
        let r =
            Handshake::responder(&b.keys, m.clone(), ClusterId(6), Protection::Encrypt).unwrap();
        let (ie, re, _) = run(i, r);
        assert_eq!(
            re.err(),
            Some(SecureError::WrongCluster {
                ours: ClusterId(6),
                theirs: ClusterId(5)
            })
        );
        assert!(matches!(ie, Err(SecureError::WrongCluster { .. })));
        let i = Handshake::initiator(&a.keys, m.clone(), ClusterId(5), Protection::Encrypt, b.id)
            .unwrap();
        let r = Handshake::responder(&b.keys, m.clone(), ClusterId(5), Protection::IntegrityOnly)
            .unwrap();
        let (_, re, _) = run(i, r);
        assert!(matches!(re, Err(SecureError::ProtectionMismatch { .. })));
        // An insecure peer's first bytes (a HELLO frame) are not a preamble.
        let mut r = Handshake::responder(&b.keys, m, ClusterId(5), Protection::Encrypt).unwrap();
        let mut junk = BytesMut::from(&[1u8, 0, 0, 40][..]);
        assert_eq!(
            r.handle_input(&mut junk).err(),
            Some(SecureError::NotSecure)
        );
    }

    #[test]
    fn tampered_handshake_bytes_fail() {
        let (a, b) = (node(1), node(2));
        let m = members(&[&a, &b]);
        let c = ClusterId(5);
        let p = Protection::Encrypt;
        // Flip each byte the initiator sends first (preamble + message 1), then
        // run the rest: it must never complete with both sides agreeing.
        let mut first = BytesMut::new();
        Handshake::initiator(&a.keys, m.clone(), c, p, b.id)
            .unwrap()
            .poll_transmit(&mut first);
        for i in 0..first.len() {
            let mut ini = Handshake::initiator(&a.keys, m.clone(), c, p, b.id).unwrap();
            let mut r = Handshake::responder(&b.keys, m.clone(), c, p).unwrap();
            let mut to_r = BytesMut::new();
            ini.poll_transmit(&mut to_r);
            to_r[i] ^= 1;
            let Ok(None) = r.handle_input(&mut to_r) else {
                continue; // refused at once
            };
            let mut to_i = BytesMut::new();
            r.poll_transmit(&mut to_i);
            assert!(
                !matches!(ini.handle_input(&mut to_i), Ok(Some(_))),
                "byte {i} of message 1 altered, yet the initiator accepted message 2"
            );
        }
    }
}
