//! Aggregates request records into the figures users feel: TTFT percentiles, cache-hit
//! ratio, throughput and errors by status and reason; renders them as a side-by-side table.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::client::RequestRecord;

/// Figures of one target's run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Target label.
    pub label: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered 200 without error.
    pub ok: u64,
    /// Failed requests by `status` or `status/reason` (`conn-error` when no response came).
    pub errors: BTreeMap<String, u64>,
    /// 429s by `x-llm-d-request-dropped-reason` (`none` when the header is absent).
    pub rejected_429: BTreeMap<String, u64>,
    /// Answers neither 200 nor 429, by status (`conn-error` when no response came).
    pub other_statuses: BTreeMap<String, u64>,
    /// Streams the client dropped on purpose mid-way (counted in `ok` as well).
    pub aborted: u64,
    /// Requests sent to each base URL (several for a target of several gateways or
    /// replicas).
    pub by_url: BTreeMap<String, u64>,
    /// Completion tokens received: the usage each client saw, else its content chunks.
    pub tokens_received: u64,
    /// TTFT percentiles and mean over successful requests, seconds.
    pub ttft_p50_s: f64,
    /// 90th percentile TTFT.
    pub ttft_p90_s: f64,
    /// 99th percentile TTFT.
    pub ttft_p99_s: f64,
    /// Mean TTFT.
    pub ttft_mean_s: f64,
    /// Median end-to-end latency.
    pub e2e_p50_s: f64,
    /// Σ prompt tokens (from usage).
    pub prompt_tokens: u64,
    /// Σ cached prompt tokens.
    pub cached_tokens: u64,
    /// Σ completion tokens.
    pub completion_tokens: u64,
    /// Σ cached ÷ Σ prompt.
    pub cache_hit_ratio: f64,
    /// Wall time of the run.
    pub duration_s: f64,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Completion tokens per second.
    pub output_tokens_per_s: f64,
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len()) - 1)
        .copied()
        .unwrap_or(0.0)
}

impl Summary {
    /// Summarizes `records` of a run that took `duration_s`.
    pub fn from_records(label: &str, records: &[RequestRecord], duration_s: f64) -> Self {
        let mut s = Summary {
            label: label.to_string(),
            requests: records.len() as u64,
            duration_s,
            ..Summary::default()
        };
        let mut ttft = Vec::new();
        let mut e2e = Vec::new();
        for r in records {
            s.prompt_tokens += r.prompt_tokens;
            s.cached_tokens += r.cached_tokens;
            s.completion_tokens += r.completion_tokens;
            s.tokens_received += r.tokens_received();
            s.aborted += u64::from(r.aborted);
            *s.by_url.entry(r.url.clone()).or_insert(0) += 1;
            match r.status {
                200 => {}
                429 => {
                    let reason = r.dropped_reason.as_deref().unwrap_or("none");
                    *s.rejected_429.entry(reason.to_string()).or_insert(0) += 1;
                }
                0 => *s.other_statuses.entry("conn-error".into()).or_insert(0) += 1,
                other => *s.other_statuses.entry(other.to_string()).or_insert(0) += 1,
            }
            if r.ok() {
                s.ok += 1;
                ttft.extend(r.ttft_s);
                e2e.push(r.e2e_s);
            } else {
                let status = match r.status {
                    0 => "conn-error".to_string(),
                    s => s.to_string(),
                };
                let key = match &r.dropped_reason {
                    Some(reason) => format!("{status}/{reason}"),
                    None => status,
                };
                *s.errors.entry(key).or_insert(0) += 1;
            }
        }
        ttft.sort_by(f64::total_cmp);
        e2e.sort_by(f64::total_cmp);
        s.ttft_p50_s = percentile(&ttft, 50.0);
        s.ttft_p90_s = percentile(&ttft, 90.0);
        s.ttft_p99_s = percentile(&ttft, 99.0);
        s.ttft_mean_s = if ttft.is_empty() {
            0.0
        } else {
            ttft.iter().sum::<f64>() / ttft.len() as f64
        };
        s.e2e_p50_s = percentile(&e2e, 50.0);
        s.cache_hit_ratio = if s.prompt_tokens == 0 {
            0.0
        } else {
            s.cached_tokens as f64 / s.prompt_tokens as f64
        };
        if duration_s > 0.0 {
            s.requests_per_s = s.ok as f64 / duration_s;
            s.output_tokens_per_s = s.completion_tokens as f64 / duration_s;
        }
        s
    }
}

/// One table row: `label`, then `cell` of each summary.
fn row(label: &str, summaries: &[Summary], cell: impl Fn(&Summary) -> String) -> Row {
    (label.to_owned(), summaries.iter().map(cell).collect())
}

/// One row per key of the count map `pick` (the union over `summaries`, sorted), labelled
/// `name key`; a summary without the key counts 0.
fn keyed_rows(
    summaries: &[Summary],
    name: &str,
    pick: fn(&Summary) -> &BTreeMap<String, u64>,
) -> Vec<Row> {
    let mut keys: Vec<&String> = summaries.iter().flat_map(|s| pick(s).keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|k| {
            row(&format!("{name} {k}"), summaries, |s| {
                pick(s).get(k).copied().unwrap_or(0).to_string()
            })
        })
        .collect()
}

/// A label and its cells.
type Row = (String, Vec<String>);

fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1000.0)
}

/// A plain-text table with one column per summary.
pub fn table(summaries: &[Summary]) -> String {
    let s = summaries;
    let mut rows = vec![
        row("target", s, |s| s.label.clone()),
        row("requests", s, |s| s.requests.to_string()),
        row("ok", s, |s| s.ok.to_string()),
        row("TTFT p50", s, |s| ms(s.ttft_p50_s)),
        row("TTFT p90", s, |s| ms(s.ttft_p90_s)),
        row("TTFT p99", s, |s| ms(s.ttft_p99_s)),
        row("TTFT mean", s, |s| ms(s.ttft_mean_s)),
        row("e2e p50", s, |s| ms(s.e2e_p50_s)),
        row("cache hit ratio", s, |s| {
            format!("{:.1}%", s.cache_hit_ratio * 100.0)
        }),
        row("prompt tokens", s, |s| s.prompt_tokens.to_string()),
        row("cached tokens", s, |s| s.cached_tokens.to_string()),
        row("output tok/s", s, |s| {
            format!("{:.0}", s.output_tokens_per_s)
        }),
        row("req/s", s, |s| format!("{:.2}", s.requests_per_s)),
        row("duration", s, |s| format!("{:.1} s", s.duration_s)),
    ];
    rows.extend(keyed_rows(s, "errors", |s| &s.errors));
    // The spread over base URLs, when a target had several to spread over.
    if s.iter().any(|s| s.by_url.len() > 1) {
        rows.extend(keyed_rows(s, "requests to", |s| &s.by_url));
    }
    render(&rows, summaries.len())
}

/// A plain-text table with one column per load class: what each tenant got.
pub fn class_table(summaries: &[Summary]) -> String {
    let s = summaries;
    let mut rows = vec![
        row("class", s, |s| s.label.clone()),
        row("requests", s, |s| s.requests.to_string()),
        row("ok", s, |s| s.ok.to_string()),
        row("aborted", s, |s| s.aborted.to_string()),
        row("TTFT p50", s, |s| ms(s.ttft_p50_s)),
        row("TTFT p99", s, |s| ms(s.ttft_p99_s)),
        row("prompt tokens", s, |s| s.prompt_tokens.to_string()),
        row("tokens received", s, |s| s.tokens_received.to_string()),
        row("duration", s, |s| format!("{:.1} s", s.duration_s)),
    ];
    rows.extend(keyed_rows(s, "429", |s| &s.rejected_429));
    rows.extend(keyed_rows(s, "status", |s| &s.other_statuses));
    render(&rows, summaries.len())
}

/// Left-aligned labels, right-aligned cells.
fn render(rows: &[Row], columns: usize) -> String {
    let label_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let col_w: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.1.get(i))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (label, cells) in rows {
        let _ = write!(out, "{label:<label_w$}");
        for (cell, w) in cells.iter().zip(&col_w) {
            let _ = write!(out, "  {cell:>w$}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn rec(status: u16, ttft: f64, prompt: u64, cached: u64) -> RequestRecord {
        RequestRecord {
            status,
            ttft_s: (status == 200).then_some(ttft),
            e2e_s: ttft * 2.0,
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: if status == 200 { 10 } else { 0 },
            usage_seen: status == 200,
            dropped_reason: (status == 429).then(|| "rejected-saturated".to_string()),
            error: (status != 200).then(|| "x".to_string()),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn summary_figures() {
        let mut rs: Vec<RequestRecord> = (1..=100)
            .map(|i| rec(200, i as f64 / 1000.0, 100, 80))
            .collect();
        rs.push(rec(429, 0.0, 0, 0));
        rs.push(rec(503, 0.0, 0, 0));
        let s = Summary::from_records("a", &rs, 10.0);
        assert_eq!((s.requests, s.ok), (102, 100));
        assert!((s.ttft_p50_s - 0.050).abs() < 1e-12);
        assert!((s.ttft_p90_s - 0.090).abs() < 1e-12);
        assert!((s.ttft_p99_s - 0.099).abs() < 1e-12);
        assert!((s.ttft_mean_s - 0.0505).abs() < 1e-12);
        assert!((s.cache_hit_ratio - 0.8).abs() < 1e-12);
        assert_eq!(s.errors.get("429/rejected-saturated"), Some(&1));
        assert_eq!(s.errors.get("503"), Some(&1));
        assert!((s.output_tokens_per_s - 100.0).abs() < 1e-9);
        let t = table(&[
            s.clone(),
            Summary {
                label: "b".into(),
                ..s
            },
        ]);
        assert!(t.contains("TTFT p50") && t.contains("errors 503") && t.contains("80.0%"));
        assert!(!t.contains("requests to"), "one URL: no spread rows\n{t}");
    }

    #[test]
    fn requests_are_counted_per_base_url() {
        let mut rs = vec![rec(200, 0.01, 100, 0), rec(503, 0.0, 0, 0)];
        rs.push(rec(200, 0.02, 100, 50));
        rs[0].url = "http://a:1".into();
        rs[1].url = "http://b:2".into();
        rs[2].url = "http://a:1".into();
        let s = Summary::from_records("two", &rs, 1.0);
        assert_eq!(s.by_url.get("http://a:1"), Some(&2));
        assert_eq!(s.by_url.get("http://b:2"), Some(&1));
        let t = table(&[s]);
        assert!(t.contains("requests to http://a:1"), "{t}");
        assert!(t.contains("requests to http://b:2"), "{t}");
    }

    #[test]
    fn per_class_counts() {
        let mut rs = vec![
            rec(200, 0.01, 100, 0),
            rec(429, 0.0, 0, 0),
            rec(503, 0.0, 0, 0),
        ];
        let mut quota = rec(429, 0.0, 0, 0);
        quota.dropped_reason = Some("rejected-quota-tpm".into());
        rs.push(quota.clone());
        rs.push(quota);
        rs.push(RequestRecord {
            status: 0,
            error: Some("refused".into()),
            ..RequestRecord::default()
        });
        // Aborted after 4 chunks with no usage seen: 4 tokens received.
        rs.push(RequestRecord {
            status: 200,
            ttft_s: Some(0.02),
            aborted: true,
            content_chunks: 4,
            ..RequestRecord::default()
        });
        let s = Summary::from_records("tenant-b", &rs, 1.0);
        assert_eq!(s.ok, 2);
        assert_eq!(s.aborted, 1);
        assert_eq!(s.rejected_429.get("rejected-saturated"), Some(&1));
        assert_eq!(s.rejected_429.get("rejected-quota-tpm"), Some(&2));
        assert_eq!(s.other_statuses.get("503"), Some(&1));
        assert_eq!(s.other_statuses.get("conn-error"), Some(&1));
        // The success's usage (10) and the aborted stream's chunks (4).
        assert_eq!(s.tokens_received, 14);
        let t = class_table(&[s]);
        assert!(
            t.contains("429 rejected-quota-tpm") && t.contains("status 503"),
            "{t}"
        );
        assert!(t.contains("tokens received"));
    }
}
