//! `surelink stats`: reads a running endpoint's counters from its metrics
//! port and prints them (or the raw Prometheus text).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the metrics port may take to answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why no counters were printed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatsError {
    /// No complete answer in time.
    #[error("timed out reading metrics")]
    Timeout,
    /// No connection.
    #[error("connecting to {addr}")]
    Connect {
        /// The metrics address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The request or the answer broke off.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The answer is not HTTP.
    #[error("not an HTTP response")]
    NotHttp,
    /// An HTTP status other than 200.
    #[error("metrics endpoint answered: {0}")]
    Status(String),
}

/// Prints the counters of the endpoint whose metrics port is `metrics`:
/// one `name value` line each, or with `raw` the Prometheus text as is.
pub async fn stats(metrics: SocketAddr, raw: bool) -> Result<(), StatsError> {
    let text = tokio::time::timeout(TIMEOUT, fetch(metrics))
        .await
        .map_err(|_| StatsError::Timeout)??;
    if raw {
        print!("{text}");
        return Ok(());
    }
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        if let Some((name, value)) = line.rsplit_once(' ') {
            let name = name.trim_start_matches("surelink_");
            println!("{name:<60} {value:>14}");
        }
    }
    Ok(())
}

async fn fetch(addr: SocketAddr) -> Result<String, StatsError> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| StatsError::Connect { addr, source })?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: surelink\r\nConnection: close\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(StatsError::NotHttp);
    };
    if !head.starts_with("HTTP/1.1 200") {
        return Err(StatsError::Status(
            head.lines().next().unwrap_or("").to_string(),
        ));
    }
    Ok(body.to_string())
}
