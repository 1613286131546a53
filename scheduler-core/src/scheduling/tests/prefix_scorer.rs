//! `prefix-cache-scorer`'s match-length parameters: parsing and refusals, the formula on
//! worked examples, the block-size conversion, what the length term changes in a pick, and
//! properties (range, monotonicity, the default being exactly the ratio).

use alloc::format;
use alloc::string::ToString;
use proptest::prelude::*;

use super::super::plugins::{PrefixCacheScorer, Scorer, DEFAULT_MATCH_LENGTH_SCALE};
use super::super::score::prefix_cache;
use super::super::{ConfigError, Scheduler};
use super::{cand, hashes, m, req, sched, FakePrefix};
use crate::types::{Millis, Tokens};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The compiled settings of a lone `prefix-cache-scorer` declared with `params`.
fn parsed(params: &str) -> Result<PrefixCacheScorer, ConfigError> {
    let s = Scheduler::from_json_str(&format!(
        r#"{{"plugins": [{{"type": "prefix-cache-scorer", "name": "pc", "parameters": {params}}}]}}"#
    ))?;
    match s.profiles()[0].scorers[0].step.plugin {
        Scorer::PrefixCache(p) => Ok(p),
        other => panic!("not a prefix-cache scorer: {other:?}"),
    }
}

fn scorer(weight: f64, scale: u64) -> PrefixCacheScorer {
    PrefixCacheScorer {
        match_length_weight: weight,
        match_length_scale: Tokens(scale),
    }
}

#[test]
fn absent_parameters_are_the_plain_ratio() {
    let d = PrefixCacheScorer::default();
    assert_eq!(d, scorer(0.0, 8192));
    assert_eq!(DEFAULT_MATCH_LENGTH_SCALE, Tokens(8192));
    for params in ["null", "{}", r#"{"matchLengthWeight": null}"#] {
        assert_eq!(parsed(params), Ok(d), "{params}");
    }
    // A weight alone keeps the default scale, a scale alone the default (zero) weight.
    assert_eq!(parsed(r#"{"matchLengthWeight": 1}"#), Ok(scorer(1.0, 8192)));
    assert_eq!(
        parsed(r#"{"matchLengthScaleTokens": 100}"#),
        Ok(scorer(0.0, 100))
    );
}

#[test]
fn the_platforms_parameters_are_read() {
    assert_eq!(
        parsed(r#"{"matchLengthWeight": 0.3, "matchLengthScaleTokens": 8192}"#),
        Ok(scorer(0.3, 8192))
    );
    assert_eq!(
        parsed(r#"{"matchLengthWeight": 0, "matchLengthScaleTokens": 1}"#),
        Ok(scorer(0.0, 1))
    );
}

#[test]
fn out_of_range_and_unknown_parameters_are_refused_by_name() {
    let cases = [
        (r#"{"matchLengthWeight": 1.5}"#, "matchLengthWeight"),
        (r#"{"matchLengthWeight": -0.1}"#, "matchLengthWeight"),
        (r#"{"matchLengthWeight": "0.3"}"#, "matchLengthWeight"),
        (r#"{"matchLengthScaleTokens": 0}"#, "matchLengthScaleTokens"),
        (
            r#"{"matchLengthScaleTokens": -8192}"#,
            "matchLengthScaleTokens",
        ),
        (
            r#"{"matchLengthScaleTokens": 8192.5}"#,
            "matchLengthScaleTokens",
        ),
        (
            r#"{"matchLengthScaleTokens": "8k"}"#,
            "matchLengthScaleTokens",
        ),
        // llm-d's earlier names are not aliases: a stale config must say so.
        (r#"{"prefixLengthWeight": 0.5}"#, "prefixLengthWeight"),
        (
            r#"{"matchLengthWeight": 0.3, "maxModelLen": 8192}"#,
            "maxModelLen",
        ),
    ];
    for (params, parameter) in cases {
        match parsed(params) {
            Err(ConfigError::BadParameter {
                plugin,
                parameter: p,
                reason,
            }) => {
                assert_eq!((plugin.as_str(), p.as_str()), ("pc", parameter), "{params}");
                assert!(!reason.is_empty());
            }
            other => panic!("{params}: expected BadParameter, got {other:?}"),
        }
    }
    let e = parsed(r#"{"matchLenghtWeight": 0.3}"#).err();
    assert!(
        e.map(|e| e.to_string())
            .is_some_and(|s| s.contains("matchLenghtWeight") && s.contains("matchLengthWeight")),
        "a typo is named, with the known parameters"
    );
}

/// Equal up to float rounding (the examples are computed in another order than the scorer).
fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-12, "{got} vs {want}");
}

#[test]
fn formula_on_worked_examples() {
    // The seed's settings, 64-token blocks, a 128-block (8192-token) prompt.
    let p = scorer(0.3, 8192);
    // Half of it matched: 4096 tokens, length term (1/2)² = 1/4.
    assert_close(prefix_cache(p, 64, 128, 64), 0.3 * 0.25 + 0.7 * 0.5);
    // All of it: both terms 1.
    assert_close(prefix_cache(p, 128, 128, 64), 1.0);
    // Nothing matched, or no full block to match: 0.
    assert_eq!(prefix_cache(p, 0, 128, 64), 0.0);
    assert_eq!(prefix_cache(p, 0, 0, 64), 0.0);
    // Past the scale the length term stays 1: 200 of 256 blocks is 12800 tokens.
    assert_close(prefix_cache(p, 200, 256, 64), 0.3 + 0.7 * (200.0 / 256.0));
    // Weight 1: the length term alone, whatever the ratio.
    assert_close(prefix_cache(scorer(1.0, 1000), 5, 10, 20), 0.1 * 0.1);
    assert_close(prefix_cache(scorer(1.0, 1000), 5, 500, 20), 0.1 * 0.1);
    // Weight 0: the ratio, whatever the scale.
    assert_eq!(prefix_cache(scorer(0.0, 1), 1, 4, 64), 0.25);
}

#[test]
fn matched_tokens_are_blocks_times_the_producers_block_size() {
    // 16-token blocks and a 64-token scale: 2 matched blocks are half the scale, 4 all of it.
    let s = sched(
        r#"{"plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
        {"type": "prefix-cache-scorer", "parameters": {"matchLengthWeight": 1, "matchLengthScaleTokens": 64}}]}"#,
    );
    let c = [cand("a", None), cand("b", None), cand("c", None)];
    let h = hashes(8);
    let prefix = FakePrefix::with(&[("a", 2), ("b", 4), ("c", 8)]);
    let d = s.schedule(&req(&h), &c, &prefix, 0, Millis(0));
    let raw: alloc::vec::Vec<_> = (0..3).map(|i| d.profiles()[0].raw_score(0, i)).collect();
    assert_eq!(raw, [Some(0.25), Some(1.0), Some(1.0)]);
}

#[test]
fn a_short_prompts_full_match_no_longer_outweighs_an_idle_endpoint() {
    // `a` holds the whole 2-block prompt but queues 4 requests; `b` holds nothing and idles.
    let config = |params: &str| {
        sched(&format!(
            r#"{{"plugins": [{{"type": "prefix-cache-scorer", "parameters": {params}}}, {{"type": "queue-scorer"}}],
            "schedulingProfiles": [{{"name": "p", "plugins": [
                {{"pluginRef": "prefix-cache-scorer", "weight": 3}}, {{"pluginRef": "queue-scorer", "weight": 2}}]}}]}}"#
        ))
    };
    let (busy, idle) = (m(4, 0, 0.0), m(0, 0, 0.0));
    let c = [cand("a", Some(&busy)), cand("b", Some(&idle))];
    let h = hashes(2);
    let prefix = FakePrefix::with(&[("a", 2)]);
    let pick = |s: &Scheduler| {
        s.schedule(&req(&h), &c, &prefix, 0, Millis(0))
            .picked_address()
            .map(ToString::to_string)
    };
    // The ratio alone: a full match, 3 > 2.
    assert_eq!(pick(&config("{}")), Some("a".into()));
    // Mostly length: 128 of 8192 tokens is next to nothing, 3 × (0.8 × 0.0002 + 0.2) < 2.
    assert_eq!(
        pick(&config(r#"{"matchLengthWeight": 0.8}"#)),
        Some("b".into())
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_default_is_exactly_the_ratio(
        full in 1usize..100_000,
        frac in 0.0f64..=1.0,
        block in 1u32..4096,
        scale in 1u64..1_000_000,
    ) {
        let matched = ((full as f64) * frac) as usize;
        let ratio = (matched as f64 / full as f64).to_bits();
        let default = prefix_cache(PrefixCacheScorer::default(), matched, full, block);
        prop_assert_eq!(default.to_bits(), ratio);
        prop_assert_eq!(prefix_cache(scorer(0.0, scale), matched, full, block).to_bits(), ratio);
    }

    #[test]
    fn scores_are_in_range_and_grow_with_the_match(
        full in 0usize..100_000,
        frac in 0.0f64..=1.0,
        weight in 0.0f64..=1.0,
        block in 0u32..4096,
        scale in 1u64..u64::MAX,
    ) {
        let p = scorer(weight, scale);
        let matched = ((full as f64) * frac) as usize;
        let here = prefix_cache(p, matched, full, block);
        prop_assert!((0.0..=1.0 + 1e-12).contains(&here), "score {} out of range", here);
        if matched < full {
            let more = prefix_cache(p, matched + 1, full, block);
            prop_assert!(more >= here, "{} blocks score {}, one more {}", matched, here, more);
        }
        // The two terms, each in [0, 1], mixed by the weight.
        if full > 0 {
            let ratio = matched as f64 / full as f64;
            let length = (matched as f64 * f64::from(block) / scale as f64).min(1.0);
            let expect = weight * length * length + (1.0 - weight) * ratio;
            prop_assert!((here - expect).abs() <= 1e-12, "{} vs {}", here, expect);
        }
    }
}
