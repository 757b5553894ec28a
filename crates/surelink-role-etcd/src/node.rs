//! The etcd backend serving one surelink endpoint: what a node runs with
//! `role.backend = "etcd"`.
//!
//! Two tasks per endpoint. The **watcher** applies this node's rows as
//! etcd carries them ([`Watcher`] → [`ExternalRole::apply`]); every node
//! runs it. A **candidate** (one of the role configuration's candidates)
//! also campaigns, again and again: it grants a lease, campaigns, and once
//! elected runs the [`Leader`] on the reports its endpoint receives over
//! surelink's sessions until the leader stops (fenced, lost the election,
//! stepped down), then campaigns anew with a new lease and so a new epoch.
//! Reports received while campaigning are kept (the newest per reporter)
//! and handed to the leader it becomes, so its first table is built from
//! what the nodes said in the last refreshes rather than from nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use surelink::{Endpoint, ExternalRole};
use surelink_proto::role::{RoleInput, StatusReport};
use surelink_proto::NodeId;
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use tracing::{debug, info, warn};

use crate::candidate::Candidate;
use crate::config::{EtcdConfigError, EtcdRoleConfig};
use crate::leader::{Leader, LeaderEnd};
use crate::watcher::{WatchEvent, Watcher};

/// First wait after a failed etcd request; doubled up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Why the backend could not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StartError {
    /// The endpoint has no role service, or its role service is the
    /// embedded one (`RoleConfig::ownership` is not `Elected`).
    #[error("the endpoint's role service does not take an external backend (set RoleConfig::ownership = Ownership::Elected)")]
    NotExternal,
    /// Another backend already took the endpoint's role inputs.
    #[error("another backend already runs on this endpoint")]
    AlreadyRunning,
    /// The etcd configuration cannot work.
    #[error(transparent)]
    Config(#[from] EtcdConfigError),
}

/// What the backend is doing (for logs, tests and measurements).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendState {
    /// The epoch this node leads, if it does.
    pub leading: Option<u64>,
    /// Times this node was elected.
    pub terms: u64,
    /// How its last term ended.
    pub last_end: Option<LeaderEnd>,
    /// Rows the watcher handed to the endpoint.
    pub rows_applied: u64,
    /// The newest etcd error the tasks met (they retry).
    pub last_error: Option<String>,
}

/// The etcd backend of one endpoint. Dropping it aborts its tasks as a
/// crash would (a leader's lease runs out after its TTL);
/// [`EtcdBackend::stop`] resigns first (the next candidate leads at once).
#[derive(Debug)]
pub struct EtcdBackend {
    tasks: Vec<JoinHandle<()>>,
    state: Arc<Mutex<BackendState>>,
    stop: watch::Sender<bool>,
}

impl EtcdBackend {
    /// Starts the backend for `endpoint`, whose role configuration must
    /// have `ownership: Ownership::Elected`. Connects in the background
    /// and retries while etcd is unreachable.
    pub fn start(endpoint: &Endpoint, cfg: EtcdRoleConfig) -> Result<EtcdBackend, StartError> {
        cfg.validate()?;
        let link = endpoint.external_role().ok_or(StartError::NotExternal)?;
        let inputs = link.take_inputs().ok_or(StartError::AlreadyRunning)?;
        let state = Arc::new(Mutex::new(BackendState::default()));
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(watch_rows(
            link.clone(),
            cfg.clone(),
            state.clone(),
        ))];
        if link.is_candidate() {
            tasks.push(tokio::spawn(campaign_forever(
                link,
                cfg,
                inputs,
                state.clone(),
                stop_rx,
            )));
        }
        Ok(EtcdBackend { tasks, state, stop })
    }

    /// What the backend is doing now.
    pub fn state(&self) -> BackendState {
        self.state.lock().clone()
    }

    /// Stops: a leader revokes its lease, so the next candidate leads
    /// without waiting for the TTL. Waits at most a few seconds.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        // The watcher has nothing to hand over; the candidate finishes.
        if let Some(w) = self.tasks.first() {
            w.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Retries of etcd requests: the newest error noted (logged once while it
/// repeats), waits doubling from [`BACKOFF_MIN`] to [`BACKOFF_MAX`].
struct Retry {
    state: Arc<Mutex<BackendState>>,
    wait: Duration,
}

impl Retry {
    fn new(state: Arc<Mutex<BackendState>>) -> Retry {
        Retry {
            state,
            wait: BACKOFF_MIN,
        }
    }

    /// A request worked: the next failure waits the least again.
    fn reset(&mut self) {
        self.wait = BACKOFF_MIN;
    }

    /// A request failed: notes why; returns how long to wait before the
    /// next try.
    fn failed(&mut self, what: &str, e: &dyn std::fmt::Display) -> Duration {
        let msg = format!("{what}: {e}");
        let mut st = self.state.lock();
        if st.last_error.as_deref() != Some(msg.as_str()) {
            warn!("etcd role backend: {msg} (retrying)");
            st.last_error = Some(msg);
        }
        let wait = self.wait;
        self.wait = (self.wait * 2).min(BACKOFF_MAX);
        wait
    }
}

/// Every node: applies its rows as etcd carries them, until the endpoint
/// shuts down.
async fn watch_rows(link: ExternalRole, cfg: EtcdRoleConfig, state: Arc<Mutex<BackendState>>) {
    let me = link.node();
    let mut retry = Retry::new(state.clone());
    let mut watcher = loop {
        match Watcher::connect(cfg.clone(), link.config().clone(), me).await {
            Ok(w) => break w,
            Err(e) => {
                if link.is_closed() {
                    return;
                }
                sleep(retry.failed("connecting the watcher", &e)).await;
            }
        }
    };
    retry.reset();
    loop {
        match watcher.next().await {
            Ok(WatchEvent::Applied { view, .. }) => {
                retry.reset();
                if link.apply(view).await.is_err() {
                    return;
                }
                state.lock().rows_applied += 1;
            }
            Ok(WatchEvent::Skipped { revision, reason }) => {
                debug!(%me, revision, "row not applied: {reason}");
            }
            Err(e) => {
                if link.is_closed() {
                    return;
                }
                sleep(retry.failed("watching the table row", &e)).await;
            }
        }
    }
}

/// The newest report of each reporter received while not leading, with
/// when it arrived.
type Held = HashMap<NodeId, (Instant, StatusReport)>;

fn hold(held: &mut Held, input: RoleInput) {
    match input {
        RoleInput::Report { from, report } => {
            held.insert(from, (Instant::now(), report));
        }
        RoleInput::NodeRestarted(node) => {
            held.remove(&node);
        }
        // A helper re-reports every refresh: the leader hears the next.
        RoleInput::HelperReport { .. } => {}
    }
}

/// A candidate: campaigns, leads, and campaigns again, until the endpoint
/// shuts down or the backend stops.
async fn campaign_forever(
    link: ExternalRole,
    cfg: EtcdRoleConfig,
    mut inputs: mpsc::Receiver<RoleInput>,
    state: Arc<Mutex<BackendState>>,
    mut stop: watch::Receiver<bool>,
) {
    let me = link.node();
    let role = link.config().clone();
    let mut held = Held::new();
    let mut retry = Retry::new(state.clone());
    loop {
        // Connect and campaign, keeping the reports that arrive meanwhile.
        let campaign = async {
            let candidate = Candidate::connect(cfg.clone(), role.clone(), me)
                .await
                .map_err(|e| ("connecting the candidate", e.to_string()))?;
            candidate
                .campaign()
                .await
                .map_err(|e| ("campaigning", e.to_string()))
        };
        tokio::pin!(campaign);
        let won = loop {
            tokio::select! {
                r = &mut campaign => break r,
                i = inputs.recv() => match i {
                    Some(i) => hold(&mut held, i),
                    // The endpoint shut down (dropping the campaign lets
                    // the lease lapse).
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        };
        let mut leader = match won {
            Ok(l) => l,
            Err((what, e)) => {
                sleep(retry.failed(what, &e)).await;
                continue;
            }
        };
        retry.reset();
        let epoch = leader.epoch();
        info!(node = %me, epoch, "elected role server through etcd");
        // The reports of the last refreshes seed the first table.
        let fresh = role.refresh * 2;
        for (from, (at, report)) in held.drain() {
            if at.elapsed() <= fresh {
                let _ = leader.handle_input(&RoleInput::Report { from, report });
            }
        }
        {
            let mut st = state.lock();
            st.leading = Some(epoch);
            st.terms += 1;
        }
        let mut shown = Instant::now() - role.refresh;
        let stopping = {
            let mut stop = stop.clone();
            async move {
                let _ = stop.wait_for(|s| *s).await;
            }
        };
        let end = leader
            .run(&mut inputs, stopping, |l: &Leader| {
                // The status snapshot (O(matrix)): a few times per refresh.
                if shown.elapsed() >= role.refresh / 4 {
                    shown = Instant::now();
                    link.set_serving(Some((l.epoch(), l.server().matrix(), l.now())));
                }
            })
            .await;
        link.set_serving(None);
        {
            let mut st = state.lock();
            st.leading = None;
            st.last_end = Some(end);
        }
        info!(node = %me, epoch, "role leadership through etcd ended: {end:?}");
        if end == LeaderEnd::Resigned {
            return;
        }
    }
}
