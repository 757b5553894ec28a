//! Keys written to a node other than their own (`replicas = 1`): while a
//! node is out of the ring its keys go to the next node, and the copies
//! written there stay behind when it returns. Were it to fail again, its
//! keys would go there again and find those copies — values older than
//! what was written to it meanwhile. So the proxy remembers which keys it
//! wrote where, and once the node is back deletes them (or, past
//! [`MAX_STRAYS`] keys, empties the node that held them).
//!
//! Each proxy cleans up what it wrote itself: another proxy's copies are
//! that proxy's.

use std::collections::{HashMap, HashSet};

use bytes::{Bytes, BytesMut};
use surelink::proto::NodeId;

use crate::text::Command;

/// Keys remembered per absent node; beyond, the nodes that took its keys
/// are emptied when it returns instead.
pub(super) const MAX_STRAYS: usize = 100_000;

/// What one absent node's keys left on other nodes.
#[derive(Debug, Default)]
pub(super) struct Left {
    /// Keys per node that took them.
    pub(super) keys: HashMap<NodeId, HashSet<Bytes>>,
    /// Nodes to empty instead (too many keys to remember).
    pub(super) flush: HashSet<NodeId>,
    count: usize,
}

/// Every absent node's [`Left`].
#[derive(Debug, Default)]
pub(super) struct Strays {
    by_owner: HashMap<NodeId, Left>,
}

impl Strays {
    /// `key`, whose own node is `owner`, was written on `at`.
    pub(super) fn record(&mut self, owner: NodeId, at: NodeId, key: &Bytes) {
        let left = self.by_owner.entry(owner).or_default();
        if left.flush.contains(&at) {
            return;
        }
        if left.count >= MAX_STRAYS {
            left.keys.remove(&at);
            left.flush.insert(at);
            return;
        }
        if left.keys.entry(at).or_default().insert(key.clone()) {
            left.count += 1;
        }
    }

    /// What `owner`'s absence left, forgotten here.
    pub(super) fn take(&mut self, owner: NodeId) -> Left {
        self.by_owner.remove(&owner).unwrap_or_default()
    }
}

/// The request deleting `key` on a node (a binary key in base64, as the
/// text protocol cannot carry it).
pub(super) fn delete(key: &Bytes) -> Bytes {
    let binary = key.iter().any(|&b| b <= b' ' || b == 0x7f);
    let mut out = BytesMut::new();
    let _ = Command::TooLarge {
        key: key.clone(),
        unlink: true,
        noreply: false,
        base64: binary,
    }
    .encode(&mut out);
    out.freeze()
}

/// Whether `cmd` may leave a copy of its key on the node it runs on.
pub(super) fn writes(cmd: &Command) -> bool {
    use crate::text::meta::MetaOp;
    match cmd {
        Command::Store { .. } | Command::Arith { .. } | Command::Touch { .. } => true,
        Command::Meta(m) => match m.op {
            MetaOp::Set | MetaOp::Arith => true,
            MetaOp::Get => m.opts.vivify.is_some(),
            MetaOp::Delete => m.opts.invalidate,
            MetaOp::Debug => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strays_are_remembered_per_owner_and_bounded() {
        let mut s = Strays::default();
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        s.record(a, b, &Bytes::from_static(b"k1"));
        s.record(a, b, &Bytes::from_static(b"k1"));
        s.record(a, c, &Bytes::from_static(b"k2"));
        s.record(b, c, &Bytes::from_static(b"k3"));
        let left = s.take(a);
        assert_eq!(left.keys[&b].len(), 1);
        assert_eq!(left.keys[&c].len(), 1);
        assert!(s.take(a).keys.is_empty());
        for i in 0..=MAX_STRAYS {
            s.record(a, b, &Bytes::from(format!("k{i}")));
        }
        let left = s.take(a);
        assert!(left.flush.contains(&b) && !left.keys.contains_key(&b));
        assert_eq!(&delete(&Bytes::from_static(b"a b"))[..], b"md YSBi b\r\n");
        assert_eq!(&delete(&Bytes::from_static(b"ab"))[..], b"delete ab\r\n");
    }
}
