//! A helper (PostMan): clients open a TCP connection here, name a server
//! in a 12-byte preamble, and everything they send after it — their own
//! handshake with the server, then their sealed frames — is packed, many
//! clients' bytes per message, into relay records on this endpoint's
//! session to that server; the server's replies come back the same way
//! and are split onto the clients' connections.
//!
//! What a helper can do to the traffic it carries: delay it, drop it, or
//! end a client's connection (the client's session fails over, nothing
//! lost or run twice). What it cannot: read it, forge it, or replay it —
//! the handshake and the records inside run end to end between client
//! and server, with keys the helper never holds.
//!
//! It keeps nothing beyond what is in flight: a client's slot and the
//! bytes not yet passed on.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use surelink_proto::helper::{
    decode_records, Batcher, BatcherConfig, BatcherError, HelperLoad, Preamble, Record, LOAD_LEN,
    MAX_SLOT, PREAMBLE_LEN,
};
use surelink_proto::{ConfigError, NodeId};

use crate::Endpoint;

/// How long a new client has to send its preamble.
const PREAMBLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Bytes read from a client at once.
const CLIENT_READ: usize = 64 * 1024;
/// Chunks of replies waiting for one client's socket (each at most a
/// 64 KiB record: 4 MiB); a client that does not read them is cut off
/// (its session fails over).
const CLIENT_QUEUE: usize = 64;
/// Clients' connections a helper holds at once (a server takes 4 096 per
/// helper by default); more are closed at accept.
const MAX_CLIENTS: u64 = 4096;
/// The longest DATA record body a helper writes.
const DATA_PIECE: usize = 64 * 1024;

/// Why a helper did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HelperError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The system's reason.
        source: io::Error,
    },
    /// The batching configuration is invalid.
    #[error("invalid batching configuration: {0}")]
    Batching(#[from] ConfigError),
}

/// A helper's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HelperStats {
    /// Clients' connections open now.
    pub clients: u64,
    /// Clients' connections accepted in all.
    pub accepted: u64,
    /// Connections closed for a bad preamble or an unknown server.
    pub refused: u64,
    /// Relay messages sent to servers, and the records in them.
    pub messages_out: u64,
    /// Records sent to servers.
    pub records_out: u64,
    /// Bytes of those records (headers included).
    pub bytes_out: u64,
    /// Relay messages received from servers.
    pub messages_in: u64,
    /// Load queries answered (clients choosing a helper without a row of
    /// the role service that lists this one).
    pub load_queries: u64,
}

#[derive(Debug, Default)]
struct Counters {
    clients: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// Connections open, preamble read or not.
    open: AtomicU64,
    messages_out: AtomicU64,
    records_out: AtomicU64,
    bytes_out: AtomicU64,
    messages_in: AtomicU64,
    load_queries: AtomicU64,
}

/// What waits for one server: encoded records in arrival order, and the
/// batching decision over them.
#[derive(Debug)]
struct Queue {
    pending: BytesMut,
    batcher: Batcher,
}

#[derive(Debug)]
struct ToServer {
    server: NodeId,
    q: Mutex<Queue>,
    wake: Notify,
    room: Notify,
}

#[derive(Debug)]
struct Inner {
    endpoint: Endpoint,
    channel: u16,
    /// Clients' tasks, aborted with the helper.
    client_tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    servers: FxHashMap<NodeId, Arc<ToServer>>,
    clients: Mutex<FxHashMap<(NodeId, u32), mpsc::Sender<Bytes>>>,
    next_slot: AtomicU32,
    counters: Counters,
    /// Records relayed at the last rate sample, and the rate then (per s).
    rate: Mutex<(u64, u64)>,
    /// Stops forwarding either way while set (test hook: a helper frozen
    /// with its connections open).
    #[cfg(feature = "test-util")]
    paused: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// The load a query is told: records over the last rate window.
    fn load(&self) -> HelperLoad {
        HelperLoad {
            clients: self.counters.clients.load(Ordering::Relaxed),
            records_per_s: self.rate.lock().1,
        }
    }

    /// Waits while the helper is paused (test hook; nothing otherwise).
    async fn unpaused(&self) {
        #[cfg(feature = "test-util")]
        while self.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// A running helper; stops when dropped.
#[derive(Debug)]
pub struct Helper {
    inner: Arc<Inner>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Helper {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.inner.client_tasks.lock().drain(..) {
            t.abort();
        }
        // Clients' writers end with their senders: their connections close.
        self.inner.clients.lock().clear();
    }
}

impl Helper {
    /// Starts relaying for the servers among `endpoint`'s configured
    /// peers, on `listen`, batching per `batching`. `channel` is the relay
    /// channel the servers reserve (their `relay_channel`). The endpoint
    /// is the helper's: its one-way messages are all taken as relay
    /// traffic.
    pub async fn start(
        endpoint: Endpoint,
        listen: SocketAddr,
        batching: BatcherConfig,
        channel: u16,
    ) -> Result<Helper, HelperError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| HelperError::Listen {
                addr: listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| HelperError::Listen {
                addr: listen,
                source,
            })?;
        let mut servers = FxHashMap::default();
        for p in endpoint.configured_peers() {
            servers.insert(
                p,
                Arc::new(ToServer {
                    server: p,
                    q: Mutex::new(Queue {
                        pending: BytesMut::new(),
                        batcher: Batcher::new(batching.clone())?,
                    }),
                    wake: Notify::new(),
                    room: Notify::new(),
                }),
            );
        }
        let inner = Arc::new(Inner {
            endpoint,
            channel,
            servers,
            clients: Mutex::new(FxHashMap::default()),
            client_tasks: Mutex::new(Vec::new()),
            next_slot: AtomicU32::new(0),
            counters: Counters::default(),
            rate: Mutex::new((0, 0)),
            #[cfg(feature = "test-util")]
            paused: std::sync::atomic::AtomicBool::new(false),
        });
        let mut tasks = Vec::new();
        for s in inner.servers.values() {
            tasks.push(tokio::spawn(flush_loop(Arc::downgrade(&inner), s.clone())));
        }
        tasks.push(tokio::spawn(from_servers(Arc::downgrade(&inner))));
        tasks.push(tokio::spawn(rate_loop(Arc::downgrade(&inner))));
        tasks.push(tokio::spawn(accept_loop(Arc::downgrade(&inner), listener)));
        let h = Helper { inner, addr, tasks };
        if !addr.ip().is_unspecified() {
            h.advertise(addr);
        }
        Ok(h)
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Reports `addr` as where clients reach this helper, with its load,
    /// to the role service (if the endpoint's cluster runs one): clients
    /// that list the helper at that address rank it from their row
    /// without asking it. Done by [`Helper::start`] with the bound
    /// address unless that is a wildcard (`0.0.0.0`, `::`), which no
    /// client lists: call this with the address clients use.
    pub fn advertise(&self, addr: SocketAddr) {
        let Some(role) = &self.inner.endpoint.shared().role else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        role.publish_helper(
            addr,
            Box::new(move || inner.upgrade().map(|i| i.load().rank())),
        );
    }

    /// Test hook: stops forwarding anything either way (the helper's
    /// connections stay open, as a frozen helper's would) until resumed.
    #[cfg(feature = "test-util")]
    pub fn pause(&self, paused: bool) {
        self.inner.paused.store(paused, Ordering::Relaxed);
    }

    /// The helper's counters.
    pub fn stats(&self) -> HelperStats {
        let c = &self.inner.counters;
        HelperStats {
            clients: c.clients.load(Ordering::Relaxed),
            accepted: c.accepted.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            messages_out: c.messages_out.load(Ordering::Relaxed),
            records_out: c.records_out.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            messages_in: c.messages_in.load(Ordering::Relaxed),
            load_queries: c.load_queries.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    /// Queues `r` for `to`; waits while its queue is full.
    async fn queue(&self, to: &ToServer, r: Record) {
        loop {
            let room = to.room.notified();
            {
                let mut q = to.q.lock();
                let now = self.endpoint.now();
                match q.batcher.handle_queued(now, r.encoded_len()) {
                    Ok(()) => {
                        let _ = r.encode(&mut q.pending);
                        self.counters.records_out.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .bytes_out
                            .fetch_add(r.encoded_len() as u64, Ordering::Relaxed);
                        drop(q);
                        to.wake.notify_one();
                        return;
                    }
                    Err(BatcherError::Full { .. }) => {}
                    Err(_) => return,
                }
            }
            room.await;
        }
    }

    fn new_slot(&self, server: NodeId) -> u32 {
        let clients = self.clients.lock();
        loop {
            let s = self.next_slot.fetch_add(1, Ordering::Relaxed) & MAX_SLOT;
            if !clients.contains_key(&(server, s)) {
                return s;
            }
        }
    }
}

async fn accept_loop(inner: Weak<Inner>, listener: TcpListener) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "helper: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(i) = inner.upgrade() else { return };
        if i.counters.open.load(Ordering::Relaxed) >= MAX_CLIENTS {
            i.counters.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        i.counters.accepted.fetch_add(1, Ordering::Relaxed);
        i.counters.open.fetch_add(1, Ordering::Relaxed);
        let inner2 = i.clone();
        let t = tokio::spawn(async move {
            client(inner2.clone(), stream, from).await;
            inner2.counters.open.fetch_sub(1, Ordering::Relaxed);
        });
        let mut tasks = i.client_tasks.lock();
        tasks.retain(|t| !t.is_finished());
        tasks.push(t.abort_handle());
    }
}

/// One client's connection: preamble, then its bytes to the server.
async fn client(inner: Arc<Inner>, mut stream: TcpStream, from: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let mut pre = [0u8; PREAMBLE_LEN];
    let read = tokio::time::timeout(PREAMBLE_TIMEOUT, stream.read_exact(&mut pre)).await;
    let said = match read {
        Ok(Ok(_)) => Preamble::decode(&pre).ok(),
        _ => None,
    };
    if said == Some(Preamble::LoadQuery) {
        // A client choosing a helper: our load, then close.
        inner.counters.load_queries.fetch_add(1, Ordering::Relaxed);
        let _ = stream.write_all(&inner.load().encode()).await;
        return;
    }
    let relay_to = match said {
        Some(Preamble::Relay { server }) => {
            inner.servers.get(&server).map(|to| (server, to.clone()))
        }
        _ => None,
    };
    let (server, to) = match relay_to {
        Some(x) => x,
        None => {
            debug!(%from, "helper: bad preamble or a server it does not relay for; closed");
            inner.counters.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let slot = inner.new_slot(server);
    let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
    inner.clients.lock().insert((server, slot), tx);
    inner.counters.clients.fetch_add(1, Ordering::Relaxed);
    let (mut r, w) = stream.into_split();
    let writer = tokio::spawn(client_writer(w, rx));
    let _stop_writer = AbortOnDrop(writer.abort_handle());
    inner.queue(&to, Record::Open { slot }).await;
    let mut buf = BytesMut::with_capacity(CLIENT_READ);
    loop {
        if buf.capacity() < CLIENT_READ / 4 {
            buf.reserve(CLIENT_READ);
        }
        inner.unpaused().await;
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if !inner.clients.lock().contains_key(&(server, slot)) {
            // The server closed the slot.
            break;
        }
        while !buf.is_empty() {
            let body = buf.split_to(buf.len().min(DATA_PIECE)).freeze();
            inner.queue(&to, Record::Data { slot, body }).await;
        }
    }
    if inner.clients.lock().remove(&(server, slot)).is_some() {
        inner.queue(&to, Record::Close { slot, code: 0 }).await;
    }
    inner.counters.clients.fetch_sub(1, Ordering::Relaxed);
}

/// Aborts a task when dropped (a client's writer ends with its reader,
/// however that ends).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Writes what the server sent for one client, in order, until the slot
/// is closed (the sender dropped).
async fn client_writer(mut w: tokio::net::tcp::OwnedWriteHalf, mut rx: mpsc::Receiver<Bytes>) {
    let mut batch = Vec::with_capacity(64);
    while rx.recv_many(&mut batch, 64).await > 0 {
        for b in batch.drain(..) {
            if w.write_all(&b).await.is_err() {
                return;
            }
        }
    }
    let _ = w.shutdown().await;
}

/// Sends each server's records when its batcher says so.
async fn flush_loop(inner: Weak<Inner>, to: Arc<ToServer>) {
    loop {
        if let Some(i) = inner.upgrade() {
            i.unpaused().await;
        }
        let (msgs, next) = {
            let Some(i) = inner.upgrade() else { return };
            let now = i.endpoint.now();
            let mut q = to.q.lock();
            let mut msgs = Vec::new();
            while let Some(f) = q.batcher.poll_flush(now) {
                msgs.push(q.pending.split_to(f.bytes).freeze());
            }
            (msgs, q.batcher.poll_timeout())
        };
        if !msgs.is_empty() {
            to.room.notify_waiters();
            let Some(i) = inner.upgrade() else { return };
            let n = msgs.len() as u64;
            if let Err(e) = i.endpoint.send_many(to.server, i.channel, msgs).await {
                debug!(server = %to.server, error = %e, "helper: relay message not sent");
            } else {
                i.counters.messages_out.fetch_add(n, Ordering::Relaxed);
            }
            continue;
        }
        let wait = next.map(|t| {
            let now = inner.upgrade().map(|i| i.endpoint.now());
            now.map_or(std::time::Duration::ZERO, |n| t.saturating_since(n))
        });
        match wait {
            Some(d) => {
                tokio::select! {
                    _ = to.wake.notified() => {}
                    _ = tokio::time::sleep(d) => {}
                }
            }
            None => to.wake.notified().await,
        }
    }
}

/// Samples the records relayed per second, for load queries.
async fn rate_loop(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(i) = inner.upgrade() else { return };
        let now = i.counters.records_out.load(Ordering::Relaxed);
        let mut r = i.rate.lock();
        *r = (now, now.saturating_sub(r.0));
    }
}

/// Asks the helper at `addr` its load (within `timeout`).
pub(crate) async fn query_load(
    addr: SocketAddr,
    timeout: std::time::Duration,
) -> Option<HelperLoad> {
    let ask = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(&Preamble::LoadQuery.encode()).await.ok()?;
        let mut b = [0u8; LOAD_LEN];
        s.read_exact(&mut b).await.ok()?;
        Some(HelperLoad::decode(&b))
    };
    tokio::time::timeout(timeout, ask).await.ok().flatten()
}

/// Takes relay messages from the servers and splits them onto clients.
async fn from_servers(inner: Weak<Inner>) {
    let mut batch = Vec::new();
    loop {
        let Some(i) = inner.upgrade() else { return };
        i.unpaused().await;
        if i.endpoint.recv_many(&mut batch, 256).await == 0 {
            return;
        }
        for m in batch.drain(..) {
            let Some(to) = i.servers.get(&m.peer).filter(|_| m.channel.0 == i.channel) else {
                continue;
            };
            i.counters.messages_in.fetch_add(1, Ordering::Relaxed);
            {
                // Self-clocking: the server answered; what waits may go.
                to.q.lock()
                    .batcher
                    .handle_answered(i.endpoint.now(), u64::MAX);
                to.wake.notify_one();
            }
            let records = match decode_records(m.body) {
                Ok(r) => r,
                Err(e) => {
                    warn!(server = %m.peer, error = %e, "helper: refused a relay message from a server");
                    continue;
                }
            };
            for r in records {
                match r {
                    Record::Data { slot, body } => {
                        let tx = i.clients.lock().get(&(m.peer, slot)).cloned();
                        if let Some(tx) = tx {
                            if tx.try_send(body).is_err() {
                                // A client that does not read: cut it off.
                                i.clients.lock().remove(&(m.peer, slot));
                            }
                        }
                    }
                    Record::Close { slot, .. } => {
                        i.clients.lock().remove(&(m.peer, slot));
                    }
                    _ => {}
                }
            }
        }
    }
}
