//! `EndpointPickerConfig`, the scheduling plugins, profiles and the decision record.
//!
//! Lifecycle: a host parses the config ([`EndpointPickerConfig`], JSON here or YAML with
//! `serde_yaml_ng` in std hosts) and compiles it once into a [`Scheduler`]; every request then
//! calls [`Scheduler::schedule`] with a [`RequestView`], the pool's [`Candidate`]s, the
//! prefix index, one random `u64` and `now`, and gets a [`Decision`].
//!
//! Per profile: filters run in order, each narrowing the candidates; each scorer gives every
//! remaining candidate a raw score clamped to [0, 1] (NaN → 0); the total is
//! Σ weight × score; the picker chooses and ranks fallbacks. The first profile is the
//! primary one: its pick is the decision's (under `disagg-profile-handler`, the decode
//! profile runs first and is the primary one). No profiles configured → one profile named
//! `default` with every declared plugin in declaration order; no picker in a profile →
//! `max-score-picker`. Filters that empty the candidate set yield `picked: None` (the host
//! answers 503 `rejected-no-endpoints`).
//!
//! Which endpoints of a pool become candidates at all (dead, fresh, unknown; fail open or
//! close) is decided before scheduling, by [`candidates`].
//!
//! Plugin semantics and parameters: [`plugins`] (catalogue), [`filter`] (filters, the TTFT
//! estimate, missing metrics), [`score`] (scorers, missing metrics), [`placement`] (where a
//! prefix no index knows goes, the same on every replica), [`pick`] (pickers, RNG),
//! [`disagg`] (prefill/decode disaggregation: the profile handler, the deciders) and
//! [`roles`] (what each endpoint serves). [`describe`] reads the catalogue back as data
//! (kinds, parameters, defaults, ranges) for the book's generated plugin reference.
//!
//! Layering (no module imports one that imports it back; `tests/module_cycles.rs` checks):
//! [`crate::config`] (the document, shared with [`crate::flow`]), [`roles`] and [`input`]
//! (the request, the candidates, the context plugins read) are at the bottom; the plugins'
//! semantics read them; [`compile`] reads the plugins; [`run`] reads everything and nothing
//! here reads it.

pub mod candidates;
pub mod compile;
pub mod decision;
pub mod describe;
pub mod disagg;
pub mod filter;
pub mod input;
pub mod pick;
pub mod placement;
pub mod plugins;
mod record;
pub mod roles;
pub mod run;
pub mod score;

// Tests may panic on a broken fixture: that is how a test fails.
#[cfg(test)]
#[allow(clippy::panic)]
mod tests;

/// The configuration document and its errors live in the leaf [`crate::config`], which
/// [`crate::flow`] reads too; `scheduling::config` is its old path.
pub use crate::config;
pub use crate::config::{
    ConfigError, EndpointPickerConfig, PluginRef, PluginSpec, ProfileSpec, MAX_WEIGHT,
};
pub use compile::{Profile, Scheduler, DEFAULT_PROFILE};
pub use decision::{Decision, ProfileDecision};
pub use describe::{describe_plugins, DefaultDoc, ParamDoc, PluginDoc};
pub use disagg::{DisaggOutcome, PdVerdict, PromptCache};
pub use filter::FilterNote;
pub use input::{Candidate, NoPrefixIndex, PrefixMatch, RequestView};
pub use plugins::{PrefixSettings, DEFAULT_MAX_LRU_CAPACITY, PLUGIN_TYPES};
pub use roles::{Phase, Role, ROLE_LABEL};
