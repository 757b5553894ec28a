//! Faults a run can inject, and seeded random schedules of them.

use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One fault, at a virtual time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Link `link` drops everything in both directions for `dur`.
    LinkDown {
        /// Index into the simulator's links.
        link: usize,
        /// Start.
        at: Duration,
        /// Length.
        dur: Duration,
    },
    /// Link `link` drops everything in one direction only (`a_to_b` or back).
    OneWay {
        /// Index into the simulator's links.
        link: usize,
        /// Which direction fails.
        a_to_b: bool,
        /// Start.
        at: Duration,
        /// Length.
        dur: Duration,
    },
    /// Link `link` drops each transmission with probability `percent`/100,
    /// in one direction (`Some(a_to_b)`) or both (`None`).
    Loss {
        /// Index into the simulator's links.
        link: usize,
        /// Drop probability in percent.
        percent: u8,
        /// Which direction suffers: `Some(true)` a to b, `Some(false)` b to a,
        /// `None` both.
        one_way: Option<bool>,
        /// Start.
        at: Duration,
        /// Length.
        dur: Duration,
    },
    /// The connection on link `link` is reset (both ends notice).
    Reset {
        /// Index into the simulator's links.
        link: usize,
        /// When.
        at: Duration,
    },
    /// Node `node`'s process is frozen for `dur` (GC pause, SIGSTOP).
    Pause {
        /// Node index.
        node: usize,
        /// Start.
        at: Duration,
        /// Length.
        dur: Duration,
    },
    /// Node `node`'s process dies and restarts with a new epoch.
    Restart {
        /// Node index.
        node: usize,
        /// When.
        at: Duration,
    },
    /// The helper carrying link `link` (`SimConfig::helper_links`) is
    /// frozen for `dur`: it holds what it has and sends nothing.
    HelperPause {
        /// Index into the simulator's links.
        link: usize,
        /// Start.
        at: Duration,
        /// Length.
        dur: Duration,
    },
    /// The helper carrying link `link` dies with what it holds (a new
    /// one is dialled after `reconnect_after`).
    HelperCrash {
        /// Index into the simulator's links.
        link: usize,
        /// When.
        at: Duration,
    },
}

impl Fault {
    /// When the fault starts.
    pub fn at(&self) -> Duration {
        match self {
            Fault::LinkDown { at, .. }
            | Fault::OneWay { at, .. }
            | Fault::Loss { at, .. }
            | Fault::Reset { at, .. }
            | Fault::Pause { at, .. }
            | Fault::Restart { at, .. }
            | Fault::HelperPause { at, .. }
            | Fault::HelperCrash { at, .. } => *at,
        }
    }

    /// When the fault's effect ends (start for instant faults).
    pub fn end(&self) -> Duration {
        match self {
            Fault::LinkDown { at, dur, .. }
            | Fault::OneWay { at, dur, .. }
            | Fault::Loss { at, dur, .. }
            | Fault::Pause { at, dur, .. }
            | Fault::HelperPause { at, dur, .. } => *at + *dur,
            Fault::Reset { at, .. } | Fault::Restart { at, .. } | Fault::HelperCrash { at, .. } => {
                *at
            }
        }
    }
}

/// Knobs for drawing random fault schedules.
#[derive(Clone, Debug)]
pub struct ScheduleSpec {
    /// Faults are placed in `[0, window)`.
    pub window: Duration,
    /// How many faults.
    pub count: usize,
    /// Longest link outage / loss period / pause.
    pub max_duration: Duration,
    /// Allow process restarts.
    pub restarts: bool,
    /// Allow pauses.
    pub pauses: bool,
}

/// Draws a schedule from a seed, for `links` links and `nodes` nodes.
pub fn random_schedule(seed: u64, links: usize, nodes: usize, spec: &ScheduleSpec) -> Vec<Fault> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_FA17);
    let window = spec.window.as_millis().max(1) as u64;
    let maxd = spec.max_duration.as_millis().max(1) as u64;
    let mut out = Vec::with_capacity(spec.count);
    for _ in 0..spec.count {
        let at = Duration::from_millis(rng.random_range(0..window));
        let dur = Duration::from_millis(rng.random_range(1..=maxd));
        let link = rng.random_range(0..links);
        let node = rng.random_range(0..nodes);
        let kinds = 4 + usize::from(spec.pauses) + usize::from(spec.restarts);
        let f = match rng.random_range(0..kinds) {
            0 => Fault::LinkDown { link, at, dur },
            1 => Fault::OneWay {
                link,
                a_to_b: rng.random_bool(0.5),
                at,
                dur,
            },
            2 => Fault::Loss {
                link,
                percent: rng.random_range(1..=50),
                one_way: match rng.random_range(0..3u8) {
                    0 => Some(true),
                    1 => Some(false),
                    _ => None,
                },
                at,
                dur,
            },
            3 => Fault::Reset { link, at },
            4 if spec.pauses => Fault::Pause { node, at, dur },
            _ => Fault::Restart { node, at },
        };
        out.push(f);
    }
    out.sort_by_key(Fault::at);
    out
}
