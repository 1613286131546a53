//! Golden payloads from `testdata/kv_events` (packed by Python's msgpack), a test encoder
//! for round trips in both encodings, hostile inputs, and the topic parser.

use super::*;
use alloc::string::ToString;
use alloc::vec;
use proptest::prelude::*;
use serde_json::Value;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const GOLDEN: &[(&str, &[u8])] = &[
    (
        "array-v1-no-dp-rank.msgpack",
        include_bytes!("../../../testdata/kv_events/array-v1-no-dp-rank.msgpack"),
    ),
    (
        "array-medium-lora-dp-rank.msgpack",
        include_bytes!("../../../testdata/kv_events/array-medium-lora-dp-rank.msgpack"),
    ),
    (
        "array-signed-and-large-hashes.msgpack",
        include_bytes!("../../../testdata/kv_events/array-signed-and-large-hashes.msgpack"),
    ),
    (
        "map-events-in-array-batch.msgpack",
        include_bytes!("../../../testdata/kv_events/map-events-in-array-batch.msgpack"),
    ),
    (
        "map-batch-bytes-hashes.msgpack",
        include_bytes!("../../../testdata/kv_events/map-batch-bytes-hashes.msgpack"),
    ),
    (
        "dropped-events.msgpack",
        include_bytes!("../../../testdata/kv_events/dropped-events.msgpack"),
    ),
];

fn hashes(v: &Value) -> Vec<EngineBlockHash> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|h| EngineBlockHash(h.as_u64().unwrap()))
        .collect()
}

fn expected_event(v: &Value) -> KvEvent {
    match v["type"].as_str().unwrap() {
        "BlockStored" => KvEvent::BlockStored {
            block_hashes: hashes(&v["block_hashes"]),
            parent: v["parent"].as_u64().map(EngineBlockHash),
            token_ids: v["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
            block_size: v["block_size"].as_u64().unwrap() as u32,
            lora_name: v["lora_name"].as_str().map(|s| s.to_string()),
        },
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes(&v["block_hashes"]),
        },
        _ => KvEvent::AllBlocksCleared,
    }
}

#[test]
fn golden_payloads_decode_as_expected() {
    let expected: Value =
        serde_json::from_str(include_str!("../../../testdata/kv_events/expected.json")).unwrap();
    let expected = expected.as_array().unwrap();
    assert_eq!(expected.len(), GOLDEN.len());
    for want in expected {
        let file = want["file"].as_str().unwrap();
        let (_, bytes) = GOLDEN.iter().find(|(f, _)| *f == file).unwrap();
        let got = decode_batch(bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let events: Vec<KvEvent> = want["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(expected_event)
            .collect();
        assert_eq!(got.events, events, "{file}");
        // serde_json's default float parsing may be off by an ulp: compare closely.
        let ts = want["ts"].as_f64().unwrap();
        assert!(
            (got.ts - ts).abs() <= ts.abs() * 1e-12,
            "{file}: ts {}",
            got.ts
        );
        assert_eq!(
            got.dp_rank,
            want["dp_rank"].as_u64().map(|d| d as u32),
            "{file}"
        );
    }
}

#[test]
fn every_strict_prefix_of_a_golden_payload_is_an_error() {
    for (file, bytes) in GOLDEN {
        for cut in 0..bytes.len() {
            assert!(decode_batch(&bytes[..cut]).is_err(), "{file} cut at {cut}");
        }
        let mut longer = bytes.to_vec();
        longer.push(0xc0);
        assert_eq!(decode_batch(&longer), Err(KvDecodeError::TrailingBytes));
    }
}

#[test]
fn wrong_shapes_are_errors_not_panics() {
    let cases: &[(&[u8], KvDecodeError)] = &[
        (b"", KvDecodeError::Truncated),
        (b"\xc1", KvDecodeError::Malformed),
        (b"\xc0", KvDecodeError::WrongType("batch")),
        (b"\x91\x00", KvDecodeError::MissingField("events")),
        (b"\x92\x00\x00", KvDecodeError::WrongType("events")),
        (b"\x80", KvDecodeError::MissingField("events")),
        // An event that is a bare integer; an empty event array; a map without a type.
        (b"\x92\x00\x91\x05", KvDecodeError::WrongType("event")),
        (b"\x92\x00\x91\x90", KvDecodeError::MissingField("type")),
        (b"\x92\x00\x91\x80", KvDecodeError::MissingField("type")),
        // ["BlockRemoved"] without its hashes.
        (
            b"\x92\x00\x91\x91\xacBlockRemoved",
            KvDecodeError::MissingField("block_hashes"),
        ),
        // Token ids that are not u32: -1, and 2^32.
        (
            b"\x92\x00\x91\x95\xabBlockStored\x91\x01\xc0\x91\xff\x01",
            KvDecodeError::WrongType("token_ids"),
        ),
        (
            b"\x92\x00\x91\x95\xabBlockStored\x91\x01\xc0\x91\xcf\x00\x00\x00\x01\x00\x00\x00\x00\x01",
            KvDecodeError::WrongType("token_ids"),
        ),
        // An array claiming 2^32-1 elements in a few bytes.
        (b"\x92\x00\xdd\xff\xff\xff\xff", KvDecodeError::Truncated),
        // 70000 events declared (over MAX_EVENTS) in 3 bytes of header.
        (b"\x92\x00\xdd\x00\x01\x11\x70", KvDecodeError::Truncated),
    ];
    for (bytes, want) in cases {
        assert_eq!(decode_batch(bytes), Err(*want), "{bytes:x?}");
    }
}

#[test]
fn unknown_values_nested_too_deep_are_refused() {
    // ["X", [[[[...]]]]] inside one event: skipping stops at the depth bound.
    let mut p = vec![0x92, 0x00, 0x91, 0x92, 0xa1, b'X'];
    p.extend(core::iter::repeat_n(0x91, 40));
    p.push(0xc0);
    assert_eq!(decode_batch(&p), Err(KvDecodeError::TooDeep));
}

#[test]
fn topics() {
    assert_eq!(
        parse_topic(b"kv@pod-1@meta-llama/Llama-3.1-8B"),
        Some(Topic {
            pod: "pod-1",
            model: "meta-llama/Llama-3.1-8B"
        })
    );
    assert_eq!(
        parse_topic(b"kv@p@m@x"),
        Some(Topic {
            pod: "p",
            model: "m@x"
        })
    );
    for bad in [
        &b""[..],
        b"kv",
        b"kv@",
        b"kv@pod",
        b"kv@pod@",
        b"kv@@m",
        b"kv-events",
        b"xx@p@m",
        b"kv@p\xff@m",
    ] {
        assert_eq!(parse_topic(bad), None, "{bad:?}");
    }
}

/// A minimal MessagePack writer for the round-trip properties.
mod enc {
    use alloc::vec::Vec;

    pub fn uint(o: &mut Vec<u8>, v: u64) {
        match v {
            0..=0x7f => o.push(v as u8),
            0x80..=0xff => o.extend_from_slice(&[0xcc, v as u8]),
            0x100..=0xffff => {
                o.push(0xcd);
                o.extend_from_slice(&(v as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                o.push(0xce);
                o.extend_from_slice(&(v as u32).to_be_bytes());
            }
            _ => {
                o.push(0xcf);
                o.extend_from_slice(&v.to_be_bytes());
            }
        }
    }
    pub fn array(o: &mut Vec<u8>, n: usize) {
        if n < 16 {
            o.push(0x90 | n as u8);
        } else {
            o.push(0xdd);
            o.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    pub fn map(o: &mut Vec<u8>, n: usize) {
        if n < 16 {
            o.push(0x80 | n as u8);
        } else {
            o.push(0xdf);
            o.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    pub fn str(o: &mut Vec<u8>, s: &str) {
        if s.len() < 32 {
            o.push(0xa0 | s.len() as u8);
        } else {
            o.push(0xd9);
            o.push(s.len() as u8);
        }
        o.extend_from_slice(s.as_bytes());
    }
    pub fn nil(o: &mut Vec<u8>) {
        o.push(0xc0);
    }
    pub fn f64(o: &mut Vec<u8>, x: f64) {
        o.push(0xcb);
        o.extend_from_slice(&x.to_be_bytes());
    }
}

/// Encodes `batch` as vLLM would: positional (older releases) or tagged maps (newer).
fn encode(batch: &KvEventBatch, maps: bool) -> Vec<u8> {
    let mut o = Vec::new();
    enc::array(&mut o, 3);
    enc::f64(&mut o, batch.ts);
    enc::array(&mut o, batch.events.len());
    for ev in &batch.events {
        let hashes = |o: &mut Vec<u8>, hs: &[EngineBlockHash]| {
            enc::array(o, hs.len());
            for h in hs {
                enc::uint(o, h.0);
            }
        };
        let field = |o: &mut Vec<u8>, name: &str| {
            if maps {
                enc::str(o, name);
            }
        };
        let (tag, n) = match ev {
            KvEvent::BlockStored { .. } => ("BlockStored", 7),
            KvEvent::BlockRemoved { .. } => ("BlockRemoved", 2),
            KvEvent::AllBlocksCleared => ("AllBlocksCleared", 0),
        };
        if maps {
            enc::map(&mut o, n + 1);
            enc::str(&mut o, "type");
        } else {
            enc::array(&mut o, n + 1);
        }
        enc::str(&mut o, tag);
        match ev {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_name,
            } => {
                field(&mut o, "block_hashes");
                hashes(&mut o, block_hashes);
                field(&mut o, "parent_block_hash");
                match parent {
                    Some(p) => enc::uint(&mut o, p.0),
                    None => enc::nil(&mut o),
                }
                field(&mut o, "token_ids");
                enc::array(&mut o, token_ids.len());
                for t in token_ids {
                    enc::uint(&mut o, u64::from(*t));
                }
                field(&mut o, "block_size");
                enc::uint(&mut o, u64::from(*block_size));
                field(&mut o, "lora_id");
                enc::nil(&mut o);
                field(&mut o, "medium");
                enc::str(&mut o, "GPU");
                field(&mut o, "lora_name");
                match lora_name {
                    Some(l) => enc::str(&mut o, l),
                    None => enc::nil(&mut o),
                }
            }
            KvEvent::BlockRemoved { block_hashes } => {
                field(&mut o, "block_hashes");
                hashes(&mut o, block_hashes);
                field(&mut o, "medium");
                enc::nil(&mut o);
            }
            KvEvent::AllBlocksCleared => {}
        }
    }
    match batch.dp_rank {
        Some(d) => enc::uint(&mut o, u64::from(d)),
        None => enc::nil(&mut o),
    }
    o
}

fn hash() -> impl Strategy<Value = EngineBlockHash> {
    any::<u64>().prop_map(EngineBlockHash)
}

fn event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        (
            proptest::collection::vec(hash(), 0..20),
            proptest::option::of(hash()),
            proptest::collection::vec(any::<u32>(), 0..70),
            0u32..100_000,
            proptest::option::of("[a-z0-9/-]{0,40}"),
        )
            .prop_map(|(block_hashes, parent, token_ids, block_size, lora_name)| {
                KvEvent::BlockStored {
                    block_hashes,
                    parent,
                    token_ids,
                    block_size,
                    lora_name,
                }
            }),
        proptest::collection::vec(hash(), 0..20)
            .prop_map(|block_hashes| KvEvent::BlockRemoved { block_hashes }),
        Just(KvEvent::AllBlocksCleared),
    ]
}

fn batch() -> impl Strategy<Value = KvEventBatch> {
    (
        -1e12f64..1e12,
        proptest::collection::vec(event(), 0..20),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(ts, events, dp_rank)| KvEventBatch {
            ts,
            events,
            dp_rank,
        })
}

proptest! {
    #[test]
    fn both_encodings_round_trip(b in batch(), maps in any::<bool>()) {
        let bytes = encode(&b, maps);
        prop_assert_eq!(decode_batch(&bytes), Ok(b));
    }

    #[test]
    fn truncated_or_corrupted_payloads_never_panic(
        b in batch(),
        maps in any::<bool>(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let bytes = encode(&b, maps);
        let cut = cut.index(bytes.len());
        prop_assert!(decode_batch(&bytes[..cut]).is_err());
        let mut corrupted = bytes.clone();
        let i = flip.index(corrupted.len());
        corrupted[i] = byte;
        if let Ok(d) = decode_batch(&corrupted) {
            prop_assert!(d.events.len() <= corrupted.len());
        }
    }

    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(d) = decode_batch(&bytes) {
            prop_assert!(d.events.len() <= bytes.len());
        }
    }
}
