//! The results: the JSON report's structs, medians and ratios over rounds,
//! and the table printed on stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::surelink_pair::SurelinkStats;
use super::Contender;

/// The whole report, as written to `bench.json`.
#[derive(Serialize)]
pub(super) struct Report {
    pub(super) settings: Settings,
    pub(super) latency: Vec<LatencyCase>,
    pub(super) throughput: Vec<ThroughputCase>,
    pub(super) surelink_stats: SurelinkStats,
    /// What the contenders' servers reported (e.g. `nats-server` warnings).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) notes: Vec<String>,
}

#[derive(Serialize)]
pub(super) struct Settings {
    pub(super) rounds: usize,
    pub(super) seconds: f64,
    pub(super) warmup_seconds: f64,
    pub(super) quick: bool,
    pub(super) cpus: usize,
    pub(super) started_unix_s: u64,
    /// The contenders measured: how each is set up and tuned.
    pub(super) contenders: BTreeMap<Contender, String>,
    /// The contenders not measured, and why.
    pub(super) skipped: BTreeMap<Contender, String>,
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

/// surelink / one other contender for the three percentiles.
#[derive(Serialize)]
struct LatencyRatios {
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
}

/// One latency case: payload size and callers, every contender.
#[derive(Serialize)]
pub(super) struct LatencyCase {
    pub(super) payload: usize,
    pub(super) callers: usize,
    /// Each contender's rounds and medians, under its name.
    #[serde(flatten)]
    pub(super) sides: BTreeMap<Contender, LatencySide>,
    /// surelink / contender, per other contender.
    ratio: BTreeMap<Contender, LatencyRatios>,
    /// surelink p50 - contender p50, microseconds, per other contender.
    p50_diff_us: BTreeMap<Contender, f64>,
}

impl LatencyCase {
    pub(super) fn new(
        payload: usize,
        callers: usize,
        mut sides: BTreeMap<Contender, LatencySide>,
    ) -> LatencyCase {
        sides.values_mut().for_each(LatencySide::finish);
        let mut ratio = BTreeMap::new();
        let mut p50_diff_us = BTreeMap::new();
        if let Some(s) = sides.get(&Contender::Surelink).map(|s| &s.median) {
            for (&who, side) in sides.iter().filter(|(&c, _)| c != Contender::Surelink) {
                let t = &side.median;
                ratio.insert(
                    who,
                    LatencyRatios {
                        p50: self::ratio(s.p50_us, t.p50_us),
                        p99: self::ratio(s.p99_us, t.p99_us),
                        p999: self::ratio(s.p999_us, t.p999_us),
                    },
                );
                p50_diff_us.insert(who, s.p50_us - t.p50_us);
            }
        }
        LatencyCase {
            payload,
            callers,
            sides,
            ratio,
            p50_diff_us,
        }
    }
}

/// One throughput round of one contender.
#[derive(Debug, Serialize)]
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
    /// Messages sent that never arrived (an at-most-once contender only).
    pub(super) lost: u64,
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

/// One throughput case, every contender.
#[derive(Serialize)]
pub(super) struct ThroughputCase {
    payload: usize,
    /// Each contender's rounds and medians, under its name.
    #[serde(flatten)]
    sides: BTreeMap<Contender, ThroughputSide>,
    /// surelink msgs/s / contender msgs/s, per other contender.
    ratio_msgs_per_s: BTreeMap<Contender, Option<f64>>,
}

impl ThroughputCase {
    pub(super) fn new(payload: usize, rounds: BTreeMap<Contender, Vec<ThroughputRound>>) -> Self {
        let sides: BTreeMap<_, _> = rounds
            .into_iter()
            .map(|(who, r)| (who, ThroughputSide::new(r)))
            .collect();
        let ratio_msgs_per_s = match sides.get(&Contender::Surelink) {
            Some(s) => sides
                .iter()
                .filter(|(&c, _)| c != Contender::Surelink)
                .map(|(&c, t)| (c, ratio(s.median_msgs_per_s, t.median_msgs_per_s)))
                .collect(),
            None => BTreeMap::new(),
        };
        ThroughputCase {
            payload,
            sides,
            ratio_msgs_per_s,
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

fn ratio(surelink: f64, other: f64) -> Option<f64> {
    (other > 0.0).then(|| surelink / other)
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

/// The contenders of the report, in order, and the others (not surelink).
fn columns(r: &Report) -> (Vec<Contender>, Vec<Contender>) {
    let all: Vec<Contender> = r.settings.contenders.keys().copied().collect();
    let others = all
        .iter()
        .copied()
        .filter(|&c| c != Contender::Surelink)
        .collect();
    (all, others)
}

/// Value columns, then ratio columns; `left` is the row's first two cells.
fn row(s: &mut String, left: (&str, &str), values: &[String], ratios: &[String], width: usize) {
    let _ = write!(s, "{:<10} {:<8} |", left.0, left.1);
    for v in values {
        let _ = write!(s, " {v:>width$}");
    }
    let _ = write!(s, " |");
    for v in ratios {
        let _ = write!(s, " {v:>10}");
    }
    s.push('\n');
}

/// The header row: one column per contender, one ratio column per other.
fn header(s: &mut String, first: &str, all: &[Contender], others: &[Contender], width: usize) {
    let names: Vec<String> = all.iter().map(|c| c.name().to_owned()).collect();
    let vs: Vec<String> = others.iter().map(|c| format!("vs {}", c.name())).collect();
    row(s, (first, ""), &names, &vs, width);
    let len = 20 + (width + 1) * all.len() + 2 + 11 * others.len();
    let _ = writeln!(s, "{}", "-".repeat(len));
}

pub(super) fn render_table(r: &Report) -> String {
    let mut s = String::new();
    let (all, others) = columns(r);
    let _ = writeln!(
        s,
        "\nsurelink bench: medians of {} round(s) x {:.2} s per contender and case; ratio = surelink / contender",
        r.settings.rounds, r.settings.seconds
    );
    for (who, why) in &r.settings.skipped {
        let _ = writeln!(s, "SKIPPED {}: {why}", who.name());
    }
    if !r.latency.is_empty() {
        latency_table(&mut s, r, &all, &others);
    }
    if !r.throughput.is_empty() {
        throughput_table(&mut s, r, &all, &others);
    }
    for note in &r.notes {
        let _ = writeln!(s, "NOTE: {note}");
    }
    s
}

/// The latency table: per case, p50/p99/p99.9 and calls/s per contender, a
/// ratio column per other contender, and the p50 differences.
fn latency_table(s: &mut String, r: &Report, all: &[Contender], others: &[Contender]) {
    let fmt_us = |v: f64| format!("{v:.1}");
    const W: usize = 10;
    let _ = writeln!(s, "\nRound-trip latency (µs; ratio > 1: surelink slower)");
    header(s, "case", all, others, W);
    for c in &r.latency {
        let case = format!("{} B x{}", c.payload, c.callers);
        let value = |who: &Contender, f: fn(&LatencyMedians) -> f64| {
            c.sides
                .get(who)
                .map_or_else(|| "-".to_owned(), |side| fmt_us(f(&side.median)))
        };
        let ratio_of = |who: &Contender, f: fn(&LatencyRatios) -> Option<f64>| {
            fmt_ratio(c.ratio.get(who).and_then(f))
        };
        type Stat = (
            &'static str,
            fn(&LatencyMedians) -> f64,
            fn(&LatencyRatios) -> Option<f64>,
        );
        let stats: [Stat; 3] = [
            ("p50", |m| m.p50_us, |r| r.p50),
            ("p99", |m| m.p99_us, |r| r.p99),
            ("p99.9", |m| m.p999_us, |r| r.p999),
        ];
        for (i, (name, get, get_ratio)) in stats.into_iter().enumerate() {
            let values: Vec<String> = all.iter().map(|w| value(w, get)).collect();
            let ratios: Vec<String> = others.iter().map(|w| ratio_of(w, get_ratio)).collect();
            row(
                s,
                (if i == 0 { &case } else { "" }, name),
                &values,
                &ratios,
                W,
            );
        }
        let calls: Vec<String> = all
            .iter()
            .map(|w| {
                c.sides
                    .get(w)
                    .map_or_else(|| "-".to_owned(), |x| thousands(x.median.calls_per_s))
            })
            .collect();
        let diffs: Vec<String> = others
            .iter()
            .map(|w| {
                c.p50_diff_us
                    .get(w)
                    .map_or_else(|| "-".to_owned(), |d| format!("{d:+.1}µs"))
            })
            .collect();
        row(s, ("", "calls/s"), &calls, &[], W);
        row(s, ("", "Δp50"), &vec![String::new(); all.len()], &diffs, W);
    }
    let errors: Vec<String> = all
        .iter()
        .filter_map(|who| {
            let n: u64 = r
                .latency
                .iter()
                .filter_map(|c| c.sides.get(who))
                .flat_map(|side| &side.rounds)
                .map(|x| x.errors)
                .sum();
            (n > 0).then(|| format!("{} {n}", who.name()))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(
            s,
            "WARNING: failed calls: {} (see bench.json)",
            errors.join(", ")
        );
    }
}

/// The throughput table: per payload, msgs/s and MB/s per contender, a
/// ratio column per other contender, and what was dropped.
fn throughput_table(s: &mut String, r: &Report, all: &[Contender], others: &[Contender]) {
    const W: usize = 12;
    let _ = writeln!(
        s,
        "\nOne-way pipelined throughput, delivered at the receiver (ratio < 1: surelink slower)"
    );
    header(s, "payload", all, others, W);
    for c in &r.throughput {
        let case = format!("{} B", c.payload);
        let get = |f: fn(&ThroughputSide) -> String| -> Vec<String> {
            all.iter()
                .map(|w| c.sides.get(w).map_or_else(|| "-".to_owned(), f))
                .collect()
        };
        let ratios: Vec<String> = others
            .iter()
            .map(|w| fmt_ratio(c.ratio_msgs_per_s.get(w).copied().flatten()))
            .collect();
        row(
            s,
            (&case, "msgs/s"),
            &get(|x| thousands(x.median_msgs_per_s)),
            &ratios,
            W,
        );
        row(
            s,
            ("", "MB/s"),
            &get(|x| format!("{:.1}", x.median_mb_per_s)),
            &[],
            W,
        );
    }
    for who in all {
        let (lost, sent) = r
            .throughput
            .iter()
            .filter_map(|c| c.sides.get(who))
            .flat_map(|side| &side.rounds)
            .fold((0, 0), |(l, s), x| (l + x.lost, s + x.sent));
        if lost > 0 {
            let _ = writeln!(
                s,
                "NOTE: {} dropped {} of {} messages sent (at-most-once delivery; see bench.json)",
                who.name(),
                thousands(lost as f64),
                thousands(sent as f64)
            );
        }
    }
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

    #[test]
    fn cases_serialize_contenders_by_name_with_a_ratio_each() {
        let round = |p50: f64| LatencyRound {
            round: 1,
            calls: 10,
            errors: 0,
            first_error: None,
            seconds: 1.0,
            calls_per_s: 10.0,
            p50_us: p50,
            p99_us: 2.0 * p50,
            p999_us: 3.0 * p50,
            max_us: 4.0 * p50,
            mean_us: p50,
        };
        let mut sides = BTreeMap::new();
        for (who, p50) in [
            (Contender::Surelink, 30.0),
            (Contender::Tcp, 20.0),
            (Contender::Nats, 60.0),
        ] {
            let mut side = LatencySide::new().unwrap();
            side.rounds.push(round(p50));
            sides.insert(who, side);
        }
        let case = LatencyCase::new(64, 1, sides);
        let json = serde_json::to_value(&case).unwrap();
        assert_eq!(json["surelink"]["median"]["p50_us"], 30.0);
        assert_eq!(json["nats"]["median"]["p50_us"], 60.0);
        assert_eq!(json["ratio"]["tcp"]["p50"], 1.5);
        assert_eq!(json["ratio"]["nats"]["p50"], 0.5);
        assert_eq!(json["p50_diff_us"]["tcp"], 10.0);
        assert!(json["ratio"].get("surelink").is_none());

        let report = Report {
            settings: Settings {
                rounds: 1,
                seconds: 1.0,
                warmup_seconds: 0.2,
                quick: false,
                cpus: 2,
                started_unix_s: 0,
                contenders: [Contender::Surelink, Contender::Tcp, Contender::Nats]
                    .into_iter()
                    .map(|c| (c, String::new()))
                    .collect(),
                skipped: [(Contender::Zeromq, "not built".to_owned())].into(),
                ratio: "surelink / contender",
                latency_unit: "microseconds",
                goodput_unit: "MB/s",
            },
            latency: vec![case],
            throughput: Vec::new(),
            surelink_stats: SurelinkStats::default(),
            notes: vec!["a note".to_owned()],
        };
        let table = render_table(&report);
        assert!(table.contains("SKIPPED zeromq: not built"), "{table}");
        assert!(table.contains("vs tcp"), "{table}");
        assert!(table.contains("vs nats"), "{table}");
        assert!(!table.contains("vs surelink"), "{table}");
        assert!(
            table.contains("1.50x") && table.contains("0.50x"),
            "{table}"
        );
        assert!(table.contains("NOTE: a note"), "{table}");
    }
}
