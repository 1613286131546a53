//! Small SVG charts for the demo's HTML report: lines (optionally as steps or dashed),
//! stacked areas and stacked bars over one x and one y axis, each axis linear or log10,
//! with ticks, grid lines, axis labels, a title and a legend.
//!
//! The output is plain SVG 1.1 text meant to be inlined into an HTML page: no script, no
//! external reference, no font file. It is deterministic (the same chart renders to the
//! same bytes: numbers are printed with a fixed precision, series keep their order), and
//! every piece of text is escaped, so a tenant or label name cannot break the document.
//!
//! Ranges come from the data unless fixed: a linear axis is widened to "nice" tick steps
//! (1, 2 or 5 × 10ⁿ) and starts at zero when all its values are positive and close enough
//! to it; a log axis spans whole decades around its positive values and leaves out points
//! that are zero or negative (a log axis cannot show them). Non-finite values are skipped.

use std::fmt::Write;

/// How values map onto an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Evenly spaced decades; only positive values are shown.
    Log10,
}

/// One axis: its label, scale and optional fixed range.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The label under (x) or beside (y) the axis.
    pub label: String,
    /// Linear or log10.
    pub scale: Scale,
    /// A fixed `(min, max)`; `None`: from the data.
    pub range: Option<(f64, f64)>,
}

impl Axis {
    /// A linear axis fitted to the data.
    pub fn linear(label: &str) -> Axis {
        Axis {
            label: label.to_string(),
            scale: Scale::Linear,
            range: None,
        }
    }

    /// A log10 axis fitted to the data.
    pub fn log(label: &str) -> Axis {
        Axis {
            scale: Scale::Log10,
            ..Axis::linear(label)
        }
    }

    /// The same axis with a fixed range.
    pub fn with_range(mut self, min: f64, max: f64) -> Axis {
        self.range = Some((min, max));
        self
    }
}

/// How a chart draws its series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Each series a polyline through its points in order.
    Lines,
    /// Each series a staircase: a value holds until the next point's x (a CDF, a rate per
    /// window).
    Steps,
    /// Series stacked on each other, by point index (every series should have the same xs):
    /// the areas between consecutive cumulative sums.
    StackedArea,
    /// Series stacked as bars centred on each x, `width` x-units wide, by point index.
    StackedBars {
        /// Bar width in x units.
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
    /// Drawn dashed (a reference line, a second statistic of the same group).
    pub dashed: bool,
    /// Colour index into the palette (series with the same index share a colour).
    pub color: usize,
}

impl Series {
    /// A solid series in palette colour `color`.
    pub fn new(name: &str, color: usize, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.to_string(),
            points,
            dashed: false,
            color,
        }
    }

    /// The same series drawn dashed.
    pub fn dashed(mut self) -> Series {
        self.dashed = true;
        self
    }
}

/// A chart: title, axes, series, and how to draw them.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Shown above the plot.
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
pub const PALETTE: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
];

/// The whole SVG's size in pixels.
pub const WIDTH: f64 = 720.0;
/// See [`WIDTH`].
pub const HEIGHT: f64 = 340.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 20.0;
/// The title's baseline; the legend's rows follow it.
const TITLE_Y: f64 = 20.0;
/// Height of one legend row.
const LEGEND_ROW: f64 = 16.0;
const BOTTOM: f64 = 50.0;

/// `text` with `& < > " '` replaced by entities: safe in element text and in quoted
/// attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML text at all.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A tick label: short, without trailing zeros, deterministic (`0.5`, `20`, `1.5k`, `2M`).
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let mut s = format!("{scaled:.3}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    if s == "-0" {
        s = "0".into();
    }
    s + suffix
}

/// A resolved axis: its data range and ticks, and the map onto pixels.
#[derive(Clone, Debug, PartialEq)]
struct Mapped {
    scale: Scale,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Mapped {
    fn fit(axis: &Axis, values: &[f64]) -> Mapped {
        let usable: Vec<f64> = values
            .iter()
            .copied()
            .filter(|v| v.is_finite() && (axis.scale == Scale::Linear || *v > 0.0))
            .collect();
        let (mut lo, mut hi) = match axis.range {
            Some(r) => r,
            None => usable
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                    (a.min(*v), b.max(*v))
                }),
        };
        match axis.scale {
            Scale::Linear => {
                if !lo.is_finite() || !hi.is_finite() {
                    (lo, hi) = (0.0, 1.0);
                }
                if axis.range.is_none() && lo > 0.0 && lo < hi * 0.5 {
                    lo = 0.0;
                }
                if hi <= lo {
                    hi = lo + 1.0;
                }
                let step = nice_step((hi - lo) / 5.0);
                if axis.range.is_none() {
                    lo = (lo / step).floor() * step;
                    hi = (hi / step).ceil() * step;
                }
                let first = (lo / step).ceil() as i64;
                let last = (hi / step).floor() as i64;
                let ticks = (first..=last).map(|i| i as f64 * step).collect();
                Mapped {
                    scale: Scale::Linear,
                    lo,
                    hi,
                    ticks,
                }
            }
            Scale::Log10 => {
                if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && hi > 0.0) {
                    (lo, hi) = (1.0, 10.0);
                }
                let (mut dlo, mut dhi) = (lo.log10().floor(), hi.log10().ceil());
                if dhi <= dlo {
                    dhi = dlo + 1.0;
                }
                if axis.range.is_some() {
                    (dlo, dhi) = (lo.log10(), hi.log10().max(lo.log10() + 1e-9));
                }
                let decades = (dhi - dlo).ceil().max(1.0) as i64;
                // Few decades: label 1, 2 and 5 of each; many: the decades only.
                let steps: &[f64] = if decades <= 2 {
                    &[1.0, 2.0, 5.0]
                } else {
                    &[1.0]
                };
                let mut ticks = Vec::new();
                for d in (dlo.floor() as i64)..=(dhi.ceil() as i64) {
                    for m in steps {
                        let v = m * 10f64.powi(d as i32);
                        let l = v.log10();
                        if l >= dlo - 1e-9 && l <= dhi + 1e-9 {
                            ticks.push(v);
                        }
                    }
                }
                Mapped {
                    scale: Scale::Log10,
                    lo: 10f64.powf(dlo),
                    hi: 10f64.powf(dhi),
                    ticks,
                }
            }
        }
    }

    /// Where `v` falls between the ends, 0..=1 (outside for values out of range); `None`
    /// for a value the axis cannot show.
    fn frac(&self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        match self.scale {
            Scale::Linear => Some((v - self.lo) / (self.hi - self.lo)),
            Scale::Log10 if v > 0.0 => {
                Some((v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10()))
            }
            Scale::Log10 => None,
        }
    }
}

/// 1, 2 or 5 × 10ⁿ, the smallest at least `raw` (positive).
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag)
}

/// A pixel coordinate, to one decimal.
fn px(v: f64) -> String {
    format!("{v:.1}")
}

struct Frame {
    x: Mapped,
    y: Mapped,
    /// The plot's top edge: below the title and the legend's rows.
    top: f64,
}

impl Frame {
    fn plot_w() -> f64 {
        WIDTH - LEFT - RIGHT
    }

    fn plot_h(&self) -> f64 {
        HEIGHT - self.top - BOTTOM
    }

    /// The pixel of `(x, y)`, clamped a little outside the plot so an out-of-range point
    /// still draws towards its side; `None` when an axis cannot show it.
    fn at(&self, x: f64, y: f64) -> Option<(f64, f64)> {
        let fx = self.x.frac(x)?.clamp(-0.02, 1.02);
        let fy = self.y.frac(y)?.clamp(-0.02, 1.02);
        Some((
            LEFT + fx * Self::plot_w(),
            self.top + (1.0 - fy) * self.plot_h(),
        ))
    }
}

impl Chart {
    /// The chart as one `<svg>` element.
    pub fn svg(&self) -> String {
        let stacked = matches!(self.kind, Kind::StackedArea | Kind::StackedBars { .. });
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(match self.kind {
                // A bar reaches half its width beyond its centre.
                Kind::StackedBars { width } => self
                    .series
                    .iter()
                    .flat_map(|s| s.points.iter())
                    .flat_map(|p| [p.0 - width / 2.0, p.0 + width / 2.0])
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        let ys: Vec<f64> = if stacked {
            let mut v = cumulative(&self.series)
                .into_iter()
                .flatten()
                .collect::<Vec<_>>();
            v.push(0.0);
            v
        } else {
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
                .collect()
        };
        let legend = self.legend_layout();
        let rows = legend.iter().map(|e| e.1).max().map_or(0, |r| r + 1);
        let frame = Frame {
            x: Mapped::fit(&self.x, &xs),
            y: Mapped::fit(&self.y, &ys),
            top: TITLE_Y + 12.0 + LEGEND_ROW * rows as f64,
        };
        let mut out = String::new();
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\" \
             role=\"img\"><title>{t}</title>",
            w = WIDTH,
            h = HEIGHT,
            t = escape(&self.title)
        );
        let _ = write!(
            out,
            "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#ffffff\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            px(LEFT),
            px(TITLE_Y),
            escape(&self.title)
        );
        self.axes(&mut out, &frame);
        match self.kind {
            Kind::Lines | Kind::Steps => self.lines(&mut out, &frame),
            Kind::StackedArea => self.areas(&mut out, &frame),
            Kind::StackedBars { width } => self.bars(&mut out, &frame, width),
        }
        self.legend(&mut out, &legend);
        out.push_str("</svg>");
        out
    }

    fn axes(&self, out: &mut String, f: &Frame) {
        let (x0, x1) = (LEFT, LEFT + Frame::plot_w());
        let (y0, y1) = (f.top + f.plot_h(), f.top);
        out.push_str("<g stroke=\"#dddddd\" stroke-width=\"1\">");
        for t in &f.y.ticks {
            if let Some(fy) = f.y.frac(*t) {
                let y = f.top + (1.0 - fy) * f.plot_h();
                let _ = write!(
                    out,
                    "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>",
                    px(x0),
                    px(y),
                    px(x1),
                    px(y)
                );
            }
        }
        for t in &f.x.ticks {
            if let Some(fx) = f.x.frac(*t) {
                let x = LEFT + fx * Frame::plot_w();
                let _ = write!(
                    out,
                    "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>",
                    px(x),
                    px(y0),
                    px(x),
                    px(y1)
                );
            }
        }
        out.push_str("</g>");
        let _ = write!(
            out,
            "<g stroke=\"#333333\" stroke-width=\"1\"><line x1=\"{a}\" y1=\"{b}\" x2=\"{c}\" \
             y2=\"{b}\"/><line x1=\"{a}\" y1=\"{b}\" x2=\"{a}\" y2=\"{d}\"/></g>",
            a = px(x0),
            b = px(y0),
            c = px(x1),
            d = px(y1)
        );
        out.push_str("<g fill=\"#333333\">");
        for t in &f.x.ticks {
            if let Some(fx) = f.x.frac(*t) {
                let _ = write!(
                    out,
                    "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                    px(LEFT + fx * Frame::plot_w()),
                    px(y0 + 16.0),
                    escape(&tick_label(*t))
                );
            }
        }
        for t in &f.y.ticks {
            if let Some(fy) = f.y.frac(*t) {
                let _ = write!(
                    out,
                    "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                    px(x0 - 6.0),
                    px(f.top + (1.0 - fy) * f.plot_h() + 4.0),
                    escape(&tick_label(*t))
                );
            }
        }
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}\
             </text></g>",
            px(LEFT + Frame::plot_w() / 2.0),
            px(HEIGHT - 12.0),
            escape(&self.x.label),
            px(f.top + f.plot_h() / 2.0),
            px(f.top + f.plot_h() / 2.0),
            escape(&self.y.label)
        );
    }

    fn lines(&self, out: &mut String, f: &Frame) {
        for s in &self.series {
            let mut pts: Vec<(f64, f64)> = Vec::new();
            let mut prev: Option<(f64, f64)> = None;
            for &(x, y) in &s.points {
                let Some(p) = f.at(x, y) else { continue };
                if self.kind == Kind::Steps {
                    if let Some((_, py)) = prev {
                        pts.push((p.0, py));
                    }
                }
                pts.push(p);
                prev = Some(p);
            }
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts
                .iter()
                .map(|(x, y)| format!("{},{}", px(*x), px(*y)))
                .collect();
            let _ = write!(
                out,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\">\
                 <title>{}</title></polyline>",
                color(s.color),
                if s.dashed {
                    " stroke-dasharray=\"6 4\""
                } else {
                    ""
                },
                path.join(" "),
                escape(&s.name)
            );
            if pts.len() == 1 {
                let (x, y) = pts[0];
                let _ = write!(
                    out,
                    "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>",
                    px(x),
                    px(y),
                    color(s.color)
                );
            }
        }
    }

    fn areas(&self, out: &mut String, f: &Frame) {
        let sums = cumulative(&self.series);
        let xs: Vec<f64> = self
            .series
            .first()
            .map(|s| s.points.iter().map(|p| p.0).collect())
            .unwrap_or_default();
        for (i, s) in self.series.iter().enumerate() {
            let upper = sums.get(i).cloned().unwrap_or_default();
            let lower = if i == 0 {
                vec![0.0; upper.len()]
            } else {
                sums.get(i - 1).cloned().unwrap_or_default()
            };
            let mut pts: Vec<String> = Vec::new();
            for (x, y) in xs.iter().zip(&upper) {
                if let Some((px_, py)) = f.at(*x, *y) {
                    pts.push(format!("{},{}", px(px_), px(py)));
                }
            }
            for (x, y) in xs.iter().zip(&lower).rev() {
                if let Some((px_, py)) = f.at(*x, *y) {
                    pts.push(format!("{},{}", px(px_), px(py)));
                }
            }
            if pts.len() < 3 {
                continue;
            }
            let _ = write!(
                out,
                "<polygon fill=\"{c}\" fill-opacity=\"0.75\" stroke=\"{c}\" points=\"{}\">\
                 <title>{}</title></polygon>",
                pts.join(" "),
                escape(&s.name),
                c = color(s.color)
            );
        }
    }

    fn bars(&self, out: &mut String, f: &Frame, width: f64) {
        let sums = cumulative(&self.series);
        for (i, s) in self.series.iter().enumerate() {
            for (j, &(x, _)) in s.points.iter().enumerate() {
                let top = sums.get(i).and_then(|v| v.get(j)).copied().unwrap_or(0.0);
                let bottom = if i == 0 {
                    0.0
                } else {
                    sums.get(i - 1)
                        .and_then(|v| v.get(j))
                        .copied()
                        .unwrap_or(0.0)
                };
                let (Some(a), Some(b)) =
                    (f.at(x - width * 0.4, top), f.at(x + width * 0.4, bottom))
                else {
                    continue;
                };
                let h = b.1 - a.1;
                if h <= 0.0 {
                    continue;
                }
                let _ = write!(
                    out,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\">\
                     <title>{}: {}</title></rect>",
                    px(a.0),
                    px(a.1),
                    px((b.0 - a.0).max(1.0)),
                    px(h),
                    color(s.color),
                    escape(&s.name),
                    escape(&tick_label(top - bottom))
                );
            }
        }
    }

    /// Where each legend entry goes: its x and its row. Entries wrap to a new row when
    /// the next would pass the right edge (text width estimated at 7 px a character).
    fn legend_layout(&self) -> Vec<(f64, usize)> {
        let mut out = Vec::new();
        let (mut x, mut row) = (LEFT, 0);
        for s in &self.series {
            let w = 22.0 + 7.0 * s.name.chars().count() as f64 + 16.0;
            if x > LEFT && x + w > WIDTH - RIGHT {
                (x, row) = (LEFT, row + 1);
            }
            out.push((x, row));
            x += w;
        }
        out
    }

    fn legend(&self, out: &mut String, layout: &[(f64, usize)]) {
        out.push_str("<g>");
        for (s, &(x, row)) in self.series.iter().zip(layout) {
            let y = TITLE_Y + LEGEND_ROW * (row as f64 + 1.0);
            let _ = write!(
                out,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" \
                 stroke-width=\"{}\"{}/>\
                 <text x=\"{}\" y=\"{}\">{}</text>",
                px(x),
                px(y - 4.0),
                px(x + 18.0),
                px(y - 4.0),
                color(s.color),
                if matches!(self.kind, Kind::Lines | Kind::Steps) {
                    "2"
                } else {
                    "8"
                },
                if s.dashed {
                    " stroke-dasharray=\"6 4\""
                } else {
                    ""
                },
                px(x + 22.0),
                px(y),
                escape(&s.name)
            );
        }
        out.push_str("</g>");
    }
}

fn color(i: usize) -> &'static str {
    PALETTE.get(i % PALETTE.len()).copied().unwrap_or("#000000")
}

/// The running sums of the series' y values by point index (non-finite or negative values
/// count as 0): `out[i][j]` = Σ of series 0..=i at point j.
fn cumulative(series: &[Series]) -> Vec<Vec<f64>> {
    let mut out: Vec<Vec<f64>> = Vec::new();
    for s in series {
        let below = out.last().cloned().unwrap_or_default();
        let row = s
            .points
            .iter()
            .enumerate()
            .map(|(j, p)| {
                let v = if p.1.is_finite() && p.1 > 0.0 {
                    p.1
                } else {
                    0.0
                };
                below.get(j).copied().unwrap_or(0.0) + v
            })
            .collect();
        out.push(row);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::wellformed::check;
    use super::*;

    fn chart(kind: Kind, x: Axis, y: Axis, series: Vec<Series>) -> Chart {
        Chart {
            title: "t".into(),
            x,
            y,
            kind,
            series,
        }
    }

    /// Every `<text>` content of `svg`.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|s| s.split_once('>').map(|(_, r)| r))
            .filter_map(|s| s.split_once("</text>").map(|(t, _)| t.to_string()))
            .collect()
    }

    #[test]
    fn text_is_escaped_and_the_svg_is_well_formed() {
        let evil = "<script>alert('x')</script> & \"q\"";
        let c = Chart {
            title: evil.into(),
            ..chart(
                Kind::Lines,
                Axis::linear(evil),
                Axis::linear("y"),
                vec![Series::new(evil, 0, vec![(0.0, 1.0), (1.0, 2.0)])],
            )
        };
        let svg = c.svg();
        check(&svg).unwrap();
        assert!(!svg.contains("<script"), "{svg}");
        let escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;";
        assert!(svg.contains(escaped));
        assert_eq!(escape("a\u{1}b"), "a\u{fffd}b");
    }

    #[test]
    fn every_kind_renders_well_formed_and_deterministic() {
        let pts = |k: f64| {
            (0..5)
                .map(|i| (f64::from(i), k * f64::from(i + 1)))
                .collect()
        };
        for kind in [
            Kind::Lines,
            Kind::Steps,
            Kind::StackedArea,
            Kind::StackedBars { width: 1.0 },
        ] {
            let c = chart(
                kind,
                Axis::linear("x"),
                Axis::linear("y"),
                vec![
                    Series::new("a", 0, pts(1.0)),
                    Series::new("b", 1, pts(2.0)).dashed(),
                ],
            );
            let svg = c.svg();
            check(&svg).unwrap_or_else(|e| panic!("{kind:?}: {e}\n{svg}"));
            assert_eq!(svg, c.clone().svg(), "{kind:?}");
            assert!(
                !svg.contains("NaN") && !svg.contains("inf"),
                "{kind:?}: {svg}"
            );
            let shapes = match kind {
                Kind::Lines | Kind::Steps => svg.matches("<polyline").count(),
                Kind::StackedArea => svg.matches("<polygon").count(),
                Kind::StackedBars { .. } => svg.matches("<rect").count() - 1,
            };
            let expected = if matches!(kind, Kind::StackedBars { .. }) {
                10
            } else {
                2
            };
            assert_eq!(shapes, expected, "{kind:?}");
        }
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
            for y in [Axis::linear("y"), Axis::log("y")] {
                let svg = chart(Kind::Lines, Axis::linear("x"), y, series.clone()).svg();
                check(&svg).unwrap();
                assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
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
    fn linear_ticks_are_nice_and_cover_the_data() {
        let m = Mapped::fit(&Axis::linear("x"), &[3.0, 97.0]);
        assert_eq!((m.lo, m.hi), (0.0, 100.0));
        assert_eq!(m.ticks, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let m = Mapped::fit(&Axis::linear("x"), &[0.71, 0.78]);
        assert!(m.lo <= 0.71 && m.hi >= 0.78 && m.lo > 0.5, "{m:?}");
        let fixed = Mapped::fit(&Axis::linear("x").with_range(0.0, 1.0), &[5.0]);
        assert_eq!((fixed.lo, fixed.hi), (0.0, 1.0));
        assert_eq!(
            fixed.ticks,
            vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
        );
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(7.0), 10.0);
    }

    #[test]
    fn log_axes_span_decades_and_skip_non_positive_values() {
        let m = Mapped::fit(&Axis::log("ms"), &[0.0, 3.0, 4000.0, -2.0]);
        assert_eq!((m.lo, m.hi), (1.0, 10_000.0));
        assert_eq!(m.ticks, vec![1.0, 10.0, 100.0, 1000.0, 10_000.0]);
        let narrow = Mapped::fit(&Axis::log("ms"), &[12.0, 80.0]);
        assert_eq!(narrow.ticks, vec![10.0, 20.0, 50.0, 100.0]);
        assert_eq!(narrow.frac(10.0), Some(0.0));
        assert_eq!(narrow.frac(100.0), Some(1.0));
        assert_eq!(narrow.frac(0.0), None);
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(20.0), "20");
        assert_eq!(tick_label(0.6000000000000001), "0.6");
        assert_eq!(tick_label(15_000.0), "15k");
        assert_eq!(tick_label(1500.0), "1.5k");
        assert_eq!(tick_label(999.0), "999");
        assert_eq!(tick_label(2_000_000.0), "2M");
        assert_eq!(tick_label(-0.0001), "0");
    }

    #[test]
    fn points_land_inside_the_plot() {
        let c = chart(
            Kind::Lines,
            Axis::linear("x").with_range(0.0, 10.0),
            Axis::linear("y").with_range(0.0, 1.0),
            vec![Series::new("s", 0, vec![(0.0, 0.0), (10.0, 1.0)])],
        );
        let svg = c.svg();
        // One legend row: the plot starts below it.
        let (l, t) = (LEFT, TITLE_Y + 12.0 + LEGEND_ROW);
        let (r, b) = (WIDTH - RIGHT, HEIGHT - BOTTOM);
        assert!(
            svg.contains(&format!(
                "points=\"{},{} {},{}\"",
                px(l),
                px(b),
                px(r),
                px(t)
            )),
            "{svg}"
        );
        assert!(texts(&svg).contains(&"10".to_string()));
    }

    #[test]
    fn a_long_legend_wraps_and_pushes_the_plot_down() {
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
        assert!(layout.iter().all(|(x, _)| *x < WIDTH - RIGHT));
        let rows = layout.iter().map(|e| e.1).max().unwrap() + 1;
        assert!(rows >= 3, "{layout:?}");
        assert!(layout.windows(2).all(|w| w[0].1 <= w[1].1));
        check(&c.svg()).unwrap();
    }

    #[test]
    fn stacked_areas_sum_the_series() {
        let s = vec![
            Series::new("a", 0, vec![(0.0, 0.75), (1.0, 0.5)]),
            Series::new("b", 1, vec![(0.0, 0.25), (1.0, f64::NAN)]),
        ];
        assert_eq!(cumulative(&s), vec![vec![0.75, 0.5], vec![1.0, 0.5]]);
    }
}
