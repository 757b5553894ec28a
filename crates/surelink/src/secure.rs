//! The shell's side of member authentication: running the core's Noise
//! (or mutual TLS) handshake on a fresh TCP connection under a deadline.
//! The limits that keep connections nobody has authenticated from using
//! up the process are in `admission.rs`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use surelink_proto::secure::{
    Accept, Dial, Handshake, Keypair, MakeHandshake, MemberError, Members, Opener, PathHandshake,
    Protection, PublicKey, RecordCipher, Sealer, SecureError, TicketLookup, TicketStore,
    TlsHandshake, TlsSetup,
};
use surelink_proto::{ClusterId, NodeId, Time};

use crate::config::Config;

/// What every handshake of this endpoint needs.
pub(crate) struct SecureSetup {
    method: Method,
    cluster: ClusterId,
    protection: Protection,
    /// The record cipher our handshakes prefer.
    cipher: RecordCipher,
    /// Noise: tickets from full handshakes, to resume further paths with
    /// the same peers without public-key work (`resume_paths`).
    tickets: Option<Arc<parking_lot::Mutex<TicketStore>>>,
    /// The tickets' clock.
    base: tokio::time::Instant,
    /// Paths that resumed with a ticket, either side.
    resumed: AtomicU64,
}

/// How the ends prove who they are.
enum Method {
    /// Noise XX with member keys.
    Noise {
        keys: Keypair,
        /// Replaced whole when a member is added (handshakes in flight
        /// keep the list they started with).
        members: parking_lot::RwLock<Arc<Members>>,
    },
    /// Mutual TLS with certificates from the site's CA.
    Tls(TlsSetup),
}

impl SecureSetup {
    /// `None` when the configuration is insecure.
    pub(crate) fn from_config(c: &Config) -> Option<SecureSetup> {
        if c.insecure {
            return None;
        }
        let method = match &c.tls {
            Some(t) => Method::Tls(t.clone()),
            None => Method::Noise {
                keys: c.identity.clone()?,
                members: parking_lot::RwLock::new(Arc::new(c.members.clone())),
            },
        };
        let tickets = (matches!(method, Method::Noise { .. }) && c.resume_paths).then(|| {
            Arc::new(parking_lot::Mutex::new(TicketStore::new(
                TicketStore::DEFAULT_LIFETIME,
            )))
        });
        Some(SecureSetup {
            method,
            cluster: c.cluster,
            protection: c.protection,
            cipher: c.record_cipher.unwrap_or_else(RecordCipher::fastest_here),
            tickets,
            base: tokio::time::Instant::now(),
            resumed: AtomicU64::new(0),
        })
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Paths this endpoint resumed with a ticket (dialled or accepted).
    pub(crate) fn resumed(&self) -> u64 {
        self.resumed.load(Relaxed)
    }

    /// Adds a member (or confirms one already listed with the same key).
    /// With mutual TLS there is no member list: a no-op.
    pub(crate) fn add_member(&self, node: NodeId, key: PublicKey) -> Result<(), MemberError> {
        let Method::Noise { members, .. } = &self.method else {
            return Ok(());
        };
        let mut g = members.write();
        let mut m = Members::clone(&g);
        m.insert(node, key)?;
        *g = Arc::new(m);
        Ok(())
    }
}

/// A connection after its handshake: the authenticated peer, the record
/// layer, and bytes read past the handshake (the first records).
pub(crate) struct Secured {
    pub(crate) peer: NodeId,
    pub(crate) sealer: Sealer,
    pub(crate) opener: Opener,
    pub(crate) leftover: BytesMut,
    /// Mutual TLS: keying material for this peer's heartbeat key.
    pub(crate) exporter: Option<[u8; 32]>,
}

/// Why a connection's handshake failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeFailure {
    #[error(transparent)]
    Secure(#[from] SecureError),
    #[error("connection closed during the handshake (the peer refused us: another cluster, our key not in its member list, it runs insecure, or it is a build from before 2026-12-08 and this node prefers chacha20-poly1305)")]
    Closed,
    #[error("handshake did not finish within {0:?}")]
    Timeout(Duration),
    #[error("connection failed during the handshake: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs the handshake on `stream`: as initiator towards `dialled`, or as
/// responder when `None`. At most `timeout`.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    setup: &SecureSetup,
    stream: &mut S,
    dialled: Option<NodeId>,
    timeout: Duration,
) -> Result<Secured, HandshakeFailure> {
    let (cluster, protection) = (setup.cluster, setup.protection);
    let mut hs = match (&setup.method, dialled) {
        (Method::Noise { keys, members }, Some(peer)) => {
            let members = members.read().clone();
            let ticket = setup
                .tickets
                .as_ref()
                .and_then(|t| t.lock().for_dial(setup.now(), peer));
            match ticket {
                Some(ticket) => {
                    let keys = keys.clone();
                    PathHandshake::Dial(Box::new(Dial::new(
                        ticket,
                        cluster,
                        protection,
                        Box::new(move || {
                            Handshake::initiator(&keys, members, cluster, protection, peer)
                        }),
                    )?))
                }
                None => PathHandshake::Noise(Box::new(Handshake::initiator(
                    keys, members, cluster, protection, peer,
                )?)),
            }
        }
        (Method::Noise { keys, members }, None) => {
            let (keys, members) = (keys.clone(), members.read().clone());
            let noise: MakeHandshake =
                Box::new(move || Handshake::responder(&keys, members, cluster, protection));
            // With resumption off a peer's ticket is unknown here: it
            // falls back to Noise XX on the same connection.
            let lookup: TicketLookup = match &setup.tickets {
                Some(store) => {
                    let (store, now) = (store.clone(), setup.now());
                    Box::new(move |id| store.lock().lookup(now, id))
                }
                None => Box::new(|_| None),
            };
            PathHandshake::Accept(Box::new(Accept::new(noise, lookup, cluster, protection)))
        }
        (Method::Tls(t), Some(peer)) => {
            PathHandshake::Tls(Box::new(TlsHandshake::initiator(t, protection, peer)?))
        }
        (Method::Tls(t), None) => {
            PathHandshake::Tls(Box::new(TlsHandshake::responder(t, protection)?))
        }
    };
    hs.prefer_cipher(setup.cipher);
    let r = match tokio::time::timeout(timeout, run(hs, stream)).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeFailure::Timeout(timeout)),
    };
    if let Some(store) = &setup.tickets {
        match &r {
            Ok((secured, how)) => {
                let mut s = store.lock();
                if let Some((peer, id)) = how.refused {
                    s.forget(peer, &id);
                }
                if let Some(t) = how.minted.clone() {
                    s.insert(setup.now(), t);
                }
                if how.resumed {
                    setup.resumed.fetch_add(1, Relaxed);
                }
                debug_assert!(how.minted.as_ref().is_none_or(|t| t.peer() == secured.peer));
            }
            Err(HandshakeFailure::Secure(SecureError::Failed)) => {
                // A ticket the peer answered wrongly (or a forged peer):
                // dial with a full handshake next time.
                if let Some(peer) = dialled {
                    let mut s = store.lock();
                    while let Some(t) = s.for_dial(setup.now(), peer) {
                        s.forget(peer, &t.id());
                    }
                }
            }
            Err(_) => {}
        }
    }
    r.map(|(secured, _)| {
        tracing::debug!(peer = %secured.peer, cipher = %secured.sealer.cipher(), "path secured");
        secured
    })
}

/// What a finished handshake means for the ticket store.
#[derive(Default)]
struct TicketOutcome {
    /// A full handshake's new ticket.
    minted: Option<surelink_proto::secure::Ticket>,
    /// The ticket the peer no longer knew.
    refused: Option<(NodeId, [u8; surelink_proto::secure::TICKET_ID_LEN])>,
    /// The path resumed (no public-key work).
    resumed: bool,
}

async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    mut hs: PathHandshake,
    stream: &mut S,
) -> Result<(Secured, TicketOutcome), HandshakeFailure> {
    let mut out = BytesMut::with_capacity(256);
    let mut buf = BytesMut::with_capacity(512);
    loop {
        if hs.poll_transmit(&mut out) {
            stream.write_all(&out).await?;
            out.clear();
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(HandshakeFailure::Closed);
        }
        if let Some(est) = hs.handle_input(&mut buf)? {
            if hs.poll_transmit(&mut out) {
                stream.write_all(&out).await?;
            }
            let outcome = TicketOutcome {
                // A full Noise handshake (a fallback too) always mints.
                resumed: est.ticket.is_none()
                    && matches!(&hs, PathHandshake::Dial(_) | PathHandshake::Accept(_)),
                refused: match &hs {
                    PathHandshake::Dial(d) if d.fell_back() => {
                        Some((d.ticket().peer(), d.ticket().id()))
                    }
                    _ => None,
                },
                minted: est.ticket,
            };
            return Ok((
                Secured {
                    peer: est.peer,
                    sealer: est.sealer,
                    opener: est.opener,
                    leftover: buf,
                    exporter: est.exporter,
                },
                outcome,
            ));
        }
    }
}
