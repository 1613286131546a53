//! Tests of the snapshot codec: layout, typed errors, the cache, and properties (round
//! trip; no panic on arbitrary bytes, truncations or bit flips).

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

use super::codec::decode_checked;
use super::*;
use crate::metrics::{CacheConfig, EndpointMetrics, LoraState};
use crate::types::Millis;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn sample_snapshot() -> Snapshot {
    Snapshot {
        taken_at: Millis(1_756_392_103_456),
        clusters: Vec::new(),
        endpoints: vec![
            EndpointSample {
                address: "10.0.0.1:8000".to_string(),
                scraped_at: Millis(1_756_392_103_400),
                consecutive_failures: 0,
                metrics: Some(EndpointMetrics {
                    waiting: Some(3),
                    running: Some(7),
                    kv_cache_usage: Some(0.4183),
                    cache: Some(CacheConfig {
                        block_size: 16,
                        num_blocks: 27_544,
                    }),
                    lora: Some(LoraState {
                        max: 4,
                        running: vec!["sql-lora".to_string(), "summarize-lora".to_string()],
                        waiting: vec!["tweet-lora".to_string()],
                    }),
                }),
            },
            EndpointSample {
                address: "10.0.0.2:8000".to_string(),
                scraped_at: Millis(1_756_392_100_000),
                consecutive_failures: 3,
                metrics: None,
            },
            EndpointSample {
                address: "[fd00::1]:8000".to_string(),
                scraped_at: Millis(1_756_392_103_000),
                consecutive_failures: 1,
                metrics: Some(EndpointMetrics {
                    kv_cache_usage: Some(0.0),
                    ..EndpointMetrics::default()
                }),
            },
        ],
    }
}

#[test]
fn round_trip_and_header() {
    let snap = sample_snapshot();
    let bytes = encode_with_generation(&snap, 42);
    assert_eq!(bytes.get(..4), Some(&MAGIC[..]));
    assert_eq!(bytes.get(4), Some(&VERSION));
    let header = read_header(&bytes).unwrap();
    assert_eq!(header.generation, 42);
    assert_eq!(header.taken_at, snap.taken_at);
    assert_eq!(header.endpoint_count, 3);
    let (h2, back) = decode_with_header(&bytes).unwrap();
    assert_eq!(h2, header);
    assert_eq!(back, snap);
    assert_eq!(decode(&encode(&snap)).unwrap(), snap);
}

#[test]
fn layout_is_little_endian_and_compact() {
    let snap = Snapshot {
        taken_at: Millis(0x0102_0304_0506_0708),
        clusters: Vec::new(),
        endpoints: vec![EndpointSample {
            address: "a:1".to_string(),
            scraped_at: Millis(5),
            consecutive_failures: 2,
            metrics: Some(EndpointMetrics {
                waiting: Some(9),
                ..EndpointMetrics::default()
            }),
        }],
    };
    let bytes = encode_with_generation(&snap, 1);
    assert_eq!(bytes.get(5..13), Some(&1u64.to_le_bytes()[..]));
    assert_eq!(bytes.get(13..21), Some(&[8, 7, 6, 5, 4, 3, 2, 1][..]));
    assert_eq!(bytes.get(21..25), Some(&1u32.to_le_bytes()[..]));
    let body: Vec<u8> = [
        &[3, 0][..],
        b"a:1",
        &5u64.to_le_bytes(),
        &2u32.to_le_bytes(),
        &[0b0000_0011],
        &9u32.to_le_bytes(),
        &0u32.to_le_bytes(), // no clusters
    ]
    .concat();
    assert_eq!(bytes.get(HEADER_LEN..), Some(&body[..]));
}

#[test]
fn empty_snapshot() {
    let snap = Snapshot::default();
    let bytes = encode(&snap);
    assert_eq!(bytes.len(), HEADER_LEN + 4);
    assert_eq!(decode(&bytes).unwrap(), snap);
    // The version 1 layout (no cluster section) is not read as this one.
    let mut v1 = bytes[..HEADER_LEN].to_vec();
    v1[4] = 1;
    reseal(&mut v1);
    assert_eq!(decode(&v1), Err(SnapshotError::UnsupportedVersion(1)));
}

fn with_clusters() -> Snapshot {
    let mut snap = sample_snapshot();
    snap.clusters = vec![
        ClusterMembers {
            cluster: "pool-a".to_string(),
            members: vec![
                Member {
                    address: "10.0.0.1:8000".to_string(),
                    health: Health::Healthy,
                },
                Member {
                    address: "10.0.0.2:8000".to_string(),
                    health: Health::Unhealthy,
                },
                Member {
                    address: "[fd00::1]:8000".to_string(),
                    health: Health::Degraded,
                },
            ],
        },
        ClusterMembers {
            cluster: "empty".to_string(),
            members: Vec::new(),
        },
    ];
    snap
}

#[test]
fn clusters_round_trip_and_are_laid_out_after_the_endpoints() {
    let snap = with_clusters();
    let bytes = encode(&snap);
    assert_eq!(decode(&bytes).unwrap(), snap);
    assert_eq!(snap.cluster("pool-a").map(|c| c.members.len()), Some(3));
    assert!(snap.cluster("other").is_none());
    let tail: Vec<u8> = [
        &2u32.to_le_bytes()[..],
        &[6, 0],
        b"pool-a",
        &3u32.to_le_bytes(),
        &[13, 0],
        b"10.0.0.1:8000",
        &[0],
        &[13, 0],
        b"10.0.0.2:8000",
        &[2],
        &[14, 0],
        b"[fd00::1]:8000",
        &[1],
        &[5, 0],
        b"empty",
        &0u32.to_le_bytes(),
    ]
    .concat();
    assert!(bytes.ends_with(&tail));
    // Without the clusters, the endpoints' bytes are the same.
    let plain = encode(&sample_snapshot());
    assert_eq!(
        bytes.get(HEADER_LEN..bytes.len() - tail.len()),
        plain.get(HEADER_LEN..plain.len() - 4)
    );
    assert!(Health::Degraded.is_candidate() && !Health::Unhealthy.is_candidate());
}

#[test]
fn cluster_section_errors() {
    let bytes = encode(&with_clusters());
    // The health byte of the first member (see the layout above), set out of range.
    let at = bytes.len() - 45;
    assert_eq!(bytes[at], 0);
    let mut bad = bytes.clone();
    bad[at] = 3;
    assert_eq!(
        decode_checked(&bad, false, &mut Snapshot::default()),
        Err(SnapshotError::BadHealth(3))
    );
    // A cluster count of four billion over a few bytes.
    let mut huge = encode(&Snapshot::default());
    let n = huge.len();
    huge[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode_checked(&huge, false, &mut Snapshot::default()),
        Err(SnapshotError::CountTooLarge)
    );
    // A member count past the bytes left.
    let mut members = encode(&Snapshot::default());
    let n = members.len();
    members[n - 4..].copy_from_slice(&1u32.to_le_bytes());
    members.extend_from_slice(&[1, 0, b'c']);
    members.extend_from_slice(&1_000u32.to_le_bytes());
    members.extend_from_slice(&[0; 9]);
    assert_eq!(
        decode_checked(&members, false, &mut Snapshot::default()),
        Err(SnapshotError::CountTooLarge)
    );
    // No cluster count at all.
    let empty = encode(&Snapshot::default());
    assert_eq!(
        decode_checked(&empty[..HEADER_LEN], false, &mut Snapshot::default()),
        Err(SnapshotError::Truncated)
    );
}

#[test]
fn typed_errors() {
    let good = encode(&sample_snapshot());
    assert_eq!(decode(b""), Err(SnapshotError::Truncated));
    assert_eq!(decode(b"IGS"), Err(SnapshotError::Truncated));
    assert_eq!(decode(b"NOPE and more bytes"), Err(SnapshotError::BadMagic));

    let mut v3 = good.clone();
    v3[4] = 3;
    assert_eq!(decode(&v3), Err(SnapshotError::UnsupportedVersion(3)));
    assert_eq!(read_header(&v3), Err(SnapshotError::UnsupportedVersion(3)));

    assert_eq!(
        decode(&good[..HEADER_LEN - 1]),
        Err(SnapshotError::Truncated)
    );

    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    assert_eq!(decode(&flipped), Err(SnapshotError::BadChecksum));

    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        decode_checked(&trailing, false, &mut Snapshot::default()),
        Err(SnapshotError::TrailingBytes(1))
    );

    // A header claiming a billion endpoints over a few bytes is refused before allocating.
    let mut huge = encode(&Snapshot::default());
    huge[21..25].copy_from_slice(&1_000_000_000u32.to_le_bytes());
    assert_eq!(
        decode_checked(&huge, false, &mut Snapshot::default()),
        Err(SnapshotError::CountTooLarge)
    );
}

fn one_endpoint_body(address: &[u8], flags: u8, tail: &[u8]) -> Vec<u8> {
    let mut bytes = encode(&Snapshot::default());
    bytes.truncate(HEADER_LEN);
    bytes[21..25].copy_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&(address.len() as u16).to_le_bytes());
    bytes.extend_from_slice(address);
    bytes.extend_from_slice(&[0; 12]);
    bytes.push(flags);
    bytes.extend_from_slice(tail);
    bytes
}

#[test]
fn structural_errors_in_endpoints() {
    let bad_utf8 = one_endpoint_body(b"\xff\xfe", 0, &[]);
    assert_eq!(
        decode_checked(&bad_utf8, false, &mut Snapshot::default()),
        Err(SnapshotError::BadUtf8)
    );
    let reserved = one_endpoint_body(b"a", 0b1000_0001, &[]);
    assert_eq!(
        decode_checked(&reserved, false, &mut Snapshot::default()),
        Err(SnapshotError::BadFlags(0b1000_0001))
    );
    let orphan = one_endpoint_body(b"a", 0b0000_0010, &[0; 4]);
    assert_eq!(
        decode_checked(&orphan, false, &mut Snapshot::default()),
        Err(SnapshotError::BadFlags(0b0000_0010))
    );
    let short = one_endpoint_body(b"a", 0b0000_0011, &[1, 2]);
    assert_eq!(
        decode_checked(&short, false, &mut Snapshot::default()),
        Err(SnapshotError::Truncated)
    );
    // LoRA list claiming 60 000 adapters in 4 bytes.
    let lora = one_endpoint_body(b"a", 0b0010_0001, &[4, 0, 0, 0, 0x60, 0xea, 0, 0]);
    assert_eq!(
        decode_checked(&lora, false, &mut Snapshot::default()),
        Err(SnapshotError::CountTooLarge)
    );
}

#[test]
fn freshness() {
    let sample = EndpointSample {
        scraped_at: Millis(10_000),
        metrics: Some(EndpointMetrics::default()),
        ..EndpointSample::default()
    };
    assert!(sample.is_fresh(Millis(10_000), DEFAULT_MAX_AGE_MS));
    assert!(sample.is_fresh(Millis(11_000), DEFAULT_MAX_AGE_MS));
    assert!(!sample.is_fresh(Millis(11_001), DEFAULT_MAX_AGE_MS));
    assert!(
        sample.is_fresh(Millis(9_000), 0),
        "a future scrape time counts as fresh"
    );
    assert!(sample.fresh_metrics(Millis(10_500), 1_000).is_some());
    assert!(sample.fresh_metrics(Millis(12_000), 1_000).is_none());
    let never = EndpointSample::default();
    assert!(never.fresh_metrics(Millis(0), 1_000).is_none());
}

#[test]
fn cache_skips_unchanged_bytes() {
    let mut cache = SnapshotCache::default();
    assert!(cache.snapshot().endpoints.is_empty());
    let snap = sample_snapshot();
    let first = encode_with_generation(&snap, 1);
    assert_eq!(cache.update(&first), Ok(true));
    assert_eq!(cache.snapshot(), &snap);
    assert_eq!(cache.update(&first), Ok(false));
    // Same generation and time but different content: the body hash tells them apart.
    let mut changed = snap.clone();
    changed.endpoints[1].consecutive_failures = 4;
    assert_eq!(cache.update(&encode_with_generation(&changed, 1)), Ok(true));
    assert_eq!(cache.snapshot(), &changed);
    // Garbage keeps the previous snapshot.
    assert_eq!(cache.update(b"garbage!"), Err(SnapshotError::BadMagic));
    assert_eq!(cache.snapshot(), &changed);
    assert_eq!(cache.header().map(|h| h.generation), Some(1));
}

#[test]
fn encoder_cuts_overlong_strings_on_a_char_boundary() {
    let long: String = "é".repeat(40_000); // 80 000 bytes
    let snap = Snapshot {
        taken_at: Millis(1),
        clusters: Vec::new(),
        endpoints: vec![EndpointSample {
            address: long,
            ..EndpointSample::default()
        }],
    };
    let back = decode(&encode(&snap)).unwrap();
    let address = &back.endpoints[0].address;
    assert_eq!(address.len(), 65_534);
    assert!(address.chars().all(|c| c == 'é'));
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9a-f.:\\[\\]]{0,24}", any::<String>()]
}

fn arb_metrics() -> impl Strategy<Value = EndpointMetrics> {
    let lora = (
        any::<u32>(),
        prop::collection::vec(arb_string(), 0..4),
        prop::collection::vec(arb_string(), 0..4),
    )
        .prop_map(|(max, running, waiting)| LoraState {
            max,
            running,
            waiting,
        });
    let cache = (any::<u32>(), any::<u64>()).prop_map(|(block_size, num_blocks)| CacheConfig {
        block_size,
        num_blocks,
    });
    (
        prop::option::of(any::<u32>()),
        prop::option::of(any::<u32>()),
        prop::option::of(prop::num::f64::NORMAL | prop::num::f64::ZERO | prop::num::f64::INFINITE),
        prop::option::of(cache),
        prop::option::of(lora),
    )
        .prop_map(
            |(waiting, running, kv_cache_usage, cache, lora)| EndpointMetrics {
                waiting,
                running,
                kv_cache_usage,
                cache,
                lora,
            },
        )
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    let endpoint = (
        arb_string(),
        any::<u64>(),
        any::<u32>(),
        prop::option::of(arb_metrics()),
    )
        .prop_map(
            |(address, scraped_at, consecutive_failures, metrics)| EndpointSample {
                address,
                scraped_at: Millis(scraped_at),
                consecutive_failures,
                metrics,
            },
        );
    let health = prop_oneof![
        Just(Health::Healthy),
        Just(Health::Degraded),
        Just(Health::Unhealthy)
    ];
    let member = (arb_string(), health).prop_map(|(address, health)| Member { address, health });
    let cluster = (arb_string(), prop::collection::vec(member, 0..6))
        .prop_map(|(cluster, members)| ClusterMembers { cluster, members });
    (
        any::<u64>(),
        prop::collection::vec(endpoint, 0..12),
        prop::collection::vec(cluster, 0..4),
    )
        .prop_map(|(taken_at, endpoints, clusters)| Snapshot {
            taken_at: Millis(taken_at),
            clusters,
            endpoints,
        })
}

proptest! {
    #[test]
    fn encode_decode_round_trip(snap in arb_snapshot(), generation in any::<u64>()) {
        let bytes = encode_with_generation(&snap, generation);
        let (header, back) = decode_with_header(&bytes).unwrap();
        prop_assert_eq!(header.generation, generation);
        prop_assert_eq!(header.endpoint_count as usize, snap.endpoints.len());
        prop_assert_eq!(back, snap);
    }

    #[test]
    fn decode_into_a_used_snapshot_matches_a_fresh_decode(old in arb_snapshot(), new in arb_snapshot()) {
        let mut reused = old;
        let header = decode_into(&encode(&new), &mut reused).unwrap();
        prop_assert_eq!(header.endpoint_count as usize, new.endpoints.len());
        prop_assert_eq!(reused, new);
    }

    #[test]
    fn cache_always_shows_the_last_good_bytes(snaps in prop::collection::vec(arb_snapshot(), 1..5)) {
        let mut cache = SnapshotCache::default();
        for (generation, snap) in snaps.iter().enumerate() {
            let bytes = encode_with_generation(snap, generation as u64);
            prop_assert_eq!(cache.update(&bytes), Ok(true));
            prop_assert!(cache.update(b"IGSN\x09 bad").is_err());
            prop_assert_eq!(cache.snapshot(), snap);
        }
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
        let _ = decode_checked(&bytes, false, &mut Snapshot::default());
        let _ = read_header(&bytes);
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bodies(body in prop::collection::vec(any::<u8>(), 0..256), count in 0u32..64) {
        let mut bytes = encode(&Snapshot::default());
        bytes[21..25].copy_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&body);
        let _ = decode_checked(&bytes, false, &mut Snapshot::default());
    }

    #[test]
    fn every_truncation_is_an_error(snap in arb_snapshot()) {
        let bytes = encode(&snap);
        for len in 0..bytes.len() {
            prop_assert!(decode_checked(&bytes[..len], false, &mut Snapshot::default()).is_err(), "prefix {} of {}", len, bytes.len());
        }
    }

    #[test]
    fn bit_flips_never_panic(snap in arb_snapshot(), flips in prop::collection::vec(any::<prop::sample::Index>(), 1..4), bit in 0u8..8) {
        let mut bytes = encode(&snap);
        for at in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        // With the hash checked the flip is caught (or was in the header's identity fields);
        // without it the structural decoder must still answer, not panic.
        let _ = decode(&bytes);
        let _ = decode_checked(&bytes, false, &mut Snapshot::default());
    }
}
