//! The results: the JSON report's structs, medians and ratios over rounds,
//! and the table printed on stdout.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use surelink::StatsSnapshot;

use super::fixture::SurelinkPair;

/// The whole report, as written to `bench.json`.
#[derive(Serialize)]
pub(super) struct Report {
    pub(super) settings: Settings,
    pub(super) latency: Vec<LatencyCase>,
    pub(super) throughput: Vec<ThroughputCase>,
    pub(super) surelink_stats: SurelinkStats,
}

#[derive(Serialize)]
pub(super) struct Settings {
    pub(super) rounds: usize,
    pub(super) seconds: f64,
    pub(super) warmup_seconds: f64,
    pub(super) quick: bool,
    pub(super) cpus: usize,
    pub(super) started_unix_s: u64,
    pub(super) surelink_config: &'static str,
    pub(super) baseline: &'static str,
    pub(super) ratio: &'static str,
    pub(super) latency_unit: &'static str,
    pub(super) goodput_unit: &'static str,
}

/// Round trips recorded in nanoseconds, 1 ns .. 100 s, 3 significant digits.
pub(super) fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).context("histogram bounds")
}

pub(super) fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

/// One latency round of one contender.
#[derive(Serialize)]
pub(super) struct LatencyRound {
    pub(super) round: usize,
    pub(super) calls: u64,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    pub(super) seconds: f64,
    pub(super) calls_per_s: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) p999_us: f64,
    pub(super) max_us: f64,
    pub(super) mean_us: f64,
}

/// Medians over rounds.
#[derive(Serialize)]
struct LatencyMedians {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    calls_per_s: f64,
}

/// One contender in one latency case.
#[derive(Serialize)]
pub(super) struct LatencySide {
    pub(super) rounds: Vec<LatencyRound>,
    median: LatencyMedians,
    /// Percentiles of all rounds' calls together: (percentile, µs).
    all_rounds_percentiles: Vec<(f64, f64)>,
    #[serde(skip)]
    pub(super) merged: Histogram<u64>,
}

impl LatencySide {
    pub(super) fn new() -> Result<LatencySide> {
        Ok(LatencySide {
            rounds: Vec::new(),
            median: LatencyMedians {
                p50_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                calls_per_s: 0.0,
            },
            all_rounds_percentiles: Vec::new(),
            merged: new_histogram()?,
        })
    }

    fn finish(&mut self) {
        let m = |f: fn(&LatencyRound) -> f64| median(self.rounds.iter().map(f));
        self.median = LatencyMedians {
            p50_us: m(|r| r.p50_us),
            p99_us: m(|r| r.p99_us),
            p999_us: m(|r| r.p999_us),
            calls_per_s: m(|r| r.calls_per_s),
        };
        if !self.merged.is_empty() {
            self.all_rounds_percentiles = [50.0, 90.0, 99.0, 99.9, 99.99, 100.0]
                .iter()
                .map(|&p| (p, us(&self.merged, p / 100.0)))
                .collect();
        }
    }
}

/// surelink / TCP for the three percentiles.
#[derive(Serialize)]
struct LatencyRatios {
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
}

/// One latency case: payload size and callers, both contenders.
#[derive(Serialize)]
pub(super) struct LatencyCase {
    pub(super) payload: usize,
    pub(super) callers: usize,
    pub(super) surelink: LatencySide,
    pub(super) tcp: LatencySide,
    ratio: LatencyRatios,
    /// surelink p50 - TCP p50, microseconds.
    p50_diff_us: f64,
}

impl LatencyCase {
    pub(super) fn new(
        payload: usize,
        callers: usize,
        mut surelink: LatencySide,
        mut tcp: LatencySide,
    ) -> LatencyCase {
        surelink.finish();
        tcp.finish();
        let (s, t) = (&surelink.median, &tcp.median);
        LatencyCase {
            payload,
            callers,
            ratio: LatencyRatios {
                p50: ratio(s.p50_us, t.p50_us),
                p99: ratio(s.p99_us, t.p99_us),
                p999: ratio(s.p999_us, t.p999_us),
            },
            p50_diff_us: s.p50_us - t.p50_us,
            surelink,
            tcp,
        }
    }
}

/// One throughput round of one contender.
#[derive(Serialize)]
pub(super) struct ThroughputRound {
    pub(super) round: usize,
    /// Messages the receiver took inside the window.
    pub(super) delivered: u64,
    /// The window's length.
    pub(super) seconds: f64,
    pub(super) msgs_per_s: f64,
    pub(super) mb_per_s: f64,
    /// Messages the sender queued in the whole round (warm-up included).
    pub(super) sent: u64,
    /// `sent` over the sender's running time: above `msgs_per_s` means a
    /// backlog built up in buffers.
    pub(super) offered_msgs_per_s: f64,
    /// Time for the backlog to arrive after the sender stopped.
    pub(super) drain_seconds: f64,
}

/// One contender in one throughput case.
#[derive(Serialize)]
struct ThroughputSide {
    rounds: Vec<ThroughputRound>,
    median_msgs_per_s: f64,
    median_mb_per_s: f64,
}

impl ThroughputSide {
    fn new(rounds: Vec<ThroughputRound>) -> ThroughputSide {
        ThroughputSide {
            median_msgs_per_s: median(rounds.iter().map(|r| r.msgs_per_s)),
            median_mb_per_s: median(rounds.iter().map(|r| r.mb_per_s)),
            rounds,
        }
    }
}

/// One throughput case, both contenders.
#[derive(Serialize)]
pub(super) struct ThroughputCase {
    payload: usize,
    surelink: ThroughputSide,
    tcp: ThroughputSide,
    /// surelink msgs/s / TCP msgs/s.
    ratio_msgs_per_s: Option<f64>,
}

impl ThroughputCase {
    pub(super) fn new(
        payload: usize,
        surelink: Vec<ThroughputRound>,
        tcp: Vec<ThroughputRound>,
    ) -> Self {
        let (surelink, tcp) = (ThroughputSide::new(surelink), ThroughputSide::new(tcp));
        ThroughputCase {
            payload,
            ratio_msgs_per_s: ratio(surelink.median_msgs_per_s, tcp.median_msgs_per_s),
            surelink,
            tcp,
        }
    }
}

/// The endpoints' own counters at the end of the run (were both paths used,
/// was anything re-sent).
#[derive(Serialize)]
pub(super) struct SurelinkStats {
    client: EndpointStats,
    server: EndpointStats,
}

#[derive(Serialize)]
struct EndpointStats {
    messages_sent: u64,
    messages_received: u64,
    bytes_sent: u64,
    bytes_received: u64,
    calls: u64,
    call_errors: u64,
    paths_up: u64,
    paths_down: u64,
    resent: u64,
    timeouts: u64,
    paths: Vec<PathStats>,
}

#[derive(Serialize)]
struct PathStats {
    id: String,
    active: bool,
    srtt_us: f64,
    data_sent: u64,
    data_received: u64,
    resent: u64,
    timeouts: u64,
}

impl SurelinkStats {
    pub(super) fn collect(pair: &SurelinkPair) -> SurelinkStats {
        SurelinkStats {
            client: EndpointStats::from(&pair.client.stats()),
            server: EndpointStats::from(&pair.server.stats()),
        }
    }
}

impl From<&StatsSnapshot> for EndpointStats {
    fn from(s: &StatsSnapshot) -> Self {
        let sessions = s.sessions.iter().map(|(_, st)| st);
        EndpointStats {
            messages_sent: s.messages_sent,
            messages_received: s.messages_received,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            calls: s.calls,
            call_errors: s.call_errors,
            paths_up: s.paths_up,
            paths_down: s.paths_down,
            resent: sessions.clone().map(|st| st.resent).sum(),
            timeouts: sessions.clone().map(|st| st.timeouts).sum(),
            paths: sessions
                .flat_map(|st| st.paths.iter())
                .map(|p| PathStats {
                    id: p.id.to_string(),
                    active: p.active,
                    srtt_us: p.srtt.as_secs_f64() * 1e6,
                    data_sent: p.stats.data_sent,
                    data_received: p.stats.data_received,
                    resent: p.stats.resent,
                    timeouts: p.stats.timeouts,
                })
                .collect(),
        }
    }
}

/// Median; the mean of the middle two for an even count; 0 when empty.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn ratio(surelink: f64, tcp: f64) -> Option<f64> {
    (tcp > 0.0).then(|| surelink / tcp)
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

/// `1234567.8` as `1,234,568`.
pub(super) fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))
}

pub(super) fn render_table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nsurelink bench: medians of {} round(s) x {:.2} s per contender and case; ratio = surelink / plain TCP",
        r.settings.rounds, r.settings.seconds
    );
    if !r.latency.is_empty() {
        let _ = writeln!(s, "\nRound-trip latency (µs; ratio > 1: surelink slower)");
        let _ = writeln!(
            s,
            "{:<14} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>7} {:>7} {:>7} | {:>8} | {:>9} {:>9}",
            "case", "sl p50", "sl p99", "sl p99.9", "tcp p50", "tcp p99", "tcp p99.9",
            "p50", "p99", "p99.9", "Δp50 µs", "sl call/s", "tcp call/s"
        );
        let _ = writeln!(s, "{}", "-".repeat(132));
        for c in &r.latency {
            let (sl, t) = (&c.surelink.median, &c.tcp.median);
            let _ = writeln!(
                s,
                "{:<14} | {:>8.1} {:>8.1} {:>8.1} | {:>8.1} {:>8.1} {:>8.1} | {:>7} {:>7} {:>7} | {:>+8.1} | {:>9} {:>9}",
                format!("{} B x{}", c.payload, c.callers),
                sl.p50_us,
                sl.p99_us,
                sl.p999_us,
                t.p50_us,
                t.p99_us,
                t.p999_us,
                fmt_ratio(c.ratio.p50),
                fmt_ratio(c.ratio.p99),
                fmt_ratio(c.ratio.p999),
                c.p50_diff_us,
                thousands(sl.calls_per_s),
                thousands(t.calls_per_s),
            );
        }
        let errors: u64 = r
            .latency
            .iter()
            .flat_map(|c| c.surelink.rounds.iter().chain(&c.tcp.rounds))
            .map(|x| x.errors)
            .sum();
        if errors > 0 {
            let _ = writeln!(s, "WARNING: {errors} failed calls (see bench.json)");
        }
    }
    if !r.throughput.is_empty() {
        let _ = writeln!(
            s,
            "\nOne-way pipelined throughput, delivered at the receiver (ratio < 1: surelink slower)"
        );
        let _ = writeln!(
            s,
            "{:<8} | {:>12} {:>9} | {:>12} {:>9} | {:>7}",
            "payload", "sl msgs/s", "sl MB/s", "tcp msgs/s", "tcp MB/s", "msgs/s"
        );
        let _ = writeln!(s, "{}", "-".repeat(70));
        for c in &r.throughput {
            let _ = writeln!(
                s,
                "{:<8} | {:>12} {:>9.1} | {:>12} {:>9.1} | {:>7}",
                format!("{} B", c.payload),
                thousands(c.surelink.median_msgs_per_s),
                c.surelink.median_mb_per_s,
                thousands(c.tcp.median_msgs_per_s),
                c.tcp.median_mb_per_s,
                fmt_ratio(c.ratio_msgs_per_s),
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_formatting() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
        assert_eq!(median(std::iter::empty()), 0.0);
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(ratio(2.0, 0.0), None);
    }
}
