//! `surelink-lab experiment-tcp-node`: the baselines of the failover
//! experiment — what an application does today. A plain TCP (or Linux
//! MPTCP, `--mptcp`: socket protocol 262) server, and a client that sends
//! a request every `--calls-ms` on one connection and prints a `reply`
//! line per answer (same JSON lines and request sizes as
//! `experiment-node`). Requests are length-prefixed frames (u32, then the
//! request, whose first 8 bytes are its id); the server answers each with
//! a frame of the request's first 64 bytes, as the surelink receiver does. The
//! client never reconnects: a killed connection stays dead, as in an
//! application without its own retry logic.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::node::wall_us;

/// Linux's IPPROTO_MPTCP.
const IPPROTO_MPTCP: i32 = 262;

/// Arguments of `surelink-lab experiment-tcp-node`.
#[derive(Args, Debug, Clone)]
pub(crate) struct TcpNodeArgs {
    /// Serve echoes on `--local` (else: the client).
    #[arg(long)]
    server: bool,
    /// Use MPTCP sockets.
    #[arg(long)]
    mptcp: bool,
    /// Listen address (server).
    #[arg(long)]
    local: Option<SocketAddr>,
    /// Server address (client).
    #[arg(long)]
    peer: Option<SocketAddr>,
    /// One request every this many ms (client).
    #[arg(long, default_value_t = 1)]
    calls_ms: u64,
    /// Request size (client): `N` or `MIN-MAX` (see `experiment-node`).
    #[arg(long, default_value = "64", value_parser = super::node::parse_sizes)]
    call_bytes: (usize, usize),
}

fn socket(mptcp: bool) -> Result<Socket> {
    let proto = if mptcp {
        Some(Protocol::from(IPPROTO_MPTCP))
    } else {
        None
    };
    let s = Socket::new(Domain::IPV4, Type::STREAM, proto).context(if mptcp {
        "an MPTCP socket (is net.mptcp.enabled=1?)"
    } else {
        "a TCP socket"
    })?;
    s.set_nonblocking(true)?;
    s.set_tcp_nodelay(true)?;
    Ok(s)
}

async fn serve(addr: SocketAddr, mptcp: bool) -> Result<()> {
    let s = socket(mptcp)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(128)?;
    let listener = tokio::net::TcpListener::from_std(s.into())?;
    println!("{}", json!({"t": wall_us(), "ev": "ready"}));
    loop {
        let (mut stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let (rd, mut wr) = stream.split();
            let mut rd = tokio::io::BufReader::new(rd);
            let mut req = Vec::new();
            loop {
                let Ok(len) = rd.read_u32().await else { return };
                req.resize(len as usize, 0);
                if rd.read_exact(&mut req).await.is_err() {
                    return;
                }
                let n = req.len().min(64);
                let mut reply = Vec::with_capacity(4 + n);
                reply.extend_from_slice(&(n as u32).to_be_bytes());
                reply.extend_from_slice(&req[..n]);
                if wr.write_all(&reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn client(
    peer: SocketAddr,
    mptcp: bool,
    every: Duration,
    sizes: (usize, usize),
) -> Result<()> {
    let s = socket(mptcp)?;
    match s.connect(&peer.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc_einprogress()) => {}
        Err(e) => return Err(e).context("connect"),
    }
    let stream = tokio::net::TcpStream::from_std(s.into())?;
    stream.writable().await?;
    if let Some(e) = stream.take_error()? {
        return Err(e).context("connect");
    }
    println!("{}", json!({"t": wall_us(), "ev": "peer_up"}));
    let (rd, mut wr) = stream.into_split();
    let sent: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let s2 = sent.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for id in 0u64.. {
            let due = super::node::scheduled_wall_us(tick.tick().await);
            let len = super::node::request_size(sizes, id);
            let mut frame = vec![0u8; 4 + len];
            frame[..4].copy_from_slice(&(len as u32).to_be_bytes());
            frame[4..12].copy_from_slice(&id.to_be_bytes());
            s2.lock().insert(id, due);
            if wr.write_all(&frame).await.is_err() {
                println!(
                    "{}",
                    json!({"t": wall_us(), "ev": "call_error", "id": id, "error": "write failed"})
                );
                return;
            }
        }
    });
    let mut rd = tokio::io::BufReader::new(rd);
    let mut buf = [0u8; 64];
    loop {
        let len = rd.read_u32().await.map(|n| n as usize);
        let ok = match len {
            Ok(n) if (8..=64).contains(&n) => rd.read_exact(&mut buf[..n]).await.is_ok(),
            _ => false,
        };
        if !ok {
            println!("{}", json!({"t": wall_us(), "ev": "connection_lost"}));
            // An application without retry logic stays here.
            std::future::pending::<()>().await;
        }
        let id = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
        let sent = sent.lock().remove(&id).unwrap_or(0);
        println!(
            "{}",
            json!({"t": wall_us(), "ev": "reply", "id": id, "sent": sent, "echo": id})
        );
    }
}

fn libc_einprogress() -> i32 {
    115
}

/// Runs the node until killed.
pub(crate) async fn run(args: &TcpNodeArgs) -> Result<()> {
    if args.server {
        serve(args.local.context("--local")?, args.mptcp).await
    } else {
        client(
            args.peer.context("--peer")?,
            args.mptcp,
            Duration::from_millis(args.calls_ms.max(1)),
            args.call_bytes,
        )
        .await
    }
}
