//! `surelink stats`: reads a running endpoint's counters from its metrics
//! port and prints them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Args, Debug)]
pub(crate) struct StatsArgs {
    /// The endpoint's metrics address (`metrics = ...` in its config).
    #[arg(long)]
    metrics: SocketAddr,
    /// Print the raw Prometheus text.
    #[arg(long)]
    raw: bool,
}

pub(crate) async fn run(args: &StatsArgs) -> Result<()> {
    let text = tokio::time::timeout(Duration::from_secs(5), fetch(args.metrics))
        .await
        .context("timed out reading metrics")??;
    if args.raw {
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

async fn fetch(addr: SocketAddr) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: surelink\r\nConnection: close\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("not an HTTP response")
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "metrics endpoint answered: {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_string())
}
