//! One TCP connection under a path: its write queue and the task that
//! finishes writes the socket did not take at once (this file), the reader
//! that feeds the core (`read.rs`), and opening one — listening, accepting
//! under the limits, registering a connected stream (`open.rs`).
//!
//! What it does not do: frame or number anything (the core does), or
//! decide which session a connection joins (the router does).

mod open;
mod read;

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use socket2::SockRef;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tracing::{debug, warn};

use surelink_proto::secure::Sealer;
use surelink_proto::wire::CloseCode;
use surelink_proto::{NodeId, PathId};

use crate::admission::ConnSlot;
use crate::detector::{Detector, Gate, StreamHandles};
use crate::relay::SlotEnd;

/// What a new connection runs on.
pub(crate) enum Transport {
    /// A TCP connection. `relayed`: it leads to a helper that carries it
    /// to the peer (a path through a helper), so it is not the peer's
    /// network path: the detector neither stamps nor probes it.
    Tcp { stream: TcpStream, relayed: bool },
    /// A virtual connection a helper opened here (see `relay/`).
    Relay(Arc<SlotEnd>),
}

/// The write side of a connection.
#[derive(Debug)]
enum Wire {
    Tcp(OwnedWriteHalf),
    Relay(Arc<SlotEnd>),
}

pub(crate) use open::{accept_loop, bind_device, configure, listen, start, start_conn};
pub(crate) use read::{ConnReader, InlineReader};

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
    stream: Wire,
    /// This connection goes through a helper (see [`Transport`]).
    pub(crate) relayed: bool,
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
    /// Once the peer is known: when our data last left on this path, and
    /// the probe the detector's barrier reads (see `detector/streams.rs`).
    streams: std::sync::OnceLock<StreamHandles>,
    /// The node whose key the handshake proved (`None` when insecure).
    pub(crate) authenticated: Option<NodeId>,
    /// This connection's place under the accept limits (accepted ones only).
    _slot: Option<ConnSlot>,
    /// The record layer's sealer (`None` when insecure); used only by
    /// whoever holds `flushing`, so uncontended.
    sealer: Option<Mutex<Sealer>>,
    /// The endpoint's count of socket writes.
    writes: Arc<AtomicU64>,
    /// The code of the CLOSE the peer ended this path with, plus one (0:
    /// none), for the dial loop's next step.
    peer_close: std::sync::atomic::AtomicU32,
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
            let written = match &self.stream {
                Wire::Tcp(s) => s.try_write_vectored(&slices[..n]),
                Wire::Relay(e) => e.try_write(&batch[..n]),
            };
            self.writes.fetch_add(1, Ordering::Relaxed);
            for b in &mut batch[..n] {
                *b = Bytes::new();
            }
            match written {
                Ok(mut n) => {
                    if let (true, Some(h), Some(g)) = (n > 0, self.streams.get(), &self.gate) {
                        // Data stands in for busy heartbeats on this path.
                        h.carried.store(g.now().as_nanos(), Ordering::Relaxed);
                    }
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

    /// The peer ended this path with a CLOSE of `code`.
    pub(crate) fn set_peer_close(&self, code: CloseCode) {
        self.peer_close
            .store(u32::from(code.0) + 1, Ordering::Relaxed);
    }

    /// The code of the CLOSE the peer ended this path with, if it did.
    pub(crate) fn peer_close(&self) -> Option<CloseCode> {
        match self.peer_close.load(Ordering::Relaxed) {
            0 => None,
            n => u16::try_from(n - 1).ok().map(CloseCode),
        }
    }

    /// The network the core's path policy knows this connection by: its
    /// own, or for a path through a helper a network of its own
    /// (`relay::RELAY_NETWORK`), so activation can steer onto it.
    pub(crate) fn policy_network(&self) -> u8 {
        if self.relayed {
            crate::relay::RELAY_NETWORK
        } else {
            u8::try_from(self.network).unwrap_or(u8::MAX)
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
        if let (Some(d), false) = (&self.detector, self.relayed) {
            let _ = self.heard.set(d.heard_cell(peer, self.network));
            if let Wire::Tcp(s) = &self.stream {
                if let Some(h) = d.attach_stream(peer, self.network, s.as_ref().as_fd()) {
                    let _ = self.streams.set(h);
                }
            }
            if self.authenticated.is_some() {
                d.vouch(peer, self.remote.ip());
            }
        }
    }

    fn has_pending(&self) -> bool {
        let p = self.pending.lock();
        !p.q.is_empty() || !p.plain.is_empty()
    }

    /// Shuts the socket down both ways, as `ss -K` would: both ends see the
    /// connection end and the core fails the path over.
    pub(crate) fn kill(&self) {
        match &self.stream {
            Wire::Tcp(s) => {
                let _ = SockRef::from(s.as_ref()).shutdown(Shutdown::Both);
            }
            Wire::Relay(e) => e.close(0),
        }
    }

    /// Whether the connection's TCP has backed its retransmission timer
    /// off (what it sent went unacknowledged for a timeout or more): it
    /// carries nothing until its next retransmission, which may be a
    /// second away.
    pub(crate) fn tcp_backing_off(&self) -> bool {
        match &self.stream {
            Wire::Tcp(s) => {
                surelink_sys::stream::retransmit_backoff(s.as_ref().as_fd()).is_ok_and(|b| b > 0)
            }
            Wire::Relay(_) => false,
        }
    }

    /// [`ConnIo::kill`], and the socket resets when it closes instead of
    /// finishing: a FIN would wait behind a backed-off retransmission,
    /// a RST leaves at once, so the peer drops its end (and its own
    /// backed-off timer) and dials afresh.
    pub(crate) fn reset(&self) {
        if let Wire::Tcp(s) = &self.stream {
            let _ = SockRef::from(s.as_ref()).set_linger(Some(Duration::ZERO));
        }
        self.kill();
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
pub(super) async fn write_loop(io: Arc<ConnIo>) {
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
            let writable = match &io.stream {
                Wire::Tcp(s) => s.writable().await,
                Wire::Relay(e) => e.writable().await,
            };
            if writable.is_err() || io.failed.load(Ordering::Relaxed) {
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
