#!/usr/bin/env python3
"""Writes the tiny Hugging Face tokenizer the gateway's `HfTokenizer` tests load, and the
token ids the reference implementation gives for a set of prompts.

Run from the repository root: `python3 testdata/tokenizer/generate.py`
(needs `pip install tokenizers==0.23.3 jinja2`). The outputs are committed; tests never
run this script.

`--model DIR --out FILE` writes the same cases for a real model's directory instead
(its `tokenizer.json` and `tokenizer_config.json`); the opt-in test
`matches_a_real_model` compares the gateway with it when `INFERGATE_HF_MODEL_DIR` and
`INFERGATE_HF_MODEL_GOLDEN` name them.

- `tiny/tokenizer.json`: a byte-level BPE tokenizer trained here on a fixed corpus, with
  ChatML's special tokens and a post-processor that puts `<s>` before a single sequence
  (so a completions prompt gets a BOS token, as Llama-style tokenizers do).
- `tiny/tokenizer_config.json`: the `bos_token` / `eos_token` and a ChatML-style
  `chat_template` that uses what real templates use: a namespace, a loop over messages,
  `raise_exception`, the `trim` filter, a Python string method (`.strip()`), whitespace
  control, and `add_generation_prompt`.
- `golden.json`: for each case, the input (a completions prompt or chat messages) and the
  ids vLLM would send to the engine. A completions prompt is encoded with special tokens
  added; a chat conversation is rendered as `transformers` renders it (Jinja2 sandbox,
  `trim_blocks` and `lstrip_blocks`, `add_generation_prompt=True`) and encoded without
  adding special tokens (the template writes them).
"""

import argparse
import datetime
import json
import os

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tiny")

SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "You are a helpful assistant that answers questions about the weather.",
    "What is the capital of France? The capital of France is Paris.",
    "Summarise the following document in three sentences.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Gr\u00fc\u00dfe aus M\u00fcnchen! \u00bfQu\u00e9 tal? \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "system user assistant tool",
] * 20

TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system=false) %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{% if message['role'] == 'system' %}{% set ns.system = true %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{{ message['content'] | trim }}"
    "{% else %}{{ message['content'].strip() }}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}\n"
    "  {% if add_generation_prompt %}\n"
    "    <|im_start|>assistant\n"
    "{% endif %}"
)

CASES = [
    {"text": "What is the capital of France?"},
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"text": ""},
    {"text": "Gr\u00fc\u00dfe aus M\u00fcnchen, \u65e5\u672c\u8a9e, emoji \U0001f600 and <|im_start|> inline"},
    {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "  What is the capital of France?  "},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Summarise the following document."},
            {"role": "assistant", "content": "The document is about foxes.\n"},
            {"role": "user", "content": "def fib(n): return n"},
        ]
    },
    {"messages": [{"role": "user", "content": ""}]},
]


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
            ),
        ]
    )
    return tok


def render(template, messages, bos, eos):
    """The chat prompt as `transformers`' `apply_chat_template` renders it."""

    def raise_exception(message):
        raise ValueError(message)

    def strftime_now(fmt):
        return datetime.datetime.now(datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
    )


def special(config, key):
    value = config.get(key)
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""


def golden_cases(tok, template, bos, eos):
    golden = []
    for case in CASES:
        if "text" in case:
            ids = tok.encode(case["text"], add_special_tokens=True).ids
            golden.append({"text": case["text"], "ids": ids})
        else:
            rendered = render(template, case["messages"], bos, eos)
            ids = tok.encode(rendered, add_special_tokens=False).ids
            golden.append({"messages": case["messages"], "rendered": rendered, "ids": ids})
    return golden


def real_model(directory, out):
    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        config = json.load(f)
    template = config["chat_template"]
    if isinstance(template, list):
        template = next(t["template"] for t in template if t["name"] == "default")
    cases = golden_cases(tok, template, special(config, "bos_token"), special(config, "eos_token"))
    with open(out, "w") as f:
        json.dump({"tokenizers": "0.23.3", "cases": cases}, f, indent=1, ensure_ascii=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model's directory (writes --out instead)")
    parser.add_argument("--out", help="where --model's cases go")
    args = parser.parse_args()
    if args.model:
        real_model(args.model, args.out)
        return
    os.makedirs(OUT, exist_ok=True)
    tok = build_tokenizer()
    tok.save(os.path.join(OUT, "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "chat_template": TEMPLATE,
        "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    golden = golden_cases(tok, TEMPLATE, "<s>", "</s>")
    with open(os.path.join(HERE, "golden.json"), "w") as f:
        json.dump({"tokenizers": "0.23.3", "cases": golden}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
