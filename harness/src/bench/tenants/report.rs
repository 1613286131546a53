//! The tenants scenario's report: what ran (objects, limits, load), the two runs side by
//! side (A's TTFT, B's outcomes by reason, where each tenant's requests ran, what the
//! replicas served), the billing log's totals per tenant with the conservation check next
//! to the replicas' own counts, and the paragraph that answers the question the demo is
//! for, built from those figures.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use super::figures::{Bill, Served};
use super::{Route, RunFigures, TenantLimit, TenantsOptions, TENANT_A, TENANT_B};
use crate::bench::report::table;
use crate::load::{LoadClass, Summary};

/// The 429 reasons of the quota stage, in the order they are checked.
pub const QUOTA_REASONS: [&str; 3] = [
    "rejected-quota-rpm",
    "rejected-quota-tpm",
    "rejected-quota-concurrency",
];

/// Everything the report shows.
#[derive(Debug)]
pub struct Report<'a> {
    /// The scenario's flags.
    pub opts: &'a TenantsOptions,
    /// Where the objects came from.
    pub objects_path: &'a Path,
    /// The compiled limits.
    pub limits: Vec<TenantLimit>,
    /// The load classes.
    pub classes: Vec<LoadClass>,
    /// The gateway run, then the `/rr` run.
    pub runs: &'a [RunFigures],
}

fn ms(s: f64) -> String {
    if s >= 10.0 {
        format!("{s:.1} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1000.0)
    }
}

/// `a ÷ b`, 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn class_line(c: &LoadClass) -> String {
    let w = &c.workload;
    let shape = if w.turns > 1 {
        format!(
            "{} conversations × {} turns ({}-token system prompts, {}-token questions, \
             {}-token answers)",
            w.conversations, w.turns, w.system_tokens, w.user_tokens, w.max_tokens
        )
    } else {
        format!(
            "{} single requests ({}-token prompts + a {}-token question, {}-token answers)",
            w.conversations, w.system_tokens, w.user_tokens, w.max_tokens
        )
    };
    let rate = c.rate.map_or("as fast as it may".into(), |r| {
        format!("started at up to {r}/s (Poisson)")
    });
    format!(
        "{}: {shape}, {rate}, at most {} in flight; a 429 is not retried",
        c.name, c.concurrency
    )
}

fn summary<'a>(run: &'a RunFigures, class: usize) -> Option<&'a Summary> {
    run.classes.get(class).map(|c| &c.summary)
}

fn count(map: &BTreeMap<String, u64>, key: &str) -> u64 {
    map.get(key).copied().unwrap_or(0)
}

/// 429s other than the quota stage's, and every status that is neither 200 nor 429.
fn other_outcomes(s: &Summary) -> String {
    let mut parts: Vec<String> = s
        .rejected_429
        .iter()
        .filter(|(k, _)| !QUOTA_REASONS.contains(&k.as_str()))
        .map(|(k, v)| format!("429 {k}: {v}"))
        .collect();
    parts.extend(s.other_statuses.iter().map(|(k, v)| format!("{k}: {v}")));
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn per_replica(p: &[u64]) -> String {
    let (known, unknown) = p.split_at(p.len().saturating_sub(1));
    let mut s = known
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" / ");
    if unknown.first().is_some_and(|u| *u > 0) {
        let _ = write!(s, " (+{} unknown)", unknown[0]);
    }
    s
}

fn served_cell(s: Option<&Served>) -> String {
    let s = s.copied().unwrap_or_default();
    format!("{} + {}", s.prompt_tokens, s.completion_tokens)
}

/// The side-by-side table of the runs.
pub fn runs_table(runs: &[RunFigures]) -> String {
    let mut header = vec![String::new()];
    header.extend(runs.iter().map(|r| r.label.clone()));
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |label: &str, f: &dyn Fn(&RunFigures) -> String| {
        rows.push((label.to_string(), runs.iter().map(f).collect()));
    };
    let a = |r: &RunFigures| summary(r, 0).cloned().unwrap_or_default();
    let b = |r: &RunFigures| summary(r, 1).cloned().unwrap_or_default();
    row("wall time of the load", &|r| format!("{:.1} s", r.wall_s));
    row("A: requests / answered", &|r| {
        format!("{} / {}", a(r).requests, a(r).ok)
    });
    row("A: TTFT p50", &|r| ms(a(r).ttft_p50_s));
    row("A: TTFT p99", &|r| ms(a(r).ttft_p99_s));
    row("A: refused (429)", &|r| {
        a(r).rejected_429.values().sum::<u64>().to_string()
    });
    row("A: other failures", &|r| other_outcomes(&a(r)));
    row("B: requests / answered", &|r| {
        format!("{} / {}", b(r).requests, b(r).ok)
    });
    for reason in QUOTA_REASONS {
        row(&format!("B: 429 {reason}"), &|r| {
            count(&b(r).rejected_429, reason).to_string()
        });
    }
    row("B: other failures", &|r| other_outcomes(&b(r)));
    row("B: completion tokens received", &|r| {
        b(r).tokens_received.to_string()
    });
    row("B: TTFT p50 / p99 (answered)", &|r| {
        format!("{} / {}", ms(b(r).ttft_p50_s), ms(b(r).ttft_p99_s))
    });
    row("A: answered per replica 0/1/2/3", &|r| {
        per_replica(r.placement.first().map_or(&[], Vec::as_slice))
    });
    row("B: answered per replica 0/1/2/3", &|r| {
        per_replica(r.placement.get(1).map_or(&[], Vec::as_slice))
    });
    row("replicas served A (prompt + completion)", &|r| {
        served_cell(r.served.get(TENANT_A))
    });
    row("replicas served B (prompt + completion)", &|r| {
        served_cell(r.served.get(TENANT_B))
    });
    table(&header, &rows)
}

/// The billing table of one run: one row per tenant, next to what the replicas served.
pub fn billing_table(run: &RunFigures) -> String {
    let header: Vec<String> = [
        "tenant",
        "records",
        "admitted",
        "Σ prompt",
        "Σ completion",
        "Σ cached",
        "Σ pre_debit",
        "Σ refund",
        "Σ charged",
        "pre_debit − refund = charged",
        "replicas served",
        "billed = served",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = run
        .bills
        .iter()
        .map(|(tenant, b)| {
            let s = run.served.get(tenant).copied().unwrap_or_default();
            let served_total = s.prompt_tokens + s.completion_tokens;
            (
                tenant.clone(),
                vec![
                    b.records.to_string(),
                    b.admitted.to_string(),
                    b.prompt_tokens.to_string(),
                    b.completion_tokens.to_string(),
                    b.cached_tokens.to_string(),
                    b.pre_debit.to_string(),
                    b.refund.to_string(),
                    b.charged.to_string(),
                    format!(
                        "{} − {} = {} ({})",
                        b.pre_debit,
                        b.refund,
                        b.settled(),
                        if b.conserved() { "holds" } else { "BROKEN" }
                    ),
                    served_total.to_string(),
                    if billed_matches(b, &s) { "yes" } else { "NO" }.to_string(),
                ],
            )
        })
        .collect::<Vec<_>>();
    table(&header, &rows)
}

/// Whether the tokens billed are the tokens the replicas served, field by field.
pub fn billed_matches(b: &Bill, s: &Served) -> bool {
    b.prompt_tokens == s.prompt_tokens && b.completion_tokens == s.completion_tokens
}

/// The whole report.
pub fn render(r: &Report<'_>) -> String {
    let mut out = String::new();
    let o = r.opts;
    let _ = writeln!(
        out,
        "infergate demo, tenants: two tenants share 4 simulated replicas; the gateway's \
         tenancy vs round robin\n\
         simulated pool: 4 replicas × 160k tokens KV, 16k tokens/s prefill, time scale {} \
         (times are wall-clock); each run on a fresh simulator and a fresh Envoy ({} \
         workers, {} flavour): empty caches and queues, counters from zero",
        o.time_scale, o.workers, o.flavor
    );
    let _ = writeln!(
        out,
        "objects: {} (TenantQuota and InferenceObjective, compiled by the gateway's loader):",
        r.objects_path.display()
    );
    for l in &r.limits {
        let _ = writeln!(out, "  {l}");
    }
    let _ = writeln!(
        out,
        "load, the same in both runs (each tenant's text its own, the same in both runs):"
    );
    for c in &r.classes {
        let _ = writeln!(out, "  {}", class_line(c));
    }
    let _ = writeln!(
        out,
        "through the gateway each class sends its tenant's API key; through /rr it also sends \
         its fairness id, which only labels the replicas' counters\n"
    );
    out.push_str(&runs_table(r.runs));
    for run in r.runs {
        out.push('\n');
        match run.route {
            Route::Gateway => {
                let _ = writeln!(
                    out,
                    "billing log of the {} run: {} lines for {} requests ({})",
                    run.label,
                    run.billing_lines,
                    run.classes.iter().map(|c| c.records.len()).sum::<usize>(),
                    run.billing_log.display()
                );
                out.push_str(&billing_table(run));
                if let Some(p) = &run.probe_after {
                    let _ = writeln!(out, "one more of B's requests right after its batch: {p}");
                }
            }
            Route::RoundRobin => {
                let _ = writeln!(
                    out,
                    "billing log of the {} run: {} lines (no gateway filter on that route: no \
                     auth, no quota, no record) ({})",
                    run.label,
                    run.billing_lines,
                    run.billing_log.display()
                );
            }
        }
    }
    if let [gw, rr] = r.runs {
        out.push('\n');
        out.push_str(&answer(gw, rr, &r.limits));
        out.push('\n');
    }
    out
}

/// The paragraph answering the seed's question (who gets in, who waits, on which replica,
/// what a quota is), from the figures of the gateway run `gw` and the `/rr` run `rr`.
pub fn answer(gw: &RunFigures, rr: &RunFigures, limits: &[TenantLimit]) -> String {
    let (Some(a), Some(b), Some(a_rr), Some(b_rr)) = (
        summary(gw, 0),
        summary(gw, 1),
        summary(rr, 0),
        summary(rr, 1),
    ) else {
        return "(no figures to answer from)".into();
    };
    let bill = |t: &str| gw.bills.get(t).cloned().unwrap_or_default();
    let (bill_a, bill_b) = (bill(TENANT_A), bill(TENANT_B));
    let per_min = |charged: u64| charged as f64 * 60.0 / gw.wall_s.max(1e-9);
    let tpm_of = |tenant: &str| {
        limits
            .iter()
            .find(|l| l.tenant == tenant)
            .and_then(|l| l.tpm)
            .map_or("none".to_string(), |t| t.to_string())
    };
    let a_refused: u64 = a.rejected_429.values().sum();
    let b_refused: u64 = b.rejected_429.values().sum();
    let reasons = QUOTA_REASONS
        .iter()
        .map(|q| {
            format!(
                "{} for {}",
                count(&b.rejected_429, q),
                match *q {
                    "rejected-quota-rpm" => "requests per minute",
                    "rejected-quota-tpm" => "tokens per minute",
                    _ => "concurrency",
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut s = String::new();
    let _ = write!(
        s,
        "Who gets in: {} of A's {} requests{} (A was charged {} tokens in {:.0} s, {:.0} a \
         minute against its tpm of {}), and {} of B's {}; the gateway refused {} of B's at once \
         with 429 ({reasons}), each with a retry-after, before any replica saw it, and charged \
         nothing for them. ",
        a.ok,
        a.requests,
        if a_refused == 0 {
            ", none refused".to_string()
        } else {
            format!(", {a_refused} refused")
        },
        bill_a.charged,
        gw.wall_s,
        per_min(bill_a.charged),
        tpm_of(TENANT_A),
        b.ok,
        b.requests,
        b_refused,
    );
    let _ = write!(
        s,
        "Who waits: nobody queues in the gateway. It has no priority queue yet, so A's \
         premium objective (priority 100) and B's standard one (0) label the requests, the \
         billing records and the token counters, but order nothing; B's excess waits on B's \
         side, for the retry-after it was given (this batch client does not retry), instead of \
         in the replicas' queues in front of A. Through /rr, where nothing is refused, {} of \
         B's {} requests reached the replicas and A's first tokens took {} at p50 and {} at \
         p99, against {} and {} through the gateway ({:.1}× and {:.1}× lower). ",
        b_rr.ok,
        b_rr.requests,
        ms(a_rr.ttft_p50_s),
        ms(a_rr.ttft_p99_s),
        ms(a.ttft_p50_s),
        ms(a.ttft_p99_s),
        ratio(a_rr.ttft_p50_s, a.ttft_p50_s),
        ratio(a_rr.ttft_p99_s, a.ttft_p99_s),
    );
    let place =
        |run: &RunFigures, i: usize| per_replica(run.placement.get(i).map_or(&[], Vec::as_slice));
    let _ = write!(
        s,
        "On which replica: the picker placed A's answered requests {} and B's {} over \
         replicas 0/1/2/3, by prefix cache, queue and load (it knows no tenant); round robin \
         put A's {} and B's {}, every fourth request on each replica whatever it held. ",
        place(gw, 0),
        place(gw, 1),
        place(rr, 0),
        place(rr, 1),
    );
    let conserved = bill_a.conserved() && bill_b.conserved();
    let matches =
        |t: &str, b: &Bill| billed_matches(b, &gw.served.get(t).copied().unwrap_or_default());
    let billed_ok = matches(TENANT_A, &bill_a) && matches(TENANT_B, &bill_b);
    let cost = |b: &Bill| ratio(b.charged as f64, b.admitted as f64);
    let _ = write!(
        s,
        "What a quota is: tokens, prompt plus completion. A tenant's bucket is debited the \
         prompt estimate plus the output it may ask for on arrival, and settled to the \
         engine's usage at the end (Σ pre-debit − Σ refund = Σ charged {} for both tenants, \
         and the tokens billed {} the tokens the replicas report serving), so one of B's \
         requests (about {:.0} tokens) costs as much as {:.1} of A's chat turns (about {:.0}); \
         requests per minute and concurrency are separate caps{}. GPU time is not what is \
         counted: tokens stand in for it, and a cached prompt token ({} of A's {} prompt \
         tokens were served from cache) is charged like any other.",
        if conserved { "held" } else { "did NOT hold" },
        if billed_ok { "equal" } else { "do NOT equal" },
        cost(&bill_b),
        ratio(cost(&bill_b), cost(&bill_a)),
        cost(&bill_a),
        if count(&b.rejected_429, "rejected-quota-rpm") == 0 {
            ", and the request cap never bit: a few big requests emptied B's tokens first, \
             which is why a per-request limit misjudges tenants whose requests differ in size"
        } else {
            ""
        },
        bill_a.cached_tokens,
        bill_a.prompt_tokens,
    );
    s
}
