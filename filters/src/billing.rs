//! The billing record: exactly one per request that reached the auth stage, admitted or
//! not, with what it consumed and how that was known. The record is one JSON object that
//! the adapter hands to Envoy ([`crate::host::UsageRecordSink`]), so Envoy's own access
//! loggers (file, gRPC, OpenTelemetry) ship it; the shipped configs write one line per
//! request to a file.
//!
//! Conservation holds per record: `pre_debit - refund = charged`, and `charged` is the
//! `prompt_tokens + completion_tokens` billed (0 for a request that was never admitted).

use serde::Serialize;

/// How a request ended, as billed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The response reached its end.
    Complete,
    /// The stream ended before its response did (the client left, or the stream was reset).
    ClientDisconnect,
    /// The upstream failed (a 5xx the engine or Envoy produced).
    UpstreamError,
    /// Flow control evicted the admitted request for one of a higher band
    /// (`evicted-by-priority`): answered 429 before its response started, reset after. It
    /// is billed for what was generated.
    Evicted,
    /// The gateway refused the request before any engine saw it; the value is the reason
    /// (`rejected-quota-tpm`, `rejected-unauthenticated`, `rejected-no-endpoints`, …).
    Rejected(String),
}

impl Outcome {
    /// The outcome's name in the record.
    pub fn as_str(&self) -> &str {
        match self {
            Outcome::Complete => "complete",
            Outcome::ClientDisconnect => "client_disconnect",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Evicted => scheduler_core::flow::EVICTED_BY_PRIORITY,
            Outcome::Rejected(reason) => reason,
        }
    }
}

/// The per-stream state key under which the picker leaves the destination list it gave
/// Envoy, for the record's `destinations` (the Wasm router reads its own copy of the request
/// headers, so it cannot see the picker's header).
pub const DESTINATIONS_STATE: &str = "infergate.picker.destinations";

/// The rejection reason of a request the auth stage found no tenant for.
pub const REJECTED_UNAUTHENTICATED: &str = "rejected-unauthenticated";
/// The rejection reason of a request for a model the tenant has no quota for.
pub const REJECTED_MODEL_NOT_ALLOWED: &str = "rejected-model-not-allowed";

/// The reason recorded for a local reply of status `status` when no stage named one (the
/// body router's own answers).
pub fn reason_of_status(status: u16) -> &'static str {
    match status {
        400 => "rejected-bad-request",
        401 => REJECTED_UNAUTHENTICATED,
        403 => REJECTED_MODEL_NOT_ALLOWED,
        404 => "rejected-model-not-found",
        413 => "rejected-too-large",
        429 => "rejected-rate-limited",
        s if s >= 500 => "rejected-internal",
        _ => "rejected-other",
    }
}

/// One request's billing record (field names are the record's JSON keys).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BillingRecord {
    /// Envoy's `x-request-id`, to join the record with other logs.
    pub request_id: Option<String>,
    /// The tenant (`TenantQuota` name); `None` when the request was not authenticated.
    pub tenant: Option<String>,
    /// The fairness id the auth stage injected.
    pub fairness_id: Option<String>,
    /// The objective the auth stage injected.
    pub objective: Option<String>,
    /// The objective's priority (0 when none is known).
    pub priority: i32,
    /// The `model` the client sent.
    pub model: Option<String>,
    /// The model the engine was asked for (after any rewrite).
    pub target_model: Option<String>,
    /// The pool (its base model) that served the request.
    pub pool: Option<String>,
    /// The endpoint that served the response (`ip:port`): the pick, or the fallback Envoy
    /// moved to; `None` when no upstream answered (a local reply, or a reset before one).
    pub endpoint: Option<String>,
    /// The destinations the picker gave Envoy, in order: the pick, then its fallbacks
    /// (`x-gateway-destination-endpoint`, comma-separated).
    pub destinations: Option<String>,
    /// Prompt tokens billed.
    pub prompt_tokens: u64,
    /// Completion tokens billed.
    pub completion_tokens: u64,
    /// Prompt tokens the engine reported as served from its prefix cache.
    pub cached_tokens: u64,
    /// Tokens pre-debited at admission.
    pub pre_debit: u64,
    /// Tokens given back at settlement (negative: an under-estimate charged).
    pub refund: i64,
    /// Tokens charged: `pre_debit - refund`.
    pub charged: u64,
    /// How the tokens were known: `usage`, `continuous_usage`, `chunk_count` or `none`.
    pub tokens_source: &'static str,
    /// How the request ended (see [`Outcome::as_str`]).
    pub outcome: String,
    /// The HTTP status the client got, if a response started.
    pub status: Option<u16>,
    /// Milliseconds from the request's arrival to its first response byte.
    pub ttft_ms: Option<u64>,
    /// Milliseconds from the request's arrival to its end.
    pub duration_ms: u64,
    /// Milliseconds it waited in its pool's flow-control queue (`null`: it did not wait,
    /// being admitted at once or its pool having no flow control).
    pub queued_ms: Option<u64>,
}

impl BillingRecord {
    /// The record as one line of JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain strings and numbers cannot fail; an empty object would still be
        // one line per request.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn record_is_one_json_line_with_every_field() {
        let record = BillingRecord {
            tenant: Some("tenant-a".into()),
            model: Some("m\n\"x\"".into()),
            pre_debit: 100,
            refund: -5,
            charged: 105,
            tokens_source: "usage",
            outcome: Outcome::Complete.as_str().into(),
            ..BillingRecord::default()
        };
        let line = record.to_json();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for key in [
            "request_id",
            "tenant",
            "fairness_id",
            "objective",
            "priority",
            "model",
            "target_model",
            "pool",
            "queued_ms",
            "endpoint",
            "destinations",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "pre_debit",
            "refund",
            "charged",
            "tokens_source",
            "outcome",
            "status",
            "ttft_ms",
            "duration_ms",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {line}");
        }
        assert_eq!(v["refund"], -5);
        assert_eq!(v["model"], "m\n\"x\"");
    }

    #[test]
    fn router_replies_get_reasons() {
        assert_eq!(reason_of_status(404), "rejected-model-not-found");
        assert_eq!(reason_of_status(413), "rejected-too-large");
        assert_eq!(reason_of_status(401), REJECTED_UNAUTHENTICATED);
    }
}
