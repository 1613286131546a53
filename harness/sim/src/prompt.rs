//! Turns OpenAI request bodies into what the engine needs: a prompt byte stream, a token
//! count (4 bytes per token, the gateway's estimate) and chained block hashes.
//!
//! Chat prompts are serialized as `<|role|>\n` + content + `\n` per message, in order, then
//! the generation prompt `<|assistant|>\n` (vLLM's `add_generation_prompt`). This need not
//! equal the gateway's canonical form: it only has to be stable, so a conversation whose
//! history grows keeps the same leading bytes and so the same leading block hashes. Because
//! the generation prompt is the start of the next turn's assistant message, a prompt followed
//! by its completion is a prefix of the next turn's prompt, and the engine can reuse the
//! completion's blocks as vLLM does (see [`sequence_block_hashes`]).
//!
//! A `/v1/completions` `prompt` that is a list of strings or of token-id lists is a batch:
//! each element a prompt of its own, answered as vLLM answers a batch (`n` choices per
//! prompt, indexed prompt by prompt). `n` (at least 1) is honoured for both APIs; `best_of`
//! above 1 is refused, as vLLM's V1 engine refuses it.
//!
//! Blocks are `block_size` tokens × 4 bytes; a trailing partial block is not hashed. The hash
//! chain is h₀ = xxh3(block₀, seed), hᵢ = xxh3(blockᵢ, hᵢ₋₁), with the seed derived from the
//! model (or adapter) name and `cache_salt`, so different models never share blocks.

use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::engine::BlockHash;

/// Bytes per estimated token.
pub const BYTES_PER_TOKEN: usize = 4;

/// The most sequences one request may generate (`n` × the prompts of a batch); more is a
/// 400, so a request cannot make the simulator hold unbounded state.
pub const MAX_SEQUENCES: u32 = 1024;

/// Which OpenAI endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
}

/// The fields of a request the simulator acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// Endpoint kind.
    pub kind: ApiKind,
    /// The `model` field (base model or adapter name).
    pub model: String,
    /// The prompt byte stream (the first prompt of a `/v1/completions` batch).
    pub prompt: Vec<u8>,
    /// Prompt tokens of `prompt` (at least 1).
    pub prompt_tokens: u32,
    /// The other prompts of a `/v1/completions` batch (a `prompt` list of strings or of
    /// token-id lists), in order; each is answered as if sent alone.
    pub batch: Vec<Vec<u8>>,
    /// `n`: the sequences generated and returned for each prompt (at least 1).
    pub n: u32,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`.
    pub continuous_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    /// vLLM's `ignore_eos`: generate exactly `max_tokens`.
    pub ignore_eos: bool,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<String>,
    /// vLLM's `priority` (lower is served first under the priority scheduling policy;
    /// default 0).
    pub priority: i32,
}

/// A 400 with the message and the offending parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    /// Human-readable reason.
    pub message: String,
    /// The parameter at fault, if one.
    pub param: Option<&'static str>,
}

fn bad(message: impl Into<String>, param: Option<&'static str>) -> BadRequest {
    BadRequest {
        message: message.into(),
        param,
    }
}

/// Parses and validates a request body.
pub fn parse(kind: ApiKind, body: &[u8]) -> Result<ParsedRequest, BadRequest> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}"), None))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("request body must be a JSON object", None))?;
    let model = match obj.get("model") {
        Some(Value::String(s)) => s.clone(),
        None => return Err(bad("field `model` is required", Some("model"))),
        Some(_) => return Err(bad("field `model` must be a string", Some("model"))),
    };
    let mut prompts = match kind {
        ApiKind::Chat => vec![chat_prompt(obj.get("messages"))?],
        ApiKind::Completions => completion_prompts(obj.get("prompt"))?,
    };
    let n = match obj.get("n") {
        None | Some(Value::Null) => 1,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX),
            _ => return Err(bad("n must be an integer of at least 1", Some("n"))),
        },
    };
    // vLLM's V1 engine refuses best_of; so does the simulator.
    match obj.get("best_of") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64().is_some_and(|b| b <= 1) => {}
        Some(_) => return Err(bad("best_of is not supported", Some("best_of"))),
    }
    let sequences = u64::from(n).saturating_mul(prompts.len() as u64);
    if sequences > u64::from(MAX_SEQUENCES) {
        return Err(bad(
            format!("at most {MAX_SEQUENCES} sequences per request, not {sequences}"),
            Some("n"),
        ));
    }
    let batch = prompts.split_off(1);
    let prompt = prompts.pop().unwrap_or_default();
    let stream = bool_field(obj.get("stream"), "stream")?.unwrap_or(false);
    let opts = obj.get("stream_options").and_then(Value::as_object);
    let include_usage = opts
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let continuous_usage = opts
        .and_then(|o| o.get("continuous_usage_stats"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let max_tokens = match obj.get("max_completion_tokens") {
        Some(v) if !v.is_null() => Some(v),
        _ => obj.get("max_tokens").filter(|v| !v.is_null()),
    };
    let max_tokens = match max_tokens {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            _ => {
                return Err(bad(
                    "max_tokens must be an integer of at least 1",
                    Some("max_tokens"),
                ))
            }
        },
    };
    let ignore_eos = bool_field(obj.get("ignore_eos"), "ignore_eos")?.unwrap_or(false);
    let cache_salt = obj
        .get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string);
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64().and_then(|p| i32::try_from(p).ok()) {
            Some(p) => p,
            None => return Err(bad("priority must be an integer", Some("priority"))),
        },
    };
    let prompt_tokens = prompt_tokens(&prompt);
    Ok(ParsedRequest {
        kind,
        model,
        prompt,
        prompt_tokens,
        batch,
        n,
        stream,
        include_usage,
        continuous_usage,
        max_tokens,
        ignore_eos,
        cache_salt,
        priority,
    })
}

fn bool_field(v: Option<&Value>, name: &'static str) -> Result<Option<bool>, BadRequest> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(format!("field `{name}` must be a boolean"), Some(name))),
    }
}

fn chat_prompt(messages: Option<&Value>) -> Result<Vec<u8>, BadRequest> {
    let list = messages
        .and_then(Value::as_array)
        .ok_or_else(|| bad("field `messages` must be an array", Some("messages")))?;
    if list.is_empty() {
        return Err(bad("field `messages` must not be empty", Some("messages")));
    }
    let mut out = Vec::new();
    for m in list {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("each message needs a string `role`", Some("messages")))?;
        out.extend_from_slice(b"<|");
        out.extend_from_slice(role.as_bytes());
        out.extend_from_slice(b"|>\n");
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        out.extend_from_slice(t.as_bytes());
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    "message `content` must be a string or an array of parts",
                    Some("messages"),
                ))
            }
        }
        out.push(b'\n');
    }
    out.extend_from_slice(GENERATION_PROMPT);
    Ok(out)
}

/// What a chat prompt ends with: the opening of the assistant message the model writes.
pub const GENERATION_PROMPT: &[u8] = b"<|assistant|>\n";

/// The prompts of a `/v1/completions` body: a string or a token-id list is one; a list of
/// strings or of token-id lists is a batch, one prompt per element.
fn completion_prompts(prompt: Option<&Value>) -> Result<Vec<Vec<u8>>, BadRequest> {
    match prompt {
        Some(Value::String(s)) => Ok(vec![s.as_bytes().to_vec()]),
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_u64) => {
            Ok(vec![token_ids(items)])
        }
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_string) => {
            Ok(items
                .iter()
                .filter_map(Value::as_str)
                .map(|s| s.as_bytes().to_vec())
                .collect())
        }
        Some(Value::Array(items))
            if !items.is_empty()
                && items.iter().all(|i| {
                    i.as_array()
                        .is_some_and(|ids| !ids.is_empty() && ids.iter().all(Value::is_u64))
                }) =>
        {
            Ok(items
                .iter()
                .filter_map(Value::as_array)
                .map(|ids| token_ids(ids))
                .collect())
        }
        _ => Err(bad(
            "field `prompt` must be a string, a token-id list, or a non-empty list of either",
            Some("prompt"),
        )),
    }
}

/// Token ids: 4 bytes each, so the estimate counts them exactly.
fn token_ids(ids: &[Value]) -> Vec<u8> {
    ids.iter()
        .filter_map(Value::as_u64)
        .flat_map(|t| (t as u32).to_le_bytes())
        .collect()
}

/// Estimated tokens of a prompt: ⌈bytes ÷ 4⌉, at least 1.
pub fn prompt_tokens(prompt: &[u8]) -> u32 {
    u32::try_from(prompt.len().div_ceil(BYTES_PER_TOKEN).max(1)).unwrap_or(u32::MAX)
}

/// The hash-chain seed for a model (or adapter) name and optional cache salt.
pub fn model_seed(model: &str, cache_salt: Option<&str>) -> u64 {
    let base = xxh3_64(model.as_bytes());
    match cache_salt {
        Some(salt) => xxh3_64_with_seed(salt.as_bytes(), base),
        None => base,
    }
}

/// Chained hashes of the full blocks of the whole sequence the engine will hold: the prompt,
/// then the `completion` it will generate. Blocks are cut from the bytes while the engine
/// counts ⌈prompt bytes ÷ 4⌉ prompt tokens, so a block that straddles the prompt's end may be
/// registered up to 3 bytes early; the completion is fixed in advance, so no result changes. vLLM hashes a block as soon as it is full, generated
/// tokens included, so the next turn of a conversation (whose prompt repeats this prompt and
/// its answer) finds the answer's blocks cached too.
pub fn sequence_block_hashes(
    seed: u64,
    prompt: &[u8],
    completion: &[u8],
    block_size: u32,
) -> Vec<BlockHash> {
    let mut sequence = Vec::with_capacity(prompt.len() + completion.len());
    sequence.extend_from_slice(prompt);
    sequence.extend_from_slice(completion);
    block_hashes(seed, &sequence, block_size)
}

/// Chained hashes of the prompt's full blocks of `block_size` tokens.
pub fn block_hashes(seed: u64, prompt: &[u8], block_size: u32) -> Vec<BlockHash> {
    let block_bytes = (block_size.max(1) as usize) * BYTES_PER_TOKEN;
    let mut prev = seed;
    prompt
        .chunks_exact(block_bytes)
        .map(|block| {
            prev = xxh3_64_with_seed(block, prev);
            BlockHash(prev)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn chat_history_growth_keeps_leading_hashes() {
        let one = br#"{"model":"m","messages":[{"role":"system","content":"You are a very helpful assistant that answers questions about the weather in great detail."},{"role":"user","content":"hi"}]}"#;
        let two = br#"{"model":"m","messages":[{"role":"system","content":"You are a very helpful assistant that answers questions about the weather in great detail."},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}"#;
        let a = parse(ApiKind::Chat, one).unwrap();
        let b = parse(ApiKind::Chat, two).unwrap();
        assert!(b.prompt.starts_with(&a.prompt));
        let seed = model_seed("m", None);
        let ha = block_hashes(seed, &a.prompt, 16);
        let hb = block_hashes(seed, &b.prompt, 16);
        assert_eq!(ha.len(), a.prompt.len() / 64);
        assert!(!ha.is_empty());
        assert_eq!(&hb[..ha.len()], &ha[..]);
        assert_ne!(block_hashes(model_seed("other", None), &a.prompt, 16), ha);
        assert_ne!(block_hashes(model_seed("m", Some("s")), &a.prompt, 16), ha);
    }

    #[test]
    fn fields_and_errors() {
        let p = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":"abcde","stream":true,"stream_options":{"include_usage":true},"max_tokens":7}"#,
        )
        .unwrap();
        assert_eq!(p.prompt_tokens, 2);
        assert!(p.stream && p.include_usage && !p.continuous_usage);
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(p.priority, 0);
        let prio = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":"a","priority":-3}"#,
        );
        assert_eq!(prio.unwrap().priority, -3);
        let bad = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":"a","priority":"x"}"#,
        );
        assert_eq!(bad.unwrap_err().param, Some("priority"));
        let ids = parse(ApiKind::Completions, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(ids.prompt_tokens, 3);
        assert!(ids.batch.is_empty() && ids.n == 1);
        let batch = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":["abcd","efgh","ijkl"],"n":2}"#,
        )
        .unwrap();
        assert_eq!(batch.prompt, b"abcd");
        assert_eq!(batch.batch, vec![b"efgh".to_vec(), b"ijkl".to_vec()]);
        assert_eq!(batch.n, 2);
        let ids = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":[[1,2],[3]],"n":null}"#,
        )
        .unwrap();
        assert_eq!((ids.prompt_tokens, ids.batch.len(), ids.n), (2, 1, 1));
        let one = parse(ApiKind::Completions, br#"{"model":"m","prompt":["x"]}"#).unwrap();
        assert!(one.batch.is_empty());
        for body in [
            &b"nope"[..],
            br#"{"prompt":"x"}"#,
            br#"{"model":1,"prompt":"x"}"#,
            br#"{"model":"m"}"#,
            br#"{"model":"m","prompt":"x","max_tokens":0}"#,
            br#"{"model":"m","prompt":"x","stream":"yes"}"#,
            br#"{"model":"m","prompt":"x","n":0}"#,
            br#"{"model":"m","prompt":"x","n":"2"}"#,
            br#"{"model":"m","prompt":"x","best_of":2}"#,
            br#"{"model":"m","prompt":"x","n":1025}"#,
            br#"{"model":"m","prompt":["a",1]}"#,
            br#"{"model":"m","prompt":[]}"#,
            br#"{"model":"m","prompt":[[]]}"#,
        ] {
            assert!(parse(ApiKind::Completions, body).is_err(), "{body:?}");
        }
        assert!(parse(ApiKind::Chat, br#"{"model":"m","messages":[]}"#).is_err());
        assert!(parse(
            ApiKind::Chat,
            br#"{"model":"m","messages":[{"content":"x"}]}"#
        )
        .is_err());
    }
}
