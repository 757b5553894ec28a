//! A cache node fronting an unmodified memcached (`backend =
//! "memcached://host:port"`): each command the proxy sends is forwarded,
//! pipelined, on one of a few TCP connections to memcached, and its reply
//! handed back.
//!
//! Order: a key always uses the same connection, and a command is queued
//! on it when the server starts the request (one proxy's requests start in
//! the order it sent them), so commands on one key reach memcached in the
//! proxy's order — the same promise memcached makes per connection.
//! `flush_all` goes down every connection.
//!
//! What it does not do: retry a command whose connection broke (the
//! proxy's client gets `SERVER_ERROR`; the connection is re-opened for
//! the next commands), or hide memcached's own limits (item size, memory).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink::{Handler, HandlerError, HandlerFuture, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tracing::{debug, warn};

use crate::node::decode;
use crate::store::key_hash;
use crate::text::{split_values, Command, Limits};

/// Why a memcached backend could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend URL is not `memcached://host:port`.
    #[error("backend {0:?} is not memcached://host:port")]
    Url(String),
    /// memcached did not accept a connection.
    #[error("cannot connect to memcached at {addr}: {source}")]
    Connect {
        /// Its address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Parses `memcached://host:port` (a host name is resolved now).
pub fn parse_url(url: &str) -> Result<SocketAddr, BackendError> {
    let rest = url
        .strip_prefix("memcached://")
        .ok_or_else(|| BackendError::Url(url.into()))?;
    std::net::ToSocketAddrs::to_socket_addrs(rest.trim_end_matches('/'))
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| BackendError::Url(url.into()))
}

/// How a reply ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `VALUE` blocks then `END` (or one error line).
    Values,
    /// One line.
    Line,
}

type Slot = oneshot::Sender<Result<Bytes, String>>;

#[derive(Default)]
struct Inner {
    /// Commands not written yet.
    out: BytesMut,
    /// Sent (or queued) commands waiting for their reply, in order.
    waiting: VecDeque<(Shape, Slot)>,
    /// The connection is down: commands fail at once until it is back.
    down: bool,
}

/// One pipelined connection to memcached, re-opened when it breaks.
struct Conn {
    addr: SocketAddr,
    inner: Mutex<Inner>,
    wake: Notify,
}

impl Conn {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Queues `cmd` (already encoded); the reply arrives on the receiver.
    fn send(&self, cmd: &[u8], shape: Shape) -> oneshot::Receiver<Result<Bytes, String>> {
        let (tx, rx) = oneshot::channel();
        let mut i = self.inner();
        if i.down {
            let _ = tx.send(Err("memcached connection down".into()));
            return rx;
        }
        i.out.extend_from_slice(cmd);
        i.waiting.push_back((shape, tx));
        drop(i);
        self.wake.notify_one();
        rx
    }

    /// Fails every waiting command and marks the connection down.
    fn broke(&self, why: &str) {
        let mut i = self.inner();
        i.down = true;
        i.out.clear();
        for (_, slot) in i.waiting.drain(..) {
            let _ = slot.send(Err(why.to_string()));
        }
    }

    /// Runs the connection: writes what is queued, reads replies in order;
    /// re-connects (every 100 ms) when it breaks.
    async fn run(self: Arc<Self>, mut stream: TcpStream) {
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
        loop {
            // Whatever is queued goes out first (a wake-up may have been
            // taken while reading).
            let out = self.inner().out.split();
            if !out.is_empty() && w.write_all(&out).await.is_err() {
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
                            Some((s, _)) => *s,
                            None if buf.is_empty() => break,
                            None => return "a reply nobody asked for",
                        };
                        let Some(len) = reply_len(&buf, shape) else { break };
                        let reply = buf.split_to(len).freeze();
                        if let Some((_, slot)) = self.inner().waiting.pop_front() {
                            let _ = slot.send(Ok(reply));
                        }
                    }
                }
            }
        }
    }
}

/// The length of the whole reply at the front of `buf`, if it is there.
fn reply_len(buf: &[u8], shape: Shape) -> Option<usize> {
    let mut at = 0;
    loop {
        let eol = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let line = &buf[at..eol];
        if shape == Shape::Line {
            return Some(eol + 2);
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

/// The handler of a node fronting memcached.
#[derive(Clone)]
pub struct MemcachedHandler {
    conns: Arc<Vec<Arc<Conn>>>,
    limits: Limits,
}

impl std::fmt::Debug for MemcachedHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcachedHandler")
            .field("connections", &self.conns.len())
            .finish()
    }
}

impl MemcachedHandler {
    /// Opens `connections` connections to memcached at `addr`.
    pub async fn connect(
        addr: SocketAddr,
        connections: usize,
        limits: Limits,
    ) -> Result<MemcachedHandler, BackendError> {
        let mut conns = Vec::new();
        for _ in 0..connections.max(1) {
            let s = TcpStream::connect(addr)
                .await
                .map_err(|source| BackendError::Connect { addr, source })?;
            let _ = s.set_nodelay(true);
            let c = Arc::new(Conn {
                addr,
                inner: Mutex::new(Inner::default()),
                wake: Notify::new(),
            });
            tokio::spawn(c.clone().run(s));
            conns.push(c);
        }
        Ok(MemcachedHandler {
            conns: Arc::new(conns),
            limits,
        })
    }

    fn conn_index(&self, key: &[u8]) -> usize {
        usize::try_from(key_hash(key) % self.conns.len() as u64).unwrap_or(0)
    }

    fn conn_for(&self, key: &[u8]) -> &Arc<Conn> {
        &self.conns[self.conn_index(key)]
    }
}

/// Serves `handler` on `ep`; when `ep` fences itself, empties the
/// memcached behind it (peers may have moved its keys meanwhile: see
/// [`crate::node`]).
pub fn serve_backend(ep: &surelink::Endpoint, handler: MemcachedHandler) {
    let mut events = ep.events();
    let conns = handler.conns.clone();
    ep.serve(handler);
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(surelink::NetEvent::Fenced { .. }) | Err(surelink::RecvError::Lagged(_)) => {
                    warn!("this node fenced itself (or missed events): emptying its memcached");
                    let replies: Vec<_> = conns
                        .iter()
                        .map(|c| c.send(b"flush_all\r\n", Shape::Line))
                        .collect();
                    for r in replies {
                        if !matches!(r.await, Ok(Ok(_))) {
                            warn!("flush_all to memcached failed after a fence");
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
}

fn fail(e: String) -> HandlerError {
    HandlerError::new(502, format!("memcached backend: {e}"))
}

impl Handler for MemcachedHandler {
    fn handle(&self, request: Request) -> HandlerFuture {
        let cmd = match decode(&request.body, self.limits) {
            Ok(c) => c,
            Err(e) => return Box::pin(std::future::ready(Err(HandlerError::from(e)))),
        };
        // The proxy wants every answer (it drops those its client asked
        // not to get): forward without `noreply`, or memcached says nothing.
        let mut cmd = cmd;
        cmd.clear_noreply();
        let mut line = BytesMut::new();
        match &cmd {
            Command::Get { keys, cas } => {
                // Each key on its own connection (so it follows the writes
                // to it), the values joined back in the order asked.
                let mut groups: Vec<(usize, Vec<Bytes>)> = Vec::new();
                for k in keys {
                    let i = self.conn_index(k);
                    match groups.iter_mut().find(|(j, _)| *j == i) {
                        Some((_, ks)) => ks.push(k.clone()),
                        None => groups.push((i, vec![k.clone()])),
                    }
                }
                let mut rxs: Vec<_> = groups
                    .into_iter()
                    .map(|(i, ks)| {
                        let mut line = BytesMut::new();
                        let _ = Command::Get {
                            keys: ks,
                            cas: *cas,
                        }
                        .encode(&mut line);
                        self.conns[i].send(&line, Shape::Values)
                    })
                    .collect();
                let keys = keys.clone();
                Box::pin(async move {
                    if let [_] = rxs[..] {
                        if let Some(rx) = rxs.pop() {
                            return rx.await.map_err(|_| fail("gone".into()))?.map_err(fail);
                        }
                    }
                    let mut values: std::collections::HashMap<Bytes, VecDeque<Bytes>> =
                        std::collections::HashMap::new();
                    for rx in rxs {
                        let reply = rx.await.map_err(|_| fail("gone".into()))?.map_err(fail)?;
                        match split_values(&reply) {
                            Some(v) => {
                                for (k, block) in v {
                                    values.entry(k).or_default().push_back(block);
                                }
                            }
                            // An error line instead of values: pass it on.
                            None => return Ok(reply),
                        }
                    }
                    let mut out = BytesMut::new();
                    for k in &keys {
                        if let Some(block) = values.get_mut(k).and_then(VecDeque::pop_front) {
                            out.extend_from_slice(&block);
                        }
                    }
                    out.extend_from_slice(b"END\r\n");
                    Ok(out.freeze())
                })
            }
            Command::FlushAll { .. } => {
                let _ = cmd.encode(&mut line);
                let rxs: Vec<_> = self
                    .conns
                    .iter()
                    .map(|c| c.send(&line, Shape::Line))
                    .collect();
                Box::pin(async move {
                    let mut last = Bytes::from_static(b"OK\r\n");
                    for rx in rxs {
                        last = rx.await.map_err(|_| fail("gone".into()))?.map_err(fail)?;
                    }
                    Ok(last)
                })
            }
            // memcached was never sent the value: remove the old one as it
            // would, and answer as it does.
            Command::TooLarge { key, .. } => {
                line.extend_from_slice(b"delete ");
                line.extend_from_slice(key);
                line.extend_from_slice(b"\r\n");
                let rx = self.conn_for(key).send(&line, Shape::Line);
                Box::pin(async move {
                    rx.await.map_err(|_| fail("gone".into()))?.map_err(fail)?;
                    Ok(Bytes::from_static(
                        b"SERVER_ERROR object too large for cache\r\n",
                    ))
                })
            }
            _ => {
                let Some(key) = cmd.key().cloned() else {
                    // version, stats, replies: the proxy answers those.
                    return Box::pin(std::future::ready(Ok(Bytes::from_static(b"ERROR\r\n"))));
                };
                let _ = cmd.encode(&mut line);
                let rx = self.conn_for(&key).send(&line, Shape::Line);
                Box::pin(async move { rx.await.map_err(|_| fail("gone".into()))?.map_err(fail) })
            }
        }
    }
}

/// Takes what `reply_len` measured (used by tests).
#[cfg(test)]
fn take(buf: &mut BytesMut, shape: Shape) -> Option<Bytes> {
    let n = reply_len(buf, shape)?;
    Some(buf.split_to(n).freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(parse_url("memcached://127.0.0.1:11211").is_ok());
        assert!(matches!(
            parse_url("redis://x:1"),
            Err(BackendError::Url(_))
        ));
    }
}
