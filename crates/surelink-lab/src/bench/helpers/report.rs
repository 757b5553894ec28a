//! `bench helpers`' table (medians over rounds, per arm and offered load)
//! and its plot: p99 and the server's CPU per request against offered
//! load, one line per arm.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::{HelpersArgs, Step};
use crate::plot_style::{self, draw_legend, line_legend, panel};

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians of one arm at one rate: goodput, p50, p99, server µs/req,
/// all µs/req, client core %, invalid rounds.
pub(super) struct Row {
    pub(super) arm: String,
    pub(super) rate: f64,
    pub(super) goodput: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) server_us: f64,
    pub(super) detector_us: f64,
    pub(super) total_us: f64,
    pub(super) client_core: f64,
    pub(super) invalid: usize,
    pub(super) rounds: usize,
    pub(super) errors: f64,
    pub(super) max_gap_ms: f64,
}

pub(super) fn rows(steps: &[Step]) -> Vec<Row> {
    let mut keys: Vec<(String, f64)> = Vec::new();
    for s in steps {
        if !keys.iter().any(|(a, r)| *a == s.arm && *r == s.rate) {
            keys.push((s.arm.clone(), s.rate));
        }
    }
    keys.into_iter()
        .map(|(arm, rate)| {
            let of: Vec<&Step> = steps
                .iter()
                .filter(|s| s.arm == arm && s.rate == rate)
                .collect();
            let m = |f: &dyn Fn(&Step) -> f64| median(of.iter().map(|s| f(s)).collect());
            Row {
                goodput: m(&|s| s.window.completed as f64 / s.seconds),
                p50: m(&|s| s.window.p50_us),
                p99: m(&|s| s.window.p99_us),
                server_us: m(&|s| s.server_us_per_req),
                detector_us: m(&|s| s.server_detector_us_per_req),
                total_us: m(&|s| s.total_us_per_req),
                client_core: m(&|s| s.client_core_pct),
                invalid: of.iter().filter(|s| s.invalid).count(),
                errors: m(&|s| s.window.errors as f64),
                max_gap_ms: m(&|s| s.window.max_gap_ms),
                rounds: of.len(),
                arm,
                rate,
            }
        })
        .collect()
}

pub(super) fn print(steps: &[Step], a: &HelpersArgs) {
    println!(
        "\nbench helpers: {} clients, {} B requests, server capped at {} % of core 0; load and helpers on core 1 (medians of {} rounds)\n",
        a.clients, a.payload, a.quota_pct, a.rounds
    );
    println!(
        "| arm | offered/s | goodput/s | p50 µs | p99 µs | server µs/req | of it detector | all µs/req | client core % | invalid | errors | longest gap ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows(steps) {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} | {}/{} | {:.0} | {:.1} |",
            r.arm,
            r.rate,
            r.goodput,
            r.p50,
            r.p99,
            r.server_us,
            r.detector_us,
            r.total_us,
            r.client_core,
            r.invalid,
            r.rounds,
            r.errors,
            r.max_gap_ms
        );
    }
    let rs = rows(steps);
    // Each batching arm against its own direct arm; and surelink's
    // against what users run today.
    for (arm, base) in [
        ("self_clocking", "direct"),
        ("adaptive", "direct"),
        ("nutcracker", "memcached"),
        ("self_clocking", "nutcracker"),
        ("direct", "memcached"),
    ] {
        for r in rs.iter().filter(|r| r.arm == arm) {
            if let Some(d) = rs.iter().find(|d| d.arm == base && d.rate == r.rate) {
                println!(
                    "{arm} at {:.0}/s: server CPU per request {:.2}× {base}'s, p99 {:.2}× {base}'s{}",
                    r.rate,
                    r.server_us / d.server_us,
                    r.p99 / d.p99,
                    if r.invalid > 0 || d.invalid > 0 { " (a step was invalid)" } else { "" }
                );
            }
        }
    }
}

fn color(arm: &str) -> RGBColor {
    match arm {
        "direct" => RED,
        "self_clocking" => BLUE,
        "activation" => RGBColor(150, 0, 150),
        "activation_full_handshake" => RGBColor(220, 120, 220),
        "memcached" => RGBColor(120, 120, 120),
        "nutcracker" => RGBColor(230, 140, 0),
        _ => RGBColor(0, 150, 0),
    }
}

pub(super) fn plot(path: &Path, steps: &[Step]) -> Result<()> {
    if !plot_style::register_sans_serif() {
        eprintln!("warning: no TTF font found; {} not written", path.display());
        return Ok(());
    }
    let rs = rows(steps);
    let root = BitMapBackend::new(path, (1280, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(640);
    let max_rate = rs.iter().map(|r| r.rate).fold(1.0, f64::max) * 1.05;
    let arms: Vec<String> = {
        let mut v: Vec<String> = rs.iter().map(|r| r.arm.clone()).collect();
        v.dedup();
        v.sort();
        v.dedup();
        v
    };
    type Pick = fn(&Row) -> f64;
    let panels: [(
        &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
        &str,
        Pick,
    ); 2] = [
        (&left, "p99 round trip (µs)", |r| r.p99),
        (&right, "server CPU per request (µs)", |r| r.server_us),
    ];
    for (area, label, pick) in panels {
        // Logarithmic: a saturated arm's seconds and the others'
        // milliseconds on one panel.
        let finite = || rs.iter().map(pick).filter(|v| v.is_finite() && *v > 0.0);
        let top = finite().fold(1.0, f64::max) * 1.5;
        let bottom = finite().fold(top, f64::min).max(0.1) / 1.5;
        let mut chart =
            panel(area, label, 20).build_cartesian_2d(0.0..max_rate, (bottom..top).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("offered load (requests/s)")
            .y_desc(label)
            .draw()?;
        for arm in &arms {
            let pts: Vec<(f64, f64)> = rs
                .iter()
                .filter(|r| &r.arm == arm)
                .map(|r| (r.rate, pick(r).max(bottom)))
                .collect();
            let c = color(arm);
            chart
                .draw_series(LineSeries::new(
                    pts.clone(),
                    c.stroke_width(plot_style::LINE),
                ))?
                .label(arm.as_str())
                .legend(line_legend(c));
            // Hollow: a round of this point saturated the client core.
            chart.draw_series(rs.iter().filter(|r| &r.arm == arm).map(|r| {
                let style = if r.invalid > 0 {
                    c.stroke_width(2)
                } else {
                    c.filled()
                };
                Circle::new((r.rate, pick(r).max(bottom)), 5, style)
            }))?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}
