//! The canary demo's report: the table of the three arms, the rollback's paragraph, and
//! the HTML page (TTFT of later turns per arm and version, and the rolled-back arm's
//! requests per second on each version).

use std::fmt::Write;

use super::drive::Sent;
use super::figures::{Arm, Canary, Version};
use super::{CanaryOptions, Outcome, CANARY_WEIGHT, CONCURRENCY};
use crate::bench::html::{ttft_cdf, Axis, Block, Chart, Kind, Page, Series};
use crate::bench::report;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1000.0)
}

fn version_cells(v: &Version, f: fn(&Version) -> String) -> String {
    if v.requests == 0 {
        "-".into()
    } else {
        f(v)
    }
}

/// The text report.
pub fn text(o: &CanaryOptions, out: &Outcome) -> String {
    let a = &o.args;
    let mut arms: Vec<&Arm> = out.arms.iter().map(|(x, _)| x).collect();
    arms.push(&out.rollback_arm.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "infergate demo: a {CANARY_WEIGHT}% FP8 canary, split per request vs per conversation\n\
         2 pools: stable = replicas 0-2, canary = replica 3, Envoy's weighted clusters 90/10 \
         (sticky: on x-gateway-split-key, the router's hash of x-session-id); rewrite: \
         `assistant` -> sim-model 90 / sim-model-fp8 10 on all 4 replicas (sticky on \
         x-session-id)\n\
         {} conversations per arm, concurrency {CONCURRENCY}, {} (Envoy --concurrency {}), \
         time scale {}\n",
        arms.first().map(|x| x.conversations).unwrap_or(0),
        a.flavor,
        a.workers,
        a.time_scale
    );
    let mut header = vec![String::new()];
    header.extend(arms.iter().map(|x| x.label.clone()));
    let row = |name: &str, f: &dyn Fn(&Arm) -> String| -> (String, Vec<String>) {
        (name.to_owned(), arms.iter().map(|x| f(x)).collect())
    };
    let rows = vec![
        row("requests (failed)", &|x| {
            format!("{} ({})", x.requests, x.failed)
        }),
        row("conversations on the canary: any turn", &|x| {
            format!(
                "{} ({})",
                x.touched_canary,
                pct(x.touched_canary as f64 / x.conversations.max(1) as f64)
            )
        }),
        row("  every turn", &|x| {
            format!(
                "{} ({})",
                x.wholly_canary,
                pct(x.wholly_canary as f64 / x.conversations.max(1) as f64)
            )
        }),
        row("conversations on both builds", &|x| x.mixed.to_string()),
        row("version switches within conversations", &|x| {
            x.switches.to_string()
        }),
        row("canary's share of requests", &|x| {
            pct(x.canary_request_share())
        }),
        row("stable: cache-hit ratio (turns 2+)", &|x| {
            version_cells(&x.stable, |v| {
                format!("{} ({})", pct(v.hit_ratio()), pct(v.later_hit_ratio))
            })
        }),
        row("stable: TTFT p50 (turns 2+)", &|x| {
            version_cells(&x.stable, |v| {
                format!("{} ({})", ms(v.ttft_p50_s), ms(v.later_ttft_p50_s))
            })
        }),
        row("canary: cache-hit ratio (turns 2+)", &|x| {
            version_cells(&x.canary, |v| {
                format!("{} ({})", pct(v.hit_ratio()), pct(v.later_hit_ratio))
            })
        }),
        row("canary: TTFT p50 (turns 2+)", &|x| {
            version_cells(&x.canary, |v| {
                format!("{} ({})", ms(v.ttft_p50_s), ms(v.later_ttft_p50_s))
            })
        }),
    ];
    s.push_str(&report::table(&header, &rows));
    let r = &out.rollback;
    let _ = writeln!(
        s,
        "\nrollback (the last column): at {:.1} s, halfway through, the canary's weight went to \
         0. The gateway's config is Envoy's bootstrap and the launcher runs Envoy without hot \
         restart, so a second Envoy with the new weight ran over the same replicas; the client \
         sent every later request to it, and the old Envoy finished its requests in flight \
         in {} ms and was stopped. {} requests started after the swap, {} of them on the \
         canary; {} failed requests in the arm. {} conversations that had been on the canary \
         moved to the stable build: their first turn there had TTFT p50 {} (nothing of them \
         cached on it; every other turn after the swap: {}). Cache-hit ratio of the requests \
         before the swap {}, after it {} (the new Envoy's picker started with an empty \
         prefix index and learnt it from the turns it routed).",
        r.at_s,
        (r.drain_s * 1000.0).round(),
        r.after,
        r.after_on_canary,
        r.failed,
        r.moved_conversations,
        ms(r.moved_first_ttft_p50_s),
        ms(r.others_after_ttft_p50_s),
        pct(r.before_hit_ratio),
        pct(r.after_hit_ratio),
    );
    s.push('\n');
    for (what, ok) in verdicts(out) {
        let _ = writeln!(s, "{}: {what}", if ok { "ok" } else { "MISSED" });
    }
    s
}

/// The demo's checks, each with whether it held: a sticky arm keeps every conversation on
/// one build, a per-request arm switches some, the rollback fails nothing and sends
/// nothing to the canary after the swap, and no arm fails a request.
pub fn verdicts(out: &Outcome) -> Vec<(String, bool)> {
    let mut verdicts: Vec<(String, bool)> = Vec::new();
    for (x, _) in &out.arms {
        if x.label.ends_with("sticky") {
            verdicts.push((
                format!("{}: every conversation on one build", x.label),
                x.mixed == 0 && x.switches == 0,
            ));
        } else {
            verdicts.push((
                format!("{}: conversations switch builds", x.label),
                x.switches > 0,
            ));
        }
    }
    let r = &out.rollback;
    verdicts.push((
        "rollback: no failed request, none on the canary after it".into(),
        r.failed == 0 && r.after_on_canary == 0 && r.after > 0,
    ));
    let all_ok = out
        .arms
        .iter()
        .map(|(x, _)| x)
        .chain([&out.rollback_arm.0])
        .all(|x| x.failed == 0);
    verdicts.push(("no failed request in any arm".into(), all_ok));
    verdicts
}

/// Requests started per second on each build over the rolled-back arm (`told_by` tells
/// the canary's answers).
fn per_second(sent: &[Sent], told_by: &Canary) -> Chart {
    let end = sent.iter().map(|s| s.started_s).fold(0.0, f64::max).ceil() as usize + 1;
    let mut stable = vec![0.0; end];
    let mut canary = vec![0.0; end];
    for s in sent.iter().filter(|s| s.record.ok()) {
        let slot = s.started_s as usize;
        let v = if told_by.answered(&s.record) {
            &mut canary
        } else {
            &mut stable
        };
        if let Some(c) = v.get_mut(slot) {
            *c += 1.0;
        }
    }
    let points = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(i, n)| (i as f64 + 0.5, *n))
            .collect()
    };
    Chart {
        title: "Rolled-back arm: requests started per second on each build".into(),
        x: Axis::linear("seconds into the arm"),
        y: Axis::linear("requests started"),
        kind: Kind::StackedBars { width: 0.9 },
        series: vec![
            Series::new("stable", 0, points(&stable)),
            Series::new("canary", 1, points(&canary)),
        ],
    }
}

/// The HTML page: the later turns' TTFT per arm and build, the rollback's timeline, then
/// `text`.
pub fn page(out: &Outcome, text: &str) -> Page {
    let mut p = Page::new("infergate demo: a 10% FP8 canary, per request vs sticky");
    for pair in out.arms.chunks(2) {
        let mut sides = Vec::new();
        for (arm, sent) in pair {
            for (build, canary) in [("stable", false), ("canary", true)] {
                let mut t: Vec<f64> = sent
                    .iter()
                    .filter(|s| s.record.ok() && s.record.turn > 0)
                    .filter(|s| arm.told_by.answered(&s.record) == canary)
                    .filter_map(|s| s.record.ttft_s)
                    .collect();
                t.sort_by(f64::total_cmp);
                let p50 = crate::load::summary::percentile(&t, 50.0);
                sides.push((format!("{}, {build} (p50 {})", arm.label, ms(p50)), t));
            }
        }
        let title = pair
            .first()
            .map(|(a, _)| a.label.split(',').next().unwrap_or("").to_owned())
            .unwrap_or_default();
        p.push(Block::Chart(ttft_cdf(
            &format!("{title}: time to first token of turns 2 and later, per split and build"),
            &sides,
        )));
    }
    let (arm, sent) = &out.rollback_arm;
    p.push(Block::Chart(per_second(sent, &arm.told_by)));
    p.push(Block::Heading("The text report".into()));
    p.push(Block::Pre(text.to_string()));
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bench::canary::figures::Rollback;
    use crate::bench::canary::{CANARY, STABLE};
    use crate::load::RequestRecord;

    fn sent(conv: u32, turn: u32, model: &str, at: f64) -> Sent {
        Sent {
            record: RequestRecord {
                conversation: conv,
                turn,
                status: 200,
                ttft_s: Some(0.02),
                prompt_tokens: 100,
                cached_tokens: 50,
                model: Some(model.into()),
                ..RequestRecord::default()
            },
            started_s: at,
        }
    }

    #[test]
    fn the_report_names_every_figure_and_the_page_is_well_formed() {
        let s = vec![
            sent(0, 0, STABLE, 0.0),
            sent(0, 1, CANARY, 1.0),
            sent(1, 0, CANARY, 0.5),
            sent(1, 1, CANARY, 2.5),
        ];
        let c = Canary::Model(CANARY.into());
        let arm = |l: &str| (Arm::of(l, &s, &c), s.clone());
        let out = Outcome {
            arms: vec![arm("per request"), arm("sticky")],
            rollback_arm: arm("sticky, rolled back"),
            rollback: Rollback::of(&s, &c, 2.0, 0.3),
        };
        let o = CanaryOptions::parse(&[]).unwrap();
        let text = text(&o, &out);
        for want in [
            "conversations on the canary: any turn",
            "canary: cache-hit ratio (turns 2+)",
            "in 300 ms",
            "1 of them on the canary",
            "MISSED: sticky: every conversation on one build",
            "ok: per request: conversations switch builds",
            "MISSED: rollback",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        let html = page(&out, &text).render();
        crate::bench::html::wellformed::check(&html).unwrap();
        assert!(html.contains("requests started per second"));
    }
}
