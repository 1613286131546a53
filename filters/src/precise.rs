//! The precise prefix index of one pool, shared by the picker (every worker) and the thread
//! that follows the engines' KV events: what `precise-prefix-cache-producer` needs at run
//! time.
//!
//! A [`PreciseShared`] holds the core's [`PreciseIndex`] behind a lock of its own (never
//! the pool's), the pool's tokenizer and the block size requests are keyed with:
//!
//! - **Events** ([`PreciseShared::deliver`]): a message of an endpoint's stream is decoded
//!   ([`scheduler_core::kv_events::decode_batch`]) outside the lock, then applied at most
//!   [`EVENTS_PER_HOLD`] events per lock hold, so a burst of events never keeps a pick
//!   waiting for long. A gap or a reconnect ([`PreciseShared::mark_stale`]) forgets what the
//!   endpoint was known to hold: no replay exists, so an explicit "unknown" is the honest
//!   answer until its new events arrive.
//! - **Requests** ([`PreciseShared::keys`]): the prompt is tokenized like the engine
//!   ([`crate::tokenize`]) and cut into blocks of the engine's size, keyed with
//!   [`token_block_keys`]. The block size is `blockSizeTokens` when configured, else the
//!   engine's `vllm:cache_config_info` as scraped, else the size its events carry, else
//!   16 (vLLM's default). A request with a `cache_salt` gets no keys (vLLM salts its block
//!   hashes; the events do not say which blocks were salted).
//! - **Picks**: the scheduler reads the index through [`PreciseShared::with_index`]; the
//!   pick records the request's keys for the chosen endpoint as speculative entries for
//!   `speculativeTtlMs` ([`PreciseShared::record_speculative`]).
//!
//! Counters ([`PreciseCounters`]) are atomics: the event thread cannot write Envoy stats,
//! so the picker publishes them as gauges on its own thread.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use scheduler_core::kv_events::{decode_batch, KvDecodeError, KvEvent};
use scheduler_core::prefix::precise::settings::DEFAULT_BLOCK_SIZE_TOKENS;
use scheduler_core::prefix::precise::{kv_seed, token_block_keys, PreciseIndex, PreciseSettings};
use scheduler_core::request::Api;
use scheduler_core::types::{BlockHash, Millis};
use serde::Deserialize;
use serde_json::Value;

use crate::tokenize::{self, ChatMessage, PromptInput, TokenizeError, Tokenizer};

/// Events applied per hold of the index's lock.
pub const EVENTS_PER_HOLD: usize = 512;

/// Largest body tokenized (larger ones get no precise keys, and so no precise match).
pub const MAX_TOKENIZED_BODY: usize = 8 << 20;

/// What happened to the index, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreciseCounters {
    /// Event messages applied.
    pub batches: u64,
    /// `BlockStored` events applied.
    pub stored_events: u64,
    /// `BlockRemoved` events applied.
    pub removed_events: u64,
    /// `AllBlocksCleared` events applied.
    pub cleared_events: u64,
    /// Messages that did not decode (dropped, and the endpoint marked stale).
    pub decode_errors: u64,
    /// Times an endpoint's stream was declared stale (gap, reconnect, decode error).
    pub stale: u64,
    /// Requests that could not be tokenized (scheduled without precise keys).
    pub tokenize_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    stored_events: AtomicU64,
    removed_events: AtomicU64,
    cleared_events: AtomicU64,
    decode_errors: AtomicU64,
    stale: AtomicU64,
    tokenize_errors: AtomicU64,
}

/// One pool's precise index (see the module doc). Shared by `Arc`.
pub struct PreciseShared {
    settings: PreciseSettings,
    tokenizer: Arc<dyn Tokenizer>,
    index: Mutex<PreciseIndex>,
    /// The engine's block size as scraped (`cache_config_info`); 0 until known.
    scraped_block_size: AtomicU32,
    /// The block size the engine's events carry; 0 until one arrives.
    event_block_size: AtomicU32,
    counters: Counters,
}

impl std::fmt::Debug for PreciseShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreciseShared")
            .field("settings", &self.settings)
            .field("block_size", &self.block_size())
            .finish_non_exhaustive()
    }
}

/// The fields of a request body the tokenizer reads.
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    cache_salt: Option<Value>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Value,
}

/// A message's text: a string as is, an array's `text` parts concatenated, else empty.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

impl PreciseShared {
    /// Builds the index and the tokenizer `settings` name (loading its files now).
    pub fn new(settings: &PreciseSettings) -> Result<PreciseShared, TokenizeError> {
        Ok(PreciseShared {
            tokenizer: tokenize::from_config(&settings.tokenizer)?,
            index: Mutex::new(PreciseIndex::new(settings.max_blocks_per_server)),
            settings: settings.clone(),
            scraped_block_size: AtomicU32::new(0),
            event_block_size: AtomicU32::new(0),
            counters: Counters::default(),
        })
    }

    /// The producer's settings.
    pub fn settings(&self) -> &PreciseSettings {
        &self.settings
    }

    fn lock(&self) -> MutexGuard<'_, PreciseIndex> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tokens per block requests are keyed with (module doc for the order of sources).
    pub fn block_size(&self) -> u32 {
        if let Some(b) = self.settings.block_size_tokens {
            return b;
        }
        match (
            self.scraped_block_size.load(Ordering::Relaxed),
            self.event_block_size.load(Ordering::Relaxed),
        ) {
            (0, 0) => DEFAULT_BLOCK_SIZE_TOKENS,
            (0, e) => e,
            (s, _) => s,
        }
    }

    /// The engine's block size as its metrics report it (`vllm:cache_config_info`).
    pub fn learn_block_size(&self, block_size: u32) {
        if block_size > 0 {
            self.scraped_block_size.store(block_size, Ordering::Relaxed);
        }
    }

    /// The request's block keys: its prompt tokenized like the engine, in blocks of
    /// [`PreciseShared::block_size`], at most `maxPrefixTokensToMatch` tokens. Empty for a
    /// request with a `cache_salt`, one that does not tokenize (counted), or one larger than
    /// [`MAX_TOKENIZED_BODY`].
    pub fn keys(&self, api: Api, target_model: &str, body: &[u8]) -> Vec<BlockHash> {
        if body.len() > MAX_TOKENIZED_BODY {
            return Vec::new();
        }
        match self.tokens(api, body) {
            Ok(Some(tokens)) => {
                let bs = self.block_size();
                token_block_keys(
                    kv_seed(target_model),
                    &tokens,
                    bs,
                    self.settings.max_blocks(bs),
                )
            }
            Ok(None) => Vec::new(),
            Err(_) => {
                self.counters
                    .tokenize_errors
                    .fetch_add(1, Ordering::Relaxed);
                Vec::new()
            }
        }
    }

    /// The prompt's tokens; `None` when the request is salted or has no prompt.
    fn tokens(&self, api: Api, body: &[u8]) -> Result<Option<Vec<u32>>, TokenizeError> {
        let body: Body =
            serde_json::from_slice(body).map_err(|e| TokenizeError::Encode(e.to_string()))?;
        if body.cache_salt.as_ref().is_some_and(|s| !s.is_null()) {
            return Ok(None);
        }
        match (api, &body.messages, &body.prompt) {
            (Api::Completions, _, Some(Value::String(p))) => {
                self.tokenizer.tokenize(&PromptInput::Text(p)).map(Some)
            }
            (Api::ChatCompletions | Api::AnthropicMessages, Some(messages), _) => {
                let texts: Vec<String> =
                    messages.iter().map(|m| content_text(&m.content)).collect();
                let chat: Vec<ChatMessage<'_>> = messages
                    .iter()
                    .zip(&texts)
                    .map(|(m, content)| ChatMessage {
                        role: &m.role,
                        content,
                    })
                    .collect();
                self.tokenizer.tokenize(&PromptInput::Chat(&chat)).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The index, locked for one pick's schedule (hold it no longer).
    pub fn lock_for_pick(&self) -> MutexGuard<'_, PreciseIndex> {
        self.lock()
    }

    /// Runs `f` on the index (the pick's read; keep it short).
    pub fn with_index<R>(&self, f: impl FnOnce(&PreciseIndex) -> R) -> R {
        f(&self.lock())
    }

    /// The pick sent `keys` to `endpoint` at `now`: they count as held there for
    /// `speculativeTtlMs` (nothing with a TTL of 0).
    pub fn record_speculative(&self, endpoint: &str, keys: &[BlockHash], now: Millis) {
        let ttl = self.settings.speculative_ttl_ms;
        if keys.is_empty() || ttl == 0 {
            return;
        }
        let mut index = self.lock();
        index.expire(now);
        index.record_speculative(endpoint, keys, Millis(now.0.saturating_add(ttl)));
    }

    /// One message of `endpoint`'s event stream, published for `model` (the topic's):
    /// decoded here, applied [`EVENTS_PER_HOLD`] events per lock hold. A message that does
    /// not decode marks the endpoint stale (its events are lost) and is returned as the error.
    pub fn deliver(
        &self,
        endpoint: &str,
        model: &str,
        payload: &[u8],
    ) -> Result<(), KvDecodeError> {
        let batch = match decode_batch(payload) {
            Ok(batch) => batch,
            Err(e) => {
                self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_stale(endpoint);
                return Err(e);
            }
        };
        let (mut stored, mut removed, mut cleared) = (0u64, 0u64, 0u64);
        for chunk in batch.events.chunks(EVENTS_PER_HOLD) {
            let mut index = self.lock();
            for ev in chunk {
                match ev {
                    KvEvent::BlockStored { block_size, .. } => {
                        stored += 1;
                        if *block_size > 0 {
                            self.event_block_size.store(*block_size, Ordering::Relaxed);
                        }
                    }
                    KvEvent::BlockRemoved { .. } => removed += 1,
                    KvEvent::AllBlocksCleared => cleared += 1,
                }
                index.apply(endpoint, model, ev);
            }
        }
        let c = &self.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.stored_events.fetch_add(stored, Ordering::Relaxed);
        c.removed_events.fetch_add(removed, Ordering::Relaxed);
        c.cleared_events.fetch_add(cleared, Ordering::Relaxed);
        Ok(())
    }

    /// `endpoint`'s events were lost (a gap, a reconnect, a bad message): forget what it
    /// holds until its new events say.
    pub fn mark_stale(&self, endpoint: &str) {
        self.counters.stale.fetch_add(1, Ordering::Relaxed);
        self.lock().clear_endpoint(endpoint);
    }

    /// `endpoint` left the pool.
    pub fn remove_endpoint(&self, endpoint: &str) {
        self.lock().remove_endpoint(endpoint);
    }

    /// Confirmed blocks held, all endpoints.
    pub fn total_blocks(&self) -> usize {
        self.lock().total_blocks()
    }

    /// Confirmed blocks held for `endpoint`.
    pub fn stored_blocks(&self, endpoint: &str) -> usize {
        self.lock().stored_blocks(endpoint)
    }

    /// The counters so far.
    pub fn counters(&self) -> PreciseCounters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PreciseCounters {
            batches: get(&c.batches),
            stored_events: get(&c.stored_events),
            removed_events: get(&c.removed_events),
            cleared_events: get(&c.cleared_events),
            decode_errors: get(&c.decode_errors),
            stale: get(&c.stale),
            tokenize_errors: get(&c.tokenize_errors),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
