#!/usr/bin/env python3
"""Writes the golden vectors of testdata/kv_events/ (run from anywhere; needs the
`msgpack` and `xxhash` packages: `pip install msgpack xxhash`).

- `*.msgpack`: KV event batch payloads in the shapes vLLM's releases publish (see the doc of
  `scheduler_core::kv_events`), packed with msgpack's defaults (minimal integer sizes,
  float64, bin for bytes), as msgspec packs them.
- `expected.json`: for each payload, what `decode_batch` must answer: the batch's ts,
  dp_rank and kept events (dropped events left out), with byte-string hashes reduced by
  XXH3-64 here, independently of the Rust code.
- `key-vectors.json`: `kv_seed(model)` and `token_block_keys` outputs for a few inputs,
  computed from the algorithm's definition (scheduler_core::prefix::precise).
"""

import json
import os
import struct

import msgpack
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))


def h64(b: bytes) -> int:
    return xxhash.xxh3_64_intdigest(b)


def tokens(n, start=1000):
    return [start + 7 * i for i in range(n)]


def stored(hashes, parent, toks, size, lora_name=None):
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent": parent,
        "token_ids": toks,
        "block_size": size,
        "lora_name": lora_name,
    }


def removed(hashes):
    return {"type": "BlockRemoved", "block_hashes": hashes}


CLEARED = {"type": "AllBlocksCleared"}

cases = []

# 1. The first release's shape: a two-element batch, five fields after the tag.
t = tokens(32)
cases.append((
    "array-v1-no-dp-rank",
    [1700000000.25, [
        ["BlockStored", [11, 12], None, t, 16, None],
        ["BlockRemoved", [11]],
        ["AllBlocksCleared"],
    ]],
    {"ts": 1700000000.25, "dp_rank": None, "events": [
        stored([11, 12], None, t, 16), removed([11]), CLEARED]},
))

# 2. Array shape with medium, lora_name and the dp rank.
t = tokens(16, 5)
cases.append((
    "array-medium-lora-dp-rank",
    [1.5, [
        ["BlockStored", [21], 20, t, 16, 3, "GPU", "adapter-a"],
        ["BlockRemoved", [21], "GPU"],
        ["AllBlocksCleared"],
    ], 2],
    {"ts": 1.5, "dp_rank": 2, "events": [
        stored([21], 20, t, 16, "adapter-a"), removed([21]), CLEARED]},
))

# 3. Integer hashes at the edges: negative (signed 64-bit) and above 2^63.
neg = -1234567890123
big = (1 << 64) - 5
t = tokens(8, 0)
cases.append((
    "array-signed-and-large-hashes",
    [2.0, [["BlockStored", [neg, big], -1, t, 4, None, None, None]], 0],
    {"ts": 2.0, "dp_rank": 0, "events": [
        stored([neg & (2**64 - 1), big], (2**64 - 1), t, 4)]},
))

# 4. Newer releases: tagged maps inside the positional batch, with the extra fields
#    (extra_keys, group_idx, kv_cache_spec_kind) and a 64-bit hash.
t = tokens(16, 151000)
cases.append((
    "map-events-in-array-batch",
    [1789095808.8378847, [
        {"type": "BlockStored", "block_hashes": [15760518052499183552],
         "parent_block_hash": None, "token_ids": t, "block_size": 16, "lora_id": None,
         "medium": "GPU", "lora_name": None, "extra_keys": [None], "group_idx": 0,
         "kv_cache_spec_kind": "full_attention"},
        {"block_hashes": [15760518052499183552], "medium": "GPU", "type": "BlockRemoved",
         "group_idx": 0},
        {"type": "AllBlocksCleared"},
    ], 0],
    {"ts": 1789095808.8378847, "dp_rank": 0, "events": [
        stored([15760518052499183552], None, t, 16), removed([15760518052499183552]),
        CLEARED]},
))

# 5. A map batch with byte-string hashes (digests), fields in another order.
d0, d1, d2 = (bytes(range(i, i + 32)) for i in (0, 32, 64))
t = tokens(32, 9)
cases.append((
    "map-batch-bytes-hashes",
    {"events": [
        {"token_ids": t, "block_size": 16, "type": "BlockStored", "block_hashes": [d1, d2],
         "parent_block_hash": d0, "lora_id": None, "medium": None, "lora_name": "sql-lora"},
        {"type": "BlockRemoved", "block_hashes": [d2], "medium": None},
    ], "ts": 3.0, "data_parallel_rank": 1},
    {"ts": 3.0, "dp_rank": 1, "events": [
        stored([h64(d1), h64(d2)], h64(d0), t, 16, "sql-lora"), removed([h64(d2)])]},
))

# 6. Events the index must not apply are dropped: a CPU tier, another KV cache group, an
#    unknown event kind; the events around them are kept.
t = tokens(16)
cases.append((
    "dropped-events",
    [4.0, [
        ["BlockStored", [31], None, t, 16, None, "CPU", None],
        {"type": "BlockStored", "block_hashes": [32], "parent_block_hash": None,
         "token_ids": t, "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "group_idx": 1},
        {"type": "BlockRemoved", "block_hashes": [33], "medium": "GPU", "group_idx": 2},
        ["BlockUpdated", [34], {"x": [1, [2, [3]]]}],
        ["BlockStored", [35], None, t, 16, None, "GPU", None, [None], 0, "full_attention"],
        ["BlockRemoved", [35], "CPU"],
    ], None],
    {"ts": 4.0, "dp_rank": None, "events": [stored([35], None, t, 16)]},
))

expected = []
for name, batch, want in cases:
    payload = msgpack.packb(batch, use_bin_type=True)
    with open(os.path.join(HERE, name + ".msgpack"), "wb") as f:
        f.write(payload)
    expected.append({"file": name + ".msgpack", **want})

with open(os.path.join(HERE, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
    f.write("\n")


# Keys of the precise index (scheduler_core::prefix::precise):
#   seed = H("infergate-kv-v1" || le8(len(model)) || model)
#   k_0  = H(le8(seed) || le4(t) for t in block_0);  k_i = H(le8(k_{i-1}) || le4 block_i)
def kv_seed(model: str) -> int:
    m = model.encode()
    return h64(b"infergate-kv-v1" + struct.pack("<Q", len(m)) + m)


def block_keys(seed, toks, size, max_blocks):
    out, prev = [], seed
    for i in range(min(len(toks) // size, max_blocks)):
        block = toks[i * size:(i + 1) * size]
        prev = h64(struct.pack("<Q", prev) + b"".join(struct.pack("<I", x) for x in block))
        out.append(prev)
    return out


vectors = []
for model, toks, size, max_blocks in [
    ("m", [], 16, 100),
    ("m", tokens(15), 16, 100),
    ("m", tokens(16), 16, 100),
    ("meta-llama/Llama-3.1-8B-Instruct", tokens(40), 16, 100),
    ("meta-llama/Llama-3.1-8B-Instruct", tokens(40), 16, 1),
    ("sql-lora", [0, 1, 4294967295, 7, 8, 9, 10, 11], 4, 100),
]:
    seed = kv_seed(model)
    vectors.append({"model": model, "seed": seed, "tokens": toks, "block_size": size,
                    "max_blocks": max_blocks, "keys": block_keys(seed, toks, size, max_blocks)})

with open(os.path.join(HERE, "key-vectors.json"), "w") as f:
    json.dump(vectors, f, indent=1)
    f.write("\n")
