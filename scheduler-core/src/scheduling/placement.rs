//! `rendezvous-placement-scorer`: where a prefix nobody knows goes, chosen the same way by
//! every gateway replica and every worker, without them talking to each other.
//!
//! The approximate prefix index only knows where *this* process sent a prefix. With several
//! gateway replicas, the replica that receives a conversation's second turn has often never
//! seen the first, and without a shared rule it places the turn by load alone, away from the
//! cache. This scorer is that shared rule: a pure function of the prompt and of what every
//! replica sees alike (the pool's members and their scraped load).
//!
//! # The rule
//!
//! With `k` = `keyBlocks` and `t` the request's full blocks considered for matching:
//!
//! 1. **Key.** `d = min(k, t)`; the key is the chained hash of the prompt's block `d − 1`,
//!    which covers blocks `0..d` (see [`crate::prefix`]). `d = 0` (no full block): abstain.
//! 2. **Rendezvous (highest random weight).** Each alive candidate `e` gets the weight
//!    [`rendezvous_weight`]`(key, e.address)`, a fixed 64-bit hash (XXH3 with the key as
//!    seed, the same on every target). Walking the candidates by descending weight, the
//!    choice is the first whose load is under the bound.
//! 3. **Bounded load** (consistent hashing with bounded loads, Mirrokni, Thorup and
//!    Zadimoghaddam): with `n` alive candidates and `L` the sum of their loads, a candidate
//!    is eligible when `load + 1 ≤ ⌈c · (L + 1) / n⌉`, `c` = `loadFactor` (≥ 1). Some
//!    candidate is always eligible: the least loaded one is at most `⌊L / n⌋`, and the bound
//!    is at least `⌊L / n⌋ + 1`. A candidate's load is the larger of its scraped
//!    `running + waiting` (when its metrics are fresh) and this proxy's in-flight requests to
//!    it; scraped load is what all replicas see alike, in-flight load covers the time between
//!    scrapes.
//! 4. **Known prefixes win.** When the prefix index already places the key's blocks on
//!    another candidate (it holds all `d` of them and the choice holds fewer), the scorer
//!    abstains and the prefix scorer decides: an earlier turn went there, and the cache
//!    there is worth more than agreement.
//!
//! 5. **A sole gateway balances.** When this proxy's own in-flight requests make up at
//!    least `soleShare` (default 0.75) of the pool's scraped `running + waiting`, no other
//!    gateway sends the pool much: later turns of a conversation come back here, where the
//!    prefix index keeps them on the endpoint of their first turn, and agreement with other
//!    replicas buys nothing. The choice is then the candidate with the least *sole load*,
//!    the heaviest rendezvous weight among equals, and the bound is not applied. The sole
//!    load is this proxy's own in-flight requests there (exact and current, where the
//!    scrape lags by up to its interval) plus its prefills in progress (its requests there
//!    whose response has not started): a prefill weighs double. New conversations spread
//!    over the endpoints as evenly as round robin spreads requests, and cold prefills
//!    spread too: conversations placed together run in step, those that started on one
//!    endpoint together end together, and least-requests alone would send every one of
//!    their successors' cold prompts back there at once. With several gateways each carries a
//!    fraction of the load and the bounded rendezvous holds. The share is a function of
//!    what every replica sees too (its own traffic against the pool's scraped load), so
//!    gateways of one fleet keep the shared rule together.
//! 6. **An idle pool follows `idleRule`.** With no scraped load at all (an idle pool, or no
//!    fresh metrics) nothing tells a gateway whether it is alone, and the two rules trade
//!    against each other on the first burst of conversations. `shared` (the default) keeps
//!    the bounded rendezvous: every gateway of a fleet places a common first burst alike,
//!    and one gateway alone lets an endpoint take up to `loadFactor` times its share of
//!    those cold prefills. `sole` balances as rule 5 does: one gateway's first burst spreads
//!    evenly, and each gateway of a fleet places its share of a common burst away from the
//!    rendezvous choice, where a later turn sent to another gateway misses (`bench
//!    replicas`, 2 native gateways: turns 2+ kept 0.955× of one gateway's hit ratio under
//!    `sole`, against 0.990× under `shared`). `sole` suits one gateway per pool, a fleet
//!    behind a session-affine balancer, and the precise (KV-event) index, with which every
//!    gateway finds the blocks wherever they went.
//!
//! The choice scores 1, every other candidate 0; abstaining scores 0 everywhere. The
//! decision record shows the key's depth, the bound, the choice and the outcome
//! ([`PlacementNote`]).
//!
//! # Why the first `k` blocks
//!
//! Keyed on the first block alone, every conversation that opens with the same system
//! prompt (a popular assistant's instructions, a shared tool list) has the same key and the
//! same first choice: the bound keeps that endpoint from taking more than its share, but
//! the spill goes to the same second choice, and so on. Keyed on the whole prompt, every
//! turn of a conversation would have a new key and a new endpoint. The first `k` blocks
//! (default 8: 512 tokens at the approximate index's 64-token blocks) sit between: long
//! enough that conversations sharing a short preamble are told apart by what follows it,
//! short enough that they stay fixed from a conversation's first turn on, so every turn maps
//! to the same endpoint. Prompts shorter than `k` blocks are keyed on all their blocks;
//! their key changes while they grow to `k` blocks (a short first turn may be placed
//! elsewhere than its second), which costs little: a short prompt has little to cache.
//! Conversations sharing more than `k` blocks share a key and one endpoint up to the
//! bound, which is also where their shared prefix is cached.
//!
//! # Why a factor of 2
//!
//! The bound trades affinity for balance: a turn whose endpoint is over the bound goes to
//! the next one, which a gateway that has not seen the conversation cannot know holds
//! nothing of it. Bounded-load hashing's usual `c = 1.25` assumes loads of many units per
//! endpoint; an LLM endpoint runs a handful of requests, and at those loads rounding and
//! ordinary hashing variance put the busiest endpoint above `1.25 ×` the mean much of the
//! time. Measured with the calibration workload's quick form (64 conversations, 16 in
//! flight over 4 endpoints) through two gateways, turns 2+ kept this share of one
//! gateway's cache-hit ratio: `c = 1.25` 0.85, `1.5` 0.93, `2` 0.98, unbounded 1.00. A
//! factor of 2 still stops a hot spot (a shared system prompt longer than the key sends
//! every conversation to one first choice; it takes at most twice its share) and keeps
//! turns where their cache is.
//!
//! Cost: one hash per alive candidate and one pass; no allocation.

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::input::{Ctx, ALIVE};
use crate::types::BlockHash;

/// Default `keyBlocks`: the first 8 blocks (512 tokens at 64-token blocks).
pub const DEFAULT_KEY_BLOCKS: u32 = 8;

/// Default `loadFactor`: an endpoint takes new prefixes until it carries twice the pool's
/// mean load (see "Why a factor of 2" in the module doc).
pub const DEFAULT_LOAD_FACTOR: f64 = 2.0;

/// Largest `keyBlocks` accepted.
pub const MAX_KEY_BLOCKS: u32 = 1 << 16;

/// Largest `loadFactor` accepted (beyond it the bound never binds).
pub const MAX_LOAD_FACTOR: f64 = 1_000.0;

/// Default `soleShare`: the share of the pool's scraped load this proxy's in-flight
/// requests must reach for it to count as the pool's sole gateway.
pub const DEFAULT_SOLE_SHARE: f64 = 0.75;

/// `idleRule`: how a cold prompt is placed while the pool shows no scraped load (rule 6 of
/// the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdleRule {
    /// The bounded rendezvous every gateway of a fleet applies alike.
    #[default]
    Shared,
    /// The least loaded endpoint by this proxy's own in-flight requests and prefills.
    Sole,
}

/// `rendezvous-placement-scorer` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlacementScorer {
    /// `keyBlocks`, ≥ 1: how many leading blocks the key covers.
    pub key_blocks: u32,
    /// `loadFactor`, ≥ 1: the bound on an endpoint's load, as a multiple of the mean.
    pub load_factor: f64,
    /// `soleShare`, in (0, 1]: this proxy's share of the pool's scraped load from which it
    /// counts as the sole gateway.
    pub sole_share: f64,
    /// `idleRule`: the rule while the pool shows no scraped load.
    pub idle_rule: IdleRule,
}

impl Default for PlacementScorer {
    fn default() -> Self {
        PlacementScorer {
            key_blocks: DEFAULT_KEY_BLOCKS,
            load_factor: DEFAULT_LOAD_FACTOR,
            sole_share: DEFAULT_SOLE_SHARE,
            idle_rule: IdleRule::Shared,
        }
    }
}

/// What the scorer did for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementOutcome {
    /// The choice scored 1.
    Placed,
    /// The prompt has no full block: nothing to key on.
    NoFullBlock,
    /// The prefix index holds the key's blocks on another candidate.
    KnownElsewhere,
    /// No candidate was alive.
    NoCandidate,
}

/// The decision record's view of one placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementNote {
    /// Blocks the key covers (`d`).
    pub key_blocks: usize,
    /// The load bound `⌈c · (L + 1) / n⌉`.
    pub bound: u64,
    /// Whether this proxy counted as the pool's sole gateway (rules 5 and 6: the bound was
    /// not applied).
    pub sole: bool,
    /// The chosen candidate (its index), also when the scorer abstained because the prefix
    /// is known elsewhere.
    pub choice: Option<usize>,
    /// What happened.
    pub outcome: PlacementOutcome,
}

/// The rendezvous weight of `address` for `key`: XXH3-64 of the address bytes, seeded
/// with the key. Fixed across versions and targets (every replica must agree).
pub fn rendezvous_weight(key: BlockHash, address: &str) -> u64 {
    xxh3_64_with_seed(address.as_bytes(), key.0)
}

/// `⌈c · (L + 1) / n⌉` for `n` ≥ 1 candidates carrying `total` load.
pub fn load_bound(load_factor: f64, total: u64, n: usize) -> u64 {
    let x = load_factor * (total as f64 + 1.0) / n.max(1) as f64;
    if x.is_nan() || x <= 1.0 {
        return 1;
    }
    if x >= u64::MAX as f64 {
        return u64::MAX;
    }
    // Rounded up (no_std has no `f64::ceil`): truncate, then add the part cut off.
    let t = x as u64;
    if (t as f64) < x {
        t + 1
    } else {
        t
    }
}

/// Writes the scorer's raw scores for the alive candidates into `out` and says why.
pub(crate) fn score(
    p: PlacementScorer,
    ctx: &Ctx<'_, '_>,
    dropped_by: &[u16],
    out: &mut [f64],
) -> PlacementNote {
    let alive = || {
        dropped_by
            .iter()
            .enumerate()
            .filter(|(_, d)| **d == ALIVE)
            .map(|(c, _)| c)
    };
    let depth = ctx
        .full_blocks
        .min(usize::try_from(p.key_blocks).unwrap_or(usize::MAX));
    let mut note = PlacementNote {
        key_blocks: depth,
        bound: 0,
        sole: false,
        choice: None,
        outcome: PlacementOutcome::NoFullBlock,
    };
    let Some(key) = depth
        .checked_sub(1)
        .and_then(|i| ctx.req.block_hashes.get(i))
        .copied()
    else {
        return note;
    };
    let (mut total, mut n, mut own) = (0u64, 0usize, 0u64);
    let mut scraped: Option<u64> = None;
    for c in alive() {
        total = total.saturating_add(load(ctx, c));
        n += 1;
        if let Some(cand) = ctx.cands.get(c) {
            own = own.saturating_add(u64::from(cand.inflight.requests));
            if let Some(l) = scraped_load(cand) {
                scraped = Some(scraped.unwrap_or(0).saturating_add(l));
            }
        }
    }
    if n == 0 {
        note.outcome = PlacementOutcome::NoCandidate;
        return note;
    }
    note.sole = match scraped {
        Some(s) if s > 0 => own as f64 >= p.sole_share * s as f64,
        _ => p.idle_rule == IdleRule::Sole,
    };
    let bound = load_bound(p.load_factor, total, n);
    note.bound = bound;
    // Fleet: descending weight, first under the bound = the heaviest eligible candidate.
    // Sole: the least sole load, then the heaviest weight. Address order breaks the
    // (astronomically unlikely) tie, so every replica still agrees.
    let rank = |c: usize, w: u64| {
        if note.sole {
            (u64::MAX - sole_load(ctx, c), w)
        } else {
            (0, w)
        }
    };
    let mut best: Option<((u64, u64), &str, usize)> = None;
    for c in alive() {
        if !note.sole && load(ctx, c).saturating_add(1) > bound {
            continue;
        }
        let address = ctx.cands.get(c).map_or("", |cand| cand.address);
        let r = rank(c, rendezvous_weight(key, address));
        if best.is_none_or(|(br, ba, _)| (r, address) > (br, ba)) {
            best = Some((r, address, c));
        }
    }
    let Some((_, _, choice)) = best else {
        note.outcome = PlacementOutcome::NoCandidate;
        return note;
    };
    note.choice = Some(choice);
    let known_elsewhere =
        ctx.matched(choice) < depth && alive().any(|q| q != choice && ctx.matched(q) >= depth);
    if known_elsewhere {
        note.outcome = PlacementOutcome::KnownElsewhere;
        for c in alive() {
            if let Some(o) = out.get_mut(c) {
                *o = 0.0;
            }
        }
        return note;
    }
    note.outcome = PlacementOutcome::Placed;
    for c in alive() {
        if let Some(o) = out.get_mut(c) {
            *o = if c == choice { 1.0 } else { 0.0 };
        }
    }
    note
}

/// A candidate's load: the larger of its scraped `running + waiting` and this proxy's
/// in-flight requests to it.
fn load(ctx: &Ctx<'_, '_>, c: usize) -> u64 {
    let Some(cand) = ctx.cands.get(c) else {
        return 0;
    };
    scraped_load(cand)
        .unwrap_or(0)
        .max(u64::from(cand.inflight.requests))
}

/// A candidate's load as a sole gateway sees it: its own in-flight requests plus its
/// prefills in progress.
fn sole_load(ctx: &Ctx<'_, '_>, c: usize) -> u64 {
    ctx.cands.get(c).map_or(0, |cand| {
        u64::from(cand.inflight.requests) + u64::from(cand.inflight.prefilling)
    })
}

/// A candidate's scraped `running + waiting`, when its metrics are fresh.
fn scraped_load(cand: &super::input::Candidate<'_>) -> Option<u64> {
    cand.metrics
        .map(|m| u64::from(m.running.unwrap_or(0)) + u64::from(m.waiting.unwrap_or(0)))
}
