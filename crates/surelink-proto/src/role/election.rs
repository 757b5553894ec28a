//! A candidate's side: when to take over as role server, and which epoch.

use std::collections::HashSet;
use std::time::Duration;

use crate::ids::NodeId;
use crate::time::Time;

use super::RoleConfig;

/// What a candidate should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CandidacyAction {
    /// Start a role server for `epoch` (this node owns it).
    TakeOver {
        /// The epoch to claim: the smallest this node owns above every
        /// epoch it has seen.
        epoch: u64,
    },
}

/// One candidate's view: the highest role epoch seen and which candidates
/// the detector reported dead.
#[derive(Clone, Debug)]
pub struct Candidacy {
    cfg: RoleConfig,
    me: NodeId,
    seen_epoch: u64,
    dead: HashSet<NodeId>,
    /// Until then, a starting candidate claims nothing: it listens to the
    /// nodes' reports for the newest epoch (a restarted process must not
    /// claim one below a serving server's).
    listen_until: Time,
    /// How long a starting (or restarting) candidate listens.
    listen: Duration,
    serving: Option<u64>,
}

impl Candidacy {
    /// A candidate starting at `now`; it listens for `listen` before
    /// claiming an epoch when it has seen none.
    pub fn new(cfg: RoleConfig, me: NodeId, now: Time, listen: Duration) -> Self {
        Candidacy {
            cfg,
            me,
            seen_epoch: 0,
            dead: HashSet::new(),
            listen_until: now + listen,
            listen,
            serving: None,
        }
    }

    /// This process fenced itself (SafeTimer: a heartbeat missed its
    /// deadline, so peers may have reported it dead and another candidate
    /// may be taking over) and goes on as a new incarnation: it serves
    /// nothing and listens again before it claims an epoch, as a restarted
    /// process does, keeping the epochs it has seen. Without this, the
    /// owner of the newest epoch would claim the next one at once — while
    /// its fence is still shut, so that server is fenced too, and so on —
    /// or take the role back from a successor it has not heard of yet.
    pub fn handle_fenced(&mut self, now: Time) {
        self.serving = None;
        self.listen_until = now + self.listen;
    }

    /// An epoch this node learned of (a table it applied, an ack that
    /// carried it). A newer epoch than the one served ends the serving.
    pub fn handle_epoch(&mut self, epoch: u64) {
        self.seen_epoch = self.seen_epoch.max(epoch);
        if self.serving.is_some_and(|e| e < epoch) {
            self.serving = None;
        }
    }

    /// The highest epoch seen.
    pub fn seen_epoch(&self) -> u64 {
        self.seen_epoch
    }

    /// The detector reported `node` dead (SafeTimer: it is fenced).
    pub fn handle_peer_dead(&mut self, node: NodeId) {
        if node != self.me {
            self.dead.insert(node);
        }
    }

    /// A new incarnation of `node` is connected.
    pub fn handle_peer_alive(&mut self, node: NodeId) {
        self.dead.remove(&node);
    }

    /// This node's role server stopped (fenced or stepped down).
    pub fn handle_server_stopped(&mut self) {
        self.serving = None;
    }

    /// The epoch this node serves, if any.
    pub fn serving(&self) -> Option<u64> {
        self.serving
    }

    /// Whether this node should take over now.
    pub fn poll(&mut self, now: Time) -> Option<CandidacyAction> {
        if self.serving.is_some() {
            return None;
        }
        self.cfg.candidate_index(self.me)?;
        // A starting process listens first, whatever it has seen: the
        // nodes' reports tell it the newest epoch.
        if now < self.listen_until {
            return None;
        }
        let n = self.cfg.candidates.len();
        let start = if self.seen_epoch == 0 {
            0
        } else {
            let owner = self.cfg.owner(self.seen_epoch)?;
            if owner == self.me {
                // This process restarted (or stepped down and is the
                // owner again): it is alive, so it is the one to go on.
                let epoch = self.cfg.next_epoch_of(self.me, self.seen_epoch)?;
                self.serving = Some(epoch);
                self.seen_epoch = epoch;
                return Some(CandidacyAction::TakeOver { epoch });
            }
            if !self.dead.contains(&owner) {
                return None;
            }
            // The candidates after the owner, in order, the owner last.
            (self.cfg.candidate_index(owner)? + 1) % n
        };
        let next = (0..n)
            .map(|k| self.cfg.candidates.get((start + k) % n).copied())
            .find(|c| c.is_some_and(|c| c == self.me || !self.dead.contains(&c)))
            .flatten()?;
        if next != self.me {
            return None;
        }
        let epoch = self.cfg.next_epoch_of(self.me, self.seen_epoch)?;
        self.serving = Some(epoch);
        self.seen_epoch = epoch;
        Some(CandidacyAction::TakeOver { epoch })
    }
}
