//! Envoy stats for the filters' [`StatKey`]s.
//!
//! Envoy only lets a dynamic module *define* metrics inside `on_http_filter_config_new`
//! (creation is frozen afterwards). A filter config knows every key its filter can emit (the
//! router's outcomes, each pool's endpoints and reasons), so the registry defines each of them
//! as a **label-less counter named by its flattened key** (`name.label1.value1...`, the same
//! names the Wasm flavour emits), which Envoy moves with one atomic add. A labelled counter
//! vector costs Envoy a stat-name build and a store lookup on every update (about 2 µs
//! each, measured with `cargo xtask bench overhead`). The scraper's counters and gauges are
//! defined the same way on each filter config that hosts it (`crate::scraper`), and go to
//! Envoy at once (the scraper runs on the main thread, not per request).
//!
//! Each family is also defined as a counter vector, the fallback for a key that was not known
//! at config time (the resulting stat has the same flattened name). A key of an unknown
//! family is dropped: stats are best effort and must never fail a request. The list of
//! families is the filters crate's [`FAMILIES`], so a family added there is defined here
//! without a change to this adapter.
//!
//! **Buffered, flushed on the main thread.** A request does not call into Envoy for its
//! counters and gauges: it adds to this registry's pending moves (an atomic add on the
//! key's slot for a key known at config time; a short lock on a map for any other, such as
//! the per-endpoint keys of a pool that follows its cluster's membership, the case of every
//! Istio and Envoy Gateway render). [`StatsRegistry::flush`] hands what accumulated to
//! Envoy, one call per key that moved, on the main thread's flush event (`crate::flush`,
//! every [`crate::flush::FLUSH_PERIOD`], and once more as Envoy destroys the config), so
//! Envoy's stats trail the requests by at most that. A gauge set and a gauge moved are both
//! kept: a flush applies the last value set, then the sum of the moves since (a move made on
//! one thread while another sets the same gauge may land on either side of the set; the
//! filters never both set and move one key in this flavour). A config whose flush could not
//! be set up moves Envoy's stats at once. Histograms are recorded at once: a sample is not a
//! sum.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ahash::AHasher;

use infergate_filters::stats::{StatKey, StatKind, FAMILIES};

/// Something that can define metric families (an Envoy config object during its creation).
pub trait DefineMetric {
    /// Defines one family; returns Envoy's id, or `None` if Envoy refused.
    fn define(&mut self, kind: StatKind, name: &str, labels: &[&str]) -> Option<usize>;
}

/// Where a flush hands the pending moves: Envoy's config object on the main thread
/// (`crate::flush::ConfigMetrics`), or a recorder in tests.
pub trait MetricSink {
    /// Adds `value` to counter `id` with `labels`.
    fn counter_add(&mut self, id: usize, labels: &[&str], value: u64);
    /// Sets gauge `id` with `labels` to `value`.
    fn gauge_set(&mut self, id: usize, labels: &[&str], value: u64);
    /// Moves gauge `id` with `labels` by `delta`.
    fn gauge_add(&mut self, id: usize, labels: &[&str], delta: i64);
}

/// A gauge's pending value when none was set since the last flush (a set of this value
/// is kept as one less).
const NOT_SET: u64 = u64::MAX;

/// What one metric did since the last flush.
#[derive(Debug)]
struct Pending {
    /// A counter's increments, or a gauge's moves as a two's-complement sum.
    delta: AtomicU64,
    /// The value a gauge was last set to, or [`NOT_SET`].
    set: AtomicU64,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            delta: AtomicU64::new(0),
            set: AtomicU64::new(NOT_SET),
        }
    }
}

impl Pending {
    fn record(&self, update: Update) {
        match update {
            Update::Add(delta) => {
                self.delta.fetch_add(delta, Ordering::Relaxed);
            }
            Update::Set(value) => {
                // A set supersedes the moves before it.
                self.delta.store(0, Ordering::Relaxed);
                self.set.store(value.min(NOT_SET - 1), Ordering::Relaxed);
            }
        }
    }

    /// Hands what accumulated to `sink` as metric `id` of `kind`, and starts again.
    fn drain(&self, kind: StatKind, id: usize, labels: &[&str], sink: &mut dyn MetricSink) {
        let set = self.set.swap(NOT_SET, Ordering::Relaxed);
        let delta = self.delta.swap(0, Ordering::Relaxed);
        match kind {
            StatKind::Counter if delta != 0 => sink.counter_add(id, labels, delta),
            StatKind::Gauge => {
                if set != NOT_SET {
                    sink.gauge_set(id, labels, set);
                }
                // Moves are summed in two's complement: the bits are the signed sum.
                let moved = delta as i64;
                if moved != 0 {
                    sink.gauge_add(id, labels, moved);
                }
            }
            _ => {}
        }
    }
}

/// One counter or gauge update, as buffered.
#[derive(Clone, Copy, Debug)]
enum Update {
    /// Add to a counter, or move a gauge (two's complement).
    Add(u64),
    /// Set a gauge.
    Set(u64),
}

/// A key known at config time: its Envoy metric and what it did since the last flush.
#[derive(Debug)]
struct Scalar {
    kind: StatKind,
    id: usize,
    pending: Pending,
}

/// Envoy ids of every family, defined on one config object, and the counter and gauge
/// moves not yet flushed to them.
pub struct StatsRegistry {
    /// `(family index, Envoy metric id)` for every family Envoy accepted.
    ids: Vec<(usize, usize)>,
    /// The label-less metrics, by flattened key. Looked up on every update, so with a
    /// fast hash (the keys come from configuration, not clients).
    scalars: HashMap<String, Scalar, BuildHasherDefault<AHasher>>,
    /// Whether updates wait for [`StatsRegistry::flush`] (else they go to Envoy at once).
    buffered: bool,
    /// Moves of keys not known at config time, by flattened key (with the kind of their
    /// first update); emptied by every flush, so keys that stop moving (endpoints gone)
    /// leave no trace.
    others: Mutex<HashMap<String, (StatKind, Pending), BuildHasherDefault<AHasher>>>,
}

impl StatsRegistry {
    /// Defines every family, and every key of `keys` as a label-less metric of its kind, on
    /// the config being created. With `buffered`, counter and gauge updates wait for
    /// [`StatsRegistry::flush`].
    pub fn define(
        envoy: &mut dyn DefineMetric,
        keys: &[(StatKind, &StatKey)],
        buffered: bool,
    ) -> StatsRegistry {
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
                let scalar = Scalar {
                    kind,
                    id,
                    pending: Pending::default(),
                };
                Some((key.as_str().to_owned(), scalar))
            })
            .collect();
        StatsRegistry {
            ids,
            scalars,
            buffered,
            others: Mutex::new(HashMap::default()),
        }
    }

    /// Whether updates wait for a flush.
    pub fn buffered(&self) -> bool {
        self.buffered
    }

    /// Adds `delta` to counter `key` (buffered; see the module doc).
    pub fn counter_add(&self, key: &StatKey, delta: u64) {
        self.buffer(StatKind::Counter, key, Update::Add(delta));
    }

    /// Moves gauge `key` by `delta` (buffered).
    pub fn gauge_add(&self, key: &StatKey, delta: i64) {
        // Two's complement: adding the bits of a negative delta subtracts it.
        self.buffer(StatKind::Gauge, key, Update::Add(delta as u64));
    }

    /// Sets gauge `key` to `value` (buffered).
    pub fn gauge_set(&self, key: &StatKey, value: u64) {
        self.buffer(StatKind::Gauge, key, Update::Set(value));
    }

    fn buffer(&self, kind: StatKind, key: &StatKey, update: Update) {
        if let Some(scalar) = self.scalars.get(key.as_str()) {
            if scalar.kind == kind {
                scalar.pending.record(update);
            }
            return;
        }
        // A poisoned lock only means a panic elsewhere mid-update: the sums stay usable.
        let mut others = self.others.lock().unwrap_or_else(|e| e.into_inner());
        match others.get(key.as_str()) {
            Some((known, pending)) => {
                if *known == kind {
                    pending.record(update);
                }
            }
            None => {
                let pending = Pending::default();
                pending.record(update);
                others.insert(key.as_str().to_owned(), (kind, pending));
            }
        }
    }

    /// Hands every move since the last flush to `sink` (Envoy's config, main thread): one
    /// call per metric that moved. Keys of unknown families are dropped here.
    pub fn flush(&self, sink: &mut dyn MetricSink) {
        for scalar in self.scalars.values() {
            scalar.pending.drain(scalar.kind, scalar.id, &[], sink);
        }
        let others = {
            let mut others = self.others.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *others)
        };
        for (key, (kind, pending)) in &others {
            if let Some((id, labels)) = self.family_of(*kind, key) {
                pending.drain(*kind, id, &labels, sink);
            }
        }
    }

    /// Resolves `key` of kind `kind` to `(Envoy id, label values)`; `None` for unknown keys.
    /// A key defined as a label-less metric resolves to it, with no label values.
    pub fn resolve<'k>(&self, kind: StatKind, key: &'k StatKey) -> Option<(usize, Vec<&'k str>)> {
        if let Some(scalar) = self.scalars.get(key.as_str()) {
            if scalar.kind == kind {
                return Some((scalar.id, Vec::new()));
            }
        }
        self.family_of(kind, key.as_str())
    }

    /// The family vector of kind `kind` that flattened `key` belongs to, with its label
    /// values; `None` for an unknown family or a kind that is not the family's.
    fn family_of<'k>(&self, kind: StatKind, key: &'k str) -> Option<(usize, Vec<&'k str>)> {
        let (family, values) = split_key(key)?;
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
        let registry = StatsRegistry::define(&mut envoy, &[], true);
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
        let registry = StatsRegistry::define(&mut envoy, &[(StatKind::Counter, &routed)], true);
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
        let registry = StatsRegistry::define(&mut envoy, &[(StatKind::Counter, &key)], true);
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

    /// Records what a flush hands over: (kind, id, labels, value).
    #[derive(Default)]
    struct Sink {
        calls: Vec<(&'static str, usize, Vec<String>, i64)>,
    }

    impl MetricSink for Sink {
        fn counter_add(&mut self, id: usize, labels: &[&str], value: u64) {
            let labels = labels.iter().map(|l| (*l).to_owned()).collect();
            self.calls.push(("counter", id, labels, value as i64));
        }
        fn gauge_set(&mut self, id: usize, labels: &[&str], value: u64) {
            let labels = labels.iter().map(|l| (*l).to_owned()).collect();
            self.calls.push(("set", id, labels, value as i64));
        }
        fn gauge_add(&mut self, id: usize, labels: &[&str], delta: i64) {
            let labels = labels.iter().map(|l| (*l).to_owned()).collect();
            self.calls.push(("move", id, labels, delta));
        }
    }

    fn flushed(registry: &StatsRegistry) -> Vec<(&'static str, usize, Vec<String>, i64)> {
        let mut sink = Sink::default();
        registry.flush(&mut sink);
        sink.calls.sort();
        sink.calls
    }

    #[test]
    fn updates_wait_for_the_flush_which_hands_each_moved_metric_over_once() {
        let mut envoy = Recorder::default();
        let routed = StatKey::new("infergate.router.requests", &[("outcome", "routed")]);
        let inflight = StatKey::new(
            "infergate.picker.inflight_requests",
            &[("pool", "p"), ("endpoint", "e")],
        );
        let keys = [(StatKind::Counter, &routed), (StatKind::Gauge, &inflight)];
        let registry = StatsRegistry::define(&mut envoy, &keys, true);
        let id = |name: &str| envoy.defined.iter().position(|(_, n, _)| n == name);
        let routed_id = id("infergate.router.requests.outcome.routed").unwrap_or(usize::MAX);
        let inflight_id =
            id("infergate.picker.inflight_requests.pool.p.endpoint.e").unwrap_or(usize::MAX);

        for _ in 0..3 {
            registry.counter_add(&routed, 1);
        }
        registry.gauge_add(&inflight, 1);
        registry.gauge_add(&inflight, 1);
        registry.gauge_add(&inflight, -1);
        assert_eq!(
            flushed(&registry),
            vec![
                ("counter", routed_id, vec![], 3),
                ("move", inflight_id, vec![], 1)
            ]
        );
        assert!(flushed(&registry).is_empty(), "nothing moved since");

        // Moves that cancel out cost Envoy nothing; a set is applied before later moves.
        registry.gauge_add(&inflight, 1);
        registry.gauge_add(&inflight, -1);
        assert!(flushed(&registry).is_empty());
        registry.gauge_add(&inflight, 5);
        registry.gauge_set(&inflight, 7);
        registry.gauge_add(&inflight, -2);
        assert_eq!(
            flushed(&registry),
            vec![
                ("move", inflight_id, vec![], -2),
                ("set", inflight_id, vec![], 7)
            ]
        );
        // The wrong kind for a known key is dropped, as before.
        registry.counter_add(&inflight, 1);
        registry.gauge_add(&routed, 1);
        assert!(flushed(&registry).is_empty());
    }

    #[test]
    fn keys_unknown_at_config_time_flush_through_their_family_and_are_then_forgotten() {
        let mut envoy = Recorder::default();
        let registry = StatsRegistry::define(&mut envoy, &[], true);
        // Two families may share a name with other labels: find the one with these.
        let family = |name: &str| {
            envoy
                .defined
                .iter()
                .position(|(_, n, l)| n == name && l.len() == 2)
        };
        let picks = StatKey::new(
            "infergate.picker.picks",
            &[("pool", "p"), ("endpoint", "10.0.0.1:8000")],
        );
        let inflight = StatKey::new(
            "infergate.picker.inflight_requests",
            &[("pool", "p"), ("endpoint", "10.0.0.1:8000")],
        );
        registry.counter_add(&picks, 2);
        registry.gauge_add(&inflight, -1);
        registry.counter_add(&StatKey::new("not.a.family", &[("a", "b")]), 1);
        let labels = || vec!["p".to_owned(), "10_0_0_1_8000".to_owned()];
        let mut want = vec![
            (
                "counter",
                family("infergate.picker.picks").unwrap_or(usize::MAX),
                labels(),
                2,
            ),
            (
                "move",
                family("infergate.picker.inflight_requests").unwrap_or(usize::MAX),
                labels(),
                -1,
            ),
        ];
        want.sort();
        assert_eq!(flushed(&registry), want);
        assert!(registry.others.lock().is_ok_and(|o| o.is_empty()));
        assert!(flushed(&registry).is_empty());
    }

    #[test]
    fn updates_from_many_threads_all_arrive() {
        let mut envoy = Recorder::default();
        let routed = StatKey::new("infergate.router.requests", &[("outcome", "routed")]);
        let registry = StatsRegistry::define(&mut envoy, &[(StatKind::Counter, &routed)], true);
        let picks = StatKey::new(
            "infergate.picker.picks",
            &[("pool", "p"), ("endpoint", "e")],
        );
        let mut sink = Sink::default();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        registry.counter_add(&routed, 1);
                        registry.counter_add(&picks, 1);
                    }
                });
            }
            // Flushes while the threads count: nothing is lost or counted twice.
            for _ in 0..10 {
                registry.flush(&mut sink);
            }
        });
        registry.flush(&mut sink);
        let total = |labelled: bool| -> i64 {
            sink.calls
                .iter()
                .filter(|(_, _, labels, _)| labels.is_empty() != labelled)
                .map(|(_, _, _, v)| v)
                .sum()
        };
        assert_eq!((total(false), total(true)), (4000, 4000));
    }
}
