//! The cluster file: every node of the cluster, its addresses on each
//! network, its public key, and the role service — one file, the same on
//! every node (hr-net's role server needs every node to agree on who the
//! candidates are, in which order).
//!
//! ```toml
//! cluster = 11
//!
//! [role]
//! candidates = [1, 2]          # role-server candidates, in order
//! # refresh_ms = 100           # reports and re-pushes at least this often
//! # report_stale_after_ms = 500
//! # backend = "embedded"       # the default; or "etcd" (with [role.etcd])
//!
//! # [role.etcd]                # with backend = "etcd" (surelink built with `--features etcd`)
//! # endpoints = ["http://127.0.0.1:2379"]
//! # prefix = "/surelink/11"    # the default: /surelink/<cluster>
//! # lease_ttl_s = 2            # the candidates' lease (etcd may grant more)
//! # ca_file = "etcd-ca.pem"    # TLS (https:// endpoints): the CA signing etcd's certificate,
//! # cert_file = "node-{node}.pem"     # this node's client certificate and key
//! # key_file = "node-{node}-key.pem"  #   (etcd's --client-cert-auth; `{node}`: its id),
//! #                                   #   relative to this file,
//! # server_name = "etcd"       # and the name etcd's certificate carries
//! # user = "surelink"          # etcd auth: the user (`{node}`: its id) and a file
//! # password_file = "etcd-password"  #   holding its password (one line)
//!
//! [[nodes]]
//! node = 1
//! addrs = ["127.0.1.11:7201", "127.0.2.11:7201"]   # one per network ("" where not attached)
//! public_key = "…"                                  # from `surelink keygen`
//! metrics = "127.0.0.1:9201"                        # optional: where `surelink status` asks
//!
//! [[nodes]]
//! node = 100                                        # a client (the cache proxy): no addresses
//! public_key = "…"
//! ```
//!
//! A node's own file names it with `cluster_file = "cluster.toml"`: the
//! cluster file adds every node's key to its members, makes it dial every
//! node listed *before* it that has addresses (so each pair has one side
//! that dials), and turns the role service on. Errors name the line.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use surelink::proto::role::{Ownership, RoleConfig, RoleConfigError, MAX_NETWORKS};
use surelink::proto::NodeId;
use surelink::PublicKey;
use toml::Spanned;

/// A cluster file that cannot be used. Every variant names the line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterFileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML, or a field of the wrong type or name.
    #[error("line {line}: {message}")]
    Syntax {
        /// Where.
        line: usize,
        /// What the parser said.
        message: String,
    },
    /// A node id appears twice.
    #[error("line {line}: node {node} is listed twice")]
    DuplicateNode {
        /// Where (the second entry).
        line: usize,
        /// The node.
        node: u64,
    },
    /// Node id 0 is reserved.
    #[error("line {line}: node id 0 is reserved")]
    ZeroNode {
        /// Where.
        line: usize,
    },
    /// An address does not parse.
    #[error("line {line}: node {node}: bad address {addr:?}")]
    BadAddress {
        /// Where.
        line: usize,
        /// The node.
        node: u64,
        /// The text.
        addr: String,
    },
    /// More networks than the role service supports.
    #[error("line {line}: node {node} lists {count} networks; at most {MAX_NETWORKS}")]
    TooManyNetworks {
        /// Where.
        line: usize,
        /// The node.
        node: u64,
        /// How many.
        count: usize,
    },
    /// A public key does not parse.
    #[error("line {line}: node {node}: bad public key")]
    BadKey {
        /// Where.
        line: usize,
        /// The node.
        node: u64,
    },
    /// A role-server candidate is not a listed node, or has no address.
    #[error("line {line}: role candidate {node} {reason}")]
    BadCandidate {
        /// Where (the `candidates` line).
        line: usize,
        /// The candidate.
        node: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// `backend` names no known backend.
    #[error("line {line}: role.backend {name:?}: use \"embedded\" or \"etcd\"")]
    Backend {
        /// Where.
        line: usize,
        /// The text.
        name: String,
    },
    /// `backend = "etcd"` without a `[role.etcd]` table, or the other way
    /// round.
    #[error("line {line}: {what}")]
    EtcdSection {
        /// Where.
        line: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// The `[role.etcd]` settings do not work.
    #[error("line {line}: [role.etcd]: {message}")]
    Etcd {
        /// Where (the `[role.etcd]` table).
        line: usize,
        /// Why.
        message: String,
    },
    /// The role settings do not validate.
    #[error("line {line}: [role]: {source}")]
    Role {
        /// Where (the `[role]` table).
        line: usize,
        /// Why.
        source: RoleConfigError,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    cluster: u64,
    role: Spanned<RoleSection>,
    nodes: Vec<Spanned<NodeEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleSection {
    candidates: Spanned<Vec<u64>>,
    refresh_ms: Option<u64>,
    report_stale_after_ms: Option<u64>,
    backend: Option<Spanned<String>>,
    etcd: Option<Spanned<EtcdSection>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EtcdSection {
    endpoints: Vec<String>,
    prefix: Option<String>,
    lease_ttl_s: Option<u64>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    server_name: Option<String>,
    user: Option<String>,
    password_file: Option<PathBuf>,
}

/// `[role.etcd]`: where the etcd backend keeps the cluster's election and
/// tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EtcdSettings {
    /// etcd's client URLs.
    pub(crate) endpoints: Vec<String>,
    /// Key prefix (`None`: `/surelink/<cluster>`).
    pub(crate) prefix: Option<String>,
    /// The candidates' lease TTL (`None`: the backend's default).
    pub(crate) lease_ttl: Option<Duration>,
    /// TLS: the CA to trust, this node's client certificate and key
    /// (resolved against the cluster file's directory), the name etcd's
    /// certificate carries.
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) cert_file: Option<PathBuf>,
    pub(crate) key_file: Option<PathBuf>,
    pub(crate) server_name: Option<String>,
    /// etcd authentication: the user, and the file holding its password
    /// (resolved against the cluster file's directory); `{node}` in
    /// either stands for the node's id.
    pub(crate) user: Option<String>,
    pub(crate) password_file: Option<PathBuf>,
    /// The `[role.etcd]` line, for errors found later.
    pub(crate) line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    node: u64,
    #[serde(default)]
    addrs: Vec<String>,
    public_key: Option<String>,
    metrics: Option<SocketAddr>,
}

/// One node of the cluster file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterNode {
    pub(crate) node: NodeId,
    /// Per network (`None`: not attached).
    pub(crate) addrs: Vec<Option<SocketAddr>>,
    pub(crate) public_key: Option<PublicKey>,
    pub(crate) metrics: Option<SocketAddr>,
}

/// A parsed, checked cluster file.
#[derive(Clone, Debug)]
pub(crate) struct Cluster {
    pub(crate) cluster: u64,
    /// In the file's order.
    pub(crate) nodes: Vec<ClusterNode>,
    pub(crate) role: RoleConfig,
    /// `backend = "etcd"`: its settings (the role configuration's
    /// ownership is then `Elected`).
    pub(crate) etcd: Option<EtcdSettings>,
}

impl Cluster {
    /// Reads and checks `path`.
    pub(crate) fn load(path: &Path) -> Result<Cluster, ClusterFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Cluster::parse_in(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Parses and checks the text of a cluster file (files it names are
    /// relative to the working directory).
    #[cfg(test)]
    pub(crate) fn parse(text: &str) -> Result<Cluster, ClusterFileError> {
        Cluster::parse_in(text, Path::new("."))
    }

    /// Parses and checks the text of a cluster file; files it names are
    /// relative to `base`.
    pub(crate) fn parse_in(text: &str, base: &Path) -> Result<Cluster, ClusterFileError> {
        let line = |span: Range<usize>| {
            text.as_bytes()[..span.start.min(text.len())]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1
        };
        let f: File = toml::from_str(text).map_err(|e| ClusterFileError::Syntax {
            line: e.span().map_or(1, &line),
            message: e.message().to_string(),
        })?;
        let mut nodes: Vec<ClusterNode> = Vec::new();
        let mut networks = 0usize;
        for entry in &f.nodes {
            let l = line(entry.span());
            let e = entry.get_ref();
            if e.node == 0 {
                return Err(ClusterFileError::ZeroNode { line: l });
            }
            if nodes.iter().any(|n| n.node == NodeId(e.node)) {
                return Err(ClusterFileError::DuplicateNode {
                    line: l,
                    node: e.node,
                });
            }
            if e.addrs.len() > MAX_NETWORKS {
                return Err(ClusterFileError::TooManyNetworks {
                    line: l,
                    node: e.node,
                    count: e.addrs.len(),
                });
            }
            let addrs = crate::config_file::parse_addrs(&e.addrs).map_err(|addr| {
                ClusterFileError::BadAddress {
                    line: l,
                    node: e.node,
                    addr,
                }
            })?;
            let public_key = match &e.public_key {
                Some(k) => Some(k.parse().map_err(|_| ClusterFileError::BadKey {
                    line: l,
                    node: e.node,
                })?),
                None => None,
            };
            networks = networks.max(addrs.len());
            nodes.push(ClusterNode {
                node: NodeId(e.node),
                addrs,
                public_key,
                metrics: e.metrics,
            });
        }
        let role_line = line(f.role.span());
        let r = f.role.get_ref();
        let etcd_backend = match &r.backend {
            None => false,
            Some(b) => match b.get_ref().as_str() {
                "embedded" => false,
                "etcd" => true,
                other => {
                    return Err(ClusterFileError::Backend {
                        line: line(b.span()),
                        name: other.to_string(),
                    })
                }
            },
        };
        let etcd = match (&r.etcd, etcd_backend) {
            (None, false) => None,
            (None, true) => {
                return Err(ClusterFileError::EtcdSection {
                    line: r.backend.as_ref().map_or(role_line, |b| line(b.span())),
                    what: "role.backend = \"etcd\" needs a [role.etcd] table with `endpoints`",
                })
            }
            (Some(e), false) => {
                return Err(ClusterFileError::EtcdSection {
                    line: line(e.span()),
                    what: "[role.etcd] is set but role.backend is not \"etcd\"",
                })
            }
            (Some(e), true) => {
                let l = line(e.span());
                let e = e.get_ref();
                if e.endpoints.is_empty() {
                    return Err(ClusterFileError::Etcd {
                        line: l,
                        message: "`endpoints` lists no etcd endpoint".into(),
                    });
                }
                if e.cert_file.is_some() != e.key_file.is_some() {
                    return Err(ClusterFileError::Etcd {
                        line: l,
                        message: "`cert_file` and `key_file` go together".into(),
                    });
                }
                if e.user.is_some() != e.password_file.is_some() {
                    return Err(ClusterFileError::Etcd {
                        line: l,
                        message: "`user` and `password_file` go together".into(),
                    });
                }
                if e.ca_file.is_none() && (e.cert_file.is_some() || e.server_name.is_some()) {
                    return Err(ClusterFileError::Etcd {
                        line: l,
                        message:
                            "TLS settings need `ca_file` (the CA that signs etcd's certificate)"
                                .into(),
                    });
                }
                Some(EtcdSettings {
                    endpoints: e.endpoints.clone(),
                    prefix: e.prefix.clone(),
                    lease_ttl: e.lease_ttl_s.map(Duration::from_secs),
                    ca_file: e.ca_file.as_ref().map(|p| base.join(p)),
                    cert_file: e.cert_file.as_ref().map(|p| base.join(p)),
                    key_file: e.key_file.as_ref().map(|p| base.join(p)),
                    server_name: e.server_name.clone(),
                    user: e.user.clone(),
                    password_file: e.password_file.as_ref().map(|p| base.join(p)),
                    line: l,
                })
            }
        };
        let cand_line = line(r.candidates.span());
        for c in r.candidates.get_ref() {
            match nodes.iter().find(|n| n.node == NodeId(*c)) {
                None => {
                    return Err(ClusterFileError::BadCandidate {
                        line: cand_line,
                        node: *c,
                        reason: "is not a node of the cluster file",
                    })
                }
                Some(n) if n.addrs.iter().all(Option::is_none) => {
                    return Err(ClusterFileError::BadCandidate {
                        line: cand_line,
                        node: *c,
                        reason: "has no address: every node must be able to reach it",
                    })
                }
                Some(_) => {}
            }
        }
        let mut role = RoleConfig {
            nodes: nodes.iter().map(|n| n.node).collect(),
            candidates: r.candidates.get_ref().iter().map(|c| NodeId(*c)).collect(),
            networks: u8::try_from(networks.max(1)).unwrap_or(u8::MAX),
            ..RoleConfig::default()
        };
        if let Some(v) = r.refresh_ms {
            role.refresh = Duration::from_millis(v);
        }
        if let Some(v) = r.report_stale_after_ms {
            role.report_stale_after = Duration::from_millis(v);
        }
        if etcd.is_some() {
            role.ownership = Ownership::Elected;
        }
        role.validate().map_err(|source| ClusterFileError::Role {
            line: role_line,
            source,
        })?;
        let cluster = Cluster {
            cluster: f.cluster,
            nodes,
            role,
            etcd,
        };
        crate::role_backend::check(&cluster)?;
        Ok(cluster)
    }

    /// The entry of `node`.
    pub(crate) fn node(&self, node: NodeId) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.node == node)
    }

    /// The nodes `node` dials: every node listed before it that has an
    /// address.
    pub(crate) fn dials(&self, node: NodeId) -> impl Iterator<Item = &ClusterNode> {
        self.nodes
            .iter()
            .take_while(move |n| n.node != node)
            .filter(|n| n.addrs.iter().any(Option::is_some))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let c =
            Cluster::parse(&file("candidates = [2, 1]\nrefresh_ms = 50", NODES)).expect("valid");
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
        let e = Cluster::parse(&file("candidates = [1]\nbackend = \"etcd\"", NODES))
            .expect_err("no table");
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
        let e =
            Cluster::parse(&file(&tls("user = \"u\""), NODES)).expect_err("user without password");
        assert!(e.to_string().contains("`password_file`"), "{e}");
        let e = Cluster::parse(&file(&tls("server_name = \"etcd\""), NODES))
            .expect_err("tls without ca");
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
            let cfg = surelink::Config::new(NodeId(1), surelink::proto::ClusterId(5));
            let e = rt
                .block_on(crate::role_backend::bind(cfg, Some(&c)))
                .expect_err("not built");
            assert!(e.to_string().contains("`etcd` feature"), "{e}");
        }
    }

    /// etcd users: `{node}` in the user and the password file gives each
    /// node its own; the password file's final newline is not part of
    /// the password; a missing file names the line.
    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_users_and_password_files() {
        let dir = std::env::temp_dir().join(format!("surelink-cf-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("pw-2"), "s3cret\n").expect("password");
        let text = file(
            "candidates = [1]\nbackend = \"etcd\"\n[role.etcd]\nendpoints = [\"http://e:2379\"]\nuser = \"node-{node}\"\npassword_file = \"pw-{node}\"",
            NODES,
        );
        let c = Cluster::parse_in(&text, &dir).expect("per-node files are not read here");
        let cfg = crate::role_backend::etcd_config(&c, Some(NodeId(2)))
            .expect("etcd")
            .expect("node 2's settings");
        let auth = cfg.auth.expect("auth");
        assert_eq!(
            (auth.user.as_str(), auth.password.as_str()),
            ("node-2", "s3cret")
        );
        let e = crate::role_backend::etcd_config(&c, Some(NodeId(3)))
            .expect("etcd")
            .expect_err("node 3 has no password file");
        assert!(
            matches!(e, ClusterFileError::Etcd { line: 6, .. }) && e.to_string().contains("pw-3"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
