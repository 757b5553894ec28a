//! One client connection of the load generator: a writer task that sends
//! what the schedule queued, a reader task that matches each reply to the
//! oldest request waiting (memcached answers in order) and checks it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, BytesMut};
use surelink_lab::lock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Outcome, Sample};

/// A request sent, waiting for its reply.
#[derive(Clone, Copy, Debug)]
pub(super) struct Waiting {
    pub(super) key: u32,
    /// When the schedule wanted it sent (ns since the start).
    pub(super) sched_ns: u64,
    pub(super) kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A `get`; the version the key's last `set` sent before it carried
    /// (0: never set).
    Get { expect: u64 },
    /// A `set` of this version.
    Set { version: u64 },
}

/// What the schedule and the two tasks share.
#[derive(Debug, Default)]
pub(super) struct Conn {
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Encoded requests not written yet.
    out: BytesMut,
    /// Requests written (or about to be), oldest first.
    waiting: VecDeque<Waiting>,
    /// The connection failed: requests for it count as errors.
    broken: bool,
    /// The schedule is over: the reader ends when nothing waits.
    finished: bool,
}

impl Conn {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Queues one request (`false`: the connection is broken).
    pub(super) fn push(&self, w: Waiting, encode: impl FnOnce(&mut BytesMut)) -> bool {
        let mut s = self.state();
        if s.broken {
            return false;
        }
        encode(&mut s.out);
        s.waiting.push_back(w);
        true
    }

    /// Wakes the writer (after a batch of `push`es).
    pub(super) fn flush(&self) {
        self.wake.notify_one();
    }

    pub(super) fn finish(&self) {
        self.state().finished = true;
        self.wake.notify_one();
    }
}

/// Sends what is queued until the schedule is over.
pub(super) async fn writer(conn: Arc<Conn>, mut w: OwnedWriteHalf) {
    loop {
        conn.wake.notified().await;
        let (buf, finished) = {
            let mut s = conn.state();
            (s.out.split(), s.finished)
        };
        if !buf.is_empty() && w.write_all(&buf).await.is_err() {
            conn.state().broken = true;
            return;
        }
        if finished && conn.state().out.is_empty() {
            return;
        }
    }
}

/// Counters the progress display reads.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Requests queued by the schedule.
    pub(crate) sent: AtomicU64,
    /// Replies received.
    pub(crate) answered: AtomicU64,
    /// Replies that were errors (or connections lost).
    pub(crate) errors: AtomicU64,
    /// The first error reply's text.
    pub(crate) first_error: Mutex<Option<String>>,
}

impl Progress {
    /// The first error reply's text, if any.
    pub(crate) fn first_error(&self) -> Option<String> {
        lock(&self.first_error).clone()
    }
}

/// One parsed reply.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Stored,
    /// `VALUE` … `END`: the item's data.
    Value(Vec<u8>),
    Miss,
    /// Any other line (`SERVER_ERROR …`, `ERROR`, …).
    Error(String),
}

/// Takes one whole reply off the front of `buf`, if there is one.
fn parse(buf: &mut BytesMut) -> Option<Reply> {
    let eol = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = &buf[..eol];
    if let Some(rest) = line.strip_prefix(b"VALUE ") {
        let len: usize = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split(' ').nth(2))
            .and_then(|n| n.parse().ok())?;
        // data, CRLF, "END\r\n"
        let total = eol + 2 + len + 2 + 5;
        if buf.len() < total {
            return None;
        }
        let data = buf[eol + 2..eol + 2 + len].to_vec();
        let ok = &buf[eol + 2 + len..total] == b"\r\nEND\r\n";
        buf.advance(total);
        return Some(if ok {
            Reply::Value(data)
        } else {
            Reply::Error("malformed VALUE reply".into())
        });
    }
    let r = match line {
        b"STORED" => Reply::Stored,
        b"END" => Reply::Miss,
        other => Reply::Error(String::from_utf8_lossy(other).into_owned()),
    };
    buf.advance(eol + 2);
    Some(r)
}

/// The value a `set` of `version` writes for `key`: both, then padding.
pub(super) fn value(key: u32, version: u64, size: usize) -> Vec<u8> {
    let mut v = format!("{key}:{version}:").into_bytes();
    v.resize(size.max(v.len()), b'x');
    v
}

/// What a `get` answered for `w`.
fn judge(w: &Waiting, r: &Reply) -> Outcome {
    match (w.kind, r) {
        (Kind::Set { .. }, Reply::Stored) => Outcome::Stored,
        (Kind::Get { expect }, Reply::Miss) => Outcome::Miss { known: expect > 0 },
        (Kind::Get { expect }, Reply::Value(data)) => {
            let mut parts = data.split(|&b| b == b':');
            let key: Option<u32> = parts
                .next()
                .and_then(|k| std::str::from_utf8(k).ok()?.parse().ok());
            let ver: Option<u64> = parts
                .next()
                .and_then(|k| std::str::from_utf8(k).ok()?.parse().ok());
            match (key, ver) {
                (Some(k), Some(v)) if k == w.key && v == expect => Outcome::Hit,
                (Some(k), Some(_)) if k == w.key => Outcome::Stale,
                // Another key's data, or bytes we never wrote.
                _ => Outcome::Wrong,
            }
        }
        _ => Outcome::Error,
    }
}

/// Reads replies until the schedule is over and nothing waits, or until
/// `deadline`; every request gets a sample (unanswered ones at the end).
pub(super) async fn reader(
    conn: Arc<Conn>,
    mut r: OwnedReadHalf,
    start: Instant,
    deadline: Instant,
    progress: Arc<Progress>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        {
            let s = conn.state();
            if s.finished && s.waiting.is_empty() {
                break;
            }
        }
        let read = tokio::select! {
            n = r.read_buf(&mut buf) => n,
            () = tokio::time::sleep_until(deadline) => break,
            // Look at `finished` again now and then.
            () = tokio::time::sleep(std::time::Duration::from_millis(50)) => continue,
        };
        match read {
            Ok(0) | Err(_) => {
                conn.state().broken = true;
                break;
            }
            Ok(_) => {}
        }
        let now_ns = ns_since(start);
        while let Some(reply) = parse(&mut buf) {
            let Some(w) = conn.state().waiting.pop_front() else {
                // A reply nobody asked for.
                progress.errors.fetch_add(1, Ordering::Relaxed);
                break;
            };
            let outcome = judge(&w, &reply);
            if let (Outcome::Error, Reply::Error(e)) = (&outcome, &reply) {
                lock(&progress.first_error).get_or_insert_with(|| e.clone());
            }
            if outcome.is_error() {
                progress.errors.fetch_add(1, Ordering::Relaxed);
            }
            progress.answered.fetch_add(1, Ordering::Relaxed);
            samples.push(Sample {
                key: w.key,
                sched_ns: w.sched_ns,
                done_ns: now_ns,
                outcome,
            });
        }
    }
    // Whatever still waits was never answered.
    let mut s = conn.state();
    s.broken = true;
    for w in s.waiting.drain(..) {
        progress.errors.fetch_add(1, Ordering::Relaxed);
        samples.push(Sample {
            key: w.key,
            sched_ns: w.sched_ns,
            done_ns: u64::MAX,
            outcome: Outcome::Unanswered,
        });
    }
    samples
}

pub(super) fn ns_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_parsed_whole_or_not_at_all() {
        let mut b = BytesMut::from(&b"STORED\r\nVALUE k 0 3\r\nabc\r\nEN"[..]);
        assert_eq!(parse(&mut b), Some(Reply::Stored));
        assert_eq!(parse(&mut b), None);
        b.extend_from_slice(b"D\r\nEND\r\nSERVER_ERROR x\r\n");
        assert_eq!(parse(&mut b), Some(Reply::Value(b"abc".to_vec())));
        assert_eq!(parse(&mut b), Some(Reply::Miss));
        assert_eq!(parse(&mut b), Some(Reply::Error("SERVER_ERROR x".into())));
        assert!(b.is_empty());
    }

    #[test]
    fn a_get_is_judged_against_the_last_set_sent_before_it() {
        let w = |expect| Waiting {
            key: 7,
            sched_ns: 0,
            kind: Kind::Get { expect },
        };
        let v = |k, ver| Reply::Value(value(k, ver, 64));
        assert_eq!(judge(&w(3), &v(7, 3)), Outcome::Hit);
        assert_eq!(judge(&w(3), &v(7, 2)), Outcome::Stale);
        assert_eq!(judge(&w(3), &v(8, 3)), Outcome::Wrong);
        assert_eq!(judge(&w(3), &Reply::Miss), Outcome::Miss { known: true });
        assert_eq!(judge(&w(0), &Reply::Miss), Outcome::Miss { known: false });
        assert_eq!(
            judge(&w(3), &Reply::Error("SERVER_ERROR".into())),
            Outcome::Error
        );
    }
}
