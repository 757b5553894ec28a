//! The cluster file as a library user sees it: who dials whom and the
//! role service's configuration from a good file; from a bad one, a typed
//! error naming the line. With the `etcd` feature its settings are checked
//! as the file is read; without it, a node refuses to start and says how
//! to build it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

#[cfg(feature = "etcd")]
use std::path::Path;
#[cfg(not(feature = "etcd"))]
use std::path::{Path, PathBuf};
use std::time::Duration;

use surelink_node::cluster_file::{Cluster, ClusterFileError};
#[cfg(not(feature = "etcd"))]
use surelink_node::role_backend::RoleBackendError;
use surelink_node::surelink::proto::role::Ownership;
#[cfg(not(feature = "etcd"))]
use surelink_node::surelink::proto::ClusterId;
use surelink_node::surelink::proto::NodeId;

const KEY: &str = "p+VITH9M8YQfOZq55ehd1GfG/qCm2Xw+FL+dxZ5FUQQ=";

fn file(role: &str, nodes: &str) -> String {
    format!("cluster = 5\n\n[role]\n{role}\n{nodes}")
}

const NODES: &str = r#"
[[nodes]]
node = 1
addrs = ["127.0.1.1:7000", "127.0.2.1:7000"]

[[nodes]]
node = 2
addrs = ["127.0.1.2:7000", ""]

[[nodes]]
node = 100
"#;

#[test]
fn a_good_file_gives_the_role_config_and_who_dials_whom() {
    let c = Cluster::parse(&file("candidates = [2, 1]\nrefresh_ms = 50", NODES)).expect("valid");
    assert_eq!(c.cluster, 5);
    assert_eq!(c.role.candidates, vec![NodeId(2), NodeId(1)]);
    assert_eq!(c.role.nodes, vec![NodeId(1), NodeId(2), NodeId(100)]);
    assert_eq!(c.role.networks, 2);
    assert_eq!(c.role.refresh, Duration::from_millis(50));
    assert_eq!(c.node(NodeId(2)).map(|n| n.addrs[1]), Some(None));
    let d: Vec<NodeId> = c.dials(NodeId(100)).map(|n| n.node).collect();
    assert_eq!(d, vec![NodeId(1), NodeId(2)]);
    assert_eq!(c.dials(NodeId(1)).count(), 0);
}

#[test]
fn errors_name_the_line() {
    let dup = NODES.replace("node = 100", "node = 2");
    let e = Cluster::parse(&file("candidates = [1]", &dup)).expect_err("duplicate");
    assert!(
        matches!(e, ClusterFileError::DuplicateNode { line: 14, node: 2 }),
        "{e}"
    );
    let e = Cluster::parse(&file("candidates = [1, 7]", NODES)).expect_err("candidate");
    assert!(
        matches!(
            e,
            ClusterFileError::BadCandidate {
                line: 4,
                node: 7,
                ..
            }
        ),
        "{e}"
    );
    let e = Cluster::parse(&file("candidates = [100]", NODES)).expect_err("no address");
    assert!(e.to_string().contains("no address"), "{e}");
    let bad = NODES.replace("127.0.1.2:7000", "127.0.1.2");
    let e = Cluster::parse(&file("candidates = [1]", &bad)).expect_err("address");
    assert!(
        matches!(
            e,
            ClusterFileError::BadAddress {
                line: 10,
                node: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = Cluster::parse(&file("candidates = [1]\nrefresh = 5", NODES)).expect_err("field");
    assert!(matches!(e, ClusterFileError::Syntax { line: 5, .. }), "{e}");
    let e = Cluster::parse(&file(
        "candidates = [1]\nreport_stale_after_ms = 100",
        NODES,
    ))
    .expect_err("stale");
    assert!(matches!(e, ClusterFileError::Role { line: 3, .. }), "{e}");
    let e = Cluster::parse(&file("candidates = [1]\nbackend = \"zookeeper\"", NODES))
        .expect_err("backend");
    assert!(
        matches!(e, ClusterFileError::Backend { line: 5, .. }),
        "{e}"
    );
    let keyed = NODES.replace("node = 100", &format!("node = 100\npublic_key = \"{KEY}\""));
    assert!(Cluster::parse(&file("candidates = [1]", &keyed)).is_ok());
    let badkey = NODES.replace("node = 100", "node = 100\npublic_key = \"nope\"");
    let e = Cluster::parse(&file("candidates = [1]", &badkey)).expect_err("key");
    assert!(
        matches!(e, ClusterFileError::BadKey { node: 100, .. }),
        "{e}"
    );
}

#[test]
fn the_etcd_backend_takes_its_table_and_elects() {
    let etcd = "candidates = [1, 2]\nbackend = \"etcd\"\n\n[role.etcd]\nendpoints = [\"127.0.0.1:2379\"]\nlease_ttl_s = 3";
    let c = Cluster::parse(&file(etcd, NODES)).expect("valid");
    assert_eq!(c.role.ownership, Ownership::Elected);
    let s = c.etcd.as_ref().expect("etcd settings");
    assert_eq!(s.endpoints, vec!["127.0.0.1:2379".to_string()]);
    assert_eq!(s.lease_ttl, Some(Duration::from_secs(3)));
    assert_eq!(s.line, 7);
    let plain = Cluster::parse(&file("candidates = [1]", NODES)).expect("valid");
    assert_eq!(plain.role.ownership, Ownership::CandidateOrder);
    assert!(plain.etcd.is_none());
    // backend = "etcd" without its table, and the table without it.
    let e =
        Cluster::parse(&file("candidates = [1]\nbackend = \"etcd\"", NODES)).expect_err("no table");
    assert!(
        matches!(e, ClusterFileError::EtcdSection { line: 5, .. }),
        "{e}"
    );
    let e = Cluster::parse(&file(
        "candidates = [1]\n[role.etcd]\nendpoints = [\"127.0.0.1:2379\"]",
        NODES,
    ))
    .expect_err("unused table");
    assert!(
        matches!(e, ClusterFileError::EtcdSection { line: 5, .. }),
        "{e}"
    );
    let e = Cluster::parse(&file(
        "candidates = [1]\nbackend = \"etcd\"\n[role.etcd]\nendpoints = []",
        NODES,
    ))
    .expect_err("no endpoints");
    assert!(matches!(e, ClusterFileError::Etcd { line: 6, .. }), "{e}");
    let e = Cluster::parse(&file(
        "candidates = [1]\nbackend = \"etcd\"\n[role.etcd]\nendpoint = [\"x:1\"]",
        NODES,
    ))
    .expect_err("misspelt field");
    assert!(matches!(e, ClusterFileError::Syntax { .. }), "{e}");
    // TLS: the certificate and key go together, and need a CA; files
    // are relative to the cluster file.
    let tls = |extra: &str| {
        format!("candidates = [1]\nbackend = \"etcd\"\n[role.etcd]\nendpoints = [\"https://e:2379\"]\n{extra}")
    };
    let e = Cluster::parse(&file(&tls("ca_file = \"ca\"\ncert_file = \"c\""), NODES))
        .expect_err("cert without key");
    assert!(e.to_string().contains("go together"), "{e}");
    let e = Cluster::parse(&file(&tls("user = \"u\""), NODES)).expect_err("user without password");
    assert!(e.to_string().contains("`password_file`"), "{e}");
    let e =
        Cluster::parse(&file(&tls("server_name = \"etcd\""), NODES)).expect_err("tls without ca");
    assert!(e.to_string().contains("ca_file"), "{e}");
    let text = file(
        &tls("ca_file = \"ca.pem\"\ncert_file = \"n.pem\"\nkey_file = \"k.pem\""),
        NODES,
    );
    #[cfg(not(feature = "etcd"))]
    {
        let c = Cluster::parse_in(&text, Path::new("/etc/surelink")).expect("valid");
        let s = c.etcd.expect("etcd");
        assert_eq!(s.ca_file, Some(PathBuf::from("/etc/surelink/ca.pem")));
        assert_eq!(s.key_file, Some(PathBuf::from("/etc/surelink/k.pem")));
    }
    // With the backend built in, the files are read as the file is;
    // per-node ones (`{node}`) only by the node that uses them.
    #[cfg(feature = "etcd")]
    {
        let e = Cluster::parse_in(&text, Path::new("/nonexistent")).expect_err("no files");
        assert!(
            matches!(e, ClusterFileError::Etcd { line: 6, .. })
                && e.to_string().contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("surelink-cf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("ca.pem"),
            "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
        )
        .expect("ca");
        let per_node = file(
            &tls("ca_file = \"ca.pem\"\ncert_file = \"n-{node}.pem\"\nkey_file = \"k-{node}.pem\""),
            NODES,
        );
        let c = Cluster::parse_in(&per_node, &dir).expect("per-node files are not read here");
        assert_eq!(
            c.etcd.and_then(|s| s.cert_file),
            Some(dir.join("n-{node}.pem"))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// With the backend built in, its settings are checked as the file is
/// read; without, a node refuses to start and says how to build it.
#[test]
fn etcd_settings_are_checked_or_the_missing_feature_named() {
    let text = file(
        "candidates = [1]\nbackend = \"etcd\"\n[role.etcd]\nendpoints = [\"https://etcd:2379\"]",
        NODES,
    );
    #[cfg(feature = "etcd")]
    {
        let e = Cluster::parse(&text).expect_err("tls endpoint");
        assert!(matches!(e, ClusterFileError::Etcd { line: 6, .. }), "{e}");
    }
    #[cfg(not(feature = "etcd"))]
    {
        let c = Cluster::parse(&text).expect("parsed; refused at start");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let cfg = surelink_node::surelink::Config::new(NodeId(1), ClusterId(5));
        let e = rt
            .block_on(surelink_node::role_backend::bind(cfg, Some(&c)))
            .expect_err("not built");
        assert!(matches!(e, RoleBackendError::NotBuilt { line: 6 }), "{e:?}");
        assert!(e.to_string().contains("`etcd` feature"), "{e}");
    }
}

/// etcd users: `{node}` in the user and the password file gives each
/// node its own; the password file's final newline is not part of
/// the password; a missing file names the line.
#[cfg(feature = "etcd")]
#[test]
fn etcd_users_and_password_files() {
    let tmp = common::TempDir::new("cf-etcd-auth");
    let dir = tmp.path();
    std::fs::write(dir.join("pw-2"), "s3cret\n").expect("password");
    let text = file(
        "candidates = [1]\nbackend = \"etcd\"\n[role.etcd]\nendpoints = [\"http://e:2379\"]\nuser = \"node-{node}\"\npassword_file = \"pw-{node}\"",
        NODES,
    );
    let c = Cluster::parse_in(&text, dir).expect("per-node files are not read here");
    let cfg = surelink_node::role_backend::etcd_config(&c, Some(NodeId(2)))
        .expect("etcd")
        .expect("node 2's settings");
    let auth = cfg.auth.expect("auth");
    assert_eq!(
        (auth.user.as_str(), auth.password.as_str()),
        ("node-2", "s3cret")
    );
    let e = surelink_node::role_backend::etcd_config(&c, Some(NodeId(3)))
        .expect("etcd")
        .expect_err("node 3 has no password file");
    assert!(
        matches!(e, ClusterFileError::Etcd { line: 6, .. }) && e.to_string().contains("pw-3"),
        "{e}"
    );
}

/// The example cluster file (a temporary copy) reads as its comments say;
/// a file that is not there is named.
#[test]
fn the_example_cluster_file_loads() {
    let tmp = common::TempDir::new("cf-example");
    common::copy_examples(tmp.path());
    let c = Cluster::load(&tmp.path().join("cache/cluster.toml")).expect("valid");
    assert_eq!(c.cluster, 11);
    assert_eq!(c.role.candidates, vec![NodeId(1), NodeId(2)]);
    assert_eq!(c.role.networks, 2);
    assert!(c.nodes.iter().all(|n| n.public_key.is_some()));
    assert_eq!(c.node(NodeId(100)).map(|n| n.addrs.len()), Some(0));
    let d: Vec<NodeId> = c.dials(NodeId(100)).map(|n| n.node).collect();
    assert_eq!(d, vec![NodeId(1), NodeId(2), NodeId(3)]);
    let e = Cluster::load(&tmp.path().join("nowhere.toml")).expect_err("missing");
    assert!(matches!(e, ClusterFileError::Read { .. }), "{e:?}");
    assert!(e.to_string().contains("nowhere.toml"), "{e}");
}
