//! The gRPC service `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, over a
//! limitador [`AsyncRateLimiter`] whose counters live in Redis (shared by every gateway
//! replica).
//!
//! What the gateway's Envoy sends (its `ratelimit` filter's actions build the descriptors):
//!
//! - **Admission**, when the request is complete and its pre-debit known: one descriptor
//!   per counter of the bucket set, `{infergate_bucket, infergate_limit: rpm}` adding 1 and
//!   `{infergate_bucket, infergate_limit: tpm}` adding the pre-debit (`hits_addend`). The
//!   RPM counter is checked first, then the pre-debit is *reserved* on the TPM counter
//!   (limitador's reservations: a hold that counts against the limit until it is
//!   committed or expires), then the request is counted on the RPM counter. Over a limit:
//!   `OVER_LIMIT` with the gateway's own 429 (OpenAI's rate-limit error JSON,
//!   `x-llm-d-request-dropped-reason: rejected-quota-rpm` / `-tpm`, `retry-after`, the
//!   `x-ratelimit-*` headers), which Envoy's filter sends as it is. Admitted: `OK` with the
//!   `x-ratelimit-*` headers for the response and the reservation id in the filter's
//!   dynamic metadata (`envoy.filters.http.ratelimit`, key [`RESERVATION_METADATA`]).
//! - **Settlement**, when the stream is done (`apply_on_stream_done`): the TPM descriptor
//!   again, with `infergate_reservation` from that metadata and the tokens the request
//!   actually used as `hits_addend`: the reservation is committed, i.e. the actual usage
//!   is counted and the hold released, so a request that used less than its pre-debit
//!   gives the difference back and one that used more is charged the excess.
//!
//! Descriptors of unknown buckets or without the entries above are not limited. Counters
//! are fixed windows of one minute, each starting at its first hit (limitador's Redis
//! semantics). A Redis failure is a gRPC error; Envoy's filter then applies its failure
//! mode (the gateway's configs: let the request through, uncounted). No reservation id
//! reaches Envoy then, so an admission that fails after its pre-debit was held releases
//! the hold before it answers.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use infergate_filters::reply::Reply;
use limitador::counter::Counter as LimitadorCounter;
use limitador::limit::{Context, Namespace};
use limitador::reservation::ReservationId;
use limitador::AsyncRateLimiter;
use scheduler_core::quota::format_reset;
use tonic::{Request, Response, Status};

use crate::limits::{Counter, LimitTable, BUCKET_KEY, LIMIT_KEY, RESERVATION_KEY};

/// The key of the reservation id in the filter's dynamic metadata.
pub const RESERVATION_METADATA: &str = "reservation";
/// The reservation value of an admission that held nothing (a pre-debit of 0): its
/// settlement still counts the actual usage.
pub const NO_RESERVATION: &str = "-";

/// The service: the limiter, and the bucket sets it knows (to name a limit in a reply).
pub struct QuotaService {
    limiter: AsyncRateLimiter,
    table: LimitTable,
    domain: Namespace,
    reservation_ttl: Duration,
    debug: bool,
}

impl core::fmt::Debug for QuotaService {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QuotaService")
            .field("domain", &self.domain)
            .field("buckets", &self.table.len())
            .finish()
    }
}

/// One descriptor the service acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The bucket set (`tenant/model`).
    pub bucket: String,
    /// The counter.
    pub counter: Counter,
    /// What it adds (requests or tokens).
    pub amount: u64,
    /// The reservation a settlement commits; `None` for an admission.
    pub reservation: Option<String>,
}

/// The descriptors of `request` the service acts on, in order: each needs a bucket and a
/// counter entry. A descriptor's own `hits_addend` counts, else the request's (0 meaning 1,
/// as Envoy's protocol says). A negative addend (`is_negative_hits`) is not used by the
/// gateway and is ignored.
pub fn hits(request: &RateLimitRequest) -> Vec<Hit> {
    let default = if request.hits_addend == 0 {
        1
    } else {
        u64::from(request.hits_addend)
    };
    request
        .descriptors
        .iter()
        .filter_map(|d| hit(d, default))
        .collect()
}

fn hit(descriptor: &RateLimitDescriptor, default: u64) -> Option<Hit> {
    if descriptor.is_negative_hits {
        return None;
    }
    let entry = |key: &str| {
        descriptor
            .entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.clone())
    };
    Some(Hit {
        bucket: entry(BUCKET_KEY)?,
        counter: Counter::parse(&entry(LIMIT_KEY)?)?,
        amount: descriptor.hits_addend.map_or(default, |h| h.value),
        reservation: entry(RESERVATION_KEY),
    })
}

/// What an admission found, for the reply.
#[derive(Debug, Default)]
struct Seen {
    requests: Option<Window>,
    tokens: Option<Window>,
}

/// One counter's state after a check.
#[derive(Clone, Copy, Debug)]
struct Window {
    limit: u64,
    remaining: u64,
    reset: Duration,
}

impl Window {
    fn of(counters: &[LimitadorCounter], spent: u64) -> Option<Window> {
        let c = counters.first()?;
        Some(Window {
            limit: c.max_value(),
            remaining: c.remaining().unwrap_or(c.max_value()).saturating_sub(spent),
            reset: c
                .expires_in()
                .unwrap_or(Duration::from_secs(c.window().as_secs())),
        })
    }
}

impl QuotaService {
    /// A service for `domain` (Envoy's `domain`, limitador's namespace) over `limiter`,
    /// configured with `table`'s limits; a reservation is held at most `reservation_ttl`.
    pub async fn new(
        limiter: AsyncRateLimiter,
        table: LimitTable,
        domain: &str,
        reservation_ttl: Duration,
    ) -> anyhow::Result<QuotaService> {
        let limits = table.limitador_limits(domain)?;
        limiter
            .configure_with(limits)
            .await
            .map_err(|e| anyhow::anyhow!("configuring the limits: {e}"))?;
        Ok(QuotaService {
            limiter,
            table,
            domain: Namespace::from(domain),
            reservation_ttl,
            // Every request and what it was read as, on stderr.
            debug: std::env::var_os("INFERGATE_RATELIMIT_DEBUG").is_some(),
        })
    }

    /// Answer one `ShouldRateLimit` request.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, String> {
        if request.domain != self.domain.as_ref() {
            return Ok(ok(Vec::new(), None));
        }
        let hits = hits(request);
        if self.debug {
            eprintln!("infergate-ratelimit: {request:?} -> {hits:?}");
        }
        let (settles, admits): (Vec<&Hit>, Vec<&Hit>) =
            hits.iter().partition(|h| h.reservation.is_some());
        for hit in settles {
            let ctx = context(hit);
            let id = hit
                .reservation
                .as_deref()
                .filter(|r| *r != NO_RESERVATION)
                .map(|r| ReservationId::from(r.to_owned()));
            self.limiter
                .commit_reservation(&self.domain, &ctx, id.as_ref(), hit.amount)
                .await
                .map_err(|e| format!("settling {}: {e}", hit.bucket))?;
        }
        if admits.is_empty() {
            return Ok(ok(Vec::new(), None));
        }
        let mut seen = Seen::default();
        // Requests first (nothing counted yet), then the token reservation, then the
        // request is counted: a request refused on tokens spends no request.
        let requests: Vec<&&Hit> = admits
            .iter()
            .filter(|h| h.counter == Counter::Rpm)
            .collect();
        for hit in &requests {
            let check = self
                .limiter
                .is_rate_limited(&self.domain, &context(hit), hit.amount)
                .await
                .map_err(|e| format!("checking {}: {e}", hit.bucket))?;
            seen.requests = Window::of(&check.counters, hit.amount);
            if check.limited {
                return Ok(self.over_limit(hit, Counter::Rpm, &seen));
            }
        }
        // The holds made so far: a failure (or refusal) after one gives it back, since no
        // reservation id reaches Envoy then and nothing would ever settle it.
        let mut held: Vec<(&Hit, ReservationId)> = Vec::new();
        let mut reservation = None;
        for hit in admits.iter().filter(|h| h.counter == Counter::Tpm) {
            let reserved = match self
                .limiter
                .reserve(
                    &self.domain,
                    &context(hit),
                    hit.amount,
                    Some(self.reservation_ttl),
                )
                .await
                .map_err(|e| format!("reserving on {}: {e}", hit.bucket))
            {
                Ok(reserved) => reserved,
                Err(error) => return Err(self.release(&held, error).await),
            };
            // The reservation's counters already count its hold.
            seen.tokens = Window::of(&reserved.counters, 0);
            if reserved.limited {
                // Refused all the same; a hold that could not be given back lapses.
                let failed = self.release(&held, String::new()).await;
                if !failed.is_empty() {
                    eprintln!("infergate-ratelimit: {failed}");
                }
                return Ok(self.over_limit(hit, Counter::Tpm, &seen));
            }
            if let Some(id) = &reserved.reservation_id {
                held.push((hit, id.clone()));
            }
            reservation = Some(
                reserved
                    .reservation_id
                    .map_or(NO_RESERVATION.to_owned(), |id| id.as_str().to_owned()),
            );
        }
        for hit in &requests {
            let counted = self
                .limiter
                .update_counters(&self.domain, &context(hit), hit.amount)
                .await
                .map_err(|e| format!("counting on {}: {e}", hit.bucket));
            if let Err(error) = counted {
                return Err(self.release(&held, error).await);
            }
        }
        if self.debug {
            eprintln!("infergate-ratelimit: admitted, {seen:?}, reservation {reservation:?}");
        }
        Ok(ok(rate_limit_headers(&seen), reservation))
    }

    /// Give back the holds of an admission that fails (Envoy then lets the request through
    /// uncounted, without a reservation id to settle) or is refused after them: each is
    /// committed with 0 tokens. `error` is what failed (empty for a refusal); the answer is
    /// it with any release that failed too, empty when there is nothing to report.
    async fn release(&self, held: &[(&Hit, ReservationId)], error: String) -> String {
        let mut error = error;
        for (hit, id) in held {
            let released = self
                .limiter
                .commit_reservation(&self.domain, &context(hit), Some(id), 0)
                .await
                .map_err(|e| e.to_string());
            if let Err(e) = released {
                if !error.is_empty() {
                    error.push_str("; then ");
                }
                error.push_str(&format!(
                    "releasing the hold on {} failed (it lapses at its window's end): {e}",
                    hit.bucket
                ));
            }
        }
        error
    }

    fn over_limit(&self, hit: &Hit, counter: Counter, seen: &Seen) -> RateLimitResponse {
        let model = hit
            .bucket
            .split_once('/')
            .map_or(hit.bucket.as_str(), |(_, m)| m);
        let window = match counter {
            Counter::Rpm => seen.requests,
            Counter::Tpm => seen.tokens,
        };
        let retry_after = window.map_or(1, |w| w.reset.as_millis().div_ceil(1000).max(1));
        let (reason, kind, what) = match counter {
            Counter::Rpm => ("rejected-quota-rpm", "requests", "requests per minute"),
            Counter::Tpm => ("rejected-quota-tpm", "tokens", "tokens per minute"),
        };
        // The bucket's model entry: a model's own, or `*` (every other model).
        let message = if model == "*" {
            format!("Rate limit reached on {what}: retry after {retry_after} s.")
        } else {
            format!("Rate limit reached for {model} on {what}: retry after {retry_after} s.")
        };
        let mut headers = vec![("retry-after".to_owned(), retry_after.to_string())];
        headers.extend(rate_limit_headers(seen));
        let reply = Reply::rate_limited(reason, kind, &message, headers);
        RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            response_headers_to_add: reply
                .headers
                .into_iter()
                .map(|(k, v)| header(k, v))
                .collect(),
            raw_body: reply.body,
            ..RateLimitResponse::default()
        }
    }
}

/// OpenAI's `x-ratelimit-*` headers for what an admission saw.
fn rate_limit_headers(seen: &Seen) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (window, what) in [(seen.requests, "requests"), (seen.tokens, "tokens")] {
        let Some(w) = window else { continue };
        out.push((format!("x-ratelimit-limit-{what}"), w.limit.to_string()));
        out.push((
            format!("x-ratelimit-remaining-{what}"),
            w.remaining.to_string(),
        ));
        let ms = u64::try_from(w.reset.as_millis()).unwrap_or(u64::MAX);
        out.push((format!("x-ratelimit-reset-{what}"), format_reset(ms)));
    }
    out
}

fn header(key: String, value: String) -> HeaderValue {
    HeaderValue {
        key,
        value,
        ..HeaderValue::default()
    }
}

fn ok(headers: Vec<(String, String)>, reservation: Option<String>) -> RateLimitResponse {
    let dynamic_metadata = reservation.map(|id| Struct {
        fields: HashMap::from([(
            RESERVATION_METADATA.to_owned(),
            Value {
                kind: Some(Kind::StringValue(id)),
            },
        )]),
    });
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        response_headers_to_add: headers.into_iter().map(|(k, v)| header(k, v)).collect(),
        dynamic_metadata,
        ..RateLimitResponse::default()
    }
}

/// The limitador context of one descriptor: `descriptors[0]` holds its bucket and counter.
fn context(hit: &Hit) -> Context<'static> {
    let mut ctx = Context::default();
    ctx.list_binding(
        "descriptors".into(),
        vec![HashMap::from([
            (BUCKET_KEY.to_owned(), hit.bucket.clone()),
            (LIMIT_KEY.to_owned(), hit.counter.as_str().to_owned()),
        ])],
    );
    ctx
}

#[tonic::async_trait]
impl RateLimitService for QuotaService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        match self.decide(request.get_ref()).await {
            Ok(response) => Ok(Response::new(response)),
            Err(e) => {
                eprintln!("infergate-ratelimit: {e}");
                Err(Status::unavailable(e))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::google::protobuf::UInt64Value;

    fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn descriptors_become_hits_with_their_own_addend_else_the_requests() {
        let request = RateLimitRequest {
            domain: "infergate".into(),
            descriptors: vec![
                descriptor(&[(BUCKET_KEY, "t/m"), (LIMIT_KEY, "rpm")], None),
                descriptor(&[(BUCKET_KEY, "t/m"), (LIMIT_KEY, "tpm")], Some(300)),
                descriptor(
                    &[
                        (BUCKET_KEY, "t/m"),
                        (LIMIT_KEY, "tpm"),
                        (RESERVATION_KEY, "r1"),
                    ],
                    Some(0),
                ),
                descriptor(&[(LIMIT_KEY, "tpm")], Some(5)),
                descriptor(&[(BUCKET_KEY, "t/m"), (LIMIT_KEY, "concurrency")], None),
            ],
            hits_addend: 0,
        };
        let hits = hits(&request);
        assert_eq!(hits.len(), 3, "{hits:?}");
        assert_eq!((hits[0].counter, hits[0].amount), (Counter::Rpm, 1));
        assert_eq!((hits[1].counter, hits[1].amount), (Counter::Tpm, 300));
        assert_eq!(hits[1].reservation, None);
        assert_eq!(hits[2].reservation.as_deref(), Some("r1"));
        assert_eq!(hits[2].amount, 0, "an explicit 0 is 0");
        let mut negative = descriptor(&[(BUCKET_KEY, "t/m"), (LIMIT_KEY, "tpm")], Some(9));
        negative.is_negative_hits = true;
        let request = RateLimitRequest {
            descriptors: vec![negative],
            hits_addend: 4,
            ..request
        };
        assert!(super::hits(&request).is_empty());
    }
}
