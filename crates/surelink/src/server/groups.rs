//! Recovery groups on the shell's side: the handlers and routing the
//! service registered, and what the executor does about the scheduler's
//! events — cancelling a recovering group's running tasks, running its
//! clean-up (the tasks' blocks, then the group's own recovery) on a task
//! of its own, failing or re-driving what waited, and telling the service.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::FutureExt;

use surelink_proto::rpc::recovery::{GroupEvent, GroupId, GroupStats};
use surelink_proto::rpc::Priority;
use surelink_proto::{ChannelId, NodeId};

use super::exec::{fail_unrun, Server};
use super::Handler;
use crate::shared::Shared;
use crate::sync::lock;

/// What the service's routing sees of a request (before it is queued: keep
/// it cheap — it runs on the session's reader).
#[derive(Debug)]
#[non_exhaustive]
pub struct RouteInfo<'a> {
    /// The caller.
    pub peer: NodeId,
    /// The channel it came on.
    pub channel: ChannelId,
    /// Its priority.
    pub priority: Priority,
    /// The request body.
    pub body: &'a [u8],
}

/// Where a routed request runs ([`crate::Endpoint::route_requests`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Routing {
    /// Its recovery group.
    pub group: GroupId,
    /// It touches what other groups' requests touch (a multi-key read, a
    /// flush of everything): it starts only after every request its
    /// session sent before it has started, and the session's later
    /// requests start only after it. Requests of one group keep their
    /// order anyway; those of different groups do not, unless one spans.
    /// The price: while an earlier request of the session waits in a
    /// recovering group, the spanning one and everything the session sends
    /// after it wait too; and a handler must not wait for a later request
    /// of its own session across a spanning one.
    pub spans_groups: bool,
}

impl Routing {
    /// A request of `group` that spans groups (see [`Routing::spans_groups`]).
    pub fn spanning(group: GroupId) -> Routing {
        Routing {
            group,
            spans_groups: true,
        }
    }
}

impl From<GroupId> for Routing {
    fn from(group: GroupId) -> Routing {
        Routing {
            group,
            spans_groups: false,
        }
    }
}

pub(super) type Route = dyn Fn(&RouteInfo<'_>) -> Routing + Send + Sync;
type RecoverFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
pub(super) type Recover = dyn Fn(GroupId) -> RecoverFuture + Send + Sync;

/// The handlers, per group and by default, and the service's routing.
pub(crate) struct Handlers {
    pub(super) default: Option<Arc<dyn Handler>>,
    per_group: Vec<Option<Arc<dyn Handler>>>,
    recover: Vec<Option<Arc<Recover>>>,
    pub(super) route: Option<Arc<Route>>,
}

impl Handlers {
    pub(super) fn new(groups: usize) -> Handlers {
        Handlers {
            default: None,
            per_group: vec![None; groups],
            recover: vec![None; groups],
            route: None,
        }
    }

    /// The handler for `group`'s requests: its own, else the default.
    pub(super) fn for_group(&self, group: GroupId) -> Option<Arc<dyn Handler>> {
        self.per_group
            .get(usize::from(group.0))
            .and_then(Clone::clone)
            .or_else(|| self.default.clone())
    }
}

/// A group's recovery as the service hears of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryEvent {
    /// The group's name.
    pub name: String,
    /// What happened (the group's id is in it).
    pub event: GroupEvent,
}

/// A group's figures, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupSnapshot {
    /// Its id.
    pub id: GroupId,
    /// Its name.
    pub name: String,
    /// State, queue depth, workers held, recoveries, time in recovery.
    pub stats: GroupStats,
}

/// Why a group operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// No such group in `Config::executor`.
    #[error(
        "no recovery group {0} (the endpoint has {1}; declare them in `Config::executor.groups`)"
    )]
    Unknown(GroupId, usize),
}

impl Server {
    fn group_index(&self, group: GroupId) -> Result<usize, GroupError> {
        let i = usize::from(group.0);
        if i < self.groups.len() {
            Ok(i)
        } else {
            Err(GroupError::Unknown(group, self.groups.len()))
        }
    }

    pub(super) fn group_name(&self, group: GroupId) -> String {
        self.groups
            .get(usize::from(group.0))
            .map(|g| lock(g).name.clone())
            .unwrap_or_default()
    }

    pub(crate) fn set_group_handler(
        &self,
        group: GroupId,
        h: Arc<dyn Handler>,
    ) -> Result<(), GroupError> {
        let i = self.group_index(group)?;
        crate::sync::write(&self.handlers).per_group[i] = Some(h);
        self.handler_given.notify_waiters();
        Ok(())
    }

    pub(crate) fn set_recover(&self, group: GroupId, r: Arc<Recover>) -> Result<(), GroupError> {
        let i = self.group_index(group)?;
        crate::sync::write(&self.handlers).recover[i] = Some(r);
        Ok(())
    }

    pub(crate) fn set_route(&self, r: Arc<Route>) {
        crate::sync::write(&self.handlers).route = Some(r);
    }

    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<RecoveryEvent> {
        self.events.subscribe()
    }

    pub(crate) fn group_stats(&self) -> Vec<GroupSnapshot> {
        let q = lock(&self.queue);
        (0..self.groups.len())
            .filter_map(|i| {
                let id = GroupId(u16::try_from(i).ok()?);
                Some(GroupSnapshot {
                    id,
                    name: self.group_name(id),
                    stats: q.stats(id)?,
                })
            })
            .collect()
    }

    /// Clean-up blocks that panicked, in all groups.
    pub(crate) fn cleanup_panics(&self) -> u64 {
        self.cleanup_panics.load(Ordering::Relaxed)
    }

    /// The service says `group` must recover. Whether it entered recovery
    /// now (not if it already was, or under the performance-oriented
    /// mapping, which has no recovery).
    pub(crate) fn enter_recovery(shared: &Arc<Shared>, group: GroupId) -> Result<bool, GroupError> {
        let server = &shared.server;
        server.group_index(group)?;
        let (entered, events) = {
            let mut q = lock(&server.queue);
            let now = shared.clock.now();
            let entered = q.enter_recovery(now, group);
            (entered, Server::take_events(&mut q))
        };
        Server::on_events(shared, events);
        Ok(entered)
    }

    /// Acts on the scheduler's events (called without its lock).
    pub(super) fn on_events(shared: &Arc<Shared>, events: Vec<GroupEvent>) {
        let server = &shared.server;
        for event in events {
            let group = match &event {
                GroupEvent::RecoveryStarted { group, .. }
                | GroupEvent::CleanUp { group }
                | GroupEvent::Recovered { group, .. } => *group,
                _ => continue,
            };
            match &event {
                GroupEvent::RecoveryStarted { .. } => {
                    let secs = shared.clock.now().since_origin().as_secs();
                    if let Some(suppressed) = shared.logs.recoveries.allow(secs) {
                        tracing::warn!(group = %server.group_name(group), suppressed, "recovery group entered recovery");
                    }
                    shared.stats.group_recovery();
                    // Cancelled tasks end through their pools, which tell
                    // the scheduler; the last one brings the clean-up.
                    if let Some(g) = server.groups.get(usize::from(group.0)) {
                        for (_, h) in std::mem::take(&mut lock(g).running) {
                            h.abort();
                        }
                    }
                }
                GroupEvent::CleanUp { .. } => {
                    let sh = shared.clone();
                    shared.spawn(async move { clean_up(sh, group).await });
                }
                GroupEvent::Recovered { took, .. } => {
                    tracing::debug!(group = %server.group_name(group), took_ms = took.as_secs_f64() * 1e3, "recovery group recovered");
                }
                _ => {}
            }
            let _ = server.events.send(RecoveryEvent {
                name: server.group_name(group),
                event,
            });
        }
    }
}

/// A group's clean-up: its failed and cancelled tasks' blocks (each stack
/// newest first), then the group's own recovery; then the scheduler is
/// told, what waited under the `Fail` policy is failed to its callers, and
/// the pools are woken for what is re-driven.
async fn clean_up(shared: Arc<Shared>, group: GroupId) {
    let server = &shared.server;
    let stacks = server
        .groups
        .get(usize::from(group.0))
        .map(|g| std::mem::take(&mut lock(g).pending))
        .unwrap_or_default();
    let mut panics = 0;
    for s in stacks {
        panics += s.unwind();
    }
    let recover = crate::sync::read(&server.handlers)
        .recover
        .get(usize::from(group.0))
        .and_then(Clone::clone);
    if let Some(r) = recover {
        // Its own recovery may panic too: the group comes back regardless
        // (a group stuck in recovery would hold its callers for ever).
        let fut = std::panic::catch_unwind(AssertUnwindSafe(|| r(group)));
        match fut {
            Ok(f) => {
                if AssertUnwindSafe(f).catch_unwind().await.is_err() {
                    panics += 1;
                }
            }
            Err(_) => panics += 1,
        }
    }
    if panics > 0 {
        server
            .cleanup_panics
            .fetch_add(panics as u64, Ordering::Relaxed);
        tracing::error!(group = %server.group_name(group), panics, "clean-up blocks panicked");
    }
    let (failed, events) = {
        let mut q = lock(&server.queue);
        let now = shared.clock.now();
        if let Err(e) = q.handle_cleanup_done(now, group) {
            tracing::error!(error = %e, "clean-up not taken");
        }
        let failed: Vec<_> = std::iter::from_fn(|| q.poll_failed()).collect();
        (failed, Server::take_events(&mut q))
    };
    let name = server.group_name(group);
    for (_, d) in failed {
        fail_unrun(&shared, d.item, name.clone());
    }
    Server::on_events(&shared, events);
    server.wake_all();
}
