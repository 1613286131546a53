#!/usr/bin/env python3
"""Writes the golden /metrics pages of this directory (see ../README.md).

The pages are synthetic: metric names, label names, types and HELP texts follow the
engines' metric definitions; values are invented. Output is deterministic. The
expected-extraction JSON files next to the pages are written by hand, not by this script,
so the golden tests compare our Rust extractor against an independent reading.

Run from anywhere: python3 testdata/metrics/make_pages.py
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def fmt(v):
    """Formats a value the way Python's prometheus_client does (repr, Go-style Inf)."""
    if v == float("inf"):
        return "+Inf"
    if v == float("-inf"):
        return "-Inf"
    if v != v:
        return "NaN"
    s = repr(float(v))
    dot = s.find(".")
    # Like prometheus_client: Go switches to exponent notation sooner than Python does.
    if v > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def labels(pairs):
    if not pairs:
        return ""
    esc = lambda s: s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in pairs) + "}"


class Page:
    def __init__(self):
        self.out = []

    def family(self, name, kind, help_text):
        self.out.append(f"# HELP {name} {help_text}")
        self.out.append(f"# TYPE {name} {kind}")

    def sample(self, name, pairs, value):
        self.out.append(f"{name}{labels(pairs)} {fmt(value)}")

    def gauge(self, name, help_text, series):
        self.family(name, "gauge", help_text)
        for pairs, value in series:
            self.sample(name, pairs, value)

    def counter(self, name, help_text, series, created):
        """`name` without `_total`; prometheus_client adds `_total` and `_created`."""
        self.family(name + "_total", "counter", help_text)
        for pairs, value in series:
            self.sample(name + "_total", pairs, value)
        self.family(name + "_created", "gauge", help_text)
        for pairs, _ in series:
            self.sample(name + "_created", pairs, created)

    def histogram(self, name, help_text, base, buckets, observations, created):
        self.family(name, "histogram", help_text)
        total = 0.0
        for le in buckets:
            count = sum(1 for o in observations if o <= le)
            self.sample(name + "_bucket", base + [("le", fmt(le))], float(count))
        self.sample(name + "_bucket", base + [("le", "+Inf")], float(len(observations)))
        total = sum(observations)
        self.sample(name + "_count", base, float(len(observations)))
        self.sample(name + "_sum", base, total)
        self.family(name + "_created", "gauge", help_text)
        self.sample(name + "_created", base, created)

    def write(self, file_name):
        with open(os.path.join(HERE, file_name), "w", newline="\n") as f:
            f.write("\n".join(self.out) + "\n")


def python_runtime(page):
    """The process/GC preamble prometheus_client puts at the top of every page."""
    page.family("python_gc_objects_collected_total", "counter", "Objects collected during gc")
    for gen, n in (("0", 21873.0), ("1", 7408.0), ("2", 1291.0)):
        page.sample("python_gc_objects_collected_total", [("generation", gen)], n)
    page.family("python_gc_collections_total", "counter", "Number of times this generation was collected")
    for gen, n in (("0", 2714.0), ("1", 246.0), ("2", 13.0)):
        page.sample("python_gc_collections_total", [("generation", gen)], n)
    page.family("python_info", "gauge", "Python platform information")
    page.sample("python_info", [("implementation", "CPython"), ("major", "3"), ("minor", "12"),
                                ("patchlevel", "11"), ("version", "3.12.11")], 1.0)
    page.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
    page.sample("process_virtual_memory_bytes", [], 1.2734513152e+11)
    page.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
    page.sample("process_resident_memory_bytes", [], 4.118945792e+09)
    page.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
    page.sample("process_start_time_seconds", [], 1.75639144521e+09)
    page.family("process_open_fds", "gauge", "Number of open file descriptors.")
    page.sample("process_open_fds", [], 187.0)


LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0]
ITER_TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def obs(seed, n, scale):
    """Deterministic pseudo-random observations (no `random`, so output never drifts)."""
    x = seed
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(round((x / (1 << 31)) ** 2 * scale, 6))
    return out


def vllm_common(page, base, created, running, waiting, kv, gpu_cache_usage, seed):
    page.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
               [(b, v) for b, v in zip(base, running)])
    page.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
               [(b, v) for b, v in zip(base, waiting)])
    if gpu_cache_usage:
        page.gauge("vllm:gpu_cache_usage_perc",
                   "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                   [(b, v) for b, v in zip(base, kv)])
    page.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
               [(b, v) for b, v in zip(base, kv)])
    page.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                 [(b, 4.21337e+06 + 1000 * i) for i, b in enumerate(base)], created)
    page.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                 [(b, 2.907648e+06 + 500 * i) for i, b in enumerate(base)], created)
    page.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                 [(b, 0.0) for b in base], created)
    page.counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                 [(b, 4.213371e+06 + 17 * i) for i, b in enumerate(base)], created)
    page.counter("vllm:generation_tokens", "Number of generation tokens processed.",
                 [(b, 881234.0 + 3 * i) for i, b in enumerate(base)], created)
    page.family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for b in base:
        for reason, n in (("stop", 1873.0), ("length", 211.0), ("abort", 4.0)):
            page.sample("vllm:request_success_total", b + [("finished_reason", reason)], n)
    for i, b in enumerate(base):
        page.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                       b, ITER_TOKENS, obs(seed + i, 40, 3000), created)
        page.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       b, TTFT, obs(seed + 10 + i, 60, 3.0), created)
        page.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                       b, TPOT, obs(seed + 20 + i, 60, 0.08), created)
        page.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                       b, LATENCY, obs(seed + 30 + i, 60, 25.0), created)
        page.histogram("vllm:request_queue_time_seconds",
                       "Histogram of time spent in WAITING phase for request.",
                       b, LATENCY, obs(seed + 40 + i, 60, 2.0), created)


def cache_config_labels(engine, num_gpu_blocks):
    return [("block_size", "16"), ("cache_dtype", "auto"), ("calculate_kv_scales", "False"),
            ("cpu_offload_gb", "0"), ("enable_prefix_caching", "True"), ("engine", engine),
            ("gpu_memory_utilization", "0.9"), ("is_attention_free", "False"),
            ("num_cpu_blocks", "None"), ("num_gpu_blocks", num_gpu_blocks),
            ("num_gpu_blocks_override", "None"), ("prefix_caching_hash_algo", "sha256"),
            ("sliding_window", "None"), ("swap_space", "4"), ("swap_space_bytes", "4294967296")]


def vllm_010_lora():
    page = Page()
    python_runtime(page)
    base = [[("model_name", "meta-llama/Llama-3.1-8B-Instruct"), ("engine", "0")]]
    created = 1.7563914923318e+09
    vllm_common(page, base, created, running=[7.0], waiting=[3.0], kv=[0.41830065359477125],
                gpu_cache_usage=False, seed=7)
    page.gauge("vllm:lora_requests_info", "Running stats on lora requests.", [
        # The newest series (largest timestamp value) first, so "last line wins" would fail.
        ([("max_lora", "4"), ("waiting_lora_adapters", "tweet-lora"),
          ("running_lora_adapters", "sql-lora,summarize-lora")], 1.7563921034567e+09),
        ([("max_lora", "4"), ("waiting_lora_adapters", ""),
          ("running_lora_adapters", "sql-lora")], 1.7563920512345e+09),
    ])
    page.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
               [(cache_config_labels("0", "27544"), 1.0)])
    page.write("vllm-0.10-lora.txt")


def vllm_09_dp2():
    page = Page()
    python_runtime(page)
    model = "Qwen/Qwen2.5-32B-Instruct"
    base = [[("model_name", model), ("engine", "0")], [("model_name", model), ("engine", "1")]]
    created = 1.7489530121004e+09
    vllm_common(page, base, created, running=[5.0, 4.0], waiting=[2.0, 1.0],
                kv=[0.6203703703703703, 0.7137345679012346], gpu_cache_usage=True, seed=31)
    page.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
               [(cache_config_labels("0", "31200"), 1.0), (cache_config_labels("1", "31200"), 1.0)])
    page.write("vllm-0.9-dp2.txt")


def sglang():
    page = Page()
    python_runtime(page)
    b = [("model_name", "Qwen/Qwen2.5-7B-Instruct"), ("engine_type", "unified"),
         ("tp_rank", "0"), ("pp_rank", "0")]
    created = 1.7563901875523e+09
    page.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", [(b, 9.127654e+06)], created)
    page.counter("sglang:generation_tokens", "Number of generation tokens processed.", [(b, 2.310877e+06)], created)
    page.counter("sglang:num_requests", "Number of requests processed.", [(b, 6231.0)], created)
    page.gauge("sglang:num_running_reqs", "The number of running requests.", [(b, 12.0)])
    page.gauge("sglang:num_used_tokens", "The number of used tokens.", [(b, 366588.0)])
    page.gauge("sglang:token_usage", "The token usage.", [(b, 0.87)])
    page.gauge("sglang:gen_throughput", "The generation throughput (token/s).", [(b, 1432.7710628232157)])
    page.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", [(b, 5.0)])
    page.gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", [(b, 0.0)])
    page.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", [(b, 0.5914)])
    page.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
               [(b, 421366.0)])
    page.gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", [(b, 0.0)])
    page.gauge("sglang:cache_config_info", "Information of the KV cache configuration.",
               [([("model_name", "Qwen/Qwen2.5-7B-Instruct"), ("page_size", "1"),
                  ("num_pages", "421366")], 1.0)])
    page.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                   b, [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
                       100.0, 200.0, 400.0], obs(3, 50, 4.0), created)
    page.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                   b, [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
                       0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0], obs(5, 50, 0.05), created)
    page.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                   b, [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
                       100.0, 200.0, 400.0, 600.0, 1200.0], obs(9, 50, 30.0), created)
    page.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                   b, [0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0],
                   obs(11, 50, 3.0), created)
    page.write("sglang.txt")


def trtllm():
    page = Page()
    python_runtime(page)
    b = [("model_name", "Qwen/Qwen3-8B"), ("engine_type", "trtllm")]
    created = 1.7563933011871e+09
    page.family("trtllm_request_success_total", "counter", "Count of successfully processed requests.")
    for reason, n in (("stop", 930.0), ("length", 41.0)):
        page.sample("trtllm_request_success_total", b + [("finished_reason", reason)], n)
    page.histogram("trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                   b, LATENCY, obs(13, 50, 20.0), created)
    page.histogram("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                   b, TTFT, obs(17, 50, 1.5), created)
    page.histogram("trtllm_time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                   b, TPOT, obs(19, 50, 0.05), created)
    page.histogram("trtllm_request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                   b, LATENCY, obs(23, 50, 1.0), created)
    page.gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", [(b, 0.6127)])
    page.gauge("trtllm_kv_cache_utilization", "KV cache utilization", [(b, 0.2509765625)])
    page.gauge("trtllm_num_requests_running", "Number of active requests", [(b, 6.0)])
    page.gauge("trtllm_num_requests_waiting", "Number of queued requests", [(b, 1.0)])
    page.gauge("trtllm_max_num_active_requests", "Maximum number of active requests", [(b, 2048.0)])
    page.gauge("trtllm_iteration_latency_seconds", "Iteration latency in seconds", [(b, 0.0213)])
    page.gauge("trtllm_gpu_memory_usage_bytes", "GPU memory usage in bytes", [(b, 7.2837595136e+10)])
    page.gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", [(b, 9216.0)])
    page.gauge("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", [(b, 6903.0)])
    page.gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", [(b, 2313.0)])
    page.gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", [(b, 32.0)])
    page.gauge("trtllm_num_context_requests", "Number of context (prefill) requests", [(b, 1.0)])
    page.gauge("trtllm_num_generation_requests", "Number of generation (decode) requests", [(b, 5.0)])
    page.write("trtllm.txt")


if __name__ == "__main__":
    vllm_010_lora()
    vllm_09_dp2()
    sglang()
    trtllm()
