//! `surelink cache node` and `surelink cache proxy`: the memcached-
//! compatible cache cluster from TOML configurations (the endpoint's
//! settings plus a `[cache]` or `[proxy]` section; see `config_file`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use surelink::proto::NodeId;
use surelink::Endpoint;
use surelink_cache::text::Limits;
use surelink_cache::{Proxy, ProxyConfig, Store};

use crate::config_file;

#[derive(Subcommand, Debug)]
pub(crate) enum CacheCommand {
    /// A cache node: holds items in memory and serves proxies over surelink.
    Node(ConfigArg),
    /// A proxy: memcached's text protocol on a local port, keys routed to
    /// the nodes by consistent hashing.
    Proxy(ConfigArg),
}

#[derive(Args, Debug)]
pub(crate) struct ConfigArg {
    /// TOML configuration.
    #[arg(long)]
    pub(crate) config: PathBuf,
}

/// Worker threads of a cache daemon's runtime unless `[runtime]` says:
/// one event loop, as twemproxy runs (and mcrouter by default). With
/// `WriteBatching::Auto` that also makes the endpoint write what one turn
/// queued for a peer in one system call. On this project's 2-core VM,
/// shared with the load, the cluster's context switches per request fell
/// from 0.78 to 0.30 and its CPU per request by ~40 % against two workers
/// (docs/cache.md); a daemon with cores to itself can raise it.
pub(crate) const WORKER_THREADS: usize = 1;

impl CacheCommand {
    /// The configuration file.
    pub(crate) fn config(&self) -> &std::path::Path {
        match self {
            CacheCommand::Node(a) | CacheCommand::Proxy(a) => &a.config,
        }
    }
}

pub(crate) async fn main(cmd: &CacheCommand) -> Result<()> {
    match cmd {
        CacheCommand::Node(a) => node(a).await,
        CacheCommand::Proxy(a) => proxy(a).await,
    }
}

async fn node(a: &ConfigArg) -> Result<()> {
    let mut loaded = config_file::load(&a.config)?;
    surelink_cache::proxy::tune_endpoint(&mut loaded.config);
    let cache = loaded.cache.clone().unwrap_or_default();
    let memory = cache.memory_mb.unwrap_or(64);
    if memory == 0 {
        bail!("[cache] memory_mb must be above zero");
    }
    let limits = Limits {
        max_item: cache.max_item.unwrap_or(Limits::default().max_item),
        ..Limits::default()
    };
    let metrics = loaded.metrics;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref()).await?;
    serve_metrics(&ep, metrics).await?;
    let what = match &cache.backend {
        None => {
            let store = Arc::new(Store::new(memory << 20));
            surelink_cache::node::serve_store(&ep, store, limits);
            format!("embedded store of {memory} MiB")
        }
        Some(url) => {
            let addr = surelink_cache::backend::parse_url(url)?;
            let n = cache.backend_connections.unwrap_or(1);
            let h = surelink_cache::backend::MemcachedHandler::connect(addr, n, limits).await?;
            surelink_cache::backend::serve_backend(&ep, h);
            format!("fronting memcached at {addr} ({n} connection(s))")
        }
    };
    println!(
        "cache node {} (epoch {}) on {:?}: {what}; Ctrl-C stops",
        ep.node(),
        ep.epoch(),
        ep.local_addrs()
    );
    tokio::signal::ctrl_c().await?;
    role.stop().await;
    ep.shutdown().await;
    Ok(())
}

async fn proxy(a: &ConfigArg) -> Result<()> {
    let mut loaded = config_file::load(&a.config)?;
    surelink_cache::proxy::tune_endpoint(&mut loaded.config);
    let Some(p) = loaded.proxy.clone() else {
        bail!("{}: no [proxy] section", a.config.display());
    };
    let nodes: Vec<NodeId> = if p.nodes.is_empty() {
        loaded.config.peers.iter().map(|x| x.node).collect()
    } else {
        p.nodes.iter().map(|&n| NodeId(n)).collect()
    };
    let mut cfg = ProxyConfig::new(p.listen, nodes);
    if let Some(m) = p.max_item {
        cfg.limits.max_item = m;
    }
    if let Some(m) = p.max_clients {
        cfg.max_clients = m;
    }
    if let Some(m) = p.max_pipeline {
        cfg.max_pipeline = m;
    }
    if let Some(ms) = p.call_timeout_ms {
        cfg.call_timeout = Duration::from_millis(ms);
    }
    let metrics = loaded.metrics;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref()).await?;
    let ep = Arc::new(ep);
    serve_metrics(&ep, metrics).await?;
    let proxy = Proxy::start(ep.clone(), cfg)
        .await
        .context("starting the proxy")?;
    println!(
        "memcached proxy on {} (surelink node {}); Ctrl-C stops",
        proxy.local_addr(),
        ep.node()
    );
    tokio::signal::ctrl_c().await?;
    proxy.stop();
    role.stop().await;
    Ok(())
}

/// Serves `/metrics` (and `/role`, for `surelink status`) when the file
/// names a `metrics` address.
async fn serve_metrics(ep: &Endpoint, addr: Option<std::net::SocketAddr>) -> Result<()> {
    if let Some(m) = addr {
        let bound = ep
            .serve_metrics(m)
            .await
            .with_context(|| format!("metrics listener on {m}"))?;
        println!("metrics: http://{bound}/metrics");
    }
    Ok(())
}
