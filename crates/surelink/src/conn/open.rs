//! Opening connections: listening sockets, the accept loop under the
//! connection limits, the handshake of an accepted connection, and
//! registering a connected stream as a new path with its tasks.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use socket2::SockRef;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Notify};
use tracing::{debug, warn, Instrument};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use surelink_proto::wire::{Close, CloseCode, CloseScope};
use surelink_proto::NodeId;

use super::read::{read_loop, InlineReader};
use super::{write_loop, ConnIo, ConnReader, Pending, Transport, Wire};
use crate::admission::{ConnSlot, LimitHit};
use crate::secure::Secured;
use crate::shared::Shared;

pub(crate) fn configure(stream: &TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    if let Some(t) = shared.config.tcp_user_timeout {
        let _ = SockRef::from(stream).set_tcp_user_timeout(Some(t));
    }
}

/// Registers a connected stream as a new path and starts its tasks. The
/// receiver resolves when the connection has ended, with the code of the
/// CLOSE the peer ended it with, if it did.
pub(crate) fn start(
    shared: &Arc<Shared>,
    transport: Transport,
    network: usize,
    peer: Option<NodeId>,
    secured: Option<Secured>,
    slot: Option<ConnSlot>,
) -> io::Result<oneshot::Receiver<Option<CloseCode>>> {
    start_conn(shared, transport, network, peer, secured, slot).map(|(_, done)| done)
}

/// [`start`], also handing back the connection (to close it later).
pub(crate) fn start_conn(
    shared: &Arc<Shared>,
    transport: Transport,
    network: usize,
    peer: Option<NodeId>,
    secured: Option<Secured>,
    slot: Option<ConnSlot>,
) -> io::Result<(Arc<ConnIo>, oneshot::Receiver<Option<CloseCode>>)> {
    let path = shared.next_path_id();
    // A TCP connection's reader is a task; a slot's bytes are fed by
    // whoever delivers them (`InlineReader`).
    let (local, remote, reader, stream, relayed) = match transport {
        Transport::Tcp { stream, relayed } => {
            let (local, remote) = (stream.local_addr()?, stream.peer_addr()?);
            let (r, w) = stream.into_split();
            let r: ConnReader = Box::new(r);
            (local, remote, Ok(r), Wire::Tcp(w), relayed)
        }
        Transport::Relay(end) => {
            // No address of its own: it arrives through the helper's session.
            let none = SocketAddr::from(([0, 0, 0, 0], 0));
            (none, none, Err(end.clone()), Wire::Relay(end), true)
        }
    };
    if let (Some(s), Some(d), false) = (&secured, &shared.detector, relayed) {
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
        relayed,
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
        streams: std::sync::OnceLock::new(),
        authenticated,
        _slot: slot,
        writes: shared.stats.write_counter(),
        peer_close: std::sync::atomic::AtomicU32::new(0),
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
    let reader = match reader {
        Ok(r) => r,
        Err(end) => {
            end.install(InlineReader::new(
                shared,
                io.clone(),
                bound,
                opener,
                done_tx,
            ));
            return Ok((io, done_rx));
        }
    };
    let sh = shared.clone();
    let conn = io.clone();
    shared.spawn(
        async move {
            read_loop(sh, io.clone(), reader, bound, opener).await;
            // The writer finishes what is queued (a CLOSE frame) and stops.
            io.failed.store(true, Ordering::Relaxed);
            io.wake.notify_one();
            let _ = done_tx.send(io.peer_close());
        }
        .instrument(span),
    );
    Ok((conn, done_rx))
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
                let slot = match shared.limits.acquire(from.ip(), std::time::Instant::now()) {
                    Ok(s) => s,
                    Err(hit) => {
                        refused(&shared, from, network, hit);
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

/// Counts and (rate-limited) logs a connection closed at a limit.
fn refused(shared: &Shared, from: SocketAddr, network: usize, hit: LimitHit) {
    shared.stats.connection_refused(hit.index());
    if let Some(n) = shared
        .logs
        .limits
        .allow(shared.clock.now().since_origin().as_secs())
    {
        warn!(%from, network, limit = %hit, suppressed = n, "connection refused");
    }
}

/// How long a refused connection is given to take its CLOSE.
const REFUSAL_WRITE: Duration = Duration::from_millis(100);

/// Tells an authenticated peer its connection is refused at a limit: one
/// sealed CLOSE (path scope, [`CloseCode::LIMIT`]), written within
/// [`REFUSAL_WRITE`], then the connection is dropped.
async fn refuse_with_close(stream: &mut TcpStream, mut s: Secured, hit: &LimitHit) {
    let close = Close {
        scope: CloseScope::Path,
        code: CloseCode::LIMIT,
        reason: hit.to_string(),
    };
    let mut plain = BytesMut::new();
    close.encode(&mut plain);
    if let Ok(record) = s.sealer.seal_to_bytes([&plain[..]]) {
        let _ = tokio::time::timeout(REFUSAL_WRITE, stream.write_all(&record)).await;
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
                        .logs
                        .handshake
                        .allow(shared.clock.now().since_origin().as_secs())
                    {
                        warn!(%from, network, error = %e, suppressed = n, "handshake failed; connection closed");
                    }
                    return;
                }
            }
        }
    };
    if let Err(hit) = slot.authenticated(secured.as_ref().map(|s| s.peer)) {
        // The member's other connections are kept; this one is closed
        // before anything is allocated for it, with a CLOSE saying why (so
        // the dialler backs off instead of retrying at once).
        if let Some(s) = secured {
            refuse_with_close(&mut stream, s, &hit).await;
        }
        refused(&shared, from, network, hit);
        return;
    }
    if shared.closed.load(Ordering::Relaxed) {
        return;
    }
    let t = Transport::Tcp {
        stream,
        relayed: false,
    };
    if let Err(e) = start(&shared, t, network, None, secured, Some(slot)) {
        debug!(%from, error = %e, "accepted connection vanished");
    }
}
