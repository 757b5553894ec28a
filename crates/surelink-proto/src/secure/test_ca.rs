//! A throwaway certificate authority (feature `test-ca`): certificates
//! naming nodes as mutual TLS wants them, for tests, the simulator and
//! `surelink certs`. A site with a PKI issues its own.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::tls::{node_name, TlsSetup, TlsSetupError};
use crate::ids::{ClusterId, NodeId};

/// A CA certificate and its key, in memory.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (keep private).
    pub key_pem: String,
}

impl TestCa {
    /// A new CA (ECDSA P-256) named after `cluster`.
    pub fn new(cluster: ClusterId) -> Result<TestCa, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("surelink cluster {} CA", cluster.0),
        );
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(TestCa {
            cert: p.self_signed(&key)?,
            key,
        })
    }

    /// The CA certificate, PEM (what every node trusts).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key, PEM.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for `node` of `cluster` (client and server use).
    pub fn issue(&self, cluster: ClusterId, node: NodeId) -> Result<Issued, rcgen::Error> {
        self.issue_named(&node_name(cluster, node))
    }

    /// A certificate carrying DNS name `name` (tests: a wrong name).
    pub fn issue_named(&self, name: &str) -> Result<Issued, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![name.to_string()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        p.distinguished_name = dn;
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// `node`'s setup with a certificate from this CA, trusting `trust`
    /// (normally this CA too).
    pub fn setup_trusting(
        &self,
        cluster: ClusterId,
        node: NodeId,
        trust: &TestCa,
    ) -> Result<TlsSetup, TlsSetupError> {
        let i = self.issue(cluster, node).map_err(|e| TlsSetupError::Pem {
            what: "generated certificate",
            reason: e.to_string(),
        })?;
        TlsSetup::from_pem(
            cluster,
            node,
            i.cert_pem.as_bytes(),
            i.key_pem.as_bytes(),
            trust.cert_pem().as_bytes(),
        )
    }

    /// `node`'s setup with a certificate from this CA, trusting it.
    pub fn setup(&self, cluster: ClusterId, node: NodeId) -> Result<TlsSetup, TlsSetupError> {
        self.setup_trusting(cluster, node, self)
    }
}
