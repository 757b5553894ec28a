//! The elected role server: the core's [`RoleServer`] for the election's
//! epoch, its rows written to etcd in transactions fenced on the election.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use surelink_proto::role::{
    encode, Ownership, Push, ReportRejected, RoleConfig, RoleEvent, RoleInput, RoleMessage,
    RoleServer, RoutingTable, StatusReport,
};
use surelink_proto::{NodeId, Time};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use crate::candidate::CampaignError;
use crate::config::{EtcdRoleConfig, MAX_TXN_BYTES};
use crate::lease::Lease;

/// Why a leader stopped, for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderEnd {
    /// Its `t_valid` passed (keep-alives unacknowledged: cut off from
    /// etcd, or etcd said the lease is gone): another candidate may win
    /// from then on.
    Fenced,
    /// A write's condition failed: its election key is gone (the lease
    /// expired) or was replaced; another candidate may already lead.
    LostElection,
    /// A node holds a table of a newer epoch.
    SteppedDown {
        /// The newer epoch.
        newer: u64,
    },
    /// [`Leader::run`] was stopped, or its inputs ended (the endpoint shut
    /// down): the leader revoked its lease.
    Resigned,
}

/// A publishing round that wrote nothing it should have.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The leader has stopped, for good.
    #[error("the leader stopped: {0:?}")]
    Ended(LeaderEnd),
    /// A write failed; its rows go out again on the next refresh.
    #[error("writing the table: {0}")]
    Etcd(#[source] etcd_client::Error),
    /// A write got no answer in time (it may or may not have applied; its
    /// rows go out again on the next refresh).
    #[error("writing the table: no answer within {0:?}")]
    Timeout(Duration),
}

/// What one publishing round wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Rows written.
    pub rows: usize,
    /// The table version they carry.
    pub version: u64,
    /// etcd's revision after the last transaction (none if nothing was due).
    pub revision: Option<i64>,
}

/// Counters and times of one leader, for tests and measurements.
#[derive(Clone, Copy, Debug)]
pub struct LeaderStats {
    /// When the campaign was won.
    pub won_at: Instant,
    /// Transactions that applied.
    pub txns: u64,
    /// Rows written by them.
    pub rows: u64,
    /// When the first transaction that applied was sent.
    pub first_write_sent: Option<Instant>,
    /// When the last transaction that applied was sent.
    pub last_write_sent: Option<Instant>,
    /// etcd's revision after the first one that applied.
    pub first_revision: Option<i64>,
    /// etcd's revision after the last one that applied.
    pub last_revision: Option<i64>,
    /// Transactions that failed or got no answer.
    pub failed: u64,
}

/// The role server while this candidate leads the election.
///
/// The shell feeds it the nodes' reports ([`Leader::handle_report`]) and
/// calls [`Leader::publish`] (or hands both to [`Leader::run`]); each
/// changed row is put under `<prefix>/table/<node>`, encoded as
/// [`RoleMessage::Table`], in a transaction that applies only while the
/// election key still has the create revision that is this leader's epoch.
/// Nothing is sent at or after [`Leader::t_valid`]; past it, or once a
/// condition fails, the leader stops for good.
pub struct Leader {
    cfg: EtcdRoleConfig,
    me: NodeId,
    /// Every node (for [`Leader::write_ignoring_t_valid`]).
    #[cfg(feature = "test-util")]
    nodes: Vec<NodeId>,
    client: Client,
    lease: Lease,
    key: Vec<u8>,
    epoch: u64,
    server: RoleServer,
    origin: Instant,
    ended: Option<LeaderEnd>,
    stats: LeaderStats,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("me", &self.me)
            .field("epoch", &self.epoch)
            .field("lease", &self.lease)
            .field("ended", &self.ended)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Leader {
    pub(crate) fn new(
        cfg: EtcdRoleConfig,
        role: RoleConfig,
        me: NodeId,
        client: Client,
        lease: Lease,
        key: Vec<u8>,
        epoch: u64,
    ) -> Result<Leader, CampaignError> {
        let origin = Instant::now();
        // The election decides who owns an epoch, not the candidates'
        // order: the core's elected ownership.
        let server_cfg = RoleConfig {
            ownership: Ownership::Elected,
            ..role
        };
        #[cfg(feature = "test-util")]
        let nodes = server_cfg.nodes.clone();
        let mut server = RoleServer::new(server_cfg, me, epoch, Time::ZERO)?;
        // Rows stay in etcd for nodes that read them later (a restarted
        // watcher holds no ring): each one whole.
        server.send_rows_whole();
        Ok(Leader {
            cfg,
            me,
            #[cfg(feature = "test-util")]
            nodes,
            client,
            lease,
            key,
            epoch,
            server,
            origin,
            ended: None,
            stats: LeaderStats {
                won_at: origin,
                txns: 0,
                rows: 0,
                first_write_sent: None,
                last_write_sent: None,
                first_revision: None,
                last_revision: None,
                failed: 0,
            },
        })
    }

    fn time(&self, at: Instant) -> Time {
        Time::from_nanos(nanos(at.saturating_duration_since(self.origin)))
    }

    fn instant(&self, t: Time) -> Instant {
        self.origin + t.since_origin()
    }

    /// This leader's node.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// The role epoch: the election key's create revision.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The election key this leader holds.
    pub fn leader_key(&self) -> &[u8] {
        &self.key
    }

    /// Until when this leader may write: the newest acknowledged
    /// keep-alive's send time + TTL − margin (`None` once etcd said the
    /// lease is gone).
    pub fn t_valid(&self) -> Option<Instant> {
        self.lease.clock.t_valid()
    }

    /// When the newest acknowledged keep-alive was sent.
    pub fn last_acked_keepalive(&self) -> Instant {
        self.lease.clock.last_acked_sent()
    }

    /// The TTL etcd granted.
    pub fn lease_ttl(&self) -> Duration {
        self.lease.clock.ttl()
    }

    /// The current table (version 0 until the first round).
    pub fn table(&self) -> &RoutingTable {
        self.server.table()
    }

    /// The role server, for `surelink status`.
    pub fn server(&self) -> &RoleServer {
        &self.server
    }

    /// Why the leader stopped, once it has.
    pub fn ended(&self) -> Option<LeaderEnd> {
        self.ended
    }

    /// Counters and times.
    pub fn stats(&self) -> LeaderStats {
        self.stats
    }

    /// A report from the authenticated node `from` (carried by surelink's
    /// sessions: etcd holds tables, not reports or heartbeats).
    pub fn handle_report(
        &mut self,
        from: NodeId,
        report: &StatusReport,
    ) -> Result<(), ReportRejected> {
        let now = self.now();
        self.server.handle_report(now, from, report)
    }

    /// One input from the shell: a report or a node's restart.
    pub fn handle_input(&mut self, input: &RoleInput) -> Result<(), ReportRejected> {
        let now = self.now();
        self.server.handle_input(now, input)
    }

    /// Now on the role server's clock (the matrix's ages are on it).
    pub fn now(&self) -> Time {
        self.time(Instant::now())
    }

    /// `node` restarted: its row goes out again.
    pub fn handle_node_restarted(&mut self, node: NodeId) {
        self.server.handle_node_restarted(node);
    }

    /// When the next round is due (the refresh, or `t_valid`).
    pub fn next_wakeup(&self) -> Option<Instant> {
        let refresh = self.server.poll_timeout().map(|t| self.instant(t))?;
        Some(self.t_valid().map_or(refresh, |tv| refresh.min(tv)))
    }

    /// Records the first reason the leader stopped; the error carries this one.
    fn end(&mut self, why: LeaderEnd) -> PublishError {
        if self.ended.is_none() {
            tracing::info!(node = %self.me, epoch = self.epoch, "role leader stops: {why:?}");
            self.ended = Some(why);
        }
        PublishError::Ended(why)
    }

    /// One round: recomputes the table, and writes the rows that are due
    /// (changed, or not yet written) in transactions conditioned on the
    /// election. Each one goes out only before `t_valid`.
    pub async fn publish(&mut self) -> Result<Published, PublishError> {
        if let Some(end) = self.ended {
            return Err(PublishError::Ended(end));
        }
        let now = self.time(Instant::now());
        let t_valid = self.t_valid().map(|t| self.time(t));
        self.server.handle_timeout(now);
        let mut rows = Vec::new();
        while let Some(push) = self.server.poll_push(now, t_valid) {
            rows.push(push);
        }
        while let Some(ev) = self.server.poll_event() {
            match ev {
                RoleEvent::Fenced => return Err(self.end(LeaderEnd::Fenced)),
                RoleEvent::SteppedDown { newer } => {
                    return Err(self.end(LeaderEnd::SteppedDown { newer }))
                }
                RoleEvent::TableChanged { .. } => {}
            }
        }
        let mut out = Published {
            rows: 0,
            version: self.server.table().version,
            revision: None,
        };
        for chunk in chunks(&self.cfg, rows) {
            out.revision = Some(self.write(&chunk, true).await?);
            out.rows += chunk.len();
        }
        Ok(out)
    }

    /// Writes `rows` in one conditioned transaction; acknowledges them to
    /// the role server once it applied. `fenced`: refuse at or after
    /// `t_valid`, and bound the wait by it.
    async fn write(&mut self, rows: &[(Push, Vec<u8>)], fenced: bool) -> Result<i64, PublishError> {
        let puts: Vec<TxnOp> = rows
            .iter()
            .map(|(p, bytes)| TxnOp::put(self.cfg.table_key(p.to), bytes.clone(), None))
            .collect();
        let rev = i64::try_from(self.epoch).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then(puts);
        let sent = Instant::now();
        if fenced && self.t_valid().is_none_or(|tv| sent >= tv) {
            return Err(self.end(LeaderEnd::Fenced));
        }
        let wait = self.cfg.request_timeout;
        let deadline = sent + wait;
        let mut kv = self.client.kv_client();
        let answer = kv.txn(txn);
        tokio::pin!(answer);
        // Waiting for the answer ends at `t_valid` too (re-read: keep-alives
        // acknowledged meanwhile move it on): a leader that cannot hear etcd
        // stops then. The transaction may still apply later, but only while
        // the election key lives, i.e. before anyone else is elected.
        let resp = loop {
            let until = match self.t_valid() {
                Some(tv) if fenced => tv.min(deadline),
                None if fenced => deadline.min(Instant::now()),
                _ => deadline,
            };
            tokio::select! {
                r = &mut answer => break r,
                _ = sleep_until(until) => {
                    let now = Instant::now();
                    if fenced && self.t_valid().is_none_or(|tv| now >= tv) {
                        self.stats.failed += 1;
                        return Err(self.end(LeaderEnd::Fenced));
                    }
                    if now >= deadline {
                        self.stats.failed += 1;
                        return Err(PublishError::Timeout(wait));
                    }
                }
            }
        };
        let resp = match resp {
            Ok(resp) => resp,
            Err(e) => {
                self.stats.failed += 1;
                return Err(PublishError::Etcd(e));
            }
        };
        if !resp.succeeded() {
            self.stats.failed += 1;
            return Err(self.end(LeaderEnd::LostElection));
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        for (p, _) in rows {
            self.server.handle_ack(p.to, p.view.epoch, p.view.version);
        }
        let s = &mut self.stats;
        s.txns += 1;
        s.rows += u64::try_from(rows.len()).unwrap_or(u64::MAX);
        s.first_write_sent.get_or_insert(sent);
        s.last_write_sent = Some(sent);
        s.first_revision.get_or_insert(revision);
        s.last_revision = Some(revision);
        Ok(revision)
    }

    /// Runs the leader: inputs in (the reports a candidate's endpoint
    /// receives, [`surelink::ExternalRole::take_inputs`]), rows out on every
    /// change and refresh, until it stops, or until `inputs` ends (the
    /// endpoint shut down: [`LeaderEnd::Resigned`]); then revokes its lease
    /// (best effort), so the next candidate need not wait for the TTL.
    /// `stop` resolving ends it the same way (the shell's shutdown).
    /// `after_round` sees the leader after each round (for its status).
    pub async fn run(
        mut self,
        inputs: &mut mpsc::Receiver<RoleInput>,
        stop: impl std::future::Future<Output = ()>,
        mut after_round: impl FnMut(&Leader),
    ) -> LeaderEnd {
        let mut lost = self.lease.clock.lost_signal();
        tokio::pin!(stop);
        loop {
            let wake = self.next_wakeup().unwrap_or_else(Instant::now);
            tokio::select! {
                r = inputs.recv() => match r {
                    Some(input) => {
                        // Every input already queued, then one round: under
                        // a flood of reports, one write per round trip.
                        let mut next = Some(input);
                        while let Some(input) = next {
                            if let Err(e) = self.handle_input(&input) {
                                tracing::debug!("role report refused: {e}");
                            }
                            next = inputs.try_recv().ok();
                        }
                    }
                    None => {
                        self.resign().await;
                        return LeaderEnd::Resigned;
                    }
                },
                _ = sleep_until(wake) => {}
                _ = async { drop(lost.wait_for(|l| *l).await) } => {}
                () = &mut stop => {
                    self.resign().await;
                    return LeaderEnd::Resigned;
                }
            }
            let round = self.publish().await;
            after_round(&self);
            match round {
                Ok(_) => {}
                Err(PublishError::Ended(end)) => {
                    self.resign().await;
                    return end;
                }
                Err(e) => tracing::warn!(node = %self.me, epoch = self.epoch, "{e}"),
            }
        }
    }

    /// Stops for good and revokes the lease (best effort): the election key
    /// goes at once and the next candidate wins.
    pub async fn resign(self) {
        let wait = self.cfg.request_timeout;
        self.lease.revoke(&self.client, wait).await;
    }

    /// Tests only: writes every node's row of the current table in the
    /// same conditioned transaction, ignoring `t_valid` and whether the
    /// leader stopped. `Ok(false)`: etcd refused it (the condition failed).
    #[cfg(feature = "test-util")]
    pub async fn write_ignoring_t_valid(&mut self) -> Result<bool, PublishError> {
        let table = self.server.table().clone();
        let rows: Vec<Push> = self
            .nodes
            .iter()
            .map(|&n| Push {
                to: n,
                view: table.view_for(n),
                ring_delta: None,
            })
            .collect();
        let ended = self.ended;
        let mut ok = true;
        for chunk in chunks(&self.cfg, rows) {
            match self.write(&chunk, false).await {
                Ok(_) => {}
                Err(PublishError::Ended(LeaderEnd::LostElection)) => ok = false,
                Err(e) => return Err(e),
            }
        }
        self.ended = ended.or(self.ended);
        Ok(ok)
    }
}

/// Encodes rows and groups them into transactions of at most
/// `max_txn_ops` rows and [`MAX_TXN_BYTES`] bytes.
fn chunks(cfg: &EtcdRoleConfig, rows: Vec<Push>) -> Vec<Vec<(Push, Vec<u8>)>> {
    let mut out: Vec<Vec<(Push, Vec<u8>)>> = Vec::new();
    let mut bytes = 0;
    for p in rows {
        let mut b = Vec::new();
        encode(&RoleMessage::Table(p.view.clone()), &mut b);
        let full = out
            .last()
            .is_none_or(|c| c.len() >= cfg.max_txn_ops || bytes + b.len() > MAX_TXN_BYTES);
        if full {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += b.len();
        if let Some(c) = out.last_mut() {
            c.push((p, b));
        }
    }
    out
}
