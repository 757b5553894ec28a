//! The shell's side of member authentication: running the core's Noise
//! (or mutual TLS) handshake on a fresh TCP connection under a deadline,
//! and the limits
//! that keep connections nobody has authenticated from using up the
//! process (file descriptors, memory, CPU for key exchanges).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
pub(crate) async fn handshake(
    setup: &SecureSetup,
    stream: &mut TcpStream,
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

async fn run(mut hs: PathHandshake, stream: &mut TcpStream) -> Result<Secured, HandshakeFailure> {
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

/// Limits on accepted connections: in total, per source address, and
/// still in their handshake. A connection over a limit is closed at once
/// (counted in `connections_refused`).
#[derive(Debug)]
pub(crate) struct ConnLimits {
    max_total: usize,
    max_per_ip: usize,
    max_handshaking: usize,
    total: AtomicUsize,
    handshaking: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// Why an accepted connection was refused.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub(crate) enum LimitHit {
    #[error("max_connections ({0}) reached")]
    Total(usize),
    #[error("max_connections_per_ip ({0}) reached for this address")]
    PerIp(usize),
    #[error("max_handshaking ({0}) connections already in their handshake")]
    Handshaking(usize),
}

/// One accepted connection's place under the limits; given back on drop.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    limits: Arc<ConnLimits>,
    ip: IpAddr,
    handshaking: bool,
}

impl ConnLimits {
    pub(crate) fn new(max_total: usize, max_per_ip: usize, max_handshaking: usize) -> ConnLimits {
        ConnLimits {
            max_total,
            max_per_ip,
            max_handshaking,
            total: AtomicUsize::new(0),
            handshaking: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
        }
    }

    /// A place for a connection from `ip`, counted as in its handshake.
    pub(crate) fn acquire(self: &Arc<Self>, ip: IpAddr) -> Result<ConnSlot, LimitHit> {
        let mut per_ip = self.per_ip.lock();
        if self.total.load(Ordering::Relaxed) >= self.max_total {
            return Err(LimitHit::Total(self.max_total));
        }
        if self.handshaking.load(Ordering::Relaxed) >= self.max_handshaking {
            return Err(LimitHit::Handshaking(self.max_handshaking));
        }
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= self.max_per_ip {
            return Err(LimitHit::PerIp(self.max_per_ip));
        }
        *n += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        self.handshaking.fetch_add(1, Ordering::Relaxed);
        Ok(ConnSlot {
            limits: self.clone(),
            ip,
            handshaking: true,
        })
    }

    /// Accepted connections open now.
    pub(crate) fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

impl ConnSlot {
    /// The handshake finished: the connection no longer counts as in one.
    pub(crate) fn authenticated(&mut self) {
        if std::mem::replace(&mut self.handshaking, false) {
            self.limits.handshaking.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.authenticated();
        let mut per_ip = self.limits.per_ip.lock();
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                // Memory returned when the address goes away.
                per_ip.remove(&self.ip);
            }
        }
        self.limits.total.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_and_places_come_back() {
        let l = Arc::new(ConnLimits::new(4, 2, 3));
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let c: IpAddr = "127.0.0.3".parse().unwrap();
        let s1 = l.acquire(a).unwrap();
        let mut s2 = l.acquire(a).unwrap();
        assert!(matches!(l.acquire(a), Err(LimitHit::PerIp(2))));
        let s3 = l.acquire(b).unwrap();
        assert!(matches!(l.acquire(b), Err(LimitHit::Handshaking(3))));
        s2.authenticated();
        let s4 = l.acquire(b).unwrap();
        assert!(matches!(l.acquire(c), Err(LimitHit::Total(4))));
        assert_eq!(l.open(), 4);
        drop((s1, s2, s3, s4));
        assert_eq!(l.open(), 0);
        assert!(l.per_ip.lock().is_empty());
        assert_eq!(l.handshaking.load(Ordering::Relaxed), 0);
    }
}
