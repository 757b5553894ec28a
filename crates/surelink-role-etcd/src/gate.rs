//! Which table rows read from etcd a node applies.

use surelink_proto::role::{Applied, RoleConfig, TableGate, TableRejected, TableView};
use surelink_proto::NodeId;

/// The node's side of the etcd backend: applies a row only if it is this
/// node's, names one of the configured candidates as its role server, and
/// its `(epoch, version)` is newer than the row held. Epochs are election
/// revisions here, so the epochs a node applies never go back and it
/// never applies two leaders' tables interleaved.
///
/// Who wrote a row is not checked against the candidates' order, as
/// [`TableGate`] does for tables pushed over sessions: in etcd, ownership
/// is the election's. A row reached etcd only through a transaction that
/// held the election key of revision `epoch`, so its epoch names its
/// writer. This gate wraps a [`TableGate`] whose candidate list is the
/// row's role server alone (so the core's owner check is the identity)
/// and keeps the held `(epoch, version)` across role servers itself.
#[derive(Clone, Debug)]
pub struct ElectedGate {
    role: RoleConfig,
    me: NodeId,
    /// The core gate for the role server of the held row.
    inner: Option<(NodeId, TableGate)>,
    held: (u64, u64),
}

impl ElectedGate {
    /// A node holding no table yet.
    pub fn new(role: RoleConfig, me: NodeId) -> Self {
        ElectedGate {
            role,
            me,
            inner: None,
            held: (0, 0),
        }
    }

    /// `(epoch, version)` held; `(0, 0)` for none.
    pub fn held(&self) -> (u64, u64) {
        self.held
    }

    /// The row held, if any.
    pub fn current(&self) -> Option<&TableView> {
        self.inner.as_ref().and_then(|(_, g)| g.current())
    }

    /// A row read from etcd.
    pub fn apply(&mut self, view: TableView) -> Result<Applied, TableRejected> {
        if view.node != self.me {
            return Err(TableRejected::WrongRow {
                me: self.me,
                row: view.node,
            });
        }
        if self.role.candidate_index(view.role).is_none() {
            return Err(TableRejected::NotOwner {
                epoch: view.epoch,
                from: view.role,
                owner: None,
            });
        }
        let (held_epoch, held_version) = self.held;
        if (view.epoch, view.version) <= (held_epoch, held_version) {
            return Err(TableRejected::Stale {
                epoch: view.epoch,
                version: view.version,
                held_epoch,
                held_version,
            });
        }
        let role = view.role;
        let gate = match &mut self.inner {
            Some((r, g)) if *r == role => g,
            inner => {
                let cfg = RoleConfig {
                    candidates: vec![role],
                    ..self.role.clone()
                };
                &mut inner.insert((role, TableGate::new(cfg, self.me))).1
            }
        };
        let applied = gate.apply(role, view)?;
        self.held = (applied.epoch, applied.version);
        Ok(Applied {
            previous_epoch: held_epoch,
            ..applied
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RoleConfig {
        RoleConfig {
            nodes: (1..=4).map(NodeId).collect(),
            candidates: vec![NodeId(1), NodeId(2)],
            ..RoleConfig::default()
        }
    }

    fn row(role: u64, epoch: u64, version: u64, node: u64) -> TableView {
        TableView {
            role: NodeId(role),
            epoch,
            version,
            node: NodeId(node),
            routes: Vec::new(),
            ring: Vec::new(),
        }
    }

    #[test]
    fn applies_newer_rows_across_leaders_and_never_goes_back() {
        let mut g = ElectedGate::new(cfg(), NodeId(3));
        assert_eq!(g.held(), (0, 0));
        // Revision 17 is odd, 42 even: the candidates' order plays no part.
        let a = g.apply(row(1, 17, 1, 3)).expect("first row");
        assert_eq!((a.previous_epoch, a.epoch, a.version), (0, 17, 1));
        g.apply(row(1, 17, 2, 3)).expect("next version");
        let b = g.apply(row(2, 42, 1, 3)).expect("newer leader");
        assert_eq!((b.previous_epoch, b.epoch, b.version), (17, 42, 1));
        assert!(matches!(
            g.apply(row(1, 17, 9, 3)),
            Err(TableRejected::Stale { epoch: 17, .. })
        ));
        assert!(matches!(
            g.apply(row(2, 42, 1, 3)),
            Err(TableRejected::Stale { .. })
        ));
        // The old leader again, elected anew: a new revision.
        let c = g.apply(row(1, 50, 1, 3)).expect("re-elected");
        assert_eq!(c.previous_epoch, 42);
        assert_eq!(g.held(), (50, 1));
        assert_eq!(g.current().map(|v| v.role), Some(NodeId(1)));
    }

    #[test]
    fn rejects_other_rows_and_non_candidates() {
        let mut g = ElectedGate::new(cfg(), NodeId(3));
        assert!(matches!(
            g.apply(row(1, 5, 1, 4)),
            Err(TableRejected::WrongRow { .. })
        ));
        assert!(matches!(
            g.apply(row(3, 5, 1, 3)),
            Err(TableRejected::NotOwner { owner: None, .. })
        ));
        assert_eq!(g.held(), (0, 0));
    }
}
