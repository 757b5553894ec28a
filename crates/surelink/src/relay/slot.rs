//! One virtual connection at the server: a client's byte stream that a
//! helper carries in records (`surelink_proto::helper::Record`). Its end
//! here reads what DATA records brought (bounded) and writes by appending
//! DATA records to the helper's link (bounded), so the connection above
//! it — handshake, record layer, session — runs as on any TCP stream.
//!
//! Reading: the handshake reads the slot as a stream (a waker per read);
//! once the connection runs, its [`InlineReader`] is installed here and
//! the task that delivered a relay message feeds every slot it brought
//! bytes for ([`SlotEnd::drain`]) — no task of the slot's own is woken.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::link::RelayLink;
use crate::conn::InlineReader;

/// Bytes a slot holds that its connection has not read: a client's
/// session keeps at most its send window in flight, well under this; a
/// helper that sends more is closing the slot. All of one helper's slots
/// together hold at most `link::LINK_IN_BOUND`.
pub(crate) const SLOT_IN_BOUND: usize = 4 << 20;

#[derive(Debug, Default)]
struct Inbound {
    q: VecDeque<Bytes>,
    bytes: usize,
    /// No more will come (CLOSE, or our side closed).
    ended: bool,
    reader: Option<Waker>,
}

/// The server's end of one slot.
#[derive(Debug)]
pub(crate) struct SlotEnd {
    pub(crate) slot: u32,
    link: Arc<RelayLink>,
    inbound: Mutex<Inbound>,
    closed: AtomicBool,
    /// The connection's reader once it runs (`None` before, and after it
    /// finished). Whoever holds this lock feeds the slot.
    reader: Mutex<Option<InlineReader>>,
    /// `reader` was installed: deliveries drain instead of waking.
    inline: AtomicBool,
    /// A drain of this slot is already on a delivery's list.
    listed: AtomicBool,
}

impl SlotEnd {
    pub(crate) fn new(slot: u32, link: Arc<RelayLink>) -> Arc<SlotEnd> {
        Arc::new(SlotEnd {
            slot,
            link,
            inbound: Mutex::new(Inbound::default()),
            closed: AtomicBool::new(false),
            reader: Mutex::new(None),
            inline: AtomicBool::new(false),
            listed: AtomicBool::new(false),
        })
    }

    /// The connection above the slot runs: from now on its bytes are fed
    /// by [`SlotEnd::drain`] (which runs once now, for what came meanwhile).
    pub(crate) fn install(self: &Arc<Self>, r: InlineReader) {
        *self.reader.lock() = Some(r);
        self.inline.store(true, Ordering::Release);
        self.drain();
    }

    /// Whether the caller that pushed bytes should put the slot on its
    /// list to [`drain`](SlotEnd::drain) (once per list: `false` when
    /// it is already on one, or when a reader task reads it).
    pub(crate) fn wants_drain(&self) -> bool {
        self.inline.load(Ordering::Acquire) && !self.listed.swap(true, Ordering::AcqRel)
    }

    /// Feeds the slot's connection everything queued, in order, unless
    /// another caller is doing so (it then looks again before it lets go,
    /// so nothing pushed meanwhile is left waiting); at the end of the
    /// stream, reports the path down. Call without locks held.
    pub(crate) fn drain(self: &Arc<Self>) {
        loop {
            let Some(mut guard) = self.reader.try_lock() else {
                return;
            };
            self.listed.store(false, Ordering::Release);
            let Some(r) = guard.as_mut() else { return };
            let (chunks, ended) = {
                let mut i = self.inbound.lock();
                let n = i.bytes;
                i.bytes = 0;
                self.link.release_in(n);
                (std::mem::take(&mut i.q), i.ended)
            };
            let alive = r.take(chunks.into_iter());
            if !alive || ended {
                if let Some(r) = guard.take() {
                    drop(guard);
                    r.finish();
                }
                return;
            }
            drop(guard);
            let i = self.inbound.lock();
            if i.q.is_empty() && !i.ended {
                return;
            }
        }
    }

    /// A drain on a task of its own, for an end found where no drain
    /// may run (under a session's lock).
    fn drain_later(self: &Arc<Self>) {
        if self.inline.load(Ordering::Acquire) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let me = self.clone();
                rt.spawn(async move { me.drain() });
            }
        }
    }

    /// The helper's relay this slot belongs to.
    pub(crate) fn link(&self) -> &Arc<RelayLink> {
        &self.link
    }

    /// Bytes a DATA record brought. `false`: past [`SLOT_IN_BOUND`]; the
    /// caller closes the slot.
    pub(crate) fn push(&self, b: Bytes) -> bool {
        let waker = {
            let mut i = self.inbound.lock();
            if i.ended {
                return true;
            }
            if i.bytes + b.len() > SLOT_IN_BOUND || !self.link.hold_in(b.len()) {
                return false;
            }
            i.bytes += b.len();
            i.q.push_back(b);
            i.reader.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// No more bytes come: the reader sees the end of the stream.
    pub(crate) fn end_inbound(self: &Arc<Self>) {
        let waker = {
            let mut i = self.inbound.lock();
            i.ended = true;
            // What the reader did not take is let go (and its room).
            self.link.release_in(i.bytes);
            i.bytes = 0;
            i.q.clear();
            i.reader.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        self.drain_later();
    }

    /// Our side ends the slot: tells the helper (CLOSE) once, and ends
    /// the reader.
    pub(crate) fn close(self: &Arc<Self>, code: u16) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.link.close_slot(self.slot, code);
        }
        self.end_inbound();
    }

    /// Writes every byte of `bufs` as DATA records, or none
    /// (`WouldBlock`) while the link's queue is full.
    pub(crate) fn try_write(&self, bufs: &[Bytes]) -> io::Result<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        self.link.try_data(self.slot, bufs, false)
    }

    /// Resolves when the link's queue has room (or the slot is closed).
    pub(crate) async fn writable(&self) -> io::Result<()> {
        loop {
            let room = self.link.room.notified();
            if self.closed.load(Ordering::Acquire) {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            if self.link.has_room() {
                return Ok(());
            }
            room.await;
        }
    }

    fn poll_read_into(&self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut guard = self.inbound.lock();
        let i = &mut *guard;
        while out.remaining() > 0 {
            let Some(front) = i.q.front_mut() else { break };
            let n = front.len().min(out.remaining());
            out.put_slice(&front[..n]);
            front.advance(n);
            i.bytes -= n;
            self.link.release_in(n);
            if front.is_empty() {
                i.q.pop_front();
            }
        }
        if out.filled().is_empty() && !i.ended {
            i.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

/// A slot as a byte stream: reads what the helper brought, writes DATA
/// records. The handshake uses it whole; afterwards the connection's
/// reader reads it and its writer goes through [`SlotEnd::try_write`].
#[derive(Debug, Clone)]
pub(crate) struct SlotStream(pub(crate) Arc<SlotEnd>);

impl AsyncRead for SlotStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.poll_read_into(cx, buf)
    }
}

impl AsyncWrite for SlotStream {
    /// The handshake's few messages: taken whatever the link's queue
    /// holds (they are bounded by the handshake itself).
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.0.closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Poll::Ready(
            self.0
                .link
                .try_data(self.0.slot, &[Bytes::copy_from_slice(buf)], true),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.close(0);
        Poll::Ready(Ok(()))
    }
}
