//! What a scale run measured, and the figures derived from it.

use std::time::Duration;

use surelink_proto::Time;

use super::{BUCKET, PER_SECOND};

/// Measured cost of one kind of role-server work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCost {
    /// How many.
    pub calls: u64,
    /// Their total real time.
    pub total: Duration,
    /// The longest.
    pub max: Duration,
}

impl CallCost {
    pub(super) fn add(&mut self, d: Duration) {
        self.calls += 1;
        self.total += d;
        self.max = self.max.max(d);
    }

    /// Mean per call.
    pub fn mean(&self) -> Duration {
        match u32::try_from(self.calls) {
            Ok(n) if n > 0 => self.total / n,
            _ => Duration::ZERO,
        }
    }
}

/// The role server's measured work, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerCalls {
    /// Decode + `handle_report` (the server's own report: no decode).
    pub report: CallCost,
    /// Decode + `handle_ack`.
    pub ack: CallCost,
    /// `handle_timeout`.
    pub timeout: CallCost,
    /// The first `poll_push` after inputs: it recomputes the table when
    /// dirty (and encodes the push it returns, if any).
    pub first_poll: CallCost,
    /// Every further push: `poll_push` and its encoding (or, for the
    /// server's own row, the local apply).
    pub push: CallCost,
}

/// One new table version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The version.
    pub version: u64,
    /// When the earliest input the server handled before computing it
    /// arrived (or its timer fired, for a change time alone made).
    pub trigger: Time,
    /// When the server computed it.
    pub made: Time,
    /// When every live node held it or a newer one (`None`: never).
    pub all_applied: Option<Time>,
}

impl Change {
    /// From trigger to every live node holding it.
    pub fn push_time(&self) -> Option<Duration> {
        self.all_applied.map(|t| t.saturating_since(self.trigger))
    }
}

/// Progress of a run, handed out once per simulated second.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Simulated time so far.
    pub simulated: Duration,
    /// Real time so far.
    pub real: Duration,
    /// The server's table version.
    pub version: u64,
    /// Messages waiting for the server.
    pub queued: usize,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct ScaleReport {
    /// Nodes.
    pub nodes: usize,
    /// Simulated time.
    pub simulated: Duration,
    /// The role server's measured CPU time per [`BUCKET`].
    pub cpu: Vec<Duration>,
    /// The role server's busy time (CPU + modelled writes) per bucket.
    pub busy: Vec<Duration>,
    /// Bytes from the other nodes to the server per bucket (reports, acks).
    pub up: Vec<u64>,
    /// Bytes from the server to the other nodes per bucket (table rows).
    pub down: Vec<u64>,
    /// Most bytes one node received in any 1 s window.
    pub busiest_node_down: u64,
    /// The server's work by kind.
    pub calls: ServerCalls,
    /// Every new version.
    pub changes: Vec<Change>,
    /// The server's last version.
    pub final_version: u64,
    /// Nodes alive at the end.
    pub live: usize,
    /// Live nodes holding the last version at the end.
    pub holding_final: usize,
    /// The deaf node (index), if any.
    pub deaf_node: Option<usize>,
    /// The node that dies (index), if any.
    pub dead_node: Option<usize>,
    /// Nodes that applied a table in which the deaf node's last network is
    /// avoided between them (for the deaf node: towards every peer).
    pub avoided_deaf: usize,
    /// Live nodes whose table at the end has the dead node `Down`.
    pub saw_death: usize,
    /// Most messages waiting for the server at once.
    pub max_queue: usize,
    /// Longest a message waited for the server.
    pub max_queue_wait: Duration,
    /// Messages that failed to decode (must be 0).
    pub decode_errors: u64,
    /// Real time of the run.
    pub wall: Duration,
    /// CPU time of the thread over the run (the whole simulation), from
    /// `/proc/thread-self/schedstat` (exact to a scheduler tick); `wall`
    /// well above it means the machine was busy and the per-call times
    /// are inflated.
    pub thread_cpu: Option<Duration>,
}

pub(super) fn max_sum_u64(v: &[u64], w: usize) -> u64 {
    v.windows(w.min(v.len()).max(1))
        .map(|s| s.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
}

fn max_sum_dur(v: &[Duration], w: usize) -> Duration {
    v.windows(w.min(v.len()).max(1))
        .map(|s| s.iter().sum::<Duration>())
        .max()
        .unwrap_or_default()
}

impl ScaleReport {
    fn secs(&self) -> f64 {
        self.simulated.as_secs_f64().max(1e-9)
    }

    fn remote(&self) -> f64 {
        (self.nodes.saturating_sub(1)).max(1) as f64
    }

    /// The server's CPU as a percentage of one core: over the run, and in
    /// the busiest 1 s window.
    pub fn cpu_percent(&self) -> (f64, f64) {
        let total: Duration = self.cpu.iter().sum();
        let max = max_sum_dur(&self.cpu, PER_SECOND);
        (
            100.0 * total.as_secs_f64() / self.secs(),
            100.0 * max.as_secs_f64(),
        )
    }

    /// The server's busy time (CPU and modelled writes) as a percentage of
    /// its thread: over the run, and in the busiest 1 s window.
    pub fn busy_percent(&self) -> (f64, f64) {
        let total: Duration = self.busy.iter().sum();
        let max = max_sum_dur(&self.busy, PER_SECOND);
        (
            100.0 * total.as_secs_f64() / self.secs(),
            100.0 * max.as_secs_f64(),
        )
    }

    /// Bytes per node per second sent to the server: over the run, and in
    /// the busiest 1 s window.
    pub fn up_per_node(&self) -> (f64, f64) {
        let total: u64 = self.up.iter().sum();
        let max = max_sum_u64(&self.up, PER_SECOND);
        (
            total as f64 / self.remote() / self.secs(),
            max as f64 / self.remote(),
        )
    }

    /// Bytes per node per second received from the server: over the run,
    /// and in the busiest 1 s window.
    pub fn down_per_node(&self) -> (f64, f64) {
        let total: u64 = self.down.iter().sum();
        let max = max_sum_u64(&self.down, PER_SECOND);
        (
            total as f64 / self.remote() / self.secs(),
            max as f64 / self.remote(),
        )
    }

    /// The server's outgoing bytes per second in the busiest 1 s window.
    pub fn server_out_max(&self) -> u64 {
        max_sum_u64(&self.down, PER_SECOND)
    }

    /// Bytes per node per second, (up, down), between two simulated times
    /// (whole buckets).
    pub fn per_node_between(&self, from: Duration, to: Duration) -> (f64, f64) {
        let b = |d: Duration| usize::try_from(d.as_millis() / BUCKET.as_millis()).unwrap_or(0);
        let (s, e) = (b(from), b(to).min(self.up.len()));
        let secs = to.saturating_sub(from).as_secs_f64().max(1e-9);
        let sum = |v: &[u64]| v.get(s..e).map_or(0, |x| x.iter().sum::<u64>()) as f64;
        (
            sum(&self.up) / self.remote() / secs,
            sum(&self.down) / self.remote() / secs,
        )
    }

    /// The server's CPU as a percentage of one core between two simulated
    /// times (whole buckets).
    pub fn cpu_percent_between(&self, from: Duration, to: Duration) -> f64 {
        let b = |d: Duration| usize::try_from(d.as_millis() / BUCKET.as_millis()).unwrap_or(0);
        let (s, e) = (b(from), b(to).min(self.cpu.len()));
        let secs = to.saturating_sub(from).as_secs_f64().max(1e-9);
        let sum: Duration = self
            .cpu
            .get(s..e)
            .map_or(Duration::ZERO, |x| x.iter().sum());
        100.0 * sum.as_secs_f64() / secs
    }

    /// Push times of the changes triggered in `[from, to)`, sorted; and
    /// how many of those changes never reached every live node.
    pub fn push_times(&self, from: Duration, to: Duration) -> (Vec<Duration>, usize) {
        let (from, to) = (Time::ZERO + from, Time::ZERO + to);
        let mut times = Vec::new();
        let mut never = 0;
        for c in self
            .changes
            .iter()
            .filter(|c| c.trigger >= from && c.trigger < to)
        {
            match c.push_time() {
                Some(d) => times.push(d),
                None => never += 1,
            }
        }
        times.sort();
        (times, never)
    }
}

/// The `q` quantile of sorted durations.
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(i.min(sorted.len() - 1)).copied()
}
