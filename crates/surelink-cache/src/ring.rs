//! Consistent hashing of keys onto cache nodes (ketama-style: points per
//! node on a 64-bit circle; a key goes to the first point at or after its
//! hash). A node taken out of the ring gives its keys to the next points
//! only — the other nodes' keys stay where they are — and gets them back
//! when it returns. Every proxy computes the same ring from the same node
//! list (the hash is FNV-1a, stable across processes).

use std::collections::BTreeSet;

use surelink::proto::NodeId;

use crate::store::key_hash;

/// Points per node on the circle: enough that three nodes split keys
/// within a few percent of a third each.
const POINTS: u32 = 160;

/// The ring of one proxy.
#[derive(Clone, Debug)]
pub struct Ring {
    /// Every configured node's points, sorted.
    points: Vec<(u64, NodeId)>,
    /// Nodes out of the ring (reported dead).
    ejected: BTreeSet<NodeId>,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finalizer: spreads FNV's low-entropy high bits.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where a key lands on the circle.
pub fn key_point(key: &[u8]) -> u64 {
    mix(key_hash(key))
}

impl Ring {
    /// The ring over `nodes` (order does not matter).
    pub fn new(nodes: &[NodeId]) -> Ring {
        let mut points: Vec<(u64, NodeId)> = nodes
            .iter()
            .flat_map(|&n| {
                (0..POINTS).map(move |i| {
                    let name = format!("node-{}-{i}", n.0);
                    (key_point(name.as_bytes()), n)
                })
            })
            .collect();
        points.sort_unstable();
        points.dedup_by_key(|p| p.0);
        Ring {
            points,
            ejected: BTreeSet::new(),
        }
    }

    /// The node serving `key`, skipping ejected nodes; `None` when every
    /// node is out.
    pub fn node_for(&self, key: &[u8]) -> Option<NodeId> {
        let h = key_point(key);
        let start = self.points.partition_point(|p| p.0 < h);
        let n = self.points.len();
        (0..n)
            .map(|i| self.points[(start + i) % n].1)
            .find(|node| !self.ejected.contains(node))
    }

    /// The `n` nodes holding `key` in a replicated pool: the first `n`
    /// distinct nodes from its point on, in or out of the ring (a key
    /// never moves to a node outside these, so no other node can hold
    /// an old copy of it).
    pub fn replicas(&self, key: &[u8], n: usize) -> Vec<NodeId> {
        let h = key_point(key);
        let start = self.points.partition_point(|p| p.0 < h);
        let len = self.points.len();
        let mut out: Vec<NodeId> = Vec::with_capacity(n);
        for i in 0..len {
            let node = self.points[(start + i) % len].1;
            if !out.contains(&node) {
                out.push(node);
                if out.len() == n {
                    break;
                }
            }
        }
        out
    }

    /// The nodes a command for `key` skipped to reach `node`: those
    /// before it from the key's point on (out of the ring, if `node` is
    /// where [`Ring::node_for`] sends it).
    pub fn skipped(&self, key: &[u8], node: NodeId) -> Vec<NodeId> {
        let h = key_point(key);
        let start = self.points.partition_point(|p| p.0 < h);
        let len = self.points.len();
        let mut out: Vec<NodeId> = Vec::new();
        for i in 0..len {
            let n = self.points[(start + i) % len].1;
            if n == node {
                break;
            }
            if !out.contains(&n) {
                out.push(n);
            }
        }
        out
    }

    /// Takes `node` out (true if it was in).
    pub fn eject(&mut self, node: NodeId) -> bool {
        self.ejected.insert(node)
    }

    /// Puts `node` back (true if it was out).
    pub fn restore(&mut self, node: NodeId) -> bool {
        self.ejected.remove(&node)
    }

    /// Whether `node` is out of the ring.
    pub fn is_ejected(&self, node: NodeId) -> bool {
        self.ejected.contains(&node)
    }

    /// Nodes out of the ring.
    pub fn ejected(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.ejected.iter().copied()
    }

    /// Every node of the ring, in or out.
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.points.iter().map(|p| p.1).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_and_only_an_ejected_nodes_keys_move() {
        let nodes = [NodeId(1), NodeId(2), NodeId(3)];
        let mut ring = Ring::new(&nodes);
        let keys: Vec<String> = (0..30_000).map(|i| format!("key:{i}")).collect();
        let before: Vec<NodeId> = keys
            .iter()
            .map(|k| ring.node_for(k.as_bytes()).unwrap())
            .collect();
        for n in nodes {
            let share = before.iter().filter(|&&x| x == n).count() as f64 / keys.len() as f64;
            assert!(
                (0.25..0.42).contains(&share),
                "node {n} holds {share:.3} of keys"
            );
        }
        assert!(ring.eject(NodeId(2)));
        for (k, was) in keys.iter().zip(&before) {
            let now = ring.node_for(k.as_bytes()).unwrap();
            if *was == NodeId(2) {
                assert_ne!(now, NodeId(2));
            } else {
                assert_eq!(now, *was, "{k} moved although its node stayed");
            }
        }
        assert!(ring.restore(NodeId(2)));
        for (k, was) in keys.iter().zip(&before) {
            assert_eq!(ring.node_for(k.as_bytes()).unwrap(), *was);
        }
        for n in nodes {
            ring.eject(n);
        }
        assert_eq!(ring.node_for(b"x"), None);
    }

    #[test]
    fn every_proxy_builds_the_same_ring() {
        let a = Ring::new(&[NodeId(3), NodeId(1), NodeId(2)]);
        let b = Ring::new(&[NodeId(1), NodeId(2), NodeId(3)]);
        for i in 0..1000 {
            let k = format!("k{i}");
            assert_eq!(a.node_for(k.as_bytes()), b.node_for(k.as_bytes()));
        }
    }
}
