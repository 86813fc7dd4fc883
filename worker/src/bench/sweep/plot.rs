//! A line chart as a standalone SVG file: one polyline with markers per series, axes with
//! five ticks each, a legend. Enough for a sweep's curves; no plotting dependency.

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub label: String,
    /// `(x, y)` points in order.
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A tick value printed compactly (`12k` for thousands).
fn tick_text(value: f64) -> String {
    if value.abs() >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if value.abs() >= 100.0 || value == value.round() {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// The chart of `series` with the given title and axis names. The y axis spans 0 to the
/// largest value (at least 1, the scale of a pass rate); the x axis 0 to the largest x.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let points = || series.iter().flat_map(|s| s.points.iter());
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let x_max = points().map(|p| finite(p.0)).fold(0.0, f64::max).max(1.0);
    let y_max = points().map(|p| finite(p.1)).fold(1.0, f64::max);
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x_at = |x: f64| LEFT + finite(x) / x_max * plot_w;
    let y_at = |y: f64| TOP + plot_h - finite(y) / y_max * plot_h;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        LEFT + plot_w / 2.0,
        escape(title)
    );
    for i in 0..=4 {
        let fraction = i as f64 / 4.0;
        let (x, y) = (LEFT + fraction * plot_w, TOP + plot_h - fraction * plot_h);
        svg.push_str(&format!(
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            tick_text(fraction * y_max),
            TOP + plot_h + 18.0,
            tick_text(fraction * x_max),
        ));
    }
    svg.push_str(&format!(
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" \
         stroke=\"#444\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">{}</text>\n",
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0,
        escape(x_label),
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label),
    ));
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let path: Vec<String> =
            line.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", x_at(x), y_at(y))).collect();
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        for &(x, y) in &line.points {
            svg.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>\n",
                x_at(x),
                y_at(y)
            ));
        }
        let legend_y = TOP + 8.0 + index as f64 * 18.0;
        let legend_x = LEFT + plot_w + 14.0;
        svg.push_str(&format!(
            "<line x1=\"{legend_x:.1}\" y1=\"{legend_y:.1}\" x2=\"{:.1}\" y2=\"{legend_y:.1}\" \
             stroke=\"{colour}\" stroke-width=\"3\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            legend_x + 18.0,
            legend_x + 24.0,
            legend_y + 4.0,
            escape(&line.label),
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_each_series_with_its_legend_and_escapes_text() {
        let series = [
            Series { label: "loss=dapo".into(), points: vec![(0.0, 0.1), (5000.0, 0.5)] },
            Series { label: "a<b".into(), points: vec![(0.0, 0.2), (20_000.0, 0.4)] },
        ];
        let svg = line_chart("pass@1 & tokens", "tokens", "pass@1", &series);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(
            svg.contains("loss=dapo")
                && svg.contains("a&lt;b")
                && svg.contains("pass@1 &amp; tokens")
        );
        assert!(svg.contains(">20k<"), "the x axis reaches the largest x");
        let empty = line_chart("t", "x", "y", &[]);
        assert!(!empty.contains("<polyline") && !empty.contains("NaN"));
    }
}
