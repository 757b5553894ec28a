//! The secure layer of a simulated connection: the product's own Noise
//! handshake ([`Handshake`]) and record layer ([`Sealer`], [`Opener`]),
//! driven over the simulator's links exactly as the shell drives them over
//! TCP — the handshake first, the endpoint's path only once it finished,
//! then every byte in AEAD records.
//!
//! A transmission the simulator loses inside a connection is, to the
//! record layer, bytes an attacker deleted: the next record fails its tag
//! and the receiving end closes the connection (the shell does the same).
//! So with the secure layer on, loss faults become connection resets
//! followed by a fresh handshake, and the core's promises must still hold.
//!
//! As in the shell, each node keeps the tickets its full Noise handshakes
//! minted, and a later connection to the same peer resumes with one
//! ([`Dial`], [`Accept`]): most reconnections in a run are resumptions.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use surelink_proto::secure::{
    Accept, Dial, Handshake, Keypair, Members, Opener, PathHandshake, Protection, Sealer,
    SecretKey, SecureError, TestCa, TicketLookup, TicketStore, TlsHandshake, TlsSetup,
};
use surelink_proto::{ClusterId, NodeId, Time};

type Store = Arc<Mutex<TicketStore>>;

/// Every node's key pair and the member list they share, or (mutual TLS)
/// every node's certificate setup from one simulated CA.
#[derive(Debug)]
pub(crate) struct Keys {
    pairs: Vec<Keypair>,
    members: Arc<Members>,
    tls: Option<Vec<TlsSetup>>,
    cluster: ClusterId,
    protection: Protection,
    /// Each node's tickets (Noise only).
    tickets: Vec<Store>,
}

/// Certificates for `ids` from a fresh CA (its keys are random: the
/// certificates differ per run, the handshakes' outcomes do not).
fn tls_setups(ids: &[NodeId], cluster: ClusterId) -> Vec<TlsSetup> {
    // Test support: generating certificates from valid inputs cannot fail.
    #[allow(clippy::expect_used)]
    let ca = TestCa::new(cluster).expect("simulated CA");
    #[allow(clippy::expect_used)]
    ids.iter()
        .map(|&id| ca.setup(cluster, id).expect("simulated TLS setup"))
        .collect()
}

impl Keys {
    /// Keys for `nodes` nodes, node index `i` being `ids[i]`; secrets drawn
    /// from `seed` so a run replays exactly.
    pub(crate) fn new(
        ids: &[NodeId],
        seed: u64,
        cluster: ClusterId,
        protection: Protection,
        tls: bool,
    ) -> Keys {
        let mut members = Members::new();
        let pairs: Vec<Keypair> = ids
            .iter()
            .map(|&id| {
                let mut s = [0u8; 32];
                for (i, chunk) in s.chunks_mut(8).enumerate() {
                    let x = seed
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        .wrapping_add(id.0.wrapping_mul(31).wrapping_add(i as u64));
                    chunk.copy_from_slice(&splitmix(x).to_le_bytes());
                }
                let k = Keypair::from_secret(SecretKey::from_bytes(s));
                // Distinct seeds give distinct keys; a clash would be a bug here.
                members
                    .insert(id, k.public())
                    .expect("simulated nodes have distinct ids and keys");
                k
            })
            .collect();
        let tickets = ids
            .iter()
            .map(|_| Arc::new(Mutex::new(TicketStore::new(TicketStore::DEFAULT_LIFETIME))))
            .collect();
        Keys {
            tickets,
            pairs,
            members: Arc::new(members),
            tls: tls.then(|| tls_setups(ids, cluster)),
            cluster,
            protection,
        }
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One end of a connection: handshaking, then sealing and opening.
#[derive(Debug)]
enum End {
    Handshaking(PathHandshake),
    Open(Box<Records>),
}

/// An established end's record layer.
#[derive(Debug)]
struct Records {
    sealer: Sealer,
    opener: Opener,
}

/// The secure state of one connection; side 0 is the dialler (`a`), side 1
/// the acceptor (`b`).
#[derive(Debug)]
pub(crate) struct ConnSec {
    ends: [End; 2],
    /// Bytes received by each side, not yet consumed.
    raw: [BytesMut; 2],
    /// Each side's ticket store (Noise), for the ticket a full handshake
    /// mints.
    stores: Option<[Store; 2]>,
}

/// What one delivery produced at the receiving side.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Handshake bytes this side now sends back.
    pub(crate) reply: Option<Bytes>,
    /// This side finished its handshake with this delivery: add its path.
    pub(crate) established: bool,
    /// It resumed with a ticket (no public-key work).
    pub(crate) resumed: bool,
    /// Plaintext for the endpoint.
    pub(crate) plaintext: BytesMut,
}

/// Why a connection must close.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Broken {
    /// The handshake failed.
    #[error("handshake failed: {0}")]
    Handshake(#[from] SecureError),
    /// A record failed its tag (bytes lost, altered or reordered).
    #[error("record refused: {0}")]
    Record(#[from] surelink_proto::secure::RecordError),
}

impl ConnSec {
    /// A connection from node index `a` to node index `b`; returns it and
    /// the dialler's first handshake message.
    pub(crate) fn dial(
        keys: &Keys,
        now: Time,
        a: usize,
        b: usize,
        b_id: NodeId,
    ) -> (ConnSec, Bytes) {
        // Every simulated node is a member (or has a certificate):
        // construction cannot fail.
        #[allow(clippy::expect_used)]
        let (mut init, resp) = match &keys.tls {
            None => {
                let (pairs, members) = (keys.pairs.clone(), keys.members.clone());
                let (cluster, protection) = (keys.cluster, keys.protection);
                let full =
                    move || Handshake::initiator(&pairs[a], members, cluster, protection, b_id);
                let ticket = lock(&keys.tickets[a]).for_dial(now, b_id);
                let init = match ticket {
                    Some(t) => PathHandshake::Dial(Box::new(
                        Dial::new(t, cluster, protection, Box::new(full))
                            .expect("simulated handshake"),
                    )),
                    None => PathHandshake::Noise(Box::new(full().expect("simulated handshake"))),
                };
                let store = keys.tickets[b].clone();
                let lookup: TicketLookup = Box::new(move |id| lock(&store).lookup(now, id));
                let (pairs, members) = (keys.pairs.clone(), keys.members.clone());
                let resp = PathHandshake::Accept(Box::new(Accept::new(
                    Box::new(move || Handshake::responder(&pairs[b], members, cluster, protection)),
                    lookup,
                    cluster,
                    protection,
                )));
                (init, resp)
            }
            Some(t) => (
                PathHandshake::Tls(Box::new(
                    TlsHandshake::initiator(&t[a], keys.protection, b_id)
                        .expect("simulated handshake"),
                )),
                PathHandshake::Tls(Box::new(
                    TlsHandshake::responder(&t[b], keys.protection).expect("simulated handshake"),
                )),
            ),
        };
        let mut first = BytesMut::new();
        init.poll_transmit(&mut first);
        let stores = keys
            .tls
            .is_none()
            .then(|| [keys.tickets[a].clone(), keys.tickets[b].clone()]);
        (
            ConnSec {
                ends: [End::Handshaking(init), End::Handshaking(resp)],
                raw: [BytesMut::new(), BytesMut::new()],
                stores,
            },
            first.freeze(),
        )
    }

    /// Whether `side` finished its handshake (its path may exist).
    pub(crate) fn established(&self, side: usize) -> bool {
        matches!(self.ends[side], End::Open(_))
    }

    /// Seals `plain`, sent by `side`, into records.
    pub(crate) fn seal(&mut self, side: usize, plain: &[u8]) -> Result<Bytes, Broken> {
        match &mut self.ends[side] {
            End::Open(r) => Ok(r.sealer.seal_to_bytes([plain])?),
            // The core writes only on a path, which exists only once open.
            End::Handshaking(_) => Err(Broken::Handshake(SecureError::Malformed(
                "data before the handshake finished",
            ))),
        }
    }

    /// `bytes` arrived at `side`.
    pub(crate) fn receive(
        &mut self,
        now: Time,
        side: usize,
        bytes: &[u8],
    ) -> Result<Received, Broken> {
        let raw = &mut self.raw[side];
        raw.extend_from_slice(bytes);
        let mut out = Received::default();
        if let End::Handshaking(h) = &mut self.ends[side] {
            let done = h.handle_input(raw);
            let mut reply = BytesMut::new();
            if h.poll_transmit(&mut reply) {
                out.reply = Some(reply.freeze());
            }
            match done? {
                None => return Ok(out),
                Some(est) => {
                    // With member keys a full handshake always mints a
                    // ticket; a resumed one never does.
                    out.resumed = self.stores.is_some() && est.ticket.is_none();
                    if let (Some(t), Some(stores)) = (est.ticket, &self.stores) {
                        lock(&stores[side]).insert(now, t);
                    }
                    self.ends[side] = End::Open(Box::new(Records {
                        sealer: est.sealer,
                        opener: est.opener,
                    }));
                    out.established = true;
                }
            }
        }
        if let End::Open(r) = &mut self.ends[side] {
            r.opener.open(raw, &mut out.plaintext)?;
        }
        Ok(out)
    }
}

/// A store's lock (the simulator is single-threaded: never poisoned in
/// practice; a poisoned one is still usable).
fn lock(s: &Store) -> std::sync::MutexGuard<'_, TicketStore> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
