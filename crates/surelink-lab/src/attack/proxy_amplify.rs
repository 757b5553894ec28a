//! `attack proxy-amplify`: a small `get` that names large values, left
//! unread, against the cache proxy (issue 25, item 2). Two rounds: one
//! 512 KiB key named 400 times in one 1.2 KB line, then 800 distinct
//! 1000 KiB keys; each held for `--hold-secs` by a client that reads
//! nothing, then closed. Meanwhile a legitimate client gets a small key
//! every 20 ms. Reports the proxy's RSS before, during (peak) and after
//! each round, and the legitimate gets answered and their p99.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args as ClapArgs;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::proxy_cluster::{ask, connect, write_json, Cluster, Probe};
use super::{rss_kib, surelink_bin};

#[derive(ClapArgs)]
pub(crate) struct Args {
    /// The `surelink` binary to attack (default: the one next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// Seconds each unread multi-get is held open.
    #[arg(long, default_value_t = 10)]
    hold_secs: u64,
    /// Item memory of each cache node, MiB (the 800 values must fit).
    #[arg(long, default_value_t = 1024)]
    node_memory_mb: u64,
    /// Lines appended to the proxy's `[proxy]` section.
    #[arg(long)]
    proxy_toml: Vec<String>,
    /// Where the JSON result goes.
    #[arg(long, default_value = "attack-proxy-amplify.json")]
    out: PathBuf,
}

pub(crate) async fn run(a: &Args) -> Result<()> {
    let bin = surelink_bin(a.surelink_bin.as_deref())?;
    println!("proxy-amplify against {}", bin.display());
    let c = Cluster::start(&bin, a.node_memory_mb, &a.proxy_toml).await?;
    let pid = c.proxy_pid();
    let mut s = connect(c.addr).await?;
    let store = |key: String, len: usize| {
        let mut r = format!("set {key} 0 0 {len}\r\n").into_bytes();
        r.extend(std::iter::repeat_n(b'v', len));
        r.extend_from_slice(b"\r\n");
        r
    };
    println!("storing one 512 KiB value and 800 of 1000 KiB through the proxy");
    let mut requests = vec![store("k1".into(), 512 << 10)];
    requests.extend((0..800).map(|i| store(format!("b{i}"), 1000 << 10)));
    for r in requests {
        if ask(&mut s, &r, b"\r\n", Duration::from_secs(10))
            .await
            .as_deref()
            != Some(b"STORED\r\n")
        {
            bail!("a value was not stored");
        }
    }
    drop(s);
    let probe = Probe::start(c.addr).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rounds = [
        (
            "one 512 KiB key named 400 times",
            format!("get {}\r\n", vec!["k1"; 400].join(" ")),
        ),
        (
            "800 distinct 1000 KiB keys",
            format!(
                "get {}\r\n",
                (0..800)
                    .map(|i| format!("b{i}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ),
    ];
    let mut results = Vec::new();
    for (name, line) in rounds {
        let before = rss_kib(pid);
        let start = Instant::now();
        println!(
            "round: {name} ({} byte request), unread for {} s",
            line.len(),
            a.hold_secs
        );
        // A small receive buffer: the kernel holds little of the answer.
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.set_recv_buffer_size(64 << 10)?;
        let mut hog = sock.connect(c.addr).await?;
        hog.write_all(line.as_bytes()).await?;
        let mut peak = before;
        let until = start + Duration::from_secs(a.hold_secs);
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(200)).await;
            peak = peak.max(rss_kib(pid));
            c.check()?;
        }
        let during = probe.since(start);
        drop(hog);
        let closed = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = rss_kib(pid);
        let settled = probe.since(closed);
        println!(
            "  proxy RSS {} MiB before, {} MiB peak, {} MiB 5 s after close; legitimate gets during: {}/{} answered, p99 {:.2} ms",
            before / 1024,
            peak / 1024,
            after / 1024,
            during.answered,
            during.total,
            during.p99_ms
        );
        results.push(json!({
            "round": name,
            "request_bytes": line.len(),
            "rss_kib": {"before": before, "peak_during": peak, "after": after},
            "legit_during": during,
            "legit_after": settled,
        }));
    }
    write_json(
        &a.out,
        &json!({
            "attack": "proxy-amplify",
            "surelink_bin": bin.display().to_string(),
            "hold_secs": a.hold_secs,
            "proxy_toml": a.proxy_toml,
            "rounds": results,
        }),
    )
}
