//! Routing tables: computed from the matrix by the role server, one row
//! per node pushed to it.
//!
//! A table lists only the pairs that should *not* use every network alike
//! (the default: every network, equal weights): at a thousand nodes the
//! full pair list is a million entries, the exceptions a handful.

use std::collections::HashSet;
use std::time::Duration;

use crate::ids::NodeId;
use crate::time::Time;

use super::helpers::HelperEntry;
use super::matrix::{Matrix, PathStatus};
use super::{NetworkIndex, RoleConfig};

/// One network for one pair, in preference order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathChoice {
    /// The network.
    pub network: NetworkIndex,
    /// The role server's view of it (the worse of both ends' reports).
    pub status: PathStatus,
    /// Share of traffic among the `Up` choices (0 for the others: used only
    /// when no `Up` choice is left).
    pub weight: u8,
}

/// The networks `from` should use to reach `to`, best first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// Every network, best first.
    pub paths: Vec<PathChoice>,
}

impl Route {
    /// Whether `network` should carry new traffic from `from` to `to`:
    /// it is `Up`, or nothing is `Up` and it is the best left.
    pub fn usable(&self, network: NetworkIndex) -> bool {
        let any_up = self.paths.iter().any(|p| p.status == PathStatus::Up);
        match self.paths.iter().find(|p| p.network == network) {
            Some(p) if p.status == PathStatus::Up => true,
            Some(p) => !any_up && self.paths.first().is_some_and(|b| b.network == p.network),
            None => false,
        }
    }
}

/// A ring member's state as the role server sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberState {
    /// Reporting, not reported dead.
    Up = 0,
    /// Neither reporting nor reported dead (unknown).
    Suspect = 1,
    /// Reported dead by its peers' detectors.
    Down = 2,
}

impl MemberState {
    pub(crate) fn from_u8(v: u8) -> Option<MemberState> {
        match v {
            0 => Some(MemberState::Up),
            1 => Some(MemberState::Suspect),
            2 => Some(MemberState::Down),
            _ => None,
        }
    }
}

/// One node of the cache ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMember {
    /// The node.
    pub node: NodeId,
    /// Its state.
    pub state: MemberState,
}

/// A digest of a ring: FNV-1a over each member's id and state. A row that
/// carries its ring as changes ([`RingDelta`]) names by it the ring the
/// changes apply to and the ring they make, and a node uses the ring it
/// holds only if the digests agree — whatever the node applied in between
/// (another epoch, a restarted role server), it never pairs a row with a
/// ring it was not computed with.
pub fn ring_digest(ring: &[RingMember]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for m in ring {
        for b in m.node.0.to_be_bytes().into_iter().chain([m.state as u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// A row's ring as the changes to a ring the node holds
/// ([`RoleMessage::TableRingDelta`](super::RoleMessage::TableRingDelta)):
/// tens of bytes instead of 9 per cluster node when one member's state
/// changed, none when the ring did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingDelta {
    /// [`ring_digest`] of the ring the changes apply to.
    pub base: u64,
    /// The members whose state differs from the base ring's.
    pub changes: Vec<RingMember>,
    /// [`ring_digest`] of the ring they make.
    pub digest: u64,
}

impl RingDelta {
    /// The changes from `base` to `ring` (both the cluster's nodes in
    /// order), or `None` if their members differ.
    pub fn between(base: &[RingMember], ring: &[RingMember]) -> Option<RingDelta> {
        if base.len() != ring.len() || base.iter().zip(ring).any(|(a, b)| a.node != b.node) {
            return None;
        }
        Some(RingDelta {
            base: ring_digest(base),
            changes: base
                .iter()
                .zip(ring)
                .filter(|(a, b)| a.state != b.state)
                .map(|(_, b)| *b)
                .collect(),
            digest: ring_digest(ring),
        })
    }

    /// The ring these changes make of `held`, if `held` is their base and
    /// the result is the ring they name.
    pub fn apply_to(&self, held: &[RingMember]) -> Option<Vec<RingMember>> {
        if ring_digest(held) != self.base {
            return None;
        }
        let mut ring = held.to_vec();
        for c in &self.changes {
            ring.iter_mut().find(|m| m.node == c.node)?.state = c.state;
        }
        (ring_digest(&ring) == self.digest).then_some(ring)
    }
}

/// The whole cluster's table, as the role server holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingTable {
    /// The role server that computed it.
    pub role: NodeId,
    /// Its role epoch (the fencing token).
    pub epoch: u64,
    /// Increases with every change within the epoch.
    pub version: u64,
    /// Pairs that do not use every network alike, sorted by (from, to).
    pub routes: Vec<Route>,
    /// Every node, in the cluster file's order.
    pub ring: Vec<RingMember>,
    /// Helpers that reported lately, by node (`helpers.rs`).
    pub helpers: Vec<HelperEntry>,
}

impl RoutingTable {
    /// The ring member entry of `node`.
    pub fn member(&self, node: NodeId) -> Option<MemberState> {
        self.ring.iter().find(|m| m.node == node).map(|m| m.state)
    }

    /// `node`'s row: what is pushed to it.
    pub fn view_for(&self, node: NodeId) -> TableView {
        TableView {
            ring: self.ring.clone(),
            ..self.view_without_ring(node)
        }
    }

    /// `node`'s row with its ring left empty (for a node that holds it).
    pub fn view_without_ring(&self, node: NodeId) -> TableView {
        TableView {
            role: self.role,
            epoch: self.epoch,
            version: self.version,
            node,
            routes: self
                .routes
                .iter()
                .filter(|r| r.from == node)
                .cloned()
                .collect(),
            ring: Vec::new(),
            helpers: self.helpers.clone(),
        }
    }
}

/// One node's row of a table: the unit a role server pushes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableView {
    /// The role server that computed it.
    pub role: NodeId,
    /// Its role epoch.
    pub epoch: u64,
    /// The table's version within the epoch.
    pub version: u64,
    /// Whose row this is.
    pub node: NodeId,
    /// Routes from `node` that differ from the default, sorted by `to`.
    pub routes: Vec<Route>,
    /// The cache ring.
    pub ring: Vec<RingMember>,
    /// Helpers that reported lately, with their load levels, by node.
    pub helpers: Vec<HelperEntry>,
}

impl TableView {
    /// The helper listed at `addr`.
    pub fn helper_at(&self, addr: std::net::SocketAddr) -> Option<&HelperEntry> {
        self.helpers.iter().find(|h| h.addr == addr)
    }

    /// The route to `to`, if it is not the default.
    pub fn route_to(&self, to: NodeId) -> Option<&Route> {
        self.routes
            .binary_search_by_key(&to, |r| r.to)
            .ok()
            .and_then(|i| self.routes.get(i))
    }

    /// Whether `network` should carry new traffic to `to` (the default:
    /// every network).
    pub fn usable(&self, to: NodeId, network: NetworkIndex) -> bool {
        self.route_to(to).is_none_or(|r| r.usable(network))
    }

    /// The ring member entry of `node`.
    pub fn member(&self, node: NodeId) -> Option<MemberState> {
        self.ring.iter().find(|m| m.node == node).map(|m| m.state)
    }
}

/// One reporter's view of `from → to` on `network`, as the table counts it:
/// no report is no objection; a stale report is at best suspect.
fn one_side(
    m: &Matrix,
    now: Time,
    stale: Duration,
    from: NodeId,
    to: NodeId,
    network: NetworkIndex,
) -> (PathStatus, u32) {
    match m.entry(from, to, network) {
        None => (PathStatus::Up, 0),
        Some(e) if now.saturating_since(e.at) > stale => {
            (e.status.worst(PathStatus::Suspect), e.rtt_us)
        }
        Some(e) => (e.status, e.rtt_us),
    }
}

/// The route between `a` and `b` (from `a`), or `None` for the default.
fn route(
    cfg: &RoleConfig,
    m: &Matrix,
    deaf: &HashSet<(NodeId, NetworkIndex)>,
    muted: &HashSet<(NodeId, NetworkIndex)>,
    now: Time,
    a: NodeId,
    b: NodeId,
) -> Option<Route> {
    let stale = cfg.report_stale_after;
    let mut paths: Vec<(PathChoice, u32)> = (0..cfg.networks)
        .map(|n| {
            let (sa, ra) = one_side(m, now, stale, a, b, n);
            let (sb, rb) = one_side(m, now, stale, b, a, n);
            // A session path is a TCP connection: both directions must work,
            // and a node that hears nobody on a network cannot be reached
            // on it (nor answer on it).
            let mut status = sa.worst(sb);
            if deaf.contains(&(a, n)) || deaf.contains(&(b, n)) {
                status = PathStatus::Down;
            }
            if muted.contains(&(a, n)) || muted.contains(&(b, n)) {
                status = status.worst(PathStatus::Suspect);
            }
            let rtt = ra.max(rb);
            (
                PathChoice {
                    network: n,
                    status,
                    weight: 0,
                },
                rtt,
            )
        })
        .collect();
    if paths.iter().all(|(p, _)| p.status == PathStatus::Up) {
        return None;
    }
    paths.sort_by_key(|(p, rtt)| (p.status, *rtt, p.network));
    let best_rtt = paths
        .iter()
        .filter(|(p, rtt)| p.status == PathStatus::Up && *rtt > 0)
        .map(|(_, rtt)| *rtt)
        .min();
    for (p, rtt) in &mut paths {
        if p.status != PathStatus::Up {
            continue;
        }
        p.weight = match (best_rtt, *rtt) {
            (Some(best), r) if r > 0 => {
                u8::try_from((u64::from(best) * 255 / u64::from(r)).max(1)).unwrap_or(255)
            }
            _ => 255,
        };
    }
    Some(Route {
        from: a,
        to: b,
        paths: paths.into_iter().map(|(p, _)| p).collect(),
    })
}

/// Routes and ring computed from the matrix as of `now`. Only pairs the
/// matrix has something unusual about are looked at, so the cost follows
/// the faults, not the square of the cluster.
pub(crate) fn compute(cfg: &RoleConfig, m: &Matrix, now: Time) -> (Vec<Route>, Vec<RingMember>) {
    let stale = cfg.report_stale_after;
    let mut deaf = HashSet::new();
    for node in &cfg.nodes {
        for n in 0..cfg.networks {
            if m.deaf_on(now, stale, *node, n) {
                deaf.insert((*node, n));
            }
        }
    }
    let muted = m.muted(now, stale);
    let mut pairs: HashSet<(NodeId, NodeId)> = HashSet::new();
    for (a, b) in m.unusual_pairs(now, stale) {
        pairs.insert((a, b));
        pairs.insert((b, a));
    }
    for (d, _) in deaf.iter().chain(&muted) {
        for other in &cfg.nodes {
            pairs.insert((*d, *other));
            pairs.insert((*other, *d));
        }
    }
    let members: HashSet<NodeId> = cfg.nodes.iter().copied().collect();
    let mut routes: Vec<Route> = pairs
        .into_iter()
        .filter(|(a, b)| a != b && members.contains(a) && members.contains(b))
        .filter_map(|(a, b)| route(cfg, m, &deaf, &muted, now, a, b))
        .collect();
    routes.sort_by_key(|r| (r.from, r.to));
    // A dead report is SafeTimer's: the peer is fenced and sends nothing
    // more, so one fresh report is enough. A node reporting is up.
    let dead = m.reported_dead_by_fresh(now, stale);
    let ring = cfg
        .nodes
        .iter()
        .map(|n| RingMember {
            node: *n,
            state: if dead.contains_key(n) {
                MemberState::Down
            } else if m
                .last_report(*n)
                .is_some_and(|at| now.saturating_since(at) <= stale)
            {
                MemberState::Up
            } else {
                MemberState::Suspect
            },
        })
        .collect();
    (routes, ring)
}
