//! The decision record's JSON form (what `infergate explain` prints), serialized lazily
//! from the indices and scores a [`Decision`] holds:
//!
//! ```text
//! { "picked": "10.0.0.2:8000", "fallbacks": [...], "profile": "default",
//!   "request": {...}, "candidates": [{"address", "metrics_known", "inflight", "prefix_matched_blocks"}],
//!   "profiles": [{ "name", "filters": [{"plugin", "type", "dropped": [...], "outcome": {"note", ...}}],
//!                  "scorers": [{"plugin", "type", "weight", "scores": {addr: {"raw", "weighted"}}}],
//!                  "totals": {addr: total}, "picker": {"plugin", "type"}, "picked", "fallbacks" }] }
//! ```
//!
//! Only candidates still alive when scorers ran appear under `scores` and `totals`. A
//! `rendezvous-placement-scorer` also has `"placement": {"key_blocks", "bound", "sole",
//! "choice", "outcome"}` (see [`super::placement`]).
//!
//! Under `disagg-profile-handler` the record also has `"prefiller"` (the prefill endpoint
//! or null) and `"disaggregation": {"handler", "decode_profile", "prefill_profile",
//! "decider", "decider_type", "prompt_tokens", "cached_tokens", "uncached_tokens",
//! "verdict", "prefill"}`; each profile run for a phase has `"phase"` and `"role_dropped"`
//! (the candidates whose role cannot serve it). Without the handler the record is as above.

use serde::ser::{SerializeMap, SerializeStruct, Serializer};
use serde::Serialize;

use super::decision::{Decision, ProfileDecision};
use super::disagg::DisaggOutcome;
use super::filter::FilterNote;
use super::placement::PlacementNote;

/// Serializes whatever sequence the closure yields (records are built lazily).
struct Seq<F>(F);

impl<F, I> Serialize for Seq<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((self.0)())
    }
}

/// Serializes whatever `(key, value)` pairs the closure yields, as a map.
struct Map<F>(F);

impl<F, I, K, V> Serialize for Map<F>
where
    F: Fn() -> I,
    I: Iterator<Item = (K, V)>,
    K: Serialize,
    V: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map((self.0)())
    }
}

#[derive(Serialize)]
struct RawWeighted {
    raw: f64,
    weighted: f64,
}

impl Serialize for Decision<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Decision", 6)?;
        m.serialize_field("picked", &self.picked_address())?;
        m.serialize_field("fallbacks", &Seq(|| self.fallback_addresses()))?;
        m.serialize_field("profile", &self.profiles.first().map(|p| p.name()))?;
        m.serialize_field("request", &RequestRecord(self))?;
        m.serialize_field(
            "candidates",
            &Seq(|| (0..self.candidates.len()).map(|c| CandidateRecord { d: self, c })),
        )?;
        m.serialize_field(
            "profiles",
            &Seq(|| self.profiles.iter().map(|p| ProfileRecord { d: self, p })),
        )?;
        if let Some(outcome) = &self.disagg {
            m.serialize_field("prefiller", &self.prefill_address())?;
            m.serialize_field("disaggregation", &DisaggRecord { d: self, outcome })?;
        }
        m.end()
    }
}

struct RequestRecord<'r, 'a>(&'r Decision<'a>);

impl Serialize for RequestRecord<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = &self.0.request;
        let mut m = s.serialize_struct("Request", 5)?;
        m.serialize_field("target_model", r.target_model)?;
        m.serialize_field("base_model", r.base_model)?;
        m.serialize_field("prompt_tokens", &r.prompt_tokens)?;
        m.serialize_field("full_blocks", &self.0.full_blocks)?;
        m.serialize_field("last_endpoint_for_session", &r.last_endpoint_for_session)?;
        m.end()
    }
}

struct CandidateRecord<'r, 'a> {
    d: &'r Decision<'a>,
    c: usize,
}

impl Serialize for CandidateRecord<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let cand = self.d.candidates.get(self.c);
        let mut m = s.serialize_struct("Candidate", 4)?;
        m.serialize_field("address", &cand.map(|c| c.address))?;
        m.serialize_field("metrics_known", &cand.is_some_and(|c| c.metrics.is_some()))?;
        m.serialize_field("inflight", &cand.map(|c| c.inflight))?;
        m.serialize_field("prefix_matched_blocks", &self.d.prefix_matched(self.c))?;
        m.end()
    }
}

struct ProfileRecord<'r, 'a> {
    d: &'r Decision<'a>,
    p: &'r ProfileDecision<'a>,
}

impl Serialize for ProfileRecord<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (d, p) = (self.d, self.p);
        let n = d.candidates.len();
        let alive = move |c: &usize| p.alive(*c);
        let addr = move |c: usize| d.address(c).unwrap_or_default();
        let mut m = s.serialize_struct("Profile", 7)?;
        m.serialize_field("name", p.name())?;
        m.serialize_field(
            "filters",
            &Seq(|| {
                p.profile
                    .filters
                    .iter()
                    .enumerate()
                    .map(move |(f, step)| FilterRecord {
                        name: &step.name,
                        plugin_type: &step.plugin_type,
                        dropped: Seq(move || {
                            (0..n)
                                .filter(move |c| {
                                    p.dropped_by.get(*c).is_some_and(|x| usize::from(*x) == f)
                                })
                                .map(addr)
                        }),
                        note: p.notes.get(f),
                    })
            }),
        )?;
        m.serialize_field(
            "scorers",
            &Seq(|| {
                p.profile
                    .scorers
                    .iter()
                    .enumerate()
                    .map(move |(si, step)| ScorerRecord {
                        name: &step.step.name,
                        plugin_type: &step.step.plugin_type,
                        weight: step.weight,
                        placement: p.placement(si).map(|note| PlacementRecord {
                            note,
                            choice: note.choice.and_then(|c| d.address(c)),
                        }),
                        scores: Map(move || {
                            (0..n).filter(alive).map(move |c| {
                                let raw = p.raw_score(si, c).unwrap_or(0.0);
                                (
                                    addr(c),
                                    RawWeighted {
                                        raw,
                                        weighted: raw * step.weight,
                                    },
                                )
                            })
                        }),
                    })
            }),
        )?;
        m.serialize_field(
            "totals",
            &Map(|| {
                (0..n)
                    .filter(alive)
                    .map(|c| (addr(c), p.total(c).unwrap_or(0.0)))
            }),
        )?;
        m.serialize_field(
            "picker",
            &PluginName(&p.profile.picker.name, &p.profile.picker.plugin_type),
        )?;
        m.serialize_field("picked", &p.picked().map(addr))?;
        m.serialize_field("fallbacks", &Seq(|| p.fallbacks().iter().map(|c| addr(*c))))?;
        if let Some(phase) = p.phase() {
            m.serialize_field("phase", phase.as_str())?;
            m.serialize_field(
                "role_dropped",
                &Seq(|| (0..n).filter(|c| p.dropped_by_role(*c)).map(addr)),
            )?;
        }
        m.end()
    }
}

struct DisaggRecord<'r, 'a> {
    d: &'r Decision<'a>,
    outcome: &'r DisaggOutcome<'a>,
}

impl Serialize for DisaggRecord<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (plan, seen) = (self.outcome.plan, self.outcome.seen);
        let stage = plan.prefill.as_ref();
        let mut m = s.serialize_struct("Disaggregation", 10)?;
        m.serialize_field("handler", &plan.handler)?;
        m.serialize_field("decode_profile", &plan.decode_profile)?;
        m.serialize_field("prefill_profile", &stage.map(|s| s.profile_name.as_str()))?;
        m.serialize_field("decider", &stage.map(|s| s.decider_name.as_str()))?;
        m.serialize_field("decider_type", &stage.map(|s| s.decider_type.as_str()))?;
        m.serialize_field("prompt_tokens", &seen.prompt_tokens)?;
        m.serialize_field("cached_tokens", &seen.cached_tokens)?;
        m.serialize_field("uncached_tokens", &seen.uncached_tokens)?;
        m.serialize_field("verdict", &self.outcome.verdict)?;
        m.serialize_field("prefill", &self.d.prefill_address())?;
        m.end()
    }
}

struct FilterRecord<'r, D> {
    name: &'r str,
    plugin_type: &'r str,
    dropped: D,
    note: Option<&'r FilterNote>,
}

impl<D: Serialize> Serialize for FilterRecord<'_, D> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Filter", 4)?;
        m.serialize_field("plugin", self.name)?;
        m.serialize_field("type", self.plugin_type)?;
        m.serialize_field("dropped", &self.dropped)?;
        m.serialize_field("outcome", &self.note)?;
        m.end()
    }
}

struct ScorerRecord<'r, M> {
    name: &'r str,
    plugin_type: &'r str,
    weight: f64,
    scores: M,
    placement: Option<PlacementRecord<'r>>,
}

impl<M: Serialize> Serialize for ScorerRecord<'_, M> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Scorer", 5)?;
        m.serialize_field("plugin", self.name)?;
        m.serialize_field("type", self.plugin_type)?;
        m.serialize_field("weight", &self.weight)?;
        m.serialize_field("scores", &self.scores)?;
        if let Some(p) = &self.placement {
            m.serialize_field("placement", p)?;
        }
        m.end()
    }
}

/// `rendezvous-placement-scorer`'s outcome: `{"key_blocks", "bound", "sole", "choice",
/// "outcome"}`.
struct PlacementRecord<'r> {
    note: &'r PlacementNote,
    choice: Option<&'r str>,
}

impl Serialize for PlacementRecord<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Placement", 5)?;
        m.serialize_field("key_blocks", &self.note.key_blocks)?;
        m.serialize_field("bound", &self.note.bound)?;
        m.serialize_field("sole", &self.note.sole)?;
        m.serialize_field("choice", &self.choice)?;
        m.serialize_field("outcome", &self.note.outcome)?;
        m.end()
    }
}

struct PluginName<'r>(&'r str, &'r str);

impl Serialize for PluginName<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("plugin", self.0)?;
        m.serialize_entry("type", self.1)?;
        m.end()
    }
}
