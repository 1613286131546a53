//! Envoy stats for the filters' [`StatKey`]s.
//!
//! Envoy only lets a dynamic module *define* metrics inside `on_http_filter_config_new`
//! (creation is frozen afterwards). A filter config knows every key its filter can emit (the
//! router's outcomes, each pool's endpoints and reasons), so the registry defines each of them
//! as a **label-less counter named by its flattened key** (`name.label1.value1...`, the same
//! names the Wasm flavour emits). Incrementing such a counter is one atomic add inside Envoy.
//! A labelled counter vector costs Envoy a stat-name build and a store lookup on every
//! increment: about 2 µs each, some 13 µs per request with the picker's and router's six
//! increments (measured with `cargo xtask bench overhead`). The scraper's counters and
//! gauges are defined the same way on each filter config that hosts it (`crate::scraper`).
//!
//! Each family is also defined as a counter vector, the fallback for a key that was not known
//! at config time (the resulting stat has the same flattened name). A key of an unknown
//! family is dropped: stats are best effort and must never fail a request. The list of
//! families is the filters crate's [`FAMILIES`], so a family added there is defined here
//! without a change to this adapter.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use ahash::AHasher;

use infergate_filters::stats::{StatKey, StatKind, FAMILIES};

/// Something that can define metric families (an Envoy config object during its creation).
pub trait DefineMetric {
    /// Defines one family; returns Envoy's id, or `None` if Envoy refused.
    fn define(&mut self, kind: StatKind, name: &str, labels: &[&str]) -> Option<usize>;
}

/// Envoy ids of every family, defined on one config object.
pub struct StatsRegistry {
    /// `(family index, Envoy metric id)` for every family Envoy accepted.
    ids: Vec<(usize, usize)>,
    /// Envoy kind and id of the label-less metrics, by flattened key. Looked up on every
    /// increment, so with a fast hash (the keys come from configuration, not clients).
    scalars: HashMap<String, (StatKind, usize), BuildHasherDefault<AHasher>>,
}

impl StatsRegistry {
    /// Defines every family, and every key of `keys` as a label-less metric of its kind, on
    /// the config being created.
    pub fn define(envoy: &mut dyn DefineMetric, keys: &[(StatKind, &StatKey)]) -> StatsRegistry {
        let ids: Vec<(usize, usize)> = FAMILIES
            .iter()
            .enumerate()
            .filter_map(|(i, f)| envoy.define(f.kind, f.name, f.labels).map(|id| (i, id)))
            .collect();
        let scalars = keys
            .iter()
            .filter_map(|&(kind, key)| {
                let id = if key.label_values().is_empty() {
                    // A key without labels is its family, already defined as a plain
                    // metric above: mapped here too, so it resolves in one lookup.
                    let family = FAMILIES.iter().position(|f| f.name == key.as_str())?;
                    ids.iter().find(|(f, _)| *f == family)?.1
                } else {
                    envoy.define(kind, key.as_str(), &[])?
                };
                Some((key.as_str().to_owned(), (kind, id)))
            })
            .collect();
        StatsRegistry { ids, scalars }
    }

    /// Resolves `key` of kind `kind` to `(Envoy id, label values)`; `None` for unknown keys.
    /// A key defined as a label-less counter resolves to it, with no label values.
    pub fn resolve<'k>(&self, kind: StatKind, key: &'k StatKey) -> Option<(usize, Vec<&'k str>)> {
        if let Some(&(scalar_kind, id)) = self.scalars.get(key.as_str()) {
            if scalar_kind == kind {
                return Some((id, Vec::new()));
            }
        }
        let (family, values) = split_key(key.as_str())?;
        if FAMILIES.get(family).map(|f| f.kind) != Some(kind) {
            return None;
        }
        let &(_, id) = self.ids.iter().find(|(f, _)| *f == family)?;
        Some((id, values))
    }
}

/// Splits a flattened key into its family index and label values.
fn split_key(key: &str) -> Option<(usize, Vec<&str>)> {
    FAMILIES.iter().enumerate().find_map(|(i, family)| {
        let rest = key.strip_prefix(family.name)?;
        if family.labels.is_empty() {
            return rest.is_empty().then_some((i, Vec::new()));
        }
        let rest = rest.strip_prefix('.')?;
        let mut values = Vec::with_capacity(family.labels.len());
        let mut parts = rest.split('.');
        for label in family.labels {
            if parts.next()? != *label {
                return None;
            }
            values.push(parts.next()?);
        }
        parts.next().is_none().then_some((i, values))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_back_into_family_and_values() {
        let key = StatKey::new(
            "infergate.picker.picks",
            &[("pool", "a"), ("endpoint", "10.0.0.1:8000")],
        );
        let (family, values) = split_key(key.as_str()).unwrap_or((usize::MAX, Vec::new()));
        assert_eq!(
            FAMILIES.get(family).map(|f| f.name),
            Some("infergate.picker.picks")
        );
        assert_eq!(values, vec!["a", "10_0_0_1_8000"]);
    }

    #[test]
    fn unknown_or_malformed_keys_are_rejected() {
        assert!(split_key("infergate.router.requests").is_none());
        assert!(split_key("infergate.router.requests.outcome").is_none());
        assert!(split_key("infergate.router.requests.reason.x").is_none());
        assert!(split_key("infergate.router.requests.outcome.x.extra.y").is_none());
        assert!(split_key("something.else").is_none());
        let ok = StatKey::new("infergate.router.requests", &[("outcome", "routed")]);
        assert!(split_key(ok.as_str()).is_some());
        assert!(split_key("infergate.scraper.publishes.extra").is_none());
    }

    /// Records what the registry defines; ids are definition order.
    #[derive(Default)]
    struct Recorder {
        defined: Vec<(StatKind, String, Vec<String>)>,
    }

    impl DefineMetric for Recorder {
        fn define(&mut self, kind: StatKind, name: &str, labels: &[&str]) -> Option<usize> {
            let labels = labels.iter().map(|l| (*l).to_owned()).collect();
            self.defined.push((kind, name.to_owned(), labels));
            Some(self.defined.len() - 1)
        }
    }

    #[test]
    fn every_filters_family_is_defined_and_resolves() {
        let mut envoy = Recorder::default();
        let registry = StatsRegistry::define(&mut envoy, &[]);
        assert_eq!(envoy.defined.len(), FAMILIES.len());
        for (family, (kind, name, labels)) in FAMILIES.iter().zip(&envoy.defined) {
            assert_eq!((family.kind, family.name), (*kind, name.as_str()));
            assert_eq!(family.labels, labels.as_slice());
        }
        let gauge = StatKey::new(
            "infergate.scraper.consecutive_failures",
            &[("endpoint", "e")],
        );
        let expected = envoy
            .defined
            .iter()
            .position(|(_, n, _)| n == "infergate.scraper.consecutive_failures");
        assert_eq!(
            registry.resolve(StatKind::Gauge, &gauge).map(|(id, _)| id),
            expected
        );
        assert!(registry.resolve(StatKind::Counter, &gauge).is_none());
    }

    #[test]
    fn keys_known_at_config_time_are_label_less_counters_and_others_fall_back() {
        let mut envoy = Recorder::default();
        let routed = StatKey::new("infergate.router.requests", &[("outcome", "routed")]);
        let registry = StatsRegistry::define(&mut envoy, &[(StatKind::Counter, &routed)]);
        let scalar = envoy
            .defined
            .iter()
            .position(|(_, n, l)| n == "infergate.router.requests.outcome.routed" && l.is_empty());
        assert!(scalar.is_some(), "{:?}", envoy.defined);
        assert_eq!(
            registry.resolve(StatKind::Counter, &routed),
            scalar.map(|id| (id, Vec::new()))
        );
        // A key not listed at config time still counts, through its family's vector.
        let other = StatKey::new("infergate.router.requests", &[("outcome", "too_large")]);
        let family = envoy
            .defined
            .iter()
            .position(|(_, n, _)| n == "infergate.router.requests");
        assert_eq!(
            registry.resolve(StatKind::Counter, &other),
            family.map(|id| (id, vec!["too_large"]))
        );
    }

    #[test]
    fn label_less_keys_resolve() {
        let key = StatKey::new("infergate.scraper.publishes", &[]);
        let (family, values) = split_key(key.as_str()).unwrap_or((usize::MAX, vec!["x"]));
        assert_eq!(
            FAMILIES.get(family).map(|f| f.name),
            Some("infergate.scraper.publishes")
        );
        assert!(values.is_empty());
    }

    #[test]
    fn label_less_keys_known_at_config_time_are_their_family() {
        let mut envoy = Recorder::default();
        let key = StatKey::new("infergate.scraper.publishes", &[]);
        let registry = StatsRegistry::define(&mut envoy, &[(StatKind::Counter, &key)]);
        assert_eq!(envoy.defined.len(), FAMILIES.len(), "nothing defined twice");
        let family = envoy
            .defined
            .iter()
            .position(|(_, n, _)| n == "infergate.scraper.publishes");
        assert!(registry.scalars.contains_key(key.as_str()));
        assert_eq!(
            registry.resolve(StatKind::Counter, &key),
            family.map(|id| (id, Vec::new()))
        );
        assert!(registry.resolve(StatKind::Gauge, &key).is_none());
    }
}
