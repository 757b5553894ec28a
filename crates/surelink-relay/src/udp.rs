//! UDP through a link: the listen socket's loop, and per client source
//! address one upstream socket (bound to the link's source IP, an
//! ephemeral port, connected to the upstream) with a task that sends what
//! comes back to that client from the listen socket.
//!
//! So an upstream that answers to the source of what it receives (a
//! surelink listener's heartbeats) answers the relay's per-client socket,
//! and the client hears the answer from the address it sent to.
//!
//! Bounds: at most `max_udp_clients` upstream sockets per link (a new
//! client evicts the least recently active one); a client silent both
//! ways for `udp_idle` loses its socket. Each socket's task holds one
//! 64 KiB receive buffer. A datagram is never held: while its direction
//! is blackholed it is dropped (and counted), as on a dead route.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::fault::Direction;
use crate::link::Link;
use crate::stats::bump;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 64 * 1024;

/// How long the listen loop pauses after a receive error, so a lasting
/// one cannot spin.
const RETRY: Duration = Duration::from_millis(10);

/// One client's upstream socket.
struct Client {
    socket: Arc<UdpSocket>,
    /// When a datagram last went either way (the link's milliseconds).
    last: Arc<AtomicU64>,
    /// Which socket this is, so a task that ends removes its own entry and
    /// not a newer one for the same client.
    generation: u64,
    task: JoinHandle<()>,
}

/// The UDP clients of a link.
#[derive(Default)]
pub(crate) struct Table {
    closed: bool,
    next: u64,
    clients: HashMap<SocketAddr, Client>,
}

impl Table {
    /// Closes the table (no new client) and hands back the tasks to abort.
    pub(crate) fn close(&mut self) -> Vec<JoinHandle<()>> {
        self.closed = true;
        self.clients.drain().map(|(_, c)| c.task).collect()
    }
}

/// Receives from clients and sends upstream; every quarter of
/// `udp_idle` (at most every second), closes the idle clients' sockets.
pub(crate) async fn front_loop(link: Arc<Link>, front: Arc<UdpSocket>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let every = (link.limits.udp_idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut sweep = tokio::time::interval(every);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = front.recv_from(&mut buf) => match r {
                Ok((n, from)) => up(&link, &front, from, &buf[..n]).await,
                Err(e) => {
                    debug!(addr = %link.info.listen, error = %e, "relay: UDP receive failed");
                    tokio::time::sleep(RETRY).await;
                }
            },
            _ = sweep.tick() => expire(&link),
        }
    }
}

/// One datagram from `client`, upstream.
async fn up(link: &Arc<Link>, front: &Arc<UdpSocket>, client: SocketAddr, datagram: &[u8]) {
    let c = &link.counters;
    let blocked = link.faults.borrow().blocks(Direction::Up);
    if blocked || link.drops_datagram() {
        c.udp_dropped(Direction::Up);
        return;
    }
    let Some((socket, last)) = socket_for(link, front, client).await else {
        c.udp_dropped(Direction::Up);
        return;
    };
    last.store(link.now_ms(), Ordering::Relaxed);
    match socket.send(datagram).await {
        Ok(_) => c.udp_sent(Direction::Up),
        Err(e) => {
            // Also a refusal from an earlier datagram (ICMP port
            // unreachable) is reported here, once.
            debug!(upstream = %link.info.upstream, error = %e, "relay: UDP send failed");
            c.udp_dropped(Direction::Up);
        }
    }
}

/// `client`'s upstream socket, made (and its task started) if it has none;
/// `None` if the link is closed or no socket could be made.
async fn socket_for(
    link: &Arc<Link>,
    front: &Arc<UdpSocket>,
    client: SocketAddr,
) -> Option<(Arc<UdpSocket>, Arc<AtomicU64>)> {
    if let Some(c) = link.udp.lock().clients.get(&client) {
        return Some((c.socket.clone(), c.last.clone()));
    }
    let socket = match upstream_socket(link).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            debug!(upstream = %link.info.upstream, error = %e, "relay: no UDP socket upstream");
            return None;
        }
    };
    let last = Arc::new(AtomicU64::new(link.now_ms()));
    let mut t = link.udp.lock();
    if t.closed {
        return None;
    }
    if t.clients.len() >= link.limits.max_udp_clients {
        let oldest = t
            .clients
            .iter()
            .min_by_key(|(_, c)| c.last.load(Ordering::Relaxed))
            .map(|(a, _)| *a);
        if let Some(c) = oldest.and_then(|a| t.clients.remove(&a)) {
            c.task.abort();
            bump(&link.counters.udp_clients_evicted);
            link.counters.udp_clients.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let generation = t.next;
    t.next += 1;
    let task = tokio::spawn(down(
        link.clone(),
        front.clone(),
        socket.clone(),
        client,
        generation,
        last.clone(),
    ));
    t.clients.insert(
        client,
        Client {
            socket: socket.clone(),
            last: last.clone(),
            generation,
            task,
        },
    );
    bump(&link.counters.udp_clients);
    Some((socket, last))
}

/// A socket bound to the link's source IP (or the unspecified address),
/// an ephemeral port, connected to the upstream: the kernel then passes
/// it only the upstream's datagrams.
async fn upstream_socket(link: &Link) -> io::Result<UdpSocket> {
    let to = link.info.upstream;
    let ip = link.info.source_ip.unwrap_or(if to.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    });
    let s = UdpSocket::bind((ip, 0)).await?;
    s.connect(to).await?;
    Ok(s)
}

/// What the upstream sends to `client`'s socket goes to `client`, from
/// the listen socket.
async fn down(
    link: Arc<Link>,
    front: Arc<UdpSocket>,
    socket: Arc<UdpSocket>,
    client: SocketAddr,
    generation: u64,
    last: Arc<AtomicU64>,
) {
    let c = &link.counters;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let n = match socket.recv(&mut buf).await {
            Ok(n) => n,
            // The upstream refused an earlier datagram (ICMP): nothing
            // to forward, the socket still works.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) => {
                debug!(%client, error = %e, "relay: UDP upstream socket failed");
                break;
            }
        };
        last.store(link.now_ms(), Ordering::Relaxed);
        let blocked = link.faults.borrow().blocks(Direction::Down);
        if blocked || link.drops_datagram() {
            c.udp_dropped(Direction::Down);
            continue;
        }
        match front.send_to(&buf[..n], client).await {
            Ok(_) => c.udp_sent(Direction::Down),
            Err(_) => c.udp_dropped(Direction::Down),
        }
    }
    let mut t = link.udp.lock();
    if t.clients
        .get(&client)
        .is_some_and(|e| e.generation == generation)
    {
        t.clients.remove(&client);
        link.counters.udp_clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Closes the sockets of clients idle for `udp_idle`.
fn expire(link: &Link) {
    let idle = u64::try_from(link.limits.udp_idle.as_millis()).unwrap_or(u64::MAX);
    let now = link.now_ms();
    let mut t = link.udp.lock();
    t.clients.retain(|_, c| {
        let keep = now.saturating_sub(c.last.load(Ordering::Relaxed)) < idle;
        if !keep {
            c.task.abort();
            link.counters.udp_clients.fetch_sub(1, Ordering::Relaxed);
        }
        keep
    });
}
