//! Which table rows read from etcd a node applies.

use surelink_proto::role::{Applied, Ownership, RoleConfig, TableGate, TableRejected, TableView};
use surelink_proto::NodeId;

/// The node's side of the etcd backend: applies a row only if it is this
/// node's, names one of the configured candidates as its role server, and
/// its `(epoch, version)` is newer than the row held. Epochs are election
/// revisions here, so the epochs a node applies never go back and it
/// never applies two leaders' tables interleaved.
///
/// Who wrote a row is not checked against the candidates' order, as
/// [`TableGate`] does for tables pushed over sessions: in etcd, ownership
/// is the election's ([`Ownership::Elected`]). A row reached etcd only
/// through a transaction that held the election key of revision `epoch`,
/// so its epoch names its writer.
#[derive(Clone, Debug)]
pub struct ElectedGate {
    inner: TableGate,
}

impl ElectedGate {
    /// A node holding no table yet.
    pub fn new(role: RoleConfig, me: NodeId) -> Self {
        let cfg = RoleConfig {
            ownership: Ownership::Elected,
            ..role
        };
        ElectedGate {
            inner: TableGate::new(cfg, me),
        }
    }

    /// `(epoch, version)` held; `(0, 0)` for none.
    pub fn held(&self) -> (u64, u64) {
        self.inner.held()
    }

    /// The row held, if any.
    pub fn current(&self) -> Option<&TableView> {
        self.inner.current()
    }

    /// A row read from etcd: its writer is the role server it names.
    pub fn apply(&mut self, view: TableView) -> Result<Applied, TableRejected> {
        let role = view.role;
        self.inner.apply(role, view)
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
            helpers: Vec::new(),
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
