//! One pipelined connection to memcached, re-opened when it breaks, that
//! turns the `get`s queued on it meanwhile into one multi-get.
//!
//! Commands queue while the connection's writer is busy or not yet
//! woken; when it runs it writes them all. A run of consecutive `get`s
//! (or of `gets`) becomes one `get k1 k2 …` line with each key once: a
//! helper's batch of many clients' reads — and a hot key read by all of
//! them — costs memcached one command and one lookup per distinct key.
//! Only adjacent reads merge, so a read never passes a write queued
//! before it (a key always uses the same connection: see the module
//! above), and the merged read answers each at one moment, as if they
//! had run back to back.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, MutexGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tracing::{debug, warn};

use crate::text::split_values;

/// Most distinct keys in one merged `get` line.
pub(super) const MAX_MERGED_KEYS: usize = 128;
/// Longest merged `get` line, bytes (memcached reads long `get` lines,
/// but a line this size is already many requests' worth).
pub(super) const MAX_MERGED_LINE: usize = 8 << 10;

/// How a reply ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// `VALUE` blocks then `END` (or one error line).
    Values,
    /// One line.
    Line,
    /// Meta answers (a `VA` line with its value block, or one line) up to
    /// and with the `MN` line that follows the command.
    Meta,
}

pub(super) type Reply = oneshot::Receiver<Result<Bytes, String>>;
type Slot = oneshot::Sender<Result<Bytes, String>>;

/// A command not written yet.
enum Queued {
    /// Any command, already encoded.
    Line(Bytes, Shape, Slot),
    /// A `get` (`cas`: `gets`) of these keys, merged at write time with
    /// the reads queued next to it.
    Get(Vec<Bytes>, bool, Slot),
}

/// A written command waiting for its reply.
enum Waiting {
    One(Shape, Slot),
    /// A merged `get`: each asker's keys and where its answer goes.
    Merged(Vec<(Vec<Bytes>, Slot)>),
}

#[derive(Default)]
struct Inner {
    queued: VecDeque<Queued>,
    waiting: VecDeque<Waiting>,
    /// The connection is down: commands fail at once until it is back.
    down: bool,
}

/// What the connection's merging did (all connections of a handler add
/// into one).
#[derive(Debug, Default)]
pub struct MergeStats {
    /// `get`/`gets` requests handed to the connections.
    pub gets: AtomicU64,
    /// `get` lines written to memcached for them.
    pub get_lines: AtomicU64,
    /// Keys written in those lines (each distinct key of a line once).
    pub keys_sent: AtomicU64,
}

/// One pipelined connection to memcached.
pub(super) struct Conn {
    pub(super) addr: SocketAddr,
    inner: Mutex<Inner>,
    wake: Notify,
    stats: Arc<MergeStats>,
}

impl Conn {
    pub(super) fn new(addr: SocketAddr, stats: Arc<MergeStats>) -> Conn {
        Conn {
            addr,
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
            stats,
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn queue(&self, q: Queued) {
        let mut i = self.inner();
        if i.down {
            let slot = match q {
                Queued::Line(_, _, s) | Queued::Get(_, _, s) => s,
            };
            let _ = slot.send(Err("memcached connection down".into()));
            return;
        }
        i.queued.push_back(q);
        drop(i);
        self.wake.notify_one();
    }

    /// Queues `cmd` (already encoded); the reply arrives on the receiver.
    pub(super) fn send(&self, cmd: &[u8], shape: Shape) -> Reply {
        let (tx, rx) = oneshot::channel();
        self.queue(Queued::Line(Bytes::copy_from_slice(cmd), shape, tx));
        rx
    }

    /// Queues a read of `keys` (`cas`: `gets`), to be merged with the
    /// reads next to it; the reply is memcached's to exactly this read.
    pub(super) fn get(&self, keys: Vec<Bytes>, cas: bool) -> Reply {
        let (tx, rx) = oneshot::channel();
        self.stats.gets.fetch_add(1, Relaxed);
        self.queue(Queued::Get(keys, cas, tx));
        rx
    }

    /// Fails every queued and waiting command and marks the connection
    /// down.
    fn broke(&self, why: &str) {
        let mut i = self.inner();
        i.down = true;
        let fail = |s: Slot| {
            let _ = s.send(Err(why.to_string()));
        };
        for q in i.queued.drain(..) {
            match q {
                Queued::Line(_, _, s) | Queued::Get(_, _, s) => fail(s),
            }
        }
        for w in i.waiting.drain(..) {
            match w {
                Waiting::One(_, s) => fail(s),
                Waiting::Merged(parts) => parts.into_iter().for_each(|(_, s)| fail(s)),
            }
        }
    }

    /// Encodes what is queued into `out`, its replies' places into the
    /// waiting line (in the same order).
    fn take_queued(&self, out: &mut BytesMut) {
        let mut i = self.inner();
        let Inner {
            queued, waiting, ..
        } = &mut *i;
        while let Some(q) = queued.pop_front() {
            match q {
                Queued::Line(b, shape, slot) => {
                    out.extend_from_slice(&b);
                    waiting.push_back(Waiting::One(shape, slot));
                }
                Queued::Get(keys, cas, slot) => {
                    let mut parts = vec![(keys, slot)];
                    let mut distinct: Vec<Bytes> = Vec::new();
                    let mut line_len = 0;
                    add_distinct(&mut distinct, &mut line_len, &parts[0].0);
                    while let Some(Queued::Get(next, c, _)) = queued.front() {
                        if *c != cas
                            || distinct.len() + next.len() > MAX_MERGED_KEYS
                            || line_len + next.iter().map(|k| k.len() + 1).sum::<usize>()
                                > MAX_MERGED_LINE
                        {
                            break;
                        }
                        let Some(Queued::Get(next, _, s)) = queued.pop_front() else {
                            break;
                        };
                        add_distinct(&mut distinct, &mut line_len, &next);
                        parts.push((next, s));
                    }
                    out.extend_from_slice(if cas { b"gets" } else { b"get" });
                    for k in &distinct {
                        out.extend_from_slice(b" ");
                        out.extend_from_slice(k);
                    }
                    out.extend_from_slice(b"\r\n");
                    self.stats.get_lines.fetch_add(1, Relaxed);
                    self.stats
                        .keys_sent
                        .fetch_add(distinct.len() as u64, Relaxed);
                    waiting.push_back(Waiting::Merged(parts));
                }
            }
        }
    }

    /// Runs the connection: writes what is queued, reads replies in order;
    /// re-connects (every 100 ms) when it breaks.
    pub(super) async fn run(self: Arc<Self>, mut stream: TcpStream) {
        loop {
            let why = self.serve(&mut stream).await;
            warn!(addr = %self.addr, why, "memcached connection lost; re-connecting");
            self.broke(why);
            stream = loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match TcpStream::connect(self.addr).await {
                    Ok(s) => break s,
                    Err(e) => debug!(addr = %self.addr, error = %e, "memcached still unreachable"),
                }
            };
            let _ = stream.set_nodelay(true);
            self.inner().down = false;
        }
    }

    async fn serve(&self, stream: &mut TcpStream) -> &'static str {
        let (mut r, mut w) = stream.split();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut out = BytesMut::new();
        loop {
            // Whatever is queued goes out first (a wake-up may have been
            // taken while reading).
            self.take_queued(&mut out);
            if !out.is_empty() && w.write_all(&out.split()).await.is_err() {
                return "write failed";
            }
            tokio::select! {
                () = self.wake.notified() => {}
                n = r.read_buf(&mut buf) => {
                    match n {
                        Ok(0) | Err(_) => return "closed by memcached",
                        Ok(_) => {}
                    }
                    loop {
                        let shape = match self.inner().waiting.front() {
                            Some(Waiting::One(s, _)) => *s,
                            Some(Waiting::Merged(_)) => Shape::Values,
                            None if buf.is_empty() => break,
                            None => return "a reply nobody asked for",
                        };
                        let Some(len) = reply_len(&buf, shape) else { break };
                        let reply = buf.split_to(len).freeze();
                        match self.inner().waiting.pop_front() {
                            Some(Waiting::One(_, slot)) => {
                                let _ = slot.send(Ok(reply));
                            }
                            Some(Waiting::Merged(parts)) => answer_merged(parts, &reply),
                            None => {}
                        }
                    }
                }
            }
        }
    }
}

/// Adds `keys` not yet in `distinct` (a line holds few keys: a scan is
/// cheaper than hashing).
fn add_distinct(distinct: &mut Vec<Bytes>, line_len: &mut usize, keys: &[Bytes]) {
    for k in keys {
        if !distinct.contains(k) {
            *line_len += k.len() + 1;
            distinct.push(k.clone());
        }
    }
}

/// Hands each asker of a merged `get` the answer to its own keys.
fn answer_merged(mut parts: Vec<(Vec<Bytes>, Slot)>, reply: &Bytes) {
    if parts.len() == 1 {
        if let Some((_, slot)) = parts.pop() {
            let _ = slot.send(Ok(reply.clone()));
        }
        return;
    }
    for (keys, slot) in parts {
        let _ = slot.send(Ok(split_merged(reply, &keys)));
    }
}

/// The part of a merged `get`'s reply that answers `keys`: their values
/// in the order asked (a key asked twice, twice), then `END`; an error
/// line in place of the values goes to every asker.
pub(super) fn split_merged(reply: &Bytes, keys: &[Bytes]) -> Bytes {
    let Some(blocks) = split_values(reply) else {
        return reply.clone();
    };
    let by_key: HashMap<&Bytes, &Bytes> = blocks.iter().map(|(k, b)| (k, b)).collect();
    let mut out = BytesMut::new();
    for k in keys {
        if let Some(b) = by_key.get(k) {
            out.extend_from_slice(b);
        }
    }
    out.extend_from_slice(b"END\r\n");
    out.freeze()
}

/// The length of the whole reply at the front of `buf`, if it is there.
pub(super) fn reply_len(buf: &[u8], shape: Shape) -> Option<usize> {
    let mut at = 0;
    loop {
        let eol = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let line = &buf[at..eol];
        if shape == Shape::Line {
            return Some(eol + 2);
        }
        if shape == Shape::Meta {
            if line == b"MN" {
                return Some(eol + 2);
            }
            at = eol + 2;
            if let Some(rest) = line.strip_prefix(b"VA ") {
                let len: usize = std::str::from_utf8(rest)
                    .ok()
                    .and_then(|r| r.split(' ').next())
                    .and_then(|n| n.parse().ok())?;
                at += len + 2;
                if buf.len() < at {
                    return None;
                }
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix(b"VALUE ") {
            let len: usize = std::str::from_utf8(rest)
                .ok()
                .and_then(|r| r.split(' ').nth(2))
                .and_then(|n| n.trim().parse().ok())?;
            at = eol + 2 + len + 2;
            if buf.len() < at {
                return None;
            }
            continue;
        }
        // END, or an error line in place of the values.
        return Some(eol + 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes what `reply_len` measured.
    fn take(buf: &mut BytesMut, shape: Shape) -> Option<Bytes> {
        let n = reply_len(buf, shape)?;
        Some(buf.split_to(n).freeze())
    }

    #[test]
    fn replies_are_cut_where_memcached_ends_them() {
        let mut b = BytesMut::from(
            &b"VALUE a 0 2\r\nhi\r\nVALUE b 1 0\r\n\r\nEND\r\nSTORED\r\nSERVER_ERROR out of memory\r\nVALUE c 0 5\r\nab"[..],
        );
        assert_eq!(
            take(&mut b, Shape::Values).unwrap(),
            &b"VALUE a 0 2\r\nhi\r\nVALUE b 1 0\r\n\r\nEND\r\n"[..]
        );
        assert_eq!(take(&mut b, Shape::Line).unwrap(), &b"STORED\r\n"[..]);
        assert_eq!(
            take(&mut b, Shape::Values).unwrap(),
            &b"SERVER_ERROR out of memory\r\n"[..]
        );
        assert_eq!(take(&mut b, Shape::Values), None);
        b.extend_from_slice(b"cde\r\nEND\r\n");
        assert_eq!(
            take(&mut b, Shape::Values).unwrap(),
            &b"VALUE c 0 5\r\nabcde\r\nEND\r\n"[..]
        );
    }

    #[test]
    fn a_merged_reply_is_split_back_per_asker() {
        let reply = Bytes::from_static(b"VALUE a 0 1\r\nx\r\nVALUE c 3 2\r\nyz\r\nEND\r\n");
        let k = |s: &'static str| Bytes::from_static(s.as_bytes());
        assert_eq!(
            split_merged(&reply, &[k("a")]),
            &b"VALUE a 0 1\r\nx\r\nEND\r\n"[..]
        );
        // A miss answers END alone; a key asked twice gets its value twice.
        assert_eq!(split_merged(&reply, &[k("b")]), &b"END\r\n"[..]);
        assert_eq!(
            split_merged(&reply, &[k("c"), k("b"), k("a"), k("c")]),
            &b"VALUE c 3 2\r\nyz\r\nVALUE a 0 1\r\nx\r\nVALUE c 3 2\r\nyz\r\nEND\r\n"[..]
        );
        let err = Bytes::from_static(b"SERVER_ERROR out of memory\r\n");
        assert_eq!(split_merged(&err, &[k("a")]), err);
    }
}
