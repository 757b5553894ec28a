//! The shell's side of member authentication: running the core's Noise
//! (or mutual TLS) handshake on a fresh TCP connection under a deadline.
//! The limits that keep connections nobody has authenticated from using
//! up the process are in `admission.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use surelink_proto::secure::{
    Handshake, Keypair, MemberError, Members, Opener, PathHandshake, Protection, PublicKey, Sealer,
    SecureError, TlsHandshake, TlsSetup,
};
use surelink_proto::{ClusterId, NodeId};

use crate::config::Config;

/// What every handshake of this endpoint needs.
pub(crate) struct SecureSetup {
    method: Method,
    cluster: ClusterId,
    protection: Protection,
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
        Some(SecureSetup {
            method,
            cluster: c.cluster,
            protection: c.protection,
        })
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
    #[error("connection closed during the handshake (the peer refused us: another cluster, our key not in its member list, or it runs insecure)")]
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
    let hs = match (&setup.method, dialled) {
        (Method::Noise { keys, members }, Some(peer)) => PathHandshake::Noise(Box::new(
            Handshake::initiator(keys, members.read().clone(), cluster, protection, peer)?,
        )),
        (Method::Noise { keys, members }, None) => PathHandshake::Noise(Box::new(
            Handshake::responder(keys, members.read().clone(), cluster, protection)?,
        )),
        (Method::Tls(t), Some(peer)) => {
            PathHandshake::Tls(Box::new(TlsHandshake::initiator(t, protection, peer)?))
        }
        (Method::Tls(t), None) => {
            PathHandshake::Tls(Box::new(TlsHandshake::responder(t, protection)?))
        }
    };
    match tokio::time::timeout(timeout, run(hs, stream)).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeFailure::Timeout(timeout)),
    }
}

async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    mut hs: PathHandshake,
    stream: &mut S,
) -> Result<Secured, HandshakeFailure> {
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
            return Ok(Secured {
                peer: est.peer,
                sealer: est.sealer,
                opener: est.opener,
                leftover: buf,
                exporter: est.exporter,
            });
        }
    }
}
