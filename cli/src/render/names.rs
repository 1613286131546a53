//! Kubernetes names the renderer makes up: the `Service` that carries a pool's membership
//! on Istio and Envoy Gateway, and the gateway's `instance` (the prefix of the Wasm
//! module's shared-data keys and queue names).
//!
//! A Service name must be a DNS-1035 label (lowercase letters, digits and `-`, starting
//! with a letter, ending with a letter or digit, at most 63 characters), while an
//! `InferencePool` may be named with any DNS-1123 subdomain (up to 253 characters, dots,
//! a leading digit: `70b.llama`). [`service_name`] maps every such name to a valid label,
//! deterministically, and keeps distinct pools apart:
//!
//! - a name that is itself a DNS-1035 label of at most 53 characters keeps today's form,
//!   `<pool>-infergate`;
//! - any other name becomes `<base>-infergate-<hash>`: `base` the name lowercased, every
//!   character outside `[a-z0-9-]` replaced by `-`, a leading `p` when it does not start
//!   with a letter, cut to 42 characters without a trailing `-`; `hash` the first 10 hex
//!   digits of the SHA-256 of the original name.
//!
//! The two forms never meet (the first ends in `-infergate`, the second in hex digits,
//! which never spell it), the first is injective, and two names of the second form share
//! a Service only if their hashes' first 40 bits collide.

use sha2::{Digest, Sha256};

/// The longest DNS-1035 label.
pub const MAX_LABEL: usize = 63;

const SUFFIX: &str = "-infergate";
const HASH_HEX: usize = 10;

/// Whether `s` is a DNS-1035 label.
pub fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !b[b.len() - 1].is_ascii_uppercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The Service carrying the membership of the `InferencePool` named `pool` (see the module
/// documentation).
pub fn service_name(pool: &str) -> String {
    if is_dns1035_label(pool) && pool.len() + SUFFIX.len() <= MAX_LABEL {
        return format!("{pool}{SUFFIX}");
    }
    let digest = Sha256::digest(pool.as_bytes());
    let hash: String = digest
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(HASH_HEX)
        .map(|n| char::from_digit(u32::from(n), 16).unwrap_or('0'))
        .collect();
    let mut base: String = pool
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
        base.insert(0, 'p');
    }
    let room = MAX_LABEL - SUFFIX.len() - 1 - HASH_HEX;
    base.truncate(room);
    let base = base.trim_end_matches('-');
    format!("{base}{SUFFIX}-{hash}")
}

/// The gateway's instance, `<gateway-namespace>.<gateway-name>`: the prefix of the Wasm
/// module's shared-data keys and queue names (Istio gives every Wasm filter of a proxy the
/// same `vm_id ""`, so another gateway's or another vendor's keys may share the map).
pub fn instance(gateway_namespace: &str, gateway_name: &str) -> String {
    format!("{gateway_namespace}.{gateway_name}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn a_plain_short_name_keeps_todays_form() {
        assert_eq!(service_name("llama-70b-bf16"), "llama-70b-bf16-infergate");
    }

    #[test]
    fn dotted_leading_digit_and_long_names_become_labels() {
        for pool in [
            "70b.llama",
            "llama.70b",
            "a",
            "9",
            &"x".repeat(60),
            &"a.b-".repeat(64)[..253],
            "llama-70b-bf16-with-a-very-long-name-that-goes-past-fifty",
        ] {
            let svc = service_name(pool);
            assert!(is_dns1035_label(&svc), "{pool} -> {svc}");
        }
        let dotted = service_name("70b.llama");
        assert!(dotted.starts_with("p70b-llama-infergate-"), "{dotted}");
        assert_ne!(service_name("70b.llama"), service_name("70b-llama"));
        assert_ne!(service_name("a.b"), service_name("a-b"));
    }

    /// A DNS-1123 subdomain: dot-separated labels of `[a-z0-9-]`, each starting and ending
    /// alphanumeric, at most 253 characters in all.
    fn subdomain() -> impl Strategy<Value = String> {
        let label = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?";
        proptest::collection::vec(label, 1..12)
            .prop_map(|labels| labels.join("."))
            .prop_filter("at most 253 characters", |s| s.len() <= 253)
    }

    proptest! {
        #[test]
        fn every_subdomain_maps_to_a_label_deterministically(pool in subdomain()) {
            let svc = service_name(&pool);
            prop_assert!(is_dns1035_label(&svc), "{} -> {}", pool, svc);
            prop_assert_eq!(svc, service_name(&pool));
        }

        #[test]
        fn distinct_pools_get_distinct_services(pools in proptest::collection::hash_set(subdomain(), 1..40)) {
            let mut seen: HashMap<String, String> = HashMap::new();
            for p in pools {
                let svc = service_name(&p);
                if let Some(other) = seen.insert(svc.clone(), p.clone()) {
                    prop_assert!(false, "{} and {} both map to {}", other, p, svc);
                }
            }
        }
    }
}
