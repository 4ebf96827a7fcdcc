//! SVG plots of the benchmarks' JSON files, for `docs/benchmarks/` (the `report` bench target).
//!
//! [`report`] reads what the bench targets wrote into `target/` and writes one SVG per plot:
//!
//! | file | from | what |
//! | --- | --- | --- |
//! | `density-create.svg` | `bench-density.json` | creation time per agent against the number of agents |
//! | `density-rss.svg` | `bench-density.json` | RSS of agenthold and the holder, kernel memory, against agents |
//! | `intercept-latency.svg` | `bench-intercept.json` | request latency percentiles through the gateway vs direct |
//! | `soak-rss.svg` | `bench-soak.json` | the gateway's (and the load process's) RSS per minute of the soak |
//! | `soak-requests.svg` | `bench-soak.json` | requests and errors per minute of the soak |
//!
//! A missing or unreadable input is skipped with a message, never a panic. Only the SVG backend of
//! `plotters` is built: no bitmap code and no system font library; text is written as SVG `<text>` (sized
//! by plotters' estimate) and the viewer's sans-serif font draws it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;
use serde_json::Value;

/// One line of a chart: its legend label and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub label: String,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series named `label`.
    pub fn new(label: &str, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.to_owned(),
            points,
        }
    }
}

/// A line chart: a title, the axes' descriptions and the lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Caption above the plot.
    pub title: String,
    /// Description of the x axis.
    pub x_desc: String,
    /// Description of the y axis.
    pub y_desc: String,
    /// The lines (series without points are left out of the plot and the legend).
    pub series: Vec<Series>,
    /// A logarithmic y axis (for series orders of magnitude apart).
    pub log_y: bool,
    /// The y axis starts at zero (otherwise at the smallest value).
    pub y_from_zero: bool,
}

impl Chart {
    /// A chart with a linear y axis from zero.
    pub fn new(title: &str, x_desc: &str, y_desc: &str, series: Vec<Series>) -> Self {
        Self {
            title: title.to_owned(),
            x_desc: x_desc.to_owned(),
            y_desc: y_desc.to_owned(),
            series,
            log_y: false,
            y_from_zero: true,
        }
    }
}

/// Width and height of every plot, in pixels.
const SIZE: (u32, u32) = (720, 420);

/// Line colours, in series order (picked to stay apart for the colour-blind).
const COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
];

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// `(low, high)` of `values` with a margin, never empty.
fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if (hi - lo).abs() < f64::EPSILON {
        let pad = if hi.abs() > 0.0 { hi.abs() * 0.1 } else { 1.0 };
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.08;
    (if from_zero && lo >= 0.0 { lo } else { lo - pad }, hi + pad)
}

/// A tick label: no decimals for large numbers, a few for small ones.
fn tick(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The chart as an SVG document.
///
/// # Errors
/// When no series has a finite point, or plotters fails.
pub fn render_svg(chart: &Chart) -> Result<String> {
    let series: Vec<Series> = chart
        .series
        .iter()
        .map(|s| {
            let points = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.log_y || *y > 0.0))
                .map(|(x, y)| (x, if chart.log_y { y.log10() } else { y }))
                .collect();
            Series::new(&s.label, points)
        })
        .filter(|s: &Series| !s.points.is_empty())
        .collect();
    if series.is_empty() {
        return Err(anyhow!("{}: no data to plot", chart.title));
    }
    let (x0, x1) = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), false);
    let (y0, y1) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        chart.y_from_zero && !chart.log_y,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut plot = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 22))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        let log_y = chart.log_y;
        let y_label = move |v: &f64| {
            if log_y { tick(10f64.powf(*v)) } else { tick(*v) }
        };
        let x_label = |v: &f64| tick(*v);
        plot.configure_mesh()
            .x_desc(chart.x_desc.as_str())
            .y_desc(chart.y_desc.as_str())
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            plot.draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
                .map_err(err)?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
            plot.draw_series(s.points.iter().map(|p| Circle::new(*p, 3, colour.filled())))
                .map_err(err)?;
        }
        plot.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A number at `key` of `v`, if it is one.
fn f(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// (a) and (b) from `bench-density.json`: creation time per agent, and memory, against the number of
/// agents.
///
/// # Errors
/// When the file has no `points` array.
pub fn density_charts(v: &Value) -> Result<Vec<(&'static str, Chart)>> {
    let points = v["points"]
        .as_array()
        .context("bench-density.json has no `points`")?;
    let line = |key: &str| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter_map(|p| Some((f(p, "agents")?, f(p, key)?)))
            .collect()
    };
    let create = Chart::new(
        "Creating an agent, against the number of agents",
        "agents",
        "creation time (ms)",
        vec![Series::new("create (ms)", line("create_ms"))],
    );
    let rss = Chart::new(
        "Memory against the number of agents",
        "agents",
        "MiB",
        vec![
            Series::new("agenthold RSS", line("agenthold_rss_mib")),
            Series::new("holder RSS", line("holder_rss_mib")),
            Series::new("kernel", line("kernel_mib")),
        ],
    );
    Ok(vec![("density-create.svg", create), ("density-rss.svg", rss)])
}

/// The ways of the interception benchmark, as its JSON names them, and their legend labels.
const WAYS: [(&str, &str); 4] = [
    ("direct_loopback", "direct (loopback)"),
    ("direct_veth", "direct (veth)"),
    ("gateway", "gateway (intercepted)"),
    ("mitmdump", "mitmdump"),
];

/// (c) from `bench-intercept.json`: the median of each latency percentile per way (x: the percentile).
/// Logarithmic when mitmdump, orders of magnitude slower, is in it.
///
/// # Errors
/// When the file has no latency part.
pub fn intercept_latency_chart(v: &Value) -> Result<Chart> {
    let quantiles = v["latency"]["quantiles"]
        .as_object()
        .context("bench-intercept.json has no latency part (BENCH_ONLY=latency)")?;
    let mut series = Vec::new();
    for (key, label) in WAYS {
        let points: Vec<(f64, f64)> = quantiles
            .iter()
            .filter_map(|(name, q)| {
                let p: f64 = name.strip_prefix('p')?.parse().ok()?;
                Some((p, q["ways"][key]["median"].as_f64()?))
            })
            .collect();
        let mut points = points;
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push(Series::new(label, points));
    }
    let log_y = series
        .iter()
        .any(|s| s.label == "mitmdump" && !s.points.is_empty());
    let mut chart = Chart::new(
        "HTTPS request latency, one connection, sequential",
        "percentile",
        if log_y { "µs (log scale)" } else { "µs" },
        series,
    );
    chart.log_y = log_y;
    Ok(chart)
}

/// (d) from `bench-soak.json`: RSS per minute, and requests and errors per minute.
///
/// # Errors
/// When the file has no `minutes` array.
pub fn soak_charts(v: &Value) -> Result<Vec<(&'static str, Chart)>> {
    let minutes = v["minutes"]
        .as_array()
        .context("bench-soak.json has no `minutes`")?;
    let line = |key: &str, skip_first: bool| -> Vec<(f64, f64)> {
        minutes
            .iter()
            .skip(usize::from(skip_first))
            .filter_map(|m| Some((f(m, "minute")?, f(m, key)?)))
            .collect()
    };
    let conns = v["settings"]["connections"].as_u64().unwrap_or(0);
    let rss = Chart::new(
        &format!("Soak: memory per minute, {conns} connections"),
        "minute",
        "RSS (MiB)",
        vec![
            Series::new("gateway process", line("rss_mib", false)),
            Series::new("load process (clients, upstream)", line("load_rss_mib", false)),
        ],
    );
    // Minute 0 is the ramp (its requests are not a minute's): left out.
    let requests = Chart::new(
        &format!("Soak: requests and errors per minute, {conns} connections"),
        "minute",
        "per minute",
        vec![
            Series::new("requests", line("requests", true)),
            Series::new("errors", line("errors", true)),
        ],
    );
    Ok(vec![("soak-rss.svg", rss), ("soak-requests.svg", requests)])
}

/// What [`report`] did with each input.
#[derive(Debug, Default)]
pub struct Outcome {
    /// SVG files written.
    pub written: Vec<PathBuf>,
    /// Inputs or plots skipped, and why.
    pub skipped: Vec<String>,
}

/// Reads the bench JSON files in `input` and writes the plots into `output` (created when missing).
/// Missing or malformed inputs, and plots without data, are skipped and listed in the outcome.
///
/// # Errors
/// When `output` cannot be created or a plot cannot be written.
pub fn report(input: &Path, output: &Path) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let read = |name: &str, skipped: &mut Vec<String>| -> Option<Value> {
        let path = input.join(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                skipped.push(format!("{}: {e}", path.display()));
                return None;
            }
        };
        match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                skipped.push(format!("{}: not JSON: {e}", path.display()));
                None
            }
        }
    };
    let mut charts: Vec<(&'static str, Chart)> = Vec::new();
    let mut take =
        |name: &str, result: Result<Vec<(&'static str, Chart)>>, skipped: &mut Vec<String>| match result {
            Ok(c) => charts.extend(c),
            Err(e) => skipped.push(format!("{name}: {e:#}")),
        };
    if let Some(v) = read("bench-density.json", &mut outcome.skipped) {
        take("bench-density.json", density_charts(&v), &mut outcome.skipped);
    }
    if let Some(v) = read("bench-intercept.json", &mut outcome.skipped) {
        take(
            "bench-intercept.json",
            intercept_latency_chart(&v).map(|c| vec![("intercept-latency.svg", c)]),
            &mut outcome.skipped,
        );
    }
    if let Some(v) = read("bench-soak.json", &mut outcome.skipped) {
        take("bench-soak.json", soak_charts(&v), &mut outcome.skipped);
    }
    if charts.is_empty() {
        return Ok(outcome);
    }
    std::fs::create_dir_all(output).with_context(|| format!("create {}", output.display()))?;
    for (file, chart) in charts {
        match render_svg(&chart) {
            Ok(svg) => {
                let path = output.join(file);
                std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
                outcome.written.push(path);
            }
            Err(e) => outcome.skipped.push(format!("{file}: {e:#}")),
        }
    }
    Ok(outcome)
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::new();
        for path in &self.written {
            let _ = writeln!(out, "written: {}", path.display());
        }
        for why in &self.skipped {
            let _ = writeln!(out, "skipped: {why}");
        }
        f.write_str(out.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn density() -> Value {
        json!({
            "settings": {},
            "points": [
                {"agents": 1, "create_ms": 410.0, "agenthold_rss_mib": 30.0, "holder_rss_mib": 8.0, "kernel_mib": null, "nft_rules_gateway": 12},
                {"agents": 10, "create_ms": 450.5, "agenthold_rss_mib": 34.0, "holder_rss_mib": 9.5, "kernel_mib": 40.0, "nft_rules_gateway": 120},
                {"agents": 100, "create_ms": 520.0, "agenthold_rss_mib": 60.0, "holder_rss_mib": null, "kernel_mib": 300.0, "nft_rules_gateway": null},
            ],
            "latency_agent1": {"agents_1": {"p50_us": 1.0, "p90_us": 2.0, "p99_us": 3.0}}
        })
    }

    #[test]
    fn a_chart_renders_its_series_and_labels() {
        let chart = Chart::new(
            "Title here",
            "agents",
            "ms",
            vec![
                Series::new("first series", vec![(1.0, 2.0), (2.0, 4.0)]),
                Series::new("second series", vec![(1.0, 1.0), (2.0, 1.5)]),
                Series::new("empty series", vec![]),
            ],
        );
        let svg = render_svg(&chart).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for text in ["Title here", "first series", "second series", "agents"] {
            assert!(svg.contains(text), "{text} missing");
        }
        // An empty series has nothing to show: no legend entry either.
        assert!(!svg.contains("empty series"));
        // One line per series with points, and one legend sample each.
        // (Axes and ticks are thinner polylines.)
        let lines = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(r#"stroke-width="2""#))
            .count();
        assert_eq!(lines, 4, "{svg}");
    }

    #[test]
    fn a_chart_without_data_is_an_error_not_a_panic() {
        let chart = Chart::new("t", "x", "y", vec![Series::new("s", vec![(1.0, f64::NAN)])]);
        assert!(render_svg(&chart).is_err());
        // One point only: the ranges still have a width.
        let one = Chart::new("t", "x", "y", vec![Series::new("s", vec![(3.0, 3.0)])]);
        assert!(render_svg(&one).unwrap().contains("<circle"));
    }

    #[test]
    fn density_plots_take_every_present_value() {
        let charts = density_charts(&density()).unwrap();
        let (name, create) = &charts[0];
        assert_eq!(*name, "density-create.svg");
        assert_eq!(
            create.series[0].points,
            vec![(1.0, 410.0), (10.0, 450.5), (100.0, 520.0)]
        );
        let (_, rss) = &charts[1];
        // Nulls are left out, not drawn as zero.
        assert_eq!(rss.series[1].points, vec![(1.0, 8.0), (10.0, 9.5)]);
        assert_eq!(rss.series[2].points, vec![(10.0, 40.0), (100.0, 300.0)]);
        let svg = render_svg(rss).unwrap();
        for label in ["agenthold RSS", "holder RSS", "kernel"] {
            assert!(svg.contains(label), "{label}");
        }
    }

    #[test]
    fn intercept_latency_reads_the_medians_of_each_percentile() {
        let way = |lo: f64, veth: f64, gw: f64, mitm: Option<f64>| {
            json!({
                "direct_loopback": {"median": lo}, "direct_veth": {"median": veth},
                "gateway": {"median": gw}, "mitmdump": {"median": mitm},
            })
        };
        let v = json!({"latency": {"quantiles": {
            "p50": {"unit": "us", "ways": way(40.0, 50.0, 120.0, None)},
            "p99": {"unit": "us", "ways": way(80.0, 90.0, 300.0, None)},
            "p90": {"unit": "us", "ways": way(60.0, 70.0, 200.0, None)},
            "mean": {"unit": "us", "ways": way(1.0, 1.0, 1.0, None)},
            "req/s": {"unit": "req/s", "ways": way(1.0, 1.0, 1.0, None)},
        }}});
        let chart = intercept_latency_chart(&v).unwrap();
        assert!(!chart.log_y);
        let gateway = chart
            .series
            .iter()
            .find(|s| s.label.starts_with("gateway"))
            .unwrap();
        assert_eq!(gateway.points, vec![(50.0, 120.0), (90.0, 200.0), (99.0, 300.0)]);
        let svg = render_svg(&chart).unwrap();
        assert!(svg.contains("gateway (intercepted)") && svg.contains("direct (veth)"));
        // mitmdump without values is not drawn.
        assert!(!svg.contains("mitmdump"));
        assert!(intercept_latency_chart(&json!({"latency": null})).is_err());
    }

    #[test]
    fn soak_plots_rss_and_requests_per_minute() {
        let v = json!({
            "settings": {"connections": 1000},
            "minutes": [
                {"minute": 0, "rss_mib": 100.0, "load_rss_mib": 50.0, "open_connections": 1000, "requests": 10, "errors": 0},
                {"minute": 1, "rss_mib": 101.0, "load_rss_mib": 51.0, "open_connections": 1000, "requests": 12000, "errors": 0},
                {"minute": 2, "rss_mib": 101.5, "load_rss_mib": 51.0, "open_connections": 1000, "requests": 12010, "errors": 1},
            ],
        });
        let charts = soak_charts(&v).unwrap();
        let (_, rss) = &charts[0];
        assert_eq!(rss.series[0].points.len(), 3);
        let (_, requests) = &charts[1];
        // The ramp (minute 0) is not a minute of traffic.
        assert_eq!(requests.series[0].points, vec![(1.0, 12000.0), (2.0, 12010.0)]);
        assert!(render_svg(requests).unwrap().contains("requests"));
    }

    #[test]
    fn report_skips_missing_and_broken_files_and_writes_the_rest() {
        let input = tempfile::tempdir().unwrap();
        let output = input.path().join("plots");
        // Nothing there: nothing written, every input named as skipped.
        let outcome = report(input.path(), &output).unwrap();
        assert!(outcome.written.is_empty());
        assert_eq!(outcome.skipped.len(), 3, "{outcome}");
        std::fs::write(input.path().join("bench-density.json"), density().to_string()).unwrap();
        std::fs::write(input.path().join("bench-soak.json"), "{not json").unwrap();
        std::fs::write(input.path().join("bench-intercept.json"), r#"{"rate": {}}"#).unwrap();
        let outcome = report(input.path(), &output).unwrap();
        let names: Vec<_> = outcome
            .written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["density-create.svg", "density-rss.svg"]);
        let svg = std::fs::read_to_string(output.join("density-create.svg")).unwrap();
        assert!(svg.contains("create (ms)"));
        assert_eq!(outcome.skipped.len(), 2, "{outcome}");
    }

    #[test]
    fn log_scale_labels_the_real_values() {
        let mut chart = Chart::new(
            "t",
            "percentile",
            "µs",
            vec![
                Series::new("fast", vec![(50.0, 100.0), (99.0, 200.0)]),
                Series::new("mitmdump", vec![(50.0, 10000.0), (99.0, 20000.0)]),
            ],
        );
        chart.log_y = true;
        let svg = render_svg(&chart).unwrap();
        // Tick labels are values, not their logarithms: some label is at least 1000.
        let labels: Vec<f64> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next()?.trim().parse().ok())
            .collect();
        assert!(labels.iter().any(|v| *v >= 1000.0), "{labels:?}");
    }
}
