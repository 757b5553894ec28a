//! One link: a TCP listener and a UDP socket on one `ip:port`, forwarding
//! to one upstream `ip:port`; its faults, counters and tasks.
//!
//! Every task of a link is registered here, so that closing the link
//! (the relay's drop or shutdown) aborts all of them: the accept loop, the
//! UDP loop, one task per TCP connection (`tcp.rs`) and one per UDP
//! client (`udp.rs`). A task that ends on its own removes itself.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpSocket, UdpSocket};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::error::RelayError;
use crate::fault::Faults;
use crate::stats::{Counters, LinkStatus};
use crate::{tcp, udp};

/// Ports tried when a link asks for port 0 before giving up: the kernel
/// picks a free TCP port, and the UDP port of that number may be taken.
const PORT_TRIES: u32 = 64;

/// A link's number in its relay (in the order added, from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(pub usize);

/// What to relay: from `listen` (TCP and UDP on the same `ip:port`; port 0
/// picks one free for both) to `upstream` (TCP and UDP on its `ip:port`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkSpec {
    /// The group the link belongs to (the demo's "network 0", "network 1"):
    /// [`Relay::network`](crate::Relay::network) selects it.
    pub network: usize,
    /// Where clients connect and send datagrams.
    pub listen: SocketAddr,
    /// Where the relay connects and sends datagrams.
    pub upstream: SocketAddr,
    /// The IP upstream sockets are bound to (ephemeral ports), so traffic
    /// to a node on network 1 leaves from a network-1 address; `None`: the
    /// kernel's choice.
    pub source_ip: Option<IpAddr>,
}

impl LinkSpec {
    /// A link of `network` from `listen` to `upstream`, with the kernel's
    /// choice of source address.
    pub fn new(network: usize, listen: SocketAddr, upstream: SocketAddr) -> LinkSpec {
        LinkSpec {
            network,
            listen,
            upstream,
            source_ip: None,
        }
    }

    /// Upstream sockets leave from `ip`.
    pub fn from_ip(mut self, ip: IpAddr) -> LinkSpec {
        self.source_ip = Some(ip);
        self
    }

    fn check(&self) -> Result<(), RelayError> {
        let bad = |reason| RelayError::Config {
            listen: self.listen,
            upstream: self.upstream,
            reason,
        };
        if self.upstream.port() == 0 || self.upstream.ip().is_unspecified() {
            return Err(bad("the upstream address needs an IP and a port"));
        }
        if self
            .source_ip
            .is_some_and(|ip| ip.is_ipv4() != self.upstream.is_ipv4())
        {
            return Err(bad(
                "the source IP and the upstream are of different families",
            ));
        }
        Ok(())
    }
}

/// A link as it runs: its listen address is the one bound (the port
/// filled in when 0 was asked for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkInfo {
    /// Its number.
    pub id: LinkId,
    /// Its group.
    pub network: usize,
    /// Where it listens (TCP and UDP).
    pub listen: SocketAddr,
    /// Where it forwards.
    pub upstream: SocketAddr,
    /// Where its upstream sockets are bound.
    pub source_ip: Option<IpAddr>,
}

/// Bounds on what one link may hold. With them, a link holds at most
/// `max_connections × 2 × tcp_chunk` bytes of TCP data and
/// `(max_udp_clients + 1) × 64 KiB` of UDP buffers (one receive buffer per
/// client's upstream socket and one for the listen socket), besides what
/// the kernel queues in its sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Bytes read at once per TCP connection and direction: the most a
    /// blackhole can hold inside the relay (the rest waits in the kernel).
    pub tcp_chunk: usize,
    /// TCP connections open at once per link; more are accepted and reset.
    pub max_connections: usize,
    /// How long an upstream connect may take before the client is reset.
    pub connect_timeout: Duration,
    /// UDP clients (source addresses) with an upstream socket per link; a
    /// new one evicts the least recently active.
    pub max_udp_clients: usize,
    /// A UDP client with no datagram either way for this long loses its
    /// upstream socket (its next datagram gets a new one, a new port).
    pub udp_idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            tcp_chunk: 16 * 1024,
            max_connections: 1024,
            connect_timeout: Duration::from_secs(5),
            max_udp_clients: 256,
            udp_idle: Duration::from_secs(60),
        }
    }
}

impl Limits {
    pub(crate) fn check(&self) -> Result<(), RelayError> {
        let zero = [
            ("tcp_chunk", self.tcp_chunk == 0),
            ("max_connections", self.max_connections == 0),
            ("connect_timeout", self.connect_timeout.is_zero()),
            ("max_udp_clients", self.max_udp_clients == 0),
            ("udp_idle", self.udp_idle.is_zero()),
        ];
        match zero.iter().find(|(_, z)| *z) {
            Some((field, _)) => Err(RelayError::Limit { field }),
            None => Ok(()),
        }
    }
}

/// One TCP connection's task and the switch that kills it.
struct Conn {
    kill: Arc<Notify>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Tasks {
    closed: bool,
    next: u64,
    conns: HashMap<u64, Conn>,
    background: Vec<JoinHandle<()>>,
}

/// A running link, shared by its tasks and its relay.
pub(crate) struct Link {
    pub(crate) info: LinkInfo,
    pub(crate) limits: Limits,
    pub(crate) faults: watch::Sender<Faults>,
    pub(crate) counters: Counters,
    pub(crate) udp: Mutex<udp::Table>,
    tasks: Mutex<Tasks>,
    born: Instant,
    rng: AtomicU64,
}

impl Link {
    /// Binds the link's sockets and starts its accept and UDP loops.
    pub(crate) async fn start(
        id: LinkId,
        spec: LinkSpec,
        limits: Limits,
    ) -> Result<Arc<Link>, RelayError> {
        spec.check()?;
        let (listener, socket) = bind_pair(spec.listen)?;
        let listen = socket.local_addr().map_err(|source| RelayError::Bind {
            protocol: "UDP",
            addr: spec.listen,
            source,
        })?;
        let born = Instant::now();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()) ^ d.as_secs());
        let seed = wall ^ u64::from(listen.port()).rotate_left(32) ^ (id.0 as u64);
        let link = Arc::new(Link {
            info: LinkInfo {
                id,
                network: spec.network,
                listen,
                upstream: spec.upstream,
                source_ip: spec.source_ip,
            },
            limits,
            faults: watch::Sender::new(Faults::default()),
            counters: Counters::default(),
            udp: Mutex::new(udp::Table::default()),
            tasks: Mutex::new(Tasks::default()),
            born,
            rng: AtomicU64::new(seed),
        });
        let accept = tokio::spawn(tcp::accept_loop(link.clone(), listener));
        let datagrams = tokio::spawn(udp::front_loop(link.clone(), Arc::new(socket)));
        link.tasks.lock().background.extend([accept, datagrams]);
        Ok(link)
    }

    /// A snapshot of the link.
    pub(crate) fn status(&self) -> LinkStatus {
        LinkStatus {
            link: self.info,
            faults: *self.faults.borrow(),
            counters: self.counters.snapshot(),
        }
    }

    /// Registers a TCP connection's task, built by `task` from its id and
    /// kill switch; `false` (and nothing spawned) when the link is closed
    /// or full.
    pub(crate) fn spawn_conn<F>(&self, task: impl FnOnce(u64, Arc<Notify>) -> F) -> bool
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut t = self.tasks.lock();
        if t.closed || t.conns.len() >= self.limits.max_connections {
            return false;
        }
        let id = t.next;
        t.next += 1;
        let kill = Arc::new(Notify::new());
        let task = tokio::spawn(task(id, kill.clone()));
        t.conns.insert(id, Conn { kill, task });
        true
    }

    /// A connection's task ended on its own.
    pub(crate) fn conn_done(&self, id: u64) {
        self.tasks.lock().conns.remove(&id);
    }

    /// Resets every TCP connection now open; returns how many.
    pub(crate) fn kill(&self) -> usize {
        let t = self.tasks.lock();
        for c in t.conns.values() {
            // A stored permit: a task not yet waiting sees it when it does.
            c.kill.notify_one();
        }
        t.conns.len()
    }

    /// Closes the link: aborts every task and returns them, to be awaited
    /// by a caller that wants the sockets closed when it returns.
    pub(crate) fn close(&self) -> Vec<JoinHandle<()>> {
        let mut handles = {
            let mut t = self.tasks.lock();
            t.closed = true;
            let mut h = std::mem::take(&mut t.background);
            h.extend(t.conns.drain().map(|(_, c)| c.task));
            h
        };
        handles.extend(self.udp.lock().close());
        for h in &handles {
            h.abort();
        }
        handles
    }

    /// Milliseconds since the link started (the UDP clients' activity clock).
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the random UDP drop takes this datagram.
    pub(crate) fn drops_datagram(&self) -> bool {
        let percent = self.faults.borrow().udp_drop_percent;
        if percent == 0 {
            return false;
        }
        // splitmix64 over an atomic counter: good enough to drop at random,
        // and safe from any task.
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        z % 100 < u64::from(percent)
    }
}

/// A listening TCP socket on `addr` (`SO_REUSEADDR`, so the address binds
/// again after [`refuse`](crate::Links::refuse) while old connections linger).
pub(crate) fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(1024)
}

fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = std::net::UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

/// A TCP listener and a UDP socket on the same `ip:port`.
fn bind_pair(listen: SocketAddr) -> Result<(TcpListener, UdpSocket), RelayError> {
    let tcp_err = |source| RelayError::Bind {
        protocol: "TCP",
        addr: listen,
        source,
    };
    let udp_err = |source| RelayError::Bind {
        protocol: "UDP",
        addr: listen,
        source,
    };
    if listen.port() != 0 {
        let l = bind_tcp(listen).map_err(tcp_err)?;
        let u = bind_udp(listen).map_err(udp_err)?;
        return Ok((l, u));
    }
    for _ in 0..PORT_TRIES {
        let l = bind_tcp(listen).map_err(tcp_err)?;
        let addr = l.local_addr().map_err(tcp_err)?;
        match bind_udp(addr) {
            Ok(u) => return Ok((l, u)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(udp_err(e)),
        }
    }
    Err(RelayError::NoFreePort {
        ip: listen.ip(),
        tries: PORT_TRIES,
    })
}
