//! A client's path to a server through a helper: a TCP connection to the
//! helper, a preamble naming the server, then the same handshake and
//! session frames as on a direct path — end to end with the server. The
//! path joins the client's session to the server like any other; when it
//! breaks (the helper died, or closed it) the session fails over to its
//! other paths and this side re-dials the helper with backoff.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

use surelink_proto::NodeId;

use crate::conn::{configure, start_conn, ConnIo, Transport};
use crate::shared::Shared;
use surelink_proto::helper::Preamble;

/// A path of this endpoint's session to a server through a helper, kept
/// (re-dialled when it breaks) until [`RelayPath::stop`] or drop.
#[derive(Debug)]
pub struct RelayPath {
    task: JoinHandle<()>,
    current: Arc<Mutex<Option<Arc<ConnIo>>>>,
    /// An attempt failed, or the path broke, at least once.
    faltered: Arc<AtomicBool>,
    /// When the attempt under way began (`None` while the path is up).
    attempt: Arc<Mutex<Option<Instant>>>,
}

/// How long an attempt may stay under way before the path counts as
/// failing: a helper frozen with its listener open accepts the
/// connection and never answers the handshake, which would otherwise be
/// found only at the handshake's deadline (10 s by default). Moves
/// through a hot server take longer than on an idle one (500 clients
/// moving at once on this project's 2-core machine: each a median
/// 455 ms, all done by 1.56 s; docs/postman.md), so this is above that.
pub(crate) const ATTEMPT_STALL: Duration = Duration::from_secs(2);

impl RelayPath {
    pub(crate) fn start(
        shared: &Arc<Shared>,
        server: NodeId,
        helper: SocketAddr,
        network: usize,
    ) -> RelayPath {
        let current = Arc::new(Mutex::new(None));
        let faltered = Arc::new(AtomicBool::new(false));
        let attempt = Arc::new(Mutex::new(Some(Instant::now())));
        let task = tokio::spawn(relay_loop(
            Arc::downgrade(shared),
            server,
            helper,
            network,
            current.clone(),
            faltered.clone(),
            attempt.clone(),
        ));
        RelayPath {
            task,
            current,
            faltered,
            attempt,
        }
    }

    /// Whether the path is connected now.
    pub fn is_up(&self) -> bool {
        self.current.lock().is_some()
    }

    /// The path is up but its session suspects it (frames through it
    /// went unanswered: the helper froze, or its link to the server
    /// did): the session already sends around it.
    pub(crate) fn is_suspect(&self, shared: &Shared, server: NodeId) -> bool {
        let Some(path) = self.current.lock().as_ref().map(|io| io.path) else {
            return false;
        };
        shared
            .session(server)
            .is_some_and(|s| s.is_path_suspect(path))
    }

    /// Down, after an attempt failed or the path broke, or with an
    /// attempt under way for longer than [`ATTEMPT_STALL`]: a younger
    /// first attempt is not (through a hot server the end-to-end
    /// handshake can take a second; a dead helper refuses at once, a
    /// frozen one accepts and never answers).
    pub(crate) fn is_failing(&self) -> bool {
        if self.is_up() {
            return false;
        }
        self.faltered.load(Ordering::Relaxed)
            || self
                .attempt
                .lock()
                .is_some_and(|t| t.elapsed() >= ATTEMPT_STALL)
    }

    /// Closes the path (the session moves its traffic to its other paths)
    /// and stops re-dialling.
    pub fn stop(self) {}
}

impl Drop for RelayPath {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(io) = self.current.lock().take() {
            io.kill();
        }
    }
}

async fn connect(
    shared: &Shared,
    helper: SocketAddr,
    network: usize,
) -> std::io::Result<TcpStream> {
    let socket = if helper.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(local) = shared.config.local_addr(network) {
        if local.is_ipv4() == helper.is_ipv4() {
            socket.bind(SocketAddr::new(local.ip(), 0))?;
        }
    }
    tokio::time::timeout(shared.config.connect_timeout, socket.connect(helper))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

async fn relay_loop(
    shared: Weak<Shared>,
    server: NodeId,
    helper: SocketAddr,
    network: usize,
    current: Arc<Mutex<Option<Arc<ConnIo>>>>,
    faltered: Arc<AtomicBool>,
    attempt: Arc<Mutex<Option<Instant>>>,
) {
    let mut backoff = None;
    loop {
        let Some(sh) = shared.upgrade() else { return };
        let (first, max) = (sh.config.reconnect_initial, sh.config.reconnect_max);
        let began = Instant::now();
        *attempt.lock() = Some(began);
        let mut connected = None;
        let started = async {
            let mut stream = connect(&sh, helper, network).await?;
            connected = Some(began.elapsed());
            configure(&stream, &sh);
            stream
                .write_all(&Preamble::Relay { server }.encode())
                .await?;
            let secured = match &sh.secure {
                None => None,
                Some(setup) => {
                    let t = sh.config.core.handshake_timeout;
                    Some(
                        crate::secure::handshake(setup, &mut stream, Some(server), t)
                            .await
                            .map_err(|e| std::io::Error::other(e.to_string()))?,
                    )
                }
            };
            let t = Transport::Tcp {
                stream,
                relayed: true,
            };
            start_conn(&sh, t, network, Some(server), secured, None)
        }
        .await;
        drop(sh);
        match started {
            Ok((io, done)) => {
                debug!(%server, %helper, connect = ?connected, up = ?began.elapsed(), "path through the helper up");
                *current.lock() = Some(io);
                attempt.lock().take();
                let _ = done.await;
                current.lock().take();
                faltered.store(true, Ordering::Relaxed);
                backoff = None;
            }
            Err(e) => {
                faltered.store(true, Ordering::Relaxed);
                debug!(%server, %helper, error = %e, "path through the helper not opened");
            }
        }
        let wait = backoff.map_or(first, |b: Duration| (b * 2).min(max));
        backoff = Some(wait);
        tokio::time::sleep(wait).await;
    }
}
