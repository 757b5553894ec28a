//! A node's side: which pushed tables it applies.

use std::collections::VecDeque;

use thiserror::Error;

use crate::ids::NodeId;

use super::table::{ring_digest, RingDelta, RingMember, TableView};
use super::RoleConfig;

/// What applying a table did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The epoch the node held before (0: none).
    pub previous_epoch: u64,
    /// The epoch it holds now.
    pub epoch: u64,
    /// The version it holds now.
    pub version: u64,
}

/// Why a node did not apply a pushed table. None of these is an error of
/// the node: stale tables arrive late over a slow path, and the others are
/// a misconfigured or hostile peer.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TableRejected {
    /// The row is another node's.
    #[error("table row for node {row} pushed to node {me}")]
    WrongRow {
        /// This node.
        me: NodeId,
        /// The node the row is for.
        row: NodeId,
    },
    /// The sender does not own the table's epoch (or the table names
    /// another role server than its sender).
    #[error("table of role epoch {epoch} from node {from}, whose owner is {owner:?}")]
    NotOwner {
        /// The table's epoch.
        epoch: u64,
        /// The authenticated sender.
        from: NodeId,
        /// The epoch's owner by the candidates' order (`None` for epoch 0,
        /// and with [`Ownership::Elected`](super::Ownership::Elected),
        /// where the election, not the order, names it).
        owner: Option<NodeId>,
    },
    /// Not newer than the table held: `(epoch, version)` only goes up.
    #[error(
        "table ({epoch}, {version}) is not newer than the held ({held_epoch}, {held_version})"
    )]
    Stale {
        /// The table's epoch.
        epoch: u64,
        /// The table's version.
        version: u64,
        /// The held table's epoch.
        held_epoch: u64,
        /// The held table's version.
        held_version: u64,
    },
    /// A row whose ring comes as changes to a ring this node does not hold
    /// (it missed a change, or holds none), or that do not make the ring
    /// they name: the role server sends the whole row when the node's
    /// acknowledgement shows what it holds.
    #[error("table ({epoch}, {version}) changes a ring this node does not hold")]
    RingNotHeld {
        /// The table's epoch.
        epoch: u64,
        /// The table's version.
        version: u64,
    },
}

/// Rings a node keeps to apply ring changes against: the server names
/// the ring it last saw acknowledged, and a newer version may already have
/// arrived meanwhile.
const RING_HISTORY: usize = 8;

/// The table a node holds and the rule for replacing it.
#[derive(Clone, Debug)]
pub struct TableGate {
    cfg: RoleConfig,
    me: NodeId,
    current: Option<TableView>,
    /// The last distinct rings held, by digest, oldest first.
    rings: VecDeque<(u64, Vec<RingMember>)>,
}

impl TableGate {
    /// A node holding no table yet.
    pub fn new(cfg: RoleConfig, me: NodeId) -> Self {
        TableGate {
            cfg,
            me,
            current: None,
            rings: VecDeque::new(),
        }
    }

    /// The table held, if any.
    pub fn current(&self) -> Option<&TableView> {
        self.current.as_ref()
    }

    /// `(epoch, version)` held; `(0, 0)` for none.
    pub fn held(&self) -> (u64, u64) {
        self.current
            .as_ref()
            .map_or((0, 0), |t| (t.epoch, t.version))
    }

    /// A table row the authenticated node `from` pushed. Applied only if it
    /// is this node's row, `from` owns its epoch, and it is newer than the
    /// one held.
    pub fn apply(&mut self, from: NodeId, view: TableView) -> Result<Applied, TableRejected> {
        if view.node != self.me {
            return Err(TableRejected::WrongRow {
                me: self.me,
                row: view.node,
            });
        }
        if !self.cfg.may_own(from, view.epoch) || view.role != from {
            return Err(TableRejected::NotOwner {
                epoch: view.epoch,
                from,
                owner: match self.cfg.ownership {
                    super::Ownership::CandidateOrder => self.cfg.owner(view.epoch),
                    super::Ownership::Elected => None,
                },
            });
        }
        let (held_epoch, held_version) = self.held();
        if (view.epoch, view.version) <= (held_epoch, held_version) {
            return Err(TableRejected::Stale {
                epoch: view.epoch,
                version: view.version,
                held_epoch,
                held_version,
            });
        }
        let applied = Applied {
            previous_epoch: held_epoch,
            epoch: view.epoch,
            version: view.version,
        };
        let digest = ring_digest(&view.ring);
        if self.rings.back().is_none_or(|(d, _)| *d != digest) {
            if self.rings.len() == RING_HISTORY {
                self.rings.pop_front();
            }
            self.rings.push_back((digest, view.ring.clone()));
        }
        self.current = Some(view);
        Ok(applied)
    }

    /// A row whose ring comes as changes
    /// ([`RoleMessage::TableRingDelta`]): applied as [`TableGate::apply`]
    /// with the ring the changes make of their base ring — if this node
    /// held that ring lately (its last few distinct rings are kept: a
    /// newer version may have arrived after the acknowledgement the server
    /// went by) and they make the ring they name.
    ///
    /// [`RoleMessage::TableRingDelta`]: super::RoleMessage::TableRingDelta
    pub fn apply_ring_delta(
        &mut self,
        from: NodeId,
        mut view: TableView,
        delta: &RingDelta,
    ) -> Result<Applied, TableRejected> {
        let ring = self
            .rings
            .iter()
            .rev()
            .find(|(d, _)| *d == delta.base)
            .and_then(|(_, base)| delta.apply_to(base));
        let Some(ring) = ring else {
            return Err(TableRejected::RingNotHeld {
                epoch: view.epoch,
                version: view.version,
            });
        };
        view.ring = ring;
        self.apply(from, view)
    }
}
