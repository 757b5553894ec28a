//! The path-status matrix: what every node last reported of every peer on
//! every network, with the time it arrived.

use std::collections::HashMap;
use std::time::Duration;

use crate::ids::NodeId;
use crate::time::Time;

use super::{NetworkIndex, MAX_NETWORKS};

/// What a node sees of one path (itself to a peer on one network).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum PathStatus {
    /// Heard from recently and carrying traffic.
    Up = 0,
    /// Silent for a short window, timed out, or not yet reported: usable
    /// only when nothing better is.
    Suspect = 1,
    /// Reported failed by the detector (or refused connections).
    Down = 2,
}

impl PathStatus {
    pub(crate) fn from_u8(v: u8) -> Option<PathStatus> {
        match v {
            0 => Some(PathStatus::Up),
            1 => Some(PathStatus::Suspect),
            2 => Some(PathStatus::Down),
            _ => None,
        }
    }

    /// The worse of two views of one path.
    pub fn worst(self, other: PathStatus) -> PathStatus {
        self.max(other)
    }
}

/// One node's view of one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerReport {
    /// The peer.
    pub peer: NodeId,
    /// `false` once the detector reported the peer dead (SafeTimer: it is
    /// fenced, it sends nothing more).
    pub alive: bool,
    /// Per network (index = network): the path's status and smoothed round
    /// trip in microseconds (0 when unknown).
    pub networks: Vec<(PathStatus, u32)>,
}

/// Everything one node reports at once. A report replaces the reporter's
/// previous one as a whole. Only the unusual is listed: a watched peer
/// that is alive and up on every network is left out, so a healthy
/// cluster's reports are a few bytes whatever its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    /// Who reports; must be the authenticated sender.
    pub reporter: NodeId,
    /// Increases with each report of one reporter's process: an older
    /// report arriving late (over another path) is ignored.
    pub seq: u64,
    /// How many peers the reporter's detector watches (listed or not).
    pub watched: u32,
    /// The `(epoch, version)` of the table the reporter holds (`(0, 0)`:
    /// none): tells a role server, or a restarted candidate, of a newer
    /// epoch.
    pub held: (u64, u64),
    /// The reporter's view of each watched peer that is not alive and up
    /// on every network.
    pub peers: Vec<PeerReport>,
}

/// One cell of the matrix: a reporter's view of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixEntry {
    /// As reported.
    pub status: PathStatus,
    /// Smoothed round trip in microseconds (0 = unknown).
    pub rtt_us: u32,
    /// When the report holding it arrived.
    pub at: Time,
}

#[derive(Clone, Debug)]
struct PeerCell {
    alive: bool,
    nets: [Option<MatrixEntry>; MAX_NETWORKS],
}

impl PeerCell {
    /// The same view of the peer, whenever it was reported.
    fn same_view(&self, other: &PeerCell) -> bool {
        let view = |e: &Option<MatrixEntry>| e.map(|e| (e.status, e.rtt_us));
        self.alive == other.alive && self.nets.iter().map(view).eq(other.nets.iter().map(view))
    }
}

/// The matrix itself: reporter × peer × network.
#[derive(Clone, Debug, Default)]
pub struct Matrix {
    /// Reporter → peer → cell.
    cells: HashMap<NodeId, HashMap<NodeId, PeerCell>>,
    /// Per reporter: last report's sequence number, when it arrived, and
    /// how many peers it watches.
    last: HashMap<NodeId, (u64, Time, u32)>,
}

impl Matrix {
    /// An empty matrix.
    pub fn new() -> Self {
        Matrix::default()
    }

    /// Records a report that arrived at `now`; `false` if it was older than
    /// one already recorded (nothing changes then).
    pub fn record(&mut self, now: Time, report: &StatusReport) -> bool {
        self.record_changes(now, report).is_some()
    }

    /// [`Matrix::record`], telling whether the table could change: `None`
    /// for a report older than one recorded, `Some(true)` when the
    /// reporter's row (peers, alive, statuses, RTTs) or watched count
    /// differ from its last report's.
    pub fn record_changes(&mut self, now: Time, report: &StatusReport) -> Option<bool> {
        let last = self.last.get(&report.reporter).copied();
        if last.is_some_and(|(seq, _, _)| report.seq <= seq) {
            return None;
        }
        self.last
            .insert(report.reporter, (report.seq, now, report.watched));
        let mut row = HashMap::with_capacity(report.peers.len());
        for p in report.peers.iter().filter(|p| p.peer != report.reporter) {
            let mut nets = [None; MAX_NETWORKS];
            for (slot, (status, rtt_us)) in nets.iter_mut().zip(&p.networks) {
                *slot = Some(MatrixEntry {
                    status: *status,
                    rtt_us: *rtt_us,
                    at: now,
                });
            }
            row.insert(
                p.peer,
                PeerCell {
                    alive: p.alive,
                    nets,
                },
            );
        }
        let old = self.cells.insert(report.reporter, row);
        let same_row = old.as_ref().is_some_and(|old| {
            let new = &self.cells[&report.reporter];
            old.len() == new.len()
                && old
                    .iter()
                    .all(|(peer, c)| new.get(peer).is_some_and(|n| n.same_view(c)))
        });
        Some(last.map(|(_, _, w)| w) != Some(report.watched) || !same_row)
    }

    /// Forgets a reporter's sequence numbers (its process restarted with a
    /// new epoch: its reports start again from 0).
    pub fn forget_reporter(&mut self, reporter: NodeId) {
        self.last.remove(&reporter);
        self.cells.remove(&reporter);
    }

    /// What `from` last reported of its path to `to` on `network`.
    pub fn entry(&self, from: NodeId, to: NodeId, network: NetworkIndex) -> Option<MatrixEntry> {
        self.cells
            .get(&from)?
            .get(&to)?
            .nets
            .get(usize::from(network))
            .copied()
            .flatten()
    }

    /// When `reporter`'s last report arrived.
    pub fn last_report(&self, reporter: NodeId) -> Option<Time> {
        self.last.get(&reporter).map(|(_, at, _)| *at)
    }

    /// Whether `node` hears nobody on `network`: its fresh report says
    /// every live peer it watches (at least one) is down there. Its peers
    /// may still hear *it* (a one-way fault into the node), so only this
    /// tells them not to send to it on that network.
    pub fn deaf_on(
        &self,
        now: Time,
        stale_after: Duration,
        node: NodeId,
        network: NetworkIndex,
    ) -> bool {
        let Some((_, at, watched)) = self.last.get(&node) else {
            return false;
        };
        if now.saturating_since(*at) > stale_after {
            return false;
        }
        let (mut dead, mut down) = (0u32, 0u32);
        for cell in self
            .cells
            .get(&node)
            .into_iter()
            .flat_map(|row| row.values())
        {
            if !cell.alive {
                dead += 1;
            } else if cell
                .nets
                .get(usize::from(network))
                .copied()
                .flatten()
                .is_some_and(|e| e.status == PathStatus::Down)
            {
                down += 1;
            }
        }
        down > 0 && down >= watched.saturating_sub(dead)
    }

    /// `(node, network)` pairs some peer stopped hearing: a fresh reporter
    /// that still hears someone else on the network (it is not deaf there)
    /// reports the node down on it. Most likely the node's own link fails
    /// outwards there (nothing it sends leaves), so its other peers — idle
    /// ones notice only after their own, longer windows — are told to
    /// prefer another network; one witness cannot tell that from a fault
    /// of the pair alone, so the table makes such paths `Suspect` (avoided
    /// while another network is up), not `Down`.
    pub(crate) fn muted(
        &self,
        now: Time,
        stale_after: Duration,
    ) -> std::collections::HashSet<(NodeId, NetworkIndex)> {
        let mut out = std::collections::HashSet::new();
        for (from, row) in &self.cells {
            if self
                .last_report(*from)
                .is_none_or(|at| now.saturating_since(at) > stale_after)
            {
                continue;
            }
            for (to, cell) in row {
                if !cell.alive {
                    continue;
                }
                for (n, e) in cell.nets.iter().enumerate() {
                    let Ok(n) = NetworkIndex::try_from(n) else {
                        continue;
                    };
                    if e.is_some_and(|e| e.status == PathStatus::Down)
                        && !self.deaf_on(now, stale_after, *from, n)
                    {
                        out.insert((*to, n));
                    }
                }
            }
        }
        out
    }

    /// Nodes some fresh reporter reports dead.
    pub(crate) fn reported_dead_by_fresh(
        &self,
        now: Time,
        stale_after: Duration,
    ) -> HashMap<NodeId, u32> {
        let mut out = HashMap::new();
        for (from, row) in &self.cells {
            let fresh = self
                .last_report(*from)
                .is_some_and(|at| now.saturating_since(at) <= stale_after);
            if !fresh {
                continue;
            }
            for (to, cell) in row {
                if !cell.alive {
                    *out.entry(*to).or_insert(0) += 1;
                }
            }
        }
        out
    }

    /// The pairs `(reporter, peer)` whose cell says anything but "up on
    /// every network", or whose reporter's report is stale: the only pairs
    /// that can differ from the default route.
    pub(crate) fn unusual_pairs(&self, now: Time, stale_after: Duration) -> Vec<(NodeId, NodeId)> {
        let mut out = Vec::new();
        for (from, row) in &self.cells {
            let stale = self
                .last_report(*from)
                .is_none_or(|at| now.saturating_since(at) > stale_after);
            for (to, cell) in row {
                let unusual = stale
                    || cell
                        .nets
                        .iter()
                        .flatten()
                        .any(|e| e.status != PathStatus::Up);
                if unusual {
                    out.push((*from, *to));
                }
            }
        }
        out
    }

    /// Every cell, for `surelink status`: (reporter, peer, network, entry).
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, NodeId, NetworkIndex, MatrixEntry)> + '_ {
        self.cells.iter().flat_map(|(from, row)| {
            row.iter().flat_map(move |(to, cell)| {
                cell.nets.iter().enumerate().filter_map(move |(i, e)| {
                    let e = (*e)?;
                    Some((*from, *to, NetworkIndex::try_from(i).ok()?, e))
                })
            })
        })
    }
}
