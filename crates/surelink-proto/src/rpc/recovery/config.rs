//! What a recovery-conscious scheduler is told: its worker pools, the
//! service's recovery groups, and the mapping between them.

use std::time::Duration;

/// A recovery group: the unit of a localized recovery (the paper's γ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u16);

/// A worker pool (the paper's ρ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u16);

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {}", self.0)
    }
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pool {}", self.0)
    }
}

/// How groups are mapped to pools (the paper's three, and its baseline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mapping {
    /// The baseline: every pool serves every group, no bound per group,
    /// no suspension (one shared job queue, in effect).
    PerformanceOriented,
    /// A group runs on its home pools only, within its bound σ.
    Static,
    /// Home pools first; a pool that would idle lends itself for one
    /// dispatch to any group that is not `isolated` (past σ if need be);
    /// isolated groups keep to their homes and σ.
    PartiallyDynamic,
    /// Any pool serves any group, each group within its bound σ.
    #[default]
    Dynamic,
}

/// What happens to a group's queued tasks once its recovery is over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryPolicy {
    /// They are dispatched again, in their order (the paper's re-drive).
    #[default]
    Redrive,
    /// They are handed back to be failed to their callers with a typed
    /// error.
    Fail,
}

/// One recovery group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupConfig {
    /// For events and metrics.
    pub name: String,
    /// σ: the most of its tasks running at once (`None`: the mapping's
    /// default, see [`RecoveryConfig::sigma_of`]).
    pub sigma: Option<usize>,
    /// Its home pools under the static and partially dynamic mappings
    /// (empty: pool `index mod pools`).
    pub home: Vec<PoolId>,
    /// Under the partially dynamic mapping: never lent other pools, never
    /// past σ (the paper's candidates for strict isolation).
    pub isolated: bool,
    /// Groups whose recovery suspends this one too (a dependency the
    /// service knows of).
    pub suspended_by: Vec<GroupId>,
    /// What becomes of its queued tasks after a recovery.
    pub policy: RecoveryPolicy,
    /// Whether its running tasks are cancelled when it enters recovery
    /// (default: they run to their end). The scheduler only carries it:
    /// cancelling is the driver's.
    pub cancel_running: bool,
}

impl GroupConfig {
    /// A group called `name` with the defaults.
    pub fn new(name: impl Into<String>) -> Self {
        GroupConfig {
            name: name.into(),
            ..GroupConfig::default()
        }
    }
}

/// Pools, groups and the mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryConfig {
    /// Workers per pool.
    pub pools: Vec<usize>,
    /// The groups, [`GroupId`] `i` being the `i`th.
    pub groups: Vec<GroupConfig>,
    /// The mapping.
    pub mapping: Mapping,
    /// Within a group, how long a normal task waits at most behind
    /// high-priority ones (hr-net's aging bound).
    pub aging_bound: Duration,
}

/// Why a [`RecoveryConfig`] is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryConfigError {
    /// No pool, or a pool without workers.
    #[error("every pool needs at least one worker, and there must be a pool")]
    NoWorkers,
    /// No group.
    #[error("there must be at least one recovery group")]
    NoGroups,
    /// More groups or pools than ids.
    #[error("at most 65 536 groups and pools")]
    TooMany,
    /// A group's σ of zero would never run it.
    #[error("{0}: sigma must be at least 1")]
    ZeroSigma(GroupId),
    /// A home pool that does not exist.
    #[error("{group}: home {pool} does not exist")]
    NoSuchPool {
        /// The group.
        group: GroupId,
        /// Its home.
        pool: PoolId,
    },
    /// A suspending group that does not exist.
    #[error("{group}: suspended by {other}, which does not exist")]
    NoSuchGroup {
        /// The group.
        group: GroupId,
        /// The one it names.
        other: GroupId,
    },
}

impl RecoveryConfig {
    /// `pools` pools of `workers` each, one group per name, the dynamic
    /// mapping, hr-net's 50 ms aging bound.
    pub fn new(pools: usize, workers: usize, groups: &[&str]) -> Self {
        RecoveryConfig {
            pools: vec![workers; pools],
            groups: groups.iter().map(|n| GroupConfig::new(*n)).collect(),
            mapping: Mapping::default(),
            aging_bound: Duration::from_millis(50),
        }
    }

    /// Workers in all pools.
    pub fn workers(&self) -> usize {
        self.pools.iter().sum()
    }

    /// The home pools of group `i`.
    pub fn homes(&self, i: usize) -> Vec<PoolId> {
        match self.groups.get(i) {
            Some(g) if !g.home.is_empty() => g.home.clone(),
            _ => {
                let n = self.pools.len().max(1);
                vec![PoolId(u16::try_from(i % n).unwrap_or(0))]
            }
        }
    }

    /// Group `i`'s σ: its own, else under the static mapping its home
    /// pools' workers, under the others half of all workers (at least 1:
    /// no group alone can take the server), and no bound for the baseline.
    pub fn sigma_of(&self, i: usize) -> usize {
        if self.mapping == Mapping::PerformanceOriented {
            return usize::MAX;
        }
        if let Some(s) = self.groups.get(i).and_then(|g| g.sigma) {
            return s;
        }
        match self.mapping {
            Mapping::Static => self
                .homes(i)
                .iter()
                .map(|p| self.pools.get(usize::from(p.0)).copied().unwrap_or(0))
                .sum::<usize>()
                .max(1),
            _ => (self.workers() / 2).max(1),
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), RecoveryConfigError> {
        if self.pools.is_empty() || self.pools.contains(&0) {
            return Err(RecoveryConfigError::NoWorkers);
        }
        if self.groups.is_empty() {
            return Err(RecoveryConfigError::NoGroups);
        }
        if self.groups.len() > usize::from(u16::MAX) || self.pools.len() > usize::from(u16::MAX) {
            return Err(RecoveryConfigError::TooMany);
        }
        for (i, g) in self.groups.iter().enumerate() {
            let group = GroupId(u16::try_from(i).unwrap_or(u16::MAX));
            if g.sigma == Some(0) {
                return Err(RecoveryConfigError::ZeroSigma(group));
            }
            if let Some(&pool) = g.home.iter().find(|p| usize::from(p.0) >= self.pools.len()) {
                return Err(RecoveryConfigError::NoSuchPool { group, pool });
            }
            if let Some(&other) = g
                .suspended_by
                .iter()
                .find(|o| usize::from(o.0) >= self.groups.len())
            {
                return Err(RecoveryConfigError::NoSuchGroup { group, other });
            }
        }
        Ok(())
    }
}
