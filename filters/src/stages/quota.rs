//! The quota stage: pre-debit the tenant × model buckets, or refuse the request with 429
//! before any engine sees it.
//!
//! It runs after the body router, whose parse gives the model (as sent, before any
//! rewrite), the prompt estimate, the requested output limit and how many sequences the
//! engine may generate. The bucket set is the tenant's limit entry for that model, else its
//! `"*"` entry; a tenant with neither has no quota for the model: 403. The pre-debit is the
//! prompt estimate plus the output sequences (max(`n`, `best_of`, 1) × the prompts of a
//! completions batch) times the requested `max_completion_tokens` / `max_tokens` (or the
//! entry's `maxCompletionTokensDefault`), the output part capped at the entry's TPM. Buckets are checked RPM, then TPM, then
//! concurrency; a refusal names its bucket in `x-llm-d-request-dropped-reason`
//! (`rejected-quota-rpm` / `-tpm` / `-concurrency`) with `retry-after` and OpenAI's
//! `x-ratelimit-*` headers, which an admitted response also carries.
//!
//! Requests the router did not route (non-inference paths such as `/v1/files`; the
//! router answers `/v1/models` itself) pass without a debit. Settlement is
//! [`super::tenancy::Tenancy::finish`]'s.
//!
//! With global quotas (see [`super::tenancy`]) the RPM and TPM buckets are the global
//! rate-limit service's: this stage checks only the local concurrency, then hands the
//! bucket set and the pre-debit to Envoy's `ratelimit` filter in two request headers; the
//! `x-ratelimit-*` headers come from the service.

use std::sync::Arc;

use scheduler_core::quota::{pre_debit, Limits, QuotaReason};

use crate::billing::REJECTED_MODEL_NOT_ALLOWED;
use crate::host::{
    Clock, EditResponseHeaders, LocalReply, RequestHeaders, Stats, StreamState, UsageRecordSink,
};
use crate::pipeline::{reply, RequestContext, Stage};
use crate::reply::Reply;
use crate::FilterStatus;

use super::tenancy::{
    tenant_request, Accounting, Admission, End, Tenancy, QUOTA_BUCKET_HEADER, QUOTA_TOKENS_HEADER,
};

/// The quota stage; shares the [`Tenancy`].
#[derive(Clone, Debug)]
pub struct QuotaStage {
    tenancy: Arc<Tenancy>,
}

impl QuotaStage {
    /// A stage admitting against `tenancy`'s buckets.
    pub fn new(tenancy: Arc<Tenancy>) -> QuotaStage {
        QuotaStage { tenancy }
    }

    fn reject<H>(&self, cx: &mut RequestContext, host: &mut H, reason: &str, status: u16)
    where
        H: RequestHeaders + Clock + Stats + UsageRecordSink + StreamState + ?Sized,
    {
        if let Some(acc) = cx.get_mut::<Accounting>() {
            acc.rejected = Some(reason.to_owned());
            acc.status = Some(status);
        }
        self.tenancy.finish(cx, host, End::Rejected);
    }
}

fn reason_index(reason: QuotaReason) -> usize {
    match reason {
        QuotaReason::Rpm => 0,
        QuotaReason::Tpm => 1,
        QuotaReason::Concurrency => 2,
    }
}

impl<H> Stage<H> for QuotaStage
where
    H: RequestHeaders
        + EditResponseHeaders
        + LocalReply
        + Clock
        + Stats
        + UsageRecordSink
        + StreamState
        + ?Sized,
{
    fn name(&self) -> &'static str {
        "quota"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _end_of_stream: bool,
    ) -> FilterStatus {
        // The router before this stage is done with the body: its parse is final.
        let Some((tenant, routed)) = tenant_request(cx) else {
            return FilterStatus::Continue;
        };
        let tenants = self.tenancy.tenants();
        let Some((index, limit)) = tenants.limit_for(tenant, &routed.model) else {
            self.tenancy.count_model_not_allowed(host);
            self.reject(cx, host, REJECTED_MODEL_NOT_ALLOWED, 403);
            return reply(host, &Reply::model_not_allowed(&routed.model));
        };
        let global = tenants.global_quotas();
        let limits = if global {
            Limits {
                rpm: None,
                tpm: None,
                ..limit.limits
            }
        } else {
            limit.limits
        };
        let debit = pre_debit(
            routed.prompt_tokens,
            routed.max_output_tokens,
            limit.max_completion_tokens_default.unwrap_or(0),
            routed.output_sequences,
            limit.limits.tpm,
        );
        let key = limit.bucket_key.clone();
        let now = host.now();
        // Globally, the local buckets hold only the concurrency: they are charged nothing.
        let local_debit = if global { 0 } else { debit };
        match self.tenancy.store().admit(&key, &limits, local_debit, now) {
            Ok(info) => {
                if global {
                    host.set_request_header(QUOTA_BUCKET_HEADER, &key);
                    host.set_request_header(QUOTA_TOKENS_HEADER, &debit.to_string());
                }
                cx.insert(Admission {
                    bucket: (tenant, index),
                    key,
                    limits,
                    pre_debit: debit,
                    info,
                    global,
                });
                FilterStatus::Continue
            }
            Err(rejection) => {
                self.tenancy
                    .count_reject(host, (tenant, index), reason_index(rejection.reason));
                let reason = rejection.reason.dropped_reason();
                self.reject(cx, host, reason, 429);
                let (kind, what) = match rejection.reason {
                    QuotaReason::Rpm => ("requests", "requests per minute"),
                    QuotaReason::Tpm => ("tokens", "tokens per minute"),
                    QuotaReason::Concurrency => ("requests", "concurrent requests"),
                };
                let message = format!(
                    "Rate limit reached for {} on {what}: retry after {} s.",
                    routed.model, rejection.retry_after_s
                );
                let mut headers = vec![(
                    "retry-after".to_owned(),
                    rejection.retry_after_s.to_string(),
                )];
                headers.extend(
                    rejection
                        .info
                        .headers()
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v)),
                );
                reply(host, &Reply::rate_limited(reason, kind, &message, headers))
            }
        }
    }

    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, _end_of_stream: bool) {
        let Some(admission) = cx.get::<Admission>() else {
            return;
        };
        for (name, value) in admission.info.headers() {
            host.set_response_header(name, &value);
        }
    }
}
