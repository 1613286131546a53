//! The tenants scenario's report: what ran (objects, limits, load), the two runs side by
//! side (A's TTFT, B's outcomes by reason, where each tenant's requests ran, what the
//! replicas served), the billing log's totals per tenant with the conservation check next
//! to the replicas' own counts, and the paragraph that answers the question the demo is
//! for, built from those figures.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use super::figures::{Bill, Served};
use super::saturation::SaturationFigures;
use super::saturation_report;
use super::{Route, RunFigures, Sample, TenantLimit, TenantsOptions, TENANT_A, TENANT_B};
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
    /// The saturation phase, when it ran.
    pub saturation: Option<&'a SaturationFigures>,
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

/// A count rounded to thousands (`197k`), or as it is below 10 000.
fn thousands(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.0}")
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

fn summary(run: &RunFigures, class: usize) -> Option<&Summary> {
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
    row("A: cache hits (Σ cached ÷ Σ prompt)", &|r| {
        format!("{:.1}%", a(r).cache_hit_ratio * 100.0)
    });
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
                    "billing log of the {} run: {} lines for {} requests of the load and {} \
                     sampled ({})",
                    run.label,
                    run.billing_lines,
                    run.classes.iter().map(|c| c.records.len()).sum::<usize>(),
                    run.sample.as_ref().map_or(0, |s| u8::from(s.status != 0)),
                    run.billing_log.display()
                );
                out.push_str(&billing_table(run));
                if let Some(p) = &run.sample {
                    let _ = writeln!(
                        out,
                        "one request of B's sent half-way through, besides the batch (its line \
                         is in the log and in B's row): {}",
                        p.line()
                    );
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
    if let Some(f) = r.saturation {
        out.push('\n');
        out.push_str(&saturation_report::render(f));
    }
    for a in answers(r) {
        out.push('\n');
        out.push_str(&a);
        out.push('\n');
    }
    out
}

/// The paragraphs answering the demo's questions: the quota runs', then the saturation
/// phase's.
pub fn answers(r: &Report<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if let [gw, rr] = r.runs {
        out.push(answer(gw, rr, &r.limits));
    }
    if let Some(f) = r.saturation {
        out.push(saturation_report::answer(f));
    }
    out
}

/// One limit of `tenant` (its first model's), as text (`none` when unset or unknown).
fn limit_of(
    limits: &[TenantLimit],
    tenant: &str,
    field: impl Fn(&TenantLimit) -> Option<u64>,
) -> String {
    limits
        .iter()
        .find(|l| l.tenant == tenant)
        .and_then(field)
        .map_or("none".to_string(), |v| v.to_string())
}

/// How many of B's admitted requests, at their mean charge, B's full token bucket holds.
fn burst_of_b(limits: &[TenantLimit], bill: &Bill) -> String {
    let tpm = limits
        .iter()
        .find(|l| l.tenant == TENANT_B)
        .and_then(|l| l.tpm);
    match tpm {
        Some(tpm) if bill.admitted > 0 && bill.charged > 0 => {
            format!(
                "{:.0}",
                tpm as f64 * bill.admitted as f64 / bill.charged as f64
            )
        }
        _ => "?".into(),
    }
}

/// What the mid-batch sample says about waiting, as a clause (empty without one).
fn sample_clause(sample: Option<&Sample>) -> String {
    let Some(s) = sample else {
        return String::new();
    };
    match (s.status, s.header("retry-after")) {
        (429, Some(after)) => format!(
            "; B's request sampled half-way through was refused with {} and told to retry \
             after {after} s",
            s.header("x-llm-d-request-dropped-reason")
                .unwrap_or("no reason")
        ),
        (200, _) => format!(
            "; B's request sampled half-way through was admitted, with {} tokens of its \
             minute left",
            s.header("x-ratelimit-remaining-tokens").unwrap_or("?")
        ),
        _ => format!("; B's request sampled half-way through got {}", s.line()),
    }
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
    let tpm_of = |tenant: &str| limit_of(limits, tenant, |l| l.tpm);
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
        "Who gets in: {} of A's {} requests{} (A was charged {} tokens in {:.0} s, {} a \
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
        thousands(per_min(bill_a.charged)),
        tpm_of(TENANT_A),
        b.ok,
        b.requests,
        b_refused,
    );
    let _ = write!(
        s,
        "Who waits: nobody queues in the gateway in this run, whose pool has flow control \
         off, so A's premium objective (priority 100) and B's standard one (0) label the \
         requests, the billing records and the token counters, but order nothing (the \
         saturation phase turns it on); B's excess waits on B's side, for the retry-after it \
         is given (this batch client does not retry{}), instead \
         of in the replicas' queues in front of A. The {} of B's that got in share the \
         replicas' first-come-first-served queues with A's (B's bucket starts full, a minute \
         of tokens, enough for about {} of its prompts at once, {} at a time), which is where \
         A's remaining tail through the gateway can come from. Through /rr, where nothing is \
         refused, {} of B's {} requests reached the replicas and A's first tokens took {} at \
         p50 and {} at p99, against {} and {} through the gateway ({:.1}× and {:.1}× lower). \
         The two runs differ in two ways, which they do not separate: the quota kept all but \
         {} of B's prompts off the replicas, and the picker's prefix affinity served {:.0}% of \
         A's prompt tokens from cache against {:.0}% through /rr. ",
        sample_clause(gw.sample.as_ref()),
        b.ok,
        burst_of_b(limits, &bill_b),
        limit_of(limits, TENANT_B, |l| l.concurrency),
        b_rr.ok,
        b_rr.requests,
        ms(a_rr.ttft_p50_s),
        ms(a_rr.ttft_p99_s),
        ms(a.ttft_p50_s),
        ms(a.ttft_p99_s),
        ratio(a_rr.ttft_p50_s, a.ttft_p50_s),
        ratio(a_rr.ttft_p99_s, a.ttft_p99_s),
        b.ok,
        a.cache_hit_ratio * 100.0,
        a_rr.cache_hit_ratio * 100.0,
    );
    let place =
        |run: &RunFigures, i: usize| per_replica(run.placement.get(i).map_or(&[], Vec::as_slice));
    let _ = write!(
        s,
        "On which replica: the picker placed A's answered requests {} and B's {} over \
         replicas 0/1/2/3, by prefix cache, queue and load (it knows no tenant); round robin \
         put A's {} and B's {}, each replica in turn whatever it held. ",
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::load::ClassReport;
    use std::path::PathBuf;

    fn limit(tenant: &str, tpm: u64, concurrency: u64) -> TenantLimit {
        TenantLimit {
            tenant: tenant.into(),
            objective: None,
            model: "sim-model".into(),
            rpm: Some(100),
            tpm: Some(tpm),
            concurrency: Some(concurrency),
            max_completion_tokens_default: None,
        }
    }

    fn class(
        name: &str,
        requests: u64,
        ok: u64,
        p50: f64,
        p99: f64,
        rejected: &[(&str, u64)],
    ) -> ClassReport {
        ClassReport {
            name: name.into(),
            summary: Summary {
                requests,
                ok,
                ttft_p50_s: p50,
                ttft_p99_s: p99,
                cache_hit_ratio: 0.5,
                rejected_429: rejected.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                ..Summary::default()
            },
            records: Vec::new(),
        }
    }

    fn bill(admitted: u64, prompt: u64, completion: u64, pre: u64) -> Bill {
        let charged = prompt + completion;
        Bill {
            records: admitted,
            admitted,
            prompt_tokens: prompt,
            completion_tokens: completion,
            pre_debit: pre,
            refund: pre as i64 - charged as i64,
            charged,
            ..Bill::default()
        }
    }

    fn served(prompt: u64, completion: u64) -> Served {
        Served {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Served::default()
        }
    }

    fn runs(b_bill: Bill) -> (RunFigures, RunFigures) {
        let gw = RunFigures {
            label: "gateway".into(),
            route: Route::Gateway,
            classes: vec![
                class(TENANT_A, 10, 10, 0.010, 0.200, &[]),
                class(
                    TENANT_B,
                    50,
                    4,
                    0.2,
                    0.5,
                    &[
                        ("rejected-quota-tpm", 40),
                        ("rejected-quota-concurrency", 6),
                    ],
                ),
            ],
            placement: vec![vec![3, 3, 2, 2, 0], vec![1, 1, 1, 1, 0]],
            served: [
                (TENANT_A.to_string(), served(4000, 600)),
                (TENANT_B.to_string(), served(12000, 128)),
            ]
            .into_iter()
            .collect(),
            bills: [
                (TENANT_A.to_string(), bill(10, 4000, 600, 4500)),
                (TENANT_B.to_string(), b_bill),
            ]
            .into_iter()
            .collect(),
            billing_lines: 61,
            billing_log: PathBuf::from("/tmp/x.log"),
            sample: Some(Sample {
                status: 429,
                headers: vec![
                    (
                        "x-llm-d-request-dropped-reason".into(),
                        "rejected-quota-tpm".into(),
                    ),
                    ("retry-after".into(), "3".into()),
                ],
                error: None,
            }),
            wall_s: 10.0,
        };
        let rr = RunFigures {
            label: "/rr".into(),
            route: Route::RoundRobin,
            classes: vec![
                class(TENANT_A, 10, 10, 0.050, 1.0, &[]),
                class(TENANT_B, 50, 50, 1.0, 3.0, &[]),
            ],
            placement: vec![vec![3, 2, 3, 2, 0], vec![13, 12, 13, 12, 0]],
            served: BTreeMap::new(),
            bills: BTreeMap::new(),
            billing_lines: 0,
            billing_log: PathBuf::from("/tmp/y.log"),
            sample: None,
            wall_s: 20.0,
        };
        (gw, rr)
    }

    #[test]
    fn the_answer_is_built_from_the_figures() {
        let limits = [limit(TENANT_A, 30_000, 16), limit(TENANT_B, 10_000, 8)];
        let (gw, rr) = runs(bill(4, 12000, 128, 12400));
        let text = answer(&gw, &rr, &limits);
        for needle in [
            "10 of A's 10 requests, none refused",
            "against its tpm of 30000",
            "4 of B's 50",
            "refused 46 of B's",
            "0 for requests per minute, 40 for tokens per minute, 6 for concurrency",
            "refused with rejected-quota-tpm and told to retry after 3 s",
            // 10 000 tokens at 12 128 / 4 a request.
            "enough for about 3 of its prompts at once, 8 at a time",
            "50.0 ms at p50 and 1.00 s at p99, against 10.0 ms and 200.0 ms",
            "(5.0× and 5.0× lower)",
            "A's answered requests 3 / 3 / 2 / 2 and B's 1 / 1 / 1 / 1",
            "B's 13 / 12 / 13 / 12",
            "held for both tenants",
            "the tokens billed equal the tokens",
            "the request cap never bit",
        ] {
            assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
        }
        let table = billing_table(&gw);
        assert!(
            table.contains("(holds)") && !table.contains("BROKEN"),
            "{table}"
        );
    }

    #[test]
    fn a_broken_ledger_or_an_rpm_refusal_is_said() {
        let limits = [limit(TENANT_A, 30_000, 16), limit(TENANT_B, 10_000, 8)];
        let mut broken = bill(4, 12000, 128, 12400);
        broken.refund += 1;
        let (mut gw, rr) = runs(broken);
        gw.classes[1]
            .summary
            .rejected_429
            .insert("rejected-quota-rpm".into(), 2);
        gw.served.insert(TENANT_B.into(), served(11000, 128));
        let text = answer(&gw, &rr, &limits);
        assert!(text.contains("did NOT hold"), "{text}");
        assert!(text.contains("do NOT equal"), "{text}");
        assert!(!text.contains("the request cap never bit"), "{text}");
        assert!(text.contains("2 for requests per minute"), "{text}");
        let table = billing_table(&gw);
        assert!(table.contains("BROKEN") && table.contains("NO"), "{table}");
    }
}
