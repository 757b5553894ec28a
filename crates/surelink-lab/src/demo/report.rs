//! The demo's report: what the answers add up to, per-phase rows, the
//! JSON file.

use std::path::Path;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;

use super::cluster::{Phase, Timeline};
use crate::memload::{Outcome, Sample};

/// What the answers add up to.
#[derive(Debug, Default, serde::Serialize)]
pub(super) struct Counts {
    pub(super) errors: u64,
    pub(super) fabric_misses: u64,
    pub(super) expected_misses: u64,
    /// Misses of keys in the shard whose recoveries emptied it, answered
    /// after its fault began.
    pub(super) shard_misses: u64,
    pub(super) stale: u64,
    pub(super) wrong: u64,
    /// The longest a command for the victim's keys, sent while it was
    /// dead, waited for its answer.
    pub(super) victim_wait_ns: Option<u64>,
}

impl Counts {
    /// `lost`: keys the victim node held (from `kill_ns`); `in_shard`:
    /// keys of the faulty shard (from `shard_ns`).
    pub(super) fn of(
        samples: &[Sample],
        lost: &[bool],
        kill_ns: u64,
        in_shard: &[bool],
        shard_ns: u64,
    ) -> Counts {
        let mut c = Counts::default();
        for s in samples {
            let on_victim = lost.get(s.key as usize).copied().unwrap_or(false);
            let on_shard = in_shard.get(s.key as usize).copied().unwrap_or(false);
            match s.outcome {
                Outcome::Error | Outcome::Unanswered => c.errors += 1,
                Outcome::Stale => c.stale += 1,
                Outcome::Wrong => c.wrong += 1,
                // Answered after the victim died, for a key it held: its
                // item died with it.
                Outcome::Miss { known: true } if on_victim && s.done_ns >= kill_ns => {
                    c.expected_misses += 1;
                }
                // The shard's recoveries emptied it.
                Outcome::Miss { known: true } if on_shard && s.done_ns >= shard_ns => {
                    c.shard_misses += 1;
                }
                Outcome::Miss { known: true } => c.fabric_misses += 1,
                _ => {}
            }
            if on_victim && s.sched_ns >= kill_ns {
                if let Some(l) = s.latency_us() {
                    let w = c.victim_wait_ns.get_or_insert(0);
                    *w = (*w).max(l * 1000);
                }
            }
        }
        c
    }
}

#[derive(Debug, Default, serde::Serialize)]
pub(super) struct Row {
    pub(super) ops: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) p999: f64,
    pub(super) max: f64,
}

/// Throughput (answers in the window, by reply time) and latency
/// (requests scheduled in the window) of one phase.
pub(super) fn phase_row(samples: &[Sample], p: &Phase) -> Result<Row> {
    phase_row_of(samples, p, |_| true)
}

/// [`phase_row`] of the samples `keep` keeps.
pub(super) fn phase_row_of(
    samples: &[Sample],
    p: &Phase,
    keep: impl Fn(&Sample) -> bool,
) -> Result<Row> {
    let mut h = Histogram::<u64>::new(3)?;
    let mut done = 0u64;
    let mut last_done = 0u64;
    for s in samples.iter().filter(|s| keep(s)) {
        if s.done_ns != u64::MAX && (p.from_ns..p.to_ns).contains(&s.done_ns) {
            done += 1;
            last_done = last_done.max(s.done_ns);
        }
        if (p.from_ns..p.to_ns).contains(&s.sched_ns) {
            if let Some(l) = s.latency_us() {
                let _ = h.record(l.max(1));
            }
        }
    }
    let span = if p.to_ns == u64::MAX {
        last_done.saturating_sub(p.from_ns)
    } else {
        p.to_ns - p.from_ns
    };
    let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
    Ok(Row {
        ops: done as f64 / (span as f64 / 1e9).max(1e-9),
        p50: q(0.5),
        p99: q(0.99),
        p999: q(0.999),
        max: h.max() as f64 / 1000.0,
    })
}

pub(super) fn write_json(
    path: &Path,
    rows: &[(&str, Row)],
    all: &Row,
    c: &Counts,
    tl: &Timeline,
) -> Result<()> {
    let phases: serde_json::Map<String, serde_json::Value> = rows
        .iter()
        .map(|(n, r)| Ok(((*n).to_string(), serde_json::to_value(r)?)))
        .collect::<Result<_>>()?;
    let v = serde_json::json!({
        "phases": phases,
        "whole_run": all,
        "counts": c,
        "node_out_after_ms": tl.node_out.map(|(t, _)| t.saturating_sub(tl.kill_node) as f64 / 1e6),
        "node_back_after_ms": tl.node_back.map(|t| t.saturating_sub(tl.restart_node) as f64 / 1e6),
        "connections_killed": tl.connections_killed,
        "proxy_path_down_events": tl.paths_down,
        "role_table_off_network1_after_ms": tl.table_avoid.map(|t| t.saturating_sub(tl.mute.0) as f64 / 1e6),
        "role_table_node_down_after_ms": tl.table_node_down.map(|t| t.saturating_sub(tl.kill_node) as f64 / 1e6),
        "role_tables_applied_by_proxy": tl.tables,
        "shard_recoveries": tl.shard_recoveries,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&v)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
