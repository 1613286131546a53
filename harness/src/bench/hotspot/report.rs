//! What the hotspot scenario concludes from its two runs, as pure functions of the load
//! generator's records (each names the replica that served it, from the simulator's
//! `x-infergate-replica-addr` header) and the KV samples: requests per replica, TTFT on the
//! full replica against the others, the verdict on the picker, the rendered report, and
//! its HTML page ([`page`]).

use std::collections::BTreeMap;

use super::kv::KvWindow;
use crate::bench::html::{ttft_cdf, Block, Page};
use crate::bench::report::table;
use crate::load::summary::percentile;
use crate::load::{RequestRecord, Summary};

/// TTFT figures of a set of requests, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ttft {
    /// Requests with a first token.
    pub requests: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Ttft {
    /// Of the successful records that `keep` selects.
    pub fn of(records: &[RequestRecord], keep: impl Fn(&RequestRecord) -> bool) -> Ttft {
        let mut v: Vec<f64> = records
            .iter()
            .filter(|r| r.ok() && keep(r))
            .filter_map(|r| r.ttft_s)
            .collect();
        v.sort_by(f64::total_cmp);
        Ttft {
            requests: v.len(),
            p50: percentile(&v, 50.0),
            p99: percentile(&v, 99.0),
        }
    }
}

/// One run of the chat workload (through `/rr` or through the picker) while one replica
/// was full.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// Column label.
    pub label: String,
    /// The load generator's figures.
    pub summary: Summary,
    /// Requests per replica address (every record, failed ones under the address that
    /// answered, or `unknown` when none did).
    pub per_replica: BTreeMap<String, u64>,
    /// TTFT of the requests the full replica served.
    pub on_full: Ttft,
    /// TTFT of the requests the other replicas served.
    pub on_others: Ttft,
    /// TTFT of every successful request, seconds, in completion order.
    pub ttfts: Vec<f64>,
    /// Of them, the full replica's.
    pub ttfts_full: Vec<f64>,
    /// Of them, the other replicas'.
    pub ttfts_others: Vec<f64>,
    /// KV usage of the full replica during the run.
    pub full_kv: KvWindow,
    /// The highest KV usage any other replica reached during the run.
    pub others_kv_max: f64,
}

impl RunOutcome {
    /// The outcome of `records`, the full replica being `full` (`ip:port`).
    pub fn new(
        label: &str,
        summary: Summary,
        records: &[RequestRecord],
        full: &str,
        full_kv: KvWindow,
        others_kv_max: f64,
    ) -> RunOutcome {
        RunOutcome {
            label: label.to_string(),
            summary,
            per_replica: per_replica(records),
            ttfts: ttfts(records, |_| true),
            ttfts_full: ttfts(records, |r| r.served_by.as_deref() == Some(full)),
            ttfts_others: ttfts(records, |r| {
                r.served_by.as_deref().is_some_and(|s| s != full)
            }),
            on_full: Ttft::of(records, |r| r.served_by.as_deref() == Some(full)),
            on_others: Ttft::of(records, |r| {
                r.served_by.as_deref().is_some_and(|s| s != full)
            }),
            full_kv,
            others_kv_max,
        }
    }

    /// New requests the full replica received in this run.
    pub fn to_full(&self, full: &str) -> u64 {
        self.per_replica.get(full).copied().unwrap_or(0)
    }
}

/// TTFT of the successful records that `keep` selects, seconds.
fn ttfts(records: &[RequestRecord], keep: impl Fn(&RequestRecord) -> bool) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.ok() && keep(r))
        .filter_map(|r| r.ttft_s)
        .collect()
}

/// The scenario's HTML page: TTFT distributions of both runs, then of the requests the
/// full replica served against the others', then `text` (the text report).
pub fn page(runs: &[RunOutcome], text: &str) -> Page {
    let mut p = Page::new("infergate demo: one full replica, round robin vs the picker");
    let sides: Vec<(String, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let label = format!(
                "{} (p50 {}, p99 {})",
                r.label,
                ms(r.summary.ttft_p50_s),
                ms(r.summary.ttft_p99_s)
            );
            (label, r.ttfts.clone())
        })
        .collect();
    p.push(Block::Chart(ttft_cdf(
        "Time to first token, every request",
        &sides,
    )));
    let mut split = Vec::new();
    for r in runs {
        if !r.ttfts_full.is_empty() {
            split.push((
                format!("{}: on the full replica ({})", r.label, r.ttfts_full.len()),
                r.ttfts_full.clone(),
            ));
        }
        split.push((
            format!("{}: on the others ({})", r.label, r.ttfts_others.len()),
            r.ttfts_others.clone(),
        ));
    }
    p.push(Block::Chart(ttft_cdf(
        "Time to first token, on the full replica vs on the others",
        &split,
    )));
    p.push(Block::Heading("The text report".into()));
    p.push(Block::Pre(text.to_string()));
    p
}

/// Requests per serving replica, failures included: a request the full replica answered
/// with an error was still sent there.
pub fn per_replica(records: &[RequestRecord]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in records {
        let k = r.served_by.clone().unwrap_or_else(|| "unknown".into());
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

/// The verdict on the picker: it must send no new request to the full replica while every
/// other replica had room (stayed below `room_below` KV usage).
pub fn picker_verdict(picker: &RunOutcome, full: &str, room_below: f64) -> String {
    let sent = picker.to_full(full);
    let room = picker.others_kv_max < room_below;
    let others = format!(
        "the other replicas peaked at {:.1}% KV",
        picker.others_kv_max * 100.0
    );
    match (sent, room) {
        (0, true) => format!(
            "{}: 0 requests to the full replica while the others had room ({others}): met",
            picker.label
        ),
        (n, true) => format!(
            "{}: {n} requests to the full replica while the others had room ({others}): MISSED",
            picker.label
        ),
        (n, false) => format!(
            "{}: {n} requests to the full replica; the others did not all have room \
             ({others}), so this run cannot judge",
            picker.label
        ),
    }
}

/// Whether `/rr`'s tail is the full replica's queue: the requests it served have a p99 above
/// the others' and set the run's p99.
pub fn rr_tail_line(rr: &RunOutcome) -> String {
    let carries = rr.on_full.requests > 0
        && rr.on_full.p99 > rr.on_others.p99
        && rr.on_full.p99 >= rr.summary.ttft_p99_s;
    format!(
        "{}: TTFT p99 {} on the full replica ({} requests) vs {} on the others ({}); the \
         run's p99 {} {}",
        rr.label,
        ms(rr.on_full.p99),
        rr.on_full.requests,
        ms(rr.on_others.p99),
        rr.on_others.requests,
        ms(rr.summary.ttft_p99_s),
        if carries {
            "is the full replica's queue"
        } else {
            "is NOT set by the full replica"
        }
    )
}

fn ms(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// The side-by-side table of the runs; `full` is the full replica's address and
/// `replicas` every replica's, in order.
pub fn render_table(runs: &[RunOutcome], full: &str, replicas: &[String]) -> String {
    let mut header = vec![String::new()];
    header.extend(runs.iter().map(|r| r.label.clone()));
    let col = |f: &dyn Fn(&RunOutcome) -> String| runs.iter().map(f).collect::<Vec<_>>();
    let mut rows: Vec<(String, Vec<String>)> = vec![
        (
            "requests (ok)".into(),
            col(&|r| format!("{} ({})", r.summary.requests, r.summary.ok)),
        ),
        ("TTFT p50".into(), col(&|r| ms(r.summary.ttft_p50_s))),
        ("TTFT p99".into(), col(&|r| ms(r.summary.ttft_p99_s))),
        (
            "TTFT p50 / p99 on the full replica".into(),
            col(&|r| match r.on_full.requests {
                0 => "no requests".into(),
                _ => format!("{} / {}", ms(r.on_full.p50), ms(r.on_full.p99)),
            }),
        ),
        (
            "TTFT p50 / p99 on the others".into(),
            col(&|r| format!("{} / {}", ms(r.on_others.p50), ms(r.on_others.p99))),
        ),
        (
            "cache hit ratio".into(),
            col(&|r| pct(r.summary.cache_hit_ratio)),
        ),
        (
            "duration".into(),
            col(&|r| format!("{:.1} s", r.summary.duration_s)),
        ),
        (
            "full replica KV min / mean".into(),
            col(&|r| format!("{} / {}", pct(r.full_kv.min), pct(r.full_kv.mean))),
        ),
        (
            "full replica most waiting".into(),
            col(&|r| format!("{:.0}", r.full_kv.max_waiting)),
        ),
        ("others' KV max".into(), col(&|r| pct(r.others_kv_max))),
    ];
    for rep in replicas {
        let name = if rep == full {
            format!("new requests on {rep} (FULL)")
        } else {
            format!("new requests on {rep}")
        };
        rows.push((
            name,
            col(&|r| r.per_replica.get(rep).copied().unwrap_or(0).to_string()),
        ));
    }
    let unknown = col(&|r| {
        r.per_replica
            .get("unknown")
            .copied()
            .unwrap_or(0)
            .to_string()
    });
    if unknown.iter().any(|u| u != "0") {
        rows.push(("requests no replica answered".into(), unknown));
    }
    let mut errors: Vec<&String> = runs.iter().flat_map(|r| r.summary.errors.keys()).collect();
    errors.sort();
    errors.dedup();
    for e in errors {
        rows.push((
            format!("errors {e}"),
            col(&|r| r.summary.errors.get(e).copied().unwrap_or(0).to_string()),
        ));
    }
    table(&header, &rows)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FULL: &str = "127.0.0.1:1";

    fn rec(served: Option<&str>, ttft: f64, status: u16) -> RequestRecord {
        RequestRecord {
            status,
            ttft_s: (status == 200).then_some(ttft),
            served_by: served.map(str::to_string),
            error: (status != 200).then(|| "x".into()),
            ..RequestRecord::default()
        }
    }

    fn outcome(label: &str, records: &[RequestRecord], others_kv: f64) -> RunOutcome {
        let summary = Summary::from_records(label, records, 1.0);
        RunOutcome::new(
            label,
            summary,
            records,
            FULL,
            KvWindow::default(),
            others_kv,
        )
    }

    #[test]
    fn requests_are_counted_per_replica_failures_included() {
        let records = [
            rec(Some(FULL), 2.0, 200),
            rec(Some(FULL), 0.0, 503),
            rec(Some("127.0.0.1:2"), 0.1, 200),
            rec(None, 0.0, 0),
        ];
        let m = per_replica(&records);
        assert_eq!(m.get(FULL), Some(&2));
        assert_eq!(m.get("127.0.0.1:2"), Some(&1));
        assert_eq!(m.get("unknown"), Some(&1));
        let o = outcome("rr", &records, 0.3);
        assert_eq!(o.to_full(FULL), 2);
        assert_eq!(o.on_full.requests, 1);
        assert_eq!(o.on_others.requests, 1);
    }

    #[test]
    fn picker_verdict_counts_requests_to_the_full_replica() {
        let clean = outcome("picker", &[rec(Some("127.0.0.1:2"), 0.1, 200)], 0.3);
        let v = picker_verdict(&clean, FULL, 0.95);
        assert!(
            v.contains("0 requests to the full replica") && v.ends_with("met"),
            "{v}"
        );
        let leaky = outcome(
            "picker",
            &[rec(Some(FULL), 0.1, 200), rec(Some(FULL), 0.1, 200)],
            0.3,
        );
        let v = picker_verdict(&leaky, FULL, 0.95);
        assert!(v.contains("2 requests") && v.contains("MISSED"), "{v}");
        // When the others were full too, sending to the full replica is not a fault.
        let crowded = outcome("picker", &[rec(Some(FULL), 0.1, 200)], 0.97);
        assert!(picker_verdict(&crowded, FULL, 0.95).contains("cannot judge"));
    }

    #[test]
    fn rr_tail_is_judged_from_the_split_percentiles() {
        let mut records: Vec<RequestRecord> = (0..30)
            .map(|i| rec(Some("127.0.0.1:2"), 0.05 + f64::from(i) * 0.001, 200))
            .collect();
        records.push(rec(Some(FULL), 3.0, 200));
        records.push(rec(Some(FULL), 0.04, 200));
        let line = rr_tail_line(&outcome("/rr", &records, 0.3));
        assert!(
            line.contains("3.00 s on the full replica (2 requests)"),
            "{line}"
        );
        assert!(line.contains("is the full replica's queue"), "{line}");
        let calm: Vec<RequestRecord> = (0..30)
            .map(|i| rec(Some("127.0.0.1:2"), 1.0 + f64::from(i), 200))
            .chain([rec(Some(FULL), 0.5, 200)])
            .collect();
        assert!(rr_tail_line(&outcome("/rr", &calm, 0.3)).contains("NOT"));
    }

    #[test]
    fn the_page_draws_both_splits() {
        let records = [
            rec(Some(FULL), 2.0, 200),
            rec(Some("127.0.0.1:2"), 0.1, 200),
            rec(Some("127.0.0.1:2"), 0.2, 200),
            rec(Some(FULL), 0.0, 503),
        ];
        let o = outcome("/rr", &records, 0.3);
        assert_eq!((o.ttfts.len(), o.ttfts_full.clone()), (3, vec![2.0]));
        let html = page(&[o], "t").render();
        crate::bench::html::wellformed::check(&html).unwrap();
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("/rr: on the full replica (1)"), "{html}");
        assert!(html.contains("/rr: on the others (2)"), "{html}");
    }

    #[test]
    fn table_marks_the_full_replica() {
        let o = outcome("picker", &[rec(Some("127.0.0.1:2"), 0.1, 200)], 0.3);
        let t = render_table(&[o], FULL, &[FULL.to_string(), "127.0.0.1:2".to_string()]);
        assert!(t.contains("new requests on 127.0.0.1:1 (FULL)"), "{t}");
        assert!(t.contains("no requests"), "{t}");
    }
}
