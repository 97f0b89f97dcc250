//! SVG charts of a suite run (plotters, SVG backend only): latency
//! percentiles per variant and horizontal bar charts.

use std::path::Path;

use anyhow::bail;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Variant colours, by column index (direct first, in grey).
const COLORS: [RGBColor; 8] = [
    RGBColor(0x55, 0x55, 0x55),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
];

pub fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// One line of a percentile chart.
pub struct Series {
    pub label: String,
    pub color: usize,
    /// One value per percentile label; None is skipped.
    pub values: Vec<Option<f64>>,
}

fn fmt_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{} ms", trim(us / 1000.0))
    } else {
        format!("{} µs", trim(us))
    }
}

fn trim(x: f64) -> String {
    if x >= 100.0 || (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// 1-2-5 ticks per decade between `lo` and `hi`.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = decade * m;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// Latency percentiles (x: p50 … max, y: log µs), one line per variant.
pub fn percentiles(
    path: &Path,
    title: &str,
    labels: &[&str],
    series: &[Series],
) -> anyhow::Result<()> {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        .filter(|v| *v > 0.0 && v.is_finite())
        .collect();
    if all.is_empty() || labels.is_empty() {
        bail!("no data for chart {title:?}");
    }
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min) / 1.5;
    let hi = all.iter().copied().fold(0.0, f64::max) * 2.0;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = labels.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (0..n - 1).into_segmented(),
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
        )?;
    let x_label = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => labels
            .get(*i as usize)
            .map_or(String::new(), |s| s.to_string()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("percentile")
        .y_desc("latency (log scale)")
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y| fmt_us(*y))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    for s in series {
        let c = color(s.color);
        let pts: Vec<(SegmentValue<i32>, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                v.filter(|x| *x > 0.0)
                    .map(|x| (SegmentValue::CenterOf(i as i32), x))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One bar of a bar chart.
pub struct Bar {
    pub label: String,
    pub color: usize,
    pub value: f64,
}

/// Horizontal bars, top to bottom in the given order, value at the end of
/// each bar.
pub fn bars(path: &Path, title: &str, unit: &str, bars: &[Bar]) -> anyhow::Result<()> {
    let bars: Vec<&Bar> = bars.iter().filter(|b| b.value.is_finite()).collect();
    if bars.is_empty() {
        bail!("no data for chart {title:?}");
    }
    let n = bars.len() as i32;
    let max = bars.iter().map(|b| b.value).fold(0.0, f64::max).max(1e-9);
    let longest = bars
        .iter()
        .map(|b| b.label.chars().count())
        .max()
        .unwrap_or(10) as u32;
    let height = 120 + 38 * n as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(20 + longest * 8)
        .build_cartesian_2d(0.0..max * 1.18, (0..n - 1).into_segmented())?;
    // Row k from the top is segment n-1-k.
    let row = |k: usize| n - 1 - k as i32;
    let y_label = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => bars
            .get((n - 1 - *i) as usize)
            .map_or(String::new(), |b| b.label.clone()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&y_label)
        .x_desc(unit)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(k, b)| {
        let y = row(k);
        let mut r = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(y)),
                (b.value, SegmentValue::Exact(y + 1)),
            ],
            color(b.color).filled(),
        );
        r.set_margin(4, 4, 0, 0);
        r
    }))?;
    let style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(k, b)| {
        Text::new(
            trim(b.value),
            (b.value + max * 0.01, SegmentValue::CenterOf(row(k))),
            style.clone(),
        )
    }))?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minimal well-formedness check: balanced tags, one root <svg>.
    pub fn check_svg(text: &str) {
        assert!(text.trim_start().starts_with("<svg"), "not an SVG document");
        let mut stack: Vec<String> = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find('<') {
            let end = rest[i..].find('>').expect("unclosed tag") + i;
            let tag = &rest[i + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(
                    stack.pop().as_deref(),
                    Some(name.trim()),
                    "mismatched </{name}>"
                );
            } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
                stack.push(tag.split_whitespace().next().unwrap().to_string());
            }
            rest = &rest[end + 1..];
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
    }

    #[test]
    fn charts_are_well_formed_svg() {
        let dir = tempfile::tempdir().unwrap();
        let lat = dir.path().join("lat.svg");
        percentiles(
            &lat,
            "rr latency",
            &["p50", "p90", "p99", "p99.9", "max"],
            &[
                Series {
                    label: "direct".into(),
                    color: 0,
                    values: vec![Some(20.0), Some(25.0), Some(40.0), Some(90.0), Some(800.0)],
                },
                Series {
                    label: "a & <b>".into(),
                    color: 1,
                    values: vec![Some(50.0), None, Some(70.0), Some(120.0), Some(3000.0)],
                },
            ],
        )
        .unwrap();
        let text = std::fs::read_to_string(&lat).unwrap();
        check_svg(&text);
        assert!(text.contains("a &amp; &lt;b&gt;") || text.contains("a &amp; &lt;b>"));
        assert!(text.contains("p99.9"));

        let b = dir.path().join("bars.svg");
        bars(
            &b,
            "throughput",
            "Gbit/s",
            &[
                Bar {
                    label: "1 stream · direct".into(),
                    color: 0,
                    value: 12.5,
                },
                Bar {
                    label: "1 stream · hbone".into(),
                    color: 1,
                    value: 3.25,
                },
            ],
        )
        .unwrap();
        let text = std::fs::read_to_string(&b).unwrap();
        check_svg(&text);
        assert!(text.contains("1 stream · hbone") && text.contains("12.5"));
        assert!(bars(&b, "empty", "x", &[]).is_err());
        // To look at them: RINGWAY_PERF_KEEP_CHARTS=/some/dir cargo test charts
        if let Some(keep) = std::env::var_os("RINGWAY_PERF_KEEP_CHARTS") {
            for f in [&lat, &b] {
                std::fs::copy(f, Path::new(&keep).join(f.file_name().unwrap())).unwrap();
            }
        }
    }
}
