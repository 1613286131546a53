//! `infergate-sim`: a pool of simulated vLLM replicas on loopback.
//!
//! Prints `replica K: http://127.0.0.1:PORT` per replica once listening, then serves until
//! SIGINT or SIGTERM. Every engine parameter is a flag; `--config FILE` (YAML or JSON with
//! the fields of `SimConfig`) sets a base that flags override.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use infergate_sim::{self as sim, PromptTokensDetails, SimConfig};

#[derive(Debug, Parser)]
#[command(name = "infergate-sim", about = "Simulated vLLM replicas on loopback")]
struct Args {
    /// YAML/JSON file with SimConfig fields (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Number of replicas [default: 1].
    #[arg(long)]
    replicas: Option<u32>,
    /// First port (replica K uses PORT+K); 0 picks free ports [default: 0].
    #[arg(long)]
    port: Option<u16>,
    /// Served model name (repeatable) [default: sim-model].
    #[arg(long = "model")]
    models: Vec<String>,
    /// LoRA adapter name served on the base model (repeatable).
    #[arg(long = "lora")]
    loras: Vec<String>,
    /// Simulated seconds per real second [default: 1].
    #[arg(long)]
    time_scale: Option<f64>,
    /// Natural completion length in tokens when max_tokens is higher or unset [default: 128].
    #[arg(long)]
    output_tokens: Option<u32>,
    /// KV cache capacity per replica in tokens [default: 160000].
    #[arg(long)]
    kv_capacity_tokens: Option<u32>,
    /// Tokens per KV block [default: 16].
    #[arg(long)]
    block_size: Option<u32>,
    /// Most sequences running at once [default: 256].
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// Token budget per engine step (chunked prefill) [default: 8192].
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// Prefill throughput, tokens per second [default: 16000].
    #[arg(long)]
    prefill_tokens_per_s: Option<f64>,
    /// Fixed decode-step time in ms [default: 6].
    #[arg(long)]
    decode_base_ms: Option<f64>,
    /// Extra decode-step time per running sequence in ms [default: 0.08].
    #[arg(long)]
    decode_per_seq_ms: Option<f64>,
    /// Adapter slots [default: 4].
    #[arg(long)]
    max_loras: Option<u32>,
    /// Adapter load delay in ms [default: 50].
    #[arg(long)]
    lora_load_ms: Option<f64>,
    /// Disable prefix caching.
    #[arg(long)]
    no_prefix_caching: bool,
    /// Longest prompt + completion in tokens; 0 = KV capacity [default: 0].
    #[arg(long)]
    max_model_len: Option<u32>,
    /// Send no usage at all, whatever the request asks (an engine without usage reporting).
    #[arg(long)]
    no_usage: bool,
    /// When usage reports `prompt_tokens_details.cached_tokens`: always (0 included),
    /// nonzero (vLLM with --enable-prompt-tokens-details) or off (vLLM's default)
    /// [default: always].
    #[arg(long)]
    prompt_tokens_details: Option<PromptTokensDetails>,
    /// Response bytes depend only on the prompt, model and length: hashed ids, fixed
    /// `created` (timing and usage unchanged).
    #[arg(long)]
    deterministic: bool,
    /// Publish vLLM's KV events over ZMQ PUB at tcp://IP:(replica port + N), topic
    /// kv@IP:PORT@<model> [default: off].
    #[arg(long)]
    kv_events_port_offset: Option<u16>,
}

impl Args {
    fn into_config(self) -> anyhow::Result<SimConfig> {
        let mut c = match &self.config {
            Some(p) => SimConfig::from_file(p)?,
            None => SimConfig::default(),
        };
        let e = &mut c.engine;
        macro_rules! set {
            ($dst:expr, $src:expr) => {
                if let Some(v) = $src {
                    $dst = v;
                }
            };
        }
        set!(e.kv_capacity_tokens, self.kv_capacity_tokens);
        set!(e.block_size, self.block_size);
        set!(e.max_num_seqs, self.max_num_seqs);
        set!(e.max_num_batched_tokens, self.max_num_batched_tokens);
        set!(e.prefill_tokens_per_s, self.prefill_tokens_per_s);
        set!(e.decode_base_ms, self.decode_base_ms);
        set!(e.decode_per_seq_ms, self.decode_per_seq_ms);
        set!(e.max_loras, self.max_loras);
        set!(e.lora_load_ms, self.lora_load_ms);
        set!(e.max_model_len, self.max_model_len);
        if self.no_prefix_caching {
            e.enable_prefix_caching = false;
        }
        set!(c.replicas, self.replicas);
        set!(c.port, self.port);
        set!(c.time_scale, self.time_scale);
        set!(c.output_tokens, self.output_tokens);
        set!(c.prompt_tokens_details, self.prompt_tokens_details);
        if self.no_usage {
            c.no_usage = true;
        }
        if self.kv_events_port_offset.is_some() {
            c.kv_events_port_offset = self.kv_events_port_offset;
        }
        if self.deterministic {
            c.deterministic = true;
        }
        if !self.models.is_empty() {
            c.models = self.models;
        }
        if !self.loras.is_empty() {
            c.loras = self.loras;
        }
        Ok(c)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = Args::parse().into_config()?;
    let handle = sim::start(cfg).await?;
    {
        let mut out = std::io::stdout().lock();
        for (k, addr) in handle.addrs().iter().enumerate() {
            writeln!(out, "replica {k}: http://{addr}")?;
        }
        for (k, ep) in handle.kv_events_endpoints().iter().enumerate() {
            if let Some(ep) = ep {
                writeln!(out, "replica {k} kv-events: {ep}")?;
            }
        }
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    handle.shutdown().await;
    Ok(())
}
