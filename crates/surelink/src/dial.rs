//! Dialling configured peers and keeping a connection to each on every
//! network: connect attempts that do not wait for the kernel's SYN
//! retransmission, and a re-dial policy led by the failure detector (try
//! at once while the peer is heard, back off while it is silent). The
//! [`Dialer`] keeps what dialling remembers between attempts.
//!
//! What it does not do: decide which session a dialled connection joins
//! (the core's router does, through the shell's routing).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};

use surelink_proto::wire::CloseCode;
use surelink_proto::NodeId;

use crate::config::PeerConfig;
use crate::conn::{bind_device, configure, start, Transport};
use crate::events::NetEvent;
use crate::shared::Shared;

/// What dialling remembers between attempts.
#[derive(Debug, Default)]
pub(crate) struct Dialer {
    /// A silent path is heard again (or the process starts a new
    /// incarnation): dial loops retry at once.
    redial: Notify,
    /// Per dialled peer: networks where a connect was refused since it
    /// was last connected, and whether `PeerRefused` was reported.
    refused: Mutex<FxHashMap<NodeId, (u64, bool)>>,
}

impl Dialer {
    /// Wakes every dial loop waiting to retry: try now.
    pub(crate) fn redial_now(&self) {
        self.redial.notify_waiters();
    }

    /// A connect to `peer` on `network` was refused. Reports
    /// [`NetEvent::PeerRefused`] when every network of the peer refused
    /// and no path to it is up.
    fn refused(&self, shared: &Shared, peer: NodeId, network: usize) {
        let Some(p) = shared.config.peers.iter().find(|p| p.node == peer) else {
            return;
        };
        let want = p
            .addrs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_some())
            .fold(0u64, |m, (i, _)| m | 1u64 << i.min(63));
        let report = {
            let mut r = self.refused.lock();
            let e = r.entry(peer).or_default();
            e.0 |= 1u64 << network.min(63);
            let all = e.0 & want == want;
            if all && !e.1 && shared.events.paths_up(peer) == 0 {
                e.1 = true;
                true
            } else {
                false
            }
        };
        if report {
            warn!(%peer, "every network refused our connections: no process listens at the peer's addresses");
            shared.events.publish(NetEvent::PeerRefused { peer });
        }
    }

    /// A connect to `peer` succeeded: refusals start over.
    fn connected(&self, peer: NodeId) {
        self.refused.lock().remove(&peer);
    }
}

/// Starts keeping connections to `p` on every network this node has a
/// local address for (and tells the detector where its heartbeats go).
pub(crate) fn dial_peer(shared: &Arc<Shared>, p: &PeerConfig) {
    let cfg = &shared.config;
    for (network, addr) in p.addrs.iter().enumerate() {
        let (Some(remote), Some(local)) = (addr, cfg.local_addr(network)) else {
            continue;
        };
        if let Some(d) = &shared.detector {
            // The peer's heartbeat socket shares its listener's port.
            d.add_destination(p.node, network, *remote);
        }
        for _ in 0..cfg.connections_per_network {
            shared.spawn(dial_loop(shared.clone(), p.node, network, local, *remote));
        }
    }
}

/// How long the first connect attempt waits for the SYN-ACK before a
/// fresh one joins it.
const FIRST_SYN_WAIT: Duration = Duration::from_millis(50);

/// Connect attempts in flight at once; the oldest is dropped for a new
/// one. With the 50 ms gap while the peer is heard, an attempt lives
/// 400 ms: longer than any round trip a cluster fabric sees.
const MAX_ATTEMPTS: usize = 8;

type Attempt = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

/// One connect: a fresh socket (a new source port, so a new SYN).
fn attempt(local: SocketAddr, remote: SocketAddr, device: Option<&str>) -> io::Result<Attempt> {
    let socket = if remote.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    bind_device(&socket, device)?;
    socket.bind(SocketAddr::new(local.ip(), 0))?;
    Ok(Box::pin(socket.connect(remote)))
}

/// Dials `remote` from the IP of `local`.
///
/// A SYN lost in an outage would wait for the kernel's SYN retransmission
/// (1 s, then 3 s) even after the path is back. So while no attempt has
/// completed, a fresh one (a new SYN) starts every gap, the earlier ones
/// kept (a peer whose round trip is longer than the gap still connects;
/// at most [`MAX_ATTEMPTS`]), and the first to complete wins. The gap
/// starts at 50 ms and doubles — unless `heard()` says the peer is alive on
/// this network, so only our way there is cut: then it stays at 50 ms, and
/// the connection is back within that of the cut healing. An attempt that
/// fails (refused, unreachable) ends the dial with its error; `timeout`
/// bounds it in all.
pub(crate) async fn dial(
    local: SocketAddr,
    remote: SocketAddr,
    device: Option<&str>,
    timeout: Duration,
    heard: impl Fn() -> bool,
) -> io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let mut gap = FIRST_SYN_WAIT;
    let mut attempts: VecDeque<Attempt> = VecDeque::with_capacity(MAX_ATTEMPTS);
    loop {
        if attempts.len() == MAX_ATTEMPTS {
            attempts.pop_front();
        }
        attempts.push_back(attempt(local, remote, device)?);
        let next = tokio::time::sleep_until((Instant::now() + gap).min(deadline));
        tokio::pin!(next);
        let done = std::future::poll_fn(|cx| {
            for a in attempts.iter_mut() {
                if let Poll::Ready(r) = a.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
            }
            next.as_mut().poll(cx).map(|()| None)
        })
        .await;
        if let Some(r) = done {
            return r;
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        }
        gap = if heard() {
            FIRST_SYN_WAIT
        } else {
            gap.saturating_mul(2)
        };
    }
}

/// Keeps a connection to `peer` on one network, re-dialling when it is
/// lost: at once while the detector hears the peer there, with capped
/// exponential backoff while it is silent (and at once when it is heard
/// again).
async fn dial_loop(
    shared: Arc<Shared>,
    peer: NodeId,
    network: usize,
    local: SocketAddr,
    remote: SocketAddr,
) {
    let cfg = &shared.config;
    // Heard on this network: alive there, so a failed connect means our way
    // to it is cut for now (a one-way fault, a route gone) and no "heard
    // again" will come to wake us.
    let heard = || {
        shared
            .detector
            .as_ref()
            .is_some_and(|d| d.hears(peer, network))
    };
    let mut backoff = cfg.reconnect_initial;
    let mut jitter = Jitter::new(peer, network, local);
    loop {
        // A refused handshake is a configuration problem, not a cut path:
        // it always backs off; so does a connection refused at the peer's
        // limit for us.
        let mut handshake_refused = false;
        let mut at_limit = false;
        let device = cfg.devices.get(network).and_then(|d| d.as_deref());
        // Silent on this network (test hook): SYNs would be lost.
        #[cfg(feature = "test-util")]
        while crate::testing::is_muted(&shared.muted, network) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // A path heard again during a connect: drop it and dial afresh.
        let attempt = tokio::select! {
            r = dial(local, remote, device, cfg.connect_timeout, &heard) => r,
            _ = shared.dialer.redial.notified() => {
                debug!(%peer, network, "path heard again during a connect: dialling afresh");
                backoff = cfg.reconnect_initial;
                continue;
            }
        };
        match attempt {
            Ok(mut stream) => {
                shared.dialer.connected(peer);
                configure(&stream, &shared);
                let secured = match &shared.secure {
                    None => Ok(None),
                    Some(setup) => {
                        let t = cfg.core.handshake_timeout;
                        crate::secure::handshake(setup, &mut stream, Some(peer), t)
                            .await
                            .map(Some)
                    }
                };
                match secured {
                    Ok(secured) => match start(
                        &shared,
                        Transport::Tcp {
                            stream,
                            relayed: false,
                        },
                        network,
                        Some(peer),
                        secured,
                        None,
                    ) {
                        Ok(done) => {
                            if done.await.ok().flatten() == Some(CloseCode::LIMIT) {
                                // The peer holds as many of our connections
                                // as it takes: not again at once.
                                at_limit = true;
                                if let Some(n) = shared
                                    .logs
                                    .limits
                                    .allow(shared.clock.now().since_origin().as_secs())
                                {
                                    warn!(%peer, network, %remote, suppressed = n, "the peer refused the connection at its limit for this node (max_connections_per_member there); backing off");
                                }
                            } else {
                                backoff = cfg.reconnect_initial;
                            }
                        }
                        Err(e) => debug!(%peer, network, error = %e, "connection vanished"),
                    },
                    Err(e) => {
                        handshake_refused = true;
                        shared.stats.handshake_failed();
                        if let Some(n) = shared
                            .logs
                            .handshake
                            .allow(shared.clock.now().since_origin().as_secs())
                        {
                            warn!(%peer, network, %remote, error = %e, suppressed = n, "handshake with the dialled peer failed");
                        }
                    }
                }
            }
            Err(e) => {
                debug!(%peer, network, %remote, error = %e, "dial failed");
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    shared.dialer.refused(&shared, peer, network);
                }
            }
        }
        // Cut, not silent: retry after the first delay (a connect costs a
        // SYN). Silent: back off until it is heard again. Refused (at the
        // peer's limits, or its handshake failed): back off whatever is
        // heard — a busy peer that refuses handshakes is heard all along,
        // and hundreds of clients retrying each time a path is heard
        // again kept a 500-client server in a re-dial storm.
        let refused = handshake_refused || at_limit;
        let fast = !refused && heard();
        if fast {
            tokio::select! {
                _ = tokio::time::sleep(cfg.reconnect_initial) => {}
                _ = shared.dialer.redial.notified() => backoff = cfg.reconnect_initial,
            }
            continue;
        }
        // Spread over half to one and a half times the backoff, so
        // clients cut off together do not come back together.
        let wait = jitter.spread(backoff);
        if refused {
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(cfg.reconnect_max);
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => backoff = (backoff * 2).min(cfg.reconnect_max),
            _ = shared.dialer.redial.notified() => backoff = cfg.reconnect_initial,
        }
    }
}

/// Randomness for spreading re-dials (not secret: a seeded xorshift).
struct Jitter(u64);

impl Jitter {
    fn new(peer: NodeId, network: usize, local: SocketAddr) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        (peer, network, local, std::time::SystemTime::now()).hash(&mut h);
        Jitter(h.finish() | 1)
    }

    /// `d` times a factor drawn from [0.5, 1.5).
    fn spread(&mut self, d: std::time::Duration) -> std::time::Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let f = 0.5 + (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        d.mul_f64(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn jitter_spreads_over_half_to_one_and_a_half_times() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let d = Duration::from_millis(100);
        let mut seen = Vec::new();
        for peer in 0..50u64 {
            let mut j = Jitter::new(NodeId(peer), 0, local);
            for _ in 0..20 {
                let w = j.spread(d);
                assert!(w >= d / 2 && w < d * 3 / 2, "{w:?}");
                seen.push(w);
            }
        }
        // Spread, not one value: both halves of the range are used.
        assert!(seen.iter().any(|w| *w < d) && seen.iter().any(|w| *w > d));
    }
}
