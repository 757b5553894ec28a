//! A node's side: watches its table row in etcd and applies newer ones.

use std::collections::VecDeque;
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions, WatchStream};
use surelink_proto::role::{
    decode, Applied, RoleConfig, RoleDecodeError, RoleMessage, TableRejected, TableView,
};
use surelink_proto::NodeId;
use thiserror::Error;
use tokio::time::timeout;

use crate::candidate::{connect_client, ConnectError};
use crate::config::EtcdRoleConfig;
use crate::gate::ElectedGate;

/// What the watcher saw of its row.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchEvent {
    /// A newer row, now held.
    Applied {
        /// The row.
        view: TableView,
        /// What applying it did.
        applied: Applied,
        /// etcd's revision of the write.
        revision: i64,
    },
    /// A value that is not applied (kept out, nothing changes).
    Skipped {
        /// etcd's revision of the write.
        revision: i64,
        /// Why.
        reason: BadRow,
    },
}

/// Why a value of the row's key was not applied.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BadRow {
    /// The bytes are no role message.
    #[error("undecodable row: {0}")]
    Decode(#[from] RoleDecodeError),
    /// A role message, but not a table.
    #[error("the value is a role message but no table row")]
    NotATable,
    /// A table row the gate refused: not newer, another node's, or from a
    /// node that is no candidate.
    #[error(transparent)]
    Rejected(#[from] TableRejected),
    /// The key was deleted (the role service never deletes rows).
    #[error("the row was deleted")]
    Deleted,
}

/// The watch broke; the next [`Watcher::next`] reads the row again and
/// watches anew.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WatchError {
    /// A request or the watch stream failed.
    #[error("etcd: {0}")]
    Etcd(#[source] etcd_client::Error),
    /// etcd did not answer in time.
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    /// etcd cancelled the watch.
    #[error("etcd cancelled the watch: {0}")]
    Canceled(String),
    /// etcd closed the watch stream.
    #[error("etcd closed the watch stream")]
    Closed,
}

/// Watches `<prefix>/table/<node>` for one node and applies the rows
/// through an [`ElectedGate`]: the `(epoch, version)` it holds only goes
/// up. Only the node's own row travels to it.
pub struct Watcher {
    cfg: EtcdRoleConfig,
    key: String,
    client: Client,
    gate: ElectedGate,
    stream: Option<WatchStream>,
    queue: VecDeque<WatchEvent>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("key", &self.key)
            .field("gate", &self.gate)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Watcher {
    /// Connects for node `me` (any node of `role`, candidate or not).
    pub async fn connect(
        cfg: EtcdRoleConfig,
        role: RoleConfig,
        me: NodeId,
    ) -> Result<Watcher, ConnectError> {
        cfg.validate()?;
        role.validate()?;
        let client = connect_client(&cfg).await?;
        Ok(Watcher {
            key: cfg.table_key(me),
            cfg,
            client,
            gate: ElectedGate::new(role, me),
            stream: None,
            queue: VecDeque::new(),
        })
    }

    /// `(epoch, version)` held; `(0, 0)` for none.
    pub fn held(&self) -> (u64, u64) {
        self.gate.held()
    }

    /// The row held, if any.
    pub fn current(&self) -> Option<&TableView> {
        self.gate.current()
    }

    fn ingest(&mut self, value: &[u8], revision: i64) {
        let ev = match decode(value) {
            Ok(RoleMessage::Table(view)) => match self.gate.apply(view.clone()) {
                Ok(applied) => WatchEvent::Applied {
                    view,
                    applied,
                    revision,
                },
                Err(e) => WatchEvent::Skipped {
                    revision,
                    reason: e.into(),
                },
            },
            Ok(_) => WatchEvent::Skipped {
                revision,
                reason: BadRow::NotATable,
            },
            Err(e) => WatchEvent::Skipped {
                revision,
                reason: e.into(),
            },
        };
        self.queue.push_back(ev);
    }

    /// Reads the row as it is now, then watches the writes after it.
    async fn start(&mut self) -> Result<(), WatchError> {
        let wait = self.cfg.request_timeout;
        let mut kv = self.client.kv_client();
        let resp = timeout(wait, kv.get(self.key.as_str(), None))
            .await
            .map_err(|_| WatchError::Timeout(wait))?
            .map_err(WatchError::Etcd)?;
        let at = resp.header().map_or(0, |h| h.revision());
        for kv in resp.kvs() {
            self.ingest(kv.value(), kv.mod_revision());
        }
        let opts = WatchOptions::new().with_start_revision(at.saturating_add(1));
        let mut wc = self.client.watch_client();
        let stream = timeout(wait, wc.watch(self.key.as_str(), Some(opts)))
            .await
            .map_err(|_| WatchError::Timeout(wait))?
            .map_err(WatchError::Etcd)?;
        self.stream = Some(stream);
        Ok(())
    }

    /// The next thing that happened to the row. After an error, the next
    /// call starts over (reads the row, watches after it); rows written in
    /// between are not lost, only superseded ones may be skipped. Safe to
    /// cancel (a restart in progress is begun again).
    pub async fn next(&mut self) -> Result<WatchEvent, WatchError> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Ok(ev);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.start().await?;
                continue;
            };
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    self.stream = None;
                    return Err(WatchError::Closed);
                }
                Err(e) => {
                    self.stream = None;
                    return Err(WatchError::Etcd(e));
                }
            };
            if resp.canceled() {
                self.stream = None;
                if resp.compact_revision() > 0 {
                    // History compacted past our start: read afresh.
                    continue;
                }
                return Err(WatchError::Canceled(resp.cancel_reason().to_string()));
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                match ev.event_type() {
                    EventType::Put => self.ingest(kv.value(), kv.mod_revision()),
                    EventType::Delete => self.queue.push_back(WatchEvent::Skipped {
                        revision: kv.mod_revision(),
                        reason: BadRow::Deleted,
                    }),
                }
            }
        }
    }
}
