//! `infergate explain`: run one scheduling decision offline and print its record.
//!
//! Inputs are files an operator can write by hand: an `EndpointPickerConfig` (YAML or
//! JSON), a state file describing the pool, and a request body. The state file:
//!
//! ```json
//! {"endpoints": [{"address": "10.0.0.1:8000",
//!                 "metrics": {"waiting": 3, "running": 5, "kv_cache_usage": 0.7,
//!                             "lora": {"max": 4, "running": ["a"], "waiting": []}},
//!                 "inflight": {"requests": 2, "tokens": 4096}}],
//!  "history": [{"endpoint": "10.0.0.1:8000", "path": "/v1/completions", "body": {...}}],
//!  "base_model": "meta-llama/Llama-3.1-8B-Instruct",
//!  "last_endpoint_for_session": "10.0.0.1:8000"}
//! ```
//!
//! `metrics` absent means unknown; `inflight`, `history`, `base_model` (default: the
//! request's model) and `last_endpoint_for_session` are optional. History requests are
//! parsed with the core's request parser and recorded in the prefix index in order, as if
//! they had been routed to their endpoint, exactly as the picker records routed requests.

use std::path::Path;

use anyhow::{bail, Context, Result};
use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::prefix::{request_hashes, PrefixIndex};
use scheduler_core::request::{parse, Api, ParsedRequest};
use scheduler_core::scheduling::{Candidate, RequestView, Scheduler};
use scheduler_core::types::{InFlight, Millis};
use serde::Deserialize;

/// The pool as the explain command sees it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// The pool's endpoints (the candidates, in this order).
    pub endpoints: Vec<StateEndpoint>,
    /// Requests previously routed, recorded in the prefix index in order.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// The pool's base model; defaults to the request's model.
    #[serde(default)]
    pub base_model: Option<String>,
    /// The endpoint that last served the request's session.
    #[serde(default)]
    pub last_endpoint_for_session: Option<String>,
}

/// One endpoint of the state file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateEndpoint {
    /// `ip:port`.
    pub address: String,
    /// Scraped metrics; absent = unknown.
    #[serde(default)]
    pub metrics: Option<EndpointMetrics>,
    /// The proxy's in-flight load to this endpoint.
    #[serde(default)]
    pub inflight: InFlight,
}

/// A request routed before the one being explained.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryEntry {
    /// Where it was routed.
    pub endpoint: String,
    /// Its API path (default `/v1/chat/completions`).
    #[serde(default = "default_path")]
    pub path: String,
    /// Its body.
    pub body: serde_json::Value,
}

fn default_path() -> String {
    Api::ChatCompletions.path().to_string()
}

/// Reads and compiles a config: `.json` files as JSON, anything else as YAML.
pub fn load_config(path: &Path) -> Result<Scheduler> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let scheduler = if is_json {
        Scheduler::from_json_str(&text)
    } else {
        let value: serde_json::Value = serde_yaml::from_str(&text)
            .with_context(|| format!("config {}: invalid YAML", path.display()))?;
        Scheduler::from_value(value)
    };
    scheduler.with_context(|| format!("config {}", path.display()))
}

/// Reads a state file.
pub fn load_state(path: &Path) -> Result<State> {
    let text = std::fs::read(path).with_context(|| format!("reading state {}", path.display()))?;
    serde_json::from_slice(&text)
        .with_context(|| format!("state {}: invalid state file", path.display()))
}

/// Parses a request body for `path`, with the core's parser (the gateway's own rules).
pub fn parse_request(path: &str, body: &[u8]) -> Result<ParsedRequest> {
    let Some(api) = Api::from_path(path) else {
        bail!("unsupported path `{path}` (expected /v1/chat/completions, /v1/completions or /v1/messages)");
    };
    parse(api, body).map_err(|e| anyhow::anyhow!("{} (code {})", e.message(), e.code()))
}

/// Builds the prefix index the state describes: per-endpoint capacities, then the history.
pub fn build_index(scheduler: &Scheduler, state: &State) -> Result<PrefixIndex> {
    let mut index = scheduler.new_prefix_index();
    let cfg = scheduler.prefix_config();
    for e in &state.endpoints {
        index.set_capacity(&e.address, scheduler.lru_capacity_for(e.metrics.as_ref()));
    }
    for (i, h) in state.history.iter().enumerate() {
        if !state.endpoints.iter().any(|e| e.address == h.endpoint) {
            bail!(
                "history[{i}]: endpoint `{}` is not one of the state's endpoints",
                h.endpoint
            );
        }
        let body = serde_json::to_vec(&h.body)?;
        let req = parse_request(&h.path, &body).with_context(|| format!("history[{i}]"))?;
        let hashes = request_hashes(&req.model, req.cache_salt.as_deref(), &req.prompt, &cfg);
        index.record(&h.endpoint, &hashes);
    }
    Ok(index)
}

/// Runs one decision and returns its record as pretty JSON.
pub fn explain(
    scheduler: &Scheduler,
    state: &State,
    path: &str,
    body: &[u8],
    seed: u64,
    now: Millis,
) -> Result<String> {
    let index = build_index(scheduler, state)?;
    let req = parse_request(path, body)?;
    let hashes = request_hashes(
        &req.model,
        req.cache_salt.as_deref(),
        &req.prompt,
        &scheduler.prefix_config(),
    );
    let view = RequestView {
        target_model: &req.model,
        base_model: state.base_model.as_deref().unwrap_or(&req.model),
        block_hashes: &hashes,
        prompt_tokens: req.prompt_tokens,
        last_endpoint_for_session: state.last_endpoint_for_session.as_deref(),
    };
    let candidates: Vec<Candidate<'_>> = state
        .endpoints
        .iter()
        .map(|e| Candidate {
            address: &e.address,
            metrics: e.metrics.as_ref(),
            inflight: e.inflight,
        })
        .collect();
    let decision = scheduler.schedule(&view, &candidates, &index, seed, now);
    Ok(serde_json::to_string_pretty(&decision)?)
}

/// The whole command: file paths in, decision JSON out.
pub fn run(
    config: &Path,
    state: &Path,
    request: &Path,
    path: &str,
    seed: u64,
    now: Millis,
) -> Result<String> {
    let scheduler = load_config(config)?;
    let state = load_state(state)?;
    let body =
        std::fs::read(request).with_context(|| format!("reading request {}", request.display()))?;
    explain(&scheduler, &state, path, &body, seed, now)
        .with_context(|| format!("request {}", request.display()))
}
