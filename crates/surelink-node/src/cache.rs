//! `surelink cache node` and `surelink cache proxy`: the memcached-
//! compatible cache cluster from configuration files (the endpoint's
//! settings plus a `[cache]` or `[proxy]` section; see [`crate::config_file`]).
//! Both run until Ctrl-C.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use surelink_cache::backend::BackendError;
use surelink_cache::proxy::ProxyError;
use surelink_cache::text::Limits;
use surelink_cache::{Proxy, ProxyConfig, Shards};

use crate::config_file::{self};
use crate::start::{self, StartError};

/// Worker threads of a cache daemon's runtime unless `[runtime]` says:
/// one event loop, as twemproxy runs (and mcrouter by default). With
/// `WriteBatching::Auto` that also makes the endpoint write what one turn
/// queued for a peer in one system call. On this project's 2-core VM,
/// shared with the load, the cluster's context switches per request fell
/// from 0.78 to 0.30 and its CPU per request by ~40 % against two workers
/// (docs/cache.md); a daemon with cores to itself can raise it.
pub const WORKER_THREADS: usize = 1;

/// Why a cache node did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheNodeError {
    /// Loading, binding, metrics or Ctrl-C.
    #[error(transparent)]
    Start(#[from] StartError),
    /// `[cache] memory_mb = 0`.
    #[error("[cache] memory_mb must be above zero")]
    NoMemory,
    /// `[cache] shards` out of range.
    #[error("[cache] shards = {0}: must be 1 to 256")]
    Shards(usize),
    /// `[cache] backend` is not a usable memcached, or does not answer.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Why a cache proxy did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheProxyError {
    /// Loading, binding, metrics or Ctrl-C.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The file has no `[proxy]` section.
    #[error("{}: no [proxy] section", path.display())]
    NoProxySection {
        /// The configuration file.
        path: PathBuf,
    },
    /// The proxy's listener did not start.
    #[error("starting the proxy")]
    Proxy(#[source] ProxyError),
}

/// Runs a cache node from the configuration file `config` until Ctrl-C:
/// an embedded store of `[cache] memory_mb`, or a local memcached it
/// fronts (`[cache] backend`).
pub async fn node(config: &Path) -> Result<(), CacheNodeError> {
    let mut loaded = config_file::load(config).map_err(StartError::from)?;
    surelink_cache::proxy::tune_endpoint(&mut loaded.config);
    let cache = loaded.cache.clone().unwrap_or_default();
    let memory = cache.memory_mb.unwrap_or(64);
    if memory == 0 {
        return Err(CacheNodeError::NoMemory);
    }
    let limits = Limits {
        max_item: cache.max_item.unwrap_or(Limits::default().max_item),
        ..Limits::default()
    };
    let shards = cache
        .shards
        .unwrap_or(surelink_cache::shards::DEFAULT_SHARDS);
    if !(1..=surelink_cache::shards::MAX_SHARDS).contains(&shards) {
        return Err(CacheNodeError::Shards(shards));
    }
    if cache.backend.is_none() {
        surelink_cache::node::configure(&mut loaded.config, shards);
    }
    let metrics = loaded.metrics;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref())
        .await
        .map_err(StartError::from)?;
    start::metrics(&ep, metrics).await?;
    let what = match &cache.backend {
        None => {
            let store = Arc::new(Shards::new(memory << 20, shards));
            surelink_cache::node::serve_store(&ep, store, limits);
            format!("embedded store of {memory} MiB in {shards} shards")
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
    start::ctrl_c().await?;
    role.stop().await;
    ep.shutdown().await;
    Ok(())
}

/// Runs a cache proxy from the configuration file `config` until Ctrl-C:
/// memcached's text protocol on `[proxy] listen`, keys routed by
/// consistent hashing to the nodes of its ring ([`config_file::Loaded::ring`]).
pub async fn proxy(config: &Path) -> Result<(), CacheProxyError> {
    let mut loaded = config_file::load(config).map_err(StartError::from)?;
    surelink_cache::proxy::tune_endpoint(&mut loaded.config);
    let Some(p) = loaded.proxy.clone() else {
        return Err(CacheProxyError::NoProxySection {
            path: config.to_path_buf(),
        });
    };
    let mut cfg = ProxyConfig::new(p.listen, loaded.ring());
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
    if let Some(m) = p.max_clients_per_addr {
        cfg.max_clients_per_addr = m;
    }
    if let Some(s) = p.idle_timeout_secs {
        cfg.idle_timeout = Duration::from_secs(s);
    }
    if let Some(m) = p.max_reply_bytes {
        cfg.max_reply_bytes = m;
    }
    if let Some(r) = p.replicas {
        cfg.replicas = r;
    }
    cfg.helpers.clone_from(&p.helpers);
    if let Some(ms) = p.helper_sla_ms {
        cfg.activation.sla = Duration::from_millis(ms);
        cfg.activation.release = Duration::from_millis(ms) / 2;
    }
    let metrics = loaded.metrics;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref())
        .await
        .map_err(StartError::from)?;
    let ep = Arc::new(ep);
    start::metrics(&ep, metrics).await?;
    let proxy = Proxy::start(ep.clone(), cfg)
        .await
        .map_err(CacheProxyError::Proxy)?;
    println!(
        "memcached proxy on {} (surelink node {}); Ctrl-C stops",
        proxy.local_addr(),
        ep.node()
    );
    start::ctrl_c().await?;
    proxy.stop();
    role.stop().await;
    Ok(())
}
