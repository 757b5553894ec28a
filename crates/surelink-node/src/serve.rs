//! `surelink serve`: an echo server from a configuration file, printing
//! its endpoint's events until Ctrl-C.

use std::path::Path;

use surelink::{NetEvent, Request};
use tracing::info;

use crate::config_file::{self};
use crate::start::{self, StartError};

/// Why the echo server did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Loading, binding, metrics or Ctrl-C.
    #[error(transparent)]
    Start(#[from] StartError),
}

/// Runs an echo server from the configuration file `config` until
/// Ctrl-C: every request is answered with its own body.
pub async fn serve(config: &Path) -> Result<(), ServeError> {
    let loaded = config_file::load(config).map_err(StartError::from)?;
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref())
        .await
        .map_err(StartError::from)?;
    ep.serve(|r: Request| async move { r.body });
    if let Some(bound) = start::metrics(&ep, loaded.metrics).await? {
        info!(%bound, "Prometheus metrics on http://{bound}/metrics");
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

/// One line per event, as an operator reads them.
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
