//! The compiled `flowControl` section of an `EndpointPickerConfig`.
//!
//! Flow control is on only when `featureGates` lists `flowControl` (or `flowControl=true`;
//! `flowControl=false` turns it off, as in llm-d). The section then reads:
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `maxBytes` | body bytes queued in all bands (quantity) | no limit |
//! | `maxRequests` | requests queued in all bands (quantity) | no limit |
//! | `defaultRequestTTL` | longest wait of a request that names no TTL (duration) | `60s` |
//! | `saturationDetector.pluginRef` | the detector plugin instance | see below |
//! | `priorityBands[]` | `{priority, maxRequests, maxBytes, fairnessPolicyRef, orderingPolicyRef}` | one band, priority 0 |
//! | `flows[]` | `{fairnessId, weight}` for `weighted-fairness-policy` | weight 1 |
//! | `enableEviction` | a blocked higher band may evict in-flight requests of negative bands | `false` |
//!
//! Choices, following llm-d's flow controller where it says something:
//! - **A limit of 0 is "unset"**, not "nothing fits": llm-d reads a global `maxBytes` /
//!   `maxRequests` of 0 as no global limit, and a band's 0 as the band default. Unlimited is
//!   stored as `u64::MAX`.
//! - **A band's limits default to the global ones**; when the global one is unlimited too,
//!   to llm-d's band defaults: 5000 requests and 1 GB (10⁹ bytes). A band is always bounded.
//! - **`defaultRequestTTL: 0`** (or `"0s"`) means no TTL: requests then leave the queue only
//!   when dispatched or cancelled (llm-d: "an explicit zero disables eviction").
//! - **No `priorityBands`**: one band of priority 0. **A band without policy refs**:
//!   `round-robin-fairness-policy` and `fcfs-ordering-policy` (llm-d defaults to global strict
//!   order; turns between tenants are the point of this gateway's flow control).
//! - **No `saturationDetector`**: llm-d's deprecated top-level `saturationDetector.pluginRef`
//!   if set, else the first detector plugin declared, else a `concurrency-detector` with
//!   llm-d's defaults (`maxConcurrency` 100, `requests`, `headroom` 0).
//! - Bands are kept highest priority first; two bands of the same priority are an error; at
//!   most [`MAX_BANDS`] bands.
//! - Weights are integers in 1..=[`MAX_FLOW_WEIGHT`]; a fairness id listed twice is an error.
//!
//! A reference names a plugin instance of `plugins` by its name (the type when unnamed); a
//! reference to nothing, or to a plugin of another kind (a scorer as a fairness policy), is
//! an error naming the path. Unknown keys anywhere in the section are errors too (a typo must
//! not silently become a default).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{Map, Value};

use super::quantity::{parse_duration_ms, parse_quantity};
use crate::config::params::{bad, Params};
use crate::config::{ConfigError, EndpointPickerConfig, PluginSpec};

/// The most priority bands one pool may declare.
pub const MAX_BANDS: usize = 256;

/// The largest weight of a flow.
pub const MAX_FLOW_WEIGHT: u32 = 1_000_000;

/// TTL of a queued request when `defaultRequestTTL` is absent (llm-d's default).
pub const DEFAULT_REQUEST_TTL_MS: u64 = 60_000;

/// A band's `maxRequests` when neither it nor the global one is set (llm-d's default).
pub const DEFAULT_BAND_MAX_REQUESTS: u64 = 5_000;

/// A band's `maxBytes` when neither it nor the global one is set (llm-d's default, 1 GB).
pub const DEFAULT_BAND_MAX_BYTES: u64 = 1_000_000_000;

/// `concurrency-detector`'s `maxConcurrency` when absent (llm-d's default).
pub const DEFAULT_MAX_CONCURRENCY: u64 = 100;

/// `concurrency-detector`'s limit in `tokens` mode when neither `maxTokenConcurrency` nor
/// `maxConcurrency` is given (llm-d's `maxTokenConcurrency` default).
pub const DEFAULT_MAX_TOKEN_CONCURRENCY: u64 = 1_000_000;

/// `utilization-detector`'s `queueDepthThreshold` when absent (llm-d's default).
pub const DEFAULT_QUEUE_DEPTH_THRESHOLD: f64 = 5.0;

/// `utilization-detector`'s `kvCacheUtilThreshold` when absent (llm-d's default).
pub const DEFAULT_KV_CACHE_UTIL_THRESHOLD: f64 = 0.8;

/// The flow of a request that names none.
pub const DEFAULT_FLOW: &str = "default-flow";

/// How the concurrency detector counts load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConcurrencyMode {
    /// In-flight requests.
    Requests,
    /// In-flight tokens (each request's prompt estimate plus its output limit).
    Tokens,
}

/// Thresholds of the utilization detector: an endpoint is saturated when it reaches one
/// (`waiting ≥ queue_depth` or `kv ≥ kv_cache_utilization`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UtilizationThresholds {
    /// `queueDepthThreshold`: waiting-queue depth from which an endpoint counts as saturated.
    pub queue_depth: f64,
    /// `kvCacheUtilThreshold`: KV-cache utilization (0..=1) from which an endpoint counts as
    /// saturated.
    pub kv_cache_utilization: f64,
}

/// The saturation detector (`saturationDetector.pluginRef`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Detector {
    /// `concurrency-detector`: saturated when this proxy's in-flight load on the pool reaches
    /// `max_concurrency × (1 + headroom)`.
    Concurrency {
        /// The limit in the mode's unit: `maxConcurrency` requests, or in `tokens` mode
        /// `maxTokenConcurrency` (else `maxConcurrency`) tokens.
        max_concurrency: u64,
        /// `concurrencyMode`.
        mode: ConcurrencyMode,
        /// `headroom`, ≥ 0.
        headroom: f64,
    },
    /// `utilization-detector`: saturated when every candidate reaches a threshold.
    Utilization(UtilizationThresholds),
}

impl Detector {
    /// The detector used when the configuration names none and declares none: a
    /// `concurrency-detector` with llm-d's defaults.
    pub const DEFAULT: Detector = Detector::Concurrency {
        max_concurrency: DEFAULT_MAX_CONCURRENCY,
        mode: ConcurrencyMode::Requests,
        headroom: 0.0,
    };
}

/// Fairness across the flows of one band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FairnessPolicy {
    /// `round-robin-fairness-policy`.
    RoundRobin,
    /// `global-strict-fairness-policy`.
    GlobalStrict,
    /// `weighted-fairness-policy`.
    Weighted,
}

/// Order within one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderingPolicy {
    /// `fcfs-ordering-policy`.
    Fcfs,
    /// `edf-ordering-policy`.
    Edf,
}

/// A compiled flow-control plugin instance: declared under `plugins`, named by the
/// references of the `flowControl` section, inert when a scheduling profile lists it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FlowPlugin {
    /// `concurrency-detector` or `utilization-detector`.
    Detector(Detector),
    /// A fairness policy (no parameters).
    Fairness(FairnessPolicy),
    /// An ordering policy (no parameters).
    Ordering(OrderingPolicy),
}

impl FlowPlugin {
    /// Compiles one declared plugin if its type is a flow-control one (see
    /// [`FLOW_PLUGIN_TYPES`]), checking its parameters (the catalogue in
    /// [`crate::scheduling::plugins`] lists them); `None` for any other type.
    pub fn compile(spec: &PluginSpec) -> Result<Option<FlowPlugin>, ConfigError> {
        let ty = spec.plugin_type.as_str();
        if !FLOW_PLUGIN_TYPES.contains(&ty) {
            return Ok(None);
        }
        let p = Params::new(spec.effective_name(), spec.parameters.as_ref())?;
        FlowPlugin::compile_params(ty, &p)
    }

    /// Compiles a plugin of type `ty` from its parameters `p` (in describe mode too) if the
    /// type is a flow-control one; `None` for any other type.
    pub(crate) fn compile_params(
        ty: &str,
        p: &Params<'_>,
    ) -> Result<Option<FlowPlugin>, ConfigError> {
        let plugin = match ty {
            "concurrency-detector" => FlowPlugin::Detector(concurrency_detector(p)?),
            "utilization-detector" => FlowPlugin::Detector(utilization_detector(p)?),
            "round-robin-fairness-policy" => FlowPlugin::Fairness(FairnessPolicy::RoundRobin),
            "global-strict-fairness-policy" => FlowPlugin::Fairness(FairnessPolicy::GlobalStrict),
            "weighted-fairness-policy" => FlowPlugin::Fairness(FairnessPolicy::Weighted),
            "fcfs-ordering-policy" => FlowPlugin::Ordering(OrderingPolicy::Fcfs),
            "edf-ordering-policy" => FlowPlugin::Ordering(OrderingPolicy::Edf),
            _ => return Ok(None),
        };
        if let FlowPlugin::Fairness(_) | FlowPlugin::Ordering(_) = plugin {
            p.only(&[])?;
        }
        Ok(Some(plugin))
    }

    /// What kind of plugin this is, with its article, for messages.
    fn kind(&self) -> &'static str {
        match self {
            FlowPlugin::Detector(_) => "a saturation detector",
            FlowPlugin::Fairness(_) => "a fairness policy",
            FlowPlugin::Ordering(_) => "an ordering policy",
        }
    }
}

/// One priority band.
#[derive(Clone, Debug, PartialEq)]
pub struct BandConfig {
    /// Its priority (higher first; may be negative).
    pub priority: i32,
    /// Most requests queued in the band.
    pub max_requests: u64,
    /// Most body bytes queued in the band.
    pub max_bytes: u64,
    /// Across flows.
    pub fairness: FairnessPolicy,
    /// Within a flow.
    pub ordering: OrderingPolicy,
}

/// The whole compiled flow-control configuration of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowControlConfig {
    /// Most requests queued in all bands (`u64::MAX`: no limit).
    pub max_requests: u64,
    /// Most body bytes queued in all bands (`u64::MAX`: no limit).
    pub max_bytes: u64,
    /// TTL of a queued request that names none; 0: no TTL.
    pub default_ttl_ms: u64,
    /// When the pool counts as saturated.
    pub detector: Detector,
    /// The bands, highest priority first (at least one).
    pub bands: Vec<BandConfig>,
    /// `flows[{fairnessId, weight}]`: weights of the weighted policy (absent: 1).
    pub weights: Vec<(String, u32)>,
    /// `enableEviction`.
    pub enable_eviction: bool,
}

impl Default for FlowControlConfig {
    /// What `featureGates: [flowControl]` with no `flowControl` section and no detector
    /// plugin compiles to.
    fn default() -> Self {
        FlowControlConfig {
            max_requests: u64::MAX,
            max_bytes: u64::MAX,
            default_ttl_ms: DEFAULT_REQUEST_TTL_MS,
            detector: Detector::DEFAULT,
            bands: alloc::vec![BandConfig {
                priority: 0,
                max_requests: DEFAULT_BAND_MAX_REQUESTS,
                max_bytes: DEFAULT_BAND_MAX_BYTES,
                fairness: FairnessPolicy::RoundRobin,
                ordering: OrderingPolicy::Fcfs,
            }],
            weights: Vec::new(),
            enable_eviction: false,
        }
    }
}

/// Where a request of `priority` waits among `bands` (sorted highest first): the band of
/// that priority, else the nearest lower band, else (below every band) the lowest.
pub(crate) fn band_position<B>(
    bands: &[B],
    priority_of: impl Fn(&B) -> i32,
    priority: i32,
) -> usize {
    let i = bands.partition_point(|b| priority_of(b) > priority);
    i.min(bands.len().saturating_sub(1))
}

impl FlowControlConfig {
    /// The priority of the band a request of `priority` waits in (see [`FlowQueues::band_for`]:
    /// the same rule, without the queues).
    ///
    /// [`FlowQueues::band_for`]: super::FlowQueues::band_for
    pub fn band_for(&self, priority: i32) -> i32 {
        self.bands
            .get(band_position(&self.bands, |b| b.priority, priority))
            .map_or(0, |b| b.priority)
    }

    /// The flow-control configuration of `cfg`: `None` when its `featureGates` do not name
    /// `flowControl`.
    pub fn compile(cfg: &EndpointPickerConfig) -> Result<Option<FlowControlConfig>, ConfigError> {
        if !flow_control_gate(cfg.feature_gates.as_ref())? {
            return Ok(None);
        }
        let declared = Declared::new(&cfg.plugins)?;
        let empty = Map::new();
        let section = match cfg.flow_control.as_ref() {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(err("flowControl", "must be a map")),
        };
        let at = Path::root("flowControl");
        at.only(
            section,
            &[
                "maxBytes",
                "maxRequests",
                "defaultRequestTTL",
                "saturationDetector",
                "priorityBands",
                "flows",
                "enableEviction",
            ],
        )?;
        let max_bytes = limit(&at, section, "maxBytes")?;
        let max_requests = limit(&at, section, "maxRequests")?;
        let default_ttl_ms = match present(section, "defaultRequestTTL") {
            None => DEFAULT_REQUEST_TTL_MS,
            Some(v) => parse_duration_ms(v).map_err(|e| at.key("defaultRequestTTL").error(&e))?,
        };
        let detector = detector(&at, section, cfg, &declared)?;
        let bands = bands(&at, section, &declared, max_requests, max_bytes)?;
        let weights = weights(&at, section)?;
        let enable_eviction = match present(section, "enableEviction") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(at
                    .key("enableEviction")
                    .error(&format!("must be true or false, got {v}")))
            }
        };
        Ok(Some(FlowControlConfig {
            max_requests,
            max_bytes,
            default_ttl_ms,
            detector,
            bands,
            weights,
            enable_eviction,
        }))
    }

    /// The weight of `flow` (1 when not listed).
    pub fn weight_of(&self, flow: &str) -> u32 {
        self.weights
            .iter()
            .find(|(f, _)| f == flow)
            .map_or(1, |(_, w)| *w)
    }
}

/// Whether `featureGates` turns flow control on. Entries are gate names, optionally with
/// `=true` / `=false`; the last mention of `flowControl` wins.
fn flow_control_gate(gates: Option<&Value>) -> Result<bool, ConfigError> {
    let list = match gates {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(err(
                "featureGates",
                &format!("must be a list of gate names, got {v}"),
            ))
        }
    };
    let mut on = false;
    for (i, g) in list.iter().enumerate() {
        let Some(g) = g.as_str() else {
            return Err(err(
                &format!("featureGates[{i}]"),
                &format!("must be a gate name, got {g}"),
            ));
        };
        let (name, value) = g.split_once('=').unwrap_or((g, "true"));
        if name.trim() == "flowControl" {
            on = match value.trim() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(err(
                        &format!("featureGates[{i}]"),
                        &format!("`{other}` is neither true nor false"),
                    ))
                }
            };
        }
    }
    Ok(on)
}

/// The declared plugin instances by name: flow-control ones compiled, others by type only.
struct Declared<'a> {
    plugins: Vec<(&'a str, &'a str, Option<FlowPlugin>)>,
}

impl<'a> Declared<'a> {
    fn new(specs: &'a [PluginSpec]) -> Result<Self, ConfigError> {
        let mut plugins: Vec<(&str, &str, Option<FlowPlugin>)> = Vec::with_capacity(specs.len());
        for spec in specs {
            let name = spec.effective_name();
            if plugins.iter().any(|(n, _, _)| *n == name) {
                return Err(ConfigError::DuplicatePluginName {
                    plugin: name.into(),
                });
            }
            let flow = FlowPlugin::compile(spec)?;
            plugins.push((name, spec.plugin_type.as_str(), flow));
        }
        Ok(Declared { plugins })
    }

    /// The flow plugin `name` refers to, if it is of the kind `pick` accepts.
    fn resolve<T>(
        &self,
        path: &Path,
        name: &Value,
        wanted: &str,
        pick: impl Fn(&FlowPlugin) -> Option<T>,
    ) -> Result<T, ConfigError> {
        let Some(name) = name.as_str() else {
            return Err(path.error(&format!("must be a plugin name, got {name}")));
        };
        let Some((_, ty, flow)) = self.plugins.iter().find(|(n, _, _)| *n == name) else {
            return Err(path.error(&format!("names no declared plugin (`{name}`)")));
        };
        match flow {
            Some(f) => pick(f)
                .ok_or_else(|| path.error(&format!("`{name}` is {}, not {wanted}", f.kind()))),
            None => Err(path.error(&format!("`{name}` is a `{ty}`, not {wanted}"))),
        }
    }

    fn first_detector(&self) -> Option<Detector> {
        self.plugins.iter().find_map(|(_, _, f)| match f {
            Some(FlowPlugin::Detector(d)) => Some(*d),
            _ => None,
        })
    }
}

/// The flow-control plugin types, in the order of the plugin catalogue.
pub const FLOW_PLUGIN_TYPES: &[&str] = &[
    "concurrency-detector",
    "utilization-detector",
    "round-robin-fairness-policy",
    "global-strict-fairness-policy",
    "weighted-fairness-policy",
    "fcfs-ordering-policy",
    "edf-ordering-policy",
];

/// A location in the document, for errors: `flowControl.priorityBands[1].burst`.
struct Path(String);

impl Path {
    fn root(name: &str) -> Path {
        Path(name.into())
    }

    fn key(&self, key: &str) -> Path {
        Path(format!("{}.{key}", self.0))
    }

    fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    fn error(&self, reason: &str) -> ConfigError {
        err(&self.0, reason)
    }

    /// Refuses any key of `map` not in `known`.
    fn only(&self, map: &Map<String, Value>, known: &[&str]) -> Result<(), ConfigError> {
        match map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(self
                .key(k)
                .error(&format!("unknown field (known: {})", known.join(", ")))),
            None => Ok(()),
        }
    }
}

fn err(path: &str, reason: &str) -> ConfigError {
    ConfigError::FlowControl {
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

/// `map[key]`, treating `null` as absent.
fn present<'m>(map: &'m Map<String, Value>, key: &str) -> Option<&'m Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn as_map<'m>(path: &Path, v: &'m Value) -> Result<&'m Map<String, Value>, ConfigError> {
    match v {
        Value::Object(m) => Ok(m),
        other => Err(path.error(&format!("must be a map, got {other}"))),
    }
}

fn as_list<'m>(path: &Path, v: &'m Value) -> Result<&'m [Value], ConfigError> {
    match v {
        Value::Array(a) => Ok(a),
        other => Err(path.error(&format!("must be a list, got {other}"))),
    }
}

/// A global limit: absent or 0 → no limit (`u64::MAX`).
fn limit(at: &Path, map: &Map<String, Value>, key: &str) -> Result<u64, ConfigError> {
    match present(map, key) {
        None => Ok(u64::MAX),
        Some(v) => match parse_quantity(v).map_err(|e| at.key(key).error(&e))? {
            0 => Ok(u64::MAX),
            n => Ok(n),
        },
    }
}

fn detector(
    at: &Path,
    section: &Map<String, Value>,
    cfg: &EndpointPickerConfig,
    declared: &Declared<'_>,
) -> Result<Detector, ConfigError> {
    let pick = |f: &FlowPlugin| match f {
        FlowPlugin::Detector(d) => Some(*d),
        _ => None,
    };
    let from = |path: Path, v: &Value| -> Result<Option<Detector>, ConfigError> {
        let m = as_map(&path, v)?;
        path.only(m, &["pluginRef"])?;
        match present(m, "pluginRef") {
            // llm-d: an empty pluginRef is the same as none.
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(r) => declared
                .resolve(&path.key("pluginRef"), r, "a saturation detector", pick)
                .map(Some),
        }
    };
    if let Some(v) = present(section, "saturationDetector") {
        if let Some(d) = from(at.key("saturationDetector"), v)? {
            return Ok(d);
        }
    }
    if let Some(v) = cfg.saturation_detector.as_ref().filter(|v| !v.is_null()) {
        if let Some(d) = from(Path::root("saturationDetector"), v)? {
            return Ok(d);
        }
    }
    Ok(declared.first_detector().unwrap_or(Detector::DEFAULT))
}

fn bands(
    at: &Path,
    section: &Map<String, Value>,
    declared: &Declared<'_>,
    global_requests: u64,
    global_bytes: u64,
) -> Result<Vec<BandConfig>, ConfigError> {
    let default_requests = if global_requests == u64::MAX {
        DEFAULT_BAND_MAX_REQUESTS
    } else {
        global_requests
    };
    let default_bytes = if global_bytes == u64::MAX {
        DEFAULT_BAND_MAX_BYTES
    } else {
        global_bytes
    };
    let Some(list) = present(section, "priorityBands") else {
        return Ok(alloc::vec![BandConfig {
            priority: 0,
            max_requests: default_requests,
            max_bytes: default_bytes,
            fairness: FairnessPolicy::RoundRobin,
            ordering: OrderingPolicy::Fcfs,
        }]);
    };
    let list_at = at.key("priorityBands");
    let list = as_list(&list_at, list)?;
    if list.len() > MAX_BANDS {
        return Err(list_at.error(&format!("at most {MAX_BANDS} bands")));
    }
    let mut bands: Vec<BandConfig> = Vec::with_capacity(list.len().max(1));
    for (i, b) in list.iter().enumerate() {
        let here = list_at.index(i);
        let m = as_map(&here, b)?;
        here.only(
            m,
            &[
                "priority",
                "maxRequests",
                "maxBytes",
                "fairnessPolicyRef",
                "orderingPolicyRef",
            ],
        )?;
        let priority = match present(m, "priority") {
            None => return Err(here.key("priority").error("is required")),
            Some(v) => v
                .as_i64()
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| {
                    here.key("priority")
                        .error(&format!("must be a 32-bit integer, got {v}"))
                })?,
        };
        if bands.iter().any(|b| b.priority == priority) {
            return Err(here
                .key("priority")
                .error(&format!("priority {priority} has more than one band")));
        }
        let band_limit = |key: &str, default: u64| -> Result<u64, ConfigError> {
            match present(m, key) {
                None => Ok(default),
                Some(v) => match parse_quantity(v).map_err(|e| here.key(key).error(&e))? {
                    0 => Ok(default),
                    n => Ok(n),
                },
            }
        };
        let fairness = match present(m, "fairnessPolicyRef") {
            None => FairnessPolicy::RoundRobin,
            Some(r) => declared.resolve(
                &here.key("fairnessPolicyRef"),
                r,
                "a fairness policy",
                |f| match f {
                    FlowPlugin::Fairness(p) => Some(*p),
                    _ => None,
                },
            )?,
        };
        let ordering = match present(m, "orderingPolicyRef") {
            None => OrderingPolicy::Fcfs,
            Some(r) => declared.resolve(
                &here.key("orderingPolicyRef"),
                r,
                "an ordering policy",
                |f| match f {
                    FlowPlugin::Ordering(p) => Some(*p),
                    _ => None,
                },
            )?,
        };
        bands.push(BandConfig {
            priority,
            max_requests: band_limit("maxRequests", default_requests)?,
            max_bytes: band_limit("maxBytes", default_bytes)?,
            fairness,
            ordering,
        });
    }
    if bands.is_empty() {
        bands.push(BandConfig {
            priority: 0,
            max_requests: default_requests,
            max_bytes: default_bytes,
            fairness: FairnessPolicy::RoundRobin,
            ordering: OrderingPolicy::Fcfs,
        });
    }
    bands.sort_by_key(|b| core::cmp::Reverse(b.priority));
    Ok(bands)
}

fn weights(at: &Path, section: &Map<String, Value>) -> Result<Vec<(String, u32)>, ConfigError> {
    let Some(list) = present(section, "flows") else {
        return Ok(Vec::new());
    };
    let list_at = at.key("flows");
    let list = as_list(&list_at, list)?;
    let mut out: Vec<(String, u32)> = Vec::with_capacity(list.len());
    for (i, f) in list.iter().enumerate() {
        let here = list_at.index(i);
        let m = as_map(&here, f)?;
        here.only(m, &["fairnessId", "weight"])?;
        let id = match present(m, "fairnessId") {
            Some(Value::String(s)) if !s.is_empty() => s,
            None => return Err(here.key("fairnessId").error("is required")),
            Some(v) => {
                return Err(here
                    .key("fairnessId")
                    .error(&format!("must be a non-empty string, got {v}")))
            }
        };
        if out.iter().any(|(f, _)| f == id) {
            return Err(here
                .key("fairnessId")
                .error(&format!("`{id}` is listed more than once")));
        }
        let weight = match present(m, "weight") {
            None => 1,
            Some(v) => v
                .as_u64()
                .filter(|w| (1..=u64::from(MAX_FLOW_WEIGHT)).contains(w))
                .and_then(|w| u32::try_from(w).ok())
                .ok_or_else(|| {
                    here.key("weight").error(&format!(
                        "must be an integer in 1..={MAX_FLOW_WEIGHT}, got {v}"
                    ))
                })?,
        };
        out.push((id.clone(), weight));
    }
    Ok(out)
}

/// A Kubernetes quantity parameter greater than 0; describe mode records `default`.
fn positive_quantity(
    p: &Params<'_>,
    key: &str,
    default: core::fmt::Arguments<'_>,
) -> Result<Option<u64>, ConfigError> {
    match p.raw(key, "quantity", default, Some("> 0")) {
        None => Ok(None),
        Some(v) => match parse_quantity(v) {
            Ok(0) => Err(bad(p.plugin(), key, "must be greater than 0")),
            Ok(n) => Ok(Some(n)),
            Err(e) => Err(bad(p.plugin(), key, &e)),
        },
    }
}

fn concurrency_detector(p: &Params<'_>) -> Result<Detector, ConfigError> {
    p.only(&[
        "maxConcurrency",
        "concurrencyMode",
        "maxTokenConcurrency",
        "headroom",
    ])?;
    let mode = match p.raw(
        "concurrencyMode",
        "string",
        format_args!("requests"),
        Some("`requests`, `tokens`"),
    ) {
        None => ConcurrencyMode::Requests,
        Some(Value::String(m)) if m == "requests" => ConcurrencyMode::Requests,
        Some(Value::String(m)) if m == "tokens" => ConcurrencyMode::Tokens,
        Some(v) => {
            return Err(bad(
                p.plugin(),
                "concurrencyMode",
                &format!("must be `requests` or `tokens`, got {v}"),
            ))
        }
    };
    let requests = positive_quantity(
        p,
        "maxConcurrency",
        format_args!("{DEFAULT_MAX_CONCURRENCY}"),
    )?;
    p.note_default(
        "maxConcurrency",
        format_args!("{DEFAULT_MAX_CONCURRENCY} in `requests` mode"),
    );
    let tokens = positive_quantity(p, "maxTokenConcurrency", format_args!("none"))?;
    p.note_default(
        "maxTokenConcurrency",
        format_args!(
            "`maxConcurrency`, else {DEFAULT_MAX_TOKEN_CONCURRENCY} (the `tokens` mode limit)"
        ),
    );
    let max_concurrency = match mode {
        ConcurrencyMode::Requests => requests.unwrap_or(DEFAULT_MAX_CONCURRENCY),
        ConcurrencyMode::Tokens => tokens.or(requests).unwrap_or(DEFAULT_MAX_TOKEN_CONCURRENCY),
    };
    Ok(Detector::Concurrency {
        max_concurrency,
        mode,
        headroom: p.f64_in("headroom", 0.0, 0.0, f64::MAX)?,
    })
}

fn utilization_detector(p: &Params<'_>) -> Result<Detector, ConfigError> {
    p.only(&[
        "queueDepthThreshold",
        "kvCacheUtilThreshold",
        "headroom",
        "metricsStalenessThreshold",
    ])?;
    let queue_depth = p.f64_positive(
        "queueDepthThreshold",
        DEFAULT_QUEUE_DEPTH_THRESHOLD,
        f64::MAX,
    )?;
    let kv = p.f64_positive("kvCacheUtilThreshold", DEFAULT_KV_CACHE_UTIL_THRESHOLD, 1.0)?;
    // Checked so that a typo is still an error, but inert here (see the catalogue in [`crate::scheduling::plugins`]).
    p.f64_in("headroom", 0.0, 0.0, f64::MAX)?;
    let staleness = p.raw(
        "metricsStalenessThreshold",
        "duration",
        format_args!("none"),
        Some("> 0"),
    );
    p.note_default("metricsStalenessThreshold", format_args!("none"));
    if let Some(v) = staleness {
        match parse_duration_ms(v) {
            Ok(0) => {
                return Err(bad(
                    p.plugin(),
                    "metricsStalenessThreshold",
                    "must be greater than 0",
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(bad(p.plugin(), "metricsStalenessThreshold", &e)),
        }
    }
    Ok(Detector::Utilization(UtilizationThresholds {
        queue_depth,
        kv_cache_utilization: kv,
    }))
}
