//! The report's charts as inline SVG, drawn with plotters' SVG backend (no system fonts: the
//! browser renders the text).

use crate::results::Results;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

/// Chart size in SVG pixels; the HTML scales it to the page width.
const WIDTH_PX: u32 = 1100;
const HEIGHT_PX: u32 = 360;

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing a chart failed: {e:?}")
}

/// Series colours, chosen to stay apart for readers with the common colour deficiencies.
pub const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
    RGBColor(90, 90, 90),
];

/// Rates per second over the run: offered, successful transactions, orders, cancels, trades.
pub fn rates(r: &Results) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let x_max = (r.per_second.len().max(2) - 1) as f64;
        let y_max = r
            .per_second
            .iter()
            .map(|s| s.offered.max(s.answered).max(s.transactions))
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the start")
            .y_desc("per second")
            .y_label_formatter(&|v| short(*v))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        type Pick = fn(&crate::results::SecondRow) -> u64;
        let series: [(&str, Pick); 5] = [
            ("offered", |s| s.offered),
            ("successful transactions", |s| s.transactions),
            ("orders registered", |s| s.orders),
            ("cancels", |s| s.cancels),
            ("trades", |s| s.trades),
        ];
        for (i, (name, pick)) in series.iter().enumerate() {
            let color = PALETTE[i];
            chart
                .draw_series(LineSeries::new(
                    r.per_second.iter().map(|s| (s.t_s as f64, pick(s) as f64)),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Latency per second (by scheduled time): mean, median and p99 on a log axis.
pub fn latency_over_time(r: &Results) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let x_max = (r.per_second.len().max(2) - 1) as f64;
        let us = |ns: u64| (ns as f64 / 1e3).max(0.1);
        let y_max = r
            .per_second
            .iter()
            .map(|s| s.latency_p99_ns)
            .max()
            .unwrap_or(1000)
            .max(1000) as f64
            / 1e3
            * 2.0;
        let y_min = r
            .per_second
            .iter()
            .filter(|s| s.latency_p50_ns > 0)
            .map(|s| s.latency_p50_ns)
            .min()
            .unwrap_or(1000) as f64
            / 1e3
            / 2.0;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, (y_min.max(0.1)..y_max).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the start (by scheduled send time)")
            .y_desc("latency, µs (log)")
            .y_label_formatter(&|v| short(*v))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        type Pick = fn(&crate::results::SecondRow) -> u64;
        let series: [(&str, Pick); 3] = [
            ("median", |s| s.latency_p50_ns),
            ("mean", |s| s.latency_mean_ns),
            ("99%", |s| s.latency_p99_ns),
        ];
        for (i, (name, pick)) in series.iter().enumerate() {
            let color = PALETTE[i];
            chart
                .draw_series(LineSeries::new(
                    r.per_second
                        .iter()
                        .filter(|s| pick(s) > 0)
                        .map(|s| (s.t_s as f64, us(pick(s)))),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The response-time distribution per command type on a log time axis: the seeds' two humps
/// (cancels answer faster than new orders, which are checked against collateral).
pub fn distribution(r: &Results) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let edges = &r.bin_edges_ns;
        // Show the bins that hold anything, with a margin of a bin on each side.
        let used = |op: &crate::results::OpLatency| {
            let first = op.bins.iter().position(|&c| c > 0);
            let last = op.bins.iter().rposition(|&c| c > 0);
            first.zip(last)
        };
        let (lo, hi) = r
            .by_op
            .iter()
            .filter_map(used)
            .fold((usize::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
        let (lo, hi) = if lo == usize::MAX {
            (0, edges.len().saturating_sub(2))
        } else {
            (lo.saturating_sub(1), (hi + 2).min(edges.len() - 1))
        };
        let x_min = edges[lo] as f64 / 1e3;
        let x_max = edges[hi.max(lo + 1)] as f64 / 1e3;
        let shares: Vec<(String, Vec<(f64, f64)>)> = r
            .by_op
            .iter()
            .filter(|op| op.latency.count > 0)
            .map(|op| {
                let total = op.bins.iter().sum::<u64>().max(1) as f64;
                let points = op
                    .bins
                    .iter()
                    .enumerate()
                    .skip(lo)
                    .take(hi.saturating_sub(lo))
                    .map(|(i, &c)| {
                        // The geometric middle of the bin on the log axis.
                        let mid = ((edges[i] as f64) * (edges[i + 1] as f64)).sqrt() / 1e3;
                        (mid, 100.0 * c as f64 / total)
                    })
                    .collect();
                (op.op.clone(), points)
            })
            .collect();
        let y_max = shares
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
            .fold(1.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d((x_min.max(0.01)..x_max).log_scale(), 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("response time from the scheduled send, µs (log)")
            .y_desc("% of the type's commands per bin")
            .x_label_formatter(&|v| short(*v))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        for (i, (name, points)) in shares.into_iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Numbers for axis labels: 1.5k, 20k, 1.2M, 0.5.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
