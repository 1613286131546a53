//! Prefill/decode disaggregation: `disagg-profile-handler` and the PD deciders.
//!
//! The handler follows llm-d's `disagg-profile-handler` (parameters
//! `profiles: {decode, prefill}`, default `decode` and `prefill`, and
//! `deciders: {prefill: <decider plugin name>}`). Per request it runs the decode profile
//! first, over the endpoints that can decode; its pick is the decision's (the endpoint the
//! request is sent to). Then the decider looks at that pick and says whether the prompt is
//! worth computing elsewhere; if so the prefill profile runs over the endpoints that can
//! prefill and its pick becomes the prefiller (`x-prefiller-host-port`). Without a prefill
//! decider the handler runs the decode profile alone.
//!
//! Deciders (llm-d's names and parameters):
//!
//! - `prefix-based-pd-decider`: `nonCachedTokens` (0: never disaggregate, as in llm-d) and
//!   `promptTokens` (0: no gate), both token counts ≥ 0. It says *prefill* when the prompt's
//!   estimated tokens are at least `promptTokens` and its uncached part on the decode pick is
//!   at least `nonCachedTokens`, where the uncached part is the prompt's full blocks (as the
//!   prefix index counts them, up to `maxPrefixTokensToMatch`) minus the leading blocks the
//!   decode pick already holds, times `blockSizeTokens`. A trailing partial block is never
//!   counted as uncached: it is too short to be worth a transfer.
//! - `always-disagg-pd-decider`: always *prefill* (llm-d's, for tests and benches).
//!
//! When the prefill profile picks the decode endpoint itself (an endpoint of role `both`
//! may win both), or finds no endpoint, the request is served without disaggregation and
//! the record says why.

use alloc::string::String;

use serde::Serialize;

use super::input::Ctx;

/// The decode profile's name when `profiles.decode` is not given.
pub const DEFAULT_DECODE_PROFILE: &str = "decode";
/// The prefill profile's name when `profiles.prefill` is not given.
pub const DEFAULT_PREFILL_PROFILE: &str = "prefill";

/// `disagg-profile-handler` as declared: names, resolved when the config is compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisaggHandlerSpec {
    /// `profiles.decode`.
    pub decode_profile: String,
    /// `profiles.prefill`.
    pub prefill_profile: String,
    /// `deciders.prefill`: the decider plugin's instance name; none → decode only.
    pub prefill_decider: Option<String>,
}

/// A PD decider plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdDecider {
    /// `prefix-based-pd-decider`.
    PrefixBased {
        /// `nonCachedTokens`: the uncached tokens from which a prompt is prefilled
        /// elsewhere (0 disables).
        non_cached_tokens: u64,
        /// `promptTokens`: the shortest prompt (estimated tokens) ever prefilled elsewhere.
        prompt_tokens: u64,
    },
    /// `always-disagg-pd-decider`.
    Always,
}

impl PdDecider {
    /// Whether the decider reads the prefix index.
    pub(crate) fn reads_prefix(self) -> bool {
        matches!(self, PdDecider::PrefixBased { .. })
    }
}

/// A compiled handler: the profiles it runs (indices into the scheduler's profiles) and the
/// decider.
#[derive(Clone, Debug, PartialEq)]
pub struct DisaggPlan {
    /// The handler's instance name.
    pub handler: String,
    /// The decode profile's index.
    pub decode: usize,
    /// The decode profile's name.
    pub decode_profile: String,
    /// The prefill profile's index and the decider's name and plugin, when prefill is on.
    pub prefill: Option<PrefillStage>,
}

/// The prefill half of a [`DisaggPlan`].
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillStage {
    /// The prefill profile's index.
    pub profile: usize,
    /// The prefill profile's name.
    pub profile_name: String,
    /// The decider's instance name.
    pub decider_name: String,
    /// The decider's plugin type.
    pub decider_type: String,
    /// The decider.
    pub decider: PdDecider,
}

/// The decider's verdict on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PdVerdict {
    /// The prompt is prefilled on the prefill pick, decoded on the decode pick.
    Prefill,
    /// No prefill decider is configured (decode profile only).
    NoDecider,
    /// `nonCachedTokens` is 0: the decider never disaggregates.
    Disabled,
    /// The prompt is shorter than `promptTokens`.
    ShortPrompt,
    /// The uncached part on the decode pick is below `nonCachedTokens`.
    MostlyCached,
    /// The decode profile picked nothing (the request is rejected).
    NoDecodeEndpoint,
    /// The decider said prefill but the prefill profile picked nothing.
    NoPrefillEndpoint,
    /// The prefill profile picked the decode endpoint itself.
    SameEndpoint,
}

/// What the decider saw: the prompt's size and how much of it the decode pick holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptCache {
    /// The request's estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens of the prompt the decode pick already holds (matched blocks × block size).
    pub cached_tokens: u64,
    /// Uncached full-block tokens: (full blocks − matched blocks) × block size.
    pub uncached_tokens: u64,
}

/// The prompt's cache state on candidate `pick` (0 cached when there is no pick).
pub(crate) fn prompt_cache(ctx: &Ctx<'_, '_>, pick: Option<usize>) -> PromptCache {
    let block = u64::from(ctx.block_size_tokens);
    let matched = pick.map_or(0, |c| ctx.matched(c)).min(ctx.full_blocks);
    let uncached_blocks = ctx.full_blocks.saturating_sub(matched) as u64;
    PromptCache {
        prompt_tokens: ctx.req.prompt_tokens.0,
        cached_tokens: (matched as u64).saturating_mul(block),
        uncached_tokens: uncached_blocks.saturating_mul(block),
    }
}

/// Whether `decider` sends a prompt with cache state `seen` to a prefill endpoint.
pub fn decide(decider: PdDecider, seen: &PromptCache) -> PdVerdict {
    match decider {
        PdDecider::Always => PdVerdict::Prefill,
        PdDecider::PrefixBased {
            non_cached_tokens,
            prompt_tokens,
        } => {
            if non_cached_tokens == 0 {
                PdVerdict::Disabled
            } else if seen.prompt_tokens < prompt_tokens {
                PdVerdict::ShortPrompt
            } else if seen.uncached_tokens < non_cached_tokens {
                PdVerdict::MostlyCached
            } else {
                PdVerdict::Prefill
            }
        }
    }
}

/// The disaggregation part of a decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DisaggOutcome<'a> {
    /// The compiled handler.
    pub(crate) plan: &'a DisaggPlan,
    /// What the decider saw (on the decode pick).
    pub(crate) seen: PromptCache,
    /// The verdict.
    pub(crate) verdict: PdVerdict,
    /// The prefiller (candidate index), when the request is disaggregated.
    pub(crate) prefill: Option<usize>,
}

impl DisaggOutcome<'_> {
    /// The decider's verdict.
    pub fn verdict(&self) -> PdVerdict {
        self.verdict
    }

    /// What the decider saw.
    pub fn prompt_cache(&self) -> PromptCache {
        self.seen
    }

    /// The prefill endpoint (candidate index), when the request is disaggregated.
    pub fn prefill(&self) -> Option<usize> {
        self.prefill
    }
}
