//! Tenancy: what the auth, quota and usage stages share, and the one step that ends a
//! tenant's request: settle its quota, count its tokens and write its billing record.
//!
//! With tenants configured (the router config's `tenantQuotas` list), the router role's
//! builder ([`super::build`]) assembles `auth → priority-band → route → quota → usage`:
//!
//! - [`super::AuthStage`] strips client-sent gateway headers, finds the tenant (API key or
//!   a JWT Envoy verified) and injects its fairness id and objective;
//! - [`super::priority::PriorityBandStage`] names the tenant's priority on the response;
//! - the body router parses the body ([`crate::router::RoutedRequest`]);
//! - [`super::QuotaStage`] pre-debits the tenant × model buckets, or answers 429;
//! - [`super::UsageStage`] forces usage reporting on streamed requests and reads the usage
//!   from every response chunk as it passes.
//!
//! The end ([`Tenancy::finish`]) runs exactly once per request that reached the auth stage:
//! when the response completes, when a stage rejects it, or at the stream's end, whichever
//! comes first. Response-side callbacks run in reverse stage order, so when the auth stage
//! (the first) ends a request, the usage stage has already seen the last chunk.
//!
//! **Global quotas** (router config `globalQuotas: true`, for several gateway replicas):
//! the per-minute limits (RPM, TPM) are kept by a rate-limit service that every replica's
//! Envoy asks through its `ratelimit` HTTP filter, placed after the router filter. The
//! quota stage then only pre-computes: it names the bucket set in
//! [`QUOTA_BUCKET_HEADER`] and the pre-debit in [`QUOTA_TOKENS_HEADER`], which the filter
//! sends as the descriptor and its `hits_addend`; concurrency stays in this process. The
//! service's refusal is its own 429 (the same reasons and body), which this pipeline sees
//! on the response and records as a rejection without a debit; only Envoy's local reply
//! counts as one, and a response an upstream sent is billed and settled whatever headers it
//! carries. At the end, the tokens actually used go into the stream state
//! [`QUOTA_ACTUAL_STATE`], which the filter's stream-done action (`apply_on_stream_done`)
//! sends to settle the pre-debit.

use std::collections::HashMap;
use std::sync::Arc;

use scheduler_core::quota::{Limits, RateLimitInfo};
use scheduler_core::types::Millis;
use scheduler_core::usage::{UsageReport, UsageSource, UsageTracker};
use serde_json::Value;

use crate::billing::{reason_of_status, BillingRecord, Outcome, DESTINATIONS_STATE};
use crate::flow::{read_state_number, service_of, EVICTED_STATE, QUEUED_MS_STATE, SERVICE_STATE};
use crate::headers::DESTINATION_ENDPOINT;
use crate::host::{Clock, RequestHeaders, Stats, StreamState, UsageRecordSink};
use crate::pipeline::{EndCause, RequestContext};
use crate::quotas::QuotaStore;
use crate::router::RoutedRequest;
use crate::stats::{StatKey, StatKind};
use crate::tenants::{SettleOn, TenantId, Tenants};

use super::route::RouterReplied;

/// The router config key holding the `TenantQuota` (and `InferenceObjective`) objects.
pub const CONFIG_KEY: &str = "tenantQuotas";

/// The router config key that moves the per-minute limits to the global rate-limit
/// service (a boolean; default false: the in-process buckets).
pub const GLOBAL_QUOTAS_KEY: &str = "globalQuotas";

/// Request header naming a global-quota request's bucket set (`tenant/model`), the
/// rate-limit descriptor's value. Client-sent `x-gateway-*` headers never reach it: the
/// auth stage removes them first.
pub const QUOTA_BUCKET_HEADER: &str = "x-gateway-quota-bucket";

/// Request header holding a global-quota request's pre-debit (tokens), the rate-limit
/// descriptor's `hits_addend`.
pub const QUOTA_TOKENS_HEADER: &str = "x-gateway-quota-tokens";

/// Stream state holding the tokens a global-quota request actually used (decimal), written
/// when it ends: the settlement's `hits_addend` (Envoy filter state of this name; proxy-wasm
/// prefixes it with `wasm.`).
pub const QUOTA_ACTUAL_STATE: &str = "infergate.quota.actual";

/// Take the tenancy objects out of a router config; `None` when none are configured (the
/// gateway then runs without tenants, as before). [`GLOBAL_QUOTAS_KEY`] goes with them.
pub fn take_tenants(config: &mut Value) -> Result<Option<Tenants>, String> {
    let global = match config
        .as_object_mut()
        .and_then(|m| m.remove(GLOBAL_QUOTAS_KEY))
    {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(format!(
                "`{GLOBAL_QUOTAS_KEY}` must be a boolean, not {other}"
            ))
        }
    };
    let Some(value) = config.as_object_mut().and_then(|m| m.remove(CONFIG_KEY)) else {
        if global {
            return Err(format!("`{GLOBAL_QUOTAS_KEY}` needs `{CONFIG_KEY}`"));
        }
        return Ok(None);
    };
    let Value::Array(objects) = value else {
        return Err(format!(
            "`{CONFIG_KEY}` must be a list of TenantQuota / InferenceObjective objects"
        ));
    };
    let mut tenants = Tenants::from_objects(&objects).map_err(|e| e.to_string())?;
    tenants.set_global_quotas(global);
    Ok((!tenants.is_empty()).then_some(tenants))
}

/// Stat keys of one tenant × limit bucket set, built at configuration time.
#[derive(Clone, Debug)]
struct BucketStats {
    prompt: StatKey,
    completion: StatKey,
    cached: StatKey,
    rejects: [StatKey; 3],
}

/// The tenancy stats (families in [`crate::stats::FAMILIES`]).
#[derive(Clone, Debug)]
struct TenancyStats {
    auth_api_key: StatKey,
    auth_jwt: StatKey,
    auth_missing: StatKey,
    auth_unknown: StatKey,
    model_not_allowed: StatKey,
    records: StatKey,
    record_errors: StatKey,
    buckets: HashMap<(TenantId, usize), BucketStats>,
}

impl TenancyStats {
    fn new(tenants: &Tenants) -> TenancyStats {
        let auth = |outcome| StatKey::new("infergate.auth.requests", &[("outcome", outcome)]);
        let mut buckets = HashMap::new();
        for (id, tenant) in tenants.iter() {
            let priority = tenant.priority.to_string();
            for (index, limit) in tenant.limits.iter().enumerate() {
                let tags = [
                    ("tenant", tenant.name.as_str()),
                    ("model", limit.model.as_str()),
                    ("priority", priority.as_str()),
                ];
                let reject = |reason| {
                    StatKey::new(
                        "infergate.quota.rejects",
                        &[
                            ("tenant", tenant.name.as_str()),
                            ("model", limit.model.as_str()),
                            ("reason", reason),
                        ],
                    )
                };
                buckets.insert(
                    (id, index),
                    BucketStats {
                        prompt: StatKey::new("infergate.usage.prompt_tokens", &tags),
                        completion: StatKey::new("infergate.usage.completion_tokens", &tags),
                        cached: StatKey::new("infergate.usage.cached_tokens", &tags),
                        rejects: [
                            reject("rejected-quota-rpm"),
                            reject("rejected-quota-tpm"),
                            reject("rejected-quota-concurrency"),
                        ],
                    },
                );
            }
        }
        TenancyStats {
            auth_api_key: auth("api_key"),
            auth_jwt: auth("jwt"),
            auth_missing: auth("rejected_missing"),
            auth_unknown: auth("rejected_unknown"),
            model_not_allowed: auth("rejected_model_not_allowed"),
            records: StatKey::new("infergate.usage.records", &[]),
            record_errors: StatKey::new("infergate.usage.record_errors", &[]),
            buckets,
        }
    }
}

/// What the tenancy stages share: the compiled tenants, the process's quota buckets, and
/// the stat keys.
pub struct Tenancy {
    tenants: Tenants,
    store: Arc<dyn QuotaStore>,
    stats: TenancyStats,
}

impl core::fmt::Debug for Tenancy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tenancy")
            .field("tenants", &self.tenants.tenant_names())
            .finish()
    }
}

/// How the auth stage found the tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// `Authorization: Bearer <key>`, matched by its sha256.
    ApiKey,
    /// A JWT verified by Envoy's `jwt_authn`.
    Jwt,
}

/// Why the auth stage refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// No credential at all.
    Missing,
    /// A credential no tenant holds.
    Unknown,
}

/// One tenant's request, from the auth stage to its end (in the request's context).
#[derive(Clone, Debug)]
pub struct Accounting {
    /// When the request reached the auth stage.
    pub started: Millis,
    /// The tenant, once authenticated.
    pub tenant: Option<TenantId>,
    /// `x-request-id`, for the record.
    pub request_id: Option<String>,
    /// The reason of a rejection a tenancy stage answered.
    pub rejected: Option<String>,
    /// The response status, once response headers passed.
    pub status: Option<u16>,
    /// `x-llm-d-request-dropped-reason` of a local reply (a rejection by a later filter);
    /// never read from a response an upstream sent.
    pub dropped_reason: Option<String>,
    /// The upstream host (`ip:port`) the response came from; `None` for a local reply.
    pub served: Option<String>,
    /// When the first response byte passed.
    pub first_byte: Option<Millis>,
    finished: bool,
}

impl Accounting {
    /// A request arriving at `started`.
    pub fn new(started: Millis, request_id: Option<String>) -> Accounting {
        Accounting {
            started,
            tenant: None,
            request_id,
            rejected: None,
            status: None,
            dropped_reason: None,
            served: None,
            first_byte: None,
            finished: false,
        }
    }
}

/// A request the quota stage admitted: what it pre-debited where (in the context).
#[derive(Clone, Debug)]
pub struct Admission {
    /// The bucket set: tenant and index of its limit entry.
    pub bucket: (TenantId, usize),
    /// The bucket set's store key.
    pub key: String,
    /// The limits admitted against (settled against the same, whatever a reload changes).
    pub limits: Limits,
    /// Tokens pre-debited.
    pub pre_debit: u64,
    /// The rate-limit values at admission, for the response's `x-ratelimit-*` headers.
    pub info: RateLimitInfo,
    /// The per-minute limits are the global rate-limit service's: `limits` holds only the
    /// local concurrency, and the service may still refuse the request after this stage.
    pub global: bool,
}

/// The usage stage's reading of the response (in the context).
#[derive(Debug)]
pub struct Metering {
    /// The tracker fed with every response chunk.
    pub tracker: UsageTracker,
    /// The bytes replacing a chunk, reused from chunk to chunk.
    pub out: Vec<u8>,
}

/// The tenant of a request the router routed, with what the router learnt of it; `None`
/// for a request without a tenant or that the router did not route (a non-inference path).
/// The stages after the router read it once the router is done with the body.
pub fn tenant_request(cx: &RequestContext) -> Option<(TenantId, RoutedRequest)> {
    let tenant = cx.get::<Accounting>()?.tenant?;
    let routed = cx.get::<RoutedRequest>()?.clone();
    Some((tenant, routed))
}

/// How a request's end was observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The whole response passed.
    ResponseComplete,
    /// A tenancy stage rejected the request (the reason is in [`Accounting::rejected`]).
    Rejected,
    /// The pipeline ended with this cause.
    Ended(EndCause),
}

/// Tokens billed for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Billed {
    prompt: u64,
    completion: u64,
    cached: u64,
    source: &'static str,
}

impl Tenancy {
    /// Tenancy over `tenants`, with buckets in `store`.
    pub fn new(tenants: Tenants, store: Arc<dyn QuotaStore>) -> Arc<Tenancy> {
        let stats = TenancyStats::new(&tenants);
        Arc::new(Tenancy {
            tenants,
            store,
            stats,
        })
    }

    /// The compiled tenants.
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// The process's quota buckets.
    pub fn store(&self) -> &dyn QuotaStore {
        self.store.as_ref()
    }

    /// Every stat key the tenancy stages emit with known labels, so a host can define
    /// them up front.
    pub fn stat_keys(&self) -> Vec<(StatKind, &StatKey)> {
        let s = &self.stats;
        let mut keys: Vec<(StatKind, &StatKey)> = [
            &s.auth_api_key,
            &s.auth_jwt,
            &s.auth_missing,
            &s.auth_unknown,
            &s.model_not_allowed,
            &s.records,
            &s.record_errors,
        ]
        .into_iter()
        .map(|k| (StatKind::Counter, k))
        .collect();
        for b in s.buckets.values() {
            for k in [&b.prompt, &b.completion, &b.cached] {
                keys.push((StatKind::Counter, k));
            }
            for k in &b.rejects {
                keys.push((StatKind::Counter, k));
            }
        }
        keys
    }

    /// Count an authentication outcome.
    pub(crate) fn count_auth<H: Stats + ?Sized>(
        &self,
        host: &mut H,
        outcome: Result<AuthMethod, AuthRefusal>,
    ) {
        let key = match outcome {
            Ok(AuthMethod::ApiKey) => &self.stats.auth_api_key,
            Ok(AuthMethod::Jwt) => &self.stats.auth_jwt,
            Err(AuthRefusal::Missing) => &self.stats.auth_missing,
            Err(AuthRefusal::Unknown) => &self.stats.auth_unknown,
        };
        host.counter_add(key, 1);
    }

    /// Count a request for a model outside the tenant's plan.
    pub(crate) fn count_model_not_allowed<H: Stats + ?Sized>(&self, host: &mut H) {
        host.counter_add(&self.stats.model_not_allowed, 1);
    }

    /// Count a quota rejection of `bucket` (`reason_index`: rpm, tpm, concurrency).
    pub(crate) fn count_reject<H: Stats + ?Sized>(
        &self,
        host: &mut H,
        bucket: (TenantId, usize),
        reason_index: usize,
    ) {
        if let Some(key) = self
            .stats
            .buckets
            .get(&bucket)
            .and_then(|b| b.rejects.get(reason_index))
        {
            host.counter_add(key, 1);
        }
    }

    /// End the request once: settle its quota, count its tokens and write its record.
    /// Later calls do nothing, so every end path may call it.
    pub fn finish<H>(&self, cx: &mut RequestContext, host: &mut H, end: End)
    where
        H: RequestHeaders + Clock + Stats + UsageRecordSink + StreamState + ?Sized,
    {
        let now = host.now();
        let Some(acc) = cx.get_mut::<Accounting>() else {
            return;
        };
        if acc.finished {
            return;
        }
        acc.finished = true;
        let acc = acc.clone();
        let routed = cx.get::<RoutedRequest>().cloned();
        let router_replied = cx.get::<RouterReplied>().map(|r| r.0);
        // The picker (this pipeline's, or a filter after this one) leaves it when it
        // evicted the request.
        let evicted = host.stream_state(EVICTED_STATE).is_some();
        let outcome = if evicted {
            Outcome::Evicted
        } else {
            outcome(&acc, router_replied, end)
        };
        let report = cx.get::<Metering>().map(|m| m.tracker.report());
        let admission = cx.get::<Admission>().cloned();
        let tenant = acc.tenant.and_then(|id| self.tenants.tenant(id));

        let mut record = BillingRecord {
            request_id: acc.request_id.clone(),
            tenant: tenant.map(|t| t.name.clone()),
            fairness_id: tenant.and_then(|t| t.fairness_id.clone()),
            objective: tenant.and_then(|t| t.objective.clone()),
            priority: tenant.map_or(0, |t| t.priority),
            model: routed.as_ref().map(|r| r.model.clone()),
            target_model: routed.as_ref().map(|r| r.target_model.clone()),
            pool: routed.as_ref().map(|r| r.base_model.clone()),
            endpoint: acc.served.clone(),
            destinations: cx
                .get::<super::pick::Picking>()
                .and_then(|p| p.destinations().map(str::to_owned))
                .or_else(|| {
                    host.stream_state(DESTINATIONS_STATE)
                        .and_then(|list| String::from_utf8(list).ok())
                })
                .or_else(|| host.request_header(DESTINATION_ENDPOINT)),
            tokens_source: UsageSource::None.as_str(),
            outcome: outcome.as_str().to_owned(),
            status: acc.status.or(router_replied),
            ttft_ms: acc.first_byte.map(|t| t.0.saturating_sub(acc.started.0)),
            duration_ms: now.0.saturating_sub(acc.started.0),
            // The picker filter (later in the chain) writes it when the request waited.
            queued_ms: read_state_number(&*host, QUEUED_MS_STATE),
            ..BillingRecord::default()
        };

        // The global rate-limit service refused a request this stage had admitted: nothing
        // was debited there; only the local concurrency slot is given back. Its refusal is
        // Envoy's local reply, a 429: an upstream's response is settled whatever it says.
        let refused_globally = admission.as_ref().is_some_and(|a| a.global)
            && acc.served.is_none()
            && acc.status == Some(429)
            && acc
                .dropped_reason
                .as_deref()
                .is_some_and(|r| GLOBAL_REJECTIONS.contains(&r));
        if let (true, Some(admission)) = (refused_globally, &admission) {
            self.store
                .settle(&admission.key, &admission.limits, 0, 0, now);
            if let Some(index) = GLOBAL_REJECTIONS
                .iter()
                .position(|r| acc.dropped_reason.as_deref() == Some(*r))
            {
                self.count_reject(host, admission.bucket, index);
            }
        }
        let admission = admission.filter(|_| !refused_globally);
        if let (Some(admission), Some(tenant)) = (admission, tenant) {
            let estimate = routed.as_ref().map_or(0, |r| r.prompt_tokens);
            let billed = billed(
                report,
                tenant.accounting.settle_on,
                estimate,
                admission.pre_debit,
                acc.status,
            );
            let actual = billed.prompt.saturating_add(billed.completion);
            self.store.settle(
                &admission.key,
                &admission.limits,
                admission.pre_debit,
                actual,
                now,
            );
            record.prompt_tokens = billed.prompt;
            record.completion_tokens = billed.completion;
            record.cached_tokens = billed.cached;
            record.pre_debit = admission.pre_debit;
            record.charged = actual;
            record.refund = i64::try_from(admission.pre_debit)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(actual).unwrap_or(i64::MAX));
            record.tokens_source = billed.source;
            if admission.global {
                // The settlement the rate-limit filter sends when the stream is done.
                let _ = host.set_stream_state(QUOTA_ACTUAL_STATE, actual.to_string().as_bytes());
            }
            // For flow control's weighted policy, in the picker filter (best effort).
            let service = service_of(billed.prompt, billed.completion);
            let _ = host.set_stream_state(SERVICE_STATE, service.to_string().as_bytes());
            if let Some(stats) = self.stats.buckets.get(&admission.bucket) {
                host.counter_add(&stats.prompt, billed.prompt);
                host.counter_add(&stats.completion, billed.completion);
                host.counter_add(&stats.cached, billed.cached);
            }
        }

        match host.write_usage_record(&record.to_json()) {
            Ok(()) => host.counter_add(&self.stats.records, 1),
            Err(_) => host.counter_add(&self.stats.record_errors, 1),
        }
    }
}

/// The dropped reasons of the global rate-limit service's refusals, in the order of
/// [`Tenancy::count_reject`]'s reason index (rpm, tpm).
const GLOBAL_REJECTIONS: [&str; 2] = ["rejected-quota-rpm", "rejected-quota-tpm"];

/// How the request ended, from what the stages saw.
fn outcome(acc: &Accounting, router_replied: Option<u16>, end: End) -> Outcome {
    if let Some(reason) = &acc.rejected {
        return Outcome::Rejected(reason.clone());
    }
    if let Some(status) = router_replied {
        return Outcome::Rejected(reason_of_status(status).to_owned());
    }
    if let Some(reason) = &acc.dropped_reason {
        return Outcome::Rejected(reason.clone());
    }
    match end {
        End::Rejected => Outcome::Rejected(reason_of_status(acc.status.unwrap_or(500)).to_owned()),
        End::Ended(EndCause::Reset) => Outcome::ClientDisconnect,
        End::Ended(EndCause::LocalReply) => {
            Outcome::Rejected(reason_of_status(acc.status.unwrap_or(500)).to_owned())
        }
        End::ResponseComplete | End::Ended(EndCause::Completed) => {
            if acc.status.is_some_and(|s| s >= 500) {
                Outcome::UpstreamError
            } else {
                Outcome::Complete
            }
        }
    }
}

/// The tokens to bill from the usage the response showed, under the tenant's rules:
/// engine-reported usage first (final, else the last continuous one: what was generated up
/// to the cut); without any, `usage_or_chunk_count` bills the prompt estimate plus one token
/// per content chunk, and `usage` bills the pre-debit. A response that never started
/// (upstream failure before any byte) bills nothing.
fn billed(
    report: Option<UsageReport>,
    settle_on: SettleOn,
    prompt_estimate: u64,
    pre_debit: u64,
    status: Option<u16>,
) -> Billed {
    let Some(report) = report else {
        return Billed {
            source: UsageSource::None.as_str(),
            ..Billed::default()
        };
    };
    match report.source {
        UsageSource::Usage | UsageSource::ContinuousUsage => Billed {
            prompt: report.usage.prompt_tokens,
            completion: report.usage.completion_tokens,
            cached: report.usage.cached_tokens,
            source: report.source.as_str(),
        },
        UsageSource::ChunkCount | UsageSource::None => {
            let served = status.is_some_and(|s| (200..300).contains(&s));
            if !served {
                return Billed {
                    source: UsageSource::None.as_str(),
                    ..Billed::default()
                };
            }
            match settle_on {
                SettleOn::UsageOrChunkCount => Billed {
                    prompt: prompt_estimate,
                    completion: report.content_chunks,
                    cached: 0,
                    source: if report.source == UsageSource::ChunkCount {
                        UsageSource::ChunkCount.as_str()
                    } else {
                        UsageSource::None.as_str()
                    },
                },
                SettleOn::Usage => Billed {
                    prompt: pre_debit,
                    completion: 0,
                    cached: 0,
                    source: UsageSource::None.as_str(),
                },
            }
        }
    }
}
