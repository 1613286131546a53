//! The body router: strips client-sent gateway headers, buffers the body
//! of inference requests, parses it with the core and sets `x-gateway-model-name` and
//! `x-gateway-base-model-name` for Envoy's route match.
//!
//! Per request: `on_request_headers` → (`Pause` until the body is complete) →
//! `on_request_body` → `Continue` with the headers set, or a local reply:
//! 400 (not JSON, no `model`, wrong types), 413 (over the limit, announced by
//! `content-length` or seen while buffering), 404 `model_not_found`.
//!
//! Which requests are touched: every request loses its `x-gateway-*` / `x-llm-d-*` headers.
//! Only inference paths (`scheduler_core::request::Api::from_path`: the OpenAI chat and
//! completions paths and Anthropic messages) are buffered and parsed; anything else
//! (`/v1/models`, health checks, `/rr/...` baseline paths) passes through untouched, so the
//! gateway stays usable for non-inference endpoints. An inference path without a body is a
//! 400 like any other body that is not a request.
//!
//! A routed request also leaves the picker a [`Handoff`] in its per-stream state (best
//! effort: if the host refuses, the picker parses the body itself).

pub mod config;

use scheduler_core::request::{self, Api};

use crate::handoff::{Handoff, HANDOFF_KEY};
use crate::headers::{self, BASE_MODEL, MODEL_NAME};
use crate::host::{LocalReply, RequestBody, RequestHeaders, Stats, StreamState};
use crate::reply::Reply;
use crate::stats::{StatKey, StatKind};
use crate::FilterStatus;

pub use config::{ModelTable, PoolModels, RouterConfig, RouterConfigError};

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
    models: ModelTable,
    stats: RouterStats,
    block_sizes: Option<std::sync::Arc<dyn BlockSizeSource>>,
}

impl core::fmt::Debug for Router {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Router")
            .field("body_limit", &self.body_limit)
            .field("models", &self.models)
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
}

impl RouterStats {
    fn new() -> Self {
        let key = |outcome| StatKey::new("infergate.router.requests", &[("outcome", outcome)]);
        RouterStats {
            routed: key("routed"),
            passthrough: key("passthrough"),
            bad_request: key("bad_request"),
            too_large: key("too_large"),
            model_not_found: key("model_not_found"),
        }
    }

    fn keys(&self) -> [&StatKey; 5] {
        [
            &self.routed,
            &self.passthrough,
            &self.bad_request,
            &self.too_large,
            &self.model_not_found,
        ]
    }
}

impl Router {
    /// Compile `config`.
    pub fn new(config: &RouterConfig) -> Result<Router, RouterConfigError> {
        Ok(Router {
            body_limit: config.body_limit_bytes,
            models: ModelTable::build(&config.pools)?,
            stats: RouterStats::new(),
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
}

/// Where one request is in the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Nothing seen yet.
    Start,
    /// An inference request whose body is being buffered.
    AwaitingBody(Api),
    /// Decided (routed, passed through or replied); later callbacks continue.
    Done,
}

/// What the router learnt about a request it routed, for the stages after it (quota
/// pre-debit, usage forcing, the billing record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedRequest {
    /// The API the body was parsed as.
    pub api: Api,
    /// The `model` field as the client sent it.
    pub model: String,
    /// The base model whose pool serves it.
    pub base_model: String,
    /// The gateway's prompt token estimate (canonical prompt bytes / 4).
    pub prompt_tokens: u64,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage` as the client sent it.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` as the client sent it.
    pub continuous_usage: bool,
}

/// The router's state for one request.
#[derive(Clone, Debug)]
pub struct RouterRequest {
    stage: Stage,
    keep_headers: bool,
    routed: Option<RoutedRequest>,
    replied: Option<u16>,
}

impl Default for RouterRequest {
    fn default() -> Self {
        RouterRequest::new()
    }
}

impl RouterRequest {
    /// A request that has seen nothing yet.
    pub fn new() -> Self {
        RouterRequest {
            stage: Stage::Start,
            keep_headers: false,
            routed: None,
            replied: None,
        }
    }

    /// A request whose client headers an earlier stage already stripped (and whose
    /// gateway headers it then set): the router leaves the headers alone.
    pub fn after_trust_boundary() -> Self {
        RouterRequest {
            keep_headers: true,
            ..RouterRequest::new()
        }
    }

    /// What the router learnt about the request, once it routed it.
    pub fn routed(&self) -> Option<&RoutedRequest> {
        self.routed.as_ref()
    }

    /// The status of the local reply the router answered with, if it did.
    pub fn replied(&self) -> Option<u16> {
        self.replied
    }

    /// Request headers arrived (`end_of_stream`: the request has no body).
    pub fn on_request_headers<H>(
        &mut self,
        router: &Router,
        host: &mut H,
        end_of_stream: bool,
    ) -> FilterStatus
    where
        H: RequestHeaders + RequestBody + LocalReply + Stats + StreamState + ?Sized,
    {
        if self.stage != Stage::Start {
            return FilterStatus::Continue;
        }
        if !self.keep_headers {
            headers::strip_reserved(host);
        }
        let api = host
            .request_header(":path")
            .and_then(|path| Api::from_path(&path));
        let Some(api) = api else {
            self.stage = Stage::Done;
            host.counter_add(&router.stats.passthrough, 1);
            return FilterStatus::Continue;
        };
        let announced = host
            .request_header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|len| len > router.body_limit as u64) {
            return self.reply(router, host, Reply::too_large(router.body_limit));
        }
        self.stage = Stage::AwaitingBody(api);
        if end_of_stream {
            return self.finish(router, host, api, &[]);
        }
        FilterStatus::Pause
    }

    /// Body data arrived: `buffered_len` bytes are buffered in total so far. Adapters call
    /// this from the trailers callback too, with `end_of_stream = true`.
    pub fn on_request_body<H>(
        &mut self,
        router: &Router,
        host: &mut H,
        buffered_len: usize,
        end_of_stream: bool,
    ) -> FilterStatus
    where
        H: RequestHeaders + RequestBody + LocalReply + Stats + StreamState + ?Sized,
    {
        let Stage::AwaitingBody(api) = self.stage else {
            return FilterStatus::Continue;
        };
        if buffered_len > router.body_limit {
            return self.reply(router, host, Reply::too_large(router.body_limit));
        }
        if !end_of_stream {
            return FilterStatus::Pause;
        }
        let body = host.request_body(0, buffered_len).unwrap_or_default();
        self.finish(router, host, api, &body)
    }

    /// Parse the complete body and set the routing headers, or reply with the error.
    fn finish<H>(&mut self, router: &Router, host: &mut H, api: Api, body: &[u8]) -> FilterStatus
    where
        H: RequestHeaders + LocalReply + Stats + StreamState + ?Sized,
    {
        if body.len() > router.body_limit {
            return self.reply(router, host, Reply::too_large(router.body_limit));
        }
        let parsed = match request::parse(api, body) {
            Ok(parsed) => parsed,
            Err(e) => {
                let reply = Reply::bad_request(&e.message(), e.param(), e.code());
                return self.reply(router, host, reply);
            }
        };
        let Some(base) = router.base_model(&parsed.model) else {
            return self.reply(router, host, Reply::model_not_found(&parsed.model));
        };
        host.set_request_header(MODEL_NAME, &parsed.model);
        host.set_request_header(BASE_MODEL, base);
        let handoff = Handoff::from_parsed(&parsed, base, router.block_size_tokens(base));
        if let Some(bytes) = handoff.encode() {
            // Best effort: without it the picker buffers and parses the body itself.
            let _ = host.set_stream_state(HANDOFF_KEY, &bytes);
        }
        host.counter_add(&router.stats.routed, 1);
        self.routed = Some(RoutedRequest {
            api,
            model: parsed.model.clone(),
            base_model: base.to_owned(),
            prompt_tokens: parsed.prompt_tokens.0,
            max_output_tokens: parsed.max_output_tokens,
            stream: parsed.stream,
            include_usage: parsed.include_usage,
            continuous_usage: parsed.continuous_usage,
        });
        self.stage = Stage::Done;
        FilterStatus::Continue
    }

    fn reply<H>(&mut self, router: &Router, host: &mut H, reply: Reply) -> FilterStatus
    where
        H: LocalReply + Stats + ?Sized,
    {
        let key = match reply.status {
            413 => &router.stats.too_large,
            404 => &router.stats.model_not_found,
            _ => &router.stats.bad_request,
        };
        host.counter_add(key, 1);
        // Done before the reply: a host may re-enter the filter while sending it.
        self.stage = Stage::Done;
        self.replied = Some(reply.status);
        host.send_local_reply(&reply);
        FilterStatus::Replied
    }
}

#[cfg(test)]
mod tests;
