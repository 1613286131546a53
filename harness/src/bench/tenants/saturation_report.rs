//! The saturation phase's part of the tenants report: the table per window (tokens served
//! per tenant and A's share, queue time per priority, the best-effort tenant's 429s), the
//! phase's totals with the ledger check, and the paragraph that says who was served, who
//! waited and who was refused, built from those figures.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::saturation::{
    SaturationFigures, A_OUTSTANDING, BEST_EFFORT_BAND, BEST_EFFORT_QUEUE, B_OUTSTANDING,
    COMPLETION_TOKENS, C_RATE, MAX_CONCURRENCY, PROMPT_TOKENS, TENANT_C, TTL_SECS, WEIGHT_A,
    WEIGHT_B,
};
use super::windows::{
    loaded_served, share, steady_served, QueueTimes, Window, SATURATED, TTL_EXPIRED,
};
use super::{TENANT_A, TENANT_B};
use crate::bench::report::table;

/// The two tenants whose shares the weights set.
pub const SHARED: [&str; 2] = [TENANT_A, TENANT_B];

/// A's target share of the tokens A and B are served: its weight over both weights.
pub fn target_share() -> f64 {
    f64::from(WEIGHT_A) / f64::from(WEIGHT_A + WEIGHT_B)
}

fn served_of(m: &BTreeMap<String, u64>, tenant: &str) -> u64 {
    m.get(tenant).copied().unwrap_or(0)
}

/// `a ÷ b` as `3.02`, or `—` when `b` is 0.
fn ratio_cell(a: u64, b: u64) -> String {
    if b == 0 {
        "—".into()
    } else {
        format!("{:.2}", a as f64 / b as f64)
    }
}

fn queue_cell(q: Option<&QueueTimes>) -> String {
    match q {
        None => "—".into(),
        Some(q) if q.requests == 0 => "—".into(),
        Some(q) => {
            let mut s = format!("{:.0} / {:.0} ({})", q.p50_ms, q.p99_ms, q.requests);
            if q.expired > 0 {
                let _ = write!(s, " {} expired", q.expired);
            }
            s
        }
    }
}

/// The priorities the records carry, highest first.
pub fn priorities(f: &SaturationFigures) -> Vec<i64> {
    let mut p: Vec<i64> = f.queue.keys().copied().collect();
    p.sort_unstable_by(|a, b| b.cmp(a));
    p
}

fn window_label(w: &Window) -> String {
    format!(
        "{:.0}–{:.0} s{}",
        w.start_s,
        w.end_s,
        if w.loaded { "" } else { " (drain)" }
    )
}

/// The table of the phase, one row per window, then the loaded span's totals.
pub fn phase_table(f: &SaturationFigures) -> String {
    let prios = priorities(f);
    let mut header: Vec<String> = vec![
        "window".into(),
        "A served".into(),
        "B served".into(),
        "A share".into(),
        "A : B".into(),
        "C served".into(),
    ];
    header.extend(
        prios
            .iter()
            .map(|p| format!("queued ms p{p}: p50 / p99 (n)")),
    );
    header.push("C 429 saturated".into());
    header.push("C 429 ttl".into());
    let row = |label: String,
               served: &BTreeMap<String, u64>,
               queue: &BTreeMap<i64, QueueTimes>,
               saturated: u64,
               ttl: u64| {
        let (a, b) = (served_of(served, TENANT_A), served_of(served, TENANT_B));
        let mut cells = vec![
            a.to_string(),
            b.to_string(),
            if a + b == 0 {
                "—".into()
            } else {
                format!("{:.1}%", share(served, TENANT_A, &SHARED) * 100.0)
            },
            ratio_cell(a, b),
            served_of(served, TENANT_C).to_string(),
        ];
        cells.extend(prios.iter().map(|p| queue_cell(queue.get(p))));
        cells.push(saturated.to_string());
        cells.push(ttl.to_string());
        (label, cells)
    };
    let mut rows: Vec<(String, Vec<String>)> = f
        .windows
        .iter()
        .map(|w| {
            row(
                window_label(w),
                &w.served,
                &w.queue,
                w.rejected(TENANT_C, SATURATED),
                w.rejected(TENANT_C, TTL_EXPIRED),
            )
        })
        .collect();
    let loaded: Vec<&Window> = f.windows.iter().filter(|w| w.loaded).collect();
    rows.push(row(
        format!("loaded span 0–{:.0} s", f.load_s),
        &loaded_served(&f.windows),
        &BTreeMap::new(),
        loaded.iter().map(|w| w.rejected(TENANT_C, SATURATED)).sum(),
        loaded
            .iter()
            .map(|w| w.rejected(TENANT_C, TTL_EXPIRED))
            .sum(),
    ));
    rows.push(row(
        format!("after the first window {:.0}–{:.0} s", f.window_s, f.load_s),
        &steady_served(&f.windows),
        &BTreeMap::new(),
        loaded
            .iter()
            .skip(1)
            .map(|w| w.rejected(TENANT_C, SATURATED))
            .sum(),
        loaded
            .iter()
            .skip(1)
            .map(|w| w.rejected(TENANT_C, TTL_EXPIRED))
            .sum(),
    ));
    rows.push(row(
        "whole phase".into(),
        &served_all(f),
        &f.queue,
        rejected_total(f, TENANT_C, SATURATED),
        rejected_total(f, TENANT_C, TTL_EXPIRED),
    ));
    table(&header, &rows)
}

/// Tokens served per tenant over every window.
fn served_all(f: &SaturationFigures) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for w in &f.windows {
        for (t, v) in &w.served {
            *out.entry(t.clone()).or_insert(0) += v;
        }
    }
    out
}

/// 429s the client of `tenant` received with `reason` during the phase.
pub fn rejected_total(f: &SaturationFigures, tenant: &str, reason: &str) -> u64 {
    f.sent
        .iter()
        .filter(|s| s.tenant == tenant && s.status == 429)
        .filter(|s| s.dropped_reason.as_deref().unwrap_or("none") == reason)
        .count() as u64
}

/// Requests and their answers per tenant: `sent / 200 / 429 / other`.
fn answers_of(f: &SaturationFigures, tenant: &str) -> (usize, usize, usize, usize) {
    let mine: Vec<_> = f.sent.iter().filter(|s| s.tenant == tenant).collect();
    let ok = mine.iter().filter(|s| s.status == 200).count();
    let refused = mine.iter().filter(|s| s.status == 429).count();
    (mine.len(), ok, refused, mine.len() - ok - refused)
}

/// Whether the tokens billed (prompt + 2 × completion) per tenant equal what the replicas
/// say they served to that fairness id, for every tenant that sent.
fn billed_is_served(f: &SaturationFigures) -> bool {
    [TENANT_A, TENANT_B, TENANT_C].iter().all(|t| {
        let b = f.bills.get(*t).cloned().unwrap_or_default();
        let s = f.served.get(*t).copied().unwrap_or_default();
        b.prompt_tokens == s.prompt_tokens && b.completion_tokens == s.completion_tokens
    })
}

/// The phase's section of the report: what ran, the table, the totals and checks.
pub fn render(f: &SaturationFigures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "saturation phase ({}, a fresh simulator and Envoy): flow control on; the pool counts \
         as saturated at {MAX_CONCURRENCY} requests in flight from this Envoy \
         (concurrency-detector); band {} (weighted-fairness-policy: tenant-a weight {WEIGHT_A}, \
         tenant-b weight {WEIGHT_B}; A's objective, priority 100, has no band of its own and \
         shares it), band {BEST_EFFORT_BAND} (best-effort, at most {BEST_EFFORT_QUEUE} \
         queued); TTL {TTL_SECS} s. For {:.0} s A keeps {A_OUTSTANDING} requests outstanding, B \
         {B_OUTSTANDING}, and C (best-effort) sends {C_RATE} a second; every request is \
         {PROMPT_TOKENS} prompt + {COMPLETION_TOKENS} completion tokens. Served = prompt + 2 × \
         completion tokens of the requests that completed in the window (the weighted policy's \
         unit), from the billing records, each stamped when the demo read it from the log; \
         queued ms = the records' queued_ms of the requests that ended in the window, admitted \
         (at once: 0) or dropped when their TTL expired\n",
        f.label,
        super::saturation::SHARED_BAND,
        f.load_s,
    );
    out.push_str(&phase_table(f));
    for t in [TENANT_A, TENANT_B, TENANT_C] {
        let (n, ok, refused, other) = answers_of(f, t);
        let reasons: Vec<String> = [SATURATED, TTL_EXPIRED]
            .iter()
            .map(|r| format!("{r} {}", rejected_total(f, t, r)))
            .collect();
        let _ = writeln!(
            out,
            "{t}: {n} sent, {ok} answered 200, {refused} refused 429 ({}), {other} other",
            reasons.join(", ")
        );
    }
    let lines: usize = f.records.len();
    let answered = f.sent.iter().filter(|s| s.status != 0).count();
    let _ = writeln!(
        out,
        "billing log: {lines} records for {answered} answered requests ({}); tokens billed \
         {} the tokens the replicas served, per tenant",
        f.billing_log.display(),
        if billed_is_served(f) {
            "equal"
        } else {
            "do NOT equal"
        }
    );
    if f.flow_stats.is_empty() {
        let _ = writeln!(out, "gateway flow-control counters: none counted");
    } else {
        let stats: Vec<String> = f
            .flow_stats
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(out, "gateway flow-control counters: {}", stats.join(", "));
    }
    out
}

/// The paragraph on the phase: who was served under saturation, in what shares, who waited
/// how long, and who was refused.
pub fn answer(f: &SaturationFigures) -> String {
    let loaded = loaded_served(&f.windows);
    let (a, b) = (served_of(&loaded, TENANT_A), served_of(&loaded, TENANT_B));
    let c_loaded = served_of(&loaded, TENANT_C);
    let target = target_share();
    // The first window holds the admissions before the queues formed: the per-window range
    // and the steady ratio leave it out.
    let shares: Vec<f64> = f
        .windows
        .iter()
        .filter(|w| w.loaded)
        .skip(1)
        .filter(|w| served_of(&w.served, TENANT_B) + served_of(&w.served, TENANT_A) > 0)
        .map(|w| w.share(TENANT_A, &SHARED))
        .collect();
    let (lo, hi) = shares
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), s| {
            (l.min(*s), h.max(*s))
        });
    let steady = steady_served(&f.windows);
    let (sa, sb) = (served_of(&steady, TENANT_A), served_of(&steady, TENANT_B));
    let mut s = String::new();
    if a + b == 0 {
        return "Under saturation: no request of A or B completed while the load ran, so the \
                phase shows nothing about shares."
            .into();
    }
    let r = a as f64 / b.max(1) as f64;
    let weights = f64::from(WEIGHT_A) / f64::from(WEIGHT_B);
    let off = (r / weights - 1.0) * 100.0;
    let _ = write!(
        s,
        "Under saturation, flow control decides who waits. The pool was let serve \
         {MAX_CONCURRENCY} requests at once while A kept {A_OUTSTANDING} and B \
         {B_OUTSTANDING} outstanding, so the gateway held the rest queued inside Envoy and \
         dispatched by weight: over the {:.0} s of load A was served {} tokens and B {} \
         (prompt + 2 × completion), {:.1}% and {:.1}% of what they shared, A : B = {r:.2} \
         against weights {WEIGHT_A} : {WEIGHT_B} ({off:+.1}%)",
        f.load_s,
        a,
        b,
        a as f64 / (a + b) as f64 * 100.0,
        b as f64 / (a + b) as f64 * 100.0,
    );
    if lo.is_finite() && sb > 0 {
        let sr = sa as f64 / sb as f64;
        let _ = write!(
            s,
            "; from {:.0} s on (the first window holds the requests admitted at once, before \
             the queues formed) A : B = {sr:.2} ({:+.1}%), and A's share per {:.0} s window \
             stayed between {:.0}% and {:.0}% (target {:.0}%)",
            f.window_s,
            (sr / weights - 1.0) * 100.0,
            f.window_s,
            lo * 100.0,
            hi * 100.0,
            target * 100.0
        );
    }
    s.push_str(". ");
    let q = |p: i64| f.queue.get(&p).copied().unwrap_or_default();
    let prio_of = |tenant: &str| {
        f.records
            .iter()
            .find(|r| r.record["tenant"] == tenant)
            .and_then(|r| r.record["priority"].as_i64())
    };
    let wait_of = |t: &str| {
        prio_of(t)
            .map(|p| (p, q(p)))
            .filter(|(_, qt)| qt.requests > 0)
    };
    let waits: Vec<String> = [("A", TENANT_A), ("B", TENANT_B)]
        .iter()
        .filter_map(|(name, t)| {
            let (p, qt) = wait_of(t)?;
            Some(format!(
                "{name}'s (priority {p}) {:.0} ms at p50 and {:.0} ms at p99",
                qt.p50_ms, qt.p99_ms
            ))
        })
        .collect();
    if !waits.is_empty() {
        let _ = write!(
            s,
            "Requests waited in the gateway, not in the replicas' queues: {}",
            waits.join(", ")
        );
        if let (Some((_, qa)), Some((_, qb))) = (wait_of(TENANT_A), wait_of(TENANT_B)) {
            if qb.p50_ms > qa.p50_ms {
                s.push_str(
                    "; B, with half A's requests outstanding but a third of its weight, waits \
                     longer",
                );
            }
        }
        s.push_str(". ");
    }
    let (c_sent, c_ok, c_refused, _) = answers_of(f, TENANT_C);
    let sat = rejected_total(f, TENANT_C, SATURATED);
    let ttl = rejected_total(f, TENANT_C, TTL_EXPIRED);
    let c_wait = q(i64::from(BEST_EFFORT_BAND));
    let _ = write!(
        s,
        "The best-effort tenant C (priority {BEST_EFFORT_BAND}) sent {c_sent} requests: {} \
         while A and B were backlogged, since a higher band always goes first; {sat} were \
         refused at once with 429 rejected-saturated (its band holds {BEST_EFFORT_QUEUE}), {ttl} \
         waited their {TTL_SECS} s TTL and got 429 rejected-ttl-expired{}, and {c_ok} \
         {} served{}. Every 429 came before any replica saw the request ({c_refused} in all), so \
         C may retry them safely.",
        if c_loaded == 0 {
            "none was served".to_string()
        } else {
            format!("{c_loaded} tokens of them were served")
        },
        if c_wait.requests > 0 {
            format!(
                " (C's queue time p50 {:.0} ms, p99 {:.0} ms)",
                c_wait.p50_ms, c_wait.p99_ms
            )
        } else {
            String::new()
        },
        if c_ok == 1 { "was" } else { "were" },
        if c_ok > 0 && c_loaded == 0 {
            ", in the drain after A and B stopped"
        } else {
            ""
        },
    );
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::windows::{windows, Sent, Stamped};
    use super::*;
    use serde_json::json;

    fn rec(at_s: f64, tenant: &str, priority: i64, outcome: &str, queued_ms: u64) -> Stamped {
        let done = outcome == "complete";
        Stamped {
            at_s,
            record: json!({
                "tenant": tenant, "priority": priority, "outcome": outcome,
                "prompt_tokens": if done { 100 } else { 0 },
                "completion_tokens": if done { 10 } else { 0 },
                "queued_ms": queued_ms,
            }),
        }
    }

    fn answer_of(tenant: &str, done_s: f64, status: u16, reason: Option<&str>) -> Sent {
        Sent {
            tenant: tenant.into(),
            sent_s: 0.0,
            done_s,
            status,
            dropped_reason: reason.map(str::to_string),
        }
    }

    /// Two loaded windows with A served three times B, C refused, then a drain serving C.
    fn figures() -> SaturationFigures {
        let mut records = Vec::new();
        let mut sent = Vec::new();
        for w in 0..2 {
            let t = f64::from(w) * 2.0 + 0.5;
            for _ in 0..3 {
                records.push(rec(t, TENANT_A, 100, "complete", 300));
                sent.push(answer_of(TENANT_A, t, 200, None));
            }
            records.push(rec(t, TENANT_B, 0, "complete", 900));
            sent.push(answer_of(TENANT_B, t, 200, None));
            records.push(rec(t, TENANT_C, -10, SATURATED, 0));
            sent.push(answer_of(TENANT_C, t, 429, Some(SATURATED)));
        }
        records.push(rec(3.9, TENANT_C, -10, TTL_EXPIRED, 5000));
        sent.push(answer_of(TENANT_C, 3.9, 429, Some(TTL_EXPIRED)));
        records.push(rec(4.5, TENANT_C, -10, "complete", 4200));
        sent.push(answer_of(TENANT_C, 4.5, 200, None));
        let load_s = 4.0;
        SaturationFigures {
            label: "gateway".into(),
            load_s,
            window_s: 2.0,
            windows: windows(&records, &sent, 2.0, load_s),
            queue: super::super::windows::queue_overall(&records),
            sent,
            records,
            ..SaturationFigures::default()
        }
    }

    #[test]
    fn the_table_has_a_row_per_window_and_the_totals() {
        let f = figures();
        let t = phase_table(&f);
        assert!(t.contains("0–2 s"), "{t}");
        assert!(t.contains("4–6 s (drain)"), "{t}");
        assert!(t.contains("75.0%") && t.contains("3.00"), "{t}");
        assert!(t.contains("loaded span 0–4 s"), "{t}");
        assert!(t.contains("300 / 300 (6)"), "{t}");
        assert!(t.contains("queued ms p-10"), "{t}");
        let text = render(&f);
        let c = "tenant-c: 4 sent, 1 answered 200, 3 refused 429 (rejected-saturated 2, \
                 rejected-ttl-expired 1), 0 other";
        assert!(text.contains(c), "{text}");
    }

    #[test]
    fn the_answer_is_built_from_the_figures() {
        let f = figures();
        let text = answer(&f);
        for needle in [
            "A was served 720 tokens and B 240",
            "A : B = 3.00 against weights 3 : 1 (+0.0%)",
            "from 2 s on (the first window holds the requests admitted at once, before the \
             queues formed) A : B = 3.00 (+0.0%), and A's share per 2 s window stayed between \
             75% and 75% (target 75%)",
            "A's (priority 100) 300 ms at p50",
            "B's (priority 0) 900 ms",
            "a third of its weight, waits longer",
            "sent 4 requests: none was served while A and B were backlogged",
            "2 were refused at once with 429 rejected-saturated",
            "1 waited their 5 s TTL",
            "1 was served, in the drain after A and B stopped",
        ] {
            assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
        }
        let empty = SaturationFigures::default();
        assert!(answer(&empty).contains("shows nothing"));
    }
}
