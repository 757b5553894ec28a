//! A role-server candidate: a lease, and a campaign in etcd's election.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use surelink_proto::role::{RoleConfig, RoleConfigError};
use surelink_proto::NodeId;
use thiserror::Error;
use tokio::time::{timeout, Instant};

use crate::config::{EtcdConfigError, EtcdRoleConfig};
use crate::leader::Leader;
use crate::lease::Lease;

/// A candidate or a watcher could not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The etcd configuration cannot work.
    #[error(transparent)]
    Config(#[from] EtcdConfigError),
    /// The role configuration cannot work.
    #[error(transparent)]
    Role(#[from] RoleConfigError),
    /// This node is not one of the role configuration's candidates.
    #[error("node {0} is not a role-server candidate")]
    NotCandidate(NodeId),
    /// The client could not be set up (bad endpoint, …).
    #[error("connecting to etcd: {0}")]
    Connect(#[source] etcd_client::Error),
    /// etcd refused the lease.
    #[error("granting the lease: {0}")]
    LeaseGrant(#[source] etcd_client::Error),
    /// etcd granted a TTL that is no lease (zero or negative).
    #[error("etcd granted a lease TTL of {0} s")]
    LeaseTtl(i64),
    /// etcd did not answer in time.
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
}

/// A campaign ended without winning.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CampaignError {
    /// The campaign request failed (the lease is revoked: campaign again
    /// with a new candidate).
    #[error("campaign: {0}")]
    Etcd(#[source] etcd_client::Error),
    /// etcd says the lease is gone (expired while unreachable, or revoked).
    #[error("the candidate's lease expired or was revoked")]
    LeaseLost,
    /// etcd's answer carries no leader key.
    #[error("etcd's campaign answer carries no leader key")]
    NoLeaderKey,
    /// The leader key's revision is no epoch (not positive).
    #[error("the leader key's revision {0} is no role epoch")]
    BadRevision(i64),
    /// The role server could not be set up.
    #[error(transparent)]
    Role(#[from] RoleConfigError),
}

/// A client for `cfg`'s endpoints (the configuration is validated).
pub(crate) async fn connect_client(cfg: &EtcdRoleConfig) -> Result<Client, ConnectError> {
    cfg.validate()?;
    // HTTP/2 keep-alives: a connection cut without a reset (a dead link,
    // a dropped route) fails its requests and watches within about two
    // request timeouts instead of hanging until TCP gives up; a watcher
    // then reads its row anew on a fresh connection.
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.connect_timeout)
        .with_keep_alive(cfg.request_timeout, cfg.request_timeout)
        .with_keep_alive_while_idle(true);
    if let Some(t) = &cfg.tls {
        opts = opts.with_tls(t.options());
    }
    if let Some(a) = &cfg.auth {
        // etcd's tokens expire (5 min by default); a long-lived role
        // service fetches a new one when a request meets an expired one.
        opts = opts
            .with_user(a.user.clone(), a.password.clone())
            .with_auto_token_refresh(true);
    }
    timeout(
        cfg.connect_timeout,
        Client::connect(&cfg.endpoints, Some(opts)),
    )
    .await
    .map_err(|_| ConnectError::Timeout(cfg.connect_timeout))?
    .map_err(ConnectError::Connect)
}

/// A role-server candidate: holds a lease kept alive by a task, and
/// campaigns with it. Dropping it stops the keep-alives (the lease runs
/// out after its TTL, as if the process had died);
/// [`Candidate::withdraw`] revokes it at once.
pub struct Candidate {
    cfg: EtcdRoleConfig,
    role: RoleConfig,
    me: NodeId,
    client: Client,
    lease: Lease,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("me", &self.me)
            .field("lease", &self.lease)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Candidate {
    /// Connects to etcd and grants this candidate's lease. `me` must be
    /// one of `role.candidates` (their order plays no part: etcd's election
    /// decides).
    pub async fn connect(
        cfg: EtcdRoleConfig,
        role: RoleConfig,
        me: NodeId,
    ) -> Result<Candidate, ConnectError> {
        cfg.validate()?;
        role.validate()?;
        if role.candidate_index(me).is_none() {
            return Err(ConnectError::NotCandidate(me));
        }
        let client = connect_client(&cfg).await?;
        let lease = Lease::grant(
            &client,
            cfg.ttl_secs(),
            cfg.keepalive_every,
            cfg.margin,
            cfg.connect_timeout,
        )
        .await?;
        Ok(Candidate {
            cfg,
            role,
            me,
            client,
            lease,
        })
    }

    /// This candidate's node.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// The lease's id.
    pub fn lease_id(&self) -> i64 {
        self.lease.id
    }

    /// The TTL etcd granted.
    pub fn lease_ttl(&self) -> Duration {
        self.lease.clock.ttl()
    }

    /// When the newest acknowledged keep-alive (or the grant) was sent.
    pub fn last_acked_keepalive(&self) -> Instant {
        self.lease.clock.last_acked_sent()
    }

    /// Until when the lease surely lives: the newest acknowledged
    /// keep-alive's send time + TTL − margin; `None` once etcd said it is
    /// gone.
    pub fn t_valid(&self) -> Option<Instant> {
        self.lease.clock.t_valid()
    }

    /// Waits until this candidate leads the election (etcd's `Campaign`:
    /// the lowest create revision among the candidates' keys leads), then
    /// returns the leader, whose epoch is its key's create revision. On
    /// failure the lease is revoked, so a key left behind blocks nobody.
    pub async fn campaign(self) -> Result<Leader, CampaignError> {
        let Candidate {
            cfg,
            role,
            me,
            client,
            lease,
        } = self;
        let mut ec = client.election_client();
        let mut lost = lease.clock.lost_signal();
        let answer = tokio::select! {
            r = ec.campaign(cfg.election_name(), me.0.to_string(), lease.id) => {
                r.map_err(CampaignError::Etcd)
            }
            _ = async { drop(lost.wait_for(|l| *l).await) } => Err(CampaignError::LeaseLost),
        };
        let won = answer.and_then(|resp| {
            let key = resp.leader().ok_or(CampaignError::NoLeaderKey)?;
            let epoch = u64::try_from(key.rev())
                .ok()
                .filter(|e| *e > 0)
                .ok_or(CampaignError::BadRevision(key.rev()))?;
            Ok((key.key().to_vec(), epoch))
        });
        match won {
            Ok((key, epoch)) => Leader::new(cfg, role, me, client, lease, key, epoch),
            Err(e) => {
                lease.revoke(&client, cfg.request_timeout).await;
                Err(e)
            }
        }
    }

    /// Leaves the race: revokes the lease (its key, if any, goes at once).
    pub async fn withdraw(self) {
        self.lease
            .revoke(&self.client, self.cfg.request_timeout)
            .await;
    }
}
