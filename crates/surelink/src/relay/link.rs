//! One helper's relay at this server: its table of open slots and the
//! queue of records going back to it, which one task sends as relay
//! messages of the helper's own session — every slot's replies that
//! queued meanwhile in one message, so the server pays one send (and the
//! helper one receive) for many clients.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tracing::debug;

use surelink_proto::helper::{Record, SlotTable};
use surelink_proto::rpc::Priority;
use surelink_proto::NodeId;

use super::slot::SlotEnd;
use crate::call::{self, Flush};
use crate::shared::Shared;

/// Bytes of records queued for the helper before slots' writers wait.
pub(crate) const LINK_OUT_BOUND: usize = 1 << 20;

/// Bytes all of one helper's slots hold unread, at most (the default
/// bound on what one peer's one-way messages may hold, 64 MiB): a record
/// past it closes its slot.
pub(crate) const LINK_IN_BOUND: usize = 64 << 20;

/// The most bytes one relay message holds (records are never split
/// across messages; a long write becomes several DATA records).
pub(crate) const RELAY_MESSAGE: usize = 256 * 1024;

/// The longest DATA record body we write.
const DATA_PIECE: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Out {
    /// Encoded records, each chunk at most [`RELAY_MESSAGE`] (but one
    /// record alone).
    chunks: VecDeque<BytesMut>,
    bytes: usize,
}

impl Out {
    fn append(&mut self, r: &Record) {
        let len = r.encoded_len();
        match self.chunks.back_mut() {
            Some(c) if c.len() + len <= RELAY_MESSAGE => {
                let _ = r.encode(c);
            }
            _ => {
                let mut c = BytesMut::with_capacity(len.max(4096));
                let _ = r.encode(&mut c);
                self.chunks.push_back(c);
            }
        }
        self.bytes += len;
    }
}

/// One helper's relay at this server.
#[derive(Debug)]
pub(crate) struct RelayLink {
    pub(crate) helper: NodeId,
    pub(crate) slots: Mutex<SlotTable<Arc<SlotEnd>>>,
    out: Mutex<Out>,
    wake: Notify,
    /// Woken when the queue drained (slots' writers wait on it).
    pub(crate) room: Notify,
    ended: AtomicBool,
    /// Bytes the slots hold unread.
    held_in: std::sync::atomic::AtomicUsize,
    /// Slots in their handshake now.
    pub(crate) handshaking: std::sync::atomic::AtomicUsize,
}

impl RelayLink {
    pub(crate) fn new(helper: NodeId, max_slots: usize) -> Arc<RelayLink> {
        Arc::new(RelayLink {
            helper,
            slots: Mutex::new(SlotTable::new(max_slots)),
            out: Mutex::new(Out::default()),
            wake: Notify::new(),
            room: Notify::new(),
            ended: AtomicBool::new(false),
            held_in: std::sync::atomic::AtomicUsize::new(0),
            handshaking: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Takes room for `n` unread bytes; `false` past [`LINK_IN_BOUND`].
    pub(crate) fn hold_in(&self, n: usize) -> bool {
        let prev = self.held_in.fetch_add(n, Ordering::AcqRel);
        if prev + n > LINK_IN_BOUND {
            self.held_in.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// `n` unread bytes were read (or let go).
    pub(crate) fn release_in(&self, n: usize) {
        self.held_in.fetch_sub(n, Ordering::AcqRel);
    }

    pub(crate) fn has_room(&self) -> bool {
        self.out.lock().bytes < LINK_OUT_BOUND
    }

    /// Queues `bufs` as DATA records of `slot`: all of them, or none
    /// (`WouldBlock`) while the queue is full, unless `force`.
    pub(crate) fn try_data(&self, slot: u32, bufs: &[Bytes], force: bool) -> io::Result<usize> {
        if self.ended.load(Ordering::Acquire) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut total = 0;
        {
            let mut o = self.out.lock();
            if !force && o.bytes >= LINK_OUT_BOUND {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            for b in bufs {
                let mut b = b.clone();
                total += b.len();
                while !b.is_empty() {
                    let body = b.split_to(b.len().min(DATA_PIECE));
                    o.append(&Record::Data { slot, body });
                }
            }
        }
        self.wake.notify_one();
        Ok(total)
    }

    /// Our side ended `slot`: forget it and tell the helper.
    pub(crate) fn close_slot(&self, slot: u32, code: u16) {
        self.slots.lock().remove(slot);
        if !self.ended.load(Ordering::Acquire) {
            self.out.lock().append(&Record::Close { slot, code });
            self.wake.notify_one();
        }
    }

    /// The helper is gone (dead, unreachable, or its relay refused): every
    /// slot ends, so the clients' sessions fail those paths over.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
        let ends: Vec<_> = self.slots.lock().drain().collect();
        for e in ends {
            e.end_inbound();
        }
        self.room.notify_waiters();
        self.wake.notify_one();
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

/// Sends what the link queued, one relay message per chunk, until the
/// link ends or the endpoint does.
pub(crate) async fn flush_loop(shared: Weak<Shared>, link: Arc<RelayLink>, channel: u16) {
    loop {
        link.wake.notified().await;
        loop {
            let chunks: Vec<Bytes> = {
                let mut o = link.out.lock();
                o.bytes = 0;
                o.chunks.drain(..).map(BytesMut::freeze).collect()
            };
            link.room.notify_waiters();
            if chunks.is_empty() || link.is_ended() {
                break;
            }
            let Some(sh) = shared.upgrade() else { return };
            if let Err(e) = call::send(
                &sh,
                link.helper,
                channel,
                Priority::Normal,
                chunks.into_iter(),
                Flush::Batched,
            )
            .await
            {
                debug!(helper = %link.helper, error = %e, "relay message to the helper not sent; ending its slots");
                link.end();
            }
        }
        if link.is_ended() {
            return;
        }
    }
}
