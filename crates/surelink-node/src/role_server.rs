//! `surelink role-server`: a node whose only job is the role service
//! (hr-net's role server), a candidate from its cluster file. It prints
//! when it starts or stops serving and which table it holds, until Ctrl-C.

use std::path::{Path, PathBuf};
use std::time::Duration;

use surelink::proto::NodeId;
use surelink::NetEvent;

use crate::config_file::{self};
use crate::start::{self, StartError};

/// Why the role server did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoleServerError {
    /// Loading, binding, metrics or Ctrl-C.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The configuration names no cluster file.
    #[error("{}: `surelink role-server` needs `cluster_file = \"…\"` (the nodes and the [role] candidates)", path.display())]
    NoClusterFile {
        /// The configuration file.
        path: PathBuf,
    },
    /// This node is not a candidate in its cluster file.
    #[error(
        "node {node} is not one of the role-server candidates {candidates:?} in the cluster file"
    )]
    NotCandidate {
        /// This node.
        node: NodeId,
        /// The candidates, in order.
        candidates: Vec<NodeId>,
    },
}

/// Runs a role-server candidate from the configuration file `config`
/// until Ctrl-C.
pub async fn role_server(config: &Path) -> Result<(), RoleServerError> {
    let loaded = config_file::load(config).map_err(StartError::from)?;
    let Some(cluster) = &loaded.cluster else {
        return Err(RoleServerError::NoClusterFile {
            path: config.to_path_buf(),
        });
    };
    let me = loaded.config.node;
    if cluster.role.candidate_index(me).is_none() {
        return Err(RoleServerError::NotCandidate {
            node: me,
            candidates: cluster.role.candidates.clone(),
        });
    }
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref())
        .await
        .map_err(StartError::from)?;
    start::metrics(&ep, loaded.metrics).await?;
    println!(
        "role-server candidate {} (epoch {}) on {:?}; candidates in order {:?}; Ctrl-C stops",
        ep.node(),
        ep.epoch(),
        ep.local_addrs(),
        cluster.role.candidates
    );
    let mut events = ep.events();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut last = (None, (0, 0));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            e = events.recv() => match e {
                Ok(NetEvent::PeerDead { peer }) => println!("peer {peer} dead"),
                Ok(NetEvent::PeerAlive { peer }) => println!("peer {peer} alive again"),
                _ => {}
            },
            _ = tick.tick() => {
                let Some(st) = ep.role_status() else { continue };
                let held = st.table.as_ref().map_or((0, 0), |t| (t.epoch, t.version));
                if (st.serving, held) != last {
                    match st.serving {
                        Some(e) => println!("serving role epoch {e}; table ({}, {})", held.0, held.1),
                        None => println!("standing by; holding table ({}, {})", held.0, held.1),
                    }
                    last = (st.serving, held);
                }
            }
        }
    }
    role.stop().await;
    ep.shutdown().await;
    Ok(())
}
