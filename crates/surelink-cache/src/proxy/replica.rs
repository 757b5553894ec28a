//! Replicated pools (`replicas` ≥ 2): each key lives on the first
//! `replicas` nodes of the ring from its point ([`Ring::replicas`]) —
//! the same nodes whatever their state, so a node that is not one of a
//! key's replicas never holds a copy of it, old or new.
//!
//! - **Reads** (`get`, `gets`, `mg` without `N`/`R`, `me`) go to the live
//!   replica with the fewest reads in flight from this proxy, and on to
//!   the next on a miss or a failure: a replica that came back empty, or
//!   died in between, costs one more request, not a miss.
//! - **Writes that do not depend on the item** (`set`, `delete`, `touch`,
//!   `gat`, `ms` in set mode without a CAS, `md` without a CAS) go to every
//!   live replica at once; the client gets the first replica's answer. A
//!   replica still in the ring that did not answer such a write may hold
//!   the old value (a call past its deadline is dropped unrun): the key is
//!   deleted there before the client is answered (`mend`).
//! - **Writes that do** (`add`, `replace`, `append`, `prepend`, `cas`,
//!   `incr`, `decr`, `ma`, `ms` in another mode or with a CAS, `md` with a
//!   CAS, `mg` with `N` or `R`) run on the first live replica alone: the
//!   replicas could answer differently (one came back empty), and one
//!   answer must decide. When it changed the item, the key is then deleted
//!   from the other live replicas before the client is answered: a read
//!   there misses and goes on to the first, so no replica ever serves a
//!   value the first no longer holds.
//!
//! Per client, commands keep their order: a read that goes on to the next
//! replica does so after later commands of its client may have gone out,
//! so a later write of the same key waits until that read ended ([`Reads`]);
//! otherwise the read could find that later write.
//!
//! No stale read: a replica out of the ring gets no write and no read; it
//! comes back only after the watcher emptied it (`flush_all`, sent after
//! every command it had been sent — `proxy/mod.rs`), and a node that
//! fenced itself emptied itself. So a replica holds, for each key, either
//! the last write or nothing.
//!
//! What it does not do: order two proxies' concurrent writes to one key
//! the same way on every replica (each proxy's own writes are: its
//! sessions to the nodes are ordered, and a write goes to every replica
//! before a later one); refill a replica that came back (it fills as keys
//! are written again); serve a key whose replicas are all out of the ring
//! (`SERVER_ERROR no cache node available`).

use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use bytes::{Bytes, BytesMut};
use surelink::proto::NodeId;
use surelink::CallError;

use super::route::{attempt, get_body, join_queued, Attempt, Latch, Order, RouteError, Ticket};
use super::Shared;
use crate::text::meta::{MetaOp, SetMode};
use crate::text::{split_values, Command, StoreOp};

/// One client's reads in flight (ticket, key hash): a read that misses
/// goes on to the next replica after later commands of its client may
/// have gone out, so a later write of the same key waits for it to end —
/// else the read could find that write there, out of the client's order.
#[derive(Debug, Default)]
pub(super) struct Reads {
    inflight: Mutex<Vec<(u64, u64)>>,
    done: Notify,
}

/// Holds a read's keys in [`Reads`] until dropped.
pub(super) struct Reading {
    order: Arc<Order>,
    n: u64,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let r = &self.order.reads;
        r.inflight.lock().retain(|(n, _)| *n != self.n);
        r.done.notify_waiters();
    }
}

/// Registers `ticket`'s read of `keys` (call when the command is made, in
/// the client's order); `None` unless the pool is replicated.
pub(super) fn reading<'a>(
    shared: &Shared,
    ticket: &Ticket,
    keys: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Reading> {
    if shared.cfg.replicas < 2 {
        return None;
    }
    let order = ticket.order().clone();
    let n = ticket.number();
    order
        .reads
        .inflight
        .lock()
        .extend(keys.into_iter().map(|k| (n, crate::store::key_hash(k))));
    Some(Reading { order, n })
}

/// Waits until no read of `key` made before `ticket` is in flight.
async fn after_reads(ticket: &Ticket, key: &[u8]) {
    let (reads, n, h) = (
        &ticket.order().reads,
        ticket.number(),
        crate::store::key_hash(key),
    );
    loop {
        let done = reads.done.notified();
        let mut done = pin!(done);
        done.as_mut().enable();
        if !reads
            .inflight
            .lock()
            .iter()
            .any(|&(m, kh)| m < n && kh == h)
        {
            return;
        }
        done.await;
    }
}

/// How a replicated pool runs a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// One replica answers; a miss goes on to the next.
    Read,
    /// Every live replica, at once.
    All,
    /// The first live replica; the others lose the key if it changed.
    First,
}

/// The class of a command on one key.
pub(super) fn class(cmd: &Command) -> Class {
    match cmd {
        Command::Store {
            op: StoreOp::Set, ..
        }
        | Command::Delete { .. }
        | Command::Touch { .. }
        | Command::TooLarge { .. } => Class::All,
        Command::Store { .. } | Command::Arith { .. } => Class::First,
        Command::Meta(m) => {
            let o = &m.opts;
            match m.op {
                MetaOp::Get if o.vivify.is_some() || o.recache.is_some() => Class::First,
                MetaOp::Get if o.ttl.is_some() => Class::All,
                MetaOp::Get | MetaOp::Debug => Class::Read,
                MetaOp::Set
                    if o.mode == SetMode::Set && o.compare_cas.is_none() && !o.invalidate =>
                {
                    Class::All
                }
                MetaOp::Delete if o.compare_cas.is_none() => Class::All,
                _ => Class::First,
            }
        }
        _ => Class::All,
    }
}

/// The key's replicas in the ring now, in ring order.
fn live(shared: &Shared, key: &[u8]) -> Vec<NodeId> {
    let ring = shared.ring.read();
    ring.replicas(key, shared.cfg.replicas)
        .into_iter()
        .filter(|n| !ring.is_ejected(*n))
        .collect()
}

/// `nodes` with the least loaded first (ring order among equals).
fn by_load(shared: &Shared, mut nodes: Vec<NodeId>) -> Vec<NodeId> {
    let load = |n: &NodeId| shared.load.get(n).map_or(0, |l| l.load(Relaxed));
    nodes.sort_by_key(load);
    nodes
}

/// A read attempt, counted in the node's load while it runs.
async fn read(shared: &Shared, node: NodeId, body: Bytes, queued: impl FnOnce()) -> Attempt {
    let l = shared.load.get(&node);
    if let Some(l) = l {
        l.fetch_add(1, Relaxed);
    }
    let a = attempt(shared, node, body, queued).await;
    if let Some(l) = l {
        l.fetch_sub(1, Relaxed);
    }
    a
}

/// Whether a read's answer is a miss (the next replica may hold it).
fn missed(cmd: &Command, reply: &[u8]) -> bool {
    match cmd {
        // A quiet `mg` says nothing on a miss.
        Command::Meta(m) => reply.starts_with(b"EN") || (m.opts.quiet && reply.is_empty()),
        _ => reply == b"END\r\n",
    }
}

/// Whether a `First` command's answer says it changed the item.
fn changed(reply: &[u8]) -> bool {
    [
        &b"STORED"[..],
        b"DELETED",
        b"TOUCHED",
        b"HD",
        b"VA ",
        b"OK",
    ]
    .iter()
    .any(|p| reply.starts_with(p))
        || reply.first().is_some_and(u8::is_ascii_digit)
        // A quiet meta command that went well says nothing.
        || reply.is_empty()
}

/// Runs `cmd` on `key`'s replicas (see the module docs).
pub(super) async fn one_key(
    shared: &Shared,
    ticket: Ticket,
    key: &[u8],
    cmd: &Command,
) -> Result<Bytes, RouteError> {
    let mut body = BytesMut::new();
    let _ = cmd.encode(&mut body);
    let body = body.freeze();
    let class = class(cmd);
    if class != Class::Read {
        after_reads(&ticket, key).await;
    }
    let gen = ticket.turn(shared).await;
    let nodes = live(shared, key);
    if nodes.is_empty() {
        return Err(RouteError::NoNode);
    }
    match class {
        Class::Read => {
            let mut last = Err(RouteError::NoNode);
            let mut sent = Some(|| ticket.sent(gen));
            for n in by_load(shared, nodes) {
                let queued = || {
                    if let Some(s) = sent.take() {
                        s();
                    }
                };
                match read(shared, n, body.clone(), queued).await {
                    Attempt::Reply(r) if missed(cmd, &r) => last = Ok(r),
                    Attempt::Reply(r) => return Ok(r),
                    Attempt::Reroute => {
                        shared.stats.rerouted.fetch_add(1, Relaxed);
                    }
                    Attempt::Failed(e) => {
                        if last.is_err() {
                            last = Err(RouteError::Call(e));
                        }
                    }
                }
            }
            last
        }
        Class::All => {
            let answers = all(shared, &nodes, &body, || ticket.sent(gen)).await;
            let base64 = matches!(cmd, Command::Meta(m) if m.opts.base64);
            mend(shared, key, base64, &nodes, &answers).await;
            first_answer(answers)
        }
        Class::First => {
            // Later commands of the client wait until the other replicas'
            // deletes are queued: one sent before could read the old value
            // there.
            let first = nodes[0];
            let r = match attempt(shared, first, body, || {}).await {
                Attempt::Reply(r) => r,
                Attempt::Reroute => return Err(RouteError::Call(CallError::Timeout)),
                Attempt::Failed(e) => return Err(RouteError::Call(e)),
            };
            if changed(&r) && nodes.len() > 1 {
                let base64 = matches!(cmd, Command::Meta(m) if m.opts.base64);
                let del = delete_body(key, base64);
                let answers = all(shared, &nodes[1..], &del, || ticket.sent(gen)).await;
                mend(shared, key, base64, &nodes[1..], &answers).await;
            } else {
                ticket.sent(gen);
            }
            Ok(r)
        }
    }
}

/// The request deleting `key` on a node.
fn delete_body(key: &[u8], base64: bool) -> Bytes {
    let mut del = BytesMut::new();
    let _ = Command::TooLarge {
        key: Bytes::copy_from_slice(key),
        unlink: true,
        noreply: false,
        base64,
    }
    .encode(&mut del);
    del.freeze()
}

/// Tries this many times to delete a key from a replica that did not
/// answer a write to it.
const MEND_TRIES: usize = 3;

/// A write (or a delete) that failed on a replica still in the ring may
/// have left the old value there (a call past its deadline is dropped
/// unrun): the key is deleted there, a few times if need be, so a read
/// misses and goes on instead of finding it. A replica that left the ring
/// comes back empty anyway.
async fn mend(shared: &Shared, key: &[u8], base64: bool, nodes: &[NodeId], answers: &[Attempt]) {
    for (n, a) in nodes.iter().zip(answers) {
        if !matches!(a, Attempt::Failed(_)) {
            continue;
        }
        shared.stats.mended.fetch_add(1, Relaxed);
        let del = delete_body(key, base64);
        for _ in 0..MEND_TRIES {
            match attempt(shared, *n, del.clone(), || {}).await {
                Attempt::Reply(_) | Attempt::Reroute => break,
                Attempt::Failed(_) => {}
            }
        }
    }
}

/// Sends `body` to every one of `nodes` (all queued before `queued`
/// runs) and waits for every answer.
async fn all(
    shared: &Shared,
    nodes: &[NodeId],
    body: &Bytes,
    queued: impl FnOnce(),
) -> Vec<Attempt> {
    let latch = Latch::default();
    let calls = nodes
        .iter()
        .map(|&n| attempt(shared, n, body.clone(), latch.part()));
    join_queued(&latch, calls, queued).await
}

/// The first replica's answer, or the next one's if it had none.
fn first_answer(answers: Vec<Attempt>) -> Result<Bytes, RouteError> {
    let mut err = RouteError::NoNode;
    for a in answers {
        match a {
            Attempt::Reply(r) => return Ok(r),
            Attempt::Failed(e) => {
                if matches!(err, RouteError::NoNode) {
                    err = RouteError::Call(e);
                }
            }
            Attempt::Reroute => {}
        }
    }
    Err(err)
}

/// A multi-get in a replicated pool: each key from its least loaded live
/// replica, the keys it missed (or whose replica failed) from the next,
/// until found or out of replicas. The replies' `VALUE` blocks.
pub(super) async fn get(
    shared: &Shared,
    ticket: Ticket,
    keys: &[Bytes],
    cas: bool,
    touch: Option<i32>,
) -> Result<Vec<Bytes>, RouteError> {
    if let Some(t) = touch {
        return get_touch(shared, ticket, keys, cas, t).await;
    }
    let gen = ticket.turn(shared).await;
    // Each key's replicas still to ask, least loaded first, and whether
    // one answered it (a miss there).
    let mut todo: Vec<(Bytes, Vec<NodeId>, bool)> = Vec::with_capacity(keys.len());
    for k in keys {
        let mut nodes = by_load(shared, live(shared, k));
        if nodes.is_empty() {
            return Err(RouteError::NoNode);
        }
        nodes.reverse();
        todo.push((k.clone(), nodes, false));
    }
    let mut replies = Vec::new();
    let mut sent = Some(|| ticket.sent(gen));
    let mut failure = None;
    while !todo.is_empty() {
        let mut per_node: Vec<(NodeId, Vec<Bytes>)> = Vec::new();
        let mut next = Vec::new();
        for (k, mut nodes, answered) in todo.drain(..) {
            let Some(n) = nodes.pop() else { continue };
            next.push((k.clone(), nodes, n, answered));
            match per_node
                .iter_mut()
                .find(|(m, ks)| *m == n && ks.len() < super::GET_BATCH)
            {
                Some((_, ks)) => ks.push(k.clone()),
                None => per_node.push((n, vec![k])),
            }
        }
        let latch = Latch::default();
        let parts = per_node
            .iter()
            .map(|(n, ks)| read(shared, *n, get_body(ks, cas, touch), latch.part()));
        let done = join_queued(&latch, parts, || {
            if let Some(s) = sent.take() {
                s();
            }
        })
        .await;
        let mut found: Vec<Bytes> = Vec::new();
        let mut failed: Vec<NodeId> = Vec::new();
        for (a, (n, _)) in done.into_iter().zip(&per_node) {
            match a {
                Attempt::Reply(r) => match split_values(&r) {
                    Some(v) => {
                        found.extend(v.into_iter().map(|(k, _)| k));
                        replies.push(r);
                    }
                    // An error line instead of values: that part failed.
                    None => {
                        failed.push(*n);
                        failure = Some(RouteError::Call(CallError::Timeout));
                    }
                },
                Attempt::Reroute => {
                    shared.stats.rerouted.fetch_add(1, Relaxed);
                    failed.push(*n);
                }
                Attempt::Failed(e) => {
                    failed.push(*n);
                    failure = Some(RouteError::Call(e));
                }
            }
        }
        // Keys found are done; the others go to their next replica. A key
        // whose last replica failed has no answer: the client gets the
        // error, not a miss.
        for (k, nodes, n, answered) in next {
            if found.contains(&k) {
                continue;
            }
            let answered = answered || !failed.contains(&n);
            if nodes.is_empty() {
                // A miss if a replica said so; an error if none answered.
                if !answered {
                    return Err(failure.unwrap_or(RouteError::Call(CallError::Timeout)));
                }
                continue;
            }
            todo.push((k, nodes, answered));
        }
    }
    Ok(replies)
}

/// `gat`/`gats` in a replicated pool: a write too (the new exptime), so
/// every live replica of every key gets it; each key's value is the first
/// replica's (ring order) that has it.
async fn get_touch(
    shared: &Shared,
    ticket: Ticket,
    keys: &[Bytes],
    cas: bool,
    touch: i32,
) -> Result<Vec<Bytes>, RouteError> {
    let gen = ticket.turn(shared).await;
    let mut per_key: Vec<(Bytes, Vec<NodeId>)> = Vec::with_capacity(keys.len());
    let mut per_node: Vec<(NodeId, Vec<Bytes>)> = Vec::new();
    for k in keys {
        let nodes = live(shared, k);
        if nodes.is_empty() {
            return Err(RouteError::NoNode);
        }
        for &n in &nodes {
            match per_node
                .iter_mut()
                .find(|(m, ks)| *m == n && ks.len() < super::GET_BATCH)
            {
                Some((_, ks)) => ks.push(k.clone()),
                None => per_node.push((n, vec![k.clone()])),
            }
        }
        per_key.push((k.clone(), nodes));
    }
    let latch = Latch::default();
    let parts = per_node
        .iter()
        .map(|(n, ks)| attempt(shared, *n, get_body(ks, cas, Some(touch)), latch.part()));
    let done = join_queued(&latch, parts, || ticket.sent(gen)).await;
    let mut blocks: std::collections::HashMap<(NodeId, Bytes), Bytes> =
        std::collections::HashMap::new();
    let mut failure = None;
    let mut answered = false;
    for (a, (n, _)) in done.into_iter().zip(&per_node) {
        match a {
            Attempt::Reply(r) => match split_values(&r) {
                Some(v) => {
                    answered = true;
                    for (k, b) in v {
                        blocks.insert((*n, k), b);
                    }
                }
                None => failure = Some(RouteError::Call(CallError::Timeout)),
            },
            Attempt::Reroute => {}
            Attempt::Failed(e) => failure = Some(RouteError::Call(e)),
        }
    }
    if !answered {
        return Err(failure.unwrap_or(RouteError::NoNode));
    }
    let mut out = BytesMut::new();
    for (k, nodes) in &per_key {
        if let Some(b) = nodes.iter().find_map(|n| blocks.get(&(*n, k.clone()))) {
            out.extend_from_slice(b);
        }
    }
    out.extend_from_slice(b"END\r\n");
    Ok(vec![out.freeze()])
}
