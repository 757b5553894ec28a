//! What can be wrong with a cluster file: every variant names the line.

use surelink::proto::role::{RoleConfigError, MAX_NETWORKS};

/// A cluster file that cannot be used. Every variant names the line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterFileError {
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
