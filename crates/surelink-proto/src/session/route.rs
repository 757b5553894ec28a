//! The role service's share of a session: role messages in and out as
//! ROUTE_UPDATE frames, and the routing table's policy over which paths
//! carry new traffic.
//!
//! Role messages are not numbered like application messages: the role
//! protocol acknowledges tables and refreshes reports itself, so a frame
//! lost with a failing path is re-sent by that protocol, not by the
//! retransmit cache. Both queues are short and drop their oldest entry
//! when full: a newer report or table supersedes an older one, and a peer
//! flooding us with role frames cannot make us hold more than a few.

use bytes::{Bytes, BytesMut};
use thiserror::Error;

use super::paths;
use super::Session;
use crate::ids::PathId;
use crate::role::MAX_ROLE_MESSAGE;
use crate::time::Time;
use crate::wire::{encode_route_update, HEADER_LEN};

/// Role messages a session holds each way.
pub const ROLE_QUEUE: usize = 16;

/// Why a role message was not queued.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RoleSendError {
    /// Longer than the role protocol's limit or than the peer accepts.
    #[error("role message of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The session has ended.
    #[error("the session has ended")]
    Ended,
}

impl Session {
    /// Queues one encoded role message (see
    /// [`role::encode`](crate::role::encode)) for the peer. It goes out
    /// ahead of new data on the path new data would take, as soon as one
    /// is active; if [`ROLE_QUEUE`] messages are already waiting the
    /// oldest is dropped (the role protocol re-sends what matters).
    pub fn send_role(&mut self, now: Time, message: Bytes) -> Result<(), RoleSendError> {
        self.tick(now);
        if self.ended.is_some() {
            return Err(RoleSendError::Ended);
        }
        let max = self.role_limit();
        if message.len() > max {
            return Err(RoleSendError::TooLarge {
                len: message.len(),
                max,
            });
        }
        if self.role_out.len() >= ROLE_QUEUE {
            self.role_out.pop_front();
            self.stats.role_dropped += 1;
        }
        self.role_out.push_back(message);
        Ok(())
    }

    /// The next role message the peer sent, oldest first. The session
    /// authenticated nothing beyond the path: the sender is
    /// [`Session::peer`], proven by the path's handshake when the
    /// endpoint is secure.
    pub fn poll_role(&mut self) -> Option<Bytes> {
        self.role_in.pop_front()
    }

    /// Says which network `path` runs on (an index into the cluster's
    /// networks, below 8), so the routing table's policy can apply to it.
    /// `false` if the session does not hold the path.
    pub fn set_path_network(&mut self, path: PathId, network: u8) -> bool {
        match self.path_index(path) {
            Some(i) => {
                self.paths[i].network = Some(network);
                true
            }
            None => false,
        }
    }

    /// Steers new traffic away from the networks whose bit is set in
    /// `avoid` (bit `n` = network `n`): their paths carry new and re-sent
    /// messages only when no other path is usable. The routing table sets
    /// this; 0 (the default) uses every network alike.
    pub fn set_avoided_networks(&mut self, avoid: u8) {
        self.avoid = avoid;
    }

    /// The networks new traffic is steered away from.
    pub fn avoided_networks(&self) -> u8 {
        self.avoid
    }

    /// The longest role message the peer accepts.
    fn role_limit(&self) -> usize {
        let peer = self.peer.map_or(usize::MAX, |p| {
            usize::try_from(p.max_message).unwrap_or(usize::MAX)
        });
        MAX_ROLE_MESSAGE.min(peer)
    }

    /// A ROUTE_UPDATE frame arrived.
    pub(super) fn on_route_update(&mut self, body: Bytes) {
        if self.role_in.len() >= ROLE_QUEUE {
            self.role_in.pop_front();
            self.stats.role_dropped += 1;
        }
        self.stats.role_received += 1;
        self.role_in.push_back(body);
    }

    /// The path queued role messages go to, if any may go now.
    pub(super) fn role_path(&self) -> Option<usize> {
        if self.role_out.is_empty() || self.peer.is_none() {
            return None;
        }
        paths::select(&self.paths, self.last_path, &self.cfg, self.avoid).or_else(|| {
            self.paths
                .iter()
                .position(|p| p.phase == paths::Phase::Active)
        })
    }

    /// Writes queued role messages to `buf` (at least one, then up to
    /// `budget` bytes).
    pub(super) fn write_role(&mut self, buf: &mut BytesMut, budget: usize) {
        let max = self.role_limit();
        let start = buf.len();
        while let Some(m) = self.role_out.front() {
            if buf.len() > start && buf.len() - start + HEADER_LEN + m.len() > budget {
                break;
            }
            let Some(m) = self.role_out.pop_front() else {
                break;
            };
            if m.len() > max {
                // Queued before the peer's limit was known.
                self.stats.role_dropped += 1;
                continue;
            }
            encode_route_update(buf, &m);
            self.stats.role_sent += 1;
        }
    }
}
