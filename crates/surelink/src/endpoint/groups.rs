//! The service's side of recovery groups: a handler per group, routing
//! requests to groups, a group's own recovery, entering recovery, and the
//! groups' events and figures (see `server` for the mechanism).

use std::future::Future;
use std::sync::Arc;

use crate::server::{
    GroupError, GroupId, GroupSnapshot, Handler, RecoveryEvent, RouteInfo, Routing, Server,
};

use super::Endpoint;

impl Endpoint {
    /// Serves `group`'s requests with `handler` (instead of the one given
    /// to [`Endpoint::serve`]). The group must be declared in
    /// `Config::executor.groups`.
    pub fn serve_group<H: Handler>(&self, group: GroupId, handler: H) -> Result<(), GroupError> {
        self.shared
            .server
            .set_group_handler(group, Arc::new(handler))?;
        Server::dispatch(&self.shared);
        Ok(())
    }

    /// Sorts each request into a recovery group, instead of by channel
    /// (`Config::executor.channels`). Runs on the session's reader before
    /// the request is queued: keep it cheap (a key's hash, a header byte).
    /// A group that does not exist sends the request by channel instead.
    /// Return a [`GroupId`], or a [`Routing`] to mark a request that
    /// spans groups (it keeps its place among its session's requests of
    /// every group).
    pub fn route_requests<F, R>(&self, route: F)
    where
        F: Fn(&RouteInfo<'_>) -> R + Send + Sync + 'static,
        R: Into<Routing>,
    {
        self.shared
            .server
            .set_route(Arc::new(move |r: &RouteInfo<'_>| route(r).into()));
    }

    /// `group`'s own recovery: runs in its clean-up, once none of its
    /// requests runs and its requests' clean-up blocks have run, before
    /// its queued requests are re-driven or failed (say, drop and rebuild
    /// a shard, or reconnect a backend). A panic in it is counted and the
    /// group comes back regardless.
    pub fn on_recovery<F, Fut>(&self, group: GroupId, recover: F) -> Result<(), GroupError>
    where
        F: Fn(GroupId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.shared
            .server
            .set_recover(group, Arc::new(move |g| Box::pin(recover(g))))
    }

    /// Puts `group` into recovery, as a failed handler would (the service
    /// found its state suspect). Returns whether it entered recovery now
    /// (`false` if it already was, or under the performance-oriented
    /// mapping, which has none).
    pub fn enter_recovery(&self, group: GroupId) -> Result<bool, GroupError> {
        Server::enter_recovery(&self.shared, group)
    }

    /// The recovery groups' events: recovery started, clean-up, recovered.
    pub fn recovery_events(&self) -> tokio::sync::broadcast::Receiver<RecoveryEvent> {
        self.shared.server.subscribe()
    }

    /// Each recovery group's state and figures now.
    pub fn groups(&self) -> Vec<GroupSnapshot> {
        self.shared.server.group_stats()
    }
}
