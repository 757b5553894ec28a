//! What can be wrong with a configuration file ([`ConfigError`]) and with
//! loading one from disk ([`LoadError`]). Messages say what to change.

use std::path::PathBuf;

use surelink::proto::secure::{MemberError, TlsSetupError};
use surelink::proto::NodeId;

use crate::cluster_file::ClusterFileError;
use crate::keys::KeyFileError;

/// A configuration that cannot be used (the text is read; see
/// [`LoadError`] for the file itself).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not TOML, or a field of the wrong type, or one that does not exist
    /// (a typo is refused, never ignored).
    #[error(transparent)]
    Syntax(#[from] toml::de::Error),
    /// `protection` names no known mode.
    #[error("protection {0:?}: use encrypt or integrity_only")]
    Protection(String),
    /// A file named by `[tls]` could not be read.
    #[error("reading the TLS {what} {}", path.display())]
    TlsFile {
        /// Which one: certificate, key or CA bundle.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The `[tls]` files do not make a setup for this node.
    #[error("[tls]")]
    Tls(#[source] TlsSetupError),
    /// Neither `key_file`, nor `[tls]`, nor `insecure = true`.
    #[error("key_file is required (make one with `surelink keygen --out node{node}.key`), or a [tls] section with certificates, or insecure = true for a benchmark on a trusted host")]
    NoKey {
        /// This node's id.
        node: u64,
    },
    /// The key file, or a member's public key, could not be used.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// This node's own key conflicts with its member entry.
    #[error("this node's own key")]
    OwnKey(#[source] MemberError),
    /// A `[[members]]` entry could not be added.
    #[error("member {node}")]
    Member {
        /// The member.
        node: u64,
        /// Why.
        source: MemberError,
    },
    /// `write_batching` names no known mode.
    #[error("write_batching {0:?}: use auto, idle or turn")]
    WriteBatching(String),
    /// `[runtime] worker_threads` out of range.
    #[error("runtime.worker_threads = {value}: must be 1..={max}")]
    WorkerThreads {
        /// What the file says.
        value: usize,
        /// The most accepted.
        max: usize,
    },
    /// A `[[peers]]` address does not parse.
    #[error("peer {node}: bad address {addr:?}")]
    PeerAddress {
        /// The peer.
        node: u64,
        /// The text.
        addr: String,
    },
    /// `[detector] mode` names no known detector.
    #[error("detector.mode {0:?}: use safetimer, plain or off")]
    DetectorMode(String),
    /// The cluster file named by `cluster_file` cannot be used.
    #[error("cluster file {}", path.display())]
    ClusterFile {
        /// The cluster file.
        path: PathBuf,
        /// What is wrong with it.
        source: ClusterFileError,
    },
    /// The cluster file is another cluster's.
    #[error("the cluster file is for cluster {file}, this node is in cluster {node}")]
    OtherCluster {
        /// The cluster file's id.
        file: u64,
        /// This node's.
        node: u64,
    },
    /// This node is not in its cluster file.
    #[error("node {0} is not listed in the cluster file")]
    NotInCluster(NodeId),
    /// A node's key in the cluster file conflicts with a member entry (or
    /// with this node's key file).
    #[error("cluster file: node {node}'s key")]
    ClusterKey {
        /// The node.
        node: NodeId,
        /// Why.
        source: MemberError,
    },
    /// The resulting configuration does not validate (a dialled peer
    /// without a key, a detector window the fence cannot back, ...).
    #[error(transparent)]
    Invalid(#[from] surelink::ConfigError),
}

/// A configuration file that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file was read and cannot be used.
    #[error("in {}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: ConfigError,
    },
}
