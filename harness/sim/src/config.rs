//! Configuration of a simulated pool: replicas, served names, timing and the engine model.

use serde::Deserialize;

use super::engine::EngineConfig;
use super::responses::PromptTokensDetails;

/// A pool of identical replicas in one process.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Number of replicas (default 1).
    pub replicas: u32,
    /// First port; replica K listens on `port + K`. 0 picks free ports (default 0).
    pub port: u16,
    /// Replica K listens on `listen[K]` when the list has an entry for it, instead of
    /// 127.0.0.1 (data-parallel ranks: pods on 127.0.0.2, 127.0.0.3 …, each rank an engine
    /// of its own on its own port; default none).
    pub listen: Vec<std::net::SocketAddr>,
    /// Served model names; every name is the base model (default `["sim-model"]`).
    pub models: Vec<String>,
    /// LoRA adapter names served on top of the base model (default none).
    pub loras: Vec<String>,
    /// Simulated seconds per real second (default 1).
    pub time_scale: f64,
    /// Completion length when the request sets no lower `max_tokens` and no `ignore_eos`
    /// (the simulated model's natural stop; default 128).
    pub output_tokens: u32,
    /// Send no usage at all, whatever the request asks: no usage-only chunk, no
    /// continuous usage, no `usage` in full responses (an engine without usage reporting;
    /// default false).
    pub no_usage: bool,
    /// When `usage.prompt_tokens_details.cached_tokens` is reported (default `always`,
    /// 0 included; `nonzero` is vLLM with `--enable-prompt-tokens-details`, `off` vLLM's
    /// default).
    pub prompt_tokens_details: PromptTokensDetails,
    /// Response bytes depend only on the request's prompt, model and length: `id` is a hash
    /// of the prompt, `created` is fixed (default false: per-replica counters and the
    /// clock). Usage still reports what the replica did, and timing is unchanged.
    pub deterministic: bool,
    /// The engine model of every replica.
    pub engine: EngineConfig,
    /// Disaggregated prefill: the simulated time to move a prompt's KV blocks from the
    /// prefill replica to the decode replica, per 1,000 prompt tokens (default 5 ms, about
    /// an 8B model's KV over a 25 GB/s link).
    pub kv_transfer_ms_per_1k_tokens: f64,
    /// Disaggregated prefill: the fixed part of each KV transfer, simulated ms (default 1).
    pub kv_transfer_base_ms: f64,
    /// Publish vLLM's KV events over ZMQ PUB: replica K serving HTTP on `IP:P` binds
    /// `tcp://IP:(P + offset)` (see [`crate::kv_events`]; default none: no events). At
    /// least 1.
    pub kv_events_port_offset: Option<u16>,
}

/// The `created` stamp of every response in deterministic mode (2025-01-01T00:00:00Z).
pub const DETERMINISTIC_CREATED: u64 = 1_735_689_600;

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            port: 0,
            listen: Vec::new(),
            models: vec!["sim-model".to_string()],
            loras: Vec::new(),
            time_scale: 1.0,
            output_tokens: 128,
            no_usage: false,
            prompt_tokens_details: PromptTokensDetails::Always,
            deterministic: false,
            engine: EngineConfig::default(),
            kv_transfer_ms_per_1k_tokens: 5.0,
            kv_transfer_base_ms: 1.0,
            kv_events_port_offset: None,
        }
    }
}

impl SimConfig {
    /// Reads a YAML (or JSON) file with the fields of this struct.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        Ok(serde_yaml_ng::from_str(&text)?)
    }

    /// The base model name reported for adapters.
    pub fn base_model(&self) -> &str {
        self.models
            .first()
            .map(String::as_str)
            .unwrap_or("sim-model")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn yaml_overrides_defaults_and_rejects_unknown_fields() {
        let c: SimConfig = serde_yaml_ng::from_str(
            "replicas: 3\nmodels: [base]\nloras: [a, b]\nengine:\n  kv_capacity_tokens: 32000\n  max_loras: 2\n",
        )
        .unwrap();
        assert_eq!(c.replicas, 3);
        assert_eq!(c.base_model(), "base");
        assert_eq!(c.loras, vec!["a", "b"]);
        assert_eq!(c.engine.num_blocks(), 2000);
        assert_eq!(c.engine.max_loras, 2);
        assert_eq!(c.engine.block_size, 16, "unset fields keep their defaults");
        assert_eq!(c.time_scale, 1.0);
        assert!(!c.no_usage && !c.deterministic);
        assert_eq!(c.prompt_tokens_details, PromptTokensDetails::Always);
        let u: SimConfig = serde_yaml_ng::from_str(
            "no_usage: true\ndeterministic: true\nprompt_tokens_details: nonzero\n",
        )
        .unwrap();
        assert!(u.no_usage && u.deterministic);
        assert_eq!(u.prompt_tokens_details, PromptTokensDetails::Nonzero);
        assert!(serde_yaml_ng::from_str::<SimConfig>("prompt_tokens_details: some\n").is_err());
        assert!(serde_yaml_ng::from_str::<SimConfig>("replica: 3\n").is_err());
        let json: SimConfig = serde_yaml_ng::from_str(r#"{"port": 9000}"#).unwrap();
        assert_eq!(json.port, 9000);
        let ranks: SimConfig = serde_yaml_ng::from_str("listen: ['127.0.0.2:8000']\n").unwrap();
        assert_eq!(ranks.listen, ["127.0.0.2:8000".parse().unwrap()]);
        assert_eq!(c.kv_events_port_offset, None);
        let kv: SimConfig = serde_yaml_ng::from_str("kv_events_port_offset: 1000\n").unwrap();
        assert_eq!(kv.kv_events_port_offset, Some(1000));
    }
}
