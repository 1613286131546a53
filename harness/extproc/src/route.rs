//! The processor's routing decision: from a complete request body to the headers Envoy
//! routes on (the destination endpoint and the base model), in one of two [`Mode`]s.
//!
//! - [`Mode::Null`] reads nothing: the next endpoint in turn and the configured model. It is
//!   the floor of the external-processor architecture (the body still travels to the
//!   processor and back; nothing is done with it).
//! - [`Mode::Parse`] does the least a real endpoint picker does before it decides: the
//!   core's one-pass request parse (`scheduler_core::request::parse_with_limit`, capped at
//!   what hashing reads) and the prefix block hashes of the canonical prompt
//!   (`scheduler_core::prefix::block_hashes`, the picker's default 64-token blocks, seeded
//!   by the model and `cache_salt`) — the same calls the gateway's picker makes. The first
//!   block's hash picks the endpoint, so the work is not dead code; the base model is the
//!   body's.

use std::sync::atomic::{AtomicUsize, Ordering};

use scheduler_core::prefix::{block_hashes, seed, PrefixConfig};
use scheduler_core::request::{parse_with_limit, Api, RequestError};

/// The header naming the endpoint (`ip:port`) the request goes to: the pool cluster is
/// ORIGINAL_DST on it.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// The header the routes match a pool on.
pub const BASE_MODEL_HEADER: &str = "x-gateway-base-model-name";

/// What the processor does with a body before it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Nothing: the next endpoint in turn.
    Null,
    /// Parse the body and hash its prompt into prefix blocks, as the core does.
    Parse,
}

/// Where one request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route<'a> {
    /// The endpoint, `ip:port`.
    pub endpoint: &'a str,
    /// The base model the routes match.
    pub base_model: String,
    /// Prefix blocks hashed ([`Mode::Parse`]; 0 otherwise).
    pub blocks: usize,
}

/// The routing decision of every stream of one processor.
#[derive(Debug)]
pub struct Router {
    mode: Mode,
    endpoints: Vec<String>,
    model: String,
    prefix: PrefixConfig,
    next: AtomicUsize,
}

impl Router {
    /// A router over `endpoints` (at least one); `model` is the base model [`Mode::Null`]
    /// names.
    pub fn new(mode: Mode, endpoints: Vec<String>, model: String) -> anyhow::Result<Router> {
        if endpoints.is_empty() {
            anyhow::bail!("a router needs at least one endpoint");
        }
        Ok(Router {
            mode,
            endpoints,
            model,
            prefix: PrefixConfig::default(),
            next: AtomicUsize::new(0),
        })
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Decides where the request with this complete `body` goes. A body the parse refuses
    /// is an error ([`Mode::Parse`] only; the caller answers 400).
    pub fn route(&self, body: &[u8]) -> Result<Route<'_>, RequestError> {
        match self.mode {
            Mode::Null => Ok(Route {
                endpoint: self.turn(),
                base_model: self.model.clone(),
                blocks: 0,
            }),
            Mode::Parse => {
                let parsed =
                    parse_with_limit(Api::ChatCompletions, body, self.prefix.max_prompt_bytes())?;
                let hashes = block_hashes(
                    seed(&parsed.model, parsed.cache_salt.as_deref()),
                    &parsed.prompt,
                    &self.prefix,
                );
                let endpoint = match hashes.first() {
                    Some(h) => self.at(h.0),
                    None => self.turn(),
                };
                Ok(Route {
                    endpoint,
                    base_model: parsed.model,
                    blocks: hashes.len(),
                })
            }
        }
    }

    /// The next endpoint in turn.
    fn turn(&self) -> &str {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.at(i as u64)
    }

    fn at(&self, i: u64) -> &str {
        let n = self.endpoints.len() as u64;
        let i = usize::try_from(i % n).unwrap_or(0);
        self.endpoints.get(i).map_or("", String::as_str)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn router(mode: Mode) -> Router {
        Router::new(
            mode,
            vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            "m0".into(),
        )
        .unwrap()
    }

    fn chat(model: &str, text: &str) -> Vec<u8> {
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"{text}"}}]}}"#)
            .into_bytes()
    }

    #[test]
    fn null_mode_turns_over_the_endpoints_and_reads_nothing() {
        let r = router(Mode::Null);
        let picks: Vec<&str> = (0..3)
            .map(|_| r.route(b"not json").unwrap().endpoint)
            .collect();
        assert_eq!(picks, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"]);
        assert_eq!(r.route(b"").unwrap().base_model, "m0");
        assert!(Router::new(Mode::Null, Vec::new(), "m".into()).is_err());
    }

    #[test]
    fn parse_mode_hashes_the_prompt_and_names_the_bodys_model() {
        let r = router(Mode::Parse);
        let long = "word ".repeat(300);
        let a = r.route(&chat("big-model", &long)).unwrap();
        assert_eq!(a.base_model, "big-model");
        // 1500 bytes of content: at least five 64-token (256-byte) blocks.
        assert!(a.blocks >= 5, "{a:?}");
        // The same prompt always goes to the same endpoint.
        for _ in 0..4 {
            assert_eq!(
                r.route(&chat("big-model", &long)).unwrap().endpoint,
                a.endpoint
            );
        }
        assert!(r.route(b"not json").is_err());
        assert!(r.route(br#"{"messages":[]}"#).is_err(), "no model");
    }
}
