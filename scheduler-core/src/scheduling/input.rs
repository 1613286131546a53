//! What one request brings to the scheduler and what its plugins read: the request view,
//! the candidates, the prefix-index question ([`PrefixMatch`]), the per-request context
//! filters and scorers share, and the `dropped_by` markers of a profile's run.
//!
//! A leaf of [`super`]: the per-request path ([`super::run`]), the plugins' semantics
//! ([`super::filter`], [`super::score`], [`super::pick`], [`super::placement`],
//! [`super::disagg`]), the compiler ([`super::compile`]) and the decision record
//! ([`super::decision`]) all read it, and it reads none of them.

use alloc::vec::Vec;

use super::roles::Role;
use crate::latency::ObservedLatency;
use crate::metrics::EndpointMetrics;
use crate::prefix::PrefixIndex;
use crate::types::{BlockHash, InFlight, Tokens};

/// What the scheduler needs to know about the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestView<'a> {
    /// The model the request targets (after any rewrite): an adapter or the base model.
    pub target_model: &'a str,
    /// The pool's base model (`x-gateway-base-model-name`).
    pub base_model: &'a str,
    /// The prompt's full-block hashes (see [`crate::prefix`]).
    pub block_hashes: &'a [BlockHash],
    /// Estimated prompt tokens.
    pub prompt_tokens: Tokens,
    /// The endpoint that last served this request's session, if the proxy knows it.
    pub last_endpoint_for_session: Option<&'a str>,
}

/// One endpoint of the pool that may serve the request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// `ip:port`, as written to `x-gateway-destination-endpoint`.
    pub address: &'a str,
    /// Latest scraped metrics; `None` when unknown (never scraped, or stale).
    pub metrics: Option<&'a EndpointMetrics>,
    /// What this proxy has in flight to the endpoint.
    pub inflight: InFlight,
    /// Which phase it serves (prefill/decode disaggregation); [`Role::Both`] by default.
    pub role: Role,
    /// The latency this proxy measured there, when its estimate counts (see
    /// [`crate::latency`]); `None`: not measured (lately).
    pub latency: Option<ObservedLatency>,
}

/// "How many leading blocks of `hashes` does this endpoint hold?" — the one question the
/// scheduler asks of the prefix index ([`PrefixIndex`] in production; fakes in tests).
pub trait PrefixMatch {
    /// Leading blocks of `hashes` recorded for `endpoint` (0 for an unknown endpoint).
    fn matched_blocks(&self, endpoint: &str, hashes: &[BlockHash]) -> usize;

    /// [`PrefixMatch::matched_blocks`] for every candidate, in order (`out` is cleared
    /// first). An index that can skip the endpoints holding nothing of the request in one
    /// step overrides it ([`PrefixIndex`] does).
    fn match_candidates(
        &self,
        candidates: &[Candidate<'_>],
        hashes: &[BlockHash],
        out: &mut Vec<usize>,
    ) {
        out.clear();
        out.extend(
            candidates
                .iter()
                .map(|c| self.matched_blocks(c.address, hashes)),
        );
    }
}

/// A prefix index that holds nothing (for configs without prefix plugins, and tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPrefixIndex;

impl PrefixMatch for NoPrefixIndex {
    fn matched_blocks(&self, _endpoint: &str, _hashes: &[BlockHash]) -> usize {
        0
    }
}

impl PrefixMatch for PrefixIndex {
    fn matched_blocks(&self, endpoint: &str, hashes: &[BlockHash]) -> usize {
        self.match_endpoint(endpoint, hashes)
    }

    fn match_candidates(
        &self,
        candidates: &[Candidate<'_>],
        hashes: &[BlockHash],
        out: &mut Vec<usize>,
    ) {
        self.match_names(candidates.iter().map(|c| c.address), hashes, out);
    }
}

/// What filters and scorers read during one request.
pub(crate) struct Ctx<'r, 'a> {
    pub(crate) req: &'r RequestView<'a>,
    pub(crate) cands: &'r [Candidate<'a>],
    matched: &'r [usize],
    /// The request's full blocks considered for matching (the prefix-score denominator).
    pub(crate) full_blocks: usize,
    pub(crate) block_size_tokens: u32,
}

impl<'r, 'a> Ctx<'r, 'a> {
    /// The context of `req` over `cands`, with each candidate's matched leading blocks
    /// (`matched`, empty when the prefix index was not asked).
    pub(crate) fn new(
        req: &'r RequestView<'a>,
        cands: &'r [Candidate<'a>],
        matched: &'r [usize],
        full_blocks: usize,
        block_size_tokens: u32,
    ) -> Self {
        Ctx {
            req,
            cands,
            matched,
            full_blocks,
            block_size_tokens,
        }
    }

    /// Leading blocks of the request held by candidate `c` (0 if unknown).
    pub(crate) fn matched(&self, c: usize) -> usize {
        self.matched.get(c).copied().unwrap_or(0)
    }
}

/// Marker in `dropped_by` for an endpoint no filter dropped.
pub(crate) const ALIVE: u16 = u16::MAX;

/// Marker in `dropped_by` for an endpoint whose role cannot serve the profile's phase under
/// `disagg-profile-handler` (before any filter ran). Filter positions stay below it.
pub(crate) const ROLE_DROPPED: u16 = u16::MAX - 1;
