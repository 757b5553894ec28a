//! What every daemon does to start and to stop, and how that fails: load
//! its file, bind its endpoint (with the role backend its cluster file
//! selects), serve its metrics, wait for Ctrl-C. Each runner's own error
//! enum wraps [`StartError`] beside the failures only it can meet.

use std::net::SocketAddr;

use surelink::Endpoint;

use crate::config_file::LoadError;
use crate::role_backend::RoleBackendError;

/// Why a daemon did not start, or could not wait for its stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration file could not be loaded.
    #[error(transparent)]
    Config(#[from] LoadError),
    /// The endpoint (or its role backend) did not start.
    #[error(transparent)]
    Bind(#[from] RoleBackendError),
    /// The metrics port could not be opened.
    #[error("metrics listener on {addr}")]
    Metrics {
        /// The configured address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Ctrl-C could not be waited for.
    #[error("waiting for Ctrl-C")]
    Signal(#[source] std::io::Error),
}

/// Serves `/metrics` (and `/role`, for `surelink status`) when the file
/// names a `metrics` address; prints where. Returns the bound address.
pub(crate) async fn metrics(
    ep: &Endpoint,
    addr: Option<SocketAddr>,
) -> Result<Option<SocketAddr>, StartError> {
    let Some(addr) = addr else { return Ok(None) };
    let bound = ep
        .serve_metrics(addr)
        .await
        .map_err(|source| StartError::Metrics { addr, source })?;
    println!("metrics: http://{bound}/metrics, role: http://{bound}/role");
    Ok(Some(bound))
}

/// Waits for Ctrl-C.
pub(crate) async fn ctrl_c() -> Result<(), StartError> {
    tokio::signal::ctrl_c().await.map_err(StartError::Signal)
}

/// Opens the `[[relays]]` paths (through helpers); they live as long as
/// the handles.
pub fn relays(
    ep: &surelink::Endpoint,
    relays: &[crate::config_file::RelaySection],
) -> Vec<surelink::RelayPath> {
    relays
        .iter()
        .map(|r| ep.relay_via(surelink::proto::NodeId(r.server), r.helper, r.network))
        .collect()
}
