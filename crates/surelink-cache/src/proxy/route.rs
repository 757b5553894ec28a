//! Routing a client's commands to nodes, and re-routing them when a node
//! leaves the ring.
//!
//! A command waiting on a node that the detector reports dead is not left
//! to time out: it is sent again to the key's new node (a node that
//! restarted gets it again too — its old incarnation, and what it held,
//! are gone). Re-sent commands keep the client's order: [`Order`] numbers
//! one client's commands, and after the ring changed a command is sent
//! only once every earlier one of that client has replied or been sent on
//! the new ring. So a pipelined `set k 1`, `set k 2` still leaves 2, even
//! when both were waiting on the node that died.
//!
//! A command is only re-sent when its node is out of the ring or
//! restarted, so it runs at most once on a node that stays in; a node
//! wrongly reported dead (the detector never does that while the node
//! keeps its heartbeat deadlines — SafeTimer) fences itself and drops its
//! items ([`crate::node::serve_store`]) before anything is re-sent.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use surelink::proto::rpc::CallOptions;
use surelink::proto::NodeId;
use surelink::CallError;
use tokio::sync::Notify;

use super::Shared;
use crate::node::CACHE_CHANNEL;
use crate::text::Command;

/// Times one command may be re-routed before the client gets an error (a
/// node restarting over and over).
const MAX_REROUTES: u32 = 8;

/// The order of one client's commands, for re-sending them in order.
#[derive(Debug, Default)]
pub(super) struct Order {
    state: Mutex<OrderState>,
    changed: Notify,
    /// Its reads in flight, in a replicated pool (`replica.rs`).
    pub(super) reads: super::replica::Reads,
}

#[derive(Debug, Default)]
struct OrderState {
    next: u64,
    /// Commands without a reply yet: the ring generation they were last
    /// sent on ([`UNSENT`]: not sent yet).
    open: BTreeMap<u64, u64>,
    /// How many open commands were sent on each generation (unsent ones
    /// not counted).
    per_gen: BTreeMap<u64, usize>,
    /// Open commands not sent yet.
    unsent: BTreeSet<u64>,
    /// Commands waiting for their turn (no wake-ups needed when 0).
    waiting: usize,
}

/// The generation of a command not sent yet. An earlier unsent command
/// holds a later one back: it may be waiting for its turn, and the two
/// could be woken in either order. (Commands are first polled in the order
/// made, so in the common case the earlier one has gone by then.)
const UNSENT: u64 = u64::MAX;

impl OrderState {
    fn set_gen(&mut self, ticket: u64, gen: u64) {
        if let Some(old) = self.open.insert(ticket, gen) {
            self.uncount(ticket, old);
        }
        if gen == UNSENT {
            self.unsent.insert(ticket);
        } else {
            *self.per_gen.entry(gen).or_default() += 1;
        }
    }

    fn remove(&mut self, ticket: u64) {
        if let Some(g) = self.open.remove(&ticket) {
            self.uncount(ticket, g);
        }
    }

    fn uncount(&mut self, ticket: u64, gen: u64) {
        if gen == UNSENT {
            self.unsent.remove(&ticket);
            return;
        }
        if let Some(c) = self.per_gen.get_mut(&gen) {
            *c -= 1;
            if *c == 0 {
                self.per_gen.remove(&gen);
            }
        }
    }

    /// Whether `ticket` may be sent on generation `gen`: every earlier
    /// open command was sent, on `gen`.
    fn may_send(&self, ticket: u64, gen: u64) -> bool {
        if self.unsent.range(..ticket).next().is_some() {
            return false;
        }
        // The common case: nothing open was sent on another ring.
        let only_this = match self.per_gen.len() {
            0 => true,
            1 => self.per_gen.contains_key(&gen),
            _ => false,
        };
        only_this || self.open.range(..ticket).all(|(_, &g)| g == gen)
    }
}

/// One command's place in its client's order; dropping it (the client
/// left) frees the place.
pub(super) struct Ticket {
    order: Arc<Order>,
    n: u64,
}

impl Ticket {
    /// This command's number in its client's order.
    pub(super) fn number(&self) -> u64 {
        self.n
    }

    /// Its client's order.
    pub(super) fn order(&self) -> &Arc<Order> {
        &self.order
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.order.state.lock();
        s.remove(self.n);
        let wake = s.waiting > 0;
        drop(s);
        if wake {
            self.order.changed.notify_waiters();
        }
    }
}

impl Order {
    /// The next command's place.
    pub(super) fn ticket(self: &Arc<Self>) -> Ticket {
        let mut s = self.state.lock();
        let n = s.next;
        s.next += 1;
        s.set_gen(n, UNSENT);
        Ticket {
            order: self.clone(),
            n,
        }
    }
}

impl Ticket {
    /// Waits until the command may be sent on the current ring, and
    /// returns that ring's generation.
    pub(super) async fn turn(&self, shared: &Shared) -> u64 {
        loop {
            let waiting = self.order.changed.notified();
            let mut waiting = pin!(waiting);
            // Registered before looking, so a change in between wakes us.
            waiting.as_mut().enable();
            // The generation is read from the receiver that then waits for
            // the next change: none can fall in between.
            let mut ring_changed = shared.gen.clone();
            let gen = *ring_changed.borrow_and_update();
            {
                let mut s = self.order.state.lock();
                if s.may_send(self.n, gen) {
                    return gen;
                }
                s.waiting += 1;
            }
            tokio::select! {
                () = waiting => {}
                _ = ring_changed.changed() => {}
            }
            self.order.state.lock().waiting -= 1;
        }
    }

    /// Records that the command went out on generation `gen`.
    pub(super) fn sent(&self, gen: u64) {
        let mut s = self.order.state.lock();
        s.set_gen(self.n, gen);
        let wake = s.waiting > 0;
        drop(s);
        if wake {
            self.order.changed.notify_waiters();
        }
    }
}

/// How one attempt at a node ended.
pub(super) enum Attempt {
    Reply(Bytes),
    /// The node left the ring (or restarted): send again.
    Reroute,
    Failed(CallError),
}

/// Resolves when `node` is out of the ring.
async fn ejected(shared: &Shared, node: NodeId) {
    let mut gen = shared.gen.clone();
    loop {
        gen.borrow_and_update();
        if shared.ring.read().is_ejected(node) {
            return;
        }
        if gen.changed().await.is_err() {
            // The proxy is gone: nothing will change any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Sends `body` to `node` and waits for the reply, or for the node to
/// leave the ring. `queued` runs once the request is in the session's
/// send queue (so later commands may follow it), or once the attempt
/// ended before it got there.
pub(super) async fn attempt(
    shared: &Shared,
    node: NodeId,
    body: Bytes,
    queued: impl FnOnce(),
) -> Attempt {
    let opts = CallOptions::new(shared.cfg.call_timeout);
    let call = shared
        .ep
        .call_then(node, CACHE_CHANNEL, body, &opts, queued);
    let r = tokio::select! {
        biased;
        r = call => r,
        () = ejected(shared, node) => return Attempt::Reroute,
    };
    match r {
        Ok(b) => Attempt::Reply(b),
        // The node's old incarnation is gone with what it held: the new
        // one takes the command as any other.
        Err(CallError::PeerRestarted { .. }) => Attempt::Reroute,
        Err(_) if shared.ring.read().is_ejected(node) => Attempt::Reroute,
        Err(e) => Attempt::Failed(e),
    }
}

/// Counts the parts of one command whose requests are not queued yet
/// (see [`join_queued`]).
#[derive(Default)]
pub(super) struct Latch(Arc<AtomicUsize>);

impl Latch {
    /// One more part: the returned closure is its `queued`.
    pub(super) fn part(&self) -> impl FnOnce() + Send + 'static {
        self.0.fetch_add(1, Relaxed);
        let left = self.0.clone();
        move || {
            left.fetch_sub(1, Relaxed);
        }
    }
}

/// Runs `parts` (each made with a `latch.part()`) together; `queued` runs
/// once every part's request is queued, then all are awaited.
pub(super) async fn join_queued<F: Future>(
    latch: &Latch,
    parts: impl IntoIterator<Item = F>,
    queued: impl FnOnce(),
) -> Vec<F::Output> {
    // Every part is made (and counted) here, before any is polled; they
    // queue inside this task's polls of `all`.
    let mut all = pin!(futures_util::future::join_all(parts));
    let mut queued = Some(queued);
    std::future::poll_fn(|cx| {
        let r = all.as_mut().poll(cx);
        if latch.0.load(Relaxed) == 0 || r.is_ready() {
            if let Some(q) = queued.take() {
                q();
            }
        }
        r
    })
    .await
}

/// One node's share of a multi-get (`gets`, `gat` as `cas`/`touch` say).
pub(super) fn get_body(keys: &[Bytes], cas: bool, touch: Option<i32>) -> Bytes {
    let mut body = BytesMut::new();
    let _ = Command::Get {
        keys: keys.to_vec(),
        cas,
        touch,
    }
    .encode(&mut body);
    body.freeze()
}

/// Why a routed command got no node's answer.
pub(super) enum RouteError {
    /// Every node is out of the ring.
    NoNode,
    /// The node did not answer.
    Call(CallError),
}

/// A command on one key (storage, delete, incr/decr, touch): to the key's
/// node, again to its next node if that one leaves the ring.
pub(super) async fn one_key(
    shared: &Shared,
    ticket: Ticket,
    key: &[u8],
    cmd: &Command,
) -> Result<Bytes, RouteError> {
    if shared.cfg.replicas > 1 {
        return super::replica::one_key(shared, ticket, key, cmd).await;
    }
    let mut body = BytesMut::new();
    let _ = cmd.encode(&mut body);
    let body = body.freeze();
    for _ in 0..=MAX_REROUTES {
        let gen = ticket.turn(shared).await;
        let (node, skipped) = {
            let ring = shared.ring.read();
            let Some(node) = ring.node_for(key) else {
                return Err(RouteError::NoNode);
            };
            (node, ring.skipped(key, node))
        };
        // A write on a node standing in for the key's own leaves a copy
        // there: remembered under every node it stood in for (each out of
        // the ring), to be deleted once any of them is back.
        if !skipped.is_empty() && super::strays::writes(cmd) {
            let mut strays = shared.strays.lock();
            for owner in skipped {
                strays.record(owner, node, &Bytes::copy_from_slice(key));
            }
        }
        match attempt(shared, node, body.clone(), || ticket.sent(gen)).await {
            Attempt::Reply(r) => return Ok(r),
            Attempt::Failed(e) => return Err(RouteError::Call(e)),
            Attempt::Reroute => shared.stats.rerouted.fetch_add(1, Relaxed),
        };
    }
    Err(RouteError::Call(CallError::Timeout))
}

/// A `get`/`gets`: the keys split per node (at most `GET_BATCH` per
/// request), the nodes' replies; keys whose node left the ring are split
/// again over the new ring. Returns every node reply's `VALUE` blocks.
pub(super) async fn get(
    shared: &Shared,
    ticket: Ticket,
    keys: &[Bytes],
    cas: bool,
    touch: Option<i32>,
) -> Result<Vec<Bytes>, RouteError> {
    if shared.cfg.replicas > 1 {
        return super::replica::get(shared, ticket, keys, cas, touch).await;
    }
    let mut replies = Vec::new();
    let mut todo: Vec<Bytes> = keys.to_vec();
    for _ in 0..=MAX_REROUTES {
        let gen = ticket.turn(shared).await;
        let mut per_node: Vec<(NodeId, Vec<Bytes>)> = Vec::new();
        {
            let ring = shared.ring.read();
            for k in todo.drain(..) {
                let Some(n) = ring.node_for(&k) else {
                    return Err(RouteError::NoNode);
                };
                match per_node
                    .iter_mut()
                    .find(|(m, ks)| *m == n && ks.len() < super::GET_BATCH)
                {
                    Some((_, ks)) => ks.push(k),
                    None => per_node.push((n, vec![k])),
                }
            }
        }
        let latch = Latch::default();
        let parts = per_node
            .iter()
            .map(|(n, ks)| attempt(shared, *n, get_body(ks, cas, touch), latch.part()));
        // All are queued before the command counts as sent.
        let done = join_queued(&latch, parts, || ticket.sent(gen)).await;
        for (a, (_, ks)) in done.into_iter().zip(per_node) {
            match a {
                Attempt::Reply(r) => replies.push(r),
                Attempt::Failed(e) => return Err(RouteError::Call(e)),
                Attempt::Reroute => {
                    shared.stats.rerouted.fetch_add(1, Relaxed);
                    todo.extend(ks);
                }
            }
        }
        if todo.is_empty() {
            return Ok(replies);
        }
    }
    Err(RouteError::Call(CallError::Timeout))
}

/// `flush_all`: to every node in the ring, in the client's order.
pub(super) async fn all_nodes(
    shared: &Shared,
    ticket: Ticket,
    cmd: &Command,
) -> Result<(), RouteError> {
    let gen = ticket.turn(shared).await;
    let nodes: Vec<NodeId> = {
        let ring = shared.ring.read();
        ring.nodes()
            .into_iter()
            .filter(|n| !ring.is_ejected(*n))
            .collect()
    };
    let mut body = BytesMut::new();
    let _ = cmd.encode(&mut body);
    let body = body.freeze();
    let latch = Latch::default();
    let calls = nodes
        .iter()
        .map(|&n| attempt(shared, n, body.clone(), latch.part()));
    let done = join_queued(&latch, calls, || ticket.sent(gen)).await;
    for a in done {
        // A node that left the ring meanwhile has nothing to flush (it
        // comes back empty).
        if let Attempt::Failed(e) = a {
            return Err(RouteError::Call(e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_commands_wait_only_for_earlier_ones_on_an_older_ring() {
        let order = Arc::new(Order::default());
        let a = order.ticket();
        let b = order.ticket();
        let c = order.ticket();
        {
            let s = order.state.lock();
            assert!(s.per_gen.is_empty());
            // Nothing sent yet: the first may go; a later one waits for it.
            assert!(s.may_send(a.n, 0) && !s.may_send(c.n, 0));
        }
        order.state.lock().set_gen(a.n, 0);
        order.state.lock().set_gen(b.n, 0);
        assert!(order.state.lock().may_send(c.n, 0));
        // The ring changed: c may not overtake a and b, sent on ring 0.
        assert!(!order.state.lock().may_send(c.n, 1));
        // a is re-sent on ring 1, b replies: c may go.
        order.state.lock().set_gen(a.n, 1);
        assert!(!order.state.lock().may_send(c.n, 1));
        drop(b);
        assert!(order.state.lock().may_send(c.n, 1));
        drop(a);
        let s = order.state.lock();
        assert_eq!(s.open.len(), 1);
        assert!(s.per_gen.is_empty(), "c was never sent");
    }

    /// One step of the model's schedule.
    #[derive(Clone, Debug)]
    enum Step {
        /// The client makes a command on key k.
        Make(u8),
        /// The i-th command waiting to be sent is polled.
        Poll(usize),
        /// The i-th command sent to a live node is answered.
        Reply(usize),
        /// Node n dies (its commands must be sent again) or comes back.
        Flip(u8),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0u8..4).prop_map(Step::Make),
            4 => (0usize..16).prop_map(Step::Poll),
            3 => (0usize..16).prop_map(Step::Reply),
            1 => (0u8..3).prop_map(Step::Flip),
        ]
    }

    proptest::proptest! {
        /// Commands polled in any order, answered in any order, nodes
        /// dying and returning (each a ring change): every command is sent
        /// in the end (no deadlock), and the sends that count — the last
        /// one of each command — reach the nodes in the order the client
        /// made the commands, per key.
        #[test]
        fn resends_keep_each_keys_order_and_all_get_out(
            steps in proptest::collection::vec(step(), 1..120),
            drain_order in proptest::collection::vec(0usize..16, 64),
        ) {
            let order = Arc::new(Order::default());
            let mut gen = 0u64;
            let mut alive = [true; 3];
            // (ticket, key); waiting to be sent / sent to node.
            let mut waiting: Vec<(Ticket, u8)> = Vec::new();
            let mut sent: Vec<(Ticket, u8, usize)> = Vec::new();
            // Last send of each command: (ticket, key), in send order.
            let mut log: Vec<(u64, u8)> = Vec::new();
            // A node runs one client's commands in the order they reached
            // it and answers in that order: the reply is its oldest one's.
            let reply = |i: usize, sent: &mut Vec<(Ticket, u8, usize)>| {
                if sent.is_empty() {
                    return;
                }
                let node = sent[i % sent.len()].2;
                if let Some(j) = sent.iter().position(|x| x.2 == node) {
                    drop(sent.remove(j));
                }
            };
            let node_of = |key: u8, alive: &[bool; 3]| {
                (0..3).map(|i| (usize::from(key) + i) % 3).find(|n| alive[*n])
            };
            let poll = |i: usize, waiting: &mut Vec<(Ticket, u8)>, sent: &mut Vec<(Ticket, u8, usize)>, log: &mut Vec<(u64, u8)>, gen: u64, alive: &[bool; 3]| {
                if waiting.is_empty() {
                    return;
                }
                let i = i % waiting.len();
                let ok = order.state.lock().may_send(waiting[i].0.n, gen);
                if let (true, Some(node)) = (ok, node_of(waiting[i].1, alive)) {
                    let (t, k) = waiting.remove(i);
                    t.sent(gen);
                    // An earlier send of the same command no longer counts.
                    log.retain(|(n, _)| *n != t.n);
                    log.push((t.n, k));
                    sent.push((t, k, node));
                }
            };
            for s in steps {
                match s {
                    Step::Make(k) => {
                        let t = order.ticket();
                        waiting.push((t, k));
                    }
                    Step::Poll(i) => poll(i, &mut waiting, &mut sent, &mut log, gen, &alive),
                    Step::Reply(i) => reply(i, &mut sent),
                    Step::Flip(n) => {
                        let n = usize::from(n);
                        alive[n] = !alive[n];
                        gen += 1;
                        if !alive[n] {
                            // Its commands are sent again (the node is gone).
                            let (gone, kept): (Vec<_>, Vec<_>) =
                                sent.drain(..).partition(|(_, _, m)| *m == n);
                            sent = kept;
                            waiting.extend(gone.into_iter().map(|(t, k, _)| (t, k)));
                        }
                    }
                }
            }
            // Drain: every node back, everything polled and answered.
            if alive.iter().any(|a| !*a) {
                alive = [true; 3];
                gen += 1;
            }
            let mut rounds = 0;
            while !waiting.is_empty() || !sent.is_empty() {
                rounds += 1;
                proptest::prop_assert!(rounds < 10_000, "stuck: {} waiting, {} sent", waiting.len(), sent.len());
                let pick = drain_order[rounds % drain_order.len()];
                // Every waiting command is polled (as every woken future
                // is), starting from a different one each round.
                for j in 0..waiting.len() {
                    poll(pick + j, &mut waiting, &mut sent, &mut log, gen, &alive);
                }
                if rounds % 3 == 0 {
                    reply(pick, &mut sent);
                }
            }
            for key in 0..4u8 {
                let seq: Vec<u64> = log.iter().filter(|(_, k)| *k == key).map(|(n, _)| *n).collect();
                proptest::prop_assert!(
                    seq.windows(2).all(|w| w[0] < w[1]),
                    "key {key}: last sends out of order: {seq:?}"
                );
            }
        }
    }
}
