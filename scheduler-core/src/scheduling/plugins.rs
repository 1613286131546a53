//! The plugin catalogue: every plugin type as a compiled enum variant, with
//! its parameters parsed and range-checked once, at config time.
//!
//! | type | kind | parameters (default) | endpoint with unknown metrics |
//! |---|---|---|---|
//! | `approx-prefix-cache-producer` | producer | `blockSizeTokens` (64), `maxPrefixTokensToMatch` (131072), `lruCapacityPerServer` (31250, or the endpoint's KV capacity when known), `maxLruCapacityPerServer` (262144: no endpoint's LRU exceeds it, whatever its metrics claim; `lruCapacityPerServer` may not either) | — |
//! | `precise-prefix-cache-producer` | producer | see [`crate::prefix::precise::settings`] (the engines' KV events; native flavour) | — |
//! | `inflight-load-producer` | producer | none | — (the host's own counts) |
//! | `latency-observer-producer` | producer | `smoothing` (0.2, in (0, 1]), `staleAfterMs` (10000, ≥ 1), `minSamples` (3, ≥ 1): how the measured-latency estimates are kept (see [`crate::latency`]; the defaults hold when it is not declared) | — (the proxy's own timings) |
//! | `utilization-filter` | filter | `conditions: [{metric, maxValue}]` (metric: `kv-cache-utilization` 0..1, `waiting-queue`, `running-requests`), `fallbackOnEmpty` (false) | kept (an unknown or NaN value never exceeds) |
//! | `prefix-cache-affinity-filter` | filter | `threshold` (0.5), `maxTTFTPenaltyMs` (1000), `prefillTokensPerSecond` (10000), `queuedRequestMs` (250), `maxWaitingQueue` (16), `maxKVCacheUtilization` (0.95) | not overloaded; queue counts as 0 in the TTFT estimate |
//! | `rendezvous-placement-scorer` | scorer | `keyBlocks` (8, an integer ≥ 1), `loadFactor` (2, ≥ 1), `soleShare` (0.75, in (0, 1]), `idleRule` (`shared` or `sole`) | load from in-flight requests alone (see [`super::placement`]) |
//! | `prefix-cache-scorer` | scorer | `matchLengthWeight` (0, in [0, 1]), `matchLengthScaleTokens` (8192, an integer ≥ 1) | — (the index is the proxy's own) |
//! | `queue-scorer`, `running-requests-scorer` | scorer | none | 0, and left out of the min/max |
//! | `kv-cache-utilization-scorer` | scorer | none | 0 (also for NaN) |
//! | `lora-affinity-scorer` | scorer | none | 0 unless the request is for the base model (1) |
//! | `inflight-load-scorer`, `token-load-scorer`, `session-affinity-scorer` | scorer | none | — (no scraped metric used) |
//! | `latency-observation-scorer` | scorer | `tpotTokens` (0: TTFT alone) | an endpoint not measured lately scores as the best measured one (see [`super::score`]) |
//! | `max-score-picker`, `weighted-random-picker`, `random-picker` | picker | `maxFallbacks` (3, at most 64) | — |
//! | `concurrency-detector` | flow control | `maxConcurrency` (100, a quantity > 0), `concurrencyMode` (`requests` or `tokens`), `maxTokenConcurrency` (the `tokens` limit: else `maxConcurrency`, else 1,000,000), `headroom` (0, ≥ 0) | — (the proxy's own in-flight load) |
//! | `utilization-detector` | flow control | `queueDepthThreshold` (5, > 0), `kvCacheUtilThreshold` (0.8, in (0, 1]); llm-d's `headroom` and `metricsStalenessThreshold` are checked and inert (endpoint filtering is the `utilization-filter`'s, staleness the pool's `failureMode`'s) | not saturated |
//! | `single-profile-handler` | profile handler | none | — (the first profile's pick is the decision, which is what this handler does in llm-d) |
//! | `disagg-profile-handler` | profile handler | `profiles: {decode ("decode"), prefill ("prefill")}`, `deciders: {prefill: <decider name>}` (none: decode only) | — (see [`super::disagg`]) |
//! | `prefix-based-pd-decider` | PD decider | `nonCachedTokens` (0: never), `promptTokens` (0: no gate) | — (the index is the proxy's own) |
//! | `always-disagg-pd-decider` | PD decider | none | — |
//! | `decode-filter`, `prefill-filter` | filter | none | — (roles are configuration, not metrics): keeps the endpoints whose role can decode (`decode`, `both`) or prefill (`prefill`, `both`) |
//! | `round-robin-fairness-policy`, `global-strict-fairness-policy`, `weighted-fairness-policy`, `fcfs-ordering-policy`, `edf-ordering-policy` | flow control | none | — |
//!
//! Flow-control plugins are named by the `flowControl` section and compiled by
//! [`crate::flow::config`] ([`FlowPlugin::compile`]); a scheduling profile that lists one
//! ignores it, as it does producers.
//!
//! Unknown parameter names are config errors (a typo must not silently become a default).
//!
//! Parameters are read through `Params` only, so that [`super::describe`] can read each
//! plugin's parameters back from this code (names, kinds, defaults, ranges) for the book's
//! generated plugin reference; a default that is not one constant is annotated where it is
//! read (`Params::note_default`).

use alloc::format;
use alloc::vec::Vec;
use serde_json::Value;

use super::disagg::{
    DisaggHandlerSpec, PdDecider, DEFAULT_DECODE_PROFILE, DEFAULT_PREFILL_PROFILE,
};
use super::placement::{IdleRule, PlacementScorer, MAX_KEY_BLOCKS, MAX_LOAD_FACTOR};
use super::roles::Phase;
use crate::config::params::{bad, number_in, Params};
use crate::config::{ConfigError, PluginSpec};
use crate::flow::config::FlowPlugin;
use crate::latency::LatencySettings;
use crate::prefix::precise::settings::precise_producer;
use crate::prefix::precise::PreciseSettings;
use crate::prefix::PrefixConfig;
use crate::types::Tokens;

/// Every plugin type this build knows, in the order of the README's plugin table.
pub const PLUGIN_TYPES: &[&str] = &[
    "approx-prefix-cache-producer",
    "precise-prefix-cache-producer",
    "inflight-load-producer",
    "latency-observer-producer",
    "utilization-filter",
    "prefix-cache-affinity-filter",
    "prefix-cache-scorer",
    "rendezvous-placement-scorer",
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "lora-affinity-scorer",
    "running-requests-scorer",
    "inflight-load-scorer",
    "token-load-scorer",
    "session-affinity-scorer",
    "latency-observation-scorer",
    "max-score-picker",
    "weighted-random-picker",
    "random-picker",
    "single-profile-handler",
    "disagg-profile-handler",
    "prefix-based-pd-decider",
    "always-disagg-pd-decider",
    "decode-filter",
    "prefill-filter",
    "concurrency-detector",
    "utilization-detector",
    "round-robin-fairness-policy",
    "global-strict-fairness-policy",
    "weighted-fairness-policy",
    "fcfs-ordering-policy",
    "edf-ordering-policy",
];

/// Default `maxLruCapacityPerServer`, in blocks: 16.7 M tokens at 64-token blocks, more
/// KV cache than any engine holds today, and at most ~12 MiB of index per endpoint (48 bytes
/// per block at most). It bounds what an engine's `cache_config_info` can make us keep.
pub const DEFAULT_MAX_LRU_CAPACITY: u32 = 262_144;

/// Settings of the approximate prefix index (`approx-prefix-cache-producer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixSettings {
    /// Block size, match limit and default LRU bound.
    pub config: PrefixConfig,
    /// Whether `lruCapacityPerServer` was configured; if not, an endpoint's KV capacity
    /// (when its metrics expose it) takes precedence over the default.
    pub lru_capacity_configured: bool,
    /// `maxLruCapacityPerServer`: no endpoint's LRU bound exceeds it, whatever its metrics say.
    pub max_lru_capacity_per_server: u32,
}

impl Default for PrefixSettings {
    fn default() -> Self {
        PrefixSettings {
            config: PrefixConfig::default(),
            lru_capacity_configured: false,
            max_lru_capacity_per_server: DEFAULT_MAX_LRU_CAPACITY,
        }
    }
}

/// The metric a utilization condition reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UtilizationMetric {
    /// `kv-cache-utilization`, 0..=1.
    KvCacheUtilization,
    /// `waiting-queue`, queued requests.
    WaitingQueue,
    /// `running-requests`, running requests.
    RunningRequests,
}

/// One `utilization-filter` condition: drop when `metric > max_value`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Condition {
    /// What is compared.
    pub metric: UtilizationMetric,
    /// The largest value still accepted.
    pub max_value: f64,
}

/// `utilization-filter` settings.
#[derive(Clone, Debug, PartialEq)]
pub struct UtilizationFilter {
    /// Any condition exceeded drops the endpoint.
    pub conditions: Vec<Condition>,
    /// Keep every candidate when all would be dropped.
    pub fallback_on_empty: bool,
}

/// `prefix-cache-affinity-filter` settings (see [`super::filter`] for the TTFT estimate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixAffinityFilter {
    /// Match ratio (matched ÷ full blocks) from which a candidate is sticky.
    pub threshold: f64,
    /// Affinity is broken when the sticky set's best estimated TTFT is worse than the best
    /// other candidate's by more than this.
    pub max_ttft_penalty_ms: f64,
    /// Prefill speed assumed for uncached prompt tokens.
    pub prefill_tokens_per_second: f64,
    /// Time assumed per request already queued on the endpoint.
    pub queued_request_ms: f64,
    /// A sticky candidate with more queued requests than this is overloaded.
    pub max_waiting_queue: u64,
    /// A sticky candidate with a higher KV utilisation than this is overloaded.
    pub max_kv_cache_utilization: f64,
}

/// A filter plugin.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// `utilization-filter`.
    Utilization(UtilizationFilter),
    /// `prefix-cache-affinity-filter`.
    PrefixAffinity(PrefixAffinityFilter),
    /// `decode-filter` / `prefill-filter`: keeps the endpoints whose role serves the phase.
    Role(Phase),
}

/// Default `matchLengthScaleTokens`: llm-d's, the matched length at which the length
/// term of `prefix-cache-scorer` saturates.
pub const DEFAULT_MATCH_LENGTH_SCALE: Tokens = Tokens(8192);

/// `prefix-cache-scorer` settings (the formula is in [`super::score`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixCacheScorer {
    /// `matchLengthWeight`, in [0, 1]: the share of the score given to the matched length
    /// rather than to the matched ratio. 0 (the default) scores the ratio alone.
    pub match_length_weight: f64,
    /// `matchLengthScaleTokens`, ≥ 1: the matched length (in tokens) from which the length
    /// term is 1.
    pub match_length_scale: Tokens,
}

impl Default for PrefixCacheScorer {
    /// The plain match ratio.
    fn default() -> Self {
        PrefixCacheScorer {
            match_length_weight: 0.0,
            match_length_scale: DEFAULT_MATCH_LENGTH_SCALE,
        }
    }
}

/// A scorer plugin (only `prefix-cache-scorer` and `rendezvous-placement-scorer` take
/// parameters).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scorer {
    /// `prefix-cache-scorer`.
    PrefixCache(PrefixCacheScorer),
    /// `rendezvous-placement-scorer`.
    Placement(PlacementScorer),
    /// `queue-scorer`.
    Queue,
    /// `kv-cache-utilization-scorer`.
    KvCacheUtilization,
    /// `lora-affinity-scorer`.
    LoraAffinity,
    /// `running-requests-scorer`.
    RunningRequests,
    /// `inflight-load-scorer`.
    InflightLoad,
    /// `token-load-scorer`.
    TokenLoad,
    /// `session-affinity-scorer`.
    SessionAffinity,
    /// `latency-observation-scorer`.
    LatencyObservation(LatencyScorer),
}

/// `latency-observation-scorer` settings (see [`super::score`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyScorer {
    /// `tpotTokens`: output tokens to weigh the measured time per output token with (the
    /// cost is `TTFT + tpotTokens × TPOT`); 0: TTFT alone.
    pub tpot_tokens: u32,
}

/// How a picker chooses among the totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickerKind {
    /// `max-score-picker`: highest total, ties uniformly at random.
    MaxScore,
    /// `weighted-random-picker`: probability ∝ total.
    WeightedRandom,
    /// `random-picker`: uniform.
    Random,
}

/// A picker plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picker {
    /// The choice rule.
    pub kind: PickerKind,
    /// How many further endpoints to rank after the pick (for fallback lists).
    pub max_fallbacks: u32,
}

impl Picker {
    /// `max-score-picker` with default parameters (the profile default).
    pub const DEFAULT: Picker = Picker {
        kind: PickerKind::MaxScore,
        max_fallbacks: 3,
    };
}

/// A compiled plugin instance.
#[derive(Clone, Debug, PartialEq)]
pub enum Plugin {
    /// `approx-prefix-cache-producer`.
    PrefixProducer(PrefixSettings),
    /// `precise-prefix-cache-producer`: the index the engines' KV events feed, kept by the
    /// host (see [`crate::prefix::precise`]).
    PrecisePrefixProducer(PreciseSettings),
    /// `inflight-load-producer` (the host tracks in-flight load; nothing to compute here).
    InflightProducer,
    /// `latency-observer-producer`: how the host keeps its measured-latency estimates.
    LatencyProducer(LatencySettings),
    /// A filter.
    Filter(Filter),
    /// A scorer.
    Scorer(Scorer),
    /// A picker.
    Picker(Picker),
    /// `single-profile-handler`: llm-d's handler that makes one profile's pick the decision,
    /// which is always how profiles combine here.
    SingleProfileHandler,
    /// `disagg-profile-handler`: the decode profile always, the prefill profile when its
    /// decider says so (see [`super::disagg`]).
    DisaggProfileHandler(DisaggHandlerSpec),
    /// A PD decider, named by `disagg-profile-handler`.
    PdDecider(PdDecider),
    /// A flow-control plugin (detector or policy), read by the flow-control configuration.
    Flow(FlowPlugin),
}

impl Plugin {
    /// Compiles one declared plugin, checking its parameters.
    pub fn compile(spec: &PluginSpec) -> Result<Plugin, ConfigError> {
        let p = Params::new(spec.effective_name(), spec.parameters.as_ref())?;
        Plugin::compile_params(&spec.plugin_type, &p)
    }

    /// Compiles a plugin of type `plugin_type` from its parameters `p` (in describe mode
    /// too, see [`super::describe`]).
    pub(crate) fn compile_params(plugin_type: &str, p: &Params<'_>) -> Result<Plugin, ConfigError> {
        let scorer = |s: Scorer| -> Result<Plugin, ConfigError> {
            p.only(&[])?;
            Ok(Plugin::Scorer(s))
        };
        match plugin_type {
            "approx-prefix-cache-producer" => prefix_producer(p),
            "precise-prefix-cache-producer" => {
                Ok(Plugin::PrecisePrefixProducer(precise_producer(p)?))
            }
            "inflight-load-producer" => {
                p.only(&[])?;
                Ok(Plugin::InflightProducer)
            }
            "latency-observer-producer" => latency_producer(p),
            "utilization-filter" => utilization_filter(p),
            "prefix-cache-affinity-filter" => prefix_affinity_filter(p),
            "prefix-cache-scorer" => prefix_cache_scorer(p),
            "rendezvous-placement-scorer" => placement_scorer(p),
            "queue-scorer" => scorer(Scorer::Queue),
            "kv-cache-utilization-scorer" => scorer(Scorer::KvCacheUtilization),
            "lora-affinity-scorer" => scorer(Scorer::LoraAffinity),
            "running-requests-scorer" => scorer(Scorer::RunningRequests),
            "inflight-load-scorer" => scorer(Scorer::InflightLoad),
            "token-load-scorer" => scorer(Scorer::TokenLoad),
            "session-affinity-scorer" => scorer(Scorer::SessionAffinity),
            "latency-observation-scorer" => {
                p.only(&["tpotTokens"])?;
                let tpot = p.u64_in("tpotTokens", 0, 0, 1 << 20)?;
                Ok(Plugin::Scorer(Scorer::LatencyObservation(LatencyScorer {
                    tpot_tokens: u32::try_from(tpot).unwrap_or(0),
                })))
            }
            "max-score-picker" => picker(p, PickerKind::MaxScore),
            "weighted-random-picker" => picker(p, PickerKind::WeightedRandom),
            "random-picker" => picker(p, PickerKind::Random),
            "single-profile-handler" => {
                p.only(&[])?;
                Ok(Plugin::SingleProfileHandler)
            }
            "disagg-profile-handler" => disagg_profile_handler(p),
            "prefix-based-pd-decider" => {
                p.only(&["nonCachedTokens", "promptTokens"])?;
                Ok(Plugin::PdDecider(PdDecider::PrefixBased {
                    non_cached_tokens: p.u64_in("nonCachedTokens", 0, 0, u64::MAX)?,
                    prompt_tokens: p.u64_in("promptTokens", 0, 0, u64::MAX)?,
                }))
            }
            "always-disagg-pd-decider" => {
                p.only(&[])?;
                Ok(Plugin::PdDecider(PdDecider::Always))
            }
            "decode-filter" => {
                p.only(&[])?;
                Ok(Plugin::Filter(Filter::Role(Phase::Decode)))
            }
            "prefill-filter" => {
                p.only(&[])?;
                Ok(Plugin::Filter(Filter::Role(Phase::Prefill)))
            }
            // The flow-control plugins compile in `flow`, which owns them.
            other => match FlowPlugin::compile_params(other, p)? {
                Some(f) => Ok(Plugin::Flow(f)),
                None => Err(ConfigError::UnknownPluginType {
                    plugin: p.plugin().into(),
                    plugin_type: other.into(),
                }),
            },
        }
    }
}

fn disagg_profile_handler(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&["profiles", "deciders"])?;
    let mut spec = DisaggHandlerSpec {
        decode_profile: DEFAULT_DECODE_PROFILE.into(),
        prefill_profile: DEFAULT_PREFILL_PROFILE.into(),
        prefill_decider: None,
    };
    for (k, v) in p.string_map("profiles", &["decode", "prefill"])? {
        match k {
            "decode" => spec.decode_profile = v.into(),
            _ => spec.prefill_profile = v.into(),
        }
    }
    p.note_default(
        "profiles",
        format_args!("decode: `{DEFAULT_DECODE_PROFILE}`, prefill: `{DEFAULT_PREFILL_PROFILE}`"),
    );
    for (_, v) in p.string_map("deciders", &["prefill"])? {
        spec.prefill_decider = Some(v.into());
    }
    p.note_default("deciders", format_args!("none: decode only"));
    Ok(Plugin::DisaggProfileHandler(spec))
}

fn prefix_producer(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&[
        "blockSizeTokens",
        "maxPrefixTokensToMatch",
        "lruCapacityPerServer",
        "maxLruCapacityPerServer",
    ])?;
    let d = PrefixConfig::default();
    let block = p.u64_in("blockSizeTokens", d.block_size_tokens.into(), 1, 1 << 20)?;
    let max_cap = p.u64_in(
        "maxLruCapacityPerServer",
        DEFAULT_MAX_LRU_CAPACITY.into(),
        1,
        u32::MAX.into(),
    )?;
    // The default bound gives way to a smaller maximum; a configured one may not exceed it.
    let cap = p.u64_in(
        "lruCapacityPerServer",
        u64::from(d.lru_capacity_per_server).min(max_cap),
        1,
        max_cap,
    )?;
    p.note_default(
        "lruCapacityPerServer",
        format_args!(
            "the endpoint's KV capacity in blocks (`cache_config_info`) when scraped, else {}; \
             at most `maxLruCapacityPerServer`",
            d.lru_capacity_per_server
        ),
    );
    p.note_range(
        "lruCapacityPerServer",
        format_args!("1..=`maxLruCapacityPerServer`"),
    );
    let config = PrefixConfig {
        block_size_tokens: u32::try_from(block).unwrap_or(d.block_size_tokens),
        max_prefix_tokens_to_match: p.u64_in(
            "maxPrefixTokensToMatch",
            d.max_prefix_tokens_to_match,
            1,
            u64::MAX,
        )?,
        lru_capacity_per_server: u32::try_from(cap).unwrap_or(u32::MAX),
    };
    Ok(Plugin::PrefixProducer(PrefixSettings {
        config,
        lru_capacity_configured: p.has("lruCapacityPerServer"),
        max_lru_capacity_per_server: u32::try_from(max_cap).unwrap_or(u32::MAX),
    }))
}

fn latency_producer(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&["smoothing", "staleAfterMs", "minSamples"])?;
    let d = LatencySettings::default();
    let min = p.u64_in("minSamples", d.min_samples.into(), 1, u32::MAX.into())?;
    Ok(Plugin::LatencyProducer(LatencySettings {
        smoothing: p.f64_positive("smoothing", d.smoothing, 1.0)?,
        stale_after_ms: p.u64_in("staleAfterMs", d.stale_after_ms, 1, u64::MAX)?,
        min_samples: u32::try_from(min).unwrap_or(d.min_samples),
    }))
}

fn prefix_cache_scorer(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&["matchLengthWeight", "matchLengthScaleTokens"])?;
    let d = PrefixCacheScorer::default();
    Ok(Plugin::Scorer(Scorer::PrefixCache(PrefixCacheScorer {
        match_length_weight: p.f64_in("matchLengthWeight", d.match_length_weight, 0.0, 1.0)?,
        match_length_scale: Tokens(p.u64_in(
            "matchLengthScaleTokens",
            d.match_length_scale.0,
            1,
            u64::MAX,
        )?),
    })))
}

fn placement_scorer(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&["keyBlocks", "loadFactor", "soleShare", "idleRule"])?;
    let d = PlacementScorer::default();
    let k = p.u64_in("keyBlocks", d.key_blocks.into(), 1, MAX_KEY_BLOCKS.into())?;
    let idle_rule = match p.raw(
        "idleRule",
        "string",
        format_args!("shared"),
        Some("`shared`, `sole`"),
    ) {
        None => d.idle_rule,
        Some(Value::String(r)) if r == "shared" => IdleRule::Shared,
        Some(Value::String(r)) if r == "sole" => IdleRule::Sole,
        Some(v) => {
            return Err(bad(
                p.plugin(),
                "idleRule",
                &format!("must be `shared` or `sole`, got {v}"),
            ))
        }
    };
    Ok(Plugin::Scorer(Scorer::Placement(PlacementScorer {
        key_blocks: u32::try_from(k).unwrap_or(d.key_blocks),
        load_factor: p.f64_in("loadFactor", d.load_factor, 1.0, MAX_LOAD_FACTOR)?,
        sole_share: p.f64_positive("soleShare", d.sole_share, 1.0)?,
        idle_rule,
    })))
}

fn utilization_filter(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&["conditions", "fallbackOnEmpty"])?;
    let mut conditions = Vec::new();
    let items = "`{metric, maxValue}`";
    for (i, c) in p.array("conditions", items)?.iter().enumerate() {
        conditions.push(condition(p.plugin(), i, c)?);
    }
    Ok(Plugin::Filter(Filter::Utilization(UtilizationFilter {
        conditions,
        fallback_on_empty: p.bool("fallbackOnEmpty", false)?,
    })))
}

fn condition(plugin: &str, i: usize, c: &Value) -> Result<Condition, ConfigError> {
    let path = |k: &str| format!("conditions[{i}]{k}");
    let Value::Object(m) = c else {
        return Err(bad(
            plugin,
            &path(""),
            "must be a map with `metric` and `maxValue`",
        ));
    };
    if let Some(k) = m.keys().find(|k| *k != "metric" && *k != "maxValue") {
        return Err(bad(
            plugin,
            &path(&format!(".{k}")),
            "unknown field (known: metric, maxValue)",
        ));
    }
    let metric = match m.get("metric").and_then(Value::as_str) {
        Some("kv-cache-utilization") => UtilizationMetric::KvCacheUtilization,
        Some("waiting-queue") => UtilizationMetric::WaitingQueue,
        Some("running-requests") => UtilizationMetric::RunningRequests,
        _ => {
            return Err(bad(
                plugin,
                &path(".metric"),
                "must be one of kv-cache-utilization, waiting-queue, running-requests",
            ))
        }
    };
    let Some(v) = m.get("maxValue") else {
        return Err(bad(plugin, &path(".maxValue"), "is required"));
    };
    let max = if metric == UtilizationMetric::KvCacheUtilization {
        1.0
    } else {
        f64::MAX
    };
    let max_value = number_in(plugin, &path(".maxValue"), v, 0.0, max)?;
    Ok(Condition { metric, max_value })
}

fn prefix_affinity_filter(p: &Params<'_>) -> Result<Plugin, ConfigError> {
    p.only(&[
        "threshold",
        "maxTTFTPenaltyMs",
        "prefillTokensPerSecond",
        "queuedRequestMs",
        "maxWaitingQueue",
        "maxKVCacheUtilization",
    ])?;
    let prefill = p.f64_positive("prefillTokensPerSecond", 10_000.0, f64::MAX)?;
    Ok(Plugin::Filter(Filter::PrefixAffinity(
        PrefixAffinityFilter {
            threshold: p.f64_in("threshold", 0.5, 0.0, 1.0)?,
            max_ttft_penalty_ms: p.f64_in("maxTTFTPenaltyMs", 1_000.0, 0.0, f64::MAX)?,
            prefill_tokens_per_second: prefill,
            queued_request_ms: p.f64_in("queuedRequestMs", 250.0, 0.0, f64::MAX)?,
            max_waiting_queue: p.u64_in("maxWaitingQueue", 16, 0, u64::MAX)?,
            max_kv_cache_utilization: p.f64_in("maxKVCacheUtilization", 0.95, 0.0, 1.0)?,
        },
    )))
}

fn picker(p: &Params<'_>, kind: PickerKind) -> Result<Plugin, ConfigError> {
    p.only(&["maxFallbacks"])?;
    let n = p.u64_in("maxFallbacks", Picker::DEFAULT.max_fallbacks.into(), 0, 64)?;
    Ok(Plugin::Picker(Picker {
        kind,
        max_fallbacks: u32::try_from(n).unwrap_or(Picker::DEFAULT.max_fallbacks),
    }))
}
