//! Configuration checks of the etcd backend (no etcd needed).

use std::time::Duration;

use surelink_proto::role::{RoleConfig, RoleConfigError};
use surelink_proto::NodeId;
use surelink_role_etcd::{
    Candidate, ConnectError, EtcdAuth, EtcdConfigError, EtcdRoleConfig, EtcdTls, Watcher,
};

fn good() -> EtcdRoleConfig {
    EtcdRoleConfig::for_cluster("c1", vec!["http://127.0.0.1:2379".into()])
}

fn role() -> RoleConfig {
    RoleConfig {
        nodes: (1..=3).map(NodeId).collect(),
        candidates: vec![NodeId(1), NodeId(2)],
        ..RoleConfig::default()
    }
}

fn err(f: impl FnOnce(&mut EtcdRoleConfig)) -> EtcdConfigError {
    let mut c = good();
    f(&mut c);
    c.validate().expect_err("should be refused")
}

#[test]
fn defaults_are_valid_and_name_the_keys() {
    let c = good();
    c.validate().expect("defaults");
    assert_eq!(c.prefix, "/surelink/c1");
    assert_eq!(c.lease_ttl, Duration::from_secs(2));
    assert_eq!(c.keepalive_every, Duration::from_secs(2) / 3);
    assert_eq!(c.election_name(), "/surelink/c1/election");
    assert_eq!(c.table_key(NodeId(7)), "/surelink/c1/table/7");
    assert_eq!(c.table_prefix(), "/surelink/c1/table/");
    let mut bare = good();
    bare.endpoints = vec!["127.0.0.1:2379".into(), "etcd-2:2379".into()];
    bare.validate().expect("host:port endpoints");
}

#[test]
fn every_bad_field_has_its_error() {
    assert_eq!(err(|c| c.endpoints.clear()), EtcdConfigError::NoEndpoints);
    for bad in ["", "http://", "ftp://x:1", "a b:1", "http://h:1/path"] {
        assert_eq!(
            err(|c| c.endpoints = vec![bad.into()]),
            EtcdConfigError::BadEndpoint(bad.into()),
            "{bad:?}"
        );
    }
    assert_eq!(
        err(|c| c.endpoints = vec!["https://h:2379".into()]),
        EtcdConfigError::TlsWithoutCa("https://h:2379".into())
    );
    let tls = EtcdTls {
        ca_pem: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into(),
        client: Some((
            "-----BEGIN CERTIFICATE-----\ny\n-----END CERTIFICATE-----\n".into(),
            "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n".into(),
        )),
        server_name: Some("etcd.example".into()),
    };
    let mut ok = good();
    ok.tls = Some(tls.clone());
    ok.endpoints = vec!["https://h:2379".into(), "h2:2379".into()];
    ok.validate().expect("https with a CA");
    assert!(!format!("{tls:?}").contains("secret"), "Debug shows no key");
    assert_eq!(
        err(|c| c.tls = Some(tls.clone())),
        EtcdConfigError::PlainEndpointWithTls("http://127.0.0.1:2379".into())
    );
    let with = |f: fn(&mut EtcdTls)| {
        let mut t = tls.clone();
        f(&mut t);
        let mut c = good();
        c.endpoints = vec!["https://h:2379".into()];
        c.tls = Some(t);
        c.validate().expect_err("bad tls")
    };
    assert_eq!(
        with(|t| t.ca_pem = "nope".into()),
        EtcdConfigError::BadPem("the CA certificate")
    );
    assert_eq!(
        with(|t| t.client = Some(("nope".into(), "nope".into()))),
        EtcdConfigError::BadPem("the client certificate")
    );
    assert_eq!(
        with(|t| t.server_name = Some("a b".into())),
        EtcdConfigError::BadServerName
    );
    let auth = EtcdAuth {
        user: "surelink".into(),
        password: "hunter2".into(),
    };
    let mut ok = good();
    ok.auth = Some(auth.clone());
    ok.validate().expect("a user and password");
    assert!(
        !format!("{ok:?}").contains("hunter2"),
        "Debug shows no password"
    );
    for user in ["", "a b"] {
        assert_eq!(
            err(|c| c.auth = Some(EtcdAuth {
                user: user.into(),
                password: "p".into()
            })),
            EtcdConfigError::BadUser,
            "{user:?}"
        );
    }
    assert_eq!(
        err(|c| c.auth = Some(EtcdAuth {
            user: "u".into(),
            password: String::new()
        })),
        EtcdConfigError::EmptyPassword
    );
    for bad in ["", "/", "surelink", "/surelink/", "/a b"] {
        assert_eq!(
            err(|c| c.prefix = bad.into()),
            EtcdConfigError::BadPrefix(bad.into()),
            "{bad:?}"
        );
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_millis(2500),
    ] {
        assert_eq!(err(|c| c.lease_ttl = ttl), EtcdConfigError::LeaseTtl(ttl));
    }
    assert_eq!(
        err(|c| c.keepalive_every = Duration::ZERO),
        EtcdConfigError::Zero("keepalive_every")
    );
    assert!(matches!(
        err(|c| c.margin = Duration::from_secs(2)),
        EtcdConfigError::MarginNotBelowTtl { .. }
    ));
    assert!(matches!(
        err(|c| c.keepalive_every = Duration::from_millis(950)),
        EtcdConfigError::KeepaliveTooRare { .. }
    ));
    assert_eq!(
        err(|c| c.connect_timeout = Duration::ZERO),
        EtcdConfigError::Zero("connect_timeout")
    );
    assert_eq!(
        err(|c| c.request_timeout = Duration::ZERO),
        EtcdConfigError::Zero("request_timeout")
    );
    assert_eq!(
        err(|c| c.max_txn_ops = 0),
        EtcdConfigError::Zero("max_txn_ops")
    );
    // The errors say what to fix.
    let msg = err(|c| c.lease_ttl = Duration::from_millis(1500)).to_string();
    assert!(msg.contains("whole number of seconds"), "{msg}");
}

#[tokio::test]
async fn connecting_checks_both_configurations_first() {
    let mut bad = good();
    bad.endpoints.clear();
    let e = Candidate::connect(bad.clone(), role(), NodeId(1))
        .await
        .expect_err("no endpoints");
    assert!(matches!(
        e,
        ConnectError::Config(EtcdConfigError::NoEndpoints)
    ));
    let e = Watcher::connect(bad, role(), NodeId(3))
        .await
        .expect_err("no endpoints");
    assert!(matches!(
        e,
        ConnectError::Config(EtcdConfigError::NoEndpoints)
    ));
    let e = Candidate::connect(good(), role(), NodeId(3))
        .await
        .expect_err("node 3 is no candidate");
    assert!(matches!(e, ConnectError::NotCandidate(NodeId(3))));
    let mut no_cands = role();
    no_cands.candidates.clear();
    let e = Candidate::connect(good(), no_cands, NodeId(1))
        .await
        .expect_err("no candidates");
    assert!(matches!(
        e,
        ConnectError::Role(RoleConfigError::NoCandidates)
    ));
}
