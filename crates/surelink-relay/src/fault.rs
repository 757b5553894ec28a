//! The faults a link can be in, and the switch every forwarding task of
//! the link watches.
//!
//! A link's faults live in one `tokio::sync::watch` channel: setting a
//! fault is one `send_modify`, and a task held by a blackhole wakes on the
//! change that lifts it (no polling). Killing connections is not a state
//! but an act: see `Link::kill`.

use tokio::sync::watch;

/// A direction through a link. *Up* is client → upstream (what the
/// dialling side sends), *down* is upstream → client (the replies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Direction {
    /// Client → upstream.
    Up,
    /// Upstream → client.
    Down,
    /// Both ways.
    Both,
}

/// The faults a link is in (all off: healthy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Faults {
    /// Client → upstream carries nothing: TCP bytes are held, datagrams
    /// dropped.
    pub blackhole_up: bool,
    /// Upstream → client carries nothing.
    pub blackhole_down: bool,
    /// The TCP listener is closed: connects are refused.
    pub refusing: bool,
    /// Per cent of datagrams dropped at random, each way (0–100).
    pub udp_drop_percent: u8,
}

impl Faults {
    /// No fault is set.
    pub fn is_healthy(&self) -> bool {
        *self == Faults::default()
    }

    /// Whether a blackhole stops traffic going `dir` (`Both`: either way).
    pub fn blocks(&self, dir: Direction) -> bool {
        match dir {
            Direction::Up => self.blackhole_up,
            Direction::Down => self.blackhole_down,
            Direction::Both => self.blackhole_up || self.blackhole_down,
        }
    }

    pub(crate) fn set_blackhole(&mut self, dir: Direction) {
        match dir {
            Direction::Up => self.blackhole_up = true,
            Direction::Down => self.blackhole_down = true,
            Direction::Both => {
                self.blackhole_up = true;
                self.blackhole_down = true;
            }
        }
    }
}

impl std::fmt::Display for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_healthy() {
            return f.write_str("healthy");
        }
        let mut parts = Vec::new();
        match (self.blackhole_up, self.blackhole_down) {
            (true, true) => parts.push("blackhole both ways".to_string()),
            (true, false) => parts.push("blackhole up".to_string()),
            (false, true) => parts.push("blackhole down".to_string()),
            (false, false) => {}
        }
        if self.refusing {
            parts.push("refusing".to_string());
        }
        if self.udp_drop_percent > 0 {
            parts.push(format!("dropping {} % of datagrams", self.udp_drop_percent));
        }
        f.write_str(&parts.join(", "))
    }
}

/// Waits until traffic may go `dir` (returns at once when it may). A
/// closed channel counts as open: the link is going away, and its tasks
/// with it.
pub(crate) async fn open(rx: &mut watch::Receiver<Faults>, dir: Direction) {
    let _ = rx.wait_for(|f| !f.blocks(dir)).await;
}
