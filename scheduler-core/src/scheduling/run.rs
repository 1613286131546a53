//! The per-request path: [`Scheduler::schedule`], a pure function of the request view, the
//! candidates, the prefix index, one random `u64` and `now`.
//!
//! Cost: one prefix-index lookup for the request (only if some profile reads it; with
//! [`PrefixIndex`](crate::prefix::PrefixIndex), one probe for the endpoints holding its first
//! block, then a few per holder and one name lookup per candidate when there is any holder),
//! then per profile O(filters × n + scorers × n + (1 + maxFallbacks) × n) with no
//! allocation beyond the decision record itself.

use alloc::vec;
use alloc::vec::Vec;

use super::compile::{Profile, Scheduler};
use super::decision::{Decision, ProfileDecision};
use super::disagg::{self, DisaggOutcome, DisaggPlan, PdVerdict};
use super::filter;
use super::input::{Candidate, Ctx, PrefixMatch, RequestView, ALIVE, ROLE_DROPPED};
use super::pick::{self, SplitMix64};
use super::plugins::Filter;
use super::roles::Phase;
use super::score;
use crate::types::Millis;

impl Scheduler {
    /// Schedules one request over `candidates`: every profile runs its filters, scorers
    /// and picker; the first profile's pick is the decision's. `random` seeds every random
    /// choice; `now` is the host's clock (no current plugin is time-dependent: staleness
    /// is applied by the caller when it decides which metrics are known).
    pub fn schedule<'a, P: PrefixMatch + ?Sized>(
        &'a self,
        request: &RequestView<'a>,
        candidates: &'a [Candidate<'a>],
        prefix: &P,
        random: u64,
        now: Millis,
    ) -> Decision<'a> {
        let _ = now;
        let block = u64::from(self.prefix.config.block_size_tokens.max(1));
        let max_blocks = usize::try_from(self.prefix.config.max_prefix_tokens_to_match / block)
            .unwrap_or(usize::MAX);
        let full_blocks = request.block_hashes.len().min(max_blocks);
        let hashes = request.block_hashes.get(..full_blocks).unwrap_or(&[]);
        let mut matched: Vec<usize> = Vec::new();
        if self.needs_prefix && full_blocks > 0 {
            prefix.match_candidates(candidates, hashes, &mut matched);
            for m in &mut matched {
                *m = (*m).min(full_blocks);
            }
        }
        let ctx = Ctx::new(
            request,
            candidates,
            &matched,
            full_blocks,
            self.prefix.config.block_size_tokens,
        );
        let mut rng = SplitMix64::new(random);
        let Some(plan) = &self.disagg else {
            let profiles = self
                .profiles
                .iter()
                .map(|p| run_profile(p, None, &ctx, &mut rng))
                .collect();
            return Decision::new(*request, candidates, full_blocks, matched, profiles, None);
        };
        let (profiles, outcome) = self.run_disagg(plan, &ctx, &mut rng);
        Decision::new(
            *request,
            candidates,
            full_blocks,
            matched,
            profiles,
            Some(outcome),
        )
    }

    /// `disagg-profile-handler`: the decode profile, then the decider on its pick, then the
    /// prefill profile if the decider says so (see [`super::disagg`]).
    fn run_disagg<'a>(
        &'a self,
        plan: &'a DisaggPlan,
        ctx: &Ctx<'_, '_>,
        rng: &mut SplitMix64,
    ) -> (Vec<ProfileDecision<'a>>, DisaggOutcome<'a>) {
        let mut profiles = Vec::with_capacity(2);
        let decode = self
            .profiles
            .get(plan.decode)
            .map(|p| run_profile(p, Some(Phase::Decode), ctx, rng));
        let decode_pick = decode.as_ref().and_then(ProfileDecision::picked);
        profiles.extend(decode);
        let seen = disagg::prompt_cache(ctx, decode_pick);
        let mut outcome = DisaggOutcome {
            plan,
            seen,
            verdict: PdVerdict::NoDecider,
            prefill: None,
        };
        let Some(stage) = &plan.prefill else {
            return (profiles, outcome);
        };
        if decode_pick.is_none() {
            outcome.verdict = PdVerdict::NoDecodeEndpoint;
            return (profiles, outcome);
        }
        outcome.verdict = disagg::decide(stage.decider, &seen);
        if outcome.verdict != PdVerdict::Prefill {
            return (profiles, outcome);
        }
        let prefill = self
            .profiles
            .get(stage.profile)
            .map(|p| run_profile(p, Some(Phase::Prefill), ctx, rng));
        let prefill_pick = prefill.as_ref().and_then(ProfileDecision::picked);
        profiles.extend(prefill);
        match prefill_pick {
            None => outcome.verdict = PdVerdict::NoPrefillEndpoint,
            Some(p) if Some(p) == decode_pick => outcome.verdict = PdVerdict::SameEndpoint,
            Some(p) => outcome.prefill = Some(p),
        }
        (profiles, outcome)
    }
}

/// Runs one profile; with a `phase` (under `disagg-profile-handler`) the candidates whose
/// role cannot serve it are out before any filter runs.
fn run_profile<'a>(
    profile: &'a Profile,
    phase: Option<Phase>,
    ctx: &Ctx<'_, '_>,
    rng: &mut SplitMix64,
) -> ProfileDecision<'a> {
    let n = ctx.cands.len();
    let mut dropped_by = vec![ALIVE; n];
    if let Some(phase) = phase {
        filter::role(phase, ctx, ROLE_DROPPED, &mut dropped_by);
    }
    let mut notes = Vec::with_capacity(profile.filters.len());
    for (pos, step) in profile.filters.iter().enumerate() {
        // compile() caps the filter count below ROLE_DROPPED.
        let pos = u16::try_from(pos).unwrap_or(ROLE_DROPPED - 1);
        notes.push(match &step.plugin {
            Filter::Utilization(f) => filter::utilization(f, ctx, pos, &mut dropped_by),
            Filter::PrefixAffinity(f) => filter::prefix_affinity(f, ctx, pos, &mut dropped_by),
            Filter::Role(phase) => filter::role(*phase, ctx, pos, &mut dropped_by),
        });
    }
    let mut raw = vec![0.0; profile.scorers.len() * n];
    let mut totals = vec![0.0; n];
    let mut placements = Vec::new();
    if n > 0 {
        for (si, (s, out)) in profile.scorers.iter().zip(raw.chunks_mut(n)).enumerate() {
            if let Some(note) = score::score(s.step.plugin, ctx, &dropped_by, out) {
                placements.push((si, note));
            }
            for ((t, r), d) in totals.iter_mut().zip(out.iter()).zip(&dropped_by) {
                if *d == ALIVE {
                    *t += s.weight * r;
                }
            }
        }
    }
    let ranked = pick::pick(profile.picker.plugin, &totals, &dropped_by, rng);
    ProfileDecision {
        profile,
        phase,
        dropped_by,
        notes,
        raw,
        placements,
        totals,
        ranked,
    }
}
