//! Key files and the throwaway CA: key directories round-trip and keep
//! secrets private, nothing is ever overwritten, and certificates from
//! `certs` load as a node's `[tls]` (and a node cannot wear another's).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use surelink_node::certs::{certs, CertsError};
use surelink_node::config_file::{self, ConfigError};
use surelink_node::error_chain;
use surelink_node::keys::{load_key_dir, make_key_dir, read_secret, write_secret, KeyFileError};
use surelink_node::surelink::proto::NodeId;

#[test]
fn key_dirs_round_trip_and_secrets_are_private() {
    let tmp = common::TempDir::new("keys");
    let dir = tmp.path();
    make_key_dir(dir, &[NodeId(1), NodeId(2)]).unwrap();
    let (k1, pubs) = load_key_dir(dir, NodeId(1), &[NodeId(1), NodeId(2)]).unwrap();
    assert_eq!(pubs[0], (NodeId(1), k1.public()));
    let (k2, _) = load_key_dir(dir, NodeId(2), &[NodeId(1)]).unwrap();
    assert_eq!(pubs[1].1, k2.public());
    {
        use std::os::unix::fs::PermissionsExt as _;
        let m = std::fs::metadata(dir.join("node-1.key")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }
    // Never overwrites a secret.
    let err = write_secret(&dir.join("node-1.key"), &k2).unwrap_err();
    assert!(matches!(err, KeyFileError::Create { .. }), "{err:?}");
    std::fs::write(dir.join("bad.key"), "garbage").unwrap();
    let err = read_secret(&dir.join("bad.key")).unwrap_err();
    assert!(matches!(err, KeyFileError::Secret { .. }), "{err:?}");
    assert!(error_chain(&err).contains("base64"), "{err}");
    // A public key that is not the secret's: refused.
    std::fs::copy(dir.join("node-2.pub"), dir.join("node-1.pub")).unwrap();
    let err = load_key_dir(dir, NodeId(1), &[NodeId(1), NodeId(2)]).unwrap_err();
    assert!(
        matches!(
            err,
            KeyFileError::Mismatch {
                node: NodeId(1),
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn generated_certificates_load_as_a_tls_setup_and_in_toml() {
    let tmp = common::TempDir::new("certs");
    let dir = tmp.path().join("tls");
    certs(&dir, 7, &[1, 2]).unwrap();
    let text = "node = 1\ncluster = 7\nlisten = [\"127.0.1.1:7100\"]\n\
                [tls]\ncert = \"node-1.crt\"\nkey = \"node-1.key.pem\"\nca = \"ca.crt\"\n\
                [[peers]]\nnode = 2\naddrs = [\"127.0.1.2:7100\"]\n";
    let l = config_file::parse(text, &dir).unwrap();
    assert!(l.config.tls.is_some());
    assert!(l.config.identity.is_none());
    l.config.validate().unwrap();
    // Node 2's certificate used as node 1's: refused, naming the name.
    let text = text
        .replace("node-1.crt", "node-2.crt")
        .replace("node-1.key", "node-2.key");
    let err = config_file::parse(&text, &dir).unwrap_err();
    assert!(matches!(err, ConfigError::Tls(_)), "{err:?}");
    assert!(
        error_chain(&err).contains("node-1.cluster-7.surelink"),
        "{}",
        error_chain(&err)
    );
    // A missing file is named.
    let err = config_file::parse(&text.replace("ca.crt", "nope.crt"), &dir).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::TlsFile {
                what: "CA bundle",
                ..
            }
        ),
        "{err:?}"
    );
    // No overwriting.
    let err = certs(&dir, 7, &[1]).unwrap_err();
    assert!(
        matches!(err, CertsError::File(KeyFileError::Create { .. })),
        "{err:?}"
    );
    let err = certs(&tmp.path().join("zero"), 7, &[0]).unwrap_err();
    assert!(matches!(err, CertsError::ReservedNode), "{err:?}");
}
