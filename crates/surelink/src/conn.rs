//! One TCP connection under a path: socket options, the write queue, and
//! the reader task that feeds the core.

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use socket2::SockRef;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Notify};
use tracing::{debug, warn, Instrument};

use surelink_proto::{NodeId, PathId};

use surelink_proto::secure::{Opener, Sealer};
use surelink_proto::Input;

use crate::detector::{Detector, Gate};
use crate::secure::{ConnSlot, Secured};
use crate::session::SessionHandle;
use crate::shared::Shared;

/// Bytes asked of the kernel per read.
const READ_CHUNK: usize = 64 * 1024;

/// The IO half of a connection, shared by the reader task, the writer task
/// and whoever drives the core (which writes directly when the socket takes it).
#[derive(Debug)]
pub(crate) struct ConnIo {
    pub(crate) path: PathId,
    pub(crate) network: usize,
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    /// The write half; the reader task owns the read half (so it reads with
    /// `poll_read`, which notices a short read drained the socket and saves
    /// the system call that would only say "would block").
    stream: OwnedWriteHalf,
    /// Bytes the socket did not take yet, in order, and the record layer
    /// that sealed them (under the same lock, so records are numbered in
    /// queue order).
    pending: Mutex<Pending>,
    /// Someone is writing `pending` to the socket.
    flushing: AtomicBool,
    wake: Notify,
    failed: AtomicBool,
    /// The last flush stopped at the send fence.
    gated: AtomicBool,
    /// The peer, once the handshake named it (0: not yet).
    peer: AtomicU64,
    /// Networks the endpoint is silent on (test hook).
    #[cfg(feature = "test-util")]
    muted: Arc<AtomicU64>,
    /// The send fence (SafeTimer); `None` when the detector is off.
    gate: Option<Arc<Gate>>,
    detector: Option<Arc<Detector>>,
    /// Stamped on every read once the peer is known (see `Detector::heard_cell`).
    heard: std::sync::OnceLock<Arc<AtomicU64>>,
    /// The node whose key the handshake proved (`None` when insecure).
    pub(crate) authenticated: Option<NodeId>,
    /// This connection's place under the accept limits (accepted ones only).
    _slot: Option<ConnSlot>,
    /// The record layer's sealer (`None` when insecure); used only by
    /// whoever holds `flushing`, so uncontended.
    sealer: Option<Mutex<Sealer>>,
    /// The endpoint's count of socket writes.
    writes: Arc<AtomicU64>,
}

/// The write queue. Insecure: `q` only. Otherwise callers append
/// plaintext to `plain` (under the session's lock, so in the core's order)
/// and the one flushing seals it into records on `q` outside that lock —
/// encryption never holds a session back.
#[derive(Debug, Default)]
struct Pending {
    /// Bytes ready for the socket, in order.
    q: VecDeque<Bytes>,
    /// Plaintext not sealed yet (always after everything in `q`).
    plain: VecDeque<Bytes>,
}

/// Plaintext sealed per round of a flush (a few records).
const SEAL_BATCH: usize = 4 * surelink_proto::secure::MAX_RECORD;

/// How a flush ended.
enum Flushed {
    /// Everything queued is written.
    Done,
    /// The socket is full; the writer task finishes when it is writable.
    Blocked,
    /// The send fence is shut (`t_valid` passed): the bytes wait until a
    /// heartbeat moves it, or the fence closes and the connection dies.
    Gated,
    /// The connection is broken.
    Failed,
}

/// Most buffers handed to one vectored write.
const MAX_IOV: usize = 64;

impl ConnIo {
    /// Queues `b` behind everything queued before (call with the session's
    /// lock held, so the queue order is the core's order); `flush` writes it.
    pub(crate) fn enqueue(&self, b: Bytes) {
        let mut p = self.pending.lock();
        if self.sealer.is_some() {
            p.plain.push_back(b);
        } else {
            p.q.push_back(b);
        }
    }

    /// Queues pieces in order, under one lock.
    pub(crate) fn enqueue_all(&self, pieces: impl Iterator<Item = Bytes>) {
        let mut p = self.pending.lock();
        if self.sealer.is_some() {
            p.plain.extend(pieces);
        } else {
            p.q.extend(pieces);
        }
    }

    /// Seals the front of `plain` into records on `q`, when `q` is empty
    /// (only the holder of `flushing` calls this, so order is kept).
    fn seal_some(&self) -> Result<(), surelink_proto::secure::RecordError> {
        let Some(sealer) = &self.sealer else {
            return Ok(());
        };
        let pieces: Vec<Bytes> = {
            let mut p = self.pending.lock();
            if !p.q.is_empty() {
                return Ok(());
            }
            let mut bytes = 0;
            let mut v = Vec::new();
            while bytes < SEAL_BATCH {
                let Some(b) = p.plain.pop_front() else { break };
                bytes += b.len();
                v.push(b);
            }
            v
        };
        if pieces.is_empty() {
            return Ok(());
        }
        let rec = sealer.lock().seal_to_bytes(pieces.iter().map(|b| &b[..]))?;
        self.pending.lock().q.push_back(rec);
        Ok(())
    }

    /// Writes what is queued, outside the session's lock. If another thread is
    /// already writing to this socket, returns at once: that thread writes
    /// these bytes too (it loops until the queue is empty), so concurrent
    /// senders share system calls instead of queueing for the lock.
    pub(crate) fn flush(&self) {
        loop {
            if self.flushing.swap(true, Ordering::AcqRel) {
                return;
            }
            let outcome = self.write_pending();
            self.flushing.store(false, Ordering::Release);
            match outcome {
                Flushed::Blocked | Flushed::Gated => {
                    self.wake.notify_one();
                    return;
                }
                Flushed::Failed => {
                    self.failed.store(true, Ordering::Relaxed);
                    self.kill();
                    self.wake.notify_one();
                    return;
                }
                // Bytes queued while we were finishing would be stranded:
                // look again.
                Flushed::Done if !self.has_pending() => return,
                Flushed::Done => {}
            }
        }
    }

    /// Writes the queue front to back with vectored writes. Only the holder
    /// of `flushing` removes from the front; others only append.
    fn write_pending(&self) -> Flushed {
        // On the stack: one flush per call is the common case, and it
        // should not allocate.
        let mut batch: [Bytes; MAX_IOV] = std::array::from_fn(|_| Bytes::new());
        loop {
            if let Err(e) = self.seal_some() {
                // 2^64 records on one connection: it cannot carry more.
                warn!(path = %self.path, error = %e, "record layer exhausted; closing the connection");
                let mut p = self.pending.lock();
                p.q.clear();
                p.plain.clear();
                return Flushed::Failed;
            }
            let n = {
                let q = self.pending.lock();
                let mut n = 0;
                for (slot, b) in batch.iter_mut().zip(q.q.iter()) {
                    *slot = b.clone();
                    n += 1;
                }
                n
            };
            if n == 0 {
                return Flushed::Done;
            }
            #[cfg(feature = "test-util")]
            let muted = crate::testing::is_muted(&self.muted, self.network);
            #[cfg(not(feature = "test-util"))]
            let muted = false;
            if muted || self.gate.as_ref().is_some_and(|g| !g.may_send()) {
                for b in &mut batch[..n] {
                    *b = Bytes::new();
                }
                self.gated.store(true, Ordering::Relaxed);
                return Flushed::Gated;
            }
            let slices: [io::IoSlice<'_>; MAX_IOV] =
                std::array::from_fn(|i| io::IoSlice::new(&batch[i]));
            let written = self.stream.try_write_vectored(&slices[..n]);
            self.writes.fetch_add(1, Ordering::Relaxed);
            for b in &mut batch[..n] {
                *b = Bytes::new();
            }
            match written {
                Ok(mut n) => {
                    let mut p = self.pending.lock();
                    let q = &mut p.q;
                    while n > 0 {
                        let Some(front) = q.front_mut() else { break };
                        if n >= front.len() {
                            n -= front.len();
                            q.pop_front();
                        } else {
                            front.advance(n);
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Flushed::Blocked,
                Err(e) => {
                    debug!(path = %self.path, error = %e, "write failed");
                    let mut p = self.pending.lock();
                    p.q.clear();
                    p.plain.clear();
                    return Flushed::Failed;
                }
            }
        }
    }

    /// The peer this connection reached, once known.
    pub(crate) fn peer(&self) -> Option<NodeId> {
        match self.peer.load(Ordering::Relaxed) {
            0 => None,
            n => Some(NodeId(n)),
        }
    }

    pub(crate) fn set_peer(&self, peer: NodeId) {
        self.peer.store(peer.0, Ordering::Relaxed);
        if let Some(d) = &self.detector {
            let _ = self.heard.set(d.heard_cell(peer, self.network));
        }
    }

    fn has_pending(&self) -> bool {
        let p = self.pending.lock();
        !p.q.is_empty() || !p.plain.is_empty()
    }

    /// Shuts the socket down both ways, as `ss -K` would: both ends see the
    /// connection end and the core fails the path over.
    pub(crate) fn kill(&self) {
        let _ = SockRef::from(self.stream.as_ref()).shutdown(Shutdown::Both);
    }

    /// Closes after the queued bytes (a CLOSE frame) are written, or after a
    /// second if the peer does not read them.
    pub(crate) async fn close_after_flush(self: Arc<Self>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while self.has_pending() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.kill();
    }
}

/// Finishes what the socket did not take at once, when it becomes writable.
async fn write_loop(io: Arc<ConnIo>) {
    loop {
        io.wake.notified().await;
        if io.failed.load(Ordering::Relaxed) && !io.has_pending() {
            return;
        }
        while io.has_pending() {
            if io.gated.swap(false, Ordering::Relaxed) {
                // The fence is shut: look again shortly (a heartbeat may move
                // it; if it closes for good, the connection is killed).
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if io.stream.writable().await.is_err() || io.failed.load(Ordering::Relaxed) {
                return;
            }
            io.flush();
            // Another thread may be writing; give it a moment rather than spin.
            if io.has_pending() {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Reads until the connection ends, feeding its session (or, until its
/// HELLO binds it, the router); then reports the path down.
async fn read_loop(
    shared: Arc<Shared>,
    io: Arc<ConnIo>,
    mut reader: OwnedReadHalf,
    mut bound: Option<Arc<SessionHandle>>,
    mut opener: Option<(Opener, BytesMut)>,
) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // The first records may have arrived with the handshake's last message.
    let mut first = opener.as_ref().is_some_and(|(_, raw)| !raw.is_empty());
    'read: loop {
        if !std::mem::take(&mut first) {
            // Insecure: bytes go straight to `buf`. Otherwise to `raw`,
            // whose whole records are opened into `buf`.
            let into = match &mut opener {
                Some((_, raw)) => raw,
                None => &mut buf,
            };
            if into.capacity() - into.len() < READ_CHUNK / 4 {
                into.reserve(READ_CHUNK);
            }
            match reader.read_buf(into).await {
                Ok(0) => break,
                Ok(n) => shared.stats.bytes_received(n),
                Err(e) => {
                    debug!(path = %io.path, error = %e, "read failed");
                    break;
                }
            }
        }
        let Some((o, raw)) = &mut opener else {
            if feed(&shared, &io, &mut bound, &mut buf).is_err() {
                break 'read;
            }
            continue;
        };
        // Every whole record of this read, opened in place, then one feed:
        // the session's lock, drive and wake-ups cost far more per call
        // than copying a record behind the first (which is handed over
        // without a copy when nothing is left over from the last feed).
        let opened = o.open(raw, &mut buf);
        if !buf.is_empty() && feed(&shared, &io, &mut bound, &mut buf).is_err() {
            break 'read;
        }
        if let Err(e) = opened {
            refused(&shared, &io, &e, "refused a record; closing the connection");
            break 'read;
        }
    }
    match bound {
        Some(h) => h.path_down(&shared, io.path),
        None => shared.unbound_down(io.path),
    }
}

/// The connection must close (the reason is logged and counted).
struct Close;

/// Counts bad input from the peer and logs it, rate-limited.
fn refused(shared: &Shared, io: &ConnIo, e: &dyn std::fmt::Display, what: &str) {
    shared.stats.refused_input();
    if let Some(n) = shared
        .log_refused
        .allow(shared.now().since_origin().as_secs())
    {
        warn!(path = %io.path, remote = %io.remote, error = %e, suppressed = n, "{what}");
    }
}

/// Feeds plaintext to the connection's session (or, until its HELLO binds
/// it, the router). A HELLO may move the path to another session
/// mid-buffer: the rest goes to wherever it belongs now.
fn feed(
    shared: &Arc<Shared>,
    io: &Arc<ConnIo>,
    bound: &mut Option<Arc<SessionHandle>>,
    buf: &mut BytesMut,
) -> Result<(), Close> {
    // Anything (authentic) from the peer counts as a heartbeat for this path.
    if let (Some(cell), Some(gate)) = (io.heard.get(), &io.gate) {
        cell.store(gate.now().as_nanos(), Ordering::Relaxed);
    }
    loop {
        let r = match &*bound {
            Some(h) => match h.input(shared, io.path, buf) {
                Ok(Input::Done) => return Ok(()),
                Ok(Input::Hello(hello)) => shared.route_hello(io, Some(h), &hello).map(Some),
                Err(e) => Err(e),
            },
            None => match shared.unbound_input(io, buf) {
                Ok(None) => return Ok(()),
                r => r,
            },
        };
        match r {
            Ok(Some(h)) => *bound = Some(h),
            Ok(None) => return Ok(()),
            Err(surelink_proto::PathError::UnknownPath(_)) => return Err(Close),
            Err(e) => {
                refused(
                    shared,
                    io,
                    &e,
                    "refused input from peer; closing the connection",
                );
                return Err(Close);
            }
        }
    }
}

pub(crate) fn configure(stream: &TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    if let Some(t) = shared.config.tcp_user_timeout {
        let _ = SockRef::from(stream).set_tcp_user_timeout(Some(t));
    }
}

/// Registers a connected stream as a new path and starts its tasks. The
/// receiver resolves when the connection has ended.
pub(crate) fn start(
    shared: &Arc<Shared>,
    stream: TcpStream,
    network: usize,
    peer: Option<NodeId>,
    secured: Option<Secured>,
    slot: Option<ConnSlot>,
) -> io::Result<oneshot::Receiver<()>> {
    let local = stream.local_addr()?;
    let remote = stream.peer_addr()?;
    let path = shared.next_path_id();
    let (reader, stream) = stream.into_split();
    if let (Some(s), Some(d)) = (&secured, &shared.detector) {
        if let Some(x) = &s.exporter {
            // Mutual TLS: this connection keys heartbeats to its peer.
            d.add_connection_key(s.peer, x);
        }
    }
    let (authenticated, sealer, opener) = match secured {
        Some(s) => (Some(s.peer), Some(s.sealer), Some((s.opener, s.leftover))),
        None => (None, None, None),
    };
    let io = Arc::new(ConnIo {
        path,
        network,
        local,
        remote,
        stream,
        pending: Mutex::new(Pending::default()),
        sealer: sealer.map(Mutex::new),
        flushing: AtomicBool::new(false),
        wake: Notify::new(),
        failed: AtomicBool::new(false),
        gated: AtomicBool::new(false),
        peer: AtomicU64::new(peer.map_or(0, |p| p.0)),
        #[cfg(feature = "test-util")]
        muted: shared.muted.clone(),
        gate: shared.detector.as_ref().map(|d| d.gate.clone()),
        detector: shared.detector.clone(),
        heard: std::sync::OnceLock::new(),
        authenticated,
        _slot: slot,
        writes: shared.stats.write_counter(),
    });
    if let Some(p) = peer {
        io.set_peer(p);
    }
    let (done_tx, done_rx) = oneshot::channel();
    let bound = match peer {
        Some(p) => shared.add_dialled(&io, p),
        None => {
            shared.add_accepted(&io);
            None
        }
    };
    // Every event of this connection's tasks carries its path, network and peer address.
    let span = tracing::info_span!("conn", %path, network, %remote, ?peer);
    shared.spawn(write_loop(io.clone()).instrument(span.clone()));
    let sh = shared.clone();
    shared.spawn(
        async move {
            read_loop(sh, io.clone(), reader, bound, opener).await;
            // The writer finishes what is queued (a CLOSE frame) and stops.
            io.failed.store(true, Ordering::Relaxed);
            io.wake.notify_one();
            let _ = done_tx.send(());
        }
        .instrument(span),
    );
    Ok(done_rx)
}

/// Binds `socket` to a network interface (`SO_BINDTODEVICE`), so its
/// traffic cannot leave by another network's interface.
pub(crate) fn bind_device(socket: &TcpSocket, device: Option<&str>) -> io::Result<()> {
    match device {
        Some(d) => SockRef::from(socket).bind_device(Some(d.as_bytes())),
        None => Ok(()),
    }
}

/// Opens a listening socket on `addr`.
pub(crate) fn listen(addr: SocketAddr, device: Option<&str>) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    bind_device(&socket, device)?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Accepts connections on network `network` for ever; each one's
/// handshake runs in its own task, under the accept limits.
pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, network: usize) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let slot = match shared.limits.acquire(from.ip()) {
                    Ok(s) => s,
                    Err(hit) => {
                        shared.stats.connection_refused();
                        if let Some(n) = shared
                            .log_limits
                            .allow(shared.now().since_origin().as_secs())
                        {
                            warn!(%from, network, limit = %hit, suppressed = n, "connection refused");
                        }
                        drop(stream);
                        continue;
                    }
                };
                let sh = shared.clone();
                tokio::spawn(async move { accepted(sh, stream, from, network, slot).await });
            }
            Err(e) => {
                warn!(network, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// An accepted connection: authenticate it (unless insecure), then start it.
async fn accepted(
    shared: Arc<Shared>,
    mut stream: TcpStream,
    from: SocketAddr,
    network: usize,
    mut slot: ConnSlot,
) {
    configure(&stream, &shared);
    let secured = match &shared.secure {
        None => None,
        Some(setup) => {
            let timeout = shared.config.core.handshake_timeout;
            match crate::secure::handshake(setup, &mut stream, None, timeout).await {
                Ok(s) => Some(s),
                Err(e) => {
                    shared.stats.handshake_failed();
                    if let Some(n) = shared
                        .log_handshake
                        .allow(shared.now().since_origin().as_secs())
                    {
                        warn!(%from, network, error = %e, suppressed = n, "handshake failed; connection closed");
                    }
                    return;
                }
            }
        }
    };
    slot.authenticated();
    if shared.closed.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = start(&shared, stream, network, None, secured, Some(slot)) {
        debug!(%from, error = %e, "accepted connection vanished");
    }
}
