//! `attack proxy-slots`: the cache proxy's connection hygiene (issue 25,
//! item 6). Three phases, a legitimate client getting a small key every
//! 20 ms from 127.0.0.1 throughout:
//!
//! 1. slots: one source address (`--from`) opens connections, each
//!    checked with `version`, until one is refused (or `--max-conns`);
//!    held for 5 s, and a fresh legitimate connection tried meanwhile;
//! 2. idle (`--idle-wait-secs` > 0): the held connections stay silent
//!    that long; how many the proxy closed;
//! 3. trickle: a `get` line of `--trickle-bytes` sent 64 bytes per write;
//!    the proxy's CPU time for it and the legitimate gets' p99, then the
//!    same line against a memcached (if installed) for its CPU time.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args as ClapArgs;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::proxy_cluster::{ask, connect, write_json, Cluster, Probe};
use super::{cpu_seconds, rss_kib, surelink_bin};

#[derive(ClapArgs)]
pub(crate) struct Args {
    /// The `surelink` binary to attack (default: the one next to this one).
    #[arg(long)]
    surelink_bin: Option<PathBuf>,
    /// The attacker's source address (loopback: any 127.x.y.z).
    #[arg(long, default_value = "127.0.3.1")]
    from: IpAddr,
    /// Connections to try at most.
    #[arg(long, default_value_t = 12_000)]
    max_conns: usize,
    /// Seconds the held connections stay idle before counting how many
    /// the proxy closed (0: skip the phase).
    #[arg(long, default_value_t = 0)]
    idle_wait_secs: u64,
    /// Length of the trickled `get` line.
    #[arg(long, default_value_t = 1_000_000)]
    trickle_bytes: usize,
    /// Lines appended to the proxy's `[proxy]` section.
    #[arg(long)]
    proxy_toml: Vec<String>,
    /// Where the JSON result goes.
    #[arg(long, default_value = "attack-proxy-slots.json")]
    out: PathBuf,
}

/// Opens a connection from `from` and checks it is served.
async fn open(addr: SocketAddr, from: IpAddr) -> Option<TcpStream> {
    let sock = match from {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .ok()?;
    sock.bind(SocketAddr::new(from, 0)).ok()?;
    let mut s = tokio::time::timeout(Duration::from_secs(2), sock.connect(addr))
        .await
        .ok()?
        .ok()?;
    ask(&mut s, b"version\r\n", b"\r\n", Duration::from_secs(2))
        .await
        .filter(|a| a.starts_with(b"VERSION"))?;
    Some(s)
}

/// Whether the peer has closed `s` (without waiting).
fn is_closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 16];
    match s.try_read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// The trickled line: `get` and keys up to `len` bytes, then `\r\n`.
fn trickle_line(len: usize) -> Vec<u8> {
    let mut line = b"get".to_vec();
    let mut i = 0;
    while line.len() + 10 < len {
        line.extend_from_slice(format!(" t{i}").as_bytes());
        i += 1;
    }
    line.extend_from_slice(b"\r\n");
    line
}

/// Sends `line` 64 bytes per write and waits for `END`; the time taken.
async fn trickle(addr: SocketAddr, line: &[u8]) -> Result<Duration> {
    let t = Instant::now();
    let mut s = connect(addr).await?;
    for piece in line.chunks(64) {
        s.write_all(piece).await?;
    }
    let mut got = Vec::new();
    let mut b = vec![0u8; 1 << 16];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !got.ends_with(b"END\r\n") {
        let n = tokio::time::timeout_at(deadline, s.read(&mut b))
            .await
            .context("no END within 120 s")??;
        if n == 0 {
            anyhow::bail!("closed before END ({} bytes)", got.len());
        }
        got.extend_from_slice(&b[..n]);
    }
    Ok(t.elapsed())
}

pub(crate) async fn run(a: &Args) -> Result<()> {
    let bin = surelink_bin(a.surelink_bin.as_deref())?;
    println!("proxy-slots against {}", bin.display());
    let fds = surelink_sys::raise_fd_limit_to(3 * a.max_conns as u64 + 1000).unwrap_or(1024);
    let c = Cluster::start(&bin, 64, &a.proxy_toml).await?;
    let pid = c.proxy_pid();
    let probe = Probe::start(c.addr).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 1. Slots.
    let rss_before = rss_kib(pid);
    let t = Instant::now();
    println!(
        "slots: connections from {} until one is refused (open-file limit {fds})",
        a.from
    );
    let mut held = Vec::new();
    let mut refused = false;
    while held.len() < a.max_conns {
        match open(c.addr, a.from).await {
            Some(s) => held.push(s),
            None => {
                refused = true;
                break;
            }
        }
        if held.len() % 1000 == 0 {
            println!("  {} held", held.len());
        }
    }
    let held_n = held.len();
    let fresh = open(c.addr, "127.0.0.1".parse()?).await.is_some();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_held = rss_kib(pid);
    let seen_slots = probe.since(t);
    println!(
        "  {} held from one address, then {}; a fresh legitimate connection {}; legitimate gets {}/{} answered, p99 {:.2} ms; proxy RSS {} -> {} MiB",
        held.len(),
        if refused { "refused" } else { "stopped at --max-conns" },
        if fresh { "served" } else { "REFUSED" },
        seen_slots.answered,
        seen_slots.total,
        seen_slots.p99_ms,
        rss_before / 1024,
        rss_held / 1024
    );

    // 2. Idle.
    let idle = if a.idle_wait_secs > 0 {
        println!(
            "idle: {} held connections silent for {} s",
            held.len(),
            a.idle_wait_secs
        );
        tokio::time::sleep(Duration::from_secs(a.idle_wait_secs)).await;
        let closed = held.iter().filter(|s| is_closed(s)).count();
        println!("  {closed} of {} closed by the proxy", held.len());
        Some(json!({"wait_secs": a.idle_wait_secs, "held": held.len(), "closed_by_proxy": closed}))
    } else {
        None
    };
    drop(held);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_kib(pid);

    // 3. Trickle.
    let line = trickle_line(a.trickle_bytes);
    println!(
        "trickle: a {} byte get line, 64 bytes per write",
        line.len()
    );
    let cpu0 = cpu_seconds(pid);
    let t = Instant::now();
    let took = trickle(c.addr, &line).await?;
    let proxy_cpu = cpu_seconds(pid) - cpu0;
    let seen_trickle = probe.since(t);
    c.check()?;
    println!(
        "  proxy: {:.2} s CPU, answered in {:.2} s; legitimate gets {}/{} answered, p99 {:.2} ms",
        proxy_cpu,
        took.as_secs_f64(),
        seen_trickle.answered,
        seen_trickle.total,
        seen_trickle.p99_ms
    );
    let memcached = match surelink_lab::host::find_program("memcached", &[]) {
        Some(_) => {
            let port = surelink_lab::host::free_port("127.0.0.1".parse()?)?;
            let child = surelink_lab::host::Memcached::new("127.0.0.1".parse()?, port)
                .command("memcached")?
                .die_with_parent()
                .spawn()?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let mut up = false;
            for _ in 0..100 {
                if connect(addr).await.is_ok() {
                    up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if up {
                let cpu0 = cpu_seconds(child.pid());
                let took = trickle(addr, &line).await?;
                let cpu = cpu_seconds(child.pid()) - cpu0;
                println!(
                    "  memcached: {cpu:.2} s CPU, answered in {:.2} s",
                    took.as_secs_f64()
                );
                Some(json!({"cpu_s": cpu, "answered_in_s": took.as_secs_f64()}))
            } else {
                None
            }
        }
        None => {
            println!("  memcached not installed: no reference");
            None
        }
    };
    write_json(
        &a.out,
        &json!({
            "attack": "proxy-slots",
            "surelink_bin": bin.display().to_string(),
            "proxy_toml": a.proxy_toml,
            "slots": {
                "from": a.from.to_string(),
                "held": held_n,
                "refused_after": refused,
                "fresh_legit_connection_served": fresh,
                "legit": seen_slots,
                "rss_kib": {"before": rss_before, "held": rss_held, "after": rss_after},
            },
            "idle": idle,
            "trickle": {
                "line_bytes": line.len(),
                "proxy_cpu_s": proxy_cpu,
                "proxy_answered_in_s": took.as_secs_f64(),
                "legit": seen_trickle,
                "memcached": memcached,
            },
        }),
    )
}
