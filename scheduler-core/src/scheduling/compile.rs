//! Compiling an [`EndpointPickerConfig`] into a [`Scheduler`]: plugin instances become enum
//! values with checked parameters, profiles become ordered lists of steps. All validation
//! happens here, once; the per-request path never re-reads the document.

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use super::disagg::{DisaggPlan, PrefillStage};
use super::input::ROLE_DROPPED;
use super::plugins::{Filter, Picker, Plugin, PrefixSettings, Scorer};
use crate::config::{ConfigError, EndpointPickerConfig, PluginRef, ProfileSpec, MAX_WEIGHT};
use crate::latency::LatencySettings;
use crate::prefix::precise::PreciseSettings;
use crate::prefix::{PrefixConfig, PrefixIndex};

/// Name of the profile synthesized when the config declares none.
pub const DEFAULT_PROFILE: &str = "default";

/// One step of a profile: the plugin instance's name and type, and the compiled plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct Step<T> {
    /// Instance name (as in the config).
    pub name: String,
    /// Plugin type.
    pub plugin_type: String,
    /// The compiled plugin.
    pub plugin: T,
}

/// A scorer step with its weight.
#[derive(Clone, Debug, PartialEq)]
pub struct ScorerStep {
    /// Instance name and type.
    pub step: Step<Scorer>,
    /// Weight in the profile's sum.
    pub weight: f64,
}

/// A compiled scheduling profile.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Profile name.
    pub name: String,
    /// Filters, in the order they run.
    pub filters: Vec<Step<Filter>>,
    /// Scorers with weights.
    pub scorers: Vec<ScorerStep>,
    /// The picker (`max-score-picker` when the profile names none).
    pub picker: Step<Picker>,
}

/// A compiled `EndpointPickerConfig`: what the picker runs on every request.
#[derive(Clone, Debug, PartialEq)]
pub struct Scheduler {
    pub(crate) profiles: Vec<Profile>,
    pub(crate) prefix: PrefixSettings,
    /// `latency-observer-producer`'s settings, or its defaults.
    latency: LatencySettings,
    /// `precise-prefix-cache-producer`'s settings, when the config declares it.
    precise: Option<PreciseSettings>,
    pub(crate) needs_prefix: bool,
    /// Whether some profile reads measured latency (`latency-observation-scorer`,
    /// `prefix-cache-affinity-filter`).
    needs_latency: bool,
    /// `disagg-profile-handler`, when declared: which profiles run, and when.
    pub(crate) disagg: Option<DisaggPlan>,
    flow_control: Option<Value>,
}

impl Default for Scheduler {
    /// One profile, `max-score-picker`, default prefix settings.
    fn default() -> Self {
        Scheduler {
            profiles: alloc::vec![Profile {
                name: DEFAULT_PROFILE.into(),
                filters: Vec::new(),
                scorers: Vec::new(),
                picker: default_picker(),
            }],
            prefix: PrefixSettings::default(),
            latency: LatencySettings::default(),
            precise: None,
            needs_prefix: false,
            needs_latency: false,
            disagg: None,
            flow_control: None,
        }
    }
}

fn default_picker() -> Step<Picker> {
    Step {
        name: "max-score-picker".into(),
        plugin_type: "max-score-picker".into(),
        plugin: Picker::DEFAULT,
    }
}

impl Scheduler {
    /// Compiles a configuration document, naming the culprit of any error.
    pub fn new(cfg: &EndpointPickerConfig) -> Result<Scheduler, ConfigError> {
        let mut declared: Vec<(&str, &str, Plugin)> = Vec::with_capacity(cfg.plugins.len());
        let mut prefix: Option<PrefixSettings> = None;
        let mut precise: Option<PreciseSettings> = None;
        let mut latency: Option<LatencySettings> = None;
        for spec in &cfg.plugins {
            let name = spec.effective_name();
            if declared.iter().any(|(n, _, _)| *n == name) {
                return Err(ConfigError::DuplicatePluginName {
                    plugin: name.into(),
                });
            }
            let plugin = Plugin::compile(spec)?;
            // One prefix index per pool: approximate or precise, declared once.
            let second = match &plugin {
                Plugin::PrefixProducer(s) => prefix.replace(*s).is_some() || precise.is_some(),
                Plugin::PrecisePrefixProducer(s) => {
                    precise.replace(s.clone()).is_some() || prefix.is_some()
                }
                _ => false,
            };
            if second {
                return Err(ConfigError::MultiplePrefixProducers {
                    plugin: name.into(),
                });
            }
            if let Plugin::LatencyProducer(s) = &plugin {
                if latency.replace(*s).is_some() {
                    return Err(ConfigError::Syntax(alloc::format!(
                        "plugin `{name}`: `latency-observer-producer` is declared twice \
                         (the estimates are kept once per pool)"
                    )));
                }
            }
            declared.push((name, spec.plugin_type.as_str(), plugin));
        }
        let synthesized;
        let specs: &[ProfileSpec] = if cfg.scheduling_profiles.is_empty() {
            synthesized = [ProfileSpec {
                name: DEFAULT_PROFILE.into(),
                plugins: declared
                    .iter()
                    .map(|(n, _, _)| PluginRef {
                        plugin_ref: n.to_string(),
                        weight: None,
                    })
                    .collect(),
            }];
            &synthesized
        } else {
            &cfg.scheduling_profiles
        };
        let mut profiles: Vec<Profile> = Vec::with_capacity(specs.len());
        for spec in specs {
            if profiles.iter().any(|p| p.name == spec.name) {
                return Err(ConfigError::DuplicateProfile {
                    profile: spec.name.clone(),
                });
            }
            profiles.push(compile_profile(spec, &declared)?);
        }
        let disagg = disagg_plan(&declared, &profiles)?;
        let decider_reads_prefix = disagg
            .as_ref()
            .and_then(|d| d.prefill.as_ref())
            .is_some_and(|s| s.decider.reads_prefix());
        let needs_prefix = decider_reads_prefix
            || profiles.iter().any(|p| {
                p.scorers
                    .iter()
                    .any(|s| matches!(s.step.plugin, Scorer::PrefixCache(_) | Scorer::Placement(_)))
                    || p.filters
                        .iter()
                        .any(|f| matches!(f.plugin, Filter::PrefixAffinity(_)))
            });
        let needs_latency = profiles.iter().any(|p| {
            p.scorers
                .iter()
                .any(|s| matches!(s.step.plugin, Scorer::LatencyObservation(_)))
                || p.filters
                    .iter()
                    .any(|f| matches!(f.plugin, Filter::PrefixAffinity(_)))
        });
        let mut prefix = prefix.unwrap_or_default();
        if let Some(p) = &precise {
            // The host hashes tokens into blocks of the engine's size and cuts them at
            // `maxPrefixTokensToMatch` itself; these settings only bound the match and
            // give the prefix scorer's length term its tokens per block.
            prefix.config.block_size_tokens = p
                .block_size_tokens
                .unwrap_or(crate::prefix::precise::settings::DEFAULT_BLOCK_SIZE_TOKENS);
            prefix.config.max_prefix_tokens_to_match = p.max_prefix_tokens_to_match;
        }
        Ok(Scheduler {
            profiles,
            prefix,
            latency: latency.unwrap_or_default(),
            precise,
            needs_prefix,
            needs_latency,
            disagg,
            flow_control: cfg.flow_control.clone(),
        })
    }

    /// Parses and compiles a JSON configuration.
    pub fn from_json_str(text: &str) -> Result<Scheduler, ConfigError> {
        Scheduler::new(&EndpointPickerConfig::from_json_str(text)?)
    }

    /// Compiles a configuration already parsed into a `serde_json::Value` (e.g. from YAML).
    pub fn from_value(value: Value) -> Result<Scheduler, ConfigError> {
        Scheduler::new(&EndpointPickerConfig::from_value(value)?)
    }

    /// `disagg-profile-handler`'s compiled plan, when one is declared.
    pub fn disagg(&self) -> Option<&DisaggPlan> {
        self.disagg.as_ref()
    }

    /// Whether some requests may be prefilled on another endpoint than the one they are
    /// sent to (a `disagg-profile-handler` with a prefill decider).
    pub fn disaggregates(&self) -> bool {
        self.disagg.as_ref().is_some_and(|d| d.prefill.is_some())
    }

    /// The compiled profiles; the first is the primary one (its pick is the decision's),
    /// unless `disagg-profile-handler` names the decode profile.
    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    /// `precise-prefix-cache-producer`'s settings, when declared: the host then keeps a
    /// precise index fed by the engines' KV events and passes it to
    /// [`Scheduler::schedule`] as the prefix index, with block keys of the request's tokens
    /// ([`crate::prefix::precise::token_block_keys`]) as its block hashes.
    pub fn precise_settings(&self) -> Option<&PreciseSettings> {
        self.precise.as_ref()
    }

    /// How the host keeps its measured-latency estimates (`latency-observer-producer`, or
    /// defaults).
    pub fn latency_settings(&self) -> LatencySettings {
        self.latency
    }

    /// Prefix index settings (`approx-prefix-cache-producer`, or defaults).
    pub fn prefix_settings(&self) -> PrefixSettings {
        self.prefix
    }

    /// The prefix index configuration hosts hash requests with.
    pub fn prefix_config(&self) -> PrefixConfig {
        self.prefix.config
    }

    /// An empty prefix index configured by `approx-prefix-cache-producer`. Hosts should
    /// call [`PrefixIndex::set_capacity`] with [`Scheduler::lru_capacity_for`] per endpoint.
    pub fn new_prefix_index(&self) -> PrefixIndex {
        PrefixIndex::new(self.prefix.config)
    }

    /// Whether any profile reads the prefix index (so hosts may skip hashing otherwise).
    pub fn uses_prefix_index(&self) -> bool {
        self.needs_prefix
    }

    /// Whether any profile reads the candidates' measured latency (so hosts may leave it
    /// out of the candidates otherwise; it is still measured and exported).
    pub fn uses_measured_latency(&self) -> bool {
        self.needs_latency
    }

    /// The `flowControl` section, verbatim.
    pub fn flow_control(&self) -> Option<&Value> {
        self.flow_control.as_ref()
    }

    /// The prefix-index LRU bound for an endpoint, in blocks: `lruCapacityPerServer` if
    /// configured, else the endpoint's KV capacity converted to our block size when its
    /// metrics expose it, else the default (31,250); never more than
    /// `maxLruCapacityPerServer`, so an engine reporting a huge cache cannot make the index
    /// unbounded.
    pub fn lru_capacity_for(&self, metrics: Option<&crate::metrics::EndpointMetrics>) -> u32 {
        let s = self.prefix.config;
        let max = self.prefix.max_lru_capacity_per_server;
        if self.prefix.lru_capacity_configured {
            return s.lru_capacity_per_server.min(max);
        }
        let blocks = match metrics.and_then(|m| m.cache) {
            Some(c) if c.num_blocks > 0 && c.block_size > 0 => {
                let tokens = c.num_blocks.saturating_mul(u64::from(c.block_size));
                let blocks = (tokens / u64::from(s.block_size_tokens.max(1))).max(1);
                u32::try_from(blocks).unwrap_or(u32::MAX)
            }
            _ => s.lru_capacity_per_server,
        };
        blocks.min(max)
    }
}

fn compile_profile(
    spec: &ProfileSpec,
    declared: &[(&str, &str, Plugin)],
) -> Result<Profile, ConfigError> {
    let mut filters = Vec::new();
    let mut scorers = Vec::new();
    let mut picker: Option<Step<Picker>> = None;
    for r in &spec.plugins {
        let Some((name, ty, plugin)) = declared.iter().find(|(n, _, _)| *n == r.plugin_ref) else {
            return Err(ConfigError::DanglingPluginRef {
                profile: spec.name.clone(),
                plugin_ref: r.plugin_ref.clone(),
            });
        };
        let weight = r.weight.unwrap_or(1.0);
        if !weight.is_finite() || !(0.0..=MAX_WEIGHT).contains(&weight) {
            return Err(ConfigError::BadWeight {
                profile: spec.name.clone(),
                plugin_ref: r.plugin_ref.clone(),
            });
        }
        fn step<T>(name: &str, ty: &str, plugin: T) -> Step<T> {
            Step {
                name: name.to_string(),
                plugin_type: ty.to_string(),
                plugin,
            }
        }
        match plugin {
            // Producers are pool-wide, the profile handler is how profiles combine, and
            // flow-control plugins belong to the `flowControl` section; listing them in a
            // profile is allowed and inert.
            Plugin::PrefixProducer(_)
            | Plugin::PrecisePrefixProducer(_)
            | Plugin::InflightProducer
            | Plugin::LatencyProducer(_)
            | Plugin::SingleProfileHandler
            | Plugin::DisaggProfileHandler(_)
            | Plugin::PdDecider(_)
            | Plugin::Flow(_) => {}
            Plugin::Filter(f) => {
                if filters.len() >= usize::from(ROLE_DROPPED) {
                    return Err(ConfigError::Syntax(alloc::format!(
                        "scheduling profile `{}` has too many filters",
                        spec.name
                    )));
                }
                filters.push(step(name, ty, f.clone()));
            }
            Plugin::Scorer(s) => scorers.push(ScorerStep {
                step: step(name, ty, *s),
                weight,
            }),
            Plugin::Picker(p) => {
                if picker.replace(step(name, ty, *p)).is_some() {
                    return Err(ConfigError::MultiplePickers {
                        profile: spec.name.clone(),
                    });
                }
            }
        }
    }
    Ok(Profile {
        name: spec.name.clone(),
        filters,
        scorers,
        picker: picker.unwrap_or_else(default_picker),
    })
}

/// Resolves the one `disagg-profile-handler` (if declared) against the compiled profiles and
/// the declared deciders. Every profile must be one the handler runs: a profile it never
/// runs is a config mistake, not something to ignore silently.
fn disagg_plan(
    declared: &[(&str, &str, Plugin)],
    profiles: &[Profile],
) -> Result<Option<DisaggPlan>, ConfigError> {
    let mut handlers = declared.iter().filter(|(_, _, p)| {
        matches!(
            p,
            Plugin::DisaggProfileHandler(_) | Plugin::SingleProfileHandler
        )
    });
    let first = handlers.next();
    if let Some((second, _, _)) = handlers.next() {
        return Err(ConfigError::ProfileHandler {
            plugin: (*second).into(),
            reason: "only one profile handler may be declared".into(),
        });
    }
    let Some((name, _, Plugin::DisaggProfileHandler(spec))) = first else {
        return Ok(None);
    };
    let err = |reason: String| ConfigError::ProfileHandler {
        plugin: (*name).into(),
        reason,
    };
    let find = |profile: &str| profiles.iter().position(|p| p.name == profile);
    let Some(decode) = find(&spec.decode_profile) else {
        return Err(err(alloc::format!(
            "decode profile `{}` is not declared",
            spec.decode_profile
        )));
    };
    let prefill = match &spec.prefill_decider {
        None => None,
        Some(decider_name) => {
            let Some(profile) = find(&spec.prefill_profile) else {
                return Err(err(alloc::format!(
                    "prefill profile `{}` is not declared",
                    spec.prefill_profile
                )));
            };
            if profile == decode {
                return Err(err("the decode and prefill profiles must differ".into()));
            }
            let Some((_, ty, Plugin::PdDecider(decider))) =
                declared.iter().find(|(n, _, _)| n == decider_name)
            else {
                return Err(err(alloc::format!(
                    "deciders.prefill `{decider_name}` names no declared PD decider"
                )));
            };
            Some(PrefillStage {
                profile,
                profile_name: spec.prefill_profile.clone(),
                decider_name: decider_name.clone(),
                decider_type: (*ty).to_string(),
                decider: *decider,
            })
        }
    };
    if let Some(unused) = profiles
        .iter()
        .enumerate()
        .find(|(i, _)| *i != decode && prefill.as_ref().map(|s| s.profile) != Some(*i))
    {
        return Err(err(alloc::format!(
            "scheduling profile `{}` is never run (the handler runs `{}`{})",
            unused.1.name,
            spec.decode_profile,
            if prefill.is_some() {
                alloc::format!(" and `{}`", spec.prefill_profile)
            } else {
                String::new()
            }
        )));
    }
    Ok(Some(DisaggPlan {
        handler: (*name).into(),
        decode,
        decode_profile: spec.decode_profile.clone(),
        prefill,
    }))
}
