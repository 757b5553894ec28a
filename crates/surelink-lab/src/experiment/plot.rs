//! Timelines drawn by the experiments: the detector's (messages arriving at
//! the receiver around a 2 s stall of the sender's heartbeat thread, one
//! panel per detector, the receiver's report and the sender's fence marked)
//! and failover's (every request's latency around a fault, one panel per
//! contender).

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::plot_style::{
    dot_legend, draw_legend, line_legend, panel, require_font, CAPTION, FAULT_SHADE, FENCE, LINE,
    TITLE,
};

/// One panel.
pub(crate) struct Lane {
    pub(crate) title: String,
    /// (ms from the fault, from the sender's first incarnation).
    pub(crate) arrivals: Vec<(f64, bool)>,
    pub(crate) report_ms: Option<f64>,
    pub(crate) fenced_ms: Option<f64>,
    pub(crate) fault_ms: (f64, f64),
}

/// Draws the lanes stacked into `path`.
pub(crate) fn timeline(path: &Path, lanes: &[Lane]) -> Result<()> {
    require_font()?;
    let height = 280 * u32::try_from(lanes.len().max(1)).unwrap_or(1);
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((lanes.len().max(1), 1));
    for (lane, area) in lanes.iter().zip(panels.iter()) {
        let (x0, x1) = (-1000.0, 4500.0);
        let shown: Vec<(f64, f64, bool)> = lane
            .arrivals
            .iter()
            .filter(|(t, _)| (x0..=x1).contains(t))
            .enumerate()
            .map(|(i, (t, first))| (*t, i as f64, *first))
            .collect();
        let ymax = shown.len().max(1) as f64;
        let mut chart =
            panel(area, &lane.title, CAPTION.1).build_cartesian_2d(x0..x1, 0.0..ymax * 1.05)?;
        chart
            .configure_mesh()
            .x_desc("ms since the fault began")
            .y_desc("messages received")
            .draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(lane.fault_ms.0, 0.0), (lane.fault_ms.1, ymax * 1.05)],
            FAULT_SHADE.filled(),
        )))?;
        chart
            .draw_series(
                shown
                    .iter()
                    .filter(|p| p.2)
                    .map(|p| Circle::new((p.0, p.1), 1, BLUE.filled())),
            )?
            .label("first incarnation")
            .legend(dot_legend(BLUE));
        chart
            .draw_series(
                shown
                    .iter()
                    .filter(|p| !p.2)
                    .map(|p| Circle::new((p.0, p.1), 1, GREEN.filled())),
            )?
            .label("new incarnation (after the fence)")
            .legend(dot_legend(GREEN));
        if let Some(r) = lane.report_ms {
            chart
                .draw_series(LineSeries::new(
                    [(r, 0.0), (r, ymax * 1.05)],
                    RED.stroke_width(LINE),
                ))?
                .label("receiver reports the sender dead")
                .legend(line_legend(RED));
        }
        if let Some(f) = lane.fenced_ms {
            chart
                .draw_series(LineSeries::new(
                    [(f, 0.0), (f, ymax * 1.05)],
                    FENCE.stroke_width(LINE),
                ))?
                .label("sender notices its fence, starts a new epoch")
                .legend(line_legend(FENCE));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}

/// One panel of a latency timeline.
pub(crate) struct LatencyLane {
    pub(crate) title: String,
    /// (request sent, ms since the fault began; its latency, ms).
    pub(crate) points: Vec<(f64, f64)>,
}

/// Every request's latency against the time it was sent, one panel per
/// contender stacked, the fault window shaded: a failover shows as a
/// spike whose height is how long the caught requests waited, a gap in
/// the dots as requests that were never answered.
pub(crate) fn latency_timeline(
    path: &Path,
    title: &str,
    lanes: &[LatencyLane],
    fault_ms: (f64, f64),
) -> Result<()> {
    require_font()?;
    let n = lanes.len().max(1);
    let height = 60 + 240 * u32::try_from(n).unwrap_or(1);
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, TITLE)?;
    let panels = root.split_evenly((n, 1));
    let (x0, x1) = (-1000.0, 5800.0);
    let (y0, y1) = (0.01f64, 10_000.0f64);
    for (lane, area) in lanes.iter().zip(panels.iter()) {
        let mut chart =
            panel(area, &lane.title, 16).build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("request sent, ms since the fault began")
            .y_desc("latency, ms")
            .draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(fault_ms.0, y0), (fault_ms.1, y1)],
            FAULT_SHADE.filled(),
        )))?;
        chart.draw_series(
            lane.points
                .iter()
                .filter(|(x, _)| (x0..=x1).contains(x))
                .map(|&(x, y)| Circle::new((x, y.clamp(y0, y1)), 1, BLUE.filled())),
        )?;
    }
    root.present()?;
    Ok(())
}
