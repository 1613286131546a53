//! The `EndpointPickerConfig` document (llm-d shape) as serde types, and config errors.
//!
//! The same types deserialize from JSON (here, with `serde_json`'s `alloc` mode) and from
//! YAML (std hosts run `serde_yaml_ng` into these types, or into a `serde_json::Value` and call
//! [`EndpointPickerConfig::from_value`]). Nothing here is interpreted:
//! [`crate::scheduling::Scheduler::new`] compiles the document (and
//! [`crate::flow::FlowControlConfig::compile`] its `flowControl` section) and reports every
//! semantic error with the culprit's name.
//!
//! A leaf: what [`crate::scheduling`] and [`crate::flow`] both read (the document, its
//! errors, `params` for reading a plugin's `parameters`) and nothing of theirs. The old path
//! `scheduling::config` names this module.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) mod params;

/// The largest scorer weight. Raw scores are in [0, 1], so a profile's total is at most its
/// weight sum; with weights this small no sum of them comes near overflowing to infinity
/// (which would make the tie threshold NaN and drop every candidate).
pub const MAX_WEIGHT: f64 = 1e6;

/// The whole configuration document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPickerConfig {
    /// `inference.networking.x-k8s.io/v1alpha1` in llm-d files; accepted, not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `EndpointPickerConfig` in llm-d files; accepted, not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Plugin instances: a type, an optional name (defaults to the type) and parameters.
    #[serde(default)]
    pub plugins: Vec<PluginSpec>,
    /// Profiles referencing plugins by name. None → one profile with every declared plugin.
    #[serde(default)]
    pub scheduling_profiles: Vec<ProfileSpec>,
    /// Flow-control settings: kept verbatim for the flow-control stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<Value>,
    /// llm-d feature gates: accepted and kept, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_gates: Option<Value>,
    /// llm-d saturation detector settings: accepted and kept for flow control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation_detector: Option<Value>,
    /// llm-d data-layer settings: accepted, not used (metrics come from the scraper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// One plugin instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginSpec {
    /// The plugin type, e.g. `queue-scorer`.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The instance name profiles refer to; defaults to the type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Type-specific parameters (a map), checked when the config is compiled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

impl PluginSpec {
    /// The name profiles use to refer to this instance.
    pub fn effective_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.plugin_type)
    }
}

/// One scheduling profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSpec {
    /// Profile name, shown in decision records.
    pub name: String,
    /// The plugins this profile runs, in order (filters run in this order).
    #[serde(default)]
    pub plugins: Vec<PluginRef>,
}

/// A profile's reference to a plugin instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginRef {
    /// Name of a plugin instance declared under `plugins`.
    pub plugin_ref: String,
    /// Scorer weight; defaults to 1. Ignored for filters, pickers and producers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

impl EndpointPickerConfig {
    /// Parses a JSON document (shape only; see [`crate::scheduling::Scheduler::new`] for
    /// semantics).
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(text).map_err(|e| ConfigError::Syntax(alloc::format!("{e}")))
    }

    /// Converts an already-parsed document (e.g. YAML read by a std host into a
    /// `serde_json::Value`).
    pub fn from_value(value: Value) -> Result<Self, ConfigError> {
        serde_json::from_value(value).map_err(|e| ConfigError::Syntax(alloc::format!("{e}")))
    }
}

/// Why a configuration was refused. Every variant names the culprit.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    /// The document does not have the `EndpointPickerConfig` shape (serde's message).
    Syntax(String),
    /// A plugin declares a type this build does not know.
    UnknownPluginType {
        /// The instance name.
        plugin: String,
        /// The unknown type.
        plugin_type: String,
    },
    /// Two plugin instances share a name.
    DuplicatePluginName {
        /// The shared name.
        plugin: String,
    },
    /// Two profiles share a name.
    DuplicateProfile {
        /// The shared name.
        profile: String,
    },
    /// A profile refers to a plugin name that is not declared.
    DanglingPluginRef {
        /// The profile holding the reference.
        profile: String,
        /// The missing name.
        plugin_ref: String,
    },
    /// A parameter is unknown, of the wrong type or out of range.
    BadParameter {
        /// The plugin instance name.
        plugin: String,
        /// The parameter (with a path for nested ones, e.g. `conditions[1].maxValue`).
        parameter: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A weight is negative, not finite or above [`MAX_WEIGHT`].
    BadWeight {
        /// The profile holding the reference.
        profile: String,
        /// The referenced plugin.
        plugin_ref: String,
    },
    /// A profile references more than one picker.
    MultiplePickers {
        /// The profile.
        profile: String,
    },
    /// More than one prefix producer (`approx-prefix-cache-producer`,
    /// `precise-prefix-cache-producer`) is declared (one index per pool).
    MultiplePrefixProducers {
        /// The second producer's name.
        plugin: String,
    },
    /// A profile handler refers to a profile or decider that is missing or of the wrong
    /// kind, or more than one profile handler is declared.
    ProfileHandler {
        /// The handler's instance name.
        plugin: String,
        /// What is wrong.
        reason: String,
    },
    /// The `flowControl` section (or `featureGates`) is malformed or refers to a plugin that
    /// is missing or of the wrong kind.
    FlowControl {
        /// Where, e.g. `flowControl.priorityBands[1].fairnessPolicyRef`.
        path: String,
        /// What is wrong there.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Syntax(m) => write!(f, "invalid EndpointPickerConfig: {m}"),
            ConfigError::UnknownPluginType { plugin, plugin_type } => {
                write!(f, "plugin `{plugin}`: unknown plugin type `{plugin_type}`")
            }
            ConfigError::DuplicatePluginName { plugin } => {
                write!(f, "plugin name `{plugin}` is declared more than once")
            }
            ConfigError::DuplicateProfile { profile } => {
                write!(f, "scheduling profile `{profile}` is declared more than once")
            }
            ConfigError::DanglingPluginRef { profile, plugin_ref } => write!(
                f,
                "scheduling profile `{profile}`: pluginRef `{plugin_ref}` names no declared plugin"
            ),
            ConfigError::BadParameter {
                plugin,
                parameter,
                reason,
            } => write!(f, "plugin `{plugin}`: parameter `{parameter}`: {reason}"),
            ConfigError::BadWeight {
                profile,
                plugin_ref,
            } => write!(
                f,
                "scheduling profile `{profile}`: weight of `{plugin_ref}` must be a number in 0..={}",
                MAX_WEIGHT
            ),
            ConfigError::MultiplePickers { profile } => {
                write!(f, "scheduling profile `{profile}` references more than one picker")
            }
            ConfigError::MultiplePrefixProducers { plugin } => write!(
                f,
                "plugin `{plugin}`: only one prefix producer (approx-prefix-cache-producer or precise-prefix-cache-producer) may be declared"
            ),
            ConfigError::ProfileHandler { plugin, reason } => {
                write!(f, "profile handler `{plugin}`: {reason}")
            }
            ConfigError::FlowControl { path, reason } => write!(f, "{path}: {reason}"),
        }
    }
}

impl core::error::Error for ConfigError {}
