//! Helpers' loads in the role service (PostMan, issue 28): a helper
//! reports its relay address and its load to the role server
//! ([`HelperReport`]), which carries the helpers that reported lately in
//! every node's row ([`HelperEntry`]). A client about to move then ranks
//! the helpers it drew from the row it holds — no query, no round trip —
//! and asks them directly only when its row does not list them all (no
//! role service, or a helper that has not reported).
//!
//! The load travels as a coarse *level* (about the base-2 logarithm of
//! the helper's rank: records relayed a second, then clients), because
//! every change of a row is a push to every node: a level moves when the
//! load doubles or halves, not with each record ([`Leveler`] adds
//! hysteresis), and the role server takes a change of levels alone at
//! most once per [`HELPERS_HOLD_REFRESHES`] refreshes (a helper coming or
//! going — stale, or marked down in the ring — at once). Two helpers on one
//! level are equally light: the client takes the first it drew (the draw
//! is random), which spreads clients moving at once over them instead of
//! sending them all to a helper that is a few records lighter.
//!
//! A level says nothing a client must trust: it only orders helpers the
//! client was configured with (matched by address), and it comes from an
//! authenticated helper through an authenticated role server.

use std::net::SocketAddr;

use crate::ids::NodeId;

/// Highest level (a rank of 2^62 or more).
pub const MAX_LEVEL: u8 = 63;

/// A change of the helpers' levels alone (no route or ring changed, no
/// helper come or gone) makes a new table version at most once per this
/// many refreshes (1 s by default).
pub const HELPERS_HOLD_REFRESHES: u32 = 10;

/// Reports in a row a level one step from the published one must hold
/// before it is published (two or more steps are published at once).
pub const LEVEL_HOLD_REPORTS: u8 = 3;

/// A helper's report to the role server, every refresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelperReport {
    /// The helper; must be the authenticated sender.
    pub helper: NodeId,
    /// Increases with each report of one helper process.
    pub seq: u64,
    /// Where clients connect to it (its `[helper] listen`).
    pub addr: SocketAddr,
    /// Its load level ([`load_level`]).
    pub level: u8,
}

/// A helper as a node's row lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelperEntry {
    /// The helper.
    pub node: NodeId,
    /// Where clients connect to it.
    pub addr: SocketAddr,
    /// Its load level: lower is lighter.
    pub level: u8,
}

/// The level of a load rank (`HelperLoad::rank`): 0 for 0, else its
/// bit length, at most [`MAX_LEVEL`].
pub fn load_level(rank: u64) -> u8 {
    let bits = u64::BITS - rank.leading_zeros();
    u8::try_from(bits).unwrap_or(MAX_LEVEL).min(MAX_LEVEL)
}

/// A helper's published level, with hysteresis: a load hovering at a
/// level's edge would otherwise change every node's row at each report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Leveler {
    published: Option<u8>,
    /// A level one step away and how many reports in a row said it.
    pending: Option<(u8, u8)>,
}

impl Leveler {
    /// The level to publish now that the load's rank is `rank`.
    pub fn level(&mut self, rank: u64) -> u8 {
        let now = load_level(rank);
        let Some(p) = self.published else {
            self.published = Some(now);
            return now;
        };
        if now.abs_diff(p) >= 2 {
            self.published = Some(now);
            self.pending = None;
        } else if now == p {
            self.pending = None;
        } else {
            let seen = match self.pending {
                Some((l, n)) if l == now => n.saturating_add(1),
                _ => 1,
            };
            if seen >= LEVEL_HOLD_REPORTS {
                self.published = Some(now);
                self.pending = None;
            } else {
                self.pending = Some((now, seen));
            }
        }
        self.published.unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_bit_lengths() {
        assert_eq!(load_level(0), 0);
        assert_eq!(load_level(1), 1);
        assert_eq!(load_level(2), 2);
        assert_eq!(load_level(3), 2);
        assert_eq!(load_level(1024), 11);
        assert_eq!(load_level(u64::MAX), MAX_LEVEL);
    }

    #[test]
    fn a_load_at_a_level_edge_does_not_flap() {
        let mut l = Leveler::default();
        assert_eq!(l.level(1000), 10);
        // Across the edge at 1024 and back, again and again: stays.
        for _ in 0..10 {
            assert_eq!(l.level(1030), 10);
            assert_eq!(l.level(1000), 10);
        }
        // One step held for three reports: taken.
        assert_eq!(l.level(1030), 10);
        assert_eq!(l.level(1030), 10);
        assert_eq!(l.level(1030), 11);
        // Two steps or more: at once, either way.
        assert_eq!(l.level(5000), 13);
        assert_eq!(l.level(0), 0);
    }
}
