//! The one look of every figure the lab draws (the demo's timeline, the
//! bench's latency CDF, the experiments' timelines): the font, panel
//! layout, line width, the fault window's shade, legend samples and the
//! legend box. The plot modules say what to draw; how it looks is here.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// TrueType fonts tried for "sans-serif" (the ab_glyph backend has no
/// system fonts).
pub(crate) const FONT_CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// A figure's title.
pub(crate) const TITLE: (&str, u32) = ("sans-serif", 20);
/// A panel's caption.
pub(crate) const CAPTION: (&str, u32) = ("sans-serif", 18);
/// Width of every data line and marker line.
pub(crate) const LINE: u32 = 2;
/// The fault window's shade.
pub(crate) const FAULT_SHADE: RGBColor = RGBColor(230, 230, 230);
/// Shades for successive marked spans (the demo's faults).
pub(crate) const SPAN_SHADES: [RGBColor; 2] = [RGBColor(255, 224, 178), FAULT_SHADE];
/// A marker line (an injected fault's instant).
pub(crate) const MARKER: RGBColor = RGBColor(120, 0, 160);
/// A second kind of marker line (a fence).
pub(crate) const FENCE: RGBColor = RGBColor(255, 140, 0);

/// Registers a TTF as "sans-serif". `SURELINK_BENCH_FONT` overrides the
/// search.
pub(crate) fn register_sans_serif() -> bool {
    let from_env = std::env::var("SURELINK_BENCH_FONT").ok();
    for path in from_env.iter().map(String::as_str).chain(FONT_CANDIDATES) {
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        // plotters keeps the font for the rest of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
            return true;
        }
    }
    false
}

/// [`register_sans_serif`], failing when no font is found.
pub(crate) fn require_font() -> Result<()> {
    anyhow::ensure!(
        register_sans_serif(),
        "no TrueType font found (set SURELINK_BENCH_FONT)"
    );
    Ok(())
}

/// A panel on `area` with the house margins and label areas, captioned
/// `caption` (none when empty).
pub(crate) fn panel<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    caption: &str,
    caption_size: u32,
) -> ChartBuilder<'a, 'static, BitMapBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    if !caption.is_empty() {
        b.caption(caption, (CAPTION.0, caption_size));
    }
    b.margin(10).x_label_area_size(35).y_label_area_size(70);
    b
}

/// A line series' legend sample.
pub(crate) fn line_legend(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(LINE))
}

/// A scatter series' legend sample.
pub(crate) fn dot_legend(color: RGBColor) -> impl Fn((i32, i32)) -> Circle<(i32, i32), i32> {
    move |(x, y)| Circle::new((x, y), 3, color.filled())
}

/// A shaded span's legend sample.
pub(crate) fn span_legend(color: RGBColor) -> impl Fn((i32, i32)) -> Rectangle<(i32, i32)> {
    move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], color.filled())
}

/// Draws the chart's legend box at `pos`.
pub(crate) fn draw_legend<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, CT>,
    pos: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
