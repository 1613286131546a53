//! The plugin catalogue as data, read from the code that compiles the plugins: every type
//! of [`PLUGIN_TYPES`] with its kind, one sentence of what it does, and its parameters with
//! their kind, default and accepted values.
//!
//! [`describe_plugins`] compiles each type without parameters in describe mode (see
//! `config::params`): the names come from the list the plugin accepts (`Params::only`), the
//! kind, default and range from the getters that read them, and a default that is not one
//! constant (the endpoint's KV capacity, another parameter) from the note the reading code
//! makes beside it. The kind of a plugin is that of the compiled [`Plugin`] variant. Only the
//! one-sentence summaries are written here by hand.
//!
//! Nothing here runs while a config is read or a request is scheduled: hosts that never call
//! [`describe_plugins`] do not link it (the operator's CLI renders it as the book's plugin
//! reference).

use alloc::string::String;
use alloc::vec::Vec;

use super::plugins::{Plugin, PLUGIN_TYPES};
pub use crate::config::params::{DefaultDoc, ParamDoc};
use crate::config::params::{Params, Recorded, Recorder};
use crate::config::ConfigError;
use crate::flow::config::FlowPlugin;

/// One plugin type, described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginDoc {
    /// Its `type`.
    pub plugin_type: &'static str,
    /// What it is: `producer`, `filter`, `scorer`, `picker`, `profile handler`,
    /// `PD decider`, `saturation detector`, `fairness policy` or `ordering policy`.
    pub kind: &'static str,
    /// What it does, in one sentence.
    pub summary: &'static str,
    /// Its parameters, in the order the plugin lists them (none: it takes none, and any is
    /// an error).
    pub parameters: Vec<ParamDoc>,
}

/// Every plugin type of [`PLUGIN_TYPES`], in its order, described from the code.
pub fn describe_plugins() -> Result<Vec<PluginDoc>, ConfigError> {
    PLUGIN_TYPES
        .iter()
        .map(|ty| describe(ty).map(|d| d.doc))
        .collect()
}

/// A plugin type described, and what its description lacks (empty when it is complete: the
/// unit test below requires it, which is the only reader of the lacks).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Described {
    /// The description.
    pub(crate) doc: PluginDoc,
    /// Names the plugin accepts that no getter read (described as accepted, nothing more).
    pub(crate) unread: Vec<String>,
    /// Names a getter read that the plugin does not accept.
    pub(crate) unaccepted: Vec<String>,
    /// Notes about a parameter no getter had read before them.
    pub(crate) stray_notes: Vec<String>,
}

/// Describes `plugin_type` (one of [`PLUGIN_TYPES`]).
pub(crate) fn describe(plugin_type: &'static str) -> Result<Described, ConfigError> {
    let recorder = Recorder::default();
    let plugin = Plugin::compile_params(plugin_type, &Params::describing(plugin_type, &recorder))?;
    let Recorded {
        known,
        mut params,
        stray_notes,
    } = recorder.take();
    let mut parameters = Vec::with_capacity(known.len());
    let mut unread = Vec::new();
    for name in &known {
        match params.iter().position(|p| &p.name == name) {
            Some(i) => parameters.push(params.remove(i)),
            None => {
                unread.push(name.clone());
                parameters.push(ParamDoc {
                    name: name.clone(),
                    kind: String::new(),
                    default: DefaultDoc::Note(String::new()),
                    range: None,
                });
            }
        }
    }
    Ok(Described {
        doc: PluginDoc {
            plugin_type,
            kind: kind(&plugin),
            summary: summary(plugin_type),
            parameters,
        },
        unread,
        unaccepted: params.into_iter().map(|p| p.name).collect(),
        stray_notes,
    })
}

/// The kind of a compiled plugin.
fn kind(plugin: &Plugin) -> &'static str {
    match plugin {
        Plugin::PrefixProducer(_)
        | Plugin::PrecisePrefixProducer(_)
        | Plugin::InflightProducer
        | Plugin::LatencyProducer(_) => "producer",
        Plugin::Filter(_) => "filter",
        Plugin::Scorer(_) => "scorer",
        Plugin::Picker(_) => "picker",
        Plugin::SingleProfileHandler | Plugin::DisaggProfileHandler(_) => "profile handler",
        Plugin::PdDecider(_) => "PD decider",
        Plugin::Flow(FlowPlugin::Detector(_)) => "saturation detector",
        Plugin::Flow(FlowPlugin::Fairness(_)) => "fairness policy",
        Plugin::Flow(FlowPlugin::Ordering(_)) => "ordering policy",
    }
}

/// What `plugin_type` does, in one sentence (empty for a type not written here: the unit
/// test requires every one of [`PLUGIN_TYPES`]).
fn summary(plugin_type: &str) -> &'static str {
    match plugin_type {
        "approx-prefix-cache-producer" => {
            "The approximate prefix index: which prompt prefixes (chained block hashes) this \
             proxy sent to each endpoint, in an LRU per endpoint."
        }
        "precise-prefix-cache-producer" => {
            "The precise prefix index, fed by the engines' own KV events (native flavour; the \
             Wasm flavour refuses it)."
        }
        "inflight-load-producer" => {
            "Counts what this proxy sent to each endpoint and has not seen finish (requests, \
             estimated tokens)."
        }
        "latency-observer-producer" => {
            "Keeps, per endpoint, decaying estimates of the TTFT and time per output token this \
             proxy measured, against the load each request met."
        }
        "utilization-filter" => {
            "Drops an endpoint when one of its metrics exceeds a condition's `maxValue` (an \
             unknown metric never exceeds)."
        }
        "prefix-cache-affinity-filter" => {
            "Keeps the endpoints that hold enough of the prompt, unless they are overloaded or \
             their estimated TTFT is too much worse than the best other's."
        }
        "prefix-cache-scorer" => {
            "Scores the share of the prompt's leading blocks an endpoint holds, optionally \
             mixed with the matched length."
        }
        "rendezvous-placement-scorer" => {
            "Places a prompt no index knows on the same endpoint from every gateway replica: \
             rendezvous hashing of its first blocks, bounded by load."
        }
        "queue-scorer" => "Fewest waiting requests → 1, most → 0, linear.",
        "kv-cache-utilization-scorer" => "1 − the endpoint's KV-cache utilisation.",
        "lora-affinity-scorer" => {
            "Prefers the endpoints running the request's LoRA adapter, then those with a free \
             adapter slot."
        }
        "running-requests-scorer" => "Fewest running requests (scraped) → 1, linear.",
        "inflight-load-scorer" => "Fewest requests in flight from this proxy → 1, linear.",
        "token-load-scorer" => "Fewest estimated tokens in flight from this proxy → 1, linear.",
        "session-affinity-scorer" => {
            "1 for the endpoint that last served the request's session (the pool's \
             `sessionHeader`)."
        }
        "latency-observation-scorer" => {
            "Prefers the endpoint whose measured TTFT (at its load now) is lowest: the best's \
             cost over each one's; unmeasured endpoints score as the best."
        }
        "max-score-picker" => "Picks the highest total, ties uniformly at random.",
        "weighted-random-picker" => "Picks with a probability proportional to the total.",
        "random-picker" => "Picks uniformly at random.",
        "single-profile-handler" => {
            "Makes the first profile's pick the decision, which is what the gateway always does."
        }
        "disagg-profile-handler" => {
            "Prefill/decode disaggregation: a decode pick always, a prefill pick when the \
             decider says so."
        }
        "prefix-based-pd-decider" => {
            "Prefills elsewhere when the prompt is long enough and enough of it is uncached on \
             the decode pick."
        }
        "always-disagg-pd-decider" => "Always prefills elsewhere.",
        "decode-filter" => "Keeps the endpoints that can decode (role `decode` or `both`).",
        "prefill-filter" => "Keeps the endpoints that can prefill (role `prefill` or `both`).",
        "concurrency-detector" => {
            "Saturated when this proxy's in-flight load on the pool reaches \
             `maxConcurrency × (1 + headroom)`."
        }
        "utilization-detector" => {
            "Saturated when every endpoint of the pool reaches a threshold; llm-d's `headroom` \
             and `metricsStalenessThreshold` are checked and inert."
        }
        "round-robin-fairness-policy" => "Backlogged flows take turns, one request each.",
        "global-strict-fairness-policy" => {
            "Ignores flows: the whole band in its ordering policy's order."
        }
        "weighted-fairness-policy" => {
            "Weighted fair shares by virtual token counter: the flow that received the least \
             service per weight goes next."
        }
        "fcfs-ordering-policy" => "Within a flow, arrival order.",
        "edf-ordering-policy" => "Within a flow, earliest deadline (arrival + TTL) first.",
        _ => "",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::PluginSpec;
    use alloc::format;
    use serde_json::{Map, Value};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Every type is described, with a kind, a summary and a description of every parameter
    /// it accepts, read by a getter: a parameter added to `only` without one, or read
    /// without being accepted, fails here.
    #[test]
    fn every_plugin_type_and_parameter_is_described() {
        for ty in PLUGIN_TYPES {
            let d = describe(ty).unwrap_or_else(|e| panic!("{ty}: {e:?}"));
            assert!(!d.doc.summary.is_empty(), "{ty}: no summary in describe.rs");
            assert!(
                d.unread.is_empty(),
                "{ty}: accepted, never read: {:?}",
                d.unread
            );
            assert!(
                d.unaccepted.is_empty(),
                "{ty}: read, not accepted: {:?}",
                d.unaccepted
            );
            assert!(
                d.stray_notes.is_empty(),
                "{ty}: stray notes {:?}",
                d.stray_notes
            );
            for p in &d.doc.parameters {
                assert!(!p.kind.is_empty(), "{ty}.{}: no kind", p.name);
            }
        }
        assert_eq!(describe_plugins().unwrap().len(), PLUGIN_TYPES.len());
    }

    /// The names described are exactly the ones the plugin accepts: each is accepted by the
    /// real parser, and a name beside them is refused.
    #[test]
    fn described_names_are_the_accepted_ones() {
        for doc in describe_plugins().unwrap() {
            for p in &doc.parameters {
                // Every described name is known: a `null` value (the default) compiles.
                let mut m = Map::new();
                m.insert(p.name.clone(), Value::Null);
                let spec = PluginSpec {
                    plugin_type: doc.plugin_type.into(),
                    name: None,
                    parameters: Some(Value::Object(m)),
                };
                Plugin::compile(&spec)
                    .unwrap_or_else(|e| panic!("{}.{}: {e:?}", doc.plugin_type, p.name));
            }
            let mut m = Map::new();
            m.insert("notAParameter".into(), Value::Null);
            let spec = PluginSpec {
                plugin_type: doc.plugin_type.into(),
                name: None,
                parameters: Some(Value::Object(m)),
            };
            let err = format!("{:?}", Plugin::compile(&spec).unwrap_err());
            for p in &doc.parameters {
                assert!(
                    err.contains(p.name.as_str()),
                    "{}: the error lists not `{}`: {err}",
                    doc.plugin_type,
                    p.name
                );
            }
        }
    }

    #[test]
    fn dynamic_defaults_and_ranges_say_so() {
        let docs = describe_plugins().unwrap();
        let param = |ty: &str, name: &str| -> ParamDoc {
            docs.iter()
                .find(|d| d.plugin_type == ty)
                .and_then(|d| d.parameters.iter().find(|p| p.name == name))
                .cloned()
                .unwrap_or_else(|| panic!("{ty}.{name}"))
        };
        let lru = param("approx-prefix-cache-producer", "lruCapacityPerServer");
        assert!(
            matches!(&lru.default, DefaultDoc::Note(n) if n.contains("KV capacity") && n.contains("31250")),
            "{lru:?}"
        );
        assert_eq!(lru.range.as_deref(), Some("1..=`maxLruCapacityPerServer`"));
        let block = param("approx-prefix-cache-producer", "blockSizeTokens");
        assert_eq!(block.default, DefaultDoc::Value("64".into()));
        assert_eq!(block.range.as_deref(), Some("1..=1048576"));
        let prefill = param("prefix-cache-affinity-filter", "prefillTokensPerSecond");
        assert_eq!(prefill.range.as_deref(), Some("> 0"));
        let kv = param("utilization-detector", "kvCacheUtilThreshold");
        assert_eq!(kv.range.as_deref(), Some("> 0, ≤ 1"));
        assert_eq!(kv.default, DefaultDoc::Value("0.8".into()));
        let block = param("precise-prefix-cache-producer", "blockSizeTokens");
        assert!(matches!(block.default, DefaultDoc::Note(_)), "{block:?}");
        assert_eq!(
            param("max-score-picker", "maxFallbacks").range.as_deref(),
            Some("0..=64")
        );
        assert_eq!(
            param("precise-prefix-cache-producer", "tokenizer").default,
            DefaultDoc::Value(r#"{"type":"sim"}"#.into())
        );
    }
}
