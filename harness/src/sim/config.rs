//! Configuration of a simulated pool: replicas, served names, timing and the engine model.

use serde::Deserialize;

use super::engine::EngineConfig;

/// A pool of identical replicas in one process.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Number of replicas (default 1).
    pub replicas: u32,
    /// First port; replica K listens on `port + K`. 0 picks free ports (default 0).
    pub port: u16,
    /// Served model names; every name is the base model (default `["sim-model"]`).
    pub models: Vec<String>,
    /// LoRA adapter names served on top of the base model (default none).
    pub loras: Vec<String>,
    /// Simulated seconds per real second (default 1).
    pub time_scale: f64,
    /// Completion length when the request sets no lower `max_tokens` and no `ignore_eos`
    /// (the simulated model's natural stop; default 128).
    pub output_tokens: u32,
    /// The engine model of every replica.
    pub engine: EngineConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            port: 0,
            models: vec!["sim-model".to_string()],
            loras: Vec::new(),
            time_scale: 1.0,
            output_tokens: 128,
            engine: EngineConfig::default(),
        }
    }
}

impl SimConfig {
    /// Reads a YAML (or JSON) file with the fields of this struct.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        Ok(serde_yaml::from_str(&text)?)
    }

    /// The base model name reported for adapters.
    pub fn base_model(&self) -> &str {
        self.models
            .first()
            .map(String::as_str)
            .unwrap_or("sim-model")
    }
}
