//! The cluster demo's timeline: answers per second and p99 latency per
//! 100 ms, with the faults marked.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::memload::Sample;
use crate::plot_style::{
    self, draw_legend, line_legend, panel, span_legend, LINE, MARKER, SPAN_SHADES, TITLE,
};

/// A fault on the timeline (ms since the start).
pub(super) enum Marker {
    Line(f64, &'static str),
    Span(f64, f64, &'static str),
}

const BUCKET_NS: u64 = 100_000_000;

/// Draws the timeline into `path`; `Ok(false)` when no font is found.
pub(super) fn timeline(
    path: &Path,
    samples: &[Sample],
    seconds: u64,
    markers: &[Marker],
) -> Result<bool> {
    timeline_titled(
        path,
        "surelink demo: memcached clients through the proxy while faults hit",
        samples,
        seconds,
        markers,
    )
}

/// [`timeline`] under another title.
pub(super) fn timeline_titled(
    path: &Path,
    title: &str,
    samples: &[Sample],
    seconds: u64,
    markers: &[Marker],
) -> Result<bool> {
    if !plot_style::register_sans_serif() {
        return Ok(false);
    }
    let n = usize::try_from(seconds * 10 + 10)?;
    let mut done = vec![0u64; n];
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); n];
    for s in samples {
        if s.done_ns != u64::MAX {
            if let Some(b) = done.get_mut(usize::try_from(s.done_ns / BUCKET_NS)?) {
                *b += 1;
            }
        }
        if let (Some(l), Some(b)) = (
            s.latency_us(),
            lat.get_mut(usize::try_from(s.sched_ns / BUCKET_NS)?),
        ) {
            b.push(l);
        }
    }
    let x = |i: usize| i as f64 * 0.1;
    let ops: Vec<(f64, f64)> = done
        .iter()
        .enumerate()
        .map(|(i, c)| (x(i), *c as f64 * 10.0))
        .collect();
    let p99: Vec<(f64, f64)> = lat
        .iter_mut()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(i, v)| {
            v.sort_unstable();
            let k = (v.len() - 1) * 99 / 100;
            (x(i), (v[k] as f64 / 1000.0).max(0.01))
        })
        .collect();
    let xmax = seconds as f64 + 1.0;
    let root = BitMapBackend::new(path, (1100, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, TITLE)?;
    let (top, bottom) = root.split_vertically(300);
    let ymax = ops.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.15;
    let mut c1 = panel(&top, "", 0).build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
    c1.configure_mesh()
        .x_desc("seconds")
        .y_desc("answers per second")
        .draw()?;
    draw_markers(&mut c1, markers, 0.0, ymax)?;
    c1.draw_series(LineSeries::new(ops, BLUE.stroke_width(LINE)))?
        .label("answers/s (per 100 ms)")
        .legend(line_legend(BLUE));
    draw_legend(&mut c1, SeriesLabelPosition::LowerLeft)?;
    let lmax = p99.iter().map(|p| p.1).fold(1.0, f64::max) * 2.0;
    let mut c2 = panel(&bottom, "", 0).build_cartesian_2d(0.0..xmax, (0.01..lmax).log_scale())?;
    c2.configure_mesh()
        .x_desc("seconds (request's scheduled time)")
        .y_desc("p99 latency, ms")
        .draw()?;
    draw_markers(&mut c2, markers, 0.01, lmax)?;
    c2.draw_series(LineSeries::new(p99, RED.stroke_width(LINE)))?
        .label("p99 latency (per 100 ms, from the scheduled time)")
        .legend(line_legend(RED));
    draw_legend(&mut c2, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(true)
}

type Chart<'a, 'b, Y> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

fn draw_markers<Y>(c: &mut Chart<'_, '_, Y>, markers: &[Marker], y0: f64, y1: f64) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    let mut shade = SPAN_SHADES.iter().cycle();
    for m in markers {
        match *m {
            Marker::Line(t, label) => {
                let t = t / 1000.0;
                c.draw_series(LineSeries::new(
                    [(t, y0), (t, y1)],
                    MARKER.stroke_width(LINE),
                ))?
                .label(label)
                .legend(line_legend(MARKER));
            }
            Marker::Span(a, b, label) => {
                let color = *shade.next().unwrap_or(&SPAN_SHADES[0]);
                c.draw_series(std::iter::once(Rectangle::new(
                    [(a / 1000.0, y0), (b / 1000.0, y1)],
                    color.filled(),
                )))?
                .label(label)
                .legend(span_legend(color));
            }
        }
    }
    Ok(())
}
