//! One-pass parsing of OpenAI and Anthropic request bodies.
//!
//! [`parse`] walks the body once with `serde_json`, borrowing strings from the body where
//! they have no escapes, skipping every field it does not need with `IgnoredAny`, and writing
//! the canonical prompt byte stream directly into one buffer as it goes. It extracts the
//! model, the prompt bytes for prefix hashing ([`crate::prefix`]), an estimated prompt token
//! count, the output token limit and how many sequences may be generated (`n`, `best_of`,
//! the prompts of a batch), `stream`, `stream_options.include_usage` and `cache_salt`.
//!
//! # Canonical prompt byte stream (version 2)
//!
//! The stream is what [`crate::prefix`] cuts into blocks of `blockSizeTokens` × 4 bytes, so
//! it must be identical for identical prompts and must share leading bytes when prompts
//! share a prefix. Control bytes separate the parts:
//! `RS` = 0x1E ends a message, `US` = 0x1F separates fields of a message, `GS` = 0x1D starts
//! the tools section, `SUB` = 0x1A frames a non-text content part.
//!
//! `/v1/completions`:
//! - `prompt` string: its UTF-8 bytes exactly (the JSON escapes decoded), nothing else.
//! - array of strings: the strings' bytes joined with `RS` (so `["abc"]` equals `"abc"`).
//! - array of token ids: each id as 4 little-endian bytes, so one id is one estimated token.
//! - array of token-id arrays: each array as above, joined by the pseudo-token `FF FF FF FF`.
//! - absent or null: empty. Mixing element kinds or ids outside `u32` is a type error.
//!
//! `/v1/chat/completions` and `/v1/messages` (in this order, whatever the JSON key order):
//! 1. Tools, if `tools` is a non-empty array: `GS "tools" US <canonical JSON of tools> RS`.
//!    Canonical JSON is defined in `canonical.rs`: compact, object keys sorted bytewise,
//!    floats in exponent form where that is shorter (version 1 wrote them positionally).
//! 2. Anthropic `system`, if present and not null: `<content> US "system" RS` — the same
//!    bytes an OpenAI `{"role": "system", "content": ...}` message produces.
//! 3. Each message of `messages`, in order:
//!    `<content> US <role> [US "name" US <name>] [US "tool_call_id" US <id>]
//!     [US "tool_calls" US <canonical JSON of tool_calls>] RS`.
//!    Content comes first so it can be copied as it is parsed, whatever the key order.
//!
//! Content is a string (its UTF-8 bytes), null (nothing) or an array of parts, each written
//! in order with no separator:
//! - a text part (`type` absent, `text`, `input_text` or `output_text`): its `text` bytes;
//!   other fields of a text part (e.g. Anthropic `cache_control`) are ignored;
//! - a media part (`image_url`, `image`, `input_image`, `input_audio`, `audio`, `file`,
//!   `input_file`, `document`, `video`, `video_url`): a marker, not its data:
//!   `SUB <type> US <16 lowercase hex digits of xxh3_64(canonical JSON of the part's other
//!   fields)> SUB` — so different images differ while a 1 MB image costs 34 bytes;
//! - any other part (`tool_use`, `tool_result`, `thinking`, ...): `SUB <type> US <canonical
//!   JSON of the part's fields except type and cache_control> SUB`;
//! - a bare string element: its bytes, as a text part.
//!
//! Messages with content missing or null still write their trailer. A missing `messages`
//! (or `prompt`) gives an empty prompt: the engine, not the gateway, rejects it.
//!
//! # Other fields
//!
//! - `prompt_tokens` = ⌈whole prompt bytes / 4⌉ (4 bytes per token), counted even where the
//!   bytes were not stored (below).
//!
//! # Bounds
//!
//! Only the first `maxPrefixTokensToMatch` × 4 bytes of the stream are ever hashed, so
//! [`parse_with_limit`] stores no more than that ([`parse`]: the default producer's 512 KiB)
//! and counts the rest: `prompt` is exactly the first `min(prompt_len, limit)` bytes of the
//! whole stream, so every block hash it covers is unchanged. Nothing in the stream is much
//! longer than the JSON it comes from (at most 6 bytes per escaped control character that
//! took 2, 4 bytes per token id of 1 digit, 16 digits for an integral float like `1e15`), so
//! the whole stream, counted or not, stays within a small multiple of the body, and so does
//! the memory a parse takes: no `serde_json::Value` tree is built (its 32 bytes per value
//! would be 16 times a body of `0,0,0,…`); an object inside tools, tool calls or a non-text
//! part keeps its members' bytes until they are sorted, and a media part keeps its fields'
//! canonical JSON until it is digested.
//! - `max_output_tokens` = `max_completion_tokens` if set, else `max_tokens`.
//! - `output_sequences` = max(`n`, `best_of`, 1) × the prompts of a `/v1/completions` batch
//!   (a `prompt` array of strings or of token-id arrays; 1 for any other prompt and API),
//!   saturating at `u32::MAX` ([`output_sequences`]): how many sequences of up to
//!   `max_output_tokens` each the engine may generate. `n` and `best_of` are read for the
//!   OpenAI APIs only (the Messages API has neither); a `best_of` below `n` is the engine's
//!   error to answer, so the larger of the two counts.
//! - `include_usage` = `stream_options.include_usage`; for `/v1/messages` it is always true,
//!   because the Messages API always reports usage.
//! - JSON null is accepted wherever a field is optional; a repeated key replaces the earlier.
//!
//! # Errors
//!
//! Any [`RequestError`] is a 400 with an OpenAI error body: not JSON, not an
//! object, `model` missing/empty/not a string, or a field read here with the wrong type
//! (the field is named by [`RequestError::param`]).

mod body;
mod canonical;
mod content;
mod error;
mod fast;
mod part;
mod prompt;
mod scalar;
mod scan;
mod stream;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
#[cfg(test)]
mod tests_fast;
mod utf8;

pub use error::RequestError;

use crate::types::Tokens;
use alloc::string::String;
use alloc::vec::Vec;
use serde::de::DeserializeSeed;

/// Ends a message in the canonical stream.
pub const RS: u8 = 0x1e;
/// Separates fields of a message in the canonical stream.
pub const US: u8 = 0x1f;
/// Starts the tools section of the canonical stream.
pub const GS: u8 = 0x1d;
/// Frames a non-text content part in the canonical stream.
pub const SUB: u8 = 0x1a;

/// Which inference API a request targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// Anthropic `/v1/messages`.
    AnthropicMessages,
}

impl Api {
    /// The API served at `path` (a query string is ignored), or `None` for any other path.
    pub fn from_path(path: &str) -> Option<Api> {
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        match path {
            "/v1/chat/completions" => Some(Api::ChatCompletions),
            "/v1/completions" => Some(Api::Completions),
            "/v1/messages" => Some(Api::AnthropicMessages),
            _ => None,
        }
    }

    /// The canonical path of this API.
    pub fn path(self) -> &'static str {
        match self {
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::AnthropicMessages => "/v1/messages",
        }
    }
}

/// What the gateway needs from a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedRequest {
    /// The API the body was parsed as.
    pub api: Api,
    /// The requested model name (non-empty).
    pub model: String,
    /// The leading bytes of the canonical prompt byte stream (module doc), input to prefix
    /// hashing: all of it, or its first `max_prompt_bytes` ([`parse_with_limit`]).
    pub prompt: Vec<u8>,
    /// Length of the whole canonical prompt, stored or not (`prompt.len()` when not cut).
    pub prompt_len: usize,
    /// Estimated prompt tokens: `prompt_len / 4`, rounded up.
    pub prompt_tokens: Tokens,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `n` (OpenAI APIs): completions returned per prompt.
    pub n: Option<u64>,
    /// `best_of` (OpenAI APIs): sequences generated per prompt, of which the best `n` are
    /// returned.
    pub best_of: Option<u64>,
    /// The prompts of a `/v1/completions` batch (`prompt` as an array of strings or of
    /// token-id arrays); 1 for any other prompt and API.
    pub prompts: u64,
    /// How many sequences the engine may generate, each up to `max_output_tokens`:
    /// [`output_sequences`] of `n`, `best_of` and `prompts` (at least 1).
    pub output_sequences: u32,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage` (always true for `/v1/messages`).
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` (vLLM: usage on every streamed chunk).
    pub continuous_usage: bool,
    /// vLLM's `cache_salt`, which isolates prefix caching between tenants.
    pub cache_salt: Option<String>,
}

/// How many sequences the engine may generate for a request with these `n`, `best_of` and
/// prompt count: max(`n`, `best_of`, 1) for each prompt (vLLM generates `best_of` sequences
/// per prompt when it is set, `n` otherwise), times `prompts` (at least 1). Saturates at
/// `u32::MAX`, whatever the inputs.
pub fn output_sequences(n: Option<u64>, best_of: Option<u64>, prompts: u64) -> u32 {
    let per_prompt = n.unwrap_or(1).max(best_of.unwrap_or(1)).max(1);
    let total = per_prompt.saturating_mul(prompts.max(1));
    u32::try_from(total).unwrap_or(u32::MAX)
}

/// Estimated tokens for a prompt byte stream of `len` bytes (4 bytes per token, rounded up).
pub fn estimate_tokens(len: usize) -> Tokens {
    Tokens((len as u64).div_ceil(4))
}

/// The most canonical prompt bytes [`parse`] stores: what the default
/// `approx-prefix-cache-producer` hashes (`maxPrefixTokensToMatch` 131072 × 4 bytes).
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 131_072 * crate::prefix::BYTES_PER_TOKEN;

/// Parses `body` as a request to `api` in one pass, storing at most
/// [`DEFAULT_MAX_PROMPT_BYTES`] of the prompt (see [`parse_with_limit`]).
pub fn parse(api: Api, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    parse_with_limit(api, body, DEFAULT_MAX_PROMPT_BYTES)
}

/// Parses `body` as a request to `api` in one pass, storing only the first
/// `max_prompt_bytes` of the canonical prompt (hashing never reads further: pass
/// [`crate::prefix::PrefixConfig::max_prompt_bytes`]). The rest is counted, not stored, so
/// [`ParsedRequest::prompt_len`] and the token estimate cover the whole prompt, and the
/// stored bytes are exactly the leading bytes of the whole prompt.
pub fn parse_with_limit(
    api: Api,
    body: &[u8],
    max_prompt_bytes: usize,
) -> Result<ParsedRequest, RequestError> {
    match fast::parse(api, body, max_prompt_bytes) {
        Some(parts) => finish(api, parts),
        None => parse_serde(api, body, max_prompt_bytes),
    }
}

/// The `serde_json` path: every body the fast path ([`fast`]) leaves, and every error. It is
/// also the reference the fast path is tested against.
fn parse_serde(
    api: Api,
    body: &[u8],
    max_prompt_bytes: usize,
) -> Result<ParsedRequest, RequestError> {
    // The canonical stream is never much longer than the JSON it comes from.
    let mut prompt = stream::Stream::with_limit(max_prompt_bytes, body.len());
    let mut tools = stream::Stream::with_limit(max_prompt_bytes, 0);
    let mut system = stream::Stream::with_limit(max_prompt_bytes, 0);
    let mut err = None;
    let mut fields = body::Fields::default();
    if !utf8::is_valid(body) {
        return Err(RequestError::NotJson);
    }
    debug_assert!(core::str::from_utf8(body).is_ok());
    // SAFETY: `utf8::is_valid` accepts exactly the well-formed UTF-8 that
    // `core::str::from_utf8` accepts (property-tested against it in `utf8.rs`).
    let text = unsafe { core::str::from_utf8_unchecked(body) };
    // The `&str` reader does not re-validate each string: see `utf8.rs` for why.
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = body::BodySeed {
        api,
        bufs: body::Buffers {
            prompt: &mut prompt,
            tools: &mut tools,
            system: &mut system,
            err: &mut err,
            fields: &mut fields,
        },
    };
    if seed.deserialize(&mut de).and_then(|()| de.end()).is_err() {
        return Err(err.unwrap_or(RequestError::NotJson));
    }
    let parts = fast::Parts {
        prompt,
        tools,
        system,
        fields,
    };
    finish(api, parts)
}

/// The request from the parsed parts: the prompt sections joined in their order.
fn finish(api: Api, parts: fast::Parts) -> Result<ParsedRequest, RequestError> {
    let fast::Parts {
        mut prompt,
        tools,
        system,
        fields,
    } = parts;
    let model = fields.model.ok_or(RequestError::MissingModel)?;
    if !tools.is_empty() || !system.is_empty() {
        // Tools, then the system prompt, then the messages, whatever their order in the body.
        prompt = prompt.prepend(&[&tools, &system]);
    }
    let prompt_len = prompt.len();
    let prompts = fields.prompts.max(1);
    Ok(ParsedRequest {
        api,
        model,
        prompt_tokens: estimate_tokens(prompt_len),
        prompt_len,
        prompt: prompt.into_bytes(),
        max_output_tokens: fields.max_completion_tokens.or(fields.max_tokens),
        n: fields.n,
        best_of: fields.best_of,
        prompts,
        output_sequences: output_sequences(fields.n, fields.best_of, prompts),
        stream: fields.stream,
        include_usage: fields.include_usage || api == Api::AnthropicMessages,
        continuous_usage: fields.continuous_usage,
        cache_salt: fields.cache_salt,
    })
}

/// The `serde_json` path alone: the reference the fast path is tested against (by the
/// proptests here, and by the request parser's fuzz target through the `reference-parser`
/// feature).
#[cfg(any(test, feature = "reference-parser"))]
#[doc(hidden)]
pub fn parse_reference(
    api: Api,
    body: &[u8],
    max_prompt_bytes: usize,
) -> Result<ParsedRequest, RequestError> {
    parse_serde(api, body, max_prompt_bytes)
}
