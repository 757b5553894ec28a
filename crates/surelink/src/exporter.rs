//! A minimal HTTP endpoint for Prometheus: `GET /metrics` answers the
//! counters in the text exposition format (with the role service's table
//! epoch, version and age when it runs); `GET /role` the role service's
//! view in words (`surelink status`). One request per connection; no
//! keep-alive, no TLS: bind it to a management address.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use std::sync::Arc;

use crate::shared::Shared;

/// Most bytes of a request read before answering.
const MAX_REQUEST: usize = 8 * 1024;

pub(crate) async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, from)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &shared).await {
                debug!(%from, error = %e, "metrics request failed");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let mut req = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < MAX_REQUEST {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            req.extend_from_slice(&chunk[..n]);
        }
        Ok::<(), io::Error>(())
    })
    .await;
    if read.is_err() {
        return Ok(());
    }
    read.unwrap_or(Ok(()))?;
    let line = req.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let role = shared.role.as_ref().map(|r| r.status(shared.clock.now()));
    let (status, ctype, body) =
        if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
            let mut body = shared.snapshot().to_prometheus();
            if let Some(r) = &role {
                body.push_str(&r.to_prometheus());
            }
            ("200 OK", "text/plain; version=0.0.4", body)
        } else if method == "GET" && path == "/role" {
            match &role {
                Some(r) => ("200 OK", "text/plain", r.render()),
                None => (
                    "404 Not Found",
                    "text/plain",
                    "no role service configured on this node\n".to_string(),
                ),
            }
        } else {
            (
                "404 Not Found",
                "text/plain",
                "try GET /metrics or GET /role\n".to_string(),
            )
        };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
