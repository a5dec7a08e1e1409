//! Small hand-written SVG line charts with logarithmic axes, for `nvmq bench --plot`. (plotters
//! would do, but costs a long build for three charts.)

use std::fmt::Write as _;

/// One line of a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart panel.
pub struct Panel<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: &'a [Series],
}

const W: f64 = 560.0;
const H: f64 = 400.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Panels side by side in one SVG document.
pub fn svg(panels: &[Panel<'_>]) -> String {
    let width = W * panels.len().max(1) as f64;
    let legend_rows = panels.iter().map(|p| p.series.len()).max().unwrap_or(0);
    let height = H + 18.0 * legend_rows as f64 + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        let _ = writeln!(s, r#"<g transform="translate({},0)">"#, W * i as f64);
        panel(&mut s, p);
        let _ = writeln!(s, "</g>");
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// Log10 range covering the positive values, widened to whole decades.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v.log10());
        hi = hi.max(v.log10());
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let (lo, hi) = (lo.floor(), hi.ceil());
    if hi <= lo {
        (lo, lo + 1.0)
    } else {
        (lo, hi)
    }
}

fn panel(s: &mut String, p: &Panel<'_>) {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let xs = log_range(p.series.iter().flat_map(|x| x.points.iter().map(|q| q.0)));
    let ys = log_range(p.series.iter().flat_map(|x| x.points.iter().map(|q| q.1)));
    let px = |x: f64| LEFT + (x.log10() - xs.0) / (xs.1 - xs.0) * pw;
    let py = |y: f64| TOP + ph - (y.log10() - ys.0) / (ys.1 - ys.0) * ph;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + pw / 2.0,
        esc(p.title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    for d in xs.0 as i32..=xs.1 as i32 {
        let v = 10f64.powi(d);
        let x = px(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            tick(v)
        );
    }
    for d in ys.0 as i32..=ys.1 as i32 {
        let v = 10f64.powi(d);
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            tick(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        TOP + ph + 38.0,
        esc(p.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        esc(p.y_label)
    );
    for (i, series) in p.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = series
            .points
            .iter()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0)
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            if let Some((x, y)) = p.split_once(',') {
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
            }
        }
        let ly = H + 4.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{ly}">{}</text>"#,
            ly - 6.0,
            LEFT + 20.0,
            esc(&series.name)
        );
    }
}

fn tick(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_per_series_on_log_axes() {
        let series = [
            Series {
                name: "sim <a>".into(),
                points: vec![(1.0, 200.0), (64.0, 12_000.0), (1024.0, 150_000.0)],
            },
            Series {
                name: "file".into(),
                points: vec![(1.0, 50.0), (64.0, 0.0)],
            },
        ];
        let doc = svg(&[Panel {
            title: "acks/s",
            x_label: "producers",
            y_label: "acks/s",
            series: &series,
        }]);
        assert!(doc.starts_with("<svg"));
        assert!(doc.trim_end().ends_with("</svg>"));
        assert_eq!(doc.matches("<polyline").count(), 2);
        // Zero cannot sit on a log axis: skipped, not drawn at infinity.
        assert_eq!(doc.matches("<circle").count(), 4);
        assert!(doc.contains("sim &lt;a&gt;"));
        assert!(
            doc.contains(">1M<") || doc.contains(">100k<"),
            "decade ticks: {doc}"
        );
        assert!(!doc.contains("NaN") && !doc.contains("inf"));
    }
}
