//! The body router: strips client-sent gateway headers, buffers the body
//! of inference requests, parses it with the core and sets `x-gateway-model-name` and
//! `x-gateway-base-model-name` for Envoy's route match.
//!
//! This module is the router's configuration ([`Router`]) and its decisions; the route
//! stage ([`crate::stages::route`]) runs them for each request: at the headers, the
//! trust boundary, `/v1/models` and the announced length; once the body is complete,
//! `Router::route`, which sets the headers or answers a local reply: 400 (not JSON, no
//! `model`, wrong types, more output sequences than `maxOutputSequences`), 413 (over the limit, announced by `content-length` or seen while
//! buffering), 404 `model_not_found`.
//!
//! Which requests are touched: every request loses its `x-gateway-*` / `x-llm-d-*` headers.
//! Only inference paths (`scheduler_core::request::Api::from_path`: the OpenAI chat and
//! completions paths and Anthropic messages) are buffered and parsed; anything else
//! (health checks, `/rr/...` baseline paths) passes through untouched, so the gateway stays
//! usable for non-inference endpoints; `/v1/models` the router answers itself. An inference
//! path without a body is a 400 like any other body that is not a request.
//!
//! A routed request also leaves the picker a [`Handoff`] (the route stage puts it in the
//! per-stream state, best effort: if the host refuses, the picker parses the body itself).
//!
//! **Model rewrites.** After the base-model lookup the router chooses the request's target
//! model: the `x-llm-d-model-name-rewrite` header when a trusted stage set it (a client's
//! copy is stripped before the router runs) and a pool of the base model serves it, else
//! the first matching rewrite rule's target ([`crate::rewrite`]), else the model as sent.
//! A target that differs from the sent model replaces the body's `model` value (every
//! other byte kept; the host fixes `content-length`), so the engine, the picker's LoRA
//! scorer and prefix seed (through the handoff), the usage stage (which reads the body
//! after the router) and the billing record all see the target; `x-gateway-model-name`
//! keeps the name the client sent. A rule's weights split by a sticky key
//! ([`crate::rewrite::split`]): the configured session header's value, else the fairness id
//! (only the auth stage sets it; not the shared `default-flow`), else a draw per request;
//! `split.mode: perRequest` draws every time. Every routed request also gets `x-gateway-split-key`, a decimal `u64` hash
//! of the same key (random without one, or per request), for Envoy's weighted clusters to
//! split across pools with the same stickiness.
//!
//! **`/v1/models`** is answered by the router itself ([`models`]).

pub mod config;
pub mod models;

use scheduler_core::request::{self, Api};

use crate::handoff::Handoff;
use crate::headers::{BASE_MODEL, FAIRNESS_ID, MODEL_NAME};
use crate::host::{Random, RequestBody, RequestHeaders, Stats};
use crate::reply::Reply;
use crate::rewrite::{self, Rewrites, SplitConfig, SplitMode};
use crate::stats::{StatKey, StatKind};

pub use config::{ModelTable, PoolModels, RouterConfig, RouterConfigError};

/// The target model a trusted stage chose (honoured only from the gateway: a client's copy
/// is stripped with every `x-llm-d-*` header).
pub const MODEL_NAME_REWRITE: &str = "x-llm-d-model-name-rewrite";

/// The decimal `u64` hash of the request's sticky key, for Envoy's weighted clusters
/// (`random_value_specifier.header_name`).
pub const SPLIT_KEY: &str = "x-gateway-split-key";

/// Where the router learns the block size the picker pool of a base model hashes prompts
/// at (the adapter's registry of loaded picker configs), so the handoff's hashes fit the
/// picker without `blockSizeTokens` being configured twice.
pub trait BlockSizeSource: Send + Sync {
    /// The block size of the loaded picker pool serving `base_model`, if one is loaded and
    /// reads the prefix index.
    fn block_size_tokens(&self, base_model: &str) -> Option<u32>;
}

/// The router's per-VM / per-process part: the compiled configuration and its stat keys.
#[derive(Clone)]
pub struct Router {
    body_limit: usize,
    max_output_sequences: u32,
    models: ModelTable,
    rewrites: Rewrites,
    split: SplitConfig,
    stats: RouterStats,
    block_sizes: Option<std::sync::Arc<dyn BlockSizeSource>>,
}

impl core::fmt::Debug for Router {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Router")
            .field("body_limit", &self.body_limit)
            .field("max_output_sequences", &self.max_output_sequences)
            .field("models", &self.models)
            .field("rewrites", &self.rewrites)
            .field("split", &self.split)
            .field("block_sizes", &self.block_sizes.is_some())
            .finish()
    }
}

/// Stat keys of the router, one per outcome.
#[derive(Clone, Debug)]
struct RouterStats {
    routed: StatKey,
    passthrough: StatKey,
    bad_request: StatKey,
    too_large: StatKey,
    model_not_found: StatKey,
    /// `/v1/models` requests the router answered.
    models: StatKey,
    /// Requests failed closed (a body the host would not let the router rewrite).
    internal: StatKey,
    /// Requests whose model was rewritten, per target model.
    rewrites: Vec<(String, StatKey)>,
}

impl RouterStats {
    fn new(targets: &[&str]) -> Self {
        let key = |outcome| StatKey::new("infergate.router.requests", &[("outcome", outcome)]);
        RouterStats {
            routed: key("routed"),
            passthrough: key("passthrough"),
            bad_request: key("bad_request"),
            too_large: key("too_large"),
            model_not_found: key("model_not_found"),
            models: key("models"),
            internal: key("internal"),
            rewrites: targets
                .iter()
                .map(|t| {
                    let k = StatKey::new("infergate.router.rewrites", &[("target", t)]);
                    ((*t).to_owned(), k)
                })
                .collect(),
        }
    }

    fn keys(&self) -> Vec<&StatKey> {
        let mut keys = vec![
            &self.routed,
            &self.passthrough,
            &self.bad_request,
            &self.too_large,
            &self.model_not_found,
            &self.models,
            &self.internal,
        ];
        keys.extend(self.rewrites.iter().map(|(_, k)| k));
        keys
    }

    /// The rewrite counter of `target`, if it is a rule's target (a trusted header's target
    /// need not be).
    fn rewrite(&self, target: &str) -> Option<&StatKey> {
        self.rewrites
            .iter()
            .find(|(t, _)| t == target)
            .map(|(_, k)| k)
    }
}

impl Router {
    /// Compile `config`.
    pub fn new(config: &RouterConfig) -> Result<Router, RouterConfigError> {
        if config.max_output_sequences == 0 {
            return Err(RouterConfigError::Invalid {
                field: "maxOutputSequences",
                problem: "must be at least 1",
            });
        }
        let mut models = ModelTable::build(&config.pools)?;
        let rewrites = Rewrites::compile(&config.model_rewrites, &config.pools)
            .map_err(RouterConfigError::Rewrite)?;
        for (name, base) in rewrites.aliases() {
            models.add_alias(name, base);
        }
        Ok(Router {
            body_limit: config.body_limit_bytes,
            max_output_sequences: config.max_output_sequences,
            stats: RouterStats::new(&rewrites.targets()),
            models,
            rewrites,
            split: config.split.clone(),
            block_sizes: None,
        })
    }

    /// Hash handoffs at the block size `source` reports for each base model (unless the
    /// router's own config sets one).
    pub fn with_block_sizes(mut self, source: std::sync::Arc<dyn BlockSizeSource>) -> Router {
        self.block_sizes = Some(source);
        self
    }

    /// The block size a handoff for `base_model` is hashed at: the router config's, else
    /// the loaded picker pool's, else the default.
    pub fn block_size_tokens(&self, base_model: &str) -> u32 {
        self.models
            .configured_block_size(base_model)
            .or_else(|| {
                self.block_sizes
                    .as_ref()
                    .and_then(|s| s.block_size_tokens(base_model))
            })
            .unwrap_or(config::DEFAULT_BLOCK_SIZE_TOKENS)
    }

    /// Parse and compile a JSON configuration (the plugin config minus `role`).
    pub fn from_json(value: serde_json::Value) -> Result<Router, RouterConfigError> {
        let config: RouterConfig =
            serde_json::from_value(value).map_err(|e| RouterConfigError::Json(e.to_string()))?;
        Router::new(&config)
    }

    /// The body limit in bytes.
    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// The most output sequences one request may ask for (`maxOutputSequences`).
    pub fn max_output_sequences(&self) -> u32 {
        self.max_output_sequences
    }

    /// The 400 for a request asking for more output sequences than `maxOutputSequences`
    /// allows, naming the parameter that carries it over: `best_of` or `n` when the
    /// sequences of one prompt are already too many, else `prompt` (the batch multiplies
    /// them over).
    fn over_sequence_cap(&self, parsed: &request::ParsedRequest) -> Option<Reply> {
        let cap = self.max_output_sequences;
        if parsed.output_sequences <= cap {
            return None;
        }
        let n = parsed.n.unwrap_or(1);
        let best_of = parsed.best_of.unwrap_or(1);
        let per_prompt = n.max(best_of);
        let (param, message) = if per_prompt > u64::from(cap) {
            let (param, value) = if best_of > n {
                ("best_of", best_of)
            } else {
                ("n", n)
            };
            let message = format!(
                "Invalid '{param}': integer above maximum value. Expected a value <= {cap}, \
                 but got {value} instead."
            );
            (param, message)
        } else {
            let message = format!(
                "Invalid 'prompt': {} prompts × {per_prompt} sequences each is {} output \
                 sequences, above the maximum of {cap} per request.",
                parsed.prompts,
                parsed.prompts.saturating_mul(per_prompt),
            );
            ("prompt", message)
        };
        Some(Reply::bad_request(
            &message,
            Some(param),
            "integer_above_max_value",
        ))
    }

    /// Every stat key the router can emit (all counters), so a host can define them all up
    /// front.
    pub fn stat_keys(&self) -> Vec<(StatKind, &StatKey)> {
        self.stats
            .keys()
            .into_iter()
            .map(|k| (StatKind::Counter, k))
            .collect()
    }

    /// Every base model the router routes to, sorted.
    pub fn base_models(&self) -> Vec<&str> {
        self.models.base_models()
    }

    /// The base model serving `model`, if any.
    pub fn base_model(&self, model: &str) -> Option<&str> {
        self.models.base_model(model)
    }

    /// Every name `/v1/models` lists: base models, adapters and rewrite matches, sorted.
    pub fn served_names(&self) -> Vec<&str> {
        self.models.names()
    }

    /// The compiled rewrite rules.
    pub fn rewrites(&self) -> &Rewrites {
        &self.rewrites
    }

    /// The split setting.
    pub fn split(&self) -> &SplitConfig {
        &self.split
    }

    /// The request's sticky key: the session header's value, else the fairness id.
    fn sticky_key<H: RequestHeaders + ?Sized>(&self, host: &H) -> Option<String> {
        let session = self
            .split
            .session_header
            .as_deref()
            .and_then(|name| host.request_header(name));
        // The flow every unnamed request shares is no one's key: sticking on it would send
        // all of them to one target.
        let fairness = host
            .request_header(FAIRNESS_ID)
            .filter(|id| id != crate::flow::DEFAULT_FLOW);
        session.or(fairness).filter(|k| !k.is_empty())
    }

    /// The target model of a request for `model` routed to `base`, and the split key for
    /// Envoy's weighted clusters.
    fn choose_target<H>(&self, host: &mut H, base: &str, model: &str) -> Choice
    where
        H: RequestHeaders + Random + ?Sized,
    {
        let key = match self.split.mode {
            SplitMode::Sticky => self.sticky_key(&*host),
            SplitMode::PerRequest => None,
        };
        let split_key = match &key {
            Some(k) => rewrite::split_key(k.as_bytes()),
            None => host.random_u64(),
        };
        let trusted = host
            .request_header(MODEL_NAME_REWRITE)
            .filter(|t| self.models.serves(t) && self.models.base_model(t) == Some(base));
        let target = match trusted {
            Some(t) => Some(t),
            None => self.rewrites.rule(base, model).and_then(|rule| {
                // A draw is taken only when there is no key (a keyed choice is a hash).
                let draw = if key.is_some() { 0 } else { host.random_u64() };
                let key = key.as_deref().map(str::as_bytes);
                rule.choose(key, draw).map(|t| t.model.clone())
            }),
        };
        Choice {
            target: target.unwrap_or_else(|| model.to_owned()),
            split_key,
        }
    }
}

/// The router's choice for one request.
struct Choice {
    /// The model sent upstream.
    target: String,
    /// The value of [`SPLIT_KEY`].
    split_key: u64,
}

/// What the router learnt about a request it routed, for the stages after it (quota
/// pre-debit, usage forcing, the billing record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedRequest {
    /// The API the body was parsed as.
    pub api: Api,
    /// The `model` field as the client sent it.
    pub model: String,
    /// The model sent upstream: `model`, or the target a rewrite chose.
    pub target_model: String,
    /// The base model whose pool serves it.
    pub base_model: String,
    /// The gateway's prompt token estimate (canonical prompt bytes / 4).
    pub prompt_tokens: u64,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u64>,
    /// How many sequences the engine may generate, each up to `max_output_tokens`
    /// (`scheduler_core::request::ParsedRequest::output_sequences`; at most the router's
    /// `maxOutputSequences`).
    pub output_sequences: u32,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage` as the client sent it.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` as the client sent it.
    pub continuous_usage: bool,
}

impl Router {
    /// Count a `/v1/models` request the router answered.
    pub(crate) fn count_models<H: Stats + ?Sized>(&self, host: &mut H) {
        host.counter_add(&self.stats.models, 1);
    }

    /// Count a request the router lets pass untouched (not an inference path).
    pub(crate) fn count_passthrough<H: Stats + ?Sized>(&self, host: &mut H) {
        host.counter_add(&self.stats.passthrough, 1);
    }

    /// Count a local reply of the router by its status.
    pub(crate) fn count_reply<H: Stats + ?Sized>(&self, host: &mut H, status: u16) {
        let key = match status {
            413 => &self.stats.too_large,
            404 => &self.stats.model_not_found,
            500 => &self.stats.internal,
            _ => &self.stats.bad_request,
        };
        host.counter_add(key, 1);
    }

    /// Route a request of `api` by its complete `body`: parse it, choose the target model
    /// (rewriting the body's `model` when it differs), and set the routing headers. What
    /// the router learnt and the handoff for the picker, or the reply to answer instead.
    pub(crate) fn route<H>(
        &self,
        host: &mut H,
        api: Api,
        body: &[u8],
    ) -> Result<(RoutedRequest, Handoff), Reply>
    where
        H: RequestHeaders + RequestBody + Stats + Random + ?Sized,
    {
        if body.len() > self.body_limit {
            return Err(Reply::too_large(self.body_limit));
        }
        let mut parsed = request::parse(api, body)
            .map_err(|e| Reply::bad_request(&e.message(), e.param(), e.code()))?;
        if let Some(reply) = self.over_sequence_cap(&parsed) {
            return Err(reply);
        }
        let Some(base) = self.base_model(&parsed.model) else {
            return Err(Reply::model_not_found(&parsed.model));
        };
        let choice = self.choose_target(host, base, &parsed.model);
        let client_model = core::mem::replace(&mut parsed.model, choice.target);
        if parsed.model != client_model {
            let rewritten = rewrite::body::rewrite_model(body, &parsed.model)
                .is_some_and(|b| host.replace_request_body(&b).is_ok());
            if !rewritten {
                // Fail closed: the engine would otherwise serve the name the client sent
                // (or not know it at all), not the version the split chose.
                return Err(Reply::internal(
                    "the request body's model could not be rewritten",
                ));
            }
            if let Some(key) = self.stats.rewrite(&parsed.model) {
                host.counter_add(key, 1);
            }
        }
        host.set_request_header(MODEL_NAME, &client_model);
        host.set_request_header(BASE_MODEL, base);
        host.set_request_header(SPLIT_KEY, &choice.split_key.to_string());
        // Seeded with the target model: the engine caches the prompt under the name it serves.
        let handoff = Handoff::from_parsed(&parsed, base, self.block_size_tokens(base));
        host.counter_add(&self.stats.routed, 1);
        let routed = RoutedRequest {
            api,
            model: client_model,
            target_model: parsed.model.clone(),
            base_model: base.to_owned(),
            prompt_tokens: parsed.prompt_tokens.0,
            max_output_tokens: parsed.max_output_tokens,
            output_sequences: parsed.output_sequences,
            stream: parsed.stream,
            include_usage: parsed.include_usage,
            continuous_usage: parsed.continuous_usage,
        };
        Ok((routed, handoff))
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_rewrite;
