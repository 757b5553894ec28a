//! The reader of one connection: reads, opens records (unless insecure),
//! and feeds the plaintext to its session — or, until its HELLO binds it,
//! to the router — then reports the path down when the connection ends.
//!
//! A TCP connection has a task of its own that reads ([`read_loop`]). A
//! connection a helper carries has none: its bytes arrive in the helper's
//! relay messages, and the task that took one opens and feeds every slot
//! it brought bytes for ([`InlineReader`]) — a task hand-off per client per
//! relay message was the helped server's largest cost.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::{debug, warn};

use surelink_proto::secure::Opener;
use surelink_proto::Input;

use super::ConnIo;
use crate::session::SessionHandle;
use crate::shared::Shared;
use surelink_proto::wire::CloseCode;
use tokio::sync::oneshot;

/// The read side of a connection: a TCP socket's read half, or a
/// helper's slot (see `relay/`).
pub(crate) type ConnReader = Box<dyn AsyncRead + Send + Unpin>;

/// Bytes asked of the kernel per read.
const READ_CHUNK: usize = 64 * 1024;

/// Reads until the connection ends, feeding its session (or, until its
/// HELLO binds it, the router); then reports the path down.
pub(super) async fn read_loop(
    shared: Arc<Shared>,
    io: Arc<ConnIo>,
    mut reader: ConnReader,
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
            // The barrier must not take bytes read but not yet stamped
            // for silence: the probe's flag covers them (up only around
            // the read itself, not while it waits).
            #[cfg(feature = "test-util")]
            if let Some(d) = &io.detector {
                d.stall_connection_reader().await;
            }
            let read = reader.read_buf(into);
            tokio::pin!(read);
            let got = std::future::poll_fn(|cx| {
                let probe = io.streams.get().map(|h| &h.probe);
                if let Some(p) = probe {
                    p.begin_read();
                }
                let r = read.as_mut().poll(cx);
                if let (Some(p), true) = (probe, r.is_pending()) {
                    p.end_read();
                }
                r
            })
            .await;
            match got {
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
            end_read(&io);
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
        // A partial record in hand is not stamped: nothing authentic yet.
        end_read(&io);
    }
    end_read(&io);
    if let Some(h) = io.streams.get() {
        h.probe.reader_gone();
    }
    match bound {
        Some(h) => h.path_down(&shared, io.path),
        None => shared.unbound_down(io.path),
    }
}

/// The read side of a connection a helper carries, run by whoever
/// delivers its bytes (see the module docs): the state [`read_loop`]
/// keeps on its stack, kept here between deliveries.
pub(crate) struct InlineReader {
    shared: Weak<Shared>,
    io: Arc<ConnIo>,
    bound: Option<Arc<SessionHandle>>,
    /// The record layer's opener and the bytes of a record not whole yet
    /// (`None` when insecure).
    opener: Option<(Opener, BytesMut)>,
    /// Plaintext not fed yet.
    buf: BytesMut,
    done: oneshot::Sender<Option<CloseCode>>,
}

impl std::fmt::Debug for InlineReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineReader")
            .field("path", &self.io.path)
            .finish_non_exhaustive()
    }
}

impl InlineReader {
    pub(super) fn new(
        shared: &Arc<Shared>,
        io: Arc<ConnIo>,
        bound: Option<Arc<SessionHandle>>,
        opener: Option<(Opener, BytesMut)>,
        done: oneshot::Sender<Option<CloseCode>>,
    ) -> InlineReader {
        InlineReader {
            shared: Arc::downgrade(shared),
            io,
            bound,
            opener,
            buf: BytesMut::new(),
            done,
        }
    }

    /// Opens and feeds `chunks` (and whatever was left of the last ones).
    /// `false`: the connection must end (bad input, or the endpoint is gone).
    pub(crate) fn take(&mut self, chunks: impl Iterator<Item = bytes::Bytes>) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        let into = match &mut self.opener {
            Some((_, raw)) => raw,
            None => &mut self.buf,
        };
        let mut n = 0;
        for c in chunks {
            n += c.len();
            into.extend_from_slice(&c);
        }
        if n > 0 {
            shared.stats.bytes_received(n);
        }
        let Some((o, raw)) = &mut self.opener else {
            return self.buf.is_empty()
                || feed(&shared, &self.io, &mut self.bound, &mut self.buf).is_ok();
        };
        let opened = o.open(raw, &mut self.buf);
        if !self.buf.is_empty() && feed(&shared, &self.io, &mut self.bound, &mut self.buf).is_err()
        {
            return false;
        }
        if let Err(e) = opened {
            refused(
                &shared,
                &self.io,
                &e,
                "refused a record; closing the connection",
            );
            return false;
        }
        true
    }

    /// The connection ended: its path is down, and its writer finishes
    /// what is queued (a CLOSE frame) and stops.
    pub(crate) fn finish(self) {
        if let Some(shared) = self.shared.upgrade() {
            match self.bound {
                Some(h) => h.path_down(&shared, self.io.path),
                None => shared.unbound_down(self.io.path),
            }
        }
        self.io.failed.store(true, Ordering::Relaxed);
        self.io.wake.notify_one();
        let _ = self.done.send(self.io.peer_close());
    }
}

/// What the reader read is stamped as heard (or was nothing authentic).
fn end_read(io: &ConnIo) {
    if let Some(h) = io.streams.get() {
        h.probe.end_read();
    }
}

/// The connection must close (the reason is logged and counted).
struct Close;

/// Counts bad input from the peer and logs it, rate-limited.
fn refused(shared: &Shared, io: &ConnIo, e: &dyn std::fmt::Display, what: &str) {
    shared.stats.refused_input();
    if let Some(n) = shared
        .logs
        .refused
        .allow(shared.clock.now().since_origin().as_secs())
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
    end_read(io);
    loop {
        let r = match &*bound {
            Some(h) => {
                // Where the peer's data comes from sets the detector's pace.
                h.set_relayed(shared, io.relayed);
                match h.input(shared, io.path, buf) {
                    Ok(Input::Done) => return Ok(()),
                    Ok(Input::Hello(hello)) => shared.route_hello(io, Some(h), hello).map(Some),
                    Err(e) => Err(e),
                }
            }
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
