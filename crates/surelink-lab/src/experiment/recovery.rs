//! `surelink-lab experiment recovery`: the recovery-conscious scheduling
//! experiment (FAST '08, §5) on the simulator's virtual workers
//! (`surelink_sim::rcs`): performance-oriented vs static vs partially
//! dynamic vs dynamic, on the good path and with 5 % recovery overhead in
//! one group; throughput and response time beside the paper's figures,
//! written as JSON and drawn as bar charts (PNG).
//!
//! Exact and reproducible: the same seed gives the same figures on any
//! machine (virtual time; the core's scheduler decides every dispatch).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde_json::json;

use surelink::proto::rpc::recovery::Mapping;
use surelink_sim::rcs::{RcsOutcome, RcsScenario};

use crate::plot_style::{draw_legend, panel, require_font, span_legend, TITLE};

/// `experiment recovery`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RecoveryArgs {
    /// Virtual seconds per run (after a tenth more of warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seeds: each run is repeated per seed and the medians reported.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Where the JSON and the PNG go.
    #[arg(long, default_value = "target/recovery")]
    out: PathBuf,
}

/// The schedulers, and the paper's throughput (k IO/s) and response time
/// (ms), good path then bad path (Figures 11, 12, 14, 15; the paper gives
/// no bad-path response time for the static and partially dynamic ones
/// beyond "close to their good path").
const SCHEDULERS: [(&str, Mapping, [f64; 4]); 4] = [
    (
        "performance-oriented",
        Mapping::PerformanceOriented,
        [107.0, 13.3, 87.8, 16.6],
    ),
    ("static", Mapping::Static, [44.6, 34.1, 40.4, 37.1]),
    (
        "partially dynamic",
        Mapping::PartiallyDynamic,
        [69.9, 21.7, 69.9, 21.7],
    ),
    ("dynamic", Mapping::Dynamic, [105.0, 13.5, 105.0, 13.5]),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Medians over the seeds: throughput (k/s), mean and p99 response time
/// (ms), healthy requests' p99 (ms).
fn medians(runs: &[RcsOutcome]) -> [f64; 4] {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    [
        median(runs.iter().map(|o| o.throughput / 1e3).collect()),
        median(runs.iter().map(|o| ms(o.mean)).collect()),
        median(runs.iter().map(|o| ms(o.p99)).collect()),
        median(runs.iter().map(|o| ms(o.healthy_p99)).collect()),
    ]
}

/// Runs the experiment.
pub(crate) async fn run(a: &RecoveryArgs) -> Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut rows = Vec::new();
    for bad in [false, true] {
        for (name, mapping, paper) in SCHEDULERS {
            eprintln!(
                "  {name}, {} path: {} seed(s) × {} s…",
                if bad { "bad" } else { "good" },
                a.seeds,
                a.seconds
            );
            let runs: Vec<RcsOutcome> = (1..=a.seeds.max(1))
                .map(|seed| {
                    let mut s = RcsScenario::paper(mapping, bad);
                    s.run_for = Duration::from_secs(a.seconds);
                    s.seed = seed;
                    s.run()
                })
                .collect();
            let m = medians(&runs);
            let (pt, pr) = if bad {
                (paper[2], paper[3])
            } else {
                (paper[0], paper[1])
            };
            rows.push((name, bad, m, [pt, pr]));
        }
    }
    println!(
        "{:<22} {:<5} {:>10} {:>8} {:>9} {:>9} {:>13} | paper: {:>8} {:>8}",
        "scheduler", "path", "k req/s", "ratio", "mean ms", "p99 ms", "healthy p99", "k IO/s", "ms"
    );
    let base = |bad: bool| {
        rows.iter()
            .find(|r| r.0 == "performance-oriented" && r.1 == bad)
            .map_or(1.0, |r| r.2[0])
    };
    for (name, bad, m, p) in &rows {
        println!(
            "{:<22} {:<5} {:>10.1} {:>8.3} {:>9.2} {:>9.2} {:>13.2} | {:>15.1} {:>8.1}",
            name,
            if *bad { "bad" } else { "good" },
            m[0],
            m[0] / base(*bad),
            m[1],
            m[2],
            m[3],
            p[0],
            p[1]
        );
    }
    let json = json!({
        "experiment": "recovery",
        "model": "surelink_sim::rcs::RcsScenario::paper",
        "seconds": a.seconds,
        "seeds": a.seeds,
        "rows": rows.iter().map(|(name, bad, m, p)| json!({
            "scheduler": name,
            "path": if *bad { "bad" } else { "good" },
            "k_requests_per_s": m[0],
            "mean_ms": m[1],
            "p99_ms": m[2],
            "healthy_p99_ms": m[3],
            "paper_k_io_per_s": p[0],
            "paper_ms": p[1],
        })).collect::<Vec<_>>(),
    });
    let json_path = a.out.join("recovery.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)?;
    let png = a.out.join("recovery.png");
    draw(
        &png,
        "Recovery-conscious scheduling on the simulator (16 groups, 8 pools)",
        &rows,
        true,
    )?;
    println!("wrote {} and {}", json_path.display(), png.display());
    Ok(())
}

/// A scheduler's row: name, bad path, [throughput (k/s), mean response
/// (ms), ..], and the paper's [throughput, response].
pub(crate) type Row<'a> = (&'a str, bool, [f64; 4], [f64; 2]);

/// Two panels, throughput and mean response time: per scheduler a bar for
/// the good path and one for the bad path, the paper's as thin bars
/// beside (`with_paper`).
pub(crate) fn draw(
    path: &std::path::Path,
    title: &str,
    rows: &[Row<'_>],
    with_paper: bool,
) -> Result<()> {
    require_font()?;
    let root = BitMapBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, TITLE)?;
    let panels = root.split_evenly((1, 2));
    let good = RGBColor(70, 130, 180);
    let bad = RGBColor(205, 92, 92);
    let paper = RGBColor(150, 150, 150);
    for (i, (area, (caption, measure, paper_i))) in panels
        .iter()
        .zip([
            ("requests/s (k)", 0usize, 0usize),
            ("mean response time (ms)", 1, 1),
        ])
        .enumerate()
    {
        let top = rows
            .iter()
            .flat_map(|r| [r.2[measure], if with_paper { r.3[paper_i] } else { 0.0 }])
            .fold(0.0f64, f64::max)
            * 1.25;
        let mut c =
            panel(area, caption, 16).build_cartesian_2d(-0.5f64..3.5f64, 0f64..top.max(1.0))?;
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(5)
            .x_label_formatter(&|x| {
                let k = x.round();
                if (x - k).abs() > 1e-6 || k < 0.0 {
                    return String::new();
                }
                SCHEDULERS
                    .get(k as usize)
                    .map_or(String::new(), |s| s.0.to_string())
            })
            .draw()?;
        for (k, (name, _, _)) in SCHEDULERS.iter().enumerate() {
            let x = k as f64;
            for (path_bad, off, color) in [(false, -0.35, good), (true, 0.03, bad)] {
                let Some(r) = rows.iter().find(|r| r.0 == *name && r.1 == path_bad) else {
                    continue;
                };
                c.draw_series(std::iter::once(Rectangle::new(
                    [(x + off, 0.0), (x + off + 0.25, r.2[measure])],
                    color.filled(),
                )))?;
                if with_paper {
                    c.draw_series(std::iter::once(Rectangle::new(
                        [(x + off + 0.25, 0.0), (x + off + 0.32, r.3[paper_i])],
                        paper.filled(),
                    )))?;
                }
            }
        }
        if i == 1 {
            let legend = [
                ("good path", good),
                ("bad path (5 % recovery)", bad),
                ("paper", paper),
            ];
            for (label, color) in &legend[..if with_paper { 3 } else { 2 }] {
                let (label, color) = (*label, *color);
                c.draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                    .label(label)
                    .legend(span_legend(color));
            }
            draw_legend(&mut c, SeriesLabelPosition::UpperRight)?;
        }
    }
    root.present()?;
    Ok(())
}
