"""The simulator under the official OpenAI client and the Prometheus text parser."""

import threading
import time
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

# A long system prompt (about 2 000 tokens at 4 bytes per token).
SYSTEM = "You are a careful assistant. " * 280


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def gauge(url, name):
    return metrics(url)[name].samples[0].value


def stream_chat(url, messages, max_tokens=8):
    """Streams one chat completion; returns (content pieces with arrival times, usage chunk)."""
    stream = client(url).chat.completions.create(
        model="sim-model",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=max_tokens,
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append((time.monotonic(), chunk.choices[0].delta.content))
        if chunk.usage is not None:
            assert chunk.choices == [], "the usage chunk has empty choices"
            usage = chunk.usage
    return pieces, usage


def test_stream_content_usage_and_cached_tokens_rise(start_sim):
    sim = start_sim()
    url = sim.urls[0]
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is up?"}]
    pieces, usage = stream_chat(url, first, max_tokens=32)
    assert len(pieces) == 32
    # Tokens are generated one engine step apart (6 ms+ per decode step, 31 steps ≥ 186 ms):
    # an incremental stream spreads them out. The bound leaves room for the client reading
    # the first few late (they then arrive together), but not for a buffered response.
    assert pieces[-1][0] - pieces[0][0] > 0.1
    assert usage is not None
    assert usage.completion_tokens == 32
    assert usage.prompt_tokens > 2000
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0

    answer = "".join(p for _, p in pieces)
    second = first + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And then?"},
    ]
    _, usage2 = stream_chat(url, second)
    cached = usage2.prompt_tokens_details.cached_tokens
    assert cached > 0.9 * usage.prompt_tokens, (cached, usage.prompt_tokens)
    assert cached < usage2.prompt_tokens
    assert cached % 16 == 0, "hits are whole 16-token blocks"


def test_metrics_have_design_names(start_sim):
    sim = start_sim("--lora", "adapter-a", "--kv-capacity-tokens", "32000")
    url = sim.urls[0]
    client(url).completions.create(model="adapter-a", prompt="hello " * 50, max_tokens=2)
    fams = metrics(url)
    for name in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:lora_requests_info",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds",
    ]:
        assert name in fams, name
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16"
    assert info["num_gpu_blocks"] == "2000"
    lora = fams["vllm:lora_requests_info"].samples[0]
    assert set(lora.labels) >= {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert lora.labels["max_lora"] == "4"
    assert lora.value > 1e9, "the lora gauge is a timestamp"
    assert fams["vllm:time_to_first_token_seconds"].type == "histogram"
    queries = fams["vllm:prefix_cache_queries"]
    assert queries.type == "counter"
    assert queries.samples[0].value >= 75
    assert fams["vllm:kv_cache_usage_perc"].samples[0].value == 0.0


def test_full_kv_makes_requests_wait(start_sim):
    # 4 000 tokens of KV; each request needs about 3 000: they must run one by one.
    sim = start_sim("--kv-capacity-tokens", "4000")
    url = sim.urls[0]
    results = []

    def one(i):
        msgs = [{"role": "user", "content": f"{i} " + "w" * 12000}]
        results.append(stream_chat(url, msgs, max_tokens=40)[1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    waiting_seen, kv_seen = 0.0, 0.0
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        fams = metrics(url)
        waiting_seen = max(waiting_seen, fams["vllm:num_requests_waiting"].samples[0].value)
        kv_seen = max(kv_seen, fams["vllm:kv_cache_usage_perc"].samples[0].value)
        time.sleep(0.01)
    for t in threads:
        t.join(timeout=30)
    assert waiting_seen >= 1
    assert kv_seen > 0.7
    assert len(results) == 4 and all(u.completion_tokens == 40 for u in results)
    assert gauge(url, "vllm:num_requests_waiting") == 0


def test_disconnect_frees_kv(start_sim):
    sim = start_sim()
    url = sim.urls[0]
    stream = client(url).chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "v" * 40000}],
        stream=True,
        max_tokens=5000,
        extra_body={"ignore_eos": True},
    )
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen == 3:
                break
    assert gauge(url, "vllm:num_requests_running") == 1
    assert gauge(url, "vllm:kv_cache_usage_perc") > 0
    stream.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if (
            gauge(url, "vllm:kv_cache_usage_perc") == 0
            and gauge(url, "vllm:num_requests_running") == 0
        ):
            break
        time.sleep(0.02)
    assert gauge(url, "vllm:kv_cache_usage_perc") == 0
    assert gauge(url, "vllm:num_requests_running") == 0
