//! The tenants scenario's HTML page: A's and B's time to first token through the gateway
//! and through `/rr`, and for the saturation phase the service share per tenant over time
//! (with the weights' target), the tokens served per second, the queue time per priority
//! over time, and the best-effort tenant's 429s per window; then the text report itself.

use super::saturation::{SaturationFigures, BEST_EFFORT_BAND, TENANT_C, WEIGHT_A, WEIGHT_B};
use super::saturation_report::{priorities, target_share};
use super::windows::{SATURATED, TTL_EXPIRED};
use super::{RunFigures, TENANT_A, TENANT_B};
use crate::bench::html::{ttft_cdf, Axis, Block, Chart, Kind, Page, Series};

/// The time axis of the phase's charts: from 0 to the end of the last window.
fn time_axis(f: &SaturationFigures) -> Axis {
    let end = f.windows.last().map_or(f.load_s, |w| w.end_s);
    Axis::linear("seconds since the phase began").with_range(0.0, end.max(f.window_s))
}

/// The x of a window on the charts: its middle.
fn mid(start: f64, end: f64) -> f64 {
    (start + end) / 2.0
}

/// TTFT of each class in each run, one line per (run, class) with answers.
fn ttft_chart(runs: &[RunFigures], class: usize, name: &str) -> Chart {
    let sides: Vec<(String, Vec<f64>)> = runs
        .iter()
        .filter_map(|r| {
            let c = r.classes.get(class)?;
            let t: Vec<f64> = c
                .records
                .iter()
                .filter(|x| x.ok())
                .filter_map(|x| x.ttft_s)
                .collect();
            (!t.is_empty()).then(|| {
                let label = format!(
                    "{} (p50 {:.0} ms, p99 {:.0} ms)",
                    r.label,
                    c.summary.ttft_p50_s * 1000.0,
                    c.summary.ttft_p99_s * 1000.0
                );
                (label, t)
            })
        })
        .collect();
    ttft_cdf(
        &format!("{name}: time to first token, answered requests"),
        &sides,
    )
}

/// Service share of A, B and C per window, with the target shares dashed.
pub fn share_chart(f: &SaturationFigures) -> Chart {
    let all = [TENANT_A, TENANT_B, TENANT_C];
    let mut series: Vec<Series> = all
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let points = f
                .windows
                .iter()
                .filter(|w| w.served.values().sum::<u64>() > 0)
                .map(|w| (mid(w.start_s, w.end_s), w.share(t, &all)))
                .collect();
            Series::new(t, i, points)
        })
        .collect();
    let span = (0.0, f.windows.last().map_or(f.load_s, |w| w.end_s));
    let target = target_share();
    series.push(
        Series::new(
            &format!("A's target {WEIGHT_A}/{}", WEIGHT_A + WEIGHT_B),
            0,
            vec![(span.0, target), (f.load_s, target)],
        )
        .dashed(),
    );
    series.push(
        Series::new(
            &format!("B's target {WEIGHT_B}/{}", WEIGHT_A + WEIGHT_B),
            1,
            vec![(span.0, 1.0 - target), (f.load_s, 1.0 - target)],
        )
        .dashed(),
    );
    series.push(Series::new("load stops", 7, vec![(f.load_s, 0.0), (f.load_s, 1.0)]).dashed());
    Chart {
        title: format!(
            "Service share per tenant per {:.0} s window (prompt + 2 × completion tokens)",
            f.window_s
        ),
        x: time_axis(f),
        y: Axis::linear("share of tokens served").with_range(0.0, 1.0),
        kind: Kind::Lines,
        series,
    }
}

/// Tokens served per second, stacked per tenant.
pub fn throughput_chart(f: &SaturationFigures) -> Chart {
    let series = [TENANT_A, TENANT_B, TENANT_C]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let points = f
                .windows
                .iter()
                .map(|w| {
                    let v = w.served.get(*t).copied().unwrap_or(0) as f64;
                    (mid(w.start_s, w.end_s), v / f.window_s.max(1e-9))
                })
                .collect();
            Series::new(t, i, points)
        })
        .collect();
    Chart {
        title: "Tokens served per second (prompt + 2 × completion), stacked".into(),
        x: time_axis(f),
        y: Axis::linear("tokens / s"),
        kind: Kind::StackedArea,
        series,
    }
}

/// Queue time p50 (solid) and p99 (dashed) per priority per window, log scale.
pub fn queue_chart(f: &SaturationFigures) -> Chart {
    let mut series = Vec::new();
    for (i, p) in priorities(f).into_iter().enumerate() {
        let pts = |pick: fn(&super::windows::QueueTimes) -> f64| {
            f.windows
                .iter()
                .filter_map(|w| {
                    let q = w.queue.get(&p)?;
                    (q.requests > 0).then(|| (mid(w.start_s, w.end_s), pick(q).max(0.5)))
                })
                .collect::<Vec<_>>()
        };
        series.push(Series::new(
            &format!("priority {p} p50"),
            i,
            pts(|q| q.p50_ms),
        ));
        series.push(Series::new(&format!("priority {p} p99"), i, pts(|q| q.p99_ms)).dashed());
    }
    Chart {
        title: "Time queued in the gateway per priority, p50 and p99 per window".into(),
        x: time_axis(f),
        y: Axis::log("queued ms (log scale; 0 drawn at 0.5)"),
        kind: Kind::Lines,
        series,
    }
}

/// The best-effort tenant's 429s per window, stacked by reason.
pub fn rejections_chart(f: &SaturationFigures) -> Chart {
    let series = [SATURATED, TTL_EXPIRED]
        .iter()
        .enumerate()
        .map(|(i, reason)| {
            let points = f
                .windows
                .iter()
                .map(|w| (mid(w.start_s, w.end_s), w.rejected(TENANT_C, reason) as f64))
                .collect();
            Series::new(reason, i + 3, points)
        })
        .collect();
    Chart {
        title: format!(
            "429s of the best-effort band (priority {BEST_EFFORT_BAND}, tenant C) per {:.0} s \
             window",
            f.window_s
        ),
        x: time_axis(f),
        y: Axis::linear("429 answers"),
        kind: Kind::StackedBars { width: f.window_s },
        series,
    }
}

/// The whole page: the charts, the answers, then `text` (the full text report).
pub fn page(
    runs: &[RunFigures],
    saturation: Option<&SaturationFigures>,
    answers: &[String],
    text: &str,
) -> Page {
    let mut p = Page::new("infergate demo: two tenants, one pool");
    p.push(Block::Heading(
        "Time to first token, gateway with tenancy vs /rr".into(),
    ));
    p.push(Block::Chart(ttft_chart(
        runs,
        0,
        "tenant A (premium chats)",
    )));
    p.push(Block::Chart(ttft_chart(
        runs,
        1,
        "tenant B (batch of long prompts)",
    )));
    if let Some(f) = saturation {
        p.push(Block::Heading(format!(
            "Saturation with flow control: A weight {WEIGHT_A}, B weight {WEIGHT_B}, C best-effort"
        )));
        p.push(Block::Chart(share_chart(f)));
        p.push(Block::Chart(throughput_chart(f)));
        p.push(Block::Chart(queue_chart(f)));
        p.push(Block::Chart(rejections_chart(f)));
    }
    p.push(Block::Heading("What the runs say".into()));
    for a in answers {
        p.push(Block::Paragraph(a.clone()));
    }
    p.push(Block::Heading("The text report".into()));
    p.push(Block::Pre(text.to_string()));
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::windows::{queue_overall, windows, Sent, Stamped};
    use super::*;
    use crate::bench::html::wellformed::check;
    use serde_json::json;

    fn figures() -> SaturationFigures {
        let mut records = Vec::new();
        let mut sent = Vec::new();
        for i in 0..40 {
            let t = f64::from(i) * 0.25;
            let (tenant, priority) = match i % 4 {
                3 => (TENANT_B, 0),
                _ => (TENANT_A, 100),
            };
            records.push(Stamped {
                at_s: t,
                record: json!({"tenant": tenant, "priority": priority, "outcome": "complete",
                               "prompt_tokens": 384, "completion_tokens": 64,
                               "queued_ms": 100 + i}),
            });
            sent.push(Sent {
                tenant: TENANT_C.into(),
                done_s: t,
                status: 429,
                dropped_reason: Some(SATURATED.into()),
                ..Sent::default()
            });
        }
        SaturationFigures {
            load_s: 8.0,
            window_s: 2.0,
            windows: windows(&records, &sent, 2.0, 8.0),
            queue: queue_overall(&records),
            sent,
            records,
            ..SaturationFigures::default()
        }
    }

    #[test]
    fn the_page_draws_every_chart_well_formed() {
        let f = figures();
        let html = page(&[], Some(&f), &["A <got> in".into()], "table & text").render();
        check(&html).unwrap();
        assert_eq!(
            html.matches("<svg").count(),
            6,
            "2 TTFT + 4 saturation charts"
        );
        assert!(html.contains("A &lt;got&gt; in") && html.contains("table &amp; text"));
        // A's share line sits at 75% in every loaded window.
        let share = share_chart(&f);
        let a = &share.series[0];
        assert!(
            a.points.iter().all(|p| (p.1 - 0.75).abs() < 1e-9),
            "{:?}",
            a.points
        );
        let bars = rejections_chart(&f);
        assert_eq!(bars.series[0].points.iter().map(|p| p.1).sum::<f64>(), 40.0);
        let q = queue_chart(&f);
        assert_eq!(q.series.len(), 4, "p50 and p99 of priorities 100 and 0");
    }
}
