//! The results of a calibration run, one column per [`RunSpec`](super::calibration::RunSpec):
//! the side-by-side table (the load generator's, plus turns 2+ and the spread over
//! replicas) and the comparison lines of the demo and `bench ttft`.

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
        rows.extend(replicas.iter().map(|rep| {
            let cells = spreads
                .iter()
                .map(|s| s.get(*rep).copied().unwrap_or(0).to_string())
                .collect();
            (format!("requests on {rep}"), cells)
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
}
