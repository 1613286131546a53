//! Prometheus text exposition of one replica, with vLLM's metric names.
//!
//! Counters are written as `prometheus_client` (and so vLLM) writes them: HELP and TYPE name
//! the `_total` series, which parsers fold into the family without the suffix.

use std::fmt::Write;

use super::engine::{EngineStats, TTFT_BUCKETS_S};
use super::served::{ServedKey, ServedTotals};

/// Renders the `/metrics` page. `lora_stamp` is the value of the `lora_requests_info` gauge
/// (vLLM uses the wall-clock time of the update, so the newest series wins).
pub fn render(stats: &EngineStats, model: &str, lora_stamp: f64) -> String {
    let mut out = String::with_capacity(4096);
    let labels = format!("engine=\"0\",model_name=\"{}\"", escape(model));
    let mut gauge = |name: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    };
    gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        stats.running as f64,
    );
    gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        stats.waiting as f64,
    );
    gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        stats.kv_usage,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        stats.block_size, stats.num_blocks
    );
    let _ = writeln!(
        out,
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
        stats.max_loras,
        escape(&stats.running_loras.join(",")),
        escape(&stats.waiting_loras.join(",")),
        lora_stamp
    );
    let c = &stats.counters;
    let counters: [(&str, &str, u64); 6] = [
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_queries_tokens,
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_hits_tokens,
        ),
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            c.prompt_tokens,
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            c.generation_tokens,
        ),
        (
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            c.preemptions,
        ),
        (
            "vllm:request_success",
            "Count of successfully processed requests.",
            c.finished,
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {value}"
        );
    }
    // Not a vLLM series: the simulator's own count of adapter loads, so a router's
    // packing of adapters can be measured from outside.
    let _ = writeln!(
        out,
        "# HELP infergate_sim:lora_loads_total LoRA adapters loaded into a slot (each admission of a request whose adapter was not resident).\n\
         # TYPE infergate_sim:lora_loads_total counter\n\
         infergate_sim:lora_loads_total{{{labels}}} {}",
        c.lora_loads
    );
    let name = "vllm:time_to_first_token_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Histogram of time to first token in seconds.\n# TYPE {name} histogram"
    );
    let mut cumulative = 0u64;
    for (i, bound) in TTFT_BUCKETS_S.iter().enumerate() {
        cumulative += c.ttft.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{bound:?}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels},le=\"+Inf\"}} {}",
        c.ttft.count
    );
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", c.ttft.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", c.ttft.count);
    out
}

/// Appends the simulator's own counters of what its responses delivered, one series per
/// fairness id and model (see [`crate::served`]). Nothing is written before the first
/// request.
pub fn render_served(out: &mut String, served: &[(ServedKey, ServedTotals)]) {
    type Field = fn(&ServedTotals) -> u64;
    let families: [(&str, &str, Field); 5] = [
        (
            "infergate_sim:served_prompt_tokens",
            "Prompt tokens of completed requests and of cut-off streams that sent a token.",
            |t| t.prompt_tokens,
        ),
        (
            "infergate_sim:served_completion_tokens",
            "Completion tokens delivered: usage of completed requests plus content chunks of cut-off streams.",
            |t| t.completion_tokens,
        ),
        (
            "infergate_sim:requests_completed",
            "Requests that generated every token.",
            |t| t.requests_completed,
        ),
        (
            "infergate_sim:requests_cut_off",
            "Requests whose client went away before the end.",
            |t| t.requests_cut_off,
        ),
        (
            "infergate_sim:cut_off_completion_tokens",
            "Completion tokens sent by streams cut off by their client.",
            |t| t.cut_off_completion_tokens,
        ),
    ];
    if served.is_empty() {
        return;
    }
    for (name, help, field) in families {
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter"
        );
        for (key, totals) in served {
            let _ = writeln!(
                out,
                "{name}_total{{engine=\"0\",fairness_id=\"{}\",model_name=\"{}\"}} {}",
                escape(&key.fairness_id),
                escape(&key.model),
                field(totals)
            );
        }
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig};

    #[test]
    fn the_adapter_load_counter_is_a_series_of_its_own() {
        let mut stats = Engine::new(EngineConfig::default()).stats();
        stats.counters.lora_loads = 7;
        stats.running_loras = vec!["a".into(), "b".into()];
        let page = render(&stats, "m", 1.5);
        assert!(page.contains("# TYPE infergate_sim:lora_loads_total counter\n"));
        assert!(page.contains("infergate_sim:lora_loads_total{engine=\"0\",model_name=\"m\"} 7\n"));
        assert!(page.contains("running_lora_adapters=\"a,b\""));
    }
}
