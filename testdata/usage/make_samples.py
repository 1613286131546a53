#!/usr/bin/env python3
"""Writes the usage-tracking golden samples of this directory, deterministically.

Run: python3 testdata/usage/make_samples.py

The streams imitate what vLLM 0.x's OpenAI server writes for a chat completion with
`stream_options: {include_usage: true, continuous_usage_stats: true}` (the gateway forces
both): pydantic `model_dump_json(exclude_unset=True)`, compact, fields in model order,
`UsageInfo` as prompt_tokens, total_tokens, completion_tokens[, prompt_tokens_details];
a role chunk first, one chunk per token, the finish chunk with `stop_reason`, then the
usage-only chunk (`"choices":[]`) and `data: [DONE]`. For each stream the script also
writes what a client receives that asked for less (`*.final-only.sse`: include_usage
only; `*.no-usage.sse`: nothing), by rendering the same events without the usage, and
`expected.json`: the report the tracker must give for each sample. None of this comes
from the tracker itself.
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ID = "chatcmpl-8c1e5b0f3a9d4e27b6c5d4e3f2a1b0c9"
CREATED = 1764590213
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT = 38
CACHED = 32
TOKENS = ["Hello", "!", " How", " can", " I", " help", " you", " with", " your",
          " caf\u00e9", " \"order\"", "?\n", " \u2014", " \u30c7\u30fc\u30bf", " \U0001F600"]


def dump(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def usage(completion, details=False):
    u = {"prompt_tokens": PROMPT, "total_tokens": PROMPT + completion,
         "completion_tokens": completion}
    if details:
        u["prompt_tokens_details"] = {"cached_tokens": CACHED}
    return u


def chunk(choices, u, *, continuous=True, null_usage=False):
    c = {"id": ID, "object": "chat.completion.chunk", "created": CREATED, "model": MODEL,
         "choices": choices}
    if u is not None and continuous:
        c["usage"] = u
    elif null_usage:
        c["usage"] = None
    return c


def vllm_events(continuous, final, n_tokens=len(TOKENS), cached_details=True):
    """The vLLM stream as a list of event payloads (dicts, or "[DONE]")."""
    out = [chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                   "logprobs": None, "finish_reason": None}], usage(0), continuous=continuous)]
    for i, tok in enumerate(TOKENS[:n_tokens]):
        last = i + 1 == n_tokens
        choice = {"index": 0, "delta": {"content": tok}, "logprobs": None,
                  "finish_reason": "stop" if last else None}
        if last:
            choice["stop_reason"] = None
        out.append(chunk([choice], usage(i + 1), continuous=continuous))
    if final:
        out.append({"id": ID, "object": "chat.completion.chunk", "created": CREATED,
                    "model": MODEL, "choices": [], "usage": usage(n_tokens, cached_details)})
    out.append("[DONE]")
    return out


def sse(events):
    return "".join(f"data: {e if isinstance(e, str) else dump(e)}\n\n" for e in events)


def write(name, text):
    with open(os.path.join(HERE, name), "w", encoding="utf-8", newline="") as f:
        f.write(text)


def report(prompt, completion, cached, source, chunks, done):
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "cached_tokens": cached},
            "source": source, "content_chunks": chunks, "done": done}


def main():
    n = len(TOKENS)
    expected = {}

    # 1. The forced stream, and what each kind of client receives.
    write("vllm-chat-stream.sse", sse(vllm_events(True, True)))
    write("vllm-chat-stream.final-only.sse", sse(vllm_events(False, True)))
    write("vllm-chat-stream.no-usage.sse", sse(vllm_events(False, False)))
    expected["vllm-chat-stream.sse"] = report(PROMPT, n, CACHED, "usage", n + 1, True)

    # 2. The same stream cut off by the client after 6 tokens, mid-way through the 8th
    #    chunk's line: billed by the last complete chunk's usage.
    events = vllm_events(True, True)[:8]
    text = sse(events)
    cut = text.rfind("data: ") + 100
    write("vllm-chat-stream-cut.sse", text[:cut])
    expected["vllm-chat-stream-cut.sse"] = report(PROMPT, 6, 0, "continuous_usage", 7, False)

    # 3. An engine that sends no usage at all (the simulator's no-usage mode), on
    #    /v1/completions (`text_completion` chunks): billed by content chunks counted.
    events = [{"id": "cmpl-2b9e4f1a7c3d4e5f", "object": "text_completion", "created": CREATED,
               "model": MODEL,
               "choices": [{"index": 0, "text": tok, "logprobs": None,
                            "finish_reason": "length" if i + 1 == n else None,
                            "stop_reason": None}]}
              for i, tok in enumerate(TOKENS)] + ["[DONE]"]
    write("no-usage-stream.sse", sse(events))
    expected["no-usage-stream.sse"] = report(0, n, 0, "chunk_count", n, True)

    # 4. SGLang's shape: `"usage":null` on content chunks when per-chunk usage is off, the
    #    final usage-only chunk with it, CRLF line ends as a proxy in between may write.
    events = []
    for i, tok in enumerate(TOKENS[:5]):
        events.append({"id": "5f0c2b7e9d3a4c1b8e6f", "object": "chat.completion.chunk",
                       "created": CREATED, "model": "qwen/qwen2.5-7b-instruct",
                       "choices": [{"index": 0, "delta": {"role": "assistant" if i == 0 else None,
                                                          "content": tok, "reasoning_content": None,
                                                          "tool_calls": None},
                                    "logprobs": None,
                                    "finish_reason": "stop" if i == 4 else None,
                                    "matched_stop": None}],
                       "usage": None})
    events.append({"id": "5f0c2b7e9d3a4c1b8e6f", "object": "chat.completion.chunk",
                   "created": CREATED, "model": "qwen/qwen2.5-7b-instruct", "choices": [],
                   "usage": {"prompt_tokens": 21, "total_tokens": 26, "completion_tokens": 5,
                             "prompt_tokens_details": None}})
    events.append("[DONE]")
    crlf = lambda s: s.replace("\n", "\r\n")
    write("sglang-chat-stream.sse", crlf(sse(events)))
    no_null = [{k: v for k, v in e.items() if k != "usage"} if isinstance(e, dict) and e["choices"] else e
               for e in events]
    write("sglang-chat-stream.final-only.sse", crlf(sse(no_null)))
    write("sglang-chat-stream.no-usage.sse",
          crlf(sse([e for e in no_null if isinstance(e, str) or e["choices"]])))
    expected["sglang-chat-stream.sse"] = report(21, 5, 0, "usage", 5, True)

    # 5. A non-streamed vLLM chat completion.
    body = {"id": ID, "object": "chat.completion", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                                 "content": "".join(TOKENS), "tool_calls": []},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": usage(n, True), "prompt_logprobs": None, "kv_transfer_params": None}
    write("vllm-chat-completion.json", dump(body))
    expected["vllm-chat-completion.json"] = report(PROMPT, n, CACHED, "usage", 0, True)

    # 6. An Anthropic Messages response (as vLLM's /v1/messages or Anthropic's API write it).
    body = {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Hi! The \"usage\" below is what counts."}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 2095, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 1800, "output_tokens": 503}}
    write("anthropic-message.json", json.dumps(body, indent=2) + "\n")
    expected["anthropic-message.json"] = report(2095, 503, 1800, "usage", 0, True)

    write("expected.json", json.dumps(expected, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
