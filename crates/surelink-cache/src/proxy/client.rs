//! One client connection: commands parsed as they arrive and sent at
//! once (pipelined), replies written back in request order.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

use super::route::{self, Order, RouteError};
use super::{stats, Shared, VERSION};
use crate::text::{split_values, Command, ParseError, Parser};

type ReplyFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Bytes>> + Send>>;

/// Serves one client until it leaves, sends `quit`, or breaks the protocol.
pub(super) async fn client(shared: &Arc<Shared>, mut stream: TcpStream) -> std::io::Result<()> {
    let limits = shared.cfg.limits;
    let mut parser = Parser::new(limits);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut inflight: FuturesOrdered<ReplyFuture> = FuturesOrdered::new();
    let mut out = BytesMut::new();
    let mut reading = true;
    let mut quit = false;
    let order = Arc::new(Order::default());
    loop {
        // Parse and send what has arrived, up to the pipeline bound.
        while !quit && inflight.len() < shared.cfg.max_pipeline {
            match parser.next(&mut buf) {
                Ok(Some(Command::Quit)) => quit = true,
                Ok(Some(cmd)) => inflight.push_back(dispatch(shared, &order, cmd)),
                Ok(None) => break,
                Err(ParseError::LineTooLong) => {
                    quit = true;
                    inflight.clear();
                }
            }
        }
        if quit && inflight.is_empty() {
            stream.write_all(&out).await?;
            return Ok(());
        }
        let can_read = reading && !quit && inflight.len() < shared.cfg.max_pipeline;
        tokio::select! {
            // Replies first: they free pipeline slots and memory.
            biased;
            Some(r) = inflight.next(), if !inflight.is_empty() => {
                if let Some(r) = r {
                    out.extend_from_slice(&r);
                }
                // Gather the replies already done, then write once.
                while let Some(Some(r)) = futures_util::FutureExt::now_or_never(inflight.next()) {
                    if let Some(r) = r {
                        out.extend_from_slice(&r);
                    }
                }
                if !out.is_empty() {
                    stream.write_all(&out).await?;
                    out.clear();
                }
            }
            n = stream.read_buf(&mut buf), if can_read => {
                if n? == 0 {
                    reading = false;
                    if inflight.is_empty() {
                        return Ok(());
                    }
                }
                // A client that sends more than one item and a line ahead
                // of its commands being parsed is cut off.
                if buf.len() > limits.max_item + limits.max_get_line + 4096 {
                    return Ok(());
                }
            }
            else => {
                if !reading && inflight.is_empty() {
                    return Ok(());
                }
            }
        }
    }
}

fn line(text: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(text.len() + 2);
    b.extend_from_slice(text.as_bytes());
    b.extend_from_slice(b"\r\n");
    b.freeze()
}

fn ready(r: Option<Bytes>) -> ReplyFuture {
    Box::pin(std::future::ready(r))
}

fn route_error(shared: &Shared, e: &RouteError) -> Bytes {
    match e {
        RouteError::NoNode => line("SERVER_ERROR no cache node available"),
        RouteError::Call(e) => {
            shared.stats.node_errors.fetch_add(1, Relaxed);
            debug!(error = %e, "a node did not answer a command");
            line(&format!("SERVER_ERROR surelink: {e}"))
        }
    }
}

/// Sends `cmd` on its way; the future gives the client's answer (`None`:
/// nothing to write).
fn dispatch(shared: &Arc<Shared>, order: &Arc<Order>, cmd: Command) -> ReplyFuture {
    let noreply = cmd.noreply();
    let answer = move |b: Bytes| (!noreply).then_some(b);
    match &cmd {
        Command::Reply { text, .. } => ready(answer(line(text))),
        Command::Version => ready(Some(line(&format!("VERSION {VERSION}")))),
        Command::Stats => ready(Some(stats(shared))),
        Command::Quit => ready(None),
        Command::Get { keys, .. } => {
            shared.stats.cmd_get.fetch_add(keys.len() as u64, Relaxed);
            get(shared, order, cmd)
        }
        Command::FlushAll { .. } => {
            let (s, ticket) = (shared.clone(), order.ticket());
            Box::pin(async move {
                match route::all_nodes(&s, ticket, &cmd).await {
                    Ok(()) => answer(line("OK")),
                    Err(e) => answer(route_error(&s, &e)),
                }
            })
        }
        Command::TooLarge { unlink, key, .. } => {
            let refused = line("SERVER_ERROR object too large for cache");
            if !*unlink {
                return ready(answer(refused));
            }
            // A refused `set` removes the old value, as in memcached
            // (before later commands run: it is in the pipeline).
            let (s, ticket, key) = (shared.clone(), order.ticket(), key.clone());
            Box::pin(async move {
                let _ = route::one_key(&s, ticket, &key, &cmd).await;
                answer(refused)
            })
        }
        Command::Store { key, .. }
        | Command::Delete { key, .. }
        | Command::Arith { key, .. }
        | Command::Touch { key, .. } => {
            if matches!(cmd, Command::Store { .. }) {
                shared.stats.cmd_set.fetch_add(1, Relaxed);
            }
            let (s, ticket, key) = (shared.clone(), order.ticket(), key.clone());
            Box::pin(async move {
                match route::one_key(&s, ticket, &key, &cmd).await {
                    Ok(r) => answer(r),
                    Err(e) => answer(route_error(&s, &e)),
                }
            })
        }
    }
}

/// A `get`/`gets`: keys split per node, the values joined in the order
/// the client asked (repeats answered each time).
fn get(shared: &Arc<Shared>, order: &Arc<Order>, cmd: Command) -> ReplyFuture {
    let Command::Get { keys, cas } = cmd else {
        return ready(None);
    };
    let (s, ticket) = (shared.clone(), order.ticket());
    Box::pin(async move {
        let replies = match route::get(&s, ticket, &keys, cas).await {
            Ok(r) => r,
            Err(e) => return Some(route_error(&s, &e)),
        };
        // Per key, its VALUE blocks in the order the node sent them.
        let mut values: std::collections::HashMap<Bytes, std::collections::VecDeque<Bytes>> =
            std::collections::HashMap::new();
        for reply in replies {
            match split_values(&reply) {
                Some(v) => {
                    for (k, block) in v {
                        values.entry(k).or_default().push_back(block);
                    }
                }
                // The node answered with an error line: pass it on.
                None => return Some(reply),
            }
        }
        let mut out = BytesMut::new();
        let mut hits = 0u64;
        for k in &keys {
            // The node answered repeats in order: take the first unused.
            if let Some(block) = values.get_mut(k).and_then(|q| q.pop_front()) {
                out.extend_from_slice(&block);
                hits += 1;
            }
        }
        s.stats.get_hits.fetch_add(hits, Relaxed);
        s.stats
            .get_misses
            .fetch_add(keys.len() as u64 - hits, Relaxed);
        out.extend_from_slice(b"END\r\n");
        Some(out.freeze())
    })
}
