//! Wire names and the removal of client-sent gateway headers.
//!
//! A client must never steer routing, priority or tenancy, so every `x-gateway-*` and
//! `x-llm-d-*` header it sends, and `x-prefiller-host-port`, is removed before any stage
//! reads it. With an
//! `ORIGINAL_DST` cluster a spoofed destination header would otherwise be an open proxy.

use crate::host::RequestHeaders;

/// Base model of the request (adapter names map to their base); set by the body router.
pub const BASE_MODEL: &str = "x-gateway-base-model-name";
/// The `model` field as the client sent it; set by the body router.
pub const MODEL_NAME: &str = "x-gateway-model-name";
/// `ip:port` of the chosen endpoint; set by the picker.
pub const DESTINATION_ENDPOINT: &str = "x-gateway-destination-endpoint";
/// Restricts the picker's candidates to the listed `ip:port`s (a trusted stage's header;
/// also the key of the subset hint in [`SUBSET_METADATA_NAMESPACE`]).
pub const DESTINATION_SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// Dynamic-metadata namespace of the subset hint (the gateway's own config writes it).
pub const SUBSET_METADATA_NAMESPACE: &str = "envoy.lb.subset_hint";
/// `ip:port` of the endpoint that actually served (a retry may have taken a fallback); set
/// by the picker on the response.
pub const DESTINATION_SERVED: &str = "x-gateway-destination-endpoint-served";
/// Envoy's per-request retry budget, which the picker sets to the number of fallbacks in
/// its list: a retry past the list would leave it (Envoy's pool cluster then picks by its
/// own fallback policy, outside the picker's choice and any subset hint), and a client's
/// own value must not buy more retries.
pub const MAX_RETRIES: &str = "x-envoy-max-retries";
/// The Envoy cluster of a pool's peer gateways, when the picker sent the request to a peer
/// cluster (its route matches on this header); set by the picker, removed from what
/// clients send.
pub const PEER_ROUTE: &str = "x-gateway-peer-route";
/// Set on a request a gateway sends to a peer cluster's gateway, which then serves it in
/// its own pool and never sends it on. Not reserved: a client that sends it only keeps
/// its request in the cluster it reached.
pub const PEER_HOP: &str = "x-infergate-peer-hop";
/// Reason of a 429/503 rejection.
pub const DROPPED_REASON: &str = "x-llm-d-request-dropped-reason";
/// Dynamic-metadata namespace the picker writes the destination under.
pub const LB_METADATA_NAMESPACE: &str = "envoy.lb";

/// The fairness id (tenant flow) of the request; set only by the auth stage.
pub const FAIRNESS_ID: &str = "x-llm-d-inference-fairness-id";
/// The objective (priority class) of the request; set only by the auth stage.
pub const OBJECTIVE: &str = "x-llm-d-inference-objective";

/// Marks a request whose client-sent reserved headers a stage already removed (in the
/// request's pipeline context), so later stages do not strip what it then set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientHeadersStripped;

/// Prefixes a client may not send (compared case-insensitively).
const RESERVED_PREFIXES: [&str; 2] = ["x-gateway-", "x-llm-d-"];

/// Whole names a client may not send: the prefill endpoint of a disaggregated request
/// (llm-d's header, read by the decode replica's sidecar), which would otherwise make a
/// replica send the prompt wherever the client says.
const RESERVED_NAMES: [&str; 1] = [crate::picker::disagg::PREFILLER_HEADER];

/// Whether `name` is a gateway-reserved header name.
pub fn is_reserved(name: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|prefix| {
        name.get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    }) || RESERVED_NAMES.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Remove every reserved header from the request; returns how many names were removed.
pub fn strip_reserved<H: RequestHeaders + ?Sized>(host: &mut H) -> usize {
    let mut names: Vec<String> = host
        .request_headers()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| is_reserved(name))
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in &names {
        host.remove_request_header(name);
    }
    names.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_prefixes_match_case_insensitively() {
        assert!(is_reserved("x-gateway-destination-endpoint"));
        assert!(is_reserved("X-Gateway-Base-Model-Name"));
        assert!(is_reserved("x-llm-d-inference-objective"));
        assert!(!is_reserved("x-gateway"));
        assert!(!is_reserved("x-request-id"));
        assert!(!is_reserved(""));
        assert!(!is_reserved("x-llm-"));
        assert!(is_reserved("X-Prefiller-Host-Port"));
        assert!(!is_reserved("x-prefiller-host-port-2"));
    }
}
