//! The hook for an external role backend (`RoleConfig::ownership ==
//! Ownership::Elected`: an election outside surelink, such as etcd's,
//! names the role server).
//!
//! The endpoint's role task still does everything that rides surelink's
//! sessions: every node reports to every candidate over its authenticated
//! sessions (liveness stays in surelink), and a candidate hands the
//! reports it receives to the backend ([`ExternalRole::take_inputs`]). The
//! backend elects, runs the [`RoleServer`](surelink_proto::role::RoleServer)
//! on the leader and carries the rows to the nodes; each node hands the
//! rows it gets to [`ExternalRole::apply`], and the role task applies them
//! through the same gate (newer `(epoch, version)` only) and path policy
//! as the embedded service's. Tables pushed over sessions are refused in
//! this mode: the backend is their only source.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::mpsc;

use surelink_proto::role::{Matrix, RoleConfig, RoleInput, TableView};
use surelink_proto::{NodeId, Time};

use crate::shared::Shared;

/// Inputs waiting for the backend; beyond this the newest are dropped
/// (every node re-reports each refresh).
const INPUTS: usize = 4096;
/// Rows waiting for the role task; the backend waits beyond this.
const TABLES: usize = 64;

/// The role task's end of the link.
pub(crate) struct ExternalLink {
    /// Cloned by the role task (a candidate's), which ends with the
    /// endpoint: the receiver then ends too.
    pub(crate) inputs: Mutex<Option<mpsc::Sender<RoleInput>>>,
    inputs_rx: Mutex<Option<mpsc::Receiver<RoleInput>>>,
    tables: mpsc::Sender<TableView>,
    pub(crate) tables_rx: Mutex<Option<mpsc::Receiver<TableView>>>,
}

impl ExternalLink {
    pub(crate) fn new() -> ExternalLink {
        let (inputs, inputs_rx) = mpsc::channel(INPUTS);
        let (tables, tables_rx) = mpsc::channel(TABLES);
        ExternalLink {
            inputs: Mutex::new(Some(inputs)),
            inputs_rx: Mutex::new(Some(inputs_rx)),
            tables,
            tables_rx: Mutex::new(Some(tables_rx)),
        }
    }
}

/// An external role backend's link to one endpoint (from
/// [`Endpoint::external_role`](crate::Endpoint::external_role)); clones
/// share it.
#[derive(Clone)]
pub struct ExternalRole {
    me: NodeId,
    cfg: RoleConfig,
    tables: mpsc::Sender<TableView>,
    shared: Weak<Shared>,
}

impl std::fmt::Debug for ExternalRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalRole")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// A row the backend could not hand to the endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ExternalRoleError {
    /// The endpoint has shut down.
    #[error("the endpoint has shut down")]
    Closed,
}

impl ExternalRole {
    /// The link of `shared`'s role service, if it has an external backend.
    pub(crate) fn of(shared: &Arc<Shared>) -> Option<ExternalRole> {
        let role = shared.role.as_ref()?;
        let link = role.external.as_ref()?;
        Some(ExternalRole {
            me: shared.config.node,
            cfg: role.cfg.clone(),
            tables: link.tables.clone(),
            shared: Arc::downgrade(shared),
        })
    }

    /// This endpoint's node.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// The role configuration (the cluster's nodes and candidates).
    pub fn config(&self) -> &RoleConfig {
        &self.cfg
    }

    /// Whether this node is a role-server candidate (only candidates
    /// receive inputs).
    pub fn is_candidate(&self) -> bool {
        self.cfg.candidate_index(self.me).is_some()
    }

    /// What this node, as a candidate, receives for the role server: its
    /// own report and its peers' (each from its authenticated sender), and
    /// node restarts; `None` once taken (there is one receiver per
    /// endpoint) or after the endpoint shut down. The receiver ends when
    /// the endpoint shuts down. A non-candidate's never yields anything.
    pub fn take_inputs(&self) -> Option<mpsc::Receiver<RoleInput>> {
        let shared = self.shared.upgrade()?;
        let link = shared.role.as_ref()?.external.as_ref()?;
        let rx = link.inputs_rx.lock().take();
        rx
    }

    /// Hands a row of a table to the endpoint. It is applied only if its
    /// `(epoch, version)` is newer than the row held, its writer is a
    /// candidate and it is this node's row (the backend vouches that the
    /// writer held the election of that epoch). Waits while the role task
    /// is behind.
    pub async fn apply(&self, view: TableView) -> Result<(), ExternalRoleError> {
        self.tables
            .send(view)
            .await
            .map_err(|_| ExternalRoleError::Closed)
    }

    /// Tells `surelink status` and the metrics whether this node serves as
    /// role server: `Some((epoch, matrix, now))` with `now` on the matrix's
    /// clock, or `None` (not, or no longer).
    pub fn set_serving(&self, serving: Option<(u64, &Matrix, Time)>) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let Some(role) = shared.role.as_ref() else {
            return;
        };
        let mut st = role.status.lock();
        st.serving = serving.map(|(e, _, _)| e);
        st.matrix = serving.map_or_else(Vec::new, |(_, m, now)| super::matrix_rows(m, now));
    }

    /// Whether the endpoint has shut down.
    pub fn is_closed(&self) -> bool {
        self.tables.is_closed()
    }
}
