//! The results of a calibration run, one column per [`RunSpec`](super::calibration::RunSpec):
//! the side-by-side table (the load generator's, plus turns 2+ and the spread over
//! replicas), the comparison lines of the demo and `bench ttft`, and the worker-count
//! verdicts of `bench affinity`.

use std::collections::BTreeMap;

use super::calibration::{Route, RunSpec};
use super::report::table;
use crate::load::{self, Summary, TargetReport};

/// A whole run's results, one per [`RunSpec`], in order.
#[derive(Debug)]
pub struct Columns {
    /// The specs, as run.
    pub specs: Vec<RunSpec>,
    /// One report per spec.
    pub reports: Vec<TargetReport>,
}

impl Columns {
    /// The summaries, in column order.
    pub fn summaries(&self) -> Vec<Summary> {
        self.reports.iter().map(|r| r.summary.clone()).collect()
    }

    /// The summary of the first column with `route` (and `label`, if given).
    pub fn find(&self, route: Route, label: Option<&str>) -> Option<&Summary> {
        self.report(route, label).map(|r| &r.summary)
    }

    /// The whole-run and turns-2+ figures of the first column with `route` (and `label`).
    pub fn figures(&self, route: Route, label: Option<&str>) -> Option<Figures> {
        self.report(route, label).map(|r| Figures {
            all: r.summary.clone(),
            later: later_turns(&r.summary.label, &r.records),
        })
    }

    fn report(&self, route: Route, label: Option<&str>) -> Option<&TargetReport> {
        self.specs
            .iter()
            .zip(&self.reports)
            .find(|(s, _)| s.route == route && label.is_none_or(|l| s.label == l))
            .map(|(_, r)| r)
    }

    /// The load generator's side-by-side table, plus the figures of turns 2 and later (the
    /// only ones a router can make hit the cache) and how requests spread over replicas.
    pub fn table(&self) -> String {
        let mut out = load::table(&self.summaries());
        let mut header = vec!["target".to_string()];
        header.extend(self.specs.iter().map(|s| s.label.clone()));
        let spreads: Vec<BTreeMap<String, u64>> =
            self.reports.iter().map(|r| spread(&r.records)).collect();
        let mut replicas: Vec<&String> = spreads.iter().flat_map(|s| s.keys()).collect();
        replicas.sort();
        replicas.dedup();
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let later: Vec<Summary> = self
            .reports
            .iter()
            .map(|r| later_turns(&r.summary.label, &r.records))
            .collect();
        rows.push((
            "turns 2+: cache hit ratio".into(),
            later
                .iter()
                .map(|s| format!("{:.1}%", s.cache_hit_ratio * 100.0))
                .collect(),
        ));
        rows.push((
            "turns 2+: TTFT p50".into(),
            later
                .iter()
                .map(|s| format!("{:.1} ms", s.ttft_p50_s * 1000.0))
                .collect(),
        ));
        // First turns: the cold prefills, where a router's tail comes from.
        let first: Vec<(Summary, BTreeMap<String, u64>)> = self
            .reports
            .iter()
            .map(|r| {
                let first: Vec<load::RequestRecord> =
                    r.records.iter().filter(|r| r.turn == 0).cloned().collect();
                (
                    Summary::from_records(&r.summary.label, &first, 0.0),
                    spread(&first),
                )
            })
            .collect();
        rows.push((
            "turn 1: TTFT p50 / p90 / p99".into(),
            first
                .iter()
                .map(|(s, _)| {
                    format!(
                        "{:.0} / {:.0} / {:.0} ms",
                        s.ttft_p50_s * 1000.0,
                        s.ttft_p90_s * 1000.0,
                        s.ttft_p99_s * 1000.0
                    )
                })
                .collect(),
        ));
        rows.extend(replicas.iter().map(|rep| {
            let cells = spreads
                .iter()
                .zip(&first)
                .map(|(s, (_, f))| {
                    let turn1 = f.get(*rep).copied().unwrap_or(0);
                    format!("{} ({turn1})", s.get(*rep).copied().unwrap_or(0))
                })
                .collect();
            (format!("requests (turn 1) on {rep}"), cells)
        }));
        if !rows.is_empty() {
            out.push('\n');
            out.push_str(&table(&header, &rows));
        }
        out
    }
}

/// The summary of turns 2 and later only (the first turn of a conversation can hit no
/// cache, whatever the router does); its duration and rates are not meaningful.
pub fn later_turns(label: &str, records: &[load::RequestRecord]) -> Summary {
    let later: Vec<load::RequestRecord> = records.iter().filter(|r| r.turn > 0).cloned().collect();
    Summary::from_records(label, &later, 0.0)
}

/// Successful requests per serving replica (the simulator's replica-address header).
pub fn spread(records: &[load::RequestRecord]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in records.iter().filter(|r| r.ok()) {
        let k = r.served_by.clone().unwrap_or_else(|| "unknown".into());
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

/// What the comparison lines need of one column: the whole run and its turns 2+.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Every request.
    pub all: Summary,
    /// Turns 2 and later ([`later_turns`]).
    pub later: Summary,
}

/// `baseline ÷ picker` of TTFT p50 and the cache-hit ratios (whole run and turns 2+); with
/// `targets`, the issue-4 verdicts (TTFT ≥ 5× lower, hit ratio ≥ 85%).
pub fn comparison(label: &str, baseline: &Figures, picker: &Figures, targets: bool) -> String {
    let ratio = if picker.all.ttft_p50_s > 0.0 {
        baseline.all.ttft_p50_s / picker.all.ttft_p50_s
    } else {
        0.0
    };
    let verdict = |ok: bool, target: &str| match (targets, ok) {
        (false, _) => String::new(),
        (true, true) => format!(" (target {target}: met)"),
        (true, false) => format!(" (target {target}: MISSED)"),
    };
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    format!(
        "{label}: TTFT p50 /rr ÷ picker = {ratio:.1}×{}; cache-hit ratio {} vs /rr {}{}; \
         turns 2+: {} vs {}\n",
        verdict(ratio >= 5.0, "≥ 5×"),
        pct(picker.all.cache_hit_ratio),
        pct(baseline.all.cache_hit_ratio),
        verdict(picker.all.cache_hit_ratio >= 0.85, "≥ 85%"),
        pct(picker.later.cache_hit_ratio),
        pct(baseline.later.cache_hit_ratio),
    )
}

/// The affinity criteria: at any Envoy worker count a flavour keeps at least this share of
/// the cache-hit ratio it has with one worker…
pub const AFFINITY_HIT_SHARE: f64 = 0.97;
/// …and its TTFT p50 is at most this fraction above the one-worker p50 (a lower p50 is no
/// loss of affinity: only a higher one can show turns sent where their prefix is not).
pub const AFFINITY_TTFT_SLACK: f64 = 0.10;

/// How one worker count of a flavour compares with the same flavour's reference run (the
/// fewest workers, normally one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AffinityVerdict {
    /// Cache-hit ratio ÷ the reference's.
    pub hit_share: f64,
    /// TTFT p50 ÷ the reference's, minus 1 (+0.05 is 5% slower).
    pub ttft_p50_change: f64,
    /// Failed requests of this run or of the reference: figures over a partial run prove
    /// nothing, so any failure fails the row.
    pub errors: u64,
    /// Every criterion holds.
    pub met: bool,
}

/// Judges `run` against `reference` ([`AFFINITY_HIT_SHARE`], [`AFFINITY_TTFT_SLACK`], no
/// failed request in either).
pub fn affinity_verdict(reference: &Summary, run: &Summary) -> AffinityVerdict {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let hit_share = ratio(run.cache_hit_ratio, reference.cache_hit_ratio);
    let ttft_p50_change = if reference.ttft_p50_s > 0.0 {
        run.ttft_p50_s / reference.ttft_p50_s - 1.0
    } else {
        f64::INFINITY
    };
    let errors = failed(run) + failed(reference);
    AffinityVerdict {
        hit_share,
        ttft_p50_change,
        errors,
        met: errors == 0
            && hit_share >= AFFINITY_HIT_SHARE
            && ttft_p50_change <= AFFINITY_TTFT_SLACK,
    }
}

fn failed(s: &Summary) -> u64 {
    s.errors.values().sum()
}

/// One flavour's table over its worker counts (`runs`: worker count and figures, in any
/// order), each row judged against the fewest workers with [`affinity_verdict`], then a
/// one-line summary. Returns the text and whether every row met the criteria.
pub fn affinity_table(flavor: &str, runs: &[(u32, Figures)]) -> (String, bool) {
    let mut runs: Vec<&(u32, Figures)> = runs.iter().collect();
    runs.sort_by_key(|(w, _)| *w);
    let Some((ref_workers, reference)) = runs.first().map(|(w, f)| (*w, &f.all)) else {
        return (format!("{flavor}: no run to judge\n"), false);
    };
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    let ms = |s: f64| format!("{:.1} ms", s * 1000.0);
    let header: Vec<String> = [
        "workers",
        "cache hits",
        "turns 2+",
        "hits / ref",
        "TTFT p50",
        "p50 vs ref",
        "TTFT p99",
        "failed",
        "criteria",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect();
    let mut rows = Vec::new();
    let mut missed = Vec::new();
    for (i, (workers, fig)) in runs.iter().enumerate() {
        let (share, change, verdict) = if i == 0 {
            let ok = failed(reference) == 0;
            if !ok {
                missed.push(*workers);
            }
            let v = if ok {
                "reference"
            } else {
                "NOT met (failures)"
            };
            ("ref".to_string(), "ref".to_string(), v.to_string())
        } else {
            let v = affinity_verdict(reference, &fig.all);
            let mut why = Vec::new();
            if v.hit_share < AFFINITY_HIT_SHARE {
                why.push("hits");
            }
            if v.ttft_p50_change > AFFINITY_TTFT_SLACK {
                why.push("TTFT");
            }
            if v.errors > 0 {
                why.push("failures");
            }
            let verdict = if v.met {
                "met".to_string()
            } else {
                missed.push(*workers);
                format!("NOT met ({})", why.join(", "))
            };
            (
                format!("{:.3}", v.hit_share),
                format!("{:+.1}%", v.ttft_p50_change * 100.0),
                verdict,
            )
        };
        rows.push((
            workers.to_string(),
            vec![
                pct(fig.all.cache_hit_ratio),
                pct(fig.later.cache_hit_ratio),
                share,
                ms(fig.all.ttft_p50_s),
                change,
                ms(fig.all.ttft_p99_s),
                failed(&fig.all).to_string(),
                verdict,
            ],
        ));
    }
    let mut out = format!("{flavor} (reference: {ref_workers} worker(s))\n");
    out.push_str(&table(&header, &rows));
    let criteria = format!(
        "cache hits >= {AFFINITY_HIT_SHARE} x {} and TTFT p50 <= {} x {} of {ref_workers} \
         worker(s), no failed request",
        pct(reference.cache_hit_ratio),
        1.0 + AFFINITY_TTFT_SLACK,
        ms(reference.ttft_p50_s),
    );
    let ok = missed.is_empty();
    let line = if !ok {
        let list: Vec<String> = missed.iter().map(u32::to_string).collect();
        format!("NOT met at {} worker(s) ({criteria})", list.join(", "))
    } else if runs.len() < 2 {
        format!("only {ref_workers} worker(s) ran, nothing to compare")
    } else {
        format!("met at every worker count ({criteria})")
    };
    out.push_str(&format!("{flavor}: {line}\n"));
    (out, ok)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn comparison_states_ratios_and_verdicts() {
        let fig = |ttft: f64, hit: f64| Figures {
            all: Summary {
                ttft_p50_s: ttft,
                cache_hit_ratio: hit,
                ..Summary::default()
            },
            later: Summary {
                cache_hit_ratio: hit,
                ..Summary::default()
            },
        };
        let base = fig(1.0, 0.2);
        let v = comparison("wasm", &base, &fig(0.1, 0.9), true);
        assert!(
            v.contains("10.0×") && v.contains("met") && !v.contains("MISSED"),
            "{v}"
        );
        let v = comparison("w", &base, &fig(0.5, 0.5), true);
        assert_eq!(v.matches("MISSED").count(), 2, "{v}");
        assert!(!comparison("w", &base, &fig(0.5, 0.5), false).contains("target"));
    }

    #[test]
    fn later_turns_leave_the_first_out() {
        let rec = |turn: u32, prompt: u64, cached: u64| load::RequestRecord {
            status: 200,
            turn,
            ttft_s: Some(0.1),
            prompt_tokens: prompt,
            cached_tokens: cached,
            ..load::RequestRecord::default()
        };
        let s = later_turns("x", &[rec(0, 1000, 0), rec(1, 100, 90), rec(2, 100, 100)]);
        assert_eq!(s.requests, 2);
        assert!((s.cache_hit_ratio - 0.95).abs() < 1e-9);
    }

    #[test]
    fn spread_counts_successes_per_replica() {
        let rec = |s: &str, status: u16| load::RequestRecord {
            status,
            served_by: Some(s.into()),
            ..load::RequestRecord::default()
        };
        let m = spread(&[rec("a", 200), rec("a", 200), rec("b", 200), rec("b", 503)]);
        assert_eq!(m.get("a"), Some(&2));
        assert_eq!(m.get("b"), Some(&1));
    }

    fn figures(hit: f64, p50_ms: f64, failed: u64) -> Figures {
        let mut all = Summary {
            cache_hit_ratio: hit,
            ttft_p50_s: p50_ms / 1000.0,
            ttft_p99_s: p50_ms * 3.0 / 1000.0,
            ..Summary::default()
        };
        if failed > 0 {
            all.errors.insert("503".into(), failed);
        }
        Figures {
            later: all.clone(),
            all,
        }
    }

    #[test]
    fn affinity_verdict_holds_hits_and_ttft_to_the_reference() {
        let base = figures(0.88, 20.0, 0).all;
        let v = affinity_verdict(&base, &figures(0.87, 21.0, 0).all);
        assert!(v.met, "{v:?}");
        // 0.85 / 0.88 = 0.966: just under the 0.97 share.
        assert!(!affinity_verdict(&base, &figures(0.85, 20.0, 0).all).met);
        // 22.4 ms is 12% slower.
        assert!(!affinity_verdict(&base, &figures(0.88, 22.4, 0).all).met);
        // Faster is no loss of affinity.
        assert!(affinity_verdict(&base, &figures(0.88, 10.0, 0).all).met);
        let v = affinity_verdict(&base, &figures(0.88, 20.0, 2).all);
        assert_eq!((v.errors, v.met), (2, false));
        assert!(!affinity_verdict(&figures(0.88, 0.0, 0).all, &base).met);
    }

    #[test]
    fn affinity_table_judges_every_row_against_the_fewest_workers() {
        let runs = vec![
            (4, figures(0.63, 40.0, 0)),
            (1, figures(0.88, 20.0, 0)),
            (2, figures(0.87, 20.5, 0)),
        ];
        let (text, ok) = affinity_table("wasm", &runs);
        assert!(!ok, "{text}");
        let row = |w: &str| {
            text.lines()
                .find(|l| l.split_whitespace().next() == Some(w))
                .unwrap()
                .to_string()
        };
        assert!(row("1").ends_with("reference"), "{text}");
        assert!(row("2").ends_with(" met"), "{text}");
        assert!(row("4").contains("NOT met (hits, TTFT)"), "{text}");
        assert!(text.contains("wasm: NOT met at 4 worker(s)"), "{text}");
        let (text, ok) = affinity_table("native", &runs[1..]);
        assert!(
            ok && text.contains("native: met at every worker count"),
            "{text}"
        );
        let (text, ok) = affinity_table("native", &[(1, figures(0.9, 20.0, 1))]);
        assert!(!ok && text.contains("NOT met (failures)"), "{text}");
        assert!(!affinity_table("x", &[]).1);
    }
}
