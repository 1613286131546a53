//! Prefill/decode disaggregation: the handler's config checks, the decider's verdicts, the
//! role restriction of each profile, the decision record, and a property over random roles,
//! matches and thresholds.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use proptest::prelude::*;

use super::super::{Candidate, ConfigError, PdVerdict, Role, Scheduler};
use super::{cand, hashes, m, req, sched, FakePrefix};
use crate::metrics::EndpointMetrics;
use crate::types::Millis;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A PD config: decode profile prefix ×3 + queue, prefill profile queue only; the decider's
/// parameters as given (a JSON map body).
fn pd(decider: &str) -> String {
    format!(
        r#"{{"plugins": [
        {{"type": "approx-prefix-cache-producer"}},
        {{"type": "prefix-based-pd-decider", "parameters": {{{decider}}}}},
        {{"type": "disagg-profile-handler", "parameters": {{"deciders": {{"prefill": "prefix-based-pd-decider"}}}}}},
        {{"type": "prefix-cache-scorer"}}, {{"type": "queue-scorer"}}, {{"type": "max-score-picker"}}],
        "schedulingProfiles": [
          {{"name": "decode", "plugins": [{{"pluginRef": "prefix-cache-scorer", "weight": 3}}, {{"pluginRef": "queue-scorer"}}]}},
          {{"name": "prefill", "plugins": [{{"pluginRef": "queue-scorer"}}]}}]}}"#
    )
}

fn with_role<'a>(c: Candidate<'a>, role: Role) -> Candidate<'a> {
    Candidate { role, ..c }
}

/// Decode endpoints D1 (idle), D2; prefill endpoint P (idle).
fn pool(ms: &[EndpointMetrics; 3]) -> [Candidate<'_>; 3] {
    [
        with_role(cand("10.0.0.1:8000", Some(&ms[0])), Role::Decode),
        with_role(cand("10.0.0.2:8000", Some(&ms[1])), Role::Decode),
        with_role(cand("10.0.0.3:8000", Some(&ms[2])), Role::Prefill),
    ]
}

fn rejected(json: &str) -> ConfigError {
    match Scheduler::from_json_str(json) {
        Ok(_) => panic!("config accepted: {json}"),
        Err(e) => e,
    }
}

#[test]
fn a_long_uncached_prompt_is_prefilled_on_a_prefill_endpoint_and_decoded_on_a_decode_one() {
    let s = sched(&pd(r#""nonCachedTokens": 256"#));
    assert!(s.disaggregates());
    assert!(s.uses_prefix_index(), "the decider reads the index");
    let ms = [m(0, 0, 0.1), m(3, 0, 0.1), m(0, 0, 0.1)];
    let c = pool(&ms);
    let h = hashes(16);
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(d.picked_address(), Some("10.0.0.1:8000"));
    assert_eq!(d.prefill_address(), Some("10.0.0.3:8000"));
    let Some(outcome) = d.disaggregation() else {
        panic!("no disaggregation record");
    };
    assert_eq!(outcome.verdict(), PdVerdict::Prefill);
    assert_eq!(outcome.prompt_cache().uncached_tokens, 16 * 64);
    let names: Vec<&str> = d.profiles().iter().map(|p| p.name()).collect();
    assert_eq!(names, ["decode", "prefill"]);
    // Each profile saw only the endpoints of its role.
    assert!(d.profiles()[0].dropped_by_role(2));
    assert!(d.profiles()[1].dropped_by_role(0) && d.profiles()[1].dropped_by_role(1));
}

#[test]
fn a_mostly_cached_prompt_is_decoded_alone_and_the_prefill_profile_does_not_run() {
    let s = sched(&pd(r#""nonCachedTokens": 256"#));
    let ms = [m(0, 0, 0.1), m(0, 0, 0.1), m(0, 0, 0.1)];
    let c = pool(&ms);
    let h = hashes(16);
    // D2 holds 13 of 16 blocks: 3 × 64 = 192 uncached tokens < 256.
    let prefix = FakePrefix::with(&[("10.0.0.2:8000", 13)]);
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    assert_eq!(d.picked_address(), Some("10.0.0.2:8000"));
    assert_eq!(d.prefill_address(), None);
    let outcome = d.disaggregation().map(|o| (o.verdict(), o.prompt_cache()));
    let Some((verdict, seen)) = outcome else {
        panic!("no disaggregation record");
    };
    assert_eq!(verdict, PdVerdict::MostlyCached);
    assert_eq!(
        (seen.cached_tokens, seen.uncached_tokens),
        (13 * 64, 3 * 64)
    );
    assert_eq!(d.profiles().len(), 1);
    // One block more uncached (4 × 64 = 256) reaches the threshold.
    let prefix = FakePrefix::with(&[("10.0.0.2:8000", 12)]);
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    assert_eq!(d.picked_address(), Some("10.0.0.2:8000"));
    assert_eq!(d.prefill_address(), Some("10.0.0.3:8000"));
}

#[test]
fn the_prompt_length_gate_and_a_zero_threshold_keep_requests_aggregated() {
    let ms = [m(0, 0, 0.1), m(0, 0, 0.1), m(0, 0, 0.1)];
    let c = pool(&ms);
    let h = hashes(4); // 256 tokens, all uncached
    let gated = sched(&pd(r#""nonCachedTokens": 64, "promptTokens": 257"#));
    let d = gated.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(
        d.disaggregation().map(|o| o.verdict()),
        Some(PdVerdict::ShortPrompt)
    );
    let open = sched(&pd(r#""nonCachedTokens": 64, "promptTokens": 256"#));
    let d = open.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(
        d.disaggregation().map(|o| o.verdict()),
        Some(PdVerdict::Prefill)
    );
    let disabled = sched(&pd(""));
    let d = disabled.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(
        d.disaggregation().map(|o| o.verdict()),
        Some(PdVerdict::Disabled)
    );
    assert_eq!(d.prefill_address(), None);
}

#[test]
fn endpoints_of_role_both_serve_either_phase_and_one_that_wins_both_is_not_its_own_prefiller() {
    let s = sched(&pd(r#""nonCachedTokens": 1"#));
    let ms = [m(0, 0, 0.1), m(5, 0, 0.1)];
    let c = [
        cand("10.0.0.1:8000", Some(&ms[0])),
        with_role(cand("10.0.0.2:8000", Some(&ms[1])), Role::Prefill),
    ];
    let h = hashes(8);
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(d.picked_address(), Some("10.0.0.1:8000"));
    // The prefill profile's queue scorer prefers the idle `both` endpoint: the decode pick.
    assert_eq!(
        d.disaggregation().map(|o| o.verdict()),
        Some(PdVerdict::SameEndpoint)
    );
    assert_eq!(d.prefill_address(), None);
}

#[test]
fn no_prefill_endpoint_or_no_decode_endpoint_is_recorded() {
    let s = sched(&pd(r#""nonCachedTokens": 1"#));
    let ms = [m(0, 0, 0.1), m(0, 0, 0.1)];
    let decoders = [
        with_role(cand("10.0.0.1:8000", Some(&ms[0])), Role::Decode),
        with_role(cand("10.0.0.2:8000", Some(&ms[1])), Role::Decode),
    ];
    let h = hashes(8);
    let d = s.schedule(&req(&h), &decoders, &FakePrefix::default(), 1, Millis(0));
    assert!(d.picked_address().is_some());
    let verdict = d.disaggregation().map(|o| o.verdict());
    assert_eq!(verdict, Some(PdVerdict::NoPrefillEndpoint));
    let prefillers = [with_role(
        cand("10.0.0.3:8000", Some(&ms[0])),
        Role::Prefill,
    )];
    let d = s.schedule(&req(&h), &prefillers, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(
        d.picked_address(),
        None,
        "a prefill-only endpoint never decodes"
    );
    let verdict = d.disaggregation().map(|o| o.verdict());
    assert_eq!(verdict, Some(PdVerdict::NoDecodeEndpoint));
}

#[test]
fn role_filters_work_in_any_profile_and_the_always_decider_always_disaggregates() {
    let s = sched(
        r#"{"plugins": [{"type": "always-disagg-pd-decider", "name": "always"},
        {"type": "disagg-profile-handler", "parameters": {"profiles": {"decode": "d", "prefill": "p"}, "deciders": {"prefill": "always"}}},
        {"type": "decode-filter"}, {"type": "prefill-filter"}, {"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "prefill-filter"}, {"pluginRef": "queue-scorer"}]},
                               {"name": "d", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]}]}"#,
    );
    assert!(!s.uses_prefix_index(), "nothing reads the index");
    let ms = [m(0, 0, 0.1), m(1, 0, 0.1), m(2, 0, 0.1)];
    let c = pool(&ms);
    let d = s.schedule(&req(&[]), &c, &FakePrefix::default(), 3, Millis(0));
    assert_eq!(d.picked_address(), Some("10.0.0.1:8000"));
    assert_eq!(d.prefill_address(), Some("10.0.0.3:8000"));
    assert_eq!(d.profiles()[0].name(), "d", "the decode profile runs first");
    // A filter outside the handler: `decode-filter` in a single profile drops the prefiller.
    let single = sched(
        r#"{"plugins": [{"type": "decode-filter"}, {"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "x", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]}]}"#,
    );
    let only_prefill = [with_role(
        cand("10.0.0.3:8000", Some(&ms[0])),
        Role::Prefill,
    )];
    let d = single.schedule(
        &req(&[]),
        &only_prefill,
        &FakePrefix::default(),
        3,
        Millis(0),
    );
    assert_eq!(d.picked_address(), None);
    assert_eq!(d.profiles()[0].dropped_by(0), Some("decode-filter"));
    assert!(d.disaggregation().is_none());
}

#[test]
fn the_record_shows_both_picks_and_the_verdict() {
    let s = sched(&pd(r#""nonCachedTokens": 256"#));
    let ms = [m(0, 0, 0.1), m(3, 0, 0.1), m(0, 0, 0.1)];
    let c = pool(&ms);
    let h = hashes(16);
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    let v = match serde_json::to_value(&d) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(v["picked"], "10.0.0.1:8000");
    assert_eq!(v["prefiller"], "10.0.0.3:8000");
    let r = &v["disaggregation"];
    assert_eq!(r["handler"], "disagg-profile-handler");
    assert_eq!(r["decider"], "prefix-based-pd-decider");
    assert_eq!(r["decider_type"], "prefix-based-pd-decider");
    assert_eq!(r["decode_profile"], "decode");
    assert_eq!(r["prefill_profile"], "prefill");
    assert_eq!(r["verdict"], "prefill");
    assert_eq!(r["uncached_tokens"], 1024);
    assert_eq!(r["cached_tokens"], 0);
    assert_eq!(r["prefill"], "10.0.0.3:8000");
    assert_eq!(v["profiles"][0]["phase"], "decode");
    assert_eq!(
        v["profiles"][0]["role_dropped"],
        serde_json::json!(["10.0.0.3:8000"])
    );
    assert_eq!(v["profiles"][1]["phase"], "prefill");
    assert_eq!(v["profiles"][1]["picked"], "10.0.0.3:8000");
    // A config without the handler keeps its record as it was.
    let plain = super::only(&["queue-scorer"]);
    let d = plain.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    let v = serde_json::to_value(&d).unwrap_or_default();
    assert!(v.get("disaggregation").is_none() && v.get("prefiller").is_none());
    assert!(v["profiles"][0].get("phase").is_none());
}

#[test]
fn handler_config_mistakes_name_the_culprit() {
    let base = r#"{"type": "prefix-based-pd-decider", "name": "dec", "parameters": {"nonCachedTokens": 8}}"#;
    let profiles = r#"[{"name": "decode"}, {"name": "prefill"}]"#;
    let cfg = |handler: &str, profiles: &str| {
        format!(r#"{{"plugins": [{base}, {handler}], "schedulingProfiles": {profiles}}}"#)
    };
    let e = rejected(&cfg(
        r#"{"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "nope"}}}"#,
        profiles,
    ));
    assert!(
        format!("{e}").contains("`nope` names no declared PD decider"),
        "{e}"
    );
    let e = rejected(&cfg(
        r#"{"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "dec"}, "profiles": {"prefill": "pf"}}}"#,
        profiles,
    ));
    assert!(
        format!("{e}").contains("prefill profile `pf` is not declared"),
        "{e}"
    );
    let e = rejected(&cfg(r#"{"type": "disagg-profile-handler"}"#, profiles));
    assert!(format!("{e}").contains("`prefill` is never run"), "{e}");
    let e = rejected(&cfg(
        r#"{"type": "disagg-profile-handler", "parameters": {"profiles": {"encode": "e"}}}"#,
        profiles,
    ));
    assert!(
        matches!(e, ConfigError::BadParameter { ref parameter, .. } if parameter == "profiles.encode"),
        "{e}"
    );
    let e = rejected(&cfg(
        r#"{"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "dec"}}}, {"type": "single-profile-handler"}"#,
        profiles,
    ));
    assert!(format!("{e}").contains("only one profile handler"), "{e}");
    let e = rejected(
        r#"{"plugins": [{"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": -1}}]}"#,
    );
    assert!(
        matches!(e, ConfigError::BadParameter { ref parameter, .. } if parameter == "nonCachedTokens"),
        "{e}"
    );
    // Decode only: the handler with no decider runs the decode profile alone.
    let s = sched(&cfg(
        r#"{"type": "disagg-profile-handler"}"#,
        r#"[{"name": "decode"}]"#,
    ));
    assert!(!s.disaggregates());
    let ms = [m(0, 0, 0.1), m(0, 0, 0.1), m(0, 0, 0.1)];
    let c = pool(&ms);
    let h = hashes(4);
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 1, Millis(0));
    assert_eq!(
        d.disaggregation().map(|o| o.verdict()),
        Some(PdVerdict::NoDecider)
    );
    assert_ne!(d.picked_address(), Some("10.0.0.3:8000"));
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Prefill), Just(Role::Decode), Just(Role::Both)]
}

proptest! {
    /// Whatever the roles, matches and thresholds: the decode pick can decode, a prefiller
    /// can prefill and is not the decode pick, the prefill profile runs exactly when the
    /// decider's rule holds on the decode pick, and the verdict is `prefill` exactly when
    /// there is a prefiller.
    #[test]
    fn picks_respect_roles_and_the_threshold(
        endpoints in prop::collection::vec((role(), 0u32..4, 0usize..20), 0..6),
        blocks in 0u64..20,
        non_cached in 0u64..1500,
        min_prompt in 0u64..1500,
        seed in any::<u64>(),
    ) {
        let s = sched(&pd(&format!(r#""nonCachedTokens": {non_cached}, "promptTokens": {min_prompt}"#)));
        let addresses: Vec<String> = (0..endpoints.len()).map(|i| format!("10.0.0.{i}:8000")).collect();
        let metrics: Vec<EndpointMetrics> = endpoints.iter().map(|(_, w, _)| m(*w, 0, 0.1)).collect();
        let c: Vec<Candidate<'_>> = endpoints.iter().zip(&addresses).zip(&metrics)
            .map(|(((r, _, _), a), mm)| with_role(cand(a, Some(mm)), *r)).collect();
        let prefix = FakePrefix(endpoints.iter().zip(&addresses).map(|((_, _, n), a)| (a.clone(), *n)).collect());
        let h = hashes(blocks);
        let d = s.schedule(&req(&h), &c, &prefix, seed, Millis(0));
        let Some(outcome) = d.disaggregation() else {
            return Err(TestCaseError::fail("no disaggregation record"));
        };
        let decode = d.picked();
        prop_assert_eq!(decode.is_some(), c.iter().any(|x| x.role != Role::Prefill));
        if let Some(p) = decode {
            prop_assert!(c[p].role != Role::Prefill);
            let matched = endpoints[p].2.min(blocks as usize) as u64;
            let uncached = (blocks - matched) * 64;
            prop_assert_eq!(outcome.prompt_cache().uncached_tokens, uncached);
            let rule = non_cached > 0 && blocks * 64 >= min_prompt && uncached >= non_cached;
            prop_assert_eq!(d.profiles().len(), if rule { 2 } else { 1 });
        }
        prop_assert_eq!(outcome.verdict() == PdVerdict::Prefill, d.prefill().is_some());
        if let Some(p) = d.prefill() {
            prop_assert!(c[p].role != Role::Decode);
            prop_assert!(Some(p) != decode);
        }
    }
}
