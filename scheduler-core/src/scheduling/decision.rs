//! The decision record: why a request went where it went.
//!
//! Held cheaply (candidate indices, `f64`s, strings borrowed from the scheduler and the
//! candidates): building it costs a few vectors per profile. Its JSON form (what
//! `infergate explain` prints) is its `Serialize` impl, written in `scheduling::record`.

use alloc::vec::Vec;

use super::compile::Profile;
use super::disagg::DisaggOutcome;
use super::filter::FilterNote;
use super::input::{Candidate, RequestView, ALIVE, ROLE_DROPPED};
use super::placement::PlacementNote;
use super::roles::Phase;

/// The record of one scheduling decision.
#[derive(Clone, Debug)]
pub struct Decision<'a> {
    pub(crate) request: RequestView<'a>,
    pub(crate) candidates: &'a [Candidate<'a>],
    pub(crate) full_blocks: usize,
    pub(crate) prefix_matched: Vec<usize>,
    pub(crate) profiles: Vec<ProfileDecision<'a>>,
    pub(crate) disagg: Option<DisaggOutcome<'a>>,
}

/// What one profile did.
#[derive(Clone, Debug)]
pub struct ProfileDecision<'a> {
    pub(crate) profile: &'a Profile,
    /// The phase it scheduled for, under `disagg-profile-handler`.
    pub(crate) phase: Option<Phase>,
    /// Per candidate: the position of the filter that dropped it, or `ALIVE`.
    pub(crate) dropped_by: Vec<u16>,
    /// Per filter: which branch fired.
    pub(crate) notes: Vec<FilterNote>,
    /// Scorer-major raw scores: scorer `s`, candidate `c` at `s * n + c`.
    pub(crate) raw: Vec<f64>,
    /// What each `rendezvous-placement-scorer` (by scorer position) chose, and why.
    pub(crate) placements: Vec<(usize, PlacementNote)>,
    /// Per candidate: Σ weight × raw (0 for dropped candidates).
    pub(crate) totals: Vec<f64>,
    /// The pick, then the fallbacks in order.
    pub(crate) ranked: Vec<usize>,
}

impl<'a> Decision<'a> {
    pub(crate) fn new(
        request: RequestView<'a>,
        candidates: &'a [Candidate<'a>],
        full_blocks: usize,
        prefix_matched: Vec<usize>,
        profiles: Vec<ProfileDecision<'a>>,
        disagg: Option<DisaggOutcome<'a>>,
    ) -> Self {
        Decision {
            request,
            candidates,
            full_blocks,
            prefix_matched,
            profiles,
            disagg,
        }
    }

    /// What `disagg-profile-handler` decided, when the config declares it.
    pub fn disaggregation(&self) -> Option<&DisaggOutcome<'a>> {
        self.disagg.as_ref()
    }

    /// The prefill endpoint (candidate index) when the request is disaggregated: the
    /// prompt is computed there and the pick decodes it.
    pub fn prefill(&self) -> Option<usize> {
        self.disagg.and_then(|d| d.prefill)
    }

    /// Address of the prefill endpoint (`x-prefiller-host-port`), when disaggregated.
    pub fn prefill_address(&self) -> Option<&'a str> {
        self.prefill().and_then(|c| self.address(c))
    }

    /// Index (into the candidates) of the primary profile's pick; `None` when every
    /// candidate was filtered out or there were none.
    pub fn picked(&self) -> Option<usize> {
        self.profiles.first().and_then(|p| p.picked())
    }

    /// Address of the pick.
    pub fn picked_address(&self) -> Option<&'a str> {
        self.picked().and_then(|c| self.address(c))
    }

    /// The ordered fallback candidates after the pick (primary profile).
    pub fn fallbacks(&self) -> &[usize] {
        self.profiles.first().map_or(&[], |p| p.fallbacks())
    }

    /// Addresses of the fallbacks, in order.
    pub fn fallback_addresses(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.fallbacks().iter().filter_map(|c| self.address(*c))
    }

    /// Every profile's record, primary first.
    pub fn profiles(&self) -> &[ProfileDecision<'a>] {
        &self.profiles
    }

    /// The candidates the decision was made over.
    pub fn candidates(&self) -> &'a [Candidate<'a>] {
        self.candidates
    }

    /// The request's full blocks considered for prefix matching.
    pub fn full_blocks(&self) -> usize {
        self.full_blocks
    }

    /// Leading blocks candidate `c` holds (0 when the index was not consulted).
    pub fn prefix_matched(&self, c: usize) -> usize {
        self.prefix_matched.get(c).copied().unwrap_or(0)
    }

    pub(crate) fn address(&self, c: usize) -> Option<&'a str> {
        self.candidates.get(c).map(|cand| cand.address)
    }
}

impl<'a> ProfileDecision<'a> {
    /// Profile name.
    pub fn name(&self) -> &'a str {
        &self.profile.name
    }

    /// This profile's pick.
    pub fn picked(&self) -> Option<usize> {
        self.ranked.first().copied()
    }

    /// This profile's fallbacks.
    pub fn fallbacks(&self) -> &[usize] {
        self.ranked.get(1..).unwrap_or(&[])
    }

    /// The phase this profile scheduled for (under `disagg-profile-handler`).
    pub fn phase(&self) -> Option<Phase> {
        self.phase
    }

    /// Whether candidate `c` was left out because its role cannot serve the phase.
    pub fn dropped_by_role(&self, c: usize) -> bool {
        self.dropped_by.get(c) == Some(&ROLE_DROPPED)
    }

    /// Whether candidate `c` survived every filter.
    pub fn alive(&self, c: usize) -> bool {
        self.dropped_by.get(c) == Some(&ALIVE)
    }

    /// Name of the filter that dropped candidate `c`, if one did.
    pub fn dropped_by(&self, c: usize) -> Option<&'a str> {
        let pos = *self.dropped_by.get(c)?;
        self.profile
            .filters
            .get(usize::from(pos))
            .map(|f| f.name.as_str())
    }

    /// Which branch filter number `f` (profile order) took.
    pub fn filter_note(&self, f: usize) -> Option<&FilterNote> {
        self.notes.get(f)
    }

    /// Raw score of scorer `s` (profile order) for candidate `c`; `None` if `c` was dropped.
    pub fn raw_score(&self, s: usize, c: usize) -> Option<f64> {
        if !self.alive(c) {
            return None;
        }
        self.raw
            .get(s.checked_mul(self.dropped_by.len())?.checked_add(c)?)
            .copied()
    }

    /// What scorer `s` (profile order) chose, when it is a `rendezvous-placement-scorer`.
    pub fn placement(&self, s: usize) -> Option<&PlacementNote> {
        self.placements
            .iter()
            .find(|(si, _)| *si == s)
            .map(|(_, note)| note)
    }

    /// Weighted score (weight × raw) of scorer `s` for candidate `c`.
    pub fn weighted_score(&self, s: usize, c: usize) -> Option<f64> {
        let w = self.profile.scorers.get(s)?.weight;
        self.raw_score(s, c).map(|r| w * r)
    }

    /// Total of candidate `c`; `None` if it was dropped.
    pub fn total(&self, c: usize) -> Option<f64> {
        if !self.alive(c) {
            return None;
        }
        self.totals.get(c).copied()
    }
}
