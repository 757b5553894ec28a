//! The path handshake with mutual TLS 1.3, for sites whose nodes carry
//! certificates from their own certificate authority instead of member
//! keys in every configuration.
//!
//! ```text
//! both  -> preamble (auth = TLS) | sender's node id (u64 BE)
//! then TLS 1.3 records until the handshake is done (client certificate
//! required; suites TLS_AES_256_GCM_SHA384 and
//! TLS_CHACHA20_POLY1305_SHA256, the accepting side's order deciding;
//! no tickets, no resumption, no early data)
//! then our AEAD records (see `record`) with the suite's AEAD, keyed by
//! TLS's application traffic secrets
//! ```
//!
//! A node's certificate must name it: DNS name [`node_name`]`(cluster,
//! node)`, e.g. `node-2.cluster-7.surelink`, chained to the site's CA. The
//! dialler verifies the answering certificate against the dialled node's
//! name (so the cluster is checked too); the acceptor verifies the client
//! certificate's chain, then that it names the node id the client's
//! preamble claims. The preamble is not covered by the handshake: altering
//! it can only make a check fail (each side uses its own protection mode,
//! so a rewritten mode breaks the first record).
//!
//! Driven sans-IO like [`super::Handshake`]: TLS records are fed to rustls
//! one at a time, so the bytes after the record that finishes the
//! handshake — our first records — stay in the caller's buffer. After the
//! handshake rustls is done: its traffic secrets key our [`Sealer`] and
//! [`Opener`] (fresh per connection, unused by TLS itself), and 32 bytes
//! exported from the connection are handed over for the detector.
//!
//! Heartbeats: a certificate-only site has no members' static keys to
//! derive per-pair heartbeat keys from, so each connection exports 32
//! bytes (the same at both ends) and the detector keys heartbeats to that
//! peer with the newest, accepting any of the last few (see the shell's
//! detector).

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};

use super::preamble::{self, Auth, PREAMBLE_LEN};
use super::record::{Opener, RecordCipher, Sealer};
use super::{Established, Protection, SecureError};
use crate::ids::{ClusterId, NodeId};

/// Label of the keying material exported for the detector.
const EXPORTER_LABEL: &[u8] = b"EXPORTER-surelink-heartbeat";
/// A TLS record header: type, version, length.
const TLS_HEADER: usize = 5;
/// Longest TLS 1.3 ciphertext record (RFC 8446 §5.2).
const MAX_TLS_RECORD: usize = (1 << 14) + 256;

/// The DNS name a node's certificate must carry.
pub fn node_name(cluster: ClusterId, node: NodeId) -> String {
    format!("node-{}.cluster-{}.surelink", node.0, cluster.0)
}

/// A certificate setup that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    /// A PEM input did not parse.
    #[error("could not read the {what}: {reason}")]
    Pem {
        /// Which input: certificate chain, private key or CA.
        what: &'static str,
        /// The parser's words.
        reason: String,
    },
    /// The certificate chain or the CA bundle holds no certificate.
    #[error("the {0} holds no certificate")]
    Empty(&'static str),
    /// This node's own certificate does not carry its name.
    #[error(
        "this node's certificate is not valid for {name} (issue it with that DNS name): {reason}"
    )]
    WrongName {
        /// The name it must carry.
        name: String,
        /// Why it is not valid for it.
        reason: String,
    },
    /// rustls refused the configuration (a key that does not match the
    /// certificate, an unusable CA certificate...).
    #[error("TLS configuration refused: {0}")]
    Rustls(String),
}

/// This node's certificate, key and CA, built once into TLS client and
/// server configurations.
#[derive(Clone, Debug)]
pub struct TlsSetup {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    cluster: ClusterId,
    node: NodeId,
}

fn provider(prefer: RecordCipher) -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_256_GCM_SHA384 as AES, TLS13_CHACHA20_POLY1305_SHA256 as CHACHA,
    };
    let mut p = rustls::crypto::ring::default_provider();
    // The record layer after the handshake uses the negotiated suite's
    // AEAD, keyed by the secrets it derives: only 256-bit-key suites.
    p.cipher_suites = match prefer {
        RecordCipher::ChaCha20Poly1305 => vec![CHACHA, AES],
        _ => vec![AES, CHACHA],
    };
    Arc::new(p)
}

fn rustls_err(e: impl std::fmt::Display) -> TlsSetupError {
    TlsSetupError::Rustls(e.to_string())
}

impl TlsSetup {
    /// Node `node` of `cluster` with its certificate chain (leaf first),
    /// private key and the CA certificates it trusts, all PEM. Checks that
    /// the leaf names this node. Prefers [`RecordCipher::fastest_here`].
    pub fn from_pem(
        cluster: ClusterId,
        node: NodeId,
        chain_pem: &[u8],
        key_pem: &[u8],
        ca_pem: &[u8],
    ) -> Result<TlsSetup, TlsSetupError> {
        let prefer = RecordCipher::fastest_here();
        TlsSetup::from_pem_preferring(cluster, node, chain_pem, key_pem, ca_pem, prefer)
    }

    /// [`TlsSetup::from_pem`] preferring `prefer` (both suites are always
    /// offered; an accepting node's preference decides).
    pub fn from_pem_preferring(
        cluster: ClusterId,
        node: NodeId,
        chain_pem: &[u8],
        key_pem: &[u8],
        ca_pem: &[u8],
        prefer: RecordCipher,
    ) -> Result<TlsSetup, TlsSetupError> {
        let pem = |what| {
            move |e: rustls::pki_types::pem::Error| TlsSetupError::Pem {
                what,
                reason: e.to_string(),
            }
        };
        let chain = CertificateDer::pem_slice_iter(chain_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem("certificate chain"))?;
        let leaf = chain
            .first()
            .ok_or(TlsSetupError::Empty("certificate chain"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem("private key"))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca_pem) {
            roots
                .add(ca.map_err(pem("CA bundle"))?)
                .map_err(rustls_err)?;
        }
        if roots.is_empty() {
            return Err(TlsSetupError::Empty("CA bundle"));
        }
        let name = node_name(cluster, node);
        names(leaf, &name).map_err(|reason| TlsSetupError::WrongName {
            name: name.clone(),
            reason,
        })?;
        let roots = Arc::new(roots);
        let p = provider(prefer);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), p.clone())
            .build()
            .map_err(rustls_err)?;
        let mut server = ServerConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls_err)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(rustls_err)?;
        server.send_tls13_tickets = 0;
        server.ignore_client_order = true;
        server.enable_secret_extraction = true;
        let mut client = ClientConfig::builder_with_provider(p)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls_err)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(rustls_err)?;
        client.resumption = Resumption::disabled();
        client.enable_secret_extraction = true;
        Ok(TlsSetup {
            client: Arc::new(client),
            server: Arc::new(server),
            cluster,
            node,
        })
    }

    /// The cluster the certificate was checked for.
    pub fn cluster(&self) -> ClusterId {
        self.cluster
    }

    /// The node the certificate names.
    pub fn node(&self) -> NodeId {
        self.node
    }
}

/// Two setups are the same if they are the same built configuration.
impl PartialEq for TlsSetup {
    fn eq(&self, other: &TlsSetup) -> bool {
        Arc::ptr_eq(&self.client, &other.client) && Arc::ptr_eq(&self.server, &other.server)
    }
}

impl Eq for TlsSetup {}

/// Whether certificate `cert` is valid for DNS name `name` (its chain is
/// checked by rustls).
fn names(cert: &CertificateDer<'_>, name: &str) -> Result<(), String> {
    let server_name = ServerName::try_from(name).map_err(|e| e.to_string())?;
    let ee = webpki::EndEntityCert::try_from(cert).map_err(|e| e.to_string())?;
    ee.verify_is_valid_for_subject_name(&server_name)
        .map_err(|e| e.to_string())
}

/// One side of a mutual-TLS path handshake (sans-IO: feed it bytes, send
/// what it writes).
#[derive(Debug)]
pub struct TlsHandshake {
    conn: Option<Connection>,
    cluster: ClusterId,
    protection: Protection,
    /// Initiator: the node dialled.
    expected: Option<NodeId>,
    /// The node the peer's preamble claims.
    claimed: Option<NodeId>,
    out: BytesMut,
}

fn tls(e: impl std::fmt::Display) -> SecureError {
    SecureError::Tls(e.to_string())
}

impl TlsHandshake {
    /// The dialling side, reaching `peer`.
    pub fn initiator(
        setup: &TlsSetup,
        protection: Protection,
        peer: NodeId,
    ) -> Result<TlsHandshake, SecureError> {
        let name = ServerName::try_from(node_name(setup.cluster, peer)).map_err(tls)?;
        let conn = ClientConnection::new(setup.client.clone(), name).map_err(tls)?;
        Ok(TlsHandshake::new(
            setup,
            protection,
            Some(peer),
            conn.into(),
        ))
    }

    /// The accepting side.
    pub fn responder(
        setup: &TlsSetup,
        protection: Protection,
    ) -> Result<TlsHandshake, SecureError> {
        let conn = rustls::ServerConnection::new(setup.server.clone()).map_err(tls)?;
        Ok(TlsHandshake::new(setup, protection, None, conn.into()))
    }

    fn new(
        setup: &TlsSetup,
        protection: Protection,
        expected: Option<NodeId>,
        conn: Connection,
    ) -> TlsHandshake {
        let mut out = BytesMut::with_capacity(PREAMBLE_LEN + 8 + 4096);
        // TLS negotiates its suite itself: the cipher byte says only "AES
        // alone", the value every build reads.
        let offer = preamble::offer(RecordCipher::Aes256Gcm);
        out.extend_from_slice(&preamble::encode(
            setup.cluster,
            protection,
            Auth::Tls,
            offer,
        ));
        out.put_u64(setup.node.0);
        TlsHandshake {
            conn: Some(conn),
            cluster: setup.cluster,
            protection,
            expected,
            claimed: None,
            out,
        }
    }

    /// Appends what this side has to send to `buf`; `false` when nothing.
    /// Call after construction and after every
    /// [`TlsHandshake::handle_input`] (also the one that returns
    /// [`Established`]: the client's last flight is still to be sent).
    pub fn poll_transmit(&mut self, buf: &mut BytesMut) -> bool {
        self.drain_tls();
        if self.out.is_empty() {
            return false;
        }
        buf.extend_from_slice(&self.out);
        self.out.clear();
        true
    }

    /// Moves what rustls wants to write into `out`.
    fn drain_tls(&mut self) {
        if let Some(conn) = &mut self.conn {
            let mut w = (&mut self.out).writer();
            while conn.wants_write() {
                // Writing to memory cannot fail.
                if conn.write_tls(&mut w).is_err() {
                    break;
                }
            }
        }
    }

    /// Feeds bytes received; consumes what it uses. Returns the finished
    /// handshake once done — bytes left in `buf` then are the first
    /// records. Any error means the transport must be closed.
    pub fn handle_input(&mut self, buf: &mut BytesMut) -> Result<Option<Established>, SecureError> {
        if self.claimed.is_none() {
            if buf.len() < PREAMBLE_LEN + 8 {
                // Refuse a wrong preamble as soon as it shows.
                preamble::read(&mut buf.clone(), self.cluster, self.protection, Auth::Tls)?;
                return Ok(None);
            }
            preamble::read(buf, self.cluster, self.protection, Auth::Tls)?;
            let mut id = [0u8; 8];
            id.copy_from_slice(&buf.split_to(8));
            let claimed = NodeId(u64::from_be_bytes(id));
            if let Some(expected) = self.expected {
                if claimed != expected {
                    return Err(SecureError::WrongKey {
                        expected,
                        got: Some(claimed),
                    });
                }
            }
            self.claimed = Some(claimed);
        }
        loop {
            let conn = self
                .conn
                .as_mut()
                .ok_or(SecureError::Malformed("handshake already finished"))?;
            if !conn.is_handshaking() {
                return self.finish().map(Some);
            }
            if buf.len() < TLS_HEADER {
                return Ok(None);
            }
            let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
            if len > MAX_TLS_RECORD {
                return Err(SecureError::Malformed("TLS record too long"));
            }
            if buf.len() < TLS_HEADER + len {
                return Ok(None);
            }
            // One record at a time: what follows the last handshake record
            // is ours, not TLS's.
            let rec = buf.split_to(TLS_HEADER + len);
            conn.read_tls(&mut &rec[..]).map_err(tls)?;
            if let Err(e) = conn.process_new_packets() {
                // Let the peer hear why (an alert), if the caller sends it.
                self.drain_tls();
                return Err(tls(e));
            }
        }
    }

    /// The handshake is done: check the peer's name, then key our record
    /// layer from TLS's secrets.
    fn finish(&mut self) -> Result<Established, SecureError> {
        self.drain_tls();
        let conn = self
            .conn
            .take()
            .ok_or(SecureError::Malformed("handshake already finished"))?;
        let claimed = self.claimed.ok_or(SecureError::Malformed("no preamble"))?;
        if self.expected.is_none() {
            // The acceptor: the client's certificate chain was verified by
            // rustls; it must also name the node the preamble claims.
            let leaf = conn
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or(SecureError::Tls("no client certificate".into()))?;
            names(leaf, &node_name(self.cluster, claimed)).map_err(|reason| {
                SecureError::Tls(format!(
                    "the client certificate does not name node {claimed}: {reason}"
                ))
            })?;
        }
        let mut exporter = [0u8; 32];
        conn.export_keying_material(&mut exporter, EXPORTER_LABEL, None)
            .map_err(tls)?;
        let secrets = match conn {
            Connection::Client(c) => c.dangerous_extract_secrets(),
            Connection::Server(s) => s.dangerous_extract_secrets(),
        }
        .map_err(tls)?;
        let key = |(seq, s): (u64, rustls::ConnectionTrafficSecrets)| {
            use rustls::ConnectionTrafficSecrets as S;
            // Our record layer starts its nonce counter at 0: TLS must not
            // have used these keys (no tickets, no early data).
            let (key, cipher) = match s {
                S::Aes256Gcm { key, .. } if seq == 0 => (key, RecordCipher::Aes256Gcm),
                S::Chacha20Poly1305 { key, .. } if seq == 0 => {
                    (key, RecordCipher::ChaCha20Poly1305)
                }
                _ => return Err(SecureError::Malformed("unexpected TLS traffic secrets")),
            };
            let key = <[u8; 32]>::try_from(key.as_ref())
                .map_err(|_| SecureError::Malformed("traffic key length"))?;
            Ok((key, cipher))
        };
        let (send, cipher) = key(secrets.tx)?;
        let (recv, rx_cipher) = key(secrets.rx)?;
        if cipher != rx_cipher {
            return Err(SecureError::Malformed("TLS traffic secrets of two suites"));
        }
        Ok(Established {
            peer: claimed,
            sealer: Sealer::with_cipher(&send, self.protection, cipher),
            opener: Opener::with_cipher(&recv, self.protection, cipher),
            exporter: Some(exporter),
            ticket: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::TestCa;
    use super::*;

    fn new_ca() -> TestCa {
        TestCa::new(ClusterId(7)).unwrap()
    }

    /// A setup for `node` of `cluster` whose certificate names `named`
    /// (normally the same node), issued by `issuer`, trusting `trust`.
    fn setup_named(
        cluster: u64,
        node: u64,
        named: (u64, u64),
        issuer: &TestCa,
        trust: &TestCa,
    ) -> Result<TlsSetup, TlsSetupError> {
        let i = issuer.issue(ClusterId(named.0), NodeId(named.1)).unwrap();
        TlsSetup::from_pem(
            ClusterId(cluster),
            NodeId(node),
            i.cert_pem.as_bytes(),
            i.key_pem.as_bytes(),
            trust.cert_pem().as_bytes(),
        )
    }

    fn setup(node: u64, ca: &TestCa) -> TlsSetup {
        ca.setup(ClusterId(7), NodeId(node)).unwrap()
    }

    /// Runs both sides to completion (or the first error of either); also
    /// returns bytes left after the responder finished.
    fn run(
        mut i: TlsHandshake,
        mut r: TlsHandshake,
    ) -> (
        Result<Established, SecureError>,
        Result<Established, SecureError>,
    ) {
        let (mut to_r, mut to_i) = (BytesMut::new(), BytesMut::new());
        let (mut ie, mut re) = (None, None);
        for _ in 0..16 {
            i.poll_transmit(&mut to_r);
            r.poll_transmit(&mut to_i);
            if ie.is_none() {
                match i.handle_input(&mut to_i) {
                    Ok(Some(e)) => ie = Some(Ok(e)),
                    Ok(None) => {}
                    Err(e) => return (Err(e.clone()), re.unwrap_or(Err(e))),
                }
            }
            if re.is_none() {
                match r.handle_input(&mut to_r) {
                    Ok(Some(e)) => re = Some(Ok(e)),
                    Ok(None) => {}
                    Err(e) => return (ie.unwrap_or(Err(e.clone())), Err(e)),
                }
            }
            if ie.is_some() && re.is_some() {
                break;
            }
        }
        (
            ie.unwrap_or(Err(SecureError::Malformed("initiator stuck"))),
            re.unwrap_or(Err(SecureError::Malformed("responder stuck"))),
        )
    }

    #[test]
    fn nodes_with_certificates_from_one_ca_authenticate_and_talk() {
        let ca = new_ca();
        let (a, b) = (setup(1, &ca), setup(2, &ca));
        for p in [Protection::Encrypt, Protection::IntegrityOnly] {
            let i = TlsHandshake::initiator(&a, p, NodeId(2)).unwrap();
            let r = TlsHandshake::responder(&b, p).unwrap();
            let (ie, re) = run(i, r);
            let (mut ie, mut re) = (ie.unwrap(), re.unwrap());
            assert_eq!((ie.peer, re.peer), (NodeId(2), NodeId(1)));
            assert!(ie.exporter.is_some());
            assert_eq!(ie.exporter, re.exporter, "both ends export the same key");
            // The record layer is keyed the same at both ends, each way.
            let rec = ie.sealer.seal_to_bytes([&b"hello"[..]]).unwrap();
            let mut raw = BytesMut::from(&rec[..]);
            let mut out = BytesMut::new();
            re.opener.open(&mut raw, &mut out).unwrap();
            assert_eq!(&out[..], b"hello");
            let rec = re.sealer.seal_to_bytes([&b"back"[..]]).unwrap();
            let mut raw = BytesMut::from(&rec[..]);
            let mut out = BytesMut::new();
            ie.opener.open(&mut raw, &mut out).unwrap();
            assert_eq!(&out[..], b"back");
        }
    }

    #[test]
    fn the_accepting_node_s_suite_order_picks_the_record_cipher() {
        let ca = new_ca();
        let setup_preferring = |node: u64, prefer: RecordCipher| {
            let i = ca.issue(ClusterId(7), NodeId(node)).unwrap();
            TlsSetup::from_pem_preferring(
                ClusterId(7),
                NodeId(node),
                i.cert_pem.as_bytes(),
                i.key_pem.as_bytes(),
                ca.cert_pem().as_bytes(),
                prefer,
            )
            .unwrap()
        };
        for pi in RecordCipher::ALL {
            for pr in RecordCipher::ALL {
                let (a, b) = (setup_preferring(1, pi), setup_preferring(2, pr));
                let i = TlsHandshake::initiator(&a, Protection::Encrypt, NodeId(2)).unwrap();
                let r = TlsHandshake::responder(&b, Protection::Encrypt).unwrap();
                let (ie, re) = run(i, r);
                let (mut ie, mut re) = (ie.unwrap(), re.unwrap());
                assert_eq!(
                    (ie.sealer.cipher(), re.sealer.cipher()),
                    (pr, pr),
                    "{pi} {pr}"
                );
                let rec = ie.sealer.seal_to_bytes([&b"hello"[..]]).unwrap();
                let mut raw = BytesMut::from(&rec[..]);
                let mut out = BytesMut::new();
                re.opener.open(&mut raw, &mut out).unwrap();
                assert_eq!(&out[..], b"hello");
            }
        }
    }

    #[test]
    fn records_right_behind_the_handshake_stay_for_the_record_layer() {
        let ca = new_ca();
        let (a, b) = (setup(1, &ca), setup(2, &ca));
        let mut i = TlsHandshake::initiator(&a, Protection::Encrypt, NodeId(2)).unwrap();
        let mut r = TlsHandshake::responder(&b, Protection::Encrypt).unwrap();
        let (mut to_r, mut to_i) = (BytesMut::new(), BytesMut::new());
        i.poll_transmit(&mut to_r);
        assert!(r.handle_input(&mut to_r).unwrap().is_none());
        r.poll_transmit(&mut to_i);
        let mut ie = i.handle_input(&mut to_i).unwrap().expect("client done");
        // The client's last flight and its first record in one read.
        i.poll_transmit(&mut to_r);
        let first = ie.sealer.seal_to_bytes([&b"first"[..]]).unwrap();
        to_r.extend_from_slice(&first);
        let mut re = r.handle_input(&mut to_r).unwrap().expect("server done");
        assert_eq!(&to_r[..], &first[..], "the record is left for the caller");
        let mut out = BytesMut::new();
        re.opener.open(&mut to_r, &mut out).unwrap();
        assert_eq!(&out[..], b"first");
    }

    #[test]
    fn a_certificate_for_another_node_or_ca_is_refused() {
        let ca = new_ca();
        let other_ca = new_ca();
        let a = setup(1, &ca);
        // The server holds node 3's certificate but was dialled as node 2.
        let b3 = setup_named(7, 3, (7, 3), &ca, &ca).unwrap();
        let i = TlsHandshake::initiator(&a, Protection::Encrypt, NodeId(2)).unwrap();
        let r = TlsHandshake::responder(&b3, Protection::Encrypt).unwrap();
        let (ie, _) = run(i, r);
        assert!(
            matches!(
                ie,
                Err(SecureError::WrongKey {
                    expected: NodeId(2),
                    got: Some(NodeId(3))
                })
            ),
            "{ie:?}"
        );
        // A client whose preamble claims node 1 but whose certificate (from
        // the same CA) names node 4: the acceptor refuses.
        let liar = setup_named(7, 1, (7, 4), &ca, &ca);
        assert!(
            matches!(liar, Err(TlsSetupError::WrongName { .. })),
            "setup checks its own name"
        );
        let four = setup(4, &ca);
        let mut i = TlsHandshake::initiator(&four, Protection::Encrypt, NodeId(2)).unwrap();
        // Rewrite the claimed node id in the preamble (an attacker on the
        // path can): the certificate still names node 4.
        let mut first = BytesMut::new();
        i.poll_transmit(&mut first);
        first[PREAMBLE_LEN..PREAMBLE_LEN + 8].copy_from_slice(&1u64.to_be_bytes());
        let mut r = TlsHandshake::responder(&setup(2, &ca), Protection::Encrypt).unwrap();
        let mut to_i = BytesMut::new();
        let mut to_r = first;
        let mut refused = None;
        for _ in 0..8 {
            if let Err(e) = r.handle_input(&mut to_r) {
                refused = Some(e);
                break;
            }
            r.poll_transmit(&mut to_i);
            let _ = i.handle_input(&mut to_i);
            i.poll_transmit(&mut to_r);
        }
        assert!(
            matches!(&refused, Some(SecureError::Tls(m)) if m.contains("does not name node 1")),
            "{refused:?}"
        );
        // A certificate from another CA: refused by the server.
        let stranger = setup_named(7, 1, (7, 1), &other_ca, &ca).unwrap();
        let i = TlsHandshake::initiator(&stranger, Protection::Encrypt, NodeId(2)).unwrap();
        let r = TlsHandshake::responder(&setup(2, &ca), Protection::Encrypt).unwrap();
        let (_, re) = run(i, r);
        assert!(matches!(re, Err(SecureError::Tls(_))), "{re:?}");
    }

    #[test]
    fn mismatched_clusters_modes_and_auth_name_themselves() {
        let ca = new_ca();
        let a = setup(1, &ca);
        let b8 = setup_named(8, 2, (8, 2), &ca, &ca).unwrap();
        let i = TlsHandshake::initiator(&a, Protection::Encrypt, NodeId(2)).unwrap();
        let r = TlsHandshake::responder(&b8, Protection::Encrypt).unwrap();
        let (ie, _) = run(i, r);
        assert!(
            matches!(ie, Err(SecureError::WrongCluster { .. })),
            "{ie:?}"
        );
        let i = TlsHandshake::initiator(&a, Protection::Encrypt, NodeId(2)).unwrap();
        let r = TlsHandshake::responder(&setup(2, &ca), Protection::IntegrityOnly).unwrap();
        let (ie, _) = run(i, r);
        assert!(
            matches!(ie, Err(SecureError::ProtectionMismatch { .. })),
            "{ie:?}"
        );
        // A Noise peer meets a TLS peer.
        let k = super::super::Keypair::generate().unwrap();
        let mut m = super::super::Members::new();
        m.insert(NodeId(2), k.public()).unwrap();
        let mut noise = super::super::Handshake::initiator(
            &k,
            Arc::new(m),
            ClusterId(7),
            Protection::Encrypt,
            NodeId(2),
        )
        .unwrap();
        let mut bytes = BytesMut::new();
        noise.poll_transmit(&mut bytes);
        let mut r = TlsHandshake::responder(&setup(2, &ca), Protection::Encrypt).unwrap();
        let e = r.handle_input(&mut bytes).unwrap_err();
        assert!(
            matches!(
                e,
                SecureError::AuthMismatch {
                    ours: Auth::Tls,
                    theirs: Auth::Noise
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("certificates"), "{e}");
    }

    #[test]
    fn bad_pem_is_named() {
        let e = TlsSetup::from_pem(ClusterId(7), NodeId(1), b"junk", b"junk", b"junk").unwrap_err();
        assert!(
            matches!(
                e,
                TlsSetupError::Empty("certificate chain") | TlsSetupError::Pem { .. }
            ),
            "{e:?}"
        );
    }
}
