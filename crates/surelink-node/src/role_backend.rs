//! A node's role backend beyond its endpoint. The embedded role service
//! runs inside the endpoint; with `role.backend = "etcd"` in the cluster
//! file the etcd backend (`surelink-role-etcd`, built with this tool's
//! `etcd` feature) runs beside it: it elects the role server through etcd
//! and carries the tables to every node.
//!
//! Every daemon binds its endpoint through [`bind`], so a cluster file
//! that selects etcd is honoured (or refused, naming the feature) by all
//! of them alike.

use surelink::{BindError, Config, Endpoint};

use crate::cluster_file::{Cluster, ClusterFileError};

/// Why a node could not bind its endpoint or start its role backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoleBackendError {
    /// The cluster file selects etcd, and this binary was built without it.
    #[error("cluster file line {line}: role.backend = \"etcd\" needs surelink built with the `etcd` feature (cargo build --release -p surelink-cli --features etcd; its build needs protoc: apt-get install protobuf-compiler)")]
    NotBuilt {
        /// The `[role.etcd]` line.
        line: usize,
    },
    /// The endpoint did not bind.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The cluster file's etcd settings could not be read for this node
    /// (a per-node TLS or password file).
    #[error(transparent)]
    EtcdSettings(#[from] ClusterFileError),
    /// The etcd backend did not start.
    #[cfg(feature = "etcd")]
    #[error("starting the etcd role backend: {0}")]
    Start(#[from] surelink_role_etcd::StartError),
}

/// `{node}` in a client certificate's or key's path, the etcd user or its
/// password file: each node's own.
#[cfg(feature = "etcd")]
const NODE_PLACEHOLDER: &str = "{node}";

/// The etcd backend's configuration from the cluster file for `node`
/// (reads the TLS files it names; `None`: the file is being checked, not
/// used by a node — per-node files are not read then).
#[cfg(feature = "etcd")]
pub fn etcd_config(
    cluster: &Cluster,
    node: Option<surelink::proto::NodeId>,
) -> Option<Result<surelink_role_etcd::EtcdRoleConfig, ClusterFileError>> {
    let s = cluster.etcd.as_ref()?;
    let read = |p: &std::path::PathBuf| {
        std::fs::read_to_string(p).map_err(|e| ClusterFileError::Etcd {
            line: s.line,
            message: format!("reading {}: {e}", p.display()),
        })
    };
    // Per-node client files: read with this node's id, or (checking)
    // stood in for by the CA so the rest is still validated.
    let per_node = |p: &std::path::PathBuf, stand_in: &str| -> Result<String, ClusterFileError> {
        let text = p.to_string_lossy();
        if !text.contains(NODE_PLACEHOLDER) {
            return read(p);
        }
        match node {
            Some(n) => read(&std::path::PathBuf::from(
                text.replace(NODE_PLACEHOLDER, &n.0.to_string()),
            )),
            None => Ok(stand_in.to_string()),
        }
    };
    let mut c = surelink_role_etcd::EtcdRoleConfig::for_cluster(
        &cluster.cluster.to_string(),
        s.endpoints.clone(),
    );
    if let Some(p) = &s.prefix {
        c.prefix = p.clone();
    }
    if let Some(ttl) = s.lease_ttl {
        c.lease_ttl = ttl;
        c.keepalive_every = ttl / 3;
    }
    if let Some(ca) = &s.ca_file {
        let tls = (|| {
            let ca_pem = read(ca)?;
            let client = match (&s.cert_file, &s.key_file) {
                (Some(cert), Some(key)) => Some((
                    per_node(cert, &ca_pem)?,
                    per_node(key, "-----BEGIN PRIVATE KEY-----")?,
                )),
                _ => None,
            };
            Ok(surelink_role_etcd::EtcdTls {
                ca_pem,
                client,
                server_name: s.server_name.clone(),
            })
        })();
        match tls {
            Ok(t) => c.tls = Some(t),
            Err(e) => return Some(Err(e)),
        }
    }
    if let (Some(user), Some(file)) = (&s.user, &s.password_file) {
        let user = match node {
            Some(n) => user.replace(NODE_PLACEHOLDER, &n.0.to_string()),
            None => user.replace(NODE_PLACEHOLDER, "0"),
        };
        match per_node(file, "stand-in") {
            // One line; an editor's final newline is not part of it.
            Ok(p) => {
                c.auth = Some(surelink_role_etcd::EtcdAuth {
                    user,
                    password: p.trim_end_matches(['\n', '\r']).to_string(),
                })
            }
            Err(e) => return Some(Err(e)),
        }
    }
    Some(
        c.validate()
            .map(|()| c)
            .map_err(|e| ClusterFileError::Etcd {
                line: s.line,
                message: e.to_string(),
            }),
    )
}

/// Checks the cluster file's backend settings (with the `etcd` feature:
/// the whole etcd configuration, its TLS files read; without it, nodes
/// refuse at start).
pub(crate) fn check(cluster: &Cluster) -> Result<(), ClusterFileError> {
    #[cfg(feature = "etcd")]
    if let Some(r) = etcd_config(cluster, None) {
        r?;
    }
    let _ = cluster;
    Ok(())
}

/// The role backend running beside an endpoint (nothing for the embedded
/// service). Dropping it stops it as a crash would; [`RoleBackend::stop`]
/// hands leadership over first.
#[derive(Debug, Default)]
pub struct RoleBackend {
    #[cfg(feature = "etcd")]
    etcd: Option<surelink_role_etcd::EtcdBackend>,
}

impl RoleBackend {
    /// Stops; a leader resigns, so the next candidate leads at once.
    pub async fn stop(self) {
        #[cfg(feature = "etcd")]
        if let Some(b) = self.etcd {
            b.stop().await;
        }
    }
}

/// Binds the endpoint and starts the cluster file's role backend.
pub async fn bind(
    config: Config,
    cluster: Option<&Cluster>,
) -> Result<(Endpoint, RoleBackend), RoleBackendError> {
    #[cfg(not(feature = "etcd"))]
    if let Some(s) = cluster.and_then(|c| c.etcd.as_ref()) {
        return Err(RoleBackendError::NotBuilt { line: s.line });
    }
    // The etcd settings (files read) before the endpoint binds: a bad
    // file stops the node before it joins.
    #[cfg(feature = "etcd")]
    let etcd = cluster
        .and_then(|c| etcd_config(c, Some(config.node)))
        .transpose()?;
    let ep = Endpoint::bind(config).await?;
    #[cfg(feature = "etcd")]
    if let Some(c) = etcd {
        let b = surelink_role_etcd::EtcdBackend::start(&ep, c)?;
        return Ok((ep, RoleBackend { etcd: Some(b) }));
    }
    let _ = cluster;
    Ok((ep, RoleBackend::default()))
}
