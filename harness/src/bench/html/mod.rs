//! The demo's HTML report: one self-contained `.html` file written next to the text table
//! of a run, with inline SVG charts ([`Chart`]), readable offline in any browser (no script,
//! no stylesheet or font fetched, nothing loaded from the network).
//!
//! A [`Page`] is a title and a list of [`Block`]s (headings, paragraphs, charts, the text
//! report itself, preformatted); [`ttft_cdf`] draws the chart every scenario shows, the
//! distribution of time to first token of each side. [`write_run`] writes a run's text and
//! its page into the run's directory, and names both files.

mod chart;
#[cfg(test)]
pub(crate) mod wellformed;

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use self::chart::{Axis, Chart, Kind, Series};

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

/// One piece of a page.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A section heading.
    Heading(String),
    /// A paragraph of plain text.
    Paragraph(String),
    /// A chart, drawn inline.
    Chart(Chart),
    /// Preformatted text (a text table), shown as it is.
    Pre(String),
}

/// A whole report page.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page {
    /// The page's title and top heading.
    pub title: String,
    /// What follows, in order.
    pub blocks: Vec<Block>,
}

const STYLE: &str = "body{font-family:sans-serif;max-width:760px;margin:24px auto;\
padding:0 12px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}\
p{line-height:1.45}pre{font-size:11px;background:#f6f6f6;padding:8px;overflow-x:auto}\
figure{margin:12px 0}";

impl Page {
    /// A page titled `title`.
    pub fn new(title: &str) -> Page {
        Page {
            title: title.to_string(),
            blocks: Vec::new(),
        }
    }

    /// Appends a block.
    pub fn push(&mut self, block: Block) -> &mut Page {
        self.blocks.push(block);
        self
    }

    /// The page as one HTML document.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
             <title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>\n",
            t = escape(&self.title)
        );
        for b in &self.blocks {
            match b {
                Block::Heading(h) => {
                    let _ = writeln!(out, "<h2>{}</h2>", escape(h));
                }
                Block::Paragraph(p) => {
                    let _ = writeln!(out, "<p>{}</p>", escape(p));
                }
                Block::Chart(c) => {
                    let _ = writeln!(out, "<figure>{}</figure>", c.svg());
                }
                Block::Pre(t) => {
                    let _ = writeln!(out, "<pre>{}</pre>", escape(t));
                }
            }
        }
        out.push_str("</body></html>\n");
        out
    }
}

/// Most points a distribution's line keeps (quantiles at evenly spaced ranks): enough for
/// a smooth curve, few enough to keep the file small.
pub const CDF_POINTS: usize = 400;

/// The fraction of requests whose TTFT is at most x, one line per side (`(label, TTFT
/// seconds)`), on a log axis of milliseconds: a CDF shows the median and the tail at once,
/// and the log axis keeps a 10 ms side and a 10 s side readable on one chart.
pub fn ttft_cdf(title: &str, sides: &[(String, Vec<f64>)]) -> Chart {
    let series = sides
        .iter()
        .enumerate()
        .map(|(i, (label, ttfts))| Series::new(label, i, cdf_points(ttfts, 1000.0)))
        .collect();
    Chart {
        title: title.to_string(),
        x: Axis::log("time to first token (ms, log scale)"),
        y: Axis::linear("fraction of requests ≤ x").with_range(0.0, 1.0),
        kind: Kind::Steps,
        series,
    }
}

/// The empirical CDF of `values × scale` (finite values only) as `(value, fraction ≤
/// value)` points: the smallest value at 0 (where the curve rises from), then at most
/// [`CDF_POINTS`] quantiles.
pub fn cdf_points(values: &[f64], scale: f64) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values
        .iter()
        .map(|x| x * scale)
        .filter(|x| x.is_finite())
        .collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let keep = n.min(CDF_POINTS);
    let start = v.first().map(|x| (*x, 0.0));
    start
        .into_iter()
        .chain((1..=keep).filter_map(|k| {
            // The rank of the k-th kept point, the last one always the maximum.
            let rank = (k * n).div_ceil(keep);
            v.get(rank - 1).map(|x| (*x, rank as f64 / n as f64))
        }))
        .collect()
}

/// A directory of this demo run's own under the system temp dir
/// (`infergate-demo-<scenario>-<pid>`), created if needed: the run's text report, its HTML
/// page and any logs go there and stay after the demo.
pub fn run_dir(scenario: &str) -> Result<PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("infergate-demo-{scenario}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Writes `text` as `report.txt` and `page` as `report.html` into `dir`, and returns the
/// line that names them (for the end of the text the demo prints).
pub fn write_run(dir: &Path, text: &str, page: &Page) -> Result<String> {
    let txt = dir.join("report.txt");
    let html = dir.join("report.html");
    std::fs::write(&txt, text).with_context(|| format!("writing {}", txt.display()))?;
    std::fs::write(&html, page.render()).with_context(|| format!("writing {}", html.display()))?;
    Ok(format!(
        "report: {} (this text) and {} (charts; open it in a browser, it needs no network)",
        txt.display(),
        html.display()
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::wellformed::check;
    use super::*;

    #[test]
    fn a_page_is_one_well_formed_document_without_script_or_links() {
        let mut page = Page::new("demo <&>");
        page.push(Block::Heading("h & h".into()))
            .push(Block::Paragraph("a < b".into()))
            .push(Block::Pre("col  <x>\n1    2".into()))
            .push(Block::Chart(ttft_cdf(
                "TTFT",
                &[
                    ("gateway".into(), vec![0.010, 0.012, 0.3]),
                    ("/rr".into(), vec![0.15, 0.2, 12.0]),
                ],
            )));
        let html = page.render();
        check(&html).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        for forbidden in ["<script", "src=", "href=", "http://", "https://", "url("] {
            let hits: Vec<_> = html
                .match_indices(forbidden)
                .filter(|(i, _)| !html[*i..].starts_with("http://www.w3.org/2000/svg"))
                .collect();
            assert!(hits.is_empty(), "{forbidden} in {html}");
        }
        assert!(html.contains("<title>demo &lt;&amp;&gt;</title>"));
        assert!(html.contains("col  &lt;x&gt;"));
        assert_eq!(html, page.render());
        assert_eq!(escape("a\u{1}b'\"\n"), "a\u{fffd}b&#39;&quot;\n");
    }

    #[test]
    fn cdf_points_are_quantiles_ending_at_the_maximum() {
        assert_eq!(cdf_points(&[], 1.0), vec![]);
        assert_eq!(
            cdf_points(&[0.3, 0.1, f64::NAN, 0.2], 10.0),
            vec![(1.0, 0.0), (1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]
        );
        let many: Vec<f64> = (1..=1000).map(f64::from).collect();
        let p = cdf_points(&many, 1.0);
        assert_eq!(p.len(), CDF_POINTS + 1);
        assert_eq!(p.first(), Some(&(1.0, 0.0)));
        assert_eq!(p.last(), Some(&(1000.0, 1.0)));
        assert!(p[1..]
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        // The median is where the curve crosses one half.
        let half = p.iter().find(|(_, f)| *f >= 0.5).unwrap();
        assert_eq!(half.0, 500.0);
    }

    #[test]
    fn write_run_writes_both_files() {
        let dir = std::env::temp_dir().join(format!("infergate-html-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = write_run(&dir, "table\n", &Page::new("x")).unwrap();
        assert!(
            line.contains("report.html") && line.contains("report.txt"),
            "{line}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("report.txt")).unwrap(),
            "table\n"
        );
        check(&std::fs::read_to_string(dir.join("report.html")).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
