//! The saturation phase's figures per time window, as pure functions of what the phase
//! recorded: the billing records (each stamped with when the demo read it from the log,
//! which is when the request ended, to within the log's flush interval and the reader's
//! poll) and the client's own outcome of every request it sent.
//!
//! Per window: the service each tenant received (tokens served, prompt + 2 × completion,
//! the unit the weighted fairness policy counts, of the requests that completed in the
//! window), the time requests of each priority spent queued in the gateway (p50 / p99 of
//! `queued_ms` over the requests that ended in the window and were admitted, at once (0 ms)
//! or from the queue, or dropped when their TTL expired; a request refused at once never
//! queued), and the 429s the client received, by `x-llm-d-request-dropped-reason`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::figures::is_rejection;
use crate::load::summary::percentile;

/// The billing outcome of a request dropped from the queue when its TTL expired.
pub const TTL_EXPIRED: &str = "rejected-ttl-expired";
/// The outcome (and dropped reason) of a request refused because its band or the pool's
/// queue was full.
pub const SATURATED: &str = "rejected-saturated";

/// One billing record, stamped with when it was read, in seconds since the phase began.
#[derive(Clone, Debug, PartialEq)]
pub struct Stamped {
    /// Seconds since the phase began.
    pub at_s: f64,
    /// The record.
    pub record: Value,
}

/// What the client saw of one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sent {
    /// The tenant that sent it.
    pub tenant: String,
    /// Seconds since the phase began, when it was sent.
    pub sent_s: f64,
    /// Seconds since the phase began, when its answer (or failure) came back.
    pub done_s: f64,
    /// HTTP status (0: no response).
    pub status: u16,
    /// `x-llm-d-request-dropped-reason`, if any.
    pub dropped_reason: Option<String>,
}

/// Queue times of one priority in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueTimes {
    /// Requests admitted (at once or from the queue) or dropped by TTL expiry.
    pub requests: usize,
    /// Of them, those dropped because their TTL expired.
    pub expired: usize,
    /// Median `queued_ms`.
    pub p50_ms: f64,
    /// 99th percentile `queued_ms`.
    pub p99_ms: f64,
}

impl QueueTimes {
    /// Of a set of `(queued_ms, expired)` samples.
    pub fn of(samples: &[(f64, bool)]) -> QueueTimes {
        let mut v: Vec<f64> = samples.iter().map(|s| s.0).collect();
        v.sort_by(f64::total_cmp);
        QueueTimes {
            requests: v.len(),
            expired: samples.iter().filter(|s| s.1).count(),
            p50_ms: percentile(&v, 50.0),
            p99_ms: percentile(&v, 99.0),
        }
    }
}

/// One window's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    /// Start, seconds since the phase began.
    pub start_s: f64,
    /// End (exclusive).
    pub end_s: f64,
    /// Whether the load still ran during the whole window (later windows are the drain).
    pub loaded: bool,
    /// Tokens served per tenant (prompt + 2 × completion of the requests completed).
    pub served: BTreeMap<String, u64>,
    /// Requests completed per tenant.
    pub completed: BTreeMap<String, u64>,
    /// Queue times per priority.
    pub queue: BTreeMap<i64, QueueTimes>,
    /// 429s per tenant and dropped reason (`none` when the answer named none).
    pub rejected: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Window {
    /// `tenant`'s fraction of the tokens served in the window to `among` (0 when none were).
    pub fn share(&self, tenant: &str, among: &[&str]) -> f64 {
        share(&self.served, tenant, among)
    }

    /// 429s of `tenant` with `reason` in the window.
    pub fn rejected(&self, tenant: &str, reason: &str) -> u64 {
        self.rejected
            .get(tenant)
            .and_then(|m| m.get(reason))
            .copied()
            .unwrap_or(0)
    }
}

/// `tenant`'s fraction of the tokens in `served` of the tenants `among`.
pub fn share(served: &BTreeMap<String, u64>, tenant: &str, among: &[&str]) -> f64 {
    let total: u64 = among
        .iter()
        .map(|t| served.get(*t).copied().unwrap_or(0))
        .sum();
    if total == 0 {
        0.0
    } else {
        served.get(tenant).copied().unwrap_or(0) as f64 / total as f64
    }
}

/// Tokens one record counts as served: prompt + 2 × completion, for a completed request
/// (a rejection served nothing).
pub fn served_tokens(record: &Value) -> u64 {
    let outcome = record["outcome"].as_str().unwrap_or("");
    if is_rejection(outcome) {
        return 0;
    }
    let n = |k: &str| record[k].as_u64().unwrap_or(0);
    n("prompt_tokens") + 2 * n("completion_tokens")
}

/// How long a record's request waited in the gateway's queue, and whether it left by TTL
/// expiry. An admitted request whose `queued_ms` is null waited 0 ms (the gateway writes
/// null for a request admitted at once); `None` for a request refused at once, which never
/// queued, and for an expiry without a time.
pub fn queued(record: &Value) -> Option<(f64, bool)> {
    let ms = record["queued_ms"].as_f64();
    let outcome = record["outcome"].as_str().unwrap_or("");
    if outcome == TTL_EXPIRED {
        return ms.map(|ms| (ms, true));
    }
    if is_rejection(outcome) {
        return None;
    }
    Some((ms.unwrap_or(0.0), false))
}

/// The windows of `window_s` seconds from 0 until every record and answer is in one; those
/// that end by `load_s` (when the load stopped) are `loaded`.
pub fn windows(records: &[Stamped], sent: &[Sent], window_s: f64, load_s: f64) -> Vec<Window> {
    let window_s = if window_s > 0.0 { window_s } else { 1.0 };
    let last = records
        .iter()
        .map(|r| r.at_s)
        .chain(sent.iter().map(|s| s.done_s))
        .filter(|t| t.is_finite())
        .fold(0.0f64, f64::max);
    let count = ((last / window_s).floor() as usize + 1).max(1);
    let mut out: Vec<Window> = (0..count)
        .map(|i| {
            let start_s = i as f64 * window_s;
            Window {
                start_s,
                end_s: start_s + window_s,
                loaded: start_s + window_s <= load_s + 1e-9,
                ..Window::default()
            }
        })
        .collect();
    let slot = |t: f64| -> Option<usize> {
        if t.is_finite() && t >= 0.0 {
            Some(((t / window_s).floor() as usize).min(count - 1))
        } else {
            None
        }
    };
    let mut samples: Vec<BTreeMap<i64, Vec<(f64, bool)>>> = vec![BTreeMap::new(); count];
    for r in records {
        let Some(i) = slot(r.at_s) else { continue };
        let tenant = r.record["tenant"].as_str().unwrap_or("").to_string();
        let served = served_tokens(&r.record);
        if let Some(w) = out.get_mut(i) {
            if served > 0 {
                *w.served.entry(tenant.clone()).or_insert(0) += served;
                *w.completed.entry(tenant).or_insert(0) += 1;
            }
        }
        if let Some(q) = queued(&r.record) {
            let priority = r.record["priority"].as_i64().unwrap_or(0);
            if let Some(s) = samples.get_mut(i) {
                s.entry(priority).or_default().push(q);
            }
        }
    }
    for (w, s) in out.iter_mut().zip(&samples) {
        w.queue = s.iter().map(|(p, v)| (*p, QueueTimes::of(v))).collect();
    }
    for s in sent.iter().filter(|s| s.status == 429) {
        let Some(w) = slot(s.done_s).and_then(|i| out.get_mut(i)) else {
            continue;
        };
        let reason = s.dropped_reason.clone().unwrap_or_else(|| "none".into());
        *w.rejected
            .entry(s.tenant.clone())
            .or_default()
            .entry(reason)
            .or_insert(0) += 1;
    }
    out
}

/// The tokens served per tenant over the `loaded` windows (the span when the load ran).
pub fn loaded_served(windows: &[Window]) -> BTreeMap<String, u64> {
    served_over(windows.iter().filter(|w| w.loaded))
}

/// The tokens served per tenant over the loaded windows after the first: the first holds
/// the requests admitted at once, before the pool saturated and the queues formed, in
/// whatever order the clients' first requests arrived.
pub fn steady_served(windows: &[Window]) -> BTreeMap<String, u64> {
    served_over(windows.iter().filter(|w| w.loaded).skip(1))
}

fn served_over<'a>(windows: impl Iterator<Item = &'a Window>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for w in windows {
        for (t, v) in &w.served {
            *out.entry(t.clone()).or_insert(0) += v;
        }
    }
    out
}

/// The queue times per priority over every record (the whole phase).
pub fn queue_overall(records: &[Stamped]) -> BTreeMap<i64, QueueTimes> {
    let mut samples: BTreeMap<i64, Vec<(f64, bool)>> = BTreeMap::new();
    for r in records {
        if let Some(q) = queued(&r.record) {
            let priority = r.record["priority"].as_i64().unwrap_or(0);
            samples.entry(priority).or_default().push(q);
        }
    }
    samples
        .iter()
        .map(|(p, v)| (*p, QueueTimes::of(v)))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(at_s: f64, tenant: &str, priority: i64, outcome: &str, queued_ms: u64) -> Stamped {
        let done = !is_rejection(outcome);
        Stamped {
            at_s,
            record: json!({
                "tenant": tenant,
                "priority": priority,
                "outcome": outcome,
                "prompt_tokens": if done { 100 } else { 0 },
                "completion_tokens": if done { 10 } else { 0 },
                "queued_ms": queued_ms,
            }),
        }
    }

    fn sent(tenant: &str, done_s: f64, status: u16, reason: Option<&str>) -> Sent {
        Sent {
            tenant: tenant.into(),
            sent_s: 0.0,
            done_s,
            status,
            dropped_reason: reason.map(str::to_string),
        }
    }

    #[test]
    fn records_fall_into_their_windows() {
        let records = vec![
            rec(0.1, "a", 100, "complete", 10),
            rec(0.5, "a", 100, "complete", 30),
            rec(0.9, "b", 0, "complete", 200),
            rec(1.5, "a", 100, "complete", 20),
            // Refused at once: never queued, served nothing.
            rec(1.6, "c", -10, SATURATED, 0),
            rec(2.5, "c", -10, TTL_EXPIRED, 5000),
            // After the load stopped: the drain.
            rec(4.2, "c", -10, "complete", 4100),
        ];
        let answers = vec![
            sent("c", 1.6, 429, Some(SATURATED)),
            sent("c", 2.5, 429, Some(TTL_EXPIRED)),
            sent("c", 2.7, 429, None),
            sent("a", 0.1, 200, None),
        ];
        let w = windows(&records, &answers, 1.0, 3.0);
        assert_eq!(w.len(), 5);
        assert_eq!(
            w.iter().map(|w| w.loaded).collect::<Vec<_>>(),
            [true, true, true, false, false]
        );
        assert_eq!(w[0].served["a"], 2 * 120);
        assert_eq!(w[0].served["b"], 120);
        assert_eq!(w[0].completed["a"], 2);
        assert!((w[0].share("a", &["a", "b"]) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(w[0].queue[&100].requests, 2);
        assert_eq!(w[0].queue[&100].p99_ms, 30.0);
        assert_eq!(w[0].queue[&0].p50_ms, 200.0);
        assert!(!w[1].served.contains_key("c"));
        assert!(
            !w[1].queue.contains_key(&-10),
            "refused at once: never queued"
        );
        assert_eq!(w[1].rejected("c", SATURATED), 1);
        let q = w[2].queue[&-10];
        assert_eq!((q.requests, q.expired, q.p50_ms), (1, 1, 5000.0));
        assert_eq!(w[2].rejected("c", TTL_EXPIRED), 1);
        assert_eq!(w[2].rejected("c", "none"), 1);
        assert_eq!(w[4].served["c"], 120);
        assert_eq!(w[4].queue[&-10].expired, 0);
        let total = loaded_served(&w);
        assert_eq!((total["a"], total["b"]), (360, 120));
        let steady = steady_served(&w);
        assert_eq!((steady["a"], steady.get("b")), (120, None));
        assert!(!total.contains_key("c"), "c was served in the drain only");
        let all = queue_overall(&records);
        assert_eq!(all[&-10].requests, 2);
        assert_eq!(all[&100].requests, 3);
    }

    #[test]
    fn empty_input_has_one_empty_window() {
        let w = windows(&[], &[], 2.0, 10.0);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].share("a", &["a", "b"]), 0.0);
        assert!(w[0].queue.is_empty());
    }

    #[test]
    fn a_null_queue_time_is_an_admission_at_once() {
        let r = json!({"tenant": "a", "outcome": "complete", "prompt_tokens": 5,
                       "completion_tokens": 1, "queued_ms": null});
        assert_eq!(queued(&r), Some((0.0, false)));
        assert_eq!(served_tokens(&r), 7);
        let refused = json!({"outcome": SATURATED, "queued_ms": null});
        assert_eq!(queued(&refused), None);
        let expired = json!({"outcome": TTL_EXPIRED, "queued_ms": 5001});
        assert_eq!(queued(&expired), Some((5001.0, true)));
        assert_eq!(queued(&json!({"outcome": TTL_EXPIRED})), None);
    }
}
