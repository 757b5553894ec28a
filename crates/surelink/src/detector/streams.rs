//! Connections as the detector sees them: busy pairs let their data stand
//! in for busy-pace heartbeats (the core's `Pacer::admit_copy`), so the
//! sender must know when each path last carried data, and the receiver's
//! barrier must see data that waits unread in a connection behind our own
//! stalled reader (the core monitor's "Data as heartbeats").
//!
//! Per connection, once its peer is known: a *carried* cell the writer
//! stamps after every write (one per path, shared by its connections), and
//! a [`StreamProbe`]: a duplicate of the socket's descriptor, to read its
//! receive queue, and a flag its reader holds from a read until the bytes
//! read are stamped as heard.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use surelink_proto::detector::{Monitor, PathUse, Watch};
use surelink_proto::{NodeId, Time};

use super::Detector;

/// One connection's receive side, as the barrier reads it.
#[derive(Debug)]
pub(crate) struct StreamProbe {
    /// A duplicate of the connection's socket (closed with the probe).
    fd: OwnedFd,
    /// The reader is between a read and the stamp of what it read.
    reading: AtomicBool,
    /// The reader has exited: what the socket still holds is read by
    /// nobody, and says nothing of the path (a killed connection may
    /// linger until its session lets it go).
    gone: AtomicBool,
}

impl StreamProbe {
    /// The reader is about to read (a system call may take bytes out of
    /// the queue before they are stamped).
    pub(crate) fn begin_read(&self) {
        self.reading.store(true, Ordering::SeqCst);
    }

    /// What the reader read is stamped (or it read nothing).
    pub(crate) fn end_read(&self) {
        self.reading.store(false, Ordering::Release);
    }

    /// The connection's reader exited.
    pub(crate) fn reader_gone(&self) {
        self.gone.store(true, Ordering::Release);
    }

    /// Whether bytes may be waiting unstamped: queued in the socket, or
    /// read and not stamped yet. The queue is read before the flag: bytes
    /// a read took after the first look are covered by its flag, and once
    /// the flag is down, by its stamp. An error reads as "maybe".
    fn unread(&self) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return false;
        }
        let queued = surelink_sys::stream::unread_bytes(self.fd.as_fd()).map_or(true, |n| n > 0);
        queued || self.reading.load(Ordering::Acquire)
    }
}

/// What a connection to a known peer holds of the detector.
#[derive(Debug)]
pub(crate) struct StreamHandles {
    /// Stamped (ns on the gate's clock) after every write that moved bytes.
    pub(crate) carried: Arc<AtomicU64>,
    /// Read by the barrier; the detector keeps only a weak reference.
    pub(crate) probe: Arc<StreamProbe>,
}

#[derive(Default)]
struct PathStreams {
    carried: Arc<AtomicU64>,
    probes: Vec<Weak<StreamProbe>>,
}

/// Every path's connections.
#[derive(Default)]
pub(super) struct Streams {
    paths: BTreeMap<(NodeId, usize), PathStreams>,
}

impl Streams {
    pub(super) fn forget(&mut self, peer: NodeId) {
        self.paths.retain(|(p, _), _| *p != peer);
    }
}

impl Detector {
    /// A connection on `network` reached `peer`: its handles, or `None` if
    /// the socket could not be duplicated (its data then does not stand in
    /// for heartbeats: the path's carried cell is not handed out).
    pub(crate) fn attach_stream(
        &self,
        peer: NodeId,
        network: usize,
        socket: BorrowedFd<'_>,
    ) -> Option<StreamHandles> {
        let fd = socket.try_clone_to_owned().ok()?;
        let probe = Arc::new(StreamProbe {
            fd,
            reading: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        });
        let mut s = self.streams.lock();
        let path = s.paths.entry((peer, network)).or_default();
        // Bounded by the live connections: dead ones go as others come.
        path.probes.retain(|p| p.strong_count() > 0);
        path.probes.push(Arc::downgrade(&probe));
        Some(StreamHandles {
            carried: path.carried.clone(),
            probe,
        })
    }

    /// How each destination's path (of `peers`, or every one) carried
    /// data: our last write, our last write or read, and the same for the
    /// pair (see `Pacer::admit_copy`).
    pub(super) fn path_usage(
        &self,
        peers: Option<&[(NodeId, u16)]>,
    ) -> BTreeMap<(NodeId, usize), PathUse> {
        let keys: Vec<(NodeId, usize)> = {
            let d = self.dests.lock();
            match peers {
                None => d.keys().copied().collect(),
                Some(ps) => ps
                    .iter()
                    .flat_map(|(p, _)| d.range((*p, 0)..=(*p, usize::MAX)).map(|(k, _)| *k))
                    .collect(),
            }
        };
        let at = |t: u64| (t > 0).then(|| Time::from_nanos(t));
        let wrote: Vec<Option<Time>> = {
            let s = self.streams.lock();
            keys.iter()
                .map(|k| {
                    at(s.paths
                        .get(k)
                        .map_or(0, |p| p.carried.load(Ordering::Relaxed)))
                })
                .collect()
        };
        let read: Vec<Option<Time>> = {
            let h = self.heard.lock();
            keys.iter()
                .map(|k| at(h.get(k).map_or(0, |c| c.load(Ordering::Relaxed))))
                .collect()
        };
        let mut out: BTreeMap<(NodeId, usize), PathUse> = BTreeMap::new();
        let mut pair: BTreeMap<NodeId, Option<Time>> = BTreeMap::new();
        for ((k, w), r) in keys.iter().zip(wrote).zip(read) {
            let used = w.max(r);
            let p = pair.entry(k.0).or_default();
            *p = (*p).max(used);
            out.insert(
                *k,
                PathUse {
                    wrote: w,
                    used,
                    pair_used: None,
                },
            );
        }
        for (k, u) in &mut out {
            u.pair_used = pair.get(&k.0).copied().flatten();
        }
        out
    }

    /// The paths among `paths` with a connection that may hold bytes not
    /// yet stamped as heard.
    pub(super) fn unread_streams(&self, paths: &[Watch]) -> Vec<Watch> {
        let s = self.streams.lock();
        paths
            .iter()
            .filter(|w| {
                s.paths
                    .get(&(w.peer, usize::from(w.network)))
                    .is_some_and(|p| {
                        p.probes
                            .iter()
                            .filter_map(Weak::upgrade)
                            .any(|p| p.unread())
                    })
            })
            .copied()
            .collect()
    }

    /// Gives the monitor every connection's latest read stamp.
    pub(super) fn fold_heard(&self, monitor: &mut Monitor) {
        for (&(peer, network), cell) in self.heard.lock().iter() {
            let t = cell.load(Ordering::Relaxed);
            if let (true, Ok(network)) = (t > 0, u16::try_from(network)) {
                monitor.handle_heard(Time::from_nanos(t), Watch { peer, network });
            }
        }
    }
}
