//! A cache node: a surelink server whose requests are memcached text
//! commands (one per request, as the proxy forwards them) and whose
//! replies are memcached's answers. The embedded [`Store`] serves them by
//! default.
//!
//! Each command runs when the server starts the request. The server
//! starts one peer's requests of one recovery group (a shard) in the
//! order they were sent — so a proxy's pipelined `set k` then `get k` are
//! applied in that order — and a command that spans shards (a multi-get
//! across them, `flush_all`) after everything sent before it and before
//! everything sent after it ([`Shards::route`]).
//!
//! A node that fences itself (it missed its heartbeat deadline, so peers
//! may have reported it dead and moved its keys) drops every item before
//! it serves again ([`serve_store`]): keys written elsewhere meanwhile
//! must not come back stale when the node returns to the ring.
//!
//! The embedded store is in [`Shards`], each a recovery group of the
//! endpoint ([`configure`] declares them): a shard whose command panics
//! is suspended, emptied and brought back while the others serve.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use surelink::{
    Config, Endpoint, GroupId, Handler, HandlerError, HandlerFuture, NetEvent, Request,
};
use tracing::warn;

use crate::shards::Shards;
use crate::text::{Command, Limits, Parser};

/// The channel proxies send commands on.
pub const CACHE_CHANNEL: u16 = 0;

/// What a node refuses before running anything.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The request was not one whole memcached command.
    #[error("request is not one memcached command")]
    NotACommand,
}

impl From<NodeError> for HandlerError {
    fn from(e: NodeError) -> HandlerError {
        HandlerError::new(400, e.to_string())
    }
}

/// Unix time in seconds (memcached's exptime clock).
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Parses one request body into its command.
pub fn decode(body: &Bytes, limits: Limits) -> Result<Command, NodeError> {
    let mut buf = BytesMut::from(&body[..]);
    // The proxy bounded the client's line; a node takes what it forwards.
    let limits = Limits {
        max_get_line: usize::MAX,
        ..limits
    };
    let mut p = Parser::new(limits);
    match p.next(&mut buf) {
        Ok(Some(c)) if buf.is_empty() => Ok(c),
        _ => Err(NodeError::NotACommand),
    }
}

/// The handler of a node with the embedded store.
#[derive(Clone, Debug)]
pub struct StoreHandler {
    store: Arc<Shards>,
    limits: Limits,
}

impl StoreHandler {
    /// Serves `store`; values beyond `limits` are refused as memcached
    /// would.
    pub fn new(store: Arc<Shards>, limits: Limits) -> StoreHandler {
        StoreHandler { store, limits }
    }

    /// Runs one request body now; the reply bytes.
    pub fn run(&self, body: &Bytes) -> Result<Bytes, NodeError> {
        let cmd = decode(body, self.limits)?;
        let mut out = BytesMut::new();
        self.store.apply(&cmd, unix_now(), &mut out);
        Ok(out.freeze())
    }
}

impl Handler for StoreHandler {
    fn handle(&self, request: Request) -> HandlerFuture {
        // Run now, while the server starts requests in order; the future
        // only hands the answer over.
        let r = self.run(&request.body).map_err(HandlerError::from);
        Box::pin(std::future::ready(r))
    }
}

/// Declares one recovery group per shard of a store of `shards` shards
/// in `cfg` (before it is bound).
pub fn configure(cfg: &mut Config, shards: usize) {
    cfg.executor.groups = Shards::groups(shards);
}

/// Serves `store` on `ep`: each request in its first key's shard's group
/// (groups declared by [`configure`]; without them, all in one), a
/// shard that recovers emptied; and the whole store emptied whenever
/// `ep` fences itself.
pub fn serve_store(ep: &Endpoint, store: Arc<Shards>, limits: Limits) {
    // Subscribed before serving: no fence can pass unseen.
    let mut events = ep.events();
    let groups = ep.groups().len();
    if groups >= store.len() {
        let s = store.clone();
        ep.route_requests(move |r| s.route(r.body));
        for i in 0..store.len() {
            let s = store.clone();
            let g = GroupId(u16::try_from(i).unwrap_or(0));
            // The group exists (checked above).
            let _ = ep.on_recovery(g, move |_| {
                // A command may have failed half-way through: the shard's
                // items go (a miss, never a wrong value).
                if let Some(shard) = s.shard(i) {
                    shard.clear();
                }
                warn!(shard = i, "store shard recovered: its items were dropped");
                std::future::ready(())
            });
        }
    } else if store.len() > 1 {
        warn!(
            shards = store.len(),
            groups,
            "store shards not declared as recovery groups (node::configure): one group serves all"
        );
    }
    ep.serve(StoreHandler::new(store.clone(), limits));
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(NetEvent::Fenced { old_epoch, .. }) => {
                    store.clear();
                    warn!(%old_epoch, "this node fenced itself: its items are dropped (peers may have moved its keys)");
                }
                Ok(_) => {}
                Err(surelink::RecvError::Lagged(_)) => {
                    // A fence may be among the missed events: drop the
                    // items rather than risk serving stale ones.
                    store.clear();
                    warn!("node missed endpoint events: items dropped to be safe");
                }
                Err(_) => return,
            }
        }
    });
}
