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
//! Reads queued on a connection while its writer is busy go out as one
//! multi-get, each distinct key once (`conn`): a PostMan helper's batch
//! of many clients' `get`s — or a hot key read by all of them — costs
//! memcached one command.
//!
//! What it does not do: retry a command whose connection broke (the
//! proxy's client gets `SERVER_ERROR`; the connection is re-opened for
//! the next commands), or hide memcached's own limits (item size, memory).

mod conn;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use surelink::{Handler, HandlerError, HandlerFuture, Request};
use tokio::net::TcpStream;
use tracing::warn;

pub use conn::MergeStats;
use conn::{Conn, Shape};

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

/// The handler of a node fronting memcached.
#[derive(Clone)]
pub struct MemcachedHandler {
    conns: Arc<Vec<Arc<Conn>>>,
    limits: Limits,
    merge: Arc<MergeStats>,
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
        let merge = Arc::new(MergeStats::default());
        for _ in 0..connections.max(1) {
            let s = TcpStream::connect(addr)
                .await
                .map_err(|source| BackendError::Connect { addr, source })?;
            let _ = s.set_nodelay(true);
            let c = Arc::new(Conn::new(addr, merge.clone()));
            tokio::spawn(c.clone().run(s));
            conns.push(c);
        }
        Ok(MemcachedHandler {
            conns: Arc::new(conns),
            limits,
            merge,
        })
    }

    /// How many reads went to memcached in how many `get` lines (see
    /// the merging in the module docs).
    pub fn merge_stats(&self) -> &MergeStats {
        &self.merge
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
        self.execute(&request.body)
    }
}

impl MemcachedHandler {
    /// Queues one command (a request body: one memcached text command)
    /// now; the future yields memcached's answer. Commands queued
    /// together keep their order per key, and adjacent reads merge.
    pub fn execute(&self, body: &Bytes) -> HandlerFuture {
        let cmd = match decode(body, self.limits) {
            Ok(c) => c,
            Err(e) => return Box::pin(std::future::ready(Err(HandlerError::from(e)))),
        };
        // The proxy wants every answer (it drops those its client asked
        // not to get): forward without `noreply`, or memcached says nothing.
        let mut cmd = cmd;
        cmd.clear_noreply();
        let mut line = BytesMut::new();
        match &cmd {
            Command::Get { keys, cas, touch } => {
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
                    .map(|(i, ks)| match touch {
                        // Reads merge; a `gat` (a write too) goes as it is.
                        None => self.conns[i].get(ks, *cas),
                        Some(t) => {
                            let mut line = BytesMut::new();
                            let _ = Command::Get {
                                keys: ks,
                                cas: *cas,
                                touch: Some(*t),
                            }
                            .encode(&mut line);
                            self.conns[i].send(&line, Shape::Values)
                        }
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
            // Sent with an `mn` after it: a quiet command that went well
            // gets no answer from memcached, and `MN` ends every one.
            Command::Meta(m) => {
                m.encode(&mut line);
                line.extend_from_slice(b"mn\r\n");
                let rx = self.conn_for(&m.key).send(&line, Shape::Meta);
                Box::pin(async move {
                    let r = rx.await.map_err(|_| fail("gone".into()))?.map_err(fail)?;
                    Ok(r.slice(..r.len().saturating_sub(b"MN\r\n".len())))
                })
            }
            Command::MemLimit { .. } => {
                let _ = cmd.encode(&mut line);
                let rx = self.conns[0].send(&line, Shape::Line);
                Box::pin(async move { rx.await.map_err(|_| fail("gone".into()))?.map_err(fail) })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_urls_are_checked() {
        assert!(parse_url("memcached://127.0.0.1:11211").is_ok());
        assert!(matches!(
            parse_url("redis://x:1"),
            Err(BackendError::Url(_))
        ));
    }
}
