//! A candidate's lease: granted once, kept alive by a task, and the
//! `t_valid` it gives.
//!
//! etcd renews a lease when it *processes* a keep-alive, for the lease's
//! TTL from then; that is no earlier than when the keep-alive was *sent*.
//! So once etcd acknowledges a keep-alive sent at `s`, the lease (and the
//! election key on it) lives at least until `s + TTL` of etcd's time, and
//! no other candidate can win before then: `t_valid = s + TTL − margin`
//! on this machine's monotonic clock, the margin covering the two clocks'
//! rate difference. A keep-alive whose answer never comes moves nothing.
//!
//! Answers on one keep-alive stream come in the order of the requests, so
//! the task keeps the send times of unanswered requests in a queue and
//! credits each answer to the oldest — never to a later send than the one
//! it answers.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use crate::ConnectError;

/// Unanswered keep-alives beyond this many: the stream is stuck; open a
/// new one (its first request is answered before it counts).
const MAX_PENDING: usize = 8;

#[derive(Debug)]
struct State {
    /// The granted TTL.
    ttl: Duration,
    /// When the newest acknowledged keep-alive (or the grant) was sent.
    acked_sent: Instant,
    /// etcd said the lease does not exist (expired or revoked).
    lost: bool,
}

/// What the keep-alive task shares with the candidate and the leader.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    state: Mutex<State>,
    margin: Duration,
    /// Flips to `true`, once, when the lease is known lost.
    lost_tx: watch::Sender<bool>,
}

impl LeaseClock {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The grant (or a keep-alive) sent at `sent` was acknowledged, with
    /// the lease's TTL as etcd states it.
    fn acked(&self, sent: Instant, ttl: Duration) {
        let mut s = self.lock();
        if s.lost {
            return;
        }
        if sent > s.acked_sent {
            s.acked_sent = sent;
        }
        s.ttl = ttl;
    }

    fn set_lost(&self) {
        self.lock().lost = true;
        self.lost_tx.send_replace(true);
    }

    /// `acked_sent + ttl − margin`; `None` once the lease is known lost.
    pub(crate) fn t_valid(&self) -> Option<Instant> {
        let s = self.lock();
        if s.lost {
            return None;
        }
        Some(s.acked_sent + s.ttl.saturating_sub(self.margin))
    }

    /// When the newest acknowledged keep-alive was sent.
    pub(crate) fn last_acked_sent(&self) -> Instant {
        self.lock().acked_sent
    }

    /// The TTL etcd granted.
    pub(crate) fn ttl(&self) -> Duration {
        self.lock().ttl
    }

    /// Resolves once the lease is known lost.
    pub(crate) fn lost_signal(&self) -> watch::Receiver<bool> {
        self.lost_tx.subscribe()
    }
}

/// A granted lease and the task keeping it alive (stopped on drop: the
/// lease then runs out after its TTL, as if the process had died).
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) id: i64,
    pub(crate) clock: Arc<LeaseClock>,
    task: JoinHandle<()>,
}

impl Lease {
    /// Grants a lease of `ttl_secs` and starts keeping it alive every `every`.
    pub(crate) async fn grant(
        client: &Client,
        ttl_secs: i64,
        every: Duration,
        margin: Duration,
        wait: Duration,
    ) -> Result<Lease, ConnectError> {
        let mut lease_client = client.lease_client();
        let sent = Instant::now();
        let resp = timeout(wait, lease_client.grant(ttl_secs, None))
            .await
            .map_err(|_| ConnectError::Timeout(wait))?
            .map_err(ConnectError::LeaseGrant)?;
        let granted = resp.ttl();
        let Ok(secs @ 1..) = u64::try_from(granted) else {
            return Err(ConnectError::LeaseTtl(granted));
        };
        let (lost_tx, _) = watch::channel(false);
        let clock = Arc::new(LeaseClock {
            state: Mutex::new(State {
                ttl: Duration::from_secs(secs),
                acked_sent: sent,
                lost: false,
            }),
            margin,
            lost_tx,
        });
        let id = resp.id();
        let task = tokio::spawn(keep_alive(lease_client, id, every, clock.clone()));
        Ok(Lease { id, clock, task })
    }

    /// Stops the keep-alives and revokes the lease (its election key goes
    /// at once); best effort within `wait`.
    pub(crate) async fn revoke(self, client: &Client, wait: Duration) {
        self.task.abort();
        self.clock.set_lost();
        let mut lc = client.lease_client();
        match timeout(wait, lc.revoke(self.id)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(lease = self.id, "lease revoke: {e}"),
            Err(_) => tracing::debug!(lease = self.id, "lease revoke: no answer in {wait:?}"),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}

/// Opens a keep-alive stream; its first request is answered inside, so a
/// success is an acknowledged keep-alive sent at the returned time.
async fn open(
    lc: &mut LeaseClient,
    id: i64,
    wait: Duration,
    clock: &LeaseClock,
) -> Option<(LeaseKeeper, LeaseKeepAliveStream)> {
    let sent = Instant::now();
    match timeout(wait, lc.keep_alive(id)).await {
        Ok(Ok((keeper, stream))) => {
            let ttl = clock.ttl();
            clock.acked(sent, ttl);
            Some((keeper, stream))
        }
        Ok(Err(e)) if is_not_found(&e) => {
            clock.set_lost();
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(lease = id, "keep-alive stream: {e}");
            None
        }
        Err(_) => None,
    }
}

async fn keep_alive(mut lc: LeaseClient, id: i64, every: Duration, clock: Arc<LeaseClock>) {
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut pending: VecDeque<Instant> = VecDeque::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if clock.lock().lost {
            return;
        }
        let Some((keeper, responses)) = stream.as_mut() else {
            tick.tick().await;
            pending.clear();
            stream = open(&mut lc, id, every, &clock).await;
            continue;
        };
        tokio::select! {
            _ = tick.tick() => {
                if pending.len() >= MAX_PENDING {
                    stream = None;
                    continue;
                }
                let sent = Instant::now();
                // The request queue is bounded; a stream that does not
                // take it within a period is stuck.
                match timeout(every, keeper.keep_alive()).await {
                    Ok(Ok(())) => pending.push_back(sent),
                    _ => stream = None,
                }
            }
            msg = responses.message() => match msg {
                Ok(Some(resp)) => {
                    let sent = pending.pop_front();
                    match u64::try_from(resp.ttl()) {
                        Ok(secs @ 1..) => {
                            if let Some(sent) = sent {
                                clock.acked(sent, Duration::from_secs(secs));
                            }
                        }
                        _ => {
                            tracing::info!(lease = id, "etcd: lease expired or revoked");
                            clock.set_lost();
                            return;
                        }
                    }
                }
                Ok(None) | Err(_) => stream = None,
            },
        }
    }
}
