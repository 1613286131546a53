//! The auth stage: the trust boundary and the tenant of a request.
//!
//! 1. Every client-sent `x-gateway-*` / `x-llm-d-*` header (the deprecated
//!    `x-gateway-inference-*` aliases included) is removed, before any stage reads one.
//! 2. The tenant: `Authorization: Bearer <token>`. A token shaped like a JWT is one only
//!    Envoy's `jwt_authn` can vouch for: its verified claims are matched against the
//!    tenants' `jwtClaims` (issuer, claim, value). Any other token is an API key, matched by
//!    its sha256 against `apiKeyHashes`. No credential, or one no tenant holds: 401 with
//!    OpenAI's `invalid_api_key`.
//! 3. The tenant's `inject.fairnessId` and `inject.objective` are set as
//!    `x-llm-d-inference-fairness-id` and `x-llm-d-inference-objective`, and the
//!    `authorization` header is removed: an engine never sees a tenant's credential.
//!
//! A request for an exported pool's load page ([`super::export`]) passes without a tenant:
//! the gateways of other clusters read it, and it holds no tenant's data.
//!
//! The stage is also where the request's tenancy ends ([`Tenancy::finish`]): it is the first
//! stage, so its response-side callbacks run last, after the usage stage read the chunk.

use std::sync::Arc;

use crate::billing::REJECTED_UNAUTHENTICATED;
use crate::headers::{self, ClientHeadersStripped, FAIRNESS_ID, OBJECTIVE};
use crate::host::{
    Clock, LocalReply, RequestHeaders, ResponseHeaders, ServedUpstream, Stats, StreamState,
    UsageRecordSink, VerifiedJwt,
};
use crate::pipeline::{reply, EndCause, RequestContext, Stage};
use crate::reply::Reply;
use crate::tenants::TenantId;
use crate::FilterStatus;

use super::export::is_export_page;
use super::tenancy::{Accounting, AuthMethod, AuthRefusal, End, Tenancy};

/// The auth stage; shares the [`Tenancy`].
#[derive(Clone, Debug)]
pub struct AuthStage {
    tenancy: Arc<Tenancy>,
}

impl AuthStage {
    /// A stage authenticating against `tenancy`.
    pub fn new(tenancy: Arc<Tenancy>) -> AuthStage {
        AuthStage { tenancy }
    }

    /// The tenant of the request's credential.
    fn identify<H: RequestHeaders + VerifiedJwt + ?Sized>(
        &self,
        host: &H,
    ) -> Result<(TenantId, AuthMethod), AuthRefusal> {
        let header = host
            .request_header("authorization")
            .ok_or(AuthRefusal::Missing)?;
        let token = bearer_token(&header).ok_or(AuthRefusal::Missing)?;
        if looks_like_jwt(token) {
            let tenants = self.tenancy.tenants();
            let issuer = host.verified_jwt_claim("iss").ok_or(AuthRefusal::Unknown)?;
            return tenants
                .jwt_rules()
                .iter()
                .find(|rule| {
                    rule.issuer == issuer
                        && host
                            .verified_jwt_claim(&rule.claim)
                            .is_some_and(|v| v == rule.value)
                })
                .map(|rule| (rule.tenant, AuthMethod::Jwt))
                .ok_or(AuthRefusal::Unknown);
        }
        self.tenancy
            .tenants()
            .by_api_key(token)
            .map(|id| (id, AuthMethod::ApiKey))
            .ok_or(AuthRefusal::Unknown)
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer_token(header: &str) -> Option<&str> {
    let header = header.trim();
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether `token` has a JWT's shape: three base64url segments (the signature may be
/// empty), the shape the shipped configs make `jwt_authn` verify.
fn looks_like_jwt(token: &str) -> bool {
    let mut parts = 0;
    for part in token.split('.') {
        parts += 1;
        let b64url = part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !b64url || (parts < 3 && part.is_empty()) {
            return false;
        }
    }
    parts == 3
}

impl<H> Stage<H> for AuthStage
where
    H: RequestHeaders
        + ResponseHeaders
        + VerifiedJwt
        + ServedUpstream
        + LocalReply
        + Clock
        + Stats
        + UsageRecordSink
        + StreamState
        + ?Sized,
{
    fn name(&self) -> &'static str {
        "auth"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _end_of_stream: bool,
    ) -> FilterStatus {
        headers::strip_reserved(host);
        cx.insert(ClientHeadersStripped);
        if host
            .request_header(":path")
            .is_some_and(|path| is_export_page(&path))
        {
            // A peer cluster's gateway reads an exported pool's load: no tenant's data, no
            // inference, and a peer holds no tenant's key.
            return FilterStatus::Continue;
        }
        let mut acc = Accounting::new(host.now(), host.request_header("x-request-id"));
        let found = self.identify(host);
        self.tenancy.count_auth(host, found.map(|(_, m)| m));
        let tenant = match found {
            Ok((tenant, _)) => tenant,
            Err(refusal) => {
                acc.rejected = Some(REJECTED_UNAUTHENTICATED.to_owned());
                acc.status = Some(401);
                cx.insert(acc);
                self.tenancy.finish(cx, host, End::Rejected);
                let message = match refusal {
                    AuthRefusal::Missing => {
                        "You didn't provide an API key. Provide it in the Authorization \
                         header as `Bearer <key>`."
                    }
                    AuthRefusal::Unknown => "Incorrect API key provided.",
                };
                return reply(host, &Reply::unauthorized(message));
            }
        };
        acc.tenant = Some(tenant);
        cx.insert(acc);
        // The tenant's credential is the gateway's business: engines never receive it.
        host.remove_request_header("authorization");
        if let Some(t) = self.tenancy.tenants().tenant(tenant) {
            if let Some(fairness) = &t.fairness_id {
                host.set_request_header(FAIRNESS_ID, fairness);
            }
            if let Some(objective) = &t.objective {
                host.set_request_header(OBJECTIVE, objective);
            }
        }
        FilterStatus::Continue
    }

    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, end_of_stream: bool) {
        let status = host
            .response_header(":status")
            .and_then(|s| s.trim().parse::<u16>().ok());
        // A dropped reason is what a filter of this gateway says of its own local reply. A
        // response an upstream sent is not one, whatever it carries: an engine cannot
        // refuse in the gateway's name, nor so escape its billing and settlement.
        let served = host.served_upstream();
        let dropped = if served.is_some() {
            None
        } else {
            host.response_header(headers::DROPPED_REASON)
        };
        let now = host.now();
        if let Some(acc) = cx.get_mut::<Accounting>() {
            acc.status = status;
            acc.served = served;
            acc.dropped_reason = dropped;
            if end_of_stream {
                acc.first_byte.get_or_insert(now);
            }
        }
        if end_of_stream {
            self.tenancy.finish(cx, host, End::ResponseComplete);
        }
    }

    fn on_response_chunk(&self, cx: &mut RequestContext, host: &mut H, end_of_stream: bool) {
        let now = host.now();
        if let Some(acc) = cx.get_mut::<Accounting>() {
            acc.first_byte.get_or_insert(now);
        }
        if end_of_stream {
            self.tenancy.finish(cx, host, End::ResponseComplete);
        }
    }

    fn on_end(&self, cx: &mut RequestContext, host: &mut H, cause: EndCause) {
        self.tenancy.finish(cx, host, End::Ended(cause));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_and_jwt_shapes() {
        assert_eq!(bearer_token("Bearer sk-1"), Some("sk-1"));
        assert_eq!(bearer_token("bearer   sk-1 "), Some("sk-1"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert!(looks_like_jwt("eyJh.eyJi.c2ln"));
        assert!(looks_like_jwt("eyJh.eyJi."));
        assert!(!looks_like_jwt("sk-infergate-test"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt(".b.c"));
        assert!(!looks_like_jwt("a+b.c.d"));
    }
}
