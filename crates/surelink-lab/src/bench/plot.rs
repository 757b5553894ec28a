//! Latency by percentile, one panel per case: x = round trip (µs, log
//! scale), y = percentile on a "nines" scale (0, 90, 99, 99.9, ...), so
//! both the body and the tail are visible. The look is
//! [`crate::plot_style`]'s.

use std::path::Path;

use anyhow::Result;
use hdrhistogram::Histogram;
use plotters::prelude::*;

use super::report::LatencyCase;
use super::Contender;
use crate::plot_style::{self, draw_legend, line_legend, panel, FONT_CANDIDATES, LINE};

/// Percentile as "nines": -log10(1 - q), capped at `top`.
fn nines(q: f64, top: f64) -> f64 {
    if q >= 1.0 {
        top
    } else {
        (-(1.0 - q).log10()).clamp(0.0, top)
    }
}

fn nines_label(y: f64) -> String {
    const LABELS: [&str; 7] = ["0", "90", "99", "99.9", "99.99", "99.999", "99.9999"];
    LABELS
        .iter()
        .enumerate()
        .find(|(k, _)| (y - *k as f64).abs() < 1e-6)
        .map_or_else(String::new, |(_, l)| format!("{l}%"))
}

/// The histogram's CDF as (µs, nines) points.
fn cdf(h: &Histogram<u64>, top: f64) -> Vec<(f64, f64)> {
    let mut points = vec![(h.min() as f64 / 1e3, 0.0)];
    points.extend(
        h.iter_recorded()
            .map(|v| (v.value_iterated_to() as f64 / 1e3, nines(v.quantile(), top))),
    );
    points
}

/// A contender's line colour.
fn color(who: Contender) -> RGBColor {
    match who {
        Contender::Surelink => BLUE,
        Contender::SurelinkInsecure => RGBColor(120, 120, 220),
        Contender::Tcp => RED,
        Contender::Zeromq => RGBColor(0, 150, 0),
        Contender::Nats => RGBColor(230, 140, 0),
        Contender::Grpc => RGBColor(120, 60, 170),
    }
}

/// Draws `path`. Returns false (after a warning) when no font is found.
pub(super) fn latency_cdf(path: &Path, cases: &[LatencyCase]) -> Result<bool> {
    if !plot_style::register_sans_serif() {
        eprintln!(
            "warning: no TTF font found (tried {}; set SURELINK_BENCH_FONT to one); {} not written",
            FONT_CANDIDATES.join(", "),
            path.display()
        );
        return Ok(false);
    }
    let cols = if cases.len() > 1 { 2 } else { 1 };
    let rows = cases.len().div_ceil(cols);
    let width = u32::try_from(cols * 640)?;
    let height = u32::try_from(rows * 420)? + 50;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(50);
    let others: Vec<&str> = cases
        .first()
        .map(|c| {
            c.sides
                .keys()
                .filter(|&&w| w != Contender::Surelink)
                .map(|w| w.label())
                .collect()
        })
        .unwrap_or_default();
    title.draw_text(
        &format!(
            "Round-trip latency by percentile, all rounds: surelink (2 paths) vs {}",
            others.join(", ")
        ),
        &(plot_style::TITLE.0, 22).into_font().color(&BLACK),
        (20, 15),
    )?;
    let panels = body.split_evenly((rows, cols));
    for (case, area) in cases.iter().zip(panels.iter()) {
        let sides: Vec<_> = case
            .sides
            .iter()
            .map(|(&who, side)| (who.label(), &side.merged, color(who)))
            .collect();
        let count = sides.iter().map(|(_, h, _)| h.len()).min().unwrap_or(0);
        // As many nines as there are samples to support them.
        let steps: usize = match count {
            0..1_000 => 2,
            1_000..10_000 => 3,
            10_000..100_000 => 4,
            100_000..1_000_000 => 5,
            _ => 6,
        };
        let top = f64::from(u32::try_from(steps)?);
        let series: Vec<_> = sides
            .iter()
            .filter(|(_, h, _)| !h.is_empty())
            .map(|(name, h, color)| (*name, cdf(h, top), *color))
            .collect();
        let xs = series
            .iter()
            .flat_map(|(_, p, _)| p.iter().map(|&(x, _)| x));
        let lo = xs.clone().fold(f64::INFINITY, f64::min).max(0.1) * 0.8;
        let hi = xs.fold(0.0, f64::max).max(lo * 2.0) * 1.25;
        let callers = if case.callers == 1 {
            "1 caller".to_owned()
        } else {
            format!("{} concurrent callers", case.callers)
        };
        let mut chart = panel(
            area,
            &format!("{} B payload, {callers}", case.payload),
            plot_style::CAPTION.1,
        )
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("round trip (µs, log scale)")
            .y_desc("percentile")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_labels(4 * steps + 1)
            .y_label_formatter(&|y| nines_label(*y))
            .draw()?;
        for (name, points, color) in series {
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(LINE)))?
                .label(name)
                .legend(line_legend(color));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(true)
}
