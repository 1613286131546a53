//! `infergate explain`: run one scheduling decision offline and print its record.
//!
//! Inputs are files an operator can write by hand: an `EndpointPickerConfig` (YAML or
//! JSON), a state file describing the pool, and a request body. The state file:
//!
//! ```json
//! {"endpoints": [{"address": "10.0.0.1:8000",
//!                 "metrics": {"waiting": 3, "running": 5, "kv_cache_usage": 0.7,
//!                             "lora": {"max": 4, "running": ["a"], "waiting": []}},
//!                 "scraped_at_ms": 99500, "consecutive_failures": 0,
//!                 "inflight": {"requests": 2, "tokens": 4096}}],
//!  "failure_mode": "FailClose", "stale_after_ms": 1000, "max_consecutive_failures": 3,
//!  "history": [{"endpoint": "10.0.0.1:8000", "path": "/v1/completions", "body": {...}}],
//!  "base_model": "meta-llama/Llama-3.1-8B-Instruct",
//!  "adapters": ["support-assistant-v1"], "pool": "llama-pool",
//!  "last_endpoint_for_session": "10.0.0.1:8000",
//!  "endpoint_roles": {"10.0.0.1:8000": "prefill", "10.0.0.2": "decode"}}
//! ```
//!
//! Each endpoint is the scraper's record of it: `metrics` absent means never scraped
//! successfully, `scraped_at_ms` (default: `--now-ms`, i.e. just scraped) is when the
//! metrics were, `consecutive_failures` (default 0) counts failed scrapes since, and
//! `"in_snapshot": false` says the scraper has no record of it at all. The pool's
//! `failure_mode`, `stale_after_ms` and `max_consecutive_failures` are the picker's pool
//! fields of the same names (same defaults). The endpoints are classified and the
//! candidate set chosen by the core's candidate rules
//! ([`scheduler_core::scheduling::candidates`]) at `--now-ms`, the functions the gateway's
//! picker runs: dead endpoints are not candidates, stale ones are unknown, and with none
//! fresh a `FailClose` pool is rejected (the gateway's 503) while a `FailOpen` one is
//! scheduled over the live endpoints without metrics (over every member, when every one
//! is dead: its metrics are unavailable). The output is the decision record plus
//! `endpoints` (each endpoint's class) and `selection` (`fresh`, `degraded` or
//! `every_member`); a
//! rejection prints `picked: null`, `rejected` (the gateway's stat label) and `message`
//! (its 503 text). `inflight`, `history`, `base_model` (default: the request's model) and
//! `last_endpoint_for_session` are optional. History requests are parsed with the core's
//! request parser and recorded in the prefix index in order, as if they had been routed
//! to their endpoint, exactly as the picker records routed requests (their bodies are as
//! the engine received them, after any rewrite). As in the picker, prompts are hashed into
//! prefix blocks only when a profile reads the prefix index.
//!
//! `endpoint_roles` is the picker pool's `endpointRoles` (same shape: an `ip:port` or a bare
//! IP to `prefill`, `decode`, `both` or llm-d's labels; absent = every endpoint `both`),
//! resolved and given to the candidates by the picker's own functions, so a config with a
//! `disagg-profile-handler` is explained as the gateway routes it: the record's
//! `prefiller` is the `x-prefiller-host-port` the gateway would set, and with roles
//! configured each entry of `endpoints` also has its `role`.
//!
//! `base_model` matters for adapters: the request's `model` is the target the LoRA scorer
//! and the prefix seed use, `base_model` the pool serving it; without it an adapter request
//! is taken for a base-model request. With rewrite objects ([`rewrite`]), the request is
//! first rewritten as the router would: `adapters` and `pool` (the router pool's adapters
//! and name) are the pool the objects are compiled against, and the record gains
//! `rewrite` (sent and target model, the object and rule that matched, the split).

use std::path::Path;

use anyhow::{bail, Context, Result};
use infergate_filters::picker::disagg::{assign_roles, EndpointRoles};
use infergate_filters::picker::Rejection;
use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::prefix::{request_hashes, PrefixIndex};
use scheduler_core::request::{parse, Api, ParsedRequest};
use scheduler_core::scheduling::candidates::{
    classify, pool_candidates, CandidateRules, FailureMode, PoolEndpoint, SnapshotRecord,
    DEFAULT_MAX_CONSECUTIVE_FAILURES,
};
use scheduler_core::scheduling::{RequestView, Role, Scheduler};
use scheduler_core::snapshot::{EndpointSample, DEFAULT_MAX_AGE_MS};
use scheduler_core::types::{InFlight, Millis};
use serde::Deserialize;
use serde_json::{json, Value};

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
    /// The pool's LoRA adapters (the router's pool `adapters`): the targets a rewrite may
    /// choose besides the base model.
    #[serde(default)]
    pub adapters: Vec<String>,
    /// The pool's name (the router's pool `name`, which rewrite objects' `poolRef.name`
    /// names); without it every rewrite object is taken as this pool's.
    #[serde(default)]
    pub pool: Option<String>,
    /// The endpoint that last served the request's session.
    #[serde(default)]
    pub last_endpoint_for_session: Option<String>,
    /// Prefill/decode roles of the endpoints (the picker pool's `endpointRoles`).
    #[serde(default)]
    pub endpoint_roles: EndpointRoles,
    /// No endpoint fresh: reject (`FailClose`, the default) or schedule the live ones.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// A sample older than this (ms) at `now` has unknown metrics.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// This many failed scrapes in a row make an endpoint dead (0: never).
    #[serde(default = "default_max_consecutive_failures")]
    pub max_consecutive_failures: u32,
}

fn default_stale_after_ms() -> u64 {
    DEFAULT_MAX_AGE_MS
}

fn default_max_consecutive_failures() -> u32 {
    DEFAULT_MAX_CONSECUTIVE_FAILURES
}

fn default_true() -> bool {
    true
}

impl State {
    /// The pool's candidate rules, as the picker's pool fields set them.
    pub fn rules(&self) -> CandidateRules {
        CandidateRules {
            stale_after_ms: self.stale_after_ms,
            max_consecutive_failures: self.max_consecutive_failures,
            failure_mode: self.failure_mode,
        }
    }

    /// Each endpoint's role, in endpoint order, as the picker resolves its pool's roles;
    /// the error names the offending key.
    pub fn roles(&self) -> Result<Vec<Role>> {
        let addresses: Vec<String> = self.endpoints.iter().map(|e| e.address.clone()).collect();
        self.endpoint_roles
            .resolve(&addresses)
            .map_err(|e| anyhow::anyhow!("state: endpoint_roles: {e}"))
    }

    /// The scraper's snapshot records of the endpoints at `now` (`None` for one the
    /// snapshot lacks), in endpoint order.
    pub fn samples(&self, now: Millis) -> Vec<Option<EndpointSample>> {
        self.endpoints
            .iter()
            .map(|e| {
                e.in_snapshot.then(|| EndpointSample {
                    address: e.address.clone(),
                    scraped_at: e.scraped_at_ms.map_or(now, Millis),
                    consecutive_failures: e.consecutive_failures,
                    metrics: e.metrics.clone(),
                })
            })
            .collect()
    }
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
    /// When the metrics were scraped (ms); absent = at `now`.
    #[serde(default)]
    pub scraped_at_ms: Option<u64>,
    /// Failed scrapes in a row since the last success.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Whether the scraper's snapshot has a record of the endpoint at all.
    #[serde(default = "default_true")]
    pub in_snapshot: bool,
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
        let value: serde_json::Value = serde_yaml_ng::from_str(&text)
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

/// The request's prefix block hashes, as the picker computes them: none when no profile
/// reads the prefix index.
fn block_hashes(
    scheduler: &Scheduler,
    req: &ParsedRequest,
) -> Vec<scheduler_core::types::BlockHash> {
    if !scheduler.uses_prefix_index() {
        return Vec::new();
    }
    request_hashes(
        &req.model,
        req.cache_salt.as_deref(),
        &req.prompt,
        &scheduler.prefix_config(),
    )
}

/// The router's model rewrites, for [`decide_with`].
#[derive(Clone, Debug, Default)]
pub struct Rewriting {
    /// `InferenceModelRewrite` objects (none: the request is scheduled as sent).
    pub objects: Vec<Value>,
    /// The request's sticky key (session header value or fairness id); none: the target
    /// is drawn per request from the seed.
    pub sticky_key: Option<String>,
}

/// Runs one decision the way the gateway's picker would (candidate rules, then the
/// scheduler) and returns its record as JSON (see the module doc).
pub fn decide(
    scheduler: &Scheduler,
    state: &State,
    path: &str,
    body: &[u8],
    seed: u64,
    now: Millis,
) -> Result<Value> {
    decide_with(
        scheduler,
        state,
        path,
        body,
        seed,
        now,
        &Rewriting::default(),
    )
}

/// [`decide`] after the router's model rewrite of the request ([`rewrite`]); with rewrite
/// objects the record gains `rewrite` (what the rewrite chose, `null` if no rule matched).
pub fn decide_with(
    scheduler: &Scheduler,
    state: &State,
    path: &str,
    body: &[u8],
    seed: u64,
    now: Millis,
    rewriting: &Rewriting,
) -> Result<Value> {
    let index = build_index(scheduler, state)?;
    let mut req = parse_request(path, body)?;
    let mut rewrite_record = None;
    if !rewriting.objects.is_empty() {
        let rewritten = rewrite::apply(
            &rewriting.objects,
            state,
            &req.model,
            body,
            rewriting.sticky_key.as_deref(),
            seed,
        )?;
        rewrite_record = Some(match rewritten {
            Some(r) => {
                req = parse_request(path, &r.body)?;
                r.record
            }
            None => Value::Null,
        });
    }
    let hashes = block_hashes(scheduler, &req);
    let rules = state.rules();
    let samples = state.samples(now);
    let roles = state.roles()?;
    let classes: Vec<Value> = state
        .endpoints
        .iter()
        .zip(&samples)
        .zip(&roles)
        .map(|((e, s), role)| {
            let mut class =
                json!({"address": e.address, "class": classify(record(s), &rules, now).label()});
            if !state.endpoint_roles.is_empty() {
                class["role"] = json!(role.as_str());
            }
            class
        })
        .collect();
    let endpoints = state
        .endpoints
        .iter()
        .zip(&samples)
        .map(|(e, s)| PoolEndpoint {
            address: &e.address,
            record: record(s),
            inflight: e.inflight,
            // The proxy's measured latency is not part of an explain state.
            latency: None,
        });
    let mut set = match pool_candidates(endpoints, &rules, now) {
        Ok(set) => set,
        Err(reason) => {
            let rejection = Rejection::from(reason);
            let mut out = json!({
                "picked": null,
                "rejected": rejection.label(),
                "message": rejection.message(),
                "endpoints": classes,
            });
            if let Some(r) = rewrite_record {
                out["rewrite"] = r;
            }
            return Ok(out);
        }
    };
    // The candidates are listed in endpoint order, so a candidate's listed index is its
    // endpoint's (as the picker maps them when no subset narrows the pool).
    let listed = set.pool_index.clone();
    assign_roles(&mut set.candidates, &roles, |c| listed.get(c).copied());
    let view = RequestView {
        target_model: &req.model,
        base_model: state.base_model.as_deref().unwrap_or(&req.model),
        block_hashes: &hashes,
        prompt_tokens: req.prompt_tokens,
        last_endpoint_for_session: state.last_endpoint_for_session.as_deref(),
    };
    let decision = scheduler.schedule(&view, &set.candidates, &index, seed, now);
    let mut record = serde_json::to_value(&decision)?;
    if let Some(obj) = record.as_object_mut() {
        if decision.picked().is_none() {
            let rejection = Rejection::NoEndpoints;
            obj.insert("rejected".into(), json!(rejection.label()));
            obj.insert("message".into(), json!(rejection.message()));
        }
        obj.insert("selection".into(), serde_json::to_value(set.selection)?);
        obj.insert("endpoints".into(), Value::Array(classes));
        if let Some(r) = rewrite_record {
            obj.insert("rewrite".into(), r);
        }
    }
    Ok(record)
}

/// A sample as a snapshot record (`None`: the snapshot has none).
fn record(sample: &Option<EndpointSample>) -> SnapshotRecord<'_> {
    match sample {
        Some(s) => SnapshotRecord::Present(s),
        None => SnapshotRecord::Missing,
    }
}

/// [`decide_with`], as pretty JSON.
pub fn explain(
    scheduler: &Scheduler,
    state: &State,
    path: &str,
    body: &[u8],
    seed: u64,
    now: Millis,
    rewriting: &Rewriting,
) -> Result<String> {
    Ok(serde_json::to_string_pretty(&decide_with(
        scheduler, state, path, body, seed, now, rewriting,
    )?)?)
}

/// The command's inputs.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// `--config`.
    pub config: &'a Path,
    /// `--state`.
    pub state: &'a Path,
    /// `--request`.
    pub request: &'a Path,
    /// `--path`.
    pub path: &'a str,
    /// `--seed`.
    pub seed: u64,
    /// `--now-ms`.
    pub now: Millis,
    /// `--rewrites`: a YAML or JSON file of `InferenceModelRewrite` objects.
    pub rewrites: Option<&'a Path>,
    /// `--sticky-key`.
    pub sticky_key: Option<&'a str>,
}

/// The whole command: file paths in, decision JSON out.
pub fn run(inputs: &Inputs<'_>) -> Result<String> {
    let scheduler = load_config(inputs.config)?;
    let state = load_state(inputs.state)?;
    let request = inputs.request;
    let body =
        std::fs::read(request).with_context(|| format!("reading request {}", request.display()))?;
    let rewriting = Rewriting {
        objects: match inputs.rewrites {
            Some(file) => crate::config::load_objects(file).context("--rewrites")?,
            None => Vec::new(),
        },
        sticky_key: inputs.sticky_key.map(str::to_owned),
    };
    explain(
        &scheduler,
        &state,
        inputs.path,
        &body,
        inputs.seed,
        inputs.now,
        &rewriting,
    )
    .with_context(|| format!("request {}", request.display()))
}

pub mod rewrite;
#[cfg(test)]
mod tests;
