//! hr-net's role server, without sockets or clocks: the cluster-wide
//! path-status matrix, versioned routing tables, and who may push them.
//!
//! Every node reports what its detector and its sessions see of each peer
//! on each network ([`StatusReport`]); the role server keeps those reports
//! in a [`Matrix`] (node × node × network: up / suspect / down, with age),
//! computes a [`RoutingTable`] from it — for each pair that should not use
//! every network alike, the networks in preference order with weights, and
//! the cache ring's members with their state — and pushes each node its
//! row ([`TableView`]). A path one node knows is broken is then avoided by
//! every node at once (hr-net: "the role server gathers network status and
//! broadcasts to clients"), including a fault only the far end can see: a
//! network a node hears nobody on is avoided by everyone sending to it.
//!
//! # Who may push: epochs as fencing tokens
//!
//! Role-server candidates are listed in order in the cluster file. Role
//! epochs start at 1 and each has exactly one owner,
//! `candidates[(epoch − 1) mod n]` ([`RoleConfig::owner`]), so a table's
//! epoch names the only server allowed to sign it and a node checks it
//! against the *authenticated* peer that delivered it ([`TableGate`]). A
//! node applies a table only if its `(epoch, version)` is newer than the one
//! it holds: the epochs a node applies never go down, so it can never apply
//! tables from two role servers interleaved.
//!
//! A candidate takes over ([`Candidacy`]) when the detector reports the
//! current owner dead and every candidate between them is dead too; it
//! claims the next epoch it owns above every epoch it has seen. SafeTimer's
//! accurate detector reports a peer dead only once that peer's `t_valid`
//! has passed, and a [`RoleServer`] pushes nothing at or after its own
//! `t_valid` (the shell hands it the [`Fence`](crate::detector::Fence)'s),
//! and never again once it has missed it: the old server is fenced before
//! the new one acts.
//!
//! What this module does **not** do: carry the messages (the shell sends
//! them on the authenticated sessions), run the detector, or read a clock.
//! A network partition that isolates the current owner with a minority is
//! not a failure SafeTimer's fence covers (its heartbeats leave in time,
//! they are lost on the way): the majority's candidate takes over while the
//! old owner may still push to the nodes it reaches, and each node still
//! applies epochs in order; the old owner learns the newer epoch from the
//! first acknowledgement that carries it and steps down.

mod codec;
mod election;
mod gate;
mod helpers;
mod matrix;
mod reporter;
pub(crate) mod server;
pub(crate) mod table;

use std::time::Duration;

use thiserror::Error;

use crate::ids::NodeId;

pub use codec::{decode, encode, RoleDecodeError, RoleMessage, MAX_ROLE_MESSAGE};
pub use election::{Candidacy, CandidacyAction};
pub use gate::{Applied, TableGate, TableRejected};
pub use helpers::{
    load_level, HelperEntry, HelperReport, Leveler, HELPERS_HOLD_REFRESHES, LEVEL_HOLD_REPORTS,
    MAX_LEVEL,
};
pub use matrix::{Matrix, MatrixEntry, PathStatus, PeerReport, StatusReport};
pub use reporter::{round_rtt, Reporter, Sighting};
pub use server::{Push, ReportRejected, RoleEvent, RoleInput, RoleServer};
pub use table::{
    ring_digest, MemberState, PathChoice, RingDelta, RingMember, Route, RoutingTable, TableView,
};

/// A network's index in the cluster file (0 = the first network).
pub type NetworkIndex = u8;

/// Most networks a cluster may list.
pub const MAX_NETWORKS: usize = 8;

/// Who may push the tables of a role epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ownership {
    /// The embedded role service: each epoch has exactly one owner,
    /// `candidates[(epoch − 1) mod n]` ([`RoleConfig::owner`]), and
    /// [`Candidacy`] decides when a candidate claims its next epoch.
    #[default]
    CandidateOrder,
    /// An external election decides (the etcd backend: the epoch is the
    /// revision of the winner's election key, so an epoch names its writer
    /// through the store that accepted the write). Any candidate may own
    /// an epoch; a node still applies `(epoch, version)` only upwards, so
    /// it never applies two servers' tables interleaved.
    Elected,
}

/// Configuration of the role service, the same on every node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleConfig {
    /// Every node of the cluster.
    pub nodes: Vec<NodeId>,
    /// Networks every node is on.
    pub networks: u8,
    /// Role-server candidates in order of preference (each one of `nodes`).
    pub candidates: Vec<NodeId>,
    /// A report older than this counts as *suspect* whatever it said: its
    /// reporter may no longer see what it saw.
    pub report_stale_after: Duration,
    /// A node re-sends its report at least this often, and the role server
    /// re-pushes a node's row this often until the node acknowledges it.
    pub refresh: Duration,
    /// Who may push an epoch's tables.
    pub ownership: Ownership,
}

impl Default for RoleConfig {
    fn default() -> Self {
        RoleConfig {
            nodes: Vec::new(),
            networks: 2,
            candidates: Vec::new(),
            report_stale_after: Duration::from_millis(500),
            refresh: Duration::from_millis(100),
            ownership: Ownership::CandidateOrder,
        }
    }
}

/// A role configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RoleConfigError {
    /// No nodes are listed.
    #[error("the cluster lists no nodes")]
    NoNodes,
    /// A node is listed twice.
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    /// No role-server candidate is listed.
    #[error("no role-server candidates are listed")]
    NoCandidates,
    /// A candidate is not one of the nodes, or is listed twice.
    #[error("role-server candidate {0} is not a node of the cluster or is listed twice")]
    BadCandidate(NodeId),
    /// The number of networks is zero or above [`MAX_NETWORKS`].
    #[error("`networks` is {0}; must be 1..={MAX_NETWORKS}")]
    Networks(u8),
    /// A role server was started for an epoch its node does not own.
    #[error("node {node} does not own role epoch {epoch}")]
    NotOwner {
        /// The node.
        node: NodeId,
        /// The epoch.
        epoch: u64,
    },
    /// A duration is zero.
    #[error("`{0}` must be greater than zero")]
    Zero(&'static str),
    /// Reports would go stale before the next one is due.
    #[error("`report_stale_after` ({stale:?}) must be at least twice `refresh` ({refresh:?})")]
    StaleBeforeRefresh {
        /// `report_stale_after`.
        stale: Duration,
        /// `refresh`.
        refresh: Duration,
    },
}

impl RoleConfig {
    /// Checks the configuration once, before anything uses it.
    pub fn validate(&self) -> Result<(), RoleConfigError> {
        if self.nodes.is_empty() {
            return Err(RoleConfigError::NoNodes);
        }
        let mut seen = std::collections::HashSet::new();
        for n in &self.nodes {
            if !seen.insert(*n) {
                return Err(RoleConfigError::DuplicateNode(*n));
            }
        }
        if self.candidates.is_empty() {
            return Err(RoleConfigError::NoCandidates);
        }
        let mut cands = std::collections::HashSet::new();
        for c in &self.candidates {
            if !seen.contains(c) || !cands.insert(*c) {
                return Err(RoleConfigError::BadCandidate(*c));
            }
        }
        if self.networks == 0 || usize::from(self.networks) > MAX_NETWORKS {
            return Err(RoleConfigError::Networks(self.networks));
        }
        if self.refresh.is_zero() {
            return Err(RoleConfigError::Zero("refresh"));
        }
        if self.report_stale_after < self.refresh * 2 {
            return Err(RoleConfigError::StaleBeforeRefresh {
                stale: self.report_stale_after,
                refresh: self.refresh,
            });
        }
        Ok(())
    }

    /// The only node allowed to push tables of `epoch` (epochs start at 1;
    /// `None` for 0 or without candidates).
    pub fn owner(&self, epoch: u64) -> Option<NodeId> {
        let n = u64::try_from(self.candidates.len()).ok()?;
        if epoch == 0 || n == 0 {
            return None;
        }
        let i = usize::try_from((epoch - 1) % n).ok()?;
        self.candidates.get(i).copied()
    }

    /// Whether `node` may push the tables of `epoch` (see [`Ownership`]).
    pub fn may_own(&self, node: NodeId, epoch: u64) -> bool {
        match self.ownership {
            Ownership::CandidateOrder => self.owner(epoch) == Some(node),
            Ownership::Elected => epoch > 0 && self.candidate_index(node).is_some(),
        }
    }

    /// `node`'s place among the candidates.
    pub fn candidate_index(&self, node: NodeId) -> Option<usize> {
        self.candidates.iter().position(|c| *c == node)
    }

    /// The smallest epoch above `above` that `node` owns.
    pub fn next_epoch_of(&self, node: NodeId, above: u64) -> Option<u64> {
        let i = u64::try_from(self.candidate_index(node)?).ok()?;
        let n = u64::try_from(self.candidates.len()).ok()?;
        // Epochs of candidate i: i + 1, i + 1 + n, ...
        let first = i + 1;
        if above < first {
            return Some(first);
        }
        let k = (above - first) / n + 1;
        first.checked_add(k.checked_mul(n)?)
    }
}

#[cfg(test)]
mod helpers_tests;
#[cfg(test)]
mod tests;
