//! The router → picker handoff: what the picker needs from a request body, computed once by
//! the body router and passed on as per-stream filter state, so the picker neither buffers
//! nor parses the body a second time.
//!
//! The router parses the body anyway (to route on the model), so after a successful parse
//! it stores a [`Handoff`] under [`HANDOFF_KEY`] through [`crate::host::StreamState`]: the
//! base model it routed to, the target model, the prompt-token estimate, the output cap, how
//! many sequences the engine may generate and the prompt's chained block hashes (seeded with the target model and `cache_salt`, cut at
//! the pool's `blockSizeTokens`). The picker, in its headers callback (which Envoy runs only
//! after the router let the complete body through), takes the handoff if it is present,
//! decodes, and fits its own pool (same base model, same block size); otherwise it falls
//! back to pausing for and parsing the body itself. When the pick stage runs in the same
//! pipeline as the route stage (`crate::stages::RouteStage::before_pick_stage`), the
//! handoff passes in the request's context as a value instead, with no encoding.
//!
//! **Trust.** Filter state is written only by filters of this stream, never by a client: a
//! client can send headers and a body, not filter state, and the router strips client
//! `x-gateway-*` headers before anything reads them. The worst a wrong handoff could do is
//! what a wrong body could: the picker still picks only among its own pool's endpoints.
//!
//! **Encoding** (all integers little-endian), version [`HANDOFF_VERSION`]:
//! `"IGH"` ‖ `u8` version ‖ `u32` block size (tokens) ‖ `u8` flags (bit 0: output cap
//! present, bit 1: hashes cover every full block of the prompt) ‖ `u64` prompt tokens ‖
//! `u64` output cap (0 if absent) ‖ `u32` output sequences (at least 1) ‖ `u16` len ‖ base
//! model ‖ `u16` len ‖ target model ‖ `u32` count ‖ count × `u64` block hash.
//! [`Handoff::decode`] rejects anything else (wrong magic or version, short, trailing bytes,
//! unknown flags, 0 sequences, bad UTF-8) and never panics. Version 2 added the output
//! sequences; router and picker are always of one build, so a version-1 handoff is refused
//! (the picker then parses the body itself).

use crate::codec::Reader;
use scheduler_core::prefix::{self, PrefixConfig};
use scheduler_core::request::ParsedRequest;
use scheduler_core::types::{BlockHash, Tokens};

/// The per-stream state key the router writes and the picker reads.
pub const HANDOFF_KEY: &str = "infergate_handoff";

/// The encoding version this build writes and accepts.
pub const HANDOFF_VERSION: u8 = 2;

const MAGIC: &[u8; 3] = b"IGH";
const FLAG_MAX_OUTPUT: u8 = 1;
const FLAG_COMPLETE: u8 = 2;

/// What the picker needs of one parsed request (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    /// The base model the router routed the request to.
    pub base_model: String,
    /// The model the request is served as: the `model` field, or the target a model rewrite
    /// chose for it (the prefix-hash seed and the LoRA scorer read it).
    pub target_model: String,
    /// Estimated prompt tokens.
    pub prompt_tokens: Tokens,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u64>,
    /// How many sequences the engine may generate, each up to `max_output_tokens`
    /// (`scheduler_core::request::ParsedRequest::output_sequences`, at least 1).
    pub output_sequences: u32,
    /// Tokens per block the hashes were cut at.
    pub block_size_tokens: u32,
    /// Whether `block_hashes` covers every full block of the prompt (not cut short by the
    /// router's `maxPrefixTokensToMatch`).
    pub complete: bool,
    /// The prompt's chained block hashes.
    pub block_hashes: Vec<BlockHash>,
}

impl Handoff {
    /// Build the handoff of `parsed`, routed to `base_model`, hashing at `block_size_tokens`.
    pub fn from_parsed(parsed: &ParsedRequest, base_model: &str, block_size_tokens: u32) -> Self {
        let cfg = PrefixConfig {
            block_size_tokens,
            ..PrefixConfig::default()
        };
        let seed = prefix::seed(&parsed.model, parsed.cache_salt.as_deref());
        let block_hashes = prefix::block_hashes(seed, &parsed.prompt, &cfg);
        // Against the whole prompt's length: the parse may have kept only its leading bytes.
        let complete = block_hashes.len() >= cfg.full_blocks(parsed.prompt_len);
        Handoff {
            base_model: base_model.to_owned(),
            target_model: parsed.model.clone(),
            prompt_tokens: parsed.prompt_tokens,
            max_output_tokens: parsed.max_output_tokens,
            output_sequences: parsed.output_sequences.max(1),
            block_size_tokens,
            complete,
            block_hashes,
        }
    }

    /// The block hashes a picker with prefix config `cfg` would compute itself, or `None`
    /// if this handoff cannot stand in for them (other block size, or cut shorter than
    /// `cfg` would hash).
    pub fn hashes_for(&self, cfg: &PrefixConfig) -> Option<&[BlockHash]> {
        if cfg.block_size_tokens != self.block_size_tokens {
            return None;
        }
        let max = cfg.max_blocks();
        if !self.complete && self.block_hashes.len() < max {
            return None;
        }
        self.block_hashes.get(..self.block_hashes.len().min(max))
    }

    /// The binary encoding (module doc). Names longer than `u16::MAX` bytes are not
    /// encodable (`None`); model names never are that long.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let base = u16::try_from(self.base_model.len()).ok()?;
        let target = u16::try_from(self.target_model.len()).ok()?;
        let count = u32::try_from(self.block_hashes.len()).ok()?;
        let mut out = Vec::with_capacity(
            40 + self.base_model.len() + self.target_model.len() + 8 * self.block_hashes.len(),
        );
        out.extend_from_slice(MAGIC);
        out.push(HANDOFF_VERSION);
        out.extend_from_slice(&self.block_size_tokens.to_le_bytes());
        let mut flags = 0;
        if self.max_output_tokens.is_some() {
            flags |= FLAG_MAX_OUTPUT;
        }
        if self.complete {
            flags |= FLAG_COMPLETE;
        }
        out.push(flags);
        out.extend_from_slice(&self.prompt_tokens.0.to_le_bytes());
        out.extend_from_slice(&self.max_output_tokens.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.output_sequences.max(1).to_le_bytes());
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(self.base_model.as_bytes());
        out.extend_from_slice(&target.to_le_bytes());
        out.extend_from_slice(self.target_model.as_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        for hash in &self.block_hashes {
            out.extend_from_slice(&hash.0.to_le_bytes());
        }
        Some(out)
    }

    /// Decode [`Handoff::encode`]'s output; `None` for anything else (never panics).
    pub fn decode(bytes: &[u8]) -> Option<Handoff> {
        let mut r = Reader(bytes);
        if r.take(3)? != MAGIC || r.u8()? != HANDOFF_VERSION {
            return None;
        }
        let block_size_tokens = r.u32()?;
        let flags = r.u8()?;
        if flags & !(FLAG_MAX_OUTPUT | FLAG_COMPLETE) != 0 {
            return None;
        }
        let prompt_tokens = Tokens(r.u64()?);
        let max_output = r.u64()?;
        let output_sequences = r.u32()?;
        if output_sequences == 0 {
            return None;
        }
        let base_model = r.string()?;
        let target_model = r.string()?;
        let block_hashes = r.u64s()?.into_iter().map(BlockHash).collect();
        if !r.is_empty() {
            return None;
        }
        Some(Handoff {
            base_model,
            target_model,
            prompt_tokens,
            max_output_tokens: (flags & FLAG_MAX_OUTPUT != 0).then_some(max_output),
            output_sequences,
            block_size_tokens,
            complete: flags & FLAG_COMPLETE != 0,
            block_hashes,
        })
    }
}

#[cfg(test)]
mod tests;
