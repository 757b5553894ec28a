//! `surelink serve` (an echo server) and `surelink call` (a ping client).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use surelink::proto::NodeId;
use surelink::{NetEvent, Request};
use tracing::info;

use crate::config_file;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// TOML configuration (see the `config_file` module docs or README).
    #[arg(long)]
    pub(crate) config: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct CallArgs {
    /// TOML configuration of this (client) endpoint.
    #[arg(long)]
    pub(crate) config: PathBuf,
    /// The node to call.
    #[arg(long)]
    peer: u64,
    /// Calls to make.
    #[arg(long, default_value_t = 10)]
    count: u64,
    /// Request size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Pause between calls, milliseconds.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Per-call deadline, milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

pub(crate) async fn serve(args: &ServeArgs) -> Result<()> {
    let loaded = config_file::load(&args.config)?;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref()).await?;
    ep.serve(|r: Request| async move { r.body });
    if let Some(m) = loaded.metrics {
        let bound = ep
            .serve_metrics(m)
            .await
            .with_context(|| format!("metrics listener on {m}"))?;
        info!(%bound, "Prometheus metrics on http://{bound}/metrics");
        println!("metrics: http://{bound}/metrics");
    }
    println!(
        "serving echo as node {} (epoch {}) on {:?}; Ctrl-C stops",
        ep.node(),
        ep.epoch(),
        ep.local_addrs()
    );
    let mut events = ep.events();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            e = events.recv() => if let Ok(e) = e { print_event(&e) },
        }
    }
    role.stop().await;
    ep.shutdown().await;
    Ok(())
}

fn print_event(e: &NetEvent) {
    match e {
        NetEvent::PathUp {
            peer,
            path,
            network,
        } => println!("path {path} to {peer} up on network {network}"),
        NetEvent::PathDown {
            peer,
            path,
            network,
            resent,
            reason,
        } => {
            println!(
                "path {path} to {peer:?} down on network {network} ({resent} re-sent): {reason}"
            )
        }
        NetEvent::PeerUp { peer, epoch } => println!("peer {peer} up (epoch {epoch})"),
        NetEvent::PeerUnreachable { peer } => println!("peer {peer} unreachable"),
        NetEvent::SessionEnded {
            peer,
            reason,
            abandoned,
        } => {
            println!("session with {peer} ended: {reason:?} ({abandoned} messages abandoned)")
        }
        NetEvent::PathSilent {
            peer,
            network,
            silent_for_us,
        } => println!(
            "path to {peer} on network {network} silent for {} ms: failed over",
            silent_for_us / 1000
        ),
        NetEvent::PathHeard { peer, network } => {
            println!("path to {peer} on network {network} heard again")
        }
        NetEvent::PeerDead { peer } => println!("peer {peer} dead: every path silent"),
        NetEvent::PeerAlive { peer } => println!("peer {peer} heard again"),
        NetEvent::Fenced {
            old_epoch,
            new_epoch,
            calls_failed,
            abandoned,
        } => println!(
            "FENCED: a heartbeat missed its deadline; epoch {old_epoch} -> {new_epoch} \
             ({calls_failed} calls failed, {abandoned} messages abandoned)"
        ),
        other => println!("{other:?}"),
    }
}

pub(crate) async fn call(args: &CallArgs) -> Result<()> {
    if args.count == 0 {
        bail!("--count must be positive");
    }
    let loaded = config_file::load(&args.config)?;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref()).await?;
    let peer = NodeId(args.peer);
    let body = Bytes::from(vec![0x5a; args.size]);
    let mut rtts = Vec::new();
    let mut errors = 0;
    for i in 0..args.count {
        let t = Instant::now();
        match ep
            .call(
                peer,
                0,
                body.clone(),
                Duration::from_millis(args.timeout_ms),
            )
            .await
        {
            Ok(reply) if reply == body => {
                let rtt = t.elapsed();
                println!(
                    "reply {i}: {} bytes in {:.1} µs",
                    reply.len(),
                    rtt.as_secs_f64() * 1e6
                );
                rtts.push(rtt);
            }
            Ok(reply) => {
                errors += 1;
                println!("reply {i}: unexpected body of {} bytes", reply.len());
            }
            Err(e) => {
                errors += 1;
                println!("call {i}: {e}");
            }
        }
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    }
    rtts.sort();
    if let (Some(min), Some(max)) = (rtts.first(), rtts.last()) {
        let p50 = rtts[rtts.len() / 2];
        println!(
            "{} replies, {errors} errors; rtt min {:.1} µs, p50 {:.1} µs, max {:.1} µs",
            rtts.len(),
            min.as_secs_f64() * 1e6,
            p50.as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e6
        );
    }
    role.stop().await;
    ep.shutdown().await;
    if errors > 0 {
        bail!("{errors} of {} calls failed", args.count);
    }
    Ok(())
}
