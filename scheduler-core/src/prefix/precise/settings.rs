//! Parameters of the `precise-prefix-cache-producer` plugin.
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `blockSizeTokens` | the engine's (`vllm:cache_config_info`), [`DEFAULT_BLOCK_SIZE_TOKENS`] until known | tokens per block, 1..=2²⁰ |
//! | `maxPrefixTokensToMatch` | 131072 | match at most this many leading tokens (≥ 1) |
//! | `maxBlocksPerServer` | 262144 | confirmed blocks held per endpoint, 1..=2³² − 1 |
//! | `speculativeTtlMs` | 2000 | how long a pick's speculative entry counts, 0..=600000 (0: none) |
//! | `kvEventsPort` | 5557 | each endpoint's events at `tcp://<endpoint ip>:<port>`, 1..=65535 |
//! | `kvEventsPortOffset` | — | instead: at the endpoint's port + offset, 1..=65535 (several engines on a host) |
//! | `tokenizer` | `{"type": "sim"}` | a map with a string `type`, kept as is for the host's tokenizer factory |
//!
//! `kvEventsPort` and `kvEventsPortOffset` exclude each other. Unknown parameters are
//! errors, as for every plugin.

use alloc::format;
use serde_json::{Map, Value};

use crate::config::params::{bad, Params};
use crate::config::ConfigError;

/// Tokens per block until the engine's `cache_config_info` says otherwise (vLLM's default).
pub const DEFAULT_BLOCK_SIZE_TOKENS: u32 = 16;
/// Default `maxPrefixTokensToMatch`.
pub const DEFAULT_MAX_PREFIX_TOKENS: u64 = 131_072;
/// Default `maxBlocksPerServer`.
pub const DEFAULT_MAX_BLOCKS_PER_SERVER: u32 = 262_144;
/// Default `speculativeTtlMs`.
pub const DEFAULT_SPECULATIVE_TTL_MS: u64 = 2_000;
/// Longest `speculativeTtlMs` accepted (10 minutes).
pub const MAX_SPECULATIVE_TTL_MS: u64 = 600_000;
/// vLLM's default KV events port.
pub const DEFAULT_KV_EVENTS_PORT: u16 = 5557;

/// Where an endpoint publishes its KV events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventsPort {
    /// A fixed port on the endpoint's IP (`kvEventsPort`).
    Fixed(u16),
    /// The endpoint's own port plus this offset (`kvEventsPortOffset`).
    Offset(u16),
}

impl EventsPort {
    /// The events port of an endpoint serving on `endpoint_port`; `None` when the offset
    /// leaves the port range.
    pub fn for_endpoint(self, endpoint_port: u16) -> Option<u16> {
        match self {
            EventsPort::Fixed(p) => Some(p),
            EventsPort::Offset(o) => endpoint_port.checked_add(o),
        }
    }
}

/// The parsed parameters of `precise-prefix-cache-producer` (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct PreciseSettings {
    /// `blockSizeTokens`; `None`: the engine's, [`DEFAULT_BLOCK_SIZE_TOKENS`] until known.
    pub block_size_tokens: Option<u32>,
    /// `maxPrefixTokensToMatch`.
    pub max_prefix_tokens_to_match: u64,
    /// `maxBlocksPerServer`.
    pub max_blocks_per_server: u32,
    /// `speculativeTtlMs`.
    pub speculative_ttl_ms: u64,
    /// `kvEventsPort` or `kvEventsPortOffset`.
    pub events_port: EventsPort,
    /// `tokenizer`: a JSON map with a string `type`, for the host's tokenizer factory.
    pub tokenizer: Value,
}

impl Default for PreciseSettings {
    fn default() -> Self {
        PreciseSettings {
            block_size_tokens: None,
            max_prefix_tokens_to_match: DEFAULT_MAX_PREFIX_TOKENS,
            max_blocks_per_server: DEFAULT_MAX_BLOCKS_PER_SERVER,
            speculative_ttl_ms: DEFAULT_SPECULATIVE_TTL_MS,
            events_port: EventsPort::Fixed(DEFAULT_KV_EVENTS_PORT),
            tokenizer: default_tokenizer(),
        }
    }
}

impl PreciseSettings {
    /// Blocks matched at most for a block size of `block_size_tokens` (0 for 0).
    pub fn max_blocks(&self, block_size_tokens: u32) -> usize {
        match block_size_tokens {
            0 => 0,
            b => usize::try_from(self.max_prefix_tokens_to_match / u64::from(b))
                .unwrap_or(usize::MAX),
        }
    }
}

fn default_tokenizer() -> Value {
    let mut m = Map::new();
    m.insert("type".into(), Value::String("sim".into()));
    Value::Object(m)
}

const KNOWN: &[&str] = &[
    "blockSizeTokens",
    "maxPrefixTokensToMatch",
    "maxBlocksPerServer",
    "speculativeTtlMs",
    "kvEventsPort",
    "kvEventsPortOffset",
    "tokenizer",
];

/// Parses the `parameters` of the plugin instance named `plugin` (what
/// `PluginSpec::parameters` holds; absent or null: every default).
pub fn parse_precise_producer(
    plugin: &str,
    params: Option<&Value>,
) -> Result<PreciseSettings, ConfigError> {
    precise_producer(&Params::new(plugin, params)?)
}

/// Reads the parameters `p` of a `precise-prefix-cache-producer` (in describe mode too).
pub(crate) fn precise_producer(p: &Params<'_>) -> Result<PreciseSettings, ConfigError> {
    let plugin = p.plugin();
    p.only(KNOWN)?;
    let d = PreciseSettings::default();
    let block = p.u64_opt_in(
        "blockSizeTokens",
        1,
        1 << 20,
        format_args!(
            "the engine's (`cache_config_info`, else its KV events'), {DEFAULT_BLOCK_SIZE_TOKENS} until known"
        ),
    )?;
    let port = p.u64_opt_in(
        "kvEventsPort",
        1,
        65_535,
        format_args!("{DEFAULT_KV_EVENTS_PORT} unless `kvEventsPortOffset` is given"),
    )?;
    let offset = p.u64_opt_in(
        "kvEventsPortOffset",
        1,
        65_535,
        format_args!("none: `kvEventsPort`"),
    )?;
    let events_port = match (port, offset) {
        (Some(_), Some(_)) => {
            return Err(bad(
                plugin,
                "kvEventsPortOffset",
                "excludes kvEventsPort: give one of them",
            ))
        }
        (Some(n), None) => EventsPort::Fixed(u16::try_from(n).unwrap_or(DEFAULT_KV_EVENTS_PORT)),
        (None, Some(o)) => EventsPort::Offset(u16::try_from(o).unwrap_or(u16::MAX)),
        (None, None) => d.events_port,
    };
    let tokenizer = p.raw(
        "tokenizer",
        "map",
        format_args!("{}", d.tokenizer),
        Some("a map with a string `type`"),
    );
    let tokenizer = match tokenizer {
        None => d.tokenizer,
        Some(v @ Value::Object(m)) if m.get("type").is_some_and(Value::is_string) => v.clone(),
        Some(v) => {
            return Err(bad(
                plugin,
                "tokenizer",
                &format!("must be a map with a string type, got {v}"),
            ))
        }
    };
    Ok(PreciseSettings {
        block_size_tokens: block.and_then(|b| u32::try_from(b).ok()),
        max_prefix_tokens_to_match: p.u64_in(
            "maxPrefixTokensToMatch",
            d.max_prefix_tokens_to_match,
            1,
            u64::MAX,
        )?,
        max_blocks_per_server: u32::try_from(p.u64_in(
            "maxBlocksPerServer",
            d.max_blocks_per_server.into(),
            1,
            u32::MAX.into(),
        )?)
        .unwrap_or(d.max_blocks_per_server),
        speculative_ttl_ms: p.u64_in(
            "speculativeTtlMs",
            d.speculative_ttl_ms,
            0,
            MAX_SPECULATIVE_TTL_MS,
        )?,
        events_port,
        tokenizer,
    })
}
