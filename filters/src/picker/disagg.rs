//! Prefill/decode disaggregation in the picker: the pool's endpoint roles, and the prefill
//! endpoint of a pick.
//!
//! A pool's `endpointRoles` gives endpoints a role, `prefill`, `decode` or `both` (an
//! endpoint it does not name is `both`):
//!
//! ```json
//! "endpointRoles": {"10.0.0.1:8000": "prefill", "10.0.0.2": {"llm-d.ai/role": "decode"}}
//! ```
//!
//! A key is an endpoint (`ip:port`) or a bare IP, which gives the role to every endpoint of
//! that IP (a pod's data-parallel ranks; an `ip:port` key wins over its IP's). A value is a
//! role, or a pod's labels in llm-d's form, of which `llm-d.ai/role` is read (absent: `both`).
//! A key that matches no endpoint of the pool, or a role that is none of the three, is a
//! config error. Roles only matter to a pool whose `eppConfig` has a
//! `disagg-profile-handler`: its decode profile only considers endpoints that can decode,
//! its prefill profile only those that can prefill (see the core's `scheduling::disagg`).
//!
//! When the decider says *prefill*, the pick (and `x-gateway-destination-endpoint`) is the
//! decode endpoint and [`PREFILLER_HEADER`] names the prefill endpoint; the decode
//! replica's sidecar has it compute the prompt and pulls the KV. Bookkeeping of such a
//! pick:
//!
//! - **prefix index**: the prompt's blocks are recorded for both endpoints. The prefill
//!   endpoint computed them and keeps them cached; the decode endpoint received them over
//!   the KV transfer and keeps them too. The next turn then matches on both.
//! - **in-flight load**: the request's lease is on the decode endpoint only. It holds the
//!   request for its whole life; the prefill is a one-token request the sidecar sends
//!   directly, not through this proxy, so the proxy would never see it end. The prefill
//!   endpoint's work shows in its scraped queue and running counts instead.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use scheduler_core::scheduling::{Candidate, Decision, Role, ROLE_LABEL};
use serde::Deserialize;

use crate::reply::truncate_for_message;

/// The request header naming the prefill endpoint (`ip:port`) of a disaggregated pick; a
/// client-sent one is removed before any stage reads it.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// A pool's `endpointRoles`: endpoint or IP → role.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct EndpointRoles(pub BTreeMap<String, RoleSpec>);

/// One role as configured: a role name, or a pod's labels (llm-d's form).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RoleSpec {
    /// `prefill`, `decode` or `both`.
    Name(String),
    /// Labels, of which `llm-d.ai/role` is read.
    Labels(BTreeMap<String, String>),
}

impl RoleSpec {
    fn role(&self) -> Result<Role, String> {
        let text = match self {
            RoleSpec::Name(n) => n.as_str(),
            RoleSpec::Labels(labels) => match labels.get(ROLE_LABEL) {
                Some(v) => v.as_str(),
                None => return Ok(Role::Both),
            },
        };
        Role::parse(text).ok_or_else(|| {
            format!(
                "role `{}` is none of prefill, decode, both",
                truncate_for_message(text, 32)
            )
        })
    }
}

impl EndpointRoles {
    /// Whether no role is configured (every endpoint serves both phases).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each of `endpoints`' role, in their order; the error names the offending key.
    pub fn resolve(&self, endpoints: &[String]) -> Result<Vec<Role>, String> {
        let mut roles = vec![Role::Both; endpoints.len()];
        let mut exact = vec![false; endpoints.len()];
        for (key, spec) in &self.0 {
            let quoted = || truncate_for_message(key, 64).into_owned();
            let role = spec.role().map_err(|e| format!("`{}`: {e}", quoted()))?;
            let matches: Vec<usize> = if key.parse::<SocketAddr>().is_ok() {
                endpoints
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| *e == key)
                    .map(|(i, _)| i)
                    .collect()
            } else {
                let bare = key.trim_start_matches('[').trim_end_matches(']');
                let Ok(ip) = bare.parse::<IpAddr>() else {
                    return Err(format!("`{}` is neither ip:port nor an IP", quoted()));
                };
                endpoints
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.parse::<SocketAddr>().is_ok_and(|a| a.ip() == ip))
                    .map(|(i, _)| i)
                    .collect()
            };
            if matches.is_empty() {
                return Err(format!("`{}` is no endpoint of the pool", quoted()));
            }
            let is_exact = key.parse::<SocketAddr>().is_ok();
            for i in matches {
                if let (Some(r), Some(x)) = (roles.get_mut(i), exact.get_mut(i)) {
                    if is_exact || !*x {
                        *r = role;
                        *x = is_exact;
                    }
                }
            }
        }
        Ok(roles)
    }

    /// The role of one `address` (`ip:port`) that joins the pool (a member of its
    /// cluster): its own key's, else its IP's, else `both`. A key that does not parse
    /// gives no role (the config's check refuses it).
    pub fn role_of(&self, address: &str) -> Role {
        let ip = address.parse::<SocketAddr>().ok().map(|a| a.ip());
        let mut by_ip = None;
        for (key, spec) in &self.0 {
            let Ok(role) = spec.role() else {
                continue;
            };
            if key == address {
                return role;
            }
            let bare = key.trim_start_matches('[').trim_end_matches(']');
            if bare.parse::<IpAddr>().ok().is_some_and(|k| Some(k) == ip) {
                by_ip = by_ip.or(Some(role));
            }
        }
        by_ip.unwrap_or(Role::Both)
    }

    /// Check every key and role without endpoints to match them against (a pool that
    /// follows its cluster: its members are not known yet); the error names the key.
    pub fn check(&self) -> Result<(), String> {
        for (key, spec) in &self.0 {
            let quoted = || truncate_for_message(key, 64).into_owned();
            spec.role().map_err(|e| format!("`{}`: {e}", quoted()))?;
            let bare = key.trim_start_matches('[').trim_end_matches(']');
            if key.parse::<SocketAddr>().is_err() && bare.parse::<IpAddr>().is_err() {
                return Err(format!("`{}` is neither ip:port nor an IP", quoted()));
            }
        }
        Ok(())
    }

    /// [`EndpointRoles::resolve`] for a validated config (every endpoint `both` should it
    /// fail anyway: no role is safer than a wrong one).
    pub fn resolve_validated(&self, endpoints: &[String]) -> Vec<Role> {
        self.resolve(endpoints)
            .unwrap_or_else(|_| vec![Role::Both; endpoints.len()])
    }
}

/// Gives each candidate its pool endpoint's role; `pool_index_of(c)` is candidate `c`'s
/// index in the pool (and `roles` is indexed by pool endpoint).
pub fn assign_roles(
    candidates: &mut [Candidate<'_>],
    roles: &[Role],
    pool_index_of: impl Fn(usize) -> Option<usize>,
) {
    if roles.iter().all(|r| *r == Role::Both) {
        return;
    }
    for (c, cand) in candidates.iter_mut().enumerate() {
        cand.role = pool_index_of(c)
            .and_then(|i| roles.get(i).copied())
            .unwrap_or(Role::Both);
    }
}

/// The pool index of the decision's prefill endpoint, when the request is disaggregated.
pub fn prefiller(
    decision: &Decision<'_>,
    pool_index_of: impl Fn(usize) -> Option<usize>,
) -> Option<usize> {
    decision.prefill().and_then(pool_index_of)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn roles(json: &str) -> EndpointRoles {
        serde_json::from_str(json).unwrap()
    }

    fn endpoints() -> Vec<String> {
        [
            "10.0.0.1:8000",
            "10.0.0.1:8001",
            "10.0.0.2:8000",
            "10.0.0.3:8000",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn roles_by_endpoint_by_ip_and_by_label() {
        let r = roles(
            r#"{"10.0.0.1": "prefill", "10.0.0.1:8001": "decode",
                "10.0.0.2:8000": {"llm-d.ai/role": "decode", "app": "vllm"}}"#,
        );
        assert_eq!(
            r.resolve(&endpoints()).unwrap(),
            [Role::Prefill, Role::Decode, Role::Decode, Role::Both]
        );
        let unlabelled = roles(r#"{"10.0.0.3:8000": {"app": "vllm"}}"#);
        assert_eq!(unlabelled.resolve(&endpoints()).unwrap()[3], Role::Both);
        assert_eq!(
            EndpointRoles::default().resolve(&endpoints()).unwrap(),
            [Role::Both; 4]
        );
    }

    #[test]
    fn unknown_endpoints_and_roles_are_errors_naming_the_key() {
        let e = roles(r#"{"10.0.0.9:8000": "decode"}"#)
            .resolve(&endpoints())
            .unwrap_err();
        assert!(e.contains("`10.0.0.9:8000` is no endpoint"), "{e}");
        let e = roles(r#"{"10.0.0.2:8000": "decoder"}"#)
            .resolve(&endpoints())
            .unwrap_err();
        assert!(e.contains("`decoder` is none of"), "{e}");
        let e = roles(r#"{"pod-a": "decode"}"#)
            .resolve(&endpoints())
            .unwrap_err();
        assert!(e.contains("neither ip:port nor an IP"), "{e}");
        assert!(serde_json::from_str::<EndpointRoles>(r#"{"10.0.0.2:8000": 3}"#).is_err());
    }
}

/// The picker with a disaggregating pool, against the fake host.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod pick_tests {
    use super::super::tests::*;
    use super::PREFILLER_HEADER;

    const DISAGGREGATED: &str = "infergate.picker.disaggregated_picks.pool.p";

    /// A prefills, B and C decode; prompts with 256 uncached tokens are prefilled on A.
    fn pd_pool() -> PickerShared {
        shared(pd_pool_json())
    }

    fn pd_pool_json() -> Value {
        pool(
            &[A, B, C],
            json!({
                "endpointRoles": {A: "prefill", B: "decode", C: {"llm-d.ai/role": "decode"}},
                "eppConfig": {
                    "plugins": [
                        {"type": "approx-prefix-cache-producer"},
                        {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 256}},
                        {"type": "disagg-profile-handler",
                         "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}}},
                        {"type": "prefix-cache-scorer"}, {"type": "inflight-load-scorer"}],
                    "schedulingProfiles": [
                        {"name": "decode", "plugins": [{"pluginRef": "prefix-cache-scorer", "weight": 3},
                                                       {"pluginRef": "inflight-load-scorer"}]},
                        {"name": "prefill", "plugins": [{"pluginRef": "inflight-load-scorer"}]}]
                }
            }),
        )
    }

    fn long() -> Vec<u8> {
        chat(&"the quick brown fox jumps over the lazy dog. ".repeat(100))
    }

    fn hashes(s: &PickerShared, body: &[u8]) -> Vec<scheduler_core::types::BlockHash> {
        let plans = s.plans();
        let plan = plans.get(PoolId(0)).unwrap();
        let p = scheduler_core::request::parse_with_limit(
            scheduler_core::request::Api::ChatCompletions,
            body,
            plan.max_prompt_bytes(),
        )
        .unwrap();
        plan.block_hashes(&p.model, p.cache_salt.as_deref(), &p.prompt)
    }

    #[test]
    fn a_long_uncached_prompt_goes_to_a_decoder_with_the_prefiller_beside_it() {
        let mut s = pd_pool();
        let mut host = host_for(&long(), Some(fresh_all(&[A, B, C])));
        let (status, req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        let decoder = req.endpoint().unwrap().to_owned();
        assert!(decoder == B || decoder == C, "decoded on {decoder}");
        let list = host.header(DESTINATION_ENDPOINT).unwrap();
        assert!(
            !list.contains(A),
            "a prefill endpoint is never a destination: {list}"
        );
        assert_eq!(host.header(PREFILLER_HEADER), Some(A));
        // The prompt's blocks are recorded on both; the load only on the decoder.
        let h = hashes(&s, &long());
        assert!(h.len() >= 4);
        assert_eq!(s.prefix_match(PoolId(0), A, &h), h.len());
        assert_eq!(s.prefix_match(PoolId(0), &decoder, &h), h.len());
        assert_eq!(requests_in_flight(&s, &decoder), 1);
        assert_eq!(requests_in_flight(&s, A), 0);
        assert_eq!(host.counter(DISAGGREGATED), 1);
        assert_eq!(host.counter("infergate.picker.decisions.pool.p"), 1);

        // The same prompt again: cached on the decoder, decoded there without a prefiller.
        let mut again = host_for(&long(), Some(fresh_all(&[A, B, C])));
        let (_, second) = pick_one(&mut s, &mut again);
        assert_eq!(second.endpoint(), Some(decoder.as_str()));
        assert_eq!(again.header(PREFILLER_HEADER), None);
        assert_eq!(again.counter(DISAGGREGATED), 0);
        assert_eq!(again.counter("infergate.picker.decisions.pool.p"), 1);
    }

    #[test]
    fn a_client_sent_prefiller_is_dropped_and_a_short_prompt_stays_aggregated() {
        let mut s = pd_pool();
        let mut host = host_for(&chat("short"), Some(fresh_all(&[A, B, C])))
            .request_header(PREFILLER_HEADER, A);
        let (status, req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        assert_ne!(req.endpoint(), Some(A));
        assert_eq!(host.header(PREFILLER_HEADER), None);
        // A long one gets the gateway's prefiller, whatever the client named.
        let mut host = host_for(&long(), Some(fresh_all(&[A, B, C])))
            .request_header(PREFILLER_HEADER, "192.0.2.1:1");
        pick_one(&mut s, &mut host);
        assert_eq!(host.header(PREFILLER_HEADER), Some(A));
    }

    /// The Wasm flavour's path: the state owner picks, its answer carries the prefiller
    /// through the codec, and the worker's request sets the header from it.
    #[test]
    fn the_owners_answer_carries_the_prefiller_to_the_worker() {
        use super::super::remote::{Owner, StateKey, ToOwner, ToWorker};
        let config = serde_json::to_vec(&pd_pool_json()).unwrap();
        let key = StateKey::of_config(&config);
        let mut owner = Owner::new();
        let hello = ToOwner::Hello {
            state: key,
            config: config.clone(),
        };
        let mut owner_host = FakeHost::new().now(NOW).snapshot(1, fresh_all(&[A, B, C]));
        assert!(owner
            .handle(&mut owner_host, &hello.encode().unwrap())
            .is_empty());
        let mut local = shared(pd_pool_json());
        let mut host = host_for(&long(), Some(fresh_all(&[A, B, C])));
        let mut req = PickRun::deferred();
        assert_eq!(
            req.on_request_headers(&mut local, &mut host, false),
            FilterStatus::Pause
        );
        let len = host.body.len();
        assert_eq!(
            req.on_request_body(&mut local, &mut host, len, true),
            FilterStatus::Pause
        );
        let (pool, prepared) = req.pending_pick().unwrap();
        let pick = ToOwner::Pick {
            state: key,
            reply_queue: 1,
            ticket: 1,
            pool,
            prepared: prepared.clone(),
            releases: Vec::new(),
            started: Vec::new(),
        };
        let (_, answer) = owner
            .handle(&mut owner_host, &pick.encode().unwrap())
            .pop()
            .unwrap();
        let Some(ToWorker::Picked {
            endpoint,
            fallbacks,
            prefiller,
            ..
        }) = ToWorker::decode(&answer.encode())
        else {
            panic!("not a pick: {answer:?}");
        };
        assert_eq!(prefiller.as_deref(), Some(A));
        // The owner decided, so the owner counts it (the worker only sets the header).
        assert_eq!(owner_host.counter(DISAGGREGATED), 1);
        let status = req.on_answer(&mut host, Ok((&endpoint, &fallbacks, prefiller.as_deref())));
        assert_eq!(status, Some(FilterStatus::Continue));
        assert_eq!(host.header(PREFILLER_HEADER), Some(A));
        assert_ne!(endpoint, A);
        assert_eq!(host.counter(DISAGGREGATED), 0);
    }

    #[test]
    fn roles_naming_no_endpoint_of_the_pool_are_a_config_error() {
        let bad = pool(&[A, B], json!({"endpointRoles": {C: "decode"}}));
        let e = PickerShared::from_json(bad).unwrap_err().to_string();
        assert!(e.contains("endpointRoles") && e.contains(C), "{e}");
        let bad = pool(&[A, B], json!({"endpointRoles": {A: "prefiller"}}));
        assert!(PickerShared::from_json(bad).is_err());
    }
}
