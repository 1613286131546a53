//! The reports' charts: lines (optionally as steps or dashed), stacked areas and stacked
//! bars over one x and one y axis, each linear or log10, with a title, a legend above the
//! plot, a grid, tick labels and axis labels, drawn by `plotters` into an inline `<svg>`.
//!
//! Why `plotters`: scales, tick placement, the grid, the axes and the SVG writing are what
//! a chart library already does and keeps right; this module only says which series and
//! labels go where. Only its SVG backend is built: no bitmap, no font file, no system
//! library, and text stays SVG `<text>` (escaped by the backend) that the browser sets in
//! its own sans-serif.
//!
//! Ranges come from the data unless fixed: a linear axis starts at zero when its values
//! are positive and close enough to it; a log axis spans whole decades around its positive
//! values and leaves out points that are zero or negative (it cannot show them). Non-finite
//! values are skipped, and points are pulled into a fixed range rather than drawn outside
//! it. The same chart renders to the same bytes.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One axis: its label, scale and optional fixed range.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    label: String,
    log: bool,
    range: Option<(f64, f64)>,
}

impl Axis {
    /// A linear axis fitted to the data.
    pub fn linear(label: &str) -> Axis {
        Axis {
            label: label.to_string(),
            log: false,
            range: None,
        }
    }

    /// A log10 axis fitted to the data; only positive values are shown.
    pub fn log(label: &str) -> Axis {
        Axis {
            log: true,
            ..Axis::linear(label)
        }
    }

    /// The same axis with a fixed range.
    pub fn with_range(mut self, min: f64, max: f64) -> Axis {
        self.range = Some((min, max));
        self
    }

    /// Whether the axis can show `v`.
    fn shows(&self, v: f64) -> bool {
        v.is_finite() && (!self.log || v > 0.0)
    }

    /// The range drawn, `lo < hi`: the fixed one, else fitted to `values` as the module
    /// doc says.
    fn span(&self, values: impl Iterator<Item = f64>) -> (f64, f64) {
        let fitted = self.range.is_none();
        let (mut lo, mut hi) = self.range.unwrap_or_else(|| {
            values
                .filter(|v| self.shows(*v))
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                    (a.min(v), b.max(v))
                })
        });
        if self.log {
            if !(lo > 0.0 && hi.is_finite()) {
                (lo, hi) = (1.0, 10.0);
            }
            if fitted {
                (lo, hi) = (
                    10f64.powf(lo.log10().floor()),
                    10f64.powf(hi.log10().ceil()),
                );
            }
            if hi <= lo {
                hi = lo * 10.0;
            }
        } else {
            if fitted && lo.is_finite() && hi.is_finite() {
                if lo > 0.0 && lo < hi / 2.0 {
                    lo = 0.0;
                }
                hi += (hi - lo) / 20.0;
            }
            if !(lo.is_finite() && hi.is_finite()) {
                (lo, hi) = (0.0, 1.0);
            }
            if hi <= lo {
                hi = lo + 1.0;
            }
        }
        (lo, hi)
    }
}

/// How a chart draws its series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Each series a line through its points in order.
    Lines,
    /// Each series a staircase: a value holds until the next point's x (a CDF, a rate per
    /// window).
    Steps,
    /// Series stacked on each other by point index (every series should have the same
    /// xs): the areas between consecutive running sums.
    StackedArea,
    /// Series stacked as bars centred on each x, by point index.
    StackedBars {
        /// The x step between bars, in x units; a bar is 80% of it.
        width: f64,
    },
}

/// One named series.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's name.
    pub name: String,
    /// `(x, y)` points, in the order drawn.
    pub points: Vec<(f64, f64)>,
    dashed: bool,
    color: usize,
}

impl Series {
    /// A solid series in palette colour `color` (series with one index share a colour).
    pub fn new(name: &str, color: usize, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.to_string(),
            points,
            dashed: false,
            color,
        }
    }

    /// The same series drawn dashed (a reference line, a second statistic of one group).
    pub fn dashed(mut self) -> Series {
        self.dashed = true;
        self
    }
}

/// A chart: title, axes, series, and how to draw them.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Shown above the legend.
    pub title: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// How the series are drawn.
    pub kind: Kind,
    /// The series, in legend and drawing order.
    pub series: Vec<Series>,
}

/// Colours (colour-blind-safe, Okabe–Ito) the series' `color` indexes, cyclically.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0x00, 0x72, 0xb2),
    RGBColor(0xe6, 0x9f, 0x00),
    RGBColor(0x00, 0x9e, 0x73),
    RGBColor(0xd5, 0x5e, 0x00),
    RGBColor(0xcc, 0x79, 0xa7),
    RGBColor(0x56, 0xb4, 0xe9),
    RGBColor(0xf0, 0xe4, 0x42),
    RGBColor(0x00, 0x00, 0x00),
];

/// The SVG's width, and its height without legend rows, in pixels.
const WIDTH: u32 = 720;
const HEIGHT: u32 = 330;
/// Where the plot (and so the legend) starts, and the space right of it.
const LEFT: i32 = 64;
const RIGHT: i32 = 20;
const LEGEND_ROW: i32 = 16;
const FONT: (&str, u32) = ("sans-serif", 15);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// The fitted ranges of both axes, and the running sums of stacked kinds.
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
    sums: Vec<Vec<f64>>,
}

impl Chart {
    /// The chart as one `<svg>` element (on a drawing error, one that says so).
    pub fn svg(&self) -> String {
        let layout = self.legend_layout();
        let rows = layout.last().map_or(0, |e| e.1 + 1);
        let height = HEIGHT + LEGEND_ROW.unsigned_abs() * rows.unsigned_abs();
        let mut out = String::new();
        let drawn = {
            let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
            self.draw(&root, &layout, rows)
                .and_then(|()| root.present())
        };
        match drawn {
            Ok(()) => out,
            Err(e) => format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"40\">\
                 <text x=\"8\" y=\"24\">{}</text></svg>",
                super::escape(&format!("{}: not drawn ({e})", self.title))
            ),
        }
    }

    fn draw(&self, root: &Area, layout: &[(i32, i32)], rows: i32) -> Drawn {
        root.fill(&WHITE)?;
        let title = FONT.into_font().resize(18.0).style(FontStyle::Bold);
        let below = root.titled(&clean(&self.title), title)?;
        let (legend, plot) = below.split_vertically(LEGEND_ROW * rows + 6);
        self.legend(&legend, layout)?;
        let sums = cumulative(&self.series);
        let bar = match self.kind {
            Kind::StackedBars { width } => width / 2.0,
            _ => 0.0,
        };
        let points = || self.series.iter().flat_map(|s| s.points.iter());
        let xs = points().flat_map(|p| [p.0 - bar, p.0 + bar]);
        let f = Frame {
            x: self.x.span(xs),
            y: if matches!(self.kind, Kind::Lines | Kind::Steps) {
                self.y.span(points().map(|p| p.1))
            } else {
                self.y.span(sums.iter().flatten().copied().chain([0.0]))
            },
            sums,
        };
        let ((x0, x1), (y0, y1)) = (f.x, f.y);
        match (self.x.log, self.y.log) {
            (false, false) => self.plot(&plot, &f, x0..x1, y0..y1),
            (false, true) => self.plot(&plot, &f, x0..x1, (y0..y1).log_scale()),
            (true, false) => self.plot(&plot, &f, (x0..x1).log_scale(), y0..y1),
            (true, true) => self.plot(&plot, &f, (x0..x1).log_scale(), (y0..y1).log_scale()),
        }
    }

    /// The axes, the grid and the series, on coordinates `x` and `y` (linear or log).
    fn plot<X, Y>(&self, area: &Area, f: &Frame, x: X, y: Y) -> Drawn
    where
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let mut chart = ChartBuilder::on(area)
            .margin_right(RIGHT)
            .margin_bottom(6)
            .x_label_area_size(40)
            .y_label_area_size(LEFT)
            .build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_desc(clean(&self.x.label))
            .y_desc(clean(&self.y.label))
            .x_label_formatter(&|v| tick_label(*v))
            .y_label_formatter(&|v| tick_label(*v))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .label_style(FONT)
            .axis_desc_style(FONT)
            .draw()?;
        let level = |i: Option<usize>, j: usize| {
            i.and_then(|i| f.sums.get(i)?.get(j).copied())
                .unwrap_or(0.0)
        };
        for (i, s) in self.series.iter().enumerate() {
            let c = color(s.color);
            let (top, under) = (Some(i), i.checked_sub(1));
            match self.kind {
                Kind::Lines | Kind::Steps => {
                    let line = self.line(s, f);
                    if let [p] = line[..] {
                        chart.draw_series([Circle::new(p, 3, c.filled())])?;
                    }
                    let style = c.stroke_width(2);
                    if s.dashed {
                        chart.draw_series([DashedPathElement::new(line, 6, 4, style)])?;
                    } else {
                        chart.draw_series([PathElement::new(line, style)])?;
                    }
                }
                Kind::StackedArea => {
                    let edge = |band: Option<usize>| {
                        let at = |(j, p): (usize, &(f64, f64))| self.at(f, (p.0, level(band, j)));
                        s.points
                            .iter()
                            .enumerate()
                            .filter_map(at)
                            .collect::<Vec<_>>()
                    };
                    let outline: Vec<_> = edge(top)
                        .into_iter()
                        .chain(edge(under).into_iter().rev())
                        .collect();
                    if outline.len() >= 3 {
                        chart.draw_series([Polygon::new(outline, c.mix(0.75).filled())])?;
                    }
                }
                Kind::StackedBars { width } => {
                    let bars = s.points.iter().enumerate().filter_map(|(j, p)| {
                        let a = self.at(f, (p.0 - width * 0.4, level(top, j)))?;
                        let b = self.at(f, (p.0 + width * 0.4, level(under, j)))?;
                        (a.1 > b.1).then(|| Rectangle::new([a, b], c.filled()))
                    });
                    chart.draw_series(bars)?;
                }
            }
        }
        Ok(())
    }

    /// A point as drawn: `None` when an axis cannot show it, else pulled into the ranges.
    fn at(&self, f: &Frame, (x, y): (f64, f64)) -> Option<(f64, f64)> {
        let pull = |v: f64, (lo, hi): (f64, f64)| v.max(lo).min(hi);
        (self.x.shows(x) && self.y.shows(y)).then(|| (pull(x, f.x), pull(y, f.y)))
    }

    /// The points of a line, with the corners of a staircase for [`Kind::Steps`].
    fn line(&self, s: &Series, f: &Frame) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = Vec::new();
        for p in s.points.iter().filter_map(|p| self.at(f, *p)) {
            if let (Kind::Steps, Some(&(_, y))) = (self.kind, out.last()) {
                out.push((p.0, y));
            }
            out.push(p);
        }
        out
    }

    /// Where each legend entry goes: its x and its row. Entries wrap to a new row when
    /// the next would pass the right edge (text estimated at 7 px a character).
    fn legend_layout(&self) -> Vec<(i32, i32)> {
        let (mut x, mut row) = (LEFT, 0);
        let right = WIDTH as i32 - RIGHT;
        self.series
            .iter()
            .map(|s| {
                let chars = i32::try_from(s.name.chars().count()).unwrap_or(right);
                let w = 38_i32.saturating_add(chars.saturating_mul(7));
                if x > LEFT && x.saturating_add(w) > right {
                    (x, row) = (LEFT, row + 1);
                }
                let at = (x, row);
                x = x.saturating_add(w);
                at
            })
            .collect()
    }

    /// Each series' mark (its line, dashed or not, or a swatch for stacked kinds) and name.
    fn legend(&self, area: &Area, layout: &[(i32, i32)]) -> Drawn {
        let text = TextStyle::from(FONT.into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        for (s, &(x, row)) in self.series.iter().zip(layout) {
            let c = color(s.color);
            let y = row * LEGEND_ROW + LEGEND_ROW / 2;
            let mark = vec![(x, y), (x + 18, y)];
            match (self.kind, s.dashed) {
                (Kind::Lines | Kind::Steps, false) => {
                    area.draw(&PathElement::new(mark, c.stroke_width(2)))?
                }
                (Kind::Lines | Kind::Steps, true) => {
                    area.draw(&DashedPathElement::new(mark, 6, 4, c.stroke_width(2)))?
                }
                _ => area.draw(&Rectangle::new([(x, y - 5), (x + 18, y + 5)], c.filled()))?,
            }
            area.draw(&Text::new(clean(&s.name), (x + 22, y), text.clone()))?;
        }
        Ok(())
    }
}

/// Palette colour `i`, cyclically.
fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// `text` with control characters (not allowed in XML) replaced; the SVG backend escapes
/// the rest.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// A tick label: short, without trailing zeros, deterministic (`0.5`, `20`, `1.5k`, `2M`).
fn tick_label(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{scaled:.3}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    if s == "-0" { "0" } else { s }.to_string() + suffix
}

/// The running sums of the series' y values by point index (non-finite or negative values
/// count as 0): `out[i][j]` = Σ of series 0..=i at point j.
fn cumulative(series: &[Series]) -> Vec<Vec<f64>> {
    let mut out: Vec<Vec<f64>> = Vec::new();
    for s in series {
        let below = out.last().cloned().unwrap_or_default();
        let row = s.points.iter().enumerate().map(|(j, p)| {
            let v = if p.1.is_finite() { p.1.max(0.0) } else { 0.0 };
            below.get(j).copied().unwrap_or(0.0) + v
        });
        out.push(row.collect());
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::wellformed::check;
    use super::*;

    /// The first two palette colours as the SVG backend writes them.
    const BLUE: &str = "#0072B2";
    const ORANGE: &str = "#E69F00";

    fn chart(kind: Kind, x: Axis, y: Axis, series: Vec<Series>) -> Chart {
        Chart {
            title: "the title".into(),
            x,
            y,
            kind,
            series,
        }
    }

    /// Every `<text>` content of `svg`, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|s| s.split_once('>').map(|(_, r)| r))
            .filter_map(|s| s.split_once("</text>").map(|(t, _)| t.trim().to_string()))
            .collect()
    }

    /// The `<tag …/>` elements of `svg` drawn in `color`.
    fn shapes<'a>(svg: &'a str, tag: &str, color: &str) -> Vec<&'a str> {
        svg.split(&format!("<{tag} "))
            .skip(1)
            .filter_map(|s| s.split_once("/>").map(|(e, _)| e))
            .filter(|e| e.contains(&format!("\"{color}\"")))
            .collect()
    }

    /// How many points a `points="…"` attribute lists.
    fn npoints(element: &str) -> usize {
        element
            .split_once("points=\"")
            .and_then(|(_, r)| r.split_once('"'))
            .map_or(0, |(p, _)| p.split_whitespace().count())
    }

    fn pts(k: f64) -> Vec<(f64, f64)> {
        (0..5)
            .map(|i| (f64::from(i), k * f64::from(i + 1)))
            .collect()
    }

    /// Renders `c`, checks what every kind must show (well-formed, deterministic, no
    /// non-finite number, the title, both axis labels and every legend name as text), and
    /// returns the SVG.
    fn rendered(c: &Chart) -> String {
        let svg = c.svg();
        check(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg, c.clone().svg());
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        let t = texts(&svg);
        for want in [c.title.as_str(), c.x.label.as_str(), c.y.label.as_str()]
            .into_iter()
            .chain(c.series.iter().map(|s| s.name.as_str()))
        {
            assert!(t.iter().any(|x| x == want), "{want} not in {t:?}");
        }
        svg
    }

    #[test]
    fn lines_draw_each_series_solid_or_dashed_on_a_log_axis() {
        let c = chart(
            Kind::Lines,
            Axis::linear("seconds"),
            Axis::log("queued ms"),
            vec![
                Series::new("p50", 0, pts(1.0)),
                Series::new("p99", 1, pts(100.0)).dashed(),
            ],
        );
        let svg = rendered(&c);
        // The solid series is one polyline through its 5 points (the other is its legend
        // mark); the dashed one is drawn as many short dashes.
        let solid = shapes(&svg, "polyline", BLUE);
        assert_eq!(solid.iter().map(|e| npoints(e)).max(), Some(5), "{solid:?}");
        assert!(shapes(&svg, "polyline", ORANGE).len() > 10, "{svg}");
        // Ticks on the log axis are decades: 1 to 1000 (the data spans 1..500).
        let t = texts(&svg);
        for tick in ["1", "10", "100", "1k"] {
            assert!(t.iter().any(|x| x == tick), "{tick} not in {t:?}");
        }
    }

    #[test]
    fn steps_draw_a_staircase_per_series_on_a_log_x_axis() {
        let c = chart(
            Kind::Steps,
            Axis::log("time to first token (ms, log scale)"),
            Axis::linear("fraction of requests ≤ x").with_range(0.0, 1.0),
            vec![
                Series::new("gateway", 0, vec![(10.0, 0.0), (12.0, 0.5), (300.0, 1.0)]),
                Series::new("/rr", 1, vec![(150.0, 0.0), (12_000.0, 1.0)]),
            ],
        );
        let svg = rendered(&c);
        // n points become 2n - 1 corners.
        let most = |color| {
            shapes(&svg, "polyline", color)
                .iter()
                .map(|e| npoints(e))
                .max()
        };
        assert_eq!(most(BLUE), Some(5));
        assert_eq!(most(ORANGE), Some(3));
        assert!(
            svg.contains("≤ x"),
            "text is kept as it is, not as glyph paths"
        );
    }

    #[test]
    fn stacked_areas_draw_one_band_per_series() {
        let c = chart(
            Kind::StackedArea,
            Axis::linear("seconds"),
            Axis::linear("tokens / s"),
            vec![Series::new("A", 0, pts(1.0)), Series::new("B", 1, pts(2.0))],
        );
        let svg = rendered(&c);
        for color in [BLUE, ORANGE] {
            let bands = shapes(&svg, "polygon", color);
            assert_eq!(bands.len(), 1, "{color}: {svg}");
            assert_eq!(npoints(bands[0]), 10, "5 on top, 5 below");
        }
    }

    #[test]
    fn stacked_bars_draw_one_bar_per_point_and_series() {
        let mut with_zero = pts(2.0);
        with_zero[2].1 = 0.0;
        let c = chart(
            Kind::StackedBars { width: 1.0 },
            Axis::linear("seconds into the arm"),
            Axis::linear("requests started"),
            vec![
                Series::new("stable", 0, pts(1.0)),
                Series::new("canary", 1, with_zero),
            ],
        );
        let svg = rendered(&c);
        // Each bar and the legend's swatch; a zero value draws no bar.
        assert_eq!(shapes(&svg, "rect", BLUE).len(), 5 + 1, "{svg}");
        assert_eq!(shapes(&svg, "rect", ORANGE).len(), 4 + 1, "{svg}");
    }

    #[test]
    fn text_is_escaped() {
        let evil = "<script>alert('x')</script> & \"q\"\u{1}";
        let c = chart(
            Kind::Lines,
            Axis::linear(evil),
            Axis::linear("y"),
            vec![Series::new(evil, 0, vec![(0.0, 1.0), (1.0, 2.0)])],
        );
        let svg = Chart {
            title: evil.into(),
            ..c
        }
        .svg();
        check(&svg).unwrap();
        assert!(!svg.contains("<script") && !svg.contains('\u{1}'), "{svg}");
        let escaped =
            "&lt;script&gt;alert(&apos;x&apos;)&lt;/script&gt; &amp; &quot;q&quot;\u{fffd}";
        assert_eq!(
            svg.matches(escaped).count(),
            3,
            "title, x label, legend: {svg}"
        );
    }

    #[test]
    fn empty_and_degenerate_data_do_not_break_the_chart() {
        for series in [
            vec![],
            vec![Series::new("none", 0, vec![])],
            vec![Series::new("one", 0, vec![(3.0, 3.0)])],
            vec![Series::new(
                "bad",
                0,
                vec![(f64::NAN, 1.0), (1.0, f64::INFINITY)],
            )],
        ] {
            for kind in [
                Kind::Lines,
                Kind::StackedArea,
                Kind::StackedBars { width: 1.0 },
            ] {
                for y in [
                    Axis::linear("y"),
                    Axis::log("y"),
                    Axis::log("y").with_range(5.0, -1.0),
                ] {
                    let svg = chart(kind, Axis::linear("x"), y, series.clone()).svg();
                    check(&svg).unwrap();
                    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
                    assert!(!svg.contains("not drawn"), "{svg}");
                }
            }
        }
        let svg = chart(
            Kind::Lines,
            Axis::linear("x"),
            Axis::log("y"),
            vec![Series::new(
                "s",
                0,
                vec![(0.0, 0.0), (1.0, 5.0), (2.0, -1.0)],
            )],
        )
        .svg();
        assert_eq!(svg.matches("<circle").count(), 1, "only y = 5 is drawable");
    }

    #[test]
    fn ranges_fit_the_data_unless_fixed() {
        assert_eq!(
            Axis::linear("x").span([3.0, 100.0].into_iter()),
            (0.0, 105.0)
        );
        assert_eq!(Axis::linear("x").span(std::iter::empty()), (0.0, 1.0));
        let (lo, hi) = Axis::linear("x").span([0.7, 0.8].into_iter());
        assert!(lo == 0.7 && hi > 0.8, "{lo} {hi}");
        let fixed = Axis::linear("x").with_range(0.0, 1.0);
        assert_eq!(fixed.span([5.0].into_iter()), (0.0, 1.0));
        let log = Axis::log("ms");
        assert_eq!(
            log.span([0.0, 3.0, 4000.0, -2.0].into_iter()),
            (1.0, 10_000.0)
        );
        assert_eq!(log.span([20.0, 20.0].into_iter()), (10.0, 100.0));
    }

    #[test]
    fn a_long_legend_wraps_and_makes_room() {
        let many: Vec<Series> = (0..6)
            .map(|i| {
                Series::new(
                    &format!("a rather long series name {i}"),
                    i,
                    vec![(0.0, 1.0)],
                )
            })
            .collect();
        let c = chart(Kind::Lines, Axis::linear("x"), Axis::linear("y"), many);
        let layout = c.legend_layout();
        assert!(layout.iter().all(|(x, _)| *x < WIDTH as i32 - RIGHT));
        assert!(layout.windows(2).all(|w| w[0].1 <= w[1].1));
        let rows = layout.last().unwrap().1 + 1;
        assert!(rows >= 3, "{layout:?}");
        let svg = rendered(&c);
        let height = HEIGHT + LEGEND_ROW.unsigned_abs() * rows.unsigned_abs();
        assert!(svg.contains(&format!("height=\"{height}\"")), "{svg}");
    }

    #[test]
    fn tick_labels_are_short() {
        for (v, s) in [
            (0.5, "0.5"),
            (20.0, "20"),
            (0.6000000000000001, "0.6"),
            (15_000.0, "15k"),
            (1500.0, "1.5k"),
            (999.0, "999"),
            (2_000_000.0, "2M"),
            (-0.0001, "0"),
        ] {
            assert_eq!(tick_label(v), s);
        }
    }

    #[test]
    fn stacks_sum_the_series() {
        let s = vec![
            Series::new("a", 0, vec![(0.0, 0.75), (1.0, 0.5)]),
            Series::new("b", 1, vec![(0.0, 0.25), (1.0, f64::NAN)]),
        ];
        assert_eq!(cumulative(&s), vec![vec![0.75, 0.5], vec![1.0, 0.5]]);
    }
}
