//! The role server of one epoch: reports in, table rows out.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use thiserror::Error;

use crate::ids::NodeId;
use crate::time::Time;

use super::codec::RoleMessage;
use super::helpers::{HelperEntry, HelperReport, HELPERS_HOLD_REFRESHES};
use super::matrix::{Matrix, StatusReport};
use super::table::{
    compute, ring_digest, MemberState, RingDelta, RingMember, RoutingTable, TableView,
};
use super::{RoleConfig, RoleConfigError};

/// A row to send: the shell sends [`Push::into_message`] to `to` on its
/// session, or applies it locally when `to` is this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    /// The node.
    pub to: NodeId,
    /// Its row of the current table; the ring left empty when
    /// `ring_delta` is set.
    pub view: TableView,
    /// The ring as changes to the one `to` acknowledged in this epoch
    /// (none if the ring did not change), when the server still knows that
    /// ring ([`RoleMessage::TableRingDelta`]). Never set once
    /// [`RoleServer::send_rows_whole`] is called.
    pub ring_delta: Option<RingDelta>,
}

impl Push {
    /// The message to send: the row whole, or with its ring as changes to
    /// the ring the node holds.
    pub fn into_message(self) -> RoleMessage {
        match self.ring_delta {
            None => RoleMessage::Table(self.view),
            Some(ring) => RoleMessage::TableRingDelta {
                view: self.view,
                ring,
            },
        }
    }
}

/// Rings of recent versions kept to send changes against: a node that
/// acknowledged an older one gets its row whole.
const RING_HISTORY: usize = 8;

/// A ring the table had from version `since` on.
#[derive(Clone, Debug)]
struct RingVersion {
    since: u64,
    digest: u64,
    ring: Vec<RingMember>,
}

/// What reaches a role server from the nodes, through the shell: the
/// input of a role server run outside the shell's own role task (an
/// external backend such as etcd; [`RoleServer::handle_input`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleInput {
    /// A status report from the authenticated node `from`.
    Report {
        /// The authenticated sender (the session's peer).
        from: NodeId,
        /// Its report.
        report: StatusReport,
    },
    /// A node restarted (a new process epoch).
    NodeRestarted(NodeId),
    /// A helper's report from the authenticated node `from`.
    HelperReport {
        /// The authenticated sender.
        from: NodeId,
        /// Its report.
        report: HelperReport,
    },
}

/// Something the role server's owner should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleEvent {
    /// The table changed; its new version.
    TableChanged {
        /// The new version.
        version: u64,
    },
    /// This process missed its `t_valid` (the SafeTimer fence): it pushes
    /// nothing more in this epoch, for good.
    Fenced,
    /// A node holds a table of a newer epoch: another candidate took over,
    /// and this server stops.
    SteppedDown {
        /// The newer epoch.
        newer: u64,
    },
}

/// A report the role server refused.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ReportRejected {
    /// The report names another reporter than the authenticated sender.
    #[error("report names node {named} but came from node {from}")]
    NotReporter {
        /// The authenticated sender.
        from: NodeId,
        /// The node the report names.
        named: NodeId,
    },
    /// The sender is not a node of the cluster.
    #[error("node {0} is not in the cluster file")]
    UnknownNode(NodeId),
}

#[derive(Clone, Copy, Debug, Default)]
struct NodePush {
    /// Version the node acknowledged in this epoch.
    acked: u64,
    /// Digest of that version's ring, if still in the history.
    ring: Option<u64>,
    /// When its row last went out.
    last: Option<Time>,
}

/// The role server of one epoch on one node.
#[derive(Debug)]
pub struct RoleServer {
    cfg: RoleConfig,
    matrix: Matrix,
    table: RoutingTable,
    dirty: bool,
    nodes: HashMap<NodeId, NodePush>,
    due: VecDeque<NodeId>,
    /// Nodes the current table marks down.
    down: HashSet<NodeId>,
    /// The last rings, oldest first; the current one last.
    rings: VecDeque<RingVersion>,
    /// Changes from a base ring (by digest) to the current one, as sent.
    deltas: HashMap<u64, RingDelta>,
    /// Rows always go whole (a store nodes read rows from later).
    whole_rows: bool,
    next_refresh: Time,
    /// Missed `t_valid` or stepped down: pushes nothing, for good.
    stopped: bool,
    events: VecDeque<RoleEvent>,
    /// Each helper's last report: (entry, seq, when it arrived).
    helpers: BTreeMap<NodeId, (HelperEntry, u64, Time)>,
    /// When a version last changed the helpers.
    helpers_at: Option<Time>,
}

impl RoleServer {
    /// The role server of `epoch` on node `me`, which must own that epoch.
    pub fn new(
        cfg: RoleConfig,
        me: NodeId,
        epoch: u64,
        now: Time,
    ) -> Result<Self, RoleConfigError> {
        cfg.validate()?;
        if !cfg.may_own(me, epoch) {
            return Err(RoleConfigError::NotOwner { node: me, epoch });
        }
        let nodes = cfg
            .nodes
            .iter()
            .map(|n| (*n, NodePush::default()))
            .collect();
        let table = RoutingTable {
            role: me,
            epoch,
            version: 0,
            routes: Vec::new(),
            ring: Vec::new(),
            helpers: Vec::new(),
        };
        Ok(RoleServer {
            next_refresh: now,
            cfg,
            matrix: Matrix::new(),
            table,
            dirty: true,
            nodes,
            due: VecDeque::new(),
            down: HashSet::new(),
            rings: VecDeque::new(),
            deltas: HashMap::new(),
            whole_rows: false,
            stopped: false,
            events: VecDeque::new(),
            helpers: BTreeMap::new(),
            helpers_at: None,
        })
    }

    /// The epoch this server pushes.
    pub fn epoch(&self) -> u64 {
        self.table.epoch
    }

    /// The current table (version 0 until the first push).
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// The matrix, for `surelink status`.
    pub fn matrix(&self) -> &Matrix {
        &self.matrix
    }

    /// Whether this server has stopped for good (fenced or stepped down).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// A report naming `named` may come only from that node, a node of
    /// the cluster file.
    fn check_sender(&self, from: NodeId, named: NodeId) -> Result<(), ReportRejected> {
        if named != from {
            return Err(ReportRejected::NotReporter { from, named });
        }
        if !self.nodes.contains_key(&from) {
            return Err(ReportRejected::UnknownNode(from));
        }
        Ok(())
    }

    /// A report that arrived from the authenticated node `from`.
    pub fn handle_report(
        &mut self,
        now: Time,
        from: NodeId,
        report: &StatusReport,
    ) -> Result<(), ReportRejected> {
        self.check_sender(from, report.reporter)?;
        self.handle_ack(from, report.held.0, report.held.1);
        // Only a change, or a reporter coming back from stale, can change
        // the table; time alone is the refresh timer's recompute.
        let was_fresh = self
            .matrix
            .last_report(from)
            .is_some_and(|at| now.saturating_since(at) <= self.cfg.report_stale_after);
        if let Some(changed) = self.matrix.record_changes(now, report) {
            if changed || !was_fresh {
                self.dirty = true;
            }
        }
        Ok(())
    }

    /// A helper's report (its address and load level) from the
    /// authenticated node `from`. Rows list the helpers that reported
    /// within `report_stale_after` and that the ring does not mark down;
    /// a change of their levels alone makes a new version at most once
    /// per [`HELPERS_HOLD_REFRESHES`] refreshes.
    pub fn handle_helper_report(
        &mut self,
        now: Time,
        from: NodeId,
        report: &HelperReport,
    ) -> Result<(), ReportRejected> {
        self.check_sender(from, report.helper)?;
        let entry = HelperEntry {
            node: from,
            addr: report.addr,
            level: report.level,
        };
        match self.helpers.get_mut(&from) {
            // An older report arriving late (over another path).
            Some((_, seq, _)) if *seq >= report.seq => {}
            Some((e, seq, at)) => {
                let was_fresh = now.saturating_since(*at) <= self.cfg.report_stale_after;
                if *e != entry || !was_fresh {
                    self.dirty = true;
                }
                *e = entry;
                *seq = report.seq;
                *at = now;
            }
            None => {
                self.helpers.insert(from, (entry, report.seq, now));
                self.dirty = true;
            }
        }
        Ok(())
    }

    /// One input: [`RoleServer::handle_report`],
    /// [`RoleServer::handle_node_restarted`] or
    /// [`RoleServer::handle_helper_report`].
    pub fn handle_input(&mut self, now: Time, input: &RoleInput) -> Result<(), ReportRejected> {
        match input {
            RoleInput::Report { from, report } => self.handle_report(now, *from, report),
            RoleInput::NodeRestarted(node) => {
                self.handle_node_restarted(*node);
                Ok(())
            }
            RoleInput::HelperReport { from, report } => {
                self.handle_helper_report(now, *from, report)
            }
        }
    }

    /// `node` restarted (a new process epoch): its report numbers start
    /// again and it holds no table.
    pub fn handle_node_restarted(&mut self, node: NodeId) {
        self.matrix.forget_reporter(node);
        // Its helper reports are numbered anew too (its entry stays until
        // it goes stale or the new process reports).
        if let Some((_, seq, _)) = self.helpers.get_mut(&node) {
            *seq = 0;
        }
        if let Some(p) = self.nodes.get_mut(&node) {
            *p = NodePush::default();
            self.due.push_back(node);
        }
        self.dirty = true;
    }

    /// The authenticated node `from` holds table `(epoch, version)`. A
    /// newer epoch — or a later version of this one than this server ever
    /// made, i.e. an earlier process of this node served the same epoch —
    /// stops this server: its candidacy claims a higher epoch.
    pub fn handle_ack(&mut self, from: NodeId, epoch: u64, version: u64) {
        let reused = epoch == self.table.epoch && version > self.table.version;
        if epoch > self.table.epoch || reused {
            if !self.stopped {
                self.stopped = true;
                self.events
                    .push_back(RoleEvent::SteppedDown { newer: epoch });
            }
            return;
        }
        if epoch == self.table.epoch {
            if let Some(p) = self.nodes.get_mut(&from) {
                if version > p.acked {
                    p.acked = version;
                    p.ring = self
                        .rings
                        .iter()
                        .rev()
                        .find(|r| r.since <= version)
                        .map(|r| r.digest);
                }
            }
        }
    }

    /// Recomputes the table from the matrix (reports go stale with time
    /// alone) and queues re-pushes to nodes that have not acknowledged.
    pub fn handle_timeout(&mut self, now: Time) {
        if now < self.next_refresh {
            return;
        }
        self.next_refresh = now + self.cfg.refresh;
        self.dirty = true;
        let stale = self.cfg.report_stale_after;
        for (node, p) in &self.nodes {
            // A node the table marks down that has not reported lately got
            // its row once with this version; re-sending every refresh to
            // the dead is waste. It gets the current row again when it
            // reports or restarts, or when the next version comes.
            let dead = self.down.contains(node)
                && self
                    .matrix
                    .last_report(*node)
                    .is_none_or(|at| now.saturating_since(at) > stale);
            if !dead
                && p.acked < self.table.version
                && p.last
                    .is_none_or(|t| now.saturating_since(t) >= self.cfg.refresh)
            {
                self.due.push_back(*node);
            }
        }
    }

    /// When to call [`RoleServer::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Time> {
        (!self.stopped).then_some(self.next_refresh)
    }

    /// The helpers that reported within `report_stale_after` and that
    /// `ring` does not mark down (their peers' detectors report them
    /// dead), by node.
    fn live_helpers(&self, now: Time, ring: &[RingMember]) -> Vec<HelperEntry> {
        self.helpers
            .values()
            .filter(|(e, _, at)| {
                now.saturating_since(*at) <= self.cfg.report_stale_after
                    && !ring
                        .iter()
                        .any(|m| m.node == e.node && m.state == MemberState::Down)
            })
            .map(|(e, _, _)| *e)
            .collect()
    }

    fn recompute(&mut self, now: Time) {
        self.dirty = false;
        let (routes, ring) = compute(&self.cfg, &self.matrix, now);
        let helpers = self.live_helpers(now, &ring);
        if self.table.version > 0 && routes == self.table.routes && ring == self.table.ring {
            if helpers == self.table.helpers {
                return;
            }
            // Only levels changed: each version is a push to every node,
            // so at most one such a hold (the refresh timer looks again).
            // A helper gone or come is news at once: a client must not
            // choose a dead one from its row.
            let same_helpers = helpers.len() == self.table.helpers.len()
                && helpers
                    .iter()
                    .zip(&self.table.helpers)
                    .all(|(a, b)| a.node == b.node && a.addr == b.addr);
            let hold = self.cfg.refresh * HELPERS_HOLD_REFRESHES;
            if same_helpers
                && self
                    .helpers_at
                    .is_some_and(|t| now.saturating_since(t) < hold)
            {
                return;
            }
        }
        if helpers != self.table.helpers {
            self.helpers_at = Some(now);
        }
        self.table.helpers = helpers;
        self.down = ring
            .iter()
            .filter(|m| m.state == MemberState::Down)
            .map(|m| m.node)
            .collect();
        self.table.version += 1;
        if self.table.version == 1 || ring != self.table.ring {
            if self.rings.len() == RING_HISTORY {
                self.rings.pop_front();
            }
            self.rings.push_back(RingVersion {
                since: self.table.version,
                digest: ring_digest(&ring),
                ring: ring.clone(),
            });
            self.deltas.clear();
        }
        self.table.routes = routes;
        self.table.ring = ring;
        self.events.push_back(RoleEvent::TableChanged {
            version: self.table.version,
        });
        self.due.clear();
        self.due.extend(self.cfg.nodes.iter().copied());
    }

    /// The next row to send. `t_valid` is this process's SafeTimer fence
    /// ([`Fence::t_valid`](crate::detector::Fence::t_valid); `None` once
    /// fenced): nothing goes out at or after it, and a server that once
    /// finds itself past it stops for good — a candidate may already have
    /// taken over.
    pub fn poll_push(&mut self, now: Time, t_valid: Option<Time>) -> Option<Push> {
        if self.stopped {
            return None;
        }
        if t_valid.is_none_or(|t| now >= t) {
            self.stopped = true;
            self.due.clear();
            self.events.push_back(RoleEvent::Fenced);
            return None;
        }
        if self.dirty {
            self.recompute(now);
        }
        while let Some(node) = self.due.pop_front() {
            let Some(p) = self.nodes.get_mut(&node) else {
                continue;
            };
            if p.acked >= self.table.version {
                continue;
            }
            p.last = Some(now);
            let delta = p.ring.filter(|_| !self.whole_rows).and_then(|base| {
                if let Some(d) = self.deltas.get(&base) {
                    return Some(d.clone());
                }
                let (old, current) = (
                    self.rings.iter().find(|r| r.digest == base)?,
                    self.rings.back()?,
                );
                let d = RingDelta::between(&old.ring, &current.ring)?;
                self.deltas.insert(base, d.clone());
                Some(d)
            });
            return Some(match delta {
                Some(d) => Push {
                    to: node,
                    view: self.table.view_without_ring(node),
                    ring_delta: Some(d),
                },
                None => Push {
                    to: node,
                    view: self.table.view_for(node),
                    ring_delta: None,
                },
            });
        }
        None
    }

    /// Every row from now on goes whole, its ring in it: for a store that
    /// keeps rows for nodes to read later (etcd), where a reader may hold
    /// no ring.
    pub fn send_rows_whole(&mut self) {
        self.whole_rows = true;
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<RoleEvent> {
        self.events.pop_front()
    }
}
