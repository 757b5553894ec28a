//! Recovery-conscious scheduling (Seshadri et al., FAST '08): a server's
//! handlers are sorted into *recovery groups* — the unit of a localized
//! recovery — and its workers into *pools*; the scheduler decides which
//! pool may run which group's tasks, and stops dispatching a group while
//! it recovers, so one failing part of a server keeps its recovery (and
//! the work piling up behind it) to the workers it is allowed, and the
//! other groups keep theirs.
//!
//! - **Proactive**: a group never has more than its bound σ of tasks
//!   running ([`RecoveryConfig::sigma_of`]); which pools serve it is the
//!   [`Mapping`] — static (its home pools), partially dynamic (home pools,
//!   plus any pool that would otherwise idle, for one dispatch, unless the
//!   group is `isolated`), dynamic (any pool, within σ) — or the baseline,
//!   performance-oriented (any pool, no bound, no suspension). A pool
//!   serves its groups round robin; within a group, hr-net's priority
//!   queues ([`PriorityScheduler`]: high first, the aging bound, round
//!   robin per session) decide.
//! - **Reactive**: a group enters recovery when one of its tasks fails
//!   ([`TaskOutcome::Failed`]: a panic or a fatal error) or the service
//!   says so ([`RecoveryScheduler::enter_recovery`]). Its queued tasks,
//!   and those of every group it suspends, stop being dispatched; its
//!   running ones finish or are cancelled by the driver. When none runs,
//!   [`GroupEvent::CleanUp`] asks the driver to run the clean-up blocks
//!   its tasks registered; once done ([`RecoveryScheduler::handle_cleanup_done`])
//!   the queued tasks are re-driven or handed back to be failed, per the
//!   group's [`RecoveryPolicy`].
//!
//! Sans-IO, like the rest of the core: every input carries `now`; the
//! driver (the shell's worker pools, or the simulator's virtual ones)
//! asks for a pool's next task when one of its workers is idle, and says
//! how each task ended. What it does not do: run tasks, keep time, or
//! decide what a clean-up does.

mod config;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::Duration;

pub use config::{
    GroupConfig, GroupId, Mapping, PoolId, RecoveryConfig, RecoveryConfigError, RecoveryPolicy,
};

use super::sched::{Dispatch, PriorityScheduler, Scheduler, TicketKey};
use super::Priority;
use crate::time::Time;

/// How a dispatched task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskOutcome {
    /// It ran to the end (a handler's ordinary error included).
    Completed,
    /// It panicked or returned a fatal error: its group enters recovery.
    Failed,
    /// The driver cancelled it (its group is recovering).
    Cancelled,
}

/// What the scheduler tells its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupEvent {
    /// `group` entered recovery at `at`: its queued tasks (and those of
    /// the groups it suspends) are held; `running` of its tasks still run
    /// (let them finish, or cancel them).
    RecoveryStarted {
        /// The group.
        group: GroupId,
        /// Its tasks running then.
        running: usize,
        /// When.
        at: Time,
    },
    /// None of `group`'s tasks runs any more: run its clean-up blocks,
    /// then call [`RecoveryScheduler::handle_cleanup_done`].
    CleanUp {
        /// The group.
        group: GroupId,
    },
    /// `group` is back to normal after `took`; under
    /// [`RecoveryPolicy::Fail`] `failed` of its queued tasks were handed
    /// back ([`RecoveryScheduler::poll_failed`]).
    Recovered {
        /// The group.
        group: GroupId,
        /// Time in recovery.
        took: Duration,
        /// Tasks handed back to be failed.
        failed: usize,
    },
}

/// A task leaving the scheduler for a worker of `pool`.
#[derive(Debug, PartialEq, Eq)]
pub struct Task<T> {
    /// Its group.
    pub group: GroupId,
    /// The pool whose worker runs it.
    pub pool: PoolId,
    /// What was queued.
    pub dispatch: Dispatch<T>,
}

/// A task for a group that does not exist, handed back.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownGroup<T> {
    /// The group named.
    pub group: GroupId,
    /// The task.
    pub item: T,
}

impl<T> std::fmt::Display for UnknownGroup<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no recovery group {}", self.group.0)
    }
}

impl<T: std::fmt::Debug> std::error::Error for UnknownGroup<T> {}

/// Why [`RecoveryScheduler::handle_cleanup_done`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CleanupError {
    /// The group does not exist or is not recovering.
    #[error("{0} is not recovering")]
    NotRecovering(GroupId),
    /// Its clean-up was not asked for yet: some of its tasks still run.
    #[error("{group} still has {running} tasks running; clean up after they end")]
    StillRunning {
        /// The group.
        group: GroupId,
        /// Its tasks running.
        running: usize,
    },
}

/// A group's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupState {
    /// Dispatched as its mapping allows.
    Normal,
    /// Recovering since `since`: nothing of it is dispatched.
    Recovering {
        /// When it began.
        since: Time,
        /// Whether its clean-up was asked for (no task of it runs).
        cleaning: bool,
    },
}

/// A group's figures, for metrics and events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// Its state.
    pub state: GroupState,
    /// Whether another group's recovery holds it.
    pub suspended: bool,
    /// Tasks waiting.
    pub queued: usize,
    /// Tasks running (workers it holds).
    pub running: usize,
    /// Its bound σ.
    pub sigma: usize,
    /// Tasks dispatched so far.
    pub dispatched: u64,
    /// Tasks that failed.
    pub failed: u64,
    /// Recoveries begun.
    pub recoveries: u64,
    /// Time spent in recovery, the current one up to the last input.
    pub in_recovery: Duration,
    /// Tasks handed back to be failed after recoveries.
    pub handed_back: u64,
}

struct Group<T> {
    queue: Box<dyn Scheduler<T>>,
    sigma: usize,
    isolated: bool,
    suspended_by: Vec<usize>,
    policy: RecoveryPolicy,
    running: usize,
    state: GroupState,
    dispatched: u64,
    failed: u64,
    recoveries: u64,
    in_recovery: Duration,
    handed_back: u64,
}

struct Pool {
    workers: usize,
    busy: usize,
    /// Round robin over its home groups, and over the groups it lends to.
    cursor: usize,
    lent_cursor: usize,
}

/// The recovery-conscious scheduler (see the module docs).
pub struct RecoveryScheduler<T> {
    mapping: Mapping,
    groups: Vec<Group<T>>,
    pools: Vec<Pool>,
    /// Per pool, the groups it serves first: its home groups under the
    /// static and partially dynamic mappings, every group otherwise.
    serves: Vec<Vec<usize>>,
    /// The groups a lending pool may take (partially dynamic: every group
    /// not isolated).
    lendable: Vec<usize>,
    /// The latest `now` seen (time in recovery is counted up to it).
    now: Time,
    events: VecDeque<GroupEvent>,
    failed: VecDeque<(GroupId, Dispatch<T>)>,
}

impl<T> std::fmt::Debug for RecoveryScheduler<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveryScheduler")
            .field("mapping", &self.mapping)
            .field("groups", &self.groups.len())
            .field("pools", &self.pools.len())
            .finish_non_exhaustive()
    }
}

fn gid(i: usize) -> GroupId {
    GroupId(u16::try_from(i).unwrap_or(u16::MAX))
}

impl<T: Send + 'static> RecoveryScheduler<T> {
    /// A scheduler for `cfg` (validated here), each group with hr-net's
    /// queues ([`PriorityScheduler`] with the configured aging bound).
    pub fn new(cfg: &RecoveryConfig) -> Result<Self, RecoveryConfigError> {
        let aging = cfg.aging_bound;
        Self::with_queues(cfg, || Box::new(PriorityScheduler::new(aging)))
    }

    /// [`RecoveryScheduler::new`] with each group's queue made by `queue`
    /// (say, a FIFO baseline).
    pub fn with_queues(
        cfg: &RecoveryConfig,
        queue: impl Fn() -> Box<dyn Scheduler<T>>,
    ) -> Result<Self, RecoveryConfigError> {
        cfg.validate()?;
        let groups: Vec<Group<T>> = cfg
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| Group {
                queue: queue(),
                sigma: cfg.sigma_of(i),
                isolated: g.isolated,
                suspended_by: g.suspended_by.iter().map(|o| usize::from(o.0)).collect(),
                policy: g.policy,
                running: 0,
                state: GroupState::Normal,
                dispatched: 0,
                failed: 0,
                recoveries: 0,
                in_recovery: Duration::ZERO,
                handed_back: 0,
            })
            .collect();
        let all: Vec<usize> = (0..groups.len()).collect();
        let serves = (0..cfg.pools.len())
            .map(|p| match cfg.mapping {
                Mapping::Static | Mapping::PartiallyDynamic => all
                    .iter()
                    .copied()
                    .filter(|&g| cfg.homes(g).iter().any(|h| usize::from(h.0) == p))
                    .collect(),
                _ => all.clone(),
            })
            .collect();
        let lendable = match cfg.mapping {
            Mapping::PartiallyDynamic => all
                .iter()
                .copied()
                .filter(|&g| !groups[g].isolated)
                .collect(),
            _ => Vec::new(),
        };
        Ok(RecoveryScheduler {
            mapping: cfg.mapping,
            groups,
            pools: cfg
                .pools
                .iter()
                .map(|&workers| Pool {
                    workers,
                    busy: 0,
                    cursor: 0,
                    lent_cursor: 0,
                })
                .collect(),
            serves,
            lendable,
            now: Time::ZERO,
            events: VecDeque::new(),
            failed: VecDeque::new(),
        })
    }

    fn tick(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    /// Queues a task of `group`.
    pub fn push(
        &mut self,
        now: Time,
        group: GroupId,
        key: TicketKey,
        priority: Priority,
        item: T,
    ) -> Result<(), UnknownGroup<T>> {
        self.tick(now);
        match self.groups.get_mut(usize::from(group.0)) {
            Some(g) => {
                g.queue.push(now, key, priority, item);
                Ok(())
            }
            None => Err(UnknownGroup { group, item }),
        }
    }

    /// A waiting task was asked for again (a re-send): to the head of its
    /// group's high queue. Whether it was waiting.
    pub fn promote(&mut self, key: TicketKey) -> bool {
        self.groups.iter_mut().any(|g| g.queue.promote(key))
    }

    /// Whether group `g` may be dispatched now (`lent`: by a pool that is
    /// not its home, lending itself).
    fn eligible(&self, g: usize, lent: bool) -> bool {
        let grp = &self.groups[g];
        if grp.queue.is_empty() {
            return false;
        }
        if self.mapping == Mapping::PerformanceOriented {
            return true;
        }
        if self.suspended(g) {
            return false;
        }
        // Lent spare workers may take a heavy group past σ; an isolated
        // group is never lent to.
        (lent && !grp.isolated) || grp.running < grp.sigma
    }

    /// Whether `g` is held by its own recovery or one it depends on.
    fn suspended(&self, g: usize) -> bool {
        let grp = &self.groups[g];
        grp.state != GroupState::Normal
            || grp.suspended_by.iter().any(|&o| {
                self.groups
                    .get(o)
                    .is_some_and(|x| x.state != GroupState::Normal)
            })
    }

    /// Round robin from `cursor` over `candidates`: the first eligible.
    fn pick(&self, candidates: &[usize], cursor: usize, lent: bool) -> Option<(usize, usize)> {
        let n = candidates.len();
        (0..n).find_map(|k| {
            let at = (cursor + k) % n;
            let g = candidates[at];
            self.eligible(g, lent).then_some((g, (at + 1) % n))
        })
    }

    /// The next task for an idle worker of `pool`, if the mapping gives it
    /// one (`None` as well when all its workers are busy).
    pub fn pop(&mut self, now: Time, pool: PoolId) -> Option<Task<T>> {
        self.tick(now);
        let p = usize::from(pool.0);
        let pl = self.pools.get(p)?;
        if pl.busy >= pl.workers {
            return None;
        }
        let (cursor, lent_cursor) = (pl.cursor, pl.lent_cursor);
        let home = self.pick(&self.serves[p], cursor, false);
        let g = match home {
            Some((g, next)) => {
                self.pools[p].cursor = next;
                g
            }
            None if self.mapping == Mapping::PartiallyDynamic => {
                // This pool would idle: lend it for one dispatch (the
                // paper's lease of one dispatch cycle).
                let (g, next) = self.pick(&self.lendable, lent_cursor, true)?;
                self.pools[p].lent_cursor = next;
                g
            }
            None => return None,
        };
        let grp = &mut self.groups[g];
        let dispatch = grp.queue.pop(now)?;
        grp.running += 1;
        grp.dispatched += 1;
        self.pools[p].busy += 1;
        Some(Task {
            group: gid(g),
            pool,
            dispatch,
        })
    }

    /// Whether [`RecoveryScheduler::pop`] would give `pool` a task now (a
    /// driver wakes an idle pool only for that: tasks may wait that no
    /// pool may take — a group at σ, or suspended).
    pub fn has_ready(&self, pool: PoolId) -> bool {
        let p = usize::from(pool.0);
        let Some(pl) = self.pools.get(p) else {
            return false;
        };
        if pl.busy >= pl.workers {
            return false;
        }
        self.pick(&self.serves[p], pl.cursor, false).is_some()
            || (self.mapping == Mapping::PartiallyDynamic
                && self.pick(&self.lendable, pl.lent_cursor, true).is_some())
    }

    /// A task of `group` that ran on a worker of `pool` ended.
    pub fn handle_done(&mut self, now: Time, pool: PoolId, group: GroupId, outcome: TaskOutcome) {
        self.tick(now);
        if let Some(pl) = self.pools.get_mut(usize::from(pool.0)) {
            pl.busy = pl.busy.saturating_sub(1);
        }
        let g = usize::from(group.0);
        let Some(grp) = self.groups.get_mut(g) else {
            return;
        };
        grp.running = grp.running.saturating_sub(1);
        if outcome == TaskOutcome::Failed {
            grp.failed += 1;
            self.enter_recovery(now, group);
        }
        self.maybe_clean_up(g);
    }

    /// The service says `group` must recover (as a failed task would).
    /// Returns whether it entered recovery now (the baseline mapping has
    /// no recovery; a group already recovering stays so).
    pub fn enter_recovery(&mut self, now: Time, group: GroupId) -> bool {
        self.tick(now);
        if self.mapping == Mapping::PerformanceOriented {
            return false;
        }
        let g = usize::from(group.0);
        let Some(grp) = self.groups.get_mut(g) else {
            return false;
        };
        if grp.state != GroupState::Normal {
            return false;
        }
        grp.state = GroupState::Recovering {
            since: now,
            cleaning: false,
        };
        grp.recoveries += 1;
        self.events.push_back(GroupEvent::RecoveryStarted {
            group,
            running: grp.running,
            at: now,
        });
        self.maybe_clean_up(g);
        true
    }

    fn maybe_clean_up(&mut self, g: usize) {
        let grp = &mut self.groups[g];
        if let GroupState::Recovering {
            since,
            cleaning: false,
        } = grp.state
        {
            if grp.running == 0 {
                grp.state = GroupState::Recovering {
                    since,
                    cleaning: true,
                };
                self.events.push_back(GroupEvent::CleanUp { group: gid(g) });
            }
        }
    }

    /// `group`'s clean-up blocks ran: it is back to normal, its queued
    /// tasks re-driven or handed back ([`RecoveryScheduler::poll_failed`]).
    pub fn handle_cleanup_done(&mut self, now: Time, group: GroupId) -> Result<(), CleanupError> {
        self.tick(now);
        let g = usize::from(group.0);
        let grp = self
            .groups
            .get_mut(g)
            .ok_or(CleanupError::NotRecovering(group))?;
        let since = match grp.state {
            GroupState::Normal => return Err(CleanupError::NotRecovering(group)),
            GroupState::Recovering {
                cleaning: false, ..
            } => {
                return Err(CleanupError::StillRunning {
                    group,
                    running: grp.running,
                })
            }
            GroupState::Recovering { since, .. } => since,
        };
        let mut failed = 0;
        if grp.policy == RecoveryPolicy::Fail {
            while let Some(d) = grp.queue.pop(now) {
                self.failed.push_back((group, d));
                failed += 1;
            }
            grp.handed_back += failed as u64;
        }
        let took = now.saturating_since(since);
        grp.in_recovery += took;
        grp.state = GroupState::Normal;
        self.events.push_back(GroupEvent::Recovered {
            group,
            took,
            failed,
        });
        Ok(())
    }

    /// Drops the waiting tasks of a session that ended.
    pub fn remove_session(&mut self, session: u64) -> Vec<T> {
        self.groups
            .iter_mut()
            .flat_map(|g| g.queue.remove_session(session))
            .collect()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<GroupEvent> {
        self.events.pop_front()
    }

    /// The next task handed back after a recovery under
    /// [`RecoveryPolicy::Fail`]: fail it to its caller.
    pub fn poll_failed(&mut self) -> Option<(GroupId, Dispatch<T>)> {
        self.failed.pop_front()
    }

    /// Tasks waiting, in all groups.
    pub fn len(&self) -> usize {
        self.groups.iter().map(|g| g.queue.len()).sum()
    }

    /// Whether no task waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Workers of `pool` running a task now.
    pub fn busy(&self, pool: PoolId) -> usize {
        self.pools.get(usize::from(pool.0)).map_or(0, |p| p.busy)
    }

    /// Number of groups.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Number of pools.
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    /// Group `group`'s figures.
    pub fn stats(&self, group: GroupId) -> Option<GroupStats> {
        let g = usize::from(group.0);
        let grp = self.groups.get(g)?;
        let current = match grp.state {
            GroupState::Recovering { since, .. } => self.now.saturating_since(since),
            GroupState::Normal => Duration::ZERO,
        };
        Some(GroupStats {
            state: grp.state,
            suspended: self.suspended(g) && grp.state == GroupState::Normal,
            queued: grp.queue.len(),
            running: grp.running,
            sigma: grp.sigma,
            dispatched: grp.dispatched,
            failed: grp.failed,
            recoveries: grp.recoveries,
            in_recovery: grp.in_recovery + current,
            handed_back: grp.handed_back,
        })
    }
}
