//! Path and peer events, and subscriptions that never miss the state they
//! start from.
//!
//! A subscriber made at any moment first receives a `PathUp` for every path
//! up and a `PeerUp` for every peer reachable at that moment, then every
//! event after it: the state is snapshot and the subscription taken under
//! the same lock that publishing holds, so nothing falls between them.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};

use tokio::sync::broadcast;

use surelink_proto::{Epoch, NodeId, PathId, SessionEndReason};

pub use tokio::sync::broadcast::error::{RecvError, TryRecvError};

/// What the endpoint reports about paths and peers.
///
/// Non-exhaustive: later versions add events; match with a catch-all arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NetEvent {
    /// A path finished its handshake.
    PathUp {
        /// The peer.
        peer: NodeId,
        /// The path.
        path: PathId,
        /// Its network.
        network: usize,
    },
    /// A path is gone; its in-flight messages moved to the other paths.
    PathDown {
        /// The peer, when known.
        peer: Option<NodeId>,
        /// The path.
        path: PathId,
        /// Its network.
        network: usize,
        /// Frames re-sent elsewhere.
        resent: usize,
        /// Why, in words.
        reason: String,
    },
    /// A peer has a working path (again).
    PeerUp {
        /// The peer.
        peer: NodeId,
        /// Its incarnation.
        epoch: Epoch,
    },
    /// A peer has no working path; messages queue until one returns or the
    /// linger time passes.
    PeerUnreachable {
        /// The peer.
        peer: NodeId,
    },
    /// The failure detector found a path silent for a whole window (after
    /// its SafeTimer checks); its connections were shut down and their
    /// in-flight messages moved to the other paths.
    PathSilent {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: usize,
        /// How long ago it was last heard, in microseconds.
        silent_for_us: u64,
    },
    /// A silent path is heard again (and is being re-dialled).
    PathHeard {
        /// The peer.
        peer: NodeId,
        /// The network.
        network: usize,
    },
    /// Every path to the peer is silent: the detector considers it dead.
    PeerDead {
        /// The peer.
        peer: NodeId,
    },
    /// No process listens at the peer's addresses: since its last
    /// connection ended, a connect was refused (answered with a reset) on
    /// every network it is configured on, and no path is up. A crashed
    /// process on a live host looks like this at once; a paused or
    /// cut-off one does not (its kernel still accepts, or nothing
    /// answers). Not a failure detector verdict: a firewall that rejects
    /// looks the same. Reported once until a connection succeeds again.
    PeerRefused {
        /// The peer.
        peer: NodeId,
    },
    /// A peer considered dead is heard again.
    PeerAlive {
        /// The peer.
        peer: NodeId,
    },
    /// This process missed a heartbeat deadline and fenced itself: nothing
    /// it queued before went out after `t_valid`, every session ended, and it
    /// continues as a new incarnation (peers see `PeerRestarted`).
    Fenced {
        /// The incarnation that was fenced.
        old_epoch: Epoch,
        /// The new one.
        new_epoch: Epoch,
        /// Calls failed with [`CallError::Fenced`](crate::CallError::Fenced).
        calls_failed: usize,
        /// Messages that were not confirmed delivered.
        abandoned: u64,
    },
    /// The role service pushed this node a routing table it applied (see
    /// [`Endpoint::role_status`](crate::Endpoint::role_status) for its
    /// routes and ring).
    RoutingTable {
        /// The role server that computed it.
        role: NodeId,
        /// Its role epoch.
        epoch: u64,
        /// Its version within the epoch.
        version: u64,
    },
    /// A session ended; outstanding calls failed with the matching error.
    SessionEnded {
        /// The peer.
        peer: NodeId,
        /// Why (e.g. `PeerRestarted`).
        reason: SessionEndReason,
        /// Messages whose delivery was not confirmed.
        abandoned: u64,
    },
}

/// Paths and peers up now.
#[derive(Debug, Default)]
struct State {
    paths: BTreeMap<PathId, (NodeId, usize)>,
    peers: BTreeMap<NodeId, Epoch>,
}

impl State {
    fn apply(&mut self, e: &NetEvent) {
        match e {
            NetEvent::PathUp {
                peer,
                path,
                network,
            } => {
                self.paths.insert(*path, (*peer, *network));
            }
            NetEvent::PathDown { path, .. } => {
                self.paths.remove(path);
            }
            NetEvent::PeerUp { peer, epoch } => {
                self.peers.insert(*peer, *epoch);
            }
            NetEvent::PeerUnreachable { peer } | NetEvent::SessionEnded { peer, .. } => {
                self.peers.remove(peer);
            }
            NetEvent::Fenced { .. } => {
                self.peers.clear();
                self.paths.clear();
            }
            _ => {}
        }
    }

    fn replay(&self) -> VecDeque<NetEvent> {
        let mut out: VecDeque<NetEvent> = self
            .paths
            .iter()
            .map(|(&path, &(peer, network))| NetEvent::PathUp {
                peer,
                path,
                network,
            })
            .collect();
        out.extend(
            self.peers
                .iter()
                .map(|(&peer, &epoch)| NetEvent::PeerUp { peer, epoch }),
        );
        out
    }
}

/// Publishes events and hands out subscriptions.
#[derive(Debug)]
pub(crate) struct EventHub {
    state: Mutex<State>,
    tx: broadcast::Sender<NetEvent>,
}

impl EventHub {
    pub(crate) fn new() -> EventHub {
        EventHub {
            state: Mutex::new(State::default()),
            tx: broadcast::channel(4096).0,
        }
    }

    pub(crate) fn publish(&self, e: NetEvent) {
        let mut s = self.state.lock();
        s.apply(&e);
        let _ = self.tx.send(e);
    }

    pub(crate) fn subscribe(&self) -> Events {
        let s = self.state.lock();
        Events {
            replay: s.replay(),
            rx: self.tx.subscribe(),
        }
    }

    /// Working paths to `peer` now.
    pub(crate) fn paths_up(&self, peer: NodeId) -> usize {
        let s = self.state.lock();
        s.paths.values().filter(|(p, _)| *p == peer).count()
    }
}

/// A subscription to [`NetEvent`]s (from [`Endpoint::events`](crate::Endpoint::events)).
///
/// It first yields the state at the moment it was made — a `PathUp` per
/// working path, then a `PeerUp` per reachable peer — and then every event
/// after that moment. A subscriber that falls more than 4096 events behind
/// gets [`RecvError::Lagged`] and continues with the newest.
#[derive(Debug)]
pub struct Events {
    replay: VecDeque<NetEvent>,
    rx: broadcast::Receiver<NetEvent>,
}

impl Events {
    /// The next event. [`RecvError::Closed`] once the endpoint is gone.
    pub async fn recv(&mut self) -> Result<NetEvent, RecvError> {
        if let Some(e) = self.replay.pop_front() {
            return Ok(e);
        }
        self.rx.recv().await
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Result<NetEvent, TryRecvError> {
        if let Some(e) = self.replay.pop_front() {
            return Ok(e);
        }
        self.rx.try_recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_late_subscriber_sees_what_is_up_then_what_follows() {
        let hub = EventHub::new();
        hub.publish(NetEvent::PathUp {
            peer: NodeId(2),
            path: PathId(1),
            network: 0,
        });
        hub.publish(NetEvent::PathUp {
            peer: NodeId(2),
            path: PathId(2),
            network: 1,
        });
        hub.publish(NetEvent::PeerUp {
            peer: NodeId(2),
            epoch: Epoch(5),
        });
        hub.publish(NetEvent::PathDown {
            peer: Some(NodeId(2)),
            path: PathId(1),
            network: 0,
            resent: 0,
            reason: String::new(),
        });
        let mut ev = hub.subscribe();
        assert_eq!(hub.paths_up(NodeId(2)), 1);
        assert_eq!(
            ev.recv().await.unwrap(),
            NetEvent::PathUp {
                peer: NodeId(2),
                path: PathId(2),
                network: 1
            }
        );
        assert_eq!(
            ev.recv().await.unwrap(),
            NetEvent::PeerUp {
                peer: NodeId(2),
                epoch: Epoch(5)
            }
        );
        assert!(ev.try_recv().is_err());
        hub.publish(NetEvent::PeerUnreachable { peer: NodeId(2) });
        assert_eq!(
            ev.recv().await.unwrap(),
            NetEvent::PeerUnreachable { peer: NodeId(2) }
        );
        assert_eq!(hub.subscribe().replay.len(), 1, "only the path is left");
    }
}
