//! What can be wrong with a configuration file ([`ConfigError`]) and with
//! loading one from disk ([`LoadError`]). Messages say what to change.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use surelink::proto::secure::{MemberError, TlsSetupError};
use surelink::proto::NodeId;
use surelink::PublicKey;

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
    /// `record_cipher` names no known cipher.
    #[error("record_cipher {0:?}: use aes-256-gcm or chacha20-poly1305")]
    RecordCipher(String),
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
    /// `[detector] sender_priority` is neither `raised` nor `unchanged`.
    #[error("detector.sender_priority {0:?}: use raised or unchanged")]
    SenderPriority(String),
    /// The cluster file named by `cluster_file` cannot be used.
    #[error("cluster file {}", path.display())]
    ClusterFile {
        /// The cluster file.
        path: PathBuf,
        /// What is wrong with it.
        source: ClusterFileError,
    },
    /// Neither `cluster` nor a `cluster_file` that gives it.
    #[error("`cluster = <id>` is required (or `cluster_file = \"…\"`, whose cluster it then is)")]
    NoCluster,
    // The variants below name the cluster file as a `Box<Path>`: two keys
    // and a `PathBuf` would make every `Result` of this type large.
    /// `cluster` names another cluster than the cluster file.
    #[error("cluster = {own}, but the cluster file {} is cluster {cluster}'s: remove `cluster` from this file (the cluster file gives it), or name this cluster's file", cluster_file.display())]
    OtherCluster {
        /// The cluster file.
        cluster_file: Box<Path>,
        /// What this file says.
        own: u64,
        /// What the cluster file says.
        cluster: u64,
    },
    /// This node is not in its cluster file.
    #[error("node {node} is not listed in the cluster file {}: add a [[nodes]] entry for it there (node = {node}, its addrs and public_key), or correct `node`", cluster_file.display())]
    NotInCluster {
        /// This node.
        node: NodeId,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// A `[[members]]` entry gives another key than the cluster file.
    #[error("[[members]] node {node} has public_key \"{own}\", but the cluster file {} gives \"{cluster}\": remove this [[members]] entry (members come from the cluster file), or correct the wrong key", cluster_file.display())]
    MemberKey {
        /// The member.
        node: NodeId,
        /// The key this file gives it.
        own: PublicKey,
        /// The key the cluster file gives it.
        cluster: PublicKey,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// A `[[peers]]` entry gives other addresses than the cluster file.
    #[error("[[peers]] node {node} has addrs {}, but the cluster file {} gives {}: remove this [[peers]] entry (peers come from the cluster file), or correct the wrong addresses", show_addrs(own), cluster_file.display(), show_addrs(cluster))]
    PeerAddrs {
        /// The peer.
        node: NodeId,
        /// Its addresses in this file, per network.
        own: Vec<Option<SocketAddr>>,
        /// Its addresses in the cluster file, per network.
        cluster: Vec<Option<SocketAddr>>,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// `key_file` holds another node's secret than the cluster file's key
    /// for this node.
    #[error("key_file holds the secret of public key \"{own}\", but the cluster file {} gives node {node} \"{cluster}\": point key_file at node {node}'s secret, or set public_key = \"{own}\" in its [[nodes]] entry", cluster_file.display())]
    KeyFileMismatch {
        /// This node.
        node: NodeId,
        /// The key file's public key.
        own: PublicKey,
        /// This node's key in the cluster file.
        cluster: PublicKey,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// This node has no key in the cluster file, so no other node would
    /// accept it.
    #[error("node {node} has no public_key in the cluster file {}, so the other nodes would refuse it: add public_key = \"{own}\" (this node's key_file's) to its [[nodes]] entry", cluster_file.display())]
    OwnKeyMissing {
        /// This node.
        node: NodeId,
        /// Its public key (from `key_file`).
        own: PublicKey,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// A node this one dials has no key, in the cluster file or here.
    #[error("node {node}, which this node dials, has no public_key in the cluster file {}: add its public key (`surelink keygen` printed it) to its [[nodes]] entry", cluster_file.display())]
    PeerKeyMissing {
        /// The node dialled.
        node: NodeId,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// This node's addresses in the cluster file skip a network, which a
    /// listener cannot (`listen[i]` is network `i`).
    #[error("node {node} has no address on network {network} in the cluster file {} but one on a later network: give `listen = [...]` (one address per network) in this file", cluster_file.display())]
    ListenGap {
        /// This node.
        node: NodeId,
        /// The first network without an address.
        network: usize,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// This node's `dial_from` in the cluster file skips a network a later
    /// one has (`dial_from[i]` is network `i`).
    #[error("node {node} has no dial_from address on network {network} in the cluster file {} but one on a later network: give `dial_from = [...]` (one address per network) in this file", cluster_file.display())]
    DialFromGap {
        /// This node.
        node: NodeId,
        /// The first network without an address.
        network: usize,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// A `[proxy] nodes` entry the proxy cannot reach.
    #[error("[proxy] nodes lists node {node}, which {reason} in the cluster file {}: remove it from `nodes`, or give it its addrs there", cluster_file.display())]
    ProxyNode {
        /// The node.
        node: NodeId,
        /// What is wrong.
        reason: &'static str,
        /// The cluster file.
        cluster_file: Box<Path>,
    },
    /// A proxy without a cache node to route to.
    #[error("[proxy] has no cache node to route to: give the cache nodes their addrs in the cluster file (or, without one, list them as [[peers]])")]
    ProxyNoNodes,
    /// A node's key in the cluster file cannot be a member (two nodes
    /// share it, or an own `[[members]]` entry gives that key to another
    /// node).
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

/// Addresses per network as the files write them: `["a:1", ""]`.
fn show_addrs(list: &[Option<SocketAddr>]) -> String {
    let each: Vec<String> = list
        .iter()
        .map(|a| a.map_or_else(|| "\"\"".to_string(), |a| format!("\"{a}\"")))
        .collect();
    format!("[{}]", each.join(", "))
}
