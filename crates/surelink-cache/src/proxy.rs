//! The proxy: memcached's text protocol on a local TCP port, each key
//! routed by the [`Ring`] to a cache node over surelink sessions (every
//! network, failover, exactly-once calls), a node the detector reports
//! dead taken out of the ring and put back when it is heard again.
//!
//! Per client connection: commands are parsed as they arrive and sent at
//! once (pipelined, in order: a node starts one peer's requests in the
//! order they were sent), replies written back in request order. Memory
//! per client is bounded: the read buffer by the largest item plus a line,
//! the commands in flight by `max_pipeline` (reading pauses at the bound).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesOrdered, StreamExt};
use parking_lot::RwLock;
use surelink::proto::NodeId;
use surelink::{CallError, Endpoint, NetEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::node::CACHE_CHANNEL;
use crate::ring::Ring;
use crate::text::{split_values, Command, Limits, ParseError, Parser};

/// Keys per `get` a node is sent at once (a multi-get is split further).
pub const GET_BATCH: usize = 16;

/// The largest message cache endpoints need: a reply of [`GET_BATCH`]
/// items of memcached's largest size, and their framing.
pub const MAX_MESSAGE: u32 = 17 << 20;

/// Sets what cache endpoints (nodes and proxies) need beyond surelink's
/// defaults: messages up to [`MAX_MESSAGE`], and send and receive bounds
/// (and a path's in-flight bound) that hold two of them. `LocalCluster` and `surelink cache` apply it.
pub fn tune_endpoint(c: &mut surelink::Config) {
    c.core.max_message_size = c.core.max_message_size.max(MAX_MESSAGE);
    let two = u64::from(c.core.max_message_size) * 2 + 4096;
    c.core.send_buffer = c.core.send_buffer.max(two);
    c.core.recv_window = c
        .core
        .recv_window
        .max(u32::try_from(two).unwrap_or(u32::MAX));
    c.core.path_inflight_limit = c.core.path_inflight_limit.max(two);
}

/// The version the proxy reports (memcached's, which it speaks).
pub const VERSION: &str = "1.6.18-surelink";

/// How a proxy behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The cache nodes (surelink node ids) the ring spreads keys over.
    pub nodes: Vec<NodeId>,
    /// Item size limit and longest `get` line.
    pub limits: Limits,
    /// Client connections at once; more are closed at accept.
    pub max_clients: usize,
    /// Commands one client may have in flight; reading pauses beyond.
    pub max_pipeline: usize,
    /// How long a command waits for its node before the client gets
    /// `SERVER_ERROR`.
    pub call_timeout: Duration,
}

impl ProxyConfig {
    /// Defaults for `nodes`, listening on `listen`.
    pub fn new(listen: SocketAddr, nodes: Vec<NodeId>) -> ProxyConfig {
        ProxyConfig {
            listen,
            nodes,
            limits: Limits::default(),
            max_clients: 10_000,
            max_pipeline: 128,
            call_timeout: Duration::from_secs(5),
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ProxyConfigError> {
        if self.nodes.is_empty() {
            return Err(ProxyConfigError::NoNodes);
        }
        if self.max_clients == 0 || self.max_pipeline == 0 {
            return Err(ProxyConfigError::Zero);
        }
        if self.call_timeout.is_zero() {
            return Err(ProxyConfigError::Zero);
        }
        if self.limits.max_item < 1024 {
            return Err(ProxyConfigError::ItemLimit(self.limits.max_item));
        }
        Ok(())
    }
}

/// A proxy configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyConfigError {
    /// No cache node to route to.
    #[error("the proxy needs at least one cache node")]
    NoNodes,
    /// `max_clients`, `max_pipeline` or `call_timeout` is zero.
    #[error("max_clients, max_pipeline and call_timeout must be above zero")]
    Zero,
    /// The item limit is below 1 KiB.
    #[error("max_item {0} is below 1024 bytes")]
    ItemLimit(usize),
}

/// Starting a proxy failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ProxyConfigError),
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Counters of a proxy (memcached's names where there is one).
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Clients connected now.
    pub curr_connections: AtomicU64,
    /// Clients accepted so far.
    pub total_connections: AtomicU64,
    /// Clients refused at `max_clients`.
    pub rejected_connections: AtomicU64,
    /// Keys asked for by `get`/`gets`.
    pub cmd_get: AtomicU64,
    /// Storage commands.
    pub cmd_set: AtomicU64,
    /// Keys found.
    pub get_hits: AtomicU64,
    /// Keys not found.
    pub get_misses: AtomicU64,
    /// Commands answered `SERVER_ERROR` because their node did not answer.
    pub node_errors: AtomicU64,
    /// Times a node was taken out of the ring.
    pub ejections: AtomicU64,
}

struct Shared {
    ep: Arc<Endpoint>,
    cfg: ProxyConfig,
    ring: RwLock<Ring>,
    stats: ProxyStats,
    started: Instant,
}

/// A running proxy.
pub struct Proxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).finish()
    }
}

impl Proxy {
    /// Listens on `cfg.listen` and serves clients through `ep` (which must
    /// know the cache nodes as peers).
    pub async fn start(ep: Arc<Endpoint>, cfg: ProxyConfig) -> Result<Proxy, ProxyError> {
        cfg.validate()?;
        let listener =
            TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| ProxyError::Listen {
                    addr: cfg.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Listen {
            addr: cfg.listen,
            source,
        })?;
        let shared = Arc::new(Shared {
            ring: RwLock::new(Ring::new(&cfg.nodes)),
            ep,
            cfg,
            stats: ProxyStats::default(),
            started: Instant::now(),
        });
        let events = tokio::spawn(watch_nodes(shared.clone()));
        let accept = tokio::spawn(accept_loop(shared.clone(), listener));
        Ok(Proxy {
            shared,
            addr,
            tasks: vec![events, accept],
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn stats(&self) -> &ProxyStats {
        &self.shared.stats
    }

    /// Nodes currently out of the ring.
    pub fn ejected(&self) -> Vec<NodeId> {
        self.shared.ring.read().ejected().collect()
    }

    /// Stops accepting and watching (open client connections end when
    /// their clients leave).
    pub fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ejects nodes the detector reports dead; restores them when heard.
async fn watch_nodes(shared: Arc<Shared>) {
    let mut events = shared.ep.events();
    let ours = |p: &NodeId| shared.cfg.nodes.contains(p);
    while let Ok(e) = events.recv().await {
        match e {
            NetEvent::PeerDead { peer } if ours(&peer) && shared.ring.write().eject(peer) => {
                shared.stats.ejections.fetch_add(1, Relaxed);
                warn!(node = %peer, "cache node reported dead: out of the ring");
            }
            NetEvent::PeerAlive { peer } | NetEvent::PeerUp { peer, .. }
                if ours(&peer) && shared.ring.write().restore(peer) =>
            {
                info!(node = %peer, "cache node back in the ring");
            }
            _ => {}
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(shared.cfg.max_clients));
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of fds and the like: wait instead of spinning.
                debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            shared.stats.rejected_connections.fetch_add(1, Relaxed);
            drop(stream);
            continue;
        };
        shared.stats.total_connections.fetch_add(1, Relaxed);
        shared.stats.curr_connections.fetch_add(1, Relaxed);
        let s = shared.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            if let Err(e) = client(&s, stream).await {
                debug!(%from, error = %e, "client connection ended");
            }
            s.stats.curr_connections.fetch_sub(1, Relaxed);
            drop(permit);
        });
    }
}

type ReplyFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Bytes>> + Send>>;

/// Serves one client until it leaves, sends `quit`, or breaks the protocol.
async fn client(shared: &Arc<Shared>, mut stream: TcpStream) -> std::io::Result<()> {
    let limits = shared.cfg.limits;
    let mut parser = Parser::new(limits);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut inflight: FuturesOrdered<ReplyFuture> = FuturesOrdered::new();
    let mut out = BytesMut::new();
    let mut reading = true;
    let mut quit = false;
    loop {
        // Parse and send what has arrived, up to the pipeline bound.
        while !quit && inflight.len() < shared.cfg.max_pipeline {
            match parser.next(&mut buf) {
                Ok(Some(Command::Quit)) => quit = true,
                Ok(Some(cmd)) => inflight.push_back(dispatch(shared, cmd)),
                Ok(None) => break,
                Err(ParseError::LineTooLong) => {
                    quit = true;
                    inflight.clear();
                }
            }
        }
        if quit && inflight.is_empty() {
            stream.write_all(&out).await?;
            return Ok(());
        }
        let can_read = reading && !quit && inflight.len() < shared.cfg.max_pipeline;
        tokio::select! {
            // Replies first: they free pipeline slots and memory.
            biased;
            Some(r) = inflight.next(), if !inflight.is_empty() => {
                if let Some(r) = r {
                    out.extend_from_slice(&r);
                }
                // Gather the replies already done, then write once.
                while let Some(Some(r)) = futures_util::FutureExt::now_or_never(inflight.next()) {
                    if let Some(r) = r {
                        out.extend_from_slice(&r);
                    }
                }
                if !out.is_empty() {
                    stream.write_all(&out).await?;
                    out.clear();
                }
            }
            n = stream.read_buf(&mut buf), if can_read => {
                if n? == 0 {
                    reading = false;
                    if inflight.is_empty() {
                        return Ok(());
                    }
                }
                // A client that sends more than one item and a line ahead
                // of its commands being parsed is cut off.
                if buf.len() > limits.max_item + limits.max_get_line + 4096 {
                    return Ok(());
                }
            }
            else => {
                if !reading && inflight.is_empty() {
                    return Ok(());
                }
            }
        }
    }
}

fn line(text: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(text.len() + 2);
    b.extend_from_slice(text.as_bytes());
    b.extend_from_slice(b"\r\n");
    b.freeze()
}

fn ready(r: Option<Bytes>) -> ReplyFuture {
    Box::pin(std::future::ready(r))
}

fn node_error(shared: &Shared, e: &CallError) -> Bytes {
    shared.stats.node_errors.fetch_add(1, Relaxed);
    debug!(error = %e, "a node did not answer a command");
    line(&format!("SERVER_ERROR surelink: {e}"))
}

/// Sends `cmd` on its way; the future gives the client's answer (`None`:
/// nothing to write).
fn dispatch(shared: &Arc<Shared>, cmd: Command) -> ReplyFuture {
    let noreply = cmd.noreply();
    let answer = move |b: Bytes| (!noreply).then_some(b);
    match &cmd {
        Command::Reply { text, .. } => ready(answer(line(text))),
        Command::Version => ready(Some(line(&format!("VERSION {VERSION}")))),
        Command::Stats => ready(Some(stats(shared))),
        Command::Quit => ready(None),
        Command::Get { keys, .. } => {
            shared.stats.cmd_get.fetch_add(keys.len() as u64, Relaxed);
            get(shared, cmd)
        }
        Command::FlushAll { .. } => {
            let nodes: Vec<NodeId> = shared.ring.read().nodes().into_iter().collect();
            let calls: Vec<_> = nodes.iter().map(|&n| call(shared, n, &cmd)).collect();
            let s = shared.clone();
            // All queued at the first poll, before the commands behind it.
            let all = futures_util::future::join_all(calls);
            Box::pin(async move {
                for r in all.await {
                    if let Err(e) = r {
                        return answer(node_error(&s, &e));
                    }
                }
                answer(line("OK"))
            })
        }
        Command::TooLarge { unlink, .. } => {
            let refused = line("SERVER_ERROR object too large for cache");
            let node = cmd.key().and_then(|k| shared.ring.read().node_for(k));
            match node.filter(|_| *unlink) {
                // A refused `set` removes the old value, as in memcached
                // (before later commands run: it is in the pipeline).
                Some(node) => {
                    let c = call(shared, node, &cmd);
                    Box::pin(async move {
                        let _ = c.await;
                        answer(refused)
                    })
                }
                None => ready(answer(refused)),
            }
        }
        Command::Store { .. }
        | Command::Delete { .. }
        | Command::Arith { .. }
        | Command::Touch { .. } => {
            if matches!(cmd, Command::Store { .. }) {
                shared.stats.cmd_set.fetch_add(1, Relaxed);
            }
            let node = cmd.key().and_then(|k| shared.ring.read().node_for(k));
            let Some(node) = node else {
                return ready(answer(line("SERVER_ERROR no cache node available")));
            };
            let c = call(shared, node, &cmd);
            let s = shared.clone();
            Box::pin(async move {
                match c.await {
                    Ok(r) => answer(r),
                    Err(e) => answer(node_error(&s, &e)),
                }
            })
        }
    }
}

/// The call carrying `cmd` to `node`. Queued into the session when first
/// polled, which `FuturesOrdered` does in push order.
fn call(
    shared: &Arc<Shared>,
    node: NodeId,
    cmd: &Command,
) -> impl std::future::Future<Output = Result<Bytes, CallError>> + Send + 'static {
    let mut body = BytesMut::new();
    let _ = cmd.encode(&mut body);
    let ep = shared.ep.clone();
    let timeout = shared.cfg.call_timeout;
    async move { ep.call(node, CACHE_CHANNEL, body.freeze(), timeout).await }
}

/// A `get`/`gets`: keys split per node, one command to each, the values
/// joined in the order the client asked (repeats answered each time).
fn get(shared: &Arc<Shared>, cmd: Command) -> ReplyFuture {
    let Command::Get { keys, cas } = cmd else {
        return ready(None);
    };
    let mut per_node: Vec<(NodeId, Vec<Bytes>)> = Vec::new();
    {
        let ring = shared.ring.read();
        for k in &keys {
            let Some(n) = ring.node_for(k) else {
                return ready(Some(line("SERVER_ERROR no cache node available")));
            };
            // At most GET_BATCH keys per call: a reply of that many
            // largest items stays under the message limit.
            match per_node
                .iter_mut()
                .find(|(m, ks)| *m == n && ks.len() < GET_BATCH)
            {
                Some((_, ks)) => ks.push(k.clone()),
                None => per_node.push((n, vec![k.clone()])),
            }
        }
    }
    let calls: Vec<_> = per_node
        .into_iter()
        .map(|(n, ks)| call(shared, n, &Command::Get { keys: ks, cas }))
        .collect();
    let s = shared.clone();
    Box::pin(async move {
        // Per key, its VALUE blocks in the order the node sent them.
        let mut values: std::collections::HashMap<Bytes, std::collections::VecDeque<Bytes>> =
            std::collections::HashMap::new();
        for r in futures_util::future::join_all(calls).await {
            match r {
                Ok(reply) => match split_values(&reply) {
                    Some(v) => {
                        for (k, block) in v {
                            values.entry(k).or_default().push_back(block);
                        }
                    }
                    // The node answered with an error line: pass it on.
                    None => return Some(reply),
                },
                Err(e) => return Some(node_error(&s, &e)),
            }
        }
        let mut out = BytesMut::new();
        let mut hits = 0u64;
        for k in &keys {
            // The node answered repeats in order: take the first unused.
            if let Some(block) = values.get_mut(k).and_then(|q| q.pop_front()) {
                out.extend_from_slice(&block);
                hits += 1;
            }
        }
        s.stats.get_hits.fetch_add(hits, Relaxed);
        s.stats
            .get_misses
            .fetch_add(keys.len() as u64 - hits, Relaxed);
        out.extend_from_slice(b"END\r\n");
        Some(out.freeze())
    })
}

fn stats(shared: &Shared) -> Bytes {
    let s = &shared.stats;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rows = [
        ("pid", u64::from(std::process::id())),
        ("uptime", shared.started.elapsed().as_secs()),
        ("time", now),
        ("curr_connections", s.curr_connections.load(Relaxed)),
        ("total_connections", s.total_connections.load(Relaxed)),
        ("rejected_connections", s.rejected_connections.load(Relaxed)),
        ("cmd_get", s.cmd_get.load(Relaxed)),
        ("cmd_set", s.cmd_set.load(Relaxed)),
        ("get_hits", s.get_hits.load(Relaxed)),
        ("get_misses", s.get_misses.load(Relaxed)),
        ("node_errors", s.node_errors.load(Relaxed)),
        ("ejections", s.ejections.load(Relaxed)),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("STAT {k} {v}\r\n"));
    }
    out.push_str(&format!("STAT version {VERSION}\r\n"));
    out.push_str("END\r\n");
    Bytes::from(out)
}
