//! Which session a HELLO joins: the rules that keep a path's two ends bound
//! to the same pair of sessions, through restarts and session resets.
//!
//! A session is the pair (our incarnation + session id, the peer's
//! incarnation + session id). Every HELLO names the sender's side and, once
//! known, the receiver's side as the sender sees it. A path carries data only
//! after each end has accepted the other's HELLO, so a path never carries one
//! session's frames into another; whenever a session ends, all its paths are
//! closed and fresh ones are dialled.

use crate::config::MESSAGE_OVERHEAD;
use crate::error::HandshakeError;
use crate::event::SessionEndReason;
use crate::ids::{Epoch, NodeId, SessionId};
use crate::session::LocalIdentity;
use crate::wire::Hello;

/// What to do with a HELLO.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The current session already talks to this peer session: attach the path.
    Attach,
    /// The current session has not met its peer yet: bind it to this one.
    Bind,
    /// The peer started a new session (new incarnation, or it ended the old
    /// one): end ours with this reason, open a new one bound to the HELLO.
    Replace(SessionEndReason),
    /// No session yet: open one bound to the HELLO.
    Create,
    /// Refuse the path.
    Reject(HandshakeError),
}

/// Our current session with the HELLO's node, if any.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Current {
    pub(crate) id: SessionId,
    /// The peer incarnation and session it is bound to, once bound.
    pub(crate) peer: Option<(Epoch, SessionId)>,
}

/// Decides what a HELLO means. `expected` is the node a dialled path was
/// meant for; `cur` our current session with the HELLO's node; `seen` the
/// newest (epoch, session) of that node we ever bound a session to, kept
/// after sessions end so a delayed HELLO of a dead session is recognised.
pub(crate) fn decide(
    local: &LocalIdentity,
    h: &Hello,
    expected: Option<NodeId>,
    cur: Option<Current>,
    seen: Option<(Epoch, SessionId)>,
) -> Decision {
    if h.cluster != local.cluster {
        return Decision::Reject(HandshakeError::WrongCluster {
            ours: local.cluster,
            theirs: h.cluster,
        });
    }
    if h.node == NodeId(0) {
        return Decision::Reject(HandshakeError::ReservedNode);
    }
    if h.node == local.node {
        return Decision::Reject(HandshakeError::SelfConnect(h.node));
    }
    if let Some(expected) = expected {
        if expected != h.node {
            return Decision::Reject(HandshakeError::UnexpectedPeer {
                expected,
                got: h.node,
            });
        }
    }
    // Meant for another node (an address book out of date): refuse the path
    // only; nothing here concerns our sessions.
    if h.your_node != NodeId(0) && h.your_node != local.node {
        return Decision::Reject(HandshakeError::WrongNode {
            intended: h.your_node,
            got: local.node,
        });
    }
    if h.max_message == 0
        || h.max_channels == 0
        || u64::from(h.recv_window) < u64::from(h.max_message) + MESSAGE_OVERHEAD
    {
        return Decision::Reject(HandshakeError::BadLimits(h.node));
    }
    // The sender's session met an incarnation of ours: is it this one?
    if h.your_epoch != Epoch(0) && h.your_epoch != local.epoch {
        return Decision::Reject(HandshakeError::EarlierIncarnation {
            node: h.node,
            epoch: h.your_epoch,
        });
    }
    // ...and is that session still ours?
    let knows_us = h.your_session != SessionId(0);
    if knows_us && cur.is_none_or(|c| c.id != h.your_session) {
        return Decision::Reject(HandshakeError::SessionUnknown(h.node));
    }
    let theirs = (h.epoch, h.session);
    let Some(peer) = cur.and_then(|c| c.peer) else {
        // No session bound to this node now: a peer session we bound before
        // (and have since ended) or an older one is stale.
        if seen.is_some_and(|s| theirs <= s) {
            return Decision::Reject(HandshakeError::Stale {
                node: h.node,
                epoch: h.epoch,
            });
        }
        return if cur.is_some() {
            Decision::Bind
        } else {
            Decision::Create
        };
    };
    let known = peer;
    if theirs == known {
        Decision::Attach
    } else if theirs < known {
        Decision::Reject(HandshakeError::Stale {
            node: h.node,
            epoch: h.epoch,
        })
    } else if knows_us {
        // A newer peer session claiming to know our current one, which is
        // bound to an older peer session: cannot arise from these rules; refuse
        // rather than guess, the peer will start afresh.
        Decision::Reject(HandshakeError::SessionUnknown(h.node))
    } else if h.epoch > peer.0 {
        Decision::Replace(SessionEndReason::PeerRestarted {
            old: peer.0,
            new: Some(h.epoch),
        })
    } else {
        Decision::Replace(SessionEndReason::PeerReset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ClusterId;

    const LOCAL: LocalIdentity = LocalIdentity {
        cluster: ClusterId(7),
        node: NodeId(1),
        epoch: Epoch(100),
    };

    fn hello(epoch: u64, session: u64, your_epoch: u64, your_session: u64) -> Hello {
        Hello {
            cluster: ClusterId(7),
            node: NodeId(2),
            epoch: Epoch(epoch),
            session: SessionId(session),
            your_node: NodeId(0),
            your_epoch: Epoch(your_epoch),
            your_session: SessionId(your_session),
            recv_window: 1 << 20,
            max_message: 1 << 16,
            max_channels: 16,
        }
    }

    fn bound(id: u64, epoch: u64, session: u64) -> Option<Current> {
        Some(Current {
            id: SessionId(id),
            peer: Some((Epoch(epoch), SessionId(session))),
        })
    }

    #[test]
    fn meant_for_another_node_or_bad_limits_is_refused() {
        let mut h = hello(5, 1, 100, 3);
        h.your_node = NodeId(9);
        // Refused before any session rule: even a matching session is not touched.
        assert_eq!(
            decide(&LOCAL, &h, None, bound(3, 5, 1), None),
            Decision::Reject(HandshakeError::WrongNode {
                intended: NodeId(9),
                got: NodeId(1)
            })
        );
        h.your_node = NodeId(1);
        assert_eq!(
            decide(&LOCAL, &h, None, bound(3, 5, 1), None),
            Decision::Attach
        );
        let mut h = hello(5, 1, 0, 0);
        h.recv_window = 10;
        assert_eq!(
            decide(&LOCAL, &h, None, None, None),
            Decision::Reject(HandshakeError::BadLimits(NodeId(2)))
        );
        let mut h = hello(5, 1, 0, 0);
        h.max_channels = 0;
        assert_eq!(
            decide(&LOCAL, &h, None, None, None),
            Decision::Reject(HandshakeError::BadLimits(NodeId(2)))
        );
    }

    #[test]
    fn a_dead_peer_session_cannot_bind_again() {
        // We once bound to (5, 4) and that session ended.
        let seen = Some((Epoch(5), SessionId(4)));
        assert!(matches!(
            decide(&LOCAL, &hello(5, 4, 0, 0), None, None, seen),
            Decision::Reject(HandshakeError::Stale { .. })
        ));
        let pending = Some(Current {
            id: SessionId(8),
            peer: None,
        });
        assert!(matches!(
            decide(&LOCAL, &hello(5, 3, 0, 0), None, pending, seen),
            Decision::Reject(HandshakeError::Stale { .. })
        ));
        assert_eq!(
            decide(&LOCAL, &hello(5, 5, 0, 0), None, pending, seen),
            Decision::Bind
        );
        assert_eq!(
            decide(&LOCAL, &hello(6, 1, 0, 0), None, None, seen),
            Decision::Create
        );
    }

    #[test]
    fn identity_checks() {
        let mut h = hello(5, 1, 0, 0);
        h.cluster = ClusterId(8);
        assert!(matches!(
            decide(&LOCAL, &h, None, None, None),
            Decision::Reject(HandshakeError::WrongCluster { .. })
        ));
        let mut h = hello(5, 1, 0, 0);
        h.node = NodeId(1);
        assert_eq!(
            decide(&LOCAL, &h, None, None, None),
            Decision::Reject(HandshakeError::SelfConnect(NodeId(1)))
        );
        let mut h = hello(5, 1, 0, 0);
        h.node = NodeId(0);
        assert_eq!(
            decide(&LOCAL, &h, None, None, None),
            Decision::Reject(HandshakeError::ReservedNode)
        );
        let h = hello(5, 1, 0, 0);
        assert_eq!(
            decide(&LOCAL, &h, Some(NodeId(3)), None, None),
            Decision::Reject(HandshakeError::UnexpectedPeer {
                expected: NodeId(3),
                got: NodeId(2)
            })
        );
    }

    #[test]
    fn new_peers_create_or_bind() {
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 0, 0), None, None, None),
            Decision::Create
        );
        let pending = Some(Current {
            id: SessionId(3),
            peer: None,
        });
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 0, 0), None, pending, None),
            Decision::Bind
        );
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 100, 3), None, pending, None),
            Decision::Bind
        );
    }

    #[test]
    fn same_session_attaches() {
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 100, 3), None, bound(3, 5, 1), None),
            Decision::Attach
        );
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 0, 0), None, bound(3, 5, 1), None),
            Decision::Attach
        );
    }

    #[test]
    fn restart_and_reset_replace_the_session() {
        assert_eq!(
            decide(&LOCAL, &hello(6, 1, 0, 0), None, bound(3, 5, 4), None),
            Decision::Replace(SessionEndReason::PeerRestarted {
                old: Epoch(5),
                new: Some(Epoch(6))
            })
        );
        assert_eq!(
            decide(&LOCAL, &hello(5, 2, 0, 0), None, bound(3, 5, 1), None),
            Decision::Replace(SessionEndReason::PeerReset)
        );
    }

    #[test]
    fn stale_and_unknown_are_refused() {
        assert!(matches!(
            decide(&LOCAL, &hello(4, 9, 0, 0), None, bound(3, 5, 1), None),
            Decision::Reject(HandshakeError::Stale { .. })
        ));
        // Talks about an earlier incarnation of us.
        assert!(matches!(
            decide(&LOCAL, &hello(5, 1, 99, 3), None, bound(3, 5, 1), None),
            Decision::Reject(HandshakeError::EarlierIncarnation { .. })
        ));
        // Talks about a session of ours that ended.
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 100, 2), None, bound(3, 5, 1), None),
            Decision::Reject(HandshakeError::SessionUnknown(NodeId(2)))
        );
        assert_eq!(
            decide(&LOCAL, &hello(5, 1, 100, 2), None, None, None),
            Decision::Reject(HandshakeError::SessionUnknown(NodeId(2)))
        );
        // Newer peer session that claims to know our current one.
        assert_eq!(
            decide(&LOCAL, &hello(5, 2, 100, 3), None, bound(3, 5, 1), None),
            Decision::Reject(HandshakeError::SessionUnknown(NodeId(2)))
        );
    }
}
