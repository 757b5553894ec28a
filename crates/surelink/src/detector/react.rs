//! What the endpoint does with the detector's signals, inside the runtime:
//! a path silent while another path of the peer is heard has its
//! connections shut down (the session re-sends their in-flight messages
//! there); paths silent together are left alone, and one of them still
//! silent once another is heard again is only suspected in the session
//! (traffic moves, the connection stays: the peer's host was busy) until
//! it has been silent a peer window longer; a path heard again is
//! re-dialled at once (a suspected connection on it whose TCP backed off
//! is reset first: it would wait out its retransmission timer), peer reports become events, and a closed fence ends this incarnation —
//! every session and call fails, and the process goes on as a new epoch so
//! peers learn the old one stopped (SafeTimer: no message leaves after
//! `t_valid`, and none of the old incarnation's state is replayed).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{info, warn};

use surelink_proto::detector::PathReport;
use surelink_proto::{Epoch, LocalIdentity, Router};

use super::Signal;
use crate::error::CallError;
use crate::events::NetEvent;
use crate::shared::Shared;

/// Acts on the detector's signals until the detector stops.
pub(crate) async fn signal_loop(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Signal>) {
    while let Some(s) = rx.recv().await {
        match s {
            Signal::Report(r) => report(&shared, r),
            Signal::Fenced { at, missed_seq } => {
                warn!(
                    ?at,
                    missed_seq, "heartbeat missed its deadline: fenced; starting a new epoch"
                );
                recover_from_fence(&shared);
            }
        }
    }
    info!("detector signals ended");
}

/// Acts on a failure-detector report.
fn report(shared: &Arc<Shared>, report: PathReport) {
    let event = match report {
        PathReport::PathDown {
            watch,
            last_heard,
            failover,
        } => {
            let network = usize::from(watch.network);
            // Another path of the peer is heard: the readers see this
            // one's end at once and the session re-sends its in-flight
            // messages there. Every path silent together: nowhere to move
            // them, and a torn-down path costs a reconnection (a handshake
            // per path, on a host that is likely busy already) when the
            // peer is heard again — the connection stays.
            let killed = if failover {
                shared
                    .session(watch.peer)
                    .map_or(0, |h| h.kill_network(network))
            } else {
                0
            };
            // `last_heard` is on the detector's clock.
            let now = shared
                .detector
                .as_ref()
                .map_or(last_heard, |d| d.gate.now());
            let silent = now.saturating_since(last_heard);
            if failover {
                warn!(peer = %watch.peer, network, silent_ms = silent.as_millis(), killed, "path silent: failing over");
            } else {
                warn!(peer = %watch.peer, network, silent_ms = silent.as_millis(), "path silent with every path of the peer: kept open (nothing to fail over to)");
            }
            NetEvent::PathSilent {
                peer: watch.peer,
                network,
                silent_for_us: u64::try_from(silent.as_micros()).unwrap_or(u64::MAX),
            }
        }
        PathReport::PathFailover { watch } => {
            // The whole peer fell silent first (a busy host): traffic
            // moves, the connection stays until `PathAbandon`.
            let network = usize::from(watch.network);
            let suspected = shared
                .session(watch.peer)
                .map_or(0, |h| h.suspect_network(shared, network));
            warn!(peer = %watch.peer, network, suspected, "path still silent while another is heard: failing over");
            return;
        }
        PathReport::PathAbandon { watch } => {
            // Silent a peer window after failing over, its peer heard all
            // along: the readers see the end at once, and the dialer
            // brings up a new connection when the network carries again.
            let network = usize::from(watch.network);
            let killed = shared
                .session(watch.peer)
                .map_or(0, |h| h.kill_network(network));
            warn!(peer = %watch.peer, network, killed, "path silent for the peer window while the peer is heard: giving its connection up");
            return;
        }
        PathReport::PathUp { watch } => {
            let network = usize::from(watch.network);
            let reset = shared
                .session(watch.peer)
                .map_or(0, |h| h.reset_stuck(network));
            if reset > 0 {
                warn!(peer = %watch.peer, network, reset, "path heard again, its suspected connection's TCP backing off: reset, dialling afresh");
            } else {
                info!(peer = %watch.peer, network, "path heard again");
            }
            shared.dialer.redial_now();
            NetEvent::PathHeard {
                peer: watch.peer,
                network: usize::from(watch.network),
            }
        }
        PathReport::PeerDown { peer } => {
            warn!(%peer, "every path to the peer is silent: peer dead");
            NetEvent::PeerDead { peer }
        }
        PathReport::PeerUp { peer } => NetEvent::PeerAlive { peer },
    };
    shared.events.publish(event);
}

/// After the fence closed: end every session, fail every call, and go on
/// as a new incarnation so peers learn that this one stopped.
fn recover_from_fence(shared: &Shared) {
    let old = Epoch(shared.epoch.load(Ordering::Relaxed));
    let new = Epoch(old.0 + 1);
    let err = CallError::Fenced { epoch: old };
    let (mut calls_failed, mut abandoned) = (0, 0);
    {
        let mut r = shared.router.lock();
        let identity = LocalIdentity {
            cluster: shared.config.cluster,
            node: shared.config.node,
            epoch: new,
        };
        match Router::new(shared.config.core.clone(), identity) {
            Ok(router) => r.router = router,
            Err(e) => warn!(error = %e, "could not start the new incarnation"),
        }
        for (_, io) in r.unbound.drain() {
            io.kill();
        }
        for h in shared.take_sessions() {
            let (c, a) = h.abandon(&err);
            calls_failed += c;
            abandoned += a;
            shared.server.remove_session(&h);
        }
        shared.epoch.store(new.0, Ordering::Relaxed);
    }
    if let Some(d) = &shared.detector {
        d.restart_fence(new);
    }
    shared.dialer.redial_now();
    shared.events.publish(NetEvent::Fenced {
        old_epoch: old,
        new_epoch: new,
        calls_failed,
        abandoned,
    });
}
