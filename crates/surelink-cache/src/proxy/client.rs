//! One client connection: commands parsed as they arrive and sent at
//! once (pipelined), replies written back in request order, as the
//! nodes' own buffers.
//!
//! Outstanding reply bytes (replies queued and not yet written, plus what
//! commands in flight may still bring: a `get` key counts as the largest
//! item until its value arrives, a storage command as its value) are kept
//! under `max_reply_bytes`: no command is parsed while the next could pass
//! it, and a multi-get is fetched in chunks that fit, the next once the
//! client has drained enough. While a multi-get has keys left to fetch, no
//! later command is sent (a later `set` must not overtake it).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use super::outq::OutQueue;
use super::replica;
use super::route::{self, Order, RouteError};
use super::{stats, Shared, VERSION};
use crate::text::meta::MetaOp;
use crate::text::{split_values, Command, ParseError, Parser};

/// What an in-flight command gives the writer.
struct Done {
    /// Buffers to write, in order (none: nothing to answer).
    out: Vec<Bytes>,
    /// Bytes reserved for it while in flight, given back now.
    reserved: usize,
    /// A chunk of a multi-get that has keys left, and whether it failed
    /// (the rest is then dropped: its error is the answer's end).
    chunk: Option<bool>,
}

type ReplyFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Done> + Send>>;

/// Distinct keys one chunk of a multi-get fetches at most (however large
/// the budget), and keys with repeats it answers at most (a repeat is a
/// reference to the value fetched once, but still a queued buffer).
const CHUNK_DISTINCT: usize = 64;
const CHUNK_KEYS: usize = 256;

/// A multi-get's keys not fetched yet.
struct GetRest {
    keys: Vec<Bytes>,
    at: usize,
    cas: bool,
    touch: Option<i32>,
    /// One chunk at a time: the next is planned from what is left then.
    fetching: bool,
}

/// One client connection's state.
struct Conn {
    shared: Arc<Shared>,
    order: Arc<Order>,
    inflight: FuturesOrdered<ReplyFuture>,
    out: OutQueue,
    /// Bytes reserved by commands in flight.
    reserved: usize,
    rest: Option<GetRest>,
    /// A command for every node (`flush_all`, `cache_memlimit`) waiting
    /// for the commands before it to finish: on a node, commands in
    /// different shards may run in either order, and a `set` before a
    /// `flush_all` must not outlive it (nor one after it be flushed).
    held: Option<Command>,
    /// That command is in flight: nothing after it is sent until it is
    /// answered.
    fence: bool,
    quit: bool,
    /// Whether parsing is paused at `max_reply_bytes` (counted once per
    /// pause).
    paused: bool,
    /// What this connection adds to `ProxyStats::reply_bytes` now.
    reported: u64,
}

impl Conn {
    fn outstanding(&self) -> usize {
        self.out.len() + self.reserved
    }

    /// Whether one more command (a `get` key at the largest item's size)
    /// fits under `max_reply_bytes`; always when nothing is outstanding.
    fn room(&self) -> bool {
        let o = self.outstanding();
        o == 0 || o + self.shared.cfg.limits.max_item <= self.shared.cfg.max_reply_bytes
    }

    /// Whether there is room (see [`Conn::room`]); counts a pause when
    /// there stops being.
    fn pause_unless_room(&mut self) -> bool {
        let room = self.room();
        if !room && !self.paused {
            self.shared.stats.reply_pauses.fetch_add(1, Relaxed);
        }
        self.paused = !room;
        room
    }

    /// Sends what may be sent: the next chunk of a multi-get, or parsed
    /// commands, up to the pipeline and reply bounds.
    fn pump(&mut self, parser: &mut Parser, buf: &mut BytesMut) {
        loop {
            if self.fence {
                if !self.inflight.is_empty() {
                    return;
                }
                self.fence = false;
            }
            if let Some(cmd) = self.held.take() {
                if !self.inflight.is_empty() {
                    self.held = Some(cmd);
                    return;
                }
                self.send(cmd);
                self.fence = true;
                continue;
            }
            if let Some(rest) = &self.rest {
                if !rest.fetching && self.pause_unless_room() {
                    self.next_chunk();
                }
                return;
            }
            if self.quit || self.inflight.len() >= self.shared.cfg.max_pipeline {
                return;
            }
            if !self.pause_unless_room() {
                return;
            }
            match parser.next(buf) {
                Ok(Some(Command::Quit)) => self.quit = true,
                Ok(Some(Command::Get { keys, cas, touch })) => {
                    self.shared
                        .stats
                        .cmd_get
                        .fetch_add(keys.len() as u64, Relaxed);
                    if touch.is_some() {
                        self.shared
                            .stats
                            .cmd_touch
                            .fetch_add(keys.len() as u64, Relaxed);
                    }
                    self.rest = Some(GetRest {
                        keys,
                        at: 0,
                        cas,
                        touch,
                        fetching: false,
                    });
                    self.next_chunk();
                }
                Ok(Some(cmd @ (Command::FlushAll { .. } | Command::MemLimit { .. }))) => {
                    self.held = Some(cmd);
                }
                Ok(Some(cmd)) => self.send(cmd),
                Ok(None) => return,
                // An HTTP request: what came before it is answered, then
                // the connection closes without a word (memcached).
                Err(ParseError::Http) => {
                    self.quit = true;
                    return;
                }
                Err(ParseError::LineTooLong) => {
                    // Closed without a word, as memcached does.
                    self.quit = true;
                    self.inflight.clear();
                    self.rest = None;
                    self.reserved = 0;
                    self.out = OutQueue::default();
                    return;
                }
            }
        }
    }

    /// Sends one command on its way.
    fn send(&mut self, cmd: Command) {
        let reserved = match &cmd {
            Command::Store { data, .. } => data.len(),
            Command::Meta(m) => m.data.len(),
            _ => 0,
        };
        self.reserved += reserved;
        let f = dispatch(&self.shared, &self.order, cmd);
        self.inflight.push_back(Box::pin(async move {
            Done {
                out: f.await.into_iter().collect(),
                reserved,
                chunk: None,
            }
        }));
    }

    /// Sends the next chunk of the multi-get in `rest`: as many distinct
    /// keys as the budget holds at the largest item's size (at least one),
    /// each fetched once however often it is named.
    fn next_chunk(&mut self) {
        let Some(rest) = &mut self.rest else {
            return;
        };
        let max_item = self.shared.cfg.limits.max_item.max(1);
        let budget = self
            .shared
            .cfg
            .max_reply_bytes
            .saturating_sub(self.out.len() + self.reserved);
        let allowed = (budget / max_item).clamp(1, CHUNK_DISTINCT);
        let mut distinct: Vec<Bytes> = Vec::new();
        let mut end = rest.at;
        while end < rest.keys.len() && end - rest.at < CHUNK_KEYS {
            let k = &rest.keys[end];
            if !distinct.contains(k) {
                if distinct.len() == allowed {
                    break;
                }
                distinct.push(k.clone());
            }
            end += 1;
        }
        let named = rest.keys[rest.at..end].to_vec();
        rest.at = end;
        let last = end == rest.keys.len();
        let (cas, touch) = (rest.cas, rest.touch);
        if last {
            self.rest = None;
        } else {
            rest.fetching = true;
        }
        let reserved = distinct.len() * max_item;
        self.reserved += reserved;
        let (s, ticket) = (self.shared.clone(), self.order.ticket());
        let reading = replica::reading(&s, &ticket, distinct.iter().map(|k| &k[..]));
        self.inflight.push_back(Box::pin(async move {
            let (out, ok) = fetch(&s, ticket, distinct, &named, (cas, touch), last).await;
            drop(reading);
            Done {
                out,
                reserved,
                chunk: (!last).then_some(!ok),
            }
        }));
    }

    /// A command's answer is ready: queue it.
    fn done(&mut self, d: Done) {
        self.reserved -= d.reserved.min(self.reserved);
        for b in d.out {
            self.out.push(b);
        }
        if let Some(failed) = d.chunk {
            if failed {
                self.rest = None;
            } else if let Some(r) = &mut self.rest {
                r.fetching = false;
            }
        }
    }

    /// Brings `ProxyStats::reply_bytes` up to date.
    fn report(&mut self) {
        let now = self.outstanding() as u64;
        let g = &self.shared.stats.reply_bytes;
        if now > self.reported {
            g.fetch_add(now - self.reported, Relaxed);
        } else {
            g.fetch_sub(self.reported - now, Relaxed);
        }
        self.reported = now;
    }

    /// Nothing in flight and nothing left to fetch.
    fn settled(&self) -> bool {
        self.inflight.is_empty() && self.rest.is_none() && self.held.is_none()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared
            .stats
            .reply_bytes
            .fetch_sub(self.reported, Relaxed);
    }
}

/// Serves one client until it leaves, sends `quit`, breaks the protocol,
/// or stays idle for `idle_timeout`.
pub(super) async fn client(shared: &Arc<Shared>, mut stream: TcpStream) -> std::io::Result<()> {
    let limits = shared.cfg.limits;
    let idle = shared.cfg.idle_timeout;
    let mut parser = Parser::new(limits);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut c = Conn {
        shared: shared.clone(),
        order: Arc::new(Order::default()),
        inflight: FuturesOrdered::new(),
        out: OutQueue::default(),
        reserved: 0,
        rest: None,
        held: None,
        fence: false,
        quit: false,
        paused: false,
        reported: 0,
    };
    let mut reading = true;
    let mut last_activity = Instant::now();
    loop {
        c.pump(&mut parser, &mut buf);
        c.report();
        if c.settled() && c.out.is_empty() && (c.quit || !reading) {
            return Ok(());
        }
        let can_read = reading
            && !c.quit
            && c.rest.is_none()
            && c.held.is_none()
            && !c.fence
            && c.inflight.len() < shared.cfg.max_pipeline
            && c.room();
        // Idle: no byte moved either way, and nothing in flight (a command
        // waiting on a node ends by its own deadline).
        let idle_at = last_activity + idle;
        let watch_idle = !idle.is_zero() && c.inflight.is_empty();
        if can_read && buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        // Read through `AsyncRead`: a short read clears the socket's
        // readiness, so a drained socket costs no second `recv` that would
        // only say "would block" (one per request at low load).
        let (mut rd, wr) = stream.split();
        tokio::select! {
            // Replies first: they free pipeline slots and memory.
            biased;
            Some(d) = c.inflight.next(), if !c.inflight.is_empty() => {
                c.done(d);
                // Gather the replies already done before writing.
                while let Some(Some(d)) = futures_util::FutureExt::now_or_never(c.inflight.next()) {
                    c.done(d);
                }
                last_activity = Instant::now();
            }
            r = wr.as_ref().writable(), if !c.out.is_empty() => {
                r?;
                match wr.as_ref().try_write_vectored(&c.out.slices()) {
                    Ok(n) => {
                        c.out.advance(n);
                        last_activity = Instant::now();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            r = rd.read_buf(&mut buf), if can_read => {
                match r {
                    Ok(0) => reading = false,
                    // The binary protocol (first byte 0x80) is not spoken:
                    // its bytes are read as text, as by a memcached run
                    // with `-B ascii` (a request without a newline waits;
                    // one with a newline gets `ERROR`).
                    Ok(_) => last_activity = Instant::now(),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // A client that sends more than one item and a line ahead
                // of its commands being parsed is cut off.
                if buf.len() > limits.max_item + limits.max_get_line + 4096 {
                    return Ok(());
                }
            }
            () = tokio::time::sleep_until(idle_at), if watch_idle => {
                if Instant::now() >= last_activity + idle {
                    shared.stats.idle_kicks.fetch_add(1, Relaxed);
                    debug!("idle client closed");
                    return Ok(());
                }
            }
            else => {
                // Nothing can move: the client stopped sending, everything
                // is answered and written (handled above), or it neither
                // reads nor sends and idle_timeout is off.
                if c.settled() && c.out.is_empty() {
                    return Ok(());
                }
                // Only reachable with idle_timeout off and a client that
                // reads nothing: wait for it to go (a write would fail).
                tokio::time::sleep(Duration::from_secs(1)).await;
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

type CmdFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Bytes>> + Send>>;

fn ready(r: Option<Bytes>) -> CmdFuture {
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
fn dispatch(shared: &Arc<Shared>, order: &Arc<Order>, cmd: Command) -> CmdFuture {
    let noreply = cmd.noreply();
    let answer = move |b: Bytes| (!noreply).then_some(b);
    match &cmd {
        Command::Reply { text, .. } => ready(answer(line(text))),
        Command::Version => ready(Some(line(&format!("VERSION {VERSION}")))),
        Command::Stats { args } => ready(Some(stats::answer(shared, args))),
        Command::Noop => ready(Some(Bytes::from_static(b"MN\r\n"))),
        Command::Quit => ready(None),
        // Parsed and sent by the connection itself (in chunks).
        Command::Get { .. } => ready(None),
        Command::FlushAll { .. } | Command::MemLimit { .. } => {
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
        Command::Meta(m) => {
            match m.op {
                MetaOp::Set => shared.stats.cmd_set.fetch_add(1, Relaxed),
                MetaOp::Get => shared.stats.cmd_get.fetch_add(1, Relaxed),
                _ => 0,
            };
            let (s, ticket) = (shared.clone(), order.ticket());
            let reading = (replica::class(&cmd) == replica::Class::Read)
                .then(|| replica::reading(shared, &ticket, [&m.key[..]]))
                .flatten();
            Box::pin(async move {
                let _reading = reading;
                let Command::Meta(m) = &cmd else {
                    return None;
                };
                match route::one_key(&s, ticket, &m.key, &cmd).await {
                    // The node applied quiet mode: nothing is nothing.
                    Ok(r) => (!r.is_empty()).then_some(r),
                    Err(e) => Some(route_error(&s, &e)),
                }
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

/// One chunk of a `get`/`gets`: `distinct` keys fetched (split per
/// node), then each of `named` (the client's keys, repeats included)
/// answered with a reference to its value block, `END` after the last
/// chunk. `false` with an error line as the answer when a node did not
/// answer.
async fn fetch(
    s: &Shared,
    ticket: route::Ticket,
    distinct: Vec<Bytes>,
    named: &[Bytes],
    (cas, touch): (bool, Option<i32>),
    last: bool,
) -> (Vec<Bytes>, bool) {
    let replies = match route::get(s, ticket, &distinct, cas, touch).await {
        Ok(r) => r,
        Err(e) => return (vec![route_error(s, &e)], false),
    };
    let mut values: HashMap<Bytes, Bytes> = HashMap::with_capacity(distinct.len());
    for reply in replies {
        match split_values(&reply) {
            Some(v) => values.extend(v),
            // The node answered with an error line: pass it on.
            None => return (vec![reply], false),
        }
    }
    let mut out = Vec::with_capacity(named.len() + 1);
    let mut hits = 0u64;
    for k in named {
        if let Some(block) = values.get(k) {
            out.push(block.clone());
            hits += 1;
        }
    }
    s.stats.get_hits.fetch_add(hits, Relaxed);
    s.stats
        .get_misses
        .fetch_add(named.len() as u64 - hits, Relaxed);
    if last {
        out.push(Bytes::from_static(b"END\r\n"));
    }
    (out, true)
}
