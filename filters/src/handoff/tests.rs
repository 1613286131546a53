//! Round trips, rejection of malformed input, and the fit rules of [`Handoff::hashes_for`].

use proptest::prelude::*;
use scheduler_core::prefix::PrefixConfig;
use scheduler_core::request::{parse, Api};
use scheduler_core::types::{BlockHash, Tokens};

use super::*;

fn sample() -> Handoff {
    Handoff {
        base_model: "llama".into(),
        target_model: "sql-lora".into(),
        prompt_tokens: Tokens(4096),
        max_output_tokens: Some(256),
        output_sequences: 8,
        block_size_tokens: 64,
        complete: true,
        block_hashes: vec![BlockHash(1), BlockHash(u64::MAX), BlockHash(42)],
    }
}

#[test]
fn round_trips() {
    let h = sample();
    let bytes = h.encode().unwrap_or_default();
    assert_eq!(Handoff::decode(&bytes), Some(h));
    let none = Handoff {
        max_output_tokens: None,
        output_sequences: 1,
        complete: false,
        block_hashes: Vec::new(),
        ..sample()
    };
    assert_eq!(
        Handoff::decode(&none.encode().unwrap_or_default()),
        Some(none)
    );
}

#[test]
fn wrong_version_magic_flags_or_length_are_rejected() {
    let bytes = sample().encode().unwrap_or_default();
    let mut v = bytes.clone();
    v[3] = HANDOFF_VERSION + 1;
    assert_eq!(Handoff::decode(&v), None);
    let mut m = bytes.clone();
    m[0] = b'X';
    assert_eq!(Handoff::decode(&m), None);
    let mut f = bytes.clone();
    f[8] |= 0x80;
    assert_eq!(Handoff::decode(&f), None);
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(Handoff::decode(&long), None);
    for cut in 0..bytes.len() {
        assert_eq!(Handoff::decode(&bytes[..cut]), None, "cut at {cut}");
    }
}

/// The output sequences sit right after the output cap: bytes 25..29.
#[test]
fn the_output_sequences_round_trip_and_zero_is_refused() {
    let bytes = sample().encode().unwrap_or_default();
    assert_eq!(bytes.get(25..29), Some(&8u32.to_le_bytes()[..]));
    let mut zero = bytes.clone();
    zero[25..29].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(Handoff::decode(&zero), None);
    let mut most = bytes.clone();
    most[25..29].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        Handoff::decode(&most).map(|h| h.output_sequences),
        Some(u32::MAX)
    );
    // A version-1 handoff (no sequences) is refused, not misread.
    let mut v1 = bytes[..25].to_vec();
    v1[3] = 1;
    v1.extend_from_slice(&bytes[29..]);
    assert_eq!(Handoff::decode(&v1), None);
}

#[test]
fn from_parsed_carries_the_output_sequences() {
    let body = r#"{"model":"m","n":4,"max_tokens":9,"prompt":["a","b","c"]}"#;
    let parsed = parse(Api::Completions, body.as_bytes());
    let Ok(parsed) = parsed else {
        panic!("body did not parse: {parsed:?}");
    };
    let h = Handoff::from_parsed(&parsed, "base", 16);
    assert_eq!((h.max_output_tokens, h.output_sequences), (Some(9), 12));
    let back = Handoff::decode(&h.encode().unwrap_or_default());
    assert_eq!(back.map(|b| b.output_sequences), Some(12));
}

#[test]
fn from_parsed_matches_the_pickers_own_hashing() {
    let prompt = "x".repeat(3000);
    let body = format!(
        r#"{{"model":"m","cache_salt":"t1","max_tokens":9,"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
    );
    let parsed = parse(Api::ChatCompletions, body.as_bytes());
    let Ok(parsed) = parsed else {
        panic!("body did not parse: {parsed:?}");
    };
    let h = Handoff::from_parsed(&parsed, "base", 16);
    let cfg = PrefixConfig {
        block_size_tokens: 16,
        ..PrefixConfig::default()
    };
    let own = prefix::block_hashes(prefix::seed("m", Some("t1")), &parsed.prompt, &cfg);
    assert!(!own.is_empty());
    assert!(h.complete);
    assert_eq!(h.hashes_for(&cfg), Some(own.as_slice()));
    assert_eq!(h.max_output_tokens, Some(9));
    assert_eq!(h.prompt_tokens, parsed.prompt_tokens);
    // Another block size: the picker must not use these hashes.
    let other = PrefixConfig {
        block_size_tokens: 64,
        ..cfg
    };
    assert_eq!(h.hashes_for(&other), None);
}

/// The router's parse keeps only the prompt bytes its hashing reads. A prompt longer than
/// that is not complete: a picker that matches further must parse the body itself.
#[test]
fn a_prompt_longer_than_the_routers_parse_keeps_is_not_complete() {
    let long = "x".repeat(PrefixConfig::default().max_prompt_bytes() + 4096);
    let body = format!(r#"{{"model":"m","prompt":"{long}"}}"#);
    let parsed = parse(Api::Completions, body.as_bytes());
    let Ok(parsed) = parsed else {
        panic!("body did not parse: {parsed:?}");
    };
    assert!(
        parsed.prompt.len() < parsed.prompt_len,
        "the parse kept it all"
    );
    let h = Handoff::from_parsed(&parsed, "base", 64);
    assert!(!h.complete);
    let default = PrefixConfig::default();
    assert_eq!(
        h.hashes_for(&default).map(<[_]>::len),
        Some(default.max_blocks())
    );
    let further = PrefixConfig {
        max_prefix_tokens_to_match: default.max_prefix_tokens_to_match * 2,
        ..default
    };
    assert_eq!(h.hashes_for(&further), None);
}

#[test]
fn a_cut_short_handoff_only_serves_a_picker_that_cuts_as_short() {
    let h = Handoff {
        complete: false,
        block_hashes: (0..10).map(BlockHash).collect(),
        ..sample()
    };
    let cfg = |tokens| PrefixConfig {
        block_size_tokens: 64,
        max_prefix_tokens_to_match: tokens,
        ..PrefixConfig::default()
    };
    // The picker hashes at most 20 blocks: 10 are not enough.
    assert_eq!(h.hashes_for(&cfg(20 * 64)), None);
    // At most 4 blocks: the first 4 are exactly what it would hash.
    assert_eq!(h.hashes_for(&cfg(4 * 64)).map(<[_]>::len), Some(4));
}

proptest! {
    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Handoff::decode(&bytes);
    }

    #[test]
    fn decode_of_a_mutated_encoding_never_panics(
        idx in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = sample().encode().unwrap_or_default();
        let i = idx.index(bytes.len());
        bytes[i] = byte;
        let c = cut.index(bytes.len() + 1);
        let _ = Handoff::decode(&bytes[..c]);
    }

    #[test]
    fn encode_decode_round_trips(
        base in "[a-z0-9/-]{0,40}",
        target in "\\PC{0,40}",
        prompt_tokens in any::<u64>(),
        max_output in proptest::option::of(any::<u64>()),
        sequences in 1..=u32::MAX,
        block in any::<u32>(),
        complete in any::<bool>(),
        hashes in proptest::collection::vec(any::<u64>(), 0..64),
    ) {
        let h = Handoff {
            base_model: base,
            target_model: target,
            prompt_tokens: Tokens(prompt_tokens),
            max_output_tokens: max_output,
            output_sequences: sequences,
            block_size_tokens: block,
            complete,
            block_hashes: hashes.into_iter().map(BlockHash).collect(),
        };
        let bytes = h.encode();
        prop_assert!(bytes.is_some());
        prop_assert_eq!(Handoff::decode(&bytes.unwrap_or_default()), Some(h));
    }
}
