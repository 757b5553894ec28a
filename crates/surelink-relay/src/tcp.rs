//! TCP through a link: the accept loop (which also closes and reopens the
//! listener for `refuse`), and one task per connection that connects
//! upstream and pumps both ways.
//!
//! Faithfulness: a FIN is passed on as a FIN (`shutdown(Write)` on the
//! other side, the other direction keeps flowing); an error on either
//! side (a reset, a failed write) resets both sides (`SO_LINGER` 0, then
//! close); a kill resets both. A blackholed direction is not read at all,
//! so a FIN or a reset the sender sends that way is only seen once the
//! blackhole lifts (or when the other direction's write fails) — as
//! behind a dead route.
//!
//! Memory: one `tcp_chunk` buffer per direction, allocated when the
//! connection starts. A blackhole that starts while a read is under way
//! holds that one chunk in the relay; everything after it stays in the
//! kernel (the relay's receive buffer, then the sender's send buffer).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::fault::{open, Direction};
use crate::link::{bind_tcp, Link};
use crate::stats::bump;

/// How long the accept loop waits after an accept or re-bind error (out
/// of file descriptors, the port taken meanwhile) before trying again.
const RETRY: Duration = Duration::from_millis(50);

/// Accepts clients while the link is not refusing; while it is, the
/// listener is closed (connects are refused by the kernel) and bound again
/// when the fault lifts.
pub(crate) async fn accept_loop(link: Arc<Link>, listener: TcpListener) {
    let mut faults = link.faults.subscribe();
    let mut listener = Some(listener);
    loop {
        let Some(l) = &listener else {
            let _ = faults.wait_for(|f| !f.refusing).await;
            match bind_tcp(link.info.listen) {
                Ok(l) => listener = Some(l),
                Err(e) => {
                    warn!(addr = %link.info.listen, error = %e, "relay: listener not bound again");
                    tokio::time::sleep(RETRY).await;
                }
            }
            continue;
        };
        let accepted = tokio::select! {
            _ = faults.wait_for(|f| f.refusing) => None,
            r = l.accept() => Some(r),
        };
        match accepted {
            None => listener = None,
            Some(Ok((stream, _))) => admit(&link, stream),
            Some(Err(e)) => {
                debug!(addr = %link.info.listen, error = %e, "relay: accept failed");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Starts a connection's task, or resets the client when the link is
/// full (or closing).
fn admit(link: &Arc<Link>, client: TcpStream) {
    bump(&link.counters.tcp_accepted);
    let _ = client.set_nodelay(true);
    // The stream moves into the task only if one starts.
    let mut client = Some(client);
    let started = link.spawn_conn(|id, kill| {
        let link = link.clone();
        let client = client.take();
        async move {
            if let Some(c) = client {
                connection(&link, c, &kill).await;
            }
            link.conn_done(id);
        }
    });
    if !started {
        bump(&link.counters.tcp_rejected);
        if let Some(c) = client {
            reset(&c);
        }
    }
}

/// How a connection ended.
enum End {
    /// Both sides closed (FIN each way).
    Closed,
    /// An I/O error on either side.
    Broken,
    /// `kill`.
    Killed,
}

/// One connection, from the upstream connect to the end.
async fn connection(link: &Link, mut client: TcpStream, kill: &Notify) {
    let c = &link.counters;
    c.tcp_open
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let upstream = tokio::select! {
        () = kill.notified() => Err(End::Killed),
        r = connect(link) => r.map_err(|e| {
            debug!(upstream = %link.info.upstream, error = %e, "relay: upstream connect failed");
            End::Broken
        }),
    };
    let end = match upstream {
        Err(End::Killed) => {
            reset(&client);
            End::Killed
        }
        Err(_) => {
            bump(&c.tcp_connect_failed);
            reset(&client);
            End::Broken
        }
        Ok(mut up) => {
            let end = tokio::select! {
                () = kill.notified() => End::Killed,
                e = pump_both(link, &mut client, &mut up) => e,
            };
            if !matches!(end, End::Closed) {
                reset(&client);
                reset(&up);
            }
            end
        }
    };
    match end {
        End::Killed => bump(&c.tcp_killed),
        End::Broken => bump(&c.tcp_broken),
        End::Closed => {}
    }
    c.tcp_open
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

/// A connection to the link's upstream, from its source IP.
async fn connect(link: &Link) -> io::Result<TcpStream> {
    let to = link.info.upstream;
    let s = if to.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = link.info.source_ip {
        s.bind((ip, 0).into())?;
    }
    let stream = tokio::time::timeout(link.limits.connect_timeout, s.connect(to))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Both directions until both have closed (`Closed`) or either fails.
async fn pump_both(link: &Link, client: &mut TcpStream, upstream: &mut TcpStream) -> End {
    let (cr, cw) = client.split();
    let (ur, uw) = upstream.split();
    match tokio::try_join!(
        pump(link, cr, uw, Direction::Up),
        pump(link, ur, cw, Direction::Down)
    ) {
        Ok(_) => End::Closed,
        Err(_) => End::Broken,
    }
}

/// One direction: read a chunk, write it on, while the direction is open.
async fn pump(
    link: &Link,
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    dir: Direction,
) -> io::Result<()> {
    let mut faults = link.faults.subscribe();
    let mut buf = vec![0u8; link.limits.tcp_chunk];
    loop {
        // Not read while blackholed: the bytes queue in the kernel.
        open(&mut faults, dir).await;
        let n = from.read(&mut buf).await?;
        // A blackhole that began during the read holds this chunk (and the
        // FIN) here until it lifts.
        open(&mut faults, dir).await;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        link.counters.tcp_bytes(dir, n);
    }
}

/// Closes with a reset: `SO_LINGER` 0, so the close that follows (the
/// stream's drop) sends RST and discards what is queued.
fn reset(s: &TcpStream) {
    let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
}
