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

use std::collections::VecDeque;

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

/// Bytes of role messages a session holds each way: two of the longest
/// (a peer cannot make a session hold [`ROLE_QUEUE`] × 1 MiB).
pub const ROLE_QUEUE_BYTES: usize = 2 * MAX_ROLE_MESSAGE;

/// A role queue bounded in messages and bytes; full, it drops its oldest.
#[derive(Debug, Default)]
pub(super) struct RoleQueue {
    q: VecDeque<Bytes>,
    bytes: usize,
}

impl RoleQueue {
    /// Appends `m` (at most [`MAX_ROLE_MESSAGE`] long); returns how many
    /// older messages were dropped to make room.
    fn push(&mut self, m: Bytes) -> u64 {
        let mut dropped = 0;
        while !self.q.is_empty()
            && (self.q.len() >= ROLE_QUEUE || self.bytes + m.len() > ROLE_QUEUE_BYTES)
        {
            self.pop();
            dropped += 1;
        }
        self.bytes += m.len();
        self.q.push_back(m);
        dropped
    }

    fn pop(&mut self) -> Option<Bytes> {
        let m = self.q.pop_front()?;
        self.bytes -= m.len();
        Some(m)
    }

    fn front(&self) -> Option<&Bytes> {
        self.q.front()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

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
    /// is active; if [`ROLE_QUEUE`] messages or [`ROLE_QUEUE_BYTES`] are
    /// already waiting the oldest are dropped (the role protocol re-sends
    /// what matters).
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
        self.stats.role_dropped += self.role_out.push(message);
        Ok(())
    }

    /// The next role message the peer sent, oldest first. The session
    /// authenticated nothing beyond the path: the sender is
    /// [`Session::peer`], proven by the path's handshake when the
    /// endpoint is secure.
    pub fn poll_role(&mut self) -> Option<Bytes> {
        self.role_in.pop()
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

    /// Among healthy (unsuspected, not avoided) paths, new traffic goes
    /// to those on the networks whose bit is set in `prefer` first — a
    /// helper's path while a client is helped. A preferred path that is
    /// suspected (its frames timed out) loses to a healthy one, so a
    /// frozen helper does not hold the traffic. 0 (the default): none.
    pub fn set_preferred_networks(&mut self, prefer: u8) {
        self.prefer = prefer;
    }

    /// The networks new traffic prefers.
    pub fn preferred_networks(&self) -> u8 {
        self.prefer
    }

    /// The networks new traffic is steered away from.
    pub fn avoided_networks(&self) -> u8 {
        self.avoid
    }

    /// Per network the driver named (`set_path_network`), the smallest
    /// smoothed round trip among its active paths: what the role service
    /// reports for a peer it lists.
    pub fn network_rtts(&self) -> Vec<(u8, std::time::Duration)> {
        let mut out: Vec<(u8, std::time::Duration)> = Vec::new();
        for p in self
            .paths
            .iter()
            .filter(|p| p.phase == super::paths::Phase::Active)
        {
            let Some(n) = p.network else { continue };
            match out.iter_mut().find(|(m, _)| *m == n) {
                Some((_, r)) => *r = (*r).min(p.rtt.srtt),
                None => out.push((n, p.rtt.srtt)),
            }
        }
        out
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
        self.stats.role_received += 1;
        self.stats.role_dropped += self.role_in.push(body);
    }

    /// The path queued role messages go to, if any may go now.
    pub(super) fn role_path(&self) -> Option<usize> {
        if self.role_out.is_empty() || self.peer.is_none() {
            return None;
        }
        paths::select(
            &self.paths,
            self.last_path,
            &self.cfg,
            self.avoid,
            self.prefer,
        )
        .or_else(|| {
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
            let Some(m) = self.role_out.pop() else {
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
