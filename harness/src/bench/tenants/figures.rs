//! The tenant demo's figures, computed from what the run left behind: the billing log's
//! records summed per tenant (with the conservation check), the replicas' own counters of
//! the tokens they served per fairness id (read from their `/metrics` pages), and where
//! each class's answered requests ran.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use scheduler_core::metrics::exposition::{lines, Line};
use serde_json::Value;

use crate::load::RequestRecord;

/// The key of records without a tenant (requests the auth stage refused).
pub const NO_TENANT: &str = "(no tenant)";

/// One tenant's billing records, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bill {
    /// Records (one per request that reached the auth stage).
    pub records: u64,
    /// Records of admitted requests (an outcome that is not a rejection).
    pub admitted: u64,
    /// Σ prompt tokens billed.
    pub prompt_tokens: u64,
    /// Σ completion tokens billed.
    pub completion_tokens: u64,
    /// Σ prompt tokens the engine served from its prefix cache.
    pub cached_tokens: u64,
    /// Σ tokens pre-debited at admission.
    pub pre_debit: u64,
    /// Σ tokens refunded at settlement (negative: under-estimates charged).
    pub refund: i64,
    /// Σ tokens charged.
    pub charged: u64,
    /// Records by outcome (`complete`, `rejected-quota-tpm`, …).
    pub outcomes: BTreeMap<String, u64>,
}

impl Bill {
    /// Σ pre-debit − Σ refund, which must equal [`Bill::charged`].
    pub fn settled(&self) -> i128 {
        i128::from(self.pre_debit) - i128::from(self.refund)
    }

    /// Whether Σ pre-debit − Σ refund = Σ charged = Σ prompt + Σ completion.
    pub fn conserved(&self) -> bool {
        let charged = i128::from(self.charged);
        self.settled() == charged
            && i128::from(self.prompt_tokens) + i128::from(self.completion_tokens) == charged
    }

    /// The count of records with outcome `outcome`.
    pub fn outcome(&self, outcome: &str) -> u64 {
        self.outcomes.get(outcome).copied().unwrap_or(0)
    }
}

/// Whether a billing outcome is a refusal (`rejected-…`): the request was never admitted.
pub fn is_rejection(outcome: &str) -> bool {
    outcome.starts_with("rejected-")
}

/// The billing records summed per tenant ([`NO_TENANT`] for records without one). A field
/// a record lacks counts as zero, so a malformed line shows up as a broken conservation
/// check rather than as a crash.
pub fn bills(records: &[Value]) -> BTreeMap<String, Bill> {
    let mut out: BTreeMap<String, Bill> = BTreeMap::new();
    for r in records {
        let tenant = r["tenant"].as_str().unwrap_or(NO_TENANT).to_string();
        let count = |key: &str| r[key].as_u64().unwrap_or(0);
        let outcome = r["outcome"].as_str().unwrap_or("unknown").to_string();
        let b = out.entry(tenant).or_default();
        b.records += 1;
        b.admitted += u64::from(!is_rejection(&outcome));
        b.prompt_tokens += count("prompt_tokens");
        b.completion_tokens += count("completion_tokens");
        b.cached_tokens += count("cached_tokens");
        b.pre_debit += count("pre_debit");
        b.refund += r["refund"].as_i64().unwrap_or(0);
        b.charged += count("charged");
        *b.outcomes.entry(outcome).or_insert(0) += 1;
    }
    out
}

/// What the replicas say they delivered for one fairness id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// `infergate_sim:served_prompt_tokens_total`.
    pub prompt_tokens: u64,
    /// `infergate_sim:served_completion_tokens_total`.
    pub completion_tokens: u64,
    /// `infergate_sim:requests_completed_total`.
    pub requests_completed: u64,
    /// `infergate_sim:requests_cut_off_total`.
    pub requests_cut_off: u64,
}

impl Served {
    /// `self − earlier`, field by field (counters only grow; a reset reads as zero).
    pub fn since(self, earlier: Served) -> Served {
        Served {
            prompt_tokens: self.prompt_tokens.saturating_sub(earlier.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(earlier.completion_tokens),
            requests_completed: self
                .requests_completed
                .saturating_sub(earlier.requests_completed),
            requests_cut_off: self
                .requests_cut_off
                .saturating_sub(earlier.requests_cut_off),
        }
    }
}

/// The simulator's counters of what its responses delivered, by fairness id.
pub const SERVED_PROMPT: &str = "infergate_sim:served_prompt_tokens_total";
/// See [`SERVED_PROMPT`].
pub const SERVED_COMPLETION: &str = "infergate_sim:served_completion_tokens_total";
/// See [`SERVED_PROMPT`].
pub const REQUESTS_COMPLETED: &str = "infergate_sim:requests_completed_total";
/// See [`SERVED_PROMPT`].
pub const REQUESTS_CUT_OFF: &str = "infergate_sim:requests_cut_off_total";

/// The served counters of one or more `/metrics` pages, summed per `fairness_id` label
/// (every model together; an empty id is a request that carried none).
pub fn served(pages: &[String]) -> BTreeMap<String, Served> {
    let mut out: BTreeMap<String, Served> = BTreeMap::new();
    for page in pages {
        for line in lines(page.as_bytes()) {
            let Line::Sample(s) = line else { continue };
            if !s.value.is_finite() || s.value < 0.0 {
                continue;
            }
            // Counters of whole tokens and requests, exported as integers.
            let v = s.value as u64;
            let id = s.label("fairness_id").unwrap_or_default().into_owned();
            let field: fn(&mut Served) -> &mut u64 = match s.name.as_ref() {
                SERVED_PROMPT => |x: &mut Served| &mut x.prompt_tokens,
                SERVED_COMPLETION => |x: &mut Served| &mut x.completion_tokens,
                REQUESTS_COMPLETED => |x: &mut Served| &mut x.requests_completed,
                REQUESTS_CUT_OFF => |x: &mut Served| &mut x.requests_cut_off,
                _ => continue,
            };
            *field(out.entry(id).or_default()) += v;
        }
    }
    out
}

/// `after − before` per fairness id.
pub fn served_since(
    after: &BTreeMap<String, Served>,
    before: &BTreeMap<String, Served>,
) -> BTreeMap<String, Served> {
    after
        .iter()
        .map(|(id, a)| {
            let b = before.get(id).copied().unwrap_or_default();
            (id.clone(), a.since(b))
        })
        .collect()
}

/// Answered requests (200, no error) per replica, in `replicas` order, from the replica
/// address the simulator puts on every answer; the last slot counts answers whose replica
/// is not one of them.
pub fn placement(records: &[RequestRecord], replicas: &[SocketAddr]) -> Vec<u64> {
    let mut out = vec![0; replicas.len() + 1];
    for r in records.iter().filter(|r| r.ok()) {
        let at = r
            .served_by
            .as_deref()
            .and_then(|s| replicas.iter().position(|a| a.to_string() == s))
            .unwrap_or(replicas.len());
        if let Some(slot) = out.get_mut(at) {
            *slot += 1;
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sim::metrics::render_served;
    use crate::sim::{ServedKey, ServedTotals};
    use serde_json::json;

    fn record(tenant: Option<&str>, outcome: &str, p: u64, c: u64, pre: u64) -> Value {
        let charged = if is_rejection(outcome) { 0 } else { p + c };
        json!({
            "tenant": tenant,
            "outcome": outcome,
            "prompt_tokens": p,
            "completion_tokens": c,
            "cached_tokens": p / 2,
            "pre_debit": pre,
            "refund": pre as i64 - charged as i64,
            "charged": charged,
        })
    }

    #[test]
    fn bills_sum_per_tenant_and_conserve() {
        let records = vec![
            record(Some("a"), "complete", 100, 20, 200),
            // An under-estimate: the refund is negative.
            record(Some("a"), "complete", 300, 64, 330),
            record(Some("b"), "complete", 3000, 32, 3100),
            record(Some("b"), "rejected-quota-tpm", 0, 0, 0),
            record(Some("b"), "rejected-quota-concurrency", 0, 0, 0),
            record(None, "rejected-unauthenticated", 0, 0, 0),
        ];
        let b = bills(&records);
        assert_eq!(b.len(), 3);
        let a = &b["a"];
        assert_eq!((a.records, a.admitted), (2, 2));
        assert_eq!((a.prompt_tokens, a.completion_tokens), (400, 84));
        assert_eq!((a.pre_debit, a.refund, a.charged), (530, 46, 484));
        assert!(a.conserved());
        let tb = &b["b"];
        assert_eq!((tb.records, tb.admitted, tb.charged), (3, 1, 3032));
        assert_eq!(tb.outcome("rejected-quota-tpm"), 1);
        assert_eq!(tb.outcome("rejected-quota-rpm"), 0);
        assert!(tb.conserved());
        assert_eq!(b[NO_TENANT].records, 1);
    }

    #[test]
    fn a_broken_record_breaks_conservation() {
        let mut r = record(Some("a"), "complete", 100, 20, 200);
        r["refund"] = json!(70);
        assert!(!bills(&[r.clone()])["a"].conserved(), "200 - 70 != 120");
        r["refund"] = json!(80);
        r["completion_tokens"] = json!(21);
        assert!(
            !bills(&[r])["a"].conserved(),
            "charged 120 != 100 + 21 billed"
        );
        let mut r = record(Some("a"), "complete", 100, 20, 200);
        r.as_object_mut().unwrap().remove("charged");
        assert!(!bills(&[r])["a"].conserved(), "a missing field counts 0");
    }

    #[test]
    fn served_reads_the_simulators_own_page() {
        let totals = |p, c, done| ServedTotals {
            prompt_tokens: p,
            completion_tokens: c,
            requests_completed: done,
            requests_cut_off: 1,
            cut_off_completion_tokens: 3,
        };
        let key = |id: &str, model: &str| ServedKey {
            fairness_id: id.into(),
            model: model.into(),
        };
        let mut page0 = String::from("vllm:num_requests_waiting{model_name=\"m\"} 7\n");
        render_served(
            &mut page0,
            &[
                (key("tenant-a", "m"), totals(100, 10, 2)),
                (key("tenant-a", "other"), totals(5, 1, 1)),
                (key("tenant-b", "m"), totals(3000, 32, 1)),
            ],
        );
        let mut page1 = String::new();
        render_served(&mut page1, &[(key("tenant-a", "m"), totals(50, 5, 1))]);
        let s = served(&[page0, page1, "garbage {\n".into()]);
        assert_eq!(
            s["tenant-a"],
            Served {
                prompt_tokens: 155,
                completion_tokens: 16,
                requests_completed: 4,
                requests_cut_off: 3,
            }
        );
        assert_eq!(s["tenant-b"].prompt_tokens, 3000);
        assert!(!s.contains_key(""), "the vLLM gauge has no fairness id");

        let before = served(&{
            let mut p = String::new();
            render_served(&mut p, &[(key("tenant-a", "m"), totals(40, 4, 1))]);
            vec![p]
        });
        let d = served_since(&s, &before);
        assert_eq!(d["tenant-a"].prompt_tokens, 115);
        assert_eq!(d["tenant-a"].requests_cut_off, 2);
        assert_eq!(d["tenant-b"], s["tenant-b"]);
    }

    #[test]
    fn placement_counts_answers_per_replica() {
        let addrs: Vec<SocketAddr> = ["127.0.0.1:1", "127.0.0.1:2"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let rec = |status: u16, by: Option<&str>| RequestRecord {
            status,
            served_by: by.map(str::to_string),
            ..RequestRecord::default()
        };
        let records = [
            rec(200, Some("127.0.0.1:2")),
            rec(200, Some("127.0.0.1:2")),
            rec(200, Some("127.0.0.1:1")),
            rec(429, None),
            rec(200, Some("10.0.0.1:9")),
        ];
        assert_eq!(placement(&records, &addrs), vec![1, 2, 1]);
    }
}
