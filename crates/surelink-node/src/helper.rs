//! `surelink helper`: a PostMan helper from a configuration file. It
//! relays for the servers among its peers: clients connect to its
//! `[helper] listen` address, and their connections travel, many per
//! message, over its own sessions to those servers (which list it in
//! their `helpers`). Prints its counters every few seconds until Ctrl-C.

use std::path::{Path, PathBuf};
use std::time::Duration;

use surelink::proto::helper::{AdaptiveConfig, BatchPolicy, BatcherConfig};
use surelink::Helper;

use crate::config_file::{self, HelperSection};
use crate::start::{self, StartError};

/// Why the helper did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HelperRunError {
    /// Loading, binding, metrics or Ctrl-C.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The configuration has no `[helper]` section.
    #[error("{}: `surelink helper` needs a [helper] section (listen = \"host:port\")", path.display())]
    NoHelperSection {
        /// The configuration file.
        path: PathBuf,
    },
    /// `[helper] policy` is not one this version knows.
    #[error("[helper] policy = {0:?}: expected \"self_clocking\" or \"adaptive\"")]
    Policy(String),
    /// The helper could not start (its listener, or its batching).
    #[error(transparent)]
    Helper(#[from] surelink::HelperError),
}

/// The batching a `[helper]` section asks for.
pub fn batching(h: &HelperSection) -> Result<BatcherConfig, HelperRunError> {
    let policy = match h.policy.as_deref() {
        None | Some("self_clocking") => BatchPolicy::SelfClocking {
            max_wait: Duration::from_micros(h.max_wait_us.unwrap_or(1000)),
        },
        Some("adaptive") => BatchPolicy::Adaptive(AdaptiveConfig::default()),
        Some(other) => return Err(HelperRunError::Policy(other.to_string())),
    };
    let mut b = BatcherConfig {
        policy,
        ..BatcherConfig::default()
    };
    if let Some(f) = h.max_frame {
        b.max_frame = f;
    }
    Ok(b)
}

/// Runs a helper from the configuration file `config` until Ctrl-C.
pub async fn helper(config: &Path) -> Result<(), HelperRunError> {
    let loaded = config_file::load(config).map_err(StartError::from)?;
    let Some(section) = loaded.helper.clone() else {
        return Err(HelperRunError::NoHelperSection {
            path: config.to_path_buf(),
        });
    };
    let batching = batching(&section)?;
    let channel = loaded.config.relay_channel;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref())
        .await
        .map_err(StartError::from)?;
    start::metrics(&ep, loaded.metrics).await?;
    let h = Helper::start(ep.clone(), section.listen, batching, channel).await?;
    if let Some(a) = section.advertise {
        h.advertise(a);
    }
    println!(
        "helper node {} relaying on {} for its peers; Ctrl-C stops",
        ep.node(),
        h.local_addr()
    );
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                let s = h.stats();
                println!(
                    "clients {} (accepted {}, refused {}); to servers {} messages, {} records, {} bytes; from servers {} messages; load queries {}",
                    s.clients, s.accepted, s.refused, s.messages_out, s.records_out, s.bytes_out, s.messages_in, s.load_queries
                );
            }
        }
    }
    drop(h);
    role.stop().await;
    ep.shutdown().await;
    Ok(())
}
