//! Activation on a client (PostMan L190–193): every window, the client's
//! own p99 over the calls that ended in it (and those still waiting, at
//! their wait so far) goes to the core's
//! `Activation`; above the SLA it draws `choices` helpers at random, ranks
//! them by the load levels the role service's row lists (or, when the row
//! does not list them all, asks each its load), and adds a path to the
//! server through the lightest —
//! and steers the server's traffic onto it (its network is preferred
//! among healthy paths: a helper's path that dies or freezes loses the
//! traffic to the direct ones).
//! Back under the release threshold for long enough, it drops that path
//! and goes direct.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tracing::info;

use surelink_proto::helper::{Activation, ActivationConfig, ActivationState, Decision};
use surelink_proto::{ConfigError, NodeId};

use super::client::RelayPath;
use super::helper::query_load;
use crate::histogram::Histogram;
use crate::peer_calls::PeerCalls;
use crate::shared::Shared;

/// What activation is doing now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HelpedStatus {
    /// The helper in use, if one is.
    pub helper: Option<SocketAddr>,
    /// Moves so far (each way counts one).
    pub switches: u64,
    /// The last window's p99, µs, counting each call still waiting as
    /// taking at least its wait so far (`None`: no call ended in it and
    /// none had waited past the SLA).
    pub last_p99_us: Option<u64>,
    /// The path through `helper` is up (connected and authenticated end
    /// to end): the server's traffic goes through it. `helper` is set
    /// when the client decides; this, once the move is done.
    pub relayed: bool,
}

/// A client's activation towards one server; stops (and goes direct)
/// when dropped.
#[derive(Debug)]
pub struct Helped {
    task: JoinHandle<()>,
    status: Arc<Mutex<HelpedStatus>>,
    state: Arc<Mutex<Option<RelayPath>>>,
    shared: Weak<Shared>,
    server: NodeId,
}

impl Helped {
    pub(crate) fn start(
        shared: &Arc<Shared>,
        server: NodeId,
        helpers: Vec<SocketAddr>,
        network: usize,
        cfg: ActivationConfig,
    ) -> Result<Helped, ConfigError> {
        let act = Activation::new(cfg)?;
        let status = Arc::new(Mutex::new(HelpedStatus::default()));
        let state = Arc::new(Mutex::new(None));
        // This server's calls only: a proxy's p99 towards its hot node is
        // not diluted by (nor moves) its calls to the others.
        let calls = shared.watch_peer_calls(server);
        let task = tokio::spawn(run(
            calls,
            Arc::downgrade(shared),
            server,
            helpers,
            network,
            act,
            status.clone(),
            state.clone(),
        ));
        Ok(Helped {
            task,
            status,
            state,
            shared: Arc::downgrade(shared),
            server,
        })
    }

    /// What activation is doing now.
    pub fn status(&self) -> HelpedStatus {
        let mut s = self.status.lock().clone();
        s.relayed = s.helper.is_some() && self.state.lock().as_ref().is_some_and(RelayPath::is_up);
        s
    }
}

impl Drop for Helped {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(sh) = self.shared.upgrade() {
            sh.set_helped(self.server, false);
            sh.unwatch_peer_calls(self.server);
        }
        self.state.lock().take();
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    calls: Arc<PeerCalls>,
    shared: Weak<Shared>,
    server: NodeId,
    helpers: Vec<SocketAddr>,
    network: usize,
    mut act: Activation,
    status: Arc<Mutex<HelpedStatus>>,
    state: Arc<Mutex<Option<RelayPath>>>,
) {
    let window = act_window(&act);
    let mut before = calls.rtt.snapshot();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    // Windows in a row the helper's path has been down while helped.
    let mut down = 0u32;
    loop {
        tick.tick().await;
        let Some(sh) = shared.upgrade() else { return };
        // A helper whose path stays down (it died, or refuses us: an
        // attempt failed, or has been under way past `ATTEMPT_STALL` —
        // a helper frozen with its listener open) or suspected
        // (it froze with its connections open) is left
        // for another: the session already carries the traffic on its
        // other paths, but activation would otherwise wait for the dwell
        // and a low p99 that a hot server may never give.
        let helped = matches!(act.state(), ActivationState::Helped(..));
        let stuck = state
            .lock()
            .as_ref()
            .is_none_or(|p| p.is_failing() || p.is_suspect(&sh, server));
        down = if helped && stuck { down + 1 } else { 0 };
        if down >= helper_down_windows(window) {
            down = 0;
            if act.handle_helper_lost().is_some() {
                info!(%server, "the helper's path stayed down: direct until another is drawn");
                sh.set_helped(server, false);
                state.lock().take();
                status.lock().helper = None;
            }
        }
        let after = calls.rtt.snapshot();
        let ended =
            Histogram::quantile_since(&before, &after, 0.99).map(std::time::Duration::from_micros);
        before = after;
        let p99 = with_waiting(
            ended,
            calls.oldest_waiting().map(|t| t.elapsed()),
            act_sla(&act),
        );
        status.lock().last_p99_us = p99.map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        // Ask the drawn helpers' loads only when a move may be due.
        let mut drawn: Vec<usize> = Vec::new();
        let mut loads: Vec<Option<u64>> = vec![None; helpers.len()];
        if matches!(act.state(), ActivationState::Direct)
            && p99.is_some_and(|p| p > act_sla(&act))
            && !helpers.is_empty()
        {
            drawn = draw(helpers.len(), act_choices(&act));
            // The role service's row, when it lists every drawn helper:
            // their levels, no round trip. Otherwise each is asked (levels
            // and ranks do not compare, so all of them).
            let levels: Option<Vec<u64>> = sh.role.as_ref().and_then(|r| {
                drawn
                    .iter()
                    .map(|&i| r.helper_level(helpers[i]).map(u64::from))
                    .collect()
            });
            if let Some(levels) = levels {
                for (&i, l) in drawn.iter().zip(levels) {
                    loads[i] = Some(l);
                }
            } else {
                // Asked at once, not one after the other: a move waits
                // for the slowest answer (or the timeout), not their sum.
                let answers = futures_util::future::join_all(
                    drawn.iter().map(|&i| query_load(helpers[i], window / 2)),
                )
                .await;
                for (&i, l) in drawn.iter().zip(answers) {
                    loads[i] = l.map(surelink_proto::helper::HelperLoad::rank);
                }
            }
        }
        let now = sh.clock.now();
        match act.handle_window(
            now,
            p99,
            |_| drawn.clone(),
            |i| loads.get(i).copied().flatten(),
        ) {
            Some(Decision::UseHelper(i)) => {
                info!(%server, helper = %helpers[i], "p99 above the SLA: going through a helper");
                *state.lock() = Some(RelayPath::start(&sh, server, helpers[i], network));
                sh.set_helped(server, true);
                status.lock().helper = Some(helpers[i]);
            }
            Some(Decision::GoDirect) => {
                info!(%server, "p99 back under the release threshold: going direct");
                sh.set_helped(server, false);
                state.lock().take();
                status.lock().helper = None;
            }
            None => {}
        }
        status.lock().switches = act.switches();
    }
}

/// The window's p99 with the calls still waiting: the longest wait is a
/// latency at least that long, so it raises the p99 of the calls that
/// ended; with none ended, it counts alone once past the SLA (a server
/// that answers nothing is slow). A young waiting call with nothing
/// ended says nothing.
fn with_waiting(
    ended: Option<std::time::Duration>,
    waited: Option<std::time::Duration>,
    sla: std::time::Duration,
) -> Option<std::time::Duration> {
    match (ended, waited) {
        (Some(p), Some(w)) => Some(p.max(w)),
        (None, Some(w)) if w > sla => Some(w),
        (p, _) => p,
    }
}

/// How many windows a helper's path may stay down before activation
/// leaves that helper: a second's worth (at least two windows), well
/// past a re-dial of a helper that only restarted.
fn helper_down_windows(window: std::time::Duration) -> u32 {
    let per_second = std::time::Duration::from_secs(1).as_nanos() / window.as_nanos().max(1);
    u32::try_from(per_second).unwrap_or(u32::MAX).max(2)
}

fn act_window(a: &Activation) -> std::time::Duration {
    a.config().window
}

fn act_sla(a: &Activation) -> std::time::Duration {
    a.config().sla
}

fn act_choices(a: &Activation) -> usize {
    a.config().choices
}

/// `k` distinct indices below `n`, at random.
fn draw(n: usize, k: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    let mut out = Vec::with_capacity(k.min(n));
    // The clock's nanoseconds as a cheap seed: the draw only spreads
    // clients over helpers, it guards nothing.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos() as u64 | 1)
        ^ (std::process::id() as u64).rotate_left(32);
    while out.len() < k && !all.is_empty() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = usize::try_from(x % all.len() as u64).unwrap_or(0);
        out.push(all.swap_remove(j));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::with_waiting;
    use std::time::Duration;

    #[test]
    fn a_call_still_waiting_counts_as_at_least_its_wait() {
        let ms = Duration::from_millis;
        let sla = ms(10);
        // A server that answers nothing is slow once a call waits past
        // the SLA, and says nothing before.
        assert_eq!(with_waiting(None, Some(ms(30)), sla), Some(ms(30)));
        assert_eq!(with_waiting(None, Some(ms(5)), sla), None);
        assert_eq!(with_waiting(None, None, sla), None);
        // With calls ended, the longer of the two.
        assert_eq!(with_waiting(Some(ms(3)), Some(ms(40)), sla), Some(ms(40)));
        assert_eq!(with_waiting(Some(ms(3)), Some(ms(1)), sla), Some(ms(3)));
        assert_eq!(with_waiting(Some(ms(3)), None, sla), Some(ms(3)));
    }
}
