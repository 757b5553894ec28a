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
//! dial_from = ["127.0.1.10:0", "127.0.2.10:0"]      # optional: where it dials from, per network
//! ```
//!
//! A process's own file names it with `cluster_file = "cluster.toml"` and
//! says only what is its own (node id, key file, its role's section): the
//! cluster file gives it the cluster id, its listen and metrics addresses
//! (its own `addrs` and `metrics` here, unless its file overrides them),
//! its `dial_from` (unless its file says), every node's key as a member,
//! every other node's `addrs` and `dial_from` as members' addresses (room
//! kept for them when strangers crowd the port), the nodes to dial — a cache proxy (a
//! file with `[proxy]`) every node with addresses, any other process
//! every node listed *before* it that has addresses (so each pair has one
//! side that dials) — and turns the role service on (the rules:
//! `config_file/join.rs`). Errors name the line.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use surelink::proto::role::{Ownership, RoleConfig, MAX_NETWORKS};
use surelink::proto::NodeId;
use surelink::PublicKey;
use toml::Spanned;

mod error;

pub use error::ClusterFileError;

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
#[non_exhaustive]
pub struct EtcdSettings {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// Key prefix (`None`: `/surelink/<cluster>`).
    pub prefix: Option<String>,
    /// The candidates' lease TTL (`None`: the backend's default).
    pub lease_ttl: Option<Duration>,
    /// TLS: the CA to trust (resolved against the cluster file's
    /// directory, as every file here).
    pub ca_file: Option<PathBuf>,
    /// TLS: this node's client certificate (`{node}`: the node's id).
    pub cert_file: Option<PathBuf>,
    /// TLS: this node's client key (`{node}`: the node's id).
    pub key_file: Option<PathBuf>,
    /// TLS: the name etcd's certificate carries.
    pub server_name: Option<String>,
    /// etcd authentication: the user (`{node}`: the node's id).
    pub user: Option<String>,
    /// etcd authentication: the file holding the user's password
    /// (`{node}`: the node's id).
    pub password_file: Option<PathBuf>,
    /// The `[role.etcd]` line, for errors found later.
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    node: u64,
    #[serde(default)]
    addrs: Vec<String>,
    public_key: Option<String>,
    metrics: Option<SocketAddr>,
    #[serde(default)]
    dial_from: Vec<String>,
}

/// One node of the cluster file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// Its id.
    pub node: NodeId,
    /// Per network (`None`: not attached).
    pub addrs: Vec<Option<SocketAddr>>,
    /// Its public key (a member of every node's configuration).
    pub public_key: Option<PublicKey>,
    /// Where `surelink status` asks it.
    pub metrics: Option<SocketAddr>,
    /// Per network, the address it dials from when it has no listening
    /// address there (a client such as the cache proxy): the nodes it
    /// dials keep room for members' addresses, this one's included.
    pub dial_from: Vec<Option<SocketAddr>>,
}

/// A parsed, checked cluster file.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Cluster {
    /// The cluster's id.
    pub cluster: u64,
    /// In the file's order.
    pub nodes: Vec<ClusterNode>,
    /// The role service's configuration, validated.
    pub role: RoleConfig,
    /// `backend = "etcd"`: its settings (the role configuration's
    /// ownership is then `Elected`).
    pub etcd: Option<EtcdSettings>,
}

impl Cluster {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Cluster, ClusterFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Cluster::parse_in(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Parses and checks the text of a cluster file (files it names are
    /// relative to the working directory).
    pub fn parse(text: &str) -> Result<Cluster, ClusterFileError> {
        Cluster::parse_in(text, Path::new("."))
    }

    /// Parses and checks the text of a cluster file; files it names are
    /// relative to `base`.
    pub fn parse_in(text: &str, base: &Path) -> Result<Cluster, ClusterFileError> {
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
            let dial_from = crate::config_file::parse_addrs(&e.dial_from).map_err(|addr| {
                ClusterFileError::BadAddress {
                    line: l,
                    node: e.node,
                    addr,
                }
            })?;
            if dial_from.len() > MAX_NETWORKS {
                return Err(ClusterFileError::TooManyNetworks {
                    line: l,
                    node: e.node,
                    count: dial_from.len(),
                });
            }
            let public_key = match &e.public_key {
                Some(k) => Some(k.parse().map_err(|_| ClusterFileError::BadKey {
                    line: l,
                    node: e.node,
                })?),
                None => None,
            };
            networks = networks.max(addrs.len()).max(dial_from.len());
            nodes.push(ClusterNode {
                node: NodeId(e.node),
                addrs,
                public_key,
                metrics: e.metrics,
                dial_from,
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
    pub fn node(&self, node: NodeId) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.node == node)
    }

    /// The nodes `node` dials: every node listed before it that has an
    /// address.
    pub fn dials(&self, node: NodeId) -> impl Iterator<Item = &ClusterNode> {
        self.nodes
            .iter()
            .take_while(move |n| n.node != node)
            .filter(|n| n.addrs.iter().any(Option::is_some))
    }
}
