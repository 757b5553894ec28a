//! A toxiproxy-like relay for TCP and UDP: the way tests, the demo and
//! experiments inject network faults from outside surelink's own socket
//! path, so the product needs no test hooks. It is a harness tool, never
//! part of what ships.
//!
//! A [`Relay`] runs *links*. A link listens on one `ip:port` — a TCP
//! listener and a UDP socket on the same port, as a surelink endpoint's
//! listener and heartbeat socket are — and forwards to one upstream
//! `ip:port`, with its upstream sockets bound to a chosen source IP (so
//! traffic for a node's network-1 address leaves from a network-1
//! address). Endpoints dial the link's address instead of the peer's.
//! Links carry a group number, the *network*, so a fault can hit "network
//! 0" at once.
//!
//! ```no_run
//! # async fn f() -> Result<(), surelink_relay::RelayError> {
//! use surelink_relay::{Direction, LinkSpec, Relay};
//! let relay = Relay::new();
//! let link = relay
//!     .add_link(LinkSpec::new(0, "127.0.1.100:0".parse().unwrap(), "127.0.1.1:7000".parse().unwrap())
//!         .from_ip("127.0.1.100".parse().unwrap()))
//!     .await?;
//! // ... clients use link.listen ...
//! relay.network(0).kill(); // every TCP connection reset, both sides
//! relay.network(0).blackhole(Direction::Up); // client → upstream carries nothing
//! relay.network(0).heal(); // held bytes flow again
//! println!("{}", relay.status()[0]);
//! relay.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Faults ([`Links`]): [`kill`](Links::kill) resets every open TCP
//! connection on both sides (RST, `SO_LINGER` 0); new ones pass at once.
//! [`blackhole`](Links::blackhole) stops one direction: TCP bytes are not
//! read (they queue in the kernel, at most one `tcp_chunk` per connection
//! and direction waits inside the relay), datagrams are dropped; new
//! connections are accepted and carry nothing that way.
//! [`refuse`](Links::refuse) closes the listener; [`drop_udp`](Links::drop_udp)
//! drops datagrams at random. [`heal`](Links::heal) undoes them all.
//!
//! What it does not do:
//! - Shape traffic: no latency, bandwidth or reordering.
//! - Imitate TCP behind a dead route exactly. The relay's kernel ends each
//!   TCP connection: during a blackhole it still acknowledges what the
//!   sender sent until its receive buffer is full, then advertises a zero
//!   window, so the sender's TCP sees a slow reader, not lost segments
//!   (its retransmission and `TCP_USER_TIMEOUT` clocks behave
//!   accordingly). Connects still complete. Detection must come from the
//!   application — for surelink, heartbeats and message acknowledgements.
//! - Pass ICMP on: a client whose datagrams the upstream refuses learns
//!   nothing; a UDP client's upstream socket (and so its source port, as
//!   the upstream sees it) changes after `udp_idle` of silence.
//! - Read or change the bytes; it has no idea of surelink's protocol.
//!
//! Every task a link starts is aborted when the relay is dropped or shut
//! down; no I/O error ends more than the connection or datagram it hit.
//! Memory per link is bounded by [`Limits`].

mod error;
mod fault;
mod link;
mod stats;
mod tcp;
mod udp;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use error::RelayError;
pub use fault::{Direction, Faults};
pub use link::{Limits, LinkId, LinkInfo, LinkSpec};
pub use stats::{LinkCounters, LinkStatus};

use link::Link;

/// A set of links and their tasks (see the crate docs). Dropping it
/// aborts every task and closes every socket; [`Relay::shutdown`] also
/// waits until they are closed.
pub struct Relay {
    links: Mutex<Vec<Arc<Link>>>,
    next: AtomicUsize,
    limits: Limits,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("links", &self.infos())
            .finish_non_exhaustive()
    }
}

impl Default for Relay {
    fn default() -> Self {
        Relay::new()
    }
}

impl Relay {
    /// A relay with no links and the default [`Limits`].
    pub fn new() -> Relay {
        Relay {
            links: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            limits: Limits::default(),
        }
    }

    /// A relay with no links whose links will keep to `limits`.
    pub fn with_limits(limits: Limits) -> Result<Relay, RelayError> {
        limits.check()?;
        Ok(Relay {
            links: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            limits,
        })
    }

    /// A relay running `specs` (ids from 0, in order).
    pub async fn start(specs: impl IntoIterator<Item = LinkSpec>) -> Result<Relay, RelayError> {
        let relay = Relay::new();
        for s in specs {
            relay.add_link(s).await?;
        }
        Ok(relay)
    }

    /// Binds a link and starts forwarding; it is healthy until a fault is
    /// set. Must be called within a tokio runtime.
    pub async fn add_link(&self, spec: LinkSpec) -> Result<LinkInfo, RelayError> {
        let id = LinkId(self.next.fetch_add(1, Ordering::Relaxed));
        let link = Link::start(id, spec, self.limits.clone()).await?;
        let info = link.info;
        self.links.lock().push(link);
        Ok(info)
    }

    fn select(&self, f: impl Fn(&Link) -> bool) -> Links {
        Links {
            links: self.links.lock().iter().filter(|l| f(l)).cloned().collect(),
        }
    }

    /// Every link.
    pub fn all(&self) -> Links {
        self.select(|_| true)
    }

    /// The links of `network`.
    pub fn network(&self, network: usize) -> Links {
        self.select(|l| l.info.network == network)
    }

    /// One link (empty if there is no such link).
    pub fn link(&self, id: LinkId) -> Links {
        self.select(|l| l.info.id == id)
    }

    /// The links named in `ids` (those that exist).
    pub fn links(&self, ids: &[LinkId]) -> Links {
        self.select(|l| ids.contains(&l.info.id))
    }

    /// Every link's addresses, by id.
    pub fn infos(&self) -> Vec<LinkInfo> {
        self.all().infos()
    }

    /// Every link's faults and counters, by id.
    pub fn status(&self) -> Vec<LinkStatus> {
        self.all().status()
    }

    /// Closes every listener and connection and waits until their tasks
    /// have ended. Connections are closed, not reset: both sides get a FIN
    /// (or, where the relay left bytes unread, the kernel's RST).
    pub async fn shutdown(self) {
        let links = std::mem::take(&mut *self.links.lock());
        let handles: Vec<_> = links.iter().flat_map(|l| l.close()).collect();
        for h in handles {
            let _ = h.await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for l in self.links.lock().iter() {
            let _ = l.close();
        }
    }
}

/// Some links of a relay, to set faults on together (the links that
/// existed when they were selected). Cheap to clone, `Send`, and may be
/// moved into a task that fires faults on a schedule; once the relay is
/// gone, setting a fault does nothing.
#[derive(Clone)]
pub struct Links {
    links: Vec<Arc<Link>>,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.infos()).finish()
    }
}

impl Links {
    /// How many links are selected.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Their addresses.
    pub fn infos(&self) -> Vec<LinkInfo> {
        self.links.iter().map(|l| l.info).collect()
    }

    /// Their faults and counters.
    pub fn status(&self) -> Vec<LinkStatus> {
        self.links.iter().map(|l| l.status()).collect()
    }

    /// Resets every TCP connection open now, on both sides (RST: the
    /// client's and the upstream's next read fails with a reset, or
    /// returns 0 if it raced a FIN); returns how many. New connections
    /// pass at once; faults in force stay. UDP is not affected.
    pub fn kill(&self) -> usize {
        self.links.iter().map(|l| l.kill()).sum()
    }

    /// Stops traffic going `dir` (added to the blackholes in force) until
    /// [`heal`](Links::heal): TCP bytes are held in order, datagrams
    /// dropped.
    pub fn blackhole(&self, dir: Direction) {
        self.modify(|f| f.set_blackhole(dir));
    }

    /// Closes the TCP listeners until [`heal`](Links::heal): connects are
    /// refused. Open connections and UDP are not affected.
    pub fn refuse(&self) {
        self.modify(|f| f.refusing = true);
    }

    /// Drops `percent` (capped at 100) of the datagrams each way at
    /// random, until [`heal`](Links::heal) or another call.
    pub fn drop_udp(&self, percent: u8) {
        self.modify(|f| f.udp_drop_percent = percent.min(100));
    }

    /// Lifts every fault: held bytes flow on, in order, and the listeners
    /// open again.
    pub fn heal(&self) {
        self.modify(|f| *f = Faults::default());
    }

    fn modify(&self, f: impl Fn(&mut Faults)) {
        for l in &self.links {
            l.faults.send_modify(|x| f(x));
        }
    }
}
